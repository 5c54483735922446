//! [`ReplayReport`]: what a replay did, and the letters it
//! [skipped](Skipped).

use std::collections::BTreeMap;
use std::fmt;

use super::LetterId;

/// Why a letter was not replayed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SkipReason {
    /// Its message was replayed
    /// [`Replay::max_replays`](super::Replay::max_replays) times already.
    ReplayLimit {
        /// How often it was replayed.
        replays: u32,
    },
    /// The letter stands in for one that could not be written (a
    /// [`PayloadReference`](crate::dead_letter::PayloadReference)): it has no payload to
    /// replay; the original stays at its origin only while the origin keeps
    /// it (see [`DeadLetter::reference`](crate::dead_letter::DeadLetter::reference)).
    Reference,
    /// The entry is not a dead letter this intake can read.
    Unreadable,
    /// The store holds no letter of that id.
    NotFound,
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SkipReason::ReplayLimit { replays } => write!(f, "replayed {replays} times already"),
            SkipReason::Reference => f.write_str("a reference letter without payload"),
            SkipReason::Unreadable => f.write_str("not a readable dead letter"),
            SkipReason::NotFound => f.write_str("no such letter"),
        }
    }
}

/// A letter a replay left in the store, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Skipped {
    /// The letter.
    pub id: LetterId,
    /// Why.
    pub reason: SkipReason,
}

impl Skipped {
    /// Letter `id`, skipped for `reason`.
    pub fn new(id: LetterId, reason: SkipReason) -> Self {
        Self { id, reason }
    }
}

/// What a [`replay`](super::DeadLetterStore::replay) did, or in a dry run would
/// do.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReplayReport {
    /// Whether it was a dry run (nothing moved).
    pub dry_run: bool,
    /// Letters published, confirmed and removed (in a dry run: that would
    /// be).
    pub replayed: u64,
    /// Of those, how many per class of their last failure.
    pub by_class: BTreeMap<&'static str, u64>,
    /// Letters left in the store, with why.
    pub skipped: Vec<Skipped>,
}

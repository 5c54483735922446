//! [`Selection`]: the letters a replay or a purge takes.

use super::{Filter, LetterId};

/// The letters a [`replay`](super::DeadLetterStore::replay) or
/// [`purge`](super::DeadLetterStore::purge) takes.
#[derive(Clone, Debug)]
pub enum Selection {
    /// These letters; an id the store does not hold is skipped
    /// ([`SkipReason::NotFound`](super::SkipReason::NotFound)).
    Ids(Vec<LetterId>),
    /// Every letter the filter matches, as the store holds them when the
    /// operation starts (letters written meanwhile are left for the next).
    Matching(Filter),
}

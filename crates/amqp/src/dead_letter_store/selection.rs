//! Which letters a selection (a filter, or ids) takes.

use std::collections::HashSet;

use intake_core::dead_letter::store::{
    Filter, LetterId, Selection, SkipReason, Skipped, StoredLetter,
};

/// The letters a selection takes, and for ids, which were found.
pub(super) enum Wanted<'s> {
    Matching(&'s Filter),
    Ids {
        wanted: HashSet<&'s LetterId>,
        found: HashSet<&'s LetterId>,
        order: &'s [LetterId],
    },
}

impl<'s> Wanted<'s> {
    pub(super) fn of(selection: &'s Selection) -> Self {
        match selection {
            Selection::Matching(filter) => Wanted::Matching(filter),
            Selection::Ids(ids) => Wanted::Ids {
                wanted: ids.iter().collect(),
                found: HashSet::new(),
                order: ids,
            },
        }
    }

    pub(super) fn is_filter(&self) -> bool {
        matches!(self, Wanted::Matching(_))
    }

    /// Whether `stored` is selected (an id, once).
    pub(super) fn takes(&mut self, stored: &StoredLetter) -> bool {
        match self {
            Wanted::Matching(filter) => filter.matches(stored),
            Wanted::Ids { wanted, found, .. } => match wanted.get(&stored.id) {
                Some(id) => found.insert(id),
                None => false,
            },
        }
    }

    /// Whether every id was found (never, for a filter).
    pub(super) fn all_found(&self) -> bool {
        match self {
            Wanted::Matching(_) => false,
            Wanted::Ids { wanted, found, .. } => found.len() == wanted.len(),
        }
    }

    /// The ids not found, in the order given, once each.
    pub(super) fn missing(&self) -> Vec<LetterId> {
        match self {
            Wanted::Matching(_) => Vec::new(),
            Wanted::Ids { found, order, .. } => {
                let mut seen = HashSet::new();
                order
                    .iter()
                    .filter(|id| !found.contains(id) && seen.insert(*id))
                    .cloned()
                    .collect()
            }
        }
    }
}

pub(super) fn skipped(id: LetterId, reason: SkipReason) -> Skipped {
    Skipped::new(id, reason)
}

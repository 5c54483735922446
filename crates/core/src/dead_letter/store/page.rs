//! [`Page`]: a page of a listing.

use super::{LetterId, StoredLetter};

/// A page of a [`list`](super::DeadLetterStore::list)ing.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct Page {
    /// The letters selected, oldest first, without payloads.
    pub letters: Vec<StoredLetter>,
    /// The cursor of the next page (the last entry looked at), `None` when
    /// the store was read to its end.
    pub next: Option<LetterId>,
}

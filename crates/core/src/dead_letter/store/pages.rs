//! [`Pages`]: the entries a [`Selection`] takes, a page at a time.

use std::collections::HashSet;

use super::log_store::PAGE;
use super::{DeadLetterLog, LetterId, Selection, StoreError, StoredLetter};

/// The entries a [`Selection`] takes, a page at a time: ids the log does
/// not hold come as `Err(id)`. A filter's scan stops at the entry newest
/// when it started, so letters written meanwhile (a replay that failed
/// again) are left for the next operation.
pub(super) struct Pages<'s, L> {
    log: &'s L,
    selection: &'s Selection,
    /// Ids handed over so far (a selection of ids).
    next_id: usize,
    /// Ids already handed over: an id named twice is taken once (a
    /// replay would otherwise publish it twice).
    seen: HashSet<LetterId>,
    /// The scan's end: unset before the first page, `Some(None)` for an
    /// empty log.
    through: Option<Option<LetterId>>,
    after: Option<LetterId>,
    done: bool,
}

impl<'s, L: DeadLetterLog> Pages<'s, L> {
    pub(super) fn new(log: &'s L, selection: &'s Selection) -> Self {
        Self {
            log,
            selection,
            next_id: 0,
            seen: HashSet::new(),
            through: None,
            after: None,
            done: false,
        }
    }

    pub(super) async fn next(
        &mut self,
    ) -> Result<Option<Vec<Result<StoredLetter, LetterId>>>, StoreError> {
        if self.done {
            return Ok(None);
        }
        match self.selection {
            Selection::Ids(ids) => {
                let chunk = ids.get(self.next_id..).unwrap_or_default();
                let chunk = &chunk[..chunk.len().min(PAGE)];
                if chunk.is_empty() {
                    self.done = true;
                    return Ok(None);
                }
                self.next_id += chunk.len();
                let mut page = Vec::with_capacity(chunk.len());
                for id in chunk {
                    if self.seen.insert(id.clone()) {
                        page.push(self.log.get(id).await?.ok_or_else(|| id.clone()));
                    }
                }
                Ok(Some(page))
            }
            Selection::Matching(filter) => {
                let through = match &self.through {
                    Some(through) => through.clone(),
                    None => {
                        let last = self.log.last().await?;
                        self.through = Some(last.clone());
                        last
                    }
                };
                let Some(through) = through else {
                    self.done = true;
                    return Ok(None);
                };
                let entries = self
                    .log
                    .scan(self.after.as_ref(), Some(&through), PAGE)
                    .await?;
                let Some(last) = entries.last() else {
                    self.done = true;
                    return Ok(None);
                };
                self.after = Some(last.id.clone());
                self.done = entries.len() < PAGE;
                Ok(Some(
                    entries
                        .into_iter()
                        .filter(|stored| filter.matches(stored))
                        .map(Ok)
                        .collect(),
                ))
            }
        }
    }
}

//! [`LogStore`]: the whole [`DeadLetterStore`] of a [`DeadLetterLog`].

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use super::pages::Pages;
use super::{
    DeadLetterLog, DeadLetterStore, Filter, LetterId, Page, Replay, ReplayReport, Selection,
    SkipReason, Skipped, StoreError, StoredLetter, Summary, Target,
};
use crate::message::SourceName;
use crate::publish::{PublishError, Publisher};

/// Entries read per round trip while scanning, and letters published per
/// batch before their confirmations are awaited.
pub(super) const PAGE: usize = 256;

/// The [`DeadLetterStore`] of a [`DeadLetterLog`], replaying through a
/// [`Publisher`] `P`.
///
/// A replay reads the log a page at a time, sends every letter of the page
/// it takes before awaiting any confirmation (so a page costs about one
/// round trip), then removes the confirmed ones in one call.
pub struct LogStore<L, P> {
    pub(super) log: L,
    publisher: P,
}

impl<L: DeadLetterLog, P: Publisher> LogStore<L, P> {
    /// The store of `log`, replaying through `publisher`.
    pub fn new(log: L, publisher: P) -> Self {
        Self { log, publisher }
    }

    /// The log.
    pub fn log(&self) -> &L {
        &self.log
    }

    /// Replays one page: skips what the loop guard and the letter's form
    /// rule out, sends the rest, awaits every confirmation, removes the
    /// confirmed ones.
    async fn replay_page(
        &self,
        page: Vec<Result<StoredLetter, LetterId>>,
        replay: &Replay,
        report: &mut ReplayReport,
    ) -> Result<(), StoreError> {
        let mut taken = Vec::with_capacity(page.len());
        for entry in page {
            let stored = match entry {
                Ok(stored) => stored,
                Err(id) => {
                    report.skipped.push(Skipped {
                        id,
                        reason: SkipReason::NotFound,
                    });
                    continue;
                }
            };
            match (replay.skips(&stored), stored.letter) {
                (Some(reason), _) => report.skipped.push(Skipped {
                    id: stored.id,
                    reason,
                }),
                (None, Ok(letter)) => taken.push((stored.id, letter)),
                (None, Err(_)) => {}
            }
        }
        // Every output of the page is made before any is sent, in a dry run
        // too: a letter with no way back to its group stops the replay
        // before the page is half published, and a dry run says so rather
        // than promise what the real run refuses.
        let mut ways_back: HashMap<SourceName, Option<Arc<str>>> = HashMap::new();
        let mut outputs = Vec::with_capacity(taken.len());
        for (_, letter) in &taken {
            let way_back = match replay.target() {
                Target::Group => {
                    let origin = letter.message.metadata().source();
                    match ways_back.get(origin) {
                        Some(way_back) => way_back.clone(),
                        None => {
                            let way_back = self.log.way_back_to_group(origin).await?;
                            ways_back.insert(origin.clone(), way_back.clone());
                            way_back
                        }
                    }
                }
                Target::Origin | Target::Destination(_) => None,
            };
            outputs.push(replay.output_of(letter, way_back.as_ref())?);
        }
        if replay.is_dry_run() {
            for (_, letter) in &taken {
                report.replayed += 1;
                *report.by_class.entry(letter.class.as_str()).or_default() += 1;
            }
            replay.report_progress(report.replayed);
            return Ok(());
        }

        // Send the whole page first, then await: the publisher keeps the
        // send order, and a page costs one round trip instead of one each.
        let mut receipts = Vec::with_capacity(taken.len());
        let mut failure: Option<(LetterId, PublishError)> = None;
        for ((id, letter), output) in taken.iter().zip(outputs) {
            match self.publisher.send(output).await {
                Ok(receipt) => receipts.push((id, letter.class, receipt)),
                Err(error) => {
                    failure = Some((id.clone(), error));
                    break;
                }
            }
        }
        let mut confirmed = Vec::with_capacity(receipts.len());
        let mut classes = Vec::with_capacity(receipts.len());
        for (id, class, receipt) in receipts {
            match receipt.await {
                Ok(_) => {
                    confirmed.push(id.clone());
                    classes.push(class);
                }
                Err(error) => {
                    if failure.is_none() {
                        failure = Some((id.clone(), error));
                    }
                }
            }
        }
        if !confirmed.is_empty() {
            self.log.remove(&confirmed).await?;
        }
        report.replayed += confirmed.len() as u64;
        for class in classes {
            *report.by_class.entry(class.as_str()).or_default() += 1;
        }
        replay.report_progress(report.replayed);
        match failure {
            None => Ok(()),
            Some((id, source)) => Err(StoreError::Replay {
                id,
                report: Box::new(std::mem::take(report)),
                source,
            }),
        }
    }
}

#[async_trait::async_trait]
impl<L: DeadLetterLog, P: Publisher> DeadLetterStore for LogStore<L, P> {
    fn destination(&self) -> &str {
        self.log.name()
    }

    async fn count(&self, filter: &Filter) -> Result<u64, StoreError> {
        if filter.is_all() {
            return self.log.entries().await;
        }
        Ok(self.summary(filter).await?.total)
    }

    async fn summary(&self, filter: &Filter) -> Result<Summary, StoreError> {
        let mut summary = Summary::default();
        let mut after: Option<LetterId> = None;
        loop {
            let entries = self.log.scan(after.as_ref(), None, PAGE).await?;
            let Some(last) = entries.last() else {
                return Ok(summary);
            };
            after = Some(last.id.clone());
            let full = entries.len() == PAGE;
            for stored in entries.iter().filter(|stored| filter.matches(stored)) {
                summary.add(stored);
            }
            if !full {
                return Ok(summary);
            }
        }
    }

    async fn list(
        &self,
        filter: &Filter,
        limit: usize,
        after: Option<&LetterId>,
    ) -> Result<Page, StoreError> {
        let mut page = Page::default();
        let mut cursor = after.cloned();
        while page.letters.len() < limit {
            let entries = self.log.scan(cursor.as_ref(), None, PAGE).await?;
            let full = entries.len() == PAGE;
            let mut looked_at = None;
            for stored in entries {
                looked_at = Some(stored.id.clone());
                if filter.matches(&stored) {
                    page.letters.push(stored.without_payload());
                    if page.letters.len() == limit {
                        break;
                    }
                }
            }
            let Some(looked_at) = looked_at else {
                return Ok(page);
            };
            cursor = Some(looked_at);
            if !full && page.letters.len() < limit {
                return Ok(page);
            }
        }
        page.next = cursor;
        Ok(page)
    }

    async fn read(&self, id: &LetterId) -> Result<StoredLetter, StoreError> {
        self.log
            .get(id)
            .await?
            .ok_or_else(|| StoreError::NotFound { id: id.clone() })
    }

    async fn replay(
        &self,
        selection: &Selection,
        replay: &Replay,
    ) -> Result<ReplayReport, StoreError> {
        let mut report = ReplayReport {
            dry_run: replay.is_dry_run(),
            ..ReplayReport::default()
        };
        let mut pages = Pages::new(&self.log, selection);
        while let Some(page) = pages.next().await? {
            self.replay_page(page, replay, &mut report).await?;
        }
        Ok(report)
    }

    async fn purge(&self, selection: &Selection) -> Result<u64, StoreError> {
        let mut removed = 0;
        let mut pages = Pages::new(&self.log, selection);
        while let Some(page) = pages.next().await? {
            let ids: Vec<LetterId> = page
                .into_iter()
                .filter_map(Result::ok)
                .map(|stored| stored.id)
                .collect();
            if !ids.is_empty() {
                removed += self.log.remove(&ids).await?;
            }
        }
        Ok(removed)
    }
}

impl<L, P> fmt::Debug for LogStore<L, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LogStore").finish_non_exhaustive()
    }
}

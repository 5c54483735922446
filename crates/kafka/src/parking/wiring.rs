//! Nothing parked where nobody reads: which served topics a source of the
//! group reads the return topics of (parks of the others are refused), and
//! the parkings of this process, which a source of their group built after
//! them must be given.

use std::sync::Weak;

use super::*;

/// The parkings of this process, for the sources built after them: a
/// source of a parking's group that reads one of its served topics must
/// read the return topic too. Locked only at builds.
static LIVE: Mutex<Vec<Weak<Inner>>> = Mutex::new(Vec::new());

impl KafkaParking {
    /// Makes the parking known to the sources built after it.
    pub(super) fn register(&self) {
        let mut live = LIVE.lock().unwrap_or_else(|poison| poison.into_inner());
        live.retain(|parking| parking.strong_count() > 0);
        live.push(Arc::downgrade(&self.inner));
    }

    /// A source of the group was built to read the return topics of the
    /// served topics among `topics`: their messages may be parked from now
    /// on. Lasting: the group's offsets in the return topic outlive the
    /// source, and its next one reads on from them.
    pub(crate) fn read_by_source(&self, topics: &[String]) {
        let inner = &*self.inner;
        for (served, read) in inner.topics.iter().zip(&inner.read) {
            if topics.contains(served) {
                read.store(true, Ordering::Release);
            }
        }
    }

    /// Whether a source of the group reads the return topic of the served
    /// topic `origin`.
    pub(super) fn is_read(&self, origin: &str) -> bool {
        let inner = &*self.inner;
        inner
            .topics
            .iter()
            .zip(&inner.read)
            .any(|(served, read)| served == origin && read.load(Ordering::Acquire))
    }
}

/// Checks a source of `group` on `brokers` that subscribes `topics` (its
/// own and the return topics of its parking), given the
/// parking `wired` (if any), against the other parkings of this process:
/// one of the group that serves a topic of the source parks its messages to
/// come back to a return topic, which the source must read. The parkings
/// whose return topics the source names by hand, to mark once it is built.
///
/// # Errors
///
/// [`Error::Config`] (setting `parking`) naming the fix when the source
/// does not read such a return topic: the copies would never be handled.
pub(crate) fn unwired(
    brokers: &str,
    group: &str,
    topics: &[String],
    wired: Option<&KafkaParking>,
) -> Result<Vec<KafkaParking>, Error> {
    let live: Vec<Arc<Inner>> = LIVE
        .lock()
        .unwrap_or_else(|poison| poison.into_inner())
        .iter()
        .filter_map(Weak::upgrade)
        .collect();
    let mut by_hand = Vec::new();
    for inner in live {
        if inner.group != group
            || *inner.brokers != *brokers
            || wired.is_some_and(|wired| Arc::ptr_eq(&wired.inner, &inner))
        {
            continue;
        }
        let parking = KafkaParking { inner };
        let mut named = false;
        for origin in parking
            .inner
            .topics
            .iter()
            .filter(|topic| topics.contains(topic))
        {
            let back_to = parking.return_topic(origin);
            if !topics.contains(&back_to) {
                return Err(Error::config(
                    "parking",
                    format!(
                        "a parking of group `{group}` in this process parks the messages of `{origin}` to come back to `{back_to}`, which this source does not read: they would never be handled again; build the source with `.parking(&parking)` so the return topic is read"
                    ),
                ));
            }
            named = true;
        }
        if named {
            by_hand.push(parking);
        }
    }
    Ok(by_hand)
}

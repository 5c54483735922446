//! The dead-letter store scenarios every backend's
//! [`DeadLetterStore`] passes unchanged: letters written through the
//! backend's real dead-letter path (its sink behind the dead-letter layer
//! of a running consumer) are counted, listed with filters, read, replayed
//! to their origin (back in the source with `intake.replays` = 1), held
//! back by the loop guard, and purged.
//!
//! A backend crate implements [`StoreBackend`] on its conformance fixture
//! and lets [`dead_letter_store_suite!`](crate::dead_letter_store_suite)
//! write the tests:
//!
//! ```ignore
//! intake_core::dead_letter_store_suite!(backend());
//! ```

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use super::harness::{Ledger, PATIENCE, Running, id_of, numbered, unique_group};
use super::memory_backend::MemoryBackend;
use super::{Backend, TestMessage};
use crate::backoff::Constant;
use crate::consumer::Consumer;
use crate::dead_letter::DeadLetterLayer;
use crate::dead_letter::envelope::REPLAYS;
use crate::dead_letter::store::{
    DeadLetterStore, Filter, LetterId, Replay, Selection, SkipReason, StoreError, StoredLetter,
};
use crate::error::{BoxError, ErrorClass, HandlerError};
use crate::memory::MemoryDeadLetterStore;
use crate::message::Message;
use crate::retry::RetryLayer;

/// A backend whose dead-letter store the suite checks.
#[async_trait::async_trait]
pub trait StoreBackend: Backend {
    /// The backend's store.
    type Store: DeadLetterStore;

    /// The store of the dead letters the backend's
    /// [sink](Backend::dead_letter_sink) writes for `source` and `group`,
    /// replaying through the backend's publisher.
    async fn dead_letter_store(&self, source: &str, group: &str) -> Result<Self::Store, BoxError>;

    /// The key a consumer of `source` reads for a message the store
    /// redrove to its origin with key `key`: the key itself (the default),
    /// or what the backend's mapping makes of it (AMQP through the default
    /// exchange: the routing key, which is the queue's name; the key
    /// travels in a header).
    fn replayed_key(&self, source: &str, key: &str) -> String {
        let _ = source;
        key.to_owned()
    }

    /// The key a consumer of `source` reads, and so a dead letter of it
    /// carries, for a message [produced](Backend::produce) with `key`: the
    /// key itself (the default), or what the backend's mapping makes of it
    /// (NATS: the subject the message was produced on).
    fn consumed_key(&self, source: &str, key: &str) -> String {
        let _ = source;
        key.to_owned()
    }
}

#[async_trait::async_trait]
impl StoreBackend for MemoryBackend {
    type Store = MemoryDeadLetterStore;

    async fn dead_letter_store(&self, source: &str, group: &str) -> Result<Self::Store, BoxError> {
        Ok(self.broker().dead_letter_store(source, group)?)
    }
}

/// Writes one `#[tokio::test]` per store scenario, like
/// [`conformance_suite!`](crate::conformance_suite).
#[macro_export]
macro_rules! dead_letter_store_suite {
    ($backend:expr) => {
        $crate::dead_letter_store_suite!(@scenarios $backend;
            a_store_counts_lists_and_reads_what_the_sink_wrote,
            a_replay_returns_letters_to_their_origin_and_the_loop_guard_holds_them_after,
            a_purge_removes_only_what_it_selects,
        );
    };
    (@scenarios $backend:expr; $($scenario:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $scenario() {
                let Some(backend) = $backend.await else {
                    return;
                };
                $crate::backend::testkit::dead_letter_store::$scenario(&backend).await;
            }
        )*
    };
}

/// The poison of every scenario: three permanent failures (payloads that
/// are no id) and one retryable one whose retries run out.
fn poison() -> Vec<TestMessage> {
    let mut poison: Vec<TestMessage> = (0..3)
        .map(|n| TestMessage::new(format!("p{n}"), format!("poison-{n}")))
        .collect();
    let mut retry = TestMessage::new("r0", "retry-0");
    retry.headers.insert("tenant", "acme");
    poison.push(retry);
    poison
}

const GOOD: u64 = 10;
const PERMANENT: u64 = 3;
const LETTERS: u64 = 4;

/// A consumer that dead-letters [`poison`] through the backend's sink,
/// with what its handler saw fail.
struct Poisoned {
    source: String,
    consumer: Running,
    failed: Arc<Mutex<Vec<Message>>>,
    started: SystemTime,
}

impl Poisoned {
    /// Produces good messages and the poison to a new source, and runs a
    /// consumer with the dead-letter layer until `store` counts every
    /// letter.
    async fn start<B: StoreBackend>(backend: &B, scenario: &str) -> (Self, B::Store) {
        let source = backend.create_source(1).await.expect("create the source");
        let group = unique_group(scenario);
        // The envelope keeps times in milliseconds: started rounded down to
        // one, so that every letter's failure is at or after it.
        let started = SystemTime::UNIX_EPOCH
            + Duration::from_millis(
                u64::try_from(
                    SystemTime::now()
                        .duration_since(SystemTime::UNIX_EPOCH)
                        .unwrap_or_default()
                        .as_millis(),
                )
                .unwrap_or(u64::MAX),
            );
        let mut messages = numbered(0, GOOD);
        for (at, poison) in poison().into_iter().enumerate() {
            messages.insert(2 * at + 1, poison);
        }
        backend.produce(&source, messages).await.expect("produce");
        let ledger = Ledger::default();
        let failed: Arc<Mutex<Vec<Message>>> = Arc::default();
        let handler = {
            let ledger = ledger.clone();
            let failed = failed.clone();
            tower::service_fn(move |message: Message| {
                let ledger = ledger.clone();
                let failed = failed.clone();
                async move {
                    let retryable = message.payload().starts_with(b"retry");
                    let id = id_of(&message);
                    if retryable || id.is_err() {
                        failed
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .push(message.clone());
                    }
                    if retryable {
                        return Err(HandlerError::retryable("the dependency is down"));
                    }
                    ledger.record(id?);
                    Ok::<(), HandlerError>(())
                }
            })
        };
        let sink = backend
            .dead_letter_sink(&source, &group)
            .await
            .expect("dead-letter sink");
        let handler = tower::ServiceBuilder::new()
            .layer(DeadLetterLayer::new(sink))
            .layer(RetryLayer::new(
                Constant::new(Duration::from_millis(5)).max_retries(1),
            ))
            .service(handler);
        let consumer = Running::start(backend, &source, &group, Consumer::builder(), 8, handler)
            .await
            .expect("connect");
        ledger.wait_for_all(GOOD, "the good messages").await;
        let store = backend
            .dead_letter_store(&source, &group)
            .await
            .expect("open the store");
        let poisoned = Self {
            source,
            consumer,
            failed,
            started,
        };
        poisoned
            .wait_for_letters(&store, &Filter::all(), LETTERS)
            .await;
        (poisoned, store)
    }

    async fn wait_for_letters(&self, store: &impl DeadLetterStore, filter: &Filter, count: u64) {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let counted = store.count(filter).await.expect("count");
            if counted == count {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{} letters ({filter:?}) in {:?} after {PATIENCE:?}, not {count}",
                counted,
                store.destination()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn failed(&self) -> Vec<Message> {
        self.failed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

fn letter(stored: &StoredLetter) -> &crate::dead_letter::DeadLetter {
    match &stored.letter {
        Ok(letter) => letter,
        Err(error) => panic!("letter {} is unreadable: {error}", stored.id),
    }
}

async fn all_ids(store: &impl DeadLetterStore, filter: &Filter) -> Vec<LetterId> {
    let page = store.list(filter, 1_000, None).await.expect("list");
    page.letters.into_iter().map(|stored| stored.id).collect()
}

/// Count, summary, list (filters, cursor, no payload) and read (with the
/// payload) agree with what the sink wrote.
pub async fn a_store_counts_lists_and_reads_what_the_sink_wrote<B: StoreBackend>(backend: &B) {
    let (poisoned, store) = Poisoned::start(backend, "store-read").await;
    poisoned.consumer.stop().await;
    let name = backend.name();

    assert_eq!(store.count(&Filter::all()).await.expect("count"), LETTERS);
    let permanent = Filter::all().with_class(ErrorClass::Permanent);
    let retryable = Filter::all().with_class(ErrorClass::Retryable);
    assert_eq!(
        store.count(&permanent).await.expect("count"),
        PERMANENT,
        "{name}"
    );
    assert_eq!(store.count(&retryable).await.expect("count"), 1, "{name}");
    let key = Filter::all().with_key(backend.consumed_key(&poisoned.source, "p1"));
    assert_eq!(store.count(&key).await.expect("count"), 1, "{name}");
    let before = Filter::all().failed_between(None, Some(poisoned.started));
    let since = Filter::all().failed_between(Some(poisoned.started), None);
    assert_eq!(store.count(&before).await.expect("count"), 0, "{name}");
    assert_eq!(store.count(&since).await.expect("count"), LETTERS, "{name}");

    let summary = store.summary(&Filter::all()).await.expect("summary");
    assert_eq!(summary.total, LETTERS, "{name}");
    assert_eq!(
        summary.by_class.get("permanent"),
        Some(&PERMANENT),
        "{name}"
    );
    assert_eq!(summary.by_class.get("retryable"), Some(&1), "{name}");
    assert_eq!(summary.unreadable, 0, "{name}");
    let oldest = summary.oldest_failed_at.expect("an oldest letter");
    assert!(oldest >= poisoned.started, "{name}: {oldest:?}");

    // One letter a page: the cursor walks every letter once, oldest first.
    let mut walked = Vec::new();
    let mut after: Option<LetterId> = None;
    loop {
        let page = store
            .list(&Filter::all(), 1, after.as_ref())
            .await
            .expect("list");
        walked.extend(page.letters);
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
        assert!(
            walked.len() <= LETTERS as usize + 1,
            "{name}: the cursor does not advance"
        );
    }
    assert_eq!(walked.len(), LETTERS as usize, "{name}: {walked:?}");
    let walked: Vec<LetterId> = walked.into_iter().map(|stored| stored.id).collect();
    assert_eq!(walked, all_ids(&store, &Filter::all()).await, "{name}");

    let retried = store.list(&retryable, 10, None).await.expect("list");
    let [listed] = &retried.letters[..] else {
        panic!("{name}: one retryable letter, not {:?}", retried.letters);
    };
    assert!(retried.next.is_none(), "{name}");
    let listed_letter = letter(listed);
    assert!(
        listed_letter.message.payload().is_empty(),
        "{name}: a listing carries no payload"
    );
    assert_eq!(listed.payload_bytes, "retry-0".len(), "{name}");
    assert_eq!(
        listed_letter.message.key().map(|key| &key[..]),
        Some(backend.consumed_key(&poisoned.source, "r0").as_bytes()),
        "{name}"
    );
    assert_eq!(
        listed_letter.message.headers().get_str("tenant"),
        Some("acme"),
        "{name}"
    );
    assert_eq!(
        &**listed_letter.message.metadata().source(),
        poisoned.source,
        "{name}"
    );
    assert_eq!(listed_letter.attempts, 2, "{name}");
    assert_eq!(listed_letter.replays, 0, "{name}");
    assert!(
        listed_letter.error.contains("the dependency is down"),
        "{name}: {}",
        listed_letter.error
    );

    let read = store.read(&listed.id).await.expect("read");
    assert_eq!(read.id, listed.id);
    assert_eq!(&letter(&read).message.payload()[..], b"retry-0", "{name}");
    let origin = letter(&read).origin.as_ref().expect("an origin");
    assert_eq!(origin.broker, backend.capabilities().broker, "{name}");

    store
        .purge(&Selection::Ids(vec![listed.id.clone()]))
        .await
        .expect("purge");
    match store.read(&listed.id).await {
        Err(StoreError::NotFound { id }) => assert_eq!(id, listed.id),
        other => panic!("{name}: a purged letter is read as {other:?}"),
    }
}

/// A replay moves nothing in a dry run; then publishes each selected
/// letter's message back to its source (payload, key, headers,
/// `intake.replays` = 1) and removes the letter. The consumer fails it
/// again, and the loop guard keeps the new letter in the store.
pub async fn a_replay_returns_letters_to_their_origin_and_the_loop_guard_holds_them_after<
    B: StoreBackend,
>(
    backend: &B,
) {
    let (poisoned, store) = Poisoned::start(backend, "store-replay").await;
    let name = backend.name();
    let permanent = Selection::Matching(Filter::all().with_class(ErrorClass::Permanent));

    let dry = store
        .replay(&permanent, &Replay::to_origin().dry_run(true))
        .await
        .expect("dry run");
    assert!(dry.dry_run);
    assert_eq!(dry.replayed, PERMANENT, "{name}: {dry:?}");
    assert_eq!(dry.by_class.get("permanent"), Some(&PERMANENT), "{name}");
    assert_eq!(
        store.count(&Filter::all()).await.expect("count"),
        LETTERS,
        "{name}"
    );
    let failed_before = poisoned.failed().len();

    let done = store
        .replay(&permanent, &Replay::to_origin())
        .await
        .expect("replay");
    assert_eq!(done.replayed, PERMANENT, "{name}: {done:?}");
    assert!(done.skipped.is_empty(), "{name}: {done:?}");

    // The consumer of the source gets each message again, replayed once,
    // fails it again, and the sink writes it with its replay count.
    let replayed = Filter::all().with_class(ErrorClass::Permanent);
    poisoned
        .wait_for_letters(&store, &replayed, PERMANENT)
        .await;
    let again: Vec<Message> = poisoned.failed().split_off(failed_before);
    poisoned.consumer.stop().await;
    for n in 0..PERMANENT {
        let payload = format!("poison-{n}");
        let message = again
            .iter()
            .find(|message| message.payload() == payload.as_bytes())
            .unwrap_or_else(|| panic!("{name}: {payload} was not consumed again: {again:?}"));
        assert_eq!(
            message.headers().get_str(REPLAYS),
            Some("1"),
            "{name}: {message:?}"
        );
        let key = backend.replayed_key(&poisoned.source, &format!("p{n}"));
        assert_eq!(
            message.key().map(|key| &key[..]),
            Some(key.as_bytes()),
            "{name}"
        );
    }
    let letters = store.list(&replayed, 100, None).await.expect("list");
    for stored in &letters.letters {
        assert_eq!(letter(stored).replays, 1, "{name}: {stored:?}");
    }

    // The loop guard: a letter replayed once already stays with a limit of 1.
    let guarded = store
        .replay(&permanent, &Replay::to_origin().max_replays(1))
        .await
        .expect("guarded replay");
    assert_eq!(guarded.replayed, 0, "{name}: {guarded:?}");
    assert_eq!(
        guarded.skipped.len(),
        PERMANENT as usize,
        "{name}: {guarded:?}"
    );
    assert!(
        guarded
            .skipped
            .iter()
            .all(|skipped| skipped.reason == SkipReason::ReplayLimit { replays: 1 }),
        "{name}: {guarded:?}"
    );
    assert_eq!(
        store.count(&Filter::all()).await.expect("count"),
        LETTERS,
        "{name}"
    );
}

/// A purge by filter removes what it matches and nothing else; by ids, the
/// letters named.
pub async fn a_purge_removes_only_what_it_selects<B: StoreBackend>(backend: &B) {
    let (poisoned, store) = Poisoned::start(backend, "store-purge").await;
    poisoned.consumer.stop().await;
    let name = backend.name();

    let retryable = Filter::all().with_class(ErrorClass::Retryable);
    let removed = store
        .purge(&Selection::Matching(retryable.clone()))
        .await
        .expect("purge");
    assert_eq!(removed, 1, "{name}");
    assert_eq!(store.count(&retryable).await.expect("count"), 0, "{name}");
    let left = all_ids(&store, &Filter::all()).await;
    assert_eq!(left.len(), PERMANENT as usize, "{name}");

    let removed = store
        .purge(&Selection::Ids(left[..2].to_vec()))
        .await
        .expect("purge by id");
    assert_eq!(removed, 2, "{name}");
    assert_eq!(all_ids(&store, &Filter::all()).await, left[2..], "{name}");
    let removed = store
        .purge(&Selection::Matching(Filter::all()))
        .await
        .expect("purge all");
    assert_eq!(removed, 1, "{name}");
    assert_eq!(
        store.count(&Filter::all()).await.expect("count"),
        0,
        "{name}"
    );
}

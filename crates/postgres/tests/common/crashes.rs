//! The exactly-once scenario every broker runs: consumers crash (dropped
//! without shutdown) after their transactions committed but before the
//! broker learned so, the broker delivers those messages again, and still
//! each message's effect is in the ledger exactly once.

use std::time::Duration;

use std::sync::Arc;

use intake_core::backend::testkit::Backend;
use intake_core::backend::testkit::harness::{Running, numbered, unique_group};
use intake_core::batch::{BatchLayer, BatchSettings};
use intake_core::{Consumer, ConsumerBuilder, DeliveryOrder, HandlerError, Message, Payload};
use intake_postgres::{ExactlyOnce, ExactlyOnceCounters, MessageId, Tx};
use sqlx::{AssertSqlSafe, PgPool};
use tower::{Layer, Service};

use super::{ledger_summary, ledger_table, marker_table};

/// The header that carries each produced message's id.
pub const ID_HEADER: &str = "message-id";

/// How a consumer acknowledges during one round before it crashes.
#[derive(Clone, Copy, Debug)]
pub enum Acks {
    /// Never before the crash: every message it processed is redelivered.
    Never,
    /// Every few milliseconds, as in production: the crash finds some
    /// processed messages acknowledged and some not.
    Often,
}

/// One consumer's life: how it acknowledges, and after how many newly
/// processed messages (counted over the whole run) it crashes.
#[derive(Clone, Copy, Debug)]
pub struct Round {
    pub acks: Acks,
    pub crash_after_processed: u64,
}

/// What the scenario saw.
#[derive(Debug)]
pub struct Outcome {
    /// Deliveries the handler skipped because their effects had committed:
    /// messages the broker delivered more than once.
    pub duplicates: u64,
    /// Messages whose commit the handler saw succeed (a commit cut short by a
    /// crash is in the ledger but not counted here).
    pub processed: u64,
}

/// Which exactly-once handler the consumers run.
#[derive(Clone, Copy, Debug)]
pub enum Form {
    /// [`ExactlyOnce`]: a transaction per message.
    PerMessage,
    /// [`ExactlyOnceBatch`](intake_postgres::ExactlyOnceBatch) under the
    /// batch layer: a transaction per batch.
    Batch(BatchSettings),
}

/// Three consumers crash (two of them before acknowledging anything), then
/// a fourth drains the source.
pub const ROUNDS: [Round; 3] = [
    Round {
        acks: Acks::Never,
        crash_after_processed: 100,
    },
    Round {
        acks: Acks::Often,
        crash_after_processed: 180,
    },
    Round {
        acks: Acks::Never,
        crash_after_processed: 240,
    },
];

/// Messages a scenario produces.
pub const MESSAGES: u64 = 300;

/// Runs [`effects_once_despite_crashes`] over [`MESSAGES`] messages against
/// the test database (skipped, saying why, when there is none) and prints
/// how many deliveries the broker repeated.
pub async fn check<B: Backend>(
    backend: &B,
    test: &str,
    message_id: MessageId,
    form: Form,
    rounds: &[Round],
) {
    let Some(pool) = super::database(test, 16).await else {
        return;
    };
    let outcome =
        effects_once_despite_crashes(backend, &pool, message_id, form, MESSAGES, rounds).await;
    println!(
        "{test} ({}): {MESSAGES} messages, each effect once; {} redeliveries of committed \
         messages skipped",
        backend.name(),
        outcome.duplicates
    );
}

/// Batches of up to 50 messages, handed over after 5 ms, two at a time.
pub fn batches() -> BatchSettings {
    BatchSettings {
        max_size: 50,
        max_wait: Duration::from_millis(5),
        parallelism: 2,
    }
}

/// Produces `count` messages, runs `rounds` of consumers that each crash,
/// then a last consumer that drains everything and shuts down gracefully.
/// Asserts the ledger holds each id exactly once and the broker has nothing
/// left unacknowledged.
pub async fn effects_once_despite_crashes<B: Backend>(
    backend: &B,
    pool: &PgPool,
    message_id: MessageId,
    form: Form,
    count: u64,
    rounds: &[Round],
) -> Outcome {
    let partitions = if backend.capabilities().partitions {
        4
    } else {
        1
    };
    let source = backend
        .create_source(partitions)
        .await
        .expect("create the source");
    let group = unique_group("exactly-once");
    // Each message also carries its id in a `message-id` header, for
    // [`MessageId::Header`] (and brokers whose positions are not stable).
    let messages = numbered(0, count)
        .into_iter()
        .map(|mut message| {
            message.headers.insert(ID_HEADER, message.payload.clone());
            message
        })
        .collect();
    backend.produce(&source, messages).await.expect("produce");
    let markers = marker_table(pool).await;
    let ledger = ledger_table(pool).await;
    let builder = ExactlyOnce::builder(pool.clone(), group.clone())
        .table(markers)
        .message_id(message_id);

    let run = Run {
        backend,
        source: &source,
        group: &group,
        rounds,
    };
    let counters = match form {
        Form::PerMessage => {
            let insert = format!("INSERT INTO {ledger} (id) VALUES ($1)");
            let handler = builder
                .handler(async move |mut tx: Tx, Payload(payload): Payload| {
                    sqlx::query(AssertSqlSafe(insert))
                        .bind(id_of(&payload)?)
                        .execute(&mut *tx)
                        .await?;
                    Ok::<_, intake_core::BoxError>(())
                })
                .expect("valid exactly-once settings");
            let counters = Arc::clone(handler.counters());
            run.crash_then_drain(&counters, || handler.clone()).await;
            counters
        }
        Form::Batch(settings) => {
            let insert = format!("INSERT INTO {ledger} (id) SELECT * FROM UNNEST($1::int8[])");
            let handler = builder
                .batch_handler(async move |mut tx: Tx, payloads: Vec<Payload>| {
                    let ids = payloads
                        .iter()
                        .map(|Payload(payload)| id_of(payload))
                        .collect::<Result<Vec<i64>, _>>()?;
                    sqlx::query(AssertSqlSafe(insert))
                        .bind(&ids)
                        .execute(&mut *tx)
                        .await?;
                    Ok::<_, intake_core::BoxError>(())
                })
                .expect("valid exactly-once settings");
            let counters = Arc::clone(handler.counters());
            let layer = BatchLayer::new(settings).expect("valid batch settings");
            // A fresh batch layer per consumer: a crash takes its batches
            // (and their worker) down with it.
            run.crash_then_drain(&counters, || layer.layer(handler.clone()))
                .await;
            counters
        }
    };

    let count = i64::try_from(count).expect("a small count");
    assert_eq!(
        ledger_summary(pool, &ledger).await,
        (count, count, Some(0), Some(count - 1)),
        "(rows, distinct ids, min, max): every id exactly once"
    );
    // Whatever committed before a crash without an acknowledgement came
    // back; a round that never acknowledged guarantees some did.
    if rounds
        .iter()
        .any(|round| matches!(round.acks, Acks::Never) && round.crash_after_processed > 0)
    {
        assert!(
            counters.duplicates() > 0,
            "the broker redelivered committed messages and they were skipped"
        );
    }
    Outcome {
        duplicates: counters.duplicates(),
        processed: counters.processed(),
    }
}

/// The consumers of one scenario.
struct Run<'a, B> {
    backend: &'a B,
    source: &'a str,
    group: &'a str,
    rounds: &'a [Round],
}

impl<B: Backend> Run<'_, B> {
    /// Runs each round's consumer until it crashes, then one that drains
    /// the source (the broker holds nothing unacknowledged) and stops.
    async fn crash_then_drain<H>(&self, counters: &ExactlyOnceCounters, handler: impl Fn() -> H)
    where
        H: Service<Message, Response = (), Error = HandlerError> + Send + 'static,
        H::Future: Send + 'static,
    {
        for (index, round) in self.rounds.iter().enumerate() {
            // The runtime sends an acknowledgement once a quarter of
            // `max_in_flight` has completed, whatever `commit_batch` says
            // (so a prefetch of `max_in_flight` never stalls): a round that
            // must not acknowledge takes a budget whose quarter it never
            // reaches.
            let (builder, max_in_flight) = match round.acks {
                Acks::Never => (
                    Consumer::builder()
                        .commit_interval(Duration::from_secs(3600))
                        .commit_batch(usize::MAX),
                    4096,
                ),
                Acks::Often => (
                    Consumer::builder().commit_interval(Duration::from_millis(5)),
                    16,
                ),
            };
            let running = self.start(builder, max_in_flight, handler()).await;
            wait_until(&format!("round {index}: {round:?}"), || {
                counters.processed() >= round.crash_after_processed
            })
            .await;
            running.crash().await;
            tokio::time::sleep(self.backend.capabilities().crash_redelivery_after).await;
        }

        let builder = Consumer::builder().commit_interval(Duration::from_millis(5));
        let running = self.start(builder, 16, handler()).await;
        // Drained when the broker holds nothing unacknowledged. (The
        // handler's `processed` count may stay below the message count: a
        // crash while COMMIT was under way leaves effects committed but
        // uncounted, and their redeliveries count as duplicates.)
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while self
            .backend
            .unacknowledged(self.source, self.group)
            .await
            .expect("inspect the broker")
            > 0
        {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the broker still holds unacknowledged messages after a minute ({counters:?})"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        running.stop().await;
    }

    async fn start<H>(&self, builder: ConsumerBuilder, max_in_flight: usize, handler: H) -> Running
    where
        H: Service<Message, Response = (), Error = HandlerError> + Send + 'static,
        H::Future: Send + 'static,
    {
        Running::start(
            self.backend,
            self.source,
            self.group,
            builder.ordering(DeliveryOrder::Unordered),
            max_in_flight,
            handler,
        )
        .await
        .expect("connect")
    }
}

fn id_of(payload: &[u8]) -> Result<i64, HandlerError> {
    std::str::from_utf8(payload)
        .ok()
        .and_then(|text| text.parse().ok())
        .ok_or_else(|| HandlerError::permanent("payload is not an id"))
}

async fn wait_until(what: &str, condition: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !condition() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not reached within a minute"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

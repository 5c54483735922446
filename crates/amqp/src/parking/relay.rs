//! The relay: takes copies parked beyond the longest tier from the relay
//! queue, after each step of their wait, and parks them on for the rest.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::StreamExt;
use intake_core::SourceName;
use intake_core::parking::DUE;
use lapin::Connection;
use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::{Shared, relay_queue};
use crate::connection::open_within;
use crate::error::{Operation, classify};
use crate::source::convert::DeliveryReader;
use crate::topology::short;

/// Copies the relay holds unacknowledged at once; it moves them one at a
/// time.
const PREFETCH: u16 = 16;

/// The first wait after a failed round; it doubles up to [`LONGEST_WAIT`].
const FIRST_WAIT: Duration = Duration::from_millis(100);

/// The longest wait between failed rounds.
const LONGEST_WAIT: Duration = Duration::from_secs(10);

/// The relay task of one parking, and how to stop it.
pub(super) struct Relay {
    stop: watch::Sender<bool>,
    task: std::sync::Mutex<Option<JoinHandle<()>>>,
}

impl Relay {
    /// Starts the relay of `shared`'s queue.
    pub(super) fn start(shared: Arc<Shared>) -> Self {
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(run(shared, stopped));
        Self {
            stop,
            task: std::sync::Mutex::new(Some(task)),
        }
    }

    /// Asks the relay to stop and waits for it, at most `within`: it
    /// finishes the copy it is moving (each step bounded by the parking's
    /// timeout).
    pub(super) async fn stop(&self, within: Duration) {
        let _ = self.stop.send(true);
        let task = self
            .task
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .take();
        if let Some(task) = task
            && tokio::time::timeout(within, task).await.is_err()
        {
            tracing::warn!(
                ?within,
                "the parking relay did not stop in time; it ends after its current step"
            );
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        // The task also sees the sender go; this says it at once.
        let _ = self.stop.send(true);
    }
}

/// Resolves once a stop was asked for (or the parking is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    loop {
        if *stop.borrow_and_update() {
            return;
        }
        if stop.changed().await.is_err() {
            return;
        }
    }
}

/// Relays until stopped; a failed round (a lost connection, a refused
/// publish) is followed by a wait that doubles with each failure in a row.
async fn run(shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let mut failures: u32 = 0;
    loop {
        match round(&shared, &mut stop, &mut failures).await {
            Ok(()) => return,
            Err(error) => {
                failures = failures.saturating_add(1);
                let wait = FIRST_WAIT
                    .saturating_mul(1 << failures.saturating_sub(1).min(16))
                    .min(LONGEST_WAIT);
                tracing::warn!(
                    queue = shared.queue,
                    relay_queue = relay_queue(&shared.queue),
                    failures,
                    retry_in = ?wait,
                    error = %intake_core::ErrorChain::new(&*error),
                    "the parking relay failed; copies parked beyond the longest tier wait in \
                     the relay queue until it runs again",
                );
                tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    () = stopped(&mut stop) => return,
                }
            }
        }
    }
}

/// One connection's worth of relaying: `Ok` once stopped, `Err` when the
/// connection, the channel or a move failed (the broker puts back what
/// was not acknowledged).
async fn round(
    shared: &Shared,
    stop: &mut watch::Receiver<bool>,
    failures: &mut u32,
) -> Result<(), intake_core::BoxError> {
    let url = &shared.url;
    let name = shared
        .connection_name
        .as_ref()
        .map(|name| format!("{name} (parking relay)"));
    let connection = tokio::select! {
        connected = open_within(url, name.as_deref(), &shared.tls, shared.connect_timeout) => connected?,
        () = stopped(stop) => return Ok(()),
    };
    let relayed = relay_on(shared, &connection, stop, failures).await;
    let _ = tokio::time::timeout(
        shared.timeout,
        connection.close(200, "parking relay done".into()),
    )
    .await;
    relayed
}

async fn relay_on(
    shared: &Shared,
    connection: &Connection,
    stop: &mut watch::Receiver<bool>,
    failures: &mut u32,
) -> Result<(), intake_core::BoxError> {
    let url = &shared.url;
    let fail = |error| classify(error, url.endpoint(), url.vhost(), Operation::Other);
    let within = shared.timeout;
    let queue = relay_queue(&shared.queue);
    let channel = bounded(within, connection.create_channel())
        .await?
        .map_err(fail)?;
    bounded(within, shared.relay_topology.declare_on(&channel, url)).await??;
    bounded(
        within,
        channel.basic_qos(PREFETCH, BasicQosOptions { global: false }),
    )
    .await?
    .map_err(fail)?;
    let mut deliveries = bounded(
        within,
        channel.basic_consume(
            short(&queue),
            short(""),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        ),
    )
    .await?
    .map_err(fail)?;
    *failures = 0;
    tracing::debug!(relay_queue = queue, "parking relay consuming");
    let mut reader = DeliveryReader::new(SourceName::from(queue.as_str()));
    loop {
        let next = tokio::select! {
            next = deliveries.next() => next,
            () = stopped(stop) => return Ok(()),
        };
        let delivery = match next {
            Some(Ok(delivery)) => delivery,
            Some(Err(error)) => return Err(fail(error).into()),
            None => return Err("the broker ended the relay's consumer".into()),
        };
        let tag = delivery.delivery_tag;
        let index = move_on(shared, &mut reader, delivery).await?;
        bounded(within, channel.basic_ack(tag, BasicAckOptions::default()))
            .await?
            .map_err(fail)?;
        shared.relayed.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(
            queue = shared.queue,
            wait_queue = shared.tier(index).map(|tier| tier.wait.as_str()),
            "parked copy relayed"
        );
    }
}

/// Parks the copy in `delivery` on: in the tier of the rest of its wait
/// (by the due time it carries), or for another step. Returns where it
/// went. A copy without a due time (none of intake's) goes to the shortest
/// tier, and so back to its queue, where it is handled as it comes.
async fn move_on(
    shared: &Shared,
    reader: &mut DeliveryReader,
    delivery: Delivery,
) -> Result<usize, intake_core::BoxError> {
    let copy = reader.read(delivery, 0);
    let rest = copy
        .headers()
        .get_str(DUE)
        .and_then(|due| due.parse::<u64>().ok())
        .and_then(|due| UNIX_EPOCH.checked_add(Duration::from_millis(due)))
        .and_then(|due| due.duration_since(SystemTime::now()).ok())
        .unwrap_or(Duration::ZERO);
    let index = shared.wait_for(rest);
    shared.publish_copy(&copy, index).await?;
    Ok(index)
}

/// `future`, or an error once `within` passed without an answer.
async fn bounded<T>(
    within: Duration,
    future: impl Future<Output = T>,
) -> Result<T, intake_core::BoxError> {
    tokio::time::timeout(within, future)
        .await
        .map_err(|_| format!("the broker did not answer within {within:?}").into())
}

//! The handler: parse the id, maybe fail on purpose, run the effects (if
//! any), append the ledger line, and only then report success.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use intake::retry::RetryObserver;
use intake::{HandlerError, Message};
use tower::util::BoxCloneService;
use tower::{Service, ServiceExt};

use crate::journal::Journal;

/// The exactly-once effects service, when `--effects-db` is given.
pub type Effects = BoxCloneService<Message, (), HandlerError>;

/// Counters and the idle clock, shared by the handler, the retry layer, the
/// runtime's observer and the idle watcher.
pub struct Activity {
    started: Instant,
    /// Milliseconds after `started` of the last sign of work.
    last_active_ms: AtomicU64,
    processed: AtomicU64,
    retried: AtomicU64,
    first_attempts: AtomicU64,
    fail_every: Option<u64>,
    /// `--later-every` and `--later-secs`.
    later: Option<(u64, Duration)>,
    /// Parked copies handled before the due time they carried.
    early: AtomicU64,
}

impl Activity {
    pub fn new(fail_every: Option<u64>) -> Self {
        Self {
            started: Instant::now(),
            last_active_ms: AtomicU64::new(0),
            processed: AtomicU64::new(0),
            retried: AtomicU64::new(0),
            first_attempts: AtomicU64::new(0),
            fail_every,
            later: None,
            early: AtomicU64::new(0),
        }
    }

    /// Every `every`-th first attempt asks to be retried after `delay`.
    pub fn later_every(mut self, every: Option<u64>, delay: Duration) -> Self {
        self.later = every.map(|every| (every, delay));
        self
    }

    /// Parked copies handled before the due time they carried: a parking
    /// that gave one back too soon.
    pub fn early(&self) -> u64 {
        self.early.load(Ordering::Relaxed)
    }

    /// Restarts the idle clock.
    pub fn touch(&self) {
        let now = self.started.elapsed().as_millis() as u64;
        self.last_active_ms.fetch_max(now, Ordering::Relaxed);
    }

    pub fn idle_for(&self) -> Duration {
        let now = self.started.elapsed().as_millis() as u64;
        Duration::from_millis(now.saturating_sub(self.last_active_ms.load(Ordering::Relaxed)))
    }

    pub fn processed(&self) -> u64 {
        self.processed.load(Ordering::Relaxed)
    }

    /// Retries made in process by the retry layer.
    pub fn retried(&self) -> u64 {
        self.retried.load(Ordering::Relaxed)
    }

    /// What `--fail-every` and `--later-every` make of this attempt: the
    /// count of first attempts decides, so each run's choices follow the
    /// order of deliveries.
    fn on_purpose(&self, message: &Message) -> OnPurpose {
        if (self.fail_every.is_none() && self.later.is_none()) || message.metadata().attempt() != 1
        {
            return OnPurpose::Nothing;
        }
        let nth = self.first_attempts.fetch_add(1, Ordering::Relaxed) + 1;
        if self
            .fail_every
            .is_some_and(|every| nth.is_multiple_of(every))
        {
            return OnPurpose::Fail;
        }
        match self.later {
            Some((every, delay)) if nth.is_multiple_of(every) => OnPurpose::Later(delay),
            _ => OnPurpose::Nothing,
        }
    }
}

/// A failure the command line asks for.
enum OnPurpose {
    Nothing,
    Fail,
    Later(Duration),
}

/// Counts the retry layer's retries.
#[derive(Clone)]
pub struct CountRetries(pub Arc<Activity>);

impl RetryObserver for CountRetries {
    fn on_retry(&self, message: &Message, error: &HandlerError, delay: Duration) {
        self.0.retried.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(
            position = %message.metadata().position(),
            %error,
            ?delay,
            "retrying"
        );
    }
}

/// The handler service over `journal` and, optionally, `effects`.
pub fn service(
    journal: Journal,
    activity: Arc<Activity>,
    effects: Option<Effects>,
) -> impl Service<Message, Response = (), Error = HandlerError, Future: Send + 'static>
+ Clone
+ Send
+ 'static {
    tower::service_fn(move |message: Message| {
        let (journal, activity, effects) = (journal.clone(), activity.clone(), effects.clone());
        async move { handle(&journal, &activity, effects, message).await }
    })
}

async fn handle(
    journal: &Journal,
    activity: &Activity,
    effects: Option<Effects>,
    message: Message,
) -> Result<(), HandlerError> {
    activity.touch();
    let id = parse_id(message.payload())?;
    match activity.on_purpose(&message) {
        OnPurpose::Nothing => {}
        OnPurpose::Fail => {
            return Err(HandlerError::retryable(format!(
                "id {id}: failing its first attempt on purpose (--fail-every)"
            )));
        }
        OnPurpose::Later(delay) => {
            return Err(HandlerError::retry_later(
                format!("id {id}: asking for later on purpose (--later-every)"),
                delay,
            ));
        }
    }
    let metadata = message.metadata();
    // A parked copy's line says how late after its due time it ran
    // (negative: too soon), for the chaos suite to check.
    let line = match lateness_ms(&message) {
        Some(late) => {
            if late < 0 {
                activity.early.fetch_add(1, Ordering::Relaxed);
                tracing::error!(
                    id,
                    early_ms = -late,
                    "a parked message came back before its due time"
                );
            }
            format!(
                "{id}\t{}\t{}\t{late}\n",
                metadata.partition(),
                metadata.position()
            )
        }
        None => format!("{id}\t{}\t{}\n", metadata.partition(), metadata.position()),
    };
    if let Some(effects) = effects {
        // Commits the effect with its marker, or skips a delivery whose
        // marker exists; either way the delivery is recorded below.
        effects.oneshot(message).await?;
    }
    journal.append(line).await.map_err(|error| {
        HandlerError::retryable(format!("appending id {id} to the ledger: {error}"))
    })?;
    activity.processed.fetch_add(1, Ordering::Relaxed);
    activity.touch();
    Ok(())
}

/// Milliseconds from the due time a parked copy carries to now.
fn lateness_ms(message: &Message) -> Option<i64> {
    let due: i64 = message
        .headers()
        .get_str(intake::parking::DUE)?
        .parse()
        .ok()?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?
        .as_millis();
    Some(i64::try_from(now).ok()? - due)
}

/// The payload is the id in decimal; anything else can never succeed.
pub fn parse_id(payload: &[u8]) -> Result<u64, HandlerError> {
    std::str::from_utf8(payload)
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .ok_or_else(|| {
            HandlerError::permanent(format!(
                "payload {:?} is not a decimal id",
                String::from_utf8_lossy(&payload[..payload.len().min(64)])
            ))
        })
}

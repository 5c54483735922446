//! [`GroupControl`]: one instance's end of its group's commands log — it
//! sends pauses and resumes for the whole group, and applies everyone's to
//! this instance's routes.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use super::{CommandTarget, ControlChannel, ControlError, ControlFeed, Entry, GroupCommand};
use crate::app::AppControl;
use crate::backoff::{BackoffPolicy, Exponential};

/// [`ControlChannel`] behind a pointer: the trait's futures are `impl`,
/// so a handle that forgets the backend boxes them (a command or an open,
/// never per message).
trait DynChannel: Send + Sync {
    fn append(&self, record: Bytes) -> BoxFuture<'_, Result<(), ControlError>>;
    fn follow(&self) -> BoxFuture<'_, Result<ControlFeed, ControlError>>;
}

impl<C: ControlChannel> DynChannel for C {
    fn append(&self, record: Bytes) -> BoxFuture<'_, Result<(), ControlError>> {
        Box::pin(ControlChannel::append(self, record))
    }

    fn follow(&self) -> BoxFuture<'_, Result<ControlFeed, ControlError>> {
        Box::pin(ControlChannel::follow(self))
    }
}

/// One instance's end of its group's commands log (see the
/// [module docs](super)): [`send`](Self::send) a pause or a resume to every
/// instance of the group, and [`apply_until`](Self::apply_until) applies
/// every instance's commands, this one's too, to this instance's routes.
///
/// A command sent here takes effect here when it comes back through the
/// log, like everywhere else: every instance applies the same commands in
/// the same order, so they agree on what is paused.
///
/// ```
/// use intake_core::app::App;
/// use intake_core::consumer::Consumer;
/// use intake_core::group_control::{ControlLog, GroupControl};
/// use intake_core::memory::MemoryBroker;
/// use intake_core::{HandlerError, Message};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let broker = MemoryBroker::new();
/// broker.create_topic("orders", 2)?;
/// let (source, acker) = broker.consumer("orders", "billing")?;
/// let handler = tower::service_fn(|_message: Message| async { Ok::<_, HandlerError>(()) });
/// let group = GroupControl::new(
///     broker.group_control_channel("billing", ControlLog::Commands),
///     "instance-a",
/// );
/// let app = App::new()
///     .route("orders", Consumer::builder().build(source, acker, handler)?)
///     .group_control(group.clone());
/// // Later, from any instance: `group.pause_partition("orders", "orders", 1).await?`.
/// # drop(app);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct GroupControl {
    inner: Arc<Inner>,
}

struct Inner {
    commands: Box<dyn DynChannel>,
    /// The group's status log, when given: the console publishes this
    /// instance's view there and reads the others'.
    status: Option<Box<dyn DynChannel>>,
    instance: String,
    /// Commands applied here so far (the log's records read, malformed
    /// ones too): a feed opened again skips them.
    applied: AtomicU64,
}

impl fmt::Debug for GroupControl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GroupControl")
            .field("instance", &self.inner.instance)
            .field("applied", &self.applied())
            .finish_non_exhaustive()
    }
}

impl GroupControl {
    /// The end of `commands` (a [`ControlLog::Commands`](super::ControlLog)
    /// channel) of instance `instance` (a name unique in the group: the
    /// host name, a pod name).
    pub fn new(commands: impl ControlChannel, instance: impl Into<String>) -> Self {
        Self {
            inner: Arc::new(Inner {
                commands: Box::new(commands),
                status: None,
                instance: instance.into(),
                applied: AtomicU64::new(0),
            }),
        }
    }

    /// Also shares what this instance runs through `status` (a
    /// [`ControlLog::Status`](super::ControlLog) channel of the same group):
    /// a [`Console`](crate::app::Console) publishes its view there at each
    /// sample and shows every instance's (`GET /console/api/v1/group`).
    /// Call it before cloning: clones made earlier do not see it.
    #[must_use]
    pub fn with_status(self, status: impl ControlChannel) -> Self {
        match Arc::try_unwrap(self.inner) {
            Ok(mut inner) => {
                inner.status = Some(Box::new(status));
                Self {
                    inner: Arc::new(inner),
                }
            }
            Err(shared) => {
                // Cloned already: keep the handle working without the
                // status log rather than panic, and say so.
                tracing::warn!(
                    instance = %shared.instance,
                    "GroupControl::with_status on a cloned handle: the status log is not used"
                );
                Self { inner: shared }
            }
        }
    }

    /// This instance's name.
    pub fn instance(&self) -> &str {
        &self.inner.instance
    }

    /// How many records of the log this instance has applied (or skipped
    /// as malformed).
    pub fn applied(&self) -> u64 {
        self.inner.applied.load(Ordering::Acquire)
    }

    /// Sends `command` to every instance of the group; done once the
    /// broker stored it (each instance applies it when it reads it).
    pub async fn send(&self, command: &GroupCommand) -> Result<(), ControlError> {
        self.inner.commands.append(command.encode()).await
    }

    /// Pauses partition `partition` of `source` in `route` on whichever
    /// instance runs it, now and after any rebalance.
    pub async fn pause_partition(
        &self,
        route: &str,
        source: &str,
        partition: u32,
    ) -> Result<(), ControlError> {
        let command = GroupCommand::pause_partition(route, source, partition, self.instance());
        self.send(&command).await
    }

    /// Resumes a partition paused by [`pause_partition`](Self::pause_partition).
    pub async fn resume_partition(
        &self,
        route: &str,
        source: &str,
        partition: u32,
    ) -> Result<(), ControlError> {
        let command = GroupCommand::resume_partition(route, source, partition, self.instance());
        self.send(&command).await
    }

    /// Pauses every partition of `route` on every instance.
    pub async fn pause_route(&self, route: &str) -> Result<(), ControlError> {
        self.send(&GroupCommand::pause_route(route, self.instance()))
            .await
    }

    /// Resumes every partition of `route` on every instance.
    pub async fn resume_route(&self, route: &str) -> Result<(), ControlError> {
        self.send(&GroupCommand::resume_route(route, self.instance()))
            .await
    }

    /// Follows the group's commands log from its start until `stop`,
    /// applying each command to `routes` (a route this instance does not
    /// run is passed over). A feed that fails or ends is opened again after
    /// a backoff (100 ms doubling to 5 s), skipping what was applied;
    /// every failure is logged. [`App::group_control`](crate::app::App::group_control)
    /// runs it beside the routes.
    pub async fn apply_until(self, routes: AppControl, stop: CancellationToken) {
        let instance = self.instance().to_owned();
        follow_until(
            &*self.inner.commands,
            "commands",
            &instance,
            &stop,
            |record| {
                self.apply_record(&record, &routes);
            },
            || self.applied(),
        )
        .await;
    }

    /// Applies one record of the commands log (a mark is passed over);
    /// what it was.
    fn apply_record(&self, record: &[u8], routes: &AppControl) -> Option<Entry> {
        let entry = match Entry::decode(record) {
            Ok(entry) => Some(entry),
            Err(error) => {
                tracing::warn!(
                    instance = %self.instance(),
                    error = %crate::error::ErrorChain::new(&error),
                    bytes = record.len(),
                    "skipped a record of the group's commands log"
                );
                None
            }
        };
        if let Some(Entry::Command(command)) = &entry {
            apply(command, routes, self.instance());
        }
        self.inner.applied.fetch_add(1, Ordering::AcqRel);
        entry
    }

    /// Reads the commands log up to its end as of now and applies every
    /// command in it to `routes`, waiting at most `bound`: before the
    /// routes start, so that a partition the group paused is paused before
    /// its first fetch. The end is found by writing a mark (a small record
    /// with a random token) and reading until it comes back; each start of
    /// an instance adds one. [`App::group_control`](crate::app::App::group_control)
    /// runs it as a startup hook. An error, or the bound passing, is
    /// returned: the caller decides whether to start anyway.
    pub async fn catch_up(
        &self,
        routes: &AppControl,
        bound: Duration,
    ) -> Result<u64, CatchUpError> {
        let token = format!("{:032x}", rand::random::<u128>());
        let work = async {
            self.inner
                .commands
                .append(Entry::encode_mark(&token, self.instance()))
                .await?;
            let mut feed = self.inner.commands.follow().await?;
            let mut skip = self.applied();
            loop {
                let record = match feed.next().await {
                    Some(record) => record?,
                    None => return Err(CatchUpError::Ended),
                };
                if skip > 0 {
                    skip -= 1;
                    continue;
                }
                if let Some(Entry::Mark { token: read }) = self.apply_record(&record, routes)
                    && read == token
                {
                    return Ok(self.applied());
                }
            }
        };
        match tokio::time::timeout(bound, work).await {
            Ok(result) => result,
            Err(_) => Err(CatchUpError::TimedOut(bound)),
        }
    }

    /// Appends `record` to the status log, if there is one.
    #[cfg(feature = "console")]
    pub(crate) async fn publish_status(&self, record: Bytes) -> Option<Result<(), ControlError>> {
        let status = self.inner.status.as_ref()?;
        Some(status.append(record).await)
    }

    /// Whether a status log was given.
    #[cfg(feature = "console")]
    pub(crate) fn has_status(&self) -> bool {
        self.inner.status.is_some()
    }

    /// Follows the status log from its start until `stop`, handing each
    /// record to `on_record` (after a reopen, from the start again).
    #[cfg(feature = "console")]
    pub(crate) async fn follow_status_until(
        &self,
        stop: &CancellationToken,
        on_record: impl FnMut(Bytes),
    ) {
        let Some(status) = &self.inner.status else {
            return;
        };
        follow_until(&**status, "status", self.instance(), stop, on_record, || 0).await;
    }
}

/// Follows `log` until `stop`: each record to `on_record`, skipping the
/// first `seen()` of each feed opened (what an earlier feed handed over);
/// a feed that fails or ends is opened again after a backoff (100 ms
/// doubling to 5 s), each failure logged.
async fn follow_until(
    log: &dyn DynChannel,
    name: &str,
    instance: &str,
    stop: &CancellationToken,
    mut on_record: impl FnMut(Bytes),
    seen: impl Fn() -> u64,
) {
    let policy =
        Exponential::new(Duration::from_millis(100), Duration::from_secs(5)).retry_forever();
    let mut failures = 0_u32;
    loop {
        let opened = tokio::select! {
            () = stop.cancelled() => return,
            opened = log.follow() => opened,
        };
        let mut handed = 0_u64;
        let error = match opened {
            Ok(mut feed) => {
                let mut skip = seen();
                loop {
                    let record = tokio::select! {
                        () = stop.cancelled() => return,
                        record = feed.next() => record,
                    };
                    match record {
                        None => break None,
                        Some(Err(error)) => break Some(error),
                        Some(Ok(_)) if skip > 0 => skip -= 1,
                        Some(Ok(record)) => {
                            handed += 1;
                            on_record(record);
                        }
                    }
                }
            }
            Err(error) => Some(error),
        };
        failures = if handed > 0 {
            1
        } else {
            failures.saturating_add(1)
        };
        let wait = policy.delay(failures).unwrap_or(Duration::from_secs(5));
        match error {
            Some(error) => tracing::warn!(
                instance,
                log = name,
                error = %crate::error::ErrorChain::new(&error),
                retry_in = ?wait,
                "the group's control log failed; following it again"
            ),
            None => tracing::warn!(
                instance,
                log = name,
                retry_in = ?wait,
                "the group's control log feed ended; following it again"
            ),
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
        }
    }
}

/// Why [`GroupControl::catch_up`] did not reach the end of the log.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CatchUpError {
    /// The log could not be written or read.
    #[error("the group's commands log could not be read to its end")]
    Log(#[from] ControlError),
    /// The feed ended before the mark came back.
    #[error("the group's commands log feed ended before its end was read")]
    Ended,
    /// The mark did not come back within the bound.
    #[error("the group's commands log was not read to its end within {0:?}")]
    TimedOut(Duration),
}

/// Applies `command` to this instance's route, if it runs it.
fn apply(command: &GroupCommand, routes: &AppControl, instance: &str) {
    let Some(control) = routes.route(&command.route) else {
        tracing::debug!(route = %command.route, "a group command for a route this instance does not run");
        return;
    };
    match (&command.target, command.pause) {
        (CommandTarget::Route, true) => control.pause_all(),
        (CommandTarget::Route, false) => control.resume_all(),
        (CommandTarget::Partition { source, partition }, true) => {
            control.pause_partition(source, *partition);
        }
        (CommandTarget::Partition { source, partition }, false) => {
            control.resume_partition(source, *partition);
        }
    }
    tracing::info!(
        instance,
        route = %command.route,
        target = ?command.target,
        pause = command.pause,
        by = %command.by,
        "applied a group command"
    );
}

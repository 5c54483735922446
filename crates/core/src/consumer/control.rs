//! Pausing and resuming partitions of a running consumer:
//! [`ConsumerControl`], the handle, and what the run reads of it.
//!
//! A command is queued under a mutex and a flag is raised; the run reads
//! the flag once per pass of its loop (one relaxed load, never per
//! message) and takes the commands only when it is raised. The handle
//! wakes the run, so a command reaches an idle run at once.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Waker;

use crate::message::PartitionKey;

/// A command for the run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Command {
    /// Pause (`true`) or resume one partition.
    Partition(PartitionKey, bool),
    /// Pause (`true`) or resume every partition, those assigned later too.
    All(bool),
}

/// What the handle and the run share.
#[derive(Debug, Default)]
pub(crate) struct Shared {
    /// Commands wait: the run takes them at its next pass.
    due: AtomicBool,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    commands: Vec<Command>,
    /// The run's waker, once it runs.
    waker: Option<Waker>,
    /// What is paused, as the commands say (for [`ConsumerControl::paused`]).
    paused: BTreeSet<PartitionKey>,
    all: bool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding it left plain data: go on with it.
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn send(&self, command: Command) {
        let waker = {
            let mut inner = self.lock();
            match &command {
                Command::Partition(key, true) => {
                    inner.paused.insert(key.clone());
                }
                Command::Partition(key, false) => {
                    inner.paused.remove(key);
                }
                Command::All(all) => {
                    inner.all = *all;
                    inner.paused.clear();
                }
            }
            inner.commands.push(command);
            self.due.store(true, Ordering::Release);
            inner.waker.clone()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    /// Whether commands wait (read at every pass of the run).
    #[inline]
    pub(crate) fn due(&self) -> bool {
        self.due.load(Ordering::Relaxed)
    }

    /// Takes the waiting commands into `into`, oldest first.
    pub(crate) fn take(&self, into: &mut Vec<Command>) {
        let mut inner = self.lock();
        self.due.store(false, Ordering::Relaxed);
        into.append(&mut inner.commands);
    }

    /// The run starts: commands wake it from now on.
    pub(crate) fn attach(&self, waker: &Waker) {
        self.lock().waker = Some(waker.clone());
    }

    /// The run is over: nothing to wake any more.
    pub(crate) fn detach(&self) {
        self.lock().waker = None;
    }
}

/// Pauses and resumes partitions of a running consumer; from
/// [`Consumer::control`](super::Consumer::control), cheap to clone, usable
/// from any thread or task, before the run starts and while it runs.
///
/// A paused partition starts no new delivery: the deliveries of it that
/// already run finish and are committed as usual; those fetched and not
/// started are held (they keep a slot of the in-flight budget), so its
/// committed position stays before the first of them and nothing of it is
/// skipped. The source is asked to stop fetching it
/// ([`Source::pause`](crate::source::Source::pause), the path the runtime
/// already takes for a partition over its uncommitted window); a source
/// that cannot pause one partition keeps delivering it, and its deliveries
/// are held until the in-flight budget is full, which then stops fetching
/// for every partition. A resume starts the held deliveries in their order
/// and fetches the partition again.
///
/// A pause names a partition, not an assignment: it holds across a revoke
/// and a new assignment of the partition to this consumer (the held
/// deliveries are released unacknowledged at the revoke, and delivered
/// again from the committed position). It does not travel to another
/// consumer the partition moves to.
///
/// ```
/// use intake_core::consumer::Consumer;
/// use intake_core::memory::MemoryBroker;
/// use intake_core::{HandlerError, Message};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let broker = MemoryBroker::new();
/// broker.create_topic("orders", 2)?;
/// let (source, acker) = broker.consumer("orders", "billing")?;
/// let handler = tower::service_fn(|_message: Message| async { Ok::<_, HandlerError>(()) });
/// let consumer = Consumer::builder().build(source, acker, handler)?;
/// let control = consumer.control();
/// control.pause_partition("orders", 1);
/// assert!(control.is_paused("orders", 1));
/// control.resume_partition("orders", 1);
/// assert!(!control.is_paused("orders", 1));
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct ConsumerControl {
    pub(crate) shared: Arc<Shared>,
}

impl ConsumerControl {
    /// Pauses partition `partition` of `source` (a topic, stream or queue
    /// name), assigned now or later.
    pub fn pause_partition(&self, source: &str, partition: u32) {
        self.shared.send(Command::Partition(
            PartitionKey::new(source, partition),
            true,
        ));
    }

    /// Resumes a partition paused by [`pause_partition`](Self::pause_partition);
    /// nothing if it is not paused.
    pub fn resume_partition(&self, source: &str, partition: u32) {
        self.shared.send(Command::Partition(
            PartitionKey::new(source, partition),
            false,
        ));
    }

    /// Pauses every partition, those assigned later too (a route).
    pub fn pause_all(&self) {
        self.shared.send(Command::All(true));
    }

    /// Resumes every partition, those paused one by one too.
    pub fn resume_all(&self) {
        self.shared.send(Command::All(false));
    }

    /// Whether the commands sent so far pause this partition (the run
    /// applies them at its next pass).
    pub fn is_paused(&self, source: &str, partition: u32) -> bool {
        let inner = self.shared.lock();
        inner.all || inner.paused.contains(&PartitionKey::new(source, partition))
    }

    /// Whether every partition is paused ([`pause_all`](Self::pause_all)).
    pub fn all_paused(&self) -> bool {
        self.shared.lock().all
    }

    /// The partitions paused one by one, in order.
    pub fn paused_partitions(&self) -> Vec<PartitionKey> {
        self.shared.lock().paused.iter().cloned().collect()
    }
}

//! The source's own message queue, read in batches.
//!
//! librdkafka gives every partition a fetch queue and forwards it, when the
//! partition's fetcher starts, to the consumer's main queue, where rdkafka's
//! `BaseConsumer::poll` takes one message per call: three clock reads, the
//! queue's lock and an `Arc` per message. librdkafka's batch call
//! (`rd_kafka_consume_batch_queue`) reads the clock twice per batch, but on
//! the main queue it would serve a rebalance through a `rebalance_cb`, which
//! rdkafka does not register, so librdkafka would unassign on its own
//! instead of asking the source's context.
//!
//! So each assigned partition's fetch queue is forwarded to a queue of the
//! source's own, before its fetcher starts (in the rebalance callback, ahead
//! of the assignment): messages, and the fetch errors of those partitions,
//! go there and are read in batches; rebalances, commit results and client
//! errors stay on the main queue, which the polling thread still serves with
//! rdkafka's `poll`. A partition's messages keep their order (one fetch
//! queue, forwarded whole). One queue for every partition, rather than a
//! queue per partition read each on its own, because librdkafka can only
//! wait on one queue at a time.
//!
//! A forward the application sets is marked as the application's, and
//! librdkafka never changes it back when the fetcher starts again; it only
//! clears it when the fetcher stops (a revocation). A partition whose
//! forward were cleared and not set again would fetch into its own queue,
//! which nobody reads (rust-rdkafka's issue 535, where a `PartitionQueue`
//! is dropped). Here every assignment forwards its partitions again, before
//! their fetchers start, and the polling thread forwards the whole
//! assignment again once a second, should a fetcher ever restart
//! without an assignment. Messages a partition queued meanwhile move over
//! in order when it is forwarded.
//!
//! Nothing is left behind on a revocation: librdkafka bumps the revoked
//! partition's version when it stops the fetcher, and the batch call drops
//! the messages of an older version as `poll` does (so do pauses and seeks,
//! which the source's holds and watchdog rely on). The queue is destroyed
//! before the consumer, with the messages it still holds; every message a
//! batch returned is destroyed before the next batch.

use std::ffi::{CString, c_void};
use std::ptr::NonNull;
use std::sync::Mutex;
use std::time::Duration;

use rdkafka::TopicPartitionList;
use rdkafka::bindings;

/// A librdkafka queue handle that may be sent to and shared with the
/// thread that serves rebalances.
#[derive(Debug)]
struct QueuePtr(NonNull<bindings::rd_kafka_queue_t>);

// SAFETY: librdkafka's queue handles are thread-safe (every operation on one
// takes the queue's lock); the handle is only destroyed by its owner,
// `FetchQueue`, after it was taken out of `Forwarding` under its lock.
unsafe impl Send for QueuePtr {}

/// Where the rebalance callback forwards newly assigned partitions: the
/// source's queue while the polling thread reads it, nothing once it is
/// gone (the consumer's close serves rebalances after that).
#[derive(Debug, Default)]
pub(crate) struct Forwarding {
    queue: Mutex<Option<QueuePtr>>,
}

impl Forwarding {
    /// Forwards the fetch queue of each partition of `list` to the source's
    /// queue, if there is one.
    ///
    /// `client` must be the live instance of the consumer whose source's
    /// queue this is (the caller's consumer).
    pub(crate) fn forward(&self, client: *mut bindings::rd_kafka_t, list: &TopicPartitionList) {
        let queue = self
            .queue
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        let Some(queue) = queue.as_ref() else {
            return;
        };
        for element in list.elements() {
            let Ok(topic) = CString::new(element.topic()) else {
                continue;
            };
            // SAFETY: `client` is the live consumer instance (the caller's);
            // `topic` is a NUL-terminated string that outlives the call.
            let partition = unsafe {
                bindings::rd_kafka_queue_get_partition(client, topic.as_ptr(), element.partition())
            };
            let Some(partition) = NonNull::new(partition) else {
                tracing::warn!(
                    topic = element.topic(),
                    partition = element.partition(),
                    "librdkafka has no queue for an assigned partition; its messages come through the main queue"
                );
                continue;
            };
            // SAFETY: both handles are live: `partition` was just returned,
            // and the source's queue stays alive while it is held here (its
            // owner takes it out under this lock before destroying it).
            // The forward holds its own reference to the destination, so
            // the partition's handle may go at once.
            unsafe {
                bindings::rd_kafka_queue_forward(partition.as_ptr(), queue.0.as_ptr());
                bindings::rd_kafka_queue_destroy(partition.as_ptr());
            }
        }
    }

    fn set(&self, queue: Option<NonNull<bindings::rd_kafka_queue_t>>) {
        *self
            .queue
            .lock()
            .unwrap_or_else(|poison| poison.into_inner()) = queue.map(QueuePtr);
    }
}

/// Wakes a batch read of the source's queue (`opaque`) when the main queue
/// gets an event, so that a rebalance or a commit result is served at once
/// rather than after the read's timeout.
///
/// # Safety
///
/// `opaque` is the source's queue handle; librdkafka calls this while the
/// callback is enabled, and it is disabled before that handle is destroyed.
unsafe extern "C" fn wake_reader(_client: *mut bindings::rd_kafka_t, opaque: *mut c_void) {
    // SAFETY: see the function's contract.
    unsafe { bindings::rd_kafka_queue_yield(opaque.cast()) }
}

/// The source's message queue, owned by the polling thread.
pub(crate) struct FetchQueue<'a> {
    messages: NonNull<bindings::rd_kafka_queue_t>,
    /// A handle on the consumer's main queue, whose wake-ups yield
    /// `messages`.
    main: NonNull<bindings::rd_kafka_queue_t>,
    forwarding: &'a Forwarding,
    /// The messages of the batch being read.
    slots: Vec<*mut bindings::rd_kafka_message_t>,
}

impl<'a> FetchQueue<'a> {
    /// A queue for the consumer `client` (live as long as the returned
    /// value: the caller drops it before the consumer), published in
    /// `forwarding` for the rebalance callback. `None` when librdkafka has
    /// no consumer-group queue (the source then polls the main queue as
    /// rdkafka does).
    pub(crate) fn install(
        client: *mut bindings::rd_kafka_t,
        forwarding: &'a Forwarding,
        batch: usize,
    ) -> Option<Self> {
        // SAFETY: `client` is the live consumer instance (the caller's).
        let main = NonNull::new(unsafe { bindings::rd_kafka_queue_get_consumer(client) })?;
        // SAFETY: as above.
        let Some(messages) = NonNull::new(unsafe { bindings::rd_kafka_queue_new(client) }) else {
            // SAFETY: `main` was just returned and is not used again.
            unsafe { bindings::rd_kafka_queue_destroy(main.as_ptr()) };
            return None;
        };
        // SAFETY: both handles are live; `messages` outlives the callback,
        // which `drop` disables before destroying it.
        unsafe {
            bindings::rd_kafka_queue_cb_event_enable(
                main.as_ptr(),
                Some(wake_reader),
                messages.as_ptr().cast(),
            );
        }
        forwarding.set(Some(messages));
        Some(Self {
            messages,
            main,
            forwarding,
            slots: Vec::with_capacity(batch.max(1)),
        })
    }

    /// Whether events wait on the main queue (rebalances, commit results,
    /// errors, or a message fetched before its partition was forwarded).
    pub(crate) fn events_waiting(&self) -> bool {
        // SAFETY: `main` is live while `self` is.
        unsafe { bindings::rd_kafka_queue_length(self.main.as_ptr()) > 0 }
    }

    /// Forwards the partitions of `list` again (see the module's doc).
    pub(crate) fn forward(&self, client: *mut bindings::rd_kafka_t, list: &TopicPartitionList) {
        self.forwarding.forward(client, list);
    }

    /// Reads up to `max` messages, waiting up to `timeout` for the first
    /// (less when the main queue gets an event), and hands each to `each`
    /// by reference; every one is destroyed before this returns, a panic
    /// of `each` included. Returns how many were read.
    pub(crate) fn read(
        &mut self,
        timeout: Duration,
        max: usize,
        mut each: impl FnMut(&bindings::rd_kafka_message_t),
    ) -> usize {
        let max = max.min(self.slots.capacity());
        if max == 0 {
            return 0;
        }
        let timeout_ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
        // SAFETY: `messages` is live; `slots` has room for `max` pointers,
        // which librdkafka writes from its start.
        let read = unsafe {
            bindings::rd_kafka_consume_batch_queue(
                self.messages.as_ptr(),
                timeout_ms,
                self.slots.as_mut_ptr(),
                max,
            )
        };
        // -1 is an error of the call itself (none for a queue handle).
        let read = usize::try_from(read).unwrap_or(0).min(max);
        // SAFETY: librdkafka wrote `read` message pointers.
        unsafe { self.slots.set_len(read) };
        let batch = Batch {
            slots: &mut self.slots,
        };
        for &message in batch.slots.iter() {
            // SAFETY: each pointer is a message librdkafka returned and
            // nobody destroyed yet (`Batch` does, after this loop).
            each(unsafe { &*message });
        }
        read
    }
}

/// Destroys the messages of a batch, also when a conversion panicked.
struct Batch<'s> {
    slots: &'s mut Vec<*mut bindings::rd_kafka_message_t>,
}

impl Drop for Batch<'_> {
    fn drop(&mut self) {
        for message in self.slots.drain(..) {
            // SAFETY: a message returned by the batch call, destroyed once
            // (drained from the list), while the consumer lives (the queue
            // that returned it is owned by the polling thread, which drops
            // it before the consumer).
            unsafe { bindings::rd_kafka_message_destroy(message) };
        }
    }
}

impl Drop for FetchQueue<'_> {
    fn drop(&mut self) {
        // Nothing forwards to the queue once it is gone.
        self.forwarding.set(None);
        // SAFETY: both handles are live and destroyed once, here. Disabling
        // the wake-up takes the main queue's lock, so no wake-up runs with
        // the queue handle after it; destroying the owner's handle disables
        // the queue and destroys the messages it still held (fetch queues
        // forwarding to it keep a reference of their own until their
        // fetchers stop, and their messages are then dropped).
        unsafe {
            bindings::rd_kafka_queue_cb_event_enable(
                self.main.as_ptr(),
                None,
                std::ptr::null_mut(),
            );
            bindings::rd_kafka_queue_destroy(self.main.as_ptr());
            bindings::rd_kafka_queue_destroy(self.messages.as_ptr());
        }
    }
}

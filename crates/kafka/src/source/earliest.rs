//! Return topics read from their start whatever `auto.offset.reset` says.
//!
//! A parked copy reaches its group's return topic whenever its mover moves
//! it, which may be while no member of the group has a position on that
//! return partition (before the source joined, during a rebalance). Its
//! original was acknowledged when it was parked, so a member that starts a
//! return partition without a committed offset at its end
//! (`auto.offset.reset=latest`) loses every copy that came before.
//!
//! `auto.offset.reset` is a topic setting in librdkafka, read per partition
//! from its topic handle whenever the partition has no usable offset (none
//! committed, or one the retention deleted): at every assignment, after
//! every restart and rebalance. A topic handle created with a setting of
//! its own before the consumer ever uses the topic is the one the consumer
//! uses (`rd_kafka_topic_new`: a second call for the same name returns the
//! first handle, its configuration unchanged). So the source creates one
//! per return topic, with `earliest`, right after it creates its consumer
//! and before any lookup touches the topic, and holds it as long as the
//! consumer lives.

use std::ffi::{CString, c_char};
use std::ptr::NonNull;
use std::sync::Arc;

use rdkafka::bindings;
use rdkafka::consumer::{BaseConsumer, Consumer};

use super::context::KafkaContext;
use crate::error::Error;

/// Topic handles that read from the start, held for the consumer's life.
pub(crate) struct EarliestTopics {
    topics: Vec<String>,
    handles: Vec<NonNull<bindings::rd_kafka_topic_t>>,
    /// Dropped after the handles (see [`Drop`]): the instance must outlive
    /// them, whichever thread lets go of the consumer last.
    consumer: Option<Arc<BaseConsumer<KafkaContext>>>,
}

// SAFETY: librdkafka's topic handles may be used and destroyed from any
// thread; the struct only destroys them.
unsafe impl Send for EarliestTopics {}

impl EarliestTopics {
    /// Makes `consumer` read `topics` from their start when a partition has
    /// no usable offset. Call before anything else of the consumer names
    /// them (a lookup creates a handle with the default settings, which the
    /// consumer would then use).
    ///
    /// # Errors
    ///
    /// [`Error::Config`] when librdkafka refuses the topic setting or the
    /// topic name.
    pub(crate) fn hold(
        consumer: &Arc<BaseConsumer<KafkaContext>>,
        topics: &[String],
    ) -> Result<Self, Error> {
        let mut held = Self {
            topics: Vec::with_capacity(topics.len()),
            handles: Vec::with_capacity(topics.len()),
            consumer: Some(Arc::clone(consumer)),
        };
        if topics.is_empty() {
            held.consumer = None;
            return Ok(held);
        }
        let native = consumer.client().native_ptr();
        for topic in topics {
            let refused = |why: &str| {
                Error::config(
                    "topics",
                    format!("the return topic `{topic}` cannot be read from its start: {why}"),
                )
            };
            let name = CString::new(topic.as_str()).map_err(|_| refused("a NUL in its name"))?;
            // SAFETY: `native` is the consumer's live instance; the copy is
            // ours until handed to `rd_kafka_topic_new` (or destroyed below).
            let conf = unsafe { bindings::rd_kafka_default_topic_conf_dup(native) };
            let Some(conf) = NonNull::new(conf) else {
                return Err(refused("librdkafka made no topic configuration"));
            };
            let mut error = [0 as c_char; 256];
            // SAFETY: `conf` is a live configuration; the key and value are
            // NUL-terminated; `error` has the length given.
            let set = unsafe {
                bindings::rd_kafka_topic_conf_set(
                    conf.as_ptr(),
                    c"auto.offset.reset".as_ptr(),
                    c"earliest".as_ptr(),
                    error.as_mut_ptr(),
                    error.len(),
                )
            };
            if set != bindings::rd_kafka_conf_res_t::RD_KAFKA_CONF_OK {
                // SAFETY: the configuration is still ours; `error` is
                // NUL-terminated by librdkafka within its length.
                let why = unsafe {
                    bindings::rd_kafka_topic_conf_destroy(conf.as_ptr());
                    std::ffi::CStr::from_ptr(error.as_ptr())
                }
                .to_string_lossy()
                .into_owned();
                return Err(refused(&why));
            }
            // SAFETY: `native` is live and `name` NUL-terminated; librdkafka
            // takes the configuration, whatever it answers.
            let handle =
                unsafe { bindings::rd_kafka_topic_new(native, name.as_ptr(), conf.as_ptr()) };
            let Some(handle) = NonNull::new(handle) else {
                return Err(refused("librdkafka refused the topic"));
            };
            held.handles.push(handle);
            held.topics.push(topic.clone());
        }
        Ok(held)
    }

    /// Whether `topic` is read from its start.
    pub(crate) fn contains(&self, topic: &str) -> bool {
        self.topics.iter().any(|held| held == topic)
    }
}

impl Drop for EarliestTopics {
    fn drop(&mut self) {
        for handle in self.handles.drain(..) {
            // SAFETY: each handle came from `rd_kafka_topic_new` on the
            // instance `self.consumer` keeps alive until after this loop.
            unsafe { bindings::rd_kafka_topic_destroy(handle.as_ptr()) };
        }
        self.consumer = None;
    }
}

//! [`Output`], one message to publish, and [`Outputs`], what a handler fn
//! returns to publish several.

use std::sync::Arc;

use bytes::Bytes;

use crate::message::{Headers, Message};
use crate::trace::TRACEPARENT;

/// One message to publish: where to, its payload, key and headers.
///
/// The destination is the broker's own name for it: a Kafka topic, a Redis
/// stream key, an AMQP routing key on the publisher's exchange, a NATS
/// subject, a memory-broker topic. The key picks the partition where the
/// broker has partitions (Kafka, memory) and is kept as a header or field
/// where it has none (see each backend's publisher).
#[derive(Clone, Debug)]
pub struct Output {
    pub(crate) destination: Arc<str>,
    pub(crate) payload: Bytes,
    pub(crate) key: Option<Bytes>,
    pub(crate) headers: Headers,
    pub(crate) partition: Option<u32>,
}

impl Output {
    /// An output of `payload` to `destination`, without key or headers.
    ///
    /// A destination used for every message is cheapest as an `Arc<str>`
    /// made once and cloned: a `&str` is copied into a new one each time.
    pub fn new(destination: impl Into<Arc<str>>, payload: impl Into<Bytes>) -> Self {
        Self {
            destination: destination.into(),
            payload: payload.into(),
            key: None,
            headers: Headers::new(),
            partition: None,
        }
    }

    /// `message` passed on unchanged to `destination`: the same payload, key
    /// and headers (shared, not copied).
    pub fn forward(message: &Message, destination: impl Into<Arc<str>>) -> Self {
        Self {
            destination: destination.into(),
            payload: message.payload().clone(),
            key: message.key().cloned(),
            headers: message.headers().clone(),
            partition: None,
        }
    }

    /// Sets the key.
    pub fn with_key(mut self, key: impl Into<Bytes>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// Adds a header (a name may repeat).
    pub fn with_header(mut self, name: impl Into<Arc<str>>, value: impl Into<Bytes>) -> Self {
        self.headers.insert(name, value);
        self
    }

    /// Replaces the headers.
    pub fn with_headers(mut self, headers: Headers) -> Self {
        self.headers = headers;
        self
    }

    /// Puts it in partition `partition` of its destination, where the
    /// broker has partitions (Kafka, memory), instead of the one its key
    /// picks: a replay that must land beside the other messages of its key
    /// in the partition it was first consumed from, whichever partitioner
    /// their producer used. Brokers without partitions ignore it.
    pub fn with_partition(mut self, partition: u32) -> Self {
        self.partition = Some(partition);
        self
    }

    /// The partition it was [put in](Self::with_partition), if any.
    pub fn partition(&self) -> Option<u32> {
        self.partition
    }

    /// Where it goes.
    pub fn destination(&self) -> &str {
        &self.destination
    }

    /// The destination as shared, for a publisher that keeps it.
    pub fn destination_shared(&self) -> &Arc<str> {
        &self.destination
    }

    /// The payload.
    pub fn payload(&self) -> &Bytes {
        &self.payload
    }

    /// The key, if it has one.
    pub fn key(&self) -> Option<&Bytes> {
        self.key.as_ref()
    }

    /// The headers.
    pub fn headers(&self) -> &Headers {
        &self.headers
    }

    /// Takes it apart: destination, payload, key, headers.
    pub fn into_parts(self) -> (Arc<str>, Bytes, Option<Bytes>, Headers) {
        (self.destination, self.payload, self.key, self.headers)
    }

    /// Carries the trace of the input it came from (`trace`, its
    /// `traceparent`), unless the output names a trace of its own: the
    /// current span's context with the `opentelemetry` feature (when a span
    /// is recorded), otherwise the input's. An output that copied the
    /// input's headers ([`forward`](Self::forward)) holds the input's
    /// `traceparent`, which is not a trace of its own.
    pub(crate) fn continue_trace(&mut self, trace: Option<&Bytes>) {
        let carried = self.headers.get(TRACEPARENT);
        if carried.is_some() && carried != trace {
            return;
        }
        let carries_none = carried.is_none();
        #[cfg(feature = "opentelemetry")]
        if crate::trace::otel::inject_current(&mut self.headers) {
            return;
        }
        if carries_none && let Some(trace) = trace {
            self.headers.insert(TRACEPARENT, trace.clone());
        }
    }
}

/// What a handler fn returns to publish: none, one or several [`Output`]s.
///
/// A handler fn that returns `Outputs` (or `Result<Outputs, E>`) is a
/// service whose response is the outputs; wrap it in a
/// [`PublishLayer`](super::PublishLayer), which publishes them and
/// completes the input only once every one is confirmed.
///
/// ```
/// use intake_core::publish::{Output, Outputs};
///
/// let none = Outputs::none();
/// let one: Outputs = Output::new("receipts", "paid").into();
/// let several: Outputs = (0..3).map(|n| Output::new("audit", format!("step {n}"))).collect();
/// assert_eq!((none.len(), one.len(), several.len()), (0, 1, 3));
/// ```
#[derive(Clone, Debug, Default)]
pub struct Outputs(Vec<Output>);

impl Outputs {
    /// No output: the input completes as a handler returning `()` would.
    pub fn none() -> Self {
        Self(Vec::new())
    }

    /// Adds an output; outputs are published in the order they were added.
    pub fn push(&mut self, output: Output) {
        self.0.push(output);
    }

    /// How many outputs there are.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The outputs, in order.
    pub fn iter(&self) -> std::slice::Iter<'_, Output> {
        self.0.iter()
    }
}

impl From<Output> for Outputs {
    fn from(output: Output) -> Self {
        Self(vec![output])
    }
}

impl From<Vec<Output>> for Outputs {
    fn from(outputs: Vec<Output>) -> Self {
        Self(outputs)
    }
}

impl From<Option<Output>> for Outputs {
    fn from(output: Option<Output>) -> Self {
        Self(output.into_iter().collect())
    }
}

impl FromIterator<Output> for Outputs {
    fn from_iter<I: IntoIterator<Item = Output>>(outputs: I) -> Self {
        Self(outputs.into_iter().collect())
    }
}

impl IntoIterator for Outputs {
    type Item = Output;
    type IntoIter = std::vec::IntoIter<Output>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

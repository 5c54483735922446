//! [`ReplayLayer`]: turns each record of a dead-letter destination back
//! into the message that failed.

use std::sync::Arc;

use tower::Layer;

use super::{Config, ReplayCounters, ReplayService};
use crate::dead_letter::DEFAULT_MAX_REPLAYS;

/// Reads each record a consumer of a dead-letter destination receives as a
/// [`DeadLetter`](crate::DeadLetter) and hands the handler it wraps the
/// original message, under the loop guard. See the [module docs](super).
///
/// Build it for the destination's carrier: [`keyed`](Self::keyed) where a
/// letter's record key is the original key (a Kafka topic, a memory-broker
/// topic), [`keyless`](Self::keyless) elsewhere.
#[derive(Clone, Debug)]
#[must_use = "a ReplayLayer does nothing until it wraps a handler"]
pub struct ReplayLayer {
    config: Arc<Config>,
}

impl ReplayLayer {
    /// For a destination whose records have a key slot that holds the
    /// original key (a Kafka dead-letter topic, a memory-broker one): the
    /// consumed record's key is the original key.
    pub fn keyed() -> Self {
        Self::with_key_slot(true)
    }

    /// For a destination without a key slot of the letter's own (a Redis
    /// stream, an AMQP queue, a NATS subject): the original key is read
    /// from the envelope, and whatever the source gives as the record's
    /// key (an AMQP routing key, a Redis key field, the NATS subject) is
    /// ignored.
    pub fn keyless() -> Self {
        Self::with_key_slot(false)
    }

    fn with_key_slot(key_slot: bool) -> Self {
        Self {
            config: Arc::new(Config {
                key_slot,
                max_replays: DEFAULT_MAX_REPLAYS,
                dry_run: false,
                counters: ReplayCounters::default(),
            }),
        }
    }

    /// The loop guard: a letter whose message was replayed this often
    /// already is not handed to the handler but refused
    /// ([`ReplayRefused::ReplayLimit`](super::ReplayRefused::ReplayLimit)).
    /// 0 replays nothing.
    pub fn max_replays(mut self, max_replays: u32) -> Self {
        Arc::make_mut(&mut self.config).max_replays = max_replays;
        self
    }

    /// A dry run calls no handler: it counts each record in the
    /// [counters](Self::counters) and acknowledges it. Run it under a consumer
    /// group of its own, on a destination where an acknowledgement removes
    /// nothing: see the [module docs](super).
    pub fn dry_run(mut self, dry_run: bool) -> Self {
        Arc::make_mut(&mut self.config).dry_run = dry_run;
        self
    }

    /// The counters the layer and its services count in.
    pub fn counters(&self) -> ReplayCounters {
        self.config.counters.clone()
    }

    /// The loop guard's limit.
    pub fn replay_limit(&self) -> u32 {
        self.config.max_replays
    }

    /// Whether it is a dry run.
    pub fn is_dry_run(&self) -> bool {
        self.config.dry_run
    }

    /// Whether the consumed record's key is the original key
    /// ([`keyed`](Self::keyed)).
    pub fn has_key_slot(&self) -> bool {
        self.config.key_slot
    }
}

impl<S> Layer<S> for ReplayLayer {
    type Service = ReplayService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ReplayService::new(inner, Arc::clone(&self.config))
    }
}

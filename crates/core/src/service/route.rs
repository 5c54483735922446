//! [`Route`]: one route's own settings in a [`Service`](super::Service).

use std::time::Duration;

use crate::backend::RouteOptions;
use crate::backoff::Exponential;
use crate::consumer::{ConsumerBuilder, DeliveryOrder};

/// A route's settings: everything has a default, so
/// [`Service::route`](super::Service::route) needs none of them.
///
/// ```
/// use std::time::Duration;
/// use intake_core::DeliveryOrder;
/// use intake_core::service::Route;
///
/// let route = Route::new()
///     .group("billing-replay")
///     .ordering(DeliveryOrder::Key)
///     .max_in_flight(256)
///     .retries(5)
///     .parking_tiers([Duration::from_secs(2), Duration::from_secs(60)]);
/// # drop(route);
/// ```
#[derive(Clone, Debug)]
#[must_use = "a Route does nothing until given to `Service::route_with`"]
pub struct Route {
    pub(super) name: Option<String>,
    pub(super) group: Option<String>,
    pub(super) ordering: Option<DeliveryOrder>,
    pub(super) max_in_flight: Option<usize>,
    pub(super) retries: u32,
    pub(super) backoff_min: Duration,
    pub(super) backoff_max: Duration,
    pub(super) parking: Option<Option<Vec<Duration>>>,
    /// The consumer's settings from a config file, over the rest.
    #[cfg(feature = "serde")]
    pub(super) consumer: Option<crate::consumer::ConsumerSettings>,
}

impl Default for Route {
    fn default() -> Self {
        Self::new()
    }
}

impl Route {
    /// How many times a retryable failure is tried again in process, by
    /// default, before it is dead-lettered.
    pub const DEFAULT_RETRIES: u32 = 3;

    /// The defaults: the service's group, the consumer's default order and
    /// in-flight bound, [`DEFAULT_RETRIES`](Self::DEFAULT_RETRIES) retries
    /// from 100 ms doubling up to 10 s, and parking at the backend's
    /// default delays.
    pub fn new() -> Self {
        Self {
            name: None,
            group: None,
            ordering: None,
            max_in_flight: None,
            retries: Self::DEFAULT_RETRIES,
            backoff_min: Duration::from_millis(100),
            backoff_max: Duration::from_secs(10),
            parking: Some(None),
            #[cfg(feature = "serde")]
            consumer: None,
        }
    }

    /// Names the route in reports, logs and metrics (by default its
    /// source, or `SOURCE as GROUP` when it names its own group).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    pub(super) fn name_for(&self, source: &str) -> String {
        match (&self.name, &self.group) {
            (Some(name), _) => name.clone(),
            (None, Some(group)) => format!("{source} as {group}"),
            (None, None) => source.to_owned(),
        }
    }

    /// Reads as `group` (Kafka and Redis consumer group, NATS durable
    /// consumer) instead of the service's name.
    pub fn group(mut self, group: impl Into<String>) -> Self {
        self.group = Some(group.into());
        self
    }

    /// The route's delivery order ([`DeliveryOrder::Key`] keeps each key's
    /// messages in order and runs keys side by side).
    pub fn ordering(mut self, ordering: DeliveryOrder) -> Self {
        self.ordering = Some(ordering);
        self
    }

    /// At most this many of the route's messages are handled at once: its
    /// share of the service's budget.
    pub fn max_in_flight(mut self, max_in_flight: usize) -> Self {
        self.max_in_flight = Some(max_in_flight);
        self
    }

    /// Tries a retryable failure again `retries` times (0: never) before it
    /// is dead-lettered.
    pub fn retries(mut self, retries: u32) -> Self {
        self.retries = retries;
        self
    }

    /// The backoff between two attempts: from `min`, doubling up to `max`.
    pub fn backoff(mut self, min: Duration, max: Duration) -> Self {
        self.backoff_min = min;
        self.backoff_max = max;
        self
    }

    /// Parks at these delays (Kafka retry topics, RabbitMQ wait queues) when
    /// the handler asks to retry later.
    pub fn parking_tiers(mut self, tiers: impl IntoIterator<Item = Duration>) -> Self {
        self.parking = Some(Some(tiers.into_iter().collect()));
        self
    }

    /// No parking: a handler's "retry later" is an ordinary retryable
    /// failure (retried in process, then dead-lettered), and the broker
    /// gets no return path (no retry topics, wait queues or due index).
    pub fn without_parking(mut self) -> Self {
        self.parking = None;
        self
    }

    pub(super) fn route_options(&self) -> RouteOptions {
        match &self.parking {
            None => RouteOptions::new(),
            Some(None) => RouteOptions::new().parking(),
            Some(Some(tiers)) => RouteOptions::new().parking_tiers(tiers.iter().copied()),
        }
    }

    pub(super) fn backoff_policy(&self) -> Exponential {
        Exponential::new(self.backoff_min, self.backoff_max).max_retries(self.retries)
    }

    pub(super) fn consumer_builder(&self) -> ConsumerBuilder {
        let mut builder = crate::Consumer::builder();
        if let Some(ordering) = self.ordering {
            builder = builder.ordering(ordering);
        }
        if let Some(max_in_flight) = self.max_in_flight {
            builder = builder.max_in_flight(max_in_flight);
        }
        #[cfg(feature = "serde")]
        if let Some(settings) = &self.consumer {
            builder = settings.clone().apply(builder);
        }
        builder
    }
}

//! The consumer's `max_ack_pending`, sized from the runtime's budget and
//! the room for parked messages once the runtime tells the source its
//! limits.

use async_nats::jetstream;

use super::NatsSource;
use crate::error::boxed;

impl NatsSource {
    /// Raises the consumer's `max_ack_pending` to twice the budget plus the
    /// room for parked messages once the runtime told it (never lowers it:
    /// other instances share it).
    ///
    /// Twice, because the server counts a delivery as pending until its ack
    /// arrives, and acks travel in batches: at the budget alone the server
    /// stops sending while a batch of acks is on its way, and the consumer
    /// idles a round trip per batch (0.90 × the raw loop's throughput
    /// against 0.99 × at twice, BENCHMARKS.md). The budget still bounds
    /// memory: pull requests never ask for more than the free slots.
    ///
    /// Plus the room, because a parked message is pending until it is due:
    /// sized for the budget alone, `max_ack_pending` parked messages stop
    /// every new one for their whole delay (review R26,
    /// `tests/parking.rs`: 1,040 parked for 20 s held a new message back
    /// 19.9 s).
    pub(super) async fn apply_limits(&mut self) {
        self.limits_applied = true;
        let Some(limits) = self.limits else {
            return;
        };
        let for_budget = i64::try_from(limits.max_in_flight.saturating_mul(2)).unwrap_or(i64::MAX);
        let wanted = self.explicit_max_ack_pending.unwrap_or_else(|| {
            for_budget.saturating_add(i64::try_from(self.park_room).unwrap_or(i64::MAX))
        });
        self.update_max_ack_pending(wanted).await;
        // What is left for parks once the budget's deliveries and their
        // acks are counted.
        let room = usize::try_from(self.max_ack_pending.saturating_sub(for_budget)).unwrap_or(0);
        self.parked.set_room(room);
    }

    /// Sets the consumer's `max_ack_pending` to `wanted`, unless it allows
    /// more already (and was not set explicitly).
    async fn update_max_ack_pending(&mut self, wanted: i64) {
        if self.max_ack_pending >= wanted && self.explicit_max_ack_pending.is_none() {
            return;
        }
        if self.max_ack_pending == wanted {
            return;
        }
        let context = jetstream::new(self.connection.client.clone());
        let updated = async {
            let stream = context.get_stream(&self.stream).await.map_err(boxed)?;
            let info = stream.consumer_info(&self.consumer).await.map_err(boxed)?;
            let mut config: jetstream::consumer::pull::Config =
                pull_config(info.config).ok_or("a push consumer")?;
            config.max_ack_pending = wanted;
            // nats-server 2.9 updates a consumer that a create request
            // names with changed settings.
            stream
                .create_consumer::<jetstream::consumer::pull::Config>(config)
                .await
                .map_err(boxed)?;
            Ok::<(), intake_core::BoxError>(())
        }
        .await;
        match updated {
            Ok(()) => {
                tracing::info!(
                    consumer = %self.consumer,
                    from = self.max_ack_pending,
                    to = wanted,
                    "set the consumer's max_ack_pending from the budget and the room for parked messages"
                );
                self.max_ack_pending = wanted;
            }
            Err(error) => tracing::warn!(
                consumer = %self.consumer,
                %error,
                max_ack_pending = self.max_ack_pending,
                wanted,
                "could not change the consumer's max_ack_pending; the server may send less than the budget allows"
            ),
        }
    }
}

/// The pull form of a consumer's configuration (`None` for a push one).
fn pull_config(config: jetstream::consumer::Config) -> Option<jetstream::consumer::pull::Config> {
    if config.deliver_subject.is_some() {
        return None;
    }
    Some(jetstream::consumer::pull::Config {
        durable_name: config.durable_name,
        name: config.name,
        description: config.description,
        deliver_policy: config.deliver_policy,
        ack_policy: config.ack_policy,
        ack_wait: config.ack_wait,
        max_deliver: config.max_deliver,
        filter_subject: config.filter_subject,
        replay_policy: config.replay_policy,
        rate_limit: config.rate_limit,
        sample_frequency: config.sample_frequency,
        max_waiting: config.max_waiting,
        max_ack_pending: config.max_ack_pending,
        headers_only: config.headers_only,
        max_batch: config.max_batch,
        max_bytes: config.max_bytes,
        max_expires: config.max_expires,
        inactive_threshold: config.inactive_threshold,
        num_replicas: config.num_replicas,
        memory_storage: config.memory_storage,
        backoff: config.backoff,
    })
}

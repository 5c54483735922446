//! What a parking holds that its group has not handled again: the mover
//! group's lag over the retry topics and the group's over the return topics.

use super::*;

/// The clients that count the backlog: one with the mover group's id and
/// one with the group's, neither of which ever joins its group.
pub(super) struct BacklogClients {
    pub(super) mover_group: BaseConsumer,
    pub(super) group: BaseConsumer,
}

impl KafkaParking {
    /// What is parked and not handled again yet, counted on the brokers, so
    /// that a process about to stop for idleness (a drain, a batch job) can
    /// tell "nothing left" from "nothing due yet": messages wait in a retry
    /// topic, out of the source's lag, for as long as their delay.
    ///
    /// [`parked`](ParkedBacklog::parked) is the lag of the mover group
    /// (`{group}.parking`) over every retry topic of the served topics
    /// (every tier, the [drained templates](KafkaParkingBuilder::drain_topic_template)
    /// too, whichever process created them): records parked and not yet
    /// moved back, due or not, held by a mover or not (a mover that died
    /// holding them is counted until another one moved them).
    /// [`returned`](ParkedBacklog::returned) is the group's lag over the
    /// return topics: copies moved back and not yet committed by the
    /// group. A source that reads the return topics
    /// ([`KafkaSourceBuilder::parking`](crate::KafkaSourceBuilder::parking))
    /// has these in its own lag too ([`KafkaSource::lag_probe`](crate::KafkaSource::lag_probe));
    /// with a return template of `{topic}` the copies are in the served
    /// topic's lag only. A record moved back whose move the mover has not
    /// committed yet is counted in both for a moment: the count errs
    /// towards unfinished work.
    ///
    /// The runtime's threads never wait on the brokers: the count runs on
    /// Tokio's blocking pool, one listing of the cluster's topics, then
    /// per group the committed offsets and the watermarks of all partitions
    /// (one request per leader broker), all within 5 s
    /// ([`DEFAULT_LAG_TIMEOUT`]).
    /// The first count makes its two clients, which stay with the parking.
    ///
    /// # Errors
    ///
    /// [`ParkingError::Backlog`] when the brokers did not answer or refused
    /// (unknown is never "nothing parked"),
    /// [`ParkingError::BacklogTimedOut`] after the timeout.
    pub async fn backlog(&self) -> Result<ParkedBacklog, ParkingError> {
        let timeout = DEFAULT_LAG_TIMEOUT;
        let parking = self.clone();
        let started = Instant::now();
        let counted = tokio::task::spawn_blocking(move || parking.count_backlog(started, timeout));
        let failed = |source: KafkaError| ParkingError::Backlog {
            group: self.inner.group.clone(),
            brokers: self.inner.brokers.to_string(),
            source: Box::new(source),
        };
        // Every librdkafka call is bounded by what is left of the timeout;
        // this bounds the wait for a blocking pool that is busy, too.
        match tokio::time::timeout(timeout.saturating_add(Duration::from_secs(1)), counted).await {
            Err(_) => Err(ParkingError::BacklogTimedOut {
                group: self.inner.group.clone(),
                brokers: self.inner.brokers.to_string(),
                waited: timeout,
            }),
            // The task did not finish: the runtime is shutting down.
            Ok(Err(_join)) => Err(failed(KafkaError::Canceled)),
            Ok(Ok(counted)) => counted.map_err(failed),
        }
    }

    /// The blocking count of [`backlog`](Self::backlog), each call bounded
    /// by what is left of `timeout`.
    fn count_backlog(
        &self,
        started: Instant,
        timeout: Duration,
    ) -> Result<ParkedBacklog, KafkaError> {
        let inner = &*self.inner;
        let left = || {
            timeout
                .saturating_sub(started.elapsed())
                .max(Duration::from_millis(1))
        };
        let clients = self.backlog_clients()?;
        let metadata = clients.mover_group.fetch_metadata(None, left())?;
        let mut retry = TopicPartitionList::new();
        let mut returned = TopicPartitionList::new();
        for topic in metadata.topics() {
            let name = topic.name();
            let list = if inner.origin_of.contains_key(name) {
                &mut returned
            } else if inner
                .patterns
                .iter()
                .any(|pattern| pattern.tier_of(name).is_some())
            {
                &mut retry
            } else {
                continue;
            };
            if let Some(code) = topic.error() {
                return Err(KafkaError::MetadataFetch(code.into()));
            }
            for partition in topic.partitions() {
                list.add_partition(name, partition.id());
            }
        }
        let total = |counts: Vec<(String, i32, u64)>| {
            counts
                .iter()
                .fold(0u64, |sum, (_, _, messages)| sum.saturating_add(*messages))
        };
        Ok(ParkedBacklog {
            parked: total(unconsumed(&clients.mover_group, &retry, left)?),
            returned: total(unconsumed(&clients.group, &returned, left)?),
        })
    }

    /// The backlog's clients, made on the first call.
    fn backlog_clients(&self) -> Result<Arc<BacklogClients>, KafkaError> {
        let inner = &*self.inner;
        let mut made = inner
            .backlog
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        if let Some(clients) = &*made {
            return Ok(Arc::clone(clients));
        }
        let clients = Arc::new(BacklogClients {
            mover_group: group_client(&inner.settings, &mover_group(&inner.group))?,
            group: group_client(&inner.settings, &inner.group)?,
        });
        *made = Some(Arc::clone(&clients));
        Ok(clients)
    }
}

/// What a [`KafkaParking`] holds that its group has not handled again yet:
/// see [`KafkaParking::backlog`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ParkedBacklog {
    /// Records in the retry topics that the mover group has not moved
    /// back: parked, waiting for their due time or being moved.
    pub parked: u64,
    /// Copies in the return topics that the group has not committed: back,
    /// not handled yet.
    pub returned: u64,
}

impl ParkedBacklog {
    /// Both together: what is parked and not handled again yet.
    pub fn total(&self) -> u64 {
        self.parked.saturating_add(self.returned)
    }
}

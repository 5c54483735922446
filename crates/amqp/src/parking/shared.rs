//! What a parking and its relay share at work: choosing a copy's wait,
//! declaring it (renewing its lease), and publishing the copy.

use std::sync::atomic::Ordering;
use std::time::Duration;

use intake_core::publish::{Output, Publisher};
use intake_core::{BoxError, ConfigError, Headers, Message};
use tokio::time::Instant;

use crate::connection::open_within;
use crate::error::{Error, Operation, classify};
use crate::topology::Topology;

use super::tier::whole_millis;
use super::{BROKER_HEADERS, Declarer, Link, RENEW_AFTER, Shared, Tier};

impl Shared {
    /// The index of the shortest tier at least `delay` long.
    pub(super) fn tier_for(&self, delay: Duration) -> Option<usize> {
        let millis = whole_millis(delay);
        self.tiers
            .iter()
            .position(|tier| whole_millis(tier.ttl) >= millis)
    }

    /// Tier `index`, or the hop wait queue at the index after the last
    /// tier.
    pub(super) fn tier(&self, index: usize) -> Option<&Tier> {
        match self.tiers.get(index) {
            Some(tier) => Some(tier),
            None if index == self.tiers.len() => Some(&self.hop),
            None => None,
        }
    }

    /// The index of where a copy due in `delay` waits: its tier, or the hop
    /// wait queue beyond the longest.
    pub(super) fn wait_for(&self, delay: Duration) -> usize {
        self.tier_for(delay).unwrap_or(self.tiers.len())
    }

    /// Declares tier `index` unless its last declaration is recent enough
    /// (see the module docs), connecting first if need be. Bounded by the
    /// timeout for each step.
    pub(super) async fn declare(&self, index: usize) -> Result<(), Error> {
        let Some(tier) = self.tier(index) else {
            return Ok(());
        };
        let mut declarer = self.declarer.lock().await;
        let fresh = declarer
            .declared
            .get(index)
            .copied()
            .flatten()
            .is_some_and(|at| at.elapsed() < RENEW_AFTER);
        if fresh {
            return Ok(());
        }
        let started = Instant::now();
        self.declare_locked(&mut declarer, &tier.topology, &tier.wait)
            .await?;
        if let Some(slot) = declarer.declared.get_mut(index) {
            *slot = Some(started);
        }
        Ok(())
    }

    /// Declares `topology` (whose main queue is `what`) on the declaring
    /// channel.
    pub(super) async fn declare_on_declarer(
        &self,
        topology: &Topology,
        what: &str,
    ) -> Result<(), Error> {
        let mut declarer = self.declarer.lock().await;
        self.declare_locked(&mut declarer, topology, what).await
    }

    async fn declare_locked(
        &self,
        declarer: &mut Declarer,
        topology: &Topology,
        what: &str,
    ) -> Result<(), Error> {
        let url = &self.url;
        let channel = match declarer
            .link
            .as_ref()
            .filter(|link| link.channel.status().connected())
        {
            Some(link) => link.channel.clone(),
            None => {
                declarer.link = None;
                let link = self.connect().await?;
                let channel = link.channel.clone();
                declarer.link = Some(link);
                channel
            }
        };
        let declared = tokio::time::timeout(self.timeout, topology.declare_on(&channel, url))
            .await
            .unwrap_or_else(|_| {
                Err(Error::Unreachable {
                    endpoint: url.endpoint().to_owned(),
                    source: format!(
                        "the declarations of `{what}` got no answer within {:?}",
                        self.timeout
                    )
                    .into(),
                })
            });
        if declared.is_err() {
            // A refused declaration closes the channel; an unanswered one
            // leaves it in an unknown state.
            declarer.link = None;
        }
        declared
    }

    async fn connect(&self) -> Result<Link, Error> {
        let url = &self.url;
        let name = self
            .connection_name
            .as_ref()
            .map(|name| format!("{name} (parking declarations)"));
        let connection = open_within(url, name.as_deref(), &self.tls, self.connect_timeout).await?;
        let channel = tokio::time::timeout(self.timeout, connection.create_channel())
            .await
            .map_err(|_| Error::Unreachable {
                endpoint: url.endpoint().to_owned(),
                source: format!("no channel within {:?}", self.timeout).into(),
            })?
            .map_err(|error| classify(error, url.endpoint(), url.vhost(), Operation::Other))?;
        Ok(Link {
            connection,
            channel,
        })
    }

    /// Forgets that tier `index` is declared, so the next park declares it
    /// again: a publish to it failed, perhaps because it is gone.
    async fn forget(&self, index: usize) {
        if let Some(slot) = self.declarer.lock().await.declared.get_mut(index) {
            *slot = None;
        }
    }

    pub(super) async fn park_copy(
        &self,
        message: &Message,
        delay: Duration,
    ) -> Result<(), BoxError> {
        let source = message.metadata().source();
        if **source != *self.queue {
            return Err(Error::from(ConfigError::new(
                "queue",
                format!(
                    "is `{}`, and the message came from `{source}`: it would come back to the \
                     wrong queue; make a parking for each queue",
                    self.queue
                ),
            ))
            .into());
        }
        let index = self.wait_for(delay);
        self.publish_copy(message, index).await?;
        self.parked.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(
            queue = self.queue,
            wait_queue = self.tier(index).map(|tier| tier.wait.as_str()),
            ?delay,
            "message parked"
        );
        Ok(())
    }

    /// Publishes a copy of `message` (without RabbitMQ's bookkeeping
    /// headers) to the wait queue of `index`, declared first if need be,
    /// and waits for the broker's confirm.
    pub(super) async fn publish_copy(
        &self,
        message: &Message,
        index: usize,
    ) -> Result<(), BoxError> {
        let Some(tier) = self.tier(index) else {
            return Err("no such wait tier".into());
        };
        self.declare(index).await?;
        let copy = Output::forward(message, tier.wait.as_str()).with_headers(
            message
                .headers()
                .iter()
                .filter(|header| !BROKER_HEADERS.contains(&&*header.name))
                .map(|header| (header.name.clone(), header.value.clone()))
                .collect::<Headers>(),
        );
        let confirmed = async { self.publisher.send(copy).await?.await }.await;
        if let Err(error) = confirmed {
            self.forget(index).await;
            return Err(error.into());
        }
        Ok(())
    }
}

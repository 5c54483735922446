//! What the source does when its channel is lost: revoke the channel's
//! partition, pace the reconnects (a young, empty or unparsable channel
//! counts as a failed attempt), and reopen.

use futures_util::{FutureExt, StreamExt};
use intake_core::backend::{Revocation, SourceError, SourceEvent};
use tokio::time::Instant;

use crate::error::Error;

use super::session::{is_unparsable, open_session_within};
use super::{AmqpSource, Consuming, Loss, Session, State};

impl AmqpSource {
    /// The channel is gone: revoke its partition and wait to reconnect. The
    /// broker requeues its unacknowledged deliveries by itself.
    pub(super) fn lose(&mut self, loss: Loss) {
        let mut session = match std::mem::replace(&mut self.state, State::Closed) {
            State::Live(session) => session,
            other => {
                self.slot.clear();
                self.state = other;
                return;
            }
        };
        // What lapin still buffers of the lost channel is back in the queue
        // already; it only tells how far the channel got.
        if let Consuming::Started(consumer) = &mut session.consumer {
            while let Some(Some(Ok(delivery))) = consumer.next().now_or_never() {
                session.last_tag = session.last_tag.max(delivery.delivery_tag);
            }
        }
        let settled = self
            .slot
            .settled_through(session.epoch, session.last_tag)
            .unwrap_or(0);
        self.slot.clear();
        self.counters.channel_lost();
        // A channel lost otherwise before it was past an unreadable
        // delivery's companions leaves the rest of that care to the next.
        self.quarantine = session.quarantine.filter(|left| *left > 0);
        let endpoint = self.settings.url.endpoint();
        let (queue, epoch) = (&session.queue, session.epoch);
        if let Loss::Error(error) = &loss
            && is_unparsable(error)
        {
            let retry_at = self.poisoned(&session, settled, error);
            self.down(retry_at, &session);
            return;
        }
        match &loss {
            Loss::Error(error) => tracing::warn!(
                endpoint, queue, epoch, %error,
                "AMQP channel lost; the broker requeues its unacknowledged deliveries; reconnecting"
            ),
            Loss::Cancelled => tracing::warn!(
                endpoint,
                queue,
                epoch,
                "AMQP consumer cancelled by the broker (queue deleted?); reconnecting"
            ),
            Loss::Closed => tracing::warn!(
                endpoint,
                queue,
                epoch,
                "AMQP channel closed; the broker requeues its unacknowledged deliveries; reconnecting"
            ),
        }
        let retry_at =
            if session.delivered || session.opened_at.elapsed() >= self.settings.connect_timeout {
                self.fresh_start()
            } else {
                self.short_lived(&session, &loss)
            };
        self.down(retry_at, &session);
    }

    /// Waits to reconnect, and tells the runtime that `session`'s channel
    /// is revoked.
    fn down(&mut self, retry_at: Instant, session: &Session) {
        let (revocation, drained) = Revocation::new(vec![self.partition(session.epoch)]);
        self.state = State::Down {
            retry_at,
            drained: Some(Box::pin(drained.wait())),
        };
        self.pending.push_back(SourceEvent::Revoked(revocation));
    }

    /// The session was lost before it delivered anything and before it
    /// lasted a connect timeout: a broker (or a proxy, a load balancer) that
    /// lets consumers start and drops them at once must not be reconnected
    /// to in a tight loop, so this counts as a failed attempt.
    fn short_lived(&mut self, session: &Session, loss: &Loss) -> Instant {
        self.failures = self.failures.saturating_add(1);
        match self.settings.reconnect.delay(self.failures) {
            Some(delay) => {
                tracing::warn!(
                    endpoint = self.settings.url.endpoint(),
                    queue = session.queue,
                    attempt = self.failures,
                    lasted = ?session.opened_at.elapsed(),
                    retry_in = ?delay,
                    "AMQP channel lost before it delivered anything; reconnecting after the backoff"
                );
                Instant::now() + delay
            }
            None => {
                self.failures = 0;
                let reason = match loss {
                    Loss::Error(error) => format!("every new channel was lost at once: {error}"),
                    Loss::Cancelled => "every new consumer was cancelled at once".to_owned(),
                    Loss::Closed => "every new channel was closed at once".to_owned(),
                };
                self.failure = Some(Error::Unreachable {
                    endpoint: self.settings.url.endpoint().to_owned(),
                    source: reason.into(),
                });
                Instant::now()
            }
        }
    }

    /// A session that ended for a reason of its own (the broker closed it,
    /// the network dropped) was healthy: reconnect at once.
    fn fresh_start(&mut self) -> Instant {
        self.failures = 0;
        Instant::now()
    }

    /// The channel died on a delivery lapin could not parse. The broker
    /// puts that delivery back and sends it first thing on the next channel,
    /// so the session counts as a failed attempt: the backoff grows with
    /// every such loss, and when the policy gives up the runtime is told.
    ///
    /// The broker also returns every delivery the channel held unsettled,
    /// and the ones prefetched behind the poison were never seen; a quorum
    /// queue counts each return against its delivery limit, so they would
    /// be dead-lettered with it. The next channel therefore takes those
    /// deliveries one at a time (prefetch 1), so that at most the poison is
    /// in flight when lapin closes the connection again.
    fn poisoned(&mut self, session: &Session, settled: u64, error: &lapin::Error) -> Instant {
        self.failures = self.failures.saturating_add(1);
        self.counters.unparsable();
        let tag = session.last_tag.saturating_add(1);
        let unsettled = tag.saturating_sub(settled);
        self.quarantine = Some(unsettled.min(u64::from(session.prefetch)));
        let delay = self.settings.reconnect.delay(self.failures);
        tracing::error!(
            endpoint = self.settings.url.endpoint(),
            queue = session.queue,
            epoch = session.epoch,
            tag,
            failures = self.failures,
            retry_in = ?delay,
            %error,
            "AMQP delivery could not be parsed (a header name, message id or routing key that is not UTF-8, \
             or another malformed field): lapin closes the connection on it, and the broker redelivers it \
             on every reconnect; move it out of the queue (it is at or near the head), or give the queue \
             a delivery limit and a dead-letter exchange"
        );
        match delay {
            Some(delay) => Instant::now() + delay,
            None => {
                // The runtime decides under its own reconnect backoff; the
                // next call starts a new series of attempts.
                self.failures = 0;
                self.failure = Some(Error::Unparsable {
                    endpoint: self.settings.url.endpoint().to_owned(),
                    queue: session.queue.clone(),
                    epoch: session.epoch,
                    tag,
                    source: Box::new(error.clone()),
                });
                Instant::now()
            }
        }
    }

    /// One reconnect attempt, after the lost channel's revocation completed
    /// and after the backoff. Cancel-safe: the wait, the backoff deadline
    /// and the failure count live in `self`.
    ///
    /// The broker redelivers the lost channel's messages on the next
    /// channel at once, while the runtime may still run handlers of the lost
    /// one. Waiting for the revocation keeps two copies of one message from
    /// running at the same time in this consumer: the runtime completes it
    /// once those handlers finished or were cancelled at its
    /// `revoke_timeout` (their acknowledgements fail at once, the channel
    /// being gone), and a dropped revocation ends the wait too.
    pub(super) async fn reconnect(&mut self) -> Result<(), SourceError> {
        let State::Down { retry_at, drained } = &mut self.state else {
            return Ok(());
        };
        if let Some(wait) = drained {
            let _outcome = wait.as_mut().await;
            *drained = None;
        }
        tokio::time::sleep_until(*retry_at).await;
        let epoch = self.next_epoch;
        let prefetch = Some(self.prefetch.count());
        match open_session_within(&self.settings, epoch, self.quarantine, prefetch).await {
            Ok(session) => {
                self.next_epoch = epoch.wrapping_add(1).max(1);
                self.slot.install(epoch, session.channel.clone());
                self.counters.reconnected();
                self.reachability.reachable();
                tracing::info!(
                    endpoint = self.settings.url.endpoint(),
                    queue = session.queue,
                    epoch,
                    "AMQP consumer reconnected"
                );
                self.pending
                    .push_back(SourceEvent::Assigned(vec![self.partition(epoch)]));
                self.quarantine = None;
                self.state = State::Live(Box::new(session));
                Ok(())
            }
            Err(error) => {
                self.counters.reconnect_failed();
                self.reachability.unreachable();
                self.failures = self.failures.saturating_add(1);
                let delay = if error.is_transient() {
                    self.settings.reconnect.delay(self.failures)
                } else {
                    None
                };
                match delay {
                    Some(delay) => {
                        tracing::warn!(
                            endpoint = self.settings.url.endpoint(),
                            attempt = self.failures,
                            retry_in = ?delay,
                            %error,
                            "AMQP reconnect failed"
                        );
                        self.state = State::Down {
                            retry_at: Instant::now() + delay,
                            drained: None,
                        };
                        Ok(())
                    }
                    None => {
                        // Give the runtime the error; the next call starts
                        // a fresh series of attempts.
                        self.failures = 0;
                        self.state = State::Down {
                            retry_at: Instant::now(),
                            drained: None,
                        };
                        Err(error.into())
                    }
                }
            }
        }
    }
}

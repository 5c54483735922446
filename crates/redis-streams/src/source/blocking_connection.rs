//! The source's reading connection: one of its own (see
//! [`connection`](crate::connection)), reopened with the configured
//! [`BackoffPolicy`] when it is lost.
//!
//! # Closing the old connection on the server first
//!
//! A connection is given up when it failed or when a call was dropped
//! during a blocking read. The server may not have noticed yet: its
//! `XREADGROUP … BLOCK` can still be waiting, and an entry added now would
//! be served to the dead connection (entering this consumer's pending list)
//! *after* the new connection's re-read of that list found nothing. So the
//! new connection first kills the old one by id (`CLIENT KILL ID`), which the
//! server does at once; whatever the old read took is in the pending list
//! before the re-read runs. Without permission for `CLIENT`, such an entry
//! is still not lost: it is claimed after `claim_min_idle`.

use std::sync::Arc;
use std::time::Duration;

use intake_core::backend::Reachability;
use intake_core::{BackoffPolicy, Disabled};
use redis::aio::MultiplexedConnection;

use crate::connection::Connector;
use crate::counters::RedisCounters;
use crate::error::Error;

pub(crate) struct BlockingConnection {
    connector: Connector,
    block: Duration,
    policy: Arc<dyn BackoffPolicy>,
    connection: Option<MultiplexedConnection>,
    /// The server's id of `connection` (`CLIENT ID`), if the user may ask.
    client_id: Option<i64>,
    /// The id of a connection given up but perhaps still open on the server.
    abandoned: Option<i64>,
    /// A call of the source is under way (or was dropped midway).
    in_call: bool,
    /// Consecutive failures, for the backoff; reset by a command that worked.
    failures: u32,
    /// Marked while the server cannot be reached, for readiness.
    reachability: Reachability,
    counters: Arc<RedisCounters>,
}

impl BlockingConnection {
    pub(crate) async fn new(
        connector: Connector,
        block: Duration,
        policy: Arc<dyn BackoffPolicy>,
        mut connection: MultiplexedConnection,
        counters: Arc<RedisCounters>,
    ) -> Self {
        let client_id = client_id(&mut connection).await;
        Self {
            connector,
            block,
            policy,
            connection: Some(connection),
            client_id,
            abandoned: None,
            in_call: false,
            failures: 0,
            reachability: Reachability::new(),
            counters,
        }
    }

    pub(crate) fn connector(&self) -> &Connector {
        &self.connector
    }

    /// Whether the server answers: unreachable from the first failed
    /// attempt in a row until a command works again.
    pub(crate) fn reachability(&self) -> &Reachability {
        &self.reachability
    }

    /// The connection, reopened first if it was lost. The flag says whether
    /// it was reopened: what was in flight on the old one is unknown then.
    pub(crate) async fn get(&mut self) -> Result<(&mut MultiplexedConnection, bool), Error> {
        let (connection, reopened) = match self.connection.take() {
            Some(connection) => (connection, false),
            None => (self.reopen().await?, true),
        };
        Ok((self.connection.insert(connection), reopened))
    }

    async fn reopen(&mut self) -> Result<MultiplexedConnection, Error> {
        loop {
            match self.connector.blocking_reader(self.block).await {
                Ok(mut connection) => {
                    if let Some(old) = self.abandoned {
                        let killed: Result<i64, _> = redis::cmd("CLIENT")
                            .arg("KILL")
                            .arg("ID")
                            .arg(old)
                            .query_async(&mut connection)
                            .await;
                        match killed {
                            Ok(_) => self.abandoned = None,
                            // Already gone: the server closed it first.
                            Err(error)
                                if error.kind()
                                    == redis::ErrorKind::Server(
                                        redis::ServerErrorKind::ResponseError,
                                    ) =>
                            {
                                self.abandoned = None;
                            }
                            Err(error) if error.code() == Some("NOPERM") => {
                                tracing::debug!(
                                    "CLIENT KILL is not permitted; an entry read by the old connection may wait for a claim"
                                );
                                self.abandoned = None;
                            }
                            Err(error) => {
                                let error = self.connector.error(error, "CLIENT KILL");
                                if error.is_transient() {
                                    self.back_off(error).await?;
                                    continue;
                                }
                                return Err(error);
                            }
                        }
                    }
                    self.client_id = client_id(&mut connection).await;
                    if self.failures > 0 {
                        tracing::info!(
                            endpoint = %self.connector.endpoint(),
                            attempts = self.failures,
                            "reconnected to Redis"
                        );
                    }
                    return Ok(connection);
                }
                Err(error) if error.is_transient() => self.back_off(error).await?,
                Err(error) => return Err(error),
            }
        }
    }

    /// Marks the start of a call of the source. Returns whether the previous
    /// call was dropped midway: its connection is then given up, since a
    /// blocking read may still hold it, and what that read took may be in
    /// the pending list without having reached the source.
    pub(crate) fn begin_call(&mut self) -> bool {
        let interrupted = std::mem::replace(&mut self.in_call, true);
        if interrupted {
            self.drop_connection();
        }
        interrupted
    }

    /// Marks the end of a call that was not dropped.
    pub(crate) fn end_call(&mut self) {
        self.in_call = false;
    }

    /// Forgets the connection: it failed, or a command on it was abandoned
    /// midway and its state is unknown.
    pub(crate) fn drop_connection(&mut self) {
        if self.connection.take().is_some()
            && let Some(id) = self.client_id.take()
        {
            self.abandoned = Some(id);
        }
    }

    /// Waits as the policy says after a transient failure, or gives the
    /// error back when the policy gives up.
    pub(crate) async fn back_off(&mut self, error: Error) -> Result<(), Error> {
        self.failures = self.failures.saturating_add(1);
        self.reachability.unreachable();
        if self.policy.is_disabled() {
            return Err(error);
        }
        let Some(delay) = self.policy.delay(self.failures) else {
            return Err(error);
        };
        self.counters.add_retries(1);
        tracing::warn!(
            %error,
            attempt = self.failures,
            ?delay,
            "Redis is unavailable; retrying"
        );
        tokio::time::sleep(delay).await;
        Ok(())
    }

    /// Makes every later failure final: no reconnect policy, no wait. For
    /// the last steps of a source that is closing.
    pub(crate) fn stop_retrying(&mut self) {
        self.policy = Arc::new(Disabled);
    }

    /// Records that a command worked.
    pub(crate) fn succeeded(&mut self) {
        self.failures = 0;
        self.reachability.reachable();
    }
}

/// The server's id of `connection`, or `None` when the user may not ask.
async fn client_id(connection: &mut MultiplexedConnection) -> Option<i64> {
    match redis::cmd("CLIENT").arg("ID").query_async(connection).await {
        Ok(id) => Some(id),
        Err(error) => {
            tracing::debug!(%error, "CLIENT ID is not available");
            None
        }
    }
}

//! The source's reading connection: one of its own (see
//! [`connection`](crate::connection)), reopened with the configured
//! [`BackoffPolicy`] when it is lost.

use std::time::Duration;

use intake_core::{Backoff, BackoffPolicy};
use redis::aio::MultiplexedConnection;

use crate::connection::Connector;
use crate::error::RedisStreamsError;

pub(crate) struct BlockingConnection {
    connector: Connector,
    block: Duration,
    policy: Backoff,
    connection: Option<MultiplexedConnection>,
    /// Consecutive failures, for the backoff; reset by a command that worked.
    failures: u32,
}

impl BlockingConnection {
    pub(crate) fn new(
        connector: Connector,
        block: Duration,
        policy: Backoff,
        connection: MultiplexedConnection,
    ) -> Self {
        Self {
            connector,
            block,
            policy,
            connection: Some(connection),
            failures: 0,
        }
    }

    pub(crate) fn connector(&self) -> &Connector {
        &self.connector
    }

    /// The connection, reopened first if it was lost. The flag says whether
    /// it was reopened: what was in flight on the old one is unknown then.
    pub(crate) async fn get(
        &mut self,
    ) -> Result<(&mut MultiplexedConnection, bool), RedisStreamsError> {
        let (connection, reopened) = match self.connection.take() {
            Some(connection) => (connection, false),
            None => (self.reopen().await?, true),
        };
        Ok((self.connection.insert(connection), reopened))
    }

    async fn reopen(&mut self) -> Result<MultiplexedConnection, RedisStreamsError> {
        loop {
            match self.connector.blocking_reader(self.block).await {
                Ok(connection) => {
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

    /// Forgets the connection: it failed, or a command on it was abandoned
    /// midway and its state is unknown.
    pub(crate) fn drop_connection(&mut self) {
        self.connection = None;
    }

    /// Waits as the policy says after a transient failure, or gives the
    /// error back when the policy gives up.
    pub(crate) async fn back_off(
        &mut self,
        error: RedisStreamsError,
    ) -> Result<(), RedisStreamsError> {
        self.failures = self.failures.saturating_add(1);
        if self.policy.is_disabled() {
            return Err(error);
        }
        let Some(delay) = self.policy.delay(self.failures) else {
            return Err(error);
        };
        tracing::warn!(
            %error,
            attempt = self.failures,
            ?delay,
            "Redis is unavailable; retrying"
        );
        tokio::time::sleep(delay).await;
        Ok(())
    }

    /// Records that a command worked.
    pub(crate) fn succeeded(&mut self) {
        self.failures = 0;
    }
}

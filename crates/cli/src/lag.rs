//! `intake lag`: a group's broker-side lag through each backend's
//! [`LagProbe`], and what it parked beside it ([`LagProbe::parked`]): a
//! parked message is acknowledged, so broker lag never counts it.

use std::time::Duration;

use intake_core::lag::{LagError, LagProbe, ParkedTier, PartitionLag};
use intake_nats::async_nats;

use crate::broker::{Broker, NatsCredentials, nats_addresses};
use crate::failure::Failure;

/// A group's lag: per partition, and its parked backlog where the backend
/// counts it.
pub struct Lag {
    /// Per partition, as the broker reports it.
    pub partitions: Vec<PartitionLag>,
    /// Messages parked and not back yet; `None` where the backend cannot
    /// count them.
    pub parked: Option<u64>,
    /// The same per delay tier (empty where the backend cannot count them).
    pub parked_tiers: Vec<ParkedTier>,
}

/// Both answers of `probe`.
async fn ask(probe: &impl LagProbe) -> Result<Lag, LagError> {
    let partitions = probe.lag().await?;
    // One query: the tiers, and their sum as the total.
    let tiers = probe.parked_tiers().await?;
    let parked = tiers.as_deref().map(ParkedTier::total);
    Ok(Lag {
        partitions,
        parked,
        parked_tiers: tiers.unwrap_or_default(),
    })
}

/// Asks `broker` for `group`'s lag on `source`, every wait bounded by
/// `timeout` (connecting included).
///
/// For RabbitMQ the queue is `source` and `group` names nothing (every
/// consumer of a queue shares it); for NATS `group` is the durable
/// consumer of stream `source`.
pub async fn query(
    broker: &Broker,
    source: &str,
    group: &str,
    timeout: Duration,
) -> Result<Lag, Failure> {
    let what = format!("lag of group {group} on {source}");
    let usage = |error: &dyn std::fmt::Display| Failure::Usage(format!("--broker: {error}"));
    let answer = match broker {
        Broker::Kafka { bootstrap, .. } => {
            let settings = broker
                .kafka_settings()
                .unwrap_or_else(|| intake_kafka::KafkaSettings::new(bootstrap.as_str()));
            // The broker value's probe: the return topic's lag counts, and
            // the retry topics' records are the parked backlog.
            let broker = intake_kafka::KafkaBroker::new(settings);
            let address = intake_core::backend::RouteAddress::new(source, group);
            let probe = intake_core::backend::Broker::lag_probe(&broker, &address)
                .await
                .map_err(|error| usage(&error))?
                .timeout(timeout);
            ask(&probe).await
        }
        Broker::Redis { url } => {
            let probe = intake_redis_streams::RedisLagProbe::new(url, group, [source])
                .map_err(|error| usage(&error))?
                .timeout(timeout);
            ask(&probe).await
        }
        Broker::Amqp { url } => {
            // The broker value's probe counts the parking's wait queues
            // (at the default tiers) as the parked backlog.
            let broker = intake_amqp::AmqpBroker::from_url(url).map_err(|error| usage(&error))?;
            let address = intake_core::backend::RouteAddress::new(source, group);
            let probe = intake_core::backend::Broker::lag_probe(&broker, &address)
                .await
                .map_err(|error| usage(&error))?
                .timeout(timeout);
            ask(&probe).await
        }
        Broker::Nats { url } => {
            let client = connect_nats(url, &broker.endpoint(), timeout, &what).await?;
            let probe = intake_nats::NatsLagProbe::new(client, &broker.endpoint(), source, group)
                .timeout(timeout);
            ask(&probe).await
        }
    };
    let lag = answer.map_err(|error| match error {
        LagError::TimedOut(after) => Failure::TimedOut {
            what: what.clone(),
            after,
        },
        error => Failure::from_client(&what, error.is_transient(), error),
    })?;
    if lag.partitions.is_empty() {
        // Kafka answers an unknown topic with no partitions: "no lag" would
        // be a lie a script could act on.
        return Err(Failure::NotFound(format!(
            "{what}: the broker knows no partition of {source}"
        )));
    }
    Ok(lag)
}

/// A client of the NATS server at `url`: credentials from the URL, one
/// attempt bounded by `timeout`, no reconnecting (a command that waits
/// for a server that is down should say so, not retry forever).
pub async fn connect_nats(
    url: &str,
    endpoint: &str,
    timeout: Duration,
    what: &str,
) -> Result<async_nats::Client, Failure> {
    let (addresses, credentials) = nats_addresses(url)?;
    let mut options = async_nats::ConnectOptions::new()
        .connection_timeout(timeout)
        .request_timeout(Some(timeout))
        .max_reconnects(Some(1))
        .ignore_discovered_servers()
        .name("intake cli");
    match credentials {
        Some(NatsCredentials::Token(token)) => options = options.token(token),
        Some(NatsCredentials::UserPassword(user, password)) => {
            options = options.user_and_password(user, password);
        }
        None => {}
    }
    if url.starts_with("tls://") {
        options = options.require_tls(true);
    }
    let servers: Vec<async_nats::ServerAddr> = addresses
        .iter()
        .map(|address| {
            address
                .parse()
                .map_err(|error| Failure::Usage(format!("--broker {endpoint}: {error}")))
        })
        .collect::<Result<_, _>>()?;
    // connection_timeout bounds each TCP and TLS handshake; this bounds the
    // whole attempt, the server's INFO and CONNECT included.
    match tokio::time::timeout(timeout, options.connect(servers)).await {
        Err(_) => Err(Failure::TimedOut {
            what: what.to_owned(),
            after: timeout,
        }),
        Ok(Err(error)) => Err(connect_failure(
            &format!("{what} (connecting to {endpoint})"),
            error,
        )),
        Ok(Ok(client)) => Ok(client),
    }
}

/// A failed NATS connect: refused for credentials the server rejects
/// (waiting will not fix them), unavailable otherwise.
fn connect_failure(what: &str, error: async_nats::ConnectError) -> Failure {
    if error.kind() == async_nats::ConnectErrorKind::AuthorizationViolation {
        Failure::Refused {
            what: what.to_owned(),
            source: Box::new(error),
        }
    } else {
        Failure::Unavailable {
            what: what.to_owned(),
            source: Box::new(error),
        }
    }
}

#[cfg(test)]
mod tests {
    use async_nats::{ConnectError, ConnectErrorKind};

    use super::*;

    #[test]
    fn rejected_credentials_exit_3_and_an_absent_server_1() {
        let rejected = ConnectError::from(ConnectErrorKind::AuthorizationViolation);
        assert_eq!(connect_failure("lag", rejected).exit_code(), 3);
        let absent = ConnectError::from(ConnectErrorKind::Io);
        assert_eq!(connect_failure("lag", absent).exit_code(), 1);
    }
}

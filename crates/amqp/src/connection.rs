//! Opening a connection: one place that applies the timeout, the connection
//! name and the error classification.

use std::time::Duration;

use lapin::types::LongString;
use lapin::{Connection, ConnectionProperties};

use crate::error::{Error, Operation, classify};
use crate::tls::Tls;
use crate::url::AmqpUrl;

/// How long a connection attempt may take unless a builder says otherwise.
pub(crate) const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Connects to `url` within [`DEFAULT_CONNECT_TIMEOUT`].
pub(crate) async fn open(
    url: &AmqpUrl,
    name: Option<&str>,
    tls: &Tls,
) -> Result<Connection, Error> {
    open_within(url, name, tls, DEFAULT_CONNECT_TIMEOUT).await
}

/// Connects to `url`, naming the connection `name` (shown by
/// `rabbitmqctl list_connections client_properties` and the management UI).
pub(crate) async fn open_within(
    url: &AmqpUrl,
    name: Option<&str>,
    tls: &Tls,
    timeout: Duration,
) -> Result<Connection, Error> {
    let mut properties = ConnectionProperties::default();
    if let Some(name) = name {
        properties = properties.with_connection_name(LongString::from(name));
    }
    let connecting = async {
        if tls.is_set() {
            let runtime = lapin::runtime::default_runtime()?;
            Connection::connect_uri_with_config(
                url.uri().clone(),
                properties,
                tls.to_lapin(),
                runtime,
            )
            .await
        } else {
            Connection::connect_uri(url.uri().clone(), properties).await
        }
    };
    match tokio::time::timeout(timeout, connecting).await {
        Ok(Ok(connection)) => Ok(connection),
        Ok(Err(error)) => Err(classify(
            error,
            url.endpoint(),
            url.vhost(),
            Operation::Connect,
        )),
        Err(_elapsed) => Err(Error::Unreachable {
            endpoint: url.endpoint().to_owned(),
            source: format!("no answer within {timeout:?}").into(),
        }),
    }
}

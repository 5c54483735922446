//! `--broker URL` as the broker examples take it (`ledger`, `service`):
//! which broker a URL names, with the address in the form its client wants.
//!
//! Included with `#[path = "support/broker_url.rs"] mod broker_url;` by the
//! examples that take a broker URL.

/// Which broker a URL names, with the address in the form its client wants.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Broker {
    /// Kafka bootstrap servers, `HOST:PORT`.
    Kafka { bootstrap: String },
    /// The Redis URL as given.
    Redis { url: String },
    /// The AMQP URL, with an empty vhost spelled out as `%2f`.
    Amqp { url: String },
    /// The NATS URL as given.
    Nats { url: String },
}

impl Broker {
    /// `kafka://HOST:PORT`, `redis://…`, `amqp://…` or `nats://…`; the
    /// error says what is wrong with `url`.
    pub fn parse(url: &str) -> Result<Self, String> {
        if let Some(bootstrap) = url.strip_prefix("kafka://") {
            let bootstrap = bootstrap.trim_end_matches('/');
            if bootstrap.is_empty() {
                return Err("--broker kafka:// needs HOST:PORT".to_owned());
            }
            Ok(Broker::Kafka {
                bootstrap: bootstrap.to_owned(),
            })
        } else if url.starts_with("redis://") || url.starts_with("rediss://") {
            Ok(Broker::Redis {
                url: url.to_owned(),
            })
        } else if url.starts_with("amqp://") || url.starts_with("amqps://") {
            // lapin reads an empty path as the vhost "", which RabbitMQ does
            // not have; the interface promises that empty means "/".
            let authority_start = url.find("://").map_or(0, |at| at + 3);
            let authority_end = url[authority_start..]
                .find('/')
                .map(|at| at + authority_start);
            let url = match authority_end {
                None => format!("{url}/%2f"),
                Some(slash) if url[slash + 1..].is_empty() => format!("{url}%2f"),
                Some(_) => url.to_owned(),
            };
            Ok(Broker::Amqp { url })
        } else if url.starts_with("nats://") || url.starts_with("tls://") {
            Ok(Broker::Nats {
                url: url.to_owned(),
            })
        } else {
            Err("--broker must start with kafka://, redis://, amqp:// or nats://".to_owned())
        }
    }

    /// The URL without credentials, for logs.
    pub fn endpoint(&self) -> String {
        let strip = |url: &str| match (url.find("://"), url.rfind('@')) {
            (Some(scheme), Some(at)) if at > scheme => {
                format!("{}{}", &url[..scheme + 3], &url[at + 1..])
            }
            _ => url.to_owned(),
        };
        match self {
            Broker::Kafka { bootstrap } => format!("kafka://{bootstrap}"),
            Broker::Redis { url } | Broker::Amqp { url } | Broker::Nats { url } => strip(url),
        }
    }
}

//! Broker addresses: `amqp://` and `amqps://` URLs whose credentials never
//! reach a log line, an error message or a `Debug` print.

use std::fmt;
use std::str::FromStr;

use lapin::uri::{AMQPScheme, AMQPUri};

use crate::error::AmqpError;

/// A parsed `amqp://user:password@host:port/vhost` (or `amqps://`) URL.
///
/// `Display` and `Debug` print the endpoint without the password
/// (`amqp://guest@127.0.0.1:5672/%2f`), so the URL can be logged and carried in
/// errors safely.
///
/// ```
/// use intake_amqp::AmqpUrl;
///
/// let url: AmqpUrl = "amqp://app:s3cret@127.0.0.1:5672/%2f".parse()?;
/// assert_eq!(url.to_string(), "amqp://app@127.0.0.1:5672/%2f");
/// assert!(!format!("{url:?}").contains("s3cret"));
/// # Ok::<(), intake_amqp::AmqpError>(())
/// ```
#[derive(Clone)]
pub struct AmqpUrl {
    uri: AMQPUri,
    endpoint: String,
}

impl AmqpUrl {
    /// Parses `url`. The error never repeats the URL, which may hold a
    /// password.
    pub fn parse(url: &str) -> Result<Self, AmqpError> {
        let invalid = |reason: String| AmqpError::InvalidUrl {
            reason: reason.replace(url, "<the URL>"),
        };
        let scheme_end = url.find("://").ok_or_else(|| {
            invalid("expected `amqp://user:password@host:port/vhost` or `amqps://…`".into())
        })?;
        // lapin's parser reads a bracketed IPv6 host as "localhost": refuse it
        // rather than connect somewhere the user did not ask for.
        let after_scheme = &url[scheme_end + 3..];
        let authority = after_scheme.split(['/', '?']).next().unwrap_or_default();
        let host = authority.rsplit('@').next().unwrap_or_default();
        if host.starts_with('[') {
            return Err(invalid(
                "IPv6 address literals are not supported; use a host name that resolves to it"
                    .into(),
            ));
        }
        let uri = AMQPUri::from_str(url).map_err(invalid)?;
        let endpoint = format!(
            "{}://{}@{}:{}/{}",
            match uri.scheme {
                AMQPScheme::AMQP => "amqp",
                AMQPScheme::AMQPS => "amqps",
            },
            uri.authority.userinfo.username,
            uri.authority.host,
            uri.authority.port,
            encode_vhost(&uri.vhost),
        );
        Ok(Self { uri, endpoint })
    }

    /// The endpoint without the password: `amqp://user@host:port/vhost`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The virtual host.
    pub fn vhost(&self) -> &str {
        &self.uri.vhost
    }

    /// Whether the connection uses TLS (`amqps://`).
    pub fn is_tls(&self) -> bool {
        self.uri.scheme == AMQPScheme::AMQPS
    }

    pub(crate) fn uri(&self) -> &AMQPUri {
        &self.uri
    }
}

/// The vhost as it appears in a URL path: `/` is `%2f`.
fn encode_vhost(vhost: &str) -> String {
    let mut encoded = String::with_capacity(vhost.len());
    for byte in vhost.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            encoded.push(byte as char);
        } else {
            encoded.push_str(&format!("%{byte:02x}"));
        }
    }
    encoded
}

impl FromStr for AmqpUrl {
    type Err = AmqpError;

    fn from_str(url: &str) -> Result<Self, Self::Err> {
        Self::parse(url)
    }
}

impl fmt::Display for AmqpUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.endpoint)
    }
}

impl fmt::Debug for AmqpUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("AmqpUrl").field(&self.endpoint).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_password_appears_in_no_printed_form() {
        let url = AmqpUrl::parse("amqps://app:hunter2@broker.example:5671/orders").unwrap();
        assert_eq!(url.endpoint(), "amqps://app@broker.example:5671/orders");
        assert!(!url.to_string().contains("hunter2"));
        assert!(!format!("{url:?}").contains("hunter2"));
        assert!(url.is_tls());
    }

    #[test]
    fn the_default_vhost_is_printed_encoded() {
        let url = AmqpUrl::parse("amqp://guest:guest@127.0.0.1:5672/%2f").unwrap();
        assert_eq!(url.endpoint(), "amqp://guest@127.0.0.1:5672/%2f");
        assert_eq!(url.vhost(), "/");
    }

    #[test]
    fn a_rejected_url_is_not_repeated_in_the_error() {
        let error = AmqpUrl::parse("kafka://user:hunter2@host").unwrap_err();
        assert!(matches!(error, AmqpError::InvalidUrl { .. }));
        assert!(!error.to_string().contains("hunter2"));
        let error = AmqpUrl::parse("user:hunter2@host").unwrap_err();
        assert!(!error.to_string().contains("hunter2"));
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2_000))]

        #[test]
        fn any_url_is_parsed_or_refused_and_no_printed_form_shows_the_password(
            url in proptest::prop_oneof![
                ".{0,60}",
                "(amqp|amqps)://[a-z]{1,4}:[a-z0-9%]{0,6}<SECRET>@[a-z]{1,8}(:[0-9]{1,5})?\
                 (/[a-z0-9%]{0,6})?",
                "(amqp|amqps|http|)://([a-z%]{0,4}(:[a-z0-9%/@?#:]{0,6}<SECRET>)?@)?\
                 [a-z0-9.\\[\\]:%]{0,16}(:[0-9]{0,6})?(/[a-z0-9%]{0,6})?(\\?[a-z_=&0-9]{0,20})?",
            ],
        ) {
            match AmqpUrl::parse(&url) {
                Ok(parsed) => {
                    proptest::prop_assert!(!parsed.to_string().contains("<SECRET>"));
                    let shown = format!("{parsed:?}");
                    proptest::prop_assert!(!shown.contains("<SECRET>"), "{}", shown);
                }
                Err(AmqpError::InvalidUrl { reason }) => {
                    proptest::prop_assert!(!reason.contains("<SECRET>"), "{}", reason);
                }
                Err(other) => proptest::prop_assert!(false, "unexpected error {other:?}"),
            }
        }
    }

    #[test]
    fn an_ipv6_literal_is_refused_rather_than_read_as_localhost() {
        let error = AmqpUrl::parse("amqp://guest:guest@[::1]:5672/%2f").unwrap_err();
        assert!(error.to_string().contains("IPv6"));
    }
}

//! Broker addresses: `amqp://` and `amqps://` URLs whose credentials never
//! reach a log line, an error message or a `Debug` print.

use std::fmt;
use std::str::FromStr;

use intake_core::redact;
use lapin::uri::{AMQPScheme, AMQPUri};

use crate::error::Error;

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
/// # Ok::<(), intake_amqp::Error>(())
/// ```
#[derive(Clone)]
pub struct AmqpUrl {
    uri: AMQPUri,
    endpoint: String,
}

impl AmqpUrl {
    /// Parses `url`. The error shows the URL only
    /// [redacted](intake_core::redact::url).
    ///
    /// A URL whose password holds an unescaped `/`, `?` or `#` is refused:
    /// `amqp://app:123/x@broker` would otherwise connect to host `app`,
    /// port 123, vhost `x@broker`.
    pub fn parse(url: &str) -> Result<Self, Error> {
        let invalid = |reason: String| Error::InvalidUrl {
            reason: reason.replace(url, &redact::url(url)),
        };
        let scheme_end = url.find("://").ok_or_else(|| {
            invalid("expected `amqp://user:password@host:port/vhost` or `amqps://…`".into())
        })?;
        redact::check_user_info(url)
            .map_err(|error| invalid(format!("{} {error}", redact::url(url))))?;
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
        // Built from the parsed parts (no password among them), and still
        // shown through the redaction: a user name decoded from `%3A` and
        // `%40` would otherwise print like user info.
        let endpoint = redact::url(&format!(
            "{}://{}@{}:{}/{}",
            match uri.scheme {
                AMQPScheme::AMQP => "amqp",
                AMQPScheme::AMQPS => "amqps",
            },
            uri.authority.userinfo.username,
            uri.authority.host,
            uri.authority.port,
            encode_vhost(&uri.vhost),
        ));
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
    type Err = Error;

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
        assert!(matches!(error, Error::InvalidUrl { .. }));
        assert!(!error.to_string().contains("hunter2"));
        let error = AmqpUrl::parse("user:hunter2@host").unwrap_err();
        assert!(!error.to_string().contains("hunter2"));
    }

    /// A secret: random characters, any a password may hold (those that end
    /// a URL's parts unescaped among them), around the canary `SECRET`.
    /// Nothing else in the generated URLs is upper case, so `SECRET`
    /// anywhere in a printed form is a leak, escaped or not.
    fn secret() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let around = "[a-zA-Z0-9/?#@:%!$&'()*+,;=._~\\[\\] -]{0,8}";
        prop_oneof![
            (around, around).prop_map(|(before, after)| format!("{before}SECRET{after}")),
            // A password of digits then `/` reads as a port and a vhost.
            ("[0-9]{0,5}", "[/?#]", around)
                .prop_map(|(digits, end, after)| format!("{digits}{end}SECRET{after}")),
        ]
    }

    /// AMQP URLs, valid or not, with a secret as the password of the user
    /// info (also with one or no slash after the scheme, or no scheme) and
    /// in query parameters.
    fn amqp_url_with_a_secret() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let scheme = prop::sample::select(vec!["amqp", "amqps"]);
        let host = "[a-z0-9.]{0,10}(:[0-9]{0,5})?";
        let tail = "(/[a-z0-9%]{0,8})?(\\?[a-z_=&0-9]{0,16})?";
        prop_oneof![
            (scheme.clone(), "[a-z]{0,4}", secret(), host, tail).prop_map(
                |(scheme, user, secret, host, tail)| format!(
                    "{scheme}://{user}:{secret}@{host}{tail}"
                )
            ),
            (
                scheme.clone(),
                prop::sample::select(vec!["", "/", "///"]),
                "[a-z]{0,4}",
                secret(),
                host,
            )
                .prop_map(|(scheme, slashes, user, secret, host)| {
                    format!("{scheme}:{slashes}{user}:{secret}@{host}")
                }),
            // No scheme. `user://x@host` is a URL of scheme `user` by the
            // URL grammar (see `redact::url`), so the password does not
            // start with `//` here.
            ("[a-z]{0,4}", secret(), host)
                .prop_filter("`user://` is a scheme", |(user, secret, _)| {
                    user.is_empty() || !secret.starts_with("//")
                })
                .prop_map(|(user, secret, host)| format!("{user}:{secret}@{host}")),
            (
                scheme,
                host,
                "([a-z_]{1,4}=[a-z0-9]{0,4}&){0,2}",
                prop::sample::select(vec!["password", "token", "auth"]),
                secret(),
            )
                .prop_map(|(scheme, host, before, key, secret)| {
                    format!("{scheme}://{host}/%2f?{before}{key}={secret}")
                }),
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2_000))]

        #[test]
        fn a_secret_anywhere_in_an_amqp_url_never_shows(url in amqp_url_with_a_secret()) {
            let builder = crate::AmqpSource::builder(url.clone());
            let shown = format!("{builder:?}");
            proptest::prop_assert!(!shown.contains("SECRET"), "{} shows {}", url, shown);
            let shown = match AmqpUrl::parse(&url) {
                Ok(parsed) => format!("{parsed} {parsed:?} {}", parsed.endpoint()),
                Err(error @ Error::InvalidUrl { .. }) => format!("{error} {error:?}"),
                Err(other) => return Err(proptest::test_runner::TestCaseError::fail(
                    format!("unexpected error {other:?}"),
                )),
            };
            proptest::prop_assert!(!shown.contains("SECRET"), "{} shows {}", url, shown);
        }

        #[test]
        fn any_text_as_an_amqp_url_is_parsed_or_refused_with_a_typed_error(url in ".{0,60}") {
            let parsed = AmqpUrl::parse(&url);
            proptest::prop_assert!(
                matches!(parsed, Ok(_) | Err(Error::InvalidUrl { .. })),
                "{:?}",
                parsed.err()
            );
        }
    }

    #[test]
    fn a_password_read_as_a_port_and_vhost_is_refused_without_showing_it() {
        // Digits then `/`: host `app`, port 123, vhost `SECRET@broker`. An
        // empty port reads the same way.
        for url in [
            "amqp://app:123/SECRET@broker/%2f",
            "amqp://app:/SECRET@broker",
            "amqps://:9/SECRET?x@broker",
        ] {
            let error = AmqpUrl::parse(url).unwrap_err();
            assert!(matches!(error, Error::InvalidUrl { .. }), "{error:?}");
            let shown = format!("{error} {error:?}");
            assert!(!shown.contains("SECRET"), "{shown}");
            assert!(shown.contains("%2F"), "says what to escape: {shown}");
        }
    }

    #[test]
    fn an_ipv6_literal_is_refused_rather_than_read_as_localhost() {
        let error = AmqpUrl::parse("amqp://guest:guest@[::1]:5672/%2f").unwrap_err();
        assert!(error.to_string().contains("IPv6"));
    }
}

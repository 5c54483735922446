//! The server URL: one address or several (`nats://a:4222,nats://b:4222`),
//! with credentials in it or not, and the form every log line and error
//! shows.
//!
//! async-nats does not read credentials from the URL, and a NATS URL's lone
//! user info is a token (`nats://s3cret@host`), which a generic redaction
//! would show as a user name. So credentials are taken out here, handed to
//! the client as options, and the printed endpoint never holds them.

use crate::error::Error;

/// Credentials found in a URL.
#[derive(Clone, PartialEq, Eq)]
pub(crate) enum UrlCredentials {
    /// `nats://token@host`.
    Token(String),
    /// `nats://user:password@host`.
    UserPassword(String, String),
}

impl std::fmt::Debug for UrlCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UrlCredentials::Token(_) => f.write_str("Token(***)"),
            UrlCredentials::UserPassword(user, _) => write!(f, "UserPassword({user}, ***)"),
        }
    }
}

/// A parsed server URL.
#[derive(Clone, Debug)]
pub(crate) struct ServerUrls {
    /// Each server, `scheme://host:port`, without credentials.
    pub(crate) addresses: Vec<String>,
    /// Credentials from the first address that carried any.
    pub(crate) credentials: Option<UrlCredentials>,
    /// Whether an address asks for TLS (`tls://`).
    pub(crate) tls: bool,
    /// The addresses as logs and errors show them.
    pub(crate) endpoint: String,
}

/// `text` with everything that may be a credential replaced: the user info
/// up to the last `@` of each address, whatever it holds (a lone user info
/// is a token in NATS). For URLs that could not be parsed too.
pub(crate) fn redact(text: &str) -> String {
    text.split(',')
        .map(|address| {
            let start = address.find("://").map_or(0, |at| at + 3);
            match address[start..].rfind('@') {
                Some(at) => format!(
                    "{}{}@{}",
                    &address[..start],
                    intake_core::redact::REDACTED,
                    &address[start + at + 1..]
                ),
                None => address.to_owned(),
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Percent-decodes a URL component; invalid escapes stay as they are.
fn decode(component: &str) -> String {
    let bytes = component.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        let hex = |at: usize| {
            bytes
                .get(at)
                .and_then(|byte| (*byte as char).to_digit(16))
                .map(|digit| digit as u8)
        };
        match (bytes[index], hex(index + 1), hex(index + 2)) {
            (b'%', Some(high), Some(low)) => {
                decoded.push(high * 16 + low);
                index += 3;
            }
            (byte, _, _) => {
                decoded.push(byte);
                index += 1;
            }
        }
    }
    String::from_utf8_lossy(&decoded).into_owned()
}

impl ServerUrls {
    /// Parses `text`: comma-separated addresses, `nats://` (default), `tls://`;
    /// port 4222 when none is given.
    pub(crate) fn parse(text: &str) -> Result<Self, Error> {
        let invalid = |reason: String| Error::InvalidUrl {
            url: redact(text),
            reason,
        };
        let mut addresses = Vec::new();
        let mut credentials = None;
        let mut tls = false;
        let mut shown = Vec::new();
        for address in text.split(',').map(str::trim) {
            if address.is_empty() {
                return Err(invalid("an address in the list is empty".to_owned()));
            }
            let with_scheme = match address.contains("://") {
                true => address.to_owned(),
                false => format!("nats://{address}"),
            };
            intake_core::redact::check_user_info(&with_scheme)
                .map_err(|ambiguous| invalid(format!("the address {ambiguous}")))?;
            let parsed = url::Url::parse(&with_scheme)
                .map_err(|error| invalid(format!("not a URL ({error})")))?;
            match parsed.scheme() {
                "nats" => {}
                "tls" => tls = true,
                other => {
                    return Err(invalid(format!(
                        "scheme `{other}` is not one NATS speaks here; use nats:// or tls://"
                    )));
                }
            }
            let host = parsed
                .host_str()
                .filter(|host| !host.is_empty())
                .ok_or_else(|| invalid("no host".to_owned()))?;
            if !matches!(parsed.path(), "" | "/") || parsed.query().is_some() {
                return Err(invalid(
                    "a NATS address is `nats://[user:password@]host:port`, without a path or query"
                        .to_owned(),
                ));
            }
            let port = parsed.port().unwrap_or(4222);
            let plain = format!("{}://{host}:{port}", parsed.scheme());
            let found = match (parsed.username(), parsed.password()) {
                ("", None) => None,
                (user, Some(password)) => {
                    Some(UrlCredentials::UserPassword(decode(user), decode(password)))
                }
                (token, None) => Some(UrlCredentials::Token(decode(token))),
            };
            shown.push(match &found {
                None => plain.clone(),
                Some(UrlCredentials::Token(_)) => {
                    format!("{}://***@{host}:{port}", parsed.scheme())
                }
                Some(UrlCredentials::UserPassword(user, _)) => {
                    format!("{}://{user}:***@{host}:{port}", parsed.scheme())
                }
            });
            if credentials.is_none() {
                credentials = found;
            }
            addresses.push(plain);
        }
        Ok(Self {
            addresses,
            credentials,
            tls,
            endpoint: shown.join(","),
        })
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn a_lone_user_info_is_a_token_and_never_shown() {
        let urls = ServerUrls::parse("nats://s3cret@127.0.0.1:4222").expect("valid");
        assert_eq!(
            urls.credentials,
            Some(UrlCredentials::Token("s3cret".into()))
        );
        assert_eq!(urls.endpoint, "nats://***@127.0.0.1:4222");
        assert_eq!(urls.addresses, ["nats://127.0.0.1:4222"]);
        assert!(!format!("{urls:?}").contains("s3cret"));
    }

    #[test]
    fn user_and_password_are_decoded_and_the_password_hidden() {
        let urls = ServerUrls::parse("tls://app:p%40ss%2Fw@h1,nats://h2:5222").expect("valid");
        assert_eq!(
            urls.credentials,
            Some(UrlCredentials::UserPassword("app".into(), "p@ss/w".into()))
        );
        assert_eq!(urls.endpoint, "tls://app:***@h1:4222,nats://h2:5222");
        assert!(urls.tls);
        assert!(!format!("{urls:?}").contains("p@ss"));
    }

    #[test]
    fn a_password_with_an_unescaped_slash_is_refused_without_showing_it() {
        let error = ServerUrls::parse("nats://app:12/secret@host:4222").expect_err("ambiguous");
        let text = format!("{error} {error:?}");
        assert!(!text.contains("secret"), "{text}");
    }

    proptest! {
        #[test]
        fn no_secret_ever_shows(
            secret in "[a-zA-Z0-9/?#@:%!$&'()*+;=._~-]{6,20}",
            host in "[a-z]{1,8}",
            shape in 0..4usize,
        ) {
            let text = match shape {
                0 => format!("nats://{secret}@{host}:4222"),
                1 => format!("nats://user:{secret}@{host}:4222"),
                2 => format!("{secret}@{host}"),
                _ => format!("tls://user:{secret}@{host},nats://{host}:1"),
            };
            let shown = match ServerUrls::parse(&text) {
                Ok(urls) => format!("{} {urls:?}", urls.endpoint),
                Err(error) => format!("{error} {error:?}"),
            };
            // A secret that is itself a piece of the rest of the URL (the
            // host, `nats`, a port) cannot be told apart from it.
            let visible_otherwise = format!("tls nats user {host} 4222 1");
            prop_assume!(!visible_otherwise.contains(&secret));
            // Nor can a password of stars (`user:*`) be told apart from the
            // `***` that masks it.
            let password_of_stars = secret
                .split_once(':')
                .is_some_and(|(_, password)| password.chars().all(|c| c == '*'));
            prop_assume!(!password_of_stars);
            prop_assert!(!shown.contains(&secret), "{}", shown);
        }
    }
}

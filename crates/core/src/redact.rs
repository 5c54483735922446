//! Text safe to log: URLs with their credentials replaced, the names of
//! settings that hold secrets, and outside text cut to a length.
//!
//! Every backend shows its broker URL (in `Debug`, logs and errors) through
//! [`url`], and refuses with [`check_user_info`] a URL whose password a URL
//! parser would read as the host, port or path (which would then be shown).
//! Error text and previews that quote outside input go through [`Capped`].
//!
//! ```
//! use intake_core::redact;
//!
//! assert_eq!(
//!     redact::url("redis://app:s3cret@cache:6379/0"),
//!     "redis://app:***@cache:6379/0"
//! );
//! // A password with an unescaped `/` makes the URL invalid: exactly then
//! // the URL goes into an error message.
//! assert_eq!(
//!     redact::url("postgres://app:12/x?y@db/orders"),
//!     "postgres://app:***@db/orders"
//! );
//! assert_eq!(
//!     redact::url("unix:///run/redis.sock?db=1&pass=s3cret"),
//!     "unix:///run/redis.sock?db=1&pass=***"
//! );
//! assert!(redact::check_user_info("amqp://app:123/x@broker").is_err());
//! ```

use std::borrow::Cow;
use std::fmt::{self, Write as _};
use std::ops::Range;

/// What replaces a secret.
pub const REDACTED: &str = "***";

/// `url` with every part that may hold a secret replaced by [`REDACTED`]:
/// the password of its user info and the value of every query parameter
/// whose name [looks secret](is_secret_name) (`password`, `pass`, `token`,
/// `sslpassword`, `auth`, ...), with everything after it.
///
/// Takes any text, a URL that failed to parse included, and never panics.
/// It reads the user info as ending at the *last* `@`, past any `/`, `?` or
/// `#`: a password holding one of those unescaped makes the URL invalid, and
/// it is then that the URL is quoted in an error. The password starts after
/// the first `:` that follows `scheme://` (or the start of the text when it
/// has no `scheme://`, so `user:password@host` and `redis:/u:pw@h` are
/// hidden too). What the user info holds before that `:` (the user name) is
/// shown, as is everything that cannot be a secret (host, port, path, the
/// other parameters before a secret one). Hiding more than a URL parser
/// would is the price of never showing a password of any shape.
///
/// One reading is fixed by the URL grammar itself: text that starts with
/// `name://` is a URL of scheme `name`, so in `user://x@host` the `x` is a
/// user name, not the password `//x` of `user`.
///
/// ```
/// use intake_core::redact;
///
/// assert_eq!(redact::url("amqp://guest@127.0.0.1:5672/%2f"), "amqp://guest@127.0.0.1:5672/%2f");
/// assert_eq!(redact::url("rediss://:p@ss@example.com"), "rediss://:***@example.com");
/// assert_eq!(
///     redact::url("postgres://db/app?sslmode=require&sslpassword=k3y&x=1"),
///     "postgres://db/app?sslmode=require&sslpassword=***"
/// );
/// ```
pub fn url(url: &str) -> String {
    let mut shown = String::with_capacity(url.len());
    let mut from = 0;
    for range in secret_ranges(url).into_iter().flatten() {
        shown.push_str(&url[from..range.start]);
        shown.push_str(REDACTED);
        from = range.end;
    }
    shown.push_str(&url[from..]);
    shown
}

/// `text` (a client's error message about `url`, say) with every secret of
/// `url` replaced by [`REDACTED`]: each part [`url`] hides, as written and
/// percent-decoded, and each parameter value within a hidden query (a
/// password holding an unescaped `&` reads as two parameters, and a client
/// may quote the second). A secret of a character or two takes those
/// characters out of the rest of the text too: the message is only for
/// people, and showing less beats showing a secret.
///
/// ```
/// use intake_core::redact;
///
/// let url = "postgres://app:s3cret@db/t?password=pa55&sslmode=b4d";
/// assert_eq!(
///     redact::scrub("unknown value \"b4d\" for `ssl_mode`", url),
///     "unknown value \"***\" for `ssl_mode`"
/// );
/// ```
pub fn scrub(text: &str, url: &str) -> String {
    let mut scrubbed = text.to_owned();
    for range in secret_ranges(url).into_iter().flatten() {
        let hidden = &url[range];
        let values = hidden.split(['&', ';']).map(|parameter| {
            parameter
                .split_once('=')
                .map_or(parameter, |(_, value)| value)
        });
        for secret in std::iter::once(hidden).chain(values) {
            for form in [Cow::Borrowed(secret), percent_decoded(secret)] {
                if !form.is_empty() && scrubbed.contains(&*form) {
                    scrubbed = scrubbed.replace(&*form, REDACTED);
                }
            }
        }
    }
    scrubbed
}

/// Whether a setting or query parameter called `name` holds a secret, by
/// its name: it mentions a password (`pass`, `pwd`, `passphrase`), a
/// secret, a token, a credential, a private key, an API key or a signature,
/// or one of its words (between `.`, `-`, `[`, `]` and the like; `_`
/// joins) is `auth`, `key`, `sig` or `jwt`. Case does not matter.
///
/// A heuristic that errs on the side of hiding; a backend that knows its
/// client's secret settings by name lists them too (the Kafka backend
/// does).
pub fn is_secret_name(name: &str) -> bool {
    const PARTS: [&str; 10] = [
        "pass",
        "pwd",
        "secret",
        "token",
        "credential",
        "private",
        "apikey",
        "api_key",
        "api-key",
        "signature",
    ];
    const WORDS: [&str; 4] = ["auth", "key", "sig", "jwt"];
    let name = name.to_ascii_lowercase();
    PARTS.iter().any(|part| name.contains(part))
        || name
            .split(|c: char| !c.is_ascii_alphanumeric() && c != '_')
            .any(|word| WORDS.contains(&word))
}

/// Fails when a URL parser would not end `url`'s user info where [`url`]
/// does (at the last `@`), so the password's rest would become the host,
/// port, path or query, show wherever those are shown, and the client would
/// connect somewhere else than meant.
///
/// That happens when the password holds an unescaped `/`, `?` or `#`
/// (`amqp://app:123/x@broker` is host `app`, port 123, vhost `x@broker`),
/// or when a URL with a password has an `@` after its host. A URL without
/// a password passes whatever it holds.
///
/// # Errors
///
/// [`AmbiguousUserInfo`], which says what to escape.
pub fn check_user_info(url: &str) -> Result<(), AmbiguousUserInfo> {
    let Some(password) = password_range(url) else {
        return Ok(());
    };
    let parsers_agree = authority_start(url).is_some_and(|start| {
        let end = url[start..]
            .find(['/', '?', '#'])
            .map_or(url.len(), |end| start + end);
        password.end < end
    });
    if parsers_agree {
        Ok(())
    } else {
        Err(AmbiguousUserInfo)
    }
}

/// A URL whose user info a URL parser would end before its last `@`; see
/// [`check_user_info`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "has an `@` after its host, or no `scheme://` before its password: a password holding \
     `/`, `?` or `#` unescaped ends the host early, and its rest would be read as the port, \
     path or query; percent-encode them in the password (`/` as %2F, `?` as %3F, `#` as %23) \
     and any `@` after the host (%40)"
)]
pub struct AmbiguousUserInfo;

/// The parts of `url` that may hold a secret, in order, apart: the
/// password, and the rest of the URL from the value of the first secret
/// query parameter on.
fn secret_ranges(url: &str) -> [Option<Range<usize>>; 2] {
    let password = password_range(url);
    let query = secret_query_start(url).map(|start| start..url.len());
    match (password, query) {
        (Some(password), Some(query)) if query.start <= password.end => {
            [Some(password.start.min(query.start)..url.len()), None]
        }
        (password, query) => [password, query],
    }
}

/// Where the authority starts: after `scheme://`, if `url` starts so.
fn authority_start(url: &str) -> Option<usize> {
    let colon = url.find(':')?;
    let mut scheme = url[..colon].chars();
    let scheme_is_valid = scheme.next().is_some_and(|c| c.is_ascii_alphabetic())
        && scheme.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    (scheme_is_valid && url[colon..].starts_with("://")).then_some(colon + 3)
}

/// The password of the user info as [`url`] reads it: from the first `:`
/// after `scheme://` (and any further slashes), or after the start of text
/// without one, to the last `@`.
fn password_range(url: &str) -> Option<Range<usize>> {
    let start = authority_start(url).map_or(0, |start| {
        start + (url[start..].len() - url[start..].trim_start_matches('/').len())
    });
    let at = start + url[start..].rfind('@')?;
    let colon = start + url[start..at].find(':')?;
    Some(colon + 1..at)
}

/// Where the value of the first query parameter with a secret name starts.
fn secret_query_start(url: &str) -> Option<usize> {
    url.match_indices(['?', '&', ';'])
        .find_map(|(separator, _)| {
            let name_start = separator + 1;
            let rest = &url[name_start..];
            let name_end = rest.find(['=', '&', ';', '?', '#']).unwrap_or(rest.len());
            let named_value = rest[name_end..].starts_with('=');
            (named_value && is_secret_name(&percent_decoded(&rest[..name_end])))
                .then_some(name_start + name_end + 1)
        })
}

/// `text` with `%XX` escapes and `+` decoded, as a query parser reads a
/// parameter's name (bytes that are not UTF-8 become U+FFFD).
fn percent_decoded(text: &str) -> Cow<'_, str> {
    if !text.contains(['%', '+']) {
        return Cow::Borrowed(text);
    }
    let bytes = text.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        let escaped = bytes
            .get(index + 1..index + 3)
            .filter(|_| bytes[index] == b'%')
            .and_then(|hex| std::str::from_utf8(hex).ok())
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match (escaped, bytes[index]) {
            (Some(byte), _) => {
                decoded.push(byte);
                index += 3;
            }
            (None, b'+') => {
                decoded.push(b' ');
                index += 1;
            }
            (None, byte) => {
                decoded.push(byte);
                index += 1;
            }
        }
    }
    Cow::Owned(String::from_utf8_lossy(&decoded).into_owned())
}

/// A value whose `Display` (through `{}`) and `Debug` (through `{:?}`) are
/// cut after at most `limit` bytes, at a character boundary, followed by
/// `… (N more bytes)`. Formats without allocating, so it fits log fields
/// and span fields: `tracing::warn!(error = %Capped::new(&error, 1024))`.
///
/// The value is still formatted to its end (to count what was cut): a
/// `Display` may not stop early without making `to_string` panic.
///
/// ```
/// use intake_core::redact::Capped;
///
/// assert_eq!(Capped::new("abcdef", 4).to_string(), "abcd… (2 more bytes)");
/// assert_eq!(Capped::new("abc", 4).to_string(), "abc");
/// assert_eq!(format!("{:?}", Capped::new("abc", 3)), "\"ab… (2 more bytes)");
/// assert_eq!(Capped::new("é", 1).to_string(), "… (2 more bytes)");
/// ```
#[derive(Clone, Copy)]
pub struct Capped<T> {
    value: T,
    limit: usize,
}

impl<T> Capped<T> {
    /// `value`, shown up to `limit` bytes.
    pub fn new(value: T, limit: usize) -> Self {
        Self { value, limit }
    }
}

impl<T: fmt::Display> fmt::Display for Capped<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut budget = Budget::new(f, self.limit);
        write!(budget, "{}", self.value)?;
        budget.finish()
    }
}

impl<T: fmt::Debug> fmt::Debug for Capped<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let alternate = f.alternate();
        let mut budget = Budget::new(f, self.limit);
        if alternate {
            write!(budget, "{:#?}", self.value)?;
        } else {
            write!(budget, "{:?}", self.value)?;
        }
        budget.finish()
    }
}

/// Passes text on until `left` bytes are used up, then counts the rest.
struct Budget<'a, 'f> {
    out: &'a mut fmt::Formatter<'f>,
    left: usize,
    cut: usize,
}

impl<'a, 'f> Budget<'a, 'f> {
    fn new(out: &'a mut fmt::Formatter<'f>, limit: usize) -> Self {
        Self {
            out,
            left: limit,
            cut: 0,
        }
    }

    fn finish(self) -> fmt::Result {
        if self.cut > 0 {
            write!(self.out, "… ({} more bytes)", self.cut)?;
        }
        Ok(())
    }
}

impl fmt::Write for Budget<'_, '_> {
    fn write_str(&mut self, text: &str) -> fmt::Result {
        if self.cut > 0 {
            self.cut += text.len();
            return Ok(());
        }
        if text.len() <= self.left {
            self.left -= text.len();
            return self.out.write_str(text);
        }
        let mut end = self.left;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        self.left = 0;
        self.cut = text.len() - end;
        self.out.write_str(&text[..end])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_user_stays_and_the_password_goes() {
        assert_eq!(
            url("redis://alice:s3cr3t@cache.internal:6380/2"),
            "redis://alice:***@cache.internal:6380/2"
        );
        assert_eq!(
            url("rediss://:hunter2@example.com"),
            "rediss://:***@example.com"
        );
        assert_eq!(url("amqp://app:@broker"), "amqp://app:***@broker");
    }

    #[test]
    fn a_url_without_secrets_is_shown_as_it_is() {
        for shown in [
            "redis://127.0.0.1:6379",
            "postgres://postgres@127.0.0.1:5432/test?sslmode=require",
            "amqp://guest@127.0.0.1:5672/%2f",
            "unix:///run/redis@6379.sock",
            "",
            "not a url",
        ] {
            assert_eq!(url(shown), shown);
        }
    }

    #[test]
    fn the_user_info_ends_at_the_last_at_sign() {
        assert_eq!(
            url("amqp://app:123/x@broker/%2f"),
            "amqp://app:***@broker/%2f"
        );
        assert_eq!(url("unix://:@/x@"), "unix://:***@");
        assert_eq!(url("postgres://a:b?c#d@db/t"), "postgres://a:***@db/t");
    }

    #[test]
    fn a_password_without_scheme_or_slashes_is_hidden() {
        assert_eq!(url("redis:/u:pw@h"), "redis:***@h");
        assert_eq!(url("redis:u:pw@h"), "redis:***@h");
        assert_eq!(url("user:hunter2@host"), "user:***@host");
        assert_eq!(url("u:/p:w@h"), "u:***@h");
    }

    #[test]
    fn a_secret_parameter_hides_the_rest_of_the_url() {
        assert_eq!(
            url("unix:///run/redis.sock?db=1&pass=pw&user=u"),
            "unix:///run/redis.sock?db=1&pass=***"
        );
        assert_eq!(
            url("postgres://db/t?PassWord=a&b"),
            "postgres://db/t?PassWord=***"
        );
        assert_eq!(
            url("postgres://db/t?pass%77ord=x"),
            "postgres://db/t?pass%77ord=***"
        );
        assert_eq!(url("postgres://db/t?password"), "postgres://db/t?password");
        assert_eq!(url("x://u:a@h?token=b"), "x://u:***@h?token=***");
        assert_eq!(url("x://h?token=a@b:c"), "x://h?token=***");
    }

    #[test]
    fn scrubbing_removes_each_secret_as_written_and_decoded() {
        let url = "postgres://app:p%40ss@db/t?x=1&sslpassword=k3y&sslmode=m0de";
        assert_eq!(
            scrub("p%40ss p@ss k3y m0de x=1 app", url),
            "*** *** *** *** x=1 app"
        );
        assert_eq!(scrub("nothing to hide", "redis://h"), "nothing to hide");
    }

    #[test]
    fn secret_names() {
        for name in [
            "password",
            "sslpassword",
            "pass",
            "PWD",
            "sasl.oauthbearer.assertion.private.key.passphrase",
            "client_secret",
            "access_token",
            "auth",
            "x-api-key",
            "ssl.key.location",
            "credentials",
            "sig",
        ] {
            assert!(is_secret_name(name), "{name}");
        }
        for name in [
            "user",
            "db",
            "sslmode",
            "host",
            "auth_mechanism",
            "keepalives",
            "ssl.keystore.location",
            "group.id",
        ] {
            assert!(!is_secret_name(name), "{name}");
        }
    }

    #[test]
    fn a_user_info_a_parser_ends_elsewhere_is_ambiguous() {
        for ambiguous in [
            "amqp://app:123/x@broker",
            "amqp://app:/x@broker",
            "unix://:@/x@",
            "redis:/u:pw@h",
            "u:pw@h",
            "postgres://db:5432/t?user=a@b",
        ] {
            assert_eq!(
                check_user_info(ambiguous),
                Err(AmbiguousUserInfo),
                "{ambiguous}"
            );
        }
        for clear in [
            "amqp://app:p@ss@broker/%2f",
            "redis://:pw@h:6379/0?protocol=3",
            "unix:///run/redis@6379.sock",
            "postgres://db/t?user=a@b",
            "postgres:///t?host=/run/pg",
            "redis://h",
            "",
        ] {
            assert_eq!(check_user_info(clear), Ok(()), "{clear}");
        }
    }

    #[test]
    fn capped_text_is_cut_at_a_char_boundary() {
        assert_eq!(Capped::new("aé", 2).to_string(), "a… (2 more bytes)");
        assert_eq!(Capped::new("abc", 3).to_string(), "abc");
        assert_eq!(
            Capped::new(&"x".repeat(10_000), 5).to_string(),
            "xxxxx… (9995 more bytes)"
        );
        assert_eq!(
            format!("{:?}", Capped::new("abc", 2)),
            "\"a… (3 more bytes)"
        );
    }

    /// A formatted value that arrives in many small writes.
    struct Pieces(usize);

    impl fmt::Display for Pieces {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            for _ in 0..self.0 {
                f.write_str("ab")?;
            }
            Ok(())
        }
    }

    #[test]
    fn capped_text_written_in_pieces_stays_contiguous() {
        assert_eq!(Capped::new(Pieces(5), 3).to_string(), "aba… (7 more bytes)");
        assert_eq!(Capped::new(Pieces(2), 4).to_string(), "abab");
    }

    /// Secrets of any characters a password or parameter may hold, around a
    /// canary that nothing else in the generated text contains.
    fn secret() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let around = "[a-zA-Z0-9/?#@:%!$&'()*+,;=._~\\[\\] -]{0,8}";
        (around, around).prop_map(|(before, after)| format!("{before}SECRET{after}"))
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(4_000))]

        #[test]
        fn any_text_is_redacted_without_panicking(text in ".{0,80}") {
            let shown = url(&text);
            let _ = check_user_info(&text);
            // Only secrets are replaced: what is shown is the text with some
            // ranges replaced by `***`, never longer than that.
            proptest::prop_assert!(shown.len() <= text.len() + 2 * REDACTED.len());
        }

        #[test]
        fn a_password_in_garbage_around_it_never_shows(
            before in "[a-z0-9:/@?#.%&=\\[\\]]{0,12}",
            secret in secret(),
            after in "[a-z0-9:/@?#.%&=\\[\\]]{0,12}",
        ) {
            // `name:` + a password starting with `//` reads as `name://`
            // (see `url`): the one shape the URL grammar decides.
            let scheme_like = before.starts_with(|c: char| c.is_ascii_alphabetic())
                && before.chars().all(|c| c.is_ascii_alphanumeric() || c == '.');
            proptest::prop_assume!(!(scheme_like && secret.starts_with("//")));
            let text = format!("{before}:{secret}@{after}");
            let shown = url(&text);
            proptest::prop_assert!(!shown.contains("SECRET"), "{} shows {}", text, shown);
        }

        #[test]
        fn a_secret_parameter_in_garbage_around_it_never_shows(
            before in "[a-z0-9:/@?#.%&=\\[\\]]{0,16}",
            separator in "[?&;]",
            name in proptest::sample::select(vec!["password", "pass", "token", "sslpassword", "Auth", "pa%73s", "api_key"]),
            secret in secret(),
        ) {
            let text = format!("{before}{separator}{name}={secret}");
            let shown = url(&text);
            proptest::prop_assert!(!shown.contains("SECRET"), "{} shows {}", text, shown);
        }
    }
}

//! [`ConsoleSettings`]: how often the console samples, how much history it
//! keeps, which instance it speaks for, and the token its mutating routes
//! ask for ([`ConsoleToken`]).

use std::time::Duration;

use super::redaction::Redaction;
use crate::error::ConfigError;

/// The default of [`ConsoleSettings::replay_rate`], letters per second.
pub const DEFAULT_REPLAY_RATE: u32 = 1_000;

/// The environment variable [`ConsoleSettings::from_env`] reads the token
/// from.
pub const TOKEN_ENV: &str = "INTAKE_CONSOLE_TOKEN";

/// The environment variable naming this instance (before `HOSTNAME`).
pub const INSTANCE_ENV: &str = "INTAKE_INSTANCE_ID";

/// The fewest bytes a token may have: a guessable token is no protection.
pub const MIN_TOKEN_LEN: usize = 16;

/// The most samples a route's history holds, whatever the settings ask:
/// under 200 bytes each, so at most about 2 MB per route.
pub const MAX_SAMPLES: usize = 10_000;

/// The most bytes of an instance id kept (the rest is cut).
const MAX_INSTANCE_LEN: usize = 128;

/// The bearer token that mutating console routes require. Its `Debug`
/// shows no byte of it, and nothing the console answers or logs holds it.
#[derive(Clone, PartialEq, Eq)]
pub struct ConsoleToken(String);

impl ConsoleToken {
    /// `token`, if it has at least [`MIN_TOKEN_LEN`] bytes and no
    /// whitespace or control character (it travels in a header). Make it
    /// random: 32 bytes from a CSPRNG, hex- or base64-encoded.
    pub fn new(token: impl Into<String>) -> Result<Self, ConfigError> {
        let token = token.into();
        if token.len() < MIN_TOKEN_LEN {
            return Err(ConfigError::new(
                "console token",
                format!("is shorter than {MIN_TOKEN_LEN} bytes; use 32 random bytes, encoded"),
            ));
        }
        if token
            .bytes()
            .any(|byte| byte.is_ascii_whitespace() || byte.is_ascii_control() || !byte.is_ascii())
        {
            return Err(ConfigError::new(
                "console token",
                "holds whitespace, a control character or non-ASCII; use hex or base64",
            ));
        }
        Ok(Self(token))
    }

    /// Whether `offered` is the token, compared in time that does not
    /// depend on where the first difference is.
    pub(super) fn matches(&self, offered: &[u8]) -> bool {
        let expected = self.0.as_bytes();
        // The length is not secret (it is at least MIN_TOKEN_LEN anyway);
        // the bytes are compared without an early exit.
        let mut difference = u8::from(expected.len() != offered.len());
        for (index, byte) in expected.iter().enumerate() {
            difference |= byte ^ offered.get(index).copied().unwrap_or(0);
        }
        difference == 0
    }
}

impl std::fmt::Debug for ConsoleToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ConsoleToken(***)")
    }
}

/// How the [`Console`](super::Console) samples and what it guards with.
///
/// ```
/// use std::time::Duration;
/// use intake_core::app::{ConsoleSettings, ConsoleToken};
///
/// let settings = ConsoleSettings::default()
///     .sample_interval(Duration::from_secs(5))
///     .history(Duration::from_secs(30 * 60))
///     .token(ConsoleToken::new("6f1c0e8a9d2b47c3a1e5f7d9b3c2a4e6")?);
/// assert_eq!(settings.samples(), 360);
/// assert!(!format!("{settings:?}").contains("6f1c"));
/// # Ok::<(), intake_core::ConfigError>(())
/// ```
#[derive(Clone, Debug)]
pub struct ConsoleSettings {
    pub(super) sample_interval: Duration,
    pub(super) history: Duration,
    pub(super) token: Option<ConsoleToken>,
    pub(super) instance: String,
    pub(super) probe_timeout: Duration,
    pub(super) allowed_origins: Vec<String>,
    pub(super) redaction: Redaction,
    pub(super) replay_rate: u32,
}

impl Default for ConsoleSettings {
    /// Samples every 5 s, keeps 15 minutes, no token (every mutating route
    /// refused), payloads redacted ([`Redaction::Hash`]), replays at 1,000
    /// letters/s, the instance named by `INTAKE_INSTANCE_ID`, else
    /// `HOSTNAME`, else `pid-<process id>`.
    fn default() -> Self {
        Self {
            sample_interval: Duration::from_secs(5),
            history: Duration::from_secs(15 * 60),
            token: None,
            instance: instance_from_env(),
            probe_timeout: crate::lag::DEFAULT_LAG_TIMEOUT,
            allowed_origins: Vec::new(),
            redaction: Redaction::default(),
            replay_rate: DEFAULT_REPLAY_RATE,
        }
    }
}

impl ConsoleSettings {
    /// The defaults, with the token from `INTAKE_CONSOLE_TOKEN` when it is
    /// set (an unset or empty variable leaves mutations refused; a token
    /// too short or with whitespace is an error, not ignored).
    pub fn from_env() -> Result<Self, ConfigError> {
        let settings = Self::default();
        match std::env::var(TOKEN_ENV) {
            Ok(token) if !token.is_empty() => Ok(settings.token(ConsoleToken::new(token)?)),
            Ok(_) | Err(std::env::VarError::NotPresent) => Ok(settings),
            Err(std::env::VarError::NotUnicode(_)) => Err(ConfigError::new(
                TOKEN_ENV,
                "is not valid unicode; use hex or base64",
            )),
        }
    }

    /// How often the history takes a sample (default 5 s; at least 1 ms).
    pub fn sample_interval(mut self, interval: Duration) -> Self {
        self.sample_interval = interval.max(Duration::from_millis(1));
        self
    }

    /// How far back the history reaches (default 15 minutes). It holds
    /// `history / sample_interval` samples per route, at most
    /// [`MAX_SAMPLES`].
    pub fn history(mut self, history: Duration) -> Self {
        self.history = history;
        self
    }

    /// The token mutating routes require (`Authorization: Bearer
    /// <token>`). Without one, every mutating route is refused.
    pub fn token(mut self, token: ConsoleToken) -> Self {
        self.token = Some(token);
        self
    }

    /// The name this instance answers with as the owner of its partitions
    /// (cut to 128 bytes).
    pub fn instance(mut self, instance: impl Into<String>) -> Self {
        self.instance = cap(instance.into());
        self
    }

    /// How long a lag probe may take before the sample goes without it
    /// (default 5 s).
    pub fn probe_timeout(mut self, timeout: Duration) -> Self {
        self.probe_timeout = timeout;
        self
    }

    /// An origin (`https://console.example.com`) whose requests a mutating
    /// route accepts besides the service's own (its `Host`): for a page
    /// served elsewhere, behind a proxy that rewrites the host.
    pub fn allow_origin(mut self, origin: impl Into<String>) -> Self {
        self.allowed_origins.push(origin.into());
        self
    }

    /// What the dead-letter explorer shows of a letter's payload (default
    /// [`Redaction::Hash`]: its size and fingerprint only).
    pub fn redaction(mut self, redaction: Redaction) -> Self {
        self.redaction = redaction;
        self
    }

    /// How many letters per second a replay through the console publishes
    /// at most (default 1,000; at least 1).
    pub fn replay_rate(mut self, letters_per_second: u32) -> Self {
        self.replay_rate = letters_per_second.max(1);
        self
    }

    /// How many samples a route's history holds: enough for
    /// [`history`](Self::history) at [`sample_interval`](Self::sample_interval),
    /// at least 1 and at most [`MAX_SAMPLES`].
    pub fn samples(&self) -> usize {
        let interval = self.sample_interval.as_nanos().max(1);
        let samples = self.history.as_nanos().div_ceil(interval);
        usize::try_from(samples)
            .unwrap_or(MAX_SAMPLES)
            .clamp(1, MAX_SAMPLES)
    }

    /// Whether a token is set (mutating routes can be used).
    pub fn has_token(&self) -> bool {
        self.token.is_some()
    }

    /// The instance name.
    pub fn instance_id(&self) -> &str {
        &self.instance
    }
}

fn instance_from_env() -> String {
    [INSTANCE_ENV, "HOSTNAME"]
        .iter()
        .find_map(|name| std::env::var(name).ok().filter(|value| !value.is_empty()))
        .map(cap)
        .unwrap_or_else(|| format!("pid-{}", std::process::id()))
}

/// `text` cut to [`MAX_INSTANCE_LEN`] bytes, at a character boundary.
fn cap(mut text: String) -> String {
    if text.len() > MAX_INSTANCE_LEN {
        let mut end = MAX_INSTANCE_LEN;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_too_short_or_with_whitespace_is_refused_and_never_shown() {
        assert!(ConsoleToken::new("short").is_err());
        assert!(ConsoleToken::new("0123456789abcdef 0123").is_err());
        assert!(ConsoleToken::new("0123456789abcdef\u{e9}").is_err());
        let token = ConsoleToken::new("0123456789abcdef0123").unwrap();
        assert_eq!(format!("{token:?}"), "ConsoleToken(***)");
        let settings = ConsoleSettings::default().token(token);
        assert!(!format!("{settings:?}").contains("0123456789"));
    }

    #[test]
    fn the_token_matches_only_itself() {
        let token = ConsoleToken::new("0123456789abcdef0123").unwrap();
        assert!(token.matches(b"0123456789abcdef0123"));
        assert!(!token.matches(b"0123456789abcdef012"));
        assert!(!token.matches(b"0123456789abcdef01234"));
        assert!(!token.matches(b"1123456789abcdef0123"));
        assert!(!token.matches(b""));
    }

    #[test]
    fn the_sample_count_covers_the_history_within_the_bound() {
        let settings = ConsoleSettings::default();
        assert_eq!(settings.samples(), 180, "15 minutes at 5 s");
        let fine = settings.clone().sample_interval(Duration::from_millis(1));
        assert_eq!(fine.samples(), MAX_SAMPLES);
        let none = settings.history(Duration::ZERO);
        assert_eq!(none.samples(), 1);
    }

    #[test]
    fn a_long_instance_name_is_cut_at_a_character_boundary() {
        let settings = ConsoleSettings::default().instance("\u{e9}".repeat(100));
        assert!(settings.instance_id().len() <= MAX_INSTANCE_LEN);
        assert!(settings.instance_id().chars().all(|c| c == '\u{e9}'));
    }
}

//! The reconnect policy of a Kafka client, as librdkafka's
//! `reconnect.backoff.ms` and `reconnect.backoff.max.ms`.
//!
//! librdkafka reconnects to a broker by itself, on a schedule of its own:
//! it waits `reconnect.backoff.ms` after the first failure, doubles the wait
//! after each further one up to `reconnect.backoff.max.ms`, spreads each
//! wait by -25 % to +50 %, and never gives up. An intake policy can only
//! choose those two bounds: an [`Exponential`]'s first and longest delay, a
//! [`Constant`]'s delay for both. Its growth factor, jitter and retry cap
//! are librdkafka's, whatever the policy says.

use std::any::Any;
use std::time::Duration;

use intake_core::{Backoff, BackoffPolicy, Constant, Exponential};

use crate::error::Error;
use crate::settings::KafkaSettings;

/// The longest wait librdkafka accepts for either setting (one hour).
const LONGEST: Duration = Duration::from_secs(3600);

/// The librdkafka settings a reconnect policy maps onto.
const MIN_SETTING: &str = "reconnect.backoff.ms";
const MAX_SETTING: &str = "reconnect.backoff.max.ms";

/// A reconnect schedule librdkafka can follow: its first and longest wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ReconnectBackoff {
    first: Duration,
    longest: Duration,
}

impl Default for ReconnectBackoff {
    /// From 100 ms, doubling up to 10 s, forever: intake's reconnect policy
    /// on every backend, and librdkafka's own defaults.
    fn default() -> Self {
        Self {
            first: Duration::from_millis(100),
            longest: Duration::from_secs(10),
        }
    }
}

impl ReconnectBackoff {
    /// The schedule of `policy`, or what is wrong with it (the problem of
    /// an [`Error::Config`] for `reconnect_backoff`).
    pub(crate) fn of<P: BackoffPolicy>(policy: &P) -> Result<Self, String> {
        let policy: &dyn Any = policy;
        if let Some(exponential) = policy.downcast_ref::<Exponential>() {
            return Self::exponential(exponential);
        }
        if let Some(constant) = policy.downcast_ref::<Constant>() {
            return Self::constant(constant);
        }
        match policy.downcast_ref::<Backoff>() {
            Some(Backoff::Exponential(exponential)) => Self::exponential(exponential),
            Some(Backoff::Constant(constant)) => Self::constant(constant),
            Some(Backoff::Disabled) => Err(Self::disabled()),
            None if policy.is::<intake_core::Disabled>() => Err(Self::disabled()),
            None => Err(
                "librdkafka reconnects on an exponential schedule of its own: pass an `Exponential` (its first and longest delay are used) or a `Constant`"
                    .into(),
            ),
        }
    }

    fn exponential(policy: &Exponential) -> Result<Self, String> {
        policy.validate().map_err(|error| error.to_string())?;
        // Without jitter: the first retry's delay is the minimum, and one
        // far enough out is the maximum (or the minimum again for a factor
        // of 1, which never grows).
        Self::checked(policy.base_delay(1), policy.base_delay(u32::MAX))
    }

    fn constant(policy: &Constant) -> Result<Self, String> {
        // Retry 0 comes before any cap, so it always has the delay.
        let delay = policy.delay(0).unwrap_or_default();
        Self::checked(delay, delay)
    }

    fn disabled() -> String {
        "librdkafka always reconnects to a broker it lost; `Disabled` cannot be honoured: pass an `Exponential` or a `Constant`".into()
    }

    fn checked(first: Duration, longest: Duration) -> Result<Self, String> {
        if longest > LONGEST {
            return Err(format!(
                "librdkafka waits at most {LONGEST:?} between reconnects, not {longest:?}"
            ));
        }
        Ok(Self { first, longest })
    }

    /// Writes the schedule into `settings`. With `explicit` (the builder was
    /// given a policy), a different value of either setting in `settings`
    /// is refused: one setting, one place. Without, a value in `settings`
    /// stays, and the default fills what is not set.
    pub(crate) fn apply(self, settings: &mut KafkaSettings, explicit: bool) -> Result<(), Error> {
        for (setting, wait) in [(MIN_SETTING, self.first), (MAX_SETTING, self.longest)] {
            let millis = wait.as_millis().to_string();
            match settings.get(setting) {
                Some(set) if explicit && set != millis => {
                    return Err(Error::config(
                        setting,
                        format!(
                            "`{set}` contradicts the reconnect policy (`reconnect_backoff`, {millis} ms); set one of them"
                        ),
                    ));
                }
                Some(_) => {}
                None => {
                    settings.client_config_mut().set(setting, millis);
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapped(schedule: ReconnectBackoff) -> (Option<String>, Option<String>) {
        let mut settings = KafkaSettings::new("b:9092");
        schedule.apply(&mut settings, true).expect("applies");
        (
            settings.get(MIN_SETTING).map(str::to_owned),
            settings.get(MAX_SETTING).map(str::to_owned),
        )
    }

    fn millis(first: &str, longest: &str) -> (Option<String>, Option<String>) {
        (Some(first.to_owned()), Some(longest.to_owned()))
    }

    #[test]
    fn an_exponential_policy_gives_librdkafka_its_first_and_longest_delay() {
        let policy = Exponential::new(Duration::from_millis(250), Duration::from_secs(30))
            .jitter(0.5)
            .max_retries(3);
        let schedule = ReconnectBackoff::of(&policy).expect("exponential");
        assert_eq!(mapped(schedule), millis("250", "30000"));
        let schedule = ReconnectBackoff::of(&Backoff::from(policy)).expect("exponential");
        assert_eq!(mapped(schedule), millis("250", "30000"));
        // A factor of 1 never grows: its longest delay is its first.
        let flat =
            Exponential::new(Duration::from_millis(250), Duration::from_secs(30)).factor(1.0);
        assert_eq!(
            mapped(ReconnectBackoff::of(&flat).expect("flat")),
            millis("250", "250")
        );
    }

    #[test]
    fn the_default_is_100_ms_doubling_to_10_s_as_on_every_backend() {
        let policy =
            Exponential::new(Duration::from_millis(100), Duration::from_secs(10)).retry_forever();
        assert_eq!(
            ReconnectBackoff::of(&policy).expect("exponential"),
            ReconnectBackoff::default()
        );
        assert_eq!(mapped(ReconnectBackoff::default()), millis("100", "10000"));
    }

    #[test]
    fn a_constant_policy_is_both_bounds() {
        let policy = Constant::new(Duration::from_secs(2)).max_retries(0);
        assert_eq!(
            mapped(ReconnectBackoff::of(&policy).expect("constant")),
            millis("2000", "2000")
        );
    }

    #[test]
    fn what_librdkafka_cannot_follow_is_refused() {
        struct Fibonacci;
        impl BackoffPolicy for Fibonacci {
            fn delay(&self, retry: u32) -> Option<Duration> {
                Some(Duration::from_millis(u64::from(retry)))
            }
        }
        let invalid = Exponential::new(Duration::from_secs(10), Duration::from_secs(1));
        let too_long = Exponential::new(Duration::from_secs(1), Duration::from_secs(7200));
        for problem in [
            ReconnectBackoff::of(&intake_core::Disabled),
            ReconnectBackoff::of(&Backoff::Disabled),
            ReconnectBackoff::of(&Fibonacci),
            ReconnectBackoff::of(&invalid),
            ReconnectBackoff::of(&too_long),
        ] {
            assert!(problem.is_err(), "{problem:?}");
        }
    }

    #[test]
    fn a_policy_that_contradicts_the_settings_is_refused_and_the_default_yields_to_them() {
        let mut settings = KafkaSettings::new("b:9092").set(MAX_SETTING, "60000");
        let refused = ReconnectBackoff::default().apply(&mut settings, true);
        assert!(
            matches!(refused, Err(Error::Config { ref setting, .. }) if setting == MAX_SETTING),
            "{refused:?}"
        );
        ReconnectBackoff::default()
            .apply(&mut settings, false)
            .expect("the settings' own value stays");
        assert_eq!(settings.get(MAX_SETTING), Some("60000"));
        assert_eq!(settings.get(MIN_SETTING), Some("100"));
    }
}

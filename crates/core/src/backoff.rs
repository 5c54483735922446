//! How long to wait before trying again: [`BackoffPolicy`] and its policies.
//!
//! One trait serves handler retries, consumer-level pauses after failure
//! streaks, the dead-letter path and reconnects. "No backoff" is its own
//! policy, [`Disabled`], and never a zero duration: code that pauses on a
//! policy asks [`BackoffPolicy::is_disabled`] first, so a disabled policy can
//! never pause anything (go-nsq #129 paused on a zero backoff).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::error::ConfigError;

/// A schedule of delays between attempts.
pub trait BackoffPolicy: Send + Sync + 'static {
    /// The delay before retry number `retry` (1 = the first retry, after the
    /// first failure), or `None` to give up.
    fn delay(&self, retry: u32) -> Option<Duration>;

    /// Whether the policy never waits. Retries under a disabled policy give up
    /// at once; consumer-level backoff under it never pauses.
    fn is_disabled(&self) -> bool {
        false
    }

    /// Checks the policy's settings. [`ConsumerBuilder::build`] runs it on
    /// the consumer's backoff and reconnect policies and
    /// [`FailurePolicy::block`] on its own, so a bad policy fails there and
    /// not on the first failure. Whatever its settings, no built-in policy's
    /// [`delay`](BackoffPolicy::delay) panics.
    ///
    /// [`ConsumerBuilder::build`]: crate::consumer::ConsumerBuilder::build
    /// [`FailurePolicy::block`]: crate::dead_letter::FailurePolicy::block
    fn validate(&self) -> Result<(), ConfigError> {
        Ok(())
    }
}

impl<P: BackoffPolicy + ?Sized> BackoffPolicy for Arc<P> {
    fn delay(&self, retry: u32) -> Option<Duration> {
        (**self).delay(retry)
    }

    fn is_disabled(&self) -> bool {
        (**self).is_disabled()
    }

    fn validate(&self) -> Result<(), ConfigError> {
        (**self).validate()
    }
}

impl<P: BackoffPolicy + ?Sized> BackoffPolicy for Box<P> {
    fn delay(&self, retry: u32) -> Option<Duration> {
        (**self).delay(retry)
    }

    fn is_disabled(&self) -> bool {
        (**self).is_disabled()
    }

    fn validate(&self) -> Result<(), ConfigError> {
        (**self).validate()
    }
}

/// No backoff at all: never wait, never retry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Disabled;

impl BackoffPolicy for Disabled {
    fn delay(&self, _retry: u32) -> Option<Duration> {
        None
    }

    fn is_disabled(&self) -> bool {
        true
    }
}

/// The same delay before every retry, optionally capped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Constant {
    delay: Duration,
    max_retries: Option<u32>,
}

impl Constant {
    /// Waits `delay` before each retry, at most 10 retries (see
    /// [`Constant::max_retries`] and [`Constant::retry_forever`]).
    pub fn new(delay: Duration) -> Self {
        Self {
            delay,
            max_retries: Some(Exponential::DEFAULT_MAX_RETRIES),
        }
    }

    /// Gives up after `retries` retries.
    pub fn max_retries(mut self, retries: u32) -> Self {
        self.max_retries = Some(retries);
        self
    }

    /// Never gives up. Only for failures that must block until they pass.
    pub fn retry_forever(mut self) -> Self {
        self.max_retries = None;
        self
    }
}

impl BackoffPolicy for Constant {
    fn delay(&self, retry: u32) -> Option<Duration> {
        match self.max_retries {
            Some(cap) if retry > cap => None,
            _ => Some(self.delay),
        }
    }
}

/// Delays that grow by `factor` from `min` to `max`, with random jitter,
/// optionally capped in number.
#[derive(Clone, Copy, PartialEq)]
pub struct Exponential {
    min: Duration,
    max: Duration,
    factor: f64,
    jitter: f64,
    max_retries: Option<u32>,
}

impl fmt::Debug for Exponential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Exponential")
            .field("min", &self.min)
            .field("max", &self.max)
            .field("factor", &self.factor)
            .field("jitter", &self.jitter)
            .field("max_retries", &self.max_retries)
            .finish()
    }
}

impl Default for Exponential {
    /// 100 ms, doubling up to 30 s, 10 % jitter, at most 10 retries.
    fn default() -> Self {
        Self {
            min: Duration::from_millis(100),
            max: Duration::from_secs(30),
            factor: 2.0,
            jitter: 0.1,
            max_retries: Some(Self::DEFAULT_MAX_RETRIES),
        }
    }
}

impl Exponential {
    /// Retries allowed unless a policy says otherwise: retrying silently
    /// forever is a choice a user makes, never a default.
    pub const DEFAULT_MAX_RETRIES: u32 = 10;

    /// Delays from `min` doubling up to `max`, 10 % jitter, at most 10 retries.
    pub fn new(min: Duration, max: Duration) -> Self {
        Self {
            min,
            max,
            ..Self::default()
        }
    }

    /// Growth per retry (at least 1.0).
    pub fn factor(mut self, factor: f64) -> Self {
        self.factor = factor;
        self
    }

    /// Random spread as a fraction of each delay, from 0.0 (none) to 1.0.
    pub fn jitter(mut self, jitter: f64) -> Self {
        self.jitter = jitter;
        self
    }

    /// Gives up after `retries` retries.
    pub fn max_retries(mut self, retries: u32) -> Self {
        self.max_retries = Some(retries);
        self
    }

    /// Never gives up. Only for failures that must block until they pass.
    pub fn retry_forever(mut self) -> Self {
        self.max_retries = None;
        self
    }

    /// Checks the settings: `min` at most `max`, a finite `factor` of at
    /// least 1.0, a `jitter` between 0.0 and 1.0. The consumer builder runs
    /// this on the policies it is given (see [`BackoffPolicy::validate`]); a
    /// layer cannot fail when it is built, so check a policy you hand a
    /// layer yourself. An invalid policy never panics: its delays stay
    /// within `min ..= max` as far as the settings allow.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.min > self.max {
            return Err(ConfigError::new(
                "backoff.min",
                format!(
                    "({:?}) is larger than backoff.max ({:?})",
                    self.min, self.max
                ),
            ));
        }
        if !(self.factor >= 1.0 && self.factor.is_finite()) {
            return Err(ConfigError::new(
                "backoff.factor",
                format!(
                    "must be a finite number of at least 1.0, not {}",
                    self.factor
                ),
            ));
        }
        if !(0.0..=1.0).contains(&self.jitter) {
            return Err(ConfigError::new(
                "backoff.jitter",
                format!("must lie between 0.0 and 1.0, not {}", self.jitter),
            ));
        }
        Ok(())
    }

    /// The delay before `retry` without jitter.
    pub fn base_delay(&self, retry: u32) -> Duration {
        let exponent = retry.saturating_sub(1).min(1024) as i32;
        let scaled = self.min.as_secs_f64() * self.factor.max(1.0).powi(exponent);
        if !scaled.is_finite() || scaled >= self.max.as_secs_f64() {
            self.max
        } else {
            Duration::try_from_secs_f64(scaled)
                .unwrap_or(self.max)
                .max(self.min)
        }
    }
}

impl BackoffPolicy for Exponential {
    fn validate(&self) -> Result<(), ConfigError> {
        Exponential::validate(self)
    }

    fn delay(&self, retry: u32) -> Option<Duration> {
        if let Some(cap) = self.max_retries
            && retry > cap
        {
            return None;
        }
        let base = self.base_delay(retry);
        // `validate` refuses a jitter outside 0.0 ..= 1.0; a policy that was
        // never validated still must not panic (a NaN survives `clamp`).
        let jitter = if self.jitter.is_nan() {
            0.0
        } else {
            self.jitter.clamp(0.0, 1.0)
        };
        if jitter == 0.0 || base.is_zero() {
            return Some(base);
        }
        let spread = 1.0 + jitter * (rand::random::<f64>() * 2.0 - 1.0);
        // Near `Duration::MAX` the spread can leave the range of a duration.
        let delay = Duration::try_from_secs_f64(base.as_secs_f64() * spread).unwrap_or(self.max);
        Some(delay.min(self.max))
    }
}

/// Any of the built-in policies, for settings that take one by value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Backoff {
    /// See [`Exponential`].
    Exponential(Exponential),
    /// See [`Constant`].
    Constant(Constant),
    /// See [`Disabled`].
    Disabled,
}

impl BackoffPolicy for Backoff {
    fn delay(&self, retry: u32) -> Option<Duration> {
        match self {
            Backoff::Exponential(policy) => policy.delay(retry),
            Backoff::Constant(policy) => policy.delay(retry),
            Backoff::Disabled => Disabled.delay(retry),
        }
    }

    fn is_disabled(&self) -> bool {
        matches!(self, Backoff::Disabled)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        match self {
            Backoff::Exponential(policy) => policy.validate(),
            Backoff::Constant(_) | Backoff::Disabled => Ok(()),
        }
    }
}

impl From<Exponential> for Backoff {
    fn from(policy: Exponential) -> Self {
        Backoff::Exponential(policy)
    }
}

impl From<Constant> for Backoff {
    fn from(policy: Constant) -> Self {
        Backoff::Constant(policy)
    }
}

impl From<Disabled> for Backoff {
    fn from(_: Disabled) -> Self {
        Backoff::Disabled
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exponential_grows_to_max_and_gives_up_at_the_cap() {
        let policy = Exponential::new(Duration::from_millis(10), Duration::from_millis(50))
            .jitter(0.0)
            .max_retries(4);
        let delays: Vec<_> = (1..=5).map(|retry| policy.delay(retry)).collect();
        assert_eq!(
            delays,
            vec![
                Some(Duration::from_millis(10)),
                Some(Duration::from_millis(20)),
                Some(Duration::from_millis(40)),
                Some(Duration::from_millis(50)),
                None
            ]
        );
    }

    #[test]
    fn exponential_is_capped_by_default() {
        let policy = Exponential::default();
        assert!(policy.delay(Exponential::DEFAULT_MAX_RETRIES).is_some());
        assert_eq!(policy.delay(Exponential::DEFAULT_MAX_RETRIES + 1), None);
        assert!(policy.retry_forever().delay(u32::MAX).is_some());
    }

    #[test]
    fn jitter_stays_within_its_spread_and_the_max() {
        let policy =
            Exponential::new(Duration::from_millis(100), Duration::from_secs(1)).jitter(0.5);
        for _ in 0..1000 {
            let delay = policy.delay(2).unwrap_or_default();
            assert!(delay >= Duration::from_millis(100) && delay <= Duration::from_millis(300));
        }
    }

    #[test]
    fn huge_retry_numbers_do_not_overflow() {
        let policy = Exponential::default().retry_forever().jitter(0.0);
        assert_eq!(policy.delay(u32::MAX), Some(Duration::from_secs(30)));
    }

    #[test]
    fn disabled_is_not_a_zero_delay() {
        assert!(Disabled.is_disabled());
        assert_eq!(Disabled.delay(1), None);
        assert!(!Constant::new(Duration::ZERO).is_disabled());
    }

    #[test]
    fn no_setting_makes_a_delay_panic() {
        let extremes = [Duration::ZERO, Duration::from_nanos(1), Duration::MAX];
        let numbers = [0.0, 0.5, 1.0, 2.0, f64::MAX, f64::INFINITY, f64::NAN, -1.0];
        for min in extremes {
            for max in extremes {
                for number in numbers {
                    for policy in [
                        Exponential::new(min, max).jitter(number),
                        Exponential::new(min, max).factor(number),
                        Exponential::new(min, max).factor(number).jitter(1.0),
                    ] {
                        for retry in [0, 1, 2, 63, 64, 1_000, u32::MAX] {
                            let delay = policy.retry_forever().delay(retry);
                            assert!(delay.is_some(), "{policy:?} at {retry}");
                        }
                    }
                }
            }
            assert!(Constant::new(min).delay(u32::MAX).is_none());
        }
    }

    #[test]
    fn a_policy_checks_itself_through_the_trait() {
        let nan_jitter: Arc<dyn BackoffPolicy> = Arc::new(Exponential::default().jitter(f64::NAN));
        assert_eq!(
            nan_jitter.validate().map_err(|e| e.setting),
            Err("backoff.jitter")
        );
        let as_enum = Backoff::from(Exponential::default().factor(f64::NAN));
        assert_eq!(
            as_enum.validate().map_err(|e| e.setting),
            Err("backoff.factor")
        );
        assert!(Arc::new(Exponential::default()).validate().is_ok());
        assert!(Constant::new(Duration::MAX).validate().is_ok());
        assert!(Disabled.validate().is_ok());
    }

    #[test]
    fn invalid_exponential_settings_are_reported() {
        let error = Exponential::new(Duration::from_secs(2), Duration::from_secs(1)).validate();
        assert_eq!(error.map_err(|e| e.setting), Err("backoff.min"));
        assert!(Exponential::default().factor(0.5).validate().is_err());
        assert!(Exponential::default().jitter(2.0).validate().is_err());
    }
}

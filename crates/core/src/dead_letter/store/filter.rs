//! [`Filter`]: which letters an operation applies to.

use std::time::SystemTime;

use bytes::Bytes;

use super::StoredLetter;
use crate::dead_letter::DeadLetter;
use crate::error::ErrorClass;

/// Which letters an operation applies to: every condition set must hold.
/// [`Filter::all`] (the default) matches everything, unreadable entries
/// included; a filter with any condition matches only letters that can be
/// read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Filter {
    /// The class of the last failure.
    pub class: Option<ErrorClass>,
    /// Given up at or after this time ([`DeadLetter::failed_at`]).
    pub failed_from: Option<SystemTime>,
    /// Given up before this time.
    pub failed_until: Option<SystemTime>,
    /// The original message's key, byte for byte.
    pub key: Option<Bytes>,
}

impl Filter {
    /// Every letter.
    pub fn all() -> Self {
        Self::default()
    }

    /// Only letters whose last failure was of `class`.
    pub fn with_class(mut self, class: ErrorClass) -> Self {
        self.class = Some(class);
        self
    }

    /// Only letters given up at or after `from` and before `until` (either
    /// bound `None`: open).
    pub fn failed_between(mut self, from: Option<SystemTime>, until: Option<SystemTime>) -> Self {
        self.failed_from = from;
        self.failed_until = until;
        self
    }

    /// Only letters of messages with key `key`.
    pub fn with_key(mut self, key: impl Into<Bytes>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// Whether it sets no condition.
    pub fn is_all(&self) -> bool {
        *self == Self::default()
    }

    /// Whether `stored` is one of the letters it selects.
    pub fn matches(&self, stored: &StoredLetter) -> bool {
        match &stored.letter {
            Ok(letter) => self.matches_letter(letter),
            Err(_) => self.is_all(),
        }
    }

    /// Whether `letter` meets every condition.
    pub fn matches_letter(&self, letter: &DeadLetter) -> bool {
        self.class.is_none_or(|class| letter.class == class)
            && self.failed_from.is_none_or(|from| letter.failed_at >= from)
            && self
                .failed_until
                .is_none_or(|until| letter.failed_at < until)
            && self
                .key
                .as_ref()
                .is_none_or(|key| letter.message.key() == Some(key))
    }
}

//! [`EnvelopeError`]: why what a carrier holds is no dead letter.

/// Why what a carrier holds cannot be read as a dead letter.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EnvelopeError {
    /// A field every letter has is missing; without [`VERSION`](super::VERSION), this is
    /// not an intake dead letter at all.
    #[error("the dead letter has no `{field}` field")]
    Missing {
        /// The missing field.
        field: &'static str,
    },
    /// A field does not hold what it should.
    #[error("the dead letter's `{field}` field holds `{value}`, not {expected}")]
    Malformed {
        /// The field.
        field: &'static str,
        /// A bounded preview of its value.
        value: String,
        /// What it should hold.
        expected: &'static str,
    },
    /// A field appears more than once: the letter was changed after a sink
    /// wrote it, and which value is the origin cannot be told.
    #[error("the dead letter's `{field}` field appears more than once")]
    Duplicate {
        /// The field.
        field: &'static str,
    },
    /// The letter was written by a newer intake; read it with that version.
    #[error("the dead letter's envelope is version {version}; this intake reads version 1")]
    UnsupportedVersion {
        /// The letter's version.
        version: String,
    },
}

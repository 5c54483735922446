//! [`LetterId`]: how a store names one letter.

use std::fmt;
use std::sync::Arc;

/// How a store names one stored letter, and the cursor of
/// [`list`](super::DeadLetterStore::list): the text its broker uses (a memory or
/// Kafka offset `41`, a Redis entry id `1700000000000-0`). An operator
/// copies it from a listing into a [`read`](super::DeadLetterStore::read).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LetterId(Arc<str>);

impl LetterId {
    /// The id written `text`; the store that reads it checks its form.
    pub fn new(text: impl Into<Arc<str>>) -> Self {
        Self(text.into())
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for LetterId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for LetterId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl From<&str> for LetterId {
    fn from(text: &str) -> Self {
        Self::new(text)
    }
}

impl From<String> for LetterId {
    fn from(text: String) -> Self {
        Self::new(text)
    }
}

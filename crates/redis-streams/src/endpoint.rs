//! [`Endpoint`]: where the backend connects, safe to show.

use std::fmt;
use std::sync::Arc;

/// Where the backend connects, as `scheme://[user@]host:port/db`: the URL
/// without its password, safe for logs and errors.
#[derive(Clone, PartialEq, Eq)]
pub struct Endpoint(Arc<str>);

impl Endpoint {
    /// An endpoint of text that holds no secret (already redacted).
    pub(crate) fn from_redacted(redacted: impl Into<Arc<str>>) -> Self {
        Self(redacted.into())
    }

    /// The endpoint as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

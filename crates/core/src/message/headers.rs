//! [`Headers`]: a message's headers, names and raw bytes, in the order the
//! broker gave them.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;

/// One header: a name and raw bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    /// Header name. Brokers compare names case-sensitively; so does intake.
    pub name: Arc<str>,
    /// Raw header value.
    pub value: Bytes,
}

/// Message headers: an ordered list, cheap to clone, empty without allocation.
///
/// Lookups are linear: messages carry few headers, and a scan of a handful of
/// entries is faster than hashing.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Headers {
    entries: Option<Arc<Vec<Header>>>,
}

impl Headers {
    /// No headers.
    pub const fn new() -> Self {
        Self { entries: None }
    }

    /// The first value of header `name`.
    pub fn get(&self, name: &str) -> Option<&Bytes> {
        self.iter()
            .find(|header| &*header.name == name)
            .map(|header| &header.value)
    }

    /// The first value of header `name`, if it is UTF-8.
    pub fn get_str(&self, name: &str) -> Option<&str> {
        self.get(name)
            .and_then(|value| std::str::from_utf8(value).ok())
    }

    /// Appends a header (copy-on-write if this list is shared).
    pub fn insert(&mut self, name: impl Into<Arc<str>>, value: impl Into<Bytes>) {
        let entries = self.entries.get_or_insert_with(Default::default);
        Arc::make_mut(entries).push(Header {
            name: name.into(),
            value: value.into(),
        });
    }

    /// Replaces every header called `name` with one of value `value`.
    pub fn set(&mut self, name: impl Into<Arc<str>>, value: impl Into<Bytes>) {
        let name = name.into();
        if let Some(entries) = self.entries.as_mut() {
            Arc::make_mut(entries).retain(|header| header.name != name);
        }
        self.insert(name, value);
    }

    /// All headers in order.
    pub fn iter(&self) -> std::slice::Iter<'_, Header> {
        match &self.entries {
            Some(entries) => entries.iter(),
            None => [].iter(),
        }
    }

    /// Number of headers.
    pub fn len(&self) -> usize {
        self.entries.as_ref().map_or(0, |entries| entries.len())
    }

    /// Whether there are no headers.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl fmt::Debug for Headers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.iter().map(|header| {
                (
                    &*header.name,
                    String::from_utf8_lossy(&header.value).into_owned(),
                )
            }))
            .finish()
    }
}

impl<N: Into<Arc<str>>, V: Into<Bytes>> FromIterator<(N, V)> for Headers {
    fn from_iter<I: IntoIterator<Item = (N, V)>>(iter: I) -> Self {
        let entries: Vec<Header> = iter
            .into_iter()
            .map(|(name, value)| Header {
                name: name.into(),
                value: value.into(),
            })
            .collect();
        if entries.is_empty() {
            Self::new()
        } else {
            Self {
                entries: Some(Arc::new(entries)),
            }
        }
    }
}

impl<'a> IntoIterator for &'a Headers {
    type Item = &'a Header;
    type IntoIter = std::slice::Iter<'a, Header>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

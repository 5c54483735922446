//! [`DatabaseUrl`]: a connection URL that keeps its password out of logs.

use std::fmt;
use std::str::FromStr;

use intake_core::ConfigError;

/// A PostgreSQL connection URL, `postgres://user:password@host:port/database?…`.
///
/// `Debug` and `Display` show it with the password (in the user info or a
/// `password=` query parameter) replaced by `***`, so a URL can be logged,
/// put in an error or printed with `{:?}` without leaking the secret.
///
/// ```
/// use intake_postgres::DatabaseUrl;
///
/// let url: DatabaseUrl = "postgres://app:s3cret@db.internal:5432/orders".parse()?;
/// assert_eq!(url.to_string(), "postgres://app:***@db.internal:5432/orders");
/// assert!(!format!("{url:?}").contains("s3cret"));
/// # Ok::<(), intake_core::ConfigError>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct DatabaseUrl {
    url: String,
    redacted: String,
    password: Option<String>,
}

impl DatabaseUrl {
    /// Parses `url`; see [`FromStr`].
    ///
    /// # Errors
    ///
    /// A URL whose scheme is not `postgres://` or `postgresql://`.
    pub fn new(url: &str) -> Result<Self, ConfigError> {
        url.parse()
    }

    /// The URL with its password, for the driver. Never log this.
    pub fn expose(&self) -> &str {
        &self.url
    }

    /// The URL with the password replaced by `***`.
    pub fn redacted(&self) -> &str {
        &self.redacted
    }

    /// `text` with every occurrence of the password replaced by `***`: for a
    /// driver's error message, which may quote the URL.
    pub fn scrub(&self, text: &str) -> String {
        match &self.password {
            Some(password) if !password.is_empty() => text.replace(password.as_str(), "***"),
            _ => text.to_owned(),
        }
    }
}

impl FromStr for DatabaseUrl {
    type Err = ConfigError;

    fn from_str(url: &str) -> Result<Self, ConfigError> {
        let Some((scheme, rest)) = url.split_once("://") else {
            return Err(ConfigError::new(
                "database_url",
                "is not a URL; write it as postgres://user:password@host:5432/database",
            ));
        };
        if !matches!(scheme, "postgres" | "postgresql") {
            return Err(ConfigError::new(
                "database_url",
                format!("has the scheme `{scheme}`; use postgres:// or postgresql://"),
            ));
        }
        let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(authority_end);
        let (user_info, host) = match authority.rsplit_once('@') {
            Some((user_info, host)) => (Some(user_info), host),
            None => (None, authority),
        };

        let mut password = None;
        let mut redacted = format!("{scheme}://");
        if let Some(user_info) = user_info {
            match user_info.split_once(':') {
                Some((user, secret)) => {
                    password = Some(secret.to_owned());
                    redacted.push_str(user);
                    redacted.push_str(":***");
                }
                None => redacted.push_str(user_info),
            }
            redacted.push('@');
        }
        redacted.push_str(host);

        let (path, query) = match tail.split_once('?') {
            Some((path, query)) => (path, Some(query)),
            None => (tail, None),
        };
        redacted.push_str(path);
        if let Some(query) = query {
            redacted.push('?');
            for (index, parameter) in query.split('&').enumerate() {
                if index > 0 {
                    redacted.push('&');
                }
                match parameter.split_once('=') {
                    Some(("password", secret)) => {
                        password.get_or_insert_with(|| secret.to_owned());
                        redacted.push_str("password=***");
                    }
                    _ => redacted.push_str(parameter),
                }
            }
        }

        Ok(Self {
            url: url.to_owned(),
            redacted,
            password,
        })
    }
}

impl fmt::Display for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted)
    }
}

impl fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("DatabaseUrl").field(&self.redacted).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_password_in_the_user_info_is_redacted() {
        let url = DatabaseUrl::new("postgresql://app:p%40ss@db:5432/test?sslmode=require").unwrap();
        assert_eq!(
            url.redacted(),
            "postgresql://app:***@db:5432/test?sslmode=require"
        );
        assert_eq!(
            format!("{url:?}"),
            "DatabaseUrl(\"postgresql://app:***@db:5432/test?sslmode=require\")"
        );
        assert_eq!(
            url.expose(),
            "postgresql://app:p%40ss@db:5432/test?sslmode=require"
        );
    }

    #[test]
    fn a_password_query_parameter_is_redacted() {
        let url = DatabaseUrl::new("postgres://db/test?user=app&password=hunter2&x=1").unwrap();
        assert_eq!(
            url.to_string(),
            "postgres://db/test?user=app&password=***&x=1"
        );
        assert_eq!(
            url.scrub("bad password hunter2 for app"),
            "bad password *** for app"
        );
    }

    #[test]
    fn a_url_without_credentials_is_shown_as_is() {
        let url = DatabaseUrl::new("postgres://postgres@127.0.0.1:5432/test").unwrap();
        assert_eq!(url.to_string(), "postgres://postgres@127.0.0.1:5432/test");
        assert_eq!(url.scrub("anything"), "anything");
    }

    #[test]
    fn a_password_containing_at_signs_stays_hidden() {
        let url = DatabaseUrl::new("postgres://app:a@b@db/test").unwrap();
        assert_eq!(url.to_string(), "postgres://app:***@db/test");
    }

    #[test]
    fn other_schemes_are_refused() {
        let error = DatabaseUrl::new("mysql://root@db/test").unwrap_err();
        assert!(error.problem.contains("postgres://"), "{error}");
        assert!(DatabaseUrl::new("db:5432").is_err());
        assert!(DatabaseUrl::new("postgres:///test?host=/run/postgresql").is_ok());
    }
}

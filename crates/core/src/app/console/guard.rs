//! The guard every mutating console route passes first: no request from
//! another site, and the bearer token in the `Authorization` header.
//!
//! A browser sends an operator's cookies with a request another site's
//! page makes, so a cookie proves nothing about who asked: the token is
//! read from the header only, which a cross-site page cannot set without a
//! CORS preflight the console never grants. On top of that, a request
//! that says it comes from another site is refused even with the token:
//! `Sec-Fetch-Site` anything but `same-origin` or `none` (a browser's
//! own navigation, or a client that is no browser), or an `Origin` that is
//! neither the service's own (its `Host`) nor one
//! [allowed](super::ConsoleSettings::allow_origin).

use http::{HeaderMap, StatusCode, header};

use super::settings::ConsoleSettings;

/// Why a mutating request was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Denied {
    /// No token is set: mutations are off.
    Disabled,
    /// The request comes from another site (`Sec-Fetch-Site`, `Origin`).
    CrossSite,
    /// No `Authorization: Bearer` header (or more than one).
    MissingToken,
    /// A token that is not the console's.
    WrongToken,
}

impl Denied {
    /// The status to answer with.
    pub(super) fn status(self) -> StatusCode {
        match self {
            Denied::Disabled | Denied::CrossSite => StatusCode::FORBIDDEN,
            Denied::MissingToken | Denied::WrongToken => StatusCode::UNAUTHORIZED,
        }
    }

    /// Why, for the answer and the audit log (never quoting the request).
    pub(super) fn reason(self) -> &'static str {
        match self {
            Denied::Disabled => "mutations are off: no console token is set",
            Denied::CrossSite => "refused: the request comes from another site",
            Denied::MissingToken => "an `Authorization: Bearer` token is required",
            Denied::WrongToken => "the token is not the console's",
        }
    }
}

/// Whether a mutating request with `headers` may go on: see the [module
/// docs](self).
pub(super) fn authorize(settings: &ConsoleSettings, headers: &HeaderMap) -> Result<(), Denied> {
    if cross_site(settings, headers) {
        return Err(Denied::CrossSite);
    }
    let Some(token) = &settings.token else {
        return Err(Denied::Disabled);
    };
    let mut values = headers.get_all(header::AUTHORIZATION).iter();
    let (Some(value), None) = (values.next(), values.next()) else {
        return Err(Denied::MissingToken);
    };
    let value = value.as_bytes();
    let scheme = b"bearer ";
    let offered = match value.get(..scheme.len()) {
        Some(prefix) if prefix.eq_ignore_ascii_case(scheme) => &value[scheme.len()..],
        _ => return Err(Denied::MissingToken),
    };
    if token.matches(offered) {
        Ok(())
    } else {
        Err(Denied::WrongToken)
    }
}

/// Whether the headers say the request comes from another site.
fn cross_site(settings: &ConsoleSettings, headers: &HeaderMap) -> bool {
    for value in headers.get_all("sec-fetch-site") {
        if !matches!(value.as_bytes(), b"same-origin" | b"none") {
            return true;
        }
    }
    let mut origins = headers.get_all(header::ORIGIN).iter();
    let origin = match (origins.next(), origins.next()) {
        (None, _) => return false,
        (Some(origin), None) => origin,
        (Some(_), Some(_)) => return true,
    };
    let Ok(origin) = origin.to_str() else {
        return true;
    };
    if settings
        .allowed_origins
        .iter()
        .any(|allowed| allowed.eq_ignore_ascii_case(origin))
    {
        return false;
    }
    // `null` (a sandboxed frame, a file) and anything without a scheme
    // is no site of ours.
    let Some((_, authority)) = origin.split_once("://") else {
        return true;
    };
    let host = headers
        .get(header::HOST)
        .and_then(|host| host.to_str().ok());
    !host.is_some_and(|host| host.eq_ignore_ascii_case(authority))
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;
    use crate::app::console::ConsoleToken;

    const TOKEN: &str = "0123456789abcdef0123456789abcdef";

    fn settings() -> ConsoleSettings {
        ConsoleSettings::default().token(ConsoleToken::new(TOKEN).unwrap())
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.append(*name, HeaderValue::from_str(value).unwrap());
        }
        headers
    }

    fn bearer() -> String {
        format!("Bearer {TOKEN}")
    }

    #[test]
    fn the_token_in_the_authorization_header_is_required() {
        let settings = settings();
        assert_eq!(
            authorize(&settings, &headers(&[("authorization", &bearer())])),
            Ok(())
        );
        let lower = format!("bearer {TOKEN}");
        assert_eq!(
            authorize(&settings, &headers(&[("authorization", &lower)])),
            Ok(())
        );
        assert_eq!(
            authorize(&settings, &headers(&[])),
            Err(Denied::MissingToken)
        );
        assert_eq!(
            authorize(
                &settings,
                &headers(&[("authorization", &format!("Basic {TOKEN}"))])
            ),
            Err(Denied::MissingToken)
        );
        assert_eq!(
            authorize(
                &settings,
                &headers(&[("authorization", "Bearer 0123456789abcdef")])
            ),
            Err(Denied::WrongToken)
        );
        assert_eq!(
            authorize(
                &settings,
                &headers(&[("authorization", &format!("Bearer {TOKEN}x"))])
            ),
            Err(Denied::WrongToken)
        );
        assert_eq!(
            authorize(
                &settings,
                &headers(&[("authorization", &bearer()), ("authorization", &bearer())])
            ),
            Err(Denied::MissingToken),
            "two tokens are no token"
        );
    }

    #[test]
    fn a_cookie_is_never_a_token() {
        let cookie = format!("token={TOKEN}; intake_console_token={TOKEN}");
        assert_eq!(
            authorize(&settings(), &headers(&[("cookie", &cookie)])),
            Err(Denied::MissingToken)
        );
    }

    #[test]
    fn without_a_token_set_every_mutation_is_refused() {
        let settings = ConsoleSettings::default();
        assert_eq!(
            authorize(&settings, &headers(&[("authorization", &bearer())])),
            Err(Denied::Disabled)
        );
        assert_eq!(Denied::Disabled.status(), StatusCode::FORBIDDEN);
    }

    #[test]
    fn a_request_from_another_site_is_refused_even_with_the_token() {
        let settings = settings();
        let bearer = bearer();
        for site in ["cross-site", "same-site", "something-new"] {
            let request = headers(&[("authorization", &bearer), ("sec-fetch-site", site)]);
            assert_eq!(
                authorize(&settings, &request),
                Err(Denied::CrossSite),
                "{site}"
            );
        }
        for site in ["same-origin", "none"] {
            let request = headers(&[("authorization", &bearer), ("sec-fetch-site", site)]);
            assert_eq!(authorize(&settings, &request), Ok(()), "{site}");
        }
        let host = ("host", "127.0.0.1:9898");
        for origin in [
            "https://evil.example",
            "null",
            "http://127.0.0.1:9899",
            "127.0.0.1:9898",
        ] {
            let request = headers(&[("authorization", &bearer), host, ("origin", origin)]);
            assert_eq!(
                authorize(&settings, &request),
                Err(Denied::CrossSite),
                "{origin}"
            );
        }
        let own = headers(&[
            ("authorization", &bearer),
            host,
            ("origin", "http://127.0.0.1:9898"),
        ]);
        assert_eq!(authorize(&settings, &own), Ok(()));
        let no_host = headers(&[
            ("authorization", &bearer),
            ("origin", "http://127.0.0.1:9898"),
        ]);
        assert_eq!(authorize(&settings, &no_host), Err(Denied::CrossSite));
        assert_eq!(Denied::CrossSite.status(), StatusCode::FORBIDDEN);
    }

    #[test]
    fn an_allowed_origin_passes_behind_a_proxy() {
        let settings = settings().allow_origin("https://console.example.com");
        let request = headers(&[
            ("authorization", &bearer()),
            ("host", "10.0.0.7:9898"),
            ("origin", "https://console.example.com"),
        ]);
        assert_eq!(authorize(&settings, &request), Ok(()));
    }

    #[test]
    fn no_reason_quotes_the_request() {
        for denied in [
            Denied::Disabled,
            Denied::CrossSite,
            Denied::MissingToken,
            Denied::WrongToken,
        ] {
            assert!(!denied.reason().contains(TOKEN));
        }
    }
}

//! The console's HTTP API, version 1: the routes under `/console/api/v1/`,
//! their query parameters, and the JSON they answer (see
//! `docs/CONSOLE.md`).
//!
//! Paths and queries are outside input: a request too long is refused
//! before it is read further, a route name is percent-decoded and must be
//! UTF-8, numbers must parse, and nothing in a request can make the answer
//! grow past its bounds (a page of partitions, a route's ring of samples).
//! Every method but `GET` and `HEAD` passes the mutation guard first
//! ([`guard::authorize`]), and refusals are audited.

use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use serde::Serialize;

use super::audit::AuditEntry;
use super::guard;
use super::history::Sample;
use super::view::{Now, PartitionPage, RouteView};
use super::{Console, MAX_PAGE};

/// Where version 1 of the API lives.
pub(super) const PREFIX: &str = "/console/api/v1";

/// The longest path answered.
pub(super) const MAX_PATH: usize = 2_048;

/// The longest query answered.
pub(super) const MAX_QUERY: usize = 2_048;

/// A page's size unless the query says.
const DEFAULT_PAGE: usize = 500;

/// The most bytes of a refused request's path the audit log quotes.
const MAX_AUDITED_PATH: usize = 256;

/// What a path asks for.
#[derive(Debug, PartialEq, Eq)]
enum Endpoint {
    Index,
    Routes,
    Route(String),
    Partitions(String),
    History,
    Audit,
    Group,
}

/// Why a request cannot be answered, as a status and a reason.
pub(super) type Refusal = (StatusCode, &'static str);

#[derive(Serialize)]
struct Index<'a> {
    api: &'static str,
    instance: &'a str,
    routes: Vec<String>,
    sample_interval_ms: u64,
    history_samples: usize,
    max_page: usize,
    /// `off` without a token, `token` with one.
    mutations: &'static str,
    /// What this version can do besides reading.
    actions: [&'static str; 4],
    /// The routes whose dead letters the explorer shows.
    dead_letters: Vec<String>,
}

#[derive(Serialize)]
struct Routes<'a> {
    instance: &'a str,
    routes: Vec<RouteView>,
}

#[derive(Serialize)]
struct RouteSamples {
    route: String,
    samples: Vec<Sample>,
}

#[derive(Serialize)]
struct HistoryAnswer {
    sample_interval_ms: u64,
    capacity: usize,
    routes: Vec<RouteSamples>,
}

#[derive(Serialize)]
struct AuditAnswer {
    entries: Vec<AuditEntry>,
}

#[derive(Serialize)]
struct ErrorAnswer<'a> {
    error: &'a str,
}

/// The answer to `request` (a path under `/console/`).
pub(super) fn respond<B>(console: &Console, request: &Request<B>) -> Response<String> {
    match answer(console, request) {
        Ok(response) => response,
        Err((status, reason)) => error(status, reason),
    }
}

fn answer<B>(console: &Console, request: &Request<B>) -> Result<Response<String>, Refusal> {
    let uri = request.uri();
    let path = uri.path();
    let query = uri.query().unwrap_or("");
    if path.len() > MAX_PATH || query.len() > MAX_QUERY {
        return Err((StatusCode::URI_TOO_LONG, "the path or query is too long"));
    }
    if super::dead_letters::parse(path).is_some() {
        // They read a store and a body: `Console::respond_with_body`.
        return Err((
            StatusCode::NOT_IMPLEMENTED,
            "the dead-letter routes are served by the HealthListener (Console::respond_with_body)",
        ));
    }
    if let Some(answer) = super::control::answer(console, request) {
        return answer;
    }
    let endpoint = endpoint(path)?;
    let method = request.method();
    if method != Method::GET && method != Method::HEAD {
        return Err(refuse_mutation(console, request));
    }
    match endpoint {
        Endpoint::Index => json(&index(console)),
        Endpoint::Routes => json(&Routes {
            instance: console.settings().instance_id(),
            routes: console.routes(),
        }),
        Endpoint::Route(name) => match console.route(&name) {
            Some(route) => json(&route),
            None => Err((StatusCode::NOT_FOUND, "no such route")),
        },
        Endpoint::Partitions(name) => {
            let page = partitions(console, &name, query)?;
            json(&page)
        }
        Endpoint::History => json(&history(console, query)?),
        Endpoint::Audit => json(&AuditAnswer {
            entries: console.audit_log(),
        }),
        Endpoint::Group => json(&console.group_answer()),
    }
}

/// What `path` asks for, if it is one of the API's.
fn endpoint(path: &str) -> Result<Endpoint, Refusal> {
    const NOT_FOUND: Refusal = (StatusCode::NOT_FOUND, "no such console route");
    let rest = path.strip_prefix(PREFIX).ok_or(NOT_FOUND)?;
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.is_empty() {
        return Ok(Endpoint::Index);
    }
    let rest = rest.strip_prefix('/').ok_or(NOT_FOUND)?;
    let segments: Vec<&str> = rest.splitn(4, '/').collect();
    let route = |segment: &str| {
        decode(segment, false).ok_or((StatusCode::BAD_REQUEST, "the route name is not valid UTF-8"))
    };
    match segments.as_slice() {
        ["routes"] => Ok(Endpoint::Routes),
        ["routes", name] if !name.is_empty() => Ok(Endpoint::Route(route(name)?)),
        ["routes", name, "partitions"] if !name.is_empty() => {
            Ok(Endpoint::Partitions(route(name)?))
        }
        ["history"] => Ok(Endpoint::History),
        ["audit"] => Ok(Endpoint::Audit),
        ["group"] => Ok(Endpoint::Group),
        _ => Err(NOT_FOUND),
    }
}

/// A request with another method than `GET` or `HEAD`: through the guard
/// (refusals audited), then `405`, since no route of this version mutates.
fn refuse_mutation<B>(console: &Console, request: &Request<B>) -> Refusal {
    let what = format!(
        "{} {}",
        request.method(),
        capped(request.uri().path(), MAX_AUDITED_PATH)
    );
    let now = Now::new().unix_now_ms();
    match guard::authorize(console.settings(), request.headers()) {
        Err(denied) => {
            console.audit(AuditEntry::new(
                now,
                "anonymous",
                what,
                "console",
                format!("refused: {}", denied.reason()),
            ));
            (denied.status(), denied.reason())
        }
        Ok(()) => (
            StatusCode::METHOD_NOT_ALLOWED,
            "this version of the console API only reads",
        ),
    }
}

fn index(console: &Console) -> Index<'_> {
    let settings = console.settings();
    Index {
        api: "v1",
        instance: settings.instance_id(),
        routes: console.health().map_routes(|name, _| name.to_owned()),
        sample_interval_ms: super::view::millis(settings.sample_interval),
        history_samples: settings.samples(),
        max_page: MAX_PAGE,
        mutations: if settings.has_token() { "token" } else { "off" },
        actions: [
            "dead_letters.replay",
            "dead_letters.purge",
            "routes.pause",
            "routes.resume",
        ],
        dead_letters: console.dead_letter_routes(),
    }
}

fn partitions(console: &Console, route: &str, query: &str) -> Result<PartitionPage, Refusal> {
    let mut offset = 0;
    let mut limit = DEFAULT_PAGE;
    for (key, value) in pairs(query)? {
        match key.as_str() {
            "offset" => offset = number(&value)?,
            "limit" => limit = number(&value)?,
            _ => {}
        }
    }
    console
        .partitions(route, offset, limit)
        .ok_or((StatusCode::NOT_FOUND, "no such route"))
}

fn history(console: &Console, query: &str) -> Result<HistoryAnswer, Refusal> {
    let mut route = None;
    let mut since = 0;
    for (key, value) in pairs(query)? {
        match key.as_str() {
            "route" => route = Some(value),
            "since" => since = number(&value)?,
            _ => {}
        }
    }
    let names = console.health().map_routes(|name, _| name.to_owned());
    let names: Vec<String> = match route {
        Some(route) if names.contains(&route) => vec![route],
        Some(_) => return Err((StatusCode::NOT_FOUND, "no such route")),
        None => names,
    };
    let settings = console.settings();
    Ok(HistoryAnswer {
        sample_interval_ms: super::view::millis(settings.sample_interval),
        capacity: settings.samples(),
        routes: names
            .into_iter()
            .map(|route| RouteSamples {
                samples: console.history(&route, since),
                route,
            })
            .collect(),
    })
}

/// The `key=value` pairs of `query`, percent-decoded (`+` is a space).
pub(super) fn pairs(query: &str) -> Result<Vec<(String, String)>, Refusal> {
    const BAD: Refusal = (StatusCode::BAD_REQUEST, "the query is not valid");
    query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            Ok((
                decode(key, true).ok_or(BAD)?,
                decode(value, true).ok_or(BAD)?,
            ))
        })
        .collect()
}

pub(super) fn number<T: std::str::FromStr>(value: &str) -> Result<T, Refusal> {
    value.parse().map_err(|_| {
        (
            StatusCode::BAD_REQUEST,
            "a number in the query is not valid",
        )
    })
}

/// `text` percent-decoded (with `+` as a space when `plus_is_space`), if
/// every escape is two hex digits and the result is UTF-8.
pub(super) fn decode(text: &str, plus_is_space: bool) -> Option<String> {
    let bytes = text.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while let Some(&byte) = bytes.get(index) {
        match byte {
            b'%' => {
                let high = hex(*bytes.get(index + 1)?)?;
                let low = hex(*bytes.get(index + 2)?)?;
                decoded.push(high << 4 | low);
                index += 3;
            }
            b'+' if plus_is_space => {
                decoded.push(b' ');
                index += 1;
            }
            _ => {
                decoded.push(byte);
                index += 1;
            }
        }
    }
    String::from_utf8(decoded).ok()
}

fn hex(digit: u8) -> Option<u8> {
    match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'a'..=b'f' => Some(digit - b'a' + 10),
        b'A'..=b'F' => Some(digit - b'A' + 10),
        _ => None,
    }
}

/// `text` cut to `max` bytes at a character boundary.
pub(super) fn capped(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

pub(super) fn json<T: Serialize>(value: &T) -> Result<Response<String>, Refusal> {
    let body = serde_json::to_string(value).map_err(|error| {
        tracing::warn!(%error, "the console could not encode its answer");
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            "the answer could not be encoded",
        )
    })?;
    Ok(with_headers(StatusCode::OK, body))
}

pub(super) fn error(status: StatusCode, reason: &str) -> Response<String> {
    let body = serde_json::to_string(&ErrorAnswer { error: reason })
        .unwrap_or_else(|_| String::from(r#"{"error":"error"}"#));
    let mut response = with_headers(status, body);
    if status == StatusCode::METHOD_NOT_ALLOWED {
        response
            .headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
    }
    if status == StatusCode::UNAUTHORIZED {
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    response
}

fn with_headers(status: StatusCode, body: String) -> Response<String> {
    let mut response = Response::new(body);
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    // Operators' state, fresh each time, never to be sniffed as HTML.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_their_endpoint_and_route_names_are_decoded() {
        assert_eq!(endpoint("/console/api/v1"), Ok(Endpoint::Index));
        assert_eq!(endpoint("/console/api/v1/"), Ok(Endpoint::Index));
        assert_eq!(endpoint("/console/api/v1/routes"), Ok(Endpoint::Routes));
        assert_eq!(
            endpoint("/console/api/v1/routes/a%2Fb%20c"),
            Ok(Endpoint::Route("a/b c".to_owned()))
        );
        assert_eq!(
            endpoint("/console/api/v1/routes/orders/partitions"),
            Ok(Endpoint::Partitions("orders".to_owned()))
        );
        assert_eq!(endpoint("/console/api/v1/history"), Ok(Endpoint::History));
        for path in [
            "/console/api/v2/routes",
            "/console/api/v1routes",
            "/console/api/v1/routes//partitions",
            "/console/api/v1/routes/a/partitions/x",
            "/console/api/v1/nothing",
        ] {
            assert_eq!(
                endpoint(path).map_err(|e| e.0),
                Err(StatusCode::NOT_FOUND),
                "{path}"
            );
        }
        assert_eq!(
            endpoint("/console/api/v1/routes/%FF").map_err(|e| e.0),
            Err(StatusCode::BAD_REQUEST)
        );
    }

    #[test]
    fn decoding_refuses_broken_escapes_and_never_panics() {
        assert_eq!(decode("a+b%21", true).as_deref(), Some("a b!"));
        assert_eq!(decode("a+b", false).as_deref(), Some("a+b"));
        for broken in ["%", "%2", "%zz", "%+1", "%-1", "%C3"] {
            assert_eq!(decode(broken, true), None, "{broken}");
        }
        assert_eq!(decode("%C3%A9", true).as_deref(), Some("\u{e9}"));
        assert_eq!(capped("\u{e9}\u{e9}", 3), "\u{e9}");
        assert!(pairs("limit=1&&offset=%zz").is_err());
        assert_eq!(
            pairs("route=a%26b&since").unwrap(),
            vec![
                ("route".into(), "a&b".into()),
                ("since".into(), String::new())
            ]
        );
        assert!(number::<usize>("-1").is_err());
        assert!(number::<u64>("99999999999999999999999").is_err());
    }
}

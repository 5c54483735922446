//! The dead-letter explorer's routes, under
//! `/console/api/v1/routes/{route}/dead_letters`: a page of letters with
//! filters, text search and a cursor; one letter in full; replay and purge
//! of exactly the set a dry run confirmed ([`actions`](super::actions)).
//!
//! A route's letters come from the [`DeadLetterStore`] given to
//! [`Console::dead_letters`]. Reading a store is asynchronous, so these
//! routes are answered by [`Console::respond_with_body`] (what the
//! [`HealthListener`](crate::app::HealthListener) calls), not by the
//! synchronous [`Console::respond`].

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use serde::Serialize;

use super::actions::{self, Pending};
use super::api::{self, Refusal};
use super::letter_view::{self, LetterQuery, LetterRow, SummaryView};
use super::{Console, lock};
use crate::dead_letter::store::{DeadLetterStore, LetterId, StoreError, StoredLetter};

/// A page's size unless the query says.
const DEFAULT_LIMIT: usize = 50;

/// The most letters one page holds.
pub const MAX_LETTERS: usize = 200;

/// The most letters one listing looks at when it searches text: a search
/// that finds fewer answers with a cursor to go on from.
const MAX_SCAN: usize = 2_000;

/// The segment after a route's name.
const SEGMENT: &str = "dead_letters";

/// A store as the console holds it.
pub(super) type Store = Arc<dyn DeadLetterStore>;

/// The stores by route, and the dry runs waiting for their confirmation.
#[derive(Default)]
pub(super) struct Explorer {
    stores: Mutex<HashMap<String, Store>>,
    pub(super) pending: Mutex<Vec<Pending>>,
}

impl std::fmt::Debug for Explorer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut routes: Vec<String> = lock(&self.stores).keys().cloned().collect();
        routes.sort();
        f.debug_struct("Explorer")
            .field("routes", &routes)
            .finish_non_exhaustive()
    }
}

/// What a path under a route's `dead_letters` asks for.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Path {
    /// The listing.
    List(String),
    /// One letter: the route and the id.
    Letter(String, String),
    /// `replay` (POST) of a route's letters.
    Replay(String),
    /// `purge` (POST) of a route's letters.
    Purge(String),
}

impl Path {
    fn route(&self) -> &str {
        match self {
            Path::List(route)
            | Path::Letter(route, _)
            | Path::Replay(route)
            | Path::Purge(route) => route,
        }
    }
}

/// `None` for a path that is not the explorer's; otherwise what it asks
/// for, or why it is not valid.
pub(super) fn parse(path: &str) -> Option<Result<Path, Refusal>> {
    let rest = path.strip_prefix(api::PREFIX)?.strip_prefix("/routes/")?;
    let mut segments = rest.splitn(3, '/');
    let route = segments.next()?;
    if route.is_empty() || segments.next()? != SEGMENT {
        return None;
    }
    let Some(route) = api::decode(route, false) else {
        return Some(Err((
            StatusCode::BAD_REQUEST,
            "the route name is not valid UTF-8",
        )));
    };
    Some(match segments.next() {
        None | Some("") => Ok(Path::List(route)),
        Some("replay") => Ok(Path::Replay(route)),
        Some("purge") => Ok(Path::Purge(route)),
        Some(id) if !id.contains('/') => match api::decode(id, false) {
            Some(id) => Ok(Path::Letter(route, id)),
            None => Err((StatusCode::BAD_REQUEST, "the letter id is not valid UTF-8")),
        },
        Some(_) => Err((StatusCode::NOT_FOUND, "no such console route")),
    })
}

impl Console {
    /// Shows route `route`'s dead letters from `store` (the one its broker
    /// gives, [`Broker::dead_letter_store`](crate::backend::Broker::dead_letter_store)):
    /// the explorer's listing, letters in full under the
    /// [redaction policy](super::ConsoleSettings::redaction), replay and
    /// purge of a confirmed set (with the token). See `docs/CONSOLE.md`.
    pub fn dead_letters(
        self,
        route: impl Into<String>,
        store: impl DeadLetterStore + 'static,
    ) -> Self {
        lock(&self.inner.dead_letters.stores).insert(route.into(), Arc::new(store) as Store);
        self
    }

    /// The answer to `request` (a path under `/console/`) with its body
    /// read, from the peer at `peer` if known: the dead-letter routes,
    /// which read a store and take a JSON body, and everything
    /// [`respond`](Self::respond) answers.
    pub async fn respond_with_body(
        &self,
        request: &Request<Bytes>,
        peer: Option<SocketAddr>,
    ) -> Response<String> {
        let path = request.uri().path();
        let query = request.uri().query().unwrap_or("");
        if path.len() > api::MAX_PATH || query.len() > api::MAX_QUERY {
            return api::error(StatusCode::URI_TOO_LONG, "the path or query is too long");
        }
        if let Some(answer) = super::control::answer_with_group(self, request, peer).await {
            return answer.unwrap_or_else(|(status, reason)| api::error(status, reason));
        }
        match parse(path) {
            None => self.respond(request),
            Some(Err((status, reason))) => api::error(status, reason),
            Some(Ok(path)) => match self.explore(request, path, peer).await {
                Ok(response) => response,
                Err((status, reason)) => api::error(status, reason),
            },
        }
    }

    fn store(&self, route: &str) -> Option<Store> {
        lock(&self.inner.dead_letters.stores).get(route).cloned()
    }

    /// The routes with a store, sorted.
    pub(super) fn dead_letter_routes(&self) -> Vec<String> {
        let mut routes: Vec<String> = lock(&self.inner.dead_letters.stores)
            .keys()
            .cloned()
            .collect();
        routes.sort();
        routes
    }

    async fn explore(
        &self,
        request: &Request<Bytes>,
        path: Path,
        peer: Option<SocketAddr>,
    ) -> Result<Response<String>, Refusal> {
        let method = request.method();
        let reading = method == Method::GET || method == Method::HEAD;
        if !reading {
            // Through the guard before anything else, refusals audited.
            actions::authorize(self, request, peer)?;
        }
        let store = self
            .store(path.route())
            .ok_or((StatusCode::NOT_FOUND, "no dead-letter store for this route"))?;
        match (path, reading) {
            (Path::List(route), true) => {
                let query = request.uri().query().unwrap_or("");
                api::json(&self.list(&route, &store, query).await?)
            }
            (Path::Letter(_, id), true) => {
                let stored = read(&store, &LetterId::from(id)).await?;
                api::json(&letter_view::full(&stored, &self.settings().redaction))
            }
            (Path::Replay(route), false) if method == Method::POST => {
                actions::replay(self, &route, store, request.body(), peer).await
            }
            (Path::Purge(route), false) if method == Method::POST => {
                actions::purge(self, &route, store, request.body(), peer).await
            }
            _ => Err((
                StatusCode::METHOD_NOT_ALLOWED,
                "GET the listing and letters; POST replay and purge",
            )),
        }
    }

    async fn list(&self, route: &str, store: &Store, query: &str) -> Result<Listing, Refusal> {
        const BAD: Refusal = (StatusCode::BAD_REQUEST, "the query is not valid");
        let mut letters = LetterQuery::default();
        let mut cursor = None;
        let mut limit = DEFAULT_LIMIT;
        for (key, value) in api::pairs(query)? {
            match key.as_str() {
                "class" => letters.class = Some(value),
                "key" => letters.key = Some(value),
                "from" => letters.from = Some(api::number(&value)?),
                "until" => letters.until = Some(api::number(&value)?),
                "q" => letters.q = Some(value),
                "cursor" if !value.is_empty() => cursor = Some(LetterId::from(value)),
                "limit" => limit = api::number(&value)?,
                _ => {}
            }
        }
        let filter = letters.filter().map_err(|reason| (BAD.0, reason))?;
        let limit = limit.clamp(1, MAX_LETTERS);
        let redaction = &self.settings().redaction;
        let needle = letters.needle();
        let summary = match cursor {
            // The counts once, with the first page: a summary reads the
            // whole store.
            None => Some(SummaryView::from(
                store.summary(&filter).await.map_err(failed)?,
            )),
            Some(_) => None,
        };
        let mut rows = Vec::new();
        let mut scanned = 0;
        let mut after = cursor;
        let mut next = None;
        'pages: loop {
            let page = store
                .list(&filter, limit.max(DEFAULT_LIMIT), after.as_ref())
                .await
                .map_err(failed)?;
            for bare in &page.letters {
                scanned += 1;
                // A listing leaves the payload out: read what is shown.
                let stored = match store.read(&bare.id).await {
                    Ok(stored) => stored,
                    // Replayed or purged since the listing: not there.
                    Err(StoreError::NotFound { .. }) => continue,
                    Err(error) => return Err(failed(error)),
                };
                let row = letter_view::row(&stored, redaction);
                let keep = needle.as_deref().is_none_or(|needle| {
                    let payload = redaction
                        .shows_payload()
                        .then(|| row.payload_text())
                        .flatten();
                    letter_view::holds(&stored, needle, payload)
                });
                if keep {
                    rows.push(row);
                }
                if rows.len() >= limit || scanned >= MAX_SCAN {
                    next = Some(bare.id.to_string());
                    break 'pages;
                }
            }
            match page.next {
                // A store whose cursor does not move is read no further.
                Some(id) if after.as_ref() != Some(&id) && scanned < MAX_SCAN => after = Some(id),
                _ => break,
            }
        }
        Ok(Listing {
            route: route.to_owned(),
            destination: store.destination().to_owned(),
            redaction: redaction.name(),
            summary,
            letters: rows,
            scanned,
            next,
        })
    }
}

/// Letter `id` of `store`, or `404`.
async fn read(store: &Store, id: &LetterId) -> Result<StoredLetter, Refusal> {
    match store.read(id).await {
        Ok(stored) => Ok(stored),
        Err(StoreError::NotFound { .. } | StoreError::InvalidId { .. }) => {
            Err((StatusCode::NOT_FOUND, "no such letter"))
        }
        Err(error) => Err(failed(error)),
    }
}

/// A store's failure as an answer: `502`, its cause logged (a broker's
/// error may name hosts; the answer does not).
pub(super) fn failed(error: StoreError) -> Refusal {
    tracing::warn!(%error, cause = ?std::error::Error::source(&error), "the console's dead-letter store failed");
    (
        StatusCode::BAD_GATEWAY,
        "the dead-letter store failed; see the service's log",
    )
}

/// A page of the explorer's listing.
#[derive(Debug, Serialize)]
struct Listing {
    route: String,
    destination: String,
    /// The payload policy: `off`, `hash` or `custom`.
    redaction: &'static str,
    /// Counts per class of what the filter selects (text search aside), on
    /// the first page only.
    #[serde(skip_serializing_if = "Option::is_none")]
    summary: Option<SummaryView>,
    letters: Vec<LetterRow>,
    /// How many letters this page looked at.
    scanned: usize,
    /// The cursor of the next page; absent at the end.
    #[serde(skip_serializing_if = "Option::is_none")]
    next: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explorer_paths_are_told_from_the_others() {
        let route = |path: &str| parse(path).map(|parsed| parsed.map_err(|refusal| refusal.0));
        assert_eq!(route("/console/api/v1/routes/orders"), None);
        assert_eq!(route("/console/api/v1/routes/orders/partitions"), None);
        assert_eq!(
            route("/console/api/v1/routes/a%2Fb/dead_letters"),
            Some(Ok(Path::List("a/b".into())))
        );
        assert_eq!(
            route("/console/api/v1/routes/o/dead_letters/"),
            Some(Ok(Path::List("o".into())))
        );
        assert_eq!(
            route("/console/api/v1/routes/o/dead_letters/1700-0"),
            Some(Ok(Path::Letter("o".into(), "1700-0".into())))
        );
        assert_eq!(
            route("/console/api/v1/routes/o/dead_letters/replay"),
            Some(Ok(Path::Replay("o".into())))
        );
        assert_eq!(
            route("/console/api/v1/routes/o/dead_letters/purge"),
            Some(Ok(Path::Purge("o".into())))
        );
        assert_eq!(
            route("/console/api/v1/routes/o/dead_letters/1/x"),
            Some(Err(StatusCode::NOT_FOUND))
        );
        assert_eq!(
            route("/console/api/v1/routes/%FF/dead_letters"),
            Some(Err(StatusCode::BAD_REQUEST))
        );
    }
}

//! Pause and resume through the console: `POST
//! /console/api/v1/routes/{route}/pause` and `.../resume`, with an optional
//! `partition` (and `source`, when the route reads several) in the query.
//! Without a partition the whole route is paused or resumed.
//!
//! Each passes the mutation guard ([`guard::authorize`]) and is audited
//! (who, what, on what, how it ended), refused or done. The pause is this
//! instance's: it reaches the route's consumer here
//! ([`ConsumerControl`](crate::consumer::ConsumerControl)), not the other
//! instances of the group.

use http::{Method, Request, Response, StatusCode};
use serde::Serialize;

use super::api::{self, Refusal};
use super::audit::AuditEntry;
use super::view::Now;
use super::{Console, guard, lock};
use crate::app::AppControl;

/// Which of the two a path asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verb {
    Pause,
    Resume,
}

impl Verb {
    fn name(self) -> &'static str {
        match self {
            Verb::Pause => "pause",
            Verb::Resume => "resume",
        }
    }
}

#[derive(Serialize)]
struct ControlAnswer {
    route: String,
    action: &'static str,
    /// `None`: every partition of the route.
    source: Option<String>,
    partition: Option<u32>,
}

impl Console {
    /// Lets the console pause and resume the app's routes (see
    /// [`App::console`](crate::app::App::console)).
    pub(in crate::app) fn attach_control(&self, control: AppControl) {
        *lock(&self.inner.control) = Some(control);
    }
}

/// The answer to `request` if its path is a route's `pause` or `resume`.
pub(super) fn answer<B>(
    console: &Console,
    request: &Request<B>,
) -> Option<Result<Response<String>, Refusal>> {
    let (route, verb) = parse(request.uri().path())?;
    Some(route.and_then(|route| act(console, request, &route, verb)))
}

/// The route and the verb of a `.../routes/{route}/pause|resume` path.
fn parse(path: &str) -> Option<(Result<String, Refusal>, Verb)> {
    let rest = path.strip_prefix(api::PREFIX)?.strip_prefix("/routes/")?;
    let (name, verb) = rest.rsplit_once('/')?;
    let verb = match verb {
        "pause" => Verb::Pause,
        "resume" => Verb::Resume,
        _ => return None,
    };
    if name.is_empty() || name.contains('/') {
        return None;
    }
    let name = api::decode(name, false)
        .ok_or((StatusCode::BAD_REQUEST, "the route name is not valid UTF-8"));
    Some((name, verb))
}

fn act<B>(
    console: &Console,
    request: &Request<B>,
    route: &str,
    verb: Verb,
) -> Result<Response<String>, Refusal> {
    if request.method() != Method::POST {
        return Err((StatusCode::METHOD_NOT_ALLOWED, "pause and resume take POST"));
    }
    let audit = |actor: &str, target: String, outcome: String| {
        console.audit(AuditEntry::new(
            Now::new().unix_now_ms(),
            actor,
            verb.name(),
            target,
            outcome,
        ));
    };
    if let Err(denied) = guard::authorize(console.settings(), request.headers()) {
        audit(
            "anonymous",
            format!("route {}", api::capped(route, 256)),
            format!("refused: {}", denied.reason()),
        );
        return Err((denied.status(), denied.reason()));
    }
    let (source, partition) = target(console, route, request.uri().query().unwrap_or(""))?;
    let control = lock(&console.inner.control)
        .as_ref()
        .and_then(|control| control.route(route));
    let Some(control) = control else {
        return Err((StatusCode::NOT_FOUND, "no such route (or no app attached)"));
    };
    let what = match (&source, partition) {
        (Some(source), Some(partition)) => {
            match verb {
                Verb::Pause => control.pause_partition(source, partition),
                Verb::Resume => control.resume_partition(source, partition),
            }
            format!("route {route}, partition {source}/{partition}")
        }
        _ => {
            match verb {
                Verb::Pause => control.pause_all(),
                Verb::Resume => control.resume_all(),
            }
            format!("route {route}")
        }
    };
    audit("token", what, "done".to_owned());
    api::json(&ControlAnswer {
        route: route.to_owned(),
        action: verb.name(),
        source,
        partition,
    })
}

/// The partition a query names: `partition` (and `source`, needed only when
/// the route reads that partition number from several sources); none: the
/// whole route.
fn target(
    console: &Console,
    route: &str,
    query: &str,
) -> Result<(Option<String>, Option<u32>), Refusal> {
    let mut source = None;
    let mut partition = None;
    for (key, value) in api::pairs(query)? {
        match key.as_str() {
            "source" => source = Some(value),
            "partition" => partition = Some(api::number::<u32>(&value)?),
            _ => {}
        }
    }
    let Some(partition) = partition else {
        return Ok((None, None));
    };
    if source.is_some() {
        return Ok((source, Some(partition)));
    }
    let sources = console
        .health()
        .map_routes(|name, state| {
            (name == route).then(|| {
                let mut sources: Vec<String> = state
                    .partitions
                    .keys()
                    .map(|key| key.source.to_string())
                    .collect();
                sources.sort();
                sources.dedup();
                sources
            })
        })
        .into_iter()
        .flatten()
        .next()
        .unwrap_or_default();
    match sources.as_slice() {
        [only] => Ok((Some(only.clone()), Some(partition))),
        [] => Err((
            StatusCode::CONFLICT,
            "the route has no partition assigned here yet: name the source (source=...)",
        )),
        _ => Err((
            StatusCode::BAD_REQUEST,
            "the route reads several sources: name one (source=...)",
        )),
    }
}

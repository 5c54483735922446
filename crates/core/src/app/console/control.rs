//! Pause and resume through the console: `POST
//! /console/api/v1/routes/{route}/pause` and `.../resume`, with an optional
//! `partition` (and `source`, when the route reads several) in the query.
//! Without a partition the whole route is paused or resumed.
//!
//! Each passes the mutation guard ([`guard::authorize`]) and is audited
//! (who, what, on what, how it ended), refused or done. Without a group
//! control the pause is this instance's: it reaches the route's consumer
//! here ([`ConsumerControl`](crate::consumer::ConsumerControl)). With one
//! ([`App::group_control`](crate::app::App::group_control)) it is sent
//! through the group's commands log and reaches whichever instance runs the
//! partition, now and after rebalances; that takes a broker round trip, so
//! it is answered by [`Console::respond_with_body`] (async), and the
//! synchronous path answers `501`.

use http::{Method, Request, Response, StatusCode};
use serde::Serialize;

use std::net::SocketAddr;

use super::actions;
use super::api::{self, Refusal};
use super::audit::AuditEntry;
use super::view::Now;
use super::{Console, guard, lock};
use crate::app::AppControl;
use crate::group_control::{GroupCommand, GroupControl};

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
    /// `instance`: applied here; `group`: sent to every instance.
    scope: &'static str,
}

impl Console {
    /// Lets the console pause and resume the app's routes (see
    /// [`App::console`](crate::app::App::console)).
    pub(in crate::app) fn attach_control(&self, control: AppControl) {
        *lock(&self.inner.control) = Some(control);
    }

    /// Sends the console's pauses and resumes through the group (see
    /// [`App::group_control`](crate::app::App::group_control)).
    pub(in crate::app) fn attach_group(&self, group: GroupControl) {
        *lock(&self.inner.group) = Some(group);
    }

    fn group(&self) -> Option<GroupControl> {
        lock(&self.inner.group).clone()
    }
}

/// The answer to `request` if its path is a route's `pause` or `resume`,
/// applied on this instance; with a group control, `501` (see
/// [`answer_with_group`]).
pub(super) fn answer<B>(
    console: &Console,
    request: &Request<B>,
) -> Option<Result<Response<String>, Refusal>> {
    let (route, verb) = parse(request.uri().path())?;
    if console.group().is_some() {
        return Some(Err((
            StatusCode::NOT_IMPLEMENTED,
            "with a group control, pause and resume are served by the HealthListener (Console::respond_with_body)",
        )));
    }
    Some(route.and_then(|route| {
        let action = authorize(console, request, &route, verb, None)?;
        action.apply_here(console)
    }))
}

/// The answer to `request` if its path is a route's `pause` or `resume`
/// and the console has a group control: the command goes through the
/// group's log.
pub(super) async fn answer_with_group<B>(
    console: &Console,
    request: &Request<B>,
    peer: Option<SocketAddr>,
) -> Option<Result<Response<String>, Refusal>> {
    let (route, verb) = parse(request.uri().path())?;
    let group = console.group()?;
    let route = match route {
        Ok(route) => route,
        Err(refusal) => return Some(Err(refusal)),
    };
    let action = match authorize(console, request, &route, verb, peer) {
        Ok(action) => action,
        Err(refusal) => return Some(Err(refusal)),
    };
    Some(action.send(console, &group).await)
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

/// A pause or resume that passed the guard, about to be applied.
struct Action {
    route: String,
    verb: Verb,
    source: Option<String>,
    partition: Option<u32>,
    actor: String,
}

/// Checks `request` (method, guard, target): the action, or the refusal
/// (audited).
fn authorize<B>(
    console: &Console,
    request: &Request<B>,
    route: &str,
    verb: Verb,
    peer: Option<SocketAddr>,
) -> Result<Action, Refusal> {
    if request.method() != Method::POST {
        return Err((StatusCode::METHOD_NOT_ALLOWED, "pause and resume take POST"));
    }
    if let Err(denied) = guard::authorize(console.settings(), request.headers()) {
        console.audit(AuditEntry::new(
            Now::new().unix_now_ms(),
            actions::actor("anonymous", peer),
            verb.name(),
            format!("route {}", api::capped(route, 256)),
            format!("refused: {}", denied.reason()),
        ));
        return Err((denied.status(), denied.reason()));
    }
    let (source, partition) = target(console, route, request.uri().query().unwrap_or(""))?;
    Ok(Action {
        route: route.to_owned(),
        verb,
        source,
        partition,
        actor: actions::actor("token", peer),
    })
}

impl Action {
    fn what(&self) -> String {
        match (&self.source, self.partition) {
            (Some(source), Some(partition)) => {
                format!("route {}, partition {source}/{partition}", self.route)
            }
            _ => format!("route {}", self.route),
        }
    }

    fn audit(&self, console: &Console, outcome: String) {
        console.audit(AuditEntry::new(
            Now::new().unix_now_ms(),
            &self.actor,
            self.verb.name(),
            self.what(),
            outcome,
        ));
    }

    fn answer(self, scope: &'static str) -> Result<Response<String>, Refusal> {
        api::json(&ControlAnswer {
            route: self.route,
            action: self.verb.name(),
            source: self.source,
            partition: self.partition,
            scope,
        })
    }

    /// Applies it to this instance's route.
    fn apply_here(self, console: &Console) -> Result<Response<String>, Refusal> {
        let control = lock(&console.inner.control)
            .as_ref()
            .and_then(|control| control.route(&self.route));
        let Some(control) = control else {
            return Err((StatusCode::NOT_FOUND, "no such route (or no app attached)"));
        };
        match (&self.source, self.partition, self.verb) {
            (Some(source), Some(partition), Verb::Pause) => {
                control.pause_partition(source, partition)
            }
            (Some(source), Some(partition), Verb::Resume) => {
                control.resume_partition(source, partition);
            }
            (_, _, Verb::Pause) => control.pause_all(),
            (_, _, Verb::Resume) => control.resume_all(),
        }
        self.audit(console, "done".to_owned());
        self.answer("instance")
    }

    /// Sends it to every instance of the group.
    async fn send(
        self,
        console: &Console,
        group: &GroupControl,
    ) -> Result<Response<String>, Refusal> {
        let known = lock(&console.inner.control)
            .as_ref()
            .is_some_and(|control| control.route(&self.route).is_some());
        if !known {
            return Err((StatusCode::NOT_FOUND, "no such route (or no app attached)"));
        }
        let instance = group.instance();
        let command = match (&self.source, self.partition, self.verb) {
            (Some(source), Some(partition), Verb::Pause) => {
                GroupCommand::pause_partition(&self.route, source, partition, instance)
            }
            (Some(source), Some(partition), Verb::Resume) => {
                GroupCommand::resume_partition(&self.route, source, partition, instance)
            }
            (_, _, Verb::Pause) => GroupCommand::pause_route(&self.route, instance),
            (_, _, Verb::Resume) => GroupCommand::resume_route(&self.route, instance),
        };
        match group.send(&command).await {
            Ok(()) => {
                self.audit(console, "sent to the group".to_owned());
                self.answer("group")
            }
            Err(error) => {
                tracing::warn!(
                    error = %crate::error::ErrorChain::new(&error),
                    "the console could not send a command to the group"
                );
                self.audit(console, format!("failed: {error}"));
                Err((
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the group's commands log could not be written: try again",
                ))
            }
        }
    }
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

//! OpenTelemetry trace context through message headers (the
//! `opentelemetry` feature): extracted with the global propagator to parent
//! a message's span, injected from the current span into outputs.

use opentelemetry::propagation::{Extractor, Injector};
use opentelemetry::trace::TraceContextExt;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::message::Headers;

/// Reads propagation fields from headers (names compared exactly, as
/// brokers do); a value that is not UTF-8 is absent, as the propagator
/// expects text.
struct HeaderReader<'a>(&'a Headers);

impl Extractor for HeaderReader<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get_str(key)
    }

    fn keys(&self) -> Vec<&str> {
        self.0.iter().map(|header| &*header.name).collect()
    }
}

/// Writes propagation fields into headers, replacing any of the same name.
struct HeaderWriter<'a>(&'a mut Headers);

impl Injector for HeaderWriter<'_> {
    fn set(&mut self, key: &str, value: String) {
        self.0.set(key, value);
    }
}

/// The remote context `headers` carry, per the global propagator.
pub(crate) fn remote_context(headers: &Headers) -> opentelemetry::Context {
    opentelemetry::global::get_text_map_propagator(|propagator| {
        propagator.extract(&HeaderReader(headers))
    })
}

/// Parents `span` on the remote context `headers` carry, if they carry a
/// valid one.
pub(crate) fn parent_on_remote(span: &Span, headers: &Headers) {
    let remote = remote_context(headers);
    if remote.span().span_context().is_valid() {
        // Fails only when no OpenTelemetry layer records the span: nothing
        // to parent then.
        let _ = span.set_parent(remote);
    }
}

/// Links `span` to the remote context `headers` carry, if valid.
pub(crate) fn link_to_remote(span: &Span, headers: &Headers) {
    let remote = remote_context(headers);
    let linked = remote.span().span_context().clone();
    if linked.is_valid() {
        span.add_link(linked);
    }
}

/// Writes the current span's context into `headers` through the global
/// propagator; returns whether it had a valid one to write.
pub(crate) fn inject_current(headers: &mut Headers) -> bool {
    let current = Span::current().context();
    if !current.span().span_context().is_valid() {
        return false;
    }
    opentelemetry::global::get_text_map_propagator(|propagator| {
        propagator.inject_context(&current, &mut HeaderWriter(headers));
    });
    true
}

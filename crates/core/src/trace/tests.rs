use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tower::{Layer, ServiceBuilder, ServiceExt};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Subscriber, subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

use super::*;
use crate::error::HandlerError;
use crate::layer_testing::{Scripted, Step, message};
use crate::message::Headers;
use crate::message::Message;
use std::fmt;
use tracing::Span;

/// Records the fields of every span, by span id.
#[derive(Clone, Default)]
struct SpanFields(Arc<Mutex<HashMap<u64, (&'static str, Fields)>>>);

type Fields = BTreeMap<String, String>;

struct Collect<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Collect<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> tracing_subscriber::Layer<S> for SpanFields {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, _ctx: Context<'_, S>) {
        if let Ok(mut spans) = self.0.lock() {
            let (_, fields) = spans
                .entry(id.into_u64())
                .or_insert_with(|| (attrs.metadata().name(), BTreeMap::new()));
            attrs.record(&mut Collect(fields));
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _ctx: Context<'_, S>) {
        if let Ok(mut spans) = self.0.lock()
            && let Some((_, fields)) = spans.get_mut(&id.into_u64())
        {
            values.record(&mut Collect(fields));
        }
    }
}

impl SpanFields {
    fn only_span(&self) -> BTreeMap<String, String> {
        let spans = self.0.lock().map(|spans| spans.clone()).unwrap_or_default();
        assert_eq!(spans.len(), 1, "one span per message: {spans:?}");
        let (name, fields) = spans.into_values().next().unwrap_or_default();
        assert_eq!(name, "message");
        fields
    }
}

fn field<'a>(fields: &'a BTreeMap<String, String>, name: &str) -> Option<&'a str> {
    fields.get(name).map(String::as_str)
}

#[tokio::test]
async fn each_message_gets_a_span_with_its_origin_attempt_and_handler() {
    let spans = SpanFields::default();
    let _default = subscriber::set_default(tracing_subscriber::registry().with(spans.clone()));
    TraceLayer::new("billing")
        .layer(Scripted::default())
        .oneshot(message("order"))
        .await
        .expect("success");
    let fields = spans.only_span();
    assert_eq!(field(&fields, "handler"), Some("billing"));
    assert_eq!(field(&fields, "source"), Some("orders"));
    assert_eq!(field(&fields, "partition"), Some("0"));
    assert_eq!(field(&fields, "position"), Some("7"));
    assert_eq!(field(&fields, "key"), Some("k1"));
    assert_eq!(field(&fields, "attempt"), Some("1"));
    assert_eq!(field(&fields, "error"), None);
    assert_eq!(field(&fields, "trace_id"), None);
}

#[tokio::test]
async fn a_traceparent_header_is_recorded_on_the_span() {
    let spans = SpanFields::default();
    let _default = subscriber::set_default(tracing_subscriber::registry().with(spans.clone()));
    let headers: Headers = [(
        TRACEPARENT,
        Bytes::from_static(b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
    )]
    .into_iter()
    .collect();
    let traced = message("order").with_headers(headers);
    TraceLayer::new("billing")
        .layer(Scripted::default())
        .oneshot(traced)
        .await
        .expect("success");
    let fields = spans.only_span();
    assert_eq!(
        field(&fields, "trace_id"),
        Some("4bf92f3577b34da6a3ce929d0e0e4736")
    );
    assert_eq!(field(&fields, "parent_span_id"), Some("00f067aa0ba902b7"));
}

#[tokio::test]
async fn a_failure_is_recorded_on_the_span_with_its_class() {
    let spans = SpanFields::default();
    let _default = subscriber::set_default(tracing_subscriber::registry().with(spans.clone()));
    let error = TraceLayer::new("billing")
        .layer(Scripted::new([Step::Permanent("unknown customer")]))
        .oneshot(message("order"))
        .await
        .expect_err("failure passes through");
    assert!(error.is_permanent());
    let fields = spans.only_span();
    assert_eq!(field(&fields, "error.class"), Some("permanent"));
    assert_eq!(
        field(&fields, "error"),
        Some("permanent error: unknown customer")
    );
}

#[tokio::test(start_paused = true)]
async fn outside_retry_one_span_covers_every_attempt_and_records_the_last() {
    let spans = SpanFields::default();
    let _default = subscriber::set_default(tracing_subscriber::registry().with(spans.clone()));
    let handler = Scripted::new(std::iter::repeat_n(Step::Retryable("db down"), 5));
    let error = ServiceBuilder::new()
        .layer(TraceLayer::new("billing"))
        .layer(crate::retry::RetryLayer::new(
            crate::backoff::Constant::new(std::time::Duration::from_millis(1)).max_retries(2),
        ))
        .service(handler)
        .oneshot(message("order"))
        .await
        .expect_err("retries used up");
    assert_eq!(error.attempts(), 3);
    let fields = spans.only_span();
    assert_eq!(field(&fields, "attempt"), Some("3"));
    assert_eq!(field(&fields, "error.class"), Some("retryable"));
}

#[tokio::test]
async fn a_binary_key_is_escaped() {
    let spans = SpanFields::default();
    let _default = subscriber::set_default(tracing_subscriber::registry().with(spans.clone()));
    let keyed = message("order").with_key(Bytes::from_static(b"\x00\xffid"));
    TraceLayer::new("billing")
        .layer(Scripted::default())
        .oneshot(keyed)
        .await
        .expect("success");
    assert_eq!(field(&spans.only_span(), "key"), Some("\\x00\\xffid"));
}

#[tokio::test]
async fn the_handler_runs_inside_the_span() {
    let spans = SpanFields::default();
    let _default = subscriber::set_default(tracing_subscriber::registry().with(spans.clone()));
    let inside = tower::service_fn(|_message: Message| async {
        let current = Span::current();
        let name = current.metadata().map(|m| m.name());
        if name == Some("message") {
            Ok(())
        } else {
            Err(HandlerError::permanent("not inside the message span"))
        }
    });
    ServiceBuilder::new()
        .layer(TraceLayer::new("billing"))
        .service(inside)
        .oneshot(message("order"))
        .await
        .expect("the handler saw its span");
}

#[tokio::test]
async fn a_span_no_subscriber_wants_is_disabled_and_the_message_still_runs() {
    // Tests on other threads install subscribers, so this thread says
    // explicitly that it has none, or filters the span's level out.
    let service = Trace::new(Scripted::default(), "billing");
    {
        let _none = subscriber::set_default(subscriber::NoSubscriber::default());
        assert!(service.span(&message("order")).is_disabled());
    }
    {
        let warn_only = tracing_subscriber::registry()
            .with(SpanFields::default())
            .with(tracing_subscriber::filter::LevelFilter::WARN);
        let _warn_only = subscriber::set_default(warn_only);
        assert!(service.span(&message("order")).is_disabled());
    }
    service.oneshot(message("order")).await.expect("success");
}

/// An error whose text quotes a whole payload: a megabyte.
#[derive(Debug)]
struct Quoting(String);

impl fmt::Display for Quoting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cannot process payload {}", self.0)
    }
}

impl std::error::Error for Quoting {}

#[tokio::test]
async fn a_huge_error_text_is_recorded_capped() {
    let spans = SpanFields::default();
    let _default = subscriber::set_default(tracing_subscriber::registry().with(spans.clone()));
    let quoting = tower::service_fn(|_message: Message| async {
        Err::<(), _>(HandlerError::permanent(Quoting("p".repeat(1 << 20))))
    });
    TraceLayer::new("billing")
        .layer(quoting)
        .oneshot(message("order"))
        .await
        .expect_err("failure passes through");
    let fields = spans.only_span();
    let error = field(&fields, "error").unwrap_or_default();
    assert!(
        error.starts_with("permanent error: cannot process payload ppp"),
        "{error:.80}"
    );
    assert!(error.len() <= 4096 + 64, "{} bytes", error.len());
    assert!(
        error.ends_with(&format!("({} more bytes)", (1 << 20) + 23 - 4096)),
        "{}",
        &error[4000..]
    );
}

#[tokio::test]
async fn a_huge_key_is_recorded_capped() {
    let spans = SpanFields::default();
    let _default = subscriber::set_default(tracing_subscriber::registry().with(spans.clone()));
    let keyed = message("order").with_key(Bytes::from("k".repeat(1 << 20)));
    TraceLayer::new("billing")
        .layer(Scripted::default())
        .oneshot(keyed)
        .await
        .expect("success");
    let fields = spans.only_span();
    let key = field(&fields, "key").unwrap_or_default();
    assert!(key.len() <= 256 + 32, "{} bytes", key.len());
    assert!(
        key.ends_with(&format!("({} more bytes)", (1 << 20) - 256)),
        "{key}"
    );
}

#[tokio::test]
async fn keys_can_be_left_out_of_spans() {
    let spans = SpanFields::default();
    let _default = subscriber::set_default(tracing_subscriber::registry().with(spans.clone()));
    TraceLayer::new("billing")
        .record_key(false)
        .layer(Scripted::default())
        .oneshot(message("order"))
        .await
        .expect("success");
    let fields = spans.only_span();
    assert_eq!(field(&fields, "key"), None);
    assert_eq!(field(&fields, "position"), Some("7"));
}

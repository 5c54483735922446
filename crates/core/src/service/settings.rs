//! [`ServiceSettings`]: a service's settings as data, from a config file
//! section and `INTAKE_*` environment variables (feature `serde`).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;
use serde::de::Deserializer;

use super::Route;
use crate::consumer::ConsumerSettings;
use crate::consumer::settings::{duration, parse_duration};
use crate::error::ConfigError;

/// A service's settings as data: a section of the service's config file,
/// with `INTAKE_*` environment variables over it
/// ([`with_env`](Self::with_env)). Every field is optional: what is absent
/// keeps what the code set. Durations are strings with a unit (`"30s"`).
///
/// ```
/// use intake_core::service::ServiceSettings;
///
/// let settings: ServiceSettings = serde_json::from_str(r#"{
///     "broker": "kafka://127.0.0.1:9092",
///     "http": "0.0.0.0:9898",
///     "drain_deadline": "20s",
///     "routes": {
///         "payments": { "retries": 5, "consumer": { "max_in_flight": 256, "ordering": "key" } }
///     }
/// }"#)?;
/// // INTAKE_BROKER, INTAKE_HTTP_ADDR and INTAKE_DRAIN_DEADLINE win over the file.
/// let settings = settings.with_env()?;
/// # drop(settings);
/// # Ok::<_, Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct ServiceSettings {
    /// The broker's URL (`kafka://…`, `redis://…`, `amqp://…`, `nats://…`),
    /// for `AnyBroker::from_url` in the `intake` crate; `INTAKE_BROKER`.
    pub broker: Option<String>,
    /// Where health and metrics are served ([`Service::http`]);
    /// `INTAKE_HTTP_ADDR`.
    ///
    /// [`Service::http`]: super::Service::http
    pub http: Option<String>,
    /// [`Service::drain_deadline`](super::Service::drain_deadline);
    /// `INTAKE_DRAIN_DEADLINE`.
    #[serde(default, deserialize_with = "drain_deadline")]
    pub drain_deadline: Option<Duration>,
    /// Each route's settings, by its source, over what the code gave
    /// [`Service::route_with`](super::Service::route_with).
    #[serde(default)]
    pub routes: BTreeMap<String, RouteSettings>,
}

/// One route's settings as data, over its [`Route`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct RouteSettings {
    /// [`Route::group`].
    pub group: Option<String>,
    /// [`Route::retries`].
    pub retries: Option<u32>,
    /// `false`: [`Route::without_parking`].
    pub parking: Option<bool>,
    /// The route's consumer: in-flight bound, order, commit cadence, ...
    #[serde(default)]
    pub consumer: ConsumerSettings,
}

fn drain_deadline<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    duration(d, "drain_deadline")
}

impl ServiceSettings {
    /// These settings with `INTAKE_BROKER`, `INTAKE_HTTP_ADDR` and
    /// `INTAKE_DRAIN_DEADLINE` over them, where set.
    ///
    /// # Errors
    ///
    /// `INTAKE_DRAIN_DEADLINE` is not a duration with a unit.
    pub fn with_env(self) -> Result<Self, ConfigError> {
        self.with_vars(|name| std::env::var(name).ok())
    }

    fn with_vars(mut self, var: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        if let Some(broker) = var("INTAKE_BROKER") {
            self.broker = Some(broker);
        }
        if let Some(http) = var("INTAKE_HTTP_ADDR") {
            self.http = Some(http);
        }
        if let Some(deadline) = var("INTAKE_DRAIN_DEADLINE") {
            let deadline = parse_duration(&deadline)
                .map_err(|problem| ConfigError::new("INTAKE_DRAIN_DEADLINE", problem))?;
            self.drain_deadline = Some(deadline);
        }
        Ok(self)
    }
}

impl RouteSettings {
    /// `route` with these settings in place of its own.
    pub(super) fn apply(&self, mut route: Route) -> Route {
        if let Some(group) = &self.group {
            route = route.group(group.clone());
        }
        if let Some(retries) = self.retries {
            route = route.retries(retries);
        }
        if self.parking == Some(false) {
            route = route.without_parking();
        }
        route.consumer = Some(self.consumer.clone());
        route
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_environment_wins_over_the_file() {
        let settings: ServiceSettings = serde_json::from_str(
            r#"{ "broker": "kafka://file:9092", "http": "127.0.0.1:1", "drain_deadline": "5s" }"#,
        )
        .unwrap();
        let vars = |name: &str| match name {
            "INTAKE_BROKER" => Some("redis://env:6379".to_owned()),
            "INTAKE_DRAIN_DEADLINE" => Some("250ms".to_owned()),
            _ => None,
        };
        let settings = settings.with_vars(vars).unwrap();
        assert_eq!(settings.broker.as_deref(), Some("redis://env:6379"));
        assert_eq!(settings.http.as_deref(), Some("127.0.0.1:1"));
        assert_eq!(settings.drain_deadline, Some(Duration::from_millis(250)));
    }

    #[test]
    fn a_bad_duration_names_its_variable_or_field() {
        let error = ServiceSettings::default()
            .with_vars(|name| (name == "INTAKE_DRAIN_DEADLINE").then(|| "soon".to_owned()))
            .unwrap_err();
        assert!(
            error.to_string().contains("INTAKE_DRAIN_DEADLINE"),
            "{error}"
        );
        let error =
            serde_json::from_str::<ServiceSettings>(r#"{ "drain_deadline": "soon" }"#).unwrap_err();
        assert!(error.to_string().contains("drain_deadline"), "{error}");
        let error =
            serde_json::from_str::<ServiceSettings>(r#"{ "routes": { "a": { "retry": 1 } } }"#)
                .unwrap_err();
        assert!(error.to_string().contains("retry"), "{error}");
    }

    #[test]
    fn route_settings_apply_over_the_code() {
        let settings: RouteSettings = serde_json::from_str(
            r#"{ "group": "replay", "retries": 0, "parking": false, "consumer": { "max_in_flight": 8 } }"#,
        )
        .unwrap();
        let route = settings.apply(Route::new().retries(5).group("billing"));
        assert_eq!(route.group.as_deref(), Some("replay"));
        assert_eq!(route.retries, 0);
        assert_eq!(route.parking, None);
        assert_eq!(
            route.consumer.as_ref().and_then(|c| c.max_in_flight),
            Some(8)
        );
    }
}

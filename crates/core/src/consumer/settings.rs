//! A consumer's settings as data, for services that read their routes'
//! settings from a file or the environment (feature `serde`).

use std::time::Duration;

use serde::Deserialize;
use serde::de::{self, Deserializer};

use super::{ConsumerBuilder, DeliveryOrder};

/// The settings of a [`ConsumerBuilder`] as data: every field is optional
/// (absent keeps the builder's default), durations are strings with a unit
/// (`"250ms"`, `"30s"`, `"5m"`, `"1h"`), and an error names the field.
///
/// ```
/// use intake_core::consumer::{ConsumerSettings, DeliveryOrder};
///
/// let settings: ConsumerSettings = serde_json::from_str(
///     r#"{ "max_in_flight": 64, "ordering": "key", "commit_interval": "250ms" }"#,
/// )?;
/// let builder = settings.into_builder();
/// # drop(builder);
///
/// let error = serde_json::from_str::<ConsumerSettings>(r#"{ "commit_interval": "soon" }"#)
///     .unwrap_err();
/// assert!(error.to_string().starts_with("`commit_interval`:"), "{error}");
/// # Ok::<_, serde_json::Error>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct ConsumerSettings {
    /// [`ConsumerBuilder::max_in_flight`].
    #[serde(default, deserialize_with = "fields::max_in_flight")]
    pub max_in_flight: Option<usize>,
    /// [`ConsumerBuilder::max_in_flight_bytes`].
    #[serde(default, deserialize_with = "fields::max_in_flight_bytes")]
    pub max_in_flight_bytes: Option<usize>,
    /// [`ConsumerBuilder::ordering`]: `"partition"`, `"key"` or
    /// `"unordered"`.
    #[serde(default, deserialize_with = "fields::ordering")]
    pub ordering: Option<DeliveryOrder>,
    /// [`ConsumerBuilder::commit_interval`].
    #[serde(default, deserialize_with = "fields::commit_interval")]
    pub commit_interval: Option<Duration>,
    /// [`ConsumerBuilder::commit_batch`].
    #[serde(default, deserialize_with = "fields::commit_batch")]
    pub commit_batch: Option<usize>,
    /// [`ConsumerBuilder::fetch_batch`].
    #[serde(default, deserialize_with = "fields::fetch_batch")]
    pub fetch_batch: Option<usize>,
    /// [`ConsumerBuilder::max_uncommitted`].
    #[serde(default, deserialize_with = "fields::max_uncommitted")]
    pub max_uncommitted: Option<usize>,
    /// [`ConsumerBuilder::shutdown_deadline`].
    #[serde(default, deserialize_with = "fields::shutdown_deadline")]
    pub shutdown_deadline: Option<Duration>,
    /// [`ConsumerBuilder::revoke_timeout`].
    #[serde(default, deserialize_with = "fields::revoke_timeout")]
    pub revoke_timeout: Option<Duration>,
    /// [`ConsumerBuilder::probe_timeout`].
    #[serde(default, deserialize_with = "fields::probe_timeout")]
    pub probe_timeout: Option<Duration>,
}

impl ConsumerSettings {
    /// A builder with these settings over the defaults (checked, as always,
    /// when the consumer is built).
    pub fn into_builder(self) -> ConsumerBuilder {
        self.apply(ConsumerBuilder::default())
    }

    /// `builder` with the settings given here in place of its own.
    pub fn apply(self, mut builder: ConsumerBuilder) -> ConsumerBuilder {
        macro_rules! set {
            ($($field:ident),*) => {
                $(if let Some(value) = self.$field {
                    builder = builder.$field(value);
                })*
            };
        }
        set!(
            max_in_flight,
            max_in_flight_bytes,
            ordering,
            commit_interval,
            commit_batch,
            fetch_batch,
            max_uncommitted,
            shutdown_deadline,
            revoke_timeout,
            probe_timeout
        );
        builder
    }
}

impl<'de> Deserialize<'de> for DeliveryOrder {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        match name.as_str() {
            "partition" => Ok(DeliveryOrder::Partition),
            "key" => Ok(DeliveryOrder::Key),
            "unordered" => Ok(DeliveryOrder::Unordered),
            other => Err(de::Error::custom(format!(
                "`{other}` is not an ordering; use \"partition\", \"key\" or \"unordered\""
            ))),
        }
    }
}

/// A duration with a unit: `"250ms"`, `"30s"`, `"5m"`, `"1h"`.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: u64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a duration; use a number and a unit: \"250ms\", \"30s\", \"5m\", \"1h\""))?;
    let seconds = |factor: u64| {
        value
            .checked_mul(factor)
            .map(Duration::from_secs)
            .ok_or_else(|| format!("`{text}` is too long"))
    };
    match unit.trim() {
        "ms" => Ok(Duration::from_millis(value)),
        "s" => seconds(1),
        "m" => seconds(60),
        "h" => seconds(3_600),
        _ => Err(format!(
            "`{text}` has no known unit; use \"ms\", \"s\", \"m\" or \"h\""
        )),
    }
}

/// A duration field of a settings struct.
pub(crate) fn duration<'de, D: Deserializer<'de>>(
    deserializer: D,
    field: &str,
) -> Result<Option<Duration>, D::Error> {
    let text = String::deserialize(deserializer)
        .map_err(|error| de::Error::custom(format!("`{field}`: {error}")))?;
    parse_duration(&text)
        .map(Some)
        .map_err(|problem| de::Error::custom(format!("`{field}`: {problem}")))
}

/// Each field's deserializer: the value's own, with the field's name in
/// the error (serde's derive does not say which field a value error is
/// for).
mod fields {
    use std::time::Duration;

    use serde::Deserialize;
    use serde::de::{self, Deserializer};

    use super::DeliveryOrder;

    macro_rules! named {
        ($($field:ident: $ty:ty),*) => {
            $(pub(super) fn $field<'de, D: Deserializer<'de>>(d: D) -> Result<Option<$ty>, D::Error> {
                <$ty>::deserialize(d)
                    .map(Some)
                    .map_err(|error| de::Error::custom(format!("`{}`: {error}", stringify!($field))))
            })*
        };
    }

    macro_rules! durations {
        ($($field:ident),*) => {
            $(pub(super) fn $field<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
                super::duration(d, stringify!($field))
            })*
        };
    }

    named!(
        max_in_flight: usize,
        max_in_flight_bytes: usize,
        ordering: DeliveryOrder,
        commit_batch: usize,
        fetch_batch: usize,
        max_uncommitted: usize
    );
    durations!(
        commit_interval,
        shutdown_deadline,
        revoke_timeout,
        probe_timeout
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_apply_over_the_defaults() {
        let settings: ConsumerSettings = serde_json::from_str(
            r#"{"max_in_flight": 8, "ordering": "unordered", "shutdown_deadline": "2m"}"#,
        )
        .unwrap();
        assert_eq!(settings.max_in_flight, Some(8));
        assert_eq!(settings.ordering, Some(DeliveryOrder::Unordered));
        assert_eq!(settings.shutdown_deadline, Some(Duration::from_secs(120)));
        let builder = settings.into_builder();
        assert_eq!(builder.settings.max_in_flight, 8);
        assert_eq!(builder.settings.commit_batch, 1024, "a default kept");
    }

    #[test]
    fn errors_name_the_field() {
        let error = |json: &str| {
            serde_json::from_str::<ConsumerSettings>(json)
                .unwrap_err()
                .to_string()
        };
        assert!(error(r#"{"max_in_flight": "many"}"#).starts_with("`max_in_flight`: invalid type"));
        assert!(
            error(r#"{"ordering": "random"}"#)
                .starts_with("`ordering`: `random` is not an ordering")
        );
        assert!(
            error(r#"{"revoke_timeout": "10 weeks"}"#)
                .starts_with("`revoke_timeout`: `10 weeks` has no known unit")
        );
        assert!(error(r#"{"max_in_fligth": 1}"#).contains("unknown field `max_in_fligth`"));
    }

    #[test]
    fn durations_take_a_unit() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3_600)));
        assert!(parse_duration("30").is_err());
        assert!(parse_duration("ms").is_err());
    }
}

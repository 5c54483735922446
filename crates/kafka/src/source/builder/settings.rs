//! The consumer's librdkafka settings: intake's defaults, the settings it
//! fixes, the group id and the reconnect policy.

use super::*;

/// The group name a broadcast consumer's own group starts with when it was
/// given none.
pub(super) const BROADCAST_GROUP: &str = "intake";

/// librdkafka's default `max.poll.interval.ms`.
const DEFAULT_MAX_POLL_INTERVAL: Duration = Duration::from_secs(300);

/// librdkafka's prefetch, bounded in bytes (see [`KafkaSourceBuilder`]):
/// 16 MiB of queued messages, 16 MiB per fetch response. At 100-byte
/// messages that is still 160,000 messages ahead; at 1 MiB, sixteen.
///
/// And how long a partition whose queue reached a bound waits before it
/// fetches again: librdkafka's default, 1 s, is longer than a fast consumer
/// takes to drain a bounded queue, which then sat idle for the rest of the
/// second (half the throughput at 100-byte messages, `BENCHMARKS.md`). A
/// full queue is checked 50 times a second instead, which costs nothing
/// measurable.
const PREFETCH_BOUNDS: [(&str, &str); 3] = [
    ("queued.max.messages.kbytes", "16384"),
    ("fetch.max.bytes", "16777216"),
    ("fetch.queue.backoff.ms", "20"),
];

impl KafkaSourceBuilder {
    /// The librdkafka settings of the consumer, with intake's defaults and
    /// fixed settings applied, and its group id.
    pub(super) fn consumer_settings(&self) -> Result<(KafkaSettings, String), Error> {
        if self.topics.is_empty() || self.topics.iter().any(String::is_empty) {
            return Err(Error::config(
                "topics",
                "name at least one topic, none empty (`.topic(\"orders\")`)",
            ));
        }
        // Before librdkafka's own check, whose refusal names no fix.
        self.settings.checked_group_protocol()?;
        if self.settings.is_true("enable.auto.commit") == Some(true) {
            return Err(Error::config(
                "enable.auto.commit",
                "must be false: intake commits offsets only for finished messages; remove the setting",
            ));
        }
        let group_id = match (&self.group, self.broadcast) {
            (group, true) => format!(
                "{}.broadcast.{}",
                group.as_deref().unwrap_or(BROADCAST_GROUP),
                unique_suffix()
            ),
            (Some(group), false) if !group.is_empty() => group.clone(),
            (_, false) => {
                return Err(Error::config(
                    "group",
                    "set a consumer group (`.group(\"orders-service\")`) or choose `.broadcast()`",
                ));
            }
        };
        let mut settings = self.client_settings()?;
        let config = settings.client_config_mut();
        config.set("group.id", &group_id);
        config.set("enable.auto.commit", "false");
        config.set("enable.auto.offset.store", "false");
        config.set("enable.partition.eof", "false");
        if self.exactly_once.is_some() {
            if self.broadcast {
                return Err(Error::config(
                    "exactly_once",
                    "a broadcast consumer commits nothing, so it has no transaction to put outputs in; use a group",
                ));
            }
            if config.get("isolation.level") == Some("read_uncommitted") {
                return Err(Error::config(
                    "isolation.level",
                    "must be read_committed in an exactly-once pipeline: outputs of aborted transactions upstream would be handled; remove the setting",
                ));
            }
            config.set("isolation.level", "read_committed");
        }
        if self.broadcast {
            config.set("auto.offset.reset", "latest");
        } else if config.get("auto.offset.reset").is_none() {
            config.set("auto.offset.reset", "earliest");
        }
        for (key, value) in PREFETCH_BOUNDS {
            if config.get(key).is_none() {
                config.set(key, value);
            }
        }
        Ok((settings, group_id))
    }

    /// The settings of any client of this source's brokers (the consumer,
    /// a dead-letter producer): the given ones with the reconnect policy.
    pub(super) fn client_settings(&self) -> Result<KafkaSettings, Error> {
        let mut settings = self.settings.clone();
        let (reconnect, explicit) = match &self.reconnect {
            None => (ReconnectBackoff::default(), false),
            Some(Ok(reconnect)) => (*reconnect, true),
            Some(Err(problem)) => return Err(Error::config("reconnect_backoff", problem.clone())),
        };
        reconnect.apply(&mut settings, explicit)?;
        Ok(settings)
    }
}

/// The consumer's `max.poll.interval.ms`: how long it may go between two
/// polls, a rebalance callback included, before the group evicts it.
pub(super) fn max_poll_interval(settings: &KafkaSettings) -> Result<Duration, Error> {
    match settings.get("max.poll.interval.ms") {
        Some(value) => value
            .parse::<u64>()
            .map(Duration::from_millis)
            .map_err(|_| {
                Error::config(
                    "max.poll.interval.ms",
                    format!("`{value}` is not a number of milliseconds"),
                )
            }),
        None => Ok(DEFAULT_MAX_POLL_INTERVAL),
    }
}

/// Fetches each topic's metadata: proves a broker answers and the topic
/// A suffix that no other instance picks: time, process and a random seed.
fn unique_suffix() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|since| since.as_nanos())
        .unwrap_or(0);
    let random = RandomState::new().hash_one(nanos);
    format!("{}-{:x}", std::process::id(), random)
}

#[cfg(test)]
mod tests {
    use super::super::tests::builder;
    use super::*;
    use crate::GroupProtocol;
    use intake_core::backend::SourceError;

    #[test]
    fn offsets_are_never_auto_committed() {
        let (settings, _) = builder()
            .group("g")
            .topic("t")
            .consumer_settings()
            .expect("valid settings");
        assert_eq!(settings.get("enable.auto.commit"), Some("false"));
        assert_eq!(settings.get("auto.offset.reset"), Some("earliest"));

        let refused = builder()
            .group("g")
            .topic("t")
            .consumer_settings_with("enable.auto.commit", "true");
        assert!(
            matches!(refused, Err(Error::Config { setting, .. }) if setting == "enable.auto.commit")
        );
    }

    /// With the prefetch bounded, librdkafka's default 1 s backoff after a
    /// full queue outlasts the queue: the consumer would drain it and then
    /// sit idle (measured: half the throughput at 100-byte messages).
    #[test]
    fn a_partition_whose_queue_was_full_fetches_again_soon_unless_told_otherwise() {
        let (settings, _) = builder()
            .group("g")
            .topic("t")
            .consumer_settings()
            .expect("valid settings");
        assert_eq!(settings.get("fetch.queue.backoff.ms"), Some("20"));
        assert_eq!(settings.get("queued.max.messages.kbytes"), Some("16384"));

        let (settings, _) = builder()
            .group("g")
            .topic("t")
            .consumer_settings_with("fetch.queue.backoff.ms", "500")
            .expect("valid settings");
        assert_eq!(settings.get("fetch.queue.backoff.ms"), Some("500"));
    }

    #[test]
    fn a_consumer_needs_a_group_or_broadcast() {
        let error = builder().topic("t").consumer_settings();
        assert!(matches!(error, Err(Error::Config { setting, .. }) if setting == "group"));
        let (settings, group) = builder()
            .topic("t")
            .broadcast()
            .consumer_settings()
            .expect("broadcast needs no group");
        assert!(group.starts_with("intake.broadcast."));
        assert_eq!(settings.get("auto.offset.reset"), Some("latest"));
    }

    #[test]
    fn broadcast_instances_get_groups_of_their_own() {
        let first = builder().topic("t").broadcast().consumer_settings();
        let second = builder().topic("t").broadcast().consumer_settings();
        let (Ok((_, first)), Ok((_, second))) = (first, second) else {
            panic!("broadcast settings are valid");
        };
        assert_ne!(first, second);
    }

    #[test]
    fn the_reconnect_policy_reaches_the_consumer_or_fails_the_build() {
        let (settings, _) = builder()
            .group("g")
            .topic("t")
            .consumer_settings()
            .expect("valid settings");
        assert_eq!(settings.get("reconnect.backoff.ms"), Some("100"));
        assert_eq!(settings.get("reconnect.backoff.max.ms"), Some("10000"));

        let (settings, _) = builder()
            .group("g")
            .topic("t")
            .reconnect_backoff(intake_core::Exponential::new(
                Duration::from_millis(500),
                Duration::from_secs(20),
            ))
            .consumer_settings()
            .expect("valid settings");
        assert_eq!(settings.get("reconnect.backoff.ms"), Some("500"));
        assert_eq!(settings.get("reconnect.backoff.max.ms"), Some("20000"));

        let refused = builder()
            .group("g")
            .topic("t")
            .reconnect_backoff(intake_core::Disabled)
            .consumer_settings();
        assert!(
            matches!(refused, Err(Error::Config { ref setting, .. }) if setting == "reconnect_backoff"),
            "{refused:?}"
        );
    }

    #[test]
    fn the_consumer_protocol_refuses_the_settings_the_broker_keeps_naming_the_fix() {
        let consumer = || {
            builder()
                .group("g")
                .topic("t")
                .group_protocol_settings(GroupProtocol::Consumer)
        };
        let (settings, _) = consumer()
            .consumer_settings()
            .expect("the consumer protocol alone is valid");
        assert_eq!(settings.get("group.protocol"), Some("consumer"));
        assert_eq!(settings.get("session.timeout.ms"), None, "intake sets none");
        assert_eq!(settings.get("heartbeat.interval.ms"), None);
        assert_eq!(settings.get("partition.assignment.strategy"), None);
        settings
            .client_config()
            .create::<rdkafka::consumer::BaseConsumer>()
            .expect("librdkafka takes intake's settings under the consumer protocol");

        for (setting, value, replacement) in [
            (
                "session.timeout.ms",
                "6000",
                "group.consumer.session.timeout.ms",
            ),
            (
                "heartbeat.interval.ms",
                "500",
                "group.consumer.heartbeat.interval.ms",
            ),
            (
                "partition.assignment.strategy",
                "range",
                "group.remote.assignor",
            ),
            ("group.protocol.type", "consumer", "remove the setting"),
        ] {
            let refused = consumer().consumer_settings_with(setting, value);
            match refused {
                Err(
                    ref error @ Error::GroupProtocolSetting {
                        setting: ref named,
                        protocol: GroupProtocol::Consumer,
                        ..
                    },
                ) => {
                    assert_eq!(named, setting);
                    let shown = error.to_string();
                    assert!(shown.contains(setting), "{shown}");
                    assert!(shown.contains(replacement), "{shown}");
                    assert!(
                        matches!(
                            SourceError::from(refused.unwrap_err()),
                            SourceError::Config(_)
                        ),
                        "a configuration error to the runtime"
                    );
                }
                other => panic!("{setting}: expected GroupProtocolSetting, got {other:?}"),
            }
        }

        // The classic protocol takes them, and refuses the broker's assignor.
        for protocol in [None, Some(GroupProtocol::Classic)] {
            let classic = || {
                let builder = builder().group("g").topic("t");
                match protocol {
                    Some(protocol) => builder.group_protocol_settings(protocol),
                    None => builder,
                }
            };
            for (setting, value) in [
                ("session.timeout.ms", "6000"),
                ("heartbeat.interval.ms", "500"),
                ("partition.assignment.strategy", "cooperative-sticky"),
            ] {
                assert!(
                    classic().consumer_settings_with(setting, value).is_ok(),
                    "{setting} under {protocol:?}"
                );
            }
            let refused = classic().consumer_settings_with("group.remote.assignor", "range");
            assert!(
                matches!(refused, Err(Error::GroupProtocolSetting { ref setting, protocol: GroupProtocol::Classic, .. }) if setting == "group.remote.assignor"),
                "{refused:?}"
            );
        }

        let unknown = builder()
            .group("g")
            .topic("t")
            .consumer_settings_with("group.protocol", "kip848");
        assert!(
            matches!(unknown, Err(Error::Config { ref setting, .. }) if setting == "group.protocol"),
            "{unknown:?}"
        );
    }

    /// librdkafka's own refusal, met by a consumer intake does not check
    /// first, comes back typed too.
    #[test]
    fn librdkafka_refusing_a_classic_setting_is_the_typed_error() {
        for (setting, value) in [
            ("session.timeout.ms", "6000"),
            ("heartbeat.interval.ms", "500"),
            ("partition.assignment.strategy", "range"),
        ] {
            let refused = KafkaSettings::new("127.0.0.1:9")
                .set("group.id", "g")
                .group_protocol(GroupProtocol::Consumer)
                .set(setting, value)
                .client_config()
                .create::<rdkafka::consumer::BaseConsumer>()
                .map(drop)
                .map_err(|error| Error::from_kafka(error, "127.0.0.1:9", Duration::ZERO));
            assert!(
                matches!(refused, Err(Error::GroupProtocolSetting { setting: ref named, protocol: GroupProtocol::Consumer, .. }) if named == setting),
                "{setting}: {refused:?}"
            );
        }
    }

    #[test]
    fn no_topic_is_a_configuration_error() {
        let error = builder().group("g").consumer_settings();
        assert!(matches!(error, Err(Error::Config { setting, .. }) if setting == "topics"));
    }

    /// Settings whose values are secrets, by librdkafka's account (its
    /// sensitive properties) and Java's `sasl.jaas.config`: the test's
    /// oracle, written out rather than asked of `is_secret`.
    const SECRET_KEYS: [&str; 8] = [
        "sasl.username",
        "sasl.password",
        "ssl.key.password",
        "ssl.key.pem",
        "ssl.key.location",
        "sasl.oauthbearer.client.secret",
        "sasl.oauthbearer.assertion.private.key.passphrase",
        "sasl.jaas.config",
    ];

    /// librdkafka settings a user may write, secrets among them, and
    /// arbitrary names librdkafka does not know.
    fn any_key() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        prop_oneof![
            prop::sample::select(SECRET_KEYS.to_vec()).prop_map(str::to_owned),
            prop::sample::select(vec![
                "fetch.wait.max.ms",
                "session.timeout.ms",
                "max.poll.interval.ms",
                "security.protocol",
                "sasl.mechanisms",
                "enable.auto.commit",
                "auto.offset.reset",
                "socket.timeout.ms",
                "statistics.interval.ms",
                "client.id",
            ])
            .prop_map(str::to_owned),
            "[a-z]{1,8}(\\.[a-z]{1,8}){0,3}",
        ]
    }

    fn any_value() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        prop_oneof![
            "-?[0-9]{1,22}",
            prop::sample::select(vec!["true", "FALSE", "earliest", "SASL_SSL", "PLAIN", ""])
                .prop_map(str::to_owned),
            ".{0,16}",
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(200))]

        #[test]
        fn any_settings_make_a_client_or_a_typed_error_that_hides_secrets(
            settings in proptest::collection::vec((any_key(), any_value()), 0..6),
        ) {
            // Each value is marked, so a leak says which setting it came from.
            let mut builder = builder().group("g").topic("t");
            for (index, (key, value)) in settings.iter().enumerate() {
                builder.settings = builder.settings.set(key.as_str(), format!("{value}<{index}>"));
            }
            let secrets: Vec<String> = settings
                .iter()
                .enumerate()
                .filter(|(_, (key, _))| SECRET_KEYS.contains(&key.as_str()))
                .map(|(index, _)| format!("<{index}>"))
                .collect();
            let shown = format!("{:?}", builder.settings);
            let outcome = builder.consumer_settings().and_then(|(settings, _)| {
                settings
                    .client_config()
                    .create::<rdkafka::consumer::BaseConsumer>()
                    .map(drop)
                    .map_err(|error| Error::from_kafka(error, "127.0.0.1:9", Duration::ZERO))
            });
            let error = outcome.err().map(|error| error.to_string()).unwrap_or_default();
            for secret in &secrets {
                proptest::prop_assert!(!shown.contains(secret.as_str()), "{}", shown);
                proptest::prop_assert!(!error.contains(secret.as_str()), "{}", error);
            }
        }
    }

    impl KafkaSourceBuilder {
        fn group_protocol_settings(mut self, protocol: GroupProtocol) -> Self {
            self.settings = self.settings.group_protocol(protocol);
            self
        }

        fn consumer_settings_with(
            mut self,
            key: &str,
            value: &str,
        ) -> Result<(KafkaSettings, String), Error> {
            self.settings = self.settings.set(key, value);
            self.consumer_settings()
        }
    }
}

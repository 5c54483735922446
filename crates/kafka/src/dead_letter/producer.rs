//! The dead-letter producer's settings: `acks=all` and idempotent unless
//! told otherwise.

use super::*;

/// The dead-letter producer's settings: `settings` with the delivery
/// timeout (unless they set `message.timeout.ms`), `acks=all` and an
/// idempotent producer. A letter is the only copy left of a message whose
/// original is committed next: it must survive the leader's loss (every
/// in-sync replica has it), and a write librdkafka retries (a response lost
/// to a timeout or a broken connection) must not be written twice. Settings
/// that say otherwise explicitly are kept, with a warning.
pub(crate) fn producer_settings(
    settings: KafkaSettings,
    delivery_timeout: Duration,
) -> KafkaSettings {
    let mut settings = settings;
    if settings.get("message.timeout.ms").is_none() {
        settings = settings.set(
            "message.timeout.ms",
            delivery_timeout.as_millis().to_string(),
        );
    }
    let is_all = |acks: &str| {
        let acks = acks.trim();
        acks.eq_ignore_ascii_case("all") || acks == "-1"
    };
    let acks = settings
        .get("acks")
        .or_else(|| settings.get("request.required.acks"))
        .map(str::to_owned);
    match &acks {
        None => settings = settings.set("acks", "all"),
        Some(acks) if is_all(acks) => {}
        Some(acks) => tracing::warn!(
            acks = %acks,
            "the kafka dead-letter producer writes with the acks its settings give: a letter the leader confirmed alone is lost if the leader fails before a follower has it, and the original is committed by then; and without acks=all the producer cannot be idempotent, so a retried write may be written twice. Remove the setting for acks=all"
        ),
    }
    match settings.is_true("enable.idempotence") {
        None if acks.as_deref().is_none_or(is_all) => {
            settings = settings.set("enable.idempotence", "true");
        }
        // Refused by librdkafka with acks other than all; warned above.
        None => {}
        Some(false) => tracing::warn!(
            "the kafka dead-letter producer is not idempotent, as its settings say (enable.idempotence=false): a write librdkafka retries after a lost response may be written twice. Remove the setting"
        ),
        Some(true) => {}
    }
    settings
}

#[cfg(test)]
mod tests {
    use super::*;

    /// L4, L5: the dead-letter producer writes with `acks=all` and is
    /// idempotent unless its settings explicitly say otherwise (kept, with
    /// a warning); librdkafka refuses idempotence with other acks, so those
    /// settings turn it off.
    #[test]
    fn the_producer_is_idempotent_with_acks_all_unless_told_otherwise() {
        let timeout = Duration::from_secs(30);
        let of = |settings: KafkaSettings| {
            let chosen = producer_settings(settings, timeout);
            (
                chosen.get("acks").map(str::to_owned),
                chosen.get("enable.idempotence").map(str::to_owned),
                chosen.get("message.timeout.ms").map(str::to_owned),
            )
        };
        let base = KafkaSettings::new("127.0.0.1:9");
        assert_eq!(
            of(base.clone()),
            (
                Some("all".into()),
                Some("true".into()),
                Some("30000".into())
            )
        );
        for acks in ["all", "-1", " ALL "] {
            let (_, idempotence, _) = of(base.clone().set("acks", acks));
            assert_eq!(idempotence.as_deref(), Some("true"), "{acks}");
        }
        assert_eq!(
            of(base.clone().set("acks", "1")),
            (Some("1".into()), None, Some("30000".into())),
            "an explicit acks is kept, and idempotence left off (librdkafka refuses it with acks=1)"
        );
        assert_eq!(
            of(base.clone().set("request.required.acks", "0")).1,
            None,
            "acks under its other name counts too"
        );
        assert_eq!(
            of(base.clone().set("enable.idempotence", "false")),
            (
                Some("all".into()),
                Some("false".into()),
                Some("30000".into())
            )
        );
        assert_eq!(
            of(base.set("message.timeout.ms", "5000")).2.as_deref(),
            Some("5000")
        );
    }

    /// librdkafka builds a producer of these settings, and refuses the one
    /// combination that cannot work (idempotence with acks=1).
    #[tokio::test]
    async fn librdkafka_takes_the_forced_settings() {
        KafkaDeadLetterSink::builder(KafkaSettings::new("127.0.0.1:9"), "billing")
            .build()
            .await
            .expect("acks=all and idempotence are valid");
        KafkaDeadLetterSink::builder(
            KafkaSettings::new("127.0.0.1:9").set("acks", "1"),
            "billing",
        )
        .build()
        .await
        .expect("an explicit acks=1 builds, not idempotent");
        let refused = KafkaDeadLetterSink::builder(
            KafkaSettings::new("127.0.0.1:9")
                .set("acks", "1")
                .set("enable.idempotence", "true"),
            "billing",
        )
        .build()
        .await;
        assert!(matches!(refused, Err(Error::Config { .. })), "{refused:?}");
    }
}

//! The return topics a source reads besides its own: its parking's, or
//! those named by hand, and what reading them needs.

use super::*;

/// The return topics a source reads: from its parking, or named by hand.
#[derive(Debug, Default)]
pub(super) struct Returns {
    /// Every topic subscribed: the source's own, then the return topics
    /// added for them.
    pub(super) topics: Vec<String>,
    /// The return topics, by name, with the origin whose copies come back
    /// there (an origin that is its own return topic included): what the
    /// dead-letter sink may follow a copy's origin header from.
    pub(super) origins: Vec<(String, String)>,
    /// The return topics read from their start when a partition has no
    /// usable offset.
    pub(super) earliest: Vec<String>,
}

impl KafkaSourceBuilder {
    /// The topics to subscribe and which of them are return topics.
    pub(super) fn returns(&self, settings: &KafkaSettings) -> Result<Returns, Error> {
        let mut returns = Returns {
            topics: self.topics.clone(),
            ..Returns::default()
        };
        let group = match (&self.group, self.broadcast) {
            (Some(group), false) => group.as_str(),
            _ => {
                if self.parking.is_some() {
                    return Err(Error::config(
                        "parking",
                        "a broadcast consumer reads every message from the end and commits nothing: it cannot read a group's parked copies; use a group",
                    ));
                }
                return Ok(returns);
            }
        };
        if let Some(parking) = &self.parking {
            if parking.group() != group {
                return Err(Error::config(
                    "parking",
                    format!(
                        "the parking parks the messages of group `{}`, this source reads as group `{group}`: build the parking with the source's group",
                        parking.group()
                    ),
                ));
            }
            let mut served = false;
            let mut sorted: Vec<(&String, &String)> = parking.return_topics().iter().collect();
            sorted.sort();
            for (back_to, origin) in sorted {
                if self.topics.contains(origin) {
                    served = true;
                    if !returns.topics.contains(back_to) {
                        returns.topics.push(back_to.clone());
                    }
                    returns.origins.push((back_to.clone(), origin.clone()));
                    returns.earliest.push(back_to.clone());
                }
            }
            let latest =
                OffsetReset::from_setting(settings.get("auto.offset.reset")) == OffsetReset::Latest;
            for origin in parking.topics_returning_to_themselves() {
                if !self.topics.contains(origin) {
                    continue;
                }
                served = true;
                if latest {
                    return Err(Error::config(
                        "auto.offset.reset",
                        format!(
                            "the parking returns the copies of `{origin}` to `{origin}` itself, which this source reads from its end when a partition has no committed offset: copies that come back before a member has a position are skipped, and their originals were acknowledged; use the default return template (`{DEFAULT_RETURN_TEMPLATE}`, read from its start) or auto.offset.reset=earliest"
                        ),
                    ));
                }
                returns.origins.push((origin.clone(), origin.clone()));
            }
            if !served {
                return Err(Error::config(
                    "parking",
                    format!(
                        "the parking serves none of this source's topics {:?}: build it with `.topics(..)` of this source",
                        self.topics
                    ),
                ));
            }
        }
        // Return topics named by hand, by the default template.
        for origin in &self.topics {
            let back_to = DEFAULT_RETURN_TEMPLATE
                .replace("{topic}", origin)
                .replace("{group}", group);
            if self.topics.contains(&back_to) && !returns.earliest.contains(&back_to) {
                returns.origins.push((back_to.clone(), origin.clone()));
                returns.earliest.push(back_to);
            }
        }
        if !returns.origins.is_empty() {
            warn_unless_co_located(settings, group);
        }
        Ok(returns)
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::builder;
    use super::*;

    /// A parking that returns to the origin itself, with no broker needed
    /// (it creates no return topic).
    async fn parking(group: &str, template: &str) -> KafkaParking {
        KafkaParking::builder(KafkaSettings::new("127.0.0.1:9"), group)
            .topics(["orders"])
            .return_topic_template(template)
            .build()
            .await
            .expect("no broker needed")
    }

    fn refused(returns: Result<Returns, Error>, wanted: &str) {
        assert!(
            matches!(&returns, Err(Error::Config { setting, .. }) if setting == wanted),
            "{wanted}: {returns:?}"
        );
    }

    /// What reading a parking's copies needs is checked before the
    /// consumer is made.
    #[tokio::test]
    async fn a_parking_the_source_cannot_read_copies_of_is_refused() {
        let itself = parking("billing", "{topic}").await;
        let settings =
            |reset: &str| KafkaSettings::new("127.0.0.1:9").set("auto.offset.reset", reset);
        refused(
            builder()
                .group("shipping")
                .topic("orders")
                .parking(&itself)
                .returns(&settings("earliest")),
            "parking",
        );
        refused(
            builder()
                .group("billing")
                .topic("payments")
                .parking(&itself)
                .returns(&settings("earliest")),
            "parking",
        );
        refused(
            builder()
                .group("billing")
                .broadcast()
                .topic("orders")
                .parking(&itself)
                .returns(&settings("latest")),
            "parking",
        );
        refused(
            builder()
                .group("billing")
                .topic("orders")
                .parking(&itself)
                .returns(&settings("latest")),
            "auto.offset.reset",
        );
        let returns = builder()
            .group("billing")
            .topic("orders")
            .parking(&itself)
            .returns(&settings("earliest"))
            .expect("copies in the origin, read from its start");
        assert_eq!(returns.topics, ["orders"]);
        assert!(returns.earliest.is_empty());
        assert_eq!(
            returns.origins,
            [("orders".to_owned(), "orders".to_owned())]
        );
        itself
            .shutdown(Duration::from_secs(10))
            .await
            .expect("the mover stops");
    }

    /// A return topic named by hand by the default template is read from
    /// its start too; another topic is not.
    #[test]
    fn a_default_return_topic_named_by_hand_is_read_from_its_start() {
        let settings = KafkaSettings::new("127.0.0.1:9").set("auto.offset.reset", "latest");
        let returns = builder()
            .group("billing")
            .topics([
                "orders",
                "orders.billing.returned",
                "orders.shipping.returned",
            ])
            .returns(&settings)
            .expect("valid");
        assert_eq!(returns.earliest, ["orders.billing.returned"]);
        assert_eq!(
            returns.origins,
            [("orders.billing.returned".to_owned(), "orders".to_owned())]
        );
        let broadcast = builder()
            .topics(["orders", "orders.intake.returned"])
            .broadcast()
            .returns(&settings)
            .expect("valid");
        assert!(broadcast.earliest.is_empty());
    }
}

//! The memory broker as a [`Broker`]: every part of a route derived from
//! it, as on the real backends.

use super::{
    MemoryAcker, MemoryBroker, MemoryDeadLetterSink, MemoryDeadLetterStore, MemoryError,
    MemoryLagProbe, MemoryParking, MemoryPublisher, MemorySource,
};
use crate::backend::broker::{Broker, RouteAddress, RouteOptions, RouteParts};

/// The parts of a memory route: the route's source topic must exist
/// ([`MemoryBroker::create_topic`]); its dead-letter topic is created when
/// needed. Parking appends each copy to the source topic again once due,
/// for the route's group alone, so the route's own source reads it back
/// and the topic's other groups never see it.
impl Broker for MemoryBroker {
    type Source = MemorySource;
    type Acker = MemoryAcker;
    type DeadLetterSink = MemoryDeadLetterSink;
    type Parking = MemoryParking;
    type Publisher = MemoryPublisher;
    type DeadLetterStore = MemoryDeadLetterStore;
    type LagProbe = MemoryLagProbe;
    type ControlChannel = crate::memory::MemoryControlChannel;
    type Error = MemoryError;

    fn kind(&self) -> &'static str {
        "memory"
    }

    async fn route(
        &self,
        address: &RouteAddress,
        options: &RouteOptions,
    ) -> Result<RouteParts<Self>, MemoryError> {
        let (source, acker) = self.consumer(address.source(), address.group())?;
        let dead_letter_sink = self.dead_letter_sink(address.source(), address.group())?;
        let parking = match options.parking {
            Some(_) => Some(self.parking(address.source(), address.group())?),
            None => None,
        };
        Ok(RouteParts::new(source, acker, dead_letter_sink, parking))
    }

    async fn publisher(&self) -> Result<MemoryPublisher, MemoryError> {
        Ok(self.memory_publisher())
    }

    async fn dead_letter_store(
        &self,
        address: &RouteAddress,
    ) -> Result<MemoryDeadLetterStore, MemoryError> {
        MemoryBroker::dead_letter_store(self, address.source(), address.group())
    }

    async fn lag_probe(&self, address: &RouteAddress) -> Result<MemoryLagProbe, MemoryError> {
        Ok(self.topic_lag_probe(address.source(), address.group()))
    }

    async fn control_channel(
        &self,
        group: &str,
        log: crate::group_control::ControlLog,
    ) -> Result<crate::memory::MemoryControlChannel, MemoryError> {
        Ok(self.group_control_channel(group, log))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::lag::LagProbe;
    use crate::memory::Record;
    use crate::message::{Message, Metadata, Position};
    use crate::parking::Parking;

    #[tokio::test]
    async fn a_route_derived_with_parking_reads_back_what_it_parked_and_its_probe_counts_it() {
        let broker = MemoryBroker::new();
        broker.create_topic("payments", 1).unwrap();
        broker
            .send("payments", Record::new("p1").with_key("account-1"))
            .unwrap();
        let address = RouteAddress::new("payments", "billing");
        let parts = Broker::route(&broker, &address, &RouteOptions::new().parking())
            .await
            .unwrap();
        let parking = parts.parking.expect("asked for parking");
        let message = Message::new(
            "p1",
            Metadata::new("payments".into(), 0, Position::Offset(0)),
        )
        .with_key("account-1");
        parking
            .park(&message, Duration::from_millis(50))
            .await
            .unwrap();
        let probe = broker.lag_probe(&address).await.unwrap();
        assert_eq!(probe.parked().await.unwrap(), Some(1));
        tokio::time::timeout(Duration::from_secs(10), async {
            while probe.parked().await.unwrap() != Some(0) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the parked copy comes back within 10 s");
        assert_eq!(broker.high_watermarks("payments").unwrap(), [2]);
    }

    #[tokio::test]
    async fn a_route_without_parking_has_none() {
        let broker = MemoryBroker::new();
        broker.create_topic("payments", 1).unwrap();
        let parts = Broker::route(
            &broker,
            &RouteAddress::new("payments", "billing"),
            &RouteOptions::new(),
        )
        .await
        .unwrap();
        assert!(parts.parking.is_none());
    }
}

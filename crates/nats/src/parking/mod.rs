//! [`NatsParking`]: a message that asks to be retried later waits in this
//! process until due, still held from the server, and the source gives it
//! back then; past the room for parked messages it goes back to JetStream
//! with `-NAK {"delay":…}` instead.
//!
//! [`NatsParking`]'s docs say how it parks, what it costs and its limits
//! (the module is private: the type is what users read).

mod parked;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use intake_core::parking::{PARKS, ParkError, Parked, Parking, is_park_header};
use intake_core::{Headers, Message, SourceName};

pub(crate) use self::parked::ParkedHere;
use crate::NatsSource;

/// Parks the messages of a [`NatsSource`]: each waits in this process
/// until due, and the source gives it back. Get one from
/// [`NatsSource::parking`]; hand it to a
/// [`ParkingLayer`](intake_core::parking::ParkingLayer) of a consumer that
/// acknowledges through the same source's [`NatsAcker`](crate::NatsAcker).
///
/// # How it parks
///
/// Nothing is written anywhere. [`NatsParking::park`](Parking::park)
/// keeps the message and answers [`Parked::HandedBack`]; the runtime hands
/// the delivery to the [`NatsAcker`](crate::NatsAcker)
/// ([`PartitionAck::requeue_after`](intake_core::backend::PartitionAck::requeue_after)),
/// which parks it in the process instead of sending anything: the delivery
/// stays held, so the source keeps reporting it in progress (`+WPI`, every
/// half `ack_wait`) and the server neither delivers it again nor counts a
/// delivery. Once due, the source gives it back to the runtime: the same
/// stream sequence, subject (the key), payload and headers, acknowledged
/// through the same reply subject, on its next attempt if it was parked for
/// its own failure, on the same attempt if it only waited behind an earlier
/// message of its key. As a parked copy on the other backends, it carries
/// [`parked_from`](intake_core::Metadata::parked_from), naming that same
/// delivery.
///
/// Why not `-NAK` with the delay, which the server honours: every nak is
/// one delivery more, and the redelivery goes to whichever instance of the
/// group pulls next. A message that only waited behind its key's parked
/// message was then counted toward `max_deliveries` as if it had failed,
/// each time its key's first message was parked again or came back to
/// another instance, and the source dead-lettered it without running it
/// (review R9, `tests/parking.rs`: 3 to 22 of 32 such messages in every
/// run, with two instances). Held here, a parked message comes back to the
/// process that keeps its key's order, and only a failure or a crash is a
/// delivery.
///
/// # What it costs
///
/// - **Memory**: a parked message stays in memory until due (its payload
///   is the delivery's, not a copy). Messages parked for their own failure
///   may hold at most the consumer's byte budget
///   (`ConsumerBuilder::max_in_flight_bytes`, 64 MiB by default) with the
///   others parked here; a park past that goes back to the server with
///   `-NAK` and its delay (logged once per stretch): as before, one
///   delivery more, to any instance. A message that only waits behind its
///   key is always kept here, so it is never counted as a delivery: with
///   those, at most the consumer's `max_ack_pending` messages are parked
///   in one process (the server counts each as unacknowledged).
/// - **A slot of `max_ack_pending`** per parked message until it is due:
///   the server counts it delivered and unacknowledged, and sends nothing
///   new while the consumer's `max_ack_pending` are. The source sizes it
///   for twice the budget plus
///   [`park_room`](crate::NatsSourceBuilder::park_room) parked messages
///   (default 1,000); once that many are parked (logged), new messages
///   come only as parked ones come back.
/// - One `+WPI` per parked message every half `ack_wait`.
///
/// # When the process stops
///
/// - **Closing** (the consumer stops, a graceful restart): the source hands
///   each parked message back with `-NAK` and what is left of its delay, so
///   the server holds it until then and any instance of the group gets it
///   once due (one delivery more).
/// - **A crash**: the progress reports stop, and the server delivers the
///   parked messages again after `ack_wait`, **possibly before they were
///   due**, to any instance, as every delivery of a crashed process.
/// - **A connection lost for longer than `ack_wait`**: the server may
///   deliver a parked message again meanwhile, here (it stays parked) or
///   to another instance (it then runs there, and here once due: a
///   duplicate).
///
/// # Counting parks
///
/// [`Parking::parks`] is the attempt less one: the parks this process made
/// for the message's own failures, plus the deliveries before this one
/// (retries, parks that went back to the server, crashes; a redelivered
/// original keeps the headers it was published with, so no header counts).
/// A message that only waited behind its key is not counted.
/// [`ParkingLayer::max_parks`] (default 10) caps them; the source's
/// [`max_deliveries`](crate::NatsSourceBuilder::max_deliveries) (default
/// 5) counts server deliveries only, which parks here are not.
///
/// # The order per key
///
/// Kept by this process, as on every backend, for the messages it
/// received: a parked message and those waiting behind it come back here.
/// Instances sharing a durable consumer have no order between them: a
/// later message of the key that the server delivers to another instance
/// runs there as it comes.
///
/// ```no_run
/// use std::time::Duration;
/// use intake_core::parking::ParkingLayer;
/// use intake_core::{Consumer, DeliveryOrder, HandlerError, Message};
/// use intake_nats::NatsSource;
/// use tower::{ServiceBuilder, service_fn};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let source = NatsSource::builder("nats://127.0.0.1:4222")
///     .stream("ORDERS")
///     .consumer("billing")
///     .build()
///     .await?;
/// let handler = ServiceBuilder::new()
///     .layer(ParkingLayer::new(source.parking()))
///     .service(service_fn(|message: Message| async move {
///         if message.payload().is_empty() {
///             return Err(HandlerError::retry_later("the ledger is down", Duration::from_secs(30)));
///         }
///         Ok::<(), HandlerError>(())
///     }));
/// let acker = source.acker();
/// let consumer = Consumer::builder()
///     .ordering(DeliveryOrder::Key)
///     .build(source, acker, handler)?;
/// # drop(consumer);
/// # Ok(())
/// # }
/// ```
///
/// [`ParkingLayer::max_parks`]: intake_core::parking::ParkingLayer::max_parks
#[derive(Clone)]
pub struct NatsParking {
    consumer: Arc<str>,
    stream: SourceName,
    ack_wait: Duration,
    parked: Arc<ParkedHere>,
}

impl NatsSource {
    /// Parking for this source's messages: each waits in this process,
    /// still held from the server, and this source gives it back once due
    /// (past the room, it goes back to the server with `-NAK` and its
    /// delay).
    pub fn parking(&self) -> NatsParking {
        NatsParking {
            consumer: self.consumer_name().into(),
            stream: self.stream_name().into(),
            ack_wait: self.ack_wait(),
            parked: self.parked_here(),
        }
    }
}

impl NatsParking {
    /// The consumer whose messages this parks.
    pub fn consumer(&self) -> &str {
        &self.consumer
    }
}

impl fmt::Debug for NatsParking {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsParking")
            .field("consumer", &self.consumer)
            .field("stream", &self.stream)
            .field("ack_wait", &self.ack_wait)
            .finish_non_exhaustive()
    }
}

/// `message` as it runs again after a park: without the park headers
/// (nothing reads them on NATS), and on its next attempt if it was parked
/// for its own failure (the parking layer wrote [`PARKS`] then), on the
/// same one if it only waited behind its key.
///
/// It came back from a park, so its
/// [`parked_from`](intake_core::Metadata::parked_from) names its first
/// delivery (here the same stream sequence), as on every backend: a
/// handler that asks for later only when `parked_from` is `None` would
/// otherwise ask again on every return, and its message be dead-lettered
/// after `max_parks` (the broker suite's parking scenario did).
fn to_give_back(message: &Message, own_failure: bool) -> Message {
    let mut back = message.clone();
    if back.metadata().parked_from().is_none() {
        let first = message.metadata().first_delivery();
        back.metadata_mut().set_parked_from(Some(first));
    }
    if message
        .headers()
        .iter()
        .any(|header| is_park_header(&header.name))
    {
        *back.headers_mut() = message
            .headers()
            .iter()
            .filter(|header| !is_park_header(&header.name))
            .map(|header| (header.name.clone(), header.value.clone()))
            .collect::<Headers>();
    }
    if own_failure {
        let attempt = message.metadata().attempt().saturating_add(1);
        back.metadata_mut().set_attempt(attempt);
    }
    back
}

#[async_trait::async_trait]
impl Parking for NatsParking {
    /// Writes nothing: the message waits in this process, kept for the
    /// acker, which parks it when the runtime hands it back; past the room
    /// the acker sends `-NAK` with the delay instead. Either way the batch
    /// the acker sends is the park's confirmation.
    async fn park(&self, message: &Message, _delay: Duration) -> Result<Parked, ParkError> {
        let metadata = message.metadata();
        if metadata.source() == &self.stream
            && let Some(sequence) = crate::acker::sequence(metadata.position())
        {
            let own_failure = message.headers().get(PARKS).is_some();
            self.parked
                .ask(sequence, to_give_back(message, own_failure), own_failure);
        }
        Ok(Parked::HandedBack)
    }

    /// The deliveries and parks before this one: the attempt less one. A
    /// message given back from a park here runs on its next attempt when
    /// it was parked for its own failure, on the same one when it only
    /// waited behind its key; one the server delivers again (after a park
    /// that went back to the server, a retry, a crash) carries the
    /// server's count. The headers it was published with never count.
    fn parks(&self, message: &Message) -> u32 {
        message.metadata().attempt().saturating_sub(1)
    }

    /// Never: a parked message is given back as the delivery it was, with
    /// no park header (this parking drops them; the source sets its
    /// `parked_from` itself), and the server redelivers
    /// originals as they were published. Park headers on a message are
    /// therefore a producer's, which the parking layer drops.
    fn is_returned_copy(&self, _message: &Message) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use intake_core::{Metadata, Position};

    use super::*;

    fn parking() -> NatsParking {
        NatsParking {
            consumer: "billing".into(),
            stream: "ORDERS".into(),
            ack_wait: Duration::from_secs(30),
            parked: Arc::new(ParkedHere::new(1 << 20)),
        }
    }

    fn delivered(count: u32) -> Message {
        let metadata = Metadata::new("ORDERS".into(), 0, Position::Offset(7)).with_attempt(count);
        Message::new(bytes::Bytes::from_static(b"m"), metadata)
    }

    #[test]
    fn parks_are_the_deliveries_before_this_one_whatever_the_headers_say() {
        let parking = parking();
        assert_eq!(parking.parks(&delivered(1)), 0);
        assert_eq!(parking.parks(&delivered(4)), 3);
        // A delivery count of 0 never comes from the server; no underflow.
        assert_eq!(parking.parks(&delivered(0)), 0);
        let mut claims_parks = delivered(2);
        claims_parks
            .headers_mut()
            .set(intake_core::parking::PARKS, "9");
        assert_eq!(parking.parks(&claims_parks), 1);
    }

    #[tokio::test]
    async fn a_park_hands_the_original_back() {
        let parked = parking()
            .park(&delivered(1), Duration::from_secs(5))
            .await
            .expect("no request to refuse");
        assert_eq!(parked, Parked::HandedBack);
    }

    /// What the parking layer hands a park: the message with the park
    /// headers it wrote. What comes back has none of them, and runs on its
    /// next attempt only if it failed itself.
    #[tokio::test]
    async fn a_park_keeps_the_message_without_park_headers_for_the_acker() {
        let parking = parking();
        let mut own = delivered(2);
        own.headers_mut().set("trace", "t1");
        own.headers_mut().set(PARKS, "1");
        own.headers_mut().set(intake_core::parking::DUE, "1");
        own.headers_mut().set(intake_core::parking::ATTEMPTS, "2");
        parking
            .park(&own, Duration::from_secs(5))
            .await
            .expect("parked");
        let back = parking.parked.take_asked(7).expect("kept for the acker");
        assert_eq!(back.metadata().attempt(), 3, "its next attempt");
        assert_eq!(
            back.metadata().parked_from(),
            Some(&own.metadata().first_delivery()),
            "back from a park, first delivered where it is"
        );
        let names: Vec<&str> = back.headers().iter().map(|h| &*h.name).collect();
        assert_eq!(names, ["trace"]);
        let mut follower = delivered(2);
        follower.headers_mut().set(intake_core::parking::DUE, "1");
        parking
            .park(&follower, Duration::from_secs(5))
            .await
            .expect("parked");
        let back = parking.parked.take_asked(7).expect("kept for the acker");
        assert_eq!(back.metadata().attempt(), 2, "a follow is no attempt");
        assert!(
            back.metadata().parked_from().is_some(),
            "it waited in a park"
        );
        assert!(back.headers().is_empty());
    }
}

//! [`NatsParking`]: a message that asks to be retried later is handed back
//! to JetStream with `-NAK {"delay":…}`, and the server redelivers it once
//! the delay is over.
//!
//! [`NatsParking`]'s docs say how it parks, what it costs and its limits
//! (the module is private: the type is what users read).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use intake_core::Message;
use intake_core::parking::{ParkError, Parked, Parking};

use crate::NatsSource;

/// Parks the messages of a [`NatsSource`] by handing them back to the
/// server with a delay. Get one from [`NatsSource::parking`]; hand it to a
/// [`ParkingLayer`](intake_core::parking::ParkingLayer) of a consumer that
/// acknowledges through the same source's [`NatsAcker`](crate::NatsAcker).
///
/// # How it parks
///
/// Nothing is written anywhere. [`NatsParking::park`](Parking::park)
/// answers [`Parked::HandedBack`], and the runtime hands the original back
/// through the [`NatsAcker`](crate::NatsAcker)
/// ([`PartitionAck::requeue_after`](intake_core::backend::PartitionAck::requeue_after)):
/// a `-NAK` carrying the delay in nanoseconds, sent in the ack batch and
/// confirmed with it. The server keeps the message in the consumer's
/// pending set and delivers it again once the delay (counted from the
/// nak's arrival) is over: the same stream sequence, subject (the key),
/// payload and headers, to whichever instance of the group pulls next,
/// with its delivery count one higher. On nats-server 2.9.10 a message
/// parked for 3 s came back after 3.00 s, also with an `ack_wait` of 1 s
/// (a delay may be longer than `ack_wait`).
///
/// # What it costs
///
/// One nak per park, in a batch that is sent anyway; no stream, no copy,
/// no mover task. Nothing is lost when the process stops while messages
/// are parked: the server holds them, and a crash before the nak landed is
/// the ordinary crash (the server delivers again after `ack_wait`, which
/// may be before the delay was over).
///
/// # Limits
///
/// - **A parked message holds a slot of `max_ack_pending`** until it is
///   due: the server counts it as delivered and unacknowledged. With
///   `max_ack_pending` messages parked the server sends nothing new, and
///   the consumer does wait (measured: with `max_ack_pending` 2 and two
///   messages parked for 3 s, a third one was delivered after 3 s). The
///   source's default is twice the budget, so up to one budget's worth of
///   messages can be parked before new ones slow down; raise
///   [`max_ack_pending`](crate::NatsSourceBuilder::max_ack_pending) for a
///   consumer that parks many at once.
/// - **`max_deliveries` caps parks too.** Every park is one more delivery.
///   The source dead-letters a delivery past
///   [`max_deliveries`](crate::NatsSourceBuilder::max_deliveries) (default
///   5) itself, as retryable, without calling the handler: with the
///   defaults a message parked five times is dead-lettered on its sixth
///   delivery, before [`ParkingLayer::max_parks`] (default 10) is reached.
///   It is never dropped silently: the consumers the source creates have
///   no server-side `max_deliver`, and on an existing consumer that has
///   one the source dead-letters a message on its last delivery. To let
///   the parking layer decide (its letter carries the handler's failure),
///   set `max_deliveries` above `max_parks` plus the ordinary retries, or
///   [`unlimited_deliveries`](crate::NatsSourceBuilder::unlimited_deliveries).
/// - **Parks are counted from deliveries** ([`Parking::parks`]: the delivery
///   count less one), since a redelivered original carries the headers it
///   was published with. Ordinary retries, deliveries lost to a crash, and
///   the parks of a message parked behind an earlier one of its key (each
///   time that one is parked again, so is it) all count. A message that
///   waited behind a key parked often may therefore reach the cap without
///   having failed itself.
/// - **The order per key is kept by this process**, as on every backend:
///   the redelivery goes to any instance of the group.
///
/// # Where the delay could be lost
///
/// The server takes a `+WPI` (the source's progress report for a slow
/// delivery) that arrives after a delayed nak as "redeliver `ack_wait` from
/// now": measured, a 3 s park with a 1 s `ack_wait` came back after 1 s.
/// The acker therefore stops holding a parked delivery before its nak is
/// sent, so the progress task reports it no more (a report it took a
/// moment before can still land behind the nak: a window of the time it
/// takes to hand a publish to the client); the source's `close` naks only
/// what it still holds, so it leaves parked messages alone too. A nak
/// whose batch the server did not confirm is not sent again (the delivery
/// is no longer held): the message comes back after its delay if the nak
/// landed, after `ack_wait` if not.
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
///     // Room for the parks: each is one more delivery.
///     .max_deliveries(ParkingLayer::DEFAULT_MAX_PARKS + 5)
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
    ack_wait: Duration,
}

impl NatsSource {
    /// Parking for this source's messages: each goes back to the server
    /// with `-NAK` and its delay, sent by this source's acker.
    pub fn parking(&self) -> NatsParking {
        NatsParking {
            consumer: self.consumer_name().into(),
            ack_wait: self.ack_wait(),
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
            .field("ack_wait", &self.ack_wait)
            .finish()
    }
}

#[async_trait::async_trait]
impl Parking for NatsParking {
    /// Writes nothing: the original goes back through the acker, whose
    /// batch confirmation is the park's.
    async fn park(&self, _message: &Message, _delay: Duration) -> Result<Parked, ParkError> {
        Ok(Parked::HandedBack)
    }

    /// The deliveries before this one: a handed-back original keeps the
    /// headers it was published with, so no park header can count.
    fn parks(&self, message: &Message) -> u32 {
        message.metadata().attempt().saturating_sub(1)
    }

    /// Never: the server redelivers the original, and no copy is written.
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
            ack_wait: Duration::from_secs(30),
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
}

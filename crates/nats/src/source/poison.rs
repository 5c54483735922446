//! The retry cap: deliveries the server made more often than
//! `max_deliveries` are dead-lettered by the source itself, without
//! calling the handler.

use intake_core::backend::DeadLetterSink;
use intake_core::{DeadLetter, ErrorClass};

use super::NatsSource;
use crate::acker::nak_with_delay;
use crate::dead_letter::NatsDeadLetterSinkBuilder;

impl NatsSource {
    /// Dead-letters the deliveries past the retry cap, one at a time,
    /// each removed only once written and terminated (so a call dropped
    /// half-way writes it again, never loses it).
    pub(super) async fn dead_letter_poison(&mut self) {
        while let Some((message, sequence, delivered)) = self.poison.front().cloned() {
            let attempts = message.metadata().attempt().saturating_sub(1);
            let cap = self.max_deliveries.unwrap_or(u32::MAX);
            let letter = DeadLetter::new(
                message,
                format!(
                    "delivered {attempts} times without being acknowledged (max_deliveries = {cap})"
                ),
                attempts,
            )
            .with_class(ErrorClass::Retryable);
            if self.own_sink.is_none() {
                let mut builder = NatsDeadLetterSinkBuilder::new(
                    self.connection.clone(),
                    self.stream.clone(),
                    self.durable.then(|| self.consumer.clone()),
                    self.deliveries.clone(),
                    self.counters.clone(),
                    self.ack_timeout,
                );
                if let Some(subject) = &self.dead_letter_subject {
                    builder = builder.subject(subject.clone());
                }
                match builder.build().await {
                    Ok(sink) => self.own_sink = Some(sink),
                    Err(error) => {
                        self.give_back_poison(sequence, delivered, &error);
                        return;
                    }
                }
            }
            let Some(sink) = &self.own_sink else {
                return;
            };
            // The sink terms the original once the letter is confirmed. A
            // letter the destination cannot take as it is (over
            // `max_payload`) becomes a reference, as under the dead-letter
            // layer; the sink refuses that too where the stream would
            // delete the original.
            let written = match sink.write(&letter).await {
                Err(error) if error.is_rejected() => {
                    tracing::warn!(
                        sequence,
                        %error,
                        "a message past max_deliveries does not fit the dead-letter subject; writing a reference to it"
                    );
                    sink.write(&letter.to_reference()).await
                }
                written => written,
            };
            match written {
                Ok(()) => {
                    self.counters.add_source_dead_letter();
                    tracing::warn!(
                        sequence,
                        attempts,
                        subject = sink.subject(),
                        "dead-lettered a message delivered more often than max_deliveries"
                    );
                    self.deliveries.release([(sequence, delivered)]);
                    self.poison.pop_front();
                }
                Err(error) => {
                    self.give_back_poison(sequence, delivered, &error);
                    return;
                }
            }
        }
    }

    /// A poison delivery whose letter could not be written goes back with
    /// a delay; it comes back past the cap again and is tried again.
    fn give_back_poison(&mut self, sequence: u64, delivered: u32, error: &dyn std::fmt::Display) {
        tracing::error!(
            sequence,
            %error,
            "could not dead-letter a message past max_deliveries; it is handed back and tried again later"
        );
        if let Some(held) = self.deliveries.get(sequence) {
            let client = self.connection.client.clone();
            let body = nak_with_delay(self.ack_wait);
            tokio::spawn(async move {
                let _ = client.publish(held.reply, body).await;
            });
        }
        self.deliveries.release([(sequence, delivered)]);
        self.poison.pop_front();
    }
}

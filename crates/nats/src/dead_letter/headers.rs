//! A dead letter as a NATS message: the envelope as headers (a line break
//! escaped, a header NATS refuses left out and counted), whole, or reduced
//! when its headers pass JetStream's limit for a message's header block;
//! rejected when even that does not fit, or the whole passes the server's
//! `max_payload`.

use async_nats::{HeaderMap, HeaderName, HeaderValue};
use bytes::Bytes;
use intake_core::DeadLetter;
use intake_core::backend::DeadLetterError;
use intake_core::dead_letter::envelope::{self, Envelope};

use super::{MAX_HEADER_BYTES, NATS_HEADER_PREFIX, NatsDeadLetterSink};

/// The error text of a reduced letter, as on AMQP.
const REDUCED_ERROR_BYTES: usize = 1024;

impl NatsDeadLetterSink {
    /// `letter` as NATS headers and payload: whole, or reduced (without the
    /// original headers) when its headers pass JetStream's limit for a
    /// message's header block; rejected when even that is over the limit
    /// or the whole is over the server's `max_payload`.
    pub(super) fn message(
        &self,
        letter: &DeadLetter,
    ) -> Result<(HeaderMap, Bytes), DeadLetterError> {
        let envelope = Envelope::new(letter, &self.carrier);
        let (headers, header_bytes) = self.headers(&envelope)?;
        let (headers, header_bytes) = match header_bytes > MAX_HEADER_BYTES {
            false => (headers, header_bytes),
            true => {
                let noted = self.reduced_note(letter);
                let letter = noted.as_ref().unwrap_or(letter);
                let reduced = Envelope::new(letter, &self.carrier).reduced(REDUCED_ERROR_BYTES);
                let (headers, header_bytes) = self.headers(&reduced)?;
                if header_bytes > MAX_HEADER_BYTES {
                    return Err(DeadLetterError::rejected(format!(
                        "the letter's envelope alone is {header_bytes} bytes of headers, over JetStream's {MAX_HEADER_BYTES}"
                    )));
                }
                tracing::warn!(
                    omitted = letter.message.headers().len(),
                    "a dead letter's headers pass JetStream's limit: written without the original headers (counted in intake.headers.omitted)"
                );
                (headers, header_bytes)
            }
        };
        let payload = envelope.payload().clone();
        let size = payload.len() + header_bytes;
        let max_payload = self.client.server_info().max_payload;
        if max_payload > 0 && size > max_payload {
            return Err(DeadLetterError::rejected(format!(
                "the letter is {size} bytes, over the server's max_payload of {max_payload}"
            )));
        }
        Ok((headers, payload))
    }

    /// The envelope's headers and the size of their header block.
    fn headers(&self, envelope: &Envelope<'_>) -> Result<(HeaderMap, usize), DeadLetterError> {
        let mut omitted = 0;
        let mut headers = HeaderMap::new();
        let mut size = "NATS/1.0\r\n\r\n".len();
        for (name, value) in envelope.headers() {
            let name = match name.starts_with("Nats-") || name.starts_with("nats-") {
                true => format!("{NATS_HEADER_PREFIX}{name}"),
                false => name.into_owned(),
            };
            match (
                HeaderName::try_from(name.as_str()),
                header_value(value, false),
            ) {
                (Ok(header), Some(value)) => {
                    size += name.len() + value.as_str().len() + 4;
                    headers.append(header, value);
                }
                _ => omitted += 1,
            }
        }
        let mut fields = Vec::with_capacity(envelope::MAX_FIELDS);
        let omitted_text;
        for (name, value) in envelope.fields() {
            let value = match name {
                envelope::ERROR_MESSAGE => header_value(value, true),
                envelope::HEADERS_OMITTED if omitted > 0 => None,
                _ => header_value(value, false),
            };
            if name == envelope::HEADERS_OMITTED && omitted > 0 {
                continue;
            }
            let Some(value) = value else {
                return Err(DeadLetterError::rejected(format!(
                    "envelope field `{name}` is no NATS header value (not UTF-8, or a line break)"
                )));
            };
            fields.push((name, value));
        }
        if omitted > 0 {
            // The envelope's own count (a reduced letter's) plus the headers
            // NATS cannot carry.
            let counted = envelope
                .fields()
                .find(|(name, _)| *name == envelope::HEADERS_OMITTED)
                .and_then(|(_, value)| std::str::from_utf8(value).ok()?.parse::<u64>().ok())
                .unwrap_or(0);
            omitted_text = (counted + omitted as u64).to_string();
            fields.push((
                envelope::HEADERS_OMITTED,
                HeaderValue::from(omitted_text.as_str()),
            ));
            tracing::warn!(
                omitted,
                "a dead letter leaves out headers NATS cannot carry (counted in intake.headers.omitted)"
            );
        }
        for (name, value) in fields {
            size += name.len() + value.as_str().len() + 4;
            headers.append(HeaderName::from_static(name), value);
        }
        Ok((headers, size))
    }
}

/// `bytes` as a NATS header value: UTF-8 without line breaks. With
/// `escape`, line breaks are written as `\r` and `\n` instead of refused.
fn header_value(bytes: &[u8], escape: bool) -> Option<HeaderValue> {
    let text = std::str::from_utf8(bytes).ok()?;
    if !text.contains(['\r', '\n']) {
        return text.parse().ok();
    }
    if !escape {
        return None;
    }
    text.replace('\r', "\\r").replace('\n', "\\n").parse().ok()
}

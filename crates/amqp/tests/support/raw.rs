//! A publisher that writes AMQP 0-9-1 frames by hand, for content lapin
//! refuses to produce: header names, message ids and routing keys that are
//! not UTF-8 (AMQP short strings are bytes; producers in Go, C or Java write
//! such values freely), and header tables of any shape.
//!
//! Only what publishing needs: PLAIN login, one channel in confirm mode,
//! `basic.publish` with a content header and one body frame, waiting for
//! each `basic.ack`.

use intake_core::BoxError;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const FRAME_METHOD: u8 = 1;
const FRAME_HEADER: u8 = 2;
const FRAME_BODY: u8 = 3;
const FRAME_HEARTBEAT: u8 = 8;
const FRAME_END: u8 = 0xCE;
const CHANNEL: u16 = 1;

/// One message, every field as raw bytes.
#[derive(Clone, Debug, Default)]
pub struct RawMessage {
    /// The exchange to publish to (`""` is the default exchange).
    pub exchange: Vec<u8>,
    /// The routing key.
    pub routing_key: Vec<u8>,
    /// The `message-id` property.
    pub message_id: Option<Vec<u8>>,
    /// The `headers` property, encoded (see [`table`]); empty for none.
    pub headers: Vec<u8>,
    /// The body.
    pub body: Vec<u8>,
}

/// A header table of long-string values, with names as given.
pub fn table(entries: &[(&[u8], &[u8])]) -> Vec<u8> {
    let mut inner = Vec::new();
    for (name, value) in entries {
        inner.push(u8::try_from(name.len()).expect("a name of at most 255 bytes"));
        inner.extend_from_slice(name);
        inner.push(b'S');
        long_bytes(value, &mut inner);
    }
    let mut table = Vec::new();
    long_bytes(&inner, &mut table);
    table
}

fn long_bytes(bytes: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(&u32::try_from(bytes.len()).unwrap_or(u32::MAX).to_be_bytes());
    out.extend_from_slice(bytes);
}

fn short_bytes(bytes: &[u8], out: &mut Vec<u8>) -> Result<(), BoxError> {
    out.push(u8::try_from(bytes.len()).map_err(|_| "a short string over 255 bytes")?);
    out.extend_from_slice(bytes);
    Ok(())
}

fn method(class: u16, method: u16) -> Vec<u8> {
    let mut payload = class.to_be_bytes().to_vec();
    payload.extend_from_slice(&method.to_be_bytes());
    payload
}

struct Wire {
    stream: TcpStream,
}

impl Wire {
    async fn send(&mut self, kind: u8, channel: u16, payload: &[u8]) -> Result<(), BoxError> {
        let mut frame = vec![kind];
        frame.extend_from_slice(&channel.to_be_bytes());
        long_bytes(payload, &mut frame);
        frame.push(FRAME_END);
        self.stream.write_all(&frame).await?;
        Ok(())
    }

    /// The next method frame's class, method and arguments; heartbeats are
    /// skipped, a `close` from the broker is an error with its reply.
    async fn method(&mut self) -> Result<(u16, u16, Vec<u8>), BoxError> {
        loop {
            let mut header = [0u8; 7];
            self.stream.read_exact(&mut header).await?;
            let size = u32::from_be_bytes([header[3], header[4], header[5], header[6]]);
            let mut payload = vec![0u8; usize::try_from(size)? + 1];
            self.stream.read_exact(&mut payload).await?;
            if payload.pop() != Some(FRAME_END) {
                return Err("a frame without its end marker".into());
            }
            match header[0] {
                FRAME_HEARTBEAT => continue,
                FRAME_METHOD if payload.len() >= 4 => {
                    let class = u16::from_be_bytes([payload[0], payload[1]]);
                    let id = u16::from_be_bytes([payload[2], payload[3]]);
                    let arguments = payload.split_off(4);
                    if (class, id) == (10, 50) || (class, id) == (20, 40) {
                        let text = arguments
                            .get(3..3 + usize::from(*arguments.get(2).unwrap_or(&0)))
                            .map(String::from_utf8_lossy)
                            .unwrap_or_default()
                            .into_owned();
                        return Err(format!("the broker closed: {text}").into());
                    }
                    return Ok((class, id, arguments));
                }
                other => return Err(format!("unexpected frame type {other}").into()),
            }
        }
    }

    async fn expect(&mut self, class: u16, id: u16) -> Result<Vec<u8>, BoxError> {
        let (got_class, got_id, arguments) = self.method().await?;
        if (got_class, got_id) != (class, id) {
            return Err(format!("expected method {class}.{id}, got {got_class}.{got_id}").into());
        }
        Ok(arguments)
    }
}

/// Publishes `messages` to the broker at `address` (`host:port`) as
/// `user`/`password` on `vhost`, waiting for the broker's confirm of each.
pub async fn publish(
    address: &str,
    user: &str,
    password: &str,
    vhost: &str,
    messages: &[RawMessage],
) -> Result<(), BoxError> {
    let mut wire = Wire {
        stream: TcpStream::connect(address).await?,
    };
    wire.stream.write_all(b"AMQP\x00\x00\x09\x01").await?;
    wire.expect(10, 10).await?;
    let mut start_ok = method(10, 11);
    long_bytes(&[], &mut start_ok);
    short_bytes(b"PLAIN", &mut start_ok)?;
    long_bytes(format!("\0{user}\0{password}").as_bytes(), &mut start_ok);
    short_bytes(b"en_US", &mut start_ok)?;
    wire.send(FRAME_METHOD, 0, &start_ok).await?;
    let tune = wire.expect(10, 30).await?;
    let mut tune_ok = method(10, 31);
    tune_ok.extend_from_slice(tune.get(..6).ok_or("a short connection.tune")?);
    tune_ok.extend_from_slice(&0u16.to_be_bytes());
    wire.send(FRAME_METHOD, 0, &tune_ok).await?;
    let mut open = method(10, 40);
    short_bytes(vhost.as_bytes(), &mut open)?;
    short_bytes(b"", &mut open)?;
    open.push(0);
    wire.send(FRAME_METHOD, 0, &open).await?;
    wire.expect(10, 41).await?;
    let mut channel_open = method(20, 10);
    short_bytes(b"", &mut channel_open)?;
    wire.send(FRAME_METHOD, CHANNEL, &channel_open).await?;
    wire.expect(20, 11).await?;
    let mut select = method(85, 10);
    select.push(0);
    wire.send(FRAME_METHOD, CHANNEL, &select).await?;
    wire.expect(85, 11).await?;

    for message in messages {
        let mut publish = method(60, 40);
        publish.extend_from_slice(&0u16.to_be_bytes());
        short_bytes(&message.exchange, &mut publish)?;
        short_bytes(&message.routing_key, &mut publish)?;
        publish.push(0);
        wire.send(FRAME_METHOD, CHANNEL, &publish).await?;

        let mut header = 60u16.to_be_bytes().to_vec();
        header.extend_from_slice(&0u16.to_be_bytes());
        header.extend_from_slice(&u64::try_from(message.body.len())?.to_be_bytes());
        // Property flags, highest bit first: headers is bit 13, message-id
        // bit 7, and the properties follow in that order.
        let mut flags = 0u16;
        if !message.headers.is_empty() {
            flags |= 1 << 13;
        }
        if message.message_id.is_some() {
            flags |= 1 << 7;
        }
        header.extend_from_slice(&flags.to_be_bytes());
        header.extend_from_slice(&message.headers);
        if let Some(id) = &message.message_id {
            short_bytes(id, &mut header)?;
        }
        wire.send(FRAME_HEADER, CHANNEL, &header).await?;
        wire.send(FRAME_BODY, CHANNEL, &message.body).await?;
        let (class, id, _) = wire.method().await?;
        if (class, id) != (60, 80) {
            return Err(
                format!("the broker did not confirm the message (method {class}.{id})").into(),
            );
        }
    }
    let mut close = method(10, 50);
    close.extend_from_slice(&200u16.to_be_bytes());
    short_bytes(b"done", &mut close)?;
    close.extend_from_slice(&[0, 0, 0, 0]);
    wire.send(FRAME_METHOD, 0, &close).await?;
    let _ = wire.expect(10, 51).await;
    Ok(())
}

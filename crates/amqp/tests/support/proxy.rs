//! A TCP proxy of the test's own between a client and the shared RabbitMQ,
//! which the test cuts to make an outage: the shared broker itself is never
//! stopped.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What the proxy does with connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Relays both ways.
    Relay,
    /// Relays nothing, and keeps every connection open: a network partition
    /// (no FIN, no RST; only a heartbeat could tell).
    Blackhole,
    /// Relays the broker's first `n` frames of each new connection (the
    /// handshake is three: `start`, `tune`, `open-ok`), then nothing from
    /// the broker: a broker that accepts connections and then stalls.
    StallAfterFrames(usize),
    /// Relays the broker's first `n` frames of each new connection, then
    /// closes it: a broker that lets a consumer start and drops it at once.
    CloseAfterFrames(usize),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Setting {
    mode: Mode,
    /// Connections accepted before the last [`Proxy::drop_connections`]
    /// close.
    generation: u64,
}

/// A running proxy; stops (closing every connection) when dropped.
pub struct Proxy {
    address: SocketAddr,
    setting: watch::Sender<Setting>,
    accepting: JoinHandle<()>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accepting.abort();
        self.setting.send_modify(|setting| setting.generation += 1);
    }
}

impl Proxy {
    /// Listens on a free local port and relays to `upstream`.
    pub async fn start(upstream: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let (setting, watching) = watch::channel(Setting {
            mode: Mode::Relay,
            generation: 0,
        });
        let accepting = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(serve(client, upstream, watching.clone()));
            }
        });
        Ok(Self {
            address,
            setting,
            accepting,
        })
    }

    /// Where clients connect.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Switches every connection, open or new, to `mode`.
    pub fn set(&self, mode: Mode) {
        self.setting.send_modify(|setting| setting.mode = mode);
    }

    /// Closes every open connection (the client sees the stream end).
    pub fn drop_connections(&self) {
        self.setting.send_modify(|setting| setting.generation += 1);
    }
}

/// Counts the frames of a byte stream to tell where the `n`-th one ends.
#[derive(Default)]
struct FrameCounter {
    header: Vec<u8>,
    /// Bytes left of the current frame's payload and end marker.
    remaining: usize,
    complete: usize,
}

impl FrameCounter {
    /// How many bytes of `chunk` belong to the first `limit` frames.
    fn within(&mut self, limit: usize, chunk: &[u8]) -> usize {
        let mut used = 0;
        while used < chunk.len() && self.complete < limit {
            if self.remaining > 0 {
                let take = self.remaining.min(chunk.len() - used);
                self.remaining -= take;
                used += take;
                if self.remaining == 0 {
                    self.complete += 1;
                    self.header.clear();
                }
                continue;
            }
            self.header.push(chunk[used]);
            used += 1;
            if self.header.len() == 7 {
                let size = u32::from_be_bytes([
                    self.header[3],
                    self.header[4],
                    self.header[5],
                    self.header[6],
                ]);
                self.remaining = usize::try_from(size).unwrap_or(usize::MAX) + 1;
            }
        }
        used
    }
}

/// Whether the proxy was switched to [`Mode::Blackhole`] (the latest
/// setting, seen or not).
fn blackholed(setting: &watch::Receiver<Setting>) -> bool {
    setting.borrow().mode == Mode::Blackhole
}

/// Whether the connections of `generation` were dropped (the latest
/// setting, seen or not). A read that completes after that must not be
/// relayed even if the mode is back to [`Mode::Relay`]: a test that
/// blackholes, sends, drops and relays again without yielding lets this
/// task see all of it at once, and what was sent into the blackhole would
/// otherwise reach the broker.
fn dropped(setting: &watch::Receiver<Setting>, generation: u64) -> bool {
    setting.borrow().generation != generation
}

async fn serve(client: TcpStream, upstream: SocketAddr, mut setting: watch::Receiver<Setting>) {
    let Ok(broker) = TcpStream::connect(upstream).await else {
        return;
    };
    let initial = *setting.borrow_and_update();
    let (stall_after, close_after) = match initial.mode {
        Mode::StallAfterFrames(frames) => (Some(frames), None),
        Mode::CloseAfterFrames(frames) => (Some(frames), Some(frames)),
        _ => (None, None),
    };
    let (mut client_read, mut client_write) = client.into_split();
    let (mut broker_read, mut broker_write) = broker.into_split();
    let mut from_client = vec![0u8; 16 * 1024];
    let mut from_broker = vec![0u8; 16 * 1024];
    let mut frames = FrameCounter::default();
    loop {
        let now = *setting.borrow_and_update();
        if now.generation != initial.generation {
            return;
        }
        let relay = now.mode != Mode::Blackhole;
        let from_broker_open = stall_after.is_none_or(|limit| frames.complete < limit);
        tokio::select! {
            read = client_read.read(&mut from_client), if relay => match read {
                Ok(0) | Err(_) => return,
                Ok(_) if dropped(&setting, initial.generation) => return,
                // A read that raced a switch to the blackhole: what the
                // test sends after `set` returned must not get through.
                Ok(_) if blackholed(&setting) => {}
                Ok(n) => {
                    if broker_write.write_all(&from_client[..n]).await.is_err() {
                        return;
                    }
                }
            },
            read = broker_read.read(&mut from_broker), if relay && from_broker_open => match read {
                Ok(0) | Err(_) => return,
                Ok(_) if dropped(&setting, initial.generation) => return,
                Ok(_) if blackholed(&setting) => {}
                Ok(n) => {
                    let forward = match stall_after {
                        Some(limit) => frames.within(limit, &from_broker[..n]),
                        None => n,
                    };
                    if client_write.write_all(&from_broker[..forward]).await.is_err() {
                        return;
                    }
                    if close_after.is_some_and(|limit| frames.complete >= limit) {
                        return;
                    }
                }
            },
            changed = setting.changed() => {
                if changed.is_err() {
                    return;
                }
            }
        }
    }
}

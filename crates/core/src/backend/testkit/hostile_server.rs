//! [`HostileServer`]: a TCP server that accepts connections and then
//! misbehaves, so a backend's tests can prove that a broker which never
//! answers (or answers nonsense) ends in a typed error within a bounded time,
//! never in a hang or a panic.
//!
//! ```
//! use intake_core::backend::testkit::hostile_server::{HostileServer, Misbehaviour};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> std::io::Result<()> {
//! let server = HostileServer::start(Misbehaviour::Silent).await?;
//! let url = format!("redis://{}", server.addr());
//! // connect a source to `url` and expect an error, not a hang
//! # drop(url);
//! # Ok(())
//! # }
//! ```

use std::net::SocketAddr;

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// How a [`HostileServer`] treats each connection it accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Misbehaviour {
    /// Accepts, then never reads, writes or closes: a broker hung after the
    /// TCP handshake (or a firewall that swallows the traffic).
    Silent,
    /// Accepts and closes at once.
    CloseAtOnce,
    /// Accepts, writes these bytes, then stays silent: something that is not
    /// the broker listens on the port.
    Garbage(&'static [u8]),
}

/// A misbehaving TCP server on 127.0.0.1, on a port of its own. Stops (and
/// drops every connection) when dropped.
#[derive(Debug)]
pub struct HostileServer {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl HostileServer {
    /// Listens on a free port of 127.0.0.1 and treats every connection as
    /// `misbehaviour` says. Call it inside a Tokio runtime.
    pub async fn start(misbehaviour: Misbehaviour) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            // Held, not read: a silent peer keeps its connections open.
            let mut held: Vec<TcpStream> = Vec::new();
            while let Ok((mut stream, _)) = listener.accept().await {
                match misbehaviour {
                    Misbehaviour::Silent => held.push(stream),
                    Misbehaviour::CloseAtOnce => drop(stream),
                    Misbehaviour::Garbage(bytes) => {
                        let _ = stream.write_all(bytes).await;
                        held.push(stream);
                    }
                }
            }
        });
        Ok(Self { addr, task })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for HostileServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

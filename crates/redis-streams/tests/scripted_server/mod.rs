//! A TCP server that speaks just enough RESP to pose as Redis after the
//! handshake, answering each command as the test's script says: replies of
//! servers this machine does not run (Redis 6.2's `XCLAIM` nil entries,
//! failover errors) and replies no server sends (hostile content), through
//! the real client and the backend's real parsing code.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// One command as the client sent it, arguments as text (lossy).
pub type Command = Vec<String>;

/// Answers a command (and the number of the connection it came on, from 0
/// in the order of accepting) with raw RESP bytes, or `None` for the
/// default answer (see [`default_reply`]).
pub type Script = dyn Fn(usize, &Command) -> Option<Vec<u8>> + Send + Sync;

/// A scripted server on a free port of 127.0.0.1; stops when dropped.
pub struct ScriptedServer {
    addr: SocketAddr,
    commands: Arc<Mutex<Vec<Command>>>,
    task: JoinHandle<()>,
}

impl Drop for ScriptedServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ScriptedServer {
    /// Listens and answers every connection's commands with `script`.
    pub async fn start(
        script: impl Fn(usize, &Command) -> Option<Vec<u8>> + Send + Sync + 'static,
    ) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a local listener");
        let addr = listener.local_addr().expect("its address");
        let commands = Arc::new(Mutex::new(Vec::new()));
        let script: Arc<Script> = Arc::new(script);
        let recorded = commands.clone();
        let task = tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            let mut accepted = 0;
            while let Ok((stream, _)) = listener.accept().await {
                let connection = accepted;
                accepted += 1;
                let script = script.clone();
                let recorded = recorded.clone();
                connections.spawn(async move {
                    let (reader, mut writer) = stream.into_split();
                    let mut reader = BufReader::new(reader);
                    while let Some(command) = read_command(&mut reader).await {
                        recorded
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .push(command.clone());
                        if command.first().is_some_and(|name| name == "XREADGROUP")
                            && command.iter().any(|arg| arg == "BLOCK")
                        {
                            // A blocking read that finds nothing waits a
                            // little, as Redis would, instead of spinning.
                            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                        }
                        let reply =
                            script(connection, &command).unwrap_or_else(|| default_reply(&command));
                        if writer.write_all(&reply).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        Self {
            addr,
            commands,
            task,
        }
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `redis://` URL of the server.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// Every command received so far, in order.
    pub fn commands(&self) -> Vec<Command> {
        self.commands
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The commands named `name` received so far.
    pub fn commands_named(&self, name: &str) -> Vec<Command> {
        self.commands()
            .into_iter()
            .filter(|command| {
                command
                    .first()
                    .is_some_and(|first| first.eq_ignore_ascii_case(name))
            })
            .collect()
    }
}

/// What a quiet Redis 6.2 with empty streams answers: the version for
/// `INFO`, a client id, no pending entries, no new entries, `+OK` for the
/// rest.
pub fn default_reply(command: &Command) -> Vec<u8> {
    let name = command.first().map(|name| name.to_ascii_uppercase());
    match name.as_deref() {
        Some("INFO") => bulk("# Server\r\nredis_version:6.2.14\r\n"),
        Some("CLIENT")
            if command.get(1).is_some_and(|sub| {
                sub.eq_ignore_ascii_case("ID") || sub.eq_ignore_ascii_case("KILL")
            }) =>
        {
            b":1\r\n".to_vec()
        }
        Some("XPENDING" | "XRANGE" | "XCLAIM") => b"*0\r\n".to_vec(),
        Some("XREADGROUP" | "XREAD") => b"*-1\r\n".to_vec(),
        Some("XACK" | "XDEL" | "EVALSHA" | "EVAL") => b":0\r\n".to_vec(),
        _ => b"+OK\r\n".to_vec(),
    }
}

/// A bulk string.
pub fn bulk(text: &str) -> Vec<u8> {
    format!("${}\r\n{text}\r\n", text.len()).into_bytes()
}

/// An array of already encoded items.
pub fn array(items: &[Vec<u8>]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", items.len()).into_bytes();
    for item in items {
        out.extend_from_slice(item);
    }
    out
}

/// An error reply `-<text>`.
pub fn error(text: &str) -> Vec<u8> {
    format!("-{text}\r\n").into_bytes()
}

/// An integer.
pub fn int(value: i64) -> Vec<u8> {
    format!(":{value}\r\n").into_bytes()
}

/// An entry `[id, [field, value, …]]`.
pub fn entry(id: &str, fields: &[(&str, &str)]) -> Vec<u8> {
    let fields: Vec<Vec<u8>> = fields
        .iter()
        .flat_map(|(name, value)| [bulk(name), bulk(value)])
        .collect();
    array(&[bulk(id), array(&fields)])
}

/// A row of an extended `XPENDING` reply.
pub fn pending_row(id: &str, consumer: &str, idle_ms: i64, deliveries: i64) -> Vec<u8> {
    array(&[bulk(id), bulk(consumer), int(idle_ms), int(deliveries)])
}

/// RESP2's null bulk string, which Redis before 7.0 put in an `XCLAIM`
/// reply for an entry deleted while pending.
pub const NULL: &[u8] = b"$-1\r\n";

async fn read_command<R: tokio::io::AsyncBufRead + Unpin>(reader: &mut R) -> Option<Command> {
    let mut line = String::new();
    reader.read_line(&mut line).await.ok()?;
    let count: usize = line.trim_end().strip_prefix('*')?.parse().ok()?;
    let mut command = Vec::with_capacity(count.min(64));
    for _ in 0..count {
        line.clear();
        reader.read_line(&mut line).await.ok()?;
        let length: usize = line.trim_end().strip_prefix('$')?.parse().ok()?;
        let mut data = vec![0; length + 2];
        reader.read_exact(&mut data).await.ok()?;
        data.truncate(length);
        command.push(String::from_utf8_lossy(&data).into_owned());
    }
    Some(command)
}

//! The real brokers the suite runs against, and the faults it injects into
//! them while a consumer runs.

use std::net::{TcpStream, ToSocketAddrs};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use intake::kafka::GroupProtocol;
use intake::redis_streams::redis;

use super::child::run_to_completion;
use super::own_broker::OwnBroker;
use super::own_nats::OwnServer;
use super::sockets;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// Kafka, its consumer groups under `GroupProtocol`: classic, or
    /// KIP-848's consumer protocol (`group.protocol=consumer`, the group's
    /// session set on the broker by the ledger).
    Kafka(GroupProtocol),
    Redis,
    Amqp,
    Nats,
}

const KAFKA_PORT: u16 = 9092;
const REDIS_PORT: u16 = 6379;
const AMQP_PORT: u16 = 5672;
const NATS_PORT: u16 = 4222;

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Self::Kafka(GroupProtocol::Consumer) => "kafka-kip848",
            Self::Kafka(_) => "kafka",
            Self::Redis => "redis",
            Self::Amqp => "amqp",
            Self::Nats => "nats",
        }
    }

    /// The `--broker` URL of the ledger program.
    pub fn url(self) -> String {
        match self {
            Self::Kafka(_) => format!("kafka://127.0.0.1:{KAFKA_PORT}"),
            Self::Redis => format!("redis://127.0.0.1:{REDIS_PORT}"),
            Self::Amqp => format!("amqp://guest:guest@127.0.0.1:{AMQP_PORT}/%2f"),
            Self::Nats => format!("nats://127.0.0.1:{NATS_PORT}"),
        }
    }

    fn port(self) -> u16 {
        match self {
            Self::Kafka(_) => KAFKA_PORT,
            Self::Redis => REDIS_PORT,
            Self::Amqp => AMQP_PORT,
            Self::Nats => NATS_PORT,
        }
    }

    /// Partitions of a produced source: Kafka's are real partitions (two
    /// consumers of a group each get some); Redis streams and AMQP queues
    /// have none.
    pub fn partitions(self) -> Option<u32> {
        match self {
            Self::Kafka(_) => Some(4),
            Self::Redis | Self::Amqp | Self::Nats => None,
        }
    }

    /// How long a consumer must stay idle before exiting when the broker
    /// may be away meanwhile (restarting, or the consumer reconnecting with
    /// backoff): idleness during an outage is not the end of the work.
    pub fn outage_idle_exit(self) -> Duration {
        match self {
            Self::Kafka(_) => Duration::from_secs(15),
            // Entries the consumer held when its connection died are claimed
            // back after 3 s.
            Self::Redis => Duration::from_secs(6),
            Self::Amqp => Duration::from_secs(5),
            // The ledger's ack_wait is 5 s; its backlog probe waits for
            // what the server still has to deliver again.
            Self::Nats => Duration::from_secs(8),
        }
    }

    /// How long a consumer must go without messages before it may conclude
    /// that the work is done, when a killed consumer's share must reach it
    /// first: Kafka waits for the dead member's session to expire and
    /// rebalances, Redis waits until the dead consumer's pending entries are
    /// idle long enough to claim, RabbitMQ requeues them at once.
    /// Whether each key's messages are handled in their order through
    /// SIGKILLs of the consumer (docs/CONTRACT.md §11).
    pub fn keeps_key_order_through_kills(self) -> bool {
        match self {
            // Redis: a key's newer entries wait in the source until the
            // killed consumer's pending ones of that key are claimed.
            Self::Kafka(_) | Self::Amqp | Self::Redis => true,
            // JetStream redelivers a killed consumer's messages after
            // `ack_wait`, behind newer ones of their keys.
            Self::Nats => false,
        }
    }

    pub fn drain_idle_exit(self) -> Duration {
        match self {
            // What a killed member held comes back once its session (the
            // ledger's 6 s) expires; the ledger's lag probe waits for it
            // (the group's committed offsets short of the topic's end), so
            // the idle time itself need not cover the session.
            Self::Kafka(_) => Duration::from_secs(3),
            // The ledger claims entries idle for 3 s, looking every 0.5 s.
            Self::Redis => Duration::from_secs(6),
            Self::Amqp => Duration::from_secs(3),
            // What a killed consumer held comes back after the ledger's 5 s
            // ack_wait; the ledger's backlog probe waits for it.
            Self::Nats => Duration::from_secs(3),
        }
    }

    /// Environment for `ledger consume` on this backend.
    ///
    /// Kafka: a member that joins while a SIGKILLed member is still in the
    /// group waits until the coordinator evicts the dead one (its session,
    /// the ledger's 6 s) or until the rebalance times out, whichever comes
    /// first; the rebalance timeout is the members' `max.poll.interval.ms`.
    /// 25 s bounds that wait (it must stay above the ledger's 20 s revoke
    /// timeout); the runtime polls continuously, so the shorter interval
    /// costs nothing else. The variable applies to every client of the
    /// ledger, some of which keep librdkafka's 45 s session timeout, which
    /// may not exceed the poll interval: hence the ledger's own 6 s,
    /// restated. Under KIP-848 the member sends no session (librdkafka
    /// refuses `session.timeout.ms` there): the ledger sets its group's
    /// 6 s on the broker.
    pub fn consumer_env(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Self::Kafka(GroupProtocol::Consumer) => &[(
                "LEDGER_KAFKA_SETTINGS",
                "group.protocol=consumer,max.poll.interval.ms=25000",
            )],
            Self::Kafka(_) => &[(
                "LEDGER_KAFKA_SETTINGS",
                "session.timeout.ms=6000,max.poll.interval.ms=25000",
            )],
            Self::Redis | Self::Amqp | Self::Nats => &[],
        }
    }

    /// `Err(why)` unless the broker accepts TCP connections.
    pub fn reachable(self) -> Result<(), String> {
        let address = ("127.0.0.1", self.port())
            .to_socket_addrs()
            .ok()
            .and_then(|mut addresses| addresses.next())
            .expect("a literal address resolves");
        TcpStream::connect_timeout(&address, Duration::from_secs(2))
            .map(drop)
            .map_err(|error| format!("{} is not reachable at {address}: {error}", self.name()))
    }

    /// `Err(why)` when this machine cannot inject [`Self::inject_fault`]'s
    /// fault (a missing tool, a broker this suite cannot restart).
    pub fn fault_available(self, logs: &Path) -> Result<(), String> {
        match self {
            // The scenario starts a broker of its own; a machine that cannot
            // has no Kafka at all.
            Self::Kafka(_) | Self::Redis | Self::Nats => Ok(()),
            Self::Amqp => list_amqp_connections(logs)
                .map(drop)
                .map_err(|error| format!("rabbitmqctl cannot list connections here: {error}")),
        }
    }

    /// What [`Self::inject_fault`] does, for summaries.
    pub fn fault_name(self) -> &'static str {
        match self {
            Self::Kafka(_) => "broker-crash",
            Self::Redis => "client-kill",
            Self::Amqp => "connection-close",
            Self::Nats => "server-crash",
        }
    }

    /// Breaks the consumer `pid`'s hold on the broker from the broker's
    /// side: Kafka SIGKILLs the scenario's own broker (`own_kafka`, never
    /// the shared one) and starts it again on the same storage, Redis
    /// `CLIENT KILL`s the consumer's connections, RabbitMQ closes them.
    /// Returns what was done.
    pub fn inject_fault(
        self,
        pid: u32,
        logs: &Path,
        own_kafka: Option<&OwnBroker>,
    ) -> Result<String, String> {
        match (self, own_kafka) {
            (Self::Kafka(_), Some(broker)) => crash_kafka(broker),
            (Self::Kafka(_), None) => {
                Err("Kafka's broker fault needs the scenario's own broker".to_owned())
            }
            (Self::Redis, _) => kill_redis_clients(pid),
            (Self::Amqp, _) => close_amqp_connections(pid, logs),
            (Self::Nats, _) => {
                Err("NATS's fault needs the scenario's own server (crash_nats)".to_owned())
            }
        }
    }
}

impl Backend {
    /// Removes a passed scenario's source, so that runs do not pile up
    /// streams of 50,000 entries in Redis or quorum queues in RabbitMQ.
    /// Best effort; Kafka topics stay (a topic without consumers costs
    /// nothing but disk, and the broker's storage is the CI machine's
    /// cache, rebuilt when absent).
    pub fn remove_source(self, source: &str, logs: &Path) {
        let removed = match self {
            Self::Kafka(_) => Ok(()),
            Self::Nats => delete_nats_stream(source),
            Self::Redis => redis::Client::open(self.url())
                .and_then(|client| client.get_connection_with_timeout(Duration::from_secs(5)))
                .and_then(|mut admin| redis::cmd("DEL").arg(source).query::<()>(&mut admin))
                .map_err(|error| error.to_string()),
            Self::Amqp => {
                let mut delete = Command::new("rabbitmqctl");
                delete.args(["--quiet", "delete_queue", source]);
                run_to_completion(delete, "rabbitmqctl-delete", logs, RABBITMQCTL_TIMEOUT).map(drop)
            }
        };
        if let Err(error) = removed {
            eprintln!(
                "chaos: could not remove {} source {source}: {error}",
                self.name()
            );
        }
    }
}

/// SIGKILLs the scenario's own broker, then starts it again on the same
/// storage (data and committed offsets survive; the log is recovered).
fn crash_kafka(broker: &OwnBroker) -> Result<String, String> {
    broker.kill().map_err(|error| error.to_string())?;
    broker.restart().map_err(|error| error.to_string())?;
    Ok("killed the broker (SIGKILL) and started it again".to_owned())
}

/// Deletes JetStream stream `stream` of the shared server, over the plain
/// protocol (`$JS.API.STREAM.DELETE.<stream>`, then a `PING` answered once
/// the server processed it): the suite has no async runtime here.
fn delete_nats_stream(stream: &str) -> Result<(), String> {
    use std::io::{Read, Write};
    let failed = |error: std::io::Error| format!("NATS admin connection: {error}");
    let mut socket = TcpStream::connect(("127.0.0.1", NATS_PORT)).map_err(failed)?;
    socket
        .set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(failed)?;
    let mut greeting = [0u8; 4096];
    let _ = socket.read(&mut greeting).map_err(failed)?;
    let request = format!(
        "CONNECT {{\"verbose\":false}}\r\nPUB $JS.API.STREAM.DELETE.{stream} 0\r\n\r\nPING\r\n"
    );
    socket.write_all(request.as_bytes()).map_err(failed)?;
    let mut answer = [0u8; 256];
    let read = socket.read(&mut answer).map_err(failed)?;
    match answer[..read].windows(4).any(|window| window == b"PONG") {
        true => Ok(()),
        false => Err(format!(
            "no PONG after deleting the stream: {}",
            String::from_utf8_lossy(&answer[..read])
        )),
    }
}

/// SIGKILLs the NATS scenario's own server, then starts it again on the
/// same storage (streams, consumers and their acknowledgements survive).
pub fn crash_nats(server: &OwnServer) -> Result<String, String> {
    server.kill().map_err(|error| error.to_string())?;
    server.restart().map_err(|error| error.to_string())?;
    Ok("killed the server (SIGKILL) and started it again".to_owned())
}

/// `CLIENT KILL`s every connection of `pid` (found by client port; the
/// consumer does not name its connections).
fn kill_redis_clients(pid: u32) -> Result<String, String> {
    let ports = sockets::client_ports(pid, REDIS_PORT)?;
    let failed = |error: redis::RedisError| format!("Redis admin connection: {error}");
    let client = redis::Client::open(Backend::Redis.url()).map_err(failed)?;
    let mut admin = client
        .get_connection_with_timeout(Duration::from_secs(5))
        .map_err(failed)?;
    let clients: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query(&mut admin)
        .map_err(failed)?;
    let mut killed = 0;
    for line in clients.lines() {
        // `id=7 addr=127.0.0.1:51234 laddr=… fd=8 name= …`
        let field = |name: &str| {
            line.split_whitespace()
                .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))
        };
        let port = field("addr")
            .and_then(|addr| addr.rsplit_once(':'))
            .and_then(|(_, port)| port.parse::<u16>().ok());
        if let (Some(id), Some(port)) = (field("id"), port)
            && ports.contains(&port)
        {
            let _: redis::Value = redis::cmd("CLIENT")
                .arg("KILL")
                .arg("ID")
                .arg(id)
                .query(&mut admin)
                .map_err(failed)?;
            killed += 1;
        }
    }
    if killed == 0 {
        return Err(format!(
            "CLIENT LIST shows no connection of the consumer (pid {pid}, ports {ports:?})"
        ));
    }
    Ok(format!("killed {killed} client connections"))
}

/// Closes every AMQP connection of `pid` from the broker's side
/// (`rabbitmqctl close_connection`, found by client port).
///
/// Each rabbitmqctl call starts an Erlang VM (about a second, more on busy
/// cores), long enough for the consumer to finish its backlog before the
/// close lands. So the consumer is frozen (SIGSTOP) at the seeded moment,
/// with whatever it has in flight, and thawed once the broker has closed its
/// connections: it wakes up to a dead connection mid-work.
fn close_amqp_connections(pid: u32, logs: &Path) -> Result<String, String> {
    // A fault that lands right after the previous one can freeze the
    // consumer while it reconnects, with no connection to close: thaw it,
    // give it a moment to reconnect, and try again (bounded).
    let mut attempts = 0;
    let (_frozen, ports) = loop {
        let frozen = Frozen::stop(pid)?;
        let ports = sockets::client_ports(pid, AMQP_PORT)?;
        attempts += 1;
        if !ports.is_empty() || attempts == RECONNECT_ATTEMPTS {
            break (frozen, ports);
        }
        drop(frozen);
        std::thread::sleep(Duration::from_millis(500));
    };
    let listing = list_amqp_connections(logs)?;
    let mut closed = 0;
    for line in listing.lines() {
        // `<rabbit@host.1700000000.1234.0>\t51234`
        let Some((connection, port)) = line.trim().rsplit_once(char::is_whitespace) else {
            continue;
        };
        if !port.parse::<u16>().is_ok_and(|port| ports.contains(&port)) {
            continue;
        }
        let mut close = Command::new("rabbitmqctl");
        close.args(["close_connection", connection.trim(), "chaos"]);
        run_to_completion(close, "rabbitmqctl-close", logs, RABBITMQCTL_TIMEOUT)?;
        closed += 1;
    }
    if closed == 0 {
        return Err(format!(
            "rabbitmqctl list_connections shows no connection of the consumer (pid {pid}, ports \
             {ports:?})"
        ));
    }
    Ok(format!("closed {closed} connections"))
}

/// How often a fault looks for the consumer's connection before it gives
/// up: 500 ms apart, longer than a reconnect's first backoff.
const RECONNECT_ATTEMPTS: u32 = 10;

/// rabbitmqctl starts an Erlang VM per call: a second or two.
const RABBITMQCTL_TIMEOUT: Duration = Duration::from_secs(30);

/// `rabbitmqctl list_connections pid peer_port`: one connection per line.
fn list_amqp_connections(logs: &Path) -> Result<String, String> {
    let mut list = Command::new("rabbitmqctl");
    list.args([
        "--quiet",
        "--no-table-headers",
        "list_connections",
        "pid",
        "peer_port",
    ]);
    run_to_completion(list, "rabbitmqctl-list", logs, RABBITMQCTL_TIMEOUT)
}

/// A process stopped with SIGSTOP until this is dropped (SIGCONT), also when
/// the fault fails half-way.
struct Frozen {
    pid: u32,
}

impl Frozen {
    fn stop(pid: u32) -> Result<Self, String> {
        send_signal(pid, "-STOP")?;
        Ok(Self { pid })
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        if let Err(error) = send_signal(self.pid, "-CONT") {
            eprintln!("chaos: cannot thaw pid {}: {error}", self.pid);
        }
    }
}

/// `kill -SIGNAL pid` (std only sends SIGKILL).
pub fn send_signal(pid: u32, signal: &str) -> Result<(), String> {
    let status = Command::new("kill")
        .arg(signal)
        .arg(pid.to_string())
        .status()
        .map_err(|error| format!("kill {signal} {pid}: {error}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("kill {signal} {pid} failed ({status})"))
    }
}

//! The sslmode a URL without one gets, and what a server without TLS does
//! to each mode (review M1: `prefer` downgraded to clear text silently).
//!
//! The shared test server has `ssl = on`, so these tests put a front of
//! their own before it: it answers PostgreSQL's `SSLRequest` with `N` (as a
//! server without TLS, or a man in the middle stripping TLS, does) and
//! passes everything else to the real server in clear text. A front on the
//! machine's own non-loopback address stands for a server across a network.

mod common;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use intake_postgres::{Error, PoolConfig, SslMode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// PostgreSQL's `SSLRequest`: length 8, code 80877103.
const SSL_REQUEST: [u8; 8] = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];

/// The real server behind every front.
const UPSTREAM: &str = "127.0.0.1:5432";

/// A PostgreSQL server without TLS: the shared server, behind a front that
/// refuses every `SSLRequest` (or, `transparent`, passes it on: the shared
/// server itself, TLS and all, at another address).
struct ClearTextFront {
    address: SocketAddr,
    ssl_requests: Arc<AtomicUsize>,
    connections: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ClearTextFront {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ClearTextFront {
    async fn start(ip: IpAddr) -> std::io::Result<Self> {
        Self::start_passing(ip, false).await
    }

    async fn start_passing(ip: IpAddr, transparent: bool) -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind((ip, 0)).await?;
        let address = listener.local_addr()?;
        let ssl_requests = Arc::new(AtomicUsize::new(0));
        let connections = Arc::new(AtomicUsize::new(0));
        let (requests, accepted) = (Arc::clone(&ssl_requests), Arc::clone(&connections));
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                accepted.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(pass(client, Arc::clone(&requests), transparent));
            }
        });
        Ok(Self {
            address,
            ssl_requests,
            connections,
            task,
        })
    }

    /// The test database's URL with this front as its host and `query`.
    fn url(&self, query: &str) -> Option<String> {
        let base = std::env::var("INTAKE_POSTGRES_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
        if !base.contains(UPSTREAM) {
            return None;
        }
        let host = match self.address.ip() {
            IpAddr::V4(ip) => format!("{ip}:{}", self.address.port()),
            IpAddr::V6(ip) => format!("[{ip}]:{}", self.address.port()),
        };
        let url = base.replace(UPSTREAM, &host);
        Some(match (query.is_empty(), url.contains('?')) {
            (true, _) => url,
            (false, true) => format!("{url}&{query}"),
            (false, false) => format!("{url}?{query}"),
        })
    }
}

/// One connection through the front: an `SSLRequest` is refused with `N`
/// (unless `transparent`), the rest goes to the real server as it comes.
async fn pass(
    mut client: tokio::net::TcpStream,
    ssl_requests: Arc<AtomicUsize>,
    transparent: bool,
) {
    let mut first = [0; 8];
    if client.read_exact(&mut first).await.is_err() {
        return;
    }
    let Ok(mut upstream) = tokio::net::TcpStream::connect(UPSTREAM).await else {
        return;
    };
    let started = if first == SSL_REQUEST && !transparent {
        ssl_requests.fetch_add(1, Ordering::Relaxed);
        client.write_all(b"N").await
    } else {
        upstream.write_all(&first).await
    };
    if started.is_ok() {
        let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
    }
}

/// This machine's own address on a non-loopback interface (the one a
/// datagram to a documentation address would leave from; nothing is
/// sent), or `None` on a machine with loopback alone.
fn non_loopback_address() -> Option<IpAddr> {
    ["198.51.100.1:9", "192.0.2.1:9", "10.255.255.1:9"]
        .iter()
        .find_map(|probe| {
            let socket = std::net::UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).ok()?;
            socket.connect(probe).ok()?;
            let ip = socket.local_addr().ok()?.ip();
            (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
        })
}

/// Whether the connection behind `pool` is encrypted, as the server sees it.
async fn encrypted(pool: &sqlx::PgPool) -> bool {
    sqlx::query_scalar::<_, bool>("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        .fetch_one(pool)
        .await
        .expect("pg_stat_ssl")
}

/// A front on `ip` before the test database, or `None` after saying why the
/// test is skipped.
async fn front(test: &str, ip: IpAddr) -> Option<ClearTextFront> {
    common::database(test, 1).await?;
    match ClearTextFront::start(ip).await {
        Ok(front) if front.url("").is_some() => Some(front),
        Ok(_) => {
            println!("skipped: {test}: INTAKE_POSTGRES_URL is not on {UPSTREAM}");
            None
        }
        Err(error) => {
            intake_core::backend::testkit::skip_or_fail(test, &format!("no front: {error}"));
            None
        }
    }
}

/// A front on this machine's non-loopback address, or `None` (a machine
/// without one is no missing broker: the decision itself is unit-tested in
/// `src/pool.rs`).
async fn remote_front(test: &str) -> Option<ClearTextFront> {
    let Some(ip) = non_loopback_address() else {
        println!("skipped: {test}: this machine has no non-loopback address");
        return None;
    };
    front(test, ip).await
}

/// A subscriber that writes every event to a buffer the test reads.
fn captured_logs() -> (impl tracing::Subscriber, Arc<std::sync::Mutex<Vec<u8>>>) {
    let buffer = Arc::new(std::sync::Mutex::new(Vec::new()));
    let writer = Arc::clone(&buffer);
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .with_writer(move || SharedBuffer(Arc::clone(&writer)))
        .finish();
    (subscriber, buffer)
}

struct SharedBuffer(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for SharedBuffer {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn text_of(logs: &std::sync::Mutex<Vec<u8>>) -> String {
    String::from_utf8_lossy(
        &logs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    )
    .into_owned()
}

#[tokio::test]
async fn a_loopback_url_without_sslmode_connects_to_a_server_without_tls() {
    let test = "a_loopback_url_without_sslmode_connects";
    let Some(front) = front(test, IpAddr::V4(Ipv4Addr::LOCALHOST)).await else {
        return;
    };
    let url = front.url("").expect("a URL");
    let (subscriber, logs) = captured_logs();
    let _logging = tracing::subscriber::set_default(subscriber);
    let pool = PoolConfig::new(&url)
        .expect("a URL")
        .max_connections(1)
        .acquire_timeout(Duration::from_secs(5))
        .connect()
        .await
        .expect("a loopback server without TLS is reached in clear text");
    assert!(!encrypted(&pool).await);
    assert_eq!(
        front.ssl_requests.load(Ordering::Relaxed),
        1,
        "TLS was asked for first (prefer)"
    );
    // The mode and why, once, in the log.
    let logs = text_of(&logs);
    assert!(
        logs.contains("sslmode=prefer") && logs.contains("loopback"),
        "the chosen mode is logged: {logs}"
    );
    assert!(
        !logs.contains("WARN"),
        "loopback clear text is no warning: {logs}"
    );
}

#[tokio::test]
async fn sslmode_require_against_a_server_without_tls_fails_with_a_typed_error_that_says_what_to_do()
 {
    let test = "sslmode_require_against_a_server_without_tls";
    let Some(front) = front(test, IpAddr::V4(Ipv4Addr::LOCALHOST)).await else {
        return;
    };
    let url = front
        .url("sslmode=require")
        .expect("a URL")
        .replace("postgres@", "postgres:hunter2@");
    let error = PoolConfig::new(&url)
        .expect("a URL")
        .max_connections(1)
        .acquire_timeout(Duration::from_secs(5))
        .connect()
        .await
        .expect_err("require never goes clear text");
    assert!(
        matches!(
            error,
            Error::TlsNotOffered {
                ssl_mode: SslMode::Require,
                by_default: false,
                ..
            }
        ),
        "{error:?}"
    );
    let text = error.to_string();
    assert!(!error.is_transient(), "{error:?}");
    assert!(
        text.contains("does not offer TLS"),
        "says what failed: {text}"
    );
    assert!(text.contains("ssl = on"), "says what to turn on: {text}");
    assert!(
        text.contains("sslmode=prefer"),
        "says how to accept clear text: {text}"
    );
    assert!(
        !text.contains("verify-full"),
        "not a certificate problem: {text}"
    );
    assert!(!text.contains("hunter2") && !format!("{error:?}").contains("hunter2"));
    assert_eq!(front.ssl_requests.load(Ordering::Relaxed), 1);
}

#[tokio::test]
async fn a_non_loopback_url_without_sslmode_refuses_a_server_without_tls() {
    let test = "a_non_loopback_url_without_sslmode_refuses_a_server_without_tls";
    let Some(front) = remote_front(test).await else {
        return;
    };
    let url = front.url("").expect("a URL");
    let connected = PoolConfig::new(&url)
        .expect("a URL")
        .max_connections(1)
        .acquire_timeout(Duration::from_secs(5))
        .connect()
        .await;
    let error = match connected {
        Ok(pool) => panic!(
            "{url} without sslmode connected, encrypted: {}",
            encrypted(&pool).await
        ),
        Err(error) => error,
    };
    assert!(
        matches!(
            error,
            Error::TlsNotOffered {
                ssl_mode: SslMode::Require,
                by_default: true,
                ..
            }
        ),
        "{error:?}"
    );
    let text = error.to_string();
    assert!(text.contains("does not offer TLS"), "{text}");
    assert!(
        text.contains("default"),
        "says the mode was the default: {text}"
    );
    assert!(text.contains("sslmode=prefer"), "{text}");
    assert_eq!(
        front.ssl_requests.load(Ordering::Relaxed),
        1,
        "one refused SSLRequest, no clear-text retry"
    );
    assert_eq!(front.connections.load(Ordering::Relaxed), 1);
}

#[tokio::test]
async fn sslmode_prefer_to_a_non_loopback_host_warns_once_when_it_gets_clear_text() {
    let test = "sslmode_prefer_to_a_non_loopback_host_warns_once";
    let Some(front) = remote_front(test).await else {
        return;
    };
    let url = front.url("sslmode=prefer").expect("a URL");
    let (subscriber, logs) = captured_logs();
    let _logging = tracing::subscriber::set_default(subscriber);
    let pool = PoolConfig::new(&url)
        .expect("a URL")
        .max_connections(3)
        .acquire_timeout(Duration::from_secs(5))
        .connect()
        .await
        .expect("prefer accepts clear text");
    // Three connections, each in clear text.
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(pool.acquire().await.expect("a connection"));
    }
    assert_eq!(front.connections.load(Ordering::Relaxed), 3);
    drop(held);
    let logs = text_of(&logs);
    let warnings: Vec<&str> = logs
        .lines()
        .filter(|line| line.contains("WARN") && line.contains("not encrypted"))
        .collect();
    assert_eq!(warnings.len(), 1, "one warning for the pool: {logs}");
    assert!(warnings[0].contains("sslmode=prefer"), "{}", warnings[0]);
    assert!(
        warnings[0].contains("require"),
        "says what to set: {}",
        warnings[0]
    );
}

#[tokio::test]
async fn explicit_modes_still_work_against_a_server_without_tls() {
    let test = "explicit_modes_still_work_against_a_server_without_tls";
    let Some(front) = remote_front(test).await else {
        return;
    };
    for (mode, connects) in [
        ("disable", true),
        ("allow", true),
        ("prefer", true),
        ("require", false),
        ("verify-ca", false),
        ("verify-full", false),
    ] {
        let url = front.url(&format!("sslmode={mode}")).expect("a URL");
        let connected = PoolConfig::new(&url)
            .expect("a URL")
            .max_connections(1)
            .acquire_timeout(Duration::from_secs(5))
            .connect()
            .await;
        match connected {
            Ok(pool) => {
                assert!(connects, "sslmode={mode} connected");
                assert!(!encrypted(&pool).await);
            }
            Err(error) => {
                assert!(!connects, "sslmode={mode}: {error}");
                assert!(
                    matches!(&error, Error::TlsNotOffered { ssl_mode, .. } if ssl_mode.as_str() == mode),
                    "{error:?}"
                );
            }
        }
    }
}

#[tokio::test]
async fn a_non_loopback_url_without_sslmode_connects_with_tls_when_the_server_offers_it() {
    let test = "a_non_loopback_url_without_sslmode_connects_with_tls";
    let Some(ip) = non_loopback_address() else {
        println!("skipped: {test}: this machine has no non-loopback address");
        return;
    };
    if common::database(test, 1).await.is_none() {
        return;
    }
    let front = ClearTextFront::start_passing(ip, true)
        .await
        .expect("a front");
    let Some(url) = front.url("") else {
        println!("skipped: {test}: INTAKE_POSTGRES_URL is not on {UPSTREAM}");
        return;
    };
    let config = PoolConfig::new(&url).expect("a URL").max_connections(2);
    assert_eq!(config.ssl_mode(), Some(SslMode::Require));
    let pool = config
        .connect()
        .await
        .expect("require against a server with TLS");
    assert!(encrypted(&pool).await);
    // Under prefer the same server is reached with TLS, and nothing warns.
    let (subscriber, logs) = captured_logs();
    let _logging = tracing::subscriber::set_default(subscriber);
    let url = front.url("sslmode=prefer").expect("a URL");
    let pool = PoolConfig::new(&url)
        .expect("a URL")
        .max_connections(2)
        .connect()
        .await
        .expect("prefer against a server with TLS");
    let held = (
        pool.acquire().await.expect("a connection"),
        pool.acquire().await.expect("a connection"),
    );
    drop(held);
    assert!(encrypted(&pool).await);
    let logs = text_of(&logs);
    assert!(!logs.contains("not encrypted"), "{logs}");
    assert!(logs.contains("sslmode=prefer"), "{logs}");
}

//! The built-in health listener under clients that hold connections open
//! (review R21): idle connections, a head sent a byte at a time, an idle
//! keep-alive connection. Each must be closed by the listener, and the
//! probes must still answer while it happens. Real sockets on 127.0.0.1.
#![cfg(feature = "health-server")]

use std::net::SocketAddr;
use std::time::Duration;

use intake_core::app::{Health, HealthListener, HealthService};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

/// The longest any test here waits for the listener to do something.
const PATIENCE: Duration = Duration::from_secs(20);

async fn serve(listener: HealthListener) -> (SocketAddr, CancellationToken) {
    let address = listener.local_addr().expect("address");
    let stop = CancellationToken::new();
    tokio::spawn(listener.serve(HealthService::new(Health::default()), stop.clone()));
    (address, stop)
}

/// Asks `path` on a new connection and returns the answer, bounded.
async fn get(address: SocketAddr, path: &str) -> String {
    let answer = async {
        let mut stream = TcpStream::connect(address).await.expect("connect");
        stream
            .write_all(
                format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")
                    .as_bytes(),
            )
            .await
            .expect("write");
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await.expect("read");
        answer
    };
    tokio::time::timeout(PATIENCE, answer)
        .await
        .expect("the probe answers while other clients hold connections")
}

/// Whether the listener has closed its side of `stream` (a read sees the
/// end of the stream or a reset), without waiting.
fn closed_by_server(stream: &TcpStream) -> bool {
    let mut byte = [0u8; 1];
    match stream.try_read(&mut byte) {
        Ok(0) => true,
        Ok(_) => false,
        Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => false,
        Err(_) => true,
    }
}

/// Waits (bounded) until the listener closed `stream`; `false` if it did
/// not within [`PATIENCE`].
async fn wait_closed(stream: &mut TcpStream) -> bool {
    let mut sink = Vec::new();
    tokio::time::timeout(PATIENCE, stream.read_to_end(&mut sink))
        .await
        .is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_are_all_closed_and_the_probe_answers_meanwhile() {
    const IDLE: usize = 300;
    let listener = HealthListener::bind("127.0.0.1:0").await.expect("bind");
    let (address, stop) = serve(listener).await;

    let mut idle = Vec::with_capacity(IDLE);
    for _ in 0..IDLE {
        idle.push(TcpStream::connect(address).await.expect("connect"));
    }
    let answer = get(address, "/health/live").await;
    assert!(answer.starts_with("HTTP/1.1 "), "{answer}");

    // Each idle connection is closed by the listener: at once beyond its
    // connection cap, by the header-read timeout otherwise.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let closed = idle.iter().filter(|s| closed_by_server(s)).count();
        if closed == IDLE {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{closed} of {IDLE} idle connections closed by the listener after {PATIENCE:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_sent_a_byte_at_a_time_is_cut_off() {
    let listener = HealthListener::bind("127.0.0.1:0").await.expect("bind");
    let (address, stop) = serve(listener).await;
    let mut stream = TcpStream::connect(address).await.expect("connect");
    stream
        .write_all(b"GET /health/live HTTP/1.1\r\n")
        .await
        .expect("write");
    // A header line a byte at a time, never ending the head.
    let drip = async {
        loop {
            if stream.write_all(b"X").await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let cut_off = tokio::time::timeout(PATIENCE, drip).await.is_ok();
    assert!(
        cut_off,
        "a client dripping its head was still connected after {PATIENCE:?}"
    );
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_keep_alive_connection_is_closed() {
    let listener = HealthListener::bind("127.0.0.1:0").await.expect("bind");
    let (address, stop) = serve(listener).await;
    let mut stream = TcpStream::connect(address).await.expect("connect");
    // HTTP/1.1 keeps the connection by default.
    stream
        .write_all(b"GET /health/live HTTP/1.1\r\nHost: test\r\n\r\n")
        .await
        .expect("write");
    let mut head = [0u8; 9];
    stream.read_exact(&mut head).await.expect("an answer");
    assert_eq!(&head, b"HTTP/1.1 ");
    assert!(
        wait_closed(&mut stream).await,
        "an idle keep-alive connection was still open after {PATIENCE:?}"
    );
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_whose_body_never_ends_is_closed() {
    let listener = HealthListener::bind("127.0.0.1:0").await.expect("bind");
    let (address, stop) = serve(listener).await;
    let mut stream = TcpStream::connect(address).await.expect("connect");
    stream
        .write_all(b"GET /health/live HTTP/1.1\r\nHost: test\r\nContent-Length: 1000000\r\n\r\nabc")
        .await
        .expect("write");
    assert!(
        wait_closed(&mut stream).await,
        "a request with an unfinished body was still open after {PATIENCE:?}"
    );
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listener_holds_no_more_than_its_cap_of_idle_connections() {
    const IDLE: usize = 300;
    const CAP: usize = 16;
    // A header-read timeout longer than the test: only the cap closes.
    let listener = HealthListener::bind("127.0.0.1:0")
        .await
        .expect("bind")
        .max_connections(CAP)
        .header_read_timeout(Duration::from_secs(3_600))
        .request_timeout(Duration::from_secs(3_600));
    let (address, stop) = serve(listener).await;
    let mut idle = Vec::with_capacity(IDLE);
    for _ in 0..IDLE {
        idle.push(TcpStream::connect(address).await.expect("connect"));
    }
    // The probe gets through (closing the oldest idle one), so every idle
    // connection was accepted before it.
    let answer = get(address, "/health/live").await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let held = idle.iter().filter(|s| !closed_by_server(s)).count();
        if held < CAP {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the listener still holds {held} of {IDLE} idle connections (cap {CAP})"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Only the newest are held.
    assert!(
        idle[..IDLE - CAP].iter().all(closed_by_server),
        "the oldest are closed first"
    );
    stop.cancel();
}

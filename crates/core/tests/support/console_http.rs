//! Requests to a console served on 127.0.0.1 over plain HTTP/1.1, one
//! connection each, for the console's tests. Include it with
//! `#[path = "support/console_http.rs"] mod console_http;`.

// Each test file uses part of it.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How long one exchange may take before the test fails.
const EXCHANGE: Duration = Duration::from_secs(10);

/// One request over a fresh connection: the status and the raw body.
pub async fn request(
    address: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, Vec<u8>) {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(address)
            .await
            .expect("connect");
        let mut head =
            format!("{method} {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n");
        for (name, value) in headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
        stream.write_all(head.as_bytes()).await.expect("write");
        // A refused body may be left unread: the answer still comes.
        let _ = stream.write_all(body).await;
        let mut answer = Vec::new();
        let _ = stream.read_to_end(&mut answer).await;
        answer
    };
    let answer = tokio::time::timeout(EXCHANGE, exchange)
        .await
        .expect("the console answers in time");
    let status = answer
        .get(9..12)
        .and_then(|code| std::str::from_utf8(code).ok())
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {}", String::from_utf8_lossy(&answer)));
    let start = answer
        .windows(4)
        .position(|window| window == b"\r\n\r\n")
        .map_or(answer.len(), |at| at + 4);
    (status, answer[start..].to_vec())
}

/// A GET's JSON (status 200, UTF-8 without a raw terminal escape).
pub async fn get_json(address: SocketAddr, path: &str) -> Value {
    let (status, body) = request(address, "GET", path, &[], b"").await;
    let text = String::from_utf8(body).expect("the answer is UTF-8");
    assert_eq!(status, 200, "{path}: {text}");
    assert!(!text.contains('\u{1b}'), "a raw terminal escape: {text}");
    serde_json::from_str(&text).unwrap_or_else(|error| panic!("{path}: {error}: {text}"))
}

/// A POST with `token` as the bearer and `body` as JSON: the status and the
/// answer (JSON, or the text as a JSON string).
pub async fn post_json(address: SocketAddr, path: &str, token: &str, body: &Value) -> (u16, Value) {
    let bearer = format!("Bearer {token}");
    let (status, answer) = request(
        address,
        "POST",
        path,
        &[
            ("Authorization", &bearer),
            ("Content-Type", "application/json"),
        ],
        body.to_string().as_bytes(),
    )
    .await;
    let text = String::from_utf8(answer).expect("UTF-8");
    let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, value)
}

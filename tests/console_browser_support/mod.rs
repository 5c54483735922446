//! What the console's browser tests share (`tests/console_browser.rs`,
//! `tests/console_browser_group.rs`): the headless chromium session, the
//! screenshots, and the waits that poll the page or the service with a
//! deadline.
// Each test binary uses a part of these.
#![allow(dead_code)]

use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::Duration;

use fantoccini::{Client, ClientBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use intake_core::backend::testkit::skip_or_fail;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How long any one thing may take to show in the page.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// The headless browser's arguments.
pub const CHROMIUM_ARGS: [&str; 5] = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--window-size=1280,900",
];

pub fn webdriver_port() -> u16 {
    std::env::var("INTAKE_WEBDRIVER_PORT")
        .ok()
        .and_then(|port| port.parse().ok())
        .unwrap_or(9515)
}

/// Where the screenshots go: `target/console-screenshots/`.
pub fn screenshots() -> PathBuf {
    let target = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let dir = target
        .parent()
        .map_or_else(|| target.clone(), PathBuf::from)
        .join("console-screenshots");
    std::fs::create_dir_all(&dir).expect("the screenshot directory");
    dir
}

pub async fn screenshot(client: &Client, name: &str) {
    let png = client.screenshot().await.expect("a screenshot");
    let path = screenshots().join(format!("{name}.png"));
    std::fs::write(&path, png).expect("the screenshot is written");
    println!("screenshot: {}", path.display());
}

/// Runs `script` in the page until it returns something other than `null`
/// or `false` (bounded by [`PATIENCE`]); what it returned.
pub async fn until(client: &Client, what: &str, script: &str) -> Value {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let answer = client
            .execute(script, vec![])
            .await
            .expect("the script runs");
        if !matches!(answer, Value::Null | Value::Bool(false)) {
            return answer;
        }
        if tokio::time::Instant::now() >= deadline {
            screenshot(client, &format!("timeout-{}", what.replace(' ', "-"))).await;
            let text = client
                .execute("return document.body.innerText", vec![])
                .await
                .unwrap_or_default();
            panic!("timed out waiting until {what}; the page says:\n{text}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Sends one request with `method` to `path` and reads the whole answer
/// (status line, headers and body).
pub async fn raw(address: SocketAddr, method: &str, path: &str) -> String {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(address)
            .await
            .expect("connect");
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
        );
        stream.write_all(head.as_bytes()).await.expect("write");
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await.expect("read");
        answer
    };
    tokio::time::timeout(PATIENCE, exchange)
        .await
        .expect("the service answers in time")
}

/// A headless chromium session, or `None` (the test skipped) when no
/// chromedriver answers.
pub async fn browser(test: &str) -> Option<Client> {
    let port = webdriver_port();
    let address = SocketAddr::from(([127, 0, 0, 1], port));
    if let Err(error) = TcpStream::connect_timeout(&address, Duration::from_secs(2)) {
        skip_or_fail(
            test,
            &format!("no chromedriver on {address} (bash .ci/services/chromium.sh start): {error}"),
        );
        return None;
    }
    let mut capabilities = serde_json::Map::new();
    capabilities.insert("browserName".into(), json!("chrome"));
    capabilities.insert(
        "goog:chromeOptions".into(),
        json!({ "args": CHROMIUM_ARGS }),
    );
    let client = ClientBuilder::new(HttpConnector::new())
        .capabilities(capabilities)
        .connect(&format!("http://{address}"))
        .await
        .expect("chromedriver starts a headless chromium");
    Some(client)
}

/// Polls `ready` (bounded by [`PATIENCE`]) until it holds.
pub async fn eventually<F, Fut>(what: &str, mut ready: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !ready().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Clicks the element `css` selects, found afresh (the page redraws its
/// tables on every refresh, so an element found earlier may be gone).
pub async fn click(client: &Client, css: &str) {
    let script = format!(
        "const e = document.querySelector({css}); if (!e) return false; e.click(); return true;",
        css = json!(css)
    );
    until(client, &format!("{css} is there to click"), &script).await;
}

/// Scrolls the element `css` selects to the middle of the window, for a
/// screenshot of it.
pub async fn scroll_to(client: &Client, css: &str) {
    let script = format!(
        "const e = document.querySelector({css}); if (e) e.scrollIntoView({{block: 'center'}});",
        css = json!(css)
    );
    client.execute(&script, vec![]).await.expect("scrolls");
}

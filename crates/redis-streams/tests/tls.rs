//! `rediss://` against a TLS-only Redis that the test starts, with a
//! certificate signed by a private CA that the test makes.
#![cfg(feature = "tls")]

mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use intake_redis_streams::{Error, RedisSettings, RedisStreamsSource};

use support::*;

/// A `redis-server` child listening with TLS only; killed when dropped.
struct TlsServer {
    child: Child,
    port: u16,
    dir: PathBuf,
    ca: Vec<u8>,
}

impl Drop for TlsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn run(dir: &Path, program: &str, args: &[&str]) -> Result<(), String> {
    let status = Command::new(program)
        .args(args)
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_err(|error| format!("cannot run {program}: {error}"))?;
    status
        .success()
        .then_some(())
        .ok_or_else(|| format!("{program} {args:?} failed: {status}"))
}

fn start_tls_server() -> Result<TlsServer, String> {
    let dir = std::env::temp_dir().join(unique("tls").replace(':', "-"));
    std::fs::create_dir_all(&dir).map_err(|error| error.to_string())?;
    let openssl = |args: &[&str]| run(&dir, "openssl", args);
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "1",
        "-subj",
        "/CN=intake-test-ca",
    ])?;
    openssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=localhost",
    ])?;
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
    )
    .map_err(|error| error.to_string())?;
    openssl(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.pem",
        "-days",
        "1",
        "-extfile",
        "server.ext",
    ])?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map_err(|error| error.to_string())?
        .port();
    let child = Command::new("redis-server")
        .args([
            "--port",
            "0",
            "--tls-port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--tls-cert-file",
            "server.pem",
            "--tls-key-file",
            "server.key",
            "--tls-ca-cert-file",
            "ca.pem",
            "--tls-auth-clients",
            "no",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .current_dir(&dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|error| format!("cannot start redis-server: {error}"))?;
    let ca = std::fs::read(dir.join("ca.pem")).map_err(|error| error.to_string())?;
    let server = TlsServer {
        child,
        port,
        dir,
        ca,
    };
    for _ in 0..100 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(server);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err("the TLS redis-server did not start listening".into())
}

fn tls_server_or_skip(test: &str) -> Option<TlsServer> {
    match start_tls_server() {
        Ok(server) => Some(server),
        Err(error) => {
            let why = format!("cannot start a TLS Redis: {error}");
            intake_core::backend::testkit::skip_or_fail(test, &why);
            None
        }
    }
}

#[tokio::test]
async fn rediss_with_a_private_ca_delivers_and_acknowledges() {
    let Some(server) = tls_server_or_skip("rediss_with_a_private_ca_delivers_and_acknowledges")
    else {
        return;
    };
    let url = format!("rediss://127.0.0.1:{}", server.port);
    let stream = unique("tls");
    let group = unique("group");
    let mut source = RedisStreamsSource::builder(
        RedisSettings::new(&url).tls_root_certificate(server.ca.clone()),
    )
    .stream(&stream)
    .group(&group)
    .block(Duration::from_millis(100))
    .build()
    .await
    .expect("connect over TLS");
    let mut acker = source.acker();

    let client = redis::Client::build_with_tls(
        url.as_str(),
        redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(server.ca.clone()),
        },
    )
    .expect("client");
    let mut redis = client
        .get_multiplexed_async_connection()
        .await
        .expect("producer over TLS");
    produce(&mut redis, &stream, "m", 3).await;

    let received = receive(&mut source, 3, 10, Duration::from_secs(5)).await;
    assert_eq!(payloads(&received), vec!["m0", "m1", "m2"]);
    ack(&mut acker, &received).await;
    assert_all_acknowledged(&mut redis, &stream, &group).await;
}

#[tokio::test]
async fn a_server_certificate_from_an_unknown_ca_is_refused() {
    let Some(server) = tls_server_or_skip("a_server_certificate_from_an_unknown_ca_is_refused")
    else {
        return;
    };
    let connected = RedisStreamsSource::builder(format!("rediss://127.0.0.1:{}", server.port))
        .stream(unique("tls"))
        .group("g")
        .build()
        .await;
    match connected {
        Err(error @ Error::Unreachable { .. }) => {
            // The handshake's reason is the cause, not this level's text.
            let mut chain = String::new();
            let mut next: Option<&dyn std::error::Error> = Some(&error);
            while let Some(level) = next {
                chain.push_str(&format!("{level}; "));
                next = level.source();
            }
            assert!(chain.contains("certificate"), "{chain}");
        }
        other => panic!("expected the handshake to fail, got {other:?}"),
    }
}

#[tokio::test]
async fn a_root_certificate_without_rediss_is_a_configuration_error() {
    let connected = RedisStreamsSource::builder(
        RedisSettings::new("redis://127.0.0.1:6379")
            .tls_root_certificate(b"-----BEGIN CERTIFICATE-----".to_vec()),
    )
    .stream("s")
    .group("g")
    .build()
    .await;
    match connected {
        Err(Error::Config(error)) => assert_eq!(error.setting, "tls_root_certificate"),
        other => panic!("expected a configuration error, got {other:?}"),
    }
}

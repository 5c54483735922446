//! TLS to PostgreSQL (rustls): the local server has `ssl = on` with
//! Debian's self-signed "snakeoil" certificate (CN and SAN `localhost`).
//! `require` and the default for this loopback host (`prefer`) really
//! encrypt, which the server confirms in `pg_stat_ssl`; `verify-full`
//! refuses a certificate for another name, and one that no trusted CA
//! signed (a TLS server of the test's own: this machine's trust directory,
//! `SSL_CERT_DIR=/etc/ssl/certs`, holds a hash link to the snakeoil
//! certificate, so the platform trusts the local server), with a typed
//! error that says what to set; and it accepts the local server once its
//! certificate is the root (`sslrootcert`, by URL or as PEM). A server
//! without TLS, and the default for other hosts: tls_default.rs.

mod common;

use intake_postgres::{Error, PoolConfig};

/// The test database's URL with `query` appended, and `host` in place of
/// the URL's host when given.
fn url_with(query: &str, host: Option<&str>) -> String {
    let base = std::env::var("INTAKE_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let base = match host {
        Some(host) => base.replace("127.0.0.1", host),
        None => base,
    };
    let separator = if base.contains('?') { '&' } else { '?' };
    if query.is_empty() {
        base
    } else {
        format!("{base}{separator}{query}")
    }
}

/// Whether the connection behind `pool` is encrypted, as the server sees it.
async fn encrypted(pool: &sqlx::PgPool) -> bool {
    sqlx::query_scalar::<_, bool>("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        .fetch_one(pool)
        .await
        .expect("pg_stat_ssl")
}

/// Whether the test database is there with TLS on (else the test is
/// skipped, or fails under `INTAKE_REQUIRE_BROKERS=1`).
async fn server_with_tls(test: &str) -> bool {
    let Some(pool) = common::database(test, 1).await else {
        return false;
    };
    let on: String = sqlx::query_scalar("SHOW ssl")
        .fetch_one(&pool)
        .await
        .expect("SHOW ssl");
    if on != "on" {
        intake_core::backend::testkit::skip_or_fail(test, "the server has ssl = off");
        return false;
    }
    true
}

#[tokio::test]
async fn sslmode_require_connects_with_tls() {
    if !server_with_tls("sslmode_require_connects_with_tls").await {
        return;
    }
    let pool = PoolConfig::new(&url_with("sslmode=require", None))
        .expect("a URL")
        .max_connections(1)
        .connect()
        .await
        .expect("connect with sslmode=require");
    assert!(
        encrypted(&pool).await,
        "the server sees a clear-text connection"
    );
}

#[tokio::test]
async fn the_default_sslmode_encrypts_when_the_server_offers_tls() {
    if !server_with_tls("the_default_sslmode_encrypts").await {
        return;
    }
    let pool = PoolConfig::new(&url_with("", None))
        .expect("a URL")
        .max_connections(1)
        .connect()
        .await
        .expect("connect");
    assert!(
        encrypted(&pool).await,
        "sslmode=prefer (the default for a loopback host) fell back to clear text"
    );
}

/// A server that answers PostgreSQL's `SSLRequest` with `S` and then
/// shakes hands with a self-signed certificate for `localhost` that no
/// trust store holds: the certificate of a man in the middle.
struct UntrustedTlsServer {
    port: u16,
    task: tokio::task::JoinHandle<()>,
    dir: std::path::PathBuf,
}

impl Drop for UntrustedTlsServer {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl UntrustedTlsServer {
    async fn start() -> Result<Self, String> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};

        let dir = std::env::temp_dir().join(format!(
            "intake-pg-tls-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |since| since.as_nanos())
        ));
        std::fs::create_dir_all(&dir).map_err(|error| error.to_string())?;
        let status = std::process::Command::new("openssl")
            .args([
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                "key.pem",
                "-out",
                "cert.pem",
                "-days",
                "1",
                "-subj",
                "/CN=localhost",
                "-addext",
                "subjectAltName=DNS:localhost,IP:127.0.0.1",
            ])
            .current_dir(&dir)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .map_err(|error| format!("cannot run openssl: {error}"))?;
        if !status.success() {
            return Err(format!("openssl failed: {status}"));
        }
        let certificates = CertificateDer::pem_file_iter(dir.join("cert.pem"))
            .and_then(Iterator::collect::<Result<Vec<_>, _>>)
            .map_err(|error| error.to_string())?;
        let key =
            PrivateKeyDer::from_pem_file(dir.join("key.pem")).map_err(|error| error.to_string())?;
        let config = rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|error| error.to_string())?
        .with_no_client_auth()
        .with_single_cert(certificates, key)
        .map_err(|error| error.to_string())?;
        let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|error| error.to_string())?;
        let port = listener
            .local_addr()
            .map_err(|error| error.to_string())?
            .port();
        let task = tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let mut request = [0; 8];
                    if stream.read_exact(&mut request).await.is_ok()
                        && stream.write_all(b"S").await.is_ok()
                    {
                        // The client refuses the certificate; nothing more.
                        let _ = acceptor.accept(stream).await;
                    }
                });
            }
        });
        Ok(Self { port, task, dir })
    }
}

#[tokio::test]
async fn verify_full_refuses_a_certificate_no_trusted_ca_signed_with_a_tls_error() {
    let server = match UntrustedTlsServer::start().await {
        Ok(server) => server,
        Err(why) => {
            intake_core::backend::testkit::skip_or_fail(
                "verify_full_refuses_an_untrusted_certificate",
                &why,
            );
            return;
        }
    };
    let url = format!(
        "postgres://app:hunter2@localhost:{}/test?sslmode=verify-full",
        server.port
    );
    let connected = PoolConfig::new(&url)
        .expect("a URL")
        .max_connections(1)
        .acquire_timeout(std::time::Duration::from_secs(5))
        .connect()
        .await;
    let error = match connected {
        Err(error @ Error::Tls { .. }) => error,
        other => panic!("expected a TLS error, got {other:?}"),
    };
    let text = error.to_string();
    assert!(text.contains("sslrootcert"), "says what to set: {text}");
    assert!(!text.contains("hunter2") && !format!("{error:?}").contains("hunter2"));
    let cause = std::error::Error::source(&error).map(ToString::to_string);
    assert!(
        cause
            .as_deref()
            .is_some_and(|cause| cause.contains("certificate")),
        "the cause names the certificate: {cause:?}"
    );
}

#[tokio::test]
async fn verify_full_connects_when_the_servers_certificate_is_trusted() {
    if !server_with_tls("verify_full_connects_when_trusted").await {
        return;
    }
    let snakeoil = "/etc/ssl/certs/ssl-cert-snakeoil.pem";
    let Ok(pem) = std::fs::read(snakeoil) else {
        intake_core::backend::testkit::skip_or_fail(
            "verify_full_connects_when_trusted",
            "no snakeoil certificate",
        );
        return;
    };
    // Once by URL, once with the PEM given to the pool.
    let by_url = PoolConfig::new(&url_with(
        &format!("sslmode=verify-full&sslrootcert={snakeoil}"),
        Some("localhost"),
    ))
    .expect("a URL")
    .max_connections(1);
    let by_pem = PoolConfig::new(&url_with("sslmode=verify-full", Some("localhost")))
        .expect("a URL")
        .max_connections(1)
        .ssl_root_certificate(pem);
    for config in [by_url, by_pem] {
        let pool = config
            .connect()
            .await
            .expect("verify-full against its own CA");
        assert!(encrypted(&pool).await);
    }
}

#[tokio::test]
async fn verify_full_refuses_the_local_servers_certificate_for_a_host_it_does_not_name() {
    if !server_with_tls("verify_full_refuses_another_name").await {
        return;
    }
    // The certificate names `localhost`, not 127.0.0.1.
    let connected = PoolConfig::new(&url_with(
        "sslmode=verify-full&sslrootcert=/etc/ssl/certs/ssl-cert-snakeoil.pem",
        None,
    ))
    .expect("a URL")
    .max_connections(1)
    .connect()
    .await;
    assert!(matches!(connected, Err(Error::Tls { .. })), "{connected:?}");
}

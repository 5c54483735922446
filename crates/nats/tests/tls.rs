//! TLS and credentials, each on a nats-server of the test's own: a CA the
//! test trusts and one it does not; token, user and password, nkey; right
//! and wrong. Secrets never show in an error or a `Debug`.

mod support;

use std::time::Duration;

use intake_core::backend::testkit::TestMessage;
use intake_core::{Consumer, DeliveryOrder, HandlerError, Message};
use intake_nats::{Error, NatsSettings, NatsSource, Tls};
use support::own_server::OwnServer;
use support::{Running, Seen, wait_until};

const TLS_PORT: u16 = 14_241;
const USERS_PORT: u16 = 14_242;
const TOKEN_PORT: u16 = 14_243;

fn start(port: u16, tls: bool, include: Option<&str>, test: &str) -> Option<OwnServer> {
    support::init_tracing();
    match OwnServer::start_with(port, tls, include) {
        Ok(server) => Some(server),
        Err(error) => {
            intake_core::backend::testkit::skip_or_fail(
                test,
                &format!("cannot start nats-server: {error}"),
            );
            None
        }
    }
}

/// Builds a source with `configure`, produces one message through its
/// client and consumes it: the connection works end to end.
async fn consume_one(builder: intake_nats::NatsSourceBuilder, stream: &str) {
    let source = builder
        .stream(stream)
        .consumer("g")
        .create_stream([format!("in.{stream}.>")])
        .build()
        .await
        .expect("source");
    support::produce(
        &source.client(),
        stream,
        vec![TestMessage::new("k", "hello")],
    )
    .await
    .expect("produce");
    let acker = source.acker();
    let seen = Seen::default();
    let handler = {
        let seen = seen.clone();
        tower::service_fn(move |message: Message| {
            let seen = seen.clone();
            async move {
                seen.record(&message);
                Ok::<_, HandlerError>(())
            }
        })
    };
    let running = Running::start(
        Consumer::builder().ordering(DeliveryOrder::Unordered),
        source,
        acker,
        handler,
    );
    wait_until("the message", Duration::from_secs(30), || {
        seen.count(b"hello") == 1
    })
    .await;
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_the_servers_ca_consumes_and_a_wrong_ca_is_refused_for_good() {
    let Some(server) = start(TLS_PORT, true, None, "TLS") else {
        return;
    };
    let tls_url = format!("tls://127.0.0.1:{TLS_PORT}");
    let ca = server.state().join("tls/ca.pem");
    consume_one(
        NatsSource::builder(NatsSettings::new(&tls_url).tls(Tls::new().ca_file(&ca))),
        &support::unique("tls"),
    )
    .await;

    let settings = NatsSettings::new(&tls_url)
        .tls(Tls::new().ca_file(server.state().join("tls/other-ca.pem")))
        .connect_timeout(Duration::from_secs(5));
    let wrong = NatsSource::builder(settings)
        .stream("S")
        .consumer("g")
        .build()
        .await
        .expect_err("an untrusted certificate");
    assert!(matches!(wrong, Error::Tls { .. }), "{wrong:?}");
    assert!(!wrong.is_transient(), "retrying does not help");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_password_and_nkey_connect_and_wrong_ones_are_unauthorized_without_showing_them() {
    let user = nkeys::KeyPair::new_user();
    let seed = user.seed().expect("a seed");
    let include = format!(
        "authorization {{\n  users = [\n    {{ user: app, password: \"pw-s3cret\" }}\n    {{ nkey: {} }}\n  ]\n}}\n",
        user.public_key()
    );
    let Some(server) = start(USERS_PORT, false, Some(&include), "users") else {
        return;
    };
    let address = format!("127.0.0.1:{USERS_PORT}");
    consume_one(
        NatsSource::builder(format!("nats://app:pw-s3cret@{address}")),
        &support::unique("userpw"),
    )
    .await;
    consume_one(
        NatsSource::builder(NatsSettings::new(server.url()).user_password("app", "pw-s3cret")),
        &support::unique("userpw"),
    )
    .await;
    consume_one(
        NatsSource::builder(NatsSettings::new(server.url()).nkey(seed.clone())),
        &support::unique("nkey"),
    )
    .await;

    let wrong_password = NatsSource::builder(format!("nats://app:wrong-s3cret@{address}"))
        .stream("S")
        .consumer("g")
        .build()
        .await
        .expect_err("a wrong password");
    assert!(
        matches!(wrong_password, Error::Unauthorized { .. }),
        "{wrong_password:?}"
    );
    assert!(!wrong_password.is_transient());
    let other = nkeys::KeyPair::new_user().seed().expect("a seed");
    let wrong_nkey = NatsSource::builder(NatsSettings::new(server.url()).nkey(other.clone()))
        .stream("S")
        .consumer("g")
        .build()
        .await
        .expect_err("an unknown nkey");
    assert!(
        matches!(wrong_nkey, Error::Unauthorized { .. }),
        "{wrong_nkey:?}"
    );
    let builder = NatsSource::builder(
        NatsSettings::new(format!("nats://app:pw-s3cret@{address}")).nkey(seed.clone()),
    )
    .stream("S");
    for shown in [
        format!("{wrong_password} {wrong_password:?}"),
        format!("{wrong_nkey} {wrong_nkey:?}"),
        format!("{builder:?}"),
    ] {
        for secret in ["pw-s3cret", "wrong-s3cret", seed.as_str(), other.as_str()] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_in_the_url_or_the_builder_connects_and_never_shows() {
    let Some(server) = start(
        TOKEN_PORT,
        false,
        Some("authorization { token: \"tok-s3cret\" }\n"),
        "token",
    ) else {
        return;
    };
    let address = format!("127.0.0.1:{TOKEN_PORT}");
    consume_one(
        NatsSource::builder(format!("nats://tok-s3cret@{address}")),
        &support::unique("token"),
    )
    .await;
    consume_one(
        NatsSource::builder(NatsSettings::new(server.url()).token("tok-s3cret")),
        &support::unique("token"),
    )
    .await;
    let wrong = NatsSource::builder(format!("nats://tok-wrong@{address}"))
        .stream("S")
        .consumer("g")
        .build()
        .await
        .expect_err("a wrong token");
    assert!(matches!(wrong, Error::Unauthorized { .. }), "{wrong:?}");
    let shown = format!("{wrong} {wrong:?}");
    assert!(!shown.contains("tok-wrong"), "{shown}");
    assert_eq!(
        wrong.endpoint(),
        Some(format!("nats://***@{address}").as_str())
    );
    let builder = NatsSource::builder(NatsSettings::new(server.url()).token("tok-s3cret"));
    assert!(!format!("{builder:?}").contains("tok-s3cret"));
}

//! `amqps://` against RabbitMQ's own TLS listener (127.0.0.1:5671, made by
//! `.ci/services/amqp.sh`): its server certificate is signed by a private
//! CA, and it refuses clients without a certificate signed by that CA.
//!
//! The certificates are read from `$INTAKE_AMQP_TLS_DIR` (default
//! `${INTAKE_CACHE_DIR:-$HOME/.cache/intake}/amqp-tls`). Each test skips
//! with a printed reason when they or the listener are missing, unless
//! `INTAKE_REQUIRE_BROKERS=1`.

mod support;

use std::path::PathBuf;
use std::time::Duration;

use intake_amqp::{AmqpDeadLetterSink, AmqpSource, Error, Tls};
use intake_core::backend::testkit::skip_or_fail;
use intake_core::{
    DeadLetter,
    backend::{AckBatch, Acker, DeadLetterSink, PartitionAck, Source, SourceEvent},
};
use support::{AmqpBackend, dead_letter_queue};

const PATIENCE: Duration = Duration::from_secs(20);

/// The TLS listener, by name: the server certificate is for `localhost`.
fn tls_url() -> String {
    std::env::var("INTAKE_AMQP_TLS_URL")
        .unwrap_or_else(|_| "amqps://guest:guest@localhost:5671/%2f".to_owned())
}

/// The PEM files `amqp.sh` made.
struct Material {
    ca: String,
    other_ca: String,
    client_certificate: Vec<u8>,
    client_key: Vec<u8>,
}

impl Material {
    fn load(test: &str) -> Option<Self> {
        let dir = std::env::var_os("INTAKE_AMQP_TLS_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                let cache = std::env::var_os("INTAKE_CACHE_DIR")
                    .map(PathBuf::from)
                    .unwrap_or_else(|| {
                        PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                            .join(".cache/intake")
                    });
                cache.join("amqp-tls")
            });
        let read = |name: &str| std::fs::read(dir.join(name));
        match (
            read("ca.pem"),
            read("other-ca.pem"),
            read("client.pem"),
            read("client.key"),
        ) {
            (Ok(ca), Ok(other_ca), Ok(client_certificate), Ok(client_key)) => Some(Self {
                ca: String::from_utf8_lossy(&ca).into_owned(),
                other_ca: String::from_utf8_lossy(&other_ca).into_owned(),
                client_certificate,
                client_key,
            }),
            _ => {
                skip_or_fail(
                    test,
                    &format!(
                        "no test certificates in {} (run .ci/services/amqp.sh start)",
                        dir.display()
                    ),
                );
                None
            }
        }
    }

    fn trusted_with_client_certificate(&self) -> Tls {
        Tls::new()
            .ca_certificate_pem(self.ca.clone())
            .client_certificate_pem(self.client_certificate.clone(), self.client_key.clone())
    }
}

async fn connect_error(builder: intake_amqp::AmqpSourceBuilder) -> Error {
    tokio::time::timeout(PATIENCE, builder.build())
        .await
        .expect("the connect ends within its timeout")
        .expect_err("the connection is refused")
}

#[tokio::test]
async fn a_private_ca_and_a_client_certificate_connect_consume_and_dead_letter() {
    let Some(backend) = AmqpBackend::connect_or_skip("tls_consume").await else {
        return;
    };
    let Some(material) = Material::load("tls_consume") else {
        return;
    };
    let queue = backend.classic_queue("tls").await.unwrap();
    backend.publish(&queue, &[b"over tls"]).await.unwrap();
    let mut source = match AmqpSource::builder(
        intake_amqp::AmqpSettings::new(tls_url()).tls(material.trusted_with_client_certificate()),
    )
    .queue(queue.as_str())
    .build()
    .await
    {
        Ok(source) => source,
        Err(Error::Unreachable { .. }) => {
            skip_or_fail(
                "tls_consume",
                "no TLS listener on 5671 (run .ci/services/amqp.sh start)",
            );
            return;
        }
        Err(error) => panic!("TLS with the private CA and a client certificate failed: {error:?}"),
    };
    let mut buffer = Vec::new();
    let message = tokio::time::timeout(PATIENCE, async {
        loop {
            if let SourceEvent::Delivered = source.next(&mut buffer, 10).await.unwrap() {
                return buffer.remove(0);
            }
        }
    })
    .await
    .expect("the message arrives over TLS");
    assert_eq!(&message.payload()[..], b"over tls");

    let sink = AmqpDeadLetterSink::builder(
        intake_amqp::AmqpSettings::new(tls_url()).tls(material.trusted_with_client_certificate()),
    )
    .exchange("")
    .routing_key(dead_letter_queue(&queue))
    .build()
    .await
    .expect("the dead-letter sink connects over TLS");
    sink.write(&DeadLetter::new(message.clone(), "bad", 1))
        .await
        .expect("the dead letter is confirmed over TLS");
    let mut ack = PartitionAck::new(message.metadata().partition_key());
    ack.watermark = Some(message.metadata().position());
    source
        .acker()
        .ack(&AckBatch {
            partitions: vec![ack],
            sync: true,
        })
        .await
        .unwrap();
    source.close().await.unwrap();
    assert_eq!(
        backend
            .peek(&dead_letter_queue(&queue))
            .await
            .unwrap()
            .len(),
        1
    );
    backend.cleanup().await;
}

#[tokio::test]
async fn the_sink_from_a_tls_source_connects_with_the_sources_certificates() {
    let Some(backend) = AmqpBackend::connect_or_skip("tls_sink_from_source").await else {
        return;
    };
    let Some(material) = Material::load("tls_sink_from_source") else {
        return;
    };
    let queue = backend.classic_queue("tls-sink").await.unwrap();
    let source = match AmqpSource::builder(
        intake_amqp::AmqpSettings::new(tls_url()).tls(material.trusted_with_client_certificate()),
    )
    .queue(queue.as_str())
    .build()
    .await
    {
        Ok(source) => source,
        Err(Error::Unreachable { .. }) => {
            skip_or_fail(
                "tls_sink_from_source",
                "no TLS listener on 5671 (run .ci/services/amqp.sh start)",
            );
            return;
        }
        Err(error) => panic!("TLS with the private CA and a client certificate failed: {error:?}"),
    };
    // The listener refuses a client without a certificate: the sink
    // connects only with the source's TLS settings.
    let sink = tokio::time::timeout(
        PATIENCE,
        source
            .dead_letter_sink()
            .exchange("")
            .routing_key(dead_letter_queue(&queue))
            .build(),
    )
    .await
    .expect("the sink connects within its timeout")
    .expect("the sink connects over TLS with the source's certificates");
    let message = intake_core::Message::new(
        bytes::Bytes::from_static(b"over tls"),
        intake_core::Metadata::new(queue.as_str().into(), 1, intake_core::Position::Tag(1)),
    );
    sink.write(&DeadLetter::new(message, "bad", 1))
        .await
        .expect("the dead letter is confirmed over TLS");
    assert_eq!(
        backend
            .peek(&dead_letter_queue(&queue))
            .await
            .unwrap()
            .len(),
        1
    );
    drop(source);
    backend.cleanup().await;
}

#[tokio::test]
async fn a_server_certificate_from_another_ca_is_refused_with_a_tls_error() {
    let Some(material) = Material::load("tls_wrong_ca") else {
        return;
    };
    let error = connect_error(
        AmqpSource::builder(
            intake_amqp::AmqpSettings::new(tls_url().replace("guest:guest", "guest:hunter2")).tls(
                Tls::new()
                    .ca_certificate_pem(material.other_ca.clone())
                    .client_certificate_pem(
                        material.client_certificate.clone(),
                        material.client_key.clone(),
                    ),
            ),
        )
        .queue("orders"),
    )
    .await;
    assert!(matches!(error, Error::Tls { .. }), "{error:?}");
    assert!(
        !error.is_transient(),
        "a wrong CA does not pass by retrying"
    );
    let text = format!("{error} {error:?}");
    assert!(text.contains("certificate"), "{text}");
    assert!(!text.contains("hunter2"), "{text}");
}

#[tokio::test]
async fn the_system_roots_alone_do_not_trust_a_private_ca() {
    let Some(material) = Material::load("tls_system_roots") else {
        return;
    };
    let error = connect_error(
        AmqpSource::builder(intake_amqp::AmqpSettings::new(tls_url()).tls(
            Tls::new().client_certificate_pem(
                material.client_certificate.clone(),
                material.client_key.clone(),
            ),
        ))
        .queue("orders"),
    )
    .await;
    assert!(matches!(error, Error::Tls { .. }), "{error:?}");
}

#[tokio::test]
async fn a_broker_that_requires_a_client_certificate_refuses_a_client_without_one() {
    let Some(material) = Material::load("tls_no_client_certificate") else {
        return;
    };
    let error = connect_error(
        AmqpSource::builder(
            intake_amqp::AmqpSettings::new(tls_url())
                .tls(Tls::new().ca_certificate_pem(material.ca.clone())),
        )
        .queue("orders"),
    )
    .await;
    // TLS 1.3 checks the client's certificate after the client's handshake
    // is done, so the broker's refusal comes as an alert the client may
    // read (a typed TLS error) or, when the broker's close arrives first,
    // as a reset: either way no connection.
    assert!(
        matches!(error, Error::Tls { .. } | Error::Unreachable { .. }),
        "{error:?}"
    );
}

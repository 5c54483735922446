//! Conditions of the broker that pass, against a real RabbitMQ: they must be
//! retried with backoff (visible in the log and in `AmqpCounters`), and
//! only a condition the user must act on may stop the consumer.
//!
//! Each test works in a vhost of its own, so the faults it makes (a
//! connection limit, a queue process stopped by its supervisor, the vhost
//! stopped) touch nothing else on the shared broker. A queue whose process
//! is down is made with `rabbitmqctl eval` (the record says `stopped`, as
//! RabbitMQ marks it when a supervisor stops the process); the broker's own
//! code then answers `NOT_FOUND - queue '…' process is stopped by
//! supervisor`, the reply class it also gives for a queue whose home node
//! is down (`home node '…' of durable queue '…' is down or inaccessible`)
//! or that timed out. Where `rabbitmqctl` is missing or its internals
//! differ, the test skips with the reason (or fails under
//! `INTAKE_REQUIRE_BROKERS=1`).

mod support;

use std::time::Duration;

use intake_amqp::lapin::options::{BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions};
use intake_amqp::lapin::types::FieldTable;
use intake_amqp::lapin::{BasicProperties, Connection, ConnectionProperties};
use intake_amqp::{AmqpSource, Queue, Topology};
use intake_core::backend::testkit::skip_or_fail;
use intake_core::backend::{Source, SourceError, SourceEvent};
use support::{AmqpBackend, RecordingBackoff, close_connection_named, rabbitmqctl, unique};

const PATIENCE: Duration = Duration::from_secs(30);
const QUEUE: &str = "orders";

/// A vhost of the test's own with one durable queue holding one message;
/// deleted when the test ends, even when it fails.
struct Vhost {
    name: String,
}

impl Drop for Vhost {
    fn drop(&mut self) {
        let _ = std::process::Command::new("rabbitmqctl")
            .args(["delete_vhost", &self.name])
            .output();
    }
}

impl Vhost {
    async fn create(test: &str) -> Option<Self> {
        AmqpBackend::connect_or_skip(test).await?;
        let vhost = Self {
            name: unique("vhost"),
        };
        let name = vhost.name.as_str();
        let made = async {
            rabbitmqctl(&["add_vhost", name]).await?;
            rabbitmqctl(&["set_permissions", "-p", name, "guest", ".*", ".*", ".*"]).await
        };
        if let Err(why) = made.await {
            skip_or_fail(test, &why);
            return None;
        }
        vhost.publish().await;
        Some(vhost)
    }

    /// Declares the queue if missing and publishes one persistent message.
    async fn publish(&self) {
        let connection = Connection::connect(&self.url(), ConnectionProperties::default())
            .await
            .expect("a connection to the test's vhost");
        let channel = connection.create_channel().await.unwrap();
        channel
            .queue_declare(
                QUEUE.into(),
                QueueDeclareOptions {
                    durable: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .unwrap();
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .unwrap();
        // Persistent: a vhost restart keeps only what is on disk.
        let confirm = channel
            .basic_publish(
                "".into(),
                QUEUE.into(),
                BasicPublishOptions::default(),
                b"m",
                BasicProperties::default().with_delivery_mode(2),
            )
            .await
            .unwrap()
            .await
            .unwrap();
        assert!(confirm.is_ack());
        connection.close(200, "published".into()).await.unwrap();
    }

    fn url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:5672/{}", self.name)
    }

    fn queue(&self) -> String {
        format!(
            "rabbit_misc:r(<<\"{}\">>, queue, <<\"{QUEUE}\">>)",
            self.name
        )
    }

    /// Marks the queue's process as stopped by its supervisor; returns the
    /// real process, for [`restore_queue`](Self::restore_queue).
    async fn stop_queue(&self) -> Result<String, String> {
        let pid = rabbitmqctl(&[
            "eval",
            &format!(
                "{{ok, Q}} = rabbit_amqqueue:lookup({}), \
                 Dead = spawn(fun() -> ok end), \
                 rabbit_misc:execute_mnesia_transaction(fun() -> \
                     rabbit_amqqueue:store_queue(amqqueue:set_state(amqqueue:set_pid(Q, Dead), stopped)) \
                 end), \
                 pid_to_list(amqqueue:get_pid(Q)).",
                self.queue()
            ),
        ])
        .await?;
        Ok(pid.trim().trim_matches('"').to_owned())
    }

    async fn restore_queue(&self, pid: &str) -> Result<String, String> {
        rabbitmqctl(&[
            "eval",
            &format!(
                "{{ok, Q}} = rabbit_amqqueue:lookup({}), \
                 rabbit_misc:execute_mnesia_transaction(fun() -> \
                     rabbit_amqqueue:store_queue(amqqueue:set_state(amqqueue:set_pid(Q, list_to_pid(\"{pid}\")), live)) \
                 end).",
                self.queue()
            ),
        ])
        .await
    }
}

/// Drives `source` until the fault made by `fault` (after the consumer's
/// connection is closed, so that it reconnects into it) has been retried
/// twice, then lifts it with `lift` and expects the message.
async fn retried_until_lifted<F, L>(
    test: &str,
    vhost: &Vhost,
    declare: bool,
    fault: F,
    lift: impl FnOnce(String) -> L,
) where
    F: Future<Output = Result<String, String>>,
    L: Future<Output = Result<String, String>>,
{
    let policy = RecordingBackoff::default();
    let name = unique("faults-conn");
    let mut builder = AmqpSource::builder(
        intake_amqp::AmqpSettings::new(vhost.url()).connection_name(name.as_str()),
    )
    .queue(QUEUE)
    .reconnect_backoff(policy.clone());
    if declare {
        builder = builder.declare(Topology::new().queue(Queue::classic(QUEUE)));
    }
    let mut source = builder.build().await.unwrap();
    let counters = source.counters();
    let mut buffer = Vec::new();
    assert!(matches!(
        source.next(&mut buffer, 0).await.unwrap(),
        SourceEvent::Assigned(_)
    ));
    let lifted_with = match fault.await {
        Ok(undo) => undo,
        Err(why) => {
            skip_or_fail(test, &why);
            return;
        }
    };
    // Some faults close the connection themselves (a stopped vhost does):
    // then there is none left to close.
    let _ = close_connection_named(&name).await;
    // While the fault lasts, the budget is "full": only assignment changes
    // and errors come back. The source retries inside `next`, so the test
    // watches its counters beside it (dropping `next` is cancel-safe).
    let retried_twice = async {
        while counters.failed_reconnects() < 2 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    let error = tokio::time::timeout(PATIENCE, async {
        tokio::pin!(retried_twice);
        loop {
            tokio::select! {
                () = &mut retried_twice => return None,
                fetched = source.next(&mut buffer, 0) => {
                    if let Err(error) = fetched {
                        return Some(error);
                    }
                }
            }
        }
    })
    .await
    .expect("the source retries");
    if let Some(error) = error {
        let _ = lift(lifted_with).await;
        panic!("a condition that passes stopped the source: {error}");
    }
    assert!(counters.failed_reconnects() >= 2);
    lift(lifted_with).await.expect("the fault is lifted");
    // A stopped vhost comes back without its messages: publish one more.
    vhost.publish().await;
    let delivered = tokio::time::timeout(PATIENCE, async {
        loop {
            match source.next(&mut buffer, 10).await {
                Ok(SourceEvent::Delivered) => return buffer.split_off(0),
                Ok(_) => {}
                Err(error) => panic!("the source gave up: {error}"),
            }
        }
    })
    .await
    .expect("the message arrives once the fault is gone");
    assert_eq!(&delivered[0].payload()[..], b"m");
    let asked = policy.asked();
    assert!(
        asked.windows(2).all(|pair| pair[1] == pair[0] + 1),
        "each failed attempt backs off further: {asked:?}"
    );
    source.close().await.unwrap();
}

#[tokio::test]
async fn a_queue_whose_process_is_down_is_retried_with_backoff_until_it_is_back() {
    let Some(vhost) = Vhost::create("queue_process_down").await else {
        return;
    };
    retried_until_lifted(
        "queue_process_down",
        &vhost,
        false,
        vhost.stop_queue(),
        |pid| {
            let vhost = &vhost;
            async move { vhost.restore_queue(&pid).await }
        },
    )
    .await;
}

#[tokio::test]
async fn a_declaration_refused_while_the_queue_is_down_is_retried_on_reconnect() {
    let Some(vhost) = Vhost::create("declare_queue_down").await else {
        return;
    };
    retried_until_lifted(
        "declare_queue_down",
        &vhost,
        true,
        vhost.stop_queue(),
        |pid| {
            let vhost = &vhost;
            async move { vhost.restore_queue(&pid).await }
        },
    )
    .await;
}

#[tokio::test]
async fn a_vhost_connection_limit_is_retried_with_backoff_until_connections_are_allowed() {
    let Some(vhost) = Vhost::create("vhost_connection_limit").await else {
        return;
    };
    // NOT_ALLOWED - access to vhost '…' refused for user 'guest':
    // connection limit (0) is reached
    let name = vhost.name.clone();
    retried_until_lifted(
        "vhost_connection_limit",
        &vhost,
        false,
        async {
            rabbitmqctl(&["set_vhost_limits", "-p", &name, r#"{"max-connections": 0}"#]).await
        },
        |_| async { rabbitmqctl(&["clear_vhost_limits", "-p", &name]).await },
    )
    .await;
}

/// RabbitMQ 3.10 and later answer a connection to a stopped vhost with
/// `INTERNAL_ERROR - … vhost '…' is down`, which was already retried: this
/// test shows it, and keeps it so.
#[tokio::test]
async fn a_vhost_that_is_down_is_retried_with_backoff_until_it_is_back() {
    let Some(vhost) = Vhost::create("vhost_down").await else {
        return;
    };
    let name = vhost.name.clone();
    retried_until_lifted(
        "vhost_down",
        &vhost,
        true,
        async {
            rabbitmqctl(&[
                "eval",
                &format!("rabbit_vhost_sup_sup:stop_and_delete_vhost(<<\"{name}\">>)."),
            ])
            .await
        },
        |_| async { rabbitmqctl(&["restart_vhost", "-p", &name]).await },
    )
    .await;
}

#[tokio::test]
async fn a_queue_deleted_under_the_consumer_stops_it_with_a_reason_to_act_on() {
    let Some(vhost) = Vhost::create("queue_deleted").await else {
        return;
    };
    let mut source = AmqpSource::builder(vhost.url())
        .queue(QUEUE)
        .reconnect_backoff(RecordingBackoff::default())
        .build()
        .await
        .unwrap();
    let mut buffer = Vec::new();
    source.next(&mut buffer, 0).await.unwrap();
    rabbitmqctl(&["delete_queue", "-p", &vhost.name, QUEUE])
        .await
        .expect("the queue is deleted");
    // Asking for deliveries: the broker's cancel ends the consumer's
    // stream, which a call for assignment changes only would not read.
    let error = tokio::time::timeout(PATIENCE, async {
        loop {
            if let Err(error) = source.next(&mut buffer, 10).await {
                return error;
            }
        }
    })
    .await
    .expect("the source reports the missing queue");
    assert!(
        matches!(error, SourceError::NotFound { kind: "queue", .. }),
        "{error:?}"
    );
    assert!(!error.is_transient());
}

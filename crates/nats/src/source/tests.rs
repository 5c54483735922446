//! On the shared nats-server (`.ci/services/nats.sh`).

use std::time::Duration;

use intake_core::Message;
use intake_core::backend::{AckBatch, Acker, PartitionAck};

use async_nats::jetstream;

use super::*;

const BUDGET: usize = 100;
const MESSAGES: usize = 600;

fn url() -> String {
    std::env::var("INTAKE_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned())
}

/// The batch the commit engine would send for `messages`, completed.
fn completed(messages: &[Message]) -> AckBatch {
    let mut ack = PartitionAck::new(messages[0].metadata().partition_key());
    ack.completed
        .extend(messages.iter().map(|message| message.metadata().position()));
    AckBatch {
        partitions: vec![ack],
        sync: false,
    }
}

/// The runtime's side of the budget, acted out: it asks for its free
/// slots, holds what comes, and finishes 60 at a time. With several
/// pull requests out, the server must still never have sent more than
/// the budget beyond what was acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_never_holds_more_deliveries_than_the_budget() {
    let client = match async_nats::ConnectOptions::new()
        .connection_timeout(Duration::from_secs(2))
        .connect(url())
        .await
    {
        Ok(client) => client,
        Err(error) => {
            intake_core::backend::testkit::skip_or_fail(
                "pulls within the budget",
                &format!("no NATS server at {} ({error})", url()),
            );
            return;
        }
    };
    let context = jetstream::new(client.clone());
    let token = client.new_inbox().replace("_INBOX.", "");
    let name = format!("intake_pulls_{token}");
    let stream = context
        .create_stream(jetstream::stream::Config {
            name: name.clone(),
            subjects: vec![format!("pulls.{token}")],
            ..Default::default()
        })
        .await
        .expect("stream");
    let mut acks = Vec::with_capacity(MESSAGES);
    for _ in 0..MESSAGES {
        acks.push(
            context
                .publish(format!("pulls.{token}"), Bytes::from_static(b"x"))
                .await
                .expect("publish"),
        );
    }
    for ack in acks {
        ack.await.expect("stored");
    }
    let mut source = NatsSource::builder(url())
        .stream(&name)
        .consumer("budget")
        .ack_wait(Duration::from_secs(60))
        .build()
        .await
        .expect("source");
    source.set_limits(Limits::new(BUDGET, usize::MAX, Duration::from_secs(5)));
    let mut acker = source.acker();
    let mut held: Vec<Message> = Vec::new();
    let mut received = 0;
    while received < MESSAGES {
        let before = held.len();
        let free = BUDGET - before;
        tokio::time::timeout(Duration::from_secs(10), source.next(&mut held, free))
            .await
            .expect("deliveries within 10 s")
            .expect("next");
        received += held.len() - before;
        assert!(held.len() <= BUDGET, "{} handed over", held.len());
        let info = stream.consumer_info("budget").await.expect("info");
        assert!(
            info.num_ack_pending <= BUDGET,
            "the server sent {} beyond the acknowledged ones, over a budget of {BUDGET}",
            info.num_ack_pending
        );
        if held.len() >= 60 {
            let finished: Vec<Message> = held.drain(..60).collect();
            acker.ack(&completed(&finished)).await.expect("confirmed");
        }
    }
    assert_eq!(received, MESSAGES);
    source.close().await.expect("close");
    context.delete_stream(&name).await.expect("delete");
}

/// A message parked here that the server delivers again (the progress
/// reports were lost for longer than `ack_wait`; acted out here with a
/// `-NAK` on its reply subject) stays parked: it is not handed to the
/// runtime a second time, and once due it comes back once, held under
/// the newer delivery.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivery_of_a_message_parked_here_stays_parked() {
    use intake_core::parking::Parking;

    let client = match async_nats::ConnectOptions::new()
        .connection_timeout(Duration::from_secs(2))
        .connect(url())
        .await
    {
        Ok(client) => client,
        Err(error) => {
            intake_core::backend::testkit::skip_or_fail(
                "a redelivery of a parked message",
                &format!("no NATS server at {} ({error})", url()),
            );
            return;
        }
    };
    let context = jetstream::new(client.clone());
    let token = client.new_inbox().replace("_INBOX.", "");
    let name = format!("intake_parkedredelivery_{token}");
    context
        .create_stream(jetstream::stream::Config {
            name: name.clone(),
            subjects: vec![format!("parked.{token}")],
            ..Default::default()
        })
        .await
        .expect("stream");
    context
        .publish(format!("parked.{token}"), Bytes::from_static(b"m"))
        .await
        .expect("publish")
        .await
        .expect("stored");
    let mut source = NatsSource::builder(url())
        .stream(&name)
        .consumer("parked")
        .build()
        .await
        .expect("source");
    let mut acker = source.acker();
    let mut held = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), source.next(&mut held, 1))
        .await
        .expect("a delivery within 10 s")
        .expect("next");
    let message = held.pop().expect("one");
    let delay = Duration::from_secs(2);
    source
        .parking()
        .park(&message, delay)
        .await
        .expect("parked");
    let mut ack = PartitionAck::new(message.metadata().partition_key());
    ack.requeue_after
        .push((message.metadata().position(), delay));
    acker
        .ack(&AckBatch {
            partitions: vec![ack],
            sync: true,
        })
        .await
        .expect("confirmed");
    assert_eq!(source.parked_waiting(), 1);
    let sequence = 1;
    let reply = source.deliveries.get(sequence).expect("held").reply;
    client
        .publish(reply, Bytes::from_static(b"-NAK"))
        .await
        .expect("nak");
    let parked_at = Instant::now();
    tokio::time::timeout(Duration::from_secs(10), source.next(&mut held, 1))
        .await
        .expect("given back within 10 s")
        .expect("next");
    assert!(
        parked_at.elapsed() >= delay - Duration::from_millis(100),
        "not handed over before it was due: {:?}",
        parked_at.elapsed()
    );
    assert_eq!(held.len(), 1, "{held:?}");
    assert_eq!(
        source.deliveries.get(sequence).map(|held| held.delivered),
        Some(2),
        "held under the newer delivery"
    );
    acker.ack(&completed(&held)).await.expect("confirmed");
    source.close().await.expect("close");
    let info = context
        .get_stream(&name)
        .await
        .expect("stream")
        .consumer_info("parked")
        .await
        .expect("info");
    assert_eq!(info.num_ack_pending, 0);
    context.delete_stream(&name).await.expect("delete");
}

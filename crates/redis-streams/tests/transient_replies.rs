//! Replies a Redis sends while it fails over, loads its data set or cannot
//! persist (`READONLY`, `NOREPLICAS`, `MISCONF`, `LOADING`, `TRYAGAIN`,
//! `CLUSTERDOWN`, `MASTERDOWN`, `BUSY`, `OOM`): the source waits and reads
//! again (counted in its counters), never stops for good; the acker, told
//! `READONLY` by a server that became a replica, connects anew. A scripted
//! server plays them after the handshake.

mod scripted_server;
mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use intake_core::{
    Constant,
    backend::{AckBatch, Acker, PartitionAck, Source, SourceError},
};
use intake_redis_streams::{Error, RedisStreamsSource};

use scripted_server::{ScriptedServer, array, bulk, entry, error, int};
use support::*;

/// Far above every timeout configured here: reaching it means a hang.
const HANG: Duration = Duration::from_secs(30);

const TRANSIENT: [&str; 9] = [
    "READONLY You can't write against a read only replica.",
    "NOREPLICAS Not enough good replicas to write.",
    "MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk.",
    "LOADING Redis is loading the dataset in memory",
    "TRYAGAIN Multiple keys request during rehashing of slot",
    "CLUSTERDOWN The cluster is down",
    "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
    "BUSY Redis is busy running a script.",
    "OOM command not allowed when used memory > 'maxmemory'.",
];

/// A group read (`XREADGROUP` is a write command: a replica refuses it).
fn is_read(command: &[String]) -> bool {
    command.first().is_some_and(|name| name == "XREADGROUP")
}

#[tokio::test]
async fn failover_and_loading_replies_to_a_read_are_retried_and_counted() {
    for reply in TRANSIENT {
        let failed = AtomicUsize::new(0);
        let server = ScriptedServer::start(move |_, command| {
            if !is_read(command) {
                return None;
            }
            if failed.fetch_add(1, Ordering::SeqCst) < 2 {
                return Some(error(reply));
            }
            Some(array(&[array(&[
                bulk("orders"),
                array(&[entry("5-1", &[("payload", "after")])]),
            ])]))
        })
        .await;
        let mut source = RedisStreamsSource::builder(server.url())
            .stream("orders")
            .group("billing")
            .consumer("c1")
            .block(Duration::from_millis(50))
            .reconnect_backoff(Constant::new(Duration::from_millis(10)).retry_forever())
            .build()
            .await
            .expect("connect to the scripted server");
        let mut delivered = Vec::new();
        let fetched = tokio::time::timeout(HANG, source.next(&mut delivered, 10)).await;
        assert!(matches!(fetched, Ok(Ok(_))), "{reply}: {fetched:?}");
        assert_eq!(payloads(&delivered), vec!["after"], "{reply}");
        assert_eq!(source.counters().retries(), 2, "{reply}");
    }
}

#[tokio::test]
async fn a_transient_reply_ends_the_source_only_when_the_reconnect_policy_gives_up() {
    let server =
        ScriptedServer::start(|_, command| is_read(command).then(|| error(TRANSIENT[0]))).await;
    let mut source = RedisStreamsSource::builder(server.url())
        .stream("orders")
        .group("billing")
        .block(Duration::from_millis(50))
        .reconnect_backoff(Constant::new(Duration::from_millis(10)).max_retries(3))
        .build()
        .await
        .expect("connect to the scripted server");
    let mut delivered = Vec::new();
    let fetched = tokio::time::timeout(HANG, source.next(&mut delivered, 10)).await;
    let Ok(Err(error)) = fetched else {
        panic!("expected the source to give up, got {fetched:?}");
    };
    assert!(
        matches!(error, SourceError::Transient(_)),
        "a failover is no reason to stop for good: {error:?}"
    );
    assert!(error.is_transient());
}

#[tokio::test]
async fn a_reply_the_user_must_act_on_still_stops_the_source() {
    let server = ScriptedServer::start(|_, command| {
        is_read(command)
            .then(|| error("NOPERM this user has no permissions to run the 'xreadgroup' command"))
    })
    .await;
    let mut source = RedisStreamsSource::builder(server.url())
        .stream("orders")
        .group("billing")
        .block(Duration::from_millis(50))
        .build()
        .await
        .expect("connect to the scripted server");
    let mut delivered = Vec::new();
    let fetched = tokio::time::timeout(HANG, source.next(&mut delivered, 10)).await;
    let Ok(Err(SourceError::Fatal(error))) = fetched else {
        panic!("expected a fatal error, got {fetched:?}");
    };
    assert!(
        matches!(error.downcast_ref::<Error>(), Some(Error::Forbidden { .. })),
        "{error}"
    );
}

#[tokio::test]
async fn an_acker_told_readonly_by_a_demoted_master_connects_anew() {
    // Connection 0 is the source's, 1 the acker's: the old master, now a
    // replica. A connection opened after it reaches the new master.
    let newest = std::sync::Arc::new(AtomicUsize::new(0));
    let seen = newest.clone();
    let server = ScriptedServer::start(move |connection, command| {
        seen.fetch_max(connection, Ordering::SeqCst);
        match command.first()?.as_str() {
            "XACK" if connection <= 1 => Some(error(TRANSIENT[0])),
            "XACK" => Some(int(1)),
            _ => None,
        }
    })
    .await;
    let _source = RedisStreamsSource::builder(server.url())
        .stream("orders")
        .group("billing")
        .block(Duration::from_millis(50))
        .build()
        .await
        .expect("connect to the scripted server");
    let mut acker = _source.acker();
    let mut batch = AckBatch::default();
    let mut partition = PartitionAck::new(partition("orders"));
    partition
        .completed
        .push(intake_core::Position::StreamId { ms: 5, seq: 1 });
    batch.partitions.push(partition);
    let acknowledged = tokio::time::timeout(HANG, acker.ack(&batch)).await;
    assert!(
        matches!(acknowledged, Ok(Ok(()))),
        "the acker kept the connection to the replica: {acknowledged:?}"
    );
    assert!(
        newest.load(Ordering::SeqCst) >= 2,
        "a new connection was opened"
    );
}

//! Entries deleted or trimmed from their stream while pending: they are
//! acknowledged and counted, never a fatal error, on Redis 6.2 (whose
//! `XCLAIM` answers nil for them, played by a scripted server) and on the
//! real Redis 7 of this machine (which drops them from the pending list).

mod scripted_server;
mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use intake_core::backend::Source;
use intake_redis_streams::{RedisSettings, RedisStreamsSource};
use redis::AsyncCommands;

use scripted_server::{NULL, ScriptedServer, array, entry, pending_row};
use support::*;

/// Far above every timeout configured here: reaching it means a hang.
const HANG: Duration = Duration::from_secs(30);

#[tokio::test]
async fn a_claimed_entry_that_redis_6_answers_with_nil_is_acknowledged_and_counted() {
    let claimed_once = AtomicBool::new(false);
    let server = ScriptedServer::start(move |_, command| {
        let name = command.first()?.to_ascii_uppercase();
        let idle_scan = name == "XPENDING" && command.iter().any(|arg| arg == "IDLE");
        if idle_scan && !claimed_once.swap(true, Ordering::SeqCst) {
            // Two entries of a dead consumer, idle long enough; 1-1 was
            // deleted from the stream meanwhile.
            return Some(array(&[
                pending_row("1-1", "dead", 70_000, 1),
                pending_row("2-1", "dead", 70_000, 1),
            ]));
        }
        if name == "XCLAIM" {
            // Redis 6.2: nil in place of the deleted entry.
            return Some(array(&[
                NULL.to_vec(),
                entry("2-1", &[("payload", "kept")]),
            ]));
        }
        None
    })
    .await;
    let mut source = RedisStreamsSource::builder(
        RedisSettings::new(server.url())
            .connect_timeout(Duration::from_secs(1))
            .command_timeout(Duration::from_secs(1)),
    )
    .stream("orders")
    .group("billing")
    .consumer("heir")
    .block(Duration::from_millis(50))
    .build()
    .await
    .expect("connect to the scripted Redis 6.2");

    let mut delivered = Vec::new();
    let fetched = tokio::time::timeout(HANG, source.next(&mut delivered, 10)).await;
    assert!(
        matches!(fetched, Ok(Ok(_))),
        "the nil entry stopped the source: {fetched:?}"
    );
    assert_eq!(payloads(&delivered), vec!["kept"]);
    assert_eq!(delivered[0].metadata().attempt(), 2);

    let acknowledged: Vec<_> = server
        .commands_named("XACK")
        .into_iter()
        .flat_map(|command| command.into_iter().skip(3))
        .collect();
    assert_eq!(
        acknowledged,
        vec!["1-1"],
        "only the deleted entry is acknowledged"
    );
    assert_eq!(source.counters().vanished(), 1);
}

#[tokio::test]
async fn a_claimed_entry_missing_from_the_reply_but_still_in_the_stream_is_left_alone() {
    // Redis 6.2 answers nil for one entry and leaves out another (claimed
    // by a third consumer in between): only an entry that is gone from the
    // stream may be acknowledged.
    let claimed_once = AtomicBool::new(false);
    let server = ScriptedServer::start(move |_, command| {
        let name = command.first()?.to_ascii_uppercase();
        let idle_scan = name == "XPENDING" && command.iter().any(|arg| arg == "IDLE");
        if idle_scan && !claimed_once.swap(true, Ordering::SeqCst) {
            return Some(array(&[
                pending_row("1-1", "dead", 70_000, 1),
                pending_row("2-1", "dead", 70_000, 1),
                pending_row("3-1", "dead", 70_000, 1),
            ]));
        }
        match name.as_str() {
            "XCLAIM" => Some(array(&[
                NULL.to_vec(),
                entry("3-1", &[("payload", "kept")]),
            ])),
            // 2-1 still exists (another consumer holds it); 1-1 is gone.
            "XRANGE" if command.get(2).is_some_and(|id| id == "2-1") => {
                Some(array(&[entry("2-1", &[("payload", "elsewhere")])]))
            }
            _ => None,
        }
    })
    .await;
    let mut source = RedisStreamsSource::builder(server.url())
        .stream("orders")
        .group("billing")
        .consumer("heir")
        .block(Duration::from_millis(50))
        .build()
        .await
        .expect("connect to the scripted Redis 6.2");
    let mut delivered = Vec::new();
    let fetched = tokio::time::timeout(HANG, source.next(&mut delivered, 10)).await;
    assert!(matches!(fetched, Ok(Ok(_))), "{fetched:?}");
    assert_eq!(payloads(&delivered), vec!["kept"]);
    let acknowledged: Vec<_> = server
        .commands_named("XACK")
        .into_iter()
        .flat_map(|command| command.into_iter().skip(3))
        .collect();
    assert_eq!(acknowledged, vec!["1-1"]);
}

#[tokio::test]
async fn entries_deleted_or_trimmed_while_pending_leave_the_group_when_claimed_on_redis_7() {
    let Some(mut redis) = redis_or_skip("entries_deleted_or_trimmed_while_pending").await else {
        return;
    };
    let stream = unique("vanished-claim");
    let group = unique("group");
    produce(&mut redis, &stream, "m", 4).await;
    let mut dead = group_builder(&stream, &group, "dead")
        .build()
        .await
        .expect("connect");
    let held = receive(&mut dead, 4, 10, Duration::from_secs(5)).await;
    assert_eq!(held.len(), 4);
    drop(dead);
    let ids: Vec<String> = held
        .iter()
        .map(|message| message.metadata().position().to_string())
        .collect();
    // m0 is deleted, m1 trimmed away.
    redis
        .xdel::<_, _, ()>(&stream, &[&ids[0]])
        .await
        .expect("XDEL");
    redis::cmd("XTRIM")
        .arg(&stream)
        .arg("MINID")
        .arg(&ids[2])
        .query_async::<()>(&mut redis)
        .await
        .expect("XTRIM");

    let mut heir = group_builder(&stream, &group, "heir")
        .build()
        .await
        .expect("connect");
    let mut acker = heir.acker();
    let claimed = receive(&mut heir, 2, 10, Duration::from_secs(10)).await;
    assert_eq!(payloads(&claimed), vec!["m2", "m3"]);
    assert!(
        claimed
            .iter()
            .all(|message| message.metadata().attempt() == 2)
    );
    ack(&mut acker, &claimed).await;
    // Redis 7 dropped the vanished entries from the pending list itself.
    assert_all_acknowledged(&mut redis, &stream, &group).await;
}

#[tokio::test]
async fn own_pending_entries_deleted_before_a_restart_are_acknowledged_and_counted() {
    let Some(mut redis) = redis_or_skip("own_pending_entries_deleted_before_a_restart").await
    else {
        return;
    };
    let stream = unique("vanished-own");
    let group = unique("group");
    produce(&mut redis, &stream, "m", 3).await;
    let config = || group_builder(&stream, &group, "same").claim_min_idle(Duration::from_secs(600));
    let mut first = config().build().await.expect("connect");
    let held = receive(&mut first, 3, 10, Duration::from_secs(5)).await;
    drop(first);
    let deleted = held[1].metadata().position().to_string();
    redis
        .xdel::<_, _, ()>(&stream, &[&deleted])
        .await
        .expect("XDEL");

    let mut again = config().build().await.expect("connect");
    let mut acker = again.acker();
    let redelivered = receive(&mut again, 2, 10, Duration::from_secs(5)).await;
    assert_eq!(payloads(&redelivered), vec!["m0", "m2"]);
    ack(&mut acker, &redelivered).await;
    assert_eq!(again.counters().vanished(), 1);
    assert_all_acknowledged(&mut redis, &stream, &group).await;
}

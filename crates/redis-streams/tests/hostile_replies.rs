//! Hostile content after the handshake: a server answers the source's
//! reads, pending scans and claims with arbitrary RESP (wrong shapes, wrong
//! counts, cut short, garbage bytes). Through the real client and the real
//! source, every call ends within its timeouts in messages or a typed
//! error, or keeps reading: never a panic, never a hang. (The parsers alone get 2,000 reply
//! trees each in `src/entry.rs`; this runs fewer cases, each with a
//! connection.)

mod scripted_server;
mod support;

use std::time::Duration;

use intake_core::{Constant, backend::Source};
use intake_redis_streams::{RedisSettings, RedisStreamsSource};
use proptest::prelude::*;

use scripted_server::ScriptedServer;

/// Far above the timeouts configured below.
const HANG: Duration = Duration::from_secs(20);

/// How long one call is watched; several of the short timeouts below fit.
const WAIT: Duration = Duration::from_millis(600);

/// RESP fragments biased toward what the parsers look for, with lengths
/// that may lie about what follows.
fn any_resp() -> impl Strategy<Value = Vec<u8>> {
    let bulk = |text: String| format!("${}\r\n{text}\r\n", text.len()).into_bytes();
    let leaf = prop_oneof![
        Just(b"$-1\r\n".to_vec()),
        Just(b"*-1\r\n".to_vec()),
        Just(b"_\r\n".to_vec()),
        Just(b"+OK\r\n".to_vec()),
        any::<i64>().prop_map(|n| format!(":{n}\r\n").into_bytes()),
        "[0-9]{1,20}-[0-9]{1,20}".prop_map(bulk),
        prop_oneof![Just("payload"), Just("key"), Just("orders")]
            .prop_map(move |t| bulk(t.to_owned())),
        ".{0,8}".prop_map(bulk),
        prop::collection::vec(any::<u8>(), 0..12),
        Just(b"-ERR hostile\r\n".to_vec()),
    ];
    leaf.prop_recursive(4, 48, 5, |inner| {
        (
            prop_oneof![Just('*'), Just('%'), Just('~')],
            prop::collection::vec(inner, 0..5),
            -1_i64..7,
        )
            .prop_map(|(kind, items, stated)| {
                let mut out = format!("{kind}{stated}\r\n").into_bytes();
                for item in items {
                    out.extend(item);
                }
                out
            })
    })
}

/// Which of the source's commands gets the hostile reply.
#[derive(Clone, Copy, Debug)]
enum Target {
    NewRead,
    OwnPendingRead,
    PendingScan,
    Claim,
}

fn targets(target: Target, command: &[String]) -> bool {
    let name = command.first().map(String::as_str);
    match target {
        Target::NewRead => name == Some("XREADGROUP") && command.iter().any(|arg| arg == ">"),
        Target::OwnPendingRead => {
            name == Some("XREADGROUP") && !command.iter().any(|arg| arg == ">")
        }
        Target::PendingScan => name == Some("XPENDING") && command.iter().any(|arg| arg == "IDLE"),
        Target::Claim => name == Some("XCLAIM"),
    }
}

/// A pending row and a claimable entry, so that the claim path is reached.
fn claimable(command: &[String]) -> Option<Vec<u8>> {
    let name = command.first().map(String::as_str);
    if name == Some("XPENDING") && command.iter().any(|arg| arg == "IDLE") {
        return Some(b"*1\r\n*4\r\n$3\r\n1-1\r\n$4\r\ndead\r\n:70000\r\n:1\r\n".to_vec());
    }
    None
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    #[test]
    fn any_reply_after_the_handshake_ends_in_messages_or_a_typed_error(
        reply in any_resp(),
        target in prop_oneof![
            Just(Target::NewRead),
            Just(Target::OwnPendingRead),
            Just(Target::PendingScan),
            Just(Target::Claim),
        ],
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let outcome = runtime.block_on(async move {
            let server = ScriptedServer::start(move |_, command| {
                if targets(target, command) {
                    return Some(reply.clone());
                }
                claimable(command)
            })
            .await;
            let mut source = RedisStreamsSource::builder(RedisSettings::new(server.url()).connect_timeout(Duration::from_millis(200)).command_timeout(Duration::from_millis(100)))
                .stream("orders")
                .group("billing")
                .consumer("c1")
                .block(Duration::from_millis(10))
                .reconnect_backoff(Constant::new(Duration::from_millis(1)).max_retries(1))
                .build()
                .await
                .expect("the handshake is not hostile");
            let mut delivered = Vec::new();
            // Two calls: the second runs after whatever the first left
            // behind (a dropped connection, staged entries). A call may wait
            // for entries as long as it likes (that is its job), but while
            // it waits it must keep asking the server.
            for _ in 0..2 {
                delivered.clear();
                let asked = server.commands().len();
                match tokio::time::timeout(WAIT, source.next(&mut delivered, 10)).await {
                    Err(_) if server.commands().len() > asked + 1 => break,
                    Err(_) => return Err(format!("{target:?}: next() stopped asking")),
                    Ok(Ok(_)) => {}
                    Ok(Err(_typed)) => break,
                }
            }
            match tokio::time::timeout(HANG, source.close()).await {
                Err(_) => Err(format!("{target:?}: close() hung")),
                Ok(_) => Ok(()),
            }
        });
        prop_assert!(outcome.is_ok(), "{:?}", outcome);
    }
}

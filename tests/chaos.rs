//! Chaos: the `ledger` example (`examples/ledger.rs`) consumes from the real
//! brokers while this suite SIGKILLs it, breaks its connections or restarts
//! its broker, and then checks the ledger it wrote: every produced id
//! handled at least once (docs/CONTRACT.md: at-least-once through crashes,
//! §5, and broker outages, §9), duplicates counted. A rolling restart
//! (SIGTERM and replace each of three group members in turn while messages
//! keep arriving, §4) must lose nothing either; its duplicates are counted
//! apart, those of the graceful handovers and the others.
//!
//! While `ledger consume --later-every` parks messages through each
//! backend's own mechanism it is SIGKILLed too: no parked id may be lost,
//! and none may run before its due time.
//!
//! The relay (`ledger relay`, consuming one source and publishing into
//! another) is SIGKILLed the same way, and every id must reach the second
//! source at least once; on Kafka with `--exactly-once` (transactions),
//! exactly once as read with `read_committed`.
//!
//! One test per backend runs its scenarios one after the other: they would
//! only fight over the cores, and the Kafka broker restart must not overlap
//! the other Kafka scenarios. Each scenario prints a summary line
//! (`chaos BACKEND SCENARIO: produced=… lost=0 …`); run with `--nocapture`
//! to see them. A broker that is not reachable skips its test, unless
//! `INTAKE_REQUIRE_BROKERS=1`.
//!
//! Kills and faults come at seeded moments of the work's progress (so many
//! distinct ids handled); `INTAKE_CHAOS_SEED` changes them, and a failure
//! prints the seed with the command that replays it. `INTAKE_CHAOS_KEEP=1`
//! keeps the ledgers and the children's logs of passed scenarios too;
//! `INTAKE_CHAOS_ONLY=parking,kill` runs only the scenarios it names.

mod chaos_support;

use chaos_support::backends::Backend;
use chaos_support::scenarios::{self, Kills, Rolling};
use intake::kafka::GroupProtocol;
use intake_core::backend::testkit::skip_or_fail as skip;

/// The figures: 50,000 messages, at least ten kills.
const KILLS: Kills = Kills {
    messages: 50_000,
    kills: 10,
    // Every 13th first attempt fails: kills also land on retries.
    fail_every: Some(13),
    effects_db: false,
};
/// Fewer messages where the point is one fault or one takeover, for time.
const FAULT_MESSAGES: u64 = 20_000;
const FAULTS: u32 = 3;
const TWO_CONSUMER_MESSAGES: u64 = 20_000;
/// Three instances, each replaced once, while 5,000 ids a second arrive
/// (about 10 s on Kafka, whose group rebalances at each stop and start);
/// each new instance handles 2,000 ids before the next stop. Every 13th
/// first attempt fails, so retries are waiting in backoff when the SIGTERMs
/// land.
const ROLLING: Rolling = Rolling {
    instances: 3,
    per_second: 5_000,
    progress: 2_000,
    fail_every: Some(13),
};
/// The relay (issue 16): fewer messages, a few kills; each kill between an
/// output's confirmation and its input's acknowledgement repeats an output.
const RELAY_MESSAGES: u64 = 6_000;
const RELAY_KILLS: u32 = 3;
/// The exactly-once relay on Kafka: 2,000 ids trickling in at 200 a
/// second, two kills; each kill costs a session timeout (6 s) before the
/// next relay gets the partitions.
const EXACTLY_ONCE_RELAY_MESSAGES: u64 = 2_000;
const EXACTLY_ONCE_RELAY_PER_SECOND: u64 = 200;
const EXACTLY_ONCE_RELAY_KILLS: u32 = 2;
/// Exactly-once effects: a transaction per message is slower, and five
/// kills already leave redeliveries to dedupe.
const EFFECTS: Kills = Kills {
    messages: 10_000,
    kills: 5,
    fail_every: None,
    effects_db: true,
};

/// Parking (issue 18): every 7th first attempt parked for 2 s, two kills
/// while messages are parked.
const PARKING: scenarios::Parking = scenarios::Parking {
    messages: 2_000,
    kills: 2,
    later_every: 7,
    later: std::time::Duration::from_secs(2),
};

/// `Some(backend)` if its broker answers; otherwise says why and skips.
fn broker(test: &str, backend: Backend) -> Option<Backend> {
    match backend.reachable() {
        Ok(()) => Some(backend),
        Err(why) => {
            skip(test, &why);
            None
        }
    }
}

/// Kafka runs each scenario once, under one of the two consumer group
/// protocols (issue 27), so that both are covered without running
/// everything twice. KIP-848's consumer protocol takes the SIGKILLs and
/// restarts of `kill`, parking (whose mover is a group too), the
/// exactly-once relay's fencing and the rolling restart; the classic
/// protocol, still librdkafka's default, keeps the publishing relay, the
/// two members of which one is killed (both get partitions only through
/// the broker's initial rebalance delay, a classic-protocol setting: under
/// KIP-848 the first member takes the whole backlog before the second is
/// in) and the broker crash. RELIABILITY.md lists which runs where.
#[test]
fn kafka_loses_nothing_to_kills_a_broker_restart_or_a_killed_group_member() {
    let test = "kafka_loses_nothing_to_kills_a_broker_restart_or_a_killed_group_member";
    let Some(classic) = broker(test, Backend::Kafka(GroupProtocol::Classic)) else {
        return;
    };
    let kip848 = Backend::Kafka(GroupProtocol::Consumer);
    scenarios::sigkill_restarts(test, kip848, KILLS);
    scenarios::relay_kills(test, classic, RELAY_MESSAGES, RELAY_KILLS);
    scenarios::parking_kills(test, kip848, PARKING);
    scenarios::relay_kills_exactly_once(
        test,
        kip848,
        EXACTLY_ONCE_RELAY_MESSAGES,
        EXACTLY_ONCE_RELAY_PER_SECOND,
        EXACTLY_ONCE_RELAY_KILLS,
    );
    scenarios::two_consumers_one_killed(test, classic, TWO_CONSUMER_MESSAGES);
    scenarios::rolling_restart(test, kip848, ROLLING);
    // The broker is down for a while: nothing else on Kafka runs meanwhile.
    scenarios::broker_faults(test, classic, FAULT_MESSAGES, 1);
}

#[test]
fn redis_loses_nothing_to_kills_killed_connections_or_a_killed_group_member() {
    let test = "redis_loses_nothing_to_kills_killed_connections_or_a_killed_group_member";
    let Some(redis) = broker(test, Backend::Redis) else {
        return;
    };
    scenarios::sigkill_restarts(test, redis, KILLS);
    scenarios::relay_kills(test, redis, RELAY_MESSAGES, RELAY_KILLS);
    scenarios::parking_kills(test, redis, PARKING);
    scenarios::broker_faults(test, redis, FAULT_MESSAGES, FAULTS);
    scenarios::two_consumers_one_killed(test, redis, TWO_CONSUMER_MESSAGES);
    scenarios::rolling_restart(test, redis, ROLLING);
    scenarios::sigkill_restarts(test, redis, EFFECTS);
}

#[test]
fn amqp_loses_nothing_to_kills_closed_connections_or_a_killed_consumer() {
    let test = "amqp_loses_nothing_to_kills_closed_connections_or_a_killed_consumer";
    let Some(amqp) = broker(test, Backend::Amqp) else {
        return;
    };
    scenarios::sigkill_restarts(test, amqp, KILLS);
    scenarios::relay_kills(test, amqp, RELAY_MESSAGES, RELAY_KILLS);
    scenarios::parking_kills(test, amqp, PARKING);
    scenarios::broker_faults(test, amqp, FAULT_MESSAGES, FAULTS);
    scenarios::two_consumers_one_killed(test, amqp, TWO_CONSUMER_MESSAGES);
    scenarios::rolling_restart(test, amqp, ROLLING);
    scenarios::sigkill_restarts(test, amqp, EFFECTS);
}

#[test]
fn nats_loses_nothing_to_kills_a_server_crash_or_a_killed_group_member() {
    let test = "nats_loses_nothing_to_kills_a_server_crash_or_a_killed_group_member";
    let Some(nats) = broker(test, Backend::Nats) else {
        return;
    };
    scenarios::sigkill_restarts(test, nats, KILLS);
    scenarios::relay_kills(test, nats, RELAY_MESSAGES, RELAY_KILLS);
    scenarios::parking_kills(test, nats, PARKING);
    scenarios::two_consumers_one_killed(test, nats, TWO_CONSUMER_MESSAGES);
    scenarios::rolling_restart(test, nats, ROLLING);
    // A server of the scenario's own, SIGKILLed and started again.
    scenarios::broker_faults(test, nats, FAULT_MESSAGES, FAULTS);
    scenarios::sigkill_restarts(test, nats, EFFECTS);
}

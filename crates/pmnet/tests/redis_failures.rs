//! Failures fail fast and say where: with Redis or the device down, the gateway answers what
//! needs them with an error naming the part that is down (and sends nothing, so nothing is
//! applied), refuses new connections with it, answers `PING` only when Redis does, and keeps
//! the promise for updates: logged, acked, applied when Redis is back.
//!
//! Each test starts its own `redis-server` and PMNet processes (tests/redis_harness); needs
//! `redis-server` (scripts/test.sh installs it).

mod redis_harness;

use std::time::Duration;

use pmnet_redis::resp::{SyncClient, Value};
use redis_harness::*;

fn error_text(value: &Value) -> Option<String> {
    match value {
        Value::Error(text) => Some(String::from_utf8_lossy(text).into_owned()),
        _ => None,
    }
}

/// What a fresh connection's `PING` gets: its reply, or the error it read instead.
fn fresh_ping(system: &System) -> Result<Value, String> {
    let addr = SocketAddrOf::gateway(system);
    let mut client =
        SyncClient::connect(addr, Duration::from_secs(5)).map_err(|e| e.to_string())?;
    client.command(&["PING"]).map_err(|e| e.to_string())
}

struct SocketAddrOf;
impl SocketAddrOf {
    fn gateway(system: &System) -> std::net::SocketAddr {
        std::net::SocketAddr::from(([127, 0, 0, 1], system.gateway_port()))
    }
}

#[test]
fn redis_down_is_named_at_once_and_acked_updates_wait_for_it() {
    let mut system = System::start(false);
    let mut before = system.gateway_client();
    assert_eq!(
        before.command(&["PING"]).expect("PING"),
        Value::Simple(b"PONG".to_vec())
    );
    assert_eq!(
        before.command(&["SET", "a", "1"]).expect("SET"),
        Value::Simple(b"OK".to_vec())
    );
    let redis_addr = system.redis.addr().to_string();
    system.redis.kill();
    let named = format!("redis-server at {redis_addr} does not answer");

    // A new connection learns it with its first command (PING included: it is Redis's).
    poll_until(
        "a new connection is told Redis is down",
        || match fresh_ping(&system) {
            Ok(value) => error_text(&value).is_some_and(|text| text.contains(&named)),
            Err(why) => why.contains(&named),
        },
    );
    // A connection opened before: reads and bypass writes get the error, not sent…
    let reply = before.command(&["GET", "a"]).expect("GET");
    let text = error_text(&reply).unwrap_or_else(|| panic!("GET answered {reply:?}"));
    assert!(text.contains(&named), "{text}");
    let reply = before.command(&["INCR", "n"]).expect("INCR");
    assert!(
        error_text(&reply).is_some_and(|text| text.contains(&named)),
        "{reply:?}"
    );
    let reply = before.command(&["PING"]).expect("PING");
    assert!(
        error_text(&reply).is_some_and(|text| text.contains(&named)),
        "PING with Redis down: {reply:?}"
    );
    // …while an update is logged by the device and acked: the promise holds.
    assert_eq!(
        before.command(&["SET", "b", "2"]).expect("SET"),
        Value::Simple(b"OK".to_vec())
    );

    system.redis.spawn();
    poll_until("PING answers PONG again", || {
        fresh_ping(&system).is_ok_and(|value| value == Value::Simple(b"PONG".to_vec()))
    });
    poll_until("the acked SET is applied once Redis is back", || {
        before
            .command(&["GET", "b"])
            .is_ok_and(|value| value == bulk("2"))
    });
    // The INCR answered with the error was never applied.
    assert_eq!(
        before.command(&["GET", "n"]).expect("GET"),
        Value::Bulk(None)
    );
}

#[test]
fn the_device_down_is_named() {
    let mut system = System::start(false);
    let mut before = system.gateway_client();
    assert_eq!(
        before.command(&["SET", "a", "1"]).expect("SET"),
        Value::Simple(b"OK".to_vec())
    );
    let device = system.device_addr().to_string();
    if let Some(mut device) = system.device.take() {
        device.kill();
    }
    poll_until("the gateway names the device", || {
        let reply = before.command(&["GET", "a"]).expect("GET");
        error_text(&reply).is_some_and(|text| text.contains(&device) && text.contains("device"))
    });
    // Nothing can be logged: an update is refused too, not sent.
    let reply = before.command(&["SET", "c", "3"]).expect("SET");
    let text = error_text(&reply).unwrap_or_else(|| panic!("SET answered {reply:?}"));
    assert!(text.contains("not sent"), "{text}");
    system.start_device();
    poll_until("the path answers again", || {
        fresh_ping(&system).is_ok_and(|value| value == Value::Simple(b"PONG".to_vec()))
    });
    assert_eq!(before.command(&["GET", "a"]).expect("GET"), bulk("1"));
    assert_eq!(
        before.command(&["GET", "c"]).expect("GET"),
        Value::Bulk(None)
    );
}

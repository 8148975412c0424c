//! The device's read cache behind the Redis gateway (`pmnet device --cache`, `pmnet gateway
//! --device-cache`), real processes and a real `redis-server`: a hot key's `GET` is answered
//! by the device, and every kind of write — a plain SET, a SET with options, a counting write,
//! a delete, a multi-key write (a barrier), a transaction, an expiry — is seen by the next
//! read, from the same connection and from another one.

mod redis_harness;

use std::time::Duration;

use pmnet_redis::resp::Value;
use redis_harness::*;

fn cached_system() -> System {
    System::start_full(
        &[
            "--cache",
            "--cache-hot-threshold",
            "1",
            "--cache-interval-ms",
            "1",
            // Every client here is new: nothing sent before the device started can come back.
            "--cache-fetch-warmup-ms",
            "0",
            "--metrics",
            "127.0.0.1:0",
        ],
        &["--device-cache"],
        false,
    )
}

fn device_metric(system: &System, name: &str) -> f64 {
    let addr = system
        .device
        .as_ref()
        .and_then(|device| device.metrics)
        .expect("the device has a metrics endpoint");
    let text = pmnet_runtime::metrics::scrape(addr, Duration::from_secs(5)).expect("scrape");
    pmnet_runtime::metrics::find_sample(&text, name, "").unwrap_or(0.0)
}

fn hits(system: &System) -> f64 {
    device_metric(system, "pmnet_cache_hits_total")
}

fn get(redis: &mut pmnet_redis::resp::SyncClient, key: &str) -> Value {
    redis.command(&["GET", key]).expect("GET")
}

fn ok(redis: &mut pmnet_redis::resp::SyncClient, words: &[&str]) -> Value {
    let value = redis.command(words).expect("a reply");
    assert!(
        !matches!(value, Value::Error(_)),
        "{words:?} answered {value:?}"
    );
    value
}

/// Read `key` (checking every answer) until the device answers it from its cache.
fn read_until_cached(system: &System, redis: &mut pmnet_redis::resp::SyncClient, key: &str) {
    let expected = get(redis, key);
    let before = hits(system);
    for _ in 0..200 {
        assert_eq!(get(redis, key), expected, "GET {key}");
        if hits(system) > before {
            return;
        }
    }
    panic!("the device never answered GET {key} from its cache");
}

#[test]
fn gets_are_answered_by_the_device_and_see_every_kind_of_write() {
    let system = cached_system();
    let mut writer = system.gateway_client();
    let mut reader = system.gateway_client();
    ok(&mut writer, &["SET", "greeting", "hello"]);
    read_until_cached(&system, &mut writer, "greeting");
    // Another connection (another session) reads the cached value too.
    assert_eq!(get(&mut reader, "greeting"), bulk("hello"));

    // Each write is followed by reads from the writer and from the other connection; the
    // key is cached again in between, so each write meets a cached item.
    let cases: &[(&[&str], Value)] = &[
        (&["SET", "greeting", "bonjour"], bulk("bonjour")),
        (&["APPEND", "greeting", "!"], bulk("bonjour!")),
        (&["SET", "greeting", "hallo", "KEEPTTL"], bulk("hallo")),
        (&["MSET", "greeting", "ciao", "other", "x"], bulk("ciao")),
        (&["DEL", "greeting"], Value::Bulk(None)),
        (&["SET", "greeting", "hej"], bulk("hej")),
        (&["RENAME", "other", "greeting"], bulk("x")),
        (&["DEL", "greeting", "nothing-here"], Value::Bulk(None)),
        (&["INCR", "greeting"], bulk("1")),
        (&["FLUSHALL"], Value::Bulk(None)),
    ];
    for (write, expected) in cases {
        read_until_cached(&system, &mut writer, "greeting");
        ok(&mut writer, write);
        assert_eq!(get(&mut writer, "greeting"), *expected, "after {write:?}");
        // The other connection reads after the write was answered: it must see it.
        assert_eq!(get(&mut reader, "greeting"), *expected, "after {write:?}");
    }

    // A transaction is a barrier too.
    ok(&mut writer, &["SET", "greeting", "salut"]);
    read_until_cached(&system, &mut writer, "greeting");
    ok(&mut writer, &["MULTI"]);
    ok(&mut writer, &["SET", "greeting", "tere"]);
    ok(&mut writer, &["EXEC"]);
    assert_eq!(get(&mut reader, "greeting"), bulk("tere"));
    assert!(device_metric(&system, "pmnet_cache_barriers_total") >= 5.0);
}

#[test]
fn a_key_with_a_time_to_live_is_never_cached_and_expires() {
    let system = cached_system();
    let mut redis = system.gateway_client();
    ok(&mut redis, &["SET", "lasting", "1"]);
    read_until_cached(&system, &mut redis, "lasting");
    // A value that expires: Redis drops it without a write the device would see, so the
    // adaptor marks its reads not cacheable and the device never holds it.
    ok(&mut redis, &["SET", "brief", "v", "PX", "1500"]);
    let mut reads = 0;
    while get(&mut redis, "brief") == bulk("v") {
        reads += 1;
        assert!(reads < 100_000, "brief never expired");
    }
    assert_eq!(get(&mut redis, "brief"), Value::Bulk(None));
    assert!(
        reads > 2,
        "too few reads before the expiry to matter: {reads}"
    );
    assert!(device_metric(&system, "pmnet_cache_not_cacheable_total") >= 1.0);
    // An expiry set on a cached key drops it (EXPIRE is a keyed write).
    ok(&mut redis, &["PEXPIRE", "lasting", "500"]);
    poll_until("lasting expires", || {
        get(&mut redis, "lasting") == Value::Bulk(None)
    });
}

#[test]
fn the_device_restarting_empties_its_cache_and_reads_go_on() {
    let mut system = cached_system();
    let mut redis = system.gateway_client();
    ok(&mut redis, &["SET", "greeting", "hello"]);
    read_until_cached(&system, &mut redis, "greeting");
    system.device.as_mut().expect("device").kill();
    system.start_device();
    ok(&mut redis, &["SET", "greeting", "again"]);
    assert_eq!(get(&mut redis, "greeting"), bulk("again"));
    read_until_cached(&system, &mut redis, "greeting");
    assert_eq!(get(&mut redis, "greeting"), bulk("again"));
}

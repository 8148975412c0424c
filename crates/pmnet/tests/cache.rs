//! The read cache in a real device (`pmnet device --cache`), with `pmnet client` (which sends
//! every write keyed and every GET as a cache read): a hot key is served by the device, and a
//! read returns the latest acknowledged value after a write, after a server restart and after
//! a device restart (which empties the cache).

mod common;

use common::{args, run_pmnet, Cluster};

fn client(cluster: &Cluster, words: &[&str]) -> String {
    let device = cluster.device_addr.to_string();
    let mut all = vec!["client", "--device", device.as_str()];
    all.extend_from_slice(words);
    let (status, stdout, stderr) = run_pmnet(&args(&all), None);
    assert!(status.success(), "{words:?}: {stdout}\n{stderr}");
    stdout.trim().to_owned()
}

/// The value a `get` printed, without who answered it.
fn value(line: &str) -> &str {
    line.rsplit_once(" (from ").map_or(line, |(value, _)| value)
}

const FROM_CACHE: &str = " (from the cache of device 1)";
const FROM_SERVER: &str = " (from server 1)";

fn hits(cluster: &Cluster) -> f64 {
    cluster
        .device
        .as_ref()
        .expect("the device runs")
        .metric("pmnet_cache_hits_total", "")
        .unwrap_or(0.0)
}

/// Read `key` until the device serves it (hot after one miss, admitted every millisecond,
/// fetched on the next miss), checking every answer on the way.
fn read_until_cached(cluster: &Cluster, key: &str, expected: &str) {
    let before = hits(cluster);
    for _ in 0..50 {
        let line = client(cluster, &["get", key]);
        assert_eq!(value(&line), expected);
        if hits(cluster) > before {
            // The device's answer says so, and the device says it answered.
            assert_eq!(
                client(cluster, &["get", key]),
                format!("{expected}{FROM_CACHE}")
            );
            return;
        }
        assert_eq!(line, format!("{expected}{FROM_SERVER}"));
    }
    panic!("the device never served {key}");
}

#[test]
fn a_cached_key_reads_the_latest_acknowledged_value_through_writes_and_restarts() {
    let mut cluster = Cluster::start_with_device_options(&[
        "--cache",
        "--cache-hot-threshold",
        "1",
        "--cache-interval-ms",
        "1",
        // Every client here is new: nothing sent before the device started can come back.
        "--cache-fetch-warmup-ms",
        "0",
    ]);
    let banner = cluster.device.as_ref().unwrap().banner.join("\n");
    assert!(banner.contains("cache: on"), "{banner}");
    assert!(client(&cluster, &["set", "greeting", "hello"]).starts_with("OK"));
    read_until_cached(&cluster, "greeting", "hello");
    // A write to the cached key: the next read (served by the device) has the new value.
    assert!(client(&cluster, &["set", "greeting", "bonjour"]).starts_with("OK"));
    let served = hits(&cluster);
    assert_eq!(
        client(&cluster, &["get", "greeting"]),
        format!("bonjour{FROM_CACHE}")
    );
    assert!(hits(&cluster) > served, "the device served the new value");
    assert!(client(&cluster, &["del", "greeting"]).starts_with("OK"));
    assert_eq!(
        value(&client(&cluster, &["get", "greeting"])),
        "(not found)"
    );
    assert!(client(&cluster, &["set", "greeting", "hola"]).starts_with("OK"));
    // The server restarts: the device's cache and log carry on.
    cluster.stop_server();
    cluster.start_server();
    assert_eq!(value(&client(&cluster, &["get", "greeting"])), "hola");
    // The device restarts: its cache starts empty, reads go to the server.
    cluster.stop_device();
    cluster.start_device();
    assert_eq!(
        client(&cluster, &["get", "greeting"]),
        format!("hola{FROM_SERVER}")
    );
    assert!(client(&cluster, &["incr", "counter", "5"]).contains('5'));
    assert_eq!(
        client(&cluster, &["get", "counter"]),
        format!("5{FROM_SERVER}")
    );
}

#[test]
fn one_shot_clients_at_the_default_threshold_and_interval_make_a_key_hot() {
    // The defaults (16 misses, a 100 ms interval, a 1 s hot window), as docs/cache.md runs
    // it: each `pmnet client get` is a process and a session of its own, a few dozen a second.
    let cluster = Cluster::start_with_device_options(&[
        "--cache",
        // Every client here is new: nothing sent before the device started can come back.
        "--cache-fetch-warmup-ms",
        "0",
    ]);
    assert!(client(&cluster, &["set", "greeting", "hello"]).starts_with("OK"));
    let inserts = |cluster: &Cluster| {
        cluster
            .device
            .as_ref()
            .expect("the device runs")
            .metric("pmnet_cache_inserts_total", "")
            .unwrap_or(0.0)
    };
    let mut reads = 0;
    while inserts(&cluster) == 0.0 {
        assert!(
            reads < 62,
            "62 one-shot reads and the key was never inserted"
        );
        assert_eq!(value(&client(&cluster, &["get", "greeting"])), "hello");
        reads += 1;
    }
    assert_eq!(
        client(&cluster, &["get", "greeting"]),
        format!("hello{FROM_CACHE}"),
        "inserted after {reads} one-shot reads"
    );
}

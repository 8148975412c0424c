//! One device running several functions at once, as a user starts it: the read cache, a chain
//! store's member and the log in one `pmnet device` (docs/architecture.md, "The pipeline").
//! Writes through the log are acknowledged and applied by the server, a hot key is served by
//! the device's cache, and the same device answers the chain store's `pmnet kv` — each
//! function takes its own datagrams and passes the others on.

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

fn kv(cluster: &Cluster, words: &[&str]) -> String {
    let member = cluster.device_addr.to_string();
    let mut all = vec!["kv", "--timeout-ms", "3000", "--member", member.as_str()];
    all.extend_from_slice(words);
    let (status, stdout, stderr) = run_pmnet(&args(&all), None);
    assert!(status.success(), "{words:?}: {stdout}\n{stderr}");
    stdout.trim().to_owned()
}

fn metric(cluster: &Cluster, name: &str) -> f64 {
    cluster
        .device
        .as_ref()
        .expect("the device runs")
        .metric(name, "")
        .unwrap_or(0.0)
}

#[test]
fn one_device_runs_the_cache_a_chain_member_and_the_log_at_once() {
    let mut cluster = Cluster::start_with_device_options(&[
        "--cache",
        "--cache-hot-threshold",
        "1",
        "--cache-interval-ms",
        "1",
        "--cache-fetch-warmup-ms",
        "0",
    ]);
    // The same device as the only member of a chain store, its table beside its log.
    cluster.stop_device();
    let member = cluster.device_addr.to_string();
    let table = cluster.dir.path().join("chain.table").display().to_string();
    cluster.device_extra.extend([
        "--chain-member".to_owned(),
        member,
        "--chain-table".to_owned(),
        table,
        "--chain-keys".to_owned(),
        "1000".to_owned(),
    ]);
    cluster.start_device();
    let banner = cluster.device.as_ref().unwrap().banner.join("\n");
    assert!(banner.contains("cache: on"), "{banner}");
    assert!(banner.contains("chain store: member"), "{banner}");
    assert!(banner.contains("  log: "), "{banner}");

    // The log: a write acknowledged, and applied by the server.
    assert!(client(&cluster, &["set", "greeting", "hello"]).starts_with("OK"));
    // The cache: the key turns hot and the device answers it.
    let mut served = false;
    for _ in 0..50 {
        let line = client(&cluster, &["get", "greeting"]);
        assert!(line.starts_with("hello (from "), "{line}");
        if metric(&cluster, "pmnet_cache_hits_total") > 0.0 {
            served = true;
            break;
        }
    }
    assert!(served, "the device's cache never served the hot key");
    // The chain member: its own store, on the same address.
    assert!(kv(&cluster, &["put", "leader", "alice"]).starts_with("OK (version 1)"));
    assert_eq!(kv(&cluster, &["get", "leader"]), "alice");
    // Neither function took the other's datagrams: the chain's key is not the log's.
    assert_eq!(
        client(&cluster, &["get", "leader"]),
        "(not found) (from server 1)"
    );
    assert_eq!(kv(&cluster, &["get", "greeting"]), "(nil)");
    // A write after the cache served the key: the next read has the new value.
    assert!(client(&cluster, &["set", "greeting", "bonjour"]).starts_with("OK"));
    let line = client(&cluster, &["get", "greeting"]);
    assert!(line.starts_with("bonjour (from "), "{line}");
    let applied = cluster
        .server()
        .metric("pmnet_server_requests_applied_total", "");
    assert!(
        applied.as_ref().is_ok_and(|count| *count >= 2.0),
        "{applied:?}"
    );
}

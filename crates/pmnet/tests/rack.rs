//! The storage rack the read cache is measured against: servers of an emulated capacity
//! (`pmnet server --max-ops-per-s`) and `pmnet bench --servers`, with real processes.
//!
//! Nothing here depends on speed: the tests check what was applied and what was said, never
//! how fast.

mod common;

use common::{args, device_args, free_udp_addr, run_pmnet, server_args, Node};
use pmnet_proto::{ClientEvent, Completion};
use pmnet_store::{Reply, Request};

/// Run `pmnet ARGS`, which must fail with a message containing every one of `hints`.
fn must_fail(list: &[&str], hints: &[&str]) {
    let (status, stdout, stderr) = run_pmnet(&args(list), None);
    let shown = format!("pmnet {}", list.join(" "));
    assert!(!status.success(), "{shown} succeeded\n{stdout}\n{stderr}");
    assert!(!stderr.contains("panicked"), "{shown} panicked:\n{stderr}");
    for hint in hints {
        assert!(stderr.contains(hint), "{shown}: no {hint:?} in:\n{stderr}");
    }
}

#[test]
fn a_server_of_limited_capacity_applies_every_acked_update() {
    let dir = tempfile::tempdir().unwrap();
    let device_addr = free_udp_addr();
    let mut server_list = server_args(
        "127.0.0.1:0".parse().unwrap(),
        device_addr,
        &dir.path().join("server.data"),
        None,
    );
    server_list.extend(args(&["--max-ops-per-s", "200"]));
    let server = Node::start("server", server_list);
    assert!(
        server.banner.iter().any(|line| line
            .contains("capacity: at most 200 requests/s (emulated, as NetCache's evaluation")),
        "{:?}",
        server.banner
    );
    let device = Node::start(
        "device",
        device_args(device_addr, server.addr, &dir.path().join("device.log")),
    );

    // 300 updates, 32 in flight: more than the server takes in a second and a half, so most
    // of them wait in its socket for tokens while the device has acked them.
    let mut options = pmnet_runtime::SessionOptions::new(1, device.addr);
    options.window = Some(32);
    let mut session = pmnet_runtime::ClientSession::open(options).expect("a session");
    let count = 300u32;
    let mut next = 0u32;
    let mut completed = 0u32;
    while completed < count {
        while next < count && session.can_send() {
            let request = Request::Set {
                key: format!("key{next}").as_bytes(),
                value: format!("value{next}").as_bytes(),
            }
            .to_bytes();
            session.start_update(&request).expect("the update starts");
            next += 1;
        }
        match session.next_event(None) {
            Some(ClientEvent::Completed { completion, .. }) => {
                assert!(
                    matches!(completion, Completion::Logged { .. }),
                    "{completion:?}"
                );
                completed += 1;
            }
            Some(ClientEvent::Failed { seq, error, .. }) => panic!("update {seq}: {error}"),
            None => {}
        }
    }
    // A read on the same session is applied after every update of it: it waits for the
    // limited server to take them all.
    let read = Request::Get {
        key: format!("key{}", count - 1).as_bytes(),
    }
    .to_bytes();
    match session.bypass(&read).expect("the read completes") {
        Completion::Replied { reply, .. } => assert_eq!(
            Reply::decode(&reply).unwrap(),
            Reply::Value(format!("value{}", count - 1).into_bytes())
        ),
        other => panic!("{other:?}"),
    }
    device.wait_metric(
        "pmnet_device_log_live_entries",
        "",
        "to drop to 0 (the server acked everything)",
        |value| value == 0.0,
    );
    server.wait_metric(
        "pmnet_server_capacity_max_ops_per_s",
        "",
        "to say the capacity",
        |value| value == 200.0,
    );
    let mut server = server;
    server.proc.stop();
    common::assert_no_panic(&server.proc);
    assert!(
        server.proc.stderr().contains("(emulated"),
        "the last report line says the capacity is emulated:\n{}",
        server.proc.stderr()
    );
    let store = common::StoredData::open(&dir.path().join("server.data"));
    for index in 0..count {
        assert_eq!(
            store.get(format!("key{index}").as_bytes()),
            Some(format!("value{index}").into_bytes()),
            "key{index}"
        );
    }
    // Every update and the read applied once: the session's record ends at count + 1.
    let record = store
        .sessions()
        .into_iter()
        .find(|record| record.session_id == session.session_id())
        .expect("the session's record");
    assert_eq!(record.last_seq, count + 1);
}

#[test]
fn capacities_out_of_range_are_refused() {
    must_fail(
        &["server", "--max-ops-per-s", "0"],
        &["out of range", "1 to 100000000"],
    );
    must_fail(
        &["server", "--max-ops-per-s", "1000000000000"],
        &["out of range"],
    );
    must_fail(
        &["server", "--max-ops-per-s", "fast"],
        &["not a whole number"],
    );
}

#[test]
fn a_rack_bench_reports_each_second_and_the_busiest_servers_share() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("rack.json");
    let list = [
        "bench",
        "--mode",
        "pmnet",
        "--servers",
        "3",
        "--server-max-ops-per-s",
        "1000",
        "--dist",
        "zipf:0.99",
        "--keys",
        "1000",
        "--popularity",
        "hot-in",
        "--change-every",
        "0.5",
        "--change-count",
        "10",
        "--duration",
        "2",
        "--warmup",
        "0.2",
        "--data-mib",
        "4",
        "--slots",
        "1024",
        "--pin",
        "none",
        "--no-progress",
        "--seed",
        "5",
        "--dir",
        dir.path().to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
    ];
    let (status, stdout, stderr) = run_pmnet(&args(&list), None);
    assert!(status.success(), "{stdout}\n{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        stdout.contains("capacity: at most 1000 requests/s (emulated"),
        "{stdout}"
    );
    assert!(stdout.contains("a line per second"), "{stdout}");
    assert!(stdout.contains("busiest server: "), "{stdout}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let result = &report["results"][0];
    assert_eq!(result["servers"], 3);
    assert_eq!(result["server_max_ops_per_s"], 1000);
    assert!(!result["per_second"].as_array().unwrap().is_empty());
    let shares: Vec<f64> = result["server_shares"]
        .as_array()
        .unwrap()
        .iter()
        .map(|share| share.as_f64().unwrap())
        .collect();
    assert_eq!(shares.len(), 3);
    assert!(
        (shares.iter().sum::<f64>() - 1.0).abs() < 1e-3,
        "{shares:?}"
    );
    let busiest = result["busiest_server_share"].as_f64().unwrap();
    assert!(shares.iter().all(|share| *share <= busiest));
    assert!(result["popularity_changes"].as_u64().unwrap() >= 1);
    assert_eq!(report["setting"]["popularity"], "hot-in");
    assert!(report["setting"]["rack"]
        .as_str()
        .unwrap()
        .contains("(emulated"));
    // Nothing left behind in the directory of the log and store files.
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .map(|entry| entry.file_name())
        .filter(|name| name != "rack.json")
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn the_rack_bench_runs_the_cache_on_and_off_and_every_read_names_a_write() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("cache.json");
    // A skewed mix with writes: the hottest keys are read hundreds of times, so the device's
    // controller admits them, and writes keep changing the values it serves. The run is
    // bounded by a request count, not by time.
    let list = [
        "bench",
        "--mode",
        "pmnet",
        "--cache",
        "on,off",
        "--servers",
        "3",
        "--dist",
        "zipf:0.99",
        "--keys",
        "1000",
        "--update-ratio",
        "0.3",
        "--requests",
        "20000",
        "--warmup",
        "0.2",
        "--cache-items",
        "100",
        "--data-mib",
        "4",
        "--slots",
        "1024",
        "--pin",
        "none",
        "--no-progress",
        "--seed",
        "11",
        "--dir",
        dir.path().to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
    ];
    let (status, stdout, stderr) = run_pmnet(&args(&list), None);
    assert!(status.success(), "{stdout}\n{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        stdout.contains("read cache in the device: on, then off"),
        "{stdout}"
    );
    assert!(
        stdout.contains("pmnet+cache / pmnet: throughput"),
        "{stdout}"
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let results = report["results"].as_array().unwrap();
    assert_eq!(results.len(), 2, "{results:?}");
    let (on, off) = (&results[0], &results[1]);
    assert_eq!(on["mode"], "pmnet+cache");
    assert_eq!(off["mode"], "pmnet");
    assert!(off["cache"].is_null(), "{off}");
    let cache = &on["cache"];
    let hit_ratio = cache["hit_ratio"].as_f64().unwrap();
    assert!(hit_ratio > 0.0 && hit_ratio <= 1.0, "{cache}");
    assert!(cache["inserts"].as_u64().unwrap() >= 1, "{cache}");
    let items = cache["items"].as_u64().unwrap();
    assert!((1..=100).contains(&items), "{cache}");
    assert!(cache["evictions"].as_u64().is_some(), "{cache}");
    // Reads the device answered are counted on their own, and are the hits.
    let by_device = on["reads_by_device"]["count"].as_u64().unwrap();
    assert_eq!(cache["reads_served_by_device"].as_u64().unwrap(), by_device);
    // Every read, through the cache or not, returned "not found" or a value whose stamp
    // names a write to that key that a client drew: no value out of nowhere.
    for result in [on, off] {
        assert!(result["reads_checked"].as_u64().unwrap() > 1000, "{result}");
        assert_eq!(result["reads_unexplained"], 0, "{result}");
        assert_eq!(result["failed"], 0, "{result}");
    }
    assert!(report["cache_comparisons"][0]["ideal_gain"].is_number());
}

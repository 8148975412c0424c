//! `pmnet bench --servers` as a user runs it: a rack of servers of an emulated capacity
//! behind the device, each second reported, the read cache on and off, every read naming a
//! write.
//!
//! Nothing here depends on speed: the tests check what was applied and what was said, never
//! how fast.

mod common;

use common::{args, run_bench};

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
    let (status, stdout, stderr) = run_bench(&args(&list), None);
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
    let (status, stdout, stderr) = run_bench(&args(&list), None);
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

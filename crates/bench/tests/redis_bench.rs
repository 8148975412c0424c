//! `pmnet redis-bench` as a user runs it: every workload on the baseline (redis-server with
//! `appendfsync always`) and on PMNet (`pmnet redis-up` in front of such a Redis, the PMNet
//! module loaded into it), both started and stopped by the command; every figure in the JSON,
//! the checks passed (the TPC-C-like districts' order ids dense, the keys read through the
//! gateway equal to Redis's), nothing left behind. Needs `redis-server` (apt-get install redis-server); skipped without it.
//! Nothing here asserts a speed.

mod common;

use std::path::Path;
use std::process::Command;

use common::{bench_bin, pmnet_bin};

const WORKLOADS: [&str; 5] = ["ycsb-a", "ycsb-b", "ycsb-f", "twitter", "tpcc"];

fn redis_installed() -> bool {
    Command::new("redis-server")
        .arg("--version")
        .output()
        .is_ok_and(|output| output.status.success())
}

/// The benchmark's directories left in `dir`.
fn left_in(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("pmnet-"))
        .collect()
}

fn number(value: &serde_json::Value, what: &str) -> f64 {
    value
        .as_f64()
        .unwrap_or_else(|| panic!("{what} is not a number: {value}"))
}

#[test]
fn every_workload_runs_on_both_systems_and_its_checks_pass() {
    if !redis_installed() {
        eprintln!("skipped: redis-server is not installed (apt-get install redis-server)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("out.json");
    pmnet_bin();
    let output = Command::new(bench_bin())
        .args([
            "redis-bench",
            "--duration",
            "1",
            "--warmup",
            "0.3",
            "--clients",
            "2",
            "--records",
            "200",
            "--no-progress",
        ])
        .arg("--dir")
        .arg(dir.path())
        .arg("--json")
        .arg(&json)
        .output()
        .expect("run pmnet");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "pmnet redis-bench failed ({})\nstdout:\n{stdout}\nstderr:\n{stderr}",
        output.status
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("the JSON file"))
            .expect("valid JSON");
    let setting = &report["setting"];
    assert_eq!(setting["clients"], 2);
    assert!(setting["seed"].is_u64());
    assert!(setting["redis_media"]
        .as_str()
        .unwrap()
        .contains("appendfsync always"));
    assert!(setting["pmnet_device_media"].is_string(), "{setting}");
    // The module is the server side by default (`cargo build -p pmnet` puts it beside pmnet).
    assert_eq!(setting["pmnet_server_side"], "module", "{setting}");
    assert!(setting["pmnet_server_side_said"]
        .as_str()
        .unwrap()
        .starts_with("the PMNet module"));
    assert!(setting["pmnet_server_side_note"].is_null(), "{setting}");
    let workloads = report["workloads"].as_array().expect("workloads");
    assert_eq!(workloads.len(), WORKLOADS.len(), "{workloads:?}");
    for (workload, name) in workloads.iter().zip(WORKLOADS) {
        assert_eq!(workload["workload"], name);
        let systems = workload["systems"].as_array().expect("systems");
        let names: Vec<&str> = systems
            .iter()
            .map(|s| s["system"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["baseline", "pmnet"], "{name}");
        for system in systems {
            let what = format!("{name} {}", system["system"]);
            assert!(
                number(&system["ops_per_s"], &what) > 0.0,
                "{what}: {system}"
            );
            assert!(
                number(&system["update_ops_per_s"], &what) > 0.0,
                "{what}: {system}"
            );
            assert_eq!(system["errors"], 0, "{what}: {system}");
            // Every part's CPU time per operation (the module's is redis-server's own).
            let parts: Vec<&str> = system["cpu"]["parts"]
                .as_array()
                .unwrap_or_else(|| panic!("{what}: no cpu: {system}"))
                .iter()
                .map(|part| {
                    assert!(number(&part["us_per_op"], &what) >= 0.0, "{what}: {part}");
                    part["part"].as_str().unwrap()
                })
                .collect();
            let expected: &[&str] = if system["system"] == "pmnet" {
                &["clients", "gateway", "device", "redis-server"]
            } else {
                &["clients", "redis-server"]
            };
            assert_eq!(parts, expected, "{what}");
            assert!(
                number(&system["cpu"]["system_us_per_op"], &what) > 0.0,
                "{what}"
            );
            assert_eq!(system["check"]["passed"], true, "{what}: {system}");
            for part in ["all", "updates"] {
                for field in ["p50_us", "p99_us", "p999_us", "mean_us"] {
                    assert!(
                        number(&system[part][field], &what) > 0.0,
                        "{what} {part}.{field}"
                    );
                }
                assert!(system[part]["count"].as_u64().unwrap() > 0, "{what} {part}");
            }
        }
        for ratio in [
            "update_throughput_ratio",
            "update_p99_ratio",
            "throughput_ratio",
            "p99_ratio",
        ] {
            assert!(number(&workload[ratio], ratio) > 0.0, "{name} {ratio}");
        }
        assert_eq!(workload["invariants_hold"], true, "{name}");
        let agreement = &workload["gateway_agreement"];
        assert!(
            agreement["keys"].as_u64().unwrap() > 0,
            "{name}: {agreement}"
        );
        assert_eq!(
            agreement["agreed"], agreement["keys"],
            "{name}: {agreement}"
        );
    }
    let tpcc = &workloads[4];
    let share = number(&tpcc["bypass_share"], "tpcc bypass_share");
    assert!(share > 0.0 && share < 1.0, "{share}");
    let pmnet = &tpcc["systems"][1];
    assert!(
        pmnet["counters"]["new_orders"].as_u64().unwrap() > 0,
        "{pmnet}"
    );
    assert!(
        pmnet["gateway_commands"]["bypass"].as_u64().unwrap() > 0,
        "{pmnet}"
    );
    assert!(pmnet["check"]["details"]
        .as_array()
        .unwrap()
        .iter()
        .any(|line| line.as_str().unwrap().contains("order ids dense")));
    for average in ["update_throughput_ratio", "update_p99_ratio"] {
        assert!(number(&report["averages"][average], average) > 0.0);
    }
    assert!(stdout.contains("pmnet/baseline"), "{stdout}");
    assert!(stdout.contains("CPU µs per operation"), "{stdout}");
    assert!(
        stdout.contains("Redis alone's CPU per operation"),
        "{stdout}"
    );
    assert!(stdout.contains("pmnet server side: module"), "{stdout}");
    assert_eq!(left_in(dir.path()), Vec::<String>::new());
}

#[test]
fn a_missing_redis_server_is_named_with_how_to_install_it() {
    pmnet_bin();
    let output = Command::new(bench_bin())
        .args([
            "redis-bench",
            "--redis-server",
            "/nonexistent/redis-server",
            "--duration",
            "1",
        ])
        .output()
        .expect("run pmnet");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("apt-get install redis-server"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

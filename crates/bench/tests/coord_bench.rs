//! `pmnet coord-bench` as a user runs it: the chain store, real etcd and real ZooKeeper
//! ensembles started and stopped by the benchmark (needs Debian's `etcd-server` and
//! `zookeeperd`; scripts/test.sh installs them), every (system, op, clients) measured and in
//! the JSON; `--read-scaling` measuring reads at the tail and at any member. Nothing here
//! asserts a speed: only that each result exists and is consistent.

mod common;

use std::path::Path;

use common::{args, nothing_left_in, run_bench};

/// Run `pmnet coord-bench ARGS --json FILE` to its end; the JSON.
fn coord_bench(list: &[&str], dir: &Path) -> serde_json::Value {
    let json = dir.join("out.json");
    let json_text = json.display().to_string();
    let mut all = vec!["coord-bench"];
    all.extend(list);
    all.extend(["--json", &json_text]);
    let (status, stdout, stderr) = run_bench(&args(&all), None);
    assert!(
        status.success(),
        "pmnet {all:?} failed ({status})\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    let text = std::fs::read_to_string(&json).expect("the JSON file");
    serde_json::from_str(&text).expect("valid JSON")
}

#[test]
fn every_system_op_and_client_count_is_measured_side_by_side() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let data_text = data.display().to_string();
    let json = coord_bench(
        &[
            "--duration",
            "0.3",
            "--warmup",
            "0.1",
            "--keys",
            "20",
            "--netchain-dir",
            &data_text,
            "--data-dir",
            &data_text,
        ],
        dir.path(),
    );
    let results = json["results"].as_array().expect("results");
    for system in ["netchain", "etcd", "zookeeper"] {
        for op in ["read", "write", "lock"] {
            for clients in [1, 16] {
                let matching: Vec<&serde_json::Value> = results
                    .iter()
                    .filter(|row| {
                        row["system"] == system && row["op"] == op && row["clients"] == clients
                    })
                    .collect();
                assert_eq!(matching.len(), 1, "{system} {op} {clients}: {results:?}");
                let row = matching[0];
                let ops_per_s = row["ops_per_s"].as_f64().unwrap();
                let (p50, p99) = (
                    row["p50_us"].as_f64().unwrap(),
                    row["p99_us"].as_f64().unwrap(),
                );
                assert!(ops_per_s > 0.0, "{row}");
                assert!(0.0 < p50 && p50 <= p99, "{row}");
            }
        }
    }
    assert_eq!(results.len(), 18);
    // etcd and ZooKeeper each against the chain store, for every op and client count.
    assert_eq!(json["ratios"].as_array().unwrap().len(), 12);
    let durability = &json["setting"]["durability"];
    assert!(durability["netchain"]
        .as_str()
        .unwrap()
        .contains("emulated-pm"));
    assert!(durability["etcd"].as_str().unwrap().contains("fsync"));
    assert!(durability["zookeeper"]
        .as_str()
        .unwrap()
        .contains("forceSync=yes"));
    assert!(json["setting"]["seed"].as_u64().is_some());
    assert_eq!(json["interrupted"], false);
    nothing_left_in(&data);
}

#[test]
fn read_scaling_measures_reads_at_the_tail_and_at_any_member() {
    let dir = tempfile::tempdir().unwrap();
    let shm = dir.path().display().to_string();
    let json = coord_bench(
        &[
            "--read-scaling",
            "--duration",
            "0.3",
            "--warmup",
            "0.1",
            "--keys",
            "50",
            "--clients",
            "4",
            "--member-max-ops-per-s",
            "1000",
            "--netchain-dir",
            &shm,
        ],
        dir.path(),
    );
    let results = json["results"].as_array().expect("results");
    assert_eq!(results.len(), 2, "{results:?}");
    for (row, reads_from) in results.iter().zip(["tail", "any-member"]) {
        assert_eq!(row["system"], "netchain");
        assert_eq!(row["reads_from"], reads_from);
        assert_eq!(row["clients"], 4);
        let ops_per_s = row["ops_per_s"].as_f64().unwrap();
        let (p50, p99) = (
            row["p50_us"].as_f64().unwrap(),
            row["p99_us"].as_f64().unwrap(),
        );
        assert!(ops_per_s > 0.0 && p50 <= p99, "{row}");
        let shares = row["member_request_shares"].as_array().unwrap();
        assert_eq!(shares.len(), 3, "{row}");
    }
    let scaling = &json["read_scaling"];
    assert_eq!(scaling["groups"], 1);
    assert_eq!(scaling["member_max_ops_per_s"], 1000);
    assert!(scaling["ratio"].as_f64().unwrap() > 0.0, "{scaling}");
    assert_eq!(scaling["target"], 2.5);
    nothing_left_in(dir.path());
}

#[test]
fn a_missing_etcd_is_reported_with_how_to_install_it_and_nothing_is_left() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().display().to_string();
    let (status, _, stderr) = run_bench(
        &args(&[
            "coord-bench",
            "--system",
            "etcd",
            "--etcd",
            "/nonexistent/etcd",
            "--data-dir",
            &data,
        ]),
        None,
    );
    assert!(!status.success());
    assert!(
        stderr.contains("apt-get install etcd-server"),
        "stderr:\n{stderr}"
    );
    nothing_left_in(dir.path());
}

/// A member limited to 1 request per second: of a burst of 40 requests, the member takes
/// one (its bucket's depth) and holds the rest back, counted; the other members hold
/// nothing back.
#[test]
fn failover_kills_a_member_under_load_and_the_spare_joins_every_group() {
    let dir = tempfile::tempdir().unwrap();
    let shm = dir.path().display().to_string();
    let json = coord_bench(
        &[
            "--failover",
            "--duration",
            "0.5",
            "--warmup",
            "0.3",
            "--keys",
            "64",
            "--clients",
            "4",
            "--groups",
            "4",
            "--netchain-dir",
            &shm,
        ],
        dir.path(),
    );
    let failover = &json["failover"];
    assert_eq!(failover["system"], "netchain");
    assert_eq!(failover["clients"], 4);
    assert_eq!(failover["groups"], 4);
    // Writes went on before the kill and resumed after it (how fast is the benchmark's to
    // say, not this test's), and the spare joined every group.
    assert!(
        failover["ops_per_s_before"].as_f64().unwrap() > 0.0,
        "{failover}"
    );
    assert!(
        failover["failover_ms"].as_f64().unwrap().is_finite(),
        "{failover}"
    );
    assert!(
        failover["recovery_ms"].as_f64().unwrap() > 0.0,
        "{failover}"
    );
    nothing_left_in(dir.path());
}

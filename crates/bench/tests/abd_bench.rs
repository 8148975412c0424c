//! `pmnet bench --abd` as a user runs it, briefly: one memory node through a device, three
//! with the quorum in the clients and in a device, a real etcd ensemble (Debian's
//! `etcd-server`, which scripts/test.sh installs; without it etcd is left out and said so),
//! and the device with a memory node SIGKILLed. Every (system, op, clients) is in the JSON and
//! parses; the setting names the medium and etcd's durability; nothing is left behind.
//! Nothing here asserts a speed.

mod common;

use common::{args, nothing_left_in, run_bench};

/// Whether `etcd` is on the PATH.
fn etcd_installed() -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join("etcd").is_file()))
}

#[test]
fn every_system_and_op_of_replicated_memory_is_measured_side_by_side() {
    let dir = tempfile::tempdir().unwrap();
    let files = dir.path().join("files");
    std::fs::create_dir(&files).unwrap();
    let files_text = files.display().to_string();
    let json = dir.path().join("abd.json");
    let json_text = json.display().to_string();
    let with_etcd = etcd_installed();
    let systems = if with_etcd {
        "unreplicated,client-abd,device-abd,etcd,device-abd-killed"
    } else {
        eprintln!("etcd is not installed (apt-get install etcd-server): measuring without it");
        "unreplicated,client-abd,device-abd,device-abd-killed"
    };
    let list = [
        "bench",
        "--abd",
        "--abd-system",
        systems,
        "--duration",
        "0.3",
        "--warmup",
        "0.1",
        "--rounds",
        "1",
        "--keys",
        "64",
        "--clients",
        "4",
        "--dir",
        &files_text,
        "--etcd-data-dir",
        &files_text,
        "--json",
        &json_text,
    ];
    let (status, stdout, stderr) = run_bench(&args(&list), None);
    assert!(
        status.success(),
        "pmnet {list:?} failed ({status})\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).expect("valid JSON");
    let results = report["results"].as_array().expect("results");
    let mut expected: Vec<(&str, u64)> = Vec::new();
    for system in ["unreplicated", "client-abd", "device-abd", "etcd"] {
        if system != "etcd" || with_etcd {
            expected.extend([(system, 1), (system, 4)]);
        }
    }
    expected.push(("device-abd-killed", 4));
    for (system, clients) in &expected {
        for op in ["read", "write"] {
            let matching: Vec<&serde_json::Value> = results
                .iter()
                .filter(|row| {
                    row["system"] == *system && row["op"] == op && row["clients"] == *clients
                })
                .collect();
            assert_eq!(matching.len(), 1, "{system} {op} {clients}: {results:?}");
            let row = matching[0];
            let (p50, p99, ops_per_s) = (
                row["p50_us"].as_f64().unwrap(),
                row["p99_us"].as_f64().unwrap(),
                row["ops_per_s"].as_f64().unwrap(),
            );
            assert!(0.0 < p50 && p50 <= p99, "{row}");
            assert!(ops_per_s > 0.0, "{row}");
            assert!(row["cpu_us_per_op"]["servers"].as_f64().is_some(), "{row}");
            if *system != "etcd" && *system != "client-abd" {
                assert_eq!(row["device_per_op"]["failed"], 0.0, "{row}");
            }
        }
    }
    assert_eq!(results.len(), expected.len() * 2, "{results:?}");
    // The targets' ratios, each with its verdict.
    let ratios = report["ratios"].as_array().expect("ratios");
    let targeted = ratios
        .iter()
        .filter(|ratio| ratio["target"].is_f64())
        .count();
    assert_eq!(targeted, if with_etcd { 8 } else { 4 }, "{ratios:?}");
    for ratio in ratios {
        assert!(ratio["value"].as_f64().unwrap() > 0.0, "{ratio}");
    }
    let setting = &report["setting"];
    assert!(
        setting["memory_node_medium"]
            .as_str()
            .unwrap()
            .contains("emulated-pm"),
        "{setting}"
    );
    if with_etcd {
        assert!(
            setting["etcd"].as_str().unwrap().contains("fsync"),
            "{setting}"
        );
    }
    assert!(setting["placement"].as_str().is_some(), "{setting}");
    assert_eq!(setting["lines"], 64);
    assert!(setting["seed"].as_u64().is_some());
    assert_eq!(report["interrupted"], false);
    assert!(stdout.contains("device-abd, 1 of 3 killed"), "{stdout}");
    nothing_left_in(&files);
}

#[test]
fn abd_options_that_do_not_fit_are_refused() {
    let (status, _, stderr) = run_bench(&args(&["bench", "--abd", "--replicas", "2"]), None);
    assert!(!status.success());
    assert!(stderr.contains("does not go with --replicas"), "{stderr}");
}

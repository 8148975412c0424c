//! `pmnet bench --in-path` as a user runs it, briefly: it builds a testbed of its own, starts
//! the server and the devices on their hosts, and measures every part side by side. Every
//! result is in the JSON with sane numbers (positive and finite where measured), every ratio
//! against its target, the setting names the medium and the datapath, and nothing is left
//! behind: no testbed, no files. Nothing here asserts a speed.
//!
//! Needs root and XDP on veth; where either is missing the test says so and passes without
//! running.

mod common;

use common::{args, run_bench};
use serde_json::Value;

/// Every result the run must report: (part, system, op, wait).
const EXPECTED: [(&str, &str, &str, &str); 12] = [
    ("forwarding", "kernel", "udp-flow", "blocking"),
    ("forwarding", "kernel", "tcp-bulk", "blocking"),
    ("load", "baseline", "update", "blocking"),
    ("forwarding", "in-path", "udp-flow", "blocking"),
    ("forwarding", "in-path", "tcp-bulk", "blocking"),
    ("load", "in-path", "update", "blocking"),
    ("latency", "echo", "echo", "blocking"),
    ("latency", "in-path", "update", "blocking"),
    ("capacity", "in-path", "update", "blocking"),
    ("latency", "echo", "echo", "busy-poll"),
    ("latency", "in-path", "update", "busy-poll"),
    ("capacity", "proxy-udp", "update", "blocking"),
];

fn positive(value: &Value, what: &str) -> f64 {
    let number = value
        .as_f64()
        .unwrap_or_else(|| panic!("{what} is not a number: {value}"));
    assert!(
        number.is_finite() && number > 0.0,
        "{what} = {number}: not positive and finite"
    );
    number
}

fn non_negative(value: &Value, what: &str) -> f64 {
    let number = value
        .as_f64()
        .unwrap_or_else(|| panic!("{what} is not a number: {value}"));
    assert!(
        number.is_finite() && number >= 0.0,
        "{what} = {number}: negative or not finite"
    );
    number
}

#[test]
fn every_part_of_the_in_path_comparison_is_measured_and_reported() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIP: pmnet bench --in-path builds network namespaces: it needs root");
        return;
    }
    if let Err(why) = pmnet_runtime::xdp_available() {
        eprintln!("SKIP: the AF_XDP datapath cannot run here: {why}");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let files = dir.path().join("files");
    std::fs::create_dir(&files).unwrap();
    let files_text = files.display().to_string();
    let json = dir.path().join("inpath.json");
    let json_text = json.display().to_string();
    let list = [
        "bench",
        "--in-path",
        "--duration",
        "0.3",
        "--warmup",
        "0.1",
        "--dir",
        &files_text,
        // 1000 keys fit a 16 MiB store (8000 slots) many times over.
        "--keys",
        "1000",
        "--data-mib",
        "16",
        "--slots",
        "4096",
        "--json",
        &json_text,
    ];
    let (status, stdout, stderr) = run_bench(&args(&list), None);
    assert!(
        status.success(),
        "pmnet {list:?} failed ({status})\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");

    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).expect("valid JSON");
    assert_eq!(report["interrupted"], false);
    let results = report["results"].as_array().expect("results");
    assert_eq!(results.len(), EXPECTED.len(), "{results:#?}");
    for (part, system, op, wait) in EXPECTED {
        let what = format!("{part} {system} {op} {wait}");
        let record = results
            .iter()
            .find(|r| {
                r["part"] == part && r["system"] == system && r["op"] == op && r["wait"] == wait
            })
            .unwrap_or_else(|| panic!("no result for {what}: {results:#?}"));
        positive(&record["count"], &format!("{what}: count"));
        positive(&record["seconds"], &format!("{what}: seconds"));
        let cpu = &record["cpu_us_per_op"];
        positive(&cpu["machine"], &format!("{what}: machine CPU per op"));
        non_negative(&cpu["bench"], &format!("{what}: bench CPU per op"));
        non_negative(&cpu["ksoftirqd"], &format!("{what}: ksoftirqd CPU per op"));
        non_negative(&record["others_cpus"], &format!("{what}: others' CPUs"));
        if op == "tcp-bulk" {
            positive(&record["mb_per_s"], &format!("{what}: MB/s"));
            assert!(record["ops_per_s"].is_null(), "{what}: {record}");
        } else {
            positive(&record["ops_per_s"], &format!("{what}: ops/s"));
        }
        if op == "udp-flow" {
            let loss = non_negative(&record["loss"], &format!("{what}: loss"));
            assert!(loss < 1.0, "{what}: everything lost");
        }
        if matches!(op, "update" | "echo") {
            let p50 = positive(&record["p50_us"], &format!("{what}: p50"));
            let p99 = positive(&record["p99_us"], &format!("{what}: p99"));
            assert!(p50 <= p99, "{what}: p50 {p50} above p99 {p99}");
            assert_eq!(record["failed"], 0, "{what}: {record}");
        }
        // The device's and the server's CPU is read where they run.
        let device_runs = system != "kernel" && system != "baseline";
        if device_runs {
            non_negative(&cpu["device"], &format!("{what}: device CPU per op"));
        } else {
            assert!(cpu["device"].is_null(), "{what}: no device runs: {record}");
        }
        if matches!(op, "update") {
            positive(&cpu["server"], &format!("{what}: server CPU per op"));
        }
    }

    // Every ratio against its target.
    let ratios = report["ratios"].as_array().expect("ratios");
    assert_eq!(ratios.len(), 8, "{ratios:#?}");
    for ratio in ratios {
        let what = format!("{} {} {}", ratio["part"], ratio["measure"], ratio["wait"]);
        positive(&ratio["value"], &what);
        positive(&ratio["target"], &what);
        assert!(ratio["met"].is_boolean(), "{what}: {ratio}");
    }

    // The setting says what was measured on.
    let setting = &report["setting"];
    for key in [
        "device_medium",
        "server_medium",
        "datapath",
        "waits",
        "machine",
    ] {
        assert!(
            setting[key].as_str().is_some_and(|text| !text.is_empty()),
            "setting.{key}: {setting}"
        );
    }
    assert!(
        setting["datapath"].as_str().unwrap().contains("AF_XDP"),
        "{setting}"
    );
    assert!(
        setting["commands"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c.as_str().unwrap().contains("--xdp cl,sv --in-path")),
        "{setting}"
    );
    // A report line of each device run (three: in path blocking, busy-polling, proxy).
    assert_eq!(
        setting["device_reports"].as_array().unwrap().len(),
        3,
        "{setting}"
    );
    for text in ["forwarding", "capacity", "latency", "load", "target"] {
        assert!(
            stdout.contains(text),
            "no {text:?} in the output:\n{stdout}"
        );
    }

    // Nothing left behind: the run's testbed is down, its files are gone.
    let name = stdout
        .split_whitespace()
        .skip_while(|word| *word != "testbed")
        .nth(1)
        .map(|word| word.trim_end_matches(';').to_owned())
        .unwrap_or_else(|| panic!("no testbed name in the output:\n{stdout}"));
    let namespaces = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()
        .unwrap();
    let namespaces = String::from_utf8_lossy(&namespaces.stdout);
    assert!(
        !namespaces
            .lines()
            .any(|line| line.starts_with(&format!("{name}-"))),
        "testbed {name} left up:\n{namespaces}"
    );
    let left: Vec<_> = std::fs::read_dir(&files).unwrap().flatten().collect();
    assert!(left.is_empty(), "left behind in {files_text}: {left:?}");
}

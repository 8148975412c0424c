//! `pmnet store-bench` as a user runs it: the write path's breakdown per engine, repeated
//! and summarised, and updates through a server with each engine, all in the JSON. Nothing
//! here asserts a speed.

mod common;

use common::{number, run_with_json};

/// The breakdown's rows: every step column a non-negative number, a positive total, one row
/// per engine and size.
fn check_breakdown_rows(report: &serde_json::Value, sizes: &[u64]) {
    let rows = report["breakdown"]["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 2 * sizes.len(), "{report:#}");
    for row in rows {
        assert!(
            ["conventional", "packet"].contains(&row["engine"].as_str().unwrap()),
            "{row:#}"
        );
        assert!(
            sizes.contains(&row["value_bytes"].as_u64().unwrap()),
            "{row:#}"
        );
        for step in [
            "prepare_ns",
            "checksum_ns",
            "copy_ns",
            "alloc_insert_ns",
            "persist_ns",
        ] {
            assert!(number(row, &[step]) >= 0.0, "{step} in {row:#}");
        }
        assert!(number(row, &["total_ns"]) > 0.0, "{row:#}");
        let parts = number(row, &["alloc_insert_parts", "allocation_ns"])
            + number(row, &["alloc_insert_parts", "insertion_ns"]);
        assert!(
            (parts - number(row, &["alloc_insert_ns"])).abs() < 1e-6,
            "{row:#}"
        );
        if row["engine"] == "packet" {
            // The packet store computes no checksum and copies nothing.
            assert_eq!(number(row, &["checksum_ns"]), 0.0, "{row:#}");
            assert_eq!(number(row, &["copy_ns"]), 0.0, "{row:#}");
        }
    }
}

#[test]
fn store_bench_repeats_the_breakdown_and_reports_its_spread() {
    let dir = tempfile::tempdir().unwrap();
    let (report, out) = run_with_json(
        &[
            "store-bench",
            "--no-server",
            "--sizes",
            "1024",
            "--writes",
            "200",
            "--keys",
            "20",
            "--breakdown-runs",
            "3",
            "--dir",
            &dir.path().display().to_string(),
        ],
        &dir,
    );
    for expected in [
        "checksum calculation",
        "medium:",
        "1024-byte share removed over 3 breakdown runs",
        "(the table above is the median run)",
        "target: the packet store removes >= 80 %",
        "median of the runs",
    ] {
        assert!(out.contains(expected), "missing {expected:?} in:\n{out}");
    }
    // --json: the same, with the setting.
    assert_eq!(report["setting"]["writes"], 200);
    assert_eq!(report["setting"]["keys"], 20);
    assert_eq!(report["setting"]["sizes"], serde_json::json!([1024]));
    assert_eq!(report["setting"]["no_server"], true);
    assert!(report["setting"]["medium"]
        .as_str()
        .unwrap()
        .contains("via"));
    let breakdown = &report["breakdown"];
    assert_eq!(breakdown["runs"], 3);
    assert_eq!(breakdown["judged_size"], 1024);
    let (min, median, max) = (
        number(breakdown, &["removed_share_min"]),
        number(breakdown, &["removed_share_median"]),
        number(breakdown, &["removed_share_max"]),
    );
    assert!(min <= median && median <= max, "{breakdown:#}");
    assert_eq!(breakdown["removed_shares"].as_array().unwrap().len(), 3);
    let printed = format!("median {:.1} %", median * 100.0);
    assert!(out.contains(&printed), "missing {printed:?} in:\n{out}");
    check_breakdown_rows(&report, &[1024]);
    assert_eq!(number(breakdown, &["paper_1k", "checksum_ns"]), 1770.0);
    // No servers: no engines, no throughput; the breakdown's target judged.
    assert_eq!(report["engines"], serde_json::json!([]));
    assert_eq!(number(&report, &["targets", "removed_share_target"]), 0.8);
    assert_eq!(number(&report, &["targets", "removed_share"]), median);
    assert!(report["targets"]["packet_vs_conventional_throughput"].is_null());
}

#[test]
fn store_bench_writes_the_servers_runs_as_json() {
    let dir = tempfile::tempdir().unwrap();
    let (report, out) = run_with_json(
        &[
            "store-bench",
            "--sizes",
            "64,1024",
            "--writes",
            "200",
            "--keys",
            "100",
            "--breakdown-runs",
            "1",
            "--seconds",
            "0.3",
            "--latency-requests",
            "100",
            "--rounds",
            "1",
            "--blocking",
            "--dir",
            &dir.path().display().to_string(),
        ],
        &dir,
    );
    assert!(
        out.contains("target: packet store update throughput"),
        "{out}"
    );
    assert_eq!(report["setting"]["rounds"], 1);
    assert_eq!(report["setting"]["blocking"], true);
    assert_eq!(report["setting"]["value_bytes"], 1024);
    check_breakdown_rows(&report, &[64, 1024]);
    let engines = report["engines"].as_array().expect("engines");
    let names: Vec<&str> = engines
        .iter()
        .map(|e| e["engine"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["conventional", "packet", "kv", "ideal"]);
    for engine in engines {
        assert!(number(engine, &["updates_per_s"]) > 0.0, "{engine:#}");
        assert_eq!(engine["rounds_updates_per_s"].as_array().unwrap().len(), 1);
        assert_eq!(engine["latency_samples"], 100);
        let (p50, p99) = (number(engine, &["p50_us"]), number(engine, &["p99_us"]));
        assert!(p50 > 0.0 && p50 <= p99, "{engine:#}");
        assert!(number(engine, &["mean_us"]) > 0.0, "{engine:#}");
        assert!(
            engine["server_cpu_us_per_update"].is_null()
                || number(engine, &["server_cpu_us_per_update"]) > 0.0,
            "{engine:#}"
        );
    }
    let throughput = |name: &str| {
        number(
            engines.iter().find(|e| e["engine"] == name).unwrap(),
            &["updates_per_s"],
        )
    };
    let targets = &report["targets"];
    let ratio = number(targets, &["packet_vs_conventional_throughput"]);
    // One round: the median of one ratio is that ratio.
    let expected = throughput("packet") / throughput("conventional");
    assert!((ratio - expected).abs() < 1e-9 * expected, "{targets:#}");
    assert!(number(targets, &["ideal_vs_conventional_throughput"]) > 0.0);
    assert_eq!(number(targets, &["throughput_target"]), 1.3);
    assert_eq!(targets["throughput_target_met"], ratio >= 1.3);
    let printed = format!("{ratio:.2}x (median of 1 rounds");
    assert!(out.contains(&printed), "missing {printed:?} in:\n{out}");
}

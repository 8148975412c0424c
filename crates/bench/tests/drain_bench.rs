//! `pmnet drain-bench` as a user runs it: a device's log drained by a server after an
//! outage, the replay paced and unpaced, every figure in the JSON and consistent. Nothing
//! here asserts a speed.

mod common;

use common::{number, run_with_json};

#[test]
fn drain_bench_writes_its_runs_as_json() {
    let dir = tempfile::tempdir().unwrap();
    let (report, out) = run_with_json(
        &[
            "drain-bench",
            "--entries",
            "200",
            "--clients",
            "2",
            "--dir",
            &dir.path().display().to_string(),
        ],
        &dir,
    );
    assert!(out.contains("paced/unpaced"), "{out}");
    let setting = &report["setting"];
    assert_eq!(setting["entries"], 200);
    assert_eq!(setting["clients"], 2);
    assert_eq!(setting["payload_bytes"], 100);
    assert_eq!(setting["busy_poll"], false);
    assert!(setting["medium"].as_str().is_some_and(|m| !m.is_empty()));
    let runs = report["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 2, "{report:#}");
    assert_eq!(runs[0]["window"], 256);
    assert_eq!(runs[0]["label"], "256");
    assert!(runs[1]["window"].is_null());
    assert_eq!(runs[1]["label"], "unpaced");
    for run in runs {
        assert_eq!(run["entries"], 200);
        let (drain, start) = (
            number(run, &["drain_ms"]),
            number(run, &["server_start_ms"]),
        );
        assert!(drain > 0.0 && start > 0.0 && start <= drain, "{run:#}");
        let rate = number(run, &["entries_per_s"]);
        assert!(
            (rate - 200.0 / (drain / 1e3)).abs() < 1e-6 * rate,
            "{run:#}"
        );
        assert!(
            (number(run, &["us_per_entry"]) * rate - 1e6).abs() < 1e-3,
            "{run:#}"
        );
        let replay = number(run, &["replay_ms"]);
        assert!((replay - (drain - start)).abs() < 1e-3, "{run:#}");
        assert!(number(run, &["replay_entries_per_s"]) >= rate, "{run:#}");
    }
    let ratio = number(&report, &["paced_vs_unpaced"]);
    let expected = number(&runs[0], &["entries_per_s"]) / number(&runs[1], &["entries_per_s"]);
    assert!((ratio - expected).abs() < 1e-9 * expected, "{report:#}");
    assert_eq!(number(&report, &["paper_us_per_entry"]), 67.0);

    // --paced-only: one run, no ratio.
    let (report, _) = run_with_json(
        &[
            "drain-bench",
            "--entries",
            "100",
            "--clients",
            "1",
            "--paced-only",
            "--paced-window",
            "16",
            "--dir",
            &dir.path().display().to_string(),
        ],
        &dir,
    );
    assert_eq!(report["runs"].as_array().unwrap().len(), 1);
    assert_eq!(report["runs"][0]["window"], 16);
    assert!(report["paced_vs_unpaced"].is_null());
}

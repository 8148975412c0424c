//! `pmnet bench --replicas`: client-side, server-side and in-network replication run side by
//! side for each replication factor, every part started as the commands start it; the report
//! names each result's replication factor, and every mode completed updates (the servers and
//! devices of each mode answered: a mode whose replicas or devices were wired wrong fails).

mod common;

use common::{args, run_bench};

#[test]
fn the_replication_bench_runs_three_modes_per_factor_and_reports_ratios() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("replication.json");
    let list = [
        "bench",
        "--replicas",
        "1,2",
        "--duration",
        "0.3",
        "--warmup",
        "0.1",
        "--data-mib",
        "4",
        // Every key fits the 4 MiB store (a packet-store slot each).
        "--keys",
        "500",
        "--slots",
        "1024",
        "--no-progress",
        "--dir",
        dir.path().to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
    ];
    let (status, stdout, stderr) = run_bench(&args(&list), None);
    assert!(status.success(), "{stdout}\n{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        stdout.contains("rep-pmnet R=2 / rep-server R=2"),
        "{stdout}"
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let results = report["results"].as_array().unwrap();
    let seen: Vec<(String, u64)> = results
        .iter()
        .map(|result| {
            (
                result["mode"].as_str().unwrap().to_owned(),
                result["replicas"].as_u64().unwrap(),
            )
        })
        .collect();
    let expected: Vec<(String, u64)> = [1, 2]
        .into_iter()
        .flat_map(|r| {
            ["rep-client", "rep-server", "rep-pmnet", "rep-fanout"]
                .into_iter()
                .map(move |mode| (mode.to_owned(), r))
        })
        .collect();
    assert_eq!(seen, expected);
    for result in results {
        assert!(result["requests"].as_u64().unwrap() > 0, "{result}");
        assert_eq!(result["failed"], 0, "{result}");
    }
    let ratios = report["replication_ratios"].as_array().unwrap();
    assert!(ratios.iter().any(|ratio| ratio["numerator"] == "rep-pmnet"
        && ratio["denominator"] == "rep-pmnet"
        && ratio["replicas"] == 2
        && ratio["denominator_replicas"] == 1));
    // Nothing left behind in the bench's directory.
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .map(|entry| entry.file_name())
        .filter(|name| name != "replication.json")
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

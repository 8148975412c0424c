//! `pmnet bench --device-failover` as a user runs it, one round: the controller (with a
//! one-member etcd of its own: Debian's `etcd-server`, which scripts/test.sh installs; without
//! it the test says so and stops), a server and four devices started from the `pmnet` binary,
//! the middle device and then the first SIGKILLed under load. The round is in the JSON with
//! both failovers and the throughput while the spare was copied in, no write failed, the
//! processes' command lines are those of docs/replication.md, and nothing is left behind.
//! Nothing here asserts a speed.

mod common;

use common::{args, nothing_left_in, run_bench};

/// Whether `etcd` is on the PATH.
fn etcd_installed() -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join("etcd").is_file()))
}

#[test]
fn a_round_kills_the_middle_and_the_first_device_and_measures_both_failovers() {
    if !etcd_installed() {
        eprintln!("etcd is not installed (apt-get install etcd-server): the controller needs it");
        return;
    }
    // The devices' logs and the server's store: 320 MiB, in RAM where there is /dev/shm.
    let shm = std::path::Path::new("/dev/shm");
    let dir = if shm.is_dir() {
        tempfile::tempdir_in(shm).unwrap()
    } else {
        tempfile::tempdir().unwrap()
    };
    let files = dir.path().join("files");
    std::fs::create_dir(&files).unwrap();
    let files_text = files.display().to_string();
    let json = dir.path().join("failover.json");
    let json_text = json.display().to_string();
    let list = [
        "bench",
        "--device-failover",
        "--rounds",
        "1",
        "--warmup",
        "0.5",
        "--clients",
        "2",
        "--keys",
        "256",
        "--dir",
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
    let report = &report["device_failover"];
    let rounds = report["rounds"].as_array().expect("rounds");
    assert_eq!(rounds.len(), 1, "{report:#}");
    let round = &rounds[0];
    for field in [
        "writes_per_s_before",
        "middle_failover_ms",
        "spare_joined_ms",
        "writes_per_s_while_copied_in",
        "first_failover_ms",
    ] {
        let value = round[field].as_f64().unwrap_or(f64::NAN);
        assert!(value > 0.0 && value.is_finite(), "{field}: {round:#}");
    }
    assert!(round["copy_cost"].as_f64().is_some(), "{round:#}");
    assert_eq!(round["writes_failed"], 0, "{round:#}");
    assert!(
        report["median"]["middle_failover_ms"].is_f64(),
        "{report:#}"
    );
    assert_eq!(report["failover_target_ms"], 200.0);
    assert_eq!(report["copy_cost_target"], 0.2);
    let setting = &report["setting"];
    assert_eq!(
        (
            &setting["heartbeat_ms"],
            &setting["suspect_after_ms"],
            &setting["replicas"]
        ),
        (&10.into(), &100.into(), &2.into()),
        "{setting:#}"
    );
    let processes: Vec<&str> = setting["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .map(|line| line.as_str().unwrap())
        .collect();
    assert!(
        processes[0].starts_with("pmnet controller ")
            && processes[0].contains("--device-chain 1=")
            && processes[0].contains("--spare-device 1:4="),
        "{processes:?}"
    );
    assert!(processes[1].starts_with("pmnet server "), "{processes:?}");
    assert_eq!(
        processes
            .iter()
            .filter(|line| line.starts_with("pmnet device ") && line.contains("--controller "))
            .count(),
        4,
        "{processes:?}"
    );
    assert_eq!(report["interrupted"], false);
    assert!(
        stdout.contains("middle device killed: writes acked again after")
            && stdout.contains("first device killed: writes acked again after")
            && stdout.contains("Permanent losses"),
        "{stdout}"
    );
    nothing_left_in(&files);
}

#[test]
fn device_failover_options_that_do_not_fit_are_refused() {
    let list = ["bench", "--device-failover", "--replicas", "1,2"];
    let (status, _, stderr) = run_bench(&args(&list), None);
    assert!(!status.success());
    assert!(stderr.contains("one value"), "{stderr}");
}

//! `pmnet-bench` as the benchmarks' binary: `pmnet bench …` runs it (the `pmnet` next to it
//! hands the command over), its help lists the benchmark commands, and a configuration file
//! serves both binaries, each table checked against its command's options.

mod common;

use std::process::Command;

use common::{args, pmnet_bin, run_bench, run_to_completion, PATIENCE};

#[test]
fn the_help_lists_the_benchmark_commands() {
    let (status, stdout, _) = run_bench(&args(&["--help"]), None);
    assert!(status.success());
    for command in [
        "bench",
        "redis-bench",
        "store-bench",
        "drain-bench",
        "eval",
        "session-bench",
        "coord-bench",
    ] {
        assert!(
            stdout
                .lines()
                .any(|line| line.trim_start().starts_with(&format!("{command} "))),
            "no {command} in:\n{stdout}"
        );
    }
    assert!(!stdout.contains("  device "), "{stdout}");
}

#[test]
fn pmnet_hands_a_benchmark_command_to_pmnet_bench() {
    let (status, stdout, stderr) = run_to_completion(
        Command::new(pmnet_bin()).args(["bench", "--help"]),
        None,
        PATIENCE,
    );
    assert!(status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("Usage: pmnet-bench bench"), "{stdout}");
    assert!(stdout.contains("--abd"), "{stdout}");

    // A short run, through pmnet, of the mode with no server: its table and exit code.
    let dir = tempfile::tempdir().unwrap();
    let list = [
        "bench",
        "--mode",
        "echo",
        "--duration",
        "0.3",
        "--warmup",
        "0",
        "--pin",
        "none",
        "--no-progress",
        "--dir",
        &dir.path().display().to_string(),
    ];
    let (status, stdout, stderr) =
        run_to_completion(Command::new(pmnet_bin()).args(list), None, PATIENCE);
    assert!(status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("pmnet bench: modes echo"), "{stdout}");
    assert!(
        stdout
            .lines()
            .any(|line| line.trim_start().starts_with("echo ")),
        "{stdout}"
    );

    // An error is pmnet-bench's, with its exit code.
    let (status, _, stderr) = run_to_completion(
        Command::new(pmnet_bin()).args(["eval", "--only", "no-such-thing"]),
        None,
        PATIENCE,
    );
    assert!(!status.success());
    assert!(stderr.contains("pmnet-bench: error:"), "{stderr}");
}

#[test]
fn one_configuration_file_serves_both_binaries_and_is_checked_whole() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pmnet.toml");
    let run_with = |text: &str, list: &[&str]| {
        std::fs::write(&file, text).unwrap();
        let mut all = args(&["--config", &file.display().to_string()]);
        all.extend(args(list));
        run_bench(&all, None)
    };
    // A [device] table beside [bench]: this binary checks it against pmnet device's options.
    let (status, _, stderr) = run_with(
        "[device]\nslots = 1024\n[bench]\nmode = \"teleport\"\n",
        &["bench"],
    );
    assert!(!status.success());
    assert!(stderr.contains("teleport"), "{stderr}");
    let (status, _, stderr) = run_with("[device]\nslotz = 1024\n", &["bench", "--help"]);
    assert!(!status.success());
    assert!(
        stderr.contains("unknown option `slotz` in [device]"),
        "{stderr}"
    );
    // pmnet checks its own tables and leaves the benchmarks' to pmnet-bench.
    let pmnet_with = |text: &str| {
        std::fs::write(&file, text).unwrap();
        run_to_completion(
            Command::new(pmnet_bin()).args([
                "--config",
                &file.display().to_string(),
                "keygen",
                "--help",
            ]),
            None,
            PATIENCE,
        )
    };
    let (status, _, stderr) = pmnet_with("[device]\nslotz = 1024\n");
    assert!(!status.success());
    assert!(stderr.contains("slotz"), "{stderr}");
    let (status, stdout, stderr) = pmnet_with("[bench]\nmodez = \"echo\"\n");
    assert!(status.success(), "{stdout}\n{stderr}");
}

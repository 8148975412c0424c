//! The benchmarks are in the `pmnet-bench` binary: `pmnet --help` lists the product's commands
//! only, and `pmnet bench …` (and the other benchmark commands) run the `pmnet-bench` next to
//! `pmnet`, else the one on PATH, with the arguments as given and its exit code; without one,
//! they fail saying how to build it. A stand-in `pmnet-bench` (a shell script) shows what it
//! was given.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::pmnet_bin;

const BENCH_COMMANDS: [&str; 7] = [
    "bench",
    "redis-bench",
    "store-bench",
    "drain-bench",
    "eval",
    "session-bench",
    "coord-bench",
];

/// A copy of the `pmnet` binary alone in a fresh directory (a hard link where it can be).
fn lone_pmnet() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let pmnet = dir.path().join("pmnet");
    if std::fs::hard_link(pmnet_bin(), &pmnet).is_err() {
        std::fs::copy(pmnet_bin(), &pmnet).unwrap();
    }
    (dir, pmnet)
}

/// A `pmnet-bench` in `dir` that prints its arguments, one a line, and exits with 7.
fn stand_in_bench(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join("pmnet-bench");
    std::fs::write(
        &path,
        "#!/bin/sh\necho \"stand-in pmnet-bench\"\nfor arg in \"$@\"; do echo \"[$arg]\"; done\nexit 7\n",
    )
    .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn run(pmnet: &Path, path: &Path, list: &[&str]) -> Output {
    Command::new(pmnet)
        .args(list)
        .env("PATH", path)
        .output()
        .expect("run pmnet")
}

#[test]
fn the_help_lists_the_products_commands_only() {
    let output = Command::new(pmnet_bin()).arg("--help").output().unwrap();
    assert!(output.status.success());
    let help = String::from_utf8_lossy(&output.stdout);
    let commands: Vec<&str> = help
        .lines()
        .skip_while(|line| !line.starts_with("Commands:"))
        .skip(1)
        .take_while(|line| line.starts_with("  "))
        .filter_map(|line| line.split_whitespace().next())
        .collect();
    assert_eq!(
        commands,
        [
            "device",
            "server",
            "client",
            "demo",
            "sim",
            "redis-adaptor",
            "gateway",
            "redis-up",
            "keygen",
            "kv",
            "chain-controller",
            "controller",
            "memnode",
            "memory",
            "status",
            "log",
            "store",
            "testbed",
            "completions",
            "man",
            "help"
        ],
        "{help}"
    );
}

#[test]
fn a_benchmark_command_runs_pmnet_bench_with_the_arguments_as_given() {
    let (dir, pmnet) = lone_pmnet();
    stand_in_bench(dir.path());
    let empty = tempfile::tempdir().unwrap();
    for command in BENCH_COMMANDS {
        let output = run(
            &pmnet,
            empty.path(),
            &[
                "-v",
                command,
                "--help",
                "--duration",
                "1",
                "-q",
                "two words",
            ],
        );
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert_eq!(output.status.code(), Some(7), "{command}: {output:?}");
        let expected = format!(
            "stand-in pmnet-bench\n[-v]\n[{command}]\n[--help]\n[--duration]\n[1]\n[-q]\n[two words]\n"
        );
        assert_eq!(stdout, expected, "{command}");
    }
}

#[test]
fn help_of_a_benchmark_command_is_pmnet_bench_s() {
    let (dir, pmnet) = lone_pmnet();
    stand_in_bench(dir.path());
    let empty = tempfile::tempdir().unwrap();
    for command in BENCH_COMMANDS {
        let output = run(&pmnet, empty.path(), &["help", command]);
        assert_eq!(output.status.code(), Some(7), "{command}: {output:?}");
        assert_eq!(
            String::from_utf8_lossy(&output.stdout),
            format!("stand-in pmnet-bench\n[{command}]\n[--help]\n"),
            "{command}"
        );
    }
    // The product's own commands are still pmnet's to explain.
    let output = run(&pmnet, empty.path(), &["help", "device"]);
    assert!(output.status.success(), "{output:?}");
    assert!(String::from_utf8_lossy(&output.stdout).contains("--server"));
}

#[test]
fn pmnet_bench_is_found_on_the_path_when_not_next_to_pmnet() {
    let (_dir, pmnet) = lone_pmnet();
    let on_path = tempfile::tempdir().unwrap();
    stand_in_bench(on_path.path());
    let output = run(&pmnet, on_path.path(), &["eval", "--quick"]);
    assert_eq!(output.status.code(), Some(7), "{output:?}");
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        "stand-in pmnet-bench\n[eval]\n[--quick]\n"
    );
}

#[test]
fn without_pmnet_bench_a_benchmark_command_says_how_to_build_it() {
    let (dir, pmnet) = lone_pmnet();
    let empty = tempfile::tempdir().unwrap();
    let output = run(&pmnet, empty.path(), &["bench", "--help"]);
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("cargo build --release -p pmnet-bench"),
        "{stderr}"
    );
    assert!(
        stderr.contains(&dir.path().display().to_string()),
        "names where it looked: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

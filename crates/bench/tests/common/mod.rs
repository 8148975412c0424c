//! Helpers shared by the benchmarks' integration tests: run `pmnet-bench` to completion, with
//! the `pmnet` binary it starts the product's processes from built next to it.
//!
//! Cargo builds this package's binary for its tests (`CARGO_BIN_EXE_pmnet-bench`), not the
//! `pmnet` binary of the package it depends on: [`pmnet_bin`] builds that one (`cargo build
//! -p pmnet --bin pmnet`, same profile and target directory) once per test binary, so the
//! `pmnet` next to `pmnet-bench` is always the current one.

#![allow(dead_code)] // each test binary uses its own subset

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::sync::OnceLock;
use std::time::Duration;

#[allow(unused_imports)] // likewise
pub use pmnet_testkit::{args, run_to_completion};

/// How long a benchmark run may take before a test gives up: generous, because the machine
/// may be small and busy and a run starts whole ensembles (etcd, ZooKeeper, chains of
/// devices); tests never assert on speed.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// The `pmnet-bench` binary cargo built for these tests.
pub fn bench_bin() -> &'static str {
    env!("CARGO_BIN_EXE_pmnet-bench")
}

/// The `pmnet` binary next to `pmnet-bench`, built (or found up to date) by cargo on first
/// use.
pub fn pmnet_bin() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let bench = Path::new(bench_bin());
        let profile_dir = bench.parent().expect("pmnet-bench is in a directory");
        let target_dir = profile_dir
            .parent()
            .expect("the profile's directory has a parent");
        let profile = profile_dir
            .file_name()
            .and_then(|name| name.to_str())
            .expect("a profile's name");
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut command = Command::new(cargo);
        command
            .args(["build", "--quiet", "-p", "pmnet", "--bin", "pmnet"])
            .arg("--manifest-path")
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Cargo.toml"))
            .env("CARGO_TARGET_DIR", target_dir);
        match profile {
            "debug" => {}
            "release" => {
                command.arg("--release");
            }
            other => {
                command.args(["--profile", other]);
            }
        }
        let status = command.status().expect("run cargo to build pmnet");
        assert!(status.success(), "cargo build -p pmnet failed: {status}");
        let pmnet = profile_dir.join("pmnet");
        assert!(pmnet.is_file(), "{} was not built", pmnet.display());
        pmnet
    })
}

/// Run `pmnet-bench ARGS` to completion (at most `PATIENCE`): (status, stdout, stderr).
pub fn run_bench(args: &[String], stdin: Option<&str>) -> (ExitStatus, String, String) {
    pmnet_bin();
    run_to_completion(Command::new(bench_bin()).args(args), stdin, PATIENCE)
}

/// Run `pmnet-bench ARGS --json FILE` (in `dir`) to success; the JSON it wrote.
pub fn run_with_json(list: &[&str], dir: &tempfile::TempDir) -> (serde_json::Value, String) {
    let json = dir.path().join("report.json");
    let mut command = args(list);
    command.push("--json".to_owned());
    command.push(json.display().to_string());
    let (status, out, err) = run_bench(&command, None);
    assert!(status.success(), "{out}\n{err}");
    assert!(!err.contains("panicked"), "{err}");
    let text = std::fs::read_to_string(&json).expect("the --json file");
    (serde_json::from_str(&text).expect("valid JSON"), out)
}

pub fn number(value: &serde_json::Value, path: &[&str]) -> f64 {
    let mut at = value;
    for key in path {
        at = at
            .get(key)
            .unwrap_or_else(|| panic!("no {path:?} in {value:#}"));
    }
    at.as_f64()
        .unwrap_or_else(|| panic!("{path:?} is not a number in {value:#}"))
}

/// No directory a benchmark of the coordination service leaves while it runs
/// (`pmnet-coord-bench-…`) is left under `dir`.
pub fn nothing_left_in(dir: &Path) {
    let left: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("pmnet-coord-bench-"))
        .collect();
    assert!(
        left.is_empty(),
        "left behind in {}: {left:?}",
        dir.display()
    );
}

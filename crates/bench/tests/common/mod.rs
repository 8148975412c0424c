//! Helpers shared by the benchmarks' integration tests: run `pmnet-bench` to completion, with
//! the `pmnet` binary it starts the product's processes from built next to it.
//!
//! Cargo builds this package's binary for its tests (`CARGO_BIN_EXE_pmnet-bench`), not the
//! `pmnet` binary of the package it depends on: [`pmnet_bin`] builds that one (`cargo build
//! -p pmnet --bin pmnet`, same profile and target directory) once per test binary, so the
//! `pmnet` next to `pmnet-bench` is always the current one.

#![allow(dead_code)] // each test binary uses its own subset

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

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

/// Run `command` to completion, feeding it `stdin`, for at most `patience`: (status, stdout,
/// stderr).
pub fn run_to_completion(
    command: &mut Command,
    stdin: Option<&str>,
    patience: Duration,
) -> (ExitStatus, String, String) {
    use std::io::Write;
    let mut child = command
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|error| panic!("cannot start {command:?}: {error}"));
    if let Some(text) = stdin {
        let mut input = child.stdin.take().expect("piped stdin");
        input.write_all(text.as_bytes()).expect("write stdin");
    }
    // Read both pipes on threads so a chatty child never blocks.
    let mut out = child.stdout.take().expect("piped stdout");
    let mut err = child.stderr.take().expect("piped stderr");
    let out_reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = out.read_to_string(&mut text);
        text
    });
    let err_reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = err.read_to_string(&mut text);
        text
    });
    let deadline = Instant::now() + patience;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the child") {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{command:?} did not finish within {patience:?}");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let stdout = out_reader.join().unwrap_or_default();
    let stderr = err_reader.join().unwrap_or_default();
    (status, stdout, stderr)
}

/// String arguments from string slices.
pub fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|arg| (*arg).to_owned()).collect()
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

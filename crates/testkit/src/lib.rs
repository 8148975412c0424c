//! Test support shared by the integration tests of `pmnet` (crates/pmnet/tests) and
//! `pmnet-bench` (crates/bench/tests): a dev-dependency of both, never linked into a binary.
//! What is particular to one crate's tests (the binaries they run, starting a cluster, a
//! benchmark's JSON) stays in that crate's `tests/common`.

use std::io::{Read, Write};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Run `command` to completion, feeding it `stdin`, for at most `patience` (then it is
/// killed and the test fails): (status, stdout, stderr).
pub fn run_to_completion(
    command: &mut Command,
    stdin: Option<&str>,
    patience: Duration,
) -> (ExitStatus, String, String) {
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

/// The seed of a randomised test: `PMNET_SEED`, or a fresh one; printed either way.
pub fn seed(test: &str) -> u64 {
    let seed = match std::env::var("PMNET_SEED") {
        Ok(text) => text
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("PMNET_SEED must be a u64, got {text:?}")),
        Err(_) => rand::random(),
    };
    eprintln!("{test}: PMNET_SEED={seed}");
    seed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_runs_to_completion_with_its_input_and_both_outputs() {
        let (status, stdout, stderr) = run_to_completion(
            Command::new("sh").args(["-c", "cat; echo oops >&2; exit 3"]),
            Some("hello\n"),
            Duration::from_secs(20),
        );
        assert_eq!(status.code(), Some(3));
        assert_eq!(stdout, "hello\n");
        assert_eq!(stderr, "oops\n");
    }

    #[test]
    #[should_panic(expected = "did not finish within")]
    fn a_command_that_outlasts_its_patience_fails_the_test() {
        run_to_completion(
            Command::new("sleep").arg("30"),
            None,
            Duration::from_millis(100),
        );
    }
}

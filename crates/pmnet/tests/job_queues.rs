//! Job-queue libraries, unmodified and as their users run them, through `pmnet redis-up`: RQ
//! and Celery (Python) and BullMQ (Node.js). Each test starts `pmnet redis-up --start-redis DIR`
//! as docs/redis.md tells a user, runs the library's worker as its documentation does and a
//! producer that enqueues N jobs (10 000; `PMNET_JOBS_COUNT` for quick local runs), and checks
//! that every job ran exactly once (each job adds 1 to the field of its number in the hash
//! `jobs:done`, through the gateway), that the library itself counts every job done and none
//! failed or pending, and that the worker and the producer report no error (a Python traceback,
//! an error Celery logs, BullMQ's `error` or `failed` event) and exit cleanly.
//!
//! The same workloads against a plain redis-server (the tests `…_against_plain_redis`, run with
//! `--ignored`) show that the workloads themselves are right, and how long they take without
//! PMNet.
//!
//! Needs Python 3 with RQ and Celery (`pip install 'rq>=3,<4' 'celery[redis]>=5,<6'`, or
//! `PMNET_JOBS_PYTHON` naming a Python that has them) and Node.js with BullMQ (`npm install
//! bullmq@6`, `PMNET_NODE_PATH` naming its node_modules); scripts/test.sh installs them.

mod redis_harness;

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::thread;
use std::time::{Duration, Instant};

use pmnet_redis::resp::{SyncClient, Value};
use redis_harness::*;

const CLIENTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/clients");

/// What RQ and Celery print when something failed: a traceback, an error logged by Celery
/// (`[… ERROR/MainProcess] …`), an exception in one of their threads.
const PYTHON_ERRORS: &[&str] = &["Traceback", "ERROR/", "CRITICAL/", "Exception in thread"];
/// What bullmq_jobs.js prints for the worker's `error` and `failed` events.
const BULLMQ_ERRORS: &[&str] = &["worker error:", "failed:"];

/// How many jobs each workload enqueues: `PMNET_JOBS_COUNT`, else 10 000.
fn job_count() -> usize {
    match std::env::var("PMNET_JOBS_COUNT") {
        Ok(text) => text
            .trim()
            .parse()
            .ok()
            .filter(|count| *count > 0)
            .unwrap_or_else(|| panic!("PMNET_JOBS_COUNT must be a positive number, got {text:?}")),
        Err(_) => 10_000,
    }
}

/// The Python with RQ and Celery: `PMNET_JOBS_PYTHON` (scripts/test.sh installs them in a
/// virtual environment), else `python3`.
fn python() -> String {
    std::env::var("PMNET_JOBS_PYTHON").unwrap_or_else(|_| "python3".to_owned())
}

fn require_python_module(module: &str, install: &str) {
    let found = Command::new(python())
        .args(["-c", &format!("import {module}")])
        .status()
        .is_ok_and(|status| status.success());
    assert!(
        found,
        "Python 3 with {module} is needed: `pip install '{install}'` and PMNET_JOBS_PYTHON=that \
         Python (scripts/test.sh installs it in target/job-queues)"
    );
}

/// The `node_modules` holding BullMQ: `PMNET_NODE_PATH` (scripts/test.sh installs it under
/// target/node-clients), else Node.js's own search.
fn node(script_args: &[&str]) -> Command {
    let mut command = Command::new("node");
    command.args(script_args);
    if let Ok(path) = std::env::var("PMNET_NODE_PATH") {
        command.env("NODE_PATH", path);
    }
    command
}

fn require_bullmq() {
    let found = node(&["-e", "require('bullmq')"])
        .status()
        .is_ok_and(|status| status.success());
    assert!(
        found,
        "Node.js with BullMQ is needed: `npm install bullmq@6` and PMNET_NODE_PATH=its \
         node_modules (scripts/test.sh installs it in target/node-clients)"
    );
}

/// A worker or producer process, its output in files; killed when dropped.
struct Running {
    what: String,
    child: Option<Child>,
    stdout: PathBuf,
    stderr: PathBuf,
}

impl Running {
    fn spawn(what: &str, mut command: Command, logs: &Path) -> Running {
        let file_name = what.replace(' ', "-");
        let stdout = logs.join(format!("{file_name}.out"));
        let stderr = logs.join(format!("{file_name}.err"));
        let child = command
            .current_dir(CLIENTS)
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .stdin(std::process::Stdio::null())
            .stdout(File::create(&stdout).expect("stdout file"))
            .stderr(File::create(&stderr).expect("stderr file"))
            .spawn()
            .unwrap_or_else(|error| panic!("cannot start the {what} ({command:?}): {error}"));
        Running {
            what: what.to_owned(),
            child: Some(child),
            stdout,
            stderr,
        }
    }

    /// What it printed, the end of it if long.
    fn output(&self) -> String {
        let tail = |path: &Path| {
            let text = std::fs::read_to_string(path).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(40)..].join("\n")
        };
        format!(
            "--- {} stdout (end) ---\n{}\n--- {} stderr (end) ---\n{}",
            self.what,
            tail(&self.stdout),
            self.what,
            tail(&self.stderr)
        )
    }

    /// Its exit status, if it has exited.
    fn exited(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|child| child.try_wait().expect("wait for a child"))
    }

    /// Wait (at most `patience`) for it to exit, and require a clean exit.
    fn wait_success(&mut self, patience: Duration) {
        let started = Instant::now();
        let status = loop {
            if let Some(status) = self.exited() {
                break status;
            }
            assert!(
                started.elapsed() < patience,
                "the {} did not exit within {patience:?}\n{}",
                self.what,
                self.output()
            );
            thread::sleep(Duration::from_millis(50));
        };
        self.child = None;
        assert!(
            status.success(),
            "the {} exited with {status}\n{}",
            self.what,
            self.output()
        );
    }

    /// Ask it to stop as a service manager would (SIGTERM) and require a clean exit.
    fn terminate(&mut self) {
        let child = self.child.as_ref().expect("still running");
        let pid = i32::try_from(child.id()).expect("pid");
        // SAFETY: kill(2) with the pid of our own unreaped child and a valid signal number.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
        self.wait_success(PATIENCE);
    }

    /// The lines of its output that contain any of `markers` (a Python traceback, a logged
    /// error, a failed job…).
    fn errors(&self, markers: &[&str]) -> Vec<String> {
        let mut errors = Vec::new();
        for path in [&self.stdout, &self.stderr] {
            let text = std::fs::read_to_string(path).unwrap_or_default();
            errors.extend(
                text.lines()
                    .filter(|line| markers.iter().any(|marker| line.contains(marker)))
                    .map(str::to_owned),
            );
        }
        errors
    }

    /// Require that it reported no error (see [`Running::errors`]).
    fn assert_no_errors(&self, markers: &[&str]) {
        let errors = self.errors(markers);
        assert!(
            errors.is_empty(),
            "the {} reported {} errors; the first: {:#?}\n{}",
            self.what,
            errors.len(),
            &errors[..errors.len().min(5)],
            self.output()
        );
    }

    /// Its standard output.
    fn stdout(&self) -> String {
        std::fs::read_to_string(&self.stdout).unwrap_or_default()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// How many jobs have recorded their run: `HLEN jobs:done`.
fn jobs_done(client: &mut SyncClient) -> usize {
    let reply = client
        .command(&["HLEN", "jobs:done"])
        .expect("HLEN jobs:done");
    usize::try_from(int_of(&reply)).expect("a count")
}

/// Wait until `count` jobs have recorded their run, while every process in `running` is
/// still running or has exited cleanly, and has reported no error (`markers`). Gives up when
/// the count stops moving for `PATIENCE`.
fn wait_for_jobs(
    client: &mut SyncClient,
    count: usize,
    running: &mut [&mut Running],
    markers: &[&str],
) {
    let mut last = (0, Instant::now());
    for round in 0.. {
        let done = jobs_done(client);
        if done >= count {
            return;
        }
        for process in running.iter_mut() {
            if let Some(status) = process.exited() {
                assert!(
                    status.success(),
                    "the {} exited with {status} after {done} of {count} jobs\n{}",
                    process.what,
                    process.output()
                );
            }
        }
        if round % 20 == 0 {
            for process in running.iter() {
                process.assert_no_errors(markers);
            }
        }
        if done != last.0 {
            last = (done, Instant::now());
        }
        if last.1.elapsed() > PATIENCE {
            let outputs: Vec<String> = running.iter().map(|process| process.output()).collect();
            panic!(
                "no job done for {PATIENCE:?}: {done} of {count} done\n{}",
                outputs.join("\n")
            );
        }
        thread::sleep(Duration::from_millis(100));
    }
}

/// Every job ran exactly once: `jobs:done` has a field for each of 0 … count-1, each 1.
fn check_exactly_once(client: &mut SyncClient, count: usize) {
    let Value::Array(Some(fields)) = client
        .command(&["HGETALL", "jobs:done"])
        .expect("HGETALL jobs:done")
    else {
        panic!("HGETALL did not answer a list");
    };
    let mut runs = BTreeMap::new();
    for pair in fields.chunks(2) {
        let number: usize = std::str::from_utf8(pair[0].as_bytes().expect("a field"))
            .ok()
            .and_then(|text| text.parse().ok())
            .unwrap_or_else(|| panic!("not a job's number: {:?}", pair[0]));
        runs.insert(number, int_of(&pair[1]));
    }
    let missing: Vec<usize> = (0..count).filter(|n| !runs.contains_key(n)).collect();
    let twice: Vec<(&usize, &i64)> = runs.iter().filter(|(_, runs)| **runs != 1).collect();
    let strangers: Vec<&usize> = runs.keys().filter(|n| **n >= count).collect();
    assert!(
        missing.is_empty() && twice.is_empty() && strangers.is_empty(),
        "not every job ran exactly once: {} missing (first: {:?}), {} not run once (first: \
         {:?}), {} unknown (first: {:?})",
        missing.len(),
        &missing[..missing.len().min(10)],
        twice.len(),
        &twice[..twice.len().min(10)],
        strangers.len(),
        &strangers[..strangers.len().min(10)]
    );
}

/// Run a library's check to completion and require its `ok`.
fn library_check(what: &str, command: Command, logs: &Path) {
    let mut check = Running::spawn(what, command, logs);
    check.wait_success(PATIENCE);
    let stdout = check.stdout();
    assert!(stdout.trim_end().ends_with("ok"), "{}", check.output());
    eprintln!("{}", stdout.lines().next().unwrap_or(""));
}

/// RQ: a worker (`rq worker`, without forking a process per job: `--worker-class
/// rq.worker.SimpleWorker`) waiting on the default queue and a producer enqueueing every job;
/// the worker is stopped with SIGTERM (its warm shutdown) once every job ran.
fn rq_workload(port: u16, count: usize) {
    require_python_module("rq", "rq>=3,<4");
    let logs = tempfile::tempdir().expect("temporary directory");
    let url = format!("redis://127.0.0.1:{port}/0");
    let count_text = count.to_string();
    let mut client = SyncClient::connect(([127, 0, 0, 1], port).into(), PATIENCE).expect("connect");
    let started = Instant::now();

    let mut worker = Command::new(python());
    worker.args(["-m", "rq.cli", "worker", "--url", &url]);
    worker.args(["--worker-class", "rq.worker.SimpleWorker"]);
    let mut worker = Running::spawn("RQ worker", worker, logs.path());
    let mut producer = Command::new(python());
    producer.args(["rq_jobs.py", "produce", &url, &count_text]);
    let mut producer = Running::spawn("RQ producer", producer, logs.path());
    wait_for_jobs(
        &mut client,
        count,
        &mut [&mut worker, &mut producer],
        PYTHON_ERRORS,
    );
    let elapsed = started.elapsed();
    producer.wait_success(PATIENCE);
    eprintln!(
        "RQ, {count} jobs: all run {:.1} s after the worker and the producer started ({})",
        elapsed.as_secs_f64(),
        producer.stdout().trim()
    );
    worker.terminate();
    producer.assert_no_errors(PYTHON_ERRORS);
    worker.assert_no_errors(PYTHON_ERRORS);

    check_exactly_once(&mut client, count);
    let mut check = Command::new(python());
    check.args(["rq_jobs.py", "check", &url, &count_text]);
    library_check("RQ check", check, logs.path());
}

/// Celery: a worker with its default pool (prefork; `celery -A celery_jobs worker --concurrency
/// 2`, one process per vCPU here) and a producer sending every task at once; the worker is
/// stopped with SIGTERM (its warm shutdown) once every task ran.
fn celery_workload(port: u16, count: usize) {
    require_python_module("celery", "celery[redis]>=5,<6");
    let logs = tempfile::tempdir().expect("temporary directory");
    let url = format!("redis://127.0.0.1:{port}/0");
    let count_text = count.to_string();
    let mut client = SyncClient::connect(([127, 0, 0, 1], port).into(), PATIENCE).expect("connect");
    let started = Instant::now();

    let mut worker = Command::new(python());
    worker.args(["-m", "celery", "-A", "celery_jobs", "worker"]);
    worker.args(["--concurrency", "2", "--loglevel", "INFO"]);
    worker.env("PMNET_JOBS_URL", &url);
    let mut worker = Running::spawn("Celery worker", worker, logs.path());
    let mut producer = Command::new(python());
    producer.args(["celery_jobs.py", "produce", &count_text]);
    producer.env("PMNET_JOBS_URL", &url);
    let mut producer = Running::spawn("Celery producer", producer, logs.path());
    wait_for_jobs(
        &mut client,
        count,
        &mut [&mut worker, &mut producer],
        PYTHON_ERRORS,
    );
    let elapsed = started.elapsed();
    producer.wait_success(PATIENCE);
    eprintln!(
        "Celery, {count} tasks: all run {:.1} s after the worker and the producer started ({})",
        elapsed.as_secs_f64(),
        producer.stdout().trim()
    );
    worker.terminate();
    producer.assert_no_errors(PYTHON_ERRORS);
    worker.assert_no_errors(PYTHON_ERRORS);

    check_exactly_once(&mut client, count);
    let mut check = Command::new(python());
    check.args(["celery_jobs.py", "check", &count_text]);
    check.env("PMNET_JOBS_URL", &url);
    library_check("Celery check", check, logs.path());
}

/// BullMQ: a `Worker` on the queue "jobs" and a producer adding every job with `Queue.add`;
/// the worker closes on SIGTERM (`worker.close()`) once every job ran.
fn bullmq_workload(port: u16, count: usize) {
    require_bullmq();
    let logs = tempfile::tempdir().expect("temporary directory");
    let port_text = port.to_string();
    let count_text = count.to_string();
    let mut client = SyncClient::connect(([127, 0, 0, 1], port).into(), PATIENCE).expect("connect");
    let started = Instant::now();

    let worker = node(&["bullmq_jobs.js", "worker", &port_text]);
    let mut worker = Running::spawn("BullMQ worker", worker, logs.path());
    let producer = node(&["bullmq_jobs.js", "produce", &port_text, &count_text]);
    let mut producer = Running::spawn("BullMQ producer", producer, logs.path());
    wait_for_jobs(
        &mut client,
        count,
        &mut [&mut worker, &mut producer],
        BULLMQ_ERRORS,
    );
    let elapsed = started.elapsed();
    producer.wait_success(PATIENCE);
    eprintln!(
        "BullMQ, {count} jobs: all run {:.1} s after the worker and the producer started ({})",
        elapsed.as_secs_f64(),
        producer.stdout().trim()
    );
    worker.terminate();
    producer.assert_no_errors(BULLMQ_ERRORS);
    worker.assert_no_errors(BULLMQ_ERRORS);

    check_exactly_once(&mut client, count);
    let check = node(&["bullmq_jobs.js", "check", &port_text, &count_text]);
    library_check("BullMQ check", check, logs.path());
}

/// `pmnet redis-up --start-redis DIR` as docs/redis.md starts it (on ports of the test's own);
/// `workload` gets the port its clients connect to. Killed (with all it started) at the end.
fn through_redis_up(workload: fn(u16, usize)) {
    require_redis();
    let RedisUp {
        child,
        gateway,
        _dir,
        ..
    } = start_redis_up();
    let _redis_up = Running {
        what: "pmnet redis-up".to_owned(),
        child: Some(child),
        stdout: _dir.path().join("redis-up.out"),
        stderr: _dir.path().join("redis-up.err"),
    };
    workload(gateway, job_count());
}

/// A plain redis-server (`appendfsync always`, as redis-up starts its own).
fn against_plain_redis(workload: fn(u16, usize)) {
    require_redis();
    let dir = tempfile::tempdir().expect("temporary directory");
    let redis = Redis::start(dir.path());
    workload(redis.port, job_count());
}

#[test]
fn rq_runs_every_job_once_through_redis_up() {
    through_redis_up(rq_workload);
}

#[test]
fn celery_runs_every_task_once_through_redis_up() {
    through_redis_up(celery_workload);
}

#[test]
fn bullmq_runs_every_job_once_through_redis_up() {
    through_redis_up(bullmq_workload);
}

#[test]
#[ignore = "the workload's reference run, without PMNet: run with --ignored"]
fn rq_runs_every_job_once_against_plain_redis() {
    against_plain_redis(rq_workload);
}

#[test]
#[ignore = "the workload's reference run, without PMNet: run with --ignored"]
fn celery_runs_every_task_once_against_plain_redis() {
    against_plain_redis(celery_workload);
}

#[test]
#[ignore = "the workload's reference run, without PMNet: run with --ignored"]
fn bullmq_runs_every_job_once_against_plain_redis() {
    against_plain_redis(bullmq_workload);
}

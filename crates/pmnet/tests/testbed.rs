//! `pmnet testbed`: the testbed built, used and removed through the command, and PMNet run on
//! it across three hosts (a server, a device routing between, a client). Needs root and
//! iproute2; skips, saying why, without them. Each test has a testbed name of its own (they
//! run in parallel) and a guard that removes it even when the test fails.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use pmnet_testbed::Testbed;

const PMNET: &str = env!("CARGO_BIN_EXE_pmnet");

/// Testbed `name`, taken down when dropped, whatever the test did with it.
struct Cleanup(String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Err(error) = Testbed::down(&self.0) {
            eprintln!("taking testbed {} down: {error}", self.0);
        }
    }
}

/// A testbed name of this process and test, and its guard; None (the test skips) when
/// testbeds cannot be built here.
fn testbed_name(test: &str) -> Option<(String, Cleanup)> {
    if let Err(error) = pmnet_testbed::available() {
        eprintln!("skipping {test}: no testbed on this machine: {error}");
        return None;
    }
    let name = format!("pm{}-{test}", std::process::id());
    Some((name.clone(), Cleanup(name)))
}

fn pmnet(args: &[&str]) -> Output {
    Command::new(PMNET)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run pmnet")
}

/// Run `pmnet ARGS`, which must succeed; its stdout.
fn pmnet_ok(args: &[&str]) -> String {
    let output = pmnet(args);
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "pmnet {} failed ({}):\nstdout: {stdout}\nstderr: {}",
        args.join(" "),
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

#[test]
fn the_command_builds_uses_and_removes_a_testbed() {
    let Some((name, _cleanup)) = testbed_name("cli") else {
        return;
    };
    let up = pmnet_ok(&["testbed", "up", "--name", &name]);
    for expected in [
        format!("testbed {name} is up"),
        format!("{name}-c"),
        format!("{name}-d"),
        format!("{name}-s"),
        "10.77.1.2/24".to_owned(),
        "10.77.2.1/24".to_owned(),
        "default via 10.77.1.1".to_owned(),
        format!("pmnet testbed exec server --name {name} -- "),
        format!("pmnet testbed down --name {name}"),
    ] {
        assert!(up.contains(&expected), "no {expected:?} in:\n{up}");
    }
    let again = pmnet_ok(&["testbed", "up", "--name", &name]);
    assert!(again.contains("is up (reused)"), "{again}");

    let testbed = Testbed::open(&name).unwrap();
    let status = pmnet_ok(&["testbed", "status", "--name", &name]);
    for interface in testbed.interfaces() {
        assert!(status.contains(&interface.mac.to_string()), "{status}");
    }

    let addr = pmnet_ok(&[
        "testbed", "exec", "client", "--name", &name, "--", "ip", "addr",
    ]);
    assert!(addr.contains("inet 10.77.1.2/24"), "{addr}");
    assert!(!addr.contains("10.77.2.2"), "{addr}");
    let addr = pmnet_ok(&[
        "testbed", "exec", "server", "--name", &name, "--", "ip", "addr",
    ]);
    assert!(addr.contains("inet 10.77.2.2/24"), "{addr}");

    // The command's exit status is passed on.
    let exit = pmnet(&[
        "testbed", "exec", "device", "--name", &name, "--", "sh", "-c", "exit 7",
    ]);
    assert_eq!(exit.status.code(), Some(7));

    let down = pmnet_ok(&["testbed", "down", "--name", &name]);
    assert!(down.contains("is down"), "{down}");
    assert!(!Testbed::exists(&name));
    let left: Vec<String> = pmnet_testbed::netns_list()
        .unwrap()
        .into_iter()
        .filter(|netns| netns.starts_with(&format!("{name}-")))
        .collect();
    assert!(left.is_empty(), "namespaces left: {left:?}");

    // Down: status says so (exit 1), exec refuses with a message saying how to start it, down
    // again has nothing to do.
    let status = pmnet(&["testbed", "status", "--name", &name]);
    assert_eq!(status.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&status.stdout).contains("is not up"));
    let exec = pmnet(&["testbed", "exec", "client", "--name", &name, "--", "true"]);
    let stderr = String::from_utf8_lossy(&exec.stderr);
    assert!(!exec.status.success());
    assert!(
        stderr.contains("is not up") && stderr.contains("pmnet testbed up --name"),
        "{stderr}"
    );
    let down = pmnet_ok(&["testbed", "down", "--name", &name]);
    assert!(down.contains("nothing to do"), "{down}");
}

#[test]
fn bad_invocations_are_refused() {
    let output = pmnet(&["testbed", "exec", "router", "--", "true"]);
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("router"));
    let output = pmnet(&["testbed", "up", "--name", "a/b"]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("is not valid"), "{stderr}");
}

/// A process started with `pmnet testbed exec`, its output going to a file; killed when
/// dropped.
struct Background {
    child: Child,
    log: PathBuf,
}

impl Background {
    fn start(name: &str, host: &str, dir: &Path, args: &[&str]) -> Background {
        let log = dir.join(format!("{host}.out"));
        let file = std::fs::File::create(&log).unwrap();
        let child = Command::new(PMNET)
            .args(["testbed", "exec", host, "--name", name, "--", PMNET])
            .args(args)
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .expect("start pmnet testbed exec");
        let mut background = Background { child, log };
        background.wait_for("listening on");
        background
    }

    fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn wait_for(&mut self, text: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.output().contains(text) {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "{} exited ({status}):\n{}",
                    self.log.display(),
                    self.output()
                );
            }
            assert!(
                Instant::now() < deadline,
                "no {text:?} in 30 s from {}:\n{}",
                self.log.display(),
                self.output()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        // `ip netns exec` execs the command: the child is pmnet itself.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn pmnet_runs_across_the_three_hosts() {
    let Some((name, _cleanup)) = testbed_name("e2e") else {
        return;
    };
    pmnet_ok(&["testbed", "up", "--name", &name]);
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("server.data");
    let log = dir.path().join("device.log");
    // The hosts' addresses are not loopback: protected mode wants the deployment's key.
    let key = dir.path().join("pmnet.key");
    let key = key.to_str().unwrap();
    pmnet_ok(&["keygen", "--out", key]);
    let server = Background::start(
        &name,
        "server",
        dir.path(),
        &[
            "server",
            "--listen",
            "10.77.2.2:7500",
            "--device",
            "10.77.2.1:7400",
            "--data-file",
            data.to_str().unwrap(),
            "--data-mib",
            "8",
            "--report-interval",
            "0",
            "--key-file",
            key,
        ],
    );
    let device = Background::start(
        &name,
        "device",
        dir.path(),
        &[
            "device",
            "--listen",
            "0.0.0.0:7400",
            "--server",
            "1=10.77.2.2:7500",
            "--log-file",
            log.to_str().unwrap(),
            "--slots",
            "1024",
            "--report-interval",
            "0",
            "--key-file",
            key,
        ],
    );
    let client = |peer: &str, request: &[&str]| {
        let mut args = vec!["testbed", "exec", "client", "--name", &name, "--", PMNET];
        args.extend(["client", "--device", peer, "--key-file", key]);
        args.extend(request);
        let output = pmnet(&args);
        (
            output.status.success(),
            String::from_utf8_lossy(&output.stdout).trim().to_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let (ok, out, err) = client("10.77.1.1:7400", &["set", "greeting", "hello"]);
    assert!(
        ok && out.starts_with("OK (durable in the log of device 1"),
        "set: {out}\n{err}\nserver:\n{}\ndevice:\n{}",
        server.output(),
        device.output()
    );
    // Read back through the device, and from the server directly (routed by the device host's
    // kernel), once the server applied it.
    for peer in ["10.77.1.1:7400", "10.77.2.2:7500"] {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (ok, out, err) = client(peer, &["get", "greeting"]);
            if ok && out == "hello (from server 1)" {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "GET via {peer}: {out}\n{err}\nserver:\n{}\ndevice:\n{}",
                server.output(),
                device.output()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    drop(device);
    drop(server);
}

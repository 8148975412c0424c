//! Watching pmnet as operators watch Redis and etcd: every long-running process type, started
//! with `--metrics 127.0.0.1:0` and given some traffic, serves metrics that Prometheus's own
//! linter (`promtool check metrics`, Debian's `prometheus` package) accepts without a problem,
//! with no series twice.
//!
//! promtool must be installed (scripts/test.sh installs it); where it is not and the `CI`
//! environment variable is unset, the test says so and passes.

mod common;
mod redis_harness;

use std::collections::BTreeMap;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{args, chain_member, free_udp_addr, run_pmnet, session, Cluster, Node};
use pmnet_runtime::metrics::scrape;
use pmnet_runtime::{AbdMode, AbdSession, AbdSessionConfig};
use pmnet_store::Request;

/// Where `program` is on `PATH`, if anywhere.
fn on_path(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join(program))
            .find(|candidate| candidate.is_file())
    })
}

/// The promtool to check with; `None` (the test then passes, saying why) only when it is not
/// installed and this is not CI.
fn promtool() -> Option<PathBuf> {
    let found = on_path("promtool");
    if found.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "promtool is not installed, and CI must run this test: apt-get install -y prometheus \
             (scripts/test.sh does)"
        );
        eprintln!(
            "SKIPPED: promtool is not installed (apt-get install -y prometheus); the metrics \
             were not checked"
        );
    }
    found
}

/// The problems `promtool check metrics` finds in `text` (empty: none), and the series that
/// appear more than once (which promtool does not look for, and which Prometheus rejects at
/// every scrape).
fn problems(promtool: &PathBuf, text: &str) -> Vec<String> {
    let mut child = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run promtool");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("write to promtool");
    let output = child.wait_with_output().expect("promtool's output");
    let mut found: Vec<String> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .chain(String::from_utf8_lossy(&output.stderr).lines())
        .filter(|line| !line.trim().is_empty())
        .map(str::to_owned)
        .collect();
    if !output.status.success() && found.is_empty() {
        found.push(format!("promtool exited with {}", output.status));
    }
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    for line in text.lines().filter(|line| !line.starts_with('#')) {
        if let Some((series, _)) = line.rsplit_once(' ') {
            *seen.entry(series).or_default() += 1;
        }
    }
    found.extend(
        seen.into_iter()
            .filter(|(_, count)| *count > 1)
            .map(|(series, count)| format!("duplicate series ({count} times): {series}")),
    );
    found
}

/// Scrape every endpoint and check each; fail naming every process with a problem.
fn check_all(promtool: &PathBuf, endpoints: &[(String, SocketAddr)]) {
    let mut report = Vec::new();
    for (name, addr) in endpoints {
        let text = scrape(*addr, Duration::from_secs(10))
            .unwrap_or_else(|error| panic!("scrape {name} at {addr}: {error}"));
        assert!(
            text.contains("# TYPE process_cpu_seconds_total counter"),
            "{name}: not a full scrape:\n{text}"
        );
        let found = problems(promtool, &text);
        if !found.is_empty() {
            report.push(format!("{name} ({addr}):\n  {}", found.join("\n  ")));
        }
    }
    assert!(
        report.is_empty(),
        "promtool check metrics (and the duplicate check) found problems:\n{}",
        report.join("\n")
    );
}

fn metrics_of(node: &Node) -> SocketAddr {
    node.metrics
        .unwrap_or_else(|| panic!("{} serves no metrics", node.proc.name))
}

fn metrics_of_harness(proc: &Option<redis_harness::Proc>, name: &str) -> SocketAddr {
    proc.as_ref()
        .and_then(|proc| proc.metrics)
        .unwrap_or_else(|| panic!("the {name} serves no metrics"))
}

#[test]
fn the_linter_accepts_what_every_process_type_serves() {
    let Some(promtool) = promtool() else { return };
    let dir = tempfile::tempdir().expect("temporary directory");
    let mut endpoints: Vec<(String, SocketAddr)> = Vec::new();

    // A device with its read cache in front of a server: updates, reads, cache reads.
    let cluster = Cluster::start_with_device_options(&["--cache"]);
    let mut client = session(cluster.device_addr);
    for index in 0..20 {
        let key = format!("key-{}", index % 4);
        client
            .update(
                &Request::Set {
                    key: key.as_bytes(),
                    value: b"v",
                }
                .to_bytes(),
            )
            .expect("SET completes");
    }
    client
        .bypass(&Request::Get { key: b"key-0" }.to_bytes())
        .expect("GET completes");
    let device = cluster.device_addr.to_string();
    for command in [
        &["set", "greeting", "hello"][..],
        &["get", "greeting"],
        &["get", "none"],
    ] {
        let mut list = vec!["client", "--device", &device];
        list.extend_from_slice(command);
        let (status, stdout, stderr) = run_pmnet(&args(&list), None);
        assert!(
            status.success(),
            "pmnet client {command:?}: {stdout}{stderr}"
        );
    }
    endpoints.push(("device".into(), metrics_of(cluster.device())));
    endpoints.push(("server".into(), metrics_of(cluster.server())));

    // The Redis gateway and adaptor in front of a real redis-server.
    let system = redis_harness::System::start_full(
        &["--cache", "--metrics", "127.0.0.1:0"],
        &["--device-cache", "--metrics", "127.0.0.1:0"],
        false,
    );
    let mut redis = system.gateway_client();
    for command in [
        &["SET", "a", "1"][..],
        &["GET", "a"],
        &["INCR", "n"],
        &["MSET", "b", "2", "c", "3"],
        &["GET", "missing"],
        &["PING"],
    ] {
        redis.command(command).expect("the gateway answers");
    }
    endpoints.push((
        "redis device".into(),
        metrics_of_harness(&system.device, "device"),
    ));
    endpoints.push((
        "gateway".into(),
        metrics_of_harness(&system.gateway, "gateway"),
    ));
    endpoints.push((
        "redis-adaptor".into(),
        metrics_of_harness(&system.adaptor, "adaptor"),
    ));

    // A memory node and a device coordinating it: a write and a read.
    let memnode_addr = free_udp_addr();
    let memnode = Node::start(
        "memnode",
        args(&[
            "memnode",
            "--listen",
            &memnode_addr.to_string(),
            "--lines",
            "64",
            "--file",
            &dir.path().join("node.lines").display().to_string(),
            "--metrics",
            "127.0.0.1:0",
            "--report-interval",
            "1",
        ]),
    );
    memnode.wait_metric("pmnet_memnode_member", "", "is a member", |v| v == 1.0);
    let abd_addr = free_udp_addr();
    let abd_device = Node::start(
        "abd device",
        args(&[
            "device",
            "--listen",
            &abd_addr.to_string(),
            "--abd-lines",
            "64",
            "--abd-node",
            &memnode_addr.to_string(),
            "--metrics",
            "127.0.0.1:0",
        ]),
    );
    let mut abd = AbdSession::open(AbdSessionConfig {
        mode: AbdMode::Device(abd_addr),
        lines: 64,
        keys: None,
    })
    .expect("a socket");
    abd.write(3, &[7u8; 64])
        .expect("the socket works")
        .expect("the line written");
    assert_eq!(
        abd.read(3, 1)
            .expect("the socket works")
            .expect("the line read"),
        vec![7u8; 64]
    );
    // Its report line is a memory node's own: membership, lines held, queries and stores.
    let report = common::poll_until("the memory node's report line", || {
        let stderr = memnode.proc.stderr();
        stderr
            .lines()
            .rev()
            .find(|line| line.contains(&format!("memnode {memnode_addr}: ")))
            .filter(|line| line.contains("lines held 1 of 64"))
            .map(str::to_owned)
            .ok_or(stderr)
    });
    for wanted in ["member (counts in quorums)", "queries ", "stores ", "acks "] {
        assert!(report.contains(wanted), "no {wanted:?} in {report}");
    }
    assert!(!report.contains("device"), "{report}");
    endpoints.push(("memnode".into(), metrics_of(&memnode)));
    endpoints.push(("abd device".into(), metrics_of(&abd_device)));

    // The chain store's controller (state in a file) and a member reporting to it.
    let controller_addr = free_udp_addr();
    let member_addr = free_udp_addr();
    let chain_controller = Node::start(
        "chain-controller",
        args(&[
            "chain-controller",
            "--listen",
            &controller_addr.to_string(),
            "--member",
            &member_addr.to_string(),
            "--chain-length",
            "1",
            "--groups",
            "2",
            "--state",
            &dir.path().join("chain.state").display().to_string(),
            "--metrics",
            "127.0.0.1:0",
            "--report-interval",
            "0",
        ]),
    );
    let member = chain_member(
        1,
        member_addr,
        &["--chain-controller".to_owned(), controller_addr.to_string()],
        dir.path(),
    );
    chain_controller.wait_metric(
        "pmnet_chain_controller_statuses_total",
        "",
        "a member's status",
        |v| v > 0.0,
    );
    endpoints.push(("chain-controller".into(), metrics_of(&chain_controller)));
    endpoints.push(("chain member".into(), metrics_of(&member)));

    // `pmnet controller` on a real etcd, where one is installed.
    let mut _etcd = None;
    let mut _controller = None;
    if on_path("etcd").is_some() {
        let etcd = pmnet_etcd::LocalEtcd::start(
            "etcd",
            &dir.path().join("etcd"),
            "127.0.0.1:0".parse().expect("address"),
            Duration::from_secs(30),
        )
        .expect("start etcd");
        let controller = Node::start(
            "controller",
            args(&[
                "controller",
                "--etcd",
                &etcd.endpoint().to_string(),
                "--cluster",
                "monitoring",
                "--listen",
                &free_udp_addr().to_string(),
                "--groups",
                "2",
                "--chain-length",
                "1",
                "--member",
                &free_udp_addr().to_string(),
                "--metrics",
                "127.0.0.1:0",
                "--report-interval",
                "0",
            ]),
        );
        endpoints.push(("controller".into(), metrics_of(&controller)));
        _etcd = Some(etcd);
        _controller = Some(controller);
    } else {
        assert!(
            std::env::var_os("CI").is_none(),
            "etcd is not installed, and CI must run this test: apt-get install -y etcd-server"
        );
        eprintln!("etcd is not installed: `pmnet controller` was not checked");
    }

    check_all(&promtool, &endpoints);
}

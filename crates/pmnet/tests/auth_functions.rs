//! Every in-network function under keys, with real processes: a write sent without the
//! deployment key — to the read cache, to an ABD coordinator, to a memory node — is dropped,
//! counted by reason and never applied, while the same write with the key is served. (The log
//! and the server: tests/auth.rs and crates/proto/tests/auth.rs; the chain store:
//! tests/chain_auth.rs.)

mod common;

use common::{args, device_args, free_udp_addr, poll_until, run_pmnet, server_args, Node};

const LINES: u32 = 64;

fn keygen(dir: &std::path::Path) -> String {
    let path = dir.join("pmnet.key").display().to_string();
    let (status, _, stderr) = run_pmnet(&args(&["keygen", "--out", &path]), None);
    assert!(status.success(), "{stderr}");
    path
}

/// Wait until `node` counts a datagram dropped for `reason` on its PMNet port, under the
/// metric `metric` (`pmnet_device_dropped_total`; a memory node's own name for it).
fn wait_dropped_as(node: &Node, metric: &str, reason: &str) {
    node.wait_metrics_line(&format!("counts a datagram dropped as {reason}"), |line| {
        line.starts_with(&format!("{metric}{{"))
            && line.contains(&format!("reason=\"{reason}\""))
            && line
                .rsplit(' ')
                .next()
                .and_then(|value| value.parse::<f64>().ok())
                .is_some_and(|value| value >= 1.0)
    });
}

/// Wait until a device (or server) counts a datagram dropped for `reason`.
fn wait_dropped(node: &Node, reason: &str) {
    wait_dropped_as(node, "pmnet_device_dropped_total", reason)
}

#[test]
fn the_read_cache_drops_an_unkeyed_write_and_serves_the_keyed_ones() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let key = keygen(dir.path());
    let device_addr = free_udp_addr();
    let mut server = server_args(
        free_udp_addr(),
        device_addr,
        &dir.path().join("s.data"),
        None,
    );
    server.extend(args(&["--key-file", &key]));
    let server = Node::start("server", server);
    let mut device = device_args(device_addr, server.addr, &dir.path().join("d.log"));
    device.extend(args(&["--cache", "--key-file", &key]));
    let device = Node::start("device", device);
    assert!(
        device.banner.iter().any(|line| line.contains("cache: on")),
        "{:?}",
        device.banner
    );
    let to = device_addr.to_string();
    let client = |key_file: Option<&str>, request: &[&str]| {
        let mut list = vec!["client", "--to", &to, "--request-lifetime", "1"];
        if let Some(path) = key_file {
            list.extend(["--key-file", path]);
        }
        list.extend_from_slice(request);
        run_pmnet(&args(&list), None)
    };
    let (status, stdout, stderr) = client(Some(&key), &["set", "hot", "real"]);
    assert!(status.success(), "{stdout}{stderr}");
    let (status, _, _) = client(None, &["set", "hot", "forged"]);
    assert!(!status.success());
    wait_dropped(&device, "unauthenticated");
    poll_until("the keyed value, not the forged one", || {
        let (_, stdout, stderr) = client(Some(&key), &["get", "hot"]);
        if stdout.trim().starts_with("real (from ") {
            Ok(())
        } else {
            Err(format!("{stdout}{stderr}"))
        }
    });
}

fn memnode(dir: &std::path::Path, key: &str) -> Node {
    Node::start(
        "memnode",
        args(&[
            "memnode",
            "--listen",
            &free_udp_addr().to_string(),
            "--lines",
            &LINES.to_string(),
            "--file",
            &dir.join("node.lines").display().to_string(),
            "--metrics",
            "127.0.0.1:0",
            "--report-interval",
            "0",
            "--key-file",
            key,
        ]),
    )
}

/// `pmnet memory` through `route` (`--device ADDR` or `--node ADDR`), with `key_file` if
/// given: (success, stdout, stderr).
fn memory(route: &[&str], key_file: Option<&str>, command: &[&str]) -> (bool, String, String) {
    let lines = LINES.to_string();
    let mut list = vec!["memory", "--lines", &lines];
    list.extend_from_slice(route);
    if let Some(path) = key_file {
        list.extend(["--key-file", path]);
    }
    list.extend_from_slice(command);
    let (status, stdout, stderr) = run_pmnet(&args(&list), None);
    (status.success(), stdout, stderr)
}

#[test]
fn a_memory_node_and_an_abd_coordinator_drop_unkeyed_writes_and_serve_keyed_ones() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let key = keygen(dir.path());
    let node = memnode(dir.path(), &key);
    node.wait_metric("pmnet_memnode_member", "", "is a member", |v| v == 1.0);
    let node_addr = node.addr.to_string();
    let device_addr = free_udp_addr();
    let device = Node::start(
        "device",
        args(&[
            "device",
            "--listen",
            &device_addr.to_string(),
            "--abd-lines",
            &LINES.to_string(),
            "--abd-node",
            &node_addr,
            "--metrics",
            "127.0.0.1:0",
            "--key-file",
            &key,
        ]),
    );
    let direct = ["--node", node_addr.as_str()];
    let device_route = device_addr.to_string();
    let coordinated = ["--device", device_route.as_str()];

    // With the key, both ways in are served.
    let (ok, out, err) = memory(&direct, Some(&key), &["write", "3", "real"]);
    assert!(ok, "{out}{err}");
    let (ok, out, err) = memory(&coordinated, Some(&key), &["write", "5", "real"]);
    assert!(ok, "{out}{err}");

    // Without it: the memory node drops the client-driven write, the coordinator the one it
    // would coordinate; each counts it by reason.
    let (ok, out, err) = memory(&direct, None, &["write", "3", "forged"]);
    assert!(!ok, "{out}{err}");
    wait_dropped_as(
        &node,
        "pmnet_memnode_datagrams_dropped_total",
        "unauthenticated",
    );
    let (ok, out, err) = memory(&coordinated, None, &["write", "5", "forged"]);
    assert!(!ok, "{out}{err}");
    assert!(err.contains("--key-file"), "says what to check: {err}");
    wait_dropped(&device, "unauthenticated");

    // Neither write landed.
    for (route, line) in [(&direct, "3"), (&coordinated, "5")] {
        let (ok, out, err) = memory(route, Some(&key), &["read", line]);
        assert!(ok && out.contains("\"real\""), "line {line}: {out}{err}");
    }
}

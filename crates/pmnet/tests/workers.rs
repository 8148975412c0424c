//! A device run as several workers (`pmnet device --workers N`), started as docs/benchmarks.md
//! and the device's banner tell a user: every worker's address to the clients and the server.

mod common;

use std::net::{SocketAddr, UdpSocket};

use common::{args, device_args, poll_until, run_pmnet, server_args, Node};

/// A port `p` on 127.0.0.1 with `p` and `p + 1` free a moment ago.
fn two_free_ports() -> SocketAddr {
    loop {
        let first = UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = first.local_addr().unwrap();
        let Some(next) = addr.port().checked_add(1) else {
            continue;
        };
        if UdpSocket::bind(("127.0.0.1", next)).is_ok() {
            return addr;
        }
    }
}

#[test]
fn two_workers_serve_every_session_and_a_smaller_restart_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let first = two_free_ports();
    let second = SocketAddr::from(([127, 0, 0, 1], first.port() + 1));
    let server_addr = common::free_udp_addr();
    let mut server_args = server_args(server_addr, first, &dir.path().join("s.data"), None);
    server_args.extend(args(&["--device", &second.to_string()]));
    let mut server = Node::start("server", server_args);
    let log = dir.path().join("d.log");
    let mut device_args = device_args(first, server_addr, &log);
    device_args.extend(args(&["--workers", "2"]));
    let mut device = Node::start("device", device_args.clone());
    assert!(
        device.banner.iter().any(|line| line.contains("workers: 2")
            && line.contains(&first.to_string())
            && line.contains(&second.to_string())),
        "{:?}",
        device.banner
    );
    let logs: Vec<String> = device
        .banner
        .iter()
        .filter(|line| line.trim_start().starts_with("log: "))
        .cloned()
        .collect();
    assert_eq!(logs.len(), 2, "a log per worker: {logs:?}");
    assert!(log.exists() && pmnet_runtime::worker_log_path(&log, 1).exists());

    // Every session, whichever worker it went to, is acked and applied.
    let to = format!("{first},{second}");
    for index in 0..8 {
        let (status, stdout, stderr) = run_pmnet(
            &args(&["client", "--device", &to, "set", &format!("k{index}"), "v"]),
            None,
        );
        assert!(
            status.success() && stdout.contains("durable"),
            "{stdout}{stderr}"
        );
    }
    for index in 0..8 {
        poll_until(&format!("k{index} applied"), || {
            let (_, stdout, stderr) = run_pmnet(
                &args(&["client", "--device", &to, "get", &format!("k{index}")]),
                None,
            );
            if stdout.trim() == "v (from server 1)" {
                Ok(())
            } else {
                Err(format!("{stdout}{stderr}"))
            }
        });
    }

    // Started again with fewer workers, the device would leave worker 1's log unreplayed:
    // refused, naming the log and the worker count to use.
    device.proc.stop();
    server.proc.stop();
    let mut fewer = device_args.clone();
    fewer.truncate(fewer.len() - 2);
    let (status, _, stderr) = run_pmnet(&fewer, None);
    assert!(!status.success(), "{stderr}");
    assert!(
        stderr.contains(
            &pmnet_runtime::worker_log_path(&log, 1)
                .display()
                .to_string()
        ) && stderr.contains("--workers 2"),
        "{stderr}"
    );
}

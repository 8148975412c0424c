//! Logging: `-vv` turns on trace events for single datagrams, each carrying the span of the
//! process that logged it (`device{id=1}`); by default none is logged. Real processes; the
//! test waits (with a generous deadline) for the lines on stderr.

mod common;

use common::{args, device_args, free_udp_addr, poll_until, Node};

#[test]
fn a_device_at_trace_level_logs_each_datagram_in_its_span() {
    let dir = tempfile::tempdir().unwrap();
    let server_addr = free_udp_addr();
    let device_addr = free_udp_addr();
    // A server to verify: a device acks nothing for a server that never answered it.
    let _server = Node::start(
        "server",
        common::server_args(server_addr, device_addr, &dir.path().join("s.data"), None),
    );
    let mut traced = vec!["-vv".to_owned()];
    traced.extend(device_args(
        device_addr,
        server_addr,
        &dir.path().join("device.log"),
    ));
    let device = Node::start("device", traced);
    let quiet_addr = free_udp_addr();
    let quiet = Node::start(
        "quiet device",
        device_args(quiet_addr, server_addr, &dir.path().join("quiet.log")),
    );
    for addr in [device_addr, quiet_addr] {
        let (status, stdout, stderr) = common::run_pmnet(
            &args(&["client", "--device", &addr.to_string(), "set", "k", "v"]),
            None,
        );
        assert!(status.success(), "stdout: {stdout}\nstderr: {stderr}");
    }
    let has_line = |text: &str, words: &[&str]| {
        text.lines()
            .any(|line| words.iter().all(|word| line.contains(word)))
    };
    poll_until("the device's trace lines", || {
        let stderr = device.proc.stderr();
        if has_line(
            &stderr,
            &["TRACE", "device{id=1}", "datagram received", "kind=update"],
        ) && has_line(&stderr, &["TRACE", "device{id=1}", "PMNet-ACK sent"])
            && has_line(&stderr, &["TRACE", "device{id=1}", "request sent on"])
        {
            Ok(())
        } else {
            Err(stderr)
        }
    });
    // The device without -vv acked the client (it succeeded) and logged no datagram.
    let stderr = quiet.proc.stderr();
    assert!(!stderr.contains("TRACE"), "{stderr}");
    assert!(!stderr.contains("datagram received"), "{stderr}");
}

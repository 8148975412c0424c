//! The storage rack the read cache is measured against: servers of an emulated capacity
//! (`pmnet server --max-ops-per-s`), with real processes (`pmnet bench --servers` runs a rack:
//! crates/bench/tests/rack_bench.rs).
//!
//! Nothing here depends on speed: the tests check what was applied and what was said, never
//! how fast.

mod common;

use common::{args, device_args, free_udp_addr, run_pmnet, server_args, Node};
use pmnet_proto::{ClientEvent, Completion};
use pmnet_store::{Reply, Request};

/// Run `pmnet ARGS`, which must fail with a message containing every one of `hints`.
fn must_fail(list: &[&str], hints: &[&str]) {
    let (status, stdout, stderr) = run_pmnet(&args(list), None);
    let shown = format!("pmnet {}", list.join(" "));
    assert!(!status.success(), "{shown} succeeded\n{stdout}\n{stderr}");
    assert!(!stderr.contains("panicked"), "{shown} panicked:\n{stderr}");
    for hint in hints {
        assert!(stderr.contains(hint), "{shown}: no {hint:?} in:\n{stderr}");
    }
}

#[test]
fn a_server_of_limited_capacity_applies_every_acked_update() {
    let dir = tempfile::tempdir().unwrap();
    let device_addr = free_udp_addr();
    let mut server_list = server_args(
        "127.0.0.1:0".parse().unwrap(),
        device_addr,
        &dir.path().join("server.data"),
        None,
    );
    server_list.extend(args(&["--max-ops-per-s", "200"]));
    let server = Node::start("server", server_list);
    assert!(
        server.banner.iter().any(|line| line
            .contains("capacity: at most 200 requests/s (emulated, as NetCache's evaluation")),
        "{:?}",
        server.banner
    );
    let device = Node::start(
        "device",
        device_args(device_addr, server.addr, &dir.path().join("device.log")),
    );

    // 300 updates, 32 in flight: more than the server takes in a second and a half, so most
    // of them wait in its socket for tokens while the device has acked them.
    let mut options = pmnet_runtime::SessionOptions::new(1, device.addr);
    options.window = Some(32);
    let mut session = pmnet_runtime::ClientSession::open(options).expect("a session");
    let count = 300u32;
    let mut next = 0u32;
    let mut completed = 0u32;
    while completed < count {
        while next < count && session.can_send() {
            let request = Request::Set {
                key: format!("key{next}").as_bytes(),
                value: format!("value{next}").as_bytes(),
            }
            .to_bytes();
            session.start_update(&request).expect("the update starts");
            next += 1;
        }
        match session.next_event(None) {
            Some(ClientEvent::Completed { completion, .. }) => {
                assert!(
                    matches!(completion, Completion::Logged { .. }),
                    "{completion:?}"
                );
                completed += 1;
            }
            Some(ClientEvent::Failed { seq, error, .. }) => panic!("update {seq}: {error}"),
            None => {}
        }
    }
    // A read on the same session is applied after every update of it: it waits for the
    // limited server to take them all.
    let read = Request::Get {
        key: format!("key{}", count - 1).as_bytes(),
    }
    .to_bytes();
    match session.bypass(&read).expect("the read completes") {
        Completion::Replied { reply, .. } => assert_eq!(
            Reply::decode(&reply).unwrap(),
            Reply::Value(format!("value{}", count - 1).into_bytes())
        ),
        other => panic!("{other:?}"),
    }
    device.wait_metric(
        "pmnet_device_log_live_entries",
        "",
        "to drop to 0 (the server acked everything)",
        |value| value == 0.0,
    );
    server.wait_metric(
        "pmnet_server_capacity_max_ops_per_s",
        "",
        "to say the capacity",
        |value| value == 200.0,
    );
    let mut server = server;
    server.proc.stop();
    common::assert_no_panic(&server.proc);
    assert!(
        server.proc.stderr().contains("(emulated"),
        "the last report line says the capacity is emulated:\n{}",
        server.proc.stderr()
    );
    let store = common::StoredData::open(&dir.path().join("server.data"));
    for index in 0..count {
        assert_eq!(
            store.get(format!("key{index}").as_bytes()),
            Some(format!("value{index}").into_bytes()),
            "key{index}"
        );
    }
    // Every update and the read applied once: the session's record ends at count + 1.
    let record = store
        .sessions()
        .into_iter()
        .find(|record| record.session_id == session.session_id())
        .expect("the session's record");
    assert_eq!(record.last_seq, count + 1);
}

#[test]
fn capacities_out_of_range_are_refused() {
    must_fail(
        &["server", "--max-ops-per-s", "0"],
        &["out of range", "1 to 100000000"],
    );
    must_fail(
        &["server", "--max-ops-per-s", "1000000000000"],
        &["out of range"],
    );
    must_fail(
        &["server", "--max-ops-per-s", "fast"],
        &["not a whole number"],
    );
}

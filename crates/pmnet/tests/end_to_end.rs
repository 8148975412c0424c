//! "Run it for real": real `pmnet device` and `pmnet server` processes on loopback, driven by
//! the `pmnet client` command and by client sessions of the runtime library.
//!
//! Nothing here depends on speed: every wait polls for a condition (a banner line, a metric, a
//! reply) with a generous deadline and fails with a message saying what it waited for.

mod common;

use std::net::{SocketAddr, UdpSocket};

use common::{args, poll_until, run_pmnet, session, Cluster, Node, Proc};
use pmnet_proto::Completion;
use pmnet_store::{Reply, Request};
use pmnet_wire::{Header, Packet, PacketType, HEADER_LEN};

fn client(peer: SocketAddr, request: &[&str]) -> (bool, String, String) {
    let mut list = vec!["client".to_owned(), "--device".to_owned(), peer.to_string()];
    list.extend(request.iter().map(|word| (*word).to_owned()));
    let (status, stdout, stderr) = run_pmnet(&list, None);
    assert!(
        !stderr.contains("panicked"),
        "pmnet {} panicked:\n{stderr}",
        list.join(" ")
    );
    (status.success(), stdout.trim().to_owned(), stderr)
}

/// The value `GET key` returns when sent as a bypass request on `session`.
fn get(session: &mut pmnet_runtime::ClientSession, key: &str) -> Option<Vec<u8>> {
    let payload = Request::Get {
        key: key.as_bytes(),
    }
    .to_bytes();
    match session.bypass(&payload).expect("GET completes") {
        Completion::Replied { reply, .. } => match Reply::decode(&reply).expect("a reply") {
            Reply::Value(value) => Some(value),
            Reply::NotFound => None,
            other => panic!("GET {key}: unexpected reply {other:?}"),
        },
        other => panic!("GET {key}: a bypass request completed with {other:?}"),
    }
}

fn append(key: &str, value: &str) -> Vec<u8> {
    Request::Append {
        key: key.as_bytes(),
        value: value.as_bytes(),
    }
    .to_bytes()
}

/// `"1,2,…,n,"`: the history of appends 1..=n.
fn history(range: std::ops::RangeInclusive<u32>) -> String {
    range.map(|n| format!("{n},")).collect()
}

#[test]
fn sets_are_acked_by_the_device_and_reach_the_store() {
    let mut cluster = Cluster::start();
    let device = cluster.device_addr;
    let server = cluster.server_addr;
    assert!(
        cluster
            .device()
            .banner
            .iter()
            .any(|line| line.contains("1024 slots")),
        "{:?}",
        cluster.device().banner
    );

    // The command: acked by the device as soon as the request is in its log.
    let (ok, out, err) = client(device, &["set", "greeting", "hello"]);
    assert!(ok, "set failed: {out}\n{err}");
    assert!(
        out.starts_with("OK (durable in the log of device 1"),
        "{out}"
    );
    // Another session is not ordered after that set: wait until the server applied it.
    for peer in [device, server] {
        poll_until(&format!("GET greeting via {peer} to return hello"), || {
            let (ok, out, err) = client(peer, &["get", "greeting"]);
            match (ok, out.as_str()) {
                (true, "hello (from server 1)") => Ok(()),
                _ => Err(format!("{out} {err}")),
            }
        });
    }

    // Many updates from one session: every one acked by the device (the PMNet-ACK leaves as
    // soon as the log write is durable, before the server could have replied).
    let mut s = session(device);
    let count: u32 = 200;
    for i in 0..count {
        let payload = Request::Set {
            key: format!("key{i}").as_bytes(),
            value: format!("value{i}").as_bytes(),
        }
        .to_bytes();
        match s.update(&payload) {
            Ok(Completion::Logged { device_id: 1 }) => {}
            other => panic!("SET key{i}: {other:?}"),
        }
    }
    // A bypass read on the same session is ordered after its updates.
    assert_eq!(
        get(&mut s, &format!("key{}", count - 1)).as_deref(),
        Some(format!("value{}", count - 1).as_bytes())
    );
    // Straight to the server, bypassing the device.
    let mut direct = session(server);
    for i in [0, count / 2, count - 1] {
        assert_eq!(
            get(&mut direct, &format!("key{i}")).as_deref(),
            Some(format!("value{i}").as_bytes())
        );
    }
    // Every ack was sent before its SET completed, and a scrape reads the counters as of the
    // device loop's next turn: the first look shows them all (polled all the same).
    cluster.device().wait_metric(
        "pmnet_device_pmnet_acks_sent_total",
        r#"port="pmnet""#,
        "to count every ack",
        |value| value >= f64::from(count + 1),
    );
    cluster.device().wait_metric(
        "pmnet_device_log_live_entries",
        "",
        "to drop to 0 (the server acked everything)",
        |value| value == 0.0,
    );

    // A clean stop, then the data file itself holds everything.
    cluster.stop_server();
    let store = cluster.open_store();
    assert_eq!(store.get(b"greeting"), Some(b"hello".to_vec()));
    for i in 0..count {
        assert_eq!(
            store.get(format!("key{i}").as_bytes()),
            Some(format!("value{i}").into_bytes()),
            "key{i}"
        );
    }
    assert_eq!(store.len(), count as usize + 1);
    assert_eq!(store.recovery_problem(), None);
    let record = store
        .sessions()
        .into_iter()
        .find(|record| record.session_id == s.session_id())
        .expect("the session's record");
    assert_eq!(record.last_seq, count + 1, "{count} updates and a GET");
    cluster.stop_device();
}

#[test]
fn a_killed_server_gets_the_logged_updates_replayed_exactly_once() {
    let mut cluster = Cluster::start();
    let device = cluster.device_addr;
    let mut a = session(device);
    let mut b = session(device);

    // Some history while everything runs.
    for n in 1..=10 {
        assert!(matches!(
            a.update(&append("a", &format!("{n},"))),
            Ok(Completion::Logged { .. })
        ));
    }
    assert_eq!(
        get(&mut a, "a").as_deref(),
        Some(history(1..=10).as_bytes())
    );
    cluster.device().wait_metric(
        "pmnet_device_log_live_entries",
        "",
        "to drop to 0 before the crash",
        |value| value == 0.0,
    );

    // The server crashes; the device keeps acking updates: they are in its log.
    cluster.kill_server();
    // Few enough that the hashed log slots (1024) cannot collide in practice: a collision
    // would forward the update without logging (and without an ack) while the server is down.
    let down = 30u32;
    for n in 1..=down {
        for (s, key, n) in [(&mut a, "a", n + 10), (&mut b, "b", n)] {
            match s.update(&append(key, &format!("{n},"))) {
                Ok(Completion::Logged { device_id: 1 }) => {}
                other => panic!("APPEND {key} {n} with the server down: {other:?}"),
            }
        }
    }
    cluster.device().wait_metric(
        "pmnet_device_log_live_entries",
        "",
        "to hold every update sent while the server was down",
        |value| value == f64::from(2 * down),
    );

    // The restarted server polls the device and applies each logged update once, in order.
    cluster.start_server();
    assert_eq!(
        get(&mut a, "a").as_deref(),
        Some(history(1..=10 + down).as_bytes())
    );
    assert_eq!(
        get(&mut b, "b").as_deref(),
        Some(history(1..=down).as_bytes())
    );
    cluster.device().wait_metric(
        "pmnet_device_log_live_entries",
        "",
        "to drop to 0 after the replay",
        |value| value == 0.0,
    );
    cluster
        .server()
        .wait_metric("pmnet_server_recovering", "", "to be 0", |value| {
            value == 0.0
        });

    // Crash it again with nothing pending: a restart applies nothing twice.
    cluster.kill_server();
    cluster.start_server();
    assert_eq!(
        get(&mut a, "a").as_deref(),
        Some(history(1..=10 + down).as_bytes())
    );
    assert_eq!(
        get(&mut b, "b").as_deref(),
        Some(history(1..=down).as_bytes())
    );

    cluster.stop_server();
    let store = cluster.open_store();
    assert_eq!(store.get(b"a"), Some(history(1..=10 + down).into_bytes()));
    assert_eq!(store.get(b"b"), Some(history(1..=down).into_bytes()));
    let sessions = store.sessions();
    let last_seq = |id: u64| {
        sessions
            .iter()
            .find(|record| record.session_id == id)
            .map(|record| record.last_seq)
    };
    // a: 10 appends, a GET, 30 appends, two GETs; b: 30 appends and two GETs.
    assert_eq!(last_seq(a.session_id()), Some(10 + 1 + down + 2));
    assert_eq!(last_seq(b.session_id()), Some(down + 2));
}

/// A valid update request datagram of session 7 for `server_id`.
fn update_datagram(server_id: u16, seq: u32) -> Vec<u8> {
    Header::new(PacketType::UpdateRequest, server_id, 7, seq).encode(&append("x", "1,"))
}

/// Recompute the CRC of a datagram whose header was edited.
fn fix_crc(datagram: &mut [u8]) {
    let crc = Packet::new_unchecked(&*datagram).compute_crc();
    datagram[28..32].copy_from_slice(&crc.to_be_bytes());
}

#[test]
fn bad_datagrams_are_counted_by_reason_and_dropped() {
    let mut cluster = Cluster::start();
    let device = cluster.device_addr;
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();

    let valid = update_datagram(1, 1);
    let edited = |edit: &dyn Fn(&mut Vec<u8>), recompute_crc: bool| {
        let mut datagram = valid.clone();
        edit(&mut datagram);
        if recompute_crc {
            fix_crc(&mut datagram);
        }
        datagram
    };
    let cases: Vec<(&str, Vec<u8>)> = vec![
        // Short garbage that does not start with the magic is reported as such.
        ("bad_magic", b"hello".to_vec()),
        ("truncated", b"PN\x01\x01".to_vec()),
        // The header says more payload follows than there is.
        ("truncated", edited(&|d| d.truncate(HEADER_LEN + 3), false)),
        ("bad_magic", edited(&|d| d[0] = b'X', false)),
        ("unsupported_version", edited(&|d| d[2] = 2, true)),
        ("trailing_bytes", edited(&|d| d.push(0), false)),
        (
            "bad_checksum",
            edited(&|d| *d.last_mut().unwrap() ^= 1, false),
        ),
        // 0x1F: in the read cache's range, not assigned.
        ("unknown_type", edited(&|d| d[3] = 0x1F, true)),
        // 0x10, a cache read, whose payload is no read descriptor.
        ("bad_cache_read", edited(&|d| d[3] = 0x10, true)),
        ("bad_fragment", edited(&|d| d[22..24].fill(0), true)),
        ("unknown_server", update_datagram(9, 1)),
        // A server-ACK from the client's address, not from the server it names.
        (
            "unexpected_source",
            Header::new(PacketType::ServerAck, 1, 7, 1).encode(&[0]),
        ),
    ];

    let rounds = 3;
    for _ in 0..rounds {
        for (_, datagram) in &cases {
            socket.send_to(datagram, device).unwrap();
        }
    }
    let mut expected: Vec<(&str, f64)> = Vec::new();
    for (reason, _) in &cases {
        match expected.iter_mut().find(|(known, _)| known == reason) {
            Some((_, count)) => *count += f64::from(rounds),
            None => expected.push((reason, f64::from(rounds))),
        }
    }
    for (reason, count) in &expected {
        cluster.device().wait_metric(
            "pmnet_device_dropped_total",
            &format!(r#"port="pmnet",reason="{reason}""#),
            &format!("to be {count}"),
            |value| value == *count,
        );
    }
    // Nothing was logged or forwarded from all that.
    assert_eq!(
        cluster
            .device()
            .metric("pmnet_device_updates_logged_total", r#"port="pmnet""#),
        Ok(0.0)
    );

    // The server drops garbage too, and counts it.
    socket.send_to(b"PN", cluster.server_addr).unwrap();
    cluster.server().wait_metric(
        "pmnet_server_dropped_total",
        r#"reason="truncated""#,
        "to be 1",
        |value| value == 1.0,
    );

    // Both keep serving.
    let mut s = session(device);
    assert!(matches!(
        s.update(&append("after", "ok")),
        Ok(Completion::Logged { device_id: 1 })
    ));
    assert_eq!(get(&mut s, "after").as_deref(), Some(&b"ok"[..]));
    cluster.stop_device();
    cluster.stop_server();
}

#[test]
fn the_client_command_reads_requests_from_stdin() {
    let cluster = Cluster::start();
    let (status, out, err) = run_pmnet(
        &args(&["client", "--device", &cluster.device_addr.to_string()]),
        Some("set colour blue\nget colour\nincr n 5\nincr n -2\ndel colour\nget colour\nquit\n"),
    );
    assert!(status.success(), "{out}\n{err}");
    assert!(!err.contains("panicked"), "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 6, "{out}");
    assert!(
        lines[0].starts_with("OK (durable in the log of device 1"),
        "{out}"
    );
    assert_eq!(lines[1], "blue (from server 1)");
    assert_eq!(lines[2], "(integer) 5");
    assert_eq!(lines[3], "(integer) 3");
    assert!(lines[4].starts_with("OK (durable in the log") || lines[4] == "(deleted 1)");
    assert_eq!(lines[5], "(not found) (from server 1)");
}

#[test]
fn a_device_starts_from_a_configuration_file() {
    let cluster = Cluster::start();
    let dir = tempfile::tempdir().unwrap();
    let log_file = dir.path().join("from-config.log");
    let config = dir.path().join("pmnet.toml");
    std::fs::write(
        &config,
        format!(
            "[device]\nlisten = \"127.0.0.1:0\"\nserver = [\"1={server}\"]\nlog-file = \
             \"{log}\"\nslots = 2048\ndevice-id = 5\nmetrics = \"127.0.0.1:0\"\n\
             report-interval = 0\n\n[server]\nlisten = \"ignored: another table\"\n",
            server = cluster.server_addr,
            log = log_file.display()
        ),
    )
    .unwrap();
    // The command line wins over the file: 512 slots, not 2048.
    let node = Node::start(
        "device from a configuration file",
        args(&[
            "--config",
            &config.display().to_string(),
            "device",
            "--slots",
            "512",
        ]),
    );
    let banner = node.banner.join("\n");
    assert!(
        banner.contains("pmnet device 5 listening on 127.0.0.1:"),
        "{banner}"
    );
    assert!(
        banner.contains(&format!("servers: 1={}", cluster.server_addr)),
        "{banner}"
    );
    assert!(banner.contains(&log_file.display().to_string()), "{banner}");
    assert!(banner.contains("512 slots"), "{banner}");
    assert!(log_file.exists());

    // It works: a set through it is acked by device 5 (the server answers it too, though it
    // does not poll this device at start-up).
    let (ok, out, err) = client(node.addr, &["set", "via", "config"]);
    assert!(ok, "{out}\n{err}");
    assert!(
        out.starts_with("OK (durable in the log of device 5"),
        "{out}"
    );
    node.wait_metric(
        "pmnet_device_log_live_entries",
        "",
        "to drop to 0",
        |value| value == 0.0,
    );
    drop(node);
}

/// Run `pmnet ARGS`, which must fail: non-zero status, a message on stderr containing every
/// one of `hints`, and no panic.
fn must_fail(list: &[&str], hints: &[&str]) {
    let (status, stdout, stderr) = run_pmnet(&args(list), None);
    let shown = format!("pmnet {}", list.join(" "));
    assert!(
        !status.success(),
        "{shown} succeeded\nstdout: {stdout}\nstderr: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "{shown} panicked:\n{stderr}");
    for hint in hints {
        assert!(
            stderr.contains(hint),
            "{shown}: stderr does not mention {hint:?}:\n{stderr}"
        );
    }
}

#[test]
fn bad_command_lines_fail_with_a_helpful_message() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-directory");
    let log_in_missing = missing.join("device.log").display().to_string();
    let data_in_missing = missing.join("server.data").display().to_string();
    let local = "127.0.0.1:0";

    must_fail(&["device", "--server", "nonsense"], &["ID=ADDR"]);
    must_fail(&["device", "--server", "x=127.0.0.1:7500"], &["server id"]);
    must_fail(&["device", "--server", "1=localhost"], &["IP:PORT"]);
    must_fail(&["device", "--listen", local], &["--server"]);
    must_fail(
        &[
            "device",
            "--listen",
            local,
            "--server",
            "1=127.0.0.1:7500",
            "--log-file",
            &log_in_missing,
        ],
        &[&log_in_missing],
    );
    must_fail(
        &[
            "device",
            "--listen",
            local,
            "--server",
            "1=127.0.0.1:7500",
            "--server",
            "1=127.0.0.1:7501",
            "--log-file",
            &dir.path().join("dup.log").display().to_string(),
        ],
        &["given twice"],
    );
    must_fail(
        &[
            "device",
            "--listen",
            local,
            "--server",
            "1=127.0.0.1:7500",
            "--slots",
            "0",
            "--log-file",
            &dir.path().join("zero.log").display().to_string(),
        ],
        &["zero.log"],
    );
    must_fail(
        &[
            "device",
            "--listen",
            "999.0.0.1:7400",
            "--server",
            "1=127.0.0.1:7500",
        ],
        &["999.0.0.1:7400"],
    );
    must_fail(
        &[
            "server",
            "--listen",
            local,
            "--device",
            "127.0.0.1:7400",
            "--data-file",
            &data_in_missing,
        ],
        &[&data_in_missing],
    );
    // A port in use.
    let taken = UdpSocket::bind("127.0.0.1:0").unwrap();
    let taken_addr = taken.local_addr().unwrap().to_string();
    must_fail(
        &[
            "server",
            "--listen",
            &taken_addr,
            "--data-file",
            &dir.path().join("taken.data").display().to_string(),
        ],
        &[&taken_addr],
    );
    must_fail(&["client", "--device", local, "set", "k"], &["VALUE"]);
    must_fail(
        &["client", "--device", "127.0.0.1:7400", "incr", "k", "x"],
        &["x"],
    );
    must_fail(&["frobnicate"], &["frobnicate"]);
    let missing_config = dir.path().join("missing.toml").display().to_string();
    must_fail(
        &["--config", &missing_config, "device"],
        &["cannot read the configuration file", &missing_config],
    );
    let bad_config = dir.path().join("bad.toml");
    std::fs::write(&bad_config, "[device\nlisten = 3").unwrap();
    let bad_config = bad_config.display().to_string();
    must_fail(&["--config", &bad_config, "device"], &["not valid TOML"]);
    let wrong_option = dir.path().join("wrong.toml");
    std::fs::write(
        &wrong_option,
        "[device]\nserver = [\"1=127.0.0.1:7500\"]\nno-such-option = 1\n",
    )
    .unwrap();
    let wrong_option = wrong_option.display().to_string();
    must_fail(
        &["--config", &wrong_option, "device"],
        &["no-such-option", &wrong_option],
    );

    // A device whose server is not running still starts (and says so on request); the
    // process guard kills it.
    let _alive: Proc = Node::start(
        "device without a server",
        args(&[
            "device",
            "--listen",
            local,
            "--server",
            "1=127.0.0.1:9",
            "--log-file",
            &dir.path().join("ok.log").display().to_string(),
            "--report-interval",
            "0",
        ]),
    )
    .proc;
}

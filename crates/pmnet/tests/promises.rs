//! An ack is a promise, with real processes started as the README shows: a client that gave up
//! and left does not strand the writes acked after it, a full store loses nothing, and
//! hostile datagrams cost the server no more than they carry.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, UdpSocket};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use common::{args, free_udp_addr, pmnet_bin, poll_until, run_pmnet, seed, Node, PATIENCE};
use pmnet_wire::{Header, PacketType};

fn s(text: impl ToString) -> String {
    text.to_string()
}

/// `pmnet client` at its prompt: one session for every line typed.
struct Prompt {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
}

impl Prompt {
    fn start(device: SocketAddr, extra: &[&str]) -> Prompt {
        let mut command = Command::new(pmnet_bin());
        command
            .args(["client", "--device", &device.to_string()])
            .args(extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let mut child = command.spawn().expect("start pmnet client");
        let stdin = child.stdin.take().expect("piped stdin");
        let out = child.stdout.take().expect("piped stdout");
        let (sender, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        Prompt {
            child,
            stdin,
            lines,
        }
    }

    /// Type `line` and return the answer (the next line printed).
    fn ask(&mut self, line: &str) -> String {
        writeln!(self.stdin, "{line}").expect("write to the client");
        self.stdin.flush().expect("flush");
        self.lines
            .recv_timeout(PATIENCE)
            .unwrap_or_else(|_| panic!("no answer to {line:?} within {PATIENCE:?}"))
    }
}

impl Drop for Prompt {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `common::device_args` with a log of `slots` slots.
fn device_args(
    listen: SocketAddr,
    server: SocketAddr,
    log: &std::path::Path,
    slots: u32,
) -> Vec<String> {
    let mut list = common::device_args(listen, server, log);
    let at = list
        .iter()
        .position(|arg| arg == "--slots")
        .expect("--slots");
    list[at + 1] = s(slots);
    list
}

/// A server on a free port with no device in front of it, its store in `dir`.
fn lone_server(dir: &std::path::Path) -> Node {
    Node::start(
        "server",
        server_args(
            "127.0.0.1:0".parse().expect("address"),
            "0.0.0.0:0".parse().expect("no device"),
            &dir.join("s.data"),
        ),
    )
}

/// `common::server_args` (default engine); a device at port 0 means none (no `--device`).
fn server_args(listen: SocketAddr, device: SocketAddr, data: &std::path::Path) -> Vec<String> {
    let mut list = common::server_args(listen, device, data, None);
    if device.port() == 0 {
        let at = list
            .iter()
            .position(|arg| arg == "--device")
            .expect("--device");
        list.drain(at..at + 2);
    }
    list
}

fn get(device: SocketAddr, key: &str) -> String {
    let (status, stdout, stderr) = run_pmnet(
        &args(&["client", "--device", &device.to_string(), "get", key]),
        None,
    );
    assert!(status.success(), "get {key}: {stdout} {stderr}");
    // No cache in these devices: the server answers every read, and the line says so.
    stdout
        .trim()
        .strip_suffix(" (from server 1)")
        .unwrap_or_else(|| panic!("get {key}: not the server's answer: {stdout}"))
        .to_owned()
}

#[test]
fn a_client_that_gave_up_and_exited_does_not_strand_the_set_acked_after() {
    // The device has two log slots and no server runs: a1 and a2 are logged and acked, a3
    // finds the log full and fails. The server starts; a4 is acked, and the client exits with
    // a3's number still a hole in its session. The server must close the hole and apply a4.
    let dir = tempfile::tempdir().expect("temporary directory");
    let device_addr = free_udp_addr();
    let server_addr = free_udp_addr();
    let device = Node::start(
        "device",
        device_args(device_addr, server_addr, &dir.path().join("d.log"), 2),
    );
    let mut client = Prompt::start(device_addr, &["--request-lifetime", "0.5"]);
    assert!(client.ask("set a1 v1").starts_with("OK (durable"));
    assert!(client.ask("set a2 v2").starts_with("OK (durable"));
    let failed = client.ask("set a3 v3");
    assert!(
        failed.contains("log is full"),
        "the failure names the full log: {failed}"
    );
    let server = Node::start("server", {
        let mut list = server_args(server_addr, device_addr, &dir.path().join("s.data"));
        list.extend([s("--gap-fill-after"), s(1)]);
        list
    });
    device.wait_metric("pmnet_device_log_live_entries", "", "= 0", |v| v == 0.0);
    assert!(client.ask("set a4 v4").starts_with("OK (durable"));
    drop(client); // exits: no fill for a3 will come from it any more
    poll_until("a4 applied", || match get(device_addr, "a4").as_str() {
        "v4" => Ok(()),
        other => Err(other.to_owned()),
    });
    assert_eq!(get(device_addr, "a1"), "v1");
    assert_eq!(get(device_addr, "a2"), "v2");
    assert_eq!(get(device_addr, "a3"), "(not found)");
    device.wait_metric("pmnet_device_log_live_entries", "", "= 0", |v| v == 0.0);
    // The hole at a3 was closed: by the fill the client sent on giving up (if the server was
    // up to see it) or by the server's skip once the gap outlived every request lifetime.
    poll_until("the hole at a3 closed", || {
        let skipped = server.metric("pmnet_server_sequence_numbers_skipped_total", "")?;
        let filled = server.metric("pmnet_server_noop_fills_received_total", "")?;
        if skipped + filled >= 1.0 {
            Ok(())
        } else {
            Err(format!("skipped {skipped}, filled {filled}"))
        }
    });
}

/// Datagrams received on `socket` until `until` holds (checked between datagrams and every
/// 20 ms), within `PATIENCE`.
fn count_received(socket: &UdpSocket, mut until: impl FnMut() -> bool) -> (usize, usize) {
    socket
        .set_read_timeout(Some(Duration::from_millis(20)))
        .expect("timeout");
    let deadline = Instant::now() + PATIENCE;
    let (mut datagrams, mut bytes) = (0, 0);
    let mut buffer = [0u8; 2048];
    while Instant::now() < deadline {
        if let Ok(len) = socket.recv(&mut buffer) {
            datagrams += 1;
            bytes += len;
        }
        if until() {
            return (datagrams, bytes);
        }
    }
    panic!("the condition never held within {PATIENCE:?}");
}

#[test]
fn a_gap_from_an_unverified_source_is_answered_with_no_more_than_it_sent() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let server = lone_server(dir.path());
    let socket = UdpSocket::bind("127.0.0.1:0").expect("bind");
    let datagram = Header::new(PacketType::UpdateRequest, 1, 0xBAD_5E55, 2).encode(b"x");
    socket.send_to(&datagram, server.addr).expect("send");
    // Wait until the server wanted to ask more than the source paid for.
    let (datagrams, bytes) = count_received(&socket, || {
        server
            .metric("pmnet_server_retransmit_requests_unpaid_total", "")
            .is_ok_and(|value| value >= 1.0)
    });
    assert!(
        bytes <= datagram.len(),
        "{datagrams} datagrams, {bytes} bytes sent towards a source that sent {}",
        datagram.len()
    );
}

/// Resident memory of process `pid`, in KiB.
fn resident_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

#[test]
fn fragment_counts_and_reassembly_cannot_grow_the_server() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let server = lone_server(dir.path());
    let pid = server.proc.pid().expect("running");
    let before = resident_kib(pid);
    let socket = UdpSocket::bind("127.0.0.1:0").expect("bind");
    // A count no sender may use, then the largest one allowed, on a thousand sessions each.
    for (count, base) in [
        (u16::MAX, 0xF000_0000u64),
        (pmnet_wire::MAX_FRAGMENT_COUNT, 0xE000_0000),
    ] {
        for session in 0..1000u64 {
            let mut header = Header::new(PacketType::UpdateRequest, 1, base + session, 1);
            header.fragment_count = count;
            socket
                .send_to(&header.encode(&[0]), server.addr)
                .expect("send");
        }
    }
    server.wait_metric(
        "pmnet_server_dropped_total",
        "reason=\"bad_fragment\"",
        "= 1000",
        |value| value >= 1000.0,
    );
    server.wait_metric(
        "pmnet_server_request_fragments_received_total",
        "",
        ">= 1000",
        |value| value >= 1000.0,
    );
    let after = resident_kib(pid);
    // The thousand largest reassemblies cost their fragment tables (128 KiB each at most,
    // within the 256 MiB budget); the thousand claiming 65 535 fragments cost nothing.
    assert!(
        after < before + 200 * 1024,
        "resident memory grew from {before} KiB to {after} KiB"
    );
}

#[test]
fn a_full_store_loses_no_acked_set_and_applies_each_once_room_is_made() {
    // A 1 MiB store (room for a few hundred keys) behind a device: 1 200 SETs of distinct keys
    // are all acked by the device. The store applies what fits and keeps the rest waiting
    // (never "store full"); another session reads each key back and deletes the first 900,
    // making room, until every acked SET has been seen applied.
    use pmnet_proto::Completion;
    use pmnet_store::{Reply, Request};
    let dir = tempfile::tempdir().expect("temporary directory");
    let device_addr = free_udp_addr();
    let server = Node::start("server", {
        let mut list = server_args(
            "127.0.0.1:0".parse().expect("address"),
            device_addr,
            &dir.path().join("s.data"),
        );
        let at = list
            .iter()
            .position(|arg| arg == "--data-mib")
            .expect("size");
        list[at + 1] = s(1);
        // A store that may not grow.
        list.extend([s("--data-max-mib"), s(1)]);
        list
    });
    let device = Node::start(
        "device",
        device_args(device_addr, server.addr, &dir.path().join("d.log"), 4096),
    );
    let total = 1200u32;
    let key = |index: u32| format!("key{index}").into_bytes();
    let value = |index: u32| format!("value{index}").into_bytes();
    let mut writer = common::session(device_addr);
    let mut started = 0;
    let mut acked = 0;
    while acked < total {
        while started < total && writer.can_send() {
            let request = Request::Set {
                key: &key(started),
                value: &value(started),
            };
            writer
                .start_update(&request.to_bytes())
                .expect("start a SET");
            started += 1;
        }
        match writer.next_event(Some(Instant::now() + PATIENCE)) {
            Some(pmnet_proto::ClientEvent::Completed {
                completion: Completion::Logged { .. },
                ..
            }) => acked += 1,
            other => panic!("a SET was not acked by the device: {other:?}"),
        }
    }
    server.wait_metric(
        "pmnet_server_requests_deferred_total",
        "",
        "> 0 (the store filled up)",
        |value| value > 0.0,
    );
    // A user's SET of a key now is acked (durable in the device's log). The store may still
    // apply it (slots lent for receiving before the store filled take a datagram in place) or
    // keep it waiting: either way it is acked at once.
    let to = device_addr.to_string();
    let (status, stdout, stderr) = common::run_pmnet(
        &common::args(&["client", "--device", &to, "set", "fresh", "v"]),
        None,
    );
    assert!(
        status.success() && stdout.contains("durable"),
        "{stdout}{stderr}"
    );
    // A keyed SET of the writer's session waits behind its SETs the store had no room for,
    // and a GET of its key is told so at once, not left to time out.
    match writer.keyed_update(
        b"last",
        None,
        &Request::Set {
            key: b"last",
            value: b"v",
        }
        .to_bytes(),
    ) {
        Ok(Completion::Logged { .. }) => {}
        other => panic!("the keyed SET was not acked by the device: {other:?}"),
    }
    let (_, stdout, stderr) = common::run_pmnet(
        &common::args(&["client", "--device", &to, "get", "last"]),
        None,
    );
    assert!(
        stdout.contains("waits for room in the server's store"),
        "a read of a write that waits for room: {stdout}{stderr}"
    );
    let mut reader = common::session(device_addr);
    for index in 0..total {
        poll_until(&format!("SET {index} applied"), || {
            match reader.bypass(&Request::Get { key: &key(index) }.to_bytes()) {
                Ok(Completion::Replied { reply, .. }) => match Reply::decode(&reply) {
                    Ok(Reply::Value(found)) if found == value(index) => Ok(()),
                    other => Err(format!("{other:?}")),
                },
                other => Err(format!("{other:?}")),
            }
        });
        if index < 900 {
            reader
                .update(&Request::Del { key: &key(index) }.to_bytes())
                .expect("DEL acked");
        }
    }
    for (name, wanted) in [(&b"last"[..], &b"v"[..]), (b"fresh", b"v")] {
        poll_until("the SETs after the store filled applied", || {
            match reader.bypass(&Request::Get { key: name }.to_bytes()) {
                Ok(Completion::Replied { reply, .. }) => match Reply::decode(&reply) {
                    Ok(Reply::Value(found)) if found == wanted => Ok(()),
                    other => Err(format!("{other:?}")),
                },
                other => Err(format!("{other:?}")),
            }
        });
    }
    device.wait_metric("pmnet_device_log_live_entries", "", "= 0", |v| v == 0.0);
    let full_replies = server
        .metric("pmnet_store_full_replies_total", "")
        .unwrap_or(0.0);
    assert_eq!(full_replies, 0.0, "no update was answered \"store full\"");
    poll_until("the server's warning and its all-clear", || {
        let log = server.proc.stderr();
        if log.contains("the store is full") && log.contains("the store has room again") {
            Ok(())
        } else {
            Err(log)
        }
    });
}

#[test]
fn a_store_grows_while_it_serves_and_keeps_every_acked_set() {
    // A 1 MiB store (room for a few hundred keys) that may grow to 8 MiB, behind a device:
    // 2 000 SETs of distinct keys, all acked by the device. The store grows (restarts in
    // place, twice or three times) instead of keeping them waiting, and every key reads back.
    use pmnet_proto::Completion;
    use pmnet_store::{Reply, Request};
    let dir = tempfile::tempdir().expect("temporary directory");
    let data = dir.path().join("s.data");
    let device_addr = free_udp_addr();
    let server = Node::start("server", {
        let mut list = server_args("127.0.0.1:0".parse().expect("address"), device_addr, &data);
        let at = list
            .iter()
            .position(|arg| arg == "--data-mib")
            .expect("size");
        list[at + 1] = s(1);
        list.extend([s("--data-max-mib"), s(8), s("--data-grow-at"), s(50)]);
        list
    });
    let device = Node::start(
        "device",
        device_args(device_addr, server.addr, &dir.path().join("d.log"), 8192),
    );
    let first_len = std::fs::metadata(&data).expect("data file").len();
    let total = 2000u32;
    let key = |index: u32| format!("key{index}").into_bytes();
    let value = |index: u32| format!("value{index}").repeat(20).into_bytes();
    let mut writer = common::session(device_addr);
    let (mut started, mut acked) = (0, 0);
    while acked < total {
        while started < total && writer.can_send() {
            let request = Request::Set {
                key: &key(started),
                value: &value(started),
            };
            writer
                .start_update(&request.to_bytes())
                .expect("start a SET");
            started += 1;
        }
        match writer.next_event(Some(Instant::now() + PATIENCE)) {
            Some(pmnet_proto::ClientEvent::Completed {
                completion: Completion::Logged { .. },
                ..
            }) => acked += 1,
            other => panic!("a SET was not acked by the device: {other:?}"),
        }
    }
    let mut reader = common::session(device_addr);
    for index in 0..total {
        poll_until(&format!("SET {index} applied"), || {
            match reader.bypass(&Request::Get { key: &key(index) }.to_bytes()) {
                Ok(Completion::Replied { reply, .. }) => match Reply::decode(&reply) {
                    Ok(Reply::Value(found)) if found == value(index) => Ok(()),
                    other => Err(format!("{other:?}")),
                },
                other => Err(format!("{other:?}")),
            }
        });
    }
    let grown_len = std::fs::metadata(&data).expect("data file").len();
    assert!(
        grown_len >= 4 * first_len && grown_len <= 8 << 20,
        "the data file grew from {first_len} to {grown_len} bytes"
    );
    drop(device);
    drop(server);
}

#[test]
fn pmnet_store_grow_grows_a_stopped_servers_store_and_refuses_a_running_one() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let data = dir.path().join("s.data");
    let (server_addr, device_addr) = (free_udp_addr(), free_udp_addr());
    let start_server = || {
        Node::start("server", {
            let mut list = server_args(server_addr, device_addr, &data);
            let at = list
                .iter()
                .position(|arg| arg == "--data-mib")
                .expect("size");
            list[at + 1] = s(1);
            list.extend([s("--data-max-mib"), s(1)]);
            list
        })
    };
    let mut server = start_server();
    let device = Node::start(
        "device",
        device_args(device_addr, server.addr, &dir.path().join("d.log"), 1024),
    );
    let to = device_addr.to_string();
    for index in 0..20 {
        let (status, stdout, stderr) = run_pmnet(
            &args(&["client", "--device", &to, "set", &format!("k{index}"), "v"]),
            None,
        );
        assert!(status.success(), "{stdout}{stderr}");
    }
    for index in 0..20 {
        assert_eq!(get(device_addr, &format!("k{index}")), "v");
    }
    let file = data.display().to_string();
    let grow = || {
        run_pmnet(
            &args(&["store", "grow", "--data-file", &file, "--to-mib", "4"]),
            None,
        )
    };
    // Running: the server holds the file.
    let (status, stdout, stderr) = grow();
    assert!(!status.success(), "{stdout}{stderr}");
    assert!(stderr.contains("running server"), "{stderr}");
    assert_eq!(std::fs::metadata(&data).unwrap().len(), 1 << 20);
    // Stopped (killed: a crash), then grown.
    server.proc.kill();
    let (status, stdout, stderr) = grow();
    assert!(status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("grew from 0 to 3 MiB"), "{stdout}");
    assert!(stdout.contains("20 keys kept"), "{stdout}");
    assert_eq!(std::fs::metadata(&data).unwrap().len(), 4 << 20);
    // Smaller than it is: refused, nothing changed.
    let (status, _, stderr) = run_pmnet(
        &args(&["store", "grow", "--data-file", &file, "--to-mib", "2"]),
        None,
    );
    assert!(
        !status.success() && stderr.contains("never shrunk"),
        "{stderr}"
    );
    // Started again: every key, and room for more than a 1 MiB store had.
    let server = start_server();
    let room: u64 = server
        .banner
        .iter()
        .find_map(|line| {
            line.split("room for ")
                .nth(1)?
                .split(' ')
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no capacity in {:?}", server.banner));
    // A 1 MiB store has room for about 380 keys of a slot each, a 4 MiB one for about 1 900.
    assert!(room > 1500, "room for {room} keys");
    for index in 0..20 {
        assert_eq!(get(device_addr, &format!("k{index}")), "v");
    }
    // Compacted back into 2 MiB, the server stopped: the copy takes the original's place.
    let mut server = server;
    server.proc.kill();
    let compacted = dir.path().join("compacted.data");
    let (status, stdout, stderr) = run_pmnet(
        &args(&[
            "store",
            "compact",
            "--data-file",
            &file,
            "--to",
            &compacted.display().to_string(),
            "--data-mib",
            "2",
        ]),
        None,
    );
    assert!(status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("20 keys"), "{stdout}");
    std::fs::rename(&compacted, &data).unwrap();
    let server = start_server();
    assert_eq!(std::fs::metadata(&data).unwrap().len(), 2 << 20);
    for index in 0..20 {
        assert_eq!(get(device_addr, &format!("k{index}")), "v");
    }
    // The sessions came along: the device's sessions' numbers go on where they were.
    let (status, stdout, stderr) = run_pmnet(
        &args(&["client", "--device", &to, "set", "after", "compaction"]),
        None,
    );
    assert!(status.success(), "{stdout}{stderr}");
    assert_eq!(get(device_addr, "after"), "compaction");
    drop(server);
    drop(device);
}

#[test]
fn hostile_datagrams_of_every_type_stop_neither_device_nor_server() {
    // Well-formed datagrams (valid CRC) of every type with random fields and flags, and
    // random bytes, from a socket of no client, at the device and at the server. Afterwards
    // both still serve: a SET through the device is acked and read back, and neither panicked.
    use rand::{Rng, SeedableRng};
    let seed = seed("hostile_datagrams_of_every_type_stop_neither_device_nor_server");
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let dir = tempfile::tempdir().expect("temporary directory");
    let device_addr = free_udp_addr();
    let mut server = Node::start(
        "server",
        server_args(
            "127.0.0.1:0".parse().expect("address"),
            device_addr,
            &dir.path().join("s.data"),
        ),
    );
    let mut device = Node::start(
        "device",
        device_args(device_addr, server.addr, &dir.path().join("d.log"), 1024),
    );
    let socket = UdpSocket::bind("127.0.0.1:0").expect("bind");
    for round in 0..20_000u32 {
        let target = if round % 2 == 0 {
            device.addr
        } else {
            server.addr
        };
        let datagram = if rng.random_bool(0.1) {
            let len = rng.random_range(0..200);
            (0..len).map(|_| rng.random()).collect()
        } else {
            let packet_type = PacketType::ALL[rng.random_range(0..PacketType::ALL.len())];
            let mut header = Header::new(
                packet_type,
                if rng.random_bool(0.8) {
                    1
                } else {
                    rng.random()
                },
                rng.random_range(0..64),
                if rng.random_bool(0.5) {
                    rng.random_range(0..8)
                } else {
                    rng.random()
                },
            );
            header.flags = rng.random();
            header.fragment_count = rng.random_range(1..=pmnet_wire::MAX_FRAGMENT_COUNT);
            header.fragment_index = rng.random_range(0..header.fragment_count);
            header.device_id = rng.random();
            let len = rng.random_range(0..64);
            let payload: Vec<u8> = (0..len).map(|_| rng.random()).collect();
            header.encode(&payload)
        };
        let _ = socket.send_to(&datagram, target);
    }
    let (status, stdout, stderr) = run_pmnet(
        &args(&[
            "client",
            "--device",
            &device_addr.to_string(),
            "set",
            "after",
            "storm",
        ]),
        None,
    );
    assert!(
        status.success() && stdout.starts_with("OK"),
        "PMNET_SEED={seed}: a SET after the storm: {stdout} {stderr}"
    );
    poll_until("the SET after the storm applied", || {
        match get(device_addr, "after").as_str() {
            "storm" => Ok(()),
            other => Err(other.to_owned()),
        }
    });
    device.proc.stop();
    server.proc.stop();
    common::assert_no_panic(&device.proc);
    common::assert_no_panic(&server.proc);
}

//! Replays of genuine datagrams, end to end, as docs/security.md says an attacker on the path
//! can make them: real processes started as the docs tell a user, under a key file made with
//! `pmnet keygen`; a tap between the client and the device captures what the client sealed,
//! and the test sends the captured bytes again from a plain socket. Nothing replayed may undo
//! a later write: not after the receiver forgot the session (a restart, or more sessions than
//! it keeps), and not after the replay window (refused as `stale`, counted).

mod common;

use std::net::{SocketAddr, UdpSocket};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use common::{args, free_udp_addr, poll_until, run_pmnet, Node};

/// `pmnet keygen --out DIR/pmnet.key`, then `extra` appended (e.g. `replay window 1`).
fn keygen(dir: &Path, extra: &str) -> String {
    let path = dir.join("pmnet.key");
    let shown = path.display().to_string();
    let (status, _, stderr) = run_pmnet(&args(&["keygen", "--out", &shown]), None);
    assert!(status.success(), "{stderr}");
    if !extra.is_empty() {
        let mut text = std::fs::read_to_string(&path).expect("read the key file");
        text.push_str(extra);
        text.push('\n');
        std::fs::write(&path, text).expect("write the key file");
    }
    shown
}

/// A UDP relay in front of `target`: what a client sends to [`Tap::addr`] is recorded and
/// forwarded to `target`; whatever comes back (from the target or anyone it passed the
/// client's address to) goes to the latest client.
struct Tap {
    addr: SocketAddr,
    captured: Arc<Mutex<Vec<Vec<u8>>>>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Tap {
    fn start(target: SocketAddr) -> Tap {
        let front = UdpSocket::bind("127.0.0.1:0").expect("bind the tap's front");
        let back = UdpSocket::bind("127.0.0.1:0").expect("bind the tap's back");
        for socket in [&front, &back] {
            socket
                .set_read_timeout(Some(Duration::from_millis(20)))
                .expect("read timeout");
        }
        let addr = front.local_addr().expect("local address");
        let captured = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let client = Arc::new(Mutex::new(None::<SocketAddr>));
        let (front, back) = (Arc::new(front), Arc::new(back));
        let forward = {
            let (front, back, captured, stop, client) = (
                front.clone(),
                back.clone(),
                captured.clone(),
                stop.clone(),
                client.clone(),
            );
            std::thread::spawn(move || {
                let mut buffer = vec![0u8; 65_536];
                while !stop.load(Ordering::Relaxed) {
                    if let Ok((len, from)) = front.recv_from(&mut buffer) {
                        *client.lock().unwrap() = Some(from);
                        captured.lock().unwrap().push(buffer[..len].to_vec());
                        let _ = back.send_to(&buffer[..len], target);
                    }
                }
            })
        };
        let answer = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut buffer = vec![0u8; 65_536];
                while !stop.load(Ordering::Relaxed) {
                    if let Ok((len, _)) = back.recv_from(&mut buffer) {
                        if let Some(to) = *client.lock().unwrap() {
                            let _ = front.send_to(&buffer[..len], to);
                        }
                    }
                }
            })
        };
        Tap {
            addr,
            captured,
            stop,
            threads: vec![forward, answer],
        }
    }

    /// The first datagram a client sent through the tap that holds `needle` (its first
    /// transmission, not a resend).
    fn first_with(&self, needle: &[u8]) -> Vec<u8> {
        self.captured
            .lock()
            .unwrap()
            .iter()
            .find(|datagram| datagram.windows(needle.len()).any(|w| w == needle))
            .cloned()
            .unwrap_or_else(|| panic!("the tap saw no datagram with {needle:?}"))
    }
}

impl Drop for Tap {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// Send `datagram` to `to` from a plain socket, as an attacker would.
fn replay(datagram: &[u8], to: SocketAddr) {
    let socket = UdpSocket::bind("127.0.0.1:0").expect("a socket");
    socket.send_to(datagram, to).expect("send the replay");
}

/// `pmnet WORDS...`: (success, stdout, stderr).
fn pmnet(words: &[&str]) -> (bool, String, String) {
    let (status, stdout, stderr) = run_pmnet(&args(words), None);
    (status.success(), stdout, stderr)
}

/// Wait (bounded) until the wall clock is in a later Unix second than now: a datagram sealed
/// from then on is sealed after anything a receiver saw until now.
fn after_this_second() {
    let second = |now: std::time::SystemTime| {
        now.duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_secs()
    };
    let now = second(std::time::SystemTime::now());
    poll_until("the next second", || {
        let later = second(std::time::SystemTime::now());
        if later > now {
            Ok(())
        } else {
            Err(format!("still second {later}"))
        }
    });
}

/// A metric of `node`, 0 when it has no such sample yet.
fn metric(node: &Node, name: &str, labels: &str) -> f64 {
    node.metric(name, labels).unwrap_or(0.0)
}

// ---------------------------------------------------------------------------------------
// Replicated memory: a device coordinating ABD.

const LINES: u32 = 1024;

fn memnode(listen: SocketAddr, peers: &[SocketAddr], file: &Path, key: &str) -> Node {
    let mut list = vec![
        "memnode".to_owned(),
        "--listen".to_owned(),
        listen.to_string(),
        "--lines".to_owned(),
        LINES.to_string(),
        "--file".to_owned(),
        file.display().to_string(),
        "--metrics".to_owned(),
        "127.0.0.1:0".to_owned(),
        "--key-file".to_owned(),
        key.to_owned(),
    ];
    for peer in peers.iter().filter(|peer| **peer != listen) {
        list.extend(["--peer".to_owned(), peer.to_string()]);
    }
    Node::start("memnode", list)
}

fn abd_device(listen: SocketAddr, nodes: &[SocketAddr], key: &str) -> Node {
    let mut list = vec![
        "device".to_owned(),
        "--listen".to_owned(),
        listen.to_string(),
        "--abd-lines".to_owned(),
        LINES.to_string(),
        "--metrics".to_owned(),
        "127.0.0.1:0".to_owned(),
        "--key-file".to_owned(),
        key.to_owned(),
    ];
    for node in nodes {
        list.extend(["--abd-node".to_owned(), node.to_string()]);
    }
    Node::start("device", list)
}

/// Three memory nodes under `key`, in `dir`.
fn memnodes(dir: &Path, key: &str) -> (Vec<SocketAddr>, Vec<Node>) {
    let addrs: Vec<SocketAddr> = (0..3).map(|_| free_udp_addr()).collect();
    let nodes: Vec<Node> = (0..3)
        .map(|i| memnode(addrs[i], &addrs, &dir.join(format!("node{i}.lines")), key))
        .collect();
    for node in &nodes {
        // A new group: each node learns that no other holds a line, and joins.
        node.wait_metric("pmnet_memnode_member", "", "is a member", |v| v == 1.0);
    }
    (addrs, nodes)
}

/// `pmnet memory --device DEVICE --key-file KEY --lines LINES WORDS...`
fn memory(device: SocketAddr, key: &str, words: &[&str]) -> (bool, String, String) {
    let device = device.to_string();
    let lines = LINES.to_string();
    let mut all = vec![
        "memory",
        "--device",
        &device,
        "--key-file",
        key,
        "--lines",
        &lines,
    ];
    all.extend_from_slice(words);
    pmnet(&all)
}

fn read_line(device: SocketAddr, key: &str, line: u32) -> String {
    let line = line.to_string();
    let (ok, out, err) = memory(device, key, &["read", &line]);
    assert!(ok, "read {line}: {out}\n{err}");
    out.trim().to_owned()
}

#[test]
fn a_replayed_memory_write_never_brings_an_old_line_back_after_the_device_forgot_its_session() {
    let dir = tempfile::tempdir().expect("temporary directory");
    // A window long enough that the replays below are refused for the forgotten session,
    // not for their age.
    let key = keygen(dir.path(), "replay window 120");
    let (nodes_addr, _nodes) = memnodes(dir.path(), &key);
    let device_addr = free_udp_addr();
    let mut device = abd_device(device_addr, &nodes_addr, &key);
    let tap = Tap::start(device_addr);
    // A read first: the coordinator's floor is set by the first sealed datagram it sees, and
    // a write sealed in that same second would be refused (see the ignored test below).
    read_line(device_addr, &key, 11);
    after_this_second();

    let (ok, out, err) = memory(tap.addr, &key, &["write", "11", "v1-OLD"]);
    assert!(ok, "{out}\n{err}");
    let (ok, out, err) = memory(device_addr, &key, &["write", "11", "v2-NEW"]);
    assert!(ok, "{out}\n{err}");
    assert_eq!(read_line(device_addr, &key, 11), "11 \"v2-NEW\"");
    let old_write = tap.first_with(b"v1-OLD");

    // More sessions than the coordinator keeps (4 096): the writer's is forgotten.
    let keys = pmnet_runtime::load_key_file(Path::new(&key)).expect("the key file");
    for _ in 0..4_200 {
        let mut reader = pmnet_runtime::AbdSession::open(pmnet_runtime::AbdSessionConfig {
            mode: pmnet_runtime::AbdMode::Device(device_addr),
            lines: LINES,
            keys: Some(keys.clone()),
        })
        .expect("a socket");
        reader
            .read(3, 1)
            .expect("the socket works")
            .expect("a read through the coordinator");
    }
    let refused = metric(&device, "pmnet_abd_replays_refused_total", "");
    replay(&old_write, device_addr);
    device.wait_metric(
        "pmnet_abd_replays_refused_total",
        "",
        "counts the replay of the forgotten session",
        |v| v > refused,
    );
    assert_eq!(read_line(device_addr, &key, 11), "11 \"v2-NEW\"");

    // The device restarts: it knows no session at all; the replay is refused again.
    device.proc.stop();
    let device = abd_device(device_addr, &nodes_addr, &key);
    replay(&old_write, device_addr);
    device.wait_metric(
        "pmnet_abd_replays_refused_total",
        "",
        "counts the replay after the restart",
        |v| v >= 1.0,
    );
    assert_eq!(read_line(device_addr, &key, 11), "11 \"v2-NEW\"");
    assert_eq!(
        metric(
            &device,
            "pmnet_device_dropped_total",
            "port=\"pmnet\",reason=\"stale\""
        ),
        0.0,
        "refused as a forgotten session's, not for its age"
    );
}

#[test]
fn a_new_client_s_first_memory_write_to_a_just_started_keyed_device_succeeds() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let key = keygen(dir.path(), "");
    let (nodes_addr, _nodes) = memnodes(dir.path(), &key);
    let device_addr = free_udp_addr();
    let _device = abd_device(device_addr, &nodes_addr, &key);
    // The very first datagram the device ever sees is this write.
    let (ok, out, err) = memory(device_addr, &key, &["write", "12", "first"]);
    assert!(ok, "the first write to a new device failed: {out}\n{err}");
    assert_eq!(read_line(device_addr, &key, 12), "12 \"first\"");
}

// ---------------------------------------------------------------------------------------
// The chain store: `pmnet kv` against keyed members.

const GROUPS: u16 = 4;

/// `pmnet kv` through `members` (in chain order) with `key`: (success, stdout, stderr).
fn kv(members: &[SocketAddr], key: &str, words: &[&str]) -> (bool, String, String) {
    let mut all: Vec<String> = args(&["kv", "--groups", &GROUPS.to_string(), "--key-file", key]);
    all.extend(args(&["--timeout-ms", "3000"]));
    for member in members {
        all.extend(args(&["--member", &member.to_string()]));
    }
    all.extend(args(words));
    let (status, stdout, stderr) = run_pmnet(&all, None);
    (status.success(), stdout.trim().to_owned(), stderr)
}

#[test]
fn a_replayed_chain_put_never_brings_an_old_value_back_after_the_head_restarts() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let key = keygen(dir.path(), "");
    let members = [free_udp_addr(), free_udp_addr(), free_udp_addr()];
    let mut membership: Vec<String> = members
        .iter()
        .flat_map(|member| ["--chain-member".to_owned(), member.to_string()])
        .collect();
    membership.extend(args(&[
        "--chain-groups",
        &GROUPS.to_string(),
        "--key-file",
        &key,
    ]));
    let mut nodes: Vec<Node> = (0..3)
        .map(|i| common::chain_member(i as u16 + 1, members[i], &membership, dir.path()))
        .collect();
    let taps: Vec<Tap> = members.iter().map(|member| Tap::start(*member)).collect();
    let tapped: Vec<SocketAddr> = taps.iter().map(|tap| tap.addr).collect();

    // A read first: a head's floor is set by the first sealed datagram it sees.
    let (ok, out, err) = kv(&members, &key, &["get", "acct"]);
    assert!(ok, "{out}\n{err}");
    after_this_second();
    let (ok, out, err) = kv(&tapped, &key, &["put", "acct", "v1-OLD"]);
    assert!(ok && out.starts_with("OK (version 1)"), "{out}\n{err}");
    let (ok, out, err) = kv(&members, &key, &["put", "acct", "v2-NEW"]);
    assert!(ok && out.starts_with("OK (version 2)"), "{out}\n{err}");
    let head = taps
        .iter()
        .position(|tap| {
            tap.captured
                .lock()
                .unwrap()
                .iter()
                .any(|datagram| datagram.windows(6).any(|w| w == b"v1-OLD"))
        })
        .expect("a tap saw the put");
    let old_put = taps[head].first_with(b"v1-OLD");

    // The head restarts on its table; the captured put comes again.
    nodes[head].proc.stop();
    nodes[head] = common::chain_member(head as u16 + 1, members[head], &membership, dir.path());
    replay(&old_put, members[head]);
    nodes[head].wait_metric(
        "pmnet_chain_replays_refused_total",
        "",
        "counts the replayed put",
        |v| v >= 1.0,
    );
    assert_eq!(
        metric(&nodes[head], "pmnet_chain_writes_stamped_total", ""),
        0.0,
        "the restarted head stamped nothing"
    );
    for member in members {
        let (ok, out, err) = kv(&[member], &key, &["get", "acct"]);
        assert!(ok, "{out}\n{err}");
        assert_eq!(out, "v2-NEW", "member {member}: {err}");
        assert!(err.contains("version 2"), "member {member}: {err}");
    }
}

// ---------------------------------------------------------------------------------------
// The `kv` engine behind a device; replays after the window.

/// `pmnet client --device DEVICE --key-file KEY WORDS...`
fn client(device: SocketAddr, key: &str, words: &[&str]) -> (bool, String, String) {
    let device = device.to_string();
    let mut all = vec!["client", "--device", &device, "--key-file", key];
    all.extend_from_slice(words);
    pmnet(&all)
}

fn kv_server(listen: SocketAddr, device: SocketAddr, file: &Path, key: &str) -> Node {
    let mut list = common::server_args(listen, device, file, Some("kv"));
    list.extend(args(&[
        "--max-sessions",
        "128",
        "--gap-fill-after",
        "1",
        "--key-file",
        key,
    ]));
    Node::start("server", list)
}

#[test]
fn a_replayed_kv_set_after_the_store_forgot_its_session_and_restarted_is_refused_as_stale() {
    let dir = tempfile::tempdir().expect("temporary directory");
    // Sessions are kept 1 + 2 × 1 + 1 = 4 s: a replay of a forgotten session is always stale.
    let key = keygen(dir.path(), "replay window 1");
    let (device_addr, server_addr) = (free_udp_addr(), free_udp_addr());
    let data_file = dir.path().join("server.data");
    let mut server = kv_server(server_addr, device_addr, &data_file, &key);
    let mut device_list = common::device_args(device_addr, server_addr, &dir.path().join("log"));
    device_list.extend(args(&["--key-file", &key]));
    let device = Node::start("device", device_list);
    let tap = Tap::start(device_addr);

    let (ok, out, err) = client(tap.addr, &key, &["set", "acct", "v1-OLD"]);
    assert!(ok, "{out}\n{err}");
    let (ok, out, err) = client(device_addr, &key, &["set", "acct", "v2-NEW"]);
    assert!(ok, "{out}\n{err}");
    let old_set = tap.first_with(b"v1-OLD");

    // More one-shot sessions than the store keeps (128): the last ones wait until the first
    // ones are older than the keeping time, then the store forgets them.
    let keys = pmnet_runtime::load_key_file(Path::new(&key)).expect("the key file");
    let extra = 130;
    for i in 0..extra {
        let mut options = pmnet_runtime::SessionOptions::new(1, device_addr);
        options.keys = Some(keys.clone());
        let mut session = pmnet_runtime::ClientSession::open(options).expect("a session");
        let payload = pmnet_store::Request::Set {
            key: format!("other{i}").as_bytes(),
            value: b"x",
        }
        .to_bytes();
        session.update(&payload).expect("acked by the device");
    }
    let last = format!("other{}", extra - 1);
    poll_until("the store applies the last session's set", || {
        let (ok, out, err) = client(device_addr, &key, &["get", &last]);
        if ok && out.contains('x') {
            Ok(())
        } else {
            Err(format!("{out} {err}"))
        }
    });
    server.proc.stop();
    let server = kv_server(server_addr, device_addr, &data_file, &key);

    // The captured set, to the device and to the server: refused for its age, counted.
    let stale = "port=\"pmnet\",reason=\"stale\"";
    let before = metric(&device, "pmnet_device_dropped_total", stale);
    replay(&old_set, device_addr);
    device.wait_metric("pmnet_device_dropped_total", stale, "counts it", |v| {
        v > before
    });
    replay(&old_set, server_addr);
    server.wait_metric(
        "pmnet_server_dropped_total",
        "reason=\"stale\"",
        "counts it",
        |v| v >= 1.0,
    );
    let (ok, out, err) = client(device_addr, &key, &["get", "acct"]);
    assert!(ok, "{out}\n{err}");
    assert!(out.contains("v2-NEW"), "{out}\n{err}");
}

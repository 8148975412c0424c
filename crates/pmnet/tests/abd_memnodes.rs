//! Replicated memory as a user starts it: three `pmnet memnode` processes and a
//! `pmnet device --abd-node ...` coordinator; four writers and readers at once, two through
//! the device and two running the quorum themselves (the client-driven mode), on a few
//! contended lines. Under that load a memory node is SIGKILLed and started again on its file
//! (its persistent memory kept); then another is SIGKILLed and started on a new, empty file
//! (its memory lost): it learns every line from the others before it counts, and once it
//! does, the memory answers with a third node killed. Every line's history, across all of
//! it, is linearizable.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use common::{free_udp_addr, Node};
use pmnet_lincheck::{check_by_key, Operation, Register, RegisterInput, RegisterOutput, PENDING};
use pmnet_runtime::{AbdMode, AbdSession, AbdSessionConfig};

const LINES: u32 = 64;
/// The contended lines.
const HOT: u32 = 4;
/// Lines written once, before the faults.
const COLD_FIRST: u32 = 16;
const COLD: usize = 20;

type History = Vec<(
    u32,
    Operation<RegisterInput<Vec<u8>>, RegisterOutput<Vec<u8>>>,
)>;

fn memnode(listen: SocketAddr, peers: &[SocketAddr], file: &Path) -> Node {
    let mut args = vec![
        "memnode".to_owned(),
        "--listen".to_owned(),
        listen.to_string(),
        "--lines".to_owned(),
        LINES.to_string(),
        "--file".to_owned(),
        file.display().to_string(),
        "--metrics".to_owned(),
        "127.0.0.1:0".to_owned(),
    ];
    for peer in peers.iter().filter(|peer| **peer != listen) {
        args.extend(["--peer".to_owned(), peer.to_string()]);
    }
    Node::start("memnode", args)
}

fn line_value(client: u64, n: u64) -> Vec<u8> {
    let mut value = format!("{client}:{n}").into_bytes();
    value.resize(64, 0);
    value
}

#[test]
fn memory_nodes_killed_under_load_with_and_without_their_memory_keep_every_line_linearizable() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let nodes_addr: Vec<SocketAddr> = (0..3).map(|_| free_udp_addr()).collect();
    let file = |i: usize, life: u32| dir.path().join(format!("node{i}.{life}.lines"));
    let mut nodes: Vec<Node> = (0..3)
        .map(|i| memnode(nodes_addr[i], &nodes_addr, &file(i, 0)))
        .collect();
    for node in &nodes {
        assert!(
            node.banner.iter().any(|line| line.contains("medium: ")),
            "the banner names the medium: {:?}",
            node.banner
        );
        // A new group: each node learns that no other holds a line, and joins.
        node.wait_metric("pmnet_memnode_member", "", "is a member", |v| v == 1.0);
    }
    let device_addr = free_udp_addr();
    let mut device_args = vec![
        "device".to_owned(),
        "--listen".to_owned(),
        device_addr.to_string(),
        "--abd-lines".to_owned(),
        LINES.to_string(),
        "--metrics".to_owned(),
        "127.0.0.1:0".to_owned(),
    ];
    for node in &nodes_addr {
        device_args.extend(["--abd-node".to_owned(), node.to_string()]);
    }
    let device = Node::start("device", device_args);

    // Cold lines, written once: a node that loses its memory gets them back only by learning.
    let mut writer = AbdSession::open(AbdSessionConfig {
        mode: AbdMode::Device(device_addr),
        lines: LINES,
        keys: None,
    })
    .expect("a socket");
    let cold: Vec<u8> = (0..COLD * 64).map(|i| (i % 251) as u8 + 1).collect();
    writer
        .write(COLD_FIRST, &cold)
        .expect("the socket works")
        .expect("the cold lines written");

    let started = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let history = Arc::new(Mutex::new(History::new()));
    let clients: Vec<_> = (0..4u64)
        .map(|client| {
            let (stop, history, nodes_addr) = (stop.clone(), history.clone(), nodes_addr.clone());
            std::thread::spawn(move || {
                let mode = if client < 2 {
                    AbdMode::Device(device_addr)
                } else {
                    AbdMode::Direct {
                        nodes: nodes_addr,
                        writer: 1000 + client as u16,
                    }
                };
                let mut session = AbdSession::open(AbdSessionConfig {
                    mode,
                    lines: LINES,
                    keys: None,
                })
                .expect("a socket");
                let mut at = client as u32;
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    at = at.wrapping_mul(2_654_435_761).wrapping_add(7);
                    let line = at % HOT;
                    let write = at % 5 < 3;
                    let call = started.elapsed().as_nanos() as u64;
                    let (input, output, ret) = if write {
                        n += 1;
                        let value = line_value(client, n);
                        let result = session.write(line, &value).expect("the socket works");
                        let ret = started.elapsed().as_nanos() as u64;
                        let input = RegisterInput::Write(Some(value));
                        match result {
                            Ok(()) => (input, RegisterOutput::Written, ret),
                            // No majority in time, or in doubt: may or may not have happened.
                            Err(_) => (input, RegisterOutput::Unknown, PENDING),
                        }
                    } else {
                        let result = session.read(line, 1).expect("the socket works");
                        let ret = started.elapsed().as_nanos() as u64;
                        match result {
                            Ok(value) => {
                                let value = (value != vec![0; 64]).then_some(value);
                                (RegisterInput::Read, RegisterOutput::Value(value), ret)
                            }
                            Err(_) => continue, // a read that failed changed nothing
                        }
                    };
                    history.lock().unwrap().push((
                        line,
                        Operation {
                            client,
                            call,
                            ret,
                            input,
                            output,
                        },
                    ));
                }
            })
        })
        .collect();
    let completed_since = |since: u64| {
        history
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, op)| {
                op.call >= since && op.ret != PENDING && matches!(op.input, RegisterInput::Write(_))
            })
            .count()
    };
    let wait_writes = |what: &str, since: u64| {
        common::poll_until(what, || {
            let done = completed_since(since);
            if done >= 50 {
                Ok(())
            } else {
                Err(format!("{done} writes completed"))
            }
        })
    };
    wait_writes("writes under way", 0);

    // 1. A node SIGKILLed under load: a majority remains, the writes go on.
    let killed = started.elapsed().as_nanos() as u64;
    nodes[0].proc.kill();
    wait_writes("writes with node 0 killed", killed);
    // Started again on its file: its persistent memory holds every line it acknowledged, and
    // it is a member at once.
    nodes[0] = memnode(nodes_addr[0], &nodes_addr, &file(0, 0));
    assert!(
        nodes[0]
            .banner
            .iter()
            .any(|line| line.contains("state: member")),
        "{:?}",
        nodes[0].banner
    );

    // 2. Another node SIGKILLed, started on a new file: it lost its memory and learns.
    nodes[1].proc.kill();
    let restarted = started.elapsed().as_nanos() as u64;
    nodes[1] = memnode(nodes_addr[1], &nodes_addr, &file(1, 1));
    assert!(
        nodes[1]
            .banner
            .iter()
            .any(|line| line.contains("state: learning")),
        "{:?}",
        nodes[1].banner
    );
    wait_writes("writes while node 1 learns", restarted);
    nodes[1].wait_metric("pmnet_memnode_member", "", "is a member again", |v| {
        v == 1.0
    });
    let taken = nodes[1]
        .metric("pmnet_memnode_sync_lines_taken_total", "")
        .expect("the counter");
    assert!(
        taken >= COLD as f64,
        "the learning node took {taken} lines from the others, not the {COLD} cold ones"
    );

    // 3. With the learned node and node 0, the memory answers without node 2.
    nodes[2].proc.kill();
    let third = started.elapsed().as_nanos() as u64;
    wait_writes("writes with node 2 killed", third);

    assert_eq!(
        writer
            .read(COLD_FIRST, COLD as u32)
            .expect("the socket works"),
        Ok(cold),
        "the cold lines, read from the learned node and node 0"
    );
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        client.join().expect("a client thread");
    }
    let history = std::mem::take(&mut *history.lock().unwrap());
    let written = history
        .iter()
        .filter(|(_, op)| op.ret != PENDING && matches!(op.input, RegisterInput::Write(_)))
        .count();
    eprintln!(
        "{} operations, {written} writes completed; device: {:?} answers ignored",
        history.len(),
        device.metric("pmnet_abd_answers_ignored_total", "").ok()
    );
    let verdict = check_by_key(&Register::default(), &history, 50_000_000);
    assert!(
        verdict.is_linearizable(),
        "{verdict:?} ({} operations)",
        history.len()
    );
}

/// The example program of the README: counters in an mmap'ed view of the memory, a round
/// persisted at a time; it SIGKILLs a memory node itself mid-run, goes on, and checks every
/// counter with fresh quorum reads at the end.
#[test]
fn the_counters_example_survives_a_memory_node_killed_mid_run() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let nodes_addr: Vec<SocketAddr> = (0..3).map(|_| free_udp_addr()).collect();
    let nodes: Vec<Node> = (0..3)
        .map(|i| {
            memnode(
                nodes_addr[i],
                &nodes_addr,
                &dir.path().join(format!("node{i}.lines")),
            )
        })
        .collect();
    for node in &nodes {
        node.wait_metric("pmnet_memnode_member", "", "is a member", |v| v == 1.0);
    }
    let device_addr = free_udp_addr();
    let mut device_args = vec![
        "device".to_owned(),
        "--listen".to_owned(),
        device_addr.to_string(),
        "--abd-lines".to_owned(),
        LINES.to_string(),
    ];
    for node in &nodes_addr {
        device_args.extend(["--abd-node".to_owned(), node.to_string()]);
    }
    let _device = Node::start("device", device_args);
    // Cargo builds the examples beside the binary's directory.
    let example = Path::new(common::pmnet_bin())
        .parent()
        .expect("the binary's directory")
        .join("examples/replicated_counters");
    assert!(
        example.exists(),
        "{} was not built (cargo test builds examples)",
        example.display()
    );
    let victim = nodes[2].proc.pid().expect("a running memory node");
    let output = std::process::Command::new(&example)
        .args([
            "--device",
            &device_addr.to_string(),
            "--lines",
            &LINES.to_string(),
            "--rounds",
            "200",
            "--kill-pid",
            &victim.to_string(),
            "--kill-at",
            "100",
        ])
        .output()
        .expect("the example runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the example failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("SIGKILL to memory node"), "{stdout}");
    assert!(stdout.contains("ok: all 512 counters"), "{stdout}");
}

/// Hostile datagrams of every replicated-memory type, and some that are no datagram at all, at
/// a memory node and at a coordinating device: neither panics or stops serving, each counts
/// what it drops, and neither sends back more datagrams than it was sent.
#[test]
fn hostile_datagrams_are_counted_and_dropped_and_answers_stay_bounded() {
    use pmnet_wire::{Header, PacketType};
    use rand::{Rng, SeedableRng};

    let seed = common::seed("hostile_datagrams_are_counted_and_dropped_and_answers_stay_bounded");
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let dir = tempfile::tempdir().expect("temporary directory");
    let node_addr = free_udp_addr();
    let node = memnode(node_addr, &[], &dir.path().join("alone.lines"));
    node.wait_metric("pmnet_memnode_member", "", "is a member", |v| v == 1.0);
    let device_addr = free_udp_addr();
    let device = Node::start(
        "device",
        vec![
            "device".to_owned(),
            "--listen".to_owned(),
            device_addr.to_string(),
            "--abd-lines".to_owned(),
            LINES.to_string(),
            "--abd-node".to_owned(),
            node_addr.to_string(),
            "--metrics".to_owned(),
            "127.0.0.1:0".to_owned(),
        ],
    );
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").expect("a socket");
    socket.set_nonblocking(true).expect("non-blocking");
    let mut sent = 0u64;
    let mut received = 0u64;
    let mut buffer = [0u8; 65_536];
    for round in 0..3000u32 {
        let target = if round % 2 == 0 {
            node_addr
        } else {
            device_addr
        };
        let code = 0x30 + (rng.random_range(0..8u8));
        let len = rng.random_range(0..1300usize);
        let mut payload: Vec<u8> = (0..len).map(|_| rng.random()).collect();
        // Often a plausible start: a small count, a line near the end of the memory.
        if len >= 7 && rng.random_bool(0.5) {
            payload[0] = rng.random_range(0..3);
            payload[1..5].copy_from_slice(&rng.random_range(0..LINES + 4).to_be_bytes());
            payload[5..7].copy_from_slice(&rng.random_range(0..20u16).to_be_bytes());
        }
        let header = Header::new(PacketType::Reserved(code), 0, rng.random(), rng.random());
        let mut datagram = header.encode(&payload);
        if rng.random_bool(0.1) {
            // Damage the header too.
            let at = rng.random_range(0..datagram.len());
            datagram[at] ^= 0x5a;
        }
        if rng.random_bool(0.05) {
            datagram.truncate(rng.random_range(0..datagram.len()));
        }
        socket.send_to(&datagram, target).expect("send");
        sent += 1;
        while socket.recv_from(&mut buffer).is_ok() {
            received += 1;
        }
    }
    // What is still on its way: on loopback an answer comes within a moment (one later still
    // would escape the count).
    socket.set_nonblocking(false).expect("blocking");
    socket
        .set_read_timeout(Some(std::time::Duration::from_millis(200)))
        .expect("a timeout");
    while socket.recv_from(&mut buffer).is_ok() {
        received += 1;
    }
    assert!(
        received <= sent,
        "{received} datagrams came back for {sent} sent (seed {seed})"
    );
    assert!(
        node.metric(
            "pmnet_memnode_datagrams_dropped_all_total",
            r#"port="pmnet""#
        )
        .unwrap_or(0.0)
            > 0.0,
        "the memory node counted no drop (seed {seed})"
    );
    assert!(
        device
            .metric("pmnet_device_dropped_all_total", r#"port="pmnet""#)
            .unwrap_or(0.0)
            > 0.0,
        "the device counted no drop (seed {seed})"
    );
    // Both still serve, and a hostile write never landed where a real one did not: the
    // memory holds what a real client wrote.
    let mut session = AbdSession::open(AbdSessionConfig {
        mode: AbdMode::Device(device_addr),
        lines: LINES,
        keys: None,
    })
    .expect("a socket");
    let value = line_value(7, 7);
    session
        .write(LINES - 1, &value)
        .expect("the socket works")
        .expect("the write after the hostile datagrams");
    assert_eq!(
        session.read(LINES - 1, 1).expect("the socket works"),
        Ok(value)
    );
}

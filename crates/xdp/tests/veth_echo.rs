//! Measures a UDP echo across a veth pair: the echo server answering from an AF_XDP socket
//! (steered by the XDP program in native mode, replies written with `write_udp`) against one on
//! a kernel UDP socket, both in the same namespace, and the XDP program's own cost per frame.
//! Ignored by default (it takes a few seconds and its figures depend on the machine):
//!
//! ```sh
//! cargo test --release -p pmnet-xdp --test veth_echo -- --ignored --nocapture
//! ```

use std::net::{SocketAddrV4, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

mod common;

use common::{in_netns, skip_reason, Pair, A_IP, B_IP, KERNEL_PORT, STEERED_PORT};
use pmnet_xdp::frame::{parse_udp, write_udp};
use pmnet_xdp::{AttachMode, Steering, Umem, XskConfig, XskSocket};

const ROUNDS: usize = 20_000;
const WARMUP: usize = 1_000;

/// Echoes every steered datagram back to its sender until `stop`; `spin` polls the RX ring
/// without sleeping in poll(2).
fn xsk_echo(socket: &mut XskSocket, stop: &AtomicBool, spin: bool) {
    while !stop.load(Ordering::Relaxed) {
        if !spin {
            let mut pfd = libc::pollfd {
                fd: socket.raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            unsafe { libc::poll(&mut pfd, 1, 10) };
        }
        let n = socket.receive_batch(64);
        for i in 0..n {
            let Some(frame) = socket.received(i) else {
                continue;
            };
            let Ok(udp) = parse_udp(frame) else {
                continue;
            };
            let (src_mac, dst_mac, src, dst) = (udp.dst_mac, udp.src_mac, udp.dst, udp.src);
            let mut payload = [0u8; 64];
            let len = udp.payload.len().min(payload.len());
            payload[..len].copy_from_slice(&udp.payload[..len]);
            let _ = socket.transmit_with(|buf| {
                write_udp(buf, src_mac, dst_mac, src, dst, 64, &payload[..len]).unwrap_or(0)
            });
        }
        if n > 0 {
            socket.flush();
        }
        socket.release_batch();
    }
}

fn kernel_echo(socket: &UdpSocket, stop: &AtomicBool) {
    socket
        .set_read_timeout(Some(Duration::from_millis(10)))
        .unwrap();
    let mut buf = [0u8; 2048];
    while !stop.load(Ordering::Relaxed) {
        if let Ok((n, from)) = socket.recv_from(&mut buf) {
            let _ = socket.send_to(&buf[..n], from);
        }
    }
}

/// Round trips from `client` to `to`: (median, 99th percentile, mean) in µs.
fn measure(client: &UdpSocket, to: SocketAddrV4) -> (f64, f64, f64) {
    client
        .set_read_timeout(Some(Duration::from_secs(1)))
        .unwrap();
    let mut buf = [0u8; 64];
    let mut samples = Vec::with_capacity(ROUNDS);
    for round in 0..WARMUP + ROUNDS {
        let payload = (round as u64).to_le_bytes();
        let start = Instant::now();
        client.send_to(&payload, to).unwrap();
        loop {
            let (n, _) = client.recv_from(&mut buf).expect("an echo within 1 s");
            if buf[..n] == payload {
                break;
            }
        }
        if round >= WARMUP {
            samples.push(start.elapsed().as_secs_f64() * 1e6);
        }
    }
    samples.sort_by(|a, b| a.total_cmp(b));
    let mean = samples.iter().sum::<f64>() / samples.len() as f64;
    (
        samples[samples.len() / 2],
        samples[samples.len() * 99 / 100],
        mean,
    )
}

#[test]
#[ignore = "a measurement: run with --ignored --nocapture"]
fn measure_echo_on_veth() {
    if let Some(why) = skip_reason() {
        eprintln!("SKIPPED veth echo measurement: {why}");
        return;
    }
    let pair = Pair::create("e").expect("create the namespaces and veth pair");
    let client = in_netns(&pair.ns_b, || {
        pmnet_xdp::set_tx_checksum_offload(&pair.dev_b, false).unwrap();
        UdpSocket::bind((B_IP, 0)).unwrap()
    });
    // Program statistics (run time per frame) while this descriptor is open.
    let stats = aya::sys::enable_stats(aya::sys::Stats::RunTime).ok();
    in_netns(&pair.ns_a, || {
        let mut steering = Steering::attach(&pair.dev_a, AttachMode::Native).unwrap();
        let umem = Umem::anonymous(1024, 2048).unwrap();
        let config = XskConfig {
            rx_ring: 512,
            tx_ring: 512,
            fill_ring: 512,
            completion_ring: 512,
            ..XskConfig::default()
        };
        let mut socket = XskSocket::open(&pair.dev_a, umem, config).unwrap();
        steering.register(0, &socket).unwrap();
        steering
            .steer(SocketAddrV4::new(A_IP, STEERED_PORT))
            .unwrap();
        let kernel = UdpSocket::bind((A_IP, KERNEL_PORT)).unwrap();
        let stop = AtomicBool::new(false);
        let mut results = Vec::new();
        std::thread::scope(|scope| {
            scope.spawn(|| kernel_echo(&kernel, &stop));
            let to = SocketAddrV4::new(A_IP, KERNEL_PORT);
            results.push((
                "kernel UDP socket",
                in_netns(&pair.ns_b, || measure(&client, to)),
            ));
            stop.store(true, Ordering::Relaxed);
        });
        for (name, spin) in [("AF_XDP, poll(2)", false), ("AF_XDP, spinning", true)] {
            stop.store(false, Ordering::Relaxed);
            std::thread::scope(|scope| {
                let socket = &mut socket;
                let stop = &stop;
                scope.spawn(move || xsk_echo(socket, stop, spin));
                let to = SocketAddrV4::new(A_IP, STEERED_PORT);
                results.push((name, in_netns(&pair.ns_b, || measure(&client, to))));
                stop.store(true, Ordering::Relaxed);
            });
        }
        eprintln!("UDP echo round trips across veth ({ROUNDS} each, µs):");
        for (name, (median, p99, mean)) in &results {
            eprintln!("  {name:<20} median {median:7.1}  p99 {p99:7.1}  mean {mean:7.1}");
        }
        let counters = steering.counters();
        eprintln!(
            "program counters {counters:?}; socket stats {:?}",
            socket.stats()
        );
        assert!(counters.steered >= 2 * ROUNDS as u64);
        if stats.is_some() {
            let program = aya::programs::loaded_programs()
                .filter_map(Result::ok)
                .find(|info| info.name() == b"pmnet_steer");
            if let Some(info) = program {
                let runs = info.run_count().max(1);
                eprintln!(
                    "XDP program: {} runs, {:.0} ns per frame",
                    info.run_count(),
                    info.run_time().as_nanos() as f64 / runs as f64
                );
            }
        }
    });
}

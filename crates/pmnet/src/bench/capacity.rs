//! Forwarding capacity: a plain UDP relay against the device's forward port, one thread each,
//! under the same offered load; and the device's forward port again with every datagram
//! authenticated (the generator sends sealed datagrams, the device verifies each and seals
//! what it forwards).
//!
//! A generator thread (on another CPU) sends update datagrams of the benchmark's size as fast
//! as `sendmmsg` goes, round-robin over 64 sessions, to the forwarder; the forwarder sends
//! them on to a sink socket that is never read (the kernel drops there, after the forwarder's
//! work is done). The figure is what left the forwarder per second of the generator's run.
//! When the forwarder's socket drops part of the offered load, the forwarder was the
//! bottleneck and the figure is its capacity; when it drops nothing, the generator was, and
//! the report says so.

use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use pmnet_runtime::udp::{type_slot_name, BATCH_LEN, TYPE_SLOT_COUNT};
use pmnet_runtime::{
    pin_current_thread, DeviceOptions, DeviceRuntime, LoopOptions, Metrics, RelayOptions, Shutdown,
    UdpRelay, WaitMode,
};
use pmnet_wire::{Header, PacketType};

use super::report::{CapacityReport, CapacityResult};

/// Sessions the generator's datagrams belong to.
const GENERATOR_SESSIONS: u64 = 64;

/// How often the generator seals its datagrams again (with keys).
const RESEAL_EVERY: Duration = Duration::from_millis(50);

/// Time the forwarder gets to empty its socket after the generator stops.
const DRAIN: Duration = Duration::from_millis(100);

#[derive(Debug, Clone)]
pub struct CapacityConfig {
    /// Generator run per forwarder and round.
    pub duration: Duration,
    /// Turns of relay-then-forward; each forwarder's median round is reported.
    pub rounds: u32,
    pub wait: WaitMode,
    pub forwarder_cpu: Option<usize>,
    pub generator_cpu: Option<usize>,
    /// The request payload each datagram carries.
    pub payload: Vec<u8>,
    pub server_id: u16,
    /// Keys of the authenticated round (`None`: no authenticated forwarder).
    pub keys: Option<pmnet_runtime::KeySet>,
}

/// Which forwarder to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Forwarder {
    Relay,
    DeviceForward,
    DeviceForwardAuthenticated,
}

impl Forwarder {
    fn name(self) -> &'static str {
        match self {
            Forwarder::Relay => "plain relay (recvmmsg/sendmmsg)",
            Forwarder::DeviceForward => "device forward port (logging off)",
            Forwarder::DeviceForwardAuthenticated => "device forward port, authenticated",
        }
    }

    /// The keys its datagrams are sealed with.
    fn keys(self, config: &CapacityConfig) -> Option<pmnet_runtime::KeySet> {
        match self {
            Forwarder::DeviceForwardAuthenticated => config.keys.clone(),
            _ => None,
        }
    }
}

/// What the forwarder thread reports when it stops: datagrams received and sent on, and the
/// CPU time the thread ran while forwarding.
struct ForwarderCounts {
    received: u64,
    forwarded: u64,
    cpu_ns: u64,
}

fn socket_total(metrics: &Metrics, name: &str, socket: &str) -> u64 {
    (0..TYPE_SLOT_COUNT)
        .map(|slot| {
            metrics
                .value(name, &[("socket", socket), ("type", type_slot_name(slot))])
                .unwrap_or(0.0) as u64
        })
        .sum()
}

fn start_forwarder(
    forwarder: Forwarder,
    config: &CapacityConfig,
    sink: SocketAddr,
    shutdown: Shutdown,
) -> Result<(SocketAddr, JoinHandle<Result<ForwarderCounts, String>>), String> {
    let loopback = SocketAddr::from(([127, 0, 0, 1], 0));
    let loop_options = LoopOptions {
        wait: config.wait,
        cpu: config.forwarder_cpu,
        report_interval: None,
        metrics_listen: None,
        ..LoopOptions::default()
    };
    let (tx, rx) = std::sync::mpsc::channel();
    let server_id = config.server_id;
    let keys = forwarder.keys(config);
    let handle = std::thread::Builder::new()
        .name("pmnet-forwarder".into())
        .spawn(move || match forwarder {
            Forwarder::Relay => {
                let options = RelayOptions {
                    listen: loopback,
                    target: sink,
                    loop_options,
                };
                let mut relay = match UdpRelay::open(options, shutdown) {
                    Ok(relay) => relay,
                    Err(error) => {
                        let _ = tx.send(Err(error.to_string()));
                        return Err(error.to_string());
                    }
                };
                let _ = tx.send(Ok(relay.local_addr()));
                let cpu_start = super::cpu::own_cpu_ns();
                relay.run().map_err(|error| error.to_string())?;
                Ok(ForwarderCounts {
                    received: relay.front_counters().received_total(),
                    forwarded: relay.back_counters().sent_total(),
                    cpu_ns: super::cpu::own_cpu_ns().saturating_sub(cpu_start),
                })
            }
            Forwarder::DeviceForward | Forwarder::DeviceForwardAuthenticated => {
                // The device as the latency runs have it, minus the log file: a PMNet port,
                // a forward port and an echo port, all polled by one loop.
                let options = DeviceOptions {
                    device_id: 1,
                    listen: loopback,
                    servers: vec![(server_id, sink)],
                    previous_devices: Vec::new(),
                    log: None,
                    forward_listen: Some(loopback),
                    echo_listen: Some(loopback),
                    max_resends_in_flight: None,
                    resend_timeout: None,
                    loop_options,
                    keys,
                    batch: false,
                    batch_hold: Duration::ZERO,
                    xdp: None,
                };
                let mut device = match DeviceRuntime::open(options, shutdown) {
                    Ok(device) => device,
                    Err(error) => {
                        let _ = tx.send(Err(error.to_string()));
                        return Err(error.to_string());
                    }
                };
                let Some(forward) = device.addresses().forward else {
                    let _ = tx.send(Err("the device opened no forward port".into()));
                    return Err("no forward port".into());
                };
                let _ = tx.send(Ok(forward));
                let subscriber = tracing_subscriber::fmt()
                    .with_max_level(tracing::Level::WARN)
                    .with_writer(std::io::stderr)
                    .finish();
                let cpu_start = super::cpu::own_cpu_ns();
                tracing::subscriber::with_default(subscriber, || device.run())
                    .map_err(|error| error.to_string())?;
                let cpu_ns = super::cpu::own_cpu_ns().saturating_sub(cpu_start);
                let metrics = device.metrics();
                Ok(ForwarderCounts {
                    received: socket_total(&metrics, "pmnet_packets_received_total", "forward"),
                    forwarded: socket_total(&metrics, "pmnet_packets_sent_total", "forward"),
                    cpu_ns,
                })
            }
        })
        .map_err(|error| format!("cannot start the forwarder thread: {error}"))?;
    match rx.recv_timeout(Duration::from_secs(30)) {
        Ok(Ok(addr)) => Ok((addr, handle)),
        Ok(Err(error)) => {
            let _ = handle.join();
            Err(format!("the {} did not start: {error}", forwarder.name()))
        }
        Err(_) => Err(format!("the {} did not start in time", forwarder.name())),
    }
}

/// Send as fast as possible until `stop`; returns datagrams sent and for how long. The
/// generator is as cheap as a sender can be (a connected socket, `sendmmsg` of prebuilt
/// batches, no copies), so that the forwarder, not the generator, is the bottleneck.
fn generate(
    target: SocketAddr,
    config: &CapacityConfig,
    keys: Option<pmnet_runtime::KeySet>,
    stop: &AtomicBool,
) -> Result<(u64, Duration), String> {
    use std::os::fd::AsRawFd;
    if let Some(cpu) = config.generator_cpu {
        pin_current_thread(cpu)?;
    }
    let socket = UdpSocket::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .and_then(|socket| socket.connect(target).map(|()| socket))
        .map_err(|error| format!("cannot open the generator's socket: {error}"))?;
    let mut auth = keys.map(pmnet_proto::Authenticator::new);
    let mut datagrams: Vec<Vec<u8>> = (0..GENERATOR_SESSIONS * 16)
        .map(|index| {
            let session = 1 + index % GENERATOR_SESSIONS;
            let seq = 1 + (index / GENERATOR_SESSIONS) as u32;
            let mut datagram =
                Header::new(PacketType::UpdateRequest, config.server_id, session, seq)
                    .encode(&config.payload);
            if let Some(auth) = auth.as_mut() {
                auth.seal(&mut datagram);
            }
            datagram
        })
        .collect();
    // One prebuilt batch per window of BATCH_LEN datagrams; the kernel only reads them.
    let mut iovecs: Vec<libc::iovec> = datagrams
        .iter()
        .map(|datagram| libc::iovec {
            iov_base: datagram.as_ptr() as *mut libc::c_void,
            iov_len: datagram.len(),
        })
        .collect();
    let batches = datagrams.len() / BATCH_LEN;
    let mut headers: Vec<libc::mmsghdr> = (0..datagrams.len())
        .map(|index| {
            // SAFETY: a zeroed mmsghdr is valid (integers and null pointers).
            let mut header: libc::mmsghdr = unsafe { std::mem::zeroed() };
            header.msg_hdr.msg_iov = &mut iovecs[index];
            header.msg_hdr.msg_iovlen = 1;
            header
        })
        .collect();
    let fd = socket.as_raw_fd();
    let start = Instant::now();
    let mut batch = 0usize;
    let mut sent = 0u64;
    let mut sealed_at = start;
    while !stop.load(Ordering::Relaxed) {
        // Sealed datagrams are sealed again every 50 ms, as clients seal each
        // request afresh: a device reuses only a trailer sealed in the current second (and
        // receivers refuse one older than the replay window). In place: the buffers keep
        // their addresses, so the prebuilt batches still point at them.
        if let Some(auth) = auth.as_mut() {
            if sealed_at.elapsed() >= RESEAL_EVERY {
                for datagram in &mut datagrams {
                    datagram.truncate(datagram.len() - pmnet_auth::TRAILER_LEN);
                    auth.seal(datagram);
                }
                sealed_at = Instant::now();
            }
        }
        // SAFETY: the headers of this batch point at live iovecs and datagrams; the socket
        // is connected, so no addresses are needed.
        let result = unsafe {
            libc::sendmmsg(
                fd,
                headers[batch * BATCH_LEN..].as_mut_ptr(),
                BATCH_LEN as libc::c_uint,
                0,
            )
        };
        if result > 0 {
            sent += result as u64;
        } else {
            // ECONNREFUSED from an ICMP error, ENOBUFS and the like: carry on.
            std::thread::yield_now();
        }
        batch = (batch + 1) % batches;
    }
    Ok((sent, start.elapsed()))
}

fn measure(
    forwarder: Forwarder,
    config: &CapacityConfig,
    shutdown: &Shutdown,
) -> Result<CapacityResult, String> {
    // The sink: bound, never read. Its buffer fills and the kernel drops what arrives after
    // the forwarder has done all of its work on it.
    let sink = UdpSocket::bind("127.0.0.1:0")
        .map_err(|error| format!("cannot open the sink socket: {error}"))?;
    let sink_addr = sink
        .local_addr()
        .map_err(|error| format!("sink address: {error}"))?;
    let forwarder_shutdown = Shutdown::new();
    let (addr, handle) = start_forwarder(forwarder, config, sink_addr, forwarder_shutdown.clone())?;
    let stop = Arc::new(AtomicBool::new(false));
    let generator = {
        let stop = stop.clone();
        let config = config.clone();
        let keys = forwarder.keys(&config);
        std::thread::Builder::new()
            .name("pmnet-generator".into())
            .spawn(move || generate(addr, &config, keys, &stop))
            .map_err(|error| format!("cannot start the generator thread: {error}"))?
    };
    let end = Instant::now() + config.duration;
    while Instant::now() < end && !shutdown.is_requested() && !generator.is_finished() {
        std::thread::sleep(
            Duration::from_millis(10).min(end.saturating_duration_since(Instant::now())),
        );
    }
    stop.store(true, Ordering::Relaxed);
    let generated = generator
        .join()
        .map_err(|_| "the generator thread panicked".to_owned())?;
    std::thread::sleep(DRAIN);
    forwarder_shutdown.request();
    let counts = handle
        .join()
        .map_err(|_| "the forwarder thread panicked".to_owned())??;
    let (offered, elapsed) = generated?;
    drop(sink);
    let seconds = elapsed.as_secs_f64().max(1e-9);
    let dropped = offered.saturating_sub(counts.received);
    Ok(CapacityResult {
        forwarder: forwarder.name().to_owned(),
        packets_per_s: (counts.forwarded as f64 / seconds).round(),
        offered_per_s: (offered as f64 / seconds).round(),
        dropped_before_forwarder: if offered > 0 {
            dropped as f64 / offered as f64
        } else {
            0.0
        },
        forwarded: counts.forwarded,
        // The forwarder's CPU time (it sleeps when idle) per datagram it read: unlike the
        // packet rate, this hardly moves when other work shares the machine.
        cpu_ns_per_datagram: (counts.received > 0)
            .then(|| (counts.cpu_ns as f64 / counts.received as f64).round()),
        rounds_per_s: Vec::new(),
        measured_s: (seconds * 1000.0).round() / 1000.0,
        datagram_bytes: pmnet_wire::HEADER_LEN
            + config.payload.len()
            + forwarder
                .keys(config)
                .map_or(0, |_| pmnet_auth::TRAILER_LEN),
    })
}

/// Measure the relay and the device's forward port (and, with keys, the authenticated forward
/// port) in turns, `rounds` times each (so that a drift of the machine's load hits all
/// alike), and report the median round of each.
pub fn run_capacity(
    config: &CapacityConfig,
    shutdown: &Shutdown,
) -> Result<CapacityReport, String> {
    let mut forwarders = vec![Forwarder::Relay, Forwarder::DeviceForward];
    if config.keys.is_some() {
        forwarders.push(Forwarder::DeviceForwardAuthenticated);
    }
    let mut samples: Vec<Vec<CapacityResult>> = vec![Vec::new(); forwarders.len()];
    'rounds: for _ in 0..config.rounds.max(1) {
        for (index, forwarder) in forwarders.iter().enumerate() {
            if shutdown.is_requested() {
                break 'rounds;
            }
            samples[index].push(measure(*forwarder, config, shutdown)?);
        }
    }
    let mut results = Vec::new();
    for mut rounds in samples {
        if rounds.is_empty() {
            continue;
        }
        let rates: Vec<f64> = rounds.iter().map(|result| result.packets_per_s).collect();
        let mut cpu: Vec<f64> = rounds
            .iter()
            .filter_map(|result| result.cpu_ns_per_datagram)
            .collect();
        cpu.sort_by(f64::total_cmp);
        rounds.sort_by(|a, b| a.packets_per_s.total_cmp(&b.packets_per_s));
        let mut median = rounds.swap_remove(rounds.len() / 2);
        median.rounds_per_s = rates;
        // The median round by CPU per datagram, on its own (the packet rate's median round
        // need not be that one).
        median.cpu_ns_per_datagram = cpu.get(cpu.len() / 2).copied();
        results.push(median);
    }
    let share = |numerator: &CapacityResult, denominator: &CapacityResult| {
        (denominator.packets_per_s > 0.0).then(|| {
            (numerator.packets_per_s / denominator.packets_per_s * 1000.0).round() / 1000.0
        })
    };
    let forward_vs_relay = match results.as_slice() {
        [relay, forward, ..] => share(forward, relay),
        _ => None,
    };
    let authenticated_vs_forward = match results.as_slice() {
        [_, forward, authenticated] => share(authenticated, forward),
        _ => None,
    };
    let (authenticated_cpu_ns_extra, authenticated_vs_forward_by_cpu) = match results.as_slice() {
        [_, forward, authenticated] => {
            match (
                forward.cpu_ns_per_datagram,
                authenticated.cpu_ns_per_datagram,
            ) {
                (Some(plain), Some(auth)) if auth > 0.0 => (
                    Some(auth - plain),
                    Some((plain / auth * 1000.0).round() / 1000.0),
                ),
                _ => (None, None),
            }
        }
        _ => (None, None),
    };
    Ok(CapacityReport {
        results,
        forward_vs_relay,
        authenticated_vs_forward,
        authenticated_cpu_ns_extra,
        authenticated_vs_forward_by_cpu,
        forwarder_cpu: config.forwarder_cpu,
        generator_cpu: config.generator_cpu,
        wait: config.wait.name().to_owned(),
        rounds: config.rounds.max(1),
        seconds_per_round: config.duration.as_secs_f64(),
    })
}

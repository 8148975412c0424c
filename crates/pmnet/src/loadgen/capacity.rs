//! Forwarding capacity: a plain UDP relay against the device's forward port, one thread each,
//! under the same offered load; and the device's forward port again with every datagram
//! authenticated (the generator sends sealed datagrams, the device verifies each and seals
//! what it forwards).
//!
//! A generator thread (on another CPU) sends update datagrams of the benchmark's size as fast
//! as `sendmmsg` goes, round-robin over 64 sessions, to the forwarder; the forwarder sends
//! them on to a sink socket that is never read (the kernel drops there, after the forwarder's
//! work is done). The figure is what left the forwarder per second the generator sent to it.
//! With blocking waits the forwarders of a round run side by side, each on the forwarder's
//! CPU, and the generator sends to each in turn, 50 ms at a time, so that a drift of the
//! machine's speed (a VM sharing its host) hits all alike; spinning forwarders run one after
//! the other.
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

use super::results::{CapacityReport, CapacityResult};

/// Sessions the generator's datagrams belong to.
const GENERATOR_SESSIONS: u64 = 64;

/// The generator sends to one forwarder this long at a time, then pauses this long (the
/// forwarder empties its socket) before turning to the next.
const SLICE: Duration = Duration::from_millis(50);
const GAP: Duration = Duration::from_millis(5);

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
                    follow: None,
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

/// One target of the generator: its connected socket and its prebuilt datagrams (sealed with
/// the target's keys, if any).
struct GeneratorTarget {
    socket: UdpSocket,
    datagrams: Vec<Vec<u8>>,
    headers: Vec<libc::mmsghdr>,
    // The headers point at these.
    _iovecs: Vec<libc::iovec>,
    auth: Option<pmnet_proto::Authenticator>,
    sealed_at: Instant,
    sent: u64,
    active: Duration,
}

impl GeneratorTarget {
    fn new(
        target: SocketAddr,
        config: &CapacityConfig,
        keys: Option<pmnet_runtime::KeySet>,
    ) -> Result<GeneratorTarget, String> {
        let socket = UdpSocket::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
            .and_then(|socket| socket.connect(target).map(|()| socket))
            .map_err(|error| format!("cannot open the generator's socket: {error}"))?;
        let mut auth = keys.map(pmnet_proto::Authenticator::new);
        let datagrams: Vec<Vec<u8>> = (0..GENERATOR_SESSIONS * 16)
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
        let headers: Vec<libc::mmsghdr> = (0..datagrams.len())
            .map(|index| {
                // SAFETY: a zeroed mmsghdr is valid (integers and null pointers).
                let mut header: libc::mmsghdr = unsafe { std::mem::zeroed() };
                header.msg_hdr.msg_iov = &mut iovecs[index];
                header.msg_hdr.msg_iovlen = 1;
                header
            })
            .collect();
        Ok(GeneratorTarget {
            socket,
            datagrams,
            headers,
            _iovecs: iovecs,
            auth,
            sealed_at: Instant::now(),
            sent: 0,
            active: Duration::ZERO,
        })
    }

    /// Send as fast as `sendmmsg` goes until `until` (or `stop`).
    fn send_until(&mut self, until: Instant, stop: &AtomicBool) {
        use std::os::fd::AsRawFd;
        let fd = self.socket.as_raw_fd();
        let batches = self.datagrams.len() / BATCH_LEN;
        let start = Instant::now();
        let mut batch = 0usize;
        let mut turns = 0u32;
        loop {
            turns = turns.wrapping_add(1);
            if turns % 64 == 0 && (Instant::now() >= until || stop.load(Ordering::Relaxed)) {
                break;
            }
            // Sealed datagrams are sealed again every 50 ms, as clients seal each request
            // afresh: a device reuses only a trailer sealed in the current second (and
            // receivers refuse one older than the replay window). In place: the buffers keep
            // their addresses, so the prebuilt batches still point at them.
            if let Some(auth) = self.auth.as_mut() {
                if self.sealed_at.elapsed() >= RESEAL_EVERY {
                    for datagram in &mut self.datagrams {
                        datagram.truncate(datagram.len() - pmnet_auth::TRAILER_LEN);
                        auth.seal(datagram);
                    }
                    self.sealed_at = Instant::now();
                }
            }
            // SAFETY: the headers of this batch point at live iovecs and datagrams; the
            // socket is connected, so no addresses are needed.
            let result = unsafe {
                libc::sendmmsg(
                    fd,
                    self.headers[batch * BATCH_LEN..].as_mut_ptr(),
                    BATCH_LEN as libc::c_uint,
                    0,
                )
            };
            if result > 0 {
                self.sent += result as u64;
            } else {
                // ECONNREFUSED from an ICMP error, ENOBUFS and the like: carry on.
                std::thread::yield_now();
            }
            batch = (batch + 1) % batches;
        }
        self.active += start.elapsed();
    }
}

/// Send as fast as possible, in turns of [`SLICE`] to each target with a pause of [`GAP`]
/// between turns (the last target empties its socket), until every target had `each` of
/// sending or `stop`; returns each target's datagrams sent and time it was sent to. The
/// generator is as cheap as a sender can be (connected sockets, `sendmmsg` of prebuilt
/// batches, no copies), so that the forwarders, not the generator, are the bottleneck.
fn generate(
    targets: &[(SocketAddr, Option<pmnet_runtime::KeySet>)],
    config: &CapacityConfig,
    each: Duration,
    stop: &AtomicBool,
) -> Result<Vec<(u64, Duration)>, String> {
    if let Some(cpu) = config.generator_cpu {
        pin_current_thread(cpu)?;
    }
    let mut generators = targets
        .iter()
        .map(|(target, keys)| GeneratorTarget::new(*target, config, keys.clone()))
        .collect::<Result<Vec<_>, String>>()?;
    'turns: loop {
        for generator in &mut generators {
            if stop.load(Ordering::Relaxed) {
                break 'turns;
            }
            if generator.active >= each {
                continue;
            }
            let slice = SLICE.min(each - generator.active);
            generator.send_until(Instant::now() + slice, stop);
            std::thread::sleep(GAP);
        }
        if generators.iter().all(|generator| generator.active >= each) {
            break;
        }
    }
    Ok(generators
        .iter()
        .map(|generator| (generator.sent, generator.active))
        .collect())
}

/// One round: every forwarder of `forwarders` running at once, the generator sending to each
/// in turn (so a drift of the machine's speed hits all alike) for `config.duration` each.
fn measure_round(
    forwarders: &[Forwarder],
    config: &CapacityConfig,
    shutdown: &Shutdown,
) -> Result<Vec<CapacityResult>, String> {
    // The sinks: bound, never read. Their buffers fill and the kernel drops what arrives
    // after the forwarders have done all of their work on it.
    let mut sinks = Vec::new();
    let mut running = Vec::new();
    for &forwarder in forwarders {
        let sink = UdpSocket::bind("127.0.0.1:0")
            .map_err(|error| format!("cannot open the sink socket: {error}"))?;
        let sink_addr = sink
            .local_addr()
            .map_err(|error| format!("sink address: {error}"))?;
        let forwarder_shutdown = Shutdown::new();
        let (addr, handle) =
            start_forwarder(forwarder, config, sink_addr, forwarder_shutdown.clone())?;
        sinks.push(sink);
        running.push((forwarder, addr, handle, forwarder_shutdown));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let generator = {
        let stop = stop.clone();
        let config = config.clone();
        let targets: Vec<(SocketAddr, Option<pmnet_runtime::KeySet>)> = running
            .iter()
            .map(|(forwarder, addr, ..)| (*addr, forwarder.keys(&config)))
            .collect();
        let each = config.duration;
        std::thread::Builder::new()
            .name("pmnet-generator".into())
            .spawn(move || generate(&targets, &config, each, &stop))
            .map_err(|error| format!("cannot start the generator thread: {error}"))?
    };
    while !generator.is_finished() {
        if shutdown.is_requested() {
            stop.store(true, Ordering::Relaxed);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let generated = generator
        .join()
        .map_err(|_| "the generator thread panicked".to_owned())??;
    std::thread::sleep(DRAIN);
    let mut results = Vec::new();
    for ((forwarder, _, handle, forwarder_shutdown), (offered, elapsed)) in
        running.into_iter().zip(generated)
    {
        forwarder_shutdown.request();
        let counts = handle
            .join()
            .map_err(|_| "the forwarder thread panicked".to_owned())??;
        let seconds = elapsed.as_secs_f64().max(1e-9);
        let dropped = offered.saturating_sub(counts.received);
        results.push(CapacityResult {
            forwarder: forwarder.name().to_owned(),
            packets_per_s: (counts.forwarded as f64 / seconds).round(),
            offered_per_s: (offered as f64 / seconds).round(),
            dropped_before_forwarder: if offered > 0 {
                dropped as f64 / offered as f64
            } else {
                0.0
            },
            forwarded: counts.forwarded,
            // The forwarder's CPU time (it sleeps when idle) per datagram it read: unlike
            // the packet rate, this hardly moves when other work shares the machine.
            cpu_ns_per_datagram: (counts.received > 0)
                .then(|| (counts.cpu_ns as f64 / counts.received as f64).round()),
            rounds_per_s: Vec::new(),
            measured_s: (seconds * 1000.0).round() / 1000.0,
            datagram_bytes: pmnet_wire::HEADER_LEN
                + config.payload.len()
                + forwarder
                    .keys(config)
                    .map_or(0, |_| pmnet_auth::TRAILER_LEN),
        });
    }
    drop(sinks);
    Ok(results)
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
    // Sleeping forwarders run side by side and take turns; spinning ones would take the
    // forwarder's CPU from each other, so they run one after the other.
    let together = config.wait == WaitMode::Blocking;
    'rounds: for _ in 0..config.rounds.max(1) {
        if together {
            if shutdown.is_requested() {
                break 'rounds;
            }
            for (index, result) in measure_round(&forwarders, config, shutdown)?
                .into_iter()
                .enumerate()
            {
                samples[index].push(result);
            }
            continue;
        }
        for (index, forwarder) in forwarders.iter().enumerate() {
            if shutdown.is_requested() {
                break 'rounds;
            }
            let mut result = measure_round(std::slice::from_ref(forwarder), config, shutdown)?;
            samples[index].append(&mut result);
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

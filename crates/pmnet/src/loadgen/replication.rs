//! Replication side by side: `pmnet bench --replicas 1,2,3`. For each replication factor R,
//! three ways to have an update survive the permanent loss of R − 1 copies, on the same
//! machinery and in one run (docs/replication.md):
//!
//! - `rep-client`: client-side replication — the client sends each update to R independent
//!   servers itself and waits for every reply;
//! - `rep-server`: server-side replication — the client waits for the primary's reply, which
//!   the primary sends only once its R − 1 replica servers applied the update
//!   (`pmnet server --replica`);
//! - `rep-pmnet`: R PMNet devices in series in front of one server — the client waits for
//!   the PMNet-ACKs of all R devices (`pmnet client --replicas R`); each device after the
//!   first names the one before it (`--previous-device`), so each acks the client directly;
//! - `rep-fanout`: R PMNet devices side by side in front of one server — the client sends
//!   each update to all R at once and waits for their PMNet-ACKs; each forwards its copy to
//!   the server, which applies it once (`pmnet client --fan-out … --replicas R`).
//!
//! Every part is started as `pmnet server` / `pmnet device` start it (the same runtimes, as
//! threads of this process, on loopback, files under the bench's directory, removed at the
//! end), fresh for every mode, with the run's placement: clients on the client CPU, every
//! device on the device CPU, every server on the server CPU. Each client keeps one update in
//! flight; each mode reports the median round by p50.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use clap::Args;
use hdrhistogram::Histogram;

use pmnet_proto::ClientEvent;
use pmnet_runtime::{pin_current_thread, ClientSession, Metrics, SessionOptions, Shutdown};

use super::figures::{cell, ratio, thousands};
use super::latency::summarize;
use super::plan::{median_round, Plan, Target};
use super::results::{ModeResult, ReplicationRatio};
use super::system::{
    start_device, start_server_at, temp_path, DevicePlace, FileGuard, LoopbackConfig, ServerPlace,
};
use super::workload::{RequestGenerator, Workload};

/// `pmnet bench`'s replication option.
#[derive(Debug, Clone, Args)]
pub struct ReplicationArgs {
    /// Instead of the usual modes: replication factors to compare (comma-separated, 1 to 8),
    /// each with client-side replication (rep-client), server-side replication (rep-server)
    /// PMNet devices in series (rep-pmnet) and PMNet devices side by side, the client sending
    /// to each (rep-fanout), in one run.
    #[arg(long = "replicas", value_name = "R,...", value_delimiter = ',',
          value_parser = clap::value_parser!(u8).range(1..=8))]
    pub replicas: Vec<u8>,
}

/// How an update is replicated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RepMode {
    Client,
    Server,
    Pmnet,
    Fanout,
}

impl RepMode {
    pub const ALL: [RepMode; 4] = [
        RepMode::Client,
        RepMode::Server,
        RepMode::Pmnet,
        RepMode::Fanout,
    ];

    pub fn name(self) -> &'static str {
        match self {
            RepMode::Client => "rep-client",
            RepMode::Server => "rep-server",
            RepMode::Pmnet => "rep-pmnet",
            RepMode::Fanout => "rep-fanout",
        }
    }

    fn waits_for(self, replicas: u8) -> String {
        match (self, replicas) {
            (RepMode::Client, 1) => "the server's reply".to_owned(),
            (RepMode::Client, r) => format!("the replies of {r} servers it sent to"),
            (RepMode::Server, 1) => "the server's reply (no replicas)".to_owned(),
            (RepMode::Server, r) => format!("the primary's reply, after its {} replicas", r - 1),
            (RepMode::Pmnet, 1) => "one device's PMNet-ACK".to_owned(),
            (RepMode::Pmnet, r) => format!("PMNet-ACKs of {r} devices in series"),
            (RepMode::Fanout, 1) => "one device's PMNet-ACK (no fan-out)".to_owned(),
            (RepMode::Fanout, r) => format!("PMNet-ACKs of {r} devices it sent to"),
        }
    }
}

/// A started system of one mode: its threads stop and its files go when it is dropped.
struct RepSystem {
    shutdown: Shutdown,
    threads: Vec<JoinHandle<Metrics>>,
    /// Where the client sends: every server (rep-client), the primary, or the first device.
    peers: Vec<SocketAddr>,
    /// rep-fanout: the other devices every update goes to as well.
    fan_out: Vec<SocketAddr>,
    server_medium: String,
    device_medium: Option<String>,
    /// Declared last: removed after the threads stopped.
    _files: Vec<FileGuard>,
}

impl Drop for RepSystem {
    fn drop(&mut self) {
        self.shutdown.request();
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// A loopback address no one listens on now (the kernel's choice, released): one a process
/// started later listens on, which others must know before it starts (the replicas' address
/// for their primary, a device's for the device after it).
fn unused_loopback_addr() -> Result<SocketAddr, String> {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .and_then(|socket| socket.local_addr())
        .map_err(|error| format!("cannot find a free loopback port: {error}"))
}

impl RepSystem {
    fn start(config: &LoopbackConfig, mode: RepMode, replicas: u8) -> Result<RepSystem, String> {
        let mut system = RepSystem {
            shutdown: Shutdown::new(),
            threads: Vec::new(),
            peers: Vec::new(),
            fan_out: Vec::new(),
            server_medium: String::new(),
            device_medium: None,
            _files: Vec::new(),
        };
        let r = usize::from(replicas);
        match mode {
            RepMode::Client => {
                for _ in 0..r {
                    let place = RepSystem::place(config, Vec::new(), Vec::new());
                    let addr = system.server(config, place)?;
                    system.peers.push(addr);
                }
            }
            RepMode::Server => {
                // The primary first (it forwards nothing until a client sends), at the
                // replicas' addresses chosen beforehand; then the replicas, its address as
                // their device.
                let replica_addrs = (1..r)
                    .map(|_| unused_loopback_addr())
                    .collect::<Result<Vec<_>, _>>()?;
                let place = RepSystem::place(config, Vec::new(), replica_addrs.clone());
                let primary = system.server(config, place)?;
                system.peers.push(primary);
                for addr in replica_addrs {
                    let mut place = RepSystem::place(config, vec![primary], Vec::new());
                    place.listen = addr;
                    system.server(config, place)?;
                }
            }
            RepMode::Pmnet => {
                let place = RepSystem::place(config, Vec::new(), Vec::new());
                let mut next = system.server(config, place)?;
                // Where each device listens, chosen first: each names the one before it
                // (`--previous-device`), as docs/replication.md tells an operator to, so that
                // it acks the client directly. The last device first: each one's next hop must
                // listen before it.
                let listen = (0..replicas)
                    .map(|_| unused_loopback_addr())
                    .collect::<Result<Vec<_>, _>>()?;
                for index in (0..usize::from(replicas)).rev() {
                    let place = DevicePlace {
                        listen: listen[index],
                        previous_devices: index
                            .checked_sub(1)
                            .map(|before| (config.server_id, listen[before]))
                            .into_iter()
                            .collect(),
                    };
                    next = system.device(config, index as u8, next, place)?;
                }
                system.peers.push(next);
            }
            RepMode::Fanout => {
                let place = RepSystem::place(config, Vec::new(), Vec::new());
                let server = system.server(config, place)?;
                for index in 0..replicas {
                    let device = system.device(config, index, server, DevicePlace::anywhere())?;
                    if index == 0 {
                        system.peers.push(device);
                    } else {
                        system.fan_out.push(device);
                    }
                }
            }
        }
        Ok(system)
    }

    /// Device number `index` (its id the run's plus `index`) at `place`, forwarding to
    /// `next`; where it listens.
    fn device(
        &mut self,
        config: &LoopbackConfig,
        index: u8,
        next: SocketAddr,
        place: DevicePlace,
    ) -> Result<SocketAddr, String> {
        let mut device_config = config.clone();
        device_config.device_id = config.device_id + u16::from(index);
        let log = temp_path(&config.dir, "log");
        self._files.push(FileGuard(Some(log.clone())));
        let device = start_device(
            &device_config,
            log,
            0,
            &[(config.server_id, next)],
            place,
            &self.shutdown,
        )?;
        self.device_medium = Some(device.medium);
        self.threads.push(device.thread);
        Ok(device.data)
    }

    /// A server's place: on a loopback port the kernel chooses.
    fn place(
        config: &LoopbackConfig,
        devices: Vec<SocketAddr>,
        replicas: Vec<SocketAddr>,
    ) -> ServerPlace {
        ServerPlace {
            server_id: config.server_id,
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            devices,
            replicas,
        }
    }

    fn server(
        &mut self,
        config: &LoopbackConfig,
        place: ServerPlace,
    ) -> Result<SocketAddr, String> {
        let data = temp_path(&config.dir, "data");
        self._files.push(FileGuard(Some(data.clone())));
        let started = start_server_at(config, place, data, &self.shutdown)?;
        self.server_medium = started.medium;
        self.threads.push(started.thread);
        Ok(started.addr)
    }
}

/// One client thread's plan.
struct ClientJob {
    mode: RepMode,
    replicas: u8,
    peers: Vec<SocketAddr>,
    fan_out: Vec<SocketAddr>,
    plan_server_id: u16,
    wait: pmnet_runtime::WaitMode,
    cpu: Option<usize>,
    keys: Option<pmnet_runtime::KeySet>,
    workload: Workload,
    seed: u64,
    index: u32,
    measure_from: Instant,
    measure_until: Instant,
}

/// What a client thread measured.
struct ClientMeasure {
    latency: Histogram<u64>,
    failed: u64,
    retransmissions: u64,
}

/// Longest an update may go unanswered before the run gives up on the mode.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(20);

fn run_client(job: ClientJob) -> Result<ClientMeasure, String> {
    if let Some(cpu) = job.cpu {
        pin_current_thread(cpu).map_err(|error| format!("pin a client to CPU {cpu}: {error}"))?;
    }
    let mut sessions = Vec::new();
    for &peer in &job.peers {
        let mut options = SessionOptions::new(job.plan_server_id, peer);
        options.wait = job.wait;
        options.window = Some(1);
        options.keys = job.keys.clone();
        if matches!(job.mode, RepMode::Pmnet | RepMode::Fanout) {
            options.replicas = job.replicas;
            options.fan_out = job.fan_out.clone();
        } else {
            options.peer_role = SessionOptions::SERVER_PEER;
        }
        sessions.push(
            ClientSession::open(options)
                .map_err(|error| format!("open a client session to {peer}: {error}"))?,
        );
    }
    let mut generator = RequestGenerator::new(&job.workload, job.seed, job.index);
    let mut latency =
        Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("valid histogram bounds");
    let mut failed = 0;
    let mut seqs = Vec::with_capacity(sessions.len());
    while Instant::now() < job.measure_until {
        let request = generator.next_request();
        let started = Instant::now();
        seqs.clear();
        for session in &mut sessions {
            let seq = session
                .start_update(&request.bytes)
                .map_err(|error| format!("start an update: {error}"))?;
            seqs.push(seq);
        }
        for (session, &seq) in sessions.iter_mut().zip(&seqs) {
            loop {
                match session.next_event(Some(started + ANSWER_TIMEOUT)) {
                    Some(ClientEvent::Completed { seq: done, .. }) if done == seq => break,
                    Some(ClientEvent::Failed { seq: done, .. }) if done == seq => {
                        failed += 1;
                        break;
                    }
                    Some(_) => {}
                    None => {
                        return Err(format!(
                            "{}: no answer from {} within {} s",
                            job.mode.name(),
                            session.peer(),
                            ANSWER_TIMEOUT.as_secs()
                        ))
                    }
                }
            }
        }
        if started >= job.measure_from {
            let nanos = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
            latency.saturating_record(nanos.max(1));
        }
    }
    let retransmissions = sessions
        .iter()
        .map(|session| session.counters().retransmitted_fragments)
        .sum();
    Ok(ClientMeasure {
        latency,
        failed,
        retransmissions,
    })
}

/// Run one mode at one replication factor once.
fn run_once(
    plan: &Plan,
    config: &LoopbackConfig,
    mode: RepMode,
    replicas: u8,
    workload: &Workload,
) -> Result<(ModeResult, String, Option<String>), String> {
    let system = RepSystem::start(config, mode, replicas)?;
    let duration = plan.duration.unwrap_or(Duration::from_secs(5));
    let measure_from = Instant::now() + plan.warmup;
    let measure_until = measure_from + duration;
    let mut threads = Vec::new();
    for index in 0..plan.clients {
        let job = ClientJob {
            mode,
            replicas,
            peers: system.peers.clone(),
            fan_out: system.fan_out.clone(),
            plan_server_id: plan.server_id,
            wait: plan.wait,
            cpu: plan.client_cpu,
            keys: plan.keys.clone(),
            workload: workload.clone(),
            seed: plan.seed,
            index,
            measure_from,
            measure_until,
        };
        threads.push(
            std::thread::Builder::new()
                .name(format!("pmnet-bench-client-{index}"))
                .spawn(move || run_client(job))
                .map_err(|error| format!("cannot start a client thread: {error}"))?,
        );
    }
    let mut latency =
        Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("valid histogram bounds");
    let (mut failed, mut retransmissions) = (0, 0);
    let mut first_error = None;
    for thread in threads {
        match thread.join() {
            Ok(Ok(measure)) => {
                latency
                    .add(&measure.latency)
                    .map_err(|error| format!("merge latencies: {error}"))?;
                failed += measure.failed;
                retransmissions += measure.retransmissions;
            }
            Ok(Err(error)) => {
                first_error.get_or_insert(error);
            }
            Err(_) => {
                first_error.get_or_insert_with(|| "a client thread panicked".to_owned());
            }
        }
    }
    if let Some(error) = first_error {
        return Err(error);
    }
    let mut result =
        ModeResult::from_summary(mode.name(), &mode.waits_for(replicas), summarize(&latency));
    result.measured_s = duration.as_secs_f64();
    result.ops_per_s = latency.len() as f64 / duration.as_secs_f64();
    result.failed = failed;
    result.client_retransmissions = retransmissions;
    result.replicas = Some(replicas);
    let server_medium = system.server_medium.clone();
    let device_medium = system.device_medium.clone();
    drop(system);
    Ok((result, server_medium, device_medium))
}

/// What a replication run measured.
#[derive(Debug)]
pub struct ReplicationRun {
    pub results: Vec<ModeResult>,
    pub ratios: Vec<ReplicationRatio>,
    /// The device log's medium and the servers' (from the parts started).
    pub media: (String, String),
    pub interrupted: bool,
}

/// Run every mode at every replication factor, in turns, `plan.rounds` times.
pub fn run(plan: &Plan, factors: &[u8], shutdown: &Shutdown) -> Result<ReplicationRun, String> {
    let Target::Loopback(config) = &plan.target else {
        return Err(
            "--replicas starts its own servers and devices on loopback; drop the \
                    addresses of running ones (--device, --server, --forward)"
                .into(),
        );
    };
    let mut workload = plan.workload.clone();
    workload.update_ratio = 1.0;
    let runs: Vec<(u8, RepMode)> = factors
        .iter()
        .flat_map(|&r| RepMode::ALL.into_iter().map(move |mode| (r, mode)))
        .collect();
    let mut rounds: Vec<Vec<ModeResult>> = vec![Vec::new(); runs.len()];
    let mut media = (String::new(), String::new());
    let mut interrupted = false;
    'rounds: for round in 0..plan.rounds.max(1) {
        for (index, &(replicas, mode)) in runs.iter().enumerate() {
            if shutdown.is_requested() {
                interrupted = true;
                break 'rounds;
            }
            if plan.progress {
                eprintln!(
                    "  round {}/{}: {} with R = {replicas}",
                    round + 1,
                    plan.rounds.max(1),
                    mode.name()
                );
            }
            let (result, server_medium, device_medium) =
                run_once(plan, config, mode, replicas, &workload)?;
            media.1 = server_medium;
            if let Some(device_medium) = device_medium {
                media.0 = device_medium;
            }
            rounds[index].push(result);
        }
    }
    let results: Vec<ModeResult> = rounds.into_iter().filter_map(median_round).collect();
    let ratios = ratios(&results);
    Ok(ReplicationRun {
        results,
        ratios,
        media,
        interrupted,
    })
}

fn find(results: &[ModeResult], mode: RepMode, replicas: u8) -> Option<&ModeResult> {
    results
        .iter()
        .find(|result| result.mode == mode.name() && result.replicas == Some(replicas))
}

/// rep-pmnet against rep-server and rep-client at each R, rep-pmnet and rep-fanout at each R
/// against rep-pmnet with one device (the cost of the chain, of the fan-out), and rep-fanout
/// against rep-pmnet.
pub fn ratios(results: &[ModeResult]) -> Vec<ReplicationRatio> {
    let mut factors: Vec<u8> = results
        .iter()
        .filter_map(|result| result.replicas)
        .collect();
    factors.sort_unstable();
    factors.dedup();
    let mut out = Vec::new();
    let mut push = |replicas: u8, a: &ModeResult, b: &ModeResult, b_replicas: u8| {
        out.push(ReplicationRatio {
            replicas,
            numerator: a.mode.clone(),
            denominator: b.mode.clone(),
            denominator_replicas: b_replicas,
            p50: ratio(a.p50_us, b.p50_us),
            p99: ratio(a.p99_us, b.p99_us),
            ops_per_s: ratio(Some(a.ops_per_s), Some(b.ops_per_s)),
        });
    };
    for &r in &factors {
        let Some(pmnet) = find(results, RepMode::Pmnet, r) else {
            continue;
        };
        for other in [RepMode::Server, RepMode::Client] {
            if let Some(other) = find(results, other, r) {
                push(r, pmnet, other, r);
            }
        }
        if r > 1 {
            if let Some(single) = find(results, RepMode::Pmnet, 1) {
                push(r, pmnet, single, 1);
            }
            if let Some(fanout) = find(results, RepMode::Fanout, r) {
                if let Some(single) = find(results, RepMode::Pmnet, 1) {
                    push(r, fanout, single, 1);
                }
                push(r, fanout, pmnet, r);
            }
        }
    }
    out
}

fn ratio_cell(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_owned(), |value| format!("{value:.2}×"))
}

/// The results, one line per mode and replication factor.
pub fn results_text(results: &[ModeResult]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "  {:>2} {:<11} {:<44} {:>8} {:>8} {:>9} {:>10} {:>9}",
        "R", "mode", "the client waits for", "p50 µs", "p99 µs", "p99.9 µs", "ops/s", "requests"
    );
    for result in results {
        let _ = writeln!(
            out,
            "  {:>2} {:<11} {:<44} {:>8} {:>8} {:>9} {:>10} {:>9}",
            result.replicas.unwrap_or(0),
            result.mode,
            result.waits_for,
            cell(result.p50_us),
            cell(result.p99_us),
            cell(result.p999_us),
            thousands(result.ops_per_s),
            thousands(result.requests as f64),
        );
    }
    out
}

/// The ratios, one line each.
pub fn ratios_text(ratios: &[ReplicationRatio]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "  {:<26} {:>8} {:>8} {:>8}",
        "ratio (below 1: faster)", "p50", "p99", "ops/s"
    );
    for ratio in ratios {
        let name = format!(
            "{} R={} / {} R={}",
            ratio.numerator, ratio.replicas, ratio.denominator, ratio.denominator_replicas
        );
        let _ = writeln!(
            out,
            "  {:<26} {:>8} {:>8} {:>8}",
            name,
            ratio_cell(ratio.p50),
            ratio_cell(ratio.p99),
            ratio_cell(ratio.ops_per_s)
        );
    }
    out
}

//! What a benchmark runs: the [`Plan`] (modes, workload, placement, target), the setting it
//! reports, and the running of its modes, one after the other.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use clap::ValueEnum;
use hdrhistogram::Histogram;
use pmnet_pktstore::EngineKind;
use pmnet_runtime::{online_cpu_count, pin_current_thread, SessionOptions, Shutdown, WaitMode};

use super::cache::{CachePlan, CACHE_SUFFIX};
use super::cpu::{CpuSource, SystemCpu};
use super::latency::{cdf_points, new_histogram, summarize};
use super::popularity::{Popularity, PopularityKind};
use super::progress::Progress;
use super::rack::{RackArgs, Timeline};
use super::rack_client::run_rack_client;
use super::recovery::Fine;
use super::results::CacheResult;
use super::worker::{
    run_echo_client, run_session_client, ClientOutcome, ClientPlan, RackRoute, Shared,
};
use super::workload::SharedPopularity;
use super::{KeyDistribution, LoopbackConfig, LoopbackSystem, Mode, ModeResult, Setting, Workload};

/// Where the client, device and server threads run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Pinning {
    /// With two or more CPUs: clients on CPU 0 and the server on CPU 1; the device next to
    /// its client on CPU 0 with one client (as a ToR switch or the client's NIC would be: the
    /// latency setting), on CPU 1 with the server under load from several clients (where the
    /// clients' own CPU would otherwise cap the device: docs/benchmarks.md). One CPU: no
    /// pinning.
    Auto,
    /// Leave placement to the scheduler.
    None,
}

/// Addresses of running processes to measure.
#[derive(Debug, Clone, Default)]
pub struct ExternalTargets {
    pub device: Option<SocketAddr>,
    pub forward: Option<SocketAddr>,
    pub echo: Option<SocketAddr>,
    pub server: Option<SocketAddr>,
    pub device_metrics: Option<SocketAddr>,
    pub server_metrics: Option<SocketAddr>,
}

/// What to measure against.
#[derive(Debug, Clone)]
pub enum Target {
    /// Start a device and server in this process for every mode.
    Loopback(LoopbackConfig),
    External(ExternalTargets),
}

/// A validated benchmark run, from `pmnet bench`'s options or the demo's.
#[derive(Debug, Clone)]
pub struct Plan {
    pub modes: Vec<Mode>,
    pub workload: Workload,
    pub clients: u32,
    pub window: u32,
    /// Measured time per mode (`None` when `requests` is set).
    pub duration: Option<Duration>,
    pub requests: Option<u64>,
    pub warmup: Duration,
    pub seed: u64,
    /// Times every mode runs, in turns; each mode reports its median round.
    pub rounds: u32,
    /// Every datagram authenticated with these keys (`--key-file`).
    pub keys: Option<pmnet_runtime::KeySet>,
    /// The keys of the -auth modes: `keys`, or a fresh key.
    pub auth_keys: pmnet_runtime::KeySet,
    pub wait: WaitMode,
    pub client_cpu: Option<usize>,
    pub device_cpu: Option<usize>,
    pub server_cpu: Option<usize>,
    pub server_id: u16,
    pub target: Target,
    pub progress: bool,
    /// The rack of `--servers` / `--server-max-ops-per-s` (`None`: one server, no limit).
    pub rack: Option<super::rack::RackArgs>,
    /// The read cache in the rack's device (`--cache`).
    pub cache: CachePlan,
}

/// CPUs of the client threads, the device and the server (`None`: not pinned).
pub type Placement = (Option<usize>, Option<usize>, Option<usize>);

/// CPU placement from the options.
pub fn resolve_pinning(
    pinning: Pinning,
    client: Option<usize>,
    device: Option<usize>,
    server: Option<usize>,
    loopback: bool,
    clients: u32,
) -> Result<Placement, String> {
    let online = online_cpu_count();
    for (what, cpu) in [("client", client), ("device", device), ("server", server)] {
        if let Some(cpu) = cpu {
            if cpu >= online {
                return Err(format!(
                    "--{what}-cpu {cpu}: this machine has {online} online CPUs (0..={}); choose \
                     one of those",
                    online - 1
                ));
            }
        }
    }
    let (auto_client, auto_device, auto_server) = match pinning {
        Pinning::Auto if online >= 2 && loopback && clients <= 1 => (Some(0), Some(0), Some(1)),
        Pinning::Auto if online >= 2 && loopback => (Some(0), Some(1), Some(1)),
        _ => (None, None, None),
    };
    Ok((
        client.or(auto_client),
        device.or(auto_device),
        server.or(auto_server),
    ))
}

impl Plan {
    fn is_loopback(&self) -> bool {
        matches!(self.target, Target::Loopback(_))
    }

    /// Where the threads run, in words.
    pub fn placement(&self) -> String {
        let cpu =
            |cpu: Option<usize>| cpu.map_or_else(|| "any CPU".to_owned(), |c| format!("CPU {c}"));
        if self.is_loopback() {
            if self.client_cpu.is_none() && self.device_cpu.is_none() && self.server_cpu.is_none() {
                return "not pinned (client, device and server threads go where the scheduler \
                        puts them)"
                    .into();
            }
            format!(
                "clients on {}, device on {}, server on {}",
                cpu(self.client_cpu),
                cpu(self.device_cpu),
                cpu(self.server_cpu)
            )
        } else {
            format!(
                "clients on {}; device and server are external processes",
                cpu(self.client_cpu)
            )
        }
    }

    /// The keys of `mode`'s datagrams: the -auth modes' always, the others' with
    /// `--key-file`.
    pub fn mode_keys(&self, mode: Mode) -> Option<pmnet_runtime::KeySet> {
        if mode.is_authenticated() {
            Some(self.auth_keys.clone())
        } else {
            self.keys.clone()
        }
    }

    /// The setting, for the report. `media` are the device's and server's medium texts.
    pub fn setting(&self, media: Option<(String, String)>) -> Setting {
        let (medium, server_medium) = media.unwrap_or_else(|| {
            (
                "unknown: an external device (its start-up banner says)".to_owned(),
                "unknown: an external server (its start-up banner says)".to_owned(),
            )
        });
        let server_app = match &self.target {
            Target::Loopback(config) if config.ideal => "ideal handler",
            Target::Loopback(config) => match config.engine {
                Some(EngineKind::Packet) => "packet store",
                Some(EngineKind::Conventional) => "conventional engine",
                None => "key-value store (kv)",
            },
            Target::External(_) => "external",
        };
        Setting {
            busy_poll: self.wait == WaitMode::BusyPoll,
            wait: self.wait.name().to_owned(),
            pinned: self.client_cpu.is_some()
                || self.device_cpu.is_some()
                || self.server_cpu.is_some(),
            placement: self.placement(),
            client_cpu: self.client_cpu,
            device_cpu: self.device_cpu,
            server_cpu: self.server_cpu,
            medium,
            server_medium,
            server_app: server_app.to_owned(),
            payload_bytes: self.workload.value_len,
            request_datagram_bytes: pmnet_wire::HEADER_LEN + self.workload.set_request_len(),
            clients: self.clients,
            window: self.window,
            update_ratio: self.workload.update_ratio,
            keys: self.workload.keys,
            distribution: self.workload.distribution.name().to_owned(),
            zipf_exponent: (self.workload.distribution == KeyDistribution::Zipf)
                .then_some(self.workload.zipf_exponent),
            popularity: self.workload.popularity.name().to_owned(),
            popularity_change_every_s: (self.workload.popularity != PopularityKind::Static)
                .then_some(self.workload.change_every.as_secs_f64()),
            popularity_change_count: (self.workload.popularity != PopularityKind::Static)
                .then_some(self.workload.change_count),
            rack: self.rack.as_ref().map(RackArgs::text),
            seed: self.seed,
            duration_s: self.duration.map(|d| d.as_secs_f64()),
            requests_per_mode: self.requests,
            warmup_s: self.warmup.as_secs_f64(),
            target: if self.is_loopback() {
                "loopback: a device and a server started in this process for each mode".into()
            } else {
                "external processes".into()
            },
            cpus_online: online_cpu_count(),
            load_average: load_average(),
            kernel: kernel_release(),
        }
    }
}

/// The first three fields of /proc/loadavg.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|text| {
            text.split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_else(|| "unknown".into())
}

fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|text| text.trim().to_owned())
        .unwrap_or_else(|_| "unknown".into())
}

/// Media of the in-process device and server, the first time a system starts.
pub type Media = Option<(String, String)>;

impl Plan {
    /// What runs, in order: every mode, the pmnet modes once per `--cache` variant (whether
    /// the device caches reads), the others without a cache.
    pub fn runs(&self) -> Vec<(Mode, bool)> {
        let mut runs = Vec::new();
        for &mode in &self.modes {
            if mode.path() == Mode::Pmnet && self.cache.settings.is_some() {
                runs.extend(self.cache.variants.iter().map(|&cache| (mode, cache)));
            } else {
                runs.push((mode, false));
            }
        }
        runs
    }
}

/// Every mode of `plan`, one after the other, `plan.rounds` times in turns (so that a drift
/// of the machine's load hits every mode alike); each mode's result is its median round by
/// p50. Returns the results, the media (in-process systems) and whether a signal cut the run
/// short.
pub fn run_modes(
    plan: &Plan,
    shutdown: &Shutdown,
) -> Result<(Vec<ModeResult>, Media, bool), String> {
    let (rounds, media, interrupted) = run_mode_rounds(plan, shutdown)?;
    let results = rounds.into_iter().filter_map(median_round).collect();
    Ok((results, media, interrupted))
}

/// Every round of every mode: one list per mode (in the plan's order), each in round order.
/// The modes run in turns within a round, so the n-th rounds of two modes ran side by side.
pub fn run_mode_rounds(
    plan: &Plan,
    shutdown: &Shutdown,
) -> Result<(Vec<Vec<ModeResult>>, Media, bool), String> {
    let runs = plan.runs();
    let mut rounds: Vec<Vec<ModeResult>> = vec![Vec::new(); runs.len()];
    let mut media = None;
    'rounds: for _ in 0..plan.rounds.max(1) {
        for (index, &(mode, cache)) in runs.iter().enumerate() {
            if shutdown.is_requested() {
                break 'rounds;
            }
            rounds[index].push(run_mode_once(plan, mode, cache, &mut media, shutdown)?);
        }
    }
    Ok((rounds, media, shutdown.is_requested()))
}

/// The round with the median p50, noting every round's p50 when there were several.
pub(super) fn median_round(mut rounds: Vec<ModeResult>) -> Option<ModeResult> {
    if rounds.len() < 2 {
        return rounds.pop();
    }
    let p50s: Vec<String> = rounds
        .iter()
        .map(|round| round.p50_us.map_or("-".into(), |p50| format!("{p50:.1}")))
        .collect();
    let count = rounds.len();
    rounds.sort_by(|a, b| {
        a.p50_us
            .unwrap_or(f64::INFINITY)
            .total_cmp(&b.p50_us.unwrap_or(f64::INFINITY))
    });
    let mut median = rounds.swap_remove(count / 2);
    median.notes.insert(
        0,
        format!(
            "median of {count} rounds by p50 (the rounds' p50 in µs, in order: {})",
            p50s.join(", ")
        ),
    );
    Some(median)
}

/// One round of `mode`: a fresh device and server (in-process targets) and its clients.
fn run_mode_once(
    plan: &Plan,
    mode: Mode,
    cache: bool,
    media: &mut Media,
    shutdown: &Shutdown,
) -> Result<ModeResult, String> {
    let cache_settings = plan.cache.settings.filter(|_| cache);
    match &plan.target {
        Target::Loopback(config) => {
            let mut config = config.clone();
            config.keys = plan.mode_keys(mode);
            config.cache = cache_settings;
            let system = LoopbackSystem::start(&config)?;
            if media.is_none() {
                *media = Some((system.device_medium.clone(), system.server_medium.clone()));
            }
            let addresses = system.addresses.clone();
            let (peer, more_peers) = match mode.path() {
                Mode::Echo => (addresses.echo, Vec::new()),
                Mode::Baseline => (addresses.server, Vec::new()),
                Mode::Forward => (addresses.forward, Vec::new()),
                _ => (addresses.device, addresses.device_workers.clone()),
            };
            let route = plan.rack.as_ref().map(|rack| RackRoute {
                peers: match mode.path() {
                    Mode::Baseline => addresses.servers.clone(),
                    _ => vec![peer; addresses.servers.len()],
                },
                server_ids: (0..rack.servers)
                    .map(|index| plan.server_id + index)
                    .collect(),
                retransmit_timeout: rack.retransmit_timeout(plan.clients * plan.window),
                cache: cache_settings.is_some(),
            });
            let cpu = SystemCpu::new(
                (mode.path() != Mode::Baseline)
                    .then(|| CpuSource::Threads(system.device_tids.clone())),
                (mode.path() != Mode::Echo).then(|| CpuSource::Threads(system.server_tids.clone())),
            );
            let result = run_mode(plan, mode, (peer, more_peers), route, cpu, shutdown);
            let counters = system.stop();
            result.map(|mut result| {
                if mode != Mode::Echo {
                    result.notes.extend(counters.notes());
                }
                if let Some(settings) = &cache_settings {
                    result.mode.push_str(CACHE_SUFFIX);
                    result.waits_for = "as pmnet; reads answered by the device's cache or \
                                        a server"
                        .to_owned();
                    let by_device = result.reads_by_device.map_or(0, |reads| reads.count);
                    let by_server = result.reads_by_server.map_or(0, |reads| reads.count);
                    result.cache = Some(CacheResult::new(
                        &counters.device,
                        by_device + by_server,
                        by_device,
                        settings,
                    ));
                }
                result
            })
        }
        Target::External(external) => {
            let peer = match mode.path() {
                Mode::Echo => external.echo,
                Mode::Baseline => external.server,
                Mode::Forward => external.forward,
                _ => external.device,
            }
            .ok_or_else(|| format!("no address for mode {}", mode.name()))?;
            let cpu = SystemCpu::new(
                external
                    .device_metrics
                    .filter(|_| mode.path() != Mode::Baseline)
                    .map(CpuSource::Process),
                external
                    .server_metrics
                    .filter(|_| mode.path() != Mode::Echo)
                    .map(CpuSource::Process),
            );
            run_mode(plan, mode, (peer, Vec::new()), None, cpu, shutdown)
        }
    }
}

/// When a mode measures: from `start`, the warm-up, then from `measure_from` until
/// `measure_until` (`None`: until the requests are measured).
#[derive(Debug, Clone, Copy)]
struct Stretch {
    start: Instant,
    measure_from: Instant,
    measure_until: Option<Instant>,
}

/// Run one mode's clients to the end and summarise.
fn run_mode(
    plan: &Plan,
    mode: Mode,
    peers: (SocketAddr, Vec<SocketAddr>),
    route: Option<RackRoute>,
    mut cpu: SystemCpu,
    shutdown: &Shutdown,
) -> Result<ModeResult, String> {
    let servers = plan.rack.as_ref().map_or(1, |rack| rack.servers);
    let shared = Shared::new(servers, plan.clients);
    let popularity = match plan.workload.popularity {
        PopularityKind::Static => None,
        kind => Some(Arc::new(std::sync::RwLock::new(Popularity::new(
            kind,
            plan.workload.keys,
            plan.workload.change_count,
        )?))),
    };
    let start = Instant::now();
    let measure_from = start + plan.warmup;
    let stretch = Stretch {
        start,
        measure_from,
        measure_until: plan.duration.map(|duration| measure_from + duration),
    };
    let clients = ClientsStart {
        peers: &peers,
        route: route.filter(|_| mode != Mode::Echo),
        popularity: popularity.clone(),
    };
    let cache = clients.route.as_ref().is_some_and(|route| route.cache);
    let handles = start_clients(plan, mode, clients, &shared, stretch)?;
    let mut run = RunState::new(plan, mode, cache, servers, stretch, popularity);
    wait_for_clients(plan, mode, &shared, &handles, &mut run, &mut cpu, shutdown);
    let stopped = Instant::now();
    let totals = join_clients(handles, mode)?;
    let mut out = mode_result(mode, &totals, stretch, stopped);
    out.cpu = cpu.per_request(totals.client_cpu_ns, out.requests);
    run.finish(plan, &totals, &mut out);
    add_notes(&mut out, plan, mode);
    Ok(out)
}

/// Where a mode's clients send, and the popularity they share.
struct ClientsStart<'a> {
    peers: &'a (SocketAddr, Vec<SocketAddr>),
    route: Option<RackRoute>,
    popularity: Option<SharedPopularity>,
}

/// What the driver of a mode keeps while its clients run: the line-per-second series of a
/// rack, and the popularity it changes.
struct RunState {
    stretch: Stretch,
    timeline: Option<Timeline>,
    /// The 100 ms series around popularity changes (a rack whose popularity changes).
    fine: Option<Fine>,
    popularity: Option<SharedPopularity>,
    next_change: Instant,
    change_every: Duration,
    change_rng: rand_chacha::ChaCha8Rng,
}

impl RunState {
    fn new(
        plan: &Plan,
        mode: Mode,
        cache: bool,
        servers: u16,
        stretch: Stretch,
        popularity: Option<SharedPopularity>,
    ) -> RunState {
        use rand::SeedableRng;
        let timeline = (plan.rack.is_some() && mode != Mode::Echo)
            .then(|| Timeline::new(stretch.measure_from, servers, plan.server_id));
        if timeline.is_some() {
            println!(
                "  {}{} (a line per second of the measured stretch):",
                mode.name(),
                if cache { CACHE_SUFFIX } else { "" }
            );
        }
        let change_every = plan.workload.change_every.max(Duration::from_millis(100));
        RunState {
            stretch,
            fine: (timeline.is_some() && popularity.is_some())
                .then(|| Fine::new(stretch.measure_from)),
            timeline,
            popularity,
            next_change: stretch.measure_from + change_every,
            change_every,
            change_rng: rand_chacha::ChaCha8Rng::seed_from_u64(super::workload::client_seed(
                plan.seed,
                u32::MAX,
            )),
        }
    }

    fn changes(&self) -> u64 {
        self.popularity.as_ref().map_or(0, |popularity| {
            popularity
                .read()
                .unwrap_or_else(|error| error.into_inner())
                .changes()
        })
    }

    /// Change the popularity and print the second's line when they are due.
    fn tick(&mut self, shared: &Shared, now: Instant) {
        let measuring = self.stretch.measure_until.is_none_or(|until| now < until);
        if let (Some(fine), true) = (&mut self.fine, now >= self.stretch.measure_from) {
            fine.tick(shared.measured.load(Ordering::Relaxed), now);
        }
        if let (Some(popularity), true) = (&self.popularity, measuring) {
            while now >= self.next_change {
                popularity
                    .write()
                    .unwrap_or_else(|error| error.into_inner())
                    .change(&mut self.change_rng);
                if let Some(fine) = &mut self.fine {
                    fine.changed(self.next_change);
                }
                self.next_change += self.change_every;
            }
        }
        let changes = self.changes();
        if let Some(timeline) = &mut self.timeline {
            if let Some(line) = timeline.sample(shared, now, changes) {
                println!("{line}");
            }
        }
    }

    /// When the driver must look next.
    fn next_at(&self) -> Option<Instant> {
        let timeline = self.timeline.as_ref().map(Timeline::next_at);
        let change = self.popularity.as_ref().map(|_| self.next_change);
        let fine = self.fine.as_ref().map(Fine::next_at);
        timeline.into_iter().chain(change).chain(fine).min()
    }

    /// The series, the servers' shares and the popularity changes, into the result.
    fn finish(self, plan: &Plan, totals: &Totals, out: &mut ModeResult) {
        out.popularity_changes = self.changes();
        let Some(rack) = &plan.rack else {
            return;
        };
        out.servers = rack.servers;
        out.server_max_ops_per_s = rack.server_max_ops_per_s;
        let Some(timeline) = self.timeline else {
            return;
        };
        out.per_second = timeline.samples;
        if let Some(fine) = &self.fine {
            out.recoveries = fine.recoveries();
        }
        let (shares, busiest) = super::rack::shares(&totals.per_server);
        out.server_shares = shares;
        out.busiest_server = busiest.map(|(index, _)| index);
        out.busiest_server_share = busiest.map(|(_, share)| share);
    }
}

/// Start the mode's client threads; if one cannot start, stop those that did.
fn start_clients(
    plan: &Plan,
    mode: Mode,
    clients: ClientsStart<'_>,
    shared: &Arc<Shared>,
    stretch: Stretch,
) -> Result<Vec<JoinHandle<ClientOutcome>>, String> {
    let mut handles = Vec::new();
    for index in 0..plan.clients {
        let client = ClientPlan {
            index,
            peer: clients.peers.0,
            more_peers: clients.peers.1.clone(),
            server_id: plan.server_id,
            peer_role: if mode.path() == Mode::Baseline {
                SessionOptions::SERVER_PEER
            } else {
                SessionOptions::DEVICE_PEER
            },
            echo: mode == Mode::Echo,
            wait: plan.wait,
            cpu: plan.client_cpu,
            window: plan.window,
            workload: plan.workload.clone(),
            seed: plan.seed,
            measure_from: stretch.measure_from,
            measure_until: stretch.measure_until,
            requests: plan.requests,
            keys: plan.mode_keys(mode),
            rack: clients.route.clone(),
            popularity: clients.popularity.clone(),
        };
        let client_shared = Arc::clone(shared);
        let handle = std::thread::Builder::new()
            .name(format!("pmnet-client-{index}"))
            .spawn(move || run_client(client, client_shared));
        match handle {
            Ok(handle) => handles.push(handle),
            Err(error) => {
                shared.stop.store(true, Ordering::Relaxed);
                for handle in handles {
                    let _ = handle.join();
                }
                return Err(format!("cannot start client thread {index}: {error}"));
            }
        }
    }
    Ok(handles)
}

/// Wait until every client thread is done, updating the progress line, and stop the clients
/// when a signal asks.
/// Reads the device's and server's CPU time when the measured stretch starts and ends (when the
/// clients have measured `plan.requests`, or have all stopped).
fn wait_for_clients(
    plan: &Plan,
    mode: Mode,
    shared: &Shared,
    handles: &[JoinHandle<ClientOutcome>],
    run: &mut RunState,
    cpu: &mut SystemCpu,
    shutdown: &Shutdown,
) {
    let stretch = run.stretch;
    let progress = Progress::new(
        plan.progress,
        mode,
        plan.warmup,
        plan.duration,
        plan.requests,
    );
    let mut next_report = stretch.start;
    let mut ended = false;
    while !handles.iter().all(|handle| handle.is_finished()) {
        if shutdown.is_requested() {
            shared.stop.store(true, Ordering::Relaxed);
        }
        let now = Instant::now();
        if !cpu.is_started() && now >= stretch.measure_from {
            cpu.start();
        }
        let requests_done = plan
            .requests
            .is_some_and(|requests| shared.measured.load(Ordering::Relaxed) >= requests);
        if !ended && (stretch.measure_until.is_some_and(|until| now >= until) || requests_done) {
            cpu.end();
            ended = true;
        }
        if !ended {
            run.tick(shared, now);
        }
        if now >= next_report {
            progress.update(shared, stretch.start, stretch.measure_from, now);
            next_report = now + Duration::from_millis(500);
        }
        // Wake at the stretch's boundaries, so the readings are taken when it starts and ends,
        // and when a second ends or the popularity changes.
        let mut wake = now + Duration::from_millis(20);
        for boundary in [
            Some(stretch.measure_from),
            stretch.measure_until,
            run.next_at(),
        ]
        .into_iter()
        .flatten()
        {
            if boundary > now {
                wake = wake.min(boundary);
            }
        }
        std::thread::sleep(wake.saturating_duration_since(now));
    }
    // The second that ended with the measured stretch, if the clients stopped before the
    // loop above saw it end.
    run.tick(shared, Instant::now());
    cpu.end();
    progress.finish();
}

/// Run one client until the plan says stop.
fn run_client(plan: ClientPlan, shared: Arc<Shared>) -> ClientOutcome {
    if let Some(cpu) = plan.cpu {
        if let Err(error) = pin_current_thread(cpu) {
            let mut outcome = ClientOutcome::new();
            outcome.error = Some(error);
            shared.stop.store(true, Ordering::Relaxed);
            return outcome;
        }
    }
    if plan.echo {
        run_echo_client(&plan, &shared)
    } else if let Some(route) = &plan.rack {
        run_rack_client(&plan, route, &shared)
    } else {
        run_session_client(&plan, &shared)
    }
}

/// What the clients of a mode measured, all together.
struct Totals {
    updates: Histogram<u64>,
    bypass: Histogram<u64>,
    failed: u64,
    acked_by_device: u64,
    answered_by_server: u64,
    retransmissions: u64,
    /// When the last measured request completed.
    last_measured: Option<Instant>,
    /// The clients' CPU time over the measured stretch, all together.
    client_cpu_ns: Option<u64>,
    /// Requests measured by the server their key belongs to (rack clients).
    per_server: Vec<u64>,
    reads_by_device: Histogram<u64>,
    reads_by_server: Histogram<u64>,
    reads_checked: u64,
    reads_unexplained: u64,
    first_unexplained: Option<String>,
}

/// Join the client threads and add up what they measured; the first client's error, if any,
/// is the mode's.
fn join_clients(handles: Vec<JoinHandle<ClientOutcome>>, mode: Mode) -> Result<Totals, String> {
    let mut totals = Totals {
        updates: new_histogram(),
        bypass: new_histogram(),
        failed: 0,
        acked_by_device: 0,
        answered_by_server: 0,
        retransmissions: 0,
        last_measured: None,
        client_cpu_ns: None,
        per_server: Vec::new(),
        reads_by_device: new_histogram(),
        reads_by_server: new_histogram(),
        reads_checked: 0,
        reads_unexplained: 0,
        first_unexplained: None,
    };
    let mut errors = Vec::new();
    for handle in handles {
        let outcome = handle
            .join()
            .map_err(|_| format!("a client thread of mode {} panicked", mode.name()))?;
        let _ = totals.updates.add(&outcome.updates);
        let _ = totals.bypass.add(&outcome.bypass);
        totals.failed += outcome.failed;
        totals.acked_by_device += outcome.acked_by_device;
        totals.answered_by_server += outcome.answered_by_server;
        totals.retransmissions += outcome.retransmissions;
        totals.last_measured = totals.last_measured.max(outcome.last_measured);
        if let Some(ns) = outcome.cpu_ns {
            totals.client_cpu_ns = Some(totals.client_cpu_ns.unwrap_or(0) + ns);
        }
        if totals.per_server.len() < outcome.per_server.len() {
            totals.per_server.resize(outcome.per_server.len(), 0);
        }
        for (total, count) in totals.per_server.iter_mut().zip(&outcome.per_server) {
            *total += count;
        }
        let _ = totals.reads_by_device.add(&outcome.reads_by_device);
        let _ = totals.reads_by_server.add(&outcome.reads_by_server);
        totals.reads_checked += outcome.reads_checked;
        totals.reads_unexplained += outcome.reads_unexplained;
        if totals.first_unexplained.is_none() {
            totals.first_unexplained = outcome.first_unexplained;
        }
        errors.extend(outcome.error);
    }
    if let Some(error) = errors.into_iter().next() {
        return Err(format!("mode {}: {error}", mode.name()));
    }
    Ok(totals)
}

/// The mode's latencies, counts and rate over its measured stretch; the clients stopped at
/// `stopped`.
fn mode_result(mode: Mode, totals: &Totals, stretch: Stretch, stopped: Instant) -> ModeResult {
    let mut all = new_histogram();
    let _ = all.add(&totals.updates);
    let _ = all.add(&totals.bypass);
    let summary = summarize(&all);
    let mut out = ModeResult::from_summary(mode.name(), mode.waits_for(), summary);
    out.cdf = cdf_points(&all);
    out.failed = totals.failed;
    out.acked_by_device = totals.acked_by_device;
    out.answered_by_server = totals.answered_by_server;
    out.client_retransmissions = totals.retransmissions;
    out.reads_by_device = summarize(&totals.reads_by_device);
    out.reads_by_server = summarize(&totals.reads_by_server);
    out.reads_checked = totals.reads_checked;
    out.reads_unexplained = totals.reads_unexplained;
    if let Some(problem) = &totals.first_unexplained {
        out.notes.push(format!(
            "{} of {} reads checked returned a value no write stored; the first: {problem}",
            totals.reads_unexplained, totals.reads_checked
        ));
    }
    if !totals.updates.is_empty() && !totals.bypass.is_empty() {
        out.updates = summarize(&totals.updates);
        out.bypass = summarize(&totals.bypass);
    }
    let measured_until = match stretch.measure_until {
        Some(until) => until.min(stopped),
        None => totals.last_measured.unwrap_or(stopped),
    };
    let seconds = measured_until
        .saturating_duration_since(stretch.measure_from)
        .as_secs_f64();
    out.measured_s = (seconds * 1000.0).round() / 1000.0;
    if seconds > 0.0 {
        out.ops_per_s = (out.requests as f64 / seconds).round();
    }
    out
}

/// What is worth telling about the mode's run: failures, retransmissions, and updates of the
/// pmnet mode that the server answered instead of the device.
fn add_notes(out: &mut ModeResult, plan: &Plan, mode: Mode) {
    if out.failed > 0 {
        out.notes.push(format!(
            "{} requests failed (no answer after the session's retransmissions)",
            out.failed
        ));
    }
    if out.client_retransmissions > 0 {
        out.notes.push(format!(
            "clients retransmitted {} datagrams",
            out.client_retransmissions
        ));
    }
    if mode.path() == Mode::Pmnet && out.answered_by_server > 0 && plan.workload.update_ratio >= 1.0
    {
        out.notes.push(format!(
            "{} updates completed on the server's reply, not a PMNet-ACK (not logged)",
            out.answered_by_server
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::super::args::tests::parse;
    use super::super::{ratios, Report};
    use super::*;

    #[test]
    fn the_json_report_has_the_setting_and_the_results() {
        let args = parse(&["--seed", "7", "--mode", "pmnet,baseline"]).unwrap();
        let plan = Plan::from_args(&args).unwrap();
        let mut pmnet = ModeResult::from_summary("pmnet", Mode::Pmnet.waits_for(), None);
        pmnet.p50_us = Some(5.0);
        let mut baseline = ModeResult::from_summary("baseline", Mode::Baseline.waits_for(), None);
        baseline.p50_us = Some(20.0);
        let results = vec![baseline, pmnet];
        let report = Report {
            setting: plan.setting(Some(("emulated-pm via clwb".into(), "x".into()))),
            ratios: ratios(&results),
            results,
            capacity: None,
            functional_check: None,
            under_load: Vec::new(),
            cache_comparisons: Vec::new(),
            replication_ratios: Vec::new(),
            interrupted: false,
        };
        let value = serde_json::to_value(&report).unwrap();
        let setting = &value["setting"];
        for key in [
            "busy_poll",
            "pinned",
            "medium",
            "payload_bytes",
            "clients",
            "seed",
            "wait",
            "placement",
        ] {
            assert!(
                setting.get(key).is_some(),
                "setting.{key} missing: {setting}"
            );
        }
        assert_eq!(setting["seed"], 7);
        assert_eq!(setting["payload_bytes"], 100);
        let results = value["results"].as_array().unwrap();
        assert_eq!(results[1]["mode"], "pmnet");
        for key in ["p50_us", "p99_us", "p999_us", "ops_per_s"] {
            assert!(results[1].get(key).is_some(), "results[].{key} missing");
        }
        assert_eq!(value["ratios"][0]["p50"], 0.25);
    }
}

//! One seed, one run: a swarm of faults in a safety phase, then a liveness phase that heals
//! them and must converge, with the protocol's invariants checked throughout and at the end.
//!
//! Invariants (see `docs/simulation.md`):
//! 1. every request a client saw complete is applied by its server exactly once, and every
//!    session's requests are applied in sequence order (the server's application asserts
//!    order on every apply);
//! 2. nothing is applied that its client did not send: each applied request is byte for byte
//!    the client's, or the empty no-op fill of a request the client reported failed;
//! 3. a bypass read sees every earlier update of its session and no later one;
//! 4. a device never acks before its log write is durable, by the persistence model (checked
//!    on every PMNet-ACK sent); corrupted or torn log entries are never replayed;
//! 5. once healed, every session converges: nothing in flight at clients, no live log entry at
//!    any device, nothing buffered at any server, within a bounded virtual time.
//!
//! The run is [`set_up`] (the seed picks the topology and the fault mix), the safety phase
//! (`safety_phase.rs`, with device crashes in `device_crash.rs`), the liveness phase
//! (`liveness_phase.rs`), then the final checks. Each invariant has its checker: invariants
//! 1–3 in `sessions_checker.rs`, 4 in `durability_checker.rs` (the world checks every
//! PMNet-ACK itself), 5 in `convergence_checker.rs`.

mod attacker;
mod convergence_checker;
mod device_crash;
mod durability_checker;
mod liveness_phase;
mod replication_checker;
mod safety_phase;
mod sessions_checker;
mod summary;
mod workload;

use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::world::{device_addr, Faults, Topology, World};

use attacker::Attacker;
use safety_phase::FaultMix;
use summary::count_world_faults;
pub use summary::{FaultCounts, FaultSummary, SwarmSummary};
use workload::Issued;

/// Knobs of a run; the seed picks everything else.
#[derive(Debug, Clone)]
pub struct Options {
    /// Requests each client issues in all.
    pub requests_per_client: u32,
    /// Actions (requests, faults, network steps) in the safety phase.
    pub safety_actions: u32,
    /// Virtual time the liveness phase may take to converge (seeds whose sessions come and go
    /// get twice the keeping time more per table's worth of clients: see `Churn`).
    pub liveness_bound: Duration,
    /// Keep a readable trace of every event.
    pub trace: bool,
    /// With `trace`: keep the datagram lines (every send and receive) too.
    pub trace_datagrams: bool,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            requests_per_client: 60,
            safety_actions: 3_000,
            liveness_bound: Duration::from_secs(120),
            trace: false,
            trace_datagrams: true,
        }
    }
}

/// What a successful run reports.
#[derive(Debug, Clone)]
pub struct Report {
    pub seed: u64,
    pub trace_hash: u32,
    pub requests_completed: u64,
    pub virtual_time_to_converge: Duration,
    pub faults: FaultSummary,
    pub trace: Option<Vec<String>>,
}

/// The command that replays `seed`.
pub fn reproduce_command(seed: u64) -> String {
    format!("pmnet sim --seed {seed}")
}

/// A seed that broke an invariant: the message, and what the run did up to the failure.
#[derive(Debug, Clone)]
pub struct Failure {
    pub seed: u64,
    /// The panic message: which invariant broke, and how.
    pub message: String,
    /// The hash of the events up to the failure.
    pub trace_hash: u32,
    /// The fault mix, and the faults exercised up to the failure.
    pub faults: FaultSummary,
    /// The readable trace up to the failure, when [`Options::trace`] was on.
    pub trace: Option<Vec<String>>,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "seed {} failed: {}\nreproduce with: {}",
            self.seed,
            self.message,
            reproduce_command(self.seed)
        )
    }
}

/// Run one seed. Panics, with the reproduction command in the message, when an invariant
/// breaks; returns the report otherwise.
pub fn run(seed: u64, options: &Options) -> Report {
    match try_run(seed, options) {
        Ok(report) => report,
        Err(failure) => panic!("{failure}"),
    }
}

/// Run one seed; a broken invariant (a panic anywhere in the run) is returned as a
/// [`Failure`] with the trace hash, fault counts and trace up to that point. The panic hook
/// still sees the panic; a caller running many seeds may want to silence it.
pub fn try_run(seed: u64, options: &Options) -> Result<Report, Box<Failure>> {
    let mut state = None;
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        run_inner(seed, options, &mut state)
    }));
    match result {
        Ok(report) => Ok(report),
        Err(panic) => {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|text| text.to_string()))
                .unwrap_or_else(|| "unknown panic".to_string());
            let (trace_hash, faults, trace) = match state {
                Some(Run {
                    mut world,
                    mut summary,
                }) => {
                    world.note_by("check", &format!("FAILED: {message}"));
                    count_world_faults(&world, &mut summary);
                    (
                        world.trace_hash(),
                        summary,
                        world.network.trace.lines.take(),
                    )
                }
                None => (0, FaultSummary::default(), None),
            };
            Err(Box::new(Failure {
                seed,
                message,
                trace_hash,
                faults,
                trace,
            }))
        }
    }
}

/// Whether `seed`'s devices pack what they send servers into batches (half of the seeds), and
/// if so how long a batch of updates may wait for more (none, or up to 2 ms), drawn from a
/// generator of its own so that the other choices of a seed are unchanged.
fn batches_for_seed(seed: u64) -> Option<Duration> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xBA7C_4E55_0000_0018);
    if !rng.random_bool(0.5) {
        return None;
    }
    Some(if rng.random_bool(0.5) {
        Duration::ZERO
    } else {
        Duration::from_micros(rng.random_range(50..2_000))
    })
}

/// Whether `seed`'s devices run the read cache and its clients send keyed updates and cache
/// reads (a third of the seeds), drawn from a generator of its own.
fn cache_for_seed(seed: u64) -> bool {
    ChaCha8Rng::seed_from_u64(seed ^ 0xCAC4_E000_0000_0020).random_bool(1.0 / 3.0)
}

/// Whether `seed`'s devices are in series (docs/replication.md), on a quarter of the seeds
/// without the cache, and then how many (2 or 3) and how many of their acks each client waits
/// for (1 to that many): drawn from a generator of their own, so that the other seeds'
/// worlds do not change.
fn chain_for_seed(seed: u64) -> Option<Chain> {
    if cache_for_seed(seed) {
        return None;
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xC4A1_0000_0000_0021);
    if !rng.random_bool(0.25) {
        return None;
    }
    let devices = rng.random_range(2..=3usize);
    let replicas = (0..4)
        .map(|_| rng.random_range(1..=devices as u8))
        .collect();
    Some(Chain { devices, replicas })
}

/// How many replica servers the server of `seed`'s devices in series has, under the
/// controller (docs/replication.md, "Replicated servers on the controller"): 1 or 2 on half of
/// the seeds with devices in series, none otherwise; drawn from a generator of its own, so
/// that the other seeds' worlds do not change.
fn chain_replicas_for_seed(seed: u64) -> usize {
    if chain_for_seed(seed).is_none() {
        return 0;
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xC4A1_4E91_0000_0040);
    if !rng.random_bool(0.5) {
        return 0;
    }
    rng.random_range(1..=2)
}

/// Whether `seed`'s controller crashes (docs/simulation.md, "the controller crashing"): on
/// half of the seeds with devices in series, drawn from a generator of its own, so that the
/// other seeds' worlds do not change.
fn controller_crashes_for_seed(seed: u64) -> bool {
    chain_for_seed(seed).is_some()
        && ChaCha8Rng::seed_from_u64(seed ^ 0xC047_C4A5_0000_0050).random_bool(0.5)
}

/// A seed's devices in series: a chain of `devices` and the acks each client waits for
/// (client `i` the `i mod 4`-th). The controller plans the chain ([`World::with_controller`]),
/// in front of one server, with one spare device it puts in when a device is taken out.
struct Chain {
    devices: usize,
    replicas: Vec<u8>,
}

/// Fan-out (docs/replication.md, "Fan-out") on a quarter of the seeds with neither the
/// cache, devices in series nor replica servers: two devices side by side, every client
/// sending each update to both and waiting for the acks of 1 or 2 of them (per client, in
/// turn). Drawn from a generator of its own, so that the other seeds' worlds do not change.
fn fanout_for_seed(seed: u64) -> Option<Vec<u8>> {
    if cache_for_seed(seed) || chain_for_seed(seed).is_some() || replicas_for_seed(seed) > 0 {
        return None;
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xFA17_0000_0000_0021);
    if !rng.random_bool(0.25) {
        return None;
    }
    Some((0..4).map(|_| rng.random_range(1..=2u8)).collect())
}

/// How many replica servers each server of `seed` has (docs/replication.md, "Replicated
/// servers"): 1 or 2 on a quarter of the seeds with neither the cache nor chains, none
/// otherwise; drawn from a generator of its own, so that the other seeds' worlds do not
/// change.
fn replicas_for_seed(seed: u64) -> usize {
    if cache_for_seed(seed) || chain_for_seed(seed).is_some() {
        return 0;
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x4E91_1CA5_0000_0021);
    if !rng.random_bool(0.25) {
        return 0;
    }
    rng.random_range(1..=2)
}

/// Sessions that come and go on a quarter of the seeds without replica servers
/// (docs/simulation.md, the safety phase): every server's table and store keep only `table` sessions (2 to 4), and
/// `later_clients` more clients (2 to 6), each a new session, start one by one in the place
/// of clients that leave, so that full tables evict idle sessions (once the devices cleared
/// them) and make new ones wait. Drawn from a generator of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Churn {
    table: usize,
    later_clients: usize,
}

impl Churn {
    /// What the liveness phase may take beyond its bound: a table of `table` sessions takes
    /// a new one only once an idle one has been kept `keep` (and cleared), so the sessions of
    /// `clients` clients (each of which may still have requests in a device's log) pass
    /// through it `table` at a time, each turn within twice the keeping time.
    fn liveness_extra(&self, clients: usize, keep: Duration) -> Duration {
        2 * keep * clients.div_ceil(self.table) as u32
    }
}

fn churn_for_seed(seed: u64) -> Option<Churn> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5E55_C4A1_0000_0038);
    rng.random_bool(0.25).then(|| Churn {
        table: rng.random_range(2..=4),
        later_clients: rng.random_range(2..=6),
    })
}

/// Client request lifetime on seeds with the cache (at most): the cache's fetch warm-up is
/// longer, so no read sent to a device before it restarted can fill its cache.
const CACHE_SEED_LIFETIME: Duration = Duration::from_secs(2);

fn cache_front() -> Box<dyn pmnet_proto::FrontFunction> {
    let mut config = pmnet_cache::CacheConfig::new(crate::world::DEVICE_ID);
    config.interval = Duration::from_millis(5);
    config.stats.threshold = 2;
    config.fetch_warmup = CACHE_SEED_LIFETIME + Duration::from_millis(100);
    // The swarm has at most two servers; what claims to come from elsewhere (the attacker's
    // forgeries) does not move the cache.
    config.servers = (0..2).map(crate::world::server_addr).collect();
    Box::new(pmnet_cache::CacheFunction::new(config).expect("a valid cache configuration"))
}

/// The state of a run, kept outside the unwinding code so that a failure can report it.
struct Run {
    world: World,
    summary: FaultSummary,
}

fn run_inner(seed: u64, options: &Options, state: &mut Option<Run>) -> Report {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let (world, summary, mix) = set_up(seed, options, &mut rng);
    let mut attacker = Attacker::for_seed(seed).map(|(attacker, _)| attacker);
    let Run { world, summary } = state.insert(Run { world, summary });
    let mut issued: Vec<Vec<Issued>> = (0..world.clients.len()).map(|_| Vec::new()).collect();
    safety_phase::run(
        world,
        &mut rng,
        summary,
        &mut issued,
        &mix,
        options,
        &mut attacker,
    );
    if let Some(attacker) = attacker.as_mut() {
        attacker.final_burst(world, summary);
    }
    let bound = options.liveness_bound
        + churn_for_seed(seed).map_or(Duration::ZERO, |churn| {
            churn.liveness_extra(world.clients.len(), world.servers[0].config.session_keep())
        });
    let virtual_time_to_converge =
        liveness_phase::run(world, &mut rng, &mut issued, options, bound);
    let requests_completed = check_invariants(world, &issued, summary);
    count_world_faults(world, summary);
    if batches_for_seed(seed).is_some() {
        summary.counts.seeds_with_batches += 1;
        summary.counts.batches_sent += world
            .devices
            .iter()
            .filter_map(|node| node.pipeline.batch_counters())
            .chain(
                world
                    .servers
                    .iter()
                    .map(|node| node.server.counters().batches),
            )
            .map(|counters| counters.batches_sent)
            .sum::<u64>();
    }
    if churn_for_seed(seed).is_some() {
        summary.counts.seeds_with_churn += 1;
    }
    if controller_crashes_for_seed(seed) {
        summary.counts.seeds_with_controller_crashes += 1;
    }
    if attacker.is_some() {
        summary.counts.seeds_with_attacker += 1;
        summary.counts.forgeries_dropped += attacker::auth_drops(world);
        summary.counts.replays_dropped_stale += attacker::stale_drops(world);
    }
    Report {
        seed,
        trace_hash: world.trace_hash(),
        requests_completed,
        virtual_time_to_converge,
        faults: std::mem::take(summary),
        trace: world.network.trace.lines.take(),
    }
}

/// The world a seed picks: its topology, its network faults and the fault mix of its safety
/// phase, all noted at the head of the trace.
fn set_up(seed: u64, options: &Options, rng: &mut ChaCha8Rng) -> (World, FaultSummary, FaultMix) {
    let mut topology = Topology {
        client_count: rng.random_range(1..=4),
        device_slot_counts: (0..rng.random_range(1..=2))
            .map(|_| rng.random_range(2..128))
            .collect(),
        server_count: rng.random_range(1..=2),
        chain: false,
        server_replicas: replicas_for_seed(seed),
    };
    let churn = churn_for_seed(seed);
    let first_clients = topology.client_count;
    if let Some(churn) = churn {
        topology.client_count += churn.later_clients;
    }
    let chain = chain_for_seed(seed);
    let mut spare_slots = None;
    if let Some(chain) = &chain {
        let mut slots = ChaCha8Rng::seed_from_u64(seed ^ 0x5107_5000_0000_0021);
        topology.device_slot_counts = (0..chain.devices)
            .map(|_| slots.random_range(2..128))
            .collect();
        topology.chain = true;
        // A device that follows a controller is in one chain, in front of one server.
        topology.server_count = 1;
        topology.server_replicas = chain_replicas_for_seed(seed);
        spare_slots = Some(slots.random_range(2..128));
    }
    let fanout = fanout_for_seed(seed);
    if fanout.is_some() && topology.device_slot_counts.len() < 2 {
        let mut slots = ChaCha8Rng::seed_from_u64(seed ^ 0xFA17_5000_0000_0021);
        topology.device_slot_counts = (0..2).map(|_| slots.random_range(2..128)).collect();
    }
    let summary = FaultSummary {
        client_count: topology.client_count,
        device_count: topology.device_slot_counts.len() + usize::from(spare_slots.is_some()),
        server_count: topology.server_count,
        loss: rng.random_range(0.0..0.3),
        duplicate: rng.random_range(0.0..0.1),
        jitter_us: rng.random_range(0..500),
        corrupt: if rng.random_bool(0.5) {
            rng.random_range(0.0..0.05)
        } else {
            0.0
        },
        ..FaultSummary::default()
    };
    let mut mix = FaultMix::choose(rng, topology.client_count);
    mix.turnover = churn.is_some();
    mix.controller_crashes = controller_crashes_for_seed(seed);
    let slot_counts = topology.device_slot_counts.clone();
    let mut world = World::with_topology(topology).with_kv_store(4 << 20);
    if let Some(churn) = churn {
        world = world.with_session_tables(churn.table);
        for node in &mut world.clients[first_clients..] {
            node.arrives_later = true;
        }
    }
    if let Some((attacker, keys)) = Attacker::for_seed(seed) {
        world = world.with_auth(keys);
        world.network.attacker = Some(attacker.eavesdropper());
    }
    if let Some(hold) = batches_for_seed(seed) {
        world = world.with_batching(hold);
    }
    if chain.is_some() {
        world = world.with_controller(spare_slots);
        if !world.replicas.is_empty() {
            // A crashed server is started again soon: only a server lost for good falls
            // silent for the suspicion delay.
            world.restart_servers_after = Some(crate::world::SERVER_DOWN_MAX);
        }
        world.plan_must_settle = mix.controller_crashes;
    }
    if cache_for_seed(seed) {
        world = world.with_front(cache_front);
        world.keyed = true;
        for client in 0..world.clients.len() {
            world.reconfigure_client(client, |config| {
                config.request_lifetime = config.request_lifetime.min(CACHE_SEED_LIFETIME)
            });
        }
    }
    if let Some(Chain { replicas, .. }) = &chain {
        for client in 0..world.clients.len() {
            let wanted = replicas[client % replicas.len()];
            world.reconfigure_client(client, |config| config.replicas = wanted);
        }
        let fewest = (0..world.clients.len())
            .map(|client| replicas[client % replicas.len()])
            .min()
            .unwrap_or(1);
        world.device_losses_allowed = usize::from(fewest).saturating_sub(1);
    }
    if let Some(replicas) = &fanout {
        for client in 0..world.clients.len() {
            let wanted = replicas[client % replicas.len()];
            // Its peer is device `client % 2`: the other one is its fan-out.
            let other = device_addr((client + 1) % 2);
            world.reconfigure_client(client, |config| {
                config.replicas = wanted;
                config.fan_out = vec![other];
            });
        }
    }
    world.network.record_seen = false;
    for (client, lifetime) in mix.short_lifetimes.iter().enumerate() {
        if let Some(lifetime) = *lifetime {
            world.reconfigure_client(client, |config| config.request_lifetime = lifetime);
        }
    }
    if options.trace {
        world.network.trace.lines = Some(Vec::new());
        world.network.trace.datagrams = options.trace_datagrams;
    }
    let network_seed: u64 = rng.random();
    world.network.faults = Some(Faults {
        rng: ChaCha8Rng::seed_from_u64(network_seed),
        loss: summary.loss,
        duplicate: summary.duplicate,
        jitter: Duration::from_micros(summary.jitter_us),
        corrupt: summary.corrupt,
    });
    world.note_event(&format!(
        "seed {seed}: {} client(s), {} device(s) (log slots {slot_counts:?}), {} server(s), \
         {} replica server(s) each",
        summary.client_count,
        summary.device_count,
        summary.server_count,
        world.replicas.len() / world.servers.len()
    ));
    if let Some(chain) = &chain {
        let spare = match spare_slots {
            Some(slots) => format!(", and spare device{} ({slots} log slots)", chain.devices),
            None => String::new(),
        };
        world.note_event(&format!(
            "devices in series planned by the controller: device0..device{} in order{spare}; \
             statuses every {:?}, a device silent for {:?} taken out; up to {} device(s) lost \
             for good",
            chain.devices - 1,
            crate::world::STATUS_INTERVAL,
            crate::world::SUSPECT_AFTER,
            world.device_losses_allowed
        ));
        if !world.replicas.is_empty() {
            world.note_event(&format!(
                "replica servers under the controller: replica0..replica{} of server0; a \
                 server silent for {:?} replaced (the primary) or taken out (a replica); a \
                 crashed server started again within {:?}; the primary or a replica lost for \
                 good at random, one copy always left",
                world.replicas.len() - 1,
                crate::world::SERVER_SUSPECT_AFTER,
                crate::world::SERVER_DOWN_MAX,
            ));
        }
        if mix.controller_crashes {
            world.note_event(&format!(
                "the controller crashes: down for {:?} to {:?} at a time, restarted from the \
                 plan it last saved; some crashes right after a save, before its routes go out",
                safety_phase::CONTROLLER_DOWN_MIN,
                safety_phase::CONTROLLER_DOWN_MAX,
            ));
        }
    }
    note_fault_mix(&mut world, &summary, &mix, network_seed);
    if let Some(churn) = churn {
        world.note_event(&format!(
            "sessions come and go: tables of {} sessions at every server and store; clients \
             {first_clients}..{} start later, each in the place of one that leaves",
            churn.table,
            world.clients.len()
        ));
    }
    world.note_event(&format!(
        "safety phase: {} actions, {} requests per client",
        options.safety_actions, options.requests_per_client
    ));
    (world, summary, mix)
}

/// Note the seed's faults at the head of the trace.
fn note_fault_mix(world: &mut World, summary: &FaultSummary, mix: &FaultMix, network_seed: u64) {
    let FaultMix {
        partitions,
        clients_leave,
        store_full,
        short_lifetimes,
        device_crash_weight,
        server_crash_weight,
        turnover: _,
        controller_crashes: _,
    } = mix;
    world.note_event(&format!(
        "faults: loss {:.1}%, duplication {:.1}%, delay spread 0-{} us, corruption in flight \
         {:.2}%, partitions {}, device crashes {device_crash_weight}/3, server crashes \
         {server_crash_weight}/3, clients leaving {clients_leave}, store full \
         {store_full}, short request lifetimes {short_lifetimes:?}, network seed \
         {network_seed}",
        summary.loss * 100.0,
        summary.duplicate * 100.0,
        summary.jitter_us,
        summary.corrupt * 100.0,
        if *partitions { "on" } else { "off" },
    ));
}

/// Check invariants 1–3 on the final state, noting each check in the trace; returns the
/// number of completed requests.
fn check_invariants(world: &mut World, issued: &[Vec<Issued>], summary: &mut FaultSummary) -> u64 {
    let (completed, notes) = sessions_checker::check_sessions(world, issued, summary);
    for note in notes {
        world.note_by("check", &note);
    }
    if world.keyed {
        let (checked, by_device) = workload::check_cache_reads(world, issued);
        summary.counts.cache_reads_checked += checked;
        summary.counts.cache_reads_served_by_device += by_device;
        summary.counts.seeds_with_cache += 1;
        world.note_by(
            "check",
            &format!(
                "cache reads: {checked} checked (read-your-writes, own values), {by_device} \
                 served by a device"
            ),
        );
    }
    durability_checker::note_acks_checked(world);
    if !world.chain.is_empty() {
        summary.counts.seeds_with_chains += 1;
    }
    if world
        .clients
        .first()
        .is_some_and(|node| !node.client.config().fan_out.is_empty())
    {
        summary.counts.seeds_with_fanout += 1;
    }
    if !world.replicas.is_empty() && world.controller.is_some() {
        summary.counts.seeds_with_replicated_chains += 1;
    }
    if !world.replicas.is_empty() {
        summary.counts.seeds_with_replicas += 1;
        let notes = replication_checker::check_replicas(world, summary);
        for note in notes {
            world.note_by("check", &note);
        }
    }
    completed
}

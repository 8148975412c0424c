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

use std::collections::HashMap;
use std::time::Duration;

use pmnet_pm::{LogWork, PmRegion, CACHE_LINE_SIZE};
use pmnet_proto::{ClientEvent, Completion, RequestKind};
use pmnet_store::{Reply, Request};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::world::{client_addr, device_addr, node_name, server_addr, Faults, Topology, World};

/// Knobs of a run; the seed picks everything else.
#[derive(Debug, Clone)]
pub struct Options {
    /// Requests each client issues in all.
    pub requests_per_client: u32,
    /// Actions (requests, faults, network steps) in the safety phase.
    pub safety_actions: u32,
    /// Virtual time the liveness phase may take to converge.
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

/// The fault mix a seed chose, and what was exercised.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FaultSummary {
    pub client_count: usize,
    pub device_count: usize,
    pub server_count: usize,
    pub loss: f64,
    pub duplicate: f64,
    pub jitter_us: u64,
    pub corrupt: f64,
    pub counts: FaultCounts,
}

/// What a run exercised, by fault class.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FaultCounts {
    pub datagrams_sent: u64,
    pub datagrams_lost: u64,
    pub datagrams_duplicated: u64,
    pub datagrams_corrupted: u64,
    pub datagrams_partitioned: u64,
    pub partitions_symmetric: u64,
    pub partitions_one_way: u64,
    pub device_crashes: u64,
    pub device_crashes_torn: u64,
    pub device_crashes_with_held_writes: u64,
    pub device_crashes_mid_write: u64,
    pub server_crashes: u64,
    pub server_crashes_during_recovery: u64,
    pub entries_corrupted_at_rest: u64,
    pub log_slots_rejected: u64,
    pub requests_failed: u64,
    pub noop_fills: u64,
    /// Sequence numbers never applied (filled or skipped): each one its client reported failed.
    pub sequence_numbers_skipped: u64,
    /// Gaps the server closed without the client (after every device said it held nothing).
    pub gaps_skipped_by_server: u64,
    /// Clients that gave up on a request and went away for good.
    pub clients_gone: u64,
    /// Requests the server's store had no room for and handed back to wait.
    pub requests_deferred_store_full: u64,
}

impl FaultCounts {
    /// Add `other`'s counts to these.
    pub fn add(&mut self, other: &FaultCounts) {
        self.datagrams_sent += other.datagrams_sent;
        self.datagrams_lost += other.datagrams_lost;
        self.datagrams_duplicated += other.datagrams_duplicated;
        self.datagrams_corrupted += other.datagrams_corrupted;
        self.datagrams_partitioned += other.datagrams_partitioned;
        self.partitions_symmetric += other.partitions_symmetric;
        self.partitions_one_way += other.partitions_one_way;
        self.device_crashes += other.device_crashes;
        self.device_crashes_torn += other.device_crashes_torn;
        self.device_crashes_with_held_writes += other.device_crashes_with_held_writes;
        self.device_crashes_mid_write += other.device_crashes_mid_write;
        self.server_crashes += other.server_crashes;
        self.server_crashes_during_recovery += other.server_crashes_during_recovery;
        self.entries_corrupted_at_rest += other.entries_corrupted_at_rest;
        self.log_slots_rejected += other.log_slots_rejected;
        self.requests_failed += other.requests_failed;
        self.noop_fills += other.noop_fills;
        self.sequence_numbers_skipped += other.sequence_numbers_skipped;
        self.gaps_skipped_by_server += other.gaps_skipped_by_server;
        self.clients_gone += other.clients_gone;
        self.requests_deferred_store_full += other.requests_deferred_store_full;
    }

    /// The counts with their names, one fault class a line.
    pub fn lines(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("datagrams sent", self.datagrams_sent),
            ("datagrams lost", self.datagrams_lost),
            ("datagrams duplicated", self.datagrams_duplicated),
            ("datagrams corrupted in flight", self.datagrams_corrupted),
            ("datagrams cut by partitions", self.datagrams_partitioned),
            ("partitions, symmetric", self.partitions_symmetric),
            ("partitions, one-way", self.partitions_one_way),
            ("device crashes", self.device_crashes),
            (
                "device crashes with torn unpersisted lines",
                self.device_crashes_torn,
            ),
            (
                "device crashes between log write and persist",
                self.device_crashes_with_held_writes,
            ),
            (
                "device crashes in the middle of a log write",
                self.device_crashes_mid_write,
            ),
            ("server crashes", self.server_crashes),
            (
                "server crashes during recovery",
                self.server_crashes_during_recovery,
            ),
            (
                "log entries corrupted at rest",
                self.entries_corrupted_at_rest,
            ),
            ("log slots rejected at recovery", self.log_slots_rejected),
            ("requests failed (timed out)", self.requests_failed),
            ("no-op fills", self.noop_fills),
            (
                "sequence numbers never applied (failed requests)",
                self.sequence_numbers_skipped,
            ),
            (
                "sequence numbers skipped by a server",
                self.gaps_skipped_by_server,
            ),
            ("clients that gave up and left", self.clients_gone),
            (
                "requests deferred by a full store",
                self.requests_deferred_store_full,
            ),
        ]
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

fn key_of(session_id: u64) -> Vec<u8> {
    format!("session-{session_id:016x}").into_bytes()
}

/// The value an update of `seq` writes: the sequence number, padded to `len` bytes.
fn value_of(seq: u32, len: usize) -> Vec<u8> {
    let mut value = seq.to_string().into_bytes();
    value.resize(len.max(value.len()), b'.');
    value
}

fn seq_of_value(value: &[u8]) -> u32 {
    let digits: Vec<u8> = value
        .iter()
        .copied()
        .take_while(u8::is_ascii_digit)
        .collect();
    std::str::from_utf8(&digits)
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(0)
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
                    (world.trace_hash(), summary, world.trace.take())
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

/// The state of a run, kept outside the unwinding code so that a failure can report it.
struct Run {
    world: World,
    summary: FaultSummary,
}

/// Copy what the world counted (network faults, rejected log slots) into `summary`.
fn count_world_faults(world: &World, summary: &mut FaultSummary) {
    summary.counts.datagrams_sent = world.network.sent;
    summary.counts.datagrams_lost = world.network.lost;
    summary.counts.datagrams_duplicated = world.network.duplicated;
    summary.counts.datagrams_corrupted = world.network.corrupted;
    summary.counts.datagrams_partitioned = world.network.partitioned;
    summary.counts.log_slots_rejected = world
        .devices
        .iter()
        .map(|node| node.rejected_slot_count)
        .sum();
    summary.counts.requests_deferred_store_full =
        world.servers.iter().map(|node| node.deferred_count).sum();
    summary.counts.gaps_skipped_by_server = world
        .servers
        .iter()
        .map(|node| node.skipped_before_restart + node.server.counters().sequence_numbers_skipped)
        .sum();
}

struct Issued {
    kind: RequestKind,
    payload: Vec<u8>,
}

fn run_inner(seed: u64, options: &Options, state: &mut Option<Run>) -> Report {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let topology = Topology {
        client_count: rng.random_range(1..=4),
        device_slot_counts: (0..rng.random_range(1..=2))
            .map(|_| rng.random_range(2..128))
            .collect(),
        server_count: rng.random_range(1..=2),
    };
    let summary = FaultSummary {
        client_count: topology.client_count,
        device_count: topology.device_slot_counts.len(),
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
    let partitions_enabled = rng.random_bool(0.5);
    let clients_leave = rng.random_bool(0.3);
    let store_full_enabled = rng.random_bool(0.3);
    // Some clients give up early (a short request lifetime), so that failed requests, the
    // no-op fills they send and the gaps they leave meet the other faults.
    let short_lifetimes: Vec<Option<Duration>> = (0..topology.client_count)
        .map(|_| {
            rng.random_bool(0.3)
                .then(|| Duration::from_millis(rng.random_range(20..2_000)))
        })
        .collect();
    let device_crash_weight = rng.random_range(0..4);
    let server_crash_weight = rng.random_range(0..4);
    let slot_counts = topology.device_slot_counts.clone();
    let mut world = World::with_topology(topology).with_kv_store(4 << 20);
    world.record_seen = false;
    for (client, lifetime) in short_lifetimes.iter().enumerate() {
        if let Some(lifetime) = *lifetime {
            world.reconfigure_client(client, |config| config.request_lifetime = lifetime);
        }
    }
    if options.trace {
        world.trace = Some(Vec::new());
        world.trace_datagrams = options.trace_datagrams;
    }
    let network_seed: u64 = rng.random();
    world.faults = Some(Faults {
        rng: ChaCha8Rng::seed_from_u64(network_seed),
        loss: summary.loss,
        duplicate: summary.duplicate,
        jitter: Duration::from_micros(summary.jitter_us),
        corrupt: summary.corrupt,
    });
    world.note_event(&format!(
        "seed {seed}: {} client(s), {} device(s) (log slots {slot_counts:?}), {} server(s)",
        summary.client_count, summary.device_count, summary.server_count
    ));
    world.note_event(&format!(
        "faults: loss {:.1}%, duplication {:.1}%, delay spread 0-{} us, corruption in flight \
         {:.2}%, partitions {}, device crashes {device_crash_weight}/3, server crashes \
         {server_crash_weight}/3, clients leaving {clients_leave}, store full \
         {store_full_enabled}, short request lifetimes {short_lifetimes:?}, network seed \
         {network_seed}",
        summary.loss * 100.0,
        summary.duplicate * 100.0,
        summary.jitter_us,
        summary.corrupt * 100.0,
        if partitions_enabled { "on" } else { "off" },
    ));
    world.note_event(&format!(
        "safety phase: {} actions, {} requests per client",
        options.safety_actions, options.requests_per_client
    ));
    let Run { world, summary } = state.insert(Run { world, summary });

    let client_count = world.clients.len();
    let mut issued: Vec<Vec<Issued>> = (0..client_count).map(|_| Vec::new()).collect();

    // Safety phase. Requests are spread over the whole phase, so that faults meet traffic.
    let total_requests = options.requests_per_client as f64 * client_count as f64;
    let issue_probability = (1.5 * total_requests / f64::from(options.safety_actions)).min(1.0);
    for _ in 0..options.safety_actions {
        if rng.random_bool(issue_probability) {
            let client = rng.random_range(0..client_count);
            issue(
                world,
                &mut rng,
                &mut issued,
                client,
                options.requests_per_client,
            );
            continue;
        }
        match rng.random_range(0..100) {
            0..=3 if device_crash_weight > 0 => {
                crash_device(world, &mut rng, summary, device_crash_weight);
            }
            4 if rng.random_range(0..4) < server_crash_weight => {
                let index = rng.random_range(0..world.servers.len());
                if world.servers[index].up {
                    if world.servers[index].server.is_recovering() {
                        summary.counts.server_crashes_during_recovery += 1;
                        world.note_by(
                            &format!("server{index}"),
                            "crash during its start-up recovery poll",
                        );
                    }
                    summary.counts.server_crashes += 1;
                    world.stop_server(index);
                }
            }
            5..=7 => {
                let index = rng.random_range(0..world.servers.len());
                if !world.servers[index].up {
                    world.start_server(index);
                }
            }
            43..=44 => {
                let index = rng.random_range(0..world.devices.len());
                let node = world.device_mut(index);
                node.hold_persistence = !node.hold_persistence;
                if node.hold_persistence {
                    world.note_by(
                        &format!("device{index}"),
                        "persistence held: log writes are issued but do not complete; acks wait",
                    );
                } else {
                    world.note_by(&format!("device{index}"), "persistence released");
                    world.release_persistence(index, None);
                }
            }
            45 if partitions_enabled => partition(world, &mut rng, summary),
            48 if clients_leave => {
                let client = rng.random_range(0..client_count);
                // Leave while something is in flight (that is what leaves a gap behind), and
                // after something completed (a run that completed nothing proves nothing).
                let node = &world.clients[client];
                if !node.gone && node.client.in_flight_count() > 0 && !node.completed.is_empty() {
                    summary.counts.clients_gone += 1;
                    world.client_leaves(client);
                }
            }
            49..=50 if store_full_enabled => {
                let index = rng.random_range(0..world.servers.len());
                let node = &mut world.servers[index];
                node.store_full = !node.store_full;
                let text = if node.store_full {
                    "store full: every update is handed back, nothing durable, no server-ACK"
                } else {
                    "store has room again"
                };
                world.note_by(&format!("server{index}"), text);
            }
            46..=47 if partitions_enabled && !world.blocked.is_empty() => {
                world.blocked.clear();
                world.note_by("network", "partitions healed");
            }
            _ => {
                for _ in 0..rng.random_range(1..20) {
                    world.step();
                }
            }
        }
    }

    // Liveness phase: heal every fault, finish every session, converge within the bound.
    world.note_event(&format!(
        "liveness phase: faults healed, held persistence released, every node up; \
         must converge within {:?}",
        options.liveness_bound
    ));
    world.faults = None;
    world.blocked.clear();
    for node in &mut world.servers {
        node.store_full = false;
    }
    for index in 0..world.devices.len() {
        world.device_mut(index).hold_persistence = false;
        if world.devices[index].up {
            world.release_persistence(index, None);
        } else {
            world.restart_device(index);
        }
    }
    for index in 0..world.servers.len() {
        if !world.servers[index].up {
            world.start_server(index);
        }
    }
    let liveness_start = world.now;
    let deadline = world.now + options.liveness_bound;
    loop {
        for client in 0..client_count {
            issue(
                world,
                &mut rng,
                &mut issued,
                client,
                options.requests_per_client,
            );
        }
        let done = issued.iter().zip(&world.clients).all(|(requests, node)| {
            node.gone || requests.len() as u32 >= options.requests_per_client
        }) && converged(world);
        if done {
            break;
        }
        match world.next_event_time() {
            Some(at) if at <= deadline => {
                world.step();
            }
            _ => panic!(
                "invariant: not converged {:?} after the faults healed: {}",
                options.liveness_bound,
                convergence_state(world)
            ),
        }
    }
    let virtual_time_to_converge = world.now.saturating_duration_since(liveness_start);
    world.note_by(
        "check",
        &format!(
            "invariant 5 (convergence): converged {virtual_time_to_converge:?} after the faults \
             healed: nothing in flight, no live log entry, nothing buffered"
        ),
    );

    let requests_completed = check_invariants(world, &issued, summary);
    count_world_faults(world, summary);
    Report {
        seed,
        trace_hash: world.trace_hash(),
        requests_completed,
        virtual_time_to_converge,
        faults: std::mem::take(summary),
        trace: world.trace.take(),
    }
}

fn issue(
    world: &mut World,
    rng: &mut ChaCha8Rng,
    issued: &mut [Vec<Issued>],
    client: usize,
    limit: u32,
) {
    if world.clients[client].gone
        || issued[client].len() as u32 >= limit
        || !world.clients[client].client.can_send()
    {
        return;
    }
    let key = key_of(world.session(client));
    let seq = issued[client].len() as u32 + 1;
    let (kind, payload) = if rng.random_bool(0.75) {
        let len = if rng.random_bool(0.1) { 3000 } else { 16 };
        let value = value_of(seq, len);
        (
            RequestKind::Update,
            Request::Set {
                key: &key,
                value: &value,
            }
            .to_bytes(),
        )
    } else {
        (RequestKind::Bypass, Request::Get { key: &key }.to_bytes())
    };
    let sent = match kind {
        RequestKind::Update => world.update(client, &payload),
        RequestKind::Bypass => world.bypass(client, &payload),
    };
    assert_eq!(sent, seq, "the client numbers its requests 1, 2, 3, ...");
    issued[client].push(Issued { kind, payload });
}

fn crash_device(world: &mut World, rng: &mut ChaCha8Rng, summary: &mut FaultSummary, weight: u32) {
    if rng.random_range(0..4) >= weight {
        return;
    }
    let index = rng.random_range(0..world.devices.len());
    let actor = format!("device{index}");
    summary.counts.device_crashes += 1;
    let held = world.devices[index].held.len();
    if held > 0 {
        summary.counts.device_crashes_with_held_writes += 1;
    }
    world.note_by(
        &actor,
        &format!("CRASH ({held} persistence batches issued but not complete)"),
    );
    if rng.random_bool(0.3) {
        corrupt_applied_entry_at_rest(world, rng, index, summary);
    }
    // A batch the device issued but the log has not finished: its stores may be anywhere
    // between the cache and the medium when the crash comes.
    if rng.random_bool(0.5) {
        let node = world.device_mut(index);
        if let Some(batch) = node.held.front().cloned() {
            node.log.persist_batch_without_fences(&batch.work);
            let writes = batch
                .work
                .iter()
                .filter(|work| matches!(work, LogWork::Write { .. }))
                .count();
            if writes > 0 {
                summary.counts.device_crashes_mid_write += 1;
            }
            world.note_by(
                &actor,
                &format!(
                    "crash in the middle of persistence batch {} ({} items, {writes} log \
                     writes): its stores issued, not fenced",
                    batch.number,
                    batch.work.len()
                ),
            );
        }
    }
    if rng.random_bool(0.5) {
        summary.counts.device_crashes_torn += 1;
        let crash_seed: u64 = rng.random();
        world.note_by(
            &actor,
            &format!(
                "crash image: each unpersisted cache line kept, lost or torn at 8 bytes \
                 (crash seed {crash_seed})"
            ),
        );
        world.restart_device_with(index, |region| {
            region.crash(&mut ChaCha8Rng::seed_from_u64(crash_seed))
        });
    } else {
        world.note_by(&actor, "crash image: what was persisted, nothing more");
        world.restart_device(index);
    }
}

/// Flip one bit inside a live log entry whose request its server already applied (so that no
/// acknowledged update is lost to the corruption), and check that the reopened log rejects it.
fn corrupt_applied_entry_at_rest(
    world: &mut World,
    rng: &mut ChaCha8Rng,
    index: usize,
    summary: &mut FaultSummary,
) {
    let candidates: Vec<(u32, usize)> = {
        let node = &world.devices[index];
        (0..node.log.slot_count())
            .filter_map(|slot| {
                let (key, packet) = node.log.read(slot)?;
                let server = usize::from(key.server_id.checked_sub(crate::SERVER_ID)?);
                let applied = world
                    .servers
                    .get(server)?
                    .app
                    .sessions
                    .get(&key.session_id)?
                    .0;
                (applied >= key.seq).then_some((slot, packet.len()))
            })
            .collect()
    };
    if candidates.is_empty() {
        return;
    }
    let (slot, packet_len) = candidates[rng.random_range(0..candidates.len())];
    let node = world.device_mut(index);
    let start = node.log.slot_range(slot).start;
    let offset = start + rng.random_range(0..CACHE_LINE_SIZE + packet_len);
    let bit = rng.random_range(0..8u8);
    let key = node.log.read(slot).map(|(key, _)| key);
    node.log.region_mut().flip_bit(offset, bit);
    assert!(node.log.region().len() > offset);
    summary.counts.entries_corrupted_at_rest += 1;
    world.note_by(
        &format!("device{index}"),
        &format!(
            "log slot {slot} corrupted at rest: bit {bit} of byte {} flipped ({key:?}, \
             already applied); restart",
            offset - start
        ),
    );
    world.restart_device(index);
    let node = &world.devices[index];
    if let Some(key) = key {
        assert!(
            node.device().live_keys().all(|live| *live != key),
            "invariant: a corrupted log entry {key:?} was recovered as valid"
        );
        world.note_by(
            "check",
            &format!("invariant 4: device{index} did not recover the corrupted entry"),
        );
    }
}

fn partition(world: &mut World, rng: &mut ChaCha8Rng, summary: &mut FaultSummary) {
    let device = device_addr(rng.random_range(0..world.devices.len()));
    let other = if rng.random_bool(0.5) {
        server_addr(rng.random_range(0..world.servers.len()))
    } else {
        client_addr(rng.random_range(0..world.clients.len()))
    };
    let (from, to) = if rng.random_bool(0.5) {
        (device, other)
    } else {
        (other, device)
    };
    world.blocked.insert((from, to));
    if rng.random_bool(0.5) {
        world.blocked.insert((to, from));
        summary.counts.partitions_symmetric += 1;
        world.note_by(
            "network",
            &format!("partition {} <-> {}", node_name(from), node_name(to)),
        );
    } else {
        summary.counts.partitions_one_way += 1;
        world.note_by(
            "network",
            &format!(
                "partition {} -> {} (one-way)",
                node_name(from),
                node_name(to)
            ),
        );
    }
}

fn converged(world: &World) -> bool {
    world
        .clients
        .iter()
        .all(|node| node.gone || node.client.in_flight_count() == 0)
        && world
            .devices
            .iter()
            .all(|node| node.device().live_entry_count() == 0 && node.held.is_empty())
        && world
            .servers
            .iter()
            .all(|node| !node.server.is_recovering() && node.server.busy_session_count() == 0)
}

fn convergence_state(world: &World) -> String {
    let clients: Vec<usize> = world
        .clients
        .iter()
        .map(|node| node.client.in_flight_count())
        .collect();
    let devices: Vec<usize> = world
        .devices
        .iter()
        .map(|node| node.device().live_entry_count())
        .collect();
    let servers: Vec<(bool, usize)> = world
        .servers
        .iter()
        .map(|node| {
            (
                node.server.is_recovering(),
                node.server.busy_session_count(),
            )
        })
        .collect();
    format!(
        "in flight per client {clients:?}, live log entries per device {devices:?}, \
         (recovering, busy sessions) per server {servers:?}"
    )
}

/// Check invariants 1–3 on the final state, noting each check in the trace; returns the
/// number of completed requests.
fn check_invariants(world: &mut World, issued: &[Vec<Issued>], summary: &mut FaultSummary) -> u64 {
    let (completed, notes) = check_sessions(world, issued, summary);
    for note in notes {
        world.note_by("check", &note);
    }
    let acks = world.acks_checked;
    world.note_by(
        "check",
        &format!(
            "invariant 4 (an ack is a promise): {acks} PMNet-ACKs, each of an entry durable \
             in the persistence model"
        ),
    );
    completed
}

/// Invariants 1–3, session by session; returns the number of completed requests and what was
/// checked, for the trace.
fn check_sessions(
    world: &World,
    issued: &[Vec<Issued>],
    summary: &mut FaultSummary,
) -> (u64, Vec<String>) {
    let mut notes = Vec::new();
    let mut completed_count = 0;
    for (client, requests) in issued.iter().enumerate() {
        let session_id = world.session(client);
        let app = &world.servers[world.server_of(client)].app;
        let applied: Vec<&(u64, u32, RequestKind, Vec<u8>)> = app
            .applied
            .iter()
            .filter(|(s, ..)| *s == session_id)
            .collect();
        let node = &world.clients[client];
        let mut failed = Vec::new();
        let mut completions: HashMap<u32, &Completion> = HashMap::new();
        for event in &node.completed {
            match event {
                ClientEvent::Completed {
                    seq, completion, ..
                } => {
                    completions.insert(*seq, completion);
                }
                ClientEvent::Failed { seq, .. } => failed.push(*seq),
            }
        }
        // A client that left never reports what it had in flight; nothing of it was acked.
        failed.extend(node.abandoned.iter().copied());
        summary.counts.requests_failed += failed.len() as u64;
        summary.counts.noop_fills += node.client.counters().noop_fills_sent;
        completed_count += completions.len() as u64;

        // 1 and 2: each of the session's numbers applied at most once, in order, each the
        // client's own request or the no-op fill of a failed one; a number never applied (the
        // server skipped it, or it is missing at the end) is one the client reported failed.
        let mut applied_by_seq: HashMap<u32, &(u64, u32, RequestKind, Vec<u8>)> = HashMap::new();
        let mut previous = 0;
        for entry in &applied {
            let (_, seq, kind, request) = *entry;
            assert!(
                *seq > previous,
                "invariant: client {client} applied seq {seq} after {previous}"
            );
            previous = *seq;
            let sent = requests
                .get(*seq as usize - 1)
                .unwrap_or_else(|| panic!("invariant: client {client} seq {seq} never sent"));
            let is_fill = request.is_empty() && *kind == RequestKind::Bypass;
            assert!(
                (*kind == sent.kind && *request == sent.payload)
                    || (is_fill && failed.contains(seq)),
                "invariant: client {client} seq {seq}: applied a request the client did not send"
            );
            applied_by_seq.insert(*seq, *entry);
        }
        for seq in 1..=requests.len() as u32 {
            if !applied_by_seq.contains_key(&seq) {
                assert!(
                    failed.contains(&seq),
                    "invariant: client {client} seq {seq} was never applied"
                );
                summary.counts.sequence_numbers_skipped += 1;
            }
        }
        for seq in completions.keys() {
            let applied_request = applied_by_seq
                .get(seq)
                .map(|(_, _, _, request)| request)
                .unwrap_or_else(|| {
                    panic!("invariant: client {client} seq {seq} completed but was never applied")
                });
            assert_eq!(
                applied_request,
                &requests[*seq as usize - 1].payload,
                "invariant: client {client} seq {seq} completed but was not applied as sent"
            );
        }

        // 3: a bypass read saw the latest update of its session before it, and nothing later.
        let mut reads_checked = 0;
        for (seq, completion) in &completions {
            let Completion::Replied {
                reply,
                makeup: false,
            } = completion
            else {
                continue;
            };
            let index = *seq as usize - 1;
            if requests[index].kind != RequestKind::Bypass {
                continue;
            }
            let expected = applied
                .iter()
                .rev()
                .filter(|(_, applied_seq, ..)| (*applied_seq as usize) <= index)
                .find(|(_, _, kind, request)| *kind == RequestKind::Update && !request.is_empty())
                .map(|(_, seq, ..)| *seq);
            let seen = match Reply::decode(reply) {
                Ok(Reply::Value(value)) => Some(seq_of_value(&value)),
                Ok(Reply::NotFound) => None,
                other => panic!("invariant: client {client} read {seq} got {other:?}"),
            };
            assert_eq!(
                seen, expected,
                "invariant: client {client} read {seq} missed its session's writes"
            );
            reads_checked += 1;
        }

        // The store holds the session's last applied update.
        let last_update = applied
            .iter()
            .rev()
            .find(|(_, _, kind, request)| *kind == RequestKind::Update && !request.is_empty())
            .map(|(_, seq, ..)| *seq);
        let store = app.kv.as_ref().expect("the swarm runs with the store");
        let stored = store.get(&key_of(session_id)).map(seq_of_value);
        assert_eq!(
            stored, last_update,
            "invariant: client {client}: the store lost an update"
        );
        let fills = applied
            .iter()
            .filter(|(_, _, kind, request)| *kind == RequestKind::Bypass && request.is_empty())
            .count();
        notes.push(format!(
            "invariants 1-3, client{client} (s={session_id:x}): {} requests, {} completed, \
             {} failed; {} applied once in order, as sent ({fills} no-op fills); {reads_checked} \
             reads saw their session's latest write; the store holds seq {}",
            requests.len(),
            completions.len(),
            failed.len(),
            applied.len(),
            stored.map_or_else(|| "none".to_string(), |seq| seq.to_string()),
        ));
    }
    (completed_count, notes)
}

/// Totals over a swarm of seeds: what was exercised, for the summary `pmnet sim` prints.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SwarmSummary {
    pub seeds: u64,
    pub requests_completed: u64,
    pub seeds_with_loss: u64,
    pub seeds_with_duplication: u64,
    pub seeds_with_corruption_in_flight: u64,
    pub seeds_with_partitions: u64,
    pub seeds_with_device_crashes: u64,
    pub seeds_with_server_crashes: u64,
    pub counts: FaultCounts,
}

impl SwarmSummary {
    /// Count one seed's report in.
    pub fn add(&mut self, report: &Report) {
        let counts = &report.faults.counts;
        self.seeds += 1;
        self.requests_completed += report.requests_completed;
        self.seeds_with_loss += u64::from(counts.datagrams_lost > 0);
        self.seeds_with_duplication += u64::from(counts.datagrams_duplicated > 0);
        self.seeds_with_corruption_in_flight += u64::from(counts.datagrams_corrupted > 0);
        let partitions = counts.partitions_symmetric + counts.partitions_one_way;
        self.seeds_with_partitions += u64::from(partitions > 0);
        self.seeds_with_device_crashes += u64::from(counts.device_crashes > 0);
        self.seeds_with_server_crashes += u64::from(counts.server_crashes > 0);
        self.counts.add(counts);
    }

    /// The summary as `(name, value)` lines, one fault class a line.
    pub fn lines(&self) -> Vec<(&'static str, u64)> {
        let mut lines = vec![
            ("seeds run", self.seeds),
            ("requests completed", self.requests_completed),
            ("seeds with loss", self.seeds_with_loss),
            ("seeds with duplication", self.seeds_with_duplication),
            (
                "seeds with corruption in flight",
                self.seeds_with_corruption_in_flight,
            ),
            ("seeds with partitions", self.seeds_with_partitions),
            ("seeds with device crashes", self.seeds_with_device_crashes),
            ("seeds with server crashes", self.seeds_with_server_crashes),
        ];
        lines.extend(self.counts.lines());
        lines
    }
}

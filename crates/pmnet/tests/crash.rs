//! "Prove it under faults": real `pmnet device` and `pmnet server` processes on loopback,
//! killed with SIGKILL at random moments and restarted on the same log and data files while
//! client sessions keep sending numbered updates, in the style of sled's crash tests.
//!
//! SIGKILL is a *process crash*, not a power loss: the log and the store are mapped files in a
//! temporary directory, and what a killed process wrote to them survives in the page cache
//! whether or not it was flushed. These tests therefore prove the protocol and the recovery
//! code (log replay, recovery polls, exactly-once across restarts, no-op fills), not the
//! flushing; the simulator (`crates/sim`) and the store's crash tests model lost cache lines.
//!
//! Each session appends `"n,"` for n = 1, 2, 3, … (request n is sequence number n of the
//! session) to its own keys (`s<i>/<n / CHUNK>`, so that no value grows long). The driver
//! records which requests were acked (a PMNet-ACK from the device or the server's reply) and
//! which failed (`TimedOut`: some sessions give up quickly, so that requests fail while a
//! process is down). At the end every session reads its last key with a bypass GET (ordered
//! after all its updates), the server is stopped, and its data file is checked: every acked
//! update is present, nothing is applied twice, the order is kept; a failed request is either
//! applied once or not at all (the server skips it on the client's no-op fill).
//!
//! The server runs the default engine (the packet store) but in one test, which runs the
//! append-only key-value store (`--engine kv`).
//!
//! The kill schedule is random: the seed is printed, and `PMNET_SEED=N` replays the same
//! schedule (the processes' own timing still varies from run to run). Each test crashes 12
//! times; `PMNET_CRASH_ROUNDS=N` asks for N (a longer soak).

mod common;

use std::collections::BTreeSet;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::{poll_until, seed, Cluster, PATIENCE};
use pmnet_proto::{Client, ClientConfig, ClientError, ClientEvent, Completion, Time};
use pmnet_store::{Reply, Request};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Appends per key: keeps every value (and so every store record) short.
const CHUNK: u32 = 100;

fn chunk_key(session: usize, n: u32) -> String {
    format!("s{session}/{}", n / CHUNK)
}

/// How a session's client gives up.
#[derive(Debug, Clone, Copy)]
enum Patience {
    /// The protocol's defaults: retries for about ten seconds, longer than any outage here.
    Default,
    /// Gives up after a couple of hundred milliseconds, so requests fail while a process is
    /// down and the server later skips them on a no-op fill.
    Quick,
}

/// What one session did.
#[derive(Debug)]
struct SessionOutcome {
    index: usize,
    session_id: u64,
    /// Appends started: 1..=started.
    started: u32,
    acked: BTreeSet<u32>,
    failed: BTreeSet<u32>,
    /// The sequence number of the final GET that succeeded, and what it returned.
    final_get: (u32, Option<Vec<u8>>),
    /// GETs that failed before it.
    failed_gets: u32,
}

struct SessionShared {
    acked: AtomicU64,
    failed: AtomicU64,
}

struct Driver {
    stop: Arc<AtomicBool>,
    shared: Vec<Arc<SessionShared>>,
    threads: Vec<JoinHandle<SessionOutcome>>,
}

impl Driver {
    fn start(device: SocketAddr, patience: &[Patience]) -> Driver {
        let stop = Arc::new(AtomicBool::new(false));
        let mut shared = Vec::new();
        let mut threads = Vec::new();
        for (index, patience) in patience.iter().copied().enumerate() {
            let counters = Arc::new(SessionShared {
                acked: AtomicU64::new(0),
                failed: AtomicU64::new(0),
            });
            shared.push(counters.clone());
            let stop = stop.clone();
            threads.push(
                std::thread::Builder::new()
                    .name(format!("session {index}"))
                    .spawn(move || run_session(index, patience, device, &stop, &counters))
                    .expect("spawn a session thread"),
            );
        }
        Driver {
            stop,
            shared,
            threads,
        }
    }

    fn acked(&self) -> Vec<u64> {
        self.shared
            .iter()
            .map(|shared| shared.acked.load(Ordering::Relaxed))
            .collect()
    }

    /// Wait until every session has had at least `count` more requests acked: the system
    /// serves again after whatever happened.
    fn wait_for_progress(&self, count: u64, what: &str) {
        let start = self.acked();
        poll_until(
            &format!("every session to get {count} more acks ({what})"),
            || {
                let now = self.acked();
                if now
                    .iter()
                    .zip(&start)
                    .all(|(now, start)| *now >= start + count)
                {
                    Ok(())
                } else {
                    Err(format!("acks then {start:?}, now {now:?}"))
                }
            },
        );
    }

    /// Stop starting requests; wait for each session to settle and read back its last key.
    fn finish(self) -> Vec<SessionOutcome> {
        self.stop.store(true, Ordering::Relaxed);
        self.threads
            .into_iter()
            .map(|thread| thread.join().expect("a session thread panicked"))
            .collect()
    }
}

/// One client session over its own UDP socket: the protocol's state machine, driven directly
/// so that its give-up settings can be chosen.
struct Session {
    client: Client,
    socket: UdpSocket,
    epoch: Instant,
    buffer: Vec<u8>,
}

impl Session {
    fn open(device: SocketAddr, patience: Patience) -> Session {
        let socket = UdpSocket::bind("127.0.0.1:0").expect("bind a client socket");
        let mut config = ClientConfig::new(pmnet_runtime::random_session_id(), 1, device);
        match patience {
            Patience::Default => config.window = 16,
            Patience::Quick => {
                config.window = 8;
                config.retransmit_timeout = Duration::from_millis(2);
                config.retransmit_timeout_max = Duration::from_millis(50);
                config.retransmits_max = 10;
            }
        }
        Session {
            client: Client::new(config),
            socket,
            epoch: Instant::now(),
            buffer: vec![0; 65_536],
        }
    }

    fn now(&self) -> Time {
        Time::since(self.epoch, Instant::now())
    }

    /// Send what is queued, wait (briefly) for a datagram, handle it and any due timer.
    fn turn(&mut self) {
        while let Some(transmit) = self.client.poll_transmit() {
            // Errors (a refused port while the device is down) are the network losing it.
            let _ = self.socket.send_to(&transmit.bytes, transmit.destination);
        }
        let now = self.now();
        let wait = self
            .client
            .poll_timeout()
            .map_or(Duration::from_millis(10), |at| {
                Duration::from_nanos(at.as_nanos().saturating_sub(now.as_nanos()))
            });
        let wait = wait.clamp(Duration::from_micros(100), Duration::from_millis(10));
        self.socket
            .set_read_timeout(Some(wait))
            .expect("set a read timeout");
        if let Ok((len, from)) = self.socket.recv_from(&mut self.buffer) {
            let now = self.now();
            self.client.handle(now, from, &self.buffer[..len]);
            // Take whatever else is already there without waiting.
            self.socket.set_nonblocking(true).expect("nonblocking");
            while let Ok((len, from)) = self.socket.recv_from(&mut self.buffer) {
                self.client.handle(now, from, &self.buffer[..len]);
            }
            self.socket.set_nonblocking(false).expect("blocking");
        }
        let now = self.now();
        if self.client.poll_timeout().is_some_and(|at| at <= now) {
            self.client.handle_timeout(now);
        }
        while let Some(transmit) = self.client.poll_transmit() {
            let _ = self.socket.send_to(&transmit.bytes, transmit.destination);
        }
    }
}

fn run_session(
    index: usize,
    patience: Patience,
    device: SocketAddr,
    stop: &AtomicBool,
    shared: &SessionShared,
) -> SessionOutcome {
    let mut session = Session::open(device, patience);
    let mut outcome = SessionOutcome {
        index,
        session_id: session.client.session_id(),
        started: 0,
        acked: BTreeSet::new(),
        failed: BTreeSet::new(),
        final_get: (0, None),
        failed_gets: 0,
    };
    let mut get_in_flight: Option<u32> = None;
    let mut final_deadline: Option<Instant> = None;
    loop {
        let stopping = stop.load(Ordering::Relaxed);
        if !stopping {
            while session.client.can_send() {
                let n = outcome.started + 1;
                let payload = Request::Append {
                    key: chunk_key(index, n).as_bytes(),
                    value: format!("{n},").as_bytes(),
                }
                .to_bytes();
                let seq = session
                    .client
                    .update(session.now(), &payload)
                    .expect("start an append");
                assert_eq!(seq, n, "session {index}: appends are the only requests");
                outcome.started = n;
            }
        } else if get_in_flight.is_none() && session.client.in_flight_count() == 0 {
            // Every append is acked or failed: read the last key back. A bypass request is
            // ordered after every earlier request of the session.
            let deadline = *final_deadline.get_or_insert_with(|| Instant::now() + PATIENCE);
            assert!(
                Instant::now() < deadline,
                "session {index}: the final GET did not complete within {PATIENCE:?} \
                 ({} failed)",
                outcome.failed_gets
            );
            let payload = Request::Get {
                key: chunk_key(index, outcome.started).as_bytes(),
            }
            .to_bytes();
            let seq = session
                .client
                .bypass(session.now(), &payload)
                .expect("start the final GET");
            get_in_flight = Some(seq);
        }
        session.turn();
        while let Some(event) = session.client.poll_event() {
            match event {
                ClientEvent::Completed {
                    seq, completion, ..
                } if Some(seq) == get_in_flight => {
                    let Completion::Replied { reply, .. } = completion else {
                        panic!("session {index}: the GET completed with {completion:?}");
                    };
                    let value = match Reply::decode(&reply) {
                        Ok(Reply::Value(value)) => Some(value),
                        Ok(Reply::NotFound) => None,
                        other => panic!("session {index}: the GET was answered {other:?}"),
                    };
                    outcome.final_get = (seq, value);
                    return outcome;
                }
                ClientEvent::Failed { seq, error, .. } if Some(seq) == get_in_flight => {
                    assert!(
                        matches!(error, ClientError::TimedOut | ClientError::NotLogged(_)),
                        "session {index}: request {seq} failed with {error:?}"
                    );
                    outcome.failed_gets += 1;
                    get_in_flight = None;
                }
                ClientEvent::Completed {
                    seq, completion, ..
                } => {
                    match &completion {
                        Completion::Logged { device_id: 1 } | Completion::ReplyUnavailable => {}
                        Completion::Replied { reply, .. } => assert_eq!(
                            Reply::decode(reply),
                            Ok(Reply::Ok),
                            "session {index}: append {seq} was answered"
                        ),
                        other => panic!("session {index}: append {seq} completed with {other:?}"),
                    }
                    assert!(outcome.acked.insert(seq), "append {seq} completed twice");
                    shared.acked.fetch_add(1, Ordering::Relaxed);
                }
                ClientEvent::Failed { seq, error, .. } => {
                    assert!(
                        matches!(error, ClientError::TimedOut | ClientError::NotLogged(_)),
                        "session {index}: request {seq} failed with {error:?}"
                    );
                    assert!(outcome.failed.insert(seq), "append {seq} failed twice");
                    shared.failed.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
}

/// The numbers in a history `"a,b,c,"`.
fn parse_history(key: &str, value: &[u8]) -> Vec<u32> {
    let text = std::str::from_utf8(value).unwrap_or_else(|_| panic!("{key}: not UTF-8"));
    assert!(
        text.is_empty() || text.ends_with(','),
        "{key}: a torn append in {text:?}"
    );
    text.split_terminator(',')
        .map(|item| {
            item.parse()
                .unwrap_or_else(|_| panic!("{key}: {item:?} is not a number in {text:?}"))
        })
        .collect()
}

/// Check the store against what the sessions recorded; returns (applied, failed-but-applied)
/// counts for the report.
fn check_store(cluster: &Cluster, outcomes: &[SessionOutcome], context: &str) -> (usize, usize) {
    let store = cluster.open_store();
    let records = store.sessions();
    let mut applied_total = 0;
    let mut failed_applied_total = 0;
    for outcome in outcomes {
        let index = outcome.index;
        let mut applied = Vec::new();
        for chunk in 0..=outcome.started / CHUNK {
            let key = format!("s{index}/{chunk}");
            let Some(value) = store.get(key.as_bytes()) else {
                continue;
            };
            let items = parse_history(&key, &value);
            for n in &items {
                assert_eq!(n / CHUNK, chunk, "{context}: session {index}: {n} in {key}");
            }
            applied.extend(items);
        }
        // Order kept and nothing applied twice: strictly increasing.
        for pair in applied.windows(2) {
            assert!(
                pair[0] < pair[1],
                "{context}: session {index}: {} then {} in the history",
                pair[0],
                pair[1]
            );
        }
        let applied_set: BTreeSet<u32> = applied.iter().copied().collect();
        // Nothing that was never sent.
        if let Some(last) = applied.last() {
            assert!(
                *last <= outcome.started,
                "{context}: session {index}: {last} applied, only {} sent",
                outcome.started
            );
        }
        // No acked update lost.
        let lost: Vec<u32> = outcome.acked.difference(&applied_set).copied().collect();
        assert!(
            lost.is_empty(),
            "{context}: session {index}: acked updates lost: {lost:?} (of {} acked)",
            outcome.acked.len()
        );
        // Everything settled: each request was acked or failed, and what was applied but not
        // acked is a failed one.
        for n in 1..=outcome.started {
            assert!(
                outcome.acked.contains(&n) != outcome.failed.contains(&n),
                "{context}: session {index}: append {n} is neither acked nor failed, or both"
            );
        }
        let failed_applied = applied_set.intersection(&outcome.failed).count();
        // The final GET saw the last key as the store holds it.
        let last_key = chunk_key(index, outcome.started);
        assert_eq!(
            outcome.final_get.1,
            store.get(last_key.as_bytes()),
            "{context}: session {index}: GET {last_key}"
        );
        // The store knows the session up to its final GET.
        let record = records
            .iter()
            .find(|record| record.session_id == outcome.session_id)
            .unwrap_or_else(|| panic!("{context}: session {index} has no record in the store"));
        assert_eq!(
            record.last_seq, outcome.final_get.0,
            "{context}: session {index}: last applied seq"
        );
        eprintln!(
            "{context}: session {index}: {} sent, {} acked, {} failed ({} of them applied), \
             {} applied, {} final GETs failed",
            outcome.started,
            outcome.acked.len(),
            outcome.failed.len(),
            failed_applied,
            applied.len(),
            outcome.failed_gets
        );
        applied_total += applied.len();
        failed_applied_total += failed_applied;
    }
    assert_eq!(store.recovery_problem(), None, "{context}: store recovery");
    (applied_total, failed_applied_total)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Victim {
    Device,
    Server,
    /// Both, in random order and combinations.
    Both,
}

/// Random pause in milliseconds from `range`.
fn pause(rng: &mut ChaCha8Rng, range: std::ops::Range<u64>) {
    let millis = rng.random_range(range);
    if millis > 0 {
        std::thread::sleep(Duration::from_millis(millis));
    }
}

fn crash_test(name: &str, victim: Victim, engine: Option<&'static str>) {
    let rounds: u32 = match std::env::var("PMNET_CRASH_ROUNDS") {
        Ok(text) => text
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("PMNET_CRASH_ROUNDS must be a number, got {text:?}")),
        Err(_) => 12,
    };
    let seed = seed(name);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let started = Instant::now();
    let mut cluster = Cluster::start_with_engine(engine);
    let driver = Driver::start(
        cluster.device_addr,
        &[
            Patience::Default,
            Patience::Default,
            Patience::Quick,
            Patience::Quick,
        ],
    );
    let context = format!("{name} (PMNET_SEED={seed})");
    for round in 1..=rounds {
        driver.wait_for_progress(10, &format!("{context}, before crash {round}"));
        // Let the load run for a random while, then crash.
        pause(&mut rng, 0..400);
        let scenario = match victim {
            Victim::Device => 0,
            Victim::Server => 1,
            Victim::Both => rng.random_range(2..5),
        };
        let description = match scenario {
            0 => {
                cluster.kill_device();
                pause(&mut rng, 0..800);
                cluster.start_device();
                "device killed and restarted"
            }
            1 => {
                cluster.kill_server();
                pause(&mut rng, 0..800);
                cluster.start_server();
                "server killed and restarted"
            }
            2 => {
                // Both down at once; restarted in random order.
                let device_first = rng.random_bool(0.5);
                if device_first {
                    cluster.kill_device();
                    pause(&mut rng, 0..100);
                    cluster.kill_server();
                } else {
                    cluster.kill_server();
                    pause(&mut rng, 0..100);
                    cluster.kill_device();
                }
                pause(&mut rng, 0..600);
                if rng.random_bool(0.5) {
                    cluster.start_device();
                    pause(&mut rng, 0..200);
                    cluster.start_server();
                } else {
                    cluster.start_server();
                    pause(&mut rng, 0..200);
                    cluster.start_device();
                }
                "both killed and restarted"
            }
            3 => {
                // The device dies while the restarted server recovers from it.
                cluster.kill_server();
                pause(&mut rng, 0..400);
                cluster.start_server();
                pause(&mut rng, 0..30);
                cluster.kill_device();
                pause(&mut rng, 0..400);
                cluster.start_device();
                "server restarted, then the device killed during its recovery"
            }
            _ => {
                // The server dies while the restarted device replays its log.
                cluster.kill_device();
                pause(&mut rng, 0..400);
                cluster.start_device();
                pause(&mut rng, 0..30);
                cluster.kill_server();
                pause(&mut rng, 0..400);
                cluster.start_server();
                "device restarted, then the server killed during the replay"
            }
        };
        eprintln!(
            "{context}: crash {round}: {description}; acks so far {:?}",
            driver.acked()
        );
    }
    driver.wait_for_progress(10, &format!("{context}, after the last crash"));
    let outcomes = driver.finish();
    // Everything was acked by the server: the log empties.
    cluster.device().wait_metric(
        "pmnet_device_log_live_entries",
        "",
        "to drop to 0 at the end",
        |value| value == 0.0,
    );
    let fills = cluster
        .server()
        .metric("pmnet_server_noop_fills_received_total", "")
        .unwrap_or(f64::NAN);
    cluster.stop_server();
    let (applied, failed_applied) = check_store(&cluster, &outcomes, &context);
    cluster.stop_device();
    eprintln!(
        "{context}: {rounds} crashes, {} device and {} server starts, {applied} appends \
         applied ({failed_applied} of them after their client gave up), {fills} no-op fills \
         since the last server start, {} log entries recovered by restarted devices, {} torn \
         slots rejected, {:.1} s",
        cluster.device_starts,
        cluster.server_starts,
        cluster.device_recovered_entries,
        cluster.device_rejected_slots,
        started.elapsed().as_secs_f64()
    );
}

#[test]
fn device_crashes_lose_no_acked_update() {
    crash_test("device_crashes_lose_no_acked_update", Victim::Device, None);
}

#[test]
fn server_crashes_apply_every_acked_update_exactly_once() {
    crash_test(
        "server_crashes_apply_every_acked_update_exactly_once",
        Victim::Server,
        None,
    );
}

#[test]
fn device_and_server_crashes_together() {
    crash_test("device_and_server_crashes_together", Victim::Both, None);
}

/// The same with the server on the append-only key-value store (`--engine kv`) instead of the
/// default packet store.
#[test]
fn server_crashes_with_the_kv_engine() {
    crash_test(
        "server_crashes_with_the_kv_engine",
        Victim::Server,
        Some("kv"),
    );
}

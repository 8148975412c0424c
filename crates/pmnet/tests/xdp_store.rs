//! The packet store on AF_XDP (docs/inpath.md), as real processes on the testbed's
//! three hosts (network namespaces joined by veth pairs, docs/testbed.md): `pmnet server
//! --engine packet --xdp eth0` on the server host, whose update frames the kernel writes
//! straight into the store's slots; `pmnet device` on the router between it and the client
//! host, where client sessions send updates.
//!
//! - **Crashes**: sessions send numbered SETs while the server is killed with SIGKILL at random
//!   moments and restarted on the same data file (with `--xdp` again); at the end every
//!   acknowledged update is in the store, none applied twice or out of order, and the updates
//!   landed in place (the server's counters of frames received into slots and records that
//!   are those frames). SIGKILL is a process crash, not a power loss: the store is a file in
//!   `/dev/shm`; the store's own crash tests model lost cache lines.
//! - **A full store**: the fill ring runs dry when the store has no free slot to lend; the
//!   server switches steering off, deletes reach it through its UDP socket, and once they made
//!   room the updates that waited are applied and steering is back on.
//! - `--xdp` with another engine is refused with what to do (no root needed).
//!
//! The first two need root, network namespaces and XDP on veth: where any is missing they say
//! so and pass without running. The kill schedule is random: the seed is printed and
//! `PMNET_SEED=N` replays it; `PMNET_CRASH_ROUNDS=N` asks for N crashes (default 6).

mod common;

use std::collections::BTreeSet;
use std::net::{SocketAddr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::{pmnet_bin, poll_until, run_pmnet, Proc, PATIENCE};
use pmnet_proto::{ClientEvent, Completion};
use pmnet_runtime::{ClientSession, SessionOptions};
use pmnet_store::{Reply, Request};
use pmnet_testbed::{
    Host, Testbed, TestbedGuard, DEVICE_CLIENT_SIDE, DEVICE_SERVER_SIDE, SERVER_ADDR, SERVER_IF,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const SERVER_PORT: u16 = 7500;
const DEVICE_PORT: u16 = 7400;
/// Keys per session: SET n writes key n % KEYS, so values are overwritten (slots reclaimed).
const KEYS: u32 = 40;
/// Bytes of each value: a third of a slot.
const VALUE_LEN: usize = 600;

/// A testbed of this test's own, or `None` (and why) where one cannot run here.
fn testbed(test: &str) -> Option<TestbedGuard> {
    if let Err(why) = pmnet_testbed::available() {
        eprintln!("SKIP {test}: no testbed of network namespaces here: {why}");
        return None;
    }
    if let Err(why) = pmnet_runtime::xdp_available() {
        eprintln!("SKIP {test}: AF_XDP cannot run here: {why}");
        return None;
    }
    let name = format!("xs{}{}", std::process::id() % 100_000, &test[..3]);
    let testbed = Testbed::guard(&name).unwrap_or_else(|error| panic!("testbed {name}: {error}"));
    if let Err(why) = probe_xdp(&testbed) {
        eprintln!("SKIP {test}: the kernel refuses the AF_XDP receive path here: {why}");
        return None;
    }
    Some(testbed)
}

/// Start a server with `--xdp` on a scratch store and stop it: `Err` with its last words if
/// it could not attach (XDP or AF_XDP refused by the kernel, on this interface).
fn probe_xdp(testbed: &Testbed) -> Result<(), String> {
    let dir = tempfile::tempdir_in("/dev/shm").map_err(|error| error.to_string())?;
    let mut command = testbed.command(Host::Server, pmnet_bin());
    command.args([
        "server",
        // Not loopback, and without keys on purpose: protected mode wants --insecure.
        "--insecure",
        "--listen",
        &format!("{SERVER_ADDR}:{SERVER_PORT}"),
        "--xdp",
        SERVER_IF,
        "--data-file",
        &dir.path().join("probe.data").display().to_string(),
        "--data-mib",
        "4",
    ]);
    let mut probe = Proc::spawn_command("probe server", command);
    let deadline = Instant::now() + PATIENCE;
    loop {
        if probe
            .stdout()
            .iter()
            .any(|line| line.contains(" listening on "))
        {
            probe.stop();
            return Ok(());
        }
        if probe.wait_timeout(Duration::from_millis(20)).is_some() {
            let stderr = probe.stderr();
            let why = stderr.lines().rfind(|line| !line.trim().is_empty());
            return Err(why.unwrap_or("it exited").to_owned());
        }
        assert!(
            Instant::now() < deadline,
            "the probe server neither started nor stopped within {PATIENCE:?}"
        );
    }
}

/// The address after `marker` in `line`, up to whitespace.
fn addr_after(line: &str, marker: &str) -> Option<SocketAddr> {
    let rest = &line[line.find(marker)? + marker.len()..];
    let end = rest
        .find(|c: char| c.is_whitespace() || c == '/' || c == ';')
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

/// A process started on a testbed host, its banner read up to the metrics line.
struct Started {
    proc: Proc,
    banner: Vec<String>,
    metrics: SocketAddr,
}

fn start_on(testbed: &Testbed, host: Host, name: &str, args: &[String]) -> Started {
    let mut command = testbed.command(host, pmnet_bin());
    command.args(args);
    let mut proc = Proc::spawn_command(name, command);
    proc.wait_for_line("a \"listening on\" line", |line| {
        line.contains(" listening on ")
    });
    let last = proc.wait_for_line("the end of the banner", |line| line.contains("metrics: "));
    let metrics = addr_after(&last, "metrics: http://")
        .unwrap_or_else(|| panic!("{name}: no metrics address in {last:?}"));
    Started {
        banner: proc.stdout(),
        proc,
        metrics,
    }
}

/// A metric of a process on `host`, scraped from inside its namespace.
fn metric(testbed: &Testbed, host: Host, addr: SocketAddr, name: &str) -> Result<f64, String> {
    let text = testbed
        .run_in(host, || {
            pmnet_runtime::metrics::scrape(addr, Duration::from_secs(5))
        })
        .map_err(|error| error.to_string())?
        .map_err(|error| format!("scrape {addr}: {error}"))?;
    pmnet_runtime::metrics::find_sample(&text, name, "")
        .ok_or_else(|| format!("no sample {name} at {addr}"))
}

fn wait_metric(
    testbed: &Testbed,
    host: Host,
    addr: SocketAddr,
    name: &str,
    what: &str,
    ok: impl Fn(f64) -> bool,
) {
    poll_until(&format!("{name} {what}"), || {
        match metric(testbed, host, addr, name) {
            Ok(value) if ok(value) => Ok(()),
            Ok(value) => Err(value.to_string()),
            Err(error) => Err(error),
        }
    });
}

/// The server (packet store on AF_XDP) and the device of a test, restartable on their files.
struct Cluster {
    testbed: Testbed,
    dir: PathBuf,
    data_mib: u32,
    server: Option<Started>,
    device: Option<Started>,
    server_starts: u32,
}

impl Cluster {
    fn new(testbed: &Testbed, dir: &Path, data_mib: u32) -> Cluster {
        Cluster {
            testbed: testbed.clone(),
            dir: dir.to_owned(),
            data_mib,
            server: None,
            device: None,
            server_starts: 0,
        }
    }

    fn data_file(&self) -> PathBuf {
        self.dir.join("server.data")
    }

    fn start_server(&mut self) {
        self.server_starts += 1;
        let args: Vec<String> = [
            "server",
            // Not loopback, and without keys on purpose: protected mode wants --insecure.
            "--insecure",
            "--listen",
            &format!("{SERVER_ADDR}:{SERVER_PORT}"),
            "--server-id",
            "1",
            "--device",
            &format!("{DEVICE_SERVER_SIDE}:{DEVICE_PORT}"),
            "--engine",
            "packet",
            "--xdp",
            SERVER_IF,
            "--data-file",
            &self.data_file().display().to_string(),
            "--data-mib",
            &self.data_mib.to_string(),
            // A store that may not grow: the full store's path is what some tests are about.
            "--data-max-mib",
            &self.data_mib.to_string(),
            "--metrics",
            &format!("{SERVER_ADDR}:0"),
            "--report-interval",
            "0",
        ]
        .map(String::from)
        .to_vec();
        let started = start_on(
            &self.testbed,
            Host::Server,
            &format!("server (start {})", self.server_starts),
            &args,
        );
        let receive = started
            .banner
            .iter()
            .find(|line| line.trim_start().starts_with("receive: "))
            .unwrap_or_else(|| panic!("no receive line in {:?}", started.banner));
        assert!(
            receive.contains(&format!("AF_XDP on {SERVER_IF}"))
                && (receive.contains("copy mode") || receive.contains("zero-copy mode"))
                && receive.contains(&format!("steering {SERVER_ADDR}:{SERVER_PORT}")),
            "the banner says the receive path: {receive}"
        );
        assert!(
            started
                .banner
                .iter()
                .any(|line| line.contains("medium: emulated-pm")),
            "{:?}",
            started.banner
        );
        self.server = Some(started);
    }

    fn start_device(&mut self) {
        let args: Vec<String> = [
            "device",
            // Not loopback, and without keys on purpose: protected mode wants --insecure.
            "--insecure",
            "--listen",
            &format!("0.0.0.0:{DEVICE_PORT}"),
            "--server",
            &format!("1={SERVER_ADDR}:{SERVER_PORT}"),
            "--log-file",
            &self.dir.join("device.log").display().to_string(),
            "--slots",
            "8192",
            // One datagram per request: each update can become its record in place (a
            // device's batches are applied from their bytes).
            "--no-batch",
            "--metrics",
            "127.0.0.1:0",
            "--report-interval",
            "0",
        ]
        .map(String::from)
        .to_vec();
        self.device = Some(start_on(&self.testbed, Host::Device, "device", &args));
    }

    fn server_metric(&self, name: &str) -> Result<f64, String> {
        let server = self.server.as_ref().expect("the server runs");
        metric(&self.testbed, Host::Server, server.metrics, name)
    }

    fn wait_server_metric(&self, name: &str, what: &str, ok: impl Fn(f64) -> bool) {
        let server = self.server.as_ref().expect("the server runs");
        wait_metric(&self.testbed, Host::Server, server.metrics, name, what, ok);
    }

    fn wait_device_metric(&self, name: &str, what: &str, ok: impl Fn(f64) -> bool) {
        let device = self.device.as_ref().expect("the device runs");
        wait_metric(&self.testbed, Host::Device, device.metrics, name, what, ok);
    }

    /// SIGKILL the server: a process crash.
    fn kill_server(&mut self) {
        let mut server = self.server.take().expect("the server runs");
        server.proc.kill();
        common::assert_no_panic(&server.proc);
    }

    /// SIGTERM both and check they stopped cleanly.
    fn stop(&mut self) {
        for started in [self.server.take(), self.device.take()]
            .into_iter()
            .flatten()
        {
            let mut started = started;
            started.proc.stop();
            common::assert_no_panic(&started.proc);
        }
    }
}

/// What one session did.
#[derive(Debug)]
struct SessionOutcome {
    index: usize,
    session_id: u64,
    started: u32,
    acked: BTreeSet<u32>,
    failed: BTreeSet<u32>,
    /// The final GET's sequence number and the value it returned.
    final_get: (u32, Option<Vec<u8>>),
}

fn key(session: usize, n: u32) -> String {
    format!("s{session}/{}", n % KEYS)
}

fn value(n: u32) -> Vec<u8> {
    let mut value = format!("{n}:").into_bytes();
    value.resize(VALUE_LEN, b'x');
    value
}

/// The number a stored value starts with.
fn number_of(value: &[u8]) -> u32 {
    let text = std::str::from_utf8(value).expect("a value is ASCII");
    let (number, rest) = text.split_once(':').expect("a value is N:xxx");
    assert!(rest.len() == VALUE_LEN - number.len() - 1 && rest.bytes().all(|b| b == b'x'));
    number.parse().expect("a number")
}

/// Client sessions on the client host, each sending SETs until told to stop.
struct Driver {
    stop: Arc<AtomicBool>,
    acked: Vec<Arc<AtomicU64>>,
    threads: Vec<JoinHandle<SessionOutcome>>,
}

impl Driver {
    fn start(testbed: &Testbed, sessions: usize) -> Driver {
        let stop = Arc::new(AtomicBool::new(false));
        let device = SocketAddr::V4(SocketAddrV4::new(DEVICE_CLIENT_SIDE, DEVICE_PORT));
        let mut acked = Vec::new();
        let mut threads = Vec::new();
        for index in 0..sessions {
            let counter = Arc::new(AtomicU64::new(0));
            acked.push(counter.clone());
            let (stop, testbed) = (stop.clone(), testbed.clone());
            threads.push(
                std::thread::Builder::new()
                    .name(format!("session {index}"))
                    .spawn(move || {
                        testbed.enter(Host::Client).expect("enter the client host");
                        run_session(index, device, &stop, &counter)
                    })
                    .expect("spawn a session thread"),
            );
        }
        Driver {
            stop,
            acked,
            threads,
        }
    }

    fn acked(&self) -> Vec<u64> {
        self.acked
            .iter()
            .map(|count| count.load(Ordering::Relaxed))
            .collect()
    }

    /// Wait until every session has `count` more acks.
    fn wait_for_progress(&self, count: u64, what: &str) {
        let start = self.acked();
        poll_until(
            &format!("every session to get {count} more acks ({what})"),
            || {
                let now = self.acked();
                if now
                    .iter()
                    .zip(&start)
                    .all(|(now, then)| *now >= then + count)
                {
                    Ok(())
                } else {
                    Err(format!("acks then {start:?}, now {now:?}"))
                }
            },
        );
    }

    fn finish(self) -> Vec<SessionOutcome> {
        self.stop.store(true, Ordering::Relaxed);
        self.threads
            .into_iter()
            .map(|thread| thread.join().expect("a session thread panicked"))
            .collect()
    }
}

fn run_session(
    index: usize,
    device: SocketAddr,
    stop: &AtomicBool,
    acked_count: &AtomicU64,
) -> SessionOutcome {
    let mut options = SessionOptions::new(1, device);
    options.window = Some(16);
    let mut session = ClientSession::open(options).expect("open a client session");
    let mut outcome = SessionOutcome {
        index,
        session_id: session.session_id(),
        started: 0,
        acked: BTreeSet::new(),
        failed: BTreeSet::new(),
        final_get: (0, None),
    };
    loop {
        if !stop.load(Ordering::Relaxed) {
            while session.can_send() {
                let n = outcome.started + 1;
                let request = Request::Set {
                    key: key(index, n).as_bytes(),
                    value: &value(n),
                }
                .to_bytes();
                let seq = session.queue_update(&request).expect("start a SET");
                assert_eq!(seq, n, "session {index}: SETs are its only updates");
                outcome.started = n;
            }
        } else if session.in_flight_count() == 0 {
            // Every SET is acked or failed: read the last key back (a bypass request, ordered
            // after the session's updates; it reaches the server through AF_XDP too).
            let last = key(index, outcome.started);
            let get = Request::Get {
                key: last.as_bytes(),
            }
            .to_bytes();
            let seq = session.start_bypass(&get).expect("start the final GET");
            let deadline = Instant::now() + PATIENCE;
            loop {
                assert!(Instant::now() < deadline, "session {index}: final GET");
                match session.next_event(Some(deadline)) {
                    Some(ClientEvent::Completed {
                        seq: done,
                        completion: Completion::Replied { reply, .. },
                        ..
                    }) if done == seq => {
                        let value = match Reply::decode(&reply) {
                            Ok(Reply::Value(value)) => Some(value),
                            Ok(Reply::NotFound) => None,
                            other => panic!("session {index}: GET {last} answered {other:?}"),
                        };
                        outcome.final_get = (seq, value);
                        return outcome;
                    }
                    Some(other) => panic!("session {index}: final GET: {other:?}"),
                    None => {}
                }
            }
        }
        let deadline = Instant::now() + Duration::from_millis(20);
        while let Some(event) = session.next_event(Some(deadline)) {
            match event {
                ClientEvent::Completed {
                    seq, completion, ..
                } => {
                    match &completion {
                        Completion::Logged { .. } | Completion::ReplyUnavailable => {}
                        Completion::Replied { reply, .. } => assert_eq!(
                            Reply::decode(reply),
                            Ok(Reply::Ok),
                            "session {index}: SET {seq}"
                        ),
                    }
                    assert!(outcome.acked.insert(seq), "SET {seq} completed twice");
                    acked_count.fetch_add(1, Ordering::Relaxed);
                }
                ClientEvent::Failed { seq, error, .. } => {
                    eprintln!("session {index}: SET {seq} failed: {error:?}");
                    assert!(outcome.failed.insert(seq), "SET {seq} failed twice");
                }
            }
            if session.can_send() && !stop.load(Ordering::Relaxed) {
                break;
            }
        }
    }
}

/// Every acknowledged SET is in the store: each key holds the last SET of it that was applied,
/// which is the last one started (every one completes) or, where some failed, at least the
/// last acknowledged one; nothing that was never sent; the final GET saw what is stored.
fn check_store(path: &Path, outcomes: &[SessionOutcome], context: &str) {
    let region = pmnet_pm::MmapRegion::open(path, pmnet_pm::MmapOptions::default())
        .expect("open the data file");
    let store = pmnet_pktstore::Store::open(region).expect("the store opens");
    assert_eq!(
        store.recovery().warning(),
        None,
        "{context}: store recovery"
    );
    let sessions = pmnet_store::Application::sessions(&store);
    for outcome in outcomes {
        let index = outcome.index;
        for n in 1..=outcome.started {
            assert!(
                outcome.acked.contains(&n) != outcome.failed.contains(&n),
                "{context}: session {index}: SET {n} neither acked nor failed, or both"
            );
        }
        for residue in 0..KEYS.min(outcome.started) {
            let name = key(index, residue);
            let stored = store
                .get(name.as_bytes())
                .unwrap_or_else(|corruption| panic!("{context}: {name}: {corruption:?}"))
                .map(|value| number_of(&value.to_vec()));
            let last_started = (1..=outcome.started).rev().find(|n| n % KEYS == residue);
            let last_acked = outcome.acked.iter().rev().find(|n| *n % KEYS == residue);
            let stored = stored.unwrap_or_else(|| {
                panic!("{context}: session {index}: {name} is missing (last acked {last_acked:?})")
            });
            assert_eq!(stored % KEYS, residue, "{context}: {name} holds {stored}");
            assert!(
                stored <= outcome.started,
                "{context}: {name} holds {stored}, only {} sent",
                outcome.started
            );
            if let Some(last_acked) = last_acked {
                assert!(
                    stored >= *last_acked,
                    "{context}: session {index}: {name} holds {stored}: acked SET {last_acked} \
                     lost"
                );
            }
            if outcome.failed.is_empty() {
                assert_eq!(Some(stored), last_started, "{context}: {name}");
            }
        }
        let last = key(index, outcome.started);
        let stored = store
            .get(last.as_bytes())
            .expect("no corruption")
            .map(|value| value.to_vec());
        assert_eq!(
            outcome.final_get.1, stored,
            "{context}: session {index}: GET {last}"
        );
        let record = sessions
            .iter()
            .find(|record| record.session_id == outcome.session_id)
            .unwrap_or_else(|| panic!("{context}: session {index} has no record"));
        assert_eq!(
            record.last_seq, outcome.final_get.0,
            "{context}: session {index}: last applied seq"
        );
        eprintln!(
            "{context}: session {index}: {} SETs sent, {} acked, {} failed",
            outcome.started,
            outcome.acked.len(),
            outcome.failed.len()
        );
    }
}

#[test]
fn server_crashes_on_af_xdp_lose_no_acked_update() {
    let test = "server_crashes_on_af_xdp_lose_no_acked_update";
    let Some(testbed) = testbed(test) else {
        return;
    };
    let rounds: u32 = std::env::var("PMNET_CRASH_ROUNDS")
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .unwrap_or(6);
    let seed = common::seed(test);
    let context = format!("{test} (PMNET_SEED={seed})");
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    // The store file in /dev/shm: the kernel pins the UMEM's pages long-term, which a tmpfs
    // file allows (a disk file system's does not).
    let dir = tempfile::tempdir_in("/dev/shm").expect("a directory in /dev/shm");
    let mut cluster = Cluster::new(&testbed, dir.path(), 64);
    cluster.start_server();
    cluster.start_device();
    let driver = Driver::start(&testbed, 3);
    for round in 1..=rounds {
        driver.wait_for_progress(20, &format!("{context}, before crash {round}"));
        std::thread::sleep(Duration::from_millis(rng.random_range(0..300)));
        cluster.kill_server();
        std::thread::sleep(Duration::from_millis(rng.random_range(0..500)));
        cluster.start_server();
        eprintln!(
            "{context}: crash {round}: server killed and restarted; acks so far {:?}",
            driver.acked()
        );
    }
    driver.wait_for_progress(50, &format!("{context}, after the last crash"));
    let outcomes = driver.finish();
    // Every update is applied: the device's log empties.
    cluster.wait_device_metric("pmnet_device_log_live_entries", "to drop to 0", |value| {
        value == 0.0
    });
    // Since its last start the server took frames off its AF_XDP socket straight into store
    // slots, and made records of them in place.
    for name in [
        "pmnet_server_xdp_in_slot_total",
        "pmnet_store_records_received_in_place_total",
    ] {
        let value = cluster.server_metric(name).unwrap();
        assert!(value > 0.0, "{context}: {name} = {value}");
    }
    let frames = cluster
        .server_metric("pmnet_server_xdp_frames_total")
        .unwrap();
    let in_place = cluster
        .server_metric("pmnet_store_records_received_in_place_total")
        .unwrap();
    cluster.stop();
    check_store(&cluster.data_file(), &outcomes, &context);
    eprintln!(
        "{context}: {rounds} crashes, {} server starts; after the last start {frames} frames \
         from the AF_XDP socket, {in_place} records made in place",
        cluster.server_starts
    );
}

#[test]
fn a_full_store_on_af_xdp_switches_steering_off_until_deletes_make_room() {
    let test = "a_full_store_on_af_xdp_switches_steering_off_until_deletes_make_room";
    let Some(testbed) = testbed(test) else {
        return;
    };
    let dir = tempfile::tempdir_in("/dev/shm").expect("a directory in /dev/shm");
    // 2 MiB: about 880 slots of 2 KiB after the session table; more SETs of new keys than that.
    let mut cluster = Cluster::new(&testbed, dir.path(), 2);
    cluster.start_server();
    cluster.start_device();
    let device = SocketAddr::V4(SocketAddrV4::new(DEVICE_CLIENT_SIDE, DEVICE_PORT));
    let keys: u32 = 1200;
    let big = vec![b'v'; 1500];
    // Writer: SETs of new keys, each acked by the device (logged) whether or not the store has
    // room; the store runs full and the rest wait at the device.
    let writer = {
        let testbed: Testbed = testbed.clone();
        let big = big.clone();
        std::thread::spawn(move || {
            testbed.enter(Host::Client).unwrap();
            let mut options = SessionOptions::new(1, device);
            options.window = Some(32);
            let mut session = ClientSession::open(options).unwrap();
            let mut acked = 0;
            let mut sent = 0;
            while acked < keys {
                while sent < keys && session.can_send() {
                    let request = Request::Set {
                        key: format!("k{sent:05}").as_bytes(),
                        value: &big,
                    }
                    .to_bytes();
                    session.queue_update(&request).unwrap();
                    sent += 1;
                }
                match session.next_event(Some(Instant::now() + PATIENCE)) {
                    Some(ClientEvent::Completed { .. }) => acked += 1,
                    other => panic!("a SET of the writer: {other:?}"),
                }
            }
        })
    };
    writer.join().expect("the writer");
    // The store is full: updates wait, and the AF_XDP path stopped steering.
    cluster.wait_server_metric("pmnet_server_requests_deferred_total", "above 0", |v| {
        v > 0.0
    });
    cluster.wait_server_metric("pmnet_server_xdp_steering_off", "to be 1", |v| v == 1.0);
    let applied_when_full = cluster
        .server_metric("pmnet_server_requests_applied_total")
        .unwrap();
    assert!(applied_when_full < f64::from(keys), "{applied_when_full}");
    // A second session deletes the first 600 keys (applied before the store was full): its
    // DELs reach the server through the UDP socket and make room.
    testbed
        .run_in(Host::Client, || {
            let mut session = ClientSession::open(SessionOptions::new(1, device)).unwrap();
            for n in 0..600u32 {
                let request = Request::Del {
                    key: format!("k{n:05}").as_bytes(),
                }
                .to_bytes();
                session.update(&request).expect("a DEL");
            }
        })
        .unwrap();
    // Everything waiting is applied, and steering is back on.
    cluster.wait_device_metric("pmnet_device_log_live_entries", "to drop to 0", |v| {
        v == 0.0
    });
    cluster.wait_server_metric("pmnet_server_xdp_steering_off", "to be 0 again", |v| {
        v == 0.0
    });
    let off = cluster
        .server_metric("pmnet_server_xdp_steering_off_total")
        .unwrap();
    assert!(off >= 1.0, "{off}");
    cluster.stop();
    let region =
        pmnet_pm::MmapRegion::open(&cluster.data_file(), pmnet_pm::MmapOptions::default()).unwrap();
    let store = pmnet_pktstore::Store::open(region).unwrap();
    assert_eq!(store.recovery().warning(), None);
    for n in 0..keys {
        let stored = store
            .get(format!("k{n:05}").as_bytes())
            .unwrap()
            .map(|value| value.to_vec());
        if n < 600 {
            assert_eq!(stored, None, "k{n:05} was deleted");
        } else {
            assert_eq!(stored.as_deref(), Some(&big[..]), "k{n:05}");
        }
    }
    eprintln!(
        "{test}: {applied_when_full} requests applied when the store filled up, steering off \
         {off} time(s), all {keys} SETs and 600 DELs applied in the end"
    );
}

#[test]
fn xdp_is_refused_for_engines_without_slots() {
    let dir = tempfile::tempdir().unwrap();
    for (engine, says) in [
        (&["--engine", "conventional"][..], "the conventional engine"),
        (&["--engine", "kv"][..], "key-value store"),
        (&["--ideal"][..], "ideal handler"),
    ] {
        let mut args: Vec<String> = [
            "server",
            "--listen",
            "127.0.0.1:0",
            "--data-file",
            &dir.path().join("refused.data").display().to_string(),
            "--data-mib",
            "8",
            "--xdp",
            "lo",
        ]
        .map(String::from)
        .to_vec();
        args.extend(engine.iter().map(|arg| arg.to_string()));
        let (status, _, stderr) = run_pmnet(&args, None);
        assert!(!status.success(), "{engine:?}: {stderr}");
        assert!(
            stderr.contains("--xdp lo")
                && stderr.contains(says)
                && stderr.contains("--engine packet"),
            "{engine:?}: {stderr}"
        );
    }
}

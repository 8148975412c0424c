//! `pmnet store-bench`: the storage engines side by side in one run — the per-write breakdown
//! in the layout of Table 1 of "Packets as Persistent In-Memory Data Structures", then update
//! latency and throughput through a real server (loopback UDP, a client session talking to
//! the server directly) with each engine. See docs/storage.md.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use clap::Args;
use pmnet_pktstore::bench::{median, run_breakdown, BreakdownOptions};
use pmnet_pktstore::EngineKind;
use pmnet_pm::{FlushChoice, MmapOptions};
use pmnet_proto::ClientEvent;
use pmnet_runtime::{
    online_cpu_count, pin_current_thread, ClientSession, LoopOptions, ServerOptions, ServerRuntime,
    SessionOptions, Shutdown, StoreOptions, WaitMode,
};
use pmnet_store::Request;

use crate::CliError;

#[derive(Debug, Clone, Args)]
pub struct StoreBenchArgs {
    /// Directory of the store files (a DRAM file system such as /dev/shm is emulated PM).
    #[arg(long, value_name = "DIR", default_value = "/dev/shm")]
    pub dir: PathBuf,

    /// How writes are made durable: auto, clwb, clflushopt, clflush, msync, fdatasync.
    #[arg(long, value_name = "METHOD", default_value = "auto")]
    pub flush: FlushChoice,

    /// Value sizes of the breakdown, in bytes, comma-separated.
    #[arg(
        long,
        value_name = "BYTES",
        value_delimiter = ',',
        default_value = "64,1024,4096"
    )]
    pub sizes: Vec<usize>,

    /// Timed writes per engine and size in the breakdown.
    #[arg(long, value_name = "N", default_value_t = 20_000)]
    pub writes: usize,

    /// Runs of the breakdown: the table shown is the run with the median share removed (the
    /// upper middle one for an even count), and the spread over the runs is reported (a shared
    /// machine is noisy).
    #[arg(long, value_name = "N", default_value_t = 5)]
    pub breakdown_runs: usize,

    /// Distinct keys, overwritten at random.
    #[arg(long, value_name = "N", default_value_t = 2_000)]
    pub keys: usize,

    /// Value size of the end-to-end updates.
    #[arg(long, value_name = "BYTES", default_value_t = 1024)]
    pub value: usize,

    /// Seconds of pipelined updates per engine for throughput.
    #[arg(long, value_name = "S", default_value_t = 3.0)]
    pub seconds: f64,

    /// Requests in flight in the throughput run.
    #[arg(long, value_name = "N", default_value_t = 32)]
    pub window: u32,

    /// Sequential updates per engine for latency.
    #[arg(long, value_name = "N", default_value_t = 3_000)]
    pub latency_requests: usize,

    /// Rounds of the server runs; the engines alternate within each round and the report
    /// gives medians (a shared machine is noisy).
    #[arg(long, value_name = "N", default_value_t = 3)]
    pub rounds: usize,

    /// Sleep in ppoll instead of busy-polling (on a VM a wake-up costs tens of µs).
    #[arg(long)]
    pub blocking: bool,

    /// Only the breakdown, no server.
    #[arg(long)]
    pub no_server: bool,
}

#[derive(Debug)]
struct EndToEnd {
    engine: &'static str,
    medium: String,
    latency_us: Vec<f64>,
    throughput: f64,
    /// CPU time the server's thread spent per update in the throughput run (µs); `None`
    /// where the thread's CPU clock cannot be read.
    server_cpu_us: Option<f64>,
    in_place: String,
}

/// The CPU time a thread has used so far, in ns, read through its CPU-time clock.
fn thread_cpu_ns(clock: libc::clockid_t) -> Option<u64> {
    let mut time = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `time` is a valid timespec to write; a bad clock id is an error, not UB.
    let result = unsafe { libc::clock_gettime(clock, &mut time) };
    (result == 0).then(|| time.tv_sec as u64 * 1_000_000_000 + time.tv_nsec as u64)
}

/// The CPU-time clock of a running thread.
fn thread_cpu_clock<T>(thread: &std::thread::JoinHandle<T>) -> Option<libc::clockid_t> {
    use std::os::unix::thread::JoinHandleExt;
    let mut clock: libc::clockid_t = 0;
    // SAFETY: the thread is alive (its JoinHandle is not joined) and `clock` is writable.
    let result = unsafe { libc::pthread_getcpuclockid(thread.as_pthread_t(), &mut clock) };
    (result == 0).then_some(clock)
}

fn percentile(sorted: &[f64], fraction: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let index = ((sorted.len() as f64 - 1.0) * fraction).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

/// One engine behind a server on loopback: latency of sequential updates, then throughput of
/// pipelined ones, and the server thread's CPU time per update.
fn run_server_engine(
    args: &StoreBenchArgs,
    engine: Option<EngineKind>,
    name: &'static str,
) -> Result<EndToEnd, String> {
    let wait = if args.blocking {
        WaitMode::Blocking
    } else {
        WaitMode::BusyPoll
    };
    let pin = !args.blocking && online_cpu_count() >= 2;
    let path = args.dir.join(format!(
        "pmnet-store-bench-e2e-{}-{name}.data",
        std::process::id()
    ));
    let options = server_options(args, name, &path, wait, pin);
    let shutdown = Shutdown::new();
    let server_shutdown = shutdown.clone();
    let (started_tx, started_rx) = mpsc::channel();
    let server = std::thread::Builder::new()
        .name("pmnet-server".into())
        .spawn(move || run_server(options, engine, server_shutdown, started_tx))
        .map_err(|error| format!("cannot start the server thread: {error}"))?;
    let result = drive_server(args, &server, &started_rx, wait, pin);
    shutdown.request();
    let report = server.join().unwrap_or_default();
    let _ = std::fs::remove_file(pmnet_runtime::forward_log_path(&path));
    let _ = std::fs::remove_file(&path);
    let Driven {
        medium,
        latency_us,
        throughput,
        server_cpu_us,
    } = result?;
    let in_place = report
        .split("; ")
        .find(|part| part.contains("store keys"))
        .unwrap_or("")
        .to_owned();
    Ok(EndToEnd {
        engine: name,
        medium,
        latency_us,
        throughput,
        server_cpu_us,
        in_place,
    })
}

/// The server of engine `name` (the ideal handler: no store) on a loopback port, its store in
/// a new file at `path`; pinned to CPU 1 when `pin`.
fn server_options(
    args: &StoreBenchArgs,
    name: &str,
    path: &std::path::Path,
    wait: WaitMode,
    pin: bool,
) -> ServerOptions {
    ServerOptions {
        server_id: 1,
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        devices: Vec::new(),
        replicas: Vec::new(),
        store: (name != "ideal").then(|| StoreOptions {
            path: path.to_owned(),
            size_bytes: 256 << 20,
            max_sessions: 1024,
            format: true,
            mmap: MmapOptions {
                flush: args.flush,
                added_latency_ns: 0,
            },
        }),
        gap_fill_after: None,
        loop_options: LoopOptions {
            wait,
            cpu: pin.then_some(1),
            report_interval: None,
            metrics_listen: None,
            ..LoopOptions::default()
        },
        keys: None,
        max_ops_per_s: None,
    }
}

/// What a server thread says when it started: its address and medium, or why it did not.
type Started = Result<(SocketAddr, String), String>;

/// The server thread: open it, say so, run it until shutdown; returns its report line (or
/// its error).
fn run_server(
    options: ServerOptions,
    engine: Option<EngineKind>,
    shutdown: Shutdown,
    started: mpsc::Sender<Started>,
) -> String {
    // The server's own report lines would interleave with the table.
    let quiet = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_writer(std::io::stderr)
        .finish();
    let _guard = tracing::subscriber::set_default(quiet);
    let mut server = match ServerRuntime::open_with_engine(options, engine, shutdown) {
        Ok(server) => server,
        Err(error) => {
            let _ = started.send(Err(error.to_string()));
            return String::new();
        }
    };
    let _ = started.send(Ok((
        server.addresses().data,
        server.startup().medium_text(),
    )));
    if let Err(error) = server.run() {
        return format!("server error: {error}");
    }
    server.report_line()
}

/// What the client measured of one engine.
struct Driven {
    medium: String,
    latency_us: Vec<f64>,
    throughput: f64,
    server_cpu_us: Option<f64>,
}

/// Once the server is up: a client session warms the store up, then measures the latency of
/// sequential updates and the throughput of pipelined ones.
fn drive_server(
    args: &StoreBenchArgs,
    server: &JoinHandle<String>,
    started: &mpsc::Receiver<Started>,
    wait: WaitMode,
    pin: bool,
) -> Result<Driven, String> {
    let (addr, medium) = started
        .recv_timeout(Duration::from_secs(10))
        .map_err(|_| "the server did not start in time".to_owned())??;
    if pin {
        pin_current_thread(0)?;
    }
    let mut options = SessionOptions::new(1, addr);
    options.peer_role = SessionOptions::SERVER_PEER;
    options.wait = wait;
    options.window = Some(args.window.max(1));
    let mut session =
        ClientSession::open(options).map_err(|error| format!("client socket: {error}"))?;
    let mut updates = Updates::new(args);
    // Warm up: every key once.
    for _ in 0..updates.key_count.min(4000) {
        session
            .update(&updates.next_request())
            .map_err(|error| format!("update failed: {error:?}"))?;
    }
    let latency_us = measure_latency(&mut session, &mut updates, args.latency_requests)?;
    let (throughput, server_cpu_us) =
        measure_throughput(&mut session, &mut updates, server, args.seconds)?;
    // Let the requests in flight finish before stopping the server.
    while session.in_flight_count() > 0 {
        if session
            .next_event(Some(Instant::now() + Duration::from_secs(1)))
            .is_none()
        {
            break;
        }
    }
    Ok(Driven {
        medium,
        latency_us,
        throughput,
        server_cpu_us,
    })
}

/// SETs of the benchmark's value to keys drawn by a xorshift generator.
struct Updates {
    value: Vec<u8>,
    key_count: u64,
    state: u64,
}

impl Updates {
    fn new(args: &StoreBenchArgs) -> Updates {
        Updates {
            value: vec![0x5Au8; args.value],
            key_count: args.keys.max(1) as u64,
            state: 0x2545_F491_4F6C_DD1Du64,
        }
    }

    fn next_request(&mut self) -> Vec<u8> {
        self.state ^= self.state << 13;
        self.state ^= self.state >> 7;
        self.state ^= self.state << 17;
        let key = format!("user{:08}", self.state % self.key_count).into_bytes();
        Request::Set {
            key: &key,
            value: &self.value,
        }
        .to_bytes()
    }
}

/// `requests` updates one at a time; returns their latencies in µs, sorted.
fn measure_latency(
    session: &mut ClientSession,
    updates: &mut Updates,
    requests: usize,
) -> Result<Vec<f64>, String> {
    let mut latency_us = Vec::with_capacity(requests);
    for _ in 0..requests {
        let request = updates.next_request();
        let start = Instant::now();
        session
            .update(&request)
            .map_err(|error| format!("update failed: {error:?}"))?;
        latency_us.push(start.elapsed().as_secs_f64() * 1e6);
    }
    latency_us.sort_by(f64::total_cmp);
    Ok(latency_us)
}

/// Pipelined updates, the window kept full, for `seconds`; returns the updates per second and
/// the server thread's CPU time per update in µs (`None` if its clock cannot be read).
fn measure_throughput(
    session: &mut ClientSession,
    updates: &mut Updates,
    server: &JoinHandle<String>,
    seconds: f64,
) -> Result<(f64, Option<f64>), String> {
    let server_clock = thread_cpu_clock(server);
    let server_cpu_start = server_clock.and_then(thread_cpu_ns);
    let deadline = Instant::now() + Duration::from_secs_f64(seconds.max(0.1));
    let start = Instant::now();
    let mut completed = 0u64;
    while Instant::now() < deadline {
        // Refill the window and send the new requests together: one system call for a
        // batch keeps the client from being what limits the server.
        while session.can_send() {
            session
                .queue_update(&updates.next_request())
                .map_err(|error| format!("update failed: {error:?}"))?;
        }
        match session.next_event(Some(deadline)) {
            Some(ClientEvent::Completed { .. }) => completed += 1,
            Some(ClientEvent::Failed { error, .. }) => {
                return Err(format!("update failed: {error:?}"));
            }
            None => {}
        }
    }
    let throughput = completed as f64 / start.elapsed().as_secs_f64();
    let server_cpu_us = match (server_cpu_start, server_clock.and_then(thread_cpu_ns)) {
        (Some(before), Some(after)) if completed > 0 => {
            Some(after.saturating_sub(before) as f64 / 1000.0 / completed as f64)
        }
        _ => None,
    };
    Ok((throughput, server_cpu_us))
}

/// The engines behind the server, in the order they run and are shown. The ideal handler
/// (replies OK, keeps nothing) is the ceiling any engine can reach here.
const ENGINES: [(Option<EngineKind>, &str); 4] = [
    (Some(EngineKind::Conventional), "conventional"),
    (Some(EngineKind::Packet), "packet"),
    (None, "kv"),
    (None, "ideal"),
];

pub fn run(args: StoreBenchArgs) -> Result<ExitCode, CliError> {
    println!("pmnet store-bench: the storage engines side by side (docs/storage.md)\n");
    breakdown(&args)?;
    if args.no_server {
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "\nUpdates through a server (loopback UDP, client -> server directly, {}-byte values, \
         {} keys; {}{}):",
        args.value,
        args.keys,
        if args.blocking {
            "blocking waits"
        } else {
            "busy-poll"
        },
        if !args.blocking && online_cpu_count() >= 2 {
            ", server pinned to CPU 1, client to CPU 0"
        } else {
            ", not pinned"
        }
    );
    let runs = server_rounds(&args)?;
    print_engines(&runs);
    print_targets(&args, &runs);
    Ok(ExitCode::SUCCESS)
}

/// The per-write breakdown, run `--breakdown-runs` times: the median run's table, the spread
/// of the share removed, and the target.
fn breakdown(args: &StoreBenchArgs) -> Result<(), CliError> {
    let options = BreakdownOptions {
        dir: args.dir.clone(),
        mmap: MmapOptions {
            flush: args.flush,
            added_latency_ns: 0,
        },
        value_lens: args.sizes.clone(),
        writes: args.writes.max(1),
        key_count: args.keys.max(1),
        ..BreakdownOptions::default()
    };
    let runs = args.breakdown_runs.max(1);
    // The size the target is judged on, else the first one measured.
    let judged = if args.sizes.contains(&1024) {
        1024
    } else {
        args.sizes.first().copied().unwrap_or(1024)
    };
    let mut reports = Vec::with_capacity(runs);
    for run in 0..runs {
        if runs > 1 {
            eprint!("\rbreakdown run {}/{runs}", run + 1);
        }
        let report = run_breakdown(&options)?;
        let removed = report.removed_fraction(judged).unwrap_or(0.0);
        reports.push((removed, report));
    }
    if runs > 1 {
        eprintln!();
    }
    reports.sort_by(|a, b| a.0.total_cmp(&b.0));
    let shares: Vec<f64> = reports.iter().map(|(removed, _)| removed * 100.0).collect();
    let (removed, report) = &reports[reports.len() / 2];
    println!("{}", report.table());
    if runs > 1 {
        println!(
            "{judged}-byte share removed over {runs} breakdown runs: {:.1}–{:.1} %, median {:.1} % \
             (the table above is the median run)",
            shares.first().copied().unwrap_or(0.0),
            shares.last().copied().unwrap_or(0.0),
            removed * 100.0
        );
    }
    if judged == 1024 && report.removed_fraction(1024).is_some() {
        println!(
            "target: the packet store removes >= 80 % of the conventional engine's checksum + \
             copy + allocation/insertion time per 1 KB write: {:.1} % ({}{})",
            removed * 100.0,
            if *removed >= 0.8 { "met" } else { "NOT met" },
            if runs > 1 { ", median of the runs" } else { "" }
        );
    }
    Ok(())
}

/// `--rounds` rounds, each running every engine in turn; a line on stderr per round.
fn server_rounds(args: &StoreBenchArgs) -> Result<Vec<Vec<EndToEnd>>, CliError> {
    let rounds = args.rounds.max(1);
    let mut runs: Vec<Vec<EndToEnd>> = Vec::new();
    for round in 0..rounds {
        let mut round_runs = Vec::new();
        for (engine, name) in ENGINES {
            round_runs.push(run_server_engine(args, engine, name)?);
        }
        eprintln!(
            "  round {}/{rounds}: {}",
            round + 1,
            round_runs
                .iter()
                .map(|r| format!("{} {:.0}/s", r.engine, r.throughput))
                .collect::<Vec<_>>()
                .join(", ")
        );
        runs.push(round_runs);
    }
    Ok(runs)
}

/// The medium, and a line per engine: latency over every round, median throughput and server
/// CPU time, and the store's counters of the last round.
fn print_engines(runs: &[Vec<EndToEnd>]) {
    if let Some(first) = runs.first().and_then(|round| round.first()) {
        println!("medium: {}", first.medium);
    }
    println!(
        "  {:<13} {:>9} {:>9} {:>9} {:>16} {:>16}   server's store counters (last round)",
        "engine", "p50 µs", "p99 µs", "mean µs", "updates/s (med)", "server CPU µs/upd"
    );
    for (index, (_, name)) in ENGINES.iter().enumerate() {
        let mut latency: Vec<f64> = runs
            .iter()
            .flat_map(|round| round[index].latency_us.iter().copied())
            .collect();
        latency.sort_by(f64::total_cmp);
        let mean = latency.iter().sum::<f64>() / latency.len().max(1) as f64;
        let throughput =
            median(runs.iter().map(|round| round[index].throughput).collect()).unwrap_or(0.0);
        let counters = runs
            .last()
            .map_or(String::new(), |round| round[index].in_place.clone());
        let cpu = server_cpu_median(runs, index)
            .map_or_else(|| "-".to_owned(), |cpu| format!("{cpu:.2}"));
        println!(
            "  {:<13} {:>9.1} {:>9.1} {:>9.1} {:>16.0} {:>16}   {}",
            name,
            percentile(&latency, 0.5),
            percentile(&latency, 0.99),
            mean,
            throughput,
            cpu,
            counters
        );
    }
}

/// The throughput target (packet store against the conventional engine), the ideal handler's
/// ceiling, and the server CPU time per update of the two.
fn print_targets(args: &StoreBenchArgs, runs: &[Vec<EndToEnd>]) {
    let rounds = runs.len();
    // Engine `index`'s throughput over the conventional engine's, median over the rounds.
    let ratio_to = |index: usize| {
        median(
            runs.iter()
                .map(|round| round[index].throughput / round[0].throughput.max(1.0))
                .collect(),
        )
        .unwrap_or(0.0)
    };
    let ratio = ratio_to(1);
    println!(
        "target: packet store update throughput >= 1.3x the conventional engine's: {ratio:.2}x \
         (median of {rounds} rounds; {}); window {}, {} s per engine per round",
        if ratio >= 1.3 { "met" } else { "NOT met" },
        args.window,
        args.seconds
    );
    // The ideal handler stores nothing: no engine behind this server can beat it, so its ratio
    // to the conventional engine bounds what any engine could show here.
    let ceiling = ratio_to(3);
    let gained = if ceiling > 1.0 {
        format!(
            "; the packet store has {:.0} % of the gain any engine could have",
            100.0 * (ratio - 1.0) / (ceiling - 1.0)
        )
    } else {
        String::new()
    };
    println!(
        "ceiling: the ideal handler (stores nothing) serves {ceiling:.2}x the conventional \
         engine's updates in the same rounds{gained}"
    );
    // The client shares the machine and, on loopback, pays for delivering each datagram: the
    // throughput above can be the client's limit as much as the server's. The server thread's
    // CPU time per update is its own cost, whatever limited the run.
    if let (Some(conventional), Some(packet)) =
        (server_cpu_median(runs, 0), server_cpu_median(runs, 1))
    {
        println!(
            "server CPU per update: conventional {conventional:.2} µs, packet {packet:.2} µs: \
             the packet store's server would serve {:.2}x the updates per CPU second{}",
            conventional / packet.max(f64::MIN_POSITIVE),
            if args.blocking {
                ""
            } else {
                " (busy-poll: idle spinning counts as CPU time too; --blocking measures the \
                 work alone)"
            }
        );
    }
}

/// The median over the rounds of engine `index`'s server CPU time per update.
fn server_cpu_median(runs: &[Vec<EndToEnd>], index: usize) -> Option<f64> {
    median(
        runs.iter()
            .filter_map(|round| round[index].server_cpu_us)
            .collect(),
    )
}

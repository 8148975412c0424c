//! `pmnet store-bench`: the storage engines side by side in one run — the per-write breakdown
//! in the layout of Table 1 of "Packets as Persistent In-Memory Data Structures", then update
//! latency and throughput through a real server (loopback UDP, a client session talking to
//! the server directly) with each engine. See docs/storage.md.
//!
//! With `--xdp` the servers run in a network namespace of their own and the client in
//! another, joined by a veth pair, and the packet store also runs behind the AF_XDP receive
//! path (`pmnet server --xdp`): its frames land in the store's slots (docs/inpath.md, "The
//! packet store on AF_XDP").

use std::net::{Ipv4Addr, SocketAddr};
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
    online_cpu_count, pin_current_thread, AttachMode, ClientSession, LoopOptions, ServerOptions,
    ServerRuntime, ServerXdpOptions, SessionOptions, Shutdown, StoreOptions, WaitMode,
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

    /// Run the servers in a network namespace and the client in another, joined by a veth
    /// pair, and add the packet store behind the AF_XDP receive path (`pmnet server --xdp`):
    /// the packet store over AF_XDP against the conventional engine over the UDP socket, in the
    /// same rounds (needs root).
    #[arg(long)]
    pub xdp: bool,

    /// With --xdp: attach the XDP program natively (the default) or in generic mode.
    #[arg(long = "xdp-mode", value_name = "MODE", default_value = "native", requires = "xdp",
          value_parser = ["native", "generic"])]
    pub xdp_mode: String,

    /// Run only these servers of the end-to-end table (by their names in it, comma-separated;
    /// e.g. `--only packet+af_xdp` to profile one). The targets need all of them.
    #[arg(long, value_name = "NAMES", value_delimiter = ',')]
    pub only: Vec<String>,
}

/// How one server of the runs receives, and where it runs.
#[derive(Debug, Clone, Copy)]
struct Setup {
    engine: Option<EngineKind>,
    /// What the table calls it.
    name: &'static str,
    /// Behind the AF_XDP receive path.
    xdp: bool,
}

/// The servers of the loopback runs, in the order they run and are shown. The ideal handler
/// (replies OK, keeps nothing) is the ceiling any engine can reach here.
const LOOPBACK: [Setup; 4] = [
    Setup {
        engine: Some(EngineKind::Conventional),
        name: "conventional",
        xdp: false,
    },
    Setup {
        engine: Some(EngineKind::Packet),
        name: "packet",
        xdp: false,
    },
    Setup {
        engine: None,
        name: "kv",
        xdp: false,
    },
    Setup {
        engine: None,
        name: "ideal",
        xdp: false,
    },
];

/// The servers of the `--xdp` runs: the conventional engine and the packet store behind the UDP
/// socket, the packet store behind AF_XDP, and the ideal handler behind the UDP socket.
const NAMESPACES: [Setup; 4] = [
    Setup {
        engine: Some(EngineKind::Conventional),
        name: "conventional",
        xdp: false,
    },
    Setup {
        engine: Some(EngineKind::Packet),
        name: "packet",
        xdp: false,
    },
    Setup {
        engine: Some(EngineKind::Packet),
        name: "packet+af_xdp",
        xdp: true,
    },
    Setup {
        engine: None,
        name: "ideal",
        xdp: false,
    },
];

/// Two network namespaces joined by a veth pair, removed when dropped: the server's (its end
/// `sv`, 10.78.0.2/24) and the client's (`cl`, 10.78.0.1/24).
struct NetPair {
    server_ns: String,
    client_ns: String,
}

const NET_SERVER_IF: &str = "sv";
const NET_SERVER_IP: Ipv4Addr = Ipv4Addr::new(10, 78, 0, 2);
const NET_CLIENT_IP: Ipv4Addr = Ipv4Addr::new(10, 78, 0, 1);

impl NetPair {
    fn up() -> Result<NetPair, String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("--xdp makes network namespaces and attaches XDP: run as root".into());
        }
        remove_stale_pairs();
        let pid = std::process::id();
        let pair = NetPair {
            server_ns: format!("pmnet-sb-{pid}-s"),
            client_ns: format!("pmnet-sb-{pid}-c"),
        };
        let (s, c) = (pair.server_ns.as_str(), pair.client_ns.as_str());
        let server_cidr = format!("{NET_SERVER_IP}/24");
        let client_cidr = format!("{NET_CLIENT_IP}/24");
        for command in [
            vec!["netns", "add", s],
            vec!["netns", "add", c],
            vec![
                "-n",
                s,
                "link",
                "add",
                NET_SERVER_IF,
                "type",
                "veth",
                "peer",
                "name",
                "cl",
                "netns",
                c,
            ],
            vec!["-n", s, "addr", "add", &server_cidr, "dev", NET_SERVER_IF],
            vec!["-n", c, "addr", "add", &client_cidr, "dev", "cl"],
            vec!["-n", s, "link", "set", "lo", "up"],
            vec!["-n", c, "link", "set", "lo", "up"],
            vec!["-n", s, "link", "set", NET_SERVER_IF, "up"],
            vec!["-n", c, "link", "set", "cl", "up"],
        ] {
            ip(&command)?;
        }
        Ok(pair)
    }
}

/// Remove the namespaces of earlier runs whose process is gone (killed before its `Drop`).
fn remove_stale_pairs() {
    let Ok(entries) = std::fs::read_dir("/var/run/netns") else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix("pmnet-sb-")
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = ip(&["netns", "del", &name]);
        }
    }
}

impl Drop for NetPair {
    fn drop(&mut self) {
        // Deleting a namespace deletes the veth end in it, and so the pair.
        for ns in [&self.server_ns, &self.client_ns] {
            let _ = ip(&["netns", "del", ns]);
        }
    }
}

/// Run `ip ARGS`; its error output on failure.
fn ip(args: &[&str]) -> Result<(), String> {
    let output = std::process::Command::new("ip")
        .args(args)
        .output()
        .map_err(|error| format!("cannot run `ip` (iproute2): {error}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

/// Move the calling thread into network namespace `ns` (sockets it opens afterwards belong to
/// it).
fn enter_netns(ns: &str) -> Result<(), String> {
    use std::os::fd::AsRawFd;
    let path = format!("/var/run/netns/{ns}");
    let file = std::fs::File::open(&path).map_err(|error| format!("{path}: {error}"))?;
    // SAFETY: setns with a descriptor we own for the call; it moves only this thread.
    if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(format!("setns {path}: {}", std::io::Error::last_os_error()));
    }
    Ok(())
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
    /// The client thread's CPU time per update in the throughput run (µs).
    client_cpu_us: Option<f64>,
    /// How busy each CPU was during the throughput run, and in softirq (`/proc/stat`).
    cpus: Vec<CpuShare>,
    in_place: String,
}

/// One CPU's time during a run, as fractions of the wall time.
#[derive(Debug, Clone, Copy, Default)]
struct CpuShare {
    /// user + nice + system + irq + softirq + steal (everything but idle and iowait).
    busy: f64,
    softirq: f64,
}

/// Each CPU's jiffies from `/proc/stat`: (busy, softirq, total).
fn cpu_jiffies() -> Vec<(u64, u64, u64)> {
    let Ok(text) = std::fs::read_to_string("/proc/stat") else {
        return Vec::new();
    };
    text.lines()
        .filter(|line| {
            line.starts_with("cpu") && line.as_bytes().get(3).is_some_and(u8::is_ascii_digit)
        })
        .map(|line| {
            let fields: Vec<u64> = line
                .split_whitespace()
                .skip(1)
                .map(|field| field.parse().unwrap_or(0))
                .collect();
            let at = |index: usize| fields.get(index).copied().unwrap_or(0);
            // user nice system idle iowait irq softirq steal
            let busy = at(0) + at(1) + at(2) + at(5) + at(6) + at(7);
            let total = busy + at(3) + at(4);
            (busy, at(6), total)
        })
        .collect()
}

fn cpu_shares(before: &[(u64, u64, u64)], after: &[(u64, u64, u64)]) -> Vec<CpuShare> {
    before
        .iter()
        .zip(after)
        .map(|(b, a)| {
            let total = a.2.saturating_sub(b.2).max(1) as f64;
            CpuShare {
                busy: a.0.saturating_sub(b.0) as f64 / total,
                softirq: a.1.saturating_sub(b.1) as f64 / total,
            }
        })
        .collect()
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

/// One engine behind a server (on loopback, or in `net`'s server namespace): latency of
/// sequential updates, then throughput of pipelined ones, and the server thread's CPU time per
/// update.
fn run_server_engine(
    args: &StoreBenchArgs,
    setup: Setup,
    net: Option<&NetPair>,
) -> Result<EndToEnd, String> {
    let Setup { engine, name, xdp } = setup;
    let wait = if args.blocking {
        WaitMode::Blocking
    } else {
        WaitMode::BusyPoll
    };
    let pin = !args.blocking && online_cpu_count() >= 2;
    let path = args.dir.join(format!(
        "pmnet-store-bench-e2e-{}-{}.data",
        std::process::id(),
        name.replace('+', "-")
    ));
    let mut options = server_options(args, name, &path, wait, pin);
    let server_ns = net.map(|net| net.server_ns.clone());
    if net.is_some() {
        options.listen = SocketAddr::from((NET_SERVER_IP, 0));
    }
    let xdp = xdp.then(|| {
        let mode = if args.xdp_mode == "generic" {
            AttachMode::Generic
        } else {
            AttachMode::Native
        };
        ServerXdpOptions::new(NET_SERVER_IF, mode)
    });
    let shutdown = Shutdown::new();
    let server_shutdown = shutdown.clone();
    let (started_tx, started_rx) = mpsc::channel();
    let server = std::thread::Builder::new()
        .name("pmnet-server".into())
        .spawn(move || {
            if let Some(ns) = server_ns {
                if let Err(error) = enter_netns(&ns) {
                    let _ = started_tx.send(Err(error));
                    return String::new();
                }
            }
            run_server(options, engine, xdp, server_shutdown, started_tx)
        })
        .map_err(|error| format!("cannot start the server thread: {error}"))?;
    let result = match net {
        None => drive_server(args, &server, &started_rx, wait, pin),
        // The client in its namespace, on a thread of its own.
        Some(net) => std::thread::scope(|scope| {
            let server = &server;
            let client = std::thread::Builder::new()
                .name("pmnet-client".into())
                .spawn_scoped(scope, move || {
                    enter_netns(&net.client_ns)?;
                    drive_server(args, server, &started_rx, wait, pin)
                })
                .map_err(|error| format!("cannot start the client thread: {error}"))?;
            client
                .join()
                .unwrap_or_else(|_| Err("the client thread panicked".into()))
        }),
    };
    shutdown.request();
    let report = server.join().unwrap_or_default();
    let _ = std::fs::remove_file(pmnet_runtime::forward_log_path(&path));
    let _ = std::fs::remove_file(&path);
    let Driven {
        medium,
        latency_us,
        throughput,
        server_cpu_us,
        client_cpu_us,
        cpus,
    } = result?;
    let in_place = report
        .split("; ")
        .filter(|part| part.contains("store keys") || part.starts_with("AF_XDP"))
        .collect::<Vec<_>>()
        .join("; ");
    Ok(EndToEnd {
        engine: name,
        medium,
        latency_us,
        throughput,
        server_cpu_us,
        client_cpu_us,
        cpus,
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
    xdp: Option<ServerXdpOptions>,
    shutdown: Shutdown,
    started: mpsc::Sender<Started>,
) -> String {
    // The server's own report lines would interleave with the table.
    let quiet = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_writer(std::io::stderr)
        .finish();
    let _guard = tracing::subscriber::set_default(quiet);
    let mut server = match ServerRuntime::open_with_xdp(options, engine, xdp, shutdown) {
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
    client_cpu_us: Option<f64>,
    cpus: Vec<CpuShare>,
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
    let Measured {
        throughput,
        server_cpu_us,
        client_cpu_us,
        cpus,
    } = measure_throughput(&mut session, &mut updates, server, args.seconds)?;
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
        client_cpu_us,
        cpus,
    })
}

/// What the throughput run measured.
struct Measured {
    throughput: f64,
    server_cpu_us: Option<f64>,
    client_cpu_us: Option<f64>,
    cpus: Vec<CpuShare>,
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

/// Pipelined updates, the window kept full, for `seconds`: the updates per second, the server
/// thread's and this (the client's) thread's CPU time per update in µs (`None` if a clock cannot
/// be read), and how busy each CPU was.
fn measure_throughput(
    session: &mut ClientSession,
    updates: &mut Updates,
    server: &JoinHandle<String>,
    seconds: f64,
) -> Result<Measured, String> {
    let server_clock = thread_cpu_clock(server);
    let server_cpu_start = server_clock.and_then(thread_cpu_ns);
    let client_cpu_start = thread_cpu_ns(libc::CLOCK_THREAD_CPUTIME_ID);
    let jiffies_start = cpu_jiffies();
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
    let per_update = |before: Option<u64>, after: Option<u64>| match (before, after) {
        (Some(before), Some(after)) if completed > 0 => {
            Some(after.saturating_sub(before) as f64 / 1000.0 / completed as f64)
        }
        _ => None,
    };
    Ok(Measured {
        throughput,
        server_cpu_us: per_update(server_cpu_start, server_clock.and_then(thread_cpu_ns)),
        client_cpu_us: per_update(
            client_cpu_start,
            thread_cpu_ns(libc::CLOCK_THREAD_CPUTIME_ID),
        ),
        cpus: cpu_shares(&jiffies_start, &cpu_jiffies()),
    })
}

pub fn run(args: StoreBenchArgs) -> Result<ExitCode, CliError> {
    println!("pmnet store-bench: the storage engines side by side (docs/storage.md)\n");
    breakdown(&args)?;
    if args.no_server {
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "\nUpdates through a server ({}, client -> server directly, {}-byte values, {} keys; \
         {}{}):",
        if args.xdp {
            "server and client in network namespaces joined by a veth pair"
        } else {
            "loopback UDP"
        },
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
    let all: &[Setup] = if args.xdp { &NAMESPACES } else { &LOOPBACK };
    let setups: Vec<Setup> = all
        .iter()
        .filter(|setup| args.only.is_empty() || args.only.iter().any(|name| name == setup.name))
        .copied()
        .collect();
    if setups.is_empty() {
        let names: Vec<&str> = all.iter().map(|setup| setup.name).collect();
        return Err(format!("--only: none of {:?} is among {names:?}", args.only).into());
    }
    let runs = server_rounds(&args, &setups)?;
    print_engines(&setups, &runs);
    if setups.len() < all.len() {
        // The targets compare the whole table.
    } else if args.xdp {
        print_xdp_targets(&args, &runs);
    } else {
        print_targets(&args, &runs);
    }
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

/// `--rounds` rounds, each running every setup in turn; a line on stderr per round.
fn server_rounds(args: &StoreBenchArgs, setups: &[Setup]) -> Result<Vec<Vec<EndToEnd>>, CliError> {
    let rounds = args.rounds.max(1);
    let net = if args.xdp { Some(NetPair::up()?) } else { None };
    let mut runs: Vec<Vec<EndToEnd>> = Vec::new();
    for round in 0..rounds {
        let mut round_runs = Vec::new();
        for setup in setups {
            round_runs.push(run_server_engine(args, *setup, net.as_ref())?);
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
fn print_engines(setups: &[Setup], runs: &[Vec<EndToEnd>]) {
    if let Some(first) = runs.first().and_then(|round| round.first()) {
        println!("medium: {}", first.medium);
    }
    println!(
        "  {:<13} {:>9} {:>9} {:>9} {:>16} {:>16}   server's store counters (last round)",
        "engine", "p50 µs", "p99 µs", "mean µs", "updates/s (med)", "server CPU µs/upd"
    );
    for (index, Setup { name, .. }) in setups.iter().enumerate() {
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

/// `--xdp`: the packet store behind AF_XDP against the conventional engine behind the UDP
/// socket (the target), the packet store behind the UDP socket (what the engine alone gains),
/// the ideal handler's ceiling behind the UDP socket, and the server CPU per update.
fn print_xdp_targets(args: &StoreBenchArgs, runs: &[Vec<EndToEnd>]) {
    let rounds = runs.len();
    let ratio_to = |index: usize| {
        median(
            runs.iter()
                .map(|round| round[index].throughput / round[0].throughput.max(1.0))
                .collect(),
        )
        .unwrap_or(0.0)
    };
    let (packet_udp, packet_xdp, ideal) = (ratio_to(1), ratio_to(2), ratio_to(3));
    println!(
        "target: packet store over AF_XDP >= 1.3x the conventional engine over the UDP socket: \
         {packet_xdp:.2}x (median of {rounds} rounds; {}); window {}, {} s per server per round",
        if packet_xdp >= 1.3 { "met" } else { "NOT met" },
        args.window,
        args.seconds
    );
    println!(
        "  packet store over the UDP socket: {packet_udp:.2}x; the ideal handler (stores \
         nothing) over the UDP socket: {ideal:.2}x"
    );
    println!("where the time goes (medians over the rounds, throughput runs):");
    for (index, setup) in NAMESPACES.iter().enumerate() {
        let client = median(
            runs.iter()
                .filter_map(|round| round[index].client_cpu_us)
                .collect(),
        );
        let cpus = runs.first().map_or(0, |round| round[index].cpus.len());
        let shares: Vec<String> = (0..cpus)
            .map(|cpu| {
                let share = |pick: fn(&CpuShare) -> f64| {
                    median(
                        runs.iter()
                            .filter_map(|round| round[index].cpus.get(cpu).map(pick))
                            .collect(),
                    )
                    .unwrap_or(0.0)
                        * 100.0
                };
                format!(
                    "CPU {cpu} {:.0} % busy ({:.0} % softirq)",
                    share(|s| s.busy),
                    share(|s| s.softirq)
                )
            })
            .collect();
        println!(
            "  {:<13} server thread {} µs/upd, client thread {} µs/upd; {}",
            setup.name,
            server_cpu_median(runs, index).map_or("-".into(), |v| format!("{v:.2}")),
            client.map_or("-".into(), |v| format!("{v:.2}")),
            shares.join(", ")
        );
    }
    let cpu: Vec<Option<f64>> = (0..4).map(|index| server_cpu_median(runs, index)).collect();
    if let [Some(conventional), Some(packet), Some(xdp), Some(ideal)] = cpu[..] {
        println!(
            "server CPU per update: conventional/UDP {conventional:.2} µs, packet/UDP \
             {packet:.2} µs, packet/AF_XDP {xdp:.2} µs, ideal/UDP {ideal:.2} µs{}",
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

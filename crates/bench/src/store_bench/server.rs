//! One engine behind a server thread, driven by a client session: the latency of sequential
//! updates, the throughput of pipelined ones, and the CPU time they took.

use std::net::SocketAddr;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use pmnet_pktstore::EngineKind;
use pmnet_pm::MmapOptions;
use pmnet_proto::ClientEvent;
use pmnet_runtime::{
    online_cpu_count, pin_current_thread, AttachMode, ClientSession, LoopOptions, ServerOptions,
    ServerRuntime, ServerXdpOptions, SessionOptions, Shutdown, StoreOptions, WaitMode,
};
use pmnet_store::Request;

use super::args::{Setup, StoreBenchArgs};
use super::net::{enter_netns, NetPair, NET_SERVER_IF, NET_SERVER_IP};

#[derive(Debug)]
pub(super) struct EndToEnd {
    pub(super) engine: &'static str,
    pub(super) medium: String,
    pub(super) latency_us: Vec<f64>,
    pub(super) throughput: f64,
    /// CPU time the server's thread spent per update in the throughput run (µs); `None`
    /// where the thread's CPU clock cannot be read.
    pub(super) server_cpu_us: Option<f64>,
    /// The client thread's CPU time per update in the throughput run (µs).
    pub(super) client_cpu_us: Option<f64>,
    /// How busy each CPU was during the throughput run, and in softirq (`/proc/stat`).
    pub(super) cpus: Vec<CpuShare>,
    pub(super) in_place: String,
}

/// One CPU's time during a run, as fractions of the wall time.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct CpuShare {
    /// user + nice + system + irq + softirq + steal (everything but idle and iowait).
    pub(super) busy: f64,
    pub(super) softirq: f64,
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

/// One engine behind a server (on loopback, or in `net`'s server namespace): latency of
/// sequential updates, then throughput of pipelined ones, and the server thread's CPU time per
/// update.
pub(super) fn run_server_engine(
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
            growth: Default::default(),
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
        follow: None,
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

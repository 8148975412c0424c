//! `pmnet bench`: a closed-loop load generator that compares, side by side in one run and
//! under one setting, what a client waits for:
//!
//! - `echo`: a UDP echo off the device's loop (the floor for any acknowledgement);
//! - `baseline`: the server's reply, the client talking to the server directly;
//! - `forward`: the server's reply through the device with logging off (a plain switch);
//! - `pmnet`: the device's PMNet-ACK, sent once the update is durable in its log.
//!
//! It starts its own device and server on loopback (threads of this process, files under
//! /dev/shm, removed at the end; a fresh pair for every mode, so every mode starts from an
//! empty log and store) or measures running ones given by address. `--capacity` compares
//! the forwarding capacity of the device's forward port with a plain UDP relay instead.

mod capacity;
mod report;
mod system;
mod worker;
mod workload;

use std::io::{IsTerminal, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use pmnet_pktstore::EngineKind;
use pmnet_pm::{FlushChoice, MmapOptions, ADDED_LATENCY_NS_MAX};
use pmnet_proto::Completion;
use pmnet_runtime::{online_cpu_count, ClientSession, SessionOptions, Shutdown, WaitMode};
use pmnet_store::{Reply, Request};

pub use capacity::{run_capacity, CapacityConfig};
pub use report::{
    capacity_table, ratios, ratios_table, results_table, setting_text, thousands, ModeResult,
    Report, Setting,
};
pub use system::{remove_stale_files, LoopbackConfig, LoopbackSystem};
pub use workload::{KeyDistribution, Workload};

use report::{new_histogram, summarize};
use worker::{run_client, ClientPlan, Shared};

use crate::node::EngineChoice;
use crate::CliError;

/// Slot size of the device log: any single datagram (up to 1472 bytes) plus the slot header.
const SLOT_SIZE: u32 = 2048;

/// Clients at most: each is a thread.
pub const MAX_CLIENTS: u32 = 256;

/// A benchmark mode: what the client's requests go to and what they wait for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// UDP echo off the device's loop: the floor for any ack.
    Echo,
    /// Straight to the server: the client waits for the server's reply.
    Baseline,
    /// Through the device's forward port (logging off): a plain switch.
    Forward,
    /// Through the device's PMNet port: updates complete on the PMNet-ACK.
    Pmnet,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Echo => "echo",
            Mode::Baseline => "baseline",
            Mode::Forward => "forward",
            Mode::Pmnet => "pmnet",
        }
    }

    pub fn waits_for(self) -> &'static str {
        match self {
            Mode::Echo => "a UDP echo from the device (the floor)",
            Mode::Baseline => "the server's reply, sent directly",
            Mode::Forward => "the server's reply via the device, no log",
            Mode::Pmnet => "the device's PMNet-ACK (after its log write)",
        }
    }
}

/// Where the client, device and server threads run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Pinning {
    /// With two or more CPUs: clients and device on CPU 0, server on CPU 1 (the device sits
    /// next to its clients, as a ToR switch or the client's NIC would; the server is a hop
    /// away). One CPU: no pinning.
    Auto,
    /// Leave placement to the scheduler.
    None,
}

#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// Modes to run, in order, comma-separated: echo, baseline, forward, pmnet.
    #[arg(
        long = "mode",
        value_name = "MODES",
        value_enum,
        value_delimiter = ',',
        default_value = "echo,baseline,forward,pmnet"
    )]
    pub modes: Vec<Mode>,

    /// Client sessions, one thread each.
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=MAX_CLIENTS as i64))]
    pub clients: u32,

    /// Requests each client keeps in flight (1: one at a time).
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub window: u32,

    /// Bytes of each SET's value (the request must fit one datagram).
    #[arg(long, value_name = "BYTES", default_value_t = 100, value_parser = parse_payload)]
    pub payload: usize,

    /// Fraction of requests that are updates (SET); the rest are reads (GET, bypass requests).
    #[arg(long, value_name = "FRACTION", default_value_t = 1.0, value_parser = parse_ratio)]
    pub update_ratio: f64,

    /// Keys in the key space.
    #[arg(long, value_name = "N", default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub keys: u64,

    /// How keys are drawn.
    #[arg(long, value_enum, default_value_t = KeyDistribution::Uniform)]
    pub distribution: KeyDistribution,

    /// Exponent s of the Zipf distribution (0.99 is YCSB's).
    #[arg(long, value_name = "S", default_value_t = 0.99, value_parser = parse_exponent)]
    pub zipf_exponent: f64,

    /// Seconds measured per mode (after the warm-up).
    #[arg(long, value_name = "SECONDS", default_value_t = 5.0,
          value_parser = |text: &str| parse_seconds(text, 0.1, 3600.0))]
    pub duration: f64,

    /// Measure this many requests per mode (all clients together) instead of a duration.
    #[arg(long, value_name = "N",
          value_parser = clap::value_parser!(u64).range(1..=1_000_000_000))]
    pub requests: Option<u64>,

    /// Seconds of warm-up per mode, not measured.
    #[arg(long, value_name = "SECONDS", default_value_t = 1.0,
          value_parser = |text: &str| parse_seconds(text, 0.0, 600.0))]
    pub warmup: f64,

    /// Seed of the key and request-mix streams (printed; default: random).
    #[arg(long, value_name = "N")]
    pub seed: Option<u64>,

    /// Every loop and client spins (yielding between empty polls) instead of sleeping in ppoll.
    #[arg(long)]
    pub busy_poll: bool,

    /// Thread placement (overridden per part by --client-cpu, --device-cpu, --server-cpu).
    #[arg(long, value_enum, default_value_t = Pinning::Auto)]
    pub pin: Pinning,

    /// Pin every client thread to this CPU.
    #[arg(long, value_name = "CPU")]
    pub client_cpu: Option<usize>,

    /// Pin the in-process device to this CPU.
    #[arg(long, value_name = "CPU")]
    pub device_cpu: Option<usize>,

    /// Pin the in-process server to this CPU.
    #[arg(long, value_name = "CPU")]
    pub server_cpu: Option<usize>,

    /// A running device's PMNet port (`pmnet device --listen`), for mode pmnet. Giving any
    /// address measures running processes instead of starting a device and server here.
    #[arg(long, value_name = "ADDR")]
    pub device: Option<SocketAddr>,

    /// A running device's forward port (`--forward-listen`), for mode forward.
    #[arg(long, value_name = "ADDR")]
    pub forward: Option<SocketAddr>,

    /// A running device's echo port (`--echo-listen`), for mode echo.
    #[arg(long, value_name = "ADDR")]
    pub echo: Option<SocketAddr>,

    /// A running server (`pmnet server --listen`), for mode baseline.
    #[arg(long, value_name = "ADDR")]
    pub server: Option<SocketAddr>,

    /// A running device's metrics endpoint (its `--metrics`): read once, for the report's
    /// medium (otherwise the report says the medium is unknown).
    #[arg(long, value_name = "ADDR")]
    pub device_metrics: Option<SocketAddr>,

    /// A running server's metrics endpoint (its `--metrics`), for the report's store medium.
    #[arg(long, value_name = "ADDR")]
    pub server_metrics: Option<SocketAddr>,

    /// The server's id (its `--server-id`; the device's `--server ID=...`).
    #[arg(long, value_name = "ID", default_value_t = 1)]
    pub server_id: u16,

    /// In-process server: the ideal handler (replies OK, stores nothing) instead of the store.
    #[arg(long)]
    pub ideal: bool,

    /// In-process server: the storage engine, as `pmnet server --engine` (packet,
    /// conventional, kv).
    #[arg(long, value_name = "ENGINE", value_enum, default_value_t = EngineChoice::Packet)]
    pub engine: EngineChoice,

    /// In-process device log and store: how writes are made durable (auto, clwb, clflushopt,
    /// clflush, msync, fdatasync).
    #[arg(long, value_name = "METHOD", default_value = "auto", value_parser = parse_flush)]
    pub flush: FlushChoice,

    /// In-process device log and store: busy-wait this long after every persist.
    #[arg(long, value_name = "NS", default_value_t = 0,
          value_parser = clap::value_parser!(u64).range(0..=ADDED_LATENCY_NS_MAX))]
    pub persist_latency_ns: u64,

    /// Directory of the in-process log and store files (removed at the end). /dev/shm is
    /// emulated persistent memory.
    #[arg(long, value_name = "DIR", default_value = "/dev/shm")]
    pub dir: PathBuf,

    /// Slots of the in-process device log.
    #[arg(long, value_name = "N", default_value_t = 32_768,
          value_parser = clap::value_parser!(u32).range(16..=1_048_576))]
    pub slots: u32,

    /// Size of the in-process store's data file in MiB.
    #[arg(long, value_name = "MIB", default_value_t = 64,
          value_parser = clap::value_parser!(u64).range(1..=16_384))]
    pub data_mib: u64,

    /// Instead of the latency modes: forwarding capacity (packets/s) of a plain UDP relay and
    /// of the device's forward port, one thread each, under the same offered load.
    #[arg(long)]
    pub capacity: bool,

    /// With --capacity: split --duration into this many rounds per forwarder, relay and device
    /// in turns; the median round of each is reported.
    #[arg(long, value_name = "N", default_value_t = 3,
          value_parser = clap::value_parser!(u32).range(1..=100))]
    pub rounds: u32,

    /// Also write the results, with the setting, as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,

    /// No progress line on stderr.
    #[arg(long)]
    pub no_progress: bool,
}

fn parse_flush(text: &str) -> Result<FlushChoice, String> {
    text.parse::<FlushChoice>()
        .map_err(|error| error.to_string())
}

/// Largest SET value whose request fits one datagram of the default size.
pub fn max_payload() -> usize {
    let overhead = Workload {
        keys: 1,
        distribution: KeyDistribution::Uniform,
        zipf_exponent: 1.0,
        update_ratio: 1.0,
        value_len: 0,
    }
    .set_request_len();
    pmnet_wire::DEFAULT_MAX_DATAGRAM_LEN - pmnet_wire::HEADER_LEN - overhead
}

pub fn parse_payload(text: &str) -> Result<usize, String> {
    let max = max_payload();
    let value: usize = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a number of bytes"))?;
    if value == 0 || value > max {
        return Err(format!(
            "a payload of {value} bytes is out of range: use 1 to {max} (the request must fit \
             one {}-byte datagram)",
            pmnet_wire::DEFAULT_MAX_DATAGRAM_LEN
        ));
    }
    Ok(value)
}

fn parse_ratio(text: &str) -> Result<f64, String> {
    let value: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a number"))?;
    if !(0.0..=1.0).contains(&value) {
        return Err(format!(
            "{value} is not a fraction: use 0 (reads only) to 1 (updates only), e.g. 0.5"
        ));
    }
    Ok(value)
}

fn parse_exponent(text: &str) -> Result<f64, String> {
    let value: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a number"))?;
    if !(value > 0.0 && value <= 10.0) {
        return Err(format!(
            "a Zipf exponent of {value} is out of range: use more than 0 and at most 10 (0.99 \
             is the usual skew)"
        ));
    }
    Ok(value)
}

pub fn parse_seconds(text: &str, min: f64, max: f64) -> Result<f64, String> {
    let value: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a number of seconds"))?;
    if !(value >= min && value <= max) {
        return Err(format!(
            "{value} s is out of range: use {min} to {max} seconds"
        ));
    }
    Ok(value)
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

/// The labels of the first sample of `name` in a Prometheus text, unescaped.
fn sample_labels(text: &str, name: &str) -> Option<Vec<(String, String)>> {
    let prefix = format!("{name}{{");
    let line = text.lines().find(|line| line.starts_with(&prefix))?;
    let mut labels = Vec::new();
    let mut chars = line[prefix.len()..].chars();
    loop {
        let mut key = String::new();
        for c in chars.by_ref() {
            match c {
                '=' => break,
                '}' => return Some(labels),
                ',' => {}
                c => key.push(c),
            }
        }
        if chars.next() != Some('"') {
            return None;
        }
        let mut value = String::new();
        loop {
            match chars.next()? {
                '\\' => match chars.next()? {
                    'n' => value.push('\n'),
                    c => value.push(c),
                },
                '"' => break,
                c => value.push(c),
            }
        }
        labels.push((key, value));
    }
}

/// "medium via flush; guarantee" from the `*_info` gauge of a running process's metrics.
fn medium_from_metrics(text: &str, info: &str) -> Option<String> {
    let labels = sample_labels(text, info)?;
    let get = |key: &str| {
        labels
            .iter()
            .find(|(name, _)| name == key)
            .map(|(_, value)| value.as_str())
    };
    match (get("medium")?, get("flush"), get("guarantee")) {
        ("none", _, guarantee) => Some(format!("none: {}", guarantee.unwrap_or("nothing kept"))),
        (medium, Some(flush), Some(guarantee)) => {
            Some(format!("{medium} via {flush}; {guarantee}"))
        }
        (medium, _, _) => Some(medium.to_owned()),
    }
}

/// The media of running processes, from their metrics endpoints where given.
fn external_media(targets: &ExternalTargets) -> Result<(String, String), String> {
    let read = |addr: Option<SocketAddr>, info: &str, what: &str| -> Result<String, String> {
        let Some(addr) = addr else {
            return Ok(format!(
                "unknown: an external {what} (its start-up banner says; pass --{what}-metrics \
                 ADDR to have it read here)"
            ));
        };
        let text = pmnet_runtime::metrics::scrape(addr, Duration::from_secs(5))
            .map_err(|error| format!("cannot read the {what}'s metrics at {addr}: {error}"))?;
        medium_from_metrics(&text, info).ok_or_else(|| {
            format!("the metrics at {addr} have no {info} sample: is that a pmnet {what}?")
        })
    };
    Ok((
        read(targets.device_metrics, "pmnet_device_info", "device")?,
        read(targets.server_metrics, "pmnet_server_info", "server")?,
    ))
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
    pub wait: WaitMode,
    pub client_cpu: Option<usize>,
    pub device_cpu: Option<usize>,
    pub server_cpu: Option<usize>,
    pub server_id: u16,
    pub target: Target,
    pub progress: bool,
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
        Pinning::Auto if online >= 2 && loopback => (Some(0), Some(0), Some(1)),
        _ => (None, None, None),
    };
    Ok((
        client.or(auto_client),
        device.or(auto_device),
        server.or(auto_server),
    ))
}

impl Plan {
    pub fn from_args(args: &BenchArgs) -> Result<Plan, String> {
        let external = ExternalTargets {
            device: args.device,
            forward: args.forward,
            echo: args.echo,
            server: args.server,
            device_metrics: args.device_metrics,
            server_metrics: args.server_metrics,
        };
        let is_external = external.device.is_some()
            || external.forward.is_some()
            || external.echo.is_some()
            || external.server.is_some();
        if is_external && args.capacity {
            return Err(
                "--capacity starts its own relay and device on loopback; drop the \
                        --device/--forward/--echo/--server addresses"
                    .into(),
            );
        }
        let wait = WaitMode::from_busy_poll(args.busy_poll);
        let (client_cpu, device_cpu, server_cpu) = resolve_pinning(
            args.pin,
            args.client_cpu,
            args.device_cpu,
            args.server_cpu,
            !is_external,
        )?;
        let mut modes = Vec::new();
        for mode in &args.modes {
            if !modes.contains(mode) {
                modes.push(*mode);
            }
        }
        let target = if is_external {
            for mode in &modes {
                let (present, option) = match mode {
                    Mode::Echo => (external.echo.is_some(), "--echo"),
                    Mode::Baseline => (external.server.is_some(), "--server"),
                    Mode::Forward => (external.forward.is_some(), "--forward"),
                    Mode::Pmnet => (external.device.is_some(), "--device"),
                };
                if !present {
                    return Err(format!(
                        "mode {} needs {option} ADDR when measuring running processes; give \
                         it, leave {} out of --mode, or give no addresses at all to start a \
                         device and server here",
                        mode.name(),
                        mode.name()
                    ));
                }
            }
            Target::External(external)
        } else {
            if !args.dir.is_dir() {
                return Err(format!(
                    "--dir {}: not a directory; the log and store files go there (/dev/shm is \
                     emulated persistent memory)",
                    args.dir.display()
                ));
            }
            Target::Loopback(LoopbackConfig {
                server_id: args.server_id,
                device_id: 1,
                ideal: args.ideal,
                engine: args.engine.kind(),
                mmap: MmapOptions {
                    flush: args.flush,
                    added_latency_ns: args.persist_latency_ns,
                },
                dir: args.dir.clone(),
                slots: args.slots,
                slot_size: SLOT_SIZE,
                data_bytes: args.data_mib << 20,
                max_sessions: 1024.max(args.clients * 4),
                wait,
                device_cpu,
                server_cpu,
            })
        };
        Ok(Plan {
            modes,
            workload: Workload {
                keys: args.keys,
                distribution: args.distribution,
                zipf_exponent: args.zipf_exponent,
                update_ratio: args.update_ratio,
                value_len: args.payload,
            },
            clients: args.clients,
            window: args.window,
            duration: args
                .requests
                .is_none()
                .then(|| Duration::from_secs_f64(args.duration)),
            requests: args.requests,
            warmup: Duration::from_secs_f64(args.warmup),
            seed: args.seed.unwrap_or_else(rand::random),
            wait,
            client_cpu,
            device_cpu,
            server_cpu,
            server_id: args.server_id,
            target,
            progress: !args.no_progress,
        })
    }

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

/// Every mode of `plan`, one after the other. Returns the results, the media (in-process
/// systems) and whether a signal cut the run short.
pub fn run_modes(
    plan: &Plan,
    shutdown: &Shutdown,
) -> Result<(Vec<ModeResult>, Media, bool), String> {
    let mut results = Vec::new();
    let mut media = None;
    for &mode in &plan.modes {
        if shutdown.is_requested() {
            break;
        }
        let result = match &plan.target {
            Target::Loopback(config) => {
                let system = LoopbackSystem::start(config)?;
                if media.is_none() {
                    media = Some((system.device_medium.clone(), system.server_medium.clone()));
                }
                let addresses = system.addresses;
                let peer = match mode {
                    Mode::Echo => addresses.echo,
                    Mode::Baseline => addresses.server,
                    Mode::Forward => addresses.forward,
                    Mode::Pmnet => addresses.device,
                };
                let result = run_mode(plan, mode, peer, shutdown);
                let counters = system.stop();
                result.map(|mut result| {
                    if mode != Mode::Echo {
                        result.notes.extend(counters.notes());
                    }
                    result
                })
            }
            Target::External(external) => {
                let peer = match mode {
                    Mode::Echo => external.echo,
                    Mode::Baseline => external.server,
                    Mode::Forward => external.forward,
                    Mode::Pmnet => external.device,
                }
                .ok_or_else(|| format!("no address for mode {}", mode.name()))?;
                run_mode(plan, mode, peer, shutdown)
            }
        }?;
        results.push(result);
    }
    Ok((results, media, shutdown.is_requested()))
}

/// Run one mode's clients to the end and summarise.
fn run_mode(
    plan: &Plan,
    mode: Mode,
    peer: SocketAddr,
    shutdown: &Shutdown,
) -> Result<ModeResult, String> {
    let shared = Shared::new();
    let start = Instant::now();
    let measure_from = start + plan.warmup;
    let measure_until = plan.duration.map(|duration| measure_from + duration);
    let mut handles = Vec::new();
    for index in 0..plan.clients {
        let client = ClientPlan {
            index,
            peer,
            server_id: plan.server_id,
            echo: mode == Mode::Echo,
            wait: plan.wait,
            cpu: plan.client_cpu,
            window: plan.window,
            workload: plan.workload.clone(),
            seed: plan.seed,
            measure_from,
            measure_until,
            requests: plan.requests,
        };
        let client_shared = Arc::clone(&shared);
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
    let progress = Progress::new(plan.progress, mode);
    let mut next_report = start;
    while !handles.iter().all(|handle| handle.is_finished()) {
        if shutdown.is_requested() {
            shared.stop.store(true, Ordering::Relaxed);
        }
        let now = Instant::now();
        if now >= next_report {
            progress.update(plan, &shared, start, measure_from, now);
            next_report = now + Duration::from_millis(500);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    progress.finish();
    let stopped = Instant::now();
    let mut updates = new_histogram();
    let mut bypass = new_histogram();
    let mut result = ModeResult::from_summary(mode.name(), mode.waits_for(), None);
    let mut last_measured: Option<Instant> = None;
    let mut errors = Vec::new();
    for handle in handles {
        let outcome = handle
            .join()
            .map_err(|_| format!("a client thread of mode {} panicked", mode.name()))?;
        let _ = updates.add(&outcome.updates);
        let _ = bypass.add(&outcome.bypass);
        result.failed += outcome.failed;
        result.acked_by_device += outcome.acked_by_device;
        result.answered_by_server += outcome.answered_by_server;
        result.client_retransmissions += outcome.retransmissions;
        last_measured = last_measured.max(outcome.last_measured);
        errors.extend(outcome.error);
    }
    if let Some(error) = errors.into_iter().next() {
        return Err(format!("mode {}: {error}", mode.name()));
    }
    let mut all = new_histogram();
    let _ = all.add(&updates);
    let _ = all.add(&bypass);
    let summary = summarize(&all);
    let mut out = ModeResult::from_summary(mode.name(), mode.waits_for(), summary);
    out.failed = result.failed;
    out.acked_by_device = result.acked_by_device;
    out.answered_by_server = result.answered_by_server;
    out.client_retransmissions = result.client_retransmissions;
    if !updates.is_empty() && !bypass.is_empty() {
        out.updates = summarize(&updates);
        out.bypass = summarize(&bypass);
    }
    let measured_until = match measure_until {
        Some(until) => until.min(stopped),
        None => last_measured.unwrap_or(stopped),
    };
    let seconds = measured_until
        .saturating_duration_since(measure_from)
        .as_secs_f64();
    out.measured_s = (seconds * 1000.0).round() / 1000.0;
    if seconds > 0.0 {
        out.ops_per_s = (out.requests as f64 / seconds).round();
    }
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
    if mode == Mode::Pmnet && out.answered_by_server > 0 && plan.workload.update_ratio >= 1.0 {
        out.notes.push(format!(
            "{} updates completed on the server's reply, not a PMNet-ACK (not logged)",
            out.answered_by_server
        ));
    }
    Ok(out)
}

/// The progress line on stderr: rewritten in place on a terminal, one line per mode otherwise.
struct Progress {
    enabled: bool,
    terminal: bool,
    mode: Mode,
}

impl Progress {
    fn new(enabled: bool, mode: Mode) -> Progress {
        let terminal = std::io::stderr().is_terminal();
        if enabled && !terminal {
            eprintln!("  running mode {} ...", mode.name());
        }
        Progress {
            enabled,
            terminal,
            mode,
        }
    }

    fn update(
        &self,
        plan: &Plan,
        shared: &Shared,
        start: Instant,
        measure_from: Instant,
        now: Instant,
    ) {
        if !self.enabled || !self.terminal {
            return;
        }
        let measured = shared.measured.load(Ordering::Relaxed);
        let text = if now < measure_from {
            format!(
                "warm-up {:.1}/{:.1} s",
                now.duration_since(start).as_secs_f64(),
                plan.warmup.as_secs_f64()
            )
        } else {
            let elapsed = now.duration_since(measure_from).as_secs_f64();
            let length = match (plan.duration, plan.requests) {
                (_, Some(requests)) => format!(
                    "{}/{} requests",
                    thousands(measured as f64),
                    thousands(requests as f64)
                ),
                (Some(duration), None) => {
                    format!("{elapsed:.1}/{:.1} s", duration.as_secs_f64())
                }
                (None, None) => String::new(),
            };
            let rate = if elapsed > 0.0 {
                measured as f64 / elapsed
            } else {
                0.0
            };
            format!(
                "{length}, {} measured, {} ops/s",
                thousands(measured as f64),
                thousands(rate)
            )
        };
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r\x1b[2K  {:<9} {text}", self.mode.name());
        let _ = err.flush();
    }

    fn finish(&self) {
        if self.enabled && self.terminal {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K");
            let _ = err.flush();
        }
    }
}

/// A SET through the device, acknowledged by it, then a GET answered by the server that
/// returns the value: the system works, not just its numbers. Returns lines to print.
pub fn functional_check(system: &LoopbackSystem, plan: &Plan) -> Result<Vec<String>, String> {
    let mut options = SessionOptions::new(plan.server_id, system.addresses.device);
    options.wait = plan.wait;
    let mut session = ClientSession::open(options)
        .map_err(|error| format!("cannot open a client session: {error}"))?;
    let key = "demo:greeting";
    let value = format!("hello from pmnet (seed {})", plan.seed);
    let set = Request::Set {
        key: key.as_bytes(),
        value: value.as_bytes(),
    };
    let started = Instant::now();
    let completion = session
        .update(&set.to_bytes())
        .map_err(|error| format!("SET {key} failed: {error}"))?;
    let set_us = started.elapsed().as_secs_f64() * 1e6;
    let mut lines = Vec::new();
    match completion {
        Completion::Logged { device_id } => lines.push(format!(
            "SET {key} {value:?} -> PMNet-ACK from device {device_id} after {set_us:.0} µs: \
             the update is durable in the device's log; the server applies it next"
        )),
        other => {
            return Err(format!(
                "SET {key} completed without a PMNet-ACK ({other:?}): the device did not log it"
            ))
        }
    }
    let get = Request::Get {
        key: key.as_bytes(),
    };
    let started = Instant::now();
    let completion = session
        .bypass(&get.to_bytes())
        .map_err(|error| format!("GET {key} failed: {error}"))?;
    let get_us = started.elapsed().as_secs_f64() * 1e6;
    match completion {
        Completion::Replied { reply, .. } => match Reply::decode(&reply) {
            Ok(Reply::Value(found)) if found == value.as_bytes() => lines.push(format!(
                "GET {key} -> {value:?} from server {} after {get_us:.0} µs: the server \
                 applied the SET (a read bypasses the log and is ordered after the session's \
                 earlier updates)",
                plan.server_id
            )),
            Ok(other) => {
                return Err(format!(
                    "GET {key} returned {other:?}, not the value just set: the system is broken"
                ))
            }
            Err(error) => return Err(format!("GET {key}: undecodable reply ({error:?})")),
        },
        other => return Err(format!("GET {key} completed with {other:?}, not a reply")),
    }
    Ok(lines)
}

pub fn run(args: BenchArgs) -> Result<ExitCode, CliError> {
    let plan = Plan::from_args(&args)?;
    let shutdown = Shutdown::on_signals()?;
    if args.capacity {
        return run_capacity_command(&args, &plan, &shutdown);
    }
    println!(
        "pmnet bench: modes {} (seed {})",
        plan.modes
            .iter()
            .map(|mode| mode.name())
            .collect::<Vec<_>>()
            .join(", "),
        plan.seed
    );
    let (results, mut media, interrupted) = run_modes(&plan, &shutdown)?;
    if let Target::External(targets) = &plan.target {
        media = Some(external_media(targets)?);
    }
    let setting = plan.setting(media);
    let ratios = ratios(&results);
    println!();
    print!("{}", results_table(&results));
    if !ratios.is_empty() {
        println!();
        print!("{}", ratios_table(&ratios));
    }
    for result in &results {
        for note in &result.notes {
            println!("  {}: {note}", result.mode);
        }
    }
    println!();
    println!("setting:");
    print!("{}", setting_text(&setting));
    if interrupted {
        println!("interrupted: the modes not shown did not run");
    }
    let report = Report {
        setting,
        results,
        ratios,
        capacity: None,
        functional_check: None,
        interrupted,
    };
    if let Some(path) = &args.json {
        report.write_json(path)?;
        println!("JSON written to {}", path.display());
    }
    Ok(if interrupted {
        ExitCode::from(130)
    } else {
        ExitCode::SUCCESS
    })
}

/// The capacity settings that go with a plan: the forwarder where the device would run, the
/// generator where the server would.
pub fn capacity_config(plan: &Plan, duration: Duration, rounds: u32) -> CapacityConfig {
    let request = workload::RequestGenerator::new(&plan.workload, plan.seed, 0)
        .next_request()
        .bytes;
    CapacityConfig {
        duration,
        rounds,
        wait: plan.wait,
        forwarder_cpu: plan.device_cpu,
        generator_cpu: plan.server_cpu,
        payload: request,
        server_id: plan.server_id,
    }
}

fn cpu_text(cpu: Option<usize>) -> String {
    cpu.map_or_else(|| "any CPU".to_owned(), |cpu| format!("CPU {cpu}"))
}

fn run_capacity_command(
    args: &BenchArgs,
    plan: &Plan,
    shutdown: &Shutdown,
) -> Result<ExitCode, CliError> {
    let duration = plan.duration.unwrap_or(Duration::from_secs(5));
    let rounds = args.rounds;
    let per_round = duration / rounds;
    let config = capacity_config(plan, per_round, rounds);
    println!(
        "pmnet bench --capacity: {:.1} s per forwarder in {rounds} rounds; forwarder on {}, \
         generator on {}; {}",
        duration.as_secs_f64(),
        cpu_text(config.forwarder_cpu),
        cpu_text(config.generator_cpu),
        plan.wait.name()
    );
    let report = run_capacity(&config, shutdown)?;
    println!();
    print!("{}", capacity_table(&report));
    let mut setting = plan.setting(Some((
        "none: forwarding only, nothing is logged".to_owned(),
        "none: no server; the forwarders send to a sink socket".to_owned(),
    )));
    setting.placement = format!(
        "forwarder on {}, generator on {}",
        cpu_text(config.forwarder_cpu),
        cpu_text(config.generator_cpu)
    );
    setting.server_app = "none".to_owned();
    println!();
    println!("setting:");
    println!(
        "  wait: {}; placement: {}; {}-byte update datagrams over 64 sessions; {} CPUs online; \
         load average at start: {}",
        setting.wait,
        setting.placement,
        setting.request_datagram_bytes,
        setting.cpus_online,
        setting.load_average
    );
    let interrupted = shutdown.is_requested();
    if let Some(path) = &args.json {
        let full = Report {
            setting,
            results: Vec::new(),
            ratios: Vec::new(),
            capacity: Some(report),
            functional_check: None,
            interrupted,
        };
        full.write_json(path)?;
        println!("JSON written to {}", path.display());
    }
    Ok(if interrupted {
        ExitCode::from(130)
    } else {
        ExitCode::SUCCESS
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        bench: BenchArgs,
    }

    fn parse(args: &[&str]) -> Result<BenchArgs, String> {
        let argv = std::iter::once("bench").chain(args.iter().copied());
        Cli::try_parse_from(argv)
            .map(|cli| cli.bench)
            .map_err(|error| error.to_string())
    }

    #[test]
    fn defaults_are_valid() {
        let args = parse(&[]).unwrap();
        assert_eq!(
            args.modes,
            [Mode::Echo, Mode::Baseline, Mode::Forward, Mode::Pmnet]
        );
        let plan = Plan::from_args(&args).unwrap();
        assert!(matches!(plan.target, Target::Loopback(_)));
        assert_eq!(plan.duration, Some(Duration::from_secs(5)));
    }

    #[test]
    fn bad_values_are_refused_with_a_reason() {
        for (args, expected) in [
            (&["--clients", "0"][..], "0"),
            (&["--clients", "100000"][..], "100000"),
            (&["--payload", "0"][..], "out of range"),
            (&["--payload", "100000"][..], "out of range"),
            (&["--update-ratio", "1.5"][..], "not a fraction"),
            (&["--zipf-exponent", "0"][..], "out of range"),
            (&["--duration=-1"][..], "out of range"),
            (&["--duration", "0"][..], "out of range"),
            (&["--duration", "abc"][..], "not a number"),
            (&["--mode", "teleport"][..], "teleport"),
            (&["--flush", "sometimes"][..], "sometimes"),
        ] {
            let error = parse(args).unwrap_err();
            assert!(error.contains(expected), "{args:?}: {error}");
        }
    }

    #[test]
    fn external_targets_need_an_address_per_mode() {
        let args = parse(&["--device", "127.0.0.1:7400"]).unwrap();
        let error = Plan::from_args(&args).unwrap_err();
        assert!(error.contains("mode echo needs --echo"), "{error}");
        let args = parse(&["--device", "127.0.0.1:7400", "--mode", "pmnet"]).unwrap();
        let plan = Plan::from_args(&args).unwrap();
        assert!(matches!(plan.target, Target::External(_)));
        assert!(
            plan.device_cpu.is_none(),
            "nothing to pin for external processes"
        );
        let args = parse(&["--device", "127.0.0.1:7400", "--capacity"]).unwrap();
        assert!(Plan::from_args(&args).is_err());
    }

    #[test]
    fn the_medium_of_a_running_process_is_read_from_its_metrics() {
        let text = "# HELP pmnet_device_info x\n# TYPE pmnet_device_info gauge\n\
                    pmnet_device_info{device_id=\"1\",medium=\"emulated-pm\",\
                    flush=\"clwb+sfence\",guarantee=\"durable across process crash, NOT \
                    power loss (\\\"DRAM\\\")\",wait=\"blocking\"} 1\n";
        assert_eq!(
            medium_from_metrics(text, "pmnet_device_info").unwrap(),
            "emulated-pm via clwb+sfence; durable across process crash, NOT power loss \
             (\"DRAM\")"
        );
        let ideal = "pmnet_server_info{server_id=\"1\",application=\"ideal\",medium=\"none\",\
                     flush=\"none\",guarantee=\"nothing kept\",wait=\"blocking\"} 1\n";
        assert_eq!(
            medium_from_metrics(ideal, "pmnet_server_info").unwrap(),
            "none: nothing kept"
        );
        assert!(medium_from_metrics("pmnet_other 1\n", "pmnet_device_info").is_none());
        assert!(medium_from_metrics("pmnet_device_info{medium=\"x", "pmnet_device_info").is_none());
    }

    #[test]
    fn pinning_to_a_missing_cpu_is_refused() {
        let args = parse(&["--server-cpu", "100000"]).unwrap();
        let error = Plan::from_args(&args).unwrap_err();
        assert!(error.contains("online CPUs"), "{error}");
    }

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

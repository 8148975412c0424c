//! The load generator's options (`pmnet bench`'s, but for the parts with processes of their
//! own: `--abd`, `--in-path`): their parsing and checks, and the [`Plan`] they make.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use pmnet_pm::{FlushChoice, MmapOptions, ADDED_LATENCY_NS_MAX};
use pmnet_runtime::WaitMode;

use super::plan::{resolve_pinning, ExternalTargets, Pinning, Plan, Target};
use super::popularity::{Popularity, PopularityKind};
use super::rack::RackArgs;
use super::{KeyDistribution, LoopbackConfig, Mode, Workload};
use crate::node::EngineChoice;

/// Slot size of the device log: any single datagram (up to 1472 bytes) plus the slot header.
const SLOT_SIZE: u32 = 2048;

/// Clients at most: each is a thread.
pub const MAX_CLIENTS: u32 = 256;

#[derive(Debug, Clone, Args)]
pub struct LoadArgs {
    /// Modes to run, in order, comma-separated: echo, baseline, forward, pmnet, and
    /// baseline-auth, forward-auth, pmnet-auth (the same with every datagram authenticated:
    /// `--mode pmnet,pmnet-auth` shows what authentication costs).
    #[arg(
        long = "mode",
        value_name = "MODES",
        value_enum,
        value_delimiter = ',',
        default_value = "echo,baseline,forward,pmnet"
    )]
    pub modes: Vec<Mode>,

    /// Client threads, a session each (with a rack, a session per server each). Default 1;
    /// 4 with a rack.
    #[arg(long, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=MAX_CLIENTS as i64))]
    pub clients: Option<u32>,

    /// Requests each client keeps in flight (1: one at a time). Default 1; 16 with a rack.
    #[arg(long, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub window: Option<u32>,

    /// Bytes of each SET's value (the request must fit one datagram).
    #[arg(long, value_name = "BYTES", default_value_t = 100, value_parser = parse_payload)]
    pub payload: usize,

    /// Fraction of requests that are updates (SET); the rest are reads (GET, bypass
    /// requests). Default 1; 0.05 with a rack (a read-mostly load, the read cache's case).
    #[arg(long, value_name = "FRACTION", value_parser = parse_ratio)]
    pub update_ratio: Option<f64>,

    /// Keys in the key space. Default 10 000; 1 000 000 with a rack.
    #[arg(long, value_name = "N",
          value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub keys: Option<u64>,

    /// How keys are drawn (or --dist).
    #[arg(long, value_enum, default_value_t = KeyDistribution::Uniform)]
    pub distribution: KeyDistribution,

    /// Exponent s of the Zipf distribution (0.99 is YCSB's).
    #[arg(long, value_name = "S", default_value_t = 0.99, value_parser = parse_exponent)]
    pub zipf_exponent: f64,

    /// How keys are drawn, in one word: uniform, or zipf:S (zipf:0.9, zipf:0.95, zipf:0.99;
    /// any S above 0 and at most 10). Replaces --distribution and --zipf-exponent.
    #[arg(long, value_name = "DIST", value_parser = parse_dist,
          conflicts_with_all = ["distribution", "zipf_exponent"])]
    pub dist: Option<(KeyDistribution, f64)>,

    /// A rack: the device in front of this many servers (1 to 32), keys partitioned over
    /// them by a CRC32C of the key. With a rack the run prints a line per second (ops/s and
    /// the spread over the servers) and the busiest server's share of requests.
    #[arg(long, value_name = "S",
          value_parser = clap::value_parser!(u16).range(1..=super::rack::SERVERS_MAX as i64))]
    pub servers: Option<u16>,

    /// Every in-process server takes at most N requests per second (`pmnet server
    /// --max-ops-per-s`: an emulated capacity). Makes a rack (of --servers, default 1).
    #[arg(long, value_name = "N", value_parser = crate::node::parse_max_ops_per_s)]
    pub server_max_ops_per_s: Option<u64>,

    /// How key popularity changes during the run, as NetCache's evaluation changes it:
    /// static; hot-in (the --change-count coldest keys become the hottest every
    /// --change-every seconds); random (that many keys among the 10 000 hottest swap ranks
    /// with colder ones); hot-out (the hottest become the coldest).
    #[arg(long, value_enum, default_value_t = PopularityKind::Static)]
    pub popularity: PopularityKind,

    /// Seconds between two popularity changes (counted from the end of the warm-up).
    #[arg(long, value_name = "SECONDS", default_value_t = 10.0,
          value_parser = |text: &str| parse_seconds(text, 0.1, 3600.0))]
    pub change_every: f64,

    /// Keys each popularity change moves.
    #[arg(long, value_name = "N", default_value_t = 200,
          value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub change_count: u64,

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
    #[arg(long, value_name = "ADDR", value_parser = crate::addr::parse_addr)]
    pub device: Option<SocketAddr>,

    /// A running device's forward port (`--forward-listen`), for mode forward.
    #[arg(long, value_name = "ADDR", value_parser = crate::addr::parse_addr)]
    pub forward: Option<SocketAddr>,

    /// A running device's echo port (`--echo-listen`), for mode echo.
    #[arg(long, value_name = "ADDR", value_parser = crate::addr::parse_addr)]
    pub echo: Option<SocketAddr>,

    /// A running server (`pmnet server --listen`), for mode baseline.
    #[arg(long, value_name = "ADDR", value_parser = crate::addr::parse_addr)]
    pub server: Option<SocketAddr>,

    /// A running device's metrics endpoint (its `--metrics`): read once, for the report's
    /// medium (otherwise the report says the medium is unknown).
    #[arg(long, value_name = "ADDR", value_parser = crate::addr::parse_addr)]
    pub device_metrics: Option<SocketAddr>,

    /// A running server's metrics endpoint (its `--metrics`), for the report's store medium.
    #[arg(long, value_name = "ADDR", value_parser = crate::addr::parse_addr)]
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

    /// In-process device: send every datagram to the server on its own instead of packing
    /// what one turn sends it into batches.
    #[arg(long)]
    pub no_batch: bool,

    /// In-process device: microseconds a batch of update requests may wait for more (as
    /// `pmnet device --batch-hold-us`).
    #[arg(long, value_name = "US", default_value_t = crate::node::DEFAULT_BATCH_HOLD_US,
          value_parser = clap::value_parser!(u64).range(0..=100_000))]
    pub batch_hold_us: u64,

    /// In-process device: run this many workers (as `pmnet device --workers`), the clients'
    /// sessions spread over them; their CPUs count up from the device's.
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u16).range(1..=pmnet_runtime::WORKERS_MAX as i64))]
    pub device_workers: u16,

    /// Authenticate every datagram (clients, device and server) with the deployment keys in
    /// this file (see `pmnet keygen`); without it, traffic is not authenticated.
    #[arg(long, value_name = "FILE")]
    pub key_file: Option<PathBuf>,

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

    /// Instead of the latency modes: what authentication costs, side by side in one run, at
    /// each payload size given (default 100 and 1024 bytes): the PMNet-ACK's latency (pmnet
    /// and pmnet-auth in turns, --rounds each, default 5, of --duration), the device's
    /// forwarding capacity without and with keys (in turns, --rounds of --duration each), and
    /// the MAC's cost per datagram at each hop, against the targets (ack p50 at most +10 %,
    /// capacity at most -15 %).
    #[arg(long, value_name = "BYTES,...", num_args = 0..=1, require_equals = true,
          default_missing_value = "100,1024", value_delimiter = ',',
          value_parser = parse_payload)]
    pub auth_cost: Option<Vec<usize>>,

    /// Run every mode this many times, the modes in turns, and report each mode's median
    /// round by p50 (default 1). With --capacity: split --duration into this many rounds per
    /// forwarder, in turns, and report each one's median round (default 3).
    #[arg(long, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=100))]
    pub rounds: Option<u32>,

    /// Also write the results, with the setting, as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,

    /// No progress line on stderr.
    #[arg(long)]
    pub no_progress: bool,

    #[command(flatten)]
    pub cache: super::cache::CacheArgs,

    #[command(flatten)]
    pub replication: super::replication::ReplicationArgs,
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
        servers: 1,
        popularity: PopularityKind::Static,
        change_every: Duration::from_secs(10),
        change_count: 1,
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

/// `--dist`: `uniform`, or `zipf:S`.
fn parse_dist(text: &str) -> Result<(KeyDistribution, f64), String> {
    let text = text.trim();
    if text == "uniform" {
        return Ok((KeyDistribution::Uniform, 0.99));
    }
    match text.strip_prefix("zipf:") {
        Some(exponent) => Ok((KeyDistribution::Zipf, parse_exponent(exponent)?)),
        None => Err(format!(
            "{text:?} is not a distribution: give uniform or zipf:S (zipf:0.9, zipf:0.95, zipf:0.99)"
        )),
    }
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

impl Plan {
    /// The plan `pmnet bench`'s options ask for, or why they do not make one.
    pub fn from_args(args: &LoadArgs) -> Result<Plan, String> {
        let external = external_targets(args);
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
        let rack = RackArgs::from_args(args, is_external)?;
        if !args.replication.replicas.is_empty() {
            let conflict = if is_external {
                Some("the addresses of running parts (--device/--forward/--echo/--server)")
            } else if args.capacity {
                Some("--capacity")
            } else if rack.is_some() {
                Some("a rack (--servers, --server-max-ops-per-s)")
            } else if args.cache.cache.contains(&true) {
                Some("--cache on")
            } else if args.window.is_some_and(|window| window > 1) {
                Some("--window above 1 (each client keeps one update in flight)")
            } else {
                None
            };
            if let Some(conflict) = conflict {
                return Err(format!(
                    "--replicas runs its own replication modes on loopback; it does not go \
                     with {conflict}"
                ));
            }
        }
        let defaults = Defaults::for_run(args, rack.is_some());
        let wait = WaitMode::from_busy_poll(args.busy_poll);
        let (client_cpu, device_cpu, server_cpu) = resolve_pinning(
            args.pin,
            args.client_cpu,
            args.device_cpu,
            args.server_cpu,
            !is_external,
            // --capacity: the forwarder where the device goes with one client, the generator
            // where the server goes.
            if args.capacity { 1 } else { defaults.clients },
        )?;
        let modes = distinct_modes(&args.modes);
        let cache = super::cache::CachePlan::from_args(
            &args.cache,
            rack.is_some(),
            modes.iter().any(|mode| mode.path() == Mode::Pmnet),
            args.payload,
        )?;
        let (distribution, zipf_exponent) =
            args.dist.unwrap_or((args.distribution, args.zipf_exponent));
        if args.popularity != PopularityKind::Static {
            // Refused here rather than when the first mode starts.
            Popularity::new(args.popularity, defaults.keys, args.change_count)?;
        }
        let keys = match &args.key_file {
            Some(path) => Some(pmnet_runtime::load_key_file(path).map_err(|e| e.to_string())?),
            None => None,
        };
        let auth_keys = match &keys {
            Some(keys) => keys.clone(),
            None if is_external && modes.iter().any(|mode| mode.is_authenticated()) => {
                return Err(
                    "the -auth modes against running processes need --key-file (the \
                     processes' key file)"
                        .into(),
                )
            }
            None => fresh_keys()?,
        };
        let target = if is_external {
            check_external_addresses(&modes, &external)?;
            Target::External(external)
        } else {
            let mut config = loopback_config(args, &defaults, wait, device_cpu, server_cpu)?;
            if let Some(rack) = &rack {
                config.servers = rack.servers;
                config.server_max_ops_per_s = rack.server_max_ops_per_s;
                config.resend_timeout = rack.resend_timeout(defaults.clients, defaults.window);
            }
            config.keys = keys.clone();
            Target::Loopback(config)
        };
        Ok(Plan {
            modes,
            workload: Workload {
                keys: defaults.keys,
                distribution,
                zipf_exponent,
                update_ratio: defaults.update_ratio,
                value_len: args.payload,
                servers: rack.as_ref().map_or(1, |rack| rack.servers),
                popularity: args.popularity,
                change_every: Duration::from_secs_f64(args.change_every),
                change_count: args.change_count,
            },
            clients: defaults.clients,
            window: defaults.window,
            rack,
            cache,
            duration: args
                .requests
                .is_none()
                .then(|| Duration::from_secs_f64(args.duration)),
            requests: args.requests,
            warmup: Duration::from_secs_f64(args.warmup),
            seed: args.seed.unwrap_or_else(rand::random),
            rounds: args.rounds.unwrap_or(1),
            wait,
            client_cpu,
            device_cpu,
            server_cpu,
            server_id: args.server_id,
            target,
            progress: !args.no_progress,
            keys,
            auth_keys,
        })
    }
}

/// The running processes' addresses given in the options.
fn external_targets(args: &LoadArgs) -> ExternalTargets {
    ExternalTargets {
        device: args.device,
        forward: args.forward,
        echo: args.echo,
        server: args.server,
        device_metrics: args.device_metrics,
        server_metrics: args.server_metrics,
    }
}

/// The modes in the order given, each once.
fn distinct_modes(given: &[Mode]) -> Vec<Mode> {
    let mut modes = Vec::new();
    for mode in given {
        if !modes.contains(mode) {
            modes.push(*mode);
        }
    }
    modes
}

/// Measuring running processes: every mode has the address it goes to.
fn check_external_addresses(modes: &[Mode], external: &ExternalTargets) -> Result<(), String> {
    for mode in modes {
        let (present, option) = match mode.path() {
            Mode::Echo => (external.echo.is_some(), "--echo"),
            Mode::Baseline => (external.server.is_some(), "--server"),
            Mode::Forward => (external.forward.is_some(), "--forward"),
            Mode::Pmnet => (external.device.is_some(), "--device"),
            _ => unreachable!("path() is a plain mode"),
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
    Ok(())
}

/// A deployment key set of one fresh random key: what the -auth modes use without
/// `--key-file`.
pub fn fresh_keys() -> Result<pmnet_runtime::KeySet, String> {
    let mut secret = [0u8; pmnet_auth::KEY_LEN];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut random| std::io::Read::read_exact(&mut random, &mut secret))
        .map_err(|error| format!("cannot read random bytes from /dev/urandom: {error}"))?;
    Ok(pmnet_runtime::KeySet::new(vec![
        pmnet_auth::DeploymentKey::new(1, secret),
    ]))
}

/// The options whose default depends on whether the run is a rack.
pub(super) struct Defaults {
    pub clients: u32,
    pub window: u32,
    pub keys: u64,
    pub update_ratio: f64,
}

impl Defaults {
    fn for_run(args: &LoadArgs, rack: bool) -> Defaults {
        let (clients, window, keys, update_ratio) = match rack {
            true => (4, 16, 1_000_000, 0.05),
            false => (1, 1, 10_000, 1.0),
        };
        Defaults {
            clients: args.clients.unwrap_or(clients),
            window: args.window.unwrap_or(window),
            keys: args.keys.unwrap_or(keys),
            update_ratio: args.update_ratio.unwrap_or(update_ratio),
        }
    }
}

/// The device and server to start in this process for every mode.
fn loopback_config(
    args: &LoadArgs,
    defaults: &Defaults,
    wait: WaitMode,
    device_cpu: Option<usize>,
    server_cpu: Option<usize>,
) -> Result<LoopbackConfig, String> {
    if !args.dir.is_dir() {
        return Err(format!(
            "--dir {}: not a directory; the log and store files go there (/dev/shm is \
             emulated persistent memory)",
            args.dir.display()
        ));
    }
    Ok(LoopbackConfig {
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
        // A rack's client has a session per server, each server sees one of each.
        max_sessions: 1024.max(defaults.clients * 4),
        wait,
        device_cpu,
        server_cpu,
        keys: None,
        batch: !args.no_batch,
        batch_hold: Duration::from_micros(args.batch_hold_us),
        device_workers: args.device_workers,
        servers: 1,
        server_max_ops_per_s: None,
        resend_timeout: None,
        cache: None,
    })
}

impl RackArgs {
    /// The rack `--servers` and `--server-max-ops-per-s` ask for (`None`: neither was given).
    pub fn from_args(args: &LoadArgs, is_external: bool) -> Result<Option<RackArgs>, String> {
        if args.servers.is_none() && args.server_max_ops_per_s.is_none() {
            return Ok(None);
        }
        if is_external {
            return Err(
                "--servers and --server-max-ops-per-s start their own rack on loopback; \
                 drop the --device/--forward/--echo/--server addresses"
                    .into(),
            );
        }
        if args.capacity {
            return Err("--capacity measures forwarding alone; drop --servers and \
                 --server-max-ops-per-s"
                .into());
        }
        if args.device_workers > 1 {
            return Err("a rack runs one device worker; drop --device-workers".into());
        }
        let servers = args.servers.unwrap_or(1);
        if u32::from(args.server_id) + u32::from(servers) - 1 > u32::from(u16::MAX) {
            return Err(format!(
                "--server-id {} with {servers} servers runs past id {}: give a smaller id",
                args.server_id,
                u16::MAX
            ));
        }
        Ok(Some(RackArgs {
            servers,
            server_max_ops_per_s: args.server_max_ops_per_s,
        }))
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        bench: LoadArgs,
    }

    /// `pmnet bench ARGS`'s options.
    pub(in crate::loadgen) fn parse(args: &[&str]) -> Result<LoadArgs, String> {
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
            (&["--replicas", "0"][..], "0 is not in 1..=8"),
            (&["--replicas", "1,9"][..], "9 is not in 1..=8"),
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
    fn a_rack_has_its_own_defaults_and_refusals() {
        let plan =
            Plan::from_args(&parse(&["--servers", "32", "--dist", "zipf:0.95"]).unwrap()).unwrap();
        let rack = plan.rack.as_ref().unwrap();
        assert_eq!((rack.servers, rack.server_max_ops_per_s), (32, None));
        assert_eq!(plan.workload.servers, 32);
        assert_eq!(plan.workload.distribution, KeyDistribution::Zipf);
        assert_eq!(plan.workload.zipf_exponent, 0.95);
        assert_eq!(
            (plan.clients, plan.window, plan.workload.keys),
            (4, 16, 1_000_000)
        );
        assert_eq!(plan.workload.update_ratio, 0.05);
        let limited =
            Plan::from_args(&parse(&["--server-max-ops-per-s", "2000"]).unwrap()).unwrap();
        assert_eq!(limited.rack.unwrap().servers, 1);
        let plain = Plan::from_args(&parse(&["--dist", "uniform"]).unwrap()).unwrap();
        assert!(plain.rack.is_none());
        assert_eq!((plain.clients, plain.workload.keys), (1, 10_000));
        for (args, expected) in [
            (&["--servers", "0"][..], "0"),
            (&["--servers", "33"][..], "33"),
            (&["--dist", "zipf:0"][..], "out of range"),
            (&["--dist", "pareto"][..], "uniform or zipf:S"),
            (
                &["--dist", "zipf:0.9", "--distribution", "zipf"][..],
                "cannot be used",
            ),
            (&["--server-max-ops-per-s", "0"][..], "out of range"),
            (&["--change-count", "0"][..], "0"),
            (&["--popularity", "sideways"][..], "sideways"),
        ] {
            let error = parse(args).unwrap_err();
            assert!(error.contains(expected), "{args:?}: {error}");
        }
        for (args, expected) in [
            (
                &[
                    "--servers",
                    "2",
                    "--device",
                    "127.0.0.1:7400",
                    "--mode",
                    "pmnet",
                ][..],
                "start their own rack",
            ),
            (&["--servers", "2", "--capacity"][..], "--capacity"),
            (&["--replicas", "2", "--servers", "2"][..], "a rack"),
            (
                &["--replicas", "1,3", "--capacity"][..],
                "not go with --capacity",
            ),
            (
                &["--replicas", "3", "--window", "4"][..],
                "--window above 1",
            ),
            (
                &["--replicas", "2", "--device", "127.0.0.1:7400"][..],
                "running parts",
            ),
            (
                &["--servers", "2", "--device-workers", "2"][..],
                "one device worker",
            ),
            (
                &["--popularity", "random", "--keys", "20000000"][..],
                "at most 16000000",
            ),
            (
                &["--popularity", "hot-in", "--keys", "10"][..],
                "--change-count 200",
            ),
        ] {
            let error = Plan::from_args(&parse(args).unwrap()).unwrap_err();
            assert!(error.contains(expected), "{args:?}: {error}");
        }
    }

    #[test]
    fn the_cache_runs_on_a_racks_pmnet_modes() {
        let plan = Plan::from_args(
            &parse(&[
                "--servers",
                "4",
                "--mode",
                "baseline,pmnet",
                "--cache",
                "on,off",
            ])
            .unwrap(),
        )
        .unwrap();
        assert_eq!(
            plan.runs(),
            [
                (Mode::Baseline, false),
                (Mode::Pmnet, true),
                (Mode::Pmnet, false)
            ]
        );
        let settings = plan.cache.settings.unwrap();
        assert_eq!((settings.items, settings.reply_max), (10_000, 132));
        let off = Plan::from_args(&parse(&["--servers", "4", "--mode", "pmnet"]).unwrap()).unwrap();
        assert_eq!(off.runs(), [(Mode::Pmnet, false)]);
        assert!(parse(&["--cache", "sometimes"])
            .unwrap_err()
            .contains("on,off"));
        assert!(parse(&["--servers", "2", "--cache", "on", "--cache-items", "0"]).is_err());
        for (args, expected) in [
            (&["--cache", "on", "--mode", "pmnet"][..], "--servers"),
            (
                &["--servers", "2", "--cache", "on", "--mode", "baseline"][..],
                "add pmnet",
            ),
        ] {
            let error = Plan::from_args(&parse(args).unwrap()).unwrap_err();
            assert!(error.contains(expected), "{args:?}: {error}");
        }
    }

    #[test]
    fn pinning_to_a_missing_cpu_is_refused() {
        let args = parse(&["--server-cpu", "100000"]).unwrap();
        let error = Plan::from_args(&args).unwrap_err();
        assert!(error.contains("online CPUs"), "{error}");
    }
}

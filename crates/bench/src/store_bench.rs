//! `pmnet store-bench`: the storage engines side by side in one run — the per-write breakdown
//! in the layout of Table 1 of "Packets as Persistent In-Memory Data Structures", then update
//! latency and throughput through a real server (loopback UDP, a client session talking to
//! the server directly) with each engine. See docs/storage.md.
//!
//! With `--xdp` the servers run in a network namespace of their own and the client in
//! another, joined by a veth pair, and the packet store also runs behind the AF_XDP receive
//! path (`pmnet server --xdp`): its frames land in the store's slots (docs/inpath.md, "The
//! packet store on AF_XDP").

mod breakdown;
mod net;
mod report;
mod server;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use pmnet_pktstore::EngineKind;
use pmnet_pm::FlushChoice;
use pmnet_runtime::online_cpu_count;
use serde::Serialize;

use crate::drain_bench::write_json;
use breakdown::{breakdown, BreakdownJson};
use net::NetPair;
use pmnet::CliError;
use report::{print_engines, print_targets, print_xdp_targets, EngineJson, TargetsJson};
use server::{run_server_engine, EndToEnd};

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

    /// Also write the results, with the setting, as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

/// What `--json` writes: everything the command prints, with the setting.
#[derive(Debug, Serialize)]
struct ReportJson {
    setting: SettingJson,
    breakdown: BreakdownJson,
    /// The servers in the order they ran (none with --no-server).
    engines: Vec<EngineJson>,
    targets: TargetsJson,
}

#[derive(Debug, Serialize)]
struct SettingJson {
    dir: String,
    flush: String,
    /// The breakdown's medium.
    medium: String,
    sizes: Vec<usize>,
    writes: usize,
    breakdown_runs: usize,
    keys: usize,
    value_bytes: usize,
    seconds: f64,
    window: u32,
    latency_requests: usize,
    rounds: usize,
    blocking: bool,
    /// Server on CPU 1 and client on CPU 0 (busy-poll on two CPUs or more).
    pinned: bool,
    no_server: bool,
    xdp: bool,
    /// With --xdp: native or generic.
    xdp_mode: Option<String>,
    /// The servers run (--only), or every one.
    only: Vec<String>,
}

impl SettingJson {
    fn new(args: &StoreBenchArgs, medium: &str) -> SettingJson {
        SettingJson {
            dir: args.dir.display().to_string(),
            flush: args.flush.to_string(),
            medium: medium.to_owned(),
            sizes: args.sizes.clone(),
            writes: args.writes,
            breakdown_runs: args.breakdown_runs.max(1),
            keys: args.keys,
            value_bytes: args.value,
            seconds: args.seconds,
            window: args.window,
            latency_requests: args.latency_requests,
            rounds: args.rounds.max(1),
            blocking: args.blocking,
            pinned: pinned(args),
            no_server: args.no_server,
            xdp: args.xdp,
            xdp_mode: args.xdp.then(|| args.xdp_mode.clone()),
            only: args.only.clone(),
        }
    }
}

/// Whether the server and the client run pinned to CPUs of their own.
fn pinned(args: &StoreBenchArgs) -> bool {
    !args.blocking && online_cpu_count() >= 2
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

pub fn run(args: StoreBenchArgs) -> Result<ExitCode, CliError> {
    println!("pmnet store-bench: the storage engines side by side (docs/storage.md)\n");
    let breakdown = breakdown(&args)?;
    let (engines, targets) = if args.no_server {
        (
            Vec::new(),
            report::targets(&args, &breakdown, &[], &[], &[]),
        )
    } else {
        servers(&args, &breakdown)?
    };
    if let Some(path) = &args.json {
        let report = ReportJson {
            setting: SettingJson::new(&args, breakdown.medium()),
            breakdown,
            engines,
            targets,
        };
        write_json(path, &report)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Updates through a server with each engine, `--rounds` times: printed, and returned with the
/// targets.
fn servers(
    args: &StoreBenchArgs,
    breakdown: &BreakdownJson,
) -> Result<(Vec<EngineJson>, TargetsJson), CliError> {
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
        if pinned(args) {
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
    let runs = server_rounds(args, &setups)?;
    let engines = report::summarize(&setups, &runs);
    let targets = report::targets(args, breakdown, &setups, &runs, &engines);
    print_engines(&engines);
    if setups.len() < all.len() {
        // The targets compare the whole table.
    } else if args.xdp {
        print_xdp_targets(args, &targets, &engines);
    } else {
        print_targets(args, &targets, &engines);
    }
    Ok((engines, targets))
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

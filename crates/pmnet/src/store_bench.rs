//! `pmnet store-bench`: the storage engines side by side in one run — the per-write breakdown
//! in the layout of Table 1 of "Packets as Persistent In-Memory Data Structures", then update
//! latency and throughput through a real server (loopback UDP, a client session talking to
//! the server directly) with each engine. See docs/storage.md.
//!
//! With `--xdp` the servers run in a network namespace of their own and the client in
//! another, joined by a veth pair, and the packet store also runs behind the AF_XDP receive
//! path (`pmnet server --xdp`): its frames land in the store's slots (docs/inpath.md, "The
//! packet store on AF_XDP").

mod net;
mod report;
mod server;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use pmnet_pktstore::bench::{run_breakdown, BreakdownOptions};
use pmnet_pktstore::EngineKind;
use pmnet_pm::{FlushChoice, MmapOptions};
use pmnet_runtime::online_cpu_count;

use crate::CliError;
use net::NetPair;
use report::{print_engines, print_targets, print_xdp_targets};
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

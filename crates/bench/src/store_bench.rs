//! `pmnet store-bench`: the storage engines side by side in one run — the per-write breakdown
//! in the layout of Table 1 of "Packets as Persistent In-Memory Data Structures", then update
//! latency and throughput through a real server (loopback UDP, a client session talking to
//! the server directly) with each engine. See docs/storage.md.
//!
//! With `--xdp` the servers run in a network namespace of their own and the client in
//! another, joined by a veth pair, and the packet store also runs behind the AF_XDP receive
//! path (`pmnet server --xdp`): its frames land in the store's slots (docs/inpath.md, "The
//! packet store on AF_XDP").

mod args;
mod breakdown;
mod net;
mod report;
mod server;

use std::process::ExitCode;

use pmnet_runtime::online_cpu_count;
use serde::Serialize;

use crate::drain_bench::write_json;
pub use args::StoreBenchArgs;
use args::{Setup, LOOPBACK, NAMESPACES};
use breakdown::{breakdown, BreakdownJson};
use net::NetPair;
use pmnet::CliError;
use report::{print_engines, print_targets, print_xdp_targets, EngineJson, TargetsJson};
use server::{run_server_engine, EndToEnd};

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

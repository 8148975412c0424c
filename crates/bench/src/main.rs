//! `pmnet-bench`: pmnet's benchmarks and its evaluation suite. They start the product's
//! processes (`pmnet device`, `pmnet server`, …) as a user would, from the `pmnet` binary next
//! to this one (or the one `PMNET_BIN` names; see `procs::pmnet_program`), and drive the load generator of
//! the `pmnet` library in-process. `pmnet bench …` and the other benchmark commands of `pmnet`
//! run this binary.

mod bench;
mod coord_bench;
mod drain_bench;
mod eval;
mod procs;
mod redis_bench;
mod session_bench;
mod store_bench;

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

/// pmnet's benchmarks: the load generator's modes side by side, Redis workloads, storage
/// engines, a log's drain, session tables, the chain store against etcd and ZooKeeper, and
/// the papers' evaluation in one run.
///
/// Each starts what it measures (the `pmnet` binary next to this one, or the one `PMNET_BIN`
/// names; redis-server, etcd, ZooKeeper where a command compares with them) and stops it at
/// the end. `pmnet bench …`, `pmnet eval …` and the like run these same commands.
#[derive(Debug, Parser)]
#[command(name = "pmnet-bench", version, about, long_about, max_term_width = 100)]
struct Cli {
    /// Read options from this TOML file: a table per command ([bench], [eval], …, and the
    /// `pmnet` commands' tables) whose keys are the long option names, e.g. `duration = 2`.
    /// Options on the command line win.
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<std::path::PathBuf>,

    /// More log output from pmnet's own crates (-v: debug, -vv: trace). A RUST_LOG filter in
    /// the environment (e.g. RUST_LOG=pmnet_runtime=trace) takes precedence over -v and -q.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,

    /// Only warnings and errors (unless RUST_LOG says otherwise).
    #[arg(short, long, global = true)]
    quiet: bool,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Measure latency and throughput: echo, baseline, forward and pmnet modes side by side.
    Bench(Box<bench::BenchArgs>),
    /// Redis workloads (YCSB A/B/F, Twitter-like, TPC-C-like) on Redis alone and behind PMNet,
    /// both started here (see docs/benchmarks.md).
    RedisBench(Box<redis_bench::RedisBenchArgs>),
    /// Compare the storage engines: the write-path breakdown (the paper's Table 1) and
    /// updates through a server with each (see docs/storage.md).
    StoreBench(store_bench::StoreBenchArgs),
    /// Time how fast a server drains a device's log after an outage, the device's replay
    /// paced and unpaced side by side (see docs/benchmarks.md).
    DrainBench(drain_bench::DrainBenchArgs),
    /// The papers' evaluation reproduced in one run: every experiment's data as JSON, its plots as SVG and report.md comparing each figure with the paper's (see docs/eval.md)
    Eval(eval::EvalArgs),
    /// Measure a server's rate as the sessions it has seen grow past its session table
    /// (see docs/benchmarks.md).
    SessionBench(session_bench::SessionBenchArgs),
    /// The chain store against real etcd and ZooKeeper ensembles, each started here: read,
    /// write and lock latency and throughput side by side; or, with --read-scaling, reads
    /// from any member against reads at the tail (see docs/benchmarks.md).
    CoordBench(coord_bench::CoordBenchArgs),
}

/// The configuration file's tables: this binary's commands, and the `pmnet` commands' (one
/// file serves both binaries), checked against their options.
fn config_tables() -> clap::Command {
    let product = pmnet::cli::Cli::command();
    let mut tables = Cli::command();
    for command in product.get_subcommands() {
        if !command.is_hide_set() && tables.find_subcommand(command.get_name()).is_none() {
            tables = tables.subcommand(command.clone());
        }
    }
    tables
}

fn main() -> ExitCode {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let cli = match pmnet::config::parse_with_config_file::<Cli>(&argv, &config_tables()) {
        Ok(cli) => cli,
        Err(error) => {
            // clap prints help and version to stdout with status 0, errors to stderr with 2.
            let _ = error.print();
            return ExitCode::from(u8::try_from(error.exit_code()).unwrap_or(2));
        }
    };
    pmnet::cli::init_logging(cli.verbose, cli.quiet, false);
    let result = match cli.command {
        Command::Bench(args) => bench::run(*args),
        Command::RedisBench(args) => redis_bench::run(*args),
        Command::StoreBench(args) => store_bench::run(args),
        Command::DrainBench(args) => drain_bench::run(args),
        Command::Eval(args) => eval::run(args),
        Command::SessionBench(args) => session_bench::run(args),
        Command::CoordBench(args) => coord_bench::run(args),
    };
    pmnet::cli::exit_code("pmnet-bench", result)
}

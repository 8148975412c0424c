//! `pmnet`: the PMNet device, server, client, benchmark, demo and simulator in one command.

mod addr;
mod bench;
mod chain_controller;
mod chain_lock;
mod client;
mod config;
mod coord_bench;
mod demo;
mod drain_bench;
mod eval;
mod keygen;
mod kv;
mod log_inspect;
mod memnode;
mod memory_cli;
mod node;
mod protect;
mod redis;
mod redis_bench;
mod redis_up;
mod session_bench;
mod sim;
mod sim_abd;
mod sim_chain;
mod status;
mod store_bench;
mod testbed;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// PMNet: persistence in the network.
///
/// A device on the path between clients and a server (a switch, a NIC, a host in the middle)
/// writes each update request to a persistent log, acknowledges the client at once, and
/// forwards the request to the server; when the server has applied it, the device drops the
/// log entry. After a crash the log is replayed, so an acknowledged update is never lost.
///
/// Quick start: `pmnet demo` runs everything on loopback and compares PMNet with talking to the
/// server directly. By hand, on three hosts (or three terminals), with one key file for all
/// (protected mode: a process listening on an address other hosts reach needs one):
///
///   pmnet keygen --out pmnet.keys
///   pmnet server --listen 0.0.0.0:7500 --device 10.0.0.2:7400 --key-file pmnet.keys
///   pmnet device --listen 0.0.0.0:7400 --server 1=10.0.0.3:7500 --key-file pmnet.keys
///   pmnet client --device 10.0.0.2:7400 --key-file pmnet.keys set greeting hello
#[derive(Debug, Parser)]
#[command(name = "pmnet", version, about, long_about, max_term_width = 100)]
struct Cli {
    /// Read options from this TOML file: a table per command ([device], [server], [client],
    /// [bench], [demo]) whose keys are the long option names, e.g. `listen = "0.0.0.0:7400"`,
    /// `server = ["1=10.0.0.3:7500"]`, `busy-poll = true`. Options on the command line win.
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
    /// Run a PMNet device: log update requests, ack them, forward them to their servers.
    Device(Box<node::DeviceArgs>),
    /// Run a server with its store (the packet store by default) or the ideal handler.
    Server(node::ServerArgs),
    /// Send key-value requests: set, get, del, incr (one-shot, or interactive without a command).
    Client(client::ClientArgs),
    /// Measure latency and throughput: echo, baseline, forward and pmnet modes side by side.
    Bench(Box<bench::BenchArgs>),
    /// Start a device and a server on loopback and compare the modes in one run (< 1 minute).
    Demo(demo::DemoArgs),
    /// Run the deterministic fault-injecting simulator: one seed, or a swarm of seeds.
    Sim(sim::SimArgs),
    /// Run the PMNet server side in front of a real redis-server (see docs/redis.md).
    RedisAdaptor(redis::RedisAdaptorArgs),
    /// Serve unmodified Redis clients (RESP over TCP), each connection a PMNet session.
    Gateway(redis::GatewayArgs),
    /// Put a Redis behind PMNet on this host in one command: device, adaptor and gateway (and
    /// optionally redis-server), placed on CPUs, stopped together (see docs/redis.md).
    RedisUp(redis_up::RedisUpArgs),
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
    /// Make a deployment key file for `--key-file` (see docs/security.md).
    Keygen(keygen::KeygenArgs),
    /// The chain store's client (devices run with --chain-member; docs/netchain.md): get,
    /// put, delete, compare-and-set, lock and unlock.
    Kv(kv::KvArgs),
    /// The chain store's controller: membership, leases, failover and recovery of the
    /// members' chains (docs/netchain.md).
    ChainController(chain_controller::ChainControllerArgs),
    /// Run a memory node of replicated persistent memory: 64-byte lines with their
    /// timestamps in a mapped file, for ABD quorums (docs/abd.md).
    Memnode(memnode::MemnodeArgs),
    /// Read and write lines of replicated persistent memory, through a coordinating device
    /// or running the quorum here (docs/abd.md).
    Memory(memory_cli::MemoryArgs),
    /// Show a running device's or server's state: log occupancy, sessions, recovery, peers,
    /// counters (ADDR: its --metrics address).
    Status(status::StatusArgs),
    /// Look into a device's log file offline: `pmnet log inspect FILE` lists its live entries
    /// and damaged slots, never changing the file.
    Log(log_inspect::LogArgs),
    /// A testbed of hosts on this machine: a client, a device routing between it and a server,
    /// and the server, each in a network namespace (up, down, status, exec; docs/testbed.md).
    Testbed(testbed::TestbedArgs),
}

impl Command {
    /// The table of the configuration file this command reads.
    fn config_table(&self) -> &'static str {
        match self {
            Command::Device(_) => "device",
            Command::Server(_) => "server",
            Command::Client(_) => "client",
            Command::Bench(_) => "bench",
            Command::Demo(_) => "demo",
            Command::Sim(_) => "sim",
            Command::RedisAdaptor(_) => "redis-adaptor",
            Command::Gateway(_) => "gateway",
            Command::RedisUp(_) => "redis-up",
            Command::RedisBench(_) => "redis-bench",
            Command::StoreBench(_) => "store-bench",
            Command::DrainBench(_) => "drain-bench",
            Command::Eval(_) => "eval",
            Command::SessionBench(_) => "session-bench",
            Command::CoordBench(_) => "coord-bench",
            Command::Keygen(_) => "keygen",
            Command::Kv(_) => "kv",
            Command::Memnode(_) => "memnode",
            Command::Memory(_) => "memory",
            Command::ChainController(_) => "chain-controller",
            Command::Status(_) => "status",
            Command::Log(_) => "log",
            Command::Testbed(_) => "testbed",
        }
    }
}

/// The error every command returns: a message for the user.
pub type CliError = Box<dyn std::error::Error + Send + Sync>;

fn main() -> ExitCode {
    let cli = match config::parse_with_config_file() {
        Ok(cli) => cli,
        Err(error) => {
            // clap prints help and version to stdout with status 0, errors to stderr with 2.
            let _ = error.print();
            return ExitCode::from(u8::try_from(error.exit_code()).unwrap_or(2));
        }
    };
    // The simulator's processes are simulated: what they log (the attacker's forgeries
    // dropped, servers found verified, ...) is the world's, thousands of lines a swarm, and a
    // seed's trace says it already. Errors only, unless -v or RUST_LOG asks for more.
    let simulating = matches!(cli.command, Command::Sim(_)) && cli.verbose == 0;
    init_logging(cli.verbose, cli.quiet, simulating);
    let result = match cli.command {
        Command::Device(args) => node::run_device(*args),
        Command::Server(args) => node::run_server(args),
        Command::Client(args) => client::run(args),
        Command::Bench(args) => bench::run(*args),
        Command::Demo(args) => demo::run(args),
        Command::Sim(args) => sim::run(args),
        Command::RedisAdaptor(args) => redis::run_adaptor(args),
        Command::Gateway(args) => redis::run_gateway(args),
        Command::RedisUp(args) => redis_up::run(args),
        Command::RedisBench(args) => redis_bench::run(*args),
        Command::StoreBench(args) => store_bench::run(args),
        Command::DrainBench(args) => drain_bench::run(args),
        Command::Eval(args) => eval::run(args),
        Command::SessionBench(args) => session_bench::run(args),
        Command::CoordBench(args) => coord_bench::run(args),
        Command::Keygen(args) => keygen::run(args),
        Command::Kv(args) => kv::run(args),
        Command::Memnode(args) => memnode::run(args),
        Command::Memory(args) => memory_cli::run(args),
        Command::ChainController(args) => chain_controller::run(args),
        Command::Status(args) => status::run(args),
        Command::Log(args) => log_inspect::run(args),
        Command::Testbed(args) => testbed::run(args),
    };
    match result {
        Ok(code) => code,
        Err(error) => {
            eprintln!("pmnet: error: {error}");
            let mut source = error.source();
            while let Some(cause) = source {
                eprintln!("  caused by: {cause}");
                source = cause.source();
            }
            ExitCode::FAILURE
        }
    }
}

/// pmnet's own crates: the targets `-v` and `-vv` turn up.
const OWN_CRATES: &[&str] = &[
    "pmnet",
    "pmnet_runtime",
    "pmnet_proto",
    "pmnet_redis",
    "pmnet_pm",
    "pmnet_store",
    "pmnet_pktstore",
    "pmnet_sim",
    "pmnet_wire",
    "pmnet_auth",
];

/// Crates of others whose information messages are noise in pmnet's output (a ZooKeeper
/// client's session messages, in `pmnet coord-bench`): warnings only unless RUST_LOG says
/// otherwise.
const QUIET_CRATES: &[&str] = &["zookeeper_client"];

/// The filter `-v`/`-q` stand for when RUST_LOG is not set: info by default, warnings only
/// with `-q`, debug (`-v`) or trace (`-vv`) for pmnet's own crates.
fn filter_for_flags(verbose: u8, quiet: bool) -> String {
    let own = match (quiet, verbose) {
        (true, _) => return "warn".to_owned(),
        (false, 0) => None,
        (false, 1) => Some("debug"),
        (false, _) => Some("trace"),
    };
    let mut filter = "info".to_owned();
    if let Some(own) = own {
        for target in OWN_CRATES {
            filter.push_str(&format!(",{target}={own}"));
        }
    }
    for target in QUIET_CRATES {
        filter.push_str(&format!(",{target}=warn"));
    }
    filter
}

/// Log to stderr. A RUST_LOG filter wins over `-v`/`-q`; one that does not parse is reported
/// and the flags' filter used instead.
fn init_logging(verbose: u8, quiet: bool, errors_only: bool) {
    use tracing_subscriber::EnvFilter;
    let from_flags = || {
        if errors_only {
            EnvFilter::new("error")
        } else {
            EnvFilter::new(filter_for_flags(verbose, quiet))
        }
    };
    let mut problem = None;
    let filter = match std::env::var("RUST_LOG") {
        Ok(text) if !text.trim().is_empty() => match EnvFilter::try_new(&text) {
            Ok(filter) => filter,
            Err(error) => {
                problem = Some(format!(
                    "RUST_LOG={text:?} is not a filter ({error}); logging as -v/-q say"
                ));
                from_flags()
            }
        },
        _ => from_flags(),
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
    if let Some(problem) = problem {
        tracing::warn!("{problem}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_stand_for_filters() {
        assert_eq!(filter_for_flags(0, false), "info,zookeeper_client=warn");
        assert_eq!(filter_for_flags(3, true), "warn");
        assert!(filter_for_flags(1, false).contains(",pmnet_runtime=debug"));
        assert!(filter_for_flags(2, false).contains(",pmnet=trace"));
        for verbose in 0..3 {
            let text = filter_for_flags(verbose, false);
            assert!(
                tracing_subscriber::EnvFilter::try_new(&text).is_ok(),
                "{text}"
            );
        }
    }
}

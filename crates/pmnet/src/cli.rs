//! The `pmnet` command line: the product's commands, parsed (with `--config FILE`) and run;
//! the benchmarks' commands handed to `pmnet-bench` (see `forward.rs`).

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

use crate::forward::{self, Forwarded};
use crate::{
    chain_controller, client, config, controller, demo, generate, keygen, kv, log_inspect, memnode,
    memory_cli, node, redis, redis_up, sim, status, store_cli, testbed,
};

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
#[command(
    name = "pmnet",
    version,
    about,
    long_about,
    verbatim_doc_comment,
    max_term_width = 100
)]
pub struct Cli {
    /// Read options from this TOML file: a table per command ([device], [server], [client],
    /// [demo]; the benchmarks' tables, such as [bench], are pmnet-bench's) whose keys are the
    /// long option names, e.g. `listen = "0.0.0.0:7400"`, `server = ["1=10.0.0.3:7500"]`,
    /// `busy-poll = true`. Options on the command line win.
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<std::path::PathBuf>,

    /// More log output from pmnet's own crates (-v: debug, -vv: trace). A RUST_LOG filter in
    /// the environment (e.g. RUST_LOG=pmnet_runtime=trace) takes precedence over -v and -q.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,

    /// Only warnings and errors (unless RUST_LOG says otherwise).
    #[arg(short, long, global = true)]
    pub quiet: bool,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a PMNet device: log update requests, ack them, forward them to their servers.
    Device(Box<node::DeviceArgs>),
    /// Run a server with its store (the packet store by default) or the ideal handler.
    Server(node::ServerArgs),
    /// Send key-value requests: set, get, del, incr (one-shot, or interactive without a command).
    Client(client::ClientArgs),
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
    /// Make a deployment key file for `--key-file` (see docs/security.md).
    Keygen(keygen::KeygenArgs),
    /// The chain store's client (devices run with --chain-member; docs/netchain.md): get,
    /// put, delete, compare-and-set, lock and unlock.
    Kv(kv::KvArgs),
    /// The chain store's controller with its state in a local file: membership, leases,
    /// failover and recovery of the members' chains (docs/netchain.md).
    ChainController(chain_controller::ChainControllerArgs),
    /// The chain store's controller with its state in etcd: run two or three, one leads and
    /// the others take over when it is lost (docs/netchain.md, "The controller on etcd").
    Controller(controller::ControllerArgs),
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
    /// A stopped server's store, offline: `pmnet store grow` makes it larger (a running
    /// server grows its own up to --data-max-mib; docs/storage.md).
    Store(store_cli::StoreArgs),
    /// A testbed of hosts on this machine: a client, a device routing between it and a server,
    /// and the server, each in a network namespace (up, down, status, exec; docs/testbed.md).
    Testbed(testbed::TestbedArgs),
    /// Print the shell completion script for bash, zsh, fish, elvish or powershell.
    Completions(generate::CompletionsArgs),
    /// Print the manual page of pmnet or of one of its commands (roff), or write them all
    /// into a directory with --out.
    Man(generate::ManArgs),
    // The benchmarks, in the pmnet-bench binary: hidden here, their arguments handed over
    // as they were given.
    #[command(hide = true, disable_help_flag = true)]
    Bench(Forwarded),
    #[command(hide = true, disable_help_flag = true)]
    RedisBench(Forwarded),
    #[command(hide = true, disable_help_flag = true)]
    StoreBench(Forwarded),
    #[command(hide = true, disable_help_flag = true)]
    DrainBench(Forwarded),
    #[command(hide = true, disable_help_flag = true)]
    Eval(Forwarded),
    #[command(hide = true, disable_help_flag = true)]
    SessionBench(Forwarded),
    #[command(hide = true, disable_help_flag = true)]
    CoordBench(Forwarded),
}

/// Run the `pmnet` command line: the `pmnet` binary's `main`.
pub fn main() -> ExitCode {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if let Some(asked) = forward::help_of_bench(&argv) {
        return exit_code("pmnet", forward::to_bench(&asked));
    }
    let cli = match config::parse_with_config_file::<Cli>(&argv, &Cli::command()) {
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
        Command::Demo(args) => demo::run(args),
        Command::Sim(args) => sim::run(args),
        Command::RedisAdaptor(args) => redis::run_adaptor(args),
        Command::Gateway(args) => redis::run_gateway(args),
        Command::RedisUp(args) => redis_up::run(args),
        Command::Keygen(args) => keygen::run(args),
        Command::Kv(args) => kv::run(args),
        Command::Memnode(args) => memnode::run(args),
        Command::Memory(args) => memory_cli::run(args),
        Command::ChainController(args) => chain_controller::run(args),
        Command::Controller(args) => controller::run(args),
        Command::Status(args) => status::run(args),
        Command::Log(args) => log_inspect::run(args),
        Command::Store(args) => store_cli::run(args),
        Command::Testbed(args) => testbed::run(args),
        Command::Completions(args) => generate::run_completions(args, Cli::command()),
        Command::Man(args) => generate::run_man(args, Cli::command()),
        Command::Bench(_)
        | Command::RedisBench(_)
        | Command::StoreBench(_)
        | Command::DrainBench(_)
        | Command::Eval(_)
        | Command::SessionBench(_)
        | Command::CoordBench(_) => forward::to_bench(&argv),
    };
    exit_code("pmnet", result)
}

/// The exit code of a command's result; an error printed with its causes, prefixed with
/// `program`.
pub fn exit_code(program: &str, result: Result<ExitCode, crate::CliError>) -> ExitCode {
    match result {
        Ok(code) => code,
        Err(error) => {
            eprintln!("{program}: error: {error}");
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
    "pmnet_bench",
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
pub fn init_logging(verbose: u8, quiet: bool, errors_only: bool) {
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

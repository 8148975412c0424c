//! `pmnet coord-bench`: the chain store (NetChain in the devices, docs/netchain.md) side by
//! side with real etcd and real ZooKeeper, each a three-member ensemble on loopback started
//! and stopped by the benchmark itself as a user would run it, driven by the same
//! closed-loop load generator: read and write latency and throughput at 1 and 16 clients,
//! and the rate of acquire/release cycles of one lock all clients contend for
//! (docs/benchmarks.md, "Coordination: the chain store against etcd and ZooKeeper").
//!
//! `--read-scaling` measures the chain store alone instead: reads spread over a group's
//! members (CRAQ) against reads at the tail only, with every member's capacity emulated at
//! the same rate, on a read-mostly workload of Zipf-distributed keys.
//!
//! The options are here; the processes and ports in `procs.rs`; each system in a file of its
//! own; the load generator in `load.rs`; tables, ratios and JSON in `report.rs`.

pub(crate) mod etcd;
mod failover;
pub(crate) mod load;
pub(crate) mod netchain;
mod read_scaling;
pub(crate) mod report;
mod zookeeper;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, ValueEnum};
use pmnet_netchain::ReadFrom;
use pmnet_runtime::Shutdown;
use serde::Serialize;

use crate::procs;
use load::{CoordClient, Op, Phase};
use pmnet::loadgen::{KeyDistribution, PopularityKind, Workload};
use pmnet::CliError;
use report::{Report, ResultRow};

/// A system measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum System {
    /// The chain store: three `pmnet device --chain-member` processes.
    Netchain,
    /// Three etcd members (Debian's etcd-server).
    Etcd,
    /// Three ZooKeeper servers (Debian's zookeeper).
    Zookeeper,
}

impl System {
    pub fn name(self) -> &'static str {
        match self {
            System::Netchain => "netchain",
            System::Etcd => "etcd",
            System::Zookeeper => "zookeeper",
        }
    }
}

#[derive(Debug, Clone, Args)]
pub struct CoordBenchArgs {
    /// The systems to measure, in order (comma-separated).
    #[arg(
        long = "system",
        value_name = "LIST",
        value_delimiter = ',',
        default_value = "netchain,etcd,zookeeper"
    )]
    pub systems: Vec<System>,

    /// Client counts to measure each op at (comma-separated; 1 to 256 each).
    #[arg(long, value_name = "LIST", value_delimiter = ',', default_value = "1,16",
          value_parser = parse_clients)]
    pub clients: Vec<u32>,

    /// The ops to measure (comma-separated): read, write, lock (an acquire/release cycle of
    /// one lock all clients contend for).
    #[arg(
        long = "op",
        value_name = "LIST",
        value_delimiter = ',',
        default_value = "read,write,lock"
    )]
    pub ops: Vec<Op>,

    /// Seconds each op is measured, after the warm-up.
    #[arg(long, value_name = "SECONDS", default_value = "5",
          value_parser = |text: &str| pmnet::loadgen::parse_seconds(text, 0.05, 3600.0))]
    pub duration: f64,

    /// Seconds each op runs before it is measured.
    #[arg(long, value_name = "SECONDS", default_value = "1",
          value_parser = |text: &str| pmnet::loadgen::parse_seconds(text, 0.0, 600.0))]
    pub warmup: f64,

    /// Bytes of every value written.
    #[arg(long, value_name = "BYTES", default_value_t = 64,
          value_parser = clap::value_parser!(u16).range(1..=16_384))]
    pub value_size: u16,

    /// Keys read and written (each written once before the measurements).
    #[arg(long, value_name = "N", default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub keys: u64,

    /// The seed of every random choice (keys, values); printed, and taken back to replay a
    /// run's workload.
    #[arg(long, value_name = "N")]
    pub seed: Option<u64>,

    /// Also write the results, with the setting, as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,

    /// The chain store's virtual groups (the devices' --chain-groups). Default: 16; with
    /// --read-scaling, 1 (one chain of the three members).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=4096))]
    pub groups: Option<u16>,

    /// Where the chain members' logs and tables go (removed at the end): /dev/shm is
    /// emulated persistent memory; a directory on a disk with --netchain-flush fdatasync
    /// makes every member's writes as durable as etcd's and ZooKeeper's.
    #[arg(long, value_name = "DIR", default_value = "/dev/shm")]
    pub netchain_dir: PathBuf,

    /// The chain members' --flush (auto, clwb, clflushopt, clflush, msync, fdatasync).
    #[arg(long, value_name = "METHOD", default_value = "auto", value_parser = parse_flush)]
    pub netchain_flush: String,

    /// Where etcd's and ZooKeeper's data directories go (removed at the end; default: the
    /// temporary directory, $TMPDIR or /tmp).
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,

    /// The etcd binary (Debian: `apt-get install etcd-server`).
    #[arg(long, value_name = "PATH", default_value = "etcd")]
    pub etcd: String,

    /// ZooKeeper's jar (Debian: `apt-get install zookeeperd`).
    #[arg(
        long,
        value_name = "PATH",
        default_value = "/usr/share/java/zookeeper.jar"
    )]
    pub zookeeper_jar: PathBuf,

    /// The Java runtime ZooKeeper runs on.
    #[arg(long, value_name = "PATH", default_value = "java")]
    pub java: String,

    /// Measure every op this many times (each system's rounds one after the other, clients
    /// connected afresh for each) and report the round with the median p50, with every
    /// round's p50: a thread's placement on the CPUs changes latencies from one run to the
    /// next.
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=20))]
    pub rounds: u32,

    /// Put every client thread on CPU 0 and every process of the systems on CPU 1 (needs 2
    /// CPUs): each side gets a CPU of its own, so that a system's throughput is what its
    /// three processes do with one CPU, whatever its clients cost. Default: no pinning (the
    /// scheduler places everything).
    #[arg(long)]
    pub pin: bool,

    /// Instead of the comparison: the chain store's read scaling, reads from any member of
    /// a group (CRAQ) against reads at the tail only, every member limited to
    /// --member-max-ops-per-s, on a read-mostly workload (--write-ratio) of keys drawn from
    /// a Zipf distribution (--zipf), with the largest --clients count.
    #[arg(long, conflicts_with = "failover")]
    pub read_scaling: bool,

    /// Instead of the comparison: the chain store with its controller (four members, chains
    /// of three), the largest --clients count writing, one member SIGKILLed after --warmup
    /// and --duration: how long until the writes of the groups it headed complete again, and
    /// the throughput while the spare is copied into every group against before.
    #[arg(long)]
    pub failover: bool,

    /// (--read-scaling) Each member's emulated capacity: chain requests taken per second.
    #[arg(long, value_name = "N", default_value_t = 2000,
          value_parser = pmnet::node::parse_max_ops_per_s)]
    pub member_max_ops_per_s: u64,

    /// (--read-scaling) The share of requests that are writes.
    #[arg(long, value_name = "RATIO", default_value_t = 0.05, value_parser = parse_ratio)]
    pub write_ratio: f64,

    /// (--read-scaling) The Zipf exponent of the keys' popularity.
    #[arg(long, value_name = "S", default_value_t = 0.99, value_parser = parse_zipf)]
    pub zipf: f64,

    /// Authenticate the chain store's datagrams (members, controller, clients) with the
    /// deployment keys in this file (`pmnet keygen`). etcd and ZooKeeper run without
    /// authentication either way.
    #[arg(long, value_name = "FILE")]
    pub key_file: Option<PathBuf>,
}

fn parse_clients(text: &str) -> Result<u32, String> {
    let clients: u32 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a number of clients"))?;
    if !(1..=256).contains(&clients) {
        return Err(format!("{clients} clients: use 1 to 256"));
    }
    Ok(clients)
}

fn parse_flush(text: &str) -> Result<String, String> {
    text.parse::<pmnet_pm::FlushChoice>()
        .map_err(|error| error.to_string())?;
    Ok(text.to_owned())
}

fn parse_ratio(text: &str) -> Result<f64, String> {
    let ratio: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a number from 0 to 1"))?;
    if !(0.0..=1.0).contains(&ratio) {
        return Err(format!("{ratio} is out of range: use 0 to 1"));
    }
    Ok(ratio)
}

fn parse_zipf(text: &str) -> Result<f64, String> {
    let exponent: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a Zipf exponent (e.g. 0.99)"))?;
    if !(exponent > 0.0 && exponent <= 10.0) {
        return Err(format!(
            "{exponent} is out of range: use more than 0, at most 10"
        ));
    }
    Ok(exponent)
}

/// What a run does, from the options.
#[derive(Debug, Clone)]
pub struct Plan {
    pub systems: Vec<System>,
    pub clients: Vec<u32>,
    pub ops: Vec<Op>,
    pub warmup: Duration,
    pub duration: Duration,
    pub rounds: u32,
    pub value_size: usize,
    pub keys: u64,
    pub seed: u64,
    pub groups: u16,
    pub netchain: netchain::ChainSetup,
    pub etcd: etcd::EtcdSetup,
    pub zookeeper: zookeeper::ZooKeeperSetup,
    pub data_dir: PathBuf,
    pub read_scaling: Option<read_scaling::ScalingPlan>,
    pub failover: bool,
    pub json: Option<PathBuf>,
    /// `--pin`: (the clients' CPU, the systems' CPU).
    pub pin: Option<(usize, usize)>,
}

/// `items` without repeats, in their first order.
fn distinct<T: PartialEq + Copy>(items: &[T]) -> Vec<T> {
    let mut out = Vec::new();
    for item in items {
        if !out.contains(item) {
            out.push(*item);
        }
    }
    out
}

impl Plan {
    pub fn from_args(args: &CoordBenchArgs) -> Result<Plan, String> {
        if !args.netchain_dir.is_dir() {
            return Err(format!(
                "--netchain-dir {}: not a directory",
                args.netchain_dir.display()
            ));
        }
        let data_dir = args.data_dir.clone().unwrap_or_else(std::env::temp_dir);
        if !data_dir.is_dir() {
            return Err(format!(
                "--data-dir {}: not a directory",
                data_dir.display()
            ));
        }
        let groups = args
            .groups
            .unwrap_or(if args.read_scaling { 1 } else { 16 });
        let clients = distinct(&args.clients);
        let online = pmnet_runtime::online_cpu_count();
        if args.pin && online < 2 {
            return Err(format!(
                "--pin puts the clients and the systems on CPUs 0 and 1: this machine has \
                 {online} CPU online"
            ));
        }
        let pin = args.pin.then_some((0, 1));
        let system_cpu = pin.map(|(_, systems)| systems);
        let read_scaling = args.read_scaling.then(|| read_scaling::ScalingPlan {
            member_max_ops_per_s: args.member_max_ops_per_s,
            write_ratio: args.write_ratio,
            zipf: args.zipf,
            clients: clients.iter().copied().max().unwrap_or(16),
        });
        Ok(Plan {
            systems: if args.read_scaling {
                vec![System::Netchain]
            } else {
                distinct(&args.systems)
            },
            clients,
            ops: distinct(&args.ops),
            warmup: Duration::from_secs_f64(args.warmup),
            duration: Duration::from_secs_f64(args.duration),
            rounds: args.rounds,
            value_size: usize::from(args.value_size),
            keys: args.keys,
            seed: args.seed.unwrap_or_else(rand::random),
            groups,
            netchain: netchain::ChainSetup {
                dir: args.netchain_dir.clone(),
                flush: args.netchain_flush.clone(),
                groups,
                keys: args.keys,
                value_max: usize::from(args.value_size),
                member_max_ops_per_s: args.read_scaling.then_some(args.member_max_ops_per_s),
                cpu: system_cpu,
                key_file: args.key_file.clone(),
                auth_keys: pmnet::node::keys_of(args.key_file.as_deref())
                    .map_err(|error| error.to_string())?,
            },
            etcd: etcd::EtcdSetup {
                program: args.etcd.clone(),
                dir: data_dir.clone(),
                cpu: system_cpu,
            },
            zookeeper: zookeeper::ZooKeeperSetup {
                java: args.java.clone(),
                jar: args.zookeeper_jar.clone(),
                dir: data_dir.clone(),
                cpu: system_cpu,
            },
            data_dir,
            read_scaling,
            failover: args.failover,
            json: args.json.clone(),
            pin,
        })
    }

    /// The workload of the comparison: keys drawn uniformly.
    fn workload(&self) -> Workload {
        Workload {
            keys: self.keys,
            distribution: KeyDistribution::Uniform,
            zipf_exponent: 1.0,
            update_ratio: 0.0,
            value_len: self.value_size,
            servers: 1,
            popularity: PopularityKind::Static,
            change_every: Duration::from_secs(10),
            change_count: 1,
        }
    }
}

/// A running ensemble of one system.
trait Ensemble {
    fn client(&self, index: u32) -> Result<Box<dyn CoordClient>, CliError>;
    /// Its processes.
    fn pids(&self) -> Vec<u32>;
    /// Version and durability, for the setting.
    fn durability(&self) -> String;
}

impl Ensemble for netchain::ChainStore {
    fn pids(&self) -> Vec<u32> {
        netchain::ChainStore::pids(self)
    }

    fn client(&self, index: u32) -> Result<Box<dyn CoordClient>, CliError> {
        let client = netchain::ChainStore::client(
            self,
            index,
            ReadFrom::AnyMember,
            Duration::from_millis(5),
        )?;
        Ok(Box::new(client))
    }

    fn durability(&self) -> String {
        format!(
            "pmnet {}; 3 members, {} virtual groups; each member's table on {}; a write is \
             acknowledged by the tail once durable at every member; reads linearizable (any \
             member answers a committed key, a dirty one is read at the tail)",
            env!("CARGO_PKG_VERSION"),
            self.groups,
            self.medium
        )
    }
}

impl Ensemble for etcd::EtcdCluster {
    fn pids(&self) -> Vec<u32> {
        etcd::EtcdCluster::pids(self)
    }

    fn client(&self, index: u32) -> Result<Box<dyn CoordClient>, CliError> {
        Ok(Box::new(etcd::EtcdCluster::client(self, index)?))
    }

    fn durability(&self) -> String {
        etcd::EtcdCluster::durability(self)
    }
}

impl Ensemble for zookeeper::ZooKeeperEnsemble {
    fn pids(&self) -> Vec<u32> {
        zookeeper::ZooKeeperEnsemble::pids(self)
    }

    fn client(&self, index: u32) -> Result<Box<dyn CoordClient>, CliError> {
        Ok(Box::new(zookeeper::ZooKeeperEnsemble::client(self, index)?))
    }

    fn durability(&self) -> String {
        zookeeper::ZooKeeperEnsemble::durability(self)
    }
}

/// Start `system`'s ensemble.
fn start(system: System, plan: &Plan, shutdown: &Shutdown) -> Result<Box<dyn Ensemble>, CliError> {
    Ok(match system {
        System::Netchain => Box::new(netchain::ChainStore::start(&plan.netchain, shutdown)?),
        System::Etcd => Box::new(etcd::EtcdCluster::start(&plan.etcd, shutdown)?),
        System::Zookeeper => Box::new(zookeeper::ZooKeeperEnsemble::start(
            &plan.zookeeper,
            shutdown,
        )?),
    })
}

/// `count` clients of `ensemble`, numbered from 0.
fn clients(ensemble: &dyn Ensemble, count: u32) -> Result<Vec<Box<dyn CoordClient>>, CliError> {
    (0..count).map(|index| ensemble.client(index)).collect()
}

/// Give every key its first value, with up to 16 clients in parallel.
fn preload(ensemble: &dyn Ensemble, plan: &Plan, shutdown: &Shutdown) -> Result<(), CliError> {
    let mut loaders = clients(ensemble, plan.keys.min(16) as u32)?;
    let value = load::value_of(plan.seed, plan.value_size);
    load::preload(&mut loaders, plan.keys, &value, shutdown)
}

/// Run `phase` and measure the CPU time the ensemble's processes (`pids`) and the clients
/// (this process) spend on it, per request. (`pmnet bench --abd` measures with it too.)
pub(crate) fn run_phase(
    clients: &mut [Box<dyn CoordClient>],
    phase: &Phase,
    shutdown: &Shutdown,
    pids: &[u32],
) -> Result<(load::Measured, report::CpuPerOp), CliError> {
    let servers = procs::cpu_seconds_of_all(pids);
    let own = pmnet_runtime::metrics::process_cpu_seconds();
    let machine = procs::machine_busy_seconds();
    let started = std::time::Instant::now();
    let measured = load::run_phase(clients, phase, shutdown)?;
    let elapsed = started.elapsed().as_secs_f64();
    let servers = procs::cpu_seconds_of_all(pids) - servers;
    let own = pmnet_runtime::metrics::process_cpu_seconds() - own;
    // What the rest of the machine used meanwhile: other processes disturb the figures.
    let others = machine
        .zip(procs::machine_busy_seconds())
        .map(|(before, after)| ((after - before - servers - own) / elapsed).max(0.0));
    let per_op = |seconds: f64| {
        let us = seconds * 1e6 / measured.completed.max(1) as f64;
        (us * 10.0).round() / 10.0
    };
    let cpu = report::CpuPerOp {
        servers: per_op(servers),
        clients: per_op(own),
        others_cpus: others.map(|cpus| (cpus * 100.0).round() / 100.0),
    };
    Ok((measured, cpu))
}

/// Measure every op at every client count on `system`; false if a signal cut it short.
fn measure(
    system: System,
    plan: &Plan,
    shutdown: &Shutdown,
    report: &mut Report,
) -> Result<bool, CliError> {
    eprintln!("{}: starting 3 members ...", system.name());
    let ensemble = start(system, plan, shutdown)?;
    let durability = ensemble.durability();
    eprintln!("{}: running ({durability})", system.name());
    report.durability.push((system, durability));
    eprintln!(
        "{}: writing {} keys of {} bytes ...",
        system.name(),
        plan.keys,
        plan.value_size
    );
    preload(ensemble.as_ref(), plan, shutdown)?;
    // Every round's row of each (clients, op), in the order measured.
    let mut rounds: Vec<Vec<ResultRow>> = Vec::new();
    for round in 0..plan.rounds {
        let mut index = 0;
        for &count in &plan.clients {
            let mut clients = clients(ensemble.as_ref(), count)?;
            for &op in &plan.ops {
                let Some(row) = measure_op(
                    system,
                    op,
                    (round, &mut clients),
                    plan,
                    shutdown,
                    &*ensemble,
                )?
                else {
                    // What was measured before the signal is reported.
                    report.results.extend(rounds.into_iter().map(median_round));
                    return Ok(false);
                };
                if round == 0 {
                    rounds.push(Vec::new());
                }
                rounds[index].push(row);
                index += 1;
            }
        }
    }
    report.results.extend(rounds.into_iter().map(median_round));
    Ok(true)
}

/// One op at one client count, round `round`; `None` if a signal cut it short.
fn measure_op(
    system: System,
    op: Op,
    (round, clients): (u32, &mut [Box<dyn CoordClient>]),
    plan: &Plan,
    shutdown: &Shutdown,
    ensemble: &dyn Ensemble,
) -> Result<Option<ResultRow>, CliError> {
    let count = clients.len() as u32;
    let label = if plan.rounds > 1 {
        format!(
            "  {:<9} {:<5} {count:>3} clients, round {}/{}",
            system.name(),
            op.name(),
            round + 1,
            plan.rounds
        )
    } else {
        format!("  {:<9} {:<5} {count:>3} clients", system.name(), op.name())
    };
    eprintln!(
        "{label}: {:.1} s warm-up, {:.1} s measured ...",
        plan.warmup.as_secs_f64(),
        plan.duration.as_secs_f64()
    );
    let phase = Phase {
        op,
        workload: plan.workload(),
        seed: plan.seed,
        warmup: plan.warmup,
        duration: plan.duration,
        client_cpu: plan.pin.map(|(clients, _)| clients),
    };
    let (measured, cpu) = run_phase(clients, &phase, shutdown, &ensemble.pids())
        .map_err(|error| format!("{} {}: {error}", system.name(), op.name()))?;
    if measured.interrupted {
        return Ok(None);
    }
    let mut row = ResultRow::new(system, op, count, &measured);
    row.cpu_us_per_op = Some(cpu);
    eprintln!("{label}: {}", row.brief());
    Ok(Some(row))
}

/// The round whose p50 is the median of the rounds', with every round's p50 noted.
fn median_round(mut rows: Vec<ResultRow>) -> ResultRow {
    assert!(!rows.is_empty(), "at least one round");
    let p50s: Vec<f64> = rows.iter().map(|row| row.p50_us).collect();
    rows.sort_by(|a, b| a.p50_us.total_cmp(&b.p50_us));
    let mut median = rows.swap_remove(rows.len() / 2);
    if p50s.len() > 1 {
        median.p50_us_rounds = Some(p50s);
    }
    median
}

pub fn run(args: CoordBenchArgs) -> Result<ExitCode, CliError> {
    let plan = Plan::from_args(&args)?;
    let shutdown = Shutdown::on_signals()?;
    let removed = procs::remove_stale_dirs(&[&plan.netchain.dir, &plan.data_dir]);
    if removed > 0 {
        eprintln!("(removed {removed} directories an earlier run left when it was killed)");
    }
    eprintln!(
        "coord-bench: seed {} (--seed {} replays the workload)",
        plan.seed, plan.seed
    );
    if plan.failover {
        return match failover::run(&plan, &shutdown) {
            Ok(_) => Ok(ExitCode::SUCCESS),
            Err(error) if shutdown.is_requested() => {
                eprintln!("coord-bench: interrupted ({error})");
                Ok(ExitCode::from(130))
            }
            Err(error) => Err(error),
        };
    }
    let mut report = Report::new(&plan);
    // An error while a signal asks to stop (a start-up cut short) is the interruption.
    let interrupted = |error: CliError| {
        if shutdown.is_requested() {
            Ok(())
        } else {
            Err(error)
        }
    };
    if let Some(scaling) = &plan.read_scaling {
        match read_scaling::run(&plan, scaling, &shutdown) {
            Ok(outcome) => {
                report.interrupted = outcome.interrupted;
                report
                    .durability
                    .push((System::Netchain, outcome.durability.clone()));
                report.results.extend(outcome.rows.iter().cloned());
                report.read_scaling = Some(outcome.summary);
            }
            Err(error) => {
                interrupted(error)?;
                report.interrupted = true;
            }
        }
    } else {
        for &system in &plan.systems {
            match measure(system, &plan, &shutdown, &mut report) {
                Ok(true) => continue,
                Ok(false) => {}
                Err(error) => interrupted(error)?,
            }
            report.interrupted = true;
            break;
        }
        report.compute_ratios();
    }
    print!("{}", report.text());
    if let Some(path) = &plan.json {
        report.write_json(path)?;
        println!("JSON written to {}", path.display());
    }
    Ok(if report.interrupted {
        ExitCode::from(130)
    } else {
        ExitCode::SUCCESS
    })
}

#[cfg(test)]
pub(crate) mod tests_support {
    use clap::Parser;

    use super::CoordBenchArgs;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: CoordBenchArgs,
    }

    /// The options of `pmnet coord-bench WORDS`, or clap's error.
    pub fn parse(words: &[&str]) -> Result<CoordBenchArgs, String> {
        let mut all = vec!["coord-bench"];
        all.extend(words);
        Cli::try_parse_from(all)
            .map(|cli| cli.args)
            .map_err(|error| error.to_string())
    }

    pub fn default_args() -> CoordBenchArgs {
        parse(&[]).expect("the defaults parse")
    }
}

#[cfg(test)]
mod tests {
    use super::tests_support::parse;
    use super::*;

    #[test]
    fn the_defaults_measure_every_system_and_op_at_1_and_16_clients() {
        let args = parse(&[]).unwrap();
        let plan = Plan::from_args(&args).unwrap();
        assert_eq!(
            plan.systems,
            [System::Netchain, System::Etcd, System::Zookeeper]
        );
        assert_eq!(plan.clients, [1, 16]);
        assert_eq!(plan.ops, [Op::Read, Op::Write, Op::Lock]);
        assert_eq!(plan.value_size, 64);
        assert_eq!(plan.groups, 16);
        assert_eq!(plan.duration, Duration::from_secs(5));
        assert!(plan.read_scaling.is_none());
        assert_eq!(plan.netchain.member_max_ops_per_s, None);
        assert_eq!(plan.pin, None);
        assert_eq!(plan.etcd.cpu, None);
    }

    #[test]
    fn pin_puts_the_clients_and_the_systems_on_a_cpu_each() {
        let plan = Plan::from_args(&parse(&["--pin"]).unwrap());
        if pmnet_runtime::online_cpu_count() < 2 {
            assert!(plan.unwrap_err().contains("--pin"));
            return;
        }
        let plan = plan.unwrap();
        assert_eq!(plan.pin, Some((0, 1)));
        assert_eq!(
            (plan.netchain.cpu, plan.etcd.cpu, plan.zookeeper.cpu),
            (Some(1), Some(1), Some(1))
        );
    }

    #[test]
    fn the_median_round_by_p50_is_kept_with_every_round_s_p50() {
        let row = |p50_us: f64| {
            let measured = load::Measured {
                count: 10,
                p50_us,
                p99_us: p50_us * 2.0,
                ..load::Measured::default()
            };
            ResultRow::new(System::Etcd, Op::Read, 1, &measured)
        };
        let median = median_round(vec![row(30.0), row(10.0), row(20.0)]);
        assert_eq!(median.p50_us, 20.0);
        assert_eq!(median.p99_us, 40.0);
        assert_eq!(median.p50_us_rounds, Some(vec![30.0, 10.0, 20.0]));
        let single = median_round(vec![row(5.0)]);
        assert_eq!((single.p50_us, single.p50_us_rounds), (5.0, None));
    }

    #[test]
    fn lists_are_taken_in_order_without_repeats() {
        let args = parse(&[
            "--system",
            "zookeeper,netchain,zookeeper",
            "--clients",
            "4,2,4",
        ])
        .unwrap();
        let plan = Plan::from_args(&args).unwrap();
        assert_eq!(plan.systems, [System::Zookeeper, System::Netchain]);
        assert_eq!(plan.clients, [4, 2]);
    }

    #[test]
    fn read_scaling_measures_one_chain_of_capacity_limited_members() {
        let args = parse(&[
            "--read-scaling",
            "--clients",
            "1,8",
            "--member-max-ops-per-s",
            "500",
        ])
        .unwrap();
        let plan = Plan::from_args(&args).unwrap();
        assert_eq!(plan.systems, [System::Netchain]);
        assert_eq!(plan.groups, 1);
        assert_eq!(plan.netchain.member_max_ops_per_s, Some(500));
        let scaling = plan.read_scaling.unwrap();
        assert_eq!(scaling.clients, 8);
        assert_eq!(scaling.zipf, 0.99);
        assert_eq!(scaling.write_ratio, 0.05);
        let args = parse(&["--read-scaling", "--groups", "16"]).unwrap();
        assert_eq!(Plan::from_args(&args).unwrap().groups, 16);
    }

    #[test]
    fn bad_options_are_refused_with_what_is_accepted() {
        let cases: &[(&[&str], &str)] = &[
            (
                &["--system", "redis"],
                "possible values: netchain, etcd, zookeeper",
            ),
            (&["--clients", "0"], "use 1 to 256"),
            (&["--clients", "1,x"], "not a number of clients"),
            (&["--op", "mixed"], "possible values: read, write, lock"),
            (&["--duration", "0"], "out of range"),
            (&["--duration=-1"], "out of range"),
            (&["--value-size", "0"], "not in 1..=16384"),
            (&["--keys", "0"], "not in 1..=100000"),
            (&["--netchain-flush", "sometimes"], "sometimes"),
            (&["--write-ratio", "1.5"], "use 0 to 1"),
            (&["--zipf", "0"], "out of range"),
            (&["--member-max-ops-per-s", "0"], "out of range"),
            (&["--groups", "0"], "not in 1..=4096"),
            (&["--rounds", "0"], "not in 1..=20"),
        ];
        for (words, expected) in cases {
            let error = parse(words).expect_err(&format!("{words:?} is refused"));
            assert!(error.contains(expected), "{words:?}: {error}");
        }
        let args = parse(&["--netchain-dir", "/nonexistent/dir"]).unwrap();
        assert!(Plan::from_args(&args)
            .unwrap_err()
            .contains("--netchain-dir /nonexistent/dir: not a directory"));
        let args = parse(&["--data-dir", "/nonexistent/dir"]).unwrap();
        assert!(Plan::from_args(&args).unwrap_err().contains("--data-dir"));
    }
}

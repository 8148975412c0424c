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
//! The options and the plan they make are in `plan.rs`; the processes and ports in
//! `crate::procs`; each system in a file of its own; the load generator in `load.rs`, the CPU
//! a phase costs in `cpu.rs`; tables, ratios and JSON in `report.rs`.

pub(crate) mod cpu;
pub(crate) mod etcd;
mod failover;
pub(crate) mod load;
pub(crate) mod netchain;
mod plan;
mod read_scaling;
pub(crate) mod report;
mod zookeeper;

use std::process::ExitCode;
use std::time::Duration;

use pmnet_netchain::ReadFrom;
use pmnet_runtime::Shutdown;

use crate::procs;
use load::{CoordClient, Op, Phase};
use pmnet::CliError;
use report::{Report, ResultRow};

use cpu::run_phase;
pub use plan::CoordBenchArgs;
use plan::{Plan, System};

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

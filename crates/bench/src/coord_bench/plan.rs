//! `pmnet coord-bench`'s options, the systems it measures, and the [`Plan`] they make.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};
use serde::Serialize;

use super::load::Op;
use super::{etcd, netchain, zookeeper};
use pmnet::loadgen::{KeyDistribution, PopularityKind, Workload};

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
    pub read_scaling: Option<ScalingPlan>,
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
        let read_scaling = args.read_scaling.then(|| ScalingPlan {
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
    pub fn workload(&self) -> Workload {
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

/// The read-scaling options.
#[derive(Debug, Clone)]
pub struct ScalingPlan {
    pub member_max_ops_per_s: u64,
    pub write_ratio: f64,
    pub zipf: f64,
    pub clients: u32,
}

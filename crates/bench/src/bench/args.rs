//! `pmnet-bench bench`'s options: the load generator's ([`LoadArgs`], shared with `pmnet
//! demo`) and those of the parts that start processes of their own, replicated memory
//! (`--abd`, `abd.rs`), the device in the path (`--in-path`, `inpath.rs`) and automatic
//! failover of devices in series (`--device-failover`, `device_failover.rs`).

use std::ops::{Deref, DerefMut};
use std::path::PathBuf;

use clap::{Args, ValueEnum};
use pmnet::loadgen::{LoadArgs, MAX_CLIENTS};
use serde::Serialize;

/// `pmnet-bench bench`'s options.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    #[command(flatten)]
    pub load: LoadArgs,

    #[command(flatten)]
    pub abd: AbdArgs,

    #[command(flatten)]
    pub inpath: InPathArgs,

    #[command(flatten)]
    pub failover: DeviceFailoverArgs,
}

impl Deref for BenchArgs {
    type Target = LoadArgs;

    fn deref(&self) -> &LoadArgs {
        &self.load
    }
}

impl DerefMut for BenchArgs {
    fn deref_mut(&mut self) -> &mut LoadArgs {
        &mut self.load
    }
}

/// `pmnet bench`'s replicated-memory options.
#[derive(Debug, Clone, Args)]
pub struct AbdArgs {
    /// Instead of the usual modes: replicated memory (docs/abd.md), reads and writes of one
    /// 64-byte line, side by side in one run: one memory node through a device
    /// (unreplicated), three nodes with the quorum run by the clients (client-abd) and by a
    /// device (device-abd), a three-member etcd (a line as a key), and device-abd with one
    /// node SIGKILLed; at 1 client and at --clients (default 16). Every process is started
    /// here and stopped at the end. Uses --duration, --warmup, --rounds (default 3), --keys
    /// (lines, default 4096), --dir (the nodes' files), --flush, --seed, --json,
    /// --client-cpu, --server-cpu (memory nodes and etcd), --device-cpu.
    #[arg(long)]
    pub abd: bool,

    /// (--abd) The systems to measure, in order (comma-separated).
    #[arg(
        long = "abd-system",
        value_name = "LIST",
        value_delimiter = ',',
        default_value = "unreplicated,client-abd,device-abd,etcd,device-abd-killed",
        requires = "abd"
    )]
    pub systems: Vec<AbdSystem>,

    /// (--abd) The etcd binary (Debian: `apt-get install etcd-server`).
    #[arg(long, value_name = "PATH", default_value = "etcd", requires = "abd")]
    pub etcd: String,

    /// (--abd) Where etcd's data directories go (removed at the end; default: $TMPDIR or
    /// /tmp).
    #[arg(long, value_name = "DIR", requires = "abd")]
    pub etcd_data_dir: Option<PathBuf>,
}

/// A system measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum AbdSystem {
    /// One memory node through a device: no replication.
    Unreplicated,
    /// Three memory nodes, the quorum run by the clients.
    ClientAbd,
    /// Three memory nodes, the quorum run by a device.
    DeviceAbd,
    /// Three etcd members, a line as a key.
    Etcd,
    /// device-abd with one of the three nodes SIGKILLed.
    DeviceAbdKilled,
}

impl AbdSystem {
    pub fn name(self) -> &'static str {
        match self {
            AbdSystem::Unreplicated => "unreplicated",
            AbdSystem::ClientAbd => "client-abd",
            AbdSystem::DeviceAbd => "device-abd",
            AbdSystem::Etcd => "etcd",
            AbdSystem::DeviceAbdKilled => "device-abd-killed",
        }
    }

    /// The name in the table.
    pub fn label(self) -> &'static str {
        match self {
            AbdSystem::DeviceAbdKilled => "device-abd, 1 of 3 killed",
            other => other.name(),
        }
    }

    /// Whether the system runs on the memory of three nodes.
    pub fn on_three_nodes(self) -> bool {
        matches!(
            self,
            AbdSystem::ClientAbd | AbdSystem::DeviceAbd | AbdSystem::DeviceAbdKilled
        )
    }
}

/// Client threads of the capacity part unless told otherwise.
const CAPACITY_CLIENTS: u32 = 4;
/// `pmnet bench`'s in-path options.
#[derive(Debug, Clone, Args)]
pub struct InPathArgs {
    /// Instead of the usual modes: the device in the path (docs/inpath.md) on a testbed of its
    /// own, built and taken down by the run: forwarding of other traffic (kernel against the
    /// in-path device), update capacity (in-path AF_XDP against the UDP-socket device), ack
    /// latency (against a UDP echo, blocking and busy-polling) and updates under load
    /// (against clients talking to the server directly). Needs root and XDP on veth. Uses
    /// --duration, --warmup, --rounds, --clients (load, default 16), --window (capacity,
    /// default 16), --payload, --seed, --json, --dir, --flush, --ideal, --engine, --data-mib,
    /// --slots, --client-cpu, --device-cpu and --server-cpu (the processes' --cpu).
    #[arg(long)]
    pub in_path: bool,

    /// (--in-path) The parts to run (comma-separated): forwarding, capacity, latency, load.
    #[arg(
        long = "in-path-parts",
        value_name = "LIST",
        value_enum,
        value_delimiter = ',',
        default_value = "forwarding,capacity,latency,load",
        requires = "in_path"
    )]
    pub parts: Vec<Part>,

    /// (--in-path) Client threads of the capacity part, each keeping --window updates in
    /// flight.
    #[arg(long, value_name = "N", default_value_t = CAPACITY_CLIENTS, requires = "in_path",
          value_parser = clap::value_parser!(u32).range(1..=MAX_CLIENTS as i64))]
    pub in_path_capacity_clients: u32,

    /// (--in-path) How the in-path device attaches its XDP program (its --xdp-mode): native
    /// (in the veth driver; the product's default) or generic (in the kernel's skb path).
    #[arg(long, value_name = "MODE", default_value = "native", requires = "in_path",
          value_parser = ["native", "generic"])]
    pub in_path_xdp_mode: String,
}

/// `pmnet bench`'s options for automatic failover of devices in series.
#[derive(Debug, Clone, Args)]
pub struct DeviceFailoverArgs {
    /// Instead of the usual modes: automatic failover of devices in series
    /// (docs/replication.md, "Automatic failover"), every process started as a user starts
    /// it: `pmnet controller --device-chain` (with a one-member etcd of its own), a `pmnet
    /// server` and four `pmnet device` with --controller (three in series, one spare). Clients
    /// write all the time (one SET at a time each, --replicas R, default 2, following the
    /// controller); the middle device is SIGKILLed, then the first. Measured per round: how
    /// long after each kill every client's writes are acknowledged again (target: within
    /// 200 ms) and the writes per second from the middle device's kill until the spare joined
    /// plus one second, against the second before the kill (target: at most 20 % less). Uses
    /// --rounds (default 5), --clients (default 4), --replicas (one value, 1 to 3), --payload,
    /// --warmup, --dir (the devices' logs and the server's store), --flush, --json.
    #[arg(long)]
    pub device_failover: bool,

    /// (--device-failover) The devices' and the server's --heartbeat-ms: between two statuses
    /// to the controller.
    #[arg(long, value_name = "MS", default_value_t = 10, requires = "device_failover",
          value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub heartbeat_ms: u64,

    /// (--device-failover) The controller's --suspect-after-ms: a device silent this long is
    /// taken out of its chain.
    #[arg(long, value_name = "MS", default_value_t = 100, requires = "device_failover",
          value_parser = clap::value_parser!(u64).range(5..=60_000))]
    pub suspect_after_ms: u64,
}

/// A part of the comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Part {
    Forwarding,
    Capacity,
    Latency,
    Load,
}

impl Part {
    pub fn name(self) -> &'static str {
        match self {
            Part::Forwarding => "forwarding",
            Part::Capacity => "capacity",
            Part::Latency => "latency",
            Part::Load => "load",
        }
    }
}

#[cfg(test)]
pub mod tests {
    use clap::Parser;

    use super::BenchArgs;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        bench: BenchArgs,
    }

    /// `pmnet-bench bench ARGS`'s options.
    pub fn parse(args: &[&str]) -> Result<BenchArgs, String> {
        let argv = std::iter::once("bench").chain(args.iter().copied());
        Cli::try_parse_from(argv)
            .map(|cli| cli.bench)
            .map_err(|error| error.to_string())
    }
}

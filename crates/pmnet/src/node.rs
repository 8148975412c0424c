//! `pmnet device` and `pmnet server`: the long-running processes.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, ValueEnum};
use pmnet_pm::{FlushChoice, MmapOptions};
use pmnet_runtime::{
    auth_text, load_key_file, DeviceOptions, DeviceRuntime, KeySet, LogOptions, LoopOptions,
    ServerOptions, ServerRuntime, Shutdown, StoreOptions, WaitMode,
};

use crate::CliError;

/// How the event loop of a process on the data path runs.
#[derive(Debug, Clone, Args)]
pub struct LoopArgs {
    /// Spin instead of sleeping while idle: lowest latency, burns a CPU. Without it the loop
    /// sleeps in ppoll, and each wake-up on a virtual machine costs tens of microseconds.
    #[arg(long)]
    pub busy_poll: bool,

    /// Spin for this many microseconds after the last work before sleeping (0: sleep at
    /// once): a busy peer's next datagram finds the loop awake, an idle loop costs no CPU.
    /// `--busy-poll` overrides it.
    #[arg(long, value_name = "MICROSECONDS", default_value_t = 0)]
    pub spin_us: u32,

    /// Pin the event loop to this CPU (0-based).
    #[arg(long, value_name = "CPU")]
    pub cpu: Option<usize>,

    /// Serve counters in the Prometheus text format on this TCP address (e.g. 127.0.0.1:9400).
    #[arg(long, value_name = "ADDR", value_parser = crate::addr::parse_addr)]
    pub metrics: Option<SocketAddr>,

    /// Log a line of counters this often, in seconds (0: never).
    #[arg(long, value_name = "SECONDS", default_value_t = 10)]
    pub report_interval: u64,

    /// Authenticate every datagram with the deployment keys in this file (mode 0600; make one
    /// with `pmnet keygen`). Without it traffic is not authenticated, and only loopback
    /// addresses may be listened on (protected mode; see --insecure).
    #[arg(long, value_name = "FILE")]
    pub key_file: Option<PathBuf>,

    /// Listen on an address other hosts reach without --key-file: traffic is then not
    /// authenticated (anyone who reaches the process can forge writes and acks), and a warning
    /// says so at start and at most once a minute while other hosts send to it. Without it
    /// such a process refuses to start (protected mode, docs/security.md).
    #[arg(long)]
    pub insecure: bool,
}

impl LoopArgs {
    pub fn loop_options(&self) -> LoopOptions {
        LoopOptions {
            wait: self.wait_mode(),
            cpu: self.cpu,
            report_interval: (self.report_interval > 0)
                .then(|| Duration::from_secs(self.report_interval)),
            metrics_listen: self.metrics,
            ..LoopOptions::default()
        }
    }

    /// `--busy-poll`, else `--spin-us`.
    pub fn wait_mode(&self) -> WaitMode {
        WaitMode::from_args(self.busy_poll, self.spin_us)
    }

    /// The deployment keys of `--key-file`, if given.
    pub fn keys(&self) -> Result<Option<KeySet>, CliError> {
        keys_of(self.key_file.as_deref())
    }

    /// Protected mode for `command` listening on `listeners` (see `crate::protect`).
    pub fn protect(
        &self,
        command: &str,
        listeners: &[crate::protect::Listener],
        keys: Option<&KeySet>,
    ) -> Result<(), CliError> {
        crate::protect::check(command, listeners, keys.is_some(), self.insecure)
    }

    /// `metrics`: the address the endpoint is bound to (the real port when 0 was asked for).
    pub(crate) fn describe(&self, metrics: Option<SocketAddr>) -> String {
        format!(
            "wait: {}; cpu: {}; metrics: {}",
            self.wait_mode().describe(),
            self.cpu
                .map_or_else(|| "not pinned".to_owned(), |cpu| format!("pinned to {cpu}")),
            metrics.map_or_else(|| "off".to_owned(), |addr| format!("http://{addr}/metrics")),
        )
    }
}

/// The deployment keys in the key file at `path`, if one is given: a file that cannot be
/// used is refused with a message naming it (and the line at fault).
pub fn keys_of(path: Option<&std::path::Path>) -> Result<Option<KeySet>, CliError> {
    Ok(match path {
        Some(path) => Some(load_key_file(path)?),
        None => None,
    })
}

/// How a memory-mapped file is made durable.
#[derive(Debug, Clone, Args)]
pub struct MediumArgs {
    /// How writes are made durable: auto (on DAX or tmpfs the best cache-line flush the CPU
    /// has, on a disk's file system fdatasync), clwb, clflushopt, clflush (cache-line flushes:
    /// real PM on DAX, emulated PM on tmpfs, only the page cache on a disk), msync or fdatasync
    /// (written to the disk: survives a power loss; slower).
    #[arg(long, value_name = "METHOD", default_value = "auto", value_parser = parse_flush)]
    pub flush: FlushChoice,

    /// Busy-wait this many nanoseconds after every persist, to emulate a slower medium.
    #[arg(long, value_name = "NS", default_value_t = 0)]
    pub persist_latency_ns: u64,

    /// The directory of the files not given a path of their own (the log, the store, the
    /// table). Default: $STATE_DIRECTORY (systemd), else /var/lib/pmnet for root, else
    /// $XDG_STATE_HOME/pmnet or ~/.local/state/pmnet; `--dir /dev/shm` keeps them in memory
    /// (emulated PM, lost on reboot).
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,

    /// Erase the file and start empty, even if it holds data (its contents are lost). Without
    /// it a missing file is made, and an existing one that is empty, short, or whose superblock
    /// is blank or corrupt is an error (it may have held acknowledged updates).
    #[arg(long)]
    pub format: bool,
}

impl MediumArgs {
    /// The default path of the file named `name`: in the state directory (`--dir`).
    pub(crate) fn default_file(&self, name: &str) -> PathBuf {
        crate::state_dir::default_file(self.dir.as_deref(), name)
    }

    pub(crate) fn mmap_options(&self) -> MmapOptions {
        MmapOptions {
            flush: self.flush,
            added_latency_ns: self.persist_latency_ns,
        }
    }
}

fn parse_flush(text: &str) -> Result<FlushChoice, String> {
    text.parse::<FlushChoice>()
        .map_err(|error| error.to_string())
}

/// `ID=ADDR`: a server id and its address.
fn parse_server(text: &str) -> Result<(u16, SocketAddr), String> {
    let (id, addr) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?} is not ID=ADDR; write for example 1=127.0.0.1:7500"))?;
    let id = id
        .trim()
        .parse::<u16>()
        .map_err(|_| format!("server id {id:?} is not a number from 0 to 65535"))?;
    let addr = crate::addr::parse_addr(addr).map_err(|error| format!("server {id}: {error}"))?;
    Ok((id, addr))
}

#[derive(Debug, Clone, Args)]
pub struct DeviceArgs {
    /// Where clients (and servers) reach the device.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7400", value_parser = crate::addr::parse_addr)]
    pub listen: SocketAddr,

    /// A server behind the device, as ID=ADDR (repeat for several: the "switch" deployment; one
    /// is the "NIC" deployment). Each needs its own id, and none may be the device's own
    /// address.
    #[arg(long = "server", value_name = "ID=ADDR", required_unless_present = "abd_nodes",
          value_parser = parse_server)]
    pub servers: Vec<(u16, SocketAddr)>,

    /// A device before this one in a chain of devices in series, as ID=ADDR (the server id
    /// it forwards for and its address; repeat for several). The server asks the last device
    /// of a chain about a gap in a session; this device passes the question on to the ones
    /// named here and answers only once they did, so the server never skips an update a
    /// device before it holds (docs/replication.md). The client's address a device named here
    /// carries with an update is believed: this device acks that client directly (R devices,
    /// R + 1 hops); anyone else's is ignored and its source acked. Every device after the
    /// first of a chain needs it; a probe from a device not named here draws a warning.
    #[arg(long = "previous-device", value_name = "ID=ADDR", value_parser = parse_server)]
    pub previous_devices: Vec<(u16, SocketAddr)>,

    /// The device's id, named in every PMNet-ACK it sends.
    #[arg(long, value_name = "ID", default_value_t = 1)]
    pub device_id: u16,

    /// The persistent log: a file mapped in memory. On a DAX file system it is real PM; under
    /// /dev/shm, emulated PM (survives a process crash, not a power loss); on a disk, written
    /// to the disk with fdatasync (--flush auto). Default: pmnet-device-<ID>.log in --dir.
    #[arg(long, value_name = "PATH")]
    pub log_file: Option<PathBuf>,

    /// Slots of a new log (one logged request fragment each).
    #[arg(long, value_name = "N", default_value_t = 32_768)]
    pub slots: u32,

    /// Bytes per slot of a new log, including a 64-byte slot header; a request fragment larger
    /// than slot size - 64 is forwarded without logging.
    #[arg(long, value_name = "BYTES", default_value_t = 2048)]
    pub slot_size: u32,

    /// Run without a log: forward everything, ack nothing (a plain switch).
    #[arg(long)]
    pub no_log: bool,

    /// Logged entries resent to one server and not yet acked, at most: the backlog after a
    /// server outage is replayed in order at the pace the server acks it.
    #[arg(long, value_name = "N", default_value_t = 256,
          value_parser = clap::value_parser!(u32).range(1..=1_048_576))]
    pub resends_in_flight: u32,

    /// Milliseconds a logged entry waits at least for its server's ack before it is resent
    /// (then with backoff; the device waits longer for a server whose acks take longer). Size
    /// it above the longest queue a server may have: a resend a server did not need costs it a
    /// duplicate to answer.
    #[arg(long, value_name = "MS", default_value_t = 20,
          value_parser = clap::value_parser!(u64).range(1..=60_000))]
    pub resend_timeout_ms: u64,

    /// Also forward without logging on this port (the benchmark's `forward` mode).
    #[arg(long, value_name = "ADDR", value_parser = crate::addr::parse_addr)]
    pub forward_listen: Option<SocketAddr>,

    /// Also answer UDP echo on this port (the benchmark's `echo` mode: the floor for any ack).
    #[arg(long, value_name = "ADDR", value_parser = crate::addr::parse_addr)]
    pub echo_listen: Option<SocketAddr>,

    /// Send every datagram to a server on its own instead of packing what one turn sends a
    /// server into batches (docs/protocol.md, "Batches").
    #[arg(long)]
    pub no_batch: bool,

    /// Microseconds a batch of update requests for a server may wait for more before it goes
    /// (their clients have their acks: only the server's apply waits; anything else for that
    /// server, such as a read, sends it at once). 0: never wait.
    #[arg(long, value_name = "US", default_value_t = DEFAULT_BATCH_HOLD_US,
          value_parser = clap::value_parser!(u64).range(0..=100_000))]
    pub batch_hold_us: u64,

    /// Run this many independent workers (each its own thread, port, device id and log, the
    /// ports, ids and metrics ports counting up from the given ones; logs PATH, PATH.1, ...):
    /// clients spread their sessions over them. One (the default) is fastest where the device
    /// shares a few CPUs with others (docs/benchmarks.md); more for a host with cores to spare.
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u16).range(1..=pmnet_runtime::WORKERS_MAX as i64))]
    pub workers: u16,

    /// Serve reads of hot keys from the device (the read cache, docs/cache.md): cache reads of
    /// cached keys are answered here, kept coherent with the log; clients must send every write
    /// to a key that may be cached as a keyed write (`pmnet client` and the Redis gateway do).
    #[arg(long)]
    pub cache: bool,

    /// Keys the cache holds at most.
    #[arg(long, value_name = "N", default_value_t = 10_000,
          value_parser = clap::value_parser!(u32).range(1..=10_000_000))]
    pub cache_items: u32,

    /// Bytes of a cached value at most (with the reply's framing, 32 bytes more); larger
    /// values are never cached.
    #[arg(long, value_name = "BYTES", default_value_t = 128,
          value_parser = clap::value_parser!(u32).range(1..=4_000))]
    pub cache_value_max: u32,

    /// Milliseconds between the cache controller's turns (hot keys admitted, statistics reset).
    #[arg(long, value_name = "MS", default_value_t = 100,
          value_parser = clap::value_parser!(u64).range(1..=60_000))]
    pub cache_interval_ms: u64,

    /// Misses of one key within --cache-hot-window-ms, by any number of clients, that make it
    /// hot (count-min sketch estimate in the device).
    #[arg(long, value_name = "N", default_value_t = 16,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub cache_hot_threshold: u32,

    /// Milliseconds the hot-key statistics count misses before they start again (at least
    /// --cache-interval-ms): a key read --cache-hot-threshold times within it is admitted,
    /// also when each read comes from a one-shot client.
    #[arg(long, value_name = "MS", default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(1..=600_000))]
    pub cache_hot_window_ms: u64,

    /// Milliseconds after start before the cache fetches anything: a read sent before the
    /// device (re)started may still be answered on an older state. Defaults to the clients'
    /// longest request lifetime; 0 only for a device whose clients are all new.
    #[arg(long, value_name = "MS", default_value_t = pmnet_wire::MAX_REQUEST_LIFETIME_MS,
          value_parser = clap::value_parser!(u64).range(0..=3_600_000))]
    pub cache_fetch_warmup_ms: u64,

    /// A member of the chain store (docs/netchain.md), in the order chains are built: repeat
    /// for each member, this device among them. Makes the device a member: it keeps a
    /// key-value table in persistent memory (`--chain-table`) and answers `pmnet kv`.
    #[arg(long = "chain-member", value_name = "ADDR", value_parser = crate::addr::parse_addr)]
    pub chain_members: Vec<SocketAddr>,

    /// This device's address as the other members reach it (default: --listen).
    #[arg(long, value_name = "ADDR", value_parser = crate::addr::parse_addr)]
    pub chain_me: Option<SocketAddr>,

    /// The chain controller (`pmnet controller`, or `pmnet chain-controller`): makes the
    /// device a member whose chains come from the controller's configuration (instead of
    /// --chain-member's fixed ones), with failover and recovery; it answers clients only while
    /// the controller's lease holds. Repeat for each controller of an etcd control plane (at
    /// most 7): the member sends each its status and follows whichever leads.
    #[arg(long, value_name = "ADDR", value_parser = crate::addr::parse_addr,
          conflicts_with = "chain_members")]
    pub chain_controller: Vec<SocketAddr>,

    /// Virtual groups of keys: group g's chain starts at member g modulo the members, in
    /// order; every member and client must use the same number.
    #[arg(long, value_name = "N", default_value_t = 16,
          value_parser = clap::value_parser!(u16).range(1..=4096))]
    pub chain_groups: u16,

    /// The chain store's table (default: pmnet-chain-<ID>.table in --dir); made if missing,
    /// reopened (with every durable version) if not.
    #[arg(long, value_name = "FILE")]
    pub chain_table: Option<PathBuf>,

    /// Keys the table holds at most (a new table; an existing one keeps its own).
    #[arg(long, value_name = "N", default_value_t = 100_000,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub chain_keys: u32,

    /// Bytes of a value at most (a new table; an existing one keeps its own).
    #[arg(long, value_name = "BYTES", default_value_t = 128,
          value_parser = clap::value_parser!(u16).range(1..=16_384))]
    pub chain_value_max: u16,

    /// Emulate a chain member of this capacity: take at most N chain requests per second
    /// (client requests and reads relayed by other members; a token bucket a hundredth of a
    /// second deep, as `pmnet server --max-ops-per-s`); the rest wait, in order. Default: no
    /// limit. For the read-scaling benchmark (docs/benchmarks.md).
    #[arg(long, value_name = "N", value_parser = parse_max_ops_per_s)]
    pub chain_max_ops_per_s: Option<u64>,

    /// A memory node of replicated persistent memory (`pmnet memnode`; docs/abd.md): repeat
    /// for each. Makes the device the memory's ABD coordinator: clients' reads and writes of
    /// lines become quorum operations on a majority of the nodes, the device's id the
    /// writer id of its timestamps. Without --server the device runs no log.
    #[arg(long = "abd-node", value_name = "ADDR", value_parser = crate::addr::parse_addr)]
    pub abd_nodes: Vec<SocketAddr>,

    /// Lines of the replicated memory (as the memory nodes' --lines).
    #[arg(long, value_name = "N", default_value_t = 65_536,
          value_parser = clap::value_parser!(u32).range(1..=(1 << 26)))]
    pub abd_lines: u32,

    /// Serve on AF_XDP sockets on these interfaces (repeat, or separate with commas): an XDP
    /// program on each steers the datagrams for the device to the device and passes everything
    /// else to the kernel (docs/inpath.md). Needs root and an IPv4 address on each interface;
    /// the device answers on-link peers with frames of its own and others through the kernel.
    #[arg(long = "xdp", value_name = "IFACE", value_delimiter = ',')]
    pub xdp: Vec<String>,

    /// With --xdp: be in the path (docs/inpath.md). Clients address the server, not the
    /// device: the device, a router between them, takes the PMNet datagrams for its servers
    /// off the wire, logs and acks them as the server, and passes all other traffic (ping,
    /// TCP, other UDP) to the kernel, which routes it unchanged.
    #[arg(long, requires = "xdp")]
    pub in_path: bool,

    /// With --xdp: attach the XDP program in the driver (native, the default) or in the
    /// kernel's generic path (generic: slower, for drivers without XDP).
    #[arg(long, value_name = "MODE", default_value = "native", requires = "xdp",
          value_parser = ["native", "generic"])]
    pub xdp_mode: String,

    /// With --xdp: ask for zero-copy AF_XDP sockets (drivers that cannot fall back to copy
    /// mode, as veth).
    #[arg(long, requires = "xdp")]
    pub xdp_zero_copy: bool,

    #[command(flatten)]
    pub follow: FollowArgs,

    #[command(flatten)]
    pub medium: MediumArgs,

    #[command(flatten)]
    pub run: LoopArgs,
}

/// Following the controllers of devices in series (`pmnet device` and `pmnet server`).
#[derive(Debug, Clone, Args)]
pub struct FollowArgs {
    /// A controller of this device's (or server's) chain of devices (`pmnet controller
    /// --device-chain`): the process sends it a status every --heartbeat-ms and takes its
    /// routes, so a device of the chain that is lost is taken out automatically
    /// (docs/replication.md, "Automatic failover"). Repeat for each controller (at most 7).
    #[arg(long = "controller", value_name = "ADDR", value_parser = crate::addr::parse_addr)]
    pub controllers: Vec<SocketAddr>,

    /// With --controller: between two statuses, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub heartbeat_ms: u64,
}

impl FollowArgs {
    /// The state machine's settings (`None` without --controller).
    pub fn config(
        &self,
        role: pmnet_wire::route::Role,
        server_id: u16,
        device_id: u16,
    ) -> Option<pmnet_proto::route::FollowerConfig> {
        if self.controllers.is_empty() {
            return None;
        }
        let mut config = pmnet_proto::route::FollowerConfig::new(
            self.controllers.clone(),
            role,
            server_id,
            rand::random(),
        );
        config.device_id = device_id;
        config.interval = Duration::from_millis(self.heartbeat_ms);
        Some(config)
    }

    /// The banner's line: whom it follows and what a route does (`None` without
    /// --controller).
    pub fn banner_line(&self, route_does: &str) -> Option<String> {
        (!self.controllers.is_empty()).then(|| {
            format!(
                "  failover: a status every {} ms to the controllers {}; {route_does}",
                self.heartbeat_ms,
                self.controllers
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })
    }

    /// Checked: at most [`pmnet_proto::route::CONTROLLERS_MAX`] controllers.
    pub fn check(&self) -> Result<(), String> {
        check_controllers(&self.controllers)
    }
}

/// `--controller` on any process (device, server, client, gateway): at most
/// [`pmnet_proto::route::CONTROLLERS_MAX`] of them.
pub fn check_controllers(controllers: &[SocketAddr]) -> Result<(), String> {
    if controllers.len() > pmnet_proto::route::CONTROLLERS_MAX {
        return Err(format!(
            "--controller: {} given, at most {}",
            controllers.len(),
            pmnet_proto::route::CONTROLLERS_MAX
        ));
    }
    Ok(())
}

impl DeviceArgs {
    pub fn options(&self) -> DeviceOptions {
        let log = (!self.no_log).then(|| LogOptions {
            path: self.log_file.clone().unwrap_or_else(|| {
                (self.medium).default_file(&format!("pmnet-device-{}.log", self.device_id))
            }),
            slot_count: self.slots,
            slot_size: self.slot_size,
            format: self.medium.format,
            mmap: self.medium.mmap_options(),
        });
        DeviceOptions {
            device_id: self.device_id,
            listen: self.listen,
            servers: self.servers.clone(),
            previous_devices: self.previous_devices.clone(),
            follow: self.follow.config(
                pmnet_wire::route::Role::Device,
                self.servers.first().map_or(0, |(id, _)| *id),
                self.device_id,
            ),
            log,
            forward_listen: self.forward_listen,
            echo_listen: self.echo_listen,
            max_resends_in_flight: Some(self.resends_in_flight),
            resend_timeout: Some(Duration::from_millis(self.resend_timeout_ms)),
            loop_options: self.run.loop_options(),
            keys: None,
            batch: !self.no_batch,
            batch_hold: Duration::from_micros(self.batch_hold_us),
            xdp: (!self.xdp.is_empty()).then(|| pmnet_runtime::XdpOptions {
                interfaces: self.xdp.clone(),
                in_path: self.in_path,
                mode: if self.xdp_mode == "generic" {
                    pmnet_runtime::AttachMode::Generic
                } else {
                    pmnet_runtime::AttachMode::Native
                },
                zero_copy: self.xdp_zero_copy,
                busy_poll: self.run.loop_options().wait == pmnet_runtime::WaitMode::BusyPoll,
            }),
        }
    }
}

#[derive(Debug, Clone, Args)]
pub struct ServerArgs {
    /// Where devices (and clients talking to the server directly) reach the server.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7500", value_parser = crate::addr::parse_addr)]
    pub listen: SocketAddr,

    /// This server's id: the ID of `--server ID=ADDR` on the devices.
    #[arg(long, value_name = "ID", default_value_t = 1)]
    pub server_id: u16,

    /// A device in front of this server (repeat for several). At start-up the server polls
    /// each for requests it logged, and applies them before anything new.
    #[arg(long = "device", value_name = "ADDR", value_parser = crate::addr::parse_addr)]
    pub devices: Vec<SocketAddr>,

    /// A replica server of this one (repeat for several, at most 8): this server becomes their
    /// primary. It forwards every request to each, and applies it — and sends its server-ACK,
    /// which frees the devices' entries and answers the client — only once every replica
    /// applied it.
    /// A replica is an ordinary `pmnet server` with this server as its only `--device` and
    /// the same `--server-id` (docs/replication.md).
    #[arg(long = "replica", value_name = "ADDR", value_parser = crate::addr::parse_addr)]
    pub replicas: Vec<SocketAddr>,

    /// Reply OK to everything without storing anything (the "ideal handler": measures the
    /// protocol alone; no data, no exactly-once across restarts).
    #[arg(long)]
    pub ideal: bool,

    /// The store's data file, mapped in memory (see `pmnet device --help` on media).
    /// Default: pmnet-server-<ID>.data in --dir.
    #[arg(long, value_name = "PATH")]
    pub data_file: Option<PathBuf>,

    /// Size of a new data file in MiB (keys, values and per-session records live in it). The
    /// default, 64 MiB, holds about 32 000 keys of up to 1.9 KB with the packet store (one
    /// 2 KiB slot each); the start-up banner says what the store in use has room for. The file
    /// is allocated in full when it is made (under /dev/shm that is RAM), and grows while the
    /// server runs (--data-max-mib).
    #[arg(long, value_name = "MIB", default_value_t = 64)]
    pub data_mib: u64,

    /// The largest the data file grows to, in MiB: when --data-grow-at of its data space is in
    /// use, the server doubles it (a restart in place: the store is closed, grown crash-safely,
    /// reopened and recovered; the devices resend what they logged meanwhile). No more than
    /// the file's size: it never grows, and updates that do not fit wait at the devices until
    /// deletes make room. The packet and conventional engines grow; `kv` does not.
    #[arg(long, value_name = "MIB", default_value_t = 4096)]
    pub data_max_mib: u64,

    /// The share of the data space in use, in percent, at which the store grows.
    #[arg(long, value_name = "PERCENT", default_value_t = 80,
          value_parser = clap::value_parser!(u8).range(1..=100))]
    pub data_grow_at: u8,

    /// Client sessions whose exactly-once record a new store keeps (the least recently
    /// active is forgotten beyond it).
    #[arg(long, value_name = "N", default_value_t = 1024)]
    pub max_sessions: u32,

    /// The storage engine: `packet` (the default: received datagrams kept in persistent
    /// memory as the stored records, no copy, the header's CRC reused; see docs/storage.md),
    /// `conventional` (copy, own checksum, allocator: the baseline the packet store is
    /// measured against) or `kv` (an append-only record log with a DRAM hash index). A data
    /// file holds one engine's format.
    #[arg(long, value_name = "ENGINE", value_enum, default_value_t = EngineChoice::Packet)]
    pub engine: EngineChoice,

    /// Seconds a gap in a session's sequence may last before the server closes it without
    /// the client: it asks every --device whether it holds the missing requests and skips
    /// what none holds, so the requests acked behind the gap are applied. Must exceed the
    /// request lifetime of every client (pmnet's clients give up within 15 s).
    #[arg(long, value_name = "SECONDS", default_value_t = 20.0,
          value_parser = |text: &str| crate::node::parse_seconds_at_least(text, 0.001))]
    pub gap_fill_after: f64,

    /// Emulate a server of this capacity: take at most N requests per second from the
    /// socket (a token bucket a hundredth of a second deep); what is beyond it waits in the
    /// socket's buffer, in order. Default: no limit.
    #[arg(long, value_name = "N", value_parser = parse_max_ops_per_s)]
    pub max_ops_per_s: Option<u64>,

    /// Receive with AF_XDP on this interface (the packet store only; needs root): an XDP
    /// program steers the datagrams addressed to --listen (each IPv4 address of IFACE when it
    /// is 0.0.0.0) to an AF_XDP socket whose memory is the store's data file, so the kernel
    /// writes each update frame into the slot where its datagram stays as the record
    /// (docs/inpath.md, "The packet store on AF_XDP"). Everything else still arrives on the
    /// UDP socket, and replies leave through it.
    #[arg(long = "xdp", value_name = "IFACE")]
    pub xdp: Option<String>,

    /// With --xdp: attach the XDP program in the driver (native, the default) or in the
    /// kernel's generic path (generic: slower, for drivers without XDP).
    #[arg(long = "xdp-mode", value_name = "MODE", default_value = "native", requires = "xdp",
          value_parser = ["native", "generic"])]
    pub xdp_mode: String,

    #[command(flatten)]
    pub follow: FollowArgs,

    #[command(flatten)]
    pub medium: MediumArgs,

    #[command(flatten)]
    pub run: LoopArgs,
}

/// `--max-ops-per-s`: a number of requests per second a server accepts as its capacity.
pub fn parse_max_ops_per_s(text: &str) -> Result<u64, String> {
    let value: u64 = text.trim().parse().map_err(|_| {
        format!("{text:?} is not a whole number of requests per second (e.g. 2000)")
    })?;
    pmnet_runtime::check_max_ops_per_s(value)
}

/// A server's storage engine on the command line (`pmnet server`, `pmnet bench`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum EngineChoice {
    Packet,
    Conventional,
    Kv,
}

impl EngineChoice {
    /// The `pmnet-pktstore` engine; `None` for the key-value store.
    pub fn kind(self) -> Option<pmnet_pktstore::EngineKind> {
        match self {
            EngineChoice::Packet => Some(pmnet_pktstore::EngineKind::Packet),
            EngineChoice::Conventional => Some(pmnet_pktstore::EngineKind::Conventional),
            EngineChoice::Kv => None,
        }
    }
}

impl ServerArgs {
    pub fn options(&self) -> ServerOptions {
        let store = (!self.ideal).then(|| StoreOptions {
            path: self.data_file.clone().unwrap_or_else(|| {
                (self.medium).default_file(&format!("pmnet-server-{}.data", self.server_id))
            }),
            size_bytes: self.data_mib.saturating_mul(1 << 20),
            max_sessions: self.max_sessions,
            format: self.medium.format,
            mmap: self.medium.mmap_options(),
            growth: pmnet_runtime::StoreGrowth {
                max_bytes: self.data_max_mib.saturating_mul(1 << 20),
                at_percent: self.data_grow_at,
                to_bytes: None,
            },
        });
        ServerOptions {
            server_id: self.server_id,
            listen: self.listen,
            devices: self.devices.clone(),
            replicas: self.replicas.clone(),
            store,
            gap_fill_after: Some(Duration::from_secs_f64(self.gap_fill_after)),
            loop_options: self.run.loop_options(),
            keys: None,
            max_ops_per_s: self.max_ops_per_s,
            follow: self
                .follow
                .config(pmnet_wire::route::Role::Server, self.server_id, 0),
        }
    }

    /// The AF_XDP receive path `--xdp` asks for.
    pub fn xdp_options(&self) -> Option<pmnet_runtime::ServerXdpOptions> {
        let mode = if self.xdp_mode == "generic" {
            pmnet_runtime::AttachMode::Generic
        } else {
            pmnet_runtime::AttachMode::Native
        };
        self.xdp
            .as_deref()
            .map(|interface| pmnet_runtime::ServerXdpOptions::new(interface, mode))
    }
}

/// Print lines to stdout at once (scripts and tests wait for the "listening on" line).
fn announce(lines: &[String]) {
    let mut out = std::io::stdout().lock();
    for line in lines {
        let _ = writeln!(out, "{line}");
    }
    let _ = out.flush();
}

/// `--batch-hold-us`'s default (docs/benchmarks.md, "Under load").
pub const DEFAULT_BATCH_HOLD_US: u64 = 200;

pub fn run_device(args: DeviceArgs) -> Result<ExitCode, CliError> {
    args.follow.check()?;
    if !args.follow.controllers.is_empty() && args.workers > 1 {
        return Err(CliError::from(
            "--controller: a device that follows a controller runs one worker".to_owned(),
        ));
    }
    let shutdown = Shutdown::on_signals()?;
    let mut options = args.options();
    options.keys = args.run.keys()?;
    if options.servers.is_empty() {
        // An ABD coordinator alone: nothing to log for.
        options.log = None;
    }
    if !args.xdp.is_empty() && args.workers > 1 {
        return Err(CliError::from(format!(
            "--xdp serves one AF_XDP socket per interface: it runs one worker, not --workers {}",
            args.workers
        )));
    }
    args.run
        .protect("device", &args.listeners(), options.keys.as_ref())?;
    let traffic = auth_text(options.keys.as_ref());
    if let Some(log) = &options.log {
        let stale = pmnet_runtime::stale_worker_logs(&log.path, args.workers);
        if let Some(last) = stale.last() {
            let shown: Vec<String> = stale
                .iter()
                .map(|path| path.display().to_string())
                .collect();
            let needed = last
                .extension()
                .and_then(|index| index.to_str())
                .and_then(|index| index.parse::<u16>().ok())
                .map_or(pmnet_runtime::WORKERS_MAX, |index| index + 1);
            return Err(format!(
                "{} {} the log of a worker this device no longer runs (it ran with more \
                 --workers before): what it holds would not be replayed. Start it with \
                 --workers {needed} again; remove a worker's log only once it holds nothing",
                shown.join(", "),
                if shown.len() == 1 { "is" } else { "are" },
            )
            .into());
        }
    }
    if args.chain_max_ops_per_s.is_some() && !args.is_chain_member() {
        return Err(
            "--chain-max-ops-per-s limits a chain member: give --chain-member (or \
             --chain-controller) too"
                .to_owned()
                .into(),
        );
    }
    let online = pmnet_runtime::online_cpu_count();
    let mut devices = Vec::new();
    for index in 0..args.workers {
        let worker = options
            .for_worker(index, online)
            .map_err(|error| format!("--workers {}: {error}", args.workers))?;
        let functions = device_functions(&args, worker.device_id)?;
        let device = DeviceRuntime::open_with_functions(worker, shutdown.clone(), functions)?;
        devices.push(device);
    }
    announce(&device_banner(&args, &devices, &traffic));
    let mut devices = devices.into_iter();
    let mut first = devices.next().expect("at least one worker");
    let mut threads = Vec::new();
    for (index, mut device) in devices.enumerate() {
        let stop = shutdown.clone();
        let thread = std::thread::Builder::new()
            .name(format!("pmnet-device-{}", index + 1))
            .spawn(move || {
                let result = device.run();
                if result.is_err() {
                    // One worker failing stops the others: the process exits with its error.
                    stop.request();
                }
                result
            })?;
        threads.push(thread);
    }
    let result = first.run();
    shutdown.request();
    result?;
    for thread in threads {
        thread
            .join()
            .map_err(|_| "a device worker panicked".to_owned())??;
    }
    Ok(ExitCode::SUCCESS)
}

pub fn run_server(args: ServerArgs) -> Result<ExitCode, CliError> {
    args.follow.check()?;
    if args.replicas.len() > pmnet_proto::REPLICA_SERVERS_MAX {
        return Err(CliError::from(format!(
            "--replica: {} replicas given, at most {} are supported",
            args.replicas.len(),
            pmnet_proto::REPLICA_SERVERS_MAX
        )));
    }
    if let Some(own) = args
        .replicas
        .iter()
        .find(|&&replica| replica == args.listen)
    {
        return Err(CliError::from(format!(
            "--replica {own}: that is this server's own --listen address"
        )));
    }
    let shutdown = Shutdown::on_signals()?;
    let mut options = args.options();
    options.keys = args.run.keys()?;
    let mut listeners = vec![crate::protect::Listener::Addr("--listen", args.listen)];
    if let Some(interface) = &args.xdp {
        listeners.push(crate::protect::Listener::Interface(
            "--xdp",
            interface.clone(),
        ));
    }
    args.run
        .protect("server", &listeners, options.keys.as_ref())?;
    let traffic = auth_text(options.keys.as_ref());
    let mut server = ServerRuntime::open_with_xdp(
        options,
        args.engine.kind(),
        args.xdp_options(),
        shutdown.clone(),
    )?;
    let startup = server.startup().clone();
    let addresses = server.addresses();
    let mut lines = vec![format!(
        "pmnet server {} listening on {}",
        args.server_id, addresses.data
    )];
    match &startup.data_path {
        Some(path) => lines.push(format!(
            "  store: {} ({}; {} keys, {} sessions recovered)",
            path.display(),
            if startup.formatted { "new" } else { "reopened" },
            startup.recovered_key_count,
            startup.recovered_session_count
        )),
        None => lines.push("  store: none (--ideal: replies OK, keeps nothing)".to_owned()),
    }
    lines.push(format!("  engine: {}", startup.engine));
    if let Some(capacity) = server.capacity_text() {
        lines.push(format!("  capacity: {capacity}"));
    }
    if let Some(capacity) = &startup.capacity {
        lines.push(format!("  capacity: {capacity}"));
    }
    if let Some(note) = &startup.recovery_note {
        lines.push(format!("  recovery: {note}"));
    }
    lines.push(format!("  medium: {}", startup.medium_text()));
    lines.push(format!("  receive: {}", startup.receive));
    lines.push(format!("  traffic: {traffic}"));
    if let Some(warning) = &startup.store_warning {
        lines.push(format!("  WARNING: {warning}"));
    }
    if args.devices.is_empty() {
        lines.push(
            "  devices: none (no recovery poll: requests a device logged while this server was \
             down are only replayed by the device's own resend timer)"
                .to_owned(),
        );
    } else {
        let devices: Vec<String> = args.devices.iter().map(ToString::to_string).collect();
        lines.push(format!(
            "  devices: {} (polled for logged requests before serving)",
            devices.join(", ")
        ));
    }
    if !args.replicas.is_empty() {
        let replicas: Vec<String> = args.replicas.iter().map(ToString::to_string).collect();
        lines.push(format!(
            "  replicas: {} (primary: every request is applied there before it is applied here)",
            replicas.join(", ")
        ));
    }
    if let Some(line) = args
        .follow
        .banner_line("a route moves the device it asks to the chain's new last device")
    {
        lines.push(line);
    }
    lines.push(format!("  {}", args.run.describe(addresses.metrics)));
    announce(&lines);
    server.run()?;
    // A controller's route asked for a restart in place (a replica promoted, a replica's
    // primary replaced, the primary's replicas changed): open again with its options.
    while let Some(options) = server.take_restart() {
        drop(server);
        server = ServerRuntime::open_with_xdp(
            options,
            args.engine.kind(),
            args.xdp_options(),
            shutdown.clone(),
        )?;
        announce(&[format!(
            "pmnet server {} restarted in place (a controller's route, or its store grew): \
             listening on {}",
            args.server_id,
            server.addresses().data
        )]);
        server.run()?;
    }
    Ok(ExitCode::SUCCESS)
}

/// A number of seconds, at least `minimum`, for an option's value parser.
pub(crate) fn parse_seconds_at_least(text: &str, minimum: f64) -> Result<f64, String> {
    let seconds: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a number of seconds"))?;
    if !seconds.is_finite() || seconds < minimum || seconds > 86_400.0 {
        return Err(format!(
            "{seconds} is out of range: give {minimum} to 86400 seconds"
        ));
    }
    Ok(seconds)
}

impl DeviceArgs {
    /// What the device listens on, for protected mode.
    fn listeners(&self) -> Vec<crate::protect::Listener> {
        use crate::protect::Listener;
        let mut listeners = vec![Listener::Addr("--listen", self.listen)];
        if let Some(addr) = self.forward_listen {
            listeners.push(Listener::Addr("--forward-listen", addr));
        }
        if let Some(addr) = self.echo_listen {
            listeners.push(Listener::Addr("--echo-listen", addr));
        }
        for interface in &self.xdp {
            listeners.push(Listener::Interface("--xdp", interface.clone()));
        }
        listeners
    }

    /// Whether the device is a member of the chain store.
    fn is_chain_member(&self) -> bool {
        !self.chain_members.is_empty() || !self.chain_controller.is_empty()
    }
}

/// What `pmnet device` says at start: its addresses, servers, log, medium, functions,
/// traffic, datapath and loop.
fn device_banner(args: &DeviceArgs, devices: &[DeviceRuntime], traffic: &str) -> Vec<String> {
    // `ID=ADDR, ...`, as the options take them.
    let id_addrs = |list: &[(u16, SocketAddr)]| {
        list.iter()
            .map(|(id, addr)| format!("{id}={addr}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let first = devices[0].addresses();
    let mut lines = vec![format!(
        "pmnet device {} listening on {}",
        args.device_id, first.data
    )];
    if devices.len() > 1 {
        let all: Vec<String> = devices
            .iter()
            .map(|device| device.addresses().data.to_string())
            .collect();
        lines.push(format!(
            "  workers: {} ({}; device ids {}..={}): give clients (`--device` takes a list) \
             and the server (`--device` for each) every address",
            devices.len(),
            all.join(", "),
            args.device_id,
            u32::from(args.device_id) + devices.len() as u32 - 1
        ));
    }
    lines.push(format!(
        "  servers: {}",
        if args.servers.is_empty() {
            "none".to_owned()
        } else {
            id_addrs(&args.servers)
        }
    ));
    if !args.previous_devices.is_empty() {
        lines.push(format!(
            "  devices before this one: {} (fill queries are passed on to them; the client \
             addresses they carry are acked directly)",
            id_addrs(&args.previous_devices)
        ));
    }
    if let Some(line) = args.follow.banner_line(
        "a route that moves its next hop or the device before it restarts it in place: its \
         log recovered and replayed to the new next hop",
    ) {
        lines.push(line);
    }
    for device in devices {
        let startup = device.startup();
        match &startup.log_path {
            Some(path) => lines.push(format!(
                "  log: {} ({} slots of {} bytes; {}; {} entries recovered and resent, {} torn \
                 or corrupt slots rejected)",
                path.display(),
                startup.slot_count,
                startup.slot_size,
                if startup.formatted { "new" } else { "reopened" },
                startup.recovered_entry_count,
                startup.rejected_slot_count
            )),
            None if args.servers.is_empty() => {
                lines.push("  log: off (no server behind the device)".to_owned())
            }
            None => lines.push("  log: off (--no-log)".to_owned()),
        }
    }
    if args.servers.is_empty() {
        lines.push(
            "  medium: none (the coordinator keeps nothing: the memory nodes persist the lines)"
                .to_owned(),
        );
    } else {
        lines.push(format!("  medium: {}", devices[0].startup().medium_text()));
    }
    if !args.chain_controller.is_empty() {
        let controllers: Vec<String> = args
            .chain_controller
            .iter()
            .map(ToString::to_string)
            .collect();
        lines.push(format!(
            "  chain store: member {} with the chains of the controller at {}, table {} \
             on the medium above",
            args.chain_me.unwrap_or(args.listen),
            controllers.join(" or "),
            chain_table_path(args).display()
        ));
    } else if !args.chain_members.is_empty() {
        lines.push(format!(
            "  chain store: member {} of {} ({} virtual groups), table {} on the medium above",
            args.chain_me.unwrap_or(args.listen),
            args.chain_members
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", "),
            args.chain_groups,
            chain_table_path(args).display()
        ));
    }
    if let Some(ops_per_s) = args.chain_max_ops_per_s {
        lines.push(format!(
            "  chain capacity: {}",
            pmnet_runtime::emulated_capacity_text(ops_per_s)
        ));
    }
    if !args.abd_nodes.is_empty() {
        lines.push(format!(
            "  replicated memory: ABD coordinator of {} lines on {} memory nodes ({}; a \
             majority of {} needed), writer id {}",
            args.abd_lines,
            args.abd_nodes.len(),
            args.abd_nodes
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", "),
            pmnet_abd::majority(args.abd_nodes.len()),
            args.device_id
        ));
    }
    if args.cache {
        lines.push(format!(
            "  cache: on ({} keys, values up to {} bytes, hot after {} misses in {} ms; volatile: starts empty)",
            args.cache_items, args.cache_value_max, args.cache_hot_threshold, args.cache_interval_ms
        ));
    } else {
        lines.push("  cache: off".to_owned());
    }
    lines.push(format!("  traffic: {traffic}"));
    lines.push(format!("  datapath: {}", devices[0].datapath_text()));
    if let Some(addr) = first.forward {
        lines.push(format!("  forward (no logging) on {addr}"));
    }
    if let Some(addr) = first.echo {
        lines.push(format!("  echo on {addr}"));
    }
    lines.push(format!("  {}", args.run.describe(first.metrics)));
    lines
}

/// The functions a device runs in front of its log, in their declared order: the read cache
/// (it orders keyed writes and reads before anything else sees them), the chain store's
/// member, the ABD coordinator. Each owns its packet types and passes the others on; the log
/// takes what they all pass on.
fn device_functions(
    args: &DeviceArgs,
    device_id: u16,
) -> Result<Vec<pmnet_runtime::DeviceFunction>, CliError> {
    use pmnet_runtime::DeviceFunction;
    let mut functions = Vec::new();
    if args.cache {
        functions.push(DeviceFunction::new(Box::new(cache(args, device_id)?)));
    }
    if args.is_chain_member() {
        let (member, region) = chain_member(args)?;
        let member: Box<dyn pmnet_proto::FrontFunction> = match args.chain_max_ops_per_s {
            Some(ops_per_s) => Box::new(pmnet_netchain::CapacityLimited::new(
                member,
                ops_per_s,
                pmnet_proto::Time::ZERO,
            )),
            None => Box::new(member),
        };
        functions.push(DeviceFunction::on(member, region));
    }
    if !args.abd_nodes.is_empty() {
        functions.push(DeviceFunction::new(Box::new(abd_coordinator(
            args, device_id,
        )?)));
    }
    Ok(functions)
}

/// Where the chain store's table lives.
fn chain_table_path(args: &DeviceArgs) -> PathBuf {
    args.chain_table.clone().unwrap_or_else(|| {
        (args.medium).default_file(&format!("pmnet-chain-{}.table", args.device_id))
    })
}

/// The chain store's member `pmnet device --chain-member ...` puts in front of its log, and
/// the region of its table (made if missing, reopened with every durable version if not).
fn chain_member(
    args: &DeviceArgs,
) -> Result<(pmnet_netchain::ChainFunction, pmnet_pm::MmapRegion), CliError> {
    if args.workers > 1 {
        return Err("--chain-member runs on one worker: drop --workers"
            .to_owned()
            .into());
    }
    let me = args.chain_me.unwrap_or(args.listen);
    if args.chain_controller.len() > pmnet_netchain::MAX_CONTROLLERS {
        return Err(format!(
            "--chain-controller: at most {} controllers (given {})",
            pmnet_netchain::MAX_CONTROLLERS,
            args.chain_controller.len()
        )
        .into());
    }
    if args.chain_controller.is_empty() && !args.chain_members.contains(&me) {
        return Err(format!(
            "--chain-member: this device ({me}; set --chain-me to the address the others \
             reach it at) is not among the members"
        )
        .into());
    }
    let path = chain_table_path(args);
    let options = args.medium.mmap_options();
    let geometry = pmnet_netchain::Geometry {
        buckets: args.chain_keys,
        key_max: 64,
        value_max: args.chain_value_max,
    };
    let table_error = |what: String| format!("chain table {}: {what}", path.display());
    let (file, recovered) = if path.exists() {
        let region = pmnet_pm::MmapRegion::open(&path, options)
            .map_err(|error| table_error(error.to_string()))?;
        pmnet_netchain::TableFile::open(region).map_err(|error| {
            table_error(format!(
                "{error}; move it aside or point --chain-table at another file"
            ))
        })?
    } else {
        let (region, new_file) =
            pmnet_pm::MmapRegion::create_new(&path, geometry.region_len(), options)
                .map_err(|error| table_error(error.to_string()))?;
        let file = pmnet_netchain::TableFile::format(region, geometry)
            .map_err(|error| table_error(error.to_string()))?;
        new_file
            .publish()
            .map_err(|error| table_error(error.to_string()))?;
        (file, pmnet_netchain::Recovered::default())
    };
    if recovered.damaged_records > 0 {
        tracing::warn!(
            "chain table {}: {} damaged records ignored (torn writes never acknowledged, or \
             damage: the other record of each key holds its version)",
            path.display(),
            recovered.damaged_records
        );
    }
    let table = pmnet_netchain::Table::recover(file.geometry(), recovered);
    let mut config = match args.chain_controller.split_first() {
        Some((controller, standbys)) => pmnet_netchain::ChainConfig {
            standby_controllers: standbys.to_vec(),
            ..pmnet_netchain::ChainConfig::controlled(me, 1, *controller)
        },
        None => pmnet_netchain::ChainConfig::new(
            me,
            1,
            pmnet_netchain::rotated_groups(&args.chain_members, args.chain_groups),
        ),
    };
    // This start's own: the wall clock and a random number (the state machine reads neither).
    config.boot_nonce = rand::random::<u64>()
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| {
                u64::try_from(since.as_nanos()).unwrap_or(u64::MAX)
            });
    let node = pmnet_netchain::ChainNode::new(config, table, pmnet_proto::Time::ZERO);
    Ok((pmnet_netchain::ChainFunction::new(node), file.into_region()))
}

/// The ABD coordinator `pmnet device --abd-node ...` puts in front of its log.
fn abd_coordinator(args: &DeviceArgs, device_id: u16) -> Result<pmnet_abd::AbdFunction, CliError> {
    if args.workers > 1 {
        return Err("--abd-node runs on one worker: drop --workers"
            .to_owned()
            .into());
    }
    let mut unique = args.abd_nodes.clone();
    unique.sort();
    unique.dedup();
    if unique.len() != args.abd_nodes.len() || unique.len() > pmnet_abd::NODES_MAX {
        return Err(format!(
            "--abd-node: 1 to {} memory nodes, each named once",
            pmnet_abd::NODES_MAX
        )
        .into());
    }
    if args.abd_nodes.contains(&args.listen) {
        return Err(format!(
            "--abd-node {}: that is the device's own address; name the memory nodes \
             (`pmnet memnode`)",
            args.listen
        )
        .into());
    }
    let mut config = pmnet_abd::CoordinatorConfig::new(
        args.abd_nodes.clone(),
        args.abd_lines,
        device_id,
        pmnet_runtime::random_session_id(),
    );
    // A restarted device stamps above its previous life (docs/abd.md, "Timestamps").
    config.counter_floor = pmnet_runtime::abd_counter_floor();
    Ok(pmnet_abd::AbdFunction::new(pmnet_abd::Coordinator::new(
        config,
    )))
}

/// The read cache `pmnet device --cache` puts in front of the log of device `device_id`.
fn cache(args: &DeviceArgs, device_id: u16) -> Result<pmnet_cache::CacheFunction, CliError> {
    if args.servers.is_empty() {
        return Err(
            "--cache keeps the reads of the servers behind the device: give --server \
                    ID=ADDR (an ABD coordinator alone has none)"
                .to_owned()
                .into(),
        );
    }
    let mut config = pmnet_cache::CacheConfig::new(device_id);
    config.table.items_max = args.cache_items as usize;
    config.table.reply_max = args.cache_value_max as usize + 32;
    config.interval = Duration::from_millis(args.cache_interval_ms);
    config.hot_window = Duration::from_millis(args.cache_hot_window_ms);
    config.stats.threshold = args.cache_hot_threshold;
    config.fetch_warmup = Duration::from_millis(args.cache_fetch_warmup_ms);
    config.servers = args.servers.iter().map(|(_, addr)| *addr).collect();
    pmnet_cache::CacheFunction::new(config)
        .map_err(|error| CliError::from(format!("the read cache's statistics: {error}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_specs_parse_or_say_how_to_write_them() {
        assert_eq!(
            parse_server("3=127.0.0.1:7500").unwrap(),
            (3, "127.0.0.1:7500".parse().unwrap())
        );
        assert!(parse_server("127.0.0.1:7500")
            .unwrap_err()
            .contains("ID=ADDR"));
        assert!(parse_server("x=127.0.0.1:7500")
            .unwrap_err()
            .contains("server id"));
        assert!(parse_server("1=localhost")
            .unwrap_err()
            .contains("HOST:PORT"));
        assert_eq!(parse_server("2=localhost:7500").unwrap().1.port(), 7500);
    }
}

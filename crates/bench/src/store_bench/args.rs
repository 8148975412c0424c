//! `pmnet store-bench`'s options, and the servers its runs start.

use std::path::PathBuf;

use clap::Args;
use pmnet_pktstore::EngineKind;
use pmnet_pm::FlushChoice;

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

    /// Also write the results, with the setting, as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

/// How one server of the runs receives, and where it runs.
#[derive(Debug, Clone, Copy)]
pub struct Setup {
    pub engine: Option<EngineKind>,
    /// What the table calls it.
    pub name: &'static str,
    /// Behind the AF_XDP receive path.
    pub xdp: bool,
}

/// The servers of the loopback runs, in the order they run and are shown. The ideal handler
/// (replies OK, keeps nothing) is the ceiling any engine can reach here.
pub const LOOPBACK: [Setup; 4] = [
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
pub const NAMESPACES: [Setup; 4] = [
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

//! What a run measured, as printed and as written to JSON: each mode's result and the
//! whole report. Types only: the runs make them (plan.rs, cache.rs, replication.rs, ...)
//! and report.rs writes them as tables.

use std::path::Path;

use serde::Serialize;

use super::latency::LatencySummary;

/// The result of one mode, as printed and as written to JSON.
#[derive(Debug, Clone, Serialize)]
pub struct ModeResult {
    pub mode: String,
    /// What a request waits for in this mode, in words.
    pub waits_for: String,
    pub p50_us: Option<f64>,
    pub p99_us: Option<f64>,
    pub p999_us: Option<f64>,
    pub mean_us: Option<f64>,
    pub max_us: Option<f64>,
    pub ops_per_s: f64,
    /// Requests measured (completed after the warm-up, inside the measured interval).
    pub requests: u64,
    pub measured_s: f64,
    /// Requests that failed (timed out after the session's retransmissions).
    pub failed: u64,
    /// Completions by the device's PMNet-ACK, and by the server's reply.
    pub acked_by_device: u64,
    pub answered_by_server: u64,
    /// Latency of updates and of bypass requests separately (when the mix has both).
    pub updates: Option<LatencySummary>,
    pub bypass: Option<LatencySummary>,
    /// Datagrams the clients retransmitted (a sign of loss or overload).
    pub client_retransmissions: u64,
    /// CPU µs per request of the clients, the device and the server on the mode's path
    /// (in-process parts only).
    pub cpu: Option<super::cpu::CpuPerRequest>,
    /// What the device and server counted during this mode (in-process targets only).
    pub notes: Vec<String>,
    /// Servers behind the device (a rack's `--servers`; 1 otherwise).
    pub servers: u16,
    /// Every server's emulated capacity in requests per second (`None`: no limit).
    pub server_max_ops_per_s: Option<u64>,
    /// A rack run's throughput second by second.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub per_second: Vec<super::rack::SecondSample>,
    /// A rack run's throughput around each popularity change (100 ms steps).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub recoveries: Vec<super::recovery::Recovery>,
    /// A rack run's share of measured requests per server, by the server their key maps to.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub server_shares: Vec<f64>,
    /// The largest of `server_shares`, and its server (index from 0).
    pub busiest_server_share: Option<f64>,
    pub busiest_server: Option<u16>,
    /// Key popularity changes applied during the run (`--popularity`).
    pub popularity_changes: u64,
    /// A rack's reads, by who answered them: the device (a cache hit) or a server.
    pub reads_by_device: Option<LatencySummary>,
    pub reads_by_server: Option<LatencySummary>,
    /// A rack's read replies checked against the writes drawn, and those that named no write
    /// of their key (a value out of nowhere; always 0 in a correct system).
    pub reads_checked: u64,
    pub reads_unexplained: u64,
    /// The read cache of the run (`null`: off).
    pub cache: Option<CacheResult>,
    /// The replication factor of a `--replicas` run (absent otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replicas: Option<u8>,
    /// The CDF of every request's latency, `[quantile, µs]` (`pmnet eval` draws it).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub cdf: Vec<[f64; 2]>,
}

impl ModeResult {
    pub fn from_summary(mode: &str, waits_for: &str, summary: Option<LatencySummary>) -> Self {
        ModeResult {
            mode: mode.to_owned(),
            waits_for: waits_for.to_owned(),
            p50_us: summary.map(|s| s.p50_us),
            p99_us: summary.map(|s| s.p99_us),
            p999_us: summary.map(|s| s.p999_us),
            mean_us: summary.map(|s| s.mean_us),
            max_us: summary.map(|s| s.max_us),
            ops_per_s: 0.0,
            requests: summary.map_or(0, |s| s.count),
            measured_s: 0.0,
            failed: 0,
            acked_by_device: 0,
            answered_by_server: 0,
            updates: None,
            bypass: None,
            client_retransmissions: 0,
            cpu: None,
            notes: Vec::new(),
            servers: 1,
            server_max_ops_per_s: None,
            per_second: Vec::new(),
            recoveries: Vec::new(),
            server_shares: Vec::new(),
            busiest_server_share: None,
            busiest_server: None,
            popularity_changes: 0,
            reads_by_device: None,
            reads_by_server: None,
            reads_checked: 0,
            reads_unexplained: 0,
            cache: None,
            replicas: None,
            cdf: Vec::new(),
        }
    }
}

/// One mode against another: each figure is `numerator / denominator` (below 1 means the
/// numerator is faster for latencies; above 1 means more throughput).
#[derive(Debug, Clone, Serialize)]
pub struct Ratio {
    pub numerator: String,
    pub denominator: String,
    pub p50: Option<f64>,
    pub p99: Option<f64>,
    pub p999: Option<f64>,
    pub ops_per_s: Option<f64>,
}

/// The forwarding-capacity comparison: a plain relay against the device's forward port.
#[derive(Debug, Clone, Serialize)]
pub struct CapacityResult {
    pub forwarder: String,
    /// Datagrams forwarded per second (what left the forwarder towards the sink).
    pub packets_per_s: f64,
    /// Datagrams the generator offered per second.
    pub offered_per_s: f64,
    /// Share of the offered datagrams the forwarder never read (its socket buffer overflowed):
    /// well above zero means the forwarder, not the generator, was the bottleneck.
    pub dropped_before_forwarder: f64,
    pub forwarded: u64,
    pub measured_s: f64,
    pub datagram_bytes: usize,
    /// The forwarder thread's CPU time per datagram it read, in ns (median round).
    pub cpu_ns_per_datagram: Option<f64>,
    /// Packets per second of every round (the figures above are the median round's).
    pub rounds_per_s: Vec<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct CapacityReport {
    pub results: Vec<CapacityResult>,
    /// forward / relay packets per second.
    pub forward_vs_relay: Option<f64>,
    /// authenticated forward / forward packets per second (with keys).
    pub authenticated_vs_forward: Option<f64>,
    /// The authenticated forward port's CPU per datagram less the plain one's, in ns: what
    /// authentication costs the forwarder per datagram (verify, and seal with the trailer
    /// reused, plus 30 more bytes through the kernel).
    pub authenticated_cpu_ns_extra: Option<f64>,
    /// The plain forward port's CPU per datagram over the authenticated one's: the share of
    /// the packet rate a CPU-bound forwarder keeps with keys, steadier than the measured rate
    /// when other work shares the machine.
    pub authenticated_vs_forward_by_cpu: Option<f64>,
    pub forwarder_cpu: Option<usize>,
    pub generator_cpu: Option<usize>,
    pub wait: String,
    pub rounds: u32,
    pub seconds_per_round: f64,
}

/// What a run was: everything a reader needs to compare it with another.
#[derive(Debug, Clone, Serialize)]
pub struct Setting {
    pub busy_poll: bool,
    pub wait: String,
    pub pinned: bool,
    /// Where each thread ran, in words.
    pub placement: String,
    pub client_cpu: Option<usize>,
    pub device_cpu: Option<usize>,
    pub server_cpu: Option<usize>,
    /// The device log's medium and flush method, and what it survives.
    pub medium: String,
    /// The server store's medium (or the ideal handler).
    pub server_medium: String,
    pub server_app: String,
    /// Bytes of each SET's value.
    pub payload_bytes: usize,
    /// Bytes of each update datagram (PMNet header + encoded SET).
    pub request_datagram_bytes: usize,
    pub clients: u32,
    /// Requests in flight per client.
    pub window: u32,
    pub update_ratio: f64,
    pub keys: u64,
    pub distribution: String,
    pub zipf_exponent: Option<f64>,
    /// How key popularity changed during the run (static, hot-in, random, hot-out), every
    /// `popularity_change_every_s` by `popularity_change_count` keys.
    pub popularity: String,
    pub popularity_change_every_s: Option<f64>,
    pub popularity_change_count: Option<u64>,
    /// The rack: servers and their capacity in words (`None`: one server, no limit).
    pub rack: Option<String>,
    pub seed: u64,
    pub duration_s: Option<f64>,
    pub requests_per_mode: Option<u64>,
    pub warmup_s: f64,
    /// "loopback" (device and server started in this process) or "external".
    pub target: String,
    pub cpus_online: usize,
    /// /proc/loadavg when the run started.
    pub load_average: String,
    pub kernel: String,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub setting: Setting,
    pub results: Vec<ModeResult>,
    pub ratios: Vec<Ratio>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capacity: Option<CapacityReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub functional_check: Option<Vec<String>>,
    /// The demo's short sweep under load: baseline and pmnet at several client counts.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub under_load: Vec<LoadPoint>,
    /// Runs with the read cache on against the same runs with it off (`--cache on,off`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub cache_comparisons: Vec<CacheComparison>,
    /// Replication in the network against client- and server-side replication
    /// (`--replicas`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub replication_ratios: Vec<ReplicationRatio>,
    /// The run was stopped by a signal before every mode finished.
    pub interrupted: bool,
}

/// Baseline and pmnet side by side at one client count.
#[derive(Debug, Clone, Serialize)]
pub struct LoadPoint {
    pub clients: u32,
    pub placement: String,
    pub baseline: ModeResult,
    pub pmnet: ModeResult,
}

impl Report {
    pub fn write_json(&self, path: &Path) -> Result<(), String> {
        let text = serde_json::to_string_pretty(self)
            .map_err(|error| format!("cannot encode the report as JSON: {error}"))?;
        std::fs::write(path, text + "\n").map_err(|error| {
            format!(
                "cannot write the JSON report to {}: {error}; check that the directory exists \
                 and is writable",
                path.display()
            )
        })
    }
}

/// What a run with the cache on reports about it (`"cache"` in each JSON result).
#[derive(Debug, Clone, Serialize)]
pub struct CacheResult {
    /// Measured reads the device answered / measured reads.
    pub hit_ratio: f64,
    pub reads: u64,
    pub reads_served_by_device: u64,
    /// Items in the table when the run stopped (inserted − evicted − invalidated).
    pub items: u64,
    /// The device's counters over the whole run (warm-up included).
    pub inserts: u64,
    pub evictions: u64,
    pub invalidations: u64,
    pub fetches: u64,
    pub device_hits: u64,
    pub device_misses: u64,
    /// Misses because the reading session had requests the device had not seen settled.
    pub not_yet_servable: u64,
    /// Fetches voided by a write to their key.
    pub fetches_voided: u64,
    pub settings: String,
}

/// A run with the cache on against the same run with it off.
#[derive(Debug, Clone, Serialize)]
pub struct CacheComparison {
    pub on: String,
    pub off: String,
    /// Throughput, cache on / off.
    pub gain: f64,
    /// S × (the busiest server's share with the cache off) / (1 − hit ratio with it on).
    pub ideal_gain: Option<f64>,
    pub hit_ratio: f64,
    /// p50 of reads the device answered (cache on) / p50 of reads a server answered (off).
    pub read_p50_hit_vs_off: Option<f64>,
}

/// One mode against another at one replication factor: each figure is `numerator /
/// denominator` (below 1: the numerator is faster).
#[derive(Debug, Clone, Serialize)]
pub struct ReplicationRatio {
    pub replicas: u8,
    pub numerator: String,
    pub denominator: String,
    /// The denominator's replication factor (differs from `replicas` for the overhead of R
    /// devices against one).
    pub denominator_replicas: u8,
    pub p50: Option<f64>,
    pub p99: Option<f64>,
    pub ops_per_s: Option<f64>,
}

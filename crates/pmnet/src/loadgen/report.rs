//! Latency summaries, the JSON report and the text tables.

use std::fmt::Write as _;
use std::path::Path;

use hdrhistogram::Histogram;
use serde::Serialize;

/// Latencies are recorded in nanoseconds, from 1 ns to this bound (longer ones are clamped to
/// it and counted in `clamped`); three significant digits.
pub const HISTOGRAM_MAX_NS: u64 = 60_000_000_000;

/// A histogram of latencies in nanoseconds with the bounds above.
pub fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, HISTOGRAM_MAX_NS, 3).expect("valid histogram bounds")
}

/// Record `nanos`, clamped to the histogram's range.
pub fn record(histogram: &mut Histogram<u64>, nanos: u64) {
    let _ = histogram.record(nanos.clamp(1, HISTOGRAM_MAX_NS));
}

/// Percentiles of one set of latencies, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LatencySummary {
    pub count: u64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub mean_us: f64,
    pub min_us: f64,
    pub max_us: f64,
}

fn us(nanos: u64) -> f64 {
    // Two decimals are more than the histogram's precision at these magnitudes.
    (nanos as f64 / 10.0).round() / 100.0
}

/// The summary of `histogram`, or `None` when it is empty.
pub fn summarize(histogram: &Histogram<u64>) -> Option<LatencySummary> {
    if histogram.is_empty() {
        return None;
    }
    Some(LatencySummary {
        count: histogram.len(),
        p50_us: us(histogram.value_at_quantile(0.50)),
        p99_us: us(histogram.value_at_quantile(0.99)),
        p999_us: us(histogram.value_at_quantile(0.999)),
        mean_us: (histogram.mean() / 10.0).round() / 100.0,
        min_us: us(histogram.min()),
        max_us: us(histogram.max()),
    })
}

/// The quantiles a latency CDF is drawn at: every percent, then the tail.
const CDF_QUANTILES: [f64; 6] = [0.995, 0.999, 0.9995, 0.9999, 0.99999, 1.0];

/// Points `[quantile, µs]` of the latency CDF of `histogram` (empty when it is).
pub fn cdf_points(histogram: &Histogram<u64>) -> Vec<[f64; 2]> {
    if histogram.is_empty() {
        return Vec::new();
    }
    (1..100)
        .map(|percent| f64::from(percent) / 100.0)
        .chain(CDF_QUANTILES)
        .map(|quantile| [quantile, us(histogram.value_at_quantile(quantile))])
        .collect()
}

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
    pub cache: Option<super::cache::CacheResult>,
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

pub(super) fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some((a / b * 1000.0).round() / 1000.0),
        _ => None,
    }
}

/// The ratios worth reading: pmnet against baseline and against the echo floor, forward
/// against baseline (what the extra hop costs), for the modes that were run.
pub fn ratios(results: &[ModeResult]) -> Vec<Ratio> {
    let find = |mode: &str| results.iter().find(|result| result.mode == mode);
    let mut out = Vec::new();
    for (numerator, denominator) in [
        ("pmnet", "baseline"),
        ("pmnet+cache", "pmnet"),
        ("pmnet-auth+cache", "pmnet-auth"),
        ("pmnet", "echo"),
        ("pmnet", "forward"),
        ("forward", "baseline"),
        ("pmnet-auth", "pmnet"),
        ("forward-auth", "forward"),
        ("baseline-auth", "baseline"),
    ] {
        let (Some(a), Some(b)) = (find(numerator), find(denominator)) else {
            continue;
        };
        out.push(Ratio {
            numerator: numerator.to_owned(),
            denominator: denominator.to_owned(),
            p50: ratio(a.p50_us, b.p50_us),
            p99: ratio(a.p99_us, b.p99_us),
            p999: ratio(a.p999_us, b.p999_us),
            ops_per_s: ratio(Some(a.ops_per_s), Some(b.ops_per_s)),
        });
    }
    out
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
    pub cache_comparisons: Vec<super::cache::CacheComparison>,
    /// Replication in the network against client- and server-side replication
    /// (`--replicas`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub replication_ratios: Vec<super::replication::ReplicationRatio>,
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

pub(super) fn cell(value: Option<f64>) -> String {
    match value {
        Some(value) if value >= 1000.0 => format!("{value:.0}"),
        Some(value) => format!("{value:.1}"),
        None => "-".to_owned(),
    }
}

/// `1234567.0` as `1,234,567`.
pub fn thousands(value: f64) -> String {
    let digits = format!("{:.0}", value.max(0.0));
    let mut out = String::new();
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index) % 3 == 0 {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

/// The latency table.
pub fn results_table(results: &[ModeResult]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "  {:<11} {:<44} {:>8} {:>8} {:>9} {:>8} {:>10} {:>9}",
        "mode",
        "the client waits for",
        "p50 µs",
        "p99 µs",
        "p99.9 µs",
        "mean µs",
        "ops/s",
        "requests"
    );
    for result in results {
        let _ = writeln!(
            out,
            "  {:<11} {:<44} {:>8} {:>8} {:>9} {:>8} {:>10} {:>9}",
            result.mode,
            result.waits_for,
            cell(result.p50_us),
            cell(result.p99_us),
            cell(result.p999_us),
            cell(result.mean_us),
            thousands(result.ops_per_s),
            thousands(result.requests as f64),
        );
    }
    out
}

fn times(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_owned(), |value| format!("{value:.2}×"))
}

/// The ratio lines.
pub fn ratios_table(ratios: &[Ratio]) -> String {
    let mut out = String::new();
    for ratio in ratios {
        let _ = writeln!(
            out,
            "  {:<20} p50 {:>7}  p99 {:>7}  p99.9 {:>7}  throughput {:>7}",
            format!("{} / {}", ratio.numerator, ratio.denominator),
            times(ratio.p50),
            times(ratio.p99),
            times(ratio.p999),
            times(ratio.ops_per_s),
        );
    }
    out
}

/// The capacity table.
pub fn capacity_table(report: &CapacityReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "  {:<34} {:>10} {:>10} {:>12} {:>12}   every round, packets/s",
        "forwarder (one thread)", "packets/s", "offered/s", "not read [1]", "CPU ns/dgram"
    );
    for result in &report.results {
        let rounds: Vec<String> = result
            .rounds_per_s
            .iter()
            .map(|rate| thousands(*rate))
            .collect();
        let _ = writeln!(
            out,
            "  {:<34} {:>10} {:>10} {:>11.1}% {:>12}   {}",
            result.forwarder,
            thousands(result.packets_per_s),
            thousands(result.offered_per_s),
            result.dropped_before_forwarder * 100.0,
            result
                .cpu_ns_per_datagram
                .map_or_else(|| "-".to_owned(), |ns| format!("{ns:.0}")),
            rounds.join(" "),
        );
    }
    let _ = writeln!(
        out,
        "  (median of {} rounds of {:.1} s per forwarder, {}; [1] offered datagrams the \
         forwarder never read: above 0 % it, not the generator, was the bottleneck)",
        report.rounds,
        report.seconds_per_round,
        if report.wait == "blocking" {
            "the forwarders running side by side and the generator sending to each in turn, \
             50 ms at a time"
        } else {
            "one forwarder after the other"
        }
    );
    if let Some(ratio) = report.forward_vs_relay {
        let _ = writeln!(
            out,
            "  device forward port / plain relay: {:.0}% of the relay's packet rate",
            ratio * 100.0
        );
    }
    if let Some(ratio) = report.authenticated_vs_forward {
        let _ = writeln!(
            out,
            "  authenticated / unauthenticated forward port: {:.0}% of the packet rate (every \
             datagram verified, and sealed again when forwarded)",
            ratio * 100.0
        );
    }
    if let (Some(extra), Some(share)) = (
        report.authenticated_cpu_ns_extra,
        report.authenticated_vs_forward_by_cpu,
    ) {
        let _ = writeln!(
            out,
            "  authentication costs the forwarder {extra:.0} ns of CPU per datagram: {:.0}% of \
             the plain port's packet rate when the forwarder's CPU is the limit",
            share * 100.0
        );
    }
    out
}

/// The setting in a few lines.
pub fn setting_text(setting: &Setting) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "  wait: {} ({}); placement: {}",
        setting.wait,
        if setting.busy_poll {
            "every loop and client spins, yielding between empty polls"
        } else {
            "every loop and client sleeps in ppoll until a datagram arrives"
        },
        setting.placement
    );
    let _ = writeln!(
        out,
        "  workload: {} client{} × window {}; SET value {} B (update datagram {} B); {:.0}% \
         updates; {} keys, {}{}; seed {}",
        setting.clients,
        if setting.clients == 1 { "" } else { "s" },
        setting.window,
        setting.payload_bytes,
        setting.request_datagram_bytes,
        setting.update_ratio * 100.0,
        setting.keys,
        setting.distribution,
        setting
            .zipf_exponent
            .map_or_else(String::new, |s| format!(" (s = {s})")),
        setting.seed
    );
    let length = match (setting.duration_s, setting.requests_per_mode) {
        (_, Some(requests)) => format!("{requests} measured requests per mode"),
        (Some(seconds), None) => format!("{seconds} s measured per mode"),
        (None, None) => "-".to_owned(),
    };
    let _ = writeln!(
        out,
        "  {length} after {} s of warm-up; target: {}; {} CPUs online; load average at start: {}",
        setting.warmup_s, setting.target, setting.cpus_online, setting.load_average
    );
    if setting.popularity != "static" {
        let _ = writeln!(
            out,
            "  popularity: {} every {} s by {} keys",
            setting.popularity,
            setting.popularity_change_every_s.unwrap_or(0.0),
            setting.popularity_change_count.unwrap_or(0)
        );
    }
    if let Some(rack) = &setting.rack {
        let _ = writeln!(out, "  rack: {rack}");
    }
    let _ = writeln!(out, "  device log medium: {}", setting.medium);
    let _ = writeln!(
        out,
        "  server store ({}): {}",
        setting.server_app, setting.server_medium
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cdf_rises_to_the_maximum() {
        let mut histogram = new_histogram();
        for nanos in 1..=1000u64 {
            record(&mut histogram, nanos * 1000);
        }
        let points = cdf_points(&histogram);
        assert_eq!(points.len(), 99 + CDF_QUANTILES.len());
        assert!(points
            .windows(2)
            .all(|pair| pair[0][0] < pair[1][0] && pair[0][1] <= pair[1][1]));
        assert!((points[49][1] - 500.0).abs() < 1.0, "{:?}", points[49]);
        assert_eq!(points.last().unwrap()[0], 1.0);
        assert!((points.last().unwrap()[1] - 1000.0).abs() < 1.5);
        assert!(cdf_points(&new_histogram()).is_empty());
    }

    #[test]
    fn summaries_report_microseconds() {
        let mut histogram = new_histogram();
        for nanos in 1..=1000u64 {
            record(&mut histogram, nanos * 1000);
        }
        let summary = summarize(&histogram).unwrap();
        assert_eq!(summary.count, 1000);
        assert!((summary.p50_us - 500.0).abs() < 1.0, "{summary:?}");
        assert!((summary.p99_us - 990.0).abs() < 1.5, "{summary:?}");
        assert!((summary.p999_us - 999.0).abs() < 1.5, "{summary:?}");
        assert!((summary.max_us - 1000.0).abs() < 1.5, "{summary:?}");
        assert!(summarize(&new_histogram()).is_none());
        // Out of range values are clamped, not lost.
        record(&mut histogram, u64::MAX);
        assert_eq!(histogram.len(), 1001);
    }

    #[test]
    fn ratios_compare_the_modes_that_ran() {
        let mut pmnet = ModeResult::from_summary("pmnet", "", None);
        pmnet.p50_us = Some(10.0);
        pmnet.ops_per_s = 200.0;
        let mut baseline = ModeResult::from_summary("baseline", "", None);
        baseline.p50_us = Some(40.0);
        baseline.ops_per_s = 50.0;
        let ratios = ratios(&[baseline, pmnet]);
        assert_eq!(ratios.len(), 1, "only pmnet / baseline can be formed");
        assert_eq!(ratios[0].p50, Some(0.25));
        assert_eq!(ratios[0].ops_per_s, Some(4.0));
        assert_eq!(ratios[0].p99, None);
    }

    #[test]
    fn thousands_are_separated() {
        assert_eq!(thousands(0.0), "0");
        assert_eq!(thousands(999.4), "999");
        assert_eq!(thousands(1234567.0), "1,234,567");
    }
}

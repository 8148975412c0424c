//! The results of `pmnet bench --in-path`: a record per result, the ratios against their
//! targets, the setting, as text and as JSON.

use std::fmt::Write as _;

use serde::Serialize;

use pmnet::loadgen::thousands;

/// CPU µs per operation (an update, an echo, a datagram; a megabyte for TCP), by part.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct CpuPerOp {
    /// The device process (all its threads), when one runs.
    pub device: Option<f64>,
    /// The server process, when one runs.
    pub server: Option<f64>,
    /// The benchmark process: the clients, or the flow's sender and receiver. (Every process's
    /// figure includes the kernel's network work done in its context: on veth, what it sends
    /// is delivered, forwarded and received at once, in the sender's system time.)
    pub bench: f64,
    /// The kernel's ksoftirqd threads (the network work it deferred; what it did at once runs
    /// in, and is counted with, the process that sent the packet).
    pub ksoftirqd: f64,
    /// The whole machine's busy time, other processes' included.
    pub machine: f64,
}

/// One result: a system measured in one part of the comparison.
#[derive(Debug, Clone, Serialize)]
pub struct Record {
    /// forwarding, capacity, latency or load.
    pub part: &'static str,
    /// kernel, in-path, proxy-udp, echo or baseline.
    pub system: &'static str,
    /// udp-flow, tcp-bulk, update or echo.
    pub op: &'static str,
    /// How the device (and the clients) wait: blocking or busy-poll.
    pub wait: &'static str,
    /// The device's datapath, in words.
    pub datapath: &'static str,
    pub clients: Option<u32>,
    pub window: Option<u32>,
    pub p50_us: Option<f64>,
    pub p99_us: Option<f64>,
    pub p999_us: Option<f64>,
    pub mean_us: Option<f64>,
    /// Updates, echoes or datagrams per second (`null` for TCP).
    pub ops_per_s: Option<f64>,
    /// Megabytes (10^6 bytes) per second received (TCP).
    pub mb_per_s: Option<f64>,
    /// Requests measured, datagrams received, or bytes received.
    pub count: u64,
    pub seconds: f64,
    /// UDP flow: the fraction of the datagrams sent that did not arrive.
    pub loss: Option<f64>,
    pub cpu_us_per_op: CpuPerOp,
    /// CPUs the device and the server kept busy on average.
    pub device_cpus: Option<f64>,
    pub server_cpus: Option<f64>,
    /// CPUs other processes kept busy on average (a disturbed measurement shows here).
    pub others_cpus: f64,
    /// Requests that failed, and datagrams the clients retransmitted.
    pub failed: u64,
    pub retransmissions: u64,
    /// What the device and the server logged at warning level or above meanwhile.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// The main figure of each round (ops/s, MB/s or p50 µs), when there were several; the
    /// record is the median round by it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rounds: Vec<f64>,
}

impl Record {
    /// The figure the part compares: p50 for latency, MB/s for TCP, ops/s otherwise.
    pub fn figure(&self) -> f64 {
        if self.part == "latency" {
            self.p50_us.unwrap_or(f64::INFINITY)
        } else {
            self.mb_per_s.or(self.ops_per_s).unwrap_or(0.0)
        }
    }

    pub fn same_result(&self, other: &Record) -> bool {
        (self.part, self.system, self.op, self.wait)
            == (other.part, other.system, other.op, other.wait)
    }

    fn label(&self) -> String {
        let shape = match (self.clients, self.window) {
            (Some(clients), Some(window)) => format!(" {clients}×{window}"),
            _ => String::new(),
        };
        format!("{} {}{shape}", self.system, self.op)
    }
}

/// The median round of each result, by its figure, in the order first seen.
pub fn medians(all: Vec<Record>) -> Vec<Record> {
    let mut groups: Vec<Vec<Record>> = Vec::new();
    for record in all {
        match groups
            .iter_mut()
            .find(|group| group[0].same_result(&record))
        {
            Some(group) => group.push(record),
            None => groups.push(vec![record]),
        }
    }
    groups
        .into_iter()
        .map(|mut group| {
            let figures: Vec<f64> = group.iter().map(Record::figure).collect();
            group.sort_by(|a, b| a.figure().total_cmp(&b.figure()));
            let count = group.len();
            let mut median = group.swap_remove(count / 2);
            if count > 1 {
                median.rounds = figures;
            }
            median
        })
        .collect()
}

/// A comparison the design aims at, and whether it was met.
#[derive(Debug, Clone, Serialize)]
pub struct Ratio {
    pub part: &'static str,
    /// What is compared: "UDP datagrams/s", "p50", ...
    pub measure: &'static str,
    pub wait: &'static str,
    pub numerator: &'static str,
    pub denominator: &'static str,
    pub value: f64,
    /// "at least" or "at most".
    pub bound: &'static str,
    pub target: f64,
    pub met: bool,
}

/// The ratios the results allow.
pub fn ratios(results: &[Record]) -> Vec<Ratio> {
    let find = |part: &str, system: &str, op: &str, wait: &str| {
        results
            .iter()
            .find(|r| r.part == part && r.system == system && r.op == op && r.wait == wait)
    };
    let mut out = Vec::new();
    let mut push = |part: &'static str,
                    measure: &'static str,
                    wait: &'static str,
                    (numerator, denominator): (&'static str, &'static str),
                    values: Option<(f64, f64)>,
                    (bound, target): (&'static str, f64)| {
        let Some((top, bottom)) = values else { return };
        if bottom.is_nan() || bottom <= 0.0 || !top.is_finite() {
            return;
        }
        let value = ((top / bottom) * 1000.0).round() / 1000.0;
        let met = if bound == "at least" {
            value >= target
        } else {
            value <= target
        };
        out.push(Ratio {
            part,
            measure,
            wait,
            numerator,
            denominator,
            value,
            bound,
            target,
            met,
        });
    };
    let pair = |a: Option<&Record>, b: Option<&Record>, f: fn(&Record) -> Option<f64>| {
        Some((f(a?)?, f(b?)?))
    };
    let blocking = "blocking";
    for (op, measure, figure) in [
        (
            "udp-flow",
            "UDP datagrams/s",
            (|r: &Record| r.ops_per_s) as fn(&Record) -> Option<f64>,
        ),
        ("tcp-bulk", "TCP MB/s", |r: &Record| r.mb_per_s),
    ] {
        push(
            "forwarding",
            measure,
            blocking,
            ("in-path", "kernel"),
            pair(
                find("forwarding", "in-path", op, blocking),
                find("forwarding", "kernel", op, blocking),
                figure,
            ),
            ("at least", 0.9),
        );
    }
    push(
        "capacity",
        "updates/s",
        blocking,
        ("in-path", "proxy-udp"),
        pair(
            find("capacity", "in-path", "update", blocking),
            find("capacity", "proxy-udp", "update", blocking),
            |r| r.ops_per_s,
        ),
        ("at least", 1.5),
    );
    for wait in ["blocking", "busy-poll"] {
        push(
            "latency",
            "p50",
            wait,
            ("in-path update", "echo"),
            pair(
                find("latency", "in-path", "update", wait),
                find("latency", "echo", "echo", wait),
                |r| r.p50_us,
            ),
            ("at most", 1.3),
        );
    }
    let load = |system| find("load", system, "update", blocking);
    push(
        "load",
        "updates/s",
        blocking,
        ("in-path", "baseline"),
        pair(load("in-path"), load("baseline"), |r| r.ops_per_s),
        ("at least", 2.0),
    );
    push(
        "load",
        "p99",
        blocking,
        ("in-path", "baseline"),
        pair(load("in-path"), load("baseline"), |r| r.p99_us),
        ("at most", 1.0),
    );
    push(
        "load",
        "CPU µs per update",
        blocking,
        ("in-path device", "baseline server"),
        load("in-path")
            .and_then(|r| r.cpu_us_per_op.device)
            .zip(load("baseline").and_then(|r| r.cpu_us_per_op.server)),
        ("at most", 0.25),
    );
    out
}

/// Everything the report says about how it was measured.
#[derive(Debug, Clone, Serialize)]
pub struct InPathSetting {
    pub machine: String,
    pub cpus_online: usize,
    pub load_average_start: String,
    pub load_average_end: String,
    pub testbed: String,
    /// The device log's medium and flush method, as its banner says.
    pub device_medium: String,
    /// The server's store medium, or the ideal handler.
    pub server_medium: String,
    pub flush: String,
    pub server_app: String,
    /// The in-path device's datapath, as its banner says.
    pub datapath: String,
    pub waits: String,
    pub update_datagram_bytes: usize,
    pub udp_datagram_bytes: usize,
    pub payload_bytes: usize,
    pub keys: u64,
    pub load_clients: u32,
    pub capacity_clients: u32,
    pub capacity_window: u32,
    pub duration_s: f64,
    pub warmup_s: f64,
    pub rounds: u32,
    pub seed: u64,
    /// The commands started, as typed on their hosts (DIR: the run's directory).
    pub commands: Vec<String>,
    /// The last report line of each device run (its counters over its life).
    pub device_reports: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct InPathReport {
    pub setting: InPathSetting,
    pub results: Vec<Record>,
    pub ratios: Vec<Ratio>,
    pub interrupted: bool,
}

fn cell(value: Option<f64>, decimals: usize) -> String {
    match value {
        Some(value) if value >= 10_000.0 => thousands(value),
        Some(value) => format!("{value:.decimals$}"),
        None => "-".to_owned(),
    }
}

/// The results table.
pub fn results_text(results: &[Record]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "  {:<10} {:<26} {:<9} {:>8} {:>8} {:>11} {:>8}   {:>7} {:>7} {:>7} {:>7} {:>8}  {:>6}",
        "part",
        "system, op, clients×window",
        "wait",
        "p50 µs",
        "p99 µs",
        "ops/s",
        "MB/s",
        "device",
        "server",
        "bench",
        "ksirqd",
        "machine",
        "others"
    );
    let _ = writeln!(
        out,
        "  {:<10} {:<26} {:<9} {:>8} {:>8} {:>11} {:>8}   {:<40}  {:>6}",
        "", "", "", "", "", "", "", "CPU µs per op (TCP: per MB)", "CPUs"
    );
    for r in results {
        let cpu = &r.cpu_us_per_op;
        let _ = writeln!(
            out,
            "  {:<10} {:<26} {:<9} {:>8} {:>8} {:>11} {:>8}   {:>7} {:>7} {:>7} {:>7} {:>8}  {:>6.2}",
            r.part,
            r.label(),
            r.wait,
            cell(r.p50_us, 1),
            cell(r.p99_us, 1),
            cell(r.ops_per_s, 0),
            cell(r.mb_per_s, 1),
            cell(cpu.device, 2),
            cell(cpu.server, 2),
            cell(Some(cpu.bench), 2),
            cell(Some(cpu.ksoftirqd), 2),
            cell(Some(cpu.machine), 2),
            r.others_cpus,
        );
    }
    out
}

/// The ratios table.
pub fn ratios_text(ratios: &[Ratio]) -> String {
    let mut out = String::new();
    for ratio in ratios {
        let _ = writeln!(
            out,
            "  {:<10} {:<18} {:<9} {} / {}: {:.2}× (target {} {}×: {})",
            ratio.part,
            ratio.measure,
            ratio.wait,
            ratio.numerator,
            ratio.denominator,
            ratio.value,
            ratio.bound,
            ratio.target,
            if ratio.met { "met" } else { "NOT met" }
        );
    }
    out
}

/// Notes on the records: failures, retransmissions, losses, and a busy machine.
pub fn notes_text(results: &[Record]) -> String {
    let mut out = String::new();
    for r in results {
        let label = format!("{} {} ({})", r.part, r.label(), r.wait);
        if r.failed > 0 || r.retransmissions > 0 {
            let _ = writeln!(
                out,
                "  {label}: {} requests failed, {} datagrams retransmitted by the clients",
                r.failed, r.retransmissions
            );
        }
        for warning in &r.warnings {
            let _ = writeln!(out, "  {label}: {warning}");
        }
        if let Some(loss) = r.loss.filter(|loss| *loss > 0.001) {
            let _ = writeln!(
                out,
                "  {label}: {:.1}% of the datagrams sent were not received (the receiver or a \
                 queue on the path could not keep up)",
                loss * 100.0
            );
        }
        if r.others_cpus > 0.2 {
            let _ = writeln!(
                out,
                "  {label}: other processes kept {:.2} CPUs busy meanwhile: the figure may be \
                 disturbed",
                r.others_cpus
            );
        }
    }
    out
}

/// The setting, as printed.
pub fn setting_text(setting: &InPathSetting) -> String {
    let mut out = String::from("setting:\n");
    let mut line = |label: &str, value: &str| out.push_str(&format!("  {label}: {value}\n"));
    line("machine", &setting.machine);
    line(
        "load average",
        &format!(
            "{} at the start, {} at the end",
            setting.load_average_start, setting.load_average_end
        ),
    );
    line("testbed", &setting.testbed);
    line("device log", &setting.device_medium);
    line(
        "server",
        &format!("{}; {}", setting.server_app, setting.server_medium),
    );
    line("flush method asked for", &setting.flush);
    line("in-path datapath", &setting.datapath);
    line("wait", &setting.waits);
    line(
        "workload",
        &format!(
            "SETs of {} B values ({} B update datagrams; the UDP flow's datagrams are as large), \
             {} keys uniform; load: {} clients × 1; capacity: {} clients × {}",
            setting.payload_bytes,
            setting.update_datagram_bytes,
            setting.keys,
            setting.load_clients,
            setting.capacity_clients,
            setting.capacity_window
        ),
    );
    line(
        "measured",
        &format!(
            "{:.1} s per measurement after {:.1} s of warm-up, {} round(s) (each result the \
             median round), seed {}",
            setting.duration_s, setting.warmup_s, setting.rounds, setting.seed
        ),
    );
    out.push_str("  commands (DIR: the run's directory under --dir):\n");
    for command in &setting.commands {
        out.push_str(&format!("    {command}\n"));
    }
    out.push_str("  each device's last report line:\n");
    for report in &setting.device_reports {
        out.push_str(&format!("    {report}\n"));
    }
    out
}

//! What a run prints and writes: the results table, the ratios against the targets,
//! the setting, and the same as JSON.

use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

pub use super::cpu::CpuPerOp;
use super::load::{Measured, Op};
use super::plan::{Plan, System};
use pmnet::loadgen::thousands;

/// Both throughputs and their ratio.
#[derive(Debug, Clone, Serialize)]
pub struct ScalingSummary {
    pub members: u32,
    pub groups: u16,
    pub member_max_ops_per_s: u64,
    pub write_ratio: f64,
    pub zipf: f64,
    pub clients: u32,
    pub tail_ops_per_s: f64,
    pub any_member_ops_per_s: f64,
    /// Any member over tail only.
    pub ratio: f64,
    pub target: f64,
    pub met: bool,
}

impl ScalingSummary {
    pub fn title(&self) -> String {
        format!(
            "coord-bench --read-scaling: 3 members, each at most {} requests/s (emulated), {} \
             virtual group{}; {} clients, {:.0} % writes, keys Zipf {}",
            thousands(self.member_max_ops_per_s as f64),
            self.groups,
            if self.groups == 1 { "" } else { "s" },
            self.clients,
            self.write_ratio * 100.0,
            self.zipf
        )
    }

    pub fn verdict(&self) -> String {
        format!(
            "read scaling: reads from any member {} ops/s, at the tail only {} ops/s: {:.2}× \
             (target ≥{}: {})",
            thousands(self.any_member_ops_per_s),
            thousands(self.tail_ops_per_s),
            self.ratio,
            self.target,
            if self.met { "met" } else { "NOT met" }
        )
    }
}

/// One measured (system, op, clients).
#[derive(Debug, Clone, Serialize)]
pub struct ResultRow {
    pub system: &'static str,
    pub op: &'static str,
    pub clients: u32,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub mean_us: f64,
    /// Requests (lock: acquire/release cycles) per second.
    pub ops_per_s: f64,
    /// Requests (cycles) measured.
    pub ops: u64,
    pub seconds: f64,
    /// Lock: attempts to acquire per cycle (1: never found it held).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attempts_per_cycle: Option<f64>,
    /// With `--rounds`: every round's p50, in order (the row is the median round's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p50_us_rounds: Option<Vec<f64>>,
    /// CPU per request.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_us_per_op: Option<CpuPerOp>,
    /// Read scaling: where reads went (`any-member` or `tail`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reads_from: Option<&'static str>,
    /// Read scaling: reads per second among `ops_per_s`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reads_per_s: Option<f64>,
    /// Read scaling: each member's share of the chain requests it took.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub member_request_shares: Option<Vec<f64>>,
}

impl ResultRow {
    pub fn new(system: System, op: Op, clients: u32, measured: &Measured) -> ResultRow {
        ResultRow {
            system: system.name(),
            op: op.name(),
            clients,
            p50_us: round2(measured.p50_us),
            p99_us: round2(measured.p99_us),
            p999_us: round2(measured.p999_us),
            mean_us: round2(measured.mean_us),
            ops_per_s: measured.ops_per_s.round(),
            ops: measured.count,
            seconds: round2(measured.seconds),
            attempts_per_cycle: (op == Op::Lock && measured.count > 0)
                .then(|| round2(measured.lock_attempts as f64 / measured.count as f64)),
            p50_us_rounds: None,
            cpu_us_per_op: None,
            reads_from: None,
            reads_per_s: None,
            member_request_shares: None,
        }
    }

    /// The result in a few words, for the progress lines.
    pub fn brief(&self) -> String {
        format!(
            "p50 {} µs, p99 {} µs, {} ops/s",
            cell(self.p50_us),
            cell(self.p99_us),
            thousands(self.ops_per_s)
        )
    }
}

/// Another system against the chain store, for one op and client count.
#[derive(Debug, Clone, Serialize)]
pub struct RatioRow {
    pub op: &'static str,
    pub clients: u32,
    /// The other system.
    pub system: &'static str,
    /// Its p50 over the chain store's: how many times longer it takes.
    pub p50_ratio: f64,
    /// The chain store's throughput over its.
    pub ops_per_s_ratio: f64,
    /// The target for `p50_ratio`, if it has one (read: 5, write: 10).
    pub p50_target: Option<f64>,
    /// The target for `ops_per_s_ratio` (10 at 16 clients, reads and writes).
    pub ops_per_s_target: Option<f64>,
}

/// The targets of issue 22: the chain store's read p50 at most a fifth, its write p50 at
/// most a tenth of each other system's; its throughput at 16 clients ten times theirs.
fn targets(op: &str, clients: u32) -> (Option<f64>, Option<f64>) {
    let p50 = match op {
        "read" => Some(5.0),
        "write" => Some(10.0),
        _ => None,
    };
    let throughput = (clients >= 16 && p50.is_some()).then_some(10.0);
    (p50, throughput)
}

/// A whole run.
#[derive(Debug)]
pub struct Report {
    pub machine: String,
    pub plan: Plan,
    pub durability: Vec<(System, String)>,
    pub results: Vec<ResultRow>,
    pub ratios: Vec<RatioRow>,
    pub read_scaling: Option<ScalingSummary>,
    pub interrupted: bool,
}

fn round2(value: f64) -> f64 {
    (value * 100.0).round() / 100.0
}

fn cell(value: f64) -> String {
    if value >= 1000.0 {
        thousands(value)
    } else {
        format!("{value:.1}")
    }
}

fn verdict(ratio: f64, target: Option<f64>) -> String {
    match target {
        Some(target) if ratio >= target => format!("≥{target:.0}: met"),
        Some(target) => format!("≥{target:.0}: NOT met"),
        None => "-".to_owned(),
    }
}

impl Report {
    pub fn new(plan: &Plan) -> Report {
        Report {
            machine: crate::procs::machine_text(),
            plan: plan.clone(),
            durability: Vec::new(),
            results: Vec::new(),
            ratios: Vec::new(),
            read_scaling: None,
            interrupted: false,
        }
    }

    fn find(&self, system: System, op: &str, clients: u32) -> Option<&ResultRow> {
        self.results
            .iter()
            .find(|row| row.system == system.name() && row.op == op && row.clients == clients)
    }

    /// etcd and ZooKeeper against the chain store, wherever both were measured.
    pub fn compute_ratios(&mut self) {
        let mut ratios = Vec::new();
        for chain in self.results.iter().filter(|row| row.system == "netchain") {
            for other in [System::Etcd, System::Zookeeper] {
                let Some(row) = self.find(other, chain.op, chain.clients) else {
                    continue;
                };
                let (p50_target, ops_per_s_target) = targets(chain.op, chain.clients);
                ratios.push(RatioRow {
                    op: chain.op,
                    clients: chain.clients,
                    system: other.name(),
                    p50_ratio: round2(row.p50_us / chain.p50_us.max(0.001)),
                    ops_per_s_ratio: round2(chain.ops_per_s / row.ops_per_s.max(0.001)),
                    p50_target,
                    ops_per_s_target,
                });
            }
        }
        self.ratios = ratios;
    }

    /// The setting in lines.
    fn setting_lines(&self) -> Vec<String> {
        let plan = &self.plan;
        let mut lines = vec![
            format!("machine: {}", self.machine),
            format!(
                "all on loopback, {}; clients: closed loop, one request at a time, a \
                 thread each; {} keys written once before measuring, values of {} bytes; \
                 {:.1} s warm-up and {:.1} s measured per op{}; seed {}",
                match plan.pin {
                    Some((clients, systems)) => format!(
                        "clients pinned to CPU {clients}, every process of the systems to CPU \
                         {systems}"
                    ),
                    None => "no CPU pinning".to_owned(),
                },
                plan.keys,
                plan.value_size,
                plan.warmup.as_secs_f64(),
                plan.duration.as_secs_f64(),
                if plan.rounds > 1 {
                    format!(
                        ", {} rounds (each row the round with the median p50)",
                        plan.rounds
                    )
                } else {
                    String::new()
                },
                plan.seed
            ),
        ];
        for (system, text) in &self.durability {
            lines.push(format!("{}: {text}", system.name()));
        }
        lines
    }

    /// The whole report as text.
    pub fn text(&self) -> String {
        let mut out = String::new();
        if let Some(scaling) = &self.read_scaling {
            let _ = writeln!(out, "\n{}", scaling.title());
        } else {
            let _ = writeln!(
                out,
                "\ncoord-bench: the chain store (netchain) against etcd and ZooKeeper, 3 members \
                 each, on loopback"
            );
        }
        let _ = writeln!(
            out,
            "{:<10} {:<12} {:<12} {:>7} {:>10} {:>10} {:>10} {:>12} {:>16}",
            "system",
            "op",
            "reads from",
            "clients",
            "p50 µs",
            "p99 µs",
            "p99.9 µs",
            "ops/s",
            "CPU µs/op s+c"
        );
        for row in &self.results {
            let cpu = row.cpu_us_per_op.map_or_else(
                || "-".to_owned(),
                |cpu| format!("{:.0}+{:.0}", cpu.servers, cpu.clients),
            );
            let _ = writeln!(
                out,
                "{:<10} {:<12} {:<12} {:>7} {:>10} {:>10} {:>10} {:>12} {:>16}{}",
                row.system,
                row.op,
                row.reads_from
                    .unwrap_or(if row.system == "netchain" && row.op == "read" {
                        "any member"
                    } else {
                        "-"
                    }),
                row.clients,
                cell(row.p50_us),
                cell(row.p99_us),
                cell(row.p999_us),
                thousands(row.ops_per_s),
                cpu,
                row.attempts_per_cycle
                    .map(|attempts| format!("  ({attempts:.1} attempts a cycle)"))
                    .unwrap_or_default()
                    + &row
                        .p50_us_rounds
                        .as_ref()
                        .map(|p50s| {
                            let shown: Vec<String> = p50s.iter().map(|p50| cell(*p50)).collect();
                            format!("  (p50 of the rounds: {})", shown.join(", "))
                        })
                        .unwrap_or_default()
            );
        }
        let _ = writeln!(
            out,
            "(CPU µs/op s+c: CPU time per request, or per lock cycle, of the system's processes \
             + of the clients, warm-up included)"
        );
        let others = self
            .results
            .iter()
            .filter_map(|row| Some((row, row.cpu_us_per_op?.others_cpus?)))
            .max_by(|a, b| a.1.total_cmp(&b.1));
        if let Some((row, cpus)) = others.filter(|(_, cpus)| *cpus >= 0.05) {
            let _ = writeln!(
                out,
                "NOTE: other processes kept up to {cpus:.2} CPUs busy during a measurement ({} \
                 {} at {} clients): figures are disturbed where they ran",
                row.system, row.op, row.clients
            );
        }
        if !self.ratios.is_empty() {
            let _ = writeln!(
                out,
                "\nratios: the other system's p50 over netchain's, netchain's ops/s over the \
                 other's (targets of issue 22)"
            );
            let _ = writeln!(
                out,
                "{:<6} {:>7} {:<10} {:>8} {:<14} {:>9} {:<14}",
                "op", "clients", "vs", "p50 ×", "target", "ops/s ×", "target"
            );
            for ratio in &self.ratios {
                let _ = writeln!(
                    out,
                    "{:<6} {:>7} {:<10} {:>8.1} {:<14} {:>9.1} {:<14}",
                    ratio.op,
                    ratio.clients,
                    ratio.system,
                    ratio.p50_ratio,
                    verdict(ratio.p50_ratio, ratio.p50_target),
                    ratio.ops_per_s_ratio,
                    verdict(ratio.ops_per_s_ratio, ratio.ops_per_s_target)
                );
            }
        }
        if let Some(scaling) = &self.read_scaling {
            let _ = writeln!(out, "\n{}", scaling.verdict());
        }
        let _ = writeln!(out, "\nsetting:");
        for line in self.setting_lines() {
            let _ = writeln!(out, "  {line}");
        }
        if self.interrupted {
            let _ = writeln!(out, "interrupted: what is not shown did not run");
        }
        out
    }

    pub fn json(&self) -> serde_json::Value {
        let plan = &self.plan;
        let durability: serde_json::Map<String, serde_json::Value> = self
            .durability
            .iter()
            .map(|(system, text)| (system.name().to_owned(), text.clone().into()))
            .collect();
        serde_json::json!({
            "setting": {
                "machine": self.machine,
                "cpus_online": pmnet_runtime::online_cpu_count(),
                "systems": plan.systems.iter().map(|system| system.name()).collect::<Vec<_>>(),
                "clients": plan.clients,
                "ops": plan.ops.iter().map(|op| op.name()).collect::<Vec<_>>(),
                "value_bytes": plan.value_size,
                "keys": plan.keys,
                "key_distribution": if self.read_scaling.is_some() { "zipf" } else { "uniform" },
                "netchain_groups": plan.groups,
                "warmup_s": plan.warmup.as_secs_f64(),
                "duration_s": plan.duration.as_secs_f64(),
                "rounds": plan.rounds,
                "seed": plan.seed,
                "pinned": plan.pin.map(|(clients, systems)| serde_json::json!({
                    "clients_cpu": clients,
                    "systems_cpu": systems,
                })),
                "durability": durability,
            },
            "results": self.results,
            "ratios": self.ratios,
            "read_scaling": self.read_scaling,
            "interrupted": self.interrupted,
        })
    }

    pub fn write_json(&self, path: &Path) -> Result<(), String> {
        let text = serde_json::to_string_pretty(&self.json())
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

#[cfg(test)]
mod tests {
    use super::*;

    fn row(system: System, op: Op, clients: u32, p50_us: f64, ops_per_s: f64) -> ResultRow {
        let measured = Measured {
            count: 100,
            lock_attempts: 150,
            p50_us,
            p99_us: p50_us * 2.0,
            p999_us: p50_us * 3.0,
            mean_us: p50_us,
            ops_per_s,
            seconds: 1.0,
            ..Measured::default()
        };
        ResultRow::new(system, op, clients, &measured)
    }

    #[test]
    fn ratios_compare_each_other_system_with_the_chain_store_against_the_targets() {
        let args = crate::coord_bench::tests_support::default_args();
        let mut report = Report::new(&Plan::from_args(&args).unwrap());
        report.results = vec![
            row(System::Netchain, Op::Read, 16, 50.0, 100_000.0),
            row(System::Etcd, Op::Read, 16, 400.0, 20_000.0),
            row(System::Zookeeper, Op::Read, 16, 200.0, 5_000.0),
            row(System::Netchain, Op::Write, 1, 100.0, 10_000.0),
            row(System::Etcd, Op::Write, 1, 2_000.0, 500.0),
            row(System::Netchain, Op::Lock, 1, 300.0, 3_000.0),
            row(System::Zookeeper, Op::Lock, 1, 900.0, 1_000.0),
        ];
        report.compute_ratios();
        let find = |op: &str, system: &str| {
            report
                .ratios
                .iter()
                .find(|ratio| ratio.op == op && ratio.system == system)
                .unwrap()
                .clone()
        };
        let read_etcd = find("read", "etcd");
        assert_eq!((read_etcd.p50_ratio, read_etcd.ops_per_s_ratio), (8.0, 5.0));
        assert_eq!(
            (read_etcd.p50_target, read_etcd.ops_per_s_target),
            (Some(5.0), Some(10.0))
        );
        assert_eq!(find("read", "zookeeper").ops_per_s_ratio, 20.0);
        let write = find("write", "etcd");
        assert_eq!(
            (write.p50_target, write.ops_per_s_target),
            (Some(10.0), None)
        );
        let lock = find("lock", "zookeeper");
        assert_eq!((lock.p50_ratio, lock.p50_target), (3.0, None));
        assert_eq!(report.ratios.len(), 4);
        let text = report.text();
        assert!(text.contains("≥5: met"), "{text}");
        assert!(text.contains("≥10: NOT met"), "{text}");
        assert!(text.contains("(1.5 attempts a cycle)"), "{text}");
        let json = report.json();
        assert_eq!(json["results"].as_array().unwrap().len(), 7);
        assert_eq!(json["results"][0]["system"], "netchain");
        assert_eq!(json["results"][0]["op"], "read");
        assert_eq!(json["ratios"][0]["p50_ratio"], 8.0);
        assert_eq!(json["setting"]["value_bytes"], 64);
    }
}

//! What a run prints and writes: per workload each system's throughput and latencies (its
//! median round), the CPU each part spent per operation in that round, the ratios PMNet /
//! baseline, the checks, and the setting; the same as JSON.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

use super::client::RoundOutcome;
use super::cpu::{SystemCpu, CLIENTS, PARTS};
use super::systems::GatewayCommands;
use super::workloads::Check;
use pmnet::loadgen::{summarize, thousands, LatencySummary};

#[derive(Debug, Clone, Serialize)]
pub struct Setting {
    pub clients: u32,
    pub payload_bytes: usize,
    pub records: u64,
    pub duration_s: f64,
    pub warmup_s: f64,
    pub rounds: u32,
    pub seed: u64,
    pub workloads: Vec<&'static str>,
    pub systems: Vec<&'static str>,
    pub cpus: usize,
    pub machine: String,
    pub redis_server: String,
    /// Where both Redis servers' append-only files are, and how they are made durable.
    pub redis_media: String,
    /// The PMNet device's log: medium and flush method, as its banner says.
    pub pmnet_device_media: Option<String>,
    /// What the adaptor says of its Redis's durability (the adaptor only; the module's
    /// persistence is in `pmnet_server_side_said`).
    pub pmnet_adaptor_media: Option<String>,
    pub pmnet_placement: Option<String>,
    /// PMNet's server side measured: `module` (inside its redis-server) or `adaptor`.
    pub pmnet_server_side: Option<&'static str>,
    /// What `pmnet redis-up` said of its server side (its `server side:` line).
    pub pmnet_server_side_said: Option<String>,
    /// Why the adaptor was measured when the module is the default (its file not found).
    pub pmnet_server_side_note: Option<String>,
    pub pmnet_command: String,
}

/// One system's figures for one workload.
#[derive(Debug, Clone, Serialize)]
pub struct SystemResult {
    pub system: &'static str,
    pub ops_per_s: f64,
    /// Operations that write, per second.
    pub update_ops_per_s: f64,
    pub all: Option<LatencySummary>,
    pub updates: Option<LatencySummary>,
    pub ops: u64,
    pub update_ops: u64,
    pub seconds: f64,
    pub errors: u64,
    pub error_samples: Vec<String>,
    /// Requests of the measured operations by the gateway's routing (the same for both
    /// systems' clients): updates and bypass requests.
    pub update_requests: u64,
    pub bypass_requests: u64,
    pub bypass_share: Option<f64>,
    /// The round reported (1-based): the median by update operations per second.
    pub median_round: u32,
    pub rounds_update_ops_per_s: Vec<f64>,
    pub check: Check,
    /// The workload's counters (all rounds, warm-ups included).
    pub counters: BTreeMap<String, u64>,
    /// (pmnet) The gateway's own counts over the whole run, warm-ups, closing reads and the
    /// comparison of keys included.
    pub gateway_commands: Option<GatewayCommands>,
    /// The CPU time each part spent per operation in the median round's measured interval.
    pub cpu: Option<SystemCpu>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Agreement {
    pub keys: usize,
    pub agreed: usize,
    pub disagreeing: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct WorkloadResult {
    pub workload: &'static str,
    pub mix: &'static str,
    pub systems: Vec<SystemResult>,
    /// Update operations/s, pmnet / baseline.
    pub update_throughput_ratio: Option<f64>,
    /// p99 of update operations, baseline / pmnet.
    pub update_p99_ratio: Option<f64>,
    /// All operations/s, pmnet / baseline.
    pub throughput_ratio: Option<f64>,
    /// p99 of all operations, baseline / pmnet.
    pub p99_ratio: Option<f64>,
    /// Share of the requests that were bypass requests through the gateway.
    pub bypass_share: Option<f64>,
    /// CPU per operation of PMNet's redis-server / the baseline's (Redis alone's).
    pub redis_cpu_ratio: Option<f64>,
    /// CPU per operation of all PMNet's parts (gateway, device, adaptor, redis-server) /
    /// Redis alone's.
    pub system_cpu_ratio: Option<f64>,
    /// Every system's check passed (and the keys read through the gateway agreed).
    pub invariants_hold: bool,
    /// (pmnet) Keys read through the gateway and directly from its Redis.
    pub gateway_agreement: Option<Agreement>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Averages {
    pub update_throughput_ratio: Option<f64>,
    pub update_p99_ratio: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub setting: Setting,
    pub workloads: Vec<WorkloadResult>,
    pub averages: Averages,
    pub interrupted: bool,
}

/// One system's result from its rounds: the median round by update operations per second.
pub fn system_result(
    system: &'static str,
    rounds: &[RoundOutcome],
    check: Check,
    counters: BTreeMap<String, u64>,
    gateway_commands: Option<GatewayCommands>,
) -> Option<SystemResult> {
    let rate = |round: &RoundOutcome| round.update_ops as f64 / round.seconds.max(1e-9);
    let mut order: Vec<usize> = (0..rounds.len()).collect();
    order.sort_by(|&a, &b| rate(&rounds[a]).total_cmp(&rate(&rounds[b])));
    let median = *order.get(order.len() / 2)?;
    let round = &rounds[median];
    let requests = round.update_requests + round.bypass_requests;
    Some(SystemResult {
        system,
        ops_per_s: round.ops as f64 / round.seconds.max(1e-9),
        update_ops_per_s: rate(round),
        all: summarize(&round.all),
        updates: summarize(&round.updates),
        ops: round.ops,
        update_ops: round.update_ops,
        seconds: round.seconds,
        errors: rounds.iter().map(|r| r.errors).sum(),
        error_samples: rounds
            .iter()
            .flat_map(|r| r.error_samples.iter().cloned())
            .take(5)
            .collect(),
        update_requests: round.update_requests,
        bypass_requests: round.bypass_requests,
        bypass_share: (requests > 0).then(|| round.bypass_requests as f64 / requests as f64),
        median_round: median as u32 + 1,
        rounds_update_ops_per_s: rounds
            .iter()
            .map(|r| (rate(r) * 10.0).round() / 10.0)
            .collect(),
        check,
        counters,
        gateway_commands,
        cpu: round
            .cpu
            .as_ref()
            .map(|spent| SystemCpu::new(spent, round.ops, round.update_ops)),
    })
}

fn ratio(numerator: Option<f64>, denominator: Option<f64>) -> Option<f64> {
    match (numerator, denominator) {
        (Some(n), Some(d)) if d > 0.0 && n.is_finite() => Some((n / d * 1000.0).round() / 1000.0),
        _ => None,
    }
}

impl WorkloadResult {
    pub fn new(
        workload: &'static str,
        mix: &'static str,
        systems: Vec<SystemResult>,
        gateway_agreement: Option<Agreement>,
    ) -> WorkloadResult {
        let find = |name: &str| systems.iter().find(|s| s.system == name);
        let (base, pmnet) = (find("baseline"), find("pmnet"));
        let p99 = |s: Option<&SystemResult>, all: bool| {
            s.and_then(|s| if all { s.all } else { s.updates }.map(|l| l.p99_us))
        };
        let cpu = |s: Option<&SystemResult>, part: Option<&str>| {
            let cpu = s?.cpu.as_ref()?;
            match part {
                Some(part) => cpu.part(part)?.us_per_op,
                None => cpu.system_us_per_op,
            }
        };
        let invariants_hold = systems.iter().all(|s| s.check.passed)
            && gateway_agreement
                .as_ref()
                .is_none_or(|a| a.agreed == a.keys);
        WorkloadResult {
            workload,
            mix,
            update_throughput_ratio: ratio(
                pmnet.map(|s| s.update_ops_per_s),
                base.map(|s| s.update_ops_per_s),
            ),
            update_p99_ratio: ratio(p99(base, false), p99(pmnet, false)),
            throughput_ratio: ratio(pmnet.map(|s| s.ops_per_s), base.map(|s| s.ops_per_s)),
            p99_ratio: ratio(p99(base, true), p99(pmnet, true)),
            bypass_share: pmnet.or(base).and_then(|s| s.bypass_share),
            redis_cpu_ratio: ratio(
                cpu(pmnet, Some("redis-server")),
                cpu(base, Some("redis-server")),
            ),
            system_cpu_ratio: ratio(cpu(pmnet, None), cpu(base, None)),
            invariants_hold,
            gateway_agreement,
            systems,
        }
    }
}

/// PMNet's parts against Redis alone's CPU per operation, as `pmnet bench` sets the device
/// and the server against the baseline server's.
fn cpu_ratios(workload: &WorkloadResult) -> Option<String> {
    let find = |name: &str| {
        workload
            .systems
            .iter()
            .find(|s| s.system == name)
            .and_then(|s| s.cpu.as_ref())
    };
    let (base, pmnet) = (find("baseline")?, find("pmnet")?);
    let alone = base
        .part("redis-server")?
        .us_per_op
        .filter(|us| *us > 0.0)?;
    let mut parts: Vec<String> = pmnet
        .parts
        .iter()
        .filter(|part| part.part != CLIENTS)
        .filter_map(|part| Some(format!("{} {:.2}×", part.part, part.us_per_op? / alone)))
        .collect();
    if let Some(system) = pmnet.system_us_per_op {
        parts.push(format!("sum {:.2}×", system / alone));
    }
    Some(format!(
        "pmnet: {} Redis alone's CPU per operation",
        parts.join(", ")
    ))
}

fn mean(values: impl Iterator<Item = Option<f64>>) -> Option<f64> {
    let values: Vec<f64> = values.flatten().collect();
    (!values.is_empty())
        .then(|| (values.iter().sum::<f64>() / values.len() as f64 * 1000.0).round() / 1000.0)
}

impl Report {
    /// The CPU tables: µs per operation and per update operation of each part, each system's
    /// median round, and PMNet's parts against Redis alone's.
    fn cpu_text(&self) -> String {
        let mut out = String::new();
        let measured = |name: &str| {
            self.workloads.iter().any(|w| {
                w.systems
                    .iter()
                    .any(|s| s.cpu.as_ref().is_some_and(|cpu| cpu.part(name).is_some()))
            })
        };
        let parts: Vec<&str> = PARTS.into_iter().filter(|part| measured(part)).collect();
        if parts.is_empty() {
            return out;
        }
        let cell = |value: Option<f64>| value.map_or("-".to_owned(), |v| format!("{v:.2}"));
        for per_update in [false, true] {
            let _ = writeln!(
                out,
                "\nCPU µs per {} (user + system, all threads of the part, over the median \
                 round's measured interval{}; sum: every part but the clients)",
                if per_update {
                    "update operation"
                } else {
                    "operation"
                },
                if per_update {
                    ": all its CPU time over the update operations"
                } else {
                    ""
                }
            );
            let mut header = format!("{:<8} {:<8}", "workload", "system");
            for part in &parts {
                let _ = write!(header, " {part:>12}");
            }
            let _ = write!(header, " {:>10}", "sum");
            if !per_update {
                let _ = write!(header, " {:>12}", "others CPUs");
            }
            let _ = writeln!(out, "{header}");
            for workload in &self.workloads {
                for system in &workload.systems {
                    let Some(cpu) = system.cpu.as_ref() else {
                        continue;
                    };
                    let mut line = format!("{:<8} {:<8}", workload.workload, system.system);
                    for part in &parts {
                        let value = cpu.part(part).and_then(|p| {
                            if per_update {
                                p.us_per_update
                            } else {
                                p.us_per_op
                            }
                        });
                        let _ = write!(line, " {:>12}", cell(value));
                    }
                    let system_us = if per_update {
                        cpu.system_us_per_update
                    } else {
                        cpu.system_us_per_op
                    };
                    let _ = write!(line, " {:>10}", cell(system_us));
                    if !per_update {
                        let _ = write!(line, " {:>12}", cell(cpu.others_cpus));
                    }
                    let _ = writeln!(out, "{line}");
                }
                if !per_update {
                    if let Some(line) = cpu_ratios(workload) {
                        let _ = writeln!(out, "{:<8} {line}", "");
                    }
                }
            }
        }
        out
    }

    pub fn new(setting: Setting) -> Report {
        Report {
            setting,
            workloads: Vec::new(),
            averages: Averages {
                update_throughput_ratio: None,
                update_p99_ratio: None,
            },
            interrupted: false,
        }
    }

    pub fn compute_averages(&mut self) {
        self.averages = Averages {
            update_throughput_ratio: mean(self.workloads.iter().map(|w| w.update_throughput_ratio)),
            update_p99_ratio: mean(self.workloads.iter().map(|w| w.update_p99_ratio)),
        };
    }

    pub fn write_json(&self, path: &Path) -> Result<(), String> {
        let text = serde_json::to_string_pretty(self).map_err(|error| error.to_string())?;
        std::fs::write(path, text + "\n")
            .map_err(|error| format!("cannot write {}: {error}", path.display()))
    }

    pub fn text(&self) -> String {
        let mut out = String::new();
        let s = &self.setting;
        let _ = writeln!(
            out,
            "\nRedis workloads: {} closed-loop clients (one request at a time, TCP), {} B values, \
             {} records; {} s measured after {} s warm-up, {} round(s), median round; seed {}",
            s.clients, s.payload_bytes, s.records, s.duration_s, s.warmup_s, s.rounds, s.seed
        );
        let _ = writeln!(out, "  machine: {}", s.machine);
        let _ = writeln!(out, "  redis: {}; {}", s.redis_server, s.redis_media);
        if let Some(device) = &s.pmnet_device_media {
            let _ = writeln!(out, "  pmnet: `{}`; device log: {device}", s.pmnet_command);
        }
        if let Some(side) = s.pmnet_server_side {
            let said = s.pmnet_server_side_said.as_deref().unwrap_or("-");
            let _ = writeln!(out, "  pmnet server side: {side} (redis-up: {said})");
        }
        if let Some(note) = &s.pmnet_server_side_note {
            let _ = writeln!(out, "  pmnet server side: {note}");
        }
        if let Some(placement) = &s.pmnet_placement {
            let _ = writeln!(out, "  pmnet redis-up {placement}");
        }
        let _ = writeln!(
            out,
            "\n{:<8} {:<8} {:>9} {:>10} | {:>8} {:>8} {:>9} | updates: {:>8} {:>8} {:>9} | {:>6} {:>7}",
            "workload", "system", "ops/s", "updates/s", "p50 µs", "p99 µs", "p99.9 µs", "p50 µs",
            "p99 µs", "p99.9 µs", "errors", "bypass"
        );
        for workload in &self.workloads {
            for system in &workload.systems {
                let l = |s: Option<LatencySummary>, f: fn(&LatencySummary) -> f64| {
                    s.map_or("-".to_owned(), |s| format!("{:.0}", f(&s)))
                };
                let _ = writeln!(
                    out,
                    "{:<8} {:<8} {:>9} {:>10} | {:>8} {:>8} {:>9} | updates: {:>8} {:>8} {:>9} | {:>6} {:>7}",
                    workload.workload,
                    system.system,
                    thousands(system.ops_per_s),
                    thousands(system.update_ops_per_s),
                    l(system.all, |s| s.p50_us),
                    l(system.all, |s| s.p99_us),
                    l(system.all, |s| s.p999_us),
                    l(system.updates, |s| s.p50_us),
                    l(system.updates, |s| s.p99_us),
                    l(system.updates, |s| s.p999_us),
                    system.errors,
                    system
                        .bypass_share
                        .map_or("-".to_owned(), |b| format!("{:.1} %", b * 100.0)),
                );
            }
            let x = |r: Option<f64>| r.map_or("-".to_owned(), |r| format!("{r:.2}×"));
            let _ = writeln!(
                out,
                "{:<8} pmnet/baseline: updates/s {}, ops/s {}; baseline/pmnet p99: updates {}, all {}; checks {}",
                "",
                x(workload.update_throughput_ratio),
                x(workload.throughput_ratio),
                x(workload.update_p99_ratio),
                x(workload.p99_ratio),
                if workload.invariants_hold { "passed" } else { "FAILED" }
            );
        }
        out.push_str(&self.cpu_text());
        let x = |r: Option<f64>| r.map_or("-".to_owned(), |r| format!("{r:.2}×"));
        let _ = writeln!(
            out,
            "\naverage over the workloads: update throughput pmnet/baseline {}, update p99 \
             baseline/pmnet {} (the paper: 4.31× and 3.23×)",
            x(self.averages.update_throughput_ratio),
            x(self.averages.update_p99_ratio)
        );
        for workload in &self.workloads {
            for system in &workload.systems {
                let failed: Vec<&String> = system
                    .check
                    .details
                    .iter()
                    .filter(|d| d.starts_with("FAILED"))
                    .collect();
                for line in failed {
                    let _ = writeln!(out, "{} {}: {line}", workload.workload, system.system);
                }
                for sample in &system.error_samples {
                    let _ = writeln!(
                        out,
                        "{} {} error: {sample}",
                        workload.workload, system.system
                    );
                }
            }
            if let Some(agreement) = workload.gateway_agreement.as_ref() {
                if agreement.agreed != agreement.keys {
                    let _ = writeln!(
                        out,
                        "{}: FAILED: {} of {} keys read through the gateway differ from Redis: {}",
                        workload.workload,
                        agreement.keys - agreement.agreed,
                        agreement.keys,
                        agreement.disagreeing.join(", ")
                    );
                }
            }
        }
        if self.interrupted {
            let _ = writeln!(
                out,
                "(interrupted: the results above are what was measured)"
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redis_bench::cpu::Spent;
    use crate::redis_bench::workloads::Check;
    use pmnet::loadgen::{new_histogram, record};

    fn outcome(ops: u64, parts: Vec<(&'static str, Option<f64>)>) -> RoundOutcome {
        let mut all = new_histogram();
        let mut updates = new_histogram();
        for index in 0..ops {
            record(&mut all, 100_000);
            if index % 2 == 0 {
                record(&mut updates, 100_000);
            }
        }
        RoundOutcome {
            ops,
            update_ops: updates.len(),
            all,
            updates,
            seconds: 1.0,
            update_requests: ops / 2,
            bypass_requests: ops / 2,
            errors: 0,
            error_samples: Vec::new(),
            interrupted: false,
            cpu: Some(Spent {
                parts,
                others_cpus: Some(0.0),
            }),
        }
    }

    fn setting() -> Setting {
        Setting {
            clients: 1,
            payload_bytes: 100,
            records: 10,
            duration_s: 1.0,
            warmup_s: 0.0,
            rounds: 1,
            seed: 1,
            workloads: vec!["ycsb-a"],
            systems: vec!["baseline", "pmnet"],
            cpus: 2,
            machine: String::new(),
            redis_server: String::new(),
            redis_media: String::new(),
            pmnet_device_media: None,
            pmnet_adaptor_media: None,
            pmnet_placement: None,
            pmnet_server_side: Some("module"),
            pmnet_server_side_said: Some("the PMNet module inside redis-server".to_owned()),
            pmnet_server_side_note: None,
            pmnet_command: String::new(),
        }
    }

    #[test]
    fn each_part_s_cpu_per_operation_is_set_next_to_redis_alone_s() {
        let baseline = outcome(
            1000,
            vec![("clients", Some(0.01)), ("redis-server", Some(0.02))],
        );
        let pmnet = outcome(
            1000,
            vec![
                ("clients", Some(0.01)),
                ("redis-server", Some(0.01)),
                ("device", Some(0.005)),
                ("gateway", Some(0.015)),
            ],
        );
        let systems = [("baseline", baseline), ("pmnet", pmnet)]
            .into_iter()
            .map(|(name, round)| {
                system_result(name, &[round], Check::new(), BTreeMap::new(), None).unwrap()
            })
            .collect();
        let workload = WorkloadResult::new("ycsb-a", "", systems, None);
        assert_eq!(workload.redis_cpu_ratio, Some(0.5));
        assert_eq!(workload.system_cpu_ratio, Some(1.5));
        let pmnet = workload.systems[1].cpu.as_ref().unwrap();
        assert_eq!(pmnet.part("gateway").unwrap().us_per_op, Some(15.0));
        assert_eq!(pmnet.part("gateway").unwrap().us_per_update, Some(30.0));
        let mut report = Report::new(setting());
        report.workloads.push(workload);
        let text = report.text();
        assert!(text.contains("pmnet server side: module"), "{text}");
        assert!(text.contains("CPU µs per operation"), "{text}");
        assert!(text.contains("CPU µs per update operation"), "{text}");
        assert!(!text.contains("adaptor"), "no adaptor was measured: {text}");
        assert!(
            text.contains(
                "pmnet: gateway 0.75×, device 0.25×, redis-server 0.50×, sum 1.50× Redis alone's \
                 CPU per operation"
            ),
            "{text}"
        );
    }
}

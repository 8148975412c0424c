//! The chain store against etcd and ZooKeeper (`pmnet coord-bench`): latency at one client,
//! throughput at 16, the ratios against the chain store's targets (docs/benchmarks.md), and a member killed under load
//! (`pmnet coord-bench --failover`).

use std::path::Path;

use serde_json::Value;

use super::shared::{entries, seconds, text};
use crate::eval::model::{
    args, number, on_path, ratio, result_of, Comparison, Experiment, Invocation, Outcome, Settings,
    StepOutput,
};
use crate::eval::plot::{Figure, Mark, Panel};

const COMPARE: &str = "netchain, etcd, ZooKeeper";
const FAILOVER: &str = "failover";
/// Where coord-bench looks for ZooKeeper by default (`--zookeeper-jar`).
const ZOOKEEPER_JAR: &str = "/usr/share/java/zookeeper.jar";
const LOADED: f64 = 16.0;

const SYSTEMS: [(&str, &str); 3] = [
    ("netchain", "chain store (netchain)"),
    ("etcd", "etcd"),
    ("zookeeper", "ZooKeeper"),
];

const LATENCY_SHORT: &str = "A request to the chain is a handful of hand-offs between \
    processes (a write: client, head, middle, tail and back), each a thread wake-up on this \
    2-vCPU VM, about 20 µs more when it crosses CPUs: the ratio depends on where the scheduler \
    puts the processes (docs/benchmarks.md, \"Why the latency targets depend on placement\"). \
    NetChain's switches forward in their pipelines, with no wake-ups.";

const THROUGHPUT_SHORT: &str = "At 16 clients every system is CPU-bound on the same two vCPUs, \
    so the ratio is the ratio of CPU per request, the clients' included; a chain-store write \
    costs its three members about ten datagrams (docs/benchmarks.md, \"Why throughput at 16 \
    clients stops at 5–10× against ZooKeeper\").";

/// The systems installed here (how coord-bench finds them: `etcd` on the path, ZooKeeper's jar
/// and `java`).
fn systems() -> Vec<&'static str> {
    let mut found = vec!["netchain"];
    if on_path("etcd") {
        found.push("etcd");
    }
    if Path::new(ZOOKEEPER_JAR).is_file() && on_path("java") {
        found.push("zookeeper");
    }
    found
}

fn ops(settings: &Settings) -> &'static str {
    settings
        .scale
        .pick("read,write", "read,write,lock", "read,write,lock")
}

/// (duration, warm-up) of the failover run.
fn failover_timing(settings: &Settings) -> (f64, f64) {
    settings.scale.pick((1.0, 0.5), (3.0, 1.0), (5.0, 1.0))
}

fn plan(settings: &Settings) -> Result<Vec<Invocation>, String> {
    let found = systems();
    if found.len() == 1 {
        return Err(
            "neither etcd nor ZooKeeper is installed (`apt-get install -y etcd-server \
                    zookeeper`): nothing to compare the chain store with"
                .to_owned(),
        );
    }
    let (duration, warmup, rounds) = settings.measure();
    let dir = settings.dir.to_string_lossy();
    let seed = settings.seed.to_string();
    let ops = ops(settings);
    let command = args(&[
        "coord-bench",
        "--system",
        &found.join(","),
        "--op",
        ops,
        "--clients",
        "1,16",
        "--duration",
        &seconds(duration),
        "--warmup",
        &seconds(warmup),
        "--rounds",
        &rounds.to_string(),
        "--seed",
        &seed,
        "--netchain-dir",
        &dir,
    ]);
    // Each system starts (ZooKeeper's JVMs take the longest) and writes its keys, then every op
    // at two client counts, each round.
    let start: f64 = found
        .iter()
        .map(|system| match *system {
            "zookeeper" => 5.0,
            "etcd" => 2.0,
            _ => 1.0,
        })
        .sum();
    let phases = (found.len() * ops.split(',').count() * 2) as f64;
    let estimate = start + phases * (duration + warmup + 0.1) * f64::from(rounds);
    let (fail_duration, fail_warmup) = failover_timing(settings);
    let failover = args(&[
        "coord-bench",
        "--failover",
        "--duration",
        &seconds(fail_duration),
        "--warmup",
        &seconds(fail_warmup),
        "--seed",
        &seed,
        "--netchain-dir",
        &dir,
    ]);
    Ok(vec![
        Invocation::new(COMPARE, command, estimate),
        Invocation::new(FAILOVER, failover, fail_duration + fail_warmup + 1.5),
    ])
}

/// The result of `system`'s `op` at `clients`.
fn result<'a>(
    report: Option<&'a Value>,
    system: &str,
    op: &str,
    clients: f64,
) -> Option<&'a Value> {
    entries(report, "results").iter().find(|r| {
        text(r, "system") == Some(system)
            && text(r, "op") == Some(op)
            && number(r, &["clients"]) == Some(clients)
    })
}

fn name_of(system: &str) -> &str {
    SYSTEMS
        .iter()
        .find(|(id, _)| *id == system)
        .map_or(system, |(_, name)| name)
}

fn analyse(settings: &Settings, steps: &[StepOutput]) -> Outcome {
    let report = result_of(steps, COMPARE);
    // Not the same promise: said on every row that compares them.
    let medium = settings.medium.split(';').next().unwrap_or("").trim();
    let durability = format!(
        " (not the same durability: chain store on {}; etcd and ZooKeeper fsync each write)",
        if medium.is_empty() {
            "its medium"
        } else {
            medium
        }
    );
    let measured_ops: Vec<&str> = ["read", "write", "lock"]
        .into_iter()
        .filter(|op| {
            entries(report, "results")
                .iter()
                .any(|r| text(r, "op") == Some(op))
        })
        .collect();
    let bars = |clients: f64, key: &str, title: &str, y_label: &str| {
        super::shared::bars_by_op(title, y_label, &measured_ops, &SYSTEMS, |system, op| {
            result(report, system, op, clients).and_then(|r| number(r, &[key]))
        })
    };
    let latency = bars(
        1.0,
        "p50_us",
        "p50 latency, 1 client (lock: an acquire-release cycle)",
        "p50 latency (µs)",
    );
    let throughput = bars(
        LOADED,
        "ops_per_s",
        "Throughput, 16 clients (lock: cycles/s)",
        "operations/s",
    );

    // The chain store's targets as coord-bench reports them: the other system's p50 over netchain's
    // at one client, netchain's throughput over the other's at 16.
    let ratios = entries(report, "ratios");
    let ratio_of = |op: &str, clients: f64, other: &str, key: &str| {
        ratios
            .iter()
            .find(|r| {
                text(r, "op") == Some(op)
                    && text(r, "system") == Some(other)
                    && number(r, &["clients"]) == Some(clients)
            })
            .and_then(|r| {
                Some((
                    number(r, &[key])?,
                    number(r, &[&key.replace("ratio", "target")]),
                ))
            })
    };
    let kinds = [
        ("read", 1.0, "p50_ratio", "read p50"),
        ("write", 1.0, "p50_ratio", "write p50"),
        ("read", LOADED, "ops_per_s_ratio", "read ops/s"),
        ("write", LOADED, "ops_per_s_ratio", "write ops/s"),
    ];
    let mut factors = Panel::bars(
        "The chain store's factor (latency at 1 client, throughput at 16)",
        "factor (×)",
        kinds.iter().map(|k| k.3.to_owned()).collect(),
    );
    let mut comparisons = Vec::new();
    // Each category's own target (reads' p50 5×, the rest 10×), over its bars alone.
    for (index, (op, clients, key, _)) in kinds.iter().enumerate() {
        let target = ["etcd", "zookeeper"]
            .iter()
            .find_map(|other| ratio_of(op, *clients, other, key).and_then(|(_, target)| target));
        if let Some(target) = target {
            factors = factors.mark(Mark::Target {
                label: "target".to_owned(),
                x: index as f64,
                y: target,
            });
        }
    }
    for other in ["etcd", "zookeeper"] {
        let points = kinds
            .iter()
            .enumerate()
            .filter_map(|(index, (op, clients, key, _))| {
                ratio_of(op, *clients, other, key).map(|(value, _)| (index as f64, value))
            })
            .collect();
        factors = factors.series(&format!("against {}", name_of(other)), points);
        for (op, clients, key, _) in kinds {
            let Some((value, target)) = ratio_of(op, clients, other, key) else {
                continue;
            };
            let what = if key == "p50_ratio" {
                format!(
                    "{op} p50, {} / chain store, 1 client{durability}",
                    name_of(other)
                )
            } else {
                format!(
                    "{op} ops/s, chain store / {}, 16 clients{durability}",
                    name_of(other)
                )
            };
            let comparison = Comparison::new(what, Some(value), "×");
            comparisons.push(match target {
                Some(target) => comparison.target(
                    target,
                    if key == "p50_ratio" {
                        LATENCY_SHORT
                    } else {
                        THROUGHPUT_SHORT
                    },
                ),
                None => comparison,
            });
        }
    }

    let failover = result_of(steps, FAILOVER).and_then(|r| r.get("failover"));
    let get = |key: &str| failover.and_then(|f| number(f, &[key]));
    let (before, during) = (get("ops_per_s_before"), get("ops_per_s_during_recovery"));
    let title = match (get("failover_ms"), get("recovery_ms")) {
        (Some(failover), Some(recovery)) => format!(
            "A member killed: writes again after {failover:.0} ms, spare in after {recovery:.0} ms"
        ),
        _ => "A member killed under 16 writing clients".to_owned(),
    };
    let kill = Panel::bars(
        &title,
        "writes/s",
        vec![
            "before the kill".to_owned(),
            "while the spare is copied in".to_owned(),
        ],
    )
    .series(
        "chain store, 16 clients",
        [before, during]
            .iter()
            .enumerate()
            .filter_map(|(index, y)| y.map(|y| (index as f64, y)))
            .collect(),
    );
    let kill = match before {
        Some(before) => kill.mark(Mark::Level {
            label: "target while copied in: 80 % of before".to_owned(),
            y: 0.8 * before,
        }),
        None => kill,
    };
    comparisons.push(Comparison::new(
        "a member killed: writes of the groups it headed again after",
        get("failover_ms"),
        "ms",
    ));
    comparisons.push(
        Comparison::new(
            "a member killed: writes/s while the spare is copied in / before",
            ratio(during, before),
            "×",
        )
        .target(
            0.8,
            "Copying each group's keys to the spare (80 reconfigurations in a quarter of a \
             second) takes CPU from a machine whose two CPUs the clients, four members and the \
             controller already fill; run to run the cost moves between 1 and 26 % \
             (docs/benchmarks.md, \"Failover and recovery under load\").",
        ),
    );

    let mut notes = vec![
        "Each system a three-member ensemble on loopback, started and stopped by `pmnet \
         coord-bench`: the chain store as three `pmnet device --chain-member` processes (16 \
         virtual groups, tables on the benchmarks' --dir), etcd 3.4 (fsync on, linearizable \
         reads) and ZooKeeper 3.8 (forceSync on; plain getData reads, not linearizable). \
         Closed-loop clients, one request at a time, 1 000 keys drawn uniformly, 64-byte \
         values; a lock is one lock all clients contend for, acquired and released (a cycle)."
            .to_owned(),
        "The NetChain slides report orders of magnitude higher throughput and lower latency \
         than ZooKeeper, with no single figure to set against these; the targets are the \
         chain store's own (latency 10× at one client, reads 5×; throughput 10× at 16 clients). On \
         durability the systems differ: the chain store persists with cache-line flushes to \
         emulated PM, etcd and ZooKeeper fsync to the disk (docs/benchmarks.md, \"What the \
         durability costs\")."
            .to_owned(),
    ];
    if let Some(others) = entries(report, "results")
        .iter()
        .filter_map(|r| number(r, &["cpu_us_per_op", "others_cpus"]))
        .reduce(f64::max)
        .filter(|others| *others > 0.2)
    {
        notes.push(format!(
            "Other processes kept up to {others:.2} CPUs busy during a measurement: the \
             figures are disturbed where they ran."
        ));
    }
    if let Some(failover) = failover {
        let met = |key: &str| match failover.get(key).and_then(Value::as_bool) {
            Some(true) => "met",
            Some(false) => "not met",
            None => "not measured",
        };
        notes.push(format!(
            "Failover (`pmnet coord-bench --failover`: a controller, four members in chains of \
             three, one spare, 16 clients writing; the first member SIGKILLed): target ≤ 100 \
             ms to writes again, {}; target ≤ 20 % of throughput lost while the spare is \
             copied in, {}.",
            met("failover_met"),
            met("recovery_met")
        ));
    }
    if let Some(step) = steps.iter().find(|s| s.label == COMPARE) {
        for (system, why) in [("etcd", "etcd-server"), ("zookeeper", "zookeeper")] {
            if !step.command.contains(system) {
                notes.push(format!(
                    "{} was not installed here, so it is not compared (`apt-get install -y \
                     {why}`).",
                    name_of(system)
                ));
            }
        }
    }
    Outcome {
        figure: Figure {
            panels: vec![latency, throughput, factors, kill],
        },
        comparisons,
        notes,
    }
}

pub const NETCHAIN: Experiment = Experiment {
    name: "netchain",
    title: "The chain store against etcd and ZooKeeper, and a member killed under load",
    about: "NetChain's comparison (docs/netchain.md): the chain store in three devices against \
            three-member etcd and ZooKeeper ensembles on this machine (`pmnet coord-bench`), \
            reads and writes (and lock cycles, except in quick runs) at 1 client (latency) \
            and 16 (throughput), the factors against the chain store's targets; then a member \
            SIGKILLed under 16 writing clients (`pmnet coord-bench --failover`): how long \
            until the groups it headed take writes again, and the throughput while the spare \
            is copied in.",
    plan,
    analyse,
};

#[cfg(test)]
mod tests {
    use super::super::shared::tests::{failed, step};
    use super::*;
    use crate::eval::model::tests_settings;
    use serde_json::json;

    fn row(system: &str, op: &str, clients: u32, p50: f64, ops: f64) -> Value {
        json!({"system": system, "op": op, "clients": clients, "p50_us": p50,
               "p99_us": p50 * 3.0, "ops_per_s": ops,
               "cpu_us_per_op": {"servers": 10.0, "clients": 5.0, "others_cpus": 0.05}})
    }

    fn report() -> Value {
        json!({
            "results": [
                row("netchain", "read", 1, 20.0, 48_000.0),
                row("netchain", "write", 1, 70.0, 14_000.0),
                row("netchain", "read", 16, 200.0, 68_000.0),
                row("netchain", "write", 16, 600.0, 26_000.0),
                row("etcd", "read", 1, 850.0, 1_200.0),
                row("etcd", "write", 1, 1_050.0, 900.0),
                row("etcd", "read", 16, 3_600.0, 3_800.0),
                row("etcd", "write", 16, 6_500.0, 2_100.0),
            ],
            "ratios": [
                {"clients": 1, "op": "read", "system": "etcd", "p50_ratio": 42.5,
                 "p50_target": 5.0, "ops_per_s_ratio": 40.0, "ops_per_s_target": null},
                {"clients": 1, "op": "write", "system": "etcd", "p50_ratio": 15.0,
                 "p50_target": 10.0, "ops_per_s_ratio": 15.5, "ops_per_s_target": null},
                {"clients": 16, "op": "read", "system": "etcd", "p50_ratio": 18.0,
                 "p50_target": 5.0, "ops_per_s_ratio": 17.9, "ops_per_s_target": 10.0},
                {"clients": 16, "op": "write", "system": "etcd", "p50_ratio": 10.8,
                 "p50_target": 10.0, "ops_per_s_ratio": 8.0, "ops_per_s_target": 10.0},
            ],
        })
    }

    #[test]
    fn bars_factors_and_failover_from_the_json() {
        let failover = json!({"failover": {"failover_ms": 33.6, "recovery_ms": 251.0,
            "ops_per_s_before": 35_000.0, "ops_per_s_during_recovery": 26_250.0,
            "failover_met": true, "recovery_met": false}});
        let mut compare = step(COMPARE, report());
        compare.command = "pmnet coord-bench --system netchain,etcd --op read,write".into();
        let outcome = analyse(&tests_settings(), &[compare, step(FAILOVER, failover)]);
        let panels = &outcome.figure.panels;
        assert_eq!(panels.len(), 4);
        let latency = &panels[0];
        assert_eq!(latency.series.len(), 2, "no ZooKeeper results");
        assert_eq!(latency.series[0].points, vec![(0.0, 20.0), (1.0, 70.0)]);
        assert_eq!(
            panels[1].series[1].points,
            vec![(0.0, 3_800.0), (1.0, 2_100.0)]
        );
        assert_eq!(
            panels[2].series[0].points,
            vec![(0.0, 42.5), (1.0, 15.0), (2.0, 17.9), (3.0, 8.0)]
        );
        assert_eq!(
            panels[3].series[0].points,
            vec![(0.0, 35_000.0), (1.0, 26_250.0)]
        );
        assert!(panels[3].title.contains("34 ms"));
        let c = &outcome.comparisons;
        assert_eq!(c.len(), 6);
        let durability = " (not the same durability: chain store on test; etcd and ZooKeeper \
                          fsync each write)";
        assert_eq!(
            c[0].what,
            format!("read p50, etcd / chain store, 1 client{durability}")
        );
        assert_eq!(
            (c[0].measured, c[0].target, c[0].met),
            (Some(42.5), Some(5.0), Some(true))
        );
        assert_eq!(
            c[3].what,
            format!("write ops/s, chain store / etcd, 16 clients{durability}")
        );
        // Each category's own target over its bars: reads' p50 5×, the rest 10×.
        let targets: Vec<(f64, f64)> = panels[2]
            .marks
            .iter()
            .filter_map(|mark| match mark {
                Mark::Target { x, y, .. } => Some((*x, *y)),
                _ => None,
            })
            .collect();
        assert_eq!(
            targets,
            vec![(0.0, 5.0), (1.0, 10.0), (2.0, 10.0), (3.0, 10.0)]
        );
        assert_eq!(c[3].met, Some(false));
        assert_eq!(c[4].measured, Some(33.6));
        assert_eq!((c[5].measured, c[5].met), (Some(0.75), Some(false)));
        assert!(outcome
            .notes
            .iter()
            .any(|n| n.contains("ZooKeeper was not installed")));
        assert!(outcome
            .notes
            .iter()
            .any(|n| n.contains("100 ms to writes again, met")));
    }

    #[test]
    fn failed_steps_leave_no_series_and_no_panic() {
        let outcome = analyse(&tests_settings(), &[failed(COMPARE), failed(FAILOVER)]);
        assert!(outcome.figure.panels.iter().all(|p| p.series.is_empty()));
        assert!(outcome.figure.panels[3].marks.is_empty());
        assert_eq!(outcome.comparisons.len(), 2);
        assert!(outcome.comparisons.iter().all(|c| c.measured.is_none()));
    }
}

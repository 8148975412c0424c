//! Replicated persistent memory (`pmnet bench --abd`): one 64-byte line read and written
//! through ABD run by a device and by the clients, against unreplicated remote memory and etcd,
//! and with one of three memory nodes killed.

use serde_json::Value;

use super::shared::{bounded, entries, text};
use crate::eval::model::{
    args, number, on_path, result_of, Experiment, Invocation, Outcome, Settings, StepOutput,
};
use crate::eval::plot::{Figure, Mark};

const LABEL: &str = "replicated memory";
const LOADED: f64 = 16.0;
/// The systems without etcd (`--abd-system`), when etcd is not installed.
const WITHOUT_ETCD: &str = "unreplicated,client-abd,device-abd,device-abd-killed";

const SYSTEMS: [(&str, &str); 5] = [
    ("unreplicated", "unreplicated (1 node)"),
    ("client-abd", "ABD run by the clients"),
    ("device-abd", "ABD run by a device"),
    ("etcd", "etcd (3 members)"),
    ("device-abd-killed", "device ABD, 1 of 3 nodes killed"),
];

/// The ABD slides' replicated remote memory (a switch coordinating, FPGA memory nodes).
const PAPER_REPLICATED_US: f64 = 18.0;

fn plan(settings: &Settings) -> Result<Vec<Invocation>, String> {
    let mut command = settings.bench_args();
    command.push("--abd".to_owned());
    let systems = if on_path("etcd") {
        5
    } else {
        command.extend(args(&["--abd-system", WITHOUT_ETCD]));
        4
    };
    // Every system's read and write at 1 and 16 clients (the killed one at 16 only), each
    // round; the processes start once, the lines are written before the measurements.
    let (duration, warmup, rounds) = settings.measure();
    let phases = (4 * (systems - 1) + 2) as f64;
    let estimate = 8.0 + phases * (duration + warmup + 0.1) * f64::from(rounds);
    Ok(vec![Invocation::new(LABEL, command, estimate)])
}

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

fn why_short(numerator: &str, denominator: &str, measure: &str) -> &'static str {
    if (numerator == "etcd" || denominator == "etcd") && measure == "ops/s" {
        "Both are bound by CPU per operation on the same two vCPUs: for 10× device ABD would \
         have to spend about half the CPU per read it does, most of it the kernel's datagram \
         sends and wake-ups (docs/benchmarks.md, \"Replicated memory\")."
    } else if numerator == "etcd" || denominator == "etcd" {
        "A device-ABD read is four hand-offs between processes, each a kernel wake-up on this \
         VM: for 10× it would have to be faster than one unreplicated round trip through a \
         device is here. etcd's writes pay an fsync, the memory nodes' a cache-line flush, so \
         writes come closer."
    } else if numerator.ends_with("killed") {
        "With one node down every operation waits for both survivors (the slower of two \
         instead of the second of three), and the run-to-run spread of a healthy run is \
         ±15 %."
    } else {
        "The replicated write takes a second round to a majority, and the device's fan-out to \
         three nodes and the third node's work share two vCPUs with the clients."
    }
}

fn analyse(_settings: &Settings, steps: &[StepOutput]) -> Outcome {
    let report = result_of(steps, LABEL);
    let bars = |clients: f64, key: &str, title: &str, y_label: &str| {
        super::shared::bars_by_op(
            title,
            y_label,
            &["read", "write"],
            &SYSTEMS,
            |system, op| result(report, system, op, clients).and_then(|r| number(r, &[key])),
        )
    };
    let latency = bars(
        1.0,
        "p50_us",
        "p50 latency of a 64-byte line, 1 client",
        "p50 latency (µs)",
    )
    .mark(Mark::Level {
        label: "ABD slides: replicated remote memory, ~18 µs".to_owned(),
        y: PAPER_REPLICATED_US,
    });
    let tail = bars(1.0, "p99_us", "p99 latency, 1 client", "p99 latency (µs)");
    let throughput = bars(
        LOADED,
        "ops_per_s",
        "Throughput, 16 clients (killed: node 0 SIGKILLed)",
        "operations/s",
    );

    let comparisons = entries(report, "ratios")
        .iter()
        .filter(|r| number(r, &["target"]).is_some())
        .map(|r| {
            let numerator = text(r, "numerator").unwrap_or("?");
            let denominator = text(r, "denominator").unwrap_or("?");
            let op = text(r, "op").unwrap_or("?");
            let clients = number(r, &["clients"]).unwrap_or(0.0);
            let measure = match text(r, "measure") {
                Some("p50_us") => "p50",
                Some("ops_per_s") => "ops/s",
                Some(other) => other,
                None => "?",
            };
            let clients = if clients == 1.0 {
                "1 client".to_owned()
            } else {
                format!("{clients} clients")
            };
            bounded(
                format!("{op} {measure}, {numerator} / {denominator}, {clients}"),
                format!("{op} {measure}, {denominator} / {numerator}, {clients}"),
                number(r, &["value"]),
                text(r, "bound"),
                number(r, &["target"]),
                why_short(numerator, denominator, measure),
            )
        })
        .collect();

    let mut notes = vec![
        "Every part started as a user starts it (`pmnet memnode`, `pmnet device --abd-node`, \
         etcd's binary) and stopped at the end: one memory node behind a device \
         (unreplicated), three nodes with the quorum run by each client (client ABD) or by a \
         device (device ABD), a three-member etcd (a line as a key; fsync on, linearizable \
         reads), and device ABD with node 0 SIGKILLed before its warm-up. Closed-loop \
         clients, one operation in flight each, 4 096 lines drawn uniformly; every row is its \
         median round by p50. Targets that are at-most ratios in the benchmark (device ABD ≤ \
         3× the unreplicated p50) are turned over here."
            .to_owned(),
        "The ABD slides measure 3 µs to local memory against 18 µs to replicated remote \
         memory (an FPGA switch coordinating); here every hop between processes is a kernel \
         wake-up on two shared vCPUs, so compare the ratios between the systems."
            .to_owned(),
    ];
    if let Some(step) = steps.iter().find(|s| s.label == LABEL) {
        if step.command.contains("--abd-system") && !step.command.contains("etcd") {
            notes.push(
                "etcd is not installed here (`apt-get install -y etcd-server`): it was left out \
                 (`--abd-system`), with its comparisons."
                    .to_owned(),
            );
        }
    }
    if let Some(others) = report
        .and_then(|r| number(r, &["setting", "others_cpus_max"]))
        .filter(|others| *others > 0.2)
    {
        notes.push(format!(
            "Other processes kept up to {others:.2} CPUs busy during a measurement: the figures \
             are disturbed where they ran."
        ));
    }
    Outcome {
        figure: Figure {
            panels: vec![latency, throughput, tail],
        },
        comparisons,
        notes,
    }
}

pub const ABD: Experiment = Experiment {
    name: "abd",
    title: "Replicated memory: ABD against unreplicated access and etcd",
    about: "Replicated persistent memory (docs/abd.md): reads and writes of one \
            64-byte line with the ABD quorum run by a device and by the clients over three \
            memory nodes, against one unreplicated node behind a device and a three-member \
            etcd, at 1 client (latency) and 16 (throughput), and device ABD with one node \
            SIGKILLed (`pmnet bench --abd`).",
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
               "p99_us": p50 * 2.0, "ops_per_s": ops})
    }

    #[test]
    fn bars_and_bounded_ratios_from_the_json() {
        let report = json!({
            "setting": {"others_cpus_max": 1.1},
            "results": [
                row("unreplicated", "read", 1, 40.0, 23_000.0),
                row("unreplicated", "write", 1, 45.0, 21_000.0),
                row("device-abd", "read", 1, 100.0, 9_000.0),
                row("device-abd", "write", 1, 150.0, 6_000.0),
                row("device-abd", "read", 16, 500.0, 27_000.0),
                row("device-abd-killed", "read", 16, 500.0, 30_000.0),
                row("etcd", "read", 16, 4_000.0, 3_300.0),
            ],
            "ratios": [
                {"numerator": "device-abd", "denominator": "unreplicated", "measure": "p50_us",
                 "op": "read", "clients": 1, "value": 2.5, "bound": "at most", "target": 3.0,
                 "met": true},
                {"numerator": "device-abd", "denominator": "etcd", "measure": "ops_per_s",
                 "op": "read", "clients": 16, "value": 8.18, "bound": "at least",
                 "target": 10.0, "met": false},
                {"numerator": "client-abd", "denominator": "device-abd", "measure": "p50_us",
                 "op": "read", "clients": 1, "value": 0.46, "bound": null, "target": null},
            ],
        });
        let outcome = analyse(&tests_settings(), &[step(LABEL, report)]);
        let panels = &outcome.figure.panels;
        assert_eq!(
            panels[0].series.len(),
            2,
            "unreplicated and device ABD at 1 client"
        );
        assert_eq!(panels[0].series[1].points, vec![(0.0, 100.0), (1.0, 150.0)]);
        assert_eq!(panels[0].marks.len(), 1);
        let loaded: Vec<&str> = panels[1].series.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            loaded,
            vec![
                "ABD run by a device",
                "etcd (3 members)",
                "device ABD, 1 of 3 nodes killed"
            ]
        );
        let c = &outcome.comparisons;
        assert_eq!(c.len(), 2, "only the ratios with a target");
        assert_eq!(c[0].what, "read p50, unreplicated / device-abd, 1 client");
        assert_eq!(
            (c[0].measured, c[0].target, c[0].met),
            (Some(0.4), Some(0.333), Some(true))
        );
        assert_eq!(c[1].what, "read ops/s, device-abd / etcd, 16 clients");
        assert_eq!(c[1].met, Some(false));
        assert!(c[1].why_short.as_deref().unwrap().contains("CPU"));
        assert!(outcome.notes.iter().any(|n| n.contains("1.10 CPUs")));
    }

    #[test]
    fn without_etcd_or_a_result() {
        let mut skipped = failed(LABEL);
        skipped.command = format!("pmnet bench --abd --abd-system {WITHOUT_ETCD}");
        let outcome = analyse(&tests_settings(), &[skipped]);
        assert!(outcome.figure.panels.iter().all(|p| p.series.is_empty()));
        assert!(outcome.comparisons.is_empty());
        assert!(outcome
            .notes
            .iter()
            .any(|n| n.contains("etcd is not installed")));
    }
}

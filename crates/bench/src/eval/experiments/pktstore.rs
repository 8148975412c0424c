//! The packet store: the write-path breakdown of the packets-as-records paper's Table 1, and
//! updates through a server with each engine (`pmnet store-bench`).

use serde_json::Value;

use crate::eval::model::{
    args, number, result_of, Comparison, Experiment, Invocation, Outcome, Settings, StepOutput,
};
use crate::eval::plot::{Figure, Mark, Panel};

const LABEL: &str = "breakdown and servers";
/// The size the breakdown is drawn at (the paper's 1 KB write).
const SIZE: f64 = 1024.0;

/// The paper's Table 1 for a 1 KB write, µs: (a word of the step's column name, value).
const PAPER_US: [(&str, f64); 4] = [
    ("prep", 0.70),
    ("checksum", 1.77),
    ("copy", 1.14),
    ("alloc", 2.78),
];

/// The steps of a write in order.
const STEP_ORDER: [&str; 5] = ["prep", "checksum", "copy", "alloc", "persist"];

fn plan(settings: &Settings) -> Result<Vec<Invocation>, String> {
    let (writes, runs, seconds, latency, rounds) = settings.scale.pick(
        ("2000", "1", "0.5", "300", "1"),
        ("20000", "3", "2", "2000", "3"),
        ("20000", "5", "3", "3000", "5"),
    );
    let command = args(&[
        "store-bench",
        "--dir",
        &settings.dir.to_string_lossy(),
        "--writes",
        writes,
        "--breakdown-runs",
        runs,
        "--seconds",
        seconds,
        "--latency-requests",
        latency,
        "--rounds",
        rounds,
        "--blocking",
    ]);
    let seconds: f64 = seconds.parse().unwrap_or(1.0);
    let rounds: f64 = rounds.parse().unwrap_or(1.0);
    let runs: f64 = runs.parse().unwrap_or(1.0);
    // Four servers a round (throughput and latency each), and the breakdown runs.
    let estimate = rounds * 4.0 * (seconds + 1.5) + runs * 2.0;
    Ok(vec![Invocation::new(LABEL, command, estimate)])
}

fn size_of(row: &Value) -> Option<f64> {
    ["value_bytes", "size", "value_len", "bytes"]
        .iter()
        .find_map(|key| number(row, &[key]))
}

fn engine_of(row: &Value) -> Option<&str> {
    row.get("engine").and_then(Value::as_str)
}

/// The breakdown's steps at `SIZE` bytes: (step, engine, µs), total excluded.
fn steps_at_size(report: &Value) -> Vec<(String, String, f64)> {
    let rows = report
        .get("breakdown")
        .and_then(|b| b.get("rows"))
        .and_then(Value::as_array);
    let mut out = Vec::new();
    for row in rows.into_iter().flatten() {
        if size_of(row) != Some(SIZE) {
            continue;
        }
        let (Some(engine), Some(fields)) = (engine_of(row), row.as_object()) else {
            continue;
        };
        for (key, value) in fields {
            let Some(step) = key.strip_suffix("_ns") else {
                continue;
            };
            if step == "total" {
                continue;
            }
            if let Some(ns) = value.as_f64() {
                out.push((step.to_owned(), engine.to_owned(), ns / 1000.0));
            }
        }
    }
    out
}

fn analyse(_settings: &Settings, steps: &[StepOutput]) -> Outcome {
    let Some(report) = result_of(steps, LABEL) else {
        return Outcome::default();
    };
    let measured = steps_at_size(report);
    let mut categories: Vec<String> = Vec::new();
    let mut engines: Vec<String> = Vec::new();
    for (step, engine, _) in &measured {
        if !categories.contains(step) {
            categories.push(step.clone());
        }
        if !engines.contains(engine) {
            engines.push(engine.clone());
        }
    }
    // The write path's order, as the paper's table has it; steps not named there last.
    categories.sort_by_key(|step| {
        STEP_ORDER
            .iter()
            .position(|word| step.contains(word))
            .unwrap_or(STEP_ORDER.len())
    });
    let mut breakdown = Panel::bars(
        "Write path of a 1 KB write, by step",
        "µs per write",
        categories.iter().map(|c| c.replace('_', " ")).collect(),
    );
    for engine in &engines {
        let points = measured
            .iter()
            .filter(|(_, e, _)| e == engine)
            .filter_map(|(step, _, us)| {
                let index = categories.iter().position(|c| c == step)?;
                Some((index as f64, *us))
            })
            .collect();
        breakdown = breakdown.series(engine, points);
    }
    for (word, us) in PAPER_US {
        if let Some(index) = categories.iter().position(|c| c.contains(word)) {
            breakdown = breakdown.mark(Mark::Point {
                label: format!("paper, {word}: {us} µs"),
                x: index as f64,
                y: us,
            });
        }
    }
    let engine_rows = report.get("engines").and_then(Value::as_array);
    let names: Vec<String> = engine_rows
        .into_iter()
        .flatten()
        .filter_map(|e| engine_of(e).map(str::to_owned))
        .collect();
    let throughput = |name: &str| {
        engine_rows
            .into_iter()
            .flatten()
            .find(|e| engine_of(e) == Some(name))
            .and_then(|e| number(e, &["updates_per_s"]))
    };
    let servers = Panel::bars("Updates through a server", "updates/s", names.clone()).series(
        "updates/s",
        names
            .iter()
            .enumerate()
            .filter_map(|(index, name)| throughput(name).map(|v| (index as f64, v)))
            .collect(),
    );
    let removed = number(report, &["breakdown", "removed_share_median"]);
    let comparisons = vec![
        Comparison::new(
            "share of the conventional engine's checksum + copy + allocation time the packet \
             store removes (1 KB)",
            removed.map(|share| share * 100.0),
            "%",
        ),
        Comparison::new(
            "update throughput, packet store / conventional engine",
            number(report, &["targets", "packet_vs_conventional_throughput"]),
            "×",
        ),
    ];
    Outcome {
        figure: Figure {
            panels: vec![breakdown, servers],
        },
        comparisons,
        notes: vec![
            "The breakdown times each step of a 1 KB write in the engines themselves (no \
             network): the conventional engine checksums, copies and allocates a record; the \
             packet store keeps the received datagram as the record, reusing its checksum and \
             buffer. The paper's values are for its TCP stack on Optane; the steps it names \
             are marked where this breakdown has a step of that name. The servers are driven \
             over loopback UDP, blocking waits, client and server pinned apart."
                .to_owned(),
        ],
    }
}

pub const PKTSTORE: Experiment = Experiment {
    name: "pktstore",
    title: "The packet store: write-path breakdown and end-to-end",
    about: "The packets-as-records paper's Table 1 (request preparation, checksum, copy, \
            allocation and insertion, persistence of a 1 KB write) for the conventional engine \
            and the packet store, and updates through a `pmnet server` with each engine and \
            with the ideal handler (`pmnet store-bench`).",
    plan,
    analyse,
};

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_breakdown_is_drawn_at_one_kilobyte_with_the_papers_steps() {
        let report = json!({
            "breakdown": {"removed_share_median": 0.85, "rows": [
                {"engine": "conventional", "value_bytes": 1024, "persist_ns": 50.0, "checksum_ns": 1500.0, "copy_ns": 900.0, "total_ns": 3000.0},
                {"engine": "packet", "value_bytes": 1024, "checksum_ns": 10.0, "copy_ns": 0.0, "total_ns": 500.0},
                {"engine": "packet", "value_bytes": 64, "checksum_ns": 5.0, "total_ns": 100.0}
            ]},
            "engines": [{"engine": "conventional", "updates_per_s": 1000.0}, {"engine": "packet", "updates_per_s": 1200.0}],
            "targets": {"packet_vs_conventional_throughput": 1.2}
        });
        let steps = vec![StepOutput {
            label: LABEL.to_owned(),
            command: String::new(),
            seconds: 1.0,
            status: "ok".to_owned(),
            log: String::new(),
            result: Some(report),
        }];
        let outcome = analyse(&crate::eval::model::tests_settings(), &steps);
        let breakdown = &outcome.figure.panels[0];
        assert_eq!(breakdown.series.len(), 2);
        assert_eq!(
            breakdown.series[0].points,
            vec![(0.0, 1.5), (1.0, 0.9), (2.0, 0.05)]
        );
        assert_eq!(breakdown.marks.len(), 2, "checksum and copy are marked");
        assert_eq!(outcome.comparisons[0].measured, Some(85.0));
        assert_eq!(outcome.comparisons[1].measured, Some(1.2));
        assert_eq!(outcome.figure.panels[1].series[0].points.len(), 2);
    }
}

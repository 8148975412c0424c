//! Recovery: how fast a restarted server drains a device's log after an outage
//! (`pmnet drain-bench`), against the number of entries logged while it was down.

use serde_json::Value;

use crate::eval::model::{
    args, number, result_of, Comparison, Experiment, Invocation, Outcome, Settings, StepOutput,
};
use crate::eval::plot::{Figure, Mark, Panel};

/// The paper's recovery: 67 µs per resent request.
const PAPER_US_PER_ENTRY: f64 = 67.0;
/// The suite's target: at least this many entries a second (10 µs each).
const TARGET_ENTRIES_PER_S: f64 = 100_000.0;

const WHY_SHORT: &str = "The drain is bounded by the server applying every resent update (a \
    datagram received, checked, stored and persisted, a server-ACK sent back), on the same two \
    vCPUs as the device resending them; a run on an idle machine, or with `--busy-poll`, is \
    faster. The device's pacing (resends in flight) keeps the server's receive queue from \
    overflowing, which the unpaced run shows costs more than it saves.";

fn entry_counts(settings: &Settings) -> Vec<u32> {
    settings.scale.pick(
        vec![2_000],
        vec![5_000, 20_000, 50_000],
        vec![10_000, 50_000, 100_000, 200_000],
    )
}

fn label(entries: u32) -> String {
    format!("{entries} entries")
}

fn plan(settings: &Settings) -> Result<Vec<Invocation>, String> {
    Ok(entry_counts(settings)
        .into_iter()
        .map(|entries| {
            Invocation::new(
                label(entries),
                args(&[
                    "drain-bench",
                    "--entries",
                    &entries.to_string(),
                    "--dir",
                    &settings.dir.to_string_lossy(),
                ]),
                // Logging them, then two drains (paced and unpaced), plus start-ups.
                1.0 + f64::from(entries) / 20_000.0,
            )
        })
        .collect())
}

/// The run of `report` whose label is `which` ("unpaced", or the paced window).
fn run(report: &Value, paced: bool) -> Option<&Value> {
    report.get("runs")?.as_array()?.iter().find(|run| {
        let unpaced = run.get("label").and_then(Value::as_str) == Some("unpaced");
        unpaced != paced
    })
}

/// The replay of a drain, without the server's start-up: (ms, entries/s).
fn replay(run: &Value) -> Option<(f64, f64)> {
    let drain = number(run, &["drain_ms"])?;
    let start = number(run, &["server_start_ms"])?;
    let entries = number(run, &["entries"])?;
    let ms = (drain - start).max(1e-3);
    Some((ms, entries / (ms / 1000.0)))
}

fn analyse(settings: &Settings, steps: &[StepOutput]) -> Outcome {
    let counts = entry_counts(settings);
    // `pick` maps a run to the value drawn.
    let series = |paced: bool, pick: &dyn Fn(&Value) -> Option<f64>| -> Vec<(f64, f64)> {
        counts
            .iter()
            .filter_map(|entries| {
                let report = result_of(steps, &label(*entries))?;
                Some((f64::from(*entries), pick(run(report, paced)?)?))
            })
            .collect()
    };
    let drain_ms = |run: &Value| number(run, &["drain_ms"]);
    let replay_ms = |run: &Value| replay(run).map(|(ms, _)| ms);
    let replay_rate = |run: &Value| replay(run).map(|(_, rate)| rate);
    let paper_line: Vec<(f64, f64)> = counts
        .iter()
        .map(|entries| {
            (
                f64::from(*entries),
                f64::from(*entries) * PAPER_US_PER_ENTRY / 1000.0,
            )
        })
        .collect();
    let time = Panel::lines(
        "Time to drain the log after an outage",
        "entries logged while the server was down",
        "time (ms)",
    )
    .series(
        "server start to all applied, paced",
        series(true, &drain_ms),
    )
    .series("replay alone, paced", series(true, &replay_ms))
    .series("replay alone, unpaced", series(false, &replay_ms))
    .series("paper: 67 µs per entry", paper_line);
    let rate = Panel::lines(
        "Replay rate (after the server's start-up)",
        "entries logged while the server was down",
        "entries applied per second",
    )
    .series("paced (the default)", series(true, &replay_rate))
    .series("unpaced", series(false, &replay_rate))
    .mark(Mark::Level {
        label: "target: 100 000/s".into(),
        y: TARGET_ENTRIES_PER_S,
    })
    .mark(Mark::Level {
        label: "paper: 14 925/s (67 µs each)".into(),
        y: 1e6 / PAPER_US_PER_ENTRY,
    });
    let largest = counts.last().copied().unwrap_or(0);
    let paced = result_of(steps, &label(largest)).and_then(|report| run(report, true));
    let measured = paced.and_then(replay_rate);
    let comparisons = vec![
        Comparison::new(
            format!("replay rate, entries/s ({largest} entries, paced)"),
            measured,
            "entries/s",
        )
        .paper(1e6 / PAPER_US_PER_ENTRY)
        .target(TARGET_ENTRIES_PER_S, WHY_SHORT),
        Comparison::new(
            format!("replay, µs per entry ({largest} entries, paced)"),
            measured.map(|rate| 1e6 / rate),
            "µs",
        )
        .paper(PAPER_US_PER_ENTRY),
        Comparison::new(
            format!("server start to every entry applied, entries/s ({largest} entries, paced)"),
            paced.and_then(|run| number(run, &["entries_per_s"])),
            "entries/s",
        ),
    ];
    Outcome {
        figure: Figure {
            panels: vec![time, rate],
        },
        comparisons,
        notes: vec![
            "Clients log the entries through a device whose server is down; the server is then \
             started on its store and the clock runs from its start until every client's \
             read, ordered after its updates, is answered. The replay is that time less the \
             server's start-up (from its start to its \"listening\" line: opening and \
             checking its store), which the paper's 67 µs per resent request does not \
             include either. The paced run keeps the device's default number of resends in \
             flight; the unpaced one sends every entry at once."
                .to_owned(),
        ],
    }
}

pub const RECOVERY: Experiment = Experiment {
    name: "recovery",
    title: "Recovery: replaying the log after a server failure",
    about: "Entries logged by the device while the server was down are replayed to the \
            restarted server (`pmnet drain-bench`), for several log sizes. The paper: 67 µs \
            per resent request; the suite's target: at least 100 000 entries/s.",
    plan,
    analyse,
};

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_paced_run_of_the_largest_log_is_judged() {
        let report = json!({"runs": [
            {"label": "256", "window": 256, "entries": 2000, "server_start_ms": 5.0,
             "drain_ms": 25.0, "entries_per_s": 80_000.0},
            {"label": "unpaced", "window": null, "entries": 2000, "server_start_ms": 5.0,
             "drain_ms": 45.0, "entries_per_s": 44_444.0}
        ]});
        let steps = vec![StepOutput {
            label: label(2_000),
            command: String::new(),
            seconds: 1.0,
            status: "ok".to_owned(),
            log: String::new(),
            result: Some(report),
        }];
        let outcome = analyse(&crate::eval::model::tests_settings(), &steps);
        // 2000 entries replayed in 25 - 5 ms.
        assert_eq!(outcome.comparisons[0].measured, Some(100_000.0));
        assert_eq!(outcome.comparisons[0].met, Some(true));
        assert_eq!(outcome.comparisons[1].measured, Some(10.0));
        assert_eq!(outcome.comparisons[2].measured, Some(80_000.0));
        let time = &outcome.figure.panels[0];
        assert_eq!(time.series[0].points, vec![(2000.0, 25.0)]);
        assert_eq!(time.series[1].points, vec![(2000.0, 20.0)]);
        assert_eq!(time.series[2].points, vec![(2000.0, 40.0)]);
    }
}

//! Replication: update latency against the replication factor for client-side, server-side and
//! in-network replication (`pmnet bench --replicas 1,2,3`), with the paper's values at three
//! replicas.

use serde_json::Value;

use super::shared::{entries, text};
use crate::eval::model::{
    args, number, ratio, result_of, Comparison, Experiment, Invocation, Outcome, Settings,
    StepOutput,
};
use crate::eval::plot::{Figure, Mark, Panel};

const FACTORS: [u32; 3] = [1, 2, 3];
const LABEL: &str = "replicas 1, 2, 3";
const MODES: [(&str, &str); 3] = [
    ("rep-client", "client-side (rep-client)"),
    ("rep-server", "server-side (rep-server)"),
    ("rep-pmnet", "PMNet devices in series (rep-pmnet)"),
];

/// The paper's update latency with 3-way replication (µs), and PMNet's with one device.
const PAPER_PMNET_3: f64 = 22.8;
const PAPER_CLIENT_3: f64 = 41.6;
const PAPER_SERVER_3: f64 = 94.0;
const PAPER_PMNET_1: f64 = 21.5;
/// The abstract's state-replication gain over the server-side baseline.
const PAPER_GAIN: f64 = 5.88;

const HOPS_SHORT: &str = "Each device in series adds two hops here (the update on to the \
    next device, its ack back through every device before it), each a thread wake-up of \
    10–25 µs between processes on one CPU, while the baselines' copies go out in parallel; \
    the paper's switches forward at line rate and overlap each device's persist with the next \
    hop (docs/benchmarks.md, \"Replication\").";

fn plan(settings: &Settings) -> Result<Vec<Invocation>, String> {
    let mut command = settings.bench_args();
    let factors: Vec<String> = FACTORS.iter().map(u32::to_string).collect();
    command.extend(args(&["--replicas", &factors.join(",")]));
    // Three modes at each factor; R servers or devices start for each.
    let modes = (MODES.len() * FACTORS.len()) as f64;
    Ok(vec![Invocation::new(
        LABEL,
        command,
        modes * (settings.mode_seconds() + 0.2),
    )])
}

/// `mode`'s result at `replicas`.
fn result<'a>(report: Option<&'a Value>, mode: &str, replicas: u32) -> Option<&'a Value> {
    entries(report, "results").iter().find(|r| {
        text(r, "mode") == Some(mode) && number(r, &["replicas"]) == Some(f64::from(replicas))
    })
}

fn analyse(_settings: &Settings, steps: &[StepOutput]) -> Outcome {
    let report = result_of(steps, LABEL);
    let field = |mode: &str, replicas: u32, key: &str| {
        result(report, mode, replicas).and_then(|r| number(r, &[key]))
    };
    // Bars by factor: category i is R = FACTORS[i].
    let categories: Vec<String> = FACTORS.iter().map(|r| format!("R = {r}")).collect();
    let at = |replicas: u32| f64::from(replicas - 1);
    let curve = |mode: &str, key: &str| -> Vec<(f64, f64)> {
        FACTORS
            .iter()
            .filter_map(|r| field(mode, *r, key).map(|y| (at(*r), y)))
            .collect()
    };
    // A paper's value over its system's bar: series `index` of `count`.
    let point = |label: &str, replicas: u32, (index, count): (usize, usize), y: f64| Mark::Point {
        label: label.to_owned(),
        x: super::shared::bar_middle(replicas as usize - 1, index, count),
        y,
    };
    let mut p50 = Panel::bars(
        "p50 latency of an update, R copies",
        "p50 latency (µs)",
        categories.clone(),
    );
    let mut p99 = Panel::bars(
        "p99 latency of an update, R copies",
        "p99 latency (µs)",
        categories.clone(),
    );
    for (mode, name) in MODES {
        p50 = p50.series(name, curve(mode, "p50_us"));
        p99 = p99.series(name, curve(mode, "p99_us"));
    }
    let p50 = p50
        .mark(point(
            "paper, client-side, R = 3: 41.6 µs",
            3,
            (0, 3),
            PAPER_CLIENT_3,
        ))
        .mark(point(
            "paper, server-side, R = 3: 94.0 µs",
            3,
            (1, 3),
            PAPER_SERVER_3,
        ))
        .mark(point(
            "paper, PMNet, R = 3: 22.8 µs",
            3,
            (2, 3),
            PAPER_PMNET_3,
        ))
        .mark(point(
            "paper, PMNet, R = 1: 21.5 µs",
            1,
            (2, 3),
            PAPER_PMNET_1,
        ));
    let gain = |baseline: &str| -> Vec<(f64, f64)> {
        FACTORS
            .iter()
            .filter_map(|r| {
                ratio(
                    field(baseline, *r, "p50_us"),
                    field("rep-pmnet", *r, "p50_us"),
                )
                .map(|y| (at(*r), y))
            })
            .collect()
    };
    let gains = Panel::bars(
        "PMNet's gain: baseline p50 / rep-pmnet p50",
        "gain (×)",
        categories,
    )
    .series("client-side / PMNet", gain("rep-client"))
    .series("server-side / PMNet", gain("rep-server"))
    .mark(point(
        "paper, server-side, R = 3: 5.88×",
        3,
        (1, 2),
        PAPER_GAIN,
    ))
    .mark(point(
        "paper, client-side, R = 3: 1.82× (41.6 / 22.8 µs)",
        3,
        (0, 2),
        PAPER_CLIENT_3 / PAPER_PMNET_3,
    ));

    let p50_of = |mode: &str, replicas: u32| field(mode, replicas, "p50_us");
    let comparisons = vec![
        Comparison::new(
            "update p50, rep-server / rep-pmnet, 3 replicas",
            ratio(p50_of("rep-server", 3), p50_of("rep-pmnet", 3)),
            "×",
        )
        .paper(PAPER_GAIN)
        .target(4.0, HOPS_SHORT),
        Comparison::new(
            "update p50, rep-client / rep-pmnet, 3 replicas",
            ratio(p50_of("rep-client", 3), p50_of("rep-pmnet", 3)),
            "×",
        )
        .paper(super::shared::round3(PAPER_CLIENT_3 / PAPER_PMNET_3))
        .target(2.0, HOPS_SHORT),
        Comparison::new(
            "update p50, rep-pmnet with 1 device / with 3 devices in series",
            ratio(p50_of("rep-pmnet", 1), p50_of("rep-pmnet", 3)),
            "×",
        )
        .paper(super::shared::round3(PAPER_PMNET_1 / PAPER_PMNET_3))
        .target(super::shared::round3(1.0 / 1.16), HOPS_SHORT),
        Comparison::new(
            "update p50, rep-server / rep-pmnet, 1 copy (no replicas)",
            ratio(p50_of("rep-server", 1), p50_of("rep-pmnet", 1)),
            "×",
        ),
    ];

    let mut notes = vec![
        "One client, one 100-byte update in flight, every part started in-process as `pmnet \
         server` / `pmnet device` start it, fresh for each mode: `rep-client` sends each \
         update to R servers and waits for every reply; `rep-server` waits for a primary that \
         replies once its R − 1 replicas applied it (each server makes it durable in its \
         forward log first); `rep-pmnet` waits for the PMNet-ACKs of R devices in series in \
         front of one server. Each mode's median round by p50."
            .to_owned(),
        "The paper's figures (3-way replication): PMNet 22.8 µs, client-side 41.6 µs, \
         server-side 94.0 µs, and PMNet with one device 21.5 µs; its abstract quotes 5.88× \
         better state-replication latency (the figure's values give 94.0 / 22.8 = 4.1×) and \
         about 16 % over one device, which the docs' target (3 devices ≤ 1.16× one) turns \
         into 1 device / 3 devices ≥ 0.862×. The targets are the docs' at-most ratios \
         (rep-pmnet / rep-server ≤ 0.25×, rep-pmnet / rep-client ≤ 0.5×) turned over."
            .to_owned(),
    ];
    if let (Some(one), Some(three)) = (p50_of("rep-pmnet", 1), p50_of("rep-pmnet", 3)) {
        notes.push(format!(
            "rep-pmnet: {one:.1} µs with one device, {three:.1} µs with three ({:.2}×): each \
             device in series costs {:.1} µs here, about two thread hand-offs; the baselines \
             fan out (R requests or R − 1 forwards in flight at once).",
            three / one,
            (three - one) / 2.0
        ));
    }
    Outcome {
        figure: Figure {
            panels: vec![p50, gains, p99],
        },
        comparisons,
        notes,
    }
}

pub const REPLICATION: Experiment = Experiment {
    name: "replication",
    title: "Replication: update latency against the replication factor",
    about: "Three ways of making an update survive the loss of R − 1 copies, side by side for \
            R = 1, 2, 3 (`pmnet bench --replicas 1,2,3`, docs/replication.md): client-side \
            (the client writes R servers), server-side (a primary forwards to R − 1 replicas \
            before it replies) and in-network (R PMNet devices in series, the client waiting \
            for every device's PMNet-ACK). The paper, with 3-way replication: PMNet 22.8 µs, \
            client-side 41.6 µs, server-side 94.0 µs (5.88× better state-replication latency, \
            about 16 % over one device).",
    plan,
    analyse,
};

#[cfg(test)]
mod tests {
    use super::super::shared::tests::{failed, step};
    use super::*;
    use crate::eval::model::tests_settings;
    use serde_json::json;

    fn row(mode: &str, replicas: u32, p50: f64) -> Value {
        json!({"mode": mode, "replicas": replicas, "p50_us": p50, "p99_us": p50 * 2.0,
               "ops_per_s": 1e6 / p50})
    }

    #[test]
    fn curves_and_ratios_by_mode_and_factor() {
        let plan = plan(&tests_settings()).unwrap();
        assert!(plan[0]
            .args
            .windows(2)
            .any(|w| w == ["--replicas", "1,2,3"]));
        let report = json!({"results": [
            row("rep-client", 1, 70.0), row("rep-server", 1, 70.0), row("rep-pmnet", 1, 30.0),
            row("rep-client", 2, 80.0), row("rep-server", 2, 100.0), row("rep-pmnet", 2, 90.0),
            row("rep-client", 3, 100.0), row("rep-server", 3, 135.0), row("rep-pmnet", 3, 150.0),
        ]});
        let outcome = analyse(&tests_settings(), &[step(LABEL, report)]);
        let p50 = &outcome.figure.panels[0];
        assert_eq!(p50.series.len(), 3);
        assert_eq!(
            p50.series[2].points,
            vec![(0.0, 30.0), (1.0, 90.0), (2.0, 150.0)]
        );
        assert_eq!(p50.marks.len(), 4);
        assert_eq!(outcome.figure.panels[1].series[1].points[2], (2.0, 0.9));
        let c = &outcome.comparisons;
        assert_eq!(c[0].measured, Some(0.9));
        assert_eq!(
            (c[0].paper, c[0].target, c[0].met),
            (Some(5.88), Some(4.0), Some(false))
        );
        assert!(c[0].why_short.is_some());
        assert_eq!(c[1].measured, Some(100.0 / 150.0));
        assert_eq!(c[2].measured, Some(0.2));
        assert_eq!(c[2].paper, Some(0.943));
        assert_eq!(c[3].measured, Some(70.0 / 30.0));
        assert!(outcome.notes.iter().any(|n| n.contains("5.00×")));
    }

    #[test]
    fn a_failed_run_gives_empty_panels() {
        let outcome = analyse(&tests_settings(), &[failed(LABEL)]);
        assert!(outcome.figure.panels.iter().all(|p| p.series.is_empty()));
        assert!(outcome.comparisons.iter().all(|c| c.measured.is_none()));
    }
}

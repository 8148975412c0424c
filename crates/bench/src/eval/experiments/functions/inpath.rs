//! The device in the path, on AF_XDP (`pmnet bench --in-path`): each part's ratio against what
//! it replaces, next to its target, and the latencies and rates behind them.

use serde_json::Value;

use super::shared::{bounded, entries, text};
use crate::eval::model::{
    on_path, result_of, Comparison, Experiment, Invocation, Outcome, Settings, StepOutput,
};
use crate::eval::plot::{Figure, Panel};

const LABEL: &str = "in path";

fn plan(settings: &Settings) -> Result<Vec<Invocation>, String> {
    if !settings.root {
        return Err("needs root (network namespaces, veth pairs and XDP programs)".to_owned());
    }
    pmnet_runtime::xdp_available().map_err(|why| format!("AF_XDP is not available: {why}"))?;
    if !on_path("ip") {
        return Err("`ip` (iproute2) is not on PATH: the testbed cannot be built".to_owned());
    }
    let mut command = settings.bench_args();
    command.push("--in-path".to_owned());
    // Twelve measurements (forwarding 4, load 2, latency 4, capacity 2) each round, and the
    // processes started fresh for each configuration.
    let (duration, warmup, rounds) = settings.measure();
    let estimate = 4.0 + 12.0 * (duration + warmup + 0.3) * f64::from(rounds);
    Ok(vec![Invocation::new(LABEL, command, estimate)])
}

/// A short name for a ratio's bar.
fn short_name(ratio: &Value) -> String {
    let part = text(ratio, "part").unwrap_or("?");
    let measure = text(ratio, "measure").unwrap_or("?");
    let wait = text(ratio, "wait").unwrap_or("");
    match (part, measure) {
        ("forwarding", m) if m.starts_with("UDP") => "UDP forwarding".to_owned(),
        ("forwarding", m) if m.starts_with("TCP") => "TCP forwarding".to_owned(),
        ("capacity", _) => "capacity".to_owned(),
        ("latency", _) => format!("p50, {wait}"),
        ("load", "updates/s") => "16 clients: updates/s".to_owned(),
        ("load", "p99") => "16 clients: p99".to_owned(),
        ("load", m) if m.starts_with("CPU") => "CPU per update".to_owned(),
        (part, measure) => format!("{part}: {measure}"),
    }
}

fn why_short(part: &str) -> &'static str {
    match part {
        "forwarding" => {
            "Veth's XDP path copies every frame into a page-pool page, and native XDP on a veth \
             turns off its peer's GSO, so TCP crosses the router in MTU-sized segments: veth's \
             costs, not the program's (0.3 % of the samples); a NIC runs the program on its own \
             receive buffer (docs/benchmarks.md, \"In the path, on AF_XDP\")."
        }
        "load" => {
            "All processes share 2 vCPUs and the clients' own CPU is the bottleneck, not the \
             server's; in copy mode the device's sends push every frame through veth, so the \
             client's receive and wake-up are charged to the device."
        }
        "capacity" => {
            "The device's CPU per update halves, but the clients, the server and the kernel \
             share the same 2 vCPUs, so updates/s follow the machine's CPU per update."
        }
        _ => {
            "Both paths wake the device once and cross the same veth pair; with busy-polling \
             two spinners and the server share 2 vCPUs, so one waits for the scheduler."
        }
    }
}

/// The result of `part`'s `system` at `wait` (its `op` if given).
fn result<'a>(
    report: Option<&'a Value>,
    part: &str,
    system: &str,
    wait: &str,
) -> Option<&'a Value> {
    entries(report, "results").iter().find(|r| {
        text(r, "part") == Some(part)
            && text(r, "system") == Some(system)
            && text(r, "wait") == Some(wait)
    })
}

fn value(result: Option<&Value>, key: &str) -> Option<f64> {
    result.and_then(|r| r.get(key)).and_then(Value::as_f64)
}

fn analyse(_settings: &Settings, steps: &[StepOutput]) -> Outcome {
    let report = result_of(steps, LABEL);
    let ratios = entries(report, "ratios");
    let mut panels = Vec::new();
    for (bound, title) in [
        ("at least", "Higher is better: in path / what it replaces"),
        ("at most", "Lower is better: in path / what it replaces"),
    ] {
        let chosen: Vec<&Value> = ratios
            .iter()
            .filter(|r| text(r, "bound") == Some(bound))
            .collect();
        let measured = chosen
            .iter()
            .enumerate()
            .filter_map(|(index, r)| value(Some(r), "value").map(|y| (index as f64, y)))
            .collect();
        let targets = chosen
            .iter()
            .enumerate()
            .filter_map(|(index, r)| value(Some(r), "target").map(|y| (index as f64, y)))
            .collect();
        panels.push(
            Panel::bars(
                title,
                "ratio (×)",
                chosen.iter().map(|r| short_name(r)).collect(),
            )
            .series("measured (native XDP)", measured)
            .series(&format!("target ({bound})"), targets),
        );
    }

    let p50 = |system: &str, wait: &str| value(result(report, "latency", system, wait), "p50_us");
    let latency = Panel::bars(
        "Ack latency, 1 client, 1 update in flight",
        "p50 latency (µs)",
        vec!["blocking".to_owned(), "busy-poll".to_owned()],
    )
    .series(
        "UDP echo off the device",
        [p50("echo", "blocking"), p50("echo", "busy-poll")]
            .iter()
            .enumerate()
            .filter_map(|(i, y)| y.map(|y| (i as f64, y)))
            .collect(),
    )
    .series(
        "in-path update (PMNet-ACK)",
        [p50("in-path", "blocking"), p50("in-path", "busy-poll")]
            .iter()
            .enumerate()
            .filter_map(|(i, y)| y.map(|y| (i as f64, y)))
            .collect(),
    );
    let ops =
        |part: &str, system: &str| value(result(report, part, system, "blocking"), "ops_per_s");
    let points = |values: [Option<f64>; 2]| -> Vec<(f64, f64)> {
        values
            .iter()
            .enumerate()
            .filter_map(|(i, y)| y.map(|y| (i as f64, y)))
            .collect()
    };
    let rates = Panel::bars(
        "Updates/s: capacity (4 × 16 in flight), load (16 × 1)",
        "updates/s",
        vec!["capacity".to_owned(), "load".to_owned()],
    )
    .series(
        "in-path AF_XDP device",
        points([ops("capacity", "in-path"), ops("load", "in-path")]),
    )
    .series(
        "what it replaces (UDP-socket proxy device; no device)",
        points([ops("capacity", "proxy-udp"), ops("load", "baseline")]),
    );
    panels.push(latency);
    panels.push(rates);

    let comparisons: Vec<Comparison> = ratios
        .iter()
        .map(|r| {
            let part = text(r, "part").unwrap_or("?");
            let measure = text(r, "measure").unwrap_or("?");
            let numerator = text(r, "numerator").unwrap_or("?");
            let denominator = text(r, "denominator").unwrap_or("?");
            let wait = text(r, "wait").unwrap_or("?");
            bounded(
                format!("{part}: {measure}, {numerator} / {denominator} ({wait})"),
                format!("{part}: {measure}, {denominator} / {numerator} ({wait})"),
                value(Some(r), "value"),
                text(r, "bound"),
                value(Some(r), "target"),
                why_short(part),
            )
        })
        .collect();

    let mut notes = vec![
        "Three network namespaces joined by veth pairs (docs/testbed.md), built and taken \
         down by the run; every process started on its host as a user starts it, fresh for \
         each configuration. Forwarding: a UDP flow and a TCP transfer across the router with \
         the device attached against kernel forwarding alone; capacity: the in-path AF_XDP \
         device against today's UDP-socket device in proxy mode; latency: an in-path update \
         against a UDP echo off the same device; load: 16 clients through the in-path device \
         against clients talking to the server directly. The targets are the project's (no \
         paper figure): the papers' devices are switches and NICs, veth copies every frame."
            .to_owned(),
        "The comparisons follow the suite's convention (a target is a value to reach at \
         least): the benchmark's at-most ratios (latency, p99, CPU per update) are turned \
         over; the lower-is-better panel shows them as the benchmark reports them."
            .to_owned(),
    ];
    if let Some(datapath) = report
        .and_then(|r| r.get("setting"))
        .and_then(|s| text(s, "datapath"))
    {
        notes.push(format!("Datapath: {datapath}."));
    }
    if let Some(others) = entries(report, "results")
        .iter()
        .filter_map(|r| value(Some(r), "others_cpus"))
        .reduce(f64::max)
        .filter(|others| *others > 0.2)
    {
        notes.push(format!(
            "Other processes kept up to {others:.2} CPUs busy during a measurement: the \
             figures are disturbed where they ran."
        ));
    }
    Outcome {
        figure: Figure { panels },
        comparisons,
        notes,
    }
}

pub const INPATH: Experiment = Experiment {
    name: "inpath",
    title: "The device in the path, on AF_XDP",
    about: "The in-path device (docs/inpath.md) against what it replaces, on a testbed of \
            network namespaces and veth pairs (`pmnet bench --in-path`, as root): forwarding \
            of other traffic (against the kernel's), update capacity (against the UDP-socket \
            device in proxy mode), ack latency (against a UDP echo off the same device, \
            blocking and busy-polling) and updates under 16 clients (against clients talking \
            to the server directly), each ratio next to its target.",
    plan,
    analyse,
};

#[cfg(test)]
mod tests {
    use super::super::shared::tests::{failed, step};
    use super::*;
    use crate::eval::model::tests_settings;
    use serde_json::json;

    fn row(part: &str, system: &str, wait: &str, p50: Option<f64>, ops: f64) -> Value {
        json!({"part": part, "system": system, "op": "update", "wait": wait, "p50_us": p50,
               "ops_per_s": ops, "others_cpus": 0.0})
    }

    fn ratio(part: &str, measure: &str, wait: &str, value: f64, bound: &str, target: f64) -> Value {
        json!({"part": part, "measure": measure, "wait": wait, "numerator": "in-path",
               "denominator": "kernel", "value": value, "bound": bound, "target": target,
               "met": false})
    }

    #[test]
    fn without_root_it_is_skipped() {
        let reason = plan(&tests_settings()).unwrap_err();
        assert!(reason.contains("root"), "{reason}");
    }

    #[test]
    fn ratios_by_bound_and_the_figures_behind_them() {
        let report = json!({
            "setting": {"datapath": "AF_XDP on cl, sv"},
            "results": [
                row("latency", "echo", "blocking", Some(57.0), 16_000.0),
                row("latency", "in-path", "blocking", Some(59.0), 16_000.0),
                row("latency", "in-path", "busy-poll", Some(12.0), 60_000.0),
                row("capacity", "in-path", "blocking", Some(450.0), 136_000.0),
                row("capacity", "proxy-udp", "blocking", Some(690.0), 90_000.0),
                row("load", "baseline", "blocking", Some(235.0), 67_000.0),
            ],
            "ratios": [
                ratio("forwarding", "UDP datagrams/s", "blocking", 0.81, "at least", 0.9),
                ratio("capacity", "updates/s", "blocking", 1.51, "at least", 1.5),
                ratio("latency", "p50", "blocking", 1.04, "at most", 1.3),
                ratio("load", "CPU µs per update", "blocking", 0.5, "at most", 0.25),
            ],
        });
        let outcome = analyse(&tests_settings(), &[step(LABEL, report)]);
        let panels = &outcome.figure.panels;
        assert_eq!(panels.len(), 4);
        match &panels[0].kind {
            crate::eval::plot::PanelKind::Bars { categories } => {
                assert_eq!(
                    categories,
                    &vec!["UDP forwarding".to_owned(), "capacity".to_owned()]
                );
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(panels[0].series[0].points, vec![(0.0, 0.81), (1.0, 1.51)]);
        assert_eq!(panels[1].series[1].points, vec![(0.0, 1.3), (1.0, 0.25)]);
        assert_eq!(panels[2].series[0].points, vec![(0.0, 57.0)]);
        assert_eq!(panels[2].series[1].points, vec![(0.0, 59.0), (1.0, 12.0)]);
        assert_eq!(panels[3].series[0].points, vec![(0.0, 136_000.0)]);
        assert_eq!(
            panels[3].series[1].points,
            vec![(0.0, 90_000.0), (1.0, 67_000.0)]
        );
        let c = &outcome.comparisons;
        assert_eq!(c.len(), 4);
        assert_eq!(c[0].met, Some(false));
        assert!(c[0].why_short.as_deref().unwrap().contains("veth"));
        assert_eq!(c[1].met, Some(true));
        assert_eq!(c[2].what, "latency: p50, kernel / in-path (blocking)");
        assert_eq!((c[2].target, c[2].met), (Some(0.769), Some(true)));
        assert_eq!(
            (c[3].measured, c[3].target, c[3].met),
            (Some(2.0), Some(4.0), Some(false))
        );
    }

    #[test]
    fn a_failed_run_leaves_empty_panels() {
        let outcome = analyse(&tests_settings(), &[failed(LABEL)]);
        assert!(outcome.figure.panels.iter().all(|p| p.series.is_empty()));
        assert!(outcome.comparisons.is_empty());
    }
}

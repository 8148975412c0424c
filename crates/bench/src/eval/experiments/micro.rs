//! The paper's microbenchmarks: latency against payload, throughput and latency against load,
//! the update-ratio sweep and the latency CDFs, all with `pmnet bench` on loopback.

use serde_json::Value;

use crate::eval::model::{
    args, bench_mode, number, ratio, result_of, Comparison, Experiment, Invocation, Outcome,
    Settings, StepOutput,
};
use crate::eval::plot::{Mark, Panel};

/// `field` of `mode` in the bench report of the step labelled `label`.
fn field(steps: &[StepOutput], label: &str, mode: &str, field: &str) -> Option<f64> {
    result_of(steps, label)
        .and_then(|report| bench_mode(report, mode))
        .and_then(|result| number(result, &[field]))
}

/// `(x, mode's field)` over the steps `(x, label)`.
fn curve(
    steps: &[StepOutput],
    points: &[(f64, String)],
    mode: &str,
    name: &str,
) -> Vec<(f64, f64)> {
    points
        .iter()
        .filter_map(|(x, label)| field(steps, label, mode, name).map(|y| (*x, y)))
        .collect()
}

fn bench(settings: &Settings, extra: &[&str]) -> Vec<String> {
    let mut all = settings.bench_args();
    all.extend(args(extra));
    all
}

// ---------------------------------------------------------------------------------------------

fn payloads(settings: &Settings) -> Vec<u32> {
    settings.scale.pick(
        vec![50, 1024],
        vec![50, 128, 256, 512, 1024],
        vec![50, 100, 128, 256, 512, 768, 1024],
    )
}

fn store_label(payload: u32) -> String {
    format!("{payload} B, packet store")
}

fn ideal_label(payload: u32) -> String {
    format!("{payload} B, ideal handler")
}

fn plan_payload(settings: &Settings) -> Result<Vec<Invocation>, String> {
    let mut plan = Vec::new();
    for payload in payloads(settings) {
        let size = payload.to_string();
        plan.push(Invocation::new(
            store_label(payload),
            bench(
                settings,
                &["--mode", "echo,baseline,forward,pmnet", "--payload", &size],
            ),
            4.0 * settings.mode_seconds(),
        ));
        plan.push(Invocation::new(
            ideal_label(payload),
            bench(
                settings,
                &[
                    "--mode",
                    "baseline,forward,pmnet",
                    "--ideal",
                    "--payload",
                    &size,
                ],
            ),
            3.0 * settings.mode_seconds(),
        ));
    }
    Ok(plan)
}

fn analyse_payload(settings: &Settings, steps: &[StepOutput]) -> Outcome {
    let sizes = payloads(settings);
    let store: Vec<(f64, String)> = sizes
        .iter()
        .map(|p| (f64::from(*p), store_label(*p)))
        .collect();
    let ideal: Vec<(f64, String)> = sizes
        .iter()
        .map(|p| (f64::from(*p), ideal_label(*p)))
        .collect();
    let mut store_panel = Panel::lines(
        "p50 latency of an update, packet store",
        "payload (bytes)",
        "p50 latency (µs)",
    );
    for mode in ["baseline", "forward", "pmnet", "echo"] {
        store_panel = store_panel.series(mode, curve(steps, &store, mode, "p50_us"));
    }
    let mut ideal_panel = Panel::lines(
        "p50 latency of an update, ideal handler",
        "payload (bytes)",
        "p50 latency (µs)",
    );
    for mode in ["baseline", "forward", "pmnet"] {
        ideal_panel = ideal_panel.series(mode, curve(steps, &ideal, mode, "p50_us"));
    }
    let speedup = |points: &[(f64, String)]| -> Vec<(f64, f64)> {
        points
            .iter()
            .filter_map(|(x, label)| {
                ratio(
                    field(steps, label, "baseline", "p50_us"),
                    field(steps, label, "pmnet", "p50_us"),
                )
                .map(|r| (*x, r))
            })
            .collect()
    };
    let ideal_speedup = speedup(&ideal);
    let speedup_panel = Panel::lines(
        "PMNet's speed-up: baseline p50 / pmnet p50",
        "payload (bytes)",
        "speed-up (×)",
    )
    .series("ideal handler", ideal_speedup.clone())
    .series("packet store", speedup(&store))
    .mark(Mark::Point {
        label: "paper, 50 B: 2.83×".into(),
        x: 50.0,
        y: 2.83,
    })
    .mark(Mark::Point {
        label: "paper, 1000 B: 2.19×".into(),
        x: 1000.0,
        y: 2.19,
    });
    let at = |payload: u32| {
        ratio(
            field(steps, &ideal_label(payload), "baseline", "p50_us"),
            field(steps, &ideal_label(payload), "pmnet", "p50_us"),
        )
    };
    let comparisons = vec![
        Comparison::new("p50 speed-up at 50 B, ideal handler", at(50), "×").paper(2.83),
        Comparison::new("p50 speed-up at 1 KB, ideal handler", at(1024), "×").paper(2.19),
    ];
    let mut notes = vec![
        "The paper's baseline sends each update over a 10 GbE link to a server whose network \
         stack and handler take tens of µs; here the server is on the same machine, so what \
         PMNet saves is the server's wake-up and stack on loopback. `forward` is the same path \
         through the device with logging off: the difference between `forward` and `pmnet` is \
         what the device's early ack is worth on any path."
            .to_owned(),
    ];
    if let (Some(small), Some(large)) = (at(50), at(1024)) {
        notes.push(format!(
            "The speed-up goes from {small:.2}× at 50 B to {large:.2}× at 1 KB (the paper: \
             2.83× to 2.19×): larger payloads cost copying and checksumming on every hop, \
             which both paths pay."
        ));
    }
    Outcome {
        figure: crate::eval::plot::Figure {
            panels: vec![ideal_panel, store_panel, speedup_panel],
        },
        comparisons,
        notes,
    }
}

pub const LATENCY_PAYLOAD: Experiment = Experiment {
    name: "latency-payload",
    title: "Update latency against payload size",
    about: "One client, one update at a time, payloads from 50 B to 1 KB, with the ideal request \
            handler (replies at once, stores nothing: the paper's microbenchmark) and with the \
            packet store. Modes: `baseline` (client to server directly), `forward` (through the \
            device with logging off: a plain switch), `pmnet` (the device's PMNet-ACK after its \
            log write) and `echo` (a UDP echo off the device: the floor for any ack). The paper \
            reports 2.83× at 50 B and about 2.19× at 1000 B with the ideal handler.",
    plan: plan_payload,
    analyse: analyse_payload,
};

// ---------------------------------------------------------------------------------------------

fn client_counts(settings: &Settings) -> Vec<u32> {
    settings.scale.pick(
        vec![1, 8],
        vec![1, 2, 4, 8, 16, 32],
        vec![1, 2, 4, 8, 16, 32, 64],
    )
}

fn clients_label(clients: u32) -> String {
    if clients == 1 {
        "1 client".to_owned()
    } else {
        format!("{clients} clients")
    }
}

fn plan_load(settings: &Settings) -> Result<Vec<Invocation>, String> {
    Ok(client_counts(settings)
        .into_iter()
        .map(|clients| {
            Invocation::new(
                clients_label(clients),
                bench(
                    settings,
                    &[
                        "--mode",
                        "baseline,pmnet",
                        "--clients",
                        &clients.to_string(),
                    ],
                ),
                2.0 * settings.mode_seconds(),
            )
        })
        .collect())
}

fn analyse_load(settings: &Settings, steps: &[StepOutput]) -> Outcome {
    let counts = client_counts(settings);
    let points: Vec<(f64, String)> = counts
        .iter()
        .map(|c| (f64::from(*c), clients_label(*c)))
        .collect();
    let mut throughput = Panel::lines(
        "Update throughput",
        "clients (one update in flight each)",
        "updates/s",
    );
    let mut latency = Panel::lines(
        "p99 latency against throughput",
        "updates/s",
        "p99 latency (µs)",
    );
    for mode in ["baseline", "pmnet"] {
        throughput = throughput.series(mode, curve(steps, &points, mode, "ops_per_s"));
        let pairs: Vec<(f64, f64)> = points
            .iter()
            .filter_map(|(_, label)| {
                Some((
                    field(steps, label, mode, "ops_per_s")?,
                    field(steps, label, mode, "p99_us")?,
                ))
            })
            .collect();
        latency = latency.series(mode, pairs);
    }
    let most = counts.last().copied().unwrap_or(1);
    let label = clients_label(most);
    let comparisons = vec![
        Comparison::new(
            format!("update throughput, pmnet / baseline, {most} clients"),
            ratio(
                field(steps, &label, "pmnet", "ops_per_s"),
                field(steps, &label, "baseline", "ops_per_s"),
            ),
            "×",
        ),
        Comparison::new(
            format!("p99 latency, baseline / pmnet, {most} clients"),
            ratio(
                field(steps, &label, "baseline", "p99_us"),
                field(steps, &label, "pmnet", "p99_us"),
            ),
            "×",
        ),
    ];
    Outcome {
        figure: crate::eval::plot::Figure {
            panels: vec![throughput, latency],
        },
        comparisons,
        notes: vec![
            "Closed-loop clients, each with one update in flight, 100 % updates, 100-byte \
             values, the packet store. With several clients `pmnet bench` places the device on \
             the server's CPU and the clients on the other (docs/benchmarks.md): on two vCPUs \
             the clients' own CPU time bounds both systems' throughput, so the curve flattens \
             where the machine does, not where the server would."
                .to_owned(),
        ],
    }
}

pub const LOAD: Experiment = Experiment {
    name: "load",
    title: "Throughput and latency against offered load",
    about: "The paper's bandwidth-stress figure on one machine: closed-loop clients (1 to 32, \
            one update in flight each) update through the device (`pmnet`) or straight to the \
            server (`baseline`); throughput against clients, and p99 latency against throughput.",
    plan: plan_load,
    analyse: analyse_load,
};

// ---------------------------------------------------------------------------------------------

fn update_ratios(settings: &Settings) -> Vec<f64> {
    settings.scale.pick(
        vec![0.0, 1.0],
        vec![0.0, 0.25, 0.5, 0.75, 1.0],
        vec![0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0],
    )
}

fn ratio_label(update_ratio: f64) -> String {
    format!("{:.0} % updates", update_ratio * 100.0)
}

const SWEEP_CLIENTS: &str = "4";

fn plan_update_ratio(settings: &Settings) -> Result<Vec<Invocation>, String> {
    Ok(update_ratios(settings)
        .into_iter()
        .map(|share| {
            Invocation::new(
                ratio_label(share),
                bench(
                    settings,
                    &[
                        "--mode",
                        "baseline,pmnet",
                        "--clients",
                        SWEEP_CLIENTS,
                        "--update-ratio",
                        &share.to_string(),
                    ],
                ),
                2.0 * settings.mode_seconds(),
            )
        })
        .collect())
}

fn analyse_update_ratio(settings: &Settings, steps: &[StepOutput]) -> Outcome {
    let points: Vec<(f64, String)> = update_ratios(settings)
        .iter()
        .map(|share| (share * 100.0, ratio_label(*share)))
        .collect();
    let mut throughput = Panel::lines("Throughput", "updates (% of requests)", "requests/s");
    let mut latency = Panel::lines(
        "Mean latency",
        "updates (% of requests)",
        "mean latency (µs)",
    );
    for mode in ["baseline", "pmnet"] {
        throughput = throughput.series(mode, curve(steps, &points, mode, "ops_per_s"));
        latency = latency.series(mode, curve(steps, &points, mode, "mean_us"));
    }
    let at = |label: &str| {
        ratio(
            field(steps, label, "pmnet", "ops_per_s"),
            field(steps, label, "baseline", "ops_per_s"),
        )
    };
    let comparisons = vec![
        Comparison::new(
            "throughput, pmnet / baseline, 100 % updates",
            at(&ratio_label(1.0)),
            "×",
        ),
        Comparison::new(
            "throughput, pmnet / baseline, 0 % updates",
            at(&ratio_label(0.0)),
            "×",
        ),
    ];
    Outcome {
        figure: crate::eval::plot::Figure {
            panels: vec![throughput, latency],
        },
        comparisons,
        notes: vec![format!(
            "{SWEEP_CLIENTS} closed-loop clients; reads are GETs sent as bypass requests (never \
             logged, answered by the server), so PMNet's gain grows with the share of updates \
             and is nil without any: at 0 % updates both paths do the same work, and pmnet's \
             reads cross one more hop."
        )],
    }
}

pub const UPDATE_RATIO: Experiment = Experiment {
    name: "update-ratio",
    title: "Throughput and latency against the share of updates",
    about: "From read-only to update-only (0 % to 100 % SETs, the rest GETs), 4 clients, \
            through the device (`pmnet`) and straight to the server (`baseline`).",
    plan: plan_update_ratio,
    analyse: analyse_update_ratio,
};

// ---------------------------------------------------------------------------------------------

const CDF_LOADS: [(&str, &str); 2] = [("1 client", "1"), ("16 clients", "16")];

fn plan_cdf(settings: &Settings) -> Result<Vec<Invocation>, String> {
    Ok(CDF_LOADS
        .iter()
        .map(|(label, clients)| {
            Invocation::new(
                *label,
                bench(
                    settings,
                    &["--mode", "baseline,forward,pmnet", "--clients", clients],
                ),
                3.0 * settings.mode_seconds(),
            )
        })
        .collect())
}

/// The CDF of `mode` as `(µs, fraction)`, up to `cap` µs.
fn cdf(report: &Value, mode: &str, cap: f64) -> Vec<(f64, f64)> {
    bench_mode(report, mode)
        .and_then(|result| result.get("cdf"))
        .and_then(Value::as_array)
        .map(|points| {
            points
                .iter()
                .filter_map(|point| {
                    let quantile = point.get(0)?.as_f64()?;
                    let micros = point.get(1)?.as_f64()?;
                    (micros <= cap).then_some((micros, quantile))
                })
                .collect()
        })
        .unwrap_or_default()
}

fn analyse_cdf(_settings: &Settings, steps: &[StepOutput]) -> Outcome {
    let modes = ["baseline", "forward", "pmnet"];
    let mut panels = Vec::new();
    let mut comparisons = Vec::new();
    for (label, _) in CDF_LOADS {
        let Some(report) = result_of(steps, label) else {
            continue;
        };
        // Drawn up to the largest p99.9: the rest of the tail would flatten the curves.
        let cap = modes
            .iter()
            .filter_map(|mode| bench_mode(report, mode).and_then(|r| number(r, &["p999_us"])))
            .fold(0.0, f64::max);
        let mut panel = Panel::lines(
            &format!("Latency CDF, {label} (to p99.9)"),
            "latency (µs)",
            "fraction of updates",
        )
        .dense();
        for mode in modes {
            panel = panel.series(mode, cdf(report, mode, cap));
        }
        panels.push(panel);
        comparisons.push(Comparison::new(
            format!("p99 latency, baseline / pmnet, {label}"),
            ratio(
                field(steps, label, "baseline", "p99_us"),
                field(steps, label, "pmnet", "p99_us"),
            ),
            "×",
        ));
    }
    Outcome {
        figure: crate::eval::plot::Figure { panels },
        comparisons,
        notes: vec![
            "Every update's latency, 100-byte values, the packet store; the CDF is drawn from \
             each mode's histogram at every percent and at 99.5, 99.9 %."
                .to_owned(),
        ],
    }
}

pub const CDF: Experiment = Experiment {
    name: "cdf",
    title: "Latency CDFs",
    about: "The distribution of update latency through the device (`pmnet`), through it with \
            logging off (`forward`) and straight to the server (`baseline`), with one client \
            and with 16.",
    plan: plan_cdf,
    analyse: analyse_cdf,
};

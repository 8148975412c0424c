//! NetCache's figures on the storage rack (`pmnet bench --servers 32 --server-max-ops-per-s
//! 1000 --cache on,off`): throughput against skew with the cache on and off, throughput over
//! time while the hottest keys change, and the latency of a cached read (PMNet's read caching).

use serde_json::Value;

use super::shared::{bench_base, entries, seconds};
use crate::eval::model::{
    args, bench_mode, number, ratio, result_of, Comparison, Experiment, Invocation, Outcome,
    Settings, StepOutput,
};
use crate::eval::plot::{Figure, Mark, Panel};

/// The rack of docs/benchmarks.md ("Read cache on the rack"): 32 servers of an emulated
/// capacity of 1 000 requests/s each.
const SERVERS: &str = "32";
const CAPACITY: &str = "1000";
/// Keys that become the hottest at each popularity change.
const CHANGE_COUNT: &str = "200";

const ON: &str = "pmnet+cache";
const OFF: &str = "pmnet";

const HOT_IN: &str = "hot-in";
const LATENCY: &str = "latency, 1 client";

/// How long each run warms up and measures, by scale.
struct Timing {
    warmup: f64,
    duration: f64,
    hot_duration: f64,
    change_every: f64,
    latency_warmup: f64,
    latency_duration: f64,
}

fn timing(settings: &Settings) -> Timing {
    settings.scale.pick(
        Timing {
            warmup: 0.5,
            duration: 0.5,
            hot_duration: 2.0,
            change_every: 1.0,
            latency_warmup: 0.5,
            latency_duration: 0.5,
        },
        Timing {
            warmup: 3.0,
            duration: 2.0,
            hot_duration: 8.0,
            change_every: 2.0,
            latency_warmup: 2.0,
            latency_duration: 2.0,
        },
        Timing {
            warmup: 10.0,
            duration: 5.0,
            hot_duration: 20.0,
            change_every: 2.0,
            latency_warmup: 10.0,
            latency_duration: 5.0,
        },
    )
}

/// The skews measured: (`--dist`, label, NetCache's gain at that skew if it gives one).
fn skews(settings: &Settings) -> Vec<(&'static str, &'static str)> {
    let all = vec![
        ("uniform", "uniform"),
        ("zipf:0.9", "Zipf 0.9"),
        ("zipf:0.95", "Zipf 0.95"),
        ("zipf:0.99", "Zipf 0.99"),
    ];
    settings.scale.pick(
        vec![
            ("uniform", "uniform"),
            ("zipf:0.9", "Zipf 0.9"),
            ("zipf:0.99", "Zipf 0.99"),
        ],
        all.clone(),
        all,
    )
}

/// A run with the cache on and then off takes both modes' warm-up and measurement, and
/// starting 32 servers twice.
fn estimate(warmup: f64, duration: f64) -> f64 {
    2.0 * (warmup + duration) + 1.2
}

/// Each server's store: the workload is read-only, so nothing is stored, and 32 stores of the
/// default 64 MiB take seconds to set up.
const DATA_MIB: &str = "4";

fn rack(settings: &Settings, extra: &[&str]) -> Vec<String> {
    let mut all = bench_base(settings);
    all.extend(args(&[
        "--mode",
        OFF,
        "--cache",
        "on,off",
        "--servers",
        SERVERS,
        "--update-ratio",
        "0",
        "--data-mib",
        DATA_MIB,
    ]));
    all.extend(args(extra));
    all
}

fn plan(settings: &Settings) -> Result<Vec<Invocation>, String> {
    let t = timing(settings);
    let (warmup, duration) = (seconds(t.warmup), seconds(t.duration));
    let mut plan = Vec::new();
    for (dist, label) in skews(settings) {
        plan.push(Invocation::new(
            label,
            rack(
                settings,
                &[
                    "--server-max-ops-per-s",
                    CAPACITY,
                    "--dist",
                    dist,
                    "--warmup",
                    &warmup,
                    "--duration",
                    &duration,
                ],
            ),
            estimate(t.warmup, t.duration),
        ));
    }
    plan.push(Invocation::new(
        HOT_IN,
        rack(
            settings,
            &[
                "--server-max-ops-per-s",
                CAPACITY,
                "--dist",
                "zipf:0.99",
                "--popularity",
                "hot-in",
                "--change-every",
                &seconds(t.change_every),
                "--change-count",
                CHANGE_COUNT,
                "--warmup",
                &warmup,
                "--duration",
                &seconds(t.hot_duration),
            ],
        ),
        estimate(t.warmup, t.hot_duration),
    ));
    // Latency: one client, one read in flight, no capacity limit (docs/benchmarks.md).
    plan.push(Invocation::new(
        LATENCY,
        rack(
            settings,
            &[
                "--clients",
                "1",
                "--window",
                "1",
                "--dist",
                "zipf:0.99",
                "--warmup",
                &seconds(t.latency_warmup),
                "--duration",
                &seconds(t.latency_duration),
            ],
        ),
        estimate(t.latency_warmup, t.latency_duration),
    ));
    Ok(plan)
}

/// `mode`'s result in the step labelled `label`.
fn mode<'a>(steps: &'a [StepOutput], label: &str, mode: &str) -> Option<&'a Value> {
    result_of(steps, label).and_then(|report| bench_mode(report, mode))
}

fn ops(steps: &[StepOutput], label: &str, which: &str) -> Option<f64> {
    mode(steps, label, which).and_then(|result| number(result, &["ops_per_s"]))
}

/// The on/off comparison the bench made itself (`cache_comparisons[0][key]`).
fn cache_comparison(steps: &[StepOutput], label: &str, key: &str) -> Option<f64> {
    entries(result_of(steps, label), "cache_comparisons")
        .first()
        .and_then(|entry| number(entry, &[key]))
}

/// The gain NetCache reports at a skew: its range, 3× to 10×, spans its skews from Zipf 0.9
/// to Zipf 0.99 (128 servers).
fn netcache_gain(label: &str) -> Option<f64> {
    match label {
        "Zipf 0.9" => Some(3.0),
        "Zipf 0.99" => Some(10.0),
        _ => None,
    }
}

/// The docs' target for a skew's gain (docs/benchmarks.md, "Read cache on the rack").
fn gain_target(label: &str) -> Option<f64> {
    match label {
        "Zipf 0.9" => Some(2.0),
        "Zipf 0.99" => Some(5.0),
        _ => None,
    }
}

fn gain_short(ideal: Option<f64>, hit: Option<f64>) -> String {
    let bound = match (ideal, hit) {
        (Some(ideal), Some(hit)) => format!(
            "With this run's hit ratio ({:.0} %) and the busiest server's share with the cache \
             off, the rack could gain about {ideal:.2}× at most (S × share / (1 − h)). ",
            hit * 100.0
        ),
        _ => String::new(),
    };
    format!(
        "{bound}With the cache on, the clients, the device and 32 servers share 2 vCPUs, which \
         bound the rack before its servers do; a short warm-up also leaves the cache filling \
         (docs/benchmarks.md, \"Sizing the capacity\")."
    )
}

/// (p50, mean, p99) of a latency summary.
fn latency(summary: Option<&Value>) -> Vec<(f64, f64)> {
    let Some(summary) = summary else {
        return Vec::new();
    };
    ["p50_us", "mean_us", "p99_us"]
        .iter()
        .enumerate()
        .filter_map(|(index, key)| number(summary, &[key]).map(|y| (index as f64, y)))
        .collect()
}

fn analyse(settings: &Settings, steps: &[StepOutput]) -> Outcome {
    let t = timing(settings);
    let skews = skews(settings);
    let categories: Vec<String> = skews.iter().map(|(_, label)| (*label).to_owned()).collect();
    let indexed = |value: &dyn Fn(&str) -> Option<f64>| -> Vec<(f64, f64)> {
        skews
            .iter()
            .enumerate()
            .filter_map(|(index, (_, label))| value(label).map(|y| (index as f64, y)))
            .collect()
    };

    let throughput = Panel::bars(
        &format!("Rack throughput, {SERVERS} servers of {CAPACITY} requests/s (emulated)"),
        "reads/s",
        categories.clone(),
    )
    .series("cache off", indexed(&|label| ops(steps, label, OFF)))
    .series("cache on", indexed(&|label| ops(steps, label, ON)));

    let gain = |label: &str| ratio(ops(steps, label, ON), ops(steps, label, OFF));
    let mut gains = Panel::bars(
        "Throughput gain of the cache: on / off",
        "gain (×)",
        categories,
    )
    .series("measured", indexed(&gain))
    .series(
        "ideal for its hit ratio: S × share / (1 − h)",
        indexed(&|label| cache_comparison(steps, label, "ideal_gain")),
    );
    for (index, (_, label)) in skews.iter().enumerate() {
        if let Some(paper) = netcache_gain(label) {
            gains = gains.mark(Mark::Point {
                label: format!("NetCache (128 servers), {label}: {paper}×"),
                x: super::shared::bar_middle(index, 0, 2),
                y: paper,
            });
        }
    }

    let per_second = |which: &str| -> Vec<(f64, f64)> {
        mode(steps, HOT_IN, which)
            .map(|result| entries(Some(result), "per_second"))
            .unwrap_or_default()
            .iter()
            .filter_map(|sample| {
                // A sample is the second ending at `t_s`: drawn at its middle.
                let t = number(sample, &["t_s"])?;
                Some((t - 0.5, number(sample, &["ops_per_s"])?))
            })
            .collect()
    };
    let recoveries = entries(mode(steps, HOT_IN, ON), "recoveries");
    let lowest: Vec<(f64, f64)> = recoveries
        .iter()
        .filter_map(|r| Some((number(r, &["at_s"])?, number(r, &["lowest_ops_per_s"])?)))
        .collect();
    let over_time = Panel::lines(
        &format!(
            "Zipf 0.99, the {CHANGE_COUNT} coldest keys become the hottest every {} s",
            t.change_every
        ),
        "time into the measured stretch (s): each second at its middle",
        "reads/s (per second)",
    )
    .series("cache on", per_second(ON))
    .series("cache off", per_second(OFF))
    .series("cache on, lowest 100 ms after a change", lowest);

    let on_device = mode(steps, LATENCY, ON).and_then(|r| r.get("reads_by_device"));
    let on_server = mode(steps, LATENCY, ON).and_then(|r| r.get("reads_by_server"));
    let off_server = mode(steps, LATENCY, OFF).and_then(|r| r.get("reads_by_server"));
    let latency_panel = Panel::bars(
        "Read latency, 1 client, no capacity limit, Zipf 0.99",
        "latency (µs)",
        vec!["p50".into(), "mean".into(), "p99".into()],
    )
    .series("cached read (the device answers)", latency(on_device))
    .series("cache on, read a server answers", latency(on_server))
    .series("cache off (a server answers)", latency(off_server));

    let mut comparisons = Vec::new();
    for (_, label) in &skews {
        let mut comparison = Comparison::new(
            format!("read throughput, cache on / off, {label}"),
            gain(label),
            "×",
        );
        if let Some(paper) = netcache_gain(label) {
            comparison = comparison.paper(paper);
        }
        if let Some(target) = gain_target(label) {
            comparison = comparison.target(
                target,
                &gain_short(
                    cache_comparison(steps, label, "ideal_gain"),
                    cache_comparison(steps, label, "hit_ratio"),
                ),
            );
        }
        comparisons.push(comparison);
    }
    comparisons.push(Comparison::new(
        format!(
            "read throughput, cache on / off, hot-in every {} s (Zipf 0.99)",
            t.change_every
        ),
        ratio(mean_rate(&per_second(ON)), mean_rate(&per_second(OFF))),
        "×",
    ));
    let back: Vec<Option<f64>> = recoveries
        .iter()
        .map(|r| number(r, &["back_to_90_after_s"]))
        .collect();
    let slowest = if back.iter().any(Option::is_none) {
        None
    } else {
        back.iter().flatten().copied().reduce(f64::max)
    };
    comparisons.push(Comparison::new(
        "cache on: back to 90 % of the rate after a hot-in change, slowest",
        slowest,
        "s",
    ));
    let device_mean = on_device.and_then(|s| number(s, &["mean_us"]));
    let device_p50 = on_device.and_then(|s| number(s, &["p50_us"]));
    comparisons.push(
        Comparison::new(
            "mean read latency, cache off / cached read (1 client)",
            ratio(
                off_server.and_then(|s| number(s, &["mean_us"])),
                device_mean,
            ),
            "×",
        )
        .paper(3.36),
    );
    comparisons.push(
        Comparison::new(
            "p50 read latency, cache off / cached read (1 client)",
            ratio(off_server.and_then(|s| number(s, &["p50_us"])), device_p50),
            "×",
        )
        .target(
            2.0,
            "A cached read still crosses the client's and the device's wake-ups on loopback: \
             two of the four hand-offs of a read a server answers.",
        ),
    );

    let mut notes = vec![format!(
        "The storage rack of docs/benchmarks.md: one device in front of {SERVERS} servers \
         whose capacity is emulated at {CAPACITY} requests/s each (a token bucket, as \
         NetCache's evaluation emulates its storage servers), 4 clients × 16 reads in flight, \
         1 000 000 keys, read-only, 100-byte values (nothing is written, so each server's \
         store is 4 MiB); the cache holds up to 10 000 keys and admits a key read twice in a \
         100 ms interval. Each skew runs the cache on and then off with the same seed: {} s \
         of warm-up (the cache fills), {} s measured. Without the cache the rack saturates \
         when its busiest server does (reads/s ≈ capacity / its share); with it, hits cost no \
         server anything, so the gain is about S × share / (1 − h) for a hit ratio h, drawn \
         as the ideal.",
        t.warmup, t.duration
    )];
    for (_, label) in &skews {
        if let (Some(gain), Some(hit)) = (gain(label), cache_comparison(steps, label, "hit_ratio"))
        {
            let ideal = cache_comparison(steps, label, "ideal_gain")
                .map_or_else(String::new, |ideal| format!(", ideal {ideal:.2}×"));
            let items = mode(steps, label, ON)
                .and_then(|r| number(r, &["cache", "items"]))
                .map_or_else(String::new, |items| format!(", {items:.0} keys cached"));
            notes.push(format!(
                "{label}: {gain:.2}× with {:.0} % of reads answered by the device{items}{ideal}.",
                hit * 100.0
            ));
        }
    }
    notes.push(
        "NetCache's 3–10× is over 128 servers and a Tofino switch answering at line rate; \
         the gain a cache can give grows with the number of servers (S × share), so with 32 \
         servers the same skew allows less, and on this machine the cache-on rack is bound by \
         the CPU the clients, the device and the servers share."
            .to_owned(),
    );
    if !recoveries.is_empty() {
        let lines: Vec<String> = recoveries
            .iter()
            .filter_map(|r| {
                Some(format!(
                    "at {:.1} s: {:.0} reads/s the second before, {:.0} at the lowest 100 ms, \
                     back to 90 % after {}",
                    number(r, &["at_s"])?,
                    number(r, &["before_ops_per_s"])?,
                    number(r, &["lowest_ops_per_s"])?,
                    number(r, &["back_to_90_after_s"])
                        .map_or("more than the rest of the interval".to_owned(), |s| {
                            format!("{s:.1} s")
                        })
                ))
            })
            .collect();
        notes.push(format!(
            "Hot-in, cache on (the target: back to 90 % within 1 s of a change): {}. The new \
             hottest keys all miss until the controller admits them (read twice in a 100 ms \
             interval) and fetches them on their next miss; the per-second line averages the \
             dip out, the lowest 100 ms shows it.",
            lines.join("; ")
        ));
    }
    if let Some(hit) = mode(steps, LATENCY, ON).and_then(|r| number(r, &["cache", "hit_ratio"])) {
        notes.push(format!(
            "Latency: one client, one read at a time, no capacity limit, {} s of warm-up; {:.0} \
             % of its reads were cached. PMNet's 3.36× is its cached reads' latency against \
             reads its baseline server answers.",
            t.latency_warmup,
            hit * 100.0
        ));
    }
    Outcome {
        figure: Figure {
            panels: vec![throughput, gains, over_time, latency_panel],
        },
        comparisons,
        notes,
    }
}

/// The mean of a per-second series' rates.
fn mean_rate(series: &[(f64, f64)]) -> Option<f64> {
    (!series.is_empty()).then(|| series.iter().map(|(_, y)| y).sum::<f64>() / series.len() as f64)
}

pub const CACHE: Experiment = Experiment {
    name: "cache",
    title: "Read cache: rack throughput against skew, under changing popularity, latency",
    about: "NetCache's figures with the device's read cache (docs/cache.md) on a storage rack \
            of 32 servers whose capacity is emulated at 1 000 requests/s each \
            (`pmnet bench --servers 32 --server-max-ops-per-s 1000 --cache on,off`): \
            read-only throughput with the cache on and off from uniform to Zipf 0.99, the \
            throughput second by second while the 200 coldest keys become the hottest every \
            few seconds (`--popularity hot-in`), and PMNet's read caching: the latency of a \
            read the device answers against one a server answers (one client, no capacity \
            limit). NetCache reports 3–10× the throughput; PMNet 3.36× lower read latency.",
    plan,
    analyse,
};

#[cfg(test)]
mod tests {
    use super::super::shared::tests::{failed, step};
    use super::*;
    use crate::eval::model::tests_settings;
    use serde_json::json;

    fn rack_result(mode: &str, ops: f64, per_second: Value, recoveries: Value) -> Value {
        let cached = mode == ON;
        json!({
            "mode": mode, "p50_us": 100.0, "ops_per_s": ops,
            "per_second": per_second, "recoveries": recoveries,
            "reads_by_device": if cached {
                json!({"count": 10, "p50_us": 20.0, "mean_us": 25.0, "p99_us": 60.0})
            } else { Value::Null },
            "reads_by_server": {"count": 10, "p50_us": 110.0, "mean_us": 100.0, "p99_us": 200.0},
            "cache": if cached { json!({"hit_ratio": 0.5, "items": 1637}) } else { Value::Null },
        })
    }

    fn run(on: f64, off: f64) -> Value {
        json!({
            "setting": {"medium": "dram"},
            "results": [rack_result(ON, on, json!([]), json!([])),
                        rack_result(OFF, off, json!([]), json!([]))],
            "cache_comparisons": [{"on": ON, "off": OFF, "gain": on / off,
                                   "ideal_gain": 6.0, "hit_ratio": 0.5}],
        })
    }

    #[test]
    fn the_plan_runs_every_skew_hot_in_and_latency() {
        let plan = plan(&tests_settings()).unwrap();
        let labels: Vec<&str> = plan.iter().map(|i| i.label.as_str()).collect();
        assert_eq!(
            labels,
            vec!["uniform", "Zipf 0.9", "Zipf 0.99", HOT_IN, LATENCY]
        );
        assert!(plan[2]
            .args
            .windows(2)
            .any(|w| w == ["--dist", "zipf:0.99"]));
        assert!(plan[2].args.windows(2).any(|w| w == ["--cache", "on,off"]));
        assert!(plan[3]
            .args
            .windows(2)
            .any(|w| w == ["--popularity", "hot-in"]));
        assert!(!plan[4].args.iter().any(|a| a == "--server-max-ops-per-s"));
        let total: f64 = plan.iter().map(|i| i.estimate_s).sum();
        assert!(total <= 22.0, "quick takes {total} s");
    }

    #[test]
    fn gains_latency_and_the_timeline_come_from_the_json() {
        let hot = json!({
            "results": [
                rack_result(ON, 50_000.0,
                    json!([{"t_s": 1, "ops_per_s": 50_000.0}, {"t_s": 2, "ops_per_s": 48_000.0}]),
                    json!([{"at_s": 1.0, "before_ops_per_s": 50_000.0,
                            "lowest_ops_per_s": 30_000.0, "back_to_90_after_s": 0.3}])),
                rack_result(OFF, 10_000.0,
                    json!([{"t_s": 1, "ops_per_s": 10_000.0}, {"t_s": 2, "ops_per_s": 9_600.0}]),
                    json!([])),
            ],
        });
        let steps = vec![
            step("uniform", run(30_000.0, 29_000.0)),
            step("Zipf 0.9", run(32_000.0, 16_000.0)),
            step("Zipf 0.99", run(60_000.0, 10_000.0)),
            step(HOT_IN, hot),
            step(LATENCY, run(8_000.0, 7_000.0)),
        ];
        let outcome = analyse(&tests_settings(), &steps);
        let panels = &outcome.figure.panels;
        assert_eq!(panels.len(), 4);
        assert_eq!(panels[0].series.len(), 2);
        assert_eq!(
            panels[0].series[1].points,
            vec![(0.0, 30_000.0), (1.0, 32_000.0), (2.0, 60_000.0)]
        );
        assert_eq!(panels[1].series[0].points[2], (2.0, 6.0));
        assert_eq!(panels[1].marks.len(), 2, "NetCache's 3× and 10×");
        assert_eq!(
            panels[2].series[0].points,
            vec![(0.5, 50_000.0), (1.5, 48_000.0)]
        );
        assert_eq!(panels[2].series[2].points, vec![(1.0, 30_000.0)]);
        assert_eq!(panels[3].series[0].points[0], (0.0, 20.0));
        let find = |what: &str| {
            outcome
                .comparisons
                .iter()
                .find(|c| c.what.contains(what))
                .unwrap_or_else(|| panic!("{what}"))
        };
        let zipf = find("Zipf 0.99");
        assert_eq!(zipf.measured, Some(6.0));
        assert_eq!(
            (zipf.paper, zipf.target, zipf.met),
            (Some(10.0), Some(5.0), Some(true))
        );
        assert!(find("uniform").target.is_none());
        let flatter = outcome
            .comparisons
            .iter()
            .find(|c| c.what.ends_with("Zipf 0.9"))
            .unwrap();
        assert_eq!((flatter.measured, flatter.target), (Some(2.0), Some(2.0)));
        assert_eq!(find("hot-in every").measured, Some(5.0));
        assert_eq!(find("back to 90").measured, Some(0.3));
        let mean = find("mean read latency");
        assert_eq!((mean.measured, mean.paper), (Some(4.0), Some(3.36)));
        assert_eq!(find("p50 read latency").measured, Some(5.5));
    }

    #[test]
    fn failed_runs_leave_their_series_out() {
        let steps = vec![
            failed("uniform"),
            step("Zipf 0.99", run(60_000.0, 10_000.0)),
            failed(HOT_IN),
            failed(LATENCY),
        ];
        let outcome = analyse(&tests_settings(), &steps);
        assert_eq!(
            outcome.figure.panels[0].series[0].points,
            vec![(2.0, 10_000.0)]
        );
        assert!(outcome.figure.panels[2].series.is_empty());
        assert!(outcome.figure.panels[3].series.is_empty());
        let latency = outcome
            .comparisons
            .iter()
            .find(|c| c.what.starts_with("p50 read latency"))
            .unwrap();
        assert_eq!((latency.measured, latency.met), (None, None));
        let none = analyse(&tests_settings(), &[]);
        assert!(none.comparisons.iter().all(|c| c.measured.is_none()));
    }
}

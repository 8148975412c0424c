//! The workloads figure: update throughput and p99 latency against client-server, for the
//! embedded storage engines (`pmnet bench --engine`) and for a real Redis behind PMNet (its
//! server side the PMNet module inside redis-server) with YCSB-style, Twitter-like and
//! TPC-C-like workloads (`pmnet redis-bench`), and the CPU each part spends per operation.

use serde_json::Value;

use crate::eval::model::{
    args, bench_mode, mean, number, on_path, ratio, result_of, Comparison, Experiment, Invocation,
    Outcome, Settings, StepOutput,
};
use crate::eval::plot::{Figure, Mark, Panel};

/// Closed-loop clients of every workload (the paper ran 64 client instances on its testbed).
const CLIENTS: &str = "16";

/// The embedded engines: (label, `--engine`).
const ENGINES: [(&str, &str); 2] = [("packet store", "packet"), ("kv store", "kv")];

const REDIS: &str = "redis workloads";

const THROUGHPUT_SHORT: &str = "The paper's 64 client instances waited for servers across a \
    10 GbE link, each on a machine of its own: they were latency-bound, and PMNet's earlier ack \
    turned straight into throughput. Here 16 clients, the device and the server (for Redis also \
    the gateway, and redis-server with the PMNet module in it) share two vCPUs over loopback, \
    so every path is bound by the CPU time a request costs, and PMNet adds a hop whose work \
    every request pays without freeing any CPU by not waiting. Reads and the other bypass \
    requests (counting writes, locks, scripts: half to 95 % of the Redis workloads' requests, \
    as the gateway sends only fixed-reply writes as updates) cross the gateway, the device and \
    the module, and cost more CPU than the same command sent to Redis directly (the notes give \
    each part's CPU per operation). Where nothing is saturated (one client), an update through PMNet is answered several times sooner than by Redis with \
    appendfsync always (docs/benchmarks.md, \"Redis workloads\").";

const P99_SHORT: &str = "With every part CPU-bound on two vCPUs, the tail is set by the \
    run queues: a PMNet-ACK waits behind the same scheduler as the server's reply, and a bypass \
    request is ordered after its session's earlier updates, so it waits for Redis to have \
    applied (and fsync'd) them. The paper's tail gain comes from taking the server's network \
    stack and handler off the critical path of latency-bound clients, which needs the \
    clients, the device and the server on separate machines.";

fn plan(settings: &Settings) -> Result<Vec<Invocation>, String> {
    let (duration, warmup, rounds) = settings.measure();
    let mut plan = Vec::new();
    for (label, engine) in ENGINES {
        let mut command = settings.bench_args();
        command.extend(args(&[
            "--mode",
            "baseline,pmnet",
            "--clients",
            CLIENTS,
            "--engine",
            engine,
        ]));
        plan.push(Invocation::new(
            label,
            command,
            2.0 * settings.mode_seconds(),
        ));
    }
    if on_path("redis-server") {
        let records = settings.scale.pick("500", "10000", "100000");
        let command = args(&[
            "redis-bench",
            "--clients",
            CLIENTS,
            "--duration",
            &duration.to_string(),
            "--warmup",
            &warmup.to_string(),
            "--rounds",
            &rounds.to_string(),
            "--records",
            records,
            "--seed",
            &settings.seed.to_string(),
            "--no-progress",
        ]);
        // Five workloads, two systems, each started fresh (Redis loads its records first).
        let estimate = 10.0 * ((duration + warmup) * f64::from(rounds) + 2.0);
        plan.push(Invocation::new(REDIS, command, estimate));
    }
    Ok(plan)
}

/// One workload's figures: (name, update throughput pmnet/baseline, p99 baseline/pmnet,
/// baseline updates/s, pmnet updates/s).
struct Row {
    name: String,
    throughput: Option<f64>,
    p99: Option<f64>,
    baseline_ops: Option<f64>,
    pmnet_ops: Option<f64>,
}

fn engine_row(steps: &[StepOutput], label: &str) -> Option<Row> {
    let report = result_of(steps, label)?;
    let get = |mode: &str, field: &str| bench_mode(report, mode).and_then(|r| number(r, &[field]));
    Some(Row {
        name: label.to_owned(),
        throughput: ratio(get("pmnet", "ops_per_s"), get("baseline", "ops_per_s")),
        p99: ratio(get("baseline", "p99_us"), get("pmnet", "p99_us")),
        baseline_ops: get("baseline", "ops_per_s"),
        pmnet_ops: get("pmnet", "ops_per_s"),
    })
}

fn system<'a>(workload: &'a Value, name: &str) -> Option<&'a Value> {
    workload
        .get("systems")?
        .as_array()?
        .iter()
        .find(|s| s.get("system").and_then(Value::as_str) == Some(name))
}

fn redis_rows(steps: &[StepOutput]) -> Vec<Row> {
    let Some(workloads) = result_of(steps, REDIS)
        .and_then(|report| report.get("workloads"))
        .and_then(Value::as_array)
    else {
        return Vec::new();
    };
    workloads
        .iter()
        .filter_map(|workload| {
            let name = workload.get("workload")?.as_str()?;
            let ops = |system_name: &str| {
                system(workload, system_name).and_then(|s| number(s, &["update_ops_per_s"]))
            };
            let p99 = |system_name: &str| {
                system(workload, system_name).and_then(|s| {
                    number(s, &["updates", "p99_us"]).or_else(|| number(s, &["all", "p99_us"]))
                })
            };
            Some(Row {
                name: format!("redis {name}"),
                throughput: ratio(ops("pmnet"), ops("baseline")),
                p99: ratio(p99("baseline"), p99("pmnet")),
                baseline_ops: ops("baseline"),
                pmnet_ops: ops("pmnet"),
            })
        })
        .collect()
}

fn analyse(_settings: &Settings, steps: &[StepOutput]) -> Outcome {
    let mut rows: Vec<Row> = ENGINES
        .iter()
        .filter_map(|(label, _)| engine_row(steps, label))
        .collect();
    rows.extend(redis_rows(steps));
    let categories: Vec<String> = rows.iter().map(|row| row.name.clone()).collect();
    let bars = |pick: fn(&Row) -> Option<f64>| -> Vec<(f64, f64)> {
        rows.iter()
            .enumerate()
            .filter_map(|(index, row)| pick(row).map(|value| (index as f64, value)))
            .collect()
    };
    let average_throughput = mean(rows.iter().map(|row| row.throughput));
    let average_p99 = mean(rows.iter().map(|row| row.p99));
    let throughput = Panel::bars(
        "Update throughput, pmnet / client-server",
        "ratio (×)",
        categories.clone(),
    )
    .series("measured", bars(|row| row.throughput))
    .mark(Mark::Level {
        label: "paper's average: 4.31×".into(),
        y: 4.31,
    })
    .mark(Mark::Level {
        label: "even: 1×".into(),
        y: 1.0,
    });
    let p99 = Panel::bars(
        "p99 latency of updates, client-server / pmnet",
        "ratio (×)",
        categories.clone(),
    )
    .series("measured", bars(|row| row.p99))
    .mark(Mark::Level {
        label: "paper's average: 3.23×".into(),
        y: 3.23,
    })
    .mark(Mark::Level {
        label: "even: 1×".into(),
        y: 1.0,
    });
    let absolute = Panel::bars("Update throughput", "updates/s", categories)
        .series("client-server", bars(|row| row.baseline_ops))
        .series("pmnet", bars(|row| row.pmnet_ops));
    let mut comparisons = vec![
        Comparison::new(
            "update throughput, pmnet / client-server, average over the workloads",
            average_throughput,
            "×",
        )
        .paper(4.31)
        .target(4.31, THROUGHPUT_SHORT),
        Comparison::new(
            "p99 update latency, client-server / pmnet, average over the workloads",
            average_p99,
            "×",
        )
        .paper(3.23)
        .target(3.23, P99_SHORT),
    ];
    for row in &rows {
        comparisons.push(Comparison::new(
            format!("update throughput, pmnet / client-server, {}", row.name),
            row.throughput,
            "×",
        ));
    }
    let mut notes = vec![format!(
        "{CLIENTS} closed-loop clients per workload, one request in flight each. Client-server \
         is the same clients talking to the server directly: for the embedded engines `pmnet \
         bench`'s baseline mode (the server's reply), for Redis a `redis-server` with \
         `appendfsync always` (each write's reply after its fsync) reached over TCP. PMNet is \
         the device in front of the same server: for Redis, `pmnet redis-up` (gateway and \
         device in front of the same kind of redis-server, the PMNet module loaded into it as \
         the server side), reached by the same clients over TCP. The averages are arithmetic \
         means of the per-workload ratios."
    )];
    if let Some(report) = result_of(steps, REDIS) {
        notes.extend(redis_notes(report));
    }
    if result_of(steps, REDIS).is_none() {
        notes.push(if steps.iter().any(|step| step.label == REDIS) {
            "The Redis workloads did not complete: see the command's log.".to_owned()
        } else {
            "The Redis workloads did not run: redis-server is not installed (apt-get install \
             redis-server)."
                .to_owned()
        });
    }
    if let Some(share) = result_of(steps, REDIS).and_then(bypass_share) {
        notes.push(format!(
            "TPC-C-like: {:.1} % of requests were bypass requests through the device (the \
             paper: 13.7 %).",
            share * 100.0
        ));
    }
    Outcome {
        figure: Figure {
            panels: vec![throughput, p99, absolute],
        },
        comparisons,
        notes,
    }
}

/// What the Redis workloads' report says of PMNet's server side, and each workload's CPU per
/// operation, part by part, next to Redis alone's.
fn redis_notes(report: &Value) -> Vec<String> {
    let mut notes = Vec::new();
    let setting = report.get("setting");
    let text = |field: &str| setting?.get(field)?.as_str().map(str::to_owned);
    if let Some(side) = text("pmnet_server_side") {
        let mut note = format!("Redis: PMNet's server side measured: the {side}");
        if let Some(why) = text("pmnet_server_side_note") {
            note.push_str(&format!(" ({why})"));
        }
        note.push('.');
        notes.push(note);
    }
    let mut lines = Vec::new();
    for workload in report
        .get("workloads")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let name = workload.get("workload").and_then(Value::as_str);
        let parts = |system_name: &str| -> Vec<String> {
            system(workload, system_name)
                .and_then(|s| s.get("cpu")?.get("parts")?.as_array())
                .into_iter()
                .flatten()
                .filter(|part| part.get("part").and_then(Value::as_str) != Some("clients"))
                .filter_map(|part| {
                    Some(format!(
                        "{} {:.1}",
                        part.get("part")?.as_str()?,
                        number(part, &["us_per_op"])?
                    ))
                })
                .collect()
        };
        let (alone, pmnet) = (parts("baseline"), parts("pmnet"));
        if let (Some(name), false, false) = (name, alone.is_empty(), pmnet.is_empty()) {
            lines.push(format!(
                "{name}: Redis alone {}; PMNet {}",
                alone.join(", "),
                pmnet.join(", ")
            ));
        }
    }
    if !lines.is_empty() {
        notes.push(format!(
            "Redis: CPU µs per operation of each part (user + system, the median round): {}.",
            lines.join("; ")
        ));
    }
    notes
}

/// The TPC-C-like workload's share of bypass requests through PMNet, when reported.
fn bypass_share(report: &Value) -> Option<f64> {
    let workloads = report.get("workloads")?.as_array()?;
    let tpcc = workloads
        .iter()
        .find(|w| w.get("workload").and_then(Value::as_str) == Some("tpcc"))?;
    number(tpcc, &["bypass_share"])
        .or_else(|| system(tpcc, "pmnet").and_then(|s| number(s, &["bypass_share"])))
}

pub const WORKLOADS: Experiment = Experiment {
    name: "workloads",
    title: "Workloads: update throughput and p99 latency against client-server",
    about: "The paper's workloads figure. The embedded engines (the packet store and the \
            key-value store behind `pmnet server`, 100 % updates) and a real Redis behind PMNet \
            (the PMNet module in redis-server) with YCSB-style mixes A (50 % updates), B (5 %) \
            and F (read-modify-write), \
            a Twitter-like workload (post, follow, timeline over Redis lists, sets and hashes) \
            and a TPC-C-like New-Order/Payment mix whose districts are locked with bypass \
            requests. For each: update throughput and p99 update latency through PMNet against \
            client-server. The paper: 4.31× the throughput and 3.23× lower p99 on average.",
    plan,
    analyse,
};

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn step(label: &str, result: Value) -> StepOutput {
        StepOutput {
            label: label.to_owned(),
            command: String::new(),
            seconds: 1.0,
            status: "ok".to_owned(),
            log: String::new(),
            result: Some(result),
        }
    }

    #[test]
    fn the_averages_cover_engines_and_redis_workloads() {
        let engine = json!({"results": [
            {"mode": "baseline", "ops_per_s": 1000.0, "p99_us": 300.0},
            {"mode": "pmnet", "ops_per_s": 2000.0, "p99_us": 100.0}
        ]});
        let redis = json!({"setting": {"pmnet_server_side": "module"}, "workloads": [{
            "workload": "tpcc",
            "bypass_share": 0.15,
            "systems": [
                {"system": "baseline", "update_ops_per_s": 100.0, "updates": {"p99_us": 5000.0},
                 "cpu": {"parts": [{"part": "clients", "us_per_op": 9.0},
                                   {"part": "redis-server", "us_per_op": 20.0}]}},
                {"system": "pmnet", "update_ops_per_s": 600.0, "updates": {"p99_us": 1000.0},
                 "cpu": {"parts": [{"part": "gateway", "us_per_op": 12.5},
                                   {"part": "redis-server", "us_per_op": 15.0}]}}
            ]
        }]});
        let steps = vec![step("packet store", engine), step(REDIS, redis)];
        let outcome = analyse(&crate::eval::model::tests_settings(), &steps);
        // (2 + 6) / 2 and (3 + 5) / 2.
        assert_eq!(outcome.comparisons[0].measured, Some(4.0));
        assert_eq!(outcome.comparisons[0].met, Some(false));
        assert!(outcome.comparisons[0].why_short.is_some());
        assert_eq!(outcome.comparisons[1].measured, Some(4.0));
        assert_eq!(outcome.comparisons[1].met, Some(true));
        assert_eq!(outcome.figure.panels[0].series[0].points.len(), 2);
        assert!(outcome.notes.iter().any(|note| note.contains("15.0 %")));
        assert!(outcome
            .notes
            .iter()
            .any(|note| note.contains("server side measured: the module")));
        assert!(
            outcome.notes.iter().any(|note| note.contains(
                "tpcc: Redis alone redis-server 20.0; PMNet gateway 12.5, redis-server 15.0"
            )),
            "{:?}",
            outcome.notes
        );
    }

    #[test]
    fn a_failed_command_leaves_a_gap_not_a_panic() {
        let mut failed = step(REDIS, json!(null));
        failed.result = None;
        failed.status = "failed".to_owned();
        let outcome = analyse(&crate::eval::model::tests_settings(), &[failed]);
        assert_eq!(outcome.comparisons[0].measured, None);
        assert!(outcome
            .notes
            .iter()
            .any(|note| note.contains("did not complete")));
    }
}

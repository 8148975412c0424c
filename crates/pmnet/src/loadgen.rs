//! The load generator: a closed-loop benchmark that compares, side by side in one run and
//! under one setting, what a client waits for:
//!
//! - `echo`: a UDP echo off the device's loop (the floor for any acknowledgement);
//! - `baseline`: the server's reply, the client talking to the server directly;
//! - `forward`: the server's reply through the device with logging off (a plain switch);
//! - `pmnet`: the device's PMNet-ACK, sent once the update is durable in its log.
//!
//! It starts its own device and server on loopback (threads of this process, files under
//! /dev/shm, removed at the end; a fresh pair for every mode, so every mode starts from an
//! empty log and store) or measures running ones given by address. `pmnet demo` runs it, and
//! `pmnet-bench bench` (crates/bench) is its command; the forwarding capacity
//! (`capacity.rs`), a rack of servers (`rack.rs`), the read cache (`cache.rs`) and
//! replication (`replication.rs`, `--replicas`) are here too.
//!
//! The options and the plan they make are in `loadgen/args.rs`; the plan, the setting it
//! reports and the running of its modes in `loadgen/plan.rs`; what is read from the processes
//! measured in `loadgen/scrape.rs`. What a run measured is in `loadgen/results.rs` (types
//! only, under everything that makes them), latencies in `loadgen/latency.rs`, and the text
//! tables in `loadgen/report.rs`; the modes are in `loadgen/mode.rs`.

pub mod args;
pub mod cache;
pub mod capacity;
pub mod cpu;
pub mod figures;
pub mod latency;
pub mod mode;
pub mod plan;
pub mod popularity;
pub mod progress;
pub mod rack;
pub mod rack_client;
pub mod recovery;
pub mod replication;
pub mod report;
pub mod results;
pub mod scrape;
pub mod system;
pub mod worker;
pub mod workload;

use std::time::{Duration, Instant};

use pmnet_proto::Completion;
use pmnet_runtime::{ClientSession, SessionOptions};
use pmnet_store::{Reply, Request};

pub use args::{fresh_keys, parse_payload, parse_seconds, LoadArgs, MAX_CLIENTS};
pub use cache::{comparisons as cache_comparisons, CachePlan};
pub use capacity::{run_capacity, CapacityConfig};
pub use figures::thousands;
pub use latency::{new_histogram, record, summarize, LatencySummary};
pub use mode::Mode;
pub use plan::{resolve_pinning, run_modes, Pinning, Plan, Target};
pub use popularity::PopularityKind;
pub use report::{capacity_table, cpu_table, ratios, ratios_table, results_table, setting_text};
pub use results::{CacheComparison, CapacityReport, LoadPoint, ModeResult, Ratio, Report, Setting};
pub use system::{remove_stale_files, LoopbackConfig, LoopbackSystem};
pub use workload::{client_seed, key_name, KeyDistribution, RequestGenerator, Workload};

/// returns the value: the system works, not just its numbers. Returns lines to print.
pub fn functional_check(system: &LoopbackSystem, plan: &Plan) -> Result<Vec<String>, String> {
    let mut options = SessionOptions::new(plan.server_id, system.addresses.device);
    options.wait = plan.wait;
    let mut session = ClientSession::open(options)
        .map_err(|error| format!("cannot open a client session: {error}"))?;
    let key = "demo:greeting";
    let value = format!("hello from pmnet (seed {})", plan.seed);
    let set = Request::Set {
        key: key.as_bytes(),
        value: value.as_bytes(),
    };
    let started = Instant::now();
    let completion = session
        .update(&set.to_bytes())
        .map_err(|error| format!("SET {key} failed: {error}"))?;
    let set_us = started.elapsed().as_secs_f64() * 1e6;
    let mut lines = Vec::new();
    match completion {
        Completion::Logged { device_id } => lines.push(format!(
            "SET {key} {value:?} -> PMNet-ACK from device {device_id} after {set_us:.0} µs: \
             the update is durable in the device's log; the server applies it next"
        )),
        other => {
            return Err(format!(
                "SET {key} completed without a PMNet-ACK ({other:?}): the device did not log it"
            ))
        }
    }
    let get = Request::Get {
        key: key.as_bytes(),
    };
    let started = Instant::now();
    let completion = session
        .bypass(&get.to_bytes())
        .map_err(|error| format!("GET {key} failed: {error}"))?;
    let get_us = started.elapsed().as_secs_f64() * 1e6;
    match completion {
        Completion::Replied { reply, .. } => match Reply::decode(&reply) {
            Ok(Reply::Value(found)) if found == value.as_bytes() => lines.push(format!(
                "GET {key} -> {value:?} from server {} after {get_us:.0} µs: the server \
                 applied the SET (a read bypasses the log and is ordered after the session's \
                 earlier updates)",
                plan.server_id
            )),
            Ok(other) => {
                return Err(format!(
                    "GET {key} returned {other:?}, not the value just set: the system is broken"
                ))
            }
            Err(error) => return Err(format!("GET {key}: undecodable reply ({error:?})")),
        },
        other => return Err(format!("GET {key} completed with {other:?}, not a reply")),
    }
    Ok(lines)
}

/// The capacity settings that go with a plan: the forwarder where the device would run, the
/// generator where the server would.
pub fn capacity_config(plan: &Plan, duration: Duration, rounds: u32) -> CapacityConfig {
    let request = workload::RequestGenerator::new(&plan.workload, plan.seed, 0)
        .next_request()
        .bytes;
    CapacityConfig {
        duration,
        rounds,
        wait: plan.wait,
        // Never the forwarder and its generator on one CPU (the placement for several clients
        // puts the device with the server).
        forwarder_cpu: if plan.device_cpu.is_some() && plan.device_cpu == plan.server_cpu {
            plan.client_cpu
        } else {
            plan.device_cpu
        },
        generator_cpu: plan.server_cpu,
        payload: request,
        server_id: plan.server_id,
        keys: Some(plan.auth_keys.clone()),
    }
}

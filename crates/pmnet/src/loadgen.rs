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
//! measured in `loadgen/scrape.rs`.

pub mod args;
pub mod cache;
pub mod capacity;
pub mod cpu;
pub mod plan;
pub mod popularity;
pub mod progress;
pub mod rack;
pub mod rack_client;
pub mod recovery;
pub mod replication;
pub mod report;
pub mod scrape;
pub mod system;
pub mod worker;
pub mod workload;

use std::time::{Duration, Instant};

use clap::ValueEnum;
use pmnet_proto::Completion;
use pmnet_runtime::{ClientSession, SessionOptions};
use pmnet_store::{Reply, Request};

pub use args::{fresh_keys, parse_payload, parse_seconds, LoadArgs, Pinning, MAX_CLIENTS};
pub use cache::{comparisons as cache_comparisons, CacheComparison, CachePlan};
pub use capacity::{run_capacity, CapacityConfig};
pub use cpu::cpu_table;
pub use plan::{resolve_pinning, run_modes, Plan, Target};
pub use popularity::PopularityKind;
pub use report::{
    capacity_table, new_histogram, ratios, ratios_table, record, results_table, setting_text,
    summarize, thousands, CapacityReport, LatencySummary, LoadPoint, ModeResult, Ratio, Report,
    Setting,
};
pub use system::{remove_stale_files, LoopbackConfig, LoopbackSystem};
pub use workload::{client_seed, key_name, KeyDistribution, RequestGenerator, Workload};

/// A benchmark mode: what the client's requests go to and what they wait for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// UDP echo off the device's loop: the floor for any ack.
    Echo,
    /// Straight to the server: the client waits for the server's reply.
    Baseline,
    /// Through the device's forward port (logging off): a plain switch.
    Forward,
    /// Through the device's PMNet port: updates complete on the PMNet-ACK.
    Pmnet,
    /// `baseline` with every datagram authenticated (the `--key-file` keys, or a fresh key).
    BaselineAuth,
    /// `forward` with every datagram authenticated.
    ForwardAuth,
    /// `pmnet` with every datagram authenticated.
    PmnetAuth,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Echo => "echo",
            Mode::Baseline => "baseline",
            Mode::Forward => "forward",
            Mode::Pmnet => "pmnet",
            Mode::BaselineAuth => "baseline-auth",
            Mode::ForwardAuth => "forward-auth",
            Mode::PmnetAuth => "pmnet-auth",
        }
    }

    /// The mode without authentication: where its requests go and what they wait for.
    pub fn path(self) -> Mode {
        match self {
            Mode::BaselineAuth => Mode::Baseline,
            Mode::ForwardAuth => Mode::Forward,
            Mode::PmnetAuth => Mode::Pmnet,
            plain => plain,
        }
    }

    /// Whether the mode authenticates every datagram whatever `--key-file` says.
    pub fn is_authenticated(self) -> bool {
        self.path() != self
    }

    pub fn waits_for(self) -> &'static str {
        match self {
            Mode::Echo => "a UDP echo from the device (the floor)",
            Mode::Baseline => "the server's reply, sent directly",
            Mode::Forward => "the server's reply via the device, no log",
            Mode::Pmnet => "the device's PMNet-ACK (after its log write)",
            Mode::BaselineAuth => "as baseline, every datagram authenticated",
            Mode::ForwardAuth => "as forward, every datagram authenticated",
            Mode::PmnetAuth => "as pmnet, every datagram authenticated",
        }
    }
}

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

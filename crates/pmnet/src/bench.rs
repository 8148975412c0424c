//! `pmnet bench`: a closed-loop load generator that compares, side by side in one run and
//! under one setting, what a client waits for:
//!
//! - `echo`: a UDP echo off the device's loop (the floor for any acknowledgement);
//! - `baseline`: the server's reply, the client talking to the server directly;
//! - `forward`: the server's reply through the device with logging off (a plain switch);
//! - `pmnet`: the device's PMNet-ACK, sent once the update is durable in its log.
//!
//! It starts its own device and server on loopback (threads of this process, files under
//! /dev/shm, removed at the end; a fresh pair for every mode, so every mode starts from an
//! empty log and store) or measures running ones given by address. `--capacity` compares
//! the forwarding capacity of the device's forward port with a plain UDP relay instead.
//! `--auth-cost` measures what authentication costs: the ack's latency and the forwarding
//! capacity with and without keys, and the MAC per datagram (`bench/auth_cost.rs`).
//! `--replicas` compares ways of replicating updates (`bench/replication.rs`); `--abd`
//! replicated memory against unreplicated access and etcd (`bench/abd.rs`).
//!
//! The options and the plan they make are in `bench/args.rs`; the plan, the setting it
//! reports and the running of its modes in `bench/plan.rs`; what is read from the processes
//! measured in `bench/scrape.rs`.

mod abd;
mod args;
mod auth_cost;
mod cache;
mod capacity;
mod cpu;
mod inpath;
mod interleaved;
mod mac;
mod plan;
mod popularity;
mod progress;
mod rack;
mod rack_client;
mod recovery;
mod replication;
mod report;
mod scrape;
mod system;
mod worker;
mod workload;

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::ValueEnum;
use pmnet_proto::Completion;
use pmnet_runtime::{ClientSession, SessionOptions, Shutdown};
use pmnet_store::{Reply, Request};

pub use args::{fresh_keys, parse_payload, parse_seconds, BenchArgs, Pinning};
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

use scrape::external_media;

use crate::CliError;

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

pub fn run(args: BenchArgs) -> Result<ExitCode, CliError> {
    if args.inpath.in_path {
        // The device in the path, on a testbed of its own (see `bench/inpath.rs`).
        return inpath::run_command(&args);
    }
    if args.abd.abd {
        // Replicated memory: its own processes, clients and report (see `bench/abd.rs`).
        return abd::run_command(&args);
    }
    if let Some(sizes) = &args.auth_cost {
        let shutdown = Shutdown::on_signals()?;
        return auth_cost::run_command(&args, sizes, &shutdown);
    }
    let plan = Plan::from_args(&args)?;
    let shutdown = Shutdown::on_signals()?;
    if args.capacity {
        return run_capacity_command(&args, &plan, &shutdown);
    }
    if !args.replication.replicas.is_empty() {
        return run_replication_command(&args, &plan, &shutdown);
    }
    println!(
        "pmnet bench: modes {} (seed {})",
        plan.modes
            .iter()
            .map(|mode| mode.name())
            .collect::<Vec<_>>()
            .join(", "),
        plan.seed
    );
    if let Some(rack) = &plan.rack {
        println!(
            "  rack: a device in front of {}; keys partitioned by CRC32C; {} keys, {}{}, {:.0}% \
             updates",
            rack.text(),
            thousands(plan.workload.keys as f64),
            plan.workload.distribution.name(),
            match plan.workload.distribution {
                KeyDistribution::Zipf => format!(" (s = {})", plan.workload.zipf_exponent),
                KeyDistribution::Uniform => String::new(),
            },
            plan.workload.update_ratio * 100.0
        );
        if let Some(settings) = &plan.cache.settings {
            println!(
                "  read cache in the device: {}; {}",
                plan.cache
                    .variants
                    .iter()
                    .map(|on| if *on { "on" } else { "off" })
                    .collect::<Vec<_>>()
                    .join(", then "),
                settings.text()
            );
        }
    }
    let (results, mut media, interrupted) = run_modes(&plan, &shutdown)?;
    if let Target::External(targets) = &plan.target {
        media = Some(external_media(targets)?);
    }
    let setting = plan.setting(media);
    let ratios = ratios(&results);
    let cache_comparisons = cache::comparisons(&results);
    println!();
    print!("{}", results_table(&results));
    let cpu = cpu::cpu_table(&results);
    if !cpu.is_empty() {
        println!();
        print!("{cpu}");
    }
    if !ratios.is_empty() {
        println!();
        print!("{}", ratios_table(&ratios));
    }
    for result in &results {
        for note in &result.notes {
            println!("  {}: {note}", result.mode);
        }
        let busiest = result.busiest_server.zip(result.busiest_server_share);
        let load = rack::load_text(result.servers, plan.server_id, busiest);
        if !load.is_empty() {
            println!("  {}: {load}", result.mode);
        }
        if plan.rack.is_some() {
            println!("  {}: {}", result.mode, cache::reads_text(result));
        }
        if let Some(cache) = &result.cache {
            println!("  {}: {}", result.mode, cache.text());
        }
        for line in recovery::recoveries_text(&result.recoveries).lines() {
            println!("  {}: {line}", result.mode);
        }
    }
    if !cache_comparisons.is_empty() {
        println!();
        print!("{}", cache::comparisons_text(&cache_comparisons));
    }
    println!();
    println!("setting:");
    print!("{}", setting_text(&setting));
    if interrupted {
        println!("interrupted: the modes not shown did not run");
    }
    let report = Report {
        setting,
        results,
        ratios,
        capacity: None,
        functional_check: None,
        under_load: Vec::new(),
        cache_comparisons,
        replication_ratios: Vec::new(),
        interrupted,
    };
    if let Some(path) = &args.json {
        report.write_json(path)?;
        println!("JSON written to {}", path.display());
    }
    Ok(if interrupted {
        ExitCode::from(130)
    } else {
        ExitCode::SUCCESS
    })
}

/// `pmnet bench --replicas`: replication in the network against client- and server-side
/// replication (see `bench/replication.rs`).
fn run_replication_command(
    args: &BenchArgs,
    plan: &Plan,
    shutdown: &Shutdown,
) -> Result<ExitCode, CliError> {
    let factors = &args.replication.replicas;
    println!(
        "pmnet bench --replicas {}: rep-client, rep-server and rep-pmnet at each R, {} client(s), \
         one {} B update in flight each (seed {})",
        factors
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(","),
        plan.clients,
        plan.workload.value_len,
        plan.seed
    );
    let run = replication::run(plan, factors, shutdown)?;
    let setting = plan.setting(Some(run.media.clone()));
    println!();
    print!("{}", replication::results_text(&run.results));
    if !run.ratios.is_empty() {
        println!();
        print!("{}", replication::ratios_text(&run.ratios));
    }
    println!();
    println!("setting:");
    print!("{}", setting_text(&setting));
    if run.interrupted {
        println!("interrupted: the modes not shown did not run");
    }
    let report = Report {
        setting,
        results: run.results,
        ratios: Vec::new(),
        capacity: None,
        functional_check: None,
        under_load: Vec::new(),
        cache_comparisons: Vec::new(),
        replication_ratios: run.ratios,
        interrupted: run.interrupted,
    };
    if let Some(path) = &args.json {
        report.write_json(path)?;
        println!("JSON written to {}", path.display());
    }
    Ok(if run.interrupted {
        ExitCode::from(130)
    } else {
        ExitCode::SUCCESS
    })
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

fn cpu_text(cpu: Option<usize>) -> String {
    cpu.map_or_else(|| "any CPU".to_owned(), |cpu| format!("CPU {cpu}"))
}

fn run_capacity_command(
    args: &BenchArgs,
    plan: &Plan,
    shutdown: &Shutdown,
) -> Result<ExitCode, CliError> {
    let duration = plan.duration.unwrap_or(Duration::from_secs(5));
    let rounds = args.rounds.unwrap_or(3);
    let per_round = duration / rounds;
    let config = capacity_config(plan, per_round, rounds);
    println!(
        "pmnet bench --capacity: {:.1} s per forwarder in {rounds} rounds; forwarder on {}, \
         generator on {}; {}",
        duration.as_secs_f64(),
        cpu_text(config.forwarder_cpu),
        cpu_text(config.generator_cpu),
        plan.wait.name()
    );
    let report = run_capacity(&config, shutdown)?;
    println!();
    print!("{}", capacity_table(&report));
    let mut setting = plan.setting(Some((
        "none: forwarding only, nothing is logged".to_owned(),
        "none: no server; the forwarders send to a sink socket".to_owned(),
    )));
    setting.placement = format!(
        "forwarder on {}, generator on {}",
        cpu_text(config.forwarder_cpu),
        cpu_text(config.generator_cpu)
    );
    setting.server_app = "none".to_owned();
    println!();
    println!("setting:");
    println!(
        "  wait: {}; placement: {}; {}-byte update datagrams over 64 sessions; {} CPUs online; \
         load average at start: {}",
        setting.wait,
        setting.placement,
        setting.request_datagram_bytes,
        setting.cpus_online,
        setting.load_average
    );
    let interrupted = shutdown.is_requested();
    if let Some(path) = &args.json {
        let full = Report {
            setting,
            results: Vec::new(),
            ratios: Vec::new(),
            capacity: Some(report),
            functional_check: None,
            under_load: Vec::new(),
            cache_comparisons: Vec::new(),
            replication_ratios: Vec::new(),
            interrupted,
        };
        full.write_json(path)?;
        println!("JSON written to {}", path.display());
    }
    Ok(if interrupted {
        ExitCode::from(130)
    } else {
        ExitCode::SUCCESS
    })
}

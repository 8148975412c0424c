//! `pmnet demo`: the whole system on loopback, side by side with its baselines, in one run of
//! well under a minute.
//!
//! A device (with its persistent log) and a server (with the packet store) run as threads
//! of this process, their files under /dev/shm (emulated persistent memory), removed at the
//! end and on Ctrl-C. The demo first shows that the system works (a SET acknowledged by the
//! device, then a GET answered by the server that returns it), then runs the benchmark's four
//! modes and pmnet again with every datagram authenticated under one setting, and the
//! forwarding-capacity comparison (the forward port authenticated too), and explains the
//! result.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Args;
use pmnet_pktstore::EngineKind;
use pmnet_pm::MmapOptions;
use pmnet_runtime::{Shutdown, WaitMode};

use crate::loadgen::{
    self, capacity_table, ratios, ratios_table, results_table, setting_text, thousands,
    CapacityReport, LoadPoint, LoopbackConfig, LoopbackSystem, Mode, ModeResult, Pinning, Plan,
    Ratio, Report, Target,
};
use crate::CliError;

#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    /// Seconds measured per mode.
    #[arg(long, value_name = "SECONDS", default_value_t = 3.0,
          value_parser = |text: &str| loadgen::parse_seconds(text, 0.5, 7.0))]
    pub duration: f64,

    /// Seconds of warm-up per mode.
    #[arg(long, value_name = "SECONDS", default_value_t = 0.5,
          value_parser = |text: &str| loadgen::parse_seconds(text, 0.0, 2.0))]
    pub warmup: f64,

    /// Every loop and client spins (yielding between empty polls) instead of sleeping in ppoll.
    /// The default sleeps: see docs/benchmarks.md for both settings and why.
    #[arg(long)]
    pub busy_poll: bool,

    /// Thread placement: auto puts the client and the device on CPU 0 and the server on CPU 1.
    #[arg(long, value_enum, default_value_t = Pinning::Auto)]
    pub pin: Pinning,

    /// Bytes of each SET's value (the paper's latency figures are at 100 B).
    #[arg(long, value_name = "BYTES", default_value_t = 100, value_parser = loadgen::parse_payload)]
    pub payload: usize,

    /// Client sessions, one thread each, one request at a time.
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=16))]
    pub clients: u32,

    /// Seed of the key stream (printed; default: random).
    #[arg(long, value_name = "N")]
    pub seed: Option<u64>,

    /// Skip the forwarding-capacity comparison (relay against the device's forward port).
    #[arg(long)]
    pub no_capacity: bool,

    /// Skip the short comparison under load (baseline and pmnet with 4 and 16 clients).
    #[arg(long)]
    pub no_load: bool,

    /// Skip the read cache's line (8 capacity-limited servers behind the device, Zipf 0.99
    /// reads, the cache off and on).
    #[arg(long)]
    pub no_cache: bool,

    /// Directory of the log and store files (removed at the end).
    #[arg(long, value_name = "DIR", default_value = "/dev/shm")]
    pub dir: PathBuf,

    /// Also write the results, with the setting, as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

/// Seconds each forwarder of the capacity comparison runs, in all.
const CAPACITY_SECONDS: f64 = 3.0;

/// Rounds those seconds are split into, relay and device in turns.
const CAPACITY_ROUNDS: u32 = 3;

fn plan(args: &DemoArgs) -> Result<Plan, String> {
    if !args.dir.is_dir() {
        return Err(format!(
            "--dir {}: not a directory; the log and store files go there (/dev/shm is \
             emulated persistent memory)",
            args.dir.display()
        ));
    }
    let wait = WaitMode::from_busy_poll(args.busy_poll);
    let (client_cpu, device_cpu, server_cpu) =
        loadgen::resolve_pinning(args.pin, None, None, None, true, args.clients)?;
    Ok(Plan {
        // pmnet-auth: the pmnet mode with every datagram authenticated (a fresh key, in
        // memory; what `--key-file` does; docs/security.md).
        modes: vec![
            Mode::Echo,
            Mode::Baseline,
            Mode::Forward,
            Mode::Pmnet,
            Mode::PmnetAuth,
        ],
        workload: loadgen::Workload {
            keys: 10_000,
            distribution: loadgen::KeyDistribution::Uniform,
            zipf_exponent: 0.99,
            update_ratio: 1.0,
            value_len: args.payload,
            servers: 1,
            popularity: loadgen::PopularityKind::Static,
            change_every: Duration::from_secs(10),
            change_count: 1,
        },
        rack: None,
        cache: loadgen::CachePlan::off(),
        clients: args.clients,
        window: 1,
        duration: Some(Duration::from_secs_f64(args.duration)),
        requests: None,
        warmup: Duration::from_secs_f64(args.warmup),
        seed: args.seed.unwrap_or_else(rand::random),
        rounds: 1,
        wait,
        client_cpu,
        device_cpu,
        server_cpu,
        server_id: 1,
        target: Target::Loopback(LoopbackConfig {
            server_id: 1,
            device_id: 1,
            ideal: false,
            engine: Some(EngineKind::Packet),
            mmap: MmapOptions::default(),
            dir: args.dir.clone(),
            slots: 32_768,
            slot_size: 2048,
            data_bytes: 64 << 20,
            max_sessions: 1024,
            wait,
            device_cpu,
            server_cpu,
            keys: None,
            batch: true,
            batch_hold: Duration::from_micros(crate::node::DEFAULT_BATCH_HOLD_US),
            device_workers: 1,
            servers: 1,
            server_max_ops_per_s: None,
            resend_timeout: None,
            cache: None,
        }),
        progress: true,
        auth_keys: loadgen::fresh_keys()?,
        keys: None,
    })
}

pub fn run(args: DemoArgs) -> Result<ExitCode, CliError> {
    let plan = plan(&args)?;
    let shutdown = Shutdown::on_signals()?;
    let Target::Loopback(config) = &plan.target else {
        return Err("the demo runs on loopback only".into());
    };
    let removed = loadgen::remove_stale_files(&config.dir);
    let began = Instant::now();
    print_introduction(config, removed);
    let (check, media) = does_it_work(config, &plan)?;
    let (results, ratios, interrupted) = latency(&plan, &args, &shutdown)?;
    let under_load = if args.no_load || shutdown.is_requested() {
        Vec::new()
    } else {
        under_load(&plan, &args, &shutdown)?
    };
    let cache_comparisons = if args.no_cache || shutdown.is_requested() {
        Vec::new()
    } else {
        read_cache(&plan, &shutdown)?
    };
    let capacity = if args.no_capacity || shutdown.is_requested() {
        None
    } else {
        Some(capacity(&plan, &shutdown)?)
    };
    let setting = plan.setting(Some(media));
    print_setting_and_explanation(&results, &setting);
    let interrupted = interrupted || shutdown.is_requested();
    if interrupted {
        println!();
        println!("interrupted: the modes not shown did not run");
    }
    let report = Report {
        setting,
        results,
        ratios,
        capacity,
        functional_check: Some(check),
        under_load,
        cache_comparisons,
        replication_ratios: Vec::new(),
        interrupted,
    };
    if let Some(path) = &args.json {
        report.write_json(path)?;
        println!();
        println!("JSON written to {}", path.display());
    }
    println!();
    println!(
        "(demo took {:.1} s; `pmnet bench --help` runs any of this with other settings)",
        began.elapsed().as_secs_f64()
    );
    Ok(if interrupted {
        ExitCode::from(130)
    } else {
        ExitCode::SUCCESS
    })
}

/// What runs where, and the files an earlier killed run left that were removed.
fn print_introduction(config: &LoopbackConfig, removed: usize) {
    println!("pmnet demo: PMNet in-network persistence, in software, on loopback");
    println!(
        "  a device (persistent log) and a server (packet store) run as threads of this \
         process; their files go under {} and are removed at exit",
        config.dir.display()
    );
    if removed > 0 {
        println!("  (removed {removed} files left behind by an earlier run that was killed)");
    }
    println!();
}

/// Part 1: the functional check on a system of its own. Returns its lines and the media of
/// the device and server.
fn does_it_work(
    config: &LoopbackConfig,
    plan: &Plan,
) -> Result<(Vec<String>, (String, String)), CliError> {
    println!("1. Does it work? One client session through the device:");
    let system = LoopbackSystem::start(config)?;
    let check = loadgen::functional_check(&system, plan);
    let media = (system.device_medium.clone(), system.server_medium.clone());
    drop(system.stop());
    let check = check.map_err(|error| format!("the functional check failed: {error}"))?;
    for line in &check {
        println!("   {line}");
    }
    println!();
    Ok((check, media))
}

/// Part 2: the modes side by side. Returns their results, the ratios, and whether a
/// signal cut the run short.
fn latency(
    plan: &Plan,
    args: &DemoArgs,
    shutdown: &Shutdown,
) -> Result<(Vec<ModeResult>, Vec<Ratio>, bool), CliError> {
    println!(
        "2. Latency, side by side: {} client{} sending {}-byte SETs one at a time; every mode \
         gets a fresh device and server, {:.1} s of warm-up and {:.1} s measured:",
        plan.clients,
        if plan.clients == 1 { "" } else { "s" },
        plan.workload.value_len,
        plan.warmup.as_secs_f64(),
        args.duration
    );
    let (results, _, interrupted) = loadgen::run_modes(plan, shutdown)?;
    let ratios = ratios(&results);
    print!("{}", results_table(&results));
    let cpu = loadgen::cpu_table(&results);
    if !cpu.is_empty() {
        println!();
        print!("{cpu}");
    }
    println!();
    print!("{}", ratios_table(&ratios));
    for result in &results {
        for note in &result.notes {
            println!("   {}: {note}", result.mode);
        }
    }
    println!();
    Ok((results, ratios, interrupted))
}

/// Client counts of the comparison under load, and its seconds per mode (after a warm-up).
const LOAD_CLIENTS: [u32; 2] = [4, 16];
const LOAD_SECONDS: f64 = 1.0;
const LOAD_WARMUP_SECONDS: f64 = 0.3;

/// The rack the read cache's line runs: servers, their (emulated) capacity, keys.
const CACHE_RACK: (u16, u32, u64) = (8, 1_000, 100_000);

/// Part 2c: the read cache, off and on, in front of a rack of capacity-limited servers (the
/// same run as `pmnet bench --mode pmnet --cache on,off --servers 8 ...`): one line.
fn read_cache(plan: &Plan, shutdown: &Shutdown) -> Result<Vec<loadgen::CacheComparison>, CliError> {
    #[derive(clap::Parser)]
    struct Bench {
        #[command(flatten)]
        args: loadgen::LoadArgs,
    }
    let (servers, capacity, keys) = CACHE_RACK;
    let words = [
        "bench".to_owned(),
        "--mode".into(),
        "pmnet".into(),
        "--cache".into(),
        "on,off".into(),
        "--servers".into(),
        servers.to_string(),
        "--server-max-ops-per-s".into(),
        capacity.to_string(),
        "--dist".into(),
        "zipf:0.99".into(),
        "--update-ratio".into(),
        "0".into(),
        "--keys".into(),
        keys.to_string(),
        "--warmup".into(),
        "3".into(),
        "--duration".into(),
        "2".into(),
        "--seed".into(),
        plan.seed.to_string(),
    ];
    let parsed = <Bench as clap::Parser>::try_parse_from(words)
        .map_err(|error| format!("the read cache's run: {error}"))?;
    let mut rack = Plan::from_args(&parsed.args)?;
    rack.progress = false;
    println!(
        "   Read cache: {servers} servers of {capacity} requests/s each (emulated capacity) \
         behind the device, {keys} keys, Zipf 0.99 reads, the cache off and on (3 s warm-up, \
         2 s measured each):"
    );
    let (results, _, _) = loadgen::run_modes(&rack, shutdown)?;
    let comparisons = loadgen::cache_comparisons(&results);
    let off = results.iter().find(|result| result.cache.is_none());
    let on = results.iter().find(|result| result.cache.is_some());
    match (comparisons.first(), off, on) {
        (Some(comparison), Some(off), Some(on)) => println!(
            "   cache off {}/s, on {}/s: {:.2}× with {:.0} % of reads served by the device \
             (ideal {}); a cached read's p50 {} of a server's",
            thousands(off.ops_per_s),
            thousands(on.ops_per_s),
            comparison.gain,
            comparison.hit_ratio * 100.0,
            comparison
                .ideal_gain
                .map_or("-".to_owned(), |ideal| format!("{ideal:.2}×")),
            comparison
                .read_p50_hit_vs_off
                .map_or("-".to_owned(), |ratio| format!("{ratio:.2}×")),
        ),
        _ => println!("   (the read cache's run did not finish)"),
    }
    println!();
    Ok(comparisons)
}

/// Part 2b: baseline and pmnet with several clients each, with the CPU each part spends per
/// update.
fn under_load(
    plan: &Plan,
    args: &DemoArgs,
    shutdown: &Shutdown,
) -> Result<Vec<LoadPoint>, CliError> {
    println!(
        "   Under load: baseline and pmnet with {} clients, {LOAD_SECONDS:.0} s each (the device \
         moves to the server's CPU: the clients' own CPU would cap it; docs/benchmarks.md):",
        LOAD_CLIENTS
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(" and ")
    );
    println!(
        "   {:>7} {:>12} {:>12} {:>10} {:>9} {:>9}   CPU µs/update: clients, device, server",
        "clients", "baseline/s", "pmnet/s", "pmnet/base", "p50", "p99"
    );
    let mut points = Vec::new();
    for clients in LOAD_CLIENTS {
        if shutdown.is_requested() {
            break;
        }
        let mut load = plan.clone();
        load.clients = clients;
        load.modes = vec![Mode::Baseline, Mode::Pmnet];
        load.duration = Some(Duration::from_secs_f64(LOAD_SECONDS));
        load.warmup = Duration::from_secs_f64(LOAD_WARMUP_SECONDS);
        load.progress = false;
        let (client_cpu, device_cpu, server_cpu) =
            loadgen::resolve_pinning(args.pin, None, None, None, true, clients)?;
        (load.client_cpu, load.device_cpu, load.server_cpu) = (client_cpu, device_cpu, server_cpu);
        if let Target::Loopback(config) = &mut load.target {
            config.device_cpu = device_cpu;
            config.server_cpu = server_cpu;
        }
        let (results, _, _) = loadgen::run_modes(&load, shutdown)?;
        let (Some(baseline), Some(pmnet)) = (
            results.iter().find(|result| result.mode == "baseline"),
            results.iter().find(|result| result.mode == "pmnet"),
        ) else {
            continue;
        };
        let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) if b > 0.0 => format!("{:.2}×", a / b),
            _ => "-".into(),
        };
        let cpu = |value: Option<f64>| value.map_or("-".into(), |v| format!("{v:.1}"));
        let pmnet_cpu = pmnet.cpu;
        let baseline_server = baseline.cpu.and_then(|cpu| cpu.server_us);
        println!(
            "   {:>7} {:>12} {:>12} {:>10} {:>9} {:>9}   pmnet {}, {}, {}; baseline {}, -, {}",
            clients,
            thousands(baseline.ops_per_s),
            thousands(pmnet.ops_per_s),
            ratio(Some(pmnet.ops_per_s), Some(baseline.ops_per_s)),
            ratio(pmnet.p50_us, baseline.p50_us),
            ratio(pmnet.p99_us, baseline.p99_us),
            cpu(pmnet_cpu.and_then(|cpu| cpu.client_us)),
            cpu(pmnet_cpu.and_then(|cpu| cpu.device_us)),
            cpu(pmnet_cpu.and_then(|cpu| cpu.server_us)),
            cpu(baseline.cpu.and_then(|cpu| cpu.client_us)),
            cpu(baseline_server),
        );
        points.push(LoadPoint {
            clients,
            placement: load.placement(),
            baseline: baseline.clone(),
            pmnet: pmnet.clone(),
        });
    }
    println!();
    Ok(points)
}

/// Part 3: the forwarding capacity of a plain relay and of the device.
fn capacity(plan: &Plan, shutdown: &Shutdown) -> Result<CapacityReport, CliError> {
    println!(
        "3. Forwarding capacity: one thread forwarding {}-byte datagrams as fast as it can \
         ({CAPACITY_SECONDS:.0} s each, in {CAPACITY_ROUNDS} rounds):",
        pmnet_wire::HEADER_LEN + plan.workload.set_request_len()
    );
    let config = loadgen::capacity_config(
        plan,
        Duration::from_secs_f64(CAPACITY_SECONDS / f64::from(CAPACITY_ROUNDS)),
        CAPACITY_ROUNDS,
    );
    let report = loadgen::run_capacity(&config, shutdown)?;
    print!("{}", capacity_table(&report));
    println!();
    Ok(report)
}

/// The setting, and what the figures mean.
fn print_setting_and_explanation(results: &[ModeResult], setting: &loadgen::Setting) {
    println!("Setting:");
    print!("{}", setting_text(setting));
    println!();
    println!("What you just saw:");
    for line in wrap(&explanation(results, setting), 96) {
        println!("  {line}");
    }
}

fn p50(results: &[ModeResult], mode: &str) -> Option<f64> {
    results
        .iter()
        .find(|result| result.mode == mode)
        .and_then(|result| result.p50_us)
}

/// One paragraph on what the figures mean, from the figures.
pub fn explanation(results: &[ModeResult], setting: &loadgen::Setting) -> String {
    let (Some(echo), Some(baseline), Some(forward), Some(pmnet)) = (
        p50(results, "echo"),
        p50(results, "baseline"),
        p50(results, "forward"),
        p50(results, "pmnet"),
    ) else {
        return "Not every mode ran, so there is nothing to compare.".to_owned();
    };
    let waits = if setting.busy_poll {
        if pmnet < baseline {
            "Every thread spun (busy-poll), so no wake-ups were involved: a hop costs about the \
             same to the device as to the server, and PMNet can only save what the server does \
             beyond the device, chiefly its store write and request handling."
                .to_owned()
        } else {
            "Every thread spun (busy-poll), so no wake-ups were involved: a hop costs about the \
             same to the device as to the server, and PMNet can only save what the server does \
             beyond the device, chiefly its store write and request handling. Here that was \
             less than the device's extra work per update (the forward to the server and the \
             server's ACK coming back), done on a vCPU it shares: PMNet was slower than the \
             baseline in this setting."
                .to_owned()
        }
    } else if pmnet < baseline {
        format!(
            "Every thread slept between datagrams (blocking). The server's round trip, its \
             wake-up included, cost {extra:.1} µs more than the echo off the device: PMNet \
             takes that, together with the store write, off the client's critical path.",
            extra = baseline - echo
        )
    } else {
        format!(
            "Every thread slept between datagrams (blocking). Waking the server was cheap on \
             this machine: the baseline cost only {extra:.1} µs more than the echo off the \
             device, no more than what the device adds per update (its log write, the forward \
             to the server and the server's ACK coming back), so PMNet was no \
             faster than the baseline here. PMNet pays off where the server's path is long: a \
             slow store, a busy or distant server, a costly wake-up.",
            extra = baseline - echo
        )
    };
    format!(
        "Every mode sent the same {payload}-byte SETs. In baseline the client waited for the \
         server to store each one (the received datagram kept as the record, persisted on \
         {medium}) and reply: {baseline:.1} µs at the median. In pmnet the device \
         acknowledged each update as soon as it was durable in its own log, {pmnet:.1} µs \
         ({vs_base:.2}× baseline); the server still applied every update, but after the client \
         had moved on. forward is the same path through the device with logging off, \
         {forward:.1} µs: what a plain switch on the path costs. echo is the floor for any \
         acknowledgement, a datagram bounced off the device's loop, {echo:.1} µs; PMNet's ack \
         costs {vs_echo:.2}× that, the difference being the log write, the forward to the \
         server and the server's ACK, which the device handles too (and stops there: the \
         client has its ack). Placement: {placement}. {waits} \
         These are software processes on loopback, so compare the ratios, not the absolute \
         figures, with the paper's FPGA device (21.5 µs for a 100 B update against 48 µs with \
         server-side logging, 2.2×); docs/benchmarks.md has both settings and the analysis.",
        payload = setting.payload_bytes,
        medium = setting.server_medium.split(';').next().unwrap_or("").trim(),
        vs_base = pmnet / baseline,
        vs_echo = pmnet / echo,
        placement = setting.placement,
    )
}

/// Break `text` into lines of at most `width` characters at spaces.
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        if !line.is_empty() && line.chars().count() + 1 + word.chars().count() > width {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        lines.push(line);
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrapping_keeps_words_and_width() {
        let text = "one two three four five six seven eight nine ten";
        let lines = wrap(text, 10);
        assert!(lines.iter().all(|line| line.chars().count() <= 10));
        assert_eq!(lines.join(" "), text);
        assert!(wrap("", 10).is_empty());
    }

    #[test]
    fn the_demo_plan_fits_in_a_minute() {
        use clap::Parser;
        #[derive(Debug, Parser)]
        struct Cli {
            #[command(flatten)]
            demo: DemoArgs,
        }
        let args = Cli::try_parse_from(["demo"]).unwrap().demo;
        let demo = plan(&args).unwrap();
        let per_mode = demo.warmup + demo.duration.unwrap();
        let total = per_mode * demo.modes.len() as u32
            + Duration::from_secs_f64(3.0 * CAPACITY_SECONDS)
            + Duration::from_secs_f64(
                (LOAD_SECONDS + LOAD_WARMUP_SECONDS) * 2.0 * LOAD_CLIENTS.len() as f64,
            );
        assert!(total < Duration::from_secs(40), "{total:?}");
        // The longest the options allow still fits.
        let args = Cli::try_parse_from(["demo", "--duration", "7", "--warmup", "2"])
            .unwrap()
            .demo;
        let demo = plan(&args).unwrap();
        let per_mode = demo.warmup + demo.duration.unwrap();
        let total = per_mode * demo.modes.len() as u32
            + Duration::from_secs_f64(3.0 * CAPACITY_SECONDS)
            + Duration::from_secs_f64(
                (LOAD_SECONDS + LOAD_WARMUP_SECONDS) * 2.0 * LOAD_CLIENTS.len() as f64,
            );
        assert!(total < Duration::from_secs(60), "{total:?}");
        assert!(Cli::try_parse_from(["demo", "--duration", "60"]).is_err());
        assert!(Cli::try_parse_from(["demo", "--clients", "0"]).is_err());
    }

    #[test]
    fn the_explanation_uses_the_figures() {
        let mut results = Vec::new();
        for (mode, p50) in [
            ("echo", 10.0),
            ("baseline", 40.0),
            ("forward", 50.0),
            ("pmnet", 12.0),
        ] {
            let mut result = ModeResult::from_summary(mode, "", None);
            result.p50_us = Some(p50);
            results.push(result);
        }
        let args = DemoArgs {
            duration: 3.0,
            warmup: 0.5,
            busy_poll: false,
            pin: Pinning::None,
            payload: 100,
            clients: 1,
            seed: Some(1),
            no_capacity: true,
            no_load: true,
            no_cache: true,
            dir: PathBuf::from("/tmp"),
            json: None,
        };
        let setting = plan(&args).unwrap().setting(None);
        let text = explanation(&results, &setting);
        assert!(text.contains("40.0 µs"), "{text}");
        assert!(text.contains("0.30× baseline"), "{text}");
        assert!(text.contains("1.20×"), "{text}");
        assert!(explanation(&results[..2], &setting).contains("Not every mode"));
    }
}

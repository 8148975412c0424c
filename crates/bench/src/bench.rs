//! `pmnet-bench bench` (also `pmnet bench`): the load generator's modes side by side
//! (`pmnet::loadgen`: echo, baseline, forward, pmnet; a rack, the read cache, `--capacity`,
//! `--replicas`), or the parts with processes and costs of their own:
//! `--auth-cost` measures what authentication costs: the ack's latency and the forwarding
//! capacity with and without keys, and the MAC per datagram (`bench/auth_cost.rs`);
//! `--abd` replicated memory against unreplicated access and etcd (`bench/abd.rs`);
//! `--in-path` the device in the path on a testbed of its own (`bench/inpath.rs`);
//! `--device-failover` automatic failover of devices in series, every process as a user
//! starts it (`bench/device_failover.rs`).
//!
//! The options are in `bench/args.rs`: the load generator's, and those of `--abd`,
//! `--in-path` and `--device-failover`.

mod abd;
pub mod args;
mod auth_cost;
mod device_failover;
mod inpath;
mod interleaved;
mod mac;

use std::process::ExitCode;
use std::time::Duration;

use pmnet::loadgen::scrape::external_media;
use pmnet::loadgen::{
    cache, capacity_config, capacity_table, cpu_table, rack, ratios, ratios_table, recovery,
    replication, results_table, run_capacity, run_modes, setting_text, thousands, KeyDistribution,
    Plan, Report, Target,
};
use pmnet::CliError;
use pmnet_runtime::Shutdown;

pub use args::BenchArgs;

/// `pmnet-bench bench`: the modes side by side, or the part its options choose.
pub fn run(args: BenchArgs) -> Result<ExitCode, CliError> {
    if args.failover.device_failover {
        // Automatic failover of devices in series: its own processes, clients and report
        // (see `bench/device_failover.rs`).
        return device_failover::run_command(&args);
    }
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
    let cpu = cpu_table(&results);
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
/// replication (see `pmnet::loadgen::replication`).
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

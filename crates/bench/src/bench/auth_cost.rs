//! `pmnet bench --auth-cost`: what authentication costs, side by side in one run, at each
//! payload size asked for (default 100 B and 1 KB):
//!
//! - the PMNet-ACK's latency, `pmnet` and `pmnet-auth` measured at once (`bench/interleaved.rs`:
//!   both systems run, one client alternates blocks of requests between them, so a drift of the
//!   machine hits both alike), against the target of at most 10 % on the p50 over the whole
//!   run; the run is cut into `--rounds` stretches (default 5) of `--duration`, and each
//!   stretch's ratio is shown as the spread;
//! - the device's forwarding capacity, its forward port without and with keys in turns (and
//!   the plain relay), against the target of at most 15 %: the measured packet rates and the
//!   forwarder's CPU per datagram (a CPU-bound forwarder's rate is its inverse, and it hardly
//!   moves when other work shares the machine);
//! - the MAC's cost per datagram at each hop (`bench/mac.rs`).

use std::process::ExitCode;
use std::time::Duration;

use pmnet_runtime::Shutdown;
use serde::Serialize;

use super::args::BenchArgs;
use super::interleaved;
use super::mac::{self, MacCost};
use pmnet::loadgen::results::{CapacityReport, ModeResult, Setting};
use pmnet::loadgen::{
    capacity_config, capacity_table, ratios, ratios_table, results_table, run_capacity,
    setting_text, thousands, workload, Mode, Plan, Target,
};
use pmnet::CliError;

/// The targets: authentication adds at most this share to the PMNet-ACK's p50...
const ACK_P50_TARGET: f64 = 0.10;
/// ... and takes at most this share of the device's forwarding capacity.
const CAPACITY_TARGET: f64 = 0.15;

/// One payload size's figures.
#[derive(Debug, Clone, Serialize)]
pub struct AuthCostAtSize {
    pub payload_bytes: usize,
    pub request_datagram_bytes: usize,
    /// `pmnet` and `pmnet-auth`, each its median round by p50.
    pub results: Vec<ModeResult>,
    /// pmnet-auth p50 / pmnet p50, of each mode's median round.
    pub ack_p50_ratio: Option<f64>,
    /// Each round's pmnet-auth p50 / pmnet p50, in round order, and their median: what the
    /// target is judged on.
    pub ack_p50_round_ratios: Vec<f64>,
    pub ack_p50_paired_ratio: Option<f64>,
    pub capacity: CapacityReport,
    pub mac: MacCost,
}

#[derive(Debug, Clone, Serialize)]
pub struct AuthCostReport {
    pub setting: Setting,
    pub sizes: Vec<AuthCostAtSize>,
    pub ack_p50_target: f64,
    pub capacity_target: f64,
    pub interrupted: bool,
}

pub fn run_command(
    args: &BenchArgs,
    sizes: &[usize],
    shutdown: &Shutdown,
) -> Result<ExitCode, CliError> {
    let rounds = args.rounds.unwrap_or(5);
    println!(
        "pmnet bench --auth-cost: at {} B payloads, pmnet and pmnet-auth at once (one client \
         alternating blocks of requests, {rounds} stretches), the device's forward port without \
         and with keys side by side ({rounds} rounds), and the MAC per datagram",
        sizes
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(" and ")
    );
    let mut measured = Vec::new();
    let mut setting = None;
    for &size in sizes {
        if shutdown.is_requested() {
            break;
        }
        let mut sized = args.clone();
        sized.payload = size;
        sized.modes = vec![Mode::Pmnet, Mode::PmnetAuth];
        sized.rounds = Some(rounds);
        let plan = Plan::from_args(&sized)?;
        if matches!(plan.target, Target::External(_)) {
            return Err(CliError::from(
                "--auth-cost starts its own devices and servers on loopback; drop the \
                 --device/--forward/--echo/--server addresses"
                    .to_owned(),
            ));
        }
        println!();
        println!("{size} B payload:");
        let run = interleaved::run(&plan, shutdown)?;
        let media = Some(run.media.clone());
        let interrupted = shutdown.is_requested();
        let round_ratios = run.round_ratios;
        let paired = median(&round_ratios);
        let results = run.results;
        let mode_ratios = ratios(&results);
        print!("{}", results_table(&results));
        print!("{}", pmnet::loadgen::cpu_table(&results));
        print!("{}", ratios_table(&mode_ratios));
        println!(
            "  pmnet-auth / pmnet p50, stretch by stretch: {} (median {})",
            round_ratios
                .iter()
                .map(|ratio| format!("{ratio:.3}"))
                .collect::<Vec<_>>()
                .join(", "),
            paired.map_or_else(|| "-".to_owned(), |ratio| format!("{ratio:.3}"))
        );
        if interrupted {
            break;
        }
        let per_round = plan.duration.unwrap_or(Duration::from_secs(1));
        let config = capacity_config(&plan, per_round, rounds);
        let capacity = run_capacity(&config, shutdown)?;
        print!("{}", capacity_table(&capacity));
        let request = workload::RequestGenerator::new(&plan.workload, plan.seed, 0)
            .next_request()
            .bytes;
        let mac = mac::measure(&request, &plan.auth_keys);
        print!("{}", mac.text());
        let ack_p50_ratio = mode_ratios
            .iter()
            .find(|ratio| ratio.numerator == "pmnet-auth" && ratio.denominator == "pmnet")
            .and_then(|ratio| ratio.p50);
        let setting_here = plan.setting(media);
        measured.push(AuthCostAtSize {
            payload_bytes: size,
            request_datagram_bytes: setting_here.request_datagram_bytes,
            results,
            ack_p50_ratio,
            ack_p50_round_ratios: round_ratios,
            ack_p50_paired_ratio: paired,
            capacity,
            mac,
        });
        setting.get_or_insert(setting_here);
    }
    println!();
    print!("{}", summary_text(&measured));
    let interrupted = shutdown.is_requested() || measured.len() < sizes.len();
    if let Some(setting) = &setting {
        println!();
        println!("setting (of the first size):");
        print!("{}", setting_text(setting));
    }
    if interrupted {
        println!("interrupted: the sizes not shown did not run");
    }
    if let (Some(path), Some(setting)) = (&args.json, setting) {
        let report = AuthCostReport {
            setting,
            sizes: measured,
            ack_p50_target: ACK_P50_TARGET,
            capacity_target: CAPACITY_TARGET,
            interrupted,
        };
        let text = serde_json::to_string_pretty(&report)
            .map_err(|error| format!("cannot encode the report as JSON: {error}"))?;
        std::fs::write(path, text + "\n").map_err(|error| {
            format!(
                "cannot write the JSON report to {}: {error}; check that the directory exists \
                 and is writable",
                path.display()
            )
        })?;
        println!("JSON written to {}", path.display());
    }
    Ok(if interrupted {
        ExitCode::from(130)
    } else {
        ExitCode::SUCCESS
    })
}

fn median(values: &[f64]) -> Option<f64> {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => None,
        n if n % 2 == 1 => Some(sorted[n / 2]),
        n => Some((sorted[n / 2 - 1] + sorted[n / 2]) / 2.0),
    }
}

fn percent(value: Option<f64>) -> String {
    value.map_or_else(
        || "-".to_owned(),
        |value| format!("{:+.1} %", value * 100.0),
    )
}

fn verdict(cost: Option<f64>, target: f64) -> &'static str {
    match cost {
        Some(cost) if cost <= target => "met",
        Some(_) => "NOT met",
        None => "-",
    }
}

/// One line per size: the ack's p50 and the capacity, plain and authenticated, what
/// authentication costs each and whether that meets its target, and the MAC's cost.
pub fn summary_text(sizes: &[AuthCostAtSize]) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "  what authentication costs (targets: ack p50 at most +{:.0} %, forwarding capacity \
         at most -{:.0} %)",
        ACK_P50_TARGET * 100.0,
        CAPACITY_TARGET * 100.0
    );
    let _ = writeln!(
        out,
        "  {:>8} {:>10} {:>10} {:>9} {:>8}   {:>10} {:>10} {:>9} {:>12} {:>8}   {:>11} {:>12}",
        "payload",
        "ack p50",
        "with auth",
        "change",
        "",
        "forward/s",
        "with auth",
        "change",
        "by CPU [1]",
        "",
        "CPU +ns/dgm",
        "MAC ack path"
    );
    for size in sizes {
        let p50 = |mode: &str| {
            size.results
                .iter()
                .find(|result| result.mode == mode)
                .and_then(|result| result.p50_us)
        };
        let rate = |index: usize| {
            size.capacity
                .results
                .get(index)
                .map(|result| result.packets_per_s)
        };
        let ack_cost = size
            .ack_p50_ratio
            .or(size.ack_p50_paired_ratio)
            .map(|ratio| ratio - 1.0);
        let capacity_cost = size
            .capacity
            .authenticated_vs_forward
            .map(|share| 1.0 - share);
        let capacity_cost_by_cpu = size
            .capacity
            .authenticated_vs_forward_by_cpu
            .map(|share| 1.0 - share);
        let _ = writeln!(
            out,
            "  {:>6} B {:>7.1} µs {:>7.1} µs {:>9} {:>8}   {:>10} {:>10} {:>9} {:>12} {:>8}   {:>11} {:>9.0} ns",
            size.payload_bytes,
            p50("pmnet").unwrap_or(f64::NAN),
            p50("pmnet-auth").unwrap_or(f64::NAN),
            percent(ack_cost),
            verdict(ack_cost, ACK_P50_TARGET),
            rate(1).map_or_else(|| "-".to_owned(), thousands),
            rate(2).map_or_else(|| "-".to_owned(), thousands),
            percent(capacity_cost.map(|cost| -cost)),
            percent(capacity_cost_by_cpu.map(|cost| -cost)),
            // The capacity target is judged on the CPU figure when there is one: the packet
            // rate of one round swings far more than authentication costs on a shared machine.
            verdict(capacity_cost_by_cpu.or(capacity_cost), CAPACITY_TARGET),
            size.capacity
                .authenticated_cpu_ns_extra
                .map_or_else(|| "-".to_owned(), |ns| format!("{ns:+.0}")),
            size.mac.ack_path_ns,
        );
    }
    let _ = writeln!(
        out,
        "  change in ack p50: pmnet and pmnet-auth measured at once, one client sending \
         blocks of {} requests through each in turn, each mode's p50 over the whole run; [1] \
         the change in capacity from the forwarder's CPU per datagram (a CPU-bound \
         forwarder's rate is its inverse; steadier than the packet rate on a shared machine, \
         so the capacity target is judged on it); CPU +ns/dgm: authentication's CPU per \
         forwarded datagram; MAC ack path: the MAC's time on the PMNet-ACK's path alone",
        super::interleaved::BLOCK
    );
    out
}

#[cfg(test)]
mod tests {
    use super::super::args::BenchArgs;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Command {
        #[command(flatten)]
        args: BenchArgs,
    }

    #[test]
    fn auth_cost_takes_sizes_or_defaults_to_100_b_and_1_kb() {
        let parse = |words: &[&str]| {
            Command::try_parse_from(std::iter::once("bench").chain(words.iter().copied()))
                .map(|command| command.args.load.auth_cost)
        };
        assert_eq!(parse(&[]).unwrap(), None);
        assert_eq!(parse(&["--auth-cost"]).unwrap(), Some(vec![100, 1024]));
        assert_eq!(parse(&["--auth-cost=1024"]).unwrap(), Some(vec![1024]));
        assert_eq!(parse(&["--auth-cost=64,512"]).unwrap(), Some(vec![64, 512]));
        assert!(parse(&["--auth-cost=big"]).is_err());
    }
}

//! What the server runs measured: summed up per server and against the targets, printed, and
//! kept for `--json`.

use pmnet_pktstore::bench::median;
use serde::Serialize;

use super::args::{Setup, StoreBenchArgs};
use super::breakdown::{BreakdownJson, REMOVED_SHARE_TARGET};
use super::server::{CpuShare, EndToEnd};

/// The update throughput the packet store is to reach, over the conventional engine's.
const THROUGHPUT_TARGET: f64 = 1.3;

/// One server of the runs over every round: a line of the printed table.
#[derive(Debug, Serialize)]
pub(super) struct EngineJson {
    /// The table's name: conventional, packet, kv, ideal (stores nothing), packet+af_xdp.
    pub(super) engine: &'static str,
    medium: String,
    /// Latency of the sequential updates, every round's together.
    p50_us: f64,
    p99_us: f64,
    mean_us: f64,
    latency_samples: usize,
    /// Median over the rounds of the pipelined updates per second.
    pub(super) updates_per_s: f64,
    /// Each round's.
    pub(super) rounds_updates_per_s: Vec<f64>,
    /// Medians over the rounds of the server's and the client's thread CPU time per update in
    /// the throughput runs (`None` where a thread's CPU clock cannot be read).
    server_cpu_us_per_update: Option<f64>,
    client_cpu_us_per_update: Option<f64>,
    /// How busy each CPU was in the throughput runs (medians over the rounds, fractions).
    cpus: Vec<CpuJson>,
    /// The server's store counters, last round.
    store_counters: String,
}

#[derive(Debug, Serialize)]
struct CpuJson {
    cpu: usize,
    busy_share: f64,
    softirq_share: f64,
}

/// The targets, and the ratios they are judged on (medians over the rounds of each round's
/// ratio); `None` where a server (or the 1 KB breakdown) was not run.
#[derive(Debug, Serialize)]
pub(super) struct TargetsJson {
    /// The share of the conventional engine's checksum + copy + allocation/insertion time per
    /// 1 KB write the packet store is to remove, and what it removed (median breakdown run).
    removed_share_target: f64,
    removed_share: Option<f64>,
    removed_share_met: Option<bool>,
    /// The update throughput the packet store is to reach over the conventional engine's,
    /// judged on `throughput_target_engine` ("packet"; "packet+af_xdp" with --xdp).
    throughput_target: f64,
    throughput_target_engine: &'static str,
    throughput_target_met: Option<bool>,
    rounds: usize,
    packet_vs_conventional_throughput: Option<f64>,
    packet_af_xdp_vs_conventional_throughput: Option<f64>,
    kv_vs_conventional_throughput: Option<f64>,
    /// The ideal handler stores nothing: the ceiling of any engine behind this server.
    ideal_vs_conventional_throughput: Option<f64>,
    /// The packet store's gain over the conventional engine, as a share of the ideal
    /// handler's (when the ideal handler gains anything).
    packet_share_of_possible_gain: Option<f64>,
    /// The conventional engine's server CPU time per update over the packet store's.
    packet_vs_conventional_updates_per_cpu_second: Option<f64>,
}

fn percentile(sorted: &[f64], fraction: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let index = ((sorted.len() as f64 - 1.0) * fraction).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

/// Each server's line: latency over every round, median throughput and CPU times, the store's
/// counters of the last round.
pub(super) fn summarize(setups: &[Setup], runs: &[Vec<EndToEnd>]) -> Vec<EngineJson> {
    setups
        .iter()
        .enumerate()
        .map(|(index, setup)| {
            let mut latency: Vec<f64> = runs
                .iter()
                .flat_map(|round| round[index].latency_us.iter().copied())
                .collect();
            latency.sort_by(f64::total_cmp);
            let mean = latency.iter().sum::<f64>() / latency.len().max(1) as f64;
            let rounds_updates_per_s: Vec<f64> =
                runs.iter().map(|round| round[index].throughput).collect();
            let over_rounds = |pick: fn(&EndToEnd) -> Option<f64>| {
                median(
                    runs.iter()
                        .filter_map(|round| pick(&round[index]))
                        .collect(),
                )
            };
            let cpu_count = runs.first().map_or(0, |round| round[index].cpus.len());
            let cpus = (0..cpu_count)
                .map(|cpu| {
                    let share = |pick: fn(&CpuShare) -> f64| {
                        median(
                            runs.iter()
                                .filter_map(|round| round[index].cpus.get(cpu).map(pick))
                                .collect(),
                        )
                        .unwrap_or(0.0)
                    };
                    CpuJson {
                        cpu,
                        busy_share: share(|s| s.busy),
                        softirq_share: share(|s| s.softirq),
                    }
                })
                .collect();
            EngineJson {
                engine: setup.name,
                medium: runs
                    .first()
                    .map_or(String::new(), |round| round[index].medium.clone()),
                p50_us: percentile(&latency, 0.5),
                p99_us: percentile(&latency, 0.99),
                mean_us: mean,
                latency_samples: latency.len(),
                updates_per_s: median(rounds_updates_per_s.clone()).unwrap_or(0.0),
                rounds_updates_per_s,
                server_cpu_us_per_update: over_rounds(|run| run.server_cpu_us),
                client_cpu_us_per_update: over_rounds(|run| run.client_cpu_us),
                cpus,
                store_counters: runs
                    .last()
                    .map_or(String::new(), |round| round[index].in_place.clone()),
            }
        })
        .collect()
}

/// The targets from the breakdown and the server runs (none with `--no-server`).
pub(super) fn targets(
    args: &StoreBenchArgs,
    breakdown: &BreakdownJson,
    setups: &[Setup],
    runs: &[Vec<EndToEnd>],
    engines: &[EngineJson],
) -> TargetsJson {
    let position = |name: &str| setups.iter().position(|setup| setup.name == name);
    // Server `name`'s throughput over the conventional engine's, median over the rounds.
    let ratio = |name: &str| {
        let (engine, conventional) = (position(name)?, position("conventional")?);
        median(
            runs.iter()
                .map(|round| round[engine].throughput / round[conventional].throughput.max(1.0))
                .collect(),
        )
    };
    let cpu = |name: &str| {
        engines
            .iter()
            .find(|engine| engine.engine == name)
            .and_then(|engine| engine.server_cpu_us_per_update)
    };
    let removed_share = breakdown
        .judges_the_target()
        .then_some(breakdown.removed_share_median);
    let target_engine = if args.xdp { "packet+af_xdp" } else { "packet" };
    let packet = ratio("packet");
    let ideal = ratio("ideal");
    TargetsJson {
        removed_share_target: REMOVED_SHARE_TARGET,
        removed_share,
        removed_share_met: removed_share.map(|share| share >= REMOVED_SHARE_TARGET),
        throughput_target: THROUGHPUT_TARGET,
        throughput_target_engine: target_engine,
        throughput_target_met: ratio(target_engine).map(|ratio| ratio >= THROUGHPUT_TARGET),
        rounds: runs.len(),
        packet_vs_conventional_throughput: packet,
        packet_af_xdp_vs_conventional_throughput: ratio("packet+af_xdp"),
        kv_vs_conventional_throughput: ratio("kv"),
        ideal_vs_conventional_throughput: ideal,
        packet_share_of_possible_gain: match (packet, ideal) {
            (Some(packet), Some(ideal)) if ideal > 1.0 => Some((packet - 1.0) / (ideal - 1.0)),
            _ => None,
        },
        packet_vs_conventional_updates_per_cpu_second: match (cpu("conventional"), cpu("packet")) {
            (Some(conventional), Some(packet)) => {
                Some(conventional / packet.max(f64::MIN_POSITIVE))
            }
            _ => None,
        },
    }
}

fn cpu_text(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_owned(), |value| format!("{value:.2}"))
}

/// The medium, and a line per server.
pub(super) fn print_engines(engines: &[EngineJson]) {
    if let Some(first) = engines.first() {
        println!("medium: {}", first.medium);
    }
    println!(
        "  {:<13} {:>9} {:>9} {:>9} {:>16} {:>16}   server's store counters (last round)",
        "engine", "p50 µs", "p99 µs", "mean µs", "updates/s (med)", "server CPU µs/upd"
    );
    for engine in engines {
        println!(
            "  {:<13} {:>9.1} {:>9.1} {:>9.1} {:>16.0} {:>16}   {}",
            engine.engine,
            engine.p50_us,
            engine.p99_us,
            engine.mean_us,
            engine.updates_per_s,
            cpu_text(engine.server_cpu_us_per_update),
            engine.store_counters
        );
    }
}

/// The throughput target (packet store against the conventional engine), the ideal handler's
/// ceiling, and the server CPU time per update of the two.
pub(super) fn print_targets(args: &StoreBenchArgs, targets: &TargetsJson, engines: &[EngineJson]) {
    let rounds = targets.rounds;
    let ratio = targets.packet_vs_conventional_throughput.unwrap_or(0.0);
    println!(
        "target: packet store update throughput >= {THROUGHPUT_TARGET}x the conventional \
         engine's: {ratio:.2}x (median of {rounds} rounds; {}); window {}, {} s per engine per \
         round",
        if ratio >= THROUGHPUT_TARGET {
            "met"
        } else {
            "NOT met"
        },
        args.window,
        args.seconds
    );
    // The ideal handler stores nothing: no engine behind this server can beat it, so its ratio
    // to the conventional engine bounds what any engine could show here.
    let ceiling = targets.ideal_vs_conventional_throughput.unwrap_or(0.0);
    let gained = targets
        .packet_share_of_possible_gain
        .map_or(String::new(), |share| {
            format!(
                "; the packet store has {:.0} % of the gain any engine could have",
                100.0 * share
            )
        });
    println!(
        "ceiling: the ideal handler (stores nothing) serves {ceiling:.2}x the conventional \
         engine's updates in the same rounds{gained}"
    );
    // The client shares the machine and, on loopback, pays for delivering each datagram: the
    // throughput above can be the client's limit as much as the server's. The server thread's
    // CPU time per update is its own cost, whatever limited the run.
    let cpu = |name: &str| {
        engines
            .iter()
            .find(|engine| engine.engine == name)
            .and_then(|engine| engine.server_cpu_us_per_update)
    };
    if let (Some(conventional), Some(packet), Some(per_cpu_second)) = (
        cpu("conventional"),
        cpu("packet"),
        targets.packet_vs_conventional_updates_per_cpu_second,
    ) {
        println!(
            "server CPU per update: conventional {conventional:.2} µs, packet {packet:.2} µs: \
             the packet store's server would serve {per_cpu_second:.2}x the updates per CPU \
             second{}",
            busy_poll_note(args)
        );
    }
}

fn busy_poll_note(args: &StoreBenchArgs) -> &'static str {
    if args.blocking {
        ""
    } else {
        " (busy-poll: idle spinning counts as CPU time too; --blocking measures the work alone)"
    }
}

/// `--xdp`: the packet store behind AF_XDP against the conventional engine behind the UDP
/// socket (the target), the packet store behind the UDP socket (what the engine alone gains),
/// the ideal handler's ceiling behind the UDP socket, and the server CPU per update.
pub(super) fn print_xdp_targets(
    args: &StoreBenchArgs,
    targets: &TargetsJson,
    engines: &[EngineJson],
) {
    let rounds = targets.rounds;
    let packet_udp = targets.packet_vs_conventional_throughput.unwrap_or(0.0);
    let packet_xdp = targets
        .packet_af_xdp_vs_conventional_throughput
        .unwrap_or(0.0);
    let ideal = targets.ideal_vs_conventional_throughput.unwrap_or(0.0);
    println!(
        "target: packet store over AF_XDP >= {THROUGHPUT_TARGET}x the conventional engine over \
         the UDP socket: {packet_xdp:.2}x (median of {rounds} rounds; {}); window {}, {} s per \
         server per round",
        if packet_xdp >= THROUGHPUT_TARGET {
            "met"
        } else {
            "NOT met"
        },
        args.window,
        args.seconds
    );
    println!(
        "  packet store over the UDP socket: {packet_udp:.2}x; the ideal handler (stores \
         nothing) over the UDP socket: {ideal:.2}x"
    );
    println!("where the time goes (medians over the rounds, throughput runs):");
    for engine in engines {
        let shares: Vec<String> = engine
            .cpus
            .iter()
            .map(|cpu| {
                format!(
                    "CPU {} {:.0} % busy ({:.0} % softirq)",
                    cpu.cpu,
                    cpu.busy_share * 100.0,
                    cpu.softirq_share * 100.0
                )
            })
            .collect();
        println!(
            "  {:<13} server thread {} µs/upd, client thread {} µs/upd; {}",
            engine.engine,
            cpu_text(engine.server_cpu_us_per_update),
            cpu_text(engine.client_cpu_us_per_update),
            shares.join(", ")
        );
    }
    let cpu: Vec<Option<f64>> = engines
        .iter()
        .map(|engine| engine.server_cpu_us_per_update)
        .collect();
    if let [Some(conventional), Some(packet), Some(xdp), Some(ideal)] = cpu[..] {
        println!(
            "server CPU per update: conventional/UDP {conventional:.2} µs, packet/UDP \
             {packet:.2} µs, packet/AF_XDP {xdp:.2} µs, ideal/UDP {ideal:.2} µs{}",
            busy_poll_note(args)
        );
    }
}

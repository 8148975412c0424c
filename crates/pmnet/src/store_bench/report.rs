//! What the server runs measured, printed.

use pmnet_pktstore::bench::median;

use super::server::{CpuShare, EndToEnd};
use super::{Setup, StoreBenchArgs, NAMESPACES};

fn percentile(sorted: &[f64], fraction: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let index = ((sorted.len() as f64 - 1.0) * fraction).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

/// The medium, and a line per engine: latency over every round, median throughput and server
/// CPU time, and the store's counters of the last round.
pub(super) fn print_engines(setups: &[Setup], runs: &[Vec<EndToEnd>]) {
    if let Some(first) = runs.first().and_then(|round| round.first()) {
        println!("medium: {}", first.medium);
    }
    println!(
        "  {:<13} {:>9} {:>9} {:>9} {:>16} {:>16}   server's store counters (last round)",
        "engine", "p50 µs", "p99 µs", "mean µs", "updates/s (med)", "server CPU µs/upd"
    );
    for (index, Setup { name, .. }) in setups.iter().enumerate() {
        let mut latency: Vec<f64> = runs
            .iter()
            .flat_map(|round| round[index].latency_us.iter().copied())
            .collect();
        latency.sort_by(f64::total_cmp);
        let mean = latency.iter().sum::<f64>() / latency.len().max(1) as f64;
        let throughput =
            median(runs.iter().map(|round| round[index].throughput).collect()).unwrap_or(0.0);
        let counters = runs
            .last()
            .map_or(String::new(), |round| round[index].in_place.clone());
        let cpu = server_cpu_median(runs, index)
            .map_or_else(|| "-".to_owned(), |cpu| format!("{cpu:.2}"));
        println!(
            "  {:<13} {:>9.1} {:>9.1} {:>9.1} {:>16.0} {:>16}   {}",
            name,
            percentile(&latency, 0.5),
            percentile(&latency, 0.99),
            mean,
            throughput,
            cpu,
            counters
        );
    }
}

/// The throughput target (packet store against the conventional engine), the ideal handler's
/// ceiling, and the server CPU time per update of the two.
pub(super) fn print_targets(args: &StoreBenchArgs, runs: &[Vec<EndToEnd>]) {
    let rounds = runs.len();
    // Engine `index`'s throughput over the conventional engine's, median over the rounds.
    let ratio_to = |index: usize| {
        median(
            runs.iter()
                .map(|round| round[index].throughput / round[0].throughput.max(1.0))
                .collect(),
        )
        .unwrap_or(0.0)
    };
    let ratio = ratio_to(1);
    println!(
        "target: packet store update throughput >= 1.3x the conventional engine's: {ratio:.2}x \
         (median of {rounds} rounds; {}); window {}, {} s per engine per round",
        if ratio >= 1.3 { "met" } else { "NOT met" },
        args.window,
        args.seconds
    );
    // The ideal handler stores nothing: no engine behind this server can beat it, so its ratio
    // to the conventional engine bounds what any engine could show here.
    let ceiling = ratio_to(3);
    let gained = if ceiling > 1.0 {
        format!(
            "; the packet store has {:.0} % of the gain any engine could have",
            100.0 * (ratio - 1.0) / (ceiling - 1.0)
        )
    } else {
        String::new()
    };
    println!(
        "ceiling: the ideal handler (stores nothing) serves {ceiling:.2}x the conventional \
         engine's updates in the same rounds{gained}"
    );
    // The client shares the machine and, on loopback, pays for delivering each datagram: the
    // throughput above can be the client's limit as much as the server's. The server thread's
    // CPU time per update is its own cost, whatever limited the run.
    if let (Some(conventional), Some(packet)) =
        (server_cpu_median(runs, 0), server_cpu_median(runs, 1))
    {
        println!(
            "server CPU per update: conventional {conventional:.2} µs, packet {packet:.2} µs: \
             the packet store's server would serve {:.2}x the updates per CPU second{}",
            conventional / packet.max(f64::MIN_POSITIVE),
            if args.blocking {
                ""
            } else {
                " (busy-poll: idle spinning counts as CPU time too; --blocking measures the \
                 work alone)"
            }
        );
    }
}

/// `--xdp`: the packet store behind AF_XDP against the conventional engine behind the UDP
/// socket (the target), the packet store behind the UDP socket (what the engine alone gains),
/// the ideal handler's ceiling behind the UDP socket, and the server CPU per update.
pub(super) fn print_xdp_targets(args: &StoreBenchArgs, runs: &[Vec<EndToEnd>]) {
    let rounds = runs.len();
    let ratio_to = |index: usize| {
        median(
            runs.iter()
                .map(|round| round[index].throughput / round[0].throughput.max(1.0))
                .collect(),
        )
        .unwrap_or(0.0)
    };
    let (packet_udp, packet_xdp, ideal) = (ratio_to(1), ratio_to(2), ratio_to(3));
    println!(
        "target: packet store over AF_XDP >= 1.3x the conventional engine over the UDP socket: \
         {packet_xdp:.2}x (median of {rounds} rounds; {}); window {}, {} s per server per round",
        if packet_xdp >= 1.3 { "met" } else { "NOT met" },
        args.window,
        args.seconds
    );
    println!(
        "  packet store over the UDP socket: {packet_udp:.2}x; the ideal handler (stores \
         nothing) over the UDP socket: {ideal:.2}x"
    );
    println!("where the time goes (medians over the rounds, throughput runs):");
    for (index, setup) in NAMESPACES.iter().enumerate() {
        let client = median(
            runs.iter()
                .filter_map(|round| round[index].client_cpu_us)
                .collect(),
        );
        let cpus = runs.first().map_or(0, |round| round[index].cpus.len());
        let shares: Vec<String> = (0..cpus)
            .map(|cpu| {
                let share = |pick: fn(&CpuShare) -> f64| {
                    median(
                        runs.iter()
                            .filter_map(|round| round[index].cpus.get(cpu).map(pick))
                            .collect(),
                    )
                    .unwrap_or(0.0)
                        * 100.0
                };
                format!(
                    "CPU {cpu} {:.0} % busy ({:.0} % softirq)",
                    share(|s| s.busy),
                    share(|s| s.softirq)
                )
            })
            .collect();
        println!(
            "  {:<13} server thread {} µs/upd, client thread {} µs/upd; {}",
            setup.name,
            server_cpu_median(runs, index).map_or("-".into(), |v| format!("{v:.2}")),
            client.map_or("-".into(), |v| format!("{v:.2}")),
            shares.join(", ")
        );
    }
    let cpu: Vec<Option<f64>> = (0..4).map(|index| server_cpu_median(runs, index)).collect();
    if let [Some(conventional), Some(packet), Some(xdp), Some(ideal)] = cpu[..] {
        println!(
            "server CPU per update: conventional/UDP {conventional:.2} µs, packet/UDP \
             {packet:.2} µs, packet/AF_XDP {xdp:.2} µs, ideal/UDP {ideal:.2} µs{}",
            if args.blocking {
                ""
            } else {
                " (busy-poll: idle spinning counts as CPU time too; --blocking measures the \
                 work alone)"
            }
        );
    }
}

/// The median over the rounds of engine `index`'s server CPU time per update.
fn server_cpu_median(runs: &[Vec<EndToEnd>], index: usize) -> Option<f64> {
    median(
        runs.iter()
            .filter_map(|round| round[index].server_cpu_us)
            .collect(),
    )
}

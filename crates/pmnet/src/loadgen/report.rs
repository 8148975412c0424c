//! The text tables of a run's results.

use std::fmt::Write as _;

use super::cpu::CpuPerRequest;
use super::figures::{cell, ratio, thousands};
use super::results::{CapacityReport, ModeResult, Ratio, Setting};

/// The ratios worth reading: pmnet against baseline and against the echo floor, forward
/// against baseline (what the extra hop costs), for the modes that were run.
pub fn ratios(results: &[ModeResult]) -> Vec<Ratio> {
    let find = |mode: &str| results.iter().find(|result| result.mode == mode);
    let mut out = Vec::new();
    for (numerator, denominator) in [
        ("pmnet", "baseline"),
        ("pmnet+cache", "pmnet"),
        ("pmnet-auth+cache", "pmnet-auth"),
        ("pmnet", "echo"),
        ("pmnet", "forward"),
        ("forward", "baseline"),
        ("pmnet-auth", "pmnet"),
        ("forward-auth", "forward"),
        ("baseline-auth", "baseline"),
    ] {
        let (Some(a), Some(b)) = (find(numerator), find(denominator)) else {
            continue;
        };
        out.push(Ratio {
            numerator: numerator.to_owned(),
            denominator: denominator.to_owned(),
            p50: ratio(a.p50_us, b.p50_us),
            p99: ratio(a.p99_us, b.p99_us),
            p999: ratio(a.p999_us, b.p999_us),
            ops_per_s: ratio(Some(a.ops_per_s), Some(b.ops_per_s)),
        });
    }
    out
}

/// The latency table.
pub fn results_table(results: &[ModeResult]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "  {:<11} {:<44} {:>8} {:>8} {:>9} {:>8} {:>10} {:>9}",
        "mode",
        "the client waits for",
        "p50 µs",
        "p99 µs",
        "p99.9 µs",
        "mean µs",
        "ops/s",
        "requests"
    );
    for result in results {
        let _ = writeln!(
            out,
            "  {:<11} {:<44} {:>8} {:>8} {:>9} {:>8} {:>10} {:>9}",
            result.mode,
            result.waits_for,
            cell(result.p50_us),
            cell(result.p99_us),
            cell(result.p999_us),
            cell(result.mean_us),
            thousands(result.ops_per_s),
            thousands(result.requests as f64),
        );
    }
    out
}

fn times(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_owned(), |value| format!("{value:.2}×"))
}

/// The ratio lines.
pub fn ratios_table(ratios: &[Ratio]) -> String {
    let mut out = String::new();
    for ratio in ratios {
        let _ = writeln!(
            out,
            "  {:<20} p50 {:>7}  p99 {:>7}  p99.9 {:>7}  throughput {:>7}",
            format!("{} / {}", ratio.numerator, ratio.denominator),
            times(ratio.p50),
            times(ratio.p99),
            times(ratio.p999),
            times(ratio.ops_per_s),
        );
    }
    out
}

/// The capacity table.
pub fn capacity_table(report: &CapacityReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "  {:<34} {:>10} {:>10} {:>12} {:>12}   every round, packets/s",
        "forwarder (one thread)", "packets/s", "offered/s", "not read [1]", "CPU ns/dgram"
    );
    for result in &report.results {
        let rounds: Vec<String> = result
            .rounds_per_s
            .iter()
            .map(|rate| thousands(*rate))
            .collect();
        let _ = writeln!(
            out,
            "  {:<34} {:>10} {:>10} {:>11.1}% {:>12}   {}",
            result.forwarder,
            thousands(result.packets_per_s),
            thousands(result.offered_per_s),
            result.dropped_before_forwarder * 100.0,
            result
                .cpu_ns_per_datagram
                .map_or_else(|| "-".to_owned(), |ns| format!("{ns:.0}")),
            rounds.join(" "),
        );
    }
    let _ = writeln!(
        out,
        "  (median of {} rounds of {:.1} s per forwarder, {}; [1] offered datagrams the \
         forwarder never read: above 0 % it, not the generator, was the bottleneck)",
        report.rounds,
        report.seconds_per_round,
        if report.wait == "blocking" {
            "the forwarders running side by side and the generator sending to each in turn, \
             50 ms at a time"
        } else {
            "one forwarder after the other"
        }
    );
    if let Some(ratio) = report.forward_vs_relay {
        let _ = writeln!(
            out,
            "  device forward port / plain relay: {:.0}% of the relay's packet rate",
            ratio * 100.0
        );
    }
    if let Some(ratio) = report.authenticated_vs_forward {
        let _ = writeln!(
            out,
            "  authenticated / unauthenticated forward port: {:.0}% of the packet rate (every \
             datagram verified, and sealed again when forwarded)",
            ratio * 100.0
        );
    }
    if let (Some(extra), Some(share)) = (
        report.authenticated_cpu_ns_extra,
        report.authenticated_vs_forward_by_cpu,
    ) {
        let _ = writeln!(
            out,
            "  authentication costs the forwarder {extra:.0} ns of CPU per datagram: {:.0}% of \
             the plain port's packet rate when the forwarder's CPU is the limit",
            share * 100.0
        );
    }
    out
}

/// The setting in a few lines.
pub fn setting_text(setting: &Setting) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "  wait: {} ({}); placement: {}",
        setting.wait,
        if setting.busy_poll {
            "every loop and client spins, yielding between empty polls"
        } else {
            "every loop and client sleeps in ppoll until a datagram arrives"
        },
        setting.placement
    );
    let _ = writeln!(
        out,
        "  workload: {} client{} × window {}; SET value {} B (update datagram {} B); {:.0}% \
         updates; {} keys, {}{}; seed {}",
        setting.clients,
        if setting.clients == 1 { "" } else { "s" },
        setting.window,
        setting.payload_bytes,
        setting.request_datagram_bytes,
        setting.update_ratio * 100.0,
        setting.keys,
        setting.distribution,
        setting
            .zipf_exponent
            .map_or_else(String::new, |s| format!(" (s = {s})")),
        setting.seed
    );
    let length = match (setting.duration_s, setting.requests_per_mode) {
        (_, Some(requests)) => format!("{requests} measured requests per mode"),
        (Some(seconds), None) => format!("{seconds} s measured per mode"),
        (None, None) => "-".to_owned(),
    };
    let _ = writeln!(
        out,
        "  {length} after {} s of warm-up; target: {}; {} CPUs online; load average at start: {}",
        setting.warmup_s, setting.target, setting.cpus_online, setting.load_average
    );
    if setting.popularity != "static" {
        let _ = writeln!(
            out,
            "  popularity: {} every {} s by {} keys",
            setting.popularity,
            setting.popularity_change_every_s.unwrap_or(0.0),
            setting.popularity_change_count.unwrap_or(0)
        );
    }
    if let Some(rack) = &setting.rack {
        let _ = writeln!(out, "  rack: {rack}");
    }
    let _ = writeln!(out, "  device log medium: {}", setting.medium);
    let _ = writeln!(
        out,
        "  server store ({}): {}",
        setting.server_app, setting.server_medium
    );
    out
}

/// The CPU table: µs per request of each part, and the comparisons the design aims at (the
/// device against the baseline's server; the PMNet server against the baseline's).
pub fn cpu_table(results: &[ModeResult]) -> String {
    use std::fmt::Write;
    let measured: Vec<(&str, CpuPerRequest)> = results
        .iter()
        .filter_map(|result| Some((result.mode.as_str(), result.cpu?)))
        .collect();
    let mut out = String::new();
    if measured.is_empty() {
        return out;
    }
    let cell = |value: Option<f64>| value.map_or("-".to_owned(), |value| format!("{value:.2}"));
    let _ = writeln!(
        out,
        "  {:<14} {:>10} {:>10} {:>10} {:>10}   CPU µs per request (user + system, all threads of the part)",
        "mode", "clients", "device", "server", "total"
    );
    for (mode, cpu) in &measured {
        let _ = writeln!(
            out,
            "  {:<14} {:>10} {:>10} {:>10} {:>10}",
            mode,
            cell(cpu.client_us),
            cell(cpu.device_us),
            cell(cpu.server_us),
            format!("{:.2}", cpu.total_us()),
        );
    }
    let find = |mode: &str| {
        measured
            .iter()
            .find(|(name, _)| *name == mode)
            .map(|(_, cpu)| *cpu)
    };
    let baseline_server = find("baseline").and_then(|cpu| cpu.server_us);
    for mode in ["pmnet", "forward"] {
        let Some(cpu) = find(mode) else { continue };
        let Some(base) = baseline_server.filter(|base| *base > 0.0) else {
            continue;
        };
        let mut parts = Vec::new();
        if let Some(device) = cpu.device_us {
            parts.push(format!("device {:.2}×", device / base));
        }
        if let Some(server) = cpu.server_us {
            parts.push(format!("server {:.2}×", server / base));
        }
        if !parts.is_empty() {
            let _ = writeln!(
                out,
                "  {mode}: {} the baseline server's CPU per request",
                parts.join(", ")
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratios_compare_the_modes_that_ran() {
        let mut pmnet = ModeResult::from_summary("pmnet", "", None);
        pmnet.p50_us = Some(10.0);
        pmnet.ops_per_s = 200.0;
        let mut baseline = ModeResult::from_summary("baseline", "", None);
        baseline.p50_us = Some(40.0);
        baseline.ops_per_s = 50.0;
        let ratios = ratios(&[baseline, pmnet]);
        assert_eq!(ratios.len(), 1, "only pmnet / baseline can be formed");
        assert_eq!(ratios[0].p50, Some(0.25));
        assert_eq!(ratios[0].ops_per_s, Some(4.0));
        assert_eq!(ratios[0].p99, None);
    }
}

//! `pmnet sim --abd`: seeds of the replicated memory's world (`pmnet_sim::abd`), one or a
//! swarm over `--jobs` threads, with each failing seed's replay command and the faults the
//! swarm injected.

use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use pmnet_sim::abd::{run_seed, AbdReport};

/// Run `seed`, or `count` seeds from `start` (random when not given, and printed).
pub fn run(seed: Option<u64>, count: u64, start: Option<u64>, jobs: u32) -> ExitCode {
    if let Some(seed) = seed {
        return match run_caught(seed) {
            Ok(report) => {
                println!("{report:?}\nPASS");
                ExitCode::SUCCESS
            }
            Err(error) => {
                println!("{error}\nFAIL");
                ExitCode::FAILURE
            }
        };
    }
    let (start, chosen) = match start {
        Some(start) => (start, "given"),
        None => (rand::random::<u64>() >> 1, "random"),
    };
    println!(
        "pmnet sim --abd: {count} seeds from {start} ({chosen} start seed; repeat this swarm \
         with --abd --seeds {count} --start-seed {start})"
    );
    let next = AtomicU64::new(0);
    let totals = Mutex::new((AbdReport::default(), 0u64, Vec::<String>::new()));
    std::thread::scope(|scope| {
        for _ in 0..jobs.max(1) {
            scope.spawn(|| loop {
                let at = next.fetch_add(1, Ordering::Relaxed);
                if at >= count {
                    break;
                }
                let seed = start.wrapping_add(at);
                let result = run_caught(seed);
                let mut totals = totals.lock().expect("no panic holds it");
                match result {
                    Ok(report) => {
                        totals.0.add(&report);
                        totals.1 += 1;
                    }
                    Err(error) => {
                        println!("FAIL {error}");
                        totals.2.push(error);
                    }
                }
                let done = totals.1 + totals.2.len() as u64;
                if done % 100 == 0 || done == count {
                    eprintln!("  {done}/{count} seeds, {} failed", totals.2.len());
                }
            });
        }
    });
    let (sum, passed, failures) = totals.into_inner().expect("no panic holds it");
    println!("{}", summary(&sum, passed));
    if failures.is_empty() {
        println!("PASS");
        ExitCode::SUCCESS
    } else {
        println!(
            "{} seeds failed (each printed above as FAIL); replay one with: pmnet sim --abd \
             --seed N",
            failures.len()
        );
        ExitCode::FAILURE
    }
}

/// What the passing seeds of a swarm did, in a sentence.
fn summary(sum: &AbdReport, passed: u64) -> String {
    format!(
        "{passed} seeds passed ({} memory nodes in all; {} clients through the device, {} \
         client-driven): {} operations ({} reads, {} writes, {} of several lines), {} \
         answered ok, {} unavailable, {} in doubt, {} beyond the end refused; faults: {} node \
         crashes ({} power failures among them; {} torn records rejected on reopening), {} memories lost for good ({} nodes \
         rejoined after learning, {} lines copied), {} partitions, {} device restarts; {} \
         reads in one phase, {} with a write-back; {} device clients started over; the \
         attacker replayed {} datagrams ({} past the window, {} bursts after restarts): {} \
         dropped as stale, {} refused by the device's replay floor",
        sum.nodes,
        sum.device_clients,
        sum.direct_clients,
        sum.operations,
        sum.reads,
        sum.writes,
        sum.multi_line,
        sum.completed,
        sum.unavailable,
        sum.in_doubt,
        sum.out_of_range,
        sum.crashes,
        sum.power_failures,
        sum.torn_records,
        sum.losses,
        sum.joins,
        sum.lines_learnt,
        sum.partitions,
        sum.device_restarts,
        sum.reads_one_phase,
        sum.write_backs,
        sum.session_churn,
        sum.replayed,
        sum.replayed_past_window,
        sum.replay_bursts,
        sum.stale_dropped,
        sum.replays_refused,
    )
}

/// One seed, a panic in it reported as its failure.
fn run_caught(seed: u64) -> Result<AbdReport, String> {
    std::panic::catch_unwind(|| run_seed(seed)).unwrap_or_else(|panic| {
        let message = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|text| (*text).to_owned()))
            .unwrap_or_default();
        Err(format!("seed {seed}: panicked: {message}"))
    })
}

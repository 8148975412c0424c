//! `pmnet sim --chain-store`: seeds of the chain store's world (`pmnet_sim::chain`), one or a
//! swarm over `--jobs` threads, with each failing seed's replay command; `--fixed-chains` runs
//! its fixed-chain variant (no controller).

use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use pmnet_sim::chain::{run_seed, run_seed_fixed, ChainReport};

/// Run `seed`, or `count` seeds from `start` (random when not given, and printed).
pub fn run(fixed: bool, seed: Option<u64>, count: u64, start: Option<u64>, jobs: u32) -> ExitCode {
    let flags = if fixed {
        "--chain-store --fixed-chains"
    } else {
        "--chain-store"
    };
    if let Some(seed) = seed {
        return match run_caught(fixed, seed) {
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
        "pmnet sim {flags}: {count} seeds from {start} ({chosen} start seed; repeat this \
         swarm with {flags} --seeds {count} --start-seed {start})"
    );
    let next = AtomicU64::new(0);
    let totals = Mutex::new((ChainReport::default(), 0u64, Vec::<String>::new()));
    std::thread::scope(|scope| {
        for _ in 0..jobs.max(1) {
            scope.spawn(|| loop {
                let at = next.fetch_add(1, Ordering::Relaxed);
                if at >= count {
                    break;
                }
                let seed = start.wrapping_add(at);
                let result = run_caught(fixed, seed);
                let mut totals = totals.lock().expect("no panic holds it");
                match result {
                    Ok(report) => {
                        totals.0.add(&report);
                        totals.1 += 1;
                    }
                    Err(error) => totals.2.push(error),
                }
                let done = totals.1 + totals.2.len() as u64;
                if done % 100 == 0 || done == count {
                    eprintln!("  {done}/{count} seeds, {} failed", totals.2.len());
                }
            });
        }
    });
    let (sum, passed, failures) = totals.into_inner().expect("no panic holds it");
    println!(
        "{passed} seeds passed: {} operations ({} completed), {} member crashes, {} members \
         lost for good, {} partitions, {} controller restarts; {} members taken out of \
         chains, {} recoveries; {} reads answered where they came, {} relayed to the tail; \
         {} clients started over; the attacker replayed {} datagrams ({} past the window, {} \
         bursts after restarts): {} dropped as stale, {} writes refused by a head's replay floor",
        sum.operations,
        sum.completed,
        sum.crashes,
        sum.members_lost,
        sum.partitions,
        sum.controller_restarts,
        sum.removals,
        sum.recoveries,
        sum.reads_here,
        sum.reads_relayed,
        sum.session_churn,
        sum.replayed,
        sum.replayed_past_window,
        sum.replay_bursts,
        sum.stale_dropped,
        sum.replays_refused
    );
    if failures.is_empty() {
        println!("PASS");
        ExitCode::SUCCESS
    } else {
        for failure in &failures {
            println!("FAIL {failure}");
        }
        println!(
            "{} seeds failed; replay one with: pmnet sim {flags} --seed N",
            failures.len()
        );
        ExitCode::FAILURE
    }
}

/// One seed, a panic in it reported as its failure.
fn run_caught(fixed: bool, seed: u64) -> Result<ChainReport, String> {
    let run = if fixed { run_seed_fixed } else { run_seed };
    std::panic::catch_unwind(|| run(seed)).unwrap_or_else(|panic| {
        let message = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|text| (*text).to_owned()))
            .unwrap_or_default();
        Err(format!("seed {seed}: panicked: {message}"))
    })
}

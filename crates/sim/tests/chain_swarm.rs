//! The chain store's swarm: seeds of `pmnet_sim::chain` (crashes, a member lost for good,
//! partitions, controller restarts; linearizability per key and whole chains once healed).
//! `PMNET_SEED=N` runs one seed; otherwise a random start seed is printed.

use pmnet_sim::chain::{run_seed, run_seed_fixed};

#[test]
fn chain_store_seeds_hold_their_invariants() {
    let (start, count) = match std::env::var("PMNET_SEED") {
        Ok(text) => (text.trim().parse().expect("PMNET_SEED is a u64"), 1),
        Err(_) => (
            rand_start(),
            std::env::var("PMNET_SEEDS")
                .ok()
                .and_then(|text| text.trim().parse().ok())
                .unwrap_or(24u64),
        ),
    };
    eprintln!("start seed {start}, {count} seeds (PMNET_SEED=N replays one)");
    let mut totals = pmnet_sim::chain::ChainReport::default();
    for seed in (0..count).map(|at| start.wrapping_add(at)) {
        let report = run_seed(seed).unwrap_or_else(|error| panic!("{error}"));
        totals.add(&report);
    }
    eprintln!("{totals:?}");
    assert!(totals.completed > 0 && totals.reads_here > 0);
    if count >= 24 {
        // The attacker replayed, past the window too, and what it replayed was refused.
        assert!(totals.replayed > 0 && totals.replayed_past_window > 0);
        assert!(totals.stale_dropped > 0 && totals.replay_bursts > 0);
    }
}

fn rand_start() -> u64 {
    use std::time::{SystemTime, UNIX_EPOCH};
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(1, |since| since.as_nanos() as u64 >> 8)
}

/// The fixed chains of `--chain-member` (no controller): member crashes and restarts, loss,
/// duplication, reordering; every key's history linearizable.
#[test]
fn fixed_chain_seeds_stay_linearizable_through_member_crashes() {
    let (start, count) = match std::env::var("PMNET_SEED") {
        Ok(text) => (text.trim().parse().expect("PMNET_SEED is a u64"), 1),
        Err(_) => (rand_start() ^ 0x5eed, 24),
    };
    eprintln!("start seed {start}, {count} seeds (PMNET_SEED=N replays one)");
    let mut crashes = 0;
    for seed in start..start + count {
        let report = run_seed_fixed(seed).unwrap_or_else(|error| panic!("{error}"));
        assert_eq!(report.removals + report.recoveries, 0);
        crashes += report.crashes;
    }
    assert!(crashes > 0, "no member crashed in {count} seeds");
}

/// Seeds that once failed, each for a reason fixed since.
#[test]
fn chain_store_regression_seeds() {
    // A head answered a retransmitted write by passing its newest version down under that
    // request's name: the next members never learnt the request that version really was,
    // and the member that became the head after a failover applied that request twice.
    //
    // A member that became a head after a failover did not know a client's write the head
    // before it had stamped (its write passed down was lost, and a later version of the key
    // covered it); a replay of that write, sealed before the failover, ran again. A member
    // that becomes a head now refuses what was sealed before its configuration came.
    //
    // A client took the tail's answer to a read relayed for its compare-and-set (replayed to
    // it) as the write's outcome. Relayed reads and their answers now carry RELAYED.
    //
    // A replay of a write's retransmission came more than a request lifetime after the head
    // restarted (within the replay window), when "in doubt" no longer held, and ran again.
    // A retransmission sealed less than a lifetime after the head's floor is in doubt now.
    let seeds: &[u64] = &[
        7_633_541_146_407_268_197,
        6_766_887_461_816_636_222,
        6_766_887_461_816_631_391,
        7_244_940_185_320_797_796,
        // A replayed copy page passed for the delta's answer: the writes made during the
        // copy never reached the joining member. Sync pages now name the phase they answer.
        7_034_268_338_806_875_856,
        // A head cut off stamped a write whose pass-on was lost; taken out, it came back as
        // the head (in its old place) still remembering that request's version, which the
        // chain had given another write meanwhile, and answered the retransmission "written"
        // with it. A member joining a group now forgets its earlier writes there.
        7_376_358_303_324_877_919,
        // A member brought in at a lost head's place answered retransmissions "in doubt" for a
        // request lifetime: a key's history held too many unknown outcomes to be checked. The
        // member that took over heading keeps the head's place now.
        8_162_306_907_846_587_437,
    ];
    for &seed in seeds {
        run_seed(seed).unwrap_or_else(|error| panic!("{error}"));
    }
    // Fixed chains: a restarted head learnt a client's session again (from a later write
    // passed down to it as another chain's member); a replay of that session's write from
    // before the restart then ran a second time.
    let fixed: &[u64] = &[
        7_015_378_364_050_038,
        7_361_081_555_289_481_156,
        3_849_030_792_154_450_462,
    ];
    for &seed in fixed {
        run_seed_fixed(seed).unwrap_or_else(|error| panic!("{error}"));
    }
}

/// A seed replays exactly: the same readable trace and trace hash twice; without the datagram
/// lines, or without a trace, the same hash; the report carries it.
#[test]
fn a_chain_seed_gives_the_same_trace_and_hash_every_time() {
    for (seed, controlled) in [(11u64, true), (12, false)] {
        let first = pmnet_sim::chain::run_traced(seed, controlled, Some(true));
        let again = pmnet_sim::chain::run_traced(seed, controlled, Some(true));
        let report = first
            .result
            .clone()
            .unwrap_or_else(|error| panic!("{error}"));
        assert_ne!(first.trace_hash, 0);
        assert_eq!(report.trace_hash, first.trace_hash);
        assert_eq!(again.trace_hash, first.trace_hash, "seed {seed}");
        assert_eq!(again.trace, first.trace, "seed {seed}");
        let lines = first.trace.expect("a trace");
        assert!(lines.iter().any(|line| line.contains(" send ")));
        assert!(lines
            .last()
            .is_some_and(|line| line.ends_with("check    PASS")));
        let quiet = pmnet_sim::chain::run_traced(seed, controlled, Some(false));
        assert_eq!(quiet.trace_hash, first.trace_hash);
        let quiet = quiet.trace.expect("a trace");
        assert!(quiet.len() < lines.len());
        assert!(!quiet.iter().any(|line| line.contains(" send ")));
        let untraced = pmnet_sim::chain::run_traced(seed, controlled, None);
        assert_eq!(untraced.trace_hash, first.trace_hash);
        assert!(untraced.trace.is_none());
    }
}

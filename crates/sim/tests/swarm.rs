//! The simulator's swarm, bounded for CI: many seeds, each with its own fault mix.
//!
//! `PMNET_SEED=N` replays one seed; `PMNET_SEEDS=K` sets how many (default 200). From the
//! command line, `pmnet sim --seed N` replays a seed with its readable trace and `pmnet sim
//! --seeds K` runs a swarm (see `docs/simulation.md`).

use pmnet_sim::vopr::{self, Options, SwarmSummary};

fn seeds() -> Vec<u64> {
    if let Ok(text) = std::env::var("PMNET_SEED") {
        return vec![text.trim().parse().expect("PMNET_SEED must be a u64")];
    }
    let count: u64 = std::env::var("PMNET_SEEDS")
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .unwrap_or(200);
    let base: u64 = rand::random();
    eprintln!("swarm: {count} seeds from {base} (replay one with PMNET_SEED=N)");
    (0..count).map(|index| base.wrapping_add(index)).collect()
}

#[test]
fn every_seed_keeps_the_invariants_and_converges() {
    let options = Options::default();
    let mut summary = SwarmSummary::default();
    for seed in seeds() {
        let report = vopr::run(seed, &options);
        // A client with a short request lifetime may fail everything under heavy faults;
        // a run that neither completed nor failed a request exercised nothing.
        assert!(
            report.requests_completed + report.faults.counts.requests_failed > 0,
            "seed {seed} completed nothing"
        );
        summary.add(&report);
    }
    for (name, value) in summary.lines() {
        eprintln!("{name:>48}  {value}");
    }
    // A swarm that never exercised a fault class proves nothing about it. Except the live
    // replicas' check: most seeds with replica servers lose their primaries until no replica
    // is left unpromoted, so a sample of 200 seeds (about 18 of them with replicas) may check
    // none; `regression_seeds_pass` asserts it on a seed that does, and the 10 000-seed runs
    // check thousands (docs/simulation.md).
    // The same for the controller's replica servers: about 18 seeds of 200 have them, and
    // lose a server about once each, so a sample may replace no primary or take no replica
    // out; `regression_seeds_pass` asserts a promotion, `tests/failover.rs` each case. And
    // the controller's rarer crashes (`CONTROLLER_CRASH_RARE`).
    if summary.seeds >= 100 {
        for (name, value) in summary.lines() {
            if name == REPLICAS_CHECKED
                || CONTROLLER_SERVER_LOSSES.contains(&name)
                || CONTROLLER_CRASH_RARE.contains(&name)
            {
                continue;
            }
            assert!(value > 0, "the swarm never exercised: {name}");
        }
    }
}

#[test]
fn the_same_seed_gives_the_same_trace() {
    // Several seeds: a nondeterminism (say, HashMap iteration order) may show only when two
    // or more sessions are waiting at once, which not every seed produces.
    let base: u64 = rand::random();
    eprintln!("seeds {base}.. (replay one with PMNET_SEED=N)");
    let options = Options::default();
    for seed in (0..8).map(|index| base.wrapping_add(index)) {
        let first = vopr::run(seed, &options);
        let second = vopr::run(seed, &options);
        assert_eq!(
            first.trace_hash, second.trace_hash,
            "seed {seed} is not deterministic"
        );
        assert_eq!(first.faults, second.faults, "seed {seed}");
        let other = vopr::run(seed.wrapping_add(1), &options);
        assert_ne!(
            first.trace_hash, other.trace_hash,
            "the trace hash ignores the run"
        );
    }
}

#[test]
fn the_same_seed_gives_the_same_readable_trace() {
    let seed: u64 = rand::random();
    eprintln!("PMNET_SEED={seed}");
    let options = Options {
        trace: true,
        ..Options::default()
    };
    let first = vopr::run(seed, &options);
    let second = vopr::run(seed, &options);
    let (Some(first_trace), Some(second_trace)) = (&first.trace, &second.trace) else {
        panic!("seed {seed}: no trace kept");
    };
    assert_eq!(first_trace.len(), second_trace.len(), "seed {seed}");
    for (index, (one, two)) in first_trace.iter().zip(second_trace).enumerate() {
        assert_eq!(one, two, "seed {seed}: the traces differ at line {index}");
    }
    assert_eq!(first.trace_hash, second.trace_hash);
    // What a reader needs is there: the seed's fault mix, datagrams by node name, the checks.
    let text = first_trace.join("\n");
    // Some client's sends (client0 may leave before it sends anything).
    assert!(
        first_trace
            .iter()
            .any(|line| line.contains("  client") && line.contains("  send ")),
        "seed {seed}: no client's send in the trace"
    );
    for needle in [
        &format!("seed {seed}:") as &str,
        " recv ",
        "liveness phase",
        "invariant 4",
        "invariant 5",
    ] {
        assert!(
            text.contains(needle),
            "seed {seed}: no {needle:?} in the trace"
        );
    }
    // Keeping the trace, with or without the datagram lines, does not change the run.
    let untraced = vopr::run(seed, &Options::default());
    assert_eq!(untraced.trace_hash, first.trace_hash);
    let quiet = vopr::run(
        seed,
        &Options {
            trace_datagrams: false,
            ..options
        },
    );
    assert_eq!(quiet.trace_hash, first.trace_hash);
    let quiet = quiet.trace.expect("a trace");
    assert!(quiet.len() < first_trace.len());
    assert!(quiet
        .iter()
        .all(|line| !line.contains(" send ") && !line.contains(" recv ")));
}

#[test]
fn a_broken_invariant_is_a_failure_with_its_trace() {
    // No run converges in no time: the liveness check fails, and try_run reports it. (Seed 4
    // has no sessions that come and go, whose seeds get more time than the bound.)
    let options = Options {
        liveness_bound: std::time::Duration::ZERO,
        requests_per_client: 100,
        safety_actions: 10,
        trace: true,
        ..Options::default()
    };
    let failure = vopr::try_run(4, &options).expect_err("no run converges in no time");
    assert_eq!(failure.seed, 4);
    assert!(
        failure.message.contains("not converged"),
        "{}",
        failure.message
    );
    assert!(failure
        .to_string()
        .contains("reproduce with: pmnet sim --seed 4"));
    assert_ne!(failure.trace_hash, 0);
    assert!(failure.faults.counts.datagrams_sent > 0);
    let trace = failure.trace.expect("the trace up to the failure");
    assert!(trace.last().is_some_and(|line| line.contains("FAILED")));
    let again = vopr::try_run(4, &options).expect_err("deterministic");
    assert_eq!(again.trace_hash, failure.trace_hash);
}

/// Seeds that once broke an invariant, replayed on every run. (A change to how the simulator
/// draws from its generator changes what a seed means; the seeds stay as extra coverage.)
const REGRESSION_SEEDS: &[(u64, &str)] = &[
    (
        16421769416951762298,
        "an entry that survived a crash in the middle of its write was re-acked after recovery; \
         the simulator's durability check had not counted recovered entries as durable",
    ),
    (
        5003476,
        "the attacker replayed an old cache read and then the server's old answer to it: the \
         device fetched on the replayed read and put the old value in its table (a fetch now \
         starts only on a read newer than every read of its session the device saw)",
    ),
    (
        5008724,
        "a session whose clients left, with many holes behind a device's paced resends: each \
         hole waited the whole fill delay from when the one before it closed (a gap's client \
         lifetime now counts from when a later number was first seen)",
    ),
    (
        7586376486489665401,
        "the same: holes closed one at a time, one fill delay each, past the liveness bound",
    ),
    (
        18285523636610048792,
        "a keyed write in three fragments whose first found no free log slot was forwarded \
         unordered: a cache fetch forwarded behind it was answered first and the old value \
         stayed cached after the write completed (an unlogged keyed write is now ordered like \
         a logged one)",
    ),
    (
        9840409879015492911,
        "the attacker replayed a device's probe with the server's own address as its source: \
         the server answered itself, its answer again, for ever (duplicated on the way: a storm \
         of 260 datagrams at once, the seed never ended). A probe's answer now carries ANSWER \
         and is never answered, and a world that handles a million events at one virtual time \
         fails as livelocked",
    ),
    (
        17766762147143074688,
        "devices in series: the first device logged and acked two updates that the second, its \
         log full, forwarded unlogged into a partition; the server asked only the second about \
         the gap and skipped the acked updates (a device now passes a fill query on to the \
         devices before it and answers once they did)",
    ),
    (
        17766762147143075045,
        "a client left with one fragment of a request lost and the device, restarted, forgot \
         when it saw the request: nothing dated the partly received number, so the server \
         asked about it every second for ever (a number received in part now dates itself)",
    ),
    (
        17766762147143078639,
        "the attacker replayed a device's genuine probe from a client's address: a device that \
         learned the devices before it from probes then passed every fill query on to the \
         client and waited for ever (they are configuration only now)",
    ),
    (
        2037821038193100801,
        "sessions that come and go: a server's table forgot a session its kv store still \
         recorded; the client, still running, answered a question about an old number with a \
         no-op fill and the store asserted (a store now refuses a stale number, applying \
         nothing)",
    ),
    (
        3309539842525432894,
        "sessions that come and go: a keyed write whose wait was given up at once (no room for \
         the session it waited for) was not handed on, and its session stalled for good",
    ),
    (
        7965994876265090280,
        "sessions that come and go: a device answered a hold query before the invalidation of \
         an entry it had freed was durable; a crash brought the entry back and its resend was \
         applied again by a server that had forgotten the session",
    ),
    (
        3803400000000004758,
        "devices in series: a request in flight when the first device was lost for good \
         completed with that device's ack counted towards the fewer acks then wanted, and was \
         lost with the next device lost (a changed path now forgets the acks gathered)",
    ),
    (
        3803400000000002128,
        "devices in series with sessions that come and go: a hold query arriving twice at \
         the last device was answered alone the second time, before the devices before it \
         answered, and a session one of them held was forgotten and its resend applied twice",
    ),
    (
        3803400000000005674,
        "devices in series with sessions that come and go: a request of three fragments \
         completed with its fragments acked by different devices, none holding it whole, and \
         a server asking about the number skipped it (a request is now logged only once a \
         device acked every fragment)",
    ),
    (
        5105500000000000561,
        "devices in series: an ack of a device lost for good, still on its way, counted towards \
         a request after the path changed (a client now ignores the acks of a device taken out \
         of its path)",
    ),
    (
        5105500000000003408,
        "the read cache: a keyed write issued while its session's wait was still noted left \
         the wait without its timer; the next write waiting on the same request then never \
         timed out, and two sessions waited on each other for ever",
    ),
    (
        8408800000000000730,
        "replica servers and the attacker: a replica's make-up server-ACK to its primary, \
         replayed to the client, completed a request the primary then skipped (what a primary \
         and its replicas send each other now carries REPLICA and the replica's number: \
         clients and devices refuse it, a primary counts an ack only for the replica it names)",
    ),
    (
        8408800000000000194,
        "replica servers and the attacker: a primary's forward to its replica, replayed to a \
         device, was logged, and the primary's make-up ACKs of it (stamped for the replica) \
         never freed the entry (devices now drop requests marked REPLICA, and a primary takes \
         no replica stamp)",
    ),
    (
        8408800000000002682,
        "replica servers with sessions that come and go: a replica forgot a session while \
         another kept copies of its requests, and once promoted sent them to it again, which \
         applied them twice (a primary now asks its replicas in its hold queries, and they give \
         their copies up before it answers; it answers a replica about a session it does not \
         remember only after asking its devices)",
    ),
    (
        10610100000000004122,
        "replica servers with sessions that come and go: a promoted primary told its replica \
         it held nothing of a session while its forward log still kept that session's requests \
         from its own time as a replica; restarted, it sent them again, and the replica, which \
         had forgotten the session, applied one twice (a primary now gives those copies up, \
         durably, before answering)",
    ),
    (
        4141000000000003545,
        "a session's gap never filled: the server's list of resolved gap ranges filled with \
         copies of ranges resolved round after round, and the range of the session's next \
         number was refused (the ranges now merge, and the highest goes when the list is full)",
    ),
    (
        3939000000000001788,
        "a cache read older than its session's completed write: a client's keyed write \
         replayed straight to the server changed the key behind the device's cache (a server \
         behind devices now drops a keyed write no device ordered)",
    ),
    (
        541961755546071115,
        "replica servers behind tables of two: a replica's fill query for a range that changed \
         was never answered, its primary keeping the round of the old range (a new range now \
         replaces it)",
    ),
    (
        4242000000000007505,
        "replica servers behind tables of two: the replica's table held a session its primary \
         had evicted, whose new request waited in a device for room at the primary; told the \
         session was held, the replica could not take in the primary's next request, which the \
         primary waited on (a primary now answers \"not held\" for a session it evicted itself)",
    ),
    (
        430353,
        "replica servers behind tables of two: a replica forgot a session on its primary's \
         word, and the primary's next forward, ordered after a request of that session, made \
         it known again with nothing of it applied; the primary, which had let the session go \
         too, answered the replica's fill queries \"held\", so the gap never closed, and a \
         session whose first request the primary waited on never found room at the replica (a \
         primary now asks its devices about a session it does not remember)",
    ),
    (
        424485,
        "devices in series under the controller, an attacker replaying archived datagrams: a \
         planner that refused statuses of boots it had seen before took a replayed status of a \
         boot it had never seen for the newest, then refused the device's real ones and took \
         the live device out (a status of any other boot is a restart again)",
    ),
    (
        424521,
        "the same as 424485, with the first device taken out",
    ),
    (
        424864,
        "replica servers under the controller, the primary lost for good and a replica \
         promoted: the attacker replayed a device's update to the spare, which logged it and \
         sent it to the lost primary for ever (a spare is sent the route now and forwards to \
         the chain's server)",
    ),
    (424385, "the same as 424864, the spare holding six entries"),
    (
        424531,
        "replica servers under the controller: the promoted primary lost for good just before \
         the liveness phase, which counted it converged before the last replica was promoted \
         (the world's fault: a lost primary is not converged until it is replaced)",
    ),
    (
        424397,
        "replica servers under the controller, which crashed right after saving a promotion: \
         restarted, it sent the chain's last device its route before the promoted replica had \
         taken its own; the device replayed its log to the replica, which applied it as a \
         server without replicas and acked it, and the other replica never held it (devices \
         and spares of a replicated chain are now sent the route only once its server runs \
         the plan)",
    ),
    (
        424331,
        "the same, a bypass answered by the replica not yet promoted, then lost with it",
    ),
];

/// The summary lines of the controller's crashes that a 200-seed sample may not exercise
/// (about 16 seeds have the fault): a crash right after a save needs a change of the plan
/// meanwhile, and a node lost while the controller is down a loss in its down time;
/// `tests/failover.rs` runs each case.
const CONTROLLER_CRASH_RARE: [&str; 2] = [
    "controller crashes right after a save (its routes never sent)",
    "devices and servers lost while the controller was down",
];

/// The summary line of the live replicas' check (invariant 6).
const REPLICAS_CHECKED: &str = "requests checked on live replicas";

/// The summary lines of the controller's replica servers lost, replaced and taken out.
const CONTROLLER_SERVER_LOSSES: [&str; 3] = [
    "replica servers lost for good",
    "primaries replaced by the controller (a replica promoted)",
    "replica servers taken out by the controller",
];

#[test]
fn regression_seeds_pass() {
    let options = Options::default();
    let mut summary = SwarmSummary::default();
    for (seed, what) in REGRESSION_SEEDS {
        eprintln!("regression seed {seed}: {what}");
        summary.add(&vopr::run(*seed, &options));
    }
    let checked = summary
        .lines()
        .into_iter()
        .find(|(name, _)| *name == REPLICAS_CHECKED)
        .map_or(0, |(_, value)| value);
    assert!(checked > 0, "no regression seed checked a live replica");
    let promoted = summary
        .lines()
        .into_iter()
        .find(|(name, _)| *name == CONTROLLER_SERVER_LOSSES[1])
        .map_or(0, |(_, value)| value);
    assert!(
        promoted > 0,
        "no regression seed had the controller promote a replica"
    );
}

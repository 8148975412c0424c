//! `pmnet sim`: the deterministic fault-injecting simulator (`crates/sim`) from the command line.
//!
//! `pmnet sim --seed N` replays one seed and prints its readable event trace, its trace hash,
//! the faults it exercised and PASS or FAIL. `pmnet sim --seeds K [--start-seed S]` runs a
//! swarm of seeds S, S+1, ... with a progress line on stderr, then prints the faults the swarm
//! exercised and every failure with the command that reproduces it. A failing seed does not
//! stop the swarm; the exit status is non-zero if any seed failed. `--chain-store` and `--abd`
//! run the chain store's and replicated memory's worlds instead (`sim/worlds.rs`); `--mix`
//! runs every world on each seed, with one summary. See `docs/simulation.md`.

pub mod worlds;

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::io::{self, IsTerminal, Write};
use std::panic::{self, PanicHookInfo};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Mutex};
use std::time::{Duration, Instant};

use clap::{value_parser, Args};
use pmnet_sim::vopr::{self, FaultSummary, Options, Report, SwarmSummary};

use crate::CliError;
use worlds::{MixOutcome, MixTotals, OtherWorld};

/// Seeds in a swarm when neither `--seed` nor `--seeds` is given (what CI runs).
const DEFAULT_SWARM: u64 = 200;

#[derive(Debug, Clone, Args)]
#[command(after_long_help = "Examples:\n  \
    pmnet sim --seed 42                  replay one seed with its event trace\n  \
    pmnet sim --seed 42 --quiet-trace    the same without the datagram lines\n  \
    pmnet sim --seeds 10000 --jobs 2     a swarm; prints its random start seed\n  \
    pmnet sim --seeds 500 --start-seed 7 seeds 7 to 506, reproducibly\n  \
    pmnet sim --chain-store --seeds 2000 the chain store's world\n  \
    pmnet sim --abd --seeds 2000 --jobs 2 the replicated memory's world (--seed N replays one)\n  \
    pmnet sim --mix --seeds 1000 --jobs 2 every world on each seed, one summary")]
pub struct SimArgs {
    /// Replay one seed: print its event trace, trace hash, fault summary and PASS or FAIL.
    #[arg(long, value_name = "N", conflicts_with_all = ["seeds", "start_seed", "jobs"])]
    pub seed: Option<u64>,

    /// Run a swarm of K seeds (200 when neither --seed nor --seeds is given).
    #[arg(long, value_name = "K", value_parser = value_parser!(u64).range(1..))]
    pub seeds: Option<u64>,

    /// First seed of the swarm (default: random, and printed); the swarm runs S, S+1, ...
    #[arg(long, value_name = "S")]
    pub start_seed: Option<u64>,

    /// Requests each client issues in a run.
    #[arg(
        long,
        value_name = "N",
        default_value_t = Options::default().requests_per_client,
        value_parser = value_parser!(u32).range(1..=1_000_000)
    )]
    pub requests_per_client: u32,

    /// Actions (requests, faults, network steps) in a run's safety phase.
    #[arg(
        long,
        value_name = "N",
        default_value_t = Options::default().safety_actions,
        value_parser = value_parser!(u32).range(0..=100_000_000)
    )]
    pub safety_actions: u32,

    /// Virtual seconds the liveness phase may take to converge once the faults are healed
    /// (seeds whose sessions come and go through small tables get more: docs/simulation.md).
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = Options::default().liveness_bound.as_secs(),
        value_parser = value_parser!(u64).range(1..=1_000_000)
    )]
    pub liveness_bound: u64,

    /// With --seed: leave the datagram lines (every send and receive) out of the trace.
    #[arg(long, requires = "seed", conflicts_with = "no_trace")]
    pub quiet_trace: bool,

    /// With --seed: print no trace, only the trace hash, fault summary and PASS or FAIL.
    #[arg(long, requires = "seed")]
    pub no_trace: bool,

    /// Simulate the chain store instead (NetChain members, their controller and clients:
    /// crashes, a member lost for good, partitions, controller restarts; docs/simulation.md).
    #[arg(long, conflicts_with_all = ["requests_per_client", "safety_actions", "liveness_bound"])]
    pub chain_store: bool,

    /// With --chain-store: the fixed chains of `pmnet kv --chain-member` (no controller;
    /// member crashes only) instead of chains the controller configures.
    #[arg(long, requires = "chain_store")]
    pub fixed_chains: bool,

    /// Simulate replicated memory instead (ABD memory nodes, a coordinating device with its
    /// clients and client-driven coordinators: node crashes, memory lost for good, partitions,
    /// device restarts; docs/simulation.md).
    #[arg(long, conflicts_with_all = ["chain_store", "requests_per_client", "safety_actions", "liveness_bound"])]
    pub abd: bool,

    /// Run every world on each seed N: the main world's seed N (with the options above), the
    /// chain store's (its controller on even seeds, the fixed chains on odd ones) and
    /// replicated memory's; one summary with each world's fault classes.
    #[arg(long, conflicts_with_all = ["chain_store", "abd"])]
    pub mix: bool,

    /// Threads running the seeds of a swarm; the results do not depend on it.
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = value_parser!(u32).range(1..=1024))]
    pub jobs: u32,
}

impl SimArgs {
    fn options(&self) -> Options {
        Options {
            requests_per_client: self.requests_per_client,
            safety_actions: self.safety_actions,
            liveness_bound: Duration::from_secs(self.liveness_bound),
            trace: self.seed.is_some() && !self.no_trace,
            trace_datagrams: !self.quiet_trace,
        }
    }
}

pub fn run(args: SimArgs) -> Result<ExitCode, CliError> {
    let other = match (args.chain_store, args.fixed_chains, args.abd) {
        (true, false, _) => Some(OtherWorld::ChainStore),
        (true, true, _) => Some(OtherWorld::FixedChains),
        (false, _, true) => Some(OtherWorld::Abd),
        (false, _, false) => None,
    };
    if let Some(world) = other {
        let trace = (!args.no_trace).then_some(!args.quiet_trace);
        return Ok(worlds::run(
            world,
            args.seed.map(|seed| (seed, trace)),
            args.seeds.unwrap_or(DEFAULT_SWARM),
            args.start_seed,
            args.jobs,
        ));
    }
    let options = args.options();
    let mut out = io::BufWriter::new(io::stdout().lock());
    let (passed, written) = match args.seed {
        Some(seed) => {
            let outcome = run_one(seed, &options, args.mix);
            let written = print_seed(&outcome, &options, &mut out);
            (outcome.passed(), written)
        }
        None => {
            let count = args.seeds.unwrap_or(DEFAULT_SWARM);
            let (start, chosen) = match args.start_seed {
                Some(start) => (start, "given"),
                None => (rand::random(), "random"),
            };
            let plan = SwarmPlan {
                start,
                count,
                jobs: args.jobs,
                mix: args.mix,
            };
            let mix = if args.mix { " --mix" } else { "" };
            let header = writeln!(
                out,
                "pmnet sim{mix}: {count} seeds from {start} ({chosen} start seed; repeat this \
                 swarm with{mix} --seeds {count} --start-seed {start})\n{}",
                describe_options(&options, args.jobs)
            )
            .and_then(|()| out.flush());
            let mut progress = Progress::new(count);
            let started = Instant::now();
            let swarm = run_swarm(&plan, &options, |done, failed| {
                progress.update(done, failed)
            });
            progress.finish(
                swarm.passed.seeds + swarm.failures.len() as u64,
                swarm.failed_seeds(),
            );
            let written =
                header.and_then(|()| print_swarm(&swarm, &options, started.elapsed(), &mut out));
            (swarm.failed_seeds() == 0, written)
        }
    };
    if let Err(error) = written.and_then(|()| out.flush()) {
        // `pmnet sim ... | head` closes the pipe early: not an error of the simulation.
        if error.kind() != io::ErrorKind::BrokenPipe {
            return Err(format!("writing the results: {error}").into());
        }
    }
    Ok(if passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn describe_options(options: &Options, jobs: u32) -> String {
    format!(
        "{} requests per client, {} safety actions, liveness bound {:?}, {jobs} job{}",
        options.requests_per_client,
        options.safety_actions,
        options.liveness_bound,
        if jobs == 1 { "" } else { "s" }
    )
}

/// The command that replays `seed` with `options` (the options only when not the defaults).
fn reproduce_command(seed: u64, options: &Options) -> String {
    let defaults = Options::default();
    let mut command = vopr::reproduce_command(seed);
    if options.requests_per_client != defaults.requests_per_client {
        command.push_str(&format!(
            " --requests-per-client {}",
            options.requests_per_client
        ));
    }
    if options.safety_actions != defaults.safety_actions {
        command.push_str(&format!(" --safety-actions {}", options.safety_actions));
    }
    if options.liveness_bound != defaults.liveness_bound {
        command.push_str(&format!(
            " --liveness-bound {}",
            options.liveness_bound.as_secs()
        ));
    }
    command
}

/// One seed's result, with where it panicked when it failed.
#[derive(Debug, Clone)]
struct Outcome {
    seed: u64,
    result: Result<Report, Box<vopr::Failure>>,
    /// `file:line:column` of the panic that broke the run.
    panicked_at: Option<String>,
    /// With `--mix`: the seed's other worlds.
    others: Option<MixOutcome>,
}

impl Outcome {
    /// Whether every world run on the seed passed.
    fn passed(&self) -> bool {
        self.result.is_ok() && self.others.as_ref().is_none_or(MixOutcome::passed)
    }
}

thread_local! {
    /// Where the first panic on this thread since the last `take` happened.
    static PANICKED_AT: RefCell<Option<String>> = const { RefCell::new(None) };
}

type PanicHook = Box<dyn Fn(&PanicHookInfo<'_>) + Sync + Send + 'static>;

/// Users of the quiet panic hook, and the hook it replaced (restored when the last one goes).
static QUIET_HOOK: Mutex<(usize, Option<PanicHook>)> = Mutex::new((0, None));

/// While alive, panics print nothing; their location is kept for the failure report. A run
/// that breaks an invariant panics, and `vopr::try_run` turns that into a `Failure`.
struct QuietPanics;

impl QuietPanics {
    fn install() -> QuietPanics {
        let mut state = QUIET_HOOK
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        if state.0 == 0 {
            state.1 = Some(panic::take_hook());
            panic::set_hook(Box::new(|info| {
                let location = info.location().map(|location| location.to_string());
                PANICKED_AT.with(|slot| {
                    slot.borrow_mut()
                        .get_or_insert_with(|| location.unwrap_or_default());
                });
            }));
        }
        state.0 += 1;
        QuietPanics
    }
}

impl Drop for QuietPanics {
    fn drop(&mut self) {
        let mut state = QUIET_HOOK
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        state.0 -= 1;
        if state.0 == 0 && !std::thread::panicking() {
            if let Some(previous) = state.1.take() {
                panic::set_hook(previous);
            }
        }
    }
}

fn run_one(seed: u64, options: &Options, mix: bool) -> Outcome {
    let _quiet = QuietPanics::install();
    PANICKED_AT.with(|slot| slot.borrow_mut().take());
    let result = vopr::try_run(seed, options);
    let panicked_at = PANICKED_AT
        .with(|slot| slot.borrow_mut().take())
        .filter(|_| result.is_err());
    Outcome {
        seed,
        result,
        panicked_at,
        others: mix.then(|| MixOutcome::run(seed)),
    }
}

fn describe_mix(faults: &FaultSummary) -> String {
    format!(
        "{} client{}, {} device{}, {} server{}; loss {:.1}%, duplication {:.1}%, delay spread \
         0-{} us, corruption in flight {:.2}%",
        faults.client_count,
        plural(faults.client_count),
        faults.device_count,
        plural(faults.device_count),
        faults.server_count,
        plural(faults.server_count),
        faults.loss * 100.0,
        faults.duplicate * 100.0,
        faults.jitter_us,
        faults.corrupt * 100.0
    )
}

fn plural(count: usize) -> &'static str {
    if count == 1 {
        ""
    } else {
        "s"
    }
}

/// `pmnet sim --seed N`: the trace, the trace hash, the fault summary, PASS or FAIL.
fn print_seed(outcome: &Outcome, options: &Options, out: &mut impl Write) -> io::Result<()> {
    let seed = outcome.seed;
    writeln!(
        out,
        "pmnet sim --seed {seed}: {}",
        describe_options(options, 1)
    )?;
    let (trace, trace_hash, faults) = match &outcome.result {
        Ok(report) => (&report.trace, report.trace_hash, &report.faults),
        Err(failure) => (&failure.trace, failure.trace_hash, &failure.faults),
    };
    if let Some(trace) = trace {
        writeln!(out, "{:>16}  {:<8} event", "virtual time", "node")?;
        for line in trace {
            writeln!(out, "{line}")?;
        }
    }
    writeln!(out)?;
    let until = if outcome.result.is_ok() {
        ""
    } else {
        " (up to the failure)"
    };
    writeln!(out, "trace hash{until}  {trace_hash:08x}")?;
    writeln!(
        out,
        "fault summary, seed {seed}{until}: {}",
        describe_mix(faults)
    )?;
    for (name, value) in faults.counts.lines() {
        writeln!(out, "{name:>48}  {value}")?;
    }
    match &outcome.result {
        Ok(report) => {
            writeln!(
                out,
                "{:>48}  {}",
                "requests completed", report.requests_completed
            )?;
            writeln!(
                out,
                "{:>48}  {:?}",
                "virtual time to converge once healed", report.virtual_time_to_converge
            )?;
            writeln!(out, "PASS seed {seed}")?;
        }
        Err(failure) => {
            writeln!(
                out,
                "FAIL seed {seed}: {}",
                describe_failure(outcome, failure)
            )?;
            writeln!(out, "reproduce with: {}", reproduce_command(seed, options))?;
        }
    }
    match &outcome.others {
        Some(others) => others.print(seed, out),
        None => Ok(()),
    }
}

fn describe_failure(outcome: &Outcome, failure: &vopr::Failure) -> String {
    match &outcome.panicked_at {
        Some(at) if !at.is_empty() => format!("{} (panicked at {at})", failure.message),
        _ => failure.message.clone(),
    }
}

/// Which seeds a swarm runs, on how many threads.
#[derive(Debug, Clone)]
struct SwarmPlan {
    start: u64,
    count: u64,
    jobs: u32,
    /// Run every world on each seed.
    mix: bool,
}

/// What a swarm found: the totals of the seeds that passed, and every failure, in seed order.
#[derive(Debug, Clone, Default)]
struct SwarmResult {
    passed: SwarmSummary,
    failures: Vec<Outcome>,
    /// With `--mix`: the other worlds' totals and failures.
    others: MixTotals,
}

impl SwarmResult {
    /// Seeds that failed in some world.
    fn failed_seeds(&self) -> usize {
        let mut seeds: Vec<u64> = self.failures.iter().map(|outcome| outcome.seed).collect();
        seeds.extend(self.others.failures.iter().map(|(seed, ..)| *seed));
        seeds.sort_unstable();
        seeds.dedup();
        seeds.len()
    }
}

/// Run the seeds of `plan` on `plan.jobs` threads; `progress(done, failed)` is called on this
/// thread after each seed and a few times a second. Seeds are counted in in seed order, so the
/// result does not depend on the number of threads.
fn run_swarm(
    plan: &SwarmPlan,
    options: &Options,
    mut progress: impl FnMut(u64, usize),
) -> SwarmResult {
    let mut result = SwarmResult::default();
    let next = AtomicU64::new(0);
    let (sender, receiver) = mpsc::channel::<(u64, Outcome)>();
    std::thread::scope(|scope| {
        for _ in 0..plan.jobs {
            let sender = sender.clone();
            let next = &next;
            scope.spawn(move || loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                if index >= plan.count {
                    break;
                }
                let outcome = run_one(plan.start.wrapping_add(index), options, plan.mix);
                if sender.send((index, outcome)).is_err() {
                    break;
                }
            });
        }
        drop(sender);
        // Results arrive in any order; fold them in in seed order, keeping only the few that
        // arrived ahead of the next one.
        let mut waiting: BTreeMap<u64, Outcome> = BTreeMap::new();
        let mut folded = 0;
        let mut done = 0;
        loop {
            match receiver.recv_timeout(Duration::from_millis(100)) {
                Ok((index, outcome)) => {
                    done += 1;
                    waiting.insert(index, outcome);
                    while let Some(outcome) = waiting.remove(&folded) {
                        if let Some(others) = &outcome.others {
                            result.others.add(outcome.seed, others);
                        }
                        match &outcome.result {
                            Ok(report) => result.passed.add(report),
                            Err(_) => result.failures.push(outcome),
                        }
                        folded += 1;
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
            let failed = result.failed_seeds()
                + waiting.values().filter(|outcome| !outcome.passed()).count();
            progress(done, failed);
        }
    });
    result
}

/// The progress line of a swarm on stderr: in place on a terminal, at most four times a
/// second; otherwise a line every ten seconds.
struct Progress {
    total: u64,
    started: Instant,
    last: Option<Instant>,
    terminal: bool,
}

impl Progress {
    fn new(total: u64) -> Progress {
        Progress {
            total,
            started: Instant::now(),
            last: None,
            terminal: io::stderr().is_terminal(),
        }
    }

    fn line(&self, done: u64, failed: usize) -> String {
        let elapsed = self.started.elapsed();
        let rate = done as f64 / elapsed.as_secs_f64().max(1e-9);
        let eta = if done == 0 {
            "?".to_string()
        } else {
            format_duration(Duration::from_secs_f64(
                (self.total - done) as f64 / rate.max(1e-9),
            ))
        };
        format!(
            "seeds {done}/{} ({:.1}%)  {rate:.1} seeds/s  failures {failed}  elapsed {}  ETA {eta}",
            self.total,
            100.0 * done as f64 / self.total.max(1) as f64,
            format_duration(elapsed),
        )
    }

    fn update(&mut self, done: u64, failed: usize) {
        let interval = if self.terminal {
            Duration::from_millis(250)
        } else {
            Duration::from_secs(10)
        };
        let now = Instant::now();
        let due = self.last.is_none_or(|last| now - last >= interval);
        if !due || done == self.total {
            return;
        }
        self.last = Some(now);
        let line = self.line(done, failed);
        let mut stderr = io::stderr().lock();
        let _ = if self.terminal {
            write!(stderr, "\r\x1b[K{line}")
        } else {
            writeln!(stderr, "{line}")
        };
        let _ = stderr.flush();
    }

    fn finish(&mut self, done: u64, failed: usize) {
        let line = self.line(done, failed);
        let mut stderr = io::stderr().lock();
        let _ = if self.terminal {
            writeln!(stderr, "\r\x1b[K{line}")
        } else {
            writeln!(stderr, "{line}")
        };
    }
}

fn format_duration(duration: Duration) -> String {
    let seconds = duration.as_secs();
    if seconds >= 3600 {
        format!("{}h{:02}m", seconds / 3600, seconds % 3600 / 60)
    } else if seconds >= 60 {
        format!("{}m{:02}s", seconds / 60, seconds % 60)
    } else {
        format!("{:.1}s", duration.as_secs_f64())
    }
}

/// The end of a swarm: the faults exercised, the failures with their commands, PASS or FAIL.
fn print_swarm(
    swarm: &SwarmResult,
    options: &Options,
    wall_time: Duration,
    out: &mut impl Write,
) -> io::Result<()> {
    let failed = swarm.failed_seeds() as u64;
    let total = swarm.passed.seeds + swarm.failures.len() as u64;
    writeln!(out)?;
    if failed == 0 {
        writeln!(out, "faults exercised ({total} seeds):")?;
    } else {
        writeln!(
            out,
            "faults exercised by the {} seeds that passed:",
            swarm.passed.seeds
        )?;
    }
    // A swarm of 100 seeds or more exercises every class; flag one it missed.
    for (name, value) in swarm.passed.lines() {
        let missed = if value == 0 && swarm.passed.seeds >= 100 {
            "  (never exercised)"
        } else {
            ""
        };
        writeln!(out, "{name:>48}  {value}{missed}")?;
    }
    if swarm.others.ran() {
        swarm.others.print(out)?;
    }
    writeln!(out)?;
    writeln!(
        out,
        "wall time {} ({:.1} ms a seed)",
        format_duration(wall_time),
        wall_time.as_secs_f64() * 1000.0 / total.max(1) as f64
    )?;
    if failed == 0 {
        writeln!(out, "failures: none")?;
        writeln!(out, "PASS: {total} seeds, every invariant held")?;
        return Ok(());
    }
    writeln!(out, "failures: {failed} of {total} seeds")?;
    if !swarm.others.failures.is_empty() {
        writeln!(out, "  (those of the other worlds are listed above)")?;
    }
    for outcome in &swarm.failures {
        if let Err(failure) = &outcome.result {
            let message = describe_failure(outcome, failure);
            // The message ends with vopr's own reproduction line; print ours instead.
            let message = message
                .split("\nreproduce with:")
                .next()
                .unwrap_or(&message)
                .replace('\n', "\n      ");
            writeln!(out, "  seed {}: {message}", outcome.seed)?;
            writeln!(
                out,
                "    reproduce with: {}",
                reproduce_command(outcome.seed, options)
            )?;
        }
    }
    writeln!(out, "FAIL: {failed} of {total} seeds broke an invariant")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    /// Small runs, so that the tests are quick in debug builds.
    fn small() -> Options {
        Options {
            requests_per_client: 8,
            safety_actions: 300,
            ..Options::default()
        }
    }

    fn printed(seed: u64, options: &Options) -> String {
        let mut out = Vec::new();
        print_seed(&run_one(seed, options, false), options, &mut out).expect("print to a Vec");
        String::from_utf8(out).expect("utf-8")
    }

    #[test]
    fn a_seed_prints_the_same_trace_every_time() {
        let seed: u64 = rand::random();
        eprintln!("seed {seed}");
        let options = Options {
            trace: true,
            ..small()
        };
        let first = printed(seed, &options);
        assert_eq!(first, printed(seed, &options), "seed {seed}");
        assert!(first.contains("trace hash"), "{first}");
        assert!(first.contains(&format!("PASS seed {seed}")), "{first}");
        assert!(first.contains(" send "), "datagram lines: {first}");
        assert!(first.contains("invariant 4"), "checks: {first}");
        let quiet = printed(
            seed,
            &Options {
                trace_datagrams: false,
                ..options.clone()
            },
        );
        assert!(!quiet.contains(" send "), "{quiet}");
        let hash = |text: &str| {
            text.lines()
                .find(|line| line.starts_with("trace hash"))
                .map(str::to_string)
        };
        assert_eq!(hash(&first), hash(&quiet), "--quiet-trace changes the run");
    }

    #[test]
    fn a_swarm_gives_the_same_result_on_any_number_of_threads() {
        let start: u64 = rand::random();
        eprintln!("start seed {start}");
        let options = small();
        let run = |jobs| {
            let plan = SwarmPlan {
                start,
                count: 6,
                jobs,
                mix: false,
            };
            run_swarm(&plan, &options, |_, _| {})
        };
        let one = run(1);
        let three = run(3);
        assert_eq!(one.passed, three.passed);
        assert_eq!(one.passed.seeds + one.failures.len() as u64, 6);
        let seeds = |swarm: &SwarmResult| -> Vec<u64> {
            swarm.failures.iter().map(|outcome| outcome.seed).collect()
        };
        assert_eq!(seeds(&one), seeds(&three));
        assert!(one.failures.is_empty(), "{:?}", one.failures);
    }

    #[test]
    fn a_failing_seed_is_reported_not_fatal() {
        // A liveness bound no run can meet breaks the convergence invariant on every seed (of
        // those without sessions that come and go, which get more time: seeds 4 and 5).
        let options = Options {
            liveness_bound: Duration::ZERO,
            requests_per_client: 200,
            safety_actions: 10,
            ..small()
        };
        let plan = SwarmPlan {
            start: 4,
            count: 2,
            jobs: 2,
            mix: false,
        };
        let swarm = run_swarm(&plan, &options, |_, _| {});
        assert_eq!(swarm.failures.len(), 2);
        assert_eq!(swarm.failures[0].seed, 4);
        let mut out = Vec::new();
        print_swarm(&swarm, &options, Duration::from_secs(1), &mut out).expect("print");
        let out = String::from_utf8(out).expect("utf-8");
        assert!(out.contains("reproduce with: pmnet sim --seed 4 "), "{out}");
        assert!(out.contains("FAIL: 2 of 2 seeds"), "{out}");
        assert!(out.contains("not converged"), "{out}");
        let outcome = run_one(
            5,
            &Options {
                trace: true,
                ..options
            },
            false,
        );
        let mut out = Vec::new();
        print_seed(&outcome, &options, &mut out).expect("print");
        let out = String::from_utf8(out).expect("utf-8");
        assert!(out.contains("FAIL seed 5"), "{out}");
        assert!(out.contains("check    FAILED"), "{out}");
    }

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: SimArgs,
    }

    #[test]
    fn bad_options_are_errors_not_panics() {
        for argv in [
            &["sim", "--seed", "-1"][..],
            &["sim", "--seed", "x"],
            &["sim", "--seed", "1", "--seeds", "2"],
            &["sim", "--seeds", "0"],
            &["sim", "--seeds", "10", "--jobs", "0"],
            &["sim", "--no-trace"],
            &["sim", "--seed", "1", "--no-trace", "--quiet-trace"],
            &["sim", "--requests-per-client", "0"],
            &["sim", "--liveness-bound", "0"],
            &["sim", "--seed", "18446744073709551616"],
            &["sim", "--abd", "--chain-store"],
            &["sim", "--abd", "--safety-actions", "10"],
            &["sim", "--mix", "--abd"],
            &["sim", "--mix", "--chain-store"],
            &["sim", "--abd", "--quiet-trace"],
            &[
                "sim",
                "--chain-store",
                "--seed",
                "1",
                "--no-trace",
                "--quiet-trace",
            ],
        ] {
            assert!(Cli::try_parse_from(argv).is_err(), "{argv:?} parsed");
        }
        let cli = Cli::try_parse_from(["sim", "--seed", "18446744073709551615"]).expect("parse");
        assert_eq!(cli.args.seed, Some(u64::MAX));
        let cli = Cli::try_parse_from([
            "sim",
            "--seeds",
            "3",
            "--start-seed",
            "18446744073709551615",
        ])
        .expect("parse");
        assert_eq!(cli.args.options().requests_per_client, 60);
        let cli = Cli::try_parse_from(["sim", "--abd", "--seeds", "5", "--start-seed", "7"])
            .expect("parse");
        assert!(cli.args.abd && !cli.args.chain_store);
        assert_eq!((cli.args.seeds, cli.args.start_seed), (Some(5), Some(7)));
        for trace in ["--quiet-trace", "--no-trace"] {
            let cli =
                Cli::try_parse_from(["sim", "--chain-store", "--seed", "3", trace]).expect("parse");
            assert!(cli.args.chain_store && cli.args.seed == Some(3));
            let cli = Cli::try_parse_from(["sim", "--abd", "--seed", "3", trace]).expect("parse");
            assert!(cli.args.abd && (cli.args.quiet_trace || cli.args.no_trace));
        }
        let cli =
            Cli::try_parse_from(["sim", "--mix", "--seed", "3", "--no-trace"]).expect("parse");
        assert!(cli.args.mix && !cli.args.abd && !cli.args.chain_store);
    }

    #[test]
    fn a_mix_runs_every_world_on_each_seed() {
        let start: u64 = rand::random::<u64>() >> 1;
        eprintln!("start seed {start}");
        let plan = SwarmPlan {
            start,
            count: 2,
            jobs: 2,
            mix: true,
        };
        let swarm = run_swarm(&plan, &small(), |_, _| {});
        assert_eq!(
            swarm.failed_seeds(),
            0,
            "{:?} {:?}",
            swarm.failures,
            swarm.others.failures
        );
        assert_eq!(swarm.passed.seeds, 2);
        assert_eq!((swarm.others.chain_seeds, swarm.others.abd_seeds), (2, 2));
        assert!(swarm.others.chain.completed > 0 && swarm.others.abd.completed > 0);
        let mut out = Vec::new();
        print_swarm(&swarm, &small(), Duration::from_secs(1), &mut out).expect("print");
        let out = String::from_utf8(out).expect("utf-8");
        assert!(
            out.contains("replicated memory's world (--abd), 2 seeds passed"),
            "{out}"
        );
        assert!(out.contains("controller restarts"), "{out}");
        assert!(out.contains("PASS: 2 seeds"), "{out}");
    }
}

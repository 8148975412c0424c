//! The chain store's and replicated memory's worlds in `pmnet sim`: one seed or a swarm of
//! one of them (`--chain-store [--fixed-chains]`, `--abd`), and the seeds of both that `--mix`
//! runs beside each seed of the main world. Each world's report type says how it adds up and
//! what its fault classes are ([`WorldReport`], in `sim_chain.rs` and `sim_abd.rs`).

use std::io::{self, Write};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use pmnet_sim::abd::AbdReport;
use pmnet_sim::chain::ChainReport;
use pmnet_sim::TracedRun;

/// A world besides the main one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OtherWorld {
    /// The chain store with its controller (`--chain-store`).
    ChainStore,
    /// The chain store's fixed chains (`--chain-store --fixed-chains`).
    FixedChains,
    /// Replicated memory (`--abd`).
    Abd,
}

impl OtherWorld {
    /// The options of `pmnet sim` that select this world.
    pub fn flags(self) -> &'static str {
        match self {
            OtherWorld::ChainStore => "--chain-store",
            OtherWorld::FixedChains => "--chain-store --fixed-chains",
            OtherWorld::Abd => "--abd",
        }
    }

    /// The chain store's world `--mix` runs for `seed`: with the controller on even seeds,
    /// the fixed chains on odd ones.
    pub fn chain_for(seed: u64) -> OtherWorld {
        if seed % 2 == 0 {
            OtherWorld::ChainStore
        } else {
            OtherWorld::FixedChains
        }
    }

    fn run_chain(self, seed: u64) -> Result<ChainReport, String> {
        let run = match self {
            OtherWorld::FixedChains => pmnet_sim::chain::run_seed_fixed,
            _ => pmnet_sim::chain::run_seed,
        };
        caught(run, seed)
    }
}

/// What a world's seed reports, and a swarm's totals of them.
pub trait WorldReport: Default + Clone + Send + std::fmt::Debug {
    fn add(&mut self, other: &Self);
    /// The totals of `passed` seeds in a sentence.
    fn summary(&self, passed: u64) -> String;
    /// The totals' fault classes and what the world did, a line each in a coverage report.
    fn coverage(&self) -> Vec<(&'static str, u64)>;
}

/// Run `seed` of `world` with its trace (`Some(false)`: without the datagram lines; `None`:
/// only its hash), or `count` seeds from `start` (random when not given, and printed).
pub fn run(
    world: OtherWorld,
    seed: Option<(u64, Option<bool>)>,
    count: u64,
    start: Option<u64>,
    jobs: u32,
) -> ExitCode {
    if let Some((seed, trace)) = seed {
        return match world {
            OtherWorld::Abd => print_seed(world, seed, || pmnet_sim::abd::run_traced(seed, trace)),
            OtherWorld::ChainStore => print_seed(world, seed, || {
                pmnet_sim::chain::run_traced(seed, true, trace)
            }),
            OtherWorld::FixedChains => print_seed(world, seed, || {
                pmnet_sim::chain::run_traced(seed, false, trace)
            }),
        };
    }
    match world {
        OtherWorld::Abd => run_world(world, pmnet_sim::abd::run_seed, count, start, jobs),
        OtherWorld::ChainStore => run_world(world, pmnet_sim::chain::run_seed, count, start, jobs),
        OtherWorld::FixedChains => {
            run_world(world, pmnet_sim::chain::run_seed_fixed, count, start, jobs)
        }
    }
}

/// `pmnet sim --chain-store --seed N` (or `--abd`): the seed's trace as the main world's
/// (`<virtual time> <node> <event>`), its trace hash, its report and PASS or FAIL.
fn print_seed<R: WorldReport>(
    world: OtherWorld,
    seed: u64,
    traced: impl FnOnce() -> TracedRun<R> + std::panic::UnwindSafe,
) -> ExitCode {
    let flags = world.flags();
    let run = std::panic::catch_unwind(traced).unwrap_or_else(|panic| TracedRun {
        result: Err(format!("seed {seed}: panicked: {}", panic_message(&*panic))),
        trace_hash: 0,
        trace: None,
    });
    let mut out = io::BufWriter::new(io::stdout().lock());
    let written = write_seed(&mut out, flags, seed, &run).and_then(|()| out.flush());
    match (&run.result, written) {
        (Ok(_), Ok(())) => ExitCode::SUCCESS,
        (Err(_), _) => ExitCode::FAILURE,
        // Output cut short (a closed pipe): nothing more to say.
        (Ok(_), Err(_)) => ExitCode::FAILURE,
    }
}

fn write_seed<R: WorldReport>(
    out: &mut impl Write,
    flags: &str,
    seed: u64,
    run: &TracedRun<R>,
) -> io::Result<()> {
    writeln!(out, "pmnet sim {flags} --seed {seed}")?;
    if let Some(trace) = &run.trace {
        writeln!(out, "{:>16}  {:<8} event", "virtual time", "node")?;
        for line in trace {
            writeln!(out, "{line}")?;
        }
    }
    writeln!(out)?;
    let until = if run.result.is_ok() {
        ""
    } else {
        " (up to the failure)"
    };
    writeln!(out, "trace hash{until}  {:08x}", run.trace_hash)?;
    match &run.result {
        Ok(report) => {
            write_counts(out, &report.coverage(), false)?;
            writeln!(out, "PASS seed {seed}")
        }
        Err(error) => writeln!(
            out,
            "{error}\nFAIL seed {seed}\nreproduce with: pmnet sim {flags} --seed {seed}"
        ),
    }
}

fn run_world<R: WorldReport>(
    world: OtherWorld,
    runner: fn(u64) -> Result<R, String>,
    count: u64,
    start: Option<u64>,
    jobs: u32,
) -> ExitCode {
    let flags = world.flags();
    let (start, chosen) = match start {
        Some(start) => (start, "given"),
        None => (rand::random::<u64>() >> 1, "random"),
    };
    println!(
        "pmnet sim {flags}: {count} seeds from {start} ({chosen} start seed; repeat this \
         swarm with {flags} --seeds {count} --start-seed {start})"
    );
    let next = AtomicU64::new(0);
    let totals = Mutex::new((R::default(), 0u64, 0u64));
    std::thread::scope(|scope| {
        for _ in 0..jobs.max(1) {
            scope.spawn(|| loop {
                let at = next.fetch_add(1, Ordering::Relaxed);
                if at >= count {
                    break;
                }
                let result = caught(runner, start.wrapping_add(at));
                let mut totals = totals.lock().expect("no panic holds it");
                match result {
                    Ok(report) => {
                        totals.0.add(&report);
                        totals.1 += 1;
                    }
                    Err(error) => {
                        println!("FAIL {error}");
                        totals.2 += 1;
                    }
                }
                let done = totals.1 + totals.2;
                if done % 100 == 0 || done == count {
                    eprintln!("  {done}/{count} seeds, {} failed", totals.2);
                }
            });
        }
    });
    let (sum, passed, failed) = totals.into_inner().expect("no panic holds it");
    println!("{}", sum.summary(passed));
    if failed == 0 {
        println!("PASS");
        ExitCode::SUCCESS
    } else {
        println!(
            "{failed} seeds failed (each printed above as FAIL); replay one with: pmnet sim \
             {flags} --seed N"
        );
        ExitCode::FAILURE
    }
}

/// One seed, a panic in it reported as its failure.
fn caught<R>(runner: fn(u64) -> Result<R, String>, seed: u64) -> Result<R, String> {
    std::panic::catch_unwind(|| runner(seed))
        .unwrap_or_else(|panic| Err(format!("seed {seed}: panicked: {}", panic_message(&*panic))))
}

/// What a panic said.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|text| (*text).to_owned()))
        .unwrap_or_default()
}

/// What `--mix` runs for a seed besides the main world: the chain store's world
/// ([`OtherWorld::chain_for`]) and replicated memory's.
#[derive(Debug, Clone)]
pub struct MixOutcome {
    pub chain_world: OtherWorld,
    pub chain: Result<ChainReport, String>,
    pub abd: Result<AbdReport, String>,
}

impl MixOutcome {
    pub fn run(seed: u64) -> MixOutcome {
        let chain_world = OtherWorld::chain_for(seed);
        MixOutcome {
            chain_world,
            chain: chain_world.run_chain(seed),
            abd: caught(pmnet_sim::abd::run_seed, seed),
        }
    }

    pub fn passed(&self) -> bool {
        self.chain.is_ok() && self.abd.is_ok()
    }

    /// `pmnet sim --mix --seed N`: each world's report, PASS or FAIL.
    pub fn print(&self, seed: u64, out: &mut impl Write) -> io::Result<()> {
        let verdict = |ok: bool| if ok { "PASS" } else { "FAIL" };
        writeln!(out)?;
        match &self.chain {
            Ok(report) => {
                writeln!(out, "chain store ({}):", self.chain_world.flags())?;
                write_counts(out, &report.coverage(), false)?;
            }
            Err(error) => writeln!(out, "chain store ({}): {error}", self.chain_world.flags())?,
        }
        writeln!(
            out,
            "{} seed {seed}, pmnet sim {} --seed {seed}",
            verdict(self.chain.is_ok()),
            self.chain_world.flags()
        )?;
        match &self.abd {
            Ok(report) => {
                writeln!(out, "\nreplicated memory (--abd):")?;
                write_counts(out, &report.coverage(), false)?;
            }
            Err(error) => writeln!(out, "replicated memory (--abd): {error}")?,
        }
        writeln!(
            out,
            "{} seed {seed}, pmnet sim --abd --seed {seed}",
            verdict(self.abd.is_ok())
        )
    }
}

/// A `--mix` swarm's totals of the other worlds, and their failures in seed order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MixTotals {
    pub chain: ChainReport,
    pub chain_seeds: u64,
    pub abd: AbdReport,
    pub abd_seeds: u64,
    /// (seed, world, what failed).
    pub failures: Vec<(u64, OtherWorld, String)>,
}

impl MixTotals {
    pub fn add(&mut self, seed: u64, outcome: &MixOutcome) {
        match &outcome.chain {
            Ok(report) => {
                self.chain.add(report);
                self.chain_seeds += 1;
            }
            Err(error) => self
                .failures
                .push((seed, outcome.chain_world, error.clone())),
        }
        match &outcome.abd {
            Ok(report) => {
                WorldReport::add(&mut self.abd, report);
                self.abd_seeds += 1;
            }
            Err(error) => self.failures.push((seed, OtherWorld::Abd, error.clone())),
        }
    }

    /// Whether any seed of the other worlds ran (a `--mix` swarm).
    pub fn ran(&self) -> bool {
        self.chain_seeds + self.abd_seeds > 0 || !self.failures.is_empty()
    }

    /// Each world's coverage (a class a swarm of 100 seeds or more never exercised is
    /// flagged), then its failures with the command that replays each.
    pub fn print(&self, out: &mut impl Write) -> io::Result<()> {
        print_coverage(
            out,
            "the chain store's world (--chain-store: the controller on even seeds, fixed chains \
             on odd ones)",
            self.chain_seeds,
            &self.chain.coverage(),
        )?;
        print_coverage(
            out,
            "replicated memory's world (--abd)",
            self.abd_seeds,
            &self.abd.coverage(),
        )?;
        for (seed, world, error) in &self.failures {
            writeln!(out, "  seed {seed} ({}): {error}", world.flags())?;
            writeln!(
                out,
                "    reproduce with: pmnet sim {} --seed {seed}",
                world.flags()
            )?;
        }
        Ok(())
    }
}

/// Counts, a line each; `flag_missed`: a zero is flagged as never exercised.
fn write_counts(
    out: &mut impl Write,
    lines: &[(&'static str, u64)],
    flag_missed: bool,
) -> io::Result<()> {
    for (name, value) in lines {
        let missed = if *value == 0 && flag_missed {
            "  (never exercised)"
        } else {
            ""
        };
        writeln!(out, "{name:>48}  {value}{missed}")?;
    }
    Ok(())
}

/// A world's coverage: each count on a line, flagged when a swarm of 100 seeds or more never
/// exercised it.
fn print_coverage(
    out: &mut impl Write,
    world: &str,
    seeds: u64,
    lines: &[(&'static str, u64)],
) -> io::Result<()> {
    writeln!(out)?;
    writeln!(out, "{world}, {seeds} seeds passed:")?;
    write_counts(out, lines, seeds >= 100)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn another_worlds_seed_prints_its_trace_and_hash_as_the_main_worlds_does() {
        let seed = 3;
        let run = pmnet_sim::chain::run_traced(seed, true, Some(false));
        let mut out = Vec::new();
        write_seed(&mut out, OtherWorld::ChainStore.flags(), seed, &run).expect("written");
        let out = String::from_utf8(out).expect("text");
        assert!(
            out.starts_with("pmnet sim --chain-store --seed 3\n"),
            "{out}"
        );
        assert!(out.contains(&format!("\ntrace hash  {:08x}\n", run.trace_hash)));
        assert!(out.contains("  sim      seed 3: "), "{out}");
        assert!(
            !out.contains(" send "),
            "--quiet-trace leaves the datagram lines out"
        );
        assert!(out.ends_with("PASS seed 3\n"), "{out}");
        let untraced = pmnet_sim::chain::run_traced(seed, true, None);
        assert_eq!(untraced.trace_hash, run.trace_hash);
    }
}

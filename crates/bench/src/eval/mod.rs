//! `pmnet eval`: the papers' evaluation reproduced by one command.
//!
//! Every experiment is a list of `pmnet` commands (the benchmarks as a user runs them, each
//! started as a process of its own with `--json`) and a function that turns their results into
//! a figure and comparisons with the papers' figures. The runner (`runner.rs`) runs them with
//! progress bars and writes, per experiment, `OUT/<name>.json` (every command, its result and
//! setting, the figure's data, the comparisons) and `OUT/<name>.svg` (`plot.rs`); the report
//! (`report.rs`) puts them together in `OUT/report.md`. The experiments are in
//! `experiments/`, grouped as the paper's microbenchmarks, its workloads, recovery and the
//! packet store, and the later functions. See docs/eval.md.

mod experiments;
mod model;
pub mod plot;
mod report;
mod runner;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

pub use model::{Experiment, Scale, Settings};

use pmnet::CliError;

#[derive(Debug, Clone, Args)]
pub struct EvalArgs {
    /// A short run for CI (about 3 minutes): every experiment, few points, short measurements.
    /// The figures are not meant to be quoted
    #[arg(long, conflicts_with = "full")]
    pub quick: bool,

    /// The long run: more points, longer measurements, more rounds (an hour or more)
    #[arg(long)]
    pub full: bool,

    /// Run only these experiments (comma-separated names; `--list` shows them)
    #[arg(long, value_name = "NAME,...", value_delimiter = ',')]
    pub only: Vec<String>,

    /// Skip these experiments (comma-separated names)
    #[arg(long, value_name = "NAME,...", value_delimiter = ',')]
    pub skip: Vec<String>,

    /// Where the results, the figures and report.md go (created; files of the same names are
    /// replaced)
    #[arg(long, value_name = "DIR", default_value = "pmnet-eval")]
    pub out: PathBuf,

    /// Seed of every benchmark's key and request streams (printed; default: random)
    #[arg(long, value_name = "N")]
    pub seed: Option<u64>,

    /// Directory of the benchmarks' log and store files (/dev/shm is emulated persistent
    /// memory), passed to every benchmark as its --dir
    #[arg(long, value_name = "DIR", default_value = "/dev/shm")]
    pub dir: PathBuf,

    /// List the experiments and what they measure, then exit
    #[arg(long)]
    pub list: bool,

    /// No progress bars (a line per command instead)
    #[arg(long)]
    pub no_progress: bool,

    /// Authenticate the experiments' datagrams with the deployment keys in this file (`pmnet
    /// keygen`): given to every `pmnet bench` and `pmnet coord-bench` run (the others run on
    /// loopback, unauthenticated)
    #[arg(long, value_name = "FILE")]
    pub key_file: Option<PathBuf>,

    /// Run nothing: take the results an earlier run stored in DIR (its NAME.json files) and
    /// write the figures, comparisons and report again into --out (DIR itself when --out is
    /// not given), as this version of pmnet draws and judges them
    #[arg(long, value_name = "DIR")]
    pub from: Option<PathBuf>,
}

pub fn run(args: EvalArgs) -> Result<ExitCode, CliError> {
    let all = experiments::all();
    if args.list {
        for experiment in &all {
            println!("{:<16} {}", experiment.name, experiment.title);
        }
        return Ok(ExitCode::SUCCESS);
    }
    let known: Vec<&str> = all.iter().map(|experiment| experiment.name).collect();
    for name in args.only.iter().chain(&args.skip) {
        if !known.contains(&name.as_str()) {
            return Err(format!(
                "no experiment named {name:?}; the experiments are: {}",
                known.join(", ")
            )
            .into());
        }
    }
    let chosen: Vec<Experiment> = all
        .into_iter()
        .filter(|experiment| args.only.is_empty() || args.only.iter().any(|n| n == experiment.name))
        .filter(|experiment| !args.skip.iter().any(|n| n == experiment.name))
        .collect();
    if chosen.is_empty() {
        return Err("--only and --skip leave no experiment to run".into());
    }
    if let Some(from) = &args.from {
        let out = if args.out == std::path::Path::new("pmnet-eval") {
            from.clone()
        } else {
            args.out.clone()
        };
        return runner::analyse_again(&chosen, from, &out);
    }
    let scale = if args.quick {
        Scale::Quick
    } else if args.full {
        Scale::Full
    } else {
        Scale::Default
    };
    // A bad key file is refused now, not by every step.
    pmnet::node::keys_of(args.key_file.as_deref())?;
    let mut settings = Settings::new(scale, args.seed, args.dir.clone())?;
    settings.key_file = args.key_file.clone();
    runner::run_all(&settings, &chosen, &args.out, !args.no_progress)
}

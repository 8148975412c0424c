//! What an experiment is: the commands it runs, and what it makes of their results.

use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::Value;

use super::plot::Figure;
use pmnet::CliError;

/// How long the suite runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Scale {
    /// About 3 minutes: for CI; the figures are not for quoting.
    Quick,
    /// About 15 minutes on a 2-vCPU machine.
    Default,
    /// As long as it needs: more points, longer measurements, more rounds.
    Full,
}

impl Scale {
    pub fn name(self) -> &'static str {
        match self {
            Scale::Quick => "quick",
            Scale::Default => "default",
            Scale::Full => "full",
        }
    }

    /// One of three values, by scale.
    pub fn pick<T>(self, quick: T, default: T, full: T) -> T {
        match self {
            Scale::Quick => quick,
            Scale::Default => default,
            Scale::Full => full,
        }
    }
}

/// What every experiment's plan is made from.
#[derive(Debug, Clone)]
pub struct Settings {
    pub scale: Scale,
    pub seed: u64,
    /// The benchmarks' --dir.
    pub dir: PathBuf,
    /// The medium and flush method of a file in `dir`, as the processes will find them.
    pub medium: String,
    /// Whether this process runs as root (the in-path testbed needs it).
    #[allow(dead_code)] // read by the in-path experiment
    pub root: bool,
    /// `--key-file`: given to every step whose command takes one (`pmnet bench`, `pmnet
    /// coord-bench`).
    pub key_file: Option<PathBuf>,
}

impl Settings {
    pub fn new(scale: Scale, seed: Option<u64>, dir: PathBuf) -> Result<Settings, CliError> {
        let seed = seed.unwrap_or_else(rand::random);
        let medium = probe_medium(&dir)?;
        Ok(Settings {
            scale,
            seed,
            dir,
            medium,
            // SAFETY: geteuid has no preconditions.
            root: unsafe { libc::geteuid() } == 0,
            key_file: None,
        })
    }

    /// Seconds measured per mode, seconds of warm-up, rounds.
    pub fn measure(&self) -> (f64, f64, u32) {
        self.scale.pick((0.3, 0.1, 1), (1.0, 0.3, 3), (5.0, 1.0, 5))
    }

    /// The options every `pmnet bench` run of the suite shares: the scale's measurement, the
    /// seed, the files' directory, no progress line.
    pub fn bench_args(&self) -> Vec<String> {
        let (duration, warmup, rounds) = self.measure();
        args(&[
            "bench",
            "--duration",
            &duration.to_string(),
            "--warmup",
            &warmup.to_string(),
            "--rounds",
            &rounds.to_string(),
            "--seed",
            &self.seed.to_string(),
            "--dir",
            &self.dir.to_string_lossy(),
            "--no-progress",
        ])
    }

    /// About how long one `pmnet bench` mode takes at this scale (start-up included).
    pub fn mode_seconds(&self) -> f64 {
        let (duration, warmup, rounds) = self.measure();
        (duration + warmup + 0.3) * f64::from(rounds)
    }
}

/// The medium a file in `dir` is on, found by mapping a small file there the way the log and
/// stores do.
fn probe_medium(dir: &Path) -> Result<String, CliError> {
    let path = dir.join(format!("pmnet-eval-probe-{}", std::process::id()));
    let region = pmnet_pm::MmapRegion::create(&path, 4096, pmnet_pm::MmapOptions::default())
        .map_err(|error| format!("--dir {}: cannot make a file there: {error}", dir.display()))?;
    let medium = pmnet_pm::PmRegion::medium(&region).to_string();
    drop(region);
    let _ = std::fs::remove_file(&path);
    Ok(medium)
}

/// Whether `program` is an executable file in a directory of `$PATH` (or a path to one).
pub fn on_path(program: &str) -> bool {
    use std::os::unix::fs::PermissionsExt;
    let executable = |path: &Path| {
        path.metadata()
            .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
    };
    if program.contains('/') {
        return executable(Path::new(program));
    }
    std::env::var_os("PATH").is_some_and(|paths| {
        std::env::split_paths(&paths).any(|dir| executable(&dir.join(program)))
    })
}

/// Settings for unit tests of the experiments' analyses (no file is made).
#[cfg(test)]
pub fn tests_settings() -> Settings {
    Settings {
        scale: Scale::Quick,
        seed: 1,
        dir: PathBuf::from("/dev/shm"),
        medium: "test".to_owned(),
        root: false,
        key_file: None,
    }
}

/// The commands of the suite that take `--key-file`.
pub const KEYED_COMMANDS: &[&str] = &["bench", "coord-bench"];

/// Owned strings of `items`.
pub fn args(items: &[&str]) -> Vec<String> {
    items.iter().map(|item| (*item).to_owned()).collect()
}

/// One `pmnet` command of an experiment.
#[derive(Debug, Clone, Serialize)]
pub struct Invocation {
    /// What this command measures, in a few words ("payload 512 B").
    pub label: String,
    /// The arguments after `pmnet` (the runner adds `--json FILE` when `json` is set).
    pub args: Vec<String>,
    pub json: bool,
    /// About how long it runs, for the progress bars.
    pub estimate_s: f64,
}

impl Invocation {
    pub fn new(label: impl Into<String>, args: Vec<String>, estimate_s: f64) -> Invocation {
        Invocation {
            label: label.into(),
            args,
            json: true,
            estimate_s,
        }
    }
}

/// What one command did.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct StepOutput {
    pub label: String,
    /// The command line, as a user would type it.
    pub command: String,
    pub seconds: f64,
    /// "ok", or why not ("exit status 1", "interrupted", "cannot start: ...").
    pub status: String,
    /// Its output log, relative to the output directory.
    pub log: String,
    /// Its `--json` result.
    pub result: Option<Value>,
}

impl StepOutput {
    pub fn ok(&self) -> bool {
        self.status == "ok"
    }
}

/// An experiment of the suite.
#[derive(Clone, Copy)]
pub struct Experiment {
    pub name: &'static str,
    pub title: &'static str,
    /// What it does and how, for the report.
    pub about: &'static str,
    /// The commands to run; `Err` says why it cannot run here (it is then skipped).
    pub plan: fn(&Settings) -> Result<Vec<Invocation>, String>,
    /// The figure and comparisons from the commands' outputs (some may have failed).
    pub analyse: fn(&Settings, &[StepOutput]) -> Outcome,
}

/// What an experiment found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Outcome {
    pub figure: Figure,
    pub comparisons: Vec<Comparison>,
    /// Observations for the report: what the figure shows, what was not measured and why.
    pub notes: Vec<String>,
}

/// A figure measured next to the paper's, and the target if there is one.
#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    pub what: String,
    pub measured: Option<f64>,
    /// "×", "entries/s", "µs".
    pub unit: String,
    /// The paper's value, in the same unit.
    pub paper: Option<f64>,
    /// The value to reach, at least (higher is better for every target of the suite).
    pub target: Option<f64>,
    /// Whether the target is met (absent without a target or a measurement).
    pub met: Option<bool>,
    /// Why the figure falls short, when it does.
    pub why_short: Option<String>,
}

impl Comparison {
    pub fn new(what: impl Into<String>, measured: Option<f64>, unit: &str) -> Comparison {
        Comparison {
            what: what.into(),
            measured: measured.filter(|value| value.is_finite()),
            unit: unit.to_owned(),
            paper: None,
            target: None,
            met: None,
            why_short: None,
        }
    }

    pub fn paper(mut self, value: f64) -> Comparison {
        self.paper = Some(value);
        self
    }

    /// The target (at least `value`) and, when the measurement falls short, why.
    pub fn target(mut self, value: f64, why_short: &str) -> Comparison {
        self.target = Some(value);
        self.met = self.measured.map(|measured| measured >= value);
        if self.met == Some(false) {
            self.why_short = Some(why_short.to_owned());
        }
        self
    }
}

/// `value[path...]` as a number.
pub fn number(value: &Value, path: &[&str]) -> Option<f64> {
    let mut at = value;
    for key in path {
        at = at.get(key)?;
    }
    at.as_f64()
}

/// The JSON of the step labelled `label`, if it ran and wrote one.
pub fn result_of<'a>(steps: &'a [StepOutput], label: &str) -> Option<&'a Value> {
    steps
        .iter()
        .find(|step| step.label == label)
        .and_then(|step| step.result.as_ref())
}

/// The entry of a `pmnet bench` report's `results` for `mode`.
pub fn bench_mode<'a>(report: &'a Value, mode: &str) -> Option<&'a Value> {
    report
        .get("results")?
        .as_array()?
        .iter()
        .find(|result| result.get("mode").and_then(Value::as_str) == Some(mode))
}

/// `numerator / denominator` when both are positive.
pub fn ratio(numerator: Option<f64>, denominator: Option<f64>) -> Option<f64> {
    match (numerator, denominator) {
        (Some(n), Some(d)) if n > 0.0 && d > 0.0 => Some(n / d),
        _ => None,
    }
}

/// The arithmetic mean of the values present.
pub fn mean(values: impl IntoIterator<Item = Option<f64>>) -> Option<f64> {
    let values: Vec<f64> = values.into_iter().flatten().collect();
    (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
}

/// Every string under a key named `medium` or `..._medium` (`server_medium`,
/// `memory_node_medium`) in `value`, once each.
pub fn media(value: &Value, found: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, inner) in map {
                if key == "medium" || key.ends_with("_medium") {
                    if let Some(text) = inner.as_str() {
                        if !text.is_empty() && !found.iter().any(|seen| seen == text) {
                            found.push(text.to_owned());
                        }
                    }
                }
                media(inner, found);
            }
        }
        Value::Array(items) => items.iter().for_each(|item| media(item, found)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_target_is_met_or_says_why_not() {
        let met = Comparison::new("x", Some(5.0), "×").target(4.31, "because");
        assert_eq!(met.met, Some(true));
        assert!(met.why_short.is_none());
        let short = Comparison::new("x", Some(2.0), "×").target(4.31, "because");
        assert_eq!(short.met, Some(false));
        assert_eq!(short.why_short.as_deref(), Some("because"));
        let unmeasured = Comparison::new("x", None, "×").target(4.31, "because");
        assert_eq!(unmeasured.met, None);
        assert!(Comparison::new("x", Some(f64::NAN), "×").measured.is_none());
    }

    #[test]
    fn programs_are_found_on_the_path() {
        assert!(on_path("sh"));
        assert!(on_path("/bin/sh"));
        assert!(!on_path("pmnet-no-such-program"));
        assert!(!on_path("/etc/passwd"));
    }

    #[test]
    fn means_skip_what_is_missing() {
        assert_eq!(mean([Some(1.0), None, Some(3.0)]), Some(2.0));
        assert_eq!(ratio(Some(4.0), Some(2.0)), Some(2.0));
        assert_eq!(ratio(Some(4.0), Some(0.0)), None);
    }

    #[test]
    fn results_are_found_by_mode_and_media_once() {
        let report = json!({
            "setting": {"medium": "dram", "server_medium": "dram"},
            "results": [{"mode": "baseline", "p50_us": 50.0}, {"mode": "pmnet", "p50_us": 20.0}],
            "nested": [{"medium": "disk", "memory_node_medium": "pm"}]
        });
        assert_eq!(
            number(bench_mode(&report, "pmnet").unwrap(), &["p50_us"]),
            Some(20.0)
        );
        assert!(bench_mode(&report, "echo").is_none());
        let mut found = Vec::new();
        media(&report, &mut found);
        found.sort();
        assert_eq!(
            found,
            vec!["disk".to_owned(), "dram".to_owned(), "pm".to_owned()]
        );
    }
}

//! `report.md`: every experiment's figure, its comparisons with the papers' figures, what it
//! ran and on what; and the summary printed at the end of a run.

use std::fmt::Write as _;
use std::time::Duration;

use serde::Serialize;

use super::model::{Comparison, Settings, StepOutput};
use super::plot::Figure;

/// What `OUT/<name>.json` holds.
#[derive(Debug, Serialize)]
pub struct ExperimentRecord {
    pub experiment: String,
    pub title: String,
    pub about: String,
    pub scale: String,
    pub seed: u64,
    /// Why it did not run here, when it did not.
    pub skipped: Option<String>,
    pub seconds: f64,
    /// The media and flush methods the processes reported.
    pub media: Vec<String>,
    pub steps: Vec<StepOutput>,
    pub figure: Figure,
    pub comparisons: Vec<Comparison>,
    pub notes: Vec<String>,
    pub machine: Machine,
}

impl ExperimentRecord {
    pub fn failed_steps(&self) -> usize {
        self.steps.iter().filter(|step| !step.ok()).count()
    }
}

/// The machine the suite ran on.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Machine {
    pub cpu_model: String,
    pub cpus_online: usize,
    pub kernel: String,
    pub memory_gib: f64,
    pub hypervisor: bool,
    pub load_average_at_start: String,
}

impl Machine {
    pub fn here() -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find(|line| line.starts_with("model name"))
            .and_then(|line| line.split(':').nth(1))
            .map_or_else(|| "unknown CPU".to_owned(), |model| model.trim().to_owned());
        let hypervisor = cpuinfo
            .lines()
            .any(|line| line.starts_with("flags") && line.contains(" hypervisor"));
        let memory_kib: f64 = std::fs::read_to_string("/proc/meminfo")
            .unwrap_or_default()
            .lines()
            .find(|line| line.starts_with("MemTotal:"))
            .and_then(|line| line.split_whitespace().nth(1))
            .and_then(|kib| kib.parse().ok())
            .unwrap_or(0.0);
        let read = |path: &str| {
            std::fs::read_to_string(path)
                .map(|text| text.trim().to_owned())
                .unwrap_or_default()
        };
        let load = read("/proc/loadavg");
        Machine {
            cpu_model,
            cpus_online: std::thread::available_parallelism().map_or(1, usize::from),
            kernel: read("/proc/sys/kernel/osrelease"),
            memory_gib: (memory_kib / 1024.0 / 1024.0 * 10.0).round() / 10.0,
            hypervisor,
            load_average_at_start: load
                .split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" "),
        }
    }

    pub fn summary(&self) -> String {
        format!(
            "{}, {} CPUs online{}, {} GiB, Linux {}, load average {}",
            self.cpu_model,
            self.cpus_online,
            if self.hypervisor { " (a VM)" } else { "" },
            self.memory_gib,
            self.kernel,
            self.load_average_at_start
        )
    }
}

fn value(value: Option<f64>, unit: &str) -> String {
    match value {
        None => "–".to_owned(),
        Some(v) => {
            let number = if v.abs() >= 1000.0 {
                pmnet::loadgen::thousands(v)
            } else if v.abs() >= 10.0 {
                format!("{v:.1}")
            } else {
                format!("{v:.2}")
            };
            if unit == "×" {
                format!("{number}×")
            } else {
                format!("{number} {unit}")
            }
        }
    }
}

fn verdict(comparison: &Comparison) -> &'static str {
    match comparison.met {
        Some(true) => "met",
        Some(false) => "**not met**",
        None if comparison.target.is_some() => "not measured",
        None => "",
    }
}

fn comparisons_table(out: &mut String, rows: &[(&str, &Comparison)], with_experiment: bool) {
    if with_experiment {
        out.push_str(
            "| experiment | figure | measured | paper | target | |\n|---|---|---|---|---|---|\n",
        );
    } else {
        out.push_str("| figure | measured | paper | target | |\n|---|---|---|---|---|\n");
    }
    for (experiment, comparison) in rows {
        if with_experiment {
            let _ = write!(out, "| [{experiment}](#{experiment}) ");
        }
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} |",
            comparison.what,
            value(comparison.measured, &comparison.unit),
            value(comparison.paper, &comparison.unit),
            comparison.target.map_or_else(String::new, |t| format!(
                "≥ {}",
                value(Some(t), &comparison.unit)
            )),
            verdict(comparison)
        );
    }
    out.push('\n');
}

/// The whole report.
pub fn markdown(
    settings: &Settings,
    records: &[ExperimentRecord],
    machine: &Machine,
    took: Duration,
    interrupted: bool,
) -> String {
    let mut out = String::new();
    out.push_str("# pmnet eval: the papers' evaluation on this machine\n\n");
    let _ = writeln!(
        out,
        "`pmnet eval{}` — {} scale, seed {} (`--seed {}` repeats every benchmark's key and \
         request streams), {} experiments in {:.0} min{}.\n",
        match settings.scale {
            super::model::Scale::Quick => " --quick",
            super::model::Scale::Default => "",
            super::model::Scale::Full => " --full",
        },
        settings.scale.name(),
        settings.seed,
        settings.seed,
        records.len(),
        took.as_secs_f64() / 60.0,
        if interrupted {
            ", **interrupted**: the experiments after the last one here did not run"
        } else {
            ""
        }
    );
    let _ = writeln!(out, "- **Machine**: {}.", machine.summary());
    let _ = writeln!(
        out,
        "- **Persistence**: the benchmarks' files are in `{}`: {}. Each experiment lists the \
         media its processes reported.",
        settings.dir.display(),
        settings.medium
    );
    out.push_str(
        "- **Network**: every process on this one machine, over loopback UDP (the in-path \
         experiment: network namespaces joined by veth pairs). The papers' testbeds had \
         10 GbE links, an FPGA or a Tofino switch, and Optane servers: compare ratios, not \
         absolute times.\n",
    );
    if settings.scale == super::model::Scale::Quick {
        out.push_str(
            "- **Quick run**: short measurements and few points, to check the suite works. \
             Do not quote these figures.\n",
        );
    }
    out.push_str("\n## Summary\n\n");
    let rows: Vec<(&str, &Comparison)> = records
        .iter()
        .flat_map(|record| {
            record
                .comparisons
                .iter()
                .map(move |comparison| (record.experiment.as_str(), comparison))
        })
        .collect();
    if rows.is_empty() {
        out.push_str("No figure was measured.\n\n");
    } else {
        comparisons_table(&mut out, &rows, true);
    }
    let skipped: Vec<&ExperimentRecord> = records
        .iter()
        .filter(|record| record.skipped.is_some())
        .collect();
    for record in skipped {
        let _ = writeln!(
            out,
            "- `{}` did not run: {}",
            record.experiment,
            record.skipped.as_deref().unwrap_or_default()
        );
    }
    out.push('\n');
    for record in records {
        experiment_section(&mut out, record);
    }
    out
}

fn experiment_section(out: &mut String, record: &ExperimentRecord) {
    let _ = writeln!(out, "## {}\n", record.experiment);
    let _ = writeln!(out, "**{}.** {}\n", record.title, record.about);
    if let Some(reason) = &record.skipped {
        let _ = writeln!(out, "Not run here: {reason}\n");
        return;
    }
    let _ = writeln!(out, "![{}]({}.svg)\n", record.title, record.experiment);
    if !record.comparisons.is_empty() {
        let rows: Vec<(&str, &Comparison)> = record
            .comparisons
            .iter()
            .map(|comparison| (record.experiment.as_str(), comparison))
            .collect();
        comparisons_table(out, &rows, false);
        for comparison in &record.comparisons {
            if let Some(why) = &comparison.why_short {
                let _ = writeln!(out, "*Why {} falls short:* {why}\n", comparison.what);
            }
        }
    }
    for note in &record.notes {
        let _ = writeln!(out, "- {note}");
    }
    if !record.notes.is_empty() {
        out.push('\n');
    }
    let failed: Vec<_> = record.steps.iter().filter(|step| !step.ok()).collect();
    for step in &failed {
        let _ = writeln!(
            out,
            "- **{}** did not complete: {} (log: `{}`)",
            step.label, step.status, step.log
        );
    }
    if !failed.is_empty() {
        out.push('\n');
    }
    if let Some(setting) = setting_line(record) {
        let _ = writeln!(out, "Setting (of the first command): {setting}.\n");
    }
    if !record.media.is_empty() {
        let _ = writeln!(out, "Media: {}.\n", record.media.join("; "));
    }
    let _ = writeln!(
        out,
        "<details><summary>The {} commands ({:.0} s), as run</summary>\n",
        record.steps.len(),
        record.seconds
    );
    for step in &record.steps {
        let _ = writeln!(
            out,
            "    {}",
            step.command.replace(" --json ", " \\\n      --json ")
        );
    }
    out.push_str("\n</details>\n\n");
}

/// Keys of a command's `setting` that the report leaves out: said elsewhere (media, the
/// machine, the seed) or too long for one line.
const SETTING_OMITTED: [&str; 9] = [
    "medium",
    "server_medium",
    "seed",
    "kernel",
    "load_average",
    "cpus_online",
    "target",
    "waits_for",
    "dir",
];

/// The first command's setting as `key value` pairs (scalars only, nulls left out).
fn setting_line(record: &ExperimentRecord) -> Option<String> {
    let setting = record
        .steps
        .iter()
        .filter_map(|step| step.result.as_ref()?.get("setting")?.as_object())
        .next()?;
    let pairs: Vec<String> = setting
        .iter()
        .filter(|(key, _)| !SETTING_OMITTED.contains(&key.as_str()))
        .filter_map(|(key, value)| {
            let text = match value {
                serde_json::Value::String(text) => text.clone(),
                serde_json::Value::Number(number) => number.to_string(),
                serde_json::Value::Bool(flag) => flag.to_string(),
                _ => return None,
            };
            Some(format!("{} {text}", key.replace('_', " ")))
        })
        .collect();
    (!pairs.is_empty()).then(|| pairs.join("; "))
}

/// The lines printed at the end of a run: every comparison with a target.
pub fn summary_text(records: &[ExperimentRecord]) -> String {
    let mut out = String::new();
    for record in records {
        if let Some(reason) = &record.skipped {
            let _ = writeln!(out, "  {:<16} skipped: {reason}", record.experiment);
            continue;
        }
        for comparison in &record.comparisons {
            let _ = writeln!(
                out,
                "  {:<16} {}: {}{}{}",
                record.experiment,
                comparison.what,
                value(comparison.measured, &comparison.unit),
                comparison.paper.map_or_else(String::new, |p| format!(
                    " (paper {})",
                    value(Some(p), &comparison.unit)
                )),
                match comparison.met {
                    Some(true) => "; target met".to_owned(),
                    Some(false) => format!(
                        "; target ≥ {} NOT met",
                        value(comparison.target, &comparison.unit)
                    ),
                    None => String::new(),
                }
            );
        }
    }
    out.trim_end().to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eval::model::{tests_settings, StepOutput};
    use crate::eval::plot::Figure;

    fn record(name: &str, skipped: Option<&str>, comparisons: Vec<Comparison>) -> ExperimentRecord {
        ExperimentRecord {
            experiment: name.to_owned(),
            title: format!("The {name} experiment"),
            about: "What it does.".to_owned(),
            scale: "quick".to_owned(),
            seed: 1,
            skipped: skipped.map(str::to_owned),
            seconds: 2.0,
            media: vec!["emulated-pm via clwb+sfence".to_owned()],
            steps: vec![StepOutput {
                label: "one".to_owned(),
                command: "pmnet bench --json x".to_owned(),
                seconds: 1.0,
                status: "failed (exit status: 1)".to_owned(),
                log: "logs/x-1.log".to_owned(),
                result: Some(serde_json::json!({"setting": {
                    "clients": 16, "medium": "m", "placement": "apart", "rack": null
                }})),
            }],
            figure: Figure::default(),
            comparisons,
            notes: vec!["A note.".to_owned()],
            machine: Machine::here(),
        }
    }

    #[test]
    fn the_report_shows_every_figure_its_comparisons_and_what_did_not_run() {
        let records = vec![
            record(
                "workloads",
                None,
                vec![Comparison::new("throughput", Some(1.5), "×")
                    .paper(4.31)
                    .target(4.31, "the machine is CPU-bound")],
            ),
            record("inpath", Some("needs root"), Vec::new()),
        ];
        let machine = Machine::here();
        let text = markdown(
            &tests_settings(),
            &records,
            &machine,
            Duration::from_secs(60),
            false,
        );
        assert!(
            text.contains(
                "| [workloads](#workloads) | throughput | 1.50× | 4.31× | ≥ 4.31× | **not met** |"
            ),
            "{text}"
        );
        assert!(text.contains("![The workloads experiment](workloads.svg)"));
        assert!(text.contains("*Why throughput falls short:* the machine is CPU-bound"));
        assert!(text
            .contains("- **one** did not complete: failed (exit status: 1) (log: `logs/x-1.log`)"));
        assert!(text.contains("`inpath` did not run: needs root"));
        assert!(text.contains("## inpath\n") && text.contains("Not run here: needs root"));
        assert!(text.contains("Media: emulated-pm via clwb+sfence."));
        assert!(text.contains("Setting (of the first command): clients 16; placement apart."));
        assert!(text.contains("**Quick run**"));
        let summary = summary_text(&records);
        assert!(
            summary.contains("throughput: 1.50× (paper 4.31×); target ≥ 4.31× NOT met"),
            "{summary}"
        );
        assert!(summary.contains("skipped: needs root"));
    }
}

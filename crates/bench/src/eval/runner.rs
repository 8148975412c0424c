//! Running the experiments: each command a process of its own, its output in a log, progress
//! bars for the experiment and the whole suite, then the experiment's JSON and SVG, and at the
//! end the report.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use pmnet_runtime::Shutdown;
use serde_json::Value;

use super::model::{media, Experiment, Outcome, Settings, StepOutput};
use super::plot::{self, Figure};
use super::report::{self, ExperimentRecord, Machine};
use pmnet::CliError;

/// A command that runs this many times its estimate (and at least `STEP_TIMEOUT_MIN`) is
/// stopped and counted as failed.
const STEP_TIMEOUT_FACTOR: f64 = 10.0;
const STEP_TIMEOUT_MIN: Duration = Duration::from_secs(180);
/// How long a stopped command has to exit after SIGINT before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(15);

/// Where progress goes: bars on a terminal, a line per command otherwise.
struct Progress {
    multi: MultiProgress,
    overall: ProgressBar,
    bars: bool,
}

impl Progress {
    fn new(enabled: bool, total_s: f64) -> Progress {
        let target = if enabled {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        };
        let multi = MultiProgress::with_draw_target(target);
        let bars = !multi.is_hidden();
        let overall = multi.add(ProgressBar::new(millis(total_s)));
        overall.set_style(style(
            "{prefix:>16} [{bar:32}] {percent:>3}% {elapsed} of about {msg}",
        ));
        overall.set_prefix("pmnet eval");
        overall.set_message(minutes(total_s));
        Progress {
            multi,
            overall,
            bars,
        }
    }

    fn experiment_bar(&self, name: &str, total_s: f64) -> ProgressBar {
        let bar = self.multi.add(ProgressBar::new(millis(total_s)));
        bar.set_style(style("{prefix:>16} [{bar:32}] {percent:>3}% {msg}"));
        bar.set_prefix(name.to_owned());
        bar
    }

    fn line(&self, text: &str) {
        if self.bars {
            let _ = self.multi.println(text);
        } else {
            println!("{text}");
        }
    }
}

fn style(template: &str) -> ProgressStyle {
    ProgressStyle::with_template(template)
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ")
}

fn millis(seconds: f64) -> u64 {
    (seconds.max(0.0) * 1000.0) as u64
}

fn minutes(seconds: f64) -> String {
    if seconds < 90.0 {
        format!("{seconds:.0} s")
    } else {
        format!("{:.0} min", seconds / 60.0)
    }
}

pub fn run_all(
    settings: &Settings,
    experiments: &[Experiment],
    out: &Path,
    progress: bool,
) -> Result<ExitCode, CliError> {
    fs::create_dir_all(out.join("logs"))
        .map_err(|error| format!("--out {}: {error}", out.display()))?;
    let shutdown = Shutdown::on_signals()?;
    let machine = Machine::here();
    let plans: Vec<(Experiment, Result<Vec<_>, String>)> = experiments
        .iter()
        .map(|experiment| (*experiment, (experiment.plan)(settings)))
        .collect();
    let total_s: f64 = plans
        .iter()
        .filter_map(|(_, plan)| plan.as_ref().ok())
        .flatten()
        .map(|invocation| invocation.estimate_s)
        .sum();
    println!(
        "pmnet eval: {} experiments, {} scale, about {} (seed {}; --seed {} repeats the streams)",
        experiments.len(),
        settings.scale.name(),
        minutes(total_s),
        settings.seed,
        settings.seed
    );
    println!("  machine: {}", machine.summary());
    println!(
        "  files in {}: {} (each process reports its own medium too)",
        settings.dir.display(),
        settings.medium
    );
    println!("  output: {}", out.display());
    let progress = Progress::new(progress, total_s);
    let started = Instant::now();
    let mut records = Vec::new();
    let mut done_s = 0.0;
    for (experiment, plan) in plans {
        if shutdown.is_requested() {
            break;
        }
        let record = match plan {
            Err(reason) => {
                progress.line(&format!("{}: skipped: {reason}", experiment.name));
                skipped(settings, &experiment, reason, &machine)
            }
            Ok(invocations) => run_experiment(
                settings,
                &experiment,
                &invocations,
                out,
                &progress,
                &shutdown,
                &mut done_s,
                &machine,
            ),
        };
        write_record(out, &record)?;
        records.push(record);
    }
    progress.overall.finish_and_clear();
    let interrupted = shutdown.is_requested();
    let report_path = out.join("report.md");
    fs::write(
        &report_path,
        report::markdown(settings, &records, &machine, started.elapsed(), interrupted),
    )
    .map_err(|error| format!("{}: {error}", report_path.display()))?;
    let failed: usize = records.iter().map(ExperimentRecord::failed_steps).sum();
    println!("{}", report::summary_text(&records));
    println!(
        "pmnet eval: {} experiments in {}; report: {}{}",
        records.len(),
        minutes(started.elapsed().as_secs_f64()),
        report_path.display(),
        if interrupted { " (interrupted)" } else { "" }
    );
    if failed > 0 {
        eprintln!(
            "pmnet eval: {failed} commands failed; their logs are under {}",
            out.join("logs").display()
        );
        return Ok(ExitCode::FAILURE);
    }
    Ok(if interrupted {
        ExitCode::from(130)
    } else {
        ExitCode::SUCCESS
    })
}

/// `pmnet eval --from DIR`: the records an earlier run stored in `from` analysed again (its
/// steps' results through each experiment's analysis as it is now), their figures and the
/// report written into `out`. Nothing is run; each record keeps its steps, media, machine and
/// times.
pub fn analyse_again(
    experiments: &[Experiment],
    from: &Path,
    out: &Path,
) -> Result<ExitCode, CliError> {
    fs::create_dir_all(out).map_err(|error| format!("--out {}: {error}", out.display()))?;
    let mut records = Vec::new();
    let mut settings = None;
    let mut machine = None;
    for experiment in experiments {
        let path = from.join(format!("{}.json", experiment.name));
        let text = match fs::read_to_string(&path) {
            Ok(text) => text,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => continue,
            Err(error) => return Err(format!("{}: {error}", path.display()).into()),
        };
        let stored: serde_json::Value =
            serde_json::from_str(&text).map_err(|error| format!("{}: {error}", path.display()))?;
        let field = |name: &str| {
            stored.get(name).cloned().ok_or_else(|| {
                format!(
                    "{}: no {name:?}: not a record of pmnet eval",
                    path.display()
                )
            })
        };
        let parse = |name: &str| -> Result<serde_json::Value, CliError> { Ok(field(name)?) };
        let scale = match parse("scale")?.as_str() {
            Some("quick") => super::Scale::Quick,
            Some("full") => super::Scale::Full,
            _ => super::Scale::Default,
        };
        let seed = parse("seed")?.as_u64().unwrap_or_default();
        let media: Vec<String> = serde_json::from_value(parse("media")?).unwrap_or_default();
        let steps: Vec<StepOutput> = serde_json::from_value(parse("steps")?)
            .map_err(|error| format!("{}: steps: {error}", path.display()))?;
        let here: Machine = serde_json::from_value(parse("machine")?)
            .map_err(|error| format!("{}: machine: {error}", path.display()))?;
        // The benchmarks' --dir, as the stored commands name it.
        let dir = steps
            .iter()
            .find_map(|step| {
                let mut words = step.command.split_whitespace();
                words.find(|word| *word == "--dir")?;
                words.next().map(PathBuf::from)
            })
            .unwrap_or_else(|| PathBuf::from("/dev/shm"));
        let run_settings = settings.get_or_insert_with(|| Settings {
            scale,
            seed,
            dir,
            medium: media.first().cloned().unwrap_or_default(),
            root: false,
            key_file: None,
        });
        let skipped_reason = parse("skipped")?.as_str().map(str::to_owned);
        let outcome: Option<Outcome> = skipped_reason
            .is_none()
            .then(|| (experiment.analyse)(run_settings, &steps));
        let record = ExperimentRecord {
            experiment: experiment.name.to_owned(),
            title: experiment.title.to_owned(),
            about: experiment.about.to_owned(),
            scale: scale.name().to_owned(),
            seed,
            skipped: skipped_reason,
            seconds: parse("seconds")?.as_f64().unwrap_or_default(),
            media,
            steps,
            figure: outcome
                .as_ref()
                .map(|o| o.figure.clone())
                .unwrap_or_default(),
            comparisons: outcome
                .as_ref()
                .map(|o| o.comparisons.clone())
                .unwrap_or_default(),
            notes: outcome.map(|o| o.notes).unwrap_or_default(),
            machine: here.clone(),
        };
        machine.get_or_insert(here);
        write_record(out, &record)?;
        println!("{}: analysed again", record.experiment);
        records.push(record);
    }
    let (Some(settings), Some(machine)) = (settings, machine) else {
        return Err(format!("{}: no record of pmnet eval there", from.display()).into());
    };
    let took: f64 = records.iter().map(|record| record.seconds).sum();
    let report_path = out.join("report.md");
    fs::write(
        &report_path,
        report::markdown(
            &settings,
            &records,
            &machine,
            Duration::from_secs_f64(took),
            false,
        ),
    )
    .map_err(|error| format!("{}: {error}", report_path.display()))?;
    println!("{}", report::summary_text(&records));
    println!(
        "pmnet eval --from {}: report: {}",
        from.display(),
        report_path.display()
    );
    Ok(ExitCode::SUCCESS)
}

fn skipped(
    settings: &Settings,
    experiment: &Experiment,
    reason: String,
    machine: &Machine,
) -> ExperimentRecord {
    ExperimentRecord {
        experiment: experiment.name.to_owned(),
        title: experiment.title.to_owned(),
        about: experiment.about.to_owned(),
        scale: settings.scale.name().to_owned(),
        seed: settings.seed,
        skipped: Some(reason),
        seconds: 0.0,
        media: Vec::new(),
        steps: Vec::new(),
        figure: Figure::default(),
        comparisons: Vec::new(),
        notes: Vec::new(),
        machine: machine.clone(),
    }
}

#[allow(clippy::too_many_arguments)]
fn run_experiment(
    settings: &Settings,
    experiment: &Experiment,
    invocations: &[super::model::Invocation],
    out: &Path,
    progress: &Progress,
    shutdown: &Shutdown,
    done_s: &mut f64,
    machine: &Machine,
) -> ExperimentRecord {
    let started = Instant::now();
    let total: f64 = invocations.iter().map(|i| i.estimate_s).sum();
    let bar = progress.experiment_bar(experiment.name, total);
    let mut steps = Vec::new();
    let mut local_s = 0.0;
    for (index, invocation) in invocations.iter().enumerate() {
        if shutdown.is_requested() {
            break;
        }
        bar.set_message(format!(
            "{}/{} {}",
            index + 1,
            invocations.len(),
            invocation.label
        ));
        let step = run_step(
            experiment.name,
            index,
            invocation,
            settings.key_file.as_deref(),
            out,
            shutdown,
            |elapsed| {
                let into = elapsed.min(invocation.estimate_s);
                bar.set_position(millis(local_s + into));
                progress
                    .overall
                    .set_position(millis(*done_s + local_s + into));
            },
        );
        local_s += invocation.estimate_s;
        bar.set_position(millis(local_s));
        progress.line(&format!(
            "{}: [{}/{}] {}: {} in {:.1} s",
            experiment.name,
            index + 1,
            invocations.len(),
            invocation.label,
            step.status,
            step.seconds
        ));
        steps.push(step);
    }
    *done_s += total;
    bar.finish_and_clear();
    let outcome: Outcome = (experiment.analyse)(settings, &steps);
    let mut found = Vec::new();
    for step in &steps {
        if let Some(result) = &step.result {
            media(result, &mut found);
        }
    }
    ExperimentRecord {
        experiment: experiment.name.to_owned(),
        title: experiment.title.to_owned(),
        about: experiment.about.to_owned(),
        scale: settings.scale.name().to_owned(),
        seed: settings.seed,
        skipped: None,
        seconds: (started.elapsed().as_secs_f64() * 10.0).round() / 10.0,
        media: found,
        steps,
        figure: outcome.figure,
        comparisons: outcome.comparisons,
        notes: outcome.notes,
        machine: machine.clone(),
    }
}

/// Run one command to its end (or its timeout, or Ctrl-C), its output in `OUT/logs/`.
fn run_step(
    experiment: &str,
    index: usize,
    invocation: &super::model::Invocation,
    key_file: Option<&Path>,
    out: &Path,
    shutdown: &Shutdown,
    mut tick: impl FnMut(f64),
) -> StepOutput {
    let log_name = format!("logs/{experiment}-{}.log", index + 1);
    let json_path: PathBuf = out.join(format!("logs/{experiment}-{}.json", index + 1));
    let mut args = invocation.args.clone();
    if let Some(path) = key_file.filter(|_| {
        args.first()
            .is_some_and(|command| super::model::KEYED_COMMANDS.contains(&command.as_str()))
    }) {
        args.push("--key-file".to_owned());
        args.push(path.to_string_lossy().into_owned());
    }
    if invocation.json {
        let _ = fs::remove_file(&json_path);
        args.push("--json".to_owned());
        args.push(json_path.to_string_lossy().into_owned());
    }
    let mut step = StepOutput {
        label: invocation.label.clone(),
        command: command_line(&args),
        seconds: 0.0,
        status: String::new(),
        log: log_name.clone(),
        result: None,
    };
    let started = Instant::now();
    let status = spawn_and_wait(&args, &out.join(&log_name), invocation, shutdown, &mut tick);
    step.seconds = (started.elapsed().as_secs_f64() * 10.0).round() / 10.0;
    step.status = status;
    if invocation.json && step.ok() {
        match fs::read(&json_path)
            .map_err(|error| error.to_string())
            .and_then(|bytes| {
                serde_json::from_slice::<Value>(&bytes).map_err(|error| error.to_string())
            }) {
            Ok(value) => step.result = Some(value),
            Err(error) => step.status = format!("no JSON result ({error})"),
        }
    }
    step
}

fn spawn_and_wait(
    args: &[String],
    log: &Path,
    invocation: &super::model::Invocation,
    shutdown: &Shutdown,
    tick: &mut impl FnMut(f64),
) -> String {
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(error) => return format!("cannot find this program: {error}"),
    };
    let (stdout, stderr) = match File::create(log).and_then(|file| Ok((file.try_clone()?, file))) {
        Ok(files) => files,
        Err(error) => return format!("cannot write {}: {error}", log.display()),
    };
    let mut child = match Command::new(exe)
        .args(args)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .spawn()
    {
        Ok(child) => child,
        Err(error) => return format!("cannot start: {error}"),
    };
    let started = Instant::now();
    let timeout = STEP_TIMEOUT_MIN.max(Duration::from_secs_f64(
        invocation.estimate_s * STEP_TIMEOUT_FACTOR,
    ));
    let mut stopping: Option<(Instant, &str)> = None;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => {
                return match stopping {
                    Some((_, why)) => why.to_owned(),
                    None if status.success() => "ok".to_owned(),
                    None => format!("failed ({status}); see {}", log.display()),
                }
            }
            Ok(None) => {}
            Err(error) => return format!("cannot wait for it: {error}"),
        }
        let elapsed = started.elapsed();
        tick(elapsed.as_secs_f64());
        match stopping {
            None if shutdown.is_requested() || elapsed > timeout => {
                let why = if shutdown.is_requested() {
                    "interrupted"
                } else {
                    "timed out"
                };
                // Let it stop its own processes first.
                if let Ok(pid) = i32::try_from(child.id()) {
                    // SAFETY: kill(2) on our own child's pid.
                    unsafe { libc::kill(pid, libc::SIGINT) };
                }
                stopping = Some((Instant::now(), why));
            }
            Some((since, _)) if since.elapsed() > STOP_GRACE => {
                let _ = child.kill();
            }
            _ => {}
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `pmnet ARGS` as a shell would take it.
pub fn command_line(args: &[String]) -> String {
    let mut line = String::from("pmnet");
    for arg in args {
        line.push(' ');
        let plain = !arg.is_empty()
            && arg
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_./:=,@%+".contains(c));
        if plain {
            line.push_str(arg);
        } else {
            line.push('\'');
            line.push_str(&arg.replace('\'', r"'\''"));
            line.push('\'');
        }
    }
    line
}

fn write_record(out: &Path, record: &ExperimentRecord) -> Result<(), CliError> {
    let json_path = out.join(format!("{}.json", record.experiment));
    let text = serde_json::to_string_pretty(record)
        .map_err(|error| format!("{}: {error}", json_path.display()))?;
    fs::write(&json_path, text + "\n")
        .map_err(|error| format!("{}: {error}", json_path.display()))?;
    let svg = match &record.skipped {
        Some(reason) => plot::render_message(&record.title, &format!("not run: {reason}")),
        None => plot::render(&record.figure),
    }
    .map_err(|error| format!("{}: {error}", record.experiment))?;
    let svg_path = out.join(format!("{}.svg", record.experiment));
    fs::write(&svg_path, svg).map_err(|error| format!("{}: {error}", svg_path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_lines_quote_what_a_shell_would_split() {
        let args = vec![
            "bench".to_owned(),
            "--dist".into(),
            "zipf:0.99".into(),
            "a b".into(),
            "it's".into(),
        ];
        assert_eq!(
            command_line(&args),
            r"pmnet bench --dist zipf:0.99 'a b' 'it'\''s'"
        );
    }
}

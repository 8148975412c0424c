//! `pmnet eval --quick` as CI runs it: every experiment leaves its JSON (which parses and
//! names every command it ran, each of which succeeded or says why the experiment could not
//! run here), its SVG (well-formed XML, an `<svg>` document) and its section of report.md,
//! which embeds the figure. Nothing here looks at the figures themselves.

mod common;

use std::path::Path;

use common::{args, bench_bin, pmnet_bin, run_bench};
use serde_json::Value;

/// The experiments `pmnet eval --list` names.
fn experiment_names() -> Vec<String> {
    let (status, stdout, stderr) = run_bench(&args(&["eval", "--list"]), None);
    assert!(status.success(), "eval --list failed: {stderr}");
    let names: Vec<String> = stdout
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_owned)
        .collect();
    assert!(names.len() >= 8, "too few experiments: {names:?}");
    names
}

fn check_experiment(out: &Path, name: &str, report: &str) {
    let json_path = out.join(format!("{name}.json"));
    let text = std::fs::read_to_string(&json_path)
        .unwrap_or_else(|error| panic!("{}: {error}", json_path.display()));
    let record: Value = serde_json::from_str(&text)
        .unwrap_or_else(|error| panic!("{}: not JSON: {error}", json_path.display()));
    assert_eq!(record["experiment"], name);
    assert_eq!(record["scale"], "quick");
    assert!(record["machine"]["cpus_online"].as_u64().unwrap_or(0) >= 1);
    let skipped = record["skipped"].as_str();
    let steps = record["steps"].as_array().expect("steps");
    match skipped {
        Some(reason) => {
            println!("{name}: skipped here: {reason}");
            assert!(steps.is_empty());
            assert!(report.contains(&format!("Not run here: {reason}")));
        }
        None => {
            assert!(!steps.is_empty(), "{name}: no command ran");
            for step in steps {
                assert_eq!(
                    step["status"],
                    "ok",
                    "{name}: {} did not complete; its log:\n{}",
                    step["command"],
                    std::fs::read_to_string(out.join(step["log"].as_str().unwrap_or_default()))
                        .unwrap_or_default()
                );
                assert!(step["command"].as_str().unwrap().starts_with("pmnet "));
                assert!(
                    step["result"].is_object(),
                    "{name}: a step without its JSON"
                );
            }
            let panels = record["figure"]["panels"].as_array().expect("panels");
            assert!(!panels.is_empty(), "{name}: no figure");
            assert!(
                panels
                    .iter()
                    .any(|panel| !panel["series"].as_array().unwrap().is_empty()),
                "{name}: a figure without data"
            );
            assert!(
                report.contains(&format!("]({name}.svg)")),
                "{name}: figure not embedded"
            );
            assert!(
                !record["media"].as_array().unwrap().is_empty() || name == "inpath",
                "{name}: no medium reported"
            );
        }
    }
    assert!(
        report.contains(&format!("\n## {name}\n")),
        "{name}: no section in the report"
    );
    let svg_path = out.join(format!("{name}.svg"));
    let svg = std::fs::read_to_string(&svg_path)
        .unwrap_or_else(|error| panic!("{}: {error}", svg_path.display()));
    let document = roxmltree::Document::parse(&svg)
        .unwrap_or_else(|error| panic!("{}: not XML: {error}", svg_path.display()));
    assert_eq!(document.root_element().tag_name().name(), "svg");
}

#[test]
fn a_quick_run_leaves_every_experiments_files() {
    let names = experiment_names();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("eval");
    let seed = pmnet_testkit::seed("a_quick_run_leaves_every_experiments_files").to_string();
    println!("pmnet eval --quick --seed {seed}");
    // Longer than run_bench waits: the suite runs every experiment (each of its commands has
    // a timeout of its own, so this ends).
    pmnet_bin();
    let output = std::process::Command::new(bench_bin())
        .args(["eval", "--quick", "--no-progress", "--seed", &seed, "--out"])
        .arg(&out)
        .output()
        .expect("start pmnet eval");
    let (status, stdout, stderr) = (
        output.status,
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    );
    println!("{stdout}");
    assert!(
        status.success(),
        "pmnet eval --quick failed ({status})\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains(&format!("seed {seed}")));
    assert!(
        stdout.contains("files in /dev/shm: "),
        "the medium is said at start-up"
    );
    let report = std::fs::read_to_string(out.join("report.md")).expect("report.md");
    assert!(report.contains("**Persistence**"));
    assert!(report.contains("## Summary"));
    for name in &names {
        check_experiment(&out, name, &report);
    }
}

#[test]
fn bad_choices_are_refused_with_the_names_to_use() {
    let (status, _, stderr) = run_bench(&args(&["eval", "--only", "no-such-thing"]), None);
    assert!(!status.success());
    assert!(
        stderr.contains("no-such-thing") && stderr.contains("latency-payload"),
        "{stderr}"
    );
    let (status, _, stderr) = run_bench(&args(&["eval", "--quick", "--full"]), None);
    assert!(!status.success());
    assert!(
        stderr.contains("--full") || stderr.contains("--quick"),
        "{stderr}"
    );
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("absent");
    let (status, _, stderr) = run_bench(
        &args(&[
            "eval",
            "--only",
            "load",
            "--dir",
            &missing.display().to_string(),
        ]),
        None,
    );
    assert!(!status.success());
    assert!(stderr.contains("--dir"), "{stderr}");
}

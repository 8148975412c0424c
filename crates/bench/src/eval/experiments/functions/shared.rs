//! What the later functions' experiments share: the base of their `pmnet bench` runs, values
//! read from their JSON, bars and the comparisons' bounds.

use serde_json::Value;

use crate::eval::model::{args, Comparison, Settings};

/// `pmnet bench` with the suite's seed, files' directory and no progress line, without the
/// scale's measurement (the caller gives its own).
pub(super) fn bench_base(settings: &Settings) -> Vec<String> {
    args(&[
        "bench",
        "--seed",
        &settings.seed.to_string(),
        "--dir",
        &settings.dir.to_string_lossy(),
        "--no-progress",
    ])
}

/// Grouped bars: a category per operation, a series per `(system, name)`, each bar
/// `value(system, op)` (a bar is left out where it has none).
pub(super) fn bars_by_op(
    title: &str,
    y_label: &str,
    ops: &[&str],
    systems: &[(&str, &str)],
    value: impl Fn(&str, &str) -> Option<f64>,
) -> crate::eval::plot::Panel {
    let categories = ops.iter().map(|op| (*op).to_owned()).collect();
    let mut panel = crate::eval::plot::Panel::bars(title, y_label, categories);
    for (system, name) in systems {
        let points = ops
            .iter()
            .enumerate()
            .filter_map(|(index, op)| value(system, op).map(|y| (index as f64, y)))
            .collect();
        panel = panel.series(name, points);
    }
    panel
}

/// `value[key]` as a string.
pub(super) fn text<'a>(value: &'a Value, key: &str) -> Option<&'a str> {
    value.get(key).and_then(Value::as_str)
}

/// The entries of `report[key]` (an array), or none.
pub(super) fn entries<'a>(report: Option<&'a Value>, key: &str) -> &'a [Value] {
    report
        .and_then(|report| report.get(key))
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

/// A ratio a benchmark reported with its own target (`bound` "at least" or "at most"), in the
/// suite's convention that a target is a value to reach at least: an "at most" ratio is turned
/// over (its measurement and its target), and then named `turned`.
pub(super) fn bounded(
    what: String,
    turned: String,
    value: Option<f64>,
    bound: Option<&str>,
    target: Option<f64>,
    why_short: &str,
) -> Comparison {
    let at_most = bound == Some("at most");
    let flip = |x: f64| if at_most { 1.0 / x } else { x };
    let measured = value.filter(|v| *v > 0.0).map(flip);
    let comparison = Comparison::new(if at_most { turned } else { what }, measured, "×");
    match target.filter(|t| *t > 0.0) {
        Some(target) => comparison.target(round3(flip(target)), why_short),
        None => comparison,
    }
}

/// The middle of the bar of series `index` (of `count`) in category `category`, as plot.rs
/// lays grouped bars out: a paper's value is marked over the bar of the system it belongs to.
pub(super) fn bar_middle(category: usize, index: usize, count: usize) -> f64 {
    let width = 0.8 / count.max(1) as f64;
    category as f64 - 0.4 + width * (index as f64 + 0.46)
}

/// `x` to three decimals (targets turned over: 1 / 1.3 = 0.769).
pub(super) fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// Seconds as a command-line argument ("0.5", "3").
pub(super) fn seconds(value: f64) -> String {
    value.to_string()
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::eval::model::StepOutput;

    /// A step that ran and wrote `result`.
    pub(in crate::eval::experiments::functions) fn step(label: &str, result: Value) -> StepOutput {
        StepOutput {
            label: label.to_owned(),
            command: format!("pmnet {label}"),
            seconds: 1.0,
            status: "ok".to_owned(),
            log: String::new(),
            result: Some(result),
        }
    }

    /// A step that failed without a result.
    pub(in crate::eval::experiments::functions) fn failed(label: &str) -> StepOutput {
        StepOutput {
            label: label.to_owned(),
            command: format!("pmnet {label}"),
            seconds: 1.0,
            status: "exit status 1".to_owned(),
            log: String::new(),
            result: None,
        }
    }

    #[test]
    fn at_most_ratios_are_turned_over() {
        let kept = bounded(
            "a / b".into(),
            "b / a".into(),
            Some(2.0),
            Some("at least"),
            Some(1.5),
            "why",
        );
        assert_eq!(kept.what, "a / b");
        assert_eq!(kept.measured, Some(2.0));
        assert_eq!(kept.met, Some(true));
        let turned = bounded(
            "a / b".into(),
            "b / a".into(),
            Some(2.0),
            Some("at most"),
            Some(1.3),
            "why",
        );
        assert_eq!(turned.what, "b / a");
        assert_eq!(turned.measured, Some(0.5));
        assert_eq!(turned.target, Some(0.769));
        assert_eq!(turned.met, Some(false));
        assert_eq!(turned.why_short.as_deref(), Some("why"));
        let none = bounded("a".into(), "b".into(), None, None, None, "why");
        assert!(none.measured.is_none() && none.target.is_none());
    }
}

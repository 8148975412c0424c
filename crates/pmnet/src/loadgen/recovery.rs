//! How a rack's throughput recovers after each popularity change (`--popularity`): the
//! requests measured every 100 ms of the measured stretch, and for each change the rate the
//! second before it, the lowest 100 ms after it, and when the rate is back to 90 % of before.
//! (A read cache has to admit the keys that became hot; without one, the busiest server
//! changes.)

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use serde::Serialize;

/// The step of the fine series.
pub const STEP: Duration = Duration::from_millis(100);
/// Steps kept at most (an hour); changes at most.
const STEPS_MAX: usize = 36_000;
const CHANGES_MAX: usize = 3_600;
/// Steps in a second.
const SECOND: usize = 10;

/// What happened around one popularity change.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Recovery {
    /// When the change came, seconds into the measured stretch.
    pub at_s: f64,
    /// Requests per second over the second before it.
    pub before_ops_per_s: f64,
    /// The lowest rate of a 100 ms step in the second after it.
    pub lowest_ops_per_s: f64,
    /// From the change to the end of the first 100 ms step, after the lowest, whose rate is
    /// at least 90 % of before (0 when no step of that second fell below 90 %; `None` when
    /// it did not come back before the next change or the end).
    pub back_to_90_after_s: Option<f64>,
    /// The second after the change over the second before it.
    pub next_second_ratio: Option<f64>,
}

/// The fine series of one run.
#[derive(Debug)]
pub struct Fine {
    from: Instant,
    next: Instant,
    /// Requests measured by the end of each step.
    counts: Vec<u64>,
    /// Steps (from the start) at which popularity changed.
    changes: Vec<usize>,
}

impl Fine {
    pub fn new(measure_from: Instant) -> Fine {
        Fine {
            from: measure_from,
            next: measure_from + STEP,
            counts: Vec::new(),
            changes: Vec::new(),
        }
    }

    /// When the next step ends.
    pub fn next_at(&self) -> Instant {
        self.next
    }

    /// `measured` requests by `now`: the steps that ended take it.
    pub fn tick(&mut self, measured: u64, now: Instant) {
        while now >= self.next {
            if self.counts.len() < STEPS_MAX {
                self.counts.push(measured);
            }
            self.next += STEP;
        }
    }

    /// Popularity changed at `at` (a step boundary, as the driver schedules changes).
    pub fn changed(&mut self, at: Instant) {
        if self.changes.len() < CHANGES_MAX {
            let step = at.saturating_duration_since(self.from).as_secs_f64() / STEP.as_secs_f64();
            self.changes.push(step.round() as usize);
        }
    }

    /// Requests per second in step `index`.
    fn rate(&self, index: usize) -> f64 {
        let before = match index {
            0 => 0,
            _ => self.counts[index - 1],
        };
        self.counts[index].saturating_sub(before) as f64 / STEP.as_secs_f64()
    }

    /// Requests per second over steps `from..until`.
    fn mean(&self, from: usize, until: usize) -> f64 {
        let start = match from {
            0 => 0,
            _ => self.counts[from - 1],
        };
        let steps = until.saturating_sub(from).max(1);
        self.counts[until - 1].saturating_sub(start) as f64 / (steps as f64 * STEP.as_secs_f64())
    }

    /// Every change with a second of series before it.
    pub fn recoveries(&self) -> Vec<Recovery> {
        let mut out = Vec::new();
        for (number, &change) in self.changes.iter().enumerate() {
            if change < SECOND || change + 1 > self.counts.len() {
                continue;
            }
            let until = self
                .changes
                .get(number + 1)
                .copied()
                .unwrap_or(usize::MAX)
                .min(self.counts.len());
            let before = self.mean(change - SECOND, change);
            let window = change..until.min(change + SECOND);
            let Some(lowest) = window
                .clone()
                .min_by(|a, b| self.rate(*a).total_cmp(&self.rate(*b)))
            else {
                continue;
            };
            let target = 0.9 * before;
            let back = if window.clone().all(|step| self.rate(step) >= target) {
                Some(0.0)
            } else {
                (lowest + 1..until)
                    .find(|step| self.rate(*step) >= target)
                    .map(|step| (step + 1 - change) as f64 * STEP.as_secs_f64())
            };
            out.push(Recovery {
                at_s: change as f64 * STEP.as_secs_f64(),
                before_ops_per_s: before.round(),
                lowest_ops_per_s: self.rate(lowest).round(),
                back_to_90_after_s: back.map(|seconds| (seconds * 10.0).round() / 10.0),
                next_second_ratio: (change + SECOND <= until && before > 0.0).then(|| {
                    (self.mean(change, change + SECOND) / before * 1000.0).round() / 1000.0
                }),
            });
        }
        out
    }
}

/// A line per change.
pub fn recoveries_text(recoveries: &[Recovery]) -> String {
    let mut out = String::new();
    for (index, recovery) in recoveries.iter().enumerate() {
        let _ = write!(
            out,
            "popularity change {} at {:.1} s: {} ops/s the second before, lowest 100 ms after: \
             {} ops/s; back to ≥ 90 % {}",
            index + 1,
            recovery.at_s,
            super::thousands(recovery.before_ops_per_s),
            super::thousands(recovery.lowest_ops_per_s),
            match recovery.back_to_90_after_s {
                Some(0.0) => "throughout (never below)".to_owned(),
                Some(seconds) => format!("after {seconds:.1} s"),
                None => "not before the next change or the end".to_owned(),
            }
        );
        if let Some(ratio) = recovery.next_second_ratio {
            let _ = write!(out, "; the second after / before: {:.0} %", ratio * 100.0);
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dip_after_a_change_and_its_recovery_are_found() {
        let start = Instant::now();
        let mut fine = Fine::new(start);
        // 1 000 requests per step (10 000/s) for 1.5 s, then 200, 400, 950, 1 000... and a
        // change at 1.5 s.
        let mut measured = 0;
        let per_step = [1000; 15]
            .into_iter()
            .chain([200, 400, 950])
            .chain([1000; 12]);
        for (index, count) in per_step.enumerate() {
            measured += count;
            if index == 15 {
                fine.changed(start + STEP * 15);
            }
            fine.tick(measured, start + STEP * (index as u32 + 1));
        }
        let recoveries = fine.recoveries();
        assert_eq!(recoveries.len(), 1);
        let recovery = &recoveries[0];
        assert_eq!(recovery.at_s, 1.5);
        assert_eq!(recovery.before_ops_per_s, 10_000.0);
        assert_eq!(recovery.lowest_ops_per_s, 2_000.0);
        // The third step after the change is at 95 %: back after 0.3 s.
        assert_eq!(recovery.back_to_90_after_s, Some(0.3));
        assert_eq!(recovery.next_second_ratio, Some(0.855));
        assert!(recoveries_text(&recoveries).contains("after 0.3 s"));
    }
}

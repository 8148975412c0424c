//! The progress line of a running mode, on stderr.

use std::io::{IsTerminal, Write};
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::plan::Plan;
use super::worker::Shared;
use super::{thousands, Mode};

/// The progress line on stderr: rewritten in place on a terminal, one line per mode otherwise.
pub(super) struct Progress {
    enabled: bool,
    terminal: bool,
    mode: Mode,
}

impl Progress {
    pub(super) fn new(enabled: bool, mode: Mode) -> Progress {
        let terminal = std::io::stderr().is_terminal();
        if enabled && !terminal {
            eprintln!("  running mode {} ...", mode.name());
        }
        Progress {
            enabled,
            terminal,
            mode,
        }
    }

    /// Rewrite the line: the warm-up, or the measured requests and their rate so far.
    pub(super) fn update(
        &self,
        plan: &Plan,
        shared: &Shared,
        start: Instant,
        measure_from: Instant,
        now: Instant,
    ) {
        if !self.enabled || !self.terminal {
            return;
        }
        let measured = shared.measured.load(Ordering::Relaxed);
        let text = if now < measure_from {
            format!(
                "warm-up {:.1}/{:.1} s",
                now.duration_since(start).as_secs_f64(),
                plan.warmup.as_secs_f64()
            )
        } else {
            let elapsed = now.duration_since(measure_from).as_secs_f64();
            let length = match (plan.duration, plan.requests) {
                (_, Some(requests)) => format!(
                    "{}/{} requests",
                    thousands(measured as f64),
                    thousands(requests as f64)
                ),
                (Some(duration), None) => {
                    format!("{elapsed:.1}/{:.1} s", duration.as_secs_f64())
                }
                (None, None) => String::new(),
            };
            let rate = if elapsed > 0.0 {
                measured as f64 / elapsed
            } else {
                0.0
            };
            format!(
                "{length}, {} measured, {} ops/s",
                thousands(measured as f64),
                thousands(rate)
            )
        };
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r\x1b[2K  {:<9} {text}", self.mode.name());
        let _ = err.flush();
    }

    /// Clear the line.
    pub(super) fn finish(&self) {
        if self.enabled && self.terminal {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K");
            let _ = err.flush();
        }
    }
}

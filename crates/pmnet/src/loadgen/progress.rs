//! The progress line of a running mode, on stderr.

use std::io::{IsTerminal, Write};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::worker::Shared;
use super::{thousands, Mode};

/// The progress line on stderr: rewritten in place on a terminal, one line per mode otherwise.
pub(super) struct Progress {
    enabled: bool,
    terminal: bool,
    mode: Mode,
    /// The plan's warm-up, and how long the mode measures: for a time, or these requests.
    warmup: Duration,
    duration: Option<Duration>,
    requests: Option<u64>,
}

impl Progress {
    pub(super) fn new(
        enabled: bool,
        mode: Mode,
        warmup: Duration,
        duration: Option<Duration>,
        requests: Option<u64>,
    ) -> Progress {
        let terminal = std::io::stderr().is_terminal();
        if enabled && !terminal {
            eprintln!("  running mode {} ...", mode.name());
        }
        Progress {
            enabled,
            terminal,
            mode,
            warmup,
            duration,
            requests,
        }
    }

    /// Rewrite the line: the warm-up, or the measured requests and their rate so far.
    pub(super) fn update(
        &self,
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
                self.warmup.as_secs_f64()
            )
        } else {
            let elapsed = now.duration_since(measure_from).as_secs_f64();
            let length = match (self.duration, self.requests) {
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

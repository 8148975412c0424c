//! Per-phase timing of the write path, for the Table 1 breakdown (`pmnet store-bench`).
//!
//! The engines call [`Breakdown::mark`] at the end of each phase when timing is enabled; the
//! time since the previous mark is charged to that phase. The clock is the TSC on x86_64
//! (a few ns per read), calibrated once against the monotonic clock; elsewhere `Instant`.

use std::sync::OnceLock;
use std::time::Instant;

/// The phases of Table 1 of "Packets as Persistent In-Memory Data Structures".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Turning the request into what the engine works on (parse, validate, views).
    Prepare,
    /// Computing a checksum of the data.
    Checksum,
    /// Copying the data into persistent memory.
    Copy,
    /// Taking a buffer for the record, and giving back at a commit the buffers of records that
    /// left the index in an earlier batch (the buddy allocator's merge, or a slot's return).
    Allocate,
    /// Linking the record into the index, session bookkeeping, retiring the record it
    /// replaces, and collecting at the commit the level-0 links that changed.
    Insert,
    /// Writing and flushing to PM what the commit makes durable, with its fences: the record's
    /// metadata line, the intent, the commit word, the changed level-0 links.
    Persist,
}

pub const PHASES: [Phase; 6] = [
    Phase::Prepare,
    Phase::Checksum,
    Phase::Copy,
    Phase::Allocate,
    Phase::Insert,
    Phase::Persist,
];

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Prepare => "request preparation",
            Phase::Checksum => "checksum calculation",
            Phase::Copy => "data copy",
            Phase::Allocate => "buffer allocation",
            Phase::Insert => "index insertion",
            Phase::Persist => "flush CPU caches to PM (+fences)",
        }
    }

    fn slot(self) -> usize {
        self as usize
    }
}

/// Accumulated ticks per phase.
#[derive(Debug, Clone, Default)]
pub struct Breakdown {
    ticks: [u64; 6],
    marks: [u64; 6],
    last: u64,
    pub operations: u64,
}

impl Breakdown {
    /// Start timing an operation now.
    pub fn start(&mut self) {
        self.last = ticks();
        self.operations += 1;
    }

    /// Charge the time since the previous mark to `phase`.
    pub fn mark(&mut self, phase: Phase) {
        let now = ticks();
        self.ticks[phase.slot()] += now.saturating_sub(self.last);
        self.marks[phase.slot()] += 1;
        self.last = now;
    }

    /// Mean nanoseconds per operation in `phase`, with the cost of the marks themselves taken
    /// out (`mark_cost_ns` per mark, see [`mark_cost_ns`]).
    pub fn mean_ns(&self, phase: Phase, mark_cost_ns: f64) -> f64 {
        if self.operations == 0 {
            return 0.0;
        }
        let total_ns = self.ticks[phase.slot()] as f64 / ticks_per_ns();
        let corrected = total_ns - self.marks[phase.slot()] as f64 * mark_cost_ns;
        corrected.max(0.0) / self.operations as f64
    }

    /// Whether `phase` was ever marked (a phase an engine does not have is reported as 0).
    pub fn has(&self, phase: Phase) -> bool {
        self.marks[phase.slot()] > 0
    }
}

/// What one `mark` costs on this machine (ns), to subtract from the phases.
pub fn mark_cost_ns() -> f64 {
    let mut breakdown = Breakdown::default();
    breakdown.start();
    let rounds = 100_000u64;
    let begin = ticks();
    for _ in 0..rounds {
        breakdown.mark(Phase::Prepare);
    }
    let elapsed = ticks().saturating_sub(begin) as f64 / ticks_per_ns();
    elapsed / rounds as f64
}

#[cfg(target_arch = "x86_64")]
fn raw_ticks() -> u64 {
    // SAFETY: rdtsc exists on every x86_64 CPU and has no preconditions.
    unsafe { core::arch::x86_64::_rdtsc() }
}

#[cfg(not(target_arch = "x86_64"))]
fn raw_ticks() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

pub fn ticks() -> u64 {
    raw_ticks()
}

/// Ticks per nanosecond, measured once against `Instant` over 20 ms.
pub fn ticks_per_ns() -> f64 {
    static RATE: OnceLock<f64> = OnceLock::new();
    *RATE.get_or_init(|| {
        let start_instant = Instant::now();
        let start_ticks = raw_ticks();
        while start_instant.elapsed().as_millis() < 20 {
            std::hint::spin_loop();
        }
        let elapsed_ns = start_instant.elapsed().as_nanos() as f64;
        let elapsed_ticks = raw_ticks().saturating_sub(start_ticks) as f64;
        if elapsed_ticks <= 0.0 || elapsed_ns <= 0.0 {
            1.0
        } else {
            elapsed_ticks / elapsed_ns
        }
    })
}

//! Persistent memory for pmnet: the [`PmRegion`] contract, a region on a memory-mapped file,
//! a simulated region that models what a crash leaves, and the PMNet device log built on them.

pub mod log;
#[cfg(target_os = "linux")]
mod log_file;
#[cfg(target_os = "linux")]
mod mmap;
mod region;
mod sim;

pub use log::{
    inspect as inspect_log, scan_for_entries, BatchStats, EntryKey, EntryScan, LogError,
    LogInspection, LogRecovery, LogWork, PmLog, RecoveredEntry, RejectedSlot, SlotDamage,
    REJECTED_SLOTS_DESCRIBED,
};
#[cfg(target_os = "linux")]
pub use log_file::{open_log_file, LogFileError, LogFileOpened, LogFileOptions};
#[cfg(target_os = "linux")]
pub use mmap::{FlushChoice, MmapOptions, MmapRegion, NewFile, PmError, ADDED_LATENCY_NS_MAX};
pub use region::{FlushMethod, Medium, MediumInfo, PmRegion, CACHE_LINE_SIZE};
pub use sim::SimRegion;

/// The seed for a randomised test: `PMNET_SEED` when set (to replay a failure), else a fresh
/// random one. Printed either way; the test harness shows it when the test fails.
#[cfg(test)]
pub(crate) fn test_seed(test_name: &str) -> u64 {
    let seed = match std::env::var("PMNET_SEED") {
        Ok(text) => text
            .trim()
            .parse::<u64>()
            .unwrap_or_else(|_| panic!("PMNET_SEED must be a u64, got {text:?}")),
        Err(_) => rand::random::<u64>(),
    };
    eprintln!("{test_name}: PMNET_SEED={seed}");
    seed
}

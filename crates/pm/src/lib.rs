//! Persistent memory for pmnet: the [`PmRegion`] contract, a region on a memory-mapped file,
//! a simulated region that models what a crash leaves, and the PMNet device log built on them.

mod region;

pub use region::{FlushMethod, Medium, MediumInfo, PmRegion, CACHE_LINE_SIZE};

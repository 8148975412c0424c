//! The device's read cache: PMNet's cache kept coherent with the update log, with NetCache's
//! query statistics and controller.
//!
//! Being built. So far: the data-plane query statistics ([`stats`]) that find the hot keys
//! among the reads the cache does not hold — a count-min sketch of their frequencies and a
//! Bloom filter so that each hot key is reported once per interval, everything bounded and
//! reset each interval. The cache function itself (the table of items, its coherence with the
//! log, its packet types) and the controller come next (docs/cache.md).

pub mod stats;

pub use stats::{BloomFilter, CountMinSketch, HotKeys, StatsConfig, StatsConfigError};

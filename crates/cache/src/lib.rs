//! The device's read cache: PMNet's cache kept coherent with the update log, with NetCache's
//! query statistics and controller.
//!
//! Being built. So far, tested on their own and not yet used by a device:
//! - [`stats`]: the data-plane query statistics that find the hot keys among the reads the
//!   cache does not hold — a count-min sketch of their frequencies and a Bloom filter so that
//!   each hot key is reported once per interval, everything bounded and reset each interval;
//! - [`table`]: the cached items and their coherence with the log (served only while durable,
//!   moved by keyed writes and their server-ACKs, fetches voided by writes, least-hit eviction).
//!
//! The cache function in the device's pipeline, the controller and the order of writes to one
//! key come next (docs/cache.md).

pub mod function;
pub mod sessions;
pub mod stats;
pub mod table;

pub use function::{CacheConfig, CacheCounters, CacheFunction};

pub use stats::{BloomFilter, CountMinSketch, HotKeys, StatsConfig, StatsConfigError};
pub use table::{CacheTable, FetchTicket, TableConfig, TableCounters};

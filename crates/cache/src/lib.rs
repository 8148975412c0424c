//! The device's read cache: PMNet's cache kept coherent with the update log, with NetCache's
//! query statistics and controller (docs/cache.md).
//!
//! - [`function`]: the cache as an in-network function in front of the log in a device's
//!   pipeline: it answers reads of cached keys, follows keyed writes and barriers, and runs the
//!   controller on its timer;
//! - [`sessions`]: what it knows of each session's requests (read-your-writes);
//! - [`stats`]: the data-plane query statistics that find the hot keys among the reads the
//!   cache does not hold — a count-min sketch of their frequencies and a Bloom filter so that
//!   each hot key is reported once per interval, everything bounded and reset each interval;
//! - [`table`]: the cached items and their coherence with the log (served only while durable,
//!   moved by keyed writes and their server-ACKs, fetches voided by writes, least-hit eviction).

pub mod function;
pub mod sessions;
pub mod stats;
pub mod table;

pub use function::{CacheConfig, CacheCounters, CacheFunction};

pub use stats::{BloomFilter, CountMinSketch, HotKeys, StatsConfig, StatsConfigError};
pub use table::{CacheTable, FetchTicket, TableConfig, TableCounters};

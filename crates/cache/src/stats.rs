//! Query statistics in the data plane (NetCache §4.4): which uncached keys are hot.
//!
//! Every read of a key the cache does not hold is counted in a count-min sketch (`rows`
//! arrays of `width` counters, one hash per row; a key's estimate is the smallest of its
//! counters, never below its true count). A key whose estimate reaches `threshold` is hot; a
//! Bloom filter remembers the keys reported this interval, so each is reported once. Reports
//! wait in a bounded queue for the controller. [`HotKeys::reset`] starts the next interval:
//! counters, filter and unread reports cleared. Memory is fixed at construction; nothing a
//! sender does grows it.

use std::collections::VecDeque;

/// The statistics' shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatsConfig {
    /// Hash rows of the sketch (NetCache's demo: 4).
    pub rows: usize,
    /// Counters per row (NetCache's demo: 256; more counters, fewer false hot keys).
    pub width: usize,
    /// Reads in one interval that make a key hot.
    pub threshold: u32,
    /// Bits of the Bloom filter of keys reported this interval.
    pub bloom_bits: usize,
    /// Hash functions of the Bloom filter.
    pub bloom_hashes: u32,
    /// Reports kept for the controller at most; later hot keys of the interval are counted as
    /// dropped reports.
    pub reports_max: usize,
    /// Bytes of a key the statistics look at (longer keys are never cached, so never counted).
    pub key_len_max: usize,
}

impl Default for StatsConfig {
    fn default() -> Self {
        StatsConfig {
            rows: 4,
            width: 256,
            threshold: 128,
            bloom_bits: 1 << 16,
            bloom_hashes: 3,
            reports_max: 1024,
            key_len_max: 256,
        }
    }
}

/// A configuration the statistics cannot run with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StatsConfigError {
    #[error("the sketch needs 1 to 16 rows, not {0}")]
    Rows(usize),
    #[error("the sketch needs 1 to 1048576 counters per row, not {0}")]
    Width(usize),
    #[error("the hot-key threshold must be at least 1")]
    Threshold,
    #[error("the Bloom filter needs 64 to 2^26 bits, not {0}")]
    BloomBits(usize),
    #[error("the Bloom filter needs 1 to 16 hash functions, not {0}")]
    BloomHashes(u32),
    #[error("at least one report must be kept, and at most 65536, not {0}")]
    Reports(usize),
}

impl StatsConfig {
    pub fn check(&self) -> Result<(), StatsConfigError> {
        if !(1..=16).contains(&self.rows) {
            return Err(StatsConfigError::Rows(self.rows));
        }
        if !(1..=1 << 20).contains(&self.width) {
            return Err(StatsConfigError::Width(self.width));
        }
        if self.threshold == 0 {
            return Err(StatsConfigError::Threshold);
        }
        if !(64..=1 << 26).contains(&self.bloom_bits) {
            return Err(StatsConfigError::BloomBits(self.bloom_bits));
        }
        if !(1..=16).contains(&self.bloom_hashes) {
            return Err(StatsConfigError::BloomHashes(self.bloom_hashes));
        }
        if !(1..=1 << 16).contains(&self.reports_max) {
            return Err(StatsConfigError::Reports(self.reports_max));
        }
        Ok(())
    }
}

/// Two independent 32-bit hashes of `key` (CRC32C under two seeds): every other hash is
/// derived from them (Kirsch and Mitzenmacher).
fn hashes(key: &[u8]) -> (u32, u32) {
    (
        crc32c::crc32c_append(0x9E37_79B9, key),
        crc32c::crc32c_append(0x85EB_CA6B, key) | 1,
    )
}

fn nth_hash((first, second): (u32, u32), n: u32) -> u32 {
    first.wrapping_add(n.wrapping_mul(second))
}

/// A count-min sketch of saturating 32-bit counters.
#[derive(Debug, Clone)]
pub struct CountMinSketch {
    rows: usize,
    width: usize,
    counters: Vec<u32>,
}

impl CountMinSketch {
    /// `rows` × `width` counters, all zero. Both must be at least 1.
    pub fn new(rows: usize, width: usize) -> CountMinSketch {
        let (rows, width) = (rows.max(1), width.max(1));
        CountMinSketch {
            rows,
            width,
            counters: vec![0; rows * width],
        }
    }

    fn cell(&self, pair: (u32, u32), row: usize) -> usize {
        row * self.width + nth_hash(pair, row as u32) as usize % self.width
    }

    fn cells(&self, key: &[u8]) -> impl Iterator<Item = usize> + '_ {
        let pair = hashes(key);
        (0..self.rows).map(move |row| self.cell(pair, row))
    }

    /// Count one occurrence of `key`; its estimate after counting it.
    pub fn increment(&mut self, key: &[u8]) -> u32 {
        let pair = hashes(key);
        let mut estimate = u32::MAX;
        for row in 0..self.rows {
            let cell = self.cell(pair, row);
            let counter = &mut self.counters[cell];
            *counter = counter.saturating_add(1);
            estimate = estimate.min(*counter);
        }
        estimate
    }

    /// How often `key` occurred at most (never less than it did).
    pub fn estimate(&self, key: &[u8]) -> u32 {
        self.cells(key)
            .map(|cell| self.counters[cell])
            .min()
            .unwrap_or(0)
    }

    pub fn clear(&mut self) {
        self.counters.fill(0);
    }
}

/// A Bloom filter: no false negatives, false positives at a rate set by its size.
#[derive(Debug, Clone)]
pub struct BloomFilter {
    bits: Vec<u64>,
    bit_count: u32,
    hash_count: u32,
}

impl BloomFilter {
    /// `bits` bits (at least 64, rounded up to a multiple of 64) probed by `hashes` hashes.
    pub fn new(bits: usize, hashes: u32) -> BloomFilter {
        let words = bits.max(64).div_ceil(64);
        BloomFilter {
            bits: vec![0; words],
            bit_count: u32::try_from(words * 64).unwrap_or(u32::MAX),
            hash_count: hashes.max(1),
        }
    }

    fn position(&self, pair: (u32, u32), n: u32) -> usize {
        (nth_hash(pair, n) % self.bit_count) as usize
    }

    fn positions(&self, key: &[u8]) -> impl Iterator<Item = usize> + '_ {
        let pair = hashes(key);
        (0..self.hash_count).map(move |n| self.position(pair, n))
    }

    /// Whether `key` may have been inserted (certainly not if `false`).
    pub fn contains(&self, key: &[u8]) -> bool {
        self.positions(key)
            .all(|bit| self.bits[bit / 64] & (1 << (bit % 64)) != 0)
    }

    /// Insert `key`; `true` if it was certainly not there before.
    pub fn insert(&mut self, key: &[u8]) -> bool {
        let pair = hashes(key);
        let mut new = false;
        for n in 0..self.hash_count {
            let bit = self.position(pair, n);
            let word = &mut self.bits[bit / 64];
            let mask = 1 << (bit % 64);
            new |= *word & mask == 0;
            *word |= mask;
        }
        new
    }

    pub fn clear(&mut self) {
        self.bits.fill(0);
    }
}

/// The hot-key detector of one device: sketch, filter and the reports for the controller.
#[derive(Debug, Clone)]
pub struct HotKeys {
    config: StatsConfig,
    sketch: CountMinSketch,
    reported: BloomFilter,
    reports: VecDeque<Vec<u8>>,
    /// Reads counted this interval.
    pub counted: u64,
    /// Hot keys not reported because the queue was full, this interval.
    pub reports_dropped: u64,
    /// Keys too long to be counted, this interval.
    pub too_long: u64,
}

impl HotKeys {
    pub fn new(config: StatsConfig) -> Result<HotKeys, StatsConfigError> {
        config.check()?;
        Ok(HotKeys {
            config,
            sketch: CountMinSketch::new(config.rows, config.width),
            reported: BloomFilter::new(config.bloom_bits, config.bloom_hashes),
            reports: VecDeque::with_capacity(config.reports_max.min(1024)),
            counted: 0,
            reports_dropped: 0,
            too_long: 0,
        })
    }

    pub fn config(&self) -> &StatsConfig {
        &self.config
    }

    /// A read of `key`, which the cache does not hold. `true` if this read made it hot and it
    /// was reported (once per interval).
    pub fn record_miss(&mut self, key: &[u8]) -> bool {
        if key.len() > self.config.key_len_max {
            self.too_long += 1;
            return false;
        }
        self.counted += 1;
        if self.sketch.increment(key) < self.config.threshold || !self.reported.insert(key) {
            return false;
        }
        if self.reports.len() >= self.config.reports_max {
            self.reports_dropped += 1;
            return false;
        }
        self.reports.push_back(key.to_vec());
        true
    }

    /// The hot keys reported since the last call, in the order they became hot.
    pub fn take_reports(&mut self) -> Vec<Vec<u8>> {
        self.reports.drain(..).collect()
    }

    /// Start a new interval of reports, keeping the counts: a key still hot is reported again
    /// at its next miss (the controller may have cached it, and a write dropped it since).
    pub fn new_reports(&mut self) {
        self.reported.clear();
        self.reports.clear();
        self.reports_dropped = 0;
    }

    /// Start a new interval: counts and reports.
    pub fn reset(&mut self) {
        self.sketch.clear();
        self.reported.clear();
        self.reports.clear();
        self.counted = 0;
        self.reports_dropped = 0;
        self.too_long = 0;
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;

    fn seed() -> u64 {
        let seed = std::env::var("PMNET_SEED")
            .ok()
            .map(|text| text.trim().parse().expect("PMNET_SEED must be a u64"))
            .unwrap_or_else(rand::random);
        eprintln!("PMNET_SEED={seed}");
        seed
    }

    #[test]
    fn the_sketch_never_counts_a_key_less_than_it_occurred() {
        let seed = seed();
        let mut rng = StdRng::seed_from_u64(seed);
        let mut sketch = CountMinSketch::new(4, 64);
        let mut exact: HashMap<Vec<u8>, u32> = HashMap::new();
        for _ in 0..20_000 {
            // A skewed workload over 500 keys: low numbers far more often.
            let key = format!("k{}", rng.random_range(0..500u32).pow(2) / 500).into_bytes();
            let after = sketch.increment(&key);
            let count = exact.entry(key).or_default();
            *count += 1;
            assert!(after >= *count, "seed {seed}");
        }
        for (key, count) in &exact {
            assert!(sketch.estimate(key) >= *count, "seed {seed}");
        }
        sketch.clear();
        assert!(exact.keys().all(|key| sketch.estimate(key) == 0));
    }

    #[test]
    fn the_filter_has_no_false_negatives() {
        let seed = seed();
        let mut rng = StdRng::seed_from_u64(seed);
        let mut filter = BloomFilter::new(4096, 3);
        let keys: Vec<Vec<u8>> = (0..300)
            .map(|_| rng.random::<u64>().to_be_bytes().to_vec())
            .collect();
        for key in &keys {
            filter.insert(key);
        }
        assert!(keys.iter().all(|key| filter.contains(key)), "seed {seed}");
        assert!(!filter.insert(&keys[0]), "a second insert is not new");
        filter.clear();
        assert!(!filter.contains(&keys[0]));
    }

    #[test]
    fn a_key_is_reported_once_when_it_becomes_hot_and_again_after_a_reset() {
        let config = StatsConfig {
            threshold: 3,
            ..StatsConfig::default()
        };
        let mut hot = HotKeys::new(config).unwrap();
        assert!(!hot.record_miss(b"k"));
        assert!(!hot.record_miss(b"k"));
        assert!(hot.record_miss(b"k"), "the third read makes it hot");
        assert!(!hot.record_miss(b"k"), "reported once per interval");
        assert_eq!(hot.take_reports(), vec![b"k".to_vec()]);
        assert!(hot.take_reports().is_empty());
        hot.reset();
        assert_eq!(hot.counted, 0);
        for _ in 0..2 {
            assert!(!hot.record_miss(b"k"));
        }
        assert!(hot.record_miss(b"k"), "hot again in the next interval");
    }

    #[test]
    fn reports_and_keys_are_bounded() {
        let config = StatsConfig {
            threshold: 1,
            reports_max: 4,
            key_len_max: 8,
            ..StatsConfig::default()
        };
        let mut hot = HotKeys::new(config).unwrap();
        for n in 0..100u32 {
            hot.record_miss(&n.to_be_bytes());
        }
        assert_eq!(hot.take_reports().len(), 4);
        assert!(hot.reports_dropped > 0);
        assert!(!hot.record_miss(&[0u8; 9]));
        assert_eq!(hot.too_long, 1);
    }

    #[test]
    fn bad_configurations_are_refused_with_what_is_wrong() {
        let bad = |change: fn(&mut StatsConfig)| {
            let mut config = StatsConfig::default();
            change(&mut config);
            HotKeys::new(config).unwrap_err().to_string()
        };
        assert!(bad(|c| c.rows = 0).contains("rows"));
        assert!(bad(|c| c.width = 0).contains("counters per row"));
        assert!(bad(|c| c.threshold = 0).contains("threshold"));
        assert!(bad(|c| c.bloom_bits = 8).contains("Bloom filter"));
        assert!(bad(|c| c.bloom_hashes = 0).contains("hash functions"));
        assert!(bad(|c| c.reports_max = 0).contains("report"));
    }
}

//! A latency histogram with fixed buckets: bounded memory, one comparison scan per sample,
//! and the shape of a Prometheus classic histogram (cumulative `le` buckets, a sum, a count).

use std::time::Duration;

/// Upper bounds of the buckets, in nanoseconds: 5 µs to 10 s, roughly 1-2.5-5 per decade.
/// A sample above the last lands in the implicit `+Inf` bucket.
pub const LATENCY_BUCKETS_NS: [u64; 20] = [
    5_000,
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
    5_000_000_000,
    10_000_000_000,
];

/// Samples per bucket (not cumulative; the last entry counts samples above every bound), their
/// sum and their count.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LatencyHistogram {
    counts: [u64; LATENCY_BUCKETS_NS.len() + 1],
    sum_ns: u128,
    count: u64,
}

impl LatencyHistogram {
    pub fn new() -> LatencyHistogram {
        LatencyHistogram::default()
    }

    /// Count one sample.
    pub fn record(&mut self, latency: Duration) {
        let nanos = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
        let bucket = LATENCY_BUCKETS_NS
            .iter()
            .position(|bound| nanos <= *bound)
            .unwrap_or(LATENCY_BUCKETS_NS.len());
        self.counts[bucket] += 1;
        self.sum_ns += u128::from(nanos);
        self.count += 1;
    }

    /// Add every sample of `other` to this histogram.
    pub fn merge(&mut self, other: &LatencyHistogram) {
        for (mine, theirs) in self.counts.iter_mut().zip(other.counts) {
            *mine += theirs;
        }
        self.sum_ns += other.sum_ns;
        self.count += other.count;
    }

    /// Samples counted.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The sum of the samples, in seconds.
    pub fn sum_seconds(&self) -> f64 {
        self.sum_ns as f64 / 1e9
    }

    /// `(upper bound in seconds, samples at or below it)` for every bucket, cumulative, the
    /// last with bound `f64::INFINITY` and the total count.
    pub fn cumulative(&self) -> Vec<(f64, u64)> {
        let bounds = LATENCY_BUCKETS_NS
            .iter()
            .map(|nanos| *nanos as f64 / 1e9)
            .chain(std::iter::once(f64::INFINITY));
        bounds
            .zip(self.counts.iter().scan(0u64, |total, count| {
                *total += count;
                Some(*total)
            }))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_cumulative_and_bounded() {
        let mut histogram = LatencyHistogram::new();
        histogram.record(Duration::from_micros(1));
        histogram.record(Duration::from_micros(5));
        histogram.record(Duration::from_micros(6));
        histogram.record(Duration::from_millis(3));
        histogram.record(Duration::from_secs(60));
        let buckets = histogram.cumulative();
        assert_eq!(buckets.len(), LATENCY_BUCKETS_NS.len() + 1);
        assert_eq!(buckets[0], (5e-6, 2));
        assert_eq!(buckets[1], (1e-5, 3));
        assert_eq!(buckets[9], (5e-3, 4));
        assert_eq!(buckets[19], (10.0, 4));
        assert_eq!(buckets[20], (f64::INFINITY, 5));
        assert!(buckets.windows(2).all(|pair| pair[0].1 <= pair[1].1));
        assert_eq!(histogram.count(), 5);
        let sum = 1e-6 + 5e-6 + 6e-6 + 3e-3 + 60.0;
        assert!((histogram.sum_seconds() - sum).abs() < 1e-9);
        let mut merged = LatencyHistogram::new();
        merged.merge(&histogram);
        merged.merge(&histogram);
        assert_eq!(merged.count(), 10);
        assert_eq!(merged.cumulative().last(), Some(&(f64::INFINITY, 10)));
    }
}

//! Latencies: histograms in nanoseconds, their summaries and CDFs in microseconds.

use hdrhistogram::Histogram;
use serde::Serialize;

/// Latencies are recorded in nanoseconds, from 1 ns to this bound (longer ones are clamped to
/// it and counted in `clamped`); three significant digits.
pub const HISTOGRAM_MAX_NS: u64 = 60_000_000_000;

/// A histogram of latencies in nanoseconds with the bounds above.
pub fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, HISTOGRAM_MAX_NS, 3).expect("valid histogram bounds")
}

/// Record `nanos`, clamped to the histogram's range.
pub fn record(histogram: &mut Histogram<u64>, nanos: u64) {
    let _ = histogram.record(nanos.clamp(1, HISTOGRAM_MAX_NS));
}

/// Percentiles of one set of latencies, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LatencySummary {
    pub count: u64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub mean_us: f64,
    pub min_us: f64,
    pub max_us: f64,
}

fn us(nanos: u64) -> f64 {
    // Two decimals are more than the histogram's precision at these magnitudes.
    (nanos as f64 / 10.0).round() / 100.0
}

/// The summary of `histogram`, or `None` when it is empty.
pub fn summarize(histogram: &Histogram<u64>) -> Option<LatencySummary> {
    if histogram.is_empty() {
        return None;
    }
    Some(LatencySummary {
        count: histogram.len(),
        p50_us: us(histogram.value_at_quantile(0.50)),
        p99_us: us(histogram.value_at_quantile(0.99)),
        p999_us: us(histogram.value_at_quantile(0.999)),
        mean_us: (histogram.mean() / 10.0).round() / 100.0,
        min_us: us(histogram.min()),
        max_us: us(histogram.max()),
    })
}

/// The quantiles a latency CDF is drawn at: every percent, then the tail.
const CDF_QUANTILES: [f64; 6] = [0.995, 0.999, 0.9995, 0.9999, 0.99999, 1.0];

/// Points `[quantile, µs]` of the latency CDF of `histogram` (empty when it is).
pub fn cdf_points(histogram: &Histogram<u64>) -> Vec<[f64; 2]> {
    if histogram.is_empty() {
        return Vec::new();
    }
    (1..100)
        .map(|percent| f64::from(percent) / 100.0)
        .chain(CDF_QUANTILES)
        .map(|quantile| [quantile, us(histogram.value_at_quantile(quantile))])
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cdf_rises_to_the_maximum() {
        let mut histogram = new_histogram();
        for nanos in 1..=1000u64 {
            record(&mut histogram, nanos * 1000);
        }
        let points = cdf_points(&histogram);
        assert_eq!(points.len(), 99 + CDF_QUANTILES.len());
        assert!(points
            .windows(2)
            .all(|pair| pair[0][0] < pair[1][0] && pair[0][1] <= pair[1][1]));
        assert!((points[49][1] - 500.0).abs() < 1.0, "{:?}", points[49]);
        assert_eq!(points.last().unwrap()[0], 1.0);
        assert!((points.last().unwrap()[1] - 1000.0).abs() < 1.5);
        assert!(cdf_points(&new_histogram()).is_empty());
    }

    #[test]
    fn summaries_report_microseconds() {
        let mut histogram = new_histogram();
        for nanos in 1..=1000u64 {
            record(&mut histogram, nanos * 1000);
        }
        let summary = summarize(&histogram).unwrap();
        assert_eq!(summary.count, 1000);
        assert!((summary.p50_us - 500.0).abs() < 1.0, "{summary:?}");
        assert!((summary.p99_us - 990.0).abs() < 1.5, "{summary:?}");
        assert!((summary.p999_us - 999.0).abs() < 1.5, "{summary:?}");
        assert!((summary.max_us - 1000.0).abs() < 1.5, "{summary:?}");
        assert!(summarize(&new_histogram()).is_none());
        // Out of range values are clamped, not lost.
        record(&mut histogram, u64::MAX);
        assert_eq!(histogram.len(), 1001);
    }
}

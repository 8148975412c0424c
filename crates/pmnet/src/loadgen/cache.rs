//! The read cache on the rack: `pmnet bench --cache on|off|on,off`. With the cache on, the
//! rack's device runs the cache function in front of its log (as `pmnet device --cache`), and
//! the rack's clients send every update as a keyed update (the key, and the reply a read of it
//! gives afterwards) and every read as a cache read. `on,off` runs both, side by side, on the
//! same workload and seed. This file has the options, the device's cache settings, what a run
//! reports about the cache, and the comparison of the two.

use std::fmt::Write as _;
use std::time::Duration;

use clap::Args;

use pmnet_runtime::Metrics;

use super::results::{CacheComparison, CacheResult, ModeResult};

/// `pmnet bench`'s read cache options.
#[derive(Debug, Clone, Args)]
pub struct CacheArgs {
    /// The read cache in the rack's device: off (default), on, or on,off (both in one run,
    /// side by side, same workload and seed). With it on, updates go as keyed updates and
    /// reads as cache reads; it applies to the pmnet and pmnet-auth modes of a rack.
    #[arg(long = "cache", value_name = "on|off|on,off", value_delimiter = ',',
          value_parser = parse_switch, default_value = "off")]
    pub cache: Vec<bool>,

    /// Keys the cache holds at most.
    #[arg(long, value_name = "N", default_value_t = 10_000,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub cache_items: u32,

    /// Milliseconds between the cache controller's turns (hot keys admitted, statistics
    /// reset).
    #[arg(long, value_name = "MS", default_value_t = 100,
          value_parser = clap::value_parser!(u64).range(1..=60_000))]
    pub cache_interval_ms: u64,

    /// Misses of one key in an interval that make it hot (its count-min estimate). With the
    /// default interval, the default admits a key read about 20 times a second or more while
    /// uncached within a few intervals: at the 40 000–70 000 reads/s a 2-vCPU machine's rack
    /// reaches under Zipf 0.99, the 200 or so hottest keys.
    #[arg(long, value_name = "N", default_value_t = 2,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub cache_hot_threshold: u32,

    /// Counters per row of the cache's count-min sketch (4 rows). Far fewer counters than
    /// keys read in an interval make cold keys look hot.
    #[arg(long, value_name = "N", default_value_t = 65_536,
          value_parser = clap::value_parser!(u32).range(64..=1_048_576))]
    pub cache_sketch_width: u32,

    /// Hot keys the controller admits per interval at most (a key admitted is fetched on its
    /// next miss).
    #[arg(long, value_name = "N", default_value_t = 1024,
          value_parser = clap::value_parser!(u32).range(1..=65_536))]
    pub cache_inserts_per_interval: u32,
}

fn parse_switch(text: &str) -> Result<bool, String> {
    match text.trim() {
        "on" => Ok(true),
        "off" => Ok(false),
        other => Err(format!("{other:?}: give on, off, or on,off")),
    }
}

/// The device's cache, as the bench starts it.
#[derive(Debug, Clone, Copy)]
pub struct CacheSettings {
    pub items: u32,
    /// Bytes of a cached reply at most: the workload's value and the reply's framing.
    pub reply_max: usize,
    pub interval: Duration,
    pub hot_threshold: u32,
    pub sketch_width: u32,
    pub inserts_per_interval: u32,
}

impl CacheSettings {
    pub fn from_args(args: &CacheArgs, value_len: usize) -> CacheSettings {
        CacheSettings {
            items: args.cache_items,
            reply_max: value_len + 32,
            interval: Duration::from_millis(args.cache_interval_ms),
            hot_threshold: args.cache_hot_threshold,
            sketch_width: args.cache_sketch_width,
            inserts_per_interval: args.cache_inserts_per_interval,
        }
    }

    /// The cache function of device `device_id`. Every client of a bench is new, so nothing
    /// sent before the device started can come back: fetches start at once.
    pub fn function(&self, device_id: u16) -> Result<pmnet_cache::CacheFunction, String> {
        let mut config = pmnet_cache::CacheConfig::new(device_id);
        config.table.items_max = self.items as usize;
        config.table.reply_max = self.reply_max;
        config.interval = self.interval;
        config.stats.threshold = self.hot_threshold;
        config.stats.width = self.sketch_width as usize;
        config.inserts_per_interval = self.inserts_per_interval as usize;
        config.fetch_warmup = Duration::ZERO;
        pmnet_cache::CacheFunction::new(config)
            .map_err(|error| format!("the read cache's statistics: {error}"))
    }

    /// The settings in words.
    pub fn text(&self) -> String {
        format!(
            "{} keys, replies up to {} B, controller every {} ms admitting at most {} keys hot \
             after {} misses (count-min 4 × {})",
            self.items,
            self.reply_max,
            self.interval.as_millis(),
            self.inserts_per_interval,
            self.hot_threshold,
            self.sketch_width
        )
    }
}

/// What the cache is run with: its settings, and whether each run has it on (in order).
#[derive(Debug, Clone)]
pub struct CachePlan {
    pub settings: Option<CacheSettings>,
    pub variants: Vec<bool>,
}

impl CachePlan {
    /// No cache.
    pub fn off() -> CachePlan {
        CachePlan {
            settings: None,
            variants: vec![false],
        }
    }

    /// The plan of `--cache` and its settings; a cache needs a rack and a pmnet mode.
    pub fn from_args(
        args: &CacheArgs,
        rack: bool,
        has_pmnet_mode: bool,
        value_len: usize,
    ) -> Result<CachePlan, String> {
        let mut variants = Vec::new();
        for on in &args.cache {
            if !variants.contains(on) {
                variants.push(*on);
            }
        }
        if !variants.contains(&true) {
            return Ok(CachePlan::off());
        }
        if !rack {
            return Err(
                "--cache on measures the read cache on a rack: give --servers S (and \
                 --server-max-ops-per-s N)"
                    .into(),
            );
        }
        if !has_pmnet_mode {
            return Err(
                "--cache on runs the cache in the device of the pmnet modes: add pmnet \
                 to --mode"
                    .into(),
            );
        }
        Ok(CachePlan {
            settings: Some(CacheSettings::from_args(args, value_len)),
            variants,
        })
    }
}

impl CacheResult {
    /// The cache's counters from the device's metrics, with the clients' measured reads.
    pub fn new(
        device: &[Metrics],
        reads: u64,
        served_by_device: u64,
        settings: &CacheSettings,
    ) -> CacheResult {
        let counter = |name: &str| -> u64 {
            device
                .iter()
                .filter_map(|metrics| metrics.value(name, &[]))
                .sum::<f64>() as u64
        };
        let inserts = counter("pmnet_cache_inserts_total");
        let evictions = counter("pmnet_cache_evictions_total");
        let invalidations = counter("pmnet_cache_invalidations_total");
        CacheResult {
            hit_ratio: if reads == 0 {
                0.0
            } else {
                (served_by_device as f64 / reads as f64 * 1e4).round() / 1e4
            },
            reads,
            reads_served_by_device: served_by_device,
            items: inserts.saturating_sub(evictions + invalidations),
            inserts,
            evictions,
            invalidations,
            fetches: counter("pmnet_cache_fetches_total"),
            device_hits: counter("pmnet_cache_hits_total"),
            device_misses: counter("pmnet_cache_misses_total"),
            not_yet_servable: counter("pmnet_cache_not_yet_servable_total"),
            fetches_voided: counter("pmnet_cache_fetches_voided_total"),
            settings: settings.text(),
        }
    }

    /// One line about the cache of a run.
    pub fn text(&self) -> String {
        format!(
            "cache: hit ratio {:.1} % ({} of {} measured reads served by the device); items {}, \
             inserts {}, evictions {}, invalidations {}, fetches {} ({} voided by writes), \
             misses {} ({} as the session had requests not yet settled) (device counters over \
             the whole run); {}",
            self.hit_ratio * 100.0,
            self.reads_served_by_device,
            self.reads,
            self.items,
            self.inserts,
            self.evictions,
            self.invalidations,
            self.fetches,
            self.fetches_voided,
            self.device_misses,
            self.not_yet_servable,
            self.settings
        )
    }
}

fn rounded(value: f64) -> f64 {
    (value * 1000.0).round() / 1000.0
}

/// Every cache-on result against the cache-off result of the same mode.
pub fn comparisons(results: &[ModeResult]) -> Vec<CacheComparison> {
    let mut out = Vec::new();
    for on in results {
        let (Some(cache), Some(base)) = (&on.cache, on.mode.strip_suffix(CACHE_SUFFIX)) else {
            continue;
        };
        let Some(off) = results
            .iter()
            .find(|result| result.mode == base && result.cache.is_none())
        else {
            continue;
        };
        let ideal_gain = off.busiest_server_share.and_then(|share| {
            (cache.hit_ratio < 1.0)
                .then(|| rounded(f64::from(off.servers) * share / (1.0 - cache.hit_ratio)))
        });
        let hit_p50 = on.reads_by_device.map(|summary| summary.p50_us);
        let off_p50 = off.reads_by_server.map(|summary| summary.p50_us);
        out.push(CacheComparison {
            on: on.mode.clone(),
            off: off.mode.clone(),
            gain: if off.ops_per_s > 0.0 {
                rounded(on.ops_per_s / off.ops_per_s)
            } else {
                0.0
            },
            ideal_gain,
            hit_ratio: cache.hit_ratio,
            read_p50_hit_vs_off: match (hit_p50, off_p50) {
                (Some(hit), Some(off)) if off > 0.0 => Some(rounded(hit / off)),
                _ => None,
            },
        });
    }
    out
}

/// The comparison lines.
pub fn comparisons_text(comparisons: &[CacheComparison]) -> String {
    let mut out = String::new();
    for comparison in comparisons {
        let _ = writeln!(
            out,
            "  {} / {}: throughput {:.2}× with hit ratio {:.1} %; ideal S × share / (1 − h) = {}{}",
            comparison.on,
            comparison.off,
            comparison.gain,
            comparison.hit_ratio * 100.0,
            comparison
                .ideal_gain
                .map_or_else(|| "-".to_owned(), |ideal| format!("{ideal:.2}×")),
            comparison
                .read_p50_hit_vs_off
                .map_or_else(String::new, |ratio| format!(
                    "; p50 of a cached read / p50 of a read answered by a server with the \
                     cache off: {ratio:.2}×"
                )),
        );
    }
    out
}

/// A rack result's reads: who answered them, their latency, and what the check of their
/// values found.
pub fn reads_text(result: &ModeResult) -> String {
    let summary = |what: &str, reads: Option<super::latency::LatencySummary>| {
        reads.map(|reads| {
            format!(
                "{} answered by {what} (p50 {:.1} µs, p99 {:.1} µs, p99.9 {:.1} µs)",
                reads.count, reads.p50_us, reads.p99_us, reads.p999_us
            )
        })
    };
    let parts: Vec<String> = [
        summary("the device", result.reads_by_device),
        summary("a server", result.reads_by_server),
    ]
    .into_iter()
    .flatten()
    .collect();
    format!(
        "reads: {}; {} read values checked, {} named no write of their key",
        if parts.is_empty() {
            "none measured".to_owned()
        } else {
            parts.join(", ")
        },
        result.reads_checked,
        result.reads_unexplained
    )
}

/// What a mode's name gets with the cache on.
pub const CACHE_SUFFIX: &str = "+cache";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ideal_gain_comes_from_the_off_runs_share_and_the_on_runs_hits() {
        let mut off = ModeResult::from_summary("pmnet", "", None);
        off.ops_per_s = 10_000.0;
        off.servers = 32;
        off.busiest_server_share = Some(0.09);
        let mut on = ModeResult::from_summary("pmnet+cache", "", None);
        on.ops_per_s = 50_000.0;
        let settings = CacheSettings {
            items: 10,
            reply_max: 132,
            interval: Duration::from_millis(100),
            hot_threshold: 3,
            sketch_width: 64,
            inserts_per_interval: 4,
        };
        let mut metrics = Metrics::new();
        metrics.counter("pmnet_cache_inserts_total", "", &[], 12);
        metrics.counter("pmnet_cache_evictions_total", "", &[], 2);
        metrics.counter("pmnet_cache_invalidations_total", "", &[], 1);
        on.cache = Some(CacheResult::new(&[metrics], 1000, 640, &settings));
        let cache = on.cache.as_ref().unwrap();
        assert_eq!((cache.items, cache.inserts, cache.evictions), (9, 12, 2));
        assert_eq!(cache.hit_ratio, 0.64);
        let comparisons = comparisons(&[on, off]);
        assert_eq!(comparisons.len(), 1);
        assert_eq!(comparisons[0].gain, 5.0);
        assert_eq!(comparisons[0].ideal_gain, Some(8.0));
        assert!(comparisons_text(&comparisons).contains("8.00×"));
    }

    #[test]
    fn the_switch_takes_on_and_off() {
        assert_eq!(parse_switch("on"), Ok(true));
        assert_eq!(parse_switch("off"), Ok(false));
        assert!(parse_switch("maybe").unwrap_err().contains("on,off"));
    }
}

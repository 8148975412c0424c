//! The load generator every system gets: closed-loop clients, one thread each, one request
//! at a time, keys and values drawn from the run's seed; latencies of the requests started
//! after the warm-up and completed inside the measured interval, in HdrHistograms.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use pmnet_runtime::Shutdown;

use pmnet::loadgen::{key_name, RequestGenerator, Workload};
use pmnet::CliError;

/// The name of the lock every client contends for.
pub const LOCK_NAME: &str = "coord-bench-lock";

/// A client of one system, used by one thread at a time.
pub trait CoordClient: Send {
    /// Read `key` (which holds a value): the system's ordinary read.
    fn read(&mut self, key: &str) -> Result<(), CliError>;
    /// Write `value` to `key` (which exists).
    fn write(&mut self, key: &str, value: &[u8]) -> Result<(), CliError>;
    /// Give `key` its first value (ZooKeeper makes the node).
    fn create(&mut self, key: &str, value: &[u8]) -> Result<(), CliError> {
        self.write(key, value)
    }
    /// Take lock `name`, trying again at once while another client holds it; how many
    /// attempts it took.
    fn acquire(&mut self, name: &str) -> Result<u64, CliError>;
    /// Release lock `name`, which this client holds.
    fn release(&mut self, name: &str) -> Result<(), CliError>;
}

/// What is measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Op {
    /// Reads of keys drawn uniformly.
    Read,
    /// Writes of keys drawn uniformly.
    Write,
    /// Acquire and release of one lock all clients contend for: a cycle.
    Lock,
    /// Reads and writes mixed (the read-scaling workload).
    #[value(skip)]
    Mixed,
}

impl Op {
    pub fn name(self) -> &'static str {
        match self {
            Op::Read => "read",
            Op::Write => "write",
            Op::Lock => "lock",
            Op::Mixed => "read-mostly",
        }
    }
}

/// One measured stretch: an op, a workload, a length.
#[derive(Debug, Clone)]
pub struct Phase {
    pub op: Op,
    pub workload: Workload,
    pub seed: u64,
    pub warmup: Duration,
    pub duration: Duration,
    /// The CPU every client thread runs on (`--pin`).
    pub client_cpu: Option<usize>,
}

/// What one stretch measured.
#[derive(Debug, Clone, Default)]
pub struct Measured {
    /// Requests (lock: cycles) measured.
    pub count: u64,
    /// Requests (cycles) completed in the whole phase, warm-up included.
    pub completed: u64,
    /// Reads among them (the rest are writes), for the mixed workload.
    pub reads: u64,
    /// Lock attempts made by the measured cycles.
    pub lock_attempts: u64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub mean_us: f64,
    pub ops_per_s: f64,
    /// The measured interval (shorter than asked if a signal cut it short).
    pub seconds: f64,
    pub interrupted: bool,
}

/// Per-thread tallies.
struct Tally {
    histogram: Histogram<u64>,
    completed: u64,
    reads: u64,
    lock_attempts: u64,
    /// When the last measured operation finished.
    last_finished: Option<Instant>,
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid histogram bounds")
}

/// The value every write of a run writes: `len` bytes drawn from the seed.
pub fn value_of(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x7661_6c75_6573);
    (0..len)
        .map(|_| b"abcdefghijklmnopqrstuvwxyz0123456789"[rng.random_range(0..36)])
        .collect()
}

/// Run `phase` with one thread per client of `clients`.
pub fn run_phase(
    clients: &mut [Box<dyn CoordClient>],
    phase: &Phase,
    shutdown: &Shutdown,
) -> Result<Measured, CliError> {
    assert!(!clients.is_empty(), "at least one client");
    let stop = AtomicBool::new(false);
    // Operations measured by all the clients so far: a phase goes on past its end until one
    // was (on a loaded host a slow system may complete none within a short window).
    let recorded = AtomicU64::new(0);
    let start = Instant::now();
    let measure_from = start + phase.warmup;
    let end = measure_from + phase.duration;
    let value = value_of(phase.seed, phase.workload.value_len);
    let results: Vec<Result<Tally, CliError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = clients
            .iter_mut()
            .enumerate()
            .map(|(index, client)| {
                let (stop, value, recorded) = (&stop, &value, &recorded);
                scope.spawn(move || {
                    let result = client_loop(
                        client.as_mut(),
                        phase,
                        index as u32,
                        value,
                        (measure_from, end),
                        (stop, shutdown, recorded),
                    );
                    if result.is_err() {
                        stop.store(true, Ordering::Relaxed);
                    }
                    result
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|handle| {
                handle
                    .join()
                    .unwrap_or_else(|_| Err("a client thread panicked".into()))
            })
            .collect()
    });
    let finished = Instant::now();
    let mut merged = histogram();
    let mut measured = Measured::default();
    let mut last_finished = end;
    for result in results {
        let tally = result?;
        last_finished = last_finished.max(tally.last_finished.unwrap_or(end));
        merged
            .add(&tally.histogram)
            .map_err(|error| format!("merging histograms: {error}"))?;
        measured.reads += tally.reads;
        measured.lock_attempts += tally.lock_attempts;
        measured.completed += tally.completed;
    }
    measured.interrupted = shutdown.is_requested();
    let until = if measured.interrupted {
        finished.min(last_finished)
    } else {
        last_finished
    };
    measured.seconds = until.saturating_duration_since(measure_from).as_secs_f64();
    measured.count = merged.len();
    let us = |quantile: f64| merged.value_at_quantile(quantile) as f64 / 1000.0;
    measured.p50_us = us(0.50);
    measured.p99_us = us(0.99);
    measured.p999_us = us(0.999);
    measured.mean_us = merged.mean() / 1000.0;
    measured.ops_per_s = if measured.seconds > 0.0 {
        measured.count as f64 / measured.seconds
    } else {
        0.0
    };
    Ok(measured)
}

/// One client's closed loop until `end` and at least one operation of the phase was measured
/// (or a stop).
fn client_loop(
    client: &mut dyn CoordClient,
    phase: &Phase,
    index: u32,
    value: &[u8],
    (measure_from, end): (Instant, Instant),
    (stop, shutdown, recorded): (&AtomicBool, &Shutdown, &AtomicU64),
) -> Result<Tally, CliError> {
    if let Some(cpu) = phase.client_cpu {
        pmnet_runtime::pin_current_thread(cpu)?;
    }
    let mut keys = RequestGenerator::new(&phase.workload, phase.seed, index);
    let mut rng = ChaCha8Rng::seed_from_u64(pmnet::loadgen::client_seed(phase.seed, index) ^ 1);
    let mut tally = Tally {
        histogram: histogram(),
        completed: 0,
        reads: 0,
        lock_attempts: 0,
        last_finished: None,
    };
    loop {
        if stop.load(Ordering::Relaxed) || shutdown.is_requested() {
            break;
        }
        let started = Instant::now();
        if started >= end && recorded.load(Ordering::Relaxed) > 0 {
            break;
        }
        let (is_read, attempts) = match phase.op {
            Op::Read => {
                client.read(&key_name(keys.next_key()))?;
                (true, 0)
            }
            Op::Write => {
                client.write(&key_name(keys.next_key()), value)?;
                (false, 0)
            }
            Op::Mixed => {
                let key = key_name(keys.next_key());
                if rng.random::<f64>() < phase.workload.update_ratio {
                    client.write(&key, value)?;
                    (false, 0)
                } else {
                    client.read(&key)?;
                    (true, 0)
                }
            }
            Op::Lock => {
                let attempts = client.acquire(LOCK_NAME)?;
                client.release(LOCK_NAME)?;
                (false, attempts)
            }
        };
        let finished = Instant::now();
        tally.completed += 1;
        if started >= measure_from && (finished <= end || recorded.load(Ordering::Relaxed) == 0) {
            recorded.fetch_add(1, Ordering::Relaxed);
            tally.last_finished = Some(tally.last_finished.map_or(finished, |at| at.max(finished)));
            let nanos = u64::try_from(finished.duration_since(started).as_nanos())
                .unwrap_or(u64::MAX)
                .max(1);
            tally.histogram.saturating_record(nanos);
            tally.reads += u64::from(is_read);
            tally.lock_attempts += attempts;
        }
    }
    Ok(tally)
}

/// Give keys `0..keys` their first value, the keys split over `clients` (in parallel).
pub fn preload(
    clients: &mut [Box<dyn CoordClient>],
    keys: u64,
    value: &[u8],
    shutdown: &Shutdown,
) -> Result<(), CliError> {
    let count = clients.len() as u64;
    let results: Vec<Result<(), CliError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = clients
            .iter_mut()
            .enumerate()
            .map(|(index, client)| {
                scope.spawn(move || -> Result<(), CliError> {
                    let mut key = index as u64;
                    while key < keys {
                        if shutdown.is_requested() {
                            return Err("interrupted".into());
                        }
                        client
                            .create(&key_name(key), value)
                            .map_err(|error| format!("preloading key {key}: {error}"))?;
                        key += count;
                    }
                    Ok(())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|handle| {
                handle
                    .join()
                    .unwrap_or_else(|_| Err("a preloading thread panicked".into()))
            })
            .collect()
    });
    results.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use pmnet::loadgen::{KeyDistribution, PopularityKind};

    /// A store in memory behind a fixed delay, with one lock.
    #[derive(Debug, Default)]
    struct Fake {
        values: HashMap<String, Vec<u8>>,
        reads: u64,
        writes: u64,
        fail_after: Option<u64>,
    }

    impl CoordClient for Fake {
        fn read(&mut self, key: &str) -> Result<(), CliError> {
            self.reads += 1;
            if self.fail_after.is_some_and(|after| self.reads > after) {
                return Err("the fake failed".into());
            }
            self.values
                .get(key)
                .map(|_| ())
                .ok_or_else(|| "missing".into())
        }
        fn write(&mut self, key: &str, value: &[u8]) -> Result<(), CliError> {
            self.writes += 1;
            self.values.insert(key.to_owned(), value.to_vec());
            Ok(())
        }
        fn acquire(&mut self, _: &str) -> Result<u64, CliError> {
            Ok(2)
        }
        fn release(&mut self, _: &str) -> Result<(), CliError> {
            Ok(())
        }
    }

    fn phase(op: Op, update_ratio: f64) -> Phase {
        Phase {
            op,
            workload: Workload {
                keys: 50,
                distribution: KeyDistribution::Zipf,
                zipf_exponent: 0.99,
                update_ratio,
                value_len: 8,
                servers: 1,
                popularity: PopularityKind::Static,
                change_every: Duration::from_secs(10),
                change_count: 1,
            },
            seed: 7,
            warmup: Duration::from_millis(10),
            duration: Duration::from_millis(100),
            client_cpu: None,
        }
    }

    fn preloaded(clients: usize) -> Vec<Box<dyn CoordClient>> {
        let mut clients: Vec<Box<dyn CoordClient>> = (0..clients)
            .map(|_| Box::new(Fake::default()) as Box<dyn CoordClient>)
            .collect();
        // Each fake is a store of its own: every one gets every key.
        for client in &mut clients {
            preload(std::slice::from_mut(client), 50, b"value", &Shutdown::new()).unwrap();
        }
        clients
    }

    #[test]
    fn a_phase_counts_what_it_measured_and_its_percentiles_are_ordered() {
        let mut clients = preloaded(3);
        let measured = run_phase(&mut clients, &phase(Op::Mixed, 0.25), &Shutdown::new()).unwrap();
        assert!(measured.count > 0 && measured.completed >= measured.count);
        assert!(measured.reads > 0 && measured.reads < measured.count);
        assert!(measured.p50_us <= measured.p99_us && measured.p99_us <= measured.p999_us);
        assert!(measured.ops_per_s > 0.0);
        assert!(!measured.interrupted);
        let locks = run_phase(&mut clients, &phase(Op::Lock, 0.0), &Shutdown::new()).unwrap();
        assert_eq!(locks.lock_attempts, 2 * locks.count);
    }

    #[test]
    fn a_client_s_error_ends_the_phase_with_it() {
        let mut clients = preloaded(2);
        let mut failing = Fake {
            fail_after: Some(3),
            ..Fake::default()
        };
        failing.values.insert(key_name(0), b"v".to_vec());
        clients.push(Box::new(failing));
        let error = run_phase(&mut clients, &phase(Op::Read, 0.0), &Shutdown::new())
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("failed") || error.contains("missing"),
            "{error}"
        );
    }

    #[test]
    fn values_come_from_the_seed() {
        assert_eq!(value_of(3, 64), value_of(3, 64));
        assert_ne!(value_of(3, 64), value_of(4, 64));
        assert_eq!(value_of(3, 100).len(), 100);
    }
}

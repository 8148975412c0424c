//! The workloads: what each loads into a fresh Redis, what its clients do, and what must hold
//! at the end. Each system gets an instance of its own (the counters its clients keep are what
//! its checks compare Redis's state with); the same seed gives both systems the same data and
//! the same streams of choices.

use std::collections::BTreeMap;

use pmnet_redis::resp::{SyncClient, Value};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use super::conn::ClientOps;
use pmnet::loadgen::client_seed;

/// Commands per pipelined batch when loading and checking.
const BATCH: usize = 1000;

/// What every workload is sized and seeded by.
#[derive(Debug, Clone, Copy)]
pub struct Params {
    pub records: u64,
    pub payload: usize,
    pub clients: u32,
    pub seed: u64,
}

/// What a system's state was found to be after its rounds.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub passed: bool,
    /// What was checked, and each failure.
    pub details: Vec<String>,
}

impl Check {
    pub fn new() -> Check {
        Check {
            passed: true,
            details: Vec::new(),
        }
    }

    /// Note `ok` if `holds`, else fail with `failed`.
    pub fn expect(&mut self, holds: bool, ok: impl Into<String>, failed: impl Into<String>) {
        if holds {
            self.details.push(ok.into());
        } else {
            self.passed = false;
            self.details.push(format!("FAILED: {}", failed.into()));
        }
    }

    pub fn fail(&mut self, failed: impl Into<String>) {
        self.expect(false, "", failed);
    }
}

/// One workload, as one system's clients run it.
pub trait Workload: Sync {
    /// Fill a fresh Redis (a direct connection to it).
    fn load(&self, redis: &mut SyncClient) -> Result<(), String>;
    /// Client `index` of round `round`.
    fn client(&self, index: u32, round: u32) -> Box<dyn ClientOps + '_>;
    /// Whether the state a direct connection reads is what the clients' counters say.
    fn check(&self, redis: &mut SyncClient) -> Check;
    /// Keys read back through the gateway and directly, which must agree.
    fn sample_keys(&self) -> Vec<String>;
    /// The clients' counters (warm-up included, every round).
    fn counters(&self) -> BTreeMap<String, u64>;
}

/// The random stream of client `index` in round `round` of a workload (`tag` tells the
/// workloads apart).
pub fn client_rng(seed: u64, tag: u64, index: u32, round: u32) -> ChaCha8Rng {
    let mixed = seed ^ tag.rotate_left(17) ^ (u64::from(round) << 40);
    ChaCha8Rng::seed_from_u64(client_seed(mixed, index))
}

/// `len` printable bytes.
pub fn filler(len: usize) -> Vec<u8> {
    (0..len).map(|index| b'a' + (index % 26) as u8).collect()
}

/// Send `commands` in pipelined batches; their replies, or the first error reply.
pub fn batched(redis: &mut SyncClient, commands: Vec<Vec<Vec<u8>>>) -> Result<Vec<Value>, String> {
    let mut replies = Vec::with_capacity(commands.len());
    for chunk in commands.chunks(BATCH) {
        let got = redis
            .pipeline(chunk)
            .map_err(|error| format!("talking to Redis: {error}"))?;
        if let Some(Value::Error(text)) = got.iter().find(|reply| reply.is_error()) {
            return Err(format!(
                "Redis answered an error: {}",
                String::from_utf8_lossy(text)
            ));
        }
        replies.extend(got);
    }
    Ok(replies)
}

/// A reply's integer (an integer reply or a string of digits), for the checks.
pub fn int_of(value: &Value) -> Option<i64> {
    super::conn::as_int(value)
}

/// Spread `count` picks over `0..total` (all of them when there are few).
pub fn spread(total: u64, count: u64) -> Vec<u64> {
    if total <= count {
        return (0..total).collect();
    }
    let step = total / count.max(1);
    (0..count).map(|index| index * step).collect()
}

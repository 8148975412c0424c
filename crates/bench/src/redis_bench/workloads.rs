//! The workloads: what each loads into a fresh Redis, what its clients do, and what must hold
//! at the end. Each system gets an instance of its own (the counters its clients keep are what
//! its checks compare Redis's state with); the same seed gives both systems the same data and
//! the same streams of choices.

use std::collections::BTreeMap;

use pmnet_redis::resp::{SyncClient, Value};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use super::client::ClientOps;
use super::{tpcc, twitter, ycsb};
use pmnet::loadgen::client_seed;

/// Commands per pipelined batch when loading and checking.
const BATCH: usize = 1000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum WorkloadKind {
    /// 50 % GET, 50 % SET of Zipf(0.99) keys.
    YcsbA,
    /// 95 % GET, 5 % SET.
    YcsbB,
    /// 50 % GET, 50 % read-modify-write (GET then SET).
    YcsbF,
    /// A retwis-like Twitter clone: timeline, post, follow.
    Twitter,
    /// A TPC-C-like New-Order / Payment / Order-Status mix over Redis hashes.
    Tpcc,
}

impl WorkloadKind {
    pub fn name(self) -> &'static str {
        match self {
            WorkloadKind::YcsbA => "ycsb-a",
            WorkloadKind::YcsbB => "ycsb-b",
            WorkloadKind::YcsbF => "ycsb-f",
            WorkloadKind::Twitter => "twitter",
            WorkloadKind::Tpcc => "tpcc",
        }
    }

    /// The operations and their shares, in words.
    pub fn mix(self) -> &'static str {
        match self {
            WorkloadKind::YcsbA => "50 % read (GET), 50 % update (SET); Zipf 0.99 keys",
            WorkloadKind::YcsbB => "95 % read (GET), 5 % update (SET); Zipf 0.99 keys",
            WorkloadKind::YcsbF => {
                "50 % read (GET), 50 % read-modify-write (GET + SET, one update); Zipf 0.99 keys"
            }
            WorkloadKind::Twitter => {
                "50 % timeline (LRANGE 0 9 + HMGET of each post), 40 % post (INCR id, HMSET \
                 post, SRANDMEMBER 10 followers, MULTI/EXEC of LPUSH+LTRIM onto the author's and \
                 the followers' timelines), 10 % follow (SADD both sets)"
            }
            WorkloadKind::Tpcc => {
                "45 % New-Order (district lock SET NX PX, reads, HMSETs of district, order, \
                 5-15 order lines and customer, stock by EVAL, unlock by EVAL compare-and-\
                 delete), 43 % Payment (customer read, MULTI/EXEC of HINCRBYs, history \
                 HMSET), 12 % Order-Status (reads)"
            }
        }
    }
}

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

pub fn make(kind: WorkloadKind, params: &Params) -> Box<dyn Workload> {
    match kind {
        WorkloadKind::YcsbA => Box::new(ycsb::Ycsb::new(ycsb::Mix::A, params)),
        WorkloadKind::YcsbB => Box::new(ycsb::Ycsb::new(ycsb::Mix::B, params)),
        WorkloadKind::YcsbF => Box::new(ycsb::Ycsb::new(ycsb::Mix::F, params)),
        WorkloadKind::Twitter => Box::new(twitter::Twitter::new(params)),
        WorkloadKind::Tpcc => Box::new(tpcc::Tpcc::new(params)),
    }
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
    super::client::as_int(value)
}

/// Spread `count` picks over `0..total` (all of them when there are few).
pub fn spread(total: u64, count: u64) -> Vec<u64> {
    if total <= count {
        return (0..total).collect();
    }
    let step = total / count.max(1);
    (0..count).map(|index| index * step).collect()
}

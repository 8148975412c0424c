//! YCSB-style workloads over string keys: A (50 % reads, 50 % updates), B (95 % / 5 %) and F
//! (50 % reads, 50 % read-modify-writes), keys drawn from a Zipf(0.99) distribution by
//! `pmnet bench`'s key generator. Every value starts with a stamp naming its key, the client
//! that wrote it and that client's write number, so that a value read back names its key.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use pmnet_redis::resp::{SyncClient, Value};
use rand::Rng;
use rand_chacha::ChaCha8Rng;

use super::conn::{command, ClientOps, Conn, OpError, OpKind};
use super::workloads::{batched, client_rng, filler, spread, Check, Params, Workload};
use pmnet::loadgen::{key_name, KeyDistribution, PopularityKind, RequestGenerator};

/// Bytes of the stamp `KKKKKKKKKKKK/CCCC/NNNNNNNNNNNN;` at the start of every value (shorter
/// values hold its beginning).
const STAMP_LEN: usize = 31;

/// The client number of the values the load writes.
const LOADER: u32 = 9999;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mix {
    A,
    B,
    F,
}

impl Mix {
    fn read_share(self) -> f64 {
        match self {
            Mix::A | Mix::F => 0.5,
            Mix::B => 0.95,
        }
    }

    fn tag(self) -> u64 {
        match self {
            Mix::A => 0xa,
            Mix::B => 0xb,
            Mix::F => 0xf,
        }
    }
}

pub struct Ycsb {
    mix: Mix,
    params: Params,
    keys: pmnet::loadgen::Workload,
    reads: AtomicU64,
    updates: AtomicU64,
    missing: AtomicU64,
}

/// A value of `len` bytes stamped with (key, client, write).
fn value(len: usize, key: u64, client: u32, write: u64) -> Vec<u8> {
    let stamp = format!(
        "{:012}/{:04}/{:012};",
        key % 1_000_000_000_000,
        client % 10_000,
        write % 1_000_000_000_000
    );
    let mut bytes = filler(len);
    let head = len.min(STAMP_LEN);
    bytes[..head].copy_from_slice(&stamp.as_bytes()[..head]);
    bytes
}

/// The key id a value's stamp names, if it has a whole stamp.
fn stamped_key(value: &[u8]) -> Option<u64> {
    let stamp = value.get(..STAMP_LEN)?;
    if stamp[12] != b'/' || stamp[17] != b'/' || stamp[30] != b';' {
        return None;
    }
    std::str::from_utf8(&stamp[..12]).ok()?.parse().ok()
}

impl Ycsb {
    pub fn new(mix: Mix, params: &Params) -> Ycsb {
        Ycsb {
            mix,
            params: *params,
            keys: pmnet::loadgen::Workload {
                keys: params.records,
                distribution: KeyDistribution::Zipf,
                zipf_exponent: 0.99,
                update_ratio: 0.0,
                value_len: 0,
                servers: 1,
                popularity: PopularityKind::Static,
                change_every: std::time::Duration::from_secs(10),
                change_count: 1,
            },
            reads: AtomicU64::new(0),
            updates: AtomicU64::new(0),
            missing: AtomicU64::new(0),
        }
    }
}

struct YcsbClient<'a> {
    workload: &'a Ycsb,
    rng: ChaCha8Rng,
    keys: RequestGenerator,
    index: u32,
    writes: u64,
}

impl YcsbClient<'_> {
    fn get(&mut self, conn: &mut Conn, key: &str) -> Result<Vec<u8>, OpError> {
        match conn.cmd(command!["GET", key])? {
            Value::Bulk(Some(bytes)) => Ok(bytes),
            Value::Bulk(None) => {
                self.workload.missing.fetch_add(1, Ordering::Relaxed);
                Err(OpError::Invariant(format!(
                    "{key} is missing (it was loaded)"
                )))
            }
            other => Err(OpError::Reply(format!("GET {key} answered {other:?}"))),
        }
    }

    fn set(&mut self, conn: &mut Conn, key: &str, id: u64) -> Result<(), OpError> {
        let bytes = value(self.workload.params.payload, id, self.index, self.writes);
        self.writes += 1;
        match conn.cmd(command!["SET", key, bytes])? {
            Value::Simple(ok) if ok == b"OK" => Ok(()),
            other => Err(OpError::Reply(format!("SET {key} answered {other:?}"))),
        }
    }
}

impl ClientOps for YcsbClient<'_> {
    fn op(&mut self, conn: &mut Conn) -> Result<OpKind, OpError> {
        let id = self.keys.next_key();
        let key = key_name(id);
        if self.rng.random::<f64>() < self.workload.mix.read_share() {
            self.get(conn, &key)?;
            self.workload.reads.fetch_add(1, Ordering::Relaxed);
            return Ok(OpKind::Read);
        }
        if self.workload.mix == Mix::F {
            self.get(conn, &key)?;
        }
        self.set(conn, &key, id)?;
        self.workload.updates.fetch_add(1, Ordering::Relaxed);
        Ok(OpKind::Update)
    }
}

impl Workload for Ycsb {
    fn load(&self, redis: &mut SyncClient) -> Result<(), String> {
        let payload = self.params.payload;
        let commands = (0..self.params.records)
            .map(|id| command!["SET", key_name(id), value(payload, id, LOADER, 0)])
            .collect();
        batched(redis, commands).map(|_| ())
    }

    fn client(&self, index: u32, round: u32) -> Box<dyn ClientOps + '_> {
        let seed = self.params.seed ^ self.mix.tag() ^ (u64::from(round) << 48);
        Box::new(YcsbClient {
            workload: self,
            rng: client_rng(self.params.seed, self.mix.tag(), index, round),
            keys: RequestGenerator::new(&self.keys, seed, index),
            index,
            writes: 0,
        })
    }

    fn check(&self, redis: &mut SyncClient) -> Check {
        let mut check = Check::new();
        let ids = spread(self.params.records, 2000);
        let commands = ids
            .iter()
            .map(|&id| command!["GET", key_name(id)])
            .collect();
        let replies = match batched(redis, commands) {
            Ok(replies) => replies,
            Err(error) => {
                check.fail(error);
                return check;
            }
        };
        let mut bad = Vec::new();
        for (id, reply) in ids.iter().zip(&replies) {
            let good = match reply {
                Value::Bulk(Some(bytes)) => {
                    bytes.len() == self.params.payload
                        && (bytes.len() < STAMP_LEN || stamped_key(bytes) == Some(*id))
                }
                _ => false,
            };
            if !good && bad.len() < 5 {
                bad.push(format!("{}: {reply:?}", key_name(*id)));
            }
        }
        check.expect(
            bad.is_empty(),
            format!(
                "{} of {} keys read back: each present, {} bytes, stamped with its own key",
                ids.len(),
                self.params.records,
                self.params.payload
            ),
            format!("keys read back wrong: {}", bad.join("; ")),
        );
        let missing = self.missing.load(Ordering::Relaxed);
        check.expect(
            missing == 0,
            "no loaded key was ever found missing",
            format!("{missing} reads found a loaded key missing"),
        );
        check
    }

    fn sample_keys(&self) -> Vec<String> {
        // The hottest keys (the most written) and keys spread over the rest.
        let hot = (0..self.params.records.min(100)).map(key_name);
        hot.chain(spread(self.params.records, 100).into_iter().map(key_name))
            .collect()
    }

    fn counters(&self) -> BTreeMap<String, u64> {
        BTreeMap::from([
            ("reads".to_owned(), self.reads.load(Ordering::Relaxed)),
            ("updates".to_owned(), self.updates.load(Ordering::Relaxed)),
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_stamped_with_their_key_whatever_their_length() {
        let long = value(100, 42, 3, 7);
        assert_eq!(long.len(), 100);
        assert_eq!(stamped_key(&long), Some(42));
        assert_eq!(value(10, 42, 3, 7).len(), 10);
        assert_eq!(stamped_key(&value(10, 42, 3, 7)), None);
        assert_eq!(stamped_key(b"not a stamp at all, not at all, no"), None);
    }
}

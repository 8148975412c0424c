//! What the benchmark's clients send: keys drawn uniformly or from a Zipf distribution, a mix
//! of updates (SET) and bypass requests (GET), all from a seed so that a run can be replayed.

use std::sync::{Arc, RwLock};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Zipf};
use serde::Serialize;

use pmnet_store::Request;

use super::popularity::{Popularity, PopularityKind};

/// How keys are drawn from the key space.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum KeyDistribution {
    /// Every key equally likely.
    Uniform,
    /// Key of rank k with probability proportional to 1 / k^s (s: --zipf-exponent).
    Zipf,
}

impl KeyDistribution {
    pub fn name(self) -> &'static str {
        match self {
            KeyDistribution::Uniform => "uniform",
            KeyDistribution::Zipf => "zipf",
        }
    }
}

/// The workload every client of a run shares.
#[derive(Debug, Clone)]
pub struct Workload {
    /// Keys `0..keys`.
    pub keys: u64,
    pub distribution: KeyDistribution,
    pub zipf_exponent: f64,
    /// Fraction of requests that are updates (SET); the rest are bypass requests (GET).
    pub update_ratio: f64,
    /// Bytes of every SET's value.
    pub value_len: usize,
    /// Servers the keys are partitioned over (by [`server_of_key`]); 1 without a rack.
    pub servers: u16,
    /// How key popularity changes during a run, every `change_every` by `change_count` keys.
    pub popularity: PopularityKind,
    pub change_every: std::time::Duration,
    pub change_count: u64,
}

/// A rank → key permutation the clients of one run share, and the driver of the run changes.
pub type SharedPopularity = Arc<RwLock<Popularity>>;

/// The server (an index in `0..servers`) that holds key `key`: a CRC32C of its name, so the
/// partition is stable across runs, machines and builds.
pub fn server_of_key(key_name: &[u8], servers: u16) -> u16 {
    if servers <= 1 {
        return 0;
    }
    (crc32c::crc32c(key_name) % u32::from(servers)) as u16
}

/// The key name of key `id` (as [`key_name`]) into `out`, without allocating when `out` has
/// room.
fn write_key_name(out: &mut String, id: u64) {
    use std::fmt::Write as _;
    out.clear();
    let _ = write!(out, "key:{id:012}");
}

impl Workload {
    /// The bytes of a SET request of this workload: what a client puts in a datagram's payload.
    pub fn set_request_len(&self) -> usize {
        let key = key_name(0);
        let value = vec![0u8; self.value_len];
        Request::Set {
            key: key.as_bytes(),
            value: &value,
        }
        .to_bytes()
        .len()
    }
}

/// Where keys come from.
#[derive(Debug, Clone)]
enum KeySampler {
    Uniform(u64),
    /// Samples ranks 1..=n.
    Zipf(Zipf<f64>),
}

/// One client's stream of requests.
#[derive(Debug)]
pub struct RequestGenerator {
    rng: ChaCha8Rng,
    sampler: KeySampler,
    keys: u64,
    update_ratio: f64,
    value: Vec<u8>,
    servers: u16,
    /// The run's rank → key permutation (`None`: rank r is key r).
    popularity: Option<SharedPopularity>,
    name: String,
    /// This client's index, and the updates it has drawn (both stamped into every value).
    client: u32,
    writes: u64,
}

/// One request: whether it is an update, its key, the server its key belongs to (an index
/// in `0..servers`) and its encoded bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GeneratedRequest {
    pub is_update: bool,
    pub key: u64,
    pub server: u16,
    pub bytes: Vec<u8>,
    /// An update's value (empty for a read).
    pub value: Vec<u8>,
}

/// Bytes of the stamp at the start of every value of at least this many bytes:
/// `KKKKKKKKKKKK/CCCC/NNNNNNNNNNNN;` — the key's id, the writing client, and the number of
/// updates that client drew before this one. A value read back names the write that stored it.
pub const STAMP_LEN: usize = 31;

/// A value's stamp: which key, which client, which of its updates (counting from 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    pub key: u64,
    pub client: u32,
    pub write: u64,
}

impl Stamp {
    /// The stamp at the start of `value`, if it has one.
    pub fn parse(value: &[u8]) -> Option<Stamp> {
        let stamp = value.get(..STAMP_LEN)?;
        if stamp[12] != b'/' || stamp[17] != b'/' || stamp[30] != b';' {
            return None;
        }
        let number = |bytes: &[u8]| -> Option<u64> {
            if !bytes.iter().all(u8::is_ascii_digit) {
                return None;
            }
            std::str::from_utf8(bytes).ok()?.parse().ok()
        };
        Some(Stamp {
            key: number(&stamp[..12])?,
            client: u32::try_from(number(&stamp[13..17])?).ok()?,
            write: number(&stamp[18..30])?,
        })
    }

    /// Write this stamp over the start of `value` (a value shorter than the stamp keeps none).
    fn write_into(&self, value: &mut [u8]) {
        use std::io::Write as _;
        if let Some(head) = value.get_mut(..STAMP_LEN) {
            let mut cursor = std::io::Cursor::new(head);
            let _ = write!(
                cursor,
                "{:012}/{:04}/{:012};",
                self.key % 1_000_000_000_000,
                self.client % 10_000,
                self.write % 1_000_000_000_000
            );
        }
    }
}

/// The seed of client `index` of a run with seed `seed` (SplitMix64 of both: clients draw
/// independent streams, and the same seed gives the same streams).
pub fn client_seed(seed: u64, index: u32) -> u64 {
    let mut z = seed ^ (u64::from(index) + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The key of id `id`: fixed width, so every request of a run has the same size.
pub fn key_name(id: u64) -> String {
    format!("key:{id:012}")
}

impl RequestGenerator {
    /// The generator of client `index`. `workload` must have been validated (keys >= 1,
    /// exponent > 0): the command line does that.
    pub fn new(workload: &Workload, seed: u64, index: u32) -> RequestGenerator {
        let keys = workload.keys.max(1);
        let sampler = match workload.distribution {
            KeyDistribution::Uniform => KeySampler::Uniform(keys),
            KeyDistribution::Zipf => match Zipf::new(keys as f64, workload.zipf_exponent) {
                Ok(zipf) => KeySampler::Zipf(zipf),
                // Unreachable with validated arguments; uniform is the safe fallback.
                Err(_) => KeySampler::Uniform(keys),
            },
        };
        RequestGenerator {
            rng: ChaCha8Rng::seed_from_u64(client_seed(seed, index)),
            sampler,
            keys,
            update_ratio: workload.update_ratio.clamp(0.0, 1.0),
            value: value_bytes(workload.value_len),
            servers: workload.servers.max(1),
            popularity: None,
            name: String::with_capacity(32),
            client: index,
            writes: 0,
        }
    }

    /// Draw keys through the run's shared rank → key permutation.
    pub fn with_popularity(mut self, popularity: Option<SharedPopularity>) -> RequestGenerator {
        self.popularity = popularity;
        self
    }

    /// The next rank, in `0..keys` (0 is the hottest: rank 1 of the Zipf distribution).
    fn next_rank(&mut self) -> u64 {
        match &self.sampler {
            KeySampler::Uniform(keys) => self.rng.random_range(0..*keys),
            KeySampler::Zipf(zipf) => {
                let rank = zipf.sample(&mut self.rng) as u64;
                rank.clamp(1, self.keys) - 1
            }
        }
    }

    /// The next key id, in `0..keys`: the key that holds the next rank drawn.
    pub fn next_key(&mut self) -> u64 {
        let rank = self.next_rank();
        match &self.popularity {
            None => rank,
            Some(popularity) => {
                // A writer that panicked left a permutation all the same: keep using it.
                let popularity = popularity.read().unwrap_or_else(|error| error.into_inner());
                popularity.key_of(rank)
            }
        }
    }

    /// Updates drawn so far: every stamp this client wrote names a smaller number.
    pub fn writes_drawn(&self) -> u64 {
        self.writes
    }

    /// The next request.
    pub fn next_request(&mut self) -> GeneratedRequest {
        let is_update = self.update_ratio >= 1.0 || self.rng.random::<f64>() < self.update_ratio;
        let key = self.next_key();
        let mut name = std::mem::take(&mut self.name);
        write_key_name(&mut name, key);
        let (bytes, value) = if is_update {
            Stamp {
                key,
                client: self.client,
                write: self.writes,
            }
            .write_into(&mut self.value);
            self.writes += 1;
            let bytes = Request::Set {
                key: name.as_bytes(),
                value: &self.value,
            }
            .to_bytes();
            (bytes, self.value.clone())
        } else {
            let bytes = Request::Get {
                key: name.as_bytes(),
            }
            .to_bytes();
            (bytes, Vec::new())
        };
        let server = server_of_key(name.as_bytes(), self.servers);
        self.name = name;
        GeneratedRequest {
            is_update,
            key,
            server,
            bytes,
            value,
        }
    }
}

/// A value of `len` printable bytes.
fn value_bytes(len: usize) -> Vec<u8> {
    (0..len).map(|index| b'a' + (index % 26) as u8).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workload(distribution: KeyDistribution, update_ratio: f64) -> Workload {
        Workload {
            keys: 1000,
            distribution,
            zipf_exponent: 0.99,
            update_ratio,
            value_len: 100,
            servers: 1,
            popularity: PopularityKind::Static,
            change_every: std::time::Duration::from_secs(10),
            change_count: 1,
        }
    }

    #[test]
    fn the_same_seed_gives_the_same_keys() {
        for distribution in [KeyDistribution::Uniform, KeyDistribution::Zipf] {
            let workload = workload(distribution, 0.5);
            let mut a = RequestGenerator::new(&workload, 42, 3);
            let mut b = RequestGenerator::new(&workload, 42, 3);
            let first: Vec<_> = (0..500).map(|_| a.next_request()).collect();
            let second: Vec<_> = (0..500).map(|_| b.next_request()).collect();
            assert_eq!(first, second);
            let mut other_client = RequestGenerator::new(&workload, 42, 4);
            let third: Vec<_> = (0..500).map(|_| other_client.next_request()).collect();
            assert_ne!(first, third, "clients draw different streams");
            let mut other_seed = RequestGenerator::new(&workload, 43, 3);
            let fourth: Vec<_> = (0..500).map(|_| other_seed.next_request()).collect();
            assert_ne!(first, fourth, "seeds draw different streams");
        }
    }

    #[test]
    fn keys_stay_in_the_key_space_and_zipf_is_skewed() {
        let mut zipf = RequestGenerator::new(&workload(KeyDistribution::Zipf, 1.0), 7, 0);
        let mut uniform = RequestGenerator::new(&workload(KeyDistribution::Uniform, 1.0), 7, 0);
        let mut zipf_hot = 0;
        let mut uniform_hot = 0;
        for _ in 0..20_000 {
            let z = zipf.next_key();
            let u = uniform.next_key();
            assert!(z < 1000 && u < 1000);
            zipf_hot += usize::from(z < 10);
            uniform_hot += usize::from(u < 10);
        }
        // Under Zipf(0.99) over 1000 keys the 10 hottest take about 39 % of draws; uniform 1 %.
        assert!(zipf_hot > 5_000, "{zipf_hot}");
        assert!(uniform_hot < 600, "{uniform_hot}");
    }

    #[test]
    fn the_update_ratio_decides_the_mix() {
        let mut all = RequestGenerator::new(&workload(KeyDistribution::Uniform, 1.0), 1, 0);
        assert!((0..1000).all(|_| all.next_request().is_update));
        let mut none = RequestGenerator::new(&workload(KeyDistribution::Uniform, 0.0), 1, 0);
        assert!((0..1000).all(|_| !none.next_request().is_update));
        let mut half = RequestGenerator::new(&workload(KeyDistribution::Uniform, 0.5), 1, 0);
        let updates = (0..10_000)
            .filter(|_| half.next_request().is_update)
            .count();
        assert!((4_500..5_500).contains(&updates), "{updates}");
    }

    #[test]
    fn requests_have_a_fixed_size_and_decode() {
        let workload = workload(KeyDistribution::Uniform, 1.0);
        let mut generator = RequestGenerator::new(&workload, 5, 0);
        for _ in 0..100 {
            let request = generator.next_request();
            assert_eq!(request.bytes.len(), workload.set_request_len());
            match Request::decode(&request.bytes).unwrap() {
                Request::Set { key, value } => {
                    assert_eq!(key, key_name(request.key).as_bytes());
                    assert_eq!(value.len(), 100);
                }
                other => panic!("expected a SET, got {other:?}"),
            }
        }
    }

    #[test]
    fn every_value_is_stamped_with_its_key_client_and_write() {
        let workload = workload(KeyDistribution::Zipf, 0.5);
        let mut generator = RequestGenerator::new(&workload, 3, 7);
        let mut writes = 0;
        for _ in 0..200 {
            let request = generator.next_request();
            if !request.is_update {
                assert!(request.value.is_empty());
                continue;
            }
            let stamp = Stamp::parse(&request.value).expect("a stamp");
            assert_eq!(
                stamp,
                Stamp {
                    key: request.key,
                    client: 7,
                    write: writes
                }
            );
            writes += 1;
            assert_eq!(generator.writes_drawn(), writes);
            match Request::decode(&request.bytes).unwrap() {
                Request::Set { value, .. } => assert_eq!(value, request.value),
                other => panic!("expected a SET, got {other:?}"),
            }
        }
        assert!(writes > 50);
        assert_eq!(Stamp::parse(b"key:000000000001"), None);
        assert_eq!(Stamp::parse(&[b'a'; 100]), None);
        assert_eq!(Stamp::parse(b"00000000000x/0001/000000000001;"), None);
    }

    #[test]
    fn zipf_draws_ranks_with_the_expected_frequencies() {
        // 200 000 draws over 100 keys: each of the five hottest ranks within 5 % of
        // 1 / (k^s · H(100, s)), for the three skews the rack uses.
        for exponent in [0.9, 0.95, 0.99] {
            let mut workload = workload(KeyDistribution::Zipf, 1.0);
            workload.keys = 100;
            workload.zipf_exponent = exponent;
            let mut generator = RequestGenerator::new(&workload, 11, 0);
            let draws = 200_000;
            let mut counts = [0u64; 100];
            for _ in 0..draws {
                counts[generator.next_key() as usize] += 1;
            }
            let harmonic: f64 = (1..=100).map(|k| 1.0 / f64::powf(k as f64, exponent)).sum();
            for rank in 1..=5u32 {
                let expected = draws as f64 / f64::powf(rank.into(), exponent) / harmonic;
                let seen = counts[rank as usize - 1] as f64;
                assert!(
                    (seen - expected).abs() < expected * 0.05,
                    "s {exponent} rank {rank}: {seen} drawn, {expected:.0} expected"
                );
            }
        }
    }

    #[test]
    fn keys_go_to_their_server_by_a_stable_hash_and_spread_over_all() {
        let mut workload = workload(KeyDistribution::Uniform, 0.5);
        workload.servers = 32;
        let mut generator = RequestGenerator::new(&workload, 9, 0);
        let mut per_server = [0u32; 32];
        for _ in 0..32_000 {
            let request = generator.next_request();
            assert_eq!(
                request.server,
                server_of_key(key_name(request.key).as_bytes(), 32)
            );
            per_server[usize::from(request.server)] += 1;
        }
        assert!(
            per_server.iter().all(|count| *count > 500),
            "{per_server:?}"
        );
        // CRC32C of the name: fixed forever, whatever the build.
        assert_eq!(server_of_key(b"key:000000000000", 1), 0);
        assert_eq!(
            server_of_key(b"key:000000000000", 32),
            (crc32c::crc32c(b"key:000000000000") % 32) as u16
        );
    }

    #[test]
    fn a_shared_popularity_decides_which_key_a_rank_is() {
        let mut workload = workload(KeyDistribution::Zipf, 1.0);
        workload.keys = 1000;
        let popularity = Arc::new(RwLock::new(
            Popularity::new(PopularityKind::HotIn, 1000, 100).unwrap(),
        ));
        let mut generator =
            RequestGenerator::new(&workload, 5, 0).with_popularity(Some(popularity.clone()));
        let before: Vec<u64> = (0..2000).map(|_| generator.next_key()).collect();
        assert!(before.iter().filter(|key| **key < 10).count() > 500);
        let mut rng = ChaCha8Rng::seed_from_u64(0);
        popularity.write().unwrap().change(&mut rng);
        // The hottest ranks now hold keys 900..1000.
        let after: Vec<u64> = (0..2000).map(|_| generator.next_key()).collect();
        assert!(after.iter().filter(|key| (900..910).contains(*key)).count() > 500);
    }
}

//! Which key holds which popularity rank, and how that changes during a run: the dynamic
//! workloads of NetCache's evaluation (`--popularity hot-in|random|hot-out`).
//!
//! The key space is a rank → key permutation. Rank 0 is the hottest (the Zipf sampler's rank
//! 1). A rotation offset makes hot-in and hot-out O(1) per change with no table; only `random`
//! keeps an explicit table (4 bytes a key, bounded by [`TABLE_KEYS_MAX`]), changed by `count`
//! swaps.

use rand::Rng;
use serde::Serialize;

/// How the popularity of keys changes over a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PopularityKind {
    /// Ranks never change.
    Static,
    /// Every change, the `count` coldest keys become the hottest (the others cool by `count`
    /// ranks).
    HotIn,
    /// Every change, `count` keys drawn among the hottest swap ranks with keys drawn among
    /// the rest.
    Random,
    /// Every change, the `count` hottest keys become the coldest.
    HotOut,
}

impl PopularityKind {
    pub fn name(self) -> &'static str {
        match self {
            PopularityKind::Static => "static",
            PopularityKind::HotIn => "hot-in",
            PopularityKind::Random => "random",
            PopularityKind::HotOut => "hot-out",
        }
    }
}

/// `random` swaps ranks among this many hottest (or half the key space, if smaller) with ranks
/// among the rest.
pub const RANDOM_HOT_RANKS: u64 = 10_000;

/// Keys at most with `--popularity random`: its table holds 4 bytes a key.
pub const TABLE_KEYS_MAX: u64 = 16_000_000;

/// The rank → key permutation of a run.
#[derive(Debug, Clone)]
pub struct Popularity {
    kind: PopularityKind,
    keys: u64,
    /// Keys moved per change.
    count: u64,
    /// Rank `r` is at position `(r + offset) % keys` of the table.
    offset: u64,
    /// The keys by position (`random` only; otherwise position = key).
    table: Option<Vec<u32>>,
    changes: u64,
}

impl Popularity {
    /// The identity permutation over `keys` keys that `kind` changes by `count` keys at a time.
    pub fn new(kind: PopularityKind, keys: u64, count: u64) -> Result<Popularity, String> {
        if keys == 0 {
            return Err("a key space needs at least one key".into());
        }
        if kind != PopularityKind::Static && (count == 0 || count > keys) {
            return Err(format!(
                "--change-count {count} is out of range: give 1 to the number of keys ({keys})"
            ));
        }
        let table = match kind {
            PopularityKind::Random if keys > TABLE_KEYS_MAX => {
                return Err(format!(
                    "--popularity random keeps a table of every key's rank: give at most \
                     {TABLE_KEYS_MAX} --keys with it (not {keys})"
                ))
            }
            PopularityKind::Random => Some((0..keys as u32).collect()),
            _ => None,
        };
        Ok(Popularity {
            kind,
            keys,
            count,
            offset: 0,
            table,
            changes: 0,
        })
    }

    /// Changes applied so far.
    pub fn changes(&self) -> u64 {
        self.changes
    }

    /// The key of rank `rank` (0: the hottest); ranks beyond the key space wrap.
    pub fn key_of(&self, rank: u64) -> u64 {
        let position = (rank % self.keys + self.offset) % self.keys;
        match &self.table {
            Some(table) => u64::from(table[position as usize]),
            None => position,
        }
    }

    /// Apply one change of the run's kind; `rng` draws the keys `random` moves.
    pub fn change(&mut self, rng: &mut impl Rng) {
        let count = self.count % self.keys;
        match self.kind {
            PopularityKind::Static => return,
            PopularityKind::HotIn => self.offset = (self.offset + self.keys - count) % self.keys,
            PopularityKind::HotOut => self.offset = (self.offset + count) % self.keys,
            PopularityKind::Random => self.swap_random(rng),
        }
        self.changes += 1;
    }

    /// `count` swaps, each of a rank among the hottest with a rank among the rest.
    fn swap_random(&mut self, rng: &mut impl Rng) {
        let hot = RANDOM_HOT_RANKS.min(self.keys / 2);
        let (keys, offset) = (self.keys, self.offset);
        let Some(table) = self.table.as_mut() else {
            return;
        };
        if hot == 0 {
            return;
        }
        for _ in 0..self.count {
            let hot_rank = rng.random_range(0..hot);
            let cold_rank = rng.random_range(hot..keys);
            let a = ((hot_rank + offset) % keys) as usize;
            let b = ((cold_rank + offset) % keys) as usize;
            table.swap(a, b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    fn ranks(popularity: &Popularity) -> Vec<u64> {
        (0..popularity.keys)
            .map(|rank| popularity.key_of(rank))
            .collect()
    }

    fn is_permutation(keys: &[u64]) -> bool {
        let mut sorted = keys.to_vec();
        sorted.sort_unstable();
        sorted
            .iter()
            .enumerate()
            .all(|(index, key)| *key == index as u64)
    }

    #[test]
    fn hot_in_makes_the_coldest_the_hottest() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let mut popularity = Popularity::new(PopularityKind::HotIn, 10, 3).unwrap();
        assert_eq!(ranks(&popularity), (0..10).collect::<Vec<_>>());
        popularity.change(&mut rng);
        assert_eq!(ranks(&popularity), [7, 8, 9, 0, 1, 2, 3, 4, 5, 6]);
        popularity.change(&mut rng);
        assert_eq!(ranks(&popularity), [4, 5, 6, 7, 8, 9, 0, 1, 2, 3]);
        assert_eq!(popularity.changes(), 2);
    }

    #[test]
    fn hot_out_makes_the_hottest_the_coldest() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let mut popularity = Popularity::new(PopularityKind::HotOut, 10, 3).unwrap();
        popularity.change(&mut rng);
        assert_eq!(ranks(&popularity), [3, 4, 5, 6, 7, 8, 9, 0, 1, 2]);
        // A change of the whole key space is a full turn: nothing moves.
        let mut all = Popularity::new(PopularityKind::HotOut, 5, 5).unwrap();
        all.change(&mut rng);
        assert_eq!(ranks(&all), [0, 1, 2, 3, 4]);
    }

    #[test]
    fn random_swaps_hot_keys_with_cold_ones_and_stays_a_permutation() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let keys = 100_000;
        let mut popularity = Popularity::new(PopularityKind::Random, keys, 200).unwrap();
        for _ in 0..5 {
            popularity.change(&mut rng);
        }
        let order = ranks(&popularity);
        assert!(is_permutation(&order));
        // Some of the hottest ranks now hold keys from beyond the hot set, and at most 200 a
        // change did move.
        let hot = RANDOM_HOT_RANKS as usize;
        let moved_in = order[..hot]
            .iter()
            .filter(|key| **key >= hot as u64)
            .count();
        assert!(moved_in > 0 && moved_in <= 1_000, "{moved_in}");
        // The same seed gives the same order.
        let mut again = Popularity::new(PopularityKind::Random, keys, 200).unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        for _ in 0..5 {
            again.change(&mut rng);
        }
        assert_eq!(ranks(&again), order);
    }

    #[test]
    fn every_kind_stays_a_permutation_of_a_small_key_space() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        for kind in [
            PopularityKind::Static,
            PopularityKind::HotIn,
            PopularityKind::Random,
            PopularityKind::HotOut,
        ] {
            for keys in [1, 2, 3, 17] {
                let mut popularity = Popularity::new(kind, keys, 1).unwrap();
                for _ in 0..20 {
                    popularity.change(&mut rng);
                    assert!(is_permutation(&ranks(&popularity)), "{kind:?} {keys}");
                }
            }
        }
    }

    #[test]
    fn bad_settings_are_refused() {
        assert!(Popularity::new(PopularityKind::HotIn, 10, 0).is_err());
        assert!(Popularity::new(PopularityKind::HotIn, 10, 11).is_err());
        assert!(Popularity::new(PopularityKind::Random, TABLE_KEYS_MAX + 1, 1).is_err());
        assert!(Popularity::new(PopularityKind::Static, 0, 1).is_err());
        assert!(Popularity::new(PopularityKind::HotOut, TABLE_KEYS_MAX * 4, 200).is_ok());
    }
}

//! Self-checks of the key-value store's bookkeeping ([`KvStore::check_invariants`]), which debug
//! builds run after every applied request. Not in release builds.

use pmnet_pm::PmRegion;

use super::layout::{RECORD_ALIGN, SNAPSHOT_RECORD_SIZE, TERMINATOR_SIZE};
use super::KvStore;

/// Debug builds other than this crate's tests (a server under the process tests, the
/// simulator) check after every applied request while the store holds at most this many keys
/// and sessions together, and one request in `(keys + sessions) / CHECK_WORK_PER_APPLY`
/// beyond: the check is linear in them, and a store near the 1 GiB default's half a million
/// keys would otherwise spend milliseconds on every request.
#[cfg(debug_assertions)]
const CHECK_WORK_PER_APPLY: u64 = 1 << 14;

impl<R: PmRegion> KvStore<R> {
    /// Assert that the bookkeeping agrees with itself; panics naming the first disagreement.
    /// What it checks:
    ///
    /// - the contents' accounting: the bytes the keys' and the sessions' snapshot records
    ///   take (and the sessions' bytes beyond their reserve) are the sums the store keeps, the
    ///   activity index holds every session once at its own activity, none after the clock,
    ///   and no more sessions than `max_sessions`;
    /// - the reserve: the snapshot of the state, with every session slot holding a store
    ///   ERROR, fits in a half (what admits a request);
    /// - the log: the geometry is the superblock's, the tail is aligned, after the snapshot
    ///   header and inside the half, the half's dirty length covers it, and the region holds
    ///   the zero terminator there.
    ///
    /// Linear in the keys and sessions (it reads only the terminator of the region): fine for
    /// the tests' small stores. Debug builds run it after format, open and every applied
    /// request; see `CHECK_WORK_PER_APPLY` for how often on a large store.
    pub fn check_invariants(&self) {
        if let Err(broken) = self.check_bookkeeping() {
            panic!(
                "key-value store: bookkeeping broken at generation {}, activity {}: {broken}",
                self.superblock.generation, self.state.clock
            );
        }
    }

    /// [`KvStore::check_invariants`] after an applied request in a debug build: every request,
    /// or every so many on a large store (see `CHECK_WORK_PER_APPLY`); every request in this
    /// crate's tests.
    #[cfg(debug_assertions)]
    pub(super) fn check_invariants_after_apply(&self) {
        let work = (self.state.keys.len() + self.state.sessions.len()) as u64;
        let every = if cfg!(test) {
            1
        } else {
            work.div_ceil(CHECK_WORK_PER_APPLY).max(1)
        };
        if self.state.clock % every == 0 {
            self.check_invariants();
        }
    }

    /// [`KvStore::check_invariants`], returning what broke.
    pub(super) fn check_bookkeeping(&self) -> Result<(), String> {
        self.state.check()?;
        let half_len = self.half_len_bytes;
        if self.superblock.half_len_bytes != half_len as u64
            || self.superblock.max_sessions != self.state.max_sessions
        {
            return Err(format!(
                "halves of {half_len} bytes and {} sessions; the superblock says {} and {}",
                self.state.max_sessions,
                self.superblock.half_len_bytes,
                self.superblock.max_sessions
            ));
        }
        let committed = self.state.committed_bytes();
        if committed + TERMINATOR_SIZE > half_len {
            return Err(format!(
                "the state with its reserve needs {committed} bytes, a half has {half_len}"
            ));
        }
        let tail = self.tail_bytes;
        if tail % RECORD_ALIGN != 0
            || tail < SNAPSHOT_RECORD_SIZE
            || tail + TERMINATOR_SIZE > half_len
        {
            return Err(format!(
                "the log's tail is at {tail} of a {half_len}-byte half"
            ));
        }
        let half = self.superblock.active_half();
        let dirty = self.dirty_len_bytes;
        if dirty[half] < tail + TERMINATOR_SIZE || dirty.iter().any(|len| *len > half_len) {
            return Err(format!(
                "dirty lengths {dirty:?} with the tail at {tail} in half {half}"
            ));
        }
        let at = self.half_offset(half) + tail;
        if self.region.bytes()[at..at + TERMINATOR_SIZE] != [0; TERMINATOR_SIZE] {
            return Err(format!(
                "no terminator after the log's last record (region offset {at})"
            ));
        }
        Ok(())
    }
}

/// Each kind of damage to the bookkeeping is caught, by name; every other test of the store
/// runs the same check after each request.
#[cfg(test)]
mod tests {
    use pmnet_pm::{PmRegion, SimRegion};

    use super::super::{KvConfig, KvStore};
    use crate::app::Application;
    use crate::codec::Request;

    /// A store that compacted at least once, with keys and sessions.
    fn busy_store() -> KvStore<SimRegion> {
        let mut store =
            KvStore::format(SimRegion::new(256 << 10), KvConfig { max_sessions: 8 }).unwrap();
        let value = vec![b'v'; 2000];
        for seq in 1..=1000u32 {
            let key = format!("key{}", seq % 40).into_bytes();
            let request = if seq % 5 == 0 {
                Request::Del { key: &key }.to_bytes()
            } else {
                Request::Set {
                    key: &key,
                    value: &value[..seq as usize % 2000],
                }
                .to_bytes()
            };
            store.apply(u64::from(seq % 12), seq, &request).unwrap();
        }
        assert!(store.stats().compactions > 0);
        store.check_bookkeeping().unwrap();
        store
    }

    fn broken(store: &KvStore<SimRegion>, expected: &str) {
        match store.check_bookkeeping() {
            Ok(()) => panic!("damage not caught (expected {expected:?})"),
            Err(message) => assert!(
                message.contains(expected),
                "expected {expected:?} in {message:?}"
            ),
        }
    }

    #[test]
    fn counts_that_drift_from_the_contents_are_caught() {
        let mut store = busy_store();
        store.state.key_bytes += 8;
        broken(&store, "the keys' records take");

        let mut store = busy_store();
        store.state.session_excess_bytes += 8;
        broken(&store, "the sessions' records take");
    }

    #[test]
    fn the_activity_index_must_be_the_session_table() {
        let mut store = busy_store();
        let (_, session_id) = store.state.sessions_by_activity.pop_first().unwrap();
        store.state.sessions_by_activity.insert(0, session_id);
        broken(&store, "last active at");

        let mut store = busy_store();
        store.state.sessions_by_activity.pop_last().unwrap();
        broken(&store, "sessions by activity");

        let mut store = busy_store();
        store.state.clock -= 1;
        broken(&store, "after the clock");
    }

    #[test]
    fn a_log_tail_off_its_terminator_is_caught() {
        let mut store = busy_store();
        store.tail_bytes += 4;
        broken(&store, "the log's tail is at");

        let mut store = busy_store();
        let at = store.half_offset(store.superblock.active_half()) + store.tail_bytes;
        store.region.write(at + 3, &[1]);
        broken(&store, "no terminator");

        let mut store = busy_store();
        let half = store.superblock.active_half();
        store.dirty_len_bytes[half] = store.tail_bytes;
        broken(&store, "dirty lengths");
    }

    #[test]
    fn a_state_past_the_reserve_is_caught() {
        let mut store = busy_store();
        let half_len = store.half_len_bytes;
        // Keys the accounting knows of, more than a half holds.
        store.state.keys.insert(b"huge".to_vec(), vec![0; half_len]);
        store.state.key_bytes += super::super::key_record_size(4, half_len);
        broken(&store, "with its reserve needs");
    }

    #[test]
    #[should_panic(expected = "bookkeeping broken at generation")]
    fn check_invariants_panics_on_damage() {
        let mut store = busy_store();
        store.state.key_bytes += 8;
        store.check_invariants();
    }

    #[test]
    fn a_reopened_store_passes() {
        let store = busy_store();
        let reopened = KvStore::open(store.into_region()).unwrap();
        reopened.check_bookkeeping().unwrap();
        assert!(reopened.region().len() > 0);
    }
}

//! Self-checks: the store's DRAM bookkeeping agrees with itself ([`Store::check_invariants`],
//! after every commit in debug builds), and, for tests, with the region. Not in release
//! builds.

use std::collections::HashSet;

use pmnet_pm::PmRegion;

use super::Store;
use crate::layout::*;
use crate::sessions::Source;

/// Debug builds other than this crate's tests (a server under the process tests, say) check
/// a store after every commit while the check's work (slots, keys, sessions, table entries)
/// is at most this, and a larger one after one commit in `work / CHECK_WORK_PER_COMMIT`: the
/// check is linear in the store's size, and a server of the 1 GiB default (half a million
/// slots) committing a batch per event-loop turn would otherwise spend milliseconds of every
/// turn in it. The tests' stores (8 MiB: 4096 slots) are checked at every commit.
#[cfg(debug_assertions)]
const CHECK_WORK_PER_COMMIT: u64 = 1 << 14;

impl<R: PmRegion> Store<R> {
    /// Assert that the DRAM bookkeeping agrees with itself, between batches (after a commit,
    /// or after recovery); panics naming the first disagreement. What it checks:
    ///
    /// - the index: every level-0 node is linked from its predecessor and in the hash table,
    ///   as many as the key count, each record at most once;
    /// - the sessions: their position map; a session whose last request is a record holds a
    ///   live (indexed) record that no other session holds, and its bit is set in
    ///   `session_sources`, which has no other bits; a session the table holds owns an entry;
    /// - the session table: each entry is owned by the session that names it, or free (in
    ///   `free_table` once) and holding no reply record; reply records are not indexed;
    /// - the space (`Space::check`): the limbo holds only the last batch's records, and free
    ///   space, lent slots and the records (indexed, reply, in limbo) cover the data area
    ///   exactly once.
    ///
    /// Linear in the store's size (its slots; the conventional engine's records and free
    /// blocks) plus its keys, sessions and table entries: fine for the tests' small stores.
    /// [`Store::commit`] runs it in debug builds; see `CHECK_WORK_PER_COMMIT` for how often
    /// on a large store.
    pub fn check_invariants(&self) {
        if let Err(broken) = self.check_bookkeeping() {
            panic!(
                "{} store: bookkeeping broken after batch {}: {broken}",
                self.geometry.engine.name(),
                self.committed_epoch
            );
        }
    }

    /// [`Store::check_invariants`] after a commit in a debug build: every commit, or every
    /// so many on a large store (see `CHECK_WORK_PER_COMMIT`); every commit in this crate's
    /// tests.
    #[cfg(debug_assertions)]
    pub(super) fn check_invariants_after_commit(&self) {
        let slots = match self.geometry.engine {
            EngineKind::Packet => u64::from(self.geometry.slot_count),
            // The blocks checked are the records and the free blocks between them.
            EngineKind::Conventional => 0,
        };
        let work = slots + (self.index.len() + self.sessions.len() + self.table.len()) as u64;
        let every = if cfg!(test) {
            1
        } else {
            work.div_ceil(CHECK_WORK_PER_COMMIT).max(1)
        };
        if self.committed_epoch % every == 0 {
            self.check_invariants();
        }
    }

    /// [`Store::check_invariants`], returning what broke.
    pub(crate) fn check_bookkeeping(&self) -> Result<(), String> {
        self.index.check_links()?;
        let indexed: Vec<u32> = self.index.records().collect();
        let indexed_set: HashSet<u32> = indexed.iter().copied().collect();
        if indexed_set.len() != indexed.len() {
            return Err("a record is in the index twice".into());
        }

        self.sessions.check()?;
        let mut sources = HashSet::new();
        for (session_id, state) in self.sessions.iter() {
            match state.source {
                Source::Record(id) => {
                    if !indexed_set.contains(&id) {
                        return Err(format!(
                            "session {session_id}'s last request is record {id}, not indexed"
                        ));
                    }
                    if !self.session_sources.get(id) {
                        return Err(format!(
                            "session {session_id}'s record {id} is not marked a source"
                        ));
                    }
                    if !sources.insert(id) {
                        return Err(format!("record {id} is two sessions' last request"));
                    }
                }
                Source::Table if state.table.is_none() => {
                    return Err(format!(
                        "session {session_id} is kept by the table but owns no entry"
                    ));
                }
                Source::Table => {}
            }
            if let Some(index) = state.table {
                let owner = self.table.get(index as usize).and_then(|slot| slot.owner);
                if owner != Some(session_id) {
                    return Err(format!(
                        "session {session_id} names table entry {index}, owned by {owner:?}"
                    ));
                }
            }
        }
        if self.session_sources.count() != sources.len() {
            return Err(format!(
                "{} records marked sources, {} sessions' last requests",
                self.session_sources.count(),
                sources.len()
            ));
        }

        let mut free_entries = vec![false; self.table.len()];
        for &index in &self.free_table {
            match free_entries.get_mut(index as usize) {
                Some(free) if !*free => *free = true,
                Some(_) => return Err(format!("table entry {index} is free twice")),
                None => return Err(format!("free table entry {index} is past the table")),
            }
        }
        let mut held = indexed;
        for (index, slot) in self.table.iter().enumerate() {
            match slot.owner {
                Some(owner) => {
                    let named = self.sessions.get(owner).and_then(|state| state.table);
                    if named != Some(index as u32) || free_entries[index] {
                        return Err(format!(
                            "table entry {index} is owned by session {owner}, which names \
                             {named:?}{}",
                            if free_entries[index] {
                                ", and free"
                            } else {
                                ""
                            }
                        ));
                    }
                }
                None if !free_entries[index] => {
                    return Err(format!("table entry {index} is neither owned nor free"));
                }
                None if slot.reply_record.is_some() => {
                    return Err(format!("free table entry {index} holds a reply record"));
                }
                None => {}
            }
            if let Some(id) = slot.reply_record {
                if indexed_set.contains(&id) {
                    return Err(format!("reply record {id} is indexed"));
                }
                held.push(id);
            }
        }
        if !self.batch.ops.is_empty() || !self.batch.freed.is_empty() {
            return Err(format!(
                "between batches, the batch holds {} operations and {} freed records",
                self.batch.ops.len(),
                self.batch.freed.len()
            ));
        }
        self.space.check(&held, self.committed_epoch, &self.view())
    }
}

impl<R: PmRegion> Store<R> {
    /// Test invariant: the bookkeeping agrees with itself ([`Store::check_invariants`]), the
    /// persistent level-0 list is the DRAM index, and the chains DRAM knows are the ones the
    /// metadata lines in the region link.
    #[cfg(test)]
    pub(crate) fn check_against_region(&self) -> Result<(), String> {
        self.check_bookkeeping()?;
        let bytes = self.region.bytes();
        let mut pm = Vec::new();
        let mut link = u32_at(bytes, HEAD_OFFSET);
        while let Some(id) = id_of_link(link) {
            pm.push(id);
            if pm.len() > self.geometry.granule_count() as usize {
                return Err("PM list loops".into());
            }
            link = self.meta(id).map_or(0, |meta| meta.next0);
        }
        let dram: Vec<u32> = self.index.records().collect();
        if pm != dram {
            return Err(format!("PM list {pm:?} != index {dram:?}"));
        }
        if self.geometry.engine == EngineKind::Packet {
            let records: Vec<(u32, Vec<u32>)> = dram
                .into_iter()
                .map(|id| {
                    let members = self
                        .check_record(id, false)
                        .map(|c| c.ids)
                        .unwrap_or_default();
                    (id, members)
                })
                .collect();
            self.space.check_slots(&records)?;
        }
        Ok(())
    }
}

/// Each kind of bookkeeping damage is caught, by name; the model, crash and full-store tests
/// run the same check after every commit.
#[cfg(test)]
mod tests {
    use pmnet_pm::SimRegion;
    use pmnet_store::{Application, Request};

    use super::super::space::Purpose;
    use super::super::{Store, StoreConfig};
    use crate::layout::EngineKind;

    /// A committed store with keys (one of them a long value, so a GET's reply needs a record
    /// of its own), sessions in the table and records in limbo.
    fn busy_store(engine: EngineKind) -> Store<SimRegion> {
        let config = StoreConfig {
            engine,
            slot_size: 512,
            max_sessions: 128,
        };
        let mut store = Store::format(SimRegion::new(40 * 1024 + 256 * 512), config).unwrap();
        let long = vec![b'v'; 900];
        let requests = [
            Request::Set {
                key: b"a",
                value: b"1",
            }
            .to_bytes(),
            Request::Set {
                key: b"b",
                value: &long,
            }
            .to_bytes(),
            Request::Set {
                key: b"c",
                value: b"3",
            }
            .to_bytes(),
            Request::Get { key: b"b" }.to_bytes(),
            Request::Del { key: b"c" }.to_bytes(),
            Request::Set {
                key: b"a",
                value: b"4",
            }
            .to_bytes(),
        ];
        for (seq, request) in requests.iter().enumerate() {
            let session = 10 + seq as u64 % 3;
            store.apply(session, seq as u32 + 1, request).unwrap();
        }
        store.commit();
        store.check_bookkeeping().unwrap();
        assert!(store.table.iter().any(|slot| slot.reply_record.is_some()));
        assert!(store.space.limbo_count() > 0);
        store
    }

    fn broken(store: &Store<SimRegion>, expected: &str) {
        match store.check_bookkeeping() {
            Ok(()) => panic!("damage not caught (expected {expected:?})"),
            Err(message) => assert!(
                message.contains(expected),
                "expected {expected:?} in {message:?}"
            ),
        }
    }

    #[test]
    fn a_slot_or_block_taken_and_never_used_is_a_leak() {
        let mut store = busy_store(EngineKind::Packet);
        store.space.take_slot().unwrap();
        broken(&store, "leaked");

        let mut store = busy_store(EngineKind::Conventional);
        store.space.take_block(0, Purpose::Data).unwrap();
        broken(&store, "leaked");
    }

    #[test]
    fn a_live_record_freed_is_held_twice() {
        for engine in [EngineKind::Packet, EngineKind::Conventional] {
            let mut store = busy_store(engine);
            let live = store.get_id(b"a").unwrap();
            let epoch = store.committed_epoch;
            store.space.free_after(epoch, live);
            broken(
                &store,
                if engine == EngineKind::Packet {
                    "is both"
                } else {
                    "overlaps"
                },
            );
        }
    }

    #[test]
    fn a_record_freed_by_an_older_batch_left_in_limbo_is_caught() {
        let mut store = busy_store(EngineKind::Packet);
        let slot = store.space.take_slot().unwrap();
        let id = store.geometry.slot_id(slot);
        let epoch = store.committed_epoch;
        store.space.free_after(epoch - 1, id);
        broken(&store, "still in limbo");
    }

    #[test]
    fn session_sources_must_be_exactly_the_sessions_records() {
        let mut store = busy_store(EngineKind::Packet);
        let live = store.get_id(b"a").unwrap();
        store.session_sources.clear(live);
        broken(&store, "not marked a source");

        let mut store = busy_store(EngineKind::Packet);
        let other = store.get_id(b"b").unwrap();
        store.session_sources.set(other);
        broken(&store, "marked sources");
    }

    #[test]
    fn table_entries_are_owned_by_the_session_naming_them_or_free() {
        let mut store = busy_store(EngineKind::Packet);
        let free = store.free_table.pop().unwrap();
        broken(
            &store,
            &format!("table entry {free} is neither owned nor free"),
        );

        let mut store = busy_store(EngineKind::Packet);
        let (owned, _) = store
            .table
            .iter()
            .enumerate()
            .find(|(_, slot)| slot.owner.is_some())
            .unwrap();
        store.free_table.push(owned as u32);
        broken(&store, "and free");

        let mut store = busy_store(EngineKind::Packet);
        let (session_id, index) = store
            .sessions
            .iter()
            .find_map(|(id, state)| state.table.map(|index| (id, index)))
            .unwrap();
        store.sessions.get_mut(session_id).unwrap().table = Some(index + 1);
        broken(&store, "names table entry");
    }

    #[test]
    #[should_panic(expected = "bookkeeping broken after batch")]
    fn check_invariants_panics_on_damage() {
        let mut store = busy_store(EngineKind::Packet);
        store.space.take_slot().unwrap();
        store.check_invariants();
    }
}

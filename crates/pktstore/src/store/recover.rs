//! Opening a store: rebuild the DRAM index, the session table, the sessions and the free
//! space from the region, redo the last committed batch, and repair what it finds. One
//! function per phase, in the order [`Store::recover`] runs them.

use std::collections::{HashMap, HashSet};

use pmnet_pm::PmRegion;

use super::view::{record_key, View};
use super::{Corruption, Store, StoreError, OP_DEL, OP_SET};
use crate::index::Builder;
use crate::layout::*;
use crate::sessions::{SessionState, Source};

/// What the phases of recovery found, for the later ones.
#[derive(Debug, Default)]
struct Found {
    /// Allocated space: slots (packet) or (id, order) blocks (conventional).
    allocated: Vec<(u32, u8)>,
    /// Per session, the latest (seq, record id) an indexed or redone record carries.
    record_sessions: HashMap<u64, (u32, u32)>,
    /// Per session, (seq, epoch, table index) of the session-table entry that holds it.
    table_sessions: HashMap<u64, (u32, u64, u32)>,
    /// Session-table copies written by a batch that never committed (their offsets).
    uncommitted_copies: Vec<usize>,
    corrupt: Vec<Corruption>,
    /// Why the level-0 list could not be followed to its end, if it could not.
    broken: Option<String>,
    verified_bytes: u64,
}

impl<R: PmRegion> Store<R> {
    /// Rebuild everything DRAM holds from the region, in six phases: the index from the
    /// persistent level-0 list, the redo of the last committed batch, the session table, the
    /// sessions, the free space, and the repairs written back.
    pub(super) fn recover(&mut self) -> Result<(), StoreError> {
        let mut found = Found::default();
        self.walk_level_0(&mut found);
        self.redo_last_batch(&mut found)?;
        self.load_session_table(&mut found);
        let Found {
            allocated,
            record_sessions,
            table_sessions,
            uncommitted_copies,
            mut corrupt,
            broken,
            verified_bytes,
        } = found;
        self.rebuild_sessions(record_sessions, table_sessions);
        // Phase 5: free space.
        self.space.rebuild(allocated, &mut corrupt);
        self.write_repairs(&uncommitted_copies);
        self.recovery.key_count = self.index.len();
        self.recovery.session_count = self.sessions.len();
        self.recovery.corrupt_records = corrupt;
        self.recovery.index_broken = broken;
        self.recovery.verified_bytes = verified_bytes;
        Ok(())
    }

    /// Phase 1: follow the persistent level-0 list from its head, verifying every record, and
    /// build the DRAM index from it. Stops where a link cannot be followed (the keys after it
    /// are lost: `found.broken`); a record that fails its check is stepped over.
    fn walk_level_0(&mut self, found: &mut Found) {
        let granules = self.geometry.granule_count() as usize;
        let mut builder = Builder::default();
        let view = View {
            bytes: self.region.bytes(),
            geometry: self.geometry,
            committed_epoch: self.committed_epoch,
        };
        let bytes = view.bytes;
        let geometry = self.geometry;
        let mut link = u32_at(bytes, HEAD_OFFSET);
        let mut previous_key: Option<&[u8]> = None;
        let mut steps = 0usize;
        while let Some(id) = id_of_link(link) {
            steps += 1;
            if steps > granules {
                found.broken = Some("the level-0 list loops".to_owned());
                builder.mark_tail_dirty(&mut self.index);
                break;
            }
            // A record whose metadata names itself can be stepped over; one whose
            // metadata does not cannot be followed.
            let meta = if view.id_in_range(id) {
                view.meta(id).filter(|meta| meta.self_id == id)
            } else {
                None
            };
            let Some(meta) = meta else {
                found.broken = Some(format!(
                    "link to record {id} leads to damaged metadata; keys after it are lost"
                ));
                builder.mark_tail_dirty(&mut self.index);
                break;
            };
            match view.check_record(id, true) {
                Ok(checked) if checked.op == OP_SET => {
                    if previous_key.is_some_and(|previous| previous >= checked.key) {
                        found.broken = Some(format!(
                            "record {id} is out of key order; keys after it are lost"
                        ));
                        builder.mark_tail_dirty(&mut self.index);
                        break;
                    }
                    previous_key = Some(record_key(bytes, &geometry, id));
                    builder.push(&mut self.index, checked.key, id);
                    found.verified_bytes += checked.bytes;
                    for member in &checked.ids {
                        found.allocated.push((*member, checked.order));
                    }
                    let entry = found
                        .record_sessions
                        .entry(checked.session_id)
                        .or_insert((checked.seq, id));
                    if checked.seq > entry.0 {
                        *entry = (checked.seq, id);
                    }
                }
                Ok(_) => {
                    found.corrupt.push(Corruption {
                        record: id,
                        reason: "not_a_set_record_in_index",
                    });
                    builder.mark_tail_dirty(&mut self.index);
                }
                Err(reason) => {
                    found.corrupt.push(Corruption { record: id, reason });
                    builder.mark_tail_dirty(&mut self.index);
                }
            }
            link = meta.next0;
        }
    }

    /// Phase 2: redo the last committed batch's index operations (idempotent).
    fn redo_last_batch(&mut self, found: &mut Found) -> Result<(), StoreError> {
        let committed = self.committed_epoch;
        let view = View {
            bytes: self.region.bytes(),
            geometry: self.geometry,
            committed_epoch: committed,
        };
        let intent_at = intent_offset(committed);
        let ops = decode_intent(
            &view.bytes[intent_at..intent_at + INTENT_BLOCK_LEN],
            committed,
        )
        .map_err(|error| {
            StoreError::Layout(format!(
                "cannot redo the last committed batch (epoch {committed}): {error}"
            ))
        })?;
        self.recovery.redone_ops = ops.len();
        for op in ops {
            let id = op.record();
            let checked = match view.check_record(id, true) {
                Ok(checked) => checked,
                Err(reason) => {
                    found.corrupt.push(Corruption { record: id, reason });
                    continue;
                }
            };
            for member in &checked.ids {
                found.allocated.push((*member, checked.order));
            }
            if matches!(op, IntentOp::Unlink(_)) {
                // A DEL record is needed only until the next batch commits. A linked record
                // stays live unless a later operation of the batch displaces it (below).
                self.space.free_after(committed, id);
            }
            let geometry = self.geometry;
            let bytes = view.bytes;
            let key = checked.key;
            let displaced = match (op, checked.op) {
                (IntentOp::Link(_), OP_SET) => {
                    let entry = found
                        .record_sessions
                        .entry(checked.session_id)
                        .or_insert((checked.seq, id));
                    if checked.seq >= entry.0 {
                        *entry = (checked.seq, id);
                    }
                    let upsert = self
                        .index
                        .upsert(key, id, |r| record_key(bytes, &geometry, r));
                    // The record's own link was written for the list as it was when the batch
                    // was staged; the recovered list may differ, so it is rewritten.
                    self.index.mark_dirty(upsert.node);
                    upsert.displaced
                }
                (IntentOp::Unlink(_), OP_DEL) => {
                    self.index.remove(key, |r| record_key(bytes, &geometry, r))
                }
                _ => {
                    found.corrupt.push(Corruption {
                        record: id,
                        reason: "intent names a record of the wrong kind",
                    });
                    None
                }
            };
            if let Some(displaced) = displaced.filter(|d| *d != id) {
                self.space.free_after(committed, displaced);
            }
        }
        // Redo replays the batch from a state where some of its links were already durable,
        // so a record can be displaced and linked again: only what is not live is freed.
        let live: HashSet<u32> = self.index.records().collect();
        self.space.keep_live(&live);
        Ok(())
    }

    /// Phase 3: the session table. Each entry's newest committed copy names its session
    /// (the later entry wins if two name the same one); its reply record, if it has one, is
    /// checked and stays allocated; entries nobody owns are free.
    fn load_session_table(&mut self, found: &mut Found) {
        for index in 0..self.geometry.max_sessions {
            let best = self.newest_committed_copy(index, found);
            let slot = &mut self.table[index as usize];
            slot.latest_copy = 1;
            let Some((entry, copy)) = best else {
                continue;
            };
            slot.latest_copy = copy;
            slot.latest_epoch = entry.epoch;
            if let Some((_, epoch, other)) = found.table_sessions.get(&entry.session_id) {
                if *epoch >= entry.epoch {
                    let _ = other;
                    continue;
                }
                let other = *other;
                self.table[other as usize].owner = None;
                self.table[other as usize].reply_record = None;
            }
            let slot = &mut self.table[index as usize];
            slot.owner = Some(entry.session_id);
            if let EntryReply::Record(id) = entry.reply {
                slot.reply_record = Some(id);
            }
            found
                .table_sessions
                .insert(entry.session_id, (entry.last_seq, entry.epoch, index));
        }
        for index in 0..self.geometry.max_sessions {
            let Some(id) = self.table[index as usize].reply_record else {
                continue;
            };
            match self.read_reply_record(id) {
                Ok((_, ids, order)) => {
                    for member in ids {
                        found.allocated.push((member, order));
                    }
                }
                Err(reason) => {
                    found.corrupt.push(Corruption { record: id, reason });
                    self.table[index as usize].reply_record = None;
                }
            }
        }
        for (index, slot) in self.table.iter().enumerate() {
            if slot.owner.is_none() {
                self.free_table.push(index as u32);
            }
        }
        self.free_table.reverse();
    }

    /// The newest copy of session-table entry `index` that a committed batch wrote, with the
    /// copy's number. Copies written by a batch that never committed carry a later epoch:
    /// left alone they would turn valid once the epoch counter reaches theirs, so they go to
    /// `found.uncommitted_copies`, to be unmarked.
    fn newest_committed_copy(
        &mut self,
        index: u32,
        found: &mut Found,
    ) -> Option<(SessionEntry, u8)> {
        let committed = self.committed_epoch;
        let mut best: Option<(SessionEntry, u8)> = None;
        for copy in 0..2u8 {
            let offset = self.geometry.session_entry_offset(index, copy);
            let raw = &self.region.bytes()[offset..offset + SESSION_ENTRY_LEN];
            match SessionEntry::decode(raw) {
                Some(entry) if entry.epoch <= committed => {
                    if best.as_ref().is_none_or(|(b, _)| entry.epoch > b.epoch) {
                        best = Some((entry, copy));
                    }
                }
                Some(_) => found.uncommitted_copies.push(offset),
                None => {
                    if raw[20] != 0 {
                        self.recovery.rejected_session_copies += 1;
                    }
                }
            }
        }
        best
    }

    /// Phase 4: sessions, the later of what the records and the table say.
    fn rebuild_sessions(
        &mut self,
        record_sessions: HashMap<u64, (u32, u32)>,
        table_sessions: HashMap<u64, (u32, u64, u32)>,
    ) {
        for (session_id, (seq, id)) in record_sessions {
            self.sessions.insert(
                session_id,
                SessionState {
                    last_seq: seq,
                    source: Source::Record(id),
                    table: None,
                    last_active: 0,
                    seen_ms: 0,
                },
            );
        }
        for (session_id, (seq, _, index)) in table_sessions {
            let state = self
                .sessions
                .get_or_insert_with(session_id, || SessionState {
                    last_seq: seq,
                    source: Source::Table,
                    table: None,
                    last_active: 0,
                    seen_ms: 0,
                });
            state.table = Some(index);
            if seq >= state.last_seq {
                state.last_seq = seq;
                state.source = Source::Table;
            }
        }
        self.rebuild_table_order();
        // A record-derived session whose record the redo displaced: the batch that displaced
        // it wrote the session entry, so the table holds the seq (or a later one).
        let indexed: HashSet<u32> = self.index.records().collect();
        let limbo_ids = self.space.limbo_ids();
        for state in self.sessions.values_mut() {
            if let Source::Record(id) = state.source {
                if !indexed.contains(&id) && limbo_ids.contains(&id) && state.table.is_some() {
                    state.source = Source::Table;
                }
            }
        }

        for state in self.sessions.values() {
            if let Source::Record(id) = state.source {
                self.session_sources.set(id);
            }
        }
    }

    /// Phase 6: unmark the session-table copies of batches that never committed, and write
    /// the links that redo and repair changed.
    fn write_repairs(&mut self, uncommitted_copies: &[usize]) {
        for offset in uncommitted_copies {
            self.region.write(offset + 20, &[0]);
            self.region.flush(offset + 20, 1);
        }
        // Write what redo and repair changed, and make it durable before anything new.
        let mut links = std::mem::take(&mut self.links);
        self.index.take_dirty(&mut links);
        self.write_links(&links);
        if !links.is_empty() || !uncommitted_copies.is_empty() {
            self.region.fence();
        }
        self.links = links;
    }
}

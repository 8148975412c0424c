//! The session table: each session's last applied sequence number and reply, when no live
//! record holds them, in two copies per entry; entries go to the most recently active
//! sessions.

use pmnet_pm::PmRegion;
use pmnet_wire::PacketType;

use super::space::Purpose;
use super::{error_reply, Store};
use crate::breakdown::Phase;
use crate::layout::*;
use crate::sessions::Source;

/// One entry of the session table, as the store keeps it in DRAM.
#[derive(Debug, Clone, Default)]
pub(super) struct TableSlot {
    pub(super) owner: Option<u64>,
    pub(super) latest_copy: u8,
    pub(super) latest_epoch: u64,
    pub(super) reply_record: Option<u32>,
}

impl<R: PmRegion> Store<R> {
    /// A request whose only durable effect is its session entry (GET, DEL of a missing key,
    /// errors): write the entry in this batch.
    pub(super) fn table_commit(&mut self, session_id: u64, seq: u32, reply: Vec<u8>) -> Vec<u8> {
        let reply = self.write_session_entry(session_id, seq, reply);
        self.mark(Phase::Insert);
        reply
    }

    /// Write `session_id`'s entry (seq, reply) into the batch; returns the reply actually kept.
    /// Only a GET's reply can be too long to keep inline; when no room is left for it (data
    /// may not use the delete reserve), the GET is answered, and its session keeps, an ERROR
    /// saying so (a read changes nothing a device acknowledged), counted in
    /// [`StoreStats::store_full_replies`](crate::StoreStats::store_full_replies).
    pub(super) fn write_session_entry(
        &mut self,
        session_id: u64,
        seq: u32,
        reply: Vec<u8>,
    ) -> Vec<u8> {
        let (entry_reply, reply) = if reply.len() <= INLINE_REPLY_CAPACITY {
            (EntryReply::Inline(reply.clone()), reply)
        } else {
            let written = match self.geometry.engine {
                EngineKind::Packet => self.write_packet_chain(
                    session_id,
                    seq,
                    PacketType::ServerAck,
                    &reply,
                    RecordKind::Reply,
                    ReplyStyle::Ok,
                    Purpose::Data,
                ),
                EngineKind::Conventional => self.write_reply_block(&reply),
            };
            match written {
                Some(pending) => {
                    let offset = self.geometry.record_offset(pending.id);
                    self.region.write(offset, &pending.meta.encode());
                    self.region
                        .flush(offset, META_LEN + pending.unflushed as usize);
                    (EntryReply::Record(pending.id), reply)
                }
                None => {
                    self.stats.store_full_replies += 1;
                    let error = error_reply("store full: reply not kept");
                    (EntryReply::Inline(error.clone()), error)
                }
            }
        };
        // After the reply record: finding room for it may have committed the batch so far.
        let epoch = self.batch_epoch();
        self.batch.wrote = true;
        let index = self.table_index_for(session_id);
        let slot = &mut self.table[index as usize];
        let copy = if slot.latest_epoch == epoch {
            slot.latest_copy
        } else {
            1 - slot.latest_copy
        };
        let superseded = slot.reply_record.take();
        slot.latest_copy = copy;
        slot.latest_epoch = epoch;
        slot.owner = Some(session_id);
        if let EntryReply::Record(id) = entry_reply {
            slot.reply_record = Some(id);
        }
        let entry = SessionEntry {
            session_id,
            epoch,
            last_seq: seq,
            reply: entry_reply,
        };
        let offset = self.geometry.session_entry_offset(index, copy);
        self.region.write(offset, &entry.encode());
        self.region.flush(offset, SESSION_ENTRY_LEN);
        if let Some(old) = superseded {
            self.batch.freed.push(old);
        }
        self.touch_session(session_id, seq, Source::Table);
        if let Some(state) = self.sessions.get_mut(session_id) {
            state.table = Some(index);
            let active = state.last_active;
            self.note_table_activity(active, index);
        }
        reply
    }

    /// Remember that table entry `index`'s owner was active at `active`.
    pub(super) fn note_table_activity(&mut self, active: u64, index: u32) {
        if self.table_order.back() == Some(&(active, index)) {
            return;
        }
        self.table_order.push_back((active, index));
        if self.table_order.len() > 4 * self.table.len() + 1024 {
            self.rebuild_table_order();
        }
    }

    /// The order of the owned table entries, from scratch.
    pub(super) fn rebuild_table_order(&mut self) {
        let mut order: Vec<(u64, u32)> = self
            .table
            .iter()
            .enumerate()
            .filter_map(|(index, slot)| {
                let owner = slot.owner?;
                let active = self.sessions.get(owner).map_or(0, |s| s.last_active);
                Some((active, index as u32))
            })
            .collect();
        order.sort_unstable();
        self.table_order = order.into();
    }

    /// The owned table entry idle longest and not written in batch `epoch`, with its owner:
    /// from the lazy order, or (should that hold nothing usable) a scan of the table.
    fn idlest_table_entry(&mut self, epoch: u64) -> Option<(u32, u64)> {
        for _ in 0..self.table_order.len() {
            let (active, index) = self.table_order.pop_front()?;
            let slot = &self.table[index as usize];
            let Some(owner) = slot.owner else {
                continue;
            };
            if self.sessions.get(owner).map_or(0, |s| s.last_active) != active {
                continue;
            }
            if slot.latest_epoch == epoch {
                self.table_order.push_back((active, index));
                continue;
            }
            return Some((index, owner));
        }
        self.idlest_table_entry_by_scan(epoch)
    }

    /// The owned table entry whose owner was active longest ago, among those not written in
    /// batch `epoch`, with its owner: a scan of the whole table.
    fn idlest_table_entry_by_scan(&self, epoch: u64) -> Option<(u32, u64)> {
        self.table
            .iter()
            .enumerate()
            .filter(|(_, slot)| slot.latest_epoch != epoch)
            .filter_map(|(index, slot)| {
                let owner = slot.owner?;
                let active = self.sessions.get(owner).map_or(0, |s| s.last_active);
                Some((active, index as u32, owner))
            })
            .min()
            .map(|(_, index, owner)| (index, owner))
    }

    /// The owned table entry a new session would take now, with its owner: the one whose
    /// owner was active longest ago, among those not written in this batch; `None` when an
    /// entry is free.
    fn table_victim(&self) -> Option<(u32, u64)> {
        if !self.free_table.is_empty() || self.table.iter().any(|slot| slot.owner.is_none()) {
            return None;
        }
        self.idlest_table_entry_by_scan(self.batch_epoch())
    }

    /// The session whose exactly-once record a new session would evict now, with when it
    /// last applied a request (sessions recovered at open: when the server first told the
    /// time); `None` when the entry it would take holds no such record.
    pub(super) fn table_victim_with_record(&self) -> Option<(u64, u64)> {
        let (_, owner) = self.table_victim()?;
        let state = self.sessions.get(owner)?;
        (state.source == Source::Table).then(|| {
            let since = self.time_since_ms.unwrap_or(0);
            (owner, state.seen_ms.max(since))
        })
    }

    /// Whether a request of `session_id` must wait because admitting it would evict a
    /// session's exactly-once record the server has not permitted this store to forget
    /// ([`Application::permit_eviction`]): `session_id` is new and the session table has no
    /// free entry. Counted in `sessions_full`; the server retries the request later.
    ///
    /// [`Application::permit_eviction`]: pmnet_store::Application::permit_eviction
    pub fn must_keep_every_session_for(&mut self, session_id: u64) -> bool {
        let Some(permitted) = self.permitted else {
            return false;
        };
        if self.sessions.get(session_id).is_some() {
            return false;
        }
        let Some((victim, _)) = self.table_victim_with_record() else {
            return false;
        };
        let kept = permitted != Some(victim);
        if kept {
            self.stats.sessions_full += 1;
        }
        kept
    }

    /// The session-table index of `session_id`, assigning one (evicting the least recently
    /// active session not written in this batch) if it has none.
    fn table_index_for(&mut self, session_id: u64) -> u32 {
        if let Some(index) = self.sessions.get(session_id).and_then(|s| s.table) {
            return index;
        }
        if let Some(index) = self.free_table.pop() {
            return index;
        }
        let epoch = self.batch_epoch();
        // The session the server permitted, which the check before this request found to be
        // the one to go; a permit is good for one eviction.
        let permitted = self
            .permitted
            .and_then(|permitted| permitted)
            .and_then(|owner| Some((self.sessions.get(owner)?.table?, owner)))
            .filter(|&(index, _)| self.table[index as usize].latest_epoch != epoch);
        let governed = self.permitted.is_some();
        if governed {
            self.permitted = Some(None);
        }
        // Governed, the entry taken is the one the check found ([`Self::table_victim`]).
        let (index, owner) = permitted
            .or_else(|| {
                if governed {
                    self.table_victim()
                } else {
                    self.idlest_table_entry(epoch)
                }
            })
            .expect("max_sessions ≥ 2 × MAX_BATCH_OPS leaves a victim");
        if let Some(state) = self.sessions.get(owner) {
            if state.source == Source::Table {
                // Its exactly-once record goes: a retransmission of its last request would be
                // applied again. Counted; the protocol's own session limit is far larger.
                self.sessions.remove(owner);
                self.stats.sessions_evicted += 1;
            } else if let Some(state) = self.sessions.get_mut(owner) {
                state.table = None;
            }
        }
        index
    }

    /// The reply kept for a session whose last request the table holds.
    pub(super) fn table_reply(&self, index: u32) -> Vec<u8> {
        let slot = &self.table[index as usize];
        let offset = self.geometry.session_entry_offset(index, slot.latest_copy);
        let raw = &self.region.bytes()[offset..offset + SESSION_ENTRY_LEN];
        match SessionEntry::decode(raw).map(|entry| entry.reply) {
            Some(EntryReply::Inline(reply)) => reply,
            Some(EntryReply::Record(id)) => self
                .read_reply_record(id)
                .map(|(reply, _, _)| reply)
                .unwrap_or_default(),
            None => Vec::new(),
        }
    }
}

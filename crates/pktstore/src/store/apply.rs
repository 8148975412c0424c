//! Staging requests: decoding them, linking a written record as its key's holder, deleting,
//! and keeping each session's last applied sequence number.

use pmnet_pm::PmRegion;
use pmnet_store::codec::MAX_VALUE_LEN;
use pmnet_store::{NoSpace, Reply, Request};
use pmnet_wire::PacketType;

use super::space::Purpose;
use super::view::{record_key, KeyAt};
use super::{error_reply, Pending, Store};
use crate::breakdown::Phase;
use crate::layout::*;
use crate::sessions::{SessionState, Source};

impl<R: PmRegion> Store<R> {
    /// Stage request `seq` of `session_id` from its bytes; durable at the next
    /// [`Store::commit`], whose caller may send the returned reply only after it returns.
    ///
    /// `Err(NoSpace)`: a SET, INCR or APPEND found no room, even after committing early to
    /// reuse what earlier batches freed. Nothing of it was staged (no record, no index or
    /// intent operation, no session change): the batch is as if it had never been asked, and
    /// the caller applies it again later with the same `seq`. A GET, a DEL or a request that
    /// fails to decode never gets it: a DEL may use the delete reserve
    /// ([`Store::delete_reserve_slots`]), and a GET whose long reply finds no room is answered
    /// `ERROR store full: reply not kept` (counted in
    /// [`StoreStats::store_full_replies`](crate::StoreStats::store_full_replies)).
    pub fn stage_request(
        &mut self,
        session_id: u64,
        seq: u32,
        request: &[u8],
    ) -> Result<Vec<u8>, NoSpace> {
        self.start_timing();
        self.stage_request_inner(session_id, seq, request)
    }

    /// A read on what is committed and staged (a cache read): a GET's reply, or an ERROR
    /// reply for anything else; nothing is recorded.
    pub fn read_request(&mut self, request: &[u8]) -> Vec<u8> {
        match Request::decode(request) {
            Ok(Request::Get { key }) => self.get_reply(key),
            Ok(_) => error_reply("not a read: a cache read must be a GET"),
            Err(error) => error_reply(&format!("bad request: {error}")),
        }
    }

    /// The reply to a GET of `key`.
    fn get_reply(&mut self, key: &[u8]) -> Vec<u8> {
        match self.get(key) {
            Ok(Some(value)) => {
                let mut reply = Vec::with_capacity(5 + value.len());
                reply.push(1);
                reply.extend_from_slice(&(value.len() as u32).to_le_bytes());
                for segment in &value.segments {
                    reply.extend_from_slice(segment);
                }
                reply
            }
            Ok(None) => Reply::NotFound.to_bytes(),
            Err(corruption) => {
                self.stats.read_verify_failures += 1;
                error_reply(&format!("corrupt record: {}", corruption.reason))
            }
        }
    }

    pub(super) fn stage_request_inner(
        &mut self,
        session_id: u64,
        seq: u32,
        request: &[u8],
    ) -> Result<Vec<u8>, NoSpace> {
        let mark = self.begin_op();
        let result = self.stage_decoded(session_id, seq, request);
        if result.is_err() {
            self.cancel_op(mark);
        }
        result
    }

    /// The request's effect; on `Err` nothing was staged (space is the first thing taken).
    fn stage_decoded(
        &mut self,
        session_id: u64,
        seq: u32,
        request: &[u8],
    ) -> Result<Vec<u8>, NoSpace> {
        let decoded = Request::decode(request);
        self.mark(Phase::Prepare);
        Ok(match decoded {
            Err(error) => self.table_commit(
                session_id,
                seq,
                error_reply(&format!("bad request: {error}")),
            ),
            Ok(Request::Set { key, value }) => {
                self.put(session_id, seq, key, value, ReplyStyle::Ok, Some(request))?
            }
            Ok(Request::Get { key }) => {
                let reply = self.get_reply(key);
                self.table_commit(session_id, seq, reply)
            }
            Ok(Request::Del { key }) => self.delete_request(session_id, seq, key, request)?,
            Ok(Request::Incr { key, delta }) => {
                let current = match self.get(key) {
                    Ok(None) => Some(0),
                    Ok(Some(value)) => std::str::from_utf8(&value.to_vec())
                        .ok()
                        .and_then(|text| text.parse::<i64>().ok()),
                    Err(_) => None,
                };
                match current.map(|current| current.checked_add(delta)) {
                    Some(Some(new)) => {
                        let text = new.to_string().into_bytes();
                        self.put(session_id, seq, key, &text, ReplyStyle::Integer, None)?
                    }
                    Some(None) => self.table_commit(
                        session_id,
                        seq,
                        error_reply("increment or decrement would overflow"),
                    ),
                    None => {
                        self.table_commit(session_id, seq, error_reply("value is not an integer"))
                    }
                }
            }
            Ok(Request::Append { key, value }) => {
                let current = match self.get(key) {
                    Ok(Some(current)) => Ok(current.to_vec()),
                    Ok(None) => Ok(Vec::new()),
                    Err(corruption) => Err(corruption),
                };
                match current {
                    Ok(mut current) if current.len() + value.len() <= MAX_VALUE_LEN => {
                        current.extend_from_slice(value);
                        self.put(session_id, seq, key, &current, ReplyStyle::Ok, None)?
                    }
                    Ok(_) => self.table_commit(
                        session_id,
                        seq,
                        error_reply("append would make the value longer than 1048576 bytes"),
                    ),
                    Err(corruption) => self.table_commit(
                        session_id,
                        seq,
                        error_reply(&format!("corrupt record: {}", corruption.reason)),
                    ),
                }
            }
        })
    }

    /// Write a record for `key` = `value` and link it; `Err` (nothing staged) when there is
    /// no room for the record.
    fn put(
        &mut self,
        session_id: u64,
        seq: u32,
        key: &[u8],
        value: &[u8],
        style: ReplyStyle,
        encoded_set: Option<&[u8]>,
    ) -> Result<Vec<u8>, NoSpace> {
        let written = match self.geometry.engine {
            EngineKind::Packet => {
                let owned;
                let payload = match encoded_set {
                    Some(bytes) => bytes,
                    None => {
                        owned = Request::Set { key, value }.to_bytes();
                        &owned
                    }
                };
                self.write_packet_chain(
                    session_id,
                    seq,
                    PacketType::UpdateRequest,
                    payload,
                    RecordKind::Packet,
                    style,
                    Purpose::Data,
                )
            }
            EngineKind::Conventional => self.write_conventional(
                session_id,
                seq,
                CONVENTIONAL_OP_PUT,
                key,
                value,
                style,
                Purpose::Data,
            ),
        };
        // No room: the space is the first thing a write takes, so nothing is staged yet.
        let pending = written.ok_or(NoSpace)?;
        let key = KeyAt::External(key);
        Ok(self.link_record_key(session_id, seq, &key, pending))
    }

    pub(super) fn link_record(
        &mut self,
        session_id: u64,
        seq: u32,
        key: KeyAt<'_>,
        pending: Pending,
    ) -> Vec<u8> {
        self.link_record_key(session_id, seq, &key, pending)
    }

    /// Link a written record into the index as the holder of its key; write its metadata.
    fn link_record_key(
        &mut self,
        session_id: u64,
        seq: u32,
        key: &KeyAt<'_>,
        pending: Pending,
    ) -> Vec<u8> {
        let geometry = self.geometry;
        let bytes = self.region.bytes();
        let key_bytes = key.resolve(bytes, &geometry);
        let upsert = self
            .index
            .upsert(key_bytes, pending.id, |r| record_key(bytes, &geometry, r));
        let mut meta = pending.meta;
        meta.next0 = link_of(upsert.successor);
        self.batch.ops.push(IntentOp::Link(pending.id));
        self.touch_session(session_id, seq, Source::Record(pending.id));
        if let Some(displaced) = upsert.displaced {
            self.retire_indexed(displaced);
        }
        self.mark(Phase::Insert);
        // The head's metadata line and its datagram, flushed last: the commit's fence waits
        // for them, and nothing in between stalls behind the write-backs.
        let offset = self.geometry.record_offset(pending.id);
        self.region.write(offset, &meta.encode());
        self.region
            .flush(offset, META_LEN + pending.unflushed as usize);
        self.mark(Phase::Persist);
        match meta.reply_style {
            ReplyStyle::Ok => Reply::Ok.to_bytes(),
            ReplyStyle::Integer => {
                let value = self
                    .value_of(pending.id)
                    .map(|v| v.to_vec())
                    .unwrap_or_default();
                let number = std::str::from_utf8(&value)
                    .ok()
                    .and_then(|t| t.parse::<i64>().ok())
                    .unwrap_or(0);
                Reply::Integer(number).to_bytes()
            }
        }
    }

    /// A DEL from its bytes. Its record may use the delete reserve, so it finds room however
    /// full the store is (see [`Store::delete_reserve_slots`]); `Err` would mean the reserve
    /// was not kept (nothing is staged then either).
    fn delete_request(
        &mut self,
        session_id: u64,
        seq: u32,
        key: &[u8],
        request: &[u8],
    ) -> Result<Vec<u8>, NoSpace> {
        if self.get_id(key).is_none() {
            return Ok(self.table_commit(session_id, seq, Reply::Deleted(0).to_bytes()));
        }
        // Recovery may have to redo the removal: it needs a record naming the key.
        let written = match self.geometry.engine {
            EngineKind::Packet => self.write_packet_chain(
                session_id,
                seq,
                PacketType::UpdateRequest,
                request,
                RecordKind::Packet,
                ReplyStyle::Ok,
                Purpose::Delete,
            ),
            EngineKind::Conventional => self.write_conventional(
                session_id,
                seq,
                CONVENTIONAL_OP_DELETE,
                key,
                &[],
                ReplyStyle::Ok,
                Purpose::Delete,
            ),
        };
        let Some(pending) = written else {
            debug_assert!(
                false,
                "a DEL found no room: the delete reserve was not kept"
            );
            return Err(NoSpace);
        };
        Ok(self.delete_with_record(session_id, seq, KeyAt::External(key), Some(pending)))
    }

    /// Remove the key the DEL record `pending` names.
    pub(super) fn delete_with_record(
        &mut self,
        session_id: u64,
        seq: u32,
        key: KeyAt<'_>,
        pending: Option<Pending>,
    ) -> Vec<u8> {
        let geometry = self.geometry;
        let bytes = self.region.bytes();
        let key_bytes = key.resolve(bytes, &geometry);
        let present = self
            .index
            .get(key_bytes, |r| record_key(bytes, &geometry, r))
            .is_some();
        let Some(pending) = pending.filter(|_| present) else {
            if let Some(pending) = pending {
                self.free_unlinked(pending);
            }
            return self.table_commit(session_id, seq, Reply::Deleted(0).to_bytes());
        };
        let offset = self.geometry.record_offset(pending.id);
        self.region.write(offset, &pending.meta.encode());
        self.region
            .flush(offset, META_LEN + pending.unflushed as usize);
        let bytes = self.region.bytes();
        let key_bytes = key.resolve(bytes, &geometry);
        let removed = self
            .index
            .remove(key_bytes, |r| record_key(bytes, &geometry, r));
        self.batch.ops.push(IntentOp::Unlink(pending.id));
        let reply = self.table_commit(session_id, seq, Reply::Deleted(1).to_bytes());
        if let Some(removed) = removed {
            self.retire_indexed(removed);
        }
        // The DEL record is needed only until the next batch commits.
        self.batch.freed.push(pending.id);
        self.mark(Phase::Insert);
        reply
    }

    /// A record written for nothing (a DEL of a missing key received in place): free it at
    /// once, nothing references it.
    fn free_unlinked(&mut self, pending: Pending) {
        let offset = self.geometry.record_offset(pending.id);
        self.region.write(offset, &pending.meta.encode());
        self.batch.freed.push(pending.id);
    }

    /// `session_id` applied `seq`, now known from `source`.
    pub(super) fn touch_session(&mut self, session_id: u64, seq: u32, source: Source) {
        let activity = self.activity;
        let state = self
            .sessions
            .get_or_insert_with(session_id, || SessionState {
                last_seq: 0,
                source: Source::Table,
                table: None,
                last_active: activity,
                seen_ms: 0,
            });
        if let Source::Record(old) = state.source {
            self.session_sources.clear(old);
        }
        state.last_seq = seq;
        state.source = source;
        state.last_active = activity;
        state.seen_ms = self.now_ms;
        let table = state.table;
        if let Source::Record(id) = source {
            self.session_sources.set(id);
        }
        if let Some(index) = table {
            self.note_table_activity(activity, index);
        }
    }

    /// The session whose last applied request record `id` is, if any.
    fn source_owner(&self, id: u32) -> Option<u64> {
        if !self.session_sources.get(id) {
            return None;
        }
        let is_source = |session_id: &u64| {
            self.sessions
                .get(*session_id)
                .is_some_and(|state| state.source == Source::Record(id))
        };
        // The record's header names its session; a damaged header falls back to a search.
        let named = self.check_record(id, false).ok().map(|r| r.session_id);
        named.filter(is_source).or_else(|| {
            self.sessions
                .iter()
                .find(|(_, state)| state.source == Source::Record(id))
                .map(|(session_id, _)| session_id)
        })
    }

    /// A record left the index: keep its session's sequence number if it was the only place
    /// holding it, then free the record after the next commit.
    fn retire_indexed(&mut self, id: u32) {
        if let Some(session_id) = self.source_owner(id) {
            self.session_sources.clear(id);
            let last_seq = self.sessions.get(session_id).map(|state| state.last_seq);
            if let Some(seq) = last_seq {
                let reply = self.derived_reply(id);
                self.stats.session_folds += 1;
                self.write_session_entry(session_id, seq, reply);
            }
        }
        self.batch.freed.push(id);
    }

    pub(super) fn derived_reply(&self, id: u32) -> Vec<u8> {
        match self.meta(id).map(|meta| meta.reply_style) {
            Some(ReplyStyle::Integer) => {
                let value = self.value_of(id).map(|v| v.to_vec()).unwrap_or_default();
                let number = std::str::from_utf8(&value)
                    .ok()
                    .and_then(|t| t.parse::<i64>().ok())
                    .unwrap_or(0);
                Reply::Integer(number).to_bytes()
            }
            _ => Reply::Ok.to_bytes(),
        }
    }
}

//! Taking requests in: a request fragment's checks (its session, duplicates, the reorder
//! window) and its reassembly into the session's pending requests.

use std::net::SocketAddr;

use pmnet_wire::{flags, Header};

use super::table::{self, Assembly};
use super::Server;
use crate::{DropReason, RequestKind, Time};

impl Server {
    pub(super) fn on_request(
        &mut self,
        now: Time,
        from: SocketAddr,
        kind: RequestKind,
        header: &Header,
        payload: &[u8],
    ) {
        self.counters.request_fragments_received += 1;
        self.note_received(from);
        let fill = header.has_flag(flags::NOOP_FILL);
        if fill {
            self.counters.noop_fills_received += 1;
        }
        let seq = header.seq;
        if seq == 0 {
            self.count_drop(DropReason::ZeroSeq);
            return;
        }
        let session_id = header.session_id;
        let reorder_window = self.config.reorder_window;
        let known = self.table.sessions.contains_key(&session_id);
        let is_primary = self.is_primary();
        let has_devices = !self.config.devices.is_empty();
        let holds = &self.holds;
        let cleared = |session, active| holds.cleared(session, active);
        if self
            .table
            .get_or_create(now, session_id, &cleared)
            .is_none()
        {
            self.count_drop(DropReason::SessionsFull);
            return;
        }
        if !known {
            self.counters.sessions_evicted = self.table.evicted;
        }
        let session = self
            .table
            .sessions
            .get_mut(&session_id)
            .expect("created above");
        // A primary is nobody's replica (a stamped request reaching it is a replay).
        let replica_stamp = if header.has_flag(pmnet_wire::replication::REPLICA) && !is_primary {
            header.device_id
        } else {
            0
        };
        if replica_stamp != 0 && seq > session.last_applied {
            session.note_replica_stamp(seq, replica_stamp);
        }
        if session.reply_to != Some(from) {
            session.reply_to = Some(from);
            session.credit_bytes = 0;
        }
        let earned = u32::try_from(pmnet_wire::HEADER_LEN + payload.len()).unwrap_or(u32::MAX);
        session.credit_bytes = session
            .credit_bytes
            .saturating_add(earned)
            .min(table::MAX_CREDIT_BYTES);
        if seq <= session.last_applied {
            if !self.replicate_duplicate(now, from, header, payload) {
                self.send_makeup_ack(session_id, seq, from, replica_stamp);
            }
            return;
        }
        if seq <= session.issued_through {
            self.counters.duplicates_in_progress += 1;
            if self.is_primary() {
                self.replicate_in_progress(header);
            }
            return;
        }
        if unordered_keyed_write(has_devices, header, payload) {
            self.count_drop(DropReason::UnorderedKeyedWrite);
            return;
        }
        session.note_seen(seq, now);
        if seq - session.last_applied > reorder_window {
            // Not buffered, but seen: the gap machinery knows something lies beyond.
            self.count_drop(DropReason::BeyondReorderWindow);
            self.advance(now, session_id);
            return;
        }
        if let Some(reason) = self.buffer_fragment(session_id, kind, fill, header, payload) {
            self.count_drop(reason);
            return;
        }
        let session = &self.table.sessions[&session_id];
        if seq != session.issued_through + 1 {
            self.counters.requests_reordered += 1;
        }
        self.advance(now, session_id);
    }

    /// Buffer one fragment of a request not yet issued; the drop reason if it is not kept.
    fn buffer_fragment(
        &mut self,
        session_id: u64,
        kind: RequestKind,
        fill: bool,
        header: &Header,
        payload: &[u8],
    ) -> Option<DropReason> {
        let seq = header.seq;
        let fragment_count = usize::from(header.fragment_count);
        let request_len_max = self.config.request_len_max;
        let max_session_bytes = self.config.session_buffered_bytes_max;
        let max_total_bytes = self.config.buffered_bytes_max;
        let total_bytes = self.table.buffered_bytes;
        let session = self.table.sessions.get_mut(&session_id)?;
        if fill {
            // The client gave up on this number. Whatever part of the request arrived will
            // never be completed; the fill takes its place.
            if let Some(partial) = session.pending.remove(&seq) {
                if partial.is_complete() {
                    session.pending.insert(seq, partial);
                } else {
                    session.buffered_bytes -= partial.cost();
                    self.table.buffered_bytes -= partial.cost();
                }
            }
        }
        let from_primary = header.has_flag(pmnet_wire::replication::FROM_PRIMARY);
        if let Some(partial) = session.pending.get(&seq) {
            // A primary's forward and a copy as the client sent it are cut differently: the
            // newer one replaces the unfinished request. And a primary's forward replaces an
            // earlier one not yet applied: a primary that restarted forwards in a new order,
            // which must not wait on the order of the one before (see `replicate.rs`).
            let replace = if partial.is_complete() {
                from_primary && partial.from_primary
            } else {
                partial.from_primary != from_primary
            };
            if replace {
                let partial = session.pending.remove(&seq).expect("looked up above");
                session.buffered_bytes -= partial.cost();
                self.table.buffered_bytes -= partial.cost();
            }
        }
        let session = self.table.sessions.get_mut(&session_id)?;
        let added = match session.pending.get(&seq) {
            Some(assembly) if assembly.is_complete() => return None,
            Some(assembly) if assembly.kind != kind || assembly.parts.len() != fragment_count => {
                return Some(DropReason::InconsistentFragment);
            }
            Some(assembly) if assembly.parts[usize::from(header.fragment_index)].is_some() => {
                return None;
            }
            Some(assembly) => {
                if assembly.received_len + payload.len() > request_len_max {
                    return Some(DropReason::TooLarge);
                }
                payload.len()
            }
            None => {
                if payload.len() > request_len_max {
                    return Some(DropReason::TooLarge);
                }
                Assembly::table_cost(fragment_count) + payload.len()
            }
        };
        if session.buffered_bytes + added > max_session_bytes
            || total_bytes + added > max_total_bytes
        {
            return Some(DropReason::ReassemblyBudget);
        }
        let assembly = session
            .pending
            .entry(seq)
            .or_insert_with(|| Assembly::new(kind, fill, fragment_count));
        assembly.parts[usize::from(header.fragment_index)] = Some(payload.to_vec());
        assembly.keyed |= header.has_flag(pmnet_wire::cache::KEYED);
        assembly.from_primary = from_primary;
        assembly.received_count += 1;
        assembly.received_len += payload.len();
        if assembly.is_complete() {
            self.requests_completed += 1;
            assembly.completed = self.requests_completed;
        }
        session.buffered_bytes += added;
        self.table.buffered_bytes += added;
        None
    }
}

/// Whether a request is a keyed write no device ordered although this server is behind
/// devices (`has_devices`): its first fragment's order has no stamp. Every device writes one
/// into each keyed write it forwards (`crate::keyed`), so such a write did not pass through
/// the device whose cache holds its key — a client's copy sent or replayed straight here.
/// Applied, it would change the key behind that cache. A primary's forward to its replica
/// (ordered by the primary's device already) and a no-op fill (which writes nothing) are not
/// in question; a duplicate of an applied write was answered before this is asked.
fn unordered_keyed_write(has_devices: bool, header: &Header, payload: &[u8]) -> bool {
    has_devices
        && header.has_flag(pmnet_wire::cache::KEYED)
        && header.fragment_index == 0
        && !header.has_flag(pmnet_wire::replication::FROM_PRIMARY)
        && !header.has_flag(flags::NOOP_FILL)
        && pmnet_wire::cache::WriteDescriptor::parse(payload)
            .is_ok_and(|(descriptor, _)| descriptor.order.stamp == 0)
}

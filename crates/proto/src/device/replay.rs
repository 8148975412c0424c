//! Getting logged entries to their server: resends after a timeout and the replay after a
//! recovery poll, paced by the server's acks; retransmission requests; fill queries.
//!
//! Every resend goes through one queue per server, ordered by (session, seq, fragment), and
//! at most `resends_in_flight_max` resent entries are out at once; each server-ACK that frees
//! one lets the next go. An entry waiting in the queue has no timer (nothing of it is out);
//! its timer starts when it is sent, so a backlog of any size costs timer work only for the
//! window that is out. A server that was down for a while so receives its backlog in order
//! and at the rate it applies it, instead of everything at once into a socket buffer that
//! drops most of it and a reorder window that refuses the rest.

use std::net::SocketAddr;

use pmnet_pm::EntryKey;
use pmnet_wire::{flags, Header, PacketType};

use super::{upstream, Device};
use crate::DropReason;
use crate::Time;

impl Device {
    /// A request (or no-op fill) of the session passed through at `now` (see `seen.rs`).
    pub(super) fn note_seen(&mut self, now: Time, header: &Header) {
        if header.seq == 0 {
            return;
        }
        if header.packet_type == PacketType::BypassRequest && header.has_flag(flags::NOOP_FILL) {
            self.seen
                .note_fill(header.server_id, header.session_id, header.seq, now);
        } else {
            self.seen
                .note(header.server_id, header.session_id, header.seq, now);
        }
    }

    /// Send the server again the no-op fill the session's client sent for `seq`.
    fn resend_fill(&mut self, server: SocketAddr, server_id: u16, session_id: u64, seq: u32) {
        self.counters.fills_resent += 1;
        self.send(
            server,
            pmnet_wire::encode_noop_fill(server_id, session_id, seq),
        );
    }

    pub(super) fn on_retransmit_request(&mut self, header: &Header, datagram: &[u8]) {
        self.counters.retransmit_requests_received += 1;
        let server = self.servers[&header.server_id];
        let slots = self.slots_of(header.server_id, header.session_id, header.seq);
        if slots.is_empty()
            && !self
                .seen
                .fills_in(header.server_id, header.session_id, header.seq, header.seq)
                .is_empty()
        {
            // Its client gave up on it and said so: its fill answers for it (the client may
            // be gone, and the fill it sent may have found the server down).
            self.resend_fill(server, header.server_id, header.session_id, header.seq);
            return;
        }
        let wanted: Vec<u32> = if header.has_flag(flags::ALL_FRAGMENTS) {
            slots
        } else {
            slots
                .into_iter()
                .filter(|slot| self.entries[slot].key.fragment_index == header.fragment_index)
                .collect()
        };
        let complete = match wanted.first() {
            None => false,
            Some(slot) if header.has_flag(flags::ALL_FRAGMENTS) => {
                wanted.len() == usize::from(self.entries[slot].fragment_count)
            }
            Some(_) => true,
        };
        for slot in wanted {
            self.counters.resent_from_log += 1;
            let packet = pmnet_wire::to_sendable(&self.entries[&slot].packet);
            self.send(server, packet);
        }
        if !complete && self.send_paid(header.session_id, pmnet_wire::to_sendable(datagram)) {
            self.counters.retransmit_requests_passed_to_client += 1;
        }
    }

    /// A server (re)started: answer at once with how many entries it will get, then replay
    /// them in order at its pace.
    pub(super) fn on_recovery_poll(&mut self, now: Time, server: SocketAddr, header: &Header) {
        self.counters.recovery_polls += 1;
        let server_id = header.server_id;
        let first = EntryKey {
            server_id,
            session_id: 0,
            seq: 0,
            fragment_index: 0,
        };
        let last = EntryKey {
            server_id,
            session_id: u64::MAX,
            seq: u32::MAX,
            fragment_index: u16::MAX,
        };
        let keys: Vec<(EntryKey, u32)> = self
            .index
            .range(first..=last)
            .map(|(key, slot)| (*key, *slot))
            .collect();
        // Whatever was out went to a server that has since restarted: start over.
        let base_timeout = self.config.resend_timeout;
        for entry in self.entries.values_mut() {
            if entry.key.server_id == server_id {
                entry.in_replay = false;
                entry.resend_timeout = base_timeout;
            }
        }
        let replay = self.replay.entry(server_id).or_default();
        replay.in_flight = 0;
        let mut queued: u32 = 0;
        for &(key, slot) in &keys {
            self.queue_for_replay(key, slot);
            queued = queued.saturating_add(1);
        }
        self.counters.replay_queued += u64::from(queued);
        self.counters.recovery_entries_resent += u64::from(queued);
        let mut done = Header::new(PacketType::RecoveryDone, server_id, 0, header.seq);
        done.device_id = self.config.device_id;
        let payload = pmnet_wire::encode_recovery_done_payload(queued);
        self.send(server, done.encode(&payload));
        self.pump_replay(now, server_id);
    }

    /// Queue entry `slot` (key `key`) to be resent; its timer stops until it is sent.
    fn queue_for_replay(&mut self, key: EntryKey, slot: u32) -> bool {
        let entry = &self.entries[&slot];
        self.resend_timers.remove(&(entry.resend_deadline, slot));
        self.replay
            .entry(key.server_id)
            .or_default()
            .queue
            .insert(key)
    }

    /// Send queued entries of `server_id` while fewer than `resends_in_flight_max` are out.
    pub(super) fn pump_replay(&mut self, now: Time, server_id: u16) {
        let Some(&server) = self.servers.get(&server_id) else {
            return;
        };
        loop {
            let Some(replay) = self.replay.get_mut(&server_id) else {
                return;
            };
            if replay.in_flight >= self.config.resends_in_flight_max {
                return;
            }
            let Some(key) = replay.queue.pop_first() else {
                return;
            };
            let Some(&slot) = self.index.get(&key) else {
                continue;
            };
            replay.in_flight += 1;
            let entry = self.entries.get_mut(&slot).expect("indexed slot");
            debug_assert!(!entry.in_replay, "an entry out twice");
            entry.in_replay = true;
            entry.resent = true;
            let packet = pmnet_wire::to_sendable(&entry.packet);
            self.start_resend_timer(now, slot);
            self.counters.replay_sent += 1;
            self.send(server, packet);
        }
    }

    /// (Re)start entry `slot`'s resend timer at its current timeout.
    fn start_resend_timer(&mut self, now: Time, slot: u32) {
        let entry = self.entries.get_mut(&slot).expect("live slot");
        self.resend_timers.remove(&(entry.resend_deadline, slot));
        entry.resend_deadline = now + entry.resend_timeout;
        self.resend_timers.insert((entry.resend_deadline, slot));
    }

    /// Queue for a resend the entries whose server has not acked them in time (a resend that
    /// got no ack counts as lost), then send what the pace allows.
    pub fn handle_timeout(&mut self, now: Time) {
        self.send_statuses(now);
        if self.trust.poll_timeout().is_some_and(|at| at <= now) {
            self.send_probes(now);
        }
        let mut servers = Vec::new();
        while let Some(&(deadline, slot)) = self.resend_timers.first() {
            if deadline > now {
                break;
            }
            self.resend_timers.remove(&(deadline, slot));
            let max_timeout = self.config.resend_timeout_max;
            let entry = self.entries.get_mut(&slot).expect("timer of a live slot");
            entry.resend_timeout = (entry.resend_timeout * 2).min(max_timeout);
            let key = entry.key;
            let was_out = std::mem::take(&mut entry.in_replay);
            if self.index.get(&key) != Some(&slot) {
                // Acked while its write persists: nothing to resend, the slot frees itself.
                continue;
            }
            if !self.servers.contains_key(&key.server_id) {
                self.count_drop(DropReason::UnknownServer);
                continue;
            }
            if was_out {
                self.replay
                    .get_mut(&key.server_id)
                    .expect("an entry in replay has a replay state")
                    .in_flight -= 1;
            }
            if self.queue_for_replay(key, slot) {
                self.counters.resend_timeouts += 1;
                self.counters.replay_queued += 1;
            }
            if !servers.contains(&key.server_id) {
                servers.push(key.server_id);
            }
        }
        for server_id in servers {
            self.pump_replay(now, server_id);
        }
    }

    /// The server will skip `seq ..= last` of the session unless a device holds one of them
    /// whole. With devices before this one in a chain, the question goes to them first and is
    /// answered once they all answered (`upstream.rs`); otherwise at once.
    pub(super) fn on_fill_query(
        &mut self,
        now: Time,
        server: SocketAddr,
        header: &Header,
        payload: &[u8],
    ) {
        let Ok(last) = pmnet_wire::decode_fill_query_payload(payload) else {
            self.count_drop(DropReason::BadPayload);
            return;
        };
        self.counters.fill_queries += 1;
        let previous = self
            .upstream
            .ask(now, (header.server_id, header.session_id, header.seq, last));
        if previous.is_empty() {
            self.answer_fill_query(now, server, header, last, None);
            return;
        }
        let query = Header::new(
            PacketType::FillQuery,
            header.server_id,
            header.session_id,
            header.seq,
        );
        let bytes = query.encode(&pmnet_wire::encode_fill_query_payload(last));
        for device in previous {
            self.counters.fill_queries_passed_on += 1;
            self.send(device, bytes.clone());
        }
    }

    /// A device before this one answered a fill query passed on to it: once all of them did,
    /// answer the server with what they and this device hold.
    pub(super) fn on_previous_fill_reply(
        &mut self,
        now: Time,
        server: SocketAddr,
        from: SocketAddr,
        header: &Header,
        payload: &[u8],
    ) {
        let Ok((last, held_from, seen_ms)) = pmnet_wire::decode_fill_reply_dated_payload(payload)
        else {
            self.count_drop(DropReason::BadFillReply);
            return;
        };
        let key = (header.server_id, header.session_id, header.seq, last);
        match self.upstream.answered(from, key, held_from, seen_ms) {
            Err(()) => self.count_drop(DropReason::StaleFillReply),
            Ok(None) => {}
            Ok(Some(previous)) => self.answer_fill_query(now, server, header, last, Some(previous)),
        }
    }

    /// Answer the server's fill query about `header.seq ..= last`: name the lowest number
    /// this device (or a device before it, `previous`) holds whole, resending it, or
    /// `last + 1`, and say how long ago this device (or one before it) first saw `last` or a
    /// later number of the session (the server's proof, with every other device's answer,
    /// that the clients gave up on the range). The client's no-op fills for numbers of the
    /// range this device holds nothing of are sent again first.
    fn answer_fill_query(
        &mut self,
        now: Time,
        server: SocketAddr,
        header: &Header,
        last: u32,
        previous: Option<upstream::Answered>,
    ) {
        let (server_id, session_id) = (header.server_id, header.session_id);
        for seq in self.seen.fills_in(server_id, session_id, header.seq, last) {
            if self.slots_of(server_id, session_id, seq).is_empty() {
                self.resend_fill(server, server_id, session_id, seq);
            }
        }
        let own_ms = self
            .seen
            .first_seen_through(server_id, session_id, last)
            .map(|seen| {
                u32::try_from(now.saturating_duration_since(seen).as_millis()).unwrap_or(u32::MAX)
            });
        // The oldest sighting anyone vouches for dates the range best (each is a bound).
        let seen_ms = own_ms
            .into_iter()
            .chain(previous.and_then(|answered| answered.seen_ms))
            .max()
            .map_or(pmnet_wire::FILL_REPLY_UNSEEN, |ms| {
                ms.min(pmnet_wire::FILL_REPLY_UNSEEN - 1)
            });
        let own = self.lowest_held_whole(server_id, session_id, header.seq, last);
        if let Some(seq) = own {
            self.counters.fill_queries_held += 1;
            for slot in self.slots_of(server_id, session_id, seq) {
                self.counters.resent_from_log += 1;
                let packet = pmnet_wire::to_sendable(&self.entries[&slot].packet);
                self.send(server, packet);
            }
        }
        let answer = own
            .into_iter()
            .chain(previous.and_then(|answered| answered.held_from))
            .min()
            .unwrap_or(last.wrapping_add(1));
        let mut reply = Header::new(PacketType::FillReply, server_id, session_id, header.seq);
        reply.device_id = self.config.device_id;
        self.send(
            server,
            reply.encode(&pmnet_wire::encode_fill_reply_dated_payload(
                last, answer, seen_ms,
            )),
        );
    }

    /// The lowest sequence number in `first ..= last` of the session for which this device
    /// holds every fragment. An incomplete set was never acked whole to its client (a
    /// request completes on an ack for each fragment), and the client can no longer send the
    /// rest: it does not count.
    fn lowest_held_whole(
        &self,
        server_id: u16,
        session_id: u64,
        first: u32,
        last: u32,
    ) -> Option<u32> {
        if first > last {
            return None;
        }
        let from = EntryKey {
            server_id,
            session_id,
            seq: first,
            fragment_index: 0,
        };
        let to = EntryKey {
            server_id,
            session_id,
            seq: last,
            fragment_index: u16::MAX,
        };
        let mut current: Option<(u32, usize)> = None;
        for (key, slot) in self.index.range(from..=to) {
            let count = match current {
                Some((seq, count)) if seq == key.seq => count + 1,
                _ => 1,
            };
            current = Some((key.seq, count));
            if count == usize::from(self.entries[slot].fragment_count) {
                return Some(key.seq);
            }
        }
        None
    }
}

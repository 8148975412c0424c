//! Hold queries: whether this device holds an entry of the sessions a server would forget
//! (see `server/hold.rs` for why a server asks first).

use std::net::SocketAddr;

use pmnet_pm::EntryKey;
use pmnet_wire::{Header, PacketType};

use super::Device;
use crate::DropReason;

/// Hold replies that wait for this device's log work to be durable, at most.
pub(super) const HOLD_REPLIES_WAITING_MAX: usize = 64;

impl Device {
    /// Whether this device holds an entry of `session_id` for `server_id`.
    fn holds_entry_of(&self, server_id: u16, session_id: u64) -> bool {
        let first = EntryKey {
            server_id,
            session_id,
            seq: 0,
            fragment_index: 0,
        };
        let last = EntryKey {
            server_id,
            session_id,
            seq: u32::MAX,
            fragment_index: u16::MAX,
        };
        self.index.range(first..=last).next().is_some()
    }

    /// The server asks which of the listed sessions this device holds an entry of: answered
    /// at once, or once the devices before this one in a chain answered too.
    pub(super) fn on_hold_query(&mut self, server: SocketAddr, header: &Header, payload: &[u8]) {
        let Ok(sessions) = pmnet_wire::decode_hold_query_payload(payload) else {
            self.count_drop(DropReason::BadPayload);
            return;
        };
        self.counters.hold_queries += 1;
        let held: Vec<bool> = sessions
            .iter()
            .map(|&session_id| self.holds_entry_of(header.server_id, session_id))
            .collect();
        let Some(previous) = self
            .upstream
            .ask_hold(header.server_id, header.seq, held.clone())
        else {
            self.answer_hold_query(server, header, &held);
            return;
        };
        let query = Header::new(PacketType::HoldQuery, header.server_id, 0, header.seq);
        let bytes = query.encode(payload);
        for device in previous {
            self.send(device, bytes.clone());
        }
    }

    /// A device before this one answered a hold query passed on to it.
    pub(super) fn on_previous_hold_reply(
        &mut self,
        server: SocketAddr,
        from: SocketAddr,
        header: &Header,
        payload: &[u8],
    ) {
        let Ok(held) = pmnet_wire::decode_hold_reply_payload(payload) else {
            self.count_drop(DropReason::BadPayload);
            return;
        };
        match self
            .upstream
            .hold_answered(from, header.server_id, header.seq, &held)
        {
            Err(()) => self.count_drop(DropReason::StaleHoldReply),
            Ok(None) => {}
            Ok(Some(held)) => self.answer_hold_query(server, header, &held),
        }
    }

    /// Answer a hold query, once every entry freed before it is freed durably: a freed
    /// entry's invalidation is persisted in a later batch, and a crash before that brings the
    /// entry back to be resent — after its server, told nothing is held, may have forgotten
    /// the session.
    fn answer_hold_query(&mut self, server: SocketAddr, header: &Header, held: &[bool]) {
        let Some(needed) = self.batches.pushed_through() else {
            self.send_hold_reply(server, header, held);
            return;
        };
        let waiting = (server, *header, held.to_vec());
        if self.hold_replies_waiting.hold(needed, waiting).is_err() {
            // The server asks again in its next round.
            self.count_drop(DropReason::QueueFull);
        }
    }

    /// Every batch through `through` is durable: send the hold replies that waited for them.
    pub(super) fn release_hold_replies(&mut self, through: u64) {
        for (server, header, held) in self.hold_replies_waiting.durable_through(through) {
            self.send_hold_reply(server, &header, &held);
        }
    }

    fn send_hold_reply(&mut self, server: SocketAddr, header: &Header, held: &[bool]) {
        let mut reply = Header::new(PacketType::HoldReply, header.server_id, 0, header.seq);
        reply.device_id = self.config.device_id;
        self.send(
            server,
            reply.encode(&pmnet_wire::encode_hold_reply_payload(held)),
        );
    }
}

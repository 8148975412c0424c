//! The ordering of keyed writes and cache reads: a function of every device's pipeline, just
//! in front of the log (docs/cache.md, "Order of writes to one key").
//!
//! It writes into each keyed write (flag `KEYED`) and each cache read the request it must
//! follow at the server ([`order::KeyedOrder`]) and passes the rewritten datagram on
//! ([`crate::Verdict::Rewritten`]); the log logs and forwards what it is given. It learns
//! from the server's acks (which it passes on to the log) which writes no longer order
//! anything. A keyed write it cannot place (no room) it drops, and counts: its client sends it
//! again. Whatever is not a keyed write, a cache read or a server's ack it passes on as it
//! came, and so does it with what the log would drop (an unknown server, a replica's
//! datagram, a malformed read): the log counts those.
//!
//! After a restart it is rebuilt from the log's recovered entries (their orders are in them),
//! so that later writes to a key still follow the logged ones.

mod order;

use std::collections::HashMap;
use std::net::SocketAddr;

use pmnet_wire::cache::{ReadDescriptor, CACHE_READ, KEYED};
use pmnet_wire::{Header, PacketType};

use crate::{
    CountDrop, DropCounts, NetworkFunction, PersistBatch, RegionWrite, Time, Transmit, Verdict,
};

/// What the ordering did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KeyedCounters {
    /// Keyed writes (and keyed bypasses) given their order.
    pub writes_ordered: u64,
    /// Cache reads given a keyed write to follow.
    pub reads_ordered: u64,
}

/// The ordering function (see the module's documentation).
#[derive(Debug)]
pub struct KeyedOrdering {
    servers: HashMap<u16, SocketAddr>,
    order: order::KeyedOrder,
    counters: KeyedCounters,
    dropped: DropCounts,
}

impl KeyedOrdering {
    /// The ordering of a device in front of `servers`, rebuilt from the update requests its
    /// log holds (`logged`, each as logged: with its order written in).
    pub fn new<'a>(
        servers: &[(u16, SocketAddr)],
        logged: impl IntoIterator<Item = &'a [u8]>,
    ) -> KeyedOrdering {
        let mut order = order::KeyedOrder::default();
        for packet in logged {
            if let Ok((header, _)) = Header::parse(packet) {
                if header.packet_type == PacketType::UpdateRequest {
                    order.recovered(&header, packet);
                }
            }
        }
        KeyedOrdering {
            servers: servers.iter().copied().collect(),
            order,
            counters: KeyedCounters::default(),
            dropped: DropCounts::new(),
        }
    }

    pub fn counters(&self) -> KeyedCounters {
        self.counters
    }

    /// Keys with a keyed write not yet acknowledged by its server (barriers count as one).
    pub fn keys_ordered(&self) -> usize {
        self.order.len()
    }

    fn on_write(&mut self, header: &Header, datagram: &[u8]) -> Verdict {
        match self.order.stamp(header, datagram) {
            Ok(Some(stamped)) => {
                // The log forwards every write it is given (logged or not, or again when it
                // holds it already): later writes and reads of the key follow it from now.
                self.counters.writes_ordered += 1;
                self.order.logged(&stamped, header.session_id, header.seq);
                Verdict::Rewritten(stamped.datagram)
            }
            Ok(None) => Verdict::Pass,
            Err(refused) => {
                // Neither logged nor forwarded: a barrier that cannot be ordered after every
                // session it must follow, or no room to place another keyed write. Its client
                // sends it again, when fewer writes are in flight.
                self.dropped.record(refused.reason());
                Verdict::Consumed
            }
        }
    }

    fn on_read(&mut self, header: &Header, datagram: &[u8]) -> Verdict {
        let payload = &datagram[pmnet_wire::HEADER_LEN..];
        if header.fragment_count != 1 || ReadDescriptor::parse(payload).is_err() {
            return Verdict::Pass; // the log drops it
        }
        match self.order.order_read(header, datagram) {
            Some(ordered) => {
                self.counters.reads_ordered += 1;
                Verdict::Rewritten(ordered)
            }
            None => Verdict::Pass,
        }
    }
}

impl NetworkFunction for KeyedOrdering {
    type Work = RegionWrite;

    fn handle(
        &mut self,
        _now: Time,
        from: SocketAddr,
        header: &Header,
        datagram: &[u8],
    ) -> Verdict {
        // The type first: a datagram that is none of these (an unkeyed update above all)
        // costs no look-up.
        let from_client = || !header.has_flag(pmnet_wire::replication::REPLICA);
        let known = || self.servers.contains_key(&header.server_id);
        match header.packet_type {
            // The log forwards a cache read to any server it knows, as it came or ordered.
            PacketType::Reserved(CACHE_READ) if known() => self.on_read(header, datagram),
            PacketType::UpdateRequest | PacketType::BypassRequest
                if header.has_flag(KEYED)
                    && (header.packet_type == PacketType::BypassRequest || header.seq != 0)
                    && from_client()
                    && known() =>
            {
                self.on_write(header, datagram)
            }
            // The server applied the write: it orders nothing any more.
            PacketType::ServerAck
                if from_client() && self.servers.get(&header.server_id) == Some(&from) =>
            {
                self.order.acked(header.session_id, header.seq);
                Verdict::Pass
            }
            _ => Verdict::Pass,
        }
    }

    fn handle_timeout(&mut self, _: Time) {}

    fn on_persisted(&mut self, _: Time, _: u64) {}

    fn poll_transmit(&mut self) -> Option<Transmit> {
        None
    }

    fn poll_persist(&mut self) -> Option<PersistBatch<RegionWrite>> {
        None
    }

    fn poll_timeout(&self) -> Option<Time> {
        None
    }

    fn counter_samples(&self) -> Vec<(&'static str, &'static str, u64)> {
        vec![
            (
                "pmnet_device_keyed_writes_ordered_total",
                "Keyed writes given the write they follow at their server.",
                self.counters.writes_ordered,
            ),
            (
                "pmnet_device_cache_reads_ordered_total",
                "Cache reads given a keyed write to follow.",
                self.counters.reads_ordered,
            ),
            (
                "pmnet_device_keyed_keys",
                "Keys with a keyed write not yet acknowledged by its server.",
                self.order.len() as u64,
            ),
        ]
    }

    fn dropped(&self) -> DropCounts {
        self.dropped.clone()
    }
}

//! The world's use of its [`Network`](crate::network::Network): what its nodes send goes on
//! it (a device's PMNet-ACK noted as checked durable), tests' drop rules and raw injections.

use std::net::SocketAddr;

use pmnet_proto::Transmit;
use pmnet_wire::{Header, PacketType};

use super::{node_name, Seen, World};

impl World {
    /// Drop every datagram for which `rule` returns true (rules stay until cleared).
    pub fn drop_when(&mut self, rule: impl FnMut(&Seen) -> bool + 'static) {
        self.network.drop_when(rule);
    }

    /// Drop the first datagram for which `matches` returns true, and only that one.
    pub fn drop_first(&mut self, mut matches: impl FnMut(&Seen) -> bool + 'static) {
        let mut dropped = false;
        self.drop_when(move |seen| {
            let lose = !dropped && matches(seen);
            dropped |= lose;
            lose
        });
    }

    pub fn clear_drop_rules(&mut self) {
        self.network.clear_drop_rules();
    }

    pub(super) fn enqueue(&mut self, from: SocketAddr, transmit: Transmit) {
        let note = match Header::parse(pmnet_auth::without_trailer(&transmit.bytes)) {
            Ok((header, _)) if from_device_ack(from, &header) => " [checked durable]",
            _ => "",
        };
        let now = self.now;
        self.network
            .send_noted(now, from, transmit.destination, transmit.bytes, note);
    }

    /// Inject raw bytes (for malformed-input tests).
    pub fn inject(&mut self, from: SocketAddr, to: SocketAddr, bytes: Vec<u8>) {
        let now = self.now;
        self.network.inject(now, from, to, bytes);
    }
}

/// Whether a datagram is a PMNet-ACK from a device (checked durable before it is sent).
fn from_device_ack(from: SocketAddr, header: &Header) -> bool {
    header.packet_type == PacketType::PmnetAck && node_name(from).starts_with("device")
}

//! The simulated network: datagrams put on it with their faults (test rules, partitions,
//! loss, duplication, delay, corruption) and raw bytes injected.

use std::cmp::Reverse;
use std::net::SocketAddr;
use std::time::Duration;

use pmnet_proto::{Time, Transmit};
use pmnet_wire::{Header, PacketType};
use rand::Rng;

use super::trace::describe_header;
use super::{node_name, Faults, NetworkCounters, Seen, World};

pub(super) type DropRule = Box<dyn FnMut(&Seen) -> bool>;

/// A datagram in flight: delivery time, tie-breaking sequence, source, destination, bytes.
pub(super) type InFlight = Reverse<(Time, u64, SocketAddr, SocketAddr, Vec<u8>)>;

impl World {
    /// Drop every datagram for which `rule` returns true (rules stay until cleared).
    pub fn drop_when(&mut self, rule: impl FnMut(&Seen) -> bool + 'static) {
        self.drop_rules.push(Box::new(rule));
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
        self.drop_rules.clear();
    }

    pub(super) fn enqueue(&mut self, from: SocketAddr, transmit: Transmit) {
        let header = match Header::parse(pmnet_auth::without_trailer(&transmit.bytes)) {
            Ok((header, _)) => header,
            Err(error) => panic!("invariant: {from} sent an invalid datagram: {error}"),
        };
        self.network.sent += 1;
        let mut seen = Seen {
            at: self.now,
            from,
            to: transmit.destination,
            header,
            dropped: false,
        };
        // What happened to the datagram, for the trace.
        let mut fate = String::new();
        seen.dropped = self.drop_rules.iter_mut().any(|rule| rule(&seen));
        if seen.dropped {
            fate.push_str(" [dropped by a test rule]");
        }
        if self.blocked.contains(&(from, transmit.destination)) {
            seen.dropped = true;
            self.network.partitioned += 1;
            fate.push_str(" [cut by a partition]");
        }
        let mut bytes = transmit.bytes;
        if self.capture_len_max > 0 {
            if self.captured.len() == self.capture_len_max {
                self.captured.pop_front();
            }
            self.captured
                .push_back((from, transmit.destination, bytes.clone()));
        }
        let mut copies = 1;
        let mut delays = [self.latency; 2];
        if let Some(faults) = self.faults.as_mut() {
            copies = faults.strike(
                &mut self.network,
                &mut seen.dropped,
                &mut bytes,
                &mut delays,
                &mut fate,
            );
        }
        let dropped = seen.dropped;
        let header = seen.header;
        let to = seen.to;
        if from_device_ack(from, &header) {
            fate.push_str(" [checked durable]");
        }
        self.note_datagram(&node_name(from), || {
            format!(
                "send {} -> {}{fate}",
                describe_header(&header),
                node_name(to)
            )
        });
        if self.record_seen {
            self.seen.push(seen);
        }
        if dropped {
            return;
        }
        for delay in &delays[..copies] {
            self.sequence += 1;
            let at = self.now + *delay;
            self.queue.push(Reverse((
                at,
                self.sequence,
                from,
                transmit.destination,
                bytes.clone(),
            )));
        }
    }

    /// Inject raw bytes (for malformed-input tests).
    pub fn inject(&mut self, from: SocketAddr, to: SocketAddr, bytes: Vec<u8>) {
        self.sequence += 1;
        self.queue.push(Reverse((
            self.now + self.latency,
            self.sequence,
            from,
            to,
            bytes,
        )));
    }
}

/// Whether a datagram is a PMNet-ACK from a device (checked durable before it is sent).
fn from_device_ack(from: SocketAddr, header: &Header) -> bool {
    header.packet_type == PacketType::PmnetAck && node_name(from).starts_with("device")
}

impl Faults {
    /// What the random faults do to one datagram, in a fixed order of draws (loss unless
    /// already dropped, duplication, the delay of each copy, corruption): counted in
    /// `network`, noted in `fate`; returns the copies to deliver.
    fn strike(
        &mut self,
        network: &mut NetworkCounters,
        dropped: &mut bool,
        bytes: &mut [u8],
        delays: &mut [Duration; 2],
        fate: &mut String,
    ) -> usize {
        let mut copies = 1;
        if !*dropped && self.rng.random_bool(self.loss) {
            *dropped = true;
            network.lost += 1;
            fate.push_str(" [lost]");
        }
        if self.rng.random_bool(self.duplicate) {
            copies = 2;
            network.duplicated += 1;
            if !*dropped {
                fate.push_str(" [duplicated]");
            }
        }
        let jitter_ns = u64::try_from(self.jitter.as_nanos()).unwrap_or(u64::MAX);
        for delay in delays.iter_mut() {
            *delay += Duration::from_nanos(self.rng.random_range(0..=jitter_ns));
        }
        if self.rng.random_bool(self.corrupt) {
            let bit = self.rng.random_range(0..bytes.len() * 8);
            bytes[bit / 8] ^= 1 << (bit % 8);
            network.corrupted += 1;
            if !*dropped {
                fate.push_str(&format!(
                    " [corrupted: bit {} of byte {}]",
                    bit % 8,
                    bit / 8
                ));
            }
        }
        copies
    }
}

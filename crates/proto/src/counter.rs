//! The smallest in-network function: it owns one reserved packet type, counts the datagrams of
//! that type and answers each with the count so far. Tests put it in front of the log to prove
//! that a pipeline composes functions (in the runtime and in the simulator alike); it also
//! shows the shape a new function takes.

use std::collections::VecDeque;

use std::net::SocketAddr;

use pmnet_wire::{Header, PacketType};

use crate::{NetworkFunction, PersistBatch, Time, Transmit, Verdict};

/// Type code the counter owns, at the top of the reserved range (no function uses it).
pub const COUNTER_TYPE_CODE: u8 = 0x3F;

/// Answers queued at most: an answer is never larger than the datagram that asked for it,
/// and beyond this many unsent ones the asker gets none.
const MAX_QUEUED_ANSWERS: usize = 1024;

/// Counts datagrams of type [`COUNTER_TYPE_CODE`] and answers each to its sender with the
/// count (u64, big-endian), under the asker's header, if it sent at least as many bytes.
/// Passes every other datagram on.
#[derive(Debug, Default)]
pub struct Counter {
    count: u64,
    answers: VecDeque<Transmit>,
}

impl Counter {
    /// Datagrams counted so far.
    pub fn count(&self) -> u64 {
        self.count
    }
}

impl NetworkFunction for Counter {
    type Work = crate::RegionWrite;

    fn handle(&mut self, _: Time, from: SocketAddr, header: &Header, datagram: &[u8]) -> Verdict {
        if header.packet_type != PacketType::Reserved(COUNTER_TYPE_CODE) {
            return Verdict::Pass;
        }
        self.count += 1;
        // Never more bytes back than came in: an asker with less than 8 bytes of payload is
        // counted and not answered.
        let answer_len = pmnet_wire::HEADER_LEN + 8;
        if datagram.len() >= answer_len && self.answers.len() < MAX_QUEUED_ANSWERS {
            self.answers.push_back(Transmit {
                destination: from,
                bytes: header.encode(&self.count.to_be_bytes()),
            });
        }
        Verdict::Consumed
    }

    fn handle_timeout(&mut self, _: Time) {}

    fn on_persisted(&mut self, _: Time, _: u64) {}

    fn poll_transmit(&mut self) -> Option<Transmit> {
        self.answers.pop_front()
    }

    fn poll_persist(&mut self) -> Option<PersistBatch<crate::RegionWrite>> {
        None
    }

    fn poll_timeout(&self) -> Option<Time> {
        None
    }
}

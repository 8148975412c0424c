//! Batches on the wire ([`PacketType::Batch`], `pmnet_wire::batch`): the datagrams an endpoint
//! sends one peer in one turn go out packed, up to a datagram's size; a receiver unpacks a
//! batch and handles each entry as if it had arrived on its own.
//!
//! Nothing is held back for a batch: [`Batcher::fill`] packs what is queued when the endpoint
//! is polled for transmits, which is after it handled a whole receive batch (and, on a device,
//! after the log write that releases the acks). Under load a turn holds many datagrams for the
//! same peer and they share one datagram; at one request at a time nothing changes. Only
//! datagrams to peers known to unpack batches are packed: a device's servers (configured) and,
//! on a server, the peers that sent it a batch.

use std::collections::VecDeque;
use std::net::SocketAddr;

use pmnet_wire::{batch_entry_len, encode_batch, field, PacketType, HEADER_LEN};

use crate::Transmit;

/// Peers a server learns to send batches to, at most (a bound on what senders make it keep).
pub const BATCH_PEERS_MAX: usize = 64;

/// What a [`Batcher`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchCounters {
    /// Batches sent (each holds two datagrams or more).
    pub batches_sent: u64,
    /// Datagrams that went out inside a batch.
    pub datagrams_batched: u64,
}

/// A batch being filled for one peer.
#[derive(Debug)]
struct Pending {
    destination: SocketAddr,
    server_id: u16,
    entries: Vec<Vec<u8>>,
    payload_len: usize,
}

/// Packs outgoing datagrams for batch-capable peers.
#[derive(Debug, Clone)]
pub struct Batcher {
    peers: Vec<SocketAddr>,
    /// Bytes a batch may have, header included (the trailer, if any, comes on top).
    datagram_budget: usize,
    /// The device id batches carry (0 from a server).
    device_id: u16,
    out: VecDeque<Transmit>,
    pub counters: BatchCounters,
}

impl Batcher {
    /// A batcher for datagrams of at most `datagram_budget` bytes before any trailer.
    pub fn new(datagram_budget: usize, device_id: u16) -> Batcher {
        Batcher {
            peers: Vec::new(),
            datagram_budget,
            device_id,
            out: VecDeque::new(),
            counters: BatchCounters::default(),
        }
    }

    /// Send batches to `peer` from now on. Returns false (and changes nothing) when
    /// [`BATCH_PEERS_MAX`] peers are known already.
    pub fn add_peer(&mut self, peer: SocketAddr) -> bool {
        if self.peers.contains(&peer) {
            return true;
        }
        if self.peers.len() >= BATCH_PEERS_MAX {
            return false;
        }
        self.peers.push(peer);
        true
    }

    pub fn is_peer(&self, peer: &SocketAddr) -> bool {
        self.peers.contains(peer)
    }

    /// Take every transmit `next` gives and queue it, those for peers packed into batches
    /// (per peer and server id, in the order given; a batch of one goes out as it is).
    pub fn fill(&mut self, mut next: impl FnMut() -> Option<Transmit>) {
        let payload_budget = self.datagram_budget.saturating_sub(HEADER_LEN);
        let mut pending: Vec<Pending> = Vec::new();
        while let Some(transmit) = next() {
            let bytes = &transmit.bytes;
            let packable = self.is_peer(&transmit.destination)
                && bytes.len() >= HEADER_LEN
                && bytes[field::TYPE] != PacketType::Batch.code()
                && batch_entry_len(bytes.len()) <= payload_budget;
            if !packable {
                self.out.push_back(transmit);
                continue;
            }
            let server_id = u16::from_be_bytes([
                bytes[field::SERVER_ID.start],
                bytes[field::SERVER_ID.start + 1],
            ]);
            let entry_len = batch_entry_len(bytes.len());
            let position = pending.iter().position(|batch| {
                batch.destination == transmit.destination && batch.server_id == server_id
            });
            let batch = match position {
                Some(index) if pending[index].payload_len + entry_len <= payload_budget => {
                    &mut pending[index]
                }
                Some(index) => {
                    let full = pending.remove(index);
                    self.emit(full);
                    pending.push(Pending::new(transmit.destination, server_id));
                    pending.last_mut().expect("just pushed")
                }
                None => {
                    pending.push(Pending::new(transmit.destination, server_id));
                    pending.last_mut().expect("just pushed")
                }
            };
            batch.payload_len += entry_len;
            batch.entries.push(transmit.bytes);
        }
        for batch in pending {
            self.emit(batch);
        }
    }

    /// The next datagram to send.
    pub fn pop(&mut self) -> Option<Transmit> {
        self.out.pop_front()
    }

    fn emit(&mut self, mut batch: Pending) {
        let bytes = if batch.entries.len() == 1 {
            batch.entries.pop().expect("one entry")
        } else {
            self.counters.batches_sent += 1;
            self.counters.datagrams_batched += batch.entries.len() as u64;
            encode_batch(batch.server_id, self.device_id, &batch.entries)
        };
        self.out.push_back(Transmit {
            destination: batch.destination,
            bytes,
        });
    }
}

impl Pending {
    fn new(destination: SocketAddr, server_id: u16) -> Pending {
        Pending {
            destination,
            server_id,
            entries: Vec::new(),
            payload_len: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pmnet_wire::{batch_entries, Header};

    fn to(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    fn update(session: u64, seq: u32, len: usize) -> Transmit {
        Transmit {
            destination: to(1),
            bytes: Header::new(PacketType::UpdateRequest, 1, session, seq).encode(&vec![7; len]),
        }
    }

    #[test]
    fn datagrams_for_a_peer_share_batches_up_to_the_budget_and_others_pass_as_they_are() {
        let mut batcher = Batcher::new(1472, 3);
        assert!(batcher.add_peer(to(1)));
        let mut queued: VecDeque<Transmit> = (1..=20).map(|seq| update(9, seq, 100)).collect();
        let stranger = Transmit {
            destination: to(2),
            bytes: Header::new(PacketType::PmnetAck, 1, 9, 1).encode(&[]),
        };
        queued.insert(3, stranger.clone());
        let given = queued.clone();
        batcher.fill(|| queued.pop_front());
        let mut sent = Vec::new();
        while let Some(transmit) = batcher.pop() {
            sent.push(transmit);
        }
        assert_eq!(sent[0], stranger, "not a peer: untouched, first");
        // 20 datagrams of 132 bytes (134 with the length) in batches of at most 1472 bytes.
        let unpacked: Vec<Vec<u8>> = sent[1..]
            .iter()
            .flat_map(|transmit| {
                assert!(transmit.bytes.len() <= 1472);
                let (header, payload) = Header::parse(&transmit.bytes).unwrap();
                assert_eq!(header.packet_type, PacketType::Batch);
                assert_eq!(header.device_id, 3);
                batch_entries(payload)
                    .map(|entry| entry.unwrap().to_vec())
                    .collect::<Vec<_>>()
            })
            .collect();
        let expected: Vec<Vec<u8>> = given
            .iter()
            .filter(|transmit| transmit.destination == to(1))
            .map(|transmit| transmit.bytes.clone())
            .collect();
        assert_eq!(unpacked, expected, "every datagram, in order");
        assert_eq!(sent.len() - 1, 2, "ten to a batch");
        assert_eq!(batcher.counters.datagrams_batched, 20);
    }

    #[test]
    fn a_lone_datagram_a_large_one_and_peers_beyond_the_bound_go_out_unpacked() {
        let mut batcher = Batcher::new(1472, 0);
        batcher.add_peer(to(1));
        let mut queued: VecDeque<Transmit> = [update(1, 1, 100)].into();
        batcher.fill(|| queued.pop_front());
        let lone = batcher.pop().unwrap();
        assert_eq!(
            Header::parse(&lone.bytes).unwrap().0.packet_type,
            PacketType::UpdateRequest
        );
        let mut queued: VecDeque<Transmit> = [update(1, 2, 1400), update(1, 3, 1400)].into();
        batcher.fill(|| queued.pop_front());
        for _ in 0..2 {
            let alone = batcher.pop().unwrap();
            assert_eq!(
                Header::parse(&alone.bytes).unwrap().0.packet_type,
                PacketType::UpdateRequest
            );
        }
        for port in 2..(BATCH_PEERS_MAX as u16 + 1) {
            assert!(batcher.add_peer(to(port)));
        }
        assert!(!batcher.add_peer(to(9999)), "bounded");
        assert!(batcher.add_peer(to(1)), "a known peer stays known");
    }
}

//! Batches on the wire ([`PacketType::Batch`], `pmnet_wire::batch`): the datagrams an endpoint
//! sends one peer in one turn go out packed, up to a datagram's size; a receiver unpacks a
//! batch and handles each entry as if it had arrived on its own.
//!
//! [`Batcher::fill`] packs what is queued when the endpoint is polled for transmits, which is
//! after it handled a whole receive batch (and, on a device, after the log write that releases
//! the acks): under load a turn holds many datagrams for the same peer and they share one
//! datagram. With a hold time (a device's, towards its servers), a batch of nothing but update
//! requests — which their clients hold acks for already: nothing waits on them — may wait up to
//! that long for more; anything else for the same peer (a bypass request, which must follow the
//! session's earlier updates, a recovery or fill answer) sends it at once, as does a full
//! batch. Only datagrams to peers known to unpack batches are packed: a device's servers
//! (configured) and, on a server, the peers that sent it a batch.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::Duration;

use pmnet_wire::{batch_entry_len, encode_batch, field, PacketType, HEADER_LEN};

use crate::{Time, Transmit};

/// Peers a server learns to send batches to, at most (a bound on what senders make it keep).
pub const BATCH_PEERS_MAX: usize = 64;

/// What a [`Batcher`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchCounters {
    /// Batches sent (each holds two datagrams or more).
    pub batches_sent: u64,
    /// Datagrams that went out inside a batch.
    pub datagrams_batched: u64,
    /// Batches that waited for the hold time to pass.
    pub batches_held: u64,
}

/// A batch being filled for one peer.
#[derive(Debug, Clone)]
struct Pending {
    destination: SocketAddr,
    server_id: u16,
    entries: Vec<Vec<u8>>,
    payload_len: usize,
    /// Every entry is an update request (what may be held).
    updates_only: bool,
    /// It has been kept back once (counted then).
    held: bool,
    /// When its first entry was queued.
    since: Time,
}

/// Packs outgoing datagrams for batch-capable peers.
#[derive(Debug, Clone)]
pub struct Batcher {
    peers: Vec<SocketAddr>,
    /// Bytes a batch may have, header included (the trailer, if any, comes on top).
    datagram_budget: usize,
    /// The device id batches carry (0 from a server).
    device_id: u16,
    /// Longest a batch of update requests waits for more (zero: never).
    hold: Duration,
    /// Batches waiting, at most one per peer and server id.
    pending: Vec<Pending>,
    now: Time,
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
            hold: Duration::ZERO,
            pending: Vec::new(),
            now: Time::ZERO,
            out: VecDeque::new(),
            counters: BatchCounters::default(),
        }
    }

    /// Let a batch of update requests wait up to `hold` for more.
    pub fn with_hold(mut self, hold: Duration) -> Batcher {
        self.hold = hold;
        self
    }

    /// The time now (the endpoint's last event): what the hold is measured against.
    pub fn set_now(&mut self, now: Time) {
        self.now = self.now.max(now);
    }

    /// When the oldest held batch must go out, if one is held.
    pub fn poll_timeout(&self) -> Option<Time> {
        self.pending
            .iter()
            .map(|batch| batch.since + self.hold)
            .min()
    }

    /// Send the held batches whose time has come (at `now`).
    pub fn handle_timeout(&mut self, now: Time) {
        self.set_now(now);
        self.release();
    }

    /// Whether a batch is held.
    pub fn is_holding(&self) -> bool {
        !self.pending.is_empty()
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
        let mut pending = std::mem::take(&mut self.pending);
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
            // A replicated update's client waits for the next device's ack: it may not wait.
            let flags =
                u16::from_be_bytes([bytes[field::FLAGS.start], bytes[field::FLAGS.start + 1]]);
            let is_update = bytes[field::TYPE] == PacketType::UpdateRequest.code()
                && flags & pmnet_wire::replication::REPLICATED == 0;
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
                    pending.push(Pending::new(transmit.destination, server_id, self.now));
                    pending.last_mut().expect("just pushed")
                }
                None => {
                    pending.push(Pending::new(transmit.destination, server_id, self.now));
                    pending.last_mut().expect("just pushed")
                }
            };
            batch.payload_len += entry_len;
            batch.updates_only &= is_update;
            batch.entries.push(transmit.bytes);
        }
        self.pending = pending;
        self.release();
    }

    /// Send the pending batches that may not wait: all of them without a hold time, those
    /// with anything but update requests, those whose hold time has passed. A batch that
    /// waits goes out as soon as one of those holds, or when full.
    fn release(&mut self) {
        let now = self.now;
        let hold = self.hold;
        let pending = std::mem::take(&mut self.pending);
        for batch in pending {
            let waits = !hold.is_zero() && batch.updates_only && now < batch.since + hold;
            if waits {
                let mut batch = batch;
                if !batch.held {
                    batch.held = true;
                    self.counters.batches_held += 1;
                }
                self.pending.push(batch);
            } else {
                self.emit(batch);
            }
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
    fn new(destination: SocketAddr, server_id: u16, since: Time) -> Pending {
        Pending {
            destination,
            server_id,
            entries: Vec::new(),
            payload_len: 0,
            updates_only: true,
            held: false,
            since,
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

    #[test]
    fn updates_wait_for_the_hold_but_a_replicated_update_does_not() {
        let mut batcher = Batcher::new(1472, 0).with_hold(Duration::from_micros(200));
        batcher.add_peer(to(1));
        let mut queued: VecDeque<Transmit> = [update(1, 1, 100)].into();
        batcher.fill(|| queued.pop_front());
        assert!(batcher.pop().is_none(), "a plain update waits for more");
        let mut replicated = update(2, 1, 100);
        let mut header = Header::parse(&replicated.bytes).unwrap().0;
        header.flags |= pmnet_wire::replication::REPLICATED;
        replicated.bytes = header.encode(&[7; 100]);
        let mut queued: VecDeque<Transmit> = [replicated].into();
        batcher.fill(|| queued.pop_front());
        assert!(
            batcher.pop().is_some(),
            "a replicated update's client waits for the next device's ack: sent at once"
        );
    }
}

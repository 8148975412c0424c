//! The AF_XDP receive path without a kernel: a stand-in for the fill and RX rings writes
//! frames where the kernel's copy mode would (256 bytes past the posted address), so the
//! placement, the slot bookkeeping and the records made in place are tested anywhere.

use std::collections::VecDeque;
use std::net::SocketAddrV4;

use pmnet_pm::{MmapOptions, MmapRegion, PmRegion};
use pmnet_store::{Application, Reply, Request};
use pmnet_wire::{Header, PacketType};
use pmnet_xdp::frame::write_udp;

use super::*;
use crate::layout::{Geometry, SESSION_TABLE_OFFSET};
use crate::{EngineKind, StoreConfig};

/// The kernel, as far as the receiver can tell: posted buffers, frames waiting to arrive.
struct FakeKernel {
    base: *mut u8,
    placement: XskPlacement,
    fill: VecDeque<u64>,
    fill_capacity: usize,
    arriving: VecDeque<Vec<u8>>,
    /// Frames dropped for want of a posted buffer, or too long for one.
    dropped: usize,
    /// Frames written somewhere other than a posted buffer (a descriptor from nowhere).
    bogus: VecDeque<(u64, u32)>,
}

impl FakeKernel {
    fn new(store: &mut Store<MmapRegion>, placement: XskPlacement, fill_capacity: usize) -> Self {
        FakeKernel {
            base: store.region_for_receive().receive_base(),
            placement,
            fill: VecDeque::new(),
            fill_capacity,
            arriving: VecDeque::new(),
            dropped: 0,
            bogus: VecDeque::new(),
        }
    }
}

impl FrameRings for FakeKernel {
    fn fill(&mut self, addrs: &[u64]) -> usize {
        let room = self.fill_capacity - self.fill.len();
        for &addr in &addrs[..addrs.len().min(room)] {
            assert!(
                addr as usize + self.placement.chunk <= self.placement.umem_len,
                "a buffer past the UMEM: {addr}"
            );
            self.fill.push_back(addr);
        }
        addrs.len().min(room)
    }

    fn receive_descs(&mut self, out: &mut Vec<(u64, u32)>, max: usize) -> usize {
        let mut taken = 0;
        while taken < max {
            if let Some(desc) = self.bogus.pop_front() {
                out.push(desc);
                taken += 1;
                continue;
            }
            let Some(frame) = self.arriving.pop_front() else {
                break;
            };
            if frame.len() > self.placement.max_frame_len() {
                self.dropped += 1;
                continue;
            }
            let Some(addr) = self.fill.pop_front() else {
                self.dropped += 1;
                continue;
            };
            let at = self.placement.umem_start + addr as usize + XDP_HEADROOM;
            // SAFETY: the buffer was posted (a lent slot's), inside the region (asserted
            // when posted); nothing else writes it while it is posted.
            unsafe {
                std::ptr::copy_nonoverlapping(frame.as_ptr(), self.base.add(at), frame.len());
            }
            out.push((addr + XDP_HEADROOM as u64, frame.len() as u32));
            taken += 1;
        }
        taken
    }
}

const CLIENT: SocketAddrV4 = SocketAddrV4::new(std::net::Ipv4Addr::new(10, 0, 0, 1), 4000);
const SERVER: SocketAddrV4 = SocketAddrV4::new(std::net::Ipv4Addr::new(10, 0, 0, 2), 7500);

fn frame_of(payload: &[u8]) -> Vec<u8> {
    let mut buffer = vec![0u8; payload.len() + FRAME_OVERHEAD];
    let len = write_udp(&mut buffer, [2; 6], [4; 6], CLIENT, SERVER, 64, payload).unwrap();
    buffer.truncate(len);
    buffer
}

fn set_datagram(session: u64, seq: u32, key: &[u8], value: &[u8]) -> Vec<u8> {
    let request = Request::Set { key, value }.to_bytes();
    Header::new(PacketType::UpdateRequest, 1, session, seq).encode(&request)
}

fn new_store(dir: &tempfile::TempDir, len: usize) -> Store<MmapRegion> {
    let region =
        MmapRegion::create(&dir.path().join("store"), len, MmapOptions::default()).unwrap();
    Store::format(region, StoreConfig::new(EngineKind::Packet)).unwrap()
}

fn receiver(
    store: &mut Store<MmapRegion>,
    target: usize,
    fill_capacity: usize,
) -> XskSlotReceiver<FakeKernel> {
    let placement = XskPlacement::new(store.geometry(), store.region().len(), 4096).unwrap();
    let kernel = FakeKernel::new(store, placement, fill_capacity);
    XskSlotReceiver::with_rings(kernel, store, placement, target)
}

#[test]
fn every_slot_has_a_buffer_inside_the_umem_and_its_frame_inside_the_slot() {
    for (slot_size, region_len, page) in [
        (2048, 1 << 20, 4096),
        (4096, 1 << 20, 4096),
        (2304, 1 << 20, 4096),
        (8192, 1 << 20, 4096),
        (1856, 1 << 20, 4096),
        (2048, (1 << 20) + 64 * 37, 4096),
        (2048, 1 << 20, 65536),
    ] {
        let geometry = Geometry::plan(EngineKind::Packet, region_len, slot_size, 128).unwrap();
        let placement = XskPlacement::new(&geometry, region_len, page).unwrap();
        let context = format!("slot size {slot_size}, region {region_len}, page {page}");
        assert_eq!(placement.umem_start % page, 0, "{context}");
        // The UMEM starts at the page of the first buffer, 234 bytes before the data area.
        let first_buffer = geometry.data_offset() - 234;
        assert_eq!(
            placement.umem_start,
            first_buffer / page * page,
            "{context}"
        );
        assert!(geometry.data_offset() > SESSION_TABLE_OFFSET, "{context}");
        assert!(
            placement.chunk >= 2048 && placement.chunk <= page,
            "{context}"
        );
        assert!(
            placement.umem_start + placement.umem_len <= region_len.div_ceil(page) * page,
            "{context}: the UMEM ends within the mapping"
        );
        // Every datagram a slot holds fits a frame the kernel accepts, up to the MTU of a
        // 2 KiB slot's datagram.
        let capacity = geometry.slot_datagram_capacity();
        assert!(
            placement.max_frame_len() - FRAME_OVERHEAD >= capacity.min(1984),
            "{context}: {} < {capacity}",
            placement.max_frame_len()
        );
        for slot in 0..geometry.slot_count {
            let addr = placement.fill_addr(slot) as usize;
            assert!(
                addr + placement.chunk <= placement.umem_len,
                "{context}: {slot}"
            );
            let slot_start = geometry.record_offset(geometry.slot_id(slot));
            let frame = placement.umem_start + addr + XDP_HEADROOM;
            assert_eq!(frame, slot_start + META_LEN - FRAME_OVERHEAD, "{context}");
            assert!(
                frame + placement.max_frame_len() <= slot_start + slot_size,
                "{context}: slot {slot}'s frame runs into the next slot"
            );
            assert!(placement.umem_start + addr >= first_buffer, "{context}");
            let frame_addr = (addr + XDP_HEADROOM) as u64;
            assert_eq!(placement.slot_of_frame(frame_addr), Some(slot), "{context}");
            assert_eq!(placement.slot_of_frame(frame_addr + 1), None, "{context}");
            assert_eq!(placement.slot_of_frame(frame_addr - 64), None, "{context}");
        }
        assert_eq!(placement.slot_of_frame(0), None);
        assert_eq!(placement.slot_of_frame(u64::MAX), None);
        assert_eq!(
            placement.slot_of_frame(
                placement.fill_addr(0) + 256 + (slot_size as u64) * u64::from(geometry.slot_count)
            ),
            None,
            "{context}: past the last slot"
        );
    }
}

#[test]
fn stores_that_cannot_take_frames_say_why() {
    let small = Geometry::plan(EngineKind::Packet, 1 << 20, 1024, 128).unwrap();
    let error = XskPlacement::new(&small, 1 << 20, 4096).unwrap_err();
    assert!(error.contains("too small for AF_XDP"), "{error}");
    let conventional = Geometry::plan(EngineKind::Conventional, 1 << 20, 0, 128).unwrap();
    let error = XskPlacement::new(&conventional, 1 << 20, 4096).unwrap_err();
    assert!(error.contains("conventional"), "{error}");
    let geometry = Geometry::plan(EngineKind::Packet, 1 << 20, 2048, 128).unwrap();
    assert!(
        XskPlacement::new(&geometry, 1 << 19, 4096).is_err(),
        "region too short"
    );
}

#[test]
fn a_steered_update_lands_in_its_slot_and_becomes_the_record_without_a_copy() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = new_store(&dir, 4 << 20);
    let mut receiver = receiver(&mut store, 64, 64);
    assert_eq!(receiver.fill_level(), (64, 64));
    assert_eq!(store.lent_slot_count(), 64);
    let datagram = set_datagram(77, 1, b"k", b"in place, by AF_XDP");
    receiver.rings.arriving.push_back(frame_of(&datagram));
    assert_eq!(receiver.receive_up_to(&mut store, 42, 32), 1);
    let Received::InSlot { slot, len, from } = receiver.received()[0] else {
        panic!("not in a slot: {:?}", receiver.received());
    };
    assert_eq!((len, from), (datagram.len(), SocketAddr::V4(CLIENT)));
    assert_eq!(store.received_datagram(slot).unwrap(), &datagram[..]);
    assert!(store.check_received(slot).is_ok());
    // The datagram is where recvmmsg would have put it, and the headers in the slot's own
    // metadata line, bytes 22..64.
    let record = store
        .geometry()
        .record_offset(store.geometry().slot_id(slot));
    let bytes = store.region().bytes();
    assert_eq!(
        &bytes[record + 64..record + 64 + datagram.len()],
        &datagram[..]
    );
    assert_eq!(&bytes[record + 22..record + 28], &[4; 6], "destination MAC");
    // The fill ring is full again; the received slot is the caller's.
    assert_eq!(receiver.fill_level(), (64, 64));
    assert_eq!(store.lent_slot_count(), 65);
    let reply = store.stage_received(77, 1, &[slot]).unwrap().unwrap();
    store.commit();
    assert_eq!(reply, Reply::Ok.to_bytes());
    assert_eq!(store.stats().records_received_in_place, 1);
    assert_eq!(
        store.get(b"k").unwrap().unwrap().to_vec(),
        b"in place, by AF_XDP"
    );
    assert_eq!(store.receive_time_ns(b"k"), Some(42));
    // The metadata line was written whole over the headers: the record survives a reopen.
    receiver.close(&mut store);
    assert_eq!(store.lent_slot_count(), 0);
    let path = dir.path().join("store");
    drop(store);
    let reopened = Store::open(MmapRegion::open(&path, MmapOptions::default()).unwrap()).unwrap();
    assert!(reopened.recovery().warning().is_none());
    assert_eq!(
        reopened.get(b"k").unwrap().unwrap().to_vec(),
        b"in place, by AF_XDP"
    );
}

#[test]
fn frames_not_kept_are_copied_out_or_dropped_and_their_slots_come_back() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = new_store(&dir, 4 << 20);
    let mut receiver = receiver(&mut store, 16, 16);
    let datagram = set_datagram(5, 1, b"a", b"b");
    // An 802.1Q tag moves the datagram 4 bytes on: copied out.
    let plain = frame_of(&datagram);
    let mut tagged = plain[..12].to_vec();
    tagged.extend_from_slice(&[0x81, 0x00, 0x00, 0x07]);
    tagged.extend_from_slice(&plain[12..]);
    // Not IPv4 (ARP), and a frame shorter than its headers.
    let mut arp = plain.clone();
    arp[12..14].copy_from_slice(&[0x08, 0x06]);
    let short = plain[..20].to_vec();
    // A datagram too short to be PMNet's: handed over as a copy for the protocol to count.
    let tiny = frame_of(b"hi");
    for frame in [tagged, arp, short, tiny] {
        receiver.rings.arriving.push_back(frame);
    }
    // A descriptor naming no posted buffer is ignored.
    receiver.rings.bogus.push_back((12_345, 100));
    let count = receiver.receive_up_to(&mut store, 1, 32);
    assert_eq!(count, 2, "{:?}", receiver.received());
    let Received::Spilled { index, from } = receiver.received()[0] else {
        panic!("the tagged frame should be copied out");
    };
    assert_eq!(
        (receiver.spilled(index), from),
        (&datagram[..], SocketAddr::V4(CLIENT))
    );
    let Received::Spilled { index, .. } = receiver.received()[1] else {
        panic!("the tiny datagram should be copied out");
    };
    assert_eq!(receiver.spilled(index), b"hi");
    let counters = receiver.counters().clone();
    assert_eq!(counters.frames, 5);
    assert_eq!(counters.copied_out, 2);
    assert_eq!(counters.unknown_descs, 1);
    assert_eq!(counters.malformed[FrameError::NotIpv4.index()], 1);
    assert_eq!(counters.malformed[FrameError::Truncated.index()], 1);
    assert_eq!(counters.in_slot, 0);
    // Nothing was kept: the store lends the fill ring's slots and no more.
    assert_eq!(store.lent_slot_count(), 16);
    assert_eq!(receiver.fill_level(), (16, 16));
    receiver.close(&mut store);
    assert_eq!(store.lent_slot_count(), 0);
    store.check_invariants();
}

#[test]
fn a_full_store_starves_the_fill_ring_and_recovers_when_slots_come_back() {
    let dir = tempfile::tempdir().unwrap();
    // 160 KiB of data: about 75 slots, a fill target of 9.
    let mut store = new_store(&dir, 8192 + 1024 * 256 + 4096 + 160 * 1024);
    let slots = store.geometry().slot_count;
    let mut receiver = receiver(&mut store, 1024, 1024);
    let (_, target) = receiver.fill_level();
    assert_eq!(target, slots as usize / 8);
    assert!(!receiver.starved());
    // Take every slot the store lends, as requests received and held would.
    let mut kept = Vec::new();
    let mut seq = 0;
    while !receiver.starved() {
        seq += 1;
        assert!(seq < 1000, "never starved");
        let datagram = set_datagram(9, seq, format!("key{seq}").as_bytes(), b"v");
        receiver.rings.arriving.push_back(frame_of(&datagram));
        receiver.receive_up_to(&mut store, 0, 32);
        for received in receiver.received() {
            if let Received::InSlot { slot, .. } = received {
                kept.push(*slot);
            }
        }
    }
    assert!(receiver.counters().starved_calls > 0);
    assert!(!receiver.recovered());
    // The caller gives the held slots back: the ring fills again.
    for slot in kept {
        store.release_slot(slot);
    }
    receiver.replenish(&mut store);
    assert!(receiver.recovered() && !receiver.starved());
    receiver.close(&mut store);
    assert_eq!(store.lent_slot_count(), 0);
}

#[test]
fn a_frame_written_into_a_posted_slot_is_nothing_until_committed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let mut store = new_store(&dir, 4 << 20);
    // One record committed first.
    let mut receiver = receiver(&mut store, 8, 8);
    let first = set_datagram(3, 1, b"kept", b"1");
    receiver.rings.arriving.push_back(frame_of(&first));
    receiver.receive_up_to(&mut store, 0, 32);
    let Received::InSlot { slot, .. } = receiver.received()[0] else {
        panic!("not in a slot");
    };
    store.stage_received(3, 1, &[slot]).unwrap().unwrap();
    store.commit();
    // Then frames land in posted slots, one is received and staged, and the process dies
    // before the commit: none of it is a record after recovery.
    for seq in 2..6 {
        let datagram = set_datagram(3, seq, b"lost", b"2");
        receiver.rings.arriving.push_back(frame_of(&datagram));
    }
    receiver.receive_up_to(&mut store, 0, 1);
    let Received::InSlot { slot, .. } = receiver.received()[0] else {
        panic!("not in a slot");
    };
    store.stage_received(3, 2, &[slot]).unwrap().unwrap();
    let crashed = store.into_region();
    drop(crashed);
    let reopened = Store::open(MmapRegion::open(&path, MmapOptions::default()).unwrap()).unwrap();
    assert!(reopened.recovery().warning().is_none());
    assert_eq!(reopened.get(b"kept").unwrap().unwrap().to_vec(), b"1");
    assert_eq!(reopened.get(b"lost").unwrap(), None);
    assert_eq!(reopened.key_count(), 1);
    let sessions = reopened.sessions();
    assert_eq!((sessions[0].session_id, sessions[0].last_seq), (3, 1));
}

#[test]
fn a_receiver_ignores_another_store_and_frames_too_long_are_the_kernels_to_drop() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = new_store(&dir, 4 << 20);
    let other_dir = tempfile::tempdir().unwrap();
    let mut other = new_store(&other_dir, 4 << 20);
    let mut receiver = receiver(&mut store, 8, 8);
    receiver
        .rings
        .arriving
        .push_back(frame_of(&set_datagram(1, 1, b"x", b"y")));
    assert_eq!(receiver.receive_up_to(&mut other, 0, 32), 0);
    assert_eq!(other.lent_slot_count(), 0);
    // A datagram as long as a slot holds fits a frame; one byte more does not fit the slot,
    // and the kernel drops what is longer than its frame size.
    let capacity = store.geometry().slot_datagram_capacity();
    let value = vec![7u8; capacity - pmnet_wire::HEADER_LEN - 7 - 1];
    let full = set_datagram(1, 1, b"x", &value);
    assert_eq!(full.len(), capacity);
    receiver.rings.arriving.push_back(frame_of(&full));
    receiver
        .rings
        .arriving
        .push_back(frame_of(&vec![0u8; capacity + 100]));
    receiver.receive_up_to(&mut store, 0, 32);
    assert_eq!(receiver.received().len(), 2, "{:?}", receiver.received());
    assert!(matches!(receiver.received()[1], Received::InSlot { len, .. } if len == capacity));
    assert_eq!(receiver.rings.dropped, 1, "longer than a frame");
    receiver
        .rings
        .arriving
        .push_back(frame_of(&vec![0u8; receiver.placement().max_frame_len()]));
    receiver.receive_up_to(&mut store, 0, 32);
    assert_eq!(receiver.rings.dropped, 2);
    assert!(receiver.received().is_empty());
}

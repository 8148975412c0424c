//! Receiving datagrams straight into the store's slots with `recvmmsg`.
//!
//! Each message of a batch gets two iovecs: first a free slot of the mapped region (lent by
//! [`Store::lend_receive_slots`]), then a DRAM overflow buffer. A datagram that fits the slot
//! lands in persistent memory where it will stay if it becomes a record: no copy from a socket
//! buffer into a second buffer. One that does not fit (larger than a slot) continues into the
//! overflow buffer and is reassembled in DRAM; its slot goes back. When no slot can be lent the
//! message gets the overflow buffer alone.

use std::io;
use std::mem::{size_of, MaybeUninit};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::RawFd;

use pmnet_pm::{MmapRegion, PmRegion};

use crate::store::{ReceiveSlot, Store};

/// Datagrams received per system call at most.
pub const RECEIVE_BATCH_LEN: usize = 32;
/// Beyond the largest UDP payload, so truncation is detectable.
const OVERFLOW_LEN: usize = 65_536;

/// A region the kernel may receive into.
pub trait ReceiveRegion: PmRegion {
    /// The address of byte 0 of the region, for the kernel to store received datagrams at
    /// offsets the store lends. Stores through it must stay inside lent slots.
    fn receive_base(&mut self) -> *mut u8;
}

impl ReceiveRegion for MmapRegion {
    fn receive_base(&mut self) -> *mut u8 {
        // The mapping is PROT_READ|PROT_WRITE and owned by `self`; `&mut self` guarantees no
        // borrow of its bytes is alive while the kernel stores into it. (A `MmapRegion` method
        // handing out the mapping's base pointer would express this without the cast.)
        self.bytes().as_ptr().cast_mut()
    }
}

/// Where one received datagram is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Received {
    /// In lent `slot` of the store, `len` bytes.
    InSlot {
        slot: u32,
        len: usize,
        from: SocketAddr,
    },
    /// In DRAM (larger than a slot, or no slot was free): [`SlotReceiver::spilled`].
    Spilled { index: usize, from: SocketAddr },
}

/// What a receiver counted; monotonically increasing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReceiveCounters {
    pub datagrams: u64,
    pub bytes: u64,
    pub batches: u64,
    pub in_slot: u64,
    pub spilled: u64,
    pub truncated: u64,
    pub unknown_source: u64,
    pub receive_errors: u64,
}

/// Receives batches of datagrams into store slots.
pub struct SlotReceiver {
    overflow: Vec<u8>,
    spilled: Vec<Vec<u8>>,
    lent: Vec<ReceiveSlot>,
    received: Vec<Received>,
    counters: ReceiveCounters,
}

impl std::fmt::Debug for SlotReceiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotReceiver")
            .field("counters", &self.counters)
            .finish()
    }
}

impl Default for SlotReceiver {
    fn default() -> Self {
        SlotReceiver::new()
    }
}

impl SlotReceiver {
    pub fn new() -> SlotReceiver {
        SlotReceiver {
            overflow: vec![0; RECEIVE_BATCH_LEN * OVERFLOW_LEN],
            spilled: Vec::new(),
            lent: Vec::with_capacity(RECEIVE_BATCH_LEN),
            received: Vec::with_capacity(RECEIVE_BATCH_LEN),
            counters: ReceiveCounters::default(),
        }
    }

    pub fn counters(&self) -> &ReceiveCounters {
        &self.counters
    }

    /// The datagrams of the last batch.
    pub fn received(&self) -> &[Received] {
        &self.received
    }

    /// A datagram of the last batch that did not stay in a slot.
    pub fn spilled(&self, index: usize) -> &[u8] {
        self.spilled.get(index).map_or(&[], Vec::as_slice)
    }

    /// Receive up to [`RECEIVE_BATCH_LEN`] datagrams from `fd` without blocking; returns how
    /// many ([`SlotReceiver::received`]). Datagrams in slots stay lent to the caller, who
    /// must stage or release each; slots that received nothing stay in the receiver's ring
    /// (see [`SlotReceiver::release_ring`]).
    pub fn receive<R: ReceiveRegion>(
        &mut self,
        fd: RawFd,
        store: &mut Store<R>,
        receive_time_ns: u64,
    ) -> usize {
        self.receive_up_to(fd, store, receive_time_ns, RECEIVE_BATCH_LEN)
    }

    /// [`SlotReceiver::receive`], taking at most `limit` datagrams (at most
    /// [`RECEIVE_BATCH_LEN`]); the rest stay in the kernel's socket buffer, in order.
    pub fn receive_up_to<R: ReceiveRegion>(
        &mut self,
        fd: RawFd,
        store: &mut Store<R>,
        receive_time_ns: u64,
        limit: usize,
    ) -> usize {
        let limit = limit.min(RECEIVE_BATCH_LEN);
        self.received.clear();
        self.spilled.clear();
        store.top_up_receive_slots(RECEIVE_BATCH_LEN, &mut self.lent);
        let base = store.region_for_receive().receive_base();
        // SAFETY: zeroed iovec, mmsghdr and sockaddr_storage are valid plain C structs.
        let mut iovecs: [[libc::iovec; 2]; RECEIVE_BATCH_LEN] =
            unsafe { MaybeUninit::zeroed().assume_init() };
        let mut headers: [libc::mmsghdr; RECEIVE_BATCH_LEN] =
            unsafe { MaybeUninit::zeroed().assume_init() };
        let mut addrs: [libc::sockaddr_storage; RECEIVE_BATCH_LEN] =
            unsafe { MaybeUninit::zeroed().assume_init() };
        self.describe_buffers(base, &mut iovecs, &mut headers, &mut addrs);
        let count = match limit {
            0 => 0,
            _ => self.receive_messages(fd, &mut headers, limit),
        };
        for (index, header) in headers.iter().enumerate().take(count) {
            self.sort_message(store, index, header, &addrs[index], receive_time_ns);
        }
        // The slots that received something are the caller's now (or were released above);
        // the rest stay in the ring for the next call.
        self.lent.drain(..count.min(self.lent.len()));
        if count > 0 {
            self.counters.batches += 1;
        }
        self.received.len()
    }

    /// Point message `index` of `headers` at its buffers: the lent slot of the ring at
    /// `index` (the region's byte 0 is at `base`), if there is one, then the overflow buffer;
    /// and at its entry of `addrs` for the source address. The arrays must stay where they
    /// are until the messages are received.
    fn describe_buffers(
        &mut self,
        base: *mut u8,
        iovecs: &mut [[libc::iovec; 2]; RECEIVE_BATCH_LEN],
        headers: &mut [libc::mmsghdr; RECEIVE_BATCH_LEN],
        addrs: &mut [libc::sockaddr_storage; RECEIVE_BATCH_LEN],
    ) {
        let overflow = self.overflow.as_mut_ptr();
        for index in 0..RECEIVE_BATCH_LEN {
            // SAFETY: index * OVERFLOW_LEN + OVERFLOW_LEN <= overflow.len().
            let overflow_iovec = libc::iovec {
                iov_base: unsafe { overflow.add(index * OVERFLOW_LEN) }.cast(),
                iov_len: OVERFLOW_LEN,
            };
            let header = &mut headers[index].msg_hdr;
            match self.lent.get(index) {
                Some(slot) => {
                    iovecs[index][0] = libc::iovec {
                        // SAFETY: a lent slot's datagram area lies inside the region.
                        iov_base: unsafe { base.add(slot.offset) }.cast(),
                        iov_len: slot.capacity,
                    };
                    iovecs[index][1] = overflow_iovec;
                    header.msg_iovlen = 2;
                }
                None => {
                    iovecs[index][0] = overflow_iovec;
                    header.msg_iovlen = 1;
                }
            }
            header.msg_iov = iovecs[index].as_mut_ptr();
            header.msg_name = (&mut addrs[index] as *mut libc::sockaddr_storage).cast();
            header.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        }
    }

    /// One `recvmmsg` call, without blocking, retried if interrupted: how many messages it
    /// received (none on an error, which is counted).
    fn receive_messages(
        &mut self,
        fd: RawFd,
        headers: &mut [libc::mmsghdr; RECEIVE_BATCH_LEN],
        limit: usize,
    ) -> usize {
        let limit = limit.min(RECEIVE_BATCH_LEN);
        loop {
            // SAFETY: the headers describe live buffers: lent slots of the mapping (which
            // nothing else touches while lent) and the overflow buffers.
            let count = unsafe {
                libc::recvmmsg(
                    fd,
                    headers.as_mut_ptr(),
                    limit as libc::c_uint,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                )
            };
            if count >= 0 {
                break count as usize;
            }
            let error = io::Error::last_os_error();
            match error.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock => break 0,
                _ => {
                    self.counters.receive_errors += 1;
                    break 0;
                }
            }
        }
    }

    /// Received message `index`: keep it in its slot, or spill it to DRAM, or drop it (no
    /// source address, or truncated), releasing its slot unless the datagram stays there.
    fn sort_message<R: ReceiveRegion>(
        &mut self,
        store: &mut Store<R>,
        index: usize,
        header: &libc::mmsghdr,
        addr: &libc::sockaddr_storage,
        receive_time_ns: u64,
    ) {
        let len = header.msg_len as usize;
        let slot = self.lent.get(index).copied();
        let truncated = header.msg_hdr.msg_flags & libc::MSG_TRUNC != 0;
        let Some(from) = socket_addr_from(addr) else {
            self.counters.unknown_source += 1;
            if let Some(slot) = slot {
                store.release_slot(slot.slot);
            }
            return;
        };
        if truncated {
            self.counters.truncated += 1;
            if let Some(slot) = slot {
                store.release_slot(slot.slot);
            }
            return;
        }
        self.counters.datagrams += 1;
        self.counters.bytes += len as u64;
        match slot {
            Some(slot) if len <= slot.capacity => {
                if store
                    .on_slot_received(slot.slot, len, receive_time_ns)
                    .is_ok()
                {
                    self.counters.in_slot += 1;
                    self.received.push(Received::InSlot {
                        slot: slot.slot,
                        len,
                        from,
                    });
                } else {
                    // Too short to be a datagram: pass it on for the protocol to count.
                    let bytes = store.slot_bytes(slot.slot, len).to_vec();
                    store.release_slot(slot.slot);
                    self.spill(bytes, from);
                }
            }
            Some(slot) => {
                let mut bytes = store.slot_bytes(slot.slot, slot.capacity).to_vec();
                let rest = (len - slot.capacity).min(OVERFLOW_LEN);
                let start = index * OVERFLOW_LEN;
                bytes.extend_from_slice(&self.overflow[start..start + rest]);
                store.release_slot(slot.slot);
                self.spill(bytes, from);
            }
            None => {
                let start = index * OVERFLOW_LEN;
                let bytes = self.overflow[start..start + len.min(OVERFLOW_LEN)].to_vec();
                self.spill(bytes, from);
            }
        }
    }

    /// Give the ring's unused slots back to the store.
    pub fn release_ring<R: ReceiveRegion>(&mut self, store: &mut Store<R>) {
        for slot in self.lent.drain(..) {
            store.release_slot(slot.slot);
        }
    }

    fn spill(&mut self, bytes: Vec<u8>, from: SocketAddr) {
        self.counters.spilled += 1;
        self.spilled.push(bytes);
        self.received.push(Received::Spilled {
            index: self.spilled.len() - 1,
            from,
        });
    }
}

fn socket_addr_from(storage: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match i32::from(storage.ss_family) {
        libc::AF_INET => {
            // SAFETY: the kernel wrote a sockaddr_in for AF_INET; storage is large enough.
            let addr = unsafe { &*(storage as *const _ as *const libc::sockaddr_in) };
            let ip = Ipv4Addr::from(u32::from_be(addr.sin_addr.s_addr));
            Some(SocketAddr::V4(SocketAddrV4::new(
                ip,
                u16::from_be(addr.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: as above, for sockaddr_in6.
            let addr = unsafe { &*(storage as *const _ as *const libc::sockaddr_in6) };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(addr.sin6_addr.s6_addr),
                u16::from_be(addr.sin6_port),
                addr.sin6_flowinfo,
                addr.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// Nanoseconds since the Unix epoch: the receive timestamp kept with each record.
pub fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

#[cfg(test)]
mod tests {
    use std::net::UdpSocket;
    use std::os::fd::AsRawFd;

    use pmnet_pm::MmapOptions;
    use pmnet_store::{Reply, Request};
    use pmnet_wire::{Header, PacketType};

    use super::*;
    use crate::{EngineKind, StoreConfig};

    #[test]
    fn datagrams_land_in_mapped_slots_and_become_records() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store");
        let region = MmapRegion::create(&path, 4 << 20, MmapOptions::default()).unwrap();
        let mut store = Store::format(region, StoreConfig::new(EngineKind::Packet)).unwrap();
        let receiver_socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        let sender = UdpSocket::bind("127.0.0.1:0").unwrap();
        let target = receiver_socket.local_addr().unwrap();
        let request = Request::Set {
            key: b"k",
            value: b"in place",
        }
        .to_bytes();
        let datagram = Header::new(PacketType::UpdateRequest, 1, 77, 1).encode(&request);
        sender.send_to(&datagram, target).unwrap();
        sender.send_to(&vec![0xAB; 5000], target).unwrap(); // Larger than a slot.
        std::thread::sleep(std::time::Duration::from_millis(20));
        let mut receiver = SlotReceiver::new();
        let count = receiver.receive(receiver_socket.as_raw_fd(), &mut store, 42);
        assert_eq!(count, 2);
        let Received::InSlot { slot, len, .. } = receiver.received()[0] else {
            panic!("first datagram not in a slot: {:?}", receiver.received());
        };
        assert_eq!(len, datagram.len());
        assert_eq!(store.received_datagram(slot).unwrap(), &datagram[..]);
        assert!(store.check_received(slot).is_ok());
        let Received::Spilled { index, .. } = receiver.received()[1] else {
            panic!("the large datagram should spill");
        };
        assert_eq!(receiver.spilled(index), &vec![0xAB; 5000][..]);
        assert_eq!(
            store.lent_slot_count(),
            RECEIVE_BATCH_LEN - 1,
            "the datagram's slot and the rest of the ring stay lent"
        );
        let reply = store.stage_received(77, 1, &[slot]).unwrap().unwrap();
        store.commit();
        assert_eq!(reply, Reply::Ok.to_bytes());
        assert_eq!(store.get(b"k").unwrap().unwrap().to_vec(), b"in place");
        assert_eq!(store.receive_time_ns(b"k"), Some(42));
        drop(store);
        let reopened =
            Store::open(MmapRegion::open(&path, MmapOptions::default()).unwrap()).unwrap();
        assert_eq!(reopened.get(b"k").unwrap().unwrap().to_vec(), b"in place");
        // Nothing waiting: a receive returns 0; the ring goes back on request. (A receiver's
        // ring belongs to one store: a reopened store gets a new receiver.)
        let mut store = reopened;
        let mut receiver = SlotReceiver::new();
        assert_eq!(
            receiver.receive(receiver_socket.as_raw_fd(), &mut store, 0),
            0
        );
        assert_eq!(store.lent_slot_count(), RECEIVE_BATCH_LEN);
        receiver.release_ring(&mut store);
        assert_eq!(store.lent_slot_count(), 0);
    }
}

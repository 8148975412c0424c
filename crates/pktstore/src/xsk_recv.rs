//! Receiving update frames with AF_XDP **straight into the store's slots**: the UMEM of the
//! socket is the store's own mapped region, so a frame the XDP program steers to the socket is
//! written by the kernel where its datagram will stay as the record — PASTE's design (Honda et
//! al., NSDI 2018) with the packet store's slots as the packet buffers. [`XskSlotReceiver`]
//! plays the role [`SlotReceiver`](crate::recv::SlotReceiver) plays for a UDP socket.
//!
//! # Where a frame lands
//!
//! A slot is a 64-byte metadata line followed by the datagram (`docs/storage.md`). The kernel
//! writes a received frame — Ethernet (14 bytes), IPv4 (20) and UDP (8) headers, then the UDP
//! payload, which is the PMNet datagram — at the buffer address posted on the fill ring plus
//! `XDP_PACKET_HEADROOM` (256). The UMEM is registered in unaligned chunk mode
//! (`XDP_UMEM_UNALIGNED_CHUNK_FLAG`, [`pmnet_xdp::Umem::over_unaligned`]), so a buffer may
//! start anywhere: the receiver posts, for slot `s` starting at region offset `r`,
//!
//! ```text
//!   buffer  = r + 64 - 42 - 256          (chunk of C = min(slot size + 234, page) bytes)
//!   frame   = r + 22 .. r + 22 + len      (len <= C - 256: the kernel drops longer frames)
//!   headers = r + 22 .. r + 64            the slot's own metadata line, bytes 22..64
//!   datagram= r + 64 ..                   exactly where SlotReceiver's recvmmsg puts it
//! ```
//!
//! The 42 bytes of headers overwrite bytes 22..64 of the slot's own metadata line, which is free
//! space while the slot is lent and is written whole (all 64 bytes) before the slot becomes a
//! record. The chunk's first 256 + 22 - 64 = 234 bytes before the slot (the previous slot's
//! tail, or for slot 0 the page before the data area) are the kernel's headroom: in copy mode
//! the kernel writes the frame's bytes and nothing else there (the XDP program adds no
//! metadata), and a frame never runs past `r + slot size`. So no neighbouring record is
//! touched, and the store's layout is unchanged: any existing store file works, with no
//! version change. A frame whose datagram does not start at `r + 64` (an 802.1Q tag, IPv4
//! options) is copied out and its slot given back.
//!
//! # Crash consistency
//!
//! A slot posted on the fill ring is lent free space, exactly like a slot lent to `recvmmsg`:
//! nothing reachable points at it, so whatever the kernel writes there (or had half written
//! when the process died) is not a record until the store stages and commits it; recovery
//! derives the free slots from what is reachable and forgets every loan. A killed process's
//! socket is released (and stops writing) before the process is reaped.
//!
//! # Slots not kept
//!
//! Everything steered to the socket arrives in a slot: update requests, but also reads,
//! answers of devices and replicas. Each is handed to the caller in its slot
//! ([`Received::InSlot`]) like any datagram `SlotReceiver` receives; the caller keeps the slots
//! of update requests for staging and releases the others once handled (the slot goes back to
//! the store's free slots, and the receiver lends a free slot to the fill ring in its place).
//!
//! # Bounds
//!
//! The fill ring holds at most [`XskReceiveConfig::fill_target`] slots (and never more than
//! an eighth of the store); they are lent, not free, while the kernel holds them. When the
//! store has no slot to lend (it is full), the fill ring drains and frames would be dropped:
//! [`XskSlotReceiver::starved`] says so, and the server then stops steering, so datagrams go to
//! its UDP socket again (where deletes still reach a full store).

use std::fmt;
use std::net::SocketAddr;

use pmnet_wire::HEADER_LEN;
use pmnet_xdp::frame::{parse_udp_with, FrameError, UdpChecksum, FRAME_OVERHEAD};
use pmnet_xdp::{Umem, XdpError, XskConfig, XskSocket};

use crate::layout::{Geometry, META_LEN};
use crate::recv::{ReceiveRegion, Received};
use crate::store::{ReceiveSlot, Store};
use crate::EngineKind;

/// `XDP_PACKET_HEADROOM`: the kernel writes a received frame this far past the posted address.
pub const XDP_HEADROOM: usize = 256;
/// The smallest chunk the kernel accepts (`XDP_UMEM_MIN_CHUNK_SIZE`).
const MIN_CHUNK: usize = 2048;
/// Slots posted on the fill ring at most (2 MiB of 2 KiB slots).
pub const DEFAULT_FILL_TARGET: usize = 1024;
/// Frames taken from the RX ring per call at most.
pub const XSK_BATCH_LEN: usize = 64;
/// The largest fill target (the rings are sized to it, and the kernel's rings hold at most
/// 2^16 entries here).
pub const MAX_FILL_TARGET: usize = 32_768;

/// Where frames go in the store's region: the UMEM (a range of the region) and each slot's
/// buffer in it. Pure arithmetic on the store's geometry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XskPlacement {
    /// Region offset of UMEM address 0 (page aligned).
    pub umem_start: usize,
    /// UMEM length in bytes.
    pub umem_len: usize,
    /// Chunk size registered: a buffer is `chunk` bytes from its posted address.
    pub chunk: usize,
    data_offset: usize,
    slot_size: usize,
    slot_count: u32,
}

impl XskPlacement {
    /// The placement for a packet store of `geometry` in a region of `region_len` bytes on a
    /// machine with pages of `page` bytes; why not, if its slots cannot take frames.
    pub fn new(
        geometry: &Geometry,
        region_len: usize,
        page: usize,
    ) -> Result<XskPlacement, String> {
        if geometry.engine != EngineKind::Packet {
            return Err(format!(
                "the {} engine keeps no slots to receive into",
                geometry.engine.name()
            ));
        }
        if !page.is_power_of_two() || page < MIN_CHUNK {
            return Err(format!("a page of {page} bytes"));
        }
        let slot_size = geometry.slot_size as usize;
        // The bytes of a chunk before its slot: the kernel's headroom, less the headers that
        // land in the slot's metadata line.
        let lead = XDP_HEADROOM + FRAME_OVERHEAD - META_LEN;
        let chunk = (slot_size + lead).min(page);
        if chunk < MIN_CHUNK {
            return Err(format!(
                "slots of {slot_size} bytes are too small for AF_XDP: a frame needs a chunk of \
                 at least {MIN_CHUNK} bytes, {lead} of them before the slot (slots of at least \
                 {} bytes)",
                MIN_CHUNK - lead
            ));
        }
        let data_offset = geometry.data_offset();
        let data_end = data_offset
            .checked_add(usize::try_from(geometry.data_len).map_err(|_| "data too large")?)
            .filter(|end| *end <= region_len)
            .ok_or_else(|| format!("the data area does not fit a region of {region_len} bytes"))?;
        let first_buffer = data_offset
            .checked_sub(lead)
            .ok_or("the data area starts too early")?;
        let umem_start = first_buffer / page * page;
        let umem_end = data_end.div_ceil(page) * page;
        Ok(XskPlacement {
            umem_start,
            umem_len: umem_end - umem_start,
            chunk,
            data_offset,
            slot_size,
            slot_count: geometry.slot_count,
        })
    }

    /// The longest frame a buffer takes (the kernel drops longer ones).
    pub fn max_frame_len(&self) -> usize {
        self.chunk - XDP_HEADROOM
    }

    /// Region offset of slot `slot`'s datagram area.
    pub fn datagram_offset(&self, slot: u32) -> usize {
        self.data_offset + slot as usize * self.slot_size + META_LEN
    }

    /// The UMEM address to post for `slot`: its frame then starts [`FRAME_OVERHEAD`] bytes
    /// before its datagram area.
    pub fn fill_addr(&self, slot: u32) -> u64 {
        (self.datagram_offset(slot) - FRAME_OVERHEAD - XDP_HEADROOM - self.umem_start) as u64
    }

    /// The slot whose buffer holds a frame received at UMEM address `frame` (the frame's
    /// first byte), if it is exactly where a posted slot's frame starts.
    pub fn slot_of_frame(&self, frame: u64) -> Option<u32> {
        let region_offset = usize::try_from(frame).ok()?.checked_add(self.umem_start)?;
        let from_data = region_offset
            .checked_add(FRAME_OVERHEAD)?
            .checked_sub(self.data_offset + META_LEN)?;
        let slot = u32::try_from(from_data / self.slot_size).ok()?;
        (from_data % self.slot_size == 0 && slot < self.slot_count).then_some(slot)
    }
}

/// The rings the receiver moves slots through: an AF_XDP socket's fill and RX rings
/// ([`XskSocket`]'s low-level layer), or a stand-in in tests.
pub trait FrameRings {
    /// Post buffer addresses on the fill ring; how many were taken (in order).
    fn fill(&mut self, addrs: &[u64]) -> usize;
    /// Append up to `max` received (frame address, length) to `out`; how many.
    fn receive_descs(&mut self, out: &mut Vec<(u64, u32)>, max: usize) -> usize;
    /// Wake the kernel if it stopped receiving for want of buffers and asked to be woken.
    fn wake(&mut self) {}
}

impl FrameRings for XskSocket {
    fn fill(&mut self, addrs: &[u64]) -> usize {
        XskSocket::fill(self, addrs)
    }

    fn receive_descs(&mut self, out: &mut Vec<(u64, u32)>, max: usize) -> usize {
        XskSocket::receive_descs(self, out, max)
    }

    fn wake(&mut self) {
        self.wake_rx();
    }
}

/// How the receiver's socket is made.
#[derive(Debug, Clone)]
pub struct XskReceiveConfig {
    /// The interface and its receive queue.
    pub ifname: String,
    pub queue: u32,
    /// Slots kept posted on the fill ring (at most an eighth of the store's slots).
    pub fill_target: usize,
    /// Busy-poll the socket (`SO_PREFER_BUSY_POLL`, `SO_BUSY_POLL`).
    pub busy_poll: bool,
}

impl XskReceiveConfig {
    pub fn new(ifname: &str) -> XskReceiveConfig {
        XskReceiveConfig {
            ifname: ifname.to_owned(),
            queue: 0,
            fill_target: DEFAULT_FILL_TARGET,
            busy_poll: false,
        }
    }
}

/// Why the receiver could not start.
#[derive(Debug, thiserror::Error)]
pub enum XskReceiveError {
    /// The store cannot take frames in its slots (engine, slot size, region).
    #[error("the store cannot receive frames in its slots: {0}")]
    Placement(String),
    /// The socket could not be made (the kernel's answer, in words).
    #[error("{0}")]
    Socket(#[from] XdpError),
}

/// What the receiver counted; monotonically increasing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct XskCounters {
    /// Frames taken from the RX ring.
    pub frames: u64,
    /// UDP payload bytes of the frames that parsed.
    pub bytes: u64,
    pub batches: u64,
    /// Datagrams handed over in their slot, where the kernel put them.
    pub in_slot: u64,
    /// Datagrams copied out (not at the slot's datagram area: an 802.1Q tag, IPv4 options; or
    /// too short to be a PMNet datagram) and their slot given back.
    pub copied_out: u64,
    /// Frames that did not parse as IPv4/UDP, by [`FrameError::index`]; their slot went back.
    pub malformed: [u64; FrameError::ALL.len()],
    /// Descriptors naming no slot the kernel held (never expected; ignored).
    pub unknown_descs: u64,
    /// Slots posted on the fill ring.
    pub posted: u64,
    /// Receive calls after which the store had too few free slots to keep the fill ring at a
    /// quarter of its target ([`XskSlotReceiver::starved`]).
    pub starved_calls: u64,
}

/// Receives frames from an AF_XDP socket whose UMEM is the store's region, in place. See the
/// module documentation.
pub struct XskSlotReceiver<S: FrameRings = XskSocket> {
    rings: S,
    placement: XskPlacement,
    /// The store this receiver belongs to: its region's base and length.
    region_base: usize,
    region_len: usize,
    /// Slots the kernel holds (posted, not yet received), one bit each.
    held: Vec<u64>,
    held_count: usize,
    target: usize,
    lend: Vec<ReceiveSlot>,
    addrs: Vec<u64>,
    descs: Vec<(u64, u32)>,
    received: Vec<Received>,
    spilled: Vec<Vec<u8>>,
    counters: XskCounters,
}

impl<S: FrameRings> fmt::Debug for XskSlotReceiver<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("XskSlotReceiver")
            .field("placement", &self.placement)
            .field("held", &self.held_count)
            .field("target", &self.target)
            .field("counters", &self.counters)
            .finish()
    }
}

/// The fill target for a store of `slot_count` slots: at most an eighth of them.
fn fill_target(wanted: usize, slot_count: u32) -> usize {
    wanted
        .min(MAX_FILL_TARGET)
        .min(slot_count as usize / 8)
        .max(1)
}

/// Start fetching the cache line at `at` (a hint; nothing is read).
#[inline]
fn prefetch(at: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE is part of x86_64; a prefetch of any address has no effect but a cache fill.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(at.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = at;
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(page).unwrap_or(4096)
}

impl XskSlotReceiver<XskSocket> {
    /// Open an AF_XDP socket on `config.ifname` queue `config.queue` in copy mode whose UMEM is
    /// `store`'s data area, and post `config.fill_target` free slots on its fill ring. Register
    /// the socket with the XDP program ([`pmnet_xdp::Steering::register`], through
    /// [`XskSlotReceiver::socket`]) to have frames steered to it.
    ///
    /// Copy mode always: in zero-copy mode a driver receives into DMA-mapped pages, and a
    /// buffer straddling two pages of a file mapping (most slots' buffers do) would have to be
    /// physically contiguous.
    ///
    /// # Safety
    ///
    /// The store's region must stay mapped for as long as the receiver lives (drop the
    /// receiver first, or [`XskSlotReceiver::close`] it), and the receiver must be used with
    /// this store only (a call with another store does nothing).
    pub unsafe fn open<R: ReceiveRegion>(
        store: &mut Store<R>,
        config: &XskReceiveConfig,
    ) -> Result<XskSlotReceiver<XskSocket>, XskReceiveError> {
        let placement = XskPlacement::new(store.geometry(), store.region().len(), page_size())
            .map_err(XskReceiveError::Placement)?;
        let base = store.region_for_receive().receive_base();
        // SAFETY: `umem_start..umem_start + umem_len` lies in the region's mapping (its last
        // page at most rounds the region's length up to the page the mapping covers), which
        // the caller keeps mapped while the receiver lives. The kernel writes only buffers
        // posted on the fill ring: slots lent by the store, which nothing else touches while
        // lent.
        let umem = unsafe {
            Umem::over_unaligned(
                base.add(placement.umem_start),
                placement.umem_len,
                placement.chunk as u32,
            )
        }?;
        let fill_ring = (fill_target(config.fill_target, placement.slot_count) as u32)
            .next_power_of_two()
            .max(64);
        let xsk_config = XskConfig {
            queue: config.queue,
            rx_ring: fill_ring,
            tx_ring: 64,
            fill_ring,
            completion_ring: 64,
            busy_poll: config.busy_poll,
            zero_copy: false,
            ..XskConfig::default()
        };
        let socket = XskSocket::open_raw(&config.ifname, umem, xsk_config)?;
        Ok(XskSlotReceiver::with_rings(
            socket,
            store,
            placement,
            config.fill_target,
        ))
    }

    /// The socket, to register it with the XDP program and read its statistics.
    pub fn socket(&self) -> &XskSocket {
        &self.rings
    }
}

impl<S: FrameRings> XskSlotReceiver<S> {
    /// A receiver over `rings`, whose buffers are `store`'s slots placed by `placement`; posts
    /// the first slots.
    pub fn with_rings<R: ReceiveRegion>(
        rings: S,
        store: &mut Store<R>,
        placement: XskPlacement,
        fill_target_wanted: usize,
    ) -> XskSlotReceiver<S> {
        let base = store.region_for_receive().receive_base() as usize;
        let mut receiver = XskSlotReceiver {
            rings,
            placement,
            region_base: base,
            region_len: store.region().len(),
            held: vec![0; (placement.slot_count as usize).div_ceil(64)],
            held_count: 0,
            target: fill_target(fill_target_wanted, placement.slot_count),
            lend: Vec::new(),
            addrs: Vec::new(),
            descs: Vec::with_capacity(XSK_BATCH_LEN),
            received: Vec::with_capacity(XSK_BATCH_LEN),
            spilled: Vec::new(),
            counters: XskCounters::default(),
        };
        receiver.top_up(store);
        receiver
    }

    pub fn placement(&self) -> &XskPlacement {
        &self.placement
    }

    pub fn counters(&self) -> &XskCounters {
        &self.counters
    }

    /// Slots the kernel holds on the fill ring now, and how many it should.
    pub fn fill_level(&self) -> (usize, usize) {
        (self.held_count, self.target)
    }

    /// Whether the fill ring is below a quarter of its target because the store had no free
    /// slot to lend: frames are dropped once it is empty.
    pub fn starved(&self) -> bool {
        self.held_count < self.target.div_ceil(4)
    }

    /// Whether the fill ring is back at half its target or more (the end of a starvation).
    pub fn recovered(&self) -> bool {
        self.held_count >= self.target.div_ceil(2)
    }

    /// The datagrams of the last batch.
    pub fn received(&self) -> &[Received] {
        &self.received
    }

    /// A datagram of the last batch that was copied out of its slot.
    pub fn spilled(&self, index: usize) -> &[u8] {
        self.spilled.get(index).map_or(&[], Vec::as_slice)
    }

    /// Whether `store` is the store this receiver was made for.
    fn owns<R: ReceiveRegion>(&self, store: &mut Store<R>) -> bool {
        store.region_for_receive().receive_base() as usize == self.region_base
            && store.region().len() == self.region_len
    }

    fn is_held(&self, slot: u32) -> bool {
        let slot = slot as usize;
        self.held
            .get(slot / 64)
            .is_some_and(|word| word & (1 << (slot % 64)) != 0)
    }

    fn set_held(&mut self, slot: u32, held: bool) {
        let slot = slot as usize;
        if let Some(word) = self.held.get_mut(slot / 64) {
            if held {
                *word |= 1 << (slot % 64);
            } else {
                *word &= !(1 << (slot % 64));
            }
        }
    }

    /// Lend free slots and post them until the fill ring holds its target (or the store lends
    /// no more); slots the ring does not take go back at once.
    fn top_up<R: ReceiveRegion>(&mut self, store: &mut Store<R>) {
        let want = self.target.saturating_sub(self.held_count);
        if want == 0 {
            return;
        }
        let mut lend = std::mem::take(&mut self.lend);
        store.lend_receive_slots(want, &mut lend);
        self.addrs.clear();
        self.addrs
            .extend(lend.iter().map(|slot| self.placement.fill_addr(slot.slot)));
        let taken = if self.addrs.is_empty() {
            0
        } else {
            self.rings.fill(&self.addrs).min(lend.len())
        };
        for slot in &lend[..taken] {
            self.set_held(slot.slot, true);
        }
        self.held_count += taken;
        self.counters.posted += taken as u64;
        for slot in &lend[taken..] {
            store.release_slot(slot.slot);
        }
        lend.clear();
        self.lend = lend;
        if taken > 0 {
            self.rings.wake();
        }
    }

    /// Post free slots until the fill ring is at its target again, if the store has them
    /// (slots the caller gave back since the last receive). [`Self::receive_up_to`] does it too;
    /// this is for a caller that has not received for a while (its steering off, say).
    pub fn replenish<R: ReceiveRegion>(&mut self, store: &mut Store<R>) {
        if self.owns(store) {
            self.top_up(store);
        }
    }

    /// Take up to `limit` frames (at most [`XSK_BATCH_LEN`]) from the RX ring without blocking;
    /// returns how many datagrams ([`XskSlotReceiver::received`]). A datagram in its slot stays
    /// lent to the caller, who must stage or release it, as with
    /// [`SlotReceiver`](crate::recv::SlotReceiver). The fill ring is topped up before and after.
    pub fn receive_up_to<R: ReceiveRegion>(
        &mut self,
        store: &mut Store<R>,
        receive_time_ns: u64,
        limit: usize,
    ) -> usize {
        self.received.clear();
        self.spilled.clear();
        if !self.owns(store) {
            return 0;
        }
        self.top_up(store);
        let limit = limit.min(XSK_BATCH_LEN);
        self.descs.clear();
        let mut descs = std::mem::take(&mut self.descs);
        if limit > 0 {
            self.rings.receive_descs(&mut descs, limit);
        }
        // The kernel wrote the frames on another CPU: start fetching their first two lines
        // (headers, then the PMNet header) for the whole batch before reading any.
        let base = store.region().bytes().as_ptr();
        for &(addr, _) in &descs {
            let start = self.placement.umem_start.saturating_add(addr as usize);
            if start.saturating_add(128) <= self.region_len {
                // SAFETY: in bounds of the region (checked); a prefetch reads nothing.
                prefetch(unsafe { base.add(start) });
                prefetch(unsafe { base.add(start + 64) });
            }
        }
        for &(addr, len) in &descs {
            self.take_frame(store, addr, len as usize, receive_time_ns);
        }
        if !descs.is_empty() {
            self.counters.batches += 1;
        }
        self.descs = descs;
        self.top_up(store);
        if self.starved() {
            self.counters.starved_calls += 1;
        }
        self.received.len()
    }

    /// The frame at UMEM address `addr`: its datagram handed over in its slot, copied out, or
    /// dropped (its slot given back).
    fn take_frame<R: ReceiveRegion>(
        &mut self,
        store: &mut Store<R>,
        addr: u64,
        len: usize,
        receive_time_ns: u64,
    ) {
        self.counters.frames += 1;
        let slot = match self.placement.slot_of_frame(addr) {
            Some(slot) if self.is_held(slot) => slot,
            _ => {
                self.counters.unknown_descs += 1;
                return;
            }
        };
        self.set_held(slot, false);
        self.held_count -= 1;
        let start = self.placement.umem_start + addr as usize;
        let datagram_at = self.placement.datagram_offset(slot);
        let (from, payload_len, copy) = {
            let region = store.region().bytes();
            // The frame ends within the slot's buffer (the kernel's frame size; checked again).
            let frame = start
                .checked_add(len.min(self.placement.max_frame_len()))
                .and_then(|end| region.get(start..end))
                .unwrap_or(&[]);
            let parsed = match parse_udp_with(frame, UdpChecksum::Ignore) {
                Ok(parsed) => parsed,
                Err(error) => {
                    self.counters.malformed[error.index()] += 1;
                    store.release_slot(slot);
                    return;
                }
            };
            let payload_at = parsed.payload.as_ptr() as usize - region.as_ptr() as usize;
            let in_place = payload_at == datagram_at && parsed.payload.len() >= HEADER_LEN;
            (
                SocketAddr::V4(parsed.src),
                parsed.payload.len(),
                (!in_place).then(|| parsed.payload.to_vec()),
            )
        };
        self.counters.bytes += payload_len as u64;
        let copy = match copy {
            None => match store.on_slot_received(slot, payload_len, receive_time_ns) {
                Ok(()) => {
                    self.counters.in_slot += 1;
                    self.received.push(Received::InSlot {
                        slot,
                        len: payload_len,
                        from,
                    });
                    return;
                }
                Err(_) => store
                    .region()
                    .bytes()
                    .get(datagram_at..datagram_at + payload_len)
                    .unwrap_or(&[])
                    .to_vec(),
            },
            Some(copy) => copy,
        };
        // Not where the record would start, or too short to be a datagram: a copy for the
        // protocol to handle (and count), and the slot back.
        store.release_slot(slot);
        self.counters.copied_out += 1;
        self.spilled.push(copy);
        self.received.push(Received::Spilled {
            index: self.spilled.len() - 1,
            from,
        });
    }

    /// Close the socket (the kernel stops writing into the slots it held), then give those
    /// slots back to the store.
    pub fn close<R: ReceiveRegion>(self, store: &mut Store<R>) {
        let XskSlotReceiver {
            rings,
            held,
            region_base,
            region_len,
            ..
        } = self;
        drop(rings);
        if store.region_for_receive().receive_base() as usize != region_base
            || store.region().len() != region_len
        {
            return;
        }
        for (index, word) in held.iter().enumerate() {
            let mut bits = *word;
            while bits != 0 {
                let bit = bits.trailing_zeros();
                bits &= bits - 1;
                store.release_slot(index as u32 * 64 + bit);
            }
        }
    }
}

#[cfg(test)]
mod tests;

//! AF_XDP sockets: an [`XskSocket`] binds one receive queue of one interface to a [`Umem`] and
//! the four rings (see `ring.rs` for their memory ordering).
//!
//! Frame ownership: each UMEM frame is at any moment owned either by the application or by the
//! kernel. Posting a frame on the fill ring gives it to the kernel to receive into; it comes
//! back in an RX descriptor. Posting a frame on the TX ring gives it to the kernel to send; it
//! comes back on the completion ring. The application must not write a frame the kernel owns,
//! and must not post a frame twice.
//!
//! Two layers:
//!
//! - **low level** ([`XskSocket::open_raw`], [`fill`](XskSocket::fill),
//!   [`receive_descs`](XskSocket::receive_descs), [`transmit_descs`](XskSocket::transmit_descs),
//!   [`completions`](XskSocket::completions)): the caller owns every frame and does that
//!   bookkeeping itself (the packet store, whose frames are its persistent slots);
//! - **high level** ([`XskSocket::open`]): a built-in pool splits the UMEM into receive frames
//!   (all posted to the fill ring, returned there by [`release_batch`](XskSocket::release_batch))
//!   and transmit frames (a free list, refilled from the completion ring by
//!   [`flush`](XskSocket::flush)).

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use crate::ring::{ConsumerRing, ProducerRing};
use crate::sys::getsockopt;
use crate::{Umem, XdpError};

mod setup;

/// The shape of an AF_XDP socket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct XskConfig {
    /// The interface's receive queue to bind (the XDP program redirects frames received on
    /// queue `q` to the socket registered at `q`).
    pub queue: u32,
    /// RX ring entries (power of two).
    pub rx_ring: u32,
    /// TX ring entries (power of two).
    pub tx_ring: u32,
    /// Fill ring entries (power of two).
    pub fill_ring: u32,
    /// Completion ring entries (power of two).
    pub completion_ring: u32,
    /// Ask for busy polling (SO_PREFER_BUSY_POLL, SO_BUSY_POLL, SO_BUSY_POLL_BUDGET).
    pub busy_poll: bool,
    /// Busy-poll time per call in µs (SO_BUSY_POLL), when `busy_poll`.
    pub busy_poll_usecs: u32,
    /// Packets per busy-poll round (SO_BUSY_POLL_BUDGET), when `busy_poll`.
    pub busy_poll_budget: u32,
    /// Try zero-copy (the driver DMAs into the UMEM); falls back to copy mode when the driver
    /// cannot. See [`XskSocket::zero_copy`] for what took effect.
    pub zero_copy: bool,
}

impl Default for XskConfig {
    fn default() -> Self {
        XskConfig {
            queue: 0,
            rx_ring: 2048,
            tx_ring: 2048,
            fill_ring: 2048,
            completion_ring: 2048,
            busy_poll: false,
            busy_poll_usecs: 20,
            busy_poll_budget: 64,
            zero_copy: false,
        }
    }
}

/// Which busy-poll options the kernel accepted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BusyPollStatus {
    /// SO_PREFER_BUSY_POLL took effect.
    pub prefer: bool,
    /// SO_BUSY_POLL took effect with these µs.
    pub usecs: Option<u32>,
    /// SO_BUSY_POLL_BUDGET took effect with this budget.
    pub budget: Option<u32>,
}

/// The kernel's counters for the socket (`XDP_STATISTICS`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelXskStats {
    /// Frames dropped for other reasons (e.g. too long for a frame).
    pub rx_dropped: u64,
    /// Invalid descriptors on the fill ring.
    pub rx_invalid_descs: u64,
    /// Invalid descriptors on the TX ring.
    pub tx_invalid_descs: u64,
    /// Frames dropped because the RX ring was full (the application is too slow).
    pub rx_ring_full: u64,
    /// Times the kernel found the fill ring empty (frames dropped for want of a frame).
    pub rx_fill_ring_empty_descs: u64,
    /// Times the kernel found the TX ring empty when woken.
    pub tx_ring_empty_descs: u64,
}

/// The socket's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct XskStats {
    /// Frames taken from the RX ring.
    pub received: u64,
    /// Frames the kernel reported sent (reaped from the completion ring).
    pub sent: u64,
    /// `transmit_with` calls refused for want of a TX frame or TX ring slot.
    pub tx_full: u64,
    /// Receive calls that found the fill ring drained by the kernel (it had no frame left to
    /// receive into: frames are being dropped unless returned sooner).
    pub fill_empty: u64,
    /// TX wake-ups (sendto) that failed other than with "try again".
    pub kick_errors: u64,
    /// The kernel's counters, when `XDP_STATISTICS` answered.
    pub kernel: Option<KernelXskStats>,
}

/// The built-in frame pool of a socket opened with [`XskSocket::open`].
#[derive(Debug)]
struct Pool {
    /// TX frames not on the TX ring.
    tx_free: Vec<u64>,
    /// Number of TX frames in all.
    tx_frames: usize,
}

/// An AF_XDP socket bound to one queue of one interface, with its UMEM and rings.
#[derive(Debug)]
pub struct XskSocket {
    // Rings before the fd and the UMEM: dropped (unmapped) first.
    fill: ProducerRing<u64>,
    completion: ConsumerRing<u64>,
    rx: ConsumerRing<libc::xdp_desc>,
    tx: ProducerRing<libc::xdp_desc>,
    fd: OwnedFd,
    umem: Umem,
    ifname: String,
    ifindex: u32,
    queue: u32,
    zero_copy: bool,
    busy_poll: BusyPollStatus,
    pool: Option<Pool>,
    /// The received batch (frame address, length) of the high-level layer.
    batch: Vec<(u64, u32)>,
    /// Receive frames to return to the fill ring (when it was momentarily full).
    refill: Vec<u64>,
    stats: XskStats,
}

impl XskSocket {
    /// Opens a socket on `config.queue` of `ifname` over `umem` with a frame pool: the first
    /// half of the frames (at most `fill_ring` of them) receive and are posted to the fill ring
    /// now; the rest transmit.
    pub fn open(ifname: &str, umem: Umem, config: XskConfig) -> Result<XskSocket, XdpError> {
        if umem.is_unaligned() {
            return Err(XdpError::InvalidUmem(
                "a pooled socket needs an aligned UMEM (Umem::anonymous or Umem::over); \
                 use open_raw with Umem::over_unaligned"
                    .into(),
            ));
        }
        let frames = umem.frame_count();
        if frames < 2 {
            return Err(XdpError::InvalidUmem(
                "a pooled socket needs at least 2 frames".into(),
            ));
        }
        let rx_frames = (frames / 2).min(config.fill_ring);
        let mut socket = Self::open_raw(ifname, umem, config)?;
        let addrs: Vec<u64> = (0..frames)
            .filter_map(|i| socket.umem.frame_addr(i))
            .collect();
        let (rx, tx) = addrs.split_at(rx_frames as usize);
        let posted = socket.fill(rx);
        debug_assert_eq!(posted, rx.len());
        socket.pool = Some(Pool {
            tx_free: tx.to_vec(),
            tx_frames: tx.len(),
        });
        Ok(socket)
    }

    /// Opens a socket without a frame pool: nothing is posted to the fill ring; the caller owns
    /// every frame and uses the low-level calls.
    pub fn open_raw(ifname: &str, umem: Umem, config: XskConfig) -> Result<XskSocket, XdpError> {
        setup::open(ifname, umem, config)
    }

    /// The interface.
    pub fn ifname(&self) -> &str {
        &self.ifname
    }

    /// The interface index.
    pub fn ifindex(&self) -> u32 {
        self.ifindex
    }

    /// The bound queue.
    pub fn queue(&self) -> u32 {
        self.queue
    }

    /// Whether the socket runs in zero-copy mode (else copy mode).
    pub fn zero_copy(&self) -> bool {
        self.zero_copy
    }

    /// The busy-poll options that took effect.
    pub fn busy_poll(&self) -> BusyPollStatus {
        self.busy_poll
    }

    /// The socket's file descriptor: pollable for POLLIN (RX ready) and POLLOUT.
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// The UMEM.
    pub fn umem(&self) -> &Umem {
        &self.umem
    }

    /// The UMEM, for writing frames the application owns.
    pub fn umem_mut(&mut self) -> &mut Umem {
        &mut self.umem
    }

    // ---- low level ----

    /// Posts frame addresses to the fill ring (the kernel may receive into them) and returns
    /// how many fit. Addresses outside the UMEM are skipped (counted as posted, never given to
    /// the kernel); each posted frame now belongs to the kernel. In aligned mode an address
    /// posts the frame holding it; in unaligned mode ([`Umem::over_unaligned`]) the address
    /// itself, if a whole chunk from it fits the UMEM.
    pub fn fill(&mut self, addrs: &[u64]) -> usize {
        let mut taken = 0;
        for &addr in addrs {
            let Some(addr) = self.umem.fill_addr(addr) else {
                taken += 1;
                continue;
            };
            if !self.fill.push(addr) {
                break;
            }
            taken += 1;
        }
        self.fill.submit();
        taken
    }

    /// Takes up to `max` received descriptors (address of the packet's first byte, length) off
    /// the RX ring into `out` (appended) and returns how many. Each names a frame now owned by
    /// the application (read it with [`Umem::frame`]); descriptors the UMEM cannot hold are
    /// dropped. In unaligned mode the kernel's offset encoding is resolved: the address is the
    /// packet's first byte all the same.
    pub fn receive_descs(&mut self, out: &mut Vec<(u64, u32)>, max: usize) -> usize {
        let ready = self.rx.available(max.min(u32::MAX as usize) as u32);
        if ready == 0 {
            self.note_fill_state();
            return 0;
        }
        let mut taken = 0;
        for i in 0..ready {
            let desc = self.rx.read(i);
            let addr = self.umem.resolve(desc.addr);
            if self.umem.frame(addr, desc.len as usize).is_some() {
                out.push((addr, desc.len));
                taken += 1;
            }
        }
        self.rx.release(ready);
        self.stats.received += taken as u64;
        taken
    }

    /// Queues frames the application owns on the TX ring (address, length) and kicks the
    /// kernel; returns how many were queued (the rest did not fit). Each queued frame belongs
    /// to the kernel until it appears in [`completions`](Self::completions).
    pub fn transmit_descs(&mut self, descs: &[(u64, u32)]) -> usize {
        let mut queued = 0;
        for &(addr, len) in descs {
            if self.umem.frame(addr, len as usize).is_none() {
                queued += 1; // not a frame: skipped
                continue;
            }
            if !self.tx.push(libc::xdp_desc {
                addr,
                len,
                options: 0,
            }) {
                break;
            }
            queued += 1;
        }
        self.tx.submit();
        self.kick_tx();
        queued
    }

    /// Takes up to `max` sent frames off the completion ring into `out` (appended); they belong
    /// to the application again.
    pub fn completions(&mut self, out: &mut Vec<u64>, max: usize) -> usize {
        let ready = self.completion.available(max.min(u32::MAX as usize) as u32);
        for i in 0..ready {
            out.push(self.completion.read(i));
        }
        self.completion.release(ready);
        self.stats.sent += ready as u64;
        ready as usize
    }

    /// Wakes the kernel to transmit what is on the TX ring when it asked for that
    /// (`sendto(MSG_DONTWAIT)`). Returns false when the kernel said to try again later.
    pub fn kick_tx(&mut self) -> bool {
        matches!(self.kick(), Kick::NotNeeded | Kick::Sent)
    }

    fn kick(&mut self) -> Kick {
        if !self.tx.needs_wakeup() {
            return Kick::NotNeeded;
        }
        // SAFETY: a zero-length sendto with no buffer or address, as the AF_XDP ABI requires.
        let rc = unsafe {
            libc::sendto(
                self.raw_fd(),
                std::ptr::null(),
                0,
                libc::MSG_DONTWAIT,
                std::ptr::null(),
                0,
            )
        };
        if rc >= 0 {
            return Kick::Sent;
        }
        match io::Error::last_os_error().raw_os_error() {
            // Copy mode: the per-call budget ran out (more to send) or completions are full.
            Some(libc::EAGAIN) | Some(libc::EINTR) => Kick::Again,
            // The device queue is busy or out of buffers: come back later.
            Some(libc::EBUSY) | Some(libc::ENOBUFS) => Kick::Busy,
            _ => {
                self.stats.kick_errors += 1;
                Kick::Busy
            }
        }
    }

    /// Wakes the kernel to receive (`recvfrom(MSG_DONTWAIT)`) when it stopped for want of
    /// fill-ring frames and asked for a wake-up, or, with busy polling in effect
    /// (`SO_PREFER_BUSY_POLL`), always: the call is what runs the driver's receive processing
    /// then, so a busy-polling loop calls this once per iteration. A no-op otherwise.
    pub fn wake_rx(&mut self) {
        if self.busy_poll.prefer || self.fill.needs_wakeup() {
            // SAFETY: a zero-length recvfrom with no buffer or address, as the AF_XDP ABI allows.
            unsafe {
                libc::recvfrom(
                    self.raw_fd(),
                    std::ptr::null_mut(),
                    0,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                );
            }
        }
    }

    fn note_fill_state(&mut self) {
        if self.fill.outstanding() == 0 {
            self.stats.fill_empty += 1;
        }
    }

    // ---- high level ----

    /// Takes up to `max` received frames as the current batch (read them with
    /// [`received`](Self::received)) and returns how many. A batch not yet released is
    /// released first, so frames are never leaked.
    pub fn receive_batch(&mut self, max: usize) -> usize {
        self.release_batch();
        let mut batch = std::mem::take(&mut self.batch);
        let n = self.receive_descs(&mut batch, max);
        self.batch = batch;
        n
    }

    /// The Ethernet frame of the current batch's `index`-th entry.
    pub fn received(&self, index: usize) -> Option<&[u8]> {
        let &(addr, len) = self.batch.get(index)?;
        self.umem.frame(addr, len as usize)
    }

    /// The number of frames in the current batch.
    pub fn batch_len(&self) -> usize {
        self.batch.len()
    }

    /// Returns the current batch's frames to the fill ring (the kernel may receive into them
    /// again) and wakes the kernel if it asked for frames.
    pub fn release_batch(&mut self) {
        if self.batch.is_empty() && self.refill.is_empty() {
            return;
        }
        let mut pending = std::mem::take(&mut self.refill);
        pending.extend(self.batch.drain(..).map(|(addr, _)| addr));
        let posted = self.fill(&pending);
        pending.drain(..posted);
        self.refill = pending;
        self.wake_rx();
    }

    /// Takes a free TX frame, lets `f` write an Ethernet frame into it (the whole frame buffer
    /// is passed) and return its length, and queues it on the TX ring. Nothing is sent until
    /// [`flush`](Self::flush). A length of 0 queues nothing. [`XdpError::TxFull`] when no TX
    /// frame or ring slot is free (flush and retry, or drop).
    pub fn transmit_with(&mut self, f: impl FnOnce(&mut [u8]) -> usize) -> Result<(), XdpError> {
        let frame_size = self.umem.frame_size();
        if self.tx.free(1) == 0 {
            self.stats.tx_full += 1;
            return Err(XdpError::TxFull);
        }
        let Some(pool) = self.pool.as_mut() else {
            self.stats.tx_full += 1;
            return Err(XdpError::TxFull);
        };
        if pool.tx_free.is_empty() {
            self.reap_completions();
        }
        let Some(pool) = self.pool.as_mut() else {
            return Err(XdpError::TxFull);
        };
        let Some(addr) = pool.tx_free.pop() else {
            self.stats.tx_full += 1;
            return Err(XdpError::TxFull);
        };
        let Some(buf) = self.umem.frame_mut(addr, frame_size as usize) else {
            return Err(XdpError::TxFull); // unreachable: pool frames are inside the UMEM
        };
        let len = f(buf);
        if len == 0 || len > frame_size as usize {
            if let Some(pool) = self.pool.as_mut() {
                pool.tx_free.push(addr);
            }
            if len == 0 {
                return Ok(());
            }
            return Err(XdpError::FrameTooLong { len, frame_size });
        }
        let pushed = self.tx.push(libc::xdp_desc {
            addr,
            len: len as u32,
            options: 0,
        });
        debug_assert!(pushed, "a slot was checked free");
        Ok(())
    }

    /// Publishes the queued TX frames, wakes the kernel to send them when it asked for that,
    /// and returns sent frames from the completion ring to the free list. In copy mode the
    /// kernel sends at most 32 frames per wake-up, so this kicks until the TX ring is drained
    /// or the device is busy (bounded by the ring size).
    pub fn flush(&mut self) {
        self.tx.submit();
        let rounds = self.tx.size() / 32 + 2;
        for _ in 0..rounds {
            self.reap_completions();
            if self.tx.outstanding() == 0 {
                break;
            }
            match self.kick() {
                Kick::Sent | Kick::Again if !self.zero_copy => continue,
                _ => break,
            }
        }
        self.reap_completions();
    }

    /// Free TX frames in the pool (0 without a pool).
    pub fn tx_free(&self) -> usize {
        self.pool.as_ref().map_or(0, |pool| pool.tx_free.len())
    }

    /// TX frames the kernel holds (queued or being sent).
    pub fn tx_in_flight(&self) -> usize {
        self.pool
            .as_ref()
            .map_or(0, |pool| pool.tx_frames - pool.tx_free.len())
    }

    fn reap_completions(&mut self) {
        let Some(mut pool) = self.pool.take() else {
            return;
        };
        let ready = self.completion.available(u32::MAX);
        for i in 0..ready {
            let addr = self.umem.frame_base(self.completion.read(i));
            // Only frames of the pool are taken back (a bogus address is ignored).
            if pool.tx_free.len() < pool.tx_frames && addr < self.umem.len() as u64 {
                pool.tx_free.push(addr);
            }
        }
        self.completion.release(ready);
        self.stats.sent += ready as u64;
        self.pool = Some(pool);
    }

    /// The socket's counters, with the kernel's (`XDP_STATISTICS`).
    pub fn stats(&self) -> XskStats {
        let mut stats = self.stats;
        // SAFETY: plain old data.
        let mut kernel: libc::xdp_statistics = unsafe { std::mem::zeroed() };
        if let Ok(len) = getsockopt(
            self.raw_fd(),
            libc::SOL_XDP,
            libc::XDP_STATISTICS,
            &mut kernel,
        ) {
            let full = len >= std::mem::size_of::<libc::xdp_statistics>();
            stats.kernel = Some(KernelXskStats {
                rx_dropped: kernel.rx_dropped,
                rx_invalid_descs: kernel.rx_invalid_descs,
                tx_invalid_descs: kernel.tx_invalid_descs,
                rx_ring_full: if full { kernel.rx_ring_full } else { 0 },
                rx_fill_ring_empty_descs: if full {
                    kernel.rx_fill_ring_empty_descs
                } else {
                    0
                },
                tx_ring_empty_descs: if full { kernel.tx_ring_empty_descs } else { 0 },
            });
        }
        stats
    }
}

impl AsRawFd for XskSocket {
    fn as_raw_fd(&self) -> RawFd {
        self.raw_fd()
    }
}

/// What a TX wake-up did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kick {
    /// The kernel did not ask for one (it is sending on its own).
    NotNeeded,
    /// sendto returned success.
    Sent,
    /// Try again: more to send.
    Again,
    /// The device is busy or the call failed.
    Busy,
}

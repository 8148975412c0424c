//! The four single-producer single-consumer rings an AF_XDP socket shares with the kernel.
//!
//! Each ring is a memory mapping of the socket holding a producer index, a consumer index, a
//! flags word and an array of `size` descriptors (a power of two; indices run freely and wrap,
//! the slot is `index & (size - 1)`). The application produces on the fill ring (frames the
//! kernel may receive into) and the TX ring (frames to send); the kernel produces on the RX ring
//! (frames received) and the completion ring (frames sent, free again).
//!
//! Ordering, as in the kernel's `xsk_queue.h` and libxdp:
//!
//! - a producer writes descriptors, then publishes them with a **Release** store of the producer
//!   index, so the consumer that sees the new index also sees the descriptors;
//! - a consumer reads the producer index with an **Acquire** load before reading the descriptors
//!   it covers, and after it is done with them (copied out) returns the slots with a **Release**
//!   store of the consumer index, so the producer never overwrites a slot still being read;
//! - a producer reads the consumer index with an **Acquire** load before reusing slots.
//!
//! Each side caches the other's index and reloads it only when the cache says the ring is full
//! (producer) or empty (consumer), so most calls touch no shared cache line.

use std::io;
use std::marker::PhantomData;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU32, Ordering};

/// The ring flag the kernel sets when it needs a system call to make progress
/// (`XDP_RING_NEED_WAKEUP`).
const NEED_WAKEUP: u32 = libc::XDP_RING_NEED_WAKEUP;

/// One mapped ring: the pointers into the mapping and the length to unmap.
#[derive(Debug)]
struct Mapping {
    base: *mut u8,
    len: usize,
    producer: *const AtomicU32,
    consumer: *const AtomicU32,
    flags: *const AtomicU32,
    descs: *mut u8,
}

impl Mapping {
    /// Maps the ring of `size` descriptors of `T` at page offset `pgoff` of socket `fd`,
    /// using the offsets from `XDP_MMAP_OFFSETS`.
    fn new<T>(
        fd: RawFd,
        pgoff: u64,
        off: &libc::xdp_ring_offset,
        size: u32,
    ) -> io::Result<Mapping> {
        let len = (off.desc as usize)
            .checked_add(size as usize * std::mem::size_of::<T>())
            .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
        for field in [off.producer, off.consumer, off.flags] {
            if field as usize + 4 > len || field % 4 != 0 {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "bad ring offsets",
                ));
            }
        }
        // SAFETY: maps a region the kernel provides for this socket; nothing existing is touched.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd,
                pgoff as libc::off_t,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = base.cast::<u8>();
        // SAFETY: all offsets were checked to lie inside the mapping and be 4-byte aligned (the
        // mapping itself is page aligned); the kernel only accesses these words atomically.
        unsafe {
            Ok(Mapping {
                base,
                len,
                producer: base.add(off.producer as usize).cast(),
                consumer: base.add(off.consumer as usize).cast(),
                flags: base.add(off.flags as usize).cast(),
                descs: base.add(off.desc as usize),
            })
        }
    }

    fn producer(&self) -> &AtomicU32 {
        // SAFETY: points into the live mapping (see `new`).
        unsafe { &*self.producer }
    }

    fn consumer(&self) -> &AtomicU32 {
        // SAFETY: as above.
        unsafe { &*self.consumer }
    }

    fn needs_wakeup(&self) -> bool {
        // SAFETY: as above. A relaxed read, as libxdp's READ_ONCE: the flag is a hint that is
        // re-evaluated on every call.
        unsafe { (*self.flags).load(Ordering::Relaxed) & NEED_WAKEUP != 0 }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what `new` mapped; no reference into it outlives the ring.
        unsafe {
            libc::munmap(self.base.cast(), self.len);
        }
    }
}

/// The application's side of a ring it produces on (fill, TX).
#[derive(Debug)]
pub(crate) struct ProducerRing<T> {
    map: Mapping,
    mask: u32,
    size: u32,
    /// Our next index (published up to here by `submit`).
    cached_prod: u32,
    /// The kernel's consumer index plus `size`: we may produce up to here.
    cached_cons: u32,
    /// Written with `write` but not yet published.
    reserved: u32,
    _desc: PhantomData<T>,
}

// SAFETY: the ring is owned by one socket value; the mapping moves with it.
unsafe impl<T: Send> Send for ProducerRing<T> {}

impl<T: Copy> ProducerRing<T> {
    pub(crate) fn new(
        fd: RawFd,
        pgoff: u64,
        off: &libc::xdp_ring_offset,
        size: u32,
    ) -> io::Result<Self> {
        let map = Mapping::new::<T>(fd, pgoff, off, size)?;
        let cached_prod = map.producer().load(Ordering::Relaxed);
        let cached_cons = map.consumer().load(Ordering::Acquire).wrapping_add(size);
        Ok(ProducerRing {
            map,
            mask: size - 1,
            size,
            cached_prod,
            cached_cons,
            reserved: 0,
            _desc: PhantomData,
        })
    }

    /// Free slots (beyond those already reserved); reloads the consumer index when the cached
    /// value shows fewer than `wanted`.
    pub(crate) fn free(&mut self, wanted: u32) -> u32 {
        let next = self.cached_prod.wrapping_add(self.reserved);
        let free = self.cached_cons.wrapping_sub(next);
        if free >= wanted {
            return free;
        }
        self.cached_cons = self
            .map
            .consumer()
            .load(Ordering::Acquire)
            .wrapping_add(self.size);
        self.cached_cons.wrapping_sub(next)
    }

    /// Writes `desc` into the next free slot; false when the ring is full. Not visible to the
    /// kernel until `submit`.
    pub(crate) fn push(&mut self, desc: T) -> bool {
        if self.free(1) == 0 {
            return false;
        }
        let index = self.cached_prod.wrapping_add(self.reserved) & self.mask;
        // SAFETY: `index < size`, inside the descriptor array; the slot is ours (free).
        unsafe {
            self.map.descs.cast::<T>().add(index as usize).write(desc);
        }
        self.reserved += 1;
        true
    }

    /// Publishes every descriptor written so far (Release: the kernel sees the descriptors
    /// before the index).
    pub(crate) fn submit(&mut self) {
        if self.reserved == 0 {
            return;
        }
        self.cached_prod = self.cached_prod.wrapping_add(self.reserved);
        self.reserved = 0;
        self.map
            .producer()
            .store(self.cached_prod, Ordering::Release);
    }

    /// Slots the kernel has not consumed yet (published and not taken).
    pub(crate) fn outstanding(&mut self) -> u32 {
        self.free(self.size);
        self.size - self.cached_cons.wrapping_sub(self.cached_prod)
    }

    pub(crate) fn needs_wakeup(&self) -> bool {
        self.map.needs_wakeup()
    }

    pub(crate) fn size(&self) -> u32 {
        self.size
    }
}

/// The application's side of a ring it consumes from (RX, completion).
#[derive(Debug)]
pub(crate) struct ConsumerRing<T> {
    map: Mapping,
    mask: u32,
    /// The kernel's producer index as last loaded.
    cached_prod: u32,
    /// Our next index (returned to the kernel up to here by `release`).
    cached_cons: u32,
    _desc: PhantomData<T>,
}

// SAFETY: as for `ProducerRing`.
unsafe impl<T: Send> Send for ConsumerRing<T> {}

impl<T: Copy> ConsumerRing<T> {
    pub(crate) fn new(
        fd: RawFd,
        pgoff: u64,
        off: &libc::xdp_ring_offset,
        size: u32,
    ) -> io::Result<Self> {
        let map = Mapping::new::<T>(fd, pgoff, off, size)?;
        let cached_cons = map.consumer().load(Ordering::Relaxed);
        let cached_prod = map.producer().load(Ordering::Acquire);
        Ok(ConsumerRing {
            map,
            mask: size - 1,
            cached_prod,
            cached_cons,
            _desc: PhantomData,
        })
    }

    /// Descriptors ready, at most `max`; reloads the producer index (Acquire) when the cache is
    /// empty.
    pub(crate) fn available(&mut self, max: u32) -> u32 {
        let mut entries = self.cached_prod.wrapping_sub(self.cached_cons);
        if entries == 0 {
            self.cached_prod = self.map.producer().load(Ordering::Acquire);
            entries = self.cached_prod.wrapping_sub(self.cached_cons);
        }
        // A kernel that claims more than a ring holds is not believed.
        entries.min(self.mask + 1).min(max)
    }

    /// The `i`-th ready descriptor (`i < available()`), copied out of the ring.
    pub(crate) fn read(&self, i: u32) -> T {
        let index = self.cached_cons.wrapping_add(i) & self.mask;
        // SAFETY: `index < size`, inside the descriptor array; the kernel published the slot
        // (Acquire in `available`) and will not reuse it before `release`.
        unsafe { self.map.descs.cast::<T>().add(index as usize).read() }
    }

    /// Returns `n` read slots to the kernel (Release: our reads of them are done).
    pub(crate) fn release(&mut self, n: u32) {
        if n == 0 {
            return;
        }
        self.cached_cons = self.cached_cons.wrapping_add(n);
        self.map
            .consumer()
            .store(self.cached_cons, Ordering::Release);
    }
}

//! UMEM: the memory AF_XDP frames live in, split into equal frames ("chunks").
//!
//! The kernel writes received frames into UMEM frames the application handed it on the fill
//! ring, and reads frames to transmit from UMEM frames the application put on the TX ring. A
//! frame address (`u64`) is a byte offset from the start of the UMEM. In the kernel's aligned
//! mode (the one used here) a frame's size is a power of two, and any address inside a frame
//! names that frame: received descriptors point at the packet's first byte, which may follow
//! some headroom, so `addr & !(frame_size - 1)` gives the frame back.

use std::ptr::NonNull;

use crate::sys::page_size;
use crate::XdpError;

/// The memory of an AF_XDP socket: `frame_count` frames of `frame_size` bytes, page aligned.
///
/// Ownership of each frame moves between the application and the kernel through the rings;
/// [`Umem::frame`] and [`Umem::frame_mut`] only check bounds, and reading a frame the kernel
/// owns (posted to the fill or TX ring and not yet returned) sees whatever the kernel is writing.
/// The socket types keep that discipline for their own frames.
#[derive(Debug)]
pub struct Umem {
    ptr: NonNull<u8>,
    len: usize,
    frame_size: u32,
    frame_count: u32,
    /// Unmapped on drop (anonymous UMEM); a caller's region is left alone.
    owned: bool,
    /// Registered in the kernel's unaligned chunk mode ([`Umem::over_unaligned`]).
    unaligned: bool,
}

// SAFETY: the UMEM is plain memory; the raw pointer is owned by this value (or borrowed from the
// caller under `over`'s contract) and moves with it.
unsafe impl Send for Umem {}
// SAFETY: shared access only reads through `&[u8]`.
unsafe impl Sync for Umem {}

/// The largest UMEM this crate registers (the kernel pins it all): 16 GiB.
const MAX_UMEM_BYTES: usize = 16 << 30;

fn check_frame_size(frame_size: u32) -> Result<(), XdpError> {
    if frame_size != 2048 && frame_size != 4096 {
        return Err(XdpError::InvalidUmem(format!(
            "frame size {frame_size}: must be 2048 or 4096"
        )));
    }
    if frame_size as usize > page_size() {
        return Err(XdpError::InvalidUmem(format!(
            "frame size {frame_size} exceeds the page size {}",
            page_size()
        )));
    }
    Ok(())
}

impl Umem {
    /// Maps `frame_count` frames of `frame_size` (2048 or 4096) bytes of anonymous, zeroed,
    /// page-aligned memory.
    pub fn anonymous(frame_count: u32, frame_size: u32) -> Result<Umem, XdpError> {
        check_frame_size(frame_size)?;
        if frame_count == 0 {
            return Err(XdpError::InvalidUmem("no frames".into()));
        }
        let len = (frame_count as usize)
            .checked_mul(frame_size as usize)
            .filter(|&len| len <= MAX_UMEM_BYTES)
            .ok_or_else(|| {
                XdpError::InvalidUmem(format!(
                    "{frame_count} frames of {frame_size} bytes is too large"
                ))
            })?;
        // SAFETY: a fresh anonymous private mapping; no existing memory is touched.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(XdpError::InvalidUmem(format!(
                "mmap of {len} bytes failed: {}",
                std::io::Error::last_os_error()
            )));
        }
        Ok(Umem {
            ptr: NonNull::new(ptr.cast())
                .ok_or_else(|| XdpError::InvalidUmem("mmap returned null".into()))?,
            len,
            frame_size,
            frame_count,
            owned: true,
            unaligned: false,
        })
    }

    /// A UMEM over the caller's memory, e.g. a mapped file of persistent memory, so received
    /// frames land in their final place. `len` is rounded down to whole frames.
    ///
    /// # Safety
    ///
    /// `ptr..ptr + len` must be valid for reads and writes, mapped shared or private by the
    /// caller, and stay mapped (and not be accessed in ways that conflict with frame ownership)
    /// for as long as the `Umem` and any socket using it live. The kernel pins the pages when a
    /// socket registers them (a file on a filesystem that cannot be pinned long-term, such as
    /// fsdax, is refused then).
    pub unsafe fn over(ptr: *mut u8, len: usize, frame_size: u32) -> Result<Umem, XdpError> {
        check_frame_size(frame_size)?;
        let ptr = NonNull::new(ptr).ok_or_else(|| XdpError::InvalidUmem("null pointer".into()))?;
        if ptr.as_ptr() as usize % page_size() != 0 {
            return Err(XdpError::InvalidUmem(format!(
                "address {:p} is not page aligned",
                ptr.as_ptr()
            )));
        }
        let frames = (len / frame_size as usize).min(u32::MAX as usize);
        if frames == 0 {
            return Err(XdpError::InvalidUmem(format!(
                "{len} bytes hold no frame of {frame_size}"
            )));
        }
        let len = frames * frame_size as usize;
        if len > MAX_UMEM_BYTES {
            return Err(XdpError::InvalidUmem(format!("{len} bytes is too large")));
        }
        Ok(Umem {
            ptr,
            len,
            frame_size,
            frame_count: frames as u32,
            owned: false,
            unaligned: false,
        })
    }

    /// A UMEM over the caller's memory in the kernel's **unaligned chunk mode**
    /// (`XDP_UMEM_UNALIGNED_CHUNK_FLAG`): a buffer posted to the fill ring may start at any
    /// address `a` with `a + chunk_size <= len`, not only at multiples of the chunk size, and
    /// the kernel writes a received frame at `a + 256` (`XDP_PACKET_HEADROOM`; in copy mode it
    /// writes nothing else of the chunk). The packet store uses it to place each frame so that
    /// the datagram lands at its slot's datagram area whatever the slot layout.
    /// `chunk_size` is 2048 up to the page size (not necessarily a power of two); `len` is kept
    /// as given (not rounded to chunks). Received descriptors carry the kernel's offset
    /// encoding, which [`XskSocket::receive_descs`](crate::XskSocket::receive_descs) resolves:
    /// the address it returns is the frame's first byte.
    ///
    /// # Safety
    ///
    /// As [`Umem::over`].
    pub unsafe fn over_unaligned(
        ptr: *mut u8,
        len: usize,
        chunk_size: u32,
    ) -> Result<Umem, XdpError> {
        if chunk_size < 2048 || chunk_size as usize > page_size() {
            return Err(XdpError::InvalidUmem(format!(
                "chunk size {chunk_size}: must be 2048 up to the page size {}",
                page_size()
            )));
        }
        let ptr = NonNull::new(ptr).ok_or_else(|| XdpError::InvalidUmem("null pointer".into()))?;
        if ptr.as_ptr() as usize % page_size() != 0 {
            return Err(XdpError::InvalidUmem(format!(
                "address {:p} is not page aligned",
                ptr.as_ptr()
            )));
        }
        let frames = len / chunk_size as usize;
        if frames == 0 || len > MAX_UMEM_BYTES {
            return Err(XdpError::InvalidUmem(format!(
                "{len} bytes: must hold a chunk of {chunk_size} and be at most {MAX_UMEM_BYTES}"
            )));
        }
        Ok(Umem {
            ptr,
            len,
            frame_size: chunk_size,
            frame_count: frames.min(u32::MAX as usize) as u32,
            owned: false,
            unaligned: true,
        })
    }

    /// Whether the UMEM is registered in unaligned chunk mode ([`Umem::over_unaligned`]).
    pub fn is_unaligned(&self) -> bool {
        self.unaligned
    }

    /// The address to post on the fill ring for `addr`, if the kernel would accept it: the
    /// start of its frame (aligned mode), or `addr` itself when a whole chunk from it fits the
    /// UMEM (unaligned mode).
    pub(crate) fn fill_addr(&self, addr: u64) -> Option<u64> {
        if self.unaligned {
            let end = addr.checked_add(u64::from(self.frame_size))?;
            (end <= self.len as u64).then_some(addr)
        } else {
            (addr < self.len as u64).then(|| self.frame_base(addr))
        }
    }

    /// The address of a received descriptor's first byte: in unaligned mode the kernel puts
    /// the offset from the posted address in the upper 16 bits (`XSK_UNALIGNED_BUF_OFFSET_SHIFT`).
    pub(crate) fn resolve(&self, addr: u64) -> u64 {
        if self.unaligned {
            let shift = libc::XSK_UNALIGNED_BUF_OFFSET_SHIFT as u32;
            (addr & libc::XSK_UNALIGNED_BUF_ADDR_MASK).wrapping_add(addr >> shift)
        } else {
            addr
        }
    }

    /// The frame size in bytes.
    pub fn frame_size(&self) -> u32 {
        self.frame_size
    }

    /// The number of frames.
    pub fn frame_count(&self) -> u32 {
        self.frame_count
    }

    /// The length in bytes (whole frames).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: a UMEM has at least one frame.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The start of the memory (what the kernel is given).
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// The address of frame `index` (its first byte), if it exists.
    pub fn frame_addr(&self, index: u32) -> Option<u64> {
        (index < self.frame_count).then(|| index as u64 * self.frame_size as u64)
    }

    /// The start of the frame that holds address `addr` (drops the headroom offset a received
    /// descriptor carries); `addr` itself in unaligned mode, where buffers start anywhere.
    pub fn frame_base(&self, addr: u64) -> u64 {
        if self.unaligned {
            return addr;
        }
        addr & !(self.frame_size as u64 - 1)
    }

    /// Checks that `addr..addr + len` lies inside one frame (inside the UMEM in unaligned
    /// mode).
    fn check(&self, addr: u64, len: usize) -> Option<usize> {
        let start = usize::try_from(addr).ok()?;
        let end = start.checked_add(len)?;
        if end > self.len {
            return None;
        }
        if self.unaligned {
            return Some(start);
        }
        let offset_in_frame = start % self.frame_size as usize;
        if offset_in_frame + len > self.frame_size as usize {
            return None;
        }
        Some(start)
    }

    /// The `len` bytes at `addr`, if they lie inside one frame.
    pub fn frame(&self, addr: u64, len: usize) -> Option<&[u8]> {
        let start = self.check(addr, len)?;
        // SAFETY: `start..start + len` is inside the mapping (checked above).
        Some(unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(start), len) })
    }

    /// The `len` bytes at `addr` for writing, if they lie inside one frame.
    pub fn frame_mut(&mut self, addr: u64, len: usize) -> Option<&mut [u8]> {
        let start = self.check(addr, len)?;
        // SAFETY: inside the mapping, and `&mut self` makes the borrow unique on our side.
        Some(unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(start), len) })
    }
}

impl Drop for Umem {
    fn drop(&mut self) {
        if self.owned {
            // SAFETY: the mapping was created by `anonymous` with this length; no borrow of it
            // outlives `self`.
            unsafe {
                libc::munmap(self.ptr.as_ptr().cast(), self.len);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anonymous_frames_are_bounds_checked() {
        let mut umem = Umem::anonymous(4, 2048).unwrap();
        assert_eq!(umem.len(), 8192);
        assert_eq!(umem.frame_addr(3), Some(6144));
        assert_eq!(umem.frame_addr(4), None);
        assert_eq!(umem.frame_base(6144 + 256), 6144);
        umem.frame_mut(2048, 10)
            .unwrap()
            .copy_from_slice(b"0123456789");
        assert_eq!(umem.frame(2048, 10).unwrap(), b"0123456789");
        assert!(umem.frame(2048 + 2040, 10).is_none(), "spans two frames");
        assert!(umem.frame(8192, 1).is_none());
        assert!(umem.frame(u64::MAX, 1).is_none());
        assert!(umem.frame(0, 2048).is_some());
        assert!(umem.frame(0, 2049).is_none());
    }

    #[test]
    fn invalid_shapes_are_refused() {
        assert!(Umem::anonymous(4, 1000).is_err());
        assert!(Umem::anonymous(0, 2048).is_err());
        assert!(Umem::anonymous(u32::MAX, 4096).is_err());
        let mut buf = vec![0u8; 3 * 4096];
        let misaligned = buf.as_mut_ptr().wrapping_add(1);
        // SAFETY: refused before use.
        assert!(unsafe { Umem::over(misaligned, 4096, 2048) }.is_err());
    }

    #[test]
    fn unaligned_umem_posts_any_address_a_chunk_fits_and_resolves_offsets() {
        let mut owner = Umem::anonymous(3, 4096).unwrap();
        let ptr = owner.frame_mut(0, 1).unwrap().as_mut_ptr();
        // SAFETY: `owner` outlives `umem` and is not touched meanwhile.
        let umem = unsafe { Umem::over_unaligned(ptr, 3 * 4096, 2048) }.unwrap();
        assert!(umem.is_unaligned());
        assert_eq!(umem.len(), 3 * 4096);
        assert_eq!(umem.fill_addr(22), Some(22));
        assert_eq!(umem.fill_addr(3 * 4096 - 2048), Some(3 * 4096 - 2048));
        assert_eq!(
            umem.fill_addr(3 * 4096 - 2047),
            None,
            "a chunk past the end"
        );
        assert_eq!(umem.fill_addr(u64::MAX), None);
        assert_eq!(umem.resolve((256 << 48) | 4000), 4256);
        assert_eq!(umem.frame_base(4256), 4256);
        assert!(
            umem.frame(4000, 3000).is_some(),
            "any range inside the UMEM"
        );
        assert!(umem.frame(3 * 4096 - 10, 11).is_none());
        // SAFETY: refused before use.
        assert!(unsafe { Umem::over_unaligned(ptr, 4096, 1024) }.is_err());
        assert!(unsafe { Umem::over_unaligned(ptr, 1000, 2048) }.is_err());
        let aligned = Umem::anonymous(2, 2048).unwrap();
        assert_eq!(aligned.fill_addr(2048 + 300), Some(2048));
        assert_eq!(aligned.fill_addr(4096), None);
        assert_eq!(aligned.resolve((256 << 48) | 5), (256 << 48) | 5);
    }

    #[test]
    fn over_caller_memory_rounds_to_frames() {
        let mut owner = Umem::anonymous(2, 4096).unwrap();
        let ptr = owner.frame_mut(0, 1).unwrap().as_mut_ptr();
        // SAFETY: `owner` outlives `umem` and is not touched meanwhile.
        let umem = unsafe { Umem::over(ptr, 8192 - 100, 2048) }.unwrap();
        assert_eq!(umem.frame_count(), 3);
        assert_eq!(umem.len(), 6144);
        drop(umem);
        assert!(owner.frame(0, 1).is_some());
    }
}

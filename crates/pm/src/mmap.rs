//! A [`PmRegion`] over a memory-mapped file (Linux).
//!
//! The mapping is tried first with `MAP_SHARED_VALIDATE | MAP_SYNC`, which only a DAX file system
//! on real persistent memory accepts: there, cache-line write-back plus `sfence` is all a store
//! needs to be durable. Anywhere else the file is mapped plain `MAP_SHARED` and the medium is
//! reported for what it is:
//!
//! | flush method                   | file system      | medium        |
//! |--------------------------------|------------------|---------------|
//! | clwb / clflushopt / clflush    | DAX (`MAP_SYNC`) | `DaxPm`       |
//! | any                            | tmpfs, ramfs     | `EmulatedPm`  |
//! | clwb / clflushopt / clflush    | any other        | `PageCache`   |
//! | msync / fdatasync              | any other        | `Disk`        |
//!
//! `auto` takes the best cache-line instruction on DAX and on tmpfs (where nothing is more
//! durable than DRAM: emulated PM, as the PMNet prototype ran on DRAM), and `fdatasync` on
//! any other file system: a file on a disk is there to survive a power loss, which the page
//! cache the instructions reach does not. Asked for by name, an instruction on a disk's file
//! is reported for what it is (`PageCache`).
//!
//! The file is locked (`flock`, exclusive) while mapped, so two processes cannot log into the same
//! file; nothing else may change the file while it is mapped.
//!
//! A failed `msync` or `fdatasync` panics: the region cannot return an error from `fence`, and
//! carrying on after the kernel reported lost write-back would acknowledge writes that are not
//! durable.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::str::FromStr;
use std::time::{Duration, Instant};

use crate::region::{FlushMethod, Medium, MediumInfo, PmRegion, CACHE_LINE_SIZE};

/// The largest latency a region may add per fence: beyond this it is a configuration mistake,
/// not an emulated medium.
pub const ADDED_LATENCY_NS_MAX: u64 = 1_000_000_000;

/// `statfs.f_type` of the file systems that keep files in DRAM only.
const TMPFS_MAGIC: u64 = 0x0102_1994;
const RAMFS_MAGIC: u64 = 0x8584_58f6;

/// Which flush method an [`MmapRegion`] should use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum FlushChoice {
    /// On DAX or tmpfs the best the CPU has (clwb, else clflushopt, else clflush; msync off
    /// x86_64); on any other file system fdatasync.
    #[default]
    Auto,
    Clwb,
    Clflushopt,
    Clflush,
    Msync,
    Fdatasync,
}

impl FlushChoice {
    /// Every choice, in the order a help text lists them.
    pub const ALL: [FlushChoice; 6] = [
        FlushChoice::Auto,
        FlushChoice::Clwb,
        FlushChoice::Clflushopt,
        FlushChoice::Clflush,
        FlushChoice::Msync,
        FlushChoice::Fdatasync,
    ];

    /// The name accepted by [`FromStr`] and printed in messages.
    pub fn name(self) -> &'static str {
        match self {
            FlushChoice::Auto => "auto",
            FlushChoice::Clwb => "clwb",
            FlushChoice::Clflushopt => "clflushopt",
            FlushChoice::Clflush => "clflush",
            FlushChoice::Msync => "msync",
            FlushChoice::Fdatasync => "fdatasync",
        }
    }
}

impl fmt::Display for FlushChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for FlushChoice {
    type Err = PmError;

    fn from_str(text: &str) -> Result<Self, PmError> {
        FlushChoice::ALL
            .into_iter()
            .find(|choice| choice.name() == text)
            .ok_or_else(|| PmError::UnknownFlushChoice {
                text: text.to_owned(),
            })
    }
}

/// How to open an [`MmapRegion`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct MmapOptions {
    pub flush: FlushChoice,
    /// Busy-wait this long after every fence, to emulate a slower medium (0: off). At most
    /// [`ADDED_LATENCY_NS_MAX`].
    pub added_latency_ns: u64,
}

/// Why a mapped region could not be created or opened. Every message names the file and what to
/// change.
#[derive(Debug, thiserror::Error)]
pub enum PmError {
    #[error(
        "permission denied to {action} {}: run as a user who may read and write it, or choose a \
         path you own (for example under /dev/shm)",
        .path.display()
    )]
    PermissionDenied { path: PathBuf, action: &'static str },

    #[error(
        "cannot {action} {}: no such file or directory; create the file first, or fix the path \
         (its directory must exist)",
        .path.display()
    )]
    NotFound { path: PathBuf, action: &'static str },

    #[error("cannot {action} {}: {source}", .path.display())]
    Io {
        path: PathBuf,
        action: &'static str,
        #[source]
        source: io::Error,
    },

    #[error(
        "file too small: {} is {len} bytes, a region needs at least {min_len}; create it with the \
         intended size",
        .path.display()
    )]
    TooSmall {
        path: PathBuf,
        len: u64,
        min_len: u64,
    },

    #[error(
        "file too large: {} is {len} bytes, this platform maps at most {max_len}; use a smaller \
         file",
        .path.display()
    )]
    TooLarge {
        path: PathBuf,
        len: u64,
        max_len: u64,
    },

    #[error(
        "cannot size {} to {len} bytes: {source}; free space on its file system (a tmpfs such \
         as /dev/shm is limited by its size= mount option) or ask for less",
        .path.display()
    )]
    Resize {
        path: PathBuf,
        len: u64,
        #[source]
        source: io::Error,
    },

    #[error(
        "cannot map {} ({len} bytes): {source}; check that its file system supports shared \
         writable mappings and that the address-space limit (ulimit -v) allows it",
        .path.display()
    )]
    Map {
        path: PathBuf,
        len: usize,
        #[source]
        source: io::Error,
    },

    #[error(
        "{} is in use: another process holds its lock; stop that process or use another file",
        .path.display()
    )]
    Locked { path: PathBuf },

    #[error(
        "{} appeared while a new file was being made under that name (another process made \
         it?); the new file was discarded and the other left alone: start again",
        .path.display()
    )]
    AppearedMeanwhile { path: PathBuf },

    #[error("flush method {requested} is not available: {reason}; use {instead} instead, or auto")]
    FlushUnsupported {
        requested: FlushChoice,
        reason: &'static str,
        instead: FlushChoice,
    },

    #[error(
        "added latency {added_latency_ns} ns is above the maximum {ADDED_LATENCY_NS_MAX} ns; \
         ask for less"
    )]
    LatencyTooLarge { added_latency_ns: u64 },

    #[error(
        "unknown flush choice {text:?}: expected one of auto, clwb, clflushopt, clflush, msync, \
         fdatasync"
    )]
    UnknownFlushChoice { text: String },
}

impl PmError {
    pub(crate) fn from_io(path: &Path, action: &'static str, source: io::Error) -> PmError {
        let path = path.to_path_buf();
        match source.kind() {
            io::ErrorKind::PermissionDenied => PmError::PermissionDenied { path, action },
            io::ErrorKind::NotFound => PmError::NotFound { path, action },
            _ => PmError::Io {
                path,
                action,
                source,
            },
        }
    }
}

/// The cache-line write-back instructions this CPU has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct CpuFlushSupport {
    clwb: bool,
    clflushopt: bool,
    clflush: bool,
}

impl CpuFlushSupport {
    #[cfg(target_arch = "x86_64")]
    fn detect() -> CpuFlushSupport {
        // `is_x86_feature_detected!` knows neither clwb nor clflushopt: ask CPUID directly.
        // The intrinsics are `unsafe` on older toolchains and safe on newer ones.
        use core::arch::x86_64::{__cpuid, __cpuid_count, __get_cpuid_max};
        #[allow(unused_unsafe)]
        let (leaf_max, _) = unsafe { __get_cpuid_max(0) };
        #[allow(unused_unsafe)]
        let leaf1 = unsafe { __cpuid(1) };
        let leaf7_ebx = if leaf_max >= 7 {
            #[allow(unused_unsafe)]
            let leaf7 = unsafe { __cpuid_count(7, 0) };
            leaf7.ebx
        } else {
            0
        };
        CpuFlushSupport {
            clwb: (leaf7_ebx >> 24) & 1 == 1,
            clflushopt: (leaf7_ebx >> 23) & 1 == 1,
            clflush: (leaf1.edx >> 19) & 1 == 1,
        }
    }

    #[cfg(not(target_arch = "x86_64"))]
    fn detect() -> CpuFlushSupport {
        CpuFlushSupport {
            clwb: false,
            clflushopt: false,
            clflush: false,
        }
    }

    /// The method `choice` means on this CPU, or why it cannot be had.
    fn resolve(self, choice: FlushChoice) -> Result<FlushMethod, PmError> {
        let x86_64 = cfg!(target_arch = "x86_64");
        let best_instruction = if self.clwb {
            Some(FlushMethod::Clwb)
        } else if self.clflushopt {
            Some(FlushMethod::Clflushopt)
        } else if self.clflush {
            Some(FlushMethod::Clflush)
        } else {
            None
        };
        let instead = match best_instruction {
            Some(FlushMethod::Clwb) => FlushChoice::Clwb,
            Some(FlushMethod::Clflushopt) => FlushChoice::Clflushopt,
            Some(_) => FlushChoice::Clflush,
            None => FlushChoice::Msync,
        };
        let unsupported = |reason: &'static str| {
            Err(PmError::FlushUnsupported {
                requested: choice,
                reason,
                instead,
            })
        };
        match choice {
            FlushChoice::Auto => Ok(best_instruction.unwrap_or(FlushMethod::Msync)),
            FlushChoice::Msync => Ok(FlushMethod::Msync),
            FlushChoice::Fdatasync => Ok(FlushMethod::Fdatasync),
            FlushChoice::Clwb | FlushChoice::Clflushopt | FlushChoice::Clflush if !x86_64 => {
                unsupported("cache-line flush instructions are implemented for x86_64 only")
            }
            FlushChoice::Clwb if !self.clwb => unsupported("this CPU lacks clwb"),
            FlushChoice::Clflushopt if !self.clflushopt => unsupported("this CPU lacks clflushopt"),
            FlushChoice::Clflush if !self.clflush => unsupported("this CPU lacks clflush"),
            FlushChoice::Clwb => Ok(FlushMethod::Clwb),
            FlushChoice::Clflushopt => Ok(FlushMethod::Clflushopt),
            FlushChoice::Clflush => Ok(FlushMethod::Clflush),
        }
    }
}

/// A file mapped into memory, flushed with the method chosen at open. See the module doc.
pub struct MmapRegion {
    path: PathBuf,
    /// Kept open for `fdatasync` and to hold the `flock` for as long as the mapping lives.
    file: File,
    base: NonNull<u8>,
    len: usize,
    info: MediumInfo,
    page_size: usize,
    /// A range was flushed under `Fdatasync` since the last fence: the fence must sync.
    fdatasync_pending: bool,
}

// SAFETY: the mapping is owned by this value alone, like the buffer of a `Vec<u8>`: shared
// access only reads it and every store goes through `&mut self`.
unsafe impl Send for MmapRegion {}
// SAFETY: as above; `&self` methods only read the mapping.
unsafe impl Sync for MmapRegion {}

impl fmt::Debug for MmapRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MmapRegion")
            .field("path", &self.path)
            .field("len", &self.len)
            .field("medium", &self.info)
            .finish()
    }
}

impl MmapRegion {
    /// Create `path` (or truncate it) as a zero-filled file of `len` bytes, preallocated so
    /// stores through the mapping never meet a full file system, and map it.
    pub fn create(path: &Path, len: usize, options: MmapOptions) -> Result<Self, PmError> {
        let (flush, auto) = check_options(options)?;
        check_new_len(path, len)?;
        // Not `truncate(true)`: the file may be another process's live log; lock it first.
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|e| PmError::from_io(path, "create", e))?;
        lock_exclusive(path, &file)?;
        MmapRegion::size_and_map(path, file, len, (flush, auto), options.added_latency_ns)
    }

    /// Make a new zero-filled file of `len` bytes for `path`, which must not exist, and map
    /// it. The file is made under a staging name beside `path` and gets its real name only
    /// from [`NewFile::publish`], once the caller has laid out its contents: a crash before
    /// that leaves no file at `path` (the staging file is reused by the next attempt), never a
    /// half-made one. The region reports `path` as its path.
    pub fn create_new(
        path: &Path,
        len: usize,
        options: MmapOptions,
    ) -> Result<(Self, NewFile), PmError> {
        let (flush, auto) = check_options(options)?;
        check_new_len(path, len)?;
        let staging = staging_path(path);
        // A staging file nobody holds was left by a crash: remove it. One that is locked is
        // another process making the same file.
        match OpenOptions::new().read(true).write(true).open(&staging) {
            Ok(stale) => {
                lock_exclusive(path, &stale)?;
                std::fs::remove_file(&staging)
                    .map_err(|e| PmError::from_io(&staging, "remove", e))?;
            }
            Err(error) if error.kind() == io::ErrorKind::NotFound => {}
            Err(error) => return Err(PmError::from_io(&staging, "open", error)),
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&staging)
            .map_err(|error| match error.kind() {
                io::ErrorKind::AlreadyExists => PmError::Locked {
                    path: path.to_path_buf(),
                },
                _ => PmError::from_io(path, "create", error),
            })?;
        // From here on, dropping `new_file` unpublished removes the staging file.
        let new_file = NewFile {
            staging,
            path: path.to_path_buf(),
            published: false,
        };
        lock_exclusive(path, &file)?;
        let region =
            MmapRegion::size_and_map(path, file, len, (flush, auto), options.added_latency_ns)?;
        Ok((region, new_file))
    }

    /// Size the empty, locked `file` to `len` zero bytes (preallocated), make that durable and
    /// map it.
    fn size_and_map(
        path: &Path,
        file: File,
        len: usize,
        flush: (FlushMethod, bool),
        added_latency_ns: u64,
    ) -> Result<Self, PmError> {
        let len_u64 = len as u64;
        file.set_len(0)
            .map_err(|source| PmError::from_io(path, "truncate", source))?;
        preallocate(&file, len_u64).map_err(|source| PmError::Resize {
            path: path.to_path_buf(),
            len: len_u64,
            source,
        })?;
        debug_assert_eq!(file.metadata().map(|m| m.len()).ok(), Some(len_u64));
        // Make the file's size and existence durable now, so a Disk region starts durable.
        file.sync_all()
            .map_err(|source| PmError::from_io(path, "sync", source))?;
        sync_parent_directory(path);

        MmapRegion::map(path, file, len, flush, added_latency_ns)
    }

    /// Make the existing file at `path` `len` bytes long (its new bytes zero, preallocated, the
    /// length durable before this returns) and map all of it. A file already that long is
    /// mapped as it is; a longer one is never cut. What the new bytes are for is the caller's
    /// to make durable (a store's growth word).
    pub fn extend(path: &Path, len: usize, options: MmapOptions) -> Result<Self, PmError> {
        let flush = check_options(options)?;
        let (file, current) = open_locked(path)?;
        let len_u64 = len as u64;
        let len_u64 = len_u64.max(current);
        check_len_mappable(path, len_u64)?;
        if len_u64 > current {
            preallocate(&file, len_u64).map_err(|source| PmError::Resize {
                path: path.to_path_buf(),
                len: len_u64,
                source,
            })?;
            file.sync_all()
                .map_err(|source| PmError::from_io(path, "sync", source))?;
        }
        let len = usize::try_from(len_u64).expect("checked by check_len_mappable");
        MmapRegion::map(path, file, len, flush, options.added_latency_ns)
    }

    /// Map the existing file at `path`, all of its length.
    pub fn open(path: &Path, options: MmapOptions) -> Result<Self, PmError> {
        let flush = check_options(options)?;
        let (file, len_u64) = open_locked(path)?;
        if len_u64 == 0 {
            return Err(PmError::TooSmall {
                path: path.to_path_buf(),
                len: 0,
                min_len: 1,
            });
        }
        check_len_mappable(path, len_u64)?;
        let len = usize::try_from(len_u64).expect("checked by check_len_mappable");
        MmapRegion::map(path, file, len, flush, options.added_latency_ns)
    }

    /// The file this region maps.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Map `file`: `flush` is the method asked for and whether it was `auto`, which on a
    /// file system neither DAX nor in DRAM becomes `fdatasync` (see the module doc).
    fn map(
        path: &Path,
        file: File,
        len: usize,
        (mut flush, auto): (FlushMethod, bool),
        added_latency_ns: u64,
    ) -> Result<Self, PmError> {
        assert!(len > 0);
        let cache_line_flush = matches!(
            flush,
            FlushMethod::Clwb | FlushMethod::Clflushopt | FlushMethod::Clflush
        );
        let dram = on_dram_file_system(&file);
        let fd = file.as_raw_fd();
        let map_error = |source| PmError::Map {
            path: path.to_path_buf(),
            len,
            source,
        };

        // MAP_SYNC guarantees the file's metadata is durable whenever a store could be, so that
        // cache-line flushes alone suffice: only worth asking for when flushing that way.
        let mut dax = false;
        let mut base = libc::MAP_FAILED;
        if cache_line_flush {
            // SAFETY: a fresh mapping of an open file descriptor; checked below.
            base = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED_VALIDATE | libc::MAP_SYNC,
                    fd,
                    0,
                )
            };
            if base == libc::MAP_FAILED {
                let error = io::Error::last_os_error();
                match error.raw_os_error() {
                    // Not DAX (or a kernel without MAP_SYNC): fall back to a plain mapping.
                    Some(libc::EOPNOTSUPP) | Some(libc::EINVAL) => {}
                    _ => return Err(map_error(error)),
                }
            } else {
                dax = true;
            }
        }
        if base == libc::MAP_FAILED && cache_line_flush && auto && !dram {
            // A disk's file: what survives a power loss there is what fdatasync wrote.
            flush = FlushMethod::Fdatasync;
        }
        let cache_line_flush = matches!(
            flush,
            FlushMethod::Clwb | FlushMethod::Clflushopt | FlushMethod::Clflush
        );
        if base == libc::MAP_FAILED {
            // SAFETY: as above.
            base = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    fd,
                    0,
                )
            };
            if base == libc::MAP_FAILED {
                return Err(map_error(io::Error::last_os_error()));
            }
        }
        let base = NonNull::new(base.cast::<u8>()).expect("mmap never returns null on success");

        let medium = if dax {
            Medium::DaxPm
        } else if dram {
            Medium::EmulatedPm
        } else if cache_line_flush {
            Medium::PageCache
        } else {
            Medium::Disk
        };
        // SAFETY: sysconf has no preconditions.
        let page_size = match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
            size if size > 0 => size as usize,
            _ => 4096,
        };
        assert!(page_size.is_power_of_two());
        assert_eq!(base.as_ptr() as usize % page_size, 0);

        Ok(MmapRegion {
            path: path.to_path_buf(),
            file,
            base,
            len,
            info: MediumInfo {
                medium,
                flush,
                added_latency_ns,
            },
            page_size,
            fdatasync_pending: false,
        })
    }

    fn assert_range(&self, offset: usize, len: usize) {
        let end = offset.checked_add(len);
        assert!(
            end.is_some_and(|end| end <= self.len),
            "range {offset}+{len} out of region of {} bytes",
            self.len
        );
    }

    fn flush_cache_lines(&self, offset: usize, len: usize) {
        // The base is page-aligned, so offsets aligned to 64 are cache-line addresses.
        let first_line_offset = offset - offset % CACHE_LINE_SIZE;
        let end = offset + len;
        let mut line_offset = first_line_offset;
        while line_offset < end {
            // SAFETY: in the mapping (line_offset < end <= len); the instruction was checked
            // present by `CpuFlushSupport::resolve` when the region was opened.
            unsafe {
                let address = self.base.as_ptr().add(line_offset);
                match self.info.flush {
                    FlushMethod::Clwb => x86::clwb(address),
                    FlushMethod::Clflushopt => x86::clflushopt(address),
                    FlushMethod::Clflush => x86::clflush(address),
                    _ => unreachable!(),
                }
            }
            line_offset += CACHE_LINE_SIZE;
        }
    }

    fn msync(&self, offset: usize, len: usize) {
        let page_offset = offset - offset % self.page_size;
        let sync_len = offset + len - page_offset;
        // SAFETY: a page-aligned range inside the mapping.
        let result = unsafe {
            libc::msync(
                self.base.as_ptr().add(page_offset).cast(),
                sync_len,
                libc::MS_SYNC,
            )
        };
        if result != 0 {
            panic!(
                "msync of {} failed: {}; the data may not be durable, stopping",
                self.path.display(),
                io::Error::last_os_error()
            );
        }
    }
}

impl Drop for MmapRegion {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unmapped once; no borrow of it outlives `self`.
        let result = unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
        debug_assert_eq!(result, 0, "munmap: {}", io::Error::last_os_error());
    }
}

impl PmRegion for MmapRegion {
    fn len(&self) -> usize {
        self.len
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: `len` bytes mapped readable for the life of `self`; stores need `&mut self`.
        unsafe { std::slice::from_raw_parts(self.base.as_ptr(), self.len) }
    }

    fn write(&mut self, offset: usize, data: &[u8]) {
        self.assert_range(offset, data.len());
        // SAFETY: in range (asserted); `&mut self` excludes every borrow of the bytes.
        unsafe {
            let destination = self.base.as_ptr().add(offset);
            // Aligned 4- and 8-byte writes are single stores, so they cannot tear: the log's
            // commit word relies on it. A `memcpy` promises no such thing.
            match data.len() {
                4 if offset % 4 == 0 => {
                    let mut word = [0u8; 4];
                    word.copy_from_slice(data);
                    destination
                        .cast::<u32>()
                        .write_volatile(u32::from_ne_bytes(word));
                }
                8 if offset % 8 == 0 => {
                    let mut word = [0u8; 8];
                    word.copy_from_slice(data);
                    destination
                        .cast::<u64>()
                        .write_volatile(u64::from_ne_bytes(word));
                }
                _ => std::ptr::copy_nonoverlapping(data.as_ptr(), destination, data.len()),
            }
        }
    }

    fn flush(&mut self, offset: usize, len: usize) {
        self.assert_range(offset, len);
        if len == 0 {
            return;
        }
        match self.info.flush {
            FlushMethod::Clwb | FlushMethod::Clflushopt | FlushMethod::Clflush => {
                self.flush_cache_lines(offset, len)
            }
            FlushMethod::Msync => self.msync(offset, len),
            FlushMethod::Fdatasync => self.fdatasync_pending = true,
            FlushMethod::Simulated => unreachable!("a mapped region is never simulated"),
        }
    }

    fn fence(&mut self) {
        match self.info.flush {
            FlushMethod::Clwb | FlushMethod::Clflushopt | FlushMethod::Clflush => {
                // SAFETY: sfence exists on every x86_64 CPU.
                unsafe { x86::sfence() }
            }
            FlushMethod::Msync => {} // msync(MS_SYNC) returned only once the pages were written.
            FlushMethod::Fdatasync => {
                if self.fdatasync_pending {
                    // SAFETY: a file descriptor we own.
                    if unsafe { libc::fdatasync(self.file.as_raw_fd()) } != 0 {
                        panic!(
                            "fdatasync of {} failed: {}; the data may not be durable, stopping",
                            self.path.display(),
                            io::Error::last_os_error()
                        );
                    }
                    self.fdatasync_pending = false;
                }
            }
            FlushMethod::Simulated => unreachable!("a mapped region is never simulated"),
        }
        if self.info.added_latency_ns > 0 {
            spin_for(Duration::from_nanos(self.info.added_latency_ns));
        }
    }

    fn medium(&self) -> MediumInfo {
        self.info
    }
}

/// The flush method `options` asks for, and whether it was `auto` (which [`MmapRegion::map`]
/// settles by the file system).
fn check_options(options: MmapOptions) -> Result<(FlushMethod, bool), PmError> {
    if options.added_latency_ns > ADDED_LATENCY_NS_MAX {
        return Err(PmError::LatencyTooLarge {
            added_latency_ns: options.added_latency_ns,
        });
    }
    let method = CpuFlushSupport::detect().resolve(options.flush)?;
    Ok((method, options.flush == FlushChoice::Auto))
}

/// A file made by [`MmapRegion::create_new`], not yet under its name.
#[derive(Debug)]
pub struct NewFile {
    staging: PathBuf,
    path: PathBuf,
    published: bool,
}

impl NewFile {
    /// Give the file its name: link it at its path (which must still be free) and remove the
    /// staging name, durably. Dropped unpublished, the staging file is removed.
    pub fn publish(mut self) -> Result<(), PmError> {
        match std::fs::hard_link(&self.staging, &self.path) {
            Ok(()) => {
                let _ = std::fs::remove_file(&self.staging);
            }
            Err(error) if error.kind() == io::ErrorKind::AlreadyExists => {
                return Err(PmError::AppearedMeanwhile {
                    path: self.path.clone(),
                });
            }
            Err(_) => {
                // A file system without hard links: rename, which replaces a file that appeared
                // in the meantime, so look first (a window the link above does not have).
                if self.path.exists() {
                    return Err(PmError::AppearedMeanwhile {
                        path: self.path.clone(),
                    });
                }
                std::fs::rename(&self.staging, &self.path)
                    .map_err(|error| PmError::from_io(&self.path, "create", error))?;
            }
        }
        self.published = true;
        sync_parent_directory(&self.path);
        Ok(())
    }

    /// Where the file lives until it is published.
    pub fn staging_path(&self) -> &Path {
        &self.staging
    }
}

impl Drop for NewFile {
    fn drop(&mut self) {
        if !self.published {
            let _ = std::fs::remove_file(&self.staging);
        }
    }
}

/// The name a new file for `path` is made under: hidden, beside it (same file system).
fn staging_path(path: &Path) -> PathBuf {
    let name = path.file_name().map_or_else(
        || std::ffi::OsString::from("pmnet"),
        std::ffi::OsStr::to_os_string,
    );
    let mut staging = std::ffi::OsString::from(".");
    staging.push(name);
    staging.push(".pmnet-new");
    path.with_file_name(staging)
}

/// A new file must have a length, and one this platform can map.
fn check_new_len(path: &Path, len: usize) -> Result<(), PmError> {
    if len == 0 {
        return Err(PmError::TooSmall {
            path: path.to_path_buf(),
            len: 0,
            min_len: 1,
        });
    }
    check_len_mappable(path, len as u64)
}

/// The existing file at `path`, opened for reading and writing and locked, and its length.
fn open_locked(path: &Path) -> Result<(File, u64), PmError> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(|e| PmError::from_io(path, "open", e))?;
    lock_exclusive(path, &file)?;
    let len = file
        .metadata()
        .map_err(|source| PmError::from_io(path, "stat", source))?
        .len();
    Ok((file, len))
}

fn check_len_mappable(path: &Path, len: u64) -> Result<(), PmError> {
    let max_len = isize::MAX as u64;
    if len > max_len {
        return Err(PmError::TooLarge {
            path: path.to_path_buf(),
            len,
            max_len,
        });
    }
    Ok(())
}

fn lock_exclusive(path: &Path, file: &File) -> Result<(), PmError> {
    // SAFETY: a file descriptor we own.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(());
    }
    let error = io::Error::last_os_error();
    match error.raw_os_error() {
        Some(libc::EWOULDBLOCK) => Err(PmError::Locked {
            path: path.to_path_buf(),
        }),
        // A file system without flock support: the lock is a safeguard, not a requirement.
        Some(libc::ENOLCK) | Some(libc::EINVAL) | Some(libc::EOPNOTSUPP) => Ok(()),
        _ => Err(PmError::from_io(path, "lock", error)),
    }
}

/// Extend an empty file to `len` zero bytes with the blocks allocated, so a store through the
/// mapping cannot fail for lack of space (which would be a SIGBUS, not an error).
fn preallocate(file: &File, len: u64) -> io::Result<()> {
    let len_off =
        libc::off_t::try_from(len).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: a file descriptor we own.
    match unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len_off) } {
        0 => Ok(()),
        // The file system cannot preallocate: a sparse file of the right size still works.
        libc::EOPNOTSUPP | libc::EINVAL => file.set_len(len),
        errno => Err(io::Error::from_raw_os_error(errno)),
    }
}

/// Best effort: make a newly created file's directory entry durable. A failure here loses at
/// most the file's creation on power loss, which the next open reports as a missing file.
fn sync_parent_directory(path: &Path) {
    let parent = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    if let Ok(directory) = File::open(parent) {
        let _ = directory.sync_all();
    }
}

/// True when the file lives in DRAM only (tmpfs, ramfs), so no flush makes it outlive a reboot.
fn on_dram_file_system(file: &File) -> bool {
    // SAFETY: statfs is plain data; fstatfs fills it or fails.
    let mut stats: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a file descriptor we own and a valid out pointer.
    if unsafe { libc::fstatfs(file.as_raw_fd(), &mut stats) } != 0 {
        return false;
    }
    #[allow(clippy::unnecessary_cast)] // f_type's integer type differs between targets.
    let fs_type = stats.f_type as u64;
    fs_type == TMPFS_MAGIC || fs_type == RAMFS_MAGIC
}

fn spin_for(duration: Duration) {
    let start = Instant::now();
    while start.elapsed() < duration {
        std::hint::spin_loop();
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use core::arch::asm;

    // No `nomem`/`readonly` options: the asm must stay ordered after the stores it writes back,
    // and the compiler must not move stores across it.

    /// # Safety
    /// The CPU has clwb and `address` is mapped.
    pub(super) unsafe fn clwb(address: *const u8) {
        // SAFETY: per the function's contract.
        unsafe { asm!("clwb [{0}]", in(reg) address, options(nostack, preserves_flags)) }
    }

    /// # Safety
    /// The CPU has clflushopt and `address` is mapped.
    pub(super) unsafe fn clflushopt(address: *const u8) {
        // SAFETY: per the function's contract.
        unsafe { asm!("clflushopt [{0}]", in(reg) address, options(nostack, preserves_flags)) }
    }

    /// # Safety
    /// The CPU has clflush and `address` is mapped.
    pub(super) unsafe fn clflush(address: *const u8) {
        // SAFETY: per the function's contract.
        unsafe { asm!("clflush [{0}]", in(reg) address, options(nostack, preserves_flags)) }
    }

    /// # Safety
    /// None beyond running on x86_64; `unsafe` for symmetry with the flushes.
    pub(super) unsafe fn sfence() {
        // SAFETY: sfence has no operands.
        unsafe { asm!("sfence", options(nostack, preserves_flags)) }
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod x86 {
    // `CpuFlushSupport::resolve` never picks a cache-line method off x86_64.
    pub(super) unsafe fn clwb(_: *const u8) {
        unreachable!()
    }
    pub(super) unsafe fn clflushopt(_: *const u8) {
        unreachable!()
    }
    pub(super) unsafe fn clflush(_: *const u8) {
        unreachable!()
    }
    pub(super) unsafe fn sfence() {
        unreachable!()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;

    /// A unique path under the temp directory, removed on drop.
    struct TempPath(PathBuf);

    impl TempPath {
        fn new(directory: &Path, name: &str) -> TempPath {
            static COUNTER: AtomicU64 = AtomicU64::new(0);
            let unique = COUNTER.fetch_add(1, Ordering::Relaxed);
            TempPath(directory.join(format!(
                "pmnet-pm-test-{}-{unique}-{name}",
                std::process::id()
            )))
        }
    }

    impl Drop for TempPath {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    fn options(flush: FlushChoice) -> MmapOptions {
        MmapOptions {
            flush,
            added_latency_ns: 0,
        }
    }

    fn pattern(len: usize, salt: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(salt))
            .collect()
    }

    #[test]
    fn create_write_persist_reopen_round_trip() {
        let path = TempPath::new(&std::env::temp_dir(), "round-trip");
        let data = pattern(1000, 7);
        {
            let mut region = MmapRegion::create(&path.0, 8192, MmapOptions::default()).unwrap();
            assert_eq!(region.len(), 8192);
            assert_eq!(region.path(), path.0.as_path());
            assert!(region.bytes().iter().all(|b| *b == 0));
            region.write(100, &data);
            region.write(4096, &[1, 2, 3, 4]); // Aligned single store.
            region.write(4104, &[5, 6, 7, 8, 9, 10, 11, 12]);
            region.persist(100, 1000);
            region.persist(4096, 16);
            assert_eq!(&region.bytes()[100..1100], data.as_slice());
        }
        let region = MmapRegion::open(&path.0, MmapOptions::default()).unwrap();
        assert_eq!(region.len(), 8192);
        assert_eq!(&region.bytes()[100..1100], data.as_slice());
        assert_eq!(&region.bytes()[4096..4100], &[1, 2, 3, 4]);
        assert_eq!(&region.bytes()[4104..4112], &[5, 6, 7, 8, 9, 10, 11, 12]);
        assert!(region.bytes()[..100].iter().all(|b| *b == 0));
    }

    #[test]
    fn each_flush_choice_works_and_reports_its_medium() {
        let directory = std::env::temp_dir();
        let support = CpuFlushSupport::detect();
        for choice in FlushChoice::ALL {
            let method = match support.resolve(choice) {
                Ok(method) => method,
                Err(error) => {
                    eprintln!("skipping flush choice {choice}: {error}");
                    continue;
                }
            };
            let path = TempPath::new(&directory, choice.name());
            let data = pattern(300, choice as u8);
            let mut region = MmapRegion::create(&path.0, 10_000, options(choice)).unwrap();
            let info = region.medium();
            // `auto` on a disk's file system is fdatasync.
            let dram = on_dram_file_system(&region.file);
            let method = if choice == FlushChoice::Auto && info.medium != Medium::DaxPm && !dram {
                FlushMethod::Fdatasync
            } else {
                method
            };
            assert_eq!(info.flush, method, "choice {choice}");
            let cache_line = matches!(
                method,
                FlushMethod::Clwb | FlushMethod::Clflushopt | FlushMethod::Clflush
            );
            let expected = if cache_line && info.medium == Medium::DaxPm {
                // DAX would be a surprise on a test machine, but it is the right answer there.
                Medium::DaxPm
            } else if on_dram_file_system(&region.file) {
                Medium::EmulatedPm
            } else if cache_line {
                Medium::PageCache
            } else {
                Medium::Disk
            };
            assert_eq!(info.medium, expected, "choice {choice}");
            eprintln!("{choice}: {info}");

            // Unaligned range crossing lines and a page boundary.
            region.write(4090, &data);
            region.flush(4090, data.len());
            region.fence();
            region.persist(0, region.len());
            drop(region);
            let region = MmapRegion::open(&path.0, options(choice)).unwrap();
            assert_eq!(
                &region.bytes()[4090..4390],
                data.as_slice(),
                "choice {choice}"
            );
        }
    }

    #[test]
    fn auto_writes_a_disk_file_to_the_disk_and_says_so() {
        // Not the temporary directory, which may be tmpfs (scripts/test.sh puts it there): the
        // source tree's file system, a disk's where the tests run.
        let directory = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let path = TempPath::new(&directory, "auto-disk");
        let mut region = MmapRegion::create(&path.0, 4096, MmapOptions::default()).unwrap();
        let info = region.medium();
        if on_dram_file_system(&region.file) || info.medium == Medium::DaxPm {
            eprintln!(
                "skipping: {} is not a disk's file system ({info})",
                directory.display()
            );
            return;
        }
        assert_eq!(
            (info.medium, info.flush),
            (Medium::Disk, FlushMethod::Fdatasync)
        );
        assert!(info.to_string().contains("power loss"), "{info}");
        assert!(!info.to_string().contains("NOT power loss"), "{info}");
        region.write(0, b"hello");
        region.persist(0, 5);
        drop(region);
        // Named, an instruction on the same file is the page cache's, and says so.
        let support = CpuFlushSupport::detect();
        if let Ok(method) = support.resolve(FlushChoice::Clflush) {
            let region = MmapRegion::open(&path.0, options(FlushChoice::Clflush)).unwrap();
            assert_eq!(
                (region.medium().medium, region.medium().flush),
                (Medium::PageCache, method)
            );
            assert!(region.medium().to_string().contains("NOT power loss"));
            assert_eq!(&region.bytes()[..5], b"hello");
        }
    }

    #[test]
    fn msync_and_fdatasync_on_dev_shm_are_emulated_pm() {
        let directory = Path::new("/dev/shm");
        if !directory.is_dir() {
            eprintln!("skipping: no /dev/shm");
            return;
        }
        for choice in [
            FlushChoice::Msync,
            FlushChoice::Fdatasync,
            FlushChoice::Auto,
        ] {
            let path = TempPath::new(directory, choice.name());
            let mut region = MmapRegion::create(&path.0, 4096, options(choice)).unwrap();
            assert_eq!(
                region.medium().medium,
                Medium::EmulatedPm,
                "choice {choice}"
            );
            region.write(0, b"hello");
            region.persist(0, 5);
            assert_eq!(&region.bytes()[..5], b"hello");
        }
    }

    #[test]
    fn unsupported_instruction_says_what_to_use() {
        let none = CpuFlushSupport {
            clwb: false,
            clflushopt: false,
            clflush: false,
        };
        let error = none.resolve(FlushChoice::Clwb).unwrap_err();
        assert!(error.to_string().contains("use msync instead"), "{error}");
        assert_eq!(none.resolve(FlushChoice::Auto).unwrap(), FlushMethod::Msync);

        let old = CpuFlushSupport {
            clwb: false,
            clflushopt: true,
            clflush: true,
        };
        if cfg!(target_arch = "x86_64") {
            let error = old.resolve(FlushChoice::Clwb).unwrap_err();
            let message = error.to_string();
            assert!(message.contains("lacks clwb"), "{message}");
            assert!(message.contains("use clflushopt instead"), "{message}");
            assert_eq!(
                old.resolve(FlushChoice::Auto).unwrap(),
                FlushMethod::Clflushopt
            );
            let all = CpuFlushSupport {
                clwb: true,
                clflushopt: true,
                clflush: true,
            };
            assert_eq!(all.resolve(FlushChoice::Auto).unwrap(), FlushMethod::Clwb);
        }
        assert_eq!(
            old.resolve(FlushChoice::Fdatasync).unwrap(),
            FlushMethod::Fdatasync
        );
    }

    #[test]
    fn flush_choice_parses_its_names() {
        for choice in FlushChoice::ALL {
            assert_eq!(choice.name().parse::<FlushChoice>().unwrap(), choice);
        }
        let error = "clwbb".parse::<FlushChoice>().unwrap_err();
        assert!(error.to_string().contains("expected one of"), "{error}");
    }

    #[test]
    fn errors_name_the_file_and_the_fix() {
        let directory = std::env::temp_dir();
        let missing = TempPath::new(&directory, "missing");
        let error = MmapRegion::open(&missing.0, MmapOptions::default()).unwrap_err();
        assert!(matches!(error, PmError::NotFound { .. }), "{error}");
        assert!(error.to_string().contains(&*missing.0.to_string_lossy()));

        let empty = TempPath::new(&directory, "empty");
        std::fs::write(&empty.0, b"").unwrap();
        let error = MmapRegion::open(&empty.0, MmapOptions::default()).unwrap_err();
        assert!(matches!(error, PmError::TooSmall { .. }), "{error}");
        assert!(error.to_string().contains("file too small"), "{error}");

        let error = MmapRegion::create(&empty.0, 0, MmapOptions::default()).unwrap_err();
        assert!(matches!(error, PmError::TooSmall { .. }), "{error}");

        let no_directory = directory
            .join(format!("pmnet-pm-no-such-directory-{}", std::process::id()))
            .join("log");
        let error = MmapRegion::create(&no_directory, 4096, MmapOptions::default()).unwrap_err();
        assert!(matches!(error, PmError::NotFound { .. }), "{error}");

        let too_slow = MmapOptions {
            flush: FlushChoice::Auto,
            added_latency_ns: ADDED_LATENCY_NS_MAX + 1,
        };
        let error = MmapRegion::create(&empty.0, 4096, too_slow).unwrap_err();
        assert!(matches!(error, PmError::LatencyTooLarge { .. }), "{error}");
    }

    #[test]
    fn a_mapped_file_is_locked() {
        let path = TempPath::new(&std::env::temp_dir(), "locked");
        let region = MmapRegion::create(&path.0, 4096, MmapOptions::default()).unwrap();
        let error = MmapRegion::open(&path.0, MmapOptions::default()).unwrap_err();
        assert!(matches!(error, PmError::Locked { .. }), "{error}");
        let error = MmapRegion::create(&path.0, 4096, MmapOptions::default()).unwrap_err();
        assert!(matches!(error, PmError::Locked { .. }), "{error}");
        drop(region);
        MmapRegion::open(&path.0, MmapOptions::default()).unwrap();
    }

    #[test]
    fn create_truncates_and_zero_fills() {
        let path = TempPath::new(&std::env::temp_dir(), "truncate");
        std::fs::write(&path.0, vec![0xFFu8; 20_000]).unwrap();
        let region = MmapRegion::create(&path.0, 5000, MmapOptions::default()).unwrap();
        assert_eq!(region.len(), 5000);
        assert!(region.bytes().iter().all(|b| *b == 0));
        assert_eq!(std::fs::metadata(&path.0).unwrap().len(), 5000);
    }

    #[test]
    fn added_latency_is_spent_per_fence() {
        let path = TempPath::new(&std::env::temp_dir(), "latency");
        let latency = MmapOptions {
            flush: FlushChoice::Auto,
            added_latency_ns: 300_000,
        };
        let mut region = MmapRegion::create(&path.0, 4096, latency).unwrap();
        assert_eq!(region.medium().added_latency_ns, 300_000);
        let start = Instant::now();
        region.write(0, &[1; 64]);
        region.persist(0, 64);
        region.fence();
        assert!(start.elapsed() >= Duration::from_nanos(600_000));
    }

    #[test]
    fn region_is_send() {
        fn assert_send<T: Send>() {}
        assert_send::<MmapRegion>();
    }
}

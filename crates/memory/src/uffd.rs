//! The userfaultfd(2) interface, as much of it as the mapped view uses, declared by hand from
//! `<linux/userfaultfd.h>` (a stable kernel ABI).
//!
//! Why not the `userfaultfd` crate: its `-sys` crate runs bindgen at build time, which needs
//! libclang (Debian's `libclang1-14` / `libclang-dev`) on every machine that builds the
//! workspace, and its `copy` cannot install a page write-protected (`UFFDIO_COPY_MODE_WP`),
//! which write tracking needs to be race-free. The handful of structures and ioctl numbers
//! below are checked against the C header's sizes in this module's tests.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

const UFFD_API: u64 = 0xAA;
const UFFDIO: u64 = 0xAA;

pub const UFFD_EVENT_PAGEFAULT: u8 = 0x12;
pub const UFFD_PAGEFAULT_FLAG_WRITE: u64 = 1 << 0;
pub const UFFD_PAGEFAULT_FLAG_WP: u64 = 1 << 1;

pub const UFFD_FEATURE_PAGEFAULT_FLAG_WP: u64 = 1 << 0;
pub const UFFD_FEATURE_THREAD_ID: u64 = 1 << 8;

pub const UFFDIO_REGISTER_MODE_MISSING: u64 = 1 << 0;
pub const UFFDIO_REGISTER_MODE_WP: u64 = 1 << 1;

const UFFDIO_COPY_MODE_WP: u64 = 1 << 1;
const UFFDIO_WRITEPROTECT_MODE_WP: u64 = 1 << 0;

const UFFD_USER_MODE_ONLY: libc::c_int = 1;

/// Bit `_UFFDIO_WRITEPROTECT` of the `ioctls` a registration reports.
pub const IOCTL_WRITEPROTECT: u64 = 1 << 0x06;

// The ioctl numbers, in the generic encoding (x86-64, arm64, riscv64, loongarch64):
// direction << 30 | size << 16 | type << 8 | number.
const IOC_WRITE: u64 = 1;
const IOC_READ: u64 = 2;

const fn ioc(dir: u64, nr: u64, size: usize) -> u64 {
    (dir << 30) | ((size as u64) << 16) | (UFFDIO << 8) | nr
}

const UFFDIO_API: u64 = ioc(IOC_READ | IOC_WRITE, 0x3F, size_of::<UffdioApi>());
const UFFDIO_REGISTER: u64 = ioc(IOC_READ | IOC_WRITE, 0x00, size_of::<UffdioRegister>());
const UFFDIO_UNREGISTER: u64 = ioc(IOC_READ, 0x01, size_of::<UffdioRange>());
const UFFDIO_WAKE: u64 = ioc(IOC_READ, 0x02, size_of::<UffdioRange>());
const UFFDIO_COPY: u64 = ioc(IOC_READ | IOC_WRITE, 0x03, size_of::<UffdioCopy>());
const UFFDIO_WRITEPROTECT: u64 = ioc(IOC_READ | IOC_WRITE, 0x06, size_of::<UffdioWriteprotect>());
/// `USERFAULTFD_IOC_NEW` of `/dev/userfaultfd`: `_IO(0xAA, 0x00)`.
const USERFAULTFD_IOC_NEW: u64 = UFFDIO << 8;

#[repr(C)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct UffdioRange {
    start: u64,
    len: u64,
}

#[repr(C)]
struct UffdioRegister {
    range: UffdioRange,
    mode: u64,
    ioctls: u64,
}

#[repr(C)]
struct UffdioCopy {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    copy: i64,
}

#[repr(C)]
struct UffdioWriteprotect {
    range: UffdioRange,
    mode: u64,
}

/// `struct uffd_msg` read as a page-fault message (the only event the view asks for).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct UffdMsg {
    pub event: u8,
    reserved1: u8,
    reserved2: u16,
    reserved3: u32,
    pub flags: u64,
    pub address: u64,
    /// The faulting thread (with `UFFD_FEATURE_THREAD_ID`).
    pub ptid: u32,
    pad: u32,
}

/// An open userfaultfd, past its `UFFDIO_API` handshake.
#[derive(Debug)]
pub struct Uffd {
    fd: OwnedFd,
    /// The features the kernel granted.
    pub features: u64,
}

fn ioctl<T>(fd: RawFd, request: u64, arg: &mut T) -> io::Result<()> {
    // SAFETY: `arg` is the structure `request` is declared with; the kernel reads and writes
    // only that structure.
    let rc = unsafe { libc::ioctl(fd, request as _, arg as *mut T) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

fn open_fd(flags: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: a plain system call; a non-negative return is a new descriptor we own.
    let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, flags) };
    if fd >= 0 {
        // SAFETY: see above.
        return Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) });
    }
    let err = io::Error::last_os_error();
    // The system call may be refused (vm.unprivileged_userfaultfd = 0 without CAP_SYS_PTRACE,
    // or seccomp) where the device node is permitted.
    let path = c"/dev/userfaultfd";
    // SAFETY: a NUL-terminated path; the result is checked.
    let dev = unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if dev < 0 {
        return Err(err);
    }
    // SAFETY: `dev` was just opened and is ours.
    let dev = unsafe { OwnedFd::from_raw_fd(dev) };
    // SAFETY: USERFAULTFD_IOC_NEW takes the flags by value and returns a new descriptor.
    let fd = unsafe { libc::ioctl(dev.as_raw_fd(), USERFAULTFD_IOC_NEW as _, flags) };
    if fd < 0 {
        return Err(err);
    }
    // SAFETY: a new descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

impl Uffd {
    /// A non-blocking, close-on-exec userfaultfd with as many of `features` as the kernel
    /// grants. Faults the kernel takes on the view's behalf (a `read(2)` into it) are caught
    /// too unless only user-mode faults are permitted, in which case those fail with EFAULT.
    pub fn open(features: u64) -> io::Result<Uffd> {
        let flags = libc::O_CLOEXEC | libc::O_NONBLOCK;
        let fd = match open_fd(flags) {
            Ok(fd) => fd,
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
                open_fd(flags | UFFD_USER_MODE_ONLY)?
            }
            Err(e) => return Err(e),
        };
        let mut api = UffdioApi {
            api: UFFD_API,
            features,
            ioctls: 0,
        };
        match ioctl(fd.as_raw_fd(), UFFDIO_API, &mut api) {
            Ok(()) => Ok(Uffd {
                fd,
                features: api.features,
            }),
            // Some of the features are unknown to this kernel: a descriptor's handshake is
            // done once, so start again without them.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) && features != 0 => {
                drop(fd);
                Uffd::open(0)
            }
            Err(e) => Err(e),
        }
    }

    pub fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Registers `[start, start + len)` in `mode`; returns the ioctls the range supports.
    pub fn register(&self, start: usize, len: usize, mode: u64) -> io::Result<u64> {
        let mut reg = UffdioRegister {
            range: UffdioRange {
                start: start as u64,
                len: len as u64,
            },
            mode,
            ioctls: 0,
        };
        ioctl(self.raw(), UFFDIO_REGISTER, &mut reg)?;
        Ok(reg.ioctls)
    }

    pub fn unregister(&self, start: usize, len: usize) -> io::Result<()> {
        let mut range = UffdioRange {
            start: start as u64,
            len: len as u64,
        };
        ioctl(self.raw(), UFFDIO_UNREGISTER, &mut range)
    }

    /// Wakes the threads waiting on faults in the range.
    pub fn wake(&self, start: usize, len: usize) -> io::Result<()> {
        let mut range = UffdioRange {
            start: start as u64,
            len: len as u64,
        };
        ioctl(self.raw(), UFFDIO_WAKE, &mut range)
    }

    /// Installs `src` at `dst` (a missing page), write-protected if `wp`, and wakes the
    /// waiters. `Err(EEXIST)` when the page is already there.
    ///
    /// # Safety
    /// `src` must be readable for `len` bytes; `dst` must be a registered range.
    pub unsafe fn copy(&self, src: *const u8, dst: usize, len: usize, wp: bool) -> io::Result<()> {
        let mut copy = UffdioCopy {
            dst: dst as u64,
            src: src as u64,
            len: len as u64,
            mode: if wp { UFFDIO_COPY_MODE_WP } else { 0 },
            copy: 0,
        };
        ioctl(self.raw(), UFFDIO_COPY, &mut copy)?;
        if copy.copy != len as i64 {
            return Err(io::Error::other(format!(
                "UFFDIO_COPY copied {} of {len} bytes",
                copy.copy
            )));
        }
        Ok(())
    }

    /// Write-protects the range (`protect`), or lifts the protection and wakes the waiters.
    pub fn write_protect(&self, start: usize, len: usize, protect: bool) -> io::Result<()> {
        let mut wp = UffdioWriteprotect {
            range: UffdioRange {
                start: start as u64,
                len: len as u64,
            },
            mode: if protect {
                UFFDIO_WRITEPROTECT_MODE_WP
            } else {
                0
            },
        };
        ioctl(self.raw(), UFFDIO_WRITEPROTECT, &mut wp)
    }

    /// Reads pending messages into `out` without blocking; returns how many.
    pub fn read_events(&self, out: &mut [UffdMsg]) -> io::Result<usize> {
        // SAFETY: `out` is a buffer of `out.len()` messages of the kernel's layout.
        let n = unsafe {
            libc::read(
                self.raw(),
                out.as_mut_ptr().cast(),
                std::mem::size_of_val(out),
            )
        };
        if n < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::WouldBlock {
                return Ok(0);
            }
            return Err(err);
        }
        Ok(n as usize / size_of::<UffdMsg>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_match_the_kernel_header() {
        // Sizes and numbers as <linux/userfaultfd.h> of Linux 6.1 gives them (x86-64).
        assert_eq!(size_of::<UffdMsg>(), 32);
        assert_eq!(std::mem::offset_of!(UffdMsg, flags), 8);
        assert_eq!(std::mem::offset_of!(UffdMsg, address), 16);
        assert_eq!(std::mem::offset_of!(UffdMsg, ptid), 24);
        assert_eq!(UFFDIO_API, 0xc018_aa3f);
        assert_eq!(UFFDIO_REGISTER, 0xc020_aa00);
        assert_eq!(UFFDIO_UNREGISTER, 0x8010_aa01);
        assert_eq!(UFFDIO_WAKE, 0x8010_aa02);
        assert_eq!(UFFDIO_COPY, 0xc028_aa03);
        assert_eq!(UFFDIO_WRITEPROTECT, 0xc018_aa06);
        assert_eq!(USERFAULTFD_IOC_NEW, 0xaa00);
    }
}

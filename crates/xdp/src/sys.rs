//! Small system-call helpers and the constants `libc` lacks.

use std::ffi::CString;
use std::io;
use std::os::fd::RawFd;

use crate::XdpError;

pub(crate) const SO_BUSY_POLL: libc::c_int = 46;
pub(crate) const SO_PREFER_BUSY_POLL: libc::c_int = 69;
pub(crate) const SO_BUSY_POLL_BUDGET: libc::c_int = 70;

const CAP_NET_ADMIN: u32 = 12;
const CAP_NET_RAW: u32 = 13;
const CAP_SYS_ADMIN: u32 = 21;
const CAP_BPF: u32 = 39;
const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// The index of interface `ifname` in the calling thread's network namespace.
pub(crate) fn ifindex(ifname: &str) -> Result<u32, XdpError> {
    let name = CString::new(ifname).map_err(|_| XdpError::NoSuchInterface(ifname.to_string()))?;
    if ifname.is_empty() || ifname.len() >= libc::IF_NAMESIZE {
        return Err(XdpError::NoSuchInterface(ifname.to_string()));
    }
    // SAFETY: `name` is a valid NUL-terminated string.
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
    if index == 0 {
        return Err(XdpError::NoSuchInterface(ifname.to_string()));
    }
    Ok(index)
}

/// Whether the effective capability set holds what XDP and AF_XDP need: CAP_NET_ADMIN (attach,
/// busy poll), CAP_NET_RAW (AF_XDP sockets) and CAP_BPF or CAP_SYS_ADMIN (load programs, maps).
/// `Err` names what is missing.
pub(crate) fn check_capabilities() -> Result<(), String> {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: libc::c_int,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let mut header = Header {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [Data::default(); 2];
    // SAFETY: capget with a v3 header writes two `Data` structs.
    let rc = unsafe { libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) };
    if rc != 0 {
        return Err(format!("capget failed: {}", io::Error::last_os_error()));
    }
    let has = |cap: u32| data[(cap / 32) as usize].effective & (1 << (cap % 32)) != 0;
    let mut missing = Vec::new();
    if !has(CAP_NET_ADMIN) {
        missing.push("CAP_NET_ADMIN");
    }
    if !has(CAP_NET_RAW) {
        missing.push("CAP_NET_RAW");
    }
    if !has(CAP_BPF) && !has(CAP_SYS_ADMIN) {
        missing.push("CAP_BPF");
    }
    if missing.is_empty() {
        Ok(())
    } else {
        // SAFETY: geteuid never fails.
        let euid = unsafe { libc::geteuid() };
        Err(format!(
            "not privileged (euid {euid}, missing {})",
            missing.join(", ")
        ))
    }
}

/// `setsockopt` of a plain value.
pub(crate) fn setsockopt<T>(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
    value: &T,
) -> io::Result<()> {
    // SAFETY: `value` points to `size_of::<T>()` readable bytes.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (value as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `getsockopt` of a plain value; returns the length the kernel wrote.
pub(crate) fn getsockopt<T>(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
    value: &mut T,
) -> io::Result<usize> {
    let mut len = std::mem::size_of::<T>() as libc::socklen_t;
    // SAFETY: `value` points to `len` writable bytes; T is plain old data in every caller.
    let rc = unsafe { libc::getsockopt(fd, level, name, (value as *mut T).cast(), &mut len) };
    if rc == 0 {
        Ok(len as usize)
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The system page size.
pub(crate) fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if size > 0 {
        size as usize
    } else {
        4096
    }
}

const SIOCETHTOOL: libc::c_ulong = 0x8946;
const ETHTOOL_STXCSUM: u32 = 0x17;

/// Turns transmit checksum offload of `ifname` (in the calling thread's network namespace) on
/// or off, as `ethtool -K IFNAME tx off` does.
///
/// Why: a datagram a local socket sends through a virtual device (veth) leaves with only the
/// pseudo-header sum in its UDP checksum field, to be completed by "hardware" that never
/// runs; a kernel socket on the other side does not mind (the skb says the checksum is
/// partial), but an AF_XDP socket receives the raw bytes, which [`crate::frame::parse_udp`]
/// rejects as [`crate::frame::FrameError::UdpChecksum`]. Turning offload off on the sending
/// end of a veth testbed makes the kernel write full checksums. Real NICs deliver complete
/// checksums and need nothing.
pub fn set_tx_checksum_offload(ifname: &str, enabled: bool) -> Result<(), XdpError> {
    #[repr(C)]
    struct EthtoolValue {
        cmd: u32,
        data: u32,
    }
    let mut value = EthtoolValue {
        cmd: ETHTOOL_STXCSUM,
        data: enabled as u32,
    };
    if ifname.is_empty() || ifname.len() >= libc::IF_NAMESIZE || ifname.contains('\0') {
        return Err(XdpError::NoSuchInterface(ifname.to_string()));
    }
    // SAFETY: plain old data.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in ifr.ifr_name.iter_mut().zip(ifname.bytes()) {
        *dst = src as libc::c_char;
    }
    ifr.ifr_ifru.ifru_data = (&mut value as *mut EthtoolValue).cast();
    // SAFETY: a datagram socket for the ioctl, closed below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(XdpError::Unsupported(format!(
            "socket: {}",
            io::Error::last_os_error()
        )));
    }
    // SAFETY: `ifr` names the interface and points at `value`, both live across the call.
    let rc = unsafe { libc::ioctl(fd, SIOCETHTOOL as _, &mut ifr) };
    let err = io::Error::last_os_error();
    // SAFETY: `fd` is ours.
    unsafe { libc::close(fd) };
    if rc == 0 {
        return Ok(());
    }
    Err(match err.raw_os_error() {
        Some(libc::ENODEV) => XdpError::NoSuchInterface(ifname.to_string()),
        _ => XdpError::from_errno(&err, || {
            format!("cannot change checksum offload of {ifname}")
        })
        .unwrap_or_else(|| XdpError::Unsupported(format!("ETHTOOL_STXCSUM on {ifname}: {err}"))),
    })
}

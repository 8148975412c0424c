//! Errors of the datapath: each names the interface (or queue) and the cause, so the runtime can
//! print one line and fall back to kernel UDP sockets.

use std::io;

/// Why an XDP or AF_XDP operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum XdpError {
    /// The crate was built without the XDP program (clang was missing or failed).
    #[error("the XDP program is not built into pmnet-xdp ({0}); install clang (apt-get install -y clang) and rebuild")]
    NotBuilt(String),
    /// Missing privileges: loading XDP programs and opening AF_XDP sockets need root, or
    /// CAP_NET_ADMIN, CAP_NET_RAW and CAP_BPF (or CAP_SYS_ADMIN).
    #[error("{0}: run as root, or grant CAP_NET_ADMIN, CAP_NET_RAW and CAP_BPF")]
    Permission(String),
    /// The kernel has no AF_XDP sockets or no XDP (CONFIG_XDP_SOCKETS off, too old).
    #[error("not supported by this kernel: {0}")]
    Unsupported(String),
    /// No network interface of that name (in this network namespace).
    #[error("no network interface named {0:?}")]
    NoSuchInterface(String),
    /// The kernel refused to load the program (verifier) or create its maps.
    #[error("the kernel refused to load the XDP program: {0}")]
    Load(String),
    /// The kernel refused to attach the program to the interface.
    #[error("cannot attach XDP ({mode}) to {ifname}: {cause}")]
    Attach {
        /// The interface.
        ifname: String,
        /// `native` or `generic`.
        mode: &'static str,
        /// What the kernel said.
        cause: String,
    },
    /// Another XDP program is attached to the interface and is not ours to replace.
    #[error("{ifname} already has XDP program {program:?} (id {id}) attached; detach it with `ip link set dev {ifname} xdp off` (or stop the process that holds it)")]
    Busy {
        /// The interface.
        ifname: String,
        /// The attached program's name.
        program: String,
        /// The attached program's id.
        id: u32,
    },
    /// A map update failed or a bound was reached (steered destinations, queues).
    #[error("XDP map {map}: {cause}")]
    Map {
        /// `steer`, `xsks` or `counters`.
        map: &'static str,
        /// Why.
        cause: String,
    },
    /// A UMEM of that shape cannot exist (alignment, frame size, length).
    #[error("invalid UMEM: {0}")]
    InvalidUmem(String),
    /// A socket configuration the kernel would refuse (ring sizes, queue).
    #[error("invalid AF_XDP configuration: {0}")]
    InvalidConfig(String),
    /// An AF_XDP socket system call failed.
    #[error("AF_XDP socket on {ifname} queue {queue}: {op} failed: {source}")]
    Socket {
        /// The interface.
        ifname: String,
        /// The queue.
        queue: u32,
        /// The call (`socket`, `setsockopt(XDP_UMEM_REG)`, `bind`, ...).
        op: &'static str,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// No free TX frame or no room on the TX ring: flush and retry, or drop.
    #[error("AF_XDP TX ring or frame pool full")]
    TxFull,
    /// A TX frame's length (as returned by the writer) exceeds the frame size.
    #[error("frame length {len} exceeds the UMEM frame size {frame_size}")]
    FrameTooLong {
        /// The length returned.
        len: usize,
        /// The UMEM's frame size.
        frame_size: u32,
    },
}

impl XdpError {
    /// Maps an errno from a privileged call to [`XdpError::Permission`] when it says so.
    pub(crate) fn from_errno(err: &io::Error, what: impl FnOnce() -> String) -> Option<XdpError> {
        match err.raw_os_error() {
            Some(libc::EPERM) | Some(libc::EACCES) => Some(XdpError::Permission(what())),
            _ => None,
        }
    }
}

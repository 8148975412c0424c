//! Creating an AF_XDP socket: register the UMEM, size and map the rings, bind, busy poll.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use super::{BusyPollStatus, XskConfig, XskSocket, XskStats};
use crate::ring::{ConsumerRing, ProducerRing};
use crate::sys::{self, getsockopt, setsockopt};
use crate::{Umem, XdpError};

/// The largest ring this crate asks for (each entry of the RX/TX rings is 16 bytes).
const MAX_RING: u32 = 1 << 16;

fn check_ring(name: &str, size: u32) -> Result<(), XdpError> {
    if size == 0 || !size.is_power_of_two() || size > MAX_RING {
        return Err(XdpError::InvalidConfig(format!(
            "{name} ring of {size} entries: must be a power of two from 1 to {MAX_RING}"
        )));
    }
    Ok(())
}

pub(super) fn open(ifname: &str, umem: Umem, config: XskConfig) -> Result<XskSocket, XdpError> {
    check_ring("RX", config.rx_ring)?;
    check_ring("TX", config.tx_ring)?;
    check_ring("fill", config.fill_ring)?;
    check_ring("completion", config.completion_ring)?;
    let ifindex = sys::ifindex(ifname)?;
    let queue = config.queue;
    let fail = |op: &'static str, source: io::Error| -> XdpError {
        if let Some(err) = XdpError::from_errno(&source, || {
            format!("AF_XDP socket on {ifname} queue {queue}: {op} refused")
        }) {
            return err;
        }
        XdpError::Socket {
            ifname: ifname.to_string(),
            queue,
            op,
            source,
        }
    };

    // SAFETY: plain socket creation.
    let raw = unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        let err = io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::EAFNOSUPPORT) {
            return Err(XdpError::Unsupported(
                "AF_XDP sockets (CONFIG_XDP_SOCKETS)".into(),
            ));
        }
        return Err(fail("socket(AF_XDP)", err));
    }
    // SAFETY: `raw` is a fresh descriptor we own.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let raw = fd.as_raw_fd();

    let reg = libc::xdp_umem_reg {
        addr: umem.as_ptr() as u64,
        len: umem.len() as u64,
        chunk_size: umem.frame_size(),
        headroom: 0,
        flags: if umem.is_unaligned() {
            libc::XDP_UMEM_UNALIGNED_CHUNK_FLAG
        } else {
            0
        },
        tx_metadata_len: 0,
    };
    setsockopt(raw, libc::SOL_XDP, libc::XDP_UMEM_REG, &reg)
        .map_err(|e| fail("setsockopt(XDP_UMEM_REG)", e))?;
    for (name, op, size) in [
        (
            libc::XDP_UMEM_FILL_RING,
            "setsockopt(XDP_UMEM_FILL_RING)",
            config.fill_ring,
        ),
        (
            libc::XDP_UMEM_COMPLETION_RING,
            "setsockopt(XDP_UMEM_COMPLETION_RING)",
            config.completion_ring,
        ),
        (libc::XDP_RX_RING, "setsockopt(XDP_RX_RING)", config.rx_ring),
        (libc::XDP_TX_RING, "setsockopt(XDP_TX_RING)", config.tx_ring),
    ] {
        setsockopt(raw, libc::SOL_XDP, name, &size).map_err(|e| fail(op, e))?;
    }
    // SAFETY: plain old data.
    let mut off: libc::xdp_mmap_offsets = unsafe { std::mem::zeroed() };
    let len = getsockopt(raw, libc::SOL_XDP, libc::XDP_MMAP_OFFSETS, &mut off)
        .map_err(|e| fail("getsockopt(XDP_MMAP_OFFSETS)", e))?;
    if len < std::mem::size_of::<libc::xdp_mmap_offsets>() {
        // Kernels before 5.4 lack the flags word (and need_wakeup).
        return Err(XdpError::Unsupported(
            "AF_XDP need_wakeup (kernel 5.4 or later)".into(),
        ));
    }
    let fill = ProducerRing::<u64>::new(
        raw,
        libc::XDP_UMEM_PGOFF_FILL_RING,
        &off.fr,
        config.fill_ring,
    )
    .map_err(|e| fail("mmap(fill ring)", e))?;
    let completion = ConsumerRing::<u64>::new(
        raw,
        libc::XDP_UMEM_PGOFF_COMPLETION_RING,
        &off.cr,
        config.completion_ring,
    )
    .map_err(|e| fail("mmap(completion ring)", e))?;
    let rx = ConsumerRing::<libc::xdp_desc>::new(
        raw,
        libc::XDP_PGOFF_RX_RING as u64,
        &off.rx,
        config.rx_ring,
    )
    .map_err(|e| fail("mmap(RX ring)", e))?;
    let tx = ProducerRing::<libc::xdp_desc>::new(
        raw,
        libc::XDP_PGOFF_TX_RING as u64,
        &off.tx,
        config.tx_ring,
    )
    .map_err(|e| fail("mmap(TX ring)", e))?;

    // Zero-copy when asked: no mode flag lets the kernel try zero-copy and fall back to copy
    // mode when the driver cannot; XDP_OPTIONS then says which one took effect.
    let mode = if config.zero_copy { 0 } else { libc::XDP_COPY };
    let addr = libc::sockaddr_xdp {
        sxdp_family: libc::AF_XDP as u16,
        sxdp_flags: mode | libc::XDP_USE_NEED_WAKEUP,
        sxdp_ifindex: ifindex,
        sxdp_queue_id: queue,
        sxdp_shared_umem_fd: 0,
    };
    // SAFETY: `addr` is a valid sockaddr_xdp of the given length.
    let rc = unsafe {
        libc::bind(
            raw,
            (&addr as *const libc::sockaddr_xdp).cast(),
            std::mem::size_of::<libc::sockaddr_xdp>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        let err = io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::EINVAL) {
            return Err(XdpError::InvalidConfig(format!(
                "{ifname} has no queue {queue} (or the UMEM/rings were refused): {err}"
            )));
        }
        return Err(fail("bind", err));
    }
    let mut options = libc::xdp_options { flags: 0 };
    let zero_copy = getsockopt(raw, libc::SOL_XDP, libc::XDP_OPTIONS, &mut options).is_ok()
        && options.flags & XDP_OPTIONS_ZEROCOPY != 0;
    let busy_poll = if config.busy_poll {
        enable_busy_poll(raw, config.busy_poll_usecs, config.busy_poll_budget)
    } else {
        BusyPollStatus::default()
    };
    tracing::debug!(
        ifname,
        queue,
        zero_copy,
        ?busy_poll,
        frames = umem.frame_count(),
        "AF_XDP socket bound"
    );
    Ok(XskSocket {
        fill,
        completion,
        rx,
        tx,
        fd,
        umem,
        ifname: ifname.to_string(),
        ifindex,
        queue,
        zero_copy,
        busy_poll,
        pool: None,
        batch: Vec::new(),
        refill: Vec::new(),
        stats: XskStats::default(),
    })
}

/// `XDP_OPTIONS_ZEROCOPY` (linux/if_xdp.h).
const XDP_OPTIONS_ZEROCOPY: u32 = 1;

/// Sets what the kernel accepts of the busy-poll options (older kernels refuse some with
/// EINVAL or ENOPROTOOPT; that is reported, not an error).
fn enable_busy_poll(fd: RawFd, usecs: u32, budget: u32) -> BusyPollStatus {
    let one: libc::c_int = 1;
    let usecs_value = usecs.min(i32::MAX as u32) as libc::c_int;
    let budget_value = budget.min(u16::MAX as u32) as libc::c_int;
    let mut status = BusyPollStatus::default();
    let set =
        |name, value: &libc::c_int, what: &str| match setsockopt(fd, libc::SOL_SOCKET, name, value)
        {
            Ok(()) => true,
            Err(err) => {
                tracing::debug!(%err, "{what} not set");
                false
            }
        };
    status.prefer = set(sys::SO_PREFER_BUSY_POLL, &one, "SO_PREFER_BUSY_POLL");
    status.usecs =
        set(sys::SO_BUSY_POLL, &usecs_value, "SO_BUSY_POLL").then_some(usecs_value as u32);
    status.budget = set(
        sys::SO_BUSY_POLL_BUDGET,
        &budget_value,
        "SO_BUSY_POLL_BUDGET",
    )
    .then_some(budget_value as u32);
    status
}

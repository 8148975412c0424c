//! The device's data socket: a UDP socket, or the AF_XDP datapath (with the UDP socket beside
//! it for what is not steered), behind one face.

use std::net::SocketAddr;
use std::os::fd::RawFd;

use pmnet_proto::Transmit;

use crate::udp::{BatchSocket, SocketCounters, Unreachable};
use crate::xdp_path::XdpPath;

#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // one per device; the UDP socket is the common case
pub(super) enum DataPath {
    Udp(BatchSocket),
    Xdp(Box<XdpPath>),
}

impl DataPath {
    pub(super) fn receive_batch(&mut self) -> usize {
        match self {
            DataPath::Udp(socket) => socket.receive_batch(),
            DataPath::Xdp(path) => path.receive_batch(),
        }
    }

    pub(super) fn received(&self, index: usize) -> Option<(SocketAddr, &[u8])> {
        match self {
            DataPath::Udp(socket) => socket.received(index),
            DataPath::Xdp(path) => path.received(index),
        }
    }

    pub(super) fn enqueue(&mut self, transmit: Transmit) {
        match self {
            DataPath::Udp(socket) => socket.enqueue(transmit),
            DataPath::Xdp(path) => path.enqueue(transmit),
        }
    }

    pub(super) fn flush(&mut self) {
        match self {
            DataPath::Udp(socket) => {
                socket.flush();
            }
            DataPath::Xdp(path) => {
                path.flush();
            }
        }
    }

    /// The descriptors to wait on, the first answering for the data socket.
    pub(super) fn raw_fds(&self) -> Vec<RawFd> {
        match self {
            DataPath::Udp(socket) => vec![socket.raw_fd()],
            DataPath::Xdp(path) => path.raw_fds(),
        }
    }

    pub(super) fn is_write_blocked(&self) -> bool {
        match self {
            DataPath::Udp(socket) => socket.is_write_blocked(),
            DataPath::Xdp(path) => path.is_write_blocked(),
        }
    }

    pub(super) fn queued_len(&self) -> usize {
        match self {
            DataPath::Udp(socket) => socket.queued_len(),
            DataPath::Xdp(path) => path.queued_len(),
        }
    }

    pub(super) fn has_unreachable(&self) -> bool {
        match self {
            DataPath::Udp(socket) => socket.has_unreachable(),
            DataPath::Xdp(path) => path.has_unreachable(),
        }
    }

    pub(super) fn take_unreachable(&mut self) -> Vec<Unreachable> {
        match self {
            DataPath::Udp(socket) => socket.take_unreachable(),
            DataPath::Xdp(path) => path.take_unreachable(),
        }
    }

    pub(super) fn counters(&self) -> SocketCounters {
        match self {
            DataPath::Udp(socket) => socket.counters().clone(),
            DataPath::Xdp(path) => path.counters(),
        }
    }

    pub(super) fn xdp(&self) -> Option<&XdpPath> {
        match self {
            DataPath::Udp(_) => None,
            DataPath::Xdp(path) => Some(path),
        }
    }
}

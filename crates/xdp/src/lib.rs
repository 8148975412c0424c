//! The AF_XDP datapath: PMNet datagrams go from the NIC's receive queue straight into user-space
//! memory, bypassing the kernel's IP/UDP stack, while every other frame (ARP, ICMP, SSH, other
//! UDP ports) still goes to the kernel.
//!
//! Four pieces, each usable alone:
//!
//! - [`Steering`] loads and attaches the XDP program (`bpf/steer.c`, compiled by clang in
//!   `build.rs`). The program redirects IPv4/UDP frames whose destination (address, port) was
//!   [`Steering::steer`]ed to the AF_XDP socket [`Steering::register`]ed for the frame's receive
//!   queue, and passes everything else to the kernel.
//! - [`Umem`] is the memory AF_XDP frames land in: anonymous pages, or a caller's region (the
//!   packet store registers its persistent region so a frame lands in its final slot).
//! - [`XskSocket`] is an AF_XDP socket over a [`Umem`] with its four rings (fill, RX, TX,
//!   completion). A low-level layer moves raw descriptors (the caller owns every frame); a
//!   high-level layer keeps a frame pool and hands out received frames and TX buffers.
//! - [`frame`] parses and writes Ethernet/IPv4/UDP frames, checking every field a hostile sender
//!   controls.
//!
//! On veth (the testbed's links) native XDP works and AF_XDP runs in copy mode (veth has no
//! zero-copy; asking for it falls back). A datagram a local socket sends through a veth leaves
//! with a partial UDP checksum unless the sending end's transmit checksum offload is off
//! ([`set_tx_checksum_offload`]), or the receiver ignores UDP checksums
//! ([`frame::parse_udp_with`]).
//!
//! Nothing here panics on input from the network, and every resource is bounded: map sizes, ring
//! sizes and frame counts are fixed when created.

mod error;
pub mod frame;
mod loader;
mod netlink;
mod ring;
mod socket;
mod sys;
mod umem;

pub use error::XdpError;
pub use loader::{available, AttachMode, SteerCounters, Steering, MAX_QUEUES, MAX_STEERED};
pub use socket::{BusyPollStatus, KernelXskStats, XskConfig, XskSocket, XskStats};
pub use sys::set_tx_checksum_offload;
pub use umem::Umem;

#[doc(hidden)]
pub use loader::testing;

/// The runtime moves these to its worker threads.
#[allow(dead_code)]
fn _assert_send() {
    fn send<T: Send>() {}
    send::<Steering>();
    send::<XskSocket>();
    send::<Umem>();
}

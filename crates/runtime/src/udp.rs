//! A nonblocking UDP socket that receives and sends in batches with `recvmmsg`/`sendmmsg`.
//!
//! One system call moves up to [`BATCH_LEN`] datagrams. The socket owns its receive buffers
//! (one per batch slot, each larger than the largest UDP datagram, so truncation is detectable
//! and counted rather than silently cutting a packet) and an outgoing queue with a bound:
//! beyond it, datagrams are dropped and counted, never buffered without limit.

use std::collections::VecDeque;
use std::io;
use std::mem::{size_of, MaybeUninit};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};

use pmnet_proto::Transmit;
use pmnet_wire::PacketType;

/// Datagrams moved by one `recvmmsg` or `sendmmsg`.
pub const BATCH_LEN: usize = 32;

/// Bytes of each receive buffer: above the largest UDP payload (65 507 bytes), so a datagram
/// that does not fit is reported truncated by the kernel instead of being cut unnoticed.
const RECEIVE_BUFFER_LEN: usize = 65_536;

/// Packet-type slots of the per-type counters: index 0 is "not a PMNet datagram" (or a type of
/// a later function), 1..=0x0F the core protocol's type codes ([`PacketType`]).
pub const TYPE_SLOT_COUNT: usize = 0x10;

/// The counter slot of a datagram, from its magic and type byte alone (no checksum: the state
/// machines validate, and count what they reject).
pub fn type_slot(datagram: &[u8]) -> usize {
    if datagram.len() < pmnet_wire::HEADER_LEN || datagram[0..2] != pmnet_wire::MAGIC.to_be_bytes()
    {
        return 0;
    }
    match PacketType::from_code(datagram[3]) {
        Some(packet_type) if usize::from(packet_type.code()) < TYPE_SLOT_COUNT => {
            usize::from(packet_type.code())
        }
        _ => 0,
    }
}

/// The name of a counter slot, for metrics.
pub fn type_slot_name(slot: usize) -> &'static str {
    match PacketType::from_code(slot as u8) {
        Some(packet_type) if slot != 0 => packet_type.name(),
        _ => "other",
    }
}

/// What one socket counted; monotonically increasing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SocketCounters {
    pub received_by_type: [u64; TYPE_SLOT_COUNT],
    pub sent_by_type: [u64; TYPE_SLOT_COUNT],
    pub bytes_received: u64,
    pub bytes_sent: u64,
    /// `recvmmsg` calls that returned at least one datagram.
    pub receive_batches: u64,
    /// `sendmmsg` calls that sent at least one datagram.
    pub send_batches: u64,
    /// Datagrams larger than the receive buffer (dropped).
    pub truncated: u64,
    /// Datagrams from an address family the runtime does not handle (dropped).
    pub unknown_source: u64,
    /// Datagrams the kernel refused to send (dropped): unreachable network, wrong family, …
    pub send_errors: u64,
    /// Datagrams dropped because the outgoing queue was full.
    pub send_queue_full: u64,
    /// Receive calls that failed with an error other than "would block".
    pub receive_errors: u64,
}

impl SocketCounters {
    pub fn received_total(&self) -> u64 {
        self.received_by_type.iter().sum()
    }

    pub fn sent_total(&self) -> u64 {
        self.sent_by_type.iter().sum()
    }

    /// Add `other`'s counts to these (a datapath of several sockets reports their sum). Every
    /// field is named: a counter added later cannot be left out of the sum.
    pub fn add(&mut self, other: &SocketCounters) {
        let SocketCounters {
            received_by_type,
            sent_by_type,
            bytes_received,
            bytes_sent,
            receive_batches,
            send_batches,
            truncated,
            unknown_source,
            send_errors,
            send_queue_full,
            receive_errors,
        } = other;
        for (sum, more) in self.received_by_type.iter_mut().zip(received_by_type) {
            *sum += more;
        }
        for (sum, more) in self.sent_by_type.iter_mut().zip(sent_by_type) {
            *sum += more;
        }
        self.bytes_received += bytes_received;
        self.bytes_sent += bytes_sent;
        self.receive_batches += receive_batches;
        self.send_batches += send_batches;
        self.truncated += truncated;
        self.unknown_source += unknown_source;
        self.send_errors += send_errors;
        self.send_queue_full += send_queue_full;
        self.receive_errors += receive_errors;
    }
}

/// A nonblocking UDP socket with batched receive and send and a bounded outgoing queue.
pub struct BatchSocket {
    socket: UdpSocket,
    local_addr: SocketAddr,
    buffers: Vec<u8>,
    sources: Vec<Option<SocketAddr>>,
    lens: [usize; BATCH_LEN],
    truncated: [bool; BATCH_LEN],
    received_count: usize,
    /// Sent before `queue`: datagrams whose latency matters most (PMNet-ACKs).
    urgent: VecDeque<Transmit>,
    queue: VecDeque<Transmit>,
    max_queued: usize,
    /// The last send met a full socket buffer: wait for writability before trying again.
    write_blocked: bool,
    counters: SocketCounters,
    /// The kernel queues ICMP errors for this socket (`IP_RECVERR`): see
    /// [`BatchSocket::report_unreachable`].
    reports_unreachable: bool,
    /// A system call may have taken the socket's pending error while ICMP reports wait in its
    /// error queue: read the queue at the next receive.
    error_queue_pending: bool,
    /// Destinations the kernel reported unreachable, not yet taken.
    unreachable: Vec<Unreachable>,
}

/// A destination an ICMP error said cannot be reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unreachable {
    /// The destination of the datagram the ICMP error answered.
    pub addr: SocketAddr,
    /// Port unreachable: the host is there but nothing listens on the port. Otherwise the
    /// host or its network could not be reached.
    pub refused: bool,
}

/// Unreachable reports kept at most between two takes.
const UNREACHABLE_KEPT: usize = 64;

impl std::fmt::Debug for BatchSocket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchSocket")
            .field("local_addr", &self.local_addr)
            .field("queued", &self.queued_len())
            .field("counters", &self.counters)
            .finish()
    }
}

impl BatchSocket {
    /// Bind `addr` (port 0 picks a free port) and make the socket nonblocking. At most
    /// `max_queued` datagrams wait to be sent.
    pub fn bind(addr: SocketAddr, max_queued: usize) -> io::Result<BatchSocket> {
        let socket = UdpSocket::bind(addr)?;
        socket.set_nonblocking(true)?;
        let local_addr = socket.local_addr()?;
        // Larger kernel buffers absorb bursts while the loop is busy persisting; failure to
        // raise them is not fatal (the kernel caps them at net.core.[rw]mem_max).
        set_buffer_size(&socket, libc::SO_RCVBUF, 4 << 20);
        set_buffer_size(&socket, libc::SO_SNDBUF, 4 << 20);
        Ok(BatchSocket {
            socket,
            local_addr,
            buffers: vec![0; BATCH_LEN * RECEIVE_BUFFER_LEN],
            sources: vec![None; BATCH_LEN],
            lens: [0; BATCH_LEN],
            truncated: [false; BATCH_LEN],
            received_count: 0,
            urgent: VecDeque::new(),
            queue: VecDeque::new(),
            max_queued: max_queued.max(BATCH_LEN),
            write_blocked: false,
            counters: SocketCounters::default(),
            reports_unreachable: false,
            error_queue_pending: false,
            unreachable: Vec::new(),
        })
    }

    /// Have the kernel report ICMP errors for the datagrams this socket sends (`IP_RECVERR`):
    /// a destination where nothing listens (port unreachable) or that cannot be reached is
    /// then known within a round trip. Take the reports with [`BatchSocket::take_unreachable`].
    /// Where the option is not available the socket works as before, without reports.
    pub fn report_unreachable(&mut self) {
        let (level, option) = if self.local_addr.is_ipv4() {
            (libc::SOL_IP, libc::IP_RECVERR)
        } else {
            (libc::SOL_IPV6, libc::IPV6_RECVERR)
        };
        let on: libc::c_int = 1;
        // SAFETY: a plain setsockopt with an int argument on a socket we own.
        let result = unsafe {
            libc::setsockopt(
                self.socket.as_raw_fd(),
                level,
                option,
                (&on as *const libc::c_int).cast(),
                size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        self.reports_unreachable = result == 0;
    }

    /// The destinations reported unreachable since the last take (at most
    /// [`UNREACHABLE_KEPT`]; older reports beyond it are dropped). Reads the socket's error
    /// queue first if something may wait in it.
    pub fn take_unreachable(&mut self) -> Vec<Unreachable> {
        if self.error_queue_pending {
            self.read_error_queue();
        }
        std::mem::take(&mut self.unreachable)
    }

    /// Whether unreachable reports are waiting to be taken (cheap: no system call).
    pub fn has_unreachable(&self) -> bool {
        !self.unreachable.is_empty() || self.error_queue_pending
    }

    /// Note that another reader of this socket's descriptor met an error: ICMP reports may
    /// wait in the error queue.
    pub fn note_receive_error_elsewhere(&mut self) {
        if self.reports_unreachable {
            self.error_queue_pending = true;
        }
    }

    /// Read the socket's error queue (`MSG_ERRQUEUE`) empty, keeping what ICMP said about
    /// each destination. Reading it also clears the socket's pending error, so that sends
    /// and receives work again and `poll` stops reporting it.
    fn read_error_queue(&mut self) {
        self.error_queue_pending = false;
        for _ in 0..UNREACHABLE_KEPT * 4 {
            // SAFETY: zeroed msghdr and sockaddr_storage are valid; every pointer set below
            // points at these locals, which outlive the call.
            let mut addr: libc::sockaddr_storage = unsafe { MaybeUninit::zeroed().assume_init() };
            let mut payload = [0u8; 64];
            let mut iovec = libc::iovec {
                iov_base: payload.as_mut_ptr().cast(),
                iov_len: payload.len(),
            };
            let mut control = [0u64; 64];
            let mut header: libc::msghdr = unsafe { MaybeUninit::zeroed().assume_init() };
            header.msg_name = (&mut addr as *mut libc::sockaddr_storage).cast();
            header.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            header.msg_iov = &mut iovec;
            header.msg_iovlen = 1;
            header.msg_control = control.as_mut_ptr().cast();
            header.msg_controllen = size_of::<[u64; 64]>() as _;
            // SAFETY: the header describes live buffers.
            let result = unsafe {
                libc::recvmsg(
                    self.socket.as_raw_fd(),
                    &mut header,
                    libc::MSG_ERRQUEUE | libc::MSG_DONTWAIT,
                )
            };
            if result < 0 {
                if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return;
            }
            let Some(destination) = socket_addr_from(&addr) else {
                continue;
            };
            // SAFETY: CMSG_FIRSTHDR/CMSG_NXTHDR walk the control buffer the kernel filled, as
            // far as msg_controllen says; the error is read unaligned.
            let mut cmsg = unsafe { libc::CMSG_FIRSTHDR(&header) };
            while !cmsg.is_null() {
                let (level, kind) = unsafe { ((*cmsg).cmsg_level, (*cmsg).cmsg_type) };
                if (level == libc::SOL_IP && kind == libc::IP_RECVERR)
                    || (level == libc::SOL_IPV6 && kind == libc::IPV6_RECVERR)
                {
                    let error: libc::sock_extended_err =
                        unsafe { std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast()) };
                    let from_icmp = error.ee_origin == libc::SO_EE_ORIGIN_ICMP
                        || error.ee_origin == libc::SO_EE_ORIGIN_ICMP6;
                    if from_icmp && self.unreachable.len() < UNREACHABLE_KEPT {
                        let report = Unreachable {
                            addr: destination,
                            refused: error.ee_errno == libc::ECONNREFUSED as u32,
                        };
                        if !self.unreachable.contains(&report) {
                            self.unreachable.push(report);
                        }
                    }
                }
                cmsg = unsafe { libc::CMSG_NXTHDR(&header, cmsg) };
            }
        }
    }

    /// Whether `error` is one an ICMP report leaves on the socket (with reports on): the
    /// report is read from the error queue, and the call that met it is tried again.
    fn is_icmp_report(&self, error: &io::Error) -> bool {
        self.reports_unreachable
            && matches!(
                error.raw_os_error(),
                Some(libc::ECONNREFUSED | libc::EHOSTUNREACH | libc::ENETUNREACH)
            )
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    pub fn raw_fd(&self) -> RawFd {
        self.socket.as_raw_fd()
    }

    pub fn counters(&self) -> &SocketCounters {
        &self.counters
    }

    /// Count a datagram that another reader took from this socket's descriptor (the packet
    /// store receives straight into its slots), so the socket's counters stay true.
    pub fn count_received_elsewhere(&mut self, datagram: &[u8]) {
        self.counters.received_by_type[type_slot(datagram)] += 1;
        self.counters.bytes_received += datagram.len() as u64;
    }

    /// Count a receive batch that another reader made on this socket's descriptor.
    pub fn count_receive_batch_elsewhere(&mut self) {
        self.counters.receive_batches += 1;
    }

    /// Datagrams waiting to be sent.
    pub fn queued_len(&self) -> usize {
        self.urgent.len() + self.queue.len()
    }

    /// Whether the last send met a full socket buffer (the loop should wait for POLLOUT).
    pub fn is_write_blocked(&self) -> bool {
        self.write_blocked && self.queued_len() > 0
    }

    /// Receive up to [`BATCH_LEN`] datagrams without blocking; returns how many arrived
    /// (0 when none were waiting). Read them with [`BatchSocket::received`].
    pub fn receive_batch(&mut self) -> usize {
        self.receive_batch_up_to(BATCH_LEN)
    }

    /// [`BatchSocket::receive_batch`], taking at most `limit` datagrams (at most
    /// [`BATCH_LEN`]); the rest stay in the kernel's socket buffer, in order.
    pub fn receive_batch_up_to(&mut self, limit: usize) -> usize {
        self.received_count = 0;
        let limit = limit.min(BATCH_LEN);
        if limit == 0 {
            return 0;
        }
        // SAFETY: zeroed iovec, mmsghdr and sockaddr_storage are valid (all-integer/pointer
        // plain C structs); every pointer set below points into `self` or these locals, which
        // outlive the call.
        let mut iovecs: [libc::iovec; BATCH_LEN] = unsafe { MaybeUninit::zeroed().assume_init() };
        let mut headers: [libc::mmsghdr; BATCH_LEN] =
            unsafe { MaybeUninit::zeroed().assume_init() };
        let mut addrs: [libc::sockaddr_storage; BATCH_LEN] =
            unsafe { MaybeUninit::zeroed().assume_init() };
        let base = self.buffers.as_mut_ptr();
        for (index, iovec) in iovecs.iter_mut().enumerate() {
            *iovec = libc::iovec {
                // SAFETY: index * RECEIVE_BUFFER_LEN + RECEIVE_BUFFER_LEN <= buffers.len().
                iov_base: unsafe { base.add(index * RECEIVE_BUFFER_LEN) }.cast(),
                iov_len: RECEIVE_BUFFER_LEN,
            };
        }
        for index in 0..BATCH_LEN {
            let header = &mut headers[index].msg_hdr;
            header.msg_name = (&mut addrs[index] as *mut libc::sockaddr_storage).cast();
            header.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            header.msg_iov = &mut iovecs[index];
            header.msg_iovlen = 1;
        }
        let count = loop {
            // SAFETY: headers describe BATCH_LEN valid buffers and address slots.
            let count = unsafe {
                libc::recvmmsg(
                    self.socket.as_raw_fd(),
                    headers.as_mut_ptr(),
                    limit as libc::c_uint,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                )
            };
            if count >= 0 {
                break count as usize;
            }
            let error = io::Error::last_os_error();
            if self.is_icmp_report(&error) {
                // Not a failure of this socket: a destination it sent to is unreachable.
                self.read_error_queue();
                continue;
            }
            match error.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock => {
                    if self.error_queue_pending {
                        self.read_error_queue();
                    }
                    return 0;
                }
                _ => {
                    // ICMP errors queued on the socket and the like: count and carry on; the
                    // next call returns datagrams again.
                    self.counters.receive_errors += 1;
                    return 0;
                }
            }
        };
        for index in 0..count {
            let len = headers[index].msg_len as usize;
            let truncated = headers[index].msg_hdr.msg_flags & libc::MSG_TRUNC != 0;
            self.lens[index] = len.min(RECEIVE_BUFFER_LEN);
            self.truncated[index] = truncated;
            self.sources[index] = socket_addr_from(&addrs[index]);
            if truncated {
                self.counters.truncated += 1;
            } else if self.sources[index].is_none() {
                self.counters.unknown_source += 1;
            } else {
                let datagram = &self.buffers
                    [index * RECEIVE_BUFFER_LEN..index * RECEIVE_BUFFER_LEN + self.lens[index]];
                self.counters.received_by_type[type_slot(datagram)] += 1;
                self.counters.bytes_received += len as u64;
            }
        }
        if count > 0 {
            self.counters.receive_batches += 1;
        }
        self.received_count = count;
        count
    }

    /// Datagram `index` of the last batch, with its source; `None` if it was truncated or its
    /// source could not be read (both counted).
    pub fn received(&self, index: usize) -> Option<(SocketAddr, &[u8])> {
        if index >= self.received_count || self.truncated[index] {
            return None;
        }
        let source = self.sources[index]?;
        let start = index * RECEIVE_BUFFER_LEN;
        Some((source, &self.buffers[start..start + self.lens[index]]))
    }

    /// Queue a datagram. PMNet-ACKs go ahead of everything else: the client waits on them,
    /// while forwards to the server and the rest are off the client's critical path.
    pub fn enqueue(&mut self, transmit: Transmit) {
        if self.queued_len() >= self.max_queued {
            self.counters.send_queue_full += 1;
            return;
        }
        if type_slot(&transmit.bytes) == usize::from(PacketType::PmnetAck.code()) {
            self.urgent.push_back(transmit);
        } else {
            self.queue.push_back(transmit);
        }
    }

    /// Send queued datagrams in batches until the queue is empty or the socket buffer is full.
    /// Returns how many were sent.
    pub fn flush(&mut self) -> usize {
        let mut sent_total = 0;
        self.write_blocked = false;
        while self.queued_len() > 0 {
            match self.send_one_batch() {
                Ok(0) => {
                    self.write_blocked = true;
                    break;
                }
                Ok(sent) => sent_total += sent,
                Err(()) => {
                    // The first datagram was refused: drop it (counted) and go on.
                    self.counters.send_errors += 1;
                    if self.urgent.pop_front().is_none() {
                        self.queue.pop_front();
                    }
                }
            }
        }
        sent_total
    }

    /// One `sendmmsg` of up to [`BATCH_LEN`] queued datagrams, urgent ones first. `Ok(0)` when
    /// the socket buffer is full; `Err` when the kernel refused the first datagram.
    fn send_one_batch(&mut self) -> Result<usize, ()> {
        // SAFETY: as in `receive_batch`: zeroed C structs are valid.
        let mut iovecs: [libc::iovec; BATCH_LEN] = unsafe { MaybeUninit::zeroed().assume_init() };
        let mut headers: [libc::mmsghdr; BATCH_LEN] =
            unsafe { MaybeUninit::zeroed().assume_init() };
        let mut addrs: [libc::sockaddr_storage; BATCH_LEN] =
            unsafe { MaybeUninit::zeroed().assume_init() };
        let mut count = 0;
        for transmit in self.urgent.iter().chain(self.queue.iter()).take(BATCH_LEN) {
            let addr_len = socket_addr_to(transmit.destination, &mut addrs[count]);
            iovecs[count] = libc::iovec {
                iov_base: transmit.bytes.as_ptr() as *mut libc::c_void,
                iov_len: transmit.bytes.len(),
            };
            count += 1;
            let header = &mut headers[count - 1].msg_hdr;
            header.msg_namelen = addr_len;
        }
        for index in 0..count {
            let header = &mut headers[index].msg_hdr;
            header.msg_name = (&mut addrs[index] as *mut libc::sockaddr_storage).cast();
            header.msg_iov = &mut iovecs[index];
            header.msg_iovlen = 1;
        }
        let mut icmp_retries = 0;
        let sent = loop {
            // SAFETY: `count` headers, each pointing at a live datagram and address.
            let sent = unsafe {
                libc::sendmmsg(
                    self.socket.as_raw_fd(),
                    headers.as_mut_ptr(),
                    count as libc::c_uint,
                    libc::MSG_DONTWAIT,
                )
            };
            if sent >= 0 {
                break sent as usize;
            }
            let error = io::Error::last_os_error();
            if self.is_icmp_report(&error) && icmp_retries < 4 {
                // The socket's pending error was an ICMP report about an earlier datagram,
                // not about these: read the report, and send them again.
                icmp_retries += 1;
                self.read_error_queue();
                continue;
            }
            match error.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock => return Ok(0),
                _ => return Err(()),
            }
        };
        if sent < count && self.reports_unreachable {
            // A send that stopped short may have taken the socket's pending error.
            self.error_queue_pending = true;
        }
        for _ in 0..sent {
            let transmit = self
                .urgent
                .pop_front()
                .or_else(|| self.queue.pop_front())
                .expect("sent datagrams were queued");
            self.counters.sent_by_type[type_slot(&transmit.bytes)] += 1;
            self.counters.bytes_sent += transmit.bytes.len() as u64;
        }
        if sent > 0 {
            self.counters.send_batches += 1;
        }
        Ok(sent)
    }
}

fn set_buffer_size(socket: &UdpSocket, option: libc::c_int, bytes: libc::c_int) {
    // SAFETY: a plain setsockopt with an int argument on a socket we own.
    let _ = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            option,
            (&bytes as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
}

/// The socket address the kernel wrote into `storage`, if it is IPv4 or IPv6.
fn socket_addr_from(storage: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match libc::c_int::from(storage.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in; storage is large enough
            // and suitably aligned for any sockaddr.
            let addr = unsafe { &*(storage as *const _ as *const libc::sockaddr_in) };
            let ip = Ipv4Addr::from(u32::from_be(addr.sin_addr.s_addr));
            Some(SocketAddr::V4(SocketAddrV4::new(
                ip,
                u16::from_be(addr.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: as above, for sockaddr_in6.
            let addr = unsafe { &*(storage as *const _ as *const libc::sockaddr_in6) };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(addr.sin6_addr.s6_addr),
                u16::from_be(addr.sin6_port),
                u32::from_be(addr.sin6_flowinfo),
                addr.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// Write `addr` into `storage`; returns the length to pass to the kernel.
fn socket_addr_to(addr: SocketAddr, storage: &mut libc::sockaddr_storage) -> libc::socklen_t {
    match addr {
        SocketAddr::V4(v4) => {
            // SAFETY: storage is large enough and aligned for a sockaddr_in.
            let out = unsafe { &mut *(storage as *mut _ as *mut libc::sockaddr_in) };
            out.sin_family = libc::AF_INET as libc::sa_family_t;
            out.sin_port = v4.port().to_be();
            out.sin_addr = libc::in_addr {
                s_addr: u32::from(*v4.ip()).to_be(),
            };
            size_of::<libc::sockaddr_in>() as libc::socklen_t
        }
        SocketAddr::V6(v6) => {
            // SAFETY: as above, for sockaddr_in6.
            let out = unsafe { &mut *(storage as *mut _ as *mut libc::sockaddr_in6) };
            out.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            out.sin6_port = v6.port().to_be();
            out.sin6_flowinfo = v6.flowinfo().to_be();
            out.sin6_addr = libc::in6_addr {
                s6_addr: v6.ip().octets(),
            };
            out.sin6_scope_id = v6.scope_id();
            size_of::<libc::sockaddr_in6>() as libc::socklen_t
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loopback() -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], 0))
    }

    #[test]
    fn every_packet_type_has_a_counter_slot_of_its_own() {
        let mut slots = std::collections::BTreeSet::new();
        for packet_type in PacketType::ALL {
            let datagram = pmnet_wire::Header::new(packet_type, 1, 1, 1).encode(&[]);
            let slot = type_slot(&datagram);
            assert!(slot > 0 && slot < TYPE_SLOT_COUNT, "{packet_type}");
            assert!(slots.insert(slot), "{packet_type} shares a slot");
            assert_eq!(type_slot_name(slot), packet_type.name());
        }
        let mut later = pmnet_wire::Header::new(PacketType::UpdateRequest, 1, 1, 1).encode(&[]);
        later[3] = 0x30;
        assert_eq!(type_slot(&later), 0);
    }

    #[test]
    fn a_batch_goes_out_and_comes_back_in_order() {
        let mut sender = BatchSocket::bind(loopback(), 1024).unwrap();
        let mut receiver = BatchSocket::bind(loopback(), 1024).unwrap();
        for index in 0..40u8 {
            sender.enqueue(Transmit {
                destination: receiver.local_addr(),
                bytes: vec![index; 10 + usize::from(index)],
            });
        }
        assert_eq!(sender.flush(), 40);
        let mut got = Vec::new();
        // Loopback delivers synchronously inside sendmmsg: everything is queued by now.
        while got.len() < 40 {
            let count = receiver.receive_batch();
            assert!(
                count > 0,
                "loopback datagrams are queued by the time send returns"
            );
            for index in 0..count {
                let (from, bytes) = receiver.received(index).unwrap();
                assert_eq!(from, sender.local_addr());
                got.push(bytes.to_vec());
            }
        }
        for (index, bytes) in got.iter().enumerate() {
            assert_eq!(bytes, &vec![index as u8; 10 + index]);
        }
        assert_eq!(receiver.counters().received_by_type[0], 40);
        assert!(receiver.counters().receive_batches >= 2);
    }

    #[test]
    fn pmnet_acks_jump_the_queue() {
        let mut sender = BatchSocket::bind(loopback(), 1024).unwrap();
        let mut receiver = BatchSocket::bind(loopback(), 1024).unwrap();
        let destination = receiver.local_addr();
        let update =
            pmnet_wire::Header::new(PacketType::UpdateRequest, 1, 9, 1).encode(b"forwarded");
        let ack = pmnet_wire::Header::new(PacketType::PmnetAck, 1, 9, 1).encode(&[]);
        sender.enqueue(Transmit {
            destination,
            bytes: update.clone(),
        });
        sender.enqueue(Transmit {
            destination,
            bytes: ack.clone(),
        });
        sender.flush();
        assert_eq!(receiver.receive_batch(), 2);
        assert_eq!(receiver.received(0).unwrap().1, &ack[..]);
        assert_eq!(receiver.received(1).unwrap().1, &update[..]);
        assert_eq!(
            receiver.counters().received_by_type[usize::from(PacketType::PmnetAck.code())],
            1
        );
    }

    #[test]
    fn a_refused_destination_is_counted_and_the_rest_still_go() {
        let mut sender = BatchSocket::bind(loopback(), 1024).unwrap();
        let mut receiver = BatchSocket::bind(loopback(), 1024).unwrap();
        // An IPv6 destination from an IPv4 socket is refused by the kernel.
        sender.enqueue(Transmit {
            destination: "[::1]:9".parse().unwrap(),
            bytes: vec![1],
        });
        sender.enqueue(Transmit {
            destination: receiver.local_addr(),
            bytes: vec![2],
        });
        sender.flush();
        assert_eq!(sender.counters().send_errors, 1);
        assert_eq!(receiver.receive_batch(), 1);
        assert_eq!(receiver.received(0).unwrap().1, &[2]);
    }

    #[test]
    fn a_port_where_nothing_listens_is_reported_and_sending_goes_on() {
        let mut sender = BatchSocket::bind(loopback(), 1024).unwrap();
        sender.report_unreachable();
        let closed = BatchSocket::bind(loopback(), 32).unwrap().local_addr();
        let mut receiver = BatchSocket::bind(loopback(), 1024).unwrap();
        sender.enqueue(Transmit {
            destination: closed,
            bytes: vec![1],
        });
        sender.flush();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let mut reports = Vec::new();
        while reports.is_empty() && std::time::Instant::now() < deadline {
            sender.receive_batch();
            reports = sender.take_unreachable();
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(
            reports,
            [Unreachable {
                addr: closed,
                refused: true
            }]
        );
        sender.enqueue(Transmit {
            destination: receiver.local_addr(),
            bytes: vec![2],
        });
        sender.flush();
        assert_eq!(sender.counters().send_errors, 0);
        assert_eq!(receiver.receive_batch(), 1);
    }

    #[test]
    fn the_queue_is_bounded() {
        let mut sender = BatchSocket::bind(loopback(), 32).unwrap();
        for _ in 0..40 {
            sender.enqueue(Transmit {
                destination: loopback(),
                bytes: vec![0],
            });
        }
        assert_eq!(sender.queued_len(), 32);
        assert_eq!(sender.counters().send_queue_full, 8);
    }
}

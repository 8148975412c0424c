//! The AF_XDP datapath of a device (docs/inpath.md): an XDP program on each of the device's
//! interfaces steers the datagrams addressed to the device (and, in path, to its servers) to an
//! AF_XDP socket; everything else goes on to the kernel, which routes it as before.
//!
//! What arrives on the sockets' rings is parsed here (Ethernet, IPv4, UDP: every frame that
//! does not parse is counted by reason and dropped) and handed to the state machines as a
//! datagram from its source address, as a UDP socket would. What the state machines send goes
//! out as a frame on the interface the destination is on, when this datapath has seen a frame
//! from it there (the neighbour's MAC address, learned only from frames of addresses on that
//! interface's own subnet, so a frame cannot claim a neighbour on another port); otherwise,
//! and whenever a frame does not fit, through the kernel's UDP socket (which also takes what
//! was not steered).
//!
//! In path, the device speaks for its servers: a client addresses a server and gets its
//! answers from that address (the device writes the server's address as the source, as a
//! switch that acknowledges does); towards the servers it is the device they are configured
//! with, at its own address on the interface they are on.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};

use pmnet_proto::Transmit;
use pmnet_xdp::frame::{self, UdpChecksum, FRAME_OVERHEAD};
use pmnet_xdp::{AttachMode, Steering, Umem, XskConfig, XskSocket};

use crate::udp::{type_slot, BatchSocket, SocketCounters, Unreachable, BATCH_LEN};

/// Neighbours (addresses whose interface and MAC address are known) kept at most; past it the
/// table starts again (a sender cannot make it grow).
const NEIGHBOURS_MAX: usize = 65_536;
/// Clients whose addressed server is remembered at most.
const CLIENTS_MAX: usize = 65_536;
/// UMEM frames per interface (half for receiving, half for sending) and their size.
const FRAMES_PER_PORT: u32 = 4096;
const FRAME_SIZE: u32 = 2048;
/// IPv4 time to live of the frames the device sends.
const TTL: u8 = 64;

/// How a device uses AF_XDP.
#[derive(Debug, Clone)]
pub struct XdpOptions {
    /// The interfaces the device serves on (an XDP program and an AF_XDP socket on each).
    pub interfaces: Vec<String>,
    /// In path: also steer what clients send to the servers, and answer them as the server.
    pub in_path: bool,
    /// Native (driver) XDP or generic (skb) XDP.
    pub mode: AttachMode,
    /// Ask for zero-copy sockets (the driver may refuse; copy mode then).
    pub zero_copy: bool,
    /// Busy-poll the sockets (`SO_PREFER_BUSY_POLL`, `SO_BUSY_POLL`).
    pub busy_poll: bool,
}

/// One interface: its XDP program, its socket and what the device is on it.
struct Port {
    name: String,
    mac: [u8; 6],
    addr: Ipv4Addr,
    prefix: u8,
    mtu: usize,
    /// Kept for as long as the port: dropping it detaches the program.
    steering: Steering,
    socket: XskSocket,
}

impl Port {
    fn on_link(&self, ip: Ipv4Addr) -> bool {
        let mask = u32::MAX
            .checked_shl(32 - u32::from(self.prefix))
            .unwrap_or(0);
        u32::from(ip) & mask == u32::from(self.addr) & mask
    }
}

/// A datagram of the current receive batch.
#[derive(Debug, Clone, Copy)]
enum Received {
    /// Frame `index` of port `port`'s batch, its UDP payload at `start..start + len`.
    Frame {
        port: usize,
        index: usize,
        from: SocketAddr,
        start: usize,
        len: usize,
    },
    /// Datagram `index` of the kernel socket's batch.
    Kernel(usize),
}

/// What the AF_XDP datapath counted, beside the datagram counters every socket keeps.
#[derive(Debug, Clone, Default)]
pub struct XdpCounters {
    /// Frames from the rings that did not parse, by reason.
    pub malformed: HashMap<&'static str, u64>,
    /// Datagrams sent as frames on an interface.
    pub frames_sent: u64,
    /// Datagrams sent through the kernel's socket instead: no neighbour known, too large, or
    /// the ring full.
    pub sent_through_kernel: u64,
    /// Of those, because the transmit ring had no room.
    pub tx_ring_full: u64,
    /// Neighbour table restarts (it filled up).
    pub neighbour_resets: u64,
}

/// The datapath: the ports' AF_XDP sockets and the kernel's UDP socket.
pub struct XdpPath {
    ports: Vec<Port>,
    kernel: BatchSocket,
    listen_port: u16,
    in_path: bool,
    /// The servers, by id, and as a set (what is sent to them leaves from the device's own
    /// address).
    servers: HashMap<u16, SocketAddrV4>,
    neighbours: HashMap<Ipv4Addr, (usize, [u8; 6])>,
    /// The server each client last addressed (in path, the source of what goes back to it).
    addressed: HashMap<SocketAddrV4, SocketAddrV4>,
    batch: Vec<Received>,
    kernel_count: usize,
    counters: SocketCounters,
    xdp: XdpCounters,
}

impl std::fmt::Debug for XdpPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XdpPath")
            .field(
                "ports",
                &self
                    .ports
                    .iter()
                    .map(|p| p.name.as_str())
                    .collect::<Vec<_>>(),
            )
            .field("in_path", &self.in_path)
            .field("counters", &self.counters)
            .finish()
    }
}

/// Why the AF_XDP datapath could not start.
#[derive(Debug, thiserror::Error)]
pub enum XdpPathError {
    #[error("interface {name}: {why}")]
    Interface { name: String, why: String },
    #[error("{0}")]
    Xdp(#[from] pmnet_xdp::XdpError),
    #[error("{0}")]
    Config(String),
}

impl XdpPath {
    /// Attach the XDP program to each interface, open its socket and steer to it the device's
    /// own address (and, in path, the servers'). `kernel` is the device's UDP socket, bound to
    /// its listen address.
    pub fn open(
        options: &XdpOptions,
        kernel: BatchSocket,
        servers: &[(u16, SocketAddr)],
    ) -> Result<XdpPath, XdpPathError> {
        pmnet_xdp::available()?;
        if options.interfaces.is_empty() {
            return Err(XdpPathError::Config(
                "--xdp needs at least one interface".into(),
            ));
        }
        let listen = kernel.local_addr();
        let SocketAddr::V4(listen_v4) = listen else {
            return Err(XdpPathError::Config(format!(
                "the AF_XDP datapath serves IPv4 only; the device listens on {listen}"
            )));
        };
        let mut server_map = HashMap::new();
        for (id, addr) in servers {
            let SocketAddr::V4(v4) = addr else {
                return Err(XdpPathError::Config(format!(
                    "the AF_XDP datapath serves IPv4 only; server {id} is at {addr}"
                )));
            };
            server_map.insert(*id, *v4);
        }
        let mut ports = Vec::new();
        for name in &options.interfaces {
            let info = interface_info(name)?;
            if !listen_v4.ip().is_unspecified() && *listen_v4.ip() != info.addr {
                // The device answers at its listen address only; on this interface it has
                // another. Steer that one all the same: the kernel socket would not get it.
                tracing::debug!(interface = %name, "listen address is not this interface's");
            }
            let mut steering = Steering::attach(name, options.mode)?;
            steering.steer(SocketAddrV4::new(info.addr, listen_v4.port()))?;
            if options.in_path {
                for server in server_map.values() {
                    steering.steer(*server)?;
                }
            }
            let umem = Umem::anonymous(FRAMES_PER_PORT, FRAME_SIZE)?;
            let config = XskConfig {
                busy_poll: options.busy_poll,
                zero_copy: options.zero_copy,
                ..XskConfig::default()
            };
            let socket = XskSocket::open(name, umem, config)?;
            steering.register(0, &socket)?;
            tracing::info!(
                interface = %name,
                address = %info.addr,
                mode = ?options.mode,
                "AF_XDP datapath attached"
            );
            ports.push(Port {
                name: name.clone(),
                mac: info.mac,
                addr: info.addr,
                prefix: info.prefix,
                mtu: info.mtu,
                steering,
                socket,
            });
        }
        Ok(XdpPath {
            ports,
            kernel,
            listen_port: listen_v4.port(),
            in_path: options.in_path,
            servers: server_map,
            neighbours: HashMap::new(),
            addressed: HashMap::new(),
            batch: Vec::with_capacity(BATCH_LEN * 2),
            kernel_count: 0,
            counters: SocketCounters::default(),
            xdp: XdpCounters::default(),
        })
    }

    /// Receive what waits on every socket (at most a batch each); returns how many datagrams.
    pub fn receive_batch(&mut self) -> usize {
        for port in &mut self.ports {
            port.socket.release_batch();
        }
        self.batch.clear();
        for port_index in 0..self.ports.len() {
            let count = self.ports[port_index].socket.receive_batch(BATCH_LEN);
            for index in 0..count {
                self.take_frame(port_index, index);
            }
        }
        self.kernel_count = self.kernel.receive_batch();
        for index in 0..self.kernel_count {
            self.batch.push(Received::Kernel(index));
        }
        self.batch.len()
    }

    fn take_frame(&mut self, port_index: usize, index: usize) {
        let port = &self.ports[port_index];
        let Some(bytes) = port.socket.received(index) else {
            return;
        };
        // The UDP checksum is not looked at: a local sender's frames through a veth carry
        // only its pseudo-header sum (transmit offload), and every PMNet datagram carries a
        // CRC32C of its own, which the state machines check.
        let parsed = match frame::parse_udp_with(bytes, UdpChecksum::Ignore) {
            Ok(parsed) => parsed,
            Err(error) => {
                *self.xdp.malformed.entry(error.name()).or_default() += 1;
                return;
            }
        };
        let start = parsed.payload.as_ptr() as usize - bytes.as_ptr() as usize;
        let len = parsed.payload.len();
        let (src, dst, src_mac) = (parsed.src, parsed.dst, parsed.src_mac);
        // Reverse-path check, as a router's strict rp_filter (which frames taken off the wire
        // here never meet): a source on another port's subnet cannot come in on this one. A
        // client cannot pass for a server this way (nor divert its neighbour entry).
        let here = port.on_link(*src.ip());
        if !here
            && self
                .ports
                .iter()
                .enumerate()
                .any(|(other, p)| other != port_index && p.on_link(*src.ip()))
        {
            *self
                .xdp
                .malformed
                .entry("source_on_another_port")
                .or_default() += 1;
            return;
        }
        self.counters.received_by_type[type_slot(parsed.payload)] += 1;
        self.counters.bytes_received += len as u64;
        if here {
            if self.neighbours.len() >= NEIGHBOURS_MAX && !self.neighbours.contains_key(src.ip()) {
                self.neighbours.clear();
                self.xdp.neighbour_resets += 1;
            }
            self.neighbours.insert(*src.ip(), (port_index, src_mac));
        }
        if self.in_path && dst.port() != self.listen_port {
            if self.addressed.len() >= CLIENTS_MAX && !self.addressed.contains_key(&src) {
                self.addressed.clear();
            }
            self.addressed.insert(src, dst);
        }
        self.batch.push(Received::Frame {
            port: port_index,
            index,
            from: SocketAddr::V4(src),
            start,
            len,
        });
    }

    /// Datagram `index` of the batch: its source and bytes.
    pub fn received(&self, index: usize) -> Option<(SocketAddr, &[u8])> {
        match *self.batch.get(index)? {
            Received::Frame {
                port,
                index,
                from,
                start,
                len,
            } => {
                let bytes = self.ports[port].socket.received(index)?;
                Some((from, bytes.get(start..start + len)?))
            }
            Received::Kernel(index) => self.kernel.received(index),
        }
    }

    /// Send `transmit`: as a frame where the destination's neighbour is known, else through
    /// the kernel.
    pub fn enqueue(&mut self, transmit: Transmit) {
        let SocketAddr::V4(destination) = transmit.destination else {
            self.kernel.enqueue(transmit);
            return;
        };
        let Some(&(port_index, mac)) = self.neighbours.get(destination.ip()) else {
            self.through_kernel(transmit);
            return;
        };
        let source = self.source_for(port_index, destination, &transmit.bytes);
        let port = &mut self.ports[port_index];
        // The IPv4 packet within the interface's MTU, the frame within a UMEM frame (a jumbo
        // MTU allows datagrams larger than a frame): else the kernel sends it, fragmenting.
        if transmit.bytes.len() + FRAME_OVERHEAD - 14 > port.mtu
            || transmit.bytes.len() + FRAME_OVERHEAD > FRAME_SIZE as usize
        {
            self.through_kernel(transmit);
            return;
        }
        let (port_mac, payload) = (port.mac, &transmit.bytes);
        let mut sent = port.socket.transmit_with(|buffer| {
            frame::write_udp(buffer, port_mac, mac, source, destination, TTL, payload).unwrap_or(0)
        });
        if sent.is_err() {
            // The ring (or the frames) ran out: reap what the kernel sent, and try once more.
            port.socket.flush();
            sent = port.socket.transmit_with(|buffer| {
                frame::write_udp(buffer, port_mac, mac, source, destination, TTL, payload)
                    .unwrap_or(0)
            });
        }
        match sent {
            Ok(()) => {
                self.xdp.frames_sent += 1;
                self.counters.sent_by_type[type_slot(&transmit.bytes)] += 1;
                self.counters.bytes_sent += transmit.bytes.len() as u64;
            }
            Err(_) => {
                self.xdp.tx_ring_full += 1;
                self.through_kernel(transmit);
            }
        }
    }

    fn through_kernel(&mut self, transmit: Transmit) {
        self.xdp.sent_through_kernel += 1;
        self.kernel.enqueue(transmit);
    }

    /// The source address of what goes to `destination`: a server hears from the device at
    /// its own address on the port; in path, a client hears from the server it addressed (the
    /// one the datagram's header names, else the one it last addressed).
    fn source_for(&self, port: usize, destination: SocketAddrV4, bytes: &[u8]) -> SocketAddrV4 {
        let own = SocketAddrV4::new(self.ports[port].addr, self.listen_port);
        if !self.in_path || self.servers.values().any(|server| *server == destination) {
            return own;
        }
        let named = pmnet_wire::Header::parse(bytes)
            .ok()
            .and_then(|(header, _)| self.servers.get(&header.server_id).copied());
        named
            .or_else(|| self.addressed.get(&destination).copied())
            .unwrap_or(own)
    }

    /// Send what is queued: kick the rings, reap their completions, flush the kernel socket.
    pub fn flush(&mut self) -> usize {
        for port in &mut self.ports {
            port.socket.flush();
        }
        self.kernel.flush()
    }

    /// Descriptors to wait on: each port's socket, then the kernel's.
    pub fn raw_fds(&self) -> Vec<std::os::fd::RawFd> {
        self.ports
            .iter()
            .map(|port| port.socket.raw_fd())
            .chain(std::iter::once(self.kernel.raw_fd()))
            .collect()
    }

    pub fn kernel(&self) -> &BatchSocket {
        &self.kernel
    }

    pub fn kernel_mut(&mut self) -> &mut BatchSocket {
        &mut self.kernel
    }

    pub fn queued_len(&self) -> usize {
        self.kernel.queued_len()
    }

    pub fn is_write_blocked(&self) -> bool {
        self.kernel.is_write_blocked()
    }

    pub fn has_unreachable(&self) -> bool {
        self.kernel.has_unreachable()
    }

    pub fn take_unreachable(&mut self) -> Vec<Unreachable> {
        self.kernel.take_unreachable()
    }

    /// Every datagram counted: the rings' and the kernel socket's.
    pub fn counters(&self) -> SocketCounters {
        let mut total = self.counters.clone();
        total.add(self.kernel.counters());
        total
    }

    pub fn xdp_counters(&self) -> &XdpCounters {
        &self.xdp
    }

    /// The XDP programs' counters, summed over the ports: (steered, passed, malformed).
    pub fn steering_counters(&self) -> (u64, u64, u64) {
        self.ports.iter().fold((0, 0, 0), |(s, p, m), port| {
            let counters = port.steering.counters();
            (
                s + counters.steered,
                p + counters.passed,
                m + counters.malformed,
            )
        })
    }

    /// The datapath, for the start-up banner: each interface, its address, the XDP mode and
    /// the socket's copy mode; in path or not.
    pub fn describe(&self) -> String {
        let ports = self
            .ports
            .iter()
            .map(|port| {
                format!(
                    "{} {}/{} ({:?} XDP, {}{})",
                    port.name,
                    port.addr,
                    port.prefix,
                    port.steering.mode(),
                    if port.socket.zero_copy() {
                        "zero-copy"
                    } else {
                        "copy mode"
                    },
                    if port.socket.busy_poll().usecs.is_some() {
                        ", busy-poll"
                    } else {
                        ""
                    }
                )
            })
            .collect::<Vec<_>>()
            .join(", ");
        format!(
            "AF_XDP on {ports}; {}",
            if self.in_path {
                "in path (clients address the servers; other traffic passes to the kernel)"
            } else {
                "clients address the device"
            }
        )
    }
}

/// Whether the AF_XDP datapath can run here (the XDP program built in, the privileges, AF_XDP
/// sockets in the kernel), and if not, why.
pub fn xdp_available() -> Result<(), String> {
    pmnet_xdp::available().map_err(|error| error.to_string())
}

/// What the device is on an interface.
struct InterfaceInfo {
    mac: [u8; 6],
    addr: Ipv4Addr,
    prefix: u8,
    mtu: usize,
}

/// The MAC address, MTU (from sysfs) and first IPv4 address with its prefix (getifaddrs) of
/// interface `name`.
fn interface_info(name: &str) -> Result<InterfaceInfo, XdpPathError> {
    let fail = |why: String| XdpPathError::Interface {
        name: name.to_owned(),
        why,
    };
    if name.is_empty() || name.contains('/') || name.contains("..") {
        return Err(fail("not an interface name".into()));
    }
    let sys = std::path::Path::new("/sys/class/net").join(name);
    let mac_text = std::fs::read_to_string(sys.join("address"))
        .map_err(|error| fail(format!("no such interface ({error})")))?;
    let mac =
        parse_mac(mac_text.trim()).ok_or_else(|| fail(format!("MAC address {mac_text:?}")))?;
    let mtu = std::fs::read_to_string(sys.join("mtu"))
        .ok()
        .and_then(|text| text.trim().parse::<usize>().ok())
        .unwrap_or(1500);
    let (addr, prefix) = ipv4_of(name).ok_or_else(|| {
        fail("has no IPv4 address (the AF_XDP datapath serves IPv4 on-link peers)".into())
    })?;
    Ok(InterfaceInfo {
        mac,
        addr,
        prefix,
        mtu,
    })
}

fn parse_mac(text: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = text.split(':');
    for byte in &mut mac {
        *byte = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

/// The first IPv4 address of interface `name` and its prefix length.
fn ipv4_of(name: &str) -> Option<(Ipv4Addr, u8)> {
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `list` with a list the matching freeifaddrs releases.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return None;
    }
    let mut found = None;
    let mut entry = list;
    while !entry.is_null() {
        // SAFETY: `entry` is a node of the list getifaddrs returned, not yet freed.
        let ifa = unsafe { &*entry };
        entry = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_netmask.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: a NUL-terminated name owned by the list.
        let ifa_name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) };
        // SAFETY: ifa_addr points to a sockaddr of at least its family's size.
        let family = i32::from(unsafe { (*ifa.ifa_addr).sa_family });
        if ifa_name.to_bytes() != name.as_bytes() || family != libc::AF_INET {
            continue;
        }
        // SAFETY: AF_INET: both are sockaddr_in.
        let (addr, mask) = unsafe {
            (
                *(ifa.ifa_addr as *const libc::sockaddr_in),
                *(ifa.ifa_netmask as *const libc::sockaddr_in),
            )
        };
        let addr = Ipv4Addr::from(u32::from_be(addr.sin_addr.s_addr));
        let prefix = u32::from_be(mask.sin_addr.s_addr).count_ones() as u8;
        found = Some((addr, prefix));
        break;
    }
    // SAFETY: the list from getifaddrs above, freed once.
    unsafe { libc::freeifaddrs(list) };
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mac_addresses_parse_and_bad_ones_are_refused() {
        assert_eq!(
            parse_mac("02:00:0a:4d:01:02"),
            Some([2, 0, 0x0a, 0x4d, 1, 2])
        );
        for bad in ["", "02:00", "02:00:0a:4d:01:02:03", "zz:00:0a:4d:01:02"] {
            assert_eq!(parse_mac(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_loopback_interface_has_its_address() {
        assert_eq!(ipv4_of("lo"), Some((Ipv4Addr::LOCALHOST, 8)));
        assert!(interface_info("../etc").is_err());
        assert!(interface_info("no-such-if0").is_err());
    }
}

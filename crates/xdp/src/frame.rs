//! Ethernet/IPv4/UDP frames: [`parse_udp`] checks everything a sender controls before trusting
//! a byte of it (frames arrive from the network through AF_XDP with no kernel checks at all),
//! and [`write_udp`] builds a complete frame to transmit.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::atomic::{AtomicU16, Ordering};

/// Bytes of headers around a UDP payload: Ethernet (14), IPv4 without options (20), UDP (8).
pub const FRAME_OVERHEAD: usize = 14 + 20 + 8;

const ETH_HEADER: usize = 14;
const VLAN_TAG: usize = 4;
const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_VLAN: u16 = 0x8100;
const ETHERTYPE_QINQ: u16 = 0x88a8;
const IPPROTO_UDP: u8 = 17;
const IPV4_HEADER: usize = 20;
const UDP_HEADER: usize = 8;
/// The largest UDP payload an IPv4 datagram without options carries.
pub const MAX_UDP_PAYLOAD: usize = 65535 - IPV4_HEADER - UDP_HEADER;

/// A parsed IPv4/UDP frame; `payload` borrows the frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UdpFrame<'a> {
    /// Ethernet source.
    pub src_mac: [u8; 6],
    /// Ethernet destination.
    pub dst_mac: [u8; 6],
    /// The 802.1Q tag control information (priority, VLAN id), if the frame had one tag.
    pub vlan: Option<u16>,
    /// IPv4 source address and UDP source port.
    pub src: SocketAddrV4,
    /// IPv4 destination address and UDP destination port.
    pub dst: SocketAddrV4,
    /// IPv4 time to live.
    pub ttl: u8,
    /// The UDP payload (as long as the UDP length says; trailing padding excluded).
    pub payload: &'a [u8],
}

/// Why a frame is not a well-formed IPv4/UDP datagram: one variant per check, for counting
/// drops by reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
pub enum FrameError {
    /// The frame ends inside the Ethernet header, the VLAN tag, the IPv4 base header or the UDP
    /// header.
    #[error("frame truncated")]
    Truncated,
    /// The EtherType is not IPv4 (ARP, IPv6, ...).
    #[error("not IPv4")]
    NotIpv4,
    /// More than one VLAN tag (802.1ad / QinQ).
    #[error("stacked VLAN tags")]
    StackedVlan,
    /// The IP version field is not 4.
    #[error("IP version not 4")]
    IpVersion,
    /// The IPv4 header length is below 20 bytes, or its options run past the datagram.
    #[error("bad IPv4 header length")]
    IpHeaderLength,
    /// The IPv4 total length is below the header length or past the end of the frame.
    #[error("bad IPv4 total length")]
    IpTotalLength,
    /// The IPv4 header checksum is wrong.
    #[error("bad IPv4 header checksum")]
    IpChecksum,
    /// The datagram is a fragment (first or later).
    #[error("IPv4 fragment")]
    Fragment,
    /// The IPv4 protocol is not UDP.
    #[error("not UDP")]
    NotUdp,
    /// The UDP length is below 8 or past the end of the IPv4 datagram.
    #[error("bad UDP length")]
    UdpLength,
    /// The UDP checksum (when not zero) is wrong.
    #[error("bad UDP checksum")]
    UdpChecksum,
}

impl FrameError {
    /// Every reason, in declaration order (e.g. to label a counter array).
    pub const ALL: [FrameError; 11] = [
        FrameError::Truncated,
        FrameError::NotIpv4,
        FrameError::StackedVlan,
        FrameError::IpVersion,
        FrameError::IpHeaderLength,
        FrameError::IpTotalLength,
        FrameError::IpChecksum,
        FrameError::Fragment,
        FrameError::NotUdp,
        FrameError::UdpLength,
        FrameError::UdpChecksum,
    ];

    /// The reason's position in [`FrameError::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// A short name for metrics.
    pub fn name(self) -> &'static str {
        match self {
            FrameError::Truncated => "truncated",
            FrameError::NotIpv4 => "not_ipv4",
            FrameError::StackedVlan => "stacked_vlan",
            FrameError::IpVersion => "ip_version",
            FrameError::IpHeaderLength => "ip_header_length",
            FrameError::IpTotalLength => "ip_total_length",
            FrameError::IpChecksum => "ip_checksum",
            FrameError::Fragment => "fragment",
            FrameError::NotUdp => "not_udp",
            FrameError::UdpLength => "udp_length",
            FrameError::UdpChecksum => "udp_checksum",
        }
    }
}

fn be16(bytes: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*bytes.get(at)?, *bytes.get(at + 1)?]))
}

fn mac(bytes: &[u8], at: usize) -> Option<[u8; 6]> {
    bytes.get(at..at + 6)?.try_into().ok()
}

fn ipv4(bytes: &[u8], at: usize) -> Option<Ipv4Addr> {
    let octets: [u8; 4] = bytes.get(at..at + 4)?.try_into().ok()?;
    Some(Ipv4Addr::from(octets))
}

/// Adds `data` to a one's complement sum (big-endian 16-bit words; an odd last byte is padded
/// with zero). Sums 32-bit words into 64 bits and folds at the end: equal modulo 0xffff.
fn sum(data: &[u8], mut acc: u64) -> u64 {
    let mut words = data.chunks_exact(4);
    for word in &mut words {
        acc += u32::from_be_bytes([word[0], word[1], word[2], word[3]]) as u64;
    }
    let rest = words.remainder();
    let mut tail = [0u8; 4];
    tail[..rest.len()].copy_from_slice(rest);
    acc + u32::from_be_bytes(tail) as u64
}

/// Folds a sum to 16 bits (one's complement addition of the carries).
fn fold(mut acc: u64) -> u16 {
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc as u16
}

/// The sum of the UDP pseudo-header (source, destination, protocol, UDP length).
fn pseudo_header(src: Ipv4Addr, dst: Ipv4Addr, udp_len: u16) -> u64 {
    u32::from(src) as u64 + u32::from(dst) as u64 + IPPROTO_UDP as u64 + udp_len as u64
}

/// Whether [`parse_udp_with`] checks the UDP checksum.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UdpChecksum {
    /// Verify it when not zero (what [`parse_udp`] does).
    Verify,
    /// Do not look at it: for frames from a local sender through a virtual device with
    /// transmit checksum offload on, whose checksum field holds only the pseudo-header sum
    /// (see [`crate::set_tx_checksum_offload`]), when the payload carries its own integrity
    /// check.
    Ignore,
}

/// Parses an Ethernet frame carrying an IPv4/UDP datagram, checking every length, the IPv4
/// header checksum and the UDP checksum (when not zero). One 802.1Q tag is skipped; trailing
/// bytes after the IPv4 datagram (Ethernet padding) are ignored. Never panics.
pub fn parse_udp(frame: &[u8]) -> Result<UdpFrame<'_>, FrameError> {
    parse_udp_with(frame, UdpChecksum::Verify)
}

/// [`parse_udp`], with the UDP checksum verified or not.
pub fn parse_udp_with(frame: &[u8], udp_checksum: UdpChecksum) -> Result<UdpFrame<'_>, FrameError> {
    let dst_mac = mac(frame, 0).ok_or(FrameError::Truncated)?;
    let src_mac = mac(frame, 6).ok_or(FrameError::Truncated)?;
    let mut ethertype = be16(frame, 12).ok_or(FrameError::Truncated)?;
    let mut offset = ETH_HEADER;
    let mut vlan = None;
    if ethertype == ETHERTYPE_VLAN {
        vlan = Some(be16(frame, offset).ok_or(FrameError::Truncated)?);
        ethertype = be16(frame, offset + 2).ok_or(FrameError::Truncated)?;
        offset += VLAN_TAG;
    }
    if ethertype == ETHERTYPE_VLAN || ethertype == ETHERTYPE_QINQ {
        return Err(FrameError::StackedVlan);
    }
    if ethertype != ETHERTYPE_IPV4 {
        return Err(FrameError::NotIpv4);
    }
    let packet = &frame[offset..];
    if packet.len() < IPV4_HEADER {
        return Err(FrameError::Truncated);
    }
    if packet[0] >> 4 != 4 {
        return Err(FrameError::IpVersion);
    }
    let header_len = (packet[0] & 0x0f) as usize * 4;
    if header_len < IPV4_HEADER || header_len > packet.len() {
        return Err(FrameError::IpHeaderLength);
    }
    let total_len = be16(packet, 2).ok_or(FrameError::Truncated)? as usize;
    if total_len > packet.len() {
        return Err(FrameError::IpTotalLength);
    }
    if total_len < header_len {
        return Err(if total_len < IPV4_HEADER {
            FrameError::IpTotalLength
        } else {
            FrameError::IpHeaderLength
        });
    }
    let header = &packet[..header_len];
    if fold(sum(header, 0)) != 0xffff {
        return Err(FrameError::IpChecksum);
    }
    let flags_fragment = be16(header, 6).ok_or(FrameError::Truncated)?;
    // MF set or a non-zero offset (DF and the reserved bit are not fragmentation).
    if flags_fragment & 0x3fff != 0 {
        return Err(FrameError::Fragment);
    }
    if header[9] != IPPROTO_UDP {
        return Err(FrameError::NotUdp);
    }
    let ttl = header[8];
    let src_ip = ipv4(header, 12).ok_or(FrameError::Truncated)?;
    let dst_ip = ipv4(header, 16).ok_or(FrameError::Truncated)?;
    let datagram = &packet[header_len..total_len];
    if datagram.len() < UDP_HEADER {
        return Err(FrameError::Truncated);
    }
    let src_port = be16(datagram, 0).ok_or(FrameError::Truncated)?;
    let dst_port = be16(datagram, 2).ok_or(FrameError::Truncated)?;
    let udp_len = be16(datagram, 4).ok_or(FrameError::Truncated)?;
    if (udp_len as usize) < UDP_HEADER || udp_len as usize > datagram.len() {
        return Err(FrameError::UdpLength);
    }
    let udp = &datagram[..udp_len as usize];
    let checksum = be16(udp, 6).ok_or(FrameError::Truncated)?;
    if udp_checksum == UdpChecksum::Verify
        && checksum != 0
        && fold(sum(udp, pseudo_header(src_ip, dst_ip, udp_len))) != 0xffff
    {
        return Err(FrameError::UdpChecksum);
    }
    Ok(UdpFrame {
        src_mac,
        dst_mac,
        vlan,
        src: SocketAddrV4::new(src_ip, src_port),
        dst: SocketAddrV4::new(dst_ip, dst_port),
        ttl,
        payload: &udp[UDP_HEADER..],
    })
}

/// The IPv4 identification of the next datagram written (wraps; with DF set it only helps
/// packet captures tell datagrams apart).
static NEXT_ID: AtomicU16 = AtomicU16::new(1);

/// Writes an Ethernet frame carrying `payload` in a UDP datagram from `src` to `dst` at the
/// start of `buf`: IPv4 header of 20 bytes with DF set, a fresh identification and its
/// checksum; UDP checksum computed. Returns the frame's length, or `None` when it does not fit
/// `buf` or an IPv4 datagram.
pub fn write_udp(
    buf: &mut [u8],
    src_mac: [u8; 6],
    dst_mac: [u8; 6],
    src: SocketAddrV4,
    dst: SocketAddrV4,
    ttl: u8,
    payload: &[u8],
) -> Option<usize> {
    if payload.len() > MAX_UDP_PAYLOAD {
        return None;
    }
    let len = FRAME_OVERHEAD + payload.len();
    let frame = buf.get_mut(..len)?;
    let (eth, rest) = frame.split_at_mut(ETH_HEADER);
    eth[0..6].copy_from_slice(&dst_mac);
    eth[6..12].copy_from_slice(&src_mac);
    eth[12..14].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());

    let (ip, udp) = rest.split_at_mut(IPV4_HEADER);
    let total_len = (IPV4_HEADER + UDP_HEADER + payload.len()) as u16;
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    ip[0] = 0x45; // version 4, 5 words
    ip[1] = 0; // DSCP / ECN
    ip[2..4].copy_from_slice(&total_len.to_be_bytes());
    ip[4..6].copy_from_slice(&id.to_be_bytes());
    ip[6..8].copy_from_slice(&0x4000u16.to_be_bytes()); // DF, offset 0
    ip[8] = ttl;
    ip[9] = IPPROTO_UDP;
    ip[10..12].copy_from_slice(&[0, 0]);
    ip[12..16].copy_from_slice(&src.ip().octets());
    ip[16..20].copy_from_slice(&dst.ip().octets());
    let ip_checksum = !fold(sum(ip, 0));
    ip[10..12].copy_from_slice(&ip_checksum.to_be_bytes());

    let udp_len = (UDP_HEADER + payload.len()) as u16;
    udp[0..2].copy_from_slice(&src.port().to_be_bytes());
    udp[2..4].copy_from_slice(&dst.port().to_be_bytes());
    udp[4..6].copy_from_slice(&udp_len.to_be_bytes());
    udp[6..8].copy_from_slice(&[0, 0]);
    udp[UDP_HEADER..].copy_from_slice(payload);
    let udp_checksum = match !fold(sum(udp, pseudo_header(*src.ip(), *dst.ip(), udp_len))) {
        0 => 0xffff, // 0 means "no checksum": send its other representation
        value => value,
    };
    udp[6..8].copy_from_slice(&udp_checksum.to_be_bytes());
    Some(len)
}

#[cfg(test)]
mod tests;

//! Devices in series (docs/replication.md): the wire's part of replication in the network.
//!
//! A client that wants an update to survive the permanent loss of R − 1 devices sends it
//! through R devices in series (client → D1 → … → DR → server) and completes it when every
//! fragment holds PMNet-ACKs from R distinct devices (the acks' `device_id`s). Each device
//! logs the update and sends its own PMNet-ACK towards the client; a device passes on, towards
//! the client, the PMNet-ACKs and not-logged notices that come from the next device (its
//! "server" address). The client marks such an update [`REPLICATED`]: a device then never
//! keeps the server-ACK back on the strength of its own acks (the client needs the others'
//! too), and the server-ACK travels back through every device, freeing each one's entry.
//!
//! A device that forwards an update to the next device of a chain (a "server" it has heard
//! PMNet-ACKs from) carries the client's address at the end of the payload, flag
//! [`CLIENT_ADDRESS`] ([`with_client_address`]): the next device strips it before anything
//! else sees the update ([`without_client_address`]) and, when the sender is a device it was
//! configured to follow, sends its PMNet-ACK to the client directly instead of back along the
//! chain. So R devices cost R + 1 hops to the last ack instead of 2R. A server never gets it:
//! devices log and forward the update as the client sent it.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::{Header, HEADER_LEN, MAX_DATAGRAM_LEN, TRAILER_ROOM};

/// Header flag of an update request whose client waits for PMNet-ACKs from more than one
/// device (bit 10: among the bits reserved for the in-network functions).
pub const REPLICATED: u16 = 1 << 10;

/// Header flag of a request a primary server forwards to its replica servers as it applied it
/// (bit 11; docs/replication.md, "Replicated servers"): a barrier descriptor naming the
/// request the primary applied before it comes first, so its fragments are cut from a
/// different payload than the client's. A replica never mixes fragments with and without it
/// in one request: a fragment that disagrees replaces the unfinished request.
pub const FROM_PRIMARY: u16 = 1 << 11;

/// Header flag of the traffic between a primary server and one of its replicas (bit 14): a
/// request the primary sends the replica (forwarded, or a duplicate passed on), and the
/// server-ACK the replica answers with. `device_id` names the replica: its place in the
/// primary's `--replica` list, plus one. A replica's ack says the replica applied the request,
/// not that the primary did: no client or device takes it, and a primary counts it only for
/// the replica it names (with keys flag and id are authenticated: a replica's ack replayed to
/// a client, or as another replica's, counts for nothing).
pub const REPLICA: u16 = 1 << 14;

/// Header flag of an update request a device forwards to the next device of a chain with its
/// client's address at the end of the payload (bit 15; docs/protocol.md, golden vector 8a):
/// the last [`CLIENT_ADDRESS_LEN`] bytes the payload length counts (and the CRC covers) are
/// the address ([`encode_client_address`]). Only on update requests, only between devices.
pub const CLIENT_ADDRESS: u16 = 1 << 15;

/// Bytes of a carried client address: family (4 or 6), port (u16, big-endian), and the
/// address in 16 bytes (IPv4 in the first 4, the other 12 zero) — the layout of the device
/// log's return address and of the chain store's client address.
pub const CLIENT_ADDRESS_LEN: usize = 19;

/// Why a carried client address was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAddressError {
    /// The payload is shorter than an address.
    Truncated,
    /// A family other than 4 or 6.
    BadFamily,
    /// An IPv4 address whose 12 unused bytes are not zero.
    NonZeroPadding,
    /// Port 0, or the unspecified address: nobody to answer.
    Unreachable,
}

/// The [`CLIENT_ADDRESS_LEN`] bytes that carry `address`.
pub fn encode_client_address(address: SocketAddr) -> [u8; CLIENT_ADDRESS_LEN] {
    let mut bytes = [0u8; CLIENT_ADDRESS_LEN];
    let (family, ip) = match address.ip() {
        IpAddr::V4(ip) => {
            let mut ip16 = [0u8; 16];
            ip16[..4].copy_from_slice(&ip.octets());
            (4, ip16)
        }
        IpAddr::V6(ip) => (6, ip.octets()),
    };
    bytes[0] = family;
    bytes[1..3].copy_from_slice(&address.port().to_be_bytes());
    bytes[3..].copy_from_slice(&ip);
    bytes
}

/// The address `bytes` (exactly [`CLIENT_ADDRESS_LEN`] of them) carry. Never panics.
pub fn decode_client_address(bytes: &[u8]) -> Result<SocketAddr, ClientAddressError> {
    let bytes: &[u8; CLIENT_ADDRESS_LEN] = bytes
        .try_into()
        .map_err(|_| ClientAddressError::Truncated)?;
    let port = u16::from_be_bytes([bytes[1], bytes[2]]);
    let ip16: [u8; 16] = bytes[3..].try_into().expect("16 bytes");
    let ip = match bytes[0] {
        4 if ip16[4..].iter().any(|&byte| byte != 0) => {
            return Err(ClientAddressError::NonZeroPadding)
        }
        4 => IpAddr::V4(Ipv4Addr::new(ip16[0], ip16[1], ip16[2], ip16[3])),
        6 => IpAddr::V6(Ipv6Addr::from(ip16)),
        _ => return Err(ClientAddressError::BadFamily),
    };
    if port == 0 || ip.is_unspecified() {
        return Err(ClientAddressError::Unreachable);
    }
    Ok(SocketAddr::new(ip, port))
}

/// The update `header` and `payload` make, as a device forwards it to the next device of a
/// chain: flag [`CLIENT_ADDRESS`] set, `client`'s address after the payload (counted in the
/// payload length, covered by the CRC), room for an authentication trailer. `None` when the
/// datagram would grow past the largest one (it then goes as it is).
pub fn with_client_address(header: &Header, payload: &[u8], client: SocketAddr) -> Option<Vec<u8>> {
    let len = HEADER_LEN + payload.len() + CLIENT_ADDRESS_LEN;
    if len + TRAILER_ROOM > MAX_DATAGRAM_LEN {
        return None;
    }
    let mut bytes = Vec::with_capacity(len + TRAILER_ROOM);
    bytes.resize(HEADER_LEN, 0);
    bytes.extend_from_slice(payload);
    bytes.extend_from_slice(&encode_client_address(client));
    Header {
        flags: header.flags | CLIENT_ADDRESS,
        ..*header
    }
    .emit_header(len - HEADER_LEN, &mut bytes);
    Some(bytes)
}

/// An update that carries its client's address (`header` has [`CLIENT_ADDRESS`], `payload`
/// is all of its payload): the datagram without it — the flag cleared, the payload as the
/// client sent it, the CRC made again — and the address. Never panics.
pub fn without_client_address(
    header: &Header,
    payload: &[u8],
) -> Result<(Vec<u8>, SocketAddr), ClientAddressError> {
    let inner_len = payload
        .len()
        .checked_sub(CLIENT_ADDRESS_LEN)
        .ok_or(ClientAddressError::Truncated)?;
    let client = decode_client_address(&payload[inner_len..])?;
    let inner = Header {
        flags: header.flags & !CLIENT_ADDRESS,
        ..*header
    };
    let mut bytes = Vec::with_capacity(HEADER_LEN + inner_len + TRAILER_ROOM);
    bytes.resize(HEADER_LEN, 0);
    bytes.extend_from_slice(&payload[..inner_len]);
    inner.emit_header(inner_len, &mut bytes);
    Ok((bytes, client))
}

//! The PMNet protocol as state machines with no I/O.
//!
//! Three endpoints speak PMNet: a [`Client`] session, a [`Device`] on the path that logs update
//! requests in persistent memory and acks them early, and a [`Server`] session table that
//! applies requests exactly once in per-session order. None of them owns a socket, a clock, a
//! thread or a random number generator. Each is driven the same way (after quinn-proto):
//!
//! - feed input with `handle(now, from, datagram)` and `handle_timeout(now)`;
//! - then drain output: `poll_transmit()` until `None` (datagrams to send), and the
//!   endpoint-specific queues: [`Device::poll_persist`] (log writes to make durable, reported
//!   back with [`Device::on_persisted`]), [`Server::poll_event`] (requests to apply, reported back
//!   with [`Server::on_applied`]), [`Client::poll_event`] (completed requests);
//! - sleep until `poll_timeout()` or the next datagram, whichever comes first.
//!
//! Every output that depends on durability is held back until the caller reports it: the
//! device emits a PMNet-ACK only after `on_persisted` for that log write, and the server
//! emits a server-ACK only after `on_applied`. Both rules are asserted.

mod batch;
mod capacity;
mod client;
mod counter;
mod device;
mod device_pipeline;
mod drop;
mod edge;
mod function;
mod histogram;
mod keyed;
mod plain;
pub mod route;
mod server;
mod time;

pub use batch::{BatchCounters, Batcher, BATCH_PEERS_MAX};
pub use capacity::{capacity_text, check_max_ops_per_s, TokenBucket, MAX_OPS_PER_S_MAX};
pub use client::{
    Client, ClientConfig, ClientCounters, ClientError, ClientEvent, ClientLatency, Completion,
    ReadEvent, REPLICAS_MAX,
};
pub use counter::{Counter, COUNTER_TYPE_CODE};
pub use device::{
    Device, DeviceConfig, DeviceCounters, PROBE_INTERVAL_FIRST, PROBE_INTERVAL_MAX,
    UNVERIFIED_WARN_AFTER,
};
pub use device_pipeline::DevicePipeline;
pub use drop::{AuthWarnings, CountDrop, DropCounts, DropReason};
pub use function::{
    AfterDurable, FrontFunction, FrontWork, Fronts, NetworkFunction, NoPersistence, Nothing,
    NumberedBatches, Persist, PersistBatch, Pipeline, RegionExecutor, RegionWrite, Stack,
    StackWork, Verdict,
};
pub use histogram::{LatencyHistogram, LATENCY_BUCKETS_NS};
pub use keyed::{KeyedCounters, KeyedOrdering};
pub use plain::{is_loopback, PlainTrafficWarnings, PLAIN_TRAFFIC_WARNING_INTERVAL};
pub use pmnet_auth::{AuthError, Authenticator, DeploymentKey, KeySet, ReplayFloor, SealCounts};
pub use pmnet_pm::EntryKey;
pub use pmnet_pm::{BatchStats, LogWork};
pub use server::{
    Applied, RecoveredSession, RecoveryReport, ReplicationCounters, Server, ServerConfig,
    ServerCounters, ServerEvent, Stager, REPLICATION_BYTES_MAX, REPLICATION_PENDING_MAX,
    REPLICA_SERVERS_MAX,
};
pub use server::{ForwardLogOpened, ForwardLogRecovery, FORWARD_RECORD_HEADER_LEN};
pub use server::{ReadCounters, HELD_READS_MAX, READS_IN_FLIGHT_MAX, WAITS_FOR_ROOM};
pub use time::Time;

use std::net::SocketAddr;

/// A datagram to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transmit {
    pub destination: SocketAddr,
    pub bytes: Vec<u8>,
}

/// Which path a request takes through a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RequestKind {
    /// A request whose reply is fixed: logged by a device and acked early.
    Update,
    /// A request whose reply depends on server state: completes only on the server's reply.
    Bypass,
}

impl RequestKind {
    fn packet_type(self) -> pmnet_wire::PacketType {
        match self {
            RequestKind::Update => pmnet_wire::PacketType::UpdateRequest,
            RequestKind::Bypass => pmnet_wire::PacketType::BypassRequest,
        }
    }
}

/// Bytes of a datagram left for header and payload once an authentication trailer (if any)
/// is appended: what `datagram_len_max` allows, less the trailer.
fn unsealed_len_max(datagram_len_max: usize, auth: &Option<pmnet_auth::Authenticator>) -> usize {
    match auth {
        Some(_) => datagram_len_max.saturating_sub(pmnet_auth::TRAILER_LEN),
        None => datagram_len_max,
    }
}

/// Largest payload that fits a datagram of `datagram_len_max` bytes.
fn fragment_payload_len_max(datagram_len_max: usize) -> usize {
    datagram_len_max
        .min(pmnet_wire::MAX_DATAGRAM_LEN)
        .saturating_sub(pmnet_wire::HEADER_LEN)
}

/// The payload of a reassembled request or reply: its fragments' parts in order. The first
/// part is moved, not copied, so a single-datagram message costs no copy at all; the others
/// are appended with `memcpy` (a byte-wise `flatten().collect()` cost microseconds per KB).
fn concat_parts(parts: Vec<Option<Vec<u8>>>) -> Vec<u8> {
    let mut parts = parts.into_iter().flatten();
    let Some(mut whole) = parts.next() else {
        return Vec::new();
    };
    for part in parts {
        whole.extend_from_slice(&part);
    }
    whole
}

/// Split `payload` into datagrams of at most `datagram_len_max` bytes with `header` as
/// template; `None` if it would need more than `u16::MAX` fragments.
fn encode_fragments(
    header: pmnet_wire::Header,
    payload: &[u8],
    datagram_len_max: usize,
) -> Option<Vec<Vec<u8>>> {
    let chunk_len = fragment_payload_len_max(datagram_len_max).max(1);
    let fragment_count = payload.len().div_ceil(chunk_len).max(1);
    let fragment_count = u16::try_from(fragment_count).ok()?;
    let mut datagrams = Vec::with_capacity(usize::from(fragment_count));
    for fragment_index in 0..fragment_count {
        let start = usize::from(fragment_index) * chunk_len;
        let end = (start + chunk_len).min(payload.len());
        let fragment_header = pmnet_wire::Header {
            fragment_index,
            fragment_count,
            ..header
        };
        datagrams.push(fragment_header.encode(&payload[start.min(end)..end]));
    }
    Some(datagrams)
}

#[cfg(test)]
mod concat_tests {
    use super::concat_parts;

    #[test]
    fn parts_are_joined_in_order() {
        assert_eq!(concat_parts(Vec::new()), Vec::<u8>::new());
        assert_eq!(concat_parts(vec![Some(vec![1, 2])]), vec![1, 2]);
        assert_eq!(
            concat_parts(vec![Some(vec![1]), Some(Vec::new()), Some(vec![2, 3])]),
            vec![1, 2, 3]
        );
    }
}

//! Trace events for single datagrams, shared by the processes: what a datagram is, where it
//! went, why it was dropped. Every event here is at trace level and formats nothing unless
//! trace is enabled for pmnet's crates (`-vv`, or `RUST_LOG=pmnet=trace`); the snapshots that
//! tell a drop or freed log entries apart are taken only then ([`enabled`]).

use std::net::SocketAddr;

use pmnet_proto::DropCounts;
use pmnet_wire::PacketType;

use crate::udp::{type_slot, type_slot_name};

/// Whether trace events are on (checked once per batch, not per datagram).
#[inline]
pub fn enabled() -> bool {
    tracing::enabled!(tracing::Level::TRACE)
}

/// The packet type's stable name (`update`, `pmnet_ack`, `server_ack`, …; `other`).
pub fn kind(datagram: &[u8]) -> &'static str {
    type_slot_name(type_slot(datagram))
}

/// A datagram arrived from `from`.
#[inline]
pub fn received(from: SocketAddr, datagram: &[u8]) {
    tracing::trace!(%from, kind = %kind(datagram), len = datagram.len(), "datagram received");
}

/// A datagram left for `to`, said by what it is: a PMNet-ACK, a request forwarded to its
/// server, a batch, a server-ACK, a recovery poll, …
#[inline]
pub fn sent(to: SocketAddr, datagram: &[u8]) {
    tracing::trace!(%to, kind = %kind(datagram), len = datagram.len(), "{}", sent_text(datagram));
}

fn sent_text(datagram: &[u8]) -> &'static str {
    let slot = type_slot(datagram);
    let is = |packet_type: PacketType| slot == usize::from(packet_type.code());
    if is(PacketType::PmnetAck) {
        "PMNet-ACK sent"
    } else if is(PacketType::UpdateRequest) || is(PacketType::BypassRequest) {
        "request sent on"
    } else if is(PacketType::ServerAck) {
        "server-ACK sent"
    } else if is(PacketType::Batch) {
        "batch sent"
    } else if is(PacketType::RecoveryPoll) {
        "recovery poll sent"
    } else if is(PacketType::RecoveryDone) {
        "recovery done sent"
    } else if is(PacketType::RetransmitRequest) {
        "retransmission request sent"
    } else if is(PacketType::NotLogged) {
        "not-logged notice sent"
    } else {
        "datagram sent"
    }
}

/// The reason a drop counter grew by between `before` and `after` (one datagram handled).
pub fn drop_reason(before: &DropCounts, after: &DropCounts) -> Option<&'static str> {
    after
        .iter()
        .find(|(reason, count)| before.get(*reason).copied().unwrap_or(0) < **count)
        .map(|(reason, _)| *reason)
}

/// Trace the datagram from `from` as dropped if a drop counter grew while it was handled.
pub fn dropped(from: SocketAddr, datagram: &[u8], before: &DropCounts, after: &DropCounts) {
    if let Some(reason) = drop_reason(before, after) {
        tracing::trace!(%from, kind = %kind(datagram), reason, "datagram dropped");
    }
}

/// [`Server::handle`], with trace events when `traced` ([`enabled`], read once per receive
/// batch): the datagram, and whether it was dropped (and why) or was a duplicate of a request
/// applied or being applied.
pub fn server_handle(
    server: &mut pmnet_proto::Server,
    now: pmnet_proto::Time,
    from: std::net::SocketAddr,
    datagram: &[u8],
    traced: bool,
) -> bool {
    let unverified = server.unverified_total();
    if !traced {
        server.handle(now, from, datagram);
        return server.unverified_total() == unverified;
    }
    received(from, datagram);
    let counters = server.counters();
    let drops = counters.dropped.clone();
    let (makeup, in_progress) = (counters.makeup_acks_sent, counters.duplicates_in_progress);
    server.handle(now, from, datagram);
    let counters = server.counters();
    dropped(from, datagram, &drops, &counters.dropped);
    if counters.makeup_acks_sent > makeup {
        tracing::trace!(%from, "duplicate of an applied request: make-up ACK");
    }
    if counters.duplicates_in_progress > in_progress {
        tracing::trace!(%from, "duplicate of a request being applied: its ACK is coming");
    }
    server.unverified_total() == unverified
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reason_that_grew_is_named() {
        let mut before = DropCounts::new();
        before.insert("unpaid", 2);
        let mut after = before.clone();
        assert_eq!(drop_reason(&before, &after), None);
        after.insert("zero_seq", 1);
        assert_eq!(drop_reason(&before, &after), Some("zero_seq"));
        after.insert("unpaid", 3);
        after.remove("zero_seq");
        assert_eq!(drop_reason(&before, &after), Some("unpaid"));
    }
}

//! Why a state machine dropped a datagram: one vocabulary for the device, the server, the
//! client and the pipeline, counted by reason under the same stable names everywhere.

use std::collections::BTreeMap;

use pmnet_wire::ParseError;

/// Why a datagram was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DropReason {
    /// The datagram failed authentication (checked before anything else): forged, altered,
    /// replayed under another key, or sent without one.
    Auth(pmnet_auth::AuthError),
    /// A datagram sealed with a key (flag `AUTHENTICATED` and a trailer) at an endpoint that
    /// holds none: it cannot be verified, so it is not believed.
    SealedWithoutKey,
    /// The bytes are not a PMNet packet (or a type no function owns).
    Parse(ParseError),
    /// The header names a server this device does not front.
    UnknownServer,
    /// The header names a server other than this one.
    WrongServer,
    /// A message from an address that may not send it.
    UnexpectedSource,
    /// A type this endpoint does not accept.
    UnexpectedType,
    /// A message for a session other than this client's.
    WrongSession,
    /// A server reply or retransmission request for a session whose client is unknown.
    NoClientRoute,
    /// The transmit queue is full.
    QueueFull,
    /// A request with sequence number 0, which no server applies.
    ZeroSeq,
    /// An unsolicited message that the destination's own traffic has not paid for: never
    /// more bytes towards an address than it sent.
    Unpaid,
    /// A payload that does not match its type.
    BadPayload,
    /// The session table is full of sessions with work in hand.
    SessionsFull,
    /// A request too far ahead of the session's last applied one to buffer.
    BeyondReorderWindow,
    /// A fragment that disagrees with the fragments of its request already received.
    InconsistentFragment,
    /// A request or reply larger than allowed.
    TooLarge,
    /// Buffering the fragment would exceed the reassembly memory budget.
    ReassemblyBudget,
    /// A fill reply whose payload does not fit the query.
    BadFillReply,
    /// A cache read in several fragments, or whose read descriptor does not parse.
    BadCacheRead,
    /// A fill reply for a query no longer open.
    StaleFillReply,
    /// A hold reply for no query of this run still open (late, replayed or forged).
    StaleHoldReply,
    /// A recovery-done after recovery ended.
    LateRecoveryDone,
    /// A recovery-done whose payload is malformed.
    BadRecoveryDone,
    /// An ack or notice that does not match the request it names.
    Mismatch,
    /// A batch inside a batch: never sent, so not handled.
    NestedBatch,
    /// A barrier (a keyed write with no key) with too little room for the sessions it must
    /// follow: its client sends it again.
    BarrierNoRoom,
    /// The device's order of keyed writes holds as many unacknowledged writes as it may: its
    /// client sends it again.
    KeyedOrderFull,
    /// A keyed write that reached a server behind devices without a device's order in it (a
    /// client's copy sent or replayed straight to the server): applied, it would change a key
    /// behind the cache of the device its client writes through. Its client sends it again
    /// through the device.
    UnorderedKeyedWrite,
    /// A primary holds as many requests for its replicas as it may: the resent duplicate is
    /// forwarded on a later resend.
    ReplicationFull,
    /// A group, line range or configuration this node does not serve (or has not been given
    /// yet).
    NotServed,
    /// Too much already waits for durability or acknowledgements: the sender sends it again.
    Backlog,
    /// Data older than what the receiver took already (a late or replayed page).
    StaleData,
    /// An update whose carried client address (flag `CLIENT_ADDRESS`, devices in series) is
    /// malformed, or one that reached a server: only a device carries one, to the next device.
    BadClientAddress,
}

impl DropReason {
    /// Stable name, used in counters and metrics.
    pub fn reason(self) -> &'static str {
        match self {
            DropReason::Auth(error) => error.reason(),
            DropReason::SealedWithoutKey => "sealed_without_key",
            DropReason::Parse(error) => error.reason(),
            DropReason::UnknownServer => "unknown_server",
            DropReason::WrongServer => "wrong_server",
            DropReason::UnexpectedSource => "unexpected_source",
            DropReason::UnexpectedType => "unexpected_type",
            DropReason::WrongSession => "wrong_session",
            DropReason::NoClientRoute => "no_client_route",
            DropReason::QueueFull => "queue_full",
            DropReason::ZeroSeq => "zero_seq",
            DropReason::Unpaid => "unpaid",
            DropReason::BadPayload => "bad_payload",
            DropReason::SessionsFull => "sessions_full",
            DropReason::BeyondReorderWindow => "beyond_reorder_window",
            DropReason::InconsistentFragment => "inconsistent_fragment",
            DropReason::TooLarge => "request_too_large",
            DropReason::ReassemblyBudget => "reassembly_budget",
            DropReason::BadFillReply => "bad_fill_reply",
            DropReason::BadCacheRead => "bad_cache_read",
            DropReason::StaleFillReply => "stale_fill_reply",
            DropReason::StaleHoldReply => "stale_hold_reply",
            DropReason::LateRecoveryDone => "late_recovery_done",
            DropReason::BadRecoveryDone => "bad_recovery_done",
            DropReason::Mismatch => "mismatch",
            DropReason::NestedBatch => "nested_batch",
            DropReason::BarrierNoRoom => "barrier_no_room",
            DropReason::KeyedOrderFull => "keyed_order_full",
            DropReason::UnorderedKeyedWrite => "unordered_keyed_write",
            DropReason::ReplicationFull => "replication_full",
            DropReason::NotServed => "not_served",
            DropReason::Backlog => "backlog",
            DropReason::StaleData => "stale_data",
            DropReason::BadClientAddress => "bad_client_address",
        }
    }
}

/// Datagrams dropped, by reason name.
pub type DropCounts = BTreeMap<&'static str, u64>;

/// Counting into a [`DropCounts`].
pub trait CountDrop {
    fn record(&mut self, reason: DropReason);
    /// Add `other`'s counts to these (another function's or stage's drops); `self`, for
    /// chaining.
    fn merged(self, other: &DropCounts) -> Self;
}

impl CountDrop for DropCounts {
    fn record(&mut self, reason: DropReason) {
        *self.entry(reason.reason()).or_insert(0) += 1;
    }

    fn merged(mut self, other: &DropCounts) -> DropCounts {
        for (reason, count) in other {
            *self.entry(reason).or_insert(0) += count;
        }
        self
    }
}

impl DropReason {
    /// Whether the datagram was dropped because it could not be verified (an authentication
    /// failure, or sealed at an endpoint without keys).
    pub fn is_unverified(self) -> bool {
        matches!(self, DropReason::Auth(_) | DropReason::SealedWithoutKey)
    }

    /// What a datagram that could not be verified says of its sender, and what to check.
    pub fn unverified_hint(self) -> &'static str {
        match self {
            DropReason::Auth(pmnet_auth::AuthError::Unauthenticated) => {
                "it sent no authentication trailer: start it with the same --key-file"
            }
            DropReason::Auth(pmnet_auth::AuthError::UnknownKey) => {
                "its key id is not in this key file: give both the same --key-file"
            }
            DropReason::Auth(pmnet_auth::AuthError::BadTag) => {
                "its tag does not verify: a different key under the same id, or altered on the way"
            }
            DropReason::Auth(pmnet_auth::AuthError::Truncated) => {
                "the datagram is too short for its trailer"
            }
            DropReason::SealedWithoutKey => {
                "it seals what it sends with a key and this endpoint has none: give both the \
                 same --key-file"
            }
            DropReason::Auth(pmnet_auth::AuthError::Stale) => {
                "it was sealed longer ago than the replay window: a replay, or its clock is \
                 behind this one's (synchronise the clocks)"
            }
            DropReason::Auth(pmnet_auth::AuthError::FromTheFuture) => {
                "it was sealed later than this clock plus the replay window: its clock is \
                 ahead (synchronise the clocks)"
            }
            _ => "",
        }
    }
}

/// Whether `datagram`, which an endpoint without keys could not parse, is one sealed with a
/// key: the flag `AUTHENTICATED` and exactly a trailer's worth of bytes after the payload.
pub fn sealed_without_key(datagram: &[u8]) -> bool {
    let Ok(packet) = pmnet_wire::Packet::new_checked(pmnet_auth::without_trailer(datagram)) else {
        return false;
    };
    datagram.len() >= pmnet_wire::HEADER_LEN + pmnet_auth::TRAILER_LEN
        && packet.flags() & pmnet_wire::flags::AUTHENTICATED != 0
}

/// Verify `datagram` with `auth` (when keys are configured) before anything else looks at it:
/// the datagram as it is then (its trailer stripped, decrypted), or why it is not believed.
/// Without keys, a datagram sealed with one is refused as [`DropReason::SealedWithoutKey`]
/// (rather than as trailing bytes), so that the mismatch is named.
pub fn verify_datagram<'a>(
    auth: Option<&mut pmnet_auth::Authenticator>,
    datagram: &'a [u8],
) -> Result<std::borrow::Cow<'a, [u8]>, DropReason> {
    match auth {
        Some(auth) => auth.verify(datagram).map_err(DropReason::Auth),
        None if datagram.len() >= pmnet_wire::HEADER_LEN
            && u16::from_be_bytes([datagram[4], datagram[5]])
                & pmnet_wire::flags::AUTHENTICATED
                != 0
            && sealed_without_key(datagram) =>
        {
            Err(DropReason::SealedWithoutKey)
        }
        None => Ok(std::borrow::Cow::Borrowed(datagram)),
    }
}

/// How often a receiver warns of datagrams that failed authentication, at most.
pub const AUTH_WARNING_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);

/// A rate-limited warning, at the receiver, of datagrams that failed authentication: the first
/// at once, naming the sender and the reason; then at most one per [`AUTH_WARNING_INTERVAL`],
/// with how many failed since. A sender with another key (or none) is a misconfiguration the
/// operator must hear of; counting it in the drops alone would leave them guessing.
#[derive(Debug, Default, Clone)]
pub struct AuthWarnings {
    last: Option<crate::Time>,
    since_last: u64,
    /// Every datagram that could not be verified, and the latest one's sender and reason.
    total: u64,
    latest: Option<(std::net::SocketAddr, DropReason)>,
}

impl AuthWarnings {
    /// A datagram from `from` could not be verified at `role` ("server", …): `reason` is an
    /// authentication failure or [`DropReason::SealedWithoutKey`].
    pub fn failed(
        &mut self,
        now: crate::Time,
        role: &str,
        from: std::net::SocketAddr,
        reason: DropReason,
    ) {
        self.since_last += 1;
        self.total += 1;
        self.latest = Some((from, reason));
        if self
            .last
            .is_some_and(|last| now.saturating_duration_since(last) < AUTH_WARNING_INTERVAL)
        {
            return;
        }
        let hint = reason.unverified_hint();
        tracing::warn!(
            "{role}: dropped {} datagram(s) that failed authentication, the latest from {from} \
             ({}: {hint})",
            self.since_last,
            reason.reason()
        );
        self.last = Some(now);
        self.since_last = 0;
    }

    /// Datagrams that could not be verified, in all.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// The latest of them: its sender and why.
    pub fn latest(&self) -> Option<(std::net::SocketAddr, DropReason)> {
        self.latest
    }
}

//! The interface the server runtime calls to apply requests.
//!
//! Kept deliberately small: the server knows nothing about keys or values, only that each
//! session's requests are applied once, in order, and that the last reply of each session
//! survives a restart so a retransmitted request can be answered without applying it again.

use pmnet_pm::MediumInfo;

/// One session's durable dedupe record: the last request applied and its reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionRecord {
    pub session_id: u64,
    pub last_seq: u32,
    pub last_reply: Vec<u8>,
}

/// The store has no room for a request: nothing of it became durable and its session is
/// unchanged. See [`Application::apply`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NoSpace;

impl std::fmt::Display for NoSpace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("no room in the store")
    }
}

impl std::error::Error for NoSpace {}

/// A request handler the server runtime drives.
pub trait Application {
    /// Apply request `seq` of `session_id` and return the reply bytes. On `Ok`, the effect,
    /// the session's last applied seq (= seq) and the reply are durable together, atomically:
    /// after a crash either all of them or none survive.
    ///
    /// A request that fails to decode still counts as applied: its ERROR reply is recorded
    /// with `seq`, so the protocol never stalls on a bad payload.
    ///
    /// `Err(NoSpace)`: the store has no room for what the request would store. **Nothing**
    /// about the request became durable, in memory or on the medium: the session's last
    /// applied seq and reply are what they were, and no effect happened. A device may already
    /// have acknowledged the request to its client, so a store never turns it into a refusal;
    /// the caller keeps the request (sending no server-ACK, so every device keeps its log
    /// entry) and calls `apply` again later with the same `seq` and bytes, once deletes may have
    /// made room. Only a request that needs new room returns it (a SET, an INCR or an APPEND);
    /// a GET, a DEL, or a request that fails to decode never does: a DEL must always be able
    /// to run in a full store, or nothing could ever free space (each store keeps room for
    /// it; see its own documentation).
    ///
    /// Calls for one session carry strictly increasing `seq` (gaps are allowed; a refused
    /// `seq` is retried before any later one); a `seq` at or below the session's last applied
    /// seq is a bug in the caller, which must answer duplicates from
    /// [`Application::sessions`] or its own table instead.
    fn apply(&mut self, session_id: u64, seq: u32, request: &[u8]) -> Result<Vec<u8>, NoSpace>;

    /// Sessions recovered at open, sorted by session id: what the server needs for
    /// exactly-once after a restart.
    fn sessions(&self) -> Vec<SessionRecord>;

    /// What the application persists on, for start-up banners and reports; `None` when it
    /// keeps no durable state at all (and so gives no exactly-once guarantee across restarts).
    fn medium(&self) -> Option<MediumInfo>;
}

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

/// A request handler the server runtime drives.
pub trait Application {
    /// Apply request `seq` of `session_id` and return the reply bytes. On return, the effect,
    /// the session's last applied seq (= seq) and the reply are durable together, atomically:
    /// after a crash either all of them or none survive.
    ///
    /// A request that fails to decode still counts as applied: its ERROR reply is recorded
    /// with `seq`, so the protocol never stalls on a bad payload.
    ///
    /// Calls for one session carry strictly increasing `seq` (gaps are allowed); a `seq` at or
    /// below the session's last applied seq is a bug in the caller, which must answer
    /// duplicates from [`Application::sessions`] or its own table instead.
    fn apply(&mut self, session_id: u64, seq: u32, request: &[u8]) -> Vec<u8>;

    /// Sessions recovered at open, sorted by session id: what the server needs for
    /// exactly-once after a restart.
    fn sessions(&self) -> Vec<SessionRecord>;

    /// What the application persists on, for start-up banners and reports; `None` when it
    /// keeps no durable state at all (and so gives no exactly-once guarantee across restarts).
    fn medium(&self) -> Option<MediumInfo>;
}

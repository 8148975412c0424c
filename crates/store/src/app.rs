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
/// unchanged. See [`Application::stage`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NoSpace;

impl std::fmt::Display for NoSpace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("no room in the store")
    }
}

impl std::error::Error for NoSpace {}

/// The reply to a stale request (see [`Application::stage`]): an error saying nothing was
/// applied.
pub fn stale_reply(seq: u32, last_seq: u32) -> Vec<u8> {
    crate::Reply::Error(format!(
        "stale request: seq {seq} is at or below the session's last applied seq {last_seq}; \
         nothing applied"
    ))
    .to_bytes()
}

/// A request handler the server runtime drives, in batches: it stages each request the
/// protocol hands over and commits them together, then reports them applied (raft-rs's
/// `Ready`: nothing is acknowledged before the commit that made it durable returns). A store
/// whose every stage is durable on return commits nothing; one that batches (the packet
/// store) flushes and fences once per commit instead of once per request.
pub trait Application {
    /// Stage request `seq` of `session_id` and return its reply. The effect is visible to the
    /// requests staged after it at once; at the next [`Application::commit`] the effect, the
    /// session's last applied seq (= seq) and the reply become durable together, atomically:
    /// after a crash either all of them or none survive. The reply must not be released (no
    /// server-ACK may leave) before that commit returns.
    ///
    /// A request that fails to decode still counts as applied: its ERROR reply is recorded
    /// with `seq`, so the protocol never stalls on a bad payload.
    ///
    /// `Err(NoSpace)`: the store has no room for what the request would store. **Nothing**
    /// about the request was staged, in memory or on the medium: the session's last applied
    /// seq and reply are what they were, and no effect happened (what was staged before it
    /// stays staged). A device may already have acknowledged the request to its client, so a
    /// store never turns it into a refusal; the caller keeps the request (sending no
    /// server-ACK, so every device keeps its log entry) and stages it again later with the
    /// same `seq` and bytes, once deletes may have made room. Only a request that needs new
    /// room returns it (a SET, an INCR or an APPEND); a GET, a DEL, or a request that fails to
    /// decode never does: a DEL must always be able to run in a full store, or nothing could
    /// ever free space (each store keeps room for it; see its own documentation).
    ///
    /// Calls for one session carry strictly increasing `seq` (gaps are allowed; a refused
    /// `seq` is retried before any later one); the caller answers duplicates from
    /// [`Application::sessions`] or its own table. One exception: a server whose table
    /// forgot a session the store still records starts it again from nothing and may stage
    /// the no-op fill of one of its old numbers (docs/protocol.md, "Sessions"). A `seq` at or
    /// below the session's last applied seq is therefore **stale**: nothing is applied, the
    /// record is unchanged, and the reply is [`stale_reply`].
    fn stage(&mut self, session_id: u64, seq: u32, request: &[u8]) -> Result<Vec<u8>, NoSpace>;

    /// The server's time now (milliseconds, of its own clock). Called before requests are
    /// staged. Once it has been called, a store that evicts sessions forgets only a session
    /// the server permitted ([`Application::permit_eviction`]): it refuses a new session's
    /// request with [`NoSpace`] instead, and the server retries it. Never called: any
    /// session may be forgotten.
    fn note_time(&mut self, _now_ms: u64) {}

    /// The session admitting `for_session` would evict now, with when it last applied a
    /// request (the server's milliseconds; sessions recovered at open count as applied when
    /// the server first told the time); `None` when the store knows `for_session`, has room,
    /// or never evicts. The
    /// server permits it only once no device can still resend a request of it
    /// (docs/protocol.md, "Sessions").
    fn eviction_candidate(&mut self, _for_session: u64) -> Option<(u64, u64)> {
        None
    }

    /// The next eviction may forget `session_id` (and no other).
    fn permit_eviction(&mut self, _session_id: u64) {}

    /// Make everything staged durable. May do nothing, for a store whose stages are durable
    /// when they return.
    fn commit(&mut self);

    /// Requests one commit may cover at most: the caller commits when this many are staged.
    fn max_staged(&self) -> usize {
        usize::MAX
    }

    /// Stage one request and commit it: durable when it returns.
    fn apply(&mut self, session_id: u64, seq: u32, request: &[u8]) -> Result<Vec<u8>, NoSpace> {
        let reply = self.stage(session_id, seq, request)?;
        self.commit();
        Ok(reply)
    }

    /// Answer a read (a cache read, unsequenced: nothing is recorded) on what is committed and
    /// staged; a request that is not a read is answered with an ERROR reply and changes
    /// nothing.
    fn read(&mut self, request: &[u8]) -> Vec<u8>;

    /// Sessions recovered at open, sorted by session id: what the server needs for
    /// exactly-once after a restart.
    fn sessions(&self) -> Vec<SessionRecord>;

    /// What the application persists on, for start-up banners and reports; `None` when it
    /// keeps no durable state at all (and so gives no exactly-once guarantee across restarts).
    fn medium(&self) -> Option<MediumInfo>;
}

//! Applying what the server hands over, in batches: the one executor of server-side
//! persistence, shared by the runtime and the simulator (raft-rs's `Ready`, server side).
//!
//! Each request is staged on the application; the batch is committed (made durable) once;
//! only then is each of its requests reported applied, which is what lets its server-ACK
//! leave. A request the store has no room for is handed back with [`Server::on_deferred`],
//! after committing and reporting what the batch staged before it (the server takes a request
//! back only as its session's next).

use super::{Server, ServerEvent};
use crate::{RequestKind, Time};

/// The application side of a server, as the executor sees it.
pub trait Stager {
    /// Stage request `seq` of `session_id`: its effect visible to later requests at once,
    /// durable (with the session's seq and the reply) at the next [`Stager::commit`]. Its
    /// reply, or `None` when the store has no room for it: then nothing of it was staged.
    fn stage(
        &mut self,
        session_id: u64,
        seq: u32,
        kind: RequestKind,
        request: &[u8],
    ) -> Option<Vec<u8>>;
    /// The server's time now (see the application's `note_time`): called before requests
    /// are staged.
    fn note_time(&mut self, _now_ms: u64) {}
    /// The session the application would forget to make room for `for_session`, with when
    /// it last applied a request (milliseconds, the server's clock); `None` when it knows
    /// `for_session`, has room or never forgets (see the application's
    /// `eviction_candidate`).
    fn eviction_candidate(&mut self, _for_session: u64) -> Option<(u64, u64)> {
        None
    }
    /// The application may forget `session_id` to make room (the devices cleared it).
    fn permit_eviction(&mut self, _session_id: u64) {}
    /// Make everything staged durable.
    fn commit(&mut self);
    /// Requests one commit covers at most.
    fn max_staged(&self) -> usize;
    /// Answer a cache read on what is applied (committed), recording nothing.
    fn read(&mut self, request: &[u8]) -> Vec<u8>;
    /// The application's error reply saying `message` (for a read that cannot be answered
    /// with a value: [`super::WAITS_FOR_ROOM`]).
    fn error_reply(&self, message: &str) -> Vec<u8>;
}

/// What one call of [`Server::apply_ready`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Applied {
    /// Requests staged, committed and reported applied.
    pub applied: u64,
    /// Commits made (each covering at least one request).
    pub commits: u64,
    /// Requests handed back for lack of room.
    pub deferred: u64,
    /// Recoveries completed (see [`super::ServerEvent::RecoveryComplete`]).
    pub recoveries_complete: Vec<super::RecoveryReport>,
    /// Cache reads answered.
    pub reads: u64,
}

impl Applied {
    /// Whether anything happened.
    pub fn is_empty(&self) -> bool {
        *self == Applied::default()
    }
}

impl Server {
    /// Apply every request the server has handed over, in batches (see the module docs).
    /// Call it after every input, like `poll_transmit`; it drains [`Server::poll_event`].
    pub fn apply_ready(&mut self, now: Time, app: &mut dyn Stager) -> Applied {
        let mut outcome = Applied::default();
        let mut staged: Vec<(u64, u32, Vec<u8>)> = Vec::new();
        app.note_time(now.as_nanos() / 1_000_000);
        // Reporting a commit's requests applied may hand over more (a read or a keyed write
        // that waited for them): go on until nothing is left.
        loop {
            let Some(event) = self.poll_event() else {
                self.commit_staged(now, app, &mut staged, &mut outcome);
                if self.events.is_empty() {
                    break;
                }
                continue;
            };
            match event {
                ServerEvent::Apply {
                    session_id,
                    seq,
                    kind,
                    request,
                } => match self
                    .permit_app_eviction(now, app, session_id)
                    .stage(session_id, seq, kind, &request)
                {
                    Some(reply) => {
                        staged.push((session_id, seq, reply));
                        if staged.len() >= app.max_staged().max(1) {
                            self.commit_staged(now, app, &mut staged, &mut outcome);
                        }
                    }
                    None => {
                        self.commit_staged(now, app, &mut staged, &mut outcome);
                        outcome.deferred += 1;
                        self.on_deferred(now, session_id, seq, kind, request);
                    }
                },
                ServerEvent::RecoveryComplete(report) => {
                    outcome.recoveries_complete.push(report);
                }
                ServerEvent::Read {
                    session_id,
                    id,
                    request,
                } => {
                    // On what is durable only: commit what is staged first.
                    self.commit_staged(now, app, &mut staged, &mut outcome);
                    let reply = app.read(&request);
                    outcome.reads += 1;
                    self.on_read_reply(session_id, id, &reply);
                }
                ServerEvent::ReadWaitsForRoom { session_id, id } => {
                    let reply = app.error_reply(super::WAITS_FOR_ROOM);
                    outcome.reads += 1;
                    self.on_read_reply_with(session_id, id, &reply, false);
                }
            }
        }
        outcome
    }

    /// Let the application forget the session it would evict for `for_session` if no device
    /// can still resend a request of it (`hold.rs`); ask the devices about it if it is idle
    /// long enough otherwise.
    fn permit_app_eviction<'a>(
        &mut self,
        now: Time,
        app: &'a mut dyn Stager,
        for_session: u64,
    ) -> &'a mut dyn Stager {
        if let Some((session_id, last_ms)) = app.eviction_candidate(for_session) {
            let last = Time::from_nanos(last_ms.saturating_mul(1_000_000));
            if self.holds.may_forget(now, session_id, last) {
                app.permit_eviction(session_id);
            } else if last + self.holds.keep() < now {
                self.holds.want(now, session_id);
            }
        }
        app
    }

    /// Commit what is staged, then report each of its requests applied.
    fn commit_staged(
        &mut self,
        now: Time,
        app: &mut dyn Stager,
        staged: &mut Vec<(u64, u32, Vec<u8>)>,
        outcome: &mut Applied,
    ) {
        if staged.is_empty() {
            return;
        }
        app.commit();
        outcome.commits += 1;
        for (session_id, seq, reply) in staged.drain(..) {
            outcome.applied += 1;
            self.on_applied(now, session_id, seq, reply);
        }
    }
}

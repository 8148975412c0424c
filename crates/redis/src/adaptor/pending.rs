//! A request at Redis or on its way there, and what each reply on a connection answers: what
//! the connections (connections.rs) keep and the translation (translation.rs) makes.

use std::sync::Arc;

/// What the adaptor does with a request.
#[derive(Debug, Clone)]
pub(super) enum Op {
    /// Run through the apply script.
    Write(Vec<Vec<u8>>),
    /// Record this reply through the apply script, run nothing.
    Literal(Vec<u8>),
    /// Run as is (resent through the checked read when a later write may have been applied).
    Read(Vec<Vec<u8>>),
    /// Run as is, always.
    StatelessRead(Vec<Vec<u8>>),
    /// Through the apply script in another mode than `c`: these words follow the TTL (a
    /// transaction, `x …`; `FLUSHALL`, `f …`).
    Apply(Vec<Vec<u8>>),
    /// A user's script in its exactly-once wrapper: `EVAL wrapper 1+keys record keys… seq ttl
    /// args…`.
    UserScript {
        wrapper: Arc<[u8]>,
        keys: Vec<Vec<u8>>,
        args: Vec<Vec<u8>>,
    },
    /// The fingerprints of watched keys (like a read: resent through its bound).
    Watch(Vec<Vec<u8>>),
    /// `SCRIPT LOAD body`, then the body remembered in the records' database.
    ScriptLoad(Vec<u8>),
}

impl Op {
    /// Whether a read resent after it must not see this request's effects (it changes data).
    pub(super) fn writes(&self) -> bool {
        matches!(
            self,
            Op::Write(_) | Op::Literal(_) | Op::Apply(_) | Op::UserScript { .. }
        )
    }

    /// Whether this request reads data of its session's place in the sequence.
    pub(super) fn reads(&self) -> bool {
        matches!(self, Op::Read(_) | Op::Watch(_))
    }
}

/// How a request was last sent: how to read its reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SentAs {
    Script,
    Direct,
}

/// A request taken from the server: at Redis, or waiting for its connection to open.
#[derive(Debug)]
pub(super) struct Pending {
    pub(super) session_id: u64,
    pub(super) seq: u32,
    /// The database the request runs in (its client's `SELECT`).
    pub(super) db: u32,
    pub(super) op: Op,
    pub(super) sent_as: SentAs,
}

/// What the next reply on a connection answers.
#[derive(Debug, Clone, Copy)]
pub(super) enum Expect {
    /// A reply to the connection's set-up (`AUTH`, `SCRIPT LOAD`): an error closes it.
    Setup(&'static str),
    Request,
    /// The reply to a group of this many requests (the group script): one `{status, reply}`
    /// for each, in order.
    Group(usize),
    /// A reply nobody waits for (remembering a script body): an error is only logged.
    Ignore,
}

//! What a request's reply becomes when it completes: the gateway's requests (request.rs) and
//! its direct connections (direct/) both make and complete them.

use super::connection::AfterExec;

/// What a request's reply becomes when it completes.
#[derive(Debug)]
pub(super) enum Then {
    /// The reply as it is (converted to RESP3 for a RESP3 client: the command is kept).
    Plain(Option<Vec<Vec<u8>>>),
    /// The fingerprints of these watched keys: kept, and the client gets `+OK`.
    Watch(Vec<Vec<u8>>),
    /// A transaction's reply: the array of these commands' replies; what its connection
    /// commands do to the connection once it ran.
    Exec(Vec<Vec<Vec<u8>>>, AfterExec),
    /// The adaptor's answer to a `SELECT` of this database: on `+OK` the connection's later
    /// requests run in it.
    Select(Option<u32>),
    /// A barrier before (or after) a direct command: no reply of its own.
    Barrier,
    /// A write of the connection's own naming a watched key: as `Plain`, and once Redis
    /// answered that it changed something (`shown`), the next `EXEC` fails; nothing more
    /// starts until it is answered.
    Touching {
        args: Option<Vec<Vec<u8>>>,
        shown: ChangeShown,
    },
}

/// What a write command's reply tells of whether it changed something.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ChangeShown {
    /// Write commands that did nothing answer an error, 0 (`DEL`, `SREM`, `EXPIRE`, …), -1
    /// (`LINSERT` without its pivot), a nil (`SET … NX`, `LPOP` of nothing) or an empty array
    /// (`SPOP k n` of nothing); anything else is a change.
    ByShape,
    /// 0 answers a change too (`HSET` of a field that existed, `ZADD` of a new score, `SETBIT`
    /// of a bit that was 0, `INCR` to 0, …): anything but an error or a nil is a change.
    ZeroToo,
    /// A script or function: anything but an error may have changed something.
    Anything,
}

impl ChangeShown {
    pub(super) fn of(name: &[u8]) -> ChangeShown {
        const ZERO_TOO: &[&[u8]] = &[
            b"HSET", b"ZADD", b"SETBIT", b"INCR", b"DECR", b"INCRBY", b"DECRBY", b"HINCRBY",
        ];
        const ANYTHING: &[&[u8]] = &[b"EVAL", b"EVALSHA", b"FCALL"];
        let is = |names: &[&[u8]]| names.iter().any(|known| known.eq_ignore_ascii_case(name));
        if is(ANYTHING) {
            ChangeShown::Anything
        } else if is(ZERO_TOO) {
            ChangeShown::ZeroToo
        } else {
            ChangeShown::ByShape
        }
    }

    /// Whether `reply` shows a change (Redis marks a watched key changed only when a write did
    /// something).
    pub(super) fn changed(self, reply: &[u8]) -> bool {
        let nothing = matches!(reply, [b'-', ..] | b"*-1\r\n" | b"$-1\r\n" | b"_\r\n");
        let shaped = matches!(reply, b"*0\r\n" | b":-1\r\n" | b":0\r\n");
        match self {
            ChangeShown::ByShape => !nothing && !shaped,
            ChangeShown::ZeroToo => !nothing,
            ChangeShown::Anything => !reply.starts_with(b"-"),
        }
    }
}

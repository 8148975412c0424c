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

/// What a write command's reply tells of whether it changed something. A write not marked
/// here still fails the `EXEC` when the watched key's fingerprint (its value and expiry) moved:
/// a mark is needed only where Redis marks a key whose value stayed the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ChangeShown {
    /// Write commands that did nothing answer an error, 0 (`DEL`, `SREM`, `EXPIRE`, …), -1
    /// (`LINSERT` without its pivot), a nil (`SET … NX`, `LPOP` of nothing) or an empty array
    /// (`SPOP k n` of nothing); anything else is a change.
    ByShape,
    /// 0 answers a change too (`HSET` of a field that existed, `INCR` to 0, …): anything but
    /// an error or a nil is a change.
    ZeroToo,
    /// Only a count above 0 is certain (`ZADD` of a new member, or with `CH` a new score); 0
    /// may be a new score or nothing (`XX` of a missing key, the same score), and Redis marks
    /// the key only when a score or member changed: the fingerprint tells.
    Positive,
    /// Redis marks the key only when its value changed (`SETBIT` of the bit it had,
    /// `ZINCRBY` by 0, `BITFIELD`, `GETEX` without a new expiry, `SETRANGE` of nothing,
    /// `RENAME k k`, `SMOVE k k m`): the fingerprint tells, never the reply.
    Fingerprint,
    /// A script or function: anything but an error may have changed something.
    Anything,
}

impl ChangeShown {
    /// How the reply to `args` (a write: its name first) shows a change.
    pub(super) fn of(args: &[Vec<u8>]) -> ChangeShown {
        const ZERO_TOO: &[&[u8]] = &[b"HSET", b"INCR", b"DECR", b"INCRBY", b"DECRBY", b"HINCRBY"];
        const FINGERPRINT: &[&[u8]] = &[b"SETBIT", b"ZINCRBY", b"BITFIELD", b"GETEX"];
        const ANYTHING: &[&[u8]] = &[b"EVAL", b"EVALSHA", b"FCALL"];
        let Some(name) = args.first() else {
            return ChangeShown::ByShape;
        };
        let is = |names: &[&[u8]]| names.iter().any(|known| known.eq_ignore_ascii_case(name));
        let same_keys = args.len() > 2 && args[1] == args[2];
        if is(ANYTHING) {
            ChangeShown::Anything
        } else if is(ZERO_TOO) {
            ChangeShown::ZeroToo
        } else if name.eq_ignore_ascii_case(b"ZADD") {
            ChangeShown::Positive
        } else if is(FINGERPRINT)
            || (name.eq_ignore_ascii_case(b"SETRANGE") && args.get(3).is_some_and(Vec::is_empty))
            || (same_keys
                && (name.eq_ignore_ascii_case(b"RENAME") || name.eq_ignore_ascii_case(b"SMOVE")))
        {
            ChangeShown::Fingerprint
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
            ChangeShown::Positive => {
                reply.len() > 3 && reply[0] == b':' && reply[1] != b'0' && reply[1] != b'-'
            }
            ChangeShown::Fingerprint => false,
            ChangeShown::Anything => !reply.starts_with(b"-"),
        }
    }
}

//! Translation: a PMNet request becomes one Redis command (through the apply script for
//! writes), and Redis's answer becomes the request's reply; per-session flow control keeps at
//! most [`REPLY_RING`] requests of a session at Redis.

use std::collections::VecDeque;

use pmnet_proto::{RequestKind, ServerEvent};

use crate::commands::{adaptor_class, lookup, AdaptorClass, Class};
use crate::resp::{encode_bulk, error_reply, parse_command, Value};
use crate::script::{self, REPLY_RING};

use super::connections::{Conn, Expect};
use super::Adaptor;

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
    pub(super) op: Op,
    pub(super) sent_as: SentAs,
}

/// Unsent bytes to Redis at most before the adaptor stops taking new requests.
const MAX_UNSENT_BYTES: usize = 16 << 20;

/// Per-session flow control: at most [`REPLY_RING`] requests of a session at Redis.
#[derive(Debug, Default)]
pub(super) struct Flow {
    at_redis: u32,
    held: VecDeque<(u32, Op)>,
}

/// Errors of a script call (or a direct read) that say "not now": retry later.
fn is_transient(message: &[u8]) -> bool {
    const PREFIXES: [&[u8]; 10] = [
        b"LOADING",
        b"BUSY",
        b"NOSCRIPT",
        b"OOM",
        b"MISCONF",
        b"READONLY",
        b"MASTERDOWN",
        b"TRYAGAIN",
        b"NOREPLICAS",
        b"CLUSTERDOWN",
    ];
    PREFIXES.iter().any(|prefix| message.starts_with(prefix))
}

impl Adaptor {
    /// Take requests from the server while there is room, and send them (or hold them).
    pub(super) fn take_requests(&mut self) -> bool {
        let mut any = false;
        loop {
            let unsent: usize = self.conns.iter().map(Conn::unsent).sum();
            if self.outstanding >= self.options.max_outstanding || unsent >= MAX_UNSENT_BYTES {
                break;
            }
            let Some(event) = self.server.poll_event() else {
                break;
            };
            any = true;
            match event {
                ServerEvent::Apply {
                    session_id,
                    seq,
                    kind,
                    request,
                } => {
                    let op = self.decode(kind, &request);
                    self.outstanding += 1;
                    let flow = self.flows.entry(session_id).or_default();
                    if flow.at_redis >= REPLY_RING || !flow.held.is_empty() {
                        flow.held.push_back((seq, op));
                        self.counters.held_back += 1;
                    } else {
                        flow.at_redis += 1;
                        self.dispatch(session_id, seq, op);
                    }
                }
                ServerEvent::RecoveryComplete { entries_resent } => {
                    self.counters.recoveries_completed += 1;
                    self.counters.recovery_entries_resent += entries_resent;
                    tracing::info!(
                        "recovery complete: every device answered; {entries_resent} logged \
                         requests were resent and are applied in order"
                    );
                }
            }
        }
        any
    }

    /// What to do with a request payload.
    fn decode(&mut self, kind: RequestKind, payload: &[u8]) -> Op {
        if payload.is_empty() {
            self.counters.noop_fills += 1;
            return Op::Literal(error_reply(
                "ERR pmnet: no-op fill (the client gave up on this request)",
            ));
        }
        let args = match parse_command(payload, &self.limits) {
            Ok(Some((args, used))) if used == payload.len() && !args.is_empty() => args,
            _ => {
                self.counters.bad_payloads += 1;
                return Op::Literal(error_reply(
                    "ERR pmnet-redis: the request payload is not one RESP command",
                ));
            }
        };
        if let Some(spec) = lookup(&args[0]) {
            if let Class::Refused(reason) = spec.class {
                self.counters.refused += 1;
                return Op::Literal(error_reply(&format!("ERR {reason}")));
            }
        }
        let _ = kind;
        match adaptor_class(&args) {
            AdaptorClass::StatelessRead if !self.options.record_reads => Op::StatelessRead(args),
            AdaptorClass::Read if !self.options.record_reads => Op::Read(args),
            _ => Op::Write(args),
        }
    }

    fn dispatch(&mut self, session_id: u64, seq: u32, op: Op) {
        let index = self.conn_of(session_id);
        let mut pending = Pending {
            session_id,
            seq,
            op,
            sent_as: SentAs::Direct,
        };
        let prefix = self.options.record_prefix.clone();
        let conn = &mut self.conns[index];
        if conn.stream.is_some() {
            pending.sent_as = encode_request(
                &mut conn.out,
                &prefix,
                &self.ttl_arg,
                &self.apply_sha,
                &self.read_sha,
                &pending,
                None,
            );
            conn.expect.push_back(Expect::Request);
        }
        conn.pending.push_back(pending);
    }

    /// A request of `session_id` was answered: let the next held one go.
    pub(super) fn finish(&mut self, session_id: u64) {
        self.outstanding = self.outstanding.saturating_sub(1);
        let Some(flow) = self.flows.get_mut(&session_id) else {
            return;
        };
        flow.at_redis = flow.at_redis.saturating_sub(1);
        let mut release = Vec::new();
        while flow.at_redis < REPLY_RING {
            let Some(held) = flow.held.pop_front() else {
                break;
            };
            flow.at_redis += 1;
            release.push(held);
        }
        if flow.at_redis == 0 && flow.held.is_empty() {
            self.flows.remove(&session_id);
        }
        for (seq, op) in release {
            self.dispatch(session_id, seq, op);
        }
    }

    /// Turn Redis's answer into the request's reply; `Err` when it must be sent again.
    pub(super) fn interpret(&mut self, pending: &Pending, value: Value) -> Result<Vec<u8>, String> {
        if let Value::Error(message) = &value {
            if is_transient(message) {
                self.counters.transient_errors += 1;
                return Err(format!(
                    "Redis answered {} (will retry)",
                    String::from_utf8_lossy(message)
                ));
            }
        }
        match pending.sent_as {
            SentAs::Direct => {
                self.counters.reads += 1;
                if value.is_error() {
                    self.counters.command_errors += 1;
                }
                Ok(value.to_bytes())
            }
            SentAs::Script => match value {
                Value::Array(Some(items)) if items.len() == 2 => {
                    let (status, reply) = (&items[0], &items[1]);
                    let reply = reply.as_bytes().unwrap_or_default().to_vec();
                    match status {
                        Value::Integer(script::STATUS_APPLIED) => {
                            if matches!(pending.op, Op::Read(_)) {
                                self.counters.reads += 1;
                            } else {
                                self.counters.writes_applied += 1;
                            }
                            if reply.first() == Some(&b'-') && matches!(pending.op, Op::Write(_)) {
                                self.counters.command_errors += 1;
                            }
                            Ok(reply)
                        }
                        Value::Integer(script::STATUS_ALREADY_APPLIED) => {
                            self.counters.redone_recognised += 1;
                            Ok(reply)
                        }
                        _ => {
                            self.counters.replies_gone += 1;
                            Ok(error_reply(
                                "ERR pmnet: this request was applied exactly once, but its \
                                 reply was lost in a crash",
                            ))
                        }
                    }
                }
                Value::Error(message) => {
                    // Not transient: the script itself failed (for example too many
                    // arguments for Lua). Nothing was recorded; pass Redis's error on.
                    self.counters.script_failures += 1;
                    let mut reply = vec![b'-'];
                    reply.extend_from_slice(&message);
                    reply.extend_from_slice(b"\r\n");
                    Ok(reply)
                }
                other => Err(format!("unexpected answer from the script: {other:?}")),
            },
        }
    }
}

/// Append the command that carries `pending` to `out`; returns how its reply will look.
pub(super) fn encode_request(
    out: &mut Vec<u8>,
    prefix: &str,
    ttl: &str,
    apply_sha: &str,
    read_sha: &str,
    pending: &Pending,
    read_bound: Option<u32>,
) -> SentAs {
    let key = script::record_key(prefix, pending.session_id);
    let seq = pending.seq.to_string();
    match &pending.op {
        Op::Write(args) => {
            encode_parts(
                out,
                &[
                    b"EVALSHA",
                    apply_sha.as_bytes(),
                    b"1",
                    &key,
                    seq.as_bytes(),
                    ttl.as_bytes(),
                    b"c",
                ],
                args,
            );
            SentAs::Script
        }
        Op::Literal(reply) => {
            encode_parts(
                out,
                &[
                    b"EVALSHA",
                    apply_sha.as_bytes(),
                    b"1",
                    &key,
                    seq.as_bytes(),
                    ttl.as_bytes(),
                    b"r",
                    reply,
                ],
                &[],
            );
            SentAs::Script
        }
        Op::Read(args) => match read_bound {
            Some(bound) => {
                let bound = bound.to_string();
                encode_parts(
                    out,
                    &[
                        b"EVALSHA",
                        read_sha.as_bytes(),
                        b"1",
                        &key,
                        bound.as_bytes(),
                    ],
                    args,
                );
                SentAs::Script
            }
            None => {
                encode_parts(out, &[], args);
                SentAs::Direct
            }
        },
        Op::StatelessRead(args) => {
            encode_parts(out, &[], args);
            SentAs::Direct
        }
    }
}

/// Append `*N` and bulk strings: the fixed parts, then the arguments.
fn encode_parts(out: &mut Vec<u8>, head: &[&[u8]], args: &[Vec<u8>]) {
    out.extend_from_slice(format!("*{}\r\n", head.len() + args.len()).as_bytes());
    for part in head {
        encode_bulk(part, out);
    }
    for arg in args {
        encode_bulk(arg, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transient_errors_are_recognised() {
        assert!(is_transient(
            b"LOADING Redis is loading the dataset in memory"
        ));
        assert!(is_transient(b"NOSCRIPT No matching script"));
        assert!(!is_transient(b"ERR wrong number of arguments"));
        assert!(!is_transient(b"WRONGTYPE Operation against a key"));
    }
}

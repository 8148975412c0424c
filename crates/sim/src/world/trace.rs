//! The world's event log: how headers, keys, client events and batches read in a trace, and
//! the hash of every event.

use pmnet_pm::{EntryKey, LogWork};
use pmnet_proto::{ClientEvent, Completion, PersistBatch};
use pmnet_wire::Header;

use super::{World, DEVICE_ID, SERVER_ID};

/// A header as traces show it: type, session, sequence number, fragment, flags.
pub fn describe_header(header: &Header) -> String {
    let mut text = format!(
        "{} s={:x} seq={}",
        header.packet_type, header.session_id, header.seq
    );
    if header.fragment_count > 1 {
        text.push_str(&format!(
            " frag={}/{}",
            header.fragment_index, header.fragment_count
        ));
    }
    if header.device_id != 0 {
        text.push_str(&format!(" dev={}", header.device_id));
    }
    for (bit, name) in [
        (pmnet_wire::flags::MAKEUP, "makeup"),
        (pmnet_wire::flags::REPLY_UNAVAILABLE, "reply-unavailable"),
        (pmnet_wire::flags::ALL_FRAGMENTS, "all-fragments"),
        (pmnet_wire::flags::NOOP_FILL, "noop-fill"),
    ] {
        if header.flags & bit != 0 {
            text.push_str(&format!(" +{name}"));
        }
    }
    text
}

/// A datagram as traces show it: its header, and a batch's entries after it.
pub(super) fn describe_datagram(bytes: &[u8]) -> String {
    let (header, payload) = match Header::parse(pmnet_auth::without_trailer(bytes)) {
        Ok(parsed) => parsed,
        Err(error) => {
            return format!(
                "a datagram of {} bytes that does not parse ({error})",
                bytes.len()
            )
        }
    };
    let mut text = describe_header(&header);
    match header.packet_type {
        pmnet_wire::PacketType::HoldQuery => {
            if let Ok(sessions) = pmnet_wire::decode_hold_query_payload(payload) {
                let ids: Vec<String> = sessions.iter().map(|id| format!("{id:x}")).collect();
                text.push_str(&format!(" [{}]", ids.join(" ")));
            }
        }
        pmnet_wire::PacketType::HoldReply => {
            if let Ok(held) = pmnet_wire::decode_hold_reply_payload(payload) {
                let bits: String = held.iter().map(|&h| if h { '1' } else { '0' }).collect();
                text.push_str(&format!(" [held {bits}]"));
            }
        }
        _ => {}
    }
    if header.packet_type == pmnet_wire::PacketType::Batch {
        let entries: Vec<String> = pmnet_wire::batch_entries(payload)
            .map(|entry| match entry.map(Header::parse) {
                Ok(Ok((header, _))) => describe_header(&header),
                _ => "a bad entry".to_string(),
            })
            .collect();
        text.push_str(&format!(" [{}]", entries.join("; ")));
    }
    text
}

fn describe_key(key: &EntryKey) -> String {
    format!(
        "server{} s={:x} seq={} frag={}",
        key.server_id.wrapping_sub(SERVER_ID),
        key.session_id,
        key.seq,
        key.fragment_index
    )
}

pub(super) fn describe_client_event(event: &ClientEvent) -> String {
    match event {
        ClientEvent::Completed {
            seq,
            kind,
            completion,
        } => {
            let how = match completion {
                Completion::Logged { device_id } => {
                    format!(
                        "logged by device{} (pmnet_ack)",
                        device_id.wrapping_sub(DEVICE_ID)
                    )
                }
                Completion::Replied {
                    reply,
                    makeup: false,
                } => format!("server reply, {} bytes", reply.len()),
                Completion::Replied {
                    reply,
                    makeup: true,
                } => format!("make-up server reply, {} bytes", reply.len()),
                Completion::ReplyUnavailable => "make-up ack, reply no longer kept".to_string(),
            };
            format!("completed {kind:?} seq={seq}: {how}")
        }
        ClientEvent::Failed { seq, kind, error } => {
            format!("FAILED {kind:?} seq={seq}: {error}")
        }
    }
}

/// A batch of persistence work as traces show it.
pub(super) fn describe_batch(batch: &PersistBatch<LogWork>) -> String {
    let items: Vec<String> = batch
        .work
        .iter()
        .map(|work| match work {
            LogWork::Write { slot, key, .. } => {
                format!("log write of slot {slot} ({})", describe_key(key))
            }
            LogWork::Invalidate { slot } => format!("invalidation of slot {slot}"),
        })
        .collect();
    format!("batch {}: {}", batch.number, items.join(", "))
}

impl World {
    /// A hash of every event so far: the same seed must give the same hash.
    pub fn trace_hash(&self) -> u32 {
        self.trace_hash
    }

    /// Hash an event by `actor` (a node name, `network`, `sim`, `check`) and keep it in the
    /// trace when the trace is on.
    pub(super) fn note(&mut self, actor: &str, event: impl FnOnce() -> String) {
        let text = format!("{:>16}  {actor:<8} {}", self.now.to_string(), event());
        self.trace_hash = crc32c::crc32c_append(self.trace_hash, text.as_bytes());
        if let Some(trace) = self.trace.as_mut() {
            trace.push(text);
        }
    }

    /// A datagram event: hashed always, kept in the trace unless `trace_datagrams` is off.
    pub(super) fn note_datagram(&mut self, actor: &str, event: impl FnOnce() -> String) {
        let keep = self.trace_datagrams;
        let trace = if keep { None } else { self.trace.take() };
        self.note(actor, event);
        if !keep {
            self.trace = trace;
        }
    }

    /// Note an event of the caller's (faults, crashes, checks) in the trace, by `sim`.
    pub fn note_event(&mut self, text: &str) {
        self.note("sim", || text.to_string());
    }

    /// Note an event of the caller's by `actor` (`device0`, `network`, `check`, ...).
    pub fn note_by(&mut self, actor: &str, text: &str) {
        self.note(actor, || text.to_string());
    }

    /// The trace of datagrams seen, for failure messages.
    pub fn seen_trace(&self) -> String {
        let mut out = String::new();
        for seen in &self.seen {
            out.push_str(&format!(
                "{} {} -> {} {} s={:x} seq={} frag={}/{}{}\n",
                seen.at,
                seen.from,
                seen.to,
                seen.header.packet_type,
                seen.header.session_id,
                seen.header.seq,
                seen.header.fragment_index,
                seen.header.fragment_count,
                if seen.dropped { " DROPPED" } else { "" }
            ));
        }
        out
    }
}

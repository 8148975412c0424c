//! The world's events in its network's trace (`crate::network::Trace`): how keys, client
//! events and batches read, and the world's notes.

use pmnet_pm::{EntryKey, LogWork};
use pmnet_proto::{ClientEvent, Completion, PersistBatch};

use super::{World, DEVICE_ID, SERVER_ID};

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
        self.network.trace.hash()
    }

    /// Hash an event by `actor` (a node name, `network`, `sim`, `check`) and keep it in the
    /// trace when the trace is on.
    pub(super) fn note(&mut self, actor: &str, event: impl FnOnce() -> String) {
        self.network.trace.note(self.now, actor, event);
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
        for seen in &self.network.seen {
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

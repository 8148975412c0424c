//! The one trace writer of every world: each event a line `<virtual time>  <actor>  <event>`,
//! all of them hashed (the same seed must give the same hash), kept when the trace is on;
//! datagram lines (`send`, `recv`) hashed always and kept unless `datagrams` is off. Also how
//! headers and datagrams read in a trace.

use pmnet_proto::Time;
use pmnet_wire::Header;

/// A world's event log and its hash.
#[derive(Debug, Clone, Default)]
pub struct Trace {
    /// The readable lines, when the trace is on.
    pub lines: Option<Vec<String>>,
    /// Keep datagram lines in `lines` (they are hashed either way).
    pub datagrams: bool,
    hash: u32,
}

impl Trace {
    /// A trace that keeps nothing (it hashes every event): turn it on with [`Trace::keep`].
    pub fn new() -> Trace {
        Trace {
            lines: None,
            datagrams: true,
            hash: 0,
        }
    }

    /// Keep the readable lines from now on, the datagram lines when `datagrams`.
    pub fn keep(&mut self, datagrams: bool) {
        self.lines = Some(Vec::new());
        self.datagrams = datagrams;
    }

    /// A hash of every event so far.
    pub fn hash(&self) -> u32 {
        self.hash
    }

    /// Hash an event by `actor` (a node name, `network`, `sim`, `check`, ...) at `now`, and
    /// keep it when the trace is on.
    pub fn note(&mut self, now: Time, actor: &str, event: impl FnOnce() -> String) {
        let text = format!("{:>16}  {actor:<8} {}", now.to_string(), event());
        self.hash = crc32c::crc32c_append(self.hash, text.as_bytes());
        if let Some(lines) = self.lines.as_mut() {
            lines.push(text);
        }
    }

    /// A datagram event: hashed always, kept unless `datagrams` is off.
    pub fn note_datagram(&mut self, now: Time, actor: &str, event: impl FnOnce() -> String) {
        let lines = if self.datagrams {
            None
        } else {
            self.lines.take()
        };
        self.note(now, actor, event);
        if !self.datagrams {
            self.lines = lines;
        }
    }
}

/// A run of a world with its trace: what it found, the trace's hash, and its lines when they
/// were kept.
#[derive(Debug, Clone)]
pub struct TracedRun<R> {
    pub result: Result<R, String>,
    pub trace_hash: u32,
    pub trace: Option<Vec<String>>,
}

impl<R> TracedRun<R> {
    /// A run that could not start: its error, no trace.
    pub fn not_started(error: String) -> TracedRun<R> {
        TracedRun {
            result: Err(error),
            trace_hash: 0,
            trace: None,
        }
    }

    /// A run that ended at `now` with `result`: its verdict noted last in `trace`, the trace's
    /// hash given to the report (`set_hash`) and to the run, and the lines taken.
    pub fn conclude(
        trace: &mut Trace,
        now: Time,
        mut result: Result<R, String>,
        set_hash: impl FnOnce(&mut R, u32),
    ) -> TracedRun<R> {
        let verdict = match &result {
            Ok(_) => "PASS".to_string(),
            Err(error) => format!("FAILED: {error}"),
        };
        trace.note(now, "check", || verdict);
        let trace_hash = trace.hash();
        if let Ok(report) = result.as_mut() {
            set_hash(report, trace_hash);
        }
        TracedRun {
            result,
            trace_hash,
            trace: trace.lines.take(),
        }
    }
}

/// A header as traces show it: type, session, sequence number, fragment, flags.
pub fn describe_header(header: &Header) -> String {
    let name = match header.packet_type {
        pmnet_wire::PacketType::Reserved(pmnet_wire::route::NODE_STATUS) => "status",
        pmnet_wire::PacketType::Reserved(pmnet_wire::route::ROUTE) => "route",
        other => other.name(),
    };
    let mut text = format!("{name} s={:x} seq={}", header.session_id, header.seq);
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
pub fn describe_datagram(bytes: &[u8]) -> String {
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
    // An encrypted status or route reads as nothing.
    let encrypted = header.flags & pmnet_wire::flags::ENCRYPTED != 0;
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
        // The control plane of devices in series: a node's status, the controller's route.
        pmnet_wire::PacketType::Reserved(pmnet_wire::route::NODE_STATUS) if !encrypted => {
            if let Ok(status) = pmnet_wire::route::NodeStatus::parse(payload) {
                text.push_str(&format!(
                    " [{} boot {:x} epoch {} stamp {}]",
                    status.role.name(),
                    status.boot,
                    status.epoch,
                    status.stamp
                ));
            }
        }
        pmnet_wire::PacketType::Reserved(pmnet_wire::route::ROUTE) if !encrypted => {
            if let Ok(route) = pmnet_wire::route::Route::parse(payload) {
                let devices: Vec<String> = (route.chain.devices.iter())
                    .map(|(id, _)| id.to_string())
                    .collect();
                text.push_str(&format!(
                    " [epoch {} for boot {:x}: devices {}]",
                    route.epoch,
                    route.boot,
                    devices.join(" > ")
                ));
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

//! Whether the path behind the gateway answers — the device, the adaptor and the Redis behind
//! it — so that a client whose command cannot be served learns it at once, with the part that
//! is down named, instead of after every retransmission.
//!
//! The gateway sends a `PING` of its own (a bypass request on a PMNet session of its own) every
//! half `--down-after`; Redis answers it through the whole path. The path is taken for down
//! when that probe goes unanswered for `--down-after` (default 2 s) — named by what the network
//! said of the device (nothing listens there) or by its silence — or is answered with the
//! adaptor's error naming Redis; it is up again at the next `+PONG`. While it is down, bypass requests (and, when
//! the device itself is down, updates) are answered with an error naming the missing part
//! without being sent — so never applied — and new connections get that error and are
//! closed. Updates when only the server side is down still go: the device logs and acks them,
//! and Redis applies them when it answers again.
//!
//! The same session asks Redis for its command table (`COMMAND`) once, at start-up (also with
//! `--down-after 0`): the gateway checks each command queued inside `MULTI` against it, as
//! Redis does (unknown commands and subcommands, wrong number of arguments: an error at once,
//! and `EXEC` then answers `EXECABORT`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pmnet_proto::{Client, ClientConfig, ClientEvent, Completion, Transmit};
use pmnet_runtime::{Clock, PeerWatch};
use pmnet_wire::{Header, PacketType};

use crate::resp::{parse_value, Limits};
use crate::table::CommandTable;

/// Which part of the path is down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum DownPart {
    /// The device: nothing can be logged either.
    Device,
    /// Something behind the device (the adaptor, or Redis): updates are still logged.
    Behind,
}

/// The probe's state and what it found.
#[derive(Debug)]
pub(super) struct Health {
    probe: Client,
    device: SocketAddr,
    /// `None`: no probing (`--down-after 0`), the command table is still fetched.
    down_after: Option<Duration>,
    /// Redis's command table, once fetched.
    table: Option<Arc<CommandTable>>,
    /// The `COMMAND` request in flight, and when it was first asked for.
    table_in_flight: Option<u32>,
    /// When the command table was last asked for (it is a probe of the path too).
    table_sent: Option<Instant>,
    table_first_asked: Option<Instant>,
    /// The probe in flight, and when it was sent.
    in_flight: Option<(u32, Instant)>,
    next_probe: Instant,
    /// When to ask for the command table (again).
    next_table: Instant,
    /// The highest sequence number the probe sent.
    last_started: u32,
    /// No-op fills for a restarted adaptor, to send.
    fills: Vec<Transmit>,
    /// Why the path is down, and which part.
    down: Option<(DownPart, String)>,
    /// Probes sent and answered with `+PONG`, for the report.
    pub(super) probes_sent: u64,
    pub(super) probes_answered: u64,
}

/// The probe's request: `PING`, answered by Redis through the whole path.
const PING: &[u8] = b"*1\r\n$4\r\nPING\r\n";
/// The command table's request.
const COMMAND: &[u8] = b"*1\r\n$7\r\nCOMMAND\r\n";
/// How long commands queued inside `MULTI` wait for the command table at most (then they are
/// queued unchecked: the adaptor checks them at `EXEC`).
const TABLE_WAIT: Duration = Duration::from_secs(5);

impl Health {
    /// A probe on session `session_id` to `device` (the config is the gateway's sessions'
    /// shape: server id, keys).
    pub(super) fn new(config: ClientConfig, down_after: Option<Duration>) -> Health {
        let device = config.peer;
        let mut config = config;
        config.window = 1;
        Health {
            probe: Client::new(config),
            device,
            down_after,
            table: None,
            table_in_flight: None,
            table_sent: None,
            table_first_asked: None,
            in_flight: None,
            next_probe: Instant::now(),
            next_table: Instant::now(),
            last_started: 0,
            fills: Vec::new(),
            down: None,
            probes_sent: 0,
            probes_answered: 0,
        }
    }

    pub(super) fn session_id(&self) -> u64 {
        self.probe.session_id()
    }

    /// Whether the path is probed (`--down-after` is not 0).
    pub(super) fn watching(&self) -> bool {
        self.down_after.is_some()
    }

    /// Redis's command table, once fetched.
    pub(super) fn table(&self) -> Option<&Arc<CommandTable>> {
        self.table.as_ref()
    }

    /// Whether commands queued inside `MULTI` should wait for the command table: not fetched
    /// yet, the path not known to be down, and asked for less than [`TABLE_WAIT`] ago.
    pub(super) fn table_pending(&self) -> bool {
        self.table.is_none()
            && self.down.is_none()
            && self
                .table_first_asked
                .is_none_or(|asked| asked.elapsed() < TABLE_WAIT)
    }

    /// Why the path is down and which part, if it is.
    pub(super) fn down(&self) -> Option<(DownPart, &str)> {
        self.down.as_ref().map(|(part, why)| (*part, why.as_str()))
    }

    /// A datagram for the probe's session.
    pub(super) fn handle(&mut self, clock: &Clock, from: SocketAddr, datagram: &[u8]) {
        if let Some(fill) = self.fill_for_completed(datagram) {
            self.fills.push(Transmit {
                destination: self.device,
                bytes: fill,
            });
        }
        self.probe.handle(clock.now(), from, datagram);
    }

    /// The probe sends only reads (`PING`, `COMMAND`), which the adaptor does not record: a
    /// restarted adaptor resumes the probe's session from its start and asks for the numbers
    /// before the probe's next request. Each is answered with a no-op fill, as the gateway
    /// answers its clients' completed reads (see `fill_for_completed_read` in `mod.rs`), or the
    /// probe would wait for ever and the path would stay down.
    fn fill_for_completed(&self, datagram: &[u8]) -> Option<Vec<u8>> {
        if datagram.get(3) != Some(&PacketType::RetransmitRequest.code()) {
            return None;
        }
        let (header, _) = Header::parse(datagram).ok()?;
        let in_flight = [self.in_flight.map(|(seq, _)| seq), self.table_in_flight];
        if header.packet_type != PacketType::RetransmitRequest
            || header.seq == 0
            || header.seq > self.last_started
            || in_flight.contains(&Some(header.seq))
        {
            return None;
        }
        Some(pmnet_wire::encode_noop_fill(
            header.server_id,
            header.session_id,
            header.seq,
        ))
    }

    /// A reply some client got: an adaptor's error naming Redis tells the path is down
    /// before the next probe does.
    pub(super) fn saw_reply(&mut self, reply: &[u8]) {
        if let (Some(why), true) = (redis_down_reason(reply), self.watching()) {
            self.set_down(DownPart::Behind, why);
        }
    }

    /// One turn: send the next probe when due, take in its answer, decide. Datagrams to send
    /// go to `out`. Returns whether the command table arrived.
    pub(super) fn tick(
        &mut self,
        clock: &Clock,
        devices: &PeerWatch,
        out: &mut Vec<Transmit>,
    ) -> bool {
        let mut table_arrived = false;
        let now = Instant::now();
        let pmnet_now = clock.now();
        if self
            .probe
            .poll_timeout()
            .is_some_and(|deadline| deadline <= pmnet_now)
        {
            self.probe.handle_timeout(pmnet_now);
        }
        while let Some(event) = self.probe.poll_event() {
            let seq = match &event {
                ClientEvent::Completed { seq, .. } | ClientEvent::Failed { seq, .. } => *seq,
            };
            if self.table_in_flight == Some(seq) {
                self.table_in_flight = None;
                self.table_sent = None;
                if let ClientEvent::Completed {
                    completion: Completion::Replied { reply, .. },
                    ..
                } = &event
                {
                    self.table = parse_table(reply).map(Arc::new);
                    table_arrived = self.table.is_some();
                    // Redis answered through the whole path, as it answers the probe's PING.
                    if table_arrived {
                        self.set_up();
                    } else if let Some(why) = redis_down_reason(reply) {
                        self.set_down(DownPart::Behind, why);
                    }
                }
                continue;
            }
            self.in_flight = None;
            match event {
                ClientEvent::Completed {
                    completion: Completion::Replied { reply, .. },
                    ..
                } => {
                    if reply.starts_with(b"+PONG") {
                        self.probes_answered += 1;
                        self.set_up();
                    } else if let Some(why) = redis_down_reason(&reply) {
                        self.set_down(DownPart::Behind, why);
                    }
                }
                ClientEvent::Completed { .. } => {}
                ClientEvent::Failed { .. } => {}
            }
        }
        // Down once the probe has gone unanswered for `down_after` (a device restarting, or
        // Redis failing over, in less than that is not an outage clients hear of).
        // The command table's request waits on the same path as a PING would.
        let waiting_since = self.waiting_since();
        if let (Some(sent), Some(down_after)) = (waiting_since, self.down_after) {
            let silent = now.saturating_duration_since(sent);
            if silent >= down_after {
                let why = devices.silence(self.device).unwrap_or_else(|| {
                    format!(
                        "no reply through the device at {} for {:.1} s: the adaptor (`pmnet \
                         redis-adaptor`) or the redis-server behind it does not answer",
                        self.device,
                        silent.as_secs_f64()
                    )
                });
                let part = if why.starts_with("nothing listens")
                    || why.contains("never answered")
                    || why.contains("stopped answering")
                {
                    DownPart::Device
                } else {
                    DownPart::Behind
                };
                if self.down.as_ref().is_none_or(|(old, _)| *old != part) {
                    self.set_down(part, why);
                }
            }
        }
        let idle = self.in_flight.is_none() && self.table_in_flight.is_none();
        if self.table.is_none() && idle && now >= self.next_table && self.probe.can_send() {
            // The command table first (asked again a second later if it did not come).
            if let Ok(seq) = self.probe.bypass(pmnet_now, COMMAND) {
                self.last_started = self.last_started.max(seq);
                self.table_in_flight = Some(seq);
                self.table_sent = Some(now);
                self.table_first_asked.get_or_insert(now);
            }
            self.next_table = now + Duration::from_secs(1);
        } else if let (true, Some(down_after)) = (idle, self.down_after) {
            if now >= self.next_probe && self.probe.can_send() {
                if let Ok(seq) = self.probe.bypass(pmnet_now, PING) {
                    self.last_started = self.last_started.max(seq);
                    self.in_flight = Some((seq, now));
                    self.probes_sent += 1;
                }
                self.next_probe = now + down_after / 2;
            }
        }
        while let Some(transmit) = self.probe.poll_transmit() {
            out.push(transmit);
        }
        out.append(&mut self.fills);
        table_arrived
    }

    /// When the probe next needs a turn.
    pub(super) fn next_timer(&self, clock: &Clock) -> Duration {
        let now = Instant::now();
        let probe = self
            .probe
            .poll_timeout()
            .map_or(Duration::MAX, |at| clock.until(at));
        // The next request is due only when none is in flight (its retransmissions are the
        // probe client's own timer), and a verdict only while its moment is still ahead: a
        // deadline already passed must not wake the loop again and again.
        let idle = self.in_flight.is_none() && self.table_in_flight.is_none();
        let next = match (idle, self.down_after, self.table.is_none()) {
            (false, _, _) => Duration::MAX,
            (true, _, true) => self.next_table.saturating_duration_since(now),
            (true, Some(_), false) => self.next_probe.saturating_duration_since(now),
            (true, None, false) => Duration::MAX,
        };
        let waiting_since = self.waiting_since();
        let verdict = match (waiting_since, self.down_after) {
            (Some(sent), Some(down_after)) if sent + down_after > now => {
                (sent + down_after).saturating_duration_since(now)
            }
            _ => Duration::MAX,
        };
        probe.min(next).min(verdict)
    }

    /// Since when the path owes an answer: the PING in flight, or else the command table's
    /// request (it crosses the same path).
    fn waiting_since(&self) -> Option<Instant> {
        self.in_flight
            .map(|(_, sent)| sent)
            .or(self.table_in_flight.and(self.table_sent))
    }

    fn set_down(&mut self, part: DownPart, why: String) {
        if self.down.as_ref().is_none_or(|(_, old)| *old != why) {
            tracing::warn!("serving no new commands that need it: {why}");
        }
        self.down = Some((part, why));
    }

    fn set_up(&mut self) {
        if let Some((_, why)) = self.down.take() {
            tracing::info!("the path to Redis answers again (it was down: {why})");
        }
    }
}

/// Redis's reply to `COMMAND`, as a table.
fn parse_table(reply: &[u8]) -> Option<CommandTable> {
    let limits = Limits {
        max_depth: 16,
        ..Limits::default()
    };
    match parse_value(reply, &limits) {
        Ok(Some((value, used))) if used == reply.len() => CommandTable::from_reply(&value),
        _ => None,
    }
}

/// The adaptor's error for a request it did not apply because Redis is down
/// (`-ERR pmnet: redis-server at ADDR does not answer …; the command was not applied`): the
/// reason, without the prefix and the suffix.
fn redis_down_reason(reply: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(reply.strip_prefix(b"-ERR pmnet: ")?).ok()?;
    if !text.starts_with("redis-server at ") {
        return None;
    }
    let text = text.trim_end_matches("\r\n");
    Some(
        text.trim_end_matches("; the command was not applied")
            .to_owned(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_adaptors_error_names_redis() {
        let reply = b"-ERR pmnet: redis-server at 127.0.0.1:6379 does not answer (cannot \
                      connect, for 2.1 s; is it running there?); the command was not applied\r\n";
        assert_eq!(
            redis_down_reason(reply).as_deref(),
            Some(
                "redis-server at 127.0.0.1:6379 does not answer (cannot connect, for 2.1 s; is \
                 it running there?)"
            )
        );
        assert_eq!(redis_down_reason(b"-ERR something else\r\n"), None);
        assert_eq!(redis_down_reason(b"+PONG\r\n"), None);
    }
}

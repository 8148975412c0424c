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

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use pmnet_proto::{Client, ClientConfig, ClientEvent, Completion, Transmit};
use pmnet_runtime::{Clock, PeerWatch};

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
    down_after: Duration,
    /// The probe in flight, and when it was sent.
    in_flight: Option<(u32, Instant)>,
    next_probe: Instant,
    /// Why the path is down, and which part.
    down: Option<(DownPart, String)>,
    /// Probes sent and answered with `+PONG`, for the report.
    pub(super) probes_sent: u64,
    pub(super) probes_answered: u64,
}

/// The probe's request: `PING`, answered by Redis through the whole path.
const PING: &[u8] = b"*1\r\n$4\r\nPING\r\n";

impl Health {
    /// A probe on session `session_id` to `device` (the config is the gateway's sessions'
    /// shape: server id, keys).
    pub(super) fn new(config: ClientConfig, down_after: Duration) -> Health {
        let device = config.peer;
        let mut config = config;
        config.window = 1;
        Health {
            probe: Client::new(config),
            device,
            down_after,
            in_flight: None,
            next_probe: Instant::now(),
            down: None,
            probes_sent: 0,
            probes_answered: 0,
        }
    }

    pub(super) fn session_id(&self) -> u64 {
        self.probe.session_id()
    }

    /// Why the path is down and which part, if it is.
    pub(super) fn down(&self) -> Option<(DownPart, &str)> {
        self.down.as_ref().map(|(part, why)| (*part, why.as_str()))
    }

    /// A datagram for the probe's session.
    pub(super) fn handle(&mut self, clock: &Clock, from: SocketAddr, datagram: &[u8]) {
        self.probe.handle(clock.now(), from, datagram);
    }

    /// A reply some client got: an adaptor's error naming Redis tells the path is down
    /// before the next probe does.
    pub(super) fn saw_reply(&mut self, reply: &[u8]) {
        if let Some(why) = redis_down_reason(reply) {
            self.set_down(DownPart::Behind, why);
        }
    }

    /// One turn: send the next probe when due, take in its answer, decide. Datagrams to send
    /// go to `out`.
    pub(super) fn tick(&mut self, clock: &Clock, devices: &PeerWatch, out: &mut Vec<Transmit>) {
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
        if let Some((_, sent)) = self.in_flight {
            let silent = now.saturating_duration_since(sent);
            if silent >= self.down_after {
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
        if self.in_flight.is_none() && now >= self.next_probe && self.probe.can_send() {
            if let Ok(seq) = self.probe.bypass(pmnet_now, PING) {
                self.in_flight = Some((seq, now));
                self.probes_sent += 1;
            }
            self.next_probe = now + self.down_after / 2;
        }
        while let Some(transmit) = self.probe.poll_transmit() {
            out.push(transmit);
        }
    }

    /// When the probe next needs a turn.
    pub(super) fn next_timer(&self, clock: &Clock) -> Duration {
        let probe = self
            .probe
            .poll_timeout()
            .map_or(Duration::MAX, |at| clock.until(at));
        let next = self.next_probe.saturating_duration_since(Instant::now());
        let verdict = self.in_flight.map_or(Duration::MAX, |(_, sent)| {
            (sent + self.down_after).saturating_duration_since(Instant::now())
        });
        probe.min(next).min(verdict)
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

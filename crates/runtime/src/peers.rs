//! Watching the peers a process waits on (a client's device, a device's servers, a server's
//! devices): a peer that does not answer is reported within [`SILENCE_WARNING`], by role and
//! address, once per outage, and again (at info level) when it answers.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::udp::Unreachable;

/// How long a peer may leave a datagram that wants an answer unanswered before a warning.
pub const SILENCE_WARNING: Duration = Duration::from_secs(1);

/// Whether `datagram` asks its receiver for an answer: a request (update or bypass), a
/// recovery poll, a fill query or a probe, or a batch holding a request.
pub fn wants_answer(datagram: &[u8]) -> bool {
    use pmnet_wire::PacketType;
    let slot = crate::udp::type_slot(datagram);
    let is = |packet_type: PacketType| slot == usize::from(packet_type.code());
    if is(PacketType::UpdateRequest)
        || is(PacketType::BypassRequest)
        || is(PacketType::RecoveryPoll)
        || is(PacketType::FillQuery)
        || is(PacketType::Probe)
        || is_cache_read(datagram)
    {
        return true;
    }
    is(PacketType::Batch)
        && pmnet_wire::batch::batch_entries(&datagram[pmnet_wire::HEADER_LEN..])
            .flatten()
            .any(|entry| {
                let slot = crate::udp::type_slot(entry);
                slot == usize::from(PacketType::UpdateRequest.code())
                    || slot == usize::from(PacketType::BypassRequest.code())
            })
}

/// Whether `datagram` is a cache read (a reserved type, beyond the socket's type slots).
fn is_cache_read(datagram: &[u8]) -> bool {
    datagram.len() >= pmnet_wire::HEADER_LEN
        && datagram[0..2] == pmnet_wire::MAGIC.to_be_bytes()
        && datagram[3] == pmnet_wire::cache::CACHE_READ
}

/// What a process knows of one peer.
#[derive(Debug, Clone)]
struct Peer {
    addr: SocketAddr,
    /// The first datagram wanting an answer sent since the peer was last heard from.
    waiting_since: Option<Instant>,
    /// Of those, one the peer answers itself (not only by passing on another's answer).
    waiting_direct: bool,
    /// The outage was reported (the peer has not answered since).
    reported: bool,
    /// An ICMP report said nothing listens at the address (during this outage).
    refused: bool,
    /// The peer answered at least once.
    heard_ever: bool,
}

/// The peers of one role a process talks to, and whether each answers.
#[derive(Debug, Clone)]
pub struct PeerWatch {
    /// What the peers are, for messages: "device", "server", …
    role: &'static str,
    /// The command that should be running at a peer's address, for messages.
    command: &'static str,
    peers: Vec<Peer>,
    /// Some peer has a datagram waiting for an answer (skips the clock when none has).
    any_waiting: bool,
}

impl PeerWatch {
    /// Watch `addrs`, peers in `role` (a "device", a "server") that `command` runs
    /// ("`pmnet device`").
    pub fn new(role: &'static str, command: &'static str, addrs: &[SocketAddr]) -> PeerWatch {
        let mut peers: Vec<Peer> = Vec::with_capacity(addrs.len());
        for &addr in addrs {
            if !peers.iter().any(|peer| peer.addr == addr) {
                peers.push(Peer {
                    addr,
                    waiting_since: None,
                    waiting_direct: false,
                    reported: false,
                    refused: false,
                    heard_ever: false,
                });
            }
        }
        PeerWatch {
            role,
            command,
            peers,
            any_waiting: false,
        }
    }

    pub fn role(&self) -> &'static str {
        self.role
    }

    /// A datagram that the peer at `addr` answers itself went to it (ignored if it is not a
    /// watched peer).
    #[inline]
    pub fn sent(&mut self, addr: SocketAddr, now: Instant) {
        self.note_sent(addr, now, true);
    }

    /// A datagram went to `addr` whose answer comes from further on (a client's read, which a
    /// device passes to its server): silence may be the peer's or the one behind it.
    #[inline]
    pub fn sent_through(&mut self, addr: SocketAddr, now: Instant) {
        self.note_sent(addr, now, false);
    }

    /// `datagram` went to `addr`: if it wants an answer, note it, as answered by the peer
    /// itself or (a read, which a device passes to its server) from further on. `now` is
    /// read once, at the first datagram that needs it.
    #[inline]
    pub fn sent_datagram(&mut self, addr: SocketAddr, datagram: &[u8], now: &mut Option<Instant>) {
        if !wants_answer(datagram) {
            return;
        }
        let now = *now.get_or_insert_with(Instant::now);
        // A read (bypass or cache read) is answered by the server behind the device (or, for
        // a cached key, by the device): silence may be either's.
        let read = crate::udp::type_slot(datagram)
            == usize::from(pmnet_wire::PacketType::BypassRequest.code())
            || is_cache_read(datagram);
        self.note_sent(addr, now, !read);
    }

    fn note_sent(&mut self, addr: SocketAddr, now: Instant, direct: bool) {
        if let Some(peer) = self.peers.iter_mut().find(|peer| peer.addr == addr) {
            if peer.waiting_since.is_none() {
                peer.waiting_since = Some(now);
                self.any_waiting = true;
            }
            peer.waiting_direct |= direct;
        }
    }

    /// A datagram arrived from `addr`: the peer answers.
    #[inline]
    pub fn heard(&mut self, addr: SocketAddr) {
        let Some(peer) = self.peers.iter_mut().find(|peer| peer.addr == addr) else {
            return;
        };
        if peer.reported {
            tracing::info!(
                "the {} at {} answers again; carrying on",
                self.role,
                peer.addr
            );
        }
        peer.waiting_since = None;
        peer.waiting_direct = false;
        peer.reported = false;
        peer.refused = false;
        peer.heard_ever = true;
    }

    /// ICMP reports from the socket: a watched peer where nothing listens is reported at once.
    pub fn unreachable(&mut self, reports: &[Unreachable]) {
        for report in reports {
            let Some(peer) = self.peers.iter_mut().find(|peer| peer.addr == report.addr) else {
                continue;
            };
            if peer.refused || (peer.reported && !report.refused) {
                continue;
            }
            if report.refused {
                tracing::warn!(
                    "nothing listens at {}: the {} is not running there (start {} there, or \
                     check the address); still trying",
                    peer.addr,
                    self.role,
                    self.command
                );
                peer.refused = true;
            } else {
                tracing::warn!(
                    "the {} at {} cannot be reached (the network says the host is unreachable); \
                     still trying",
                    self.role,
                    peer.addr
                );
            }
            peer.reported = true;
        }
    }

    /// Report the peers that have left a datagram unanswered for [`SILENCE_WARNING`].
    #[inline]
    pub fn check(&mut self, now: Instant) {
        if self.any_waiting {
            self.check_waiting(now);
        }
    }

    fn check_waiting(&mut self, now: Instant) {
        let mut any_waiting = false;
        for peer in &mut self.peers {
            let Some(since) = peer.waiting_since else {
                continue;
            };
            if peer.reported {
                continue;
            }
            let silent = now.saturating_duration_since(since);
            if silent < SILENCE_WARNING {
                any_waiting = true;
            } else {
                if peer.waiting_direct {
                    tracing::warn!(
                        "no reply from the {} at {} for {} s (is {} running there?); still \
                         trying",
                        self.role,
                        peer.addr,
                        silent.as_secs(),
                        self.command
                    );
                } else {
                    tracing::warn!(
                        "no reply through the {} at {} for {} s: it or the server behind it \
                         does not answer (is {} running there, and the server behind it?); \
                         still trying",
                        self.role,
                        peer.addr,
                        silent.as_secs(),
                        self.command
                    );
                }
                peer.reported = true;
            }
        }
        self.any_waiting = any_waiting;
    }

    /// Why `addr` may not have answered, for a failure message: `None` when it answers.
    pub fn silence(&self, addr: SocketAddr) -> Option<String> {
        let peer = self.peers.iter().find(|peer| peer.addr == addr)?;
        if peer.refused {
            return Some(format!(
                "nothing listens at {}: the {} is not running there (start {} there, or check \
                 the address)",
                peer.addr, self.role, self.command
            ));
        }
        if peer.waiting_since.is_some() && !peer.waiting_direct {
            return Some(format!(
                "no reply came through the {} at {}: it or the server behind it does not answer \
                 (is {} running there, and the server behind it?)",
                self.role, peer.addr, self.command
            ));
        }
        match (peer.heard_ever, peer.waiting_since.is_some()) {
            (false, _) => Some(format!(
                "the {} at {} never answered (is {} running there?)",
                self.role, peer.addr, self.command
            )),
            (true, true) => Some(format!(
                "the {} at {} stopped answering (is {} still running there?)",
                self.role, peer.addr, self.command
            )),
            (true, false) => None,
        }
    }

    /// Whether the peer at `addr` has answered since the datagrams last sent to it.
    pub fn answers(&self, addr: SocketAddr) -> bool {
        self.peers
            .iter()
            .any(|peer| peer.addr == addr && peer.heard_ever && peer.waiting_since.is_none())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn silence_is_reported_once_and_an_answer_ends_it() {
        let addr: SocketAddr = "127.0.0.1:7400".parse().unwrap();
        let mut watch = PeerWatch::new("device", "`pmnet device`", &[addr]);
        let start = Instant::now();
        watch.sent(addr, start);
        watch.check(start + Duration::from_millis(500));
        assert!(!watch.peers[0].reported);
        watch.sent(addr, start + Duration::from_millis(600));
        watch.check(start + SILENCE_WARNING);
        assert!(watch.peers[0].reported);
        assert!(watch.silence(addr).unwrap().contains("never answered"));
        assert!(
            !watch.any_waiting,
            "reported: no need to look at the clock again"
        );
        watch.heard(addr);
        assert!(!watch.peers[0].reported);
        assert!(watch.silence(addr).is_none());
        assert!(watch.answers(addr));
        watch.sent("127.0.0.1:9".parse().unwrap(), start);
        watch.check(start);
        assert!(!watch.any_waiting, "not a watched peer");
    }

    #[test]
    fn a_refusal_is_reported_at_once_and_named() {
        let addr: SocketAddr = "127.0.0.1:7500".parse().unwrap();
        let mut watch = PeerWatch::new("server", "`pmnet server`", &[addr]);
        watch.unreachable(&[Unreachable {
            addr,
            refused: true,
        }]);
        assert!(watch.peers[0].reported);
        assert!(watch.silence(addr).unwrap().contains("nothing listens at"));
    }
}

//! Who a node last heard from, and when: for `/status` and `pmnet status`.

use std::net::SocketAddr;

use pmnet_proto::Time;

/// Peers tracked at most; a node with more clients than this tracks the first ones and counts
/// the rest as untracked.
const PEERS_MAX: usize = 1024;

/// When each peer was last heard from (bounded: see [`PEERS_MAX`]).
#[derive(Debug, Default)]
pub struct PeerBook {
    last_heard: hashbrown::HashMap<SocketAddr, Time>,
    /// Datagrams from peers beyond the bound.
    untracked: u64,
}

impl PeerBook {
    /// A datagram from `from` arrived at `now`.
    #[inline]
    pub fn heard(&mut self, from: SocketAddr, now: Time) {
        if let Some(at) = self.last_heard.get_mut(&from) {
            *at = now;
        } else if self.last_heard.len() < PEERS_MAX {
            self.last_heard.insert(from, now);
        } else {
            self.untracked += 1;
        }
    }

    /// When `peer` was last heard from, if it was.
    pub fn last_heard(&self, peer: SocketAddr) -> Option<Time> {
        self.last_heard.get(&peer).copied()
    }

    /// Every tracked peer and when it was last heard from, most recent first.
    pub fn all(&self) -> Vec<(SocketAddr, Time)> {
        let mut all: Vec<(SocketAddr, Time)> = self
            .last_heard
            .iter()
            .map(|(peer, at)| (*peer, *at))
            .collect();
        all.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        all
    }

    pub fn untracked(&self) -> u64 {
        self.untracked
    }
}

/// A peer as `/status` shows it: its role, address, optional id, and seconds since it was last
/// heard from (`null`: never).
pub fn peer_json(
    role: &str,
    addr: SocketAddr,
    id: Option<u16>,
    heard: Option<Time>,
    now: Time,
) -> serde_json::Value {
    serde_json::json!({
        "role": role,
        "addr": addr.to_string(),
        "id": id,
        "last_heard_seconds_ago": heard.map(|at| now.saturating_duration_since(at).as_secs_f64()),
    })
}

/// The clients among the peers (those not in `known`), most recent first, at most `shown`.
pub fn clients_json(
    book: &PeerBook,
    known: &[SocketAddr],
    now: Time,
    shown: usize,
) -> (usize, Vec<serde_json::Value>) {
    let clients: Vec<(SocketAddr, Time)> = book
        .all()
        .into_iter()
        .filter(|(addr, _)| !known.contains(addr))
        .collect();
    let listed = clients
        .iter()
        .take(shown)
        .map(|(addr, at)| peer_json("client", *addr, None, Some(*at), now))
        .collect();
    (clients.len(), listed)
}

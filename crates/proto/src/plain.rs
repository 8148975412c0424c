//! Warnings of unauthenticated traffic from other hosts: an endpoint that runs without keys
//! (started with `--insecure` on an address others reach) says, at most once a minute, that
//! it is serving datagrams anyone on the path could have forged.

use std::net::SocketAddr;

/// How often an endpoint without keys warns, at most, of datagrams from other hosts.
pub const PLAIN_TRAFFIC_WARNING_INTERVAL: std::time::Duration = std::time::Duration::from_secs(60);

/// Whether `addr` is on this host's loopback (IPv4 127/8, IPv6 `::1`, or IPv4 loopback mapped
/// into IPv6): the peers an endpoint without keys may serve without a warning.
pub fn is_loopback(addr: SocketAddr) -> bool {
    match addr {
        SocketAddr::V4(v4) => v4.ip().is_loopback(),
        SocketAddr::V6(v6) => {
            v6.ip().is_loopback() || v6.ip().to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
    }
}

/// A rate-limited warning that an endpoint without keys serves unauthenticated datagrams from
/// peers off this host: the first at once (naming the peer), then at most one per
/// [`PLAIN_TRAFFIC_WARNING_INTERVAL`] with how many came since. Loopback peers are not
/// counted.
#[derive(Debug, Clone)]
pub struct PlainTrafficWarnings {
    last: Option<crate::Time>,
    since_last: u64,
    /// What is counted: "datagram", or "connection" (the gateway's clients).
    unit: &'static str,
}

impl Default for PlainTrafficWarnings {
    fn default() -> PlainTrafficWarnings {
        PlainTrafficWarnings::counting("datagram")
    }
}

impl PlainTrafficWarnings {
    /// Warnings that count `unit`s ("datagram", "connection").
    pub fn counting(unit: &'static str) -> PlainTrafficWarnings {
        PlainTrafficWarnings {
            last: None,
            since_last: 0,
            unit,
        }
    }

    /// A datagram (or connection) from `from` taken without authentication at `role` ("device", …). Returns
    /// whether it warned.
    pub fn received(&mut self, now: crate::Time, role: &str, from: SocketAddr) -> bool {
        if is_loopback(from) {
            return false;
        }
        self.since_last += 1;
        if self.last.is_some_and(|last| {
            now.saturating_duration_since(last) < PLAIN_TRAFFIC_WARNING_INTERVAL
        }) {
            return false;
        }
        tracing::warn!(
            "{role}: serving {} unauthenticated {}(s) from other hosts, the latest from {from}: \
             anyone who reaches this address can forge writes and acks (it runs without \
             --key-file; make a key with `pmnet keygen` and give every process of the \
             deployment the same --key-file)",
            self.since_last,
            self.unit
        );
        self.last = Some(now);
        self.since_last = 0;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn loopback_peers_are_not_counted_and_others_warn_once_a_minute() {
        let mut warnings = PlainTrafficWarnings::default();
        let start = crate::Time::ZERO + Duration::from_secs(5);
        for local in [
            "127.0.0.1:9",
            "127.3.2.1:9",
            "[::1]:9",
            "[::ffff:127.0.0.1]:9",
        ] {
            let local: SocketAddr = local.parse().unwrap();
            assert!(is_loopback(local), "{local}");
            assert!(!warnings.received(start, "device", local));
        }
        let remote: SocketAddr = "10.0.0.5:41000".parse().unwrap();
        assert!(!is_loopback(remote));
        assert!(!is_loopback("[::ffff:10.0.0.5]:1".parse().unwrap()));
        assert!(warnings.received(start, "device", remote));
        assert!(!warnings.received(start + Duration::from_secs(1), "device", remote));
        assert!(!warnings.received(start + Duration::from_secs(59), "device", remote));
        assert!(warnings.received(start + Duration::from_secs(60), "device", remote));
        assert!(!warnings.received(start + Duration::from_secs(61), "device", remote));
    }
}

//! Whether each server accepts what this device sends and sends what the device can verify.
//!
//! A PMNet-ACK promises that the server will apply the write: the device replays its log until
//! the server acks. A server that drops everything the device sends (it holds no key, another
//! key, or a key the device lacks) makes that promise empty. So once a server shows it cannot
//! be verified (a datagram from it fails verification: a server without keys answers a sealed
//! probe in clear), the device acks nothing for it until it has seen proof that the two
//! understand each other: a verified answer from
//! the server's address to one of its probes ([`PacketType::Probe`]), or a verified server-ACK
//! (or, for the next device of a chain, a PMNet-ACK), each of which the server sends only for
//! something of this device's that it verified. A silent server (down, or not started) is
//! acked for as before — its writes are durable in the log and replayed once it answers. A
//! disproven one is acked for no more: for [`GRACE`] after its start it logs the server's updates and holds their acks
//! (sent once the server is verified: the start-up round trip delays the first acks, it does
//! not cost them); past it, it forwards them without logging and tells the client why (a
//! not-logged notice); the client completes on the server's reply or fails naming the reason. A verified server stays verified for the
//! device's life: acking is never withdrawn, so nothing acked depends on this state.
//!
//! Probes go out at start-up (one round trip, not one per request), again after 20 ms, the
//! interval doubling to 1 s, until an answer verifies. After [`WARN_AFTER`] the device warns,
//! naming the server and what it heard from it, at most once per [`WARN_INTERVAL`].
//!
//! [`PacketType::Probe`]: pmnet_wire::PacketType::Probe

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use crate::{DropReason, Time};

/// The first probe's wait for an answer; it doubles up to [`PROBE_INTERVAL_MAX`].
pub const PROBE_INTERVAL_FIRST: Duration = Duration::from_millis(20);
pub const PROBE_INTERVAL_MAX: Duration = Duration::from_secs(1);
/// How long after its start a device logs a server's updates while it waits for the server's
/// first answer, holding their acks until the answer verifies (then it acks them): the start-up
/// round trip costs the first writes a late ack, not their ack. Past it, an unverified server's
/// updates are forwarded without logging.
pub const GRACE: Duration = Duration::from_millis(200);
/// How long a server may stay unverified before the device warns.
pub const WARN_AFTER: Duration = Duration::from_secs(1);
/// How often the warning repeats, at most, while the server stays unverified.
pub const WARN_INTERVAL: Duration = crate::drop::AUTH_WARNING_INTERVAL;

/// What the device knows of one server.
#[derive(Debug, Clone)]
struct Check {
    address: SocketAddr,
    verified: bool,
    /// Unverified since (the device's start).
    since: Time,
    /// The next probe's number; an answer names one below it.
    next_probe: u32,
    probe_at: Time,
    interval: Duration,
    /// Datagrams from the server's address that could not be verified, and the latest's
    /// reason.
    failures: u64,
    latest_failure: Option<DropReason>,
    warned_at: Option<Time>,
    /// The grace ended with the server unverified, and the device was told.
    grace_over: bool,
}

/// Every server's check.
#[derive(Debug, Clone, Default)]
pub(super) struct Trust {
    checks: BTreeMap<u16, Check>,
    pub(super) probes_sent: u64,
    pub(super) probes_answered: u64,
}

impl Trust {
    /// Checks of `servers`, starting at `now` (the first probes are due at once). With
    /// `verify` false every server counts as verified (a device that logs nothing acks
    /// nothing).
    pub(super) fn new(servers: &[(u16, SocketAddr)], now: Time, verify: bool) -> Trust {
        let checks = servers
            .iter()
            .map(|&(id, address)| {
                (
                    id,
                    Check {
                        address,
                        verified: !verify,
                        since: now,
                        next_probe: 1,
                        probe_at: now,
                        interval: PROBE_INTERVAL_FIRST,
                        failures: 0,
                        latest_failure: None,
                        warned_at: None,
                        grace_over: false,
                    },
                )
            })
            .collect();
        Trust {
            checks,
            probes_sent: 0,
            probes_answered: 0,
        }
    }

    pub(super) fn is_verified(&self, server_id: u16) -> bool {
        self.checks
            .get(&server_id)
            .is_some_and(|check| check.verified)
    }

    /// Whether every server is verified.
    pub(super) fn all_verified(&self) -> bool {
        self.checks.values().all(|check| check.verified)
    }

    /// Whether the device acks server `server_id`'s writes: it is verified, or it has not
    /// shown that it cannot be (nothing from it failed verification). A silent server —
    /// down, or not started yet — is acked for as before: the log holds its writes and
    /// replays them once it answers, and its first answer decides. One whose datagrams fail
    /// verification (another key, or none: a server without keys answers a sealed probe in
    /// clear) gets no acks until an answer verifies.
    pub(super) fn acks_for(&self, server_id: u16) -> bool {
        self.checks
            .get(&server_id)
            .is_some_and(|check| check.verified || check.failures == 0)
    }

    /// Whether server `server_id`'s updates are logged: the device acks them, or it is
    /// within [`GRACE`] of its start (their acks wait for the verification).
    pub(super) fn logs_for(&self, server_id: u16, now: Time) -> bool {
        self.acks_for(server_id)
            || self
                .checks
                .get(&server_id)
                .is_some_and(|check| now.saturating_duration_since(check.since) < GRACE)
    }

    /// A datagram from server `server_id` that proves it verified something of this device's
    /// and sealed what this device verified (a server-ACK, a PMNet-ACK of the next device).
    /// True when this verified the server just now.
    pub(super) fn proven(&mut self, server_id: u16) -> bool {
        let Some(check) = self.checks.get_mut(&server_id) else {
            return false;
        };
        if check.verified {
            return false;
        }
        check.verified = true;
        tracing::info!(
            "server {} verifies what this device sends and sends what it verifies: acking its \
             writes",
            check.address
        );
        true
    }

    /// An answer to probe `seq` from server `server_id`; true when it verified the server
    /// just now.
    pub(super) fn answered(&mut self, server_id: u16, seq: u32) -> bool {
        let Some(check) = self.checks.get(&server_id) else {
            return false;
        };
        if seq == 0 || seq >= check.next_probe {
            return false; // no probe of this number went out
        }
        self.probes_answered += 1;
        self.proven(server_id)
    }

    /// A datagram from `from` could not be verified.
    pub(super) fn failed(&mut self, from: SocketAddr, reason: DropReason) {
        for check in self.checks.values_mut() {
            if check.address == from && !check.verified {
                check.failures += 1;
                check.latest_failure = Some(reason);
            }
        }
    }

    /// When [`Trust::handle_timeout`] must next be called.
    pub(super) fn poll_timeout(&self) -> Option<Time> {
        self.checks
            .values()
            .filter(|check| !check.verified)
            .map(|check| check.probe_at)
            .min()
    }

    /// Servers whose [`GRACE`] ended unverified since the last call (each once): the writes
    /// logged for them meanwhile wait for acks that will not come soon.
    pub(super) fn take_grace_over(&mut self, now: Time) -> Vec<u16> {
        let mut over = Vec::new();
        for (&id, check) in &mut self.checks {
            if !check.verified
                && check.failures > 0
                && !check.grace_over
                && now.saturating_duration_since(check.since) >= GRACE
            {
                check.grace_over = true;
                over.push(id);
            }
        }
        over
    }

    /// Probes due at `now`: (server id, address, probe number). Warns of servers unverified
    /// for [`WARN_AFTER`].
    pub(super) fn handle_timeout(&mut self, now: Time) -> Vec<(u16, SocketAddr, u32)> {
        let mut probes = Vec::new();
        for (&id, check) in &mut self.checks {
            if check.verified || check.probe_at > now {
                continue;
            }
            probes.push((id, check.address, check.next_probe));
            check.next_probe = check.next_probe.wrapping_add(1).max(1);
            check.probe_at = now + check.interval;
            check.interval = (check.interval * 2).min(PROBE_INTERVAL_MAX);
            let due = now.saturating_duration_since(check.since) >= WARN_AFTER
                && check
                    .warned_at
                    .is_none_or(|at| now.saturating_duration_since(at) >= WARN_INTERVAL);
            if due {
                check.warned_at = Some(now);
                tracing::warn!("{}", describe(check, now));
            }
        }
        self.probes_sent += probes.len() as u64;
        probes
    }

    /// Why server `server_id` is not verified, in words (`None`: it is, or unknown).
    pub(super) fn unverified_reason(&self, server_id: u16, now: Time) -> Option<String> {
        let check = self.checks.get(&server_id)?;
        (!check.verified).then(|| describe(check, now))
    }
}

/// The warning for an unverified server: what the device heard from it, and what to check.
fn describe(check: &Check, now: Time) -> String {
    let waited = now.saturating_duration_since(check.since).as_secs_f64();
    let consequence = "until it does, this device forwards its writes without PMNet-ACKs \
                       (clients wait for the server's reply)";
    match check.latest_failure {
        Some(reason) => format!(
            "server {} answers nothing this device can verify: {} datagram(s) from it failed \
             verification in {waited:.1} s, the latest {} ({}); check both use the same \
             --key-file; {consequence}",
            check.address,
            check.failures,
            reason.reason(),
            reason.unverified_hint()
        ),
        None => format!(
            "server {} has answered none of this device's {} probe(s) in {waited:.1} s: it is \
             down, or it cannot verify what this device sends (check both use the same \
             --key-file; the server's log names what it drops); {consequence}",
            check.address,
            check.next_probe.saturating_sub(1)
        ),
    }
}

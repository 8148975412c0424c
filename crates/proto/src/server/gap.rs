//! Gaps in a session's sequence: a later request arrived and the next one did not.
//!
//! First the server asks for what is missing (retransmission requests, through the device
//! to the client, with a backoff and paid for by what the source sent). A gap that outlives
//! every client's request lifetime cannot be closed by its client any more: the client gave
//! up (and accepts no ack for the number) or is gone. The server then asks every device
//! whether it holds any of the missing requests whole; what none holds is skipped, so the
//! requests behind the gap — perhaps acked by a device long ago — are applied.

use std::net::SocketAddr;

use pmnet_wire::{flags, Header, PacketType};

use super::table::{Fill, Gap};
use super::Server;
use crate::{DropReason, Time, Transmit};

/// Skipped ranges a session remembers for make-up ACKs.
const SKIPPED_RANGES_KEPT: usize = 8;

impl Server {
    /// Arm, reset or clear the gap timer of `session_id` after its state changed.
    pub(super) fn update_gap(&mut self, now: Time, session_id: u64) {
        let recovering = self.recovery.is_some();
        let gap_timeout = self.config.gap_timeout;
        let Some(session) = self.table.sessions.get_mut(&session_id) else {
            return;
        };
        let has_gap = !recovering
            && session.deferral.is_none()
            && session.waiting_for.is_none()
            && session.issued_through == session.last_applied
            && (!session.pending.is_empty() || session.highest_seen > session.issued_through);
        let restart = match &session.gap {
            Some(gap) if !has_gap => {
                self.gap_timers.remove(&(gap.deadline, session_id));
                session.gap = None;
                return;
            }
            Some(gap) => gap.at != session.issued_through,
            None => has_gap,
        };
        if !restart {
            return;
        }
        if let Some(old) = session.gap.take() {
            self.gap_timers.remove(&(old.deadline, session_id));
        }
        let deadline = now + gap_timeout;
        // The missing number was issued before any later number was seen: its client's
        // lifetime counts from then, not from when the numbers before it were closed.
        let since = session
            .first_seen_above(session.issued_through + 1)
            .map_or(now, |seen| seen.min(now));
        session.gap = Some(Gap {
            since,
            at: session.issued_through,
            deadline,
            interval: gap_timeout,
            fill: None,
        });
        self.gap_timers.insert((deadline, session_id));
    }

    pub(super) fn on_gap_timeout(&mut self, now: Time, session_id: u64) {
        let fill_after = self.config.gap_fill_after;
        let max_interval = self.config.gap_timeout_max;
        let Some(session) = self.table.sessions.get_mut(&session_id) else {
            return;
        };
        let Some(gap) = session.gap.as_mut() else {
            return;
        };
        let interval = gap.interval;
        gap.interval = (interval * 2).min(max_interval);
        gap.deadline = now + interval;
        self.gap_timers.insert((gap.deadline, session_id));
        if gap.fill.is_some() {
            self.send_fill_queries(session_id);
        } else if now.saturating_duration_since(gap.since) >= fill_after {
            self.start_fill(now, session_id);
        } else {
            self.request_missing(session_id);
        }
    }

    /// Retransmission requests for what the session misses, at most
    /// `retransmit_requests_per_gap_max`, each paid for from the source's credit unless the
    /// source is one of this server's devices.
    fn request_missing(&mut self, session_id: u64) {
        let limit = self.config.retransmit_requests_per_gap_max;
        let server_id = self.config.server_id;
        let session = &self.table.sessions[&session_id];
        let Some(to) = session.reply_to else {
            return;
        };
        let next = session.issued_through + 1;
        let mut headers = Vec::new();
        match session.pending.first_key_value() {
            Some((&first_pending, assembly)) if first_pending == next => {
                let fragment_count = u16::try_from(assembly.parts.len()).unwrap_or(u16::MAX);
                let missing = assembly
                    .parts
                    .iter()
                    .enumerate()
                    .filter(|(_, part)| part.is_none());
                for (index, _) in missing.take(limit) {
                    let mut header =
                        Header::new(PacketType::RetransmitRequest, server_id, session_id, next);
                    header.fragment_index = u16::try_from(index).unwrap_or(0);
                    header.fragment_count = fragment_count;
                    headers.push(header);
                }
            }
            first => {
                let end = first.map_or(session.highest_seen, |(&seq, _)| seq);
                for seq in (next..end).take(limit) {
                    let mut header =
                        Header::new(PacketType::RetransmitRequest, server_id, session_id, seq);
                    header.flags = flags::ALL_FRAGMENTS;
                    headers.push(header);
                }
            }
        }
        for header in headers {
            if !self.pay_for_unsolicited(session_id, to) {
                continue;
            }
            self.counters.retransmit_requests_sent += 1;
            self.transmits.push_back(Transmit {
                destination: to,
                bytes: header.encode(&[]),
            });
        }
    }

    /// Whether a retransmission request of `session_id` may go to `to`: free towards one of
    /// this server's devices, otherwise paid for from the session's credit (a header's worth;
    /// counted when there is not enough).
    pub(super) fn pay_for_unsolicited(&mut self, session_id: u64, to: SocketAddr) -> bool {
        if self.is_device(to) {
            return true;
        }
        let cost = pmnet_wire::HEADER_LEN as u32;
        let Some(session) = self.table.sessions.get_mut(&session_id) else {
            return false;
        };
        if session.credit_bytes < cost {
            self.counters.retransmit_requests_unpaid += 1;
            return false;
        }
        session.credit_bytes -= cost;
        true
    }

    /// The gap outlived every client's request lifetime: ask the devices whether they hold
    /// any of the missing requests whole, or skip them at once if there are no devices.
    fn start_fill(&mut self, now: Time, session_id: u64) {
        let devices = self.config.devices.clone();
        let session = self
            .table
            .sessions
            .get_mut(&session_id)
            .expect("session of a gap");
        debug_assert_eq!(session.issued_through, session.last_applied);
        let first = session.issued_through + 1;
        let mut last = match session.pending.first_key_value() {
            // The next request is partly here: only it is in question.
            Some((&seq, _)) if seq == first => first,
            Some((&seq, _)) => seq - 1,
            // A number another session's keyed write waits for is in question too (it may
            // never have been seen here).
            None if session.awaited_through >= session.highest_seen => session.highest_seen,
            None => session.highest_seen.saturating_sub(1).max(first),
        };
        // Only numbers whose clients gave up for certain: below a number seen a lifetime ago.
        if let Some(bound) = session
            .given_up_through(now, self.config.gap_fill_after)
            .filter(|&bound| bound >= first)
        {
            last = last.min(bound);
        }
        if devices.is_empty() {
            self.skip(now, session_id, first, last);
            return;
        }
        let gap = session.gap.as_mut().expect("a gap");
        gap.fill = Some(Fill {
            first,
            last,
            awaiting: devices.into_iter().collect(),
            held_from: u64::from(last) + 1,
        });
        self.send_fill_queries(session_id);
    }

    fn send_fill_queries(&mut self, session_id: u64) {
        let server_id = self.config.server_id;
        let Some(fill) = self
            .table
            .sessions
            .get(&session_id)
            .and_then(|session| session.gap.as_ref())
            .and_then(|gap| gap.fill.as_ref())
        else {
            return;
        };
        let header = Header::new(PacketType::FillQuery, server_id, session_id, fill.first);
        let bytes = header.encode(&pmnet_wire::encode_fill_query_payload(fill.last));
        let devices: Vec<SocketAddr> = fill.awaiting.iter().copied().collect();
        for device in devices {
            self.counters.fill_queries_sent += 1;
            self.transmits.push_back(Transmit {
                destination: device,
                bytes: bytes.clone(),
            });
        }
    }

    /// A device's answer to a fill query: once every device answered, skip what none holds.
    pub(super) fn on_fill_reply(
        &mut self,
        now: Time,
        from: SocketAddr,
        header: &Header,
        payload: &[u8],
    ) {
        let Ok((last, held_from)) = pmnet_wire::decode_fill_reply_payload(payload) else {
            self.count_drop(DropReason::BadFillReply);
            return;
        };
        let fill = self
            .table
            .sessions
            .get_mut(&header.session_id)
            .and_then(|session| session.gap.as_mut())
            .and_then(|gap| gap.fill.as_mut())
            .filter(|fill| fill.first == header.seq && fill.last == last);
        let Some(fill) = fill else {
            self.count_drop(DropReason::StaleFillReply);
            return;
        };
        if !fill.awaiting.remove(&from) {
            self.count_drop(DropReason::StaleFillReply);
            return;
        }
        // A device names the lowest number it holds whole; anything below the range (it
        // cannot be) or past it means none.
        if (fill.first..=fill.last).contains(&held_from) {
            fill.held_from = fill.held_from.min(u64::from(held_from));
        }
        if !fill.awaiting.is_empty() {
            return;
        }
        let (first, held_from) = (fill.first, fill.held_from);
        let session = self
            .table
            .sessions
            .get_mut(&header.session_id)
            .expect("session of a fill");
        session.gap.as_mut().expect("a gap").fill = None;
        if held_from > u64::from(first) {
            let last = u32::try_from(held_from - 1).expect("within the range");
            self.skip(now, header.session_id, first, last);
        }
    }

    /// Skip `first ..= last` of `session_id`: no client can send them any more and no device
    /// holds any of them whole, so no ack was ever given for them. Not durable by itself: the
    /// next request applied carries a higher number; after a restart before that, the gap is
    /// found and resolved again.
    fn skip(&mut self, now: Time, session_id: u64, first: u32, last: u32) {
        let session = self
            .table
            .sessions
            .get_mut(&session_id)
            .expect("session of a gap");
        assert!(
            first == session.last_applied + 1 && session.issued_through == session.last_applied,
            "skip out of order: {first}..={last}, last applied {}, issued through {}",
            session.last_applied,
            session.issued_through
        );
        assert!(first <= last, "an empty skip");
        while let Some(entry) = session.pending.first_entry() {
            if *entry.key() > last {
                break;
            }
            let partial = entry.remove();
            session.buffered_bytes -= partial.cost();
            self.table.buffered_bytes -= partial.cost();
        }
        session.last_applied = last;
        session.issued_through = last;
        if session.skipped.len() >= SKIPPED_RANGES_KEPT {
            session.skipped.pop_front();
        }
        session.skipped.push_back((first, last));
        self.counters.sequence_numbers_skipped += u64::from(last - first) + 1;
        self.table.touch(now, session_id);
        self.replicate_skip(now, session_id, first, last);
        self.advance(now, session_id);
        self.release_waiters(now, session_id, last);
        self.release_reads(now, session_id, last);
    }
}

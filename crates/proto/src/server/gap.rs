//! Gaps in a session's sequence: a later request arrived and the next one did not.
//!
//! First the server asks for what is missing (retransmission requests, through the device
//! to the client, with a backoff and paid for by what the source sent), and asks every device
//! at once, in one fill round per missing range, whether it holds any of the missing requests
//! whole and since when it knows of a later number of the session. A number can never come
//! once its client gave up on it (a request lifetime after its first transmission, which came
//! before any later number was seen, here or by a device) and nothing of it is in flight any
//! more (`gap_fill_after` in all): a device that does not hold it whole then never will, so it
//! was never acknowledged. Once every device answered a round sent after that moment and none
//! holds a number of the range, the number is skipped, so the requests behind the gap —
//! perhaps acked by a device long ago — are applied. After an outage longer than that, every
//! range the server can see is resolved in the first round, about one gap timeout after it is
//! noticed; a client's no-op fill (sent again by the device that saw it) closes its number
//! sooner still.

use std::net::SocketAddr;
use std::time::Duration;

use pmnet_wire::{flags, Header, PacketType};

use super::table::Fill;
use super::Server;
use crate::{DropReason, Time, Transmit};

/// Skipped ranges a session remembers for make-up ACKs.
const SKIPPED_RANGES_KEPT: usize = 8;
/// Missing ranges of a session asked about at once, at most.
pub(super) const FILL_RANGES_MAX: usize = 16;
/// How often skips are logged at most (the rest are counted into the next line).
const SKIP_NOTE_INTERVAL: Duration = Duration::from_secs(1);

/// Skips logged at INFO, at most one line per [`SKIP_NOTE_INTERVAL`]: the first at once, the
/// rest summed up in the next.
#[derive(Debug, Default)]
pub(super) struct SkipNotes {
    last: Option<Time>,
    numbers: u64,
    ranges: u64,
    sessions: std::collections::BTreeSet<u64>,
}

impl SkipNotes {
    fn skipped(&mut self, now: Time, session_id: u64, first: u32, last: u32) {
        self.numbers += u64::from(last - first) + 1;
        self.ranges += 1;
        if self.sessions.len() < 1024 {
            self.sessions.insert(session_id);
        }
        if self
            .last
            .is_some_and(|at| now.saturating_duration_since(at) < SKIP_NOTE_INTERVAL)
        {
            return;
        }
        let others = self.ranges - 1;
        if others == 0 {
            tracing::info!(
                "skipped sequence numbers {first}..={last} of session {session_id:016x}: no \
                 device holds them and their client can no longer send them"
            );
        } else {
            tracing::info!(
                "skipped sequence numbers {first}..={last} of session {session_id:016x}, and \
                 since the last note {} number(s) in {others} other range(s) of {} session(s): \
                 no device holds them and their clients can no longer send them",
                self.numbers - (u64::from(last - first) + 1),
                self.sessions.len()
            );
        }
        self.last = Some(now);
        self.numbers = 0;
        self.ranges = 0;
        self.sessions.clear();
    }

    /// Log what was skipped since the last line, if the interval has passed.
    pub(super) fn flush(&mut self, now: Time) {
        if self.ranges == 0
            || self
                .last
                .is_some_and(|at| now.saturating_duration_since(at) < SKIP_NOTE_INTERVAL)
        {
            return;
        }
        tracing::info!(
            "skipped {} sequence number(s) in {} range(s) of {} session(s): no device holds \
             them and their clients can no longer send them",
            self.numbers,
            self.ranges,
            self.sessions.len()
        );
        self.last = Some(now);
        self.numbers = 0;
        self.ranges = 0;
        self.sessions.clear();
    }
}

impl Server {
    /// Arm, reset or clear the gap timer of `session_id` after its state changed; skip at
    /// once what the session reached of a range resolved before.
    pub(super) fn update_gap(&mut self, now: Time, session_id: u64) {
        let recovering = self.recovery.is_some();
        let gap_timeout = self.config.gap_timeout;
        let fill_after = self.config.gap_fill_after;
        let Some(session) = self.table.sessions.get_mut(&session_id) else {
            return;
        };
        let has_gap = !recovering
            && session.deferral.is_none()
            && session.waiting_for.is_none()
            && session.issued_through == session.last_applied
            && (!session.pending.is_empty() || session.highest_seen > session.issued_through);
        if has_gap {
            if let Some(last) = session.resolved_through() {
                let first = session.issued_through + 1;
                self.skip(now, session_id, first, last);
                return;
            }
        }
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
        let fill_at = session
            .given_up_at(session.issued_through + 1, fill_after)
            .map_or(now + fill_after, |at| at.min(now + fill_after));
        session.gap = Some(super::table::Gap {
            fill_at,
            at: session.issued_through,
            deadline,
            interval: gap_timeout,
            asked: false,
        });
        self.gap_timers.insert((deadline, session_id));
    }

    pub(super) fn on_gap_timeout(&mut self, now: Time, session_id: u64) {
        let max_interval = self.config.gap_timeout_max;
        let has_devices = !self.config.devices.is_empty();
        let Some(session) = self.table.sessions.get_mut(&session_id) else {
            return;
        };
        let issued_through = session.issued_through;
        session.fills.retain(|fill| fill.last > issued_through);
        let outstanding = !session.fills.is_empty();
        let Some(gap) = session.gap.as_mut() else {
            return;
        };
        let interval = gap.interval;
        gap.interval = (interval * 2).min(max_interval);
        gap.deadline = now + interval;
        if gap.fill_at > now {
            gap.deadline = gap.deadline.min(gap.fill_at);
        }
        self.gap_timers.insert((gap.deadline, session_id));
        let old = now >= gap.fill_at;
        let first_ask = !std::mem::replace(&mut gap.asked, true);
        if !has_devices {
            if old {
                self.skip_given_up(now, session_id);
            } else {
                self.request_missing(session_id);
            }
            return;
        }
        if !old {
            self.request_missing(session_id);
        }
        if first_ask || old || outstanding {
            self.start_fill(now, session_id);
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

    /// The missing ranges of `session_id` from its next number: the numbers up to each
    /// request buffered after it (the next request alone when it is partly here), then up to
    /// the highest number seen; at most [`FILL_RANGES_MAX`].
    fn missing_ranges(&self, session_id: u64) -> Vec<(u32, u32)> {
        let session = &self.table.sessions[&session_id];
        let first = session.issued_through + 1;
        let mut ranges = Vec::new();
        let mut expect = first;
        for (&seq, assembly) in &session.pending {
            if ranges.len() >= FILL_RANGES_MAX {
                return ranges;
            }
            if seq > expect {
                ranges.push((expect, seq - 1));
            } else if seq == first && !assembly.is_complete() {
                ranges.push((first, first));
            }
            expect = seq.saturating_add(1);
        }
        // A number another session's keyed write waits for is in question too (it may never
        // have been seen here); the highest seen otherwise arrived (or will: it was beyond
        // the reorder window).
        let top = if session.awaited_through >= session.highest_seen {
            session.highest_seen
        } else {
            session.highest_seen.saturating_sub(1)
        };
        if ranges.is_empty() && session.pending.is_empty() {
            // Nothing buffered: the next number is in question at least.
            ranges.push((first, top.max(first)));
        } else if ranges.len() < FILL_RANGES_MAX && top >= expect && expect > first {
            ranges.push((expect, top));
        }
        ranges
    }

    /// No devices, and the gap outlived every client's request lifetime: skip what the
    /// clients gave up on for sure.
    fn skip_given_up(&mut self, now: Time, session_id: u64) {
        let fill_after = self.config.gap_fill_after;
        let Some(&(first, mut last)) = self.missing_ranges(session_id).first() else {
            return;
        };
        let session = &self.table.sessions[&session_id];
        if first != session.issued_through + 1 {
            return;
        }
        // Only numbers whose clients gave up for certain: below a number seen a lifetime ago.
        if let Some(bound) = session
            .given_up_by(now, fill_after)
            .filter(|&bound| bound >= first)
        {
            last = last.min(bound);
        }
        self.skip(now, session_id, first, last);
    }

    /// Ask every device about each missing range of `session_id` not asked about yet, and
    /// again about those still unanswered.
    fn start_fill(&mut self, now: Time, session_id: u64) {
        let ranges = self.missing_ranges(session_id);
        let devices = &self.config.devices;
        let session = self
            .table
            .sessions
            .get_mut(&session_id)
            .expect("session of a gap");
        for (first, last) in ranges {
            if session.is_resolved(first, last) {
                // Known already: skipped when the session reaches it.
                continue;
            }
            let asked = session.fills.iter().position(|fill| fill.first == first);
            match asked {
                Some(index) if session.fills[index].last == last => continue,
                // The range grew or shrank: ask about it as it is now.
                Some(index) => {
                    session.fills.remove(index);
                }
                None if session.fills.len() >= FILL_RANGES_MAX => break,
                None => {}
            }
            session.fills.push(Fill {
                first,
                last,
                awaiting: devices.iter().copied().collect(),
                held_from: u64::from(last) + 1,
                sent_at: now,
            });
        }
        self.send_fill_queries(session_id);
    }

    pub(super) fn send_fill_queries(&mut self, session_id: u64) {
        let server_id = self.config.server_id;
        let Some(session) = self.table.sessions.get(&session_id) else {
            return;
        };
        let mut transmits = Vec::new();
        for fill in &session.fills {
            let header = Header::new(PacketType::FillQuery, server_id, session_id, fill.first);
            let bytes = header.encode(&pmnet_wire::encode_fill_query_payload(fill.last));
            for &device in &fill.awaiting {
                transmits.push(Transmit {
                    destination: device,
                    bytes: bytes.clone(),
                });
            }
        }
        self.counters.fill_queries_sent += transmits.len() as u64;
        self.transmits.extend(transmits);
    }

    /// A device's answer to a fill query: its date is remembered at once; once every device
    /// answered, what none holds and every client gave up on is skipped (now, or when the
    /// session reaches it).
    pub(super) fn on_fill_reply(
        &mut self,
        now: Time,
        from: SocketAddr,
        header: &Header,
        payload: &[u8],
    ) {
        let Ok((last, held_from, seen_ms)) = pmnet_wire::decode_fill_reply_dated_payload(payload)
        else {
            self.count_drop(DropReason::BadFillReply);
            return;
        };
        let fill_after = self.config.gap_fill_after;
        let Some(session) = self.table.sessions.get_mut(&header.session_id) else {
            self.count_drop(DropReason::StaleFillReply);
            return;
        };
        let index = session
            .fills
            .iter()
            .position(|fill| fill.first == header.seq && fill.last == last);
        let Some(index) = index.filter(|&index| session.fills[index].awaiting.remove(&from)) else {
            self.count_drop(DropReason::StaleFillReply);
            return;
        };
        if let Some(seen_ms) = seen_ms {
            // The device first saw a later number `seen_ms` ago, or before: every number of
            // the range is given up `fill_after` after that, at the latest.
            let age = Duration::from_millis(u64::from(seen_ms));
            let deadline = if fill_after >= age {
                now + (fill_after - age)
            } else {
                now.saturating_sub(age - fill_after)
            };
            session.note_dated(last.saturating_add(1), deadline);
        }
        let fill = &mut session.fills[index];
        // A device names the lowest number it holds whole; anything below the range (it
        // cannot be) or past it means none.
        if (fill.first..=fill.last).contains(&held_from) {
            fill.held_from = fill.held_from.min(u64::from(held_from));
        }
        if !fill.awaiting.is_empty() {
            return;
        }
        let fill = session.fills.remove(index);
        if fill.held_from == u64::from(fill.first) {
            // Held: resent by the device that holds it.
            return;
        }
        // Every device answered after the round was sent: what none holds and whose client
        // gave up by then can never come.
        let given_up = session.given_up_by(fill.sent_at, fill_after);
        let skip_through = given_up
            .map(u64::from)
            .map(|through| through.min(fill.held_from - 1))
            .filter(|&through| through >= u64::from(fill.first));
        match skip_through {
            Some(through) => {
                let through = u32::try_from(through).expect("within the range");
                session.add_resolved(fill.first, through);
                self.update_gap(now, header.session_id);
            }
            None => {
                // Not yet: ask again as soon as the clients gave up for sure.
                let next = session.issued_through + 1;
                let Some(at) = session.given_up_at(next, fill_after) else {
                    return;
                };
                let Some(gap) = session.gap.as_mut().filter(|gap| at < gap.fill_at) else {
                    return;
                };
                gap.fill_at = at;
                let deadline = at.max(now);
                if deadline < gap.deadline {
                    self.gap_timers.remove(&(gap.deadline, header.session_id));
                    gap.deadline = deadline;
                    self.gap_timers.insert((deadline, header.session_id));
                }
            }
        }
    }

    /// Skip `first ..= last` of `session_id`: no client can send them any more and no device
    /// holds any of them whole, so no ack was ever given for them (logged, see `SkipNotes`). Not durable by itself: the
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
        self.skip_notes.skipped(now, session_id, first, last);
        self.table.touch(now, session_id);
        self.replicate_skip(now, session_id, first, last);
        self.advance(now, session_id);
        self.release_waiters(now, session_id, last);
        self.release_reads(now, session_id, last);
    }
}

//! [`KvStore`]: a small durable key-value store on one [`PmRegion`].
//!
//! # Layout
//!
//! ```text
//! 0            64           128          4096                 4096 + H             4096 + 2H
//! | superblock | superblock | (unused)   | half 0 (H bytes)    | half 1 (H bytes)    | (unused)
//! |  slot 0    |  slot 1    |            |                     |                     |
//! ```
//!
//! Each superblock copy (64 bytes, field table in `kv/layout.rs`) holds the geometry, the session bound,
//! a `store_id` (derived at format from what the region held before, so it differs from any
//! earlier store's there), and a `generation`. The copy for generation `g` lives in slot
//! `g % 2` and the log of generation `g` in half `g % 2`; the valid copy with the higher
//! generation names the active half.
//!
//! A half is a chain of records (40-byte header + key + value + reply, padded to 8; field table
//! in `kv/layout.rs`): a snapshot header, the snapshot
//! (one KEY record per live key, one SESSION record per session), then one APPLY record per
//! applied request, then an 8-byte zero terminator. Every record's CRC-32C is chained to the
//! previous record's, seeded from `(store_id, generation)`, so bytes left over from an older
//! generation or an earlier store never verify as part of the current log.
//!
//! # Crash atomicity
//!
//! *Apply* writes the APPLY record and a fresh terminator after it, then flushes and fences,
//! then updates memory and returns the reply. A crash before the fence leaves the record's
//! first word (length + CRC, one aligned 8-byte word) either zero, so the log ends cleanly
//! before it, or new with a body that fails its CRC, so the log ends at it (a *rejected torn
//! tail*). A record is all-or-nothing, and it is durable before its reply is returned.
//!
//! *Compaction* happens when the next APPLY record does not fit in the active half: memory is
//! updated with the request's outcome, then a snapshot of the whole state (which therefore
//! includes that request) is written to the standby half, the rest of the standby half is
//! zeroed, all of it is persisted, and only then is the superblock copy for generation `g + 1`
//! written and persisted. That copy is the commit point. If a crash tears it, open finds the
//! copy for `g` intact, sees that half `(g + 1) % 2` holds a complete, verified snapshot for
//! `g + 1`, adopts it and rewrites the torn copy (the request it contains was never
//! acknowledged, so either outcome is allowed; adopting also survives a bit flip in the newest
//! copy without losing acknowledged data).
//!
//! # Capacity and the reserve
//!
//! The store keeps room, at all times, for a snapshot in which every one of `max_sessions`
//! sessions holds a reply of up to [`STORE_ERROR_REPLY_MAX_LEN`] bytes (the *reserve*). A
//! request is admitted only if the snapshot of the state after it, plus that reserve, fits in
//! a half. One that does not:
//!
//! - a request that would store something (SET, INCR, APPEND) is refused with
//!   [`NoSpace`]: nothing of it is written and its session is unchanged, so the server can
//!   keep it and apply it once deletes made room (a device may have acknowledged it already:
//!   it must not be turned into an error);
//! - a request with no effect whose reply is too long to keep (a GET of a large value) is
//!   answered `ERROR store full: ...`, which fits in its session's reserved slot. Large
//!   replies count against capacity as long as they are some session's last reply.
//!
//! **A DEL always fits**, however full the store: its effect removes a KEY record and its
//! reply (`Deleted(n)`, 5 bytes) fits in the session's reserved slot, so the state after it
//! needs no more than the state before it, which fits by this invariant. Deletes can
//! therefore always make room.
//!
//! When a request comes from a new session and the table already holds `max_sessions`, the
//! session with the oldest activity is evicted (counted in [`KvStats::evicted_sessions`]),
//! but only once it was last applied longer ago than the server keeps sessions
//! ([`Application::note_time`]: past the longest a duplicate can arrive and, with keys, past
//! twice the replay window). Until then the new session's request is refused with
//! [`NoSpace`] (counted in [`KvStats::sessions_full`]) and the server retries it: a session
//! is never forgotten while a retransmission or an accepted replay of its requests could
//! still come, so nothing is applied twice.
//!
//! When the live state is close to capacity, every apply that does not fit in the active
//! half compacts, so applies cost O(live data) until data is deleted.
//!
//! # Corruption
//!
//! Replay stops at the first APPLY record that fails verification; that record and everything
//! after it in the half are not replayed, and the rest of the half is zeroed so new records
//! start clean. Open succeeds and reports it: [`KvStore::recovery`]`.rejected` holds the
//! record's region offset and why it failed ([`RejectReason`]), and
//! [`KvStats::rejected_tail_records`] is 1. After a crash this is the expected torn tail of a
//! request that was never acknowledged. Its `valid_record_follows` is true when a verified
//! record follows it, which a crash cannot produce: acknowledged requests were lost to
//! corruption, and the server should say so loudly. Damage inside the committed snapshot, a record whose
//! CRC verifies but whose fields are inconsistent, or a superblock copy with a generation
//! whose snapshot is incomplete, make open fail with [`StoreError::Corrupt`].
//!
//! # Self-checks
//!
//! Debug builds check the in-memory bookkeeping (the byte accounting against the contents,
//! the activity index, the reserve, the log's tail and terminator) after format, open and
//! every applied request: `KvStore::check_invariants`, in `kv/invariants.rs`.

#[cfg(any(test, debug_assertions))]
mod invariants;
mod layout;
mod replay;
mod state;
#[cfg(test)]
mod tests;

use std::borrow::Cow;

use pmnet_pm::{MediumInfo, PmRegion};
use thiserror::Error;

use crate::app::{Application, NoSpace, SessionRecord};
use crate::codec::{self, Reply, Request, MAX_VALUE_LEN};
pub use layout::RejectReason;
use layout::{
    align_up, chain_seed, record_size, verify_snapshot, EffectCode, Record, RecordKind, SlotError,
    SnapshotHeader, Superblock, HALF_ALIGN, HALVES_OFFSET, RECORD_ALIGN, SNAPSHOT_RECORD_SIZE,
    SUPERBLOCK_COPIES, SUPERBLOCK_SIZE, TERMINATOR_SIZE,
};
use replay::replay;
use state::State;

/// Longest ERROR message the store itself generates, in bytes.
pub const STORE_ERROR_MESSAGE_MAX_LEN: usize = 125;

/// Longest ERROR reply the store itself generates: status, length, message.
pub const STORE_ERROR_REPLY_MAX_LEN: usize = 1 + 2 + STORE_ERROR_MESSAGE_MAX_LEN;

/// Upper bound on `max_sessions`, to keep the reserve and the session table bounded.
pub const MAX_SESSIONS_LIMIT: u32 = 1 << 20;

/// Smallest room for data a half must leave beyond the reserve.
const MIN_DATA_BYTES: usize = 4096;

/// Snapshot records are gathered into a buffer of about this size before each region write.
const SNAPSHOT_WRITE_CHUNK_BYTES: usize = 64 * 1024;

/// What every session slot reserves: a SESSION record holding the largest store ERROR reply.
const SESSION_FLOOR_BYTES: usize = record_size(0, 0, STORE_ERROR_REPLY_MAX_LEN);

/// Source of zeros for scrubbing.
static ZEROS: [u8; 4096] = [0; 4096];

/// How to format a store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvConfig {
    /// Sessions whose dedupe record is kept; beyond it the least recently active is evicted.
    /// Each reserves [`STORE_ERROR_REPLY_MAX_LEN`] + 40 bytes of every half.
    pub max_sessions: u32,
}

impl Default for KvConfig {
    fn default() -> Self {
        KvConfig { max_sessions: 1024 }
    }
}

/// Why a store could not be formatted or opened.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum StoreError {
    #[error("invalid store config: {0}")]
    InvalidConfig(&'static str),
    #[error(
        "region of {len_bytes} bytes is too small for this store: need at least {min_len_bytes}"
    )]
    RegionTooSmall { len_bytes: u64, min_len_bytes: u64 },
    #[error("region is not a pmnet key-value store (no superblock magic)")]
    NotAStore,
    #[error(
        "store layout version {found} is not supported (this build reads version {supported})"
    )]
    WrongVersion { found: u32, supported: u32 },
    #[error("both superblock copies are damaged")]
    CorruptSuperblock,
    #[error("store was formatted for a region of {recorded_len_bytes} bytes, region has {region_len_bytes}")]
    RegionLenMismatch {
        recorded_len_bytes: u64,
        region_len_bytes: u64,
    },
    #[error("store is corrupt at region offset {offset_bytes}: {reason}")]
    Corrupt {
        offset_bytes: u64,
        reason: &'static str,
    },
}

/// Counters since this store value was formatted or opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KvStats {
    /// APPLY records appended (requests applied without compacting).
    pub records_appended: u64,
    /// Compactions (each also applied one request).
    pub compactions: u64,
    /// Sessions evicted to admit a new one (during apply; replay repeats the same evictions
    /// silently).
    pub evicted_sessions: u64,
    /// Requests without an effect answered "store full": a reply too long to keep (a GET of a
    /// large value in a full store).
    pub store_full_replies: u64,
    /// Requests refused with [`NoSpace`] (nothing stored; the caller retries them).
    pub no_space: u64,
    /// Requests of new sessions refused with [`NoSpace`] because every session the table
    /// holds was applied more recently than the server keeps sessions (it retries them).
    pub sessions_full: u64,
    /// Requests at or below their session's last applied number, refused with nothing
    /// applied (see `Application::stage`).
    pub stale_requests: u64,
    /// Records replayed at open: snapshot records plus APPLY records.
    pub recovered_records: u64,
    /// Records rejected at the end of the log at open (0 or 1).
    pub rejected_tail_records: u64,
}

/// A record at which replay stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RejectedRecord {
    /// Where the record starts, from the start of the region.
    pub offset_bytes: u64,
    pub reason: RejectReason,
    /// A verified record follows the rejected one: not a torn write but corruption, and the
    /// requests from here on were acknowledged and are lost.
    pub valid_record_follows: bool,
}

/// What open found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Recovery {
    /// Generation of the active half.
    pub generation: u64,
    /// KEY and SESSION records in the snapshot.
    pub snapshot_records: u64,
    /// APPLY records replayed after the snapshot.
    pub log_records: u64,
    /// The record replay stopped at, if it did not stop at a clean end.
    pub rejected: Option<RejectedRecord>,
    /// The newest superblock copy was unreadable but its generation's snapshot was complete:
    /// it was adopted and the copy rewritten.
    pub superblock_repaired: bool,
    /// Bytes past the end of the log that were not zero and were zeroed.
    pub scrubbed_bytes: u64,
}

/// A durable key-value store on one region. See the module docs.
pub struct KvStore<R: PmRegion> {
    region: R,
    superblock: Superblock,
    half_len_bytes: usize,
    state: State,
    /// Offset, within the active half, of the terminator after the last record.
    tail_bytes: usize,
    /// Chain value of the last record in the active half.
    tail_crc: u32,
    /// Per half: bytes from its start that may be non-zero. Compaction zeroes the standby half
    /// up to here so the bytes past a log's end are always zero.
    dirty_len_bytes: [usize; 2],
    scratch: Vec<u8>,
    stats: KvStats,
    recovery: Recovery,
    /// The server's time (milliseconds), as it last said ([`Application::note_time`]).
    now_ms: u64,
    /// Once the server told the time: the session it permitted this store to forget
    /// ([`Application::permit_eviction`]); `None` (never told): any.
    permitted: Option<Option<u64>>,
    /// When the server first told the time: sessions recovered at open count as seen then.
    time_since_ms: Option<u64>,
}

impl<R: PmRegion> std::fmt::Debug for KvStore<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvStore")
            .field("generation", &self.superblock.generation)
            .field("half_len_bytes", &self.half_len_bytes)
            .field("tail_bytes", &self.tail_bytes)
            .field("keys", &self.state.keys.len())
            .field("sessions", &self.state.sessions.len())
            .field("stats", &self.stats)
            .finish()
    }
}

/// One request's decided result, before it is made durable.
#[derive(Debug)]
struct Outcome<'a> {
    effect: Effect<'a>,
    reply: Vec<u8>,
}

#[derive(Debug)]
enum Effect<'a> {
    None,
    Put { key: &'a [u8], value: Cow<'a, [u8]> },
    Delete { key: &'a [u8] },
}

impl<R: PmRegion> KvStore<R> {
    /// Make `region` an empty store, destroying what it held.
    pub fn format(mut region: R, config: KvConfig) -> Result<Self, StoreError> {
        if config.max_sessions == 0 {
            return Err(StoreError::InvalidConfig("max_sessions must be at least 1"));
        }
        if config.max_sessions > MAX_SESSIONS_LIMIT {
            return Err(StoreError::InvalidConfig(
                "max_sessions exceeds MAX_SESSIONS_LIMIT",
            ));
        }
        let half_len_bytes = Self::half_len_for(region.len());
        let min_half_len_bytes = align_up(
            reserve_bytes(config.max_sessions) + MIN_DATA_BYTES,
            HALF_ALIGN,
        );
        if half_len_bytes < min_half_len_bytes {
            return Err(StoreError::RegionTooSmall {
                len_bytes: region.len() as u64,
                min_len_bytes: (HALVES_OFFSET + 2 * min_half_len_bytes) as u64,
            });
        }

        let superblock = Superblock {
            max_sessions: config.max_sessions,
            generation: 0,
            store_id: Self::next_store_id(&region),
            region_len_bytes: region.len() as u64,
            half_len_bytes: half_len_bytes as u64,
        };

        // Invalidate both copies first: a crash mid-format must not leave an earlier store
        // openable over half-overwritten halves.
        let superblocks_len = SUPERBLOCK_SIZE * SUPERBLOCK_COPIES;
        region.write(0, &ZEROS[..superblocks_len]);
        region.persist(0, superblocks_len);

        let mut store = KvStore {
            region,
            superblock,
            half_len_bytes,
            state: State::new(config.max_sessions),
            tail_bytes: 0,
            tail_crc: 0,
            dirty_len_bytes: [half_len_bytes; 2],
            scratch: Vec::new(),
            stats: KvStats::default(),
            recovery: Recovery::default(),
            now_ms: 0,
            permitted: None,
            time_since_ms: None,
        };
        // Generation 0's empty snapshot goes to half 0; then its superblock copy commits it.
        let (snapshot_len, crc) = store.write_snapshot(0);
        store.write_superblock(superblock);
        store.tail_bytes = snapshot_len;
        store.tail_crc = crc;
        #[cfg(debug_assertions)]
        store.check_invariants();
        Ok(store)
    }

    /// Open the store on `region`, replaying its log.
    pub fn open(mut region: R) -> Result<Self, StoreError> {
        if region.len() < HALVES_OFFSET {
            return Err(StoreError::NotAStore);
        }
        let (superblock, superblock_repaired) = Self::choose_superblock(&region)?;
        if superblock.region_len_bytes != region.len() as u64 {
            return Err(StoreError::RegionLenMismatch {
                recorded_len_bytes: superblock.region_len_bytes,
                region_len_bytes: region.len() as u64,
            });
        }
        // Geometry was validated against region_len_bytes, which equals region.len().
        let half_len_bytes = superblock.half_len_bytes as usize;
        let half = superblock.active_half();
        let half_offset = HALVES_OFFSET + half * half_len_bytes;

        let replay = {
            let half_bytes = &region.bytes()[half_offset..half_offset + half_len_bytes];
            replay(half_bytes, half_offset, &superblock)?
        };
        let mut recovery = Recovery {
            generation: superblock.generation,
            snapshot_records: replay.snapshot_records,
            log_records: replay.log_records,
            rejected: replay.rejected,
            superblock_repaired,
            scrubbed_bytes: 0,
        };
        if replay.state.committed_bytes() + TERMINATOR_SIZE > half_len_bytes {
            return Err(StoreError::Corrupt {
                offset_bytes: half_offset as u64,
                reason: "replayed state exceeds the store's capacity",
            });
        }

        // Zero everything past the log's end so that, from here on, a non-zero first word past
        // the tail can only be a torn write of ours.
        let scrub_start = half_offset + replay.end_bytes;
        let scrub_end = half_offset + half_len_bytes;
        let last_nonzero = region.bytes()[scrub_start..scrub_end]
            .iter()
            .rposition(|b| *b != 0);
        if let Some(last_nonzero) = last_nonzero {
            let scrub_len = align_up(last_nonzero + 1, RECORD_ALIGN).min(scrub_end - scrub_start);
            write_zeros(&mut region, scrub_start, scrub_len);
            region.persist(scrub_start, scrub_len);
            recovery.scrubbed_bytes = scrub_len as u64;
        }

        let mut store = KvStore {
            region,
            superblock,
            half_len_bytes,
            state: replay.state,
            tail_bytes: replay.end_bytes,
            tail_crc: replay.end_crc,
            dirty_len_bytes: [half_len_bytes; 2],
            scratch: Vec::new(),
            stats: KvStats {
                recovered_records: replay.snapshot_records + replay.log_records,
                rejected_tail_records: u64::from(replay.rejected.is_some()),
                ..KvStats::default()
            },
            recovery,
            now_ms: 0,
            permitted: None,
            time_since_ms: None,
        };
        store.dirty_len_bytes[half] = (store.tail_bytes + TERMINATOR_SIZE).min(half_len_bytes);
        if superblock_repaired {
            store.write_superblock(superblock);
        }
        #[cfg(debug_assertions)]
        store.check_invariants();
        Ok(store)
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &[u8]) -> Option<&[u8]> {
        self.state.keys.get(key).map(Vec::as_slice)
    }

    /// Number of live keys.
    pub fn len(&self) -> usize {
        self.state.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.state.keys.is_empty()
    }

    /// Number of sessions with a dedupe record.
    pub fn session_count(&self) -> usize {
        self.state.sessions.len()
    }

    pub fn stats(&self) -> KvStats {
        self.stats
    }

    /// What open found (all zero / `None` for a freshly formatted store).
    pub fn recovery(&self) -> &Recovery {
        &self.recovery
    }

    pub fn config(&self) -> KvConfig {
        KvConfig {
            max_sessions: self.superblock.max_sessions,
        }
    }

    /// Bytes of live data (keys, values, and session replies beyond the per-session reserve)
    /// counted against [`KvStore::capacity_bytes`].
    pub fn used_bytes(&self) -> u64 {
        (self.state.key_bytes + self.state.session_excess_bytes) as u64
    }

    /// Bytes of live data the store admits, in its own record encoding (40 bytes of header per
    /// key, padded to 8).
    pub fn capacity_bytes(&self) -> u64 {
        (self.half_len_bytes - reserve_bytes(self.superblock.max_sessions)) as u64
    }

    /// How many keys of `key_and_value_len` bytes (key and value together) fit in
    /// [`KvStore::capacity_bytes`] when nothing else is stored.
    pub fn key_capacity(&self, key_and_value_len: usize) -> u64 {
        self.capacity_bytes() / key_record_size(0, key_and_value_len) as u64
    }

    pub fn region(&self) -> &R {
        &self.region
    }

    pub fn into_region(self) -> R {
        self.region
    }

    /// Decide what `request` does, against the current state, without changing anything.
    fn plan<'a>(&self, request: &'a [u8]) -> Outcome<'a> {
        let request = match Request::decode(request) {
            Ok(request) => request,
            Err(error) => return error_outcome(&format!("bad request: {error}")),
        };
        match request {
            Request::Set { key, value } => Outcome {
                effect: Effect::Put {
                    key,
                    value: Cow::Borrowed(value),
                },
                reply: Reply::Ok.to_bytes(),
            },
            Request::Get { key } => {
                let reply = match self.state.keys.get(key) {
                    Some(value) => value_reply(value),
                    None => Reply::NotFound.to_bytes(),
                };
                Outcome {
                    effect: Effect::None,
                    reply,
                }
            }
            Request::Del { key } => {
                if self.state.keys.contains_key(key) {
                    Outcome {
                        effect: Effect::Delete { key },
                        reply: Reply::Deleted(1).to_bytes(),
                    }
                } else {
                    Outcome {
                        effect: Effect::None,
                        reply: Reply::Deleted(0).to_bytes(),
                    }
                }
            }
            Request::Incr { key, delta } => {
                let current = match self.state.keys.get(key) {
                    None => 0,
                    Some(value) => match parse_integer(value) {
                        Some(current) => current,
                        None => return error_outcome("value is not an integer"),
                    },
                };
                match current.checked_add(delta) {
                    Some(new) => Outcome {
                        effect: Effect::Put {
                            key,
                            value: Cow::Owned(new.to_string().into_bytes()),
                        },
                        reply: Reply::Integer(new).to_bytes(),
                    },
                    None => error_outcome("increment or decrement would overflow"),
                }
            }
            Request::Append { key, value } => {
                let current = self.state.keys.get(key).map_or(&[][..], Vec::as_slice);
                if current.len() + value.len() > MAX_VALUE_LEN {
                    return error_outcome("append would make the value longer than 1048576 bytes");
                }
                let mut new = Vec::with_capacity(current.len() + value.len());
                new.extend_from_slice(current);
                new.extend_from_slice(value);
                Outcome {
                    effect: Effect::Put {
                        key,
                        value: Cow::Owned(new),
                    },
                    reply: Reply::Ok.to_bytes(),
                }
            }
        }
    }

    /// Make `outcome` durable as request `seq` of `session_id`, then apply it to memory.
    fn commit_record(&mut self, session_id: u64, seq: u32, outcome: Outcome<'_>) -> Vec<u8> {
        let activity = self.state.clock + 1;
        let (effect_code, key, value): (EffectCode, &[u8], &[u8]) = match &outcome.effect {
            Effect::None => (EffectCode::None, &[], &[]),
            Effect::Put { key, value } => (EffectCode::Put, key, value),
            Effect::Delete { key } => (EffectCode::Delete, key, &[]),
        };
        let record = Record {
            kind: RecordKind::Apply,
            effect: effect_code,
            session_id,
            seq,
            activity,
            key,
            value,
            reply: &outcome.reply,
        };
        let fits = self.tail_bytes + record.size() + TERMINATOR_SIZE <= self.half_len_bytes;
        if fits {
            let offset = self.half_offset(self.superblock.active_half()) + self.tail_bytes;
            self.scratch.clear();
            let crc = record.encode(self.tail_crc, &mut self.scratch);
            self.scratch.extend_from_slice(&[0; TERMINATOR_SIZE]);
            self.region.write(offset, &self.scratch);
            self.region.persist(offset, self.scratch.len());
            self.tail_bytes += record.size();
            self.tail_crc = crc;
            let half = self.superblock.active_half();
            self.dirty_len_bytes[half] =
                self.dirty_len_bytes[half].max(self.tail_bytes + TERMINATOR_SIZE);
            self.stats.records_appended += 1;
        }

        match &outcome.effect {
            Effect::None => {}
            Effect::Put { key, value } => self.state.put(key, value),
            Effect::Delete { key } => self.state.delete(key),
        }
        let evicted = self.state.touch_session(
            session_id,
            seq,
            outcome.reply.clone(),
            activity,
            self.now_ms,
        );
        if evicted.is_some() {
            self.stats.evicted_sessions += 1;
        }

        if !fits {
            // The snapshot of the state after this request is what makes it durable.
            self.compact();
        }
        #[cfg(debug_assertions)]
        self.check_invariants_after_apply();
        outcome.reply
    }

    /// Write a snapshot of memory into the standby half and commit it as the next generation.
    fn compact(&mut self) {
        let mut superblock = self.superblock;
        superblock.generation += 1;
        let (snapshot_len, crc) = self.write_snapshot(superblock.generation);
        self.write_superblock(superblock);
        self.superblock = superblock;
        self.tail_bytes = snapshot_len;
        self.tail_crc = crc;
        self.stats.compactions += 1;
    }

    /// Write and persist a snapshot of memory, chained for `generation`, into that generation's
    /// half, zeroing the rest of the half. Returns the snapshot's length and last crc.
    fn write_snapshot(&mut self, generation: u64) -> (usize, u32) {
        let half = (generation % 2) as usize;
        let half_offset = self.half_offset(half);
        let snapshot_len = self.state.snapshot_bytes();
        assert!(
            snapshot_len + TERMINATOR_SIZE <= self.half_len_bytes,
            "reserve violated"
        );
        assert!(self.state.committed_bytes() + TERMINATOR_SIZE <= self.half_len_bytes);

        let header = SnapshotHeader {
            snapshot_len_bytes: snapshot_len as u64,
            key_count: self.state.keys.len() as u64,
            session_count: self.state.sessions.len() as u64,
        };
        let header_payload = header.encode();
        let mut crc = chain_seed(self.superblock.store_id, generation);
        let mut written = 0;
        self.scratch.clear();
        crc = Record {
            kind: RecordKind::Snapshot,
            effect: EffectCode::None,
            session_id: 0,
            seq: 0,
            activity: self.state.clock,
            key: &[],
            value: &header_payload,
            reply: &[],
        }
        .encode(crc, &mut self.scratch);

        for (key, value) in &self.state.keys {
            crc = Record {
                kind: RecordKind::Key,
                effect: EffectCode::Put,
                session_id: 0,
                seq: 0,
                activity: 0,
                key,
                value,
                reply: &[],
            }
            .encode(crc, &mut self.scratch);
            if self.scratch.len() >= SNAPSHOT_WRITE_CHUNK_BYTES {
                self.region.write(half_offset + written, &self.scratch);
                written += self.scratch.len();
                self.scratch.clear();
            }
        }
        // In activity order, so replay rebuilds the same eviction order.
        for session_id in self.state.sessions_by_activity.values() {
            let session = &self.state.sessions[session_id];
            crc = Record {
                kind: RecordKind::Session,
                effect: EffectCode::None,
                session_id: *session_id,
                seq: session.last_seq,
                activity: session.activity,
                key: &[],
                value: &[],
                reply: &session.last_reply,
            }
            .encode(crc, &mut self.scratch);
            if self.scratch.len() >= SNAPSHOT_WRITE_CHUNK_BYTES {
                self.region.write(half_offset + written, &self.scratch);
                written += self.scratch.len();
                self.scratch.clear();
            }
        }
        self.region.write(half_offset + written, &self.scratch);
        written += self.scratch.len();
        self.scratch.clear();
        assert_eq!(written, snapshot_len);

        // Zero the terminator and any bytes a previous generation left in this half.
        let zero_end = self.dirty_len_bytes[half].max(snapshot_len + TERMINATOR_SIZE);
        write_zeros(
            &mut self.region,
            half_offset + snapshot_len,
            zero_end - snapshot_len,
        );
        self.region.persist(half_offset, zero_end);
        self.dirty_len_bytes[half] = snapshot_len + TERMINATOR_SIZE;
        (snapshot_len, crc)
    }

    /// Write and persist the superblock copy of `superblock`'s generation: the commit point.
    fn write_superblock(&mut self, superblock: Superblock) {
        let slot_offset = superblock.active_half() * SUPERBLOCK_SIZE;
        self.region.write(slot_offset, &superblock.encode());
        self.region.persist(slot_offset, SUPERBLOCK_SIZE);
    }

    fn half_offset(&self, half: usize) -> usize {
        assert!(half < 2);
        HALVES_OFFSET + half * self.half_len_bytes
    }

    fn half_len_for(region_len: usize) -> usize {
        let halves = region_len.saturating_sub(HALVES_OFFSET);
        (halves / 2) / HALF_ALIGN * HALF_ALIGN
    }

    /// A store id derived from what the region held before, so it differs from the id of any
    /// store formatted there earlier (whose stale records must never verify) while keeping
    /// format deterministic for the simulator.
    fn next_store_id(region: &R) -> u64 {
        let previous = &region.bytes()[..SUPERBLOCK_SIZE * SUPERBLOCK_COPIES];
        let low = crc32c::crc32c(previous);
        let high = crc32c::crc32c_append(0x706d_6e65, previous);
        let id = (u64::from(high) << 32) | u64::from(low);
        let previous_ids = [
            &previous[24..32],
            &previous[SUPERBLOCK_SIZE + 24..SUPERBLOCK_SIZE + 32],
        ];
        let mut id = id;
        while previous_ids.iter().any(|bytes| **bytes == id.to_le_bytes()) {
            id = id.wrapping_add(1);
        }
        id
    }

    /// Pick the superblock to open with; `true` when the newest copy was unreadable and its
    /// generation was adopted from a complete snapshot (the caller rewrites the copy).
    fn choose_superblock(region: &R) -> Result<(Superblock, bool), StoreError> {
        let bytes = region.bytes();
        let slots: [Result<Superblock, SlotError>; SUPERBLOCK_COPIES] =
            std::array::from_fn(|slot| {
                let offset = slot * SUPERBLOCK_SIZE;
                Superblock::decode(&bytes[offset..offset + SUPERBLOCK_SIZE])
            });
        let corrupt = |slot: usize, reason| StoreError::Corrupt {
            offset_bytes: (slot * SUPERBLOCK_SIZE) as u64,
            reason,
        };
        for (slot, result) in slots.iter().enumerate() {
            if let Ok(superblock) = result {
                if superblock.active_half() != slot {
                    return Err(corrupt(slot, "superblock copy is in the wrong slot"));
                }
            }
        }
        match (&slots[0], &slots[1]) {
            (Ok(a), Ok(b)) => {
                let same_store = a.store_id == b.store_id
                    && a.max_sessions == b.max_sessions
                    && a.region_len_bytes == b.region_len_bytes
                    && a.half_len_bytes == b.half_len_bytes;
                if !same_store {
                    return Err(corrupt(0, "superblock copies describe different stores"));
                }
                Ok((if a.generation > b.generation { *a } else { *b }, false))
            }
            (Ok(only), Err(_)) | (Err(_), Ok(only)) => {
                // The other copy is unreadable: either never written (a fresh store), torn by
                // a crash while committing generation + 1, or corrupted after committing it.
                // In the last two cases the next generation's snapshot is complete.
                let mut next = *only;
                next.generation += 1;
                let half_len = next.half_len_bytes as usize;
                if next.region_len_bytes == region.len() as u64 {
                    let half_offset = HALVES_OFFSET + next.active_half() * half_len;
                    let half = &bytes[half_offset..half_offset + half_len];
                    if verify_snapshot(half, chain_seed(next.store_id, next.generation)).is_some() {
                        return Ok((next, true));
                    }
                }
                Ok((*only, false))
            }
            (Err(a), Err(b)) => Err(match (a, b) {
                (SlotError::WrongVersion(found), _) | (_, SlotError::WrongVersion(found)) => {
                    StoreError::WrongVersion {
                        found: *found,
                        supported: layout::VERSION,
                    }
                }
                (SlotError::NoMagic, SlotError::NoMagic) => StoreError::NotAStore,
                _ => StoreError::CorruptSuperblock,
            }),
        }
    }
}

impl<R: PmRegion> Application for KvStore<R> {
    /// Durable when it returns: each request is one CRC-checked record, appended and
    /// persisted. [`NoSpace`] for a SET, INCR or APPEND that does not fit (see "Capacity and
    /// the reserve" in the module documentation); never for anything else.
    fn read(&mut self, request: &[u8]) -> Vec<u8> {
        let outcome = self.plan(request);
        match outcome.effect {
            Effect::None => outcome.reply,
            _ => Reply::Error("not a read: a cache read must be a GET".to_owned()).to_bytes(),
        }
    }

    fn note_time(&mut self, now_ms: u64) {
        self.now_ms = now_ms;
        self.time_since_ms.get_or_insert(now_ms);
        self.permitted.get_or_insert(None);
    }

    fn eviction_candidate(&mut self, for_session: u64) -> Option<(u64, u64)> {
        if self.state.sessions.contains_key(&for_session) {
            return None;
        }
        let (session_id, oldest) = self.state.eviction_candidate()?;
        Some((
            session_id,
            oldest.seen_ms.max(self.time_since_ms.unwrap_or(0)),
        ))
    }

    fn permit_eviction(&mut self, session_id: u64) {
        self.permitted = Some(Some(session_id));
    }

    fn stage(&mut self, session_id: u64, seq: u32, request: &[u8]) -> Result<Vec<u8>, NoSpace> {
        if let Some(session) = self.state.sessions.get(&session_id) {
            if seq <= session.last_seq {
                // Stale (see `Application::stage`): nothing applied, the record unchanged.
                self.stats.stale_requests += 1;
                return Ok(crate::app::stale_reply(seq, session.last_seq));
            }
        } else if let Some((oldest, _)) = self.state.eviction_candidate() {
            // Admitting this session would evict the oldest one; it goes only once the server
            // permitted it (no duplicate, replay or device's resend of its requests can come).
            if self
                .permitted
                .is_some_and(|permitted| permitted != Some(oldest))
            {
                self.stats.sessions_full += 1;
                return Err(NoSpace);
            }
            // A permit is good for one eviction (the server renews it before each request).
            if self.permitted.is_some() {
                self.permitted = Some(None);
            }
        }
        let outcome = self.plan(request);
        let committed = self.state.committed_bytes_after(session_id, &outcome);
        if committed + TERMINATOR_SIZE <= self.half_len_bytes {
            return Ok(self.commit_record(session_id, seq, outcome));
        }
        match outcome.effect {
            Effect::Put { .. } => {
                // Nothing written, nothing in memory changed: the caller keeps the request.
                self.stats.no_space += 1;
                return Err(NoSpace);
            }
            // Removing a key and a reply within the session's reserved slot never need more
            // than the state before, which fits (checked at open, kept by every apply).
            Effect::Delete { .. } => unreachable!("a delete needs no room: {committed} bytes"),
            Effect::None => {}
        }
        self.stats.store_full_replies += 1;
        let capacity = self.capacity_bytes();
        let used = self.used_bytes();
        let wanted = (committed + TERMINATOR_SIZE - self.half_len_bytes) as u64;
        let full = error_outcome(&format!(
            "store full: {wanted} bytes over capacity ({used} of {capacity} bytes used)"
        ));
        // An ERROR reply fits in the session's reserved slot, so this always fits.
        assert!(
            self.state.committed_bytes_after(session_id, &full) + TERMINATOR_SIZE
                <= self.half_len_bytes
        );
        Ok(self.commit_record(session_id, seq, full))
    }

    /// Nothing to do: every stage was durable when it returned.
    fn commit(&mut self) {}

    fn sessions(&self) -> Vec<SessionRecord> {
        let mut sessions: Vec<SessionRecord> = self
            .state
            .sessions
            .iter()
            .map(|(session_id, session)| SessionRecord {
                session_id: *session_id,
                last_seq: session.last_seq,
                last_reply: session.last_reply.clone(),
            })
            .collect();
        sessions.sort_by_key(|session| session.session_id);
        sessions
    }

    fn medium(&self) -> Option<MediumInfo> {
        Some(self.region.medium())
    }
}

/// Bytes of every half set aside regardless of data: the snapshot header, every session slot
/// holding a store ERROR reply, and the terminator.
fn reserve_bytes(max_sessions: u32) -> usize {
    SNAPSHOT_RECORD_SIZE + max_sessions as usize * SESSION_FLOOR_BYTES + TERMINATOR_SIZE
}

fn key_record_size(key_len: usize, value_len: usize) -> usize {
    record_size(key_len, value_len, 0)
}

fn session_record_size(reply_len: usize) -> usize {
    record_size(0, 0, reply_len)
}

/// What a session's reply costs beyond its reserved slot.
fn session_excess(reply_len: usize) -> usize {
    session_record_size(reply_len).saturating_sub(SESSION_FLOOR_BYTES)
}

fn error_outcome(message: &str) -> Outcome<'static> {
    let message = codec::truncate_utf8(message, STORE_ERROR_MESSAGE_MAX_LEN);
    let reply = Reply::Error(message.to_owned()).to_bytes();
    assert!(reply.len() <= STORE_ERROR_REPLY_MAX_LEN);
    Outcome {
        effect: Effect::None,
        reply,
    }
}

fn value_reply(value: &[u8]) -> Vec<u8> {
    // Same bytes as Reply::Value(value.to_vec()).to_bytes(), without the intermediate copy.
    assert!(value.len() <= MAX_VALUE_LEN);
    let mut reply = Vec::with_capacity(5 + value.len());
    reply.push(1);
    reply.extend_from_slice(&(value.len() as u32).to_le_bytes());
    reply.extend_from_slice(value);
    reply
}

/// A value INCR accepts: the canonical decimal form of an i64 (like Redis: no sign other
/// than a leading '-', no leading zeros, no spaces).
fn parse_integer(value: &[u8]) -> Option<i64> {
    if value.len() > 20 {
        return None;
    }
    let number: i64 = std::str::from_utf8(value).ok()?.parse().ok()?;
    (number.to_string().as_bytes() == value).then_some(number)
}

fn write_zeros<R: PmRegion>(region: &mut R, offset: usize, len: usize) {
    let mut done = 0;
    while done < len {
        let chunk = (len - done).min(ZEROS.len());
        region.write(offset + done, &ZEROS[..chunk]);
        done += chunk;
    }
}

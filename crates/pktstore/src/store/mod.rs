//! The store: one persistent region, two engines (packet and conventional) behind one
//! interface, batched crash-consistent commits, recovery.
//!
//! # Commit protocol (both engines)
//!
//! Work is grouped in *batches*, each with an epoch number. Staging a request writes its new
//! records (and any session-table entry) into free space and flushes them; it changes the DRAM
//! index at once (later requests of the batch see it) but writes no persistent link. Then
//! [`Store::commit`]:
//!
//! 1. writes the batch's *intent block* (the index operations to redo, in order), flushes it,
//!    and fences: every byte the batch wrote is durable, none of it reachable yet;
//! 2. stores the epoch in the commit word (one aligned 8-byte store) and fences: **the commit
//!    point** — replies may leave now;
//! 3. writes the level-0 links that changed (4-byte stores) and flushes them without a fence:
//!    the next batch's first fence covers them, and until then recovery redoes them from the
//!    intent block.
//!
//! Records a batch displaced stay allocated until the *next* batch commits (by then their
//! links are durably gone and the intent naming them is superseded); only then are their slots
//! free for receiving or writing again. Session entries carry the epoch that wrote them and
//! count only when it is committed. So a crash anywhere leaves either the whole batch or none
//! of it, and two fences per batch (not per request) make a whole receive batch durable.
//!
//! # Where the code is
//!
//! This file holds the type, its constructors and its small accessors. The rest, by file:
//! `receive.rs` the receive path (slots lent for receiving, received datagrams staged in
//! place), `apply.rs` staging requests, `write.rs` writing records into free space,
//! `table.rs` the session table, `commit.rs` batches and the commit, `recover.rs` opening a
//! store, `view.rs` the read-only queries and record checks, `space.rs` the allocation
//! state (free slots or buddy blocks, receive loans, records waiting to be reused), and
//! `invariants.rs` the self-checks of the DRAM bookkeeping that debug builds run after every
//! commit.

mod apply;
mod commit;
mod copy;
pub use copy::{CopyError, CopyReport, COPY_SESSION};
mod id_bits;
#[cfg(any(test, debug_assertions))]
mod invariants;
mod receive;
mod recover;
mod space;
mod table;
mod view;
mod write;

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use pmnet_pm::{MediumInfo, PmRegion};
use pmnet_store::{Application, NoSpace, Reply, SessionRecord};

use crate::breakdown::{Breakdown, Phase};
use crate::buddy::order_for;
use crate::index::{Index, LinkUpdate};
use crate::layout::*;
use crate::sessions::{Sessions, Source};
use id_bits::IdBits;
use space::Space;
use table::TableSlot;

const OP_SET: u8 = 1;
const OP_DEL: u8 = 3;
const OP_APPEND: u8 = 5;

/// How to format a store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreConfig {
    pub engine: EngineKind,
    /// Packet engine: bytes per slot, metadata line included; a slot holds one datagram of up
    /// to `slot_size - 64` bytes.
    pub slot_size: usize,
    /// Sessions whose exactly-once record the session table keeps.
    pub max_sessions: u32,
}

impl StoreConfig {
    pub fn new(engine: EngineKind) -> StoreConfig {
        StoreConfig {
            engine,
            slot_size: DEFAULT_SLOT_SIZE,
            max_sessions: 1024,
        }
    }
}

/// Why a store could not be opened or formatted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    #[error("{0}")]
    Layout(String),
    #[error("max sessions must be at least {min} (a batch may touch that many), got {got}")]
    TooFewSessions { min: u32, got: u32 },
}

/// A record found damaged: detected, reported, never returned as data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Corruption {
    pub record: u32,
    pub reason: &'static str,
}

impl std::fmt::Display for Corruption {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "record {} is corrupt: {}", self.record, self.reason)
    }
}

/// What opening a store found.
#[derive(Debug, Clone, Default)]
pub struct RecoveryReport {
    pub duration: Duration,
    pub committed_epoch: u64,
    /// Keys in the index after recovery.
    pub key_count: usize,
    pub session_count: usize,
    /// Index operations of the last committed batch redone.
    pub redone_ops: usize,
    /// Records whose data failed their checksum (or structure): dropped from the index.
    pub corrupt_records: Vec<Corruption>,
    /// The index could not be followed past a damaged link: keys after it are lost.
    pub index_broken: Option<String>,
    /// Session-table copies that were in use but failed their CRC (torn, never committed, or
    /// damaged).
    pub rejected_session_copies: usize,
    /// Bytes of record data whose checksum recovery verified.
    pub verified_bytes: u64,
}

impl RecoveryReport {
    /// A summary line, or `None` when recovery found nothing wrong.
    pub fn warning(&self) -> Option<String> {
        if self.corrupt_records.is_empty() && self.index_broken.is_none() {
            return None;
        }
        let mut text = format!(
            "{} corrupt record(s) detected and dropped",
            self.corrupt_records.len()
        );
        for corruption in self.corrupt_records.iter().take(4) {
            text.push_str(&format!("; {corruption}"));
        }
        if let Some(broken) = &self.index_broken {
            text.push_str(&format!("; INDEX BROKEN: {broken}"));
        }
        Some(text)
    }
}

/// Counters; monotonically increasing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoreStats {
    pub requests: u64,
    pub batches: u64,
    pub fences: u64,
    /// Records made from datagrams received straight into a slot (no copy).
    pub records_received_in_place: u64,
    /// Records the store wrote itself (conventional records, requests that arrived otherwise,
    /// INCR/APPEND results, long replies).
    pub records_written: u64,
    pub records_freed: u64,
    /// Session entries written because a record that carried a session's last sequence
    /// number was displaced.
    pub session_folds: u64,
    pub sessions_evicted: u64,
    /// Requests at or below their session's last applied number, refused with nothing
    /// applied (see `Application::stage`).
    pub stale_requests: u64,
    /// Requests of new sessions handed back because every session-table entry belonged to a
    /// session applied within the server's keeping time (the server retries them).
    pub sessions_full: u64,
    /// GETs whose reply was too long to keep inline and found no room for a reply record:
    /// answered `ERROR store full: reply not kept` (a read; nothing acknowledged is lost).
    pub store_full_replies: u64,
    /// Requests refused with [`NoSpace`]: nothing of them staged, the caller retries them.
    pub no_space: u64,
    /// Commits made early to turn records freed by earlier batches into free space for a
    /// request that found none.
    pub reclaim_commits: u64,
    pub read_verify_failures: u64,
    pub receive_rejects: u64,
}

/// A value as stored: one or more byte ranges of persistent memory, in order (a scatter-gather
/// list). Nothing is copied to make it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Value<'a> {
    pub segments: Vec<&'a [u8]>,
}

impl Value<'_> {
    pub fn len(&self) -> usize {
        self.segments.iter().map(|s| s.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn to_vec(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.len());
        for segment in &self.segments {
            out.extend_from_slice(segment);
        }
        out
    }
}

/// A free slot lent for receiving one datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReceiveSlot {
    pub slot: u32,
    /// Region offset where the datagram goes.
    pub offset: usize,
    /// Bytes available for it.
    pub capacity: usize,
}

/// Why received slots could not become a record in place (they are released; apply the
/// request from its bytes instead).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReceiveReject {
    pub reason: &'static str,
}

#[derive(Debug, Default)]
struct Batch {
    ops: Vec<IntentOp>,
    freed: Vec<u32>,
    wrote: bool,
}

/// A record whose body is written and flushed, and whose metadata line is not yet written.
#[derive(Debug, Clone, Copy)]
struct Pending {
    id: u32,
    meta: Meta,
    /// Bytes after the metadata line written and not flushed yet: flushed with the line, in
    /// one range, once the record's place in the index is known.
    unflushed: u32,
}

/// What [`Store::begin_op`] changed, for [`Store::cancel_op`] to undo.
#[derive(Debug, Clone, Copy)]
struct OpMark {
    epoch: u64,
    wrote: bool,
}

/// The persistent store. See the module documentation.
pub struct Store<R: PmRegion> {
    region: R,
    geometry: Geometry,
    committed_epoch: u64,
    index: Index,
    /// Free space, receive loans, and records waiting to be reused.
    space: Space,
    sessions: Sessions,
    /// Records that are some session's last applied request (`Source::Record`), one bit per
    /// record id: retiring a record that is nobody's costs one bit test; for one that is, the
    /// session is read from the record's own header.
    session_sources: IdBits,
    table: Vec<TableSlot>,
    free_table: Vec<u32>,
    /// The server's time (milliseconds), as it last said ([`Application::note_time`]), and
    /// when it first said it (sessions recovered at open count as seen then).
    now_ms: u64,
    /// Once the server told the time: the session it permitted this store to forget
    /// ([`Application::permit_eviction`]); `None` (never told): any.
    permitted: Option<Option<u64>>,
    time_since_ms: Option<u64>,
    /// Owned table entries in the order their sessions were last active, oldest first,
    /// lazily: `(activity, index)` is stale once the owner's `last_active` moved on. Finding
    /// the entry to evict so costs constant amortised time, not a scan of the table.
    table_order: VecDeque<(u64, u32)>,
    activity: u64,
    batch: Batch,
    links: Vec<LinkUpdate>,
    scratch: Vec<u8>,
    stats: StoreStats,
    recovery: RecoveryReport,
    breakdown: Option<Breakdown>,
}

impl<R: PmRegion> std::fmt::Debug for Store<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("engine", &self.geometry.engine)
            .field("geometry", &self.geometry)
            .field("committed_epoch", &self.committed_epoch)
            .field("keys", &self.index.len())
            .field("sessions", &self.sessions.len())
            .field("medium", &self.region.medium())
            .finish()
    }
}

/// The superblock's bytes (fewer if the region is shorter: then it holds no store).
fn superblock<R: PmRegion>(region: &R) -> &[u8] {
    &region.bytes()[..region.len().min(SUPERBLOCK_LEN)]
}

fn error_reply(message: &str) -> Vec<u8> {
    // Short enough to stay inline in a session entry, so an error never needs space.
    let mut end = message.len().min(INLINE_REPLY_CAPACITY - 3);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    Reply::Error(message[..end].to_owned()).to_bytes()
}

impl<R: PmRegion> Store<R> {
    /// Erase `region` and make an empty store on it.
    pub fn format(mut region: R, config: StoreConfig) -> Result<Store<R>, StoreError> {
        let min_sessions = MAX_BATCH_OPS as u32 * 2;
        if config.max_sessions < min_sessions {
            return Err(StoreError::TooFewSessions {
                min: min_sessions,
                got: config.max_sessions,
            });
        }
        let geometry = Geometry::plan(
            config.engine,
            region.len(),
            config.slot_size,
            config.max_sessions,
        )
        .map_err(StoreError::Layout)?;
        // Invalidate first, so a crash while formatting leaves no half store that opens.
        region.write(0, &[0u8; 64]);
        region.persist(0, 64);
        let table_end = geometry.data_offset();
        let zeros = vec![0u8; 64 * 1024];
        let mut offset = 64;
        while offset < table_end {
            let len = (table_end - offset).min(zeros.len());
            region.write(offset, &zeros[..len]);
            region.flush(offset, len);
            offset += len;
        }
        let mut intent = Vec::new();
        encode_intent(0, &[], &mut intent);
        region.write(intent_offset(0), &intent);
        region.flush(intent_offset(0), intent.len());
        region.fence();
        region.write(0, &geometry.encode());
        region.persist(0, 64);
        Store::open(region)
    }

    /// Grow the store on `region` (not open: a closed store's file, made longer first, its
    /// new bytes zero) into all of it: the data area is extended to the region's end in whole
    /// slots, by one aligned 8-byte store (the growth word) made durable before this returns.
    /// A crash before that store leaves the store as it was; after it, the larger one (its new
    /// space free). The geometries before and after, or why it cannot grow.
    pub fn grow(region: &mut R) -> Result<(Geometry, Geometry), StoreError> {
        let before =
            Geometry::read(superblock(region), region.len()).map_err(StoreError::Layout)?;
        let Some((after, word)) = before.grow(region.len()) else {
            return Err(StoreError::Layout(format!(
                "nothing to grow into: a region of {} bytes holds no more than the store's {}                  bytes of data",
                region.len(),
                before.data_len
            )));
        };
        region.write(GROWTH_OFFSET, &word);
        region.persist(GROWTH_OFFSET, word.len());
        Ok((before, after))
    }

    /// Open the store on `region` and recover it.
    pub fn open(region: R) -> Result<Store<R>, StoreError> {
        let started = Instant::now();
        let geometry =
            Geometry::read(superblock(&region), region.len()).map_err(StoreError::Layout)?;
        let committed_epoch = u64_at(region.bytes(), COMMIT_OFFSET);
        let mut store = Store {
            geometry,
            committed_epoch,
            index: Index::new(0x9E37_79B9_7F4A_7C15 ^ committed_epoch),
            space: Space::new(geometry),
            sessions: Sessions::default(),
            // Every granule can start a conventional record (no slots: `per` becomes 1).
            session_sources: IdBits::new(geometry.granule_count(), geometry.granules_per_slot()),
            table: vec![TableSlot::default(); geometry.max_sessions as usize],
            free_table: Vec::new(),
            now_ms: 0,
            permitted: None,
            time_since_ms: None,
            table_order: VecDeque::new(),
            activity: 0,
            batch: Batch::default(),
            links: Vec::new(),
            scratch: Vec::new(),
            stats: StoreStats::default(),
            recovery: RecoveryReport {
                committed_epoch,
                ..RecoveryReport::default()
            },
            breakdown: None,
            region,
        };
        store.recover()?;
        store.recovery.duration = started.elapsed();
        Ok(store)
    }

    pub fn engine(&self) -> EngineKind {
        self.geometry.engine
    }

    pub fn geometry(&self) -> &Geometry {
        &self.geometry
    }

    pub fn region(&self) -> &R {
        &self.region
    }

    /// The region, for a test that crashes it; the store must not be used afterwards.
    pub fn into_region(self) -> R {
        self.region
    }

    /// The region, to damage it under a live store in tests.
    #[cfg(test)]
    pub(crate) fn region_mut(&mut self) -> &mut R {
        &mut self.region
    }

    pub fn stats(&self) -> &StoreStats {
        &self.stats
    }

    pub fn recovery(&self) -> &RecoveryReport {
        &self.recovery
    }

    pub fn key_count(&self) -> usize {
        self.index.len()
    }

    pub fn session_count(&self) -> usize {
        self.sessions.len()
    }

    pub fn committed_epoch(&self) -> u64 {
        self.committed_epoch
    }

    /// Free space for new records, in bytes (the delete reserve included).
    pub fn free_bytes(&self) -> u64 {
        self.space.free_bytes()
    }

    /// Packet engine: the free slots only a DEL may take. A DEL of a present key writes a
    /// record naming the key (recovery may have to redo the removal), so it needs room even
    /// when the store is full, or nothing could ever make room. It frees at least as much as
    /// it takes: the record it removes is a SET of the same key, whose datagrams are longer
    /// than the DEL's. So data (SET, INCR, APPEND, long replies) stops short of the last
    /// `delete_reserve_slots` free slots, receive loans stop above them, and a DEL may use
    /// them; what a DEL takes comes back, with more, once the batch after it commits.
    /// The reserve holds the longest DEL (key of `MAX_KEY_LEN` bytes) once per request of a
    /// batch, up to 1/64 of the slots, and at least once.
    pub fn delete_reserve_slots(&self) -> usize {
        self.space.delete_reserve_slots()
    }

    /// How many keys of `key_and_value_len` bytes (key and value together) the store holds
    /// when it holds nothing else: its data space less the delete reserve, over what one such
    /// key takes (packet engine: the slots of its SET datagrams; conventional engine: its
    /// buddy block). Sessions' long replies and records waiting to be reused take some of it.
    pub fn key_capacity(&self, key_and_value_len: usize) -> u64 {
        match self.geometry.engine {
            EngineKind::Packet => {
                let slots_per_key = (7 + key_and_value_len)
                    .div_ceil(self.geometry.slot_payload_capacity())
                    .max(1);
                let usable = (self.geometry.slot_count as usize)
                    .saturating_sub(self.space.delete_reserve_slots());
                (usable / slots_per_key) as u64
            }
            EngineKind::Conventional => {
                let Some(order) = order_for(META_LEN + CONVENTIONAL_HEADER_LEN + key_and_value_len)
                else {
                    return 0;
                };
                let reserve = self.space.delete_block_len();
                self.geometry.data_len.saturating_sub(reserve) / ((GRANULE as u64) << order)
            }
        }
    }

    /// Packet engine: the most bytes of key and value a SET may carry and still be one
    /// datagram, so one slot.
    pub fn one_slot_key_and_value_len(&self) -> usize {
        self.geometry.slot_payload_capacity() - 7
    }

    /// Packet engine: free slots.
    pub fn free_slot_count(&self) -> usize {
        self.space.free_slot_count()
    }

    /// Records freed by committed batches and waiting for the next commit.
    pub fn limbo_count(&self) -> usize {
        self.space.limbo_count()
    }

    /// Start timing the write path per phase (see [`crate::breakdown`]).
    pub fn enable_breakdown(&mut self) {
        self.breakdown = Some(Breakdown::default());
    }

    pub fn take_breakdown(&mut self) -> Option<Breakdown> {
        self.breakdown.take()
    }

    #[inline]
    pub(super) fn mark(&mut self, phase: Phase) {
        if let Some(breakdown) = &mut self.breakdown {
            breakdown.mark(phase);
        }
    }

    #[inline]
    pub(super) fn start_timing(&mut self) {
        if let Some(breakdown) = &mut self.breakdown {
            breakdown.start();
        }
    }
}

impl<R: PmRegion> Application for Store<R> {
    /// [`Store::stage_request`]: `Err(NoSpace)` for a SET, INCR or APPEND with no room, never
    /// for anything else.
    fn stage(&mut self, session_id: u64, seq: u32, request: &[u8]) -> Result<Vec<u8>, NoSpace> {
        // One look at the session: a known one is stale at or below its record (see
        // `Application::stage`: nothing applied, the record unchanged) and needs no room; an
        // unknown one may have to wait for the server's permit to evict.
        match self
            .sessions
            .get(session_id)
            .map(|session| session.last_seq)
        {
            Some(last_seq) if seq <= last_seq => {
                self.stats.stale_requests += 1;
                return Ok(pmnet_store::stale_reply(seq, last_seq));
            }
            Some(_) => {}
            None if self.must_keep_every_session_for(session_id) => return Err(NoSpace),
            None => {}
        }
        self.stage_request(session_id, seq, request)
    }

    fn note_time(&mut self, now_ms: u64) {
        self.now_ms = now_ms;
        self.time_since_ms.get_or_insert(now_ms);
        self.permitted.get_or_insert(None);
    }

    fn eviction_candidate(&mut self, for_session: u64) -> Option<(u64, u64)> {
        if self.sessions.get(for_session).is_some() {
            return None;
        }
        self.table_victim_with_record()
    }

    fn permit_eviction(&mut self, session_id: u64) {
        self.permitted = Some(Some(session_id));
    }

    /// A GET on what is committed and staged; anything else is refused, recording nothing.
    fn read(&mut self, request: &[u8]) -> Vec<u8> {
        self.read_request(request)
    }

    /// [`Store::commit`]: the whole batch with two fences.
    fn commit(&mut self) {
        Store::commit(self)
    }

    fn max_staged(&self) -> usize {
        crate::layout::MAX_BATCH_OPS
    }

    fn sessions(&self) -> Vec<SessionRecord> {
        let mut out: Vec<SessionRecord> = self
            .sessions
            .iter()
            .map(|(session_id, state)| SessionRecord {
                session_id,
                last_seq: state.last_seq,
                last_reply: match (state.source, state.table) {
                    (Source::Record(id), _) => self.derived_reply(id),
                    (Source::Table, Some(index)) => self.table_reply(index),
                    (Source::Table, None) => Vec::new(),
                },
            })
            .collect();
        out.sort_by_key(|record| record.session_id);
        out
    }

    fn medium(&self) -> Option<MediumInfo> {
        Some(self.region.medium())
    }
}

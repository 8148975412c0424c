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

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use pmnet_pm::{MediumInfo, PmRegion};
use pmnet_store::codec::{MAX_KEY_LEN, MAX_VALUE_LEN};
use pmnet_store::{Application, NoSpace, Reply, Request, SessionRecord};
use pmnet_wire::{Packet, PacketType, HEADER_LEN};

use crate::breakdown::{Breakdown, Phase};
use crate::buddy::{order_for, Buddy};
use crate::index::{Builder, Index, LinkUpdate};
use crate::layout::*;
use crate::sessions::{SessionState, Sessions, Source};

const OP_SET: u8 = 1;
const OP_DEL: u8 = 3;
const OP_APPEND: u8 = 5;

/// The receive slots lent out, by slot number: what each received. An array, not a map: a loan
/// is looked up for every received datagram.
#[derive(Debug, Default)]
struct Loans {
    /// Per slot: (`NOT_LENT`, `AWAITING` or the received length; receive time).
    entries: Vec<(u32, u64)>,
    count: usize,
}

const CHAIN_UNKNOWN: u32 = u32::MAX;
const CHAIN_END: u32 = u32::MAX - 1;

const NOT_LENT: u32 = u32::MAX;
const AWAITING: u32 = u32::MAX - 1;

impl Loans {
    fn new(slot_count: u32) -> Loans {
        Loans {
            entries: vec![(NOT_LENT, 0); slot_count as usize],
            count: 0,
        }
    }

    fn lend(&mut self, slot: u32) {
        if let Some(entry) = self.entries.get_mut(slot as usize) {
            if entry.0 == NOT_LENT {
                self.count += 1;
            }
            *entry = (AWAITING, 0);
        }
    }

    fn is_lent(&self, slot: u32) -> bool {
        self.entries
            .get(slot as usize)
            .is_some_and(|entry| entry.0 != NOT_LENT)
    }

    /// A lent slot's entry, to record what it received.
    fn entry_mut(&mut self, slot: u32) -> Option<&mut (u32, u64)> {
        self.entries
            .get_mut(slot as usize)
            .filter(|entry| entry.0 != NOT_LENT)
    }

    /// (length, receive time) of what lent `slot` received.
    fn received(&self, slot: u32) -> Option<(u32, u64)> {
        self.entries
            .get(slot as usize)
            .copied()
            .filter(|entry| entry.0 != NOT_LENT && entry.0 != AWAITING)
    }

    /// End the loan of `slot`; its entry (`AWAITING` as the length if nothing was received).
    fn take(&mut self, slot: u32) -> Option<(u32, u64)> {
        let entry = self.entries.get_mut(slot as usize)?;
        if entry.0 == NOT_LENT {
            return None;
        }
        self.count -= 1;
        Some(std::mem::replace(entry, (NOT_LENT, 0)))
    }
}

/// One bit per record id. Ids that can start a record are multiples of `per` (a slot's granules
/// in the packet store, 1 in the conventional heap), so the bits stay dense: 2.5 KB for 20 000
/// slots.
#[derive(Debug, Clone)]
struct IdBits {
    words: Vec<u64>,
    per: u32,
}

impl IdBits {
    fn new(ids: u32, per: u32) -> IdBits {
        let per = per.max(1);
        IdBits {
            words: vec![0; (ids / per) as usize / 64 + 1],
            per,
        }
    }

    fn locate(&self, id: u32) -> (usize, u64) {
        let (bit, _) = divide(id, self.per);
        (bit as usize / 64, 1 << (bit % 64))
    }

    fn get(&self, id: u32) -> bool {
        let (word, mask) = self.locate(id);
        self.words.get(word).is_some_and(|word| word & mask != 0)
    }

    fn set(&mut self, id: u32) {
        let (word, mask) = self.locate(id);
        if let Some(word) = self.words.get_mut(word) {
            *word |= mask;
        }
    }

    fn clear(&mut self, id: u32) {
        let (word, mask) = self.locate(id);
        if let Some(word) = self.words.get_mut(word) {
            *word &= !mask;
        }
    }
}

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

#[derive(Debug, Clone, Default)]
struct TableSlot {
    owner: Option<u64>,
    latest_copy: u8,
    latest_epoch: u64,
    reply_record: Option<u32>,
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

/// What space is taken for. Data may not use the delete reserve; a delete, which frees at
/// least as much as it takes, may (see [`Store::delete_reserve_slots`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Purpose {
    Data,
    Delete,
}

/// What [`Store::begin_op`] changed, for [`Store::cancel_op`] to undo.
#[derive(Debug, Clone, Copy)]
struct OpMark {
    epoch: u64,
    wrote: bool,
}

/// What a request looks like, read from its datagrams without copying.
#[derive(Debug)]
struct RequestShape<'a> {
    session_id: u64,
    seq: u32,
    op: u8,
    key: &'a [u8],
}

/// The persistent store. See the module documentation.
pub struct Store<R: PmRegion> {
    region: R,
    geometry: Geometry,
    committed_epoch: u64,
    index: Index,
    free_slots: Vec<u32>,
    /// Packet engine, by slot: the record id of the next fragment in the slot's chain,
    /// `CHAIN_END` for the last fragment, or `CHAIN_UNKNOWN` (free, or recovered: read the
    /// metadata line). Freeing a record walks this instead of its metadata lines in PM.
    chain_next: Vec<u32>,
    /// Packet engine: records known to be one datagram, one bit per record id (their
    /// `chain_next` stays `CHAIN_UNKNOWN`). Freeing one tests a bit of a small bitmap instead
    /// of reading a random entry of `chain_next`, which a stream of writes keeps out of cache.
    one_datagram: IdBits,
    buddy: Option<Buddy>,
    /// Records freed by a batch, reusable once a later batch committed: (epoch, record id).
    limbo: Vec<(u64, u32)>,
    /// Lent receive slots.
    loans: Loans,
    sessions: Sessions,
    /// Records that are some session's last applied request (`Source::Record`), one bit per
    /// record id: retiring a record that is nobody's costs one bit test; for one that is, the
    /// session is read from the record's own header.
    session_sources: IdBits,
    table: Vec<TableSlot>,
    free_table: Vec<u32>,
    /// Owned table entries in the order their sessions were last active, oldest first,
    /// lazily: `(activity, index)` is stale once the owner's `last_active` moved on. Finding
    /// the entry to evict so costs constant amortised time, not a scan of the table.
    table_order: VecDeque<(u64, u32)>,
    activity: u64,
    batch: Batch,
    links: Vec<LinkUpdate>,
    scratch: Vec<u8>,
    receive_reserve: usize,
    /// Packet engine: free slots only deletes may take (see [`Store::delete_reserve_slots`]).
    delete_reserve: usize,
    /// Conventional engine: a free block of `delete_block_order`, held out of the allocator
    /// for deletes; taken again before the next data allocation.
    delete_block: Option<u32>,
    delete_block_order: u8,
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

fn error_reply(message: &str) -> Vec<u8> {
    // Short enough to stay inline in a session entry, so an error never needs space.
    let mut end = message.len().min(INLINE_REPLY_CAPACITY - 3);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    Reply::Error(message[..end].to_owned()).to_bytes()
}

/// The PMNet header of a datagram the store makes itself.
fn synth_header(
    packet_type: PacketType,
    session_id: u64,
    seq: u32,
    fragment: (u16, u16),
    payload: &[u8],
) -> [u8; HEADER_LEN] {
    let mut header = [0u8; HEADER_LEN];
    header[0..2].copy_from_slice(&pmnet_wire::MAGIC.to_be_bytes());
    header[2] = pmnet_wire::VERSION;
    header[3] = packet_type as u8;
    header[8..16].copy_from_slice(&session_id.to_be_bytes());
    header[16..20].copy_from_slice(&seq.to_be_bytes());
    header[20..22].copy_from_slice(&fragment.0.to_be_bytes());
    header[22..24].copy_from_slice(&fragment.1.to_be_bytes());
    header[24..26].copy_from_slice(&(payload.len() as u16).to_be_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&header[0..28]), payload);
    header[28..32].copy_from_slice(&crc.to_be_bytes());
    header
}

/// Check the datagrams of one request (in fragment order) and find its op and key, reading
/// only headers and the first bytes of the payload. `verify_crc` checks every CRC32C too.
fn inspect_request<'a>(
    datagrams: &[&'a [u8]],
    verify_crc: bool,
    expected_type: PacketType,
) -> Result<RequestShape<'a>, &'static str> {
    let count = datagrams.len();
    if count == 0 || count > usize::from(u16::MAX) {
        return Err("bad_fragment");
    }
    let mut session_id = 0;
    let mut seq = 0;
    let mut total = 0usize;
    for (index, datagram) in datagrams.iter().enumerate() {
        let packet = Packet::new_checked(*datagram).map_err(|error| error.reason())?;
        if verify_crc && !packet.verify_checksum() {
            return Err("bad_checksum");
        }
        if PacketType::from_code(packet.type_code()).is_none() {
            return Err("unknown_type");
        }
        if index == 0 {
            session_id = packet.session_id();
            seq = packet.seq();
        } else if packet.session_id() != session_id || packet.seq() != seq {
            return Err("fragments_of_different_requests");
        }
        if usize::from(packet.fragment_index()) != index
            || usize::from(packet.fragment_count()) != count
        {
            return Err("bad_fragment");
        }
        let type_ok = packet.type_code() == expected_type as u8
            || (expected_type == PacketType::UpdateRequest
                && packet.type_code() == PacketType::BypassRequest as u8);
        if !type_ok {
            return Err("unexpected_type");
        }
        total += usize::from(packet.payload_len());
    }
    let first = &datagrams[0][HEADER_LEN..];
    if expected_type != PacketType::UpdateRequest {
        return Ok(RequestShape {
            session_id,
            seq,
            op: 0,
            key: &[],
        });
    }
    let op = *first.first().ok_or("empty_request")?;
    if first.len() < 3 {
        return Err("key_not_in_first_fragment");
    }
    let key_len = usize::from(u16::from_le_bytes([first[1], first[2]]));
    if key_len == 0 || key_len > MAX_KEY_LEN {
        return Err("bad_key_length");
    }
    let key = first
        .get(3..3 + key_len)
        .ok_or("key_not_in_first_fragment")?;
    match op {
        OP_SET | OP_APPEND => {
            let field = first
                .get(3 + key_len..7 + key_len)
                .ok_or("key_not_in_first_fragment")?;
            let value_len = u32::from_le_bytes([field[0], field[1], field[2], field[3]]) as usize;
            if value_len > MAX_VALUE_LEN || total != 7 + key_len + value_len {
                return Err("request_length_mismatch");
            }
        }
        OP_DEL if total != 3 + key_len => return Err("request_length_mismatch"),
        _ => {}
    }
    Ok(RequestShape {
        session_id,
        seq,
        op,
        key,
    })
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

    /// Open the store on `region` and recover it.
    pub fn open(region: R) -> Result<Store<R>, StoreError> {
        let started = Instant::now();
        let geometry =
            Geometry::decode(&region.bytes()[0..64], region.len()).map_err(StoreError::Layout)?;
        let committed_epoch = u64_at(region.bytes(), COMMIT_OFFSET);
        let mut store = Store {
            geometry,
            committed_epoch,
            index: Index::new(0x9E37_79B9_7F4A_7C15 ^ committed_epoch),
            free_slots: Vec::new(),
            // No slots (so nothing) in the conventional engine.
            chain_next: vec![CHAIN_UNKNOWN; geometry.slot_count as usize],
            // A bit per slot; none in the conventional engine.
            one_datagram: IdBits::new(
                geometry
                    .slot_count
                    .saturating_mul(geometry.granules_per_slot()),
                geometry.granules_per_slot(),
            ),
            buddy: None,
            limbo: Vec::new(),
            loans: Loans::new(geometry.slot_count),
            sessions: Sessions::default(),
            // Every granule can start a conventional record (no slots: `per` becomes 1).
            session_sources: IdBits::new(geometry.granule_count(), geometry.granules_per_slot()),
            table: vec![TableSlot::default(); geometry.max_sessions as usize],
            free_table: Vec::new(),
            table_order: VecDeque::new(),
            activity: 0,
            batch: Batch::default(),
            links: Vec::new(),
            scratch: Vec::new(),
            receive_reserve: 0,
            delete_reserve: 0,
            delete_block: None,
            delete_block_order: 0,
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

    /// Test invariant: after a commit the DRAM index is consistent (predecessors, hash table),
    /// the persistent level-0 list is the DRAM index, and no free slot is part of a live record.
    #[cfg(test)]
    pub(crate) fn check_invariants(&self) -> Result<(), String> {
        let bytes = self.region.bytes();
        let mut pm = Vec::new();
        let mut link = u32_at(bytes, HEAD_OFFSET);
        while let Some(id) = id_of_link(link) {
            pm.push(id);
            if pm.len() > self.geometry.granule_count() as usize {
                return Err("PM list loops".into());
            }
            link = self.meta(id).map_or(0, |meta| meta.next0);
        }
        self.index.check_links()?;
        let dram: Vec<u32> = self.index.records().collect();
        if pm != dram {
            return Err(format!("PM list {pm:?} != index {dram:?}"));
        }
        if self.geometry.engine == EngineKind::Packet {
            let free: std::collections::HashSet<u32> = self.free_slots.iter().copied().collect();
            for id in dram {
                let members = self
                    .check_record(id, false)
                    .map(|c| c.ids)
                    .unwrap_or_default();
                for (position, &member) in members.iter().enumerate() {
                    let slot = self.geometry.slot_of(member).unwrap_or(u32::MAX);
                    if free.contains(&slot) {
                        return Err(format!(
                            "slot of live record {member} (head {id}) is free; limbo {:?}",
                            self.limbo
                        ));
                    }
                    if self.one_datagram.get(member) && (position != 0 || members.len() != 1) {
                        return Err(format!(
                            "record {id}: {member} is marked one datagram in a chain of {}",
                            members.len()
                        ));
                    }
                    let known = self.chain_next.get(slot as usize).copied();
                    let expected = members.get(position + 1).copied().unwrap_or(CHAIN_END);
                    if known != Some(CHAIN_UNKNOWN) && known != Some(expected) {
                        return Err(format!(
                            "record {id}: DRAM chain says {known:?} after {member}, PM says {expected}"
                        ));
                    }
                }
            }
            for &slot in &self.free_slots {
                if self.chain_next.get(slot as usize) != Some(&CHAIN_UNKNOWN) {
                    return Err(format!("free slot {slot} still has a chain link"));
                }
                if self.one_datagram.get(self.geometry.slot_id(slot)) {
                    return Err(format!("free slot {slot} is still marked one datagram"));
                }
            }
        }
        Ok(())
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
        match &self.buddy {
            Some(buddy) => {
                let held = self
                    .delete_block
                    .map_or(0, |_| (GRANULE as u64) << self.delete_block_order);
                buddy.free_bytes() + held
            }
            None => self.free_slots.len() as u64 * u64::from(self.geometry.slot_size),
        }
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
        self.delete_reserve
    }

    /// How many keys of `key_and_value_len` bytes (key and value together) the store holds
    /// when it holds nothing else: its data space less the delete reserve, over what one such
    /// key takes (packet engine: the slots of its SET datagrams; conventional engine: its
    /// buddy block). Sessions' long replies and records waiting to be reused take some of it.
    pub fn key_capacity(&self, key_and_value_len: usize) -> u64 {
        match self.geometry.engine {
            EngineKind::Packet => {
                let slots_per_key = (7 + key_and_value_len)
                    .div_ceil(self.geometry.slot_datagram_capacity() - HEADER_LEN)
                    .max(1);
                let usable =
                    (self.geometry.slot_count as usize).saturating_sub(self.delete_reserve);
                (usable / slots_per_key) as u64
            }
            EngineKind::Conventional => {
                let Some(order) = order_for(META_LEN + CONVENTIONAL_HEADER_LEN + key_and_value_len)
                else {
                    return 0;
                };
                let reserve = (GRANULE as u64) << self.delete_block_order;
                self.geometry.data_len.saturating_sub(reserve) / ((GRANULE as u64) << order)
            }
        }
    }

    /// Packet engine: the most bytes of key and value a SET may carry and still be one
    /// datagram, so one slot.
    pub fn one_slot_key_and_value_len(&self) -> usize {
        self.geometry.slot_datagram_capacity() - HEADER_LEN - 7
    }

    /// Packet engine: free slots.
    pub fn free_slot_count(&self) -> usize {
        self.free_slots.len()
    }

    /// Records freed by committed batches and waiting for the next commit.
    pub fn limbo_count(&self) -> usize {
        self.limbo.len()
    }

    /// Start timing the write path per phase (see [`crate::breakdown`]).
    pub fn enable_breakdown(&mut self) {
        self.breakdown = Some(Breakdown::default());
    }

    pub fn take_breakdown(&mut self) -> Option<Breakdown> {
        self.breakdown.take()
    }

    #[inline]
    fn mark(&mut self, phase: Phase) {
        if let Some(breakdown) = &mut self.breakdown {
            breakdown.mark(phase);
        }
    }

    #[inline]
    fn start_timing(&mut self) {
        if let Some(breakdown) = &mut self.breakdown {
            breakdown.start();
        }
    }

    /// Reads see the batch being staged too (its records carry the next epoch).
    fn view(&self) -> View<'_> {
        View {
            bytes: self.region.bytes(),
            geometry: self.geometry,
            committed_epoch: self.batch_epoch(),
        }
    }

    fn meta(&self, id: u32) -> Option<Meta> {
        self.view().meta(id)
    }

    fn check_record(&self, id: u32, verify: bool) -> Result<CheckedRecord<'_>, &'static str> {
        self.view().check_record(id, verify)
    }

    fn value_of(&self, id: u32) -> Result<Value<'_>, Corruption> {
        self.view().value_of(id)
    }

    /// The value of `key`, read from the stored record and checksum-verified; a damaged record
    /// is reported, never returned.
    pub fn get(&self, key: &[u8]) -> Result<Option<Value<'_>>, Corruption> {
        let bytes = self.region.bytes();
        let geometry = self.geometry;
        let Some(id) = self.index.get(key, |r| record_key(bytes, &geometry, r)) else {
            return Ok(None);
        };
        self.value_of(id).map(Some)
    }

    /// Up to `limit` keys ≥ `start` in order, with their values (verified).
    pub fn scan(&self, start: &[u8], limit: usize) -> Result<Vec<(&[u8], Value<'_>)>, Corruption> {
        let bytes = self.region.bytes();
        let geometry = self.geometry;
        let mut out = Vec::new();
        for id in self
            .index
            .records_from(start, |r| record_key(bytes, &geometry, r))
            .take(limit)
        {
            let value = self.value_of(id)?;
            out.push((record_key(bytes, &geometry, id), value));
        }
        Ok(out)
    }

    /// Every key in order (no verification): for tests and tools.
    pub fn keys(&self) -> Vec<Vec<u8>> {
        let bytes = self.region.bytes();
        self.index
            .records()
            .map(|id| record_key(bytes, &self.geometry, id).to_vec())
            .collect()
    }

    /// The receive time recorded with the record holding `key` (0 if the store made it).
    pub fn receive_time_ns(&self, key: &[u8]) -> Option<u64> {
        let bytes = self.region.bytes();
        let id = self
            .index
            .get(key, |r| record_key(bytes, &self.geometry, r))?;
        self.meta(id).map(|meta| meta.receive_time_ns)
    }

    /// Verify the checksum of every indexed record (a scrub); returns what failed.
    pub fn verify_all(&self) -> Vec<Corruption> {
        self.index
            .records()
            .filter_map(|id| {
                self.check_record(id, true)
                    .err()
                    .map(|reason| Corruption { record: id, reason })
            })
            .collect()
    }

    // ----- the receive path (packet engine) -----

    /// Lend up to `want` free slots for receiving datagrams straight into them. A lent slot
    /// belongs to the caller until [`Store::stage_received`] turns it into a record or
    /// [`Store::release_slot`] gives it back; a slot holding a live record is never lent.
    /// Lends nothing for the conventional engine or when free slots run low (the reserve is
    /// kept for records the store writes itself).
    pub fn lend_receive_slots(&mut self, want: usize, out: &mut Vec<ReceiveSlot>) {
        out.clear();
        self.top_up_receive_slots(want, out);
    }

    /// Lend more free slots until `ring` holds `want` (a receive ring: slots stay lent across
    /// receive calls, and only those that received a datagram are replaced).
    pub fn top_up_receive_slots(&mut self, want: usize, ring: &mut Vec<ReceiveSlot>) {
        let out = ring;
        if self.geometry.engine != EngineKind::Packet {
            return;
        }
        let reserve = self.receive_reserve;
        while out.len() < want && self.free_slots.len() > reserve {
            let Some(slot) = self.free_slots.pop() else {
                break;
            };
            self.loans.lend(slot);
            out.push(self.receive_slot(slot));
        }
    }

    fn receive_slot(&self, slot: u32) -> ReceiveSlot {
        let id = self.geometry.slot_id(slot);
        ReceiveSlot {
            slot,
            offset: self.geometry.record_offset(id) + META_LEN,
            capacity: self.geometry.slot_datagram_capacity(),
        }
    }

    /// Record that `len` bytes were received into lent `slot` at `receive_time_ns`. Rejects
    /// (with a reason, keeping the slot lent) a slot not lent or a length that does not fit.
    pub fn on_slot_received(
        &mut self,
        slot: u32,
        len: usize,
        receive_time_ns: u64,
    ) -> Result<(), ReceiveReject> {
        let capacity = self.geometry.slot_datagram_capacity();
        let Some(loan) = self.loans.entry_mut(slot) else {
            return Err(ReceiveReject {
                reason: "slot_not_lent",
            });
        };
        if len > capacity || len < HEADER_LEN {
            self.stats.receive_rejects += 1;
            return Err(ReceiveReject {
                reason: if len < HEADER_LEN {
                    "truncated"
                } else {
                    "larger_than_slot"
                },
            });
        }
        *loan = (len as u32, receive_time_ns);
        Ok(())
    }

    /// Copy `datagram` into lent `slot` as a receive would (tests, the simulator, and regions
    /// the kernel cannot write into), then [`Store::on_slot_received`].
    pub fn write_received(
        &mut self,
        slot: u32,
        datagram: &[u8],
        receive_time_ns: u64,
    ) -> Result<(), ReceiveReject> {
        if !self.loans.is_lent(slot) {
            return Err(ReceiveReject {
                reason: "slot_not_lent",
            });
        }
        if datagram.len() > self.geometry.slot_datagram_capacity() {
            self.stats.receive_rejects += 1;
            return Err(ReceiveReject {
                reason: "larger_than_slot",
            });
        }
        let offset = self.receive_slot(slot).offset;
        self.region.write(offset, datagram);
        self.on_slot_received(slot, datagram.len(), receive_time_ns)
    }

    /// The datagram received into lent `slot`.
    pub fn received_datagram(&self, slot: u32) -> Option<&[u8]> {
        let (len, _) = self.loans.received(slot)?;
        let offset = self.receive_slot(slot).offset;
        self.region.bytes().get(offset..offset + len as usize)
    }

    /// The one full check of a received datagram (length, magic, version, CRC32C, type,
    /// fragment fields), for callers whose protocol layer does not check it already.
    pub fn check_received(&self, slot: u32) -> Result<pmnet_wire::Header, &'static str> {
        let datagram = self.received_datagram(slot).ok_or("nothing_received")?;
        pmnet_wire::Header::parse(datagram)
            .map(|(header, _)| header)
            .map_err(|error| error.reason())
    }

    /// The region, for the receiver to build iovecs into lent slots.
    pub(crate) fn region_for_receive(&mut self) -> &mut R {
        &mut self.region
    }

    /// The first `len` bytes of lent `slot`'s datagram area.
    pub(crate) fn slot_bytes(&self, slot: u32, len: usize) -> &[u8] {
        let area = self.receive_slot(slot);
        let len = len.min(area.capacity);
        self.region
            .bytes()
            .get(area.offset..area.offset + len)
            .unwrap_or(&[])
    }

    /// Give a lent slot back.
    pub fn release_slot(&mut self, slot: u32) {
        if self.loans.take(slot).is_some() {
            self.free_slots.push(slot);
        }
    }

    /// Slots lent and not yet returned.
    pub fn lent_slot_count(&self) -> usize {
        self.loans.count
    }

    /// Apply request `seq` of `session_id` whose datagrams (one per fragment, in order) were
    /// received into lent `slots` and **checked on receipt** (CRC included: the protocol layer
    /// or [`Store::check_received`] did it; this does not compute it again). A SET or DEL
    /// becomes a record in place; any other request is applied from a copy of its bytes and
    /// the slots go back. Durable at the next [`Store::commit`]; returns the reply.
    ///
    /// `Ok(Err(NoSpace))`: an INCR or APPEND received in slots found no room (see
    /// [`Store::stage_request`]); nothing of it was staged, and its slots went back to the free
    /// pool (they would not have been its record): retry it from its bytes. A SET or DEL
    /// received in place never gets it: its record is the slots it arrived in.
    ///
    /// On `Err` nothing was applied and the slots were released: apply the request from its
    /// bytes with [`Store::stage_request`].
    pub fn stage_received(
        &mut self,
        session_id: u64,
        seq: u32,
        slots: &[u32],
    ) -> Result<Result<Vec<u8>, NoSpace>, ReceiveReject> {
        self.start_timing();
        let outcome = self.inspect_received(session_id, seq, slots);
        let shape = match outcome {
            Ok(shape) => shape,
            Err(reason) => {
                for &slot in slots {
                    self.release_slot(slot);
                }
                self.stats.receive_rejects += 1;
                return Err(ReceiveReject { reason });
            }
        };
        let (op, key_range) = shape;
        if op != OP_SET && op != OP_DEL {
            // GET, INCR, APPEND and the rest: their record (if any) is not this packet.
            let mut request = std::mem::take(&mut self.scratch);
            request.clear();
            for &slot in slots {
                if let Some(datagram) = self.received_datagram(slot) {
                    request.extend_from_slice(&datagram[HEADER_LEN..]);
                }
            }
            for &slot in slots {
                self.release_slot(slot);
            }
            let reply = self.stage_request_inner(session_id, seq, &request);
            self.scratch = request;
            return Ok(reply);
        }
        // Its own slots hold it: no room to find.
        self.begin_op();
        // The slots become a chain: metadata of every fragment but the head now; the head's
        // once its place in the index is known.
        let epoch = self.batch_epoch();
        let mut head_meta = None;
        // Lengths of the fragments after the first (no allocation for one datagram).
        let mut tail_lens: Vec<u32> = Vec::new();
        for (index, &slot) in slots.iter().enumerate() {
            let (len, time) = self.loans.take(slot).unwrap_or((0, 0));
            if index > 0 {
                tail_lens.push(len);
            }
            let id = self.geometry.slot_id(slot);
            let next = slots
                .get(index + 1)
                .map(|next| self.geometry.slot_id(*next));
            let meta = Meta {
                next0: 0,
                frag_next: link_of(next),
                epoch,
                receive_time_ns: time,
                len,
                kind: RecordKind::Packet,
                order: 0,
                reply_style: ReplyStyle::Ok,
                self_id: id,
            };
            if index == 0 {
                head_meta = Some(meta);
            } else {
                self.region
                    .write(self.geometry.record_offset(id), &meta.encode());
            }
        }
        self.note_chain(slots);
        self.mark(Phase::Allocate);
        for (index, &slot) in slots.iter().enumerate() {
            let offset = self.receive_slot(slot).offset;
            let len = match index {
                0 => head_meta.map_or(0, |meta| meta.len as usize),
                _ => tail_lens[index - 1] as usize,
            };
            if index > 0 {
                self.region.flush(offset - META_LEN, META_LEN + len);
            }
        }
        self.stats.records_received_in_place += 1;
        self.mark(Phase::Persist);
        let head_id = self.geometry.slot_id(slots[0]);
        let head_meta = head_meta.expect("at least one slot");
        let pending = Pending {
            id: head_id,
            meta: head_meta,
            unflushed: head_meta.len,
        };
        let key = key_range;
        let reply = if op == OP_SET {
            self.link_record(session_id, seq, key, pending)
        } else {
            self.delete_with_record(session_id, seq, key, Some(pending))
        };
        Ok(Ok(reply))
    }

    /// Check lent `slots` hold request `seq` of `session_id`; returns its op and key location.
    fn inspect_received(
        &mut self,
        session_id: u64,
        seq: u32,
        slots: &[u32],
    ) -> Result<(u8, KeyAt<'static>), &'static str> {
        if self.geometry.engine != EngineKind::Packet {
            return Err("not_a_packet_store");
        }
        let single;
        let mut several = Vec::new();
        let datagrams: &[&[u8]] = if let [slot] = slots {
            single = [self.received_datagram(*slot).ok_or("slot_not_received")?];
            &single
        } else {
            for (index, &slot) in slots.iter().enumerate() {
                if slots[..index].contains(&slot) {
                    return Err("slot_given_twice");
                }
                several.push(self.received_datagram(slot).ok_or("slot_not_received")?);
            }
            &several
        };
        let shape = inspect_request(datagrams, false, PacketType::UpdateRequest)?;
        if shape.session_id != session_id || shape.seq != seq {
            return Err("slots_hold_another_request");
        }
        let key = KeyAt::Slot {
            slot: slots[0],
            offset: HEADER_LEN + 3,
            len: shape.key.len(),
        };
        let op = shape.op;
        self.mark(Phase::Prepare);
        Ok((op, key))
    }

    // ----- applying requests -----

    fn batch_epoch(&self) -> u64 {
        self.committed_epoch + 1
    }

    /// Before staging a request: make room in the batch.
    fn begin_op(&mut self) -> OpMark {
        if self.batch.ops.len() >= MAX_BATCH_OPS {
            // Committing early only makes earlier requests durable sooner.
            self.commit();
        }
        let mark = OpMark {
            epoch: self.committed_epoch,
            wrote: self.batch.wrote,
        };
        self.batch.wrote = true;
        self.stats.requests += 1;
        self.activity += 1;
        mark
    }

    /// A request begun at `mark` found no room before it staged anything: undo
    /// [`Store::begin_op`], so the store is as if it had never been asked.
    fn cancel_op(&mut self, mark: OpMark) {
        if self.committed_epoch == mark.epoch {
            self.batch.wrote = mark.wrote;
        }
        self.stats.requests -= 1;
        self.activity -= 1;
        self.stats.no_space += 1;
    }

    /// Make the records that batches freed reusable: records freed by a committed batch are
    /// free once a later batch commits, and this batch's once the one after it does. So at
    /// most two commits, empty or not (committing early only makes the requests staged so far
    /// durable sooner). False when nothing waits to be freed.
    fn reclaim(&mut self) -> bool {
        if self.limbo.is_empty() && self.batch.freed.is_empty() {
            return false;
        }
        for _ in 0..2 {
            if self.limbo.is_empty() && self.batch.freed.is_empty() {
                break;
            }
            // An empty batch commits too: its intent block supersedes the one that named
            // the freed records, and its first fence makes their unlinking durable.
            self.batch.wrote = true;
            self.commit();
            self.stats.reclaim_commits += 1;
        }
        true
    }

    /// Stage request `seq` of `session_id` from its bytes; durable at the next
    /// [`Store::commit`], whose caller may send the returned reply only after it returns.
    ///
    /// `Err(NoSpace)`: a SET, INCR or APPEND found no room, even after committing early to
    /// reuse what earlier batches freed. Nothing of it was staged (no record, no index or
    /// intent operation, no session change): the batch is as if it had never been asked, and
    /// the caller applies it again later with the same `seq`. A GET, a DEL or a request that
    /// fails to decode never gets it: a DEL may use the delete reserve
    /// ([`Store::delete_reserve_slots`]), and a GET whose long reply finds no room is answered
    /// `ERROR store full: reply not kept` (counted in [`StoreStats::store_full_replies`]).
    pub fn stage_request(
        &mut self,
        session_id: u64,
        seq: u32,
        request: &[u8],
    ) -> Result<Vec<u8>, NoSpace> {
        self.start_timing();
        self.stage_request_inner(session_id, seq, request)
    }

    fn stage_request_inner(
        &mut self,
        session_id: u64,
        seq: u32,
        request: &[u8],
    ) -> Result<Vec<u8>, NoSpace> {
        let mark = self.begin_op();
        let result = self.stage_decoded(session_id, seq, request);
        if result.is_err() {
            self.cancel_op(mark);
        }
        result
    }

    /// The request's effect; on `Err` nothing was staged (space is the first thing taken).
    fn stage_decoded(
        &mut self,
        session_id: u64,
        seq: u32,
        request: &[u8],
    ) -> Result<Vec<u8>, NoSpace> {
        let decoded = Request::decode(request);
        self.mark(Phase::Prepare);
        Ok(match decoded {
            Err(error) => self.table_commit(
                session_id,
                seq,
                error_reply(&format!("bad request: {error}")),
            ),
            Ok(Request::Set { key, value }) => {
                self.put(session_id, seq, key, value, ReplyStyle::Ok, Some(request))?
            }
            Ok(Request::Get { key }) => {
                let reply = match self.get(key) {
                    Ok(Some(value)) => {
                        let mut reply = Vec::with_capacity(5 + value.len());
                        reply.push(1);
                        reply.extend_from_slice(&(value.len() as u32).to_le_bytes());
                        for segment in &value.segments {
                            reply.extend_from_slice(segment);
                        }
                        reply
                    }
                    Ok(None) => Reply::NotFound.to_bytes(),
                    Err(corruption) => {
                        self.stats.read_verify_failures += 1;
                        error_reply(&format!("corrupt record: {}", corruption.reason))
                    }
                };
                self.table_commit(session_id, seq, reply)
            }
            Ok(Request::Del { key }) => self.delete_request(session_id, seq, key, request)?,
            Ok(Request::Incr { key, delta }) => {
                let current = match self.get(key) {
                    Ok(None) => Some(0),
                    Ok(Some(value)) => std::str::from_utf8(&value.to_vec())
                        .ok()
                        .and_then(|text| text.parse::<i64>().ok()),
                    Err(_) => None,
                };
                match current.map(|current| current.checked_add(delta)) {
                    Some(Some(new)) => {
                        let text = new.to_string().into_bytes();
                        self.put(session_id, seq, key, &text, ReplyStyle::Integer, None)?
                    }
                    Some(None) => self.table_commit(
                        session_id,
                        seq,
                        error_reply("increment or decrement would overflow"),
                    ),
                    None => {
                        self.table_commit(session_id, seq, error_reply("value is not an integer"))
                    }
                }
            }
            Ok(Request::Append { key, value }) => {
                let current = match self.get(key) {
                    Ok(Some(current)) => Ok(current.to_vec()),
                    Ok(None) => Ok(Vec::new()),
                    Err(corruption) => Err(corruption),
                };
                match current {
                    Ok(mut current) if current.len() + value.len() <= MAX_VALUE_LEN => {
                        current.extend_from_slice(value);
                        self.put(session_id, seq, key, &current, ReplyStyle::Ok, None)?
                    }
                    Ok(_) => self.table_commit(
                        session_id,
                        seq,
                        error_reply("append would make the value longer than 1048576 bytes"),
                    ),
                    Err(corruption) => self.table_commit(
                        session_id,
                        seq,
                        error_reply(&format!("corrupt record: {}", corruption.reason)),
                    ),
                }
            }
        })
    }

    /// Write a record for `key` = `value` and link it; `Err` (nothing staged) when there is
    /// no room for the record.
    fn put(
        &mut self,
        session_id: u64,
        seq: u32,
        key: &[u8],
        value: &[u8],
        style: ReplyStyle,
        encoded_set: Option<&[u8]>,
    ) -> Result<Vec<u8>, NoSpace> {
        let written = match self.geometry.engine {
            EngineKind::Packet => {
                let owned;
                let payload = match encoded_set {
                    Some(bytes) => bytes,
                    None => {
                        owned = Request::Set { key, value }.to_bytes();
                        &owned
                    }
                };
                self.write_packet_chain(
                    session_id,
                    seq,
                    PacketType::UpdateRequest,
                    payload,
                    RecordKind::Packet,
                    style,
                    Purpose::Data,
                )
            }
            EngineKind::Conventional => self.write_conventional(
                session_id,
                seq,
                CONVENTIONAL_OP_PUT,
                key,
                value,
                style,
                Purpose::Data,
            ),
        };
        // No room: the space is the first thing a write takes, so nothing is staged yet.
        let pending = written.ok_or(NoSpace)?;
        let key = KeyAt::External(key);
        Ok(self.link_record_key(session_id, seq, &key, pending))
    }

    fn link_record(
        &mut self,
        session_id: u64,
        seq: u32,
        key: KeyAt<'_>,
        pending: Pending,
    ) -> Vec<u8> {
        self.link_record_key(session_id, seq, &key, pending)
    }

    /// Link a written record into the index as the holder of its key; write its metadata.
    fn link_record_key(
        &mut self,
        session_id: u64,
        seq: u32,
        key: &KeyAt<'_>,
        pending: Pending,
    ) -> Vec<u8> {
        let geometry = self.geometry;
        let bytes = self.region.bytes();
        let key_bytes = key.resolve(bytes, &geometry);
        let upsert = self
            .index
            .upsert(key_bytes, pending.id, |r| record_key(bytes, &geometry, r));
        let mut meta = pending.meta;
        meta.next0 = link_of(upsert.successor);
        self.batch.ops.push(IntentOp::Link(pending.id));
        self.touch_session(session_id, seq, Source::Record(pending.id));
        if let Some(displaced) = upsert.displaced {
            self.retire_indexed(displaced);
        }
        self.mark(Phase::Insert);
        // The head's metadata line and its datagram, flushed last: the commit's fence waits
        // for them, and nothing in between stalls behind the write-backs.
        let offset = self.geometry.record_offset(pending.id);
        self.region.write(offset, &meta.encode());
        self.region
            .flush(offset, META_LEN + pending.unflushed as usize);
        self.mark(Phase::Persist);
        match meta.reply_style {
            ReplyStyle::Ok => Reply::Ok.to_bytes(),
            ReplyStyle::Integer => {
                let value = self
                    .value_of(pending.id)
                    .map(|v| v.to_vec())
                    .unwrap_or_default();
                let number = std::str::from_utf8(&value)
                    .ok()
                    .and_then(|t| t.parse::<i64>().ok())
                    .unwrap_or(0);
                Reply::Integer(number).to_bytes()
            }
        }
    }

    /// A DEL from its bytes. Its record may use the delete reserve, so it finds room however
    /// full the store is (see [`Store::delete_reserve_slots`]); `Err` would mean the reserve
    /// was not kept (nothing is staged then either).
    fn delete_request(
        &mut self,
        session_id: u64,
        seq: u32,
        key: &[u8],
        request: &[u8],
    ) -> Result<Vec<u8>, NoSpace> {
        if self.get_id(key).is_none() {
            return Ok(self.table_commit(session_id, seq, Reply::Deleted(0).to_bytes()));
        }
        // Recovery may have to redo the removal: it needs a record naming the key.
        let written = match self.geometry.engine {
            EngineKind::Packet => self.write_packet_chain(
                session_id,
                seq,
                PacketType::UpdateRequest,
                request,
                RecordKind::Packet,
                ReplyStyle::Ok,
                Purpose::Delete,
            ),
            EngineKind::Conventional => self.write_conventional(
                session_id,
                seq,
                CONVENTIONAL_OP_DELETE,
                key,
                &[],
                ReplyStyle::Ok,
                Purpose::Delete,
            ),
        };
        let Some(pending) = written else {
            debug_assert!(
                false,
                "a DEL found no room: the delete reserve was not kept"
            );
            return Err(NoSpace);
        };
        Ok(self.delete_with_record(session_id, seq, KeyAt::External(key), Some(pending)))
    }

    fn get_id(&self, key: &[u8]) -> Option<u32> {
        let bytes = self.region.bytes();
        self.index
            .get(key, |r| record_key(bytes, &self.geometry, r))
    }

    /// Remove the key the DEL record `pending` names.
    fn delete_with_record(
        &mut self,
        session_id: u64,
        seq: u32,
        key: KeyAt<'_>,
        pending: Option<Pending>,
    ) -> Vec<u8> {
        let geometry = self.geometry;
        let bytes = self.region.bytes();
        let key_bytes = key.resolve(bytes, &geometry);
        let present = self
            .index
            .get(key_bytes, |r| record_key(bytes, &geometry, r))
            .is_some();
        let Some(pending) = pending.filter(|_| present) else {
            if let Some(pending) = pending {
                self.free_unlinked(pending);
            }
            return self.table_commit(session_id, seq, Reply::Deleted(0).to_bytes());
        };
        let offset = self.geometry.record_offset(pending.id);
        self.region.write(offset, &pending.meta.encode());
        self.region
            .flush(offset, META_LEN + pending.unflushed as usize);
        let bytes = self.region.bytes();
        let key_bytes = key.resolve(bytes, &geometry);
        let removed = self
            .index
            .remove(key_bytes, |r| record_key(bytes, &geometry, r));
        self.batch.ops.push(IntentOp::Unlink(pending.id));
        let reply = self.table_commit(session_id, seq, Reply::Deleted(1).to_bytes());
        if let Some(removed) = removed {
            self.retire_indexed(removed);
        }
        // The DEL record is needed only until the next batch commits.
        self.batch.freed.push(pending.id);
        self.mark(Phase::Insert);
        reply
    }

    /// A record written for nothing (a DEL of a missing key received in place): free it at
    /// once, nothing references it.
    fn free_unlinked(&mut self, pending: Pending) {
        let offset = self.geometry.record_offset(pending.id);
        self.region.write(offset, &pending.meta.encode());
        self.batch.freed.push(pending.id);
    }

    /// `session_id` applied `seq`, now known from `source`.
    fn touch_session(&mut self, session_id: u64, seq: u32, source: Source) {
        let activity = self.activity;
        let state = self
            .sessions
            .get_or_insert_with(session_id, || SessionState {
                last_seq: 0,
                source: Source::Table,
                table: None,
                last_active: activity,
            });
        if let Source::Record(old) = state.source {
            self.session_sources.clear(old);
        }
        state.last_seq = seq;
        state.source = source;
        state.last_active = activity;
        let table = state.table;
        if let Source::Record(id) = source {
            self.session_sources.set(id);
        }
        if let Some(index) = table {
            self.note_table_activity(activity, index);
        }
    }

    /// The session whose last applied request record `id` is, if any.
    fn source_owner(&self, id: u32) -> Option<u64> {
        if !self.session_sources.get(id) {
            return None;
        }
        let is_source = |session_id: &u64| {
            self.sessions
                .get(*session_id)
                .is_some_and(|state| state.source == Source::Record(id))
        };
        // The record's header names its session; a damaged header falls back to a search.
        let named = self.check_record(id, false).ok().map(|r| r.session_id);
        named.filter(is_source).or_else(|| {
            self.sessions
                .iter()
                .find(|(_, state)| state.source == Source::Record(id))
                .map(|(session_id, _)| session_id)
        })
    }

    /// A record left the index: keep its session's sequence number if it was the only place
    /// holding it, then free the record after the next commit.
    fn retire_indexed(&mut self, id: u32) {
        if let Some(session_id) = self.source_owner(id) {
            self.session_sources.clear(id);
            let last_seq = self.sessions.get(session_id).map(|state| state.last_seq);
            if let Some(seq) = last_seq {
                let reply = self.derived_reply(id);
                self.stats.session_folds += 1;
                self.write_session_entry(session_id, seq, reply);
            }
        }
        self.batch.freed.push(id);
    }

    fn derived_reply(&self, id: u32) -> Vec<u8> {
        match self.meta(id).map(|meta| meta.reply_style) {
            Some(ReplyStyle::Integer) => {
                let value = self.value_of(id).map(|v| v.to_vec()).unwrap_or_default();
                let number = std::str::from_utf8(&value)
                    .ok()
                    .and_then(|t| t.parse::<i64>().ok())
                    .unwrap_or(0);
                Reply::Integer(number).to_bytes()
            }
            _ => Reply::Ok.to_bytes(),
        }
    }

    /// A request whose only durable effect is its session entry (GET, DEL of a missing key,
    /// errors): write the entry in this batch.
    fn table_commit(&mut self, session_id: u64, seq: u32, reply: Vec<u8>) -> Vec<u8> {
        let reply = self.write_session_entry(session_id, seq, reply);
        self.mark(Phase::Insert);
        reply
    }

    /// Write `session_id`'s entry (seq, reply) into the batch; returns the reply actually kept.
    /// Only a GET's reply can be too long to keep inline; when no room is left for it (data
    /// may not use the delete reserve), the GET is answered, and its session keeps, an ERROR
    /// saying so (a read changes nothing a device acknowledged), counted in
    /// [`StoreStats::store_full_replies`].
    fn write_session_entry(&mut self, session_id: u64, seq: u32, reply: Vec<u8>) -> Vec<u8> {
        let (entry_reply, reply) = if reply.len() <= INLINE_REPLY_CAPACITY {
            (EntryReply::Inline(reply.clone()), reply)
        } else {
            let written = match self.geometry.engine {
                EngineKind::Packet => self.write_packet_chain(
                    session_id,
                    seq,
                    PacketType::ServerAck,
                    &reply,
                    RecordKind::Reply,
                    ReplyStyle::Ok,
                    Purpose::Data,
                ),
                EngineKind::Conventional => self.write_reply_block(&reply),
            };
            match written {
                Some(pending) => {
                    let offset = self.geometry.record_offset(pending.id);
                    self.region.write(offset, &pending.meta.encode());
                    self.region
                        .flush(offset, META_LEN + pending.unflushed as usize);
                    (EntryReply::Record(pending.id), reply)
                }
                None => {
                    self.stats.store_full_replies += 1;
                    let error = error_reply("store full: reply not kept");
                    (EntryReply::Inline(error.clone()), error)
                }
            }
        };
        // After the reply record: finding room for it may have committed the batch so far.
        let epoch = self.batch_epoch();
        self.batch.wrote = true;
        let index = self.table_index_for(session_id);
        let slot = &mut self.table[index as usize];
        let copy = if slot.latest_epoch == epoch {
            slot.latest_copy
        } else {
            1 - slot.latest_copy
        };
        let superseded = slot.reply_record.take();
        slot.latest_copy = copy;
        slot.latest_epoch = epoch;
        slot.owner = Some(session_id);
        if let EntryReply::Record(id) = entry_reply {
            slot.reply_record = Some(id);
        }
        let entry = SessionEntry {
            session_id,
            epoch,
            last_seq: seq,
            reply: entry_reply,
        };
        let offset = self.geometry.session_entry_offset(index, copy);
        self.region.write(offset, &entry.encode());
        self.region.flush(offset, SESSION_ENTRY_LEN);
        if let Some(old) = superseded {
            self.batch.freed.push(old);
        }
        self.touch_session(session_id, seq, Source::Table);
        if let Some(state) = self.sessions.get_mut(session_id) {
            state.table = Some(index);
            let active = state.last_active;
            self.note_table_activity(active, index);
        }
        reply
    }

    /// Remember that table entry `index`'s owner was active at `active`.
    fn note_table_activity(&mut self, active: u64, index: u32) {
        if self.table_order.back() == Some(&(active, index)) {
            return;
        }
        self.table_order.push_back((active, index));
        if self.table_order.len() > 4 * self.table.len() + 1024 {
            self.rebuild_table_order();
        }
    }

    /// The order of the owned table entries, from scratch.
    fn rebuild_table_order(&mut self) {
        let mut order: Vec<(u64, u32)> = self
            .table
            .iter()
            .enumerate()
            .filter_map(|(index, slot)| {
                let owner = slot.owner?;
                let active = self.sessions.get(owner).map_or(0, |s| s.last_active);
                Some((active, index as u32))
            })
            .collect();
        order.sort_unstable();
        self.table_order = order.into();
    }

    /// The owned table entry idle longest and not written in batch `epoch`, with its owner:
    /// from the lazy order, or (should that hold nothing usable) a scan of the table.
    fn idlest_table_entry(&mut self, epoch: u64) -> Option<(u32, u64)> {
        for _ in 0..self.table_order.len() {
            let (active, index) = self.table_order.pop_front()?;
            let slot = &self.table[index as usize];
            let Some(owner) = slot.owner else {
                continue;
            };
            if self.sessions.get(owner).map_or(0, |s| s.last_active) != active {
                continue;
            }
            if slot.latest_epoch == epoch {
                self.table_order.push_back((active, index));
                continue;
            }
            return Some((index, owner));
        }
        self.table
            .iter()
            .enumerate()
            .filter(|(_, slot)| slot.latest_epoch != epoch)
            .filter_map(|(index, slot)| {
                let owner = slot.owner?;
                let active = self.sessions.get(owner).map_or(0, |s| s.last_active);
                Some((active, index as u32, owner))
            })
            .min()
            .map(|(_, index, owner)| (index, owner))
    }

    /// The session-table index of `session_id`, assigning one (evicting the least recently
    /// active session not written in this batch) if it has none.
    fn table_index_for(&mut self, session_id: u64) -> u32 {
        if let Some(index) = self.sessions.get(session_id).and_then(|s| s.table) {
            return index;
        }
        if let Some(index) = self.free_table.pop() {
            return index;
        }
        let epoch = self.batch_epoch();
        let (index, owner) = self
            .idlest_table_entry(epoch)
            .expect("max_sessions ≥ 2 × MAX_BATCH_OPS leaves a victim");
        if let Some(state) = self.sessions.get(owner) {
            if state.source == Source::Table {
                // Its exactly-once record goes: a retransmission of its last request would be
                // applied again. Counted; the protocol's own session limit is far larger.
                self.sessions.remove(owner);
                self.stats.sessions_evicted += 1;
            } else if let Some(state) = self.sessions.get_mut(owner) {
                state.table = None;
            }
        }
        index
    }

    /// Write a chain of datagrams carrying `payload` into free slots; the head's metadata is
    /// returned, the others' written. `None` (nothing taken or written) when the slots run
    /// out: data stops short of the delete reserve, a delete may use it.
    #[allow(clippy::too_many_arguments)]
    fn write_packet_chain(
        &mut self,
        session_id: u64,
        seq: u32,
        packet_type: PacketType,
        payload: &[u8],
        kind: RecordKind,
        style: ReplyStyle,
        purpose: Purpose,
    ) -> Option<Pending> {
        let capacity = self.geometry.slot_datagram_capacity() - HEADER_LEN;
        let count = payload.len().div_ceil(capacity).max(1);
        if count > usize::from(u16::MAX) || !self.room_for_slots(count, purpose) {
            return None;
        }
        // After finding room, which may have committed the batch so far.
        let epoch = self.batch_epoch();
        let mut ids = Vec::with_capacity(count);
        for _ in 0..count {
            ids.push(self.free_slots.pop()?);
        }
        self.note_chain(&ids);
        // Slots to the record ids they start.
        for id in &mut ids {
            *id = self.geometry.slot_id(*id);
        }
        self.mark(Phase::Allocate);
        let mut head = None;
        for (index, &id) in ids.iter().enumerate() {
            let chunk = &payload[(index * capacity).min(payload.len())
                ..((index + 1) * capacity).min(payload.len())];
            let header = synth_header(
                packet_type,
                session_id,
                seq,
                (index as u16, count as u16),
                chunk,
            );
            self.mark(Phase::Checksum);
            let offset = self.geometry.record_offset(id);
            self.region.write(offset + META_LEN, &header);
            self.region.write(offset + META_LEN + HEADER_LEN, chunk);
            self.mark(Phase::Copy);
            let meta = Meta {
                next0: 0,
                frag_next: link_of(ids.get(index + 1).copied()),
                epoch,
                receive_time_ns: 0,
                len: (HEADER_LEN + chunk.len()) as u32,
                kind,
                order: 0,
                reply_style: style,
                self_id: id,
            };
            if index == 0 {
                // Flushed with its metadata line once linked.
                head = Some(meta);
            } else {
                self.region.write(offset, &meta.encode());
                self.region
                    .flush(offset, META_LEN + HEADER_LEN + chunk.len());
            }
            self.mark(Phase::Persist);
        }
        self.stats.records_written += 1;
        let head = head?;
        Some(Pending {
            id: ids[0],
            meta: head,
            unflushed: head.len,
        })
    }

    /// The conventional write: allocate a block, build the record, checksum it, copy it in.
    /// `None` (nothing taken or written) when no block is free for it: data leaves the delete
    /// block alone, a delete may take it.
    #[allow(clippy::too_many_arguments)]
    fn write_conventional(
        &mut self,
        session_id: u64,
        seq: u32,
        op: u8,
        key: &[u8],
        value: &[u8],
        style: ReplyStyle,
        purpose: Purpose,
    ) -> Option<Pending> {
        let body_len = CONVENTIONAL_HEADER_LEN + key.len() + value.len();
        let (id, order) = self.alloc_block(order_for(META_LEN + body_len)?, purpose)?;
        self.mark(Phase::Allocate);
        let mut header = [0u8; CONVENTIONAL_HEADER_LEN];
        header[0..8].copy_from_slice(&session_id.to_le_bytes());
        header[8..12].copy_from_slice(&seq.to_le_bytes());
        header[12..14].copy_from_slice(&(key.len() as u16).to_le_bytes());
        header[14] = op;
        header[16..20].copy_from_slice(&(value.len() as u32).to_le_bytes());
        let mut crc = crc32c::crc32c(&header[0..20]);
        crc = crc32c::crc32c_append(crc, key);
        crc = crc32c::crc32c_append(crc, value);
        header[20..24].copy_from_slice(&crc.to_le_bytes());
        self.mark(Phase::Checksum);
        let offset = self.geometry.record_offset(id);
        let body = offset + META_LEN;
        self.region.write(body, &header);
        self.region.write(body + CONVENTIONAL_HEADER_LEN, key);
        self.region
            .write(body + CONVENTIONAL_HEADER_LEN + key.len(), value);
        self.mark(Phase::Copy);
        self.stats.records_written += 1;
        Some(Pending {
            id,
            unflushed: body_len as u32,
            meta: Meta {
                next0: 0,
                frag_next: 0,
                epoch: self.batch_epoch(),
                receive_time_ns: 0,
                len: body_len as u32,
                kind: RecordKind::Conventional,
                order,
                reply_style: style,
                self_id: id,
            },
        })
    }

    /// Conventional engine: a long reply in a block of its own: length, CRC32C, bytes.
    fn write_reply_block(&mut self, reply: &[u8]) -> Option<Pending> {
        let body_len = 8 + reply.len();
        let (id, order) = self.alloc_block(order_for(META_LEN + body_len)?, Purpose::Data)?;
        let offset = self.geometry.record_offset(id) + META_LEN;
        let mut header = [0u8; 8];
        header[0..4].copy_from_slice(&(reply.len() as u32).to_le_bytes());
        header[4..8].copy_from_slice(&crc32c::crc32c(reply).to_le_bytes());
        self.region.write(offset, &header);
        self.region.write(offset + 8, reply);
        self.region.flush(offset, body_len);
        self.stats.records_written += 1;
        Some(Pending {
            id,
            unflushed: 0,
            meta: Meta {
                next0: 0,
                frag_next: 0,
                epoch: self.batch_epoch(),
                receive_time_ns: 0,
                len: body_len as u32,
                kind: RecordKind::Reply,
                order,
                reply_style: ReplyStyle::Ok,
                self_id: id,
            },
        })
    }

    fn read_reply_record(&self, id: u32) -> Result<(Vec<u8>, Vec<u32>, u8), &'static str> {
        self.view().read_reply_record(id)
    }

    /// Packet engine: whether `count` free slots may be taken for `purpose`, reclaiming what
    /// earlier batches freed if they are short. True means the caller takes them and stages
    /// into the (possibly new) batch.
    fn room_for_slots(&mut self, count: usize, purpose: Purpose) -> bool {
        let floor = match purpose {
            Purpose::Data => self.delete_reserve,
            Purpose::Delete => 0,
        };
        let fits = |store: &Self| count + floor <= store.free_slots.len();
        let room = fits(self) || (self.reclaim() && fits(self));
        if room {
            self.batch.wrote = true;
        }
        room
    }

    /// Conventional engine: a block of at least `order` for `purpose`, with the order it was
    /// taken at; reclaims what earlier batches freed if none is free. Data first makes sure
    /// the delete block is held (and is refused if no block of its size is free); a delete
    /// takes the delete block, whole, when nothing else fits.
    fn alloc_block(&mut self, order: u8, purpose: Purpose) -> Option<(u32, u8)> {
        let taken = match self.take_block(order, purpose) {
            Some(taken) => taken,
            None if self.reclaim() => self.take_block(order, purpose)?,
            None => return None,
        };
        self.batch.wrote = true;
        Some(taken)
    }

    fn take_block(&mut self, order: u8, purpose: Purpose) -> Option<(u32, u8)> {
        let buddy = self.buddy.as_mut()?;
        match purpose {
            Purpose::Data => {
                if self.delete_block.is_none() {
                    self.delete_block = Some(buddy.alloc(self.delete_block_order)?);
                }
                buddy.alloc(order).map(|id| (id, order))
            }
            Purpose::Delete => buddy.alloc(order).map(|id| (id, order)).or_else(|| {
                // The record names the block's whole order, so freeing it frees all of it.
                let reserve_order = self.delete_block_order;
                if order > reserve_order {
                    return None;
                }
                self.delete_block.take().map(|id| (id, reserve_order))
            }),
        }
    }

    /// Make everything staged since the last commit durable (see the module doc). Replies
    /// of staged requests may be sent once this returns.
    pub fn commit(&mut self) {
        if !self.batch.wrote {
            return;
        }
        let epoch = self.batch_epoch();
        let mut intent = std::mem::take(&mut self.scratch);
        encode_intent(epoch, &self.batch.ops, &mut intent);
        let offset = intent_offset(epoch);
        self.region.write(offset, &intent);
        self.region.flush(offset, intent.len());
        self.scratch = intent;
        self.region.fence();
        self.region.write(COMMIT_OFFSET, &epoch.to_le_bytes());
        self.region.persist(COMMIT_OFFSET, 8);
        self.stats.fences += 2;
        self.committed_epoch = epoch;
        // The breakdown charges each part of the commit to its phase: collecting the changed
        // links is index work, returning buffers is the allocator's.
        self.mark(Phase::Persist);
        // Level-0 links: durable by the next batch's first fence, redone until then.
        let mut links = std::mem::take(&mut self.links);
        self.index.take_dirty(&mut links);
        self.mark(Phase::Insert);
        for link in &links {
            let at = match link.from {
                None => HEAD_OFFSET,
                Some(id) => self.geometry.record_offset(id) + META_NEXT0,
            };
            self.region.write(at, &link_of(link.to).to_le_bytes());
            self.region.flush(at, 4);
        }
        self.links = links;
        self.mark(Phase::Persist);
        // Records freed by earlier batches are reusable now; this batch's after the next.
        let mut index = 0;
        while index < self.limbo.len() {
            if self.limbo[index].0 < epoch {
                let (_, id) = self.limbo.swap_remove(index);
                self.free_record(id);
            } else {
                index += 1;
            }
        }
        for id in self.batch.freed.drain(..) {
            self.limbo.push((epoch, id));
        }
        self.batch.ops.clear();
        self.batch.wrote = false;
        self.stats.batches += 1;
        self.mark(Phase::Allocate);
    }

    /// Packet engine: remember that `slots` hold one record's chain, in this order.
    fn note_chain(&mut self, slots: &[u32]) {
        if let [slot] = slots {
            // One datagram: a bit, and `chain_next` stays unknown.
            self.one_datagram.set(self.geometry.slot_id(*slot));
            return;
        }
        for (index, &slot) in slots.iter().enumerate() {
            let next = slots
                .get(index + 1)
                .map_or(CHAIN_END, |&next| self.geometry.slot_id(next));
            if let Some(entry) = self.chain_next.get_mut(slot as usize) {
                *entry = next;
            }
        }
    }

    /// Return record `id`'s space (all of its chain) to the allocator.
    fn free_record(&mut self, id: u32) {
        self.stats.records_freed += 1;
        match self.geometry.engine {
            EngineKind::Packet => {
                if self.one_datagram.get(id) {
                    self.one_datagram.clear(id);
                    if let Some(slot) = self.geometry.slot_of(id) {
                        self.free_slots.push(slot);
                    }
                    return;
                }
                let mut next = Some(id);
                let mut guard = 0usize;
                while let Some(id) = next {
                    guard += 1;
                    let Some(slot) = self.geometry.slot_of(id) else {
                        break;
                    };
                    if guard > self.geometry.slot_count as usize {
                        break;
                    }
                    let known =
                        std::mem::replace(&mut self.chain_next[slot as usize], CHAIN_UNKNOWN);
                    next = match known {
                        CHAIN_END => None,
                        CHAIN_UNKNOWN => self.meta(id).and_then(|meta| {
                            (meta.self_id == id)
                                .then_some(meta.frag_next)
                                .and_then(id_of_link)
                        }),
                        next => Some(next),
                    };
                    self.free_slots.push(slot);
                }
            }
            EngineKind::Conventional => {
                if let (Some(meta), Some(buddy)) = (self.meta(id), self.buddy.as_mut()) {
                    if meta.self_id == id {
                        buddy.free(id, meta.order);
                    }
                }
            }
        }
    }

    // ----- recovery -----

    fn recover(&mut self) -> Result<(), StoreError> {
        let committed = self.committed_epoch;
        let granules = self.geometry.granule_count() as usize;
        // Allocated space: slots (packet) or (id, order) blocks (conventional).
        let mut allocated: Vec<(u32, u8)> = Vec::new();
        let mut builder = Builder::default();
        let mut record_sessions: HashMap<u64, (u32, u32)> = HashMap::new();
        let mut corrupt = Vec::new();
        let mut broken = None;
        let mut verified_bytes = 0u64;
        let view = View {
            bytes: self.region.bytes(),
            geometry: self.geometry,
            committed_epoch: committed,
        };
        {
            let bytes = view.bytes;
            let geometry = self.geometry;
            let mut link = u32_at(bytes, HEAD_OFFSET);
            let mut previous_key: Option<&[u8]> = None;
            let mut steps = 0usize;
            while let Some(id) = id_of_link(link) {
                steps += 1;
                if steps > granules {
                    broken = Some("the level-0 list loops".to_owned());
                    builder.mark_tail_dirty(&mut self.index);
                    break;
                }
                // A record whose metadata names itself can be stepped over; one whose
                // metadata does not cannot be followed.
                let meta = if view.id_in_range(id) {
                    view.meta(id).filter(|meta| meta.self_id == id)
                } else {
                    None
                };
                let Some(meta) = meta else {
                    broken = Some(format!(
                        "link to record {id} leads to damaged metadata; keys after it are lost"
                    ));
                    builder.mark_tail_dirty(&mut self.index);
                    break;
                };
                match view.check_record(id, true) {
                    Ok(checked) if checked.op == OP_SET => {
                        if previous_key.is_some_and(|previous| previous >= checked.key) {
                            broken = Some(format!(
                                "record {id} is out of key order; keys after it are lost"
                            ));
                            builder.mark_tail_dirty(&mut self.index);
                            break;
                        }
                        previous_key = Some(record_key(bytes, &geometry, id));
                        builder.push(&mut self.index, checked.key, id);
                        verified_bytes += checked.bytes;
                        for member in &checked.ids {
                            allocated.push((*member, checked.order));
                        }
                        let entry = record_sessions
                            .entry(checked.session_id)
                            .or_insert((checked.seq, id));
                        if checked.seq > entry.0 {
                            *entry = (checked.seq, id);
                        }
                    }
                    Ok(_) => {
                        corrupt.push(Corruption {
                            record: id,
                            reason: "not_a_set_record_in_index",
                        });
                        builder.mark_tail_dirty(&mut self.index);
                    }
                    Err(reason) => {
                        corrupt.push(Corruption { record: id, reason });
                        builder.mark_tail_dirty(&mut self.index);
                    }
                }
                link = meta.next0;
            }
        }

        // Redo the last committed batch's index operations (idempotent).
        let intent_at = intent_offset(committed);
        let ops = decode_intent(
            &view.bytes[intent_at..intent_at + INTENT_BLOCK_LEN],
            committed,
        )
        .map_err(|error| {
            StoreError::Layout(format!(
                "cannot redo the last committed batch (epoch {committed}): {error}"
            ))
        })?;
        self.recovery.redone_ops = ops.len();
        for op in ops {
            let id = op.record();
            let checked = match view.check_record(id, true) {
                Ok(checked) => checked,
                Err(reason) => {
                    corrupt.push(Corruption { record: id, reason });
                    continue;
                }
            };
            for member in &checked.ids {
                allocated.push((*member, checked.order));
            }
            if matches!(op, IntentOp::Unlink(_)) {
                // A DEL record is needed only until the next batch commits. A linked record
                // stays live unless a later operation of the batch displaces it (below).
                self.limbo.push((committed, id));
            }
            let geometry = self.geometry;
            let bytes = view.bytes;
            let key = checked.key;
            let displaced = match (op, checked.op) {
                (IntentOp::Link(_), OP_SET) => {
                    let entry = record_sessions
                        .entry(checked.session_id)
                        .or_insert((checked.seq, id));
                    if checked.seq >= entry.0 {
                        *entry = (checked.seq, id);
                    }
                    let upsert = self
                        .index
                        .upsert(key, id, |r| record_key(bytes, &geometry, r));
                    // The record's own link was written for the list as it was when the batch
                    // was staged; the recovered list may differ, so it is rewritten.
                    self.index.mark_dirty(upsert.node);
                    upsert.displaced
                }
                (IntentOp::Unlink(_), OP_DEL) => {
                    self.index.remove(key, |r| record_key(bytes, &geometry, r))
                }
                _ => {
                    corrupt.push(Corruption {
                        record: id,
                        reason: "intent names a record of the wrong kind",
                    });
                    None
                }
            };
            if let Some(displaced) = displaced.filter(|d| *d != id) {
                self.limbo.push((committed, displaced));
            }
        }
        // Redo replays the batch from a state where some of its links were already durable,
        // so a record can be displaced and linked again: only what is not live is freed.
        let live: std::collections::HashSet<u32> = self.index.records().collect();
        self.limbo.retain(|(_, id)| !live.contains(id));

        // The session table.
        let mut table_sessions: HashMap<u64, (u32, u64, u32)> = HashMap::new();
        // Copies written by a batch that never committed carry a later epoch: left alone they
        // would turn valid once the epoch counter reaches theirs. Unmark them.
        let mut uncommitted_copies = Vec::new();
        for index in 0..self.geometry.max_sessions {
            let mut best: Option<(SessionEntry, u8)> = None;
            for copy in 0..2u8 {
                let offset = self.geometry.session_entry_offset(index, copy);
                let raw = &self.region.bytes()[offset..offset + SESSION_ENTRY_LEN];
                match SessionEntry::decode(raw) {
                    Some(entry) if entry.epoch <= committed => {
                        if best.as_ref().is_none_or(|(b, _)| entry.epoch > b.epoch) {
                            best = Some((entry, copy));
                        }
                    }
                    Some(_) => uncommitted_copies.push(offset),
                    None => {
                        if raw[20] != 0 {
                            self.recovery.rejected_session_copies += 1;
                        }
                    }
                }
            }
            let slot = &mut self.table[index as usize];
            slot.latest_copy = 1;
            let Some((entry, copy)) = best else {
                continue;
            };
            slot.latest_copy = copy;
            slot.latest_epoch = entry.epoch;
            if let Some((_, epoch, other)) = table_sessions.get(&entry.session_id) {
                if *epoch >= entry.epoch {
                    let _ = other;
                    continue;
                }
                let other = *other;
                self.table[other as usize].owner = None;
                self.table[other as usize].reply_record = None;
            }
            let slot = &mut self.table[index as usize];
            slot.owner = Some(entry.session_id);
            if let EntryReply::Record(id) = entry.reply {
                slot.reply_record = Some(id);
            }
            table_sessions.insert(entry.session_id, (entry.last_seq, entry.epoch, index));
        }
        for index in 0..self.geometry.max_sessions {
            let Some(id) = self.table[index as usize].reply_record else {
                continue;
            };
            match self.read_reply_record(id) {
                Ok((_, ids, order)) => {
                    for member in ids {
                        allocated.push((member, order));
                    }
                }
                Err(reason) => {
                    corrupt.push(Corruption { record: id, reason });
                    self.table[index as usize].reply_record = None;
                }
            }
        }
        for (index, slot) in self.table.iter().enumerate() {
            if slot.owner.is_none() {
                self.free_table.push(index as u32);
            }
        }
        self.free_table.reverse();

        // Sessions: the later of what the records and the table say.
        for (session_id, (seq, id)) in record_sessions {
            self.sessions.insert(
                session_id,
                SessionState {
                    last_seq: seq,
                    source: Source::Record(id),
                    table: None,
                    last_active: 0,
                },
            );
        }
        for (session_id, (seq, _, index)) in table_sessions {
            let state = self
                .sessions
                .get_or_insert_with(session_id, || SessionState {
                    last_seq: seq,
                    source: Source::Table,
                    table: None,
                    last_active: 0,
                });
            state.table = Some(index);
            if seq >= state.last_seq {
                state.last_seq = seq;
                state.source = Source::Table;
            }
        }
        self.rebuild_table_order();
        // A record-derived session whose record the redo displaced: the batch that displaced
        // it wrote the session entry, so the table holds the seq (or a later one).
        let indexed: std::collections::HashSet<u32> = self.index.records().collect();
        let limbo_ids: std::collections::HashSet<u32> =
            self.limbo.iter().map(|(_, id)| *id).collect();
        for state in self.sessions.values_mut() {
            if let Source::Record(id) = state.source {
                if !indexed.contains(&id) && limbo_ids.contains(&id) && state.table.is_some() {
                    state.source = Source::Table;
                }
            }
        }

        for state in self.sessions.values() {
            if let Source::Record(id) = state.source {
                self.session_sources.set(id);
            }
        }

        // Free space.
        match self.geometry.engine {
            EngineKind::Packet => {
                let mut used = vec![false; self.geometry.slot_count as usize];
                for (id, _) in &allocated {
                    if let Some(slot) = self.geometry.slot_of(*id) {
                        used[slot as usize] = true;
                    }
                }
                self.free_slots = (0..self.geometry.slot_count)
                    .rev()
                    .filter(|slot| !used[*slot as usize])
                    .collect();
                // The longest DEL, once per request of a batch, at most 1/64 of the slots.
                let longest_delete =
                    (3 + MAX_KEY_LEN).div_ceil(self.geometry.slot_datagram_capacity() - HEADER_LEN);
                let deletes = (self.geometry.slot_count as usize / 64).clamp(1, MAX_BATCH_OPS);
                self.delete_reserve = longest_delete * deletes;
                // Loans stop above the delete reserve: a received SET must not take it.
                self.receive_reserve = (self.geometry.slot_count as usize / 16)
                    .max(4)
                    .max(self.delete_reserve);
            }
            EngineKind::Conventional => {
                let mut buddy = Buddy::new(self.geometry.granule_count());
                allocated.sort_unstable();
                allocated.dedup();
                for (id, order) in &allocated {
                    if !buddy.reserve(*id, *order) {
                        corrupt.push(Corruption {
                            record: *id,
                            reason: "overlaps another live block",
                        });
                    }
                }
                // A block for the longest DEL record (no larger than the heap), held for
                // deletes; if none is free now, data is refused until one is.
                let longest_delete = order_for(META_LEN + CONVENTIONAL_HEADER_LEN + MAX_KEY_LEN)
                    .expect("a DEL record fits the largest block");
                let largest_block = (31 - self.geometry.granule_count().leading_zeros()) as u8;
                self.delete_block_order = longest_delete
                    .min(largest_block)
                    .min(crate::buddy::MAX_ORDER);
                self.delete_block = buddy.alloc(self.delete_block_order);
                self.buddy = Some(buddy);
            }
        }
        self.limbo.sort_unstable();
        self.limbo.dedup();

        for offset in &uncommitted_copies {
            self.region.write(offset + 20, &[0]);
            self.region.flush(offset + 20, 1);
        }
        // Write what redo and repair changed, and make it durable before anything new.
        let mut links = std::mem::take(&mut self.links);
        self.index.take_dirty(&mut links);
        for link in &links {
            let at = match link.from {
                None => HEAD_OFFSET,
                Some(id) => self.geometry.record_offset(id) + META_NEXT0,
            };
            self.region.write(at, &link_of(link.to).to_le_bytes());
            self.region.flush(at, 4);
        }
        if !links.is_empty() || !uncommitted_copies.is_empty() {
            self.region.fence();
        }
        self.links = links;
        self.recovery.key_count = self.index.len();
        self.recovery.session_count = self.sessions.len();
        self.recovery.corrupt_records = corrupt;
        self.recovery.index_broken = broken;
        self.recovery.verified_bytes = verified_bytes;
        Ok(())
    }

    /// The reply kept for a session whose last request the table holds.
    fn table_reply(&self, index: u32) -> Vec<u8> {
        let slot = &self.table[index as usize];
        let offset = self.geometry.session_entry_offset(index, slot.latest_copy);
        let raw = &self.region.bytes()[offset..offset + SESSION_ENTRY_LEN];
        match SessionEntry::decode(raw).map(|entry| entry.reply) {
            Some(EntryReply::Inline(reply)) => reply,
            Some(EntryReply::Record(id)) => self
                .read_reply_record(id)
                .map(|(reply, _, _)| reply)
                .unwrap_or_default(),
            None => Vec::new(),
        }
    }
}

/// Read access to the records of a region: what recovery, reads and checks share.
#[derive(Clone, Copy)]
struct View<'a> {
    bytes: &'a [u8],
    geometry: Geometry,
    /// Records of later epochs are not (yet) part of the store.
    committed_epoch: u64,
}

impl<'a> View<'a> {
    fn meta(&self, id: u32) -> Option<Meta> {
        let offset = self.geometry.record_offset(id);
        Meta::decode(self.bytes.get(offset..offset + META_LEN)?)
    }

    fn id_in_range(&self, id: u32) -> bool {
        match self.geometry.engine {
            EngineKind::Packet => self.geometry.slot_of(id).is_some(),
            EngineKind::Conventional => id < self.geometry.granule_count(),
        }
    }

    /// The datagram stored in slot record `id`, by its metadata length.
    fn datagram(&self, id: u32, meta: &Meta) -> Option<&'a [u8]> {
        if meta.len as usize > self.geometry.slot_datagram_capacity() {
            return None;
        }
        let start = self.geometry.record_offset(id) + META_LEN;
        self.bytes.get(start..start + meta.len as usize)
    }

    /// The record ids of a packet chain, head first, with the datagrams; checks the metadata
    /// (own id, kind, epoch) of every member.
    fn packet_chain(
        &self,
        head: u32,
        kind: RecordKind,
    ) -> Result<Vec<(u32, &'a [u8])>, &'static str> {
        let mut chain = Vec::new();
        let mut id = head;
        loop {
            if !self.id_in_range(id) {
                return Err("link_out_of_range");
            }
            let meta = self.meta(id).ok_or("bad_metadata")?;
            if meta.self_id != id || meta.kind != kind {
                return Err("misplaced_record");
            }
            if meta.epoch > self.committed_epoch {
                return Err("uncommitted_record");
            }
            let datagram = self.datagram(id, &meta).ok_or("bad_length")?;
            chain.push((id, datagram));
            if chain.len() > usize::from(u16::MAX) {
                return Err("chain_too_long");
            }
            match id_of_link(meta.frag_next) {
                Some(next) => id = next,
                None => return Ok(chain),
            }
        }
    }

    /// Check record `id` as the index would hold it: its chain, its structure and (with
    /// `verify`) its checksums. Returns its key, session, seq and the ids it occupies.
    fn check_record(&self, id: u32, verify: bool) -> Result<CheckedRecord<'a>, &'static str> {
        match self.geometry.engine {
            EngineKind::Packet => {
                let chain = self.packet_chain(id, RecordKind::Packet)?;
                let datagrams: Vec<&[u8]> = chain.iter().map(|(_, d)| *d).collect();
                let shape = inspect_request(&datagrams, verify, PacketType::UpdateRequest)?;
                if shape.op != OP_SET && shape.op != OP_DEL {
                    return Err("not_a_set_or_del_request");
                }
                Ok(CheckedRecord {
                    key: shape.key,
                    session_id: shape.session_id,
                    seq: shape.seq,
                    op: shape.op,
                    ids: chain.iter().map(|(id, _)| *id).collect(),
                    order: 0,
                    bytes: datagrams.iter().map(|d| d.len() as u64).sum(),
                })
            }
            EngineKind::Conventional => {
                if !self.id_in_range(id) {
                    return Err("link_out_of_range");
                }
                let meta = self.meta(id).ok_or("bad_metadata")?;
                if meta.self_id != id || meta.kind != RecordKind::Conventional {
                    return Err("misplaced_record");
                }
                if meta.epoch > self.committed_epoch {
                    return Err("uncommitted_record");
                }
                let body = self.conventional_body(id, &meta)?;
                let key_len = usize::from(u16_at(body, 12));
                let value_len = u32_at(body, 16) as usize;
                let op = body[14];
                if key_len == 0
                    || key_len > MAX_KEY_LEN
                    || CONVENTIONAL_HEADER_LEN + key_len + value_len != body.len()
                    || (op != CONVENTIONAL_OP_PUT && op != CONVENTIONAL_OP_DELETE)
                {
                    return Err("bad_structure");
                }
                if verify {
                    let crc = crc32c::crc32c_append(
                        crc32c::crc32c(&body[0..20]),
                        &body[CONVENTIONAL_HEADER_LEN..],
                    );
                    if crc != u32_at(body, 20) {
                        return Err("bad_checksum");
                    }
                }
                Ok(CheckedRecord {
                    key: &body[CONVENTIONAL_HEADER_LEN..CONVENTIONAL_HEADER_LEN + key_len],
                    session_id: u64_at(body, 0),
                    seq: u32_at(body, 8),
                    op: if op == CONVENTIONAL_OP_PUT {
                        OP_SET
                    } else {
                        OP_DEL
                    },
                    ids: vec![id],
                    order: meta.order,
                    bytes: body.len() as u64,
                })
            }
        }
    }

    fn conventional_body(&self, id: u32, meta: &Meta) -> Result<&'a [u8], &'static str> {
        if meta.order > crate::buddy::MAX_ORDER {
            return Err("bad_length");
        }
        let block_len = GRANULE << meta.order;
        if META_LEN + meta.len as usize > block_len
            || (meta.len as usize) < CONVENTIONAL_HEADER_LEN
            || id % (1 << meta.order) != 0
        {
            return Err("bad_length");
        }
        let start = self.geometry.record_offset(id) + META_LEN;
        self.bytes
            .get(start..start + meta.len as usize)
            .ok_or("bad_length")
    }

    /// The value of indexed record `id`, checksums verified.
    fn value_of(&self, id: u32) -> Result<Value<'a>, Corruption> {
        let corrupt = |reason| Corruption { record: id, reason };
        match self.geometry.engine {
            EngineKind::Packet => {
                let chain = self.packet_chain(id, RecordKind::Packet).map_err(corrupt)?;
                let datagrams: Vec<&[u8]> = chain.iter().map(|(_, d)| *d).collect();
                let shape = inspect_request(&datagrams, true, PacketType::UpdateRequest)
                    .map_err(corrupt)?;
                if shape.op != OP_SET {
                    return Err(corrupt("not_a_set_request"));
                }
                let mut segments = Vec::with_capacity(datagrams.len());
                let value_start = HEADER_LEN + 7 + shape.key.len();
                segments.push(&datagrams[0][value_start..]);
                for datagram in &datagrams[1..] {
                    segments.push(&datagram[HEADER_LEN..]);
                }
                Ok(Value { segments })
            }
            EngineKind::Conventional => {
                let checked = self.check_record(id, true).map_err(corrupt)?;
                let meta = self.meta(id).ok_or(corrupt("bad_metadata"))?;
                let body = self.conventional_body(id, &meta).map_err(corrupt)?;
                let start = CONVENTIONAL_HEADER_LEN + checked.key.len();
                Ok(Value {
                    segments: vec![&body[start..]],
                })
            }
        }
    }

    /// The bytes of reply record `id`, verified; with the ids it occupies and its order.
    fn read_reply_record(&self, id: u32) -> Result<(Vec<u8>, Vec<u32>, u8), &'static str> {
        match self.geometry.engine {
            EngineKind::Packet => {
                let chain = self.packet_chain(id, RecordKind::Reply)?;
                let datagrams: Vec<&[u8]> = chain.iter().map(|(_, d)| *d).collect();
                inspect_request(&datagrams, true, PacketType::ServerAck)?;
                let mut reply = Vec::new();
                for datagram in &datagrams {
                    reply.extend_from_slice(&datagram[HEADER_LEN..]);
                }
                Ok((reply, chain.iter().map(|(id, _)| *id).collect(), 0))
            }
            EngineKind::Conventional => {
                if !self.id_in_range(id) {
                    return Err("link_out_of_range");
                }
                let meta = self.meta(id).ok_or("bad_metadata")?;
                if meta.self_id != id || meta.kind != RecordKind::Reply {
                    return Err("misplaced_record");
                }
                let body = self.conventional_reply_body(id, &meta)?;
                let len = u32_at(body, 0) as usize;
                if 8 + len != body.len() {
                    return Err("bad_length");
                }
                if crc32c::crc32c(&body[8..]) != u32_at(body, 4) {
                    return Err("bad_checksum");
                }
                Ok((body[8..].to_vec(), vec![id], meta.order))
            }
        }
    }

    fn conventional_reply_body(&self, id: u32, meta: &Meta) -> Result<&'a [u8], &'static str> {
        let block_len = GRANULE << meta.order.min(crate::buddy::MAX_ORDER);
        if meta.order > crate::buddy::MAX_ORDER
            || META_LEN + meta.len as usize > block_len
            || (meta.len as usize) < 8
        {
            return Err("bad_length");
        }
        let start = self.geometry.record_offset(id) + META_LEN;
        self.bytes
            .get(start..start + meta.len as usize)
            .ok_or("bad_length")
    }
}

/// What [`View::check_record`] found.
#[derive(Debug)]
struct CheckedRecord<'a> {
    key: &'a [u8],
    session_id: u64,
    seq: u32,
    op: u8,
    ids: Vec<u32>,
    order: u8,
    bytes: u64,
}

/// Where a key is: in a received slot (resolved against the region when needed, so no borrow
/// of the region is held across writes) or in the caller's request bytes.
#[derive(Debug, Clone, Copy)]
enum KeyAt<'k> {
    Slot {
        slot: u32,
        offset: usize,
        len: usize,
    },
    External(&'k [u8]),
}

impl<'k> KeyAt<'k> {
    fn resolve<'a>(&self, bytes: &'a [u8], geometry: &Geometry) -> &'a [u8]
    where
        'k: 'a,
    {
        match *self {
            KeyAt::Slot { slot, offset, len } => {
                let start = geometry.record_offset(geometry.slot_id(slot)) + META_LEN + offset;
                bytes.get(start..start + len).unwrap_or(&[])
            }
            KeyAt::External(key) => key,
        }
    }
}

/// The key of indexed record `id` (validated when it was indexed; empty if the bytes are out
/// of range, which never panics).
pub(crate) fn record_key<'a>(bytes: &'a [u8], geometry: &Geometry, id: u32) -> &'a [u8] {
    let start = geometry.record_offset(id) + META_LEN;
    let read = || -> Option<&'a [u8]> {
        match geometry.engine {
            EngineKind::Packet => {
                let payload = start + HEADER_LEN;
                let len_bytes = bytes.get(payload + 1..payload + 3)?;
                let len = usize::from(u16::from_le_bytes([len_bytes[0], len_bytes[1]]));
                bytes.get(payload + 3..payload + 3 + len)
            }
            EngineKind::Conventional => {
                let len_bytes = bytes.get(start + 12..start + 14)?;
                let len = usize::from(u16::from_le_bytes([len_bytes[0], len_bytes[1]]));
                let key = start + CONVENTIONAL_HEADER_LEN;
                bytes.get(key..key + len)
            }
        }
    };
    read().unwrap_or(&[])
}

impl<R: PmRegion> Application for Store<R> {
    /// [`Store::stage_request`] and [`Store::commit`]: `Err(NoSpace)` for a SET, INCR or APPEND
    /// with no room, never for anything else.
    fn apply(&mut self, session_id: u64, seq: u32, request: &[u8]) -> Result<Vec<u8>, NoSpace> {
        let reply = self.stage_request(session_id, seq, request);
        self.commit();
        reply
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

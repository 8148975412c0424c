//! The persistent layout of a store: byte offsets, field encodings, validation.
//!
//! All integers on persistent memory are little-endian and fixed-width. The PMNet datagrams kept
//! in packet-store records are stored exactly as received, so their headers stay big-endian
//! (network order), as `docs/protocol.md` specifies them.
//!
//! ```text
//! 0       superblock (4096 B): config line (64 B, CRC32C), growth word at 64, commit word at
//!         128, list head at 192
//! 4096    two intent blocks (batch redo lists), used by epoch parity
//! 8192    session table: max_sessions × 2 copies × 128 B
//! data    record area: packet slots (engine packet) or a buddy heap (engine conventional)
//! ```

use pmnet_pm::CACHE_LINE_SIZE;

/// Bytes 0..8 of a store.
pub const MAGIC: [u8; 8] = *b"PMNETPKT";
pub const LAYOUT_VERSION: u32 = 1;

pub const SUPERBLOCK_LEN: usize = 4096;
/// The data area's length once the store grew (see [`Geometry::grow`]): one aligned 8-byte
/// store — its length in granules (u32) and their CRC32C salted with [`GROWTH_SALT`] (u32) —
/// so a crash leaves the old length or the new one, never a torn one. All zero (never grown):
/// the config line's length.
pub const GROWTH_OFFSET: usize = 64;
const GROWTH_SALT: &[u8; 8] = b"PMNETGRW";
/// The committed epoch: one aligned 8-byte store, the commit point of every batch.
pub const COMMIT_OFFSET: usize = 128;
/// The list head's level-0 link: one aligned 4-byte store.
pub const HEAD_OFFSET: usize = 192;

/// Operations of one batch at most (each names at most one record to redo).
pub const MAX_BATCH_OPS: usize = 64;
pub const INTENT_OFFSET: usize = SUPERBLOCK_LEN;
pub const INTENT_HEADER_LEN: usize = 64;
pub const INTENT_ENTRY_LEN: usize = 8;
pub const INTENT_BLOCK_LEN: usize = INTENT_HEADER_LEN + INTENT_ENTRY_LEN * MAX_BATCH_OPS;
pub const SESSION_TABLE_OFFSET: usize = 8192;
const _: () = assert!(INTENT_OFFSET + 2 * INTENT_BLOCK_LEN <= SESSION_TABLE_OFFSET);
const _: () = assert!(INTENT_BLOCK_LEN % CACHE_LINE_SIZE == 0);

/// One copy of a session entry; each table index has two.
pub const SESSION_ENTRY_LEN: usize = 128;
/// Reply bytes a session entry holds inline; a longer reply goes to a reply record.
pub const INLINE_REPLY_CAPACITY: usize = 92;

/// The metadata line at the start of every record.
pub const META_LEN: usize = 64;
/// Records are addressed in units of this many bytes from the start of the data area.
pub const GRANULE: usize = 64;

pub const MIN_SLOT_SIZE: usize = 256;
pub const MAX_SLOT_SIZE: usize = 1 << 17;
pub const DEFAULT_SLOT_SIZE: usize = 2048;
pub const MAX_SESSIONS_LIMIT: u32 = 1 << 20;
/// Largest data area: record ids are 32-bit granule numbers.
pub const MAX_DATA_LEN: u64 = (u32::MAX as u64 - 1) * GRANULE as u64;

/// Which engine a store file belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EngineKind {
    /// Received datagrams are the records: integrity from the PMNet CRC, no copy.
    Packet,
    /// The conventional way: copy into an allocated buffer, own checksum, own index node.
    Conventional,
}

impl EngineKind {
    pub fn name(self) -> &'static str {
        match self {
            EngineKind::Packet => "packet",
            EngineKind::Conventional => "conventional",
        }
    }

    fn code(self) -> u32 {
        match self {
            EngineKind::Packet => 1,
            EngineKind::Conventional => 2,
        }
    }

    fn from_code(code: u32) -> Option<EngineKind> {
        match code {
            1 => Some(EngineKind::Packet),
            2 => Some(EngineKind::Conventional),
            _ => None,
        }
    }
}

impl std::str::FromStr for EngineKind {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "packet" => Ok(EngineKind::Packet),
            "conventional" => Ok(EngineKind::Conventional),
            other => Err(format!(
                "unknown engine {other:?}: expected packet or conventional"
            )),
        }
    }
}

pub fn align_up(value: usize, to: usize) -> usize {
    value.div_ceil(to) * to
}

pub fn u16_at(bytes: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([bytes[at], bytes[at + 1]])
}

pub fn u32_at(bytes: &[u8], at: usize) -> u32 {
    let mut word = [0u8; 4];
    word.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(word)
}

pub fn u64_at(bytes: &[u8], at: usize) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(word)
}

/// The fixed geometry of a store, written once when it is formatted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    pub engine: EngineKind,
    /// Packet engine: bytes per slot (metadata line + datagram). Conventional: 0.
    pub slot_size: u32,
    /// Packet engine: number of slots. Conventional: 0.
    pub slot_count: u32,
    pub max_sessions: u32,
    pub data_offset: u64,
    pub data_len: u64,
}

/// `id / per` and `id % per` (`per` > 0): a shift and a mask for the power-of-two granule counts
/// of the default slot size, not a division — record ids are divided on every write and free.
pub fn divide(id: u32, per: u32) -> (u32, u32) {
    if per.is_power_of_two() {
        (id >> per.trailing_zeros(), id & (per - 1))
    } else {
        (id / per, id % per)
    }
}

impl Geometry {
    /// The geometry for a region of `region_len` bytes, or why it cannot hold a store.
    pub fn plan(
        engine: EngineKind,
        region_len: usize,
        slot_size: usize,
        max_sessions: u32,
    ) -> Result<Geometry, String> {
        if max_sessions == 0 || max_sessions > MAX_SESSIONS_LIMIT {
            return Err(format!(
                "max sessions {max_sessions} is out of range 1..={MAX_SESSIONS_LIMIT}"
            ));
        }
        let table_len = max_sessions as usize * 2 * SESSION_ENTRY_LEN;
        let data_offset = align_up(SESSION_TABLE_OFFSET + table_len, 4096);
        if region_len <= data_offset {
            return Err(format!(
                "a region of {region_len} bytes has no room for data after {data_offset} bytes \
                 of superblock, intent blocks and session table"
            ));
        }
        let available = ((region_len - data_offset) as u64).min(MAX_DATA_LEN);
        match engine {
            EngineKind::Packet => {
                if !(MIN_SLOT_SIZE..=MAX_SLOT_SIZE).contains(&slot_size) || slot_size % GRANULE != 0
                {
                    return Err(format!(
                        "slot size {slot_size} must be a multiple of {GRANULE} in \
                         {MIN_SLOT_SIZE}..={MAX_SLOT_SIZE}"
                    ));
                }
                let slot_count = available / slot_size as u64;
                if slot_count < 8 {
                    return Err(format!(
                        "a region of {region_len} bytes holds only {slot_count} slots of \
                         {slot_size} bytes; at least 8 are needed"
                    ));
                }
                let slot_count = u32::try_from(slot_count).unwrap_or(u32::MAX);
                Ok(Geometry {
                    engine,
                    slot_size: slot_size as u32,
                    slot_count,
                    max_sessions,
                    data_offset: data_offset as u64,
                    data_len: u64::from(slot_count) * slot_size as u64,
                })
            }
            EngineKind::Conventional => {
                let data_len = available / GRANULE as u64 * GRANULE as u64;
                if data_len < 16 * GRANULE as u64 {
                    return Err(format!("a region of {region_len} bytes leaves no heap"));
                }
                Ok(Geometry {
                    engine,
                    slot_size: 0,
                    slot_count: 0,
                    max_sessions,
                    data_offset: data_offset as u64,
                    data_len,
                })
            }
        }
    }

    pub fn encode(&self) -> [u8; 64] {
        let mut line = [0u8; 64];
        line[0..8].copy_from_slice(&MAGIC);
        line[8..12].copy_from_slice(&LAYOUT_VERSION.to_le_bytes());
        line[12..16].copy_from_slice(&self.engine.code().to_le_bytes());
        line[16..20].copy_from_slice(&self.slot_size.to_le_bytes());
        line[20..24].copy_from_slice(&self.slot_count.to_le_bytes());
        line[24..28].copy_from_slice(&self.max_sessions.to_le_bytes());
        line[32..40].copy_from_slice(&self.data_offset.to_le_bytes());
        line[40..48].copy_from_slice(&self.data_len.to_le_bytes());
        let crc = crc32c::crc32c(&line[0..60]);
        line[60..64].copy_from_slice(&crc.to_le_bytes());
        line
    }

    /// Decode and check the config line against a region of `region_len` bytes.
    pub fn decode(line: &[u8], region_len: usize) -> Result<Geometry, String> {
        if line.len() < 64 || line[0..8] != MAGIC {
            return Err("not a packet store (bad magic)".to_owned());
        }
        if crc32c::crc32c(&line[0..60]) != u32_at(line, 60) {
            return Err("the superblock fails its CRC32C (corrupt)".to_owned());
        }
        let version = u32_at(line, 8);
        if version != LAYOUT_VERSION {
            return Err(format!(
                "layout version {version}, this build reads {LAYOUT_VERSION}"
            ));
        }
        let engine = EngineKind::from_code(u32_at(line, 12))
            .ok_or_else(|| format!("unknown engine code {}", u32_at(line, 12)))?;
        let geometry = Geometry {
            engine,
            slot_size: u32_at(line, 16),
            slot_count: u32_at(line, 20),
            max_sessions: u32_at(line, 24),
            data_offset: u64_at(line, 32),
            data_len: u64_at(line, 40),
        };
        let table_end = SESSION_TABLE_OFFSET as u64
            + u64::from(geometry.max_sessions) * 2 * SESSION_ENTRY_LEN as u64;
        let consistent = geometry.max_sessions >= 1
            && geometry.max_sessions <= MAX_SESSIONS_LIMIT
            && geometry.data_offset >= table_end
            && geometry.data_offset % 4096 == 0
            && geometry.data_len <= MAX_DATA_LEN
            && geometry.data_len % GRANULE as u64 == 0
            && geometry
                .data_offset
                .checked_add(geometry.data_len)
                .is_some_and(|end| end <= region_len as u64)
            && match engine {
                EngineKind::Packet => {
                    let slot_size = geometry.slot_size as usize;
                    (MIN_SLOT_SIZE..=MAX_SLOT_SIZE).contains(&slot_size)
                        && slot_size % GRANULE == 0
                        && u64::from(geometry.slot_count) * slot_size as u64 == geometry.data_len
                }
                EngineKind::Conventional => true,
            };
        if !consistent {
            return Err(format!(
                "the superblock describes a layout that does not fit a region of {region_len} \
                 bytes: {geometry:?}"
            ));
        }
        Ok(geometry)
    }

    /// The geometry the superblock `superblock` (its first 128 bytes at least) gives a region
    /// of `region_len` bytes: the config line's, with the data area as long as the growth word
    /// says once the store grew.
    pub fn read(superblock: &[u8], region_len: usize) -> Result<Geometry, String> {
        let geometry = Geometry::decode(superblock, region_len)?;
        let Some(granules) = superblock
            .get(GROWTH_OFFSET..GROWTH_OFFSET + 8)
            .and_then(decode_growth)
        else {
            return Ok(geometry);
        };
        let data_len = u64::from(granules) * GRANULE as u64;
        if data_len <= geometry.data_len {
            return Ok(geometry);
        }
        let fits = geometry
            .data_offset
            .checked_add(data_len)
            .is_some_and(|end| end <= region_len as u64);
        if !fits {
            return Err(format!(
                "the store grew to a data area of {data_len} bytes, which a file of                  {region_len} bytes does not hold (it was truncated)"
            ));
        }
        geometry.with_data_len(data_len).ok_or_else(|| {
            format!("the growth word names a data area of {data_len} bytes this layout cannot have")
        })
    }

    /// The geometry with a data area of `data_len` bytes, if the layout allows it.
    fn with_data_len(&self, data_len: u64) -> Option<Geometry> {
        if data_len > MAX_DATA_LEN || data_len % GRANULE as u64 != 0 {
            return None;
        }
        let mut grown = *self;
        grown.data_len = data_len;
        if self.engine == EngineKind::Packet {
            if data_len % u64::from(self.slot_size) != 0 {
                return None;
            }
            grown.slot_count = u32::try_from(data_len / u64::from(self.slot_size)).ok()?;
        }
        Some(grown)
    }

    /// The geometry of this store grown into a region of `region_len` bytes (the file was made
    /// longer first): the data area as long as whole slots (or granules) allow, and the growth
    /// word that says so, to store at [`GROWTH_OFFSET`]; `None` when the region adds no room.
    pub fn grow(&self, region_len: usize) -> Option<(Geometry, [u8; 8])> {
        let unit = match self.engine {
            EngineKind::Packet => u64::from(self.slot_size),
            EngineKind::Conventional => GRANULE as u64,
        };
        let available = (region_len as u64).checked_sub(self.data_offset)?;
        let data_len = (available.min(MAX_DATA_LEN) / unit) * unit;
        if data_len <= self.data_len {
            return None;
        }
        let grown = self.with_data_len(data_len)?;
        Some((grown, encode_growth(grown.granule_count())))
    }

    pub fn data_offset(&self) -> usize {
        self.data_offset as usize
    }

    /// Region offset of record `id`.
    pub fn record_offset(&self, id: u32) -> usize {
        self.data_offset() + id as usize * GRANULE
    }

    pub fn granule_count(&self) -> u32 {
        (self.data_len / GRANULE as u64) as u32
    }

    /// Packet engine: the granules of one slot, so the record ids that start slots are its
    /// multiples (0 in the conventional engine, which has no slots).
    pub fn granules_per_slot(&self) -> u32 {
        self.slot_size / GRANULE as u32
    }

    /// Packet engine: the record id of slot `slot`.
    pub fn slot_id(&self, slot: u32) -> u32 {
        slot * self.granules_per_slot()
    }

    /// Packet engine: the slot of record id `id`, if `id` starts a slot.
    pub fn slot_of(&self, id: u32) -> Option<u32> {
        let per_slot = self.granules_per_slot();
        if per_slot == 0 {
            return None;
        }
        let (slot, rest) = divide(id, per_slot);
        (rest == 0 && slot < self.slot_count).then_some(slot)
    }

    /// Packet engine: the largest datagram a slot holds.
    pub fn slot_datagram_capacity(&self) -> usize {
        self.slot_size as usize - META_LEN
    }

    /// Packet engine: the most payload one datagram in a slot carries: what the slot holds
    /// after the PMNet header, and never more than one datagram may carry (slots may be larger
    /// than a datagram).
    pub fn slot_payload_capacity(&self) -> usize {
        (self.slot_datagram_capacity() - pmnet_wire::HEADER_LEN).min(pmnet_wire::MAX_PAYLOAD_LEN)
    }

    pub fn session_entry_offset(&self, index: u32, copy: u8) -> usize {
        SESSION_TABLE_OFFSET + (index as usize * 2 + copy as usize) * SESSION_ENTRY_LEN
    }
}

/// The growth word of a data area of `granules` granules.
pub fn encode_growth(granules: u32) -> [u8; 8] {
    let mut word = [0u8; 8];
    word[0..4].copy_from_slice(&granules.to_le_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(GROWTH_SALT), &word[0..4]);
    word[4..8].copy_from_slice(&crc.to_le_bytes());
    word
}

/// The granules a growth word names, if it is one (all zero, or damaged: none).
pub fn decode_growth(word: &[u8]) -> Option<u32> {
    if word.len() < 8 {
        return None;
    }
    let crc = crc32c::crc32c_append(crc32c::crc32c(GROWTH_SALT), &word[0..4]);
    (crc == u32_at(word, 4)).then(|| u32_at(word, 0))
}

pub fn intent_offset(epoch: u64) -> usize {
    INTENT_OFFSET + (epoch % 2) as usize * INTENT_BLOCK_LEN
}

/// What a record is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordKind {
    /// A PMNet datagram (received, or made by the store for a request that arrived otherwise);
    /// a request spans a chain of them, one per fragment.
    Packet,
    /// A conventional record: own header and CRC, then key and value.
    Conventional,
    /// A session's last reply, too long to keep inline.
    Reply,
}

impl RecordKind {
    fn code(self) -> u8 {
        match self {
            RecordKind::Packet => 1,
            RecordKind::Conventional => 2,
            RecordKind::Reply => 3,
        }
    }

    fn from_code(code: u8) -> Option<RecordKind> {
        match code {
            1 => Some(RecordKind::Packet),
            2 => Some(RecordKind::Conventional),
            3 => Some(RecordKind::Reply),
            _ => None,
        }
    }
}

/// How the reply of the request a record applied is derived from the record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyStyle {
    /// OK (SET, APPEND).
    Ok,
    /// INTEGER of the value (INCR).
    Integer,
}

impl ReplyStyle {
    pub fn code(self) -> u8 {
        match self {
            ReplyStyle::Ok => 0,
            ReplyStyle::Integer => 1,
        }
    }

    pub fn from_code(code: u8) -> Option<ReplyStyle> {
        match code {
            0 => Some(ReplyStyle::Ok),
            1 => Some(ReplyStyle::Integer),
            _ => None,
        }
    }
}

/// The metadata line of a record.
///
/// | offset | size | field |
/// |-------:|-----:|-------|
/// | 0  | 4 | level-0 link of the ordered index: next record id + 1, 0 at the end |
/// | 4  | 4 | next fragment's record id + 1, 0 for the last (packet chains) |
/// | 8  | 8 | epoch of the batch that wrote the record |
/// | 16 | 8 | receive time, ns since the Unix epoch (0 when the store made the record) |
/// | 24 | 4 | length of the bytes after this line (the datagram, or the conventional record) |
/// | 28 | 1 | kind: 1 packet, 2 conventional, 3 reply |
/// | 29 | 1 | buddy order of the block (conventional heap), 0 for slots |
/// | 30 | 1 | reply style: 0 OK, 1 INTEGER |
/// | 32 | 4 | the record's own id: a record read at the wrong place fails |
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Meta {
    pub next0: u32,
    pub frag_next: u32,
    pub epoch: u64,
    pub receive_time_ns: u64,
    pub len: u32,
    pub kind: RecordKind,
    pub order: u8,
    pub reply_style: ReplyStyle,
    pub self_id: u32,
}

pub const META_NEXT0: usize = 0;

impl Meta {
    pub fn encode(&self) -> [u8; META_LEN] {
        let mut line = [0u8; META_LEN];
        line[0..4].copy_from_slice(&self.next0.to_le_bytes());
        line[4..8].copy_from_slice(&self.frag_next.to_le_bytes());
        line[8..16].copy_from_slice(&self.epoch.to_le_bytes());
        line[16..24].copy_from_slice(&self.receive_time_ns.to_le_bytes());
        line[24..28].copy_from_slice(&self.len.to_le_bytes());
        line[28] = self.kind.code();
        line[29] = self.order;
        line[30] = self.reply_style.code();
        line[32..36].copy_from_slice(&self.self_id.to_le_bytes());
        line
    }

    /// Decode a metadata line; `None` if a field holds a value no writer produces.
    pub fn decode(line: &[u8]) -> Option<Meta> {
        if line.len() < META_LEN {
            return None;
        }
        Some(Meta {
            next0: u32_at(line, 0),
            frag_next: u32_at(line, 4),
            epoch: u64_at(line, 8),
            receive_time_ns: u64_at(line, 16),
            len: u32_at(line, 24),
            kind: RecordKind::from_code(line[28])?,
            order: line[29],
            reply_style: ReplyStyle::from_code(line[30])?,
            self_id: u32_at(line, 32),
        })
    }
}

/// A link value: record id + 1, or 0 for none.
pub fn link_of(id: Option<u32>) -> u32 {
    id.map_or(0, |id| id + 1)
}

pub fn id_of_link(link: u32) -> Option<u32> {
    link.checked_sub(1)
}

/// One copy of a session's durable record.
///
/// | offset | size | field |
/// |-------:|-----:|-------|
/// | 0  | 8  | session id |
/// | 8  | 8  | epoch of the batch that wrote it |
/// | 16 | 4  | last applied sequence number |
/// | 20 | 1  | 0xA5 when in use |
/// | 21 | 1  | reply held: 0 inline, 1 in a reply record |
/// | 22 | 2  | inline reply length |
/// | 24 | 4  | reply record id + 1 |
/// | 32 | 92 | inline reply |
/// | 124| 4  | CRC32C of bytes 0..124 |
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionEntry {
    pub session_id: u64,
    pub epoch: u64,
    pub last_seq: u32,
    pub reply: EntryReply,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryReply {
    Inline(Vec<u8>),
    Record(u32),
}

const ENTRY_IN_USE: u8 = 0xA5;

impl SessionEntry {
    pub fn encode(&self) -> [u8; SESSION_ENTRY_LEN] {
        let mut bytes = [0u8; SESSION_ENTRY_LEN];
        bytes[0..8].copy_from_slice(&self.session_id.to_le_bytes());
        bytes[8..16].copy_from_slice(&self.epoch.to_le_bytes());
        bytes[16..20].copy_from_slice(&self.last_seq.to_le_bytes());
        bytes[20] = ENTRY_IN_USE;
        match &self.reply {
            EntryReply::Inline(reply) => {
                assert!(
                    reply.len() <= INLINE_REPLY_CAPACITY,
                    "inline reply too long"
                );
                bytes[21] = 0;
                bytes[22..24].copy_from_slice(&(reply.len() as u16).to_le_bytes());
                bytes[32..32 + reply.len()].copy_from_slice(reply);
            }
            EntryReply::Record(id) => {
                bytes[21] = 1;
                bytes[24..28].copy_from_slice(&link_of(Some(*id)).to_le_bytes());
            }
        }
        let crc = crc32c::crc32c(&bytes[0..124]);
        bytes[124..128].copy_from_slice(&crc.to_le_bytes());
        bytes
    }

    /// `None` for an unused, torn or corrupt copy.
    pub fn decode(bytes: &[u8]) -> Option<SessionEntry> {
        if bytes.len() < SESSION_ENTRY_LEN || bytes[20] != ENTRY_IN_USE {
            return None;
        }
        if crc32c::crc32c(&bytes[0..124]) != u32_at(bytes, 124) {
            return None;
        }
        let reply = match bytes[21] {
            0 => {
                let len = usize::from(u16_at(bytes, 22));
                if len > INLINE_REPLY_CAPACITY {
                    return None;
                }
                EntryReply::Inline(bytes[32..32 + len].to_vec())
            }
            1 => EntryReply::Record(id_of_link(u32_at(bytes, 24))?),
            _ => return None,
        };
        Some(SessionEntry {
            session_id: u64_at(bytes, 0),
            epoch: u64_at(bytes, 8),
            last_seq: u32_at(bytes, 16),
            reply,
        })
    }
}

/// One operation a batch asks recovery to redo, in batch order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IntentOp {
    /// Make the record's key map to this record (insert or replace).
    Link(u32),
    /// Remove the key this record names (the record is a DEL request).
    Unlink(u32),
}

impl IntentOp {
    pub fn record(self) -> u32 {
        match self {
            IntentOp::Link(id) | IntentOp::Unlink(id) => id,
        }
    }
}

/// The intent block of a batch: its epoch and the index operations to redo, in order.
///
/// | offset | size | field |
/// |-------:|-----:|-------|
/// | 0  | 8 | epoch |
/// | 8  | 4 | operation count |
/// | 12 | 4 | CRC32C of bytes 0..12 and the entries |
/// | 64 | 8 × count | entries: op (1 link, 2 unlink), 3 zero bytes, record id |
pub fn encode_intent(epoch: u64, ops: &[IntentOp], out: &mut Vec<u8>) {
    assert!(ops.len() <= MAX_BATCH_OPS, "batch too large");
    out.clear();
    out.resize(INTENT_HEADER_LEN + ops.len() * INTENT_ENTRY_LEN, 0);
    out[0..8].copy_from_slice(&epoch.to_le_bytes());
    out[8..12].copy_from_slice(&(ops.len() as u32).to_le_bytes());
    for (index, op) in ops.iter().enumerate() {
        let at = INTENT_HEADER_LEN + index * INTENT_ENTRY_LEN;
        let (code, id) = match *op {
            IntentOp::Link(id) => (1u8, id),
            IntentOp::Unlink(id) => (2u8, id),
        };
        out[at] = code;
        out[at + 4..at + 8].copy_from_slice(&id.to_le_bytes());
    }
    let mut crc = crc32c::crc32c(&out[0..12]);
    crc = crc32c::crc32c_append(crc, &out[INTENT_HEADER_LEN..]);
    out[12..16].copy_from_slice(&crc.to_le_bytes());
}

/// Decode the intent block at `bytes` if it is intact and belongs to `epoch`.
pub fn decode_intent(bytes: &[u8], epoch: u64) -> Result<Vec<IntentOp>, String> {
    if u64_at(bytes, 0) != epoch {
        return Err(format!(
            "the intent block holds epoch {}, not the committed epoch {epoch}",
            u64_at(bytes, 0)
        ));
    }
    let count = u32_at(bytes, 8) as usize;
    if count > MAX_BATCH_OPS {
        return Err(format!("the intent block claims {count} operations"));
    }
    let entries = &bytes[INTENT_HEADER_LEN..INTENT_HEADER_LEN + count * INTENT_ENTRY_LEN];
    let mut crc = crc32c::crc32c(&bytes[0..12]);
    crc = crc32c::crc32c_append(crc, entries);
    if crc != u32_at(bytes, 12) {
        return Err("the intent block fails its CRC32C (corrupt)".to_owned());
    }
    entries
        .chunks(INTENT_ENTRY_LEN)
        .map(|entry| {
            let id = u32_at(entry, 4);
            match entry[0] {
                1 => Ok(IntentOp::Link(id)),
                2 => Ok(IntentOp::Unlink(id)),
                other => Err(format!("unknown intent op {other}")),
            }
        })
        .collect()
}

/// The header of a conventional record, after its metadata line.
///
/// | offset | size | field |
/// |-------:|-----:|-------|
/// | 0  | 8 | session id |
/// | 8  | 4 | sequence number |
/// | 12 | 2 | key length |
/// | 14 | 1 | op: 1 put, 3 delete marker |
/// | 15 | 1 | zero |
/// | 16 | 4 | value length |
/// | 20 | 4 | CRC32C of bytes 0..20, the key and the value |
/// | 24 | … | key, then value |
pub const CONVENTIONAL_HEADER_LEN: usize = 24;
pub const CONVENTIONAL_OP_PUT: u8 = 1;
pub const CONVENTIONAL_OP_DELETE: u8 = 3;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry_round_trips_and_rejects_damage() {
        let geometry = Geometry::plan(EngineKind::Packet, 1 << 20, 2048, 16).unwrap();
        let line = geometry.encode();
        assert_eq!(Geometry::decode(&line, 1 << 20).unwrap(), geometry);
        let mut damaged = line;
        damaged[20] ^= 1;
        assert!(Geometry::decode(&damaged, 1 << 20).is_err());
        assert!(
            Geometry::decode(&line, 1 << 16).is_err(),
            "region too small"
        );
        assert!(Geometry::plan(EngineKind::Packet, 1 << 20, 100, 16).is_err());
        assert!(Geometry::plan(EngineKind::Packet, 1 << 20, 2048, 0).is_err());
        assert!(Geometry::plan(EngineKind::Conventional, 4096, 0, 16).is_err());
    }

    #[test]
    fn session_entry_round_trips_and_detects_tears() {
        let entry = SessionEntry {
            session_id: 7,
            epoch: 9,
            last_seq: 3,
            reply: EntryReply::Inline(vec![0, 1, 2]),
        };
        let bytes = entry.encode();
        assert_eq!(SessionEntry::decode(&bytes), Some(entry));
        for at in [0, 16, 40, 124] {
            let mut torn = bytes;
            torn[at] ^= 0x10;
            assert_eq!(SessionEntry::decode(&torn), None);
        }
        assert_eq!(SessionEntry::decode(&[0u8; SESSION_ENTRY_LEN]), None);
    }

    #[test]
    fn intent_round_trips() {
        let ops = [IntentOp::Link(5), IntentOp::Unlink(9)];
        let mut out = Vec::new();
        encode_intent(4, &ops, &mut out);
        out.resize(INTENT_BLOCK_LEN, 0);
        assert_eq!(decode_intent(&out, 4).unwrap(), ops);
        assert!(decode_intent(&out, 5).is_err());
        out[70] ^= 1;
        assert!(decode_intent(&out, 4).is_err());
    }
}

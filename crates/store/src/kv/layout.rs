//! The persistent layout of a [`super::KvStore`]: superblock copies and log records.
//!
//! Everything here is pure encoding and verification over byte slices; the store decides what
//! to write where and when to persist it. Every reader takes untrusted bytes and never panics
//! on them.

use crate::codec::{MAX_KEY_LEN, MAX_REPLY_LEN, MAX_VALUE_LEN};
use pmnet_pm::CACHE_LINE_SIZE;

/// First bytes of a superblock copy.
pub const MAGIC: [u8; 8] = *b"PMNETKV\0";

/// Layout version this code reads and writes.
pub const VERSION: u32 = 1;

/// One superblock copy fills one cache line, so a write of it tears only at 8-byte words and
/// its CRC decides whether it survived whole.
pub const SUPERBLOCK_SIZE: usize = CACHE_LINE_SIZE;

/// Two copies: the copy for generation `g` lives in slot `g % 2`, so a commit never overwrites
/// the copy that describes the state being replaced.
pub const SUPERBLOCK_COPIES: usize = 2;

/// Where the two halves start. Page-aligned so an msync of the superblock and of a half never
/// share a page.
pub const HALVES_OFFSET: usize = 4096;

/// Each half's length is a multiple of this (page-aligned halves for the same reason).
pub const HALF_ALIGN: usize = 4096;

/// Records start on 8-byte boundaries: a record's first word (length + checksum) is then
/// written back atomically, so a crash leaves it either old or new, never mixed.
pub const RECORD_ALIGN: usize = 8;

/// Fixed part of every record.
pub const RECORD_HEADER_SIZE: usize = 40;

/// Eight zero bytes written after the last record: a zero first word ends the log cleanly.
pub const TERMINATOR_SIZE: usize = 8;

/// Payload of a snapshot header record: `snapshot_len_bytes u64, key_count u64,
/// session_count u64`.
pub const SNAPSHOT_PAYLOAD_SIZE: usize = 24;

/// Size of the snapshot header record that opens every half.
pub const SNAPSHOT_RECORD_SIZE: usize = record_size(0, SNAPSHOT_PAYLOAD_SIZE, 0);

const _: () = assert!(SUPERBLOCK_SIZE * SUPERBLOCK_COPIES <= HALVES_OFFSET);
const _: () = assert!(HALVES_OFFSET % HALF_ALIGN == 0);
const _: () = assert!(RECORD_HEADER_SIZE % RECORD_ALIGN == 0);
const _: () = assert!(SNAPSHOT_RECORD_SIZE == 64);

/// Size of a record with these payload lengths, padded to [`RECORD_ALIGN`].
pub const fn record_size(key_len: usize, value_len: usize, reply_len: usize) -> usize {
    align_up(
        RECORD_HEADER_SIZE + key_len + value_len + reply_len,
        RECORD_ALIGN,
    )
}

pub const fn align_up(value: usize, align: usize) -> usize {
    value.div_ceil(align) * align
}

/// The decoded fields of one superblock copy.
///
/// ```text
/// offset size field
///  0     8    magic "PMNETKV\0"
///  8     4    version u32
/// 12     4    max_sessions u32
/// 16     8    generation u64           (the active half is generation % 2)
/// 24     8    store_id u64             (seeds every record checksum chain)
/// 32     8    region_len_bytes u64
/// 40     8    halves_offset_bytes u64
/// 48     8    half_len_bytes u64
/// 56     4    reserved, zero
/// 60     4    crc32c of bytes 0..60
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Superblock {
    pub max_sessions: u32,
    pub generation: u64,
    pub store_id: u64,
    pub region_len_bytes: u64,
    pub half_len_bytes: u64,
}

/// Why a superblock copy is not usable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotError {
    /// Not a store's superblock at all (or never written).
    NoMagic,
    WrongVersion(u32),
    /// Torn by a crash during a commit, or corrupted.
    Checksum,
    /// Checksum fine but the fields do not describe a valid layout.
    Geometry,
}

impl Superblock {
    pub fn encode(&self) -> [u8; SUPERBLOCK_SIZE] {
        let mut bytes = [0u8; SUPERBLOCK_SIZE];
        bytes[0..8].copy_from_slice(&MAGIC);
        bytes[8..12].copy_from_slice(&VERSION.to_le_bytes());
        bytes[12..16].copy_from_slice(&self.max_sessions.to_le_bytes());
        bytes[16..24].copy_from_slice(&self.generation.to_le_bytes());
        bytes[24..32].copy_from_slice(&self.store_id.to_le_bytes());
        bytes[32..40].copy_from_slice(&self.region_len_bytes.to_le_bytes());
        bytes[40..48].copy_from_slice(&(HALVES_OFFSET as u64).to_le_bytes());
        bytes[48..56].copy_from_slice(&self.half_len_bytes.to_le_bytes());
        let crc = crc32c::crc32c(&bytes[0..60]);
        bytes[60..64].copy_from_slice(&crc.to_le_bytes());
        bytes
    }

    pub fn decode(bytes: &[u8]) -> Result<Superblock, SlotError> {
        assert_eq!(bytes.len(), SUPERBLOCK_SIZE);
        if bytes[0..8] != MAGIC {
            return Err(SlotError::NoMagic);
        }
        let version = u32_at(bytes, 8);
        if version != VERSION {
            // Checked before the checksum: a later version may place its checksum elsewhere.
            return Err(SlotError::WrongVersion(version));
        }
        if crc32c::crc32c(&bytes[0..60]) != u32_at(bytes, 60) {
            return Err(SlotError::Checksum);
        }
        let superblock = Superblock {
            max_sessions: u32_at(bytes, 12),
            generation: u64_at(bytes, 16),
            store_id: u64_at(bytes, 24),
            region_len_bytes: u64_at(bytes, 32),
            half_len_bytes: u64_at(bytes, 48),
        };
        let halves_offset = u64_at(bytes, 40);
        let half_len = superblock.half_len_bytes;
        let geometry_valid = halves_offset == HALVES_OFFSET as u64
            && u32_at(bytes, 56) == 0
            && superblock.max_sessions > 0
            && half_len > 0
            && half_len % HALF_ALIGN as u64 == 0
            && half_len
                .checked_mul(2)
                .and_then(|halves| halves.checked_add(HALVES_OFFSET as u64))
                .is_some_and(|end| end <= superblock.region_len_bytes);
        if !geometry_valid {
            return Err(SlotError::Geometry);
        }
        Ok(superblock)
    }

    /// The half this generation's log lives in.
    pub fn active_half(&self) -> usize {
        (self.generation % 2) as usize
    }
}

/// What a record is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordKind {
    /// Opens every half: the snapshot's length and counts, and the activity clock.
    Snapshot = 1,
    /// A live key and its value, in a snapshot.
    Key = 2,
    /// A session's dedupe record, in a snapshot.
    Session = 3,
    /// One applied request: its effect, its session, seq and reply.
    Apply = 4,
}

impl RecordKind {
    fn from_u8(value: u8) -> Option<RecordKind> {
        match value {
            1 => Some(RecordKind::Snapshot),
            2 => Some(RecordKind::Key),
            3 => Some(RecordKind::Session),
            4 => Some(RecordKind::Apply),
            _ => None,
        }
    }
}

/// What a record does to the key space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EffectCode {
    None = 0,
    /// Set `key` to `value`.
    Put = 1,
    /// Remove `key`.
    Delete = 2,
}

impl EffectCode {
    fn from_u8(value: u8) -> Option<EffectCode> {
        match value {
            0 => Some(EffectCode::None),
            1 => Some(EffectCode::Put),
            2 => Some(EffectCode::Delete),
            _ => None,
        }
    }
}

/// The fields of one record.
///
/// ```text
/// offset size field
///  0     4    len_bytes u32      header + payload, excluding padding; 0 = end of log
///  4     4    crc32c u32         chained: crc32c_append(previous record's crc, bytes 0..4 ++ bytes 8..len)
///  8     1    kind u8            1 snapshot, 2 key, 3 session, 4 apply
///  9     1    effect u8          0 none, 1 put, 2 delete
/// 10     2    key_len u16
/// 12     4    value_len u32
/// 16     8    session_id u64
/// 24     4    seq u32
/// 28     4    reply_len u32
/// 32     8    activity u64       logical clock of the session's last apply (snapshot: the clock)
/// 40     ..   key, value, reply; then zero padding to a multiple of 8
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record<'a> {
    pub kind: RecordKind,
    pub effect: EffectCode,
    pub session_id: u64,
    pub seq: u32,
    pub activity: u64,
    pub key: &'a [u8],
    pub value: &'a [u8],
    pub reply: &'a [u8],
}

impl Record<'_> {
    pub fn size(&self) -> usize {
        record_size(self.key.len(), self.value.len(), self.reply.len())
    }

    /// Append the record (with padding) to `out`, chained to `previous_crc`; returns its crc.
    pub fn encode(&self, previous_crc: u32, out: &mut Vec<u8>) -> u32 {
        assert!(self.key.len() <= MAX_KEY_LEN);
        assert!(self.value.len() <= MAX_VALUE_LEN);
        assert!(self.reply.len() <= MAX_REPLY_LEN);
        let start = out.len();
        let len = RECORD_HEADER_SIZE + self.key.len() + self.value.len() + self.reply.len();
        out.extend_from_slice(&(len as u32).to_le_bytes());
        out.extend_from_slice(&[0; 4]); // crc, filled in below
        out.push(self.kind as u8);
        out.push(self.effect as u8);
        out.extend_from_slice(&(self.key.len() as u16).to_le_bytes());
        out.extend_from_slice(&(self.value.len() as u32).to_le_bytes());
        out.extend_from_slice(&self.session_id.to_le_bytes());
        out.extend_from_slice(&self.seq.to_le_bytes());
        out.extend_from_slice(&(self.reply.len() as u32).to_le_bytes());
        out.extend_from_slice(&self.activity.to_le_bytes());
        out.extend_from_slice(self.key);
        out.extend_from_slice(self.value);
        out.extend_from_slice(self.reply);
        out.resize(start + self.size(), 0);
        let crc = record_crc(previous_crc, &out[start..start + len]);
        out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
        crc
    }
}

/// Seed of a half's checksum chain. Binding it to the store and generation means stale
/// records (an older generation in the same half, or an earlier store on the same file) can
/// never verify as part of the current log.
pub fn chain_seed(store_id: u64, generation: u64) -> u32 {
    let mut bytes = [0u8; 16];
    bytes[0..8].copy_from_slice(&store_id.to_le_bytes());
    bytes[8..16].copy_from_slice(&generation.to_le_bytes());
    crc32c::crc32c(&bytes)
}

fn record_crc(previous_crc: u32, record: &[u8]) -> u32 {
    let crc = crc32c::crc32c_append(previous_crc, &record[0..4]);
    crc32c::crc32c_append(crc, &record[8..])
}

/// Why a record at the end of the log was not replayed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RejectReason {
    /// The length field is too small or runs past the half.
    LengthOutOfBounds,
    /// The checksum does not match the bytes (torn by a crash, corrupted, or stale bytes
    /// chained to something other than the record before).
    ChecksumMismatch,
}

/// What is at a position in a half.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadOutcome<'a> {
    /// A zero first word, or no room for one: the log ends cleanly here.
    End,
    /// A first word that is not zero, and not a record that verifies. `computed_crc` is the
    /// checksum of the bytes as they are (0 when the length is out of bounds): of it and
    /// `stored_crc`, one is the chain value the next record was written against, whether the
    /// damage is in the body or in the checksum field.
    Rejected {
        reason: RejectReason,
        stored_len: u32,
        stored_crc: u32,
        computed_crc: u32,
    },
    /// A verified record. `Err` when the checksum matches but the fields are inconsistent:
    /// not a torn write, but a corrupt or foreign file.
    Record {
        record: Result<Record<'a>, &'static str>,
        crc: u32,
        next_position: usize,
    },
}

/// Read the record at `position` of `half`, chained to `previous_crc`.
pub fn read_record(half: &[u8], position: usize, previous_crc: u32) -> ReadOutcome<'_> {
    assert_eq!(position % RECORD_ALIGN, 0);
    let Some(first_word) = half.get(position..position + 8) else {
        return ReadOutcome::End;
    };
    let stored_len = u32_at(first_word, 0);
    let stored_crc = u32_at(first_word, 4);
    if stored_len == 0 && stored_crc == 0 {
        return ReadOutcome::End;
    }
    let rejected = |reason, computed_crc| ReadOutcome::Rejected {
        reason,
        stored_len,
        stored_crc,
        computed_crc,
    };
    let len = stored_len as usize;
    let padded_len = align_up(len, RECORD_ALIGN);
    if len < RECORD_HEADER_SIZE || padded_len > half.len() - position {
        return rejected(RejectReason::LengthOutOfBounds, 0);
    }
    let bytes = &half[position..position + len];
    let crc = record_crc(previous_crc, bytes);
    if crc != stored_crc {
        return rejected(RejectReason::ChecksumMismatch, crc);
    }
    ReadOutcome::Record {
        record: parse_fields(bytes),
        crc,
        next_position: position + padded_len,
    }
}

/// Decode the fields of a record whose checksum verified.
fn parse_fields(bytes: &[u8]) -> Result<Record<'_>, &'static str> {
    let kind = RecordKind::from_u8(bytes[8]).ok_or("unknown record kind")?;
    let effect = EffectCode::from_u8(bytes[9]).ok_or("unknown record effect")?;
    let key_len = u16::from_le_bytes([bytes[10], bytes[11]]) as usize;
    let value_len = u32_at(bytes, 12) as usize;
    let reply_len = u32_at(bytes, 28) as usize;
    let payload_len = key_len as u64 + value_len as u64 + reply_len as u64;
    if RECORD_HEADER_SIZE as u64 + payload_len != bytes.len() as u64 {
        return Err("record field lengths do not add up to its length");
    }
    let (key, rest) = bytes[RECORD_HEADER_SIZE..].split_at(key_len);
    let (value, reply) = rest.split_at(value_len);
    Ok(Record {
        kind,
        effect,
        session_id: u64_at(bytes, 16),
        seq: u32_at(bytes, 24),
        activity: u64_at(bytes, 32),
        key,
        value,
        reply,
    })
}

/// The snapshot header's payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotHeader {
    /// Bytes from the half's start to the end of the snapshot's last record.
    pub snapshot_len_bytes: u64,
    pub key_count: u64,
    pub session_count: u64,
}

impl SnapshotHeader {
    pub fn encode(&self) -> [u8; SNAPSHOT_PAYLOAD_SIZE] {
        let mut bytes = [0u8; SNAPSHOT_PAYLOAD_SIZE];
        bytes[0..8].copy_from_slice(&self.snapshot_len_bytes.to_le_bytes());
        bytes[8..16].copy_from_slice(&self.key_count.to_le_bytes());
        bytes[16..24].copy_from_slice(&self.session_count.to_le_bytes());
        bytes
    }

    pub fn decode(record: &Record<'_>) -> Result<SnapshotHeader, &'static str> {
        let shaped = record.kind == RecordKind::Snapshot
            && record.effect == EffectCode::None
            && record.key.is_empty()
            && record.reply.is_empty()
            && record.value.len() == SNAPSHOT_PAYLOAD_SIZE;
        if !shaped {
            return Err("first record of the half is not a snapshot header");
        }
        Ok(SnapshotHeader {
            snapshot_len_bytes: u64_at(record.value, 0),
            key_count: u64_at(record.value, 8),
            session_count: u64_at(record.value, 16),
        })
    }
}

/// Check that `half` opens with a complete, verified snapshot chained from `seed`; returns its
/// header. Used to decide whether a compaction whose superblock copy is unreadable had
/// finished writing its snapshot.
pub fn verify_snapshot(half: &[u8], seed: u32) -> Option<SnapshotHeader> {
    let ReadOutcome::Record {
        record: Ok(record),
        mut crc,
        mut next_position,
    } = read_record(half, 0, seed)
    else {
        return None;
    };
    let header = SnapshotHeader::decode(&record).ok()?;
    let snapshot_len = usize::try_from(header.snapshot_len_bytes).ok()?;
    let mut record_count: u64 = 0;
    while next_position < snapshot_len {
        let ReadOutcome::Record {
            record: Ok(record),
            crc: next_crc,
            next_position: next,
        } = read_record(half, next_position, crc)
        else {
            return None;
        };
        if !matches!(record.kind, RecordKind::Key | RecordKind::Session) {
            return None;
        }
        record_count += 1;
        crc = next_crc;
        next_position = next;
    }
    let counts_match = header.key_count.checked_add(header.session_count) == Some(record_count);
    (next_position == snapshot_len && counts_match).then_some(header)
}

fn u32_at(bytes: &[u8], offset: usize) -> u32 {
    let mut array = [0u8; 4];
    array.copy_from_slice(&bytes[offset..offset + 4]);
    u32::from_le_bytes(array)
}

fn u64_at(bytes: &[u8], offset: usize) -> u64 {
    let mut array = [0u8; 8];
    array.copy_from_slice(&bytes[offset..offset + 8]);
    u64::from_le_bytes(array)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn superblock_round_trip_and_golden_prefix() {
        let superblock = Superblock {
            max_sessions: 16,
            generation: 3,
            store_id: 0x0102_0304_0506_0708,
            region_len_bytes: 1 << 20,
            half_len_bytes: 258048,
        };
        let bytes = superblock.encode();
        assert_eq!(&bytes[0..16], b"PMNETKV\0\x01\x00\x00\x00\x10\x00\x00\x00");
        assert_eq!(Superblock::decode(&bytes), Ok(superblock));
        assert_eq!(superblock.active_half(), 1);
        for bit in 0..(60 * 8) {
            let mut flipped = bytes;
            flipped[bit / 8] ^= 1 << (bit % 8);
            assert!(Superblock::decode(&flipped).is_err(), "bit {bit}");
        }
        assert_eq!(Superblock::decode(&[0; 64]), Err(SlotError::NoMagic));
    }

    #[test]
    fn record_round_trip_and_golden() {
        let record = Record {
            kind: RecordKind::Apply,
            effect: EffectCode::Put,
            session_id: 7,
            seq: 9,
            activity: 11,
            key: b"k",
            value: b"v",
            reply: &[0],
        };
        let mut out = Vec::new();
        let crc = record.encode(0, &mut out);
        assert_eq!(out.len(), 48);
        assert_eq!(
            &out[0..4],
            &43u32.to_le_bytes(),
            "len excludes the padding to a multiple of 8"
        );
        assert_eq!(&out[8..16], &[4, 1, 1, 0, 1, 0, 0, 0]);
        assert_eq!(&out[40..48], &[b'k', b'v', 0, 0, 0, 0, 0, 0]);
        let mut half = out.clone();
        half.extend_from_slice(&[0; TERMINATOR_SIZE]);
        assert_eq!(
            read_record(&half, 0, 0),
            ReadOutcome::Record {
                record: Ok(record),
                crc,
                next_position: 48
            }
        );
        assert_eq!(read_record(&half, 48, crc), ReadOutcome::End);
        // Chained to something else: rejected.
        assert!(matches!(
            read_record(&half, 0, 1),
            ReadOutcome::Rejected {
                reason: RejectReason::ChecksumMismatch,
                ..
            }
        ));
        for bit in 0..(43 * 8) {
            let mut flipped = half.clone();
            flipped[bit / 8] ^= 1 << (bit % 8);
            assert!(
                matches!(read_record(&flipped, 0, 0), ReadOutcome::Rejected { .. }),
                "bit {bit}"
            );
        }
    }

    #[test]
    fn reading_garbage_never_panics() {
        let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..2000 {
            let mut half = vec![0u8; 256];
            for byte in half.iter_mut() {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                *byte = state as u8;
            }
            let mut position = 0;
            while position < half.len() {
                let _ = read_record(&half, position, 0);
                position += RECORD_ALIGN;
            }
            let _ = verify_snapshot(&half, 0);
        }
    }
}

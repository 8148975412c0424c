//! The key-value table's persistent layout, and the executor that writes it: each key lives in
//! a bucket of two records, and a write goes to the record that does not hold the key's
//! current version, so a crash at any point leaves the current version whole in the other
//! (docs/netchain.md, "The table in persistent memory").
//!
//! ```text
//! superblock (64 bytes)
//!   0..8    magic "PMNCHAIN"
//!   8..12   layout version (u32, little-endian)
//!   12..16  buckets (u32)
//!   16..18  largest key (u16)
//!   18..20  largest value (u16)
//!   20..24  record size (u32)
//!   60..64  CRC-32C of bytes 0..60
//! bucket b, record h (h = 0, 1) at 64 + (2 b + h) * record size
//!   0..4    CRC-32C of bytes 4..(24 + key length + value length)
//!   4       state: 0 free, 1 a version, 2 a deletion
//!   5       key length (u8)
//!   6..8    value length (u16)
//!   8..16   the key's sequence number (u64)
//!   16..24  the record's generation (u64): one more than the bucket's other record's when
//!           written; the record of the higher (generation, sequence number) is the current
//!           one (a joining member may replace a version with an older one; records written
//!           before generations have 0)
//!   24..    key, then value
//! ```
//!
//! A record is one store of its bytes, a flush of its lines and a fence per batch: a torn
//! record fails its CRC and the bucket's other record, written a batch or more earlier, is the
//! current version. Nothing else is written, so there is no log to replay.

use std::collections::HashMap;

use pmnet_pm::{PmRegion, CACHE_LINE_SIZE};

const MAGIC: &[u8; 8] = b"PMNCHAIN";
const LAYOUT_VERSION: u32 = 1;
/// Bytes of the superblock (one cache line).
pub const SUPERBLOCK_LEN: usize = 64;
/// Bytes of a record before its key.
pub const RECORD_HEADER_LEN: usize = 24;

const STATE_FREE: u8 = 0;
const STATE_VERSION: u8 = 1;
const STATE_DELETION: u8 = 2;

/// The table's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    pub buckets: u32,
    pub key_max: u16,
    pub value_max: u16,
}

impl Geometry {
    /// Largest key a record holds (its length is a u8).
    pub const KEY_MAX: u16 = 255;
    /// Largest value a record holds.
    pub const VALUE_MAX: u16 = 16 * 1024;
    /// Most buckets.
    pub const BUCKETS_MAX: u32 = 1 << 24;

    /// Bytes of one record: header, key and value, rounded up to whole cache lines.
    pub fn record_len(&self) -> usize {
        (RECORD_HEADER_LEN + usize::from(self.key_max) + usize::from(self.value_max))
            .div_ceil(CACHE_LINE_SIZE)
            * CACHE_LINE_SIZE
    }

    /// Bytes of a region holding the table.
    pub fn region_len(&self) -> usize {
        SUPERBLOCK_LEN + 2 * self.buckets as usize * self.record_len()
    }

    fn check(&self) -> Result<(), FileError> {
        if self.buckets == 0 || self.buckets > Geometry::BUCKETS_MAX {
            return Err(FileError::BadGeometry("buckets must be 1 to 16 777 216"));
        }
        if self.key_max == 0 || self.key_max > Geometry::KEY_MAX {
            return Err(FileError::BadGeometry(
                "the largest key must be 1 to 255 bytes",
            ));
        }
        if self.value_max > Geometry::VALUE_MAX {
            return Err(FileError::BadGeometry(
                "the largest value must be at most 16 KiB",
            ));
        }
        Ok(())
    }
}

/// Why a region holds no usable table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileError {
    BadGeometry(&'static str),
    /// The region is smaller than the geometry needs.
    TooSmall {
        needed: usize,
        len: usize,
    },
    /// No table's superblock (blank, another file, or damaged).
    NotATable(&'static str),
}

impl std::fmt::Display for FileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FileError::BadGeometry(why) => write!(f, "bad table geometry: {why}"),
            FileError::TooSmall { needed, len } => {
                write!(f, "the region has {len} bytes; the table needs {needed}")
            }
            FileError::NotATable(why) => write!(f, "not a pmnet table: {why}"),
        }
    }
}

impl std::error::Error for FileError {}

/// A key's version as a record holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version {
    pub seq: u64,
    /// `None`: the key was deleted at `seq`.
    pub value: Option<Vec<u8>>,
}

/// One piece of the table's persistence work: write a version of `key` into record `half` of
/// `bucket`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableWork {
    pub bucket: u32,
    pub half: u8,
    /// One more than the generation of the record holding the key's durable version.
    pub generation: u64,
    pub key: Vec<u8>,
    pub version: Version,
}

impl TableWork {
    /// The bytes this work stores and where, in a region laid out with `geometry`.
    pub fn region_write(&self, geometry: &Geometry) -> pmnet_proto::RegionWrite {
        assert!(self.bucket < geometry.buckets && self.half < 2);
        pmnet_proto::RegionWrite {
            offset: record_offset(geometry, self.bucket, self.half),
            bytes: encode_record(&self.key, &self.version, self.generation, geometry),
        }
    }
}

/// A batch of table work as the region writes that carry it out (what a function in a device's
/// pipeline hands the front executor).
pub fn region_batch(
    batch: pmnet_proto::PersistBatch<TableWork>,
    geometry: &Geometry,
) -> pmnet_proto::PersistBatch<pmnet_proto::RegionWrite> {
    pmnet_proto::PersistBatch {
        number: batch.number,
        work: batch
            .work
            .iter()
            .map(|work| work.region_write(geometry))
            .collect(),
    }
}

fn record_offset(geometry: &Geometry, bucket: u32, half: u8) -> usize {
    SUPERBLOCK_LEN + (2 * bucket as usize + usize::from(half)) * geometry.record_len()
}

/// What opening a table found: each key's current version and where it lives.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recovered {
    /// key → (bucket, the half holding the current version, the version, its record's
    /// generation).
    pub keys: HashMap<Vec<u8>, (u32, u8, Version, u64)>,
    /// Records that failed their check (torn writes, or damage), ignored.
    pub damaged_records: u64,
    /// Buckets whose two records named different keys (damage): the newer one was kept.
    pub conflicting_buckets: u64,
}

/// The table on a persistent region: the executor of [`TableWork`].
#[derive(Debug)]
pub struct TableFile<R: PmRegion> {
    region: R,
    geometry: Geometry,
}

impl<R: PmRegion> TableFile<R> {
    /// Lay out an empty table on `region` (every record free).
    pub fn format(mut region: R, geometry: Geometry) -> Result<TableFile<R>, FileError> {
        geometry.check()?;
        let needed = geometry.region_len();
        if region.len() < needed {
            return Err(FileError::TooSmall {
                needed,
                len: region.len(),
            });
        }
        // Free records: zero state bytes. Clear the whole area (a reused file may hold old
        // records), then write the superblock last.
        let zeros = vec![0u8; 1 << 16];
        let mut offset = SUPERBLOCK_LEN;
        while offset < needed {
            let len = zeros.len().min(needed - offset);
            region.write(offset, &zeros[..len]);
            offset += len;
        }
        region.persist(SUPERBLOCK_LEN, needed - SUPERBLOCK_LEN);
        let superblock = encode_superblock(&geometry);
        region.write(0, &superblock);
        region.persist(0, SUPERBLOCK_LEN);
        Ok(TableFile { region, geometry })
    }

    /// Open the table on `region` and find every key's current version. Never panics on what
    /// the region holds.
    pub fn open(region: R) -> Result<(TableFile<R>, Recovered), FileError> {
        let bytes = region.bytes();
        let geometry = decode_superblock(
            bytes
                .get(..SUPERBLOCK_LEN)
                .ok_or(FileError::NotATable("shorter than a superblock"))?,
        )?;
        let needed = geometry.region_len();
        if bytes.len() < needed {
            return Err(FileError::TooSmall {
                needed,
                len: bytes.len(),
            });
        }
        let file = TableFile { region, geometry };
        let recovered = file.scan();
        Ok((file, recovered))
    }

    pub fn geometry(&self) -> Geometry {
        self.geometry
    }

    pub fn region(&self) -> &R {
        &self.region
    }

    fn record_offset(&self, bucket: u32, half: u8) -> usize {
        record_offset(&self.geometry, bucket, half)
    }

    /// The region, to hand to the device's executor once the table is opened.
    pub fn into_region(self) -> R {
        self.region
    }

    fn scan(&self) -> Recovered {
        let mut recovered = Recovered::default();
        let len = self.geometry.record_len();
        for bucket in 0..self.geometry.buckets {
            let mut halves: Vec<(u8, Vec<u8>, Version, u64)> = Vec::with_capacity(2);
            for half in 0..2u8 {
                let offset = self.record_offset(bucket, half);
                let record = &self.region.bytes()[offset..offset + len];
                match decode_record(record, &self.geometry) {
                    Ok(Some((key, version, generation))) => {
                        halves.push((half, key, version, generation))
                    }
                    Ok(None) => {}
                    Err(()) => recovered.damaged_records += 1,
                }
            }
            halves.sort_by_key(|(_, _, version, generation)| {
                std::cmp::Reverse((*generation, version.seq))
            });
            let Some((half, key, version, generation)) = halves.first().cloned() else {
                continue;
            };
            if halves.len() == 2 && halves[1].1 != key {
                recovered.conflicting_buckets += 1;
            }
            // A key in two buckets (damage): the newer version counts.
            match recovered.keys.get(&key) {
                Some((_, _, known, _)) if known.seq >= version.seq => {}
                _ => {
                    recovered
                        .keys
                        .insert(key, (bucket, half, version, generation));
                }
            }
        }
        recovered
    }

    /// Carry out `work` and make all of it durable before returning: every record stored and
    /// flushed, then one fence. A crash before the fence may leave any of the batch's records
    /// whole, old or torn; a torn one fails its CRC. The caller never writes the record that
    /// holds a key's current version (see [`crate::Table`]).
    ///
    /// Panics on a bucket or half out of range or a key or value larger than the geometry:
    /// bugs of the caller, which checks both.
    pub fn persist_batch(&mut self, work: &[TableWork]) {
        if work.is_empty() {
            return;
        }
        self.persist_batch_without_fence(work);
        self.region.fence();
    }

    /// [`TableFile::persist_batch`] without its fence: the records are stored and flushed
    /// but not known durable (for crash tests).
    pub fn persist_batch_without_fence(&mut self, work: &[TableWork]) {
        for item in work {
            let write = item.region_write(&self.geometry);
            self.region.write(write.offset, &write.bytes);
            self.region.flush(write.offset, write.bytes.len());
        }
    }
}

fn encode_superblock(geometry: &Geometry) -> [u8; SUPERBLOCK_LEN] {
    let mut block = [0u8; SUPERBLOCK_LEN];
    block[0..8].copy_from_slice(MAGIC);
    block[8..12].copy_from_slice(&LAYOUT_VERSION.to_le_bytes());
    block[12..16].copy_from_slice(&geometry.buckets.to_le_bytes());
    block[16..18].copy_from_slice(&geometry.key_max.to_le_bytes());
    block[18..20].copy_from_slice(&geometry.value_max.to_le_bytes());
    let record_len = u32::try_from(geometry.record_len()).expect("a record fits in u32");
    block[20..24].copy_from_slice(&record_len.to_le_bytes());
    let crc = crc32c::crc32c(&block[..60]);
    block[60..64].copy_from_slice(&crc.to_le_bytes());
    block
}

fn decode_superblock(block: &[u8]) -> Result<Geometry, FileError> {
    let field = |range: std::ops::Range<usize>| &block[range];
    if field(0..8) != MAGIC {
        return Err(FileError::NotATable("no magic"));
    }
    let crc = u32::from_le_bytes(field(60..64).try_into().expect("4 bytes"));
    if crc != crc32c::crc32c(&block[..60]) {
        return Err(FileError::NotATable("the superblock's checksum fails"));
    }
    if u32::from_le_bytes(field(8..12).try_into().expect("4 bytes")) != LAYOUT_VERSION {
        return Err(FileError::NotATable("another layout version"));
    }
    let geometry = Geometry {
        buckets: u32::from_le_bytes(field(12..16).try_into().expect("4 bytes")),
        key_max: u16::from_le_bytes(field(16..18).try_into().expect("2 bytes")),
        value_max: u16::from_le_bytes(field(18..20).try_into().expect("2 bytes")),
    };
    geometry.check()?;
    let record_len = u32::from_le_bytes(field(20..24).try_into().expect("4 bytes"));
    if record_len as usize != geometry.record_len() {
        return Err(FileError::NotATable("the record size does not match"));
    }
    Ok(geometry)
}

fn encode_record(key: &[u8], version: &Version, generation: u64, geometry: &Geometry) -> Vec<u8> {
    assert!(key.len() <= usize::from(geometry.key_max) && !key.is_empty());
    let value: &[u8] = version.value.as_deref().unwrap_or_default();
    assert!(value.len() <= usize::from(geometry.value_max));
    let mut record = vec![0u8; geometry.record_len()];
    record[4] = if version.value.is_some() {
        STATE_VERSION
    } else {
        STATE_DELETION
    };
    record[5] = u8::try_from(key.len()).expect("checked above");
    record[6..8].copy_from_slice(&(value.len() as u16).to_le_bytes());
    record[8..16].copy_from_slice(&version.seq.to_le_bytes());
    record[16..24].copy_from_slice(&generation.to_le_bytes());
    let key_end = RECORD_HEADER_LEN + key.len();
    record[RECORD_HEADER_LEN..key_end].copy_from_slice(key);
    record[key_end..key_end + value.len()].copy_from_slice(value);
    let crc = crc32c::crc32c(&record[4..key_end + value.len()]);
    record[0..4].copy_from_slice(&crc.to_le_bytes());
    record
}

/// A record's key, version and generation; `None` for a free record; `Err` for one that fails
/// its check.
#[allow(clippy::type_complexity)]
fn decode_record(
    record: &[u8],
    geometry: &Geometry,
) -> Result<Option<(Vec<u8>, Version, u64)>, ()> {
    let state = record[4];
    if state == STATE_FREE && record[..RECORD_HEADER_LEN].iter().all(|byte| *byte == 0) {
        return Ok(None);
    }
    let key_len = usize::from(record[5]);
    let value_len = usize::from(u16::from_le_bytes([record[6], record[7]]));
    if !matches!(state, STATE_VERSION | STATE_DELETION)
        || key_len == 0
        || key_len > usize::from(geometry.key_max)
        || value_len > usize::from(geometry.value_max)
        || (state == STATE_DELETION && value_len != 0)
    {
        return Err(());
    }
    let end = RECORD_HEADER_LEN + key_len + value_len;
    let crc = u32::from_le_bytes(record[0..4].try_into().expect("4 bytes"));
    if crc != crc32c::crc32c(&record[4..end]) {
        return Err(());
    }
    let seq = u64::from_le_bytes(record[8..16].try_into().expect("8 bytes"));
    let generation = u64::from_le_bytes(record[16..24].try_into().expect("8 bytes"));
    let key = record[RECORD_HEADER_LEN..RECORD_HEADER_LEN + key_len].to_vec();
    let value = (state == STATE_VERSION).then(|| record[RECORD_HEADER_LEN + key_len..end].to_vec());
    Ok(Some((key, Version { seq, value }, generation)))
}

//! The PMNet device log: a superblock, then `slot_count` fixed-size slots, each holding at most
//! one logged packet.
//!
//! The device writes an update request into a free slot and acknowledges the client once
//! [`PmLog::write`] returns (the entry is durable then); it frees the slot with
//! [`PmLog::invalidate`] when the server has acknowledged the update. After a crash,
//! [`PmLog::open`] returns every entry still logged so the device can resend them. Choosing slots
//! and deduplicating entries is the caller's business: the log only stores and recovers.
//!
//! # Layout (version 1)
//!
//! All integers are little-endian. Offsets are in bytes.
//!
//! Superblock, at offset 0, 4096 bytes:
//!
//! | offset | size | field          | value                                              |
//! |--------|------|----------------|----------------------------------------------------|
//! | 0      | 8    | magic          | `b"PMNETLOG"`                                      |
//! | 8      | 4    | layout_version | u32, 1                                             |
//! | 12     | 4    | slot_size      | u32, multiple of 64, 128 ..= 1 MiB                 |
//! | 16     | 4    | slot_count     | u32, 1 ..= 2^24                                    |
//! | 20     | 40   | reserved       | zero                                               |
//! | 60     | 4    | crc            | u32, CRC-32C of bytes 0..60                        |
//! | 64     | 4032 | unused         | zero                                               |
//!
//! Slot `i` starts at `4096 + i * slot_size`. Its first 64 bytes (one cache line) are the header;
//! the packet follows it, so a slot holds at most `slot_size - 64` packet bytes.
//!
//! | offset | size | field          | value                                              |
//! |--------|------|----------------|----------------------------------------------------|
//! | 0      | 4    | state          | u32: FREE = 0, VALID = 0x564C_4944; else corrupt   |
//! | 4      | 4    | packet_len     | u32, ≤ slot_size - 64                              |
//! | 8      | 8    | session_id     | u64                                                |
//! | 16     | 4    | seq            | u32                                                |
//! | 20     | 2    | fragment_index | u16                                                |
//! | 22     | 2    | server_id      | u16                                                |
//! | 24     | 4    | slot_index     | u32, the slot's own index `i`                      |
//! | 28     | 1    | return_family  | u8: 0 none, 4 IPv4, 6 IPv6                         |
//! | 29     | 2    | return_port    | u16                                                |
//! | 31     | 16   | return_ip      | IPv4 in the first 4 bytes, or IPv6; zero when none |
//! | 47     | 13   | reserved       | zero                                               |
//! | 60     | 4    | crc            | u32, CRC-32C of header bytes 4..60, then the packet |
//! | 64     | len  | packet         | `packet_len` bytes                                 |
//!
//! The return address is where acknowledgements for the entry go (the client that sent it), so
//! a restarted device can still route them.
//!
//! The slot index inside the header makes an entry written to (or copied into) the wrong slot
//! fail its check. The state is outside the CRC because it is the commit word.
//!
//! # Crash consistency
//!
//! A write is two persists. First the whole header with state FREE and the packet are written,
//! flushed and fenced; then the state alone becomes VALID with one aligned 4-byte store, flushed
//! and fenced. A crash before the second fence leaves the state FREE (the entry is absent) or
//! VALID over a header and packet that are already durable. The CRC catches what that order
//! cannot: torn overwrites of a VALID slot and corruption at rest. Recovery frees such slots,
//! counts them and describes the first few; it never returns an entry whose bytes differ from what was written.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::ops::Range;

use crate::region::{MediumInfo, PmRegion, CACHE_LINE_SIZE};

mod batch;

pub use batch::{BatchStats, LogWork};

/// Bytes before the first slot.
pub const SUPERBLOCK_SIZE: usize = 4096;
/// First bytes of every pmnet log.
pub const MAGIC: [u8; 8] = *b"PMNETLOG";
/// The layout this build writes and reads.
pub const LAYOUT_VERSION: u32 = 1;
/// Bytes of slot header before the packet: one cache line.
pub const SLOT_HEADER_SIZE: usize = 64;
/// Smallest slot: a header and one cache line of packet.
pub const SLOT_SIZE_MIN: u32 = 128;
/// Largest slot: far above any datagram a device logs; bounds a corrupt superblock's claims.
pub const SLOT_SIZE_MAX: u32 = 1 << 20;
/// Most slots in one log: bounds recovery time and memory.
pub const SLOT_COUNT_MAX: u32 = 1 << 24;
/// Slot state of a slot holding no entry.
pub const STATE_FREE: u32 = 0;
/// Slot state of a committed entry: an unlikely bit pattern ("DILV" in memory), so that neither
/// zeroed nor random bytes read as committed.
pub const STATE_VALID: u32 = 0x564C_4944;

const _: () = assert!(SUPERBLOCK_SIZE % CACHE_LINE_SIZE == 0);
const _: () = assert!(SLOT_HEADER_SIZE == CACHE_LINE_SIZE);
const _: () = assert!(SLOT_SIZE_MIN as usize >= 2 * SLOT_HEADER_SIZE);

// Superblock field offsets.
const SB_MAGIC: usize = 0;
const SB_LAYOUT_VERSION: usize = 8;
const SB_SLOT_SIZE: usize = 12;
const SB_SLOT_COUNT: usize = 16;
const SB_CRC: usize = 60;
const SB_FIELDS_SIZE: usize = 64;

// Slot header field offsets.
const HEADER_STATE: usize = 0;
const HEADER_PACKET_LEN: usize = 4;
const HEADER_SESSION_ID: usize = 8;
const HEADER_SEQ: usize = 16;
const HEADER_FRAGMENT_INDEX: usize = 20;
const HEADER_SERVER_ID: usize = 22;
const HEADER_SLOT_INDEX: usize = 24;
const HEADER_RETURN_FAMILY: usize = 28;
const HEADER_RETURN_PORT: usize = 29;
const HEADER_RETURN_IP: usize = 31;
const HEADER_CRC: usize = 60;
/// The header bytes the CRC covers: everything but the state and the CRC itself.
const HEADER_CRC_COVERED: Range<usize> = HEADER_PACKET_LEN..HEADER_CRC;

/// What identifies a logged packet. Orders by server, session, sequence number, fragment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EntryKey {
    pub server_id: u16,
    pub session_id: u64,
    pub seq: u32,
    pub fragment_index: u16,
}

/// An entry found by [`PmLog::open`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoveredEntry {
    pub slot: u32,
    pub key: EntryKey,
    /// Where acknowledgements for the entry go, if it was logged with one.
    pub return_address: Option<SocketAddr>,
    pub packet: Vec<u8>,
}

/// What [`PmLog::open`] found.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LogRecovery {
    /// Committed entries with intact bytes, sorted by key (then slot).
    pub entries: Vec<RecoveredEntry>,
    /// Slots whose state was VALID over a bad checksum, length or slot index, or was neither
    /// FREE nor VALID: torn overwrites or corruption. They are FREE (and persisted) now.
    pub rejected_slot_count: u32,
    /// The first [`REJECTED_SLOTS_DESCRIBED`] of those slots, in slot order, with what their
    /// headers said.
    pub rejected_slots: Vec<RejectedSlot>,
}

/// Rejected slots [`LogRecovery`] describes one by one at most (it counts them all).
pub const REJECTED_SLOTS_DESCRIBED: usize = 32;

/// A slot [`PmLog::open`] rejected and freed: what was wrong and what its header recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RejectedSlot {
    pub slot: u32,
    pub damage: SlotDamage,
    /// The entry the header names, as stored.
    pub key: EntryKey,
    /// The packet length the header records, as stored.
    pub packet_len: u32,
    /// The header and packet still match their CRC: the fields above are the entry's own
    /// (only the state word or the slot index was damaged). Otherwise they are unverified.
    pub fields_verified: bool,
}

/// What was wrong with a rejected slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotDamage {
    /// The state word is neither FREE nor VALID.
    State(u32),
    /// The recorded packet length does not fit the slot.
    Length(u32),
    /// The header names another slot.
    SlotIndex(u32),
    /// Header and packet fail their CRC32C (a torn overwrite or corruption).
    Checksum,
}

impl fmt::Display for SlotDamage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SlotDamage::State(state) => {
                write!(f, "state word {state:#010x} is neither free nor valid")
            }
            SlotDamage::Length(len) => write!(f, "packet length {len} does not fit the slot"),
            SlotDamage::SlotIndex(index) => write!(f, "its header names slot {index}"),
            SlotDamage::Checksum => write!(f, "header and packet fail their CRC32C"),
        }
    }
}

impl fmt::Display for RejectedSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "slot {} ({}) held server {}, session {:#x}, seq {}, fragment {}, {} bytes{}",
            self.slot,
            self.damage,
            self.key.server_id,
            self.key.session_id,
            self.key.seq,
            self.key.fragment_index,
            self.packet_len,
            if self.fields_verified {
                ""
            } else {
                " (as its damaged header reads; unverified)"
            }
        )
    }
}

/// What [`scan_for_entries`] found in a region whose superblock cannot be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EntryScan {
    /// Slot headers marked VALID whose header and packet match their CRC32C.
    pub intact_entries: u32,
    /// The slot size most of those entries imply (none if only slot 0 was found).
    pub slot_size: Option<u32>,
}

/// Why a log could not be formatted or opened. Messages say what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LogError {
    #[error(
        "invalid log geometry: {slot_count} slots of {slot_size} bytes: {reason}; slot_size must \
         be a multiple of 64 in {SLOT_SIZE_MIN}..={SLOT_SIZE_MAX}, slot_count in \
         1..={SLOT_COUNT_MAX}"
    )]
    BadGeometry {
        slot_count: u32,
        slot_size: u32,
        reason: &'static str,
    },

    #[error(
        "region of {region_len} bytes is too small for a log of {slot_count} slots of \
         {slot_size} bytes, which needs {required_len}; make it at least that large or use \
         fewer or smaller slots"
    )]
    RegionTooSmall {
        region_len: usize,
        required_len: usize,
        slot_count: u32,
        slot_size: u32,
    },

    // The errors of `open` state what is wrong; what to do about it is the caller's to say
    // (restore the file, or format it and lose what it held).
    #[error(
        "{}",
        if *region_len == 0 {
            "it is empty (0 bytes): it was truncated, or never held a log".to_owned()
        } else {
            format!(
                "it is {region_len} bytes, shorter than a pmnet log's {SUPERBLOCK_SIZE}-byte \
                 superblock: it was truncated, or never held a log"
            )
        }
    )]
    NoSuperblock { region_len: usize },

    #[error(
        "its superblock is blank (all zero): it was erased or never written, and the log's \
         geometry with it"
    )]
    Unformatted,

    #[error(
        "it is not a pmnet log: it starts with {found_magic:02x?}, not \"PMNETLOG\" (another \
         kind of file, or a damaged superblock)"
    )]
    NotALog { found_magic: [u8; 8] },

    #[error(
        "it is a pmnet log of layout version {found}, and this build reads version \
         {LAYOUT_VERSION} (open it with the build that wrote it)"
    )]
    UnsupportedVersion { found: u32 },

    #[error(
        "its superblock is corrupt: checksum {stored_crc:#010x} stored, {computed_crc:#010x} \
         computed"
    )]
    SuperblockCorrupt { stored_crc: u32, computed_crc: u32 },

    #[error(
        "its superblock records {slot_count} slots of {slot_size} bytes, which this build does \
         not accept ({reason}): it was formatted differently, or the superblock is damaged"
    )]
    SuperblockGeometry {
        slot_count: u32,
        slot_size: u32,
        reason: &'static str,
    },

    #[error(
        "it is truncated: its superblock records {slot_count} slots of {slot_size} bytes \
         ({required_len} bytes with the superblock) but there are only {region_len}"
    )]
    Truncated {
        region_len: usize,
        required_len: usize,
        slot_count: u32,
        slot_size: u32,
    },
}

/// The PMNet device log over a region. See the module doc for the layout and crash model.
pub struct PmLog<R: PmRegion> {
    region: R,
    slot_count: u32,
    slot_size: u32,
}

impl<R: PmRegion> fmt::Debug for PmLog<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PmLog")
            .field("slot_count", &self.slot_count)
            .field("slot_size", &self.slot_size)
            .field("medium", &self.region.medium())
            .finish()
    }
}

impl<R: PmRegion> PmLog<R> {
    /// Bytes a region needs for `slot_count` slots of `slot_size` bytes. Saturates instead of
    /// overflowing, so a nonsensical geometry asks for an impossible size.
    pub fn required_region_len(slot_count: u32, slot_size: u32) -> usize {
        (slot_count as usize)
            .saturating_mul(slot_size as usize)
            .saturating_add(SUPERBLOCK_SIZE)
    }

    /// Erase `region` and lay out an empty log on it. Durable on return.
    pub fn format(mut region: R, slot_count: u32, slot_size: u32) -> Result<Self, LogError> {
        if let Err(reason) = check_geometry(slot_count, slot_size) {
            return Err(LogError::BadGeometry {
                slot_count,
                slot_size,
                reason,
            });
        }
        let required_len = Self::required_region_len(slot_count, slot_size);
        if region.len() < required_len {
            return Err(LogError::RegionTooSmall {
                region_len: region.len(),
                required_len,
                slot_count,
                slot_size,
            });
        }

        // Blank the superblock first: a crash part-way through leaves "unformatted", never an
        // old superblock over half-erased slots.
        region.write(0, &[0; SUPERBLOCK_SIZE]);
        region.persist(0, SUPERBLOCK_SIZE);

        let mut log = PmLog {
            region,
            slot_count,
            slot_size,
        };
        // A zeroed header is FREE; the stale packet bytes behind it are never read.
        for slot in 0..slot_count {
            let offset = log.slot_offset(slot);
            log.region.write(offset, &[0; SLOT_HEADER_SIZE]);
            log.region.flush(offset, SLOT_HEADER_SIZE);
        }
        log.region.fence();

        let superblock = encode_superblock(slot_count, slot_size);
        log.region.write(0, &superblock);
        log.region.persist(0, SB_FIELDS_SIZE);
        Ok(log)
    }

    /// Open the log on `region`: check the superblock, then recover every committed entry.
    /// Slots that fail their checks are freed (durably) and counted.
    pub fn open(region: R) -> Result<(Self, LogRecovery), LogError> {
        let (slot_count, slot_size) = check_layout(region.bytes())?;
        let mut log = PmLog {
            region,
            slot_count,
            slot_size,
        };

        let mut recovery = LogRecovery::default();
        for slot in 0..slot_count {
            match log.check_slot(slot) {
                SlotCheck::Free => {}
                SlotCheck::Valid(key, packet) => recovery.entries.push(RecoveredEntry {
                    slot,
                    key,
                    return_address: log.return_address(slot),
                    packet: packet.to_vec(),
                }),
                SlotCheck::Rejected(damage) => {
                    recovery.rejected_slot_count += 1;
                    if recovery.rejected_slots.len() < REJECTED_SLOTS_DESCRIBED {
                        recovery
                            .rejected_slots
                            .push(log.describe_rejected(slot, damage));
                    }
                    let offset = log.slot_offset(slot) + HEADER_STATE;
                    log.region.write(offset, &STATE_FREE.to_le_bytes());
                    log.region.flush(offset, 4);
                }
            }
        }
        if recovery.rejected_slot_count > 0 {
            log.region.fence();
        }
        recovery
            .entries
            .sort_by_key(|entry| (entry.key, entry.slot));
        assert!(
            recovery.entries.len() + recovery.rejected_slot_count as usize <= slot_count as usize
        );
        Ok((log, recovery))
    }

    /// Log `packet` under `key` in `slot`. Durable on return; until then a crash leaves the
    /// slot either without an entry or (only when the slot held one) with its old entry.
    ///
    /// Panics if `slot` is out of range or `packet` is longer than [`Self::max_packet_len`].
    pub fn write(&mut self, slot: u32, key: &EntryKey, packet: &[u8]) {
        self.write_with_return_address(slot, key, None, packet);
    }

    /// [`Self::write`], recording where acknowledgements for the entry go.
    pub fn write_with_return_address(
        &mut self,
        slot: u32,
        key: &EntryKey,
        return_address: Option<SocketAddr>,
        packet: &[u8],
    ) {
        self.write_payload(slot, key, return_address, packet);
        self.region.fence();
        self.write_state(slot, STATE_VALID);
        self.region.fence();
    }

    /// The stores and flushes of [`Self::write_with_return_address`] without its fences: the
    /// state a crash in the middle of a write finds. Only simulators call this, to build that
    /// state on a [`crate::SimRegion`] before crashing it; the entry is not durable.
    pub fn write_without_fences(
        &mut self,
        slot: u32,
        key: &EntryKey,
        return_address: Option<SocketAddr>,
        packet: &[u8],
    ) {
        self.write_payload(slot, key, return_address, packet);
        self.write_state(slot, STATE_VALID);
    }

    /// Free `slot`. Durable on return.
    pub fn invalidate(&mut self, slot: u32) {
        self.write_state(slot, STATE_FREE);
        self.region.fence();
    }

    /// Free every slot in `slots` with one fence. Durable on return.
    pub fn invalidate_batch(&mut self, slots: &[u32]) {
        if slots.is_empty() {
            return;
        }
        for slot in slots {
            self.write_state(*slot, STATE_FREE);
        }
        self.region.fence();
    }

    /// The entry in `slot`, if it is committed and intact.
    pub fn read(&self, slot: u32) -> Option<(EntryKey, &[u8])> {
        match self.check_slot(slot) {
            SlotCheck::Valid(key, packet) => Some((key, packet)),
            SlotCheck::Free | SlotCheck::Rejected(_) => None,
        }
    }

    pub fn slot_count(&self) -> u32 {
        self.slot_count
    }

    pub fn slot_size(&self) -> u32 {
        self.slot_size
    }

    /// The longest packet a slot holds.
    pub fn max_packet_len(&self) -> usize {
        self.slot_size as usize - SLOT_HEADER_SIZE
    }

    pub fn medium(&self) -> MediumInfo {
        self.region.medium()
    }

    pub fn region(&self) -> &R {
        &self.region
    }

    /// The region underneath, for tests and the simulator (corrupting it, crashing it). Writing
    /// through it bypasses the log's crash consistency.
    pub fn region_mut(&mut self) -> &mut R {
        &mut self.region
    }

    pub fn into_region(self) -> R {
        self.region
    }

    /// Bytes of the region that `slot` occupies, header included.
    pub fn slot_range(&self, slot: u32) -> Range<usize> {
        let offset = self.slot_offset(slot);
        offset..offset + self.slot_size as usize
    }

    fn slot_offset(&self, slot: u32) -> usize {
        assert!(
            slot < self.slot_count,
            "slot {slot} out of range: the log has {} slots",
            self.slot_count
        );
        SUPERBLOCK_SIZE + slot as usize * self.slot_size as usize
    }

    /// Write and flush the header (state FREE) and packet of `slot`; the caller fences.
    fn write_payload(
        &mut self,
        slot: u32,
        key: &EntryKey,
        return_address: Option<SocketAddr>,
        packet: &[u8],
    ) {
        assert!(
            packet.len() <= self.max_packet_len(),
            "packet of {} bytes exceeds the slot's {} bytes",
            packet.len(),
            self.max_packet_len()
        );
        let offset = self.slot_offset(slot);
        let header = encode_slot_header(slot, key, return_address, packet);
        self.region.write(offset, &header);
        self.region.write(offset + SLOT_HEADER_SIZE, packet);
        self.region.flush(offset, SLOT_HEADER_SIZE + packet.len());
    }

    /// Store `state` in `slot` with one aligned 4-byte store and flush it; the caller fences.
    fn write_state(&mut self, slot: u32, state: u32) {
        let offset = self.slot_offset(slot) + HEADER_STATE;
        debug_assert_eq!(offset % 4, 0);
        self.region.write(offset, &state.to_le_bytes());
        self.region.flush(offset, 4);
    }

    /// The return address recorded in `slot` (meaningful only for a valid slot).
    fn return_address(&self, slot: u32) -> Option<SocketAddr> {
        let offset = self.slot_offset(slot);
        header_return_address(&self.region.bytes()[offset..offset + SLOT_HEADER_SIZE])
    }

    /// Classify a slot from the region's bytes, trusting none of them.
    fn check_slot(&self, slot: u32) -> SlotCheck<'_> {
        let offset = self.slot_offset(slot);
        classify_slot(
            &self.region.bytes()[offset..offset + self.slot_size as usize],
            slot,
        )
    }

    /// What the header of rejected `slot` records (read before the slot is freed).
    fn describe_rejected(&self, slot: u32, damage: SlotDamage) -> RejectedSlot {
        let offset = self.slot_offset(slot);
        describe_rejected(
            &self.region.bytes()[offset..offset + self.slot_size as usize],
            slot,
            damage,
        )
    }
}

/// Classify the bytes of slot `slot` (the whole slot), trusting none of them.
fn classify_slot(bytes: &[u8], slot: u32) -> SlotCheck<'_> {
    let max_packet_len = bytes.len() - SLOT_HEADER_SIZE;
    let header = &bytes[..SLOT_HEADER_SIZE];
    match read_u32(header, HEADER_STATE) {
        STATE_FREE => return SlotCheck::Free,
        STATE_VALID => {}
        state => return SlotCheck::Rejected(SlotDamage::State(state)),
    }
    let packet_len = read_u32(header, HEADER_PACKET_LEN);
    if packet_len as usize > max_packet_len {
        return SlotCheck::Rejected(SlotDamage::Length(packet_len));
    }
    let slot_index = read_u32(header, HEADER_SLOT_INDEX);
    if slot_index != slot {
        return SlotCheck::Rejected(SlotDamage::SlotIndex(slot_index));
    }
    let packet = &bytes[SLOT_HEADER_SIZE..SLOT_HEADER_SIZE + packet_len as usize];
    if read_u32(header, HEADER_CRC) != slot_crc(header, packet) {
        return SlotCheck::Rejected(SlotDamage::Checksum);
    }
    SlotCheck::Valid(header_key(header), packet)
}

/// What the header of a rejected slot (its whole bytes) records.
fn describe_rejected(bytes: &[u8], slot: u32, damage: SlotDamage) -> RejectedSlot {
    let max_packet_len = bytes.len() - SLOT_HEADER_SIZE;
    let header = &bytes[..SLOT_HEADER_SIZE];
    let packet_len = read_u32(header, HEADER_PACKET_LEN);
    let fields_verified = packet_len as usize <= max_packet_len && {
        let packet = &bytes[SLOT_HEADER_SIZE..SLOT_HEADER_SIZE + packet_len as usize];
        read_u32(header, HEADER_CRC) == slot_crc(header, packet)
    };
    RejectedSlot {
        slot,
        damage,
        key: header_key(header),
        packet_len,
        fields_verified,
    }
}

/// The return address a slot header records (meaningful only for a valid slot).
fn header_return_address(header: &[u8]) -> Option<SocketAddr> {
    let port = read_u16(header, HEADER_RETURN_PORT);
    let ip_bytes = &header[HEADER_RETURN_IP..HEADER_RETURN_IP + 16];
    let ip = match header[HEADER_RETURN_FAMILY] {
        4 => IpAddr::V4(Ipv4Addr::new(
            ip_bytes[0],
            ip_bytes[1],
            ip_bytes[2],
            ip_bytes[3],
        )),
        6 => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(ip_bytes).ok()?)),
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

/// What [`inspect`] found in a log, read without changing a byte.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogInspection {
    /// The geometry the superblock records.
    pub slot_count: u32,
    pub slot_size: u32,
    /// Bytes given, and bytes the geometry needs.
    pub region_len: usize,
    pub required_len: usize,
    /// Slots wholly within the bytes given (fewer than `slot_count` when truncated).
    pub slots_present: u32,
    /// Committed entries with intact bytes, in slot order: what [`PmLog::open`] would recover.
    pub entries: Vec<RecoveredEntry>,
    /// Every slot [`PmLog::open`] would reject and free, in slot order.
    pub damaged: Vec<RejectedSlot>,
}

impl LogInspection {
    /// The bytes end before the last slot.
    pub fn is_truncated(&self) -> bool {
        self.slots_present < self.slot_count
    }
}

/// Read a log in `region_bytes` (a file's contents) the way [`PmLog::open`] does, with the same
/// checks, but without writing anything: rejected slots are reported, not freed. A log whose
/// bytes end early is read as far as whole slots go. Errors: the bytes hold no log this build
/// reads (no superblock, blank, not a log, another version, a corrupt superblock).
pub fn inspect(region_bytes: &[u8]) -> Result<LogInspection, LogError> {
    let (slot_count, slot_size) = decode_superblock(region_bytes)?;
    let required_len = PmLog::<crate::SimRegion>::required_region_len(slot_count, slot_size);
    let slots_present = u32::try_from(
        (region_bytes.len().saturating_sub(SUPERBLOCK_SIZE) / slot_size as usize)
            .min(slot_count as usize),
    )
    .expect("at most slot_count");
    let mut inspection = LogInspection {
        slot_count,
        slot_size,
        region_len: region_bytes.len(),
        required_len,
        slots_present,
        entries: Vec::new(),
        damaged: Vec::new(),
    };
    for slot in 0..slots_present {
        let offset = SUPERBLOCK_SIZE + slot as usize * slot_size as usize;
        let bytes = &region_bytes[offset..offset + slot_size as usize];
        match classify_slot(bytes, slot) {
            SlotCheck::Free => {}
            SlotCheck::Valid(key, packet) => inspection.entries.push(RecoveredEntry {
                slot,
                key,
                return_address: header_return_address(&bytes[..SLOT_HEADER_SIZE]),
                packet: packet.to_vec(),
            }),
            SlotCheck::Rejected(damage) => inspection
                .damaged
                .push(describe_rejected(bytes, slot, damage)),
        }
    }
    Ok(inspection)
}

enum SlotCheck<'a> {
    Free,
    Valid(EntryKey, &'a [u8]),
    Rejected(SlotDamage),
}

/// The entry a slot header names (trusted only once the header's CRC is checked).
fn header_key(header: &[u8]) -> EntryKey {
    EntryKey {
        server_id: read_u16(header, HEADER_SERVER_ID),
        session_id: read_u64(header, HEADER_SESSION_ID),
        seq: read_u32(header, HEADER_SEQ),
        fragment_index: read_u16(header, HEADER_FRAGMENT_INDEX),
    }
}

/// Check that `region_bytes` hold a log this build opens, superblock and length: its geometry.
pub(crate) fn check_layout(region_bytes: &[u8]) -> Result<(u32, u32), LogError> {
    let (slot_count, slot_size) = decode_superblock(region_bytes)?;
    let required_len = PmLog::<crate::SimRegion>::required_region_len(slot_count, slot_size);
    if region_bytes.len() < required_len {
        return Err(LogError::Truncated {
            region_len: region_bytes.len(),
            required_len,
            slot_count,
            slot_size,
        });
    }
    Ok((slot_count, slot_size))
}

/// Look for committed entries in a region whose superblock cannot be used: every cache line
/// past the superblock that starts with the VALID state word is taken for a slot header, and
/// counted if its header and packet match their CRC32C. A slot header names its own slot, so
/// each one found also says what slot size the log had. One read per 64 bytes, plus a CRC for
/// each candidate; nothing is written.
pub fn scan_for_entries(region_bytes: &[u8]) -> EntryScan {
    let mut scan = EntryScan::default();
    let mut sizes: Vec<u32> = Vec::new();
    let mut offset = SUPERBLOCK_SIZE;
    while offset + SLOT_HEADER_SIZE <= region_bytes.len() {
        let header = &region_bytes[offset..offset + SLOT_HEADER_SIZE];
        offset += SLOT_HEADER_SIZE;
        if read_u32(header, HEADER_STATE) != STATE_VALID {
            continue;
        }
        let packet_len = read_u32(header, HEADER_PACKET_LEN) as usize;
        let packet_start = offset;
        if packet_len > SLOT_SIZE_MAX as usize - SLOT_HEADER_SIZE
            || packet_start + packet_len > region_bytes.len()
        {
            continue;
        }
        let packet = &region_bytes[packet_start..packet_start + packet_len];
        if read_u32(header, HEADER_CRC) != slot_crc(header, packet) {
            continue;
        }
        scan.intact_entries += 1;
        let slot = read_u32(header, HEADER_SLOT_INDEX);
        let distance = (packet_start - SLOT_HEADER_SIZE - SUPERBLOCK_SIZE) as u64;
        if slot > 0 && distance % u64::from(slot) == 0 {
            if let Ok(size) = u32::try_from(distance / u64::from(slot)) {
                if check_geometry(slot + 1, size).is_ok() {
                    sizes.push(size);
                }
            }
        }
    }
    // The size most entries imply (a stray match inside a packet does not outvote them).
    sizes.sort_unstable();
    scan.slot_size = sizes
        .chunk_by(|a, b| a == b)
        .max_by_key(|run| run.len())
        .map(|run| run[0]);
    scan
}

fn check_geometry(slot_count: u32, slot_size: u32) -> Result<(), &'static str> {
    if slot_count == 0 {
        return Err("slot_count is zero");
    }
    if slot_count > SLOT_COUNT_MAX {
        return Err("slot_count is too large");
    }
    if slot_size < SLOT_SIZE_MIN {
        return Err("slot_size is too small");
    }
    if slot_size > SLOT_SIZE_MAX {
        return Err("slot_size is too large");
    }
    if slot_size as usize % CACHE_LINE_SIZE != 0 {
        return Err("slot_size is not a multiple of 64");
    }
    Ok(())
}

fn encode_superblock(slot_count: u32, slot_size: u32) -> [u8; SB_FIELDS_SIZE] {
    let mut superblock = [0u8; SB_FIELDS_SIZE];
    superblock[SB_MAGIC..SB_MAGIC + 8].copy_from_slice(&MAGIC);
    superblock[SB_LAYOUT_VERSION..SB_LAYOUT_VERSION + 4]
        .copy_from_slice(&LAYOUT_VERSION.to_le_bytes());
    superblock[SB_SLOT_SIZE..SB_SLOT_SIZE + 4].copy_from_slice(&slot_size.to_le_bytes());
    superblock[SB_SLOT_COUNT..SB_SLOT_COUNT + 4].copy_from_slice(&slot_count.to_le_bytes());
    let crc = crc32c::crc32c(&superblock[..SB_CRC]);
    superblock[SB_CRC..SB_CRC + 4].copy_from_slice(&crc.to_le_bytes());
    superblock
}

/// The geometry a superblock records, if it is one this build accepts.
fn decode_superblock(region_bytes: &[u8]) -> Result<(u32, u32), LogError> {
    if region_bytes.len() < SUPERBLOCK_SIZE {
        return Err(LogError::NoSuperblock {
            region_len: region_bytes.len(),
        });
    }
    let superblock = &region_bytes[..SB_FIELDS_SIZE];
    let mut found_magic = [0u8; 8];
    found_magic.copy_from_slice(&superblock[SB_MAGIC..SB_MAGIC + 8]);
    if found_magic != MAGIC {
        if superblock.iter().all(|b| *b == 0) {
            return Err(LogError::Unformatted);
        }
        return Err(LogError::NotALog { found_magic });
    }
    // The CRC before the version: a version field that reads wrong because of a flipped bit is
    // corruption, not a newer layout.
    let stored_crc = read_u32(superblock, SB_CRC);
    let computed_crc = crc32c::crc32c(&superblock[..SB_CRC]);
    if stored_crc != computed_crc {
        return Err(LogError::SuperblockCorrupt {
            stored_crc,
            computed_crc,
        });
    }
    let found = read_u32(superblock, SB_LAYOUT_VERSION);
    if found != LAYOUT_VERSION {
        return Err(LogError::UnsupportedVersion { found });
    }
    let slot_size = read_u32(superblock, SB_SLOT_SIZE);
    let slot_count = read_u32(superblock, SB_SLOT_COUNT);
    if let Err(reason) = check_geometry(slot_count, slot_size) {
        return Err(LogError::SuperblockGeometry {
            slot_count,
            slot_size,
            reason,
        });
    }
    Ok((slot_count, slot_size))
}

fn encode_slot_header(
    slot: u32,
    key: &EntryKey,
    return_address: Option<SocketAddr>,
    packet: &[u8],
) -> [u8; SLOT_HEADER_SIZE] {
    let packet_len = u32::try_from(packet.len()).expect("bounded by max_packet_len");
    let mut header = [0u8; SLOT_HEADER_SIZE];
    header[HEADER_STATE..HEADER_STATE + 4].copy_from_slice(&STATE_FREE.to_le_bytes());
    header[HEADER_PACKET_LEN..HEADER_PACKET_LEN + 4].copy_from_slice(&packet_len.to_le_bytes());
    header[HEADER_SESSION_ID..HEADER_SESSION_ID + 8].copy_from_slice(&key.session_id.to_le_bytes());
    header[HEADER_SEQ..HEADER_SEQ + 4].copy_from_slice(&key.seq.to_le_bytes());
    header[HEADER_FRAGMENT_INDEX..HEADER_FRAGMENT_INDEX + 2]
        .copy_from_slice(&key.fragment_index.to_le_bytes());
    header[HEADER_SERVER_ID..HEADER_SERVER_ID + 2].copy_from_slice(&key.server_id.to_le_bytes());
    header[HEADER_SLOT_INDEX..HEADER_SLOT_INDEX + 4].copy_from_slice(&slot.to_le_bytes());
    if let Some(address) = return_address {
        header[HEADER_RETURN_PORT..HEADER_RETURN_PORT + 2]
            .copy_from_slice(&address.port().to_le_bytes());
        let ip = HEADER_RETURN_IP;
        match address.ip() {
            IpAddr::V4(v4) => {
                header[HEADER_RETURN_FAMILY] = 4;
                header[ip..ip + 4].copy_from_slice(&v4.octets());
            }
            IpAddr::V6(v6) => {
                header[HEADER_RETURN_FAMILY] = 6;
                header[ip..ip + 16].copy_from_slice(&v6.octets());
            }
        }
    }
    let crc = slot_crc(&header, packet);
    header[HEADER_CRC..HEADER_CRC + 4].copy_from_slice(&crc.to_le_bytes());
    header
}

fn slot_crc(header: &[u8], packet: &[u8]) -> u32 {
    let crc = crc32c::crc32c(&header[HEADER_CRC_COVERED]);
    crc32c::crc32c_append(crc, packet)
}

fn read_u16(bytes: &[u8], offset: usize) -> u16 {
    let mut word = [0u8; 2];
    word.copy_from_slice(&bytes[offset..offset + 2]);
    u16::from_le_bytes(word)
}

fn read_u32(bytes: &[u8], offset: usize) -> u32 {
    let mut word = [0u8; 4];
    word.copy_from_slice(&bytes[offset..offset + 4]);
    u32::from_le_bytes(word)
}

fn read_u64(bytes: &[u8], offset: usize) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[offset..offset + 8]);
    u64::from_le_bytes(word)
}

#[cfg(test)]
mod tests;

//! The PMNet wire format.
//!
//! Every PMNet datagram is a 32-byte header followed by `payload_len` payload bytes, carried in
//! one UDP datagram. All integers are big-endian (network order). `docs/protocol.md` is the
//! specification; the golden vectors there are the ones this crate's tests check.
//!
//! | offset | size | field            |
//! |-------:|-----:|------------------|
//! | 0      | 2    | magic `0x504E` ("PN") |
//! | 2      | 1    | version (1)      |
//! | 3      | 1    | packet type      |
//! | 4      | 2    | flags            |
//! | 6      | 2    | server id        |
//! | 8      | 8    | session id       |
//! | 16     | 4    | sequence number  |
//! | 20     | 2    | fragment index   |
//! | 22     | 2    | fragment count   |
//! | 24     | 2    | payload length   |
//! | 26     | 2    | device id        |
//! | 28     | 4    | CRC32C of bytes 0..28 and the payload |
//!
//! Two layers, after smoltcp: [`Packet`] is a view over bytes whose accessors cannot panic once
//! [`Packet::new_checked`] succeeded; [`Header`] is the parsed, validated value with
//! [`Header::parse`] and [`Header::emit`]. The view has setters as well, for a writer that
//! builds or patches a header in place; [`Header::emit_header`] writes a whole header in front
//! of a payload already in its buffer. Parsing never panics and every rejection names its
//! reason ([`ParseError`]), so callers can count drops by reason.

pub mod abd;
pub mod batch;
pub mod cache;
pub mod netchain;
pub mod replication;
pub mod route;
pub use batch::{batch_entries, batch_entry_len, encode_batch, BatchEntries};
use std::fmt;

/// Bytes 0..2 of every PMNet datagram: "PN".
pub const MAGIC: u16 = 0x504E;
/// The only version this crate speaks.
pub const VERSION: u8 = 1;
/// Size of the fixed header.
pub const HEADER_LEN: usize = 32;
/// Largest UDP payload over IPv4; no PMNet datagram is larger.
pub const MAX_DATAGRAM_LEN: usize = 65_507;
/// Largest datagram that fits a 1500-byte Ethernet MTU without IP fragmentation.
pub const DEFAULT_MAX_DATAGRAM_LEN: usize = 1472;
/// Largest payload one datagram can carry (limited by the 16-bit length field).
pub const MAX_PAYLOAD_LEN: usize = MAX_DATAGRAM_LEN - HEADER_LEN;
/// Most fragments one message may have: a 1 MiB request in 256-byte fragments. A header
/// claiming more is rejected as [`ParseError::BadFragment`], so no receiver sizes a
/// reassembly from a count a sender made up.
pub const MAX_FRAGMENT_COUNT: u16 = 4096;
/// Spare capacity of every datagram [`Header::encode`] makes, so that an authentication
/// trailer (30 bytes, `pmnet-auth`) is appended without moving the datagram.
pub const TRAILER_ROOM: usize = 32;

/// A copy of `datagram` to send, with [`TRAILER_ROOM`] spare capacity.
pub fn to_sendable(datagram: &[u8]) -> Vec<u8> {
    let mut copy = Vec::with_capacity(datagram.len() + TRAILER_ROOM);
    copy.extend_from_slice(datagram);
    copy
}
/// Longest a client keeps trying one request, from its first transmission: after this it
/// reports the request failed and accepts no acknowledgement of it any more. A server may
/// skip a sequence number that no device holds once a gap at it has lasted longer than this
/// (see `docs/protocol.md`, "Gaps the client left").
pub const MAX_REQUEST_LIFETIME_MS: u64 = 15_000;

/// Byte ranges of the header fields.
pub mod field {
    use std::ops::Range;
    pub const MAGIC: Range<usize> = 0..2;
    pub const VERSION: usize = 2;
    pub const TYPE: usize = 3;
    pub const FLAGS: Range<usize> = 4..6;
    pub const SERVER_ID: Range<usize> = 6..8;
    pub const SESSION_ID: Range<usize> = 8..16;
    pub const SEQ: Range<usize> = 16..20;
    pub const FRAGMENT_INDEX: Range<usize> = 20..22;
    pub const FRAGMENT_COUNT: Range<usize> = 22..24;
    pub const PAYLOAD_LEN: Range<usize> = 24..26;
    pub const DEVICE_ID: Range<usize> = 26..28;
    pub const CRC: Range<usize> = 28..32;
    /// The header bytes the CRC covers (everything before the CRC field).
    pub const CRC_COVERED: Range<usize> = 0..28;
}

/// The packet types of PMNet.
///
/// Type codes are grouped so later in-network functions have room of their own:
/// `0x01..=0x0F` the core protocol (below), `0x10..=0x1F` the read cache, `0x20..=0x2F` chain
/// replication, `0x30..=0x3F` ABD quorum registers. A code in those ranges parses as
/// [`PacketType::Reserved`], so that a device pipeline can offer it to the function that owns
/// it (and count and drop it when none does); any other undefined code is rejected as
/// [`ParseError::UnknownType`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PacketType {
    /// Client → server: a request whose reply is fixed. Logged by a device, which acks it early.
    UpdateRequest,
    /// Client → server: a request whose reply depends on server state. Never logged or acked
    /// by a device; completes only on the server's reply.
    BypassRequest,
    /// Device → client: fragment `(session, seq, fragment)` is durable in the log of `device_id`.
    PmnetAck,
    /// Server → client (through devices): request `(session, seq)` is applied and durable at the
    /// server; the payload is (one fragment of) the server's reply. Devices drop the log entries
    /// of that request when they see it.
    ServerAck,
    /// Server → device → client: the server is missing fragment `(session, seq, fragment)`
    /// (or every fragment of `seq` with [`flags::ALL_FRAGMENTS`]). A device answers from its log
    /// if it can, and passes the request on to the client otherwise.
    RetransmitRequest,
    /// Server → device: the server has (re)started; resend every live log entry for
    /// `server_id`, in per-session sequence order, then send [`PacketType::RecoveryDone`].
    RecoveryPoll,
    /// Device → server: the answer to a recovery poll. The payload is the number of live
    /// entries the device holds for the server and is resending, in order (u32, big-endian).
    RecoveryDone,
    /// Server → device: the server will skip sequence numbers `seq ..= last` of the session
    /// (payload: `last`, u32) unless the device holds one of them whole. Sent only after a gap
    /// outlived [`MAX_REQUEST_LIFETIME_MS`].
    FillQuery,
    /// Device → server: the answer to a [`PacketType::FillQuery`] for `seq ..= last`. The
    /// payload is `last` and the lowest sequence number of the range for which the device
    /// holds every fragment (`last + 1` if none), two u32s; that request is being resent.
    FillReply,
    /// Device → client: the device could not log update fragment `(session, seq, fragment)`
    /// and forwarded it without an ack. The payload is one byte: why
    /// ([`NotLoggedReason`]). The client then completes only on the server's reply.
    NotLogged,
    /// Device ↔ server: several complete datagrams for one peer (see [`batch`]); the receiver
    /// handles each as if it had arrived on its own.
    Batch,
    /// Device → server, and the server's answer: "do you verify what I send, and do I verify
    /// what you send?" Empty; `seq` is the probe's number, which the answer repeats. A device
    /// acks nothing for a server until such an answer (or a server-ACK) from it verified
    /// (docs/security.md, "Devices and their servers"). A device answers a probe from the
    /// device before it in a chain the same way.
    Probe,
    /// Server → device: "do you hold an entry of any of these sessions?" The payload lists
    /// 1 to [`HOLD_QUERY_SESSIONS_MAX`] session ids (u64 each); `seq` is the query's number,
    /// which the answer repeats. A server forgets a session only once no device can still
    /// resend a request of it (docs/protocol.md, "Sessions").
    HoldQuery,
    /// Device → server: the answer to a [`PacketType::HoldQuery`] (the same `seq`): u16, the
    /// number of sessions asked about, then a bitmap, one bit per session in the query's
    /// order (bit 7 of the first byte first): set when the device — or a device before it
    /// in a chain — holds an entry of that session for the server.
    HoldReply,
    /// A code in `0x10..=0x3F`, reserved for the in-network functions (see above): carried
    /// through parsing untouched for the stage that owns it.
    Reserved(u8),
}

/// The type codes reserved for the in-network functions.
pub const RESERVED_TYPE_CODES: std::ops::RangeInclusive<u8> = 0x10..=0x3F;

impl PacketType {
    /// Every type this version defines.
    pub const ALL: [PacketType; 14] = [
        PacketType::UpdateRequest,
        PacketType::BypassRequest,
        PacketType::PmnetAck,
        PacketType::ServerAck,
        PacketType::RetransmitRequest,
        PacketType::RecoveryPoll,
        PacketType::RecoveryDone,
        PacketType::FillQuery,
        PacketType::FillReply,
        PacketType::NotLogged,
        PacketType::Batch,
        PacketType::Probe,
        PacketType::HoldQuery,
        PacketType::HoldReply,
    ];

    /// The type with code `code`, if this version defines or reserves one.
    pub fn from_code(code: u8) -> Option<PacketType> {
        if RESERVED_TYPE_CODES.contains(&code) {
            return Some(PacketType::Reserved(code));
        }
        PacketType::ALL.into_iter().find(|t| t.code() == code)
    }

    /// The type's code on the wire.
    pub fn code(self) -> u8 {
        match self {
            PacketType::UpdateRequest => 0x01,
            PacketType::BypassRequest => 0x02,
            PacketType::PmnetAck => 0x03,
            PacketType::ServerAck => 0x04,
            PacketType::RetransmitRequest => 0x05,
            PacketType::RecoveryPoll => 0x06,
            PacketType::RecoveryDone => 0x07,
            PacketType::FillQuery => 0x08,
            PacketType::FillReply => 0x09,
            PacketType::NotLogged => 0x0A,
            PacketType::Batch => 0x0B,
            PacketType::Probe => 0x0C,
            PacketType::HoldQuery => 0x0D,
            PacketType::HoldReply => 0x0E,
            PacketType::Reserved(code) => code,
        }
    }

    /// Short stable name, used for counters and traces.
    pub fn name(self) -> &'static str {
        match self {
            PacketType::UpdateRequest => "update",
            PacketType::BypassRequest => "bypass",
            PacketType::PmnetAck => "pmnet_ack",
            PacketType::ServerAck => "server_ack",
            PacketType::RetransmitRequest => "retransmit_request",
            PacketType::RecoveryPoll => "recovery_poll",
            PacketType::RecoveryDone => "recovery_done",
            PacketType::FillQuery => "fill_query",
            PacketType::FillReply => "fill_reply",
            PacketType::NotLogged => "not_logged",
            PacketType::Batch => "batch",
            PacketType::Probe => "probe",
            PacketType::HoldQuery => "hold_query",
            PacketType::HoldReply => "hold_reply",
            PacketType::Reserved(_) => "reserved",
        }
    }

    /// Whether a client sends this type (requests travel client → server).
    pub fn is_request(self) -> bool {
        matches!(self, PacketType::UpdateRequest | PacketType::BypassRequest)
    }
}

impl fmt::Display for PacketType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Flag bits. Bits 0–7 belong to the core protocol, bits 8–15 are reserved for the later
/// in-network functions; unknown bits are carried through untouched.
pub mod flags {
    /// Server-ACK answering a duplicate or redone request that was already applied: the
    /// "make-up" ACK. Its payload is the reply stored when the request was first applied.
    pub const MAKEUP: u16 = 1 << 0;
    /// Make-up server-ACK whose original reply is no longer kept; the payload is empty. The
    /// request *was* applied exactly once.
    pub const REPLY_UNAVAILABLE: u16 = 1 << 1;
    /// Retransmission request for every fragment of the sequence number.
    pub const ALL_FRAGMENTS: u16 = 1 << 2;
    /// Bypass request with an empty payload that fills a sequence number the client gave up
    /// on, so that the session's later requests can be applied. Sent when the client gives
    /// up and again in answer to a retransmission request; the server applies it as an empty
    /// request.
    pub const NOOP_FILL: u16 = 1 << 3;
    /// Make-up server-ACK for a sequence number the server skipped or filled: the request
    /// was never applied and never will be. A client still waiting reports it failed.
    pub const SKIPPED: u16 = 1 << 4;
    /// The datagram ends in an authentication trailer (a key id, a nonce and an AES-256-GCM
    /// tag over everything before it) that `payload_len` does not count. See `pmnet-auth` and
    /// docs/security.md.
    pub const AUTHENTICATED: u16 = 1 << 5;
    /// With [`AUTHENTICATED`]: the payload is AES-256-GCM ciphertext (the CRC covers the
    /// ciphertext). Only the key holders read it.
    pub const ENCRYPTED: u16 = 1 << 6;
    /// A probe's answer ([`crate::PacketType::Probe`]): nobody answers it, so that a probe
    /// with a forged source (another server, a device, the receiver itself) cannot start two
    /// endpoints answering each other for ever.
    pub const ANSWER: u16 = 1 << 7;
}

/// Why a device forwarded an update fragment without logging it ([`PacketType::NotLogged`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum NotLoggedReason {
    /// Every live-entry slot is taken: the server has not acked what the log holds.
    LogFull = 1,
    /// The slots the fragment hashes to are taken.
    Collision = 2,
    /// The fragment is larger than a slot.
    TooLarge = 3,
    /// The device has not yet verified that its server accepts what it forwards and sends
    /// what it can verify (the server is down, or the two hold different keys): it acks
    /// nothing for that server until it has.
    ServerUnverified = 4,
}

impl NotLoggedReason {
    /// The reason with code `code`, if defined.
    pub fn from_code(code: u8) -> Option<NotLoggedReason> {
        [
            NotLoggedReason::LogFull,
            NotLoggedReason::Collision,
            NotLoggedReason::TooLarge,
            NotLoggedReason::ServerUnverified,
        ]
        .into_iter()
        .find(|reason| *reason as u8 == code)
    }

    /// Words for messages.
    pub fn describe(self) -> &'static str {
        match self {
            NotLoggedReason::LogFull => "the device's log is full",
            NotLoggedReason::Collision => "the device's log slots for it were taken",
            NotLoggedReason::TooLarge => "the request is larger than a device log slot",
            NotLoggedReason::ServerUnverified => {
                "the device has not verified its server (it is down, or it and the device \
                 hold different --key-file keys: the device's log says which)"
            }
        }
    }
}

/// Why a datagram was rejected. Every variant has a stable [`ParseError::reason`] for counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ParseError {
    /// Shorter than the header, or shorter than the header's payload length says.
    Truncated,
    /// Longer than the header's payload length says.
    TrailingBytes,
    /// Bytes 0..2 are not [`MAGIC`]: not a PMNet datagram.
    BadMagic,
    /// A version this implementation does not speak.
    UnsupportedVersion,
    /// The CRC32C does not match: corrupted in flight.
    BadChecksum,
    /// A type code this version does not define.
    UnknownType,
    /// Fragment count zero or above [`MAX_FRAGMENT_COUNT`], or fragment index not below the
    /// count.
    BadFragment,
}

impl ParseError {
    /// Every reason, for registering counters.
    pub const ALL: [ParseError; 7] = [
        ParseError::Truncated,
        ParseError::TrailingBytes,
        ParseError::BadMagic,
        ParseError::UnsupportedVersion,
        ParseError::BadChecksum,
        ParseError::UnknownType,
        ParseError::BadFragment,
    ];

    /// Short stable name, used for counters.
    pub fn reason(self) -> &'static str {
        match self {
            ParseError::Truncated => "truncated",
            ParseError::TrailingBytes => "trailing_bytes",
            ParseError::BadMagic => "bad_magic",
            ParseError::UnsupportedVersion => "unsupported_version",
            ParseError::BadChecksum => "bad_checksum",
            ParseError::UnknownType => "unknown_type",
            ParseError::BadFragment => "bad_fragment",
        }
    }
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.reason())
    }
}

impl std::error::Error for ParseError {}

/// A view over the bytes of a PMNet datagram.
#[derive(Debug, Clone, Copy)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

fn read_u16(bytes: &[u8], at: std::ops::Range<usize>) -> u16 {
    u16::from_be_bytes([bytes[at.start], bytes[at.start + 1]])
}

fn read_u32(bytes: &[u8], at: std::ops::Range<usize>) -> u32 {
    let mut word = [0u8; 4];
    word.copy_from_slice(&bytes[at]);
    u32::from_be_bytes(word)
}

fn write_u16(bytes: &mut [u8], at: std::ops::Range<usize>, value: u16) {
    bytes[at].copy_from_slice(&value.to_be_bytes());
}

fn write_u32(bytes: &mut [u8], at: std::ops::Range<usize>, value: u32) {
    bytes[at].copy_from_slice(&value.to_be_bytes());
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wrap bytes without checking them; accessors may panic if the buffer is too short.
    pub fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wrap bytes after checking what the accessors rely on: the header is present, it is
    /// ours (magic, version), and the datagram length matches the payload length field.
    /// The checksum and the field values are checked by [`Header::parse`].
    pub fn new_checked(buffer: T) -> Result<Packet<T>, ParseError> {
        let packet = Packet { buffer };
        let bytes = packet.buffer.as_ref();
        if bytes.len() < HEADER_LEN {
            // A short datagram that does not even start like ours is better reported as such.
            if bytes.len() >= 2 && read_u16(bytes, field::MAGIC) != MAGIC {
                return Err(ParseError::BadMagic);
            }
            return Err(ParseError::Truncated);
        }
        if packet.magic() != MAGIC {
            return Err(ParseError::BadMagic);
        }
        if packet.version() != VERSION {
            return Err(ParseError::UnsupportedVersion);
        }
        let expected_len = HEADER_LEN + usize::from(packet.payload_len());
        match bytes.len().cmp(&expected_len) {
            std::cmp::Ordering::Less => Err(ParseError::Truncated),
            std::cmp::Ordering::Greater => Err(ParseError::TrailingBytes),
            std::cmp::Ordering::Equal => Ok(packet),
        }
    }

    /// The underlying bytes.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    pub fn magic(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::MAGIC)
    }
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[field::VERSION]
    }
    pub fn type_code(&self) -> u8 {
        self.buffer.as_ref()[field::TYPE]
    }
    pub fn flags(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::FLAGS)
    }
    pub fn server_id(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::SERVER_ID)
    }
    pub fn session_id(&self) -> u64 {
        let mut word = [0u8; 8];
        word.copy_from_slice(&self.buffer.as_ref()[field::SESSION_ID]);
        u64::from_be_bytes(word)
    }
    pub fn seq(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::SEQ)
    }
    pub fn fragment_index(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::FRAGMENT_INDEX)
    }
    pub fn fragment_count(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::FRAGMENT_COUNT)
    }
    pub fn payload_len(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::PAYLOAD_LEN)
    }
    pub fn device_id(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::DEVICE_ID)
    }
    pub fn crc(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::CRC)
    }

    /// The payload bytes (valid after [`Packet::new_checked`]).
    pub fn payload(&self) -> &[u8] {
        let end = HEADER_LEN + usize::from(self.payload_len());
        &self.buffer.as_ref()[HEADER_LEN..end]
    }

    /// The CRC32C the header's CRC field should hold for these bytes.
    pub fn compute_crc(&self) -> u32 {
        self.compute_crc_for(self.payload())
    }

    /// The CRC32C the header's CRC field should hold for this header followed by `payload`:
    /// for a header whose payload is not behind it in the buffer (the buffer may then be the
    /// header alone).
    pub fn compute_crc_for(&self, payload: &[u8]) -> u32 {
        let crc = crc32c::crc32c(&self.buffer.as_ref()[field::CRC_COVERED]);
        crc32c::crc32c_append(crc, payload)
    }

    /// Whether the CRC field matches the bytes.
    pub fn verify_checksum(&self) -> bool {
        self.crc() == self.compute_crc()
    }
}

/// The write side of the view: setters for every header field, and the CRC. A setter writes
/// its field only; [`Packet::fill_checksum`] makes the CRC match afterwards. Like the
/// accessors, they may panic on a buffer shorter than the header (or than the payload length
/// says, for the payload and the checksum).
impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    pub fn set_magic(&mut self, value: u16) {
        write_u16(self.buffer.as_mut(), field::MAGIC, value);
    }
    pub fn set_version(&mut self, value: u8) {
        self.buffer.as_mut()[field::VERSION] = value;
    }
    pub fn set_type_code(&mut self, value: u8) {
        self.buffer.as_mut()[field::TYPE] = value;
    }
    pub fn set_flags(&mut self, value: u16) {
        write_u16(self.buffer.as_mut(), field::FLAGS, value);
    }
    pub fn set_server_id(&mut self, value: u16) {
        write_u16(self.buffer.as_mut(), field::SERVER_ID, value);
    }
    pub fn set_session_id(&mut self, value: u64) {
        self.buffer.as_mut()[field::SESSION_ID].copy_from_slice(&value.to_be_bytes());
    }
    pub fn set_seq(&mut self, value: u32) {
        write_u32(self.buffer.as_mut(), field::SEQ, value);
    }
    pub fn set_fragment_index(&mut self, value: u16) {
        write_u16(self.buffer.as_mut(), field::FRAGMENT_INDEX, value);
    }
    pub fn set_fragment_count(&mut self, value: u16) {
        write_u16(self.buffer.as_mut(), field::FRAGMENT_COUNT, value);
    }
    pub fn set_payload_len(&mut self, value: u16) {
        write_u16(self.buffer.as_mut(), field::PAYLOAD_LEN, value);
    }
    pub fn set_device_id(&mut self, value: u16) {
        write_u16(self.buffer.as_mut(), field::DEVICE_ID, value);
    }
    /// Write the CRC field as given; [`Packet::fill_checksum`] computes it.
    pub fn set_crc(&mut self, value: u32) {
        write_u32(self.buffer.as_mut(), field::CRC, value);
    }

    /// The payload bytes, for writing (as many as the payload length field says).
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let end = HEADER_LEN + usize::from(self.payload_len());
        &mut self.buffer.as_mut()[HEADER_LEN..end]
    }

    /// Recompute the CRC over the header and the payload behind it, and write it.
    pub fn fill_checksum(&mut self) {
        let crc = self.compute_crc();
        self.set_crc(crc);
    }

    /// Compute the CRC over the header and `payload`, and write it: for a header whose payload
    /// is not behind it in the buffer (see [`Packet::compute_crc_for`]).
    pub fn fill_checksum_for(&mut self, payload: &[u8]) {
        let crc = self.compute_crc_for(payload);
        self.set_crc(crc);
    }
}

/// The parsed, validated header of a PMNet datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Header {
    pub packet_type: PacketType,
    pub flags: u16,
    /// The server this request is for (or that sent this reply); a device may front several.
    pub server_id: u16,
    /// Random per client session, 64 bits so that sessions of different clients never collide.
    pub session_id: u64,
    /// Per-session request sequence number, from 1.
    pub seq: u32,
    pub fragment_index: u16,
    /// Number of fragments of this message (at least 1).
    pub fragment_count: u16,
    /// The device that logged the request (PMNet-ACK), or 0.
    pub device_id: u16,
}

impl Header {
    /// A header with the given type and identifiers, one fragment, no flags, device 0.
    pub fn new(packet_type: PacketType, server_id: u16, session_id: u64, seq: u32) -> Header {
        Header {
            packet_type,
            flags: 0,
            server_id,
            session_id,
            seq,
            fragment_index: 0,
            fragment_count: 1,
            device_id: 0,
        }
    }

    /// Validate a datagram completely (length, magic, version, CRC, type, fragment fields)
    /// and return its header and payload.
    pub fn parse(bytes: &[u8]) -> Result<(Header, &[u8]), ParseError> {
        let packet = Packet::new_checked(bytes)?;
        if !packet.verify_checksum() {
            return Err(ParseError::BadChecksum);
        }
        let packet_type =
            PacketType::from_code(packet.type_code()).ok_or(ParseError::UnknownType)?;
        let fragment_index = packet.fragment_index();
        let fragment_count = packet.fragment_count();
        if fragment_count == 0
            || fragment_index >= fragment_count
            || fragment_count > MAX_FRAGMENT_COUNT
        {
            return Err(ParseError::BadFragment);
        }
        let header = Header {
            packet_type,
            flags: packet.flags(),
            server_id: packet.server_id(),
            session_id: packet.session_id(),
            seq: packet.seq(),
            fragment_index,
            fragment_count,
            device_id: packet.device_id(),
        };
        let payload_len = usize::from(packet.payload_len());
        Ok((header, &bytes[HEADER_LEN..HEADER_LEN + payload_len]))
    }

    /// Whether flag bit(s) `flag` are all set.
    pub fn has_flag(&self, flag: u16) -> bool {
        self.flags & flag == flag
    }

    /// Write the header for `payload` into `buffer[..HEADER_LEN]` and the payload after it,
    /// computing the CRC. `buffer` must be exactly `HEADER_LEN + payload.len()` bytes and the
    /// payload at most [`MAX_PAYLOAD_LEN`]; both are caller bugs otherwise.
    pub fn emit(&self, payload: &[u8], buffer: &mut [u8]) {
        assert!(
            payload.len() <= MAX_PAYLOAD_LEN,
            "payload larger than one datagram"
        );
        assert_eq!(buffer.len(), HEADER_LEN + payload.len(), "buffer length");
        buffer[HEADER_LEN..].copy_from_slice(payload);
        self.emit_header(payload.len(), buffer);
    }

    /// Write the header into `buffer[..HEADER_LEN]` for the `payload_len` bytes of payload
    /// already in place behind it: magic, version, the fields, the payload length and the CRC
    /// over header and payload. The same bytes as [`Header::emit`] with that payload, without
    /// copying it. `buffer` must be exactly `HEADER_LEN + payload_len` bytes and `payload_len`
    /// at most [`MAX_PAYLOAD_LEN`]; both are caller bugs otherwise.
    pub fn emit_header(&self, payload_len: usize, buffer: &mut [u8]) {
        assert_eq!(buffer.len(), HEADER_LEN + payload_len, "buffer length");
        let mut packet = Packet::new_unchecked(buffer);
        self.emit_fields(payload_len, &mut packet);
        packet.fill_checksum();
    }

    /// Write the header alone into `header` (exactly [`HEADER_LEN`] bytes) for `payload`, which
    /// is kept somewhere else: the CRC covers `payload` as if it followed the header. For a
    /// writer that puts header and payload in place separately (the packet store writes both
    /// straight into persistent memory). The same header bytes as [`Header::emit`].
    pub fn emit_header_for(&self, payload: &[u8], header: &mut [u8]) {
        assert_eq!(header.len(), HEADER_LEN, "header length");
        let mut packet = Packet::new_unchecked(header);
        self.emit_fields(payload.len(), &mut packet);
        packet.fill_checksum_for(payload);
    }

    /// Every header field but the CRC.
    fn emit_fields<T: AsRef<[u8]> + AsMut<[u8]>>(
        &self,
        payload_len: usize,
        packet: &mut Packet<T>,
    ) {
        assert!(
            payload_len <= MAX_PAYLOAD_LEN,
            "payload larger than one datagram"
        );
        assert!(self.fragment_count >= 1 && self.fragment_index < self.fragment_count);
        packet.set_magic(MAGIC);
        packet.set_version(VERSION);
        packet.set_type_code(self.packet_type.code());
        packet.set_flags(self.flags);
        packet.set_server_id(self.server_id);
        packet.set_session_id(self.session_id);
        packet.set_seq(self.seq);
        packet.set_fragment_index(self.fragment_index);
        packet.set_fragment_count(self.fragment_count);
        packet.set_payload_len(u16::try_from(payload_len).expect("checked above"));
        packet.set_device_id(self.device_id);
    }

    /// The datagram for this header and `payload`, in a new buffer.
    pub fn encode(&self, payload: &[u8]) -> Vec<u8> {
        let len = HEADER_LEN + payload.len();
        let mut buffer = Vec::with_capacity(len + TRAILER_ROOM);
        buffer.resize(len, 0);
        self.emit(payload, &mut buffer);
        buffer
    }
}

/// Payload of a [`PacketType::RecoveryDone`]: the number of entries resent.
pub fn encode_recovery_done_payload(entry_count: u32) -> [u8; 4] {
    entry_count.to_be_bytes()
}

/// Parse the payload of a [`PacketType::RecoveryDone`].
pub fn decode_recovery_done_payload(payload: &[u8]) -> Result<u32, ParseError> {
    match <[u8; 4]>::try_from(payload) {
        Ok(word) => Ok(u32::from_be_bytes(word)),
        Err(_) if payload.len() < 4 => Err(ParseError::Truncated),
        Err(_) => Err(ParseError::TrailingBytes),
    }
}

/// A no-op fill of sequence number `seq` ([`flags::NOOP_FILL`]): a bypass request with an
/// empty payload, as a client sends for a number it gave up on.
pub fn encode_noop_fill(server_id: u16, session_id: u64, seq: u32) -> Vec<u8> {
    let mut fill = Header::new(PacketType::BypassRequest, server_id, session_id, seq);
    fill.flags = flags::NOOP_FILL;
    fill.encode(&[])
}

/// Payload of a [`PacketType::FillQuery`]: the last sequence number of the range.
pub fn encode_fill_query_payload(last: u32) -> [u8; 4] {
    last.to_be_bytes()
}

/// Parse the payload of a [`PacketType::FillQuery`].
pub fn decode_fill_query_payload(payload: &[u8]) -> Result<u32, ParseError> {
    decode_recovery_done_payload(payload)
}

/// Payload of a [`PacketType::FillReply`]: the range's last sequence number and the lowest
/// one the device holds whole (`last + 1`, wrapping, if none).
pub fn encode_fill_reply_payload(last: u32, held_from: u32) -> [u8; 8] {
    let mut payload = [0u8; 8];
    payload[..4].copy_from_slice(&last.to_be_bytes());
    payload[4..].copy_from_slice(&held_from.to_be_bytes());
    payload
}

/// `seen_ms` of a dated fill reply when the device has seen neither the range's last number
/// nor a later one (or no longer remembers).
pub const FILL_REPLY_UNSEEN: u32 = u32::MAX;

/// Payload of a dated [`PacketType::FillReply`]: [`encode_fill_reply_payload`]'s two words,
/// then `seen_ms`, how many milliseconds ago the device first saw `last` or a later number of
/// the session (capped below [`FILL_REPLY_UNSEEN`], which says it saw none). Every number up
/// to `last` was first sent by then, so its client's request lifetime is counted from that
/// moment at the latest.
pub fn encode_fill_reply_dated_payload(last: u32, held_from: u32, seen_ms: u32) -> [u8; 12] {
    let mut payload = [0u8; 12];
    payload[..8].copy_from_slice(&encode_fill_reply_payload(last, held_from));
    payload[8..].copy_from_slice(&seen_ms.to_be_bytes());
    payload
}

/// Parse the payload of a [`PacketType::FillReply`]: `(last, held_from)` (a dated reply's
/// age is left out; see [`decode_fill_reply_dated_payload`]).
pub fn decode_fill_reply_payload(payload: &[u8]) -> Result<(u32, u32), ParseError> {
    decode_fill_reply_dated_payload(payload).map(|(last, held_from, _)| (last, held_from))
}

/// Parse the payload of a [`PacketType::FillReply`], undated (8 bytes: `None`) or dated (12
/// bytes): `(last, held_from, seen_ms)`, `seen_ms` `None` when the device saw nothing above
/// the range or did not say.
pub fn decode_fill_reply_dated_payload(
    payload: &[u8],
) -> Result<(u32, u32, Option<u32>), ParseError> {
    let word = |at: usize| {
        u32::from_be_bytes([
            payload[at],
            payload[at + 1],
            payload[at + 2],
            payload[at + 3],
        ])
    };
    match payload.len() {
        0..=7 => Err(ParseError::Truncated),
        8 => Ok((word(0), word(4), None)),
        12 => {
            let seen_ms = word(8);
            Ok((
                word(0),
                word(4),
                (seen_ms != FILL_REPLY_UNSEEN).then_some(seen_ms),
            ))
        }
        _ => Err(ParseError::TrailingBytes),
    }
}

/// Sessions one [`PacketType::HoldQuery`] asks about, at most.
pub const HOLD_QUERY_SESSIONS_MAX: usize = 128;

/// Payload of a [`PacketType::HoldQuery`]: the session ids (at most
/// [`HOLD_QUERY_SESSIONS_MAX`]; the caller keeps to it).
pub fn encode_hold_query_payload(sessions: &[u64]) -> Vec<u8> {
    sessions.iter().flat_map(|id| id.to_be_bytes()).collect()
}

/// Parse the payload of a [`PacketType::HoldQuery`]: the session ids.
pub fn decode_hold_query_payload(payload: &[u8]) -> Result<Vec<u64>, ParseError> {
    if payload.is_empty() || payload.len() % 8 != 0 {
        return Err(ParseError::Truncated);
    }
    if payload.len() > 8 * HOLD_QUERY_SESSIONS_MAX {
        return Err(ParseError::TrailingBytes);
    }
    Ok(payload
        .chunks_exact(8)
        .map(|word| u64::from_be_bytes(word.try_into().expect("8 bytes")))
        .collect())
}

/// Payload of a [`PacketType::HoldReply`]: whether an entry of each session asked about is
/// held, in the query's order.
pub fn encode_hold_reply_payload(held: &[bool]) -> Vec<u8> {
    let count = u16::try_from(held.len()).unwrap_or(u16::MAX);
    let mut payload = count.to_be_bytes().to_vec();
    payload.resize(2 + held.len().div_ceil(8), 0);
    for (index, _) in held.iter().enumerate().filter(|(_, held)| **held) {
        payload[2 + index / 8] |= 0x80 >> (index % 8);
    }
    payload
}

/// Parse the payload of a [`PacketType::HoldReply`]: one flag per session asked about.
pub fn decode_hold_reply_payload(payload: &[u8]) -> Result<Vec<bool>, ParseError> {
    let Some((count, bitmap)) = payload.split_first_chunk::<2>() else {
        return Err(ParseError::Truncated);
    };
    let count = usize::from(u16::from_be_bytes(*count));
    match bitmap.len().cmp(&count.div_ceil(8)) {
        std::cmp::Ordering::Less => return Err(ParseError::Truncated),
        std::cmp::Ordering::Greater => return Err(ParseError::TrailingBytes),
        std::cmp::Ordering::Equal => {}
    }
    Ok((0..count)
        .map(|index| bitmap[index / 8] & (0x80 >> (index % 8)) != 0)
        .collect())
}

#[cfg(test)]
mod tests;

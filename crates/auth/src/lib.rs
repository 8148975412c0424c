//! Authentication of PMNet datagrams: deployment keys, per-session keys derived from them,
//! and AES-256-GCM on every datagram — a MAC over all of it, and, when the key file asks for
//! it, encryption of the payload.
//!
//! An authenticated datagram is an ordinary PMNet datagram with the flag
//! [`flags::AUTHENTICATED`] set (the CRC covers it like any other header bit) followed by a
//! trailer that `payload_len` does not count:
//!
//! | offset | size | field  | value                                                        |
//! |--------|------|--------|--------------------------------------------------------------|
//! | 0      | 2    | key_id | u16 big-endian: the deployment key the session key comes from |
//! | 2      | 12   | nonce  | the GCM nonce: the seal time's Unix seconds (u32), the sender's 32-bit random prefix, then its milliseconds (10 bits) and a 22-bit counter, big-endian |
//! | 14     | 16   | tag    | the GCM tag under the session's key                          |
//!
//! Without [`flags::ENCRYPTED`] the payload is in clear and the tag is GMAC (AES-256-GCM with
//! nothing to encrypt) over the datagram before the trailer followed by `key_id`: every byte
//! but the nonce and tag themselves is covered. With it, the payload is AES-256-GCM
//! ciphertext, the additional data is the header with its CRC field zeroed followed by
//! `key_id`, and the CRC on the wire covers the ciphertext (a CRC of the plaintext would
//! leak it); the receiver refreshes the CRC after decrypting.
//!
//! The session's key is `HKDF-SHA256(salt = CONTEXT, secret = deployment key, info =
//! session_id ‖ key_id)`: it never repeats across sessions or key ids, and anyone holding
//! the deployment key (every device, server and client of the deployment) derives it without
//! a handshake. The nonce never repeats under a key: every [`Authenticator`] draws its own
//! 32-bit prefix (from the operating system, or from the simulator's seed) and counts. The
//! nonce starts with the time the datagram was sealed, so a receiver refuses a datagram
//! sealed more than the *replay window* ago ([`AuthError::Stale`]) or ahead
//! ([`AuthError::FromTheFuture`]), and tells its caller when a datagram it accepted was
//! sealed ([`Authenticator::sealed_at`]): what a session table needs to refuse replays of
//! sessions it forgot ([`ReplayFloor`]). Header
//! and payload are covered whatever the packet type: a type added later needs no security
//! work of its own. docs/security.md argues the choices and states the threat model.
//!
//! Nothing here does I/O but draw the nonce prefix and read the wall clock (a [`WallClock`]
//! the simulator replaces with its own): [`KeySet::parse`] takes the key file's text; the
//! runtime reads the file (and checks its mode).

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

mod replay;
pub use replay::ReplayFloor;

use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};
use aws_lc_rs::hkdf;

use pmnet_wire::{field, flags, Packet, HEADER_LEN};

/// Bytes of a deployment key.
pub const KEY_LEN: usize = 32;
/// Bytes of the tag: GCM's full 128 bits (docs/security.md: a forger's chance per try).
pub const TAG_LEN: usize = 16;
/// Bytes of the nonce: GCM's 96 bits.
pub const NONCE_LEN: usize = 12;
/// Bytes of the trailer: the key id, the nonce and the tag.
pub const TRAILER_LEN: usize = 2 + NONCE_LEN + TAG_LEN;
const _: () = assert!(
    TRAILER_LEN <= pmnet_wire::TRAILER_ROOM,
    "encoded datagrams leave room"
);
/// Deployment keys valid at once, at most: the current one and the one being rotated out.
pub const MAX_KEYS: usize = 2;
/// Per-session keys cached at most; beyond it the cache starts over (a bound on memory that
/// a sender spraying session ids can make an endpoint spend: about 0.6 KiB a key, so 10 MiB;
/// each miss costs one derivation, about 1 µs).
pub const MAX_CACHED_SESSION_KEYS: usize = 1 << 14;

/// The replay window when the key file does not name one: a datagram sealed more than this
/// long before (or after) the receiver's clock is refused.
pub const DEFAULT_REPLAY_WINDOW_MS: u32 = 10_000;
/// The widest replay window a key file may name (one hour).
pub const MAX_REPLAY_WINDOW_MS: u32 = 3_600_000;

/// The wall clock an [`Authenticator`] stamps seals with and checks them against: Unix time
/// in milliseconds. The runtime's reads the system clock; the simulator's its virtual time.
pub type WallClock = Arc<dyn Fn() -> u64 + Send + Sync>;

/// The system's wall clock, in Unix milliseconds: the kernel's coarse real-time clock (a few
/// milliseconds' resolution, read without a timer access: every datagram reads it once or
/// twice, and the seal times it gives only need to be within a replay window of seconds; the
/// nonce's counter, not its time, keeps nonces unique).
pub fn system_clock() -> WallClock {
    Arc::new(coarse_unix_ms)
}

fn coarse_unix_ms() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid timespec to write to.
    if unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut now) } == 0 {
        let seconds = u64::try_from(now.tv_sec).unwrap_or(0);
        let millis = u64::try_from(now.tv_nsec).unwrap_or(0) / 1_000_000;
        return seconds * 1000 + millis;
    }
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as u64)
}

/// The HKDF salt of per-session keys.
const CONTEXT: &[u8] = b"pmnet 2026-11-24 per-session datagram key (AES-256-GCM)";

/// One deployment key and its id.
#[derive(Clone, PartialEq, Eq)]
pub struct DeploymentKey {
    pub id: u16,
    secret: [u8; KEY_LEN],
}

impl DeploymentKey {
    pub fn new(id: u16, secret: [u8; KEY_LEN]) -> DeploymentKey {
        DeploymentKey { id, secret }
    }
}

impl fmt::Debug for DeploymentKey {
    /// Never prints the secret.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DeploymentKey {{ id: {}, secret: <hidden> }}", self.id)
    }
}

/// The deployment keys an endpoint holds (the first seals what it sends, every one is
/// accepted on what it receives) and whether payloads are encrypted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySet {
    keys: Vec<DeploymentKey>,
    encrypt_payloads: bool,
    replay_window_ms: u32,
}

/// A key file that cannot be used, with the line at fault (1-based; 0 for the file as a whole).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct KeyFileError {
    pub line: usize,
    pub message: String,
}

impl KeySet {
    /// Keys, the sending one first. Panics on no key, more than [`MAX_KEYS`] or a repeated id
    /// (a caller's bug; files go through [`KeySet::parse`]).
    pub fn new(keys: Vec<DeploymentKey>) -> KeySet {
        assert!(
            !keys.is_empty() && keys.len() <= MAX_KEYS,
            "1..={MAX_KEYS} keys"
        );
        assert!(
            keys.len() < 2 || keys[0].id != keys[1].id,
            "two keys with one id"
        );
        KeySet {
            keys,
            encrypt_payloads: false,
            replay_window_ms: DEFAULT_REPLAY_WINDOW_MS,
        }
    }

    /// The same keys with another replay window (milliseconds, 1..=[`MAX_REPLAY_WINDOW_MS`]).
    /// Panics outside that range (a caller's bug; files go through [`KeySet::parse`]).
    pub fn with_replay_window_ms(mut self, window_ms: u32) -> KeySet {
        assert!(
            (1..=MAX_REPLAY_WINDOW_MS).contains(&window_ms),
            "replay window out of range"
        );
        self.replay_window_ms = window_ms;
        self
    }

    /// How long after (or before) its seal time a datagram is accepted, in milliseconds.
    pub fn replay_window_ms(&self) -> u32 {
        self.replay_window_ms
    }

    /// The same keys, sending payloads encrypted (`on`) or in clear.
    pub fn encrypting_payloads(mut self, on: bool) -> KeySet {
        self.encrypt_payloads = on;
        self
    }

    /// Whether payloads are sent encrypted (every endpoint accepts both either way).
    pub fn encrypts_payloads(&self) -> bool {
        self.encrypt_payloads
    }

    /// Parse a key file: one key a line, `key <id> <64 hex digits>`, the sending key first,
    /// and optionally the lines `encrypt payloads` and `replay window <seconds>`; blank lines
    /// and lines starting with `#` are ignored.
    pub fn parse(text: &str) -> Result<KeySet, KeyFileError> {
        let mut keys: Vec<DeploymentKey> = Vec::new();
        let mut encrypt_payloads = false;
        let mut replay_window_ms = DEFAULT_REPLAY_WINDOW_MS;
        for (index, raw) in text.lines().enumerate() {
            let line = index + 1;
            let fail = |message: String| KeyFileError { line, message };
            let trimmed = raw.trim();
            if trimmed.is_empty() || trimmed.starts_with('#') {
                continue;
            }
            let words: Vec<&str> = trimmed.split_whitespace().collect();
            if words[0] == "encrypt" {
                if words[1..] != ["payloads"] {
                    return Err(fail(
                        "expected `encrypt payloads` (payloads are in clear without it)".into(),
                    ));
                }
                encrypt_payloads = true;
                continue;
            }
            if words[0] == "replay" {
                let seconds = match words[1..] {
                    ["window", seconds] => seconds.parse::<u32>().ok(),
                    _ => None,
                };
                match seconds {
                    Some(seconds @ 1..=3600) => replay_window_ms = seconds * 1000,
                    _ => {
                        return Err(fail(
                            "expected `replay window <seconds>`, 1 to 3600 (default 10)".into(),
                        ))
                    }
                }
                continue;
            }
            let [kind, id, secret] = words[..] else {
                return Err(fail(
                    "expected `key <id> <64 hex digits>` (see `pmnet keygen`)".into(),
                ));
            };
            if kind != "key" {
                return Err(fail(format!(
                    "unknown entry {kind:?}: expected `key`, `encrypt payloads` or \
                     `replay window <seconds>`"
                )));
            }
            let id: u16 = id
                .parse()
                .map_err(|_| fail(format!("key id {id:?} is not a number 0..=65535")))?;
            let secret = parse_hex_key(secret).ok_or_else(|| {
                fail(format!(
                    "key {id}: the secret must be {} hex digits",
                    2 * KEY_LEN
                ))
            })?;
            if keys.iter().any(|key| key.id == id) {
                return Err(fail(format!("key id {id} is given twice")));
            }
            if keys.len() == MAX_KEYS {
                return Err(fail(format!(
                    "more than {MAX_KEYS} keys: keep the current key and the one being rotated out"
                )));
            }
            keys.push(DeploymentKey::new(id, secret));
        }
        if keys.is_empty() {
            return Err(KeyFileError {
                line: 0,
                message: "no key in the file (see `pmnet keygen`)".into(),
            });
        }
        Ok(KeySet {
            keys,
            encrypt_payloads,
            replay_window_ms,
        })
    }

    /// The key file's text for these keys.
    pub fn to_file_text(&self) -> String {
        let mut text = String::from(
            "# pmnet deployment keys: the first seals what is sent, each is accepted.\n\
             # Keep this file secret (mode 0600). Add the line `encrypt payloads` to send\n\
             # payloads encrypted as well as authenticated.\n",
        );
        if self.encrypt_payloads {
            text.push_str("encrypt payloads\n");
        }
        if self.replay_window_ms != DEFAULT_REPLAY_WINDOW_MS {
            text.push_str(&format!(
                "replay window {}\n",
                self.replay_window_ms.div_ceil(1000)
            ));
        }
        for key in &self.keys {
            text.push_str(&format!("key {} {}\n", key.id, to_hex(&key.secret)));
        }
        text
    }

    /// The id of the key that seals what is sent.
    pub fn sending_key_id(&self) -> u16 {
        self.keys[0].id
    }

    /// The ids of every key accepted.
    pub fn key_ids(&self) -> Vec<u16> {
        self.keys.iter().map(|key| key.id).collect()
    }
}

fn parse_hex_key(text: &str) -> Option<[u8; KEY_LEN]> {
    if text.len() != 2 * KEY_LEN || !text.is_ascii() {
        return None;
    }
    let mut secret = [0u8; KEY_LEN];
    for (index, byte) in secret.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * index..2 * index + 2], 16).ok()?;
    }
    Some(secret)
}

fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// Why a datagram failed authentication. Counted by reason and dropped, never answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AuthError {
    /// Too short to hold a header and a trailer.
    Truncated,
    /// No [`flags::AUTHENTICATED`] flag: sent without a key, or stripped by someone on the path.
    Unauthenticated,
    /// Made with a key this endpoint does not hold (unknown, or revoked).
    UnknownKey,
    /// The tag does not match: forged, altered, or made with another secret.
    BadTag,
    /// Genuine, but sealed longer ago than the replay window: a replay, or a clock behind.
    Stale,
    /// Genuine, but sealed later than the receiver's clock plus the replay window: a
    /// sender's clock ahead.
    FromTheFuture,
}

impl AuthError {
    /// Stable name, used in counters and metrics.
    pub fn reason(self) -> &'static str {
        match self {
            AuthError::Truncated => "auth_truncated",
            AuthError::Unauthenticated => "unauthenticated",
            AuthError::UnknownKey => "unknown_key",
            AuthError::BadTag => "bad_tag",
            AuthError::Stale => "stale",
            AuthError::FromTheFuture => "from_the_future",
        }
    }
}

/// What an [`Authenticator`] has done: seals that computed a MAC, and seals that reused the
/// trailer of a datagram just verified (a device forwarding what it received).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SealCounts {
    pub computed: u64,
    pub reused: u64,
}

/// Seals and verifies datagrams with a [`KeySet`], caching per-session keys.
pub struct Authenticator {
    keys: KeySet,
    seals: SealCounts,
    /// The HKDF pseudo-random key of each deployment key, by id.
    prks: Vec<(u16, hkdf::Prk)>,
    /// Per-session keys by (key id, session id): their index in `session_key_list`.
    session_keys: hashbrown::HashMap<(u16, u64), usize>,
    session_key_list: Vec<LessSafeKey>,
    /// The session key used last, and its index: most datagrams an endpoint handles in a row
    /// are of one session (a client's are all of its own), and this spares the table.
    last_session_key: ((u16, u64), usize),
    /// The nonce's middle 32 bits: this sealer's own, drawn at random (from `prefix_state`).
    nonce_prefix: u32,
    prefix_state: u64,
    /// The nonce's last 22 bits: the next value; on wrapping the prefix moves on.
    nonce_counter: u32,
    /// Copies made ([`Clone`]): each gets a prefix of its own, derived from this one.
    clones: std::cell::Cell<u64>,
    /// The last datagrams verified and their trailers, when remembering is on (a device, which
    /// forwards what it verified: sealing those bytes again reuses the trailer instead of
    /// computing the MAC a second time).
    recent: std::collections::VecDeque<Remembered>,
    recent_len_max: usize,
    clock: WallClock,
    /// When the datagram [`Authenticator::verify`] last accepted was sealed (Unix ms).
    last_sealed_at: u64,
    /// What setting [`flags::AUTHENTICATED`] does to the CRC, by length (see [`CrcDeltas`]).
    crc_deltas: CrcDeltas,
}

impl fmt::Debug for Authenticator {
    /// Never prints a key.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Authenticator")
            .field("keys", &self.keys)
            .field("cached_session_keys", &self.session_key_list.len())
            .field("nonce_prefix", &format_args!("{:#010x}", self.nonce_prefix))
            .field("recent_len_max", &self.recent_len_max)
            .finish()
    }
}

impl Clone for Authenticator {
    /// A copy with a nonce prefix of its own (two sealers must never share one), derived from
    /// this one's so that a seeded simulation stays reproducible.
    fn clone(&self) -> Authenticator {
        let clones = self.clones.get() + 1;
        self.clones.set(clones);
        let mut copy = Authenticator::with_nonce_prefix(
            self.keys.clone(),
            splitmix64(self.prefix_state ^ splitmix64(clones)),
        )
        .with_clock(self.clock.clone());
        copy.recent_len_max = self.recent_len_max;
        copy
    }
}

impl Authenticator {
    /// An authenticator whose nonce prefix comes from the operating system's random source.
    pub fn new(keys: KeySet) -> Authenticator {
        // The kernel's random source read directly: aws-lc's generator would first seed a
        // generator of its own for this thread (tens of milliseconds of CPU, at every start).
        let mut prefix = [0u8; 8];
        let read = std::fs::File::open("/dev/urandom")
            .and_then(|mut random| std::io::Read::read_exact(&mut random, &mut prefix));
        if read.is_err() {
            aws_lc_rs::rand::fill(&mut prefix).expect("the operating system's random source works");
        }
        Authenticator::with_nonce_prefix(keys, u64::from_be_bytes(prefix))
    }

    /// An authenticator with a nonce prefix taken from `nonce_prefix`: for the simulator and
    /// tests, which draw it from their seed. Two authenticators sealing under one deployment
    /// key should not share a prefix (if they do, a nonce repeats only if they also seal the
    /// same count in the same millisecond).
    pub fn with_nonce_prefix(keys: KeySet, nonce_prefix: u64) -> Authenticator {
        let salt = hkdf::Salt::new(hkdf::HKDF_SHA256, CONTEXT);
        let prks = keys
            .keys
            .iter()
            .map(|key| (key.id, salt.extract(&key.secret)))
            .collect();
        Authenticator {
            keys,
            prks,
            session_keys: hashbrown::HashMap::new(),
            session_key_list: Vec::new(),
            last_session_key: ((0, 0), usize::MAX),
            nonce_prefix: (splitmix64(nonce_prefix) >> 32) as u32,
            prefix_state: splitmix64(nonce_prefix),
            nonce_counter: 0,
            clones: std::cell::Cell::new(0),
            recent: std::collections::VecDeque::new(),
            recent_len_max: 0,
            clock: system_clock(),
            last_sealed_at: 0,
            seals: SealCounts::default(),
            crc_deltas: CrcDeltas::default(),
        }
    }

    /// The same authenticator reading time from `clock` (the simulator's virtual clock).
    pub fn with_clock(mut self, clock: WallClock) -> Authenticator {
        self.clock = clock;
        self
    }

    /// The wall clock's time now, in Unix milliseconds.
    pub fn now_ms(&self) -> u64 {
        (self.clock)()
    }

    /// When the datagram the last successful [`Authenticator::verify`] accepted was sealed,
    /// Unix milliseconds.
    pub fn sealed_at(&self) -> u64 {
        self.last_sealed_at
    }

    /// The replay window, in milliseconds.
    pub fn replay_window_ms(&self) -> u64 {
        u64::from(self.keys.replay_window_ms)
    }

    /// Remember the last `count` datagrams verified, so that sealing the same bytes again (a
    /// device forwarding what it received) reuses their trailer. Only a trailer made with the
    /// sending key of a payload in clear is reused, so what leaves is what
    /// [`Authenticator::seal`] could have made.
    pub fn remember_verified(mut self, count: usize) -> Authenticator {
        self.recent_len_max = count;
        self
    }

    pub fn keys(&self) -> &KeySet {
        &self.keys
    }

    /// Seals so far, computed and reused.
    pub fn seal_counts(&self) -> SealCounts {
        self.seals
    }

    /// Seal `datagram` (a complete PMNet datagram of exactly header and payload, its payload
    /// in clear): set [`flags::AUTHENTICATED`] (and [`flags::ENCRYPTED`] when the key set
    /// encrypts and there is a payload), refresh the CRC, append the trailer made with the
    /// sending key and a fresh nonce.
    ///
    /// Panics if `datagram` is shorter than a header (a caller's bug: endpoints seal only what
    /// they encoded or verified).
    pub fn seal(&mut self, datagram: &mut Vec<u8>) {
        assert!(
            datagram.len() >= HEADER_LEN,
            "sealing a datagram without a header"
        );
        let encrypt = self.keys.encrypt_payloads && datagram.len() > HEADER_LEN;
        if !encrypt {
            self.set_authenticated(datagram);
            if let Some(trailer) = self.remembered_trailer(datagram) {
                datagram.extend_from_slice(&trailer);
                self.seals.reused += 1;
                return;
            }
        }
        self.seals.computed += 1;
        let key_id = self.keys.sending_key_id();
        let nonce = self.next_nonce();
        let session_id = session_id_of(datagram);
        let key = self
            .session_key(key_id, session_id)
            .expect("the sending key is held");
        datagram.reserve(TRAILER_LEN);
        let tag = if encrypt {
            set_flags(datagram, flags::AUTHENTICATED | flags::ENCRYPTED, 0);
            let aad = header_aad(datagram, key_id);
            let (_, payload) = datagram.split_at_mut(HEADER_LEN);
            let tag = key
                .seal_in_place_separate_tag(
                    Nonce::assume_unique_for_key(nonce),
                    Aad::from(&aad[..]),
                    payload,
                )
                .expect("AES-GCM seals any datagram length");
            Packet::new_unchecked(&mut datagram[..]).fill_checksum();
            datagram.extend_from_slice(&key_id.to_be_bytes());
            tag
        } else {
            datagram.extend_from_slice(&key_id.to_be_bytes());
            key.seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(&datagram[..]),
                &mut [],
            )
            .expect("AES-GCM seals any datagram length")
        };
        datagram.extend_from_slice(&nonce);
        datagram.extend_from_slice(tag.as_ref());
    }

    /// Check `datagram`'s trailer before anything else is done with it; on success, the
    /// datagram without its trailer, as the parser expects it: borrowed when its payload was
    /// in clear, decrypted (with [`flags::ENCRYPTED`] cleared and the CRC refreshed) when not.
    pub fn verify<'a>(&mut self, datagram: &'a [u8]) -> Result<Cow<'a, [u8]>, AuthError> {
        if datagram.len() < HEADER_LEN {
            return Err(AuthError::Truncated);
        }
        let flags_now = u16::from_be_bytes([
            datagram[field::FLAGS.start],
            datagram[field::FLAGS.start + 1],
        ]);
        if flags_now & flags::AUTHENTICATED == 0 {
            return Err(AuthError::Unauthenticated);
        }
        if datagram.len() < HEADER_LEN + TRAILER_LEN {
            return Err(AuthError::Truncated);
        }
        let (inner, trailer) = datagram.split_at(datagram.len() - TRAILER_LEN);
        let key_id = u16::from_be_bytes([trailer[0], trailer[1]]);
        let mut nonce = [0u8; NONCE_LEN];
        nonce.copy_from_slice(&trailer[2..2 + NONCE_LEN]);
        let tag = &trailer[2 + NONCE_LEN..];
        let key = self
            .session_key(key_id, session_id_of(inner))
            .ok_or(AuthError::UnknownKey)?;
        let nonce_once = Nonce::assume_unique_for_key(nonce);
        if flags_now & flags::ENCRYPTED != 0 {
            let aad = header_aad(inner, key_id);
            let mut plain = inner.to_vec();
            key.open_separate_gather(
                nonce_once,
                Aad::from(&aad[..]),
                &inner[HEADER_LEN..],
                tag,
                &mut plain[HEADER_LEN..],
            )
            .map_err(|_| AuthError::BadTag)?;
            self.check_seal_time(&nonce)?;
            set_flags(&mut plain, 0, flags::ENCRYPTED);
            return Ok(Cow::Owned(plain));
        }
        key.open_separate_gather(
            nonce_once,
            Aad::from(&datagram[..datagram.len() - TRAILER_LEN + 2]),
            &[],
            tag,
            &mut [],
        )
        .map_err(|_| AuthError::BadTag)?;
        self.check_seal_time(&nonce)?;
        // Only requests: what a device passes on unchanged in the common case (acks and
        // replies it absorbs, or answers with datagrams of its own).
        let kind = inner[field::TYPE];
        let request = kind == pmnet_wire::PacketType::UpdateRequest.code()
            || kind == pmnet_wire::PacketType::BypassRequest.code();
        if request && self.recent_len_max > 0 && key_id == self.keys.sending_key_id() {
            let mut kept = Remembered {
                len: inner.len(),
                head: [0; HEADER_LEN],
                trailer: [0; TRAILER_LEN],
            };
            if self.recent.len() == self.recent_len_max {
                self.recent.pop_front();
            }
            kept.head.copy_from_slice(&inner[..HEADER_LEN]);
            kept.trailer.copy_from_slice(trailer);
            self.recent.push_back(kept);
        }
        Ok(Cow::Borrowed(inner))
    }

    /// Refuse a genuine datagram sealed outside the replay window of this endpoint's clock;
    /// remember when an accepted one was sealed.
    fn check_seal_time(&mut self, nonce: &[u8; NONCE_LEN]) -> Result<(), AuthError> {
        let sealed_ms = seal_time_ms(nonce);
        let now = self.now_ms();
        let window = u64::from(self.keys.replay_window_ms);
        if now > sealed_ms + window {
            return Err(AuthError::Stale);
        }
        if sealed_ms > now + window {
            return Err(AuthError::FromTheFuture);
        }
        self.last_sealed_at = sealed_ms;
        Ok(())
    }

    /// The trailer of a remembered datagram of these bytes, if any: one of the same length and
    /// header (which holds the CRC of the whole datagram; see [`Remembered`]), newest first.
    fn remembered_trailer(&self, datagram: &[u8]) -> Option<[u8; TRAILER_LEN]> {
        if self.recent.is_empty() || datagram.len() < HEADER_LEN {
            return None;
        }
        let len = datagram.len();
        let head: &[u8; HEADER_LEN] = datagram[..HEADER_LEN].try_into().ok()?;
        // Only a trailer sealed in this very second: an older one carries its old seal time,
        // which receivers would refuse as stale once the replay window passed (a device
        // resending a logged request long after it verified it, or an attacker replaying the
        // device's own old datagram to it, which it verifies and remembers).
        let second = (self.now_ms() / 1000) as u32;
        self.recent
            .iter()
            .rev()
            .find(|kept| {
                kept.len == len
                    && &kept.head == head
                    && u32::from_be_bytes([
                        kept.trailer[2],
                        kept.trailer[3],
                        kept.trailer[4],
                        kept.trailer[5],
                    ]) == second
            })
            .map(|kept| kept.trailer)
    }

    fn next_nonce(&mut self) -> [u8; NONCE_LEN] {
        let now = self.now_ms();
        let mut nonce = [0u8; NONCE_LEN];
        nonce[..4].copy_from_slice(&((now / 1000) as u32).to_be_bytes());
        nonce[4..8].copy_from_slice(&self.nonce_prefix.to_be_bytes());
        let millis = (now % 1000) as u32;
        nonce[8..].copy_from_slice(&(millis << COUNTER_BITS | self.nonce_counter).to_be_bytes());
        self.nonce_counter = (self.nonce_counter + 1) & COUNTER_MASK;
        if self.nonce_counter == 0 {
            // 2^22 datagrams sealed: move to a new prefix rather than repeat a nonce.
            self.prefix_state = splitmix64(self.prefix_state);
            self.nonce_prefix = (self.prefix_state >> 32) as u32;
        }
        nonce
    }

    /// Set [`flags::AUTHENTICATED`] and clear [`flags::ENCRYPTED`] on a datagram of header
    /// and payload whose CRC is right, and make the CRC right again. The common case — only
    /// the AUTHENTICATED bit to set — updates the CRC from a per-length delta instead of
    /// computing it over the whole datagram again.
    fn set_authenticated(&mut self, datagram: &mut [u8]) {
        let before = u16::from_be_bytes([
            datagram[field::FLAGS.start],
            datagram[field::FLAGS.start + 1],
        ]);
        let after = (before | flags::AUTHENTICATED) & !flags::ENCRYPTED;
        let covered = field::CRC_COVERED.len()
            + usize::from(u16::from_be_bytes([
                datagram[field::PAYLOAD_LEN.start],
                datagram[field::PAYLOAD_LEN.start + 1],
            ]));
        if after == before {
            return;
        }
        if before ^ after != flags::AUTHENTICATED || covered + 4 > datagram.len() {
            set_flags(datagram, flags::AUTHENTICATED, flags::ENCRYPTED);
            return;
        }
        let mut packet = Packet::new_unchecked(datagram);
        packet.set_flags(after);
        let crc = packet.crc() ^ self.crc_deltas.get(covered);
        packet.set_crc(crc);
    }

    fn session_key(&mut self, key_id: u16, session_id: u64) -> Option<&LessSafeKey> {
        let id = (key_id, session_id);
        if self.last_session_key.0 == id && self.last_session_key.1 < self.session_key_list.len() {
            return self.session_key_list.get(self.last_session_key.1);
        }
        if self.session_keys.len() >= MAX_CACHED_SESSION_KEYS
            && !self.session_keys.contains_key(&id)
        {
            self.session_keys.clear();
            self.session_key_list.clear();
            self.last_session_key = ((0, 0), usize::MAX);
        }
        // One look-up when the key is cached (every datagram of a session but its first).
        let index = match self.session_keys.entry(id) {
            hashbrown::hash_map::Entry::Occupied(entry) => *entry.get(),
            hashbrown::hash_map::Entry::Vacant(entry) => {
                let prk = &self.prks.iter().find(|(id, _)| *id == key_id)?.1;
                let mut info = [0u8; 10];
                info[..8].copy_from_slice(&session_id.to_be_bytes());
                info[8..].copy_from_slice(&key_id.to_be_bytes());
                let info_parts = [&info[..]];
                let material = prk
                    .expand(&info_parts, &AES_256_GCM)
                    .expect("HKDF gives 32 bytes");
                self.session_key_list
                    .push(LessSafeKey::new(UnboundKey::from(material)));
                *entry.insert(self.session_key_list.len() - 1)
            }
        };
        self.last_session_key = (id, index);
        self.session_key_list.get(index)
    }
}

/// What setting [`flags::AUTHENTICATED`] changes in the CRC32C of a datagram, by the number
/// of bytes the CRC covers, for the lengths seen last.
///
/// A CRC is linear: for two messages of one length, `crc(a) ^ crc(b)` is the CRC without its
/// initial and final inversion (`L`) of `a ^ b`. Setting a flag bit xors the message with a
/// constant `d` that is zero but for the flags field, so the new CRC is the old one xor
/// `L(d)`, which depends on the length only: `L` of the two flag bytes, carried through the
/// zero bytes after them. Computing it costs one CRC pass over that many zeros, once per
/// length; a datagram of a length seen recently costs nothing.
#[derive(Debug, Default, Clone)]
struct CrcDeltas {
    /// Direct-mapped by length: `(covered length, delta)`; a length of 0 is an empty slot.
    slots: [(usize, u32); CRC_DELTA_SLOTS],
}

const CRC_DELTA_SLOTS: usize = 16;

impl CrcDeltas {
    fn get(&mut self, covered: usize) -> u32 {
        let slot = &mut self.slots[covered % CRC_DELTA_SLOTS];
        if slot.0 != covered {
            *slot = (covered, crc_delta_of_authenticated(covered));
        }
        slot.1
    }
}

/// `L(d)` for `d` the `covered`-byte message that is zero but for the AUTHENTICATED bit of
/// its flags field (see [`CrcDeltas`]).
fn crc_delta_of_authenticated(covered: usize) -> u32 {
    const ZEROS: [u8; 512] = [0; 512];
    let flag_bytes = flags::AUTHENTICATED.to_be_bytes();
    // L over the bytes up to the end of the flags field: leading zeros leave L's state at 0.
    let state = crc32c::crc32c(&flag_bytes) ^ crc32c::crc32c(&[0, 0]);
    // Carry that state through the zeros after the flags: crc32c_append inverts its input
    // and output, so invert around it.
    let mut remaining = covered - field::FLAGS.end;
    let mut crc = !state;
    while remaining > 0 {
        let step = remaining.min(ZEROS.len());
        crc = crc32c::crc32c_append(crc, &ZEROS[..step]);
        remaining -= step;
    }
    !crc
}

/// A datagram verified with the sending key, remembered so that sealing the same bytes again
/// reuses its trailer.
///
/// It is known by its length and header alone, which holds the CRC-32C of the whole datagram:
/// other bytes under the same length and header (a chance of 2^-32 for bytes this endpoint
/// itself changed) would get a trailer that does not verify, and be dropped by the receiver
/// like a datagram lost — never taken for what was sealed.
#[derive(Debug, Clone)]
struct Remembered {
    len: usize,
    head: [u8; HEADER_LEN],
    trailer: [u8; TRAILER_LEN],
}

/// Bits of the nonce's last word that count; the 10 above them hold the seal time's
/// milliseconds.
const COUNTER_BITS: u32 = 22;
const COUNTER_MASK: u32 = (1 << COUNTER_BITS) - 1;

/// When a nonce says it was sealed, in Unix milliseconds: its first word's seconds and the
/// milliseconds in the top 10 bits of its last word.
fn seal_time_ms(nonce: &[u8; NONCE_LEN]) -> u64 {
    let seconds = u32::from_be_bytes([nonce[0], nonce[1], nonce[2], nonce[3]]);
    let last = u32::from_be_bytes([nonce[8], nonce[9], nonce[10], nonce[11]]);
    u64::from(seconds) * 1000 + u64::from((last >> COUNTER_BITS).min(999))
}

/// The session id of a datagram at least a header long.
fn session_id_of(datagram: &[u8]) -> u64 {
    u64::from_be_bytes(
        datagram[field::SESSION_ID]
            .try_into()
            .expect("a header holds a session id"),
    )
}

/// Set the `set` flag bits and clear the `clear` ones of a datagram at least a header long,
/// refreshing the CRC if that changed them.
fn set_flags(datagram: &mut [u8], set: u16, clear: u16) {
    let mut packet = Packet::new_unchecked(datagram);
    let before = packet.flags();
    let after = (before | set) & !clear;
    if after != before {
        packet.set_flags(after);
        packet.fill_checksum();
    }
}

/// The additional data of an encrypted datagram: its header with the CRC field zeroed (the
/// CRC covers the ciphertext, computed after it), then the key id.
fn header_aad(datagram: &[u8], key_id: u16) -> [u8; HEADER_LEN + 2] {
    let mut aad = [0u8; HEADER_LEN + 2];
    aad[..HEADER_LEN].copy_from_slice(&datagram[..HEADER_LEN]);
    aad[field::CRC].fill(0);
    aad[HEADER_LEN..].copy_from_slice(&key_id.to_be_bytes());
    aad
}

/// A bijective mixer of 64-bit values (SplitMix64's finaliser).
fn splitmix64(value: u64) -> u64 {
    let mut z = value.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// `datagram` without its trailer when it says it has one, unverified: for observers (traces,
/// counters by type) that only look. Endpoints use [`Authenticator::verify`].
pub fn without_trailer(datagram: &[u8]) -> &[u8] {
    let sealed = datagram.len() >= HEADER_LEN + TRAILER_LEN
        && u16::from_be_bytes([
            datagram[field::FLAGS.start],
            datagram[field::FLAGS.start + 1],
        ]) & flags::AUTHENTICATED
            != 0;
    if sealed {
        &datagram[..datagram.len() - TRAILER_LEN]
    } else {
        datagram
    }
}

#[cfg(test)]
mod tests;

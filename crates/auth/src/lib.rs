//! Authentication of PMNet datagrams: deployment keys, per-session keys derived from them, and
//! a MAC on every datagram.
//!
//! An authenticated datagram is an ordinary PMNet datagram with the flag
//! [`flags::AUTHENTICATED`] set (the CRC covers it like any other header bit) followed by a
//! trailer that `payload_len` does not count:
//!
//! | offset | size | field  | value                                                        |
//! |--------|------|--------|--------------------------------------------------------------|
//! | 0      | 2    | key_id | u16 big-endian: the deployment key the tag was made with      |
//! | 2      | 16   | tag    | BLAKE3 keyed hash, first 16 bytes, under the session's key, of the datagram before the trailer followed by `key_id` |
//!
//! The session's key is `BLAKE3-derive_key(CONTEXT, deployment key ‖ session_id ‖ key_id)`: it
//! never repeats across sessions or key ids, and anyone holding the deployment key (every
//! device, server and client of the deployment) derives it without a handshake. Everything in
//! the datagram — header, payload and the key id — is covered, whatever its type: a packet type
//! added later needs no security work of its own. docs/security.md argues the choices and
//! states the threat model.
//!
//! Nothing here does I/O: [`KeySet::parse`] takes the key file's text; the runtime reads the
//! file (and checks its mode).

use std::fmt;

use pmnet_wire::{field, flags, Packet, HEADER_LEN};

/// Bytes of a deployment key.
pub const KEY_LEN: usize = 32;
/// Bytes of the tag: 128 bits, so a forger's chance per datagram is 2^-128 (see
/// docs/security.md for why truncating BLAKE3's 256-bit output to this is enough).
pub const TAG_LEN: usize = 16;
/// Bytes of the trailer: the key id and the tag.
pub const TRAILER_LEN: usize = 2 + TAG_LEN;
/// Deployment keys valid at once, at most: the current one and the one being rotated out.
pub const MAX_KEYS: usize = 2;
/// Per-session keys cached at most; beyond it the cache starts over (a bound on memory that
/// a sender spraying session ids can make an endpoint spend; each miss costs one derivation).
pub const MAX_CACHED_SESSION_KEYS: usize = 1 << 16;

/// The BLAKE3 key-derivation context of per-session keys.
const CONTEXT: &str = "pmnet 2026-11-23 per-session datagram MAC key";

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

/// The deployment keys an endpoint holds: the first seals what it sends, every one is
/// accepted on what it receives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySet {
    keys: Vec<DeploymentKey>,
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
        KeySet { keys }
    }

    /// Parse a key file: one key a line, `key <id> <64 hex digits>`, the sending key first;
    /// blank lines and lines starting with `#` are ignored.
    pub fn parse(text: &str) -> Result<KeySet, KeyFileError> {
        let mut keys: Vec<DeploymentKey> = Vec::new();
        for (index, raw) in text.lines().enumerate() {
            let line = index + 1;
            let fail = |message: String| KeyFileError { line, message };
            let trimmed = raw.trim();
            if trimmed.is_empty() || trimmed.starts_with('#') {
                continue;
            }
            let words: Vec<&str> = trimmed.split_whitespace().collect();
            let [kind, id, secret] = words[..] else {
                return Err(fail(
                    "expected `key <id> <64 hex digits>` (see `pmnet keygen`)".into(),
                ));
            };
            if kind != "key" {
                return Err(fail(format!("unknown entry {kind:?}: expected `key`")));
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
        Ok(KeySet { keys })
    }

    /// The key file's text for these keys.
    pub fn to_file_text(&self) -> String {
        let mut text = String::from(
            "# pmnet deployment keys: the first seals what is sent, each is accepted.\n\
             # Keep this file secret (mode 0600).\n",
        );
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

    fn key(&self, id: u16) -> Option<&DeploymentKey> {
        self.keys.iter().find(|key| key.id == id)
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
}

impl AuthError {
    /// Stable name, used in counters and metrics.
    pub fn reason(self) -> &'static str {
        match self {
            AuthError::Truncated => "auth_truncated",
            AuthError::Unauthenticated => "unauthenticated",
            AuthError::UnknownKey => "unknown_key",
            AuthError::BadTag => "bad_tag",
        }
    }
}

/// Seals and verifies datagrams with a [`KeySet`], caching per-session keys.
#[derive(Debug, Clone)]
pub struct Authenticator {
    keys: KeySet,
    session_keys: hashbrown::HashMap<(u16, u64), [u8; KEY_LEN]>,
    /// The last datagrams verified and their trailers, when remembering is on (a device, which
    /// forwards what it verified: sealing those bytes again reuses the trailer instead of
    /// computing the MAC a second time).
    recent: std::collections::VecDeque<(Vec<u8>, [u8; TRAILER_LEN])>,
    recent_len_max: usize,
}

impl Authenticator {
    pub fn new(keys: KeySet) -> Authenticator {
        Authenticator {
            keys,
            session_keys: hashbrown::HashMap::new(),
            recent: std::collections::VecDeque::new(),
            recent_len_max: 0,
        }
    }

    /// Remember the last `count` datagrams verified, so that sealing the same bytes again (a
    /// device forwarding what it received) reuses their trailer. Only a trailer made with the
    /// sending key is reused, so what leaves is what [`Authenticator::seal`] would make.
    pub fn remember_verified(mut self, count: usize) -> Authenticator {
        self.recent_len_max = count;
        self
    }

    pub fn keys(&self) -> &KeySet {
        &self.keys
    }

    /// Seal `datagram` (a complete PMNet datagram of exactly header and payload, sealed or not
    /// before): set [`flags::AUTHENTICATED`], refresh the CRC, append the trailer made with the
    /// sending key. Sealing the same bytes twice gives the same trailer.
    ///
    /// Panics if `datagram` is shorter than a header (a caller's bug: endpoints seal only what
    /// they encoded or verified).
    pub fn seal(&mut self, datagram: &mut Vec<u8>) {
        assert!(
            datagram.len() >= HEADER_LEN,
            "sealing a datagram without a header"
        );
        {
            let mut packet = Packet::new_unchecked(&mut datagram[..]);
            let flags_now = packet.flags();
            if flags_now & flags::AUTHENTICATED == 0 {
                packet.set_flags(flags_now | flags::AUTHENTICATED);
                packet.fill_checksum();
            }
        }
        let key_id = self.keys.sending_key_id();
        if let Some((_, trailer)) = self
            .recent
            .iter()
            .find(|(inner, _)| inner.as_slice() == datagram.as_slice())
        {
            datagram.extend_from_slice(trailer);
            return;
        }
        let tag = self.tag(key_id, datagram).expect("the sending key is held");
        datagram.extend_from_slice(&key_id.to_be_bytes());
        datagram.extend_from_slice(&tag);
    }

    /// Check `datagram`'s trailer before anything else is done with it; on success, the
    /// datagram without its trailer (header and payload, as the parser expects them).
    pub fn verify<'a>(&mut self, datagram: &'a [u8]) -> Result<&'a [u8], AuthError> {
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
        let expected = self.tag(key_id, inner).ok_or(AuthError::UnknownKey)?;
        if !constant_time_eq(&expected, &trailer[2..]) {
            return Err(AuthError::BadTag);
        }
        if self.recent_len_max > 0 && key_id == self.keys.sending_key_id() {
            if self.recent.len() == self.recent_len_max {
                self.recent.pop_front();
            }
            let mut kept = [0u8; TRAILER_LEN];
            kept.copy_from_slice(trailer);
            self.recent.push_back((inner.to_vec(), kept));
        }
        Ok(inner)
    }

    /// The tag of `inner` (header and payload) under `key_id`'s key for its session, if the
    /// key is held.
    fn tag(&mut self, key_id: u16, inner: &[u8]) -> Option<[u8; TAG_LEN]> {
        let session_id = u64::from_be_bytes(
            inner[field::SESSION_ID]
                .try_into()
                .expect("a header holds a session id"),
        );
        let session_key = self.session_key(key_id, session_id)?;
        let mut hasher = blake3::Hasher::new_keyed(&session_key);
        hasher.update(inner);
        hasher.update(&key_id.to_be_bytes());
        let mut tag = [0u8; TAG_LEN];
        tag.copy_from_slice(&hasher.finalize().as_bytes()[..TAG_LEN]);
        Some(tag)
    }

    fn session_key(&mut self, key_id: u16, session_id: u64) -> Option<[u8; KEY_LEN]> {
        if let Some(key) = self.session_keys.get(&(key_id, session_id)) {
            return Some(*key);
        }
        let deployment = self.keys.key(key_id)?;
        let mut material = [0u8; KEY_LEN + 8 + 2];
        material[..KEY_LEN].copy_from_slice(&deployment.secret);
        material[KEY_LEN..KEY_LEN + 8].copy_from_slice(&session_id.to_be_bytes());
        material[KEY_LEN + 8..].copy_from_slice(&key_id.to_be_bytes());
        let key = blake3::derive_key(CONTEXT, &material);
        if self.session_keys.len() >= MAX_CACHED_SESSION_KEYS {
            self.session_keys.clear();
        }
        self.session_keys.insert((key_id, session_id), key);
        Some(key)
    }
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

/// Whether `a` and `b` are equal, in time that does not depend on where they differ.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests;

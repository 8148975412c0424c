use proptest::prelude::*;

use super::*;
use pmnet_wire::{Header, PacketType};

fn keys(ids: &[u16]) -> KeySet {
    KeySet::new(
        ids.iter()
            .map(|&id| DeploymentKey::new(id, [id as u8 ^ 0x5A; KEY_LEN]))
            .collect(),
    )
}

fn datagram(session: u64, payload: &[u8]) -> Vec<u8> {
    Header::new(PacketType::UpdateRequest, 1, session, 7).encode(payload)
}

#[test]
fn a_sealed_datagram_verifies_and_parses_without_its_trailer() {
    let mut auth = Authenticator::new(keys(&[3]));
    let plain = datagram(42, b"SET k v");
    let mut sealed = plain.clone();
    auth.seal(&mut sealed);
    assert_eq!(sealed.len(), plain.len() + TRAILER_LEN);
    let inner = auth.verify(&sealed).unwrap();
    let (header, payload) = Header::parse(&inner).unwrap();
    assert!(header.has_flag(flags::AUTHENTICATED));
    assert!(!header.has_flag(flags::ENCRYPTED));
    assert_eq!(payload, b"SET k v");
    // The payload travels in clear.
    assert_eq!(&sealed[HEADER_LEN..HEADER_LEN + 7], b"SET k v");
    // Sealing the same bytes again takes a new nonce, so the tag differs, and both verify.
    let mut again = inner.to_vec();
    auth.seal(&mut again);
    assert_ne!(again, sealed);
    assert_eq!(again[..plain.len()], sealed[..plain.len()]);
    assert!(auth.verify(&again).is_ok());
}

#[test]
fn nonces_never_repeat_within_a_sealer_or_across_its_clones() {
    let mut auth = Authenticator::with_nonce_prefix(keys(&[3]), 7);
    let mut copy = auth.clone();
    let mut second_copy = auth.clone();
    let mut seen = std::collections::HashSet::new();
    for sealer in [&mut auth, &mut copy, &mut second_copy] {
        for _ in 0..100 {
            let mut sealed = datagram(42, b"v");
            sealer.seal(&mut sealed);
            let nonce = sealed[sealed.len() - NONCE_LEN - TAG_LEN..sealed.len() - TAG_LEN].to_vec();
            assert!(seen.insert(nonce), "a nonce repeated");
        }
    }
    // The counter wrapping moves the prefix on instead of starting over.
    let mut wrapping = Authenticator::with_nonce_prefix(keys(&[3]), 9);
    wrapping.nonce_counter = COUNTER_MASK;
    let first = wrapping.next_nonce();
    let second = wrapping.next_nonce();
    assert_ne!(first[4..8], second[4..8]);
    assert_eq!(
        u32::from_be_bytes([second[8], second[9], second[10], second[11]]) & COUNTER_MASK,
        0
    );
}

#[test]
fn encrypted_payloads_are_unreadable_on_the_wire_and_verify_to_the_plaintext() {
    let mut sender = Authenticator::new(keys(&[3]).encrypting_payloads(true));
    let mut receiver = Authenticator::new(keys(&[3]));
    let secret_value = b"SET password hunter2 hunter2 hunter2";
    let plain = datagram(42, secret_value);
    let mut sealed = plain.clone();
    sender.seal(&mut sealed);
    assert_eq!(sealed.len(), plain.len() + TRAILER_LEN);
    let (on_wire, payload_on_wire) = Header::parse(without_trailer(&sealed)).unwrap();
    assert!(on_wire.has_flag(flags::ENCRYPTED), "flagged");
    assert_ne!(
        payload_on_wire,
        &secret_value[..],
        "the wire shows ciphertext"
    );
    assert!(!sealed.windows(7).any(|window| window == b"hunter2"));
    // The receiver decrypts whether or not it encrypts itself.
    let opened = receiver.verify(&sealed).unwrap();
    assert!(matches!(opened, Cow::Owned(_)));
    let (header, payload) = Header::parse(&opened).unwrap();
    assert!(!header.has_flag(flags::ENCRYPTED));
    assert_eq!(payload, secret_value);
    // Every byte but the CRC (which covers the ciphertext, and is refreshed after
    // decrypting) is covered by the tag.
    for index in 0..sealed.len() {
        let mut altered = sealed.clone();
        altered[index] ^= 0x01;
        let outcome = receiver.verify(&altered);
        if field::CRC.contains(&index) {
            assert_eq!(Header::parse(&outcome.unwrap()).unwrap().1, secret_value);
        } else {
            assert!(outcome.is_err(), "byte {index}");
        }
    }
    // A datagram without a payload has nothing to hide and is sealed in clear.
    let mut empty = datagram(42, b"");
    sender.seal(&mut empty);
    assert!(!Header::parse(without_trailer(&empty))
        .unwrap()
        .0
        .has_flag(flags::ENCRYPTED));
    assert!(receiver.verify(&empty).is_ok());
}

#[test]
fn every_change_is_caught() {
    let mut auth = Authenticator::new(keys(&[3]));
    let mut sealed = datagram(42, b"SET k v");
    auth.seal(&mut sealed);
    for index in 0..sealed.len() {
        for bit in 0..8 {
            let mut altered = sealed.clone();
            altered[index] ^= 1 << bit;
            assert!(auth.verify(&altered).is_err(), "byte {index} bit {bit}");
        }
    }
    assert_eq!(auth.verify(&sealed[..20]), Err(AuthError::Truncated));
    assert_eq!(
        auth.verify(&datagram(42, &[0; 40])),
        Err(AuthError::Unauthenticated)
    );
}

#[test]
fn another_secret_or_an_unknown_key_is_refused() {
    let mut sender = Authenticator::new(keys(&[3]));
    let mut sealed = datagram(42, b"x");
    sender.seal(&mut sealed);
    let mut other = Authenticator::new(KeySet::new(vec![DeploymentKey::new(3, [1; KEY_LEN])]));
    assert_eq!(other.verify(&sealed), Err(AuthError::BadTag));
    let mut rotated_away = Authenticator::new(keys(&[4]));
    assert_eq!(rotated_away.verify(&sealed), Err(AuthError::UnknownKey));
    // During a rotation both keys are accepted; the first seals.
    let mut rotating = Authenticator::new(keys(&[4, 3]));
    assert!(rotating.verify(&sealed).is_ok());
    let mut resealed = rotating.verify(&sealed).unwrap().into_owned();
    rotating.seal(&mut resealed);
    assert_eq!(
        u16::from_be_bytes([
            resealed[resealed.len() - TRAILER_LEN],
            resealed[resealed.len() - TRAILER_LEN + 1]
        ]),
        4
    );
}

#[test]
fn the_same_bytes_under_another_session_get_another_tag() {
    let mut auth = Authenticator::new(keys(&[3]));
    let mut a = datagram(1, b"same");
    let mut b = datagram(2, b"same");
    auth.seal(&mut a);
    auth.seal(&mut b);
    assert_ne!(a[a.len() - TAG_LEN..], b[b.len() - TAG_LEN..]);
}

#[test]
fn key_files_parse_and_errors_name_the_line() {
    let text =
        "# keys\n\nkey 2 ".to_string() + &"ab".repeat(32) + "\nkey 1 " + &"01".repeat(32) + "\n";
    let set = KeySet::parse(&text).unwrap();
    assert_eq!(set.key_ids(), vec![2, 1]);
    assert!(!set.encrypts_payloads());
    assert_eq!(KeySet::parse(&set.to_file_text()).unwrap(), set);
    let encrypting = KeySet::parse(&format!("{text}encrypt payloads\n")).unwrap();
    assert!(encrypting.encrypts_payloads());
    assert_eq!(
        KeySet::parse(&encrypting.to_file_text()).unwrap(),
        encrypting
    );
    let cases = [
        ("", 0, "no key"),
        ("key 1 abc\n", 1, "hex digits"),
        ("secret 1 x\n", 1, "unknown entry"),
        ("key x 00\n", 1, "not a number"),
        ("key 1\n", 1, "expected"),
        ("encrypt everything\n", 1, "encrypt payloads"),
    ];
    for (text, line, words) in cases {
        let error = KeySet::parse(text).unwrap_err();
        assert_eq!(error.line, line, "{text:?}");
        assert!(error.to_string().contains(words), "{error}");
    }
    let twice = format!("key 1 {0}\nkey 1 {0}\n", "00".repeat(32));
    assert!(KeySet::parse(&twice)
        .unwrap_err()
        .to_string()
        .contains("twice"));
    let three = format!("key 1 {0}\nkey 2 {0}\nkey 3 {0}\n", "00".repeat(32));
    assert_eq!(KeySet::parse(&three).unwrap_err().line, 3);
    assert!(
        !format!("{:?}", set).contains("abab"),
        "Debug never prints a secret"
    );
}

proptest! {
    #[test]
    fn verify_never_panics_and_accepts_only_what_was_sealed(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let mut auth = Authenticator::new(keys(&[3]));
        let _ = auth.verify(&bytes);
        if let Ok((header, payload)) = Header::parse(&bytes) {
            let mut sealed = header.encode(payload);
            auth.seal(&mut sealed);
            prop_assert!(auth.verify(&sealed).is_ok());
        }
    }
}

#[test]
fn a_device_reuses_the_trailer_of_what_it_verified_and_the_bytes_are_the_same() {
    let mut client = Authenticator::new(keys(&[3]));
    let mut device = Authenticator::new(keys(&[3])).remember_verified(4);
    let mut sealed = datagram(42, b"SET k v");
    client.seal(&mut sealed);
    let mut forwarded = device.verify(&sealed).unwrap().into_owned();
    device.seal(&mut forwarded);
    assert_eq!(forwarded, sealed);
    // Only exact bytes reuse a trailer; anything else is sealed afresh and still verifies.
    let mut other = datagram(42, b"SET k w");
    device.seal(&mut other);
    assert!(client.verify(&other).is_ok());
}

/// A clock the test moves by hand.
fn manual_clock(start_ms: u64) -> (std::sync::Arc<std::sync::atomic::AtomicU64>, WallClock) {
    let now = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(start_ms));
    let read = now.clone();
    let clock: WallClock =
        std::sync::Arc::new(move || read.load(std::sync::atomic::Ordering::Relaxed));
    (now, clock)
}

#[test]
fn a_datagram_is_accepted_only_within_the_replay_window_of_its_seal() {
    use std::sync::atomic::Ordering;
    let start = 1_764_000_000_250; // 250 ms into a second
    let (now, clock) = manual_clock(start);
    let keys = keys(&[3]).with_replay_window_ms(10_000);
    let mut sender = Authenticator::with_nonce_prefix(keys.clone(), 1).with_clock(clock.clone());
    let mut receiver = Authenticator::with_nonce_prefix(keys, 2).with_clock(clock);
    let mut sealed = datagram(42, b"SET k v");
    sender.seal(&mut sealed);
    // The nonce starts with the seal time.
    let nonce_at = sealed.len() - NONCE_LEN - TAG_LEN;
    assert_eq!(
        sealed[nonce_at..nonce_at + 4],
        ((start / 1000) as u32).to_be_bytes()
    );
    // The milliseconds travel too: accepted until exactly the window has passed.
    now.store(start + 10_000, Ordering::Relaxed);
    assert!(receiver.verify(&sealed).is_ok(), "at the window's edge");
    assert_eq!(receiver.sealed_at(), start);
    now.store(start + 10_001, Ordering::Relaxed);
    assert_eq!(receiver.verify(&sealed), Err(AuthError::Stale));
    // A day later, and 2^32 ms later: still stale (the seal time does not wrap).
    for later in [86_400_000, 1 << 32] {
        now.store(start + later, Ordering::Relaxed);
        assert_eq!(receiver.verify(&sealed), Err(AuthError::Stale), "{later}");
    }
    // A receiver whose clock is behind the sender's by more than the window.
    now.store(start - 10_001, Ordering::Relaxed);
    assert_eq!(receiver.verify(&sealed), Err(AuthError::FromTheFuture));
    // A forgery carrying a fresh seal time fails the tag first.
    now.store(start + 60_000, Ordering::Relaxed);
    let mut forged = sealed.clone();
    forged[nonce_at..nonce_at + 4].copy_from_slice(&((start / 1000 + 60) as u32).to_be_bytes());
    // (the tag covers the nonce: any change to the seal time fails it)
    assert_eq!(receiver.verify(&forged), Err(AuthError::BadTag));
}

#[test]
fn the_replay_window_is_read_from_the_key_file() {
    let line = format!("key 1 {}\n", "ab".repeat(KEY_LEN));
    let keys = KeySet::parse(&format!("replay window 30\n{line}")).unwrap();
    assert_eq!(keys.replay_window_ms(), 30_000);
    assert_eq!(
        KeySet::parse(&keys.to_file_text())
            .unwrap()
            .replay_window_ms(),
        30_000
    );
    assert_eq!(
        KeySet::parse(&line).unwrap().replay_window_ms(),
        DEFAULT_REPLAY_WINDOW_MS
    );
    for bad in [
        "replay window 0",
        "replay window 3601",
        "replay window",
        "replay 5",
    ] {
        let error = KeySet::parse(&format!("{line}{bad}\n")).unwrap_err();
        assert_eq!(error.line, 2, "{bad}");
        assert!(error.message.contains("replay window <seconds>"), "{error}");
    }
}

#[test]
fn a_device_reuses_a_verified_trailer_only_within_its_seal_second() {
    use std::sync::atomic::Ordering;
    let start = 1_764_000_000_000;
    let (now, clock) = manual_clock(start);
    let keys = keys(&[3]).with_replay_window_ms(10_000);
    let mut client = Authenticator::with_nonce_prefix(keys.clone(), 1).with_clock(clock.clone());
    let mut device = Authenticator::with_nonce_prefix(keys.clone(), 2)
        .with_clock(clock.clone())
        .remember_verified(4);
    let mut server = Authenticator::with_nonce_prefix(keys, 3).with_clock(clock);
    let mut sealed = datagram(42, b"SET k v");
    client.seal(&mut sealed);
    let inner = device.verify(&sealed).expect("genuine").into_owned();
    // Forwarded at once: the same trailer.
    let mut forwarded = inner.clone();
    device.seal(&mut forwarded);
    assert_eq!(forwarded, sealed);
    // Sent again a minute later (a logged request resent): sealed afresh, and accepted.
    now.store(start + 60_000, Ordering::Relaxed);
    let mut resent = inner;
    device.seal(&mut resent);
    assert_ne!(resent, sealed);
    assert!(server.verify(&resent).is_ok(), "a fresh seal");
    assert_eq!(server.sealed_at(), start + 60_000);
}

#[test]
fn sealing_updates_the_crc_as_computing_it_afresh_would_at_every_length() {
    let mut auth = Authenticator::new(keys(&[3]));
    // Lengths repeat and collide in the delta cache (16 slots): every one stays right.
    for round in 0..3 {
        for payload_len in (0..300).chain([1024, 1368, 1440, 4096, 65_000]) {
            let payload: Vec<u8> = (0..payload_len).map(|i| (i * 7 + round) as u8).collect();
            let mut sealed = datagram(42 + payload_len as u64, &payload);
            auth.seal(&mut sealed);
            let inner = without_trailer(&sealed);
            let packet = Packet::new_unchecked(inner);
            assert_eq!(
                packet.crc(),
                packet.compute_crc(),
                "payload {payload_len}, round {round}"
            );
            assert!(Header::parse(inner).is_ok());
        }
    }
    // Flags already set, or other flags besides: the CRC is right too.
    let mut header = Header::new(PacketType::UpdateRequest, 1, 9, 7);
    header.flags = flags::ENCRYPTED | flags::MAKEUP;
    let mut odd = header.encode(b"value");
    auth.seal(&mut odd);
    let inner = without_trailer(&odd);
    assert!(Header::parse(inner).is_ok());
    assert!(auth.verify(&odd).is_ok());
}

#[test]
fn a_device_reuses_the_trailer_of_the_datagram_it_forwards_among_many_remembered() {
    let mut client = Authenticator::new(keys(&[3]));
    let mut device = Authenticator::new(keys(&[3])).remember_verified(32);
    let mut server = Authenticator::new(keys(&[3]));
    let sealed: Vec<Vec<u8>> = (0..40u64)
        .map(|seq| {
            let mut bytes = Header::new(PacketType::UpdateRequest, 1, 5, seq as u32 + 1)
                .encode(&[seq as u8; 100]);
            client.seal(&mut bytes);
            bytes
        })
        .collect();
    for bytes in &sealed {
        let inner = device.verify(bytes).unwrap().to_vec();
        let mut forwarded = inner.clone();
        device.seal(&mut forwarded);
        assert_eq!(&forwarded, bytes, "the client's trailer, reused");
        assert!(server.verify(&forwarded).is_ok());
    }
    // The oldest ones are forgotten: sealed afresh, with the device's own nonce.
    let mut old = device.verify(&sealed[0]).unwrap().to_vec();
    for bytes in &sealed[1..33] {
        device.verify(bytes).unwrap();
    }
    device.seal(&mut old);
    assert_ne!(old, sealed[0]);
    assert!(server.verify(&old).is_ok());
    // A changed payload under an unchanged header is never given the remembered trailer.
    let mut altered = device.verify(&sealed[39]).unwrap().to_vec();
    *altered.last_mut().unwrap() ^= 1;
    Packet::new_unchecked(&mut altered[..]).fill_checksum();
    device.seal(&mut altered);
    assert_ne!(
        altered[altered.len() - TAG_LEN..],
        sealed[39][sealed[39].len() - TAG_LEN..]
    );
    assert!(server.verify(&altered).is_ok());
}

//! Golden vectors (the same bytes as `docs/protocol.md`), round trips, and rejection reasons.

use super::*;
use proptest::prelude::*;

const SESSION: u64 = 0x0123_4567_89AB_CDEF;

/// docs/protocol.md, example 1: update request, server 1, seq 7, payload "hello".
const GOLDEN_UPDATE: [u8; 37] = [
    0x50, 0x4e, 0x01, 0x01, 0x00, 0x00, 0x00, 0x01, // magic, version, type, flags, server id
    0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, // session id
    0x00, 0x00, 0x00, 0x07, 0x00, 0x00, 0x00, 0x01, // seq, fragment index, fragment count
    0x00, 0x05, 0x00, 0x00, 0x5c, 0xb6, 0x3a, 0x7f, // payload length, device id, crc32c
    0x68, 0x65, 0x6c, 0x6c, 0x6f, // "hello"
];

/// docs/protocol.md, example 2: the PMNet-ACK of device 9 for that update.
const GOLDEN_PMNET_ACK: [u8; 32] = [
    0x50, 0x4e, 0x01, 0x03, 0x00, 0x00, 0x00, 0x01, //
    0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, //
    0x00, 0x00, 0x00, 0x07, 0x00, 0x00, 0x00, 0x01, //
    0x00, 0x00, 0x00, 0x09, 0x88, 0xee, 0xfa, 0xd2, //
];

/// docs/protocol.md, example 3: a make-up server-ACK whose reply is the one byte 0x00 (OK).
const GOLDEN_MAKEUP_SERVER_ACK: [u8; 33] = [
    0x50, 0x4e, 0x01, 0x04, 0x00, 0x01, 0x00, 0x01, //
    0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, //
    0x00, 0x00, 0x00, 0x07, 0x00, 0x00, 0x00, 0x01, //
    0x00, 0x01, 0x00, 0x00, 0x49, 0xe8, 0x83, 0x23, //
    0x00, //
];

/// docs/protocol.md, example 7 (filled from the encoder's output, checked against the doc).
const GOLDEN_BATCH: [u8; 106] = [
    0x50, 0x4e, 0x01, 0x0b, 0x00, 0x00, 0x00, 0x01, //
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, //
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, //
    0x00, 0x4a, 0x00, 0x09, 0xdd, 0x12, 0x74, 0x7b, //
    0x00, 0x25, 0x50, 0x4e, 0x01, 0x01, 0x00, 0x00, //
    0x00, 0x01, 0x01, 0x23, 0x45, 0x67, 0x89, 0xab, //
    0xcd, 0xef, 0x00, 0x00, 0x00, 0x07, 0x00, 0x00, //
    0x00, 0x01, 0x00, 0x05, 0x00, 0x00, 0x5c, 0xb6, //
    0x3a, 0x7f, 0x68, 0x65, 0x6c, 0x6c, 0x6f, 0x00, //
    0x21, 0x50, 0x4e, 0x01, 0x04, 0x00, 0x01, 0x00, //
    0x01, 0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, //
    0xef, 0x00, 0x00, 0x00, 0x07, 0x00, 0x00, 0x00, //
    0x01, 0x00, 0x01, 0x00, 0x00, 0x49, 0xe8, 0x83, //
    0x23, 0x00, //
];

#[test]
fn crc32c_is_the_castagnoli_polynomial() {
    // The standard check value of CRC-32C.
    assert_eq!(crc32c::crc32c(b"123456789"), 0xE306_9283);
}

#[test]
fn golden_update_request() {
    let header = Header::new(PacketType::UpdateRequest, 1, SESSION, 7);
    assert_eq!(header.encode(b"hello"), GOLDEN_UPDATE);
    let (parsed, payload) = Header::parse(&GOLDEN_UPDATE).unwrap();
    assert_eq!(parsed, header);
    assert_eq!(payload, b"hello");
}

#[test]
fn golden_pmnet_ack() {
    let mut header = Header::new(PacketType::PmnetAck, 1, SESSION, 7);
    header.device_id = 9;
    assert_eq!(header.encode(b""), GOLDEN_PMNET_ACK);
    let (parsed, payload) = Header::parse(&GOLDEN_PMNET_ACK).unwrap();
    assert_eq!(parsed, header);
    assert!(payload.is_empty());
}

#[test]
fn golden_makeup_server_ack() {
    let mut header = Header::new(PacketType::ServerAck, 1, SESSION, 7);
    header.flags = flags::MAKEUP;
    assert_eq!(header.encode(&[0x00]), GOLDEN_MAKEUP_SERVER_ACK);
    let (parsed, payload) = Header::parse(&GOLDEN_MAKEUP_SERVER_ACK).unwrap();
    assert!(parsed.has_flag(flags::MAKEUP));
    assert!(!parsed.has_flag(flags::REPLY_UNAVAILABLE));
    assert_eq!(payload, [0x00]);
}

#[test]
fn view_accessors_read_the_documented_ranges() {
    let packet = Packet::new_checked(&GOLDEN_UPDATE[..]).unwrap();
    assert_eq!(packet.magic(), MAGIC);
    assert_eq!(packet.version(), 1);
    assert_eq!(packet.type_code(), 0x01);
    assert_eq!(packet.server_id(), 1);
    assert_eq!(packet.session_id(), SESSION);
    assert_eq!(packet.seq(), 7);
    assert_eq!(packet.fragment_index(), 0);
    assert_eq!(packet.fragment_count(), 1);
    assert_eq!(packet.payload_len(), 5);
    assert_eq!(packet.crc(), 0x5cb6_3a7f);
    assert!(packet.verify_checksum());
}

fn with_crc_fixed(mut bytes: Vec<u8>) -> Vec<u8> {
    let crc = Packet::new_unchecked(&bytes[..]).compute_crc();
    bytes[field::CRC].copy_from_slice(&crc.to_be_bytes());
    bytes
}

#[test]
fn every_rejection_has_its_reason() {
    assert_eq!(Header::parse(&[]), Err(ParseError::Truncated));
    assert_eq!(
        Header::parse(&GOLDEN_UPDATE[..31]),
        Err(ParseError::Truncated)
    );
    assert_eq!(
        Header::parse(&GOLDEN_UPDATE[..36]),
        Err(ParseError::Truncated)
    );
    assert_eq!(Header::parse(b"GET / HTTP/1.1"), Err(ParseError::BadMagic));

    let mut long = GOLDEN_UPDATE.to_vec();
    long.push(0);
    assert_eq!(Header::parse(&long), Err(ParseError::TrailingBytes));

    let mut version = GOLDEN_UPDATE.to_vec();
    version[field::VERSION] = 2;
    assert_eq!(Header::parse(&version), Err(ParseError::UnsupportedVersion));

    let mut corrupt = GOLDEN_UPDATE.to_vec();
    corrupt[33] ^= 0x01;
    assert_eq!(Header::parse(&corrupt), Err(ParseError::BadChecksum));

    // Codes neither defined nor reserved for an in-network function.
    for code in [0x00, 0x0F, 0x40, 0xFF] {
        let mut unknown = GOLDEN_UPDATE.to_vec();
        unknown[field::TYPE] = code;
        assert_eq!(
            Header::parse(&with_crc_fixed(unknown)),
            Err(ParseError::UnknownType),
            "type code {code:#04x}"
        );
    }
    // The reserved ranges parse, for the function that owns the code (a device pipeline
    // counts and drops what no function owns), and encode back to the same bytes.
    for code in [0x10, 0x1F, 0x20, 0x3F] {
        let mut reserved = GOLDEN_UPDATE.to_vec();
        reserved[field::TYPE] = code;
        let reserved = with_crc_fixed(reserved);
        let (header, payload) = Header::parse(&reserved).unwrap();
        assert_eq!(header.packet_type, PacketType::Reserved(code));
        assert_eq!(header.packet_type.code(), code);
        assert_eq!(header.encode(payload), reserved);
    }

    let mut zero_count = GOLDEN_UPDATE.to_vec();
    zero_count[field::FRAGMENT_COUNT].copy_from_slice(&0u16.to_be_bytes());
    assert_eq!(
        Header::parse(&with_crc_fixed(zero_count)),
        Err(ParseError::BadFragment)
    );

    // A count no sender may use: no receiver sizes a reassembly from it.
    let mut count_past = GOLDEN_UPDATE.to_vec();
    count_past[field::FRAGMENT_COUNT].copy_from_slice(&(MAX_FRAGMENT_COUNT + 1).to_be_bytes());
    assert_eq!(
        Header::parse(&with_crc_fixed(count_past)),
        Err(ParseError::BadFragment)
    );
    let mut count_max = GOLDEN_UPDATE.to_vec();
    count_max[field::FRAGMENT_COUNT].copy_from_slice(&MAX_FRAGMENT_COUNT.to_be_bytes());
    assert!(Header::parse(&with_crc_fixed(count_max)).is_ok());

    let mut index_past = GOLDEN_UPDATE.to_vec();
    index_past[field::FRAGMENT_INDEX].copy_from_slice(&1u16.to_be_bytes());
    assert_eq!(
        Header::parse(&with_crc_fixed(index_past)),
        Err(ParseError::BadFragment)
    );
}

#[test]
fn recovery_done_payload_round_trip() {
    assert_eq!(
        decode_recovery_done_payload(&encode_recovery_done_payload(42)),
        Ok(42)
    );
    assert_eq!(
        decode_recovery_done_payload(&[0, 0, 1]),
        Err(ParseError::Truncated)
    );
    assert_eq!(
        decode_recovery_done_payload(&[0; 5]),
        Err(ParseError::TrailingBytes)
    );
}

/// docs/protocol.md, golden vectors 4–6.
#[test]
fn fill_query_fill_reply_and_not_logged_match_the_golden_vectors() {
    let query = Header::new(PacketType::FillQuery, 1, SESSION, 7);
    assert_eq!(
        query.encode(&encode_fill_query_payload(9)),
        [
            0x50, 0x4e, 0x01, 0x08, 0x00, 0x00, 0x00, 0x01, 0x01, 0x23, 0x45, 0x67, 0x89, 0xab,
            0xcd, 0xef, 0x00, 0x00, 0x00, 0x07, 0x00, 0x00, 0x00, 0x01, 0x00, 0x04, 0x00, 0x00,
            0x50, 0xac, 0x34, 0xec, 0x00, 0x00, 0x00, 0x09,
        ]
    );
    let mut reply = Header::new(PacketType::FillReply, 1, SESSION, 7);
    reply.device_id = 9;
    assert_eq!(
        reply.encode(&encode_fill_reply_payload(9, 10)),
        [
            0x50, 0x4e, 0x01, 0x09, 0x00, 0x00, 0x00, 0x01, 0x01, 0x23, 0x45, 0x67, 0x89, 0xab,
            0xcd, 0xef, 0x00, 0x00, 0x00, 0x07, 0x00, 0x00, 0x00, 0x01, 0x00, 0x08, 0x00, 0x09,
            0x65, 0x5e, 0xa8, 0xab, 0x00, 0x00, 0x00, 0x09, 0x00, 0x00, 0x00, 0x0a,
        ]
    );
    let mut notice = Header::new(PacketType::NotLogged, 1, SESSION, 7);
    notice.device_id = 9;
    assert_eq!(
        notice.encode(&[NotLoggedReason::LogFull as u8]),
        [
            0x50, 0x4e, 0x01, 0x0a, 0x00, 0x00, 0x00, 0x01, 0x01, 0x23, 0x45, 0x67, 0x89, 0xab,
            0xcd, 0xef, 0x00, 0x00, 0x00, 0x07, 0x00, 0x00, 0x00, 0x01, 0x00, 0x01, 0x00, 0x09,
            0x0a, 0x05, 0xd7, 0xca, 0x01,
        ]
    );
}

/// docs/protocol.md, golden vectors 9a and 9b: a hold query naming two sessions, and device 9's
/// reply holding an entry of the first.
#[test]
fn hold_query_and_hold_reply_match_the_golden_vectors() {
    let query = Header::new(PacketType::HoldQuery, 1, 0, 7);
    assert_eq!(
        query.encode(&encode_hold_query_payload(&[SESSION, 0x42])),
        [
            0x50, 0x4e, 0x01, 0x0d, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
            0x00, 0x00, 0x00, 0x00, 0x00, 0x07, 0x00, 0x00, 0x00, 0x01, 0x00, 0x10, 0x00, 0x00,
            0xe9, 0x86, 0x9c, 0xbe, 0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, 0x00, 0x00,
            0x00, 0x00, 0x00, 0x00, 0x00, 0x42,
        ]
    );
    let mut reply = Header::new(PacketType::HoldReply, 1, 0, 7);
    reply.device_id = 9;
    let bytes = reply.encode(&encode_hold_reply_payload(&[true, false]));
    assert_eq!(
        bytes,
        [
            0x50, 0x4e, 0x01, 0x0e, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
            0x00, 0x00, 0x00, 0x00, 0x00, 0x07, 0x00, 0x00, 0x00, 0x01, 0x00, 0x03, 0x00, 0x09,
            0x8d, 0xb2, 0x9c, 0x89, 0x00, 0x02, 0x80,
        ]
    );
    assert_eq!(
        decode_hold_reply_payload(&bytes[HEADER_LEN..]),
        Ok(vec![true, false])
    );
}

#[test]
fn fill_payloads_round_trip() {
    assert_eq!(
        decode_fill_query_payload(&encode_fill_query_payload(9)),
        Ok(9)
    );
    assert_eq!(
        decode_fill_reply_payload(&encode_fill_reply_payload(9, 4)),
        Ok((9, 4))
    );
    assert_eq!(
        decode_fill_reply_payload(&[0; 7]),
        Err(ParseError::Truncated)
    );
    assert_eq!(
        decode_fill_reply_payload(&[0; 9]),
        Err(ParseError::TrailingBytes)
    );
    // Dated: the age of the device's first sight of a number above the range.
    let dated = encode_fill_reply_dated_payload(9, 4, 25_000);
    assert_eq!(&dated[..8], &encode_fill_reply_payload(9, 4));
    assert_eq!(dated[8..], [0x00, 0x00, 0x61, 0xa8]);
    assert_eq!(
        decode_fill_reply_dated_payload(&dated),
        Ok((9, 4, Some(25_000)))
    );
    assert_eq!(decode_fill_reply_payload(&dated), Ok((9, 4)));
    assert_eq!(
        decode_fill_reply_dated_payload(&encode_fill_reply_dated_payload(9, 4, FILL_REPLY_UNSEEN)),
        Ok((9, 4, None))
    );
    assert_eq!(
        decode_fill_reply_dated_payload(&encode_fill_reply_payload(9, 4)),
        Ok((9, 4, None))
    );
    for len in [9, 10, 11, 13] {
        assert_eq!(
            decode_fill_reply_dated_payload(&vec![0; len]),
            Err(ParseError::TrailingBytes),
            "{len} bytes"
        );
    }
    for reason in [
        NotLoggedReason::LogFull,
        NotLoggedReason::Collision,
        NotLoggedReason::TooLarge,
        NotLoggedReason::ServerUnverified,
    ] {
        assert_eq!(NotLoggedReason::from_code(reason as u8), Some(reason));
    }
    assert_eq!(NotLoggedReason::from_code(0), None);
}

/// The golden vectors' headers and payloads.
fn golden_vectors() -> [(Header, &'static [u8], &'static [u8]); 3] {
    let update = Header::new(PacketType::UpdateRequest, 1, SESSION, 7);
    let mut ack = Header::new(PacketType::PmnetAck, 1, SESSION, 7);
    ack.device_id = 9;
    let mut makeup = Header::new(PacketType::ServerAck, 1, SESSION, 7);
    makeup.flags = flags::MAKEUP;
    [
        (update, b"hello", &GOLDEN_UPDATE),
        (ack, b"", &GOLDEN_PMNET_ACK),
        (makeup, &[0x00], &GOLDEN_MAKEUP_SERVER_ACK),
    ]
}

#[test]
fn emit_header_writes_the_golden_vectors() {
    for (header, payload, golden) in golden_vectors() {
        let mut buffer = vec![0xAA; HEADER_LEN + payload.len()];
        buffer[HEADER_LEN..].copy_from_slice(payload);
        header.emit_header(payload.len(), &mut buffer);
        assert_eq!(buffer, golden, "{header:?}");

        let mut alone = [0xAA; HEADER_LEN];
        header.emit_header_for(payload, &mut alone);
        assert_eq!(alone, golden[..HEADER_LEN], "{header:?}");
    }
}

#[test]
fn setters_patch_the_golden_update_into_its_pmnet_ack() {
    // What a device does to answer an update: the same identifiers, another type, its id, no
    // payload, a new CRC.
    let mut bytes = GOLDEN_UPDATE[..HEADER_LEN].to_vec();
    let mut packet = Packet::new_unchecked(&mut bytes);
    packet.set_type_code(PacketType::PmnetAck.code());
    packet.set_device_id(9);
    packet.set_payload_len(0);
    packet.fill_checksum();
    assert_eq!(bytes, GOLDEN_PMNET_ACK);

    let mut bytes = GOLDEN_UPDATE.to_vec();
    let mut packet = Packet::new_unchecked(&mut bytes);
    packet.set_crc(0);
    assert!(!packet.verify_checksum());
    packet.fill_checksum();
    assert_eq!(bytes, GOLDEN_UPDATE);
}

#[test]
fn each_setter_writes_its_documented_range_only() {
    type Setter = fn(&mut Packet<&mut [u8]>);
    let cases: [(Setter, std::ops::Range<usize>); 12] = [
        (|p| p.set_magic(u16::MAX), field::MAGIC),
        (
            |p| p.set_version(u8::MAX),
            field::VERSION..field::VERSION + 1,
        ),
        (|p| p.set_type_code(u8::MAX), field::TYPE..field::TYPE + 1),
        (|p| p.set_flags(u16::MAX), field::FLAGS),
        (|p| p.set_server_id(u16::MAX), field::SERVER_ID),
        (|p| p.set_session_id(u64::MAX), field::SESSION_ID),
        (|p| p.set_seq(u32::MAX), field::SEQ),
        (|p| p.set_fragment_index(u16::MAX), field::FRAGMENT_INDEX),
        (|p| p.set_fragment_count(u16::MAX), field::FRAGMENT_COUNT),
        (|p| p.set_payload_len(u16::MAX), field::PAYLOAD_LEN),
        (|p| p.set_device_id(u16::MAX), field::DEVICE_ID),
        (|p| p.set_crc(u32::MAX), field::CRC),
    ];
    for (set, range) in cases {
        let mut bytes = [0u8; HEADER_LEN + 4];
        set(&mut Packet::new_unchecked(&mut bytes[..]));
        for (at, byte) in bytes.iter().enumerate() {
            let expected = if range.contains(&at) { u8::MAX } else { 0 };
            assert_eq!(*byte, expected, "byte {at} after writing {range:?}");
        }
    }
}

fn arbitrary_header() -> impl Strategy<Value = Header> {
    (
        proptest::sample::select(PacketType::ALL.to_vec()),
        any::<u16>(),
        any::<u16>(),
        any::<u64>(),
        any::<u32>(),
        1u16..=MAX_FRAGMENT_COUNT,
        any::<u16>(),
        any::<u16>(),
    )
        .prop_map(
            |(packet_type, flags, server_id, session_id, seq, fragment_count, index, device_id)| {
                Header {
                    packet_type,
                    flags,
                    server_id,
                    session_id,
                    seq,
                    fragment_index: index % fragment_count,
                    fragment_count,
                    device_id,
                }
            },
        )
}

proptest! {
    #[test]
    fn emit_then_parse_round_trips(
        header in arbitrary_header(),
        payload in proptest::collection::vec(any::<u8>(), 0..2048),
    ) {
        let bytes = header.encode(&payload);
        let (parsed, parsed_payload) = Header::parse(&bytes).unwrap();
        prop_assert_eq!(parsed, header);
        prop_assert_eq!(parsed_payload, &payload[..]);
    }

    #[test]
    fn setters_round_trip_through_parse(
        header in arbitrary_header(),
        payload in proptest::collection::vec(any::<u8>(), 0..2048),
    ) {
        let mut bytes = vec![0u8; HEADER_LEN + payload.len()];
        let mut packet = Packet::new_unchecked(&mut bytes);
        packet.set_magic(MAGIC);
        packet.set_version(VERSION);
        packet.set_type_code(header.packet_type.code());
        packet.set_flags(header.flags);
        packet.set_server_id(header.server_id);
        packet.set_session_id(header.session_id);
        packet.set_seq(header.seq);
        packet.set_fragment_index(header.fragment_index);
        packet.set_fragment_count(header.fragment_count);
        packet.set_payload_len(payload.len() as u16);
        packet.set_device_id(header.device_id);
        packet.payload_mut().copy_from_slice(&payload);
        packet.fill_checksum();
        let (parsed, parsed_payload) = Header::parse(&bytes).unwrap();
        prop_assert_eq!(parsed, header);
        prop_assert_eq!(parsed_payload, &payload[..]);
        prop_assert_eq!(&bytes, &header.encode(&payload));
    }

    #[test]
    fn emit_header_equals_emit(
        header in arbitrary_header(),
        payload in proptest::collection::vec(any::<u8>(), 0..2048),
        garbage in any::<u8>(),
    ) {
        let emitted = header.encode(&payload);
        // Whatever the header bytes held before is overwritten.
        let mut in_place = vec![garbage; HEADER_LEN + payload.len()];
        in_place[HEADER_LEN..].copy_from_slice(&payload);
        header.emit_header(payload.len(), &mut in_place);
        prop_assert_eq!(&in_place, &emitted);
        let mut alone = [garbage; HEADER_LEN];
        header.emit_header_for(&payload, &mut alone);
        prop_assert_eq!(&alone[..], &emitted[..HEADER_LEN]);
    }

    #[test]
    fn parsing_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..128)) {
        let _ = Header::parse(&bytes);
    }

    #[test]
    fn any_single_bit_flip_is_rejected(
        header in arbitrary_header(),
        payload in proptest::collection::vec(any::<u8>(), 0..256),
        bit in any::<usize>(),
    ) {
        let mut bytes = header.encode(&payload);
        let bit = bit % (bytes.len() * 8);
        bytes[bit / 8] ^= 1 << (bit % 8);
        prop_assert!(Header::parse(&bytes).is_err());
    }
}

#[test]
fn golden_batch_of_an_update_and_a_server_ack() {
    // docs/protocol.md, example 7: device 9 packs example 1 and example 3 for server 1.
    let batch = crate::encode_batch(
        1,
        9,
        &[GOLDEN_UPDATE.to_vec(), GOLDEN_MAKEUP_SERVER_ACK.to_vec()],
    );
    let (header, payload) = Header::parse(&batch).unwrap();
    assert_eq!(header.packet_type, PacketType::Batch);
    assert_eq!(
        (
            header.server_id,
            header.device_id,
            header.session_id,
            header.seq
        ),
        (1, 9, 0, 0)
    );
    let entries: Vec<&[u8]> = crate::batch_entries(payload).map(Result::unwrap).collect();
    assert_eq!(
        entries,
        vec![&GOLDEN_UPDATE[..], &GOLDEN_MAKEUP_SERVER_ACK[..]]
    );
    assert_eq!(batch, GOLDEN_BATCH);
}

#[test]
fn golden_replicated_update_request() {
    // docs/protocol.md, golden vector 8: vector 1 from a client waiting for several devices.
    let mut header = Header::new(PacketType::UpdateRequest, 1, SESSION, 7);
    header.flags = crate::replication::REPLICATED;
    let bytes = header.encode(b"hello");
    let hex: Vec<String> = bytes.iter().map(|byte| format!("{byte:02x}")).collect();
    assert_eq!(hex.join(" "), GOLDEN_REPLICATED_HEX);
    let (parsed, payload) = Header::parse(&bytes).unwrap();
    assert!(parsed.has_flag(crate::replication::REPLICATED) && payload == b"hello");
}

const GOLDEN_REPLICATED_HEX: &str = "50 4e 01 01 04 00 00 01 01 23 45 67 89 ab cd ef \
     00 00 00 07 00 00 00 01 00 05 00 00 8d ed 8d f8 68 65 6c 6c 6f";

#[test]
fn golden_forward_from_a_primary() {
    // docs/protocol.md, golden vector 9: vector 1 as a primary server forwards it to its
    // replicas, after request 6 of the same session: a barrier descriptor (no key) whose order
    // names that request, then the request.
    let mut header = Header::new(PacketType::UpdateRequest, 1, SESSION, 7);
    header.flags = crate::cache::KEYED | crate::replication::FROM_PRIMARY;
    let descriptor = crate::cache::WriteDescriptor {
        order: crate::cache::WriteOrder {
            after_session: SESSION,
            after_seq: 6,
            stamp: 0,
        },
        key: &[],
        reply_after: None,
        afters: &[],
    };
    let mut payload = Vec::new();
    descriptor.emit(&mut payload);
    payload.extend_from_slice(b"hello");
    let bytes = header.encode(&payload);
    let hex: Vec<String> = bytes.iter().map(|byte| format!("{byte:02x}")).collect();
    assert_eq!(hex.join(" "), GOLDEN_FORWARD_HEX);
    let (parsed, payload) = Header::parse(&bytes).unwrap();
    assert!(parsed.has_flag(crate::replication::FROM_PRIMARY));
    let (descriptor, request) = crate::cache::WriteDescriptor::parse(payload).unwrap();
    assert!(descriptor.is_barrier());
    assert_eq!(descriptor.order.after(), Some((SESSION, 6)));
    assert_eq!(request, b"hello");
}

const GOLDEN_FORWARD_HEX: &str = "50 4e 01 01 09 00 00 01 01 23 45 67 89 ab cd ef \
     00 00 00 07 00 00 00 01 00 1e 00 00 ea 3e d0 7f 01 23 45 67 89 ab cd ef 00 00 00 06 \
     00 00 00 00 00 00 00 00 00 ff ff 00 00 68 65 6c 6c 6f";

#[test]
fn hold_payloads_round_trip_and_reject_what_does_not_fit() {
    let sessions = [1u64, 0x0123_4567_89AB_CDEF, u64::MAX];
    let query = crate::encode_hold_query_payload(&sessions);
    assert_eq!(query.len(), 24);
    assert_eq!(crate::decode_hold_query_payload(&query).unwrap(), sessions);
    assert!(crate::decode_hold_query_payload(&[]).is_err());
    assert!(crate::decode_hold_query_payload(&query[..23]).is_err());
    let too_many = vec![0u8; 8 * (crate::HOLD_QUERY_SESSIONS_MAX + 1)];
    assert!(crate::decode_hold_query_payload(&too_many).is_err());
    let held = [true, false, false, false, false, false, false, false, true];
    let reply = crate::encode_hold_reply_payload(&held);
    assert_eq!(reply, vec![0x00, 0x09, 0x80, 0x80]);
    assert_eq!(crate::decode_hold_reply_payload(&reply).unwrap(), held);
    assert!(crate::decode_hold_reply_payload(&reply[..3]).is_err());
    assert!(crate::decode_hold_reply_payload(&[0x00, 0x01, 0x80, 0x00]).is_err());
    assert!(crate::decode_hold_reply_payload(&[0x00]).is_err());
}

#[test]
fn golden_update_carrying_its_client_address() {
    // docs/protocol.md, golden vector 8a: vector 8 as a device forwards it to the next device
    // of a chain for client 10.0.0.9:7000 (flags REPLICATED | CLIENT_ADDRESS, the address
    // after the payload).
    use crate::replication::{
        with_client_address, without_client_address, CLIENT_ADDRESS, CLIENT_ADDRESS_LEN, REPLICATED,
    };
    let mut header = Header::new(PacketType::UpdateRequest, 1, SESSION, 7);
    header.flags = REPLICATED;
    let client: std::net::SocketAddr = "10.0.0.9:7000".parse().unwrap();
    let bytes = with_client_address(&header, b"hello", client).unwrap();
    let hex: Vec<String> = bytes.iter().map(|byte| format!("{byte:02x}")).collect();
    assert_eq!(hex.join(" "), GOLDEN_CLIENT_ADDRESS_HEX);
    assert!(bytes.capacity() >= bytes.len() + TRAILER_ROOM);
    let (parsed, payload) = Header::parse(&bytes).unwrap();
    assert!(parsed.has_flag(REPLICATED | CLIENT_ADDRESS));
    assert_eq!(payload.len(), 5 + CLIENT_ADDRESS_LEN);
    // Stripped: vector 8 again, byte for byte, and the address.
    let (inner, carried) = without_client_address(&parsed, payload).unwrap();
    let hex: Vec<String> = inner.iter().map(|byte| format!("{byte:02x}")).collect();
    assert_eq!(hex.join(" "), GOLDEN_REPLICATED_HEX);
    assert_eq!(carried, client);
}

const GOLDEN_CLIENT_ADDRESS_HEX: &str = "50 4e 01 01 84 00 00 01 01 23 45 67 89 ab cd ef \
     00 00 00 07 00 00 00 01 00 18 00 00 db 09 c9 bb 68 65 6c 6c 6f 04 1b 58 0a 00 00 09 \
     00 00 00 00 00 00 00 00 00 00 00 00";

#[test]
fn client_addresses_round_trip_and_malformed_ones_are_refused() {
    use crate::replication::{
        decode_client_address, encode_client_address, with_client_address, without_client_address,
        ClientAddressError, CLIENT_ADDRESS_LEN,
    };
    for text in ["10.0.0.9:7000", "[2001:db8::7]:9", "[::ffff:10.0.0.1]:1"] {
        let address: std::net::SocketAddr = text.parse().unwrap();
        assert_eq!(
            decode_client_address(&encode_client_address(address)),
            Ok(address)
        );
    }
    let good = encode_client_address("10.0.0.9:7000".parse().unwrap());
    let mut bad = good;
    bad[0] = 5;
    assert_eq!(
        decode_client_address(&bad),
        Err(ClientAddressError::BadFamily)
    );
    let mut bad = good;
    bad[18] = 1;
    assert_eq!(
        decode_client_address(&bad),
        Err(ClientAddressError::NonZeroPadding)
    );
    let mut bad = good;
    bad[1..3].copy_from_slice(&[0, 0]);
    assert_eq!(
        decode_client_address(&bad),
        Err(ClientAddressError::Unreachable)
    );
    assert_eq!(
        decode_client_address(&encode_client_address("0.0.0.0:9".parse().unwrap())),
        Err(ClientAddressError::Unreachable)
    );
    assert_eq!(
        decode_client_address(&good[1..]),
        Err(ClientAddressError::Truncated)
    );
    let header = Header::new(PacketType::UpdateRequest, 1, SESSION, 7);
    assert_eq!(
        without_client_address(&header, &good[..CLIENT_ADDRESS_LEN - 1]),
        Err(ClientAddressError::Truncated)
    );
    // A datagram that would grow past the largest one goes without it.
    let largest = vec![0; MAX_DATAGRAM_LEN - HEADER_LEN - TRAILER_ROOM];
    assert!(with_client_address(&header, &largest, "10.0.0.9:7000".parse().unwrap()).is_none());
    let fits = &largest[..largest.len() - CLIENT_ADDRESS_LEN];
    let bytes = with_client_address(&header, fits, "10.0.0.9:7000".parse().unwrap()).unwrap();
    assert_eq!(bytes.len() + TRAILER_ROOM, MAX_DATAGRAM_LEN);
}

proptest! {
    /// Any bytes after any payload: stripping never panics, and what it accepts it gives
    /// back as the update without them, which parses.
    #[test]
    fn stripping_a_client_address_never_panics(
        payload in proptest::collection::vec(any::<u8>(), 0..64),
        tail in proptest::collection::vec(any::<u8>(), 19..=19),
        family in prop_oneof![Just(4u8), Just(6u8), any::<u8>()],
    ) {
        let mut header = Header::new(PacketType::UpdateRequest, 1, SESSION, 7);
        header.flags = crate::replication::CLIENT_ADDRESS;
        let mut all = payload.clone();
        all.extend_from_slice(&tail);
        all[payload.len()] = family;
        for cut in [0, payload.len(), all.len()] {
            if let Ok((inner, _)) = crate::replication::without_client_address(&header, &all[..cut]) {
                let (parsed, rest) = Header::parse(&inner).unwrap();
                prop_assert!(!parsed.has_flag(crate::replication::CLIENT_ADDRESS));
                prop_assert_eq!(rest.len() + 19, cut);
            }
        }
    }
}

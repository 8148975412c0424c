use std::net::{Ipv4Addr, SocketAddrV4};

use proptest::prelude::*;

use super::*;

const SRC_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 1];
const DST_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 2];

fn src() -> SocketAddrV4 {
    SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 1), 40000)
}

fn dst() -> SocketAddrV4 {
    SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 2), 7000)
}

fn build(payload: &[u8]) -> Vec<u8> {
    let mut buf = vec![0u8; FRAME_OVERHEAD + payload.len()];
    let len = write_udp(&mut buf, SRC_MAC, DST_MAC, src(), dst(), 64, payload).unwrap();
    assert_eq!(len, buf.len());
    buf
}

/// Recomputes the IPv4 header checksum after a test edited the header (at `ip`).
fn fix_ip_checksum(frame: &mut [u8], ip: usize) {
    let header_len = (frame[ip] & 0x0f) as usize * 4;
    frame[ip + 10] = 0;
    frame[ip + 11] = 0;
    let checksum = !fold(sum(&frame[ip..ip + header_len], 0));
    frame[ip + 10..ip + 12].copy_from_slice(&checksum.to_be_bytes());
}

#[test]
fn round_trip() {
    let frame = build(b"hello pmnet");
    let parsed = parse_udp(&frame).unwrap();
    assert_eq!(parsed.src_mac, SRC_MAC);
    assert_eq!(parsed.dst_mac, DST_MAC);
    assert_eq!(parsed.src, src());
    assert_eq!(parsed.dst, dst());
    assert_eq!(parsed.ttl, 64);
    assert_eq!(parsed.vlan, None);
    assert_eq!(parsed.payload, b"hello pmnet");
    assert_eq!(frame[20] & 0x40, 0x40, "DF set");
}

#[test]
fn empty_and_odd_payloads_round_trip() {
    for payload in [&b""[..], b"x", b"xyz", b"odd length!"] {
        let frame = build(payload);
        assert_eq!(parse_udp(&frame).unwrap().payload, payload);
    }
}

#[test]
fn write_refuses_what_does_not_fit() {
    let mut buf = [0u8; FRAME_OVERHEAD + 3];
    assert_eq!(
        write_udp(&mut buf, SRC_MAC, DST_MAC, src(), dst(), 1, b"abcd"),
        None
    );
    assert_eq!(
        write_udp(&mut buf, SRC_MAC, DST_MAC, src(), dst(), 1, b"abc"),
        Some(buf.len())
    );
    let huge = vec![0u8; MAX_UDP_PAYLOAD + 1];
    let mut big = vec![0u8; FRAME_OVERHEAD + huge.len()];
    assert_eq!(
        write_udp(&mut big, SRC_MAC, DST_MAC, src(), dst(), 1, &huge),
        None
    );
    let max = &huge[..MAX_UDP_PAYLOAD];
    let len = write_udp(&mut big, SRC_MAC, DST_MAC, src(), dst(), 1, max).unwrap();
    assert_eq!(
        parse_udp(&big[..len]).unwrap().payload.len(),
        MAX_UDP_PAYLOAD
    );
}

#[test]
fn trailing_ethernet_padding_is_ignored() {
    let mut frame = build(b"ab");
    frame.resize(60, 0xee);
    assert_eq!(parse_udp(&frame).unwrap().payload, b"ab");
}

#[test]
fn one_vlan_tag_is_skipped() {
    let plain = build(b"tagged");
    let mut frame = plain[..12].to_vec();
    frame.extend_from_slice(&[0x81, 0x00, 0x20, 0x0a]);
    frame.extend_from_slice(&plain[12..]);
    let parsed = parse_udp(&frame).unwrap();
    assert_eq!(parsed.vlan, Some(0x200a));
    assert_eq!(parsed.payload, b"tagged");

    let mut stacked = plain[..12].to_vec();
    stacked.extend_from_slice(&[0x81, 0x00, 0x00, 0x01, 0x81, 0x00, 0x00, 0x02]);
    stacked.extend_from_slice(&plain[12..]);
    assert_eq!(parse_udp(&stacked), Err(FrameError::StackedVlan));
    let mut qinq = stacked.clone();
    qinq[12..14].copy_from_slice(&[0x81, 0x00]);
    qinq[16..18].copy_from_slice(&[0x88, 0xa8]);
    assert_eq!(parse_udp(&qinq), Err(FrameError::StackedVlan));
}

#[test]
fn ip_options_are_skipped() {
    let plain = build(b"opts");
    // Rebuild with 4 bytes of options (NOP NOP NOP EOL).
    let mut frame = plain[..34].to_vec();
    frame.extend_from_slice(&[1, 1, 1, 0]);
    frame.extend_from_slice(&plain[34..]);
    frame[14] = 0x46;
    let total = u16::from_be_bytes([frame[16], frame[17]]) + 4;
    frame[16..18].copy_from_slice(&total.to_be_bytes());
    fix_ip_checksum(&mut frame, 14);
    assert_eq!(parse_udp(&frame).unwrap().payload, b"opts");
}

#[test]
fn the_udp_checksum_can_be_ignored() {
    let mut frame = build(b"partial");
    frame[40] ^= 0xff;
    assert_eq!(parse_udp(&frame), Err(FrameError::UdpChecksum));
    let parsed = parse_udp_with(&frame, UdpChecksum::Ignore).unwrap();
    assert_eq!(parsed.payload, b"partial");
    frame[24] ^= 1; // the IPv4 header checksum is still verified
    assert_eq!(
        parse_udp_with(&frame, UdpChecksum::Ignore),
        Err(FrameError::IpChecksum)
    );
}

#[test]
fn zero_udp_checksum_means_none() {
    let mut frame = build(b"no checksum");
    frame[40] = 0;
    frame[41] = 0;
    assert_eq!(parse_udp(&frame).unwrap().payload, b"no checksum");
}

#[test]
fn every_error_reason() {
    let good = build(b"payload!");
    let cases: Vec<(FrameError, Vec<u8>)> = vec![
        (FrameError::Truncated, good[..13].to_vec()),
        (FrameError::Truncated, good[..14 + 19].to_vec()),
        (FrameError::Truncated, {
            let mut f = good[..12].to_vec();
            f.extend_from_slice(&[0x81, 0x00, 0x00]);
            f
        }),
        (FrameError::NotIpv4, {
            let mut f = good.clone();
            f[12..14].copy_from_slice(&[0x86, 0xdd]);
            f
        }),
        (FrameError::StackedVlan, {
            let mut f = good.clone();
            f[12..14].copy_from_slice(&[0x88, 0xa8]);
            f
        }),
        (FrameError::IpVersion, {
            let mut f = good.clone();
            f[14] = 0x65;
            f
        }),
        (FrameError::IpHeaderLength, {
            let mut f = good.clone();
            f[14] = 0x44;
            f
        }),
        (FrameError::IpHeaderLength, {
            let mut f = good[..14 + 20].to_vec();
            f[14] = 0x46; // options past the frame
            f
        }),
        (FrameError::IpTotalLength, {
            let mut f = good.clone();
            f[16..18].copy_from_slice(&1000u16.to_be_bytes());
            fix_ip_checksum(&mut f, 14);
            f
        }),
        (FrameError::IpTotalLength, {
            let mut f = good.clone();
            f[16..18].copy_from_slice(&19u16.to_be_bytes());
            fix_ip_checksum(&mut f, 14);
            f
        }),
        (FrameError::IpChecksum, {
            let mut f = good.clone();
            f[22] ^= 1; // ttl changed, checksum not
            f
        }),
        (FrameError::Fragment, {
            let mut f = good.clone();
            f[20] = 0x20; // MF
            fix_ip_checksum(&mut f, 14);
            f
        }),
        (FrameError::Fragment, {
            let mut f = good.clone();
            f[20..22].copy_from_slice(&0x0010u16.to_be_bytes()); // offset 16 * 8
            fix_ip_checksum(&mut f, 14);
            f
        }),
        (FrameError::NotUdp, {
            let mut f = good.clone();
            f[23] = 6;
            fix_ip_checksum(&mut f, 14);
            f
        }),
        (FrameError::Truncated, {
            let mut f = good[..14 + 20 + 4].to_vec();
            f[16..18].copy_from_slice(&24u16.to_be_bytes());
            fix_ip_checksum(&mut f, 14);
            f
        }),
        (FrameError::UdpLength, {
            let mut f = good.clone();
            f[38..40].copy_from_slice(&7u16.to_be_bytes());
            f
        }),
        (FrameError::UdpLength, {
            let mut f = good.clone();
            f[38..40].copy_from_slice(&100u16.to_be_bytes());
            f
        }),
        (FrameError::UdpChecksum, {
            let mut f = good.clone();
            let last = f.len() - 1;
            f[last] ^= 0x55;
            f
        }),
    ];
    let mut seen = std::collections::HashSet::new();
    for (i, (expected, frame)) in cases.iter().enumerate() {
        assert_eq!(parse_udp(frame), Err(*expected), "case {i}");
        seen.insert(*expected);
    }
    for reason in FrameError::ALL {
        assert!(seen.contains(&reason), "{reason:?} untested");
        assert_eq!(FrameError::ALL[reason.index()], reason);
        assert!(!reason.name().is_empty());
    }
}

#[test]
fn checksum_matches_a_known_header() {
    // The IPv4 header example from RFC 1071 discussions (Wikipedia): checksum 0xb861.
    let header = [
        0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 0xc0, 0xa8, 0x00,
        0x01, 0xc0, 0xa8, 0x00, 0xc7,
    ];
    assert_eq!(!fold(sum(&header, 0)), 0xb861);
}

proptest! {
    #[test]
    fn parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..1600)) {
        let _ = parse_udp(&bytes);
    }

    #[test]
    fn parse_never_panics_on_mutated_frames(
        payload in proptest::collection::vec(any::<u8>(), 0..300),
        edits in proptest::collection::vec((0usize..400, any::<u8>()), 0..8),
        cut in 0usize..400,
    ) {
        let mut frame = build(&payload);
        for (at, value) in edits {
            if let Some(byte) = frame.get_mut(at) {
                *byte = value;
            }
        }
        frame.truncate(cut.max(1).min(frame.len()));
        if let Ok(parsed) = parse_udp(&frame) {
            prop_assert!(parsed.payload.len() <= frame.len());
        }
    }

    #[test]
    fn write_then_parse_round_trips(
        payload in proptest::collection::vec(any::<u8>(), 0..1500),
        src_ip in any::<u32>(), dst_ip in any::<u32>(),
        src_port in any::<u16>(), dst_port in any::<u16>(),
        ttl in any::<u8>(),
        src_mac in any::<[u8; 6]>(), dst_mac in any::<[u8; 6]>(),
    ) {
        let src = SocketAddrV4::new(Ipv4Addr::from(src_ip), src_port);
        let dst = SocketAddrV4::new(Ipv4Addr::from(dst_ip), dst_port);
        let mut buf = vec![0u8; 2048];
        let len = write_udp(&mut buf, src_mac, dst_mac, src, dst, ttl, &payload).unwrap();
        let parsed = parse_udp(&buf[..len]).unwrap();
        prop_assert_eq!(parsed.src, src);
        prop_assert_eq!(parsed.dst, dst);
        prop_assert_eq!(parsed.ttl, ttl);
        prop_assert_eq!(parsed.src_mac, src_mac);
        prop_assert_eq!(parsed.dst_mac, dst_mac);
        prop_assert_eq!(parsed.payload, &payload[..]);
    }
}

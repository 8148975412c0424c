//! Feeds arbitrary bytes to the datagram parser: it must never panic, and whatever it accepts
//! must re-encode to the same bytes; a batch's entries are parsed the same way, and the entries
//! read back must re-encode to the batch; the read cache's descriptors are parsed from every
//! payload and must re-encode to the bytes they were read from. Each input is tried twice: as it is, and with the magic,
//! version, length and CRC fixed up, so that the fuzzer also reaches the checks behind the CRC.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pmnet_wire::cache::{ReadDescriptor, WriteDescriptor};
use pmnet_wire::{
    batch_entries, encode_batch, field, Header, Packet, PacketType, HEADER_LEN, MAGIC, VERSION,
};

/// A descriptor read from `payload` re-encodes to the bytes it was read from.
fn check_descriptors(payload: &[u8]) {
    if let Ok((write, rest)) = WriteDescriptor::parse(payload) {
        let mut out = Vec::new();
        write.emit(&mut out);
        assert_eq!(out.len() + rest.len(), payload.len());
        assert_eq!(&payload[..out.len()], &out[..]);
    }
    if let Ok((read, rest)) = ReadDescriptor::parse(payload) {
        let mut out = Vec::new();
        read.emit(&mut out);
        assert_eq!(out.len() + rest.len(), payload.len());
        assert_eq!(&payload[..out.len()], &out[..]);
    }
}

fn check(data: &[u8]) {
    check_descriptors(data);
    if let Ok((header, payload)) = Header::parse(data) {
        assert_eq!(header.encode(payload), data);
        check_descriptors(payload);
        if header.packet_type == PacketType::Batch {
            let entries: Result<Vec<Vec<u8>>, _> = batch_entries(payload)
                .map(|entry| entry.map(<[u8]>::to_vec))
                .collect();
            for entry in entries.iter().flatten() {
                check(entry);
            }
            if let Ok(entries) = entries {
                let mut again = encode_batch(header.server_id, header.device_id, &entries);
                // The batch's other header fields are the sender's; compare the payloads.
                again.drain(..HEADER_LEN);
                assert_eq!(again, payload);
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    check(data);
    if data.len() >= HEADER_LEN && data.len() - HEADER_LEN <= usize::from(u16::MAX) {
        let mut fixed = data.to_vec();
        fixed[field::MAGIC].copy_from_slice(&MAGIC.to_be_bytes());
        fixed[field::VERSION] = VERSION;
        let payload_len = (data.len() - HEADER_LEN) as u16;
        fixed[field::PAYLOAD_LEN].copy_from_slice(&payload_len.to_be_bytes());
        let crc = Packet::new_unchecked(&fixed[..]).compute_crc();
        fixed[field::CRC].copy_from_slice(&crc.to_be_bytes());
        check(&fixed);
    }
});

//! What the MAC costs per datagram: `cargo run --release -p pmnet-auth --example mac_cost`.
//! Seals and verifies datagrams of the demo's update (155 B) and of a 1 KB value, each many
//! times under a few sessions (the per-session key cached, as in a running endpoint), and
//! prints nanoseconds per operation.

use std::time::Instant;

use pmnet_auth::{Authenticator, DeploymentKey, KeySet};
use pmnet_wire::{Header, PacketType};

fn main() {
    let mut auth = Authenticator::new(KeySet::new(vec![DeploymentKey::new(1, [7; 32])]));
    println!("datagram bytes   seal ns   verify ns   (BLAKE3 keyed hash, 16-byte tag, key cached)");
    for payload_len in [123usize, 1024, 1400] {
        let payload = vec![0x5A; payload_len];
        let datagrams: Vec<Vec<u8>> = (0..8u64)
            .map(|session| {
                Header::new(PacketType::UpdateRequest, 1, session + 1, 1).encode(&payload)
            })
            .collect();
        let rounds = 200_000;
        let start = Instant::now();
        let mut sealed = Vec::new();
        for round in 0..rounds {
            let mut datagram = datagrams[round % datagrams.len()].clone();
            auth.seal(&mut datagram);
            sealed = datagram;
        }
        let seal_ns = start.elapsed().as_nanos() as f64 / rounds as f64;
        let start = Instant::now();
        let mut ok = 0usize;
        for _ in 0..rounds {
            ok += usize::from(auth.verify(&sealed).is_ok());
        }
        let verify_ns = start.elapsed().as_nanos() as f64 / rounds as f64;
        assert_eq!(ok, rounds);
        println!(
            "{:>14}   {:>7.0}   {:>9.0}",
            datagrams[0].len(),
            seal_ns,
            verify_ns
        );
    }
}

//! What authentication costs per datagram: `cargo run --release -p pmnet-auth --example mac_cost`.
//! Seals and verifies datagrams of the demo's update (155 B), of a 1 KB value and of a full
//! 1400-byte datagram, many times under a few sessions (the per-session keys cached, as in a
//! running endpoint), with the payload in clear (the default: a MAC) and encrypted, and
//! prints nanoseconds per operation: the fastest of 200 batches of 1 000, the cost on a CPU
//! that nothing else is using (a mean over a machine shared with other work measures the
//! other work too). `pmnet bench --auth-cost` prints the same per hop next to end-to-end
//! figures.

use std::time::Instant;

use pmnet_auth::{Authenticator, DeploymentKey, KeySet};
use pmnet_wire::{Header, PacketType};

const BATCH: usize = 1_000;
const BATCHES: usize = 200;

/// Nanoseconds per call of `operation` in the fastest of [`BATCHES`] batches (after one
/// batch of warm-up).
fn fastest(mut operation: impl FnMut(usize)) -> f64 {
    for round in 0..BATCH {
        operation(round);
    }
    let mut best = f64::MAX;
    for batch in 0..BATCHES {
        let start = Instant::now();
        for round in 0..BATCH {
            operation(batch * BATCH + round);
        }
        best = best.min(start.elapsed().as_nanos() as f64 / BATCH as f64);
    }
    best
}

fn main() {
    println!("AES-256-GCM (aws-lc), 16-byte tag, 30-byte trailer, session keys cached");
    println!("payload      datagram bytes   seal ns   verify ns");
    for encrypt in [false, true] {
        let keys = KeySet::new(vec![DeploymentKey::new(1, [7; 32])]).encrypting_payloads(encrypt);
        let mut auth = Authenticator::new(keys);
        for payload_len in [123usize, 1024, 1368] {
            let payload = vec![0x5A; payload_len];
            let datagrams: Vec<Vec<u8>> = (0..8u64)
                .map(|session| {
                    Header::new(PacketType::UpdateRequest, 1, session + 1, 1).encode(&payload)
                })
                .collect();
            // Each round refills one buffer from the encoded datagram (what an endpoint
            // does: encode, then seal), included in the time.
            let mut buffer = Vec::with_capacity(2048);
            let seal_ns = fastest(|round| {
                buffer.clear();
                buffer.extend_from_slice(&datagrams[round % datagrams.len()]);
                auth.seal(&mut buffer);
            });
            let sealed = buffer;
            let mut ok = 0usize;
            let verify_ns = fastest(|_| {
                ok += usize::from(auth.verify(&sealed).is_ok());
            });
            assert_eq!(ok, BATCH * (BATCHES + 1));
            println!(
                "{:<12} {:>14}   {:>7.0}   {:>9.0}",
                if encrypt { "encrypted" } else { "in clear" },
                datagrams[0].len(),
                seal_ns,
                verify_ns
            );
        }
    }
}

//! Feeds arbitrary bytes to the authenticated parser: verification, then parsing, must never
//! panic; whatever verifies must be exactly what sealing its inner bytes gives (so it was made
//! with the key); and a genuine sealed datagram with any one change must fail.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pmnet_auth::{Authenticator, DeploymentKey, KeySet};
use pmnet_wire::{Header, PacketType};

fuzz_target!(|data: &[u8]| {
    let mut auth = Authenticator::new(KeySet::new(vec![DeploymentKey::new(1, [7; 32])]));
    if let Ok(inner) = auth.verify(data) {
        let _ = Header::parse(inner);
        let mut resealed = inner.to_vec();
        auth.seal(&mut resealed);
        assert_eq!(resealed, data, "a datagram verified that the key did not make");
    }
    if let [at, change, ..] = data {
        let mut genuine =
            Header::new(PacketType::UpdateRequest, 1, 0x0123_4567_89ab_cdef, 9).encode(b"fuzz");
        auth.seal(&mut genuine);
        let index = usize::from(*at) % genuine.len();
        genuine[index] ^= change | 1;
        assert!(auth.verify(&genuine).is_err(), "a changed datagram verified");
    }
});

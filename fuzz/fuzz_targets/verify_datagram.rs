//! Feeds arbitrary bytes to the authenticated parser: verification, then parsing, must never
//! panic; nothing the fuzzer makes verifies (only the key holder can make a tag); and a
//! genuine sealed datagram, in clear or encrypted, with any one change must fail (the CRC of
//! an encrypted one aside: it covers the ciphertext and is refreshed after decrypting).
#![no_main]

use libfuzzer_sys::fuzz_target;
use pmnet_auth::{Authenticator, DeploymentKey, KeySet};
use pmnet_wire::{field, Header, PacketType};

fuzz_target!(|data: &[u8]| {
    let keys = KeySet::new(vec![DeploymentKey::new(1, [7; 32])]);
    let mut auth = Authenticator::with_nonce_prefix(keys.clone(), 1);
    if let Ok(inner) = auth.verify(data) {
        let _ = Header::parse(&inner);
        panic!("a datagram verified that the key did not make");
    }
    if let [at, change, encrypt, rest @ ..] = data {
        let encrypt = encrypt & 1 == 1;
        let mut sealer = Authenticator::with_nonce_prefix(keys.encrypting_payloads(encrypt), 2);
        let mut genuine =
            Header::new(PacketType::UpdateRequest, 1, 0x0123_4567_89ab_cdef, 9).encode(rest);
        sealer.seal(&mut genuine);
        assert!(auth.verify(&genuine).is_ok(), "a genuine datagram failed");
        let index = usize::from(*at) % genuine.len();
        if encrypt && rest.len() > 0 && field::CRC.contains(&index) {
            return;
        }
        genuine[index] ^= change | 1;
        assert!(auth.verify(&genuine).is_err(), "a changed datagram verified");
    }
});

//! The requests a run issues: each client's session key, the values its updates write, and
//! what was sent, for the checkers to compare the servers' applied requests against.

use pmnet_proto::RequestKind;
use pmnet_store::Request;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

use crate::world::World;

/// The key a session's requests write and read.
pub(super) fn key_of(session_id: u64) -> Vec<u8> {
    format!("session-{session_id:016x}").into_bytes()
}

/// The value an update of `seq` writes: the sequence number, padded to `len` bytes.
fn value_of(seq: u32, len: usize) -> Vec<u8> {
    let mut value = seq.to_string().into_bytes();
    value.resize(len.max(value.len()), b'.');
    value
}

/// The sequence number a value written by [`value_of`] carries.
pub(super) fn seq_of_value(value: &[u8]) -> u32 {
    let digits: Vec<u8> = value
        .iter()
        .copied()
        .take_while(u8::is_ascii_digit)
        .collect();
    std::str::from_utf8(&digits)
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(0)
}

/// A request a client sent: its kind and its bytes.
pub(super) struct Issued {
    pub(super) kind: RequestKind,
    pub(super) payload: Vec<u8>,
}

/// Have `client` send its next request (an update, or now and then a bypass read of its
/// session's key), unless it left, sent `limit` already or cannot send now.
pub(super) fn issue(
    world: &mut World,
    rng: &mut ChaCha8Rng,
    issued: &mut [Vec<Issued>],
    client: usize,
    limit: u32,
) {
    if world.clients[client].gone
        || issued[client].len() as u32 >= limit
        || !world.clients[client].client.can_send()
    {
        return;
    }
    let key = key_of(world.session(client));
    let seq = issued[client].len() as u32 + 1;
    let (kind, payload) = if rng.random_bool(0.75) {
        let len = if rng.random_bool(0.1) { 3000 } else { 16 };
        let value = value_of(seq, len);
        (
            RequestKind::Update,
            Request::Set {
                key: &key,
                value: &value,
            }
            .to_bytes(),
        )
    } else {
        (RequestKind::Bypass, Request::Get { key: &key }.to_bytes())
    };
    let sent = match kind {
        RequestKind::Update => world.update(client, &payload),
        RequestKind::Bypass => world.bypass(client, &payload),
    };
    assert_eq!(sent, seq, "the client numbers its requests 1, 2, 3, ...");
    issued[client].push(Issued { kind, payload });
}

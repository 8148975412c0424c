//! The requests a run issues: each client's session key, the values its updates write, and
//! what was sent, for the checkers to compare the servers' applied requests against.

use pmnet_proto::RequestKind;
use pmnet_store::{Reply, Request};
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
        || world.clients[client].arrives_later
        || issued[client].len() as u32 >= limit
        || !world.clients[client].client.can_send()
    {
        return;
    }
    let key = key_of(world.session(client));
    let seq = issued[client].len() as u32 + 1;
    if world.keyed && rng.random_bool(0.2) {
        // A cache read: unsequenced, checked on its own (see `check_cache_reads`).
        let read = Request::Get { key: &key }.to_bytes();
        let id = world.cache_read(client, &key, &read);
        world.cache_reads.push((client, id, seq - 1));
        return;
    }
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
        RequestKind::Update if world.keyed => {
            let value = match Request::decode(&payload) {
                Ok(Request::Set { value, .. }) => value.to_vec(),
                _ => unreachable!("an update here is a SET"),
            };
            let after = Reply::Value(value).to_bytes();
            if rng.random_bool(0.1) {
                // A barrier (a write that names no key): the device orders it after every
                // session's keyed writes in flight, and the cache empties.
                world.keyed_update(client, b"", None, &payload)
            } else {
                world.keyed_update(client, &key, Some(&after), &payload)
            }
        }
        RequestKind::Update => world.update(client, &payload),
        RequestKind::Bypass => world.bypass(client, &payload),
    };
    assert_eq!(sent, seq, "the client numbers its requests 1, 2, 3, ...");
    issued[client].push(Issued { kind, payload });
}

/// Check every cache read that completed: its value is one its own session wrote (the
/// session writes only its own key), and it reflects every update of the session issued
/// before the read that completed (read-your-writes; a failed update may have been filled).
/// Returns how many were checked and how many the devices served.
pub(super) fn check_cache_reads(world: &World, issued: &[Vec<Issued>]) -> (u64, u64) {
    let (mut checked, mut by_device) = (0, 0);
    for &(client, id, before) in &world.cache_reads {
        let Some(read) = world.read_event(client, id) else {
            continue;
        };
        let Ok((reply, from)) = &read.outcome else {
            continue;
        };
        if matches!(Reply::decode(reply), Ok(Reply::Error(message)) if message == pmnet_proto::WAITS_FOR_ROOM)
        {
            // The update it must see waits for room in a full store: answered so, with no
            // value, rather than held (docs/protocol.md, "A store that is full").
            assert_eq!(*from, 0, "invariant: only the server answers a read so");
            continue;
        }
        checked += 1;
        if *from != 0 {
            by_device += 1;
        }
        let completed = |seq: u32| {
            matches!(
                world.completion(client, seq),
                Some(pmnet_proto::ClientEvent::Completed { .. })
            )
        };
        let floor = (1..=before)
            .rev()
            .find(|&seq| {
                issued[client][seq as usize - 1].kind == RequestKind::Update && completed(seq)
            })
            .unwrap_or(0);
        let seen = match Reply::decode(reply) {
            Ok(Reply::Value(value)) => seq_of_value(&value),
            Ok(Reply::NotFound) => 0,
            other => panic!("invariant: cache read {id} of client {client} answered {other:?}"),
        };
        assert!(
            seen >= floor,
            "invariant: cache read {id} of client {client} (after request {before}) saw the \
             update of seq {seen}, older than its session's completed update {floor} \
             (read-your-writes)"
        );
        if seen > 0 {
            assert!(
                issued[client]
                    .get(seen as usize - 1)
                    .is_some_and(|request| request.kind == RequestKind::Update),
                "invariant: cache read {id} of client {client} saw a value its session never \
                 wrote (seq {seen})"
            );
        }
    }
    (checked, by_device)
}

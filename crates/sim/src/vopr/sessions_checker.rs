//! Invariants 1–3 on the final state, session by session:
//! 1. every request a client saw complete is applied by its server exactly once, and every
//!    session's requests are applied in sequence order;
//! 2. nothing is applied that its client did not send: each applied request is byte for byte
//!    the client's, or the empty no-op fill of a request the client reported failed;
//! 3. a bypass read sees every earlier update of its session and no later one;
//!
//! and the store holds each session's last applied update.

use std::collections::HashMap;

use pmnet_proto::{ClientEvent, Completion, RequestKind};
use pmnet_store::Reply;

use crate::world::{ClientNode, ServerApp, World};

use super::workload::{key_of, seq_of_value, Issued};
use super::FaultSummary;

/// A request a server applied: session, sequence number, kind and bytes.
type Applied = (u64, u32, RequestKind, Vec<u8>);

/// Invariants 1–3, session by session; returns the number of completed requests and what was
/// checked, for the trace.
pub(super) fn check_sessions(
    world: &World,
    issued: &[Vec<Issued>],
    summary: &mut FaultSummary,
) -> (u64, Vec<String>) {
    let mut notes = Vec::new();
    let mut completed_count = 0;
    for (client, requests) in issued.iter().enumerate() {
        let (completed, note) = check_session(world, client, requests, summary);
        completed_count += completed;
        notes.push(note);
    }
    (completed_count, notes)
}

/// Invariants 1–3 for `client`'s session; returns the number of its completed requests and
/// what was checked.
fn check_session(
    world: &World,
    client: usize,
    requests: &[Issued],
    summary: &mut FaultSummary,
) -> (u64, String) {
    let session_id = world.session(client);
    let app = &world.primary(world.server_of(client)).app;
    let applied: Vec<&Applied> = app
        .applied
        .iter()
        .filter(|(s, ..)| *s == session_id)
        .collect();
    let node = &world.clients[client];
    let outcome = ClientOutcome::of(node);
    summary.counts.requests_failed += outcome.failed.len() as u64;
    summary.counts.noop_fills += node.client.counters().noop_fills_sent;

    // 1 and 2: each of the session's numbers applied at most once, in order, each the
    // client's own request or the no-op fill of a failed one; a number never applied (the
    // server skipped it, or it is missing at the end) is one the client reported failed.
    let applied_by_seq = check_applied_in_order_as_sent(client, &applied, requests, &outcome);
    check_unapplied_failed(client, requests, &applied_by_seq, &outcome, summary);
    check_completed_applied(client, requests, &applied_by_seq, &outcome);

    let reads_checked = check_reads(client, requests, &applied, &outcome);
    let stored = check_store_holds_last_update(client, app, session_id, &applied);
    let fills = applied
        .iter()
        .filter(|(_, _, kind, request)| *kind == RequestKind::Bypass && request.is_empty())
        .count();
    let note = format!(
        "invariants 1-3, client{client} (s={session_id:x}): {} requests, {} completed, \
         {} failed; {} applied once in order, as sent ({fills} no-op fills); {reads_checked} \
         reads saw their session's latest write; the store holds seq {}",
        requests.len(),
        outcome.completions.len(),
        outcome.failed.len(),
        applied.len(),
        stored.map_or_else(|| "none".to_string(), |seq| seq.to_string()),
    );
    (outcome.completions.len() as u64, note)
}

/// What a client saw of its requests.
struct ClientOutcome<'a> {
    /// The completed requests, by sequence number.
    completions: HashMap<u32, &'a Completion>,
    /// The sequence numbers the client reported failed, or had in flight when it left.
    failed: Vec<u32>,
}

impl<'a> ClientOutcome<'a> {
    fn of(node: &'a ClientNode) -> ClientOutcome<'a> {
        let mut failed = Vec::new();
        let mut completions: HashMap<u32, &Completion> = HashMap::new();
        for event in &node.completed {
            match event {
                ClientEvent::Completed {
                    seq, completion, ..
                } => {
                    completions.insert(*seq, completion);
                }
                ClientEvent::Failed { seq, .. } => failed.push(*seq),
            }
        }
        // A client that left never reports what it had in flight; nothing of it was acked.
        failed.extend(node.abandoned.iter().copied());
        ClientOutcome {
            completions,
            failed,
        }
    }
}

/// Invariants 1 and 2 on what was applied: in increasing sequence order, each the client's
/// own request or the no-op fill of a failed one. Returns the applied requests by number.
fn check_applied_in_order_as_sent<'a>(
    client: usize,
    applied: &[&'a Applied],
    requests: &[Issued],
    outcome: &ClientOutcome,
) -> HashMap<u32, &'a Applied> {
    let mut applied_by_seq: HashMap<u32, &Applied> = HashMap::new();
    let mut previous = 0;
    for entry in applied {
        let (_, seq, kind, request) = *entry;
        assert!(
            *seq > previous,
            "invariant: client {client} applied seq {seq} after {previous}"
        );
        previous = *seq;
        let sent = requests
            .get(*seq as usize - 1)
            .unwrap_or_else(|| panic!("invariant: client {client} seq {seq} never sent"));
        let is_fill = request.is_empty() && *kind == RequestKind::Bypass;
        assert!(
            (*kind == sent.kind && *request == sent.payload)
                || (is_fill && outcome.failed.contains(seq)),
            "invariant: client {client} seq {seq}: applied a request the client did not send"
        );
        applied_by_seq.insert(*seq, *entry);
    }
    applied_by_seq
}

/// Each sequence number never applied is one the client reported failed; counts them.
fn check_unapplied_failed(
    client: usize,
    requests: &[Issued],
    applied_by_seq: &HashMap<u32, &Applied>,
    outcome: &ClientOutcome,
    summary: &mut FaultSummary,
) {
    for seq in 1..=requests.len() as u32 {
        if !applied_by_seq.contains_key(&seq) {
            assert!(
                outcome.failed.contains(&seq),
                "invariant: client {client} seq {seq} was never applied"
            );
            summary.counts.sequence_numbers_skipped += 1;
        }
    }
}

/// Invariant 1: each request the client saw complete was applied, as sent.
fn check_completed_applied(
    client: usize,
    requests: &[Issued],
    applied_by_seq: &HashMap<u32, &Applied>,
    outcome: &ClientOutcome,
) {
    // In order: the first broken number is the one a failure names, whatever the thread.
    let mut seqs: Vec<&u32> = outcome.completions.keys().collect();
    seqs.sort_unstable();
    for seq in seqs {
        let applied_request = applied_by_seq
            .get(seq)
            .map(|(_, _, _, request)| request)
            .unwrap_or_else(|| {
                panic!("invariant: client {client} seq {seq} completed but was never applied")
            });
        assert_eq!(
            applied_request,
            &requests[*seq as usize - 1].payload,
            "invariant: client {client} seq {seq} completed but was not applied as sent"
        );
    }
}

/// Invariant 3: a bypass read saw the latest update of its session before it, and nothing
/// later. Returns the number of reads checked.
fn check_reads(
    client: usize,
    requests: &[Issued],
    applied: &[&Applied],
    outcome: &ClientOutcome,
) -> usize {
    let mut reads_checked = 0;
    let mut completions: Vec<(&u32, &&Completion)> = outcome.completions.iter().collect();
    completions.sort_unstable_by_key(|(seq, _)| **seq);
    for (seq, completion) in completions {
        let Completion::Replied {
            reply,
            makeup: false,
        } = completion
        else {
            continue;
        };
        let index = *seq as usize - 1;
        if requests[index].kind != RequestKind::Bypass {
            continue;
        }
        let expected = applied
            .iter()
            .rev()
            .filter(|(_, applied_seq, ..)| (*applied_seq as usize) <= index)
            .find(|(_, _, kind, request)| *kind == RequestKind::Update && !request.is_empty())
            .map(|(_, seq, ..)| *seq);
        let seen = match Reply::decode(reply) {
            Ok(Reply::Value(value)) => Some(seq_of_value(&value)),
            Ok(Reply::NotFound) => None,
            other => panic!("invariant: client {client} read {seq} got {other:?}"),
        };
        assert_eq!(
            seen, expected,
            "invariant: client {client} read {seq} missed its session's writes"
        );
        reads_checked += 1;
    }
    reads_checked
}

/// The store holds the session's last applied update; returns the sequence number it holds.
fn check_store_holds_last_update(
    client: usize,
    app: &ServerApp,
    session_id: u64,
    applied: &[&Applied],
) -> Option<u32> {
    let last_update = applied
        .iter()
        .rev()
        .find(|(_, _, kind, request)| *kind == RequestKind::Update && !request.is_empty())
        .map(|(_, seq, ..)| *seq);
    let store = app.kv.as_ref().expect("the swarm runs with the store");
    let stored = store.get(&key_of(session_id)).map(seq_of_value);
    assert_eq!(
        stored, last_update,
        "invariant: client {client}: the store lost an update"
    );
    stored
}

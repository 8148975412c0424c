//! Invariant 6, replicated servers (docs/replication.md): on every live replica of a server,
//! each session's requests are applied at most once and in sequence order; and every request a
//! client of that server saw complete is applied there, as its primary applied it. A request
//! that was never acknowledged may differ (docs/replication.md, "What is not promised"): a
//! replica may lack it (no one resends it after its primary crashed), and after a promotion
//! the new primary may have applied its client's no-op fill where a replica applied the
//! request itself.

use std::collections::HashMap;

use pmnet_proto::ClientEvent;

use crate::world::World;

use super::FaultSummary;

/// Check every live replica; returns what was checked, for the trace. Panics (with the
/// seed's report) on a violation.
pub(super) fn check_replicas(world: &World, summary: &mut FaultSummary) -> Vec<String> {
    let per_server = world.replicas.len() / world.servers.len();
    let mut notes = Vec::new();
    for server in 0..world.servers.len() {
        let primary = &world.primary(server).app;
        for replica in server * per_server..(server + 1) * per_server {
            let node = &world.replicas[replica];
            if node.lost {
                notes.push(if world.controller.is_some() {
                    format!("invariant 6, replica{replica}: lost for good (not checked)")
                } else {
                    format!("invariant 6, replica{replica}: promoted (not checked)")
                });
                continue;
            }
            if world.promoted[server] == Some(replica) {
                notes.push(format!(
                    "invariant 6, replica{replica}: the primary of server{server} now (checked \
                     as the primary)"
                ));
                continue;
            }
            let mut checked = 0;
            for client in (0..world.clients.len()).filter(|&c| world.server_of(c) == server) {
                checked += check_session(world, client, replica, primary, &node.app);
            }
            summary.counts.replica_requests_checked += checked;
            notes.push(format!(
                "invariant 6, replica{replica} of server{server}: {checked} completed requests \
                 applied once, in order, as on the primary"
            ));
        }
    }
    notes
}

/// One session on one replica; returns the completed requests checked.
fn check_session(
    world: &World,
    client: usize,
    replica: usize,
    primary: &crate::world::ServerApp,
    on_replica: &crate::world::ServerApp,
) -> u64 {
    let session = world.session(client);
    let primary_by_seq: HashMap<u32, &Vec<u8>> = primary
        .applied
        .iter()
        .filter(|(s, ..)| *s == session)
        .map(|(_, seq, _, request)| (*seq, request))
        .collect();
    // In order: the first missing number is the one a failure names, whatever the thread.
    let completed: std::collections::BTreeSet<u32> = world.clients[client]
        .completed
        .iter()
        .filter_map(|event| match event {
            ClientEvent::Completed { seq, .. } => Some(*seq),
            ClientEvent::Failed { .. } => None,
        })
        .collect();
    let mut last = 0;
    let mut applied = HashMap::new();
    for (_, seq, _, request) in on_replica.applied.iter().filter(|(s, ..)| *s == session) {
        assert!(
            *seq > last,
            "invariant 6: replica{replica} applied seq {seq} of client{client} after seq {last}"
        );
        last = *seq;
        applied.insert(*seq, request);
    }
    let mut checked = 0;
    for seq in &completed {
        let Some(request) = applied.get(seq) else {
            panic!(
                "invariant 6: client{client}'s seq {seq} completed but replica{replica} never \
                 applied it"
            );
        };
        if let Some(expected) = primary_by_seq.get(seq) {
            assert!(
                expected == request,
                "invariant 6: replica{replica} applied seq {seq} of client{client} unlike its \
                 primary: {} bytes there, {} here",
                expected.len(),
                request.len()
            );
        }
        checked += 1;
    }
    checked
}

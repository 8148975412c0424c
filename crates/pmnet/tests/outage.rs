//! A server back from an outage applies every acknowledged update without waiting out a
//! request lifetime per gap: real `pmnet device` and `pmnet server` processes on loopback.
//!
//! The server is down; four clients write through the device, whose slots are too small for
//! some of their updates (forwarded unlogged, with a not-logged notice); the clients give up on
//! those, send their no-op fills (which find the server down) and go away. The server starts.
//! Every acked update must be applied, and by the device's answers — the fills it saw, sent
//! again when the server asks — not by the server's lifetime-based skip, which could come only
//! `gap_fill_after` (20 s, the longest request lifetime and a margin) after the server noticed
//! each gap: the test checks that nothing was skipped.

mod common;

use std::time::Duration;

use common::{poll_until, Cluster};
use pmnet_proto::{ClientError, ClientEvent, Completion};
use pmnet_runtime::{ClientSession, SessionOptions, WaitMode};
use pmnet_store::{Reply, Request};

const CLIENTS: usize = 4;
const UPDATES: u32 = 48;

fn key_of(client: usize) -> Vec<u8> {
    format!("outage-{client}").into_bytes()
}

/// Every 7th update is too large for a 256-byte slot (and the last one never is).
fn value_of(client: usize, index: u32) -> Vec<u8> {
    let mut value = format!("{client}:{index}:").into_bytes();
    let len = if index % 7 == 3 && index + 1 < UPDATES {
        400
    } else {
        16
    };
    value.resize(len, b'.');
    value
}

/// Write the updates of `client` through the device with the server down; the value of its
/// last acked update, and how many were not logged.
fn write(session: &mut ClientSession, client: usize) -> (Vec<u8>, u32) {
    let key = key_of(client);
    let (mut started, mut done, mut not_logged) = (0, 0, 0);
    let mut values = std::collections::HashMap::new();
    let mut last_acked = (0, Vec::new());
    while done < UPDATES {
        while started < UPDATES && session.can_send() {
            let value = value_of(client, started);
            let seq = session
                .start_update(
                    &Request::Set {
                        key: &key,
                        value: &value,
                    }
                    .to_bytes(),
                )
                .expect("update started");
            values.insert(seq, value);
            started += 1;
        }
        match session.next_event(Some(std::time::Instant::now() + Duration::from_secs(20))) {
            Some(ClientEvent::Completed {
                seq,
                completion: Completion::Logged { .. },
                ..
            }) => {
                done += 1;
                if seq > last_acked.0 {
                    last_acked = (seq, values[&seq].clone());
                }
            }
            Some(ClientEvent::Failed {
                error: ClientError::NotLogged(_),
                ..
            }) => {
                done += 1;
                not_logged += 1;
            }
            other => panic!("client {client}: {other:?}"),
        }
    }
    (last_acked.1, not_logged)
}

#[test]
fn after_an_outage_every_acked_update_is_applied_from_what_the_device_knows() {
    let mut cluster = Cluster::start_with_device_options(&["--slot-size", "256"]);
    cluster.stop_server();
    let mut expected = Vec::new();
    let mut not_logged = 0;
    for client in 0..CLIENTS {
        let mut options = SessionOptions::new(1, cluster.device_addr);
        options.wait = WaitMode::Blocking;
        options.window = Some(16);
        // Short, so that the clients give up on what the device could not log (and send their
        // fills) in a moment; the server's skip still waits for the longest lifetime.
        options.request_lifetime = Some(Duration::from_millis(500));
        let mut session = ClientSession::open(options).expect("client session");
        let (last, failed) = write(&mut session, client);
        expected.push(last);
        not_logged += failed;
        // The client goes away: it answers no retransmission request any more.
        drop(session);
    }
    assert!(not_logged > 0, "some updates were too large to log");
    cluster.start_server();
    let started = std::time::Instant::now();
    // A reader of its own (another session: it waits for nothing of the writers) polls until
    // each key holds its client's last acked value.
    let mut options = SessionOptions::new(1, cluster.device_addr);
    options.wait = WaitMode::Blocking;
    let mut reader = ClientSession::open(options).expect("reader session");
    for (client, value) in expected.iter().enumerate() {
        poll_until(
            &format!("client {client}'s last acked update applied"),
            || {
                let completion = reader
                    .bypass(
                        &Request::Get {
                            key: &key_of(client),
                        }
                        .to_bytes(),
                    )
                    .map_err(|error| format!("{error}"))?;
                let Completion::Replied { reply, .. } = completion else {
                    return Err(format!("{completion:?}"));
                };
                match Reply::decode(&reply) {
                    Ok(Reply::Value(read)) if read == *value => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            },
        );
    }
    // Reported, not asserted (timing): how long after the server's banner the reader saw
    // every acked update.
    eprintln!(
        "every acked update read back {:?} after the server started ({not_logged} updates not \
         logged)",
        started.elapsed()
    );
    let server = cluster.server();
    // Closed by the clients' fills the device sent again, not by a skip after a lifetime.
    assert_eq!(
        server.metric("pmnet_server_sequence_numbers_skipped_total", ""),
        Ok(0.0)
    );
    let fills = server
        .metric("pmnet_server_noop_fills_received_total", "")
        .expect("fills metric");
    assert!(fills >= f64::from(not_logged), "{fills} fills received");
    let device = cluster.device();
    let resent = device
        .metric("pmnet_device_fills_resent_total", r#"port="pmnet""#)
        .expect("fills resent metric");
    assert!(resent >= f64::from(not_logged), "{resent} fills resent");
    device.wait_metric(
        "pmnet_device_log_live_entries",
        "",
        "to drop to 0 (the server acked everything)",
        |live| live == 0.0,
    );
    // And the server says its recovery is over.
    server.wait_metric("pmnet_server_recovering", "", "to be 0", |value| {
        value == 0.0
    });
    server.wait_metric("pmnet_server_recovery_draining", "", "to be 0", |value| {
        value == 0.0
    });
}

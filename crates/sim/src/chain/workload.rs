//! The chain store's world's clients: each now and then starts over with a new session, and
//! starts a read, put, deletion or compare-and-set (on the version it saw last: a lock's take
//! and release) of one of six keys while the faults last; each outcome goes into the key's
//! history for the linearizability check.

use pmnet_lincheck::{Operation, VersionedInput, VersionedOutput, PENDING};
use pmnet_netchain::{ClientOp, Outcome};
use pmnet_proto::Time;
use rand::Rng;

use super::world::{client_addr, client_session, ChainWorld, Client};

impl ChainWorld {
    /// Every client: start over or start a request (while the faults last), fire its timers,
    /// send, and record its outcomes.
    pub(super) fn clients_step(&mut self) -> Result<(), String> {
        for index in 0..self.clients.len() {
            self.maybe_start(index)?;
            let now = self.now;
            let client = &mut self.clients[index];
            client.session.handle_timeout(now);
            while let Some(transmit) = client.session.poll_transmit() {
                self.network.send(
                    now,
                    client_addr(index),
                    transmit.destination,
                    transmit.bytes,
                );
            }
            while let Some((_, outcome)) = self.clients[index].session.poll_outcome() {
                self.record(index, outcome)?;
            }
        }
        Ok(())
    }

    /// Client `index`, idle while the faults last: now and then a new session (a client
    /// process restarted), and now and then a new request.
    fn maybe_start(&mut self, index: usize) -> Result<(), String> {
        let now = self.now;
        let healing = self.healing();
        let client = &mut self.clients[index];
        if client.current.is_none() && !healing && self.churn.random_bool(0.002) {
            self.generation += 1;
            let session = 0x5e55_0000 + index as u64 + (self.generation << 8);
            client.session = client_session(session, self.controlled);
            self.report.session_churn += 1;
        }
        if client.current.is_none() && !healing && self.rng.random_bool(0.02) {
            let key = self.keys[self.rng.random_range(0..self.keys.len())].clone();
            self.next_value += 1;
            let value = self.next_value.to_be_bytes().to_vec();
            let op = match self.rng.random_range(0..20) {
                0..=7 => ClientOp::Get,
                8..=13 => ClientOp::Put(value),
                14..=15 => ClientOp::Delete,
                // Compare-and-set on what this client saw last: a lock's take and release.
                _ => ClientOp::CompareAndSet {
                    expected: client.seen.get(&key).copied().unwrap_or(0),
                    value,
                },
            };
            client
                .session
                .start(now, &key, op.clone())
                .map_err(|_| "busy".to_owned())?;
            client.current = Some((key, op, now.as_nanos()));
            self.report.operations += 1;
        }
        Ok(())
    }

    /// Client `index`'s request ended with `outcome`: into its key's history.
    fn record(&mut self, index: usize, outcome: Outcome) -> Result<(), String> {
        let now = self.now;
        let client = &mut self.clients[index];
        let (key, op, call) = client.current.take().expect("a request in flight");
        let input = match &op {
            ClientOp::Get => VersionedInput::Read,
            ClientOp::Put(value) => VersionedInput::Write(Some(value.clone())),
            ClientOp::Delete => VersionedInput::Write(None),
            ClientOp::CompareAndSet { expected, value } => VersionedInput::CompareAndSet {
                expected: *expected,
                value: value.clone(),
            },
        };
        let (output, ret) = output_of(client, &key, &op, outcome, now)
            .map_err(|other| format!("seed {}: unexpected outcome {other:?}", self.seed))?;
        if ret != PENDING {
            self.report.completed += 1;
        }
        self.note(&format!("client{index}"), || {
            format!("{key:?} {op:?} called at {call} ns: {output:?}")
        });
        self.history.push((
            key,
            Operation {
                client: index as u64,
                call,
                ret,
                input,
                output,
            },
        ));
        Ok(())
    }
}

/// What the history records of `outcome` and when it returned ([`PENDING`]: may or may not
/// have taken effect); the client notes the version it saw. `Err`: an outcome no request of
/// the world's can have.
fn output_of(
    client: &mut Client,
    key: &[u8],
    op: &ClientOp,
    outcome: Outcome,
    now: Time,
) -> Result<(VersionedOutput<Vec<u8>>, u64), Outcome> {
    let now = now.as_nanos();
    Ok(match outcome {
        Outcome::Value { version, value } => {
            let present = if value.is_some() { version } else { 0 };
            client.seen.insert(key.to_vec(), present);
            (VersionedOutput::Value { version, value }, now)
        }
        Outcome::Written { version } => {
            let present = if matches!(op, ClientOp::Delete) {
                0
            } else {
                version
            };
            client.seen.insert(key.to_vec(), present);
            (VersionedOutput::Written { version }, now)
        }
        Outcome::CompareFailed { version, value } => {
            client.seen.insert(key.to_vec(), version);
            let value = (version != 0).then_some(value);
            (VersionedOutput::CompareFailed { version, value }, now)
        }
        Outcome::Unknown => (VersionedOutput::Unknown, PENDING),
        other => return Err(other),
    })
}

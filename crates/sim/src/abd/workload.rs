//! Replicated memory's world's clients: while the faults last each keeps one or two
//! operations in flight — reads and writes of 1 to 4 lines, nearly all on the 8 contended
//! lines, now and then a cold line, 1 % beyond the memory's end — and device clients now and
//! then start over with a new session; once healed and every node is a member, each client's
//! next two operations (a write, then a read). Every outcome goes into the lines' histories.

use std::time::Duration;

use pmnet_abd::{AbdClient, AbdError, ClientConfig, OpKind, LINE};
use pmnet_lincheck::{Operation, RegisterInput, RegisterOutput, PENDING};
use rand::Rng;

use super::line::{line_bytes, line_value};
use super::world::{client_addr, device_addr, send_all};
use super::world::{AbdWorld, Engine, InFlight};
use super::{COLD_SHARE, HOT, LINES};

impl AbdWorld {
    /// Clients start the operations due.
    pub(super) fn start_operations(&mut self) -> Result<(), String> {
        for index in 0..self.clients.len() {
            self.maybe_start(index)?;
        }
        Ok(())
    }

    /// Client `index`: a new session now and then (device clients, while the faults last),
    /// and its next operation if one is due.
    fn maybe_start(&mut self, index: usize) -> Result<(), String> {
        let now = self.now;
        let healing = self.healing();
        let client = &mut self.clients[index];
        if let Engine::Device(session) = &mut client.engine {
            if !healing && client.in_flight.is_empty() && self.churn.random_bool(0.001) {
                *session = AbdClient::new(ClientConfig::new(device_addr(), self.churn.random()));
                self.report.session_churn += 1;
            }
        }
        if self.start.is_none() || client.in_flight.len() >= client.depth || now < client.next_at {
            return Ok(());
        }
        if healing && !self.final_operation_due(index) {
            return Ok(());
        }
        let token = self.next_token;
        self.next_token += 1;
        let (first, count) = self.choose_lines(healing);
        // The first operation once healed is a write, the second a read.
        let write = if healing {
            self.clients[index].final_ops == 1
        } else {
            self.rng.random_bool(0.5)
        };
        let (kind, values) = self.operation(write, count);
        let client = &mut self.clients[index];
        let started = match &mut client.engine {
            Engine::Device(session) => session.start(now, token, first, count, kind),
            Engine::Direct(coordinator) => coordinator.start(now, token, first, count, kind),
        };
        self.report.operations += 1;
        if write {
            self.report.writes += 1;
        } else {
            self.report.reads += 1;
        }
        if count > 1 {
            self.report.multi_line += 1;
        }
        let actor = format!("client{index}");
        self.network.trace.note(now, &actor, || {
            format!(
                "starts {} of lines {first}+{count} {values:?}: {started:?}",
                if write { "a write" } else { "a read" }
            )
        });
        let beyond = first + u32::from(count) > LINES;
        match started {
            Ok(()) => {
                let op = InFlight {
                    first,
                    count,
                    values,
                    call: now.as_nanos(),
                    must_complete: healing,
                };
                client.in_flight.insert(token, op);
            }
            Err(AbdError::OutOfRange) if beyond => self.report.out_of_range += 1,
            Err(error) => {
                return Err(format!(
                    "{now}: client {index}'s operation on lines {first}+{count} refused: \
                     {error:?}"
                ))
            }
        }
        client.next_at = now + Duration::from_micros(self.rng.random_range(0..3000));
        Ok(())
    }

    /// Once healed, and every node a member again: client `index`'s next operation, which
    /// must complete, if it has one left and nothing in flight.
    fn final_operation_due(&mut self, index: usize) -> bool {
        let members = self
            .nodes
            .iter()
            .all(|node| node.up && node.node().is_member());
        let client = &mut self.clients[index];
        if client.final_ops == 0 || !client.in_flight.is_empty() || !members {
            return false;
        }
        client.final_ops -= 1;
        true
    }

    /// A read, or a write of `count` lines, each with a value no other write wrote.
    fn operation(&mut self, write: bool, count: u16) -> (OpKind, Vec<u64>) {
        if !write {
            return (OpKind::Read, Vec::new());
        }
        let values: Vec<u64> = (0..count)
            .map(|_| {
                self.next_value += 1;
                self.next_value
            })
            .collect();
        let bytes = values.iter().flat_map(|v| line_bytes(*v)).collect();
        (OpKind::Write(bytes), values)
    }

    /// The lines of the next operation: a hot line, or now and then a cold one, several lines
    /// at times; 1 % of the operations (while the faults last) beyond the memory's end.
    fn choose_lines(&mut self, healing: bool) -> (u32, u16) {
        let rng = &mut self.rng;
        if !healing && rng.random_bool(0.01) {
            // Beyond the memory's end: refused, and never takes effect.
            return (rng.random_range(LINES - 2..LINES + 2), 3);
        }
        let (first, end) = if rng.random_bool(COLD_SHARE) {
            (rng.random_range(HOT..LINES), LINES)
        } else {
            (rng.random_range(0..HOT), HOT)
        };
        let count = if rng.random_bool(0.6) {
            1
        } else {
            rng.random_range(2..=4u32).min(end - first)
        };
        (first, count as u16)
    }

    /// Every client's timers and sends, and the results of its operations into the histories.
    pub(super) fn collect_results(&mut self) -> Result<(), String> {
        let now = self.now;
        for index in 0..self.clients.len() {
            let mut done = Vec::new();
            match &mut self.clients[index].engine {
                Engine::Device(session) => {
                    session.handle_timeout(now);
                    send_all(
                        client_addr(index),
                        now,
                        &mut self.network,
                        &mut self.stores,
                        std::iter::from_fn(|| session.poll_transmit()),
                    );
                    while let Some(d) = session.poll_done() {
                        done.push((d.token, d.result));
                    }
                }
                Engine::Direct(coordinator) => {
                    coordinator.handle_timeout(now);
                    send_all(
                        client_addr(index),
                        now,
                        &mut self.network,
                        &mut self.stores,
                        std::iter::from_fn(|| coordinator.poll_transmit()),
                    );
                    while let Some(d) = coordinator.poll_done() {
                        done.push((d.token, d.result));
                    }
                }
            }
            for (token, result) in done {
                let op = self.clients[index]
                    .in_flight
                    .remove(&token)
                    .ok_or_else(|| format!("{now}: client {index}: an answer to no operation"))?;
                self.record(index, op, result)?;
            }
        }
        Ok(())
    }

    /// Client `index`'s operation `op` ended with `result`.
    fn record(
        &mut self,
        index: usize,
        op: InFlight,
        result: Result<Vec<u8>, AbdError>,
    ) -> Result<(), String> {
        let now = self.now;
        let InFlight {
            first,
            count,
            values,
            call,
            must_complete,
        } = op;
        self.note(&format!("client{index}"), || {
            let shown = result
                .as_ref()
                .map(|data| data.chunks(LINE).map(line_value).collect::<Vec<_>>());
            format!("lines {first}+{count} {values:?} called at {call} ns: {shown:?}")
        });
        let beyond = first + u32::from(count) > LINES;
        let lines = first..first + u32::from(count);
        let client = index as u64;
        match result {
            Err(AbdError::OutOfRange) if beyond => self.report.out_of_range += 1,
            // Refused, but its answer lost: sent again, it is "in doubt" (or given up) like
            // any write the coordinator does not remember. Took no effect either way.
            Err(AbdError::InDoubt | AbdError::Unavailable) if beyond => {}
            _ if beyond => {
                return Err(format!(
                    "{now}: client {index}'s operation on lines {first}+{count}, beyond the \
                     end, answered {result:?}"
                ))
            }
            Ok(data) if values.is_empty() => {
                if data.len() != usize::from(count) * LINE {
                    return Err(format!(
                        "{now}: client {index}'s read of lines {first}+{count} returned {} bytes",
                        data.len()
                    ));
                }
                self.report.completed += 1;
                for (line, bytes) in lines.zip(data.chunks(LINE)) {
                    self.record_read(index, line, call, bytes)?;
                }
            }
            Ok(_) => {
                self.report.completed += 1;
                for (line, value) in lines.zip(values) {
                    self.record_write(index, line, call, value)?;
                }
            }
            Err(error @ (AbdError::Unavailable | AbdError::InDoubt)) => {
                if error == AbdError::Unavailable {
                    self.report.unavailable += 1;
                } else {
                    self.report.in_doubt += 1;
                }
                if must_complete {
                    return Err(format!(
                        "{now}: client {index}'s operation on lines {first}+{count}, started \
                         once healed with every node a member, failed: {error:?}"
                    ));
                }
                // May or may not have taken effect (a read's takes none).
                for (line, value) in lines.zip(values) {
                    let input = RegisterInput::Write(Some(value));
                    self.push(line, client, call, PENDING, input, RegisterOutput::Unknown);
                }
            }
            Err(error) => {
                return Err(format!(
                    "{now}: client {index}'s operation on lines {first}+{count} failed: \
                     {error:?}"
                ))
            }
        }
        Ok(())
    }

    /// Client `index`'s read of `line`, called at `call`, returned `bytes`.
    fn record_read(
        &mut self,
        index: usize,
        line: u32,
        call: u64,
        bytes: &[u8],
    ) -> Result<(), String> {
        let now = self.now;
        let value = line_value(bytes).ok_or_else(|| {
            format!(
                "{now}: client {index} read line {line} holding bytes no write wrote: {bytes:02x?}"
            )
        })?;
        let output = RegisterOutput::Value(Some(value));
        self.push(
            line,
            index as u64,
            call,
            now.as_nanos(),
            RegisterInput::Read,
            output,
        );
        Ok(())
    }

    /// Client `index`'s write of `value` to `line`, called at `call`, was acknowledged: the
    /// line's acknowledged timestamp is at least the one it was stored with.
    fn record_write(
        &mut self,
        index: usize,
        line: u32,
        call: u64,
        value: u64,
    ) -> Result<(), String> {
        let now = self.now;
        let ts = self.stores.ts_of(value).ok_or_else(|| {
            format!(
                "{now}: client {index}'s write of {value} to line {line} acknowledged, but no \
                 coordinator ever stored it"
            )
        })?;
        self.acked[line as usize] = self.acked[line as usize].max(ts);
        let input = RegisterInput::Write(Some(value));
        self.push(
            line,
            index as u64,
            call,
            now.as_nanos(),
            input,
            RegisterOutput::Written,
        );
        Ok(())
    }

    fn push(
        &mut self,
        line: u32,
        client: u64,
        call: u64,
        ret: u64,
        input: RegisterInput<u64>,
        output: RegisterOutput<u64>,
    ) {
        self.history.push((
            line,
            Operation {
                client,
                call,
                ret,
                input,
                output,
            },
        ));
    }
}

//! What the nodes emit after each event: persistence work carried out (or held), requests
//! applied, datagrams sent, completions recorded; and the check of every PMNet-ACK.

use pmnet_pm::{EntryKey, LogWork};
use pmnet_proto::{PersistBatch, RequestKind, StackWork, Stager, Time, Transmit};
use pmnet_wire::{Header, PacketType};

use super::trace::{describe_batch, describe_client_event};
use super::{client_addr, device_addr, replica_addr, server_addr, DeviceNode, ServerApp, World};

#[cfg(doc)]
use pmnet_pm::PmLog;

impl World {
    /// Run persistence work (unless held), applications, and collect every node's output.
    pub fn flush_outputs(&mut self) {
        loop {
            let mut progressed = false;
            for index in 0..self.devices.len() {
                progressed |= self.flush_device(index);
                progressed |= self.follow_device_route(index);
            }
            for index in 0..self.servers.len() {
                progressed |= self.flush_server(false, index);
                progressed |= self.follow_server_route(false, index);
            }
            for index in 0..self.replicas.len() {
                progressed |= self.flush_server(true, index);
                progressed |= self.follow_server_route(true, index);
            }
            for index in 0..self.clients.len() {
                progressed |= self.flush_client(index);
            }
            progressed |= self.flush_controller();
            if !progressed {
                break;
            }
        }
    }

    /// Device `index` (if up): take its persistence batches, carry them out unless held,
    /// and send what it emitted, each PMNet-ACK checked. Whether anything happened.
    pub(super) fn flush_device(&mut self, index: usize) -> bool {
        if !self.devices[index].up {
            return false;
        }
        let mut progressed = false;
        let now = self.now;
        let node = &mut self.devices[index];
        let mut persisted = Vec::new();
        while let Some(batch) = node.pipeline.poll_persist() {
            // The front function's writes go to its own region at once (one fence); the log's
            // are held or carried out below, and the batch is reported once they are.
            let mut front = Vec::new();
            let mut back = Vec::new();
            for work in batch.work {
                match work {
                    StackWork::Front(write) => front.push(write),
                    StackWork::Back(work) => back.push(work),
                }
            }
            pmnet_proto::Persist::persist(&mut node.front_executor, front);
            let batch = PersistBatch {
                number: batch.number,
                work: back,
            };
            if node.hold_persistence {
                persisted.push(format!(
                    "persistence held: {} waits",
                    describe_batch(&batch)
                ));
            }
            node.held.push_back(batch);
        }
        if !node.hold_persistence {
            while let Some(batch) = node.held.pop_front() {
                progressed = true;
                persisted.push(execute_batch(node, now, batch));
            }
        }
        let mut out = Vec::new();
        while let Some(transmit) = node.pipeline.poll_transmit() {
            out.push(transmit);
        }
        let actor = format!("device{index}");
        for text in persisted {
            self.note(&actor, || text);
        }
        for transmit in out {
            progressed = true;
            self.check_pmnet_ack(index, &transmit);
            self.enqueue(device_addr(index), transmit);
        }
        progressed
    }

    /// Server `index` (replica `index` if `replica`), if up: apply what it hands the
    /// application, and send what it emitted. Whether anything happened.
    pub(super) fn flush_server(&mut self, replica: bool, index: usize) -> bool {
        let (node, actor, addr) = if replica {
            let node = &mut self.replicas[index];
            (node, format!("replica{index}"), replica_addr(index))
        } else {
            let node = &mut self.servers[index];
            (node, format!("server{index}"), server_addr(index))
        };
        if !node.up {
            return false;
        }
        let mut progressed = false;
        let now = self.now;
        let mut stager = SimStager {
            app: &mut node.app,
            store_full: node.store_full,
            deferred_count: &mut node.deferred_count,
            notes: Vec::new(),
        };
        let outcome = node.server.apply_ready(now, &mut stager);
        let mut applied = stager.notes;
        for report in &outcome.recoveries_complete {
            applied.push(format!(
                "recovery complete: {} logged entries resent, all applied ({} numbers skipped) \
                 {:?} after the last device answered",
                report.entries_resent, report.numbers_skipped, report.took
            ));
        }
        progressed |= !outcome.is_empty();
        progressed |= node.persist_forwards(now);
        let mut out = Vec::new();
        while let Some(transmit) = node.server.poll_transmit() {
            out.push(transmit);
        }
        for text in applied {
            self.note(&actor, || text);
        }
        for transmit in out {
            progressed = true;
            self.enqueue(addr, transmit);
        }
        progressed
    }

    /// Client `index`: record its completions and send what it emitted (a client gone for
    /// good sends nothing). Whether anything was sent.
    fn flush_client(&mut self, index: usize) -> bool {
        let mut out = Vec::new();
        let mut events = Vec::new();
        let node = &mut self.clients[index];
        if node.gone {
            while node.client.poll_transmit().is_some() {}
            return false;
        }
        while let Some(event) = node.client.poll_event() {
            events.push(event.clone());
            node.completed.push(event);
        }
        while let Some(read) = node.client.poll_read_event() {
            node.reads.push(read);
        }
        while let Some(transmit) = node.client.poll_transmit() {
            out.push(transmit);
        }
        let actor = format!("client{index}");
        for event in events {
            self.note(&actor, || describe_client_event(&event));
        }
        let progressed = !out.is_empty();
        for transmit in out {
            self.enqueue(client_addr(index), transmit);
        }
        progressed
    }

    /// An ack is a promise: a PMNet-ACK may name only an entry the device's log has held
    /// durably, by the persistence model's account rather than the device's. A device of a
    /// chain also passes on the next device's acks (another `device_id`): those were checked
    /// when that device sent them.
    fn check_pmnet_ack(&mut self, device: usize, transmit: &Transmit) {
        let Ok((header, _)) = Header::parse(pmnet_auth::without_trailer(&transmit.bytes)) else {
            return;
        };
        if header.packet_type != PacketType::PmnetAck
            || header.device_id != self.devices[device].pipeline.device().config().device_id
        {
            return;
        }
        let key = EntryKey {
            server_id: header.server_id,
            session_id: header.session_id,
            seq: header.seq,
            fragment_index: header.fragment_index,
        };
        assert!(
            self.devices[device].ever_durable.contains(&key),
            "invariant: device {device} acked {key:?} before its log write was durable"
        );
        self.acks_checked += 1;
    }

    /// Release held persistence work of device `index`, `count` batches (all when `None`).
    pub fn release_persistence(&mut self, index: usize, count: Option<usize>) {
        let now = self.now;
        let node = &mut self.devices[index];
        let count = count.unwrap_or(node.held.len());
        let mut persisted = Vec::new();
        for _ in 0..count {
            let Some(batch) = node.held.pop_front() else {
                break;
            };
            persisted.push(execute_batch(node, now, batch));
        }
        let actor = format!("device{index}");
        for text in persisted {
            self.note(&actor, || format!("released: {text}"));
        }
        self.flush_outputs();
    }
}

/// Carry out a batch of persistence work on the device's log with the executor production
/// uses ([`PmLog::persist_batch`]), check that every write is durable by the persistence
/// model's account, and report the batch; returns what happened, for the trace.
fn execute_batch(node: &mut DeviceNode, now: Time, batch: PersistBatch<LogWork>) -> String {
    let text = format!("{}: durable [checked]", describe_batch(&batch));
    node.log.persist_batch(&batch.work);
    for work in &batch.work {
        if let LogWork::Write { slot, key, .. } = work {
            let range = node.log.slot_range(*slot);
            assert!(
                node.log.region().is_durable(range.start, range.len()),
                "invariant: the log returned from a batch whose write to slot {slot} is not durable"
            );
            node.ever_durable.insert(*key);
        }
    }
    node.pipeline.on_persisted(now, batch.number);
    text
}

/// A server's application as the executor ([`pmnet_proto::Server::apply_ready`], the one the
/// runtime runs) stages on it, noting each request for the trace.
struct SimStager<'a> {
    app: &'a mut ServerApp,
    /// The fault "the store is full": every update is refused, nothing staged.
    store_full: bool,
    deferred_count: &'a mut u64,
    notes: Vec<String>,
}

impl Stager for SimStager<'_> {
    fn stage(
        &mut self,
        session_id: u64,
        seq: u32,
        kind: RequestKind,
        request: &[u8],
    ) -> Option<Vec<u8>> {
        let what = match (kind, request.is_empty()) {
            (RequestKind::Bypass, true) => "no-op fill".to_string(),
            _ => format!("{kind:?} ({} bytes)", request.len()),
        };
        if self.store_full && kind == RequestKind::Update {
            *self.deferred_count += 1;
            self.notes.push(format!(
                "no room for s={session_id:x} seq={seq} {what}: deferred, nothing durable, \
                 no server-ACK"
            ));
            return None;
        }
        let reply = self.app.stage(session_id, seq, kind, request);
        self.notes.push(match reply {
            Some(_) => format!("apply s={session_id:x} seq={seq} {what} [in order, once]"),
            None => {
                *self.deferred_count += 1;
                format!("the store has no room for s={session_id:x} seq={seq}: deferred")
            }
        });
        reply
    }

    fn note_time(&mut self, now_ms: u64) {
        self.app.note_time(now_ms);
    }

    fn eviction_candidate(&mut self, for_session: u64) -> Option<(u64, u64)> {
        self.app.eviction_candidate(for_session)
    }

    fn permit_eviction(&mut self, session_id: u64) {
        self.app.permit_eviction(session_id);
    }

    fn commit(&mut self) {
        self.app.commit();
    }

    fn read(&mut self, request: &[u8]) -> Vec<u8> {
        self.notes
            .push(format!("cache read ({} bytes) answered", request.len()));
        self.app.read(request)
    }

    fn error_reply(&self, message: &str) -> Vec<u8> {
        pmnet_store::Reply::Error(message.to_owned()).to_bytes()
    }

    fn max_staged(&self) -> usize {
        self.app.max_staged()
    }
}

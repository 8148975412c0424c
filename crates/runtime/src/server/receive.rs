//! The server's receive paths: into socket buffers, or (the packet store) into lent store slots,
//! and staging a request in place from the slots it arrived in.

use super::*;

/// Received datagrams of update requests waiting in store slots, by (session, seq): one slot
/// per fragment, so that fragments arriving in different receive batches still become one
/// record in place. Bounded in time, requests and fragments; whatever is not applied in time
/// (reordered beyond it, duplicates, dropped) goes back to the store, and a request applied
/// later is applied from its bytes.
/// By (session, seq) as the client sent them: a seeded hash (foldhash), so they cannot be chosen
/// to collide.
pub(super) type ReceivedSlots = hashbrown::HashMap<(u64, u32), HeldRequest>;

#[derive(Debug)]
pub(super) struct HeldRequest {
    pub(super) fragments: HeldSlots,
    since: pmnet_proto::Time,
}

/// The slots holding a request's fragments, by fragment index: no allocation for a request of
/// one datagram.
#[derive(Debug)]
pub(super) enum HeldSlots {
    One(Option<u32>),
    Many(Vec<Option<u32>>),
}

impl HeldSlots {
    pub(super) fn new(fragment_count: usize) -> HeldSlots {
        match fragment_count {
            1 => HeldSlots::One(None),
            _ => HeldSlots::Many(vec![None; fragment_count]),
        }
    }

    pub(super) fn get_mut(&mut self, index: usize) -> Option<&mut Option<u32>> {
        match self {
            HeldSlots::One(slot) => (index == 0).then_some(slot),
            HeldSlots::Many(slots) => slots.get_mut(index),
        }
    }

    pub(super) fn as_slice(&self) -> &[Option<u32>] {
        match self {
            HeldSlots::One(slot) => std::slice::from_ref(slot),
            HeldSlots::Many(slots) => slots,
        }
    }
}

/// How long received slots wait for their request to be applied: beyond the protocol's gap
/// timeout (2 ms), so a request whose fragments straddle receive batches keeps its slots.
pub(super) const HOLD_SLOTS: Duration = Duration::from_millis(5);
/// Requests whose slots are held at most, and fragments of one request.
pub(super) const MAX_HELD_REQUESTS: usize = 256;
pub(super) const MAX_HELD_FRAGMENTS: usize = 1024;

impl ServerRuntime {
    /// Datagrams received (at most `limit`) and handled.
    pub(super) fn receive_into_socket_buffers(&mut self, limit: usize) -> usize {
        let count = self.socket.receive_batch_up_to(limit);
        if count > 0 {
            let now = self.clock.now();
            let tracing_on = crate::trace::enabled();
            for index in 0..count {
                if let Some((from, datagram)) = self.socket.received(index) {
                    // Only a datagram that verified says its sender is there.
                    if crate::trace::server_handle(
                        &mut self.server,
                        now,
                        from,
                        datagram,
                        tracing_on,
                    ) {
                        self.devices.heard(from);
                        self.replicas.heard(from);
                        self.peers.heard(from, now);
                    }
                }
            }
        }
        count
    }

    /// The packet store's receive path: one `recvmmsg` into lent store slots; each datagram is
    /// checked (CRC included) once, by `Server::handle`, straight from persistent memory. The
    /// slots of update requests are remembered so that applying the request makes them the
    /// record in place.
    pub(super) fn receive_into_slots(&mut self, limit: usize) -> usize {
        let (Some(receiver), ServerApp::Engine(store)) = (self.receiver.as_mut(), &mut self.app)
        else {
            return 0;
        };
        let errors = receiver.counters().receive_errors;
        let count = receiver.receive_up_to(self.socket.raw_fd(), store, now_ns(), limit);
        if receiver.counters().receive_errors != errors {
            // An ICMP report about a datagram sent to a device, perhaps.
            self.socket.note_receive_error_elsewhere();
        }
        if count == 0 {
            return 0;
        }
        self.socket.count_receive_batch_elsewhere();
        let mut handling = Handling {
            server: &mut self.server,
            socket: &mut self.socket,
            devices: &mut self.devices,
            replicas: &mut self.replicas,
            peers: &mut self.peers,
            received_slots: &mut self.received_slots,
            now: self.clock.now(),
            tracing_on: crate::trace::enabled(),
        };
        for received in receiver.received() {
            match *received {
                Received::InSlot { slot, from, .. } => handling.in_slot(store, slot, from),
                Received::Spilled { index, from } => {
                    handling.copied(receiver.spilled(index), from);
                }
            }
        }
        count
    }

    /// The AF_XDP receive path (`--xdp`): frames the kernel wrote into lent store slots, taken
    /// off the RX ring without a system call and handled as [`Self::receive_into_slots`]
    /// handles what `recvmmsg` put in slots.
    pub(super) fn receive_from_xsk(&mut self, limit: usize) -> usize {
        let (Some(xdp), ServerApp::Engine(store)) = (self.xdp.as_mut(), &mut self.app) else {
            return 0;
        };
        let receiver = &mut xdp.receiver;
        let count = receiver.receive_up_to(store, now_ns(), limit);
        if count == 0 {
            return 0;
        }
        self.socket.count_receive_batch_elsewhere();
        let mut handling = Handling {
            server: &mut self.server,
            socket: &mut self.socket,
            devices: &mut self.devices,
            replicas: &mut self.replicas,
            peers: &mut self.peers,
            received_slots: &mut self.received_slots,
            now: self.clock.now(),
            tracing_on: crate::trace::enabled(),
        };
        for received in receiver.received() {
            match *received {
                Received::InSlot { slot, from, .. } => handling.in_slot(store, slot, from),
                Received::Spilled { index, from } => {
                    handling.copied(receiver.spilled(index), from);
                }
            }
        }
        count
    }

    /// Slots of requests not applied within [`HOLD_SLOTS`] (reordered, duplicates, dropped)
    /// go back to the store.
    pub(super) fn release_unapplied_slots(&mut self) {
        if self.received_slots.is_empty() {
            return;
        }
        let now = self.clock.now();
        if let ServerApp::Engine(store) = &mut self.app {
            self.received_slots.retain(|_, held| {
                if now.saturating_duration_since(held.since) < HOLD_SLOTS {
                    return true;
                }
                for slot in held.fragments.as_slice().iter().flatten() {
                    store.release_slot(*slot);
                }
                false
            });
        }
    }
}

/// What handling a received datagram touches: the protocol, the counters and peers, and the
/// slots held for update requests.
struct Handling<'a> {
    server: &'a mut Server,
    socket: &'a mut BatchSocket,
    devices: &'a mut crate::peers::PeerWatch,
    replicas: &'a mut crate::peers::PeerWatch,
    peers: &'a mut crate::peer_book::PeerBook,
    received_slots: &'a mut ReceivedSlots,
    now: pmnet_proto::Time,
    tracing_on: bool,
}

impl Handling<'_> {
    /// A datagram received into lent `slot`: handed to the protocol straight from the slot,
    /// which is held if it is a fragment of an update request (to become its record in place)
    /// and given back otherwise.
    fn in_slot(&mut self, store: &mut Store<MmapRegion>, slot: u32, from: SocketAddr) {
        let Some(datagram) = store.received_datagram(slot) else {
            store.release_slot(slot);
            return;
        };
        self.socket.count_received_elsewhere(datagram);
        self.handle_and_note(datagram, from);
        let kept = match pmnet_wire::Packet::new_checked(datagram) {
            Ok(packet)
                if packet.type_code() == pmnet_wire::PacketType::UpdateRequest.code()
                    && packet.fragment_index() < packet.fragment_count()
                    && usize::from(packet.fragment_count()) <= MAX_HELD_FRAGMENTS
                    && (self.received_slots.len() < MAX_HELD_REQUESTS
                        || self
                            .received_slots
                            .contains_key(&(packet.session_id(), packet.seq()))) =>
            {
                let now = self.now;
                let held = self
                    .received_slots
                    .entry((packet.session_id(), packet.seq()))
                    .or_insert_with(|| HeldRequest {
                        fragments: HeldSlots::new(usize::from(packet.fragment_count())),
                        since: now,
                    });
                match held.fragments.get_mut(usize::from(packet.fragment_index())) {
                    Some(entry @ None) => {
                        *entry = Some(slot);
                        true
                    }
                    _ => false,
                }
            }
            _ => false,
        };
        if !kept {
            store.release_slot(slot);
        }
    }

    /// A datagram received elsewhere than in a slot (DRAM).
    fn copied(&mut self, datagram: &[u8], from: SocketAddr) {
        self.socket.count_received_elsewhere(datagram);
        self.handle_and_note(datagram, from);
    }

    /// Hand `datagram` to the protocol; only one that verified says its sender is there.
    fn handle_and_note(&mut self, datagram: &[u8], from: SocketAddr) {
        if crate::trace::server_handle(self.server, self.now, from, datagram, self.tracing_on) {
            self.devices.heard(from);
            self.replicas.heard(from);
            self.peers.heard(from, self.now);
        }
    }
}

/// Stage one request on a `pmnet-pktstore` engine whose receive path holds store slots for
/// it: in place when the slots hold every fragment and exactly this request, else from its
/// bytes. `Err(NoSpace)`: nothing of it was staged and its slots went back to the store; it is
/// applied again later from its bytes.
pub(super) fn stage_received(
    store: &mut Store<MmapRegion>,
    session_id: u64,
    seq: u32,
    request: &[u8],
    fragments: HeldSlots,
    scratch: &mut Vec<u32>,
) -> Result<Vec<u8>, NoSpace> {
    let fragments = fragments.as_slice();
    if fragments.iter().all(Option::is_some) {
        scratch.clear();
        scratch.extend(fragments.iter().flatten());
        let slots: &[u32] = scratch;
        // The protocol applies the first copy of each fragment it received; a slot may hold
        // a later copy. Keep the slots only if they hold exactly the bytes applied.
        let mut rest = request;
        let mut same = true;
        for slot in slots {
            let payload = store
                .received_datagram(*slot)
                .and_then(|datagram| datagram.get(pmnet_wire::HEADER_LEN..))
                .unwrap_or(&[]);
            match rest.strip_prefix(payload) {
                Some(tail) => rest = tail,
                None => {
                    same = false;
                    break;
                }
            }
        }
        if same && rest.is_empty() {
            if let Ok(reply) = store.stage_received(session_id, seq, slots) {
                return reply;
            }
        } else {
            for &slot in slots {
                store.release_slot(slot);
            }
        }
    } else {
        for &slot in fragments.iter().flatten() {
            store.release_slot(slot);
        }
    }
    store.stage_request(session_id, seq, request)
}

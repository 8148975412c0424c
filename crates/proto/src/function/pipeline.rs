//! The pipeline: one verifier and parser in front of a device's functions, and the batcher and
//! sealer behind them.

use std::net::SocketAddr;

use pmnet_wire::{Header, PacketType};

use super::{NetworkFunction, Persist, PersistBatch};
use crate::edge::{Arrived, Edge};
use crate::{CountDrop, DropCounts, DropReason, Time, Transmit};

/// Verified requests whose trailers a pipeline keeps for forwarding them: the last few of a
/// receive batch (each seal looks through them, so few; what goes out in a batch to a server
/// is sealed afresh anyway).
const FORWARDED_TRAILERS_KEPT: usize = 8;

/// A device's functions behind one parser: each datagram is parsed once and offered to the
/// functions in order; what none of them consumes is counted and dropped here.
#[derive(Debug)]
pub struct Pipeline<F> {
    pub(crate) functions: F,
    pub(crate) drops: DropCounts,
    /// Verification's warnings (failures; plain traffic from other hosts, when asked).
    edge: Edge,
    /// With keys configured: every datagram verified before it is parsed, every datagram
    /// sent sealed (what a device forwards is sealed again, which reproduces its tag).
    auth: Option<pmnet_auth::Authenticator>,
    /// When the pipeline was given its keys (Unix ms, by its authenticator's clock): the
    /// device's start, for the replay floors of its functions.
    started_ms: u64,
    /// With peers to batch for: what a turn sends each of them, packed (see `batch.rs`).
    batcher: Option<crate::Batcher>,
}

impl<F: NetworkFunction> Pipeline<F> {
    pub fn new(functions: F) -> Pipeline<F> {
        Pipeline {
            functions,
            drops: DropCounts::default(),
            edge: Edge::default(),
            auth: None,
            started_ms: 0,
            batcher: None,
        }
    }

    /// Pack what a turn sends each of `peers` into batches of at most `datagram_len_max` bytes
    /// (trailer included), with `device_id` in their headers. Call after [`Pipeline::with_auth`].
    pub fn with_batching(
        mut self,
        peers: &[SocketAddr],
        datagram_len_max: usize,
        device_id: u16,
    ) -> Pipeline<F> {
        let mut batcher = crate::Batcher::new(
            crate::unsealed_len_max(datagram_len_max, &self.auth),
            device_id,
        );
        for peer in peers {
            batcher.add_peer(*peer);
        }
        self.batcher = Some(batcher);
        self
    }

    /// Let a batch of update requests for a server wait up to `hold` for more (call after
    /// [`Pipeline::with_batching`]; docs/protocol.md, "Batches").
    pub fn with_batch_hold(mut self, hold: std::time::Duration) -> Pipeline<F> {
        self.batcher = self.batcher.map(|batcher| batcher.with_hold(hold));
        self
    }

    /// What batching did (`None`: off).
    pub fn batch_counters(&self) -> Option<crate::BatchCounters> {
        self.batcher.as_ref().map(|batcher| batcher.counters)
    }

    /// Authenticate every datagram in and out with `auth`.
    pub fn with_auth(mut self, auth: Option<pmnet_auth::Authenticator>) -> Pipeline<F> {
        // What a device forwards is what it just verified: reuse the trailer rather than
        // compute the MAC again (a receive batch's worth).
        self.auth = auth.map(|auth| auth.remember_verified(FORWARDED_TRAILERS_KEPT));
        self.started_ms = self
            .auth
            .as_ref()
            .map_or(0, pmnet_auth::Authenticator::now_ms);
        self
    }

    /// Without keys (`on`): warn, at most once a minute, of unauthenticated datagrams from
    /// peers off this host (a device started with `--insecure` on an address others reach).
    pub fn with_plain_traffic_warnings(mut self, on: bool) -> Pipeline<F> {
        self.edge.plain_warnings = on.then(crate::PlainTrafficWarnings::default);
        self
    }

    /// Whether datagrams are authenticated.
    pub fn is_authenticated(&self) -> bool {
        self.auth.is_some()
    }

    /// The seals of what this pipeline sent (`None`: not authenticated).
    pub fn seal_counts(&self) -> Option<pmnet_auth::SealCounts> {
        self.auth
            .as_ref()
            .map(pmnet_auth::Authenticator::seal_counts)
    }

    pub fn functions(&self) -> &F {
        &self.functions
    }

    pub fn functions_mut(&mut self) -> &mut F {
        &mut self.functions
    }

    /// Datagrams that could not be verified (failed authentication, or sealed at a pipeline
    /// without keys), in all: a caller that notes who it hears from counts only the others.
    pub fn unverified_total(&self) -> u64 {
        self.edge.auth_warnings.total()
    }

    /// Datagrams the pipeline itself dropped: unparseable, or of a type no function owns.
    pub fn drops(&self) -> &DropCounts {
        &self.drops
    }

    /// Process a datagram from the network. Never panics on its contents.
    pub fn handle(&mut self, now: Time, from: SocketAddr, datagram: &[u8]) {
        if let Some(batcher) = self.batcher.as_mut() {
            batcher.set_now(now);
        }
        let verified = match self
            .edge
            .verify(now, "device", from, self.auth.as_mut(), datagram)
        {
            Ok(inner) => inner,
            Err(reason) => {
                self.drops.record(reason);
                // A function that waits on a peer's answers learns why none came.
                self.functions.on_unverified(now, from, reason);
                return;
            }
        };
        if let Some(auth) = self.auth.as_ref() {
            self.functions.note_seal(auth.sealed_at(), self.started_ms);
        }
        crate::edge::unpack(&verified, |arrived| match arrived {
            Arrived::Datagram { header, bytes, .. } => Self::dispatch(
                &mut self.functions,
                &mut self.drops,
                now,
                from,
                &header,
                bytes,
            ),
            Arrived::Batch => {}
            Arrived::Dropped(reason) => self.drops.record(reason),
        });
    }

    /// Hand a parsed datagram to the functions; one none of them takes is counted and dropped.
    /// An update that carries its client's address (devices in series) is offered without
    /// it, the address noted beside it; a malformed one is counted and dropped here.
    fn dispatch(
        functions: &mut F,
        drops: &mut DropCounts,
        now: Time,
        from: SocketAddr,
        header: &Header,
        datagram: &[u8],
    ) {
        if header.packet_type == PacketType::UpdateRequest
            && header.has_flag(pmnet_wire::replication::CLIENT_ADDRESS)
        {
            let payload = &datagram[pmnet_wire::HEADER_LEN..];
            match pmnet_wire::replication::without_client_address(header, payload) {
                Ok((inner, client)) => {
                    let inner_header = Header {
                        flags: header.flags & !pmnet_wire::replication::CLIENT_ADDRESS,
                        ..*header
                    };
                    functions.note_client_address(Some(client));
                    Self::dispatch(functions, drops, now, from, &inner_header, &inner);
                    functions.note_client_address(None);
                }
                Err(_) => drops.record(DropReason::BadClientAddress),
            }
            return;
        }
        if !functions.handle(now, from, header, datagram).is_consumed() {
            drops.record(match header.packet_type {
                PacketType::Reserved(_) => DropReason::Parse(pmnet_wire::ParseError::UnknownType),
                _ => DropReason::UnexpectedType,
            });
        }
    }

    pub fn handle_timeout(&mut self, now: Time) {
        self.functions.handle_timeout(now);
        if let Some(batcher) = self.batcher.as_mut() {
            batcher.handle_timeout(now);
        }
    }

    pub fn on_persisted(&mut self, now: Time, through: u64) {
        if let Some(batcher) = self.batcher.as_mut() {
            batcher.set_now(now);
        }
        self.functions.on_persisted(now, through)
    }

    #[must_use]
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        let mut transmit = match self.batcher.as_mut() {
            Some(batcher) => match batcher.pop() {
                Some(transmit) => transmit,
                None => {
                    let functions = &mut self.functions;
                    batcher.fill(|| functions.poll_transmit());
                    batcher.pop()?
                }
            },
            None => self.functions.poll_transmit()?,
        };
        if let Some(auth) = self.auth.as_mut() {
            auth.seal(&mut transmit.bytes);
        }
        Some(transmit)
    }

    #[must_use]
    pub fn poll_persist(&mut self) -> Option<PersistBatch<F::Work>> {
        self.functions.poll_persist()
    }

    #[must_use]
    pub fn poll_timeout(&self) -> Option<Time> {
        let held = self.batcher.as_ref().and_then(crate::Batcher::poll_timeout);
        match (self.functions.poll_timeout(), held) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Carry out every batch of persistence work with `executor` and report it, until the
    /// functions ask for no more. Returns how many batches there were.
    pub fn persist_with<E: Persist<F::Work>>(&mut self, now: Time, executor: &mut E) -> u64 {
        let mut batches = 0;
        while let Some(batch) = self.functions.poll_persist() {
            executor.persist(batch.work);
            self.functions.on_persisted(now, batch.number);
            batches += 1;
        }
        batches
    }
}

//! The chain member as an in-network function: composed in front of the log in a device's
//! pipeline (`Stack<ChainFunction, Device>`), it takes NetChain's datagrams (types
//! `0x20–0x28` and `0x2A`: the chain's and the controller's) and passes everything else on; its table writes are [`RegionWrite`]s on the
//! table's region, carried out by the device's front executor.

use std::net::SocketAddr;

use pmnet_proto::{
    DropCounts, NetworkFunction, PersistBatch, RegionWrite, Time, Transmit, Verdict,
};
use pmnet_wire::netchain::control::{CHAIN_CONFIG, CHAIN_SYNC_DATA};
use pmnet_wire::netchain::{CHAIN_COMMIT, CHAIN_DECISION, CHAIN_REPLY, CHAIN_REQUEST, CHAIN_WRITE};
use pmnet_wire::{Header, PacketType};

use crate::node::ChainNode;
use pmnet_pmtable::Geometry;

/// A chain member in a device's pipeline.
#[derive(Debug)]
pub struct ChainFunction {
    node: ChainNode,
    geometry: Geometry,
}

impl ChainFunction {
    pub fn new(node: ChainNode) -> ChainFunction {
        let geometry = node.table().geometry();
        ChainFunction { node, geometry }
    }

    pub fn node(&self) -> &ChainNode {
        &self.node
    }
}

impl NetworkFunction for ChainFunction {
    type Work = RegionWrite;

    fn dropped(&self) -> DropCounts {
        self.node.counters().dropped.clone()
    }

    fn handle(&mut self, now: Time, from: SocketAddr, header: &Header, datagram: &[u8]) -> Verdict {
        match header.packet_type {
            PacketType::Reserved(
                CHAIN_REQUEST
                | CHAIN_REPLY
                | CHAIN_WRITE
                | CHAIN_COMMIT
                | CHAIN_DECISION
                | CHAIN_CONFIG..=CHAIN_SYNC_DATA,
            ) => {
                let payload = datagram.get(pmnet_wire::HEADER_LEN..).unwrap_or_default();
                self.node.handle(now, from, header, payload);
                Verdict::Consumed
            }
            _ => Verdict::Pass,
        }
    }

    fn note_seal(&mut self, sealed_at_ms: u64, started_ms: u64) {
        self.node.note_seal(sealed_at_ms, started_ms);
    }

    fn handle_timeout(&mut self, now: Time) {
        self.node.handle_timeout(now);
    }

    fn on_persisted(&mut self, now: Time, through: u64) {
        self.node.on_persisted(now, through);
    }

    fn poll_transmit(&mut self) -> Option<Transmit> {
        self.node.poll_transmit()
    }

    fn poll_persist(&mut self) -> Option<PersistBatch<RegionWrite>> {
        Some(pmnet_pmtable::region_batch(
            self.node.poll_persist()?,
            &self.geometry,
        ))
    }

    fn poll_timeout(&self) -> Option<Time> {
        self.node.poll_timeout()
    }

    fn counter_samples(&self) -> Vec<(&'static str, &'static str, u64)> {
        let c = self.node.counters();
        vec![
            ("pmnet_chain_requests_total", "Chain requests received from clients (or relayed reads).", c.requests),
            ("pmnet_chain_writes_stamped_total", "Writes this member stamped as the head of their group.", c.writes_stamped),
            ("pmnet_chain_writes_passed_on_total", "Writes passed down the chain.", c.writes_passed_on),
            ("pmnet_chain_writes_resent_total", "Writes passed down again for want of a commit.", c.writes_resent),
            ("pmnet_chain_replies_total", "Replies sent to clients.", c.replies_sent),
            ("pmnet_chain_reads_here_total", "Reads answered by this member (the tail, or a clean key).", c.reads_answered_here),
            ("pmnet_chain_reads_relayed_total", "Reads of dirty keys relayed to the tail.", c.reads_relayed),
            ("pmnet_chain_commits_total", "Commits received from the next member.", c.commits),
            ("pmnet_chain_duplicates_total", "Requests sent again (or duplicated) that the head had stamped already.", c.duplicates),
            ("pmnet_chain_in_doubt_total", "Retransmitted writes answered in doubt after a restart.", c.in_doubt),
            ("pmnet_chain_replays_refused_total", "Writes sealed before the head forgot a session or started (or learned the session): refused.", c.replays_refused),
            ("pmnet_chain_refused_full_total", "Writes refused for want of room in the table.", c.refused_full),
            ("pmnet_chain_versions_refused_total", "Writes and commits refused: a version no head can have issued.", c.versions_refused),
            ("pmnet_chain_key_versions_full_total", "Writes the head made wait: too many versions of the key in flight.", c.key_versions_full),
            ("pmnet_chain_not_serving_total", "Requests answered \"not here\" for want of the controller's lease.", c.not_serving),
            ("pmnet_chain_leases_lapsed_total", "Times the controller's lease ran out while the member answered clients.", c.leases_lapsed),
            ("pmnet_chain_configs_total", "Configurations taken from the controller.", c.configs),
            ("pmnet_chain_sync_pages_sent_total", "Pages of this member's table sent to a joining member.", c.sync_pages_sent),
            ("pmnet_chain_sync_versions_taken_total", "Versions taken from a source while joining a group.", c.sync_versions_taken),
            ("pmnet_chain_epoch", "The controller's configuration this member runs (0: static or none yet).", self.node.epoch()),
            ("pmnet_chain_keys", "Keys in this member's table.", self.node.table().len() as u64),
        ]
    }
}

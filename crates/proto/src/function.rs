//! The one shape every in-network function has, so that a device can compose them in a
//! pipeline and the simulator can drive any of them.

use std::net::SocketAddr;

use crate::{PersistToken, PersistWork, Time, Transmit};

/// An in-network function: fed datagrams, time and persistence completions; emits datagrams
/// and persistence work.
///
/// The caller's loop: `handle` each received datagram (and `handle_timeout` when
/// `poll_timeout` passes), then drain `poll_persist` (carrying out the work in order and
/// reporting each completed log write with `on_persisted`) and `poll_transmit`, repeating
/// until both are empty.
pub trait NetworkFunction {
    fn handle(&mut self, now: Time, from: SocketAddr, datagram: &[u8]);
    fn on_persisted(&mut self, now: Time, token: PersistToken);
    fn handle_timeout(&mut self, now: Time);
    #[must_use]
    fn poll_transmit(&mut self) -> Option<Transmit>;
    #[must_use]
    fn poll_persist(&mut self) -> Option<PersistWork>;
    #[must_use]
    fn poll_timeout(&self) -> Option<Time>;
}

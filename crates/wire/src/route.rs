//! The control plane's messages for devices in series (docs/replication.md, "Automatic
//! failover"), type codes `0x2B` and `0x2C`. Integers are big-endian; an address is 19 bytes:
//! family (4 or 6), port, and 16 address bytes (IPv4 in the first four, the rest zero), as a
//! carried client address ([`crate::replication::encode_client_address`]).
//!
//! | message | field | size |
//! |---|---|---|
//! | status (`0x2B`, device, server or client → controller) | role (1 device, 2 server, 3 client) | 1 |
//! | | the sender's boot number (random at each start; a client's, at its start) | 8 |
//! | | the route epoch the sender runs (0: its command line) | 8 |
//! | | stamp: the sender's clock in ms, rising within a boot (a replayed status is older) | 8 |
//! | | a server's applied position (the sum of its sessions' last applied numbers; 0 from others) | 8 |
//! | route (`0x2C`, controller → device, server or client) | epoch | 8 |
//! | | the boot number of the status it answers | 8 |
//! | | the address it is for (the node's address in the plan) | 19 |
//! | | the server the chain ends in (its primary's address) | 19 |
//! | | devices *n* (1 to 8), then each: device id (u16) and address, first device first | 1 + 21 *n* |
//! | | the primary's replica servers *r* (0 to 8), then each address | 1 + 19 *r* |
//!
//! The header's `server_id` names the chain (its server's id); a device's status carries its
//! `device_id`. A route answers a status: it names the boot number the status gave, so a route
//! replayed to a node that started again since (a new boot number) changes nothing, and within
//! a boot a node takes only a newer epoch than the one it runs.

use std::net::SocketAddr;

use crate::replication::{decode_client_address, encode_client_address, CLIENT_ADDRESS_LEN};

/// Type code of a node's status (its heartbeat, or a client's question).
pub const NODE_STATUS: u8 = 0x2B;
/// Type code of the controller's route: the chain as it is now.
pub const ROUTE: u8 = 0x2C;

/// Devices of one chain, at most.
pub const MAX_CHAIN_DEVICES: usize = 8;

/// Bytes of a status.
pub const NODE_STATUS_LEN: usize = 1 + 8 + 8 + 8 + 8;
/// Replica servers of one chain's primary, at most.
pub const MAX_CHAIN_REPLICAS: usize = 8;

/// Who sends a status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    Device = 1,
    Server = 2,
    Client = 3,
}

impl Role {
    fn from_code(code: u8) -> Option<Role> {
        match code {
            1 => Some(Role::Device),
            2 => Some(Role::Server),
            3 => Some(Role::Client),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Role::Device => "device",
            Role::Server => "server",
            Role::Client => "client",
        }
    }
}

/// Why a status or route was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteParseError {
    /// Shorter or longer than its fields say.
    BadLength,
    /// A role or address family that is not defined, or an address nobody can be sent to.
    BadCode,
    /// No devices, more than [`MAX_CHAIN_DEVICES`], or one twice.
    BadChain,
}

/// A node's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeStatus {
    pub role: Role,
    pub boot: u64,
    pub epoch: u64,
    pub stamp: u64,
    /// A server's applied position (0 from a device or client).
    pub position: u64,
}

impl NodeStatus {
    pub fn parse(payload: &[u8]) -> Result<NodeStatus, RouteParseError> {
        let bytes: &[u8; NODE_STATUS_LEN] =
            payload.try_into().map_err(|_| RouteParseError::BadLength)?;
        let u64_at = |at: usize| u64::from_be_bytes(bytes[at..at + 8].try_into().expect("8"));
        Ok(NodeStatus {
            role: Role::from_code(bytes[0]).ok_or(RouteParseError::BadCode)?,
            boot: u64_at(1),
            epoch: u64_at(9),
            stamp: u64_at(17),
            position: u64_at(25),
        })
    }

    pub fn emit(&self, out: &mut Vec<u8>) {
        out.push(self.role as u8);
        out.extend_from_slice(&self.boot.to_be_bytes());
        out.extend_from_slice(&self.epoch.to_be_bytes());
        out.extend_from_slice(&self.stamp.to_be_bytes());
        out.extend_from_slice(&self.position.to_be_bytes());
    }
}

/// A chain as the controller has it: its devices in order, and the server it ends in.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ChainRoute {
    /// (device id, address), the first device first.
    pub devices: Vec<(u16, SocketAddr)>,
    /// The primary server.
    pub server: SocketAddr,
    /// The primary's replica servers, in its `--replica` order.
    pub replicas: Vec<SocketAddr>,
}

impl ChainRoute {
    /// Where the device at `address` forwards, and the device before it (`None`: it takes
    /// requests from the clients); `None` when it is not in the chain.
    pub fn place_of(&self, address: SocketAddr) -> Option<(SocketAddr, Option<(u16, SocketAddr)>)> {
        let position = self.devices.iter().position(|(_, at)| *at == address)?;
        let next = self
            .devices
            .get(position + 1)
            .map_or(self.server, |(_, at)| *at);
        let previous = position.checked_sub(1).map(|before| self.devices[before]);
        Some((next, previous))
    }

    /// The device the clients send to.
    pub fn first(&self) -> (u16, SocketAddr) {
        self.devices[0]
    }

    /// The device the server asks for what it misses.
    pub fn last(&self) -> (u16, SocketAddr) {
        *self.devices.last().expect("a chain has a device")
    }

    /// Checked: 1 to [`MAX_CHAIN_DEVICES`] devices, at most [`MAX_CHAIN_REPLICAS`] replicas,
    /// no address or device id twice.
    pub fn check(&self) -> Result<(), RouteParseError> {
        if self.devices.is_empty()
            || self.devices.len() > MAX_CHAIN_DEVICES
            || self.replicas.len() > MAX_CHAIN_REPLICAS
        {
            return Err(RouteParseError::BadChain);
        }
        for (index, replica) in self.replicas.iter().enumerate() {
            let twice = self.replicas[..index].contains(replica)
                || *replica == self.server
                || self.devices.iter().any(|(_, address)| address == replica);
            if twice {
                return Err(RouteParseError::BadChain);
            }
        }
        for (index, (id, address)) in self.devices.iter().enumerate() {
            let twice = self.devices[..index]
                .iter()
                .any(|(other_id, other)| other_id == id || other == address);
            if twice || *address == self.server {
                return Err(RouteParseError::BadChain);
            }
        }
        Ok(())
    }
}

/// The controller's route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub epoch: u64,
    pub boot: u64,
    /// The address of the node it is for, as the plan has it: where that node finds its place.
    pub to: SocketAddr,
    pub chain: ChainRoute,
}

impl Route {
    pub fn parse(payload: &[u8]) -> Result<Route, RouteParseError> {
        let mut reader = Reader(payload);
        let epoch = reader.u64()?;
        let boot = reader.u64()?;
        let to = reader.address()?;
        let server = reader.address()?;
        let count = usize::from(reader.u8()?);
        if count == 0 || count > MAX_CHAIN_DEVICES {
            return Err(RouteParseError::BadChain);
        }
        let mut devices = Vec::with_capacity(count);
        for _ in 0..count {
            let id = u16::from_be_bytes([reader.u8()?, reader.u8()?]);
            devices.push((id, reader.address()?));
        }
        let count = usize::from(reader.u8()?);
        if count > MAX_CHAIN_REPLICAS {
            return Err(RouteParseError::BadChain);
        }
        let replicas = (0..count)
            .map(|_| reader.address())
            .collect::<Result<Vec<_>, _>>()?;
        if !reader.0.is_empty() {
            return Err(RouteParseError::BadLength);
        }
        let chain = ChainRoute {
            devices,
            server,
            replicas,
        };
        chain.check()?;
        Ok(Route {
            epoch,
            boot,
            to,
            chain,
        })
    }

    /// The payload; the chain must pass [`ChainRoute::check`].
    pub fn emit(&self, out: &mut Vec<u8>) {
        debug_assert!(self.chain.check().is_ok());
        out.extend_from_slice(&self.epoch.to_be_bytes());
        out.extend_from_slice(&self.boot.to_be_bytes());
        out.extend_from_slice(&encode_client_address(self.to));
        out.extend_from_slice(&encode_client_address(self.chain.server));
        out.push(self.chain.devices.len() as u8);
        for (id, address) in &self.chain.devices {
            out.extend_from_slice(&id.to_be_bytes());
            out.extend_from_slice(&encode_client_address(*address));
        }
        out.push(self.chain.replicas.len() as u8);
        for address in &self.chain.replicas {
            out.extend_from_slice(&encode_client_address(*address));
        }
    }
}

/// Reading a route, never past its end.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take(&mut self, len: usize) -> Result<&[u8], RouteParseError> {
        if self.0.len() < len {
            return Err(RouteParseError::BadLength);
        }
        let (front, rest) = self.0.split_at(len);
        self.0 = rest;
        Ok(front)
    }

    fn u8(&mut self) -> Result<u8, RouteParseError> {
        Ok(self.take(1)?[0])
    }

    fn u64(&mut self) -> Result<u64, RouteParseError> {
        Ok(u64::from_be_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }

    fn address(&mut self) -> Result<SocketAddr, RouteParseError> {
        decode_client_address(self.take(CLIENT_ADDRESS_LEN)?).map_err(|_| RouteParseError::BadCode)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain() -> ChainRoute {
        ChainRoute {
            devices: vec![
                (1, "10.0.0.1:7000".parse().unwrap()),
                (2, "10.0.0.2:7000".parse().unwrap()),
                (3, "[fe80::3]:7000".parse().unwrap()),
            ],
            server: "10.0.0.9:7001".parse().unwrap(),
            replicas: vec!["10.0.0.10:7001".parse().unwrap()],
        }
    }

    #[test]
    fn a_status_and_a_route_come_back_as_they_went() {
        let status = NodeStatus {
            role: Role::Server,
            boot: 0x0102_0304_0506_0708,
            epoch: 7,
            stamp: 123_456,
            position: 99,
        };
        let mut bytes = Vec::new();
        status.emit(&mut bytes);
        assert_eq!(bytes.len(), NODE_STATUS_LEN);
        assert_eq!(NodeStatus::parse(&bytes), Ok(status));
        let route = Route {
            epoch: 9,
            boot: 42,
            to: "10.0.0.2:7000".parse().unwrap(),
            chain: chain(),
        };
        let mut bytes = Vec::new();
        route.emit(&mut bytes);
        assert_eq!(bytes.len(), 16 + 19 + 19 + 1 + 3 * 21 + 1 + 19);
        assert_eq!(Route::parse(&bytes), Ok(route));
    }

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|byte| format!("{byte:02x}")).collect()
    }

    /// docs/protocol.md, "Automatic failover's payloads", vectors 18a and 18b.
    #[test]
    fn the_documented_vectors() {
        let mut out = Vec::new();
        NodeStatus {
            role: Role::Device,
            boot: 0xabcd,
            epoch: 3,
            stamp: 1_000,
            position: 0,
        }
        .emit(&mut out);
        assert_eq!(
            hex(&out),
            "01\
             000000000000abcd\
             0000000000000003\
             00000000000003e8\
             0000000000000000"
        );
        out.clear();
        let route = Route {
            epoch: 4,
            boot: 0xabcd,
            to: "10.0.0.23:7400".parse().unwrap(),
            chain: ChainRoute {
                devices: vec![
                    (1, "10.0.0.21:7400".parse().unwrap()),
                    (3, "10.0.0.23:7400".parse().unwrap()),
                ],
                server: "10.0.0.9:7001".parse().unwrap(),
                replicas: vec!["10.0.0.10:7001".parse().unwrap()],
            },
        };
        route.emit(&mut out);
        assert_eq!(
            hex(&out),
            "0000000000000004\
             000000000000abcd\
             041ce80a000017000000000000000000000000\
             041b590a000009000000000000000000000000\
             02\
             0001041ce80a000015000000000000000000000000\
             0003041ce80a000017000000000000000000000000\
             01\
             041b590a00000a000000000000000000000000"
        );
        assert_eq!(Route::parse(&out), Ok(route));
    }

    #[test]
    fn a_device_finds_its_place() {
        let chain = chain();
        let (first, second, third) = (chain.devices[0], chain.devices[1], chain.devices[2]);
        assert_eq!(chain.place_of(first.1), Some((second.1, None)));
        assert_eq!(chain.place_of(second.1), Some((third.1, Some(first))));
        assert_eq!(chain.place_of(third.1), Some((chain.server, Some(second))));
        assert_eq!(chain.place_of(chain.server), None);
    }

    #[test]
    fn damaged_messages_are_refused_never_a_panic() {
        let route = Route {
            epoch: 1,
            boot: 2,
            to: "10.0.0.2:7000".parse().unwrap(),
            chain: chain(),
        };
        let mut bytes = Vec::new();
        route.emit(&mut bytes);
        for len in 0..bytes.len() {
            assert!(Route::parse(&bytes[..len]).is_err(), "cut at {len}");
        }
        for index in 0..bytes.len() {
            for value in [0u8, 0xFF, 5] {
                let mut damaged = bytes.clone();
                damaged[index] = value;
                let _ = Route::parse(&damaged);
            }
        }
        // A device twice, no device, too many devices.
        let mut twice = chain();
        twice.devices[2] = twice.devices[0];
        assert_eq!(twice.check(), Err(RouteParseError::BadChain));
        let mut zero = bytes[..55].to_vec();
        zero[54] = 0;
        assert_eq!(Route::parse(&zero), Err(RouteParseError::BadChain));
        // A replica at the server's address.
        let mut at_server = chain();
        at_server.replicas = vec![at_server.server];
        assert_eq!(at_server.check(), Err(RouteParseError::BadChain));
        let mut status = vec![4u8];
        status.extend_from_slice(&[0; 32]);
        assert_eq!(NodeStatus::parse(&status), Err(RouteParseError::BadCode));
        assert_eq!(
            NodeStatus::parse(&status[..10]),
            Err(RouteParseError::BadLength)
        );
    }
}

//! A blocking client session of the chain store over a UDP socket: the I/O around
//! [`pmnet_netchain::ChainClient`] (which decides what to send, where and when), one request
//! at a time. `pmnet kv`, the tests and the benchmarks drive the store through it.

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use pmnet_netchain::{ChainClient, ClientConfig, ClientOp, Outcome};
use pmnet_proto::Time;

/// One session: its socket and state machine.
#[derive(Debug)]
pub struct ChainSession {
    socket: UdpSocket,
    client: ChainClient,
    started: Instant,
    buffer: Vec<u8>,
}

impl ChainSession {
    /// A session on a new socket of the family of `toward` (a member or the controller).
    pub fn open(config: ClientConfig, toward: SocketAddr) -> io::Result<ChainSession> {
        let bind: SocketAddr = if toward.is_ipv4() {
            "0.0.0.0:0".parse().expect("an address")
        } else {
            "[::]:0".parse().expect("an address")
        };
        Ok(ChainSession {
            socket: UdpSocket::bind(bind)?,
            client: ChainClient::new(config),
            started: Instant::now(),
            buffer: vec![0u8; 65_536],
        })
    }

    fn now(&self) -> Time {
        Time::since(self.started, Instant::now())
    }

    /// Datagrams dropped for failing authentication, by reason.
    pub fn drops(&self) -> &pmnet_proto::DropCounts {
        self.client.drops()
    }

    /// The controller's configuration epoch the session routes by (0: none, or static).
    pub fn epoch(&self) -> u64 {
        self.client.epoch()
    }

    /// Run one request to its outcome (`Outcome::Unknown` once its lifetime runs out).
    /// Panics on a key of 0 or more than 255 bytes.
    pub fn run(&mut self, key: &[u8], op: ClientOp) -> io::Result<Outcome> {
        let now = self.now();
        self.client
            .start(now, key, op)
            .map_err(|_| io::Error::other("a request is already in flight"))?;
        loop {
            while let Some(transmit) = self.client.poll_transmit() {
                match self.socket.send_to(&transmit.bytes, transmit.destination) {
                    Ok(_) => {}
                    // A member that is down: the retransmission goes elsewhere.
                    Err(error) if error.kind() == io::ErrorKind::ConnectionRefused => {}
                    Err(error) => return Err(error),
                }
            }
            if let Some((_, outcome)) = self.client.poll_outcome() {
                return Ok(outcome);
            }
            let now = self.now();
            let wait = self
                .client
                .poll_timeout()
                .map_or(Duration::from_millis(10), |at| {
                    at.saturating_duration_since(now)
                })
                .max(Duration::from_micros(100));
            self.socket.set_read_timeout(Some(wait))?;
            match self.socket.recv_from(&mut self.buffer) {
                Ok((len, from)) => {
                    let now = self.now();
                    self.client.handle_from(now, from, &self.buffer[..len]);
                }
                Err(error)
                    if matches!(
                        error.kind(),
                        io::ErrorKind::WouldBlock
                            | io::ErrorKind::TimedOut
                            | io::ErrorKind::Interrupted
                            // An ICMP "unreachable" from a member that is down.
                            | io::ErrorKind::ConnectionRefused
                    ) => {}
                Err(error) => return Err(error),
            }
            let now = self.now();
            self.client.handle_timeout(now);
        }
    }
}

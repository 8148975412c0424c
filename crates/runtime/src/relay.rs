//! A plain UDP relay: the yardstick for the device's forwarding capacity.
//!
//! It does what any user-space UDP forwarder must do and nothing more: receive a batch with
//! `recvmmsg`, queue each datagram for its next hop, send the batch with `sendmmsg`, on the
//! same [`BatchSocket`] machinery (buffers, bounded queue, counters) as the device. There is
//! no parsing, no checksum, no per-session state and no log. Datagrams from anyone but the
//! target go to the target (out of a second socket, as a device forwards on behalf of its
//! clients); datagrams from the target go back to the most recent client, so one client (with
//! any window) can run round trips through it. `pmnet bench --capacity` compares it with the
//! device's forward port under the same load.

use std::net::SocketAddr;
use std::time::Duration;

use pmnet_proto::Transmit;

use crate::event_loop::{run_loop, LoopCounters, LoopSettings, Node, Ready, Turn};
use crate::metrics::Metrics;
use crate::udp::{BatchSocket, SocketCounters, BATCH_LEN};
use crate::wait::PollFd;
use crate::{socket_digest, socket_metrics, LoopOptions, RuntimeError, Shutdown};

/// Where a relay listens and where it sends.
#[derive(Debug, Clone)]
pub struct RelayOptions {
    /// Where clients send (port 0 picks a free one).
    pub listen: SocketAddr,
    /// Where everything from clients goes.
    pub target: SocketAddr,
    /// `wait` and `cpu` are honoured; the relay has no metrics endpoint or report line.
    pub loop_options: LoopOptions,
}

/// A running relay. See the module docs.
#[derive(Debug)]
pub struct UdpRelay {
    options: RelayOptions,
    /// Clients send here; replies to clients leave from here.
    front: BatchSocket,
    /// Datagrams to the target leave from here; its replies arrive here.
    back: BatchSocket,
    last_client: Option<SocketAddr>,
    /// Datagrams from the target received before any client was seen (dropped).
    replies_without_client: u64,
    shutdown: Shutdown,
    event_loop: LoopCounters,
}

impl UdpRelay {
    /// Bind both sockets (the back one on the listen address's IP, any port).
    pub fn open(options: RelayOptions, shutdown: Shutdown) -> Result<UdpRelay, RuntimeError> {
        let max_queued = options.loop_options.max_queued;
        let front =
            BatchSocket::bind(options.listen, max_queued).map_err(|source| RuntimeError::Bind {
                what: "relay",
                addr: options.listen,
                source,
            })?;
        let back_addr = SocketAddr::new(options.listen.ip(), 0);
        let back =
            BatchSocket::bind(back_addr, max_queued).map_err(|source| RuntimeError::Bind {
                what: "relay upstream",
                addr: back_addr,
                source,
            })?;
        Ok(UdpRelay {
            options,
            front,
            back,
            last_client: None,
            replies_without_client: 0,
            shutdown,
            event_loop: LoopCounters::default(),
        })
    }

    /// Where clients reach the relay.
    pub fn local_addr(&self) -> SocketAddr {
        self.front.local_addr()
    }

    /// Counters of the client-facing socket (its `sent` are replies relayed to clients).
    pub fn front_counters(&self) -> &SocketCounters {
        self.front.counters()
    }

    /// Counters of the target-facing socket (its `sent` are datagrams relayed to the target).
    pub fn back_counters(&self) -> &SocketCounters {
        self.back.counters()
    }

    /// Datagrams relayed, both directions.
    pub fn relayed_total(&self) -> u64 {
        self.front.counters().sent_total() + self.back.counters().sent_total()
    }

    /// Replies from the target dropped because no client had been seen yet.
    pub fn replies_without_client(&self) -> u64 {
        self.replies_without_client
    }

    /// Run until the shutdown flag is set; then send what is queued (bounded) and return.
    pub fn run(&mut self) -> Result<(), RuntimeError> {
        let settings = LoopSettings {
            report_interval: None,
            report_at_stop: false,
            ..LoopSettings::from(&self.options.loop_options)
        };
        let shutdown = self.shutdown.clone();
        run_loop(self, settings, None, &shutdown)
    }

    /// One turn: a batch from each socket, relayed. Returns whether anything arrived.
    pub fn poll_once(&mut self) -> bool {
        self.relay(Ready::All).busy
    }

    /// A batch from each socket `ready` allows (0 front, 1 back), relayed.
    fn relay(&mut self, ready: Ready<'_>) -> Turn {
        let mut turn = Turn::default();
        let target = self.options.target;
        let count = if ready.is_readable(0) {
            self.front.receive_batch()
        } else {
            0
        };
        turn.more |= count == BATCH_LEN;
        if count > 0 {
            turn.busy = true;
            for index in 0..count {
                if let Some((from, datagram)) = self.front.received(index) {
                    self.last_client = Some(from);
                    self.back.enqueue(Transmit {
                        destination: target,
                        bytes: datagram.to_vec(),
                    });
                }
            }
            self.back.flush();
        }
        let count = if ready.is_readable(1) {
            self.back.receive_batch()
        } else {
            0
        };
        turn.more |= count == BATCH_LEN;
        if count > 0 {
            turn.busy = true;
            for index in 0..count {
                if let Some((_, datagram)) = self.back.received(index) {
                    match self.last_client {
                        Some(client) => self.front.enqueue(Transmit {
                            destination: client,
                            bytes: datagram.to_vec(),
                        }),
                        None => self.replies_without_client += 1,
                    }
                }
            }
            self.front.flush();
        }
        if self.front.is_write_blocked() {
            self.front.flush();
        }
        if self.back.is_write_blocked() {
            self.back.flush();
        }
        turn
    }
}

impl Node for UdpRelay {
    fn turn(&mut self, ready: Ready<'_>) -> Turn {
        self.relay(ready)
    }

    fn wait_fds(&self, fds: &mut Vec<PollFd>) {
        fds.push(PollFd::new(
            self.front.raw_fd(),
            true,
            self.front.is_write_blocked(),
        ));
        fds.push(PollFd::new(
            self.back.raw_fd(),
            true,
            self.back.is_write_blocked(),
        ));
    }

    fn next_timer(&self) -> Option<Duration> {
        None
    }

    fn queued_len(&self) -> usize {
        self.front.queued_len() + self.back.queued_len()
    }

    fn flush(&mut self) {
        self.front.flush();
        self.back.flush();
    }

    fn metrics(&self) -> Metrics {
        let mut out = Metrics::new();
        socket_metrics(&mut out, "relay", self.front.counters());
        socket_metrics(&mut out, "relay_upstream", self.back.counters());
        out
    }

    fn report_line(&self) -> String {
        format!(
            "relay: front {}; back {}; replies without a client {}",
            socket_digest(self.front.counters()),
            socket_digest(self.back.counters()),
            self.replies_without_client
        )
    }

    fn kind(&self) -> &'static str {
        "relay"
    }

    fn loop_counters(&mut self) -> &mut LoopCounters {
        &mut self.event_loop
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;

    #[test]
    fn relays_both_ways() {
        let server = UdpSocket::bind("127.0.0.1:0").unwrap();
        server
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let options = RelayOptions {
            listen: "127.0.0.1:0".parse().unwrap(),
            target: server.local_addr().unwrap(),
            loop_options: LoopOptions::default(),
        };
        let mut relay = UdpRelay::open(options, Shutdown::new()).unwrap();
        let client = UdpSocket::bind("127.0.0.1:0").unwrap();
        client
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        client.send_to(b"ping", relay.local_addr()).unwrap();
        let mut buffer = [0u8; 16];
        let mut from = None;
        for _ in 0..1000 {
            relay.poll_once();
            server.set_nonblocking(true).unwrap();
            if let Ok((len, source)) = server.recv_from(&mut buffer) {
                assert_eq!(&buffer[..len], b"ping");
                from = Some(source);
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let from = from.expect("the relay forwarded the datagram");
        server.send_to(b"pong", from).unwrap();
        for _ in 0..1000 {
            relay.poll_once();
            client.set_nonblocking(true).unwrap();
            if let Ok((len, _)) = client.recv_from(&mut buffer) {
                assert_eq!(&buffer[..len], b"pong");
                assert_eq!(relay.relayed_total(), 2);
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        panic!("the reply never came back through the relay");
    }
}

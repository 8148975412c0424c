//! A blocking session of replicated memory over a UDP socket (docs/abd.md): through a device
//! that coordinates ([`pmnet_abd::AbdClient`]), or running the quorum itself, the
//! client-driven mode ([`pmnet_abd::Coordinator`]). Operations of up to 16 lines are
//! pipelined, at most [`pmnet_abd::WINDOW`] in flight. `pmnet memory`, the memory controller
//! (`pmnet-memory`'s [`LineStore`]), the tests and the benchmark use it.

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use pmnet_abd::{
    AbdClient, AbdError, ClientConfig, Coordinator, CoordinatorConfig, OpKind, LINE, LINES_MAX,
    WINDOW,
};
use pmnet_auth::{Authenticator, KeySet};
use pmnet_memory::{LineError, LineStore};
use pmnet_proto::{AuthWarnings, CountDrop, DropCounts, DropReason, Time, Transmit};

/// Where the session's operations are coordinated.
#[derive(Debug, Clone)]
pub enum AbdMode {
    /// A device running the ABD function (`pmnet device --abd-node ...`).
    Device(SocketAddr),
    /// The client runs the quorum itself against these memory nodes, with this writer id
    /// (unique among the memory's writers: devices use their device id).
    Direct { nodes: Vec<SocketAddr>, writer: u16 },
}

/// A session's configuration.
#[derive(Debug, Clone)]
pub struct AbdSessionConfig {
    pub mode: AbdMode,
    /// Lines of the memory (as every memory node is started with).
    pub lines: u32,
    /// Seal and verify every datagram with these deployment keys (the device's and nodes').
    pub keys: Option<KeySet>,
}

#[derive(Debug)]
enum Engine {
    Device(AbdClient, SocketAddr),
    Direct(Coordinator),
}

/// One session: its socket and state machine.
#[derive(Debug)]
pub struct AbdSession {
    socket: UdpSocket,
    engine: Engine,
    auth: Option<Authenticator>,
    lines: u32,
    started: Instant,
    buffer: Vec<u8>,
    next_token: u64,
    /// Datagrams that failed authentication, by reason.
    drops: DropCounts,
    /// Warnings of datagrams that failed authentication (rate-limited).
    auth_warnings: AuthWarnings,
}

/// The counter floor of an ABD coordinator starting now (`pmnet_abd::counter_floor_at` of
/// the wall clock): a coordinator restarted with the same writer id stamps above its previous
/// life.
pub fn abd_counter_floor() -> u64 {
    let micros = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_micros() as u64);
    pmnet_abd::counter_floor_at(micros)
}

impl AbdSession {
    /// A session on a new socket. Refuses a direct mode without nodes or with more than 16.
    pub fn open(config: AbdSessionConfig) -> io::Result<AbdSession> {
        let toward = match &config.mode {
            AbdMode::Device(device) => *device,
            AbdMode::Direct { nodes, .. } => *nodes
                .first()
                .ok_or_else(|| io::Error::other("no memory node given"))?,
        };
        let bind: SocketAddr = if toward.is_ipv4() {
            "0.0.0.0:0".parse().expect("an address")
        } else {
            "[::]:0".parse().expect("an address")
        };
        let session = crate::random_session_id();
        let engine = match config.mode {
            AbdMode::Device(device) => {
                Engine::Device(AbdClient::new(ClientConfig::new(device, session)), device)
            }
            AbdMode::Direct { nodes, writer } => {
                let mut unique = nodes.clone();
                unique.sort();
                unique.dedup();
                if nodes.len() > pmnet_abd::NODES_MAX || unique.len() != nodes.len() {
                    return Err(io::Error::other("1 to 16 memory nodes, each named once"));
                }
                let mut coordinator = CoordinatorConfig::new(nodes, config.lines, writer, session);
                coordinator.counter_floor = abd_counter_floor();
                Engine::Direct(Coordinator::new(coordinator))
            }
        };
        Ok(AbdSession {
            socket: UdpSocket::bind(bind)?,
            engine,
            auth: config.keys.map(Authenticator::new),
            lines: config.lines,
            started: Instant::now(),
            buffer: vec![0u8; 65_536],
            next_token: 1,
            drops: DropCounts::default(),
            auth_warnings: AuthWarnings::default(),
        })
    }

    fn now(&self) -> Time {
        Time::since(self.started, Instant::now())
    }

    /// Datagrams dropped for failing authentication, by reason.
    pub fn drops(&self) -> &DropCounts {
        &self.drops
    }

    /// Whether the session runs the quorum itself.
    pub fn is_direct(&self) -> bool {
        matches!(self.engine, Engine::Direct(_))
    }

    fn has_room(&self) -> bool {
        match &self.engine {
            Engine::Device(client, _) => client.has_room(),
            Engine::Direct(coordinator) => coordinator.in_flight() < WINDOW,
        }
    }

    fn start(&mut self, token: u64, first: u32, count: u16, kind: OpKind) -> Result<(), AbdError> {
        let now = self.now();
        match &mut self.engine {
            Engine::Device(client, _) => client.start(now, token, first, count, kind),
            Engine::Direct(coordinator) => coordinator.start(now, token, first, count, kind),
        }
    }

    fn poll_transmit(&mut self) -> Option<Transmit> {
        match &mut self.engine {
            Engine::Device(client, _) => client.poll_transmit(),
            Engine::Direct(coordinator) => coordinator.poll_transmit(),
        }
    }

    fn poll_done(&mut self) -> Option<(u64, Result<Vec<u8>, AbdError>)> {
        match &mut self.engine {
            Engine::Device(client, _) => client.poll_done().map(|d| (d.token, d.result)),
            Engine::Direct(coordinator) => coordinator.poll_done().map(|d| (d.token, d.result)),
        }
    }

    fn poll_timeout(&self) -> Option<Time> {
        match &self.engine {
            Engine::Device(client, _) => client.poll_timeout(),
            Engine::Direct(coordinator) => coordinator.poll_timeout(),
        }
    }

    fn handle_timeout(&mut self) {
        let now = self.now();
        match &mut self.engine {
            Engine::Device(client, _) => client.handle_timeout(now),
            Engine::Direct(coordinator) => coordinator.handle_timeout(now),
        }
    }

    fn send(&mut self) -> io::Result<()> {
        while let Some(transmit) = self.poll_transmit() {
            let mut bytes = transmit.bytes;
            if let Some(auth) = &mut self.auth {
                auth.seal(&mut bytes);
            }
            match self.socket.send_to(&bytes, transmit.destination) {
                Ok(_) => {}
                // A node that is down: its answer is not needed, or comes on a resend.
                Err(error) if error.kind() == io::ErrorKind::ConnectionRefused => {}
                Err(error) => return Err(error),
            }
        }
        Ok(())
    }

    fn receive(&mut self) -> io::Result<()> {
        let now = self.now();
        let wait = self
            .poll_timeout()
            .map_or(Duration::from_millis(10), |at| {
                at.saturating_duration_since(now)
            })
            .max(Duration::from_micros(50));
        self.socket.set_read_timeout(Some(wait))?;
        let (len, from) = match self.socket.recv_from(&mut self.buffer) {
            Ok(received) => received,
            Err(error)
                if matches!(
                    error.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                        | io::ErrorKind::ConnectionRefused
                ) =>
            {
                return Ok(())
            }
            Err(error) => return Err(error),
        };
        let datagram = match &mut self.auth {
            Some(auth) => match auth.verify(&self.buffer[..len]) {
                Ok(verified) => verified.into_owned(),
                Err(error) => {
                    // Not from the deployment: counted, warned of, ignored.
                    let now = self.now();
                    let role = if self.is_direct() {
                        "memory client (coordinator)"
                    } else {
                        "memory client"
                    };
                    self.auth_warnings.failed(
                        now,
                        role,
                        from,
                        pmnet_proto::DropReason::Auth(error),
                    );
                    self.drops.record(DropReason::Auth(error));
                    return Ok(());
                }
            },
            None => self.buffer[..len].to_vec(),
        };
        let Ok((header, payload)) = pmnet_wire::Header::parse(&datagram) else {
            return Ok(());
        };
        let now = self.now();
        match &mut self.engine {
            Engine::Device(client, device) => {
                if from == *device {
                    client.handle(now, &header, payload);
                }
            }
            Engine::Direct(coordinator) => coordinator.handle(now, from, &header, payload),
        }
        Ok(())
    }

    /// Run `ops` (first line, lines, what), pipelined, and give each one's result in order.
    pub fn run(
        &mut self,
        ops: Vec<(u32, u16, OpKind)>,
    ) -> io::Result<Vec<Result<Vec<u8>, AbdError>>> {
        let total = ops.len();
        let base = self.next_token;
        self.next_token += total as u64;
        let mut results: Vec<Option<Result<Vec<u8>, AbdError>>> = vec![None; total];
        let mut waiting = ops.into_iter().enumerate().peekable();
        let mut finished = 0;
        while finished < total {
            while self.has_room() {
                let Some((i, (first, count, kind))) = waiting.next() else {
                    break;
                };
                if let Err(error) = self.start(base + i as u64, first, count, kind) {
                    results[i] = Some(Err(error));
                    finished += 1;
                }
            }
            self.send()?;
            while let Some((token, result)) = self.poll_done() {
                if let Some(slot) = token
                    .checked_sub(base)
                    .and_then(|i| results.get_mut(i as usize))
                {
                    if slot.is_none() {
                        *slot = Some(result);
                        finished += 1;
                    }
                }
            }
            if finished == total {
                break;
            }
            self.receive()?;
            self.handle_timeout();
        }
        Ok(results
            .into_iter()
            .map(|r| r.expect("every operation finished"))
            .collect())
    }

    /// Read `count` lines (any number: split into operations of 16).
    pub fn read(&mut self, first: u32, count: u32) -> io::Result<Result<Vec<u8>, AbdError>> {
        let ops = split(first, count)
            .map(|(first, count)| (first, count, OpKind::Read))
            .collect();
        let mut out = Vec::with_capacity(count as usize * LINE);
        for result in self.run(ops)? {
            match result {
                Ok(lines) => out.extend_from_slice(&lines),
                Err(error) => return Ok(Err(error)),
            }
        }
        Ok(Ok(out))
    }

    /// Write whole lines from `first` on (`data` a multiple of 64 bytes).
    pub fn write(&mut self, first: u32, data: &[u8]) -> io::Result<Result<(), AbdError>> {
        if data.len() % LINE != 0 {
            return Ok(Err(AbdError::BadRequest));
        }
        let count = (data.len() / LINE) as u32;
        let ops = split(first, count)
            .map(|(at, n)| {
                let offset = (at - first) as usize * LINE;
                let bytes = data[offset..offset + usize::from(n) * LINE].to_vec();
                (at, n, OpKind::Write(bytes))
            })
            .collect();
        for result in self.run(ops)? {
            if let Err(error) = result {
                return Ok(Err(error));
            }
        }
        Ok(Ok(()))
    }
}

/// `count` lines from `first` as operations of at most 16.
fn split(first: u32, count: u32) -> impl Iterator<Item = (u32, u16)> {
    let max = u32::from(LINES_MAX);
    (0..count.div_ceil(max)).map(move |i| {
        let at = first + i * max;
        (at, (count - i * max).min(max) as u16)
    })
}

fn line_error(error: AbdError) -> LineError {
    match error {
        AbdError::Unavailable => LineError::Unavailable,
        AbdError::InDoubt => LineError::InDoubt,
        other => LineError::Other(other.to_string()),
    }
}

impl LineStore for AbdSession {
    fn lines(&self) -> u64 {
        u64::from(self.lines)
    }

    fn read_lines(&mut self, first: u64, count: u64, out: &mut [u8]) -> Result<(), LineError> {
        if first + count > u64::from(self.lines) || out.len() as u64 != count * LINE as u64 {
            return Err(LineError::OutOfRange { first, count });
        }
        match self.read(first as u32, count as u32) {
            Ok(Ok(lines)) => {
                out.copy_from_slice(&lines);
                Ok(())
            }
            Ok(Err(error)) => Err(line_error(error)),
            Err(error) => Err(LineError::Other(error.to_string())),
        }
    }

    fn write_lines(&mut self, runs: &[(u64, &[u8])]) -> Result<(), LineError> {
        let mut ops = Vec::new();
        for (first, bytes) in runs {
            let count = (bytes.len() / LINE) as u64;
            if bytes.len() % LINE != 0 || first + count > u64::from(self.lines) {
                return Err(LineError::OutOfRange {
                    first: *first,
                    count,
                });
            }
            for (at, n) in split(*first as u32, count as u32) {
                let offset = (u64::from(at) - first) as usize * LINE;
                let data = bytes[offset..offset + usize::from(n) * LINE].to_vec();
                ops.push((at, n, OpKind::Write(data)));
            }
        }
        let results = self
            .run(ops)
            .map_err(|error| LineError::Other(error.to_string()))?;
        match results.into_iter().find_map(Result::err) {
            Some(error) => Err(line_error(error)),
            None => Ok(()),
        }
    }
}

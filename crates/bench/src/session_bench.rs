//! `pmnet session-bench`: does a server stay fast as the sessions it has seen grow past its
//! session table?
//!
//! A `pmnet server` process, started as a user starts it; one client socket sends SETs, each
//! from a session never seen before (as short-lived clients do: one command, one session),
//! keeping a window of them in flight. The rate of acknowledged SETs is reported per stretch of
//! sessions, so a slowdown once the table is full (eviction) shows as a falling ratio to the
//! first stretch.

use std::collections::HashMap;
use std::net::UdpSocket;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Args;
use pmnet_store::Request;
use pmnet_wire::{Header, PacketType};

use crate::drain_bench::{free_port, FilesGuard, Process};
use pmnet::CliError;

/// A request not answered within this is sent again.
const RESEND_AFTER: Duration = Duration::from_millis(200);
/// Keys the SETs write, round robin.
const KEY_COUNT: u64 = 10_000;
/// No acknowledgement for this long stops the run with an error.
const STALL_LIMIT: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Args)]
pub struct SessionBenchArgs {
    /// New sessions in all, one SET each.
    #[arg(long, value_name = "N", default_value_t = 1_200_000,
          value_parser = clap::value_parser!(u64).range(1000..=100_000_000))]
    pub sessions: u64,

    /// Sessions per reported stretch.
    #[arg(long, value_name = "N", default_value_t = 100_000,
          value_parser = clap::value_parser!(u64).range(100..=10_000_000))]
    pub stretch: u64,

    /// SETs in flight.
    #[arg(long, value_name = "N", default_value_t = 64,
          value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub window: u32,

    /// Size of the server's store, MiB.
    #[arg(long, value_name = "MIB", default_value_t = 256)]
    pub data_mib: u64,

    /// Where the store file goes (removed afterwards).
    #[arg(long, value_name = "DIR", default_value = "/dev/shm")]
    pub dir: std::path::PathBuf,

    /// Run this `pmnet` binary as the server instead of the one the benchmarks start (an
    /// earlier build, to compare side by side).
    #[arg(long, value_name = "PATH")]
    pub server_binary: Option<std::path::PathBuf>,
}

pub fn run(args: SessionBenchArgs) -> Result<ExitCode, CliError> {
    let server_addr = free_port()?;
    let data_file = args
        .dir
        .join(format!("pmnet-session-bench-{}.data", std::process::id()));
    let _files = FilesGuard(vec![data_file.clone()]);
    let binary = match &args.server_binary {
        Some(path) => path.clone(),
        None => crate::procs::pmnet_program()?,
    };
    let mut server = Process::spawn_binary(
        "server",
        &binary,
        &[
            "server".to_owned(),
            "--listen".to_owned(),
            server_addr.to_string(),
            "--data-file".to_owned(),
            data_file.display().to_string(),
            "--data-mib".to_owned(),
            args.data_mib.to_string(),
            "--format".to_owned(),
        ],
    )?;
    let banner = server.wait_listening()?;
    println!(
        "session-bench: {} SETs, each from a new session, {} in flight, straight to a server \
         (sleeping when idle): {}",
        args.sessions,
        args.window,
        binary.display()
    );
    for line in banner.iter().filter(|line| line.contains("medium:")) {
        println!("  {}", line.trim());
    }
    let socket = UdpSocket::bind("127.0.0.1:0")?;
    socket.connect(server_addr)?;
    socket.set_read_timeout(Some(Duration::from_millis(20)))?;
    send_sets(&args, &socket)?;
    drop(server);
    Ok(ExitCode::SUCCESS)
}

/// Send every session's SET, keeping the window full, until each is acknowledged; a line per
/// stretch of sessions.
fn send_sets(args: &SessionBenchArgs, socket: &UdpSocket) -> Result<(), CliError> {
    let mut load = Load {
        socket,
        in_flight: HashMap::new(),
        next_session: 1,
        acked: 0,
        last_ack: Instant::now(),
    };
    let mut stretch = Stretch {
        start: Instant::now(),
        acked: 0,
        first_rate: None,
    };
    let mut buffer = [0u8; 2048];
    let deadline = Instant::now() + Duration::from_secs(3600);
    while load.acked < args.sessions {
        load.fill_window(args)?;
        if load.receive(&mut buffer)? {
            stretch.acked += 1;
        }
        if stretch.acked >= args.stretch || load.acked == args.sessions {
            stretch.report(load.acked);
        }
        if Instant::now() > deadline {
            return Err("the benchmark did not finish within an hour".into());
        }
        if load.last_ack.elapsed() > STALL_LIMIT {
            return Err(format!(
                "the server acknowledged nothing for {STALL_LIMIT:?} after {} SETs",
                load.acked
            )
            .into());
        }
    }
    Ok(())
}

/// The SETs sent and acknowledged.
struct Load<'a> {
    socket: &'a UdpSocket,
    /// The SETs in flight by session: the datagram, and when it was last sent.
    in_flight: HashMap<u64, (Vec<u8>, Instant)>,
    next_session: u64,
    acked: u64,
    last_ack: Instant,
}

impl Load<'_> {
    /// Send SETs of new sessions until the window is full or every session has been sent.
    fn fill_window(&mut self, args: &SessionBenchArgs) -> Result<(), CliError> {
        while self.in_flight.len() < args.window as usize && self.next_session <= args.sessions {
            let session_id = 0x5E55_0000_0000_0000 | self.next_session;
            // A bounded key space: the store must not fill up (a full store keeps updates
            // waiting, and this measures sessions, not capacity).
            let key = format!("k{}", self.next_session % KEY_COUNT);
            let payload = Request::Set {
                key: key.as_bytes(),
                value: b"v",
            }
            .to_bytes();
            let datagram =
                Header::new(PacketType::UpdateRequest, 1, session_id, 1).encode(&payload);
            self.socket.send(&datagram)?;
            self.in_flight
                .insert(session_id, (datagram, Instant::now()));
            self.next_session += 1;
        }
        Ok(())
    }

    /// Wait a little for a datagram: an OK acknowledgement of a SET in flight counts (returns
    /// true); when none comes, resend the SETs unanswered for too long.
    fn receive(&mut self, buffer: &mut [u8]) -> Result<bool, CliError> {
        match self.socket.recv(buffer) {
            Ok(len) => {
                if let Ok((header, reply)) = Header::parse(&buffer[..len]) {
                    if header.packet_type == PacketType::ServerAck
                        && self.in_flight.remove(&header.session_id).is_some()
                    {
                        if pmnet_store::Reply::decode(reply) != Ok(pmnet_store::Reply::Ok) {
                            return Err(format!(
                                "SET {} was answered {:?}, not OK",
                                self.acked + 1,
                                pmnet_store::Reply::decode(reply)
                            )
                            .into());
                        }
                        self.acked += 1;
                        self.last_ack = Instant::now();
                        return Ok(true);
                    }
                }
                Ok(false)
            }
            Err(error)
                if matches!(
                    error.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                let now = Instant::now();
                for (datagram, sent) in self.in_flight.values_mut() {
                    if now.duration_since(*sent) >= RESEND_AFTER {
                        self.socket.send(datagram)?;
                        *sent = now;
                    }
                }
                Ok(false)
            }
            Err(error) => Err(error.into()),
        }
    }
}

/// A stretch of sessions being measured.
struct Stretch {
    start: Instant,
    acked: u64,
    /// The rate of the first stretch, the one the others are compared with.
    first_rate: Option<f64>,
}

impl Stretch {
    /// Print the stretch that ends at `acked` SETs, and start the next.
    fn report(&mut self, acked: u64) {
        let rate = self.acked as f64 / self.start.elapsed().as_secs_f64();
        let first = *self.first_rate.get_or_insert(rate);
        println!(
            "  sessions {:>9} .. {:>9}: {:>9.0} SETs/s  ({:.2}x the first stretch)",
            acked - self.acked + 1,
            acked,
            rate,
            rate / first
        );
        self.acked = 0;
        self.start = Instant::now();
    }
}

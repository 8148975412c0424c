//! The PMNet server over UDP, with its application: a node of the one event loop.

mod app;
mod forward;
mod metrics;
mod open;
mod receive;
mod xdp;

use app::capacity_text;
pub use app::ServerApp;
pub use forward::{forward_log_path, FORWARD_LOG_SLOTS, FORWARD_LOG_SLOT_SIZE};
pub use pmnet_proto::{capacity_text as emulated_capacity_text, check_max_ops_per_s, TokenBucket};
use receive::{stage_received, ReceivedSlots};
pub use xdp::ServerXdpOptions;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use pmnet_pktstore::recv::{now_ns, Received, SlotReceiver};
use pmnet_pktstore::{EngineKind, Store, StoreConfig};
use pmnet_pm::{MediumInfo, MmapOptions, MmapRegion};
use pmnet_proto::{
    RecoveredSession, RequestKind, Server, ServerConfig, ServerCounters, Stager, Time,
};
use pmnet_store::{Application, IdealHandler, KvConfig, KvStore, NoSpace, SessionRecord};

use crate::event_loop::{run_loop, LoopCounters, LoopSettings, Node, Ready, Turn};
use crate::metrics::Metrics;
use crate::peers::{wants_answer, PeerWatch};
use crate::udp::BatchSocket;
use crate::wait::{Clock, PollFd};
use crate::{
    socket_digest, socket_metrics, start_metrics, LoopOptions, MetricsBoard, RuntimeError, Shutdown,
};

/// The embedded key-value store's file.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    pub path: PathBuf,
    /// Size of a new data file; an existing store keeps its own.
    pub size_bytes: u64,
    /// Sessions whose exactly-once record a new store keeps.
    pub max_sessions: u32,
    /// Erase the file and start an empty store even if it holds one.
    pub format: bool,
    pub mmap: MmapOptions,
    /// How the store grows while it serves (docs/storage.md, "Growing a store").
    pub growth: StoreGrowth,
}

/// How a store grows: its data file is made longer, up to `max_bytes`, when `at_percent` of its
/// data space is in use (a restart in place: the store is closed, grown, reopened and
/// recovered). The packet and conventional engines grow; `kv` does not.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreGrowth {
    /// The largest the data file grows to; no more than its size (0 by default): never.
    pub max_bytes: u64,
    /// The share of the data space in use, in percent (1..=100), at which it grows.
    pub at_percent: u8,
    /// Grow the data file to this length when it is opened (a restart in place to grow sets it).
    pub to_bytes: Option<u64>,
}

/// How often, in turns, a server looks at its store's occupancy to grow it.
const GROWTH_CHECK_TURNS: u32 = 256;

/// Everything a server needs to start.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    pub server_id: u16,
    pub listen: SocketAddr,
    /// Devices polled for logged requests at start-up; nothing new is applied until each has
    /// answered.
    pub devices: Vec<SocketAddr>,
    /// Replica servers this server is the primary of (docs/replication.md): each request
    /// applied is forwarded to every one, and its server-ACK waits until all acked it.
    pub replicas: Vec<SocketAddr>,
    /// The key-value store; `None` runs the ideal handler (replies OK, keeps nothing).
    pub store: Option<StoreOptions>,
    /// How long a gap in a session must last before the server closes it without the client
    /// (`None`: the protocol's default, 20 s). Must exceed every client's request lifetime.
    pub gap_fill_after: Option<Duration>,
    /// Authenticate every datagram with these deployment keys (`None`: no authentication).
    pub keys: Option<pmnet_auth::KeySet>,
    pub loop_options: LoopOptions,
    /// An emulated capacity: take at most this many requests per second from the socket,
    /// leaving the rest in the kernel's socket buffer (`None`: no limit). See
    /// [`TokenBucket`].
    pub max_ops_per_s: Option<u64>,
    /// Follow the controllers (`--controller`): statuses to them, their routes taken (the
    /// chain's last device becomes the one this server asks). `None`: no controller.
    pub follow: Option<pmnet_proto::route::FollowerConfig>,
}

/// What the server found when it started.
#[derive(Debug, Clone)]
pub struct ServerStartup {
    pub medium: Option<MediumInfo>,
    pub data_path: Option<PathBuf>,
    pub formatted: bool,
    pub recovered_session_count: usize,
    pub recovered_key_count: usize,
    /// What store recovery reported, in words, when it is worth a warning.
    pub store_warning: Option<String>,
    /// The application: kv, packet, conventional or ideal.
    pub engine: &'static str,
    /// What recovery of a `pmnet-pktstore` engine did and how long it took.
    pub recovery_note: Option<String>,
    /// How many keys of which size the store has room for, in words (`None`: no store).
    pub capacity: Option<String>,
    /// How datagrams reach the server, in words: the UDP socket, and with `--xdp` the AF_XDP
    /// socket whose UMEM is the store.
    pub receive: String,
}

impl ServerStartup {
    pub fn medium_text(&self) -> String {
        match &self.medium {
            Some(medium) => medium.to_string(),
            None => "none: ideal handler (replies OK, keeps nothing, no exactly-once across \
                     restarts)"
                .to_owned(),
        }
    }
}

/// Where the server's sockets are bound.
#[derive(Debug, Clone, Copy)]
pub struct ServerAddresses {
    pub data: SocketAddr,
    pub metrics: Option<SocketAddr>,
}

#[derive(Debug, Clone, Default)]
struct RuntimeCounters {
    /// Turns that left datagrams in the socket for want of tokens (an emulated capacity).
    capacity_waits: u64,
    /// Requests paid for with tokens (an emulated capacity): request fragments and cache reads.
    capacity_paid: u64,
    recoveries_completed: u64,
    recovery_entries_resent: u64,
    event_loop: LoopCounters,
}

/// A running PMNet server. See the crate docs.
#[derive(Debug)]
pub struct ServerRuntime {
    options: ServerOptions,
    clock: Clock,
    server: Server,
    /// The AF_XDP receive path (`--xdp`): its socket's UMEM is the store's region, so it is
    /// declared before `app` and dropped (the socket closed) before the store is unmapped.
    xdp: Option<Box<xdp::XdpReceive>>,
    app: ServerApp,
    socket: BatchSocket,
    startup: ServerStartup,
    addresses: ServerAddresses,
    board: MetricsBoard,
    shutdown: Shutdown,
    /// Ends this run's loop (the process's stop, or a restart in place) and its metrics
    /// endpoint.
    run_stop: Shutdown,
    /// The options to open again with, when a controller's route asked for a restart in place.
    restart: Option<ServerOptions>,
    /// Turns since the store's occupancy was last looked at ([`ServerRuntime::check_growth`]).
    growth_check_turns: u32,
    counters: RuntimeCounters,
    /// The packet store's receive path: datagrams land in store slots.
    receiver: Option<Box<SlotReceiver>>,
    received_slots: ReceivedSlots,
    /// The slots of the request being staged (reused, no allocation per request).
    slot_scratch: Vec<u32>,
    /// Since when updates have waited for room in the store, and when that was last said.
    store_full_since: Option<Instant>,
    store_full_warned: Option<Instant>,
    /// Whether the devices answer the server's recovery polls and fill queries.
    devices: PeerWatch,
    /// Whether the replicas (if this server is a primary) answer what it forwards.
    replicas: PeerWatch,
    /// Who the socket last heard from, and when.
    peers: crate::peer_book::PeerBook,
    /// `server{id=..}`: every event of this server (its recovery, its loop) carries it.
    span: tracing::Span,
    /// The emulated capacity (`--max-ops-per-s`), if any.
    bucket: Option<TokenBucket>,
    /// A primary's forward log (with a store; see `forward.rs`).
    forward_log: Option<forward::ForwardLogFile>,
    /// The last receive stopped for want of tokens: the next turn receives once tokens are
    /// due, whether or not the wait reported the socket readable (it was not waited on).
    capacity_starved: bool,
    /// Busy turns since the UDP socket was last looked at while AF_XDP takes the traffic.
    udp_skipped: u32,
}

/// With AF_XDP receiving the steered traffic, a loop that does not wait (busy-poll, or more to
/// do) looks at the UDP socket, where only what is not steered arrives, every this many turns:
/// a `recvmmsg` that finds nothing costs a system call.
const UDP_LOOK_EVERY: u32 = 16;

/// Where a turn receives.
#[derive(Debug, Clone, Copy)]
struct Receive {
    /// The UDP socket.
    udp: bool,
    /// The AF_XDP socket.
    xsk: bool,
}

/// How often a server whose store is full says so.
const STORE_FULL_WARNING_INTERVAL: Duration = Duration::from_secs(10);

impl ServerRuntime {
    pub fn startup(&self) -> &ServerStartup {
        &self.startup
    }

    pub fn addresses(&self) -> ServerAddresses {
        self.addresses
    }

    pub fn counters(&self) -> &ServerCounters {
        self.server.counters()
    }

    pub fn app(&self) -> &ServerApp {
        &self.app
    }

    /// Whether the start-up recovery poll still waits for a device.
    pub fn is_recovering(&self) -> bool {
        self.server.is_recovering()
    }

    /// Run until the shutdown flag is set; then finish the batch in hand and return.
    pub fn run(&mut self) -> Result<(), RuntimeError> {
        let _entered = self.span.clone().entered();
        let settings = LoopSettings::from(&self.options.loop_options);
        let board = self.addresses.metrics.map(|_| self.board.clone());
        let stop = self.run_stop.clone();
        let result = run_loop(self, settings, board.as_ref(), &stop);
        // The metrics endpoint stops with the run (a restart in place opens its own).
        self.run_stop.request();
        result
    }

    /// The options a controller's route asked this server to be opened again with (a restart
    /// in place: drop this runtime, then [`ServerRuntime::open_with_xdp`] them), once the run
    /// ended.
    pub fn take_restart(&mut self) -> Option<ServerOptions> {
        self.restart.take()
    }

    /// One turn of the loop: receive a batch, handle it, fire due timers, apply, send.
    /// Returns whether anything happened.
    pub fn poll_once(&mut self) -> bool {
        self.turn(Receive {
            udp: true,
            xsk: true,
        })
        .busy
    }

    /// Receive at most a batch from the AF_XDP socket (`xsk`) or the UDP socket, as the
    /// tokens of an emulated capacity allow: (datagrams, a full batch, cut short by tokens).
    fn receive_from(&mut self, xsk: bool) -> (usize, bool, bool) {
        let full = match (xsk, &self.receiver) {
            (true, _) => pmnet_pktstore::xsk_recv::XSK_BATCH_LEN,
            (false, Some(_)) => pmnet_pktstore::recv::RECEIVE_BATCH_LEN,
            (false, None) => crate::udp::BATCH_LEN,
        };
        let limit = self.receive_limit(full);
        if limit == 0 {
            return (0, false, true);
        }
        let requests_before = self.requests_received();
        let count = match (xsk, &self.receiver) {
            (true, _) => self.receive_from_xsk(limit),
            (false, Some(_)) => self.receive_into_slots(limit),
            (false, None) => self.receive_into_socket_buffers(limit),
        };
        let requests = self.requests_received() - requests_before;
        self.pay_for(requests);
        // Cut short by the tokens, and perhaps more waiting: look again when they are due.
        (count, count >= full, limit < full && count >= limit)
    }

    /// A turn of the loop; it receives where `receive` says.
    fn turn(&mut self, receive: Receive) -> Turn {
        let mut turn = Turn::default();
        let retry = self.capacity_starved;
        let mut starved = false;
        if self.xdp.is_some() && (receive.xsk || retry) {
            let (count, full, cut) = self.receive_from(true);
            turn.busy |= count > 0;
            turn.more |= full;
            // Looking at the RX ring costs no system call: look once more before sleeping.
            turn.again |= count > 0;
            starved |= cut;
        }
        if (receive.udp || retry) && !starved {
            let (count, full, cut) = self.receive_from(false);
            turn.busy |= count > 0;
            turn.more |= full;
            starved |= cut;
        }
        if receive.udp || receive.xsk || retry {
            self.capacity_starved = starved;
            if starved {
                self.counters.capacity_waits += 1;
            }
        }
        let now = self.clock.now();
        if self
            .server
            .poll_timeout()
            .is_some_and(|deadline| deadline <= now)
        {
            turn.busy = true;
            turn.more = true;
            self.server.handle_timeout(now);
        }
        self.drain();
        if self.socket.has_unreachable() {
            let reports = self.socket.take_unreachable();
            self.devices.unreachable(&reports);
            self.replicas.unreachable(&reports);
        }
        self.devices.check(Instant::now());
        self.replicas.check(Instant::now());
        self.release_unapplied_slots();
        if let (Some(xdp), ServerApp::Engine(store)) = (&mut self.xdp, &mut self.app) {
            // Slots given back since the last receive go to the fill ring now, so the kernel
            // has them while the loop waits (and a starved ring recovers without traffic).
            xdp.receiver.replenish(store);
            xdp.follow_store();
        }
        self.report_store_full();
        self.check_growth();
        if self.shutdown.is_requested() {
            self.run_stop.request();
        }
        if let Some((devices, replicas)) = self.server.take_restart() {
            let mut options = self.restart_options();
            tracing::warn!(
                "route: restarting in place with devices {devices:?} and replicas \
                 {replicas:?} (was devices {:?}, replicas {:?}): the store and the forward log \
                 are opened again",
                options.devices,
                options.replicas
            );
            options.devices = devices;
            options.replicas = replicas;
            self.restart = Some(options);
            self.run_stop.request();
        }
        turn
    }

    /// Where a turn of the event loop receives, from what its wait found (`ready`).
    fn receive_for(&mut self, ready: &Ready<'_>) -> Receive {
        if self.xdp.is_none() {
            return Receive {
                udp: ready.is_readable(0),
                xsk: false,
            };
        }
        // The AF_XDP socket is the first descriptor (the one the loop looks at once more
        // before it sleeps), the UDP socket the second.
        let udp = match ready {
            // No wait: the UDP socket, where only what is not steered arrives, now and then.
            Ready::All => {
                self.udp_skipped += 1;
                self.udp_skipped >= UDP_LOOK_EVERY
            }
            _ => ready.is_readable(1),
        };
        if udp {
            self.udp_skipped = 0;
        }
        Receive {
            udp,
            xsk: ready.is_readable(0),
        }
    }

    /// Datagrams this turn may take from the socket: `full` without an emulated capacity,
    /// else no more than the tokens available.
    fn receive_limit(&mut self, full: usize) -> usize {
        let now = self.clock.now();
        match &mut self.bucket {
            None => full,
            Some(bucket) => usize::try_from(bucket.available(now))
                .unwrap_or(usize::MAX)
                .min(full),
        }
    }

    /// Request datagrams received so far: request fragments and cache reads (a cache read
    /// the server answers costs it as much as a read request).
    fn requests_received(&self) -> u64 {
        let counters = self.server.counters();
        counters.request_fragments_received + counters.reads.received
    }

    /// Pay the emulated capacity for `requests` request datagrams taken (a batch's entries
    /// each count).
    fn pay_for(&mut self, requests: u64) {
        let now = self.clock.now();
        if let Some(bucket) = &mut self.bucket {
            bucket.take(now, requests);
            self.counters.capacity_paid += requests;
        }
    }

    /// When tokens are due again, if the server waits for them.
    fn capacity_wake(&self) -> Option<Time> {
        let bucket = self.bucket.as_ref()?;
        self.capacity_starved
            .then(|| bucket.next_wake(self.clock.now()))
            .flatten()
    }

    /// The emulated capacity in words, for banners and report lines (`None`: no limit).
    pub fn capacity_text(&self) -> Option<String> {
        self.bucket
            .as_ref()
            .map(|bucket| pmnet_proto::capacity_text(bucket.rate_per_s()))
    }

    /// Say at WARN, every [`STORE_FULL_WARNING_INTERVAL`] while it lasts, that updates wait for
    /// room in the store, and at INFO when they no longer do.
    /// The options to open this server again with in place: the addresses it has now (the
    /// ports it got, when it asked for any), its follower's epoch, its store reopened, never
    /// erased.
    fn restart_options(&self) -> ServerOptions {
        let mut options = self.options.clone();
        options.listen = self.addresses.data;
        if let Some(metrics) = self.addresses.metrics {
            options.loop_options.metrics_listen = Some(metrics);
        }
        if let (Some(follow), Some(follower)) = (options.follow.as_mut(), self.server.follower()) {
            follow.epoch = follower.epoch();
        }
        if let Some(store) = options.store.as_mut() {
            store.format = false;
        }
        options
    }

    /// Every [`GROWTH_CHECK_TURNS`] turns, and at once while updates wait for room: if the
    /// store's data space is `at_percent` in use and its file may grow, ask for a restart in
    /// place that doubles it (up to `max_bytes`).
    fn check_growth(&mut self) {
        self.growth_check_turns = self.growth_check_turns.wrapping_add(1);
        let waiting = self.server.deferred_session_count() > 0;
        if !waiting && self.growth_check_turns % GROWTH_CHECK_TURNS != 0 || self.restart.is_some() {
            return;
        }
        let (ServerApp::Engine(store), Some(options)) = (&self.app, &self.options.store) else {
            return;
        };
        let growth = options.growth;
        let data_len = store.geometry().data_len.max(1);
        let used = data_len.saturating_sub(store.free_bytes().min(data_len));
        let percent = used * 100 / data_len;
        if percent < u64::from(growth.at_percent.max(1)) && !waiting {
            return;
        }
        let file_len = pmnet_pm::PmRegion::len(store.region()) as u64;
        if growth.max_bytes <= file_len {
            return;
        }
        let target = file_len.saturating_mul(2).min(growth.max_bytes);
        let mut restart = self.restart_options();
        if let Some(store) = restart.store.as_mut() {
            store.growth.to_bytes = Some(target);
        }
        tracing::warn!(
            "the store is {percent}% full ({used} of {data_len} bytes of data space{}): growing \
             its data file {} from {} to {} MiB (up to --data-max-mib {}); restarting in place \
             (the store is reopened and recovered, the devices resend what they logged)",
            if waiting {
                "; updates wait for room"
            } else {
                ""
            },
            options.path.display(),
            file_len >> 20,
            target >> 20,
            growth.max_bytes >> 20
        );
        self.restart = Some(restart);
        self.run_stop.request();
    }

    fn report_store_full(&mut self) {
        let waiting = self.server.deferred_session_count();
        match (waiting, self.store_full_since) {
            (0, None) => {}
            (0, Some(since)) => {
                self.store_full_since = None;
                self.store_full_warned = None;
                tracing::info!(
                    "the store has room again: the updates that waited {:.1} s are applied",
                    since.elapsed().as_secs_f64()
                );
            }
            (_, since) => {
                let now = Instant::now();
                self.store_full_since = Some(since.unwrap_or(now));
                if self
                    .store_full_warned
                    .is_some_and(|at| now.duration_since(at) < STORE_FULL_WARNING_INTERVAL)
                {
                    return;
                }
                self.store_full_warned = Some(now);
                tracing::warn!(
                    "the store is full: updates of {waiting} session(s) wait for room ({} \
                     deferred so far). Nothing acknowledged is lost: each stays durable in its \
                     device's log and is retried, and the sessions' later requests wait behind \
                     it. Delete keys, or let it grow (--data-max-mib; `pmnet store grow` on a \
                     stopped server)",
                    self.server.counters().requests_deferred
                );
            }
        }
    }

    /// Apply what the server hands over and send what it emits. Requests are staged on the
    /// application and committed together by the executor the simulator runs too
    /// ([`Server::apply_ready`]: two fences per batch on the packet store, nothing more on a
    /// store whose stages are durable on return); a request's server-ACK is emitted only after
    /// the commit that made it durable returned.
    fn drain(&mut self) {
        loop {
            let mut stager = RuntimeStager {
                app: &mut self.app,
                received_slots: &mut self.received_slots,
                scratch: &mut self.slot_scratch,
            };
            let applied = self.server.apply_ready(self.clock.now(), &mut stager);
            for report in &applied.recoveries_complete {
                self.counters.recoveries_completed += 1;
                self.counters.recovery_entries_resent += report.entries_resent;
                tracing::info!(
                    "recovery complete: every device answered; {} logged entries were resent, \
                     and every request received is applied ({} sequence numbers skipped that \
                     no device held and no client could send any more) {:.1} ms after the last \
                     device answered",
                    report.entries_resent,
                    report.numbers_skipped,
                    report.took.as_secs_f64() * 1e3
                );
            }
            let mut progressed = !applied.is_empty();
            progressed |= self.persist_forwards();
            if applied.applied > 0 || applied.deferred > 0 {
                tracing::trace!(
                    applied = applied.applied,
                    commits = applied.commits,
                    deferred = applied.deferred,
                    "requests applied"
                );
            }
            while let Some(transmit) = self.server.poll_transmit() {
                progressed = true;
                crate::trace::sent(transmit.destination, &transmit.bytes);
                if wants_answer(&transmit.bytes) {
                    self.devices.sent(transmit.destination, Instant::now());
                    self.replicas.sent(transmit.destination, Instant::now());
                }
                self.socket.enqueue(transmit);
            }
            if !progressed {
                break;
            }
        }
        self.socket.flush();
    }
}

impl ServerRuntime {
    /// Carry out the forward log's batches (one pair of fences each) and report them; whether
    /// there was any.
    fn persist_forwards(&mut self) -> bool {
        let mut persisted = false;
        while let Some(batch) = self.server.poll_persist() {
            let Some(file) = self.forward_log_file() else {
                // No file to make it durable in: the batch is never reported, so nothing
                // of it is applied or acknowledged; the server stops.
                return persisted;
            };
            file.log.persist_batch(&batch.work);
            self.server.on_persisted(self.clock.now(), batch.number);
            persisted = true;
        }
        persisted
    }

    /// The forward log, made now if this server has none yet (a primary first sent it a
    /// request); `None` if it cannot be made (said, and the server stops).
    fn forward_log_file(&mut self) -> Option<&mut forward::ForwardLogFile> {
        if self.forward_log.is_none() {
            let store = self.options.store.as_ref()?;
            match forward::open_forward_log(store) {
                Ok((log, _, path, created)) => {
                    let file = forward::ForwardLogFile {
                        path,
                        log,
                        recovery: Default::default(),
                        created,
                    };
                    forward::report_forward_log(&file);
                    self.forward_log = Some(file);
                }
                Err(error) => {
                    tracing::error!(
                        "cannot make the forward log for the requests of a primary: {error}; \
                         stopping (nothing of them is applied or acknowledged)"
                    );
                    self.shutdown.request();
                    return None;
                }
            }
        }
        self.forward_log.as_mut()
    }
}

/// The server's application as the executor stages on it: from the store slots a request was
/// received into, when the packet store's receive path holds them, else from its bytes.
struct RuntimeStager<'a> {
    app: &'a mut ServerApp,
    received_slots: &'a mut ReceivedSlots,
    scratch: &'a mut Vec<u32>,
}

impl Stager for RuntimeStager<'_> {
    fn stage(
        &mut self,
        session_id: u64,
        seq: u32,
        _kind: RequestKind,
        request: &[u8],
    ) -> Option<Vec<u8>> {
        if let ServerApp::Engine(store) = &mut *self.app {
            if store.must_keep_every_session_for(session_id) {
                // Handed back (its received slots stay held): retried once a session may go.
                return None;
            }
        }
        let slots = self
            .received_slots
            .remove(&(session_id, seq))
            .map(|held| held.fragments);
        let staged = match (&mut *self.app, slots) {
            (ServerApp::Engine(store), Some(slots)) => {
                stage_received(store, session_id, seq, request, slots, self.scratch)
            }
            (app, _) => app.as_application().stage(session_id, seq, request),
        };
        // NoSpace: the executor hands the request back to the server (Server::on_deferred).
        staged.ok()
    }

    fn note_time(&mut self, now_ms: u64) {
        self.app.as_application().note_time(now_ms);
    }

    fn eviction_candidate(&mut self, for_session: u64) -> Option<(u64, u64)> {
        self.app.as_application().eviction_candidate(for_session)
    }

    fn permit_eviction(&mut self, session_id: u64) {
        self.app.as_application().permit_eviction(session_id);
    }

    fn commit(&mut self) {
        self.app.as_application().commit();
    }

    fn read(&mut self, request: &[u8]) -> Vec<u8> {
        self.app.as_application().read(request)
    }

    fn error_reply(&self, message: &str) -> Vec<u8> {
        // Every engine speaks the key-value application's replies.
        pmnet_store::Reply::Error(message.to_owned()).to_bytes()
    }

    fn max_staged(&self) -> usize {
        self.app.max_staged()
    }
}

impl Node for ServerRuntime {
    fn turn(&mut self, ready: Ready<'_>) -> Turn {
        let receive = self.receive_for(&ready);
        ServerRuntime::turn(self, receive)
    }

    fn wait_fds(&self, fds: &mut Vec<PollFd>) {
        // Out of tokens: what waits in the socket stays there; the timer wakes the loop.
        let read = self.capacity_wake().is_none();
        // With AF_XDP its socket first (see `receive_for`).
        if let Some(xdp) = &self.xdp {
            fds.push(PollFd::new(xdp.receiver.socket().raw_fd(), read, false));
        }
        fds.push(PollFd::new(
            self.socket.raw_fd(),
            read,
            self.socket.is_write_blocked(),
        ));
    }

    fn next_timer(&self) -> Option<Duration> {
        let deadline = match (self.server.poll_timeout(), self.capacity_wake()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        deadline.map(|deadline| self.clock.until(deadline))
    }

    fn queued_len(&self) -> usize {
        self.socket.queued_len()
    }

    fn flush(&mut self) {
        self.socket.flush();
    }

    fn metrics(&self) -> Metrics {
        ServerRuntime::metrics(self)
    }

    fn status(&self) -> Option<serde_json::Value> {
        Some(ServerRuntime::status(self))
    }

    fn report_line(&self) -> String {
        ServerRuntime::report_line(self)
    }

    fn kind(&self) -> &'static str {
        "server"
    }

    fn loop_counters(&mut self) -> &mut LoopCounters {
        &mut self.counters.event_loop
    }
}

#[cfg(test)]
mod tests;

//! The chain store's controller on the one event loop: its socket, its clock, its state (in a
//! file, or in etcd while this controller leads: saved before any member or client sees an
//! epoch) and its metrics endpoint around `pmnet_netchain::Controller` (docs/netchain.md,
//! "The controller").

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use pmnet_netchain::{encode_state, Controller};
use pmnet_proto::route::Planner;
use pmnet_wire::netchain::control::Layout;

use crate::control_plane::Leadership;
use crate::event_loop::{run_loop, LoopCounters, LoopSettings, Node, Ready, Turn};
use crate::metrics::{Metrics, MetricsBoard};
use crate::udp::{BatchSocket, BATCH_LEN};
use crate::wait::{Clock, PollFd};
use crate::{socket_digest, socket_metrics, start_metrics, LoopOptions, RuntimeError, Shutdown};

/// Where a controller's state is kept.
#[derive(Debug)]
pub enum StateStore {
    /// A file: written to a new file, fsynced, renamed over the old one, the directory
    /// fsynced.
    File(PathBuf),
    /// etcd, while this controller leads (`crate::control_plane`).
    Etcd(Box<Leadership>),
}

impl StateStore {
    fn save(&mut self, layout: &Layout) -> Result<(), String> {
        match self {
            StateStore::File(path) => save(path, &encode_state(layout))
                .map_err(|error| format!("chain controller state {}: {error}", path.display())),
            StateStore::Etcd(leadership) => leadership.save(&encode_state(layout)),
        }
    }

    /// Save the plan of the device chains (beside the chain store's state: `PATH.devices`,
    /// or etcd's `devices/state` key).
    fn save_devices(&mut self, plan: &[u8]) -> Result<(), String> {
        match self {
            StateStore::File(path) => {
                let path = devices_state_path(path);
                save(&path, plan)
                    .map_err(|error| format!("device chains' plan {}: {error}", path.display()))
            }
            StateStore::Etcd(leadership) => leadership.save_devices(plan),
        }
    }

    /// In words, for `pmnet status`.
    fn describe(&self) -> String {
        match self {
            StateStore::File(path) => format!(
                "state file {} (written, fsynced, renamed, directory fsynced before any epoch is sent)",
                path.display()
            ),
            StateStore::Etcd(leadership) => format!(
                "etcd {} (key {}, saved in a transaction fenced by this controller's leadership                  before any epoch is sent; leadership lease {} s)",
                leadership
                    .plane()
                    .endpoints
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(","),
                String::from_utf8_lossy(&leadership.plane().state_key()),
                leadership.ttl_s()
            ),
        }
    }
}

/// How a controller's run ended.
#[derive(Debug)]
pub enum RunEnd {
    /// Asked to stop (a signal).
    Stopped,
    /// It no longer leads (etcd): it must stand by and campaign again.
    LostLeadership(String),
}

/// A running controller. See the module docs.
#[derive(Debug)]
pub struct ControllerRuntime {
    /// The chain store's controller (`None`: device chains only).
    controller: Option<Controller>,
    /// The device chains' planner (`None`: the chain store only).
    planner: Option<Planner>,
    socket: BatchSocket,
    clock: Clock,
    /// Where the layout is saved.
    store: StateStore,
    /// Why saving failed, if it did: the loop stops and [`ControllerRuntime::run`] says so.
    failed: Option<String>,
    /// Why this controller stopped leading, if it did.
    lost: Option<String>,
    /// The process's signals: a stop asked of the process ends this run's loop.
    signals: Shutdown,
    /// When the controller's timers are next due.
    next_timeout: pmnet_proto::Time,
    /// The epoch last described (one line per epoch).
    described: u64,
    loop_options: LoopOptions,
    board: MetricsBoard,
    metrics: Option<SocketAddr>,
    shutdown: Shutdown,
    event_loop: LoopCounters,
}

impl ControllerRuntime {
    /// Bind `listen` and serve `controller` (restored or new, made at `clock.now()`), saving
    /// its layout to `store`; the run ends when `signals` asks the process to stop.
    pub fn open(
        clock: Clock,
        controller: Option<Controller>,
        planner: Option<Planner>,
        listen: SocketAddr,
        store: StateStore,
        loop_options: LoopOptions,
        signals: Shutdown,
    ) -> Result<ControllerRuntime, RuntimeError> {
        // The loop and the metrics endpoint stop with this run (a controller that loses the
        // leadership ends its run and stands by), or with the process.
        let shutdown = Shutdown::new();
        let socket = BatchSocket::bind(listen, loop_options.max_queued).map_err(|source| {
            RuntimeError::Bind {
                what: "chain controller",
                addr: listen,
                source,
            }
        })?;
        let board = MetricsBoard::new();
        let metrics = start_metrics(&loop_options, &board, &shutdown)?;
        Ok(ControllerRuntime {
            described: controller.as_ref().map_or(0, |c| c.layout().epoch),
            controller,
            planner,
            socket,
            next_timeout: clock.now(),
            clock,
            store,
            failed: None,
            lost: None,
            signals,
            loop_options,
            board,
            metrics,
            shutdown,
            event_loop: LoopCounters::default(),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.socket.local_addr()
    }

    /// Where the metrics are served, if anywhere.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics
    }

    pub fn controller(&self) -> Option<&Controller> {
        self.controller.as_ref()
    }

    pub fn planner(&self) -> Option<&Planner> {
        self.planner.as_ref()
    }

    /// Run until the process is asked to stop, saving the state fails, or (etcd) this
    /// controller no longer leads.
    pub fn run(&mut self) -> Result<RunEnd, RuntimeError> {
        let settings = LoopSettings::from(&self.loop_options);
        let board = self.metrics.map(|_| self.board.clone());
        let shutdown = self.shutdown.clone();
        let result = run_loop(self, settings, board.as_ref(), &shutdown);
        // The metrics endpoint stops with the run.
        self.shutdown.request();
        result?;
        if let Some(why) = self.lost.take() {
            return Ok(RunEnd::LostLeadership(why));
        }
        match self.failed.take() {
            Some(why) => Err(RuntimeError::Config(why)),
            None => Ok(RunEnd::Stopped),
        }
    }

    /// Take the store back (an etcd leadership to resign) once the run ended.
    pub fn into_store(self) -> StateStore {
        self.store
    }

    /// Whether this controller may still act (its leadership holds); ends the run if not.
    fn leads(&mut self) -> bool {
        if self.lost.is_some() {
            return false;
        }
        if let StateStore::Etcd(leadership) = &self.store {
            if let Err(why) = leadership.check(self.clock.now()) {
                self.lost = Some(why);
                self.shutdown.request();
                return false;
            }
        }
        true
    }

    /// Save what the controller asks to, then send what it queued: no member or client sees
    /// an epoch before it is saved.
    fn save_and_send(&mut self) {
        if !self.leads() {
            return;
        }
        let mut saved = Ok(());
        if let Some(layout) = self.controller.as_mut().and_then(Controller::poll_save) {
            saved = self.store.save(&layout);
        }
        if saved.is_ok() {
            if let Some(plan) = self.planner.as_mut().and_then(Planner::poll_save) {
                saved = self.store.save_devices(&plan);
            }
        }
        if let Err(why) = saved {
            match self.store {
                StateStore::Etcd(_) => self.lost = Some(why),
                StateStore::File(_) => self.failed = Some(why),
            }
            self.shutdown.request();
            return;
        }
        if let Some(controller) = self.controller.as_mut() {
            while let Some(transmit) = controller.poll_transmit() {
                self.socket.enqueue(transmit);
            }
        }
        if let Some(planner) = self.planner.as_mut() {
            while let Some(transmit) = planner.poll_transmit() {
                self.socket.enqueue(transmit);
            }
            while let Some(event) = planner.poll_event() {
                println!("{event}");
            }
        }
        self.socket.flush();
        // What changed, in words (`member … suspected / removed / copying / joined`), then
        // the configuration it made.
        if let Some(controller) = self.controller.as_mut() {
            while let Some(event) = controller.poll_event() {
                println!("{event}");
            }
            if controller.layout().epoch != self.described {
                self.described = controller.layout().epoch;
                describe(controller.layout());
            }
        }
        let _ = std::io::Write::flush(&mut std::io::stdout());
    }
}

impl ControllerRuntime {
    fn chain_store_status(&self, controller: &Controller) -> serde_json::Value {
        let layout = controller.layout();
        let now = self.clock.now();
        let members: Vec<serde_json::Value> = controller
            .member_states(now)
            .into_iter()
            .map(|member| {
                serde_json::json!({
                    "addr": member.addr.to_string(),
                    "chains": member.chains,
                    "heads": member.heads,
                    "suspected": member.suspected,
                    "last_heard_seconds_ago": member.heard_ago.map(|ago| ago.as_secs_f64()),
                    "epoch": member.epoch,
                })
            })
            .collect();
        let name = |index: u8| {
            layout
                .members
                .get(usize::from(index))
                .map_or_else(|| format!("#{index}"), ToString::to_string)
        };
        let groups: Vec<serde_json::Value> = layout
            .groups
            .iter()
            .enumerate()
            .map(|(group, settings)| {
                serde_json::json!({
                    "group": group,
                    "chain": settings.chain.iter().map(|index| name(*index)).collect::<Vec<_>>(),
                    "paused": settings.paused,
                    "joining": settings.joining.map(|joining| serde_json::json!({
                        "member": name(joining.member),
                        "source": name(joining.source),
                        "phase": format!("{:?}", joining.phase).to_lowercase(),
                    })),
                })
            })
            .collect();
        let counters = controller.counters();
        serde_json::json!({
            "pmnet_status": 1,
            "role": "chain-controller",
            "listen": self.socket.local_addr().to_string(),
            "medium": self.store.describe(),
            "epoch": layout.epoch,
            "lease_ms": layout.lease_ms,
            "members": members,
            "groups": groups,
            "counters": {
                "statuses": counters.statuses,
                "grants": counters.grants,
                "configurations_sent": counters.configs_sent,
                "members_suspected": counters.suspected,
                "members_removed": counters.removed,
                "recoveries_started": counters.recoveries_started,
                "recoveries_done": counters.recoveries_done,
                "recoveries_aborted": counters.recoveries_aborted,
                "dropped": controller.drops().values().sum::<u64>(),
            },
        })
    }
}

impl Node for ControllerRuntime {
    fn turn(&mut self, ready: Ready<'_>) -> Turn {
        let mut turn = Turn::default();
        if self.signals.is_requested() {
            self.shutdown.request();
        }
        // (Whether it still leads is checked where it matters: before it saves or sends.)
        if self.failed.is_some() || self.lost.is_some() {
            return turn;
        }
        if ready.is_readable(0) {
            let count = self.socket.receive_batch();
            turn.busy = count > 0;
            turn.more = count == BATCH_LEN;
            let now = self.clock.now();
            for index in 0..count {
                if let Some((from, datagram)) = self.socket.received(index) {
                    let status = datagram.get(pmnet_wire::field::TYPE)
                        == Some(&pmnet_wire::route::NODE_STATUS);
                    match (status, self.planner.as_mut(), self.controller.as_mut()) {
                        (true, Some(planner), _) | (false, Some(planner), None) => {
                            planner.handle(now, from, datagram)
                        }
                        (_, _, Some(controller)) => controller.handle(now, from, datagram),
                        (_, None, None) => {}
                    }
                }
            }
        }
        let now = self.clock.now();
        if self.next_timeout <= now {
            let mut next = now + Duration::from_secs(1);
            if let Some(controller) = self.controller.as_mut() {
                controller.handle_timeout(now);
                next = next.min(controller.poll_timeout(now));
            }
            if let Some(planner) = self.planner.as_mut() {
                planner.handle_timeout(now);
                next = next.min(planner.poll_timeout(now));
            }
            self.next_timeout = next;
        }
        self.save_and_send();
        turn
    }

    fn wait_fds(&self, fds: &mut Vec<PollFd>) {
        fds.push(PollFd::new(
            self.socket.raw_fd(),
            true,
            self.socket.is_write_blocked(),
        ));
    }

    fn next_timer(&self) -> Option<Duration> {
        Some(self.clock.until(self.next_timeout))
    }

    fn queued_len(&self) -> usize {
        self.socket.queued_len()
    }

    fn flush(&mut self) {
        self.socket.flush();
    }

    /// The plan (`pmnet status`): each group's chain, head first, with a joining member and
    /// its phase; each member as the controller sees it; the counters.
    fn status(&self) -> Option<serde_json::Value> {
        let mut status = match self.controller.as_ref() {
            Some(controller) => self.chain_store_status(controller),
            None => serde_json::json!({
                "pmnet_status": 1,
                "role": "controller",
                "listen": self.socket.local_addr().to_string(),
                "medium": self.store.describe(),
            }),
        };
        if let Some(planner) = self.planner.as_ref() {
            status["device_chains"] =
                crate::route_status::planner_status(planner, self.clock.now());
        }
        Some(status)
    }

    fn metrics(&self) -> Metrics {
        let mut out = Metrics::new();
        out.gauge(CONTROLLER_LEADING, CONTROLLER_LEADING_HELP, &[], 1.0);
        if let Some(controller) = self.controller.as_ref() {
            chain_store_metrics(&mut out, controller);
        }
        if let Some(planner) = self.planner.as_ref() {
            crate::route_status::planner_metrics(&mut out, planner);
        }
        // (The loop adds the process's metrics to every node's: not here too.)
        socket_metrics(&mut out, "controller", self.socket.counters());
        out
    }

    fn report_line(&self) -> String {
        let mut parts = Vec::new();
        if let Some(controller) = self.controller.as_ref() {
            parts.push(chain_store_report(controller));
        }
        if let Some(planner) = self.planner.as_ref() {
            parts.push(crate::route_status::planner_report(planner));
        }
        parts.push(socket_digest(self.socket.counters()));
        parts.join("; ")
    }

    fn kind(&self) -> &'static str {
        "chain-controller"
    }

    fn loop_counters(&mut self) -> &mut LoopCounters {
        &mut self.event_loop
    }
}

/// Whether a controller leads (1) or stands by (0): a standby's endpoint publishes 0
/// (`pmnet controller`), a running controller's loop 1.
pub const CONTROLLER_LEADING: &str = "pmnet_controller_leading";
pub const CONTROLLER_LEADING_HELP: &str =
    "1 while this controller leads (runs the plan), 0 while it stands by.";

/// The chain store's controller's metrics.
fn chain_store_metrics(out: &mut Metrics, controller: &Controller) {
    let counters = controller.counters();
    for (name, help, value) in [
        (
            "pmnet_chain_controller_statuses_total",
            "Members' statuses received.",
            counters.statuses,
        ),
        (
            "pmnet_chain_controller_grants_total",
            "Leases granted (renewed) to members.",
            counters.grants,
        ),
        (
            "pmnet_chain_controller_configs_sent_total",
            "Configurations sent to members.",
            counters.configs_sent,
        ),
        (
            "pmnet_chain_controller_fetches_answered_total",
            "Clients' requests for the configuration answered.",
            counters.fetches_answered,
        ),
        (
            "pmnet_chain_controller_fetches_refused_total",
            "Clients' requests for the configuration refused.",
            counters.fetches_refused,
        ),
        (
            "pmnet_chain_controller_suspected_total",
            "Members suspected (no status for --suspect-after-ms).",
            counters.suspected,
        ),
        (
            "pmnet_chain_controller_removed_total",
            "Members taken out of their chains.",
            counters.removed,
        ),
        (
            "pmnet_chain_controller_recoveries_started_total",
            "Members brought into a chain (copies started).",
            counters.recoveries_started,
        ),
        (
            "pmnet_chain_controller_recoveries_done_total",
            "Copies to a joining member finished.",
            counters.recoveries_done,
        ),
        (
            "pmnet_chain_controller_recoveries_aborted_total",
            "Copies to a joining member abandoned.",
            counters.recoveries_aborted,
        ),
    ] {
        out.counter(name, help, &[], value);
    }
    out.gauge(
        "pmnet_chain_controller_epoch",
        "The configuration's epoch.",
        &[],
        controller.layout().epoch as f64,
    );
    out.gauge(
        "pmnet_chain_controller_members",
        "Members known (in chains and spares).",
        &[],
        controller.layout().members.len() as f64,
    );
    for (reason, value) in controller.drops() {
        out.counter(
            "pmnet_chain_controller_dropped_total",
            "Datagrams the controller dropped, by reason.",
            &[("reason", reason)],
            *value,
        );
    }
}

/// The chain store's controller's part of the report line.
fn chain_store_report(controller: &Controller) -> String {
    let counters = controller.counters();
    let dropped: u64 = controller.drops().values().sum();
    let reasons: Vec<String> = controller
        .drops()
        .iter()
        .map(|(reason, count)| format!("{reason} {count}"))
        .collect();
    let dropped = if reasons.is_empty() {
        dropped.to_string()
    } else {
        format!("{dropped} ({})", reasons.join(", "))
    };
    format!(
        "chain-controller: epoch {}; {} statuses, {} grants, {} configurations sent, {} \
             members suspected, {} taken out, {} recoveries done ({} aborted), {} dropped",
        controller.layout().epoch,
        counters.statuses,
        counters.grants,
        counters.configs_sent,
        counters.suspected,
        counters.removed,
        counters.recoveries_done,
        counters.recoveries_aborted,
        dropped,
    )
}

/// One line per epoch: each group's chain (head first), paused and joining groups marked.
pub fn describe(layout: &Layout) {
    let groups: Vec<String> = layout
        .groups
        .iter()
        .enumerate()
        .map(|(index, group)| {
            let chain: Vec<String> = group
                .chain
                .iter()
                .map(|member| layout.members[usize::from(*member)].to_string())
                .collect();
            let mut text = format!("g{index} [{}]", chain.join(" > "));
            if group.paused {
                text.push_str(" paused");
            }
            if let Some(joining) = group.joining {
                text.push_str(&format!(
                    " +{} ({:?} from {})",
                    layout.members[usize::from(joining.member)],
                    joining.phase,
                    layout.members[usize::from(joining.source)]
                ));
            }
            text
        })
        .collect();
    println!("epoch {}: {}", layout.epoch, groups.join("; "));
    let _ = std::io::Write::flush(&mut std::io::stdout());
}

/// Save `layout` so that a crash leaves the old state or the new one, whole: written to a new
/// file, fsynced, renamed over the old one, the directory fsynced.
fn save(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut temporary = path.as_os_str().to_owned();
    temporary.push(".new");
    let temporary = PathBuf::from(temporary);
    {
        let mut file = std::fs::File::create(&temporary)?;
        file.write_all(bytes)?;
        file.sync_all()?;
    }
    std::fs::rename(&temporary, path)?;
    let directory = path
        .parent()
        .filter(|parent| !parent.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::File::open(directory)?.sync_all()
}

/// Where a controller with a state file keeps the device chains' plan: beside it.
pub fn devices_state_path(state: &Path) -> PathBuf {
    let mut path = state.as_os_str().to_owned();
    path.push(".devices");
    PathBuf::from(path)
}

//! The chain store's controller on the one event loop: its socket, its clock, its state file
//! (saved before any member or client sees an epoch) and its metrics endpoint around
//! `pmnet_netchain::Controller` (docs/netchain.md, "The controller").

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use pmnet_netchain::{encode_state, Controller};
use pmnet_wire::netchain::control::Layout;

use crate::event_loop::{run_loop, LoopCounters, LoopSettings, Node, Ready, Turn};
use crate::metrics::{Metrics, MetricsBoard};
use crate::udp::{BatchSocket, BATCH_LEN};
use crate::wait::{Clock, PollFd};
use crate::{socket_digest, socket_metrics, start_metrics, LoopOptions, RuntimeError, Shutdown};

/// A running controller. See the module docs.
#[derive(Debug)]
pub struct ControllerRuntime {
    controller: Controller,
    socket: BatchSocket,
    clock: Clock,
    /// Where the layout is saved.
    state: PathBuf,
    /// Why saving failed, if it did: the loop stops and [`ControllerRuntime::run`] says so.
    failed: Option<String>,
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
    /// its layout to `state`.
    pub fn open(
        clock: Clock,
        controller: Controller,
        listen: SocketAddr,
        state: PathBuf,
        loop_options: LoopOptions,
        shutdown: Shutdown,
    ) -> Result<ControllerRuntime, RuntimeError> {
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
            described: controller.layout().epoch,
            controller,
            socket,
            next_timeout: clock.now(),
            clock,
            state,
            failed: None,
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

    pub fn controller(&self) -> &Controller {
        &self.controller
    }

    /// Run until the shutdown flag is set (or saving the state fails).
    pub fn run(&mut self) -> Result<(), RuntimeError> {
        let settings = LoopSettings::from(&self.loop_options);
        let board = self.metrics.map(|_| self.board.clone());
        let shutdown = self.shutdown.clone();
        run_loop(self, settings, board.as_ref(), &shutdown)?;
        match self.failed.take() {
            Some(why) => Err(RuntimeError::Config(why)),
            None => Ok(()),
        }
    }

    /// Save what the controller asks to, then send what it queued: no member or client sees
    /// an epoch before it is saved.
    fn save_and_send(&mut self) {
        if let Some(layout) = self.controller.poll_save() {
            if let Err(error) = save(&self.state, &layout) {
                self.failed = Some(format!(
                    "chain controller state {}: {error}",
                    self.state.display()
                ));
                self.shutdown.request();
                return;
            }
        }
        while let Some(transmit) = self.controller.poll_transmit() {
            self.socket.enqueue(transmit);
        }
        self.socket.flush();
        // What changed, in words (`member … suspected / removed / copying / joined`), then
        // the configuration it made.
        while let Some(event) = self.controller.poll_event() {
            println!("{event}");
        }
        if self.controller.layout().epoch != self.described {
            self.described = self.controller.layout().epoch;
            describe(self.controller.layout());
        }
    }
}

impl Node for ControllerRuntime {
    fn turn(&mut self, ready: Ready<'_>) -> Turn {
        let mut turn = Turn::default();
        if self.failed.is_some() {
            return turn;
        }
        if ready.is_readable(0) {
            let count = self.socket.receive_batch();
            turn.busy = count > 0;
            turn.more = count == BATCH_LEN;
            let now = self.clock.now();
            for index in 0..count {
                if let Some((from, datagram)) = self.socket.received(index) {
                    self.controller.handle(now, from, datagram);
                }
            }
        }
        let now = self.clock.now();
        if self.next_timeout <= now {
            self.controller.handle_timeout(now);
            self.next_timeout = self.controller.poll_timeout(now);
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
        let layout = self.controller.layout();
        let now = self.clock.now();
        let members: Vec<serde_json::Value> = self
            .controller
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
        let counters = self.controller.counters();
        Some(serde_json::json!({
            "pmnet_status": 1,
            "role": "chain-controller",
            "listen": self.socket.local_addr().to_string(),
            "medium": format!(
                "state file {} (written, fsynced, renamed, directory fsynced before any epoch is sent)",
                self.state.display()
            ),
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
                "dropped": self.controller.drops().values().sum::<u64>(),
            },
        }))
    }

    fn metrics(&self) -> Metrics {
        let mut out = Metrics::new();
        let counters = self.controller.counters();
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
            self.controller.layout().epoch as f64,
        );
        out.gauge(
            "pmnet_chain_controller_members",
            "Members known (in chains and spares).",
            &[],
            self.controller.layout().members.len() as f64,
        );
        for (reason, value) in self.controller.drops() {
            out.counter(
                "pmnet_chain_controller_dropped_total",
                "Datagrams the controller dropped, by reason.",
                &[("reason", reason)],
                *value,
            );
        }
        socket_metrics(&mut out, "controller", self.socket.counters());
        out.add_process_metrics();
        out
    }

    fn report_line(&self) -> String {
        let counters = self.controller.counters();
        let dropped: u64 = self.controller.drops().values().sum();
        let reasons: Vec<String> = self
            .controller
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
             members suspected, {} taken out, {} recoveries done ({} aborted), {} dropped; {}",
            self.controller.layout().epoch,
            counters.statuses,
            counters.grants,
            counters.configs_sent,
            counters.suspected,
            counters.removed,
            counters.recoveries_done,
            counters.recoveries_aborted,
            dropped,
            socket_digest(self.socket.counters())
        )
    }

    fn kind(&self) -> &'static str {
        "chain-controller"
    }

    fn loop_counters(&mut self) -> &mut LoopCounters {
        &mut self.event_loop
    }
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
fn save(path: &Path, layout: &Layout) -> std::io::Result<()> {
    use std::io::Write;
    let bytes = encode_state(layout);
    let mut temporary = path.as_os_str().to_owned();
    temporary.push(".new");
    let temporary = PathBuf::from(temporary);
    {
        let mut file = std::fs::File::create(&temporary)?;
        file.write_all(&bytes)?;
        file.sync_all()?;
    }
    std::fs::rename(&temporary, path)?;
    let directory = path
        .parent()
        .filter(|parent| !parent.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::File::open(directory)?.sync_all()
}

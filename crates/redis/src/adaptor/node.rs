//! The adaptor as a node of the runtime's event loop ([`run_loop`]): its turn (reconnect,
//! receive, fire timers, read Redis's replies, hand requests to Redis, send), its descriptors
//! and timers, and the shutdown grace for Redis's outstanding replies.

use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use pmnet_runtime::metrics::Metrics;
use pmnet_runtime::{
    run_loop, wait_once, LoopCounters, LoopSettings, Node, PollFd, Ready, RuntimeError, Turn,
};

use super::{Adaptor, AdaptorError};

/// How long a stopping adaptor waits for Redis's outstanding replies.
const STOP_GRACE: Duration = Duration::from_secs(2);

impl Adaptor {
    /// Run until the shutdown flag is set; then wait (briefly) for Redis's outstanding replies
    /// so their server-ACKs go out, and return.
    pub fn run(&mut self) -> Result<(), AdaptorError> {
        let _entered = self.span.clone().entered();
        let settings = LoopSettings {
            wait: self.options.wait,
            cpu: self.options.cpu,
            report_interval: self.options.report_interval,
            report_at_stop: true,
        };
        let board = self.metrics_addr.map(|_| self.board.clone());
        let shutdown = self.shutdown.clone();
        run_loop(self, settings, board.as_ref(), &shutdown).map_err(|error| match error {
            RuntimeError::Pin(why) => AdaptorError::Pin(why),
            other => AdaptorError::Config(other.to_string()),
        })
    }

    /// One turn: reconnect, receive, fire timers, read Redis's replies, hand new requests to
    /// Redis, send. Returns whether anything happened.
    pub fn poll_once(&mut self, accept_input: bool) -> bool {
        self.turn_on(Ready::All, accept_input)
    }

    /// One turn, receiving (from the devices when `accept_input`, and from Redis) only on the
    /// descriptors `ready` allows: entry 0 of [`Node::wait_fds`] is the UDP socket, entry
    /// `1 + i` connection `i` to Redis.
    fn turn_on(&mut self, ready: Ready<'_>, accept_input: bool) -> bool {
        let mut busy = false;
        let wall = Instant::now();
        for index in 0..self.conns.len() {
            let conn = &self.conns[index];
            if conn.stream.is_none() && conn.retry_at.is_some_and(|at| at <= wall) {
                busy |= self.try_connect(index);
            }
        }
        if accept_input && ready.is_readable(0) {
            let count = self.socket.receive_batch();
            if count > 0 {
                busy = true;
                let now = self.clock.now();
                let tracing_on = pmnet_runtime::trace::enabled();
                for index in 0..count {
                    if let Some((from, datagram)) = self.socket.received(index) {
                        // Only a datagram that verified says its sender is there.
                        if pmnet_runtime::trace::server_handle(
                            &mut self.server,
                            now,
                            from,
                            datagram,
                            tracing_on,
                        ) {
                            self.devices.heard(from);
                        }
                    }
                }
            }
        }
        let now = self.clock.now();
        if self
            .server
            .poll_timeout()
            .is_some_and(|deadline| deadline <= now)
        {
            busy = true;
            self.server.handle_timeout(now);
        }
        for index in 0..self.conns.len() {
            if ready.is_readable(1 + index) {
                busy |= self.read_replies(index);
            }
        }
        busy |= self.take_requests();
        for index in 0..self.conns.len() {
            busy |= self.write_out(index);
        }
        busy |= self.send_transmits();
        if self.socket.has_unreachable() {
            let reports = self.socket.take_unreachable();
            self.devices.unreachable(&reports);
        }
        self.devices.check(Instant::now());
        if self.redis_watch.is_down() {
            let waiting = self.waiting_for_redis();
            self.redis_watch
                .check(self.options.redis, Instant::now(), waiting);
            self.fail_fast_waiting_reads();
        }
        busy
    }

    pub(super) fn send_transmits(&mut self) -> bool {
        let mut any = false;
        let mut now = None;
        while let Some(transmit) = self.server.poll_transmit() {
            any = true;
            pmnet_runtime::trace::sent(transmit.destination, &transmit.bytes);
            self.devices
                .sent_datagram(transmit.destination, &transmit.bytes, &mut now);
            self.socket.enqueue(transmit);
        }
        if self.socket.queued_len() > 0 {
            self.socket.flush();
        }
        any
    }

    /// Stop taking requests from the devices; returns when the grace for Redis's outstanding
    /// replies ends.
    fn begin_stop(&mut self) -> Instant {
        *self.stop_by.get_or_insert_with(|| {
            tracing::info!(
                "stopping: waiting up to {STOP_GRACE:?} for {} requests at Redis",
                self.outstanding
            );
            Instant::now() + STOP_GRACE
        })
    }

    /// Turns that take no new requests, waiting in between, until Redis has answered what it
    /// was sent and the server-ACKs have left, or the grace has run out. The runtime's drain
    /// waits only for sockets to take what is queued; Redis's replies take an fsync to come.
    fn finish_outstanding(&mut self) {
        let deadline = self.begin_stop();
        let mut fds = Vec::new();
        let mut waited = false;
        while self.queued_len() > 0 {
            self.event_loop.iterations += 1;
            let ready = if waited {
                Ready::Polled(&fds)
            } else {
                Ready::All
            };
            waited = false;
            if self.turn_on(ready, false) {
                continue;
            }
            self.event_loop.idle_waits += 1;
            let left = deadline.saturating_duration_since(Instant::now());
            let timeout = self.next_timer().map_or(left, |timer| timer.min(left));
            fds.clear();
            self.wait_fds(&mut fds);
            match wait_once(self.options.wait, &mut fds, timeout) {
                Ok(()) => waited = true,
                Err(_) => std::thread::sleep(timeout.min(Duration::from_millis(1))),
            }
        }
    }
}

impl Node for Adaptor {
    fn turn(&mut self, ready: Ready<'_>) -> Turn {
        if self.stop_by.is_none() && self.shutdown.is_requested() {
            self.begin_stop();
        }
        let busy = self.turn_on(ready, self.stop_by.is_none());
        // A turn that did anything is followed by another before any wait: requests handed to
        // Redis make room for more, and replies let held requests of their session go, without
        // a descriptor becoming ready.
        Turn {
            busy,
            more: busy,
            again: false,
        }
    }

    fn wait_fds(&self, fds: &mut Vec<PollFd>) {
        fds.push(PollFd::new(
            self.socket.raw_fd(),
            true,
            self.socket.is_write_blocked(),
        ));
        for conn in &self.conns {
            fds.push(match &conn.stream {
                Some(stream) => PollFd::new(stream.as_raw_fd(), true, conn.unsent() > 0),
                // Not connected: an entry ppoll ignores, so that entry 1 + i stays connection i.
                None => PollFd::new(-1, false, false),
            });
        }
    }

    fn next_timer(&self) -> Option<Duration> {
        let wall = Instant::now();
        let server = self
            .server
            .poll_timeout()
            .map(|deadline| self.clock.until(deadline));
        let reconnect = self
            .conns
            .iter()
            .filter(|conn| conn.stream.is_none())
            .filter_map(|conn| conn.retry_at)
            .map(|at| at.saturating_duration_since(wall))
            .min();
        let redis_warning = self
            .redis_watch
            .deadline()
            .map(|at| at.saturating_duration_since(wall));
        server
            .into_iter()
            .chain(reconnect)
            .chain(redis_warning)
            .min()
    }

    /// Requests at Redis and datagrams queued; nothing once a stopping adaptor's grace is over.
    fn queued_len(&self) -> usize {
        if self
            .stop_by
            .is_some_and(|deadline| Instant::now() >= deadline)
        {
            return 0;
        }
        let at_redis: usize = self.conns.iter().map(|conn| conn.pending.len()).sum();
        at_redis + self.socket.queued_len()
    }

    /// Called by the shutdown drain: wait (at most the grace) for Redis's replies to what it
    /// was sent, and send their server-ACKs.
    fn flush(&mut self) {
        self.finish_outstanding();
    }

    fn metrics(&self) -> Metrics {
        Adaptor::metrics(self)
    }

    fn report_line(&self) -> String {
        Adaptor::report_line(self)
    }

    fn kind(&self) -> &'static str {
        "adaptor"
    }

    fn loop_counters(&mut self) -> &mut LoopCounters {
        &mut self.event_loop
    }
}

//! The adaptor's event loop: receive, fire timers, read Redis's replies, hand requests to
//! Redis, send; publish, report, wait; and the shutdown grace for Redis's outstanding replies.

use std::time::{Duration, Instant};

use pmnet_runtime::{pin_current_thread, WaitMode};

use crate::poll::{wait, yield_cpu, PollFd};

use super::{Adaptor, AdaptorError};

/// How often the metrics are rendered for the endpoint.
const PUBLISH_INTERVAL: Duration = Duration::from_millis(100);
/// Longest sleep without looking at the shutdown flag.
const MAX_SLEEP: Duration = Duration::from_millis(50);
/// How long a stopping adaptor waits for Redis's outstanding replies.
const STOP_GRACE: Duration = Duration::from_secs(2);

impl Adaptor {
    /// Run until the shutdown flag is set; then wait (briefly) for Redis's outstanding replies
    /// so their server-ACKs go out, and return.
    pub fn run(&mut self) -> Result<(), AdaptorError> {
        if let Some(cpu) = self.options.cpu {
            pin_current_thread(cpu).map_err(AdaptorError::Pin)?;
        }
        let report_interval = self.options.report_interval;
        let publish = self.metrics_addr.is_some();
        let mut next_publish = Instant::now() + PUBLISH_INTERVAL;
        let mut next_report = report_interval.map(|interval| Instant::now() + interval);
        let mut stop_by: Option<Instant> = None;
        loop {
            self.loop_iterations += 1;
            if stop_by.is_none() && self.shutdown.is_requested() {
                stop_by = Some(Instant::now() + STOP_GRACE);
                tracing::info!(
                    "stopping: waiting up to {STOP_GRACE:?} for {} requests at Redis",
                    self.outstanding
                );
            }
            let busy = self.poll_once(stop_by.is_none());
            let wall = Instant::now();
            if let Some(deadline) = stop_by {
                let at_redis: usize = self.conns.iter().map(|conn| conn.pending.len()).sum();
                if (at_redis == 0 && self.socket.queued_len() == 0) || wall >= deadline {
                    break;
                }
            }
            if publish && wall >= next_publish {
                self.board.publish(&self.metrics());
                next_publish = wall + PUBLISH_INTERVAL;
            }
            if let (Some(at), Some(interval)) = (next_report, report_interval) {
                if wall >= at {
                    tracing::info!("{}", self.report_line());
                    next_report = Some(wall + interval);
                }
            }
            if busy {
                continue;
            }
            self.idle_waits += 1;
            match self.options.wait {
                WaitMode::BusyPoll => yield_cpu(),
                WaitMode::Blocking => {
                    let mut timeout = MAX_SLEEP;
                    if let Some(deadline) = self.server.poll_timeout() {
                        timeout = timeout.min(self.clock.until(deadline));
                    }
                    for conn in &self.conns {
                        if conn.stream.is_none() {
                            if let Some(at) = conn.retry_at {
                                timeout = timeout.min(at.saturating_duration_since(wall));
                            }
                        }
                    }
                    if publish {
                        timeout = timeout.min(next_publish.saturating_duration_since(wall));
                    }
                    if let Some(at) = next_report {
                        timeout = timeout.min(at.saturating_duration_since(wall));
                    }
                    let mut fds = vec![PollFd::new(
                        self.socket.raw_fd(),
                        true,
                        self.socket.is_write_blocked(),
                    )];
                    for conn in &self.conns {
                        if let Some(stream) = &conn.stream {
                            fds.push(PollFd::new(
                                std::os::fd::AsRawFd::as_raw_fd(stream),
                                true,
                                conn.unsent() > 0,
                            ));
                        }
                    }
                    if wait(&mut fds, timeout).is_err() {
                        std::thread::sleep(timeout.min(Duration::from_millis(1)));
                    }
                }
            }
        }
        self.board.publish(&self.metrics());
        tracing::info!("adaptor stopped: {}", self.report_line());
        Ok(())
    }

    /// One turn: reconnect, receive, fire timers, read Redis's replies, hand new requests to
    /// Redis, send. Returns whether anything happened.
    pub fn poll_once(&mut self, accept_input: bool) -> bool {
        let mut busy = false;
        let wall = Instant::now();
        for index in 0..self.conns.len() {
            let conn = &self.conns[index];
            if conn.stream.is_none() && conn.retry_at.is_some_and(|at| at <= wall) {
                busy |= self.try_connect(index);
            }
        }
        if accept_input {
            let count = self.socket.receive_batch();
            if count > 0 {
                busy = true;
                let now = self.clock.now();
                for index in 0..count {
                    if let Some((from, datagram)) = self.socket.received(index) {
                        self.server.handle(now, from, datagram);
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
            busy |= self.read_replies(index);
        }
        busy |= self.take_requests();
        for index in 0..self.conns.len() {
            busy |= self.write_out(index);
        }
        busy |= self.send_transmits();
        busy
    }

    pub(super) fn send_transmits(&mut self) -> bool {
        let mut any = false;
        while let Some(transmit) = self.server.poll_transmit() {
            any = true;
            self.socket.enqueue(transmit);
        }
        if self.socket.queued_len() > 0 {
            self.socket.flush();
        }
        any
    }
}

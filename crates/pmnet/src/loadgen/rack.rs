//! The storage rack of `pmnet bench --servers S --server-max-ops-per-s N`: a device in front of
//! S servers of an emulated capacity, keys partitioned over them, what a read cache in the
//! device is measured against. This file has its options, the line printed every second, and
//! the share of requests each server got (`--servers` and the like are read in args.rs).

use std::fmt::Write as _;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::worker::Shared;

/// Servers in a rack at most.
pub const SERVERS_MAX: u16 = 32;

/// The rack a run measures.
#[derive(Debug, Clone)]
pub struct RackArgs {
    pub servers: u16,
    /// Every server's emulated capacity, requests per second.
    pub server_max_ops_per_s: Option<u64>,
}

impl RackArgs {
    /// The device's shortest resend timeout for this rack: above the longest queue a
    /// capacity-limited server can have (every request of every client waiting at it), so
    /// that the device resends only what was lost, not what waits; `None` (the default, 20
    /// ms) for servers without a capacity.
    pub fn resend_timeout(&self, clients: u32, window: u32) -> Option<Duration> {
        let ops = self.server_max_ops_per_s?.max(1);
        let queue = u64::from(clients) * u64::from(window.max(1));
        let drain = Duration::from_micros(queue.saturating_mul(1_000_000) / ops);
        Some((drain * 2).clamp(Duration::from_millis(20), Duration::from_secs(10)))
    }

    /// The servers and their capacity, in words: every report says the capacity is emulated.
    pub fn text(&self) -> String {
        let servers = match self.servers {
            1 => "1 server".to_owned(),
            count => format!("{count} servers"),
        };
        match self.server_max_ops_per_s {
            Some(ops) => format!(
                "{servers}, each with capacity: {}",
                pmnet_runtime::emulated_capacity_text(ops)
            ),
            None => format!("{servers}, no capacity limit"),
        }
    }

    /// The first retransmission timeout of the rack's sessions: twice the time a limited
    /// server needs for every request the clients keep in flight (they may all wait at one
    /// server), at least the protocol's 2 ms, at most a second.
    pub fn retransmit_timeout(&self, in_flight: u32) -> Duration {
        let floor = Duration::from_millis(2);
        let Some(ops) = self.server_max_ops_per_s else {
            return floor;
        };
        let queue = Duration::from_secs_f64(2.0 * f64::from(in_flight) / ops as f64);
        queue.clamp(floor, Duration::from_secs(1))
    }
}

/// One second of a rack run.
#[derive(Debug, Clone, Serialize)]
pub struct SecondSample {
    /// Seconds since the measured stretch began, at the end of this second.
    pub t_s: u32,
    /// Requests measured in this second.
    pub ops_per_s: f64,
    /// The least and the most any server got in this second (requests by their key's server).
    pub server_ops_per_s_min: f64,
    pub server_ops_per_s_max: f64,
    /// The server (index from 0) that got the most.
    pub busiest_server: u16,
    /// Popularity changes applied by the end of this second.
    pub popularity_changes: u64,
}

/// The line-per-second series of a run.
#[derive(Debug)]
pub struct Timeline {
    /// The id of the server of index 0 (lines name servers by id).
    first_id: u16,
    next: Instant,
    second: u32,
    last_measured: u64,
    last_per_server: Vec<u64>,
    pub samples: Vec<SecondSample>,
}

/// Seconds a run's series keeps at most (a longer run prints on, keeps the first ones).
const SAMPLES_MAX: usize = 3600;

impl Timeline {
    pub fn new(measure_from: Instant, servers: u16, first_id: u16) -> Timeline {
        Timeline {
            first_id,
            next: measure_from + Duration::from_secs(1),
            second: 0,
            last_measured: 0,
            last_per_server: vec![0; usize::from(servers.max(1))],
            samples: Vec::new(),
        }
    }

    /// When the next sample is due.
    pub fn next_at(&self) -> Instant {
        self.next
    }

    /// Take the second that ended (if it has) from the clients' counters; returns its line.
    pub fn sample(&mut self, shared: &Shared, now: Instant, changes: u64) -> Option<String> {
        if now < self.next {
            return None;
        }
        self.second += 1;
        self.next += Duration::from_secs(1);
        let measured = shared.measured.load(Ordering::Relaxed);
        let per_server: Vec<u64> = shared
            .per_server
            .iter()
            .map(|count| count.load(Ordering::Relaxed))
            .collect();
        let deltas: Vec<u64> = per_server
            .iter()
            .zip(&self.last_per_server)
            .map(|(now, before)| now.saturating_sub(*before))
            .collect();
        let (busiest, max) = deltas
            .iter()
            .enumerate()
            .max_by_key(|(_, count)| **count)
            .map_or((0, 0), |(index, count)| (index, *count));
        let sample = SecondSample {
            t_s: self.second,
            ops_per_s: measured.saturating_sub(self.last_measured) as f64,
            server_ops_per_s_min: deltas.iter().copied().min().unwrap_or(0) as f64,
            server_ops_per_s_max: max as f64,
            busiest_server: busiest as u16,
            popularity_changes: changes,
        };
        self.last_measured = measured;
        self.last_per_server = per_server;
        let line = second_line(&sample, self.first_id);
        if self.samples.len() < SAMPLES_MAX {
            self.samples.push(sample);
        }
        Some(line)
    }
}

fn second_line(sample: &SecondSample, first_id: u16) -> String {
    format!(
        "    {:>4} s {:>10} ops/s   per server: min {:>8} max {:>8} (server {}){}",
        sample.t_s,
        super::thousands(sample.ops_per_s),
        super::thousands(sample.server_ops_per_s_min),
        super::thousands(sample.server_ops_per_s_max),
        u32::from(first_id) + u32::from(sample.busiest_server),
        match sample.popularity_changes {
            0 => String::new(),
            count => format!("   popularity changes so far: {count}"),
        }
    )
}

/// Each server's share of the requests measured, and the busiest's (index, share).
pub fn shares(per_server: &[u64]) -> (Vec<f64>, Option<(u16, f64)>) {
    let total: u64 = per_server.iter().sum();
    if total == 0 {
        return (Vec::new(), None);
    }
    let shares: Vec<f64> = per_server
        .iter()
        .map(|count| (*count as f64 / total as f64 * 1e6).round() / 1e6)
        .collect();
    let busiest = shares
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map(|(index, share)| (index as u16, *share));
    (shares, busiest)
}

/// What a rack run's result says about the servers' load, and the ideal gain of a cache;
/// servers are named by id, counting from `first_id`.
pub fn load_text(servers: u16, first_id: u16, busiest: Option<(u16, f64)>) -> String {
    let mut out = String::new();
    let Some((index, share)) = busiest else {
        return out;
    };
    let balance = f64::from(servers) * share;
    let _ = write!(
        out,
        "busiest server: {} with {:.1} % of requests (an even spread gives each {:.1} %); \
         S × share = {balance:.2}: a read cache with hit ratio h can gain about {balance:.2} / \
         (1 − h) in throughput over this rack",
        u32::from(first_id) + u32::from(index),
        share * 100.0,
        100.0 / f64::from(servers)
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_name_the_busiest_server() {
        let (shares, busiest) = shares(&[10, 30, 60]);
        assert_eq!(shares, [0.1, 0.3, 0.6]);
        assert_eq!(busiest, Some((2, 0.6)));
        assert!(load_text(3, 1, busiest).contains("S × share = 1.80"));
        assert_eq!(super::shares(&[0, 0]).1, None);
    }

    #[test]
    fn the_retransmission_timeout_outlasts_a_limited_servers_queue() {
        let rack = RackArgs {
            servers: 32,
            server_max_ops_per_s: Some(2_000),
        };
        // 64 requests in flight at 2 000/s: 32 ms of queue, twice that.
        assert_eq!(rack.retransmit_timeout(64), Duration::from_millis(64));
        assert_eq!(rack.retransmit_timeout(1), Duration::from_millis(2));
        let slow = RackArgs {
            servers: 1,
            server_max_ops_per_s: Some(1),
        };
        assert_eq!(slow.retransmit_timeout(64), Duration::from_secs(1));
        assert!(slow.text().contains("(emulated"));
    }

    #[test]
    fn each_second_is_taken_once_from_the_counters() {
        let shared = Shared::new(2, 1);
        let start = Instant::now();
        let mut timeline = Timeline::new(start, 2, 1);
        assert!(timeline.sample(&shared, start, 0).is_none());
        shared.measured.store(30, Ordering::Relaxed);
        shared.per_server[0].store(10, Ordering::Relaxed);
        shared.per_server[1].store(20, Ordering::Relaxed);
        let line = timeline
            .sample(&shared, start + Duration::from_secs(1), 0)
            .unwrap();
        assert!(line.contains("30 ops/s"), "{line}");
        assert!(
            line.contains("(server 2)"),
            "server ids count from 1: {line}"
        );
        assert!(timeline
            .sample(&shared, start + Duration::from_millis(1500), 0)
            .is_none());
        shared.measured.store(40, Ordering::Relaxed);
        shared.per_server[0].store(20, Ordering::Relaxed);
        timeline.sample(&shared, start + Duration::from_secs(2), 1);
        let second = &timeline.samples[1];
        assert_eq!(
            (
                second.ops_per_s,
                second.server_ops_per_s_min,
                second.server_ops_per_s_max
            ),
            (10.0, 0.0, 10.0)
        );
        assert_eq!(second.busiest_server, 0);
    }
}

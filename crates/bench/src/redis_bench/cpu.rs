//! The CPU time each part of a system spends per operation, as `pmnet bench` reports it per
//! request: user + system time of all the part's threads (`/proc/PID/stat`, fields 14 and 15,
//! read by `crate::procs::cpu_seconds_of`), read when a round's measured interval starts and
//! when it ends, divided by the operations (and the update operations) measured in it. The
//! parts: the clients (this process), Redis (the baseline's redis-server, or PMNet's, with the
//! module's work in it when the module is the server side) and PMNet's processes, the gateway,
//! the device and the adaptor (`pmnet redis-up`'s children). Kernel work done for a process
//! (its sends, receives and the loopback delivery its sends trigger, its fsyncs) counts as its
//! own. The kernel counts in clock ticks (10 ms at 100 Hz): over a measured interval of
//! seconds, a part that runs all the time is counted to within a percent.

use std::time::Instant;

use serde::Serialize;

use crate::procs;

/// The parts, in the order they are reported.
pub const PARTS: [&str; 5] = ["clients", "gateway", "device", "adaptor", "redis-server"];

/// The part that is not the system measured: the benchmark's own clients.
pub const CLIENTS: &str = "clients";

/// A part whose CPU time is read: its name (one of [`PARTS`]) and its process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Part {
    pub name: &'static str,
    pub pid: u32,
}

/// Every part's CPU time (seconds) and the machine's busy time at one moment.
#[derive(Debug, Clone)]
pub struct Reading {
    parts: Vec<Option<f64>>,
    machine: Option<f64>,
    at: Instant,
}

pub fn read(parts: &[Part]) -> Reading {
    Reading {
        parts: parts
            .iter()
            .map(|part| procs::cpu_seconds_of(part.pid))
            .collect(),
        machine: procs::machine_busy_seconds(),
        at: Instant::now(),
    }
}

/// The CPU time each part spent between two readings, and what the rest of the machine kept
/// busy meanwhile.
#[derive(Debug, Clone)]
pub struct Spent {
    /// Seconds of CPU time per part (`None`: its process could not be read).
    pub parts: Vec<(&'static str, Option<f64>)>,
    /// CPUs the machine's other processes kept busy on average (0: the parts had the machine
    /// to themselves).
    pub others_cpus: Option<f64>,
}

pub fn spent(parts: &[Part], before: &Reading, after: &Reading) -> Spent {
    let seconds: Vec<(&'static str, Option<f64>)> = parts
        .iter()
        .zip(before.parts.iter().zip(&after.parts))
        .map(|(part, (before, after))| {
            (part.name, before.zip(*after).map(|(b, a)| (a - b).max(0.0)))
        })
        .collect();
    let elapsed = after.at.duration_since(before.at).as_secs_f64();
    let ours: f64 = seconds.iter().filter_map(|(_, s)| *s).sum();
    let others_cpus = before
        .machine
        .zip(after.machine)
        .filter(|_| elapsed > 0.0)
        .map(|(b, a)| round(((a - b - ours) / elapsed).max(0.0)));
    Spent {
        parts: seconds,
        others_cpus,
    }
}

fn round(value: f64) -> f64 {
    (value * 100.0).round() / 100.0
}

/// One part's CPU time over a measured interval.
#[derive(Debug, Clone, Serialize)]
pub struct PartCpu {
    pub part: &'static str,
    pub seconds: Option<f64>,
    /// µs of CPU time per operation measured.
    pub us_per_op: Option<f64>,
    /// µs of CPU time per update operation measured (all the part's time over the updates).
    pub us_per_update: Option<f64>,
}

/// A system's CPU time per operation, part by part.
#[derive(Debug, Clone, Serialize)]
pub struct SystemCpu {
    pub parts: Vec<PartCpu>,
    /// Every part but the clients: the system's own cost per operation.
    pub system_us_per_op: Option<f64>,
    pub system_us_per_update: Option<f64>,
    pub others_cpus: Option<f64>,
}

impl SystemCpu {
    pub fn new(spent: &Spent, ops: u64, update_ops: u64) -> SystemCpu {
        let per = |seconds: Option<f64>, count: u64| {
            seconds
                .filter(|_| count > 0)
                .map(|s| round(s * 1e6 / count as f64))
        };
        let mut parts: Vec<PartCpu> = spent
            .parts
            .iter()
            .map(|&(part, seconds)| PartCpu {
                part,
                seconds: seconds.map(|s| (s * 1000.0).round() / 1000.0),
                us_per_op: per(seconds, ops),
                us_per_update: per(seconds, update_ops),
            })
            .collect();
        parts.sort_by_key(|part| PARTS.iter().position(|name| *name == part.part));
        let system: Option<f64> = spent
            .parts
            .iter()
            .filter(|(part, _)| *part != CLIENTS)
            .map(|(_, seconds)| *seconds)
            .sum();
        SystemCpu {
            parts,
            system_us_per_op: per(system, ops),
            system_us_per_update: per(system, update_ops),
            others_cpus: spent.others_cpus,
        }
    }

    pub fn part(&self, name: &str) -> Option<&PartCpu> {
        self.parts.iter().find(|part| part.part == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_per_operation_is_each_part_s_time_over_the_operations() {
        let spent = Spent {
            parts: vec![
                ("redis-server", Some(0.5)),
                ("clients", Some(1.0)),
                ("device", Some(0.25)),
                ("gateway", None),
            ],
            others_cpus: Some(0.1),
        };
        let cpu = SystemCpu::new(&spent, 10_000, 2_500);
        let names: Vec<&str> = cpu.parts.iter().map(|part| part.part).collect();
        assert_eq!(names, ["clients", "gateway", "device", "redis-server"]);
        let redis = cpu.part("redis-server").unwrap();
        assert_eq!(
            (redis.us_per_op, redis.us_per_update),
            (Some(50.0), Some(200.0))
        );
        assert_eq!(cpu.part("gateway").unwrap().us_per_op, None);
        // A part that could not be read leaves the system's sum unknown.
        assert_eq!(cpu.system_us_per_op, None);
        let spent = Spent {
            parts: vec![("redis-server", Some(0.5)), ("clients", Some(1.0))],
            others_cpus: None,
        };
        let cpu = SystemCpu::new(&spent, 10_000, 0);
        assert_eq!(cpu.system_us_per_op, Some(50.0));
        assert_eq!(cpu.system_us_per_update, None);
    }

    #[test]
    fn a_reading_of_this_process_grows_and_others_are_not_negative() {
        let parts = [Part {
            name: CLIENTS,
            pid: std::process::id(),
        }];
        let before = read(&parts);
        // Spin until the kernel has counted a tick of ours (at most 10 s on a busy machine).
        let started = Instant::now();
        let mut spin = 0u64;
        let mut after = read(&parts);
        while after.parts[0] <= before.parts[0] && started.elapsed().as_secs() < 10 {
            for _ in 0..100_000 {
                spin = std::hint::black_box(spin.wrapping_add(1));
            }
            after = read(&parts);
        }
        let spent = spent(&parts, &before, &after);
        assert!(spent.parts[0].1.unwrap() > 0.0, "{spent:?}");
        assert!(spent.others_cpus.is_none_or(|cpus| cpus >= 0.0));
    }
}

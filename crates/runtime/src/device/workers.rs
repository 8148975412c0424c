//! A device run as several workers (`pmnet device --workers N`): N independent devices in one
//! process, each with its own loop thread, port, device id and log, sharing the sessions by
//! session id (the clients steer: `SessionOptions::steer`). Nothing is shared between workers,
//! so each keeps every promise a device keeps on its own; a server sees N devices.

use std::path::PathBuf;

use super::DeviceOptions;

/// Workers one device process runs at most.
pub const WORKERS_MAX: u16 = 64;

/// The log file of worker `index`: the configured path for worker 0, `PATH.INDEX` for the
/// others.
pub fn worker_log_path(path: &std::path::Path, index: u16) -> PathBuf {
    if index == 0 {
        return path.to_path_buf();
    }
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".{index}"));
    PathBuf::from(name)
}

impl DeviceOptions {
    /// The options of worker `index`: the port, the device id and (with a metrics endpoint)
    /// the metrics port each `index` above this device's, its own log file
    /// ([`worker_log_path`]), the CPU `index` after the given one (modulo `online_cpus`); the
    /// forward and echo ports only on worker 0.
    pub fn for_worker(&self, index: u16, online_cpus: usize) -> Result<DeviceOptions, String> {
        let mut options = self.clone();
        if index == 0 {
            return Ok(options);
        }
        let shifted = |port: u16, what: &str| {
            if port == 0 {
                return Ok(0);
            }
            port.checked_add(index)
                .ok_or_else(|| format!("{what} port {port} + worker {index} is past 65535"))
        };
        options
            .listen
            .set_port(shifted(self.listen.port(), "the listen")?);
        options.device_id = self.device_id.checked_add(index).ok_or_else(|| {
            format!(
                "device id {} + worker {index} is past 65535",
                self.device_id
            )
        })?;
        if let Some(log) = options.log.as_mut() {
            log.path = worker_log_path(&log.path, index);
        }
        if let Some(metrics) = options.loop_options.metrics_listen.as_mut() {
            metrics.set_port(shifted(metrics.port(), "the metrics")?);
        }
        if let Some(cpu) = options.loop_options.cpu.as_mut() {
            *cpu = (*cpu + usize::from(index)) % online_cpus.max(1);
        }
        options.forward_listen = None;
        options.echo_listen = None;
        Ok(options)
    }
}

/// Log files of workers `workers..WORKERS_MAX` that exist: a device that ran with more workers
/// before left them, and what they hold (acknowledged writes, perhaps) would not be replayed.
pub fn stale_worker_logs(path: &std::path::Path, workers: u16) -> Vec<PathBuf> {
    (workers.max(1)..WORKERS_MAX)
        .map(|index| worker_log_path(path, index))
        .filter(|path| path.exists())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DeviceOptions, LoopOptions};
    use std::net::SocketAddr;

    fn options() -> DeviceOptions {
        DeviceOptions {
            device_id: 7,
            listen: "127.0.0.1:7400".parse().unwrap(),
            servers: vec![(1, "127.0.0.1:7500".parse().unwrap())],
            previous_devices: Vec::new(),
            follow: None,
            log: Some(super::super::LogOptions {
                path: PathBuf::from("/dev/shm/d.log"),
                slot_count: 64,
                slot_size: 2048,
                format: false,
                mmap: pmnet_pm::MmapOptions::default(),
            }),
            forward_listen: Some("127.0.0.1:7401".parse().unwrap()),
            echo_listen: None,
            max_resends_in_flight: None,
            resend_timeout: None,
            keys: None,
            batch: true,
            batch_hold: std::time::Duration::ZERO,
            xdp: None,
            loop_options: LoopOptions {
                metrics_listen: Some("127.0.0.1:9400".parse().unwrap()),
                cpu: Some(1),
                ..LoopOptions::default()
            },
        }
    }

    #[test]
    fn each_worker_has_its_own_port_id_log_and_metrics_port() {
        let base = options();
        let zero = base.for_worker(0, 2).unwrap();
        assert_eq!(zero.listen, base.listen);
        assert_eq!(zero.forward_listen, base.forward_listen);
        let two = base.for_worker(2, 2).unwrap();
        assert_eq!(two.listen, "127.0.0.1:7402".parse::<SocketAddr>().unwrap());
        assert_eq!(two.device_id, 9);
        assert_eq!(two.log.unwrap().path, PathBuf::from("/dev/shm/d.log.2"));
        assert_eq!(
            two.loop_options.metrics_listen,
            Some("127.0.0.1:9402".parse().unwrap())
        );
        assert_eq!(two.loop_options.cpu, Some(1), "CPU 1 + 2 on 2 CPUs");
        assert_eq!(two.forward_listen, None);
        let mut high = options();
        high.listen.set_port(65535);
        assert!(high.for_worker(1, 2).unwrap_err().contains("65535"));
    }

    #[test]
    fn logs_of_workers_that_no_longer_run_are_found() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.log");
        std::fs::write(worker_log_path(&path, 3), b"x").unwrap();
        assert_eq!(stale_worker_logs(&path, 4), Vec::<PathBuf>::new());
        assert_eq!(stale_worker_logs(&path, 2), vec![worker_log_path(&path, 3)]);
    }
}

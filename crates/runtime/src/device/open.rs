//! Opening a device: the servers checked, the sockets bound (never at a server's address),
//! the log opened, formatted or recovered.

use std::net::SocketAddr;

use pmnet_pm::{MmapRegion, PmLog};

use super::{DeviceOptions, DeviceStartup, LogOptions, ECHO_MAX_QUEUED};
use crate::udp::BatchSocket;
use crate::RuntimeError;

/// Whether datagrams sent to `target` arrive at a socket bound to `own`.
fn reaches(target: SocketAddr, own: SocketAddr) -> bool {
    if target.port() != own.port() {
        return false;
    }
    let target_ip = target.ip().to_canonical();
    let own_ip = own.ip().to_canonical();
    let is_local = |ip: std::net::IpAddr| {
        // Binding succeeds only to an address of this host.
        ip.is_loopback()
            || ip.is_unspecified()
            || std::net::UdpSocket::bind(SocketAddr::new(ip, 0)).is_ok()
    };
    match own.ip() {
        // Bound to every IPv4 address of the host.
        std::net::IpAddr::V4(ip) if ip.is_unspecified() => {
            target_ip.is_ipv4() && is_local(target_ip)
        }
        // Bound to every address of the host, IPv4 included (unless the host is IPv6-only).
        std::net::IpAddr::V6(ip) if ip.is_unspecified() => is_local(target_ip),
        // Sending to the unspecified address reaches the host itself.
        _ => target_ip == own_ip || target_ip.is_unspecified(),
    }
}

fn bind(
    what: &'static str,
    addr: SocketAddr,
    max_queued: usize,
) -> Result<BatchSocket, RuntimeError> {
    BatchSocket::bind(addr, max_queued).map_err(|source| RuntimeError::Bind { what, addr, source })
}

/// What opening a log file (a device's, or a server's forward log) could not do, as the
/// runtime says it; `unusable` words a file that holds no usable log.
pub(crate) fn log_file_error(
    path: &std::path::Path,
    error: pmnet_pm::LogFileError,
    unusable: impl FnOnce(pmnet_pm::LogFileError) -> RuntimeError,
) -> RuntimeError {
    match error {
        pmnet_pm::LogFileError::File(source) => RuntimeError::LogFile {
            path: path.to_path_buf(),
            source,
        },
        pmnet_pm::LogFileError::Format { error, .. } => RuntimeError::Log {
            path: path.to_path_buf(),
            source: error,
        },
        problem @ pmnet_pm::LogFileError::Unusable { .. } => unusable(problem),
    }
}

/// Open the log at `options.path`: a new one when the file does not exist, erased when
/// `format` is set, otherwise recovered. An existing file that holds no usable log (empty,
/// short, blank or corrupt superblock) is an error: it may hold acknowledged entries.
fn open_log(
    options: &LogOptions,
) -> Result<(PmLog<MmapRegion>, pmnet_pm::LogRecovery, bool), RuntimeError> {
    let path = &options.path;
    let file_options = pmnet_pm::LogFileOptions {
        slot_count: options.slot_count,
        slot_size: options.slot_size,
        format: options.format,
        mmap: options.mmap,
    };
    let (log, recovery, opened) =
        pmnet_pm::open_log_file(path, &file_options).map_err(|error| {
            log_file_error(path, error, |problem| RuntimeError::LogUnusable { problem })
        })?;
    match opened {
        pmnet_pm::LogFileOpened::Created => tracing::info!(
            "device log {} did not exist: created it with {} slots of {} bytes",
            path.display(),
            log.slot_count(),
            log.slot_size()
        ),
        pmnet_pm::LogFileOpened::Erased => tracing::warn!(
            "--format: erased the device log {} (whatever it held is gone) and formatted {} \
             slots of {} bytes",
            path.display(),
            log.slot_count(),
            log.slot_size()
        ),
        pmnet_pm::LogFileOpened::Reopened => {}
    }
    log_damaged_slots(path, &recovery);
    let formatted = opened != pmnet_pm::LogFileOpened::Reopened;
    Ok((log, recovery, formatted))
}

/// Say at WARN what each damaged slot held (the first [`pmnet_pm::REJECTED_SLOTS_DESCRIBED`])
/// and how many entries were lost.
fn log_damaged_slots(path: &std::path::Path, recovery: &pmnet_pm::LogRecovery) {
    if recovery.rejected_slot_count == 0 {
        return;
    }
    for slot in &recovery.rejected_slots {
        tracing::warn!(
            "device log {}: damaged entry lost: {slot}; the slot was freed",
            path.display()
        );
    }
    let unlisted = recovery.rejected_slot_count as usize - recovery.rejected_slots.len();
    tracing::warn!(
        "device log {}: {} logged entries were damaged and are lost{} (torn writes or \
         corruption at rest; their slots were freed and nothing of them is replayed)",
        path.display(),
        recovery.rejected_slot_count,
        if unlisted > 0 {
            format!(" ({unlisted} not listed above)")
        } else {
            String::new()
        }
    );
}

/// The sockets a device serves on.
pub(super) struct Sockets {
    pub(super) data: BatchSocket,
    pub(super) forward: Option<BatchSocket>,
    pub(super) echo: Option<BatchSocket>,
}

/// Refuse a configuration a device cannot serve: no server, or an id given twice.
pub(super) fn check_servers(options: &DeviceOptions) -> Result<(), RuntimeError> {
    if options.servers.is_empty() {
        return Err(RuntimeError::Config(
            "a device needs at least one server: pass --server ID=ADDR (for example \
             --server 1=127.0.0.1:7500)"
                .into(),
        ));
    }
    for (index, (id, _)) in options.servers.iter().enumerate() {
        if options.servers[..index]
            .iter()
            .any(|(other, _)| other == id)
        {
            return Err(RuntimeError::Config(format!(
                "server id {id} is given twice; every server behind a device needs its own id"
            )));
        }
    }
    Ok(())
}

/// Bind the device's sockets, refusing a server at one of their addresses.
pub(super) fn bind_sockets(options: &DeviceOptions) -> Result<Sockets, RuntimeError> {
    let max_queued = options.loop_options.max_queued;
    let data = bind("device", options.listen, max_queued)?;
    let forward = match options.forward_listen {
        Some(addr) => Some(bind("forward", addr, max_queued)?),
        None => None,
    };
    let echo = match options.echo_listen {
        Some(addr) => Some(bind("echo", addr, ECHO_MAX_QUEUED)?),
        None => None,
    };
    let own_sockets = [
        ("listen", Some(&data)),
        ("forward", forward.as_ref()),
        ("echo", echo.as_ref()),
    ];
    for (what, own) in own_sockets
        .into_iter()
        .filter_map(|(what, socket)| Some((what, socket?.local_addr())))
    {
        for (id, server) in &options.servers {
            if reaches(*server, own) {
                return Err(RuntimeError::Config(format!(
                    "server {id} at {server} is this device's own {what} address ({own}): \
                     the device would forward to itself, acking updates that no server \
                     stores; give --server the address of the server behind the device"
                )));
            }
        }
    }
    Ok(Sockets {
        data,
        forward,
        echo,
    })
}

/// Open the log the options name (if any): the log, the entries it held, and what to say of
/// it at start-up.
pub(super) type OpenedLog = (
    Option<(PmLog<MmapRegion>, Vec<pmnet_pm::RecoveredEntry>)>,
    DeviceStartup,
);

pub(super) fn open_device_log(options: &DeviceOptions) -> Result<OpenedLog, RuntimeError> {
    let Some(log_options) = &options.log else {
        let startup = DeviceStartup {
            medium: None,
            log_path: None,
            slot_count: 0,
            slot_size: 0,
            formatted: false,
            recovered_entry_count: 0,
            rejected_slot_count: 0,
        };
        return Ok((None, startup));
    };
    let (log, recovery, formatted) = open_log(log_options)?;
    if !formatted
        && (log.slot_count() != log_options.slot_count || log.slot_size() != log_options.slot_size)
    {
        tracing::warn!(
            "device log {} has {} slots of {} bytes, not the {} of {} asked for; \
             using the log as it is (pass --format to erase it and use the new \
             geometry)",
            log_options.path.display(),
            log.slot_count(),
            log.slot_size(),
            log_options.slot_count,
            log_options.slot_size
        );
    }
    let startup = DeviceStartup {
        medium: Some(log.medium()),
        log_path: Some(log_options.path.clone()),
        slot_count: log.slot_count(),
        slot_size: log.slot_size(),
        formatted,
        recovered_entry_count: recovery.entries.len(),
        rejected_slot_count: recovery.rejected_slot_count,
    };
    Ok((Some((log, recovery.entries)), startup))
}

/// The state machine's settings for a device that logs in `log`.
pub(super) fn log_device_config(
    options: &DeviceOptions,
    log: &PmLog<MmapRegion>,
) -> pmnet_proto::DeviceConfig {
    let mut config = pmnet_proto::DeviceConfig::new(
        options.device_id,
        options.servers.clone(),
        log.slot_count(),
        log.max_packet_len(),
    );
    config.previous_devices = options.previous_devices.clone();
    config.follow = options.follow.clone();
    if let Some(window) = options.max_resends_in_flight {
        config.resends_in_flight_max = window;
    }
    if let Some(timeout) = options.resend_timeout {
        config.resend_timeout = timeout;
        config.resend_timeout_max = config.resend_timeout_max.max(timeout);
    }
    config
}

/// The device's pipeline: `fronts` in front of `device`, every datagram verified and sealed
/// with the keys, batches to the servers when asked for.
pub(super) fn make_pipeline(
    options: &DeviceOptions,
    fronts: Vec<Box<dyn pmnet_proto::FrontFunction>>,
    device: pmnet_proto::Device,
) -> pmnet_proto::DevicePipeline {
    let auth = options.keys.clone().map(pmnet_proto::Authenticator::new);
    // Without keys: say so, at most once a minute, while other hosts send to it.
    let mut pipeline = pmnet_proto::DevicePipeline::with_fronts(fronts, device)
        .with_auth(auth)
        .with_plain_traffic_warnings(options.keys.is_none());
    if options.batch {
        let servers: Vec<SocketAddr> = options.servers.iter().map(|(_, addr)| *addr).collect();
        pipeline = pipeline
            .with_batching(
                &servers,
                pmnet_wire::DEFAULT_MAX_DATAGRAM_LEN,
                options.device_id,
            )
            .with_batch_hold(options.batch_hold);
    }
    pipeline
}

/// A device that follows a controller: one server (its chain's), a log, no function in
/// front of it (a restart in place rebuilds the log's state machine alone).
pub(super) fn check_follow(options: &DeviceOptions, fronts: usize) -> Result<(), RuntimeError> {
    let why = if options.servers.len() != 1 {
        "one --server (the next device of its chain, or the chain's server)"
    } else if options.log.is_none() {
        "a log"
    } else if fronts > 0 {
        "no other function (no --cache, chain store or memory node)"
    } else if options.xdp.is_some() {
        "the UDP socket (no --xdp)"
    } else {
        return Ok(());
    };
    Err(RuntimeError::Config(format!(
        "--controller: a device that follows a controller takes {why}"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(text: &str) -> SocketAddr {
        text.parse().unwrap()
    }

    #[test]
    fn a_server_at_the_devices_own_address_is_recognised() {
        // The same address, written either way.
        assert!(reaches(addr("127.0.0.1:7400"), addr("127.0.0.1:7400")));
        assert!(reaches(
            addr("[::ffff:127.0.0.1]:7400"),
            addr("127.0.0.1:7400")
        ));
        assert!(reaches(addr("0.0.0.0:7400"), addr("127.0.0.1:7400")));
        // A device bound to every address is reached through any address of the host.
        assert!(reaches(addr("127.0.0.1:7400"), addr("0.0.0.0:7400")));
        assert!(reaches(addr("127.0.0.2:7400"), addr("0.0.0.0:7400")));
        assert!(reaches(addr("127.0.0.1:7400"), addr("[::]:7400")));
        // Another port, another loopback address than the one bound, an address of another
        // host (TEST-NET-3, never local), or IPv6 towards an IPv4-only socket: no loop.
        assert!(!reaches(addr("127.0.0.1:7500"), addr("127.0.0.1:7400")));
        assert!(!reaches(addr("127.0.0.2:7400"), addr("127.0.0.1:7400")));
        assert!(!reaches(addr("203.0.113.9:7400"), addr("0.0.0.0:7400")));
        assert!(!reaches(addr("[::1]:7400"), addr("0.0.0.0:7400")));
    }
}

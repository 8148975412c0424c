//! A damaged or emptied log or data file never starts empty: `pmnet device` and `pmnet server`
//! refuse it with an error that names the file and what is wrong, and start over only with
//! `--format`. Damaged entries inside a usable log are reported one by one. Real processes,
//! started as the README shows; the files are damaged between runs.

mod common;

use std::net::SocketAddr;
use std::path::Path;

use common::{
    args, device_args, free_udp_addr, poll_until, run_pmnet, server_args, Cluster, Node, Proc,
};

/// How a test damages a file.
#[derive(Debug, Clone, Copy)]
enum Damage {
    /// The first 64 bytes (the superblock's fields) zeroed.
    ZeroSuperblock,
    /// The whole first 4096 bytes zeroed.
    ZeroFirstPage,
    /// Truncated to 0 bytes.
    Empty,
    /// Cut to 1000 bytes: shorter than any superblock.
    Short,
    /// Cut to half its length.
    Halved,
}

impl Damage {
    const ALL: [Damage; 5] = [
        Damage::ZeroSuperblock,
        Damage::ZeroFirstPage,
        Damage::Empty,
        Damage::Short,
        Damage::Halved,
    ];

    fn apply(self, path: &Path) {
        let mut bytes = std::fs::read(path).expect("read the file to damage");
        match self {
            Damage::ZeroSuperblock => bytes[..64].fill(0),
            Damage::ZeroFirstPage => bytes[..4096].fill(0),
            Damage::Empty => bytes.clear(),
            Damage::Short => bytes.truncate(1000),
            Damage::Halved => bytes.truncate(bytes.len() / 2),
        }
        std::fs::write(path, bytes).expect("write the damaged file");
    }

    /// Words the error must use for this damage.
    fn described_as(self, store: bool) -> &'static str {
        match (self, store) {
            (Damage::ZeroSuperblock, false) | (Damage::ZeroFirstPage, _) => "blank (all zero)",
            (Damage::Empty, _) => "empty (0 bytes)",
            (Damage::Short, false) => "shorter than",
            (Damage::Halved, false) => "truncated",
            // The stores say what their own checks found.
            (Damage::ZeroSuperblock | Damage::Short | Damage::Halved, true) => "holds no usable",
        }
    }
}

/// Run `pmnet ARGS`, which must exit non-zero without starting and without a panic, saying
/// every one of `hints` on stderr; the file at `path` must be left exactly as it was.
fn refused(list: &[String], path: &Path, hints: &[&str]) -> String {
    let before = std::fs::read(path).expect("read the file");
    let (status, stdout, stderr) = run_pmnet(list, None);
    let shown = format!("pmnet {}", list.join(" "));
    assert!(
        !status.success(),
        "{shown} started\nstdout: {stdout}\nstderr: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "{shown} panicked:\n{stderr}");
    assert!(
        !stdout.contains(" listening on "),
        "{shown} started serving:\n{stdout}"
    );
    for hint in hints {
        assert!(
            stderr.contains(hint),
            "{shown}: stderr does not mention {hint:?}:\n{stderr}"
        );
    }
    assert_eq!(
        std::fs::read(path).expect("read the file"),
        before,
        "{shown} changed the file it refused"
    );
    stderr
}

/// Wait until the process has written `text` to stderr (lines logged before its banner may
/// arrive after it: stdout and stderr are read apart); its stderr so far.
fn wait_for_stderr(proc: &Proc, text: &str) -> String {
    poll_until(&format!("{} to log {text:?}", proc.name), || {
        let stderr = proc.stderr();
        if stderr.contains(text) {
            Ok(stderr)
        } else {
            Err(stderr)
        }
    })
}

/// SET `key` through the device at `device` (acked once the device has logged it).
fn set(device: SocketAddr, key: &str, value: &str) {
    let (status, stdout, stderr) = run_pmnet(
        &args(&["client", "--device", &device.to_string(), "set", key, value]),
        None,
    );
    assert!(
        status.success() && stdout.starts_with("OK (durable in the log of device 1"),
        "set {key}: {stdout}\n{stderr}"
    );
}

/// A device in front of a server that applies nothing (it only answers the device's probes),
/// with `count` updates logged and acked in its log file, stopped cleanly: the log holds those
/// entries and nothing else does.
fn log_with_acked_entries(dir: &Path, count: usize) -> (Vec<String>, std::path::PathBuf) {
    let log_file = dir.join("device.log");
    let device_addr = free_udp_addr();
    let no_server = free_udp_addr();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    common::probe_answerer(no_server, stop.clone());
    let device_args = device_args(device_addr, no_server, &log_file);
    let mut device = Node::start("device (first start)", device_args.clone());
    wait_for_stderr(&device.proc, "did not exist: created it");
    for index in 0..count {
        set(device.addr, &format!("key{index}"), "acked");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    device.proc.stop();
    (device_args, log_file)
}

#[test]
fn a_device_refuses_a_damaged_or_emptied_log_unless_formatted() {
    for damage in Damage::ALL {
        let dir = tempfile::tempdir().unwrap();
        let (device_args, log_file) = log_with_acked_entries(dir.path(), 3);
        damage.apply(&log_file);

        let log_name = log_file.display().to_string();
        let stderr = refused(
            &device_args,
            &log_file,
            &[
                &log_name,
                damage.described_as(false),
                "acknowledged",
                "--format",
            ],
        );
        // Where the slots are still there, the error counts the entries that would be lost.
        match damage {
            Damage::ZeroSuperblock | Damage::ZeroFirstPage => assert!(
                stderr.contains("3 slot(s) in it still look like intact entries (slot size 2048"),
                "{damage:?}: {stderr}"
            ),
            Damage::Empty | Damage::Short | Damage::Halved => {}
        }

        // --format erases it and starts with an empty log.
        let mut formatted = device_args.clone();
        formatted.push("--format".to_owned());
        let mut device = Node::start(&format!("device after {damage:?}, --format"), formatted);
        let banner = device.banner.join("\n");
        assert!(banner.contains("; new; 0 entries recovered"), "{banner}");
        wait_for_stderr(&device.proc, "--format: erased the device log");
        device.proc.stop();

        // And the formatted log reopens as it is.
        let mut device = Node::start(&format!("device after {damage:?}"), device_args);
        let banner = device.banner.join("\n");
        assert!(
            banner.contains("; reopened; 0 entries recovered"),
            "{banner}"
        );
        device.proc.stop();
    }
}

/// Offsets of the slots of a log (default slot size, 1024 slots) whose state is VALID.
fn live_slots(log: &[u8]) -> Vec<usize> {
    const VALID: [u8; 4] = 0x564C_4944u32.to_le_bytes();
    (0..1024)
        .map(|slot| 4096 + slot * 2048)
        .filter(|offset| log[*offset..*offset + 4] == VALID)
        .collect()
}

#[test]
fn a_device_reports_each_damaged_entry_it_drops() {
    let dir = tempfile::tempdir().unwrap();
    let (device_args, log_file) = log_with_acked_entries(dir.path(), 3);
    let mut log = std::fs::read(&log_file).unwrap();
    let slots = live_slots(&log);
    assert_eq!(slots.len(), 3, "three entries logged");
    // A flipped byte in the packet of two of them: corruption at rest.
    for offset in &slots[..2] {
        log[offset + 64 + 20] ^= 0x40;
    }
    std::fs::write(&log_file, log).unwrap();

    let mut device = Node::start("device with two damaged entries", device_args);
    let banner = device.banner.join("\n");
    assert!(
        banner.contains("1 entries recovered and resent, 2 torn or corrupt slots rejected"),
        "{banner}"
    );
    let stderr = wait_for_stderr(&device.proc, "2 logged entries were damaged and are lost");
    for offset in &slots[..2] {
        let slot = (offset - 4096) / 2048;
        assert!(
            stderr.contains(&format!("damaged entry lost: slot {slot} (")),
            "slot {slot} not reported:\n{stderr}"
        );
    }
    assert_eq!(stderr.matches("damaged entry lost").count(), 2, "{stderr}");
    assert!(stderr.contains("server 1, session 0x"), "{stderr}");
    assert!(stderr.contains(" WARN "), "{stderr}");
    device.proc.stop();
}

#[test]
fn a_server_refuses_a_damaged_or_emptied_data_file_unless_formatted() {
    for engine in ["packet", "conventional", "kv"] {
        for damage in Damage::ALL {
            let mut cluster = Cluster::start_with_engine(Some(engine));
            wait_for_stderr(&cluster.server().proc, "did not exist: created an empty");
            set(cluster.device_addr, "stored", "value");
            cluster.server().wait_metric(
                "pmnet_server_requests_applied_total",
                "",
                "to count the SET",
                |value| value >= 1.0,
            );
            cluster.stop_server();
            cluster.stop_device();
            let data_file = cluster.data_file();
            damage.apply(&data_file);

            let server_args = server_args(
                free_udp_addr(),
                cluster.device_addr,
                &data_file,
                Some(engine),
            );
            let data_name = data_file.display().to_string();
            refused(
                &server_args,
                &data_file,
                &[
                    &data_name,
                    damage.described_as(true),
                    "acknowledged",
                    "--format",
                ],
            );

            let mut formatted = server_args.clone();
            formatted.push("--format".to_owned());
            let mut server = Node::start(
                &format!("{engine} server after {damage:?}, --format"),
                formatted,
            );
            let banner = server.banner.join("\n");
            assert!(
                banner.contains("(new; 0 keys"),
                "{engine} {damage:?}: {banner}"
            );
            server.proc.stop();
            let mut server = Node::start(&format!("{engine} server after {damage:?}"), server_args);
            let banner = server.banner.join("\n");
            assert!(
                banner.contains("(reopened; 0 keys"),
                "{engine} {damage:?}: {banner}"
            );
            server.proc.stop();
        }
    }
}

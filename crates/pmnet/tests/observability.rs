//! What the processes say about themselves: metrics that are current when scraped, latency
//! histograms, the process metrics and build information, `pmnet status` and `pmnet log
//! inspect`. Real `pmnet` processes on loopback; every wait polls with a generous deadline.

mod common;

use std::time::Duration;

use common::{args, run_pmnet, session, Cluster};
use pmnet_proto::Completion;
use pmnet_runtime::metrics::{find_sample, scrape};
use pmnet_store::Request;
use rand::SeedableRng;

/// One scrape of `node`'s endpoint.
fn scrape_once(node: &common::Node) -> String {
    let addr = node.metrics.expect("a metrics endpoint");
    scrape(addr, Duration::from_secs(10)).expect("scrape")
}

fn sample(text: &str, name: &str, labels: &str) -> f64 {
    find_sample(text, name, labels)
        .unwrap_or_else(|| panic!("no sample {name}{{{labels}}} in:\n{text}"))
}

/// The `(le, cumulative count)` buckets of histogram `name` (no other labels), checked to be
/// cumulative and to end with `+Inf` equal to `_count`; returns `_count`.
fn histogram_count(text: &str, name: &str) -> f64 {
    assert!(
        text.contains(&format!("# TYPE {name} histogram")),
        "{name} is not a histogram in:\n{text}"
    );
    let prefix = format!("{name}_bucket{{le=\"");
    let buckets: Vec<(String, f64)> = text
        .lines()
        .filter_map(|line| {
            let rest = line.strip_prefix(&prefix)?;
            let (le, value) = rest.split_once("\"} ")?;
            Some((le.to_owned(), value.parse().ok()?))
        })
        .collect();
    assert!(buckets.len() >= 10, "{name}: too few buckets: {buckets:?}");
    assert!(
        buckets.windows(2).all(|pair| pair[0].1 <= pair[1].1),
        "{name}: buckets not cumulative: {buckets:?}"
    );
    let bounds: Vec<f64> = buckets[..buckets.len() - 1]
        .iter()
        .map(|(le, _)| le.parse().expect("a bound"))
        .collect();
    assert!(
        bounds.windows(2).all(|pair| pair[0] < pair[1]),
        "{name}: bounds not increasing: {bounds:?}"
    );
    let (last_le, last) = buckets.last().expect("buckets").clone();
    assert_eq!(last_le, "+Inf", "{name}: the last bucket is not +Inf");
    let count = sample(text, &format!("{name}_count"), "");
    assert_eq!(last, count, "{name}: +Inf bucket and _count differ");
    let sum = sample(text, &format!("{name}_sum"), "");
    assert!(sum >= 0.0 && sum.is_finite(), "{name}_sum = {sum}");
    if count > 0.0 {
        assert!(sum > 0.0, "{name}: {count} samples summing to 0");
    }
    count
}

#[test]
fn a_scrape_right_after_the_last_reply_shows_every_request() {
    // Every engine counts what its server receives (the packet store receives straight into
    // its own slots, past the socket's buffers).
    for engine in ["packet", "conventional", "kv"] {
        scrape_after_traffic(engine);
    }
}

fn scrape_after_traffic(engine: &'static str) {
    const UPDATES: u32 = 25;
    eprintln!("engine {engine}");
    let cluster = Cluster::start_with_engine(Some(engine));
    let mut client = session(cluster.device_addr);
    for index in 0..UPDATES {
        let payload = Request::Set {
            key: format!("key-{index}").as_bytes(),
            value: b"value",
        }
        .to_bytes();
        match client.update(&payload).expect("SET completes") {
            Completion::Logged { .. } => {}
            other => panic!("SET {index} completed with {other:?}"),
        }
    }
    // A read in the same session is applied after every update before it, and its reply
    // passes the device after their server-ACKs: once it is here, everything is counted.
    let read = Request::Get { key: b"key-0" }.to_bytes();
    assert!(matches!(
        client.bypass(&read).expect("GET completes"),
        Completion::Replied { .. }
    ));

    // One scrape each, at once: no polling.
    let device = scrape_once(cluster.device());
    let server = scrape_once(cluster.server());

    let n = f64::from(UPDATES);
    let port = "port=\"pmnet\"";
    assert_eq!(
        sample(&device, "pmnet_device_updates_logged_total", port),
        n
    );
    // One PMNet-ACK per update, and at most one more for each retransmission the device had
    // logged already (a slow host makes the client resend; one that comes while the entry is
    // still being written shares its first ack).
    let acks = sample(&device, "pmnet_device_pmnet_acks_sent_total", port);
    let duplicates = sample(&device, "pmnet_device_duplicate_updates_total", port);
    assert!(
        acks >= n && acks <= n + duplicates,
        "{acks} PMNet-ACKs for {n} updates and {duplicates} retransmissions"
    );
    // (Retransmissions are counted too: at least the one read.)
    assert!(sample(&device, "pmnet_device_bypass_forwarded_total", port) >= 1.0);
    assert_eq!(
        sample(&device, "pmnet_device_entries_invalidated_total", port),
        n
    );
    let received_updates = sample(
        &device,
        "pmnet_packets_received_total",
        "socket=\"device\",type=\"update\"",
    );
    assert!(received_updates >= n, "device received {received_updates}");
    assert_eq!(
        histogram_count(&device, "pmnet_device_log_entry_residency_seconds"),
        n
    );

    assert_eq!(
        sample(&server, "pmnet_server_requests_applied_total", ""),
        n + 1.0
    );
    assert!(sample(&server, "pmnet_server_request_fragments_received_total", "") >= n + 1.0);
    // The packet store receives straight into its slots; its socket counters count them.
    let server_received: f64 = server
        .lines()
        .filter(|line| line.starts_with("pmnet_packets_received_total{socket=\"server\""))
        .filter_map(|line| line.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum();
    assert!(server_received >= 1.0, "server received {server_received}");
    assert!(sample(&server, "pmnet_bytes_received_total", "socket=\"server\"") > 0.0);

    // The session's own histograms (what the gateway publishes for its sessions).
    let latency = client_latency(&client);
    assert_eq!(latency.pmnet_ack.count(), u64::from(UPDATES));
    assert_eq!(latency.server_reply.count(), 1);
}

fn client_latency(client: &pmnet_runtime::ClientSession) -> pmnet_proto::ClientLatency {
    client.latency().clone()
}

#[test]
fn every_process_publishes_process_metrics_and_build_info() {
    let cluster = Cluster::start();
    for node in [cluster.device(), cluster.server()] {
        let text = scrape_once(node);
        for name in [
            "process_cpu_seconds_total",
            "process_resident_memory_bytes",
            "process_virtual_memory_bytes",
            "process_open_fds",
            "process_max_fds",
            "process_start_time_seconds",
        ] {
            let value = sample(&text, name, "");
            assert!(value > 0.0, "{name} = {value}");
        }
        assert!(
            sample(&text, "process_virtual_memory_bytes", "")
                >= sample(&text, "process_resident_memory_bytes", "")
        );
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let started = sample(&text, "process_start_time_seconds", "");
        assert!(
            started <= now + 2.0 && started > now - 3600.0,
            "started {started}, now {now}"
        );
        let info = text
            .lines()
            .find(|line| line.starts_with("pmnet_build_info{"))
            .unwrap_or_else(|| panic!("no pmnet_build_info in:\n{text}"));
        assert!(info.ends_with("} 1"), "{info}");
        let version = format!("version=\"{}\"", env!("CARGO_PKG_VERSION"));
        assert!(info.contains(&version), "{info}");
        assert!(info.contains("commit=\""), "{info}");
        assert!(
            info.contains("profile=\"debug\"") || info.contains("profile=\"release\""),
            "{info}"
        );
        assert!(info.contains("rustc=\"rustc "), "{info}");
    }
}

#[test]
fn pmnet_status_describes_a_running_device_and_server() {
    let cluster = Cluster::start();
    let mut client = session(cluster.device_addr);
    for index in 0..5 {
        let payload = Request::Set {
            key: format!("status-{index}").as_bytes(),
            value: b"v",
        }
        .to_bytes();
        client.update(&payload).expect("SET completes");
    }
    let read = Request::Get { key: b"status-0" }.to_bytes();
    client.bypass(&read).expect("GET completes");

    let device_metrics = cluster.device().metrics.unwrap().to_string();
    let (status, stdout, stderr) = run_pmnet(&args(&["status", &device_metrics]), None);
    assert!(status.success(), "pmnet status failed: {stderr}");
    assert!(
        stdout.starts_with("pmnet device 1 listening on "),
        "{stdout}"
    );
    for wanted in [
        "log:",
        "of 1024 slots used",
        "sessions:   1 known",
        "recovery:   none in progress",
        "replay:     nothing being resent",
        &format!("server 1 {}, heard ", cluster.server_addr),
        "1 client address(es)",
        "updates logged 5",
    ] {
        assert!(stdout.contains(wanted), "no {wanted:?} in:\n{stdout}");
    }

    let (status, stdout, stderr) = run_pmnet(&args(&["status", "--json", &device_metrics]), None);
    assert!(status.success(), "pmnet status --json failed: {stderr}");
    let json: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
    assert_eq!(json["role"], "device");
    assert_eq!(json["id"], 1);
    assert_eq!(json["log"]["slots"], 1024);
    assert_eq!(json["log"]["entries_used"], 0);
    assert_eq!(json["counters"]["updates_logged"], 5);
    assert_eq!(json["recovery"]["in_progress"], false);
    assert_eq!(json["replay"]["in_progress"], false);
    assert!(json["uptime_seconds"].as_f64().unwrap() > 0.0);
    assert!(json["build"]["commit"].is_string());

    let server_metrics = cluster.server().metrics.unwrap().to_string();
    let (status, stdout, stderr) = run_pmnet(&args(&["status", "--json", &server_metrics]), None);
    assert!(status.success(), "pmnet status --json failed: {stderr}");
    let json: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
    assert_eq!(json["role"], "server");
    assert_eq!(json["engine"], "packet");
    assert_eq!(json["counters"]["requests_applied"], 6);
    assert_eq!(json["recovery"]["in_progress"], false);
    assert_eq!(
        json["peers"]["devices"][0]["addr"],
        cluster.device_addr.to_string()
    );
    let (status, stdout, _) = run_pmnet(&args(&["status", &server_metrics]), None);
    assert!(status.success());
    assert!(
        stdout.starts_with("pmnet server 1 listening on "),
        "{stdout}"
    );
    assert!(stdout.contains("requests applied 6"), "{stdout}");
}

#[test]
fn pmnet_status_says_when_nothing_or_something_else_listens() {
    // Nothing listens: a port that was free a moment ago.
    let free = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let (status, _, stderr) = run_pmnet(&args(&["status", &free.to_string()]), None);
    assert!(!status.success());
    assert!(stderr.contains("nothing listens on"), "{stderr}");

    // An HTTP server that is not pmnet's, and a TCP server that does not speak HTTP.
    for answer in [
        &b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"[..],
        &b"220 welcome to something else\r\n"[..],
    ] {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            use std::io::{Read, Write};
            let (mut stream, _) = listener.accept().unwrap();
            let mut buffer = [0u8; 1024];
            let _ = stream.read(&mut buffer);
            let _ = stream.write_all(answer);
        });
        let (status, _, stderr) = run_pmnet(&args(&["status", &addr.to_string()]), None);
        assert!(!status.success());
        assert!(
            stderr.contains("is not a pmnet metrics endpoint"),
            "{stderr}"
        );
        server.join().unwrap();
    }
}

#[test]
fn pmnet_log_inspect_lists_live_entries_and_damage_without_writing() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("device.log");
    // A device whose server applies nothing (it only answers the device's probes): its
    // updates stay in the log.
    let absent_server = common::free_udp_addr();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    common::probe_answerer(absent_server, stop.clone());
    let mut device = common::Node::start(
        "device",
        common::device_args(common::free_udp_addr(), absent_server, &log),
    );
    let mut client = session(device.addr);
    for index in 0..3 {
        let payload = Request::Set {
            key: format!("inspect-{index}").as_bytes(),
            value: b"logged value",
        }
        .to_bytes();
        assert!(matches!(
            client.update(&payload).expect("SET completes"),
            Completion::Logged { .. }
        ));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    device.proc.stop();
    let log_text = log.display().to_string();
    let before = std::fs::read(&log).unwrap();

    let (status, stdout, stderr) = run_pmnet(&args(&["log", "inspect", &log_text]), None);
    assert!(status.success(), "{stderr}\n{stdout}");
    assert!(stdout.contains("1024 slots of 2048 bytes"), "{stdout}");
    assert!(
        stdout.contains("summary: 3 live entries in 1024 slots"),
        "{stdout}"
    );
    assert!(stdout.contains("by server: server 1: 3"), "{stdout}");
    assert!(stdout.contains("inspect-0"), "{stdout}");
    assert!(stdout.contains("damaged slots: none"), "{stdout}");
    assert_eq!(
        std::fs::read(&log).unwrap(),
        before,
        "inspect changed the file"
    );

    let (status, stdout, _) = run_pmnet(&args(&["log", "inspect", "--json", &log_text]), None);
    assert!(status.success());
    let json: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
    assert_eq!(json["live_entries"], 3);
    assert_eq!(json["entries_by_server"]["1"], 3);
    let entries = json["entries"].as_array().unwrap();
    assert!(entries
        .iter()
        .all(|entry| entry["type"] == "update" && entry["server_id"] == 1));
    let mut seqs: Vec<u64> = entries
        .iter()
        .map(|entry| entry["seq"].as_u64().unwrap())
        .collect();
    seqs.sort_unstable();
    assert_eq!(seqs, vec![1, 2, 3]);
    // One session, its highest sequence number 3.
    assert_eq!(json["sessions"].as_array().unwrap().len(), 1);
    assert_eq!(json["sessions"][0]["highest_seq"], 3);
    assert_eq!(json["sessions"][0]["session_id"], client.session_id());
    assert_eq!(json["damaged"].as_array().unwrap().len(), 0);

    // A damaged slot: one byte of a live entry's packet flipped.
    let slot = entries[0]["slot"].as_u64().unwrap() as usize;
    let mut damaged = before.clone();
    damaged[4096 + slot * 2048 + 64 + 20] ^= 0x5a;
    let damaged_path = dir.path().join("damaged.log");
    std::fs::write(&damaged_path, &damaged).unwrap();
    let (status, stdout, stderr) = run_pmnet(
        &args(&["log", "inspect", &damaged_path.display().to_string()]),
        None,
    );
    assert_eq!(status.code(), Some(2), "{stderr}\n{stdout}");
    assert!(stdout.contains("summary: 2 live entries"), "{stdout}");
    assert!(stdout.contains("DAMAGED: 1 slot(s)"), "{stdout}");
    assert!(stdout.contains("fail their CRC32C"), "{stdout}");
    assert_eq!(std::fs::read(&damaged_path).unwrap(), damaged);

    // Cut short in the middle of the slots.
    let truncated = dir.path().join("truncated.log");
    std::fs::write(&truncated, &before[..4096 + 100 * 2048 + 7]).unwrap();
    let (status, stdout, stderr) = run_pmnet(
        &args(&["log", "inspect", &truncated.display().to_string()]),
        None,
    );
    assert_eq!(status.code(), Some(2), "{stderr}\n{stdout}");
    assert!(
        stdout.contains("TRUNCATED: the file ends after 100 of 1024 slots"),
        "{stdout}"
    );

    // Not a log: random bytes, a short file, an empty file, a missing file.
    let mut rng = rand::rngs::StdRng::seed_from_u64(common::seed("log_inspect_random"));
    for len in [0usize, 100, 4096, 100_000] {
        let mut bytes = vec![0u8; len];
        rand::RngCore::fill_bytes(&mut rng, &mut bytes);
        let path = dir.path().join(format!("random-{len}.bin"));
        std::fs::write(&path, &bytes).unwrap();
        let (status, stdout, stderr) = run_pmnet(
            &args(&["log", "inspect", &path.display().to_string()]),
            None,
        );
        assert_eq!(status.code(), Some(1), "{len} bytes: {stdout}\n{stderr}");
        assert!(stderr.contains("holds no pmnet device log"), "{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    let (status, _, stderr) = run_pmnet(
        &args(&[
            "log",
            "inspect",
            &dir.path().join("missing.log").display().to_string(),
        ]),
        None,
    );
    assert_eq!(status.code(), Some(1));
    assert!(stderr.contains("cannot read"), "{stderr}");

    // The device restarted on its log, its server still absent: recovery in progress.
    let device = common::Node::start(
        "device",
        common::device_args(common::free_udp_addr(), absent_server, &log),
    );
    let metrics = device.metrics.unwrap().to_string();
    let (status, stdout, stderr) = run_pmnet(&args(&["status", "--json", &metrics]), None);
    assert!(status.success(), "{stderr}");
    let json: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
    assert_eq!(json["recovery"]["in_progress"], true, "{json}");
    assert_eq!(json["recovery"]["recovered_entries_left"], 3, "{json}");
    assert_eq!(json["log"]["entries_used"], 3, "{json}");
    assert_eq!(json["log"]["recovered_at_start"], 3, "{json}");
    assert_eq!(json["log"]["entries_by_server"]["1"], 3, "{json}");
    let (status, stdout, _) = run_pmnet(&args(&["status", &metrics]), None);
    assert!(status.success());
    assert!(
        stdout.contains("recovery:   IN PROGRESS: 3 entries recovered from the log"),
        "{stdout}"
    );
    assert!(stdout.contains("3 of 1024 slots used"), "{stdout}");
}

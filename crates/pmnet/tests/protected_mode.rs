//! Protected mode (docs/security.md): a process that would listen on an address other hosts
//! reach without a key file refuses to start, naming `pmnet keygen` and `--insecure`; with
//! `--insecure` it starts and warns, at once and again while other hosts send to it; with a
//! key file (on the command line or in `--config`) it starts authenticated. Loopback needs
//! no key.

mod common;

use std::net::{IpAddr, SocketAddr, UdpSocket};

use common::{args, free_udp_addr, poll_until, run_pmnet, Node, Proc};

fn keygen(dir: &std::path::Path) -> String {
    let path = dir.join("pmnet.key").display().to_string();
    let (status, _, stderr) = run_pmnet(&args(&["keygen", "--out", &path]), None);
    assert!(status.success(), "{stderr}");
    path
}

/// An address of this host that is not loopback (the source of a route outwards), if it has
/// one: datagrams from it come "from another host" as far as a listener can tell.
fn outward_address() -> Option<IpAddr> {
    let socket = UdpSocket::bind("0.0.0.0:0").ok()?;
    // Connecting a UDP socket sends nothing: it only picks the route and the source address.
    socket.connect("192.0.2.1:9").ok()?;
    let ip = socket.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
}

#[test]
fn every_listener_off_loopback_without_a_key_is_refused_naming_keygen_and_insecure() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let port = free_udp_addr().port();
    let every = format!("0.0.0.0:{port}");
    let every6 = format!("[::]:{port}");
    let lines = dir.path().join("node.lines").display().to_string();
    let state = dir.path().join("controller.state").display().to_string();
    let commands: Vec<Vec<&str>> = vec![
        vec![
            "device",
            "--listen",
            &every,
            "--server",
            "1=127.0.0.1:9",
            "--no-log",
        ],
        vec![
            "device",
            "--listen",
            &every6,
            "--server",
            "1=[::1]:9",
            "--no-log",
        ],
        vec![
            "device",
            "--listen",
            "127.0.0.1:0",
            "--forward-listen",
            &every,
            "--server",
            "1=127.0.0.1:9",
            "--no-log",
        ],
        vec!["server", "--listen", &every, "--ideal"],
        vec!["memnode", "--listen", &every, "--file", &lines],
        vec!["redis-adaptor", "--listen", &every],
        vec!["gateway", "--listen", &every],
        vec![
            "chain-controller",
            "--listen",
            &every,
            "--member",
            "127.0.0.1:9",
            "--state",
            &state,
        ],
        vec!["redis-up", "--listen", &every],
        vec!["redis-up", "--device-listen", &every],
    ];
    for command in commands {
        let (status, _, stderr) = run_pmnet(&args(&command), None);
        assert!(!status.success(), "{command:?} started");
        assert!(
            stderr.contains("protected mode")
                && stderr.contains("pmnet keygen")
                && stderr.contains("--insecure")
                && stderr.contains("--key-file"),
            "{command:?}: {stderr}"
        );
    }
    // Nothing was made before the refusal.
    assert!(!std::path::Path::new(&lines).exists());
    assert!(!std::path::Path::new(&state).exists());
}

#[test]
fn with_insecure_a_device_starts_and_warns_at_once_and_of_traffic_from_other_hosts() {
    let port = free_udp_addr().port();
    let device = Node::start(
        "device",
        args(&[
            "device",
            "--listen",
            &format!("0.0.0.0:{port}"),
            "--server",
            "1=127.0.0.1:9",
            "--no-log",
            "--insecure",
            "--metrics",
            "127.0.0.1:0",
            "--report-interval",
            "0",
        ]),
    );
    assert!(
        device
            .banner
            .iter()
            .any(|line| line.contains("traffic: NOT authenticated")),
        "{:?}",
        device.banner
    );
    poll_until("the warning at start", || {
        let stderr = device.proc.stderr();
        if stderr.contains("WARN") && stderr.contains("started with --insecure") {
            Ok(())
        } else {
            Err(stderr)
        }
    });
    // Loopback peers are served without a word.
    let local = UdpSocket::bind("127.0.0.1:0").unwrap();
    local
        .send_to(b"not a datagram", SocketAddr::from(([127, 0, 0, 1], port)))
        .unwrap();
    device.wait_metrics_line("counts the loopback datagram", |line| {
        line.starts_with("pmnet_device_dropped_total{") && line.contains("port=\"pmnet\"")
    });
    assert!(
        !device.proc.stderr().contains("from other hosts"),
        "{}",
        device.proc.stderr()
    );
    let Some(outward) = outward_address() else {
        eprintln!("SKIP (in part): this host has no address but loopback");
        return;
    };
    let remote = UdpSocket::bind(SocketAddr::new(outward, 0)).unwrap();
    for _ in 0..3 {
        remote
            .send_to(b"not a datagram either", SocketAddr::new(outward, port))
            .unwrap();
    }
    poll_until("the warning of traffic from other hosts", || {
        let stderr = device.proc.stderr();
        if stderr.contains("unauthenticated datagram(s) from other hosts")
            && stderr.contains(&outward.to_string())
            && stderr.contains("pmnet keygen")
        {
            Ok(())
        } else {
            Err(stderr)
        }
    });
    // At most once a minute: the next datagrams add no warning.
    let warnings = |text: &str| text.matches("from other hosts").count();
    let before = warnings(&device.proc.stderr());
    remote
        .send_to(b"and another", SocketAddr::new(outward, port))
        .unwrap();
    device.wait_metric(
        "pmnet_device_dropped_all_total",
        "port=\"pmnet\"",
        "counts every datagram",
        |value| value >= 5.0,
    );
    assert_eq!(warnings(&device.proc.stderr()), before);
}

#[test]
fn with_a_key_file_from_the_command_line_or_the_config_file_no_insecure_is_needed() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let key = keygen(dir.path());
    let port = free_udp_addr().port();
    let device = Node::start(
        "device",
        args(&[
            "device",
            "--listen",
            &format!("0.0.0.0:{port}"),
            "--server",
            "1=127.0.0.1:9",
            "--no-log",
            "--key-file",
            &key,
            "--metrics",
            "127.0.0.1:0",
        ]),
    );
    assert!(
        device
            .banner
            .iter()
            .any(|line| line.contains("traffic: authenticated")),
        "{:?}",
        device.banner
    );
    assert!(!device.proc.stderr().contains("--insecure"));
    drop(device);

    // The controller, its key and address from `--config`.
    let config = dir.path().join("pmnet.toml");
    let controller_port = free_udp_addr().port();
    std::fs::write(
        &config,
        format!(
            "[chain-controller]\nlisten = \"0.0.0.0:{controller_port}\"\nkey-file = {key:?}\n\
             member = [\"127.0.0.1:9\"]\nstate = {:?}\n[kv]\nkey-file = {key:?}\n",
            dir.path().join("controller.state").display().to_string()
        ),
    )
    .unwrap();
    let mut controller = Proc::spawn(
        "chain-controller",
        &args(&[
            "--config",
            &config.display().to_string(),
            "chain-controller",
        ]),
    );
    let banner = controller.wait_for_line("its banner", |line| line.contains("listening on"));
    assert!(
        banner.contains(&format!("0.0.0.0:{controller_port}")),
        "{banner}"
    );
    let traffic = controller.wait_for_line("its traffic line", |line| line.contains("traffic: "));
    assert!(traffic.contains("traffic: authenticated"), "{traffic}");
    // `pmnet kv` takes its key from the file too: an unreadable key is refused naming it.
    std::fs::write(&config, "[kv]\nkey-file = \"/nonexistent/pmnet.key\"\n").unwrap();
    let (status, _, stderr) = run_pmnet(
        &args(&[
            "--config",
            &config.display().to_string(),
            "kv",
            "--member",
            "127.0.0.1:9",
            "get",
            "k",
        ]),
        None,
    );
    assert!(
        !status.success() && stderr.contains("/nonexistent/pmnet.key"),
        "{stderr}"
    );
}

#[test]
fn the_chain_controller_says_whether_it_is_authenticated_and_insecure_starts_it_warning() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let port = free_udp_addr().port();
    let mut controller = Proc::spawn(
        "chain-controller",
        &args(&[
            "chain-controller",
            "--listen",
            &format!("0.0.0.0:{port}"),
            "--member",
            "127.0.0.1:9",
            "--state",
            &dir.path().join("controller.state").display().to_string(),
            "--insecure",
        ]),
    );
    controller.wait_for_line("its banner", |line| line.contains("listening on"));
    let traffic = controller.wait_for_line("its traffic line", |line| line.contains("traffic: "));
    assert!(traffic.contains("NOT authenticated"), "{traffic}");
    poll_until("the warning at start", || {
        let stderr = controller.stderr();
        if stderr.contains("started with --insecure") {
            Ok(())
        } else {
            Err(stderr)
        }
    });
    // On loopback no key is needed, and nothing is said of it.
    let mut local = Proc::spawn(
        "chain-controller",
        &args(&[
            "chain-controller",
            "--listen",
            &free_udp_addr().to_string(),
            "--member",
            "127.0.0.1:9",
            "--state",
            &dir.path().join("local.state").display().to_string(),
        ]),
    );
    local.wait_for_line("its banner", |line| line.contains("listening on"));
    local.stop();
    assert!(!local.stderr().contains("--insecure"), "{}", local.stderr());
}

//! Authentication with real processes, started as docs/security.md tells a user: a key file
//! from `pmnet keygen`, `--key-file` on the server, the device and the client.

mod common;

use common::{args, device_args, free_udp_addr, poll_until, run_pmnet, server_args, Node};

#[test]
fn with_a_key_file_only_clients_holding_the_key_are_served() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("pmnet.keys").display().to_string();
    let (status, _, stderr) = run_pmnet(&args(&["keygen", "--out", &keys]), None);
    assert!(status.success(), "{stderr}");
    // Not twice over an existing file.
    let (status, _, stderr) = run_pmnet(&args(&["keygen", "--out", &keys]), None);
    assert!(!status.success() && stderr.contains("--force"), "{stderr}");

    let device_addr = free_udp_addr();
    let server_addr = free_udp_addr();
    let mut server_args = server_args(server_addr, device_addr, &dir.path().join("s.data"), None);
    server_args.extend(args(&["--key-file", &keys]));
    let server = Node::start("server", server_args);
    let mut device_args = device_args(device_addr, server_addr, &dir.path().join("d.log"));
    device_args.extend(args(&["--key-file", &keys]));
    let device = Node::start("device", device_args);
    for node in [&server, &device] {
        assert!(
            node.banner
                .iter()
                .any(|line| line.contains("traffic: authenticated")),
            "{:?}",
            node.banner
        );
    }

    device.wait_metrics_line("says its traffic is authenticated", |line| {
        line.starts_with("pmnet_device_info{") && line.contains("traffic=\"authenticated\"")
    });
    let to = device_addr.to_string();
    let client = |extra: &[&str], request: &[&str]| {
        let mut list = vec!["client", "--to", &to, "--request-lifetime", "1"];
        list.extend_from_slice(extra);
        list.extend_from_slice(request);
        run_pmnet(&args(&list), None)
    };
    let (status, stdout, stderr) = client(&["--key-file", &keys], &["set", "k", "v"]);
    assert!(status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("durable"), "{stdout}");
    // The device acked the SET; the server applies it next (another session's GET is not
    // ordered after it).
    poll_until("the server applied the SET", || {
        let (_, stdout, stderr) = client(&["--key-file", &keys], &["get", "k"]);
        if stdout.trim() == "v (from server 1)" {
            Ok(())
        } else {
            Err(format!("{stdout}{stderr}"))
        }
    });

    // Without the key: nothing acked, nothing applied, the device counts what it dropped.
    let (status, _, _) = client(&[], &["set", "k", "forged"]);
    assert!(!status.success());
    device.wait_metric(
        "pmnet_device_dropped_total",
        "port=\"pmnet\",reason=\"unauthenticated\"",
        "counts the unauthenticated datagrams",
        |value| value >= 1.0,
    );
    // And says so, naming the sender and the reason (rate-limited: once per 10 s at most).
    poll_until(
        "the device warns of the datagram that failed authentication",
        || {
            let stderr = device.proc.stderr();
            if stderr.contains("failed authentication, the latest from 127.0.0.1:")
                && stderr.contains("unauthenticated")
            {
                Ok(())
            } else {
                Err(stderr)
            }
        },
    );
    // Another key: refused as well.
    let other = dir.path().join("other.keys").display().to_string();
    assert!(run_pmnet(&args(&["keygen", "--out", &other]), None)
        .0
        .success());
    let (status, _, _) = client(&["--key-file", &other], &["set", "k", "forged"]);
    assert!(!status.success());
    device.wait_metric(
        "pmnet_device_dropped_total",
        "port=\"pmnet\",reason=\"bad_tag\"",
        "counts the datagrams made with another key",
        |value| value >= 1.0,
    );
    let (_, stdout, _) = client(&["--key-file", &keys], &["get", "k"]);
    assert_eq!(stdout.trim(), "v (from server 1)");
}

#[test]
fn a_key_file_others_may_read_or_with_a_bad_line_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keys");
    std::fs::write(&path, format!("key 1 {}\n", "ab".repeat(32))).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let shown = path.display().to_string();
    let server = free_udp_addr().to_string();
    let device = [
        "device",
        "--server",
        "1=127.0.0.1:9",
        "--listen",
        &server,
        "--no-log",
    ];
    let (status, _, stderr) = run_pmnet(
        &args(&[&device[..], &["--key-file", &shown]].concat()),
        None,
    );
    assert!(
        !status.success() && stderr.contains("chmod 600") && stderr.contains(&shown),
        "{stderr}"
    );
    std::fs::write(&path, "# keys\nkey 1 not-hex\n").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let (status, _, stderr) = run_pmnet(
        &args(&[&device[..], &["--key-file", &shown]].concat()),
        None,
    );
    assert!(
        !status.success() && stderr.contains(&format!("{shown}:2:")),
        "{stderr}"
    );
}

#[test]
fn with_encrypted_payloads_writes_and_reads_still_work_and_the_banner_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("pmnet.keys").display().to_string();
    let (status, _, stderr) = run_pmnet(&args(&["keygen", "--encrypt", "--out", &keys]), None);
    assert!(status.success(), "{stderr}");
    assert!(std::fs::read_to_string(&keys)
        .unwrap()
        .lines()
        .any(|line| line == "encrypt payloads"));
    let device_addr = free_udp_addr();
    let server_addr = free_udp_addr();
    let mut server_args = server_args(server_addr, device_addr, &dir.path().join("s.data"), None);
    server_args.extend(args(&["--key-file", &keys]));
    let server = Node::start("server", server_args);
    let mut device_args = device_args(device_addr, server_addr, &dir.path().join("d.log"));
    device_args.extend(args(&["--key-file", &keys]));
    let device = Node::start("device", device_args);
    for node in [&server, &device] {
        assert!(
            node.banner
                .iter()
                .any(|line| line.contains("traffic: authenticated")
                    && line.contains("payloads encrypted")),
            "{:?}",
            node.banner
        );
    }
    device.wait_metrics_line("says its traffic is authenticated and encrypted", |line| {
        line.starts_with("pmnet_device_info{")
            && line.contains("traffic=\"authenticated_encrypted\"")
    });
    let to = device_addr.to_string();
    let client = |request: &[&str]| {
        let mut list = vec![
            "client",
            "--to",
            &to,
            "--request-lifetime",
            "1",
            "--key-file",
            &keys,
        ];
        list.extend_from_slice(request);
        run_pmnet(&args(&list), None)
    };
    let (status, stdout, stderr) = client(&["set", "secret", "hunter2"]);
    assert!(
        status.success() && stdout.contains("durable"),
        "{stdout}{stderr}"
    );
    poll_until("the server applied the SET", || {
        let (_, stdout, stderr) = client(&["get", "secret"]);
        if stdout.trim() == "hunter2 (from server 1)" {
            Ok(())
        } else {
            Err(format!("{stdout}{stderr}"))
        }
    });
}

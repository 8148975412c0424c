//! Every option that takes an address takes a host name too: `localhost:PORT` reaches a
//! running device and server, and a host that does not resolve is refused, by name, before
//! anything starts.

mod common;

use common::{args, run_pmnet, Cluster};

#[test]
fn a_client_reaches_the_device_by_host_name() {
    let cluster = Cluster::start();
    let device = format!("localhost:{}", cluster.device_addr.port());
    let (status, stdout, stderr) = run_pmnet(
        &args(&["client", "--device", &device, "set", "greeting", "hello"]),
        None,
    );
    assert!(status.success(), "stdout: {stdout}\nstderr: {stderr}");
    assert!(stdout.starts_with("OK"), "{stdout}");
    let (status, stdout, stderr) = run_pmnet(
        &args(&["client", "--device", &device, "get", "greeting"]),
        None,
    );
    assert!(status.success(), "stdout: {stdout}\nstderr: {stderr}");
    assert_eq!(stdout.trim(), "hello (from server 1)");
}

#[test]
fn a_host_that_does_not_resolve_is_refused_by_name() {
    let cases: [&[&str]; 4] = [
        &[
            "client",
            "--device",
            "no-such-host.invalid:7400",
            "get",
            "k",
        ],
        &["device", "--server", "1=no-such-host.invalid:7500"],
        &["server", "--device", "no-such-host.invalid:7400", "--ideal"],
        &[
            "gateway",
            "--device",
            "127.0.0.1:7400,no-such-host.invalid:7401",
        ],
    ];
    for list in cases {
        let (status, stdout, stderr) = run_pmnet(&args(list), None);
        assert!(!status.success(), "{list:?} succeeded: {stdout}");
        assert!(
            !stdout.contains("listening on"),
            "{list:?} started: {stdout}"
        );
        assert!(
            stderr.contains("no-such-host.invalid") && stderr.contains("resolve"),
            "{list:?}: {stderr}"
        );
    }
}

//! A peer that is not there is reported promptly, by role and address: a client whose device
//! is not running, a device whose server is not, a server and a gateway whose device is not.
//! Real processes; each test waits (with a generous deadline) for the warning on stderr and
//! asserts on its words, never on how long it took.

mod common;

use std::io::Write;
use std::net::{SocketAddr, TcpStream, UdpSocket};

use common::{args, device_args, free_udp_addr, poll_until, Node, Proc};

/// Wait until `proc` has said `wanted` on stderr.
fn wait_for_stderr(proc: &Proc, what: &str, wanted: impl Fn(&str) -> bool) -> String {
    poll_until(what, || {
        let stderr = proc.stderr();
        if wanted(&stderr) {
            Ok(stderr)
        } else {
            Err(stderr)
        }
    })
}

/// An address where a socket is bound but never read: datagrams to it are not refused, and
/// never answered (a peer that is down without the network saying so).
fn silent_peer() -> (UdpSocket, SocketAddr) {
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = socket.local_addr().unwrap();
    (socket, addr)
}

#[test]
fn a_client_names_a_device_where_nothing_listens() {
    let addr = free_udp_addr();
    let client = Proc::spawn(
        "client",
        &args(&[
            "client",
            "--device",
            &addr.to_string(),
            "--request-lifetime",
            "2",
            "set",
            "k",
            "v",
        ]),
    );
    let stderr = wait_for_stderr(&client, "the client's final error", |text| {
        text.contains("pmnet: error:")
    });
    assert!(
        stderr.contains(&format!("nothing listens at {addr}")) && stderr.contains("`pmnet device`"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("server is unreachable"),
        "blames the server: {stderr}"
    );
}

#[test]
fn a_client_warns_of_a_silent_device_and_fails_naming_it() {
    let (_socket, addr) = silent_peer();
    let client = Proc::spawn(
        "client",
        &args(&[
            "client",
            "--device",
            &addr.to_string(),
            "--request-lifetime",
            "3",
            "set",
            "k",
            "v",
        ]),
    );
    let stderr = wait_for_stderr(&client, "the client's final error", |text| {
        text.contains("pmnet: error:")
    });
    assert!(
        stderr.contains(&format!("no reply from the device at {addr}")),
        "no warning: {stderr}"
    );
    assert_eq!(
        stderr.matches("no reply from the device").count(),
        1,
        "warned more than once: {stderr}"
    );
    let error = stderr
        .lines()
        .find(|line| line.contains("pmnet: error:"))
        .unwrap();
    assert!(
        error.contains(&format!("the device at {addr} never answered")),
        "{error}"
    );
}

#[test]
fn a_device_names_a_server_that_is_not_running_and_says_when_it_is_back() {
    let dir = tempfile::tempdir().unwrap();
    let server_addr = free_udp_addr();
    let device_addr = free_udp_addr();
    let device = Node::start(
        "device",
        device_args(device_addr, server_addr, &dir.path().join("device.log")),
    );
    // The device acks the update itself and forwards it to the server, which is not there.
    let (status, stdout, stderr) = common::run_pmnet(
        &args(&[
            "client",
            "--device",
            &device_addr.to_string(),
            "set",
            "k",
            "v",
        ]),
        None,
    );
    assert!(status.success(), "stdout: {stdout}\nstderr: {stderr}");
    let stderr = wait_for_stderr(&device.proc, "the device's warning", |text| {
        text.contains(&server_addr.to_string()) && text.contains("the server")
    });
    assert!(
        stderr.contains(&format!("nothing listens at {server_addr}"))
            || stderr.contains(&format!("no reply from the server at {server_addr}")),
        "{stderr}"
    );
    // The server starts where the device expects it: the device says it answers again.
    let server = Node::start(
        "server",
        common::server_args(
            server_addr,
            device_addr,
            &dir.path().join("server.data"),
            None,
        ),
    );
    wait_for_stderr(&device.proc, "the device's all-clear", |text| {
        text.contains(&format!("the server at {server_addr} answers again"))
    });
    drop(server);
}

#[test]
fn a_server_names_a_device_it_polls_in_vain() {
    let dir = tempfile::tempdir().unwrap();
    let (_socket, device_addr) = silent_peer();
    let server = Node::start(
        "server",
        common::server_args(
            "127.0.0.1:0".parse().unwrap(),
            device_addr,
            &dir.path().join("server.data"),
            None,
        ),
    );
    wait_for_stderr(&server.proc, "the server's warning", |text| {
        text.contains(&format!("no reply from the device at {device_addr}"))
    });
}

#[test]
fn a_gateway_names_a_device_that_is_not_running() {
    let device_addr = free_udp_addr();
    let gateway = Node::start(
        "gateway",
        args(&[
            "gateway",
            "--listen",
            "127.0.0.1:0",
            "--device",
            &device_addr.to_string(),
            "--report-interval",
            "0",
        ]),
    );
    let mut stream = TcpStream::connect(gateway.addr).unwrap();
    stream
        .write_all(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n")
        .unwrap();
    wait_for_stderr(&gateway.proc, "the gateway's warning", |text| {
        text.contains(&format!("nothing listens at {device_addr}"))
            || text.contains(&format!("no reply from the device at {device_addr}"))
    });
}

/// A redis-server of the test's own on `port`, killed when dropped.
struct RedisServer(std::process::Child);

impl RedisServer {
    fn start(port: u16, dir: &std::path::Path) -> RedisServer {
        let child = std::process::Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args([
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
            ])
            .arg("--dir")
            .arg(dir)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start redis-server (install redis-server)");
        RedisServer(child)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn an_adaptor_names_redis_when_it_is_not_there_and_a_device_that_does_not_answer() {
    let dir = tempfile::tempdir().unwrap();
    let redis_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let redis_addr = SocketAddr::from(([127, 0, 0, 1], redis_port));
    let (_socket, device_addr) = silent_peer();
    let mut adaptor = Proc::spawn(
        "adaptor",
        &args(&[
            "redis-adaptor",
            "--listen",
            "127.0.0.1:0",
            "--redis",
            &redis_addr.to_string(),
            "--device",
            &device_addr.to_string(),
            "--report-interval",
            "0",
        ]),
    );
    let not_there = format!("Redis at {redis_addr} does not answer");
    wait_for_stderr(&adaptor, "the adaptor's warning about Redis", |text| {
        text.contains(&not_there)
    });
    // Redis starts where the adaptor expects it: the adaptor starts serving.
    let redis = RedisServer::start(redis_port, dir.path());
    adaptor.wait_for_line("the adaptor's banner", |line| {
        line.contains(" listening on ")
    });
    // Its recovery poll goes to a device that never answers.
    wait_for_stderr(&adaptor, "the adaptor's warning about the device", |text| {
        text.contains(&format!("no reply from the device at {device_addr}"))
    });
    // Redis goes away and comes back: one warning for the outage (not one per connection or
    // per retry), and one line when it is back.
    drop(redis);
    wait_for_stderr(&adaptor, "the adaptor's warning about the outage", |text| {
        text.matches(&not_there).count() >= 2
    });
    let _redis = RedisServer::start(redis_port, dir.path());
    let stderr = wait_for_stderr(&adaptor, "the adaptor's all-clear", |text| {
        text.contains(&format!("Redis at {redis_addr} answers again"))
    });
    assert_eq!(stderr.matches(&not_there).count(), 2, "{stderr}");
}

/// A read through a running device whose server is down fails naming both possibilities (the
/// device passes reads on), never "the device never answered".
#[test]
fn a_client_read_with_the_server_down_does_not_blame_the_device_alone() {
    let dir = tempfile::tempdir().unwrap();
    let server_addr = free_udp_addr();
    let device_addr = free_udp_addr();
    let _device = Node::start(
        "device",
        device_args(device_addr, server_addr, &dir.path().join("device.log")),
    );
    let (status, stdout, stderr) = common::run_pmnet(
        &args(&[
            "client",
            "--device",
            &device_addr.to_string(),
            "--request-lifetime",
            "2",
            "get",
            "k",
        ]),
        None,
    );
    assert!(!status.success(), "stdout: {stdout}\nstderr: {stderr}");
    let error = stderr
        .lines()
        .find(|line| line.contains("pmnet: error:"))
        .unwrap_or_else(|| panic!("no error line: {stderr}"));
    assert!(
        error.contains(&format!("through the device at {device_addr}"))
            && error.contains("the server behind it"),
        "{error}"
    );
    assert!(!error.contains("never answered"), "{error}");
}

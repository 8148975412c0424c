//! The device in the path (docs/inpath.md), as real processes on the testbed's three hosts
//! (network namespaces joined by veth pairs, docs/testbed.md): `pmnet device --xdp cl,sv
//! --in-path` on the router between a client and a server.
//!
//! - Traffic that is not PMNet's (a TCP transfer, a UDP flow, ICMP when `ping` is installed)
//!   crosses the device byte for byte, routed by the kernel, while PMNet updates sent to the
//!   server's address are logged and acked by the device and reach the server.
//! - A device killed with acked updates in its log, restarted on the same log, replays them to
//!   the server.
//! - Hostile frames steered to the device (bad lengths, a wrong IPv4 checksum, garbage PMNet
//!   datagrams) are counted and dropped; the device goes on serving.
//!
//! The tests need root, network namespaces and XDP on veth: where any is missing they say so
//! and pass without running (CI runs them as root, where everything is there).

mod common;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream, UdpSocket};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{pmnet_bin, Proc};
use pmnet_testbed::{Host, Testbed, TestbedGuard, DEVICE_SERVER_SIDE, SERVER_ADDR};
use rand::{Rng, SeedableRng};

const SERVER_PORT: u16 = 7500;
const DEVICE_PORT: u16 = 7400;

/// A testbed of this test's own, or `None` (and why) where one cannot run here.
fn testbed(test: &str) -> Option<TestbedGuard> {
    if let Err(why) = pmnet_testbed::available() {
        eprintln!("SKIP {test}: no testbed of network namespaces here: {why}");
        return None;
    }
    if let Err(why) = pmnet_runtime::xdp_available() {
        eprintln!("SKIP {test}: the AF_XDP datapath cannot run here: {why}");
        return None;
    }
    let name = format!("ip{}{}", std::process::id() % 100_000, &test[..3]);
    Some(Testbed::guard(&name).unwrap_or_else(|error| panic!("testbed {name}: {error}")))
}

fn pmnet_in(testbed: &Testbed, host: Host) -> Command {
    testbed.command(host, pmnet_bin())
}

fn start_server(testbed: &Testbed, dir: &Path) -> Proc {
    let mut command = pmnet_in(testbed, Host::Server);
    command.args([
        "server",
        // Not loopback, and without keys on purpose: protected mode wants --insecure.
        "--insecure",
        "--listen",
        &format!("{SERVER_ADDR}:{SERVER_PORT}"),
        "--device",
        &format!("{DEVICE_SERVER_SIDE}:{DEVICE_PORT}"),
        "--data-file",
        &dir.join("server.data").display().to_string(),
    ]);
    let mut server = Proc::spawn_command("server", command);
    server.wait_for_line("the server's banner", |line| line.contains("listening on"));
    server
}

fn start_device(testbed: &Testbed, dir: &Path) -> Proc {
    let mut command = pmnet_in(testbed, Host::Device);
    command.args([
        "device",
        // Not loopback, and without keys on purpose: protected mode wants --insecure.
        "--insecure",
        "--listen",
        &format!("0.0.0.0:{DEVICE_PORT}"),
        "--server",
        &format!("1={SERVER_ADDR}:{SERVER_PORT}"),
        "--xdp",
        "cl,sv",
        "--in-path",
        "--log-file",
        &dir.join("device.log").display().to_string(),
    ]);
    let mut device = Proc::spawn_command("device", command);
    device.wait_for_line("the device's datapath", |line| {
        line.contains("datapath: AF_XDP on cl") && line.contains("in path")
    });
    device.wait_for_line("the end of the banner", |line| line.contains("metrics: "));
    device
}

/// `pmnet client ARGS` on the client host, addressing the server: its output.
fn client(testbed: &Testbed, args: &[&str]) -> String {
    let mut command = pmnet_in(testbed, Host::Client);
    command
        .args([
            "client",
            "--device",
            &format!("{SERVER_ADDR}:{SERVER_PORT}"),
        ])
        .args(args);
    let output = command.output().expect("pmnet client runs");
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "pmnet client {args:?}: {}\nstdout: {text}\nstderr: {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    text
}

/// The device's last report line, after SIGTERM.
fn stop_and_report(mut device: Proc) -> String {
    device.stop();
    let stderr = device.stderr();
    stderr
        .lines()
        .rfind(|line| line.contains("device stopped"))
        .unwrap_or_else(|| panic!("no final report line:\n{stderr}"))
        .to_owned()
}

/// The number after `label ` in `line`.
fn count_after(line: &str, label: &str) -> u64 {
    let at = line
        .find(label)
        .unwrap_or_else(|| panic!("no {label:?} in {line}"));
    line[at + label.len()..]
        .trim_start()
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|digits| digits.parse().ok())
        .unwrap_or_else(|| panic!("no count after {label:?} in {line}"))
}

#[test]
fn other_traffic_crosses_the_in_path_device_unchanged_while_pmnet_updates_are_logged() {
    let Some(testbed) = testbed("other_traffic") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let seed = common::seed("inpath_traffic");
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let _server = start_server(&testbed, dir.path());
    let device = start_device(&testbed, dir.path());

    // PMNet: the client addresses the server; the device on the path logs and acks.
    let set = client(&testbed, &["set", "greeting", "hello"]);
    assert!(set.contains("durable in the log of device 1"), "{set}");
    assert_eq!(
        client(&testbed, &["get", "greeting"]).trim(),
        "hello (from server 1)"
    );

    // TCP: 1 MiB to the server and back, byte for byte.
    let data: Vec<u8> = (0..1 << 20).map(|_| rng.random()).collect();
    let listener = testbed
        .run_in(Host::Server, || {
            TcpListener::bind((SERVER_ADDR, 9100)).expect("listen in the server host")
        })
        .unwrap();
    let echo = std::thread::spawn(move || {
        let (mut stream, peer) = listener.accept().unwrap();
        let mut got = vec![0u8; 1 << 20];
        stream.read_exact(&mut got).unwrap();
        stream.write_all(&got).unwrap();
        peer
    });
    let back = testbed
        .run_in(Host::Client, || {
            let mut stream = TcpStream::connect((SERVER_ADDR, 9100)).unwrap();
            stream
                .set_read_timeout(Some(Duration::from_secs(30)))
                .unwrap();
            stream.write_all(&data).unwrap();
            let mut back = vec![0u8; data.len()];
            stream.read_exact(&mut back).unwrap();
            back
        })
        .unwrap();
    let peer = echo.join().unwrap();
    assert_eq!(peer.ip(), pmnet_testbed::CLIENT_ADDR, "routed, not proxied");
    assert!(back == data, "the TCP transfer came back changed");

    // UDP that is not PMNet's (another port): every datagram intact, from the client's address.
    let receiver = testbed
        .run_in(Host::Server, || {
            UdpSocket::bind((SERVER_ADDR, 9200)).unwrap()
        })
        .unwrap();
    receiver
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let datagrams: Vec<Vec<u8>> = (0..200)
        .map(|_| {
            let len = rng.random_range(1..1400);
            (0..len).map(|_| rng.random()).collect()
        })
        .collect();
    // Received as they come, so the receiver's buffer is no limit.
    let expected = datagrams.clone();
    let reader = std::thread::spawn(move || {
        let mut buffer = [0u8; 2048];
        for (index, datagram) in expected.iter().enumerate() {
            let (len, from) = receiver
                .recv_from(&mut buffer)
                .unwrap_or_else(|error| panic!("UDP datagram {index}: {error}"));
            assert_eq!(&buffer[..len], datagram.as_slice(), "UDP datagram {index}");
            assert_eq!(from.ip(), std::net::IpAddr::V4(pmnet_testbed::CLIENT_ADDR));
        }
    });
    testbed
        .run_in(Host::Client, move || {
            let socket = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).unwrap();
            for datagram in &datagrams {
                socket.send_to(datagram, (SERVER_ADDR, 9200)).unwrap();
                // Paced: a flow, not a flood (nothing on the path may drop it).
                std::thread::sleep(Duration::from_micros(200));
            }
        })
        .unwrap();
    reader.join().expect("every UDP datagram, intact");

    // ICMP, where ping is installed (scripts/test.sh installs it).
    if Command::new("ping").arg("-V").output().is_ok() {
        let output = testbed
            .command(Host::Client, "ping")
            .args(["-c", "3", "-i", "0.2", "-W", "2", &SERVER_ADDR.to_string()])
            .output()
            .expect("ping runs");
        assert!(
            output.status.success(),
            "ping through the device: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    } else {
        eprintln!("(no ping here: ICMP not checked; install iputils-ping)");
    }

    let report = stop_and_report(device);
    assert!(count_after(&report, "xdp steered") >= 2, "{report}");
    assert!(count_after(&report, "passed") >= 200, "{report}");
    assert!(count_after(&report, "frames sent") >= 2, "{report}");
    // One update, logged once (a loaded machine may make its client send it again before
    // the ack arrives: the device recognises the copy, logs nothing more and acks the copy
    // too, since the first ack may be what was lost).
    let updates = count_after(&report, "updates");
    assert!(updates >= 1, "{report}");
    assert_eq!(count_after(&report, "logged"), 1, "{report}");
    let acked = count_after(&report, "acked");
    assert!((1..=updates).contains(&acked), "{report}");
}

#[test]
fn a_killed_in_path_device_replays_its_log_to_the_server() {
    let Some(testbed) = testbed("replay") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // The server is down: the device acks the updates from its log and keeps them.
    let mut device = start_device(&testbed, dir.path());
    for index in 0..5 {
        let out = client(
            &testbed,
            &["set", &format!("k{index}"), &format!("v{index}")],
        );
        assert!(out.contains("durable in the log of device 1"), "{out}");
    }
    device.kill();
    // Restarted on its log: five entries recovered, resent once the server is there.
    let device = start_device(&testbed, dir.path());
    assert!(
        device
            .stdout()
            .iter()
            .any(|line| line.contains("5 entries recovered")),
        "{:?}",
        device.stdout()
    );
    let _server = start_server(&testbed, dir.path());
    for index in 0..5 {
        assert_eq!(
            client(&testbed, &["get", &format!("k{index}")]).trim(),
            format!("v{index} (from server 1)")
        );
    }
    let report = stop_and_report(device);
    assert_eq!(
        count_after(&report, "log"),
        0,
        "every entry acked: {report}"
    );
}

#[test]
fn hostile_frames_at_the_in_path_device_are_counted_and_dropped() {
    let Some(testbed) = testbed("hostile") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let _server = start_server(&testbed, dir.path());
    let device = start_device(&testbed, dir.path());
    let seed = common::seed("inpath_hostile");
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    // Garbage datagrams to the server's PMNet port (steered to the device): random bytes, a
    // PMNet header with a bad CRC, truncated headers.
    let target = SocketAddr::V4(SocketAddrV4::new(SERVER_ADDR, SERVER_PORT));
    let garbage: Vec<Vec<u8>> = (0..300)
        .map(|index| {
            let len = match index % 3 {
                0 => rng.random_range(0..64),
                1 => rng.random_range(64..1400),
                _ => pmnet_wire::HEADER_LEN,
            };
            (0..len).map(|_| rng.random()).collect()
        })
        .collect();
    testbed
        .run_in(Host::Client, move || {
            let socket = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).unwrap();
            for datagram in &garbage {
                let _ = socket.send_to(datagram, target);
            }
        })
        .unwrap();
    // A datagram from the client's side claiming to come from the server (a forged
    // server-ACK would free the device's log entries): the reverse-path check drops it.
    let spoofed = testbed
        .run_in(Host::Client, || {
            send_spoofed(SERVER_ADDR, SERVER_PORT, target, b"forged")
        })
        .unwrap();
    assert!(spoofed, "a raw socket could send the spoofed datagram");
    // Still serving.
    let set = client(&testbed, &["set", "after", "garbage"]);
    assert!(set.contains("durable in the log of device 1"), "{set}");
    let report = stop_and_report(device);
    assert!(count_after(&report, "xdp steered") >= 300, "{report}");
    assert!(count_after(&report, "dropped") >= 250, "{report}");
    // The one genuine update, logged once (a retransmission of it, when the client's timer
    // fires first on a loaded host, is received too and recognised): no garbage was taken
    // for an update.
    assert_eq!(count_after(&report, " logged "), 1, "{report}");
    assert!(
        report.contains("bad_frame_source_on_another_port=1"),
        "{report}"
    );
}

/// Send one UDP datagram with source `src:src_port` to `to` through a raw socket (the kernel
/// fills in the IPv4 checksum and length); whether it went.
fn send_spoofed(src: Ipv4Addr, src_port: u16, to: SocketAddr, payload: &[u8]) -> bool {
    let SocketAddr::V4(to) = to else {
        return false;
    };
    let mut packet = vec![0u8; 28];
    packet[0] = 0x45;
    packet[6] = 0x40; // don't fragment
    packet[8] = 64;
    packet[9] = 17; // UDP
    packet[12..16].copy_from_slice(&src.octets());
    packet[16..20].copy_from_slice(&to.ip().octets());
    packet[20..22].copy_from_slice(&src_port.to_be_bytes());
    packet[22..24].copy_from_slice(&to.port().to_be_bytes());
    packet[24..26].copy_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    packet.extend_from_slice(payload);
    // SAFETY: a raw socket made, used with a buffer and address of the right sizes, closed.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_RAW);
        if fd < 0 {
            return false;
        }
        let addr = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: 0,
            sin_addr: libc::in_addr {
                s_addr: u32::from(*to.ip()).to_be(),
            },
            sin_zero: [0; 8],
        };
        let sent = libc::sendto(
            fd,
            packet.as_ptr().cast(),
            packet.len(),
            0,
            (&addr as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        );
        libc::close(fd);
        sent == packet.len() as isize
    }
}

#[test]
fn where_af_xdp_cannot_run_the_device_says_so_and_serves_on_its_udp_socket() {
    // Run the device as an unprivileged user (setpriv, from util-linux): AF_XDP needs
    // CAP_NET_ADMIN and CAP_BPF, so it must fall back, saying why, and still serve.
    let is_root = unsafe { libc::geteuid() } == 0;
    if !is_root || Command::new("setpriv").arg("--version").output().is_err() {
        eprintln!("SKIP: needs root (to drop privileges with setpriv) and setpriv");
        return;
    }
    let listen = common::free_udp_addr().to_string();
    let mut command = Command::new("setpriv");
    command.args([
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        pmnet_bin(),
        "device",
        "--listen",
        &listen,
        "--server",
        "1=127.0.0.1:9",
        "--no-log",
        "--xdp",
        "lo",
    ]);
    let mut device = Proc::spawn_command("unprivileged device", command);
    let line = device.wait_for_line("the datapath line", |line| line.contains("datapath: "));
    assert!(
        line.contains("UDP socket") && line.contains("AF_XDP is not available"),
        "{line}"
    );
    assert!(line.contains("CAP_BPF"), "says what is missing: {line}");
    device.wait_for_line("the end of the banner", |line| line.contains("metrics: "));
    device.stop();
    assert!(device
        .stderr()
        .contains("serving on the UDP socket instead"));
}

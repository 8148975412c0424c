//! The testbed for real: namespaces, links and routes made with `ip`, traffic between the
//! client and the server through the device. Needs root and iproute2; skips (saying why)
//! without them. Each test uses a testbed name of its own, so they run in parallel.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

use pmnet_testbed::{Host, Testbed, TestbedError, CLIENT_ADDR, SERVER_ADDR};

/// A testbed name unique to this process and test.
fn unique(test: &str) -> String {
    format!("tb{}-{test}", std::process::id())
}

/// Whether testbeds can be built here; if not, say why the test is skipped.
fn available(test: &str) -> bool {
    match pmnet_testbed::available() {
        Ok(()) => true,
        Err(error) => {
            eprintln!("skipping {test}: no testbed on this machine: {error}");
            false
        }
    }
}

fn namespaces_of(name: &str) -> Vec<String> {
    let prefix = format!("{name}-");
    pmnet_testbed::netns_list()
        .unwrap()
        .into_iter()
        .filter(|netns| netns.starts_with(&prefix))
        .collect()
}

#[test]
fn client_reaches_server_through_the_device() {
    if !available("client_reaches_server_through_the_device") {
        return;
    }
    let testbed = Testbed::guard(&unique("traffic")).unwrap();
    let server_mac = testbed.mac(Host::Server, "eth0").unwrap();
    let device_mac = testbed.mac(Host::Device, "sv").unwrap();
    assert_ne!(server_mac, device_mac);

    // UDP: a datagram from the client arrives at the server from the client's own address,
    // routed (not translated) by the device.
    let server = testbed
        .run_in(Host::Server, || UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)))
        .unwrap()
        .unwrap();
    server
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let port = server.local_addr().unwrap().port();
    let client = testbed
        .run_in(Host::Client, || UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)))
        .unwrap()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut buffer = [0; 64];
    let (len, from) = loop {
        // Resent until it arrives: the first may wait on ARP.
        client
            .send_to(b"through the device", (SERVER_ADDR, port))
            .unwrap();
        match server.recv_from(&mut buffer) {
            Ok(received) => break received,
            Err(error) if Instant::now() < deadline => {
                eprintln!("no datagram yet ({error}); sending again")
            }
            Err(error) => panic!("no datagram reached the server in 10 s: {error}"),
        }
    };
    assert_eq!(&buffer[..len], b"through the device");
    assert_eq!(
        from,
        SocketAddr::from((CLIENT_ADDR, client.local_addr().unwrap().port()))
    );
    // The server's address exists only in its namespace.
    assert!(UdpSocket::bind((SERVER_ADDR, 0)).is_err());

    // TCP: 1 MiB from the client to the server, byte for byte.
    let data: Vec<u8> = (0..1 << 20).map(|i: u32| (i * 7 + i / 251) as u8).collect();
    let listener = testbed
        .run_in(Host::Server, || {
            TcpListener::bind((Ipv4Addr::UNSPECIFIED, 0))
        })
        .unwrap()
        .unwrap();
    let port = listener.local_addr().unwrap().port();
    let receiver = std::thread::spawn(move || {
        let (mut stream, peer) = listener.accept().unwrap();
        let mut received = Vec::new();
        stream.read_to_end(&mut received).unwrap();
        (peer, received)
    });
    // This thread moves into the client's namespace with enter (the other way in).
    let sent = std::thread::scope(|scope| {
        scope
            .spawn(|| {
                testbed.enter(Host::Client).unwrap();
                let mut stream = TcpStream::connect_timeout(
                    &(SERVER_ADDR, port).into(),
                    Duration::from_secs(10),
                )
                .unwrap();
                stream.write_all(&data).unwrap();
                stream.local_addr().unwrap()
            })
            .join()
            .unwrap()
    });
    let (peer, received) = receiver.join().unwrap();
    assert_eq!(peer, sent);
    assert_eq!(peer.ip(), CLIENT_ADDR);
    assert_eq!(received.len(), data.len());
    assert!(
        received == data,
        "the bytes received differ from those sent"
    );
}

#[test]
fn up_is_idempotent_and_down_removes_everything() {
    if !available("up_is_idempotent_and_down_removes_everything") {
        return;
    }
    let name = unique("updown");
    let guard = Testbed::guard(&name).unwrap();
    assert!(Testbed::exists(&name));
    let mut expected = vec![
        format!("{name}-c"),
        format!("{name}-d"),
        format!("{name}-s"),
    ];
    let mut found = namespaces_of(&name);
    found.sort();
    expected.sort();
    assert_eq!(found, expected);

    // Up again: the same testbed, reused (the same MAC addresses: nothing was rebuilt).
    let again = Testbed::up(&name).unwrap();
    assert_eq!(again, *guard);
    assert_eq!(Testbed::open(&name).unwrap(), *guard);

    // Commands run in a host's namespace.
    let output = guard
        .command(Host::Device, "ip")
        .args(["-o", "-4", "addr"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success());
    assert!(
        text.contains("10.77.1.1/24") && text.contains("10.77.2.1/24"),
        "{text}"
    );

    drop(guard);
    assert!(!Testbed::exists(&name));
    assert!(namespaces_of(&name).is_empty());
    assert!(matches!(
        Testbed::open(&name),
        Err(TestbedError::NotUp { .. })
    ));
    // Down again: nothing to do, no error.
    Testbed::down(&name).unwrap();
}

#[test]
fn a_half_built_testbed_is_rebuilt() {
    if !available("a_half_built_testbed_is_rebuilt") {
        return;
    }
    let name = unique("half");
    let first = Testbed::guard(&name).unwrap();

    // An interface gone: open says what is missing, up rebuilds.
    let status = first
        .command(Host::Device, "ip")
        .args(["link", "delete", "sv"])
        .status()
        .unwrap();
    assert!(status.success());
    let problem = Testbed::open(&name).unwrap_err();
    assert!(
        matches!(problem, TestbedError::Incomplete { .. }),
        "{problem}"
    );
    let rebuilt = Testbed::up(&name).unwrap();
    assert_ne!(
        rebuilt.mac(Host::Server, "eth0"),
        first.mac(Host::Server, "eth0")
    );

    // A namespace gone: the same.
    let status = std::process::Command::new("ip")
        .args(["netns", "delete", &format!("{name}-c")])
        .status()
        .unwrap();
    assert!(status.success());
    let problem = Testbed::open(&name).unwrap_err().to_string();
    assert!(
        problem.contains(&format!("{name}-c is missing")),
        "{problem}"
    );
    Testbed::up(&name).unwrap();
    assert!(Testbed::open(&name).is_ok());

    // The device's forwarding turned off: the same.
    let status = first
        .command(Host::Device, "sh")
        .args(["-c", "echo 0 > /proc/sys/net/ipv4/ip_forward"])
        .status()
        .unwrap();
    assert!(status.success());
    let problem = Testbed::open(&name).unwrap_err().to_string();
    assert!(problem.contains("does not forward"), "{problem}");
    Testbed::up(&name).unwrap();
    drop(first);
    assert!(!Testbed::exists(&name));
}

#[test]
fn bad_names_are_refused() {
    for name in ["", "a/b", "-x"] {
        let error = Testbed::up(name).unwrap_err();
        assert!(
            matches!(error, TestbedError::InvalidName { .. }),
            "{name:?}: {error}"
        );
    }
}

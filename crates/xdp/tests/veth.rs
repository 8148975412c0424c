//! End to end on a veth pair between two network namespaces of its own: the XDP program in
//! native mode steers one (address, port) to an AF_XDP socket and passes everything else to the
//! kernel; a frame written with `write_udp` and sent on the socket reaches a kernel UDP socket.
//!
//! Needs root and `ip`; skips (passing, with a message) without them or when the kernel refuses
//! XDP or AF_XDP.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::time::{Duration, Instant};

mod common;

use common::{in_netns, skip_reason, Pair, A_IP, B_IP, KERNEL_PORT, STEERED_PORT};
use pmnet_xdp::frame::{parse_udp, write_udp};
use pmnet_xdp::{AttachMode, Steering, Umem, XdpError, XskConfig, XskSocket};

/// Waits up to `timeout` for a steered frame whose payload is `payload`; returns its source.
fn receive_on_xsk(
    socket: &mut XskSocket,
    payload: &[u8],
    timeout: Duration,
) -> Option<SocketAddrV4> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        let mut pfd = libc::pollfd {
            fd: socket.raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut pfd, 1, 50) };
        let n = socket.receive_batch(64);
        for i in 0..n {
            let frame = socket.received(i).unwrap();
            match parse_udp(frame) {
                Ok(udp) if udp.payload == payload => {
                    assert_eq!(*udp.dst.ip(), A_IP);
                    assert_eq!(udp.dst.port(), STEERED_PORT);
                    let src = udp.src;
                    socket.release_batch();
                    return Some(src);
                }
                Ok(udp) => eprintln!("xsk: other datagram to {}", udp.dst),
                Err(e) => eprintln!("xsk: unparsed frame ({e}), {} bytes", frame.len()),
            }
        }
        socket.release_batch();
    }
    None
}

/// One ICMP echo from a raw socket (created in the caller's namespace) to `to`.
fn ping(to: Ipv4Addr) -> Result<Duration, String> {
    // SAFETY: plain socket calls on a descriptor we own and close.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_ICMP);
        if fd < 0 {
            return Err(format!("raw socket: {}", std::io::Error::last_os_error()));
        }
        let timeout = libc::timeval {
            tv_sec: 2,
            tv_usec: 0,
        };
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&timeout as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        );
        let ident = (std::process::id() & 0xffff) as u16;
        let mut echo = [
            8u8,
            0,
            0,
            0,
            (ident >> 8) as u8,
            ident as u8,
            0,
            1,
            b'p',
            b'm',
            b'n',
            b't',
        ];
        let mut sum: u32 = echo
            .chunks(2)
            .map(|w| u16::from_be_bytes([w[0], w[1]]) as u32)
            .sum();
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        echo[2..4].copy_from_slice(&(!(sum as u16)).to_be_bytes());
        let addr = libc::sockaddr_in {
            sin_family: libc::AF_INET as u16,
            sin_port: 0,
            sin_addr: libc::in_addr {
                s_addr: u32::from(to).to_be(),
            },
            sin_zero: [0; 8],
        };
        let start = Instant::now();
        let sent = libc::sendto(
            fd,
            echo.as_ptr().cast(),
            echo.len(),
            0,
            (&addr as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        );
        let mut result = Err(format!("sendto: {}", std::io::Error::last_os_error()));
        if sent == echo.len() as isize {
            result = Err("no echo reply within 2 s".into());
            let mut buf = [0u8; 256];
            while start.elapsed() < Duration::from_secs(2) {
                let got = libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0);
                if got < 28 {
                    break;
                }
                let ihl = (buf[0] & 0x0f) as usize * 4;
                let icmp = &buf[ihl..got as usize];
                if icmp.len() >= 8 && icmp[0] == 0 && icmp[4..6] == echo[4..6] {
                    result = Ok(start.elapsed());
                    break;
                }
            }
        }
        libc::close(fd);
        result
    }
}

#[test]
fn steers_passes_and_transmits_on_veth() {
    if let Some(why) = skip_reason() {
        eprintln!("SKIPPED veth XDP test: {why}");
        return;
    }
    let pair = Pair::create("n").expect("create the namespaces and veth pair");
    let mac_a = Pair::mac(&pair.ns_a, &pair.dev_a);
    let mac_b = Pair::mac(&pair.ns_b, &pair.dev_b);
    let steered = SocketAddrV4::new(A_IP, STEERED_PORT);

    // The other side: kernel UDP sockets in namespace B, which writes full UDP checksums.
    let (b_sender, b_receiver) = in_netns(&pair.ns_b, || {
        pmnet_xdp::set_tx_checksum_offload(&pair.dev_b, false).unwrap();
        let sender = UdpSocket::bind((B_IP, 0)).unwrap();
        let receiver = UdpSocket::bind((B_IP, 9000)).unwrap();
        receiver
            .set_read_timeout(Some(Duration::from_secs(3)))
            .unwrap();
        (sender, receiver)
    });

    in_netns(&pair.ns_a, || {
        let mut steering = match Steering::attach(&pair.dev_a, AttachMode::Native) {
            Ok(steering) => steering,
            Err(e @ (XdpError::Attach { .. } | XdpError::Load(_) | XdpError::Unsupported(_))) => {
                eprintln!("SKIPPED veth XDP test: the kernel refused XDP: {e}");
                return;
            }
            Err(e) => panic!("attach: {e}"),
        };
        assert!(Pair::xdp_attached(&pair.ns_a, &pair.dev_a));
        let umem = Umem::anonymous(1024, 2048).unwrap();
        let config = XskConfig {
            queue: 0,
            rx_ring: 512,
            tx_ring: 512,
            fill_ring: 512,
            completion_ring: 512,
            zero_copy: true, // veth cannot: falls back to copy mode
            busy_poll: true,
            ..XskConfig::default()
        };
        let mut socket = match XskSocket::open(&pair.dev_a, umem, config) {
            Ok(socket) => socket,
            Err(e @ XdpError::Unsupported(_)) => {
                eprintln!("SKIPPED veth XDP test: the kernel refused AF_XDP: {e}");
                return;
            }
            Err(e) => panic!("open AF_XDP socket: {e}"),
        };
        eprintln!(
            "AF_XDP on veth, native XDP: zero_copy={} busy_poll={:?} tx_free={}",
            socket.zero_copy(),
            socket.busy_poll(),
            socket.tx_free()
        );
        steering.register(0, &socket).unwrap();
        steering.steer(steered).unwrap();
        let kernel = UdpSocket::bind((A_IP, KERNEL_PORT)).unwrap();
        kernel
            .set_read_timeout(Some(Duration::from_secs(3)))
            .unwrap();

        // 1. A datagram to the steered destination arrives on the AF_XDP socket.
        let payload = b"steered to the AF_XDP socket".to_vec();
        b_sender.send_to(&payload, steered).unwrap();
        let src = receive_on_xsk(&mut socket, &payload, Duration::from_secs(3))
            .expect("the steered datagram on the AF_XDP socket");
        assert_eq!(SocketAddr::V4(src), b_sender.local_addr().unwrap());

        // 2. One to another port goes to the kernel's UDP socket.
        b_sender
            .send_to(b"to the kernel", (A_IP, KERNEL_PORT))
            .unwrap();
        let mut buf = [0u8; 64];
        let (n, from) = kernel.recv_from(&mut buf).expect("the passed datagram");
        assert_eq!(&buf[..n], b"to the kernel");
        assert_eq!(from, b_sender.local_addr().unwrap());

        // 3. ICMP still works (from B to A, answered by A's kernel).
        let rtt = in_netns(&pair.ns_b, || ping(A_IP)).expect("ping through the XDP program");
        eprintln!("ping through the XDP program: {rtt:?}");

        // 4. A frame written with write_udp and sent on the socket reaches B's kernel.
        socket
            .transmit_with(|buf| {
                let to = SocketAddrV4::new(B_IP, 9000);
                write_udp(
                    buf,
                    mac_a,
                    mac_b,
                    steered,
                    to,
                    64,
                    b"from the AF_XDP socket",
                )
                .unwrap()
            })
            .unwrap();
        socket.flush();
        let (n, from) = b_receiver
            .recv_from(&mut buf)
            .expect("the transmitted frame");
        assert_eq!(&buf[..n], b"from the AF_XDP socket");
        assert_eq!(from, SocketAddr::V4(steered));
        let deadline = Instant::now() + Duration::from_secs(2);
        while socket.stats().sent == 0 && Instant::now() < deadline {
            socket.flush();
            std::thread::sleep(Duration::from_millis(5));
        }

        let counters = steering.counters();
        let stats = socket.stats();
        eprintln!("program counters {counters:?}; socket stats {stats:?}");
        assert!(counters.steered >= 1, "{counters:?}");
        assert!(counters.passed >= 2, "{counters:?}"); // the kernel datagram, ICMP, ARP
        assert!(stats.received >= 1 && stats.sent == 1, "{stats:?}");
        assert_eq!(
            socket.tx_in_flight(),
            0,
            "the sent frame is back in the pool"
        );

        // Dropping the steering detaches the program.
        drop(steering);
        assert!(
            !Pair::xdp_attached(&pair.ns_a, &pair.dev_a),
            "detached on drop"
        );
    });
}

#[test]
fn replaces_a_leftover_program_and_runs_in_generic_mode() {
    if let Some(why) = skip_reason() {
        eprintln!("SKIPPED veth XDP test: {why}");
        return;
    }
    let pair = Pair::create("g").expect("create the namespaces and veth pair");
    let b_sender = in_netns(&pair.ns_b, || {
        pmnet_xdp::set_tx_checksum_offload(&pair.dev_b, false).unwrap();
        UdpSocket::bind((B_IP, 0)).unwrap()
    });
    in_netns(&pair.ns_a, || {
        // A program attached through netlink and then abandoned, as by a killed process.
        pmnet_xdp::testing::attach_unowned(&pair.dev_a, AttachMode::Generic).unwrap();
        assert!(Pair::xdp_attached(&pair.ns_a, &pair.dev_a));
        let mut steering = Steering::attach(&pair.dev_a, AttachMode::Generic)
            .expect("replaces the leftover pmnet_steer program");
        let umem = Umem::anonymous(64, 4096).unwrap();
        let mut socket = XskSocket::open(&pair.dev_a, umem, XskConfig::default()).unwrap();
        assert!(!socket.zero_copy());
        steering.register(0, &socket).unwrap();
        steering
            .steer(SocketAddrV4::new(A_IP, STEERED_PORT))
            .unwrap();
        b_sender
            .send_to(b"generic mode", (A_IP, STEERED_PORT))
            .unwrap();
        receive_on_xsk(&mut socket, b"generic mode", Duration::from_secs(3))
            .expect("the steered datagram in generic mode");
        assert!(steering.counters().steered >= 1);

        // Another process's live attachment is not replaced.
        let second = Steering::attach(&pair.dev_a, AttachMode::Generic);
        assert!(matches!(second, Err(XdpError::Busy { .. })), "{second:?}");
        drop(steering);
        assert!(!Pair::xdp_attached(&pair.ns_a, &pair.dev_a));
    });
}

//! The low-level layer on a veth pair, as the packet store uses it: the caller owns every
//! frame, the UMEM is a shared file mapping (as the store's persistent region), in aligned and
//! in unaligned chunk mode (buffers posted at any address; the frame lands 256 bytes in).
//!
//! Needs root and `ip`; skips (passing, with a message) without them or when the kernel refuses
//! XDP or AF_XDP.

use std::net::{SocketAddr, SocketAddrV4, UdpSocket};
use std::time::{Duration, Instant};

mod common;

use common::{in_netns, skip_reason, Pair, A_IP, B_IP, STEERED_PORT};
use pmnet_xdp::frame::{parse_udp, write_udp};
use pmnet_xdp::{AttachMode, Steering, Umem, XdpError, XskConfig, XskSocket};

/// A shared file mapping, as the packet store's persistent region (a memfd here).
struct SharedRegion {
    ptr: *mut u8,
    len: usize,
}

impl SharedRegion {
    fn new(len: usize) -> SharedRegion {
        // SAFETY: plain calls; the mapping is checked and the fd closed (the mapping keeps the
        // file alive).
        unsafe {
            let fd = libc::memfd_create(c"pmnet-xdp-test".as_ptr(), libc::MFD_CLOEXEC);
            assert!(fd >= 0);
            assert_eq!(libc::ftruncate(fd, len as libc::off_t), 0);
            let ptr = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            );
            assert_ne!(ptr, libc::MAP_FAILED);
            libc::close(fd);
            SharedRegion {
                ptr: ptr.cast(),
                len,
            }
        }
    }
}

impl SharedRegion {
    fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    fn len(&self) -> usize {
        self.len
    }
}

// SAFETY: a plain shared mapping, used by one thread at a time.
unsafe impl Send for SharedRegion {}
// SAFETY: as above.
unsafe impl Sync for SharedRegion {}

impl Drop for SharedRegion {
    fn drop(&mut self) {
        // SAFETY: unmaps what `new` mapped, after every user (declared later) is gone.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

#[test]
fn raw_layer_over_a_shared_file_mapping() {
    if let Some(why) = skip_reason() {
        eprintln!("SKIPPED veth XDP test: {why}");
        return;
    }
    let pair = Pair::create("r").expect("create the namespaces and veth pair");
    let mac_b = Pair::mac(&pair.ns_b, &pair.dev_b);
    let (b_sender, b_receiver) = in_netns(&pair.ns_b, || {
        pmnet_xdp::set_tx_checksum_offload(&pair.dev_b, false).unwrap();
        let receiver = UdpSocket::bind((B_IP, 9001)).unwrap();
        receiver
            .set_read_timeout(Some(Duration::from_secs(3)))
            .unwrap();
        (UdpSocket::bind((B_IP, 0)).unwrap(), receiver)
    });
    let region = SharedRegion::new(64 * 4096);
    in_netns(&pair.ns_a, || {
        // Errors name the interface and the cause.
        let missing = Steering::attach("pmxnosuchdev0", AttachMode::Native).unwrap_err();
        assert!(matches!(missing, XdpError::NoSuchInterface(_)), "{missing}");
        let lo = Steering::attach("lo", AttachMode::Native).unwrap_err();
        assert!(
            matches!(lo, XdpError::Attach { .. }) && lo.to_string().contains("lo"),
            "{lo}"
        );
        eprintln!("native XDP on lo: {lo}");
        let umem = Umem::anonymous(8, 2048).unwrap();
        let config = XskConfig {
            queue: 5,
            ..XskConfig::default()
        };
        let bad_queue = XskSocket::open(&pair.dev_a, umem, config).unwrap_err();
        assert!(
            matches!(bad_queue, XdpError::InvalidConfig(_)),
            "{bad_queue}"
        );
        eprintln!("queue 5 of a veth: {bad_queue}");

        let mut steering = Steering::attach(&pair.dev_a, AttachMode::Native).unwrap();
        // SAFETY: `region` outlives the socket and nothing else touches it meanwhile.
        let umem = unsafe { Umem::over(region.ptr(), region.len(), 4096) }.unwrap();
        let mut socket = XskSocket::open_raw(&pair.dev_a, umem, XskConfig::default()).unwrap();
        assert_eq!(socket.tx_free(), 0, "no pool: the caller owns the frames");
        steering.register(0, &socket).unwrap();
        steering
            .steer(SocketAddrV4::new(A_IP, STEERED_PORT))
            .unwrap();
        // Frames 0..32 receive, frame 40 transmits.
        let rx_frames: Vec<u64> = (0..32)
            .map(|i| socket.umem().frame_addr(i).unwrap())
            .collect();
        assert_eq!(socket.fill(&rx_frames), 32);

        b_sender
            .send_to(b"into the region", (A_IP, STEERED_PORT))
            .unwrap();
        let mut descs = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(3);
        while descs.is_empty() && Instant::now() < deadline {
            socket.receive_descs(&mut descs, 16);
            std::thread::sleep(Duration::from_millis(1));
        }
        let &(addr, len) = descs.first().expect("a descriptor");
        assert!(addr < 32 * 4096, "landed in a posted frame");
        let frame = socket.umem().frame(addr, len as usize).unwrap();
        let udp = parse_udp(frame).unwrap();
        assert_eq!(udp.payload, b"into the region");
        // The bytes are in the caller's mapping itself.
        // SAFETY: inside the region; the frame is ours until posted again.
        let direct =
            unsafe { std::slice::from_raw_parts(region.ptr().add(addr as usize), len as usize) };
        assert_eq!(direct, frame);
        let src_mac = udp.dst_mac;

        let tx = socket.umem().frame_addr(40).unwrap();
        let buf = socket.umem_mut().frame_mut(tx, 4096).unwrap();
        let to = SocketAddrV4::new(B_IP, 9001);
        let from = SocketAddrV4::new(A_IP, STEERED_PORT);
        let n = write_udp(buf, src_mac, mac_b, from, to, 64, b"raw transmit").unwrap();
        assert_eq!(socket.transmit_descs(&[(tx, n as u32)]), 1);
        let mut buf = [0u8; 64];
        let (got, source) = b_receiver.recv_from(&mut buf).expect("the raw frame");
        assert_eq!(&buf[..got], b"raw transmit");
        assert_eq!(source, SocketAddr::V4(from));
        let mut done = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(2);
        while done.is_empty() && Instant::now() < deadline {
            socket.completions(&mut done, 16);
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(done, vec![tx], "the sent frame comes back");
        assert_eq!(socket.fill(&[addr]), 1, "the received frame goes back");
        drop(socket);
        drop(steering);
    });
}

/// Takes descriptors until one arrives or 3 s pass.
fn wait_descs(socket: &mut XskSocket) -> Vec<(u64, u32)> {
    let mut descs = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(3);
    while descs.is_empty() && Instant::now() < deadline {
        socket.receive_descs(&mut descs, 16);
        std::thread::sleep(Duration::from_millis(1));
    }
    descs
}

#[test]
fn unaligned_chunks_land_where_posted() {
    if let Some(why) = skip_reason() {
        eprintln!("SKIPPED veth XDP test: {why}");
        return;
    }
    let pair = Pair::create("u").expect("create the namespaces and veth pair");
    let b_sender = in_netns(&pair.ns_b, || {
        pmnet_xdp::set_tx_checksum_offload(&pair.dev_b, false).unwrap();
        UdpSocket::bind((B_IP, 0)).unwrap()
    });
    let region = SharedRegion::new(16 * 4096);
    in_netns(&pair.ns_a, || {
        let mut steering = Steering::attach(&pair.dev_a, AttachMode::Native).unwrap();
        // Chunks of 2600 bytes (not a power of two) at odd places.
        // SAFETY: `region` outlives the socket and nothing else touches it meanwhile.
        let umem = unsafe { Umem::over_unaligned(region.ptr(), region.len(), 2600) }.unwrap();
        let pooled = XskSocket::open(&pair.dev_a, umem, XskConfig::default()).unwrap_err();
        assert!(matches!(pooled, XdpError::InvalidUmem(_)), "{pooled}");
        // SAFETY: as above (the refused UMEM is gone).
        let umem = unsafe { Umem::over_unaligned(region.ptr(), region.len(), 2600) }.unwrap();
        let mut socket = XskSocket::open_raw(&pair.dev_a, umem, XskConfig::default()).unwrap();
        steering.register(0, &socket).unwrap();
        steering
            .steer(SocketAddrV4::new(A_IP, STEERED_PORT))
            .unwrap();
        let posted = 4096 * 3 + 1234;
        assert_eq!(socket.fill(&[posted]), 1);
        b_sender
            .send_to(b"unaligned", (A_IP, STEERED_PORT))
            .unwrap();
        let descs = wait_descs(&mut socket);
        let &(addr, len) = descs.first().expect("a descriptor");
        assert_eq!(
            addr,
            posted + 256,
            "the frame lands XDP_PACKET_HEADROOM into the chunk"
        );
        let udp = parse_udp(socket.umem().frame(addr, len as usize).unwrap()).unwrap();
        assert_eq!(udp.payload, b"unaligned");
        // The same buffer again, then the next datagram lands there too.
        assert_eq!(socket.fill(&[posted]), 1);
        b_sender.send_to(b"again", (A_IP, STEERED_PORT)).unwrap();
        let descs = wait_descs(&mut socket);
        assert_eq!(descs.first().map(|d| d.0), Some(posted + 256));
        // A buffer whose chunk would pass the end is not posted.
        assert_eq!(socket.fill(&[region.len() as u64 - 100]), 1);
        assert_eq!(socket.stats().kernel.unwrap().rx_invalid_descs, 0);
    });
}

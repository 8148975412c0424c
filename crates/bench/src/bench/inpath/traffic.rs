//! Traffic that is not PMNet's, across the router of the testbed: a UDP flow on another port
//! (a sender thread in the client's namespace blasting fixed-size datagrams with sendmmsg, a
//! receiver thread in the server's counting them with recvmmsg) and a TCP bulk transfer (one
//! connection, the client writing 256 KiB chunks, the server reading and counting bytes).
//!
//! Both run for the warm-up and the measured stretch; the counters are read at the stretch's
//! two ends by [`super::meter::measure`], with the CPU readings.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use pmnet_testbed::{Host, Testbed, SERVER_ADDR};

/// The UDP flow's port on the server host (not PMNet's: the XDP program passes it).
pub const UDP_PORT: u16 = 9300;
/// The TCP transfer's port on the server host.
pub const TCP_PORT: u16 = 9301;
/// Datagrams per sendmmsg / recvmmsg call.
const BATCH: usize = 32;
/// Bytes per write and read of the TCP transfer.
const CHUNK: usize = 256 << 10;
/// Socket buffers asked for (SO_RCVBUFFORCE / SO_SNDBUFFORCE: root ignores the sysctl caps).
const SOCKET_BUFFER: libc::c_int = 8 << 20;
/// How often a blocked thread looks at the stop flag.
const POLL: Duration = Duration::from_millis(100);

/// Counters a flow's threads advance as they go.
#[derive(Debug, Default)]
pub struct FlowCounters {
    /// Datagrams (UDP) or bytes (TCP) sent.
    pub sent: AtomicU64,
    /// Datagrams (UDP) or bytes (TCP) received at the server host.
    pub received: AtomicU64,
    /// Set to stop both threads.
    pub stop: AtomicBool,
    /// The first error a thread met.
    pub error: std::sync::Mutex<Option<String>>,
}

impl FlowCounters {
    fn fail(&self, error: String) {
        let mut slot = self.error.lock().unwrap_or_else(|e| e.into_inner());
        slot.get_or_insert(error);
        self.stop.store(true, Ordering::Relaxed);
    }

    pub fn error(&self) -> Option<String> {
        self.error.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

fn set_buffer(fd: libc::c_int, option: libc::c_int) {
    // SAFETY: setsockopt on a socket we own with a c_int value that lives across the call.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            option,
            (&SOCKET_BUFFER as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

/// The UDP flow's two sockets: the receiver bound on the server host, the sender on the
/// client host connected to it.
pub fn udp_sockets(testbed: &Testbed) -> Result<(UdpSocket, UdpSocket), String> {
    let receiver = testbed
        .run_in(Host::Server, || UdpSocket::bind((SERVER_ADDR, UDP_PORT)))
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("UDP receiver on {SERVER_ADDR}:{UDP_PORT}: {e}"))?;
    set_buffer(receiver.as_raw_fd(), libc::SO_RCVBUFFORCE);
    receiver
        .set_read_timeout(Some(POLL))
        .map_err(|e| e.to_string())?;
    let sender = testbed
        .run_in(Host::Client, || {
            let socket = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?;
            socket.connect((SERVER_ADDR, UDP_PORT))?;
            Ok::<_, std::io::Error>(socket)
        })
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("UDP sender in the client host: {e}"))?;
    set_buffer(sender.as_raw_fd(), libc::SO_SNDBUFFORCE);
    Ok((sender, receiver))
}

/// Send `len`-byte datagrams as fast as sendmmsg takes them until told to stop.
pub fn udp_send(socket: &UdpSocket, len: usize, counters: &FlowCounters) {
    let mut payload = vec![0x5a_u8; len];
    let mut iovecs: Vec<libc::iovec> = (0..BATCH)
        .map(|_| libc::iovec {
            iov_base: payload.as_mut_ptr().cast(),
            iov_len: len,
        })
        .collect();
    // SAFETY: mmsghdr is plain data; zeroed is a valid empty header.
    let mut headers: Vec<libc::mmsghdr> =
        (0..BATCH).map(|_| unsafe { std::mem::zeroed() }).collect();
    for (header, iovec) in headers.iter_mut().zip(iovecs.iter_mut()) {
        header.msg_hdr.msg_iov = iovec;
        header.msg_hdr.msg_iovlen = 1;
    }
    while !counters.stop.load(Ordering::Relaxed) {
        // SAFETY: BATCH headers, each naming one iovec over `payload`, all alive across the
        // call; the socket is connected, so no address is given.
        let sent = unsafe {
            libc::sendmmsg(
                socket.as_raw_fd(),
                headers.as_mut_ptr(),
                BATCH as libc::c_uint,
                0,
            )
        };
        if sent > 0 {
            counters.sent.fetch_add(sent as u64, Ordering::Relaxed);
            continue;
        }
        let error = std::io::Error::last_os_error();
        match error.raw_os_error() {
            // The local queue is full, or the route's neighbour is being resolved: try again.
            Some(libc::ENOBUFS | libc::EAGAIN | libc::EINTR) => std::thread::yield_now(),
            // An ICMP error from an earlier datagram (nothing listening yet): go on.
            Some(libc::ECONNREFUSED) => std::thread::sleep(Duration::from_millis(1)),
            _ => return counters.fail(format!("UDP sender: sendmmsg: {error}")),
        }
    }
}

/// Count the datagrams that arrive until told to stop.
pub fn udp_receive(socket: &UdpSocket, counters: &FlowCounters) {
    let mut buffers = vec![[0u8; 2048]; BATCH];
    let mut iovecs: Vec<libc::iovec> = buffers
        .iter_mut()
        .map(|buffer| libc::iovec {
            iov_base: buffer.as_mut_ptr().cast(),
            iov_len: buffer.len(),
        })
        .collect();
    // SAFETY: mmsghdr is plain data; zeroed is a valid empty header.
    let mut headers: Vec<libc::mmsghdr> =
        (0..BATCH).map(|_| unsafe { std::mem::zeroed() }).collect();
    while !counters.stop.load(Ordering::Relaxed) {
        for (header, iovec) in headers.iter_mut().zip(iovecs.iter_mut()) {
            header.msg_hdr.msg_iov = iovec;
            header.msg_hdr.msg_iovlen = 1;
            header.msg_len = 0;
        }
        // SAFETY: BATCH headers over BATCH live buffers; no source addresses asked for. The
        // socket's receive timeout bounds the wait for the first datagram.
        let received = unsafe {
            libc::recvmmsg(
                socket.as_raw_fd(),
                headers.as_mut_ptr(),
                BATCH as libc::c_uint,
                libc::MSG_WAITFORONE,
                std::ptr::null_mut(),
            )
        };
        if received > 0 {
            counters
                .received
                .fetch_add(received as u64, Ordering::Relaxed);
            continue;
        }
        let error = std::io::Error::last_os_error();
        if !matches!(
            error.raw_os_error(),
            Some(libc::EAGAIN | libc::EINTR | libc::ETIMEDOUT)
        ) {
            return counters.fail(format!("UDP receiver: recvmmsg: {error}"));
        }
    }
}

/// The TCP transfer's two ends: the listener on the server host, and a connection to it from
/// the client host with the listener's end accepted.
pub fn tcp_streams(testbed: &Testbed) -> Result<(TcpStream, TcpStream), String> {
    let listener = testbed
        .run_in(Host::Server, || TcpListener::bind((SERVER_ADDR, TCP_PORT)))
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("TCP listener on {SERVER_ADDR}:{TCP_PORT}: {e}"))?;
    let client = testbed
        .run_in(Host::Client, || {
            TcpStream::connect_timeout(&(SERVER_ADDR, TCP_PORT).into(), Duration::from_secs(5))
        })
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("TCP connection from the client host to {SERVER_ADDR}: {e}"))?;
    let (server, _) = listener
        .accept()
        .map_err(|e| format!("TCP accept on the server host: {e}"))?;
    for stream in [&client, &server] {
        stream
            .set_read_timeout(Some(POLL))
            .map_err(|e| e.to_string())?;
        stream
            .set_write_timeout(Some(POLL))
            .map_err(|e| e.to_string())?;
    }
    Ok((client, server))
}

/// Write chunks until told to stop.
pub fn tcp_send(mut stream: &TcpStream, counters: &FlowCounters) {
    let chunk = vec![0xa5_u8; CHUNK];
    while !counters.stop.load(Ordering::Relaxed) {
        match stream.write(&chunk) {
            Ok(written) => {
                counters.sent.fetch_add(written as u64, Ordering::Relaxed);
            }
            Err(error)
                if matches!(
                    error.kind(),
                    std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                        | std::io::ErrorKind::Interrupted
                ) => {}
            Err(error) => return counters.fail(format!("TCP sender: {error}")),
        }
    }
}

/// Read and count until told to stop (or the sender closes).
pub fn tcp_receive(mut stream: &TcpStream, counters: &FlowCounters) {
    let mut buffer = vec![0u8; CHUNK];
    while !counters.stop.load(Ordering::Relaxed) {
        match stream.read(&mut buffer) {
            Ok(0) => return,
            Ok(read) => {
                counters.received.fetch_add(read as u64, Ordering::Relaxed);
            }
            Err(error)
                if matches!(
                    error.kind(),
                    std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                        | std::io::ErrorKind::Interrupted
                ) => {}
            Err(error) => return counters.fail(format!("TCP receiver: {error}")),
        }
    }
}

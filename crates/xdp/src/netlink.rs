//! Just enough rtnetlink to see which XDP programs an interface has and to detach one attached
//! the legacy way (netlink, not a bpf_link), e.g. by `ip link set dev X xdp ...` or by a
//! process that is gone. A program attached through a bpf_link cannot be detached this way (the
//! kernel answers EBUSY): it belongs to a live process.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const NETLINK_ROUTE: libc::c_int = 0;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const RTM_NEWLINK: u16 = 16;
const RTM_GETLINK: u16 = 18;
const RTM_SETLINK: u16 = 19;
const NLA_F_NESTED: u16 = 1 << 15;
const NLA_TYPE_MASK: u16 = 0x3fff;
const IFLA_XDP: u16 = 43;
const IFLA_XDP_FD: u16 = 1;
const IFLA_XDP_ATTACHED: u16 = 2;
const IFLA_XDP_FLAGS: u16 = 3;
const IFLA_XDP_PROG_ID: u16 = 4;
const IFLA_XDP_DRV_PROG_ID: u16 = 5;
const IFLA_XDP_SKB_PROG_ID: u16 = 6;
const IFLA_XDP_HW_PROG_ID: u16 = 7;
const XDP_ATTACHED_DRV: u8 = 1;
const XDP_ATTACHED_SKB: u8 = 2;
const XDP_ATTACHED_HW: u8 = 3;

/// `XDP_FLAGS_SKB_MODE` (generic).
pub(crate) const XDP_FLAGS_SKB_MODE: u32 = 1 << 1;
/// `XDP_FLAGS_DRV_MODE` (native).
pub(crate) const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;
/// `XDP_FLAGS_HW_MODE` (offloaded).
pub(crate) const XDP_FLAGS_HW_MODE: u32 = 1 << 3;

const HEADER: usize = 16; // nlmsghdr
const IFINFO: usize = 16; // ifinfomsg

/// An XDP program attached to an interface: its id and the mode flag to detach it with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Attached {
    pub id: u32,
    pub mode_flag: u32,
}

fn socket() -> io::Result<OwnedFd> {
    // SAFETY: plain socket creation.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            NETLINK_ROUTE,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// A request: header, ifinfomsg for `ifindex`, then the attribute bytes.
fn request(kind: u16, flags: u16, ifindex: u32, attrs: &[u8]) -> Vec<u8> {
    let len = HEADER + IFINFO + attrs.len();
    let mut msg = Vec::with_capacity(len);
    msg.extend_from_slice(&(len as u32).to_ne_bytes());
    msg.extend_from_slice(&kind.to_ne_bytes());
    msg.extend_from_slice(&(flags | NLM_F_REQUEST).to_ne_bytes());
    msg.extend_from_slice(&1u32.to_ne_bytes()); // sequence
    msg.extend_from_slice(&0u32.to_ne_bytes()); // port: the kernel
    msg.extend_from_slice(&[libc::AF_UNSPEC as u8, 0, 0, 0]); // family, pad, type
    msg.extend_from_slice(&(ifindex as i32).to_ne_bytes());
    msg.extend_from_slice(&0u32.to_ne_bytes()); // flags
    msg.extend_from_slice(&0u32.to_ne_bytes()); // change
    msg.extend_from_slice(attrs);
    msg
}

fn attr(kind: u16, payload: &[u8]) -> Vec<u8> {
    let len = 4 + payload.len();
    let mut out = Vec::with_capacity(align4(len));
    out.extend_from_slice(&(len as u16).to_ne_bytes());
    out.extend_from_slice(&kind.to_ne_bytes());
    out.extend_from_slice(payload);
    out.resize(align4(len), 0);
    out
}

/// Iterates the attributes in `bytes` as (type without flags, payload); stops at the first
/// malformed one.
fn attrs(mut bytes: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        let len = u16::from_ne_bytes(bytes.get(0..2)?.try_into().ok()?) as usize;
        let kind = u16::from_ne_bytes(bytes.get(2..4)?.try_into().ok()?);
        let payload = bytes.get(4..len)?;
        bytes = bytes.get(align4(len).min(bytes.len())..)?;
        Some((kind & NLA_TYPE_MASK, payload))
    })
}

/// Sends `msg` and returns the reply messages as (type, payload after the header).
fn transact(msg: &[u8]) -> io::Result<Vec<(u16, Vec<u8>)>> {
    let fd = socket()?;
    // SAFETY: `msg` is readable for its length.
    let sent = unsafe { libc::send(fd.as_raw_fd(), msg.as_ptr().cast(), msg.len(), 0) };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut buf = vec![0u8; 64 * 1024];
    // SAFETY: `buf` is writable for its length.
    let got = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
    if got < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut rest = &buf[..got as usize];
    let mut replies = Vec::new();
    while rest.len() >= HEADER {
        let len = u32::from_ne_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        let kind = u16::from_ne_bytes([rest[4], rest[5]]);
        if len < HEADER || len > rest.len() {
            break;
        }
        replies.push((kind, rest[HEADER..len].to_vec()));
        rest = &rest[align4(len).min(rest.len())..];
    }
    Ok(replies)
}

/// Turns an NLMSG_ERROR payload into a result (0 is the acknowledgement).
fn check_error(payload: &[u8]) -> io::Result<()> {
    let code = payload
        .get(0..4)
        .and_then(|b| b.try_into().ok())
        .map(i32::from_ne_bytes)
        .unwrap_or(-libc::EPROTO);
    if code == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(-code))
    }
}

/// The XDP programs attached to interface `ifindex`.
pub(crate) fn attached(ifindex: u32) -> io::Result<Vec<Attached>> {
    let replies = transact(&request(RTM_GETLINK, 0, ifindex, &[]))?;
    let mut found = Vec::new();
    for (kind, payload) in replies {
        match kind {
            NLMSG_ERROR => check_error(&payload)?,
            NLMSG_DONE => break,
            RTM_NEWLINK => {
                let Some(link_attrs) = payload.get(IFINFO..) else {
                    continue;
                };
                for (kind, xdp) in attrs(link_attrs) {
                    if kind != IFLA_XDP {
                        continue;
                    }
                    let mut mode = 0u8;
                    let mut single = 0u32;
                    for (kind, value) in attrs(xdp) {
                        let word = value
                            .get(0..4)
                            .and_then(|b| b.try_into().ok())
                            .map(u32::from_ne_bytes);
                        match (kind, word) {
                            (IFLA_XDP_ATTACHED, _) => mode = value.first().copied().unwrap_or(0),
                            (IFLA_XDP_PROG_ID, Some(id)) => single = id,
                            (IFLA_XDP_DRV_PROG_ID, Some(id)) => found.push(Attached {
                                id,
                                mode_flag: XDP_FLAGS_DRV_MODE,
                            }),
                            (IFLA_XDP_SKB_PROG_ID, Some(id)) => found.push(Attached {
                                id,
                                mode_flag: XDP_FLAGS_SKB_MODE,
                            }),
                            (IFLA_XDP_HW_PROG_ID, Some(id)) => found.push(Attached {
                                id,
                                mode_flag: XDP_FLAGS_HW_MODE,
                            }),
                            _ => {}
                        }
                    }
                    // One program: the kernel reports its mode and id, not the per-mode ids.
                    let mode_flag = match mode {
                        XDP_ATTACHED_DRV => XDP_FLAGS_DRV_MODE,
                        XDP_ATTACHED_SKB => XDP_FLAGS_SKB_MODE,
                        XDP_ATTACHED_HW => XDP_FLAGS_HW_MODE,
                        _ => 0,
                    };
                    if single != 0 && mode_flag != 0 && !found.iter().any(|a| a.id == single) {
                        found.push(Attached {
                            id: single,
                            mode_flag,
                        });
                    }
                }
            }
            _ => {}
        }
    }
    Ok(found)
}

/// Attaches program `fd` to `ifindex` the legacy way, or detaches with `fd == -1`;
/// `mode_flag` selects native, generic or offloaded.
pub(crate) fn set_xdp_fd(ifindex: u32, fd: i32, mode_flag: u32) -> io::Result<()> {
    let mut nested = attr(IFLA_XDP_FD, &fd.to_ne_bytes());
    nested.extend(attr(IFLA_XDP_FLAGS, &mode_flag.to_ne_bytes()));
    let attrs = attr(IFLA_XDP | NLA_F_NESTED, &nested);
    let replies = transact(&request(RTM_SETLINK, NLM_F_ACK, ifindex, &attrs))?;
    for (kind, payload) in replies {
        if kind == NLMSG_ERROR {
            return check_error(&payload);
        }
    }
    Err(io::Error::new(
        io::ErrorKind::UnexpectedEof,
        "no netlink acknowledgement",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_parse_and_stop_on_garbage() {
        let mut bytes = attr(1, &[1, 2, 3]);
        bytes.extend(attr(2 | NLA_F_NESTED, &7u32.to_ne_bytes()));
        bytes.extend_from_slice(&[200, 0, 1, 0]); // claims 200 bytes
        let parsed: Vec<_> = attrs(&bytes).collect();
        assert_eq!(
            parsed,
            vec![(1, &[1u8, 2, 3][..]), (2, &7u32.to_ne_bytes()[..])]
        );
        assert_eq!(attrs(&[3, 0, 0, 0]).count(), 0);
        assert_eq!(attrs(&[]).count(), 0);
    }

    #[test]
    fn loopback_has_no_xdp_program() {
        // Works unprivileged: RTM_GETLINK is a read.
        if let Ok(found) = attached(1) {
            assert!(found.iter().all(|a| a.id != 0));
        }
    }
}

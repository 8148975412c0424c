//! Protected mode (as Redis's): a process that would listen on an address other hosts reach
//! without a key file refuses to start, unless told `--insecure`. Loopback listeners need no
//! key: `pmnet demo`, `pmnet redis-up` on its default addresses and the tests are unaffected.
//! With `--insecure` the process starts, warns at once, and its state machine warns again at
//! most once a minute while it serves unauthenticated datagrams from other hosts
//! (`pmnet_proto::PlainTrafficWarnings`).

use std::net::SocketAddr;

use crate::CliError;

/// What a process listens on, for the check: an option and its address, or an interface the
/// process takes frames from (AF_XDP), which other hosts reach unless it is `lo`.
#[derive(Debug, Clone)]
pub enum Listener {
    Addr(&'static str, SocketAddr),
    Interface(&'static str, String),
}

impl Listener {
    /// Whether only this host can reach it. An interface that does not exist exposes
    /// nothing (the runtime refuses it, naming it); one is looked up in /sys/class/net.
    fn is_loopback(&self) -> bool {
        match self {
            Listener::Addr(_, addr) => pmnet_proto::is_loopback(*addr),
            Listener::Interface(_, name) => {
                let interfaces = std::path::Path::new("/sys/class/net");
                name == "lo"
                    || (interfaces.is_dir()
                        && !name.contains('/')
                        && !interfaces.join(name).exists())
            }
        }
    }

    fn describe(&self) -> String {
        match self {
            Listener::Addr(option, addr) => format!("{option} {addr}"),
            Listener::Interface(option, name) => format!("{option} {name}"),
        }
    }
}

/// Refuse to serve `listeners` that other hosts reach without keys, unless `insecure`; with
/// `insecure` (and such a listener, and no keys) warn at once. `command` names the process
/// (`device`, `chain-controller`, …).
pub fn check(
    command: &str,
    listeners: &[Listener],
    keyed: bool,
    insecure: bool,
) -> Result<(), CliError> {
    if keyed {
        return Ok(());
    }
    let exposed: Vec<String> = listeners
        .iter()
        .filter(|listener| !listener.is_loopback())
        .map(Listener::describe)
        .collect();
    if exposed.is_empty() {
        return Ok(());
    }
    let exposed = exposed.join(", ");
    if !insecure {
        return Err(format!(
            "protected mode: pmnet {command} would listen on {exposed}, which other hosts \
             reach, without a key file: anyone who reaches it could forge writes and acks. \
             Make a key file with `pmnet keygen --out pmnet.key` and give it to every process \
             of the deployment with `--key-file pmnet.key`; or listen on loopback (127.0.0.1); \
             or start with --insecure to serve unauthenticated traffic anyway \
             (docs/security.md, \"Protected mode\")"
        )
        .into());
    }
    tracing::warn!(
        "pmnet {command}: started with --insecure: listening on {exposed} without a key file; \
         its traffic is NOT authenticated, and anyone who reaches it can forge writes and acks \
         (warned again at most once a minute while other hosts send to it; make a key with \
         `pmnet keygen` and use --key-file)"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(text: &str) -> Listener {
        Listener::Addr("--listen", text.parse().unwrap())
    }

    #[test]
    fn only_listeners_others_reach_need_a_key() {
        for local in ["127.0.0.1:7400", "127.0.0.2:1", "[::1]:7400"] {
            check("device", &[addr(local)], false, false).unwrap();
        }
        check(
            "device",
            &[Listener::Interface("--xdp", "lo".into())],
            false,
            false,
        )
        .unwrap();
        for exposed in ["0.0.0.0:7400", "[::]:7400", "10.0.0.2:7400"] {
            let error = check(
                "device",
                &[addr("127.0.0.1:1"), addr(exposed)],
                false,
                false,
            )
            .unwrap_err()
            .to_string();
            assert!(error.contains("pmnet keygen"), "{error}");
            assert!(error.contains("--insecure"), "{error}");
            assert!(error.contains(&format!("--listen {exposed}")), "{error}");
            assert!(!error.contains("127.0.0.1:1"), "{error}");
            check("device", &[addr(exposed)], true, false).unwrap();
            check("device", &[addr(exposed)], false, true).unwrap();
        }
        // An interface other hosts reach (whichever this host has), and one it has not.
        let exposed = std::fs::read_dir("/sys/class/net")
            .into_iter()
            .flatten()
            .flatten()
            .map(|entry| entry.file_name().to_string_lossy().into_owned())
            .find(|name| name != "lo");
        if let Some(name) = exposed {
            let error = check(
                "device",
                &[Listener::Interface("--xdp", name.clone())],
                false,
                false,
            )
            .unwrap_err()
            .to_string();
            assert!(error.contains(&format!("--xdp {name}")), "{error}");
        }
        check(
            "device",
            &[Listener::Interface("--xdp", "nosuch0".into())],
            false,
            false,
        )
        .unwrap();
    }
}

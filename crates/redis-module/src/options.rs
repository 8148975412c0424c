//! The module's arguments: `--loadmodule libpmnet_redis_module.so NAME VALUE …` (or `loadmodule` in
//! redis.conf), checked before the module accepts anything; a bad one stops redis-server with
//! a message naming it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use pmnet_redis::script;

/// Everything the module needs to start.
#[derive(Debug, Clone)]
pub struct ModuleOptions {
    /// Where devices reach the module (UDP).
    pub listen: SocketAddr,
    pub server_id: u16,
    /// Devices in front of it: polled for logged requests at start-up.
    pub devices: Vec<SocketAddr>,
    /// Deployment keys (`pmnet keygen`): every datagram sealed and verified.
    pub key_file: Option<PathBuf>,
    pub record_prefix: String,
    /// The database of the session records ([`script::RECORD_DB_LAST`]: the last one).
    pub record_db: u32,
    /// Record reads too (see `pmnet redis-adaptor --record-reads`).
    pub record_reads: bool,
    /// A session record expires this long after its session's last write (`None`: never).
    pub session_ttl: Option<Duration>,
}

impl Default for ModuleOptions {
    fn default() -> ModuleOptions {
        ModuleOptions {
            listen: SocketAddr::from(([127, 0, 0, 1], 7500)),
            server_id: 1,
            devices: Vec::new(),
            key_file: None,
            record_prefix: script::DEFAULT_RECORD_PREFIX.to_owned(),
            record_db: script::RECORD_DB_LAST,
            record_reads: false,
            session_ttl: Some(Duration::from_secs(script::DEFAULT_SESSION_TTL_SECS)),
        }
    }
}

/// The arguments the module takes, with what each expects.
pub const USAGE: &str = "listen HOST:PORT, server-id N, device HOST:PORT (repeat, or \
                         comma-separated), key-file PATH, record-prefix PREFIX, record-db \
                         N|last, record-reads yes|no, session-ttl SECONDS (0: for ever)";

/// Parse `NAME VALUE` pairs.
pub fn parse(args: &[Vec<u8>]) -> Result<ModuleOptions, String> {
    let mut options = ModuleOptions::default();
    if args.len() % 2 != 0 {
        return Err(format!(
            "the module takes NAME VALUE pairs; `{}` has no value (arguments: {USAGE})",
            String::from_utf8_lossy(&args[args.len() - 1])
        ));
    }
    for pair in args.chunks(2) {
        let name = String::from_utf8_lossy(&pair[0]).to_ascii_lowercase();
        let value = std::str::from_utf8(&pair[1])
            .map_err(|_| format!("argument `{name}`: the value is not UTF-8"))?;
        let bad = |expected: &str| format!("argument `{name}`: `{value}` is not {expected}");
        match name.as_str() {
            "listen" => options.listen = parse_addr(value).ok_or_else(|| bad("HOST:PORT"))?,
            "server-id" => {
                options.server_id = value.parse().map_err(|_| bad("a number 0–65535"))?
            }
            "device" | "devices" => {
                for part in value.split(',').filter(|part| !part.is_empty()) {
                    let addr = parse_addr(part)
                        .ok_or_else(|| format!("argument `{name}`: `{part}` is not HOST:PORT"))?;
                    options.devices.push(addr);
                }
            }
            "key-file" => options.key_file = Some(PathBuf::from(value)),
            "record-prefix" if !value.is_empty() => options.record_prefix = value.to_owned(),
            "record-prefix" => return Err(bad("a key prefix (it is empty)")),
            "record-db" if value.eq_ignore_ascii_case("last") => {
                options.record_db = script::RECORD_DB_LAST;
            }
            "record-db" => {
                options.record_db = value
                    .parse()
                    .map_err(|_| bad("a database number or `last`"))?;
            }
            "record-reads" => {
                options.record_reads = parse_bool(value).ok_or_else(|| bad("yes or no"))?
            }
            "session-ttl" => {
                let secs: u64 = value.parse().map_err(|_| bad("a number of seconds"))?;
                options.session_ttl = (secs > 0).then(|| Duration::from_secs(secs));
            }
            _ => return Err(format!("unknown argument `{name}` (arguments: {USAGE})")),
        }
    }
    Ok(options)
}

fn parse_addr(text: &str) -> Option<SocketAddr> {
    use std::net::ToSocketAddrs;
    text.parse()
        .ok()
        .or_else(|| text.to_socket_addrs().ok()?.find(SocketAddr::is_ipv4))
}

fn parse_bool(text: &str) -> Option<bool> {
    match text.to_ascii_lowercase().as_str() {
        "yes" | "true" | "on" | "1" => Some(true),
        "no" | "false" | "off" | "0" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(words: &[&str]) -> Vec<Vec<u8>> {
        words.iter().map(|word| word.as_bytes().to_vec()).collect()
    }

    #[test]
    fn pairs_are_read_and_bad_ones_named() {
        let options = parse(&args(&[
            "listen",
            "127.0.0.1:7600",
            "device",
            "127.0.0.1:7400,127.0.0.1:7401",
            "server-id",
            "3",
            "session-ttl",
            "0",
        ]))
        .expect("valid");
        assert_eq!(options.listen.port(), 7600);
        assert_eq!(options.devices.len(), 2);
        assert_eq!(options.server_id, 3);
        assert_eq!(options.session_ttl, None);
        let error = parse(&args(&["server-id", "70000"])).unwrap_err();
        assert!(
            error.contains("server-id") && error.contains("70000"),
            "{error}"
        );
        let error = parse(&args(&["listen"])).unwrap_err();
        assert!(error.contains("no value"), "{error}");
        let error = parse(&args(&["colour", "blue"])).unwrap_err();
        assert!(error.contains("unknown argument `colour`"), "{error}");
    }
}

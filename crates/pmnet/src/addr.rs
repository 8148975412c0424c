//! Socket addresses on the command line: `IP:PORT` or `HOST:PORT`, one value parser for every
//! option that takes an address.

use std::net::{SocketAddr, ToSocketAddrs};

/// An address option's value: `IP:PORT` (`[IPv6]:PORT`) as it is, or `HOST:PORT` resolved now
/// (the first IPv4 address the resolver gives, else its first). An error names the host that
/// does not resolve, or says how to write an address.
pub fn parse_addr(text: &str) -> Result<SocketAddr, String> {
    let text = text.trim();
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Ok(addr);
    }
    let Some((host, port)) = text.rsplit_once(':') else {
        return Err(format!(
            "{text:?} has no port: write HOST:PORT or IP:PORT, for example localhost:7400 or \
             127.0.0.1:7400"
        ));
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return Err(format!(
            "{text:?} has no host: write HOST:PORT or IP:PORT, for example localhost:7400"
        ));
    }
    let port: u16 = port
        .parse()
        .map_err(|_| format!("{text:?}: the port {port:?} is not a number from 0 to 65535"))?;
    let resolved: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|error| format!("cannot resolve the host {host:?} (of {text:?}): {error}"))?
        .collect();
    resolved
        .iter()
        .find(|addr| addr.is_ipv4())
        .or_else(|| resolved.first())
        .copied()
        .ok_or_else(|| format!("the host {host:?} (of {text:?}) resolves to no address"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_and_host_names_parse() {
        assert_eq!(
            parse_addr("127.0.0.1:7400").unwrap(),
            SocketAddr::from(([127, 0, 0, 1], 7400))
        );
        assert_eq!(
            parse_addr("[::1]:7400").unwrap(),
            "[::1]:7400".parse::<SocketAddr>().unwrap()
        );
        let local = parse_addr("localhost:7400").unwrap();
        assert_eq!(local.port(), 7400);
        assert!(local.ip().is_loopback(), "{local}");
        assert!(local.is_ipv4(), "IPv4 preferred: {local}");
    }

    #[test]
    fn bad_addresses_say_what_is_wrong() {
        assert!(parse_addr("localhost").unwrap_err().contains("no port"));
        assert!(parse_addr(":7400").unwrap_err().contains("no host"));
        assert!(parse_addr("localhost:http").unwrap_err().contains("port"));
        let error = parse_addr("no-such-host.invalid:7400").unwrap_err();
        assert!(error.contains("\"no-such-host.invalid\""), "{error}");
    }
}

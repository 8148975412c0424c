//! MAC addresses, as `ip link` prints them.

use std::fmt;
use std::str::FromStr;

/// A MAC address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct MacAddr(pub [u8; 6]);

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d, e, g] = self.0;
        write!(f, "{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{g:02x}")
    }
}

impl FromStr for MacAddr {
    type Err = String;

    fn from_str(text: &str) -> Result<MacAddr, String> {
        let mut bytes = [0; 6];
        let mut parts = text.split(':');
        for byte in &mut bytes {
            let part = parts.next().filter(|part| part.len() == 2);
            *byte = part
                .and_then(|part| u8::from_str_radix(part, 16).ok())
                .ok_or_else(|| format!("{text:?} is not a MAC address (like 12:34:56:78:9a:bc)"))?;
        }
        if parts.next().is_some() {
            return Err(format!("{text:?} is not a MAC address (more than 6 bytes)"));
        }
        Ok(MacAddr(bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_and_writes_macs() {
        let mac: MacAddr = "12:75:75:a6:DD:90".parse().unwrap();
        assert_eq!(mac, MacAddr([0x12, 0x75, 0x75, 0xa6, 0xdd, 0x90]));
        assert_eq!(mac.to_string(), "12:75:75:a6:dd:90");
        for bad in [
            "",
            "12:75:75:a6:dd",
            "12:75:75:a6:dd:90:00",
            "1:2:3:4:5:6",
            "zz:75:75:a6:dd:90",
        ] {
            assert!(bad.parse::<MacAddr>().is_err(), "{bad}");
        }
    }
}

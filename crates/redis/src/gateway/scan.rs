//! Where one RESP2 or RESP3 value ends, found without copying it and without scanning its
//! bytes again when it arrives in many reads: what the gateway needs to pass Redis's replies,
//! pushes and messages on a direct connection to the client one whole value at a time.

use crate::resp::{parse_int, RespError};

/// The scan of the value at the front of a buffer, resumed where it stopped.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct ValueScan {
    /// The next element to look at starts here.
    pos: usize,
    /// Elements still to come (0 before the first one is seen).
    left: usize,
    started: bool,
    /// The line being looked for ends at or after this.
    line_from: usize,
}

fn protocol(message: &str) -> RespError {
    RespError(message.to_owned())
}

impl ValueScan {
    /// Scan on: `Ok(Some(end))` when the value at the front of `buf` ends at `end` (the scan
    /// is then reset for the next value), `Ok(None)` when more bytes are needed. A value (and
    /// each of its lines) longer than `max_len`, or not RESP, is an error.
    pub(super) fn next(&mut self, buf: &[u8], max_len: usize) -> Result<Option<usize>, RespError> {
        if !self.started {
            if buf.is_empty() {
                return Ok(None);
            }
            self.started = true;
            self.left = 1;
        }
        while self.left > 0 {
            if self.pos > max_len {
                return Err(protocol("reply larger than the gateway takes"));
            }
            let Some(&kind) = buf.get(self.pos) else {
                return Ok(None);
            };
            let from = self.line_from.max(self.pos + 1);
            let Some(end) = find_crlf(buf, from) else {
                self.line_from = buf.len().saturating_sub(1).max(self.pos + 1);
                if buf.len() - self.pos > max_len {
                    return Err(protocol("reply line too long"));
                }
                return Ok(None);
            };
            let line = &buf[self.pos + 1..end];
            let next = end + 2;
            let number = || parse_int(line).ok_or_else(|| protocol("invalid length in a reply"));
            match kind {
                b'+' | b'-' | b':' | b'_' | b',' | b'#' | b'(' => {
                    self.left -= 1;
                    self.pos = next;
                }
                b'$' | b'!' | b'=' => {
                    let len = number()?;
                    if len < 0 {
                        self.left -= 1;
                        self.pos = next;
                    } else {
                        let len = usize::try_from(len).unwrap_or(usize::MAX);
                        if len > max_len {
                            return Err(protocol("reply string larger than the gateway takes"));
                        }
                        let after = next + len + 2;
                        if buf.len() < after {
                            return Ok(None);
                        }
                        if &buf[after - 2..after] != b"\r\n" {
                            return Err(protocol("reply string not followed by CRLF"));
                        }
                        self.left -= 1;
                        self.pos = after;
                    }
                }
                b'*' | b'~' | b'>' | b'%' | b'|' => {
                    let count = number()?;
                    self.left -= 1;
                    if count > 0 {
                        let count = usize::try_from(count).unwrap_or(usize::MAX);
                        if count > max_len {
                            return Err(protocol("reply array larger than the gateway takes"));
                        }
                        let per = if matches!(kind, b'%' | b'|') { 2 } else { 1 };
                        self.left = self.left.saturating_add(count * per);
                    }
                    // An attribute annotates the value that follows it.
                    if kind == b'|' {
                        self.left += 1;
                    }
                    self.pos = next;
                }
                _ => return Err(protocol("unexpected reply type byte")),
            }
            self.line_from = 0;
        }
        let end = self.pos;
        *self = ValueScan::default();
        Ok(Some(end))
    }
}

fn find_crlf(buf: &[u8], from: usize) -> Option<usize> {
    let rest = buf.get(from..)?;
    rest.windows(2)
        .position(|pair| pair == b"\r\n")
        .map(|offset| from + offset)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: usize = 1 << 20;

    fn end_of(bytes: &[u8]) -> Option<usize> {
        let mut scan = ValueScan::default();
        // Byte by byte: the scan resumes.
        for cut in 1..bytes.len() {
            if let Some(end) = scan.next(&bytes[..cut], MAX).unwrap() {
                return Some(end);
            }
        }
        scan.next(bytes, MAX).unwrap()
    }

    #[test]
    fn values_of_every_type_end_where_they_end() {
        for value in [
            &b"+OK\r\n"[..],
            b"-ERR no\r\n",
            b":12\r\n",
            b"_\r\n",
            b",3.5\r\n",
            b"#t\r\n",
            b"(123\r\n",
            b"$-1\r\n",
            b"$5\r\na\r\nbc\r\n",
            b"=8\r\ntxt:abcd\r\n",
            b"*-1\r\n",
            b"*0\r\n",
            b"*2\r\n$1\r\na\r\n*1\r\n:1\r\n",
            b"%1\r\n+k\r\n~2\r\n:1\r\n:2\r\n",
            b">3\r\n$7\r\nmessage\r\n$1\r\nc\r\n$2\r\nhi\r\n",
            b"|1\r\n+ttl\r\n:3\r\n$1\r\nv\r\n",
        ] {
            let mut bytes = value.to_vec();
            bytes.extend_from_slice(b"+NEXT\r\n");
            assert_eq!(end_of(&bytes), Some(value.len()), "{value:?}");
        }
    }

    #[test]
    fn garbage_and_oversize_are_errors() {
        let mut scan = ValueScan::default();
        assert!(scan.next(b"?x\r\n", MAX).is_err());
        let mut scan = ValueScan::default();
        assert!(scan.next(b"$99999999999\r\n", MAX).is_err());
        let mut scan = ValueScan::default();
        assert!(scan.next(b"$1\r\nab\r\n", MAX).is_err());
        let mut scan = ValueScan::default();
        assert!(scan.next(&[b'+'; 100], 10).is_err());
    }
}

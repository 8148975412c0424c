//! What the protocol's state machines say (`tracing`: a device that does not answer, sessions
//! that cannot be forgotten, traffic that is not authenticated) goes to Redis's own log, at
//! Redis's level for it: redis-server has no other place for it.

use std::ffi::CStr;
use std::io::Write;

use tracing::{Level, Metadata};
use tracing_subscriber::fmt::MakeWriter;

/// Writes each event's line to Redis's log when the event ends.
#[derive(Debug)]
pub struct RedisLogLine {
    level: &'static CStr,
    line: Vec<u8>,
}

impl Write for RedisLogLine {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.line.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for RedisLogLine {
    fn drop(&mut self) {
        let text = String::from_utf8_lossy(&self.line);
        let text = text.trim_end();
        if !text.is_empty() {
            crate::ffi::log(std::ptr::null_mut(), self.level, &format!("pmnet: {text}"));
        }
    }
}

/// The writer maker: one line per event, at the event's level.
#[derive(Debug, Clone, Copy)]
pub struct RedisLog;

impl<'a> MakeWriter<'a> for RedisLog {
    type Writer = RedisLogLine;

    fn make_writer(&'a self) -> RedisLogLine {
        RedisLogLine {
            level: c"notice",
            line: Vec::new(),
        }
    }

    fn make_writer_for(&'a self, meta: &Metadata<'_>) -> RedisLogLine {
        let level = match *meta.level() {
            Level::ERROR | Level::WARN => c"warning",
            Level::INFO => c"notice",
            Level::DEBUG => c"verbose",
            Level::TRACE => c"debug",
        };
        RedisLogLine {
            level,
            line: Vec::new(),
        }
    }
}

/// Send this module's `tracing` events (info and above) to Redis's log; does nothing if the
/// process already has a subscriber.
pub fn install() {
    let subscriber = tracing_subscriber::fmt()
        .with_writer(RedisLog)
        .with_ansi(false)
        .without_time()
        .with_max_level(Level::INFO)
        .finish();
    let _ = tracing::subscriber::set_global_default(subscriber);
}

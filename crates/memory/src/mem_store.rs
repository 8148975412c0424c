//! An in-memory [`LineStore`] for tests and examples: one copy of the lines, every call
//! logged, failures on demand. Clones share the same lines, log and failure switches, so a
//! test can hand one clone to a [`RemoteMemory`](crate::RemoteMemory) or a
//! [`MappedMemory`](crate::MappedMemory), keep another to look inside, and use a third as
//! "another writer".

use std::sync::{Arc, Mutex, MutexGuard};

use crate::store::{LineError, LineStore, LINE};

/// One call a [`MemLineStore`] served (or failed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    /// `read_lines(first, count)`.
    Read { first: u64, count: u64 },
    /// `write_lines` with these runs, each `(first line, line count)`.
    Write { runs: Vec<(u64, u64)> },
}

#[derive(Debug, Default)]
struct Inner {
    bytes: Vec<u8>,
    log: Vec<Call>,
    fail_reads: u64,
    fail_writes: u64,
    down: bool,
}

/// An in-memory line store whose clones share one state. Failing calls return
/// [`LineError::Unavailable`] and change nothing; they are logged like the others.
#[derive(Debug, Clone, Default)]
pub struct MemLineStore {
    inner: Arc<Mutex<Inner>>,
}

impl MemLineStore {
    /// `lines` lines of zeros.
    pub fn new(lines: u64) -> MemLineStore {
        let len = usize::try_from(lines).expect("lines fit in memory") * LINE;
        MemLineStore {
            inner: Arc::new(Mutex::new(Inner {
                bytes: vec![0; len],
                ..Inner::default()
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How many clones of this store exist (this one included).
    pub fn handles(&self) -> usize {
        Arc::strong_count(&self.inner)
    }

    /// The calls so far, oldest first.
    pub fn log(&self) -> Vec<Call> {
        self.lock().log.clone()
    }

    /// Empties the log.
    pub fn clear_log(&self) {
        self.lock().log.clear();
    }

    /// How many `read_lines` calls were made (failed ones too).
    pub fn read_calls(&self) -> usize {
        self.lock()
            .log
            .iter()
            .filter(|c| matches!(c, Call::Read { .. }))
            .count()
    }

    /// The `write_lines` calls so far, each as its runs `(first line, line count)`.
    pub fn write_calls(&self) -> Vec<Vec<(u64, u64)>> {
        self.lock()
            .log
            .iter()
            .filter_map(|c| match c {
                Call::Write { runs } => Some(runs.clone()),
                Call::Read { .. } => None,
            })
            .collect()
    }

    /// The next `n` reads fail.
    pub fn fail_next_reads(&self, n: u64) {
        self.lock().fail_reads = n;
    }

    /// The next `n` writes fail.
    pub fn fail_next_writes(&self, n: u64) {
        self.lock().fail_writes = n;
    }

    /// While down, every call fails.
    pub fn set_down(&self, down: bool) {
        self.lock().down = down;
    }

    /// The bytes at `addr..addr + len`, read directly (not logged).
    pub fn peek(&self, addr: u64, len: usize) -> Vec<u8> {
        let inner = self.lock();
        let start = addr as usize;
        inner.bytes[start..start + len].to_vec()
    }

    /// Stores `bytes` at `addr` directly (not logged), as another writer's completed writes.
    pub fn poke(&self, addr: u64, bytes: &[u8]) {
        let mut inner = self.lock();
        let start = addr as usize;
        inner.bytes[start..start + bytes.len()].copy_from_slice(bytes);
    }
}

impl Inner {
    fn lines(&self) -> u64 {
        (self.bytes.len() / LINE) as u64
    }

    fn check(&self, first: u64, count: u64) -> Result<(), LineError> {
        match first.checked_add(count) {
            Some(end) if end <= self.lines() => Ok(()),
            _ => Err(LineError::OutOfRange { first, count }),
        }
    }
}

impl LineStore for MemLineStore {
    fn lines(&self) -> u64 {
        self.lock().lines()
    }

    fn read_lines(&mut self, first: u64, count: u64, out: &mut [u8]) -> Result<(), LineError> {
        let mut inner = self.lock();
        inner.log.push(Call::Read { first, count });
        if inner.down {
            return Err(LineError::Unavailable);
        }
        if inner.fail_reads > 0 {
            inner.fail_reads -= 1;
            return Err(LineError::Unavailable);
        }
        inner.check(first, count)?;
        let len = count as usize * LINE;
        if out.len() != len {
            return Err(LineError::Other(format!(
                "read buffer of {} bytes for {len}",
                out.len()
            )));
        }
        let start = first as usize * LINE;
        out.copy_from_slice(&inner.bytes[start..start + len]);
        Ok(())
    }

    fn write_lines(&mut self, runs: &[(u64, &[u8])]) -> Result<(), LineError> {
        let mut inner = self.lock();
        let logged = runs
            .iter()
            .map(|(first, b)| (*first, (b.len() / LINE) as u64))
            .collect();
        inner.log.push(Call::Write { runs: logged });
        if inner.down {
            return Err(LineError::Unavailable);
        }
        if inner.fail_writes > 0 {
            inner.fail_writes -= 1;
            return Err(LineError::Unavailable);
        }
        for (first, bytes) in runs {
            if bytes.len() % LINE != 0 {
                return Err(LineError::Other(format!("a run of {} bytes", bytes.len())));
            }
            inner.check(*first, (bytes.len() / LINE) as u64)?;
        }
        for (first, bytes) in runs {
            let start = *first as usize * LINE;
            inner.bytes[start..start + bytes.len()].copy_from_slice(bytes);
        }
        Ok(())
    }
}

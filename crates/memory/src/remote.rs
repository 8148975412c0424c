//! [`RemoteMemory`]: byte-addressed reads and writes over a [`LineStore`], with a bounded
//! write-back buffer of dirty lines and `persist()`.

use std::collections::BTreeMap;

use crate::store::{LineError, LineStore, LINE};

/// Dirty lines a [`RemoteMemory::new`] buffers before a write flushes them: 64 KiB.
pub const DEFAULT_DIRTY_LINES: usize = 1024;

/// Byte-addressed access to replicated memory.
///
/// * **Reads** of lines this client has not written since its last `persist()` are quorum
///   reads ([`LineStore::read_lines`], one call per run of such lines): a read sees every
///   write that completed before it began, line by line. Lines this client has written and not
///   yet persisted are read from its buffer (read-your-writes).
/// * **Writes** go to a buffer of dirty lines, nothing is sent. A write that covers only part
///   of a line it has not buffered first fetches the line with a quorum read and keeps the
///   rest of it: a read-modify-write that is **not atomic** against another client writing
///   the same line (that client's bytes in the rest of the line can be overwritten with the
///   older ones fetched here). Clients that share a line should each write whole lines, or
///   coordinate.
/// * **`persist()`** writes every dirty line back in one [`LineStore::write_lines`] call
///   (adjacent lines coalesced into runs) and returns once a majority of memory nodes holds
///   them durably. Until then a write is only in this client's buffer: it is lost if the
///   client dies, and other clients cannot see it.
/// * **The bound:** at most `max_dirty` lines are buffered. A write that needs a new dirty
///   line when the buffer is full persists the buffer first (and returns that error if it
///   fails). Nothing buffered is ever dropped: lines whose write-back failed stay dirty and go
///   again at the next `persist()`.
///
/// Addresses are `0 .. len()`; an access outside fails with [`LineError::OutOfRange`] naming
/// the lines it spans, before anything is read or buffered.
///
/// On an error from the store a `read` returns it with `buf` partly filled; a `write` returns
/// it having buffered none of its bytes, or (if it flushed midway) some whole lines of them.
#[derive(Debug)]
pub struct RemoteMemory<S: LineStore> {
    store: S,
    /// Dirty lines by index: this client's bytes, not yet known to be durable.
    dirty: BTreeMap<u64, Box<[u8; LINE]>>,
    max_dirty: usize,
}

impl<S: LineStore> RemoteMemory<S> {
    /// Over `store`, buffering at most [`DEFAULT_DIRTY_LINES`] lines.
    pub fn new(store: S) -> RemoteMemory<S> {
        RemoteMemory::with_max_dirty(store, DEFAULT_DIRTY_LINES)
    }

    /// Over `store`, buffering at most `max_dirty` lines (at least one).
    pub fn with_max_dirty(store: S, max_dirty: usize) -> RemoteMemory<S> {
        RemoteMemory {
            store,
            dirty: BTreeMap::new(),
            max_dirty: max_dirty.max(1),
        }
    }

    /// Bytes of memory: addresses are `0 .. len()`.
    pub fn len(&self) -> u64 {
        self.store.lines().saturating_mul(LINE as u64)
    }

    /// Whether the memory has no lines at all.
    pub fn is_empty(&self) -> bool {
        self.store.lines() == 0
    }

    /// Lines written and not yet persisted.
    pub fn dirty_lines(&self) -> usize {
        self.dirty.len()
    }

    /// The most lines buffered before a write flushes them.
    pub fn max_dirty(&self) -> usize {
        self.max_dirty
    }

    /// The store underneath.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// The store underneath, mutably (its own reads bypass this client's buffer).
    pub fn store_mut(&mut self) -> &mut S {
        &mut self.store
    }

    /// The lines `first..end` that bytes `addr..addr + len` span, or OutOfRange.
    fn span(&self, addr: u64, len: usize) -> Result<(u64, u64), LineError> {
        let line = LINE as u64;
        let first = addr / line;
        let end_addr = addr.checked_add(len as u64);
        let count = match end_addr {
            Some(end) => end.div_ceil(line).saturating_sub(first).max(1),
            None => u64::MAX - first,
        };
        match end_addr {
            Some(end) if end <= self.len() => Ok((first, end.div_ceil(line))),
            _ => Err(LineError::OutOfRange { first, count }),
        }
    }

    /// Reads `buf.len()` bytes from `addr`.
    pub fn read(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), LineError> {
        let (first, end) = self.span(addr, buf.len())?;
        if buf.is_empty() {
            return Ok(());
        }
        let mut scratch = Vec::new();
        let mut line = first;
        while line < end {
            if let Some(data) = self.dirty.get(&line) {
                copy_out(addr, buf, line, &data[..]);
                line += 1;
                continue;
            }
            // A run of lines not in the buffer: one quorum read.
            let run_end = match self.dirty.range(line..end).next() {
                Some((&next_dirty, _)) => next_dirty,
                None => end,
            };
            let count = run_end - line;
            scratch.resize(count as usize * LINE, 0);
            self.store.read_lines(line, count, &mut scratch)?;
            for (i, data) in scratch.chunks_exact(LINE).enumerate() {
                copy_out(addr, buf, line + i as u64, data);
            }
            line = run_end;
        }
        Ok(())
    }

    /// Reads `len` bytes from `addr` into a new vector.
    pub fn read_vec(&mut self, addr: u64, len: usize) -> Result<Vec<u8>, LineError> {
        self.span(addr, len)?;
        let mut buf = vec![0; len];
        self.read(addr, &mut buf)?;
        Ok(buf)
    }

    /// Writes `bytes` at `addr` into the buffer (see the type's docs: a partial line not
    /// buffered is fetched first; a full buffer is persisted first).
    pub fn write(&mut self, addr: u64, bytes: &[u8]) -> Result<(), LineError> {
        let (first, end) = self.span(addr, bytes.len())?;
        if bytes.is_empty() {
            return Ok(());
        }
        // Fetch the partial lines at either end before buffering anything.
        let head = self.fetch_partial(addr, bytes.len(), first)?;
        let tail = if end - 1 != first {
            self.fetch_partial(addr, bytes.len(), end - 1)?
        } else {
            None
        };
        for line in first..end {
            if !self.dirty.contains_key(&line) {
                if self.dirty.len() >= self.max_dirty {
                    self.persist()?;
                }
                let base = if line == first {
                    head.clone()
                } else if line == end - 1 {
                    tail.clone()
                } else {
                    None
                };
                self.dirty
                    .insert(line, base.unwrap_or_else(|| Box::new([0; LINE])));
            }
            let data = self.dirty.get_mut(&line).expect("inserted above");
            copy_in(addr, bytes, line, &mut data[..]);
        }
        Ok(())
    }

    /// The current contents of `line` if the write `addr..addr + len` covers only part of it
    /// (from the buffer, or else a quorum read), else None. Taken before the write buffers
    /// anything: a flush the write makes midway can take the line out of the buffer.
    fn fetch_partial(
        &mut self,
        addr: u64,
        len: usize,
        line: u64,
    ) -> Result<Option<Box<[u8; LINE]>>, LineError> {
        let start = line * LINE as u64;
        let covers_all = addr <= start && addr + len as u64 >= start + LINE as u64;
        if covers_all {
            return Ok(None);
        }
        if let Some(data) = self.dirty.get(&line) {
            return Ok(Some(data.clone()));
        }
        let mut data = Box::new([0; LINE]);
        self.store.read_lines(line, 1, &mut data[..])?;
        Ok(Some(data))
    }

    /// Writes every dirty line back (one `write_lines` call, adjacent lines in one run) and
    /// returns once a majority holds them durably; then the buffer is empty. On an error the
    /// lines stay dirty: they may or may not have reached the memory nodes, and the next
    /// `persist()` writes them again. With nothing dirty, nothing is sent.
    pub fn persist(&mut self) -> Result<(), LineError> {
        if self.dirty.is_empty() {
            return Ok(());
        }
        let mut runs: Vec<(u64, Vec<u8>)> = Vec::new();
        for (&line, data) in &self.dirty {
            match runs.last_mut() {
                Some((first, bytes)) if *first + (bytes.len() / LINE) as u64 == line => {
                    bytes.extend_from_slice(&data[..]);
                }
                _ => runs.push((line, data.to_vec())),
            }
        }
        let borrowed: Vec<(u64, &[u8])> = runs.iter().map(|(f, b)| (*f, b.as_slice())).collect();
        self.store.write_lines(&borrowed)?;
        self.dirty.clear();
        Ok(())
    }
}

/// Copies the part of `line` (its bytes `data`) that falls in `addr..addr + buf.len()` to
/// `buf`.
fn copy_out(addr: u64, buf: &mut [u8], line: u64, data: &[u8]) {
    let (in_line, in_buf, n) = overlap(addr, buf.len(), line);
    buf[in_buf..in_buf + n].copy_from_slice(&data[in_line..in_line + n]);
}

/// Copies the part of `bytes` (written at `addr`) that falls in `line` into `data`.
fn copy_in(addr: u64, bytes: &[u8], line: u64, data: &mut [u8]) {
    let (in_line, in_bytes, n) = overlap(addr, bytes.len(), line);
    data[in_line..in_line + n].copy_from_slice(&bytes[in_bytes..in_bytes + n]);
}

/// Where `addr..addr + len` and `line` overlap: (offset in the line, offset in the range,
/// length). The caller knows they do.
fn overlap(addr: u64, len: usize, line: u64) -> (usize, usize, usize) {
    let line_start = line * LINE as u64;
    let start = addr.max(line_start);
    let end = (addr + len as u64).min(line_start + LINE as u64);
    (
        (start - line_start) as usize,
        (start - addr) as usize,
        (end - start) as usize,
    )
}

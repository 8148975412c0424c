//! [`MappedMemory`]: replicated memory as an mmap'ed region whose page faults are quorum
//! reads (userfaultfd), whose writes are tracked by write-protect faults, and whose
//! `persist()` writes the changed lines back.

mod fault;

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::ops::Range;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::store::{LineError, LineStore, LINE};
use crate::uffd::{
    Uffd, IOCTL_WRITEPROTECT, UFFDIO_REGISTER_MODE_MISSING, UFFDIO_REGISTER_MODE_WP,
    UFFD_FEATURE_PAGEFAULT_FLAG_WP, UFFD_FEATURE_THREAD_ID,
};

/// Bytes of a page of the view.
pub const PAGE: usize = 4096;
/// Lines of a page.
pub const PAGE_LINES: usize = PAGE / LINE;

/// How the view learns which pages were written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tracking {
    /// Pages are installed write-protected (`UFFDIO_WRITEPROTECT`); the first write to a page
    /// faults, marks it dirty and un-protects it; `persist()` protects it again. Nothing for
    /// the program to do.
    WriteProtect,
    /// The kernel cannot write-protect this mapping: the program says what it wrote with
    /// [`MappedMemory::mark_dirty`]; unmarked writes are never persisted.
    Explicit,
}

/// What the fault thread does when it cannot fetch a page.
///
/// The faulting thread is stopped inside its memory access until the page arrives: the fetch
/// is retried with exponential backoff (`first_backoff`, doubling up to `max_backoff`), and
/// every failure is counted in [`ViewStats`]. After `attempts` failed fetches the faulting
/// thread is sent **SIGBUS**, as for an access past the end of a truncated file mapping: by
/// default it ends the process; a program with a SIGBUS handler that returns retries the
/// access (and faults again). With `attempts: None` the fetch is retried for ever, the way an
/// NFS hard mount waits for its server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FaultPolicy {
    /// Failed fetches before SIGBUS; `None`: never give up.
    pub attempts: Option<u32>,
    pub first_backoff: Duration,
    pub max_backoff: Duration,
}

impl Default for FaultPolicy {
    /// 8 attempts, 1 ms doubling to 256 ms between them (about half a second of waiting on
    /// top of the store's own timeouts).
    fn default() -> FaultPolicy {
        FaultPolicy {
            attempts: Some(8),
            first_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(256),
        }
    }
}

/// How to map a view.
#[derive(Debug, Clone, Default)]
pub struct MapOptions {
    /// The store's line at the view's first byte (the view covers `pages * 64` lines from it).
    pub first_line: u64,
    /// What a fault that cannot be served does.
    pub fault_policy: FaultPolicy,
    /// Track writes with [`MappedMemory::mark_dirty`] even where write-protect works.
    pub explicit_tracking: bool,
}

/// Why a view could not be mapped.
#[derive(Debug)]
pub enum MapError {
    /// The view would cover lines the store does not have (or no lines at all).
    OutOfRange { first: u64, count: u64 },
    /// userfaultfd cannot be used here: not in this kernel, refused by
    /// `vm.unprivileged_userfaultfd` to a process without CAP_SYS_PTRACE, or by a seccomp
    /// filter; or the page size is not 4 KiB.
    Unsupported(io::Error),
    /// Another system call failed.
    Os(&'static str, io::Error),
}

impl std::fmt::Display for MapError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MapError::OutOfRange { first, count } => write!(
                f,
                "a view of lines {first}..{} is empty or outside the memory",
                first.saturating_add(*count)
            ),
            MapError::Unsupported(e) => write!(f, "userfaultfd is not available here: {e}"),
            MapError::Os(what, e) => write!(f, "{what}: {e}"),
        }
    }
}

impl std::error::Error for MapError {}

/// What a view has done, for tests and monitoring.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ViewStats {
    /// Pages fetched (missing-page faults served).
    pub missing_faults: u64,
    /// Pages that became dirty through a write fault.
    pub write_faults: u64,
    /// Fetches that failed (each retried or given up).
    pub fetch_failures: u64,
    /// The last failed fetch's error.
    pub last_fetch_error: Option<LineError>,
    /// Faults given up on: SIGBUS sent.
    pub unserved_faults: u64,
    /// System calls of the fault thread that failed (the thread goes on).
    pub os_errors: u64,
    pub last_os_error: Option<String>,
    /// Lines written back by `persist()` calls that succeeded.
    pub persisted_lines: u64,
    /// Pages present now (fetched and not invalidated since).
    pub resident_pages: usize,
    /// Pages with writes not yet persisted (write-protect tracking).
    pub dirty_pages: usize,
}

/// The anonymous mapping; unmapped when dropped.
#[derive(Debug)]
struct Mapping {
    base: usize,
    len: usize,
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: our own mapping, unused now (the fault thread has stopped, no borrow of the
        // view is left).
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.len) };
    }
}

#[derive(Debug)]
struct Fd(OwnedFd);

impl Fd {
    fn raw(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

#[derive(Debug, Default)]
struct State {
    /// Pages installed and not invalidated since.
    present: Vec<bool>,
    /// Pages written since they were fetched or last persisted, with their bytes as they were
    /// then (what the memory nodes hold, as far as this view knows).
    dirty: BTreeMap<usize, Box<[u8; PAGE]>>,
    /// Lines marked with `mark_dirty`, view-relative.
    marked: BTreeSet<usize>,
    stats: ViewStats,
}

/// What the view and its fault thread share. Field order is drop order: the descriptor
/// closes before the mapping goes.
#[derive(Debug)]
struct Shared<S> {
    uffd: Uffd,
    stop: Fd,
    map: Mapping,
    store: Mutex<S>,
    state: Mutex<State>,
    first_line: u64,
    tracking: Tracking,
    policy: FaultPolicy,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Replicated memory as `pages * 4096` bytes of this process's address space.
///
/// A page's first touch fetches its 64 lines with quorum reads (one `read_lines` call, by a
/// fault thread of the view's own); writes are tracked per page; `persist()` writes the
/// changed lines back. See the crate docs for the consistency model, and [`FaultPolicy`] for
/// what happens when a page cannot be fetched.
///
/// Access goes through [`as_slice`](Self::as_slice) / [`as_mut_slice`](Self::as_mut_slice)
/// (or [`words_mut`](Self::words_mut)), whose borrows keep `persist`, `invalidate` and drop
/// from running under a thread that is using the memory. Programs that hand
/// [`as_ptr`](Self::as_ptr) around take that on themselves.
#[derive(Debug)]
pub struct MappedMemory<S: LineStore + Send + 'static> {
    shared: Arc<Shared<S>>,
    thread: Option<JoinHandle<()>>,
}

fn os(what: &'static str) -> impl FnOnce(io::Error) -> MapError {
    move |e| MapError::Os(what, e)
}

impl<S: LineStore + Send + 'static> MappedMemory<S> {
    /// Maps `pages` pages over the store's lines from 0 on, with the default options.
    pub fn map(store: S, pages: usize) -> Result<MappedMemory<S>, MapError> {
        MappedMemory::map_with(store, pages, MapOptions::default())
    }

    /// Maps `pages` pages over `store` as `options` say.
    pub fn map_with(
        store: S,
        pages: usize,
        options: MapOptions,
    ) -> Result<MappedMemory<S>, MapError> {
        let count = (pages as u64).saturating_mul(PAGE_LINES as u64);
        let first = options.first_line;
        if pages == 0
            || first
                .checked_add(count)
                .is_none_or(|end| end > store.lines())
        {
            return Err(MapError::OutOfRange { first, count });
        }
        // SAFETY: sysconf has no preconditions.
        if unsafe { libc::sysconf(libc::_SC_PAGESIZE) } != PAGE as libc::c_long {
            return Err(MapError::Unsupported(io::Error::other(
                "the page size is not 4 KiB",
            )));
        }
        let uffd = Uffd::open(UFFD_FEATURE_THREAD_ID | UFFD_FEATURE_PAGEFAULT_FLAG_WP)
            .map_err(MapError::Unsupported)?;
        let len = pages
            .checked_mul(PAGE)
            .ok_or(MapError::OutOfRange { first, count })?;
        // SAFETY: a new private anonymous mapping; the result is checked.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(MapError::Os("mmap", io::Error::last_os_error()));
        }
        let map = Mapping {
            base: base as usize,
            len,
        };
        // A child of fork() would see zero pages where this process has remote ones: give it
        // none.
        // SAFETY: our mapping.
        unsafe { libc::madvise(base, len, libc::MADV_DONTFORK) };
        let tracking = register(&uffd, &map, options.explicit_tracking)?;
        // SAFETY: eventfd has no preconditions; the result is checked.
        let stop = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if stop < 0 {
            return Err(MapError::Os("eventfd", io::Error::last_os_error()));
        }
        // SAFETY: a new descriptor we own.
        let stop = Fd(unsafe { OwnedFd::from_raw_fd(stop) });
        let shared = Arc::new(Shared {
            uffd,
            stop,
            map,
            store: Mutex::new(store),
            state: Mutex::new(State {
                present: vec![false; pages],
                ..State::default()
            }),
            first_line: first,
            tracking,
            policy: options.fault_policy,
        });
        let for_thread = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("pmnet-memory-faults".into())
            .spawn(move || fault::run(&for_thread))
            .map_err(os("spawn the fault thread"))?;
        Ok(MappedMemory {
            shared,
            thread: Some(thread),
        })
    }

    /// How writes are tracked here.
    pub fn tracking(&self) -> Tracking {
        self.shared.tracking
    }

    /// Bytes of the view.
    pub fn len(&self) -> usize {
        self.shared.map.len
    }

    /// Whether the view is empty (never: a view has at least one page).
    pub fn is_empty(&self) -> bool {
        self.shared.map.len == 0
    }

    /// The view's first byte. Accesses through it fault pages in like the slices do; the
    /// caller must stop using it before `persist`, `invalidate`, `refresh` or drop run.
    pub fn as_ptr(&self) -> *mut u8 {
        self.shared.map.base as *mut u8
    }

    /// The view's bytes (touching a page fetches it).
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the mapping lives as long as `self`; its bytes are written only through
        // `&mut self` (or by the fault thread installing a page that was never read).
        unsafe { std::slice::from_raw_parts(self.as_ptr(), self.len()) }
    }

    /// The view's bytes, writable (writing a page marks it dirty).
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as `as_slice`, and `&mut self` makes this the only borrow.
        unsafe { std::slice::from_raw_parts_mut(self.as_ptr(), self.len()) }
    }

    /// The view as native-endian `u64` words (the mapping is page-aligned), e.g. an array of
    /// counters.
    pub fn words_mut(&mut self) -> &mut [u64] {
        // SAFETY: page-aligned, a whole number of words, every bit pattern is a u64.
        unsafe { std::slice::from_raw_parts_mut(self.as_ptr().cast(), self.len() / 8) }
    }

    /// Locks the store and runs `f` on it. `f` must not touch the view: a fault would wait
    /// for the store this call holds.
    pub fn with_store<R>(&self, f: impl FnOnce(&mut S) -> R) -> R {
        f(&mut lock(&self.shared.store))
    }

    /// What the view has done so far.
    pub fn stats(&self) -> ViewStats {
        let state = lock(&self.shared.state);
        let mut stats = state.stats.clone();
        stats.resident_pages = state.present.iter().filter(|p| **p).count();
        stats.dirty_pages = state.dirty.len();
        stats
    }

    /// Checks that `range` lies in the view; returns it as view-relative lines.
    fn lines_of(&self, range: &Range<usize>) -> Result<Range<usize>, LineError> {
        let first = (range.start / LINE) as u64 + self.shared.first_line;
        if range.start > range.end || range.end > self.len() {
            let count = (range.end.saturating_sub(range.start))
                .div_ceil(LINE)
                .max(1) as u64;
            return Err(LineError::OutOfRange { first, count });
        }
        Ok(range.start / LINE..range.end.div_ceil(LINE))
    }

    /// Says that the bytes in `range` were (or will be) written: their lines are written back
    /// by the next `persist()`. Needed only with [`Tracking::Explicit`]; harmless otherwise.
    pub fn mark_dirty(&mut self, range: Range<usize>) -> Result<(), LineError> {
        let lines = self.lines_of(&range)?;
        lock(&self.shared.state).marked.extend(lines);
        Ok(())
    }

    /// Writes every line changed since its page was fetched or last persisted (and every
    /// marked line) back with one `write_lines` call, adjacent lines in one run, and returns
    /// once a majority of memory nodes holds them durably. Dirty pages are write-protected
    /// again first, so later writes are caught as new changes. A line rewritten with the bytes
    /// it had is not sent. On an error the lines stay dirty (they may or may not have reached
    /// the memory nodes) and the next `persist()` sends them again.
    pub fn persist(&mut self) -> Result<(), LineError> {
        let shared = &*self.shared;
        let mut state = lock(&shared.state);
        let pages = std::mem::take(&mut state.dirty);
        let marked = std::mem::take(&mut state.marked);
        if shared.tracking == Tracking::WriteProtect {
            for run in page_runs(pages.keys().copied()) {
                let start = shared.map.base + run.start * PAGE;
                if let Err(e) = shared.uffd.write_protect(start, run.len() * PAGE, true) {
                    restore(&mut state, pages, marked);
                    return Err(LineError::Other(format!("UFFDIO_WRITEPROTECT: {e}")));
                }
            }
        }
        let mut lines: BTreeSet<usize> = marked
            .iter()
            .copied()
            .filter(|l| state.present[l / PAGE_LINES])
            .collect();
        for (page, clean) in &pages {
            let now = self.page(*page);
            for (i, (a, b)) in now
                .chunks_exact(LINE)
                .zip(clean.chunks_exact(LINE))
                .enumerate()
            {
                if a != b {
                    lines.insert(page * PAGE_LINES + i);
                }
            }
        }
        let mut runs: Vec<(u64, Vec<u8>)> = Vec::new();
        for line in lines {
            // SAFETY: the line's page is present, and protected or only written by this
            // thread (`&mut self`).
            let bytes = unsafe {
                std::slice::from_raw_parts((shared.map.base + line * LINE) as *const u8, LINE)
            };
            let line = shared.first_line + line as u64;
            match runs.last_mut() {
                Some((first, b)) if *first + (b.len() / LINE) as u64 == line => {
                    b.extend_from_slice(bytes)
                }
                _ => runs.push((line, bytes.to_vec())),
            }
        }
        drop(state);
        if runs.is_empty() {
            return Ok(());
        }
        let borrowed: Vec<(u64, &[u8])> = runs.iter().map(|(f, b)| (*f, b.as_slice())).collect();
        let result = lock(&shared.store).write_lines(&borrowed);
        let mut state = lock(&shared.state);
        match result {
            Ok(()) => {
                state.stats.persisted_lines += borrowed
                    .iter()
                    .map(|(_, b)| (b.len() / LINE) as u64)
                    .sum::<u64>();
                Ok(())
            }
            Err(e) => {
                restore(&mut state, pages, marked);
                Err(e)
            }
        }
    }

    /// A present page's bytes.
    fn page(&self, page: usize) -> &[u8] {
        &self.as_slice()[page * PAGE..(page + 1) * PAGE]
    }

    /// Drops every clean page of the view (`MADV_DONTNEED`), so that its next touch fetches it
    /// again and sees the writes other clients completed before this call. Dirty pages (and
    /// pages with marked lines) are kept: `persist()` first to refresh those too. Returns the
    /// pages dropped.
    pub fn refresh(&mut self) -> Result<usize, LineError> {
        self.invalidate(0..self.len())
    }

    /// `refresh` for the pages that overlap `range` only.
    pub fn invalidate(&mut self, range: Range<usize>) -> Result<usize, LineError> {
        let lines = self.lines_of(&range)?;
        let pages = lines.start / PAGE_LINES..lines.end.div_ceil(PAGE_LINES);
        let shared = &*self.shared;
        let mut state = lock(&shared.state);
        let clean: Vec<usize> = pages
            .filter(|&p| {
                state.present[p]
                    && !state.dirty.contains_key(&p)
                    && state
                        .marked
                        .range(p * PAGE_LINES..(p + 1) * PAGE_LINES)
                        .next()
                        .is_none()
            })
            .collect();
        for run in page_runs(clean.iter().copied()) {
            let start = (shared.map.base + run.start * PAGE) as *mut libc::c_void;
            // SAFETY: pages of our mapping, not borrowed (`&mut self`).
            if unsafe { libc::madvise(start, run.len() * PAGE, libc::MADV_DONTNEED) } != 0 {
                let e = io::Error::last_os_error();
                return Err(LineError::Other(format!("madvise(MADV_DONTNEED): {e}")));
            }
            for p in run {
                state.present[p] = false;
            }
        }
        Ok(clean.len())
    }
}

/// Puts back what a failed `persist` took: its pages' clean copies are the older ones, so
/// they replace any taken since.
fn restore(state: &mut State, pages: BTreeMap<usize, Box<[u8; PAGE]>>, marked: BTreeSet<usize>) {
    state.dirty.extend(pages);
    state.marked.extend(marked);
}

/// Consecutive page numbers (ascending input) as ranges.
fn page_runs(pages: impl Iterator<Item = usize>) -> Vec<Range<usize>> {
    let mut runs: Vec<Range<usize>> = Vec::new();
    for p in pages {
        match runs.last_mut() {
            Some(run) if run.end == p => run.end += 1,
            _ => runs.push(p..p + 1),
        }
    }
    runs
}

/// Registers the mapping for missing-page faults, and write-protect faults unless `explicit`
/// or the kernel cannot; says which tracking that gives.
fn register(uffd: &Uffd, map: &Mapping, explicit: bool) -> Result<Tracking, MapError> {
    if !explicit && uffd.features & UFFD_FEATURE_PAGEFAULT_FLAG_WP != 0 {
        let mode = UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_WP;
        match uffd.register(map.base, map.len, mode) {
            Ok(ioctls) if ioctls & IOCTL_WRITEPROTECT != 0 => return Ok(Tracking::WriteProtect),
            Ok(_) => uffd
                .unregister(map.base, map.len)
                .map_err(os("UFFDIO_UNREGISTER"))?,
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
            Err(e) => return Err(MapError::Os("UFFDIO_REGISTER", e)),
        }
    }
    match uffd.register(map.base, map.len, UFFDIO_REGISTER_MODE_MISSING) {
        Ok(_) => Ok(Tracking::Explicit),
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => Err(MapError::Unsupported(e)),
        Err(e) => Err(MapError::Os("UFFDIO_REGISTER", e)),
    }
}

impl<S: LineStore + Send + 'static> Drop for MappedMemory<S> {
    /// Stops the fault thread, then unmaps (unpersisted writes are lost).
    fn drop(&mut self) {
        let one: u64 = 1;
        // SAFETY: an 8-byte write to our eventfd.
        unsafe { libc::write(self.shared.stop.raw(), (&one as *const u64).cast(), 8) };
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

//! What the memory controller needs of replicated memory: quorum reads and writes of whole
//! 64-byte lines, many at once. The runtime's ABD sessions (through a device, or running the
//! quorum in the client) implement it; tests use an in-memory one.

/// Bytes of a line: the unit of replication (one register).
pub const LINE: usize = 64;

/// Why a quorum operation on lines failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LineError {
    /// Lines outside the memory's `lines()`.
    OutOfRange { first: u64, count: u64 },
    /// No majority of memory nodes answered in time: the operation may or may not have
    /// taken effect (a write may become visible later).
    Unavailable,
    /// A write the coordinator cannot tell apart from one it applied before it lost its
    /// state (it restarted): it may or may not have taken effect.
    InDoubt,
    /// Anything else (socket errors, a refused request), in words.
    Other(String),
}

impl std::fmt::Display for LineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LineError::OutOfRange { first, count } => {
                write!(f, "lines {first}..{} are outside the memory", first + count)
            }
            LineError::Unavailable => f.write_str(
                "no majority of memory nodes answered in time (the operation may or may not have \
                 taken effect)",
            ),
            LineError::InDoubt => f.write_str(
                "the coordinator lost track of this write (it restarted): it may or may not have \
                 taken effect",
            ),
            LineError::Other(what) => f.write_str(what),
        }
    }
}

impl std::error::Error for LineError {}

/// Quorum reads and writes of whole lines. Each line is a linearizable register; an operation
/// on several lines is several registers' operations, not one atomic one.
pub trait LineStore {
    /// Lines the memory holds (addresses `0 .. lines() * LINE`).
    fn lines(&self) -> u64;

    /// Read `count` lines from line `first` on (quorum reads), into `out` (`count * LINE`
    /// bytes). Several lines may be in flight at once.
    fn read_lines(&mut self, first: u64, count: u64, out: &mut [u8]) -> Result<(), LineError>;

    /// Write each run of whole lines (`(first line, bytes)`, bytes a multiple of `LINE`) with
    /// quorum writes; returns when a majority of memory nodes holds every line durably.
    /// Runs may be in flight at once.
    fn write_lines(&mut self, runs: &[(u64, &[u8])]) -> Result<(), LineError>;
}

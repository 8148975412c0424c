//! The forward log on a mapped file next to the data file (docs/replication.md, "The forward
//! log"): a primary's every request forwarded to the replicas is durable there first, and a
//! restarted primary takes back what it forwarded and had not applied; a replica keeps its
//! primary's requests there, applied only once durable, so that once promoted it can send
//! them to the other replicas. A server that is no primary makes the file when a primary
//! first sends it a request (or reopens the one it has), so that a server alone never pays
//! for one.

use std::path::{Path, PathBuf};

use pmnet_pm::{MmapRegion, PmLog};
use pmnet_proto::{ForwardLogOpened, ForwardLogRecovery};

use super::{RuntimeError, StoreOptions};

/// Slots of a new forward log: requests (or 2 KiB parts of larger ones) a primary holds for
/// its replicas at most (beyond it the next request waits for one to be applied), and the
/// requests from its primary a replica keeps (the oldest applied one goes when a slot is
/// needed: at least as many as its primary can hold unapplied).
pub const FORWARD_LOG_SLOTS: u32 = 8192;
/// Bytes per slot of a new forward log.
pub const FORWARD_LOG_SLOT_SIZE: u32 = 2048;

/// The forward log of the data file at `data_path`: the same name with `.forward` appended.
pub fn forward_log_path(data_path: &Path) -> PathBuf {
    let mut name = data_path.as_os_str().to_owned();
    name.push(".forward");
    PathBuf::from(name)
}

/// A forward log, open.
#[derive(Debug)]
pub(super) struct ForwardLogFile {
    pub path: PathBuf,
    pub log: PmLog<MmapRegion>,
    pub recovery: ForwardLogRecovery,
    pub created: bool,
}

/// Open (or make) the forward log next to `store`'s data file, erased with `--format`; what
/// it holds goes to the server state machine.
pub(super) fn open_forward_log(
    store: &StoreOptions,
) -> Result<(PmLog<MmapRegion>, ForwardLogOpened, PathBuf, bool), RuntimeError> {
    let path = forward_log_path(&store.path);
    let file_options = pmnet_pm::LogFileOptions {
        slot_count: FORWARD_LOG_SLOTS,
        slot_size: FORWARD_LOG_SLOT_SIZE,
        format: store.format,
        mmap: store.mmap,
    };
    let (log, recovery, opened) =
        pmnet_pm::open_log_file(&path, &file_options).map_err(|error| {
            crate::device::log_file_error(&path, error, |unusable| {
                RuntimeError::Config(format!(
                    "forward log: {unusable}. It may hold requests forwarded to the replicas and \
                 not applied here; move it aside to keep it, or pass --format to erase it with \
                 the data file"
                ))
            })
        })?;
    if recovery.rejected_slot_count > 0 {
        tracing::warn!(
            "forward log {}: {} damaged slots freed (torn writes of requests never forwarded, \
             or corruption)",
            path.display(),
            recovery.rejected_slot_count
        );
    }
    let opened_log = ForwardLogOpened {
        slot_count: log.slot_count(),
        max_packet_len: log.max_packet_len(),
        entries: recovery.entries,
    };
    let created = !matches!(opened, pmnet_pm::LogFileOpened::Reopened);
    Ok((log, opened_log, path, created))
}

/// The shape of a forward log not made yet (empty): the server state machine starts with it,
/// and the runtime makes the file when the first batch comes.
pub(super) fn unopened_forward_log() -> ForwardLogOpened {
    ForwardLogOpened {
        slot_count: FORWARD_LOG_SLOTS,
        max_packet_len: FORWARD_LOG_SLOT_SIZE as usize - pmnet_pm::log::SLOT_HEADER_SIZE,
        entries: Vec::new(),
    }
}

/// Say at start-up what the forward log is and what it gave back.
pub(super) fn report_forward_log(file: &ForwardLogFile) {
    let medium = file.log.medium();
    if file.created {
        tracing::info!(
            "forward log {}: new, {} slots of {} bytes on {medium}",
            file.path.display(),
            file.log.slot_count(),
            file.log.slot_size()
        );
    } else {
        tracing::info!(
            "forward log {} on {medium}: {} requests forwarded before the restart and not \
             applied are taken in again, first; {} applied; {} from a primary kept to apply \
             when it sends them again; {} applied as a replica sent to the replicas again; {} \
             incomplete or damaged slots freed",
            file.path.display(),
            file.recovery.requests,
            file.recovery.applied,
            file.recovery.kept,
            file.recovery.resent_to_replicas,
            file.recovery.discarded_slots
        );
    }
}

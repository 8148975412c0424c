//! A store copied into another, offline: every key, and every session's exactly-once record
//! (its last sequence number and reply), so that the copy answers every client as the original
//! would — a retransmission of a session's last request gets its reply again, an older one is
//! refused as stale. `pmnet store compact` makes a store of another size this way.

use pmnet_pm::PmRegion;
use pmnet_store::{Application, NoSpace, Request, SessionRecord};

use super::Store;

/// The session the copy's keys are written under (each SET a record of its own, as a client's
/// would be); no client's session id, which are random 64-bit numbers, is all ones.
pub const COPY_SESSION: u64 = u64::MAX;

/// What a copy carried over.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CopyReport {
    pub keys: usize,
    pub sessions: usize,
}

/// Why a copy stopped (the target is then to be thrown away).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CopyError {
    #[error("the source holds a damaged record: {0}")]
    Corrupt(String),
    #[error("the target has no room for {what}: make it larger")]
    NoRoom { what: String },
    #[error("the target holds {0} sessions' records already: copy into a new, empty store")]
    NotEmpty(usize),
    #[error("the source holds the copy's own session ({COPY_SESSION:#x}): a store copied already? copy that one's source instead")]
    CopySession,
}

impl<R: PmRegion> Store<R> {
    /// Copy this store into `target`, a new, empty store: every key with its value (written as
    /// SETs of [`COPY_SESSION`]), then every session's record. Committed as it goes; durable
    /// when this returns `Ok`.
    pub fn copy_into<T: PmRegion>(&self, target: &mut Store<T>) -> Result<CopyReport, CopyError> {
        if target.key_count() > 0 || target.session_count() > 0 {
            return Err(CopyError::NotEmpty(target.session_count()));
        }
        let sessions = self.sessions();
        if sessions
            .iter()
            .any(|record| record.session_id == COPY_SESSION)
        {
            return Err(CopyError::CopySession);
        }
        let mut report = CopyReport::default();
        let mut start: Vec<u8> = Vec::new();
        let mut seq: u32 = 0;
        loop {
            let page: Vec<(Vec<u8>, Vec<u8>)> = self
                .scan(&start, 256)
                .map_err(|corruption| CopyError::Corrupt(corruption.to_string()))?
                .into_iter()
                .map(|(key, value)| (key.to_vec(), value.to_vec()))
                .collect();
            let Some((last, _)) = page.last() else {
                break;
            };
            // The next page starts just after the last key.
            start = last.clone();
            start.push(0);
            for (key, value) in &page {
                seq += 1;
                let request = Request::Set { key, value }.to_bytes();
                target
                    .stage(COPY_SESSION, seq, &request)
                    .map_err(|NoSpace| CopyError::NoRoom {
                        what: format!("key {} of {} bytes", report.keys + 1, value.len()),
                    })?;
                report.keys += 1;
            }
            target.commit();
        }
        for record in &sessions {
            target
                .import_session(record)
                .map_err(|NoSpace| CopyError::NoRoom {
                    what: format!("session {:#x}'s record", record.session_id),
                })?;
            report.sessions += 1;
        }
        target.commit();
        Ok(report)
    }

    /// Make `record` this store's record of its session (its last number and reply), as if
    /// its last request had just been applied here; staged in the current batch.
    pub fn import_session(&mut self, record: &SessionRecord) -> Result<(), NoSpace> {
        if self.sessions.get(record.session_id).is_none()
            && self.must_keep_every_session_for(record.session_id)
        {
            return Err(NoSpace);
        }
        let _mark = self.begin_op();
        self.table_commit(
            record.session_id,
            record.last_seq,
            record.last_reply.clone(),
        );
        Ok(())
    }
}

//! Rebuilding the store's state from its active half: the snapshot, which must verify whole,
//! then the log after it, replayed up to a clean end or the first record that fails.

use crate::codec::{MAX_KEY_LEN, MAX_REPLY_LEN, MAX_VALUE_LEN};

use super::layout::{
    align_up, chain_seed, read_record, EffectCode, ReadOutcome, Record, RecordKind, RejectReason,
    SnapshotHeader, Superblock, RECORD_ALIGN, TERMINATOR_SIZE,
};
use super::state::{Session, State};
use super::{RejectedRecord, StoreError};

/// The result of replaying one half.
pub(super) struct Replay {
    pub(super) state: State,
    pub(super) snapshot_records: u64,
    pub(super) log_records: u64,
    pub(super) rejected: Option<RejectedRecord>,
    /// Where the log ends in the half: the next record goes here.
    pub(super) end_bytes: usize,
    pub(super) end_crc: u32,
}

/// Where a replay is in the half: the next record's position, and the CRC it chains to.
#[derive(Debug, Clone, Copy)]
struct Cursor {
    position: usize,
    crc: u32,
}

/// Rebuild the state from the active half. `half_offset` is only for error offsets.
pub(super) fn replay(
    half: &[u8],
    half_offset: usize,
    superblock: &Superblock,
) -> Result<Replay, StoreError> {
    let mut state = State::new(superblock.max_sessions);
    let (snapshot_records, cursor) = replay_snapshot(half, half_offset, superblock, &mut state)?;
    let (log_records, rejected, end) = replay_log(half, half_offset, cursor, &mut state)?;
    Ok(Replay {
        state,
        snapshot_records,
        log_records,
        rejected,
        end_bytes: end.position,
        end_crc: end.crc,
    })
}

/// A corrupt store, at `position` in the half at `half_offset`.
fn corrupt(half_offset: usize, position: usize, reason: &'static str) -> StoreError {
    StoreError::Corrupt {
        offset_bytes: (half_offset + position) as u64,
        reason,
    }
}

/// Restore the snapshot's keys and sessions into `state`, whose clock it sets; returns the
/// number of records restored and where the log after the snapshot begins.
fn replay_snapshot(
    half: &[u8],
    half_offset: usize,
    superblock: &Superblock,
    state: &mut State,
) -> Result<(u64, Cursor), StoreError> {
    let corrupt = |position: usize, reason| corrupt(half_offset, position, reason);
    let seed = chain_seed(superblock.store_id, superblock.generation);

    // The snapshot was persisted before its generation was committed: any damage in it is
    // corruption, not a torn write.
    let ReadOutcome::Record {
        record,
        mut crc,
        next_position: mut position,
    } = read_record(half, 0, seed)
    else {
        return Err(corrupt(0, "snapshot header missing or damaged"));
    };
    let record = record.map_err(|reason| corrupt(0, reason))?;
    let header = SnapshotHeader::decode(&record).map_err(|reason| corrupt(0, reason))?;
    let snapshot_clock = record.activity;
    let snapshot_len = usize::try_from(header.snapshot_len_bytes)
        .ok()
        .filter(|len| *len <= half.len().saturating_sub(TERMINATOR_SIZE))
        .ok_or(corrupt(0, "snapshot length exceeds the half"))?;
    if header.session_count > u64::from(superblock.max_sessions) {
        return Err(corrupt(0, "snapshot holds more sessions than max_sessions"));
    }
    let (mut key_count, mut session_count) = (0u64, 0u64);
    while position < snapshot_len {
        let ReadOutcome::Record {
            record,
            crc: next_crc,
            next_position,
        } = read_record(half, position, crc)
        else {
            return Err(corrupt(position, "snapshot record damaged"));
        };
        let record = record.map_err(|reason| corrupt(position, reason))?;
        match record.kind {
            RecordKind::Key => {
                restore_key(&record, state).map_err(|reason| corrupt(position, reason))?;
                key_count += 1;
            }
            RecordKind::Session => {
                restore_session(&record, snapshot_clock, superblock.max_sessions, state)
                    .map_err(|reason| corrupt(position, reason))?;
                session_count += 1;
            }
            RecordKind::Snapshot | RecordKind::Apply => {
                return Err(corrupt(position, "unexpected record kind in the snapshot"));
            }
        }
        crc = next_crc;
        position = next_position;
    }
    if position != snapshot_len
        || key_count != header.key_count
        || session_count != header.session_count
    {
        return Err(corrupt(0, "snapshot does not match its header"));
    }
    state.clock = snapshot_clock;
    Ok((key_count + session_count, Cursor { position, crc }))
}

/// A KEY record of the snapshot, into `state`.
fn restore_key(record: &Record<'_>, state: &mut State) -> Result<(), &'static str> {
    check_key_record(record)?;
    if state.keys.contains_key(record.key) {
        return Err("key appears twice in the snapshot");
    }
    state.put(record.key, record.value);
    Ok(())
}

/// A SESSION record of the snapshot, into `state`.
fn restore_session(
    record: &Record<'_>,
    snapshot_clock: u64,
    max_sessions: u32,
    state: &mut State,
) -> Result<(), &'static str> {
    check_session_record(record, snapshot_clock)?;
    let duplicate = state.sessions.contains_key(&record.session_id)
        || state.sessions_by_activity.contains_key(&record.activity);
    if duplicate || state.sessions.len() == max_sessions as usize {
        return Err("snapshot session table is inconsistent");
    }
    state.insert_session(
        record.session_id,
        Session {
            last_seq: record.seq,
            last_reply: record.reply.to_vec(),
            activity: record.activity,
            seen_ms: 0,
        },
    );
    Ok(())
}

/// The log after the snapshot, from `cursor`: replay until a clean end or a record that fails.
/// Returns the records replayed, the one rejected (if any) and where the log ends.
fn replay_log(
    half: &[u8],
    half_offset: usize,
    mut cursor: Cursor,
    state: &mut State,
) -> Result<(u64, Option<RejectedRecord>, Cursor), StoreError> {
    let mut log_records = 0;
    let mut rejected = None;
    loop {
        let position = cursor.position;
        match read_record(half, position, cursor.crc) {
            ReadOutcome::End => break,
            ReadOutcome::Rejected {
                reason,
                stored_len,
                stored_crc,
                computed_crc,
            } => {
                // Does a verified record follow? A crash cannot produce that: we never write
                // a record before the one ahead of it is durable.
                let next_position = position + align_up(stored_len as usize, RECORD_ALIGN);
                let valid_record_follows = reason == RejectReason::ChecksumMismatch
                    && [stored_crc, computed_crc].iter().any(|chain| {
                        matches!(
                            read_record(half, next_position, *chain),
                            ReadOutcome::Record { record: Ok(_), .. }
                        )
                    });
                rejected = Some(RejectedRecord {
                    offset_bytes: (half_offset + position) as u64,
                    reason,
                    valid_record_follows,
                });
                break;
            }
            ReadOutcome::Record {
                record,
                crc: next_crc,
                next_position,
            } => {
                let record = record.map_err(|reason| corrupt(half_offset, position, reason))?;
                apply_log_record(&record, state)
                    .map_err(|reason| corrupt(half_offset, position, reason))?;
                log_records += 1;
                cursor = Cursor {
                    position: next_position,
                    crc: next_crc,
                };
            }
        }
    }
    Ok((log_records, rejected, cursor))
}

/// An APPLY record of the log, onto `state`.
fn apply_log_record(record: &Record<'_>, state: &mut State) -> Result<(), &'static str> {
    check_apply_record(record, state)?;
    match record.effect {
        EffectCode::None => {}
        EffectCode::Put => state.put(record.key, record.value),
        EffectCode::Delete => state.delete(record.key),
    }
    state.touch_session(
        record.session_id,
        record.seq,
        record.reply.to_vec(),
        record.activity,
        0,
    );
    Ok(())
}

fn check_key(key: &[u8]) -> Result<(), &'static str> {
    if key.is_empty() || key.len() > MAX_KEY_LEN {
        return Err("key length out of bounds");
    }
    Ok(())
}

fn check_key_record(record: &Record<'_>) -> Result<(), &'static str> {
    check_key(record.key)?;
    let shaped = record.effect == EffectCode::Put
        && record.value.len() <= MAX_VALUE_LEN
        && record.reply.is_empty()
        && record.session_id == 0
        && record.seq == 0
        && record.activity == 0;
    shaped.then_some(()).ok_or("malformed key record")
}

fn check_session_record(record: &Record<'_>, snapshot_clock: u64) -> Result<(), &'static str> {
    let shaped = record.effect == EffectCode::None
        && record.key.is_empty()
        && record.value.is_empty()
        && record.reply.len() <= MAX_REPLY_LEN
        && record.activity > 0
        && record.activity <= snapshot_clock;
    shaped.then_some(()).ok_or("malformed session record")
}

fn check_apply_record(record: &Record<'_>, state: &State) -> Result<(), &'static str> {
    if record.kind != RecordKind::Apply {
        return Err("unexpected record kind after the snapshot");
    }
    if record.reply.len() > MAX_REPLY_LEN {
        return Err("reply too long");
    }
    if record.activity <= state.clock {
        return Err("activity clock goes backwards");
    }
    if let Some(session) = state.sessions.get(&record.session_id) {
        if record.seq <= session.last_seq {
            return Err("session seq goes backwards");
        }
    }
    match record.effect {
        EffectCode::None => (record.key.is_empty() && record.value.is_empty())
            .then_some(())
            .ok_or("malformed apply record"),
        EffectCode::Put => {
            check_key(record.key)?;
            (record.value.len() <= MAX_VALUE_LEN)
                .then_some(())
                .ok_or("value too long")
        }
        EffectCode::Delete => {
            check_key(record.key)?;
            record
                .value
                .is_empty()
                .then_some(())
                .ok_or("malformed apply record")
        }
    }
}

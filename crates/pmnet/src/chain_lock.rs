//! The lock recipe of the chain store, on a blocking session (`pmnet_runtime::ChainSession`):
//! what `pmnet kv lock` / `unlock` and `pmnet coord-bench` share (docs/netchain.md, "Running
//! it").
//!
//! A lock is a key whose value is `OWNER EXPIRY_MS` (wall-clock milliseconds); empty or
//! absent: free. It is taken by compare-and-set if it is free, its lease ran out, or the owner
//! holds it already; released by compare-and-set to the empty value if the owner holds it.

use std::time::{SystemTime, UNIX_EPOCH};

use pmnet_netchain::{ClientOp, Outcome};
use pmnet_runtime::ChainSession;

use crate::CliError;

/// How an attempt to take a lock ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockAttempt {
    /// Taken (or its lease renewed), at this version of the lock's key.
    Taken { version: u64 },
    /// Another owner holds it for this long still.
    Held { holder: String, ms_left: u64 },
    /// It changed between the read and the compare-and-set.
    TakenMeanwhile { holder: Option<String> },
}

/// How an attempt to release a lock ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UnlockAttempt {
    Released,
    NotYours { holder: String },
    NotHeld,
    ChangedMeanwhile,
}

/// The error of a request that got no usable answer.
pub fn failed(outcome: &Outcome) -> CliError {
    match outcome {
        Outcome::Full => "refused: the table has no room near this key"
            .to_owned()
            .into(),
        Outcome::Refused(status) => format!(
            "refused ({status:?}): the members' configuration (--member order, --groups) \
             differs from this one's, or the request is malformed"
        )
        .into(),
        _ => "no answer in time: the request may or may not have been applied"
            .to_owned()
            .into(),
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as u64)
}

/// A lock's value: "OWNER EXPIRY_MS"; empty or absent: free.
pub fn lock_holder(value: Option<&[u8]>) -> Option<(String, u64)> {
    let text = std::str::from_utf8(value?).ok()?;
    let (owner, expiry) = text.rsplit_once(' ')?;
    Some((owner.to_owned(), expiry.parse().ok()?))
}

fn check_owner(owner: &str) -> Result<(), CliError> {
    if owner.is_empty() || owner.contains(' ') {
        return Err("--owner: a name without spaces".to_owned().into());
    }
    Ok(())
}

/// A read of `name`: its version and value.
fn read(session: &mut ChainSession, name: &str) -> Result<(u64, Option<Vec<u8>>), CliError> {
    match session.run(name.as_bytes(), ClientOp::Get)? {
        Outcome::Value { version, value } => Ok((version, value)),
        other => Err(failed(&other)),
    }
}

/// One attempt at lock `name` (1 to 255 bytes) for `owner`, for `lease_ms` from now: a
/// read, then a compare-and-set if it is free, expired or `owner`'s already.
pub fn try_lock(
    session: &mut ChainSession,
    name: &str,
    owner: &str,
    lease_ms: u64,
) -> Result<LockAttempt, CliError> {
    check_owner(owner)?;
    let (version, value) = read(session, name)?;
    let holder = lock_holder(value.as_deref()).filter(|(_, expiry)| *expiry > now_ms());
    if let Some((holder, expiry)) = holder {
        if holder != owner {
            return Ok(LockAttempt::Held {
                holder,
                ms_left: expiry.saturating_sub(now_ms()),
            });
        }
    }
    let expected = if value.is_some() { version } else { 0 };
    let value = format!("{owner} {}", now_ms().saturating_add(lease_ms)).into_bytes();
    match session.run(name.as_bytes(), ClientOp::CompareAndSet { expected, value })? {
        Outcome::Written { version } => Ok(LockAttempt::Taken { version }),
        Outcome::CompareFailed { value, .. } => Ok(LockAttempt::TakenMeanwhile {
            holder: lock_holder(Some(&value)).map(|(holder, _)| holder),
        }),
        other => Err(failed(&other)),
    }
}

/// Release lock `name` if `owner` holds it. `version`: the version `owner` took it at, if
/// known (a compare-and-set on it, no read first); else the lock is read first.
pub fn unlock(
    session: &mut ChainSession,
    name: &str,
    owner: &str,
    version: Option<u64>,
) -> Result<UnlockAttempt, CliError> {
    let version = match version {
        Some(version) => version,
        None => {
            let (version, value) = read(session, name)?;
            match lock_holder(value.as_deref()) {
                Some((holder, _)) if holder == owner => version,
                Some((holder, _)) => return Ok(UnlockAttempt::NotYours { holder }),
                None => return Ok(UnlockAttempt::NotHeld),
            }
        }
    };
    let op = ClientOp::CompareAndSet {
        expected: version,
        value: Vec::new(),
    };
    match session.run(name.as_bytes(), op)? {
        Outcome::Written { .. } => Ok(UnlockAttempt::Released),
        Outcome::CompareFailed { .. } => Ok(UnlockAttempt::ChangedMeanwhile),
        other => Err(failed(&other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_value_names_its_owner_and_expiry() {
        assert_eq!(lock_holder(Some(b"me 1700")), Some(("me".to_owned(), 1700)));
        assert_eq!(lock_holder(Some(b"")), None);
        assert_eq!(lock_holder(None), None);
        assert_eq!(lock_holder(Some(b"me soon")), None);
    }

    #[test]
    fn an_owner_is_a_name_without_spaces() {
        assert!(check_owner("alice").is_ok());
        assert!(check_owner("").is_err());
        assert!(check_owner("al ice")
            .unwrap_err()
            .to_string()
            .contains("--owner"));
    }
}

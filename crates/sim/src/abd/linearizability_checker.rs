//! Replicated memory's world's safety check: every line's history of reads and writes is
//! linearizable (`pmnet-lincheck`'s register; a multi-line operation is one operation per line
//! with the operation's call and return times; a write that failed "unavailable" or "in
//! doubt" may or may not have taken effect, and is pending in the history).

use pmnet_lincheck::{check_by_key, Register};

use super::world::History;

/// Check `history`; on failure, the operation the search could not place and those of its
/// line around it.
pub(super) fn check(history: &History) -> Result<(), String> {
    let verdict = check_by_key(&Register { initial: Some(0) }, history, 100_000_000);
    if verdict.is_linearizable() {
        return Ok(());
    }
    let detail = match &verdict {
        pmnet_lincheck::Verdict::NotLinearizable { stuck, .. } => {
            let (line, op) = &history[*stuck];
            let around: Vec<_> = history
                .iter()
                .filter(|(l, other)| {
                    l == line
                        && other.ret.saturating_add(5_000_000) >= op.call
                        && other.call <= op.ret.min(op.call + 5_000_000)
                })
                .map(|(_, other)| other)
                .take(40)
                .collect();
            format!("; stuck at line {line}'s {op:?}; its line's operations around it: {around:?}")
        }
        _ => String::new(),
    };
    Err(format!(
        "a line's history is not linearizable: {verdict:?}{detail}"
    ))
}

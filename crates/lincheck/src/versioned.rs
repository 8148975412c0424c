//! The model of a versioned register with compare-and-set: one key of the chain store, whose
//! every write (a deletion too) takes a higher version, and whose compare-and-set holds when
//! the key's present version — its version if it has a value, 0 if it has none — is the one
//! expected. Lock recipes are compare-and-sets, so a linearizable history of this model is
//! a safe lock.

use std::hash::Hash;

use crate::Model;

/// What an operation asked for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum VersionedInput<V> {
    Read,
    /// Set the value (`None`: delete the key).
    Write(Option<V>),
    /// Set `value` if the key's present version is `expected`.
    CompareAndSet {
        expected: u64,
        value: V,
    },
}

/// What it answered.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum VersionedOutput<V> {
    /// A read: the key's version (of its last write, a deletion included; 0: never written)
    /// and value.
    Value { version: u64, value: Option<V> },
    /// A write or a compare-and-set that held, at this version.
    Written { version: u64 },
    /// A compare-and-set that did not hold: the present version and the value (`None`: none).
    CompareFailed { version: u64, value: Option<V> },
    /// No answer, or one that leaves open whether it took effect: any outcome fits.
    Unknown,
}

/// A versioned register of values of type `V`, starting never written.
#[derive(Debug, Clone)]
pub struct VersionedRegister<V> {
    values: std::marker::PhantomData<V>,
}

impl<V> Default for VersionedRegister<V> {
    fn default() -> Self {
        VersionedRegister {
            values: std::marker::PhantomData,
        }
    }
}

impl<V: Clone + Eq + Hash> Model for VersionedRegister<V> {
    /// (version, whether it is exact, value). Versions only grow: a write takes a version
    /// above the key's, not always the next one (a version the store stamped and lost before
    /// anyone could see it leaves a gap). After a write whose outcome is unknown the version
    /// is only a lower bound until an answer shows it.
    type State = (u64, bool, Option<V>);
    type Input = VersionedInput<V>;
    type Output = VersionedOutput<V>;

    fn init(&self) -> (u64, bool, Option<V>) {
        (0, true, None)
    }

    fn step(
        &self,
        (version, exact, value): &(u64, bool, Option<V>),
        input: &VersionedInput<V>,
        output: &VersionedOutput<V>,
    ) -> Option<(u64, bool, Option<V>)> {
        let (version, exact) = (*version, *exact);
        // The version a value has (what compare-and-set compares): could it be `seen`?
        let could_be = |seen: u64| {
            if value.is_none() {
                seen == 0
            } else if exact {
                seen == version
            } else {
                seen >= version
            }
        };
        match (input, output) {
            (VersionedInput::Read, VersionedOutput::Unknown) => {
                Some((version, exact, value.clone()))
            }
            (
                VersionedInput::Read,
                VersionedOutput::Value {
                    version: seen,
                    value: read,
                },
            ) => {
                let fits = if exact {
                    *seen == version
                } else {
                    *seen >= version
                };
                (fits && read == value).then(|| (*seen, true, value.clone()))
            }
            (VersionedInput::Write(new), VersionedOutput::Unknown) => {
                Some((version + 1, false, new.clone()))
            }
            (VersionedInput::Write(new), VersionedOutput::Written { version: at }) => {
                (*at > version).then(|| (*at, true, new.clone()))
            }
            (
                VersionedInput::CompareAndSet {
                    expected,
                    value: new,
                },
                VersionedOutput::Unknown,
            ) => {
                // If it took effect (a compare-and-set that failed is one that never did,
                // which the search tries too).
                Some(if could_be(*expected) {
                    (version + 1, false, Some(new.clone()))
                } else {
                    (version, exact, value.clone())
                })
            }
            (
                VersionedInput::CompareAndSet {
                    expected,
                    value: new,
                },
                VersionedOutput::Written { version: at },
            ) => (could_be(*expected) && *at > version).then(|| (*at, true, Some(new.clone()))),
            (
                VersionedInput::CompareAndSet { expected, .. },
                VersionedOutput::CompareFailed {
                    version: seen,
                    value: read,
                },
            ) => (read == value && could_be(*seen) && expected != seen).then(|| {
                if value.is_some() {
                    (*seen, true, value.clone())
                } else {
                    (version, exact, None)
                }
            }),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{check, Operation, PENDING};

    type Op = Operation<VersionedInput<u8>, VersionedOutput<u8>>;

    fn op(
        client: u64,
        call: u64,
        ret: u64,
        input: VersionedInput<u8>,
        output: VersionedOutput<u8>,
    ) -> Op {
        Operation {
            client,
            call,
            ret,
            input,
            output,
        }
    }

    #[test]
    fn a_lock_taken_twice_at_once_is_caught_and_one_holder_is_not() {
        use VersionedInput::*;
        use VersionedOutput::*;
        let take = |value| CompareAndSet { expected: 0, value };
        // Two clients take the free lock one after the other: the second must fail.
        let safe = vec![
            op(1, 0, 10, take(1), Written { version: 1 }),
            op(
                2,
                20,
                30,
                take(2),
                CompareFailed {
                    version: 1,
                    value: Some(1),
                },
            ),
            op(1, 40, 50, Write(None), Written { version: 2 }),
            op(2, 60, 70, take(2), Written { version: 3 }),
            op(
                3,
                80,
                90,
                Read,
                Value {
                    version: 3,
                    value: Some(2),
                },
            ),
        ];
        assert!(check(&VersionedRegister::default(), &safe, 10_000).is_linearizable());
        // Both get it: no order explains that.
        let unsafe_history = vec![
            op(1, 0, 10, take(1), Written { version: 1 }),
            op(2, 20, 30, take(2), Written { version: 2 }),
        ];
        assert!(!check(&VersionedRegister::default(), &unsafe_history, 10_000).is_linearizable());
        // A version that does not grow, or a read of an old version after a newer write
        // returned.
        let same = vec![
            op(1, 0, 10, Write(Some(5)), Written { version: 2 }),
            op(2, 20, 30, Write(Some(6)), Written { version: 2 }),
        ];
        assert!(!check(&VersionedRegister::default(), &same, 10_000).is_linearizable());
        let stale = vec![
            op(1, 0, 10, Write(Some(5)), Written { version: 1 }),
            op(
                2,
                20,
                30,
                Read,
                Value {
                    version: 0,
                    value: None,
                },
            ),
        ];
        assert!(!check(&VersionedRegister::default(), &stale, 10_000).is_linearizable());
        // An unknown compare-and-set may or may not have held.
        let unknown = vec![
            op(1, 0, PENDING, take(1), Unknown),
            op(
                2,
                20,
                30,
                Read,
                Value {
                    version: 1,
                    value: Some(1),
                },
            ),
        ];
        assert!(check(&VersionedRegister::default(), &unknown, 10_000).is_linearizable());
    }
}

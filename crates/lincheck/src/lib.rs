//! Linearizability checking of recorded histories.
//!
//! A history is what clients saw: each [`Operation`] with the time it was called, the time its
//! result came back (or [`PENDING`] if it never did: a request that timed out may or may not have
//! taken effect), its input and its output. The history is linearizable under a sequential
//! [`Model`] if the operations can be put in one order that respects real time (an operation
//! that returned before another was called comes first) and in which the model, run in that
//! order, gives every output that was seen.
//!
//! [`check`] runs Wing & Gong's search with Lowe's memoisation (the algorithm of Porcupine and
//! Knossos): it tries to linearize, at each step, one of the operations that may come next,
//! backtracks when none fits, and never revisits a (set of linearized operations, model state)
//! pair it has seen. [`check_by_key`] splits a history by key first (linearizability is
//! compositional), so histories of many keys stay cheap. A budget bounds the search; a history
//! it cannot decide within the budget is [`Verdict::Unknown`], never a pass.
//!
//! [`Register`] is the model of a read/write register (a key of a key-value store); a model for
//! anything else implements [`Model`].

use std::hash::Hash;

mod register;
mod search;
mod versioned;

pub use register::{Register, RegisterInput, RegisterOutput};
pub use search::{check, check_by_key, ModelOperation};
pub use versioned::{VersionedInput, VersionedOutput, VersionedRegister};

/// The return time of an operation whose result never came back: it may be linearized at any
/// point after its call, including after every other operation (as if it never took effect).
pub const PENDING: u64 = u64::MAX;

/// A sequential specification.
pub trait Model {
    type State: Clone + Eq + Hash;
    type Input;
    type Output;

    /// The state before any operation.
    fn init(&self) -> Self::State;

    /// The state after `input` is applied to `state`, if doing so may produce `output`; `None`
    /// if it cannot.
    fn step(
        &self,
        state: &Self::State,
        input: &Self::Input,
        output: &Self::Output,
    ) -> Option<Self::State>;
}

/// One operation as a client saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operation<I, O> {
    /// Who called it (for messages only: the search does not need it).
    pub client: u64,
    /// When it was called.
    pub call: u64,
    /// When its result came back, at or after `call`; [`PENDING`] if it never did.
    pub ret: u64,
    pub input: I,
    pub output: O,
}

/// The outcome of a check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Some order of the operations respects real time and the model.
    Linearizable,
    /// No order does. `linearized` is the length of the longest prefix the search could
    /// linearize, `stuck` the index (into the history checked) of an operation that could not
    /// be placed after it before its return.
    NotLinearizable {
        key: Option<String>,
        linearized: usize,
        stuck: usize,
    },
    /// The search spent its budget of steps without deciding.
    Unknown { key: Option<String>, steps: u64 },
}

impl Verdict {
    pub fn is_linearizable(&self) -> bool {
        matches!(self, Verdict::Linearizable)
    }
}

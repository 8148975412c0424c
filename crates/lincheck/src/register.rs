//! The model of a read/write register: one key of a key-value store.

use std::hash::Hash;

use crate::Model;

/// What an operation on a register asked for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum RegisterInput<V> {
    Read,
    /// Set the value (`None`: delete the key).
    Write(Option<V>),
}

/// What it answered.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum RegisterOutput<V> {
    /// The value read (`None`: the key had no value).
    Value(Option<V>),
    /// The write was acknowledged.
    Written,
    /// No answer came (the operation is [`crate::PENDING`]) or it failed in a way that leaves
    /// open whether it took effect: any outcome fits.
    Unknown,
}

/// A register holding an optional value of type `V`, starting with `initial`.
#[derive(Debug, Clone)]
pub struct Register<V> {
    pub initial: Option<V>,
}

impl<V> Default for Register<V> {
    fn default() -> Self {
        Register { initial: None }
    }
}

impl<V: Clone + Eq + Hash> Model for Register<V> {
    type State = Option<V>;
    type Input = RegisterInput<V>;
    type Output = RegisterOutput<V>;

    fn init(&self) -> Option<V> {
        self.initial.clone()
    }

    fn step(
        &self,
        state: &Option<V>,
        input: &RegisterInput<V>,
        output: &RegisterOutput<V>,
    ) -> Option<Option<V>> {
        match (input, output) {
            (RegisterInput::Read, RegisterOutput::Value(seen)) => {
                (seen == state).then(|| state.clone())
            }
            (RegisterInput::Read, RegisterOutput::Unknown) => Some(state.clone()),
            (RegisterInput::Write(value), RegisterOutput::Written | RegisterOutput::Unknown) => {
                Some(value.clone())
            }
            (RegisterInput::Read, RegisterOutput::Written)
            | (RegisterInput::Write(_), RegisterOutput::Value(_)) => None,
        }
    }
}

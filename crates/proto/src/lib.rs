//! PMNet protocol state machines.

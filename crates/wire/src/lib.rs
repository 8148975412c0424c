//! PMNet wire format.

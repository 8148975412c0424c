//! The client memory controller of replicated persistent memory (docs/abd.md).

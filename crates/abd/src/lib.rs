//! Replicated persistent memory (docs/abd.md): every 64-byte line is a multi-writer,
//! multi-reader atomic register replicated on several memory nodes and kept consistent with
//! the Attiya–Bar-Noy–Dolev protocol.

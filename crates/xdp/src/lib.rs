//! The AF_XDP datapath (docs/inpath.md).

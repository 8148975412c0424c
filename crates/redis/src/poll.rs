//! Waiting on several file descriptors at once: the runtime's one `ppoll` wrapper, under the
//! names the adaptor and the gateway use.

pub use pmnet_runtime::{poll as wait, yield_cpu, PollFd};

//! Graceful shutdown: SIGINT and SIGTERM set a shared flag that every loop checks between
//! batches. A loop that sees it finishes the batch in hand (persists, applies, sends what it
//! owes) and returns; nothing received is dropped half-way. A second signal while shutting
//! down exits at once.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A shared "please stop" flag.
#[derive(Debug, Clone, Default)]
pub struct Shutdown {
    flag: Arc<AtomicBool>,
}

impl Shutdown {
    /// A flag that only [`Shutdown::request`] sets.
    pub fn new() -> Shutdown {
        Shutdown::default()
    }

    /// A flag that SIGINT and SIGTERM set. A second such signal terminates the process with
    /// exit status 1 without waiting.
    pub fn on_signals() -> io::Result<Shutdown> {
        let shutdown = Shutdown::new();
        for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
            // Registered first, so it sees the flag as it was before this signal set it.
            signal_hook::flag::register_conditional_shutdown(signal, 1, shutdown.flag.clone())?;
            signal_hook::flag::register(signal, shutdown.flag.clone())?;
        }
        Ok(shutdown)
    }

    pub fn request(&self) {
        self.flag.store(true, Ordering::SeqCst);
    }

    pub fn is_requested(&self) -> bool {
        self.flag.load(Ordering::Relaxed)
    }

    /// The flag itself, for code that takes an `AtomicBool`.
    pub fn flag(&self) -> &Arc<AtomicBool> {
        &self.flag
    }
}

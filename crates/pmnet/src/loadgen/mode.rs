//! The benchmark's modes: what a client's requests go to and what they wait for.

use clap::ValueEnum;

/// A benchmark mode: what the client's requests go to and what they wait for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// UDP echo off the device's loop: the floor for any ack.
    Echo,
    /// Straight to the server: the client waits for the server's reply.
    Baseline,
    /// Through the device's forward port (logging off): a plain switch.
    Forward,
    /// Through the device's PMNet port: updates complete on the PMNet-ACK.
    Pmnet,
    /// `baseline` with every datagram authenticated (the `--key-file` keys, or a fresh key).
    BaselineAuth,
    /// `forward` with every datagram authenticated.
    ForwardAuth,
    /// `pmnet` with every datagram authenticated.
    PmnetAuth,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Echo => "echo",
            Mode::Baseline => "baseline",
            Mode::Forward => "forward",
            Mode::Pmnet => "pmnet",
            Mode::BaselineAuth => "baseline-auth",
            Mode::ForwardAuth => "forward-auth",
            Mode::PmnetAuth => "pmnet-auth",
        }
    }

    /// The mode without authentication: where its requests go and what they wait for.
    pub fn path(self) -> Mode {
        match self {
            Mode::BaselineAuth => Mode::Baseline,
            Mode::ForwardAuth => Mode::Forward,
            Mode::PmnetAuth => Mode::Pmnet,
            plain => plain,
        }
    }

    /// Whether the mode authenticates every datagram whatever `--key-file` says.
    pub fn is_authenticated(self) -> bool {
        self.path() != self
    }

    pub fn waits_for(self) -> &'static str {
        match self {
            Mode::Echo => "a UDP echo from the device (the floor)",
            Mode::Baseline => "the server's reply, sent directly",
            Mode::Forward => "the server's reply via the device, no log",
            Mode::Pmnet => "the device's PMNet-ACK (after its log write)",
            Mode::BaselineAuth => "as baseline, every datagram authenticated",
            Mode::ForwardAuth => "as forward, every datagram authenticated",
            Mode::PmnetAuth => "as pmnet, every datagram authenticated",
        }
    }
}

//! `pmnet`: the PMNet device, server, client, gateway, demo and simulator in one command.
//! The benchmarks are in `pmnet-bench` (crates/bench); `pmnet bench …` and the like run it.

fn main() -> std::process::ExitCode {
    pmnet::cli::main()
}

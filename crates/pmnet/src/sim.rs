//! `pmnet sim`: not written yet (placeholder so the command compiles).

use std::process::ExitCode;

use clap::Args;

use crate::CliError;

#[derive(Debug, Clone, Args)]
pub struct SimArgs {}

pub fn run(_args: SimArgs) -> Result<ExitCode, CliError> {
    Err("pmnet sim is not implemented yet".into())
}

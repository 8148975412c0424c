//! `pmnet bench`: not written yet (placeholder so the command compiles).

use std::process::ExitCode;

use clap::Args;

use crate::CliError;

#[derive(Debug, Clone, Args)]
pub struct BenchArgs {}

pub fn run(_args: BenchArgs) -> Result<ExitCode, CliError> {
    Err("pmnet bench is not implemented yet".into())
}

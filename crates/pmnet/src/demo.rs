//! `pmnet demo`: not written yet (placeholder so the command compiles).

use std::process::ExitCode;

use clap::Args;

use crate::CliError;

#[derive(Debug, Clone, Args)]
pub struct DemoArgs {}

pub fn run(_args: DemoArgs) -> Result<ExitCode, CliError> {
    Err("pmnet demo is not implemented yet".into())
}

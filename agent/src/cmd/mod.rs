//! The subcommands of the `palisade` binary.

use std::io::Write;

pub mod daemon;
pub mod doctor;
pub mod model;
pub mod policy;
pub mod rules;
pub mod run;
mod session;
pub mod top;

/// How a command prints what it found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// For a person to read.
    #[default]
    Text,
    /// One JSON document, its field names stable (docs/usage.md lists them).
    Json,
}

/// The `--output` argument of a command that reports.
#[derive(Debug, Clone, Copy, clap::Args)]
pub struct OutputArgs {
    /// How to print it.
    #[arg(long, value_enum, default_value_t)]
    pub output: Output,
}

/// Writes `report` as one JSON document (pretty, ending in a newline).
fn write_json(out: &mut impl Write, report: &impl serde::Serialize) -> anyhow::Result<()> {
    serde_json::to_writer_pretty(&mut *out, report)?;
    writeln!(out)?;
    Ok(())
}

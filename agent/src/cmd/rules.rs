//! `palisade rules build DIR` and `palisade rules inspect FILE`: make and check rule modules.

use std::{
    io::Write,
    path::{Path, PathBuf},
};

use super::{Output, OutputArgs, write_json};
use crate::rules::{Inspection, RuleHost};

#[derive(Debug, clap::Subcommand)]
pub enum RulesCommand {
    /// Build the rule module in DIR: a Rust crate (palisade-rule-sdk) wrapped as a component, or
    /// DIR's Rego files compiled by `opa build -t wasm`; prints its SHA-256 digest, which policies
    /// name it by.
    Build {
        /// A Rust rule crate (with Cargo.toml) or a directory of *.rego files.
        dir: PathBuf,
        /// Where to write the component (default: DIR's name with .wasm, here).
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
    /// Show a module's digest, size, imports and exports, and whether this agent runs it.
    Inspect {
        /// A built module (.wasm).
        file: PathBuf,
        #[command(flatten)]
        output: OutputArgs,
    },
}

/// Runs the command; Ok(false) when an inspected module cannot run here.
pub fn run(command: RulesCommand, out: &mut impl Write) -> anyhow::Result<bool> {
    match command {
        RulesCommand::Build { dir, out: file } => {
            let file = file.unwrap_or_else(|| {
                let name = dir
                    .canonicalize()
                    .ok()
                    .and_then(|dir| dir.file_name().map(|name| name.to_owned()))
                    .unwrap_or_else(|| "rule".into());
                PathBuf::from(name).with_extension("wasm")
            });
            let digest = crate::rules::build(&dir, &file)?;
            writeln!(out, "{digest}  {}", file.display())?;
            Ok(true)
        }
        RulesCommand::Inspect {
            file,
            output: OutputArgs { output },
        } => {
            let inspection = RuleHost::new(None)?.inspect(&file)?;
            match output {
                Output::Text => {
                    writeln!(out, "module   {}", file.display())?;
                    writeln!(out, "sha256   {}", inspection.digest)?;
                    writeln!(out, "kind     {}", inspection.kind)?;
                    writeln!(out, "size     {} bytes", inspection.size)?;
                    for import in &inspection.imports {
                        writeln!(out, "import   {import}")?;
                    }
                    for export in &inspection.exports {
                        writeln!(out, "export   {export}")?;
                    }
                    match &inspection.refused {
                        None => writeln!(out, "abi      ok: this agent runs it")?,
                        Some(reason) => writeln!(out, "abi      refused: {reason}")?,
                    }
                }
                Output::Json => write_json(
                    out,
                    &Inspected {
                        module: &file,
                        runnable: inspection.refused.is_none(),
                        inspection: &inspection,
                    },
                )?,
            }
            Ok(inspection.refused.is_none())
        }
    }
}

/// `rules inspect --output json`: the module's file and whether this agent runs it, then what
/// it is.
#[derive(serde::Serialize)]
struct Inspected<'a> {
    module: &'a Path,
    runnable: bool,
    #[serde(flatten)]
    inspection: &'a Inspection,
}

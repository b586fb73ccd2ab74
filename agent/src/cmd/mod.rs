//! The subcommands of the `palisade` binary.

pub mod daemon;
pub mod doctor;
pub mod policy;
pub mod run;

use std::{fs::OpenOptions, io::Write, path::Path};

use anyhow::Context;

/// Where events go: a file (appended to) or the given default stream.
fn event_sink(
    file: Option<&Path>,
    default: Box<dyn Write + Send>,
) -> anyhow::Result<Box<dyn Write + Send>> {
    Ok(match file {
        Some(path) => Box::new(
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .with_context(|| format!("opening the event file {}", path.display()))?,
        ),
        None => default,
    })
}

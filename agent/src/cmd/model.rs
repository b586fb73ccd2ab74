//! `palisade model show FILE`, `model diff A B` and `model to-policy FILE`: review what a
//! BehaviorModeling policy recorded, compare two models, and write the allowlist a model stands
//! for.

use std::{fmt::Display, io::Write, path::PathBuf};

use clap::ValueEnum;

use crate::behavior::{Allowlist, BehaviorModel, Counted, ModelDiff};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// For a person to read.
    Text,
    /// One JSON document (the model's own field names for `show`).
    Json,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PolicyOutput {
    /// The policy file, with comments for its reviewer.
    Yaml,
    /// The policy alone, as JSON (for `kubectl apply -f -` or jq).
    Json,
}

#[derive(Debug, clap::Subcommand)]
pub enum ModelCommand {
    /// Summarize a model: what the workload did, and how often.
    Show {
        /// A model the agent wrote (in its --models-dir).
        file: PathBuf,
        #[arg(long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
    /// What the workload did in model B and not in model A, and the reverse (counts aside).
    Diff {
        /// The model before.
        a: PathBuf,
        /// The model after.
        b: PathBuf,
        #[arg(long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
    /// Write the DefenseInDepth policy that allows what the model saw, as a trial
    /// (allowViolations) to review before enforcing.
    ToPolicy {
        /// A model the agent wrote.
        file: PathBuf,
        #[arg(long, value_enum, default_value_t = PolicyOutput::Yaml)]
        output: PolicyOutput,
    },
}

pub fn run(command: ModelCommand, out: &mut impl Write) -> anyhow::Result<()> {
    match command {
        ModelCommand::Show { file, output } => {
            let model = BehaviorModel::load(&file)?;
            match output {
                Output::Text => show(&model, out)?,
                Output::Json => writeln!(out, "{}", serde_json::to_string_pretty(&model)?)?,
            }
        }
        ModelCommand::Diff { a, b, output } => {
            let diff = ModelDiff::of(&BehaviorModel::load(&a)?, &BehaviorModel::load(&b)?);
            match output {
                Output::Text => show_diff(&diff, out)?,
                Output::Json => writeln!(out, "{}", serde_json::to_string_pretty(&diff)?)?,
            }
        }
        ModelCommand::ToPolicy { file, output } => {
            let allowlist = Allowlist::of(&BehaviorModel::load(&file)?);
            match output {
                PolicyOutput::Yaml => write!(out, "{}", allowlist.to_yaml())?,
                PolicyOutput::Json => {
                    writeln!(out, "{}", serde_json::to_string_pretty(&allowlist.policy)?)?
                }
            }
        }
    }
    Ok(())
}

/// A section: its title and count, then one line per thing done, with how many times (or
/// "none").
fn section<T: Display>(
    out: &mut impl Write,
    title: &str,
    done: &[Counted<T>],
) -> std::io::Result<()> {
    if done.is_empty() {
        return writeln!(out, "{title}: none");
    }
    writeln!(out, "{title} ({}):", done.len())?;
    for Counted { what, count } in done {
        writeln!(out, "  {count:>8}  {what}")?;
    }
    Ok(())
}

fn show(model: &BehaviorModel, out: &mut impl Write) -> std::io::Result<()> {
    writeln!(
        out,
        "model of policy \"{}\" ({})\ntarget: {}\nrecorded: {} to {} ({} s{})",
        model.policy,
        model.source,
        model.target,
        model.started,
        model.ended,
        model.duration_seconds,
        if model.complete { "" } else { ", CUT SHORT" },
    )?;
    if model.lost > 0 {
        writeln!(
            out,
            "LOST: {} operations the kernel could not record (its record map was full: \
             --max-model-records)",
            model.lost
        )?;
    }
    writeln!(out, "files ({}):", model.files.len())?;
    for file in &model.files {
        let mut line = format!(
            "  {:>8}  {:<14} {}  ({})",
            file.count,
            file.permissions.join(","),
            if file.path.is_empty() {
                "(no path)"
            } else {
                &file.path
            },
            file.hooks.join(", ")
        );
        if let Some(collapsed) = &file.collapsed {
            line += &format!(": {} files collapsed, {}", collapsed.files, collapsed.rule);
        }
        writeln!(out, "{line}")?;
    }
    section(out, "executables", &model.executables)?;
    section(out, "capabilities", &model.capabilities)?;
    section(out, "sockets", &model.sockets)?;
    section(out, "peers", &model.peers)?;
    section(out, "mounts", &model.mounts)?;
    section(out, "other operations", &model.operations)
}

fn show_diff(diff: &ModelDiff, out: &mut impl Write) -> std::io::Result<()> {
    if diff.same {
        return writeln!(out, "the models are the same (counts aside)");
    }
    let files = &diff.files;
    if !files.is_empty() || !diff.file_permissions.is_empty() {
        writeln!(out, "files:")?;
        for file in &files.added {
            writeln!(out, "  + {} ({})", file.path, file.permissions.join(","))?;
        }
        for file in &files.removed {
            writeln!(out, "  - {} ({})", file.path, file.permissions.join(","))?;
        }
        for change in &diff.file_permissions {
            writeln!(
                out,
                "  ~ {}: {} -> {}",
                change.path,
                change.before.join(","),
                change.after.join(",")
            )?;
        }
    }
    for (title, changes) in diff.categories() {
        if changes.is_empty() {
            continue;
        }
        writeln!(out, "{title}:")?;
        for added in &changes.added {
            writeln!(out, "  + {added}")?;
        }
        for removed in &changes.removed {
            writeln!(out, "  - {removed}")?;
        }
    }
    Ok(())
}

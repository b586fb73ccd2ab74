//! `palisade model show FILE`, `model diff A B`, `model transform FILE --module M` and
//! `model to-policy FILE`: review what a BehaviorModeling policy recorded, compare two models,
//! rewrite one with a model transform, and write the allowlist a model stands for.

use std::{
    fmt::Display,
    io::Write,
    path::{Path, PathBuf},
};

use clap::ValueEnum;

use super::{Output, OutputArgs, write_json};
use crate::{
    behavior::{Allowlist, BehaviorModel, Counted, ModelDiff, load_model, transform},
    rules::RuleHost,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FileOutput {
    /// As a file: a policy with comments for its reviewer, a model as the agent writes it.
    Yaml,
    /// As JSON (for `kubectl apply -f -` or jq).
    Json,
}

/// A model transform to run on the model, and its configuration.
#[derive(Debug, clap::Args)]
pub struct TransformArgs {
    /// The model transform: a component built with `palisade rules build` from a crate using
    /// `palisade_rule_sdk::model_transform!`, or Rego files defining `palisade.transform`.
    #[arg(long)]
    module: PathBuf,
    /// Its configuration, as JSON.
    #[arg(long, default_value = "{}", value_parser = json)]
    config: serde_json::Value,
}

fn json(text: &str) -> Result<serde_json::Value, String> {
    serde_json::from_str(text).map_err(|err| format!("not JSON: {err}"))
}

#[derive(Debug, clap::Subcommand)]
pub enum ModelCommand {
    /// Summarize a model: what the workload did, and how often.
    Show {
        /// A model the agent wrote (in its --models-dir).
        file: PathBuf,
        #[command(flatten)]
        output: OutputArgs,
    },
    /// What the workload did in model B and not in model A, and the reverse (counts aside).
    Diff {
        /// The model before.
        a: PathBuf,
        /// The model after.
        b: PathBuf,
        #[command(flatten)]
        output: OutputArgs,
    },
    /// Rewrite a model with a model transform (a Wasm or Rego module): drop what is noise,
    /// widen files to their directory. Writes the model it makes.
    Transform {
        /// A model the agent wrote.
        file: PathBuf,
        #[command(flatten)]
        transform: TransformArgs,
        /// How to write it.
        #[arg(long, value_enum, default_value_t = FileOutput::Yaml)]
        output: FileOutput,
    },
    /// Write the DefenseInDepth policy that allows what the model saw, as a trial
    /// (allowViolations) to review before enforcing.
    ToPolicy {
        /// A model the agent wrote.
        file: PathBuf,
        /// A model transform to rewrite the model with first.
        #[arg(long)]
        module: Option<PathBuf>,
        /// The model transform's configuration, as JSON.
        #[arg(long, requires = "module", default_value = "{}", value_parser = json)]
        config: serde_json::Value,
        /// How to write it.
        #[arg(long, value_enum, default_value_t = FileOutput::Yaml)]
        output: FileOutput,
    },
}

pub fn run(command: ModelCommand, out: &mut impl Write) -> anyhow::Result<()> {
    match command {
        ModelCommand::Show {
            file,
            output: OutputArgs { output },
        } => {
            let model = load_model(&file)?;
            match output {
                Output::Text => show(&model, out)?,
                Output::Json => write_json(out, &model)?,
            }
        }
        ModelCommand::Diff {
            a,
            b,
            output: OutputArgs { output },
        } => {
            let diff = ModelDiff::of(&load_model(&a)?, &load_model(&b)?);
            match output {
                Output::Text => show_diff(&diff, out)?,
                Output::Json => write_json(out, &diff)?,
            }
        }
        ModelCommand::Transform {
            file,
            transform: TransformArgs { module, config },
            output,
        } => {
            let model = transformed(load_model(&file)?, &module, &config)?;
            match output {
                FileOutput::Yaml => write!(out, "{}", serde_yaml::to_string(&model)?)?,
                FileOutput::Json => write_json(out, &model)?,
            }
        }
        ModelCommand::ToPolicy {
            file,
            module,
            config,
            output,
        } => {
            let mut model = load_model(&file)?;
            if let Some(module) = module {
                model = transformed(model, &module, &config)?;
            }
            let allowlist = Allowlist::of(&model);
            match output {
                FileOutput::Yaml => write!(out, "{}", allowlist.to_yaml())?,
                FileOutput::Json => write_json(out, &allowlist.policy)?,
            }
        }
    }
    Ok(())
}

/// `model` rewritten by the model transform at `module` with `config`.
fn transformed(
    model: BehaviorModel,
    module: &Path,
    config: &serde_json::Value,
) -> anyhow::Result<BehaviorModel> {
    let host = RuleHost::new(None)?;
    transform(&host, module, config, &model)
        .map_err(|err| anyhow::anyhow!("{}: {err}", module.display()))
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

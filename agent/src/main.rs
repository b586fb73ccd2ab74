use std::{io::IsTerminal, path::PathBuf, process::ExitCode};

use clap::{CommandFactory, Parser, Subcommand};
use palisade_agent::cmd;

#[derive(Parser)]
#[command(
    name = "palisade",
    version,
    about = "In-kernel runtime security with BPF LSM"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Enforce every policy file in a directory, following its changes. Enforcement is pinned
    /// in the kernel: it goes on when the agent stops, and a restarted agent takes it over.
    Agent(Box<cmd::daemon::AgentArgs>),
    /// Run one command in a fresh cgroup under a policy. Exits with the command's status; 126 when
    /// it cannot be executed, 127 when it is not found, 125 when palisade itself fails.
    Run {
        /// The policy the command runs under (its spec.target is ignored).
        #[arg(long, value_name = "FILE")]
        policy: PathBuf,
        /// Append audit events (JSON lines) to FILE instead of stderr.
        #[arg(long, value_name = "FILE")]
        events: Option<PathBuf>,
        /// The command and its arguments, after `--`.
        #[arg(last = true, required = true, value_name = "CMD")]
        command: Vec<String>,
    },
    /// Report whether this machine can enforce, and which check fails if not.
    Doctor(cmd::OutputArgs),
    /// Show live decisions per rule and their kernel cost, from a running agent's metrics.
    Top(cmd::top::TopArgs),
    /// Work with policy files.
    Policy {
        #[command(subcommand)]
        command: PolicyCommand,
    },
    /// Review what BehaviorModeling policies recorded, and turn a model into a policy.
    Model {
        #[command(subcommand)]
        command: cmd::model::ModelCommand,
    },
    /// Build and inspect rule modules (WebAssembly components).
    Rules {
        #[command(subcommand)]
        command: cmd::rules::RulesCommand,
    },
    /// Print the shell completion script for SHELL, e.g.
    /// `palisade completions bash > /etc/bash_completion.d/palisade`.
    Completions {
        /// bash, elvish, fish, powershell or zsh.
        shell: clap_complete::Shell,
    },
}

#[derive(Subcommand)]
enum PolicyCommand {
    /// Print the BPF map entries a policy compiles to.
    Compile {
        /// A policy file (or PalisadePolicy or PalisadeClusterPolicy object).
        file: PathBuf,
        #[command(flatten)]
        output: cmd::OutputArgs,
    },
    /// Check what a policy decides on the events of its fixtures (POLICY FIXTURES), or run a rule
    /// module on its fixtures (DIR/fixtures/*.json) in the agent's sandbox (DIR).
    Test {
        /// A policy file (or PalisadePolicy or PalisadeClusterPolicy object) with FIXTURES; or a
        /// rule module's directory (its crate or Rego files) with a fixtures/ directory.
        #[arg(value_name = "POLICY|DIR")]
        path: PathBuf,
        /// The policy's fixtures: a YAML list of {name, event, expect: {action, rule}}.
        fixtures: Option<PathBuf>,
        /// The built module (default: build DIR now).
        #[arg(long, value_name = "FILE", conflicts_with = "fixtures")]
        module: Option<PathBuf>,
        #[command(flatten)]
        output: cmd::OutputArgs,
    },
    /// Show which recorded events a candidate policy would deny or audit, per rule.
    Replay {
        /// Events the agent wrote (JSON lines).
        #[arg(long, value_name = "FILE")]
        events: PathBuf,
        /// The candidate policy file (or PalisadePolicy or PalisadeClusterPolicy object).
        #[arg(long, value_name = "FILE")]
        policy: PathBuf,
        #[command(flatten)]
        output: cmd::OutputArgs,
    },
}

fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
}

/// No transparent huge pages for the agent. Its allocator (mimalloc, see lib.rs) touches memory
/// spread over large aligned regions, and where the kernel gives huge pages by default (Debian's
/// kernels do) each region touched would cost 2 MiB of resident memory. Not for `palisade run`:
/// the command it runs would inherit the setting.
fn small_pages_only() {
    // SAFETY: prctl with integer arguments has no memory preconditions.
    if unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) } != 0 {
        tracing::warn!(
            "cannot turn transparent huge pages off: {}",
            std::io::Error::last_os_error()
        );
    }
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let result = match Cli::parse().command {
        Command::Agent(args) if args.cleanup => {
            cmd::daemon::cleanup(&args.bpffs).map(|()| ExitCode::SUCCESS)
        }
        Command::Agent(args) => {
            small_pages_only();
            runtime()
                .map_err(Into::into)
                .and_then(|rt| rt.block_on(cmd::daemon::run(*args)))
                .map(|()| ExitCode::SUCCESS)
        }
        Command::Run {
            policy,
            events,
            command,
        } => Ok(runtime()
            .map_err(Into::into)
            .and_then(|rt| {
                rt.block_on(cmd::run::run(cmd::run::RunArgs {
                    policy,
                    events,
                    command,
                }))
            })
            .map_or_else(|err| failed(&err, cmd::run::FAILED), ExitCode::from)),
        Command::Top(args) => runtime()
            .map_err(Into::into)
            .and_then(|rt| {
                let terminal = std::io::stdout().is_terminal();
                rt.block_on(cmd::top::run(args, &mut std::io::stdout(), terminal))
            })
            .map(|()| ExitCode::SUCCESS),
        Command::Rules { command } => {
            cmd::rules::run(command, &mut std::io::stdout()).map(|runnable| {
                if runnable {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::FAILURE
                }
            })
        }
        Command::Model { command } => {
            cmd::model::run(command, &mut std::io::stdout()).map(|()| ExitCode::SUCCESS)
        }
        Command::Completions { shell } => {
            clap_complete::generate(
                shell,
                &mut Cli::command(),
                "palisade",
                &mut std::io::stdout(),
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Doctor(cmd::OutputArgs { output }) => {
            cmd::doctor::run(output, &mut std::io::stdout()).map(|ready| {
                if ready {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::FAILURE
                }
            })
        }
        Command::Policy {
            command:
                PolicyCommand::Test {
                    path,
                    fixtures,
                    module,
                    output: cmd::OutputArgs { output },
                },
        } => {
            let stdout = &mut std::io::stdout();
            match fixtures {
                Some(fixtures) => cmd::policy::test_policy(&path, &fixtures, output, stdout),
                None if path.is_file() => Err(anyhow::anyhow!(
                    "{}: a policy is tested on fixtures: policy test POLICY FIXTURES",
                    path.display()
                )),
                None => cmd::policy::test_module(&path, module.as_deref(), output, stdout),
            }
            .map(|passed| {
                if passed {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::FAILURE
                }
            })
        }
        Command::Policy {
            command:
                PolicyCommand::Replay {
                    events,
                    policy,
                    output: cmd::OutputArgs { output },
                },
        } => cmd::policy::replay(&events, &policy, output, &mut std::io::stdout())
            .map(|()| ExitCode::SUCCESS),
        Command::Policy {
            command:
                PolicyCommand::Compile {
                    file,
                    output: cmd::OutputArgs { output },
                },
        } => {
            cmd::policy::compile(&file, output, &mut std::io::stdout()).map(|()| ExitCode::SUCCESS)
        }
    };
    result.unwrap_or_else(|err| failed(&err, 1))
}

/// Reports `err` and exits with `code`.
fn failed(err: &anyhow::Error, code: u8) -> ExitCode {
    eprintln!("palisade: error: {err:#}");
    ExitCode::from(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The subcommands and arguments of `command`, and of every subcommand below it, that have
    /// no help text.
    fn without_help(command: &clap::Command, path: &str, found: &mut Vec<String>) {
        let path = format!("{path} {}", command.get_name());
        for arg in command.get_arguments() {
            if arg.get_help().is_none() && !["help", "version"].contains(&arg.get_id().as_str()) {
                found.push(format!("{path} {}", arg.get_id()));
            }
        }
        for subcommand in command.get_subcommands() {
            if subcommand.get_about().is_none() {
                found.push(format!("{path} {}", subcommand.get_name()));
            }
            without_help(subcommand, &path, found);
        }
    }

    #[test]
    fn every_command_and_argument_has_help() {
        let cli = Cli::command();
        cli.clone().debug_assert();
        let mut found = Vec::new();
        without_help(&cli, "", &mut found);
        assert_eq!(found, [] as [String; 0]);
    }
}

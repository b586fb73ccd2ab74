//! Rule modules: WebAssembly components of the `palisade:rule` world (rule-sdk/wit/rule.wit) that
//! compile a policy's configuration into kernel rules and decide what happens to its audit
//! events; model transforms, of the package's `model-transform` world, rewrite behaviour models
//! (`crate::behavior::transform`). They run sandboxed in wasmtime with no imports at all: a
//! memory cap per instance and a time budget per call (epoch interruption). A module that
//! misbehaves is stopped within its budget, the call fails with a reason, and the agent goes on.

mod abi;
mod build;
mod host;
mod opa;
mod sandbox;

pub use abi::{
    ABI_VERSION, Event, Severity, Verdict,
    types::{Action, Context, Entry, FileRule, Matcher, NetworkRule, Permission, Protocol},
};
pub use build::build;
pub use host::{
    FailureKind, Inspection, LoadedModule, ModuleError, ModuleInstance, RuleHost, hex_digest,
};

use std::{fmt::Display, path::Path};

use crate::policy::{
    self, CapabilityRule, CompiledPolicy, CustomRules, Environment, ExecRule, MountRule,
    NetworkRule as PolicyNetworkRule, Policy, PolicyError, PortRange,
};

/// Compiles `policy` (from `source`, which errors name) with the kernel rules of its rule
/// modules, which `host` loads from `modules` (a policy file's directory) and runs.
pub fn compile_policy(
    host: &RuleHost,
    source: &dyn Display,
    modules: &Path,
    policy: &Policy,
    env: &Environment,
) -> Result<CompiledPolicy, PolicyError> {
    let context = Context {
        policy: policy.metadata.name.clone(),
        node: env.node.clone(),
        kube_apiserver: env.kube_apiserver.clone(),
    };
    let rules = compile_modules(host, source, modules, policy, &context)?;
    policy::compile(source, policy, env, &rules)
}

/// Loads each of `policy`'s rule modules and compiles its config: the kernel rules of
/// `spec.ruleModules[i]` are element `i`, as custom rules (the compiler checks them like rules
/// written in a policy). Module files are found relative to `dir`.
fn compile_modules(
    host: &RuleHost,
    source: &dyn Display,
    dir: &Path,
    policy: &Policy,
    context: &Context,
) -> Result<Vec<CustomRules>, PolicyError> {
    policy
        .spec
        .rule_modules
        .iter()
        .enumerate()
        .map(|(index, module)| {
            let field = format!("spec.ruleModules[{index}] ({})", module.name);
            let error = |reason: String| PolicyError::new(source, &field, reason);
            let loaded = host
                .load(&dir.join(&module.module), &module.sha256)
                .map_err(|err| error(err.to_string()))?;
            let entries = loaded
                .compile(&module.config.to_string(), context)
                .map_err(|err| error(format!("compiling its config: {err}")))?;
            custom_rules(entries).map_err(error)
        })
        .collect()
}

/// A module's entries as the custom rules they stand for.
fn custom_rules(entries: Vec<Entry>) -> Result<CustomRules, String> {
    let mut custom = CustomRules::default();
    for (
        index,
        Entry {
            name,
            matcher,
            action,
        },
    ) in entries.into_iter().enumerate()
    {
        if name.is_empty() {
            return Err(format!("rule {index} of the module has no name"));
        }
        let name = Some(name);
        let action = match action {
            Action::Deny => policy::Action::Deny,
            Action::Audit => policy::Action::Audit,
        };
        match matcher {
            Matcher::Files(FileRule { paths, permissions }) => {
                custom.files.push(policy::FileRule {
                    name,
                    paths,
                    permissions: permissions
                        .into_iter()
                        .map(|permission| match permission {
                            Permission::Read => policy::Permission::Read,
                            Permission::Write => policy::Permission::Write,
                            Permission::Append => policy::Permission::Append,
                            Permission::Exec => policy::Permission::Exec,
                        })
                        .collect(),
                    action,
                })
            }
            Matcher::Exec(paths) => custom.exec.push(ExecRule {
                name,
                paths,
                action,
            }),
            Matcher::Network(NetworkRule {
                addresses,
                ports,
                protocols,
            }) => custom.network.push(PolicyNetworkRule {
                name,
                addresses,
                ports: ports.into_iter().map(PortRange::Range).collect(),
                protocols: protocols
                    .into_iter()
                    .map(|protocol| match protocol {
                        Protocol::Tcp => policy::Protocol::Tcp,
                        Protocol::Udp => policy::Protocol::Udp,
                        Protocol::Icmp => policy::Protocol::Icmp,
                    })
                    .collect(),
                action,
            }),
            // "*" is every mount, as an empty list is in a policy.
            Matcher::Mount(fs_types) => custom.mount.push(MountRule {
                name,
                fs_types: fs_types
                    .into_iter()
                    .filter(|fs_type| fs_type != "*")
                    .collect(),
                action,
            }),
            Matcher::Capabilities(capabilities) => custom.capabilities.push(CapabilityRule {
                name,
                capabilities,
                action,
            }),
        }
    }
    Ok(custom)
}

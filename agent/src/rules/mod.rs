//! Rule modules: WebAssembly components of the `palisade:rule` world (rule-sdk/wit/rule.wit) that
//! compile a policy's configuration into kernel rules and decide what happens to its audit
//! events; model transforms, of the package's `model-transform` world, rewrite behaviour models
//! (`crate::behavior::transform`). They run sandboxed in wasmtime with no imports at all: a
//! memory cap per instance and a time budget per call (epoch interruption). A module that
//! misbehaves is stopped within its budget, the call fails with a reason, and the agent goes on.

mod abi;
mod build;
mod host;
pub(crate) mod opa;
mod sandbox;

pub use abi::{
    ABI_VERSION, Event, Severity, Verdict,
    types::{
        Action, Context, Entry, FileRule, Matcher, NetworkRule, Permission, Protocol, SocketRule,
    },
};
pub use build::build;
pub use host::{
    FailureKind, Inspection, LoadedModule, ModuleError, ModuleInstance, RuleHost, hex_digest,
};
pub use sandbox::DECIDE_BUDGET;

use std::{
    fmt::Display,
    path::{Component, Path},
};

use crate::policy::{
    self, AllowRules, CapabilityRule, CompiledPolicy, CustomRules, Environment, ExecRule,
    FileAllow, ModuleRules, MountRule, NetworkAllow, NetworkRule as PolicyNetworkRule, Policy,
    PolicyError, PortRange, SocketAllow, SocketRule as PolicySocketRule, module_field,
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

/// Loads each of `policy`'s rule modules and compiles its config: the rules of
/// `spec.ruleModules[i]` are element `i`. Module files are found relative to `dir`.
fn compile_modules(
    host: &RuleHost,
    source: &dyn Display,
    dir: &Path,
    policy: &Policy,
    context: &Context,
) -> Result<Vec<ModuleRules>, PolicyError> {
    policy
        .spec
        .rule_modules
        .iter()
        .enumerate()
        .map(|(index, module)| {
            let field = module_field(index, module);
            let error = |reason: String| PolicyError::new(source, &field, reason);
            // Only a file of the module directory: a policy's author (in Kubernetes, any
            // namespace's) must not have the agent read other files, nor learn their digests.
            let file = Path::new(&module.module);
            if !file
                .components()
                .all(|part| matches!(part, Component::Normal(_) | Component::CurDir))
            {
                return Err(error(format!(
                    "module \"{}\": must be a path relative to the module directory, without \
                     \"..\"",
                    module.module
                )));
            }
            let loaded = host
                .load(&dir.join(file), &module.sha256)
                .map_err(|err| error(err.to_string()))?;
            let entries = loaded
                .compile(&module.config.to_string(), context)
                .map_err(|err| error(format!("compiling its config: {err}")))?;
            module_rules(entries).map_err(error)
        })
        .collect()
}

/// A module's entries as the rules they stand for: its deny and audit rules as custom rules, its
/// allow rules as allow rules (the compiler checks both like rules written in a policy).
fn module_rules(entries: Vec<Entry>) -> Result<ModuleRules, String> {
    let mut rules = ModuleRules::default();
    for (index, entry) in entries.into_iter().enumerate() {
        if entry.name.is_empty() {
            return Err(format!("rule {index} of the module has no name"));
        }
        match entry.action {
            Action::Deny => custom_rule(&mut rules.custom, entry, policy::Action::Deny)?,
            Action::Audit => custom_rule(&mut rules.custom, entry, policy::Action::Audit)?,
            Action::Allow => {
                let name = entry.name.clone();
                rules.allow.push((name, allow_rule(entry)?));
            }
        }
    }
    Ok(rules)
}

/// Adds `entry`, a deny or audit rule, to `custom` with `action`.
fn custom_rule(
    custom: &mut CustomRules,
    Entry { name, matcher, .. }: Entry,
    action: policy::Action,
) -> Result<(), String> {
    match matcher {
        Matcher::Files(FileRule { paths, permissions }) => custom.files.push(policy::FileRule {
            name: Some(name),
            paths,
            permissions: permissions.into_iter().map(permission).collect(),
            action,
        }),
        Matcher::Exec(paths) => custom.exec.push(ExecRule {
            name: Some(name),
            paths,
            action,
        }),
        Matcher::Network(NetworkRule {
            addresses,
            ports,
            protocols,
        }) => custom.network.push(PolicyNetworkRule {
            name: Some(name),
            addresses,
            ports: ports.into_iter().map(PortRange::Range).collect(),
            protocols: protocols.into_iter().map(protocol).collect(),
            action,
        }),
        // "*" is every mount, as an empty list is in a policy.
        Matcher::Mount(fs_types) => custom.mount.push(MountRule {
            name: Some(name),
            fs_types: fs_types
                .into_iter()
                .filter(|fs_type| fs_type != "*")
                .collect(),
            action,
        }),
        Matcher::Capabilities(capabilities) => custom.capabilities.push(CapabilityRule {
            name: Some(name),
            capabilities,
            action,
        }),
        Matcher::Sockets(sockets) if sockets.is_empty() => {
            return Err(format!(
                "rule \"{name}\" matches nothing: its list of sockets is empty"
            ));
        }
        Matcher::Sockets(sockets) => {
            custom
                .sockets
                .extend(
                    sockets
                        .into_iter()
                        .map(|SocketRule { family, types }| PolicySocketRule {
                            name: Some(name.clone()),
                            family,
                            types,
                            action,
                        }),
                );
        }
        Matcher::UnixSockets(_) => {
            return Err(format!(
                "rule \"{name}\": unix-sockets rules can only allow"
            ));
        }
    }
    Ok(())
}

/// `entry`, an allow rule, as the allow rules of a policy: one list, not empty.
fn allow_rule(Entry { name, matcher, .. }: Entry) -> Result<AllowRules, String> {
    let mut allow = AllowRules::default();
    match matcher {
        // The compiler names an empty list of paths or permissions.
        Matcher::Files(FileRule { paths, permissions }) => allow.files.push(FileAllow {
            paths,
            permissions: permissions.into_iter().map(permission).collect(),
        }),
        Matcher::Exec(paths) => allow.exec = paths,
        Matcher::Network(NetworkRule {
            addresses,
            ports,
            protocols,
        }) => allow.network.push(NetworkAllow {
            addresses,
            ports: ports.into_iter().map(PortRange::Range).collect(),
            protocols: protocols.into_iter().map(protocol).collect(),
        }),
        Matcher::Mount(fs_types) => {
            if fs_types.iter().any(|fs_type| fs_type == "*") {
                return Err(format!(
                    "rule \"{name}\": an allow rule names the file system types it allows (\"*\" \
                     is every mount only in deny and audit rules)"
                ));
            }
            allow.mount = fs_types;
        }
        Matcher::Capabilities(capabilities) => allow.capabilities = capabilities,
        Matcher::Sockets(sockets) => {
            allow.sockets = sockets
                .into_iter()
                .map(|SocketRule { family, types }| SocketAllow { family, types })
                .collect();
        }
        Matcher::UnixSockets(paths) => allow.unix_sockets = paths,
    }
    // Only a list of names (programs, types, capabilities, sockets) leaves it as it was.
    if allow == AllowRules::default() {
        return Err(format!("rule \"{name}\" allows nothing: its list is empty"));
    }
    Ok(allow)
}

fn permission(permission: Permission) -> policy::Permission {
    match permission {
        Permission::Read => policy::Permission::Read,
        Permission::Write => policy::Permission::Write,
        Permission::Append => policy::Permission::Append,
        Permission::Exec => policy::Permission::Exec,
    }
}

fn protocol(protocol: Protocol) -> policy::Protocol {
    match protocol {
        Protocol::Tcp => policy::Protocol::Tcp,
        Protocol::Udp => policy::Protocol::Udp,
        Protocol::Icmp => policy::Protocol::Icmp,
    }
}

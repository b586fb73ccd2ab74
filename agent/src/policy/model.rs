//! The policy file format (`palisade.dev/v1alpha1`, kind `PalisadePolicy`) and its parsing.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::PolicyError;

pub const API_VERSION: &str = "palisade.dev/v1alpha1";
pub const KIND: &str = "PalisadePolicy";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Policy {
    pub api_version: String,
    pub kind: String,
    pub metadata: Metadata,
    pub spec: Spec,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Metadata {
    pub name: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Spec {
    /// Who is protected. Required by the agent; `palisade run` protects its own fresh cgroup.
    #[serde(default)]
    pub target: Option<Target>,
    pub mode: Mode,
    /// Only with `mode: EnhanceProtect`.
    #[serde(default)]
    pub enhance_protect: Option<EnhanceProtect>,
    #[serde(default)]
    pub rule_modules: Vec<RuleModule>,
}

/// A rule module the policy uses: it compiles `config` into kernel rules (enforced like custom
/// rules, in every mode but AlwaysAllow) and decides what happens to the policy's audit events.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RuleModule {
    /// Names the module's rules ("NAME/RULE") and its failures.
    pub name: String,
    /// The module file (a WebAssembly component), relative to the policy file's directory.
    pub module: String,
    /// The SHA-256 digest of the module file, in hex: any other content is refused.
    pub sha256: String,
    #[serde(default)]
    pub config: serde_json::Value,
    /// What happens to an event when the module fails to decide it.
    #[serde(default)]
    pub on_failure: OnFailure,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum OnFailure {
    /// The event goes on unchanged.
    #[default]
    Keep,
    /// The event is dropped (and counted).
    Drop,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Target {
    /// A cgroup v2 directory, absolute or relative to the cgroup2 mount. Covers its descendants.
    pub cgroup_path: String,
}

/// What a target is protected with (vArmor's modes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Mode {
    /// The programs watch the target; nothing is denied.
    AlwaysAllow,
    /// The container runtimes' default hardening: kernel interfaces in /proc and /sys, every
    /// mount, and tracing processes outside the target.
    RuntimeDefault,
    /// RuntimeDefault (unless `privileged`), plus named built-in rules and custom rules.
    EnhanceProtect,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EnhanceProtect {
    /// The target is a privileged container: the RuntimeDefault set is not applied.
    #[serde(default)]
    pub privileged: bool,
    #[serde(default)]
    pub hardening_rules: Vec<RuleRef>,
    #[serde(default)]
    pub attack_protection_rules: Vec<RuleRef>,
    #[serde(default)]
    pub vul_mitigation_rules: Vec<RuleRef>,
    #[serde(default)]
    pub custom_rules: CustomRules,
    /// Denials are also reported as audit events.
    #[serde(default)]
    pub audit_violations: bool,
    /// Nothing is denied: what would be is reported (a trial run of the policy).
    #[serde(default)]
    pub allow_violations: bool,
}

/// A built-in rule by name, with the action it takes (deny unless said otherwise).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum RuleRef {
    Name(String),
    WithAction { name: String, action: Action },
}

impl RuleRef {
    pub fn name(&self) -> &str {
        match self {
            RuleRef::Name(name) | RuleRef::WithAction { name, .. } => name,
        }
    }

    pub fn action(&self) -> Action {
        match self {
            RuleRef::Name(_) => Action::Deny,
            RuleRef::WithAction { action, .. } => *action,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CustomRules {
    #[serde(default)]
    pub files: Vec<FileRule>,
    #[serde(default)]
    pub exec: Vec<ExecRule>,
    #[serde(default)]
    pub network: Vec<NetworkRule>,
    #[serde(default)]
    pub mount: Vec<MountRule>,
    #[serde(default)]
    pub capabilities: Vec<CapabilityRule>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileRule {
    #[serde(default)]
    pub name: Option<String>,
    pub paths: Vec<String>,
    pub permissions: Vec<Permission>,
    pub action: Action,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExecRule {
    #[serde(default)]
    pub name: Option<String>,
    pub paths: Vec<String>,
    pub action: Action,
}

/// Outgoing connections and datagrams to `addresses` (IP or CIDR; all when empty) on `ports`
/// (a port or "low-high"; all when empty) over `protocols` (all when empty).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NetworkRule {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub addresses: Vec<String>,
    #[serde(default)]
    pub ports: Vec<PortRange>,
    #[serde(default)]
    pub protocols: Vec<Protocol>,
    pub action: Action,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum PortRange {
    Port(u16),
    Range(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Protocol {
    Tcp,
    Udp,
    Icmp,
}

/// New mounts of the listed file system types (every mount, remount, bind and move when empty).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MountRule {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub fs_types: Vec<String>,
    pub action: Action,
}

/// Capabilities by name, e.g. `sys_admin` or `CAP_SYS_ADMIN`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CapabilityRule {
    #[serde(default)]
    pub name: Option<String>,
    pub capabilities: Vec<String>,
    pub action: Action,
}

/// `read`, `write` (every open for writing, and truncating, deleting, renaming, linking and
/// changing the mode of the file), `append` (only opens with O_APPEND) and `exec`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Permission {
    Read,
    Write,
    Append,
    Exec,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Action {
    /// Allow and report.
    Audit,
    /// Refuse with EPERM (reported with `auditViolations`).
    Deny,
}

impl Policy {
    /// Parses one policy document. Errors name the file, the field and the reason.
    pub fn parse(file: &Path, text: &str) -> Result<Self, PolicyError> {
        let document = serde_yaml::Deserializer::from_str(text);
        let policy: Policy = serde_path_to_error::deserialize(document).map_err(|err| {
            let path = err.path().to_string();
            let message = err.into_inner().to_string();
            // serde_yaml starts its message with the path of the enclosing field (for an unknown
            // key, the map that holds it): use that as the field, and say it once.
            match message.split_once(": ") {
                Some((field, reason)) if path.starts_with(field) => {
                    PolicyError::new(file, field, reason)
                }
                _ => PolicyError::new(
                    file,
                    if path == "." { "(document)" } else { &path },
                    message,
                ),
            }
        })?;
        if policy.api_version != API_VERSION {
            return Err(PolicyError::new(
                file,
                "apiVersion",
                format!("expected \"{API_VERSION}\", got \"{}\"", policy.api_version),
            ));
        }
        if policy.kind != KIND {
            return Err(PolicyError::new(
                file,
                "kind",
                format!("expected \"{KIND}\", got \"{}\"", policy.kind),
            ));
        }
        if policy.metadata.name.is_empty() {
            return Err(PolicyError::new(file, "metadata.name", "must not be empty"));
        }
        Ok(policy)
    }

    pub fn load(file: &Path) -> Result<Self, PolicyError> {
        let text = std::fs::read_to_string(file)
            .map_err(|err| PolicyError::new(file, "(file)", format!("cannot read: {err}")))?;
        Self::parse(file, &text)
    }
}

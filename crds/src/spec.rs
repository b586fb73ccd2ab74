//! What a policy says: who is protected (`target`), how (`mode`), and with which rules. One
//! model for local policy files and for both custom resource kinds.

use std::{borrow::Cow, fmt};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::{KubeSchema, core::Rule};
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{
    Deserialize, Deserializer, Serialize,
    de::{self, MapAccess, Visitor},
};

use crate::rules::{Category, names_in};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[x_kube(
    validation = Rule::new("self.mode == 'EnhanceProtect' || self.mode == 'DefenseInDepth' || !has(self.enhanceProtect)").message("enhanceProtect is only allowed with modes EnhanceProtect and DefenseInDepth"),
    validation = Rule::new("(self.mode == 'BehaviorModeling') == has(self.behaviorModeling)").message("mode BehaviorModeling needs behaviorModeling (its duration), and only it takes one"),
    validation = Rule::new("(self.mode == 'DefenseInDepth') == has(self.defenseInDepth)").message("mode DefenseInDepth needs defenseInDepth (what the target may do), and only it takes one"),
)]
pub struct PolicySpec {
    /// Who is protected. Required by the agent; `palisade run` protects its own fresh cgroup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<Target>,
    pub mode: Mode,
    /// With `mode: EnhanceProtect`, or `DefenseInDepth` (its rules on top of the allowlist).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enhance_protect: Option<EnhanceProtect>,
    /// Only with `mode: BehaviorModeling`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub behavior_modeling: Option<BehaviorModeling>,
    /// Only with `mode: DefenseInDepth`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub defense_in_depth: Option<DefenseInDepth>,
    #[serde(default)]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    pub rule_modules: Vec<RuleModule>,
}

/// Who is protected: a cgroup (local policy files), or pods (Kubernetes) chosen by the workload
/// that owns them (`kind` and `names`) and/or by their labels (`selector`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[x_kube(
    validation = Rule::new("has(self.cgroupPath) != (has(self.names) || has(self.selector))").message("set either cgroupPath (local policy files) or names and/or selector (Kubernetes)"),
    validation = Rule::new("!has(self.names) || has(self.kind)").message("names need the kind of workload they name"),
)]
pub struct Target {
    /// Local policy files: a cgroup v2 directory, absolute or relative to the cgroup2 mount.
    /// Covers its descendants.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup_path: Option<String>,
    /// Kubernetes: the kind of workload whose pods are protected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<WorkloadKind>,
    /// Kubernetes: the names of the workloads of `kind` (in the policy's namespace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub names: Option<Vec<String>>,
    /// Kubernetes: the labels of the pods protected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
    /// PalisadeClusterPolicy: the labels of the namespaces whose pods are protected (all
    /// namespaces when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,
}

/// A workload that owns pods. A pod's owner is found through its owner references (a
/// Deployment through the ReplicaSet it made).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum WorkloadKind {
    Pod,
    Deployment,
    StatefulSet,
    DaemonSet,
    ReplicaSet,
    Job,
}

/// A rule module the policy uses: it compiles `config` into kernel rules (enforced like custom
/// rules, in every mode but AlwaysAllow) and decides what happens to the policy's audit events.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RuleModule {
    /// Names the module's rules ("NAME/RULE") and its failures.
    pub name: String,
    /// The module file (a WebAssembly component, or an OPA Wasm bundle's policy.wasm): relative
    /// to the policy file's directory, or in Kubernetes to the agent's module directory, without
    /// "..".
    pub module: String,
    /// The SHA-256 digest of the module file, in hex: any other content is refused.
    #[schemars(regex(pattern = "^[0-9a-f]{64}$"))]
    pub sha256: String,
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    #[schemars(schema_with = "any_object")]
    pub config: serde_json::Value,
    /// What happens to an event when the module fails to decide it.
    #[serde(default)]
    pub on_failure: OnFailure,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum OnFailure {
    /// The event goes on unchanged.
    #[default]
    Keep,
    /// The event is dropped (and counted).
    Drop,
}

/// What a target is protected with (vArmor's modes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum Mode {
    /// The programs watch the target; nothing is denied.
    #[default]
    AlwaysAllow,
    /// The container runtimes' default hardening: kernel interfaces in /proc and /sys, every
    /// mount, and tracing processes outside the target.
    RuntimeDefault,
    /// RuntimeDefault (unless `privileged`), plus named built-in rules and custom rules.
    EnhanceProtect,
    /// Nothing is denied but by the rule modules' rules, while the kernel records what the
    /// target does, for `behaviorModeling.duration`; then the agent writes the model.
    BehaviorModeling,
    /// An allowlist, as `palisade model to-policy` writes from a model: the files, programs,
    /// capabilities, peers, sockets and mounts `defenseInDepth.allow` does not allow are denied.
    DefenseInDepth,
}

/// How long a workload is modeled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BehaviorModeling {
    /// Hours, minutes and seconds, as "90s", "15m", "1h30m": from 1s to 168h (a week).
    #[schemars(
        regex(pattern = "^([0-9]+h)?([0-9]+m)?([0-9]+s)?$"),
        length(min = 2, max = 16)
    )]
    #[x_kube(validation = Rule::new("duration(self) >= duration('1s') && duration(self) <= duration('168h')").message("from 1s to 168h"))]
    pub duration: String,
}

/// What a DefenseInDepth target may do.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DefenseInDepth {
    /// The allowlist denies nothing: what it would deny is reported, once per distinct operation
    /// (a trial period before enforcing; enhanceProtect's rules deny as they say).
    #[serde(default)]
    pub allow_violations: bool,
    /// What the target may do: these allow rules and those of the policy's rule modules.
    #[serde(default)]
    pub allow: AllowRules,
}

/// The files, programs, capabilities, peers, mounts and sockets a target may use.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AllowRules {
    #[serde(default)]
    pub files: Vec<FileAllow>,
    /// Programs that may run (paths as in file rules).
    #[serde(default)]
    pub exec: Vec<String>,
    /// Capabilities by name, as in capability rules.
    #[serde(default)]
    pub capabilities: Vec<String>,
    #[serde(default)]
    pub network: Vec<NetworkAllow>,
    /// File system types that may be mounted.
    #[serde(default)]
    pub mount: Vec<String>,
    #[serde(default)]
    pub sockets: Vec<SocketAllow>,
    /// UNIX stream sockets that may be connected to, by path (as in file rules; `@NAME` for an
    /// abstract name).
    #[serde(default)]
    pub unix_sockets: Vec<String>,
}

/// Files matching `paths` (as in file rules) may be used with `permissions`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileAllow {
    #[schemars(length(min = 1))]
    pub paths: Vec<String>,
    #[schemars(length(min = 1))]
    pub permissions: Vec<Permission>,
}

/// Outgoing connections and datagrams that may be made, as in network rules.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NetworkAllow {
    #[serde(default)]
    pub addresses: Vec<String>,
    #[serde(default)]
    pub ports: Vec<PortRange>,
    #[serde(default)]
    pub protocols: Vec<Protocol>,
}

/// Sockets of a family (`unix`, `inet`, `inet6`, `netlink`, `packet`... or its number) that may
/// be created, of the listed types (`stream`, `dgram`, `raw`, `seqpacket`...; all when empty).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SocketAllow {
    pub family: String,
    #[serde(default)]
    pub types: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[x_kube(validation = audit_rules_listed())]
pub struct EnhanceProtect {
    /// The target is a privileged container: the RuntimeDefault set is not applied.
    #[serde(default)]
    pub privileged: bool,
    #[serde(default)]
    #[schemars(schema_with = "hardening_rules")]
    pub hardening_rules: Vec<String>,
    #[serde(default)]
    #[schemars(schema_with = "attack_protection_rules")]
    pub attack_protection_rules: Vec<AttackProtection>,
    #[serde(default)]
    #[schemars(schema_with = "vul_mitigation_rules")]
    pub vul_mitigation_rules: Vec<String>,
    /// Built-in rules of the lists above that report instead of denying.
    #[serde(default)]
    #[schemars(schema_with = "any_rules")]
    pub audit_rules: Vec<String>,
    #[serde(default)]
    pub custom_rules: CustomRules,
    /// Denials are also reported as audit events.
    #[serde(default)]
    pub audit_violations: bool,
    /// Nothing is denied: what would be is reported (a trial run of the policy).
    #[serde(default)]
    pub allow_violations: bool,
}

/// An `attackProtectionRules` item: a built-in rule's name, or vArmor's form of an item.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum AttackProtection {
    Rule(String),
    VArmor(VArmorRules),
}

/// vArmor's `attackProtectionRules` item: built-in rules, and the programs they apply to. vArmor
/// confines `targets` with AppArmor only (its BPF enforcer leaves such an item out), and
/// Palisade's rules apply to every process of the target: `targets` must be empty.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VArmorRules {
    pub rules: Vec<String>,
    #[serde(default)]
    pub targets: Vec<String>,
}

impl<'de> Deserialize<'de> for AttackProtection {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // Not `untagged`: its error would not say what is wrong with a vArmor item.
        struct Item;
        impl<'de> Visitor<'de> for Item {
            type Value = AttackProtection;

            fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
                formatter.write_str("a built-in rule's name or {rules, targets}")
            }

            fn visit_str<E: de::Error>(self, name: &str) -> Result<AttackProtection, E> {
                Ok(AttackProtection::Rule(name.to_owned()))
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<AttackProtection, A::Error> {
                VArmorRules::deserialize(de::value::MapAccessDeserializer::new(map))
                    .map(AttackProtection::VArmor)
            }
        }
        deserializer.deserialize_any(Item)
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
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
    #[serde(default)]
    pub sockets: Vec<SocketRule>,
}

/// Files matching `paths`: an exact path, a directory's contents (a trailing `/` or `/**`), or
/// one `**` anywhere for any characters, `/` included (`/proc/**/mem`). `*` within a path
/// component, `?` and `[` are not supported.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileRule {
    #[serde(default)]
    pub name: Option<String>,
    #[schemars(length(min = 1))]
    pub paths: Vec<String>,
    #[schemars(length(min = 1))]
    pub permissions: Vec<Permission>,
    pub action: Action,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExecRule {
    #[serde(default)]
    pub name: Option<String>,
    #[schemars(length(min = 1))]
    pub paths: Vec<String>,
    pub action: Action,
}

/// Outgoing connections and datagrams to `addresses` (IP or CIDR; all when empty) on `ports`
/// (a port or "low-high"; all when empty) over `protocols` (all when empty).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
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

impl JsonSchema for PortRange {
    fn schema_name() -> Cow<'static, str> {
        "PortRange".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "A port, or a range \"low-high\".",
            "x-kubernetes-int-or-string": true,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Protocol {
    Tcp,
    Udp,
    Icmp,
}

/// New mounts of the listed file system types (every mount, remount, bind and move when empty).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MountRule {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub fs_types: Vec<String>,
    pub action: Action,
}

/// Capabilities by name, e.g. `sys_admin` or `CAP_SYS_ADMIN`, `all`, or `-name` to leave one
/// out of `all`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CapabilityRule {
    #[serde(default)]
    pub name: Option<String>,
    #[schemars(length(min = 1))]
    pub capabilities: Vec<String>,
    pub action: Action,
}

/// Creating sockets of a family (`unix`, `inet`, `inet6`, `netlink`, `packet`... or its number),
/// of the listed types (`stream`, `dgram`, `raw`, `seqpacket`...; all when empty).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SocketRule {
    #[serde(default)]
    pub name: Option<String>,
    pub family: String,
    #[serde(default)]
    pub types: Vec<String>,
    pub action: Action,
}

/// `read`, `write` (every open for writing, and truncating, deleting, renaming, linking and
/// changing the mode of the file), `append` (only opens with O_APPEND) and `exec`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub enum Permission {
    Read,
    Write,
    Append,
    Exec,
}

#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub enum Action {
    /// Allow and report.
    Audit,
    /// Refuse with EPERM (reported with `auditViolations`).
    Deny,
}

impl Action {
    /// The name a policy spells it with.
    pub fn name(self) -> &'static str {
        match self {
            Self::Audit => "audit",
            Self::Deny => "deny",
        }
    }
}

/// A list of built-in rule names out of `names`, each at most once.
fn rule_list(description: &str, names: Vec<String>) -> Schema {
    json_schema!({
        "description": description,
        "type": "array",
        "items": {"type": "string", "enum": names},
        "maxItems": names.len(),
        "x-kubernetes-list-type": "set",
    })
}

fn hardening_rules(_: &mut SchemaGenerator) -> Schema {
    rule_list(
        "Built-in rules that harden the container's boundary (mounts, capabilities, BPF, user namespaces).",
        names_in(Category::Hardening),
    )
}

/// Names, or vArmor's items. A structural schema leaves a list of two kinds of item untyped, and
/// CEL cannot see into it: the agent checks this list (the policy's status says what is wrong).
fn attack_protection_rules(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "description": "Built-in rules against what attackers do once inside (leaks, tools, network): names, or vArmor's items {rules: [names], targets: []}.",
        "type": "array",
        "maxItems": names_in(Category::AttackProtection).len(),
        "items": {"x-kubernetes-preserve-unknown-fields": true},
    })
}

/// Every auditRules entry is listed in hardeningRules or vulMitigationRules, or is an
/// attackProtectionRules rule: CEL cannot see that list (see attack_protection_rules), so whether
/// it lists the rule is the agent's to check.
fn audit_rules_listed() -> Rule {
    let attack: Vec<String> = names_in(Category::AttackProtection)
        .iter()
        .map(|name| format!("'{name}'"))
        .collect();
    Rule::new(format!(
        "!has(self.auditRules) || self.auditRules.all(r, (has(self.hardeningRules) && r in self.hardeningRules) || r in [{}] || (has(self.vulMitigationRules) && r in self.vulMitigationRules))",
        attack.join(", ")
    ))
    .message("every auditRules entry must also be listed in hardeningRules, attackProtectionRules or vulMitigationRules")
}

fn vul_mitigation_rules(_: &mut SchemaGenerator) -> Schema {
    rule_list(
        "Built-in rules that mitigate known vulnerabilities.",
        names_in(Category::VulMitigation),
    )
}

fn any_rules(_: &mut SchemaGenerator) -> Schema {
    let names = Category::ALL.into_iter().flat_map(names_in).collect();
    rule_list(
        "Built-in rules of the lists above that report instead of denying.",
        names,
    )
}

/// A module's configuration: any JSON object, checked by the module.
pub(crate) fn any_object(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

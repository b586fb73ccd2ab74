//! `palisade policy compile FILE` (the map entries a policy compiles to), `policy test` (a policy
//! or a rule module against its fixtures) and `policy replay` (a candidate policy over recorded
//! events).

use std::{
    collections::BTreeMap,
    fmt::Display,
    io::Write,
    net::Ipv6Addr,
    path::{Path, PathBuf},
};

use palisade_common::{
    ACTION_ALLOW, ACTION_AUDIT, ACTION_DENY, DEFAULT_CAPABILITIES, DEFAULT_MOUNT, DEFAULT_NETWORK,
    DEFAULT_SOCKETS, SOCKET_TYPE, Verdict,
};
use palisade_crds::{API_VERSION, PalisadeClusterPolicy, PalisadePolicy};
use serde::{Deserialize, Serialize};

use super::{Output, write_json};
use crate::{
    k8s::PolicyObject,
    policy::{
        CAPABILITIES, CompiledPolicy, Environment, PERMISSION_NAMES, Policy, PolicyError,
        TrieEntry, decide_event, parse_document, permission_names, read_file,
    },
    rules::{RuleHost, compile_policy},
};

/// Reads the policy `file`: a policy file, or a PalisadePolicy (with its namespace) or
/// PalisadeClusterPolicy object as it is applied to a cluster, named as the agent reports it
/// there (`NAMESPACE/NAME`, or `NAME`).
fn load(file: &Path) -> Result<Policy, PolicyError> {
    let text = read_file(file)?;
    let document: serde_yaml::Value = serde_yaml::from_str(&text).unwrap_or_default();
    let object = match document["kind"].as_str() {
        Some("PalisadeClusterPolicy") => {
            PolicyObject::from(&parse_document::<PalisadeClusterPolicy>(file, &text)?)
        }
        Some("PalisadePolicy") if document["metadata"]["namespace"].is_string() => {
            PolicyObject::from(&parse_document::<PalisadePolicy>(file, &text)?)
        }
        _ => return Policy::parse(file, &text),
    };
    let api_version = document["apiVersion"].as_str().unwrap_or_default();
    if api_version != API_VERSION {
        return Err(PolicyError::new(
            file.display(),
            "apiVersion",
            format!("expected \"{API_VERSION}\", got \"{api_version}\""),
        ));
    }
    Ok(object.as_policy())
}

/// Reads and compiles the policy `file`, running its rule modules in `host`.
pub fn load_and_compile(
    host: &RuleHost,
    file: &Path,
) -> Result<(Policy, CompiledPolicy), PolicyError> {
    let policy = load(file)?;
    let compiled = compile_policy(
        host,
        &file.display(),
        file.parent().unwrap_or(Path::new(".")),
        &policy,
        &Environment::from_process(),
    )?;
    Ok((policy, compiled))
}

/// An action's bits by name: deny, audit, and in an entry of a DefenseInDepth policy allow.
fn action_names(action: u32) -> Vec<&'static str> {
    [
        (ACTION_DENY, "deny"),
        (ACTION_AUDIT, "audit"),
        (ACTION_ALLOW, "allow"),
    ]
    .into_iter()
    .filter(|(bit, _)| action & bit != 0)
    .map(|(_, name)| name)
    .collect()
}

/// Action names as text: "deny+audit", or "none".
fn joined(names: &[&str]) -> String {
    if names.is_empty() {
        "none".to_owned()
    } else {
        names.join("+")
    }
}

/// What a rule decides on one entry: its action's names and the rule's number.
#[derive(Serialize)]
struct Decision {
    action: Vec<&'static str>,
    rule: u32,
}

impl Decision {
    fn of(verdict: &Verdict) -> Self {
        Self {
            action: action_names(verdict.action),
            rule: verdict.rule_id,
        }
    }
}

impl Display for Decision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}(rule {})", joined(&self.action), self.rule)
    }
}

/// The map entries a policy compiles to, as `policy compile` shows them. Map keys are bytes,
/// shown escaped (`\xNN`); a suffix key is reversed, as the kernel stores it.
#[derive(Serialize)]
struct CompiledEntries {
    policy: String,
    rules: Vec<RuleRow>,
    /// DefenseInDepth: the kinds of access denied unless an entry allows them.
    denied_unless_allowed: Option<DefaultDeny>,
    capabilities: Vec<Named>,
    /// The on/off rule classes (mount, userns_create, ptrace_outside, ...).
    switches: Vec<Named>,
    mount_types: Vec<Named>,
    sockets: Vec<SocketRow>,
    network: Vec<NetworkRow>,
    path_prefixes: Vec<PathRow>,
    path_suffixes: Vec<PathRow>,
    globs: Vec<GlobRow>,
}

#[derive(Serialize)]
struct RuleRow {
    /// What entries name the rule by (from 1).
    id: usize,
    name: String,
    action: &'static str,
}

#[derive(Serialize)]
struct DefaultDeny {
    kinds: Vec<&'static str>,
    #[serde(flatten)]
    decision: Decision,
}

#[derive(Serialize)]
struct Named {
    name: String,
    #[serde(flatten)]
    decision: Decision,
}

#[derive(Serialize)]
struct SocketRow {
    family: u32,
    /// A protocol number, or None for a socket type's entry or for any protocol.
    protocol: Option<u32>,
    #[serde(rename = "type")]
    socket_type: Option<u32>,
    #[serde(flatten)]
    decision: Decision,
}

#[derive(Serialize)]
struct NetworkRow {
    /// A CIDR block; IPv4 blocks as IPv4.
    address: String,
    /// 0: every protocol.
    protocol: u8,
    /// 0: every port.
    port: u16,
    #[serde(flatten)]
    decision: Decision,
}

#[derive(Serialize)]
struct PathRow {
    key: String,
    permissions: Vec<PermissionDecision>,
    /// Bit i: glob i applies to paths with this prefix (or suffix).
    glob_mask: u64,
}

#[derive(Serialize)]
struct PermissionDecision {
    permission: &'static str,
    #[serde(flatten)]
    decision: Decision,
}

#[derive(Serialize)]
struct GlobRow {
    index: usize,
    permissions: &'static [&'static str],
    #[serde(flatten)]
    decision: Decision,
    /// The shortest path it matches, in bytes.
    min_len: u32,
}

fn escaped(key: &[u8]) -> String {
    key.escape_ascii().to_string()
}

fn path_rows(entries: &[TrieEntry]) -> Vec<PathRow> {
    entries
        .iter()
        .map(|entry| PathRow {
            key: escaped(&entry.key),
            permissions: PERMISSION_NAMES
                .iter()
                .enumerate()
                .filter(|(i, _)| entry.verdict.action[*i] != 0)
                .map(|(i, permission)| PermissionDecision {
                    permission,
                    decision: Decision::of(&Verdict {
                        action: entry.verdict.action[i],
                        rule_id: entry.verdict.rule_id[i],
                    }),
                })
                .collect(),
            glob_mask: entry.verdict.glob_mask,
        })
        .collect()
}

impl CompiledEntries {
    fn of(compiled: &CompiledPolicy) -> Self {
        let entries = compiled.entries();
        let switches = &entries.switches;
        let denied_unless_allowed = (switches.defaults != 0).then(|| {
            let mut kinds = permission_names(switches.defaults).to_vec();
            for (bit, name) in [
                (DEFAULT_CAPABILITIES, "capabilities"),
                (DEFAULT_NETWORK, "network"),
                (DEFAULT_SOCKETS, "sockets"),
                (DEFAULT_MOUNT, "mount"),
            ] {
                if switches.defaults & bit != 0 {
                    kinds.push(name);
                }
            }
            DefaultDeny {
                kinds,
                decision: Decision::of(&switches.default_deny),
            }
        });
        let named = |name: &str, verdict: &Verdict| Named {
            name: name.to_owned(),
            decision: Decision::of(verdict),
        };
        let capabilities = CAPABILITIES
            .iter()
            .zip(&switches.capability)
            .filter(|(_, verdict)| verdict.action != 0)
            .map(|(name, verdict)| named(name, verdict))
            .collect();
        let switch_list = [
            ("userns_capability", &switches.userns_capability),
            ("mount", &switches.mount),
            ("mount_block_device", &switches.mount_block_device),
            ("umount", &switches.umount),
            ("userns_create", &switches.userns_create),
            ("bpf_prog_load", &switches.bpf_prog_load),
            ("setsockopt_bpf", &switches.setsockopt_bpf),
            ("ptrace_outside", &switches.ptrace_outside),
            ("chmod_exec_bits", &switches.chmod_exec_bits),
            ("chmod_setid_bits", &switches.chmod_setid_bits),
            ("block_device_open", &switches.block_device_open),
            ("userfaultfd", &switches.userfaultfd),
        ];
        let mount_types = entries
            .mount_types
            .iter()
            .map(|(fs_type, verdict)| {
                let end = fs_type
                    .iter()
                    .position(|b| *b == 0)
                    .unwrap_or(fs_type.len());
                named(&escaped(&fs_type[..end]), verdict)
            })
            .collect();
        let sockets = entries
            .sockets
            .iter()
            .map(|&((family, protocol), ref verdict)| {
                let (protocol, socket_type) = match protocol {
                    palisade_common::ANY_PROTOCOL => (None, None),
                    protocol if protocol & SOCKET_TYPE != 0 => {
                        (None, Some(protocol & !SOCKET_TYPE))
                    }
                    protocol => (Some(protocol), None),
                };
                SocketRow {
                    family,
                    protocol,
                    socket_type,
                    decision: Decision::of(verdict),
                }
            })
            .collect();
        let network = entries
            .network
            .iter()
            .map(|entry| {
                let address = Ipv6Addr::from(entry.block.addr);
                let address = match address.to_ipv4_mapped() {
                    Some(v4) if entry.block.bits >= 96 => format!("{v4}/{}", entry.block.bits - 96),
                    _ => format!("{address}/{}", entry.block.bits),
                };
                NetworkRow {
                    address,
                    protocol: entry.protocol,
                    port: entry.port,
                    decision: Decision::of(&entry.verdict),
                }
            })
            .collect();
        let globs = entries
            .globs
            .iter()
            .enumerate()
            .map(|(index, glob)| GlobRow {
                index,
                permissions: permission_names(glob.perms),
                decision: Decision::of(&Verdict {
                    action: glob.action,
                    rule_id: glob.rule_id,
                }),
                min_len: glob.min_len,
            })
            .collect();
        Self {
            policy: compiled.name().to_owned(),
            rules: compiled
                .rules()
                .iter()
                .enumerate()
                .map(|(index, rule)| RuleRow {
                    id: index + 1,
                    name: rule.name.clone(),
                    action: rule.action.name(),
                })
                .collect(),
            denied_unless_allowed,
            capabilities,
            switches: switch_list
                .into_iter()
                .filter(|(_, verdict)| verdict.action != 0)
                .map(|(name, verdict)| named(name, verdict))
                .collect(),
            mount_types,
            sockets,
            network,
            path_prefixes: path_rows(&entries.prefixes),
            path_suffixes: path_rows(&entries.suffixes),
            globs,
        }
    }

    fn write_text(&self, out: &mut impl Write) -> std::io::Result<()> {
        writeln!(
            out,
            "policy \"{}\": {} rules, {} prefix entries, {} suffix entries, {} globs, {} mount \
             types, {} socket entries, {} network entries",
            self.policy,
            self.rules.len(),
            self.path_prefixes.len(),
            self.path_suffixes.len(),
            self.globs.len(),
            self.mount_types.len(),
            self.sockets.len(),
            self.network.len(),
        )?;
        for rule in &self.rules {
            writeln!(out, "rule {} \"{}\": {}", rule.id, rule.name, rule.action)?;
        }
        if let Some(denied) = &self.denied_unless_allowed {
            writeln!(
                out,
                "denied unless allowed: {}: {}",
                denied.kinds.join(","),
                denied.decision
            )?;
        }
        for capability in &self.capabilities {
            writeln!(
                out,
                "capability {}: {}",
                capability.name, capability.decision
            )?;
        }
        for switch in &self.switches {
            writeln!(out, "{}: {}", switch.name, switch.decision)?;
        }
        for mount_type in &self.mount_types {
            writeln!(
                out,
                "mount_types \"{}\": {}",
                mount_type.name, mount_type.decision
            )?;
        }
        for socket in &self.sockets {
            let protocol = match (socket.protocol, socket.socket_type) {
                (Some(protocol), _) => format!("protocol {protocol}"),
                (None, Some(socket_type)) => format!("type {socket_type}"),
                (None, None) => "protocol any".to_owned(),
            };
            writeln!(
                out,
                "sockets family {} {protocol}: {}",
                socket.family, socket.decision
            )?;
        }
        for entry in &self.network {
            writeln!(
                out,
                "network {} protocol {} port {}: {}",
                entry.address, entry.protocol, entry.port, entry.decision
            )?;
        }
        for (title, rows) in [
            ("path_prefixes", &self.path_prefixes),
            ("path_suffixes (reversed)", &self.path_suffixes),
        ] {
            for row in rows {
                let mut parts: Vec<String> = row
                    .permissions
                    .iter()
                    .map(|permission| format!("{}={}", permission.permission, permission.decision))
                    .collect();
                if row.glob_mask != 0 {
                    parts.push(format!("globs={:#x}", row.glob_mask));
                }
                writeln!(out, "{title} \"{}\": {}", row.key, parts.join(" "))?;
            }
        }
        for glob in &self.globs {
            writeln!(
                out,
                "globs[{}]: {} {} (rule {}), paths of at least {} bytes",
                glob.index,
                joined(&glob.decision.action),
                glob.permissions.join(","),
                glob.decision.rule,
                glob.min_len
            )?;
        }
        Ok(())
    }
}

/// `palisade policy compile FILE`: prints the map entries the policy compiles to.
pub fn compile(file: &Path, output: Output, out: &mut impl Write) -> anyhow::Result<()> {
    let host = RuleHost::new(None)?;
    let (_, compiled) = load_and_compile(&host, file)?;
    let entries = CompiledEntries::of(&compiled);
    match output {
        Output::Text => entries.write_text(out)?,
        Output::Json => write_json(out, &entries)?,
    }
    Ok(())
}

/// `palisade policy test POLICY FIXTURES`: decides each fixture's event under the policy file
/// `policy` with the kernel's lookups on the entries it compiles to (those `policy replay` uses)
/// and compares the action and rule with the fixture's. Returns whether every fixture passed.
pub fn test_policy(
    policy_file: &Path,
    fixtures_file: &Path,
    output: Output,
    out: &mut impl Write,
) -> anyhow::Result<bool> {
    let host = RuleHost::new(None)?;
    let (_, policy) = load_and_compile(&host, policy_file)?;
    let fixtures = PolicyFixture::load(fixtures_file)?;
    let results: Vec<FixtureResult> = fixtures
        .iter()
        .map(|fixture| {
            let mismatch = match decide_event(&policy, &fixture.event) {
                Err(why) => Some(format!("its event cannot be decided: {why}")),
                Ok(verdict) => {
                    let got = Outcome::of(&policy, &verdict);
                    (got != fixture.expect)
                        .then(|| format!("expected {}, got {got}", fixture.expect))
                }
            };
            FixtureResult {
                name: fixture.name.clone(),
                passed: mismatch.is_none(),
                mismatch,
            }
        })
        .collect();
    let failed = results.iter().filter(|result| !result.passed).count();
    let report = PolicyTestReport {
        policy: policy.name().to_owned(),
        policy_file: policy_file.to_owned(),
        fixtures_file: fixtures_file.to_owned(),
        passed: results.len() - failed,
        failed,
        fixtures: results,
    };
    match output {
        Output::Text => {
            write_results(out, &report.fixtures)?;
            writeln!(
                out,
                "{} passed, {failed} failed (policy \"{}\", {})",
                report.passed,
                report.policy,
                report.fixtures_file.display()
            )?;
        }
        Output::Json => write_json(out, &report)?,
    }
    Ok(failed == 0)
}

/// One policy fixture: an event as the agent writes it (only the fields its hook's decision looks
/// up are read) and what the policy must decide.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyFixture {
    name: String,
    event: serde_json::Value,
    expect: Outcome,
}

impl PolicyFixture {
    /// The fixtures in `file`, a YAML list; an error names the fixture and field at fault.
    fn load(file: &Path) -> Result<Vec<Self>, PolicyError> {
        let fixtures: Vec<Self> = parse_document(file, &read_file(file)?)?;
        if fixtures.is_empty() {
            return Err(PolicyError::new(
                file.display(),
                "(document)",
                "no fixtures",
            ));
        }
        for (index, fixture) in fixtures.iter().enumerate() {
            let needs_rule = fixture.expect.action != Answer::Allow;
            if needs_rule != fixture.expect.rule.is_some() {
                return Err(PolicyError::new(
                    file.display(),
                    format!("[{index}].expect.rule"),
                    if needs_rule {
                        "required with a deny or audit action: the rule that decides"
                    } else {
                        "an allowed event has no rule"
                    },
                ));
            }
        }
        Ok(fixtures)
    }
}

/// What a policy decides on an event: the answer, and the rule that gave it (none when allowed).
#[derive(Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
struct Outcome {
    action: Answer,
    #[serde(default)]
    rule: Option<String>,
}

#[derive(Deserialize, Clone, Copy, PartialEq)]
#[serde(rename_all = "lowercase")]
enum Answer {
    /// Denied (and maybe reported).
    Deny,
    /// Allowed and reported.
    Audit,
    /// Allowed, not reported.
    Allow,
}

impl Outcome {
    fn of(policy: &CompiledPolicy, verdict: &Verdict) -> Self {
        let action = if verdict.action & ACTION_DENY != 0 {
            Answer::Deny
        } else if verdict.action & ACTION_AUDIT != 0 {
            Answer::Audit
        } else {
            Answer::Allow
        };
        let rule = (action != Answer::Allow).then(|| {
            policy
                .rule_name(verdict.rule_id)
                .unwrap_or("unknown")
                .to_owned()
        });
        Self { action, rule }
    }
}

impl Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let action = match self.action {
            Answer::Deny => "deny",
            Answer::Audit => "audit",
            Answer::Allow => "allow",
        };
        match &self.rule {
            Some(rule) => write!(f, "{action} by rule {rule}"),
            None => write!(f, "{action}"),
        }
    }
}

/// What `policy test POLICY FIXTURES` found.
#[derive(Serialize)]
struct PolicyTestReport {
    policy: String,
    policy_file: PathBuf,
    fixtures_file: PathBuf,
    passed: usize,
    failed: usize,
    fixtures: Vec<FixtureResult>,
}

/// `palisade policy test DIR`: runs the built rule module (`--module FILE`, or DIR's crate built
/// now) on the fixtures in DIR/fixtures (or DIR), in the agent's sandbox. Returns whether every
/// fixture passed.
pub fn test_module(
    dir: &Path,
    module: Option<&Path>,
    output: Output,
    out: &mut impl Write,
) -> anyhow::Result<bool> {
    use palisade_rule_sdk::testing::{NamedFixture, mismatch, read_fixtures};

    use palisade_rule_sdk::JsonEvent;

    use crate::rules::{Entry, Verdict as ModuleVerdict};

    let built;
    let module = match module {
        Some(module) => module,
        None => {
            built = std::env::temp_dir().join(format!("palisade-test-{}.wasm", std::process::id()));
            crate::rules::build(dir, &built)?;
            &built
        }
    };
    let host = RuleHost::new(None)?;
    let loaded = host.open(module)?;
    let fixtures_dir = if dir.join("fixtures").is_dir() {
        dir.join("fixtures")
    } else {
        dir.to_owned()
    };
    let fixtures: Vec<NamedFixture<Entry, ModuleVerdict>> =
        read_fixtures(&fixtures_dir).map_err(anyhow::Error::msg)?;
    let context = crate::rules::Context {
        policy: "fixture".to_owned(),
        node: "fixture-node".to_owned(),
        kube_apiserver: vec!["10.96.0.1".to_owned()],
    };
    let mut results = Vec::new();
    for (name, fixture) in &fixtures {
        let mismatch = mismatch(
            fixture,
            |config| {
                loaded
                    .compile(config, &context)
                    .map_err(|err| err.to_string())
            },
            |config, event| {
                let event = JsonEvent::new(event.clone());
                loaded
                    .decide(config, &[event.event()])
                    .map_err(|err| err.to_string())
            },
        );
        results.push(FixtureResult {
            name: name.clone(),
            passed: mismatch.is_none(),
            mismatch,
        });
    }
    let failed = results.iter().filter(|result| !result.passed).count();
    let report = TestReport {
        module: module.to_owned(),
        sha256: loaded.digest.clone(),
        passed: results.len() - failed,
        failed,
        fixtures: results,
    };
    match output {
        Output::Text => {
            write_results(out, &report.fixtures)?;
            writeln!(
                out,
                "{} passed, {failed} failed ({}, sha256 {})",
                report.passed,
                report.module.display(),
                report.sha256
            )?;
        }
        Output::Json => write_json(out, &report)?,
    }
    Ok(failed == 0)
}

/// What `policy test DIR` found.
#[derive(Serialize)]
struct TestReport {
    module: PathBuf,
    sha256: String,
    passed: usize,
    failed: usize,
    fixtures: Vec<FixtureResult>,
}

#[derive(Serialize)]
struct FixtureResult {
    name: String,
    passed: bool,
    /// How the answer differs from the fixture's; None when it passed.
    mismatch: Option<String>,
}

/// A line per fixture: `ok` or `FAILED` and why.
fn write_results(out: &mut impl Write, fixtures: &[FixtureResult]) -> std::io::Result<()> {
    for fixture in fixtures {
        match &fixture.mismatch {
            None => writeln!(out, "ok      {}", fixture.name)?,
            Some(mismatch) => writeln!(out, "FAILED  {}: {mismatch}", fixture.name)?,
        }
    }
    Ok(())
}

/// `palisade policy replay --events FILE --policy FILE`: which recorded events the candidate
/// policy would have denied or audited, per rule.
pub fn replay(
    events: &Path,
    policy_file: &Path,
    output: Output,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let host = RuleHost::new(None)?;
    let (_, candidate) = load_and_compile(&host, policy_file)?;
    let text = std::fs::read_to_string(events)
        .map_err(|err| anyhow::anyhow!("reading {}: {err}", events.display()))?;
    let mut by_rule: BTreeMap<String, RuleCount> = BTreeMap::new();
    let (mut replayed, mut matched_no_rule) = (0, 0);
    let mut not_replayable: BTreeMap<String, u64> = BTreeMap::new();
    for (number, line) in text.lines().enumerate() {
        let event: serde_json::Value = serde_json::from_str(line).map_err(|err| {
            anyhow::anyhow!("{}:{}: not an event: {err}", events.display(), number + 1)
        })?;
        let Ok(verdict) = decide_event(&candidate, &event) else {
            let hook = event["hook"].as_str().unwrap_or("unknown").to_owned();
            *not_replayable.entry(hook).or_default() += 1;
            continue;
        };
        replayed += 1;
        if verdict.action == 0 {
            matched_no_rule += 1;
            continue;
        }
        let rule = candidate
            .rule_name(verdict.rule_id)
            .unwrap_or("unknown")
            .to_owned();
        let count = by_rule.entry(rule.clone()).or_insert_with(|| {
            let what = ["path", "capability", "fs_type"]
                .iter()
                .find_map(|field| event[field].as_str().filter(|value| !value.is_empty()))
                .map(str::to_owned)
                .or_else(|| event["socket"]["address"].as_str().map(str::to_owned))
                .unwrap_or_default();
            RuleCount {
                rule,
                would_deny: 0,
                would_audit: 0,
                example: format!(
                    "{} {} {what}",
                    event["comm"].as_str().unwrap_or(""),
                    event["hook"].as_str().unwrap_or("")
                ),
            }
        });
        if verdict.action & ACTION_DENY != 0 {
            count.would_deny += 1;
        } else {
            count.would_audit += 1;
        }
    }
    let report = ReplayReport {
        policy: candidate.name().to_owned(),
        events: events.to_owned(),
        replayed,
        matched_no_rule,
        not_replayable,
        rules: by_rule.into_values().collect(),
    };
    match output {
        Output::Text => report.write_text(out)?,
        Output::Json => write_json(out, &report)?,
    }
    Ok(())
}

/// What `policy replay` found: events counted per rule that would have denied or audited them.
#[derive(Serialize)]
struct ReplayReport {
    policy: String,
    events: PathBuf,
    replayed: u64,
    matched_no_rule: u64,
    /// Events of hooks the replay cannot decide, by hook.
    not_replayable: BTreeMap<String, u64>,
    /// By rule name.
    rules: Vec<RuleCount>,
}

#[derive(Serialize)]
struct RuleCount {
    rule: String,
    would_deny: u64,
    would_audit: u64,
    /// The first such event: "COMM HOOK WHAT".
    example: String,
}

impl ReplayReport {
    fn write_text(&self, out: &mut impl Write) -> std::io::Result<()> {
        writeln!(
            out,
            "policy \"{}\" over {}: {} events replayed, {} not replayable, {} matched no rule",
            self.policy,
            self.events.display(),
            self.replayed,
            self.not_replayable.values().sum::<u64>(),
            self.matched_no_rule,
        )?;
        writeln!(out, "WOULD DENY  WOULD AUDIT  RULE  (example)")?;
        for count in &self.rules {
            writeln!(
                out,
                "{:>10}  {:>11}  {}  ({})",
                count.would_deny, count.would_audit, count.rule, count.example
            )?;
        }
        for (hook, count) in &self.not_replayable {
            writeln!(out, "not replayable: {count} {hook} events")?;
        }
        Ok(())
    }
}

//! Policy -> map entries. Pure: no I/O, no kernel; everything the kernel needs is in the result.
//!
//! A policy's mode and rules become a list of rules, each a name, an action and effects (see
//! `effect`); every effect lands in one lookup structure. Exact and directory-prefix path rules
//! become entries of a longest-prefix-match trie; each entry carries the merged verdict of every
//! rule that covers it, so the kernel's single lookup returns the answer for all of them.
//! `PREFIX**SUFFIX` globs set a bit on a prefix entry and on a reversed-suffix entry; the kernel
//! ANDs the two masks. Network blocks are merged the same way in their own trie.

use std::{
    collections::{BTreeMap, HashMap},
    path::Path,
    sync::LazyLock,
};

use palisade_common::{
    ACTION_AUDIT, ACTION_DENY, FS_TYPE_LEN, GlobRule, LOOKUP_MOUNT_TYPES, LOOKUP_NETWORK,
    LOOKUP_PATHS, LOOKUP_SOCKETS, MAX_GLOBS, PERM_APPEND, PERM_CONNECT, PERM_COUNT, PERM_EXEC,
    PERM_READ, PERM_WRITE, PathVerdict, Policy as KernelPolicy, Verdict,
};

use super::{
    Action, CustomRules, Mode, OnFailure, Pattern, Permission, Policy, PolicyError, PortRange,
    Protocol,
    catalog::{self, Category, Environment},
    effect::{AddressBlock, EXEC_RULE_PERMS, Effect, Switch, parse_port_range},
};

/// What one policy compiles to, independent of the policy id it is installed under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompiledPolicy {
    pub name: String,
    /// Rule `id` is `rules[id - 1]`.
    pub rules: Vec<RuleInfo>,
    /// Keys are path bytes; an exact path ends with its NUL.
    pub prefixes: Vec<TrieEntry>,
    /// Keys are reversed suffix bytes.
    pub suffixes: Vec<TrieEntry>,
    /// Glob `i` is bit `i` of the tries' glob masks.
    pub globs: Vec<GlobRule>,
    /// The policy's `policies` entry: capabilities and the on/off rule classes.
    pub switches: KernelPolicy,
    pub mount_types: Vec<([u8; FS_TYPE_LEN as usize], Verdict)>,
    /// (family, protocol or ANY_PROTOCOL) -> verdict.
    pub sockets: Vec<((u32, u32), Verdict)>,
    pub network: Vec<NetworkEntry>,
    /// The rule modules that decide the policy's events, in order.
    pub deciders: Vec<Decider>,
}

/// A rule module deciding a policy's events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decider {
    pub name: String,
    /// The module's SHA-256 digest, in lowercase hex.
    pub digest: String,
    /// The policy's configuration of the module, as JSON.
    pub config: String,
    pub on_failure: OnFailure,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleInfo {
    pub name: String,
    pub action: Action,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrieEntry {
    pub key: Vec<u8>,
    pub verdict: PathVerdict,
}

/// An entry of the network trie: protocol 0 and port 0 stand for all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkEntry {
    pub protocol: u8,
    pub port: u16,
    pub block: AddressBlock,
    pub verdict: Verdict,
}

impl CompiledPolicy {
    pub fn rule_name(&self, rule_id: u32) -> Option<&str> {
        Some(self.rules[self.rule_index(rule_id)?].name.as_str())
    }

    /// Where rule `rule_id` is in `rules` (ids count from 1).
    pub fn rule_index(&self, rule_id: u32) -> Option<usize> {
        let index = usize::try_from(rule_id).ok()?.checked_sub(1)?;
        (index < self.rules.len()).then_some(index)
    }

    /// What the kernel decides for `perms` on `path`: the lookups of
    /// ebpf/programs/path_match.h, on the entries this policy installs.
    pub fn decide_path(&self, path: &str, perms: u32) -> Verdict {
        fn longest<'a>(entries: &'a [TrieEntry], key: &[u8]) -> Option<&'a PathVerdict> {
            entries
                .iter()
                .filter(|entry| key.starts_with(&entry.key))
                .max_by_key(|entry| entry.key.len())
                .map(|entry| &entry.verdict)
        }
        // As the kernel's `consider`: a stronger action wins, the first one on a tie.
        let mut best = Verdict::default();
        let mut consider = |action: u32, rule_id: u32| {
            if action > best.action {
                best = Verdict { action, rule_id };
            }
        };
        let mut key = path.as_bytes().to_vec();
        key.push(0);
        let Some(prefix) = longest(&self.prefixes, &key) else {
            return best;
        };
        for i in 0..PERM_COUNT as usize {
            if perms & (1 << i) != 0 {
                consider(prefix.action[i], prefix.rule_id[i]);
            }
        }
        let reversed: Vec<u8> = path.bytes().rev().collect();
        if let Some(suffix) = longest(&self.suffixes, &reversed) {
            let matched = prefix.glob_mask & suffix.glob_mask;
            for (i, glob) in self.globs.iter().enumerate() {
                if matched & (1 << i) != 0
                    && path.len() as u32 >= glob.min_len
                    && glob.perms & perms != 0
                {
                    consider(glob.action, glob.rule_id);
                }
            }
        }
        best
    }
}

pub fn kernel_perms(permissions: &[Permission]) -> u32 {
    permissions.iter().fold(0, |perms, permission| {
        perms
            | match permission {
                Permission::Read => PERM_READ,
                // Writing covers appending: an O_APPEND open is still a write.
                Permission::Write => PERM_WRITE | PERM_APPEND,
                Permission::Append => PERM_APPEND,
                Permission::Exec => PERM_EXEC,
            }
    })
}

/// The names of the permission bits events and map entries carry, by bit: bit `i` is `1 << i`.
pub const PERMISSION_NAMES: [&str; PERM_COUNT as usize] =
    ["read", "write", "append", "exec", "connect"];
const _: () = assert!(
    PERM_READ == 1 << 0
        && PERM_WRITE == 1 << 1
        && PERM_APPEND == 1 << 2
        && PERM_EXEC == 1 << 3
        && PERM_CONNECT == 1 << 4
);

/// The names of the permissions in `bits`, lowest bit first (bits this build does not know are
/// left out). Every list is made once: events would otherwise allocate one each.
pub fn permission_names(bits: u32) -> &'static [&'static str] {
    static LISTS: LazyLock<Vec<Vec<&str>>> = LazyLock::new(|| {
        (0..1u32 << PERM_COUNT)
            .map(|bits| {
                let names = PERMISSION_NAMES.iter().enumerate();
                let present = names.filter(|(bit, _)| bits & (1 << bit) != 0);
                present.map(|(_, name)| *name).collect()
            })
            .collect()
    });
    &LISTS[(bits & ((1 << PERM_COUNT) - 1)) as usize]
}

/// The permission bit named `name`.
pub fn permission_bit(name: &str) -> Option<u32> {
    let bit = PERMISSION_NAMES.iter().position(|known| *known == name)?;
    Some(1 << bit)
}

/// The kernel action of a rule: what it does, given the policy's violation flags.
fn kernel_action(action: Action, violations: Violations) -> u32 {
    match action {
        Action::Audit => ACTION_AUDIT,
        Action::Deny if violations.allow => ACTION_AUDIT,
        Action::Deny if violations.audit => ACTION_DENY | ACTION_AUDIT,
        Action::Deny => ACTION_DENY,
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct Violations {
    audit: bool,
    allow: bool,
}

/// Adds a verdict: the stronger action wins, then the first rule.
fn merge_verdict(into: &mut Verdict, from: Verdict) {
    if (from.action, std::cmp::Reverse(from.rule_id))
        > (into.action, std::cmp::Reverse(into.rule_id))
    {
        *into = from;
    }
}

/// Adds a rule's verdict for `perms` to `verdict`.
fn merge(verdict: &mut PathVerdict, perms: u32, action: u32, rule_id: u32) {
    for i in 0..PERM_COUNT as usize {
        if perms & (1 << i) == 0 {
            continue;
        }
        let mut current = Verdict {
            action: verdict.action[i],
            rule_id: verdict.rule_id[i],
        };
        merge_verdict(&mut current, Verdict { action, rule_id });
        verdict.action[i] = current.action;
        verdict.rule_id[i] = current.rule_id;
    }
}

fn merge_verdicts(into: &mut PathVerdict, from: &PathVerdict) {
    into.glob_mask |= from.glob_mask;
    for i in 0..PERM_COUNT as usize {
        merge(into, 1 << i, from.action[i], from.rule_id[i]);
    }
}

/// Turns what each pattern contributes at its own key into trie entries that also carry every
/// shorter key's contribution (the keys that are prefixes of theirs).
fn covering_entries(own: HashMap<Vec<u8>, PathVerdict>) -> Vec<TrieEntry> {
    let mut entries: Vec<TrieEntry> = own
        .keys()
        .map(|key| {
            let mut verdict = PathVerdict::default();
            for len in 1..=key.len() {
                if let Some(shorter) = own.get(&key[..len]) {
                    merge_verdicts(&mut verdict, shorter);
                }
            }
            TrieEntry {
                key: key.clone(),
                verdict,
            }
        })
        .collect();
    entries.sort_by(|a, b| a.key.cmp(&b.key));
    entries
}

/// The same for the network trie: within one (protocol, port), an entry carries the verdicts of
/// the blocks that contain it.
fn covering_network(own: BTreeMap<(u8, u16, AddressBlock), Verdict>) -> Vec<NetworkEntry> {
    own.iter()
        .map(|(&(protocol, port, block), _)| {
            let mut verdict = Verdict::default();
            for (&(_, _, outer), outer_verdict) in own
                .range((protocol, port, AddressBlock::ALL)..)
                .take_while(|((p, q, _), _)| (*p, *q) == (protocol, port))
            {
                if outer.covers(&block) {
                    merge_verdict(&mut verdict, *outer_verdict);
                }
            }
            NetworkEntry {
                protocol,
                port,
                block,
                verdict,
            }
        })
        .collect()
}

/// Ports one network rule may list in total (each is a trie entry).
const MAX_PORTS_PER_RULE: u32 = 1024;

/// A rule on its way into the maps.
struct Rule {
    /// Where it came from, for errors.
    field: String,
    name: String,
    action: Action,
    effects: Vec<Effect>,
}

struct Compiler<'a> {
    file: &'a Path,
    violations: Violations,
    prefixes: HashMap<Vec<u8>, PathVerdict>,
    suffixes: HashMap<Vec<u8>, PathVerdict>,
    globs: Vec<GlobRule>,
    switches: KernelPolicy,
    mount_types: BTreeMap<[u8; FS_TYPE_LEN as usize], Verdict>,
    sockets: BTreeMap<(u32, u32), Verdict>,
    network: BTreeMap<(u8, u16, AddressBlock), Verdict>,
}

impl Compiler<'_> {
    fn error(&self, field: &str, reason: impl Into<String>) -> PolicyError {
        PolicyError::new(self.file, field, reason)
    }

    fn add(&mut self, rule: &Rule, rule_id: u32) -> Result<(), PolicyError> {
        let verdict = Verdict {
            action: kernel_action(rule.action, self.violations),
            rule_id,
        };
        for effect in &rule.effects {
            match effect {
                Effect::Paths { patterns, perms } => {
                    self.add_paths(&rule.field, patterns, *perms, verdict)?
                }
                Effect::Capabilities(mask) => {
                    for cap in (0..64).filter(|cap| mask & (1 << cap) != 0) {
                        merge_verdict(&mut self.switches.capability[cap], verdict);
                    }
                }
                Effect::Switch(switch) => {
                    merge_verdict(switch.verdict(&mut self.switches), verdict)
                }
                Effect::MountTypes(types) => {
                    for (index, fs_type) in types.iter().enumerate() {
                        let mut key = [0u8; FS_TYPE_LEN as usize];
                        if fs_type.is_empty() || fs_type.len() >= key.len() {
                            return Err(self.error(
                                &format!("{}.fsTypes[{index}]", rule.field),
                                format!(
                                    "\"{fs_type}\" is not a file system type (1 to {} bytes)",
                                    key.len() - 1
                                ),
                            ));
                        }
                        key[..fs_type.len()].copy_from_slice(fs_type.as_bytes());
                        merge_verdict(self.mount_types.entry(key).or_default(), verdict);
                    }
                }
                Effect::Sockets(keys) => {
                    for key in keys {
                        merge_verdict(self.sockets.entry(*key).or_default(), verdict);
                    }
                }
                Effect::Network {
                    addresses,
                    ports,
                    protocols,
                } => self.add_network(&rule.field, addresses, ports, protocols, verdict)?,
            }
        }
        Ok(())
    }

    fn add_paths(
        &mut self,
        field: &str,
        patterns: &[String],
        perms: u32,
        verdict: Verdict,
    ) -> Result<(), PolicyError> {
        if patterns.is_empty() {
            return Err(self.error(&format!("{field}.paths"), "must list at least one path"));
        }
        let Verdict { action, rule_id } = verdict;
        for (index, pattern) in patterns.iter().enumerate() {
            let pattern = Pattern::parse(pattern)
                .map_err(|reason| self.error(&format!("{field}.paths[{index}]"), reason))?;
            match pattern {
                Pattern::Exact(path) => {
                    let mut key = path.into_bytes();
                    key.push(0);
                    merge(
                        self.prefixes.entry(key).or_default(),
                        perms,
                        action,
                        rule_id,
                    );
                }
                Pattern::Prefix(prefix) => {
                    merge(
                        self.prefixes.entry(prefix.into_bytes()).or_default(),
                        perms,
                        action,
                        rule_id,
                    );
                }
                Pattern::Glob { prefix, suffix } => {
                    if self.globs.len() == MAX_GLOBS as usize {
                        return Err(self.error(
                            &format!("{field}.paths[{index}]"),
                            format!(
                                "a policy may hold at most {MAX_GLOBS} \"**\" patterns, built-in \
                                 rules included"
                            ),
                        ));
                    }
                    let bit = 1u64 << self.globs.len();
                    self.globs.push(GlobRule {
                        min_len: Pattern::min_len(&prefix, &suffix) as u32,
                        perms,
                        action,
                        rule_id,
                    });
                    self.prefixes
                        .entry(prefix.into_bytes())
                        .or_default()
                        .glob_mask |= bit;
                    let reversed: Vec<u8> = suffix.bytes().rev().collect();
                    self.suffixes.entry(reversed).or_default().glob_mask |= bit;
                }
            }
        }
        Ok(())
    }

    fn add_network(
        &mut self,
        field: &str,
        addresses: &[String],
        ports: &[(u16, u16)],
        protocols: &[u8],
        verdict: Verdict,
    ) -> Result<(), PolicyError> {
        let blocks = if addresses.is_empty() {
            vec![AddressBlock::ALL]
        } else {
            addresses
                .iter()
                .enumerate()
                .map(|(index, address)| {
                    AddressBlock::parse(address).map_err(|reason| {
                        self.error(&format!("{field}.addresses[{index}]"), reason)
                    })
                })
                .collect::<Result<_, _>>()?
        };
        let port_count: u32 = ports
            .iter()
            .map(|(low, high)| u32::from(high - low) + 1)
            .sum();
        if port_count > MAX_PORTS_PER_RULE {
            return Err(self.error(
                &format!("{field}.ports"),
                format!("may cover at most {MAX_PORTS_PER_RULE} ports, not {port_count}"),
            ));
        }
        let icmp = libc::IPPROTO_ICMP as u8;
        if !ports.is_empty() && protocols.contains(&icmp) {
            return Err(self.error(&format!("{field}.ports"), "ICMP has no ports"));
        }
        let ports: Vec<u16> = if ports.is_empty() {
            vec![0]
        } else {
            ports.iter().flat_map(|(low, high)| *low..=*high).collect()
        };
        let protocols = if protocols.is_empty() {
            &[0][..]
        } else {
            protocols
        };
        for &protocol in protocols {
            for &port in &ports {
                for &block in &blocks {
                    merge_verdict(
                        self.network.entry((protocol, port, block)).or_default(),
                        verdict,
                    );
                }
            }
        }
        Ok(())
    }

    fn finish(
        mut self,
        name: &str,
        rules: Vec<RuleInfo>,
        deciders: Vec<Decider>,
    ) -> CompiledPolicy {
        let lookups = [
            (!self.mount_types.is_empty(), LOOKUP_MOUNT_TYPES),
            (!self.sockets.is_empty(), LOOKUP_SOCKETS),
            (!self.network.is_empty(), LOOKUP_NETWORK),
            (!self.prefixes.is_empty(), LOOKUP_PATHS),
        ];
        self.switches.lookups = lookups
            .iter()
            .filter(|(used, _)| *used)
            .fold(0, |bits, (_, bit)| bits | bit);
        CompiledPolicy {
            name: name.to_owned(),
            rules,
            prefixes: covering_entries(self.prefixes),
            suffixes: covering_entries(self.suffixes),
            globs: self.globs,
            switches: self.switches,
            mount_types: self.mount_types.into_iter().collect(),
            sockets: self.sockets.into_iter().collect(),
            network: covering_network(self.network),
            deciders,
        }
    }
}

const ENHANCE_PROTECT: &str = "spec.enhanceProtect";

/// The rules a policy stands for, in rule id order: its mode's and lists', then the kernel rules
/// of its rule modules (`modules[i]` compiled by `spec.ruleModules[i]`).
fn rules_of(
    file: &Path,
    policy: &Policy,
    env: &Environment,
    modules: &[CustomRules],
) -> Result<Vec<Rule>, PolicyError> {
    let mut rules = listed_rules(file, policy, env)?;
    if policy.spec.mode != Mode::AlwaysAllow {
        for (index, (module, custom)) in policy.spec.rule_modules.iter().zip(modules).enumerate() {
            let base = format!("spec.ruleModules[{index}] ({})", module.name);
            custom_rules(
                file,
                custom,
                &base,
                &format!("{}/", module.name),
                &mut rules,
            )?;
        }
    }
    Ok(rules)
}

/// The rules a policy's mode and lists stand for.
fn listed_rules(file: &Path, policy: &Policy, env: &Environment) -> Result<Vec<Rule>, PolicyError> {
    let runtime_default = || Rule {
        field: "spec.mode".to_owned(),
        name: "runtime-default".to_owned(),
        action: Action::Deny,
        effects: catalog::runtime_default(),
    };
    let enhance = match (policy.spec.mode, &policy.spec.enhance_protect) {
        (Mode::EnhanceProtect, enhance) => enhance.clone().unwrap_or_default(),
        (mode, Some(_)) => {
            return Err(PolicyError::new(
                file,
                ENHANCE_PROTECT,
                format!("only allowed with mode EnhanceProtect, not {mode:?}"),
            ));
        }
        (Mode::AlwaysAllow, None) => return Ok(Vec::new()),
        (Mode::RuntimeDefault, None) => return Ok(vec![runtime_default()]),
    };
    let mut rules = Vec::new();
    if !enhance.privileged {
        rules.push(runtime_default());
    }
    let lists = [
        (Category::Hardening, &enhance.hardening_rules),
        (Category::AttackProtection, &enhance.attack_protection_rules),
        (Category::VulMitigation, &enhance.vul_mitigation_rules),
    ];
    let known = catalog::known_names();
    for (category, list) in lists {
        for (index, rule) in list.iter().enumerate() {
            let field = format!("{ENHANCE_PROTECT}.{}[{index}]", category.field());
            let name = rule.as_str();
            let error = |reason: String| PolicyError::new(file, &field, reason);
            let effects = match catalog::effects(name, env) {
                None => {
                    let hint = catalog::closest(name)
                        .map(|close| format!(" (did you mean \"{close}\"?)"))
                        .unwrap_or_default();
                    return Err(error(format!("unknown built-in rule \"{name}\"{hint}")));
                }
                Some(Err(reason)) => return Err(error(format!("\"{name}\": {reason}"))),
                Some(Ok(effects)) => effects,
            };
            let belongs = known
                .iter()
                .find(|(known, _)| known == name)
                .map(|(_, category)| *category);
            if belongs != Some(category) {
                let list = belongs.map_or("another list", Category::field);
                return Err(error(format!("\"{name}\" belongs in {list}")));
            }
            rules.push(Rule {
                field,
                name: name.to_owned(),
                action: if enhance.audit_rules.contains(rule) {
                    Action::Audit
                } else {
                    Action::Deny
                },
                effects,
            });
        }
    }
    for (index, name) in enhance.audit_rules.iter().enumerate() {
        if !lists.iter().any(|(_, list)| list.contains(name)) {
            return Err(PolicyError::new(
                file,
                format!("{ENHANCE_PROTECT}.auditRules[{index}]"),
                format!(
                    "\"{name}\" is not listed in hardeningRules, attackProtectionRules or vulMitigationRules"
                ),
            ));
        }
    }
    let base = format!("{ENHANCE_PROTECT}.customRules");
    custom_rules(file, &enhance.custom_rules, &base, "", &mut rules)?;
    Ok(rules)
}

/// Adds the rules of `custom`, found at the field `base`, their names prefixed with `prefix`.
fn custom_rules(
    file: &Path,
    custom: &CustomRules,
    base: &str,
    prefix: &str,
    rules: &mut Vec<Rule>,
) -> Result<(), PolicyError> {
    let mut push = |kind: &str, index: usize, name: &Option<String>, action, effects| {
        let field = format!("{base}.{kind}[{index}]");
        let name = name
            .clone()
            .unwrap_or_else(|| format!("customRules.{kind}[{index}]"));
        rules.push(Rule {
            name: format!("{prefix}{name}"),
            field,
            action,
            effects,
        });
    };
    for (index, rule) in custom.files.iter().enumerate() {
        if rule.permissions.is_empty() {
            return Err(PolicyError::new(
                file,
                format!("{base}.files[{index}].permissions"),
                "must list at least one permission",
            ));
        }
        let effects = vec![Effect::Paths {
            patterns: rule.paths.clone(),
            perms: kernel_perms(&rule.permissions),
        }];
        push("files", index, &rule.name, rule.action, effects);
    }
    for (index, rule) in custom.exec.iter().enumerate() {
        let effects = vec![Effect::Paths {
            patterns: rule.paths.clone(),
            perms: EXEC_RULE_PERMS,
        }];
        push("exec", index, &rule.name, rule.action, effects);
    }
    for (index, rule) in custom.network.iter().enumerate() {
        let ports = rule
            .ports
            .iter()
            .enumerate()
            .map(|(port_index, port)| {
                match port {
                    PortRange::Port(0) => Err("0 is not a port".to_owned()),
                    PortRange::Port(port) => Ok((*port, *port)),
                    PortRange::Range(range) => parse_port_range(range),
                }
                .map_err(|reason| {
                    PolicyError::new(
                        file,
                        format!("{base}.network[{index}].ports[{port_index}]"),
                        reason,
                    )
                })
            })
            .collect::<Result<_, _>>()?;
        let protocols = rule
            .protocols
            .iter()
            .map(|protocol| match protocol {
                Protocol::Tcp => libc::IPPROTO_TCP as u8,
                Protocol::Udp => libc::IPPROTO_UDP as u8,
                Protocol::Icmp => libc::IPPROTO_ICMP as u8,
            })
            .collect();
        let effects = vec![Effect::Network {
            addresses: rule.addresses.clone(),
            ports,
            protocols,
        }];
        push("network", index, &rule.name, rule.action, effects);
    }
    for (index, rule) in custom.mount.iter().enumerate() {
        let effect = if rule.fs_types.is_empty() {
            Effect::Switch(Switch::Mount)
        } else {
            Effect::MountTypes(rule.fs_types.clone())
        };
        push("mount", index, &rule.name, rule.action, vec![effect]);
    }
    for (index, rule) in custom.capabilities.iter().enumerate() {
        // Every capability named, less those named with a leading "-".
        let (mut included, mut excluded) = (0u64, 0u64);
        for (cap_index, name) in rule.capabilities.iter().enumerate() {
            let (set, name) = match name.strip_prefix('-') {
                Some(name) => (&mut excluded, name),
                None => (&mut included, name.as_str()),
            };
            *set |= match name {
                "all" => catalog::ALL_CAPS,
                name => {
                    1 << catalog::capability(name).ok_or_else(|| {
                        PolicyError::new(
                            file,
                            format!("{base}.capabilities[{index}].capabilities[{cap_index}]"),
                            format!("unknown capability \"{name}\""),
                        )
                    })?
                }
            };
        }
        let mask = included & !excluded;
        if mask == 0 {
            return Err(PolicyError::new(
                file,
                format!("{base}.capabilities[{index}].capabilities"),
                "must list at least one capability",
            ));
        }
        push(
            "capabilities",
            index,
            &rule.name,
            rule.action,
            vec![Effect::Capabilities(mask)],
        );
    }
    Ok(())
}

/// Compiles a parsed policy. `file` only names the source in errors.
pub fn compile(
    file: &Path,
    policy: &Policy,
    env: &Environment,
    modules: &[CustomRules],
) -> Result<CompiledPolicy, PolicyError> {
    let rules = rules_of(file, policy, env, modules)?;
    let violations = policy
        .spec
        .enhance_protect
        .as_ref()
        .map(|enhance| Violations {
            audit: enhance.audit_violations,
            allow: enhance.allow_violations,
        })
        .unwrap_or_default();
    let mut compiler = Compiler {
        file,
        violations,
        prefixes: HashMap::new(),
        suffixes: HashMap::new(),
        globs: Vec::new(),
        switches: KernelPolicy::default(),
        mount_types: BTreeMap::new(),
        sockets: BTreeMap::new(),
        network: BTreeMap::new(),
    };
    let mut infos: Vec<RuleInfo> = Vec::new();
    for rule in &rules {
        if infos.iter().any(|info| info.name == rule.name) {
            return Err(PolicyError::new(
                file,
                &rule.field,
                format!("duplicate rule name \"{}\"", rule.name),
            ));
        }
        infos.push(RuleInfo {
            name: rule.name.clone(),
            action: rule.action,
        });
        compiler.add(rule, infos.len() as u32)?;
    }
    let deciders = policy
        .spec
        .rule_modules
        .iter()
        .map(|module| Decider {
            name: module.name.clone(),
            digest: module.sha256.to_ascii_lowercase(),
            config: module.config.to_string(),
            on_failure: module.on_failure,
        })
        .collect();
    Ok(compiler.finish(&policy.metadata.name, infos, deciders))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Pattern;

    fn parse(text: &str) -> Result<CompiledPolicy, PolicyError> {
        let file = Path::new("p.yaml");
        compile(
            file,
            &Policy::parse(file, text)?,
            &Environment::default(),
            &[],
        )
    }

    /// A privileged EnhanceProtect policy (no RuntimeDefault rule) whose custom rules are
    /// `rules`, indented by four spaces.
    fn with_rules(rules: &str) -> String {
        let rules: String = rules.lines().map(|line| format!("  {line}\n")).collect();
        format!(
            "apiVersion: palisade.dev/v1alpha1\nkind: PalisadePolicy\nmetadata:\n  name: t\nspec:\n  mode: EnhanceProtect\n  enhanceProtect:\n    privileged: true\n    customRules:\n{rules}"
        )
    }

    fn decide(policy: &CompiledPolicy, path: &str, perms: u32) -> (u32, u32) {
        let verdict = policy.decide_path(path, perms);
        (verdict.action, verdict.rule_id)
    }

    #[test]
    fn permissions_are_named_by_their_bits_and_back() {
        assert_eq!(permission_names(PERM_READ | PERM_EXEC), ["read", "exec"]);
        assert!(permission_names(0).is_empty());
        assert_eq!(permission_names(!0), PERMISSION_NAMES);
        for (bit, name) in PERMISSION_NAMES.iter().enumerate() {
            assert_eq!(permission_bit(name), Some(1 << bit));
            assert_eq!(permission_names(1 << bit), [*name]);
        }
        assert_eq!(permission_bit("delete"), None);
    }

    #[test]
    fn exact_prefix_and_glob_rules_decide_like_the_patterns() {
        let policy = parse(&with_rules(
            "    files:
      - name: secrets
        paths: [/etc/shadow, /secrets/]
        permissions: [read, write]
        action: deny
      - paths: [/proc/**/mem]
        permissions: [read]
        action: audit
    exec:
      - name: no-curl
        paths: [/usr/bin/curl]
        action: deny
",
        ))
        .unwrap();
        assert_eq!(policy.rule_name(1), Some("secrets"));
        assert_eq!(policy.rule_name(2), Some("customRules.files[1]"));
        assert_eq!(policy.rule_name(3), Some("no-curl"));
        assert_eq!(decide(&policy, "/etc/shadow", PERM_READ), (ACTION_DENY, 1));
        assert_eq!(
            decide(&policy, "/etc/shadow", PERM_APPEND),
            (ACTION_DENY, 1)
        );
        assert_eq!(decide(&policy, "/etc/shadow-", PERM_READ), (0, 0));
        assert_eq!(decide(&policy, "/etc/shadow", PERM_EXEC), (0, 0));
        assert_eq!(
            decide(&policy, "/secrets/a/b", PERM_WRITE),
            (ACTION_DENY, 1)
        );
        assert_eq!(decide(&policy, "/secrets", PERM_WRITE), (0, 0));
        assert_eq!(decide(&policy, "/proc/1/mem", PERM_READ), (ACTION_AUDIT, 2));
        assert_eq!(decide(&policy, "/proc/mem", PERM_READ), (ACTION_AUDIT, 2));
        assert_eq!(decide(&policy, "/proc/1/mem", PERM_WRITE), (0, 0));
        assert_eq!(
            decide(&policy, "/usr/bin/curl", PERM_EXEC),
            (ACTION_DENY, 3)
        );
        // Reading it would allow a copy under another name.
        assert_eq!(
            decide(&policy, "/usr/bin/curl", PERM_READ),
            (ACTION_DENY, 3)
        );
        assert_eq!(decide(&policy, "/usr/bin/curl", PERM_WRITE), (0, 0));
    }

    /// The tries answer exactly what the patterns mean (`Pattern::matches`), rule by rule.
    #[test]
    fn tries_agree_with_the_patterns() {
        let patterns = [
            "/etc/shadow",
            "/etc/",
            "/etc/ssl/",
            "/proc/**/mem",
            "/**/id_rsa",
            "/data/tmp**.key",
            "/x/y/**/y/z",
            "/a/**/a",
            "/srv/app/config.yaml",
        ];
        let paths = [
            "/etc/shadow",
            "/etc/shadow-",
            "/etc",
            "/etc/ssl/a",
            "/proc/mem",
            "/proc/1/mem",
            "/proc/1/mems",
            "/id_rsa",
            "/home/u/.ssh/id_rsa",
            "/data/tmp.key",
            "/data/tmpx/y.key",
            "/data/tm.key",
            "/x/y/z",
            "/x/y/y/z",
            "/a/a",
            "/a/b/a",
            "/a",
            "/srv/app/config.yaml",
            "/srv/app/config.yaml.bak",
        ];
        let mut rules = String::from("    files:\n");
        for pattern in patterns {
            rules.push_str(&format!("      - paths: [\"{pattern}\"]\n        permissions: [read]\n        action: audit\n"));
        }
        let policy = parse(&with_rules(&rules)).unwrap();
        for path in paths {
            let matching: Vec<usize> = patterns
                .iter()
                .enumerate()
                .filter(|(_, pattern)| Pattern::parse(pattern).unwrap().matches(path))
                .map(|(index, _)| index + 1)
                .collect();
            let (action, rule_id) = decide(&policy, path, PERM_READ);
            if matching.is_empty() {
                assert_eq!(action, 0, "{path} matched rule {rule_id}");
            } else {
                assert_eq!(action, ACTION_AUDIT, "{path} should match {matching:?}");
                // Several rules may match; the one reported must be one of them.
                assert!(
                    matching.contains(&(rule_id as usize)),
                    "{path}: rule {rule_id}, expected one of {matching:?}"
                );
            }
        }
    }

    #[test]
    fn covering_rules_are_merged_into_longer_entries() {
        let policy = parse(&with_rules(
            "    files:
      - paths: [/etc/]
        permissions: [write]
        action: deny
      - paths: [/etc/ssl/]
        permissions: [read, write]
        action: audit
      - paths: [/etc/ssl/private/key.pem]
        permissions: [read]
        action: deny
",
        ))
        .unwrap();
        // The longest entry alone answers for the shorter rules that cover it.
        assert_eq!(
            decide(&policy, "/etc/ssl/cert.pem", PERM_WRITE),
            (ACTION_DENY, 1)
        );
        assert_eq!(
            decide(&policy, "/etc/ssl/cert.pem", PERM_READ),
            (ACTION_AUDIT, 2)
        );
        assert_eq!(
            decide(&policy, "/etc/ssl/private/key.pem", PERM_READ),
            (ACTION_DENY, 3)
        );
        assert_eq!(
            decide(&policy, "/etc/ssl/private/key.pem", PERM_WRITE),
            (ACTION_DENY, 1)
        );
        assert_eq!(decide(&policy, "/etc/hosts", PERM_READ), (0, 0));
        assert_eq!(policy.prefixes.len(), 3);
    }

    #[test]
    fn glob_bits_follow_covering_prefixes_and_suffixes() {
        let policy = parse(&with_rules(
            "    files:
      - paths: [/data/**.key]
        permissions: [read]
        action: deny
      - paths: [/data/tmp/**/x.key]
        permissions: [read]
        action: audit
      - paths: [/data/tmp/keep]
        permissions: [read]
        action: audit
",
        ))
        .unwrap();
        assert_eq!(
            decide(&policy, "/data/tmp/a/x.key", PERM_READ),
            (ACTION_DENY, 1)
        );
        assert_eq!(
            decide(&policy, "/data/tmp/keep", PERM_READ),
            (ACTION_AUDIT, 3)
        );
        assert_eq!(decide(&policy, "/data/tmp/a/y.pem", PERM_READ), (0, 0));
        assert_eq!(policy.globs.len(), 2);
    }

    #[test]
    fn ten_thousand_rules_compile_to_one_entry_each() {
        let mut rules = String::from("    files:\n");
        for i in 0..10_000 {
            rules.push_str(&format!(
                "      - paths: [/data/f{i}]\n        permissions: [read]\n        action: deny\n"
            ));
        }
        let policy = parse(&with_rules(&rules)).unwrap();
        assert_eq!(policy.rules.len(), 10_000);
        assert_eq!(policy.prefixes.len(), 10_000);
        assert_ne!(
            policy.switches.lookups & LOOKUP_PATHS,
            0,
            "path rules are looked up"
        );
        assert_eq!(
            decide(&policy, "/data/f9999", PERM_READ),
            (ACTION_DENY, 10_000)
        );
    }

    #[test]
    fn invalid_policies_name_file_field_and_reason() {
        let cases = [
            (
                with_rules("    filez: []\n"),
                "p.yaml: spec.enhanceProtect.customRules: unknown field `filez`, expected one of `files`, `exec`, `network`, `mount`, `capabilities` at line 10 column 7",
            ),
            (
                with_rules("    files:\n      - paths: [/a]\n        permissions: [exe]\n        action: deny\n"),
                "p.yaml: spec.enhanceProtect.customRules.files[0].permissions[0]: unknown variant `exe`, expected one of `read`, `write`, `append`, `exec` at line 12 column 25",
            ),
            (
                with_rules("    files:\n      - paths: [/a]\n        permissions: [read]\n        action: block\n"),
                "p.yaml: spec.enhanceProtect.customRules.files[0].action: unknown variant `block`, expected `audit` or `deny` at line 13 column 19",
            ),
            (
                with_rules("    files:\n      - paths: [/a/*.txt]\n        permissions: [read]\n        action: deny\n"),
                "p.yaml: spec.enhanceProtect.customRules.files[0].paths[0]: \"/a/*.txt\": only the \"**\" wildcard is supported (no \"*\", \"?\" or \"[\")",
            ),
            (
                with_rules("    exec:\n      - paths: [bin/sh]\n        action: deny\n"),
                "p.yaml: spec.enhanceProtect.customRules.exec[0].paths[0]: \"bin/sh\" is not an absolute path",
            ),
            (
                with_rules("    files:\n      - paths: []\n        permissions: [read]\n        action: deny\n"),
                "p.yaml: spec.enhanceProtect.customRules.files[0].paths: must list at least one path",
            ),
            (
                with_rules("    files:\n      - paths: [/a]\n        permissions: []\n        action: deny\n"),
                "p.yaml: spec.enhanceProtect.customRules.files[0].permissions: must list at least one permission",
            ),
            (
                with_rules("    exec:\n      - name: x\n        paths: [/a]\n        action: deny\n      - name: x\n        paths: [/b]\n        action: deny\n"),
                "p.yaml: spec.enhanceProtect.customRules.exec[1]: duplicate rule name \"x\"",
            ),
            (
                with_rules("    files:\n      - paths: [/a]\n        action: deny\n"),
                "p.yaml: spec.enhanceProtect.customRules.files[0]: missing field `permissions` at line 11 column 11",
            ),
            (
                "apiVersion: palisade.dev/v1\nkind: PalisadePolicy\nmetadata:\n  name: t\nspec: {mode: AlwaysAllow}\n".to_owned(),
                "p.yaml: apiVersion: expected \"palisade.dev/v1alpha1\", got \"palisade.dev/v1\"",
            ),
            ("[1, 2]".to_owned(), "p.yaml: (document): invalid type: sequence, expected struct Policy"),
        ];
        for (text, expected) in cases {
            assert_eq!(parse(&text).unwrap_err().to_string(), expected, "{text}");
        }
    }

    #[test]
    fn too_many_globs_is_an_error() {
        let paths: Vec<String> = (0..65).map(|i| format!("/d{i}/**/x")).collect();
        let text = with_rules(&format!(
            "    files:\n      - paths: [{}]\n        permissions: [read]\n        action: deny\n",
            paths.join(", ")
        ));
        assert_eq!(
            parse(&text).unwrap_err().to_string(),
            "p.yaml: spec.enhanceProtect.customRules.files[0].paths[64]: a policy may hold at most 64 \"**\" patterns, built-in rules included"
        );
    }

    fn with_spec(spec: &str) -> String {
        format!(
            "apiVersion: palisade.dev/v1alpha1\nkind: PalisadePolicy\nmetadata:\n  name: t\nspec:\n{spec}"
        )
    }

    fn rule_names(policy: &CompiledPolicy) -> Vec<&str> {
        policy.rules.iter().map(|rule| rule.name.as_str()).collect()
    }

    #[test]
    fn always_allow_compiles_to_nothing() {
        let policy = parse(&with_spec("  mode: AlwaysAllow\n")).unwrap();
        assert!(policy.rules.is_empty());
        assert!(policy.prefixes.is_empty());
        assert_eq!(policy.switches, KernelPolicy::default());
    }

    #[test]
    fn runtime_default_denies_kernel_interfaces_mounts_and_outside_ptrace_silently() {
        let policy = parse(&with_spec("  mode: RuntimeDefault\n")).unwrap();
        assert_eq!(rule_names(&policy), ["runtime-default"]);
        for path in [
            "/proc/sysrq-trigger",
            "/proc/1/mem",
            "/proc/kcore",
            "/sys/firmware/efi/vars",
        ] {
            assert_eq!(decide(&policy, path, PERM_READ), (ACTION_DENY, 1), "{path}");
            assert_eq!(
                decide(&policy, path, PERM_WRITE),
                (ACTION_DENY, 1),
                "{path}"
            );
        }
        assert_eq!(decide(&policy, "/proc/1/status", PERM_READ), (0, 0));
        let deny = Verdict {
            action: ACTION_DENY,
            rule_id: 1,
        };
        assert_eq!(policy.switches.mount, deny);
        assert_eq!(policy.switches.ptrace_outside, deny);
        assert_eq!(policy.switches.umount, Verdict::default());
        assert_eq!(policy.switches.capability, [Verdict::default(); 64]);
    }

    #[test]
    fn enhance_protect_adds_runtime_default_unless_privileged() {
        let spec = |privileged: bool| {
            with_spec(&format!(
                "  mode: EnhanceProtect\n  enhanceProtect:\n    privileged: {privileged}\n    hardeningRules: [disallow-umount, disable-cap-sys-admin]\n    attackProtectionRules: [disable-shell]\n    auditRules: [disable-shell]\n    vulMitigationRules: [copy-fail-mitigation]\n"
            ))
        };
        let policy = parse(&spec(false)).unwrap();
        assert_eq!(
            rule_names(&policy),
            [
                "runtime-default",
                "disallow-umount",
                "disable-cap-sys-admin",
                "disable-shell",
                "copy-fail-mitigation"
            ]
        );
        assert_eq!(policy.switches.mount.action, ACTION_DENY);
        assert_eq!(
            policy.switches.umount,
            Verdict {
                action: ACTION_DENY,
                rule_id: 2
            }
        );
        assert_eq!(
            policy.switches.capability[21],
            Verdict {
                action: ACTION_DENY,
                rule_id: 3
            }
        );
        assert_eq!(decide(&policy, "/bin/bash", PERM_EXEC), (ACTION_AUDIT, 4));
        assert_eq!(
            policy.sockets,
            [(
                (libc::AF_ALG as u32, palisade_common::ANY_PROTOCOL),
                Verdict {
                    action: ACTION_DENY,
                    rule_id: 5
                }
            )]
        );
        let privileged = parse(&spec(true)).unwrap();
        assert_eq!(rule_names(&privileged)[0], "disallow-umount");
        assert_eq!(privileged.switches.mount, Verdict::default());
        assert_eq!(decide(&privileged, "/proc/kcore", PERM_READ), (0, 0));
    }

    #[test]
    fn violation_flags_change_every_deny() {
        let spec = |flags: &str| {
            with_spec(&format!(
                "  mode: EnhanceProtect\n  enhanceProtect:\n{flags}    hardeningRules: [disallow-mount]\n    attackProtectionRules: [disable-write-etc]\n    auditRules: [disable-write-etc]\n"
            ))
        };
        let actions = |flags: &str| {
            let policy = parse(&spec(flags)).unwrap();
            (
                policy.switches.mount.action,
                decide(&policy, "/etc/hosts", PERM_WRITE).0,
            )
        };
        assert_eq!(actions(""), (ACTION_DENY, ACTION_AUDIT));
        assert_eq!(
            actions("    auditViolations: true\n"),
            (ACTION_DENY | ACTION_AUDIT, ACTION_AUDIT)
        );
        assert_eq!(
            actions("    allowViolations: true\n"),
            (ACTION_AUDIT, ACTION_AUDIT)
        );
        assert_eq!(
            actions("    auditViolations: true\n    allowViolations: true\n"),
            (ACTION_AUDIT, ACTION_AUDIT)
        );
    }

    #[test]
    fn rule_names_are_checked_with_a_suggestion() {
        let error = |list: &str, name: &str| {
            parse(&with_spec(&format!(
                "  mode: EnhanceProtect\n  enhanceProtect:\n    {list}: [{name}]\n"
            )))
            .unwrap_err()
            .to_string()
        };
        assert_eq!(
            error("hardeningRules", "disalow-mount"),
            "p.yaml: spec.enhanceProtect.hardeningRules[0]: unknown built-in rule \"disalow-mount\" (did you mean \"disallow-mount\"?)"
        );
        assert_eq!(
            error("hardeningRules", "no-such-thing-at-all"),
            "p.yaml: spec.enhanceProtect.hardeningRules[0]: unknown built-in rule \"no-such-thing-at-all\""
        );
        assert_eq!(
            error("vulMitigationRules", "disable-shell"),
            "p.yaml: spec.enhanceProtect.vulMitigationRules[0]: \"disable-shell\" belongs in attackProtectionRules"
        );
        assert_eq!(
            error("auditRules", "disable-shell"),
            "p.yaml: spec.enhanceProtect.auditRules[0]: \"disable-shell\" is not listed in hardeningRules, attackProtectionRules or vulMitigationRules"
        );
        assert_eq!(
            error("attackProtectionRules", "block-access-to-kube-apiserver"),
            "p.yaml: spec.enhanceProtect.attackProtectionRules[0]: \"block-access-to-kube-apiserver\": the API server's address is unknown (KUBERNETES_SERVICE_HOST is not set)"
        );
        assert_eq!(
            parse(&with_spec("  mode: RuntimeDefault\n  enhanceProtect: {}\n"))
                .unwrap_err()
                .to_string(),
            "p.yaml: spec.enhanceProtect: only allowed with mode EnhanceProtect, not RuntimeDefault"
        );
    }

    #[test]
    fn every_built_in_rule_compiles_together() {
        let mut lists: HashMap<&str, Vec<String>> = HashMap::new();
        for (name, category) in catalog::known_names() {
            lists.entry(category.field()).or_default().push(name);
        }
        let mut spec = String::from("  mode: EnhanceProtect\n  enhanceProtect:\n");
        for (field, names) in &lists {
            spec.push_str(&format!("    {field}: [{}]\n", names.join(", ")));
        }
        let file = Path::new("p.yaml");
        let env = Environment {
            kube_apiserver: vec!["10.96.0.1".into()],
            ..Environment::default()
        };
        let policy = compile(
            file,
            &Policy::parse(file, &with_spec(&spec)).unwrap(),
            &env,
            &[],
        )
        .unwrap();
        assert_eq!(policy.rules.len(), catalog::known_names().len() + 1);
        assert!(policy.globs.len() <= MAX_GLOBS as usize);
    }

    #[test]
    fn network_rules_merge_covering_blocks_and_map_ipv4() {
        let policy = parse(&with_rules(
            "    network:
      - name: private
        addresses: [10.0.0.0/8]
        action: deny
      - name: web
        addresses: [10.1.0.0/16, \"::ffff:192.0.2.1\"]
        ports: [443, \"8000-8001\"]
        protocols: [tcp]
        action: audit
",
        ))
        .unwrap();
        let entry = |block: &str, protocol: u8, port: u16| {
            let block = AddressBlock::parse(block).unwrap();
            policy
                .network
                .iter()
                .find(|e| e.block == block && e.protocol == protocol && e.port == port)
                .map(|e| e.verdict)
        };
        assert_eq!(
            entry("10.0.0.0/8", 0, 0),
            Some(Verdict {
                action: ACTION_DENY,
                rule_id: 1
            })
        );
        assert_eq!(
            entry("10.1.0.0/16", 6, 443),
            Some(Verdict {
                action: ACTION_AUDIT,
                rule_id: 2
            })
        );
        assert_eq!(
            entry("192.0.2.1", 6, 8001),
            Some(Verdict {
                action: ACTION_AUDIT,
                rule_id: 2
            })
        );
        // 3 ports x 2 blocks, plus the /8.
        assert_eq!(policy.network.len(), 7);
        let error = parse(&with_rules(
            "    network:\n      - addresses: [10.0.0.1/8]\n        action: deny\n",
        ))
        .unwrap_err();
        assert_eq!(
            error.to_string(),
            "p.yaml: spec.enhanceProtect.customRules.network[0].addresses[0]: \"10.0.0.1/8\" has bits set beyond its prefix length"
        );
    }

    #[test]
    fn mount_and_capability_rules() {
        let policy = parse(&with_rules(
            "    mount:
      - fsTypes: [tmpfs]
        action: deny
      - action: audit
    capabilities:
      - capabilities: [CAP_NET_ADMIN, sys_time]
        action: deny
",
        ))
        .unwrap();
        let mut tmpfs = [0u8; 16];
        tmpfs[..5].copy_from_slice(b"tmpfs");
        assert_eq!(
            policy.mount_types,
            [(
                tmpfs,
                Verdict {
                    action: ACTION_DENY,
                    rule_id: 1
                }
            )]
        );
        assert_eq!(
            policy.switches.mount,
            Verdict {
                action: ACTION_AUDIT,
                rule_id: 2
            }
        );
        assert_eq!(policy.switches.capability[12].action, ACTION_DENY);
        assert_eq!(policy.switches.capability[25].action, ACTION_DENY);
        assert_eq!(policy.switches.lookups, LOOKUP_MOUNT_TYPES);
        let error = parse(&with_rules(
            "    capabilities:\n      - capabilities: [sys_admn]\n        action: deny\n",
        ))
        .unwrap_err();
        assert_eq!(
            error.to_string(),
            "p.yaml: spec.enhanceProtect.customRules.capabilities[0].capabilities[0]: unknown capability \"sys_admn\""
        );
    }
}

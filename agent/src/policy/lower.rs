//! Spec -> rules: a policy's mode, built-in rule lists, custom rules and rule modules' rules
//! become one list of rules, each a name, an action and checked effects (see `effect`). Every
//! `PolicyError` a valid YAML document can cause is found here, named by its field.

use std::{fmt::Display, time::Duration};

use palisade_common::{ANY_PROTOCOL, FS_TYPE_LEN, MAX_GLOBS, PERM_CONNECT, SOCKET_TYPE};
use palisade_rule_sdk::model::{family_number, socket_type_number};

use super::{
    Action, AllowRules, AttackProtection, CustomRules, EnhanceProtect, Mode, Pattern, Policy,
    PolicyError, PolicySpec, PortRange, Protocol, RuleModule, VArmorRules,
    catalog::{self, Category, Environment},
    effect::{AddressBlock, Allowance, EXEC_RULE_PERMS, Effect, Switch, parse_port_range},
    permission::kernel_perms,
};

/// Ports one network rule may list in total (each is a trie entry).
const MAX_PORTS_PER_RULE: u32 = 1024;

const ENHANCE_PROTECT: &str = "spec.enhanceProtect";
const BEHAVIOR_MODELING: &str = "spec.behaviorModeling";
const DEFENSE_IN_DEPTH: &str = "spec.defenseInDepth";
/// Address families are below this (the kernel's AF_MAX is 46 today).
const MAX_FAMILY: u32 = 64;
/// Socket types are at most this.
const SOCK_TYPE_MASK: u32 = 0xf;
/// The longest BehaviorModeling: a week.
const LONGEST_MODELING: Duration = Duration::from_secs(168 * 3600);

/// What one rule module compiled: rules like a policy's custom rules, and allow rules that
/// widen a DefenseInDepth policy's allowlist, each by its name (one list of `AllowRules` each).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModuleRules {
    pub custom: CustomRules,
    pub allow: Vec<(String, AllowRules)>,
}

/// A rule on its way into the maps.
pub(super) struct Rule {
    /// Where it came from, for errors.
    field: String,
    pub name: String,
    pub action: Action,
    pub effects: Vec<Effect>,
}

/// What a policy does with its violations, for every deny rule.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Violations {
    pub audit: bool,
    pub allow: bool,
}

impl Violations {
    pub(super) fn of(policy: &Policy) -> Self {
        let enhance = policy.spec.enhance_protect.as_ref();
        enhance.map_or_else(Self::default, |enhance| Self {
            audit: enhance.audit_violations,
            allow: enhance.allow_violations,
        })
    }
}

/// The rules a policy stands for, in rule id order: its mode's and lists', then the kernel rules
/// of its rule modules (`modules[i]` compiled by `spec.ruleModules[i]`).
pub(super) fn lower(
    source: &dyn Display,
    policy: &Policy,
    env: &Environment,
    modules: &[ModuleRules],
) -> Result<Vec<Rule>, PolicyError> {
    let mut rules = listed_rules(source, policy, env)?;
    rules.extend(defense_in_depth(source, policy, modules)?);
    if policy.spec.mode != Mode::AlwaysAllow {
        for (index, (module, compiled)) in policy.spec.rule_modules.iter().zip(modules).enumerate()
        {
            let mut module_rules = Vec::new();
            custom_rules(
                source,
                &compiled.custom,
                &module_field(index, module),
                &format!("{}/", module.name),
                &mut module_rules,
            )?;
            // A module's entries of one name and action are one rule (one entry matches one kind
            // of operation, a rule may match several, as a built-in rule does).
            let first = rules.len();
            for rule in module_rules {
                let same = rules[first..]
                    .iter_mut()
                    .find(|earlier| earlier.name == rule.name && earlier.action == rule.action);
                match same {
                    Some(earlier) => earlier.effects.extend(rule.effects),
                    None => rules.push(rule),
                }
            }
        }
    }
    for (index, rule) in rules.iter().enumerate() {
        if rules[..index]
            .iter()
            .any(|earlier| earlier.name == rule.name)
        {
            return Err(PolicyError::new(
                source,
                &rule.field,
                format!("duplicate rule name \"{}\"", rule.name),
            ));
        }
    }
    check_globs(source, &rules)?;
    Ok(rules)
}

/// How long a BehaviorModeling policy models its target; None in the other modes.
pub(super) fn modeling(
    source: &dyn Display,
    policy: &Policy,
) -> Result<Option<Duration>, PolicyError> {
    let field = format!("{BEHAVIOR_MODELING}.duration");
    match (policy.spec.mode, &policy.spec.behavior_modeling) {
        (Mode::BehaviorModeling, Some(modeling)) => parse_duration(&modeling.duration)
            .map(Some)
            .map_err(|reason| PolicyError::new(source, field, reason)),
        (Mode::BehaviorModeling, None) => Err(PolicyError::new(
            source,
            BEHAVIOR_MODELING,
            "mode BehaviorModeling needs its duration",
        )),
        (mode, Some(_)) => Err(PolicyError::new(
            source,
            BEHAVIOR_MODELING,
            format!("only allowed with mode BehaviorModeling, not {mode:?}"),
        )),
        (_, None) => Ok(None),
    }
}

/// Where errors name `spec.ruleModules[index]`.
pub fn module_field(index: usize, module: &RuleModule) -> String {
    format!("spec.ruleModules[{index}] ({})", module.name)
}

/// DefenseInDepth: the rule denying and reporting what neither `defenseInDepth.allow` nor the
/// allow rules of the policy's rule modules (`modules[i]` compiled by `spec.ruleModules[i]`)
/// allow.
fn defense_in_depth(
    source: &dyn Display,
    policy: &Policy,
    modules: &[ModuleRules],
) -> Result<Option<Rule>, PolicyError> {
    let mut rule_modules = policy.spec.rule_modules.iter().zip(modules).enumerate();
    let defense = match (policy.spec.mode, &policy.spec.defense_in_depth) {
        (Mode::DefenseInDepth, Some(defense)) => defense,
        (Mode::DefenseInDepth, None) => {
            return Err(PolicyError::new(
                source,
                DEFENSE_IN_DEPTH,
                "mode DefenseInDepth needs defenseInDepth (what the target may do)",
            ));
        }
        (mode, Some(_)) => {
            return Err(PolicyError::new(
                source,
                DEFENSE_IN_DEPTH,
                format!("only allowed with mode DefenseInDepth, not {mode:?}"),
            ));
        }
        (mode, None) => {
            let allowing = rule_modules.find(|(_, (_, compiled))| !compiled.allow.is_empty());
            if let Some((index, (module, _))) = allowing {
                return Err(PolicyError::new(
                    source,
                    module_field(index, module),
                    format!(
                        "its allow rules widen a DefenseInDepth policy's allowlist: not allowed \
                         with mode {mode:?}"
                    ),
                ));
            }
            return Ok(None);
        }
    };
    let mut allowed = allowances(source, &format!("{DEFENSE_IN_DEPTH}.allow"), &defense.allow)?;
    for (index, (module, compiled)) in rule_modules {
        for (name, allow) in &compiled.allow {
            let field = format!("{}.allow[\"{name}\"]", module_field(index, module));
            allowed.extend(allowances(source, &field, allow)?);
        }
    }
    Ok(Some(Rule {
        field: DEFENSE_IN_DEPTH.to_owned(),
        name: "defense-in-depth".to_owned(),
        action: Action::Deny,
        effects: vec![
            Effect::DenyByDefault {
                trial: defense.allow_violations,
            },
            Effect::Allow(allowed),
        ],
    }))
}

/// The allowances of the allow rules `allow`, found at `field`.
fn allowances(
    source: &dyn Display,
    field: &str,
    allow: &AllowRules,
) -> Result<Vec<Allowance>, PolicyError> {
    let list = |name: &str| format!("{field}.{name}");
    let mut allowed = Vec::new();
    let mut allow_at = |field: String, effect: Effect| allowed.push(Allowance { field, effect });
    for (index, file) in allow.files.iter().enumerate() {
        let field = format!("{}[{index}]", list("files"));
        if file.permissions.is_empty() {
            return Err(PolicyError::new(
                source,
                format!("{field}.permissions"),
                "must list at least one permission",
            ));
        }
        let paths = format!("{field}.paths");
        let patterns = path_patterns(source, &field, &file.paths)?;
        allow_at(
            paths,
            Effect::Paths {
                patterns,
                perms: kernel_perms(&file.permissions),
            },
        );
    }
    for (paths, name, perms) in [
        (&allow.exec, "exec", EXEC_RULE_PERMS),
        (&allow.unix_sockets, "unixSockets", PERM_CONNECT),
    ] {
        if !paths.is_empty() {
            let patterns = parse_each(source, &list(name), paths, |path| Pattern::parse(path))?;
            allow_at(list(name), Effect::Paths { patterns, perms });
        }
    }
    if !allow.capabilities.is_empty() {
        let mask = capability_mask(source, field, &allow.capabilities)?;
        allow_at(list("capabilities"), Effect::Capabilities(mask));
    }
    for (index, peers) in allow.network.iter().enumerate() {
        let field = format!("{}[{index}]", list("network"));
        let effect = network_effect(
            source,
            &field,
            &peers.addresses,
            &peers.ports,
            &peers.protocols,
        )?;
        allow_at(field, effect);
    }
    if !allow.mount.is_empty() {
        let types = fs_types(source, &list("mount"), &allow.mount)?;
        allow_at(list("mount"), Effect::MountTypes(types));
    }
    let mut sockets = Vec::new();
    for (index, socket) in allow.sockets.iter().enumerate() {
        let field = format!("{}[{index}]", list("sockets"));
        sockets.extend(socket_keys(source, &field, &socket.family, &socket.types)?);
    }
    if !sockets.is_empty() {
        allow_at(list("sockets"), Effect::Sockets(sockets));
    }
    Ok(allowed)
}

/// The `sockets` map keys of sockets of `family` and `types` (every type when empty), found at
/// `field`.
fn socket_keys(
    source: &dyn Display,
    field: &str,
    family: &str,
    types: &[String],
) -> Result<Vec<(u32, u32)>, PolicyError> {
    let family = family_number(family)
        .filter(|family| *family < MAX_FAMILY)
        .ok_or_else(|| {
            PolicyError::new(
                source,
                format!("{field}.family"),
                format!("unknown address family \"{family}\""),
            )
        })?;
    let types = parse_each(source, &format!("{field}.types"), types, |kind| {
        socket_type_number(kind)
            .filter(|kind| (1..=SOCK_TYPE_MASK).contains(kind))
            .ok_or_else(|| format!("unknown socket type \"{kind}\""))
    })?;
    if types.is_empty() {
        return Ok(vec![(family, ANY_PROTOCOL)]);
    }
    Ok(types
        .iter()
        .map(|kind| (family, SOCKET_TYPE | kind))
        .collect())
}

/// Hours, minutes and seconds in that order, each optional ("90s", "15m", "1h30m"), from 1 s to
/// a week: what the resource's pattern and validation rule accept.
fn parse_duration(text: &str) -> Result<Duration, String> {
    const UNITS: [(char, u64); 3] = [('h', 3600), ('m', 60), ('s', 1)];
    let malformed = || {
        format!("\"{text}\": expected hours, minutes and seconds, as \"90s\", \"15m\" or \"1h30m\"")
    };
    let mut seconds: u64 = 0;
    let mut units = UNITS.iter();
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .ok_or_else(malformed)?;
        let unit = rest[digits..].chars().next().ok_or_else(malformed)?;
        let (_, scale) = units
            .find(|(name, _)| *name == unit)
            .ok_or_else(malformed)?;
        let value: u64 = rest[..digits].parse().map_err(|_| malformed())?;
        seconds = value
            .checked_mul(*scale)
            .and_then(|part| seconds.checked_add(part))
            .ok_or_else(malformed)?;
        rest = &rest[digits + 1..];
    }
    let duration = Duration::from_secs(seconds);
    if text.is_empty() || duration < Duration::from_secs(1) || duration > LONGEST_MODELING {
        return Err(format!("\"{text}\": must be from 1s to 168h (a week)"));
    }
    Ok(duration)
}

/// The tries' glob masks have a bit for each of a policy's `**` patterns.
fn check_globs(source: &dyn Display, rules: &[Rule]) -> Result<(), PolicyError> {
    let mut globs = 0;
    for rule in rules {
        let own = rule
            .effects
            .iter()
            .map(|effect| (rule.field.as_str(), ".paths", effect));
        // A DefenseInDepth rule's allowances are named by the lists they came from.
        let allowed = rule.effects.iter().flat_map(|effect| match effect {
            Effect::Allow(allowed) => allowed.as_slice(),
            _ => &[],
        });
        let allowed = allowed.map(|allowance| (allowance.field.as_str(), "", &allowance.effect));
        for (field, list, effect) in own.chain(allowed) {
            let Effect::Paths { patterns, .. } = effect else {
                continue;
            };
            for (index, pattern) in patterns.iter().enumerate() {
                if !matches!(pattern, Pattern::Glob { .. }) {
                    continue;
                }
                if globs == MAX_GLOBS {
                    return Err(PolicyError::new(
                        source,
                        format!("{field}{list}[{index}]"),
                        format!(
                            "a policy may hold at most {MAX_GLOBS} \"**\" patterns, built-in \
                             rules included"
                        ),
                    ));
                }
                globs += 1;
            }
        }
    }
    Ok(())
}

/// The rules a policy's mode and lists stand for.
fn listed_rules(
    source: &dyn Display,
    policy: &Policy,
    env: &Environment,
) -> Result<Vec<Rule>, PolicyError> {
    let runtime_default = || Rule {
        field: "spec.mode".to_owned(),
        name: "runtime-default".to_owned(),
        action: Action::Deny,
        effects: catalog::runtime_default(),
    };
    let enhance = match (policy.spec.mode, &policy.spec.enhance_protect) {
        (Mode::EnhanceProtect, enhance) => enhance.clone().unwrap_or_default(),
        (Mode::DefenseInDepth, Some(enhance)) => enhance.clone(),
        (mode, Some(_)) => {
            return Err(PolicyError::new(
                source,
                ENHANCE_PROTECT,
                format!("only allowed with mode EnhanceProtect or DefenseInDepth, not {mode:?}"),
            ));
        }
        (Mode::AlwaysAllow | Mode::BehaviorModeling | Mode::DefenseInDepth, None) => {
            return Ok(Vec::new());
        }
        (Mode::RuntimeDefault, None) => return Ok(vec![runtime_default()]),
    };
    let mut rules = Vec::new();
    if !enhance.privileged {
        rules.push(runtime_default());
    }
    let listed = built_in_names(source, &enhance)?;
    let known = catalog::known_names();
    for (category, field, name) in &listed {
        let error = |reason: String| PolicyError::new(source, field, reason);
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
        if belongs != Some(*category) {
            let list = belongs.map_or("another list", Category::field);
            return Err(error(format!("\"{name}\" belongs in {list}")));
        }
        rules.push(Rule {
            field: field.clone(),
            name: (*name).to_owned(),
            action: if enhance.audit_rules.iter().any(|audited| audited == name) {
                Action::Audit
            } else {
                Action::Deny
            },
            effects,
        });
    }
    for (index, name) in enhance.audit_rules.iter().enumerate() {
        if !listed.iter().any(|(_, _, listed)| listed == name) {
            return Err(PolicyError::new(
                source,
                format!("{ENHANCE_PROTECT}.auditRules[{index}]"),
                format!(
                    "\"{name}\" is not listed in hardeningRules, attackProtectionRules or vulMitigationRules"
                ),
            ));
        }
    }
    let base = format!("{ENHANCE_PROTECT}.customRules");
    custom_rules(source, &enhance.custom_rules, &base, "", &mut rules)?;
    Ok(rules)
}

/// Whether `spec` lists built-in rule `name` (a list it cannot read counts: the caller compiles
/// again and reports the error).
pub fn lists_built_in(spec: &PolicySpec, name: &str) -> bool {
    spec.enhance_protect
        .as_ref()
        .is_some_and(|enhance| match built_in_names(&"", enhance) {
            Ok(listed) => listed.iter().any(|(_, _, listed)| *listed == name),
            Err(_) => true,
        })
}

/// The built-in rules `enhance` lists, each with its list and the field it is at. vArmor's
/// `attackProtectionRules` items give their rules; one with `targets` is refused.
fn built_in_names<'a>(
    source: &dyn Display,
    enhance: &'a EnhanceProtect,
) -> Result<Vec<(Category, String, &'a str)>, PolicyError> {
    let each = |category: Category, field: String, names: &'a [String]| {
        names
            .iter()
            .enumerate()
            .map(move |(index, name)| (category, format!("{field}[{index}]"), name.as_str()))
    };
    let field = |category: Category| format!("{ENHANCE_PROTECT}.{}", category.field());
    let mut listed: Vec<_> = each(
        Category::Hardening,
        field(Category::Hardening),
        &enhance.hardening_rules,
    )
    .collect();
    let attack = Category::AttackProtection;
    for (index, item) in enhance.attack_protection_rules.iter().enumerate() {
        let item_field = format!("{}[{index}]", field(attack));
        match item {
            AttackProtection::Rule(name) => listed.push((attack, item_field, name.as_str())),
            AttackProtection::VArmor(VArmorRules { rules, targets }) => {
                if !targets.is_empty() {
                    return Err(PolicyError::new(
                        source,
                        format!("{item_field}.targets"),
                        "rules for some programs only are not supported: Palisade's rules apply \
                         to every process of the target (vArmor confines targets with AppArmor \
                         only; its BPF enforcer leaves such an item out). List the rules \
                         without targets, or leave the item out",
                    ));
                }
                listed.extend(each(attack, format!("{item_field}.rules"), rules));
            }
        }
    }
    listed.extend(each(
        Category::VulMitigation,
        field(Category::VulMitigation),
        &enhance.vul_mitigation_rules,
    ));
    Ok(listed)
}

/// Parses each of `items` (found at `field[i]`), or names the first that does not parse.
fn parse_each<T, U>(
    source: &dyn Display,
    field: &str,
    items: &[T],
    parse: impl Fn(&T) -> Result<U, String>,
) -> Result<Vec<U>, PolicyError> {
    items
        .iter()
        .enumerate()
        .map(|(index, item)| {
            parse(item)
                .map_err(|reason| PolicyError::new(source, format!("{field}[{index}]"), reason))
        })
        .collect()
}

/// The patterns of a file or exec rule found at `field`.
fn path_patterns(
    source: &dyn Display,
    field: &str,
    paths: &[String],
) -> Result<Vec<Pattern>, PolicyError> {
    if paths.is_empty() {
        return Err(PolicyError::new(
            source,
            format!("{field}.paths"),
            "must list at least one path",
        ));
    }
    parse_each(source, &format!("{field}.paths"), paths, |path| {
        Pattern::parse(path)
    })
}

/// The effect of a network rule (or allowance) found at `field`.
fn network_effect(
    source: &dyn Display,
    field: &str,
    addresses: &[String],
    ports: &[PortRange],
    protocols: &[Protocol],
) -> Result<Effect, PolicyError> {
    let ranges = parse_each(
        source,
        &format!("{field}.ports"),
        ports,
        |port| match port {
            PortRange::Port(0) => Err("0 is not a port".to_owned()),
            PortRange::Port(port) => Ok((*port, *port)),
            PortRange::Range(range) => parse_port_range(range),
        },
    )?;
    let blocks = parse_each(
        source,
        &format!("{field}.addresses"),
        addresses,
        |address| AddressBlock::parse(address),
    )?;
    let port_count: u32 = ranges
        .iter()
        .map(|(low, high)| u32::from(high - low) + 1)
        .sum();
    if port_count > MAX_PORTS_PER_RULE {
        return Err(PolicyError::new(
            source,
            format!("{field}.ports"),
            format!("may cover at most {MAX_PORTS_PER_RULE} ports, not {port_count}"),
        ));
    }
    if !ranges.is_empty() && protocols.contains(&Protocol::Icmp) {
        return Err(PolicyError::new(
            source,
            format!("{field}.ports"),
            "ICMP has no ports",
        ));
    }
    Ok(Effect::Network {
        blocks,
        ports: ranges.iter().flat_map(|(low, high)| *low..=*high).collect(),
        protocols: protocols
            .iter()
            .map(|protocol| ip_protocol(*protocol))
            .collect(),
    })
}

/// The IP protocol number network rules mean by `protocol` (the kernel matches ICMPv6 as ICMP).
pub fn ip_protocol(protocol: Protocol) -> u8 {
    match protocol {
        Protocol::Tcp => libc::IPPROTO_TCP as u8,
        Protocol::Udp => libc::IPPROTO_UDP as u8,
        Protocol::Icmp => libc::IPPROTO_ICMP as u8,
    }
}

/// The effect of a mount rule found at `field`: every mount, or mounts of the types it lists.
fn mount_effect(
    source: &dyn Display,
    field: &str,
    fs_types: &[String],
) -> Result<Effect, PolicyError> {
    if fs_types.is_empty() {
        return Ok(Effect::Switch(Switch::Mount));
    }
    self::fs_types(source, &format!("{field}.fsTypes"), fs_types).map(Effect::MountTypes)
}

/// The file system type names of the list at `field`.
fn fs_types(
    source: &dyn Display,
    field: &str,
    names: &[String],
) -> Result<Vec<String>, PolicyError> {
    let longest = FS_TYPE_LEN as usize - 1;
    parse_each(source, field, names, |fs_type| {
        if fs_type.is_empty() || fs_type.len() > longest {
            return Err(format!(
                "\"{fs_type}\" is not a file system type (1 to {longest} bytes)"
            ));
        }
        Ok(fs_type.clone())
    })
}

/// The capability mask of a capability rule found at `field`: every capability named, less
/// those named with a leading "-".
fn capability_mask(
    source: &dyn Display,
    field: &str,
    names: &[String],
) -> Result<u64, PolicyError> {
    let (mut included, mut excluded) = (0u64, 0u64);
    for (index, name) in names.iter().enumerate() {
        let (set, name) = match name.strip_prefix('-') {
            Some(name) => (&mut excluded, name),
            None => (&mut included, name.as_str()),
        };
        *set |= match name {
            "all" => catalog::ALL_CAPS,
            name => {
                1 << catalog::capability(name).ok_or_else(|| {
                    PolicyError::new(
                        source,
                        format!("{field}.capabilities[{index}]"),
                        format!("unknown capability \"{name}\""),
                    )
                })?
            }
        };
    }
    let mask = included & !excluded;
    if mask == 0 {
        return Err(PolicyError::new(
            source,
            format!("{field}.capabilities"),
            "must list at least one capability",
        ));
    }
    Ok(mask)
}

/// Adds the rules of `custom`, found at the field `base`, their names prefixed with `prefix`.
fn custom_rules(
    source: &dyn Display,
    custom: &CustomRules,
    base: &str,
    prefix: &str,
    rules: &mut Vec<Rule>,
) -> Result<(), PolicyError> {
    let mut push =
        |field: String, kind: &str, index: usize, name: &Option<String>, action, effect| {
            let name = name
                .clone()
                .unwrap_or_else(|| format!("customRules.{kind}[{index}]"));
            rules.push(Rule {
                name: format!("{prefix}{name}"),
                field,
                action,
                effects: vec![effect],
            });
        };
    let field = |kind: &str, index: usize| format!("{base}.{kind}[{index}]");
    for (index, rule) in custom.files.iter().enumerate() {
        let field = field("files", index);
        if rule.permissions.is_empty() {
            return Err(PolicyError::new(
                source,
                format!("{field}.permissions"),
                "must list at least one permission",
            ));
        }
        let effect = Effect::Paths {
            patterns: path_patterns(source, &field, &rule.paths)?,
            perms: kernel_perms(&rule.permissions),
        };
        push(field, "files", index, &rule.name, rule.action, effect);
    }
    for (index, rule) in custom.exec.iter().enumerate() {
        let field = field("exec", index);
        let effect = Effect::Paths {
            patterns: path_patterns(source, &field, &rule.paths)?,
            perms: EXEC_RULE_PERMS,
        };
        push(field, "exec", index, &rule.name, rule.action, effect);
    }
    for (index, rule) in custom.network.iter().enumerate() {
        let field = field("network", index);
        let effect = network_effect(
            source,
            &field,
            &rule.addresses,
            &rule.ports,
            &rule.protocols,
        )?;
        push(field, "network", index, &rule.name, rule.action, effect);
    }
    for (index, rule) in custom.mount.iter().enumerate() {
        let field = field("mount", index);
        let effect = mount_effect(source, &field, &rule.fs_types)?;
        push(field, "mount", index, &rule.name, rule.action, effect);
    }
    for (index, rule) in custom.capabilities.iter().enumerate() {
        let field = field("capabilities", index);
        let mask = capability_mask(source, &field, &rule.capabilities)?;
        let effect = Effect::Capabilities(mask);
        push(
            field,
            "capabilities",
            index,
            &rule.name,
            rule.action,
            effect,
        );
    }
    for (index, rule) in custom.sockets.iter().enumerate() {
        let field = field("sockets", index);
        let effect = Effect::Sockets(socket_keys(source, &field, &rule.family, &rule.types)?);
        push(field, "sockets", index, &rule.name, rule.action, effect);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::{collections::HashMap, path::Path};

    use super::*;
    use crate::policy::{
        compile,
        compile::testing::{parse, with_rules, with_spec},
    };

    #[test]
    fn invalid_policies_name_file_field_and_reason() {
        let cases = [
            (
                with_rules("    filez: []\n"),
                "p.yaml: spec.enhanceProtect.customRules: unknown field `filez`, expected one of `files`, `exec`, `network`, `mount`, `capabilities`, `sockets` at line 10 column 7",
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
    fn modeling_durations_are_hours_minutes_and_seconds_up_to_a_week() {
        for (text, seconds) in [
            ("1s", 1),
            ("90s", 90),
            ("15m", 900),
            ("1h30m", 5400),
            ("168h", 604_800),
            ("2h0m5s", 7205),
        ] {
            assert_eq!(
                parse_duration(text),
                Ok(Duration::from_secs(seconds)),
                "{text}"
            );
        }
        for text in [
            "",
            "0s",
            "169h",
            "5",
            "1m1h",
            "1d",
            "h",
            "1h 5m",
            "99999999999999999999h",
        ] {
            assert!(parse_duration(text).is_err(), "{text}");
        }
    }

    #[test]
    fn behavior_modeling_goes_with_its_duration() {
        let error = |spec: &str| parse(&with_spec(spec)).unwrap_err().to_string();
        assert_eq!(
            error("  mode: BehaviorModeling\n"),
            "p.yaml: spec.behaviorModeling: mode BehaviorModeling needs its duration"
        );
        assert_eq!(
            error("  mode: AlwaysAllow\n  behaviorModeling: {duration: 5m}\n"),
            "p.yaml: spec.behaviorModeling: only allowed with mode BehaviorModeling, not AlwaysAllow"
        );
        assert_eq!(
            error("  mode: BehaviorModeling\n  behaviorModeling: {duration: 2w}\n"),
            "p.yaml: spec.behaviorModeling.duration: \"2w\": expected hours, minutes and seconds, as \"90s\", \"15m\" or \"1h30m\""
        );
        assert_eq!(
            error("  mode: BehaviorModeling\n  behaviorModeling: {duration: 200h}\n"),
            "p.yaml: spec.behaviorModeling.duration: \"200h\": must be from 1s to 168h (a week)"
        );
    }

    #[test]
    fn defense_in_depth_allowances_are_checked() {
        let error = |spec: &str| parse(&with_spec(spec)).unwrap_err().to_string();
        let allowing = |allow: &str| {
            error(&format!(
                "  mode: DefenseInDepth\n  defenseInDepth:\n    allow: {allow}\n"
            ))
        };
        assert_eq!(
            error("  mode: DefenseInDepth\n"),
            "p.yaml: spec.defenseInDepth: mode DefenseInDepth needs defenseInDepth (what the target may do)"
        );
        assert_eq!(
            error("  mode: AlwaysAllow\n  defenseInDepth: {allow: {}}\n"),
            "p.yaml: spec.defenseInDepth: only allowed with mode DefenseInDepth, not AlwaysAllow"
        );
        assert!(allowing("{files: [{paths: [/a]}]}").contains("missing field `permissions`"));
        assert_eq!(
            allowing("{files: [{paths: [/a], permissions: []}]}"),
            "p.yaml: spec.defenseInDepth.allow.files[0].permissions: must list at least one permission"
        );
        assert_eq!(
            allowing("{exec: [/bin/sh, bin/ls]}"),
            "p.yaml: spec.defenseInDepth.allow.exec[1]: \"bin/ls\" is not an absolute path"
        );
        assert_eq!(
            allowing("{capabilities: [CAP_NET_RAW, CAP_FLY]}"),
            "p.yaml: spec.defenseInDepth.allow.capabilities[1]: unknown capability \"CAP_FLY\""
        );
        assert_eq!(
            allowing("{network: [{ports: [0]}]}"),
            "p.yaml: spec.defenseInDepth.allow.network[0].ports[0]: 0 is not a port"
        );
        assert_eq!(
            allowing("{mount: [tmpfs, \"\"]}"),
            "p.yaml: spec.defenseInDepth.allow.mount[1]: \"\" is not a file system type (1 to 15 bytes)"
        );
        assert_eq!(
            allowing("{sockets: [{family: inet7}]}"),
            "p.yaml: spec.defenseInDepth.allow.sockets[0].family: unknown address family \"inet7\""
        );
        assert_eq!(
            allowing("{sockets: [{family: inet, types: [stream, river]}]}"),
            "p.yaml: spec.defenseInDepth.allow.sockets[0].types[1]: unknown socket type \"river\""
        );
        assert_eq!(
            allowing("{unixSockets: [\"/run/a**b**c\"]}"),
            parse(&with_rules("    files:\n      - paths: [\"/run/a**b**c\"]\n        permissions: [read]\n        action: deny\n"))
                .unwrap_err()
                .to_string()
                .replace("spec.enhanceProtect.customRules.files[0].paths[0]", "spec.defenseInDepth.allow.unixSockets[0]"),
        );
    }

    #[test]
    fn an_allowlist_counts_towards_the_globs_limit() {
        let paths: Vec<String> = (0..65).map(|i| format!("/proc/**/f{i}")).collect();
        let text = with_spec(&format!(
            "  mode: DefenseInDepth\n  defenseInDepth:\n    allow:\n      files: [{{paths: [{}], permissions: [read]}}]\n",
            paths.join(", ")
        ));
        assert_eq!(
            parse(&text).unwrap_err().to_string(),
            format!(
                "p.yaml: spec.defenseInDepth.allow.files[0].paths[64]: a policy may hold at \
                 most {MAX_GLOBS} \"**\" patterns, built-in rules included"
            )
        );
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
            error("vulMitigationRules", "ingress-nightmare-mitigation"),
            "p.yaml: spec.enhanceProtect.vulMitigationRules[0]: \"ingress-nightmare-mitigation\": the addresses of the ingress-nginx admission webhook (Service ingress-nginx/ingress-nginx-controller-admission and kube-system/ingress-nginx-controller-admission) are not known: the agent in Kubernetes mode finds them once it can list those Services (policy files cannot use this rule)"
        );
        assert!(
            error("vulMitigationRules", "dirty-pipe-mitigation").starts_with(
                "p.yaml: spec.enhanceProtect.vulMitigationRules[0]: \"dirty-pipe-mitigation\": vArmor enforces this rule with seccomp"
            )
        );
        assert_eq!(
            parse(&with_spec("  mode: RuntimeDefault\n  enhanceProtect: {}\n"))
                .unwrap_err()
                .to_string(),
            "p.yaml: spec.enhanceProtect: only allowed with mode EnhanceProtect or DefenseInDepth, not RuntimeDefault"
        );
    }

    #[test]
    fn custom_socket_rules_by_family_and_type() {
        let policy = parse(&with_rules(
            "    sockets:\n      - {family: packet, action: deny}\n      - {family: inet, types: [raw, dgram], action: audit}\n",
        ))
        .unwrap();
        let verdict = |action, rule_id| palisade_common::Verdict { action, rule_id };
        let (deny, audit) = (palisade_common::ACTION_DENY, palisade_common::ACTION_AUDIT);
        let kind = |kind: i32| SOCKET_TYPE | kind as u32;
        assert_eq!(
            policy.entries().sockets,
            [
                (
                    (libc::AF_INET as u32, kind(libc::SOCK_DGRAM)),
                    verdict(audit, 2)
                ),
                (
                    (libc::AF_INET as u32, kind(libc::SOCK_RAW)),
                    verdict(audit, 2)
                ),
                ((libc::AF_PACKET as u32, ANY_PROTOCOL), verdict(deny, 1)),
            ]
        );
        assert_eq!(
            parse(&with_rules(
                "    sockets:\n      - {family: inet, types: [rawr], action: deny}\n"
            ))
            .unwrap_err()
            .to_string(),
            "p.yaml: spec.enhanceProtect.customRules.sockets[0].types[0]: unknown socket type \"rawr\""
        );
    }

    #[test]
    fn varmor_attack_protection_items_are_rules_without_targets() {
        let enhance = |lists: &str| {
            with_spec(&format!(
                "  mode: EnhanceProtect\n  enhanceProtect:\n{lists}    auditRules: [mitigate-sa-leak]\n"
            ))
        };
        let flat = parse(&enhance(
            "    attackProtectionRules: [disable-shell, mitigate-sa-leak]\n",
        ))
        .unwrap();
        let varmor = parse(&enhance(
            "    attackProtectionRules:\n      - rules: [disable-shell]\n      - rules: [mitigate-sa-leak]\n        targets: []\n",
        ))
        .unwrap();
        assert_eq!(varmor.rules(), flat.rules());
        assert_eq!(varmor.entries(), flat.entries());
        let error = |items: &str| {
            parse(&enhance(&format!("    attackProtectionRules:\n{items}")))
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            error(
                "      - disable-shell\n      - rules: [mitigate-sa-leak]\n        targets: [/bin/bash]\n"
            ),
            "p.yaml: spec.enhanceProtect.attackProtectionRules[1].targets: rules for some programs only are not supported: Palisade's rules apply to every process of the target (vArmor confines targets with AppArmor only; its BPF enforcer leaves such an item out). List the rules without targets, or leave the item out"
        );
        assert_eq!(
            error("      - rules: [mitigate-sa-leak, disable-shel]\n"),
            "p.yaml: spec.enhanceProtect.attackProtectionRules[0].rules[1]: unknown built-in rule \"disable-shel\" (did you mean \"disable-shell\"?)"
        );
        assert!(
            error("      - rulez: [mitigate-sa-leak]\n")
                .starts_with("p.yaml: spec.enhanceProtect.attackProtectionRules[0]: unknown field `rulez`, expected `rules` or `targets`"),
        );
        assert!(
            error("      - 7\n").contains("expected a built-in rule's name or {rules, targets}"),
        );
    }

    #[test]
    fn which_policies_list_a_built_in_rule() {
        let lists = |spec: &str| {
            let policy = Policy::parse(Path::new("p.yaml"), &with_spec(spec)).unwrap();
            lists_built_in(&policy.spec, "disable-shell")
        };
        assert!(lists(
            "  mode: EnhanceProtect\n  enhanceProtect:\n    attackProtectionRules: [disable-shell]\n"
        ));
        assert!(lists(
            "  mode: EnhanceProtect\n  enhanceProtect:\n    attackProtectionRules:\n      - rules: [disable-shell]\n"
        ));
        assert!(!lists(
            "  mode: EnhanceProtect\n  enhanceProtect:\n    attackProtectionRules: [disable-wget]\n"
        ));
        assert!(!lists("  mode: RuntimeDefault\n"));
        // One it cannot read: compiled again, to report why.
        assert!(lists(
            "  mode: EnhanceProtect\n  enhanceProtect:\n    attackProtectionRules:\n      - {rules: [disable-wget], targets: [/bin/sh]}\n"
        ));
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
            ingress_admission: Some(catalog::ServiceDestinations {
                services: vec!["kube-system/ingress-nginx-controller-admission".into()],
                cluster_ips: vec!["10.96.0.20".into()],
                endpoints: Vec::new(),
            }),
            ..Environment::default()
        };
        let policy = compile(
            &file.display(),
            &Policy::parse(file, &with_spec(&spec)).unwrap(),
            &env,
            &[],
        )
        .unwrap();
        assert_eq!(policy.rules().len(), catalog::known_names().len() + 1);
        assert!(policy.entries().globs.len() <= MAX_GLOBS as usize);
    }

    #[test]
    fn invalid_network_and_capability_rules_name_the_field() {
        let error = parse(&with_rules(
            "    network:\n      - addresses: [10.0.0.1/8]\n        action: deny\n",
        ))
        .unwrap_err();
        assert_eq!(
            error.to_string(),
            "p.yaml: spec.enhanceProtect.customRules.network[0].addresses[0]: \"10.0.0.1/8\" has bits set beyond its prefix length"
        );
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

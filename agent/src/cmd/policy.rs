//! `palisade policy compile FILE` (the map entries a policy compiles to), `policy test DIR` (a
//! rule module against its fixtures) and `policy replay` (a candidate policy over recorded
//! events).

use std::{io::Write, net::Ipv6Addr, path::Path};

use palisade_common::{
    ACTION_ALLOW, ACTION_AUDIT, ACTION_DENY, DEFAULT_CAPABILITIES, DEFAULT_MOUNT, DEFAULT_NETWORK,
    DEFAULT_SOCKETS, PathVerdict, SOCKET_TYPE, Verdict,
};

use crate::{
    policy::{
        CAPABILITIES, CompiledPolicy, Environment, PERMISSION_NAMES, Policy, PolicyError,
        permission_names,
    },
    rules::{RuleHost, compile_policy},
};

/// Reads and compiles the policy `file`, running its rule modules in `host`.
pub fn load_and_compile(
    host: &RuleHost,
    file: &Path,
) -> Result<(Policy, CompiledPolicy), PolicyError> {
    let policy = Policy::load(file)?;
    let compiled = compile_policy(
        host,
        &file.display(),
        file.parent().unwrap_or(Path::new(".")),
        &policy,
        &Environment::from_process(),
    )?;
    Ok((policy, compiled))
}

/// An action's bits by name, as "deny+audit"; an entry of a DefenseInDepth policy may add
/// "allow".
fn action_name(action: u32) -> String {
    let names: Vec<&str> = [
        (ACTION_DENY, "deny"),
        (ACTION_AUDIT, "audit"),
        (ACTION_ALLOW, "allow"),
    ]
    .into_iter()
    .filter(|(bit, _)| action & bit != 0)
    .map(|(_, name)| name)
    .collect();
    if names.is_empty() {
        "none".to_owned()
    } else {
        names.join("+")
    }
}

fn verdict(verdict: &Verdict) -> String {
    format!("{}(rule {})", action_name(verdict.action), verdict.rule_id)
}

fn path_verdict_text(path_verdict: &PathVerdict) -> String {
    let mut parts: Vec<String> = PERMISSION_NAMES
        .iter()
        .enumerate()
        .filter(|(i, _)| path_verdict.action[*i] != 0)
        .map(|(i, name)| {
            format!(
                "{name}={}",
                verdict(&Verdict {
                    action: path_verdict.action[i],
                    rule_id: path_verdict.rule_id[i]
                })
            )
        })
        .collect();
    if path_verdict.glob_mask != 0 {
        parts.push(format!("globs={:#x}", path_verdict.glob_mask));
    }
    parts.join(" ")
}

fn escaped(key: &[u8]) -> String {
    key.escape_ascii().to_string()
}

pub fn print(compiled: &CompiledPolicy, out: &mut impl Write) -> std::io::Result<()> {
    writeln!(
        out,
        "policy \"{}\": {} rules, {} prefix entries, {} suffix entries, {} globs, {} mount types, \
         {} socket entries, {} network entries",
        compiled.name(),
        compiled.rules().len(),
        compiled.entries().prefixes.len(),
        compiled.entries().suffixes.len(),
        compiled.entries().globs.len(),
        compiled.entries().mount_types.len(),
        compiled.entries().sockets.len(),
        compiled.entries().network.len(),
    )?;
    for (index, rule) in compiled.rules().iter().enumerate() {
        writeln!(
            out,
            "rule {} \"{}\": {}",
            index + 1,
            rule.name,
            rule.action.name()
        )?;
    }
    let switches = &compiled.entries().switches;
    if switches.defaults != 0 {
        let mut denied = permission_names(switches.defaults).to_vec();
        for (bit, name) in [
            (DEFAULT_CAPABILITIES, "capabilities"),
            (DEFAULT_NETWORK, "network"),
            (DEFAULT_SOCKETS, "sockets"),
            (DEFAULT_MOUNT, "mount"),
        ] {
            if switches.defaults & bit != 0 {
                denied.push(name);
            }
        }
        writeln!(
            out,
            "denied unless allowed: {}: {}",
            denied.join(","),
            verdict(&switches.default_deny)
        )?;
    }
    for (cap, name) in CAPABILITIES.iter().enumerate() {
        if switches.capability[cap].action != 0 {
            writeln!(
                out,
                "capability {name}: {}",
                verdict(&switches.capability[cap])
            )?;
        }
    }
    let named = [
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
    ];
    for (name, switch) in named {
        if switch.action != 0 {
            writeln!(out, "{name}: {}", verdict(switch))?;
        }
    }
    for (fs_type, rule) in &compiled.entries().mount_types {
        let end = fs_type
            .iter()
            .position(|b| *b == 0)
            .unwrap_or(fs_type.len());
        writeln!(
            out,
            "mount_types \"{}\": {}",
            escaped(&fs_type[..end]),
            verdict(rule)
        )?;
    }
    for ((family, protocol), rule) in &compiled.entries().sockets {
        let protocol = match *protocol {
            palisade_common::ANY_PROTOCOL => "protocol any".to_owned(),
            protocol if protocol & SOCKET_TYPE != 0 => format!("type {}", protocol & !SOCKET_TYPE),
            protocol => format!("protocol {protocol}"),
        };
        writeln!(out, "sockets family {family} {protocol}: {}", verdict(rule))?;
    }
    for entry in &compiled.entries().network {
        let address = Ipv6Addr::from(entry.block.addr);
        let address = match address.to_ipv4_mapped() {
            Some(v4) if entry.block.bits >= 96 => format!("{v4}/{}", entry.block.bits - 96),
            _ => format!("{address}/{}", entry.block.bits),
        };
        writeln!(
            out,
            "network {address} protocol {} port {}: {}",
            entry.protocol,
            entry.port,
            verdict(&entry.verdict)
        )?;
    }
    for entry in &compiled.entries().prefixes {
        writeln!(
            out,
            "path_prefixes \"{}\": {}",
            escaped(&entry.key),
            path_verdict_text(&entry.verdict)
        )?;
    }
    for entry in &compiled.entries().suffixes {
        writeln!(
            out,
            "path_suffixes (reversed) \"{}\": {}",
            escaped(&entry.key),
            path_verdict_text(&entry.verdict)
        )?;
    }
    for (index, glob) in compiled.entries().globs.iter().enumerate() {
        let perms = permission_names(glob.perms);
        writeln!(
            out,
            "globs[{index}]: {} {} (rule {}), paths of at least {} bytes",
            action_name(glob.action),
            perms.join(","),
            glob.rule_id,
            glob.min_len
        )?;
    }
    Ok(())
}

/// `palisade policy test DIR`: runs the built rule module (`--module FILE`, or DIR's crate built
/// now) on the fixtures in DIR/fixtures (or DIR), in the agent's sandbox. Returns whether every
/// fixture passed.
pub fn test(dir: &Path, module: Option<&Path>, out: &mut impl Write) -> anyhow::Result<bool> {
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
    let mut failed = 0;
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
        match mismatch {
            None => writeln!(out, "ok      {name}")?,
            Some(mismatch) => {
                failed += 1;
                writeln!(out, "FAILED  {name}: {mismatch}")?;
            }
        }
    }
    writeln!(
        out,
        "{} passed, {failed} failed ({}, sha256 {})",
        fixtures.len() - failed,
        module.display(),
        loaded.digest
    )?;
    Ok(failed == 0)
}

/// `palisade policy replay --events FILE --policy FILE`: which recorded events the candidate
/// policy would have denied or audited, per rule.
pub fn replay(events: &Path, policy_file: &Path, out: &mut impl Write) -> anyhow::Result<()> {
    use std::collections::BTreeMap;

    let host = RuleHost::new(None)?;
    let (_, candidate) = load_and_compile(&host, policy_file)?;
    let text = std::fs::read_to_string(events)
        .map_err(|err| anyhow::anyhow!("reading {}: {err}", events.display()))?;
    // rule -> (denied, audited, an example)
    let mut by_rule: BTreeMap<String, (u64, u64, String)> = BTreeMap::new();
    let (mut replayed, mut unmatched) = (0u64, 0u64);
    let mut not_replayable: BTreeMap<String, u64> = BTreeMap::new();
    for (number, line) in text.lines().enumerate() {
        let event: serde_json::Value = serde_json::from_str(line).map_err(|err| {
            anyhow::anyhow!("{}:{}: not an event: {err}", events.display(), number + 1)
        })?;
        let Some(verdict) = crate::policy::decide_event(&candidate, &event) else {
            let hook = event["hook"].as_str().unwrap_or("unknown").to_owned();
            *not_replayable.entry(hook).or_default() += 1;
            continue;
        };
        replayed += 1;
        if verdict.action == 0 {
            unmatched += 1;
            continue;
        }
        let rule = candidate
            .rule_name(verdict.rule_id)
            .unwrap_or("unknown")
            .to_owned();
        let entry = by_rule.entry(rule).or_insert_with(|| {
            let what = ["path", "capability", "fs_type"]
                .iter()
                .find_map(|field| event[field].as_str().filter(|value| !value.is_empty()))
                .map(str::to_owned)
                .or_else(|| event["socket"]["address"].as_str().map(str::to_owned))
                .unwrap_or_default();
            (
                0,
                0,
                format!(
                    "{} {} {what}",
                    event["comm"].as_str().unwrap_or(""),
                    event["hook"].as_str().unwrap_or("")
                ),
            )
        });
        if verdict.action & ACTION_DENY != 0 {
            entry.0 += 1;
        } else {
            entry.1 += 1;
        }
    }
    writeln!(
        out,
        "policy \"{}\" over {}: {replayed} events replayed, {} not replayable, {unmatched} matched no rule",
        candidate.name(),
        events.display(),
        not_replayable.values().sum::<u64>(),
    )?;
    writeln!(out, "WOULD DENY  WOULD AUDIT  RULE  (example)")?;
    for (rule, (denied, audited, example)) in &by_rule {
        writeln!(out, "{denied:>10}  {audited:>11}  {rule}  ({example})")?;
    }
    for (hook, count) in &not_replayable {
        writeln!(out, "not replayable: {count} {hook} events")?;
    }
    Ok(())
}

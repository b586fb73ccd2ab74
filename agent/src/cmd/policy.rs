//! `palisade policy compile FILE`: the map entries a policy compiles to.

use std::{io::Write, net::Ipv6Addr, path::Path};

use palisade_common::{ACTION_AUDIT, ACTION_DENY, PERM_COUNT, PathVerdict, Verdict};

use crate::{
    policy::{CAPABILITIES, CompiledPolicy, Environment, Policy, PolicyError},
    rules::{RuleHost, compile_policy},
};

/// Reads and compiles the policy `file`, running its rule modules in `host`.
pub fn load_and_compile(
    host: &RuleHost,
    file: &Path,
) -> Result<(Policy, CompiledPolicy), PolicyError> {
    let policy = Policy::load(file)?;
    let compiled = compile_policy(host, file, &policy, &Environment::from_process())?;
    Ok((policy, compiled))
}

const PERM_NAMES: [&str; PERM_COUNT as usize] = ["read", "write", "append", "exec", "connect"];

fn action_name(action: u32) -> &'static str {
    match action {
        a if a == ACTION_DENY | ACTION_AUDIT => "deny+audit",
        ACTION_DENY => "deny",
        ACTION_AUDIT => "audit",
        _ => "none",
    }
}

fn verdict(verdict: &Verdict) -> String {
    format!("{}(rule {})", action_name(verdict.action), verdict.rule_id)
}

fn path_verdict_text(path_verdict: &PathVerdict) -> String {
    let mut parts: Vec<String> = PERM_NAMES
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
        compiled.name,
        compiled.rules.len(),
        compiled.prefixes.len(),
        compiled.suffixes.len(),
        compiled.globs.len(),
        compiled.mount_types.len(),
        compiled.sockets.len(),
        compiled.network.len(),
    )?;
    for (index, rule) in compiled.rules.iter().enumerate() {
        writeln!(
            out,
            "rule {} \"{}\": {:?}",
            index + 1,
            rule.name,
            rule.action
        )?;
    }
    let switches = &compiled.switches;
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
    for (fs_type, rule) in &compiled.mount_types {
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
    for ((family, protocol), rule) in &compiled.sockets {
        let protocol = match *protocol {
            palisade_common::ANY_PROTOCOL => "any".to_owned(),
            protocol => protocol.to_string(),
        };
        writeln!(
            out,
            "sockets family {family} protocol {protocol}: {}",
            verdict(rule)
        )?;
    }
    for entry in &compiled.network {
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
    for entry in &compiled.prefixes {
        writeln!(
            out,
            "path_prefixes \"{}\": {}",
            escaped(&entry.key),
            path_verdict_text(&entry.verdict)
        )?;
    }
    for entry in &compiled.suffixes {
        writeln!(
            out,
            "path_suffixes (reversed) \"{}\": {}",
            escaped(&entry.key),
            path_verdict_text(&entry.verdict)
        )?;
    }
    for (index, glob) in compiled.globs.iter().enumerate() {
        let perms: Vec<&str> = PERM_NAMES
            .iter()
            .enumerate()
            .filter(|(i, _)| glob.perms & (1 << i) != 0)
            .map(|(_, n)| *n)
            .collect();
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

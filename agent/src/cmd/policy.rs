//! `palisade policy compile FILE`: the map entries a policy compiles to.

use std::{io::Write, path::Path};

use palisade_common::{ACTION_AUDIT, ACTION_DENY, PERM_COUNT, PathVerdict};

use crate::policy::{CompiledPolicy, Policy, PolicyError, compile};

pub fn load_and_compile(file: &Path) -> Result<(Policy, CompiledPolicy), PolicyError> {
    let policy = Policy::load(file)?;
    let compiled = compile(file, &policy)?;
    Ok((policy, compiled))
}

const PERM_NAMES: [&str; PERM_COUNT as usize] = ["read", "write", "append", "exec"];

fn action_name(action: u32) -> &'static str {
    match action {
        ACTION_DENY => "deny",
        ACTION_AUDIT => "audit",
        _ => "none",
    }
}

fn verdict_text(verdict: &PathVerdict) -> String {
    let mut parts: Vec<String> = PERM_NAMES
        .iter()
        .enumerate()
        .filter(|(i, _)| verdict.action[*i] != 0)
        .map(|(i, name)| {
            format!(
                "{name}={}(rule {})",
                action_name(verdict.action[i]),
                verdict.rule_id[i]
            )
        })
        .collect();
    if verdict.glob_mask != 0 {
        parts.push(format!("globs={:#x}", verdict.glob_mask));
    }
    parts.join(" ")
}

fn escaped(key: &[u8]) -> String {
    key.escape_ascii().to_string()
}

pub fn print(compiled: &CompiledPolicy, out: &mut impl Write) -> std::io::Result<()> {
    writeln!(
        out,
        "policy \"{}\": {} rules, {} prefix entries, {} suffix entries, {} globs",
        compiled.name,
        compiled.rules.len(),
        compiled.prefixes.len(),
        compiled.suffixes.len(),
        compiled.globs.len()
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
    for entry in &compiled.prefixes {
        writeln!(
            out,
            "path_prefixes \"{}\": {}",
            escaped(&entry.key),
            verdict_text(&entry.verdict)
        )?;
    }
    for entry in &compiled.suffixes {
        writeln!(
            out,
            "path_suffixes (reversed) \"{}\": {}",
            escaped(&entry.key),
            verdict_text(&entry.verdict)
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

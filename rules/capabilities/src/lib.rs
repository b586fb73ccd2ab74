//! The capability family of the built-in rules, as a rule module: the same names as in a
//! policy's `hardeningRules`, compiled to the same kernel entries.
//!
//! Config: `{"rules": ["disable-cap-sys-admin", {"name": "disable-cap-privileged", "action":
//! "audit"}]}` with `disable-cap-<name>`, `disable-cap-all`, `disable-cap-privileged` (every
//! capability containerd does not grant by default) and `disable-cap-all-except-net-bind-service`.

use palisade_rule_sdk::{Context, Entry, NamedRules, Rule};

/// What containerd grants by default.
const DEFAULT_CAPS: [&str; 14] = [
    "chown",
    "dac_override",
    "fowner",
    "fsetid",
    "kill",
    "setgid",
    "setuid",
    "setpcap",
    "net_bind_service",
    "net_raw",
    "sys_chroot",
    "mknod",
    "audit_write",
    "setfcap",
];

/// "all" with `except` taken out.
fn all_except(except: &[&str]) -> Vec<String> {
    std::iter::once("all".to_owned())
        .chain(except.iter().map(|name| format!("-{name}")))
        .collect()
}

fn capabilities(rule: &str) -> Result<Vec<String>, String> {
    Ok(match rule {
        "disable-cap-all" => vec!["all".to_owned()],
        "disable-cap-privileged" => all_except(&DEFAULT_CAPS),
        "disable-cap-all-except-net-bind-service" => all_except(&["net_bind_service"]),
        other => match other.strip_prefix("disable-cap-") {
            // The agent checks the name like any capability in a policy.
            Some(name) if !name.is_empty() => vec![name.replace('-', "_")],
            _ => return Err(format!("\"{other}\" is not a capability rule")),
        },
    })
}

struct Capabilities;

impl Rule for Capabilities {
    type Config = NamedRules;

    fn compile(config: NamedRules, _: &Context) -> Result<Vec<Entry>, String> {
        config.entries(|name, action| Ok(Entry::capabilities(name, capabilities(name)?, action)))
    }
}

palisade_rule_sdk::rule!(Capabilities);

palisade_rule_sdk::fixture_test!(Capabilities);

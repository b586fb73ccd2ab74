//! How a compiled policy would decide a recorded audit event, with the lookups the kernel makes
//! on the entries the policy installs (`MapEntries::decide_*`): `palisade policy replay` runs a
//! candidate policy over events an agent wrote, to see what it would block before enforcing it,
//! and `policy test` checks a policy against the events of its fixtures.

use std::net::IpAddr;

use palisade_common::Verdict;

use super::{CompiledPolicy, catalog, permission_bit};
use crate::bpf::{Subject, hook_named};

/// The decision `policy` makes on `event` (a line of the agent's JSON output), or why it cannot
/// be made: a hook whose events do not record what it decides on, or a field the hook's decision
/// needs that the event lacks.
pub fn decide_event(policy: &CompiledPolicy, event: &serde_json::Value) -> Result<Verdict, String> {
    let entries = policy.entries();
    let hook_name = event["hook"].as_str().ok_or("no \"hook\" (a string)")?;
    let hook = hook_named(hook_name).ok_or_else(|| format!("unknown hook \"{hook_name}\""))?;
    let missing = |field: &str, what: &str| format!("{hook_name} needs \"{field}\" ({what})");
    let text = |field: &str| {
        event[field]
            .as_str()
            .ok_or_else(|| missing(field, "a string"))
    };
    let number = |value: &serde_json::Value, field: &str| {
        value
            .as_u64()
            .and_then(|number| u32::try_from(number).ok())
            .ok_or_else(|| missing(field, "a number"))
    };
    match hook.subject {
        Subject::Path => {
            let perms = event["permissions"]
                .as_array()
                .ok_or_else(|| missing("permissions", "a list"))?
                .iter()
                .map(|permission| {
                    permission
                        .as_str()
                        .and_then(permission_bit)
                        .ok_or_else(|| format!("{permission} is no permission"))
                })
                .try_fold(0, |perms, perm| perm.map(|perm| perms | perm))?;
            Ok(entries.decide_path(text("path")?, perms))
        }
        Subject::Capability => {
            let name = text("capability")?;
            let number =
                catalog::capability(name).ok_or_else(|| format!("{name} is no capability"))?;
            Ok(entries.decide_capability(number))
        }
        Subject::Destination => {
            let socket = &event["socket"];
            let address: IpAddr = socket["address"]
                .as_str()
                .and_then(|address| address.parse().ok())
                .ok_or_else(|| missing("socket.address", "an IP address"))?;
            let port = u16::try_from(number(&socket["port"], "socket.port")?)
                .map_err(|_| missing("socket.port", "a port number"))?;
            let protocol = u8::try_from(number(&socket["protocol"], "socket.protocol")?)
                .map_err(|_| missing("socket.protocol", "a protocol number"))?;
            // ICMPv6 is ICMP to rules.
            let protocol = if protocol == libc::IPPROTO_ICMPV6 as u8 {
                libc::IPPROTO_ICMP as u8
            } else {
                protocol
            };
            Ok(entries.decide_destination(address, protocol, port))
        }
        Subject::FsType => Ok(entries.decide_mount(text("fs_type")?)),
        Subject::Socket => {
            let socket = &event["socket"];
            Ok(entries.decide_socket(
                number(&socket["family"], "socket.family")?,
                number(&event["arg"], "arg")?,
                number(&socket["protocol"], "socket.protocol")?,
            ))
        }
        Subject::Other => Err(format!(
            "{hook_name} events do not record what its decision looks up (a signal's or tracee's \
             target, a BPF command)"
        )),
    }
}

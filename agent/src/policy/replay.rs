//! How a compiled policy would decide a recorded audit event, with the lookups the kernel makes
//! on the entries the policy installs (`MapEntries::decide_*`): `palisade policy replay` runs a candidate policy over
//! events an agent wrote, to see what it would block before enforcing it.

use std::net::IpAddr;

use palisade_common::Verdict;

use super::{CompiledPolicy, catalog, permission_bit};
use crate::bpf::{Subject, hook_named};

/// The decision `policy` makes on `event` (a line of the agent's JSON output); None when the
/// event's operation is not one the record describes fully enough to replay.
pub fn decide_event(policy: &CompiledPolicy, event: &serde_json::Value) -> Option<Verdict> {
    let entries = policy.entries();
    let text = |field: &str| event[field].as_str();
    match hook_named(text("hook")?)?.subject {
        Subject::Path => {
            let perms = event["permissions"]
                .as_array()?
                .iter()
                .filter_map(|permission| permission_bit(permission.as_str()?))
                .fold(0, |perms, perm| perms | perm);
            Some(entries.decide_path(text("path")?, perms))
        }
        Subject::Capability => {
            Some(entries.decide_capability(catalog::capability(text("capability")?)?))
        }
        Subject::Destination => {
            let socket = &event["socket"];
            let address: IpAddr = socket["address"].as_str()?.parse().ok()?;
            let port = u16::try_from(socket["port"].as_u64()?).ok()?;
            let protocol = u8::try_from(socket["protocol"].as_u64()?).ok()?;
            // ICMPv6 is ICMP to rules.
            let protocol = if protocol == libc::IPPROTO_ICMPV6 as u8 {
                libc::IPPROTO_ICMP as u8
            } else {
                protocol
            };
            Some(entries.decide_destination(address, protocol, port))
        }
        Subject::FsType => Some(entries.decide_mount(text("fs_type")?)),
        Subject::Socket => {
            let number = |value: &serde_json::Value| u32::try_from(value.as_u64()?).ok();
            let socket = &event["socket"];
            Some(entries.decide_socket(
                number(&socket["family"])?,
                number(&event["arg"])?,
                number(&socket["protocol"])?,
            ))
        }
        Subject::Other => None,
    }
}

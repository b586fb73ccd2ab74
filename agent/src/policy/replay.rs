//! How a compiled policy would decide a recorded audit event, with the lookups the kernel makes
//! on the entries the policy installs: `palisade policy replay` runs a candidate policy over
//! events an agent wrote, to see what it would block before enforcing it.

use std::net::IpAddr;

use palisade_common::Verdict;

use super::{CompiledPolicy, catalog, effect::AddressBlock, permission_bit};
use crate::bpf::{Subject, hook_named};

/// The decision `policy` makes on `event` (a line of the agent's JSON output); None when the
/// event's operation is not one the record describes fully enough to replay.
pub fn decide_event(policy: &CompiledPolicy, event: &serde_json::Value) -> Option<Verdict> {
    let text = |field: &str| event[field].as_str();
    match hook_named(text("hook")?)?.subject {
        Subject::Path => {
            let perms = event["permissions"]
                .as_array()?
                .iter()
                .filter_map(|permission| permission_bit(permission.as_str()?))
                .fold(0, |perms, perm| perms | perm);
            Some(policy.decide_path(text("path")?, perms))
        }
        Subject::Capability => {
            let number = catalog::capability(text("capability")?)?;
            Some(policy.switches.capability[number as usize])
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
            Some(decide_destination(policy, address, protocol, port))
        }
        Subject::FsType => {
            let fs_type = text("fs_type")?;
            let mut verdict = policy.switches.mount;
            if let Some((_, by_type)) = policy.mount_types.iter().find(|(name, _)| {
                let end = name
                    .iter()
                    .position(|&byte| byte == 0)
                    .unwrap_or(name.len());
                name[..end] == *fs_type.as_bytes()
            }) && by_type.action > verdict.action
            {
                verdict = *by_type;
            }
            Some(verdict)
        }
        Subject::Other => None,
    }
}

/// The network trie's answer for a destination: the longest matching block of each (protocol,
/// port) combination the kernel looks up, the strongest of those.
fn decide_destination(
    policy: &CompiledPolicy,
    address: IpAddr,
    protocol: u8,
    port: u16,
) -> Verdict {
    let destination = AddressBlock {
        addr: match address {
            IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
            IpAddr::V6(v6) => v6.octets(),
        },
        bits: 128,
    };
    let mut best = Verdict::default();
    for (rule_protocol, rule_port) in [(protocol, port), (protocol, 0), (0, port), (0, 0)] {
        let longest = policy
            .network
            .iter()
            .filter(|entry| {
                entry.protocol == rule_protocol
                    && entry.port == rule_port
                    && entry.block.covers(&destination)
            })
            .max_by_key(|entry| entry.block.bits);
        if let Some(entry) = longest
            && entry.verdict.action > best.action
        {
            best = entry.verdict;
        }
    }
    best
}

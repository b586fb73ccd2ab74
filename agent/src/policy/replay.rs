//! How a compiled policy would decide a recorded audit event, with the lookups the kernel makes
//! on the entries the policy installs (`MapEntries::decide_*`): `palisade policy replay` runs a
//! candidate policy over events an agent wrote, to see what it would block before enforcing it,
//! and `policy test` checks a policy against the events of its fixtures.

use std::net::IpAddr;

use palisade_common::{
    HOOK_INODE_INIT_SECURITY_ANON, HOOK_PATH_CHMOD, HOOK_SB_UMOUNT, HOOK_USERNS_CREATE, Verdict,
};

use super::{CompiledPolicy, catalog, permission_bit};
use crate::bpf::{Subject, hook_named};

/// bpf()'s command that loads a program.
const BPF_PROG_LOAD: u32 = 5;

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
            let permissions = event["permissions"]
                .as_array()
                .filter(|permissions| !permissions.is_empty())
                .ok_or_else(|| missing("permissions", "a list of at least one"))?;
            let perms = permissions
                .iter()
                .map(|permission| {
                    permission
                        .as_str()
                        .and_then(permission_bit)
                        .ok_or_else(|| format!("{permission} is no permission"))
                })
                .try_fold(0, |perms, perm| perm.map(|perm| perms | perm))?;
            let path = text("path")?;
            if hook.number == HOOK_PATH_CHMOD {
                return Ok(entries.decide_chmod(path, number(&event["arg"], "arg, the mode")?));
            }
            Ok(entries.decide_path(path, perms))
        }
        Subject::Capability => {
            let name = text("capability")?;
            let number =
                catalog::capability(name).ok_or_else(|| format!("\"{name}\" is no capability"))?;
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
        Subject::FsType => {
            // None for a bind mount or a remount.
            let fs_type = event["fs_type"].as_str().unwrap_or_default();
            Ok(if hook.number == HOOK_SB_UMOUNT {
                entries.decide_unmount(fs_type)
            } else {
                entries.decide_mount(fs_type)
            })
        }
        Subject::Socket => {
            let socket = &event["socket"];
            Ok(entries.decide_socket(
                number(&socket["family"], "socket.family")?,
                number(&event["arg"], "arg, the socket type")?,
                number(&socket["protocol"], "socket.protocol")?,
            ))
        }
        Subject::Switch => Ok(match hook.number {
            HOOK_USERNS_CREATE => entries.switches.userns_create,
            HOOK_INODE_INIT_SECURITY_ANON => entries.switches.userfaultfd,
            _ => entries.switches.setsockopt_bpf,
        }),
        Subject::BpfCommand => match number(&event["arg"], "arg, the command")? {
            BPF_PROG_LOAD => Ok(entries.switches.bpf_prog_load),
            command => Err(format!(
                "bpf command {command} is not a policy's to decide: only loading a program \
                 ({BPF_PROG_LOAD}) is (commands that reach loaded objects are the agent's \
                 self-protection)"
            )),
        },
        Subject::Other => Err(format!(
            "{hook_name} events do not record what its decision looks up (the target process)"
        )),
    }
}

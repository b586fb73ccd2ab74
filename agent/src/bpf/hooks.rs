//! The hooks decisions are made in, by the number events and counters carry, with the name they
//! are reported by and the class of rules they decide.

use Subject::{BpfCommand, Capability, Destination, FsType, Other, Path, Socket, Switch};
use palisade_common::{
    ACTION_DENY, HOOK_BPF, HOOK_BPRM_CHECK, HOOK_CAPABLE, HOOK_FILE_OPEN, HOOK_FILE_RECEIVE,
    HOOK_FS_CONTEXT_PARSE_PARAM, HOOK_INODE_INIT_SECURITY_ANON, HOOK_MMAP_FILE, HOOK_MOVE_MOUNT,
    HOOK_PATH_CHMOD, HOOK_PATH_LINK, HOOK_PATH_MKDIR, HOOK_PATH_MKNOD, HOOK_PATH_RENAME,
    HOOK_PATH_RMDIR, HOOK_PATH_SYMLINK, HOOK_PATH_TRUNCATE, HOOK_PATH_UNLINK,
    HOOK_PTRACE_ACCESS_CHECK, HOOK_SB_KERN_MOUNT, HOOK_SB_MOUNT, HOOK_SB_UMOUNT,
    HOOK_SOCKET_CONNECT, HOOK_SOCKET_CREATE, HOOK_SOCKET_SENDMSG, HOOK_SOCKET_SETSOCKOPT,
    HOOK_TASK_KILL, HOOK_UNIX_STREAM_CONNECT, HOOK_USERNS_CREATE,
};

#[derive(Debug, PartialEq, Eq)]
pub struct Hook {
    pub number: u32,
    /// The LSM hook (and the program attached to it).
    pub name: &'static str,
    /// The rules it decides: files, exec, process, mount, capabilities, bpf or network.
    pub rule_class: &'static str,
    /// What its decisions look up, as its audit events record it.
    pub subject: Subject,
}

/// What a hook's decisions look up in a policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subject {
    /// A path, with the permissions asked on it.
    Path,
    Capability,
    /// A destination: address, protocol and port.
    Destination,
    /// The type of a file system being mounted.
    FsType,
    /// A new socket: family, type and protocol.
    Socket,
    /// Nothing but the operation: an on/off rule class decides (a new user namespace, BPF
    /// attached to a socket).
    Switch,
    /// A bpf() command: loading a program is a policy's to decide.
    BpfCommand,
    /// What an event does not record in full (a signal's or tracee's target): such events
    /// cannot be replayed.
    Other,
}

const fn hook(number: u32, name: &'static str, rule_class: &'static str, subject: Subject) -> Hook {
    Hook {
        number,
        name,
        rule_class,
        subject,
    }
}

pub const HOOKS: &[Hook] = &[
    hook(HOOK_FILE_OPEN, "file_open", "files", Path),
    hook(HOOK_FILE_RECEIVE, "file_receive", "files", Path),
    hook(HOOK_PATH_TRUNCATE, "path_truncate", "files", Path),
    hook(HOOK_PATH_UNLINK, "path_unlink", "files", Path),
    hook(HOOK_PATH_RENAME, "path_rename", "files", Path),
    hook(HOOK_PATH_LINK, "path_link", "files", Path),
    hook(HOOK_PATH_SYMLINK, "path_symlink", "files", Path),
    hook(HOOK_PATH_CHMOD, "path_chmod", "files", Path),
    hook(HOOK_PATH_MKNOD, "path_mknod", "files", Path),
    hook(HOOK_PATH_MKDIR, "path_mkdir", "files", Path),
    hook(HOOK_PATH_RMDIR, "path_rmdir", "files", Path),
    hook(HOOK_BPRM_CHECK, "bprm_check_security", "exec", Path),
    hook(HOOK_MMAP_FILE, "mmap_file", "exec", Path),
    hook(HOOK_TASK_KILL, "task_kill", "process", Other),
    // Creating a userfaultfd (the anonymous inodes of other kinds are not decided).
    hook(
        HOOK_INODE_INIT_SECURITY_ANON,
        "inode_init_security_anon",
        "process",
        Switch,
    ),
    hook(
        HOOK_PTRACE_ACCESS_CHECK,
        "ptrace_access_check",
        "process",
        Other,
    ),
    hook(HOOK_SB_MOUNT, "sb_mount", "mount", FsType),
    hook(HOOK_MOVE_MOUNT, "move_mount", "mount", FsType),
    hook(
        HOOK_FS_CONTEXT_PARSE_PARAM,
        "fs_context_parse_param",
        "mount",
        FsType,
    ),
    hook(HOOK_SB_KERN_MOUNT, "sb_kern_mount", "mount", FsType),
    hook(HOOK_SB_UMOUNT, "sb_umount", "mount", FsType),
    hook(HOOK_CAPABLE, "capable", "capabilities", Capability),
    hook(HOOK_USERNS_CREATE, "userns_create", "capabilities", Switch),
    hook(HOOK_BPF, "bpf", "bpf", BpfCommand),
    hook(HOOK_SOCKET_SETSOCKOPT, "socket_setsockopt", "bpf", Switch),
    hook(HOOK_SOCKET_CREATE, "socket_create", "network", Socket),
    hook(
        HOOK_SOCKET_CONNECT,
        "socket_connect",
        "network",
        Destination,
    ),
    hook(
        HOOK_SOCKET_SENDMSG,
        "socket_sendmsg",
        "network",
        Destination,
    ),
    // Connecting to a named socket opens its path.
    hook(
        HOOK_UNIX_STREAM_CONNECT,
        "unix_stream_connect",
        "network",
        Path,
    ),
];

/// The hook named `name`.
pub fn hook_named(name: &str) -> Option<&'static Hook> {
    HOOKS.iter().find(|hook| hook.name == name)
}

/// The name of hook `number` ("unknown" for a number this build does not know).
pub fn hook_name(number: u32) -> &'static str {
    HOOKS
        .iter()
        .find(|hook| hook.number == number)
        .map_or("unknown", |hook| hook.name)
}

/// "deny" for a decision that denied (reported or not), "audit" for one allowed and reported.
pub fn action_name(action: u32) -> &'static str {
    if action & ACTION_DENY != 0 {
        "deny"
    } else {
        "audit"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_hook_number_is_listed_once() {
        let mut numbers: Vec<u32> = HOOKS.iter().map(|hook| hook.number).collect();
        numbers.sort();
        numbers.dedup();
        assert_eq!(
            numbers,
            (1..palisade_common::HOOK_COUNT).collect::<Vec<_>>()
        );
    }
}

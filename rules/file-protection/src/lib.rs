//! The file-protection family of the built-in rules, as a rule module: the same names as in a
//! policy's rule lists, compiled to the same kernel entries.
//!
//! Config: `{"rules": ["disable-write-etc", {"name": "mitigate-sa-leak", "action": "audit"}]}`.

use palisade_rule_sdk::{Context, Entry, NamedRules, Permission, Rule};

const READ: &[Permission] = &[Permission::Read];
/// Writing covers appending, truncating, deleting, renaming, linking and chmod.
const WRITE: &[Permission] = &[Permission::Write];
const READ_WRITE: &[Permission] = &[Permission::Read, Permission::Write];

/// The files a rule protects, and from what.
fn files(rule: &str) -> Option<(&'static [&'static str], &'static [Permission])> {
    Some(match rule {
        "disallow-write-core-pattern" => (&["/proc/sys/kernel/core_pattern"], WRITE),
        // Anywhere: a cgroup v1 hierarchy can be mounted at any path.
        "disallow-write-release-agent" => (&["/**/release_agent"], WRITE),
        "disallow-access-kallsyms" => (&["/proc/kallsyms"], READ),
        "mitigate-sa-leak" => (
            &[
                "/run/secrets/kubernetes.io/serviceaccount/",
                "/var/run/secrets/kubernetes.io/serviceaccount/",
            ],
            READ,
        ),
        "mitigate-disk-device-number-leak" => (&["/proc/partitions", "/proc/**/mountinfo"], READ),
        "mitigate-overlayfs-leak" => (&["/proc/**/mounts", "/proc/**/mountinfo"], READ),
        "mitigate-host-ip-leak" => (&["/proc/**/net/arp"], READ),
        "disable-write-etc" => (&["/etc/"], WRITE),
        "disable-access-passwd" => (&["/etc/passwd"], READ_WRITE),
        "disable-access-shadow" => (&["/etc/shadow", "/etc/gshadow"], READ_WRITE),
        "disable-access-ssh-dir" => (
            &[
                "/root/.ssh/",
                "/**/.ssh",
                "/**/.ssh/authorized_keys",
                "/**/.ssh/known_hosts",
                "/**/.ssh/config",
                "/**/.ssh/id_rsa",
                "/**/.ssh/id_ecdsa",
                "/**/.ssh/id_ed25519",
                "/**/.ssh/id_dsa",
            ],
            READ_WRITE,
        ),
        "cgroups-lxcfs-escape-mitigation" => (
            &[
                "/**/release_agent",
                "/**/devices.allow",
                "/**/cgroup.procs",
                "/**/devices/tasks",
            ],
            WRITE,
        ),
        // The host's runc, however the target reaches it (/proc/self/exe included).
        "runc-override-mitigation" => (&["/**/runc"], WRITE),
        _ => return None,
    })
}

struct FileProtection;

impl Rule for FileProtection {
    type Config = NamedRules;

    fn compile(config: NamedRules, _: &Context) -> Result<Vec<Entry>, String> {
        config.entries(|name, action| {
            let (paths, permissions) =
                files(name).ok_or_else(|| format!("\"{name}\" is not a file-protection rule"))?;
            let paths = paths.iter().map(|path| (*path).to_owned()).collect();
            Ok(Entry::files(name, paths, permissions, action))
        })
    }
}

palisade_rule_sdk::rule!(FileProtection);

palisade_rule_sdk::fixture_test!(FileProtection);

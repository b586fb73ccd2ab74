//! The kernel's lookups (ebpf/programs) in Rust, on the entries a policy installs (`encode`):
//! `palisade policy replay` decides recorded events with them, and the tests check the entries
//! against what the patterns mean with them.

use std::net::IpAddr;

use palisade_common::{
    ACTION_ALLOW, ANY_PROTOCOL, DEFAULT_CAPABILITIES, DEFAULT_MOUNT, DEFAULT_NETWORK,
    DEFAULT_SOCKETS, PERM_COUNT, PERM_WRITE, PathVerdict, SOCKET_TYPE, Verdict,
};

use super::{
    effect::AddressBlock,
    encode::{MapEntries, TrieEntry},
};

impl MapEntries {
    /// What the kernel decides for `perms` on `path`: the lookups of
    /// ebpf/programs/path_match.h.
    pub fn decide_path(&self, path: &str, perms: u32) -> Verdict {
        fn longest<'a>(entries: &'a [TrieEntry], key: &[u8]) -> Option<&'a PathVerdict> {
            entries
                .iter()
                .filter(|entry| key.starts_with(&entry.key))
                .max_by_key(|entry| entry.key.len())
                .map(|entry| &entry.verdict)
        }
        let mut best = Verdict::default();
        let mut allowed = 0;
        let mut key = path.as_bytes().to_vec();
        key.push(0);
        if let Some(prefix) = longest(&self.prefixes, &key) {
            for i in 0..PERM_COUNT as usize {
                if perms & (1 << i) != 0 {
                    consider(&mut best, prefix.action[i], prefix.rule_id[i]);
                    if allows(prefix.action[i]) {
                        allowed |= 1 << i;
                    }
                }
            }
            let reversed: Vec<u8> = path.bytes().rev().collect();
            if let Some(suffix) = longest(&self.suffixes, &reversed) {
                let matched = prefix.glob_mask & suffix.glob_mask;
                for (i, glob) in self.globs.iter().enumerate() {
                    if matched & (1 << i) != 0
                        && path.len() as u32 >= glob.min_len
                        && glob.perms & perms != 0
                    {
                        consider(&mut best, glob.action, glob.rule_id);
                        if allows(glob.action) {
                            allowed |= glob.perms & perms;
                        }
                    }
                }
            }
        }
        // Files of no directory ("pipe:[N]") are not denied by default; UNIX socket names are.
        let named = path.starts_with('/') || path.starts_with('@');
        self.deny_by_default(best, if named { perms & !allowed } else { 0 })
    }

    /// Using capability `number`.
    pub fn decide_capability(&self, number: u32) -> Verdict {
        let rule = self.switches.capability[number as usize];
        let mut verdict = Verdict::default();
        consider(&mut verdict, rule.action, rule.rule_id);
        let allowed = allows(rule.action);
        self.deny_by_default(verdict, if allowed { 0 } else { DEFAULT_CAPABILITIES })
    }

    /// Changing `path`'s mode to `mode`: the switches for exec and set-id bits, then the path's
    /// write entries.
    pub fn decide_chmod(&self, path: &str, mode: u32) -> Verdict {
        let mut verdict = Verdict::default();
        if mode & 0o111 != 0 {
            let rule = self.switches.chmod_exec_bits;
            consider(&mut verdict, rule.action, rule.rule_id);
        }
        if mode & 0o6000 != 0 {
            let rule = self.switches.chmod_setid_bits;
            consider(&mut verdict, rule.action, rule.rule_id);
        }
        let by_path = self.decide_path(path, PERM_WRITE);
        consider(&mut verdict, by_path.action, by_path.rule_id);
        verdict
    }

    /// Mounting a file system of type `fs_type` ("" for a bind mount or a remount): the mount
    /// switch, or the type's entry if it is stronger; the default denial of a DefenseInDepth
    /// policy unless the entry allows the type.
    pub fn decide_mount(&self, fs_type: &str) -> Verdict {
        self.decide_mount_type(self.switches.mount, fs_type)
    }

    /// Unmounting a file system of type `fs_type`: as a mount, from the unmount switch.
    pub fn decide_unmount(&self, fs_type: &str) -> Verdict {
        self.decide_mount_type(self.switches.umount, fs_type)
    }

    fn decide_mount_type(&self, mut verdict: Verdict, fs_type: &str) -> Verdict {
        let mut allowed = false;
        if let Some((_, by_type)) = self.mount_types.iter().find(|(name, _)| {
            let end = name
                .iter()
                .position(|&byte| byte == 0)
                .unwrap_or(name.len());
            name[..end] == *fs_type.as_bytes()
        }) {
            consider(&mut verdict, by_type.action, by_type.rule_id);
            allowed = allows(by_type.action);
        }
        self.deny_by_default(verdict, if allowed { 0 } else { DEFAULT_MOUNT })
    }

    /// The network trie's answer for a destination: the longest matching block of each
    /// (protocol, port) combination the kernel looks up, the strongest of those.
    pub fn decide_destination(&self, address: IpAddr, protocol: u8, port: u16) -> Verdict {
        let destination = AddressBlock {
            addr: match address {
                IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
                IpAddr::V6(v6) => v6.octets(),
            },
            bits: 128,
        };
        let mut best = Verdict::default();
        let mut allowed = false;
        for (rule_protocol, rule_port) in [(protocol, port), (protocol, 0), (0, port), (0, 0)] {
            let longest = self
                .network
                .iter()
                .filter(|entry| {
                    entry.protocol == rule_protocol
                        && entry.port == rule_port
                        && entry.block.covers(&destination)
                })
                .max_by_key(|entry| entry.block.bits);
            if let Some(entry) = longest {
                consider(&mut best, entry.verdict.action, entry.verdict.rule_id);
                allowed |= allows(entry.verdict.action);
            }
        }
        self.deny_by_default(best, if allowed { 0 } else { DEFAULT_NETWORK })
    }

    /// Creating a socket of `family` and `kind` (its type) with `protocol` (a default 0 resolved,
    /// as events record it): the entries for the protocol, for every protocol and for the type,
    /// the strongest of those; the default denial of a DefenseInDepth policy unless one allows it.
    pub fn decide_socket(&self, family: u32, kind: u32, protocol: u32) -> Verdict {
        // A protocol number with SOCKET_TYPE's bit would read a type's entry.
        let by_protocol = if protocol & SOCKET_TYPE != 0 {
            ANY_PROTOCOL
        } else {
            protocol
        };
        let mut verdict = Verdict::default();
        let mut allowed = false;
        for key in [
            (family, by_protocol),
            (family, ANY_PROTOCOL),
            (family, SOCKET_TYPE | kind),
        ] {
            if let Some((_, entry)) = self.sockets.iter().find(|(entry_key, _)| *entry_key == key) {
                consider(&mut verdict, entry.action, entry.rule_id);
                allowed |= allows(entry.action);
            }
        }
        self.deny_by_default(verdict, if allowed { 0 } else { DEFAULT_SOCKETS })
    }

    /// As the kernel's `deny_by_default`: adds the policy's default denial where the operation
    /// falls in one of `categories` (those no allow rule covered) its DefenseInDepth denies.
    fn deny_by_default(&self, mut verdict: Verdict, categories: u32) -> Verdict {
        if self.switches.defaults & categories != 0 {
            let default = self.switches.default_deny;
            consider(&mut verdict, default.action, default.rule_id);
        }
        verdict
    }
}

/// As the kernel's `consider`: a stronger action wins, the first one on a tie; an allow bit is
/// no action.
fn consider(verdict: &mut Verdict, action: u32, rule_id: u32) {
    let action = action & !ACTION_ALLOW;
    if action > verdict.action {
        *verdict = Verdict { action, rule_id };
    }
}

/// Whether an entry's `action` carries the allow bit.
fn allows(action: u32) -> bool {
    action & ACTION_ALLOW != 0
}

#[cfg(test)]
mod tests {
    use palisade_common::{
        ACTION_AUDIT, ACTION_DENY, PERM_APPEND, PERM_CONNECT, PERM_EXEC, PERM_READ, PERM_WRITE,
    };

    use crate::policy::{
        Pattern,
        compile::testing::{decide, parse, rule_names, with_rules, with_spec},
    };

    #[test]
    fn defense_in_depth_denies_what_it_does_not_allow() {
        let allowlist = |trial: bool| {
            parse(&with_spec(&format!(
                "  mode: DefenseInDepth
  defenseInDepth:
    allowViolations: {trial}
    allow:
      files: [{{paths: [/etc/, /data/**.txt], permissions: [read]}}]
      exec: [/bin/busybox]
      capabilities: [CAP_NET_BIND_SERVICE]
      network: [{{addresses: [10.0.0.0/8], ports: [80], protocols: [tcp]}}]
      mount: [tmpfs]
      sockets: [{{family: inet, types: [stream]}}, {{family: unix}}]
      unixSockets: [/run/app.sock]
"
            )))
            .unwrap()
        };
        let policy = allowlist(false);
        let (allowed, denied) = ((0, 0), (ACTION_DENY | ACTION_AUDIT, 1));
        assert_eq!(decide(&policy, "/etc/passwd", PERM_READ), allowed);
        assert_eq!(
            decide(&policy, "/etc/passwd", PERM_READ | PERM_WRITE),
            denied
        );
        assert_eq!(decide(&policy, "/data/a/b.txt", PERM_READ), allowed);
        assert_eq!(decide(&policy, "/data/a/b.bin", PERM_READ), denied);
        assert_eq!(decide(&policy, "/bin/busybox", PERM_EXEC), allowed);
        assert_eq!(decide(&policy, "/bin/busybox", PERM_READ), allowed);
        assert_eq!(decide(&policy, "/bin/busybox", PERM_WRITE), denied);
        assert_eq!(decide(&policy, "/usr/bin/env", PERM_EXEC), denied);
        assert_eq!(decide(&policy, "/run/app.sock", PERM_CONNECT), allowed);
        assert_eq!(decide(&policy, "/run/other.sock", PERM_CONNECT), denied);
        assert_eq!(decide(&policy, "@other", PERM_CONNECT), denied);
        assert_eq!(decide(&policy, "pipe:[77]", PERM_WRITE), allowed);
        let pair = |verdict: palisade_common::Verdict| (verdict.action, verdict.rule_id);
        let entries = policy.entries();
        assert_eq!(
            pair(entries.decide_capability(10)),
            allowed,
            "CAP_NET_BIND_SERVICE"
        );
        assert_eq!(pair(entries.decide_capability(21)), denied, "CAP_SYS_ADMIN");
        assert_eq!(pair(entries.decide_mount("tmpfs")), allowed);
        assert_eq!(pair(entries.decide_mount("ext4")), denied);
        let peer = |address: &str, protocol: i32, port| {
            pair(entries.decide_destination(address.parse().unwrap(), protocol as u8, port))
        };
        assert_eq!(peer("10.1.2.3", libc::IPPROTO_TCP, 80), allowed);
        assert_eq!(peer("10.1.2.3", libc::IPPROTO_TCP, 81), denied);
        assert_eq!(peer("10.1.2.3", libc::IPPROTO_UDP, 80), denied);
        assert_eq!(peer("192.168.0.1", libc::IPPROTO_TCP, 80), denied);
        let socket = |family: i32, kind: i32, protocol: i32| {
            pair(entries.decide_socket(family as u32, kind as u32, protocol as u32))
        };
        let (tcp, udp) = (libc::IPPROTO_TCP, libc::IPPROTO_UDP);
        assert_eq!(socket(libc::AF_INET, libc::SOCK_STREAM, tcp), allowed);
        assert_eq!(socket(libc::AF_INET, libc::SOCK_DGRAM, udp), denied);
        assert_eq!(socket(libc::AF_INET6, libc::SOCK_STREAM, tcp), denied);
        assert_eq!(socket(libc::AF_UNIX, libc::SOCK_DGRAM, 0), allowed);
        assert_eq!(socket(libc::AF_UNIX, libc::SOCK_SEQPACKET, 0), allowed);
        assert_eq!(socket(libc::AF_PACKET, libc::SOCK_RAW, 768), denied);
        // A protocol number that is a type's key does not read that type's entry.
        let stream_key = (palisade_common::SOCKET_TYPE | libc::SOCK_STREAM as u32) as i32;
        assert_eq!(socket(libc::AF_INET, libc::SOCK_DGRAM, stream_key), denied);

        let trial = allowlist(true);
        assert_eq!(decide(&trial, "/usr/bin/env", PERM_EXEC), (ACTION_AUDIT, 1));
        assert_eq!(decide(&trial, "/bin/busybox", PERM_EXEC), allowed);
    }

    #[test]
    fn deny_rules_apply_on_top_of_an_allowlist_and_its_trial() {
        let policy = parse(&with_spec(
            "  mode: DefenseInDepth
  defenseInDepth:
    allowViolations: true
    allow:
      files: [{paths: [/etc/], permissions: [read]}]
  enhanceProtect:
    privileged: true
    hardeningRules: [disallow-access-kallsyms]
    customRules:
      files: [{name: no-shadow, paths: [/etc/shadow], permissions: [read], action: deny}]
",
        ))
        .unwrap();
        assert_eq!(
            rule_names(&policy),
            ["disallow-access-kallsyms", "no-shadow", "defense-in-depth"]
        );
        assert_eq!(decide(&policy, "/etc/passwd", PERM_READ), (0, 0));
        assert_eq!(decide(&policy, "/etc/shadow", PERM_READ), (ACTION_DENY, 2));
        assert_eq!(
            decide(&policy, "/proc/kallsyms", PERM_READ),
            (ACTION_DENY, 1)
        );
        assert_eq!(decide(&policy, "/var/log/x", PERM_READ), (ACTION_AUDIT, 3));
    }

    #[test]
    fn exact_prefix_and_glob_rules_decide_like_the_patterns() {
        let policy = parse(&with_rules(
            "    files:
      - name: secrets
        paths: [/etc/shadow, /secrets/]
        permissions: [read, write]
        action: deny
      - paths: [/proc/**/mem]
        permissions: [read]
        action: audit
    exec:
      - name: no-curl
        paths: [/usr/bin/curl]
        action: deny
",
        ))
        .unwrap();
        assert_eq!(policy.rule_name(1), Some("secrets"));
        assert_eq!(policy.rule_name(2), Some("customRules.files[1]"));
        assert_eq!(policy.rule_name(3), Some("no-curl"));
        assert_eq!(decide(&policy, "/etc/shadow", PERM_READ), (ACTION_DENY, 1));
        assert_eq!(
            decide(&policy, "/etc/shadow", PERM_APPEND),
            (ACTION_DENY, 1)
        );
        assert_eq!(decide(&policy, "/etc/shadow-", PERM_READ), (0, 0));
        assert_eq!(decide(&policy, "/etc/shadow", PERM_EXEC), (0, 0));
        assert_eq!(
            decide(&policy, "/secrets/a/b", PERM_WRITE),
            (ACTION_DENY, 1)
        );
        assert_eq!(decide(&policy, "/secrets", PERM_WRITE), (0, 0));
        assert_eq!(decide(&policy, "/proc/1/mem", PERM_READ), (ACTION_AUDIT, 2));
        assert_eq!(decide(&policy, "/proc/mem", PERM_READ), (ACTION_AUDIT, 2));
        assert_eq!(decide(&policy, "/proc/1/mem", PERM_WRITE), (0, 0));
        assert_eq!(
            decide(&policy, "/usr/bin/curl", PERM_EXEC),
            (ACTION_DENY, 3)
        );
        // Reading it would allow a copy under another name.
        assert_eq!(
            decide(&policy, "/usr/bin/curl", PERM_READ),
            (ACTION_DENY, 3)
        );
        assert_eq!(decide(&policy, "/usr/bin/curl", PERM_WRITE), (0, 0));
    }

    /// The tries answer exactly what the patterns mean (`Pattern::matches`), rule by rule.
    #[test]
    fn tries_agree_with_the_patterns() {
        let patterns = [
            "/etc/shadow",
            "/etc/",
            "/etc/ssl/",
            "/proc/**/mem",
            "/**/id_rsa",
            "/data/tmp**.key",
            "/x/y/**/y/z",
            "/a/**/a",
            "/srv/app/config.yaml",
        ];
        let paths = [
            "/etc/shadow",
            "/etc/shadow-",
            "/etc",
            "/etc/ssl/a",
            "/proc/mem",
            "/proc/1/mem",
            "/proc/1/mems",
            "/id_rsa",
            "/home/u/.ssh/id_rsa",
            "/data/tmp.key",
            "/data/tmpx/y.key",
            "/data/tm.key",
            "/x/y/z",
            "/x/y/y/z",
            "/a/a",
            "/a/b/a",
            "/a",
            "/srv/app/config.yaml",
            "/srv/app/config.yaml.bak",
        ];
        let mut rules = String::from("    files:\n");
        for pattern in patterns {
            rules.push_str(&format!("      - paths: [\"{pattern}\"]\n        permissions: [read]\n        action: audit\n"));
        }
        let policy = parse(&with_rules(&rules)).unwrap();
        for path in paths {
            let matching: Vec<usize> = patterns
                .iter()
                .enumerate()
                .filter(|(_, pattern)| Pattern::parse(pattern).unwrap().matches(path))
                .map(|(index, _)| index + 1)
                .collect();
            let (action, rule_id) = decide(&policy, path, PERM_READ);
            if matching.is_empty() {
                assert_eq!(action, 0, "{path} matched rule {rule_id}");
            } else {
                assert_eq!(action, ACTION_AUDIT, "{path} should match {matching:?}");
                // Several rules may match; the one reported must be one of them.
                assert!(
                    matching.contains(&(rule_id as usize)),
                    "{path}: rule {rule_id}, expected one of {matching:?}"
                );
            }
        }
    }

    #[test]
    fn covering_rules_are_merged_into_longer_entries() {
        let policy = parse(&with_rules(
            "    files:
      - paths: [/etc/]
        permissions: [write]
        action: deny
      - paths: [/etc/ssl/]
        permissions: [read, write]
        action: audit
      - paths: [/etc/ssl/private/key.pem]
        permissions: [read]
        action: deny
",
        ))
        .unwrap();
        // The longest entry alone answers for the shorter rules that cover it.
        assert_eq!(
            decide(&policy, "/etc/ssl/cert.pem", PERM_WRITE),
            (ACTION_DENY, 1)
        );
        assert_eq!(
            decide(&policy, "/etc/ssl/cert.pem", PERM_READ),
            (ACTION_AUDIT, 2)
        );
        assert_eq!(
            decide(&policy, "/etc/ssl/private/key.pem", PERM_READ),
            (ACTION_DENY, 3)
        );
        assert_eq!(
            decide(&policy, "/etc/ssl/private/key.pem", PERM_WRITE),
            (ACTION_DENY, 1)
        );
        assert_eq!(decide(&policy, "/etc/hosts", PERM_READ), (0, 0));
        assert_eq!(policy.entries().prefixes.len(), 3);
    }

    #[test]
    fn glob_bits_follow_covering_prefixes_and_suffixes() {
        let policy = parse(&with_rules(
            "    files:
      - paths: [/data/**.key]
        permissions: [read]
        action: deny
      - paths: [/data/tmp/**/x.key]
        permissions: [read]
        action: audit
      - paths: [/data/tmp/keep]
        permissions: [read]
        action: audit
",
        ))
        .unwrap();
        assert_eq!(
            decide(&policy, "/data/tmp/a/x.key", PERM_READ),
            (ACTION_DENY, 1)
        );
        assert_eq!(
            decide(&policy, "/data/tmp/keep", PERM_READ),
            (ACTION_AUDIT, 3)
        );
        assert_eq!(decide(&policy, "/data/tmp/a/y.pem", PERM_READ), (0, 0));
        assert_eq!(policy.entries().globs.len(), 2);
    }
}

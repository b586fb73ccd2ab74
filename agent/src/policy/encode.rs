//! Rules -> map entries, and the kernel's lookups on those entries.
//!
//! Every effect lands in one lookup structure. Exact and directory-prefix path rules become
//! entries of a longest-prefix-match trie; each entry carries the merged verdict of every rule
//! that covers it, so the kernel's single lookup returns the answer for all of them.
//! `PREFIX**SUFFIX` globs set a bit on a prefix entry and on a reversed-suffix entry; the kernel
//! ANDs the two masks. Network blocks are merged the same way in their own trie. The kernel's
//! lookups on these entries, in Rust, are beside this module (`lookup`).

use std::collections::{BTreeMap, HashMap};

use palisade_common::{
    ACTION_ALLOW, ACTION_AUDIT, ACTION_DENY, DEFAULT_CAPABILITIES, DEFAULT_MOUNT, DEFAULT_NETWORK,
    DEFAULT_SOCKETS, FS_TYPE_LEN, GlobRule, InodeVerdict, LOOKUP_INODES, LOOKUP_MOUNT_TYPES,
    LOOKUP_NETWORK, LOOKUP_PATHS, LOOKUP_SOCKETS, NAMED_DIRECTORY, NAMED_FILE, PERM_CONTENT,
    PERM_COUNT, PathVerdict, Policy as KernelPolicy, Verdict,
};

use super::{
    Action, Pattern,
    effect::{AddressBlock, Effect},
    lower::{Rule, Violations},
    permission::EVERY_PERMISSION,
};

/// The entries one policy installs, keyed without the policy id they are installed under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapEntries {
    /// Keys are path bytes; an exact path ends with its NUL.
    pub prefixes: Vec<TrieEntry>,
    /// Keys are reversed suffix bytes.
    pub suffixes: Vec<TrieEntry>,
    /// Glob `i` is bit `i` of the tries' glob masks.
    pub globs: Vec<GlobRule>,
    /// The policy's `policies` entry: capabilities and the on/off rule classes.
    pub switches: KernelPolicy,
    pub mount_types: Vec<([u8; FS_TYPE_LEN as usize], Verdict)>,
    /// (family, protocol or ANY_PROTOCOL) -> verdict.
    pub sockets: Vec<((u32, u32), Verdict)>,
    pub network: Vec<NetworkEntry>,
    /// The files and directories whose content exact and directory rules deny or report, by
    /// name: the agent finds their inodes in the targets' view (`inode_rules`).
    pub names: Vec<NamedPath>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrieEntry {
    pub key: Vec<u8>,
    pub verdict: PathVerdict,
}

/// A file (`named`: NAMED_FILE) or a directory whose files a prefix covers (NAMED_DIRECTORY), and
/// what the rules covering it do to its content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedPath {
    pub path: String,
    pub named: u32,
    pub verdict: InodeVerdict,
}

/// An entry of the network trie: protocol 0 and port 0 stand for all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkEntry {
    pub protocol: u8,
    pub port: u16,
    pub block: AddressBlock,
    pub verdict: Verdict,
}

/// The kernel action of a rule: what it does, given the policy's violation flags.
fn kernel_action(action: Action, violations: Violations) -> u32 {
    match action {
        Action::Audit => ACTION_AUDIT,
        Action::Deny if violations.allow => ACTION_AUDIT,
        Action::Deny if violations.audit => ACTION_DENY | ACTION_AUDIT,
        Action::Deny => ACTION_DENY,
    }
}

/// What `Effect::DenyByDefault` denies unless allowed: every file permission and the other
/// kinds of operation a behaviour model records.
const DENIED_BY_DEFAULT: u32 =
    EVERY_PERMISSION | DEFAULT_CAPABILITIES | DEFAULT_NETWORK | DEFAULT_SOCKETS | DEFAULT_MOUNT;

/// The verdict of an allowance (`Effect::Allow`): no rule, only the allow bit.
const ALLOWED: Verdict = Verdict {
    action: ACTION_ALLOW,
    rule_id: 0,
};

/// Adds a verdict: the stronger action wins, then the first rule; an allow bit, beside them,
/// stays once either has it.
fn merge_verdict(into: &mut Verdict, from: Verdict) {
    let allow = (into.action | from.action) & ACTION_ALLOW;
    if (from.action & !ACTION_ALLOW, std::cmp::Reverse(from.rule_id))
        > (into.action & !ACTION_ALLOW, std::cmp::Reverse(into.rule_id))
    {
        *into = from;
    }
    into.action |= allow;
}

/// Adds a rule's verdict for `perms` to `verdict`.
fn merge(verdict: &mut PathVerdict, perms: u32, from: Verdict) {
    for i in (0..PERM_COUNT as usize).filter(|i| perms & (1 << i) != 0) {
        merge_at(&mut verdict.action, &mut verdict.rule_id, i, from);
    }
}

/// Merges `from` into the verdict of permission `i` of per-permission `action` and `rule_id`
/// arrays (a PathVerdict's or an InodeVerdict's).
fn merge_at(action: &mut [u32], rule_id: &mut [u32], i: usize, from: Verdict) {
    let mut current = Verdict {
        action: action[i],
        rule_id: rule_id[i],
    };
    merge_verdict(&mut current, from);
    action[i] = current.action;
    rule_id[i] = current.rule_id;
}

/// Merges every permission's verdict of arrays `from_action` and `from_rule_id` into `action`
/// and `rule_id`'s.
fn merge_each(action: &mut [u32], rule_id: &mut [u32], from_action: &[u32], from_rule_id: &[u32]) {
    for i in 0..PERM_COUNT as usize {
        let from = Verdict {
            action: from_action[i],
            rule_id: from_rule_id[i],
        };
        merge_at(action, rule_id, i, from);
    }
}

fn merge_verdicts(into: &mut PathVerdict, from: &PathVerdict) {
    into.glob_mask |= from.glob_mask;
    merge_each(
        &mut into.action,
        &mut into.rule_id,
        &from.action,
        &from.rule_id,
    );
}

/// Turns what each pattern contributes at its own key into trie entries that also carry every
/// shorter key's contribution (the keys that are prefixes of theirs).
fn covering_entries(own: HashMap<Vec<u8>, PathVerdict>) -> Vec<TrieEntry> {
    let mut entries: Vec<TrieEntry> = own
        .keys()
        .map(|key| {
            let mut verdict = PathVerdict::default();
            for len in 1..=key.len() {
                if let Some(shorter) = own.get(&key[..len]) {
                    merge_verdicts(&mut verdict, shorter);
                }
            }
            TrieEntry {
                key: key.clone(),
                verdict,
            }
        })
        .collect();
    entries.sort_by(|a, b| a.key.cmp(&b.key));
    entries
}

/// Adds what `from` does to a content to `into`, as rules merge: the stronger action wins, then
/// the first rule.
pub fn merge_content(into: &mut InodeVerdict, from: &InodeVerdict) {
    merge_each(
        &mut into.action,
        &mut into.rule_id,
        &from.action,
        &from.rule_id,
    );
}

/// What `verdict` does to a file's content (allowances aside), if anything.
fn content_verdict(verdict: &PathVerdict) -> Option<InodeVerdict> {
    let mut content = InodeVerdict::default();
    for i in (0..PERM_COUNT as usize).filter(|i| PERM_CONTENT & (1 << i) != 0) {
        content.action[i] = verdict.action[i] & !ACTION_ALLOW;
        content.rule_id[i] = verdict.rule_id[i];
    }
    content
        .action
        .iter()
        .any(|&action| action != 0)
        .then_some(content)
}

/// The files and directories the exact and directory entries name, with what they do to their
/// content. The root is not named: every path is below it, so its rules find every name.
fn named_paths(prefixes: &[TrieEntry]) -> Vec<NamedPath> {
    prefixes
        .iter()
        .filter_map(|entry| {
            let verdict = content_verdict(&entry.verdict)?;
            let (path, named) = match entry.key.split_last()? {
                (0, path) => (path, NAMED_FILE),
                (b'/', path) if !path.is_empty() => (path, NAMED_DIRECTORY),
                _ => return None,
            };
            Some(NamedPath {
                path: String::from_utf8(path.to_vec()).ok()?,
                named,
                verdict,
            })
        })
        .filter(|name| name.path.starts_with('/'))
        .collect()
}

/// The same for the network trie: within one (protocol, port), an entry carries the verdicts of
/// the blocks that contain it.
fn covering_network(own: BTreeMap<(u8, u16, AddressBlock), Verdict>) -> Vec<NetworkEntry> {
    own.iter()
        .map(|(&(protocol, port, block), _)| {
            let mut verdict = Verdict::default();
            for (&(_, _, outer), outer_verdict) in own
                .range((protocol, port, AddressBlock::ALL)..)
                .take_while(|((p, q, _), _)| (*p, *q) == (protocol, port))
            {
                if outer.covers(&block) {
                    merge_verdict(&mut verdict, *outer_verdict);
                }
            }
            NetworkEntry {
                protocol,
                port,
                block,
                verdict,
            }
        })
        .collect()
}

/// `list`, or `any` alone when it is empty (an empty list means every value).
fn or_any<T: Copy>(list: &[T], any: T) -> Vec<T> {
    if list.is_empty() {
        vec![any]
    } else {
        list.to_vec()
    }
}

/// The entries on their way: each key with what its own rules contribute.
#[derive(Default)]
struct Encoder {
    prefixes: HashMap<Vec<u8>, PathVerdict>,
    suffixes: HashMap<Vec<u8>, PathVerdict>,
    globs: Vec<GlobRule>,
    switches: KernelPolicy,
    mount_types: BTreeMap<[u8; FS_TYPE_LEN as usize], Verdict>,
    sockets: BTreeMap<(u32, u32), Verdict>,
    network: BTreeMap<(u8, u16, AddressBlock), Verdict>,
}

impl Encoder {
    fn add(&mut self, effect: &Effect, verdict: Verdict) {
        match effect {
            Effect::Paths { patterns, perms } => {
                for pattern in patterns {
                    self.add_path(pattern, *perms, verdict);
                }
            }
            Effect::Capabilities(mask) => {
                for cap in (0..64).filter(|cap| mask & (1 << cap) != 0) {
                    merge_verdict(&mut self.switches.capability[cap], verdict);
                }
            }
            Effect::Switch(switch) => merge_verdict(switch.verdict(&mut self.switches), verdict),
            Effect::MountTypes(types) => {
                for fs_type in types {
                    // Lowering checked that the name fits with its NUL.
                    let mut key = [0u8; FS_TYPE_LEN as usize];
                    key[..fs_type.len()].copy_from_slice(fs_type.as_bytes());
                    merge_verdict(self.mount_types.entry(key).or_default(), verdict);
                }
            }
            Effect::Sockets(keys) => {
                for key in keys {
                    merge_verdict(self.sockets.entry(*key).or_default(), verdict);
                }
            }
            Effect::Network {
                blocks,
                ports,
                protocols,
            } => {
                let (ports, blocks) = (or_any(ports, 0), or_any(blocks, AddressBlock::ALL));
                for protocol in or_any(protocols, 0) {
                    for &port in &ports {
                        for &block in &blocks {
                            let entry = self.network.entry((protocol, port, block));
                            merge_verdict(entry.or_default(), verdict);
                        }
                    }
                }
            }
            Effect::DenyByDefault { trial } => {
                self.switches.defaults = DENIED_BY_DEFAULT;
                let action = if *trial {
                    ACTION_AUDIT
                } else {
                    ACTION_DENY | ACTION_AUDIT
                };
                let default = Verdict { action, ..verdict };
                merge_verdict(&mut self.switches.default_deny, default);
            }
            Effect::Allow(allowances) => {
                for allowance in allowances {
                    self.add(&allowance.effect, ALLOWED);
                }
            }
        }
    }

    fn add_path(&mut self, pattern: &Pattern, perms: u32, verdict: Verdict) {
        match pattern {
            Pattern::Exact(path) => {
                let mut key = path.as_bytes().to_vec();
                key.push(0);
                merge(self.prefixes.entry(key).or_default(), perms, verdict);
            }
            Pattern::Prefix(prefix) => {
                let key = prefix.as_bytes().to_vec();
                merge(self.prefixes.entry(key).or_default(), perms, verdict);
            }
            Pattern::Glob { prefix, suffix } => {
                // Lowering checked that the policy's globs fit the masks.
                let bit = 1u64 << self.globs.len();
                self.globs.push(GlobRule {
                    min_len: Pattern::min_len(prefix, suffix) as u32,
                    perms,
                    action: verdict.action,
                    rule_id: verdict.rule_id,
                });
                let prefix = prefix.as_bytes().to_vec();
                self.prefixes.entry(prefix).or_default().glob_mask |= bit;
                let reversed: Vec<u8> = suffix.bytes().rev().collect();
                self.suffixes.entry(reversed).or_default().glob_mask |= bit;
            }
        }
    }

    fn finish(mut self) -> MapEntries {
        // What is denied by default is looked up even without an entry allowing any of it.
        let defaults = self.switches.defaults;
        let lookups = [
            (
                !self.mount_types.is_empty() || defaults & DEFAULT_MOUNT != 0,
                LOOKUP_MOUNT_TYPES,
            ),
            (
                !self.sockets.is_empty() || defaults & DEFAULT_SOCKETS != 0,
                LOOKUP_SOCKETS,
            ),
            (
                !self.network.is_empty() || defaults & DEFAULT_NETWORK != 0,
                LOOKUP_NETWORK,
            ),
            (
                !self.prefixes.is_empty() || defaults & EVERY_PERMISSION != 0,
                LOOKUP_PATHS,
            ),
        ];
        self.switches.lookups = lookups
            .iter()
            .filter(|(used, _)| *used)
            .fold(0, |bits, (_, bit)| bits | bit);
        let prefixes = covering_entries(self.prefixes);
        let names = named_paths(&prefixes);
        if !names.is_empty() {
            self.switches.lookups |= LOOKUP_INODES;
        }
        MapEntries {
            names,
            prefixes,
            suffixes: covering_entries(self.suffixes),
            globs: self.globs,
            switches: self.switches,
            mount_types: self.mount_types.into_iter().collect(),
            sockets: self.sockets.into_iter().collect(),
            network: covering_network(self.network),
        }
    }
}

/// The entries of `rules`: rule `rules[i]` has id `i + 1`.
pub(super) fn encode(rules: &[Rule], violations: Violations) -> MapEntries {
    let mut encoder = Encoder::default();
    for (rule_id, rule) in (1..).zip(rules) {
        let verdict = Verdict {
            action: kernel_action(rule.action, violations),
            rule_id,
        };
        for effect in &rule.effects {
            encoder.add(effect, verdict);
        }
    }
    encoder.finish()
}

#[cfg(test)]
mod tests {
    use palisade_common::{ACTION_AUDIT, ACTION_DENY, LOOKUP_MOUNT_TYPES, LOOKUP_PATHS, PERM_READ};

    use super::*;
    use crate::policy::compile::testing::{decide, parse, with_rules};

    #[test]
    fn ten_thousand_rules_compile_to_one_entry_each() {
        let mut rules = String::from("    files:\n");
        for i in 0..10_000 {
            rules.push_str(&format!(
                "      - paths: [/data/f{i}]\n        permissions: [read]\n        action: deny\n"
            ));
        }
        let policy = parse(&with_rules(&rules)).unwrap();
        assert_eq!(policy.rules().len(), 10_000);
        assert_eq!(policy.entries().prefixes.len(), 10_000);
        assert_ne!(
            policy.entries().switches.lookups & LOOKUP_PATHS,
            0,
            "path rules are looked up"
        );
        assert_eq!(
            decide(&policy, "/data/f9999", PERM_READ),
            (ACTION_DENY, 10_000)
        );
    }

    #[test]
    fn exact_and_directory_rules_on_content_name_their_paths_with_covering_verdicts() {
        let policy = parse(&with_rules(
            "    files:
      - paths: [/etc/]
        permissions: [write]
        action: deny
      - paths: [/etc/shadow, /etc/ssl/]
        permissions: [read]
        action: audit
      - paths: [/, /usr/bin/sh, /proc/**/mem, /etc/pass**]
        permissions: [exec, read]
        action: deny
",
        ))
        .unwrap();
        let entries = policy.entries();
        let first = |array: [u32; PERM_COUNT as usize]| [array[0], array[1], array[2]];
        let named: Vec<(&str, u32, _)> = entries
            .names
            .iter()
            .map(|name| {
                let verdict = (first(name.verdict.action), first(name.verdict.rule_id));
                (name.path.as_str(), name.named, verdict)
            })
            .collect();
        // Read, write, append: `write` is writing and appending.
        let changed_and_read = ([ACTION_DENY; 3], [3, 1, 1]);
        let read = ([ACTION_DENY, 0, 0], [3, 0, 0]);
        // Sorted by key; the root, globs and prefixes of names are not named; every entry below
        // the root carries its read denial.
        assert_eq!(
            named,
            vec![
                ("/etc", NAMED_DIRECTORY, changed_and_read),
                ("/etc/shadow", NAMED_FILE, changed_and_read),
                ("/etc/ssl", NAMED_DIRECTORY, changed_and_read),
                ("/proc", NAMED_DIRECTORY, read),
                ("/usr/bin/sh", NAMED_FILE, read),
            ]
        );
        assert_eq!(entries.switches.lookups & LOOKUP_INODES, LOOKUP_INODES);
        let exec_only = parse(&with_rules(
            "    files:
      - paths: [/usr/bin/sh]
        permissions: [exec]
        action: deny
",
        ))
        .unwrap();
        assert!(exec_only.entries().names.is_empty());
        assert_eq!(exec_only.entries().switches.lookups & LOOKUP_INODES, 0);
    }

    #[test]
    fn network_rules_merge_covering_blocks_and_map_ipv4() {
        let policy = parse(&with_rules(
            "    network:
      - name: private
        addresses: [10.0.0.0/8]
        action: deny
      - name: web
        addresses: [10.1.0.0/16, \"::ffff:192.0.2.1\"]
        ports: [443, \"8000-8001\"]
        protocols: [tcp]
        action: audit
",
        ))
        .unwrap();
        let entry = |block: &str, protocol: u8, port: u16| {
            let block = AddressBlock::parse(block).unwrap();
            policy
                .entries()
                .network
                .iter()
                .find(|e| e.block == block && e.protocol == protocol && e.port == port)
                .map(|e| e.verdict)
        };
        assert_eq!(
            entry("10.0.0.0/8", 0, 0),
            Some(Verdict {
                action: ACTION_DENY,
                rule_id: 1
            })
        );
        assert_eq!(
            entry("10.1.0.0/16", 6, 443),
            Some(Verdict {
                action: ACTION_AUDIT,
                rule_id: 2
            })
        );
        assert_eq!(
            entry("192.0.2.1", 6, 8001),
            Some(Verdict {
                action: ACTION_AUDIT,
                rule_id: 2
            })
        );
        // 3 ports x 2 blocks, plus the /8.
        assert_eq!(policy.entries().network.len(), 7);
    }

    #[test]
    fn mount_and_capability_rules() {
        let policy = parse(&with_rules(
            "    mount:
      - fsTypes: [tmpfs]
        action: deny
      - action: audit
    capabilities:
      - capabilities: [CAP_NET_ADMIN, sys_time]
        action: deny
",
        ))
        .unwrap();
        let mut tmpfs = [0u8; 16];
        tmpfs[..5].copy_from_slice(b"tmpfs");
        assert_eq!(
            policy.entries().mount_types,
            [(
                tmpfs,
                Verdict {
                    action: ACTION_DENY,
                    rule_id: 1
                }
            )]
        );
        assert_eq!(
            policy.entries().switches.mount,
            Verdict {
                action: ACTION_AUDIT,
                rule_id: 2
            }
        );
        assert_eq!(policy.entries().switches.capability[12].action, ACTION_DENY);
        assert_eq!(policy.entries().switches.capability[25].action, ACTION_DENY);
        assert_eq!(policy.entries().switches.lookups, LOOKUP_MOUNT_TYPES);
    }
}

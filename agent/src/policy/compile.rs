//! Policy -> map entries. Pure: no I/O, no kernel; everything the kernel needs is in the result.
//!
//! Every rule class is one lookup structure. Exact and directory-prefix rules become entries of a
//! longest-prefix-match trie; each entry carries the merged verdict of every rule that covers it,
//! so the kernel's single lookup returns the answer for all of them. `PREFIX**SUFFIX` globs set a
//! bit on a prefix entry and on a reversed-suffix entry; the kernel ANDs the two masks.

use std::{collections::HashMap, path::Path};

use palisade_common::{
    ACTION_AUDIT, ACTION_DENY, GlobRule, MAX_GLOBS, PERM_APPEND, PERM_COUNT, PERM_EXEC, PERM_READ,
    PERM_WRITE, PathVerdict,
};

use super::{Action, Pattern, Permission, Policy, PolicyError};

/// What one policy compiles to, independent of the policy id it is installed under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompiledPolicy {
    pub name: String,
    /// Rule `id` is `rules[id - 1]`.
    pub rules: Vec<RuleInfo>,
    /// Keys are path bytes; an exact path ends with its NUL.
    pub prefixes: Vec<TrieEntry>,
    /// Keys are reversed suffix bytes.
    pub suffixes: Vec<TrieEntry>,
    /// Glob `i` is bit `i` of the tries' glob masks.
    pub globs: Vec<GlobRule>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleInfo {
    pub name: String,
    pub action: Action,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrieEntry {
    pub key: Vec<u8>,
    pub verdict: PathVerdict,
}

impl CompiledPolicy {
    pub fn rule_name(&self, rule_id: u32) -> Option<&str> {
        let index = usize::try_from(rule_id).ok()?.checked_sub(1)?;
        self.rules.get(index).map(|rule| rule.name.as_str())
    }
}

pub fn kernel_perms(permissions: &[Permission]) -> u32 {
    permissions.iter().fold(0, |perms, permission| {
        perms
            | match permission {
                Permission::Read => PERM_READ,
                // Writing covers appending: an O_APPEND open is still a write.
                Permission::Write => PERM_WRITE | PERM_APPEND,
                Permission::Append => PERM_APPEND,
                Permission::Exec => PERM_EXEC,
            }
    })
}

pub fn kernel_action(action: Action) -> u32 {
    match action {
        Action::Audit => ACTION_AUDIT,
        Action::Deny => ACTION_DENY,
    }
}

/// Adds a rule's verdict for `perms` to `verdict`: the stronger action wins, then the first rule.
fn merge(verdict: &mut PathVerdict, perms: u32, action: u32, rule_id: u32) {
    for i in 0..PERM_COUNT as usize {
        if perms & (1 << i) == 0 {
            continue;
        }
        let current = (verdict.action[i], std::cmp::Reverse(verdict.rule_id[i]));
        if (action, std::cmp::Reverse(rule_id)) > current {
            verdict.action[i] = action;
            verdict.rule_id[i] = rule_id;
        }
    }
}

fn merge_verdicts(into: &mut PathVerdict, from: &PathVerdict) {
    into.glob_mask |= from.glob_mask;
    for i in 0..PERM_COUNT as usize {
        merge(into, 1 << i, from.action[i], from.rule_id[i]);
    }
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

struct Compiler<'a> {
    file: &'a Path,
    prefixes: HashMap<Vec<u8>, PathVerdict>,
    suffixes: HashMap<Vec<u8>, PathVerdict>,
    globs: Vec<GlobRule>,
}

impl Compiler<'_> {
    fn add_rule(
        &mut self,
        field: &str,
        paths: &[String],
        perms: u32,
        action: Action,
        rule_id: u32,
    ) -> Result<(), PolicyError> {
        if paths.is_empty() {
            return Err(PolicyError::new(
                self.file,
                format!("{field}.paths"),
                "must list at least one path",
            ));
        }
        let action = kernel_action(action);
        for (index, path) in paths.iter().enumerate() {
            let pattern = Pattern::parse(path).map_err(|reason| {
                PolicyError::new(self.file, format!("{field}.paths[{index}]"), reason)
            })?;
            match pattern {
                Pattern::Exact(path) => {
                    let mut key = path.into_bytes();
                    key.push(0);
                    merge(
                        self.prefixes.entry(key).or_default(),
                        perms,
                        action,
                        rule_id,
                    );
                }
                Pattern::Prefix(prefix) => {
                    merge(
                        self.prefixes.entry(prefix.into_bytes()).or_default(),
                        perms,
                        action,
                        rule_id,
                    );
                }
                Pattern::Glob { prefix, suffix } => {
                    if self.globs.len() == MAX_GLOBS as usize {
                        return Err(PolicyError::new(
                            self.file,
                            format!("{field}.paths[{index}]"),
                            format!("a policy may hold at most {MAX_GLOBS} \"**\" patterns"),
                        ));
                    }
                    let bit = 1u64 << self.globs.len();
                    self.globs.push(GlobRule {
                        min_len: Pattern::min_len(&prefix, &suffix) as u32,
                        perms,
                        action,
                        rule_id,
                    });
                    self.prefixes
                        .entry(prefix.into_bytes())
                        .or_default()
                        .glob_mask |= bit;
                    let reversed: Vec<u8> = suffix.bytes().rev().collect();
                    self.suffixes.entry(reversed).or_default().glob_mask |= bit;
                }
            }
        }
        Ok(())
    }
}

/// Compiles a parsed policy. `file` only names the source in errors.
pub fn compile(file: &Path, policy: &Policy) -> Result<CompiledPolicy, PolicyError> {
    let mut compiler = Compiler {
        file,
        prefixes: HashMap::new(),
        suffixes: HashMap::new(),
        globs: Vec::new(),
    };
    let mut rules: Vec<RuleInfo> = Vec::new();
    let mut add_info = |field: &str, name: &Option<String>, action: Action| {
        let name = name
            .clone()
            .unwrap_or_else(|| field.trim_start_matches("spec.rules.").to_owned());
        if rules.iter().any(|rule| rule.name == name) {
            return Err(PolicyError::new(
                file,
                format!("{field}.name"),
                format!("duplicate rule name \"{name}\""),
            ));
        }
        rules.push(RuleInfo { name, action });
        Ok(rules.len() as u32)
    };
    for (index, rule) in policy.spec.rules.files.iter().enumerate() {
        let field = format!("spec.rules.files[{index}]");
        if rule.permissions.is_empty() {
            return Err(PolicyError::new(
                file,
                format!("{field}.permissions"),
                "must list at least one permission",
            ));
        }
        let rule_id = add_info(&field, &rule.name, rule.action)?;
        compiler.add_rule(
            &field,
            &rule.paths,
            kernel_perms(&rule.permissions),
            rule.action,
            rule_id,
        )?;
    }
    for (index, rule) in policy.spec.rules.exec.iter().enumerate() {
        let field = format!("spec.rules.exec[{index}]");
        let rule_id = add_info(&field, &rule.name, rule.action)?;
        compiler.add_rule(&field, &rule.paths, PERM_EXEC, rule.action, rule_id)?;
    }
    Ok(CompiledPolicy {
        name: policy.metadata.name.clone(),
        rules,
        prefixes: covering_entries(compiler.prefixes),
        suffixes: covering_entries(compiler.suffixes),
        globs: compiler.globs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Pattern;

    fn parse(text: &str) -> Result<CompiledPolicy, PolicyError> {
        let file = Path::new("p.yaml");
        compile(file, &Policy::parse(file, text)?)
    }

    fn with_rules(rules: &str) -> String {
        format!(
            "apiVersion: palisade.dev/v1alpha1\nkind: PalisadePolicy\nmetadata:\n  name: t\nspec:\n  rules:\n{rules}"
        )
    }

    /// What the kernel decides for `path`: the same lookups as ebpf/programs/path_match.h.
    fn decide(policy: &CompiledPolicy, path: &str, perms: u32) -> (u32, u32) {
        fn longest<'a>(entries: &'a [TrieEntry], key: &[u8]) -> Option<&'a PathVerdict> {
            entries
                .iter()
                .filter(|entry| key.starts_with(&entry.key))
                .max_by_key(|entry| entry.key.len())
                .map(|entry| &entry.verdict)
        }
        let mut key = path.as_bytes().to_vec();
        key.push(0);
        let mut best = (0, 0);
        let mut consider = |action: u32, rule_id: u32| {
            if action > best.0 {
                best = (action, rule_id);
            }
        };
        let Some(prefix) = longest(&policy.prefixes, &key) else {
            return best;
        };
        for i in 0..PERM_COUNT as usize {
            if perms & (1 << i) != 0 {
                consider(prefix.action[i], prefix.rule_id[i]);
            }
        }
        let reversed: Vec<u8> = path.bytes().rev().collect();
        if let Some(suffix) = longest(&policy.suffixes, &reversed) {
            let matched = prefix.glob_mask & suffix.glob_mask;
            for (i, glob) in policy.globs.iter().enumerate() {
                if matched & (1 << i) != 0
                    && path.len() as u32 >= glob.min_len
                    && glob.perms & perms != 0
                {
                    consider(glob.action, glob.rule_id);
                }
            }
        }
        best
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
        assert_eq!(policy.rule_name(2), Some("files[1]"));
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
        assert_eq!(decide(&policy, "/usr/bin/curl", PERM_READ), (0, 0));
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
        assert_eq!(policy.prefixes.len(), 3);
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
        assert_eq!(policy.globs.len(), 2);
    }

    #[test]
    fn ten_thousand_rules_compile_to_one_entry_each() {
        let mut rules = String::from("    files:\n");
        for i in 0..10_000 {
            rules.push_str(&format!(
                "      - paths: [/data/f{i}]\n        permissions: [read]\n        action: deny\n"
            ));
        }
        let policy = parse(&with_rules(&rules)).unwrap();
        assert_eq!(policy.rules.len(), 10_000);
        assert_eq!(policy.prefixes.len(), 10_000);
        assert_eq!(
            decide(&policy, "/data/f9999", PERM_READ),
            (ACTION_DENY, 10_000)
        );
    }

    #[test]
    fn invalid_policies_name_file_field_and_reason() {
        let cases = [
            (
                with_rules("    filez: []\n"),
                "p.yaml: spec.rules: unknown field `filez`, expected `files` or `exec` at line 7 column 5",
            ),
            (
                with_rules("    files:\n      - paths: [/a]\n        permissions: [exe]\n        action: deny\n"),
                "p.yaml: spec.rules.files[0].permissions[0]: unknown variant `exe`, expected one of `read`, `write`, `append`, `exec` at line 9 column 23",
            ),
            (
                with_rules("    files:\n      - paths: [/a]\n        permissions: [read]\n        action: block\n"),
                "p.yaml: spec.rules.files[0].action: unknown variant `block`, expected `audit` or `deny` at line 10 column 17",
            ),
            (
                with_rules("    files:\n      - paths: [/a/*.txt]\n        permissions: [read]\n        action: deny\n"),
                "p.yaml: spec.rules.files[0].paths[0]: \"/a/*.txt\": only the \"**\" wildcard is supported (no \"*\", \"?\" or \"[\")",
            ),
            (
                with_rules("    exec:\n      - paths: [bin/sh]\n        action: deny\n"),
                "p.yaml: spec.rules.exec[0].paths[0]: \"bin/sh\" is not an absolute path",
            ),
            (
                with_rules("    files:\n      - paths: []\n        permissions: [read]\n        action: deny\n"),
                "p.yaml: spec.rules.files[0].paths: must list at least one path",
            ),
            (
                with_rules("    files:\n      - paths: [/a]\n        permissions: []\n        action: deny\n"),
                "p.yaml: spec.rules.files[0].permissions: must list at least one permission",
            ),
            (
                with_rules("    exec:\n      - name: x\n        paths: [/a]\n        action: deny\n      - name: x\n        paths: [/b]\n        action: deny\n"),
                "p.yaml: spec.rules.exec[1].name: duplicate rule name \"x\"",
            ),
            (
                with_rules("    files:\n      - paths: [/a]\n        action: deny\n"),
                "p.yaml: spec.rules.files[0]: missing field `permissions` at line 8 column 9",
            ),
            (
                "apiVersion: palisade.dev/v1\nkind: PalisadePolicy\nmetadata:\n  name: t\nspec: {}\n".to_owned(),
                "p.yaml: apiVersion: expected \"palisade.dev/v1alpha1\", got \"palisade.dev/v1\"",
            ),
            ("[1, 2]".to_owned(), "p.yaml: (document): invalid type: sequence, expected struct Policy"),
        ];
        for (text, expected) in cases {
            assert_eq!(parse(&text).unwrap_err().to_string(), expected, "{text}");
        }
    }

    #[test]
    fn too_many_globs_is_an_error() {
        let paths: Vec<String> = (0..65).map(|i| format!("/d{i}/**/x")).collect();
        let text = with_rules(&format!(
            "    files:\n      - paths: [{}]\n        permissions: [read]\n        action: deny\n",
            paths.join(", ")
        ));
        assert_eq!(
            parse(&text).unwrap_err().to_string(),
            "p.yaml: spec.rules.files[0].paths[64]: a policy may hold at most 64 \"**\" patterns"
        );
    }
}

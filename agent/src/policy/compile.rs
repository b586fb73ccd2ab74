//! Policy -> what the kernel enforces. Pure: no I/O, no kernel; everything the kernel needs is
//! in the result. Lowering (`lower`) turns the spec into rules and finds every error; encoding
//! (`encode`) turns the rules into map entries.

use std::{fmt::Display, time::Duration};

use palisade_common::{POLICY_ALWAYS_ALLOW, POLICY_MODELING, POLICY_REPORT_ONCE};

use super::{
    Action, Mode, OnFailure, Policy, PolicyError,
    catalog::Environment,
    encode::{MapEntries, encode},
    lower::{ModuleRules, Violations, lower, modeling},
};

/// What one policy compiles to, independent of the policy id it is installed under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompiledPolicy {
    name: String,
    /// Rule `id` is `rules[id - 1]`.
    rules: Vec<RuleInfo>,
    entries: MapEntries,
    /// The rule modules that decide the policy's events, in order.
    deciders: Vec<Decider>,
    /// BehaviorModeling: how long its targets are modeled.
    modeling: Option<Duration>,
}

/// A rule module deciding a policy's events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decider {
    pub name: String,
    /// The module's SHA-256 digest, in lowercase hex.
    pub digest: String,
    /// The policy's configuration of the module, as JSON.
    pub config: String,
    pub on_failure: OnFailure,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleInfo {
    pub name: String,
    pub action: Action,
}

impl CompiledPolicy {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Rule `id` is `rules()[id - 1]`.
    pub fn rules(&self) -> &[RuleInfo] {
        &self.rules
    }

    pub fn rule_name(&self, rule_id: u32) -> Option<&str> {
        Some(self.rules[self.rule_index(rule_id)?].name.as_str())
    }

    /// Where rule `rule_id` is in `rules` (ids count from 1).
    pub fn rule_index(&self, rule_id: u32) -> Option<usize> {
        let index = usize::try_from(rule_id).ok()?.checked_sub(1)?;
        (index < self.rules.len()).then_some(index)
    }

    /// The map entries the policy installs, and the kernel's lookups on them.
    pub fn entries(&self) -> &MapEntries {
        &self.entries
    }

    /// The rule modules that decide the policy's events, in order.
    pub fn deciders(&self) -> &[Decider] {
        &self.deciders
    }

    /// Whether the kernel leaves the policy's targets alone (mode AlwaysAllow, or
    /// BehaviorModeling neither recording nor with rules): then they need no program to decide
    /// anything.
    pub fn always_allow(&self) -> bool {
        self.entries.switches.flags & POLICY_ALWAYS_ALLOW != 0
    }

    /// BehaviorModeling: how long its targets are modeled.
    pub fn modeling(&self) -> Option<Duration> {
        self.modeling
    }

    /// This policy with the kernel recording what its targets do, as the records of model
    /// `model_id`.
    pub fn recording_into(mut self, model_id: u32) -> Self {
        let switches = &mut self.entries.switches;
        switches.flags = (switches.flags & !POLICY_ALWAYS_ALLOW) | POLICY_MODELING;
        switches.model_id = model_id;
        self
    }

    /// The model the kernel records its targets' behaviour into, if it does.
    pub fn model_id(&self) -> Option<u32> {
        let switches = &self.entries.switches;
        (switches.flags & POLICY_MODELING != 0).then_some(switches.model_id)
    }
}

/// Compiles a parsed policy. `source` (a file, a custom resource) only names it in errors.
pub fn compile(
    source: &dyn Display,
    policy: &Policy,
    env: &Environment,
    modules: &[ModuleRules],
) -> Result<CompiledPolicy, PolicyError> {
    let modeling = modeling(source, policy)?;
    let rules = lower(source, policy, env, modules)?;
    let violations = Violations::of(policy);
    let mut entries = encode(&rules, violations);
    let nothing_to_decide = modeling.is_some() && rules.is_empty();
    if policy.spec.mode == Mode::AlwaysAllow || nothing_to_decide {
        entries.switches.flags |= POLICY_ALWAYS_ALLOW;
    }
    if let Some(defense) = &policy.spec.defense_in_depth
        && defense.allow_violations
    {
        entries.switches.flags |= POLICY_REPORT_ONCE;
    }
    let deciders = policy
        .spec
        .rule_modules
        .iter()
        .map(|module| Decider {
            name: module.name.clone(),
            digest: module.sha256.to_ascii_lowercase(),
            config: module.config.to_string(),
            on_failure: module.on_failure,
        })
        .collect();
    Ok(CompiledPolicy {
        name: policy.metadata.name.clone(),
        rules: rules
            .into_iter()
            .map(|rule| RuleInfo {
                name: rule.name,
                action: rule.action,
            })
            .collect(),
        entries,
        deciders,
        modeling,
    })
}

/// Policy texts for the tests of lowering and encoding.
#[cfg(test)]
pub(super) mod testing {
    use std::path::Path;

    use super::{CompiledPolicy, compile};
    use crate::policy::{Environment, Policy, PolicyError};

    /// Compiles `text` as `p.yaml`, in an environment without a Kubernetes API server.
    pub fn parse(text: &str) -> Result<CompiledPolicy, PolicyError> {
        let file = Path::new("p.yaml");
        compile(
            &file.display(),
            &Policy::parse(file, text)?,
            &Environment::default(),
            &[],
        )
    }

    /// A privileged EnhanceProtect policy (no RuntimeDefault rule) whose custom rules are
    /// `rules`, indented by four spaces.
    pub fn with_rules(rules: &str) -> String {
        let rules: String = rules.lines().map(|line| format!("  {line}\n")).collect();
        format!(
            "apiVersion: palisade.dev/v1alpha1\nkind: PalisadePolicy\nmetadata:\n  name: t\nspec:\n  mode: EnhanceProtect\n  enhanceProtect:\n    privileged: true\n    customRules:\n{rules}"
        )
    }

    pub fn with_spec(spec: &str) -> String {
        format!(
            "apiVersion: palisade.dev/v1alpha1\nkind: PalisadePolicy\nmetadata:\n  name: t\nspec:\n{spec}"
        )
    }

    /// The action and rule id of what `policy` decides for `perms` on `path`.
    pub fn decide(policy: &CompiledPolicy, path: &str, perms: u32) -> (u32, u32) {
        let verdict = policy.entries().decide_path(path, perms);
        (verdict.action, verdict.rule_id)
    }

    pub fn rule_names(policy: &CompiledPolicy) -> Vec<&str> {
        policy
            .rules()
            .iter()
            .map(|rule| rule.name.as_str())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use palisade_common::{
        ACTION_AUDIT, ACTION_DENY, PERM_EXEC, PERM_READ, PERM_WRITE, POLICY_ALWAYS_ALLOW,
        POLICY_MODELING, POLICY_REPORT_ONCE, Policy as KernelPolicy, Verdict,
    };

    use super::testing::{decide, parse, rule_names, with_spec};

    #[test]
    fn always_allow_compiles_to_nothing_and_is_left_alone() {
        let policy = parse(&with_spec("  mode: AlwaysAllow\n")).unwrap();
        assert!(policy.rules().is_empty());
        assert!(policy.entries().prefixes.is_empty());
        assert!(policy.always_allow());
        assert_eq!(
            policy.entries().switches,
            KernelPolicy {
                flags: POLICY_ALWAYS_ALLOW,
                ..KernelPolicy::default()
            }
        );
        let privileged = parse(&with_spec(
            "  mode: EnhanceProtect\n  enhanceProtect: {privileged: true}\n",
        ))
        .unwrap();
        assert!(privileged.rules().is_empty());
        assert!(!privileged.always_allow(), "self-protection still applies");
    }

    #[test]
    fn only_a_defense_in_depth_trial_reports_once() {
        let flags = |spec: &str| parse(&with_spec(spec)).unwrap().entries().switches.flags;
        let defense = |trial: bool| {
            format!(
                "  mode: DefenseInDepth\n  defenseInDepth: {{allowViolations: {trial}, allow: {{}}}}\n"
            )
        };
        assert_eq!(flags(&defense(true)), POLICY_REPORT_ONCE);
        assert_eq!(flags(&defense(false)), 0);
        let enhance = "  mode: EnhanceProtect\n  enhanceProtect: {allowViolations: true}\n";
        assert_eq!(flags(enhance) & POLICY_REPORT_ONCE, 0);
    }

    #[test]
    fn behavior_modeling_is_left_alone_until_it_records() {
        let policy = parse(&with_spec(
            "  mode: BehaviorModeling\n  behaviorModeling: {duration: 1h30m}\n",
        ))
        .unwrap();
        assert_eq!(
            policy.modeling(),
            Some(std::time::Duration::from_secs(5400))
        );
        assert!(policy.rules().is_empty());
        assert!(
            policy.always_allow(),
            "no rule of its own: nothing to decide"
        );
        assert_eq!(policy.model_id(), None);

        let recording = policy.recording_into(7);
        assert_eq!(recording.model_id(), Some(7));
        assert!(!recording.always_allow(), "the programs record its targets");
        assert_eq!(
            recording.entries().switches,
            KernelPolicy {
                flags: POLICY_MODELING,
                model_id: 7,
                ..KernelPolicy::default()
            }
        );
    }

    #[test]
    fn runtime_default_denies_kernel_interfaces_mounts_and_outside_ptrace_silently() {
        let policy = parse(&with_spec("  mode: RuntimeDefault\n")).unwrap();
        assert_eq!(rule_names(&policy), ["runtime-default"]);
        for path in [
            "/proc/sysrq-trigger",
            "/proc/1/mem",
            "/proc/kcore",
            "/sys/firmware/efi/vars",
        ] {
            assert_eq!(decide(&policy, path, PERM_READ), (ACTION_DENY, 1), "{path}");
            assert_eq!(
                decide(&policy, path, PERM_WRITE),
                (ACTION_DENY, 1),
                "{path}"
            );
        }
        assert_eq!(decide(&policy, "/proc/1/status", PERM_READ), (0, 0));
        let deny = Verdict {
            action: ACTION_DENY,
            rule_id: 1,
        };
        assert_eq!(policy.entries().switches.mount, deny);
        assert_eq!(policy.entries().switches.ptrace_outside, deny);
        assert_eq!(policy.entries().switches.umount, Verdict::default());
        assert_eq!(
            policy.entries().switches.capability,
            [Verdict::default(); 64]
        );
    }

    #[test]
    fn enhance_protect_adds_runtime_default_unless_privileged() {
        let spec = |privileged: bool| {
            with_spec(&format!(
                "  mode: EnhanceProtect\n  enhanceProtect:\n    privileged: {privileged}\n    hardeningRules: [disallow-umount, disable-cap-sys-admin]\n    attackProtectionRules: [disable-shell]\n    auditRules: [disable-shell]\n    vulMitigationRules: [copy-fail-mitigation]\n"
            ))
        };
        let policy = parse(&spec(false)).unwrap();
        assert_eq!(
            rule_names(&policy),
            [
                "runtime-default",
                "disallow-umount",
                "disable-cap-sys-admin",
                "disable-shell",
                "copy-fail-mitigation"
            ]
        );
        assert_eq!(policy.entries().switches.mount.action, ACTION_DENY);
        assert_eq!(
            policy.entries().switches.umount,
            Verdict {
                action: ACTION_DENY,
                rule_id: 2
            }
        );
        assert_eq!(
            policy.entries().switches.capability[21],
            Verdict {
                action: ACTION_DENY,
                rule_id: 3
            }
        );
        assert_eq!(decide(&policy, "/bin/bash", PERM_EXEC), (ACTION_AUDIT, 4));
        assert_eq!(
            policy.entries().sockets,
            [(
                (libc::AF_ALG as u32, palisade_common::ANY_PROTOCOL),
                Verdict {
                    action: ACTION_DENY,
                    rule_id: 5
                }
            )]
        );
        let privileged = parse(&spec(true)).unwrap();
        assert_eq!(rule_names(&privileged)[0], "disallow-umount");
        assert_eq!(privileged.entries().switches.mount, Verdict::default());
        assert_eq!(decide(&privileged, "/proc/kcore", PERM_READ), (0, 0));
    }

    #[test]
    fn violation_flags_change_every_deny() {
        let spec = |flags: &str| {
            with_spec(&format!(
                "  mode: EnhanceProtect\n  enhanceProtect:\n{flags}    hardeningRules: [disallow-mount]\n    attackProtectionRules: [disable-write-etc]\n    auditRules: [disable-write-etc]\n"
            ))
        };
        let actions = |flags: &str| {
            let policy = parse(&spec(flags)).unwrap();
            (
                policy.entries().switches.mount.action,
                decide(&policy, "/etc/hosts", PERM_WRITE).0,
            )
        };
        assert_eq!(actions(""), (ACTION_DENY, ACTION_AUDIT));
        assert_eq!(
            actions("    auditViolations: true\n"),
            (ACTION_DENY | ACTION_AUDIT, ACTION_AUDIT)
        );
        assert_eq!(
            actions("    allowViolations: true\n"),
            (ACTION_AUDIT, ACTION_AUDIT)
        );
        assert_eq!(
            actions("    auditViolations: true\n    allowViolations: true\n"),
            (ACTION_AUDIT, ACTION_AUDIT)
        );
    }
}

//! Which policy each policy id is, for the events and counters that carry ids: shared by the
//! policy store, which registers what it installs, and the event decoder.

use std::{
    collections::{HashMap, VecDeque},
    sync::{Arc, RwLock},
};

use palisade_common::{RULE_PATH_OUTSIDE_MOUNT, RULE_SELF_PROTECTION};

use crate::{policy::CompiledPolicy, targets::Cgroup};

/// A policy as installed: what events need to name it.
#[derive(Debug)]
pub struct InstalledPolicy {
    pub policy: Arc<CompiledPolicy>,
    pub target: Cgroup,
    /// Its name, its target's path and its rules' names (by rule id - 1, then the built-in
    /// rules'), shared by every event that names them rather than copied into each.
    name: Arc<str>,
    target_path: Arc<str>,
    rule_names: Vec<Arc<str>>,
}

/// The rule name given to the built-in protection of the loading process.
pub const SELF_PROTECTION: &str = "palisade-self-protection";
/// The rule name given to the refusal of a file no path names (cut off from the mount it was
/// opened through, as by a file handle) to a target whose policy has path rules.
const PATH_OUTSIDE_MOUNT: &str = "palisade-path-outside-mount";

impl InstalledPolicy {
    pub fn new(policy: Arc<CompiledPolicy>, target: Cgroup) -> Self {
        let rules = policy.rules().iter().map(|rule| rule.name.as_str());
        let rule_names = rules
            .chain([SELF_PROTECTION, PATH_OUTSIDE_MOUNT])
            .map(Arc::from)
            .collect();
        Self {
            name: policy.name().into(),
            target_path: target.path.to_string_lossy().into(),
            rule_names,
            policy,
            target,
        }
    }

    pub fn name(&self) -> &Arc<str> {
        &self.name
    }

    pub fn target_path(&self) -> &Arc<str> {
        &self.target_path
    }

    pub fn rule_name(&self, rule_id: u32) -> Option<&Arc<str>> {
        let rules = self.policy.rules().len();
        let index = match rule_id {
            RULE_SELF_PROTECTION => rules,
            RULE_PATH_OUTSIDE_MOUNT => rules + 1,
            _ => self.policy.rule_index(rule_id)?,
        };
        self.rule_names.get(index)
    }
}

/// Policy id -> installed policy, shared with the event decoder. Replaced and removed policies
/// stay listed for a while: events already in the ring buffer still name them.
#[derive(Debug, Clone, Default)]
pub struct PolicyRegistry(Arc<RwLock<Registry>>);

#[derive(Debug, Default)]
struct Registry {
    by_id: HashMap<u32, Arc<InstalledPolicy>>,
    retired: VecDeque<u32>,
}

const RETIRED_KEPT: usize = 256;

impl PolicyRegistry {
    pub fn get(&self, policy_id: u32) -> Option<Arc<InstalledPolicy>> {
        self.0
            .read()
            .unwrap_or_else(|poison| poison.into_inner())
            .by_id
            .get(&policy_id)
            .cloned()
    }

    /// Names `policy_id` in events from now on (the enforcer registers what it installs).
    pub fn insert(&self, policy_id: u32, installed: Arc<InstalledPolicy>) {
        self.0
            .write()
            .unwrap_or_else(|poison| poison.into_inner())
            .by_id
            .insert(policy_id, installed);
    }

    pub(super) fn retire(&self, policy_id: u32) {
        let mut registry = self.0.write().unwrap_or_else(|poison| poison.into_inner());
        registry.retired.push_back(policy_id);
        if registry.retired.len() > RETIRED_KEPT
            && let Some(oldest) = registry.retired.pop_front()
        {
            registry.by_id.remove(&oldest);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::policy::{Environment, Policy, compile};

    #[test]
    fn an_installed_policy_names_its_rules_the_built_in_ones_and_no_other() {
        let file = Path::new("p.yaml");
        let text = "apiVersion: palisade.dev/v1alpha1\nkind: PalisadePolicy\nmetadata:\n  name: app\n\
                    spec:\n  mode: EnhanceProtect\n  enhanceProtect:\n    privileged: true\n    \
                    customRules:\n      files:\n        - name: secrets\n          paths: [/srv/]\n          \
                    permissions: [read]\n          action: deny\n";
        let policy = Policy::parse(file, text).unwrap();
        let compiled = compile(&file.display(), &policy, &Environment::default(), &[]).unwrap();
        let target = Cgroup {
            path: "/sys/fs/cgroup/app".into(),
            id: 7,
            level: 1,
        };
        let installed = InstalledPolicy::new(Arc::new(compiled), target);
        assert_eq!(&**installed.name(), "app");
        assert_eq!(&**installed.target_path(), "/sys/fs/cgroup/app");
        let name = |rule_id| installed.rule_name(rule_id).map(|name| name.to_string());
        assert_eq!(name(1).as_deref(), Some("secrets"));
        assert_eq!(name(RULE_SELF_PROTECTION).as_deref(), Some(SELF_PROTECTION));
        assert_eq!(
            name(RULE_PATH_OUTSIDE_MOUNT).as_deref(),
            Some(PATH_OUTSIDE_MOUNT)
        );
        assert_eq!(name(0), None);
        assert_eq!(name(2), None);
    }
}

//! What this agent enforces, whichever source the policies come from (files, Kubernetes): one
//! entry per subject (a policy file, a pod), each new version installed before the one it
//! replaces is taken off, and each pass's errors reported once while they last.

use std::{
    borrow::Borrow,
    collections::{BTreeMap, HashMap},
    hash::Hash,
    sync::Arc,
};

use tracing::{info, warn};

use super::{Enforce, Placement};
use crate::policy::CompiledPolicy;

/// The policy one subject has.
#[derive(Debug, Clone)]
pub struct Entry<V> {
    /// The subject in messages: a policy file's path, `pod NAMESPACE/NAME`.
    pub subject: String,
    /// Which version of which policy, as its source tells them apart.
    pub version: V,
    pub compiled: Arc<CompiledPolicy>,
    pub placement: Placement,
}

/// The entries, by subject key, and the errors of the last pass.
pub struct EnforcedSet<K, V> {
    entries: HashMap<K, Entry<V>>,
    /// The last error about each subject, so that a lasting problem is reported once.
    reported: BTreeMap<String, String>,
    /// Entries put on so far.
    installs: u64,
}

impl<K, V> Default for EnforcedSet<K, V> {
    fn default() -> Self {
        Self {
            entries: HashMap::new(),
            reported: BTreeMap::new(),
            installs: 0,
        }
    }
}

impl<K: Eq + Hash + Clone, V> EnforcedSet<K, V> {
    pub fn get<Q: Eq + Hash + ?Sized>(&self, key: &Q) -> Option<&Entry<V>>
    where
        K: Borrow<Q>,
    {
        self.entries.get(key)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&K, &Entry<V>)> {
        self.entries.iter()
    }

    pub fn count(&self) -> usize {
        self.entries.len()
    }

    /// Entries put on so far.
    pub fn installs(&self) -> u64 {
        self.installs
    }

    /// Puts `entry` on for `key`, then takes the entry it replaces off its placement if that is
    /// another one (an armed cgroup now created, a target no longer named): never before the new
    /// one is on. An error means nothing changed.
    pub fn install(
        &mut self,
        key: K,
        entry: Entry<V>,
        enforcer: &mut impl Enforce,
    ) -> Result<(), String> {
        entry.placement.install(enforcer, entry.compiled.clone())?;
        self.installs += 1;
        info!(
            subject = %entry.subject,
            policy = %entry.compiled.name(),
            target = %entry.placement.describe(),
            "policy enforced"
        );
        let placement = entry.placement.clone();
        if let Some(previous) = self.entries.insert(key, entry)
            && previous.placement != placement
            && let Err(err) = previous.placement.remove(enforcer)
        {
            warn!(
                subject = %previous.subject,
                "removing the policy from {}: {err}",
                previous.placement.describe()
            );
        }
        Ok(())
    }

    /// Takes off the entries of the subjects not `wanted`; one that cannot be taken off stays,
    /// its error in `errors`.
    pub fn release_unwanted(
        &mut self,
        wanted: impl Fn(&K) -> bool,
        enforcer: &mut impl Enforce,
        errors: &mut BTreeMap<String, String>,
    ) {
        let unwanted: Vec<K> = self
            .entries
            .keys()
            .filter(|key| !wanted(key))
            .cloned()
            .collect();
        for key in unwanted {
            let entry = &self.entries[&key];
            match entry.placement.remove(enforcer) {
                Ok(()) => {
                    info!(subject = %entry.subject, policy = %entry.compiled.name(), "policy no longer enforced");
                    self.entries.remove(&key);
                }
                Err(err) => {
                    let error = format!(
                        "{}: removing {}: {err}",
                        entry.subject,
                        entry.compiled.name()
                    );
                    errors.insert(entry.subject.clone(), error);
                }
            }
        }
    }

    /// Keeps a pass's errors, by subject; returns those not reported before.
    pub fn report(&mut self, errors: BTreeMap<String, String>) -> Vec<String> {
        let new = errors
            .iter()
            .filter(|(subject, error)| self.reported.get(*subject) != Some(error))
            .map(|(_, error)| error.clone())
            .collect();
        self.reported = errors;
        new
    }

    /// Whether the last pass had no error: every subject has the policy its source wants.
    pub fn all_enforced(&self) -> bool {
        self.reported.is_empty()
    }

    /// Subjects with an error in the last pass.
    pub fn errors(&self) -> usize {
        self.reported.len()
    }
}

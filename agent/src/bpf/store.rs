//! The policies' entries in the kernel, each policy under a policy id of its own: written in
//! full before any target points at the id, deleted once no program can still be reading them.

use std::{
    collections::{HashMap as StdHashMap, HashSet},
    path::PathBuf,
    sync::{Arc, Mutex, PoisonError},
};

use aya::maps::{Array, ArrayOfMaps, HashMap, MapData, MapError, lpm_trie::LpmTrie};
use palisade_common::{
    GlobKey, GlobRule, InodeRuleKey, InodeVerdict, MountTypeKey, NetworkKeyData, PathVerdict,
    Policy, SocketKey, TriePath, Verdict,
};
use tracing::warn;

use super::{
    EnforceError, InstalledPolicy, MapSizes, PolicyRegistry,
    layout::{glob_key, mount_type_key, network_key, socket_key, trie_key},
    names::{self, MAX_PROCESSES, MAX_READ, MAX_VIEWS},
};
use crate::{
    policy::{CompiledPolicy, TrieEntry},
    targets::Cgroup,
};

/// The maps of a policy store.
pub(super) struct PolicyMaps {
    pub policies: HashMap<MapData, u32, Policy>,
    pub mount_types: HashMap<MapData, MountTypeKey, Verdict>,
    pub sockets: HashMap<MapData, SocketKey, Verdict>,
    pub network: LpmTrie<MapData, NetworkKeyData, Verdict>,
    pub globs: HashMap<MapData, GlobKey, GlobRule>,
    pub prefixes: LpmTrie<MapData, TriePath, PathVerdict>,
    pub suffixes: LpmTrie<MapData, TriePath, PathVerdict>,
    pub inode_rules: HashMap<MapData, InodeRuleKey, InodeVerdict>,
    pub barrier: ProgramsBarrier,
}

/// Returns once every BPF program that was running has finished (see `sync_barrier`); shared,
/// so that the wait can run off the agent's loop.
#[derive(Clone)]
pub struct ProgramsBarrier(Arc<Mutex<BarrierMaps>>);

struct BarrierMaps {
    outer: ArrayOfMaps<MapData, Array<MapData, u32>>,
    inner: Array<MapData, u32>,
}

impl ProgramsBarrier {
    pub(super) fn new(
        outer: ArrayOfMaps<MapData, Array<MapData, u32>>,
        inner: Array<MapData, u32>,
    ) -> Self {
        Self(Arc::new(Mutex::new(BarrierMaps { outer, inner })))
    }

    /// Blocks for a grace period, a few milliseconds to tens of them.
    pub fn wait(&self) -> Result<(), MapError> {
        let mut maps = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let BarrierMaps { outer, inner } = &mut *maps;
        outer.set(0, inner, 0)
    }
}

pub(super) struct PolicyStore {
    maps: PolicyMaps,
    sizes: MapSizes,
    next_policy_id: u32,
    registry: PolicyRegistry,
    /// The policies whose rules name inodes, by policy id: where their target is, and the
    /// `inode_rules` entries written for them.
    named: StdHashMap<u32, NamedInodes>,
}

struct NamedInodes {
    policy: Arc<CompiledPolicy>,
    cgroup: PathBuf,
    written: StdHashMap<InodeRuleKey, InodeVerdict>,
    /// Whether a look found the target with processes: until one has, it is looked at more
    /// often (see `find_named_inodes_again`).
    had_processes: bool,
    /// Whether the last look found more than it walks, could not look into every process, or
    /// found more than `inode_rules` holds: each said once, when it starts.
    truncated: bool,
    partial: bool,
    full: bool,
}

impl PolicyStore {
    /// A store on `maps`, of `sizes`, which an earlier agent may have filled: its policy ids
    /// stay unused.
    pub fn new(maps: PolicyMaps, sizes: MapSizes) -> Self {
        let highest = maps
            .policies
            .keys()
            .filter_map(Result::ok)
            .max()
            .unwrap_or(0);
        Self {
            maps,
            sizes,
            next_policy_id: highest.checked_add(1).unwrap_or(1),
            registry: PolicyRegistry::default(),
            named: StdHashMap::new(),
        }
    }

    pub fn registry(&self) -> &PolicyRegistry {
        &self.registry
    }

    /// Writes `policy`'s entries under a new policy id, registered as `target`'s; returns the
    /// id. The inodes its rules name are looked for, unless the policy it replaces there
    /// (`replaced`) names the same paths: then that policy's `inode_rules` entries are copied, as
    /// its last look found them (a look lists the target's processes and walks the named
    /// directories: milliseconds, or far more, that every update would wait for). An error
    /// means nothing was left.
    pub fn add(
        &mut self,
        policy: &Arc<CompiledPolicy>,
        target: Cgroup,
        replaced: Option<u32>,
    ) -> Result<u32, EnforceError> {
        let policy_id = self.next_policy_id;
        self.next_policy_id = self.next_policy_id.checked_add(1).unwrap_or(1);
        if let Err(err) = self.write_entries(policy_id, policy) {
            self.delete_entries(policy_id, policy);
            return Err(err);
        }
        let names = &policy.entries().names;
        if !names.is_empty() {
            let same_names = replaced
                .and_then(|id| self.named.get(&id))
                .filter(|old| old.cgroup == target.path && old.policy.entries().names == *names);
            let record = NamedInodes {
                policy: policy.clone(),
                cgroup: target.path.clone(),
                written: StdHashMap::new(),
                // As that policy's look found them, said once already.
                had_processes: same_names.is_some_and(|old| old.had_processes),
                truncated: same_names.is_some_and(|old| old.truncated),
                partial: same_names.is_some_and(|old| old.partial),
                full: same_names.is_some_and(|old| old.full),
            };
            let copied: Option<StdHashMap<_, _>> = same_names.map(|old| {
                old.written
                    .iter()
                    .map(|(key, verdict)| (InodeRuleKey { policy_id, ..*key }, *verdict))
                    .collect()
            });
            self.named.insert(policy_id, record);
            match copied {
                Some(copied) => self.write_named_inodes(policy_id, copied),
                None => self.find_named_inodes(policy_id),
            };
        }
        let installed = InstalledPolicy::new(policy.clone(), target);
        self.registry.insert(policy_id, Arc::new(installed));
        Ok(policy_id)
    }

    /// Looks for the inodes the policies' rules name again (they are created and linked while
    /// the policies hold), for every policy or, `starting`, only for the targets that have their
    /// first processes now (their views are the ones that count; listing every target's
    /// processes every 2 s would cost the agent ~4% CPU with 1,000 targeted cgroups); returns
    /// whether an inode gained a verdict or a stronger one, which opens remembered before it may
    /// not have.
    pub fn find_named_inodes_again(&mut self, starting: bool) -> bool {
        let ids: Vec<u32> = self
            .named
            .iter()
            .filter(|(_, record)| {
                !starting || (!record.had_processes && names::has_processes(&record.cgroup))
            })
            .map(|(policy_id, _)| *policy_id)
            .collect();
        let mut gained = false;
        for policy_id in ids {
            gained |= self.find_named_inodes(policy_id);
        }
        gained
    }

    /// Writes the `inode_rules` entries of what policy `policy_id`'s rules name now; returns
    /// whether one was added or changed. An entry stays until the policy's entries are deleted:
    /// the views are the target's processes', which may chroot or mount over a name to hide it
    /// (a file deleted meanwhile keeps its inode number denied to the target, should the file
    /// system give it to another file: the safe side). Best effort: what is not written leaves
    /// the rule to the names the path rules match.
    fn find_named_inodes(&mut self, policy_id: u32) -> bool {
        let Some(record) = self.named.get_mut(&policy_id) else {
            return false;
        };
        let found = names::find(&record.cgroup, policy_id, &record.policy.entries().names);
        if found.truncated && !record.truncated {
            warn!(
                policy = %record.policy.name(),
                cgroup = %record.cgroup.display(),
                "the directories the policy names hold over {MAX_READ} entries, or too many \
                 directories and linked files: its rules hold for the other names of some only"
            );
        }
        if found.partial && !record.partial {
            warn!(
                policy = %record.policy.name(),
                cgroup = %record.cgroup.display(),
                "some of the target's processes or directories were not looked into (no \
                 CAP_SYS_PTRACE or CAP_DAC_READ_SEARCH, or over {MAX_VIEWS} mount namespaces or \
                 {MAX_PROCESSES} processes): its rules hold for the other names of what was seen \
                 only"
            );
        }
        record.truncated = found.truncated;
        record.partial = found.partial;
        // Never unset: a target whose processes come and go is not looked at again each time.
        record.had_processes |= found.in_processes;
        self.write_named_inodes(policy_id, found.inodes)
    }

    /// Writes the `inode_rules` entries of `inodes` that policy `policy_id` does not have yet;
    /// returns whether one was added or changed.
    fn write_named_inodes(
        &mut self,
        policy_id: u32,
        inodes: StdHashMap<InodeRuleKey, InodeVerdict>,
    ) -> bool {
        let Some(record) = self.named.get_mut(&policy_id) else {
            return false;
        };
        let map = &mut self.maps.inode_rules;
        let mut gained = false;
        let mut full = false;
        for (key, verdict) in inodes {
            if record.written.get(&key) == Some(&verdict) {
                continue;
            }
            if let Err(err) = map.insert(key, verdict, 0) {
                if !record.full {
                    warn!(
                        policy = %record.policy.name(),
                        "the kernel's inode_rules map (sized by --max-path-entries): {err}"
                    );
                }
                full = true;
                break;
            }
            record.written.insert(key, verdict);
            gained = true;
        }
        record.full = full;
        gained
    }

    /// Undoes `add` for a policy no target ever pointed at.
    pub fn discard(&mut self, policy_id: u32, policy: &CompiledPolicy) {
        self.delete_entries(policy_id, policy);
        self.forget(policy_id);
    }

    /// Stops naming `policy_id` in events, after a while (see `PolicyRegistry`).
    pub fn forget(&self, policy_id: u32) {
        self.registry.retire(policy_id);
    }

    /// Returns once every BPF program that was running has finished.
    pub fn wait_for_running_programs(&self) -> Result<(), MapError> {
        self.maps.barrier.wait()
    }

    pub fn barrier(&self) -> ProgramsBarrier {
        self.maps.barrier.clone()
    }

    /// The policy ids that have entries.
    pub fn stored_ids(&self) -> Result<HashSet<u32>, MapError> {
        self.maps.policies.keys().collect()
    }

    /// Deletes every entry of a policy id not in `live`; returns how many.
    pub fn purge_except(&mut self, live: &HashSet<u32>) -> Result<usize, MapError> {
        fn stale<K>(
            keys: impl Iterator<Item = Result<K, MapError>>,
            id: impl Fn(&K) -> u32,
            live: &HashSet<u32>,
        ) -> Vec<K> {
            keys.filter_map(Result::ok)
                .filter(|key| !live.contains(&id(key)))
                .collect()
        }
        let mut count = 0;
        for key in stale(self.maps.policies.keys(), |id| *id, live) {
            self.maps.policies.remove(&key)?;
            count += 1;
        }
        for key in stale(self.maps.mount_types.keys(), |key| key.policy_id, live) {
            self.maps.mount_types.remove(&key)?;
            count += 1;
        }
        for key in stale(self.maps.sockets.keys(), |key| key.policy_id, live) {
            self.maps.sockets.remove(&key)?;
            count += 1;
        }
        for key in stale(self.maps.globs.keys(), |key| key.policy_id, live) {
            self.maps.globs.remove(&key)?;
            count += 1;
        }
        for key in stale(self.maps.network.keys(), |key| key.data().policy_id, live) {
            self.maps.network.remove(&key)?;
            count += 1;
        }
        for trie in [&mut self.maps.prefixes, &mut self.maps.suffixes] {
            for key in stale(trie.keys(), |key| key.data().policy_id, live) {
                trie.remove(&key)?;
                count += 1;
            }
        }
        for key in stale(self.maps.inode_rules.keys(), |key| key.policy_id, live) {
            self.maps.inode_rules.remove(&key)?;
            count += 1;
        }
        Ok(count)
    }

    fn write_entries(
        &mut self,
        policy_id: u32,
        policy: &CompiledPolicy,
    ) -> Result<(), EnforceError> {
        let entries = policy.entries();
        let sizes = self.sizes;
        let maps = &mut self.maps;
        for (fs_type, verdict) in &entries.mount_types {
            maps.mount_types
                .insert(mount_type_key(policy_id, fs_type), verdict, 0)
                .map_err(|err| sizes.full_or("mount_types", err))?;
        }
        for (key, verdict) in &entries.sockets {
            maps.sockets
                .insert(socket_key(policy_id, *key), verdict, 0)
                .map_err(|err| sizes.full_or("sockets", err))?;
        }
        for entry in &entries.network {
            maps.network
                .insert(&network_key(policy_id, entry), entry.verdict, 0)
                .map_err(|err| sizes.full_or("network", err))?;
        }
        for (index, glob) in entries.globs.iter().enumerate() {
            maps.globs
                .insert(glob_key(policy_id, index), glob, 0)
                .map_err(|err| sizes.full_or("globs", err))?;
        }
        for TrieEntry { key, verdict } in &entries.suffixes {
            maps.suffixes
                .insert(&trie_key(policy_id, key), verdict, 0)
                .map_err(|err| sizes.full_or("path_suffixes", err))?;
        }
        for TrieEntry { key, verdict } in &entries.prefixes {
            maps.prefixes
                .insert(&trie_key(policy_id, key), verdict, 0)
                .map_err(|err| sizes.full_or("path_prefixes", err))?;
        }
        // Last: programs find a policy's other entries through this one.
        maps.policies
            .insert(policy_id, entries.switches, 0)
            .map_err(|err| sizes.full_or("policies", err))
    }

    /// Best effort: entries that were never written are simply absent.
    pub fn delete_entries(&mut self, policy_id: u32, policy: &CompiledPolicy) {
        let entries = policy.entries();
        let _ = self.maps.policies.remove(&policy_id);
        for (fs_type, _) in &entries.mount_types {
            let _ = self
                .maps
                .mount_types
                .remove(&mount_type_key(policy_id, fs_type));
        }
        for (key, _) in &entries.sockets {
            let _ = self.maps.sockets.remove(&socket_key(policy_id, *key));
        }
        for entry in &entries.network {
            let _ = self.maps.network.remove(&network_key(policy_id, entry));
        }
        for index in 0..entries.globs.len() {
            let _ = self.maps.globs.remove(&glob_key(policy_id, index));
        }
        for entry in &entries.suffixes {
            let _ = self.maps.suffixes.remove(&trie_key(policy_id, &entry.key));
        }
        for entry in &entries.prefixes {
            let _ = self.maps.prefixes.remove(&trie_key(policy_id, &entry.key));
        }
        if let Some(named) = self.named.remove(&policy_id) {
            for key in named.written.keys() {
                let _ = self.maps.inode_rules.remove(key);
            }
        }
    }
}

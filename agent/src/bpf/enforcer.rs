//! The loaded programs and their maps. Policies are installed under fresh policy ids and switched
//! in with one `targets` update, so a replacement is atomic and never reloads programs.

use std::{
    collections::{BTreeMap, HashMap, HashSet, VecDeque},
    os::fd::OwnedFd,
    path::Path,
    sync::{Arc, RwLock},
    time::Duration,
};

use aya::{
    Btf, Ebpf, EbpfLoader,
    maps::{
        Array, ArrayOfMaps, HashMap as BpfHashMap, MapData, MapError, PerCpuArray, PerCpuHashMap,
        RingBuf, lpm_trie::LpmTrie,
    },
    programs::{Lsm, ProgramError, links::FdLink},
};
use palisade_common::{
    Config, GlobKey, GlobRule, HookCost, MountTypeKey, NetworkKeyData, PathVerdict, PendingKey,
    Policy as KernelPolicy, RULE_PATH_OUTSIDE_MOUNT, RULE_SELF_PROTECTION, RuleCount, RuleKey,
    STAT_EVENTS, STAT_EVENTS_DROPPED, STAT_EVENTS_THROTTLED, STAT_UNCOUNTED, STAT_UNDECIDED,
    SocketKey, Target, TriePath, Verdict,
};

use tracing::{info, warn};

use super::{
    HOOKS, LoadError, MAPS, Maps, OBJECT, PROGRAMS, PinnedState, Preflight, ProtectError,
    ProtectedFiles, Protection,
    layout::{glob_key, mount_type_key, network_key, pending_key, socket_key, trie_key},
    pinned,
};
use crate::{
    policy::{CompiledPolicy, TrieEntry},
    targets::Cgroup,
};

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
        let rules = policy.rules.iter().map(|rule| rule.name.as_str());
        let rule_names = rules
            .chain([SELF_PROTECTION, PATH_OUTSIDE_MOUNT])
            .map(Arc::from)
            .collect();
        Self {
            name: policy.name.as_str().into(),
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
        let rules = self.policy.rules.len();
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

    fn retire(&self, policy_id: u32) {
        let mut registry = self.0.write().unwrap_or_else(|poison| poison.into_inner());
        registry.retired.push_back(policy_id);
        if registry.retired.len() > RETIRED_KEPT
            && let Some(oldest) = registry.retired.pop_front()
        {
            registry.by_id.remove(&oldest);
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StageError {
    #[error(
        "cannot arm \"{0}\" before it exists: only cgroup names of 1 to 127 bytes without '/' can be"
    )]
    Name(String),
    #[error("cannot arm a cgroup deeper than level 63")]
    TooDeep,
    #[error("{0}")]
    Map(#[from] MapError),
}

#[derive(Debug, thiserror::Error)]
pub enum RetireError {
    #[error("removing pinned state: {0}")]
    Unpin(#[from] std::io::Error),
    #[error("removing stale entries: {0}")]
    Map(#[from] MapError),
}

/// Kernel counters, summed over CPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    pub events: u64,
    pub events_dropped: u64,
    /// Audit events suppressed by the audit rate of their rule and target.
    pub events_throttled: u64,
    /// Operations on targets allowed because they could not be decided.
    pub undecided: u64,
    /// Decisions not counted by rule (the counter map was full).
    pub uncounted: u64,
}

/// How many audit events one rule may emit for one target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuditRate {
    pub per_second: u32,
    /// Events emitted at once after a quiet period (at least 1).
    pub burst: u32,
}

/// The decisions of one rule of one policy in one hook, by action.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RuleLabels {
    pub policy: String,
    pub rule: String,
    pub hook: &'static str,
    pub action: &'static str,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RuleCounts {
    pub decisions: u64,
    /// Reported decisions whose event the audit rate suppressed.
    pub throttled: u64,
}

impl std::ops::AddAssign for RuleCounts {
    fn add_assign(&mut self, other: Self) {
        self.decisions += other.decisions;
        self.throttled += other.throttled;
    }
}

/// What measuring cost holds on to.
struct Measuring {
    /// The kernel's run-time statistics stay on as long as this is open.
    _run_time_stats: OwnedFd,
    /// The attached programs (links do not change while the enforcer lives), by id.
    program_ids: HashMap<u32, &'static str>,
}

/// Decisions about targets made in one hook, and the time they took (while measured).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecisionCost {
    pub hook: &'static str,
    pub rule_class: &'static str,
    pub decisions: u64,
    pub time: Duration,
}

/// What the kernel's run-time statistics say of one program (while measured).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProgramRuns {
    pub program: &'static str,
    pub runs: u64,
    pub time: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum MeasureError {
    #[error("enabling the kernel's BPF run-time statistics: {0}")]
    Stats(#[from] aya::sys::SyscallError),
    #[error("finding the programs' ids: {0}")]
    Program(#[from] ProgramError),
    #[error("finding the programs' ids: {0}")]
    Link(#[from] aya::programs::links::LinkError),
    #[error("{0}")]
    Map(#[from] MapError),
}

struct Installed {
    policy_id: u32,
    policy: Arc<CompiledPolicy>,
    level: u32,
}

pub struct Enforcer {
    // Owns the programs, and their links unless pinned: dropping it detaches those.
    _ebpf: Ebpf,
    /// Where maps and links are pinned, if they are.
    pinned: Option<PinnedState>,
    /// This start found the pinned state not matching the object and replaced it.
    replaced_pinned_state: bool,
    /// Levels of the targets a previous agent left in pinned maps, probed until
    /// `retire_previous`.
    adopted_levels: u64,
    config_map: Array<MapData, Config>,
    /// What `config_map` holds.
    config: Config,
    targets: BpfHashMap<MapData, u64, Target>,
    pending: BpfHashMap<MapData, PendingKey, Target>,
    protected: ProtectedFiles,
    prefixes: LpmTrie<MapData, TriePath, PathVerdict>,
    suffixes: LpmTrie<MapData, TriePath, PathVerdict>,
    globs: BpfHashMap<MapData, GlobKey, GlobRule>,
    policies: BpfHashMap<MapData, u32, KernelPolicy>,
    mount_types: BpfHashMap<MapData, MountTypeKey, Verdict>,
    sockets: BpfHashMap<MapData, SocketKey, Verdict>,
    network: LpmTrie<MapData, NetworkKeyData, Verdict>,
    stats: PerCpuArray<MapData, u64>,
    rule_counts: PerCpuHashMap<MapData, RuleKey, RuleCount>,
    /// Counts of policies replaced or removed since, which left `rule_counts`.
    retired_counts: BTreeMap<RuleLabels, RuleCounts>,
    hook_cost: PerCpuArray<MapData, HookCost>,
    /// While measuring cost.
    measuring: Option<Measuring>,
    sync_barrier: ArrayOfMaps<MapData, Array<MapData, u32>>,
    sync_inner: Array<MapData, u32>,
    events: Option<RingBuf<MapData>>,
    installed: HashMap<u64, Installed>,
    /// Cgroups armed before they exist, by (parent id, name).
    staged: HashMap<(u64, String), Installed>,
    /// Targets and staged targets per cgroup level.
    targets_per_level: [u32; 64],
    next_policy_id: u32,
    registry: PolicyRegistry,
}

impl Enforcer {
    /// Loads the programs and attaches them to their LSM hooks, for as long as this process
    /// lives. Fails with a clear reason on a kernel where BPF LSM cannot run.
    pub fn load() -> Result<Self, LoadError> {
        Self::load_with(None)
    }

    /// Loads with maps and links pinned in bpffs under `state`, so that enforcement continues
    /// when this process ends. What an earlier agent of this build left there is adopted as it
    /// is: its programs stay attached and its policies enforced until `retire_previous`.
    pub fn load_pinned(state: PinnedState) -> Result<Self, LoadError> {
        Self::load_with(Some(state))
    }

    fn load_with(pinned: Option<PinnedState>) -> Result<Self, LoadError> {
        Preflight::run().check()?;
        let btf = Btf::from_sys_fs().map_err(|err| LoadError::NoBtf(err.to_string()))?;
        let mut loader = EbpfLoader::new();
        loader.btf(Some(&btf));
        let mut adopted = false;
        let mut replaced = false;
        if let Some(state) = &pinned
            && let Some(mismatch) = state.mismatch(MAPS)
        {
            let aside = state
                .set_aside()
                .map_err(|err| LoadError::pin(&state.dir(), err))?;
            warn!(
                state = %aside.display(),
                "the pinned state does not match this build ({mismatch}): set aside, enforcing \
                 as it did until every policy is applied again, and replaced"
            );
            replaced = true;
        }
        if let Some(state) = &pinned {
            for dir in ["maps", "links"] {
                let dir = state.dir().join(dir);
                std::fs::create_dir_all(&dir).map_err(|err| LoadError::pin(&dir, err))?;
            }
            adopted = state.links_complete(PROGRAMS);
            for name in MAPS {
                loader.map_pin_path(name, state.map(name));
            }
        }
        let mut ebpf = loader.load(OBJECT)?;
        if !adopted {
            for name in PROGRAMS {
                let program: &mut Lsm = ebpf
                    .program_mut(name)
                    .and_then(|program| program.try_into().ok())
                    .ok_or(LoadError::MissingProgram(name))?;
                program
                    .load(name, &btf)
                    .map_err(|err| LoadError::program("load", name, err))?;
                let link = program
                    .attach()
                    .map_err(|err| LoadError::program("attach", name, err))?;
                if let Some(state) = &pinned {
                    // Attached first, then pinned in place of a link an interrupted start left.
                    let link = program
                        .take_link(link)
                        .map_err(|err| LoadError::program("attach", name, err))?;
                    let path = state.link(name);
                    let _ = std::fs::remove_file(&path);
                    FdLink::from(link)
                        .pin(&path)
                        .map_err(|err| LoadError::pin(&path, err))?;
                }
            }
        }
        let Maps {
            config,
            targets,
            pending,
            protected_inodes,
            policies,
            path_prefixes,
            path_suffixes,
            globs,
            mount_types,
            sockets,
            network,
            events,
            stats,
            rule_counts,
            hook_cost,
            sync_barrier,
            sync_inner,
        } = Maps::take(&mut ebpf)?;
        let mut enforcer = Self {
            config_map: config,
            targets,
            pending,
            protected: ProtectedFiles::new(protected_inodes),
            prefixes: path_prefixes,
            suffixes: path_suffixes,
            globs,
            policies,
            mount_types,
            sockets,
            network,
            stats,
            rule_counts,
            retired_counts: BTreeMap::new(),
            hook_cost,
            measuring: None,
            sync_barrier,
            sync_inner,
            events: Some(events),
            _ebpf: ebpf,
            pinned,
            replaced_pinned_state: replaced,
            adopted_levels: 0,
            installed: HashMap::new(),
            staged: HashMap::new(),
            targets_per_level: [0; 64],
            next_policy_id: 1,
            registry: PolicyRegistry::default(),
            config: Config {
                protected_pid: std::process::id().into(),
                ..Config::default()
            },
        };
        let setup = |source| LoadError::MapSetup {
            name: "config",
            source,
        };
        // Maps a previous agent pinned: keep its targets probed, and its policy ids unused.
        enforcer.adopted_levels = enforcer.config_map.get(&0, 0).map_err(setup)?.target_levels;
        let highest = enforcer
            .policies
            .keys()
            .filter_map(Result::ok)
            .max()
            .unwrap_or(0);
        enforcer.next_policy_id = highest.checked_add(1).unwrap_or(1);
        // From here on, targets may not signal or trace this process.
        enforcer.publish_levels().map_err(setup)?;
        Ok(enforcer)
    }

    /// Removes what earlier agents left in the kernel and this one did not take over: the pinned
    /// state of other builds (their programs detach; this build's enforce in their place) and
    /// the targets and policies this agent has not applied. Call it once every policy is
    /// applied, so that no target is left less protected than before.
    pub fn retire_previous(&mut self) -> Result<(), RetireError> {
        if let Some(state) = &self.pinned {
            for other in state.others()? {
                pinned::remove(&other)?;
                info!(state = %other.display(), "removed the pinned state of another build");
            }
        }
        // Targets of policies this agent applied or staged (the kernel arms staged cgroups
        // itself) stay; the rest are an earlier agent's.
        let live: HashSet<u32> = self
            .installed
            .values()
            .chain(self.staged.values())
            .map(|installed| installed.policy_id)
            .collect();
        let stale = self.targets_with(|policy_id| !live.contains(&policy_id));
        for id in &stale {
            self.targets.remove(id)?;
        }
        let stale_pending: Vec<PendingKey> = self
            .pending
            .iter()
            .filter_map(Result::ok)
            .filter(|(_, target)| !live.contains(&target.policy_id))
            .map(|(key, _)| key)
            .collect();
        for key in &stale_pending {
            self.pending.remove(key)?;
        }
        self.protected.remove_others()?;
        self.adopted_levels = 0;
        self.publish_levels()?;
        self.wait_for_running_programs()?;
        let stale_entries = self.purge_policies_except(&live)?;
        if !stale.is_empty() || stale_entries > 0 {
            info!(
                targets = stale.len(),
                entries = stale_entries,
                "removed the targets and entries an earlier agent left"
            );
        }
        Ok(())
    }

    /// Deletes every entry of a policy id not in `live`; returns how many.
    fn purge_policies_except(&mut self, live: &HashSet<u32>) -> Result<usize, MapError> {
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
        for key in stale(self.policies.keys(), |id| *id, live) {
            self.policies.remove(&key)?;
            count += 1;
        }
        for key in stale(self.mount_types.keys(), |key| key.policy_id, live) {
            self.mount_types.remove(&key)?;
            count += 1;
        }
        for key in stale(self.sockets.keys(), |key| key.policy_id, live) {
            self.sockets.remove(&key)?;
            count += 1;
        }
        for key in stale(self.globs.keys(), |key| key.policy_id, live) {
            self.globs.remove(&key)?;
            count += 1;
        }
        for key in stale(self.rule_counts.keys(), |key| key.policy_id, live) {
            self.rule_counts.remove(&key)?;
            count += 1;
        }
        for key in stale(self.network.keys(), |key| key.data().policy_id, live) {
            self.network.remove(&key)?;
            count += 1;
        }
        for trie in [&mut self.prefixes, &mut self.suffixes] {
            for key in stale(trie.keys(), |key| key.data().policy_id, live) {
                trie.remove(&key)?;
                count += 1;
            }
        }
        Ok(count)
    }

    /// Whether this start found the pinned state not matching this build and replaced it.
    pub fn replaced_pinned_state(&self) -> bool {
        self.replaced_pinned_state
    }

    /// The audit event ring buffer, for one reader.
    pub fn take_events(&mut self) -> Option<RingBuf<MapData>> {
        self.events.take()
    }

    pub fn registry(&self) -> PolicyRegistry {
        self.registry.clone()
    }

    /// Installs `policy` on `target`, replacing the policy it had, atomically: the kernel sees
    /// the old policy or the new one, never a mix or nothing. An error means nothing changed.
    pub fn apply(&mut self, target: &Cgroup, policy: Arc<CompiledPolicy>) -> Result<(), MapError> {
        let policy_id = self.allocate_policy_id();
        if let Err(err) = self.write_entries(policy_id, &policy) {
            self.delete_entries(policy_id, &policy);
            return Err(err);
        }
        let installed = InstalledPolicy::new(policy.clone(), target.clone());
        self.registry.insert(policy_id, Arc::new(installed));
        let switched = self
            .targets
            .insert(target.id, Target { policy_id }, 0)
            .and_then(|()| {
                if self.installed.contains_key(&target.id) {
                    return Ok(());
                }
                // A new target: its level must be probed, or the entry above is never found.
                self.targets_per_level[target.level as usize] += 1;
                self.publish_levels().inspect_err(|_| {
                    self.targets_per_level[target.level as usize] -= 1;
                    let _ = self.targets.remove(&target.id);
                })
            });
        if let Err(err) = switched {
            self.delete_entries(policy_id, &policy);
            self.registry.retire(policy_id);
            return Err(err);
        }
        let new = Installed {
            policy_id,
            policy,
            level: target.level,
        };
        if let Some(old) = self.installed.insert(target.id, new) {
            self.retire(old);
        }
        Ok(())
    }

    /// Stops enforcing on the cgroup `target_id`. Returns whether it had a policy; an error
    /// means it still has it.
    pub fn remove(&mut self, target_id: u64) -> Result<bool, MapError> {
        if !self.installed.contains_key(&target_id) {
            return Ok(false);
        }
        self.targets.remove(&target_id)?;
        let old = self.installed.remove(&target_id).expect("checked above");
        self.targets_per_level[old.level as usize] -= 1;
        if let Err(err) = self.publish_levels() {
            // Harmless: one more level probed for nothing.
            warn!("updating the probed cgroup levels: {err}");
        }
        self.retire(old);
        Ok(true)
    }

    /// Forbids targets to change the file at `path` or, for a directory, its entries: the
    /// enforcing process's executable, policies and caches.
    pub fn protect(&mut self, path: &Path) -> Result<(), ProtectError> {
        self.protected.protect(path, Protection::Change).map(drop)
    }

    /// The handle through which the event file protects the files of its rotation.
    pub fn protected_files(&self) -> ProtectedFiles {
        self.protected.clone()
    }

    /// Arms the cgroup `name` below `parent` before it exists: when the kernel creates it, it
    /// becomes a target of `policy` before any process can enter it. Replaces an earlier stage of
    /// the same cgroup; an error means nothing changed.
    ///
    /// Invariant: every cgroup the kernel armed points at a policy whose entries exist. The
    /// kernel copies `pending` into `targets` on its own, at any moment, so a cgroup created
    /// while its stage is replaced may have been armed with the earlier version: those are
    /// re-pointed at the new version before the earlier one's entries are deleted.
    pub fn stage(
        &mut self,
        parent: &Cgroup,
        name: &str,
        policy: Arc<CompiledPolicy>,
    ) -> Result<(), StageError> {
        let key = pending_key(parent.id, name).ok_or_else(|| StageError::Name(name.to_owned()))?;
        let level = parent.level + 1;
        if level as usize >= self.targets_per_level.len() {
            return Err(StageError::TooDeep);
        }
        let staged = (parent.id, name.to_owned());
        // The same policy again: nothing to change.
        if self
            .staged
            .get(&staged)
            .is_some_and(|current| Arc::ptr_eq(&current.policy, &policy))
        {
            return Ok(());
        }
        let policy_id = self.allocate_policy_id();
        if let Err(err) = self.write_entries(policy_id, &policy) {
            self.delete_entries(policy_id, &policy);
            return Err(err.into());
        }
        let future = Cgroup {
            path: parent.path.join(name),
            id: 0,
            level,
        };
        self.registry.insert(
            policy_id,
            Arc::new(InstalledPolicy::new(policy.clone(), future)),
        );
        let is_new = !self.staged.contains_key(&staged);
        if is_new {
            // Probe the level before the cgroup can exist.
            self.targets_per_level[level as usize] += 1;
        }
        let armed = self
            .publish_levels()
            .and_then(|()| self.pending.insert(key, Target { policy_id }, 0));
        if let Err(err) = armed {
            if is_new {
                self.targets_per_level[level as usize] -= 1;
                let _ = self.publish_levels();
            }
            self.delete_entries(policy_id, &policy);
            self.registry.retire(policy_id);
            return Err(err.into());
        }
        let new = Installed {
            policy_id,
            policy,
            level,
        };
        if let Some(old) = self.staged.insert(staged, new) {
            match self.repoint_armed(old.policy_id, policy_id) {
                Ok(()) => self.retire(old),
                Err(err) => warn!(
                    policy_id = old.policy_id,
                    "cgroups armed with a replaced stage keep it until their policy is applied, \
                     its entries left in the maps: {err}"
                ),
            }
        }
        Ok(())
    }

    /// Points the cgroups the kernel armed with the staged policy `old` at `new`, which
    /// `pending` names already. Once the programs that read `old` from `pending` have finished,
    /// no cgroup can be armed with it any more: the scan that follows finds every one.
    fn repoint_armed(&mut self, old: u32, new: u32) -> Result<(), MapError> {
        self.wait_for_running_programs()?;
        for id in self.targets_with(|policy_id| policy_id == old) {
            self.targets.insert(id, Target { policy_id: new }, 0)?;
        }
        Ok(())
    }

    /// The cgroups in `targets` whose policy id `matches`.
    fn targets_with(&self, matches: impl Fn(u32) -> bool) -> Vec<u64> {
        self.targets
            .iter()
            .filter_map(Result::ok)
            .filter(|(_, target)| matches(target.policy_id))
            .map(|(id, _)| id)
            .collect()
    }

    /// Stops arming the cgroup `name` below `parent_id`. Call it once the cgroup has its own
    /// policy applied (or none is wanted): cgroups the kernel armed with the staged policy and
    /// that were not applied since lose it.
    pub fn unstage(&mut self, parent_id: u64, name: &str) -> Result<bool, StageError> {
        let Some(old) = self.staged.remove(&(parent_id, name.to_owned())) else {
            return Ok(false);
        };
        let key = pending_key(parent_id, name).ok_or_else(|| StageError::Name(name.to_owned()))?;
        self.pending.remove(&key)?;
        self.targets_per_level[old.level as usize] -= 1;
        if let Err(err) = self.publish_levels() {
            warn!("updating the probed cgroup levels: {err}");
        }
        self.retire(old);
        Ok(true)
    }

    /// Whether cgroup `target_id` is a target, of this agent or of an earlier one whose state it
    /// adopted. A map that cannot be read counts as yes.
    pub fn is_target(&self, target_id: u64) -> bool {
        !matches!(self.targets.get(&target_id, 0), Err(MapError::KeyNotFound))
    }

    /// Whether cgroup `name` below `parent_id` is armed, by this agent or an earlier one. A map
    /// that cannot be read counts as yes.
    pub fn is_armed(&self, parent_id: u64, name: &str) -> bool {
        pending_key(parent_id, name)
            .is_some_and(|key| !matches!(self.pending.get(&key, 0), Err(MapError::KeyNotFound)))
    }

    /// Cgroups this process made targets.
    pub fn target_count(&self) -> usize {
        self.installed.len()
    }

    pub fn stats(&self) -> Result<Stats, MapError> {
        let sum =
            |index: u32| -> Result<u64, MapError> { Ok(self.stats.get(&index, 0)?.iter().sum()) };
        Ok(Stats {
            events: sum(STAT_EVENTS)?,
            events_dropped: sum(STAT_EVENTS_DROPPED)?,
            events_throttled: sum(STAT_EVENTS_THROTTLED)?,
            undecided: sum(STAT_UNDECIDED)?,
            uncounted: sum(STAT_UNCOUNTED)?,
        })
    }

    /// Limits the audit events of each rule on each target to `rate` (None: no limit).
    /// Decisions are never limited, only their reports.
    pub fn set_audit_rate(&mut self, rate: Option<AuditRate>) -> Result<(), MapError> {
        let (interval, burst) = match rate {
            Some(AuditRate { per_second, burst }) if per_second > 0 => {
                let interval = 1_000_000_000 / u64::from(per_second);
                (interval, interval * u64::from(burst.max(1)))
            }
            _ => (0, 0),
        };
        self.config.audit_interval_ns = interval;
        self.config.audit_burst_ns = burst;
        self.publish_config()
    }

    /// Starts measuring what enforcement costs: the time of every decision about a target, by
    /// hook, and the kernel's run-time statistics of every program (which cost a clock read per
    /// run, system-wide, for as long as this enforcer lives).
    pub fn measure_cost(&mut self) -> Result<(), MeasureError> {
        self.measuring = Some(Measuring {
            _run_time_stats: aya::sys::enable_stats(aya::sys::Stats::RunTime)?,
            program_ids: self.program_ids()?,
        });
        self.config.measure_cost = 1;
        Ok(self.publish_config()?)
    }

    /// Decisions by rule, hook and action since this enforcer started, for the policies it
    /// installed (including those replaced or removed since).
    pub fn rule_counts(&self) -> Result<BTreeMap<RuleLabels, RuleCounts>, MapError> {
        let mut counts = self.retired_counts.clone();
        for entry in self.rule_counts.iter() {
            let (key, per_cpu) = entry?;
            if let Some(labels) = self.rule_labels(&key) {
                *counts.entry(labels).or_default() += sum_counts(&per_cpu);
            }
        }
        Ok(counts)
    }

    /// None for the entries of a policy an earlier agent installed.
    fn rule_labels(&self, key: &RuleKey) -> Option<RuleLabels> {
        let installed = self.registry.get(key.policy_id)?;
        Some(RuleLabels {
            policy: installed.policy.name.clone(),
            rule: installed.rule_name(key.rule_id)?.to_string(),
            hook: super::hook_name(key.hook),
            action: super::action_name(key.action),
        })
    }

    /// Moves the counts of a policy no program uses any more out of the kernel.
    fn fold_counts(&mut self, policy_id: u32) -> Result<(), MapError> {
        let keys: Vec<RuleKey> = self
            .rule_counts
            .keys()
            .filter_map(Result::ok)
            .filter(|key| key.policy_id == policy_id)
            .collect();
        for key in keys {
            let counts = sum_counts(&self.rule_counts.get(&key, 0)?);
            if let Some(labels) = self.rule_labels(&key) {
                *self.retired_counts.entry(labels).or_default() += counts;
            }
            self.rule_counts.remove(&key)?;
        }
        Ok(())
    }

    /// The decisions about targets in each hook and their time; empty unless measuring.
    pub fn decision_costs(&self) -> Result<Vec<DecisionCost>, MapError> {
        if self.measuring.is_none() {
            return Ok(Vec::new());
        }
        HOOKS
            .iter()
            .map(|hook| {
                let per_cpu = self.hook_cost.get(&hook.number, 0)?;
                Ok(DecisionCost {
                    hook: hook.name,
                    rule_class: hook.rule_class,
                    decisions: per_cpu.iter().map(|cost| cost.count).sum(),
                    time: Duration::from_nanos(per_cpu.iter().map(|cost| cost.ns).sum()),
                })
            })
            .collect()
    }

    /// The kernel's run-time statistics of each program; empty unless measuring.
    pub fn program_runs(&self) -> Vec<ProgramRuns> {
        let Some(measuring) = &self.measuring else {
            return Vec::new();
        };
        aya::programs::loaded_programs()
            .filter_map(Result::ok)
            .filter_map(|info| {
                let program = measuring.program_ids.get(&info.id())?;
                Some(ProgramRuns {
                    program,
                    runs: info.run_count(),
                    time: info.run_time(),
                })
            })
            .collect()
    }

    /// The ids of the attached programs, by the links they are attached through.
    fn program_ids(&self) -> Result<HashMap<u32, &'static str>, MeasureError> {
        let mut ids = HashMap::new();
        for name in PROGRAMS {
            let id = match &self.pinned {
                Some(state) => FdLink::from(aya::programs::links::PinnedLink::from_pin(
                    state.link(name),
                )?)
                .info()?
                .program_id(),
                None => self
                    ._ebpf
                    .program(name)
                    .ok_or(ProgramError::NotLoaded)?
                    .info()?
                    .id(),
            };
            ids.insert(id, *name);
        }
        Ok(ids)
    }

    fn allocate_policy_id(&mut self) -> u32 {
        let id = self.next_policy_id;
        self.next_policy_id = self.next_policy_id.checked_add(1).unwrap_or(1);
        id
    }

    fn publish_levels(&mut self) -> Result<(), MapError> {
        self.config.target_levels = self
            .targets_per_level
            .iter()
            .enumerate()
            .filter(|(_, count)| **count > 0)
            .fold(self.adopted_levels, |mask, (level, _)| mask | 1 << level);
        self.publish_config()
    }

    fn publish_config(&mut self) -> Result<(), MapError> {
        self.config_map.set(0, self.config, 0)
    }

    /// Deletes a policy's entries once no program can still be using them. The policy is no
    /// longer reachable: a failure here only leaves unused entries behind, so it is logged.
    fn retire(&mut self, old: Installed) {
        match self.wait_for_running_programs() {
            Ok(()) => {
                self.delete_entries(old.policy_id, &old.policy);
                if let Err(err) = self.fold_counts(old.policy_id) {
                    warn!(
                        policy_id = old.policy_id,
                        "decision counts of a replaced policy left in the kernel: {err}"
                    );
                }
            }
            Err(err) => warn!(
                policy_id = old.policy_id,
                "entries of a replaced policy left in the maps: {err}"
            ),
        }
        self.registry.retire(old.policy_id);
    }

    /// Returns once every BPF program that was running has finished (see `sync_barrier`).
    fn wait_for_running_programs(&mut self) -> Result<(), MapError> {
        self.sync_barrier.set(0, &self.sync_inner, 0)
    }

    fn write_entries(&mut self, policy_id: u32, policy: &CompiledPolicy) -> Result<(), MapError> {
        for (fs_type, verdict) in &policy.mount_types {
            self.mount_types
                .insert(mount_type_key(policy_id, fs_type), verdict, 0)?;
        }
        for (key, verdict) in &policy.sockets {
            self.sockets
                .insert(socket_key(policy_id, *key), verdict, 0)?;
        }
        for entry in &policy.network {
            self.network
                .insert(&network_key(policy_id, entry), entry.verdict, 0)?;
        }
        for (index, glob) in policy.globs.iter().enumerate() {
            self.globs.insert(glob_key(policy_id, index), glob, 0)?;
        }
        for TrieEntry { key, verdict } in &policy.suffixes {
            self.suffixes
                .insert(&trie_key(policy_id, key), verdict, 0)?;
        }
        for TrieEntry { key, verdict } in &policy.prefixes {
            self.prefixes
                .insert(&trie_key(policy_id, key), verdict, 0)?;
        }
        // Last: programs find a policy's other entries through this one.
        self.policies.insert(policy_id, policy.switches, 0)
    }

    /// Best effort: entries that were never written are simply absent.
    fn delete_entries(&mut self, policy_id: u32, policy: &CompiledPolicy) {
        let _ = self.policies.remove(&policy_id);
        for (fs_type, _) in &policy.mount_types {
            let _ = self.mount_types.remove(&mount_type_key(policy_id, fs_type));
        }
        for (key, _) in &policy.sockets {
            let _ = self.sockets.remove(&socket_key(policy_id, *key));
        }
        for entry in &policy.network {
            let _ = self.network.remove(&network_key(policy_id, entry));
        }
        for index in 0..policy.globs.len() {
            let _ = self.globs.remove(&glob_key(policy_id, index));
        }
        for entry in &policy.suffixes {
            let _ = self.suffixes.remove(&trie_key(policy_id, &entry.key));
        }
        for entry in &policy.prefixes {
            let _ = self.prefixes.remove(&trie_key(policy_id, &entry.key));
        }
    }
}

fn sum_counts(per_cpu: &[RuleCount]) -> RuleCounts {
    per_cpu
        .iter()
        .fold(RuleCounts::default(), |sum, count| RuleCounts {
            decisions: sum.decisions + count.decisions,
            throttled: sum.throttled + count.throttled,
        })
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
        let compiled = compile(file, &policy, &Environment::default(), &[]).unwrap();
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

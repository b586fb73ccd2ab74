//! The loaded programs and their maps, behind one owner. Policies are installed under fresh
//! policy ids and switched in with one map update (`swap`), so a replacement is atomic and never
//! reloads programs.

use std::{
    collections::{BTreeMap, HashSet},
    path::Path,
    sync::Arc,
};

use aya::maps::{Array, MapData, MapError, RingBuf};
use palisade_common::{Config, Gate, LEVELS_SHIFT};
use tracing::{info, warn};

use super::{
    DecisionCost, EnforceError, LoadError, MapSizes, Maps, MeasureError, OpenCache, PinnedState,
    PolicyRegistry, ProgramRuns, ProtectError, ProtectedFiles, Protection, RuleCounts, RuleLabels,
    Stats,
    counters::Counters,
    loader::Programs,
    records::{ModelRecords, Records},
    store::{PolicyMaps, PolicyStore, ProgramsBarrier},
    table::{Installed, LEVELS, Levels, Slot, TargetTable},
    target_filter::TargetFilter,
};
use crate::{
    policy::CompiledPolicy,
    targets::{Cgroup, Enforce, StageError},
};

#[derive(Debug, thiserror::Error)]
pub enum RetireError {
    #[error("removing pinned state: {0}")]
    Unpin(#[from] std::io::Error),
    #[error("removing stale entries: {0}")]
    Map(#[from] MapError),
}

/// How many audit events one rule may emit for one target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuditRate {
    pub per_second: u32,
    /// Events emitted at once after a quiet period (at least 1).
    pub burst: u32,
}

pub struct Enforcer {
    programs: Programs,
    sizes: MapSizes,
    config_map: Array<MapData, Config>,
    /// What `config_map` holds.
    config: Config,
    /// Whether `config` has levels, for the programs' first test.
    gate: Array<MapData, Gate>,
    table: TargetTable,
    store: PolicyStore,
    counters: Counters,
    protected: ProtectedFiles,
    /// Advanced after every change of targets and of the policies they point at.
    open_cache: OpenCache,
    models: ModelRecords,
    events: Option<RingBuf<MapData>>,
    /// Policies no slot points at any more, their entries not deleted yet: released, then
    /// awaiting the wait for the programs that may be reading them, then deletable.
    released: Vec<Installed>,
    /// Taken by `start_retiring`, until `finish_retiring`.
    awaiting: Vec<Installed>,
    /// No program can be reading them any more: `delete_retired` deletes their entries.
    deletable: Vec<Installed>,
    /// Whether a barrier `start_retiring` returned has not been reported to `finish_retiring`.
    barrier_out: bool,
    /// Taken where the barrier of the policies awaiting starts, if nothing was staged then: once
    /// it is passed, the target filter may be rebuilt.
    filter_checkpoint: Option<u64>,
}

impl Enforcer {
    /// Loads the programs, with maps of the default sizes, and attaches them to their LSM hooks,
    /// for as long as this process lives. Fails with a clear reason on a kernel where BPF LSM
    /// cannot run.
    pub fn load() -> Result<Self, LoadError> {
        Self::load_with(None, &MapSizes::default())
    }

    /// Loads with maps of `sizes`, and maps and links pinned in bpffs under `state`, so that
    /// enforcement continues when this process ends. What an earlier agent of this build left
    /// there is adopted as it is: its programs stay attached and its policies enforced until
    /// `retire_previous`.
    pub fn load_pinned(state: PinnedState, sizes: &MapSizes) -> Result<Self, LoadError> {
        Self::load_with(Some(state), sizes)
    }

    fn load_with(pinned: Option<PinnedState>, sizes: &MapSizes) -> Result<Self, LoadError> {
        let (programs, maps) = Programs::load(pinned, sizes)?;
        let Maps {
            config,
            gate,
            targets,
            pending,
            protected_inodes,
            policies,
            path_prefixes,
            path_suffixes,
            globs,
            inode_rules,
            mount_types,
            sockets,
            network,
            events,
            stats,
            rule_counts,
            hook_cost,
            model_records,
            sync_barrier,
            sync_inner,
        } = maps;
        let setup = |source| LoadError::MapSetup {
            name: "config",
            source,
        };
        // Maps a previous agent pinned: keep its targets probed and enforced (and its policy
        // ids unused).
        let pinned = config.get(&0, 0).map_err(setup)?;
        let adopted_levels = Levels {
            targets: pinned.target_levels,
            enforced: pinned.enforced_levels,
        };
        let fast_path_setup = |source| LoadError::MapSetup {
            name: "fast_path",
            source,
        };
        let fast_path = programs.fast_path()?;
        let filter = TargetFilter::new(fast_path).map_err(fast_path_setup)?;
        let open_cache = OpenCache::new(fast_path).map_err(fast_path_setup)?;
        let mut enforcer = Self {
            programs,
            sizes: *sizes,
            config_map: config,
            config: Config {
                protected_pid: std::process::id().into(),
                target_levels: adopted_levels.targets,
                enforced_levels: adopted_levels.enforced,
                ..Config::default()
            },
            gate,
            table: TargetTable::new(targets, pending, adopted_levels, filter),
            store: PolicyStore::new(
                PolicyMaps {
                    policies,
                    mount_types,
                    sockets,
                    network,
                    globs,
                    prefixes: path_prefixes,
                    suffixes: path_suffixes,
                    inode_rules,
                    barrier: ProgramsBarrier::new(sync_barrier, sync_inner),
                },
                *sizes,
            ),
            counters: Counters::new(stats, rule_counts, hook_cost),
            protected: ProtectedFiles::new(protected_inodes, open_cache.clone()),
            open_cache,
            models: ModelRecords::new(model_records),
            events: Some(events),
            released: Vec::new(),
            awaiting: Vec::new(),
            deletable: Vec::new(),
            barrier_out: false,
            filter_checkpoint: None,
        };
        // From here on, targets may not signal or trace this process.
        enforcer.publish_config().map_err(setup)?;
        Ok(enforcer)
    }

    /// Removes what earlier agents left in the kernel and this one did not take over: the pinned
    /// state of other builds (their programs detach; this build's enforce in their place) and
    /// the targets and policies this agent has not applied. Call it once every policy is
    /// applied, so that no target is left less protected than before.
    pub fn retire_previous(&mut self) -> Result<(), RetireError> {
        // Their entries are not live either: retired first, their decision counts kept.
        self.retire_released();
        self.programs.remove_other_builds()?;
        // Some may be removed even when it fails.
        let removed = self.table.remove_earlier();
        self.forget_opens();
        let (live, stale_targets) = removed?;
        self.protected.remove_others()?;
        self.publish_levels()?;
        let filter_checkpoint = self.table.filter_checkpoint();
        self.store.wait_for_running_programs()?;
        if let Some(checkpoint) = filter_checkpoint {
            self.table.rebuild_filter(checkpoint)?;
        }
        let stale_entries = self.store.purge_except(&live)?
            + self.counters.purge_except(&live)?
            + self.models.purge()?;
        if stale_targets > 0 || stale_entries > 0 {
            info!(
                targets = stale_targets,
                entries = stale_entries,
                "removed the targets and entries an earlier agent left"
            );
        }
        Ok(())
    }

    /// Whether this start found the pinned state not matching this build and replaced it.
    pub fn replaced_pinned_state(&self) -> bool {
        self.programs.replaced_pinned_state()
    }

    /// The audit event ring buffer, for one reader.
    pub fn take_events(&mut self) -> Option<RingBuf<MapData>> {
        self.events.take()
    }

    pub fn registry(&self) -> PolicyRegistry {
        self.store.registry().clone()
    }

    /// Installs `policy` on `target`, replacing the policy it had, atomically: the kernel sees
    /// the old policy or the new one, never a mix or nothing. An error means nothing changed.
    pub fn apply(
        &mut self,
        target: &Cgroup,
        policy: Arc<CompiledPolicy>,
    ) -> Result<(), EnforceError> {
        self.swap(Slot::Target(target.id), target.clone(), policy)
    }

    /// Stops enforcing on the cgroup `target_id`. Returns whether it had a policy; an error
    /// means it still has it.
    pub fn remove(&mut self, target_id: u64) -> Result<bool, MapError> {
        let Some(old) = self.table.remove(&Slot::Target(target_id))? else {
            return Ok(false);
        };
        self.release(old);
        Ok(true)
    }

    /// Arms the cgroup `name` below `parent` before it exists: when the kernel creates it, it
    /// becomes a target of `policy` before any process can enter it. Replaces an earlier stage of
    /// the same cgroup; an error means nothing changed.
    pub fn stage(
        &mut self,
        parent: &Cgroup,
        name: &str,
        policy: Arc<CompiledPolicy>,
    ) -> Result<(), StageError> {
        let slot = Slot::armed(parent.id, name).ok_or_else(|| StageError::Name(name.to_owned()))?;
        let level = parent.level + 1;
        if level >= LEVELS {
            return Err(StageError::TooDeep);
        }
        // The same policy again: nothing to change.
        if self
            .table
            .installed(&slot)
            .is_some_and(|current| Arc::ptr_eq(&current.policy, &policy))
        {
            return Ok(());
        }
        let future = Cgroup {
            path: parent.path.join(name),
            id: 0,
            level,
        };
        Ok(self.swap(slot, future, policy)?)
    }

    /// Stops arming the cgroup `name` below `parent_id`. Call it once the cgroup has its own
    /// policy applied (or none is wanted): cgroups the kernel armed with the staged policy and
    /// that were not applied since lose it.
    pub fn unstage(&mut self, parent_id: u64, name: &str) -> Result<bool, StageError> {
        let Some(slot) = Slot::armed(parent_id, name) else {
            return Ok(false);
        };
        let Some(old) = self.table.remove(&slot)? else {
            return Ok(false);
        };
        self.release(old);
        Ok(true)
    }

    /// Whether cgroup `target_id` is a target, of this agent or of an earlier one whose state it
    /// adopted. A map that cannot be read counts as yes.
    pub fn is_target(&self, target_id: u64) -> bool {
        self.table.holds(&Slot::Target(target_id))
    }

    /// Whether cgroup `name` below `parent_id` is armed, by this agent or an earlier one. A map
    /// that cannot be read counts as yes.
    pub fn is_armed(&self, parent_id: u64, name: &str) -> bool {
        Slot::armed(parent_id, name).is_some_and(|slot| self.table.holds(&slot))
    }

    /// Cgroups this process made targets.
    pub fn target_count(&self) -> usize {
        self.table.target_count()
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

    pub fn stats(&self) -> Result<Stats, MapError> {
        self.counters.stats()
    }

    /// Looks again for the inodes the targets' rules name (files are created and linked while
    /// the rules hold): for every target, or, `starting`, for those that had no process yet.
    pub fn find_named_inodes_again(&mut self, starting: bool) {
        if self.store.find_named_inodes_again(starting) {
            self.forget_opens();
        }
    }

    /// The opens of targets the open verdict cache answered without resolving their path. Apart
    /// from `stats`: it sums every slot of the cache, which only `/metrics` needs.
    pub fn opens_cached(&self) -> Result<u64, MapError> {
        self.open_cache.answered()
    }

    /// Decides every open of a target by its path from now on, never from the open verdict
    /// cache: what the cache saves is measured against this. Until the programs are loaded
    /// again (or adopted).
    pub fn turn_open_cache_off(&self) {
        self.open_cache.turn_off();
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
        self.counters.start_measuring(self.programs.ids()?)?;
        self.config.measure_cost = 1;
        Ok(self.publish_config()?)
    }

    /// Decisions by rule, hook and action since this enforcer started, for the policies it
    /// installed (a replaced policy's counts included; a policy no target here has any more,
    /// only until its entries are deleted).
    pub fn rule_counts(&self) -> Result<BTreeMap<RuleLabels, RuleCounts>, MapError> {
        self.counters.rule_counts(self.store.registry())
    }

    /// The decisions about targets in each hook and their time; empty unless measuring.
    pub fn decision_costs(&self) -> Result<Vec<DecisionCost>, MapError> {
        self.counters.decision_costs()
    }

    /// The kernel's run-time statistics of each program; empty unless measuring.
    pub fn program_runs(&self) -> Vec<ProgramRuns> {
        self.counters.program_runs()
    }

    /// The one way a slot gets a policy, for targets and armed cgroups alike: the policy's
    /// entries are written under a new policy id, the new policy's level is probed (and
    /// enforced, unless it is AlwaysAllow), the slot is pointed at the id in one map update (the
    /// kernel sees the old policy or the new, never a mix or none), then the old policy's level
    /// is released (its entries deleted by `retire_released`, once no program can be reading
    /// them). An error means nothing changed.
    ///
    /// Invariant: every cgroup the kernel armed points at a policy whose entries exist. The
    /// kernel copies `pending` into `targets` on its own, at any moment, so a cgroup created
    /// while its stage is replaced may have been armed with the earlier version: those are
    /// re-pointed at the new version before the earlier one's entries are deleted.
    fn swap(
        &mut self,
        slot: Slot,
        target: Cgroup,
        policy: Arc<CompiledPolicy>,
    ) -> Result<(), EnforceError> {
        let level = target.level;
        let replaced = self.table.installed(&slot).map(|current| current.policy_id);
        let policy_id = match self.store.add(&policy, target.clone(), replaced) {
            // Room the replaced policies hold: freed now rather than later.
            Err(EnforceError::Full { .. }) if self.has_released() => {
                self.retire_released();
                self.store.add(&policy, target, replaced)?
            }
            added => added?,
        };
        let new = Installed {
            policy_id,
            policy,
            level,
        };
        // Probed and enforced before the kernel can find the entry, or it is never found (or
        // never enforced).
        self.table.count_level(&new, 1);
        let pointed = self
            .publish_levels()
            .map_err(EnforceError::from)
            .and_then(|()| {
                self.table.point(&slot, policy_id).map_err(|err| {
                    let map = match slot {
                        Slot::Target(_) => "targets",
                        Slot::Armed { .. } => "pending",
                    };
                    self.sizes.full_or(map, err)
                })
            });
        if let Err(err) = pointed {
            self.table.count_level(&new, -1);
            let _ = self.publish_levels();
            self.store.discard(policy_id, &new.policy);
            return Err(err);
        }
        // A cgroup in a target until now, or in another one.
        self.forget_opens();
        let armed = matches!(slot, Slot::Armed { .. });
        let Some(old) = self.table.record(slot, new) else {
            return Ok(());
        };
        if armed {
            // Once the programs that read the old id from `pending` have finished, no cgroup
            // can be armed with it any more: the scan that follows finds every one.
            let repointed = self
                .store
                .wait_for_running_programs()
                .and_then(|()| self.table.repoint(old.policy_id, policy_id));
            if let Err(err) = repointed {
                // Some may be repointed.
                self.forget_opens();
                warn!(
                    policy_id = old.policy_id,
                    "cgroups armed with a replaced stage keep it until their policy is applied, \
                     its entries left in the maps and its level probed until the agent restarts: \
                     {err}"
                );
                return Ok(());
            }
        }
        self.release(old);
        Ok(())
    }

    /// Once no slot points at `old`: its level is no longer probed (nor enforced) for it, and
    /// its policy waits for `retire_released`.
    fn release(&mut self, old: Installed) {
        self.forget_opens();
        self.table.count_level(&old, -1);
        if let Err(err) = self.publish_levels() {
            // Harmless: a level probed, or enforced, for nothing.
            warn!("updating the probed and enforced cgroup levels: {err}");
        }
        self.released.push(old);
    }

    /// The policy ids whose entries are in the kernel: those slots point at, those released and
    /// not retired yet, and what an earlier agent left.
    pub fn stored_policy_ids(&self) -> Result<HashSet<u32>, MapError> {
        self.store.stored_ids()
    }

    /// Whether policies no slot points at any more still have entries.
    pub fn has_released(&self) -> bool {
        !(self.released.is_empty() && self.awaiting.is_empty() && self.deletable.is_empty())
    }

    /// Deletes the entries of the policies no slot points at any more, after one wait for the
    /// programs that may still be using them: a change to many targets, or many changes in a
    /// row, wait once. Their entries stay until then, unreachable. A failure here only leaves
    /// unused entries behind, so it is logged.
    pub fn retire_released(&mut self) {
        if !(self.released.is_empty() && self.awaiting.is_empty()) {
            self.awaiting.append(&mut self.released);
            self.filter_checkpoint = self.table.filter_checkpoint();
            let waited = self.store.wait_for_running_programs();
            self.waited(waited);
        }
        self.delete_retired(usize::MAX);
    }

    /// `retire_released` in steps, so that a policy change need not wait behind it: takes the
    /// policies released so far and returns the barrier to wait on (a grace period, up to tens
    /// of milliseconds: off the caller's thread); `finish_retiring` takes its result, then
    /// `delete_retired` deletes their entries a few policies at a time. None unless
    /// `can_start_retiring`.
    pub fn start_retiring(&mut self) -> Option<ProgramsBarrier> {
        if !self.can_start_retiring() {
            return None;
        }
        self.awaiting.append(&mut self.released);
        self.barrier_out = true;
        self.filter_checkpoint = self.table.filter_checkpoint();
        Some(self.store.barrier())
    }

    /// Whether policies were released since the last `start_retiring`, whose barrier is back.
    pub fn can_start_retiring(&self) -> bool {
        !self.released.is_empty() && !self.barrier_out
    }

    /// The policies `start_retiring` took become deletable once its barrier returned `waited`;
    /// those released since wait for the next barrier.
    pub fn finish_retiring(&mut self, waited: Result<(), MapError>) {
        self.barrier_out = false;
        self.waited(waited);
    }

    fn waited(&mut self, waited: Result<(), MapError>) {
        let filter_checkpoint = self.filter_checkpoint.take();
        match waited {
            Ok(()) => {
                self.deletable.append(&mut self.awaiting);
                if let Some(checkpoint) = filter_checkpoint
                    && let Err(err) = self.table.rebuild_filter(checkpoint)
                {
                    // Harmless: bits of former targets cost their cgroups a lookup.
                    warn!("clearing the target filter of former targets: {err}");
                }
            }
            Err(err) => {
                for old in std::mem::take(&mut self.awaiting) {
                    warn!(
                        policy_id = old.policy_id,
                        "entries of a replaced policy left in the maps: {err}"
                    );
                    self.store.forget(old.policy_id);
                }
            }
        }
    }

    /// Whether `delete_retired` has work.
    pub fn has_deletable(&self) -> bool {
        !self.deletable.is_empty()
    }

    /// Deletes the entries of at most `limit` deletable policies and folds their decision
    /// counts.
    pub fn delete_retired(&mut self, limit: usize) {
        let count = limit.min(self.deletable.len());
        if count == 0 {
            return;
        }
        let deleted: Vec<Installed> = self.deletable.drain(..count).collect();
        for old in &deleted {
            self.store.delete_entries(old.policy_id, &old.policy);
        }
        let ids: HashSet<u32> = deleted.iter().map(|old| old.policy_id).collect();
        if let Err(err) = self.counters.fold(&ids, self.store.registry()) {
            warn!(
                ?ids,
                "decision counts of replaced policies left in the kernel: {err}"
            );
        }
        // Names still installed, or with ids not deleted yet (whose counts are still read from
        // the kernel: forgetting the folded part now would take the counter down).
        let mut live = self.table.policy_names();
        live.extend(
            self.released
                .iter()
                .chain(&self.awaiting)
                .chain(&self.deletable)
                .map(|old| old.policy.name()),
        );
        self.counters.forget_retired_except(&live);
        for id in ids {
            self.store.forget(id);
        }
    }

    /// After a change of targets: every open is decided again.
    fn forget_opens(&self) {
        self.open_cache.forget();
    }

    /// Publishes the table's levels, if they changed.
    fn publish_levels(&mut self) -> Result<(), MapError> {
        let Levels { targets, enforced } = self.table.levels();
        if (targets, enforced) == (self.config.target_levels, self.config.enforced_levels) {
            return Ok(());
        }
        self.config.target_levels = targets;
        self.config.enforced_levels = enforced;
        self.publish_config()
    }

    /// Writes `config`, then the gate, its levels as the programs read them. `config` first: it
    /// is what an agent restarting adopts, the gate being set back to its initial value then.
    /// The open verdict cache starts a new epoch before: while the gate enforced nothing,
    /// lsm/d_instantiate kept no slot.
    fn publish_config(&mut self) -> Result<(), MapError> {
        self.config_map.set(0, self.config, 0)?;
        self.forget_opens();
        let levels = self.config.target_levels;
        let first = u64::from(levels.trailing_zeros() % 64); // 0 with no level
        let gate = Gate {
            levels: (levels >> first) << LEVELS_SHIFT | first,
            enforced: (self.config.enforced_levels != 0).into(),
            reserved: 0,
        };
        self.gate.set(0, gate, 0)
    }
}

impl Enforce for Enforcer {
    fn apply(&mut self, target: &Cgroup, policy: Arc<CompiledPolicy>) -> Result<(), EnforceError> {
        Enforcer::apply(self, target, policy)
    }

    fn remove(&mut self, target_id: u64) -> Result<bool, MapError> {
        Enforcer::remove(self, target_id)
    }

    fn stage(
        &mut self,
        parent: &Cgroup,
        name: &str,
        policy: Arc<CompiledPolicy>,
    ) -> Result<(), StageError> {
        Enforcer::stage(self, parent, name, policy)
    }

    fn unstage(&mut self, parent_id: u64, name: &str) -> Result<bool, StageError> {
        Enforcer::unstage(self, parent_id, name)
    }

    fn is_target(&self, target_id: u64) -> bool {
        Enforcer::is_target(self, target_id)
    }

    fn is_armed(&self, parent_id: u64, name: &str) -> bool {
        Enforcer::is_armed(self, parent_id, name)
    }

    fn open_model(&mut self) -> Result<u32, EnforceError> {
        self.models
            .open()
            .map_err(|err| self.sizes.full_or("model_records", err))
    }

    fn take_model_records(&mut self) -> Result<Records, MapError> {
        self.models.take()
    }

    fn close_model(&mut self, model_id: u32) -> Result<(), MapError> {
        self.models.close(model_id)
    }
}

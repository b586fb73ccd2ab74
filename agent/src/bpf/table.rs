//! Which policy id each target has: cgroups in `targets`, and cgroups not created yet armed in
//! `pending` (the kernel copies their entry into `targets` when it creates them), with the
//! cgroup levels the programs probe and those where a policy has them decide anything, and the
//! filter of the cgroups that may be targets.

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
};

use aya::maps::{HashMap as BpfHashMap, MapData, MapError};
use palisade_common::{MAX_LEVEL, PendingKey, Target};

use super::{layout::pending_key, target_filter::TargetFilter};
use crate::policy::CompiledPolicy;

/// Cgroup levels the programs can probe (the kernel's config holds them as a mask).
pub(super) const LEVELS: u32 = MAX_LEVEL + 1;

/// Cgroup levels, as masks (bit L: level L), of the kernel's config.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Levels {
    /// Where some target or stage sits: the levels the programs probe.
    pub targets: u64,
    /// Where some target or stage has a policy other than AlwaysAllow: while there is none,
    /// the programs decide nothing.
    pub enforced: u64,
}

/// Policies that slots point at, at one cgroup level.
#[derive(Debug, Clone, Copy, Default)]
struct LevelCount {
    all: u32,
    /// Those that are not AlwaysAllow.
    enforced: u32,
}

/// Where a policy is enforced: a cgroup's entry in `targets`, or one armed in `pending`.
pub(super) enum Slot {
    Target(u64),
    Armed {
        parent_id: u64,
        name: String,
        key: PendingKey,
    },
}

impl Slot {
    /// The slot arming the cgroup `name` below `parent_id`; None for a name the kernel cannot
    /// arm.
    pub fn armed(parent_id: u64, name: &str) -> Option<Self> {
        Some(Slot::Armed {
            parent_id,
            name: name.to_owned(),
            key: pending_key(parent_id, name)?,
        })
    }
}

/// A policy a slot points at.
pub(super) struct Installed {
    pub policy_id: u32,
    pub policy: Arc<CompiledPolicy>,
    /// The level of the cgroup (to be).
    pub level: u32,
}

pub(super) struct TargetTable {
    targets: BpfHashMap<MapData, u64, Target>,
    pending: BpfHashMap<MapData, PendingKey, Target>,
    installed: HashMap<u64, Installed>,
    /// By (parent id, name).
    staged: HashMap<(u64, String), Installed>,
    per_level: [LevelCount; LEVELS as usize],
    /// Levels of the targets a previous agent left in pinned maps, kept until `remove_earlier`.
    adopted_levels: Levels,
    filter: TargetFilter,
    /// Entries written to `pending` so far: the filter is rebuilt only if none was since a
    /// moment nothing was staged.
    stages_written: u64,
}

impl TargetTable {
    pub fn new(
        targets: BpfHashMap<MapData, u64, Target>,
        pending: BpfHashMap<MapData, PendingKey, Target>,
        adopted_levels: Levels,
        filter: TargetFilter,
    ) -> Self {
        Self {
            targets,
            pending,
            installed: HashMap::new(),
            staged: HashMap::new(),
            per_level: [LevelCount::default(); LEVELS as usize],
            adopted_levels,
            filter,
            stages_written: 0,
        }
    }

    pub fn levels(&self) -> Levels {
        let mut levels = self.adopted_levels;
        for (level, count) in self.per_level.iter().enumerate() {
            if count.all > 0 {
                levels.targets |= 1 << level;
            }
            if count.enforced > 0 {
                levels.enforced |= 1 << level;
            }
        }
        levels
    }

    pub fn installed(&self, slot: &Slot) -> Option<&Installed> {
        match slot {
            Slot::Target(id) => self.installed.get(id),
            Slot::Armed {
                parent_id, name, ..
            } => self.staged.get(&(*parent_id, name.clone())),
        }
    }

    /// Counts a policy a slot points at (`by` +1), or no longer does (-1), at its level.
    pub fn count_level(&mut self, installed: &Installed, by: i32) {
        let count = &mut self.per_level[installed.level as usize];
        let add = |count: u32| {
            count
                .checked_add_signed(by)
                .expect("counted once per policy a slot points at")
        };
        count.all = add(count.all);
        if !installed.policy.always_allow() {
            count.enforced = add(count.enforced);
        }
    }

    /// Points `slot` at `policy_id` in the kernel: one map update (a cgroup's bit in the filter
    /// set first).
    pub fn point(&mut self, slot: &Slot, policy_id: u32) -> Result<(), MapError> {
        let target = Target { policy_id };
        match slot {
            Slot::Target(id) => {
                self.filter.mark(*id);
                self.targets.insert(id, target, 0)
            }
            Slot::Armed { key, .. } => {
                self.stages_written += 1;
                self.pending.insert(key, target, 0)
            }
        }
    }

    /// Where a rebuild of the filter may start, when nothing is staged (an earlier agent's
    /// stages included): then no program can set a bit but one that found a stage before.
    pub fn filter_checkpoint(&self) -> Option<u64> {
        self.pending
            .keys()
            .next()
            .is_none()
            .then_some(self.stages_written)
    }

    /// Clears the filter's bits of cgroups no longer targets, if nothing was staged since
    /// `checkpoint` and every program running then has finished since: each target the kernel
    /// armed is in `targets`.
    pub fn rebuild_filter(&self, checkpoint: u64) -> Result<(), MapError> {
        if checkpoint != self.stages_written {
            return Ok(());
        }
        let targets: Vec<u64> = self.targets.keys().collect::<Result<_, _>>()?;
        self.filter.rebuild(targets);
        Ok(())
    }

    /// Records what `slot` points at now; returns what it pointed at before.
    pub fn record(&mut self, slot: Slot, installed: Installed) -> Option<Installed> {
        match slot {
            Slot::Target(id) => self.installed.insert(id, installed),
            Slot::Armed {
                parent_id, name, ..
            } => self.staged.insert((parent_id, name), installed),
        }
    }

    /// Empties `slot` in the kernel; returns what it pointed at, if this table filled it. An
    /// error means it still points there.
    pub fn remove(&mut self, slot: &Slot) -> Result<Option<Installed>, MapError> {
        Ok(match slot {
            Slot::Target(id) => {
                if !self.installed.contains_key(id) {
                    return Ok(None);
                }
                self.targets.remove(id)?;
                self.installed.remove(id)
            }
            Slot::Armed {
                parent_id,
                name,
                key,
            } => {
                let staged = (*parent_id, name.clone());
                if !self.staged.contains_key(&staged) {
                    return Ok(None);
                }
                self.pending.remove(key)?;
                self.staged.remove(&staged)
            }
        })
    }

    /// Whether the kernel has an entry for `slot`, this table's or an earlier agent's. A map
    /// that cannot be read counts as yes.
    pub fn holds(&self, slot: &Slot) -> bool {
        let found = match slot {
            Slot::Target(id) => self.targets.get(id, 0).map(drop),
            Slot::Armed { key, .. } => self.pending.get(key, 0).map(drop),
        };
        !matches!(found, Err(MapError::KeyNotFound))
    }

    /// Points the cgroups in `targets` that point at `old` at `new`.
    pub fn repoint(&mut self, old: u32, new: u32) -> Result<(), MapError> {
        for id in self.targets_with(|policy_id| policy_id == old) {
            self.targets.insert(id, Target { policy_id: new }, 0)?;
        }
        Ok(())
    }

    /// Removes the entries this table did not make (an earlier agent's) and stops probing their
    /// levels; returns the policy ids its own entries point at, and how many it removed.
    pub fn remove_earlier(&mut self) -> Result<(HashSet<u32>, usize), MapError> {
        // Staged policies stay too: the kernel arms cgroups with them on its own.
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
        self.adopted_levels = Levels::default();
        Ok((live, stale.len()))
    }

    /// The names of the policies installed or staged.
    pub fn policy_names(&self) -> HashSet<&str> {
        self.installed
            .values()
            .chain(self.staged.values())
            .map(|installed| installed.policy.name())
            .collect()
    }

    /// Cgroups this table made targets.
    pub fn target_count(&self) -> usize {
        self.installed.len()
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
}

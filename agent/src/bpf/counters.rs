//! What the kernel counts: events and undecided operations, decisions by rule (kept for the
//! policies replaced since), and, while measured, the time decisions take.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    os::fd::OwnedFd,
    time::Duration,
};

use aya::{
    maps::{MapData, MapError, PerCpuArray, PerCpuHashMap},
    programs::ProgramError,
};
use palisade_common::{
    HookCost, RuleCount, RuleKey, STAT_EVENTS, STAT_EVENTS_DROPPED, STAT_EVENTS_REPEATED,
    STAT_EVENTS_THROTTLED, STAT_MODEL_DROPPED, STAT_UNCOUNTED, STAT_UNDECIDED,
};

use super::{HOOKS, PolicyRegistry};

/// Kernel counters, summed over CPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    pub events: u64,
    pub events_dropped: u64,
    /// Audit events suppressed by the audit rate of their rule and target.
    pub events_throttled: u64,
    /// Events of DefenseInDepth trials not sent: their operation was reported already.
    pub events_repeated: u64,
    /// Operations on targets allowed because they could not be decided.
    pub undecided: u64,
    /// Decisions not counted by rule (the counter map was full).
    pub uncounted: u64,
    /// Behaviour records lost: the record map full, and the model not open (its overflow
    /// record missing).
    pub model_dropped: u64,
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

pub(super) struct Counters {
    stats: PerCpuArray<MapData, u64>,
    rule_counts: PerCpuHashMap<MapData, RuleKey, RuleCount>,
    /// Counts of earlier versions of the policies installed, which left `rule_counts`.
    retired_counts: BTreeMap<RuleLabels, RuleCounts>,
    hook_cost: PerCpuArray<MapData, HookCost>,
    /// While measuring cost.
    measuring: Option<Measuring>,
}

impl Counters {
    pub fn new(
        stats: PerCpuArray<MapData, u64>,
        rule_counts: PerCpuHashMap<MapData, RuleKey, RuleCount>,
        hook_cost: PerCpuArray<MapData, HookCost>,
    ) -> Self {
        Self {
            stats,
            rule_counts,
            retired_counts: BTreeMap::new(),
            hook_cost,
            measuring: None,
        }
    }

    pub fn stats(&self) -> Result<Stats, MapError> {
        let sum =
            |index: u32| -> Result<u64, MapError> { Ok(self.stats.get(&index, 0)?.iter().sum()) };
        Ok(Stats {
            events: sum(STAT_EVENTS)?,
            events_dropped: sum(STAT_EVENTS_DROPPED)?,
            events_throttled: sum(STAT_EVENTS_THROTTLED)?,
            events_repeated: sum(STAT_EVENTS_REPEATED)?,
            undecided: sum(STAT_UNDECIDED)?,
            uncounted: sum(STAT_UNCOUNTED)?,
            model_dropped: sum(STAT_MODEL_DROPPED)?,
        })
    }

    /// Keeps the kernel's run-time statistics on, and the ids of the attached programs.
    pub fn start_measuring(
        &mut self,
        program_ids: HashMap<u32, &'static str>,
    ) -> Result<(), MeasureError> {
        self.measuring = Some(Measuring {
            _run_time_stats: aya::sys::enable_stats(aya::sys::Stats::RunTime)?,
            program_ids,
        });
        Ok(())
    }

    /// Decisions by rule, hook and action for the policies `registry` names, and those folded
    /// in from earlier versions of the policies still installed.
    pub fn rule_counts(
        &self,
        registry: &PolicyRegistry,
    ) -> Result<BTreeMap<RuleLabels, RuleCounts>, MapError> {
        let mut counts = self.retired_counts.clone();
        for entry in self.rule_counts.iter() {
            let (key, per_cpu) = entry?;
            if let Some(labels) = rule_labels(registry, &key) {
                *counts.entry(labels).or_default() += sum_counts(&per_cpu);
            }
        }
        Ok(counts)
    }

    /// Moves the counts of policies no program uses any more out of the kernel.
    pub fn fold(
        &mut self,
        policy_ids: &HashSet<u32>,
        registry: &PolicyRegistry,
    ) -> Result<(), MapError> {
        let keys: Vec<RuleKey> = self
            .rule_counts
            .keys()
            .filter_map(Result::ok)
            .filter(|key| policy_ids.contains(&key.policy_id))
            .collect();
        for key in keys {
            let counts = sum_counts(&self.rule_counts.get(&key, 0)?);
            if let Some(labels) = rule_labels(registry, &key) {
                *self.retired_counts.entry(labels).or_default() += counts;
            }
            self.rule_counts.remove(&key)?;
        }
        Ok(())
    }

    /// Forgets the folded counts of the policies not named in `live`: a policy no target has
    /// any more leaves the exposition (a replaced one's counts carry on under its name).
    pub fn forget_retired_except(&mut self, live: &HashSet<&str>) {
        self.retired_counts
            .retain(|labels, _| live.contains(labels.policy.as_str()));
    }

    /// Deletes the counts of every policy id not in `live`; returns how many.
    pub fn purge_except(&mut self, live: &HashSet<u32>) -> Result<usize, MapError> {
        let stale: Vec<RuleKey> = self
            .rule_counts
            .keys()
            .filter_map(Result::ok)
            .filter(|key| !live.contains(&key.policy_id))
            .collect();
        for key in &stale {
            self.rule_counts.remove(key)?;
        }
        Ok(stale.len())
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
}

/// None for the entries of a policy an earlier agent installed.
fn rule_labels(registry: &PolicyRegistry, key: &RuleKey) -> Option<RuleLabels> {
    let installed = registry.get(key.policy_id)?;
    Some(RuleLabels {
        policy: installed.policy.name().to_owned(),
        rule: installed.rule_name(key.rule_id)?.to_string(),
        hook: super::hook_name(key.hook),
        action: super::action_name(key.action),
    })
}

fn sum_counts(per_cpu: &[RuleCount]) -> RuleCounts {
    per_cpu
        .iter()
        .fold(RuleCounts::default(), |sum, count| RuleCounts {
            decisions: sum.decisions + count.decisions,
            throttled: sum.throttled + count.throttled,
        })
}

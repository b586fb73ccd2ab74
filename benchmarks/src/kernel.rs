//! The kernel benchmark's results: what `kernel-bench` measures inside the VM (one file per
//! kernel) and `kernel-report` turns into tables and plots.

use serde::{Deserialize, Serialize};

/// The states measured in every round, in the order a round visits them.
pub const STATES: &[(&str, &str)] = &[
    ("S0", "no programs"),
    ("floor", "an empty program on each of the agent's hooks"),
    (
        "d_path",
        "the floor, file_open resolving each opened file's path: the least a decision by path costs",
    ),
    ("S1", "agent attached, no target"),
    ("S2", "target in AlwaysAllow"),
    ("S3", "target in RuntimeDefault"),
    ("S4-1", "EnhanceProtect: built-in rules + 1 custom rule"),
    ("S4-8", "EnhanceProtect: built-in rules + 8 custom rules"),
    ("S4-64", "EnhanceProtect: built-in rules + 64 custom rules"),
    (
        "S4-1024",
        "EnhanceProtect: built-in rules + 1024 custom rules",
    ),
    (
        "S4-10000",
        "EnhanceProtect: built-in rules + 10000 custom rules",
    ),
    (
        "S5",
        "S4-1 and the deny path: open_denied is refused, each denial reported",
    ),
    (
        "S6",
        "S4-1 and 1000 audit events per second from the target",
    ),
    (
        "S7",
        "DefenseInDepth: S4-8's rules on top of an allowlist of 8 directories and the rest",
    ),
    (
        "S9",
        "S4-8 on the target, the benchmarks in a cgroup outside it: a process that is not a target",
    ),
    (
        "S8",
        "S4-10000 with the open verdict cache off (agent --no-open-cache)",
    ),
];

/// The states real workloads run in.
pub const WORKLOAD_STATES: &[&str] = &["S0", "S2", "S4-64"];

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct KernelRun {
    pub environment: Environment,
    pub micro: Vec<MicroSample>,
    pub workloads: Vec<WorkloadSample>,
    pub hooks: Vec<HookCost>,
    pub footprint: Vec<Footprint>,
    pub apply_latency: Vec<ApplySample>,
    pub throughput: Vec<ThroughputSample>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Environment {
    /// `uname -r`.
    pub kernel: String,
    /// /sys/kernel/security/lsm.
    pub lsm: String,
    pub cpu: String,
    /// "icount" when guest nanoseconds count executed instructions, "tcg" otherwise.
    pub clock: String,
    pub rounds: usize,
    pub smoke: bool,
}

/// One microbenchmark run: `ops` operations in one process inside the target cgroup.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MicroSample {
    pub state: String,
    pub round: usize,
    pub bench: String,
    pub ops: u64,
    pub ns_per_op: f64,
}

/// One run of a real workload (server in the target, client outside).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkloadSample {
    pub state: String,
    pub round: usize,
    pub workload: String,
    /// Higher is better.
    pub value: f64,
    pub unit: String,
}

/// The kernel's run-time statistics of one program over one microbenchmark of one state.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HookCost {
    pub state: String,
    /// Empty in runs that did not tell the microbenchmarks apart: their whole pass.
    #[serde(default)]
    pub bench: String,
    pub program: String,
    pub runs: u64,
    pub ns_per_run: f64,
}

/// The agent enforcing `policies` policy files over `cgroups` cgroups with a process each.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Footprint {
    pub policies: usize,
    pub cgroups: usize,
    pub rss_bytes: u64,
    pub map_bytes: u64,
    /// The agent's CPU time per second while nothing happens.
    pub idle_cpu: f64,
    /// From writing the policy files to the agent reporting them all enforced.
    pub apply_seconds: f64,
}

/// One policy file change: to the first read the target was refused, and back.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ApplySample {
    pub trial: usize,
    pub enforce_ns: u64,
    pub lift_ns: u64,
}

/// Violations offered at a fixed rate for a while, and what became of them.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ThroughputSample {
    /// 0: as fast as the generator can.
    pub offered_per_second: u64,
    pub seconds: f64,
    /// Denials the generator saw.
    pub produced: u64,
    /// Events the kernel put in the ring buffer.
    pub submitted: u64,
    /// Events lost because the ring buffer was full.
    pub dropped: u64,
    /// Events held back by the per-rule rate limit.
    pub throttled: u64,
    /// Events the rule module kept.
    pub kept: u64,
    /// Events the rule module dropped.
    #[serde(default)]
    pub module_dropped: u64,
    /// Events the agent read and dropped: its queue overflowed, or the record was no event.
    #[serde(default)]
    pub agent_dropped: u64,
    /// Events the agent read and had not written yet when the sample ended.
    #[serde(default)]
    pub queued: u64,
    /// Events written by the sink.
    pub written: u64,
    pub agent_cpu_seconds: f64,
    /// Of `agent_cpu_seconds`, the time in the kernel (reading the ring buffer, writing the
    /// events file, waking threads).
    #[serde(default)]
    pub agent_system_seconds: f64,
    pub agent_rss_bytes: u64,
}

/// `kernel-bench soak`: the agent for many minutes under a flood above and below its
/// sustainable rate, a policy file rewritten every few seconds and a module's config swapped,
/// sampled every minute.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SoakRun {
    pub environment: Environment,
    /// The agent's CPU limit, in percent of one CPU (its cgroup's `cpu.max`).
    pub agent_cpu_percent: u64,
    pub samples: Vec<SoakSample>,
}

/// The agent at the end of one minute, once the events of that minute are drained. Counts are
/// totals since the soak began.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SoakSample {
    pub minute: u64,
    pub rss_bytes: u64,
    /// BPF map memory, as the agent reports it.
    pub map_bytes: u64,
    /// Denials the generators saw.
    pub produced: u64,
    pub written: u64,
    /// Dropped by the rule module's verdict.
    pub module_dropped: u64,
    /// Dropped by the agent: its queue overflowed, or the record was no event.
    pub agent_dropped: u64,
    /// Dropped in the kernel: the ring buffer was full.
    pub kernel_dropped: u64,
    pub throttled: u64,
    /// Read and not written yet.
    pub queued: u64,
    pub policy_writes: u64,
    pub config_swaps: u64,
}

impl SoakSample {
    /// produced - (written + every kind of drop + throttled + queued): 0 when every event is
    /// accounted for.
    pub fn unaccounted(&self) -> i128 {
        i128::from(self.produced)
            - [
                self.written,
                self.module_dropped,
                self.agent_dropped,
                self.kernel_dropped,
                self.throttled,
                self.queued,
            ]
            .into_iter()
            .map(i128::from)
            .sum::<i128>()
    }
}

/// Median and spread of some samples.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Spread {
    pub fn of(values: impl IntoIterator<Item = f64>) -> Option<Self> {
        let mut values: Vec<f64> = values.into_iter().collect();
        if values.is_empty() {
            return None;
        }
        values.sort_by(f64::total_cmp);
        let middle = values.len() / 2;
        let median = if values.len().is_multiple_of(2) {
            (values[middle - 1] + values[middle]) / 2.0
        } else {
            values[middle]
        };
        Some(Self {
            median,
            min: values[0],
            max: values[values.len() - 1],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_takes_the_middle_of_sorted_values() {
        let spread = Spread::of([3.0, 1.0, 2.0, 10.0]).unwrap();
        assert_eq!(spread.median, 2.5);
        assert_eq!((spread.min, spread.max), (1.0, 10.0));
        assert_eq!(Spread::of([5.0]).unwrap().median, 5.0);
        assert!(Spread::of([]).is_none());
    }
}

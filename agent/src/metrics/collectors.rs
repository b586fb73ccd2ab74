//! What is read when `/metrics` is scraped: the kernel's counters (from the latest snapshot),
//! the agent process's CPU time and memory, and the memory of its BPF maps.

use std::{
    path::Path,
    sync::{Arc, Mutex},
};

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{counter::ConstCounter, gauge::ConstGauge},
    registry::Unit,
};

use super::KernelSnapshot;
use crate::bpf::{DecisionCost, RuleLabels};

/// Encodes the kernel counters of the latest snapshot.
#[derive(Debug)]
pub(super) struct KernelCollector(pub(super) Arc<Mutex<KernelSnapshot>>);

/// Encodes one counter family with a sample per label set.
fn encode_counters<L, V>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    samples: impl IntoIterator<Item = (L, V)>,
) -> Result<(), std::fmt::Error>
where
    L: prometheus_client::encoding::EncodeLabelSet,
    V: prometheus_client::encoding::EncodeCounterValue + std::fmt::Debug,
{
    let mut family = encoder.encode_descriptor(
        name,
        help,
        unit,
        prometheus_client::metrics::MetricType::Counter,
    )?;
    for (labels, value) in samples {
        ConstCounter::new(value).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

impl KernelCollector {
    fn encode_rules(
        snapshot: &KernelSnapshot,
        encoder: &mut DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        let labels = |rule: &RuleLabels| {
            [
                ("policy", rule.policy.clone()),
                ("rule", rule.rule.clone()),
                ("hook", rule.hook.to_owned()),
                ("action", rule.action.to_owned()),
            ]
        };
        encode_counters(
            encoder,
            "rule_decisions",
            "Decisions of each rule (deny: denied; audit: allowed and reported)",
            None,
            snapshot
                .rules
                .iter()
                .map(|(rule, counts)| (labels(rule), counts.decisions)),
        )?;
        encode_counters(
            encoder,
            "rule_events_throttled",
            "Audit events of each rule suppressed by its audit rate (the decisions still happened)",
            None,
            snapshot
                .rules
                .iter()
                .map(|(rule, counts)| (labels(rule), counts.throttled)),
        )
    }

    fn encode_costs(
        snapshot: &KernelSnapshot,
        encoder: &mut DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        if !snapshot.decision_costs.is_empty() {
            let labels =
                |cost: &DecisionCost| [("rule_class", cost.rule_class), ("hook", cost.hook)];
            encode_counters(
                encoder,
                "rule_evaluations",
                "Decisions about targets, by hook and the class of rules it decides",
                None,
                snapshot
                    .decision_costs
                    .iter()
                    .map(|cost| (labels(cost), cost.decisions)),
            )?;
            encode_counters(
                encoder,
                "rule_evaluation",
                "Time spent deciding about targets (finding the policy, evaluating its rules, reporting), by hook and rule class",
                Some(&Unit::Seconds),
                snapshot
                    .decision_costs
                    .iter()
                    .map(|cost| (labels(cost), cost.time.as_secs_f64())),
            )?;
        }
        if !snapshot.program_runs.is_empty() {
            encode_counters(
                encoder,
                "hook_runs",
                "Runs of each BPF program (the kernel's run-time statistics)",
                None,
                snapshot
                    .program_runs
                    .iter()
                    .map(|runs| ([("hook", runs.program)], runs.runs)),
            )?;
            encode_counters(
                encoder,
                "hook_run",
                "Time spent in each BPF program, on every task (the kernel's run-time statistics)",
                Some(&Unit::Seconds),
                snapshot
                    .program_runs
                    .iter()
                    .map(|runs| ([("hook", runs.program)], runs.time.as_secs_f64())),
            )?;
        }
        Ok(())
    }
}

impl Collector for KernelCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let snapshot = self
            .0
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .clone();
        let counters = [
            (
                "events",
                "Audit events the kernel submitted to the ring buffer",
                snapshot.stats.events,
            ),
            (
                "events_dropped",
                "Audit events lost because the ring buffer was full",
                snapshot.stats.events_dropped,
            ),
            (
                "events_throttled",
                "Audit events suppressed by the audit rate of their rule and target",
                snapshot.stats.events_throttled,
            ),
            (
                "events_repeated",
                "Audit events of DefenseInDepth trials not sent: their operation was reported \
                 already",
                snapshot.stats.events_repeated,
            ),
            (
                "undecided",
                "Operations of targets allowed because their path could not be resolved",
                snapshot.stats.undecided,
            ),
            (
                "decisions_uncounted",
                "Decisions not counted by rule because the kernel's counter map was full",
                snapshot.stats.uncounted,
            ),
            (
                "model_records_dropped",
                "Behaviour records lost outside every model's count (the kernel's record map \
                 full, and the model already closed)",
                snapshot.stats.model_dropped,
            ),
            (
                "opens_cached",
                "Opens of targets the open verdict cache answered without resolving their path",
                snapshot.opens_cached,
            ),
            (
                "events_written",
                "Audit events the agent wrote to its sinks (each sink counts what it failed to \
                 deliver)",
                snapshot.agent_events.written,
            ),
            (
                "events_overflowed",
                "Audit events the agent dropped, the oldest first, when a flood outran its sinks",
                snapshot.agent_events.overflowed,
            ),
            (
                "events_undecodable",
                "Ring buffer records that were not audit events of this version",
                snapshot.agent_events.undecodable,
            ),
        ];
        for (name, help, value) in counters {
            let counter = ConstCounter::new(value);
            counter.encode(encoder.encode_descriptor(
                name,
                help,
                None,
                counter.metric_type(),
            )?)?;
        }
        encode_counters(
            &mut encoder,
            "events_lost",
            "Audit events a sink failed to deliver (a file it could not write: a full or \
             read-only file system; the HTTP sink's rejected and overflowed ones), by sink",
            None,
            snapshot
                .sink_losses
                .iter()
                .map(|(sink, lost)| ([("sink", sink.clone())], *lost)),
        )?;
        let queued = ConstGauge::new(snapshot.agent_events.queued as i64);
        queued.encode(encoder.encode_descriptor(
            "events_queued",
            "Audit events the agent read from the ring buffer and has not yet written",
            None,
            queued.metric_type(),
        )?)?;
        let targets = ConstGauge::new(snapshot.targets as i64);
        targets.encode(encoder.encode_descriptor(
            "targets",
            "Cgroups enforced as targets",
            None,
            targets.metric_type(),
        )?)?;
        Self::encode_rules(&snapshot, &mut encoder)?;
        Self::encode_costs(&snapshot, &mut encoder)
    }
}

/// The agent process's standard `process_*` metrics (as Prometheus' client libraries name them),
/// read from /proc when scraped.
#[derive(Debug)]
pub(super) struct ProcessCollector;

struct ProcessStats {
    cpu_seconds: f64,
    resident_bytes: f64,
    virtual_bytes: f64,
    start_time_seconds: f64,
    open_fds: f64,
    max_fds: f64,
}

impl ProcessCollector {
    fn read() -> Option<ProcessStats> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        // Fields after the command name (which may hold spaces) start at "state" (field 3).
        let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
        let field = |number: usize| fields.get(number - 3)?.parse::<f64>().ok();
        // SAFETY: sysconf has no memory preconditions.
        let (hz, page) = unsafe {
            (
                libc::sysconf(libc::_SC_CLK_TCK) as f64,
                libc::sysconf(libc::_SC_PAGESIZE) as f64,
            )
        };
        let boot_time: f64 = std::fs::read_to_string("/proc/stat")
            .ok()?
            .lines()
            .find_map(|line| line.strip_prefix("btime "))?
            .trim()
            .parse()
            .ok()?;
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: a valid rlimit to fill.
        let max_fds = match unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } {
            0 => i64::try_from(limit.rlim_cur).unwrap_or(i64::MAX) as f64,
            _ => return None,
        };
        Some(ProcessStats {
            cpu_seconds: (field(14)? + field(15)?) / hz,
            resident_bytes: field(24)? * page,
            virtual_bytes: field(23)?,
            start_time_seconds: boot_time + field(22)? / hz,
            open_fds: std::fs::read_dir("/proc/self/fd").ok()?.count() as f64,
            max_fds,
        })
    }
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(stats) = Self::read() else {
            return Ok(());
        };
        let cpu = ConstCounter::new(stats.cpu_seconds);
        cpu.encode(encoder.encode_descriptor(
            "process_cpu",
            "Total user and system CPU time spent in seconds",
            Some(&Unit::Seconds),
            cpu.metric_type(),
        )?)?;
        let gauges = [
            (
                "process_resident_memory",
                "Resident memory size in bytes",
                Some(&Unit::Bytes),
                ConstGauge::new(stats.resident_bytes),
            ),
            (
                "process_virtual_memory",
                "Virtual memory size in bytes",
                Some(&Unit::Bytes),
                ConstGauge::new(stats.virtual_bytes),
            ),
            (
                "process_start_time",
                "Start time of the process since the Unix epoch in seconds",
                Some(&Unit::Seconds),
                ConstGauge::new(stats.start_time_seconds),
            ),
            (
                "process_open_fds",
                "Number of open file descriptors",
                None,
                ConstGauge::new(stats.open_fds),
            ),
            (
                "process_max_fds",
                "Maximum number of open file descriptors",
                None,
                ConstGauge::new(stats.max_fds),
            ),
        ];
        for (name, help, unit, gauge) in gauges {
            gauge.encode(encoder.encode_descriptor(name, help, unit, gauge.metric_type())?)?;
        }
        Ok(())
    }
}

/// Memory of the BPF maps this process holds, by map name, read from /proc/self/fdinfo at
/// scrape time (`memlock`: what a map may take on kernels before 6.4, what it uses from 6.4 on).
#[derive(Debug)]
pub(super) struct MapMemoryCollector;

impl MapMemoryCollector {
    fn read() -> Vec<(String, i64)> {
        let Ok(fds) = std::fs::read_dir("/proc/self/fd") else {
            return Vec::new();
        };
        let mut maps: Vec<(String, i64)> = Vec::new();
        for fd in fds.filter_map(Result::ok) {
            let is_map = std::fs::read_link(fd.path())
                .is_ok_and(|target| target.as_os_str() == "anon_inode:bpf-map");
            let Some(info) = is_map
                .then(|| {
                    std::fs::read_to_string(Path::new("/proc/self/fdinfo").join(fd.file_name()))
                })
                .and_then(Result::ok)
            else {
                continue;
            };
            let field = |name: &str| {
                info.lines()
                    .find_map(|line| line.strip_prefix(name)?.trim().parse::<i64>().ok())
            };
            let (Some(id), Some(memlock)) = (field("map_id:"), field("memlock:")) else {
                continue;
            };
            let name = aya::maps::MapInfo::from_id(id as u32)
                .ok()
                .and_then(|info| info.name_as_str().map(str::to_owned))
                .unwrap_or_else(|| format!("id-{id}"));
            // A map open twice (an adopted pin, say) counts once.
            if !maps.iter().any(|(known, _)| *known == name) {
                maps.push((name, memlock));
            }
        }
        maps.sort();
        maps
    }
}

impl Collector for MapMemoryCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let maps = Self::read();
        if maps.is_empty() {
            return Ok(());
        }
        let mut family = encoder.encode_descriptor(
            "bpf_map_memory",
            "Memory charged to each BPF map of the agent",
            Some(&Unit::Bytes),
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        for (name, bytes) in maps {
            let labels = [("map", name)];
            ConstGauge::new(bytes).encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

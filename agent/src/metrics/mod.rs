//! Prometheus metrics of the agent, prefix `palisade_` (the standard `process_*` aside). Kernel
//! counters are read when scraped (the task that owns the BPF object hands over a fresh
//! `KernelSnapshot`); the rest are updated as things happen.

mod collectors;
mod format;

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
};

use collectors::{KernelCollector, MapMemoryCollector, ProcessCollector};
use prometheus_client::{
    encoding::text::encode,
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
        info::Info,
    },
    registry::{Registry, Unit},
};

pub use format::Format;

use crate::bpf::{DecisionCost, ProgramRuns, RuleCounts, RuleLabels, Stats};

/// What the kernel side counts, and what the agent did with its events, as of a scrape.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KernelSnapshot {
    pub stats: Stats,
    pub opens_cached: u64,
    pub targets: u64,
    pub rules: BTreeMap<RuleLabels, RuleCounts>,
    /// While cost is measured.
    pub decision_costs: Vec<DecisionCost>,
    /// While cost is measured.
    pub program_runs: Vec<ProgramRuns>,
    pub agent_events: AgentEventCounts,
    /// Events each sink failed to deliver, by sink name.
    pub sink_losses: Vec<(String, u64)>,
}

/// What became of the events the agent read from the ring buffer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AgentEventCounts {
    /// Handed to the sinks (each sink counts what it failed to deliver).
    pub written: u64,
    /// Dropped from the agent's full queue: a flood outran the sinks.
    pub overflowed: u64,
    /// Records that were not events of this version.
    pub undecodable: u64,
    /// Read and not yet handed to the sinks.
    pub queued: u64,
}

pub struct Metrics {
    registry: Registry,
    /// Policy files enforced (on their target or armed for it).
    pub policies: Gauge,
    /// Policy files that cannot be enforced as they are.
    pub policy_errors: Gauge,
    /// From a policy's change (a file's, or a watch event's) to its map entries committed.
    pub apply_seconds: Histogram,
    /// Pinned kernel state that did not match this build: set aside and replaced at start.
    pub pinned_state_replaced: Counter,
    pub http_sink: HttpSinkMetrics,
    pub rule_modules: RuleModuleMetrics,
    kernel: Arc<Mutex<KernelSnapshot>>,
}

type ModuleLabels = [(&'static str, String); 1];
type ModuleKindLabels = [(&'static str, String); 2];

/// What rule modules' `decide` calls cost and how they ended.
#[derive(Debug, Clone)]
pub struct RuleModuleMetrics {
    pub decide_seconds: Family<ModuleLabels, Histogram, fn() -> Histogram>,
    /// By module and kind (timeout, memory, stack_overflow, trap, malformed, missing).
    pub failures: Family<ModuleKindLabels, Counter>,
    /// By module and verdict (keep, drop, kill).
    pub verdicts: Family<ModuleKindLabels, Counter>,
}

impl Default for RuleModuleMetrics {
    fn default() -> Self {
        // 10 µs to about 0.3 s: a batch of events.
        fn buckets() -> Histogram {
            Histogram::new(exponential_buckets(0.00001, 2.0, 15))
        }
        Self {
            decide_seconds: Family::new_with_constructor(buckets),
            failures: Family::default(),
            verdicts: Family::default(),
        }
    }
}

/// The HTTP event sink's deliveries.
#[derive(Debug, Clone, Default)]
pub struct HttpSinkMetrics {
    pub sent: Counter,
    /// Refused by the receiver (a 4xx answer): not retried.
    pub rejected: Counter,
    /// Dropped because the queue was full.
    pub overflow: Counter,
    pub retries: Counter,
    pub queued: Gauge,
}

impl Metrics {
    pub fn new() -> Self {
        let mut root = Registry::default();
        // The standard names every Prometheus client library gives them.
        root.register_collector(Box::new(ProcessCollector));
        let registry = root.sub_registry_with_prefix("palisade");
        registry.register(
            "build",
            "The agent's version and the build of its BPF programs",
            Info::new(vec![
                ("version", env!("CARGO_PKG_VERSION").to_owned()),
                ("bpf_object", crate::bpf::object_version()),
            ]),
        );
        let policies = Gauge::default();
        registry.register("policies", "Policy files enforced", policies.clone());
        let policy_errors = Gauge::default();
        registry.register(
            "policy_errors",
            "Policy files that cannot be enforced as they are",
            policy_errors.clone(),
        );
        // 1 ms to about 16 s.
        let apply_seconds = Histogram::new(exponential_buckets(0.001, 2.0, 15));
        registry.register_with_unit(
            "policy_apply",
            "From a policy's change (a file's modification, or the first watch event in \
             Kubernetes) to its map entries committed",
            Unit::Seconds,
            apply_seconds.clone(),
        );
        let pinned_state_replaced = Counter::default();
        registry.register(
            "pinned_state_replaced",
            "Pinned kernel state found not to match this build at start: set aside (enforcing \
             until every policy is applied again) and replaced",
            pinned_state_replaced.clone(),
        );
        let sink_events = Family::<[(&'static str, &'static str); 1], Counter>::default();
        registry.register(
            "http_sink_events",
            "Audit events of the HTTP sink by outcome (sent, rejected by the receiver, overflow of the queue)",
            sink_events.clone(),
        );
        let outcome = |name| sink_events.get_or_create(&[("outcome", name)]).clone();
        let http_sink = HttpSinkMetrics {
            sent: outcome("sent"),
            rejected: outcome("rejected"),
            overflow: outcome("overflow"),
            retries: Counter::default(),
            queued: Gauge::default(),
        };
        registry.register(
            "http_sink_retries",
            "Failed deliveries of the HTTP sink, each retried",
            http_sink.retries.clone(),
        );
        registry.register(
            "http_sink_queue_length",
            "Audit events waiting for the HTTP sink",
            http_sink.queued.clone(),
        );
        let rule_modules = RuleModuleMetrics::default();
        registry.register_with_unit(
            "rule_module_decide",
            "Time of one rule module decide call (a batch of events)",
            Unit::Seconds,
            rule_modules.decide_seconds.clone(),
        );
        registry.register(
            "rule_module_failures",
            "Rule module calls stopped or refused, by kind; the policy's onFailure applied",
            rule_modules.failures.clone(),
        );
        registry.register(
            "rule_module_verdicts",
            "Verdicts of rule modules on events (keep, drop, kill)",
            rule_modules.verdicts.clone(),
        );
        let kernel = Arc::new(Mutex::new(KernelSnapshot::default()));
        registry.register_collector(Box::new(KernelCollector(kernel.clone())));
        registry.register_collector(Box::new(MapMemoryCollector));
        Self {
            registry: root,
            policies,
            policy_errors,
            apply_seconds,
            pinned_state_replaced,
            http_sink,
            rule_modules,
            kernel,
        }
    }

    /// The exposition in `format`, with `snapshot` as the kernel's counters.
    pub fn encode(&self, snapshot: KernelSnapshot, format: Format) -> String {
        *self
            .kernel
            .lock()
            .unwrap_or_else(|poison| poison.into_inner()) = snapshot;
        let mut text = String::new();
        encode(&mut text, &self.registry).expect("writing to a String cannot fail");
        match format {
            Format::OpenMetrics => text,
            Format::Classic => format::classic(&text),
        }
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A snapshot with a sample in every kernel family.
    fn snapshot() -> KernelSnapshot {
        let rule = RuleLabels {
            policy: "app".to_owned(),
            rule: "no-shadow".to_owned(),
            hook: "file_open",
            action: "deny",
        };
        KernelSnapshot {
            stats: Stats {
                events: 7,
                events_dropped: 2,
                events_throttled: 5,
                events_repeated: 2,
                undecided: 1,
                uncounted: 0,
                model_dropped: 0,
            },
            opens_cached: 11,
            targets: 4,
            agent_events: AgentEventCounts {
                written: 9,
                overflowed: 3,
                undecodable: 1,
                queued: 6,
            },
            sink_losses: vec![("file".to_owned(), 8)],
            rules: [(
                rule,
                RuleCounts {
                    decisions: 14,
                    throttled: 5,
                },
            )]
            .into(),
            decision_costs: vec![DecisionCost {
                hook: "file_open",
                rule_class: "files",
                decisions: 20,
                time: Duration::from_micros(30),
            }],
            program_runs: vec![ProgramRuns {
                program: "file_open",
                runs: 100,
                time: Duration::from_micros(50),
            }],
        }
    }

    fn parse(text: &str) -> prometheus_parse::Scrape {
        prometheus_parse::Scrape::parse(text.lines().map(|line| Ok(line.to_owned())))
            .expect("valid exposition text")
    }

    #[test]
    fn the_exposition_parses_with_every_metric_prefixed() {
        let metrics = Metrics::new();
        metrics.policies.set(3);
        metrics.apply_seconds.observe(0.004);
        let text = metrics.encode(snapshot(), Format::OpenMetrics);
        let scrape = parse(&text);
        // The parser reads Prometheus' text format, whose counters are named like their samples;
        // OpenMetrics names the family without `_total`, so types are checked on the text.
        let value = |name: &str| -> f64 {
            use prometheus_parse::Value;
            match scrape
                .samples
                .iter()
                .find(|sample| sample.metric == name)
                .map(|s| &s.value)
            {
                Some(Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v)) => *v,
                other => panic!("{name}: {other:?} in {text}"),
            }
        };
        assert_eq!(value("palisade_events_total"), 7.0);
        assert_eq!(value("palisade_events_dropped_total"), 2.0);
        assert_eq!(value("palisade_events_throttled_total"), 5.0);
        assert_eq!(value("palisade_events_repeated_total"), 2.0);
        assert_eq!(value("palisade_undecided_total"), 1.0);
        assert_eq!(value("palisade_opens_cached_total"), 11.0);
        assert_eq!(value("palisade_events_written_total"), 9.0);
        assert_eq!(value("palisade_events_overflowed_total"), 3.0);
        assert_eq!(value("palisade_events_undecodable_total"), 1.0);
        assert_eq!(value("palisade_events_queued"), 6.0);
        assert_eq!(value("palisade_events_lost_total"), 8.0);
        assert_eq!(value("palisade_targets"), 4.0);
        assert_eq!(value("palisade_policies"), 3.0);
        assert_eq!(value("palisade_rule_decisions_total"), 14.0);
        assert_eq!(value("palisade_rule_events_throttled_total"), 5.0);
        assert_eq!(value("palisade_rule_evaluations_total"), 20.0);
        assert_eq!(value("palisade_rule_evaluation_seconds_total"), 30e-6);
        assert_eq!(value("palisade_hook_runs_total"), 100.0);
        assert!(value("process_resident_memory_bytes") > 0.0);
        assert!(value("process_cpu_seconds_total") >= 0.0);
        assert!(value("process_start_time_seconds") > 1.6e9);
        assert!(value("process_open_fds") > 0.0);
        assert!(value("process_max_fds") >= value("process_open_fds"));
        assert!(value("process_virtual_memory_bytes") >= value("process_resident_memory_bytes"));
        for family in [
            "# TYPE palisade_events counter",
            "# TYPE palisade_events_dropped counter",
            "# TYPE palisade_targets gauge",
            "# TYPE palisade_policy_apply_seconds histogram",
            "# UNIT palisade_policy_apply_seconds seconds",
            "# TYPE process_cpu_seconds counter",
            "# TYPE palisade_rule_decisions counter",
            "# UNIT palisade_hook_run_seconds seconds",
            "palisade_rule_decisions_total{policy=\"app\",rule=\"no-shadow\",hook=\"file_open\",action=\"deny\"} 14",
        ] {
            assert!(text.contains(family), "{family} in {text}");
        }
        assert!(
            scrape
                .samples
                .iter()
                .all(|s| s.metric.starts_with("palisade_") || s.metric.starts_with("process_")),
            "{text}"
        );
        assert!(text.contains("palisade_build_info{version=\""), "{text}");
    }

    #[test]
    fn the_classic_exposition_names_families_like_their_samples() {
        let text = Metrics::new().encode(snapshot(), Format::Classic);
        for family in [
            "# TYPE palisade_events_total counter",
            "# HELP palisade_events_total ",
            "# TYPE palisade_build_info gauge",
            "# TYPE palisade_policy_apply_seconds histogram",
            "# TYPE process_cpu_seconds_total counter",
        ] {
            assert!(text.contains(family), "{family} in {text}");
        }
        assert!(
            !text.contains("# UNIT") && !text.contains("# EOF"),
            "{text}"
        );
        assert_eq!(
            parse(&text).samples.len(),
            parse(&Metrics::new().encode(snapshot(), Format::OpenMetrics))
                .samples
                .len()
        );
    }

    #[test]
    fn cost_families_are_absent_unless_measured() {
        let text = Metrics::new().encode(
            KernelSnapshot {
                decision_costs: Vec::new(),
                program_runs: Vec::new(),
                ..snapshot()
            },
            Format::Classic,
        );
        assert!(!text.contains("palisade_rule_evaluation"), "{text}");
        assert!(!text.contains("palisade_hook_run"), "{text}");
    }
}

//! Prometheus metrics of the agent, prefix `palisade_`. Kernel counters are read when scraped
//! (the task that owns the BPF object hands over a fresh `KernelSnapshot`); the rest are updated
//! as things happen.

use std::{
    path::Path,
    sync::{Arc, Mutex},
};

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric, text::encode},
    metrics::{
        counter::ConstCounter,
        gauge::{ConstGauge, Gauge},
        histogram::{Histogram, exponential_buckets},
        info::Info,
    },
    registry::{Registry, Unit},
};

use crate::bpf::Stats;

/// What the kernel side counts, as of a scrape.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KernelSnapshot {
    pub stats: Stats,
    pub targets: u64,
}

pub struct Metrics {
    registry: Registry,
    /// Policy files enforced (on their target or armed for it).
    pub policies: Gauge,
    /// Policy files that cannot be enforced as they are.
    pub policy_errors: Gauge,
    /// From a policy file's change to its map entries committed.
    pub apply_seconds: Histogram,
    kernel: Arc<Mutex<KernelSnapshot>>,
}

/// Encodes the kernel counters of the latest snapshot.
#[derive(Debug)]
struct KernelCollector(Arc<Mutex<KernelSnapshot>>);

impl Collector for KernelCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let snapshot = *self.0.lock().unwrap_or_else(|poison| poison.into_inner());
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
                "undecided",
                "Operations of targets allowed because their path could not be resolved",
                snapshot.stats.undecided,
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
        let targets = ConstGauge::new(snapshot.targets as i64);
        targets.encode(encoder.encode_descriptor(
            "targets",
            "Cgroups enforced as targets",
            None,
            targets.metric_type(),
        )?)?;
        Ok(())
    }
}

/// CPU time and resident memory of the agent process, read when scraped.
#[derive(Debug)]
struct ProcessCollector;

impl ProcessCollector {
    /// (CPU seconds, resident bytes) from /proc/self.
    fn read() -> Option<(f64, i64)> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        // Fields after the command name (which may hold spaces) start at "state".
        let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
        let ticks: f64 =
            fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
        // SAFETY: sysconf has no memory preconditions.
        let (hz, page) = unsafe {
            (
                libc::sysconf(libc::_SC_CLK_TCK),
                libc::sysconf(libc::_SC_PAGESIZE),
            )
        };
        let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
        let resident: i64 = statm.split_whitespace().nth(1)?.parse().ok()?;
        Some((ticks / hz as f64, resident * page))
    }
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some((cpu, resident)) = Self::read() else {
            return Ok(());
        };
        let cpu = ConstCounter::new(cpu);
        cpu.encode(encoder.encode_descriptor(
            "process_cpu",
            "CPU time of the agent process",
            Some(&Unit::Seconds),
            cpu.metric_type(),
        )?)?;
        let resident = ConstGauge::new(resident);
        resident.encode(encoder.encode_descriptor(
            "process_resident_memory",
            "Resident memory of the agent process",
            Some(&Unit::Bytes),
            resident.metric_type(),
        )?)?;
        Ok(())
    }
}

/// Memory of the BPF maps this process holds, by map name, read from /proc/self/fdinfo at
/// scrape time (`memlock`: what a map may take on kernels before 6.4, what it uses from 6.4 on).
#[derive(Debug)]
struct MapMemoryCollector;

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

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("palisade");
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
            "From a policy file's change to its map entries committed",
            Unit::Seconds,
            apply_seconds.clone(),
        );
        let kernel = Arc::new(Mutex::new(KernelSnapshot::default()));
        registry.register_collector(Box::new(KernelCollector(kernel.clone())));
        registry.register_collector(Box::new(ProcessCollector));
        registry.register_collector(Box::new(MapMemoryCollector));
        Self {
            registry,
            policies,
            policy_errors,
            apply_seconds,
            kernel,
        }
    }

    /// The text exposition format, with `snapshot` as the kernel's counters.
    pub fn encode(&self, snapshot: KernelSnapshot) -> String {
        *self
            .kernel
            .lock()
            .unwrap_or_else(|poison| poison.into_inner()) = snapshot;
        let mut text = String::new();
        encode(&mut text, &self.registry).expect("writing to a String cannot fail");
        text
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exposition_parses_with_every_metric_prefixed() {
        let metrics = Metrics::new();
        metrics.policies.set(3);
        metrics.apply_seconds.observe(0.004);
        let text = metrics.encode(KernelSnapshot {
            stats: Stats {
                events: 7,
                events_dropped: 2,
                undecided: 1,
            },
            targets: 4,
        });
        let lines = text.lines().map(|line| Ok(line.to_owned()));
        let scrape = prometheus_parse::Scrape::parse(lines).expect("valid exposition text");
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
        assert_eq!(value("palisade_undecided_total"), 1.0);
        assert_eq!(value("palisade_targets"), 4.0);
        assert_eq!(value("palisade_policies"), 3.0);
        assert!(value("palisade_process_resident_memory_bytes") > 0.0);
        assert!(value("palisade_process_cpu_seconds_total") >= 0.0);
        for family in [
            "# TYPE palisade_events counter",
            "# TYPE palisade_events_dropped counter",
            "# TYPE palisade_targets gauge",
            "# TYPE palisade_policy_apply_seconds histogram",
            "# UNIT palisade_policy_apply_seconds seconds",
            "# TYPE palisade_process_cpu_seconds counter",
        ] {
            assert!(text.contains(family), "{family} in {text}");
        }
        assert!(
            scrape
                .samples
                .iter()
                .all(|s| s.metric.starts_with("palisade_")),
            "{text}"
        );
        assert!(text.contains("palisade_build_info{version=\""), "{text}");
    }
}

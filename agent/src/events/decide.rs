//! Rule modules' verdicts on audit events, applied before the sinks see them: each batch read
//! from the ring buffer goes to every module of the events' policies in one call per module,
//! and the verdicts keep or drop events, add severity, tags and annotations, or kill the
//! process. A module that fails is contained: its policy's `onFailure` applies to the batch, the
//! failure is counted and logged, and the next batch calls a fresh instance of it. Instances are
//! kept between batches (one per module and configuration), since starting one costs more than
//! deciding a few events.

use std::{
    borrow::Cow,
    collections::HashMap,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use tracing::warn;

use super::{Added, AuditEvent, ModuleFailure};
use crate::{
    bpf::InstalledPolicy,
    metrics::RuleModuleMetrics,
    policy::{Decider, OnFailure},
    rules::{Event, ModuleError, ModuleInstance, RuleHost, Verdict},
};

/// A failure of the same module and kind is logged at most this often.
const FAILURE_LOG_INTERVAL: Duration = Duration::from_secs(60);
/// An instance no batch used for this long is dropped, with its memory.
const INSTANCE_IDLE: Duration = Duration::from_secs(60);

pub struct Deciding {
    host: RuleHost,
    node: String,
    metrics: RuleModuleMetrics,
    /// Where cgroup v2 is mounted: a process is killed only if it is still in the cgroup that
    /// caused the event.
    cgroup_mount: PathBuf,
    /// When each (module, failure) was last logged.
    logged: HashMap<(String, &'static str), Instant>,
    /// By module digest and configuration.
    instances: HashMap<(String, String), Warm>,
}

/// An instance kept for the next batch.
struct Warm {
    instance: ModuleInstance,
    used: Instant,
}

/// A decoded event, the policy it names, and whether it goes on to the sinks.
pub struct Decoded {
    pub event: AuditEvent,
    pub policy: Option<Arc<InstalledPolicy>>,
    /// Until a module's verdict, or its failure under `onFailure: drop`, drops it.
    pub keep: bool,
}

/// A module's verdicts on a batch, by kind: counted once per batch.
#[derive(Default)]
struct VerdictCounts {
    keep: u64,
    drop: u64,
    kill: u64,
}

impl VerdictCounts {
    fn count(&mut self, verdict: &Verdict) {
        if verdict.kill {
            self.kill += 1;
        } else if verdict.keep {
            self.keep += 1;
        } else {
            self.drop += 1;
        }
    }
}

impl Added {
    /// What one module's verdict adds: its severity if higher, its tags after those already
    /// there, its annotations (a key given again, by this module or another, takes the later
    /// value).
    fn add(&mut self, verdict: Verdict) {
        if let Some(severity) = verdict.severity {
            let rank = severity as usize;
            let current = self
                .severity
                .and_then(|name| SEVERITIES.iter().position(|known| *known == name));
            if current.is_none_or(|current| current < rank) {
                self.severity = Some(SEVERITIES[rank]);
            }
        }
        let tags = verdict.tags.into_iter().map(Cow::into_owned);
        if self.tags.is_empty() {
            // The verdict's list, its strings taken as they are: no copy.
            self.tags = tags.collect();
        } else {
            self.tags.extend(tags);
        }
        if self.annotations.is_empty() {
            // The verdict's list again, by key; of a key it gives twice, the later value.
            self.annotations = verdict
                .annotations
                .into_iter()
                .map(|(key, value)| (key.into_owned(), value.into_owned()))
                .collect();
            self.annotations.sort_by(|(a, _), (b, _)| a.cmp(b));
            self.annotations.dedup_by(|later, kept| {
                let same = later.0 == kept.0;
                if same {
                    std::mem::swap(&mut later.1, &mut kept.1);
                }
                same
            });
        } else {
            for (key, value) in verdict.annotations {
                match self
                    .annotations
                    .binary_search_by(|(known, _)| known.as_str().cmp(&key))
                {
                    Ok(at) => self.annotations[at].1 = value.into_owned(),
                    Err(at) => self
                        .annotations
                        .insert(at, (key.into_owned(), value.into_owned())),
                }
            }
        }
    }
}

/// Severity names, lowest first, as `rules::Severity` orders them.
const SEVERITIES: [&str; 5] = ["info", "low", "medium", "high", "critical"];

/// The event as modules see it; its JSON (written for the purpose) only if `json`.
fn module_event(event: &AuditEvent, json: bool) -> Event<'_> {
    let naming = &event.naming;
    Event {
        hook: naming.hook,
        action: naming.action,
        policy: naming.policy.as_deref().unwrap_or_default(),
        rule: naming.rule.as_deref().unwrap_or_default(),
        pid: event.pid,
        uid: event.uid,
        comm: &event.comm,
        path: &event.path,
        json: if json { event.facts_json() } else { "" },
    }
}

impl Deciding {
    pub fn new(host: RuleHost, metrics: RuleModuleMetrics, cgroup_mount: PathBuf) -> Self {
        Self {
            host,
            node: crate::policy::Environment::from_process().node,
            metrics,
            cgroup_mount,
            logged: HashMap::new(),
            instances: HashMap::new(),
        }
    }

    /// Applies the verdicts of the events' rule modules to `batch`, in place; returns the
    /// failures to report.
    pub fn apply(&mut self, batch: &mut [Decoded]) -> Vec<ModuleFailure> {
        // Events by the module (and configuration) that decides them, in order of appearance.
        let mut groups: Vec<(Decider, Vec<usize>)> = Vec::new();
        for (index, decoded) in batch.iter().enumerate() {
            let Some(policy) = &decoded.policy else {
                continue;
            };
            for decider in policy.policy.deciders() {
                match groups.iter_mut().find(|(known, _)| known == decider) {
                    Some((_, indices)) => indices.push(index),
                    None => groups.push((decider.clone(), vec![index])),
                }
            }
        }
        let mut failures = Vec::new();
        for (decider, indices) in groups {
            match self.decide(&decider, batch, &indices, &mut failures) {
                Some(verdicts) => {
                    let mut counts = VerdictCounts::default();
                    for (&index, verdict) in indices.iter().zip(verdicts) {
                        let decoded = &mut batch[index];
                        decoded.keep &= verdict.keep;
                        counts.count(&verdict);
                        self.apply_verdict(&mut decoded.event, verdict);
                    }
                    self.count_verdicts(&decider, counts);
                }
                None if decider.on_failure == OnFailure::Drop => {
                    for &index in &indices {
                        batch[index].keep = false;
                    }
                }
                None => {}
            }
        }
        self.instances
            .retain(|_, warm| warm.used.elapsed() < INSTANCE_IDLE);
        failures
    }

    /// The module's verdicts on the events of `batch` at `indices`, or None when it failed
    /// (counted; logged and added to `failures` at most once a minute per module and kind).
    fn decide(
        &mut self,
        decider: &Decider,
        batch: &[Decoded],
        indices: &[usize],
        failures: &mut Vec<ModuleFailure>,
    ) -> Option<Vec<Verdict>> {
        let started = Instant::now();
        let result = self
            .warm_decide(decider, batch, indices)
            .map_err(|err| match err {
                Some(err) => (
                    err.kind().map_or("error", |kind| kind.name()),
                    err.to_string(),
                ),
                None => ("missing", "the module is not loaded".to_owned()),
            });
        self.metrics
            .decide_seconds
            .get_or_create(&[("module", decider.name.clone())])
            .observe(started.elapsed().as_secs_f64());
        match result {
            Ok(verdicts) => Some(verdicts),
            Err((kind, message)) => {
                self.metrics
                    .failures
                    .get_or_create(&[("module", decider.name.clone()), ("kind", kind.to_owned())])
                    .inc();
                let key = (decider.name.clone(), kind);
                let due = self
                    .logged
                    .get(&key)
                    .is_none_or(|last| last.elapsed() >= FAILURE_LOG_INTERVAL);
                if due {
                    warn!(
                        module = %decider.name,
                        events = indices.len(),
                        on_failure = ?decider.on_failure,
                        "rule module failed to decide: {message}"
                    );
                    self.logged.insert(key, Instant::now());
                    failures.push(ModuleFailure {
                        kind: "rule_module_failure",
                        time: super::rfc3339_nanos(std::time::SystemTime::now()),
                        node: self.node.clone(),
                        module: decider.name.clone(),
                        failure: kind,
                        message,
                        events: indices.len(),
                        on_failure: match decider.on_failure {
                            OnFailure::Keep => "keep",
                            OnFailure::Drop => "drop",
                        },
                    });
                }
                None
            }
        }
    }

    /// The verdicts of the decider's instance kept from an earlier batch, or of a fresh one;
    /// the instance is kept unless it failed. `Err(None)`: the module is not loaded.
    fn warm_decide(
        &mut self,
        decider: &Decider,
        batch: &[Decoded],
        indices: &[usize],
    ) -> Result<Vec<Verdict>, Option<ModuleError>> {
        let key = (decider.digest.clone(), decider.config.clone());
        let mut warm = match self.instances.remove(&key) {
            Some(warm) => warm,
            None => {
                let module = self.host.loaded(&decider.digest).ok_or(None)?;
                Warm {
                    instance: module.instantiate()?,
                    used: Instant::now(),
                }
            }
        };
        let json = warm.instance.reads_json();
        let events: Vec<Event<'_>> = indices
            .iter()
            .map(|&index| module_event(&batch[index].event, json))
            .collect();
        let verdicts = warm.instance.decide(&decider.config, &events)?;
        warm.used = Instant::now();
        self.instances.insert(key, warm);
        Ok(verdicts)
    }

    fn count_verdicts(&self, decider: &Decider, counts: VerdictCounts) {
        for (name, count) in [
            ("keep", counts.keep),
            ("drop", counts.drop),
            ("kill", counts.kill),
        ] {
            if count > 0 {
                self.metrics
                    .verdicts
                    .get_or_create(&[
                        ("module", decider.name.clone()),
                        ("verdict", name.to_owned()),
                    ])
                    .inc_by(count);
            }
        }
    }

    fn apply_verdict(&self, event: &mut AuditEvent, verdict: Verdict) {
        let kill = verdict.kill;
        event.added.add(verdict);
        if kill && !event.added.killed {
            event.added.killed = self.kill(event);
        }
    }

    /// Kills the event's process if it is still the one that caused it (same pid, same
    /// cgroup). Returns whether it was killed.
    fn kill(&self, event: &AuditEvent) -> bool {
        let same_process = std::fs::read_to_string(format!("/proc/{}/cgroup", event.pid))
            .ok()
            .and_then(|text| {
                let path = text
                    .lines()
                    .find_map(|line| line.strip_prefix("0::"))?
                    .to_owned();
                let dir = self
                    .cgroup_mount
                    .join(Path::new(&path).strip_prefix("/").ok()?);
                std::fs::metadata(dir).ok()
            })
            .is_some_and(|cgroup| cgroup.ino() == event.cgroup_id);
        if !same_process {
            warn!(
                pid = event.pid,
                "a rule module asked to kill a process that is gone"
            );
            return false;
        }
        // SAFETY: kill has no memory preconditions.
        let killed = unsafe { libc::kill(event.pid as i32, libc::SIGKILL) } == 0;
        if !killed {
            warn!(
                pid = event.pid,
                "killing the process a rule module named: {}",
                std::io::Error::last_os_error()
            );
        }
        killed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::Severity;

    #[test]
    fn verdicts_add_the_highest_severity_every_tag_and_the_last_value_of_each_annotation() {
        let mut added = Added::default();
        added.add(
            Verdict::keep()
                .severity(Severity::High)
                .tag("b")
                .annotate("zone", "0")
                .annotate("attempt", "cat")
                .annotate("zone", "1"),
        );
        added.add(
            Verdict::keep()
                .severity(Severity::Low)
                .tag("a")
                .annotate("attempt", "cat again")
                .annotate("module", "second"),
        );
        added.add(Verdict::keep().severity(Severity::Critical));
        let pairs = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|&(key, value)| (key.to_owned(), value.to_owned()))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            added,
            Added {
                severity: Some("critical"),
                tags: vec!["b".to_owned(), "a".to_owned()],
                annotations: pairs(&[
                    ("attempt", "cat again"),
                    ("module", "second"),
                    ("zone", "1")
                ]),
                killed: false,
            }
        );
    }
}

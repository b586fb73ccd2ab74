//! Reporting on policies: each agent writes its node's entry of a policy's status and the
//! policy-wide conditions with server-side apply (field manager `palisade-agent/NODE`), only when
//! what it would write changed, and at most once per interval per policy: thousands of nodes do
//! not rewrite one object at every pod change, and an agent sending what is already there
//! changes nothing. A rejected policy also gets a Kubernetes Event from each node where it
//! selects pods.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    time::Duration,
};

use k8s_openapi::{
    api::core::v1::ObjectReference,
    apimachinery::pkg::apis::meta::v1::{Condition, Time},
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
    runtime::events::{Event, EventType, Recorder, Reporter},
};
use palisade_crds::{
    API_VERSION, ENFORCED, NodeStatus, PalisadeClusterPolicy, PalisadePolicy, PolicyStatus, READY,
};
use serde_json::json;
use tokio::{sync::watch, time::Instant};
use tracing::warn;

use super::{
    field_manager,
    reconcile::{PolicyKey, PolicyReport},
};

/// A policy as last reconciled: what this node reports on it, and its status as the API server
/// had it.
#[derive(Debug, Clone, PartialEq)]
pub struct Observed {
    pub key: PolicyKey,
    pub uid: String,
    pub report: PolicyReport,
    pub status: Option<PolicyStatus>,
}

/// The status this node would write for `observed`: its own entry (when the policy selects pods
/// here, or has a model of them) and the conditions, whose transition times are kept while their status holds.
pub fn status_for(node: &str, observed: &Observed, now: Timestamp) -> PolicyStatus {
    let report = &observed.report;
    let current = observed.status.clone().unwrap_or_default();
    let mine = (report.selected_pods > 0 || report.model.is_some()).then(|| NodeStatus {
        node: node.to_owned(),
        observed_generation: report.generation,
        enforced_pods: report.enforced_pods,
        failed_pods: report.failed_pods,
        message: report.first_error.clone(),
        model: report.model.clone(),
    });
    let mut failing: Vec<&str> = current
        .nodes
        .iter()
        .filter(|entry| entry.node != node && entry.failed_pods > 0)
        .map(|entry| entry.node.as_str())
        .collect();
    if report.failed_pods > 0 {
        failing.push(node);
    }
    failing.sort_unstable();
    let condition = |type_: &str, ok: bool, reason: &str, message: String| {
        let status = if ok { "True" } else { "False" };
        let since = current
            .conditions
            .iter()
            .find(|condition| condition.type_ == type_ && condition.status == status)
            .map_or(Time(now), |condition| {
                condition.last_transition_time.clone()
            });
        Condition {
            type_: type_.to_owned(),
            status: status.to_owned(),
            reason: reason.to_owned(),
            message,
            observed_generation: Some(report.generation),
            last_transition_time: since,
        }
    };
    let ready = match &report.rejected {
        None => condition(READY, true, "Accepted", "compiled into kernel rules".into()),
        Some(error) => condition(READY, false, "Rejected", error.clone()),
    };
    let enforced = if failing.is_empty() {
        condition(
            ENFORCED,
            true,
            "PodsProtected",
            "every selected pod is protected".into(),
        )
    } else {
        condition(
            ENFORCED,
            false,
            "PodsNotProtected",
            format!("selected pods are not protected on: {}", failing.join(", ")),
        )
    };
    PolicyStatus {
        observed_generation: Some(report.generation),
        conditions: vec![ready, enforced],
        nodes: mine.into_iter().collect(),
    }
}

pub struct StatusWriter {
    client: Client,
    node: String,
    interval: Duration,
    recorder: Recorder,
    /// What was last written for each policy, and when.
    written: HashMap<PolicyKey, (PolicyStatus, Instant)>,
    /// Rejections already announced with an event: (policy UID, generation).
    announced: HashSet<(String, i64)>,
}

impl StatusWriter {
    pub fn new(client: Client, node: String, interval: Duration) -> Self {
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: "palisade-agent".into(),
                instance: Some(node.clone()),
            },
        );
        Self {
            client,
            node,
            interval,
            recorder,
            written: HashMap::new(),
            announced: HashSet::new(),
        }
    }

    /// Writes what changed in each new set of observations, until the sender is dropped.
    pub async fn run(mut self, mut observations: watch::Receiver<Vec<Observed>>) {
        loop {
            let observed = observations.borrow_and_update().clone();
            let next = self.write_changed(&observed).await;
            let wait = async {
                match next {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                changed = observations.changed() => if changed.is_err() { return },
                () = wait => {}
            }
        }
    }

    /// Writes the statuses that changed and whose interval has passed; returns when the next
    /// held-back write may happen.
    async fn write_changed(&mut self, observed: &[Observed]) -> Option<Instant> {
        let live: HashSet<&PolicyKey> = observed.iter().map(|observed| &observed.key).collect();
        self.written.retain(|key, _| live.contains(key));
        let mut next: Option<Instant> = None;
        for observed in observed {
            self.announce(observed).await;
            let status = status_for(&self.node, observed, Timestamp::now());
            let now = Instant::now();
            let due = match self.written.get(&observed.key) {
                Some((written, _)) if same_status(written, &status) => continue,
                Some((_, at)) => *at + self.interval,
                None => now,
            };
            if due > now {
                next = Some(next.map_or(due, |next| next.min(due)));
                continue;
            }
            match self.apply(&observed.key, &status).await {
                Ok(()) => {
                    self.written.insert(observed.key.clone(), (status, now));
                }
                Err(err) => {
                    warn!(policy = %observed.key, "writing the status: {err}");
                    let retry = now + self.interval;
                    next = Some(next.map_or(retry, |next| next.min(retry)));
                }
            }
        }
        next
    }

    async fn apply(&self, key: &PolicyKey, status: &PolicyStatus) -> Result<(), kube::Error> {
        let params = PatchParams::apply(&field_manager(&self.node)).force();
        let patch = json!({
            "apiVersion": API_VERSION,
            "kind": key.kind(),
            "status": status,
        });
        match &key.namespace {
            Some(namespace) => {
                Api::<PalisadePolicy>::namespaced(self.client.clone(), namespace)
                    .patch_status(&key.name, &params, &Patch::Apply(&patch))
                    .await?;
            }
            None => {
                Api::<PalisadeClusterPolicy>::all(self.client.clone())
                    .patch_status(&key.name, &params, &Patch::Apply(&patch))
                    .await?;
            }
        }
        Ok(())
    }

    /// A Warning event on a rejected policy, once per generation, from nodes where it selects
    /// pods.
    async fn announce(&mut self, observed: &Observed) {
        let Some(error) = &observed.report.rejected else {
            return;
        };
        let generation = observed.report.generation;
        if observed.report.selected_pods == 0
            || !self.announced.insert((observed.uid.clone(), generation))
        {
            return;
        }
        let reference = ObjectReference {
            api_version: Some(API_VERSION.to_owned()),
            kind: Some(observed.key.kind().to_owned()),
            namespace: observed.key.namespace.clone(),
            name: Some(observed.key.name.clone()),
            uid: Some(observed.uid.clone()),
            ..ObjectReference::default()
        };
        let event = Event {
            type_: EventType::Warning,
            reason: "PolicyRejected".into(),
            // An event's note holds at most 1 kB.
            note: Some(error.chars().take(1000).collect()),
            action: "Enforce".into(),
            secondary: None,
        };
        if let Err(err) = self.recorder.publish(&event, &reference).await {
            warn!(policy = %observed.key, "recording the rejection as an event: {err}");
        }
    }
}

/// Equal but for the time the conditions were computed at (a transition keeps its time).
fn same_status(a: &PolicyStatus, b: &PolicyStatus) -> bool {
    let strip = |status: &PolicyStatus| {
        let mut status = status.clone();
        for condition in &mut status.conditions {
            condition.last_transition_time = Time(Timestamp::UNIX_EPOCH);
        }
        status
    };
    strip(a) == strip(b)
}

/// The observations of one reconcile, in the order of the policies.
pub fn observations(
    policies: &[super::reconcile::PolicyObject],
    mut reports: BTreeMap<PolicyKey, PolicyReport>,
) -> Vec<Observed> {
    policies
        .iter()
        .filter_map(|policy| {
            Some(Observed {
                key: policy.key.clone(),
                uid: policy.uid.clone(),
                report: reports.remove(&policy.key)?,
                status: policy.status.clone(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn observed(report: PolicyReport, status: Option<PolicyStatus>) -> Observed {
        Observed {
            key: PolicyKey {
                namespace: Some("shop".into()),
                name: "web".into(),
            },
            uid: "u1".into(),
            report,
            status,
        }
    }

    fn condition<'a>(status: &'a PolicyStatus, type_: &str) -> &'a Condition {
        status
            .conditions
            .iter()
            .find(|condition| condition.type_ == type_)
            .unwrap()
    }

    #[test]
    fn conditions_say_what_every_node_reported() {
        let t0 = Timestamp::from_second(1_000).unwrap();
        let t1 = Timestamp::from_second(2_000).unwrap();
        let fine = PolicyReport {
            generation: 3,
            enforced_pods: 2,
            selected_pods: 2,
            ..PolicyReport::default()
        };
        let first = status_for("n1", &observed(fine.clone(), None), t0);
        assert_eq!(condition(&first, READY).status, "True");
        assert_eq!(condition(&first, ENFORCED).status, "True");
        assert_eq!(first.nodes[0].enforced_pods, 2);
        assert_eq!(first.observed_generation, Some(3));
        // Later, with another node failing: Enforced turns False, Ready keeps its time.
        let mut on_server = first.clone();
        on_server.nodes.push(NodeStatus {
            node: "n2".into(),
            observed_generation: 3,
            enforced_pods: 0,
            failed_pods: 1,
            message: Some("pod shop/a: no QoS class".into()),
            model: None,
        });
        let later = status_for("n1", &observed(fine, Some(on_server)), t1);
        assert_eq!(condition(&later, READY).last_transition_time, Time(t0));
        let enforced = condition(&later, ENFORCED);
        assert_eq!(enforced.status, "False");
        assert_eq!(enforced.message, "selected pods are not protected on: n2");
        assert_eq!(enforced.last_transition_time, Time(t1));
        assert_eq!(later.nodes.len(), 1, "only this node's own entry");
        // A node without selected pods writes no entry (its old one goes).
        let elsewhere = status_for("n3", &observed(PolicyReport::default(), None), t0);
        assert!(elsewhere.nodes.is_empty());
        let rejected = PolicyReport {
            rejected: Some("spec: bad".into()),
            ..PolicyReport::default()
        };
        let status = status_for("n1", &observed(rejected, None), t0);
        assert_eq!(condition(&status, READY).reason, "Rejected");
        assert_eq!(condition(&status, READY).message, "spec: bad");
        assert!(same_status(
            &status,
            &status_for(
                "n1",
                &observed(
                    PolicyReport {
                        rejected: Some("spec: bad".into()),
                        ..PolicyReport::default()
                    },
                    None
                ),
                t1
            )
        ));
    }
}

//! From the policies and this node's pods, as the reflectors see them, to what the kernel
//! enforces: each pod's cgroup gets the policy that selects it, and each policy gets a report
//! of what this node did with it.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    os::unix::fs::MetadataExt,
    path::PathBuf,
    sync::Arc,
};

use k8s_openapi::{api::core::v1::Pod, jiff::Timestamp};
use kube::ResourceExt;
use palisade_crds::{NodeModel, PalisadeClusterPolicy, PalisadePolicy, PolicySpec, PolicyStatus};
use tracing::info;

use super::{model::ClusterModels, select::selects};
use crate::{
    behavior::Models,
    policy::{
        CompiledPolicy, Environment, INGRESS_NIGHTMARE_MITIGATION, Policy, ServiceDestinations,
        lists_built_in,
    },
    rules::RuleHost,
    targets::{
        CgroupDriver, Enforce, EnforcedSet, Entry, Hierarchy, Placement, PodIdentity, PodRegistry,
        container_id,
    },
};

/// A policy of either kind: namespaced policies have a namespace.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PolicyKey {
    pub namespace: Option<String>,
    pub name: String,
}

impl PolicyKey {
    /// The policy's name in metrics, events and logs: `namespace/name`, or `name` for a cluster
    /// policy.
    pub fn label(&self) -> String {
        match &self.namespace {
            Some(namespace) => format!("{namespace}/{}", self.name),
            None => self.name.clone(),
        }
    }

    pub fn kind(&self) -> &'static str {
        match self.namespace {
            Some(_) => "PalisadePolicy",
            None => "PalisadeClusterPolicy",
        }
    }
}

impl std::fmt::Display for PolicyKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.kind(), self.label())
    }
}

/// A policy object of either kind, as reconciling needs it.
#[derive(Debug, Clone)]
pub struct PolicyObject {
    pub key: PolicyKey,
    pub uid: String,
    pub generation: i64,
    pub created: Option<Timestamp>,
    pub spec: PolicySpec,
    pub status: Option<PolicyStatus>,
}

impl PolicyObject {
    fn new(
        namespace: Option<String>,
        object: &impl ResourceExt,
        spec: &PolicySpec,
        status: &Option<PolicyStatus>,
    ) -> Self {
        Self {
            key: PolicyKey {
                namespace,
                name: object.name_any(),
            },
            uid: object.uid().unwrap_or_default(),
            generation: object.meta().generation.unwrap_or_default(),
            created: object.creation_timestamp().map(|time| time.0),
            spec: spec.clone(),
            status: status.clone(),
        }
    }

    /// The object in the policy model: named as in metrics and events.
    pub fn as_policy(&self) -> Policy {
        Policy {
            api_version: palisade_crds::API_VERSION.to_owned(),
            kind: self.key.kind().to_owned(),
            metadata: crate::policy::Metadata {
                name: self.key.label(),
            },
            spec: self.spec.clone(),
        }
    }
}

impl From<&PalisadePolicy> for PolicyObject {
    fn from(policy: &PalisadePolicy) -> Self {
        Self::new(policy.namespace(), policy, &policy.spec.0, &policy.status)
    }
}

impl From<&PalisadeClusterPolicy> for PolicyObject {
    fn from(policy: &PalisadeClusterPolicy) -> Self {
        Self::new(None, policy, &policy.spec.0, &policy.status)
    }
}

/// What the reflectors hold at one moment.
#[derive(Debug, Default)]
pub struct Objects {
    pub policies: Vec<PolicyObject>,
    /// This node's pods.
    pub pods: Vec<Arc<Pod>>,
    /// The labels of each namespace, by name.
    pub namespaces: BTreeMap<String, BTreeMap<String, String>>,
    /// Where the ingress-nginx admission webhook is, once its Services are listed.
    pub ingress_admission: Option<ServiceDestinations>,
}

/// What this node did with one policy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PolicyReport {
    pub generation: i64,
    /// Why the policy's current generation cannot be enforced (the previous one stays).
    pub rejected: Option<String>,
    /// Pods of this node the policy selects and protects (armed ones included).
    pub enforced_pods: u32,
    /// Pods of this node the policy selects and does not protect.
    pub failed_pods: u32,
    /// Why, for the first of them.
    pub first_error: Option<String>,
    /// The pods the policy selects here, for the events about a rejection.
    pub selected_pods: u32,
    /// The model of its pods here, while it models them and once it is stored.
    pub model: Option<NodeModel>,
}

impl PolicyReport {
    fn fail(&mut self, error: String) {
        self.failed_pods += 1;
        self.first_error.get_or_insert(error);
    }
}

/// A policy as it was compiled: from which object, with what the cluster told its rules.
struct Compiled {
    uid: String,
    generation: i64,
    /// The admission webhook's destinations, if the policy blocks them and they were known.
    ingress_admission: Option<ServiceDestinations>,
    /// Which compilation this is, of all the reconciler made.
    revision: u64,
    result: Result<Arc<CompiledPolicy>, String>,
}

/// Which version of which policy a pod has.
#[derive(Debug, Clone, PartialEq, Eq)]
struct PolicyVersion {
    policy: PolicyKey,
    /// Its compilation: a new generation, or new destinations for its rules.
    revision: u64,
    /// The model the kernel records the pod's behaviour into, while the policy models it.
    model: Option<u32>,
}

/// What a pod should get.
enum Wanted {
    /// This version of this policy, there.
    Install(Entry<PolicyVersion>),
    /// What it has, where it is: its cgroup is not found.
    Keep,
}

pub struct Reconciler {
    cgroups: Hierarchy,
    /// The kubelet's cgroup driver, or `None` to find it from the cgroups there are.
    driver: Option<CgroupDriver>,
    rule_host: RuleHost,
    /// Where rule modules named by policies are.
    modules: PathBuf,
    environment: Environment,
    compiled: HashMap<PolicyKey, Compiled>,
    /// Compilations so far.
    revisions: u64,
    /// By pod UID.
    enforced: EnforcedSet<String, PolicyVersion>,
    /// Which pod and container each cgroup of a protected pod is, for audit events.
    pods: PodRegistry,
}

impl Reconciler {
    pub fn new(
        cgroups: Hierarchy,
        driver: Option<CgroupDriver>,
        rule_host: RuleHost,
        modules: PathBuf,
        environment: Environment,
        pods: PodRegistry,
    ) -> Self {
        Self {
            cgroups,
            driver,
            rule_host,
            modules,
            environment,
            compiled: HashMap::new(),
            revisions: 0,
            enforced: EnforcedSet::default(),
            pods,
        }
    }

    /// Whether the last reconcile protected every pod its policy selects.
    pub fn all_enforced(&self) -> bool {
        self.enforced.all_enforced()
    }

    /// Pods protected (or armed), by policy.
    pub fn enforced_pods(&self) -> usize {
        self.enforced.count()
    }

    /// Policies whose current generation compiled.
    pub fn accepted_policies(&self) -> usize {
        self.compiled
            .values()
            .filter(|compiled| compiled.result.is_ok())
            .count()
    }

    /// Errors that last, by subject.
    pub fn errors(&self) -> usize {
        self.enforced.errors()
    }

    /// Policies put on pods so far.
    pub fn installs(&self) -> u64 {
        self.enforced.installs()
    }

    fn compile(&self, policy: &PolicyObject) -> Result<Arc<CompiledPolicy>, String> {
        let compiled = crate::rules::compile_policy(
            &self.rule_host,
            &policy.key,
            &self.modules,
            &policy.as_policy(),
            &self.environment,
        )
        .map_err(|err| err.to_string())?;
        Ok(Arc::new(compiled))
    }

    /// Brings the kernel in line with `objects`, recording the behaviour of the pods of
    /// BehaviorModeling policies into `models`. Returns a report for every policy, and the
    /// errors not logged before.
    pub fn reconcile(
        &mut self,
        objects: &Objects,
        models: &mut Models<ClusterModels>,
        enforcer: &mut impl Enforce,
    ) -> (BTreeMap<PolicyKey, PolicyReport>, Vec<String>) {
        models.collect(enforcer);
        models.store_mut().track(&objects.policies);
        let mut reports: BTreeMap<PolicyKey, PolicyReport> = BTreeMap::new();
        self.compiled
            .retain(|key, _| objects.policies.iter().any(|policy| policy.key == *key));
        if self.environment.ingress_admission != objects.ingress_admission {
            info!(destinations = ?objects.ingress_admission, "the ingress-nginx admission webhook");
            self.environment.ingress_admission = objects.ingress_admission.clone();
        }
        for policy in &objects.policies {
            // Only the policies that block the webhook are compiled again when it moves.
            let ingress_admission = lists_built_in(&policy.spec, INGRESS_NIGHTMARE_MITIGATION)
                .then(|| objects.ingress_admission.clone())
                .flatten();
            let current = self.compiled.get(&policy.key).is_some_and(|compiled| {
                compiled.uid == policy.uid
                    && compiled.generation == policy.generation
                    && compiled.ingress_admission == ingress_admission
            });
            if !current {
                let result = self.compile(policy);
                self.revisions += 1;
                self.compiled.insert(
                    policy.key.clone(),
                    Compiled {
                        uid: policy.uid.clone(),
                        generation: policy.generation,
                        ingress_admission,
                        revision: self.revisions,
                        result,
                    },
                );
            }
            reports.insert(
                policy.key.clone(),
                PolicyReport {
                    generation: policy.generation,
                    rejected: self.compiled[&policy.key].result.clone().err(),
                    ..PolicyReport::default()
                },
            );
        }
        let mut errors = BTreeMap::new();
        let mut wanted = self.wanted(objects, &*enforcer, &mut reports, &mut errors);
        let node = &self.environment.node;
        record(&mut wanted, objects, node, models, enforcer, &mut errors);
        self.apply(wanted, enforcer, &mut reports, &mut errors);
        self.identify(objects);
        for (key, report) in &mut reports {
            report.model = models
                .store()
                .report(key, models.modeling(&key.to_string()));
        }
        (reports, self.enforced.report(errors))
    }

    /// What each selected pod should get, by UID.
    fn wanted(
        &self,
        objects: &Objects,
        enforcer: &impl Enforce,
        reports: &mut BTreeMap<PolicyKey, PolicyReport>,
        errors: &mut BTreeMap<String, String>,
    ) -> HashMap<String, Wanted> {
        let driver = self
            .driver
            .or_else(|| CgroupDriver::detect(&self.cgroups.mount));
        let no_labels = BTreeMap::new();
        let mut wanted = HashMap::new();
        for pod in &objects.pods {
            let status = pod.status.as_ref();
            if matches!(
                status.and_then(|status| status.phase.as_deref()),
                Some("Succeeded" | "Failed")
            ) {
                continue; // Its containers are gone, and so is its cgroup.
            }
            let (Some(uid), Some(namespace)) = (pod.uid(), pod.namespace()) else {
                continue;
            };
            let name = format!("{namespace}/{}", pod.name_any());
            let subject = format!("pod {name}");
            let namespace_labels = objects.namespaces.get(&namespace).unwrap_or(&no_labels);
            let mut candidates: Vec<&PolicyObject> = objects
                .policies
                .iter()
                .filter(|policy| {
                    policy
                        .key
                        .namespace
                        .as_ref()
                        .is_none_or(|own| *own == namespace)
                        && policy
                            .spec
                            .target
                            .as_ref()
                            .is_some_and(|target| selects(target, pod, namespace_labels))
                })
                .collect();
            // One policy per pod: the namespace's own before cluster policies, then the oldest.
            candidates.sort_by_key(|policy| {
                (
                    policy.key.namespace.is_none(),
                    policy.created,
                    policy.key.name.clone(),
                )
            });
            let Some(chosen) = candidates.first() else {
                continue;
            };
            let enforced = self.enforced.get(&uid);
            // A pod never loses the protection it has to a policy that is rejected or to a
            // cgroup not found (yet): it keeps its policy (moved to its cgroup once the kubelet
            // makes it, and to its current version if that compiled and still selects the pod)
            // until the chosen one is enforced. A pod this agent does not protect gets the next
            // policy that selects it and compiled, unless the kernel protects it already: after
            // a restart, what the previous agent left stays (the pod counts as an error, so
            // that state is not retired).
            let mut problem = None;
            let mut fallback = false;
            // A version's model is set once `record` decides it.
            let current = |policy: &PolicyObject| PolicyVersion {
                policy: policy.key.clone(),
                revision: self.compiled[&policy.key].revision,
                model: None,
            };
            let installing = match &self.compiled[&chosen.key].result {
                Ok(compiled) => Some((current(chosen), compiled)),
                Err(_) => {
                    problem = Some(format!("{subject}: {} is rejected", chosen.key));
                    let mut compiled_candidates = candidates.iter().filter_map(|candidate| {
                        let compiled = self.compiled[&candidate.key].result.as_ref().ok()?;
                        Some((current(candidate), compiled))
                    });
                    match enforced {
                        Some(enforced) => Some(
                            compiled_candidates
                                .find(|(version, _)| version.policy == enforced.version.policy)
                                .unwrap_or((enforced.version.clone(), &enforced.compiled)),
                        ),
                        None => {
                            fallback = true;
                            compiled_candidates.next()
                        }
                    }
                }
            };
            let mut protector = enforced.map(|enforced| enforced.version.policy.clone());
            if let Some((version, compiled)) = installing {
                match pod_placement(&self.cgroups, driver, pod) {
                    Ok(placement) if fallback && placement.is_held(enforcer) => {}
                    Ok(placement) => {
                        protector = Some(version.policy.clone());
                        let entry = Entry {
                            subject: subject.clone(),
                            version,
                            compiled: compiled.clone(),
                            placement,
                        };
                        wanted.insert(uid.clone(), Wanted::Install(entry));
                    }
                    Err(reason) => {
                        let policy = &version.policy;
                        problem.get_or_insert(format!("{subject} ({policy}): {reason}"));
                    }
                }
            }
            if !wanted.contains_key(&uid) && enforced.is_some() {
                wanted.insert(uid.clone(), Wanted::Keep);
            }
            for candidate in &candidates {
                let report = reports
                    .get_mut(&candidate.key)
                    .expect("every policy has a report");
                report.selected_pods += 1;
                if protector.as_ref() == Some(&candidate.key) {
                    continue; // Counted as enforced once it is.
                }
                report.fail(match (&problem, &protector) {
                    (Some(problem), _) if candidate.key == chosen.key => problem.clone(),
                    (_, Some(protector)) => {
                        format!("{subject} is protected by {protector} (one policy per pod)")
                    }
                    (Some(problem), None) => problem.clone(),
                    (None, None) => {
                        unreachable!("a pod its chosen policy does not protect has a problem")
                    }
                });
            }
            if let Some(problem) = problem {
                errors.insert(subject, problem);
            }
        }
        wanted
    }

    fn apply(
        &mut self,
        wanted: HashMap<String, Wanted>,
        enforcer: &mut impl Enforce,
        reports: &mut BTreeMap<PolicyKey, PolicyReport>,
        errors: &mut BTreeMap<String, String>,
    ) {
        self.enforced
            .release_unwanted(|uid| wanted.contains_key(uid), enforcer, errors);
        for (uid, wanted) in wanted {
            let Wanted::Install(entry) = wanted else {
                // Its policy may be gone: it stays until the pod's new one is enforced.
                let enforced = self.enforced.get(&uid).expect("a kept pod is enforced");
                if let Some(report) = reports.get_mut(&enforced.version.policy) {
                    report.enforced_pods += 1;
                }
                continue;
            };
            // A policy kept for a pod may be gone: it has no report.
            let report = reports.get_mut(&entry.version.policy);
            let up_to_date = self.enforced.get(&uid).is_some_and(|enforced| {
                enforced.version == entry.version
                    && enforced.placement == entry.placement
                    && entry.placement.is_current(&self.cgroups)
            });
            if !up_to_date {
                let (subject, policy) = (entry.subject.clone(), entry.version.policy.clone());
                if let Err(err) = self.enforced.install(uid, entry, enforcer) {
                    let error = format!("{subject} ({policy}): cannot install: {err}");
                    if let Some(report) = report {
                        report.fail(error.clone());
                    }
                    errors.insert(subject, error);
                    continue;
                }
            }
            if let Some(report) = report {
                report.enforced_pods += 1;
            }
        }
    }
}

/// Makes the pods of BehaviorModeling policies on `node` record into their policy's model (one
/// per policy on this node, started with its first pod here), until the duration ends; ends the
/// models of policies that left the mode, or select no pod here any more.
fn record(
    wanted: &mut HashMap<String, Wanted>,
    objects: &Objects,
    node: &str,
    models: &mut Models<ClusterModels>,
    enforcer: &mut impl Enforce,
    errors: &mut BTreeMap<String, String>,
) {
    // The version to install of each modeling policy, by subject (its key, as text).
    let mut prepared: HashMap<String, Arc<CompiledPolicy>> = HashMap::new();
    // Subjects whose recording version a pod keeps (its policy's new version is rejected).
    let mut kept = HashSet::new();
    for wanted in wanted.values_mut() {
        let Wanted::Install(entry) = wanted else {
            continue;
        };
        let version = &mut entry.version;
        let subject = version.policy.to_string();
        if version.model.is_some() {
            kept.insert(subject);
            continue;
        }
        if entry.compiled.modeling().is_none() {
            continue;
        }
        let compiled = match prepared.get(&subject) {
            Some(compiled) => compiled.clone(),
            None => {
                let Some(policy) = objects
                    .policies
                    .iter()
                    .find(|policy| policy.key == version.policy)
                else {
                    continue;
                };
                let target = format!("the pods {} selects on node {node}", policy.key);
                match models.prepare(
                    &subject,
                    &target,
                    &policy.spec,
                    (*entry.compiled).clone(),
                    enforcer,
                ) {
                    Ok(compiled) => {
                        let compiled = Arc::new(compiled);
                        prepared.insert(subject, compiled.clone());
                        compiled
                    }
                    Err(err) => {
                        let error = format!("{subject}: cannot record its pods' behaviour: {err}");
                        errors.insert(subject, error);
                        continue;
                    }
                }
            }
        };
        version.model = compiled.model_id();
        entry.compiled = compiled;
    }
    models.end_unwanted(|subject| prepared.contains_key(subject) || kept.contains(subject));
}

impl Reconciler {
    /// Records which pod each protected pod's cgroup is, and which container each cgroup below
    /// it is (by the container id in its name, from the pod's container statuses).
    fn identify(&self, objects: &Objects) {
        let mut identities = HashMap::new();
        for pod in &objects.pods {
            let enforced = pod.uid().and_then(|uid| self.enforced.get(&uid));
            let Some(Placement::Target(cgroup)) = enforced.map(|enforced| &enforced.placement)
            else {
                continue;
            };
            let identity = |container| PodIdentity {
                namespace: pod.namespace().unwrap_or_default(),
                pod: pod.name_any(),
                container,
            };
            identities.insert(cgroup.id, identity(None));
            for entry in std::fs::read_dir(&cgroup.path)
                .into_iter()
                .flatten()
                .flatten()
            {
                let Some(metadata) = entry.metadata().ok().filter(|metadata| metadata.is_dir())
                else {
                    continue;
                };
                let name = entry.file_name().to_string_lossy().into_owned();
                let container = container_id(&name).and_then(|id| container_name(pod, id));
                identities.insert(metadata.ino(), identity(container));
            }
        }
        self.pods.replace(identities);
    }
}

/// The name of `pod`'s container whose runtime id is `id` (`containerd://ID`, `cri-o://ID`).
fn container_name(pod: &Pod, id: &str) -> Option<String> {
    let status = pod.status.as_ref()?;
    [
        &status.container_statuses,
        &status.init_container_statuses,
        &status.ephemeral_container_statuses,
    ]
    .into_iter()
    .flatten()
    .flatten()
    .find(|container| {
        container
            .container_id
            .as_deref()
            .and_then(|full| full.split_once("://"))
            .is_some_and(|(_, own)| own == id)
    })
    .map(|container| container.name.clone())
}

/// Where `pod`'s cgroup is, or will be once the kubelet creates it.
fn pod_placement(
    cgroups: &Hierarchy,
    driver: Option<CgroupDriver>,
    pod: &Pod,
) -> Result<Placement, String> {
    let driver = driver.ok_or_else(|| {
        format!(
            "no kubelet cgroups (kubepods.slice or kubepods) in {}",
            cgroups.mount.display()
        )
    })?;
    let qos = pod
        .status
        .as_ref()
        .and_then(|status| status.qos_class.as_deref())
        .ok_or("no QoS class in its status yet")?;
    let (parent, name) = driver.pod_cgroup(qos, &pod.uid().unwrap_or_default())?;
    Placement::locate(cgroups, &parent.join(name).to_string_lossy()).map_err(|err| err.to_string())
}

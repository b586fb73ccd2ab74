//! `palisade agent --kubernetes`: policies from the PalisadePolicy and PalisadeClusterPolicy
//! custom resources, enforced on the pods of this node. Reflectors keep the policies, this node's
//! pods (`spec.nodeName`) and the namespaces' labels in memory; every change (to a policy, a new
//! generation of its spec) asks for a reconcile, which resolves each selected pod to its cgroup
//! and installs its policy (arming cgroups the kubelet has not created yet), and reports on each
//! policy in its status. The pods of BehaviorModeling policies are modeled into
//! PalisadeBehaviorModel objects (model.rs). The ingress-nginx admission webhook's Services and
//! EndpointSlices are followed too, for the policies that block them (admission.rs).

mod admission;
mod model;
mod owner;
mod reconcile;
mod select;
mod status;

pub use owner::{DaemonSetName, Owner};
pub use reconcile::{Objects, PolicyKey, PolicyObject, PolicyReport, Reconciler};
pub use status::{Observed, StatusWriter, observations, status_for};

use std::{
    collections::HashMap,
    fmt::Debug,
    hash::Hash,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use futures::StreamExt;
use k8s_openapi::api::{
    core::v1::{Namespace, Pod, Service},
    discovery::v1::EndpointSlice,
};
use kube::{
    Api, Client, Resource, ResourceExt,
    core::PartialObjectMeta,
    runtime::{
        WatchStreamExt,
        reflector::{self, Store},
        watcher,
    },
};
use palisade_crds::{
    MODEL_NODE_LABEL, PalisadeBehaviorModel, PalisadeClusterBehaviorModel, PalisadeClusterPolicy,
    PalisadePolicy,
};
use serde::de::DeserializeOwned;
use tokio::{
    sync::{mpsc, watch},
    task::JoinHandle,
};
use tracing::{error, info, warn};

use self::{
    admission::{SERVICE_NAME_LABEL, admission_destinations},
    model::{ClusterModels, ModelWriter, node_label},
};
use crate::{
    behavior::Models, metrics::Metrics, policy::INGRESS_ADMISSION_SERVICE, targets::Enforce,
};

/// The field manager of this node's agent in server-side apply.
fn field_manager(node: &str) -> String {
    format!("palisade-agent/{node}")
}

/// How long a stopping agent waits for its last models to be written.
const MODEL_WRITE_GRACE: Duration = Duration::from_secs(5);

/// The policies and pods of the cluster, as far as this node is concerned.
pub struct Cluster {
    reconciler: Reconciler,
    policies: Store<PalisadePolicy>,
    cluster_policies: Store<PalisadeClusterPolicy>,
    pods: Store<Pod>,
    namespaces: Store<PartialObjectMeta<Namespace>>,
    /// The ingress-nginx admission webhook's Services and their EndpointSlices, in any namespace
    /// (admission.rs keeps those of ingress-nginx's).
    admission_services: Store<Service>,
    admission_slices: Store<EndpointSlice>,
    /// Whether both have their first list.
    admission_listed: Arc<AtomicBool>,
    models: Models<ClusterModels>,
    model_writer: JoinHandle<()>,
    observations: watch::Sender<Vec<Observed>>,
    metrics: Arc<Metrics>,
    /// When the oldest watch event not reconciled yet arrived.
    unreconciled: Arc<Mutex<Option<Instant>>>,
}

impl Cluster {
    /// Starts the reflectors (each change `Watching` names sent on `changed`), the status writer
    /// and the model writer; returns once every reflector has its first full list.
    pub async fn connect(
        client: Client,
        node: &str,
        reconciler: Reconciler,
        status_interval: Duration,
        metrics: Arc<Metrics>,
        changed: mpsc::Sender<()>,
    ) -> anyhow::Result<Self> {
        let pods_here = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
        let unreconciled = Arc::new(Mutex::new(None));
        let pods = reflect(
            watcher(Api::<Pod>::all(client.clone()), pods_here)
                .default_backoff()
                .modify(|pod| pod.managed_fields_mut().clear()),
            "pods",
            Watching::Everything,
            changed.clone(),
            unreconciled.clone(),
        );
        let policies = reflect(
            watcher(Api::all(client.clone()), watcher::Config::default()).default_backoff(),
            "PalisadePolicy",
            Watching::Generations,
            changed.clone(),
            unreconciled.clone(),
        );
        let cluster_policies = reflect(
            watcher(Api::all(client.clone()), watcher::Config::default()).default_backoff(),
            "PalisadeClusterPolicy",
            Watching::Generations,
            changed.clone(),
            unreconciled.clone(),
        );
        let namespaces = reflect(
            watcher(
                Api::<PartialObjectMeta<Namespace>>::all(client.clone()),
                watcher::Config::default(),
            )
            .default_backoff(),
            "namespaces",
            Watching::Everything,
            changed.clone(),
            unreconciled.clone(),
        );
        let admission_services = reflect(
            watcher(
                Api::<Service>::all(client.clone()),
                watcher::Config::default()
                    .fields(&format!("metadata.name={INGRESS_ADMISSION_SERVICE}")),
            )
            .default_backoff()
            .modify(|service| service.managed_fields_mut().clear()),
            "the ingress-nginx admission Services",
            Watching::Everything,
            changed.clone(),
            unreconciled.clone(),
        );
        let admission_slices = reflect(
            watcher(
                Api::<EndpointSlice>::all(client.clone()),
                watcher::Config::default()
                    .labels(&format!("{SERVICE_NAME_LABEL}={INGRESS_ADMISSION_SERVICE}")),
            )
            .default_backoff()
            .modify(|slice| slice.managed_fields_mut().clear()),
            "the ingress-nginx admission EndpointSlices",
            Watching::Everything,
            changed.clone(),
            unreconciled.clone(),
        );
        // This node's models, to know which are complete.
        let models_here = || {
            watcher::Config::default().labels(&format!("{MODEL_NODE_LABEL}={}", node_label(node)))
        };
        let namespaced_models = reflect(
            watcher(
                Api::<PalisadeBehaviorModel>::all(client.clone()),
                models_here(),
            )
            .default_backoff(),
            "PalisadeBehaviorModel",
            Watching::Nothing,
            changed.clone(),
            unreconciled.clone(),
        );
        let cluster_models = reflect(
            watcher(
                Api::<PalisadeClusterBehaviorModel>::all(client.clone()),
                models_here(),
            )
            .default_backoff(),
            "PalisadeClusterBehaviorModel",
            Watching::Nothing,
            changed.clone(),
            unreconciled.clone(),
        );
        // Not waited for: an agent that may not list them rejects only the policies that need
        // them (the reflectors log why).
        let admission_listed = Arc::new(AtomicBool::new(false));
        tokio::spawn({
            let (services, slices) = (admission_services.clone(), admission_slices.clone());
            let (listed, changed) = (admission_listed.clone(), changed);
            async move {
                if services.wait_until_ready().await.is_ok()
                    && slices.wait_until_ready().await.is_ok()
                {
                    listed.store(true, Ordering::Relaxed);
                    let _ = changed.try_send(());
                }
            }
        });
        info!(
            node,
            "waiting for the first list of policies, pods, namespaces and models"
        );
        policies.wait_until_ready().await?;
        cluster_policies.wait_until_ready().await?;
        pods.wait_until_ready().await?;
        namespaces.wait_until_ready().await?;
        namespaced_models.wait_until_ready().await?;
        cluster_models.wait_until_ready().await?;
        let (observations, receiver) = watch::channel(Vec::new());
        tokio::spawn(
            StatusWriter::new(client.clone(), node.to_owned(), status_interval).run(receiver),
        );
        let (writes, to_write) = mpsc::unbounded_channel();
        let model_writer =
            tokio::spawn(ModelWriter::new(client, node.to_owned(), status_interval).run(to_write));
        let models = ClusterModels::new(node.to_owned(), namespaced_models, cluster_models, writes);
        Ok(Self {
            reconciler,
            policies,
            cluster_policies,
            pods,
            namespaces,
            admission_services,
            admission_slices,
            admission_listed,
            models: Models::new(models),
            model_writer,
            observations,
            metrics,
            unreconciled,
        })
    }

    fn objects(&self) -> Objects {
        let mut policies: Vec<PolicyObject> = self
            .policies
            .state()
            .iter()
            .map(|policy| PolicyObject::from(policy.as_ref()))
            .chain(
                self.cluster_policies
                    .state()
                    .iter()
                    .map(|policy| PolicyObject::from(policy.as_ref())),
            )
            .collect();
        policies.sort_by(|a, b| a.key.cmp(&b.key));
        Objects {
            policies,
            pods: self.pods.state(),
            namespaces: self
                .namespaces
                .state()
                .iter()
                .map(|namespace| (namespace.name_any(), namespace.labels().clone()))
                .collect(),
            ingress_admission: self.admission_listed.load(Ordering::Relaxed).then(|| {
                admission_destinations(
                    &self.admission_services.state(),
                    &self.admission_slices.state(),
                )
            }),
        }
    }

    /// Brings the kernel in line with the cluster; logs new errors and hands the reports to the
    /// status writer.
    pub fn reconcile(&mut self, enforcer: &mut impl Enforce) {
        let since = self.unreconciled.lock().expect("not poisoned").take();
        let installs = self.reconciler.installs();
        let objects = self.objects();
        let (reports, errors) = self
            .reconciler
            .reconcile(&objects, &mut self.models, enforcer);
        if let Some(since) = since
            && self.reconciler.installs() > installs
        {
            self.metrics
                .apply_seconds
                .observe(since.elapsed().as_secs_f64());
        }
        for err in errors {
            error!("{err}");
        }
        self.metrics
            .policies
            .set(self.reconciler.accepted_policies() as i64);
        self.metrics
            .policy_errors
            .set(self.reconciler.errors() as i64);
        let observed = observations(&objects.policies, reports);
        self.observations.send_if_modified(|current| {
            let changed = *current != observed;
            *current = observed;
            changed
        });
    }

    /// Whether the last reconcile protected every pod its policy selects.
    pub fn all_enforced(&self) -> bool {
        self.reconciler.all_enforced()
    }

    /// The agent stops: the models being recorded are written as they are (incomplete), for at
    /// most MODEL_WRITE_GRACE.
    pub async fn stop_modeling(mut self, enforcer: &mut impl Enforce) {
        self.models.stop(enforcer);
        // Closes the writer's channel: it returns once it tried what is left.
        drop(self.models);
        if tokio::time::timeout(MODEL_WRITE_GRACE, self.model_writer)
            .await
            .is_err()
        {
            warn!(
                "behaviour models still unwritten after {} s: lost",
                MODEL_WRITE_GRACE.as_secs()
            );
        }
    }
}

/// Which changes to an object ask for a reconcile.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Watching {
    Everything,
    /// New objects, deleted ones, and new generations (of the spec): a policy's status, which
    /// the agent of every node selecting pods writes, asks for none. The next reconcile (at the
    /// latest the resync) sees it.
    Generations,
    /// None: the store is read when needed (this agent's own models).
    Nothing,
}

/// Keeps a store of what `stream` sees, asking for a reconcile at every change `watching`
/// names (and noting when the first one not reconciled yet came in `unreconciled`).
fn reflect<K, S>(
    stream: S,
    what: &'static str,
    watching: Watching,
    changed: mpsc::Sender<()>,
    unreconciled: Arc<Mutex<Option<Instant>>>,
) -> Store<K>
where
    K: Resource + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone,
    S: futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
{
    let (store, writer) = reflector::store();
    let stream = stream.reflect(writer);
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        // The generation last seen of each object, by UID.
        let mut generations = HashMap::new();
        while let Some(event) = stream.next().await {
            match event {
                Ok(_) if watching == Watching::Nothing => {}
                Ok(event)
                    if watching == Watching::Generations
                        && !new_generation(&mut generations, &event) => {}
                Ok(_) => {
                    unreconciled
                        .lock()
                        .expect("not poisoned")
                        .get_or_insert_with(Instant::now);
                    let _ = changed.try_send(());
                }
                // The watcher retries with backoff.
                Err(err) => warn!("watching {what}: {err}"),
            }
        }
    });
    store
}

/// Whether `event` brings a new object, a new generation of one or a deletion; remembers the
/// generation of each object in `seen`, by UID.
fn new_generation<K: Resource>(
    seen: &mut HashMap<Option<String>, Option<i64>>,
    event: &watcher::Event<K>,
) -> bool {
    match event {
        watcher::Event::Apply(object) | watcher::Event::InitApply(object) => {
            let generation = object.meta().generation;
            seen.insert(object.uid(), generation) != Some(generation)
        }
        watcher::Event::Delete(object) => {
            seen.remove(&object.uid());
            true
        }
        // A new list: objects deleted meanwhile are not in it.
        watcher::Event::Init => {
            seen.clear();
            true
        }
        watcher::Event::InitDone => true,
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;

    use super::*;

    fn object(uid: &str, generation: i64) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                uid: Some(uid.to_owned()),
                generation: Some(generation),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        }
    }

    #[test]
    fn only_new_objects_generations_and_deletions_ask_for_a_reconcile() {
        let mut seen = HashMap::new();
        let apply = |uid, generation| watcher::Event::Apply(object(uid, generation));
        assert!(new_generation(&mut seen, &apply("a", 1)), "a new object");
        // What a status write is to a policy: a change that keeps the generation.
        let mut written = object("a", 1);
        written.data = Some([("status".to_owned(), "new".to_owned())].into());
        assert!(!new_generation(&mut seen, &watcher::Event::Apply(written)));
        assert!(
            new_generation(&mut seen, &apply("a", 2)),
            "a new generation"
        );
        assert!(new_generation(&mut seen, &apply("b", 2)), "another object");
        assert!(new_generation(
            &mut seen,
            &watcher::Event::Delete(object("b", 2))
        ));
        assert!(
            new_generation(&mut seen, &apply("b", 2)),
            "after its deletion"
        );
        assert!(new_generation(
            &mut seen,
            &watcher::Event::<ConfigMap>::InitDone
        ));
    }
}

//! The DaemonSet that runs the agent (`--daemonset`), watched to tell an uninstall from a
//! restart when the agent stops. Enforcement stays pinned while the DaemonSet stays (an upgrade,
//! a deleted pod, a node reboot's restart): its next pod takes it over. When the DaemonSet is
//! deleted with its pods (`helm uninstall`), the stopping agent removes its pinned state, and the
//! node is left as it was before the install. A DaemonSet deleted with its pods orphaned
//! (`--cascade=orphan`, to replace it) is not an uninstall, and neither is anything the agent
//! could not see: it fails closed, keeping enforcement pinned.

use std::{
    fmt,
    str::FromStr,
    sync::{Arc, Mutex},
};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::DaemonSet;
use kube::{
    Api, Client,
    runtime::{WatchStreamExt, watcher},
};
use tracing::{info, warn};

/// What has become of the agent's DaemonSet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lifecycle {
    /// Not seen yet.
    Unknown,
    Running,
    /// Deleted (or being deleted) with its pods orphaned, or missing when the agent started: an
    /// agent of another DaemonSet may take the pinned state over.
    Orphaning,
    /// Deleted (or being deleted) with its pods.
    Uninstalling,
}

/// What a watch of the DaemonSet tells.
#[derive(Clone, Copy)]
enum Seen<'a> {
    Present(&'a DaemonSet),
    Gone,
}

impl Lifecycle {
    fn next(self, seen: Seen) -> Self {
        let Seen::Present(daemonset) = seen else {
            // The garbage collector removes the orphan finalizer before the object goes; a
            // DaemonSet never seen is not this agent's to uninstall.
            return match self {
                Self::Orphaning | Self::Unknown => Self::Orphaning,
                Self::Running | Self::Uninstalling => Self::Uninstalling,
            };
        };
        if daemonset.metadata.deletion_timestamp.is_none() {
            return Self::Running;
        }
        let finalizers = daemonset.metadata.finalizers.iter().flatten();
        let mut finalizers = finalizers.map(String::as_str);
        match finalizers.find(|f| matches!(*f, "orphan" | "foregroundDeletion")) {
            Some("orphan") => Self::Orphaning,
            Some(_) => Self::Uninstalling,
            // Being deleted, its pods' fate decided earlier (or by another finalizer's owner).
            None if self == Self::Orphaning => Self::Orphaning,
            None => Self::Uninstalling,
        }
    }
}

/// Reads a watch of the DaemonSet: what each event tells, given whether the list the watch
/// (re)started with held the DaemonSet so far.
fn seen<'a>(event: &'a watcher::Event<DaemonSet>, listed: &mut bool) -> Option<Seen<'a>> {
    match event {
        watcher::Event::Init => {
            *listed = false;
            None
        }
        watcher::Event::InitApply(daemonset) => {
            *listed = true;
            Some(Seen::Present(daemonset))
        }
        // Deleted while the watch was down.
        watcher::Event::InitDone => (!*listed).then_some(Seen::Gone),
        watcher::Event::Apply(daemonset) => Some(Seen::Present(daemonset)),
        watcher::Event::Delete(_) => Some(Seen::Gone),
    }
}

/// A DaemonSet's name, `NAMESPACE/NAME`.
#[derive(Clone, Debug)]
pub struct DaemonSetName {
    pub namespace: String,
    pub name: String,
}

impl FromStr for DaemonSetName {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.split_once('/') {
            Some((namespace, name))
                if !namespace.is_empty() && !name.is_empty() && !name.contains('/') =>
            {
                Ok(Self {
                    namespace: namespace.to_owned(),
                    name: name.to_owned(),
                })
            }
            _ => Err(format!("\"{text}\" is not NAMESPACE/NAME")),
        }
    }
}

impl fmt::Display for DaemonSetName {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// The agent's DaemonSet as last seen.
pub struct Owner {
    lifecycle: Arc<Mutex<Lifecycle>>,
}

impl Owner {
    /// Starts watching `daemonset`.
    pub fn watch(client: Client, daemonset: &DaemonSetName) -> Self {
        let lifecycle = Arc::new(Mutex::new(Lifecycle::Unknown));
        let config =
            watcher::Config::default().fields(&format!("metadata.name={}", daemonset.name));
        let api = Api::<DaemonSet>::namespaced(client, &daemonset.namespace);
        let mut events = watcher(api, config).default_backoff().boxed();
        let daemonset = daemonset.to_string();
        let shared = lifecycle.clone();
        tokio::spawn(async move {
            let mut listed = false;
            while let Some(event) = events.next().await {
                let event = match event {
                    Ok(event) => event,
                    // The watcher retries with backoff.
                    Err(err) => {
                        warn!("watching the agent's DaemonSet {daemonset}: {err}");
                        continue;
                    }
                };
                let Some(seen) = seen(&event, &mut listed) else {
                    continue;
                };
                let mut lifecycle = shared.lock().unwrap();
                let next = lifecycle.next(seen);
                if *lifecycle == Lifecycle::Unknown && next == Lifecycle::Orphaning {
                    warn!(
                        "the agent's DaemonSet {daemonset} (--daemonset) does not exist: \
                         enforcement stays pinned when this agent stops"
                    );
                } else if next != *lifecycle {
                    info!(%daemonset, lifecycle = ?next, "the agent's DaemonSet");
                }
                *lifecycle = next;
            }
        });
        Self { lifecycle }
    }

    /// Whether the DaemonSet was deleted with its pods: the agent is being uninstalled.
    pub fn uninstalling(&self) -> bool {
        *self.lifecycle.lock().unwrap() == Lifecycle::Uninstalling
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;
    use watcher::Event::{Apply, Delete, Init, InitApply, InitDone};

    fn daemonset(deleting: bool, finalizers: &[&str]) -> DaemonSet {
        let mut daemonset = DaemonSet::default();
        if deleting {
            daemonset.metadata.deletion_timestamp = Some(Time(Default::default()));
        }
        daemonset.metadata.finalizers = Some(finalizers.iter().map(|f| f.to_string()).collect());
        daemonset
    }

    /// The lifecycle after a watch's `events`.
    fn after(events: &[watcher::Event<DaemonSet>]) -> Lifecycle {
        let mut listed = false;
        events
            .iter()
            .filter_map(|event| seen(event, &mut listed))
            .fold(Lifecycle::Unknown, Lifecycle::next)
    }

    fn listed(daemonset: DaemonSet) -> Vec<watcher::Event<DaemonSet>> {
        vec![Init, InitApply(daemonset), InitDone]
    }

    #[test]
    fn a_daemonset_deleted_with_its_pods_is_an_uninstall() {
        let present = || daemonset(false, &[]);
        // Background deletion (helm uninstall): gone at once.
        let mut events = listed(present());
        events.push(Delete(present()));
        assert_eq!(after(&events), Lifecycle::Uninstalling);
        // Foreground deletion: its pods go first.
        let mut events = listed(present());
        events.push(Apply(daemonset(true, &["foregroundDeletion"])));
        assert_eq!(after(&events), Lifecycle::Uninstalling);
        // Deleted while the watch was down: the next list misses it.
        let mut events = listed(present());
        events.extend([Init, InitDone]);
        assert_eq!(after(&events), Lifecycle::Uninstalling);
    }

    #[test]
    fn a_daemonset_deleted_with_its_pods_orphaned_is_not() {
        let mut events = listed(daemonset(false, &[]));
        events.extend([
            Apply(daemonset(true, &["orphan"])),
            Apply(daemonset(true, &[])),
            Delete(daemonset(true, &[])),
        ]);
        assert_eq!(after(&events), Lifecycle::Orphaning);
        // Its replacement adopts the pods.
        events.push(Apply(daemonset(false, &[])));
        assert_eq!(after(&events), Lifecycle::Running);
        // A second deletion that takes the pods after all.
        let mut events = listed(daemonset(false, &[]));
        events.extend([
            Apply(daemonset(true, &["orphan"])),
            Apply(daemonset(true, &["foregroundDeletion"])),
        ]);
        assert_eq!(after(&events), Lifecycle::Uninstalling);
    }

    #[test]
    fn daemonset_names_are_namespace_slash_name() {
        let parsed: DaemonSetName = "palisade/agent".parse().unwrap();
        assert_eq!(
            (parsed.namespace.as_str(), parsed.name.as_str()),
            ("palisade", "agent")
        );
        for bad in ["agent", "/agent", "palisade/", "a/b/c"] {
            assert!(bad.parse::<DaemonSetName>().is_err(), "{bad}");
        }
    }

    #[test]
    fn nothing_seen_is_no_uninstall() {
        assert_eq!(after(&[]), Lifecycle::Unknown);
        assert_eq!(after(&[Init]), Lifecycle::Unknown);
        // Missing from the start: an orphaned agent restarted.
        assert_eq!(after(&[Init, InitDone]), Lifecycle::Orphaning);
        let mut events = vec![Init, InitDone];
        events.push(Delete(daemonset(false, &[])));
        assert_eq!(after(&events), Lifecycle::Orphaning);
        assert_eq!(after(&listed(daemonset(false, &[]))), Lifecycle::Running);
    }
}

//! Which pods a policy's target selects: by the workload that owns them, by their labels, and for
//! cluster policies by their namespace's labels.

use std::collections::BTreeMap;

use k8s_openapi::{api::core::v1::Pod, apimachinery::pkg::apis::meta::v1::LabelSelector};
use kube::core::{Selector, SelectorExt};
use palisade_crds::{Target, WorkloadKind};

/// The workloads that own `pod`, nearest first: the pod itself, its controller, and for a
/// ReplicaSet made by a Deployment (named `<deployment>-<pod-template-hash>`), the Deployment.
pub fn owners(pod: &Pod) -> Vec<(WorkloadKind, String)> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let mut owners = vec![(WorkloadKind::Pod, name)];
    let controller = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|owner| owner.controller == Some(true));
    let Some(controller) = controller else {
        return owners;
    };
    let kind = match controller.kind.as_str() {
        "ReplicaSet" => WorkloadKind::ReplicaSet,
        "StatefulSet" => WorkloadKind::StatefulSet,
        "DaemonSet" => WorkloadKind::DaemonSet,
        "Job" => WorkloadKind::Job,
        _ => return owners,
    };
    owners.push((kind, controller.name.clone()));
    let template_hash = pod
        .metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get("pod-template-hash"));
    if kind == WorkloadKind::ReplicaSet
        && let Some(deployment) = template_hash
            .and_then(|hash| controller.name.strip_suffix(hash.as_str()))
            .and_then(|prefix| prefix.strip_suffix('-'))
    {
        owners.push((WorkloadKind::Deployment, deployment.to_owned()));
    }
    owners
}

/// Whether `selector` selects `labels`; a selector that cannot be read selects nothing (the API
/// server's schema makes that rare: an operator outside In/NotIn/Exists/DoesNotExist).
fn matches(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    Selector::try_from(selector.clone()).is_ok_and(|selector| selector.matches(labels))
}

/// Whether `target` selects `pod`, whose namespace has `namespace_labels`. The caller checks the
/// namespace of a namespaced policy.
pub fn selects(target: &Target, pod: &Pod, namespace_labels: &BTreeMap<String, String>) -> bool {
    let no_labels = BTreeMap::new();
    let labels = pod.metadata.labels.as_ref().unwrap_or(&no_labels);
    if target
        .namespace_selector
        .as_ref()
        .is_some_and(|selector| !matches(selector, namespace_labels))
    {
        return false;
    }
    if target
        .selector
        .as_ref()
        .is_some_and(|selector| !matches(selector, labels))
    {
        return false;
    }
    match target.kind {
        None => target.selector.is_some(),
        Some(kind) => owners(pod).iter().any(|(owner_kind, name)| {
            *owner_kind == kind
                && target
                    .names
                    .as_ref()
                    .is_none_or(|names| names.contains(name))
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
        LabelSelectorRequirement, ObjectMeta, OwnerReference,
    };

    fn pod(name: &str, labels: &[(&str, &str)], controller: Option<(&str, &str)>) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(
                    labels
                        .iter()
                        .map(|(key, value)| (key.to_string(), value.to_string()))
                        .collect(),
                ),
                owner_references: controller.map(|(kind, name)| {
                    vec![OwnerReference {
                        kind: kind.into(),
                        name: name.into(),
                        controller: Some(true),
                        ..Default::default()
                    }]
                }),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn target(kind: Option<WorkloadKind>, names: &[&str]) -> Target {
        Target {
            cgroup_path: None,
            kind,
            names: (!names.is_empty()).then(|| names.iter().map(|name| name.to_string()).collect()),
            selector: None,
            namespace_selector: None,
        }
    }

    fn labels(pairs: &[(&str, &str)]) -> LabelSelector {
        LabelSelector {
            match_labels: Some(
                pairs
                    .iter()
                    .map(|(key, value)| (key.to_string(), value.to_string()))
                    .collect(),
            ),
            match_expressions: None,
        }
    }

    #[test]
    fn a_deployment_is_found_through_its_replica_set() {
        let web = pod(
            "web-5d8f-abcde",
            &[("pod-template-hash", "5d8f")],
            Some(("ReplicaSet", "web-5d8f")),
        );
        assert_eq!(
            owners(&web),
            [
                (WorkloadKind::Pod, "web-5d8f-abcde".into()),
                (WorkloadKind::ReplicaSet, "web-5d8f".into()),
                (WorkloadKind::Deployment, "web".into()),
            ]
        );
        let none = BTreeMap::new();
        assert!(selects(
            &target(Some(WorkloadKind::Deployment), &["web"]),
            &web,
            &none
        ));
        assert!(selects(
            &target(Some(WorkloadKind::ReplicaSet), &["web-5d8f"]),
            &web,
            &none
        ));
        assert!(!selects(
            &target(Some(WorkloadKind::Deployment), &["api"]),
            &web,
            &none
        ));
        assert!(!selects(
            &target(Some(WorkloadKind::StatefulSet), &["web"]),
            &web,
            &none
        ));
        // A ReplicaSet of its own (no template hash) is no Deployment's.
        let bare = pod("cache-x1", &[], Some(("ReplicaSet", "cache")));
        assert_eq!(owners(&bare).len(), 2);
        let db = pod("db-0", &[], Some(("StatefulSet", "db")));
        assert!(selects(
            &target(Some(WorkloadKind::StatefulSet), &["db"]),
            &db,
            &none
        ));
        assert!(selects(
            &target(Some(WorkloadKind::Pod), &["db-0"]),
            &db,
            &none
        ));
    }

    #[test]
    fn labels_and_namespace_labels_narrow_the_choice() {
        let web = pod("web-1", &[("app", "web"), ("tier", "front")], None);
        let prod = BTreeMap::from([("env".to_string(), "prod".to_string())]);
        let mut by_labels = target(None, &[]);
        by_labels.selector = Some(labels(&[("app", "web")]));
        assert!(selects(&by_labels, &web, &prod));
        by_labels.selector = Some(LabelSelector {
            match_labels: None,
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "tier".into(),
                operator: "NotIn".into(),
                values: Some(vec!["front".into()]),
            }]),
        });
        assert!(!selects(&by_labels, &web, &prod));
        let mut in_prod = target(Some(WorkloadKind::Pod), &["web-1"]);
        in_prod.namespace_selector = Some(labels(&[("env", "prod")]));
        assert!(selects(&in_prod, &web, &prod));
        assert!(!selects(&in_prod, &web, &BTreeMap::new()));
        // kind without names: every workload of that kind, here with the labels too.
        let mut pods_of_web = target(Some(WorkloadKind::Pod), &[]);
        pods_of_web.selector = Some(labels(&[("app", "web")]));
        assert!(selects(&pods_of_web, &web, &prod));
        assert!(!selects(&target(None, &[]), &web, &prod), "selects nothing");
    }
}

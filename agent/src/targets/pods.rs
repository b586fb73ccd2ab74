//! Where the kubelet puts a pod's cgroup: below the QoS class's cgroup, named after the pod's
//! UID, in the layout of the kubelet's cgroup driver; its containers' cgroups below it, named by
//! the container runtime; and which pod and container a cgroup id is, for audit events.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::{Arc, RwLock},
};

use serde::Serialize;

/// The kubelet's cgroup driver, which decides how pod cgroups are named.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CgroupDriver {
    /// `kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<UID>.slice` (dashes of the
    /// UID become underscores).
    Systemd,
    /// `kubepods/burstable/pod<UID>`.
    Cgroupfs,
}

impl CgroupDriver {
    /// The driver whose top cgroup exists below `mount`, if any does.
    pub fn detect(mount: &Path) -> Option<Self> {
        if mount.join("kubepods.slice").is_dir() {
            Some(Self::Systemd)
        } else if mount.join("kubepods").is_dir() {
            Some(Self::Cgroupfs)
        } else {
            None
        }
    }

    /// The cgroup of the pod `uid` of QoS class `qos` (`Guaranteed`, `Burstable`, `BestEffort`),
    /// relative to the cgroup2 mount, as (parent, name): the parent exists while the kubelet
    /// runs, the pod's own cgroup only once the kubelet starts the pod.
    pub fn pod_cgroup(self, qos: &str, uid: &str) -> Result<(PathBuf, String), String> {
        let class = match qos {
            "Guaranteed" => None,
            "Burstable" => Some("burstable"),
            "BestEffort" => Some("besteffort"),
            other => return Err(format!("unknown QoS class \"{other}\"")),
        };
        Ok(match (self, class) {
            (Self::Systemd, None) => (
                PathBuf::from("kubepods.slice"),
                format!("kubepods-pod{}.slice", uid.replace('-', "_")),
            ),
            (Self::Systemd, Some(class)) => (
                PathBuf::from(format!("kubepods.slice/kubepods-{class}.slice")),
                format!("kubepods-{class}-pod{}.slice", uid.replace('-', "_")),
            ),
            (Self::Cgroupfs, None) => (PathBuf::from("kubepods"), format!("pod{uid}")),
            (Self::Cgroupfs, Some(class)) => (
                PathBuf::from(format!("kubepods/{class}")),
                format!("pod{uid}"),
            ),
        })
    }
}

/// The container id in the name of a container's cgroup below its pod's: containerd
/// (`cri-containerd-<id>.scope` with the systemd driver, `<id>` with cgroupfs) and CRI-O
/// (`crio-<id>.scope`, `crio-<id>`). Its conmon's cgroup (`crio-conmon-<id>.scope`) is none.
pub fn container_id(cgroup_name: &str) -> Option<&str> {
    let name = cgroup_name.strip_suffix(".scope").unwrap_or(cgroup_name);
    let id = name
        .strip_prefix("cri-containerd-")
        .or_else(|| name.strip_prefix("crio-"))
        .unwrap_or(name);
    (id.len() == 64 && id.bytes().all(|byte| byte.is_ascii_hexdigit())).then_some(id)
}

/// A pod (and container) of this node, as audit events name it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PodIdentity {
    pub namespace: String,
    pub pod: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
}

/// The pods and containers of the protected pods, by cgroup id: written by the Kubernetes
/// reconciler, read by the event decoder.
#[derive(Debug, Clone, Default)]
pub struct PodRegistry(Arc<RwLock<HashMap<u64, PodIdentity>>>);

impl PodRegistry {
    pub fn get(&self, cgroup_id: u64) -> Option<PodIdentity> {
        let pods = self.0.read().unwrap_or_else(|poison| poison.into_inner());
        pods.get(&cgroup_id).cloned()
    }

    pub fn replace(&self, pods: HashMap<u64, PodIdentity>) {
        *self.0.write().unwrap_or_else(|poison| poison.into_inner()) = pods;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_cgroups_in_both_layouts() {
        let uid = "3f2a-77b1";
        let path = |driver: CgroupDriver, qos| {
            let (parent, name) = driver.pod_cgroup(qos, uid).unwrap();
            parent.join(name).display().to_string()
        };
        assert_eq!(
            path(CgroupDriver::Systemd, "Guaranteed"),
            "kubepods.slice/kubepods-pod3f2a_77b1.slice"
        );
        assert_eq!(
            path(CgroupDriver::Systemd, "Burstable"),
            "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod3f2a_77b1.slice"
        );
        assert_eq!(
            path(CgroupDriver::Systemd, "BestEffort"),
            "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod3f2a_77b1.slice"
        );
        assert_eq!(
            path(CgroupDriver::Cgroupfs, "Guaranteed"),
            "kubepods/pod3f2a-77b1"
        );
        assert_eq!(
            path(CgroupDriver::Cgroupfs, "BestEffort"),
            "kubepods/besteffort/pod3f2a-77b1"
        );
        assert!(CgroupDriver::Cgroupfs.pod_cgroup("Premium", uid).is_err());
    }

    #[test]
    fn container_ids_in_every_runtime_naming() {
        let id = "4f1c".repeat(16);
        for name in [
            format!("cri-containerd-{id}.scope"),
            format!("crio-{id}.scope"),
            format!("crio-{id}"),
            id.clone(),
        ] {
            assert_eq!(container_id(&name), Some(id.as_str()), "{name}");
        }
        assert_eq!(container_id(&format!("crio-conmon-{id}.scope")), None);
        assert_eq!(container_id("init.scope"), None);
        assert_eq!(container_id(&id[1..]), None);
    }

    #[test]
    fn the_driver_is_found_by_its_top_cgroup() {
        let root = std::env::temp_dir().join(format!("palisade-driver-{}", std::process::id()));
        std::fs::create_dir_all(&root).unwrap();
        assert_eq!(CgroupDriver::detect(&root), None);
        std::fs::create_dir(root.join("kubepods")).unwrap();
        assert_eq!(CgroupDriver::detect(&root), Some(CgroupDriver::Cgroupfs));
        std::fs::create_dir(root.join("kubepods.slice")).unwrap();
        assert_eq!(CgroupDriver::detect(&root), Some(CgroupDriver::Systemd));
        std::fs::remove_dir_all(&root).unwrap();
    }
}

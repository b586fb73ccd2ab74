//! Where the kubelet puts a pod's cgroup: below the QoS class's cgroup, named after the pod's
//! UID, in the layout of the kubelet's cgroup driver.

use std::path::{Path, PathBuf};

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

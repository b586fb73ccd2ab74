//! Where a policy is enforced, and what placing it needs from the kernel side.

use std::{path::Path, sync::Arc};

use aya::maps::MapError;

use super::{Cgroup, CgroupError, Hierarchy};
use crate::{
    bpf::{EnforceError, Records, pending_key},
    policy::CompiledPolicy,
};

#[derive(Debug, thiserror::Error)]
pub enum StageError {
    #[error(
        "cannot arm \"{0}\" before it exists: only cgroup names of 1 to 127 bytes without '/' can be"
    )]
    Name(String),
    #[error("cannot arm a cgroup deeper than level {max}", max = palisade_common::MAX_LEVEL)]
    TooDeep,
    #[error("{0}")]
    Map(#[from] MapError),
    #[error("{0}")]
    Enforce(#[from] EnforceError),
}

/// What reconciling needs from the kernel side (a seam for tests).
pub trait Enforce {
    fn apply(&mut self, target: &Cgroup, policy: Arc<CompiledPolicy>) -> Result<(), EnforceError>;
    fn remove(&mut self, target_id: u64) -> Result<bool, MapError>;
    fn stage(
        &mut self,
        parent: &Cgroup,
        name: &str,
        policy: Arc<CompiledPolicy>,
    ) -> Result<(), StageError>;
    fn unstage(&mut self, parent_id: u64, name: &str) -> Result<bool, StageError>;
    /// Whether cgroup `target_id` is a target, whoever made it one (after a restart, the
    /// previous agent).
    fn is_target(&self, target_id: u64) -> bool;
    /// Whether cgroup `name` below `parent_id` is armed, whoever armed it.
    fn is_armed(&self, parent_id: u64, name: &str) -> bool;
    /// Opens a behaviour model: policies recording into its id have their targets' behaviour
    /// recorded.
    fn open_model(&mut self) -> Result<u32, EnforceError>;
    /// Takes out what the targets of recording policies did since the last call, with each
    /// open model's count of what could not be recorded.
    fn take_model_records(&mut self) -> Result<Records, MapError>;
    /// Closes a model: what is still recorded into it is lost.
    fn close_model(&mut self, model_id: u32) -> Result<(), MapError>;
}

/// Where a policy is enforced: on its target, or armed for a target not created yet (the kernel
/// makes the new cgroup a target before any process can enter it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    Target(Cgroup),
    Staged { parent: Cgroup, name: String },
}

impl Placement {
    /// The cgroup at `path` (absolute or relative to the mount), or its parent when only the
    /// parent exists yet.
    pub fn locate(cgroups: &Hierarchy, path: &str) -> Result<Self, CgroupError> {
        match cgroups.open(path) {
            Ok(target) => Ok(Placement::Target(target)),
            Err(missing @ CgroupError::Missing(_)) => {
                let path = Path::new(path);
                let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
                    return Err(missing);
                };
                let name = name.to_string_lossy().into_owned();
                match cgroups.open(&parent.to_string_lossy()) {
                    Ok(parent) if pending_key(parent.id, &name).is_none() => {
                        Err(CgroupError::Unarmable(parent.path.join(name)))
                    }
                    Ok(parent) => Ok(Placement::Staged { parent, name }),
                    Err(_) => Err(missing),
                }
            }
            Err(err) => Err(err),
        }
    }

    /// Whether `locate` would still find this: the target was not recreated (a new id) and a
    /// staged target was not created since.
    pub fn is_current(&self, cgroups: &Hierarchy) -> bool {
        match self {
            Placement::Target(target) => cgroups
                .open(&target.path.to_string_lossy())
                .is_ok_and(|now| now.id == target.id),
            Placement::Staged { parent, name } => matches!(
                cgroups.open(&parent.path.join(name).to_string_lossy()),
                Err(CgroupError::Missing(_))
            ),
        }
    }

    /// Puts `policy` on, replacing what was there; an error means nothing changed.
    pub fn install(
        &self,
        enforcer: &mut impl Enforce,
        policy: Arc<CompiledPolicy>,
    ) -> Result<(), String> {
        match self {
            Placement::Target(target) => enforcer
                .apply(target, policy)
                .map_err(|err| err.to_string()),
            Placement::Staged { parent, name } => enforcer
                .stage(parent, name, policy)
                .map_err(|err| err.to_string()),
        }
    }

    pub fn describe(&self) -> String {
        match self {
            Placement::Target(target) => target.path.display().to_string(),
            Placement::Staged { parent, name } => {
                format!("{} (armed until created)", parent.path.join(name).display())
            }
        }
    }

    /// Whether the kernel has a policy here (enforced, or armed), whoever put it there.
    pub fn is_held(&self, enforcer: &impl Enforce) -> bool {
        match self {
            Placement::Target(target) => enforcer.is_target(target.id),
            Placement::Staged { parent, name } => enforcer.is_armed(parent.id, name),
        }
    }

    /// Takes the policy off.
    pub fn remove(&self, enforcer: &mut impl Enforce) -> Result<(), String> {
        match self {
            Placement::Target(target) => enforcer
                .remove(target.id)
                .map(drop)
                .map_err(|err| err.to_string()),
            Placement::Staged { parent, name } => enforcer
                .unstage(parent.id, name)
                .map(drop)
                .map_err(|err| err.to_string()),
        }
    }
}

//! A kernel for tests of reconciling (the `fake-kernel` feature, for the Kubernetes suite).

use std::{collections::HashMap, sync::Arc};

use aya::maps::MapError;

use super::{Cgroup, Enforce, Placement, StageError};
use crate::policy::CompiledPolicy;

/// A kernel for tests: records the policies enforced, by target id, and staged, by parent id
/// and name; can be told to fail.
#[derive(Debug, Default)]
pub struct FakeKernel {
    pub enforced: HashMap<u64, Arc<CompiledPolicy>>,
    pub staged: HashMap<(u64, String), Arc<CompiledPolicy>>,
    pub fail: bool,
}

impl Enforce for FakeKernel {
    fn apply(&mut self, target: &Cgroup, policy: Arc<CompiledPolicy>) -> Result<(), MapError> {
        if self.fail {
            return Err(MapError::KeyNotFound);
        }
        self.enforced.insert(target.id, policy);
        Ok(())
    }

    fn remove(&mut self, target_id: u64) -> Result<bool, MapError> {
        Ok(self.enforced.remove(&target_id).is_some())
    }

    fn stage(
        &mut self,
        parent: &Cgroup,
        name: &str,
        policy: Arc<CompiledPolicy>,
    ) -> Result<(), StageError> {
        self.staged.insert((parent.id, name.to_owned()), policy);
        Ok(())
    }

    fn unstage(&mut self, parent_id: u64, name: &str) -> Result<bool, StageError> {
        Ok(self.staged.remove(&(parent_id, name.to_owned())).is_some())
    }

    fn holds(&self, placement: &Placement) -> bool {
        match placement {
            Placement::Target(target) => self.enforced.contains_key(&target.id),
            Placement::Staged { parent, name } => {
                self.staged.contains_key(&(parent.id, name.clone()))
            }
        }
    }
}

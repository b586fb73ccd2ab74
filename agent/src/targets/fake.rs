//! A kernel for tests of reconciling (the `fake-kernel` feature, for the Kubernetes suite).

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
};

use aya::{maps::MapError, sys::SyscallError};

use super::{Cgroup, Enforce, StageError};
use crate::{
    bpf::{EnforceError, MapSizes, Records},
    policy::CompiledPolicy,
};

/// A kernel for tests: records the policies enforced, by target id, and staged, by parent id
/// and name, and the behaviour models open; can be told to fail.
#[derive(Debug, Default)]
pub struct FakeKernel {
    pub enforced: HashMap<u64, Arc<CompiledPolicy>>,
    pub staged: HashMap<(u64, String), Arc<CompiledPolicy>>,
    pub fail: bool,
    pub models: HashSet<u32>,
    /// What the next `take_model_records` returns.
    pub records: Records,
    models_opened: u32,
}

impl FakeKernel {
    /// Fails as the kernel would: when told to, and for a policy with more path entries than
    /// the agent's default `path_prefixes` map holds (the kernel's map also counts the other
    /// policies' entries, and those of versions not retired yet).
    fn refuse(&self, policy: &CompiledPolicy) -> Result<(), EnforceError> {
        if self.fail {
            return Err(MapError::KeyNotFound.into());
        }
        let sizes = MapSizes::default();
        if policy.entries().prefixes.len() > sizes.path_entries as usize {
            // What a trie with no room left answers.
            let no_room = SyscallError {
                call: "bpf_map_update_elem",
                io_error: std::io::Error::from_raw_os_error(libc::ENOSPC),
            };
            return Err(sizes.full_or("path_prefixes", no_room.into()));
        }
        Ok(())
    }
}

impl Enforce for FakeKernel {
    fn apply(&mut self, target: &Cgroup, policy: Arc<CompiledPolicy>) -> Result<(), EnforceError> {
        self.refuse(&policy)?;
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
        self.refuse(&policy)?;
        self.staged.insert((parent.id, name.to_owned()), policy);
        Ok(())
    }

    fn unstage(&mut self, parent_id: u64, name: &str) -> Result<bool, StageError> {
        Ok(self.staged.remove(&(parent_id, name.to_owned())).is_some())
    }

    fn is_target(&self, target_id: u64) -> bool {
        self.enforced.contains_key(&target_id)
    }

    fn is_armed(&self, parent_id: u64, name: &str) -> bool {
        self.staged.contains_key(&(parent_id, name.to_owned()))
    }

    fn open_model(&mut self) -> Result<u32, EnforceError> {
        self.models_opened += 1;
        self.models.insert(self.models_opened);
        Ok(self.models_opened)
    }

    fn take_model_records(&mut self) -> Result<Records, MapError> {
        Ok(std::mem::take(&mut self.records))
    }

    fn close_model(&mut self, model_id: u32) -> Result<(), MapError> {
        self.models.remove(&model_id);
        Ok(())
    }
}

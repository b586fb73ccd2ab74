//! The kernel's side of BehaviorModeling (ebpf/programs/model.h): `model_records` holds, for
//! each model open, what its targets did since the agent last took the records out, and its
//! overflow record: what found the map full.

use std::{
    collections::HashSet,
    io,
    os::fd::{AsFd, AsRawFd, BorrowedFd},
};

use aya::maps::{HashMap, IterableMap, MapData, MapError};
use aya_obj::generated::{bpf_attr, bpf_cmd};
use palisade_common::{MODEL_OVERFLOW, ModelKey};

pub struct ModelRecords {
    map: HashMap<MapData, ModelKey, u64>,
    /// Models open: each has its overflow record.
    open: HashSet<u32>,
    /// The id the next model gets. Ids are not reused while the map may hold records of theirs.
    next_id: u32,
}

/// What one model's targets did: each distinct thing and how many times.
pub type Records = Vec<(ModelKey, u64)>;

fn overflow_key(model_id: u32) -> ModelKey {
    ModelKey {
        model_id,
        kind: MODEL_OVERFLOW,
        ..ModelKey::default()
    }
}

impl ModelRecords {
    /// Takes over the map; records an earlier agent left (of models it had open) stay until
    /// `purge`, and their ids are not given again.
    pub(super) fn new(map: HashMap<MapData, ModelKey, u64>) -> Self {
        let next_id = map
            .keys()
            .filter_map(Result::ok)
            .map(|key| key.model_id)
            .max()
            .map_or(1, |last| last.wrapping_add(1).max(1));
        Self {
            map,
            open: HashSet::new(),
            next_id,
        }
    }

    /// Opens a model: from now on, a policy with its id has its targets' records kept.
    pub fn open(&mut self) -> Result<u32, MapError> {
        let id = self.next_id;
        self.map.insert(overflow_key(id), 0, 0)?;
        self.next_id = id.wrapping_add(1).max(1);
        self.open.insert(id);
        Ok(id)
    }

    /// Takes the records out of the map, each read and deleted in one step (so that what the
    /// kernel counts meanwhile is in the count taken or stays in the map), with the overflow
    /// counts of the open models (which stay). Records of models not open are deleted.
    pub fn take(&mut self) -> Result<Records, MapError> {
        let keys: Vec<ModelKey> = self.map.keys().collect::<Result<_, _>>()?;
        let mut taken = Vec::with_capacity(keys.len());
        for key in keys {
            if key.kind == MODEL_OVERFLOW {
                if self.open.contains(&key.model_id) {
                    taken.push((key, self.map.get(&key, 0)?));
                }
                continue;
            }
            let fd = self.map.map().fd().as_fd();
            match lookup_and_delete(fd, &key) {
                Ok(Some(count)) if self.open.contains(&key.model_id) => taken.push((key, count)),
                Ok(_) => {}
                Err(io_error) => {
                    return Err(MapError::SyscallError(aya::sys::SyscallError {
                        call: "bpf_map_lookup_and_delete_elem",
                        io_error,
                    }));
                }
            }
        }
        Ok(taken)
    }

    /// Closes a model: its overflow record goes, and with it the last of its records (call
    /// `take` first for them). A policy still carrying its id has its records dropped by the
    /// kernel, counted as lost.
    pub fn close(&mut self, model_id: u32) -> Result<(), MapError> {
        self.open.remove(&model_id);
        match self.map.remove(&overflow_key(model_id)) {
            Err(MapError::KeyNotFound) | Ok(()) => {}
            Err(err) => return Err(err),
        }
        let keys: Vec<ModelKey> = self.map.keys().collect::<Result<_, _>>()?;
        for key in keys.iter().filter(|key| key.model_id == model_id) {
            match self.map.remove(key) {
                Err(MapError::KeyNotFound) | Ok(()) => {}
                Err(err) => return Err(err),
            }
        }
        Ok(())
    }

    /// Deletes the records of the models not open (an earlier agent's); returns how many.
    pub fn purge(&mut self) -> Result<usize, MapError> {
        let keys: Vec<ModelKey> = self.map.keys().collect::<Result<_, _>>()?;
        let mut purged = 0;
        for key in keys.iter().filter(|key| !self.open.contains(&key.model_id)) {
            match self.map.remove(key) {
                Ok(()) => purged += 1,
                Err(MapError::KeyNotFound) => {}
                Err(err) => return Err(err),
            }
        }
        Ok(purged)
    }
}

/// BPF_MAP_LOOKUP_AND_DELETE_ELEM on a hash map (Linux 5.14 and later), which aya offers only
/// for queues and stacks. None: the key is gone.
fn lookup_and_delete(fd: BorrowedFd<'_>, key: &ModelKey) -> io::Result<Option<u64>> {
    let mut value = 0u64;
    // SAFETY: bpf_attr is plain data, all zeroes a valid value.
    let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
    // SAFETY: the map element fields of the union, which this command reads.
    let elem = unsafe { &mut attr.__bindgen_anon_2 };
    elem.map_fd = fd.as_raw_fd() as u32;
    elem.key = std::ptr::from_ref(key) as u64;
    elem.__bindgen_anon_1.value = std::ptr::from_mut(&mut value) as u64;
    // SAFETY: the key and value pointers are valid for the sizes the map was created with
    // (ModelKey and u64, checked when the map was opened) for the duration of the call.
    let result = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            bpf_cmd::BPF_MAP_LOOKUP_AND_DELETE_ELEM as libc::c_long,
            std::ptr::from_mut(&mut attr),
            std::mem::size_of::<bpf_attr>(),
        )
    };
    if result == 0 {
        return Ok(Some(value));
    }
    let error = io::Error::last_os_error();
    if error.raw_os_error() == Some(libc::ENOENT) {
        Ok(None)
    } else {
        Err(error)
    }
}

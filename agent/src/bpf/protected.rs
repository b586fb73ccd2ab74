//! The agent's own files, kept from targets: their inodes in the kernel's `protected_inodes`,
//! with what targets may not do to each. The enforcer protects its executable, policies and
//! caches at start; the event file protects each file of its rotation as it creates it, from
//! the event worker's thread: both hold this handle.

use std::{
    collections::HashMap,
    fs::File,
    path::{Path, PathBuf},
    sync::{Arc, Mutex, MutexGuard},
};

use aya::maps::{HashMap as BpfHashMap, MapData, MapError};
use palisade_common::{InodeKey, PROTECT_CHANGE, PROTECT_READ};

use super::{OpenCache, inode_key};

/// What targets may not do to a file of the agent's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protection {
    /// Change it, or, for a directory, its entries.
    Change,
    /// Change or read it: the audit trail.
    ChangeAndRead,
}

impl Protection {
    fn bits(self) -> u32 {
        match self {
            Protection::Change => PROTECT_CHANGE,
            Protection::ChangeAndRead => PROTECT_CHANGE | PROTECT_READ,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ProtectError {
    #[error("cannot protect {path}: {source}")]
    Stat {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot protect a file: {0}")]
    Map(#[from] MapError),
}

#[derive(Clone)]
pub struct ProtectedFiles(Arc<Mutex<Inner>>);

struct Inner {
    map: BpfHashMap<MapData, InodeKey, u32>,
    /// Advanced when a protection is added: an open cached before may be of the file.
    open_cache: OpenCache,
    /// What this process protects, and how.
    own: HashMap<InodeKey, u32>,
}

impl ProtectedFiles {
    pub(super) fn new(map: BpfHashMap<MapData, InodeKey, u32>, open_cache: OpenCache) -> Self {
        Self(Arc::new(Mutex::new(Inner {
            map,
            open_cache,
            own: HashMap::new(),
        })))
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.0.lock().unwrap_or_else(|poison| poison.into_inner())
    }

    /// Protects the file (or directory) at `path`; returns its key.
    pub fn protect(&self, path: &Path, protection: Protection) -> Result<InodeKey, ProtectError> {
        let metadata = std::fs::metadata(path).map_err(|source| ProtectError::Stat {
            path: path.to_owned(),
            source,
        })?;
        self.protect_inode(inode_key(&metadata), protection)
    }

    /// Protects the open file `file` (one without a name yet, say); returns its key.
    pub fn protect_file(
        &self,
        file: &File,
        protection: Protection,
    ) -> Result<InodeKey, ProtectError> {
        let metadata = file.metadata().map_err(|source| ProtectError::Stat {
            path: PathBuf::from("an unnamed file"),
            source,
        })?;
        self.protect_inode(inode_key(&metadata), protection)
    }

    fn protect_inode(
        &self,
        key: InodeKey,
        protection: Protection,
    ) -> Result<InodeKey, ProtectError> {
        let mut inner = self.lock();
        let had = inner.own.get(&key).copied().unwrap_or(0);
        let bits = had | protection.bits();
        if bits == had {
            return Ok(key);
        }
        inner.map.insert(key, bits, 0)?;
        inner.own.insert(key, bits);
        // Protected all the same from every open not cached before.
        inner.open_cache.forget();
        Ok(key)
    }

    /// Ends the protection of a file that is gone: its inode number may be given to another.
    pub fn release(&self, key: InodeKey) -> Result<(), MapError> {
        let mut inner = self.lock();
        if inner.own.remove(&key).is_some() {
            match inner.map.remove(&key) {
                Err(MapError::KeyNotFound) | Ok(()) => {}
                Err(err) => return Err(err),
            }
        }
        Ok(())
    }

    /// Removes the protection of files this process does not protect (an earlier agent's).
    pub(super) fn remove_others(&self) -> Result<(), MapError> {
        let mut inner = self.lock();
        let others: Vec<InodeKey> = inner
            .map
            .keys()
            .filter_map(Result::ok)
            .filter(|key| !inner.own.contains_key(key))
            .collect();
        for key in &others {
            inner.map.remove(key)?;
        }
        Ok(())
    }
}

//! The loaded programs and their maps. Policies are installed under fresh policy ids and switched
//! in with one `targets` update, so a replacement is atomic and never reloads programs.

use std::{
    collections::{HashMap, VecDeque},
    sync::{Arc, RwLock},
};

use aya::{
    Btf, Ebpf, EbpfLoader,
    maps::{
        Array, ArrayOfMaps, HashMap as BpfHashMap, MapData, MapError, PerCpuArray, RingBuf,
        lpm_trie::{Key, LpmTrie},
    },
    programs::Lsm,
};
use palisade_common::{
    Config, GlobKey, GlobRule, KEY_PATH_LEN, MountTypeKey, NetworkKeyData, PathVerdict,
    Policy as KernelPolicy, STAT_EVENTS, STAT_EVENTS_DROPPED, STAT_UNDECIDED, SocketKey, Target,
    TriePath, Verdict,
};

use tracing::warn;

use super::{LoadError, OBJECT, PROGRAMS, Preflight};
use crate::{
    policy::{CompiledPolicy, NetworkEntry, TrieEntry},
    targets::Cgroup,
};

/// A policy as installed: what events need to name it.
#[derive(Debug)]
pub struct InstalledPolicy {
    pub policy: Arc<CompiledPolicy>,
    pub target: Cgroup,
}

/// Policy id -> installed policy, shared with the event decoder. Replaced and removed policies
/// stay listed for a while: events already in the ring buffer still name them.
#[derive(Debug, Clone, Default)]
pub struct PolicyRegistry(Arc<RwLock<Registry>>);

#[derive(Debug, Default)]
struct Registry {
    by_id: HashMap<u32, Arc<InstalledPolicy>>,
    retired: VecDeque<u32>,
}

const RETIRED_KEPT: usize = 256;

impl PolicyRegistry {
    pub fn get(&self, policy_id: u32) -> Option<Arc<InstalledPolicy>> {
        self.0
            .read()
            .unwrap_or_else(|poison| poison.into_inner())
            .by_id
            .get(&policy_id)
            .cloned()
    }

    fn insert(&self, policy_id: u32, installed: Arc<InstalledPolicy>) {
        self.0
            .write()
            .unwrap_or_else(|poison| poison.into_inner())
            .by_id
            .insert(policy_id, installed);
    }

    fn retire(&self, policy_id: u32) {
        let mut registry = self.0.write().unwrap_or_else(|poison| poison.into_inner());
        registry.retired.push_back(policy_id);
        if registry.retired.len() > RETIRED_KEPT
            && let Some(oldest) = registry.retired.pop_front()
        {
            registry.by_id.remove(&oldest);
        }
    }
}

/// Kernel counters, summed over CPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    pub events: u64,
    pub events_dropped: u64,
    /// Operations on targets allowed because they could not be decided.
    pub undecided: u64,
}

struct Installed {
    policy_id: u32,
    policy: Arc<CompiledPolicy>,
    level: u32,
}

pub struct Enforcer {
    // Owns the programs and their links: dropping it detaches everything.
    _ebpf: Ebpf,
    config_map: Array<MapData, Config>,
    /// What `config_map` holds.
    config: Config,
    targets: BpfHashMap<MapData, u64, Target>,
    prefixes: LpmTrie<MapData, TriePath, PathVerdict>,
    suffixes: LpmTrie<MapData, TriePath, PathVerdict>,
    globs: BpfHashMap<MapData, GlobKey, GlobRule>,
    policies: BpfHashMap<MapData, u32, KernelPolicy>,
    mount_types: BpfHashMap<MapData, MountTypeKey, Verdict>,
    sockets: BpfHashMap<MapData, SocketKey, Verdict>,
    network: LpmTrie<MapData, NetworkKeyData, Verdict>,
    stats: PerCpuArray<MapData, u64>,
    sync_barrier: ArrayOfMaps<MapData>,
    sync_inner: MapData,
    events: Option<RingBuf<MapData>>,
    installed: HashMap<u64, Installed>,
    targets_per_level: [u32; 64],
    next_policy_id: u32,
    registry: PolicyRegistry,
}

fn take<T>(ebpf: &mut Ebpf, name: &'static str) -> Result<T, LoadError>
where
    T: TryFrom<aya::maps::Map>,
{
    ebpf.take_map(name)
        .and_then(|map| T::try_from(map).ok())
        .ok_or(LoadError::Map(name))
}

fn mount_type_key(policy_id: u32, fs_type: &[u8; 16]) -> MountTypeKey {
    MountTypeKey {
        policy_id,
        fs_type: *fs_type,
    }
}

fn socket_key(policy_id: u32, (family, protocol): (u32, u32)) -> SocketKey {
    SocketKey {
        policy_id,
        family,
        protocol,
    }
}

fn network_key(policy_id: u32, entry: &NetworkEntry) -> Key<NetworkKeyData> {
    let data = NetworkKeyData {
        policy_id,
        protocol: entry.protocol,
        reserved: 0,
        port: entry.port,
        addr: entry.block.addr,
    };
    // policy_id, protocol, reserved and port are always matched in full.
    Key::new(64 + entry.block.bits, data)
}

fn trie_key(policy_id: u32, bytes: &[u8]) -> Key<TriePath> {
    let mut path = TriePath {
        policy_id,
        path: [0; KEY_PATH_LEN as usize],
    };
    path.path[..bytes.len()].copy_from_slice(bytes);
    Key::new(32 + 8 * bytes.len() as u32, path)
}

impl Enforcer {
    /// Loads the programs and attaches them to their LSM hooks. Fails with a clear reason on a
    /// kernel where BPF LSM cannot run.
    pub fn load() -> Result<Self, LoadError> {
        Preflight::run().check()?;
        let btf = Btf::from_sys_fs().map_err(|err| LoadError::NoBtf(err.to_string()))?;
        let mut ebpf = EbpfLoader::new().btf(Some(&btf)).load(OBJECT)?;
        for (name, hook) in PROGRAMS {
            let program: &mut Lsm = ebpf
                .program_mut(name)
                .and_then(|program| program.try_into().ok())
                .ok_or(LoadError::MissingProgram(name))?;
            program
                .load(hook, &btf)
                .map_err(|err| LoadError::program("load", name, err))?;
            program
                .attach()
                .map_err(|err| LoadError::program("attach", name, err))?;
        }
        let mut enforcer = Self {
            config_map: take(&mut ebpf, "config")?,
            targets: take(&mut ebpf, "targets")?,
            prefixes: take(&mut ebpf, "path_prefixes")?,
            suffixes: take(&mut ebpf, "path_suffixes")?,
            globs: take(&mut ebpf, "globs")?,
            policies: take(&mut ebpf, "policies")?,
            mount_types: take(&mut ebpf, "mount_types")?,
            sockets: take(&mut ebpf, "sockets")?,
            network: take(&mut ebpf, "network")?,
            stats: take(&mut ebpf, "stats")?,
            sync_barrier: take(&mut ebpf, "sync_barrier")?,
            sync_inner: match ebpf.take_map("sync_inner") {
                Some(aya::maps::Map::Array(map)) => map,
                _ => return Err(LoadError::Map("sync_inner")),
            },
            events: Some(take(&mut ebpf, "events")?),
            _ebpf: ebpf,
            installed: HashMap::new(),
            targets_per_level: [0; 64],
            next_policy_id: 1,
            registry: PolicyRegistry::default(),
            config: Config {
                target_levels: 0,
                protected_pid: std::process::id().into(),
            },
        };
        // From here on, targets may not signal or trace this process.
        enforcer
            .publish_config()
            .map_err(|source| LoadError::MapSetup {
                name: "config",
                source,
            })?;
        Ok(enforcer)
    }

    /// The audit event ring buffer, for one reader.
    pub fn take_events(&mut self) -> Option<RingBuf<MapData>> {
        self.events.take()
    }

    pub fn registry(&self) -> PolicyRegistry {
        self.registry.clone()
    }

    /// Installs `policy` on `target`, replacing the policy it had, atomically: the kernel sees
    /// the old policy or the new one, never a mix or nothing. An error means nothing changed.
    pub fn apply(&mut self, target: &Cgroup, policy: Arc<CompiledPolicy>) -> Result<(), MapError> {
        let policy_id = self.allocate_policy_id();
        if let Err(err) = self.write_entries(policy_id, &policy) {
            self.delete_entries(policy_id, &policy);
            return Err(err);
        }
        let installed = InstalledPolicy {
            policy: policy.clone(),
            target: target.clone(),
        };
        self.registry.insert(policy_id, Arc::new(installed));
        let switched = self
            .targets
            .insert(target.id, Target { policy_id }, 0)
            .and_then(|()| {
                if self.installed.contains_key(&target.id) {
                    return Ok(());
                }
                // A new target: its level must be probed, or the entry above is never found.
                self.targets_per_level[target.level as usize] += 1;
                self.publish_levels().inspect_err(|_| {
                    self.targets_per_level[target.level as usize] -= 1;
                    let _ = self.targets.remove(&target.id);
                })
            });
        if let Err(err) = switched {
            self.delete_entries(policy_id, &policy);
            self.registry.retire(policy_id);
            return Err(err);
        }
        let new = Installed {
            policy_id,
            policy,
            level: target.level,
        };
        if let Some(old) = self.installed.insert(target.id, new) {
            self.retire(old);
        }
        Ok(())
    }

    /// Stops enforcing on the cgroup `target_id`. Returns whether it had a policy; an error
    /// means it still has it.
    pub fn remove(&mut self, target_id: u64) -> Result<bool, MapError> {
        if !self.installed.contains_key(&target_id) {
            return Ok(false);
        }
        self.targets.remove(&target_id)?;
        let old = self.installed.remove(&target_id).expect("checked above");
        self.targets_per_level[old.level as usize] -= 1;
        if let Err(err) = self.publish_levels() {
            // Harmless: one more level probed for nothing.
            warn!("updating the probed cgroup levels: {err}");
        }
        self.retire(old);
        Ok(true)
    }

    pub fn stats(&self) -> Result<Stats, MapError> {
        let sum =
            |index: u32| -> Result<u64, MapError> { Ok(self.stats.get(&index, 0)?.iter().sum()) };
        Ok(Stats {
            events: sum(STAT_EVENTS)?,
            events_dropped: sum(STAT_EVENTS_DROPPED)?,
            undecided: sum(STAT_UNDECIDED)?,
        })
    }

    fn allocate_policy_id(&mut self) -> u32 {
        let id = self.next_policy_id;
        self.next_policy_id = self.next_policy_id.checked_add(1).unwrap_or(1);
        id
    }

    fn publish_levels(&mut self) -> Result<(), MapError> {
        self.config.target_levels = self
            .targets_per_level
            .iter()
            .enumerate()
            .filter(|(_, count)| **count > 0)
            .fold(0u64, |mask, (level, _)| mask | 1 << level);
        self.publish_config()
    }

    fn publish_config(&mut self) -> Result<(), MapError> {
        self.config_map.set(0, self.config, 0)
    }

    /// Deletes a policy's entries once no program can still be using them. The policy is no
    /// longer reachable: a failure here only leaves unused entries behind, so it is logged.
    fn retire(&mut self, old: Installed) {
        match self.wait_for_running_programs() {
            Ok(()) => self.delete_entries(old.policy_id, &old.policy),
            Err(err) => warn!(
                policy_id = old.policy_id,
                "entries of a replaced policy left in the maps: {err}"
            ),
        }
        self.registry.retire(old.policy_id);
    }

    /// Returns once every BPF program that was running has finished (see `sync_barrier`).
    fn wait_for_running_programs(&mut self) -> Result<(), MapError> {
        self.sync_barrier.set(0, &self.sync_inner, 0)
    }

    fn write_entries(&mut self, policy_id: u32, policy: &CompiledPolicy) -> Result<(), MapError> {
        for (fs_type, verdict) in &policy.mount_types {
            self.mount_types
                .insert(mount_type_key(policy_id, fs_type), verdict, 0)?;
        }
        for (key, verdict) in &policy.sockets {
            self.sockets
                .insert(socket_key(policy_id, *key), verdict, 0)?;
        }
        for entry in &policy.network {
            self.network
                .insert(&network_key(policy_id, entry), entry.verdict, 0)?;
        }
        for (index, glob) in policy.globs.iter().enumerate() {
            self.globs.insert(
                GlobKey {
                    policy_id,
                    index: index as u32,
                },
                glob,
                0,
            )?;
        }
        for TrieEntry { key, verdict } in &policy.suffixes {
            self.suffixes
                .insert(&trie_key(policy_id, key), verdict, 0)?;
        }
        for TrieEntry { key, verdict } in &policy.prefixes {
            self.prefixes
                .insert(&trie_key(policy_id, key), verdict, 0)?;
        }
        // Last: programs find a policy's other entries through this one.
        self.policies.insert(policy_id, policy.switches, 0)
    }

    /// Best effort: entries that were never written are simply absent.
    fn delete_entries(&mut self, policy_id: u32, policy: &CompiledPolicy) {
        let _ = self.policies.remove(&policy_id);
        for (fs_type, _) in &policy.mount_types {
            let _ = self.mount_types.remove(&mount_type_key(policy_id, fs_type));
        }
        for (key, _) in &policy.sockets {
            let _ = self.sockets.remove(&socket_key(policy_id, *key));
        }
        for entry in &policy.network {
            let _ = self.network.remove(&network_key(policy_id, entry));
        }
        for index in 0..policy.globs.len() {
            let _ = self.globs.remove(&GlobKey {
                policy_id,
                index: index as u32,
            });
        }
        for entry in &policy.suffixes {
            let _ = self.suffixes.remove(&trie_key(policy_id, &entry.key));
        }
        for entry in &policy.prefixes {
            let _ = self.prefixes.remove(&trie_key(policy_id, &entry.key));
        }
    }
}

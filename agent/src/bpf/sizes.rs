//! How many entries the maps that grow with policies hold: set when the object is loaded, from
//! the agent's configuration (`--max-targets`, `--max-path-entries`, `--max-model-records`), so
//! that a node pays for what it enforces. Kernels before 6.4 account a map by the entries it may hold, used or not.

use aya::{maps::MapError, sys::SyscallError};

/// The agent's capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MapSizes {
    /// Cgroups that policies target, or are staged for, at once (at least 1).
    pub targets: u32,
    /// Path entries at once: each targeted cgroup's prefix and exact rules, one entry per
    /// path (its policy's own, so a policy on ten cgroups counts ten times); at least 1.
    pub path_entries: u32,
    /// Distinct things modeled targets do between two reads of the agent (every 2 s), over all
    /// models; at least 1.
    pub model_records: u32,
}

impl Default for MapSizes {
    /// Room for 1,024 targets, 16,384 path entries and 8,192 behaviour records.
    fn default() -> Self {
        Self {
            targets: 1024,
            path_entries: 16384,
            model_records: 8192,
        }
    }
}

impl MapSizes {
    /// The entries of each map sized here; the object's other maps keep their sizes.
    pub fn entries(&self) -> [(&'static str, u32); 14] {
        let (targets, paths) = (self.targets, self.path_entries);
        // Suffix, glob, mount, socket and network rules, and audited rules: fewer than path
        // entries in every policy of the catalog, a quarter of them here.
        let other_rules = (paths / 4).max(1);
        [
            ("targets", targets),
            ("pending", targets),
            // A replaced policy's entries stay until no program can be reading them.
            ("policies", targets.saturating_mul(2)),
            ("path_prefixes", paths),
            // The inodes exact and directory rules name, in each target's view.
            ("inode_rules", paths),
            ("path_suffixes", other_rules),
            ("globs", other_rules),
            ("mount_types", other_rules),
            ("sockets", other_rules),
            ("network", other_rules),
            // A rule's decisions, by hook and action.
            ("rule_counts", paths),
            ("audit_buckets", other_rules),
            // Operations DefenseInDepth trials reported: the least recent forgotten first.
            ("reported", other_rules),
            ("model_records", self.model_records),
        ]
    }

    /// The entries `map` is to hold, if it is sized here.
    pub fn of(&self, map: &str) -> Option<u32> {
        self.entries()
            .into_iter()
            .find_map(|(name, entries)| (name == map).then_some(entries))
    }

    /// `err`, from writing into `map`, as `Full` when the map had no room left (a hash map
    /// answers E2BIG, a trie ENOSPC).
    pub fn full_or(&self, map: &'static str, err: MapError) -> EnforceError {
        let no_room = matches!(
            &err,
            MapError::SyscallError(SyscallError { io_error, .. })
                if matches!(io_error.raw_os_error(), Some(libc::E2BIG | libc::ENOSPC))
        );
        match self.of(map) {
            Some(entries) if no_room => EnforceError::Full {
                map,
                entries,
                option: match map {
                    "targets" | "pending" | "policies" => "--max-targets",
                    "model_records" => "--max-model-records",
                    _ => "--max-path-entries",
                },
            },
            _ => EnforceError::Map(err),
        }
    }
}

/// Why a policy could not be put on (nothing changed).
#[derive(Debug, thiserror::Error)]
pub enum EnforceError {
    #[error("the kernel's {map} map is full ({entries} entries): the agent's {option} sizes it")]
    Full {
        map: &'static str,
        entries: u32,
        option: &'static str,
    },
    #[error("{0}")]
    Map(#[from] MapError),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bpf::MAPS;

    #[test]
    fn every_sized_map_is_a_map_of_the_object() {
        for (name, entries) in MapSizes::default().entries() {
            assert!(MAPS.contains(&name), "{name}");
            assert!(entries > 0, "{name}");
        }
        let tiny = MapSizes {
            targets: 1,
            path_entries: 1,
            model_records: 1,
        };
        assert!(tiny.entries().iter().all(|(_, entries)| *entries >= 1));
        assert_eq!(tiny.of("policies"), Some(2));
        assert_eq!(tiny.of("events"), None);
    }

    #[test]
    fn a_full_map_is_named_with_the_option_that_sizes_it() {
        let sizes = MapSizes::default();
        let failed = |errno| {
            MapError::SyscallError(SyscallError {
                call: "bpf_map_update_elem",
                io_error: std::io::Error::from_raw_os_error(errno),
            })
        };
        let full = sizes.full_or("path_prefixes", failed(libc::ENOSPC));
        assert_eq!(
            full.to_string(),
            "the kernel's path_prefixes map is full (16384 entries): the agent's \
             --max-path-entries sizes it"
        );
        let full = sizes.full_or("pending", failed(libc::E2BIG));
        assert!(full.to_string().contains("--max-targets"), "{full}");
        let other = sizes.full_or("targets", failed(libc::EPERM));
        assert!(matches!(other, EnforceError::Map(_)), "{other}");
    }
}

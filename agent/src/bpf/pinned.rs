//! Where the agent keeps its maps and program links in bpffs, so that enforcement outlives the
//! agent process: `ROOT/VERSION/maps/NAME` and `ROOT/VERSION/links/NAME`. VERSION names the BPF
//! object, so a restarted agent of the same build adopts the state as it is, and a new build
//! starts its own next to the old one and removes the old one once it enforces.

use std::{
    io,
    path::{Path, PathBuf},
};

use aya::maps::MapData;

use super::{MapSizes, OBJECT};

/// The default root, under the conventional bpffs mount.
pub const DEFAULT_ROOT: &str = "/sys/fs/bpf/palisade";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PinnedState {
    pub root: PathBuf,
    /// The program version this state belongs to.
    pub version: String,
}

/// The version of the embedded BPF object: a digest of its bytes (FNV-1a, 64 bits).
pub fn object_version() -> String {
    let digest = OBJECT.iter().fold(0xcbf2_9ce4_8422_2325u64, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3)
    });
    format!("v{digest:016x}")
}

impl PinnedState {
    /// The state of this build's programs under `root`.
    pub fn new(root: &Path) -> Self {
        Self {
            root: root.to_owned(),
            version: object_version(),
        }
    }

    pub fn dir(&self) -> PathBuf {
        self.root.join(&self.version)
    }

    /// Where the map `name` is pinned; a global data section's map (`.data.gate`) under its name
    /// without dots (`data_gate`), as bpffs refuses names with a dot.
    pub fn map(&self, name: &str) -> PathBuf {
        let file = name.trim_start_matches('.').replace('.', "_");
        self.dir().join("maps").join(file)
    }

    pub fn link(&self, program: &str) -> PathBuf {
        self.dir().join("links").join(program)
    }

    /// Whether every program of this version is attached through a pinned link.
    pub fn links_complete<'a>(&self, programs: impl IntoIterator<Item = &'a str>) -> bool {
        programs
            .into_iter()
            .all(|program| self.link(program).exists())
    }

    /// What in the maps pinned for this version is not what the object defines (type, key and
    /// value sizes, flags) or `sizes` sizes (entries), if anything. The version, a digest of the
    /// object, fixes the layout: a mismatch is a change of sizes, a pin replaced or removed, or
    /// corrupted state. (Maps are pinned before links: attached programs whose map is not pinned
    /// read one this agent could not write.)
    pub fn mismatch(&self, maps: &[&str], sizes: &MapSizes) -> Option<String> {
        let object = aya_obj::Object::parse(OBJECT).expect("the embedded object parses");
        let attached = std::fs::read_dir(self.dir().join("links"))
            .is_ok_and(|mut links| links.next().is_some());
        maps.iter().find_map(|name| {
            let path = self.map(name);
            if !path.exists() {
                return attached.then(|| format!("{name} is not pinned, its programs are"));
            }
            let Some(defined) = object.maps.get(*name) else {
                return Some(format!("{name} is not a map of this build"));
            };
            let info = match MapData::from_pin(&path).and_then(|map| map.info()) {
                Ok(info) => info,
                Err(err) => return Some(format!("{name}: {err}")),
            };
            let pinned = (
                info.map_type().map_or(u32::MAX, |kind| kind as u32),
                info.key_size(),
                info.value_size(),
                info.max_entries(),
                info.map_flags(),
            );
            let wanted = (
                defined.map_type(),
                defined.key_size(),
                defined.value_size(),
                sizes.of(name).unwrap_or(defined.max_entries()),
                defined.map_flags(),
            );
            (pinned != wanted).then(|| {
                format!(
                    "{name} is (type, key size, value size, entries, flags) {pinned:?}, not \
                     {wanted:?}"
                )
            })
        })
    }

    /// Moves this version's state out of the way, next to other versions' (its links stay
    /// attached until it is removed like theirs); returns where it went.
    pub fn set_aside(&self) -> io::Result<PathBuf> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        // bpffs refuses names with a dot.
        let aside = self.root.join(format!("{}-invalid-{nanos}", self.version));
        std::fs::rename(self.dir(), &aside)?;
        Ok(aside)
    }

    /// The state of other versions under the same root.
    pub fn others(&self) -> io::Result<Vec<PathBuf>> {
        let entries = match std::fs::read_dir(&self.root) {
            Ok(entries) => entries,
            Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(err) => return Err(err),
        };
        let mut others = Vec::new();
        for entry in entries {
            let path = entry?.path();
            if path.file_name() != Some(self.version.as_ref()) {
                others.push(path);
            }
        }
        Ok(others)
    }
}

/// Unpins everything under `dir`: links whose last reference this was detach their programs,
/// maps whose last reference this was are freed.
pub fn remove(dir: &Path) -> io::Result<()> {
    match std::fs::remove_dir_all(dir) {
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_and_other_versions() {
        let root = std::env::temp_dir().join(format!("palisade-pinned-{}", std::process::id()));
        let _ = remove(&root);
        let state = PinnedState::new(&root);
        assert!(state.version.starts_with('v') && state.version.len() == 17);
        assert_eq!(state.version, object_version(), "stable for one build");
        assert_eq!(
            state.map("targets"),
            root.join(&state.version).join("maps/targets")
        );
        assert_eq!(
            state.map(".data.gate"),
            root.join(&state.version).join("maps/data_gate")
        );
        assert_eq!(state.others().unwrap(), Vec::<PathBuf>::new());
        std::fs::create_dir_all(state.dir().join("links")).unwrap();
        std::fs::create_dir_all(root.join("v-older")).unwrap();
        assert_eq!(state.others().unwrap(), [root.join("v-older")]);
        assert!(!state.links_complete(["file_open"]));
        // Maps not pinned yet are no mismatch, unless programs are attached; a pin that is not
        // the map defined is.
        let sizes = MapSizes::default();
        assert_eq!(state.mismatch(crate::bpf::MAPS, &sizes), None);
        std::fs::write(state.link("file_open"), "").unwrap();
        assert!(state.links_complete(["file_open"]));
        assert_eq!(
            state.mismatch(crate::bpf::MAPS, &sizes).as_deref(),
            Some("config is not pinned, its programs are")
        );
        std::fs::remove_file(state.link("file_open")).unwrap();
        std::fs::create_dir_all(state.dir().join("maps")).unwrap();
        std::fs::write(state.map("targets"), "").unwrap();
        let mismatch = state
            .mismatch(crate::bpf::MAPS, &sizes)
            .expect("a file is no map");
        assert!(mismatch.starts_with("targets: "), "{mismatch}");
        let aside = state.set_aside().unwrap();
        assert!(!state.dir().exists());
        assert_eq!(state.others().unwrap().len(), 2);
        assert!(state.others().unwrap().contains(&aside));
        remove(&root).unwrap();
        assert!(!root.exists());
    }
}

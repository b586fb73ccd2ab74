//! cgroup v2: finding the mount, resolving a directory to its id and level, creating and removing
//! the cgroups `palisade run` uses.

use palisade_common::MAX_LEVEL;
use std::{
    ffi::CString,
    fs, io,
    os::unix::{ffi::OsStrExt, fs::MetadataExt},
    path::{Component, Path, PathBuf},
    time::Duration,
};

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("no cgroup2 filesystem is mounted (see /proc/self/mountinfo)")]
    NoCgroup2,
    #[error("cgroup {0} does not exist")]
    Missing(PathBuf),
    #[error("{0} is not inside the cgroup2 mount {1}")]
    Outside(PathBuf, PathBuf),
    #[error(
        "cgroup {0} does not exist, and only a cgroup whose name has 1 to 127 bytes can be armed before it exists"
    )]
    Unarmable(PathBuf),
    #[error("cgroup {0} is deeper than level {1}, the deepest a target may be")]
    TooDeep(PathBuf, u32),
    #[error("{action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

fn io_error<'a>(
    action: &'static str,
    path: &'a Path,
) -> impl FnOnce(io::Error) -> CgroupError + use<'a> {
    move |source| CgroupError::Io {
        action,
        path: path.to_owned(),
        source,
    }
}

/// A mount of a file system: where it is mounted, and which of its directories is mounted there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    pub point: PathBuf,
    pub root: PathBuf,
}

/// The first mount of a file system of type `fstype`, from /proc/self/mountinfo.
pub fn find_mount(fstype: &str) -> Option<Mount> {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").ok()?;
    mountinfo.lines().find_map(|line| {
        // "id parent major:minor root mount_point options ... - fstype source ..."
        let (before, after) = line.split_once(" - ")?;
        if after.split(' ').next()? != fstype {
            return None;
        }
        let mut fields = before.split(' ').skip(3);
        let root = PathBuf::from(fields.next()?);
        Some(Mount {
            root,
            point: PathBuf::from(fields.next()?),
        })
    })
}

/// The cgroup v2 hierarchy as mounted here. Levels count from the hierarchy's real root, as the
/// kernel does, so the agent must see it from the host's cgroup namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hierarchy {
    pub mount: PathBuf,
    /// Level of the mounted directory: 0 unless a subtree is mounted.
    pub mount_level: u32,
}

impl Hierarchy {
    pub fn find() -> Result<Self, CgroupError> {
        let mount = find_mount("cgroup2").ok_or(CgroupError::NoCgroup2)?;
        Ok(Self::at(mount.point, &mount.root))
    }

    /// The hierarchy mounted at `mount`, whose root directory is `root` in the hierarchy.
    pub fn at(mount: PathBuf, root: &Path) -> Self {
        let mount_level = root
            .components()
            .filter(|part| matches!(part, Component::Normal(_)))
            .count();
        Self {
            mount,
            mount_level: mount_level as u32,
        }
    }

    /// Resolves `path`, absolute or relative to the mount.
    pub fn open(&self, path: &str) -> Result<Cgroup, CgroupError> {
        let root = &self.mount;
        let relative = Path::new(path).strip_prefix("/").unwrap_or(Path::new(path));
        let path = if Path::new(path).starts_with(root) {
            PathBuf::from(path)
        } else {
            root.join(relative)
        };
        let below = path
            .strip_prefix(root)
            .map_err(|_| CgroupError::Outside(path.clone(), root.clone()))?;
        if below
            .components()
            .any(|part| !matches!(part, Component::Normal(_)))
        {
            return Err(CgroupError::Outside(path.clone(), root.clone()));
        }
        let level = self.mount_level + below.components().count() as u32;
        if level > MAX_LEVEL {
            return Err(CgroupError::TooDeep(path, MAX_LEVEL));
        }
        let metadata = match fs::metadata(&path) {
            Ok(metadata) if metadata.is_dir() => metadata,
            Ok(_) => return Err(CgroupError::Missing(path)),
            Err(err) if err.kind() == io::ErrorKind::NotFound => {
                return Err(CgroupError::Missing(path));
            }
            Err(err) => return Err(io_error("reading", &path)(err)),
        };
        Ok(Cgroup {
            id: metadata.ino(),
            level,
            path,
        })
    }

    /// Creates a new cgroup `name` in the existing directory `parent`.
    pub fn create(&self, parent: &Path, name: &str) -> Result<Cgroup, CgroupError> {
        let path = parent.join(name);
        fs::create_dir(&path).map_err(io_error("creating", &path))?;
        self.open(&path.to_string_lossy())
    }
}

/// A cgroup v2 directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cgroup {
    pub path: PathBuf,
    /// What bpf_get_current_cgroup_id() returns for its tasks: the directory's inode number.
    pub id: u64,
    /// Depth below the hierarchy's root (the root is level 0).
    pub level: u32,
}

impl Cgroup {
    /// The path of `cgroup.procs`, for moving a process in (see `join_in_child`).
    pub fn procs_file(&self) -> CString {
        CString::new(self.path.join("cgroup.procs").as_os_str().as_bytes())
            .expect("cgroup paths come from the file system and hold no NUL")
    }

    /// Removes the cgroup once its processes are gone (they may take a moment to be reaped).
    pub fn remove(&self) -> Result<(), CgroupError> {
        let mut tries = 0;
        loop {
            match fs::remove_dir(&self.path) {
                Ok(()) => return Ok(()),
                Err(err) if err.raw_os_error() == Some(libc::EBUSY) && tries < 100 => {
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(err) => return Err(io_error("removing", &self.path)(err)),
            }
        }
    }
}

/// Moves the calling process into the cgroup whose `cgroup.procs` is `procs`. Meant for a
/// `Command::pre_exec` hook: only async-signal-safe calls, so that the command's very first
/// instruction (and its exec) already runs under the cgroup's policy.
pub fn join_in_child(procs: &CString) -> io::Result<()> {
    // SAFETY: plain syscalls on a valid NUL-terminated path and a stack buffer.
    unsafe {
        let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let written = libc::write(fd, b"0".as_ptr().cast(), 1);
        let error = io::Error::last_os_error();
        libc::close(fd);
        if written != 1 {
            return Err(error);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_resolves_relative_and_absolute_paths_with_levels() {
        let root =
            std::env::temp_dir().join(format!("palisade-cgroup-test-{}", std::process::id()));
        fs::create_dir_all(root.join("a/b")).unwrap();
        let hierarchy = Hierarchy::at(root.clone(), Path::new("/"));
        let relative = hierarchy.open("a/b").unwrap();
        let absolute = hierarchy.open(root.join("a/b").to_str().unwrap()).unwrap();
        assert_eq!(relative, absolute);
        assert_eq!(relative.level, 2);
        assert_eq!(hierarchy.open("/a").unwrap().level, 1);
        assert_eq!(hierarchy.open("/").unwrap().level, 0);
        assert!(matches!(
            hierarchy.open("a/missing"),
            Err(CgroupError::Missing(_))
        ));
        assert!(matches!(
            hierarchy.open("a/../.."),
            Err(CgroupError::Outside(..))
        ));
        // A mounted subtree: levels count from the hierarchy's root.
        let subtree = Hierarchy::at(root.clone(), Path::new("/kubepods.slice/pod1"));
        assert_eq!(subtree.open("a/b").unwrap().level, 4);
        let deep = Hierarchy::at(
            root.clone(),
            &PathBuf::from("/x".repeat(MAX_LEVEL as usize - 1)),
        );
        assert_eq!(deep.open("a").unwrap().level, MAX_LEVEL);
        assert!(matches!(
            deep.open("a/b"),
            Err(CgroupError::TooDeep(_, MAX_LEVEL))
        ));
        fs::remove_dir_all(&root).unwrap();
    }
}

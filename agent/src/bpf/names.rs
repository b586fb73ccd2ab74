//! The inodes a policy's exact and directory rules name, as its target's processes see them: the
//! entries of `inode_rules`, through which a rule holds for every name of what it names (a hard
//! link, a bind mount). Each name is looked up in the root of each mount namespace of the
//! target's processes (the agent's own root when it has none yet, as a target about to start
//! sees it). Below a named directory, its subdirectories are named too, for the files in them,
//! and those of its files that have other names (hard links) for themselves.

use std::{
    collections::{HashMap, HashSet},
    ffi::{CString, OsStr},
    fs::{self, File},
    io,
    os::{
        fd::{AsRawFd, FromRawFd},
        unix::{ffi::OsStrExt, fs::MetadataExt},
    },
    path::{Path, PathBuf},
};

use palisade_common::{InodeRuleKey, InodeVerdict, NAMED_DIRECTORY, NAMED_FILE};

use super::layout::inode_key;
use crate::policy::{NamedPath, merge_content};

/// Mount namespaces of one target looked into, at most.
pub const MAX_VIEWS: usize = 8;
/// Processes of one target looked at, at most, to find its mount namespaces.
pub const MAX_PROCESSES: usize = 4096;
/// Directory levels walked below a named directory, at most.
const MAX_DEPTH: usize = 8;
/// Entries read, and inodes found, by the walks of one target, at most: a directory that holds
/// more keeps its rules on the names below it (the path rules) but not on all of their other
/// names. `inode_rules` is the node's, and a look blocks the agent's loop: both bound what a
/// target's directories cost.
pub const MAX_READ: usize = 16384;
const MAX_FOUND: usize = 1024;

/// What one target's policy names: `inode_rules` entries under `policy_id`; whether a walk
/// stopped at its bounds; whether the target had processes (else the agent's view was used), and
/// whether some were not looked into (see `Views`).
#[derive(Debug, Default, PartialEq)]
pub struct Named {
    pub inodes: HashMap<InodeRuleKey, InodeVerdict>,
    pub truncated: bool,
    pub in_processes: bool,
    pub partial: bool,
}

/// The inodes `names` name for the processes in the cgroup at `cgroup` and below. Names that do
/// not exist are skipped: the path rules hold for them.
pub fn find(cgroup: &Path, policy_id: u32, names: &[NamedPath]) -> Named {
    let mut named = Named::default();
    if names.is_empty() {
        return named;
    }
    let mut budget = Budget::default();
    // What each named directory holds, by its device and inode: the views of one target (its
    // containers, the pause container) mostly share them.
    let mut walked: HashMap<(u64, u64), Vec<(fs::Metadata, u32)>> = HashMap::new();
    let views = views(cgroup);
    named.partial = views.partial;
    for root in views.roots {
        let mut absent = Absent::default();
        for name in names {
            if absent.holds(&name.path) {
                continue;
            }
            let found = match open_in(&root, &name.path) {
                Ok(found) => found,
                Err(err) => {
                    if err.kind() == io::ErrorKind::NotFound {
                        absent.look_up(&root, &name.path);
                    }
                    named.partial |= refused(&err);
                    continue;
                }
            };
            let Ok(metadata) = found.metadata() else {
                continue;
            };
            let directory = name.named == NAMED_DIRECTORY;
            if directory && !metadata.is_dir() {
                continue;
            }
            let mut add = |metadata: &fs::Metadata, kind| {
                let key = rule_key(policy_id, metadata, kind);
                merge_content(named.inodes.entry(key).or_default(), &name.verdict);
            };
            add(&metadata, name.named);
            if directory && !kernel_tree(&found) {
                let below = walked
                    .entry((metadata.dev(), metadata.ino()))
                    .or_insert_with(|| {
                        let mut walk = Walk {
                            dev: metadata.dev(),
                            budget: &mut budget,
                            found: Vec::new(),
                            refused: false,
                        };
                        walk.below(&found, 1);
                        named.partial |= walk.refused;
                        walk.found
                    });
                for (metadata, kind) in below.iter() {
                    add(metadata, *kind);
                }
            }
        }
    }
    named.truncated = budget.truncated;
    named.in_processes = !views.namespaces.is_empty();
    named
}

/// The directories found missing in one view, so that the names below one cost no lookup each
/// (10,000 rules under a directory a container does not have), and those found present. A name
/// is the path the kernel resolves (policies refuse `.`, `..` and empty components): one below a
/// missing directory is missing too.
#[derive(Default)]
struct Absent {
    missing: HashSet<PathBuf>,
    present: HashSet<PathBuf>,
}

impl Absent {
    /// Whether `path` is below a directory found missing, or is one.
    fn holds(&self, path: &str) -> bool {
        Path::new(path)
            .ancestors()
            .any(|dir| self.missing.contains(dir))
    }

    /// Notes the highest missing directory above `path`, which is missing in the view of `root`.
    fn look_up(&mut self, root: &File, path: &str) {
        let mut highest = None;
        for dir in Path::new(path).ancestors().skip(1) {
            if dir == Path::new("/") || self.present.contains(dir) {
                break;
            }
            match open_in(root, &dir.to_string_lossy()) {
                Err(err) if err.kind() == io::ErrorKind::NotFound => highest = Some(dir),
                _ => {
                    self.present.insert(dir.to_path_buf());
                    break;
                }
            }
        }
        self.missing.extend(highest.map(Path::to_path_buf));
    }
}

/// Whether `dir` is on one of the kernel's own file systems (proc, sys, cgroup...): no file there
/// has a second name, and their trees are large and change by themselves. Not walked.
fn kernel_tree(dir: &File) -> bool {
    const KERNEL_TREES: [i64; 7] = [
        0x9fa0,     // proc
        0x62656572, // sysfs
        0x63677270, // cgroup2
        0x27e0eb,   // cgroup
        0x64626720, // debugfs
        0x74726163, // tracefs
        0x73636673, // securityfs
    ];
    // SAFETY: statfs is plain integers; all zero is a valid value.
    let mut stat: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor and a statfs to fill.
    let done = unsafe { libc::fstatfs(dir.as_raw_fd(), &mut stat) } == 0;
    done && KERNEL_TREES.contains(&(stat.f_type as i64))
}

fn rule_key(policy_id: u32, metadata: &fs::Metadata, named: u32) -> InodeRuleKey {
    let inode = inode_key(metadata);
    InodeRuleKey {
        policy_id,
        dev: inode.dev,
        ino: inode.ino,
        named,
        reserved: 0,
    }
}

/// What the walks of one target have used of MAX_READ and MAX_FOUND.
#[derive(Default)]
struct Budget {
    read: usize,
    found: usize,
    truncated: bool,
}

/// A walk below a named directory, on its file system only.
struct Walk<'a> {
    dev: u64,
    budget: &'a mut Budget,
    found: Vec<(fs::Metadata, u32)>,
    /// Whether a directory could not be read or opened for want of a permission.
    refused: bool,
}

impl Walk<'_> {
    /// Subdirectories (named as directories) and files of more than one name (named as files)
    /// below `dir`, at `depth`. Each is reached from its parent's descriptor and never through a
    /// symbolic link: a name swapped meanwhile for a link is not followed elsewhere.
    fn below(&mut self, dir: &File, depth: usize) {
        let children = match fs::read_dir(format!("/proc/self/fd/{}", dir.as_raw_fd())) {
            Ok(children) => children,
            Err(err) => {
                self.refused |= refused(&err);
                return;
            }
        };
        for child in children.filter_map(Result::ok) {
            if self.budget.read == MAX_READ || self.budget.found == MAX_FOUND {
                self.budget.truncated = true;
                return;
            }
            self.budget.read += 1;
            // Not followed: a symbolic link names another file, looked at where it is.
            let Ok(metadata) = child.metadata() else {
                continue;
            };
            let kind = if metadata.is_dir() {
                NAMED_DIRECTORY
            } else if metadata.is_file() && metadata.nlink() > 1 {
                NAMED_FILE
            } else {
                continue;
            };
            if metadata.dev() != self.dev {
                continue;
            }
            self.budget.found += 1;
            if kind == NAMED_DIRECTORY && depth < MAX_DEPTH {
                match open_child(dir, &child.file_name(), &metadata) {
                    Ok(subdir) => self.below(&subdir, depth + 1),
                    Err(err) => self.refused |= refused(&err),
                }
            }
            self.found.push((metadata, kind));
        }
    }
}

/// Opens (O_PATH) the subdirectory `name` of `dir`, not through a symbolic link, if it is still
/// the directory of `metadata`.
fn open_child(dir: &File, name: &OsStr, metadata: &fs::Metadata) -> io::Result<File> {
    let name = CString::new(name.as_bytes())?;
    let flags = libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: a valid directory descriptor and a NUL-terminated name.
    let subdir =
        opened_file(unsafe { libc::openat(dir.as_raw_fd(), name.as_ptr(), flags) }.into())?;
    let opened = subdir.metadata()?;
    if (opened.dev(), opened.ino()) != (metadata.dev(), metadata.ino()) {
        return Err(io::Error::other("replaced since it was listed"));
    }
    Ok(subdir)
}

/// Where a target's names are looked up.
struct Views {
    /// The roots of the mount namespaces of its processes, the agent's own if there are none;
    /// opened (O_PATH). Another user's process needs CAP_SYS_PTRACE.
    roots: Vec<File>,
    /// The mount namespaces of its processes (their /proc/PID/ns/mnt links), those not looked
    /// into too.
    namespaces: HashSet<PathBuf>,
    /// Whether some were not looked into: refused, or beyond MAX_VIEWS or MAX_PROCESSES.
    partial: bool,
}

/// The views of the processes in the cgroup at `cgroup` and below.
fn views(cgroup: &Path) -> Views {
    // One more than MAX_PROCESSES says there are too many.
    let pids = processes(cgroup, MAX_PROCESSES + 1);
    let mut views = Views {
        roots: Vec::new(),
        namespaces: HashSet::new(),
        partial: pids.len() > MAX_PROCESSES,
    };
    for &pid in pids.iter().take(MAX_PROCESSES) {
        let namespace = match fs::read_link(format!("/proc/{pid}/ns/mnt")) {
            Ok(namespace) => namespace,
            Err(err) => {
                views.partial |= refused(&err);
                continue;
            }
        };
        if views.namespaces.contains(&namespace) {
            continue;
        }
        if views.roots.len() == MAX_VIEWS {
            views.partial = true;
            views.namespaces.insert(namespace);
            continue;
        }
        match open_path(Path::new(&format!("/proc/{pid}/root"))) {
            Ok(root) => views.roots.push(root),
            Err(err) if refused(&err) => views.partial = true,
            // It has exited: another process of the namespace may be looked into.
            Err(_) => continue,
        }
        views.namespaces.insert(namespace);
    }
    // Processes not started yet will see the agent's (files and `palisade run`); those that
    // could not be looked into are not looked for elsewhere.
    if pids.is_empty() {
        views.roots.extend(open_path(Path::new("/")));
    }
    views
}

/// Whether looking into a process or a directory failed for want of a permission (not for the
/// process's exit or the directory's removal).
fn refused(err: &io::Error) -> bool {
    err.kind() == io::ErrorKind::PermissionDenied
}

/// Whether the cgroup at `cgroup` or one below it has a process.
pub fn has_processes(cgroup: &Path) -> bool {
    !processes(cgroup, 1).is_empty()
}

/// The processes in the cgroup at `cgroup` and below, `most` at most.
fn processes(cgroup: &Path, most: usize) -> Vec<u32> {
    let mut pids = Vec::new();
    let mut dirs = vec![cgroup.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        if let Ok(procs) = fs::read_to_string(dir.join("cgroup.procs")) {
            pids.extend(procs.lines().filter_map(|line| line.parse::<u32>().ok()));
        }
        if pids.len() >= most {
            pids.truncate(most);
            break;
        }
        if let Ok(children) = fs::read_dir(&dir) {
            dirs.extend(
                children
                    .filter_map(Result::ok)
                    .filter(|child| child.file_type().is_ok_and(|kind| kind.is_dir()))
                    .map(|child| child.path()),
            );
        }
    }
    pids
}

fn open_path(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH)
        .open(path)
}

/// Opens (O_PATH) the file at the absolute `path` as a process whose root is `root` resolves it:
/// symbolic links followed inside that root, `..` never above it, no magic links of /proc.
fn open_in(root: &File, path: &str) -> io::Result<File> {
    let relative = CString::new(path.trim_start_matches('/'))?;
    // SAFETY: open_how is plain integers; all zero is its default.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_PATH | libc::O_CLOEXEC) as u64;
    how.resolve = libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS;
    // SAFETY: a valid directory descriptor, a NUL-terminated path and an open_how of its size.
    opened_file(unsafe {
        libc::syscall(
            libc::SYS_openat2,
            root.as_raw_fd(),
            relative.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    })
}

/// The file of the descriptor an open system call returned, or its error (`fd` negative).
fn opened_file(fd: i64) -> io::Result<File> {
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a new descriptor that nothing else owns.
    Ok(unsafe { File::from_raw_fd(fd as i32) })
}

#[cfg(test)]
mod tests {
    use palisade_common::{ACTION_AUDIT, ACTION_DENY};

    use super::*;

    /// A tree in a directory of its own: `named/` holds a subdirectory, a file of one name, a
    /// file of two (its other name beside `named/`) and a symbolic link to a directory outside.
    struct Tree(PathBuf);

    impl Tree {
        fn new(test: &str) -> Self {
            let base =
                std::env::temp_dir().join(format!("palisade-names-{test}-{}", std::process::id()));
            let _ = fs::remove_dir_all(&base);
            fs::create_dir_all(base.join("named/sub")).unwrap();
            fs::create_dir_all(base.join("outside/deeper")).unwrap();
            fs::write(base.join("named/plain"), "").unwrap();
            fs::write(base.join("named/sub/linked"), "").unwrap();
            fs::hard_link(base.join("named/sub/linked"), base.join("other-name")).unwrap();
            std::os::unix::fs::symlink(base.join("outside"), base.join("named/link")).unwrap();
            Self(base)
        }

        fn path(&self, relative: &str) -> String {
            self.0.join(relative).to_string_lossy().into_owned()
        }

        fn key(&self, relative: &str, named: u32) -> InodeRuleKey {
            rule_key(7, &fs::metadata(self.0.join(relative)).unwrap(), named)
        }
    }

    impl Drop for Tree {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    /// `action` on reading, by rule `rule_id`.
    fn on_read(action: u32, rule_id: u32) -> InodeVerdict {
        let mut verdict = InodeVerdict::default();
        verdict.action[0] = action;
        verdict.rule_id[0] = rule_id;
        verdict
    }

    fn name(path: String, named: u32, verdict: InodeVerdict) -> NamedPath {
        NamedPath {
            path,
            named,
            verdict,
        }
    }

    /// No cgroup, no processes: the names are looked up in the agent's own root.
    fn find_in_own_root(names: &[NamedPath]) -> Named {
        find(Path::new("/nonexistent-cgroup"), 7, names)
    }

    #[test]
    fn a_named_directory_names_its_subdirectories_and_its_files_of_other_names() {
        let tree = Tree::new("walk");
        let deny = on_read(ACTION_DENY, 1);
        let found = find_in_own_root(&[name(tree.path("named"), NAMED_DIRECTORY, deny)]);
        let expected: HashMap<InodeRuleKey, InodeVerdict> = [
            (tree.key("named", NAMED_DIRECTORY), deny),
            (tree.key("named/sub", NAMED_DIRECTORY), deny),
            (tree.key("named/sub/linked", NAMED_FILE), deny),
        ]
        .into();
        // Not the file of one name, nor what the link leads to.
        assert_eq!(found.inodes, expected);
        assert!(!found.in_processes && !found.truncated && !found.partial);
    }

    #[test]
    fn two_names_of_one_directory_each_add_their_verdict_below_it() {
        let tree = Tree::new("twice");
        std::os::unix::fs::symlink(tree.path("named"), tree.path("alias")).unwrap();
        let names = [
            name(
                tree.path("named"),
                NAMED_DIRECTORY,
                on_read(ACTION_AUDIT, 1),
            ),
            name(tree.path("alias"), NAMED_DIRECTORY, on_read(ACTION_DENY, 2)),
        ];
        let found = find_in_own_root(&names);
        assert_eq!(
            found.inodes.get(&tree.key("named/sub/linked", NAMED_FILE)),
            Some(&on_read(ACTION_DENY, 2))
        );
    }

    #[test]
    fn a_file_name_names_the_file_and_missing_names_nothing() {
        let tree = Tree::new("files");
        let deny = on_read(ACTION_DENY, 1);
        let names = [
            name(tree.path("missing/below/file"), NAMED_FILE, deny),
            name(tree.path("missing/below/other"), NAMED_DIRECTORY, deny),
            name(tree.path("named/missing"), NAMED_FILE, deny),
            // After missing names, beside them.
            name(tree.path("other-name"), NAMED_FILE, deny),
            // A file named as a directory is not one.
            name(tree.path("named/plain"), NAMED_DIRECTORY, deny),
        ];
        let found = find_in_own_root(&names);
        let expected: HashMap<InodeRuleKey, InodeVerdict> =
            [(tree.key("named/sub/linked", NAMED_FILE), deny)].into();
        assert_eq!(found.inodes, expected);
    }

    #[test]
    fn a_target_is_looked_at_in_its_processes_namespaces() {
        let tree = Tree::new("views");
        // A cgroup of one process: this test's.
        let cgroup = tree.0.join("cgroup");
        fs::create_dir_all(cgroup.join("child")).unwrap();
        fs::write(
            cgroup.join("child/cgroup.procs"),
            format!("{}\n", std::process::id()),
        )
        .unwrap();
        let deny = on_read(ACTION_DENY, 1);
        let found = find(
            &cgroup,
            7,
            &[name(tree.path("other-name"), NAMED_FILE, deny)],
        );
        assert!(found.in_processes);
        assert_eq!(found.inodes.len(), 1);
        assert!(has_processes(&cgroup));
    }

    #[test]
    fn names_below_a_missing_directory_are_not_looked_up() {
        let tree = Tree::new("absent");
        let root = open_path(Path::new("/")).unwrap();
        let mut absent = Absent::default();
        absent.look_up(&root, &tree.path("missing/below/file"));
        assert!(absent.holds(&tree.path("missing/other")));
        assert!(absent.holds(&tree.path("missing")));
        assert!(!absent.holds(&tree.path("missing-not")));
        assert!(!absent.holds(&tree.path("named/file")));
        // A missing name in a present directory notes nothing.
        absent.look_up(&root, &tree.path("named/missing"));
        assert!(!absent.holds(&tree.path("named/other")));
    }
}

//! A path rule is decided by the name the opener's kernel resolves at the moment of the open:
//! after a rename of an ancestor directory or a move of its mount, through a second mount of the
//! same directory, in another mount namespace, under another root, and on the first open after a
//! policy update or after a cgroup inside a target gets a policy of its own. Each test opens the
//! same file under one answer first, twice (the open verdict cache, ebpf/programs/open_cache.h,
//! remembers a cgroup's second open of a file), then checks the other: the cache, had it missed
//! a change of name, mount, root or policy, would fail it.
//!
//! A rule that names a file or a directory also holds for the file's other names: a hard link,
//! a second mount (the agent finds the inodes the rules name, ebpf/programs/path_match.h).

use palisade_agent::targets::Cgroup;
use palisade_kernel_tests::{
    Answer, EPERM, Kernel, answer, deny_read, file, policy, probe, sh, spawn_probe,
};

#[test]
fn an_allowed_file_opened_again_is_answered_by_the_cache() {
    let mut kernel = Kernel::new();
    let target = denying_under(&mut kernel, "cached", "/tmp/cached/secret");
    let public = file("/tmp/cached/public/file");
    let before = kernel.enforcer().opens_cached().unwrap();
    assert_eq!(
        probe(Some(&target), &["read-times", "50", public]),
        Answer::Ok
    );
    let cached = kernel.enforcer().opens_cached().unwrap() - before;
    // The first open tags the file's slot, the second fills it; the files the probe's start
    // opens once are not remembered.
    assert_eq!(
        cached, 48,
        "opens answered by the cache, not the 48 reads after the second"
    );
}

/// A fresh target `name` whose policy denies reading anything under the directory `denied`.
fn denying_under(kernel: &mut Kernel, name: &str, denied: &str) -> Cgroup {
    let target = kernel.cgroup(None, name);
    kernel.apply(&target, policy(name, &deny_read(&format!("{denied}/"))));
    target
}

/// Runs the probe with `args` in `target`: the kernel's answer, and the paths of the denials
/// reported.
fn run(kernel: &mut Kernel, target: &Cgroup, args: &[&str]) -> (Answer, Vec<String>) {
    kernel.events();
    let answer = probe(Some(target), args);
    let reported = kernel
        .events()
        .into_iter()
        .map(|event| event.path)
        .collect();
    (answer, reported)
}

/// Reads `path` in `target` twice, stopping at a refusal (see `run`): allowed, the cache holds
/// it after.
fn read(kernel: &mut Kernel, target: &Cgroup, path: &str) -> (Answer, Vec<String>) {
    run(kernel, target, &["read-times", "2", path])
}

#[test]
fn a_file_whose_ancestor_is_renamed_into_a_denied_directory_is_denied_at_once() {
    let mut kernel = Kernel::new();
    sh("rm -rf /tmp/renamed && mkdir -p /tmp/renamed");
    let target = denying_under(&mut kernel, "renamed", "/tmp/renamed/secret");
    let before = file("/tmp/renamed/public/deep/file");
    let after = "/tmp/renamed/secret/deep/file";
    assert_eq!(read(&mut kernel, &target, before), (Answer::Ok, vec![]));
    sh("mv /tmp/renamed/public /tmp/renamed/secret");
    assert_eq!(
        read(&mut kernel, &target, after),
        (EPERM, vec![after.to_owned()]),
        "the file read a moment before, under its new name"
    );
    assert_eq!(probe(None, &["read", after]), Answer::Ok);
    sh("mv /tmp/renamed/secret /tmp/renamed/public");
    assert_eq!(
        read(&mut kernel, &target, before),
        (Answer::Ok, vec![]),
        "renamed back"
    );
}

/// Mounts `source` at `target` too, until the result is dropped (also when the test fails).
fn bind_mount(source: &str, target: &'static str) -> Unmount {
    sh(&format!(
        "mkdir -p {target} && mount -o bind {source} {target}"
    ));
    Unmount(target)
}

/// Unmounts a mount point when dropped.
struct Unmount(&'static str);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(self.0).status();
    }
}

#[test]
fn a_second_mount_of_a_denied_directory_leaves_its_own_name_denied() {
    let mut kernel = Kernel::new();
    let target = denying_under(&mut kernel, "second-mount", "/tmp/second-mount/secret");
    let denied = file("/tmp/second-mount/secret/file");
    let _alias = bind_mount("/tmp/second-mount/secret", "/tmp/second-mount/alias");
    // Whatever the other name answers (the rule's, when the directory was there as the policy
    // was applied: see the test below), it does not answer for this one.
    probe(
        Some(&target),
        &["read-times", "2", "/tmp/second-mount/alias/file"],
    );
    assert_eq!(
        read(&mut kernel, &target, denied),
        (EPERM, vec![denied.to_owned()])
    );
}

#[test]
fn a_file_whose_mount_is_moved_into_a_denied_directory_is_denied_at_once() {
    let mut kernel = Kernel::new();
    let target = denying_under(&mut kernel, "moved-mount", "/tmp/moved-mount/secret");
    file("/tmp/moved-mount/source/deep/file");
    let before = "/tmp/moved-mount/public/deep/file";
    let after = "/tmp/moved-mount/secret/public/deep/file";
    let _mount = bind_mount("/tmp/moved-mount/source", "/tmp/moved-mount/public");
    assert_eq!(read(&mut kernel, &target, before), (Answer::Ok, vec![]));
    sh("mkdir -p /tmp/moved-mount/secret/public && \
        mount --move /tmp/moved-mount/public /tmp/moved-mount/secret/public");
    assert_eq!(
        read(&mut kernel, &target, after),
        (EPERM, vec![after.to_owned()]),
        "the file read a moment before, on its mount moved"
    );
    assert_eq!(probe(None, &["read", after]), Answer::Ok);
    sh("mount --move /tmp/moved-mount/secret/public /tmp/moved-mount/public");
    assert_eq!(
        read(&mut kernel, &target, before),
        (Answer::Ok, vec![]),
        "moved back"
    );
}

#[test]
fn the_same_file_in_two_mount_namespaces_is_decided_by_each_ones_path() {
    let mut kernel = Kernel::new();
    let target = denying_under(&mut kernel, "two-views", "/tmp/two-views/secret");
    let public = file("/tmp/two-views/public/file");
    std::fs::create_dir_all("/tmp/two-views/secret").unwrap();
    // The same file as /tmp/two-views/secret/file in a namespace of the target's own.
    let in_own_namespace = [
        "read-in-mount-ns",
        "/tmp/two-views/public",
        "/tmp/two-views/secret",
        "/tmp/two-views/secret/file",
    ];
    assert_eq!(read(&mut kernel, &target, public), (Answer::Ok, vec![]));
    assert_eq!(
        run(&mut kernel, &target, &in_own_namespace),
        (EPERM, vec!["/tmp/two-views/secret/file".to_owned()])
    );
    assert_eq!(
        read(&mut kernel, &target, public),
        (Answer::Ok, vec![]),
        "the first namespace's name again"
    );
    assert_eq!(probe(None, &in_own_namespace), Answer::Ok);
}

#[test]
fn a_policy_update_that_denies_an_allowed_file_holds_from_the_next_open() {
    let mut kernel = Kernel::new();
    let target = kernel.cgroup(None, "updated");
    let read_file = file("/tmp/updated/file");
    let allowing = policy("updated", &deny_read("/tmp/updated/other"));
    kernel.apply(&target, allowing.clone());
    assert_eq!(read(&mut kernel, &target, read_file), (Answer::Ok, vec![]));
    kernel.apply(&target, policy("updated", &deny_read(read_file)));
    assert_eq!(
        read(&mut kernel, &target, read_file),
        (EPERM, vec![read_file.to_owned()]),
        "the first open after the update"
    );
    kernel.apply(&target, allowing);
    assert_eq!(read(&mut kernel, &target, read_file), (Answer::Ok, vec![]));
}

#[test]
fn a_cgroup_inside_a_target_given_its_own_policy_holds_it_from_the_next_open() {
    let mut kernel = Kernel::new();
    let outer = kernel.cgroup(None, "outer");
    let inner = kernel.cgroup(Some(&outer), "inner");
    let read_file = file("/tmp/outer/file");
    kernel.apply(&outer, policy("outer", &deny_read("/tmp/outer/other")));
    // Decided by the outer target's policy, and remembered.
    assert_eq!(read(&mut kernel, &inner, read_file), (Answer::Ok, vec![]));
    kernel.apply(&inner, policy("inner", &deny_read(read_file)));
    assert_eq!(
        read(&mut kernel, &inner, read_file),
        (EPERM, vec![read_file.to_owned()]),
        "the first open under the inner target's own policy"
    );
}

#[test]
fn a_file_read_again_after_a_chroot_is_decided_by_its_name_under_the_new_root() {
    let mut kernel = Kernel::new();
    // Outside the root /tmp/chrooted, the file is /tmp/chrooted/secret/file, which no rule
    // names; under it, /secret/file.
    let target = denying_under(&mut kernel, "chrooted", "/secret");
    let outside = file("/tmp/chrooted/secret/file");
    let chrooted = [
        "read-then-chrooted",
        outside,
        "/tmp/chrooted",
        "/secret/file",
    ];
    assert_eq!(
        run(&mut kernel, &target, &chrooted),
        (EPERM, vec!["/secret/file".to_owned()])
    );
    assert_eq!(probe(None, &chrooted), Answer::Ok);
}

/// A fresh target `name` whose policy denies writing the file `denied`.
fn denying_write_of(kernel: &mut Kernel, name: &str, denied: &str) -> Cgroup {
    let target = kernel.cgroup(None, name);
    let rules = format!(
        "    files:\n      - paths: [{denied}]\n        permissions: [write]\n        action: deny\n"
    );
    kernel.apply(&target, policy(name, &rules));
    target
}

#[test]
fn a_file_read_through_a_hard_link_made_before_the_policy_is_denied() {
    let mut kernel = Kernel::new();
    sh("rm -rf /tmp/linked && mkdir -p /tmp/linked/public");
    let token = file("/tmp/linked/secret/token");
    let link = "/tmp/linked/public/token";
    sh(&format!("ln {token} {link}"));
    let other = file("/tmp/linked/public/other");
    let target = denying_under(&mut kernel, "linked", "/tmp/linked/secret");
    assert_eq!(
        read(&mut kernel, &target, link),
        (EPERM, vec![link.to_owned()]),
        "the token's other name"
    );
    assert_eq!(read(&mut kernel, &target, other), (Answer::Ok, vec![]));
    assert_eq!(probe(None, &["read", link]), Answer::Ok);
}

#[test]
fn a_hard_link_stays_denied_across_an_update_that_keeps_the_named_paths() {
    let mut kernel = Kernel::new();
    sh("rm -rf /tmp/linked-kept && mkdir -p /tmp/linked-kept/public");
    let token = file("/tmp/linked-kept/secret/token");
    let link = "/tmp/linked-kept/public/token";
    sh(&format!("ln {token} {link}"));
    let target = denying_under(&mut kernel, "linked-kept", "/tmp/linked-kept/secret");
    assert_eq!(
        read(&mut kernel, &target, link),
        (EPERM, vec![link.to_owned()])
    );
    // The same file rule and one on something else: the new version has the first one's inodes.
    let rules = format!(
        "{}    network:\n      - addresses: [192.0.2.1]\n        action: deny\n",
        deny_read("/tmp/linked-kept/secret/")
    );
    kernel.apply(&target, policy("linked-kept", &rules));
    assert_eq!(
        read(&mut kernel, &target, link),
        (EPERM, vec![link.to_owned()]),
        "after the update"
    );
    kernel.enforcer().retire_released();
    assert_eq!(
        read(&mut kernel, &target, link),
        (EPERM, vec![link.to_owned()]),
        "once the first version's entries are deleted"
    );
    assert_eq!(probe(None, &["read", link]), Answer::Ok);
}

#[test]
fn a_file_written_through_a_hard_link_made_before_the_policy_is_denied() {
    let mut kernel = Kernel::new();
    sh("rm -rf /tmp/linked-write && mkdir -p /tmp/linked-write/public");
    let passwd = file("/tmp/linked-write/passwd");
    let link = "/tmp/linked-write/public/passwd";
    sh(&format!("ln {passwd} {link}"));
    let target = denying_write_of(&mut kernel, "linked-write", passwd);
    assert_eq!(
        run(&mut kernel, &target, &["write", link]),
        (EPERM, vec![link.to_owned()])
    );
    assert_eq!(
        run(&mut kernel, &target, &["truncate", link]),
        (EPERM, vec![link.to_owned()])
    );
    assert_eq!(
        run(&mut kernel, &target, &["read", link]),
        (Answer::Ok, vec![]),
        "only writing is denied"
    );
    assert_eq!(probe(None, &["write", link]), Answer::Ok);
}

#[test]
fn a_directory_denied_as_a_running_targets_own_mount_namespace_names_it_is_denied_by_its_other_name()
 {
    let mut kernel = Kernel::new();
    sh("rm -rf /tmp/own-view && mkdir -p /tmp/own-view/secret");
    let other_name = file("/tmp/own-view/mounted/file");
    let (ready, go) = ("/tmp/own-view/ready", "/tmp/own-view/go");
    let target = kernel.cgroup(None, "own-view");
    // In the target's namespace, /tmp/own-view/secret is /tmp/own-view/mounted; in the agent's,
    // an empty directory: only a look through the running process's root finds what it names.
    let child = spawn_probe(
        Some(&target),
        &[
            "read-in-mount-ns-when",
            "/tmp/own-view/mounted",
            "/tmp/own-view/secret",
            ready,
            go,
            other_name,
        ],
    );
    let started = std::time::Instant::now();
    while !std::path::Path::new(ready).exists() {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(10),
            "the probe never mounted"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    kernel.apply(
        &target,
        policy("own-view", &deny_read("/tmp/own-view/secret/")),
    );
    std::fs::write(go, "").unwrap();
    assert_eq!(
        answer(&child.wait_with_output().unwrap()),
        EPERM,
        "the file under its name outside the denied directory"
    );
    assert_eq!(probe(None, &["read", other_name]), Answer::Ok);
}

#[test]
fn a_second_mount_of_a_denied_directory_is_denied_under_its_other_name() {
    let mut kernel = Kernel::new();
    sh("rm -rf /tmp/aliased && mkdir -p /tmp/aliased");
    file("/tmp/aliased/secret/deep/file");
    let target = denying_under(&mut kernel, "aliased", "/tmp/aliased/secret");
    // Mounted after the policy: the directory is the same inode under either name.
    let _alias = bind_mount("/tmp/aliased/secret", "/tmp/aliased/alias");
    let alias = "/tmp/aliased/alias/deep/file";
    assert_eq!(
        read(&mut kernel, &target, alias),
        (EPERM, vec![alias.to_owned()])
    );
    assert_eq!(probe(None, &["read", alias]), Answer::Ok);
}

#[test]
fn a_file_remembered_as_allowed_is_denied_once_a_denied_directory_holds_another_name_of_it() {
    let mut kernel = Kernel::new();
    sh("rm -rf /tmp/later-linked && mkdir -p /tmp/later-linked/secret");
    let public = file("/tmp/later-linked/public/file");
    let target = denying_under(&mut kernel, "later-linked", "/tmp/later-linked/secret");
    sh(&format!("ln {public} /tmp/later-linked/secret/file"));
    // Allowed until the agent looks for the named inodes again, and remembered by the cache.
    assert_eq!(read(&mut kernel, &target, public), (Answer::Ok, vec![]));
    kernel.enforcer().find_named_inodes_again(false);
    assert_eq!(
        read(&mut kernel, &target, public),
        (EPERM, vec![public.to_owned()]),
        "the first open after the agent found the other name"
    );
}

#[test]
fn a_denied_directory_that_is_a_file_systems_root_is_itself_still_readable() {
    let mut kernel = Kernel::new();
    sh(
        "rm -rf /tmp/volume && mkdir -p /tmp/volume/secret && mount -t tmpfs none /tmp/volume/secret",
    );
    let _mounted = Unmount("/tmp/volume/secret");
    let token = file("/tmp/volume/secret/token");
    let target = denying_under(&mut kernel, "volume", "/tmp/volume/secret");
    // The directory's root dentry is its own parent: it is not a file in itself.
    assert_eq!(
        probe(Some(&target), &["read", "/tmp/volume/secret"]),
        Answer::Errno(libc::EISDIR),
        "opened (listing it is no read of a file below it), then read as a directory"
    );
    assert_eq!(
        read(&mut kernel, &target, token),
        (EPERM, vec![token.to_owned()])
    );
}

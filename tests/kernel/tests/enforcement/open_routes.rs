//! Every route by which the kernel opens a file for a task is decided like open(2): a protected
//! file reached another way is refused and reported, and the same route works outside the
//! target. SECURITY.md lists the routes, with the kernel function and the hook of each.

use palisade_kernel_tests::{
    Answer, Kernel, assert_allowed, assert_denied_once, file, probe, probe_command,
    protect_with_rule, sh,
};

const ATTACK: &str = "attackProtectionRules";
const SA_TOKEN: &str = "/run/secrets/kubernetes.io/serviceaccount/token";

/// The file handle of `path` (as an attacker would guess it), taken outside every target.
fn handle_of(path: &str) -> String {
    let out = probe_command(None, &["handle", path])
        .output()
        .expect("running the probe");
    assert!(out.status.success(), "no handle for {path}: {out:?}");
    String::from_utf8(out.stdout)
        .expect("hex")
        .trim()
        .to_owned()
}

/// open_by_handle_at on the mount of the file's own directory: decided by the file's path.
#[test]
fn file_handle_open_is_decided_like_open() {
    let mut kernel = Kernel::new();
    let rule = "mitigate-sa-leak";
    let handle = handle_of(file(SA_TOKEN));
    let target = protect_with_rule(&mut kernel, ATTACK, rule);
    let mount = "/run/secrets/kubernetes.io/serviceaccount";
    let args = ["read-by-handle", &handle, mount];
    let event = assert_denied_once(&mut kernel, &target, rule, &args, libc::EPERM);
    assert_eq!(event.path, SA_TOKEN, "{event:#?}");
    assert_eq!(probe(None, &args), Answer::Ok);
}

/// open_by_handle_at on a bind mount of another directory of the token's file system: the file
/// is outside that mount's subtree (d_path gives "/"), so it is placed under the mount that
/// holds it and decided by the path found there.
#[test]
fn file_handle_outside_its_mount_is_decided_by_the_path_that_holds_it() {
    let mut kernel = Kernel::new();
    let rule = "mitigate-sa-leak";
    let handle = handle_of(file(SA_TOKEN));
    file("/run/palisade-handles/public/file");
    let view = "/tmp/handles/view";
    sh(&format!(
        "mkdir -p {view} && mount --bind /run/palisade-handles/public {view}"
    ));
    let target = protect_with_rule(&mut kernel, ATTACK, rule);
    let args = ["read-by-handle", &handle, view];
    let event = assert_denied_once(&mut kernel, &target, rule, &args, libc::EPERM);
    assert_eq!(event.path, SA_TOKEN, "{event:#?}");
    assert_eq!(probe(None, &args), Answer::Ok);
    sh(&format!("umount {view}"));
}

/// open_by_handle_at of a file that no mount of the task's holds: no path names it, so a target
/// whose policy has path rules is refused it and the refusal is reported; a target whose policy
/// has none is not.
#[test]
fn file_handle_to_a_file_no_path_names_is_refused_under_path_rules() {
    let mut kernel = Kernel::new();
    let (fs, view) = ("/tmp/handles/fs", "/tmp/handles/unnamed-view");
    sh(&format!(
        "mkdir -p {fs} {view} && mount -t tmpfs none {fs} && mkdir {fs}/public {fs}/hidden"
    ));
    let handle = handle_of(file(&format!("{fs}/hidden/file")));
    // Only the public directory stays mounted: the hidden file has no name left.
    sh(&format!("mount --bind {fs}/public {view} && umount {fs}"));
    let args = ["read-by-handle", &handle, view];
    let with_paths = protect_with_rule(&mut kernel, ATTACK, "mitigate-sa-leak");
    let rule = "palisade-path-outside-mount";
    let event = assert_denied_once(&mut kernel, &with_paths, rule, &args, libc::EPERM);
    assert_eq!(event.path, "", "{event:#?}");
    // Files of the kernel's own mounts have no path either, and are no target of path rules.
    assert_allowed(&mut kernel, &with_paths, &["memfd"]);
    let without_paths = protect_with_rule(&mut kernel, "hardeningRules", "disallow-umount");
    assert_eq!(probe(Some(&without_paths), &args), Answer::Ok);
    assert_eq!(probe(None, &args), Answer::Ok);
    sh(&format!("umount {view}"));
}

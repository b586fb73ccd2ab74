//! Every route by which a task gets a file open (opened by name or without one, by the kernel on
//! its behalf, or passed to it already open) is decided like open(2): a protected file reached
//! that way is refused and reported, and the same route works outside the target. SECURITY.md
//! lists the routes, with the kernel functions and the hook of each.

use std::{
    io::{BufRead, BufReader},
    os::unix::process::ExitStatusExt,
    path::Path,
    process::{Child, Output, Stdio},
    time::{Duration, Instant},
};

use palisade_agent::{events::AuditEvent, targets::Cgroup};
use palisade_kernel_tests::{
    Answer, EPERM, Kernel, answer, assert_allowed, assert_denied_once, deny_read, file, policy,
    probe, probe_command, protect_with_rule, sh, spawn_probe,
};

const ATTACK: &str = "attackProtectionRules";
const SA_TOKEN: &str = "/run/secrets/kubernetes.io/serviceaccount/token";

/// A route that reads the service account token (probe `args`): refused in a target under
/// `mitigate-sa-leak`, reported once with the token's own path, and working outside.
fn token_read_refused(args: &[&str]) {
    let mut kernel = Kernel::new();
    let rule = "mitigate-sa-leak";
    file(SA_TOKEN);
    let target = protect_with_rule(&mut kernel, ATTACK, rule);
    let event = assert_denied_once(&mut kernel, &target, rule, args, libc::EPERM);
    assert_eq!(event.path, SA_TOKEN, "{event:#?}");
    assert_eq!(probe(None, args), Answer::Ok);
}

/// The one audit event since the last look: a denial of `path` under `rule`.
fn reported_once(kernel: &mut Kernel, rule: &str, path: &str) -> AuditEvent {
    let events = kernel.events();
    assert_eq!(events.len(), 1, "{events:#?}");
    let event = events.into_iter().next().expect("one event");
    assert_eq!(event.naming.rule.as_deref(), Some(rule), "{event:#?}");
    assert_eq!(event.naming.action, "deny", "{event:#?}");
    assert_eq!(event.path, path, "{event:#?}");
    event
}

/// A route by which the kernel opens `path` (a new file under /etc) for writing: refused in a
/// target under `disable-write-etc`, reported once with that path; outside, the kernel answers
/// `outside`.
fn etc_write_refused(op: &str, path: &str, outside: Answer) {
    let mut kernel = Kernel::new();
    let rule = "disable-write-etc";
    let args = [op, file(path)];
    let target = protect_with_rule(&mut kernel, ATTACK, rule);
    let event = assert_denied_once(&mut kernel, &target, rule, &args, libc::EPERM);
    assert_eq!(event.path, path, "{event:#?}");
    assert_eq!(probe(None, &args), outside);
}

/// The file handle of `path` (as an attacker would guess it), taken outside every target by the
/// probe's `op` (`handle`: name_to_handle_at, `xfs-handle`: XFS_IOC_PATH_TO_HANDLE).
fn handle_of(op: &str, path: &str) -> String {
    let out = probe_command(None, &[op, path])
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
    let handle = handle_of("handle", file(SA_TOKEN));
    let mount = "/run/secrets/kubernetes.io/serviceaccount";
    token_read_refused(&["read-by-handle", &handle, mount]);
}

/// open_by_handle_at on a bind mount of another directory of the token's file system: the file
/// is outside that mount's subtree (d_path gives "/"), so it is placed under the mount that
/// holds it and decided by the path found there.
#[test]
fn file_handle_outside_its_mount_is_decided_by_the_path_that_holds_it() {
    let handle = handle_of("handle", file(SA_TOKEN));
    file("/run/palisade-handles/public/file");
    let view = "/tmp/handles/view";
    sh(&format!(
        "mkdir -p {view} && mount --bind /run/palisade-handles/public {view}"
    ));
    token_read_refused(&["read-by-handle", &handle, view]);
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
    let handle = handle_of("handle", file(&format!("{fs}/hidden/file")));
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

/// XFS's own handle ioctl (XFS_IOC_OPEN_BY_HANDLE, CAP_SYS_ADMIN): xfs_open_by_handle, then
/// dentry_open on the mount of the ioctl's file. Decided by the file's path, also when that mount
/// is a bind mount whose subtree does not hold the file.
#[test]
fn xfs_handle_open_is_decided_like_open() {
    let mut kernel = Kernel::new();
    let (fs, view) = ("/tmp/xfs", "/tmp/xfs-view");
    sh(&format!(
        "grep -q ' {fs} ' /proc/mounts || {{ mkdir -p {fs} {view} && truncate -s 300M {fs}.img \
         && mkfs.xfs -q {fs}.img && mount -o loop {fs}.img {fs} && mkdir {fs}/public \
         && mount --bind {fs}/public {view}; }}"
    ));
    let secret = file("/tmp/xfs/secret");
    let handle = handle_of("xfs-handle", secret);
    let target = kernel.cgroup(None, "xfs-handle");
    kernel.apply(&target, policy("xfs-handle", &deny_read(secret)));
    kernel.events();
    for mount in [fs, view] {
        let args = ["read-by-xfs-handle", &handle, mount];
        assert_eq!(probe(Some(&target), &args), EPERM, "{args:?}");
        reported_once(&mut kernel, "customRules.files[0]", secret);
        assert_eq!(probe(None, &args), Answer::Ok, "{args:?}");
    }
}

/// openat2(2): the same path_openat.
#[test]
fn openat2_is_decided_like_open() {
    token_read_refused(&["read-openat2", SA_TOKEN]);
}

/// io_uring's IORING_OP_OPENAT, run by an io-wq worker thread of the target (io_openat2, then
/// do_filp_open): the worker is in the target's cgroup, and its open is decided.
#[test]
fn io_uring_open_is_decided_like_open() {
    token_read_refused(&["read-io-uring", SA_TOKEN]);
}

/// A magic link (/proc/self/fd of an O_PATH descriptor, whose open decided nothing): the lookup
/// jumps to the file's own path (nd_jump_link), and that open is decided.
#[test]
fn reopen_through_proc_fd_is_decided_like_open() {
    token_read_refused(&["read-reopen", SA_TOKEN]);
}

/// The same magic link to a file unlinked since: d_path adds " (deleted)" to its path, and the
/// rule of the path it had still holds (the policy denies only reading, so unlinking works).
#[test]
fn reopen_of_an_unlinked_file_is_decided_by_the_path_it_had() {
    let mut kernel = Kernel::new();
    let secret = "/tmp/unlinked/secret";
    let target = kernel.cgroup(None, "unlinked");
    kernel.apply(&target, policy("unlinked", &deny_read(secret)));
    kernel.events();
    assert_eq!(
        probe(Some(&target), &["read-unlinked", file(secret)]),
        EPERM
    );
    reported_once(&mut kernel, "customRules.files[0]", secret);
    assert_eq!(probe(None, &["read-unlinked", file(secret)]), Answer::Ok);
}

/// /proc/self/root: another magic link, to the task's root.
#[test]
fn open_through_proc_root_is_decided_like_open() {
    let through_root = format!("/proc/self/root{SA_TOKEN}");
    token_read_refused(&["read", &through_root]);
}

/// A process outside every target that holds the token open and mapped, until dropped.
struct Holder {
    child: Child,
    /// Its descriptor of the token.
    fd: String,
    /// Its mapping of the token, under /proc/PID/map_files.
    mapping: String,
}

impl Holder {
    fn start() -> Self {
        let mut child = probe_command(None, &["hold", file(SA_TOKEN)])
            .stdin(Stdio::piped())
            .spawn()
            .expect("starting the holder");
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().expect("the holder's output"))
            .read_line(&mut line)
            .expect("the holder's descriptor and mapping");
        let (fd, range) = line
            .trim()
            .split_once(' ')
            .expect("a descriptor and a range");
        let mapping = format!("/proc/{}/map_files/{range}", child.id());
        Self {
            fd: fd.to_owned(),
            mapping,
            child,
        }
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

/// /proc/PID/map_files: a link to the file another process (outside every target) has mapped.
#[test]
fn open_through_map_files_is_decided_like_open() {
    let holder = Holder::start();
    token_read_refused(&["read", &holder.mapping]);
}

/// pidfd_getfd: a copy of a descriptor of another process's (receive_fd, then
/// security_file_receive), decided as if the target had opened the file itself.
#[test]
fn descriptor_copied_with_pidfd_getfd_is_decided_like_open() {
    let holder = Holder::start();
    let pid = holder.child.id().to_string();
    token_read_refused(&["read-pidfd-getfd", &pid, &holder.fd]);
}

/// SCM_RIGHTS: a descriptor sent over a UNIX socket by a process outside every target
/// (scm_detach_fds, then security_file_receive): the target does not get it.
#[test]
fn descriptor_passed_over_a_socket_is_decided_like_open() {
    let mut kernel = Kernel::new();
    let rule = "mitigate-sa-leak";
    let socket = "/tmp/palisade-fd.sock";
    file(SA_TOKEN);
    let target = protect_with_rule(&mut kernel, ATTACK, rule);
    let receive = |cgroup| {
        let out = handed_over(
            cgroup,
            &["send-fd", socket, SA_TOKEN],
            &["read-received", socket],
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    kernel.events();
    assert_eq!(receive(Some(&target)), "no-descriptor");
    let event = reported_once(&mut kernel, rule, SA_TOKEN);
    assert_eq!(event.naming.hook, "file_receive", "{event:#?}");
    assert_eq!(receive(None), "ok");
}

/// seccomp user notification: a supervisor outside every target adds a descriptor of the token
/// to the trapped target (SECCOMP_IOCTL_NOTIF_ADDFD; the target completes the add in
/// receive_fd, then security_file_receive): the target gets EPERM instead.
#[test]
fn descriptor_added_by_a_seccomp_supervisor_is_decided_like_open() {
    let mut kernel = Kernel::new();
    let rule = "mitigate-sa-leak";
    let socket = "/tmp/palisade-seccomp.sock";
    file(SA_TOKEN);
    let target = protect_with_rule(&mut kernel, ATTACK, rule);
    let receive = |cgroup| {
        let supervisor = ["seccomp-add-fd", socket, SA_TOKEN];
        answer(&handed_over(
            cgroup,
            &supervisor,
            &["read-seccomp-added", socket],
        ))
    };
    kernel.events();
    assert_eq!(receive(Some(&target)), Answer::Errno(libc::EPERM));
    let event = reported_once(&mut kernel, rule, SA_TOKEN);
    assert_eq!(event.naming.hook, "file_receive", "{event:#?}");
    assert_eq!(receive(None), Answer::Ok);
}

/// The output of `receiver`, run in `cgroup` while `sender` runs outside every target to hand
/// it a descriptor.
fn handed_over(cgroup: Option<&Cgroup>, sender: &[&str], receiver: &[&str]) -> Output {
    let mut sender = spawn_probe(None, sender);
    let out = probe_command(cgroup, receiver)
        .output()
        .expect("running the receiver");
    assert!(sender.wait().expect("the sender").success());
    out
}

/// uselib(2) (a 32-bit system call): the kernel opens the library, which must be executable, for
/// reading (both test kernels without FMODE_EXEC), and reads its header. Decided like open;
/// outside, the file is opened and refused as no library (ENOEXEC).
#[test]
fn uselib_is_decided_like_open() {
    let mut kernel = Kernel::new();
    let library = "/tmp/uselib/library";
    sh(&format!("chmod 755 {}", file(library)));
    let target = kernel.cgroup(None, "uselib");
    kernel.apply(&target, policy("uselib", &deny_read(library)));
    kernel.events();
    assert_eq!(probe(Some(&target), &["uselib", library]), EPERM);
    reported_once(&mut kernel, "customRules.files[0]", library);
    assert_eq!(
        probe(None, &["uselib", library]),
        Answer::Errno(libc::ENOEXEC)
    );
}

/// TIOCGPTPEER: the kernel opens the peer of a pseudo-terminal for the task (ptm_open_peer, then
/// dentry_open), by dentry rather than by name: decided by the peer's /dev/pts path.
#[test]
fn pty_peer_is_decided_like_open() {
    let mut kernel = Kernel::new();
    sh(
        "mkdir -p /dev/pts && { grep -q ' /dev/pts ' /proc/mounts || mount -t devpts devpts /dev/pts; }",
    );
    let target = kernel.cgroup(None, "pty-peer");
    let rules = "    files:\n      - paths: [/dev/pts/**]\n        permissions: [read, write]\n        action: deny\n";
    kernel.apply(&target, policy("pty-peer", rules));
    kernel.events();
    assert_eq!(probe(Some(&target), &["pty-peer"]), EPERM);
    // The first terminal of a fresh devpts instance.
    reported_once(&mut kernel, "customRules.files[0]", "/dev/pts/0");
    assert_eq!(probe(None, &["pty-peer"]), Answer::Ok);
}

/// fanotify: reading an open event makes the kernel open the file for the listener
/// (dentry_open); in a target, that open is decided like the target's own.
#[test]
fn fanotify_event_descriptor_is_decided_like_open() {
    let mut kernel = Kernel::new();
    let rule = "mitigate-sa-leak";
    file(SA_TOKEN);
    let target = protect_with_rule(&mut kernel, ATTACK, rule);
    kernel.events();
    assert_eq!(fanotify_answer(Some(&target)), Answer::Errno(libc::EPERM));
    reported_once(&mut kernel, rule, SA_TOKEN);
    assert_eq!(fanotify_answer(None), Answer::Ok);
}

/// Starts a fanotify listener on the token in `cgroup` and opens the token outside every target
/// until the listener has answered.
fn fanotify_answer(cgroup: Option<&Cgroup>) -> Answer {
    let mut listener = spawn_probe(cgroup, &["fanotify-read", SA_TOKEN]);
    let deadline = Instant::now() + Duration::from_secs(60);
    while listener
        .try_wait()
        .expect("waiting for the listener")
        .is_none()
    {
        assert!(Instant::now() < deadline, "the listener saw no open");
        // The listener may not have marked the file yet: open it again until it answers.
        drop(std::fs::File::open(SA_TOKEN).expect("opening the token outside targets"));
        std::thread::sleep(Duration::from_millis(500));
    }
    answer(&listener.wait_with_output().expect("the listener's answer"))
}

/// A core dump: the kernel creates and opens the core file (filp_open in do_coredump) as the
/// dumping task, so the target's rules decide where its core goes.
#[test]
fn core_dump_file_is_decided_like_open() {
    let pattern = "/proc/sys/kernel/core_pattern";
    let previous = std::fs::read_to_string(pattern).expect("reading the core pattern");
    let core = Path::new("/etc/palisade-core");
    std::fs::create_dir_all("/etc").expect("creating /etc");
    std::fs::write(pattern, core.as_os_str().as_encoded_bytes()).expect("setting the core pattern");
    let core_size = || std::fs::metadata(core).map(|metadata| metadata.len()).ok();
    let dump = |target: Option<&Cgroup>| {
        let _ = std::fs::remove_file(core);
        let status = probe_command(target, &["dump-core"])
            .status()
            .expect("running the probe");
        assert_eq!(status.signal(), Some(libc::SIGABRT), "{status:?}");
    };
    dump(None);
    assert!(
        core_size() > Some(0),
        "no core was written outside a target"
    );
    let mut kernel = Kernel::new();
    let rule = "disable-write-etc";
    let target = protect_with_rule(&mut kernel, ATTACK, rule);
    kernel.events();
    dump(Some(&target));
    assert_eq!(core_size(), None, "a core file was created");
    reported_once(&mut kernel, rule, core.to_str().expect("a UTF-8 path"));
    std::fs::write(pattern, previous).expect("restoring the core pattern");
}

/// open with O_CREAT of a missing file: the creation is decided (path_mknod, from may_o_create)
/// before the file exists, so nothing is left behind.
#[test]
fn creating_a_file_is_decided_before_it_exists() {
    let mut kernel = Kernel::new();
    let rule = "disable-write-etc";
    let created = "/etc/palisade-created";
    std::fs::create_dir_all("/etc").expect("creating /etc");
    let _ = std::fs::remove_file(created);
    let target = protect_with_rule(&mut kernel, ATTACK, rule);
    let event = assert_denied_once(
        &mut kernel,
        &target,
        rule,
        &["create", created],
        libc::EPERM,
    );
    assert_eq!(
        (event.naming.hook, event.path.as_str()),
        ("path_mknod", created)
    );
    assert!(!Path::new(created).exists(), "the file was created");
    assert_eq!(probe(None, &["create", created]), Answer::Ok);
    std::fs::remove_file(created).expect("removing the file");
}

/// acct(2): the kernel opens the accounting file to append to it (filp_open).
#[test]
fn process_accounting_file_is_decided_like_open() {
    etc_write_refused("acct", "/etc/palisade-acct", Answer::Ok);
}

/// swapon(2): the kernel opens the file read-write (file_open_name) before reading its header;
/// outside a target this file is refused only as not being swap space.
#[test]
fn swap_file_is_decided_like_open() {
    etc_write_refused("swapon", "/etc/palisade-swap", Answer::Errno(libc::EINVAL));
}

/// A file of an overlay (how container runtimes mount a container's root) is decided by its path
/// in the overlay, once. overlayfs then opens the file of the layer behind it for the task,
/// through security_file_open too: on 6.1 under the overlay path (open_with_fake_path), a repeat
/// of the decision made, not decided again; on 6.12 under the layer's own path
/// (backing_file_open), decided by that path, which no rule here names.
#[test]
fn overlay_file_is_decided_once_by_its_overlay_path() {
    let mut kernel = Kernel::new();
    let (secret, watched) = ("/tmp/overlay/merged/secret", "/tmp/overlay/merged/watched");
    file("/tmp/overlay/lower/secret");
    file("/tmp/overlay/lower/watched");
    sh(
        "mkdir -p /tmp/overlay/upper /tmp/overlay/work /tmp/overlay/merged \
        && { grep -q ' /tmp/overlay/merged ' /proc/mounts || mount -t overlay overlay \
        -o lowerdir=/tmp/overlay/lower,upperdir=/tmp/overlay/upper,workdir=/tmp/overlay/work \
        /tmp/overlay/merged; }",
    );
    let rules = format!(
        "{}      - paths: [{watched}]\n        permissions: [read]\n        action: audit\n",
        deny_read(secret)
    );
    let target = kernel.cgroup(None, "overlay");
    kernel.apply(&target, policy("overlay", &rules));
    kernel.events();
    assert_eq!(probe(Some(&target), &["read", secret]), EPERM);
    reported_once(&mut kernel, "customRules.files[0]", secret);
    assert_eq!(probe(Some(&target), &["read", watched]), Answer::Ok);
    let events = kernel.events();
    assert_eq!(events.len(), 1, "{events:#?}");
    assert_eq!(events[0].naming.action, "audit", "{events:#?}");
    assert_eq!(events[0].path, watched, "{events:#?}");
    assert_eq!(probe(None, &["read", secret]), Answer::Ok);
}

/// binfmt_misc: executing a file of a registered format runs its interpreter, refused by the
/// interpreter's exec rules as a script's interpreter is; also with the F flag, whose interpreter
/// the kernel opened at registration and reopens at each exec (file_clone_open, for reading).
#[test]
fn binfmt_misc_interpreter_is_decided_like_exec() {
    let mut kernel = Kernel::new();
    let interpreter = "/tmp/binfmt/sh"; // busybox: a shell by this name
    std::fs::create_dir_all("/tmp/binfmt").expect("a directory");
    std::fs::copy("/bin/busybox", interpreter).expect("copying busybox");
    let formats = "/proc/sys/fs/binfmt_misc";
    sh(&format!(
        "grep -q ' {formats} ' /proc/mounts || mount -t binfmt_misc binfmt_misc {formats}"
    ));
    let target = kernel.cgroup(None, "binfmt");
    let rules = format!("    exec:\n      - paths: [{interpreter}]\n        action: deny\n");
    kernel.apply(&target, policy("binfmt", &rules));
    for (format, flags) in [("palisade-opened", ""), ("palisade-fixed", "F")] {
        // The magic starts a shell comment: the interpreter runs the rest.
        let program = format!("/tmp/binfmt/{format}");
        std::fs::write(&program, format!("#{format}\necho ok\n")).expect("the program");
        sh(&format!(
            "chmod 755 {program} && {{ [ -e {formats}/{format} ] || \
             echo ':{format}:M::#{format}::{interpreter}:{flags}' > {formats}/register; }}"
        ));
        kernel.events();
        assert_eq!(probe(Some(&target), &["exec", &program]), EPERM, "{format}");
        reported_once(&mut kernel, "customRules.exec[0]", interpreter);
        assert_eq!(probe(None, &["exec", &program]), Answer::Ok, "{format}");
    }
}

//! Every built-in rule on a real kernel: the violation inside a target fails with the exact errno
//! and one audit event naming the rule, and a related operation still works. Bypasses the peers'
//! versions of these rules are known for are tried too.

use std::{
    net::TcpListener,
    os::{
        linux::net::SocketAddrExt,
        unix::{fs::symlink, net::UnixListener},
    },
};

use palisade_kernel_tests::{
    Answer, EPERM, INGRESS_ADMISSION_ENDPOINT, INGRESS_ADMISSION_IP, INGRESS_ADMISSION_PORT,
    KUBE_APISERVER, Kernel, assert_allowed, assert_denied_once, binary, file, probe,
    protect_with_rule, sh,
};

const EACCES: i32 = libc::EACCES;
const HARDENING: &str = "hardeningRules";
const ATTACK: &str = "attackProtectionRules";
const VULNERABILITY: &str = "vulMitigationRules";

fn dir(path: &str) -> &str {
    std::fs::create_dir_all(path).expect("creating a directory");
    path
}

/// One rule in a target: `violation` (probe arguments) denied with EPERM and reported once,
/// `control` allowed.
fn rule_holds(list: &str, rule: &str, violation: &[&str], control: &[&str]) {
    let mut kernel = Kernel::new();
    let target = protect_with_rule(&mut kernel, list, rule);
    assert_denied_once(&mut kernel, &target, rule, violation, libc::EPERM);
    assert_allowed(&mut kernel, &target, control);
}

#[test]
fn disallow_write_core_pattern() {
    let pattern = "/proc/sys/kernel/core_pattern";
    rule_holds(
        HARDENING,
        "disallow-write-core-pattern",
        &["write", pattern],
        &["read", pattern],
    );
}

#[test]
fn disallow_write_release_agent() {
    // A cgroup v1 hierarchy can be mounted anywhere: the rule holds for any such path.
    rule_holds(
        HARDENING,
        "disallow-write-release-agent",
        &["write", file("/tmp/cg1/release_agent")],
        &["write", file("/tmp/cg1/notify_on_release")],
    );
}

#[test]
fn disallow_access_kallsyms() {
    rule_holds(
        HARDENING,
        "disallow-access-kallsyms",
        &["read", "/proc/kallsyms"],
        &["read", "/proc/version"],
    );
}

#[test]
fn disallow_mount_with_both_mount_apis() {
    let mut kernel = Kernel::new();
    let rule = "disallow-mount";
    let target = protect_with_rule(&mut kernel, HARDENING, rule);
    let point = dir("/tmp/dm/point");
    assert_denied_once(
        &mut kernel,
        &target,
        rule,
        &["mount", "tmpfs", "none", point],
        libc::EPERM,
    );
    assert_denied_once(
        &mut kernel,
        &target,
        rule,
        &["new-mount", "tmpfs", point],
        libc::EPERM,
    );
    assert_denied_once(
        &mut kernel,
        &target,
        rule,
        &["clone-tree", "/tmp", point],
        libc::EPERM,
    );
    assert_allowed(&mut kernel, &target, &["read", "/proc/version"]);
}

#[test]
fn disallow_umount() {
    let mut kernel = Kernel::new();
    let rule = "disallow-umount";
    let target = protect_with_rule(&mut kernel, HARDENING, rule);
    let point = dir("/tmp/du/point");
    sh(&format!("mount -t tmpfs none {point}"));
    assert_denied_once(&mut kernel, &target, rule, &["umount", point], libc::EPERM);
    assert_allowed(&mut kernel, &target, &["read", "/proc/version"]);
    sh(&format!("umount {point}"));
}

/// A rule on new mounts of `fs_type`: refused through mount(2), through the new mount API
/// attached or detached; a tmpfs mount still works.
fn mount_type_rule(rule: &str, fs_type: &str, source: &str) {
    let mut kernel = Kernel::new();
    let target = protect_with_rule(&mut kernel, HARDENING, rule);
    let point = dir(&format!("/tmp/{rule}/point")).to_owned();
    for violation in [
        vec!["mount", fs_type, source, &point],
        vec!["new-mount", fs_type, &point],
        vec!["detached-mount", fs_type],
    ] {
        let event = assert_denied_once(&mut kernel, &target, rule, &violation, libc::EPERM);
        assert_eq!(event.fs_type.as_deref(), Some(fs_type), "{event:#?}");
    }
    assert_allowed(&mut kernel, &target, &["mount", "tmpfs", "none", &point]);
    sh(&format!("umount {point}"));
}

#[test]
fn disallow_mount_procfs_including_a_clone_of_proc() {
    mount_type_rule("disallow-mount-procfs", "proc", "proc");
    // open_tree(OPEN_TREE_CLONE) of the existing /proc, attached elsewhere: a proc mount too.
    let mut kernel = Kernel::new();
    let rule = "disallow-mount-procfs";
    let target = protect_with_rule(&mut kernel, HARDENING, rule);
    let point = dir("/tmp/mp-clone/point");
    assert_denied_once(
        &mut kernel,
        &target,
        rule,
        &["clone-tree", "/proc", point],
        libc::EPERM,
    );
}

#[test]
fn disallow_mount_cgroupfs_covers_cgroup2() {
    mount_type_rule("disallow-mount-cgroupfs", "cgroup2", "none");
    mount_type_rule("disallow-mount-cgroupfs", "cgroup", "none");
}

#[test]
fn disallow_mount_securityfs() {
    mount_type_rule("disallow-mount-securityfs", "securityfs", "none");
}

#[test]
fn disallow_mount_disk_device_whatever_the_device_node_is_called() {
    let mut kernel = Kernel::new();
    let rule = "disallow-mount-disk-device";
    sh("mknod /tmp/alias-disk b 1 0 2>/dev/null; true");
    let target = protect_with_rule(&mut kernel, HARDENING, rule);
    let point = dir("/tmp/dd/point");
    for device in ["/dev/ram0", "/tmp/alias-disk"] {
        assert_denied_once(
            &mut kernel,
            &target,
            rule,
            &["mount", "minix", device, point],
            libc::EPERM,
        );
    }
    assert_allowed(&mut kernel, &target, &["mount", "tmpfs", "none", point]);
    sh(&format!("umount {point}"));
    // Outside the target the kernel goes on to read the (empty) disk.
    assert_eq!(
        probe(None, &["mount", "minix", "/dev/ram0", point]),
        Answer::Errno(libc::EINVAL)
    );
}

#[test]
fn disallow_debug_disk_device_by_device_not_path() {
    let mut kernel = Kernel::new();
    let rule = "disallow-debug-disk-device";
    sh("mknod /tmp/disk-by-another-name b 1 0 2>/dev/null; true");
    let target = protect_with_rule(&mut kernel, HARDENING, rule);
    for device in ["/dev/ram0", "/tmp/disk-by-another-name"] {
        let event = assert_denied_once(&mut kernel, &target, rule, &["read", device], libc::EPERM);
        assert_eq!(
            event.rdev.map(|rdev| rdev.to_string()).as_deref(),
            Some("1:0"),
            "{event:#?}"
        );
        assert_denied_once(&mut kernel, &target, rule, &["write", device], libc::EPERM);
    }
    assert_allowed(&mut kernel, &target, &["read", "/dev/null"]);
    assert_eq!(probe(None, &["read", "/dev/ram0"]), Answer::Ok);
}

#[test]
fn disallow_insmod() {
    rule_holds(
        HARDENING,
        "disallow-insmod",
        &["init-module"],
        &["read", "/proc/version"],
    );
}

#[test]
fn disallow_load_bpf_prog() {
    let mut kernel = Kernel::new();
    let rule = "disallow-load-bpf-prog";
    let target = protect_with_rule(&mut kernel, HARDENING, rule);
    kernel.events();
    assert_eq!(probe(Some(&target), &["bpf-prog-load"]), EPERM);
    // The kernel asks for CAP_BPF, then for CAP_SYS_ADMIN: each refusal is reported.
    let events = kernel.events();
    assert!(!events.is_empty());
    for event in &events {
        assert_eq!(event.naming.rule.as_deref(), Some(rule), "{event:#?}");
        assert!(
            matches!(
                event.capability.as_deref(),
                Some("CAP_BPF" | "CAP_SYS_ADMIN")
            ),
            "{event:#?}"
        );
    }
    assert_allowed(&mut kernel, &target, &["read", "/proc/version"]);
    assert_eq!(probe(None, &["bpf-prog-load"]), Answer::Ok);
}

#[test]
fn disallow_load_all_bpf_prog() {
    rule_holds(
        HARDENING,
        "disallow-load-all-bpf-prog",
        &["bpf-prog-load"],
        &["bpf-map-create"],
    );
}

#[test]
fn disallow_load_bpf_via_setsockopt() {
    rule_holds(
        HARDENING,
        "disallow-load-bpf-via-setsockopt",
        &["attach-filter"],
        &["socket", "2", "2", "0"],
    );
}

#[test]
fn disallow_access_procfs_root_of_processes_outside() {
    let mut kernel = Kernel::new();
    let rule = "disallow-access-procfs-root";
    let target = protect_with_rule(&mut kernel, HARDENING, rule);
    // PID 1 is outside every target. The kernel turns the refusal into EACCES.
    let event = assert_denied_once(
        &mut kernel,
        &target,
        rule,
        &["readlink", "/proc/1/root"],
        EACCES,
    );
    assert_eq!(event.object_pid, Some(1));
    assert_allowed(&mut kernel, &target, &["readlink", "/proc/self/root"]);
}

#[test]
fn disallow_abuse_user_ns() {
    rule_holds(
        HARDENING,
        "disallow-abuse-user-ns",
        &["unshare-user-then-uts"],
        &["unshare-user"],
    );
}

#[test]
fn disallow_create_user_ns() {
    rule_holds(
        HARDENING,
        "disallow-create-user-ns",
        &["unshare-user"],
        &["unshare-uts"],
    );
}

/// The misc device /dev/userfaultfd, made where the test can reach it (the VM's /dev may not
/// have it): its minor number is in /proc/misc.
fn userfaultfd_device() -> &'static str {
    let path = "/tmp/userfaultfd";
    let misc = std::fs::read_to_string("/proc/misc").unwrap();
    let minor: u32 = misc
        .lines()
        .find_map(|line| line.trim().strip_suffix(" userfaultfd"))
        .unwrap_or_else(|| panic!("no userfaultfd misc device: {misc}"))
        .trim()
        .parse()
        .unwrap();
    let _ = std::fs::remove_file(path);
    sh(&format!("mknod {path} c 10 {minor}"));
    path
}

#[test]
fn disallow_userfaultfd_creation() {
    let device = userfaultfd_device();
    let mut kernel = Kernel::new();
    let rule = "disallow-userfaultfd-creation";
    let target = protect_with_rule(&mut kernel, HARDENING, rule);
    for violation in [vec!["userfaultfd"], vec!["userfaultfd-dev", device]] {
        let event = assert_denied_once(&mut kernel, &target, rule, &violation, libc::EPERM);
        assert_eq!(event.naming.hook, "inode_init_security_anon");
        assert_eq!(probe(None, &violation), Answer::Ok, "{violation:?} outside");
    }
    // The hook also labels io_uring's files: an io_uring stays allowed.
    assert_allowed(&mut kernel, &target, &["read-io-uring", "/proc/version"]);
}

#[test]
fn disable_cap_all() {
    rule_holds(
        HARDENING,
        "disable-cap-all",
        &["sethostname"],
        &["read", "/proc/version"],
    );
}

#[test]
fn disable_cap_all_except_net_bind_service() {
    rule_holds(
        HARDENING,
        "disable-cap-all-except-net-bind-service",
        &["sethostname"],
        &["bind-port", "80"],
    );
}

#[test]
fn disable_cap_privileged_leaves_the_runtime_defaults() {
    let owned = file("/tmp/caps/owned");
    rule_holds(
        HARDENING,
        "disable-cap-privileged",
        &["sethostname"],
        &["chown", owned, "1000", "1000"],
    );
}

#[test]
fn disable_cap_by_name_across_capabilities() {
    let owned = file("/tmp/caps/named");
    let locked = file("/tmp/caps/locked");
    std::fs::set_permissions(locked, std::os::unix::fs::PermissionsExt::from_mode(0o000)).unwrap();
    let _ = std::fs::remove_file("/tmp/caps/node");
    // One operation each capability guards; the kernel answers EACCES for some of them.
    let cases: [(&str, &str, Vec<&str>, i32); 9] = [
        (
            "disable-cap-sys-admin",
            "CAP_SYS_ADMIN",
            vec!["sethostname"],
            libc::EPERM,
        ),
        (
            "disable-cap-chown",
            "CAP_CHOWN",
            vec!["chown", owned, "1001", "1001"],
            libc::EPERM,
        ),
        (
            "disable-cap-net-bind-service",
            "CAP_NET_BIND_SERVICE",
            vec!["bind-port", "81"],
            libc::EACCES,
        ),
        (
            "disable-cap-net-raw",
            "CAP_NET_RAW",
            vec!["socket", "2", "3", "1"],
            libc::EPERM,
        ),
        (
            "disable-cap-sys-chroot",
            "CAP_SYS_CHROOT",
            vec!["chroot", "/tmp"],
            libc::EPERM,
        ),
        (
            "disable-cap-mknod",
            "CAP_MKNOD",
            vec!["mknod-block", "/tmp/caps/node"],
            libc::EPERM,
        ),
        (
            "disable-cap-setuid",
            "CAP_SETUID",
            vec!["setuid", "1000"],
            libc::EPERM,
        ),
        (
            "disable-cap-dac-override",
            "CAP_DAC_OVERRIDE",
            vec!["write", locked],
            libc::EACCES,
        ),
        (
            "disable-cap-sys-module",
            "CAP_SYS_MODULE",
            vec!["init-module"],
            libc::EPERM,
        ),
    ];
    for (rule, capability, violation, errno) in cases {
        let mut kernel = Kernel::new();
        let target = protect_with_rule(&mut kernel, HARDENING, rule);
        let event = assert_denied_once(&mut kernel, &target, rule, &violation, errno);
        assert_eq!(event.capability.as_deref(), Some(capability), "{event:#?}");
        // Only that capability: another privileged operation still works.
        let control = if rule == "disable-cap-sys-admin" {
            vec!["chroot", "/"]
        } else {
            vec!["sethostname"]
        };
        assert_allowed(&mut kernel, &target, &control);
    }
}

#[test]
fn mitigate_sa_leak() {
    rule_holds(
        ATTACK,
        "mitigate-sa-leak",
        &[
            "read",
            file("/run/secrets/kubernetes.io/serviceaccount/token"),
        ],
        &["read", file("/run/secrets/other/token")],
    );
}

#[test]
fn mitigate_disk_device_number_leak() {
    rule_holds(
        ATTACK,
        "mitigate-disk-device-number-leak",
        &["read", "/proc/partitions"],
        &["read", "/proc/version"],
    );
}

#[test]
fn mitigate_overlayfs_leak_through_proc_self() {
    rule_holds(
        ATTACK,
        "mitigate-overlayfs-leak",
        &["read", "/proc/self/mounts"],
        &["read", "/proc/self/status"],
    );
}

#[test]
fn mitigate_host_ip_leak() {
    rule_holds(
        ATTACK,
        "mitigate-host-ip-leak",
        &["read", "/proc/net/arp"],
        &["read", "/proc/net/dev"],
    );
}

#[test]
fn disable_write_etc_covers_changing_names_and_modes() {
    let mut kernel = Kernel::new();
    let rule = "disable-write-etc";
    let conf = file("/etc/palisade-test.conf");
    // On the root file system, like /etc: renames and links do not cross file systems.
    let outside = file("/palisade-test-outside.conf");
    let target = protect_with_rule(&mut kernel, ATTACK, rule);
    for violation in [
        vec!["write", conf],
        vec!["truncate", conf],
        vec!["unlink", conf],
        vec!["rename", conf, "/etc/palisade-test.renamed"],
        vec!["rename", outside, "/etc/palisade-test.new"],
        vec!["link", outside, "/etc/palisade-test.link"],
        vec!["symlink", outside, "/etc/palisade-test.symlink"],
        vec!["mkdir", "/etc/palisade-test.d"],
        vec!["chmod", conf, "600"],
    ] {
        assert_denied_once(&mut kernel, &target, rule, &violation, libc::EPERM);
    }
    assert_allowed(&mut kernel, &target, &["read", conf]);
    assert_allowed(&mut kernel, &target, &["write", outside]);
}

#[test]
fn disable_access_passwd() {
    rule_holds(
        ATTACK,
        "disable-access-passwd",
        &["read", file("/etc/passwd")],
        &["read", file("/etc/group")],
    );
}

#[test]
fn disable_access_shadow() {
    rule_holds(
        ATTACK,
        "disable-access-shadow",
        &["read", file("/etc/shadow")],
        &["read", file("/etc/group")],
    );
}

#[test]
fn disable_access_ssh_dir() {
    let mut kernel = Kernel::new();
    let rule = "disable-access-ssh-dir";
    let keys = [
        file("/root/.ssh/id_rsa"),
        file("/home/user/.ssh/id_ed25519"),
    ];
    let target = protect_with_rule(&mut kernel, ATTACK, rule);
    for key in keys {
        assert_denied_once(&mut kernel, &target, rule, &["read", key], libc::EPERM);
    }
    assert_allowed(&mut kernel, &target, &["read", file("/home/user/notes")]);
}

#[test]
fn disable_shell_by_the_name_used_and_the_file_run() {
    let mut kernel = Kernel::new();
    let rule = "disable-shell";
    // /bin/sh is busybox here: matched by the name it is started by.
    let copy = "/tmp/shells/bin/bash";
    dir("/tmp/shells/bin");
    std::fs::copy("/bin/busybox", copy).unwrap();
    symlink(copy, "/tmp/shells/link-to-bash").ok();
    let target = protect_with_rule(&mut kernel, ATTACK, rule);
    for violation in [
        vec!["exec", "/bin/sh", "-c", "true"],
        vec!["exec", copy, "-c", "true"],
        vec!["exec", "/tmp/shells/link-to-bash", "-c", "true"],
        vec!["exec-fd", copy, "-c", "true"],
    ] {
        assert_denied_once(&mut kernel, &target, rule, &violation, libc::EPERM);
    }
    let probe_binary = binary("PALISADE_PROBE");
    assert_allowed(
        &mut kernel,
        &target,
        &[
            "exec",
            probe_binary.to_str().unwrap(),
            "read",
            "/proc/version",
        ],
    );
}

#[test]
fn disable_busybox_including_its_applets() {
    let mut kernel = Kernel::new();
    let rule = "disable-busybox";
    let target = protect_with_rule(&mut kernel, ATTACK, rule);
    // /bin/true is a symlink to busybox: the file run is busybox.
    for violation in [
        vec!["exec", "/bin/busybox", "true"],
        vec!["exec", "/bin/true"],
    ] {
        assert_denied_once(&mut kernel, &target, rule, &violation, libc::EPERM);
    }
    let probe_binary = binary("PALISADE_PROBE");
    assert_allowed(
        &mut kernel,
        &target,
        &[
            "exec",
            probe_binary.to_str().unwrap(),
            "read",
            "/proc/version",
        ],
    );
}

/// A rule on running a tool: the tool (a copy of the probe under its name) is refused; the same
/// binary under another name runs.
fn tool_rule(rule: &str, tools: &[&str]) {
    let mut kernel = Kernel::new();
    let bin = dir(&format!("/tmp/{rule}/bin")).to_owned();
    let probe_binary = binary("PALISADE_PROBE");
    for tool in tools.iter().chain(&["other"]) {
        std::fs::copy(&probe_binary, format!("{bin}/{tool}")).unwrap();
    }
    let target = protect_with_rule(&mut kernel, ATTACK, rule);
    for tool in tools {
        let path = format!("{bin}/{tool}");
        assert_denied_once(
            &mut kernel,
            &target,
            rule,
            &["exec", &path, "read", "/proc/version"],
            libc::EPERM,
        );
    }
    let other = format!("{bin}/other");
    assert_allowed(
        &mut kernel,
        &target,
        &["exec", &other, "read", "/proc/version"],
    );
}

#[test]
fn disable_wget() {
    tool_rule("disable-wget", &["wget"]);
}

#[test]
fn disable_curl() {
    tool_rule("disable-curl", &["curl"]);
}

#[test]
fn disable_chmod() {
    tool_rule("disable-chmod", &["chmod"]);
}

#[test]
fn disable_su_sudo() {
    tool_rule("disable-su-sudo", &["su", "sudo"]);
}

#[test]
fn disable_chmod_x_bit() {
    let script = file("/tmp/chmod-x/script");
    rule_holds(
        ATTACK,
        "disable-chmod-x-bit",
        &["chmod", script, "755"],
        &["chmod", script, "640"],
    );
}

#[test]
fn disable_chmod_s_bit() {
    let tool = file("/tmp/chmod-s/tool");
    rule_holds(
        ATTACK,
        "disable-chmod-s-bit",
        &["chmod", tool, "4755"],
        &["chmod", tool, "755"],
    );
}

#[test]
fn disable_network() {
    let mut kernel = Kernel::new();
    let rule = "disable-network";
    let target = protect_with_rule(&mut kernel, ATTACK, rule);
    for family in ["2", "10", "1", "16", "17"] {
        assert_denied_once(
            &mut kernel,
            &target,
            rule,
            &["socket", family, "2", "0"],
            libc::EPERM,
        );
    }
    assert_allowed(&mut kernel, &target, &["read", "/proc/version"]);
}

#[test]
fn disable_inet() {
    rule_holds(
        ATTACK,
        "disable-inet",
        &["socket", "2", "1", "0"],
        &["socket", "10", "1", "0"],
    );
}

#[test]
fn disable_inet6() {
    rule_holds(
        ATTACK,
        "disable-inet6",
        &["socket", "10", "1", "0"],
        &["socket", "2", "1", "0"],
    );
}

#[test]
fn disable_unix_domain_socket() {
    rule_holds(
        ATTACK,
        "disable-unix-domain-socket",
        &["socket", "1", "1", "0"],
        &["socket", "2", "1", "0"],
    );
}

#[test]
fn disable_icmp() {
    rule_holds(
        ATTACK,
        "disable-icmp",
        &["socket", "2", "2", "1"],
        &["socket", "2", "2", "0"],
    );
}

#[test]
fn disable_tcp_when_the_protocol_is_left_to_the_kernel() {
    let mut kernel = Kernel::new();
    let rule = "disable-tcp";
    let target = protect_with_rule(&mut kernel, ATTACK, rule);
    // socket(AF_INET, SOCK_STREAM, 0) is TCP as much as IPPROTO_TCP is.
    for violation in [
        ["socket", "2", "1", "0"],
        ["socket", "10", "1", "6"],
        ["socket", "2", "3", "6"],
    ] {
        let event = assert_denied_once(&mut kernel, &target, rule, &violation, libc::EPERM);
        assert_eq!(event.socket.as_ref().map(|socket| socket.protocol), Some(6));
    }
    assert_allowed(&mut kernel, &target, &["socket", "2", "2", "0"]);
}

#[test]
fn disable_udp() {
    rule_holds(
        ATTACK,
        "disable-udp",
        &["socket", "2", "2", "0"],
        &["socket", "2", "1", "0"],
    );
}

/// A listener outside every target, for control connections.
fn loopback_listener() -> (TcpListener, String) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port().to_string();
    (listener, port)
}

/// `rule` (in `list`) makes IPv4 `address` unreachable: by connect, datagram, TCP Fast Open and
/// an IPv6 socket, and through the sockets that would not say where they send: packet and raw IP
/// ones.
fn destination_rule(list: &str, rule: &str, address: &str) {
    let mut kernel = Kernel::new();
    let target = protect_with_rule(&mut kernel, list, rule);
    let mapped = format!("::ffff:{address}");
    for violation in [
        vec!["connect", address, "80"],
        vec!["sendto", address, "53"],
        vec!["sendto-fastopen", address, "80"],
        // The same address through an IPv6 socket.
        vec!["connect", &mapped, "443"],
    ] {
        let event = assert_denied_once(&mut kernel, &target, rule, &violation, libc::EPERM);
        let socket = event.socket.expect("socket details");
        assert_eq!(socket.address.as_deref(), Some(address), "{violation:?}");
    }
    // AF_PACKET; SOCK_RAW of AF_INET (ICMP) and AF_INET6 (ICMPv6).
    for violation in [
        ["socket", "17", "3", "0"],
        ["socket", "2", "3", "1"],
        ["socket", "10", "3", "58"],
    ] {
        assert_denied_once(&mut kernel, &target, rule, &violation, libc::EPERM);
        assert_eq!(probe(None, &violation), Answer::Ok, "{violation:?} outside");
    }
    let (_listener, port) = loopback_listener();
    assert_allowed(&mut kernel, &target, &["connect", "127.0.0.1", &port]);
    assert_allowed(&mut kernel, &target, &["socket", "2", "2", "0"]);
}

#[test]
fn block_access_to_metadata_service_and_its_mapped_form() {
    destination_rule(
        ATTACK,
        "block-access-to-metadata-service",
        "169.254.169.254",
    );
    destination_rule(
        ATTACK,
        "block-access-to-metadata-service",
        "100.100.100.200",
    );
}

#[test]
fn disallow_metadata_service_is_the_same_rule() {
    destination_rule(ATTACK, "disallow-metadata-service", "169.254.169.254");
}

#[test]
fn one_clouds_metadata_service() {
    destination_rule(
        ATTACK,
        "block-access-to-aws-metadata-service",
        "169.254.169.254",
    );
    destination_rule(
        ATTACK,
        "block-access-to-volc-metadata-service",
        "100.96.0.96",
    );
    destination_rule(
        ATTACK,
        "block-access-to-alibaba-metadata-service",
        "100.100.100.200",
    );
    destination_rule(
        ATTACK,
        "block-access-to-oci-metadata-service",
        "192.0.0.192",
    );
}

#[test]
fn block_access_to_kube_apiserver() {
    destination_rule(ATTACK, "block-access-to-kube-apiserver", KUBE_APISERVER);
}

#[test]
fn ingress_nightmare_mitigation_blocks_the_admission_service() {
    destination_rule(
        VULNERABILITY,
        "ingress-nightmare-mitigation",
        INGRESS_ADMISSION_IP,
    );
}

/// The webhook's pods are blocked on the port the Service's endpoints serve; their other ports
/// stay reachable.
#[test]
fn ingress_nightmare_mitigation_blocks_only_the_webhook_port_of_its_endpoints() {
    let mut kernel = Kernel::new();
    let rule = "ingress-nightmare-mitigation";
    let target = protect_with_rule(&mut kernel, VULNERABILITY, rule);
    let port = INGRESS_ADMISSION_PORT.to_string();
    let mapped = format!("::ffff:{INGRESS_ADMISSION_ENDPOINT}");
    for violation in [
        ["connect", INGRESS_ADMISSION_ENDPOINT, &port],
        ["sendto", INGRESS_ADMISSION_ENDPOINT, &port],
        ["connect", &mapped, &port],
    ] {
        let event = assert_denied_once(&mut kernel, &target, rule, &violation, libc::EPERM);
        let socket = event.socket.expect("socket details");
        assert_eq!(
            socket.address.as_deref(),
            Some(INGRESS_ADMISSION_ENDPOINT),
            "{violation:?}"
        );
    }
    // Another port of the same address, and another address on the webhook's port.
    let other = TcpListener::bind((INGRESS_ADMISSION_ENDPOINT, 0)).unwrap();
    let other_port = other.local_addr().unwrap().port().to_string();
    assert_allowed(
        &mut kernel,
        &target,
        &["connect", INGRESS_ADMISSION_ENDPOINT, &other_port],
    );
    let _beside = TcpListener::bind(("127.0.0.1", INGRESS_ADMISSION_PORT)).unwrap();
    assert_allowed(&mut kernel, &target, &["connect", "127.0.0.1", &port]);
}

/// The custom rules docs/policies.md gives for an address a custom network rule denies: packet
/// and raw IP sockets by family and type.
#[test]
fn custom_socket_rules_by_family_and_type() {
    let mut kernel = Kernel::new();
    let target = kernel.cgroup(None, "custom-sockets");
    kernel.apply(
        &target,
        palisade_kernel_tests::policy(
            "custom-sockets",
            "    sockets:\n      - {name: packet, family: packet, action: deny}\n      - {name: raw-ip, family: inet, types: [raw], action: deny}\n",
        ),
    );
    assert_denied_once(
        &mut kernel,
        &target,
        "packet",
        &["socket", "17", "2", "0"],
        libc::EPERM,
    );
    for violation in [["socket", "2", "3", "1"], ["socket", "2", "3", "255"]] {
        assert_denied_once(&mut kernel, &target, "raw-ip", &violation, libc::EPERM);
        assert_eq!(probe(None, &violation), Answer::Ok, "{violation:?} outside");
    }
    assert_allowed(&mut kernel, &target, &["socket", "2", "2", "0"]);
    assert_allowed(&mut kernel, &target, &["socket", "10", "3", "58"]);
}

#[test]
fn block_access_to_container_runtime_by_the_socket_reached() {
    let mut kernel = Kernel::new();
    let rule = "block-access-to-container-runtime";
    let runtime = "/tmp/crt/run/containerd/containerd.sock";
    dir("/tmp/crt/run/containerd");
    let _ = std::fs::remove_file(runtime);
    let _runtime = UnixListener::bind(runtime).unwrap();
    // The same socket under another name, as a bind mount or symlink would give it.
    let _ = std::fs::remove_file("/tmp/crt/innocent.sock");
    symlink(runtime, "/tmp/crt/innocent.sock").unwrap();
    let shim =
        std::os::unix::net::SocketAddr::from_abstract_name(b"/containerd-shim/k8s/1/shim.sock")
            .unwrap();
    let _shim = UnixListener::bind_addr(&shim).unwrap();
    let app = "/tmp/crt/app.sock";
    let _ = std::fs::remove_file(app);
    let _app = UnixListener::bind(app).unwrap();
    let target = protect_with_rule(&mut kernel, ATTACK, rule);
    for violation in [
        ["unix-connect", runtime],
        ["unix-connect", "/tmp/crt/innocent.sock"],
        ["unix-connect", "@/containerd-shim/k8s/1/shim.sock"],
    ] {
        assert_denied_once(&mut kernel, &target, rule, &violation, libc::EPERM);
    }
    assert_allowed(&mut kernel, &target, &["unix-connect", app]);
}

#[test]
fn cgroups_lxcfs_escape_mitigation() {
    rule_holds(
        VULNERABILITY,
        "cgroups-lxcfs-escape-mitigation",
        &["write", file("/tmp/lxcfs/cgroup/devices/devices.allow")],
        &["write", file("/tmp/lxcfs/cgroup/devices/devices.deny")],
    );
}

#[test]
fn runc_override_mitigation_by_the_file_reached() {
    let runc = file("/tmp/runc-test/usr/bin/runc");
    let _ = std::fs::remove_file("/tmp/runc-test/exe");
    symlink(runc, "/tmp/runc-test/exe").unwrap();
    rule_holds(
        VULNERABILITY,
        "runc-override-mitigation",
        &["write", "/tmp/runc-test/exe"],
        &["write", file("/tmp/runc-test/usr/bin/other")],
    );
}

#[test]
fn copy_fail_mitigation() {
    rule_holds(
        VULNERABILITY,
        "copy-fail-mitigation",
        &["socket", "38", "5", "0"],
        &["socket", "2", "1", "0"],
    );
}

//! The names of the built-in rules, by the `spec.enhanceProtect` list each belongs in. What each
//! rule does is the agent's business (its catalog); the names are part of the API: the CRD
//! schema lists them, so the API server refuses a misspelled rule (the agent checks
//! attackProtectionRules, whose schema also takes vArmor's items).

/// The list of `spec.enhanceProtect` a built-in rule belongs in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Category {
    Hardening,
    AttackProtection,
    VulMitigation,
}

impl Category {
    pub const ALL: [Category; 3] = [
        Category::Hardening,
        Category::AttackProtection,
        Category::VulMitigation,
    ];

    pub fn field(self) -> &'static str {
        match self {
            Category::Hardening => "hardeningRules",
            Category::AttackProtection => "attackProtectionRules",
            Category::VulMitigation => "vulMitigationRules",
        }
    }
}

/// Capability names, by number (include/uapi/linux/capability.h).
pub const CAPABILITIES: [&str; 41] = [
    "chown",
    "dac_override",
    "dac_read_search",
    "fowner",
    "fsetid",
    "kill",
    "setgid",
    "setuid",
    "setpcap",
    "linux_immutable",
    "net_bind_service",
    "net_broadcast",
    "net_admin",
    "net_raw",
    "ipc_lock",
    "ipc_owner",
    "sys_module",
    "sys_rawio",
    "sys_chroot",
    "sys_ptrace",
    "sys_pacct",
    "sys_admin",
    "sys_boot",
    "sys_nice",
    "sys_resource",
    "sys_time",
    "sys_tty_config",
    "mknod",
    "lease",
    "audit_write",
    "audit_control",
    "setfcap",
    "mac_override",
    "mac_admin",
    "syslog",
    "wake_alarm",
    "block_suspend",
    "audit_read",
    "perfmon",
    "bpf",
    "checkpoint_restore",
];

/// Every built-in rule with the list it belongs in (`disable-cap-<name>` aside).
pub const RULES: &[(&str, Category)] = &[
    ("disallow-write-core-pattern", Category::Hardening),
    ("disallow-write-release-agent", Category::Hardening),
    ("disallow-access-kallsyms", Category::Hardening),
    ("disallow-mount", Category::Hardening),
    ("disallow-umount", Category::Hardening),
    ("disallow-mount-procfs", Category::Hardening),
    ("disallow-mount-cgroupfs", Category::Hardening),
    ("disallow-mount-securityfs", Category::Hardening),
    ("disallow-mount-disk-device", Category::Hardening),
    ("disallow-debug-disk-device", Category::Hardening),
    ("disallow-insmod", Category::Hardening),
    ("disallow-load-bpf-prog", Category::Hardening),
    ("disallow-load-ebpf", Category::Hardening),
    ("disallow-load-all-bpf-prog", Category::Hardening),
    ("disallow-load-bpf-via-setsockopt", Category::Hardening),
    ("disallow-access-procfs-root", Category::Hardening),
    ("disallow-abuse-user-ns", Category::Hardening),
    ("disallow-create-user-ns", Category::Hardening),
    ("disallow-userfaultfd-creation", Category::Hardening),
    ("disable-cap-all", Category::Hardening),
    (
        "disable-cap-all-except-net-bind-service",
        Category::Hardening,
    ),
    ("disable-cap-privileged", Category::Hardening),
    ("mitigate-sa-leak", Category::AttackProtection),
    (
        "mitigate-disk-device-number-leak",
        Category::AttackProtection,
    ),
    ("mitigate-overlayfs-leak", Category::AttackProtection),
    ("mitigate-host-ip-leak", Category::AttackProtection),
    ("disable-write-etc", Category::AttackProtection),
    ("disable-access-passwd", Category::AttackProtection),
    ("disable-access-shadow", Category::AttackProtection),
    ("disable-access-ssh-dir", Category::AttackProtection),
    ("disable-shell", Category::AttackProtection),
    ("disable-busybox", Category::AttackProtection),
    ("disable-wget", Category::AttackProtection),
    ("disable-curl", Category::AttackProtection),
    ("disable-chmod", Category::AttackProtection),
    ("disable-su-sudo", Category::AttackProtection),
    ("disable-chmod-x-bit", Category::AttackProtection),
    ("disable-chmod-s-bit", Category::AttackProtection),
    ("disable-network", Category::AttackProtection),
    ("disable-inet", Category::AttackProtection),
    ("disable-inet6", Category::AttackProtection),
    ("disable-ipv4", Category::AttackProtection),
    ("disable-ipv6", Category::AttackProtection),
    ("disable-unix-domain-socket", Category::AttackProtection),
    ("disable-icmp", Category::AttackProtection),
    ("disable-tcp", Category::AttackProtection),
    ("disable-udp", Category::AttackProtection),
    (
        "block-access-to-metadata-service",
        Category::AttackProtection,
    ),
    ("disallow-metadata-service", Category::AttackProtection),
    (
        "block-access-to-aws-metadata-service",
        Category::AttackProtection,
    ),
    (
        "block-access-to-volc-metadata-service",
        Category::AttackProtection,
    ),
    (
        "block-access-to-alibaba-metadata-service",
        Category::AttackProtection,
    ),
    (
        "block-access-to-oci-metadata-service",
        Category::AttackProtection,
    ),
    ("block-access-to-kube-apiserver", Category::AttackProtection),
    (
        "block-access-to-container-runtime",
        Category::AttackProtection,
    ),
    ("cgroups-lxcfs-escape-mitigation", Category::VulMitigation),
    ("runc-override-mitigation", Category::VulMitigation),
    ("copy-fail-mitigation", Category::VulMitigation),
    ("ingress-nightmare-mitigation", Category::VulMitigation),
];

/// vArmor's rules that only its seccomp profiles enforce, and no LSM hook can. The schema takes
/// them, as it takes a vArmor policy; the agent refuses them, saying what to use instead.
pub const SECCOMP_ONLY: &[(&str, Category)] = &[("dirty-pipe-mitigation", Category::VulMitigation)];

/// Every name a policy may use: the rules above and `disable-cap-<name>` for each capability.
pub fn known_names() -> Vec<(String, Category)> {
    RULES
        .iter()
        .map(|(name, category)| ((*name).to_owned(), *category))
        .chain(CAPABILITIES.iter().map(|cap| {
            (
                format!("disable-cap-{}", cap.replace('_', "-")),
                Category::Hardening,
            )
        }))
        .collect()
}

/// The names `category`'s list takes in the schema: its rules and those of SECCOMP_ONLY.
pub fn names_in(category: Category) -> Vec<String> {
    let seccomp_only = SECCOMP_ONLY
        .iter()
        .map(|(name, belongs)| ((*name).to_owned(), *belongs));
    known_names()
        .into_iter()
        .chain(seccomp_only)
        .filter(|(_, belongs)| *belongs == category)
        .map(|(name, _)| name)
        .collect()
}

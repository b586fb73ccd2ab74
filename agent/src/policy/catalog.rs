//! The built-in rules, by their vArmor names, and what each one is made of. Each rule is a list
//! of effects in the kernel's terms; lowering treats them exactly like custom rules.
//!
//! Where vArmor matches a string the caller controls, these match what the kernel resolved: the
//! opened or executed file's path, the device behind a device file, the socket a UNIX connect
//! reaches, the file system type of a mount, the protocol a socket really uses.

pub use palisade_crds::rules::{CAPABILITIES, Category, known_names};

use super::{
    Pattern,
    effect::{AddressBlock, EXEC_RULE_PERMS, Effect, Switch},
};

/// Facts about the machine some rules need, gathered by the caller (compilation stays pure).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Environment {
    /// Addresses (IP or CIDR) of the Kubernetes API server, for block-access-to-kube-apiserver.
    pub kube_apiserver: Vec<String>,
    /// This machine's host name.
    pub node: String,
    /// Where the ingress-nginx admission webhook is, for ingress-nightmare-mitigation: known in
    /// Kubernetes mode only, once the agent has listed its Services (`None` until then, and
    /// elsewhere).
    pub ingress_admission: Option<ServiceDestinations>,
}

/// The rule that blocks ingress-nginx's admission webhook.
pub const INGRESS_NIGHTMARE_MITIGATION: &str = "ingress-nightmare-mitigation";
/// The Service of ingress-nginx's admission webhook, which CVE-2025-1974 reaches from any pod.
pub const INGRESS_ADMISSION_SERVICE: &str = "ingress-nginx-controller-admission";
/// The namespaces ingress-nginx is installed in (its chart's and its manifests' defaults). Only
/// these: whoever writes Services or EndpointSlices elsewhere must not choose what pods may reach.
pub const INGRESS_ADMISSION_NAMESPACES: [&str; 2] = ["ingress-nginx", "kube-system"];

/// Where a Service is reached: its cluster IPs on every port, its endpoints on theirs. Sorted
/// and without duplicates, so that the same destinations compare equal.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServiceDestinations {
    /// The Services found, as `namespace/name`.
    pub services: Vec<String>,
    pub cluster_ips: Vec<String>,
    pub endpoints: Vec<Endpoints>,
}

/// Addresses of a Service's endpoints (an EndpointSlice's) and the ports they serve on.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Endpoints {
    pub addresses: Vec<String>,
    /// Empty: every port.
    pub ports: Vec<u16>,
}

impl Environment {
    /// From the variables Kubernetes sets in every pod (the agent's own, in a DaemonSet), and
    /// the kernel's host name.
    pub fn from_process() -> Self {
        Self {
            kube_apiserver: std::env::var("KUBERNETES_SERVICE_HOST")
                .map(|host| vec![host])
                .unwrap_or_default(),
            node: std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|name| name.trim().to_owned())
                .unwrap_or_default(),
            ingress_admission: None,
        }
    }
}

/// The capability number of `name` (`sys_admin`, `sys-admin` or `CAP_SYS_ADMIN`).
pub fn capability(name: &str) -> Option<u32> {
    let name = name.to_ascii_lowercase().replace('-', "_");
    let name = name.strip_prefix("cap_").unwrap_or(&name);
    CAPABILITIES
        .iter()
        .position(|known| *known == name)
        .map(|index| index as u32)
}

fn caps(names: &[&str]) -> u64 {
    names.iter().fold(0, |mask, name| {
        mask | 1 << capability(name).expect("a known capability")
    })
}

pub const ALL_CAPS: u64 = (1 << CAPABILITIES.len()) - 1;

/// What containerd grants by default; disable-cap-privileged denies every other capability.
const DEFAULT_CAPS: [&str; 14] = [
    "chown",
    "dac_override",
    "fowner",
    "fsetid",
    "kill",
    "setgid",
    "setuid",
    "setpcap",
    "net_bind_service",
    "net_raw",
    "sys_chroot",
    "mknod",
    "audit_write",
    "setfcap",
];

const READ: u32 = palisade_common::PERM_READ;
/// Writing covers appending, truncating, deleting, renaming, linking and chmod.
const WRITE: u32 = palisade_common::PERM_WRITE | palisade_common::PERM_APPEND;

/// A built-in pattern (every one is parsed by the unit tests).
fn pattern(text: &str) -> Pattern {
    Pattern::parse(text).unwrap_or_else(|reason| panic!("built-in pattern {reason}"))
}

fn files(patterns: &[&str], perms: u32) -> Effect {
    Effect::Paths {
        patterns: patterns.iter().map(|text| pattern(text)).collect(),
        perms,
    }
}

/// Running a program of one of these names, wherever it is.
fn exec(names: &[&str]) -> Effect {
    Effect::Paths {
        patterns: names
            .iter()
            .map(|name| pattern(&format!("/**/{name}")))
            .collect(),
        perms: EXEC_RULE_PERMS,
    }
}

const AF_UNIX: u32 = libc::AF_UNIX as u32;
const AF_INET: u32 = libc::AF_INET as u32;
const AF_INET6: u32 = libc::AF_INET6 as u32;
const AF_ALG: u32 = libc::AF_ALG as u32;
const AF_PACKET: u32 = libc::AF_PACKET as u32;
/// Address families 1..AF_MAX (46 on 6.1 and 6.12).
const AF_MAX: u32 = 46;
const ANY: u32 = palisade_common::ANY_PROTOCOL;

fn sockets(keys: &[(u32, u32)]) -> Effect {
    Effect::Sockets(keys.to_vec())
}

/// The sockets that reach an address without giving the hooks a destination to check: packet
/// sockets (frames of their own making) and raw IP sockets (a header of their own with
/// IP_HDRINCL).
fn unhooked_sockets() -> Effect {
    let raw = palisade_common::SOCKET_TYPE | libc::SOCK_RAW as u32;
    sockets(&[(AF_PACKET, ANY), (AF_INET, raw), (AF_INET6, raw)])
}

/// No connect or datagram to `addresses` on `ports` (empty: every port), whatever the protocol.
fn destinations<A: AsRef<str>>(addresses: &[A], ports: &[u16]) -> Result<Effect, String> {
    // An empty list would mean every address.
    if addresses.is_empty() {
        return Err("no address to block".to_owned());
    }
    Ok(Effect::Network {
        blocks: addresses
            .iter()
            .map(|address| AddressBlock::parse(address.as_ref()))
            .collect::<Result<_, _>>()?,
        ports: ports.to_vec(),
        protocols: Vec::new(),
    })
}

/// `addresses` cannot be reached: no connect or datagram to them, and no unhooked socket.
fn unreachable<A: AsRef<str>>(addresses: &[A]) -> Result<Vec<Effect>, String> {
    Ok(vec![destinations(addresses, &[])?, unhooked_sockets()])
}

/// Services cannot be reached: their cluster IPs on any port, their endpoints on the ports they
/// serve (a pod's other ports stay reachable), and no unhooked socket.
fn services_unreachable(services: &ServiceDestinations) -> Result<Vec<Effect>, String> {
    let mut effects = Vec::new();
    if !services.cluster_ips.is_empty() {
        effects.push(destinations(&services.cluster_ips, &[])?);
    }
    for endpoints in &services.endpoints {
        if !endpoints.addresses.is_empty() {
            effects.push(destinations(&endpoints.addresses, &endpoints.ports)?);
        }
    }
    effects.push(unhooked_sockets());
    Ok(effects)
}

/// The admission Services, for messages: "A and B" or "A nor B".
fn ingress_admission_services(conjunction: &str) -> String {
    INGRESS_ADMISSION_NAMESPACES
        .map(|namespace| format!("{namespace}/{INGRESS_ADMISSION_SERVICE}"))
        .join(&format!(" {conjunction} "))
}

/// A built-in rule of addresses this file lists.
fn unreachable_builtin(addresses: &[&str]) -> Vec<Effect> {
    unreachable(addresses).expect("the built-in addresses parse")
}

/// The container runtimes' default hardening (containerd's and CRI-O's AppArmor defaults, as
/// vArmor enforces them with BPF): kernel interfaces, every mount, tracing outside the target.
pub fn runtime_default() -> Vec<Effect> {
    vec![
        files(
            &[
                "/proc/sysrq-trigger",
                "/proc/**/mem",
                "/proc/kmem",
                "/proc/kcore",
                "/sys/firmware/",
                "/sys/devices/virtual/powercap/",
                "/sys/kernel/security/",
            ],
            READ | WRITE,
        ),
        Effect::Switch(Switch::Mount),
        Effect::Switch(Switch::PtraceOutside),
    ]
}

const DIRTY_PIPE_INSTEAD: &str = "vArmor enforces this rule with seccomp (refusing splice), \
    which Palisade does not load; no kernel hook tells the exploit's splice and pipe write from \
    ordinary ones. Use a kernel with the fix for CVE-2022-0847 (5.10.102, 5.15.25, 5.16.11 and \
    later), or on an older one a seccomp profile that refuses splice";

/// The effects of built-in rule `name`, or why it cannot be used here. `None` for an unknown
/// name.
pub fn effects(name: &str, env: &Environment) -> Option<Result<Vec<Effect>, String>> {
    let effects = match name {
        "disallow-write-core-pattern" => vec![files(&["/proc/sys/kernel/core_pattern"], WRITE)],
        // Anywhere: a cgroup v1 hierarchy can be mounted at any path.
        "disallow-write-release-agent" => vec![files(&["/**/release_agent"], WRITE)],
        "disallow-access-kallsyms" => vec![files(&["/proc/kallsyms"], READ)],
        "disallow-mount" => vec![Effect::Switch(Switch::Mount)],
        "disallow-umount" => vec![Effect::Switch(Switch::Umount)],
        "disallow-mount-procfs" => vec![Effect::MountTypes(vec!["proc".into()])],
        "disallow-mount-cgroupfs" => {
            vec![Effect::MountTypes(vec!["cgroup".into(), "cgroup2".into()])]
        }
        "disallow-mount-securityfs" => vec![Effect::MountTypes(vec!["securityfs".into()])],
        // Any file system on a block device, whatever the device node is called.
        "disallow-mount-disk-device" => vec![Effect::Switch(Switch::MountBlockDevice)],
        // Any block device file, matched by the inode's type, not by its path.
        "disallow-debug-disk-device" => vec![Effect::Switch(Switch::BlockDeviceOpen)],
        "disallow-insmod" => vec![Effect::Capabilities(caps(&["sys_module"]))],
        "disallow-load-bpf-prog" | "disallow-load-ebpf" => {
            vec![Effect::Capabilities(caps(&["sys_admin", "bpf"]))]
        }
        "disallow-load-all-bpf-prog" => vec![Effect::Switch(Switch::BpfProgLoad)],
        "disallow-load-bpf-via-setsockopt" => vec![Effect::Switch(Switch::SetsockoptBpf)],
        "disallow-access-procfs-root" => vec![Effect::Switch(Switch::PtraceOutside)],
        // Capabilities gained by entering a new user namespace are what the abuse needs.
        "disallow-abuse-user-ns" => vec![Effect::Switch(Switch::UsernsCapability)],
        "disallow-create-user-ns" => vec![Effect::Switch(Switch::UsernsCreate)],
        // vArmor refuses the system call with seccomp; this refuses the file it makes, so
        // /dev/userfaultfd's USERFAULTFD_IOC_NEW is refused too.
        "disallow-userfaultfd-creation" => vec![Effect::Switch(Switch::Userfaultfd)],
        "disable-cap-all" => vec![Effect::Capabilities(ALL_CAPS)],
        "disable-cap-all-except-net-bind-service" => vec![Effect::Capabilities(
            ALL_CAPS & !caps(&["net_bind_service"]),
        )],
        "disable-cap-privileged" => vec![Effect::Capabilities(ALL_CAPS & !caps(&DEFAULT_CAPS))],
        "mitigate-sa-leak" => vec![files(
            &[
                "/run/secrets/kubernetes.io/serviceaccount/",
                "/var/run/secrets/kubernetes.io/serviceaccount/",
            ],
            READ,
        )],
        "mitigate-disk-device-number-leak" => {
            vec![files(&["/proc/partitions", "/proc/**/mountinfo"], READ)]
        }
        "mitigate-overlayfs-leak" => {
            vec![files(&["/proc/**/mounts", "/proc/**/mountinfo"], READ)]
        }
        "mitigate-host-ip-leak" => vec![files(&["/proc/**/net/arp"], READ)],
        "disable-write-etc" => vec![files(&["/etc/"], WRITE)],
        "disable-access-passwd" => vec![files(&["/etc/passwd"], READ | WRITE)],
        "disable-access-shadow" => vec![files(&["/etc/shadow", "/etc/gshadow"], READ | WRITE)],
        "disable-access-ssh-dir" => vec![files(
            &[
                "/root/.ssh/",
                "/**/.ssh",
                "/**/.ssh/authorized_keys",
                "/**/.ssh/known_hosts",
                "/**/.ssh/config",
                "/**/.ssh/id_rsa",
                "/**/.ssh/id_ecdsa",
                "/**/.ssh/id_ed25519",
                "/**/.ssh/id_dsa",
            ],
            READ | WRITE,
        )],
        "disable-shell" => vec![exec(&[
            "sh", "bash", "dash", "ash", "zsh", "ksh", "mksh", "csh", "tcsh", "fish",
        ])],
        "disable-busybox" => vec![exec(&["busybox"])],
        "disable-wget" => vec![exec(&["wget"])],
        "disable-curl" => vec![exec(&["curl"])],
        "disable-chmod" => vec![exec(&["chmod"])],
        "disable-su-sudo" => vec![exec(&["su", "sudo"])],
        "disable-chmod-x-bit" => vec![Effect::Switch(Switch::ChmodExecBits)],
        "disable-chmod-s-bit" => vec![Effect::Switch(Switch::ChmodSetidBits)],
        "disable-network" => vec![sockets(
            &(1..AF_MAX).map(|family| (family, ANY)).collect::<Vec<_>>(),
        )],
        "disable-inet" | "disable-ipv4" => vec![sockets(&[(AF_INET, ANY)])],
        "disable-inet6" | "disable-ipv6" => vec![sockets(&[(AF_INET6, ANY)])],
        "disable-unix-domain-socket" => vec![sockets(&[(AF_UNIX, ANY)])],
        "disable-icmp" => vec![sockets(&[
            (AF_INET, libc::IPPROTO_ICMP as u32),
            (AF_INET6, libc::IPPROTO_ICMPV6 as u32),
        ])],
        "disable-tcp" => vec![sockets(&[
            (AF_INET, libc::IPPROTO_TCP as u32),
            (AF_INET6, libc::IPPROTO_TCP as u32),
        ])],
        "disable-udp" => vec![sockets(&[
            (AF_INET, libc::IPPROTO_UDP as u32),
            (AF_INET6, libc::IPPROTO_UDP as u32),
            (AF_INET, libc::IPPROTO_UDPLITE as u32),
            (AF_INET6, libc::IPPROTO_UDPLITE as u32),
        ])],
        // AWS, GCP, Azure, OpenStack; AWS over IPv6; Volcengine; Alibaba Cloud; Oracle Cloud.
        "block-access-to-metadata-service" | "disallow-metadata-service" => unreachable_builtin(&[
            "169.254.169.254",
            "fd00:ec2::254",
            "100.96.0.96",
            "100.100.100.200",
            "192.0.0.192",
        ]),
        "block-access-to-aws-metadata-service" => {
            unreachable_builtin(&["169.254.169.254", "fd00:ec2::254"])
        }
        "block-access-to-volc-metadata-service" => unreachable_builtin(&["100.96.0.96"]),
        "block-access-to-alibaba-metadata-service" => unreachable_builtin(&["100.100.100.200"]),
        "block-access-to-oci-metadata-service" => unreachable_builtin(&["192.0.0.192"]),
        "block-access-to-kube-apiserver" => {
            if env.kube_apiserver.is_empty() {
                return Some(Err("the API server's address is unknown \
                                 (KUBERNETES_SERVICE_HOST is not set)"
                    .to_owned()));
            }
            match unreachable(&env.kube_apiserver) {
                Ok(effects) => effects,
                Err(reason) => return Some(Err(reason)),
            }
        }
        // The name the runtime bound its socket to, whatever path the target connects through.
        "block-access-to-container-runtime" => vec![files(
            &[
                "/**/containerd.sock",
                "/**/containerd.sock.ttrpc",
                "/**/docker.sock",
                "/**/crio.sock",
                "/**/podman.sock",
                "@/containerd-shim/",
            ],
            palisade_common::PERM_CONNECT,
        )],
        "cgroups-lxcfs-escape-mitigation" => vec![files(
            &[
                "/**/release_agent",
                "/**/devices.allow",
                "/**/cgroup.procs",
                "/**/devices/tasks",
            ],
            WRITE,
        )],
        // The host's runc, however the target reaches it (/proc/self/exe included).
        "runc-override-mitigation" => vec![files(&["/**/runc"], WRITE)],
        "copy-fail-mitigation" => vec![sockets(&[(AF_ALG, ANY)])],
        // CVE-2025-1974: the admission webhook of ingress-nginx, reachable from every pod, runs
        // the configuration a request carries. As vArmor does, its Services' addresses.
        INGRESS_NIGHTMARE_MITIGATION => {
            let result = match &env.ingress_admission {
                None => Err(format!(
                    "the addresses of the ingress-nginx admission webhook (Service {}) are not \
                     known: the agent in Kubernetes mode finds them once it can list those \
                     Services (policy files cannot use this rule)",
                    ingress_admission_services("and")
                )),
                Some(services) if services.services.is_empty() => Err(format!(
                    "neither Service {} exists: without the ingress-nginx admission webhook \
                     there is nothing to block (remove the rule, or install ingress-nginx first)",
                    ingress_admission_services("nor")
                )),
                Some(services) => services_unreachable(services),
            };
            match result {
                Ok(effects) => effects,
                Err(reason) => return Some(Err(reason)),
            }
        }
        // vArmor enforces this one with seccomp only: a system call refused whatever it is for.
        "dirty-pipe-mitigation" => return Some(Err(DIRTY_PIPE_INSTEAD.to_owned())),
        other => {
            let cap = other.strip_prefix("disable-cap-")?;
            vec![Effect::Capabilities(1 << capability(cap)?)]
        }
    };
    Some(Ok(effects))
}

/// The known name closest to `name`, if it is close enough to be a likely misspelling.
pub fn closest(name: &str) -> Option<String> {
    known_names()
        .into_iter()
        .map(|(known, _)| (edit_distance(name, &known), known))
        .filter(|(distance, known)| *distance <= known.len() / 3 + 1)
        .min()
        .map(|(_, known)| known)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let substitution = diagonal + usize::from(ca != *cb);
            diagonal = row[j + 1];
            row[j + 1] = substitution.min(row[j] + 1).min(row[j + 1] + 1);
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An environment that knows every address a rule may need.
    fn kubernetes() -> Environment {
        Environment {
            kube_apiserver: vec!["10.96.0.1".into()],
            ingress_admission: Some(ServiceDestinations {
                services: vec!["ingress-nginx/ingress-nginx-controller-admission".into()],
                cluster_ips: vec!["10.96.0.20".into()],
                endpoints: vec![Endpoints {
                    addresses: vec!["10.244.1.5".into(), "fd00::5".into()],
                    ports: vec![8443],
                }],
            }),
            ..Environment::default()
        }
    }

    #[test]
    fn every_listed_rule_has_effects() {
        let env = kubernetes();
        for (name, _) in known_names() {
            let effects = effects(&name, &env).unwrap_or_else(|| panic!("{name} is unknown"));
            assert!(!effects.unwrap().is_empty(), "{name}");
        }
    }

    #[test]
    fn seccomp_only_rules_are_refused_with_what_to_use_instead() {
        for (name, _) in palisade_crds::rules::SECCOMP_ONLY {
            let Some(Err(reason)) = effects(name, &Environment::default()) else {
                panic!("{name} is not refused")
            };
            assert!(
                reason.contains("seccomp") && reason.contains("Use"),
                "{reason}"
            );
        }
    }

    #[test]
    fn egress_rules_also_refuse_packet_and_raw_ip_sockets() {
        let env = kubernetes();
        for (name, _) in known_names() {
            let Some(Ok(effects)) = effects(&name, &env) else {
                continue;
            };
            if effects
                .iter()
                .any(|effect| matches!(effect, Effect::Network { .. }))
            {
                assert!(effects.contains(&unhooked_sockets()), "{name}");
            }
        }
    }

    #[test]
    fn ingress_admission_cluster_ips_on_every_port_endpoints_on_theirs() {
        let Some(Ok(effects)) = effects("ingress-nightmare-mitigation", &kubernetes()) else {
            panic!()
        };
        let block = |text| AddressBlock::parse(text).unwrap();
        assert_eq!(
            effects,
            [
                Effect::Network {
                    blocks: vec![block("10.96.0.20")],
                    ports: vec![],
                    protocols: vec![],
                },
                Effect::Network {
                    blocks: vec![block("10.244.1.5"), block("fd00::5")],
                    ports: vec![8443],
                    protocols: vec![],
                },
                unhooked_sockets(),
            ]
        );
    }

    #[test]
    fn ingress_admission_without_addresses_blocks_no_address() {
        // A headless Service without pods: an empty list would mean every address.
        let env = Environment {
            ingress_admission: Some(ServiceDestinations {
                services: vec!["kube-system/ingress-nginx-controller-admission".into()],
                cluster_ips: vec![],
                endpoints: vec![Endpoints {
                    addresses: vec![],
                    ports: vec![8443],
                }],
            }),
            ..Environment::default()
        };
        assert_eq!(
            effects("ingress-nightmare-mitigation", &env),
            Some(Ok(vec![unhooked_sockets()]))
        );
    }

    #[test]
    fn ingress_admission_unknown_or_absent_is_an_error() {
        let Some(Err(offline)) = effects("ingress-nightmare-mitigation", &Environment::default())
        else {
            panic!()
        };
        assert!(offline.contains("are not known"), "{offline}");
        let absent = Environment {
            ingress_admission: Some(ServiceDestinations::default()),
            ..Environment::default()
        };
        let Some(Err(absent)) = effects("ingress-nightmare-mitigation", &absent) else {
            panic!()
        };
        assert!(
            absent.starts_with(
                "neither Service ingress-nginx/ingress-nginx-controller-admission nor \
                 kube-system/ingress-nginx-controller-admission exists"
            ),
            "{absent}"
        );
    }

    #[test]
    fn aliases_have_the_effects_of_their_rule() {
        let env = Environment::default();
        for (alias, rule) in [
            ("disallow-load-ebpf", "disallow-load-bpf-prog"),
            ("disable-ipv4", "disable-inet"),
            ("disable-ipv6", "disable-inet6"),
            (
                "disallow-metadata-service",
                "block-access-to-metadata-service",
            ),
        ] {
            assert_eq!(effects(alias, &env), effects(rule, &env), "{alias}");
        }
    }

    #[test]
    fn misspellings_suggest_the_rule() {
        assert_eq!(closest("disalow-mount").as_deref(), Some("disallow-mount"));
        assert_eq!(
            closest("disable-cap-sys_admin").as_deref(),
            Some("disable-cap-sys-admin")
        );
        assert_eq!(
            closest("block-acess-to-metadata-service").as_deref(),
            Some("block-access-to-metadata-service")
        );
        assert_eq!(closest("something-else-entirely"), None);
    }

    #[test]
    fn capability_names_in_every_spelling() {
        assert_eq!(capability("sys_admin"), Some(21));
        assert_eq!(capability("CAP_SYS_ADMIN"), Some(21));
        assert_eq!(capability("sys-admin"), Some(21));
        assert_eq!(capability("checkpoint_restore"), Some(40));
        assert_eq!(capability("sys_admn"), None);
    }

    #[test]
    fn privileged_capabilities_leave_the_runtime_defaults() {
        let Some(Ok(effects)) = effects("disable-cap-privileged", &Environment::default()) else {
            panic!()
        };
        let [Effect::Capabilities(mask)] = effects.as_slice() else {
            panic!()
        };
        assert_eq!(mask.count_ones(), 27);
        assert_eq!(mask & caps(&["net_raw", "chown"]), 0);
        assert_ne!(mask & caps(&["sys_admin", "sys_ptrace", "bpf"]), 0);
    }
}

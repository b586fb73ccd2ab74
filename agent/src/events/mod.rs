//! Audit events from the kernel: read from the ring buffer into a bounded queue, then decoded,
//! named (policy, rule, target) and decided by rule modules on a worker thread, and written to
//! the sinks (JSON lines, Falcosidekick).

mod decide;
mod falco;
mod json;
mod queue;
mod reader;
mod sink;
mod time;
mod worker;

pub use decide::{Deciding, Decoded};
pub use falco::{FalcoSink, FalcoWorker};
pub use queue::EventQueue;
pub use reader::EventReader;
pub use sink::{JsonLines, RotatingFile, Rotation, Sink};
pub use time::Timestamp;
pub use worker::EventWorker;

use std::{
    net::Ipv6Addr,
    sync::{Arc, OnceLock},
    time::{Duration, SystemTime},
};

use palisade_common::{
    Event, HOOK_BPF, HOOK_CAPABLE, HOOK_PATH_CHMOD, HOOK_PTRACE_ACCESS_CHECK, HOOK_SOCKET_CONNECT,
    HOOK_SOCKET_CREATE, HOOK_SOCKET_SENDMSG, HOOK_SOCKET_SETSOCKOPT, HOOK_TASK_KILL,
};
use serde::Serialize;
use time::{Rfc3339, rfc3339_nanos};

use crate::{
    bpf::{Device, InstalledPolicy, PolicyRegistry, action_name, hook_name},
    policy::permission_names,
    targets::{PodIdentity, PodRegistry},
};

/// One audit event as written out (one JSON object per line).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AuditEvent {
    pub time: Timestamp,
    #[serde(flatten)]
    pub naming: Arc<Naming>,
    pub cgroup_id: u64,
    /// The pod (and container) of the process, in Kubernetes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<PodIdentity>,
    /// Process id (thread group id).
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    pub uid: u32,
    pub comm: String,
    pub path: String,
    /// The file's device.
    pub dev: Device,
    pub ino: u64,
    pub permissions: &'static [&'static str],
    /// The errno returned to the caller (1 = EPERM), 0 if the operation was allowed.
    pub errno: i32,
    /// Events of this rule and target the audit rate suppressed since the previous one.
    #[serde(skip_serializing_if = "is_zero")]
    pub suppressed: u32,
    /// Signal and ptrace hooks: the process acted on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub object_pid: Option<u32>,
    /// task_kill: the signal.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signal: Option<u32>,
    /// capable: the capability, e.g. "CAP_SYS_ADMIN".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capability: Option<String>,
    /// Mount hooks: the file system type.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fs_type: Option<String>,
    /// Socket hooks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub socket: Option<SocketInfo>,
    /// A device file: the device it stands for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rdev: Option<Device>,
    /// path_chmod: the mode; bpf: the command; ptrace_access_check: the mode;
    /// socket_setsockopt: level << 16 | option; socket_create: the type.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arg: Option<u32>,
    /// What rule modules added; written after the fields above.
    #[serde(flatten)]
    pub added: Added,
    /// The fields above as one JSON object, written the first time a rule module reads it; then
    /// what `write_json` starts from.
    #[serde(skip)]
    facts: OnceLock<String>,
}

/// What names an event: where it happened, and the policy and rule it is about. The events of a
/// batch with the same policy, rule, hook and target share one, whose JSON is written once.
#[derive(Debug, PartialEq, Eq, Serialize)]
pub struct Naming {
    pub node: Arc<str>,
    pub hook: &'static str,
    pub action: &'static str,
    pub policy: Option<Arc<str>>,
    pub rule: Option<Arc<str>>,
    pub rule_id: u32,
    pub target: EventTarget,
    /// The fields above as the members of a JSON object (no braces), written when it is made.
    #[serde(skip)]
    json: String,
}

impl Naming {
    pub fn new(
        node: Arc<str>,
        hook: &'static str,
        action: &'static str,
        policy: Option<Arc<str>>,
        rule: Option<Arc<str>>,
        rule_id: u32,
        target: EventTarget,
    ) -> Self {
        let mut naming = Self {
            node,
            hook,
            action,
            policy,
            rule,
            rule_id,
            target,
            json: String::new(),
        };
        naming.json = naming.members_json();
        naming
    }
}

/// What rule modules add to an event.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Added {
    /// The highest severity they gave.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub severity: Option<&'static str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
    /// By key, each key once: written as one JSON object.
    #[serde(skip_serializing_if = "Vec::is_empty", serialize_with = "as_map")]
    pub annotations: Vec<(String, String)>,
    /// A rule module had the process killed.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub killed: bool,
}

impl AuditEvent {
    /// The event as the kernel reported it and the decoder named it, as JSON.
    pub fn facts_json(&self) -> &str {
        self.facts.get_or_init(|| {
            let mut facts = Vec::with_capacity(512);
            self.write_facts(&mut facts);
            String::from_utf8(facts).expect("JSON of strings is UTF-8")
        })
    }
}

/// A rule module that failed to decide a batch of events (reported at most once a minute per
/// module and kind of failure), written next to the audit events.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ModuleFailure {
    /// Always "rule_module_failure": what tells these lines from audit events.
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub time: Timestamp,
    pub node: String,
    pub module: String,
    /// timeout, memory, stack_overflow, trap, malformed or missing.
    pub failure: &'static str,
    pub message: String,
    /// Events of the batch, which `on_failure` applied to.
    pub events: usize,
    pub on_failure: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SocketInfo {
    pub family: u32,
    pub protocol: u32,
    /// socket_connect and socket_sendmsg: the destination (IPv4 addresses in IPv4 form).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<u32>,
}

fn as_map<S: serde::Serializer>(
    pairs: &[(String, String)],
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.collect_map(pairs.iter().map(|(key, value)| (key, value)))
}

fn is_zero(count: &u32) -> bool {
    *count == 0
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EventTarget {
    pub cgroup_id: u64,
    pub cgroup_path: Option<Arc<str>>,
}

/// What an event's `Naming` is made of: (policy id, rule id, hook, action, target cgroup).
type NamingKey = (u32, u32, u32, u32, u64);

/// What the events of a batch mostly share, looked up once: their policy, their pod, their
/// second. A policy or pod changed during the batch is seen from the next one, as if the batch
/// had been decoded at once.
#[derive(Default)]
struct Recent {
    policy: Option<(u32, Option<Arc<InstalledPolicy>>)>,
    naming: Option<(NamingKey, Arc<Naming>)>,
    /// By (cgroup, target cgroup).
    pod: Option<((u64, u64), Option<PodIdentity>)>,
    time: Rfc3339,
}

/// Turns kernel events into `AuditEvent`s.
#[derive(Debug, Clone)]
pub struct Decoder {
    node: Arc<str>,
    registry: PolicyRegistry,
    pods: PodRegistry,
    /// Wall-clock time at boot, to convert bpf_ktime_get_boot_ns.
    boot_time: SystemTime,
}

fn c_string(bytes: &[u8]) -> String {
    let end = bytes
        .iter()
        .position(|&byte| byte == 0)
        .unwrap_or(bytes.len());
    // Checking for UTF-8 first is the fast way for the usual text.
    match std::str::from_utf8(&bytes[..end]) {
        Ok(text) => text.to_owned(),
        Err(_) => String::from_utf8_lossy(&bytes[..end]).into_owned(),
    }
}

impl Decoder {
    /// Names policies and rules from `registry`, and Kubernetes pods from `pods`.
    pub fn new(registry: PolicyRegistry, pods: PodRegistry) -> Self {
        let node = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|name| name.trim().into())
            .unwrap_or_else(|_| "".into());
        let boot_time = SystemTime::UNIX_EPOCH + crate::clock(libc::CLOCK_REALTIME)
            - crate::clock(libc::CLOCK_BOOTTIME);
        Self {
            node,
            registry,
            pods,
            boot_time,
        }
    }

    /// The event of one ring buffer record, copied out; `None` if it is not an event of this
    /// version.
    pub fn read(bytes: &[u8]) -> Option<Event> {
        if bytes.len() < size_of::<Event>() {
            return None;
        }
        // SAFETY: Event is a plain C struct valid for any bit pattern; the length was checked.
        Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) })
    }

    /// Names the policy, rule and target of each of `events`, in order, into `decoded`.
    pub fn decode(&self, events: &[Event], decoded: &mut Vec<Decoded>) {
        let mut recent = Recent::default();
        decoded.extend(
            events
                .iter()
                .map(|event| self.decode_one(event, &mut recent)),
        );
    }

    fn naming(&self, event: &Event, installed: Option<&InstalledPolicy>) -> Naming {
        Naming::new(
            self.node.clone(),
            hook_name(event.hook),
            action_name(event.action),
            installed.map(|installed| installed.name().clone()),
            installed.and_then(|installed| installed.rule_name(event.rule_id).cloned()),
            event.rule_id,
            EventTarget {
                cgroup_id: event.target_cgroup_id,
                cgroup_path: installed.map(|installed| installed.target_path().clone()),
            },
        )
    }

    fn decode_one(&self, event: &Event, recent: &mut Recent) -> Decoded {
        let installed = match &recent.policy {
            Some((id, installed)) if *id == event.policy_id => installed.clone(),
            _ => {
                let installed = self.registry.get(event.policy_id);
                recent.policy = Some((event.policy_id, installed.clone()));
                installed
            }
        };
        let cgroups = (event.cgroup_id, event.target_cgroup_id);
        let kubernetes = match &recent.pod {
            Some((known, pod)) if *known == cgroups => pod.clone(),
            _ => {
                let pod = self
                    .pods
                    .get(event.cgroup_id)
                    .or_else(|| self.pods.get(event.target_cgroup_id));
                recent.pod = Some((cgroups, pod.clone()));
                pod
            }
        };
        let named: NamingKey = (
            event.policy_id,
            event.rule_id,
            event.hook,
            event.action,
            event.target_cgroup_id,
        );
        let naming = match &recent.naming {
            Some((known, naming)) if *known == named => naming.clone(),
            _ => {
                let naming = Arc::new(self.naming(event, installed.as_deref()));
                recent.naming = Some((named, naming.clone()));
                naming
            }
        };
        let hook = event.hook;
        let event = AuditEvent {
            time: recent
                .time
                .format(self.boot_time + Duration::from_nanos(event.time_ns)),
            naming,
            cgroup_id: event.cgroup_id,
            kubernetes,
            pid: event.pid,
            tid: event.tid,
            uid: event.uid,
            comm: c_string(&event.comm),
            path: c_string(&event.path),
            dev: Device(event.dev),
            ino: event.ino,
            permissions: permission_names(event.perms),
            // Saturating: a record from a newer or damaged kernel side must not panic the decoder.
            errno: event.error.saturating_neg(),
            suppressed: event.suppressed,
            object_pid: (event.object_pid != 0).then_some(event.object_pid),
            signal: (hook == HOOK_TASK_KILL).then_some(event.arg),
            capability: (hook == HOOK_CAPABLE).then(|| {
                crate::policy::CAPABILITIES
                    .get(event.arg as usize)
                    .map_or_else(
                        || event.arg.to_string(),
                        |name| format!("CAP_{}", name.to_ascii_uppercase()),
                    )
            }),
            fs_type: (event.fs_type[0] != 0).then(|| c_string(&event.fs_type)),
            socket: (event.family != 0).then(|| {
                let destination = matches!(hook, HOOK_SOCKET_CONNECT | HOOK_SOCKET_SENDMSG);
                let address = Ipv6Addr::from(event.addr);
                SocketInfo {
                    family: event.family,
                    protocol: event.protocol,
                    address: destination.then(|| match address.to_ipv4_mapped() {
                        Some(v4) => v4.to_string(),
                        None => address.to_string(),
                    }),
                    port: destination.then_some(event.port),
                }
            }),
            rdev: (event.rdev != 0).then_some(Device(event.rdev)),
            arg: matches!(
                hook,
                HOOK_PATH_CHMOD
                    | HOOK_BPF
                    | HOOK_PTRACE_ACCESS_CHECK
                    | HOOK_SOCKET_SETSOCKOPT
                    | HOOK_SOCKET_CREATE
            )
            .then_some(event.arg),
            added: Added::default(),
            facts: OnceLock::new(),
        };
        Decoded {
            event,
            policy: installed,
            keep: true,
        }
    }
}

#[cfg(test)]
mod tests {
    use palisade_common::{HOOK_FILE_OPEN, PERM_READ, PERM_WRITE};

    use super::*;

    fn written(event: &AuditEvent) -> String {
        let mut out = Vec::new();
        event.write_json(&mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn each_event_of_a_batch_is_named_by_its_own_policy_pod_and_time() {
        let installed = |name: &str, id| {
            let file = std::path::Path::new("p.yaml");
            let text = format!(
                "apiVersion: palisade.dev/v1alpha1\nkind: PalisadePolicy\nmetadata:\n  name: {name}\n\
                 spec:\n  mode: AlwaysAllow\n"
            );
            let policy = crate::policy::Policy::parse(file, &text).unwrap();
            let compiled =
                crate::policy::compile(&file.display(), &policy, &Default::default(), &[]).unwrap();
            let target = crate::targets::Cgroup {
                path: format!("/sys/fs/cgroup/{name}").into(),
                id,
                level: 1,
            };
            Arc::new(InstalledPolicy::new(Arc::new(compiled), target))
        };
        let registry = PolicyRegistry::default();
        registry.insert(1, installed("app", 10));
        registry.insert(2, installed("web", 11));
        let pods = PodRegistry::default();
        let pod = PodIdentity {
            namespace: "default".to_owned(),
            pod: "app-0".to_owned(),
            container: None,
        };
        pods.replace([(10, pod.clone())].into());
        let decoder = Decoder::new(registry, pods);
        let event = |policy_id, cgroup_id, time_ns| Event {
            hook: HOOK_FILE_OPEN,
            policy_id,
            cgroup_id,
            target_cgroup_id: cgroup_id,
            time_ns,
            ..Event::default()
        };
        let batch = [
            event(1, 10, 5_000_000_000),
            event(1, 10, 5_000_000_001),
            event(2, 11, 5_999_999_999),
            event(1, 10, 6_000_000_000),
            event(9, 12, 7_000_000_000),
        ];
        let mut decoded = Vec::new();
        decoder.decode(&batch, &mut decoded);
        let named: Vec<_> = decoded
            .iter()
            .map(|decoded| {
                let event = &decoded.event;
                (
                    event.naming.policy.as_deref(),
                    event.kubernetes.as_ref(),
                    event.time,
                )
            })
            .collect();
        let time = |nanos| rfc3339_nanos(decoder.boot_time + Duration::from_nanos(nanos));
        assert_eq!(
            named,
            [
                (Some("app"), Some(&pod), time(5_000_000_000)),
                (Some("app"), Some(&pod), time(5_000_000_001)),
                (Some("web"), None, time(5_999_999_999)),
                (Some("app"), Some(&pod), time(6_000_000_000)),
                (None, None, time(7_000_000_000)),
            ]
        );
    }

    /// The event without what modules added.
    fn plain_facts(event: &AuditEvent) -> AuditEvent {
        AuditEvent {
            added: Added::default(),
            ..event.clone()
        }
    }

    #[test]
    fn an_event_is_written_as_serde_writes_it_before_and_after_modules_add_to_it() {
        let decoder = Decoder::new(PolicyRegistry::default(), PodRegistry::default());
        let mut kernel = Event {
            hook: HOOK_FILE_OPEN,
            perms: PERM_READ | PERM_WRITE,
            pid: 7,
            ..Event::default()
        };
        let path = "/etc/\"odd\"\n\\\t\u{1}\u{7f}é\u{8}\u{c}\r".as_bytes();
        kernel.path[..path.len()].copy_from_slice(path);
        let mut decoded = Vec::new();
        decoder.decode(&[kernel], &mut decoded);
        let plain = decoded.remove(0).event;
        assert_eq!(plain.permissions, ["read", "write"]);
        assert_eq!(written(&plain), serde_json::to_string(&plain).unwrap());
        assert_eq!(plain.facts_json(), serde_json::to_string(&plain).unwrap());

        // Every optional field, and what modules add.
        let mut event = AuditEvent {
            naming: Arc::new(Naming::new(
                "node\t1".into(),
                "file_open",
                "deny",
                Some("app".into()),
                Some("no-\"x\"".into()),
                7,
                EventTarget {
                    cgroup_id: 9,
                    cgroup_path: Some("/sys/fs/cgroup/app".into()),
                },
            )),
            kubernetes: Some(PodIdentity {
                namespace: "default".to_owned(),
                pod: "web-0".to_owned(),
                container: Some("nginx".to_owned()),
            }),
            suppressed: 3,
            object_pid: Some(1),
            signal: Some(9),
            capability: Some("CAP_SYS_ADMIN".to_owned()),
            fs_type: Some("proc".to_owned()),
            socket: Some(SocketInfo {
                family: 2,
                protocol: 6,
                address: Some("10.0.0.1".to_owned()),
                port: Some(443),
            }),
            rdev: Some(Device(1 << 20 | 3)),
            arg: Some(u32::MAX),
            errno: -1,
            facts: OnceLock::new(),
            ..plain
        };
        assert_eq!(written(&event), serde_json::to_string(&event).unwrap());
        event.added = Added {
            severity: Some("high"),
            tags: vec!["protected-file".to_owned(), "t\"2".to_owned()],
            annotations: [
                ("attempt".to_owned(), "cat \"x\"".to_owned()),
                ("k\ney".to_owned(), String::new()),
            ]
            .into(),
            killed: true,
        };
        assert_eq!(written(&event), serde_json::to_string(&event).unwrap());
        // The same once a module has read the facts, which are then spliced in.
        assert_eq!(
            event.facts_json(),
            serde_json::to_string(&plain_facts(&event)).unwrap()
        );
        assert_eq!(written(&event), serde_json::to_string(&event).unwrap());
        let value: serde_json::Value = serde_json::from_str(&written(&event)).unwrap();
        assert_eq!(value["path"], String::from_utf8(path.to_vec()).unwrap());
        assert_eq!(value["severity"], "high");
        assert_eq!(value["killed"], true);
    }
}

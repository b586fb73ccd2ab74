//! `palisade model to-policy`: the DefenseInDepth policy that allows what a model saw, and its
//! YAML with a comment on every entry a reviewer should look at twice (collapsed directories,
//! what the allowlist cannot say, a model that missed operations or was cut short).

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Write as _,
};

use palisade_crds::{
    API_VERSION, AllowRules, DefenseInDepth, FileAllow, Mode, NetworkAllow, Permission, PolicySpec,
    PortRange, Protocol, SocketAllow,
};
use serde::Serialize;

use super::model::{BehaviorModel, FileUse, family_name, socket_type_name};
use crate::policy::{KIND, Metadata, Policy, ip_protocol};

/// The policy, and the comments its YAML carries.
pub struct Allowlist {
    pub policy: Policy,
    /// Said before the policy.
    header: Vec<String>,
    /// Said before the entry of a path (in `files`, `exec` or `unixSockets`).
    about_path: BTreeMap<String, String>,
    /// Seen, but not what an allowlist can say: said at the end.
    left_out: Vec<String>,
}

/// The protocol network rules name IP protocol `number` by (ICMPv6 is ICMP to them).
fn protocol(number: u32) -> Option<Protocol> {
    let number = if number == libc::IPPROTO_ICMPV6 as u32 {
        libc::IPPROTO_ICMP as u32
    } else {
        number
    };
    [Protocol::Tcp, Protocol::Udp, Protocol::Icmp]
        .into_iter()
        .find(|protocol| u32::from(ip_protocol(*protocol)) == number)
}

fn permission(name: &str) -> Option<Permission> {
    match name {
        "read" => Some(Permission::Read),
        "write" => Some(Permission::Write),
        "append" => Some(Permission::Append),
        "exec" => Some(Permission::Exec),
        _ => None,
    }
}

fn times(count: u64) -> String {
    if count == 1 {
        "once".to_owned()
    } else {
        format!("{count} times")
    }
}

impl Allowlist {
    /// The policy allowing what `model` saw, for the target its modeling policy chose and with
    /// its rule modules; a trial (`allowViolations`) until the user says otherwise.
    pub fn of(model: &BehaviorModel) -> Self {
        let mut list = Self {
            policy: Policy {
                api_version: API_VERSION.to_owned(),
                kind: KIND.to_owned(),
                metadata: Metadata {
                    name: model.policy.clone(),
                },
                spec: PolicySpec {
                    target: model.spec.target.clone(),
                    mode: Mode::DefenseInDepth,
                    defense_in_depth: None,
                    rule_modules: model.spec.rule_modules.clone(),
                    ..PolicySpec::default()
                },
            },
            header: Vec::new(),
            about_path: BTreeMap::new(),
            left_out: Vec::new(),
        };
        list.header = vec![
            format!(
                "What policy \"{}\" saw its target ({}) do from {} to {}, as an allowlist.",
                model.policy, model.target, model.started, model.ended
            ),
            "Review it: the files, programs, capabilities, peers, sockets and mounts it does not"
                .to_owned(),
            "allow are denied.".to_owned(),
            "allowViolations: a trial, where nothing is denied and each operation it would deny"
                .to_owned(),
            "is reported once; set it to false to enforce.".to_owned(),
        ];
        if !model.complete {
            list.header.push(format!(
                "INCOMPLETE: the modeling was cut short of its {} s (the policy changed or was \
                 removed, or the agent stopped).",
                model.duration_seconds
            ));
        }
        if model.lost > 0 {
            list.header.push(format!(
                "MISSING {} operations the kernel could not record (its record map was full: \
                 --max-model-records): the workload does more than this allows.",
                model.lost
            ));
        }
        for step in &model.transformed {
            list.header.push(format!(
                "Rewritten by the model transform {} (sha256 {}) with config {}.",
                step.module, step.sha256, step.config
            ));
        }
        let allow = AllowRules {
            files: list.files(&model.files),
            exec: model
                .executables
                .iter()
                .map(|run| run.what.path.clone())
                .collect(),
            capabilities: model
                .capabilities
                .iter()
                .map(|used| used.what.name.clone())
                .collect(),
            network: list.network(model),
            mount: model
                .mounts
                .iter()
                .map(|mount| mount.what.fs_type.clone())
                .filter(|fs_type| !fs_type.is_empty())
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect(),
            sockets: sockets(model),
            unix_sockets: list.unix_sockets(&model.files),
        };
        for operation in &model.operations {
            list.left_out.push(format!(
                "{} (argument {}) {}",
                operation.what.hook,
                operation.what.arg,
                times(operation.count)
            ));
        }
        list.policy.spec.defense_in_depth = Some(DefenseInDepth {
            allow_violations: true,
            allow,
        });
        list
    }

    /// One entry per set of permissions, its paths in order.
    fn files(&mut self, files: &[FileUse]) -> Vec<FileAllow> {
        let mut by_permissions: BTreeMap<Vec<Permission>, BTreeSet<String>> = BTreeMap::new();
        for file in files {
            let permissions: Vec<Permission> = file
                .permissions
                .iter()
                .filter_map(|name| permission(name))
                .collect();
            if permissions.is_empty() {
                continue;
            }
            if file.path.is_empty() {
                self.left_out.push(format!(
                    "{} {} of a file no path names (cut off from its mount), by {}",
                    file.permissions.join(","),
                    times(file.count),
                    file.hooks.join(", ")
                ));
                continue;
            }
            if !file.path.starts_with('/') {
                self.left_out.push(format!(
                    "{} {} of {}, a file of no directory (a pipe, a socket...): allowed without \
                     a rule",
                    file.permissions.join(","),
                    times(file.count),
                    file.path
                ));
                continue;
            }
            let path = match process_file(&file.path) {
                ProcessFile::Any(path) => {
                    let about = "any process's: a process's own files in /proc are named by its \
                                 PID, which differs from run to run";
                    self.about_path.insert(path.clone(), about.to_owned());
                    path
                }
                ProcessFile::Unnamed => {
                    self.left_out.push(format!(
                        "{} {} of {}, a process's own files in /proc: no path with one `**` names \
                         them for every PID (allow /proc/ by hand if the workload needs them)",
                        file.permissions.join(","),
                        times(file.count),
                        file.path
                    ));
                    continue;
                }
                ProcessFile::Not => {
                    self.describe(file);
                    file.path.clone()
                }
            };
            by_permissions.entry(permissions).or_default().insert(path);
        }
        by_permissions
            .into_iter()
            .map(|(permissions, paths)| FileAllow {
                paths: paths.into_iter().collect(),
                permissions,
            })
            .collect()
    }

    /// The comment on `file`'s path, when it stands for more than one file.
    fn describe(&mut self, file: &FileUse) {
        let about = if let Some(collapsed) = &file.collapsed {
            format!(
                "{} distinct files, used {}, collapsed ({}); allows everything below {}",
                collapsed.files,
                times(file.count),
                collapsed.rule,
                file.path
            )
        } else if let Some(prefix) = file.path.strip_suffix("**") {
            format!(
                "a path longer than the kernel records: allows every path starting with {prefix}"
            )
        } else {
            return;
        };
        self.about_path.insert(file.path.clone(), about);
    }

    /// Peers by address and protocol, with their ports.
    fn network(&mut self, model: &BehaviorModel) -> Vec<NetworkAllow> {
        let mut peers: BTreeMap<(String, u32), BTreeSet<u32>> = BTreeMap::new();
        for peer in &model.peers {
            let peer = &peer.what;
            if protocol(peer.protocol).is_none() {
                self.left_out.push(format!(
                    "{} to {} over IP protocol {} (network rules name tcp, udp and icmp)",
                    peer.hook, peer.address, peer.protocol
                ));
                continue;
            }
            let ports = peers
                .entry((peer.address.clone(), peer.protocol))
                .or_default();
            if peer.port != 0 {
                ports.insert(peer.port);
            }
        }
        peers
            .into_iter()
            .map(|((address, number), ports)| NetworkAllow {
                addresses: vec![address],
                ports: ports
                    .into_iter()
                    .map(|port| PortRange::Port(port as u16))
                    .collect(),
                protocols: protocol(number).into_iter().collect(),
            })
            .collect()
    }

    fn unix_sockets(&mut self, files: &[FileUse]) -> Vec<String> {
        let connected = files.iter().filter(|file| {
            !file.path.is_empty() && file.permissions.iter().any(|name| name == "connect")
        });
        let mut paths = BTreeSet::new();
        for file in connected {
            self.describe(file);
            paths.insert(file.path.clone());
        }
        paths.into_iter().collect()
    }

    /// The policy as YAML, with its comments.
    pub fn to_yaml(&self) -> String {
        let mut yaml = String::new();
        for line in &self.header {
            let _ = writeln!(yaml, "# {line}");
        }
        let policy = &self.policy;
        let _ = writeln!(
            yaml,
            "apiVersion: {}\nkind: {}\nmetadata:\n  name: {}\nspec:",
            policy.api_version,
            policy.kind,
            scalar(&policy.metadata.name)
        );
        if let Some(target) = &policy.spec.target {
            yaml.push_str("  target:\n");
            yaml.push_str(&indented(&to_yaml(target), 4));
        }
        let defense = policy.spec.defense_in_depth.as_ref().expect("made by `of`");
        let allow = &defense.allow;
        let _ = writeln!(
            yaml,
            "  mode: DefenseInDepth\n  defenseInDepth:\n    allowViolations: {}\n    allow:",
            defense.allow_violations
        );
        open_list(&mut yaml, "files", allow.files.is_empty());
        for rule in &allow.files {
            let _ = writeln!(
                yaml,
                "        - permissions: [{}]\n          paths:",
                flow(&rule.permissions)
            );
            self.paths(&mut yaml, &rule.paths, 12);
        }
        open_list(&mut yaml, "exec", allow.exec.is_empty());
        self.paths(&mut yaml, &allow.exec, 8);
        let _ = writeln!(yaml, "      capabilities: [{}]", flow(&allow.capabilities));
        open_list(&mut yaml, "network", allow.network.is_empty());
        for peer in &allow.network {
            list_item(&mut yaml, peer, 8);
        }
        let _ = writeln!(yaml, "      mount: [{}]", flow(&allow.mount));
        open_list(&mut yaml, "sockets", allow.sockets.is_empty());
        for socket in &allow.sockets {
            list_item(&mut yaml, socket, 8);
        }
        open_list(&mut yaml, "unixSockets", allow.unix_sockets.is_empty());
        self.paths(&mut yaml, &allow.unix_sockets, 8);
        if !policy.spec.rule_modules.is_empty() {
            yaml.push_str("  ruleModules:\n");
            yaml.push_str(&indented(&to_yaml(&policy.spec.rule_modules), 4));
        }
        if !self.left_out.is_empty() {
            yaml.push_str(
                "# Also seen, and not something an allowlist says (the policy's other rules \
                 govern it):\n",
            );
            for seen in &self.left_out {
                let _ = writeln!(yaml, "#   {seen}");
            }
        }
        yaml
    }

    /// `paths` as a list at `indent`, each after its comment.
    fn paths(&self, yaml: &mut String, paths: &[String], indent: usize) {
        let pad = " ".repeat(indent);
        for path in paths {
            if let Some(about) = self.about_path.get(path) {
                let _ = writeln!(yaml, "{pad}# {about}");
            }
            let _ = writeln!(yaml, "{pad}- {}", scalar(path));
        }
    }
}

/// A path of a process's own files in /proc: what a process reads of itself (through
/// /proc/self/ and /proc/thread-self/) is recorded under its PID and TID.
#[derive(Debug, PartialEq, Eq)]
enum ProcessFile {
    /// Not one.
    Not,
    /// `/proc/PID/REST` (or `/proc/PID/task/TID/REST`) for any process: `/proc/**/REST`.
    Any(String),
    /// One no pattern names for every PID: the process's (or thread's) directory itself, a
    /// directory's files (a collapsed `/proc/PID/fdinfo/`) or a path cut short (`...**`) would
    /// need a second `**`.
    Unnamed,
}

fn process_file(path: &str) -> ProcessFile {
    let is_id = |id: &str| !id.is_empty() && id.bytes().all(|byte| byte.is_ascii_digit());
    let Some(own) = path.strip_prefix("/proc/") else {
        return ProcessFile::Not;
    };
    let (pid, rest) = own.split_once('/').unwrap_or((own, ""));
    if !is_id(pid) {
        return ProcessFile::Not;
    }
    let rest = match rest.strip_prefix("task/") {
        Some(task) => match task.split_once('/').unwrap_or((task, "")) {
            (tid, rest) if is_id(tid) => rest,
            _ => rest,
        },
        None => rest,
    };
    // The process's or thread's directory itself is its PID's or TID's alone.
    if rest.is_empty() || rest.ends_with('/') || rest.contains("**") {
        return ProcessFile::Unnamed;
    }
    ProcessFile::Any(format!("/proc/**/{rest}"))
}

/// Sockets by family, with their types.
fn sockets(model: &BehaviorModel) -> Vec<SocketAllow> {
    let mut families: BTreeMap<u32, BTreeSet<u32>> = BTreeMap::new();
    for socket in &model.sockets {
        families
            .entry(socket.what.family)
            .or_default()
            .insert(socket.what.kind);
    }
    families
        .into_iter()
        .map(|(family, kinds)| SocketAllow {
            family: family_name(family),
            types: kinds.into_iter().map(socket_type_name).collect(),
        })
        .collect()
}

fn to_yaml(value: &impl Serialize) -> String {
    serde_yaml::to_string(value).expect("policy types serialize")
}

/// A string as a YAML scalar: plain where it reads back as itself, quoted otherwise.
fn scalar(text: &str) -> String {
    to_yaml(&text).trim_end().to_owned()
}

/// `items` as the inside of a flow sequence ("read, write").
fn flow<T: Serialize>(items: &[T]) -> String {
    let items: Vec<String> = items
        .iter()
        .map(|item| to_yaml(item).trim_end().to_owned())
        .collect();
    items.join(", ")
}

/// Starts the list `key` of `allow` (`key: []` when it stays empty).
fn open_list(yaml: &mut String, key: &str, empty: bool) {
    let _ = writeln!(yaml, "      {key}:{}", if empty { " []" } else { "" });
}

/// `value` as an item of a block list at `indent`.
fn list_item(yaml: &mut String, value: &impl Serialize, indent: usize) {
    let pad = " ".repeat(indent);
    for (index, line) in to_yaml(value).lines().enumerate() {
        let lead = if index == 0 { "- " } else { "  " };
        let _ = writeln!(yaml, "{pad}{lead}{line}");
    }
}

fn indented(text: &str, indent: usize) -> String {
    let pad = " ".repeat(indent);
    text.lines().map(|line| format!("{pad}{line}\n")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example model: a small scripted workload, with one of everything a reviewer must
    /// see.
    fn scripted_model() -> BehaviorModel {
        serde_yaml::from_str(include_str!("../../../examples/models/web.yaml")).unwrap()
    }

    #[test]
    fn a_process_s_own_files_in_proc_are_named_for_any_process() {
        let any = |path: &str| ProcessFile::Any(path.to_owned());
        for (path, expected) in [
            ("/proc/4242/maps", any("/proc/**/maps")),
            ("/proc/4242/fd", any("/proc/**/fd")),
            ("/proc/4242/task/4243/stat", any("/proc/**/stat")),
            ("/proc/4242/task/4243", ProcessFile::Unnamed),
            ("/proc/4242", ProcessFile::Unnamed),
            ("/proc/4242/", ProcessFile::Unnamed),
            ("/proc/4242/task/", ProcessFile::Unnamed),
            ("/proc/4242/fdinfo/", ProcessFile::Unnamed),
            ("/proc/4242/task/4243/fdinfo/", ProcessFile::Unnamed),
            ("/proc/4242/attr/a-very-long-name**", ProcessFile::Unnamed),
            ("/proc/cpuinfo", ProcessFile::Not),
            ("/proc/sys/kernel/hostname", ProcessFile::Not),
            ("/srv/4242/maps", ProcessFile::Not),
        ] {
            assert_eq!(process_file(path), expected, "{path}");
        }
    }

    #[test]
    fn the_allowlist_allows_what_the_model_saw() {
        let list = Allowlist::of(&scripted_model());
        let spec = &list.policy.spec;
        assert_eq!(spec.mode, Mode::DefenseInDepth);
        assert_eq!(spec.behavior_modeling, None);
        assert_eq!(
            spec.target.as_ref().unwrap().cgroup_path.as_deref(),
            Some("/web")
        );
        let defense = spec.defense_in_depth.as_ref().unwrap();
        assert!(defense.allow_violations, "a trial first");
        let allow = &defense.allow;
        assert_eq!(
            allow.files,
            [
                FileAllow {
                    paths: vec!["/data/".into(), "/etc/hosts".into(), "/proc/**/maps".into()],
                    permissions: vec![Permission::Read],
                },
                FileAllow {
                    paths: vec!["/tmp/out".into()],
                    permissions: vec![Permission::Write, Permission::Append],
                },
                FileAllow {
                    paths: vec!["/lib/x86_64-linux-gnu/libc.so.6".into()],
                    permissions: vec![Permission::Exec],
                },
            ]
        );
        assert_eq!(allow.exec, ["/bin/busybox", "/usr/bin/env"]);
        assert_eq!(allow.capabilities, ["net_bind_service"]);
        assert_eq!(
            allow.network,
            [
                NetworkAllow {
                    addresses: vec!["127.0.0.1".into()],
                    ports: vec![PortRange::Port(8080)],
                    protocols: vec![Protocol::Tcp],
                },
                NetworkAllow {
                    addresses: vec!["::1".into()],
                    ports: vec![PortRange::Port(53)],
                    protocols: vec![Protocol::Udp],
                },
            ]
        );
        assert_eq!(allow.mount, ["tmpfs"]);
        assert_eq!(
            allow.sockets,
            [
                SocketAllow {
                    family: "unix".into(),
                    types: vec!["stream".into()],
                },
                SocketAllow {
                    family: "inet".into(),
                    types: vec!["stream".into()],
                },
            ]
        );
        assert_eq!(allow.unix_sockets, ["/run/app.sock"]);
    }

    #[test]
    fn a_pipe_is_said_and_left_out() {
        let mut model = scripted_model();
        model.files.push(FileUse {
            path: "pipe:[77]".to_owned(),
            permissions: vec!["write".to_owned()],
            hooks: vec!["file_open".to_owned()],
            count: 2,
            collapsed: None,
        });
        let list = Allowlist::of(&model);
        let allow = &list.policy.spec.defense_in_depth.as_ref().unwrap().allow;
        assert!(
            allow
                .files
                .iter()
                .all(|rule| !rule.paths.contains(&"pipe:[77]".to_owned())),
            "{allow:#?}"
        );
        assert!(
            list.to_yaml()
                .contains("write 2 times of pipe:[77], a file of no directory"),
            "{}",
            list.to_yaml()
        );
    }

    #[test]
    fn its_yaml_reads_back_as_the_policy_with_every_collapse_explained() {
        let mut model = scripted_model();
        model.complete = false;
        model.lost = 12;
        let list = Allowlist::of(&model);
        let yaml = list.to_yaml();
        let read = Policy::parse(std::path::Path::new("web.yaml"), &yaml)
            .unwrap_or_else(|err| panic!("{err}\n{yaml}"));
        assert_eq!(read, list.policy, "{yaml}");
        let before_data = yaml
            .lines()
            .take_while(|line| !line.ends_with("- /data/"))
            .last()
            .unwrap();
        assert!(
            before_data.contains("10000 distinct files")
                && before_data.contains("more than 32 files of /data/"),
            "{yaml}"
        );
        for said in [
            "# INCOMPLETE",
            "# MISSING 12 operations",
            "#   userns_create (argument 0) once",
            "of a file no path names",
            "allowViolations: true",
        ] {
            assert!(yaml.contains(said), "{said}:\n{yaml}");
        }
    }
}

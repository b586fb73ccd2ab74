//! Write Palisade rule modules in Rust.
//!
//! A rule module does two jobs, described by the WIT world in `wit/rule.wit` (its package
//! version is the ABI version):
//! - `compile`: turn its configuration (the `config` of a policy's `ruleModules` entry) into
//!   kernel rules, which the agent checks and enforces like rules written in the policy;
//! - `decide`: say what happens to each audit event of the policy: keep or drop it, give it a
//!   severity, tags and annotations, or kill the process that caused it.
//!
//! The agent keeps an instance for the `decide` calls of one configuration, so a module may keep
//! state between batches (a cache), but must not count on it: an instance is replaced after any
//! failure or a minute unused, and `compile` runs in a fresh one.
//!
//! A model transform, the package's other world, rewrites a behaviour model before it becomes a
//! policy: implement [`Transform`] and export it with [`model_transform!`] (the model's types
//! are in [`model`]).
//!
//! Implement [`Rule`] and export it with [`rule!`]; build with `palisade rules build DIR`, which
//! compiles for `wasm32-unknown-unknown` and wraps the module as a component. The same code runs
//! natively in `cargo test`, where [`fixture_test!`] checks it against JSON fixtures
//! without a Wasm runtime.
//!
//! ```ignore
//! use palisade_rule_sdk::{Action, Context, Entry, Event, Permission, Rule, Severity, Verdict};
//!
//! struct NoSecrets;
//!
//! #[derive(serde::Deserialize)]
//! struct Config { directories: Vec<String> }
//!
//! impl Rule for NoSecrets {
//!     type Config = Config;
//!     fn compile(config: Config, _: &Context) -> Result<Vec<Entry>, String> {
//!         Ok(config.directories.iter().map(|dir| {
//!             Entry::files(dir, vec![format!("{dir}/**")], &[Permission::Read], Action::Deny)
//!         }).collect())
//!     }
//!     fn decide(_: &Config, event: &Event) -> Verdict {
//!         Verdict::keep().severity(Severity::High)
//!     }
//! }
//!
//! palisade_rule_sdk::rule!(NoSecrets);
//! ```

use std::borrow::Cow;

#[cfg(any(test, all(target_arch = "wasm32", not(target_feature = "atomics"))))]
#[doc(hidden)]
pub mod allocator;
pub mod model;
pub mod testing;
mod transform;
#[doc(hidden)]
pub mod wire;

/// The bindings wit-bindgen generates from the WIT world (`rule!` refers to them).
#[doc(hidden)]
#[allow(clippy::too_many_arguments)] // generated glue
pub mod bindings {
    wit_bindgen::generate!({
        world: "rule",
        path: "wit",
        pub_export_macro: true,
        export_macro_name: "export_world",
        default_bindings_module: "palisade_rule_sdk::bindings",
        additional_derives: [serde::Serialize, serde::Deserialize, PartialEq],
    });
}

/// The bindings of the `model-transform` world (`model_transform!` refers to them).
#[doc(hidden)]
pub mod transform_bindings {
    wit_bindgen::generate!({
        world: "model-transform",
        path: "wit",
        pub_export_macro: true,
        export_macro_name: "export_model_transform",
        default_bindings_module: "palisade_rule_sdk::transform_bindings",
    });
}

pub use bindings::{
    Context, Entry, Guest,
    palisade::rule::types::{
        Action, FileRule, Matcher, NetworkRule, Permission, Protocol, SocketRule,
    },
};
#[doc(hidden)]
pub use serde_json;
pub use transform::{Transform, transform_json};

/// The ABI version this SDK builds modules for (the WIT package version).
pub const ABI_VERSION: &str = "0.4.0";

/// A rule module.
pub trait Rule {
    /// The module's configuration, read from the policy's `config` (JSON).
    type Config: serde::de::DeserializeOwned;

    /// Whether `decide` reads [`Event::json`]. The JSON of an event is most of what crossing
    /// into the module costs, so the agent passes it only to modules that say they read it; to
    /// the others it is "".
    const READS_JSON: bool = false;

    /// Turns the configuration into kernel rules.
    fn compile(config: Self::Config, context: &Context) -> Result<Vec<Entry>, String>;

    /// What happens to one audit event of a policy that uses the module with `config`. By
    /// default the event goes on unchanged.
    fn decide(config: &Self::Config, event: &Event<'_>) -> Verdict {
        let _ = (config, event);
        Verdict::keep()
    }
}

fn parse_config<R: Rule>(config: &str) -> Result<R::Config, String> {
    serde_json::from_str(config).map_err(|err| format!("config: {err}"))
}

/// Runs `R::compile` on configuration text, as the agent calls it.
pub fn compile_json<R: Rule>(config: &str, context: &Context) -> Result<Vec<Entry>, String> {
    R::compile(parse_config::<R>(config)?, context)
}

/// Runs `R::decide` on each event, as the agent calls it. A configuration `compile` accepted
/// always parses; should it not, every event goes on unchanged.
pub fn decide_json<R: Rule>(config: &str, events: &[Event<'_>]) -> Vec<Verdict> {
    let mut verdicts = Vec::with_capacity(events.len());
    Configured::<R>::default().decide(config, events.iter().copied(), |verdict| {
        verdicts.push(verdict)
    });
    verdicts
}

/// The configuration of the last `decide` call, parsed: the agent calls an instance with one
/// configuration, batch after batch, and parsing it costs more than deciding a few events.
#[doc(hidden)]
pub struct Configured<R: Rule> {
    /// The text and what it parsed to (None: it did not).
    last: Option<(String, Option<R::Config>)>,
}

impl<R: Rule> Default for Configured<R> {
    fn default() -> Self {
        Self { last: None }
    }
}

impl<R: Rule> Configured<R> {
    /// Runs `R::decide` on each event, handing each verdict to `verdict` as it is made.
    pub fn decide<'e>(
        &mut self,
        config: &str,
        events: impl IntoIterator<Item = Event<'e>>,
        mut verdict: impl FnMut(Verdict),
    ) {
        if self.last.as_ref().is_none_or(|(text, _)| text != config) {
            self.last = Some((config.to_owned(), parse_config::<R>(config).ok()));
        }
        let config = self.last.as_ref().and_then(|(_, config)| config.as_ref());
        for event in events {
            verdict(config.map_or_else(Verdict::keep, |config| R::decide(config, &event)));
        }
    }

    /// `decide` on a batch as it crosses the ABI, the verdicts packed as they are made: each is
    /// dropped before the next event's, so the module's allocator reuses its memory at once.
    pub fn decide_packed(&mut self, config: &str, text: &str, events: &[u32]) -> wire::Packed {
        let mut packed = wire::Packed::with_capacity(events.len() / wire::EVENT_WORDS);
        self.decide(config, wire::events(text, events), |verdict| {
            packed.push(&verdict)
        });
        packed
    }
}

/// Exports a [`Rule`] as the module's `compile` and `decide`, and makes the SDK's allocator the
/// module's (small blocks reused by size class: a verdict's strings cost little).
#[macro_export]
macro_rules! rule {
    ($rule:ty) => {
        #[cfg(all(target_arch = "wasm32", not(target_feature = "atomics")))]
        #[global_allocator]
        static PALISADE_ALLOCATOR: $crate::allocator::SizeClasses =
            $crate::allocator::SizeClasses::new();

        #[doc(hidden)]
        pub struct PalisadeRuleExport;

        impl $crate::Guest for PalisadeRuleExport {
            fn compile(
                config: ::std::string::String,
                context: $crate::Context,
            ) -> ::std::result::Result<::std::vec::Vec<$crate::Entry>, ::std::string::String> {
                $crate::compile_json::<$rule>(&config, &context)
            }

            fn reads_json() -> bool {
                <$rule as $crate::Rule>::READS_JSON
            }

            fn decide(
                config: ::std::string::String,
                text: ::std::string::String,
                events: ::std::vec::Vec<u32>,
            ) -> $crate::bindings::Verdicts {
                ::std::thread_local! {
                    static CONFIGURED: ::std::cell::RefCell<$crate::Configured<$rule>> =
                        ::std::cell::RefCell::default();
                }
                let packed = CONFIGURED.with_borrow_mut(|configured| {
                    configured.decide_packed(&config, &text, &events)
                });
                $crate::bindings::Verdicts {
                    verdicts: packed.verdicts,
                    text: packed.text,
                    tags: packed.tags,
                    annotations: packed.annotations,
                }
            }
        }

        $crate::bindings::export_world!(PalisadeRuleExport with_types_in $crate::bindings);
    };
}

impl Entry {
    /// Opening or changing the files at `paths` with `permissions`.
    pub fn files(
        name: impl Into<String>,
        paths: Vec<String>,
        permissions: &[Permission],
        action: Action,
    ) -> Self {
        Self {
            name: name.into(),
            matcher: Matcher::Files(FileRule {
                paths,
                permissions: permissions.to_vec(),
            }),
            action,
        }
    }

    /// Running the programs at `paths`.
    pub fn exec(name: impl Into<String>, paths: Vec<String>, action: Action) -> Self {
        Self {
            name: name.into(),
            matcher: Matcher::Exec(paths),
            action,
        }
    }

    /// Traffic to `addresses` on `ports` over `protocols` (empty: all of them).
    pub fn network(
        name: impl Into<String>,
        addresses: Vec<String>,
        ports: Vec<String>,
        protocols: &[Protocol],
        action: Action,
    ) -> Self {
        Self {
            name: name.into(),
            matcher: Matcher::Network(NetworkRule {
                addresses,
                ports,
                protocols: protocols.to_vec(),
            }),
            action,
        }
    }

    /// Mounting file systems of `fs_types` ("*": every mount, in deny and audit rules).
    pub fn mount(name: impl Into<String>, fs_types: Vec<String>, action: Action) -> Self {
        Self {
            name: name.into(),
            matcher: Matcher::Mount(fs_types),
            action,
        }
    }

    /// Using `capabilities`.
    pub fn capabilities(
        name: impl Into<String>,
        capabilities: Vec<String>,
        action: Action,
    ) -> Self {
        Self {
            name: name.into(),
            matcher: Matcher::Capabilities(capabilities),
            action,
        }
    }

    /// Creating the sockets `sockets` lists.
    pub fn sockets(name: impl Into<String>, sockets: Vec<SocketRule>, action: Action) -> Self {
        Self {
            name: name.into(),
            matcher: Matcher::Sockets(sockets),
            action,
        }
    }

    /// Connecting to the UNIX stream sockets at `paths` (an allow rule: only `Action::Allow`).
    pub fn unix_sockets(name: impl Into<String>, paths: Vec<String>) -> Self {
        Self {
            name: name.into(),
            matcher: Matcher::UnixSockets(paths),
            action: Action::Allow,
        }
    }
}

/// An audit event, as the agent reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event<'a> {
    /// The LSM hook that decided: "file_open", "bprm_check_security", "socket_connect"...
    pub hook: &'a str,
    /// "deny", or "audit" for an operation allowed and reported.
    pub action: &'a str,
    pub policy: &'a str,
    pub rule: &'a str,
    pub pid: u32,
    pub uid: u32,
    pub comm: &'a str,
    /// The file, for file and exec hooks.
    pub path: &'a str,
    /// The whole event as JSON: every field the agent writes but what rule modules add.
    pub json: &'a str,
}

/// An event read from a line of the agent's JSON output (`{"hook": "file_open", ...}`), which
/// `event` lends as modules receive it.
pub struct JsonEvent {
    value: serde_json::Value,
    text: String,
}

impl JsonEvent {
    pub fn new(value: serde_json::Value) -> Self {
        let text = value.to_string();
        Self { value, text }
    }

    pub fn event(&self) -> Event<'_> {
        let text = |field: &str| self.value[field].as_str().unwrap_or_default();
        let number = |field: &str| self.value[field].as_u64().unwrap_or_default() as u32;
        Event {
            hook: text("hook"),
            action: text("action"),
            policy: text("policy"),
            rule: text("rule"),
            pid: number("pid"),
            uid: number("uid"),
            comm: text("comm"),
            path: text("path"),
            json: &self.text,
        }
    }
}

/// How serious an event is, lowest first.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub enum Severity {
    Info,
    Low,
    Medium,
    High,
    Critical,
}

/// What happens to an event.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Verdict {
    /// Whether the event goes on to the sinks (false: dropped, and counted).
    pub keep: bool,
    pub severity: Option<Severity>,
    /// Strings given as literals stay borrowed: no allocation, for the module or the agent's
    /// copy of its verdicts.
    pub tags: Vec<Cow<'static, str>>,
    /// Added to the event as "annotations".
    pub annotations: Vec<(Cow<'static, str>, Cow<'static, str>)>,
    /// Kill the process that caused the event (SIGKILL).
    pub kill: bool,
}

impl Verdict {
    /// The event goes on unchanged.
    pub fn keep() -> Self {
        Self {
            keep: true,
            severity: None,
            tags: Vec::new(),
            annotations: Vec::new(),
            kill: false,
        }
    }

    /// The event is dropped (and counted).
    pub fn drop() -> Self {
        Self {
            keep: false,
            ..Self::keep()
        }
    }

    pub fn severity(mut self, severity: Severity) -> Self {
        self.severity = Some(severity);
        self
    }

    pub fn tag(mut self, tag: impl Into<Cow<'static, str>>) -> Self {
        self.tags.push(tag.into());
        self
    }

    pub fn annotate(
        mut self,
        key: impl Into<Cow<'static, str>>,
        value: impl Into<Cow<'static, str>>,
    ) -> Self {
        self.annotations.push((key.into(), value.into()));
        self
    }

    /// Also kill the process that caused the event.
    pub fn kill(mut self) -> Self {
        self.kill = true;
        self
    }
}

/// The configuration built-in rule families take: rules by name, each with an optional action
/// (deny by default), as in a policy's rule lists:
/// `{"rules": ["disable-write-etc", {"name": "mitigate-sa-leak", "action": "audit"}]}`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamedRules {
    pub rules: Vec<NamedRule>,
}

#[derive(Debug, serde::Deserialize)]
#[serde(untagged)]
pub enum NamedRule {
    Name(String),
    WithAction { name: String, action: NamedAction },
}

#[derive(Debug, Clone, Copy, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NamedAction {
    Deny,
    Audit,
}

impl NamedRules {
    /// One entry per rule, made by `entry` from its name and action.
    pub fn entries(
        &self,
        entry: impl Fn(&str, Action) -> Result<Entry, String>,
    ) -> Result<Vec<Entry>, String> {
        self.rules
            .iter()
            .map(|rule| entry(rule.name(), rule.action()))
            .collect()
    }
}

impl NamedRule {
    pub fn name(&self) -> &str {
        match self {
            NamedRule::Name(name) | NamedRule::WithAction { name, .. } => name,
        }
    }

    pub fn action(&self) -> Action {
        match self {
            NamedRule::WithAction {
                action: NamedAction::Audit,
                ..
            } => Action::Audit,
            _ => Action::Deny,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Tagging;

    #[derive(serde::Deserialize)]
    struct Config {
        tag: String,
    }

    impl Rule for Tagging {
        type Config = Config;

        fn compile(_: Config, _: &Context) -> Result<Vec<Entry>, String> {
            Ok(Vec::new())
        }

        fn decide(config: &Config, _: &Event<'_>) -> Verdict {
            Verdict::keep().tag(config.tag.clone())
        }
    }

    #[test]
    fn a_configuration_is_parsed_again_when_it_changes() {
        let event = Event {
            hook: "file_open",
            action: "deny",
            policy: "app",
            rule: "app/rule",
            pid: 1,
            uid: 0,
            comm: "cat",
            path: "/etc/shadow",
            json: "",
        };
        let mut configured = Configured::<Tagging>::default();
        let mut tags = |config: &str| {
            let mut tags = Vec::new();
            configured.decide(config, [event], |verdict| tags = verdict.tags);
            tags
        };
        assert_eq!(tags(r#"{"tag": "a"}"#), ["a"]);
        assert_eq!(tags(r#"{"tag": "a"}"#), ["a"]);
        assert_eq!(tags(r#"{"tag": "b"}"#), ["b"]);
        assert!(tags("not JSON").is_empty());
        assert_eq!(tags(r#"{"tag": "a"}"#), ["a"]);
    }
}

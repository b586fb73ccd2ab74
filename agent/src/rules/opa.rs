//! Rego policies compiled by `opa build -t wasm` (OPA's Wasm ABI 1.x) as rule modules and model
//! transforms. The policy is a core module importing its memory and a few `env` functions; its
//! entrypoints `palisade/compile` and `palisade/decide` (a rule module), or `palisade/transform`
//! (a model transform), play the parts of the component exports:
//!
//! - `data.palisade.compile`, with input `{"config": ..., "context": {...}}`: a list of rules
//!   `{"name": N, "action": "deny"|"audit"|"allow", "files": {"paths": [...], "permissions":
//!   [...]}}` (or `"exec": [paths]`, `"network": {"addresses", "ports", "protocols"}`, `"mount":
//!   [types]`, `"capabilities": [names]`, `"sockets": [{"family", "types"}]`, `"unix_sockets":
//!   [paths]`), or `{"error": "why"}`;
//! - `data.palisade.decide`, with input `{"config": ..., "event": {...}}`: `{"keep", "severity",
//!   "tags", "annotations", "kill"}`, every field optional (undefined: keep the event);
//! - `data.palisade.transform`, with input `{"config": ..., "model": {...}}`: the model to use
//!   instead, or `{"error": "why"}` (undefined: the model unchanged).
//!
//! Builtins the host would have to implement are refused when the module is loaded.

use serde::Deserialize;
use wasmtime::{Extern, ExternType, Func, Instance, Memory, MemoryType, Module, Store, TypedFunc};

use super::{
    abi::{Event, Severity, Verdict, types},
    sandbox::State,
};

pub const COMPILE_ENTRYPOINT: &str = "palisade/compile";
pub const DECIDE_ENTRYPOINT: &str = "palisade/decide";
pub const TRANSFORM_ENTRYPOINT: &str = "palisade/transform";

/// A Rego policy checked against the ABI: a rule module or a model transform.
pub struct OpaModule {
    module: Module,
    entrypoints: Entrypoints,
}

/// The entrypoints' numbers in the policy.
#[derive(Clone, Copy)]
enum Entrypoints {
    Rules { compile: i32, decide: i32 },
    Transform(i32),
}

/// One instance: its memory, the functions the host calls, and where its heap starts once the
/// (empty) data document is in place.
struct Opa {
    memory: Memory,
    malloc: TypedFunc<i32, i32>,
    json_parse: TypedFunc<(i32, i32), i32>,
    json_dump: TypedFunc<i32, i32>,
    ctx_new: TypedFunc<(), i32>,
    ctx_set_input: TypedFunc<(i32, i32), ()>,
    ctx_set_data: TypedFunc<(i32, i32), ()>,
    ctx_set_entrypoint: TypedFunc<(i32, i32), ()>,
    ctx_get_result: TypedFunc<i32, i32>,
    eval: TypedFunc<i32, i32>,
    heap_ptr_set: TypedFunc<i32, ()>,
    heap_base: i32,
    data: i32,
}

/// Whether `bytes` are a core module (an OPA policy) rather than a component.
pub fn is_core_module(bytes: &[u8]) -> bool {
    bytes.get(4..8) == Some(&[1, 0, 0, 0])
}

/// Instantiates the policy with the imports it needs: its memory, `opa_abort` and `opa_println`
/// (builtins never run: modules needing them are refused at load).
fn instantiate(store: &mut Store<State>, module: &Module) -> wasmtime::Result<(Instance, Memory)> {
    let mut imports = Vec::new();
    let mut memory = None;
    for import in module.imports() {
        let item: Extern = match (import.module(), import.name(), import.ty()) {
            ("env", "memory", ExternType::Memory(ty)) => {
                let created = Memory::new(&mut *store, MemoryType::new(ty.minimum() as u32, None))?;
                memory = Some(created);
                created.into()
            }
            ("env", "opa_abort", _) => Func::wrap(&mut *store, |_: i32| -> wasmtime::Result<()> {
                Err(wasmtime::Error::msg("the policy aborted (opa_abort)"))
            })
            .into(),
            ("env", "opa_println", _) => Func::wrap(&mut *store, |_: i32| {}).into(),
            ("env", name, ExternType::Func(ty)) if name.starts_with("opa_builtin") => {
                Func::new(&mut *store, ty, |_, _, _| {
                    Err(wasmtime::Error::msg("builtins are not provided"))
                })
                .into()
            }
            (module, name, _) => {
                return Err(wasmtime::Error::msg(format!(
                    "it imports {module}.{name}, which the agent does not provide"
                )));
            }
        };
        imports.push(item);
    }
    let memory = memory.ok_or_else(|| wasmtime::Error::msg("it imports no env.memory"))?;
    Ok((Instance::new(store, module, &imports)?, memory))
}

impl Opa {
    fn new(
        store: &mut Store<State>,
        instance: &Instance,
        memory: Memory,
    ) -> wasmtime::Result<Self> {
        let mut opa = Self {
            memory,
            malloc: instance.get_typed_func(&mut *store, "opa_malloc")?,
            json_parse: instance.get_typed_func(&mut *store, "opa_json_parse")?,
            json_dump: instance.get_typed_func(&mut *store, "opa_json_dump")?,
            ctx_new: instance.get_typed_func(&mut *store, "opa_eval_ctx_new")?,
            ctx_set_input: instance.get_typed_func(&mut *store, "opa_eval_ctx_set_input")?,
            ctx_set_data: instance.get_typed_func(&mut *store, "opa_eval_ctx_set_data")?,
            ctx_set_entrypoint: instance
                .get_typed_func(&mut *store, "opa_eval_ctx_set_entrypoint")?,
            ctx_get_result: instance.get_typed_func(&mut *store, "opa_eval_ctx_get_result")?,
            eval: instance.get_typed_func(&mut *store, "eval")?,
            heap_ptr_set: instance.get_typed_func(&mut *store, "opa_heap_ptr_set")?,
            heap_base: 0,
            data: 0,
        };
        opa.data = opa.parse(store, "{}")?;
        let heap_ptr_get: TypedFunc<(), i32> =
            instance.get_typed_func(&mut *store, "opa_heap_ptr_get")?;
        opa.heap_base = heap_ptr_get.call(&mut *store, ())?;
        Ok(opa)
    }
    /// Parses `json` into a value on the instance's heap.
    fn parse(&self, store: &mut Store<State>, json: &str) -> wasmtime::Result<i32> {
        let len = i32::try_from(json.len())?;
        let addr = self.malloc.call(&mut *store, len)?;
        self.memory
            .write(&mut *store, usize::try_from(addr)?, json.as_bytes())?;
        let value = self.json_parse.call(&mut *store, (addr, len))?;
        if value == 0 {
            return Err(wasmtime::Error::msg("the policy could not parse its input"));
        }
        Ok(value)
    }

    /// Evaluates `entrypoint` on `input` (JSON); the rule's value, None when undefined. The
    /// heap is reset first, so an instance evaluates any number of inputs in constant memory.
    fn eval(
        &self,
        store: &mut Store<State>,
        entrypoint: i32,
        input: &str,
    ) -> wasmtime::Result<Option<serde_json::Value>> {
        self.heap_ptr_set.call(&mut *store, self.heap_base)?;
        let input = self.parse(store, input)?;
        let ctx = self.ctx_new.call(&mut *store, ())?;
        self.ctx_set_data.call(&mut *store, (ctx, self.data))?;
        self.ctx_set_input.call(&mut *store, (ctx, input))?;
        self.ctx_set_entrypoint
            .call(&mut *store, (ctx, entrypoint))?;
        let error = self.eval.call(&mut *store, ctx)?;
        if error != 0 {
            return Err(wasmtime::Error::msg(format!(
                "the policy's evaluation failed (error {error})"
            )));
        }
        let result = self.ctx_get_result.call(&mut *store, ctx)?;
        let dumped = self.json_dump.call(&mut *store, result)?;
        result_value(&string(self.memory.data(&*store), dumped)?)
    }

    /// A JSON document the module returned from an export (`builtins`, `entrypoints`).
    fn document(
        &self,
        store: &mut Store<State>,
        instance: &Instance,
        export: &str,
    ) -> wasmtime::Result<serde_json::Value> {
        let func: TypedFunc<(), i32> = instance.get_typed_func(&mut *store, export)?;
        let value = func.call(&mut *store, ())?;
        let dumped = self.json_dump.call(&mut *store, value)?;
        Ok(serde_json::from_str(&string(
            self.memory.data(&*store),
            dumped,
        )?)?)
    }
}

/// The NUL-terminated string at `addr` in a policy's `memory`.
pub(crate) fn string(memory: &[u8], addr: i32) -> wasmtime::Result<String> {
    let tail = usize::try_from(addr)
        .ok()
        .and_then(|start| memory.get(start..))
        .ok_or_else(|| wasmtime::Error::msg("a string outside memory"))?;
    let end = tail
        .iter()
        .position(|&byte| byte == 0)
        .ok_or_else(|| wasmtime::Error::msg("an unterminated string"))?;
    Ok(String::from_utf8_lossy(&tail[..end]).into_owned())
}

/// The value in a result set a policy dumped: `[{"result": VALUE}]`, or `[]` (None) when the
/// rule is undefined.
pub(crate) fn result_value(text: &str) -> wasmtime::Result<Option<serde_json::Value>> {
    let results: Vec<serde_json::Value> = serde_json::from_str(text)?;
    Ok(results
        .into_iter()
        .next()
        .and_then(|mut entry| entry.get_mut("result").map(serde_json::Value::take)))
}

/// The kernel rules in `palisade/compile`'s result, or the error the policy reports.
pub(crate) fn rules(
    result: Option<serde_json::Value>,
) -> wasmtime::Result<Result<Vec<types::Entry>, String>> {
    let Some(result) = result else {
        return Ok(Ok(Vec::new()));
    };
    if let Some(error) = result.get("error").and_then(serde_json::Value::as_str) {
        return Ok(Err(error.to_owned()));
    }
    let rules: Vec<RegoRule> = serde_json::from_value(result)
        .map_err(|err| wasmtime::Error::msg(format!("malformed rules: {err}")))?;
    Ok(Ok(rules
        .into_iter()
        .map(RegoRule::entry)
        .collect::<Result<_, _>>()
        .map_err(wasmtime::Error::msg)?))
}

/// The verdict in `palisade/decide`'s result (undefined: keep the event).
pub(crate) fn verdict(result: Option<serde_json::Value>) -> wasmtime::Result<Verdict> {
    let verdict: RegoVerdict = match result {
        Some(result) => serde_json::from_value(result)
            .map_err(|err| wasmtime::Error::msg(format!("malformed verdict: {err}")))?,
        None => RegoVerdict::default(),
    };
    Ok(verdict.into())
}

/// The model (JSON) in `palisade/transform`'s result for `model` (undefined: `model`
/// unchanged), or the error the policy reports.
pub(crate) fn transformed(
    result: Option<serde_json::Value>,
    model: &str,
) -> Result<String, String> {
    let Some(result) = result else {
        return Ok(model.to_owned());
    };
    if let Some(error) = result.get("error").and_then(serde_json::Value::as_str) {
        return Err(error.to_owned());
    }
    Ok(result.to_string())
}

impl OpaModule {
    /// Checks a compiled Rego policy against the ABI: its exports, no builtins, both
    /// entrypoints. `store` gives the check its limits and time budget.
    pub(super) fn load(module: Module, store: &mut Store<State>) -> Result<Self, String> {
        let (instance, memory) = instantiate(store, &module).map_err(|err| format!("{err:#}"))?;
        let opa = Opa::new(store, &instance, memory)
            .map_err(|err| format!("not an OPA Wasm policy (ABI 1.x): {err:#}"))?;
        let builtins = opa
            .document(store, &instance, "builtins")
            .map_err(|err| format!("{err:#}"))?;
        if let Some(needed) = builtins.as_object().filter(|needed| !needed.is_empty()) {
            let names: Vec<&str> = needed.keys().map(String::as_str).collect();
            return Err(format!(
                "the policy needs builtins the agent does not provide: {}",
                names.join(", ")
            ));
        }
        let entrypoints = opa
            .document(store, &instance, "entrypoints")
            .map_err(|err| format!("{err:#}"))?;
        let entrypoint = |name: &str| {
            entrypoints[name]
                .as_i64()
                .and_then(|id| i32::try_from(id).ok())
        };
        let entrypoints = match (
            entrypoint(COMPILE_ENTRYPOINT),
            entrypoint(DECIDE_ENTRYPOINT),
            entrypoint(TRANSFORM_ENTRYPOINT),
        ) {
            (Some(compile), Some(decide), None) => Entrypoints::Rules { compile, decide },
            (None, None, Some(transform)) => Entrypoints::Transform(transform),
            _ => {
                return Err(format!(
                    "its entrypoints must be {COMPILE_ENTRYPOINT} and {DECIDE_ENTRYPOINT} (a rule \
                     module), or {TRANSFORM_ENTRYPOINT} alone (a model transform): `palisade \
                     rules build` builds them"
                ));
            }
        };
        Ok(Self {
            module,
            entrypoints,
        })
    }

    /// What the policy is for: "a rule module" or "a model transform".
    pub fn purpose(&self) -> &'static str {
        match self.entrypoints {
            Entrypoints::Rules { .. } => "a rule module",
            Entrypoints::Transform(_) => "a model transform",
        }
    }

    /// A fresh instance of the policy.
    pub(super) fn instantiate(&self, store: &mut Store<State>) -> wasmtime::Result<OpaInstance> {
        let (instance, memory) = instantiate(store, &self.module)?;
        Ok(OpaInstance {
            opa: Opa::new(store, &instance, memory)?,
            entrypoints: self.entrypoints,
        })
    }
}

/// An instance of a Rego policy: every evaluation resets its heap, so it can be called again
/// and again.
pub struct OpaInstance {
    opa: Opa,
    entrypoints: Entrypoints,
}

/// An entrypoint the policy does not have: the host asks a rule module only for rules and
/// verdicts, a model transform only for models.
fn missing(entrypoint: &str) -> wasmtime::Error {
    wasmtime::Error::msg(format!("the policy has no entrypoint {entrypoint}"))
}

impl OpaInstance {
    pub fn is_transform(&self) -> bool {
        matches!(self.entrypoints, Entrypoints::Transform(_))
    }

    pub(super) fn compile(
        &self,
        store: &mut Store<State>,
        config: &str,
        context: &types::Context,
    ) -> wasmtime::Result<Result<Vec<types::Entry>, String>> {
        let input = format!(
            "{{\"config\": {config}, \"context\": {}}}",
            serde_json::json!({
                "policy": context.policy,
                "node": context.node,
                "kube_apiserver": context.kube_apiserver,
            })
        );
        let Entrypoints::Rules { compile, .. } = self.entrypoints else {
            return Err(missing(COMPILE_ENTRYPOINT));
        };
        rules(self.opa.eval(store, compile, &input)?)
    }

    pub(super) fn decide(
        &self,
        store: &mut Store<State>,
        config: &str,
        events: &[Event<'_>],
    ) -> wasmtime::Result<Vec<Verdict>> {
        let Entrypoints::Rules { decide, .. } = self.entrypoints else {
            return Err(missing(DECIDE_ENTRYPOINT));
        };
        events
            .iter()
            .map(|event| {
                let input = format!("{{\"config\": {config}, \"event\": {}}}", event.json);
                verdict(self.opa.eval(store, decide, &input)?)
            })
            .collect()
    }

    /// The model (JSON) the policy makes of `model` (JSON): see the module's documentation.
    pub(super) fn transform(
        &self,
        store: &mut Store<State>,
        config: &str,
        model: &str,
    ) -> wasmtime::Result<Result<String, String>> {
        let Entrypoints::Transform(transform) = self.entrypoints else {
            return Err(missing(TRANSFORM_ENTRYPOINT));
        };
        let input = format!("{{\"config\": {config}, \"model\": {model}}}");
        Ok(transformed(self.opa.eval(store, transform, &input)?, model))
    }
}

/// A rule as Rego returns it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RegoRule {
    name: String,
    action: RegoAction,
    #[serde(default)]
    files: Option<RegoFiles>,
    #[serde(default)]
    exec: Option<Vec<String>>,
    #[serde(default)]
    network: Option<RegoNetwork>,
    #[serde(default)]
    mount: Option<Vec<String>>,
    #[serde(default)]
    capabilities: Option<Vec<String>>,
    #[serde(default)]
    sockets: Option<Vec<RegoSocket>>,
    #[serde(default)]
    unix_sockets: Option<Vec<String>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "lowercase")]
enum RegoAction {
    Deny,
    Audit,
    Allow,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RegoFiles {
    paths: Vec<String>,
    permissions: Vec<RegoPermission>,
}

#[derive(Deserialize)]
#[serde(rename_all = "lowercase")]
enum RegoPermission {
    Read,
    Write,
    Append,
    Exec,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RegoNetwork {
    #[serde(default)]
    addresses: Vec<String>,
    /// Numbers or "LOW-HIGH" ranges.
    #[serde(default)]
    ports: Vec<serde_json::Value>,
    #[serde(default)]
    protocols: Vec<RegoProtocol>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RegoSocket {
    family: String,
    #[serde(default)]
    types: Vec<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "lowercase")]
enum RegoProtocol {
    Tcp,
    Udp,
    Icmp,
}

impl RegoRule {
    fn entry(self) -> Result<types::Entry, String> {
        use types::{Matcher, Permission, Protocol};
        let name = self.name;
        let mut matchers = Vec::new();
        if let Some(files) = self.files {
            matchers.push(Matcher::Files(types::FileRule {
                paths: files.paths,
                permissions: files
                    .permissions
                    .into_iter()
                    .map(|permission| match permission {
                        RegoPermission::Read => Permission::Read,
                        RegoPermission::Write => Permission::Write,
                        RegoPermission::Append => Permission::Append,
                        RegoPermission::Exec => Permission::Exec,
                    })
                    .collect(),
            }));
        }
        if let Some(paths) = self.exec {
            matchers.push(Matcher::Exec(paths));
        }
        if let Some(network) = self.network {
            matchers.push(Matcher::Network(types::NetworkRule {
                addresses: network.addresses,
                ports: network
                    .ports
                    .iter()
                    .map(|port| match port {
                        serde_json::Value::String(range) => range.clone(),
                        other => other.to_string(),
                    })
                    .collect(),
                protocols: network
                    .protocols
                    .into_iter()
                    .map(|protocol| match protocol {
                        RegoProtocol::Tcp => Protocol::Tcp,
                        RegoProtocol::Udp => Protocol::Udp,
                        RegoProtocol::Icmp => Protocol::Icmp,
                    })
                    .collect(),
            }));
        }
        if let Some(fs_types) = self.mount {
            matchers.push(Matcher::Mount(fs_types));
        }
        if let Some(capabilities) = self.capabilities {
            matchers.push(Matcher::Capabilities(capabilities));
        }
        if let Some(sockets) = self.sockets {
            matchers.push(Matcher::Sockets(
                sockets
                    .into_iter()
                    .map(|RegoSocket { family, types }| types::SocketRule { family, types })
                    .collect(),
            ));
        }
        if let Some(paths) = self.unix_sockets {
            matchers.push(Matcher::UnixSockets(paths));
        }
        let [matcher] = <[Matcher; 1]>::try_from(matchers).map_err(|_| {
            format!(
                "rule \"{name}\" needs exactly one of files, exec, network, mount, capabilities, \
                 sockets, unix_sockets"
            )
        })?;
        Ok(types::Entry {
            name,
            matcher,
            action: match self.action {
                RegoAction::Deny => types::Action::Deny,
                RegoAction::Audit => types::Action::Audit,
                RegoAction::Allow => types::Action::Allow,
            },
        })
    }
}

/// A verdict as Rego returns it: every field optional.
#[derive(Deserialize)]
#[serde(default, deny_unknown_fields)]
struct RegoVerdict {
    keep: bool,
    severity: Option<RegoSeverity>,
    tags: Vec<String>,
    annotations: std::collections::BTreeMap<String, String>,
    kill: bool,
}

impl Default for RegoVerdict {
    fn default() -> Self {
        Self {
            keep: true,
            severity: None,
            tags: Vec::new(),
            annotations: Default::default(),
            kill: false,
        }
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "lowercase")]
enum RegoSeverity {
    Info,
    Low,
    Medium,
    High,
    Critical,
}

impl From<RegoVerdict> for Verdict {
    fn from(verdict: RegoVerdict) -> Self {
        Self {
            keep: verdict.keep,
            severity: verdict.severity.map(|severity| match severity {
                RegoSeverity::Info => Severity::Info,
                RegoSeverity::Low => Severity::Low,
                RegoSeverity::Medium => Severity::Medium,
                RegoSeverity::High => Severity::High,
                RegoSeverity::Critical => Severity::Critical,
            }),
            tags: verdict.tags.into_iter().map(Into::into).collect(),
            annotations: verdict
                .annotations
                .into_iter()
                .map(|(key, value)| (key.into(), value.into()))
                .collect(),
            kill: verdict.kill,
        }
    }
}

//! The wasmtime side: one engine for every module, each module compiled once (and cached on disk
//! by content digest and engine), a store with its own limits for every instance.

use std::{
    collections::HashMap,
    hash::{Hash, Hasher},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use palisade_rule_sdk::wire;
use sha2::{Digest, Sha256};
use wasmtime::{
    Config, Engine, Store, Trap,
    component::{Component, Linker},
};

use super::{
    abi::{
        ABI_VERSION, Event, ModelTransform, ModelTransformPre, Rule, RulePre, Verdict,
        types::{Context, Entry},
    },
    opa::{OpaInstance, OpaModule, is_core_module},
    sandbox::{COMPILE_BUDGET, DECIDE_BUDGET, Epoch, MEMORY_LIMIT, State, set_budget, store},
};

/// How a call into a module failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailureKind {
    /// Ran past its time budget.
    Timeout,
    /// Tried to grow its memory past the limit.
    Memory,
    StackOverflow,
    /// Any other trap: `unreachable`, a panic, an out-of-bounds access.
    Trap,
    /// Returned something the agent cannot use.
    Malformed,
}

impl FailureKind {
    pub fn name(self) -> &'static str {
        match self {
            FailureKind::Timeout => "timeout",
            FailureKind::Memory => "memory",
            FailureKind::StackOverflow => "stack_overflow",
            FailureKind::Trap => "trap",
            FailureKind::Malformed => "malformed",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ModuleError {
    #[error("starting the WebAssembly runtime: {0}")]
    Runtime(String),
    #[error("reading {path}: {error}")]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{path}: its SHA-256 digest is {actual} but the policy expects {expected}: refused")]
    Digest {
        path: PathBuf,
        expected: String,
        actual: String,
    },
    #[error(
        "{path}: not a module this agent runs (a component of palisade:rule@{ABI_VERSION}'s \
         world rule or model-transform, or a Rego policy with the entrypoints palisade/compile \
         and palisade/decide, or palisade/transform): {reason}"
    )]
    Abi { path: PathBuf, reason: String },
    #[error("stopped ({}): {message}", kind.name())]
    Failed { kind: FailureKind, message: String },
    #[error("{0}")]
    Refused(String),
}

impl ModuleError {
    fn failed(err: wasmtime::Error) -> Self {
        // The cause alone: the wasm backtrace around it is lines of mangled names.
        let cause = err.root_cause().to_string();
        let (kind, message) = match err.downcast_ref::<Trap>() {
            Some(Trap::Interrupt) => (FailureKind::Timeout, "it ran past its budget".to_owned()),
            Some(Trap::StackOverflow) => (FailureKind::StackOverflow, cause),
            _ if cause.contains("growing memory") => (
                FailureKind::Memory,
                format!(
                    "it used all the memory it may have ({} MiB): {cause}",
                    MEMORY_LIMIT >> 20
                ),
            ),
            _ => (FailureKind::Trap, cause),
        };
        ModuleError::Failed { kind, message }
    }

    /// How the call failed, for a module that ran.
    pub fn kind(&self) -> Option<FailureKind> {
        match self {
            ModuleError::Failed { kind, .. } => Some(*kind),
            _ => None,
        }
    }
}

/// Loads rule modules and runs them.
#[derive(Clone)]
pub struct RuleHost {
    engine: Engine,
    linker: Arc<Linker<State>>,
    epoch: Arc<Epoch>,
    /// Where compiled modules are kept between runs (a directory only root may write).
    cache_dir: Option<PathBuf>,
    loaded: Arc<Mutex<HashMap<String, Arc<LoadedModule>>>>,
}

/// A module ready to be called.
pub struct LoadedModule {
    /// SHA-256 of the module's bytes, in hex.
    pub digest: String,
    engine: Engine,
    epoch: Arc<Epoch>,
    kind: Kind,
}

/// A module compiled, not yet checked against the ABI.
enum Artifact {
    Rego(wasmtime::Module),
    Component(Component),
}

enum Kind {
    /// A component of the `rule` world (Rust, or any language with WIT bindings).
    Rule(RulePre<State>),
    /// A component of the `model-transform` world.
    Transform(ModelTransformPre<State>),
    /// A Rego policy compiled by `opa build -t wasm`.
    Rego(OpaModule),
}

/// The largest module file: many times what a rule module or a Rego policy needs.
const MAX_MODULE_BYTES: u64 = 32 << 20;

/// The module file's bytes and their SHA-256 digest.
fn read(path: &Path) -> Result<(Vec<u8>, String), ModuleError> {
    let bytes =
        crate::bounded::read(path, MAX_MODULE_BYTES).map_err(|error| ModuleError::Read {
            path: path.to_owned(),
            error,
        })?;
    let digest = hex_digest(&bytes);
    Ok((bytes, digest))
}

/// The SHA-256 digest of `bytes`, in lowercase hex.
pub fn hex_digest(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

impl RuleHost {
    /// `cache_dir`: where to keep compiled modules (created if missing), or nowhere.
    pub fn new(cache_dir: Option<PathBuf>) -> Result<Self, ModuleError> {
        let mut config = Config::new();
        config.wasm_component_model(true);
        config.epoch_interruption(true);
        config.max_wasm_stack(512 << 10);
        let engine =
            Engine::new(&config).map_err(|err| ModuleError::Runtime(format!("{err:#}")))?;
        let epoch = Epoch::start_ticking(engine.weak())
            .map_err(|err| ModuleError::Runtime(format!("starting the epoch: {err}")))?;
        Ok(Self {
            linker: Arc::new(Linker::new(&engine)),
            engine,
            epoch,
            cache_dir,
            loaded: Arc::default(),
        })
    }

    /// Loads the module at `path`, whose SHA-256 digest must be `expected_digest` (hex).
    pub fn load(
        &self,
        path: &Path,
        expected_digest: &str,
    ) -> Result<Arc<LoadedModule>, ModuleError> {
        let (bytes, digest) = read(path)?;
        if !expected_digest.eq_ignore_ascii_case(&digest) {
            return Err(ModuleError::Digest {
                path: path.to_owned(),
                expected: expected_digest.to_owned(),
                actual: digest,
            });
        }
        self.loaded_or_admitted(path, &bytes, digest)
    }

    /// Loads the module at `path` whatever its digest: one a person names on the command line.
    pub fn open(&self, path: &Path) -> Result<Arc<LoadedModule>, ModuleError> {
        let (bytes, digest) = read(path)?;
        self.loaded_or_admitted(path, &bytes, digest)
    }

    fn loaded_or_admitted(
        &self,
        path: &Path,
        bytes: &[u8],
        digest: String,
    ) -> Result<Arc<LoadedModule>, ModuleError> {
        if let Some(module) = self.lock().get(&digest) {
            return Ok(module.clone());
        }
        let artifact = self.artifact(path, bytes, &digest)?;
        self.admit(path, digest, artifact)
    }

    /// The module compiled: a core module (a Rego policy) or a component.
    fn artifact(&self, path: &Path, bytes: &[u8], digest: &str) -> Result<Artifact, ModuleError> {
        let compiled = if is_core_module(bytes) {
            self.compiled(bytes, digest).map(Artifact::Rego)
        } else {
            self.compiled(bytes, digest).map(Artifact::Component)
        };
        compiled.map_err(|err| ModuleError::Abi {
            path: path.to_owned(),
            reason: format!("{err:#}"),
        })
    }

    /// Checks a compiled module against the ABI and keeps it, ready to be called.
    fn admit(
        &self,
        path: &Path,
        digest: String,
        artifact: Artifact,
    ) -> Result<Arc<LoadedModule>, ModuleError> {
        let module = Arc::new(self.check(path, digest.clone(), artifact)?);
        self.lock().insert(digest, module.clone());
        Ok(module)
    }

    /// Checks a compiled module against the ABI: ready to be called.
    fn check(
        &self,
        path: &Path,
        digest: String,
        artifact: Artifact,
    ) -> Result<LoadedModule, ModuleError> {
        let abi = |reason: String| ModuleError::Abi {
            path: path.to_owned(),
            reason,
        };
        let kind = match artifact {
            Artifact::Rego(module) => {
                // The budget starts once compiled: compiling is not the module's doing.
                let mut store = store(&self.engine, &self.epoch);
                let _ticking = set_budget(&mut store, COMPILE_BUDGET);
                Kind::Rego(OpaModule::load(module, &mut store).map_err(abi)?)
            }
            Artifact::Component(component) => {
                let pre = self
                    .linker
                    .instantiate_pre(&component)
                    .map_err(|err| abi(format!("{err:#}")))?;
                match RulePre::new(pre.clone()) {
                    Ok(rule) => Kind::Rule(rule),
                    Err(as_rule) => {
                        Kind::Transform(ModelTransformPre::new(pre).map_err(|as_transform| {
                            abi(format!(
                                "as a rule module: {as_rule:#}; as a model transform: \
                                 {as_transform:#}"
                            ))
                        })?)
                    }
                }
            }
        };
        Ok(LoadedModule {
            kind,
            digest,
            engine: self.engine.clone(),
            epoch: self.epoch.clone(),
        })
    }

    /// The module with SHA-256 `digest` (lowercase hex), if it was loaded.
    pub fn loaded(&self, digest: &str) -> Option<Arc<LoadedModule>> {
        self.lock().get(digest).cloned()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<LoadedModule>>> {
        self.loaded
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    /// The compiled module: from the disk cache when this engine compiled it before.
    fn compiled<T: Compiled>(&self, bytes: &[u8], digest: &str) -> wasmtime::Result<T> {
        let Some(dir) = &self.cache_dir else {
            return T::compile(&self.engine, bytes);
        };
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        self.engine
            .precompile_compatibility_hash()
            .hash(&mut hasher);
        let cached = dir.join(format!("{digest}-{:016x}.cwasm", hasher.finish()));
        // SAFETY: the file was written by `precompile` of an engine with the same configuration
        // (the name says which), into a directory only root can write and targets cannot change.
        if let Ok(compiled) = unsafe { T::deserialize_file(&self.engine, &cached) } {
            return Ok(compiled);
        }
        let precompiled = T::precompile(&self.engine, bytes)?;
        // A cache that cannot be written only costs compiling again next time.
        let written = std::fs::create_dir_all(dir).and_then(|()| {
            let partial = cached.with_extension("partial");
            std::fs::write(&partial, &precompiled)?;
            std::fs::rename(&partial, &cached)
        });
        if let Err(err) = written {
            tracing::debug!("caching a compiled rule module in {}: {err}", dir.display());
        }
        // SAFETY: produced just now by this engine.
        unsafe { T::deserialize(&self.engine, &precompiled) }
    }
}

/// What the compiled-module cache holds: components, and core modules (Rego policies).
trait Compiled: Sized {
    fn compile(engine: &Engine, bytes: &[u8]) -> wasmtime::Result<Self>;
    fn precompile(engine: &Engine, bytes: &[u8]) -> wasmtime::Result<Vec<u8>>;
    /// # Safety
    /// `bytes` come from `precompile` of an engine with this configuration.
    unsafe fn deserialize(engine: &Engine, bytes: &[u8]) -> wasmtime::Result<Self>;
    /// # Safety
    /// The file holds what `precompile` of an engine with this configuration returned.
    unsafe fn deserialize_file(engine: &Engine, path: &Path) -> wasmtime::Result<Self>;
}

impl Compiled for Component {
    fn compile(engine: &Engine, bytes: &[u8]) -> wasmtime::Result<Self> {
        Component::new(engine, bytes)
    }

    fn precompile(engine: &Engine, bytes: &[u8]) -> wasmtime::Result<Vec<u8>> {
        engine.precompile_component(bytes)
    }

    unsafe fn deserialize(engine: &Engine, bytes: &[u8]) -> wasmtime::Result<Self> {
        // SAFETY: as the caller promised.
        unsafe { Component::deserialize(engine, bytes) }
    }

    unsafe fn deserialize_file(engine: &Engine, path: &Path) -> wasmtime::Result<Self> {
        // SAFETY: as the caller promised.
        unsafe { Component::deserialize_file(engine, path) }
    }
}

impl Compiled for wasmtime::Module {
    fn compile(engine: &Engine, bytes: &[u8]) -> wasmtime::Result<Self> {
        wasmtime::Module::new(engine, bytes)
    }

    fn precompile(engine: &Engine, bytes: &[u8]) -> wasmtime::Result<Vec<u8>> {
        engine.precompile_module(bytes)
    }

    unsafe fn deserialize(engine: &Engine, bytes: &[u8]) -> wasmtime::Result<Self> {
        // SAFETY: as the caller promised.
        unsafe { wasmtime::Module::deserialize(engine, bytes) }
    }

    unsafe fn deserialize_file(engine: &Engine, path: &Path) -> wasmtime::Result<Self> {
        // SAFETY: as the caller promised.
        unsafe { wasmtime::Module::deserialize_file(engine, path) }
    }
}

/// What a module file is, and whether this agent can run it (`rules inspect --output json`
/// prints it).
#[derive(Debug, serde::Serialize)]
pub struct Inspection {
    /// SHA-256 of the file, in hex: what a policy's `sha256` must say.
    #[serde(rename = "sha256")]
    pub digest: String,
    /// What the agent takes the module for, and the ABI it must follow.
    pub kind: String,
    pub size: usize,
    pub imports: Vec<Item>,
    pub exports: Vec<Item>,
    /// Why this agent refuses to run it; None when it runs it.
    pub refused: Option<String>,
}

/// An import or export of a module.
#[derive(Debug, serde::Serialize)]
pub struct Item {
    pub name: String,
    /// function, interface, module or type for a component; core for a core module's.
    pub kind: &'static str,
}

impl std::fmt::Display for Item {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.name, self.kind)
    }
}

fn item_kind(item: &wasmtime::component::types::ComponentItem) -> &'static str {
    use wasmtime::component::types::ComponentItem;
    match item {
        ComponentItem::ComponentFunc(_) | ComponentItem::CoreFunc(_) => "function",
        ComponentItem::ComponentInstance(_) => "interface",
        ComponentItem::Module(_) | ComponentItem::Component(_) => "module",
        ComponentItem::Type(_) | ComponentItem::Resource(_) => "type",
    }
}

impl RuleHost {
    /// Reads the module at `path` and checks it against the ABI, without running it.
    pub fn inspect(&self, path: &Path) -> Result<Inspection, ModuleError> {
        let (bytes, digest) = read(path)?;
        self.inspect_bytes(path, &bytes, digest)
    }

    /// `inspect` of the module `bytes` (from `path`, which errors name; `digest`: theirs).
    pub(crate) fn inspect_bytes(
        &self,
        path: &Path,
        bytes: &[u8],
        digest: String,
    ) -> Result<Inspection, ModuleError> {
        let artifact = self.artifact(path, bytes, &digest)?;
        let (imports, exports) = match &artifact {
            Artifact::Rego(module) => (
                module
                    .imports()
                    .map(|import| Item {
                        name: format!("{}.{}", import.module(), import.name()),
                        kind: "core",
                    })
                    .collect(),
                module
                    .exports()
                    .map(|export| Item {
                        name: export.name().to_owned(),
                        kind: "core",
                    })
                    .collect(),
            ),
            Artifact::Component(component) => {
                let ty = component.component_type();
                let named =
                    |(name, item): (&str, wasmtime::component::types::ComponentExtern)| Item {
                        name: name.to_owned(),
                        kind: item_kind(&item.ty),
                    };
                (
                    ty.imports(&self.engine).map(named).collect(),
                    ty.exports(&self.engine).map(named).collect(),
                )
            }
        };
        let is_rego = matches!(artifact, Artifact::Rego(_));
        // Checked, not kept: inspecting a file does not load it.
        let admitted = self.check(path, digest.clone(), artifact);
        let kind = match admitted.as_ref().map(|module| &module.kind) {
            Ok(Kind::Rule(_)) => {
                format!("a rule module (component of palisade:rule@{ABI_VERSION})")
            }
            Ok(Kind::Transform(_)) => {
                format!("a model transform (component of palisade:rule@{ABI_VERSION})")
            }
            Ok(Kind::Rego(opa)) => format!("{} (Rego policy, OPA Wasm ABI 1.x)", opa.purpose()),
            Err(_) if is_rego => "a Rego policy (OPA Wasm ABI 1.x)".to_owned(),
            Err(_) => format!("a component, not of palisade:rule@{ABI_VERSION}"),
        };
        Ok(Inspection {
            kind,
            imports,
            exports,
            refused: admitted.err().map(|err| err.to_string()),
            size: bytes.len(),
            digest,
        })
    }
}

/// An instance of a module, for calls one after another. It may be kept for the `decide` calls
/// of one configuration: a module may keep state between them (its parsed configuration, say)
/// but cannot count on it, since an instance that fails is dropped and the next call gets a
/// fresh one. Every call has its own time budget; the memory limit holds for the instance's
/// whole life, so a module that leaks is stopped at the limit like one that grows at once.
pub struct ModuleInstance {
    store: Store<State>,
    running: Running,
}

enum Running {
    Rule {
        rule: Rule,
        /// Whether its `decide` reads the events' JSON.
        reads_json: bool,
    },
    Transform(ModelTransform),
    Rego(Box<OpaInstance>),
}

/// What a model transform answers when asked for a rule module's work.
fn not_a_rule_module() -> ModuleError {
    ModuleError::Refused(
        "the module is a model transform (palisade model transform), not a rule module".to_owned(),
    )
}

impl LoadedModule {
    /// A fresh instance.
    pub fn instantiate(&self) -> Result<ModuleInstance, ModuleError> {
        let mut store = store(&self.engine, &self.epoch);
        // Starting an instance runs module code too (a Rego policy sets up its data).
        let _ticking = set_budget(&mut store, DECIDE_BUDGET);
        let running = match &self.kind {
            Kind::Rule(pre) => pre.instantiate(&mut store).and_then(|rule| {
                let reads_json = rule.call_reads_json(&mut store)?;
                Ok(Running::Rule { rule, reads_json })
            }),
            Kind::Transform(pre) => pre.instantiate(&mut store).map(Running::Transform),
            Kind::Rego(opa) => opa
                .instantiate(&mut store)
                .map(|opa| Running::Rego(Box::new(opa))),
        }
        .map_err(ModuleError::failed)?;
        Ok(ModuleInstance { store, running })
    }

    /// The kernel rules the module makes of `config` (JSON), from a fresh instance.
    pub fn compile(&self, config: &str, context: &Context) -> Result<Vec<Entry>, ModuleError> {
        self.instantiate()?.compile(config, context)
    }

    /// The verdicts of a fresh instance on `events`: see `ModuleInstance::decide`.
    pub fn decide(&self, config: &str, events: &[Event<'_>]) -> Result<Vec<Verdict>, ModuleError> {
        self.instantiate()?.decide(config, events)
    }

    /// The model a fresh instance makes of `model`: see `ModuleInstance::transform`.
    pub fn transform(&self, config: &str, model: &str) -> Result<String, ModuleError> {
        self.instantiate()?.transform(config, model)
    }
}

/// A batch as a component's `decide` takes it: the events' strings in one text, and their
/// numbers and spans of the text in words; their JSON only if `json`.
fn pack<'a>(events: &[Event<'a>], json: bool) -> wire::Batch<'a> {
    let events = events.iter().map(|&event| wire::as_passed(event, json));
    let mut batch = wire::Batch::with_capacity(
        events.len(),
        events.clone().map(|event| wire::text_len(&event)).sum(),
    );
    for event in events {
        batch.push(&event);
    }
    batch
}

impl ModuleInstance {
    /// Whether `decide` reads the events' `json` (given "" otherwise): a component says so, a
    /// Rego policy's input is the whole event.
    pub fn reads_json(&self) -> bool {
        match &self.running {
            Running::Rule { reads_json, .. } => *reads_json,
            Running::Transform(_) => false,
            Running::Rego(_) => true,
        }
    }

    /// The kernel rules the module makes of `config` (JSON).
    pub fn compile(&mut self, config: &str, context: &Context) -> Result<Vec<Entry>, ModuleError> {
        let _ticking = set_budget(&mut self.store, COMPILE_BUDGET);
        let store = &mut self.store;
        match &self.running {
            Running::Rule { rule, .. } => rule.call_compile(store, config, context),
            Running::Transform(_) => return Err(not_a_rule_module()),
            Running::Rego(opa) if opa.is_transform() => return Err(not_a_rule_module()),
            Running::Rego(opa) => opa.compile(store, config, context),
        }
        .map_err(ModuleError::failed)?
        .map_err(ModuleError::Refused)
    }

    /// The model (JSON) a model transform makes of `model` (JSON) with `config` (JSON), within
    /// the compile budget.
    pub fn transform(&mut self, config: &str, model: &str) -> Result<String, ModuleError> {
        let _ticking = set_budget(&mut self.store, COMPILE_BUDGET);
        let store = &mut self.store;
        match &self.running {
            Running::Transform(transform) => transform.call_transform(store, config, model),
            Running::Rego(opa) if opa.is_transform() => opa.transform(store, config, model),
            Running::Rule { .. } | Running::Rego(_) => {
                return Err(ModuleError::Refused(
                    "the module is a rule module, not a model transform".to_owned(),
                ));
            }
        }
        .map_err(ModuleError::failed)?
        .map_err(ModuleError::Refused)
    }

    /// The module's verdicts on `events` of a policy that uses it with `config`, one each, in
    /// order. After an error the instance must not be called again.
    pub fn decide(
        &mut self,
        config: &str,
        events: &[Event<'_>],
    ) -> Result<Vec<Verdict>, ModuleError> {
        let _ticking = set_budget(&mut self.store, DECIDE_BUDGET);
        let store = &mut self.store;
        let verdicts = match &self.running {
            Running::Rule { rule, reads_json } => {
                let batch = pack(events, *reads_json);
                let packed = rule
                    .call_decide(store, config, &batch.text, &batch.words)
                    .map_err(ModuleError::failed)?;
                wire::unpack(&wire::Packed {
                    verdicts: packed.verdicts,
                    text: packed.text,
                    tags: packed.tags,
                    annotations: packed.annotations,
                })
                .map_err(|message| ModuleError::Failed {
                    kind: FailureKind::Malformed,
                    message: format!("verdicts: {message}"),
                })?
            }
            Running::Transform(_) => return Err(not_a_rule_module()),
            Running::Rego(opa) if opa.is_transform() => return Err(not_a_rule_module()),
            Running::Rego(opa) => opa
                .decide(store, config, events)
                .map_err(ModuleError::failed)?,
        };
        if verdicts.len() != events.len() {
            return Err(ModuleError::Failed {
                kind: FailureKind::Malformed,
                message: format!("{} verdicts for {} events", verdicts.len(), events.len()),
            });
        }
        Ok(verdicts)
    }
}

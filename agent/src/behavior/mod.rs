//! BehaviorModeling. While a policy in that mode runs its duration, the kernel records what its
//! targets do (ebpf/programs/model.h); each reconcile pass takes the records out and adds them
//! up here. When the duration ends, the policy is enforced without recording and, one pass
//! later (the programs that read the recording version have long finished), the model is
//! stored: as `POLICY.yaml` in the models directory for a policy file, as a
//! PalisadeBehaviorModel object in Kubernetes (crate::k8s). A policy whose complete model of the
//! same duration is stored is not modeled again when it is next enforced (the agent restarted,
//! the policy changed): remove the model, or change the duration, to model again.

mod allowlist;
mod diff;
mod model;
mod transform;

use std::{
    collections::HashMap,
    path::PathBuf,
    time::{Duration, Instant, SystemTime},
};

use tracing::{info, warn};

pub use allowlist::Allowlist;
pub use diff::ModelDiff;
use model::Recorded;
#[cfg(any(test, feature = "fake-kernel"))]
pub use model::file_record;
pub use model::{
    BehaviorModel, Counted, FileUse, ModelFileError, Transformation, collapse, load_model,
    save_model,
};
pub use transform::{TransformError, transform};

use crate::{
    bpf::EnforceError,
    policy::{CompiledPolicy, PolicySpec},
    targets::Enforce,
};

/// One policy's modeling of its target.
struct Session {
    model_id: u32,
    /// What the model says of where it came from.
    header: BehaviorModel,
    duration: Duration,
    started: Instant,
    recorded: Recorded,
    state: State,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// The kernel records into the model.
    Recording,
    /// Its policy no longer records (or is gone): the model is written at the next pass.
    Ending { complete: bool },
}

/// Where ended models go.
pub trait ModelStore {
    /// Whether a complete model of `policy` over `duration` is stored.
    fn has_complete(&self, policy: &str, duration: Duration) -> bool;
    /// Stores an ended model, or says why it cannot.
    fn store(&mut self, model: BehaviorModel);
}

/// The models of policy files: `DIR/POLICY.yaml` (the directory made when the first is written).
pub struct ModelDir(pub PathBuf);

impl ModelDir {
    fn file(&self, policy: &str) -> PathBuf {
        self.0.join(format!("{policy}.yaml"))
    }
}

impl ModelStore for ModelDir {
    fn has_complete(&self, policy: &str, duration: Duration) -> bool {
        load_model(&self.file(policy))
            .is_ok_and(|model| model.complete && model.duration_seconds == duration.as_secs())
    }

    fn store(&mut self, model: BehaviorModel) {
        let path = self.file(&model.policy);
        let written = std::fs::create_dir_all(&self.0)
            .map_err(|source| ModelFileError::Io {
                path: self.0.display().to_string(),
                source,
            })
            .and_then(|()| save_model(&model, &path));
        match written {
            Ok(()) => info!(
                policy = %model.policy,
                model = %path.display(),
                complete = model.complete,
                files = model.files.len(),
                lost = model.lost,
                "behaviour model written"
            ),
            Err(err) => warn!(policy = %model.policy, "the behaviour model is lost: {err}"),
        }
    }
}

/// The modeling sessions of one policy source, by subject (a policy file, or a policy object),
/// and where their models go.
pub struct Models<S> {
    store: S,
    sessions: HashMap<String, Session>,
    /// Sessions a new one replaced for their subject, to be written at the next pass.
    replaced: Vec<Session>,
}

impl<S: ModelStore> Models<S> {
    pub fn new(store: S) -> Self {
        Self {
            store,
            sessions: HashMap::new(),
            replaced: Vec::new(),
        }
    }

    pub fn store(&self) -> &S {
        &self.store
    }

    pub fn store_mut(&mut self) -> &mut S {
        &mut self.store
    }

    /// Whether `subject`'s policy models its target: recording, or its model not stored yet.
    pub fn modeling(&self, subject: &str) -> bool {
        self.sessions.contains_key(subject)
    }

    /// The model `subject`'s policy records into, while it records.
    pub fn recording(&self, subject: &str) -> Option<u32> {
        self.sessions
            .get(subject)
            .filter(|session| session.state == State::Recording)
            .map(|session| session.model_id)
    }

    /// `compiled`, the new version of `subject`'s policy, as it is to be enforced: recording into
    /// its model while it models its target. A policy newly in BehaviorModeling (or with another
    /// name or duration) starts a model, unless a complete one is already written; one that
    /// leaves the mode ends its model early.
    pub fn prepare(
        &mut self,
        subject: &str,
        target: &str,
        spec: &PolicySpec,
        compiled: CompiledPolicy,
        enforcer: &mut impl Enforce,
    ) -> Result<CompiledPolicy, EnforceError> {
        let Some(duration) = compiled.modeling() else {
            self.end(subject);
            return Ok(compiled);
        };
        if let Some(session) = self.sessions.get(subject)
            && session.header.policy == compiled.name()
            && session.duration == duration
        {
            return Ok(match session.state {
                State::Recording => compiled.recording_into(session.model_id),
                State::Ending { .. } => compiled,
            });
        }
        self.end(subject);
        if self.store.has_complete(compiled.name(), duration) {
            return Ok(compiled);
        }
        let model_id = enforcer.open_model()?;
        info!(
            subject,
            policy = compiled.name(),
            duration = %humantime::format_duration(duration),
            "modeling the target's behaviour"
        );
        let session = Session {
            model_id,
            header: BehaviorModel {
                policy: compiled.name().to_owned(),
                source: subject.to_owned(),
                spec: spec.clone(),
                target: target.to_owned(),
                started: humantime::format_rfc3339_seconds(SystemTime::now()).to_string(),
                duration_seconds: duration.as_secs(),
                ..BehaviorModel::default()
            },
            duration,
            started: Instant::now(),
            recorded: Recorded::default(),
            state: State::Recording,
        };
        self.sessions.insert(subject.to_owned(), session);
        Ok(compiled.recording_into(model_id))
    }

    /// Ends `subject`'s modeling early, if it is recording: its policy left the mode, changed
    /// name or duration, or is gone. (One already ending keeps its state.)
    fn end(&mut self, subject: &str) {
        if let Some(mut session) = self.sessions.remove(subject) {
            if session.state == State::Recording {
                session.state = State::Ending { complete: false };
            }
            self.replaced.push(session);
        }
    }

    /// Ends the modeling of the subjects not `wanted` (their policy files removed).
    pub fn end_unwanted(&mut self, wanted: impl Fn(&str) -> bool) {
        let unwanted: Vec<String> = self
            .sessions
            .keys()
            .filter(|subject| !wanted(subject))
            .cloned()
            .collect();
        for subject in unwanted {
            self.end(&subject);
        }
    }

    /// A pass's first step: takes the kernel's records into their models, writes the models
    /// that ended at the pass before, and ends those whose duration ran out (the pass then
    /// enforces their policies without recording).
    pub fn collect(&mut self, enforcer: &mut impl Enforce) {
        // No policy models its target: nothing to read the record map for (every pass would read
        // it whole).
        if self.sessions.is_empty() && self.replaced.is_empty() {
            return;
        }
        match enforcer.take_model_records() {
            Ok(records) => {
                for (key, count) in records {
                    let session = self
                        .sessions
                        .values_mut()
                        .chain(self.replaced.iter_mut())
                        .find(|session| session.model_id == key.model_id);
                    if let Some(session) = session {
                        session.recorded.add(&key, count);
                    }
                }
            }
            Err(err) => warn!("reading the kernel's behaviour records: {err}"),
        }
        let ended: Vec<String> = self
            .sessions
            .iter()
            .filter(|(_, session)| session.state != State::Recording)
            .map(|(subject, _)| subject.clone())
            .collect();
        let mut finished: Vec<Session> = self.replaced.drain(..).collect();
        finished.extend(
            ended
                .iter()
                .filter_map(|subject| self.sessions.remove(subject)),
        );
        for session in finished {
            let (model_id, model) = session.into_model();
            self.write(model_id, model, enforcer);
        }
        for session in self.sessions.values_mut() {
            if session.state == State::Recording && session.started.elapsed() >= session.duration {
                session.state = State::Ending { complete: true };
            }
        }
    }

    /// The agent stops: the models being recorded are written, incomplete (a restarted agent
    /// models their targets again).
    pub fn stop(&mut self, enforcer: &mut impl Enforce) {
        self.end_unwanted(|_| false);
        self.collect(enforcer);
    }

    /// Stores an ended session's model and closes the model in the kernel.
    fn write(&mut self, model_id: u32, model: BehaviorModel, enforcer: &mut impl Enforce) {
        self.store.store(model);
        if let Err(err) = enforcer.close_model(model_id) {
            warn!(
                model_id,
                "its records stay in the kernel until the agent restarts: {err}"
            );
        }
    }
}

impl Session {
    /// The model's id in the kernel, and the model as it ends now.
    fn into_model(self) -> (u32, BehaviorModel) {
        let complete = self.state == State::Ending { complete: true };
        let model = self.recorded.into_model(BehaviorModel {
            ended: humantime::format_rfc3339_seconds(SystemTime::now()).to_string(),
            complete,
            ..self.header
        });
        (self.model_id, model)
    }
}

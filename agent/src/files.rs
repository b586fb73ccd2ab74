//! `palisade agent --policy-dir DIR`: every policy file of a directory enforced on the cgroup
//! it names, following the files' changes and the cgroups that come and go; BehaviorModeling
//! policies model their targets (`behavior`).

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::Arc,
    time::SystemTime,
};

use tracing::error;

use crate::{
    behavior::{ModelDir, Models},
    metrics::Metrics,
    policy::{self, CompiledPolicy, Environment, Policy, PolicyError, Target},
    rules::RuleHost,
    targets::{Enforce, EnforcedSet, Entry, Hierarchy, Placement},
};

/// A change of the policy directory's files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Complete: a file written and closed, renamed, or removed. Reconcile now.
    Complete,
    /// A file written to and still open: wait (a bounded time) for its close.
    Partial,
}

/// The policy files of a directory and what of them is enforced.
pub struct PolicyDir {
    dir: PathBuf,
    cgroups: Hierarchy,
    /// By file; a version is the file's text.
    enforced: EnforcedSet<PathBuf, String>,
    environment: Environment,
    rule_host: RuleHost,
    metrics: Arc<Metrics>,
    /// Changes older than this were made before the agent watched: no apply latency for them.
    started: SystemTime,
    models: Models<ModelDir>,
}

fn is_policy_file(path: &Path) -> bool {
    matches!(
        path.extension().and_then(|ext| ext.to_str()),
        Some("yaml" | "yml")
    )
}

impl PolicyDir {
    /// What the watcher's `event` says of the policies. Opening and reading the files, as each
    /// reconcile does, changes nothing: woken by its own reads, the agent reconciled over and
    /// over, its event reader starved. A watcher error may hide any change.
    pub fn change(event: &notify::Result<notify::Event>) -> Option<Change> {
        use notify::{
            EventKind,
            event::{AccessKind, AccessMode, CreateKind, ModifyKind},
        };
        let Ok(event) = event else {
            return Some(Change::Complete);
        };
        match event.kind {
            EventKind::Access(AccessKind::Close(AccessMode::Write)) => Some(Change::Complete),
            EventKind::Access(_) => None,
            // Created or written, but still open: its close (or nothing, for a link) follows.
            EventKind::Create(CreateKind::File)
            | EventKind::Modify(ModifyKind::Data(_) | ModifyKind::Any) => Some(Change::Partial),
            // Renamed into or out of the directory (editors' and ConfigMaps' atomic
            // replacements), removed, or anything else.
            _ => Some(Change::Complete),
        }
    }

    pub fn new(
        dir: PathBuf,
        cgroups: Hierarchy,
        rule_host: RuleHost,
        metrics: Arc<Metrics>,
        models: Models<ModelDir>,
    ) -> Self {
        Self {
            dir,
            cgroups,
            enforced: EnforcedSet::default(),
            environment: Environment::from_process(),
            rule_host,
            metrics,
            started: SystemTime::now(),
            models,
        }
    }

    /// The policy in `file`, compiled, and where it goes.
    fn prepare(
        &self,
        file: &Path,
        text: &str,
    ) -> Result<(Policy, CompiledPolicy, Placement), PolicyError> {
        let policy = Policy::parse(file, text)?;
        let compiled = crate::rules::compile_policy(
            &self.rule_host,
            &file.display(),
            &self.dir,
            &policy,
            &self.environment,
        )?;
        let Some(target) = &policy.spec.target else {
            return Err(PolicyError::new(
                file.display(),
                "spec.target",
                "required by the agent",
            ));
        };
        let Target {
            cgroup_path: Some(cgroup_path),
            kind: None,
            names: None,
            selector: None,
            namespace_selector: None,
        } = target
        else {
            return Err(PolicyError::new(
                file.display(),
                "spec.target",
                "a policy file names a cgroupPath (kind, names and selectors choose pods in Kubernetes)",
            ));
        };
        let placement = Placement::locate(&self.cgroups, cgroup_path).map_err(|err| {
            PolicyError::new(file.display(), "spec.target.cgroupPath", err.to_string())
        })?;
        Ok((policy, compiled, placement))
    }

    /// Brings the kernel in line with the directory: new and changed files, removed files, and
    /// targets that appeared or were recreated since. A file that cannot be used is reported and
    /// its previous version, if any, stays enforced. Returns the errors not reported before.
    pub fn reconcile(&mut self, enforcer: &mut impl Enforce) -> Vec<String> {
        self.models.collect(enforcer);
        let mut errors = BTreeMap::new();
        match std::fs::read_dir(&self.dir) {
            Ok(entries) => {
                let mut files: Vec<PathBuf> = entries
                    .filter_map(|entry| Some(entry.ok()?.path()))
                    .filter(|path| is_policy_file(path))
                    .collect();
                files.sort();
                for file in &files {
                    if let Err(err) = self.sync_file(enforcer, file) {
                        let error = format!("{err}{}", self.kept(file));
                        errors.insert(file.display().to_string(), error);
                    }
                }
                self.enforced
                    .release_unwanted(|file| files.contains(file), enforcer, &mut errors);
                self.models.end_unwanted(|subject| {
                    files
                        .iter()
                        .any(|file| file.display().to_string() == subject)
                });
            }
            Err(err) => {
                let dir = self.dir.display().to_string();
                let error = format!("{dir}: cannot list: {err}; keeping every policy as it is");
                errors.insert(dir, error);
            }
        }
        let new_errors = self.enforced.report(errors);
        self.metrics.policies.set(self.enforced.count() as i64);
        self.metrics
            .policy_errors
            .set(self.enforced.errors() as i64);
        new_errors
    }

    /// `reconcile`, logging the errors.
    pub fn reconcile_and_report(&mut self, enforcer: &mut impl Enforce) {
        for err in self.reconcile(enforcer) {
            error!("{err}");
        }
    }

    /// The agent stops: models being recorded are written as they are.
    pub fn stop_modeling(&mut self, enforcer: &mut impl Enforce) {
        self.models.stop(enforcer);
    }

    /// Whether the last reconcile enforced every policy file as it is.
    pub fn all_enforced(&self) -> bool {
        self.enforced.all_enforced()
    }

    fn sync_file(&mut self, enforcer: &mut impl Enforce, file: &Path) -> Result<(), PolicyError> {
        let text = policy::read_file(file)?;
        // Unchanged, its target neither created nor recreated since, and recording its
        // target's behaviour if and only if modeling it.
        let recording = self.models.recording(&file.display().to_string());
        let up_to_date = self.enforced.get(file).is_some_and(|enforced| {
            enforced.version == text
                && enforced.placement.is_current(&self.cgroups)
                && enforced.compiled.model_id() == recording
        });
        if up_to_date {
            Ok(())
        } else {
            self.enforce(enforcer, file, text)
        }
    }

    fn kept(&self, file: &Path) -> &'static str {
        if self.enforced.get(file).is_some() {
            "; the previous version stays enforced"
        } else {
            "; not enforced"
        }
    }

    fn enforce(
        &mut self,
        enforcer: &mut impl Enforce,
        file: &Path,
        text: String,
    ) -> Result<(), PolicyError> {
        let (policy, compiled, placement) = self.prepare(file, &text)?;
        if let Some((other, _)) = self
            .enforced
            .iter()
            .find(|(other, enforced)| *other != file && enforced.placement == placement)
        {
            return Err(PolicyError::new(
                file.display(),
                "spec.target.cgroupPath",
                format!(
                    "{} already has a policy, from {}",
                    placement.describe(),
                    other.display()
                ),
            ));
        }
        let subject = file.display().to_string();
        let compiled = self
            .models
            .prepare(
                &subject,
                &placement.describe(),
                &policy.spec,
                compiled,
                enforcer,
            )
            .map_err(|err| {
                PolicyError::new(
                    file.display(),
                    "(kernel)",
                    format!("cannot record its target's behaviour: {err}"),
                )
            })?;
        let entry = Entry {
            subject,
            version: text,
            compiled: Arc::new(compiled),
            placement,
        };
        self.enforced
            .install(file.to_owned(), entry, enforcer)
            .map_err(|err| {
                PolicyError::new(file.display(), "(kernel)", format!("cannot install: {err}"))
            })?;
        if let Some(latency) = std::fs::metadata(file)
            .and_then(|metadata| metadata.modified())
            .ok()
            .filter(|changed| *changed >= self.started)
            .and_then(|changed| changed.elapsed().ok())
        {
            self.metrics.apply_seconds.observe(latency.as_secs_f64());
        }
        Ok(())
    }
}

#[cfg(test)]
mod hostile_inputs;

#[cfg(test)]
mod tests {
    use palisade_common::{HOOK_FILE_OPEN, MODEL_OVERFLOW, ModelKey, PERM_READ};

    use super::*;
    use crate::{
        behavior::{BehaviorModel, file_record, load_model},
        targets::FakeKernel,
    };

    #[test]
    fn only_a_change_of_the_directory_wakes_the_agent_and_a_complete_one_at_once() {
        use notify::{
            Event, EventKind,
            event::{
                AccessKind, AccessMode, CreateKind, DataChange, ModifyKind, RemoveKind, RenameMode,
            },
        };
        let change = |kind| PolicyDir::change(&Ok(Event::new(kind)));
        for read in [
            AccessKind::Open(AccessMode::Any),
            AccessKind::Read,
            AccessKind::Close(AccessMode::Read),
        ] {
            assert_eq!(change(EventKind::Access(read)), None, "{read:?}");
        }
        for partial in [
            EventKind::Create(CreateKind::File),
            EventKind::Modify(ModifyKind::Data(DataChange::Any)),
            EventKind::Modify(ModifyKind::Any),
        ] {
            assert_eq!(change(partial), Some(Change::Partial), "{partial:?}");
        }
        for complete in [
            EventKind::Access(AccessKind::Close(AccessMode::Write)),
            EventKind::Modify(ModifyKind::Name(RenameMode::To)),
            EventKind::Modify(ModifyKind::Name(RenameMode::From)),
            EventKind::Remove(RemoveKind::File),
        ] {
            assert_eq!(change(complete), Some(Change::Complete), "{complete:?}");
        }
        assert_eq!(
            PolicyDir::change(&Err(notify::Error::generic("queue overflow"))),
            Some(Change::Complete)
        );
    }

    /// A fresh agent's view of the test directory `base`.
    fn policy_dir(base: &Path) -> PolicyDir {
        let cgroups = Hierarchy::at(base.join("cgroup"), Path::new("/"));
        let host = RuleHost::new(None).unwrap();
        let models = Models::new(ModelDir(base.join("models")));
        PolicyDir::new(base.join("policies"), cgroups, host, Arc::default(), models)
    }

    /// A policy directory and a cgroup tree under a test directory, and a fake kernel.
    pub(super) struct Setup {
        pub(super) base: PathBuf,
        policies: PolicyDir,
        kernel: FakeKernel,
    }

    impl Setup {
        pub(super) fn new(name: &str) -> Self {
            let base = std::env::temp_dir()
                .join(format!("palisade-agent-test-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&base);
            std::fs::create_dir_all(base.join("policies")).unwrap();
            std::fs::create_dir_all(base.join("cgroup/app")).unwrap();
            std::fs::create_dir_all(base.join("cgroup/other")).unwrap();
            Self {
                policies: policy_dir(&base),
                base,
                kernel: FakeKernel::default(),
            }
        }

        pub(super) fn write(&self, file: &str, name: &str, cgroup: &str) {
            self.write_mode(file, name, cgroup, "RuntimeDefault");
        }

        /// A policy file whose spec ends with `mode: MODE` (and what follows it).
        fn write_mode(&self, file: &str, name: &str, cgroup: &str, mode: &str) {
            let text = format!(
                "apiVersion: palisade.dev/v1alpha1\nkind: PalisadePolicy\nmetadata:\n  name: {name}\nspec:\n  target:\n    cgroupPath: {cgroup}\n  mode: {mode}\n"
            );
            std::fs::write(self.base.join("policies").join(file), text).unwrap();
        }

        /// app.yaml: policy "web" modeling the cgroup "app" for `duration`, `more` ending its
        /// spec.
        fn write_modeling(&self, duration: &str, more: &str) {
            let mode =
                format!("BehaviorModeling\n  behaviorModeling: {{duration: {duration}}}{more}");
            self.write_mode("app.yaml", "web", "app", &mode);
        }

        /// The model the policy on `cgroup` records into.
        fn recording(&self, cgroup: &str) -> Option<u32> {
            self.kernel.enforced.get(&self.id(cgroup))?.model_id()
        }

        fn model(&self, policy: &str) -> BehaviorModel {
            load_model(&self.base.join(format!("models/{policy}.yaml"))).unwrap()
        }

        pub(super) fn reconcile(&mut self) -> Vec<String> {
            let errors = self.policies.reconcile(&mut self.kernel);
            // Paths differ per run: compare errors relative to the test directory.
            errors
                .into_iter()
                .map(|err| err.replace(&self.base.display().to_string(), ""))
                .collect()
        }

        fn id(&self, cgroup: &str) -> u64 {
            self.policies.cgroups.open(cgroup).unwrap().id
        }

        pub(super) fn enforced(&self, cgroup: &str) -> Option<&str> {
            self.kernel
                .enforced
                .get(&self.id(cgroup))
                .map(|policy| policy.name())
        }
    }

    impl Drop for Setup {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.base);
        }
    }

    #[test]
    fn follows_added_replaced_and_removed_files() {
        let mut setup = Setup::new("follow");
        setup.write("app.yaml", "v1", "app");
        std::fs::write(setup.base.join("policies/notes.txt"), "not a policy").unwrap();
        assert!(setup.reconcile().is_empty());
        assert_eq!(setup.enforced("app"), Some("v1"));
        setup.write("app.yaml", "v2", "app");
        assert!(setup.reconcile().is_empty());
        assert_eq!(setup.enforced("app"), Some("v2"));
        // Moving the policy to another target releases the first.
        setup.write("app.yaml", "v3", "other");
        assert!(setup.reconcile().is_empty());
        assert_eq!(setup.enforced("app"), None);
        assert_eq!(setup.enforced("other"), Some("v3"));
        std::fs::remove_file(setup.base.join("policies/app.yaml")).unwrap();
        assert!(setup.reconcile().is_empty());
        assert!(setup.kernel.enforced.is_empty());
    }

    #[test]
    fn a_broken_file_keeps_its_previous_version() {
        let mut setup = Setup::new("broken");
        setup.write("app.yaml", "v1", "app");
        setup.reconcile();
        std::fs::write(setup.base.join("policies/app.yaml"), "apiVersion: palisade.dev/v1alpha1\nkind: PalisadePolicy\nmetadata: {name: v2}\nspec: {mode: AlwaysAllow, rulez: []}\n").unwrap();
        assert_eq!(
            setup.reconcile(),
            [
                "/policies/app.yaml: spec: unknown field `rulez`, expected one of `target`, `mode`, `enhanceProtect`, `behaviorModeling`, `defenseInDepth`, `ruleModules` at line 4 column 27; the previous version stays enforced"
            ]
        );
        assert_eq!(setup.enforced("app"), Some("v1"));
    }

    #[test]
    fn a_missing_target_or_a_taken_one_is_not_enforced() {
        let mut setup = Setup::new("targets");
        setup.write("a.yaml", "a", "app");
        setup.write("b.yaml", "b", "app");
        setup.write("c.yaml", "c", "gone/deeper");
        assert_eq!(
            setup.reconcile(),
            [
                "/policies/b.yaml: spec.target.cgroupPath: /cgroup/app already has a policy, from /policies/a.yaml; not enforced",
                "/policies/c.yaml: spec.target.cgroupPath: cgroup /cgroup/gone/deeper does not exist; not enforced",
            ]
        );
        assert_eq!(setup.enforced("app"), Some("a"));
    }

    #[test]
    fn a_target_not_created_yet_is_armed_then_enforced() {
        let mut setup = Setup::new("later");
        setup.write("late.yaml", "late", "app/late");
        assert!(setup.reconcile().is_empty());
        let staged = (setup.id("app"), "late".to_owned());
        assert_eq!(
            setup.kernel.staged.get(&staged).map(|policy| policy.name()),
            Some("late")
        );
        assert!(setup.policies.all_enforced());
        std::fs::create_dir(setup.base.join("cgroup/app/late")).unwrap();
        assert!(setup.reconcile().is_empty());
        assert_eq!(setup.enforced("app/late"), Some("late"));
        assert!(setup.kernel.staged.is_empty(), "armed no longer");
        // Deleted again: armed again for the next one.
        std::fs::remove_dir(setup.base.join("cgroup/app/late")).unwrap();
        assert!(setup.reconcile().is_empty());
        assert_eq!(
            setup.kernel.staged.get(&staged).map(|policy| policy.name()),
            Some("late")
        );
        std::fs::remove_file(setup.base.join("policies/late.yaml")).unwrap();
        assert!(setup.reconcile().is_empty());
        assert!(setup.kernel.staged.is_empty());
    }

    #[test]
    fn a_lasting_error_is_reported_once() {
        let mut setup = Setup::new("once");
        setup.write("late.yaml", "late", "nowhere/late");
        assert_eq!(
            setup.reconcile(),
            [
                "/policies/late.yaml: spec.target.cgroupPath: cgroup /cgroup/nowhere/late does not exist; not enforced"
            ]
        );
        assert!(setup.reconcile().is_empty(), "reported once");
        assert!(!setup.policies.all_enforced());
    }

    #[test]
    fn a_kernel_error_keeps_the_previous_version() {
        let mut setup = Setup::new("kernel-error");
        setup.write("app.yaml", "v1", "app");
        setup.reconcile();
        setup.kernel.fail = true;
        setup.write("app.yaml", "v2", "app");
        let errors = setup.reconcile();
        assert_eq!(errors.len(), 1);
        assert!(
            errors[0].starts_with("/policies/app.yaml: (kernel): cannot install: "),
            "{errors:?}"
        );
        assert!(errors[0].ends_with("; the previous version stays enforced"));
        assert_eq!(setup.enforced("app"), Some("v1"));
        // Once the kernel accepts it, the retry happens at the next reconcile.
        setup.kernel.fail = false;
        assert!(setup.reconcile().is_empty());
        assert_eq!(setup.enforced("app"), Some("v2"));
    }

    /// A record of the file `path` opened for reading, in model `model_id`.
    fn read_record(model_id: u32, path: &str) -> ModelKey {
        file_record(model_id, HOOK_FILE_OPEN, path, PERM_READ)
    }

    #[test]
    fn a_modeled_target_is_recorded_for_its_duration_then_its_model_is_written() {
        let mut setup = Setup::new("modeling");
        setup.write_modeling("1s", "");
        assert!(setup.reconcile().is_empty());
        let model_id = setup.recording("app").expect("recording");
        assert!(setup.kernel.models.contains(&model_id));

        setup.kernel.records = vec![(read_record(model_id, "/etc/hosts"), 2)];
        assert!(setup.reconcile().is_empty());
        std::thread::sleep(std::time::Duration::from_millis(1100));
        let overflow = ModelKey {
            model_id,
            kind: MODEL_OVERFLOW,
            ..ModelKey::default()
        };
        setup.kernel.records = vec![(read_record(model_id, "/etc/hosts"), 1), (overflow, 3)];
        assert!(setup.reconcile().is_empty());
        assert_eq!(setup.recording("app"), None, "enforced without recording");
        assert!(
            setup.kernel.models.contains(&model_id),
            "open until the next pass"
        );

        assert!(setup.reconcile().is_empty());
        assert!(!setup.kernel.models.contains(&model_id), "closed");
        let model = setup.model("web");
        assert!(model.complete);
        assert_eq!(model.duration_seconds, 1);
        assert_eq!(
            model.target,
            setup.base.join("cgroup/app").display().to_string()
        );
        assert_eq!(model.lost, 3);
        assert_eq!(model.files.len(), 1);
        assert_eq!(model.files[0].path, "/etc/hosts");
        assert_eq!(model.files[0].count, 3);

        // A complete model is not made again, by this agent or the next.
        setup.write_modeling("1s", "\n  ruleModules: []");
        assert!(setup.reconcile().is_empty());
        assert_eq!(setup.recording("app"), None);
        setup.policies = policy_dir(&setup.base);
        assert!(setup.reconcile().is_empty());
        assert_eq!(setup.recording("app"), None);
        // Another duration is another model.
        setup.write_modeling("5m", "");
        assert!(setup.reconcile().is_empty());
        assert!(setup.recording("app").is_some());
    }

    #[test]
    fn a_modeling_cut_short_writes_an_incomplete_model() {
        let mut setup = Setup::new("modeling-cut");
        setup.write_modeling("1h", "");
        setup.reconcile();
        let model_id = setup.recording("app").expect("recording");
        setup.kernel.records = vec![(read_record(model_id, "/etc/hosts"), 1)];
        setup.write("app.yaml", "web", "app");
        assert!(setup.reconcile().is_empty());
        assert_eq!(
            setup.recording("app"),
            None,
            "RuntimeDefault records nothing"
        );
        setup.reconcile();
        let model = setup.model("web");
        assert!(!model.complete);
        assert_eq!(model.files[0].path, "/etc/hosts");
        assert!(setup.kernel.models.is_empty());

        setup.write_modeling("1h", "");
        setup.reconcile();
        assert!(
            setup.recording("app").is_some(),
            "an incomplete model is made again"
        );
        std::fs::remove_file(setup.base.join("policies/app.yaml")).unwrap();
        setup.reconcile();
        setup.reconcile();
        assert!(setup.kernel.models.is_empty(), "closed when its file went");
    }
}

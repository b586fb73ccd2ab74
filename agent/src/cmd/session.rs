//! What `run` and `agent` share: the loaded programs, the flow of events to their sink, and the
//! accounting of anything lost on the way.

use std::{
    path::Path,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::Context;
use tracing::warn;

use crate::{
    bpf::{Enforcer, ProtectedFiles, Stats},
    events::{
        Deciding, Decoder, EventQueue, EventReader, EventWorker, JsonLines, RotatingFile, Rotation,
        Sink,
    },
    metrics::AgentEventCounts,
    targets::PodRegistry,
};

/// How long a stopping agent goes on writing the events already submitted.
const STOP_WRITING: Duration = Duration::from_secs(5);

pub struct Session {
    pub enforcer: Enforcer,
    reader: EventReader,
    queue: Arc<EventQueue>,
    worker: EventWorker,
    /// The sinks' names, in the order the worker holds them.
    sink_names: Vec<String>,
    /// The last read stopped at its limit: read again without waiting.
    backlog: bool,
    /// Losses already reported.
    reported: Losses,
}

#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Losses {
    kernel: Stats,
    undecodable: u64,
    overflowed: u64,
    /// By sink name, in the order of `sink_names`.
    sinks: Vec<(String, u64)>,
}

/// JSON lines into `events` (appended to, rotated by size if `rotation` says so, and kept from
/// targets through `protected`), or into `default_sink`.
pub fn json_sink(
    events: Option<&Path>,
    rotation: Option<Rotation>,
    protected: &ProtectedFiles,
    default_sink: JsonLines,
) -> anyhow::Result<JsonLines> {
    let Some(path) = events else {
        return Ok(default_sink);
    };
    let file = RotatingFile::open(
        path,
        rotation.unwrap_or(Rotation::NEVER),
        Some(protected.clone()),
    )
    .with_context(|| format!("opening the event file {}", path.display()))?;
    Ok(JsonLines::new(path.display().to_string(), Box::new(file)))
}

impl Session {
    /// Forbids targets to change what enforcement depends on: this executable and `files` (the
    /// event file protects its own).
    pub fn protect_own_files(&mut self, files: &[&Path]) -> anyhow::Result<()> {
        let exe = std::env::current_exe().context("finding this executable")?;
        for path in std::iter::once(exe.as_path()).chain(files.iter().copied()) {
            self.enforcer.protect(path)?;
        }
        Ok(())
    }

    /// Reads `enforcer`'s events and starts the worker that has `deciding` apply their rule
    /// modules' verdicts and writes them to `sinks`.
    pub fn start(
        mut enforcer: Enforcer,
        deciding: Deciding,
        sinks: Vec<Box<dyn Sink>>,
        pods: PodRegistry,
    ) -> anyhow::Result<Self> {
        let ring = enforcer
            .take_events()
            .context("the event ring buffer is missing")?;
        let queue = Arc::new(EventQueue::default());
        let reader = EventReader::new(ring, queue.clone())?;
        let sink_names = sinks.iter().map(|sink| sink.name().to_owned()).collect();
        let decoder = Decoder::new(enforcer.registry(), pods);
        let worker = EventWorker::start(queue.clone(), decoder, deciding, sinks)
            .context("starting the event worker")?;
        Ok(Self {
            enforcer,
            reader,
            queue,
            worker,
            sink_names,
            backlog: false,
            reported: Losses::default(),
        })
    }

    /// Resolves when there are events to `pump`.
    pub async fn events_ready(&mut self) -> std::io::Result<()> {
        if self.backlog {
            tokio::task::yield_now().await;
            Ok(())
        } else {
            self.reader.ready().await
        }
    }

    /// Moves the kernel's events into the worker's queue.
    pub fn pump(&mut self) {
        self.backlog = !self.reader.read().emptied;
    }

    /// When stopping: has the worker write the events the kernel submitted, for at most
    /// `STOP_WRITING` (a flood that goes on cannot hold the agent up), then stops it. What is left
    /// unread is reported.
    pub fn stop_events(&mut self) {
        let deadline = Instant::now() + STOP_WRITING;
        loop {
            let handled = self.queue.wait_until_handled(Duration::from_millis(50));
            if self.reader.read().records == 0 && handled {
                break;
            }
            if Instant::now() >= deadline {
                warn!(
                    queued = self.queue.counts().queued,
                    "stopping with audit events unread (those queued, and the ring buffer's): \
                     a flood outlasted the time given to write them"
                );
                break;
            }
        }
        self.worker.stop();
        self.backlog = false;
    }

    /// Errs when the event worker stopped on its own (it panicked): events would pile up unread.
    pub fn check_worker(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.worker.is_running(),
            "the event worker stopped: audit events are no longer written"
        );
        Ok(())
    }

    /// What became of the events read from the ring buffer.
    pub fn event_counts(&self) -> AgentEventCounts {
        self.queue.counts()
    }

    /// Events each sink failed to deliver, by sink name.
    pub fn sink_losses(&self) -> Vec<(String, u64)> {
        self.sink_names
            .iter()
            .cloned()
            .zip(self.queue.sink_losses())
            .collect()
    }

    /// Warns about events lost or suppressed since the last report: never silent.
    pub fn report_losses(&mut self) {
        let kernel = match self.enforcer.stats() {
            Ok(stats) => stats,
            Err(err) => {
                warn!("reading the kernel's counters: {err}");
                return;
            }
        };
        let counts = self.queue.counts();
        let now = Losses {
            kernel,
            undecodable: counts.undecodable,
            overflowed: counts.overflowed,
            sinks: self.sink_losses(),
        };
        let before = std::mem::replace(&mut self.reported, now.clone());
        for (index, (sink, total)) in now.sinks.iter().enumerate() {
            let total = *total;
            let reported = before.sinks.get(index).map_or(0, |(_, lost)| *lost);
            if total > reported {
                warn!(
                    new = total - reported,
                    total, sink, "audit events lost by a sink"
                );
            }
        }
        let losses = [
            (
                "audit events dropped in the kernel: the ring buffer was full",
                now.kernel.events_dropped,
                before.kernel.events_dropped,
            ),
            (
                "audit events suppressed by the audit rate (the decisions were made; \
                 palisade_rule_events_throttled_total counts them by rule)",
                now.kernel.events_throttled,
                before.kernel.events_throttled,
            ),
            (
                "decisions not counted by rule: the kernel's counter map is full",
                now.kernel.uncounted,
                before.kernel.uncounted,
            ),
            (
                "behaviour records lost: the record map full, the model already closed",
                now.kernel.model_dropped,
                before.kernel.model_dropped,
            ),
            (
                "operations on targets allowed undecided: their path could not be resolved",
                now.kernel.undecided,
                before.kernel.undecided,
            ),
            (
                "ring buffer records that are not events of this version",
                now.undecodable,
                before.undecodable,
            ),
            (
                "audit events dropped by the agent: a flood outran the sinks (the oldest went)",
                now.overflowed,
                before.overflowed,
            ),
        ];
        for (what, total, reported) in losses {
            let new = total.saturating_sub(reported);
            if new > 0 {
                warn!(new, total, "{what}");
            }
        }
    }
}

//! What `run` and `agent` share: the loaded programs, the flow of events to their sink, and the
//! accounting of anything lost on the way.

use std::{
    fs::OpenOptions,
    io::Write,
    path::Path,
    time::{Duration, Instant},
};

use anyhow::Context;
use tracing::warn;

use crate::{
    bpf::{Enforcer, Stats},
    events::{Deciding, Decoder, EventReader, JsonLines, RotatingFile, Rotation, Sink},
    metrics::AgentEventCounts,
    targets::PodRegistry,
};

/// How long a stopping agent goes on writing the events already submitted.
const STOP_WRITING: Duration = Duration::from_secs(5);

pub struct Session {
    pub enforcer: Enforcer,
    events: EventReader,
    sinks: Vec<Box<dyn Sink>>,
    /// The last drain stopped at its batch limit: drain again without waiting.
    backlog: bool,
    /// Losses already reported.
    reported: Losses,
}

#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Losses {
    kernel: Stats,
    undecodable: u64,
    overflowed: u64,
    /// By sink, in the order of `sinks`.
    sinks: Vec<u64>,
}

impl Session {
    /// Forbids targets to change what enforcement depends on: this executable and `files`.
    pub fn protect_own_files(&mut self, files: &[&Path]) -> anyhow::Result<()> {
        let exe = std::env::current_exe().context("finding this executable")?;
        for path in std::iter::once(exe.as_path()).chain(files.iter().copied()) {
            self.enforcer.protect(path)?;
        }
        Ok(())
    }

    /// Reads `enforcer`'s events, has `deciding` apply their rule modules' verdicts, and writes
    /// them as JSON lines into `events` (appended to, and rotated by size if `rotation` says so)
    /// or into `default_sink`.
    pub fn start(
        mut enforcer: Enforcer,
        deciding: Deciding,
        events: Option<&Path>,
        rotation: Option<Rotation>,
        default_sink: JsonLines,
        pods: PodRegistry,
    ) -> anyhow::Result<Self> {
        let sink = match events {
            None => default_sink,
            Some(path) => {
                let opening = || format!("opening the event file {}", path.display());
                let writer: Box<dyn Write + Send> = match rotation {
                    Some(rotation) => {
                        Box::new(RotatingFile::open(path, rotation).with_context(opening)?)
                    }
                    None => Box::new(
                        OpenOptions::new()
                            .create(true)
                            .append(true)
                            .open(path)
                            .with_context(opening)?,
                    ),
                };
                JsonLines::new(path.display().to_string(), writer)
            }
        };
        let ring = enforcer
            .take_events()
            .context("the event ring buffer is missing")?;
        let events = EventReader::new(ring, Decoder::new(enforcer.registry(), pods), deciding)?;
        Ok(Self {
            enforcer,
            events,
            sinks: vec![Box::new(sink)],
            backlog: false,
            reported: Losses::default(),
        })
    }

    /// Sends every event to `sink` too.
    pub fn add_sink(&mut self, sink: Box<dyn Sink>) {
        self.sinks.push(sink);
    }

    /// Resolves when there are events to `pump`.
    pub async fn events_ready(&mut self) -> std::io::Result<()> {
        if self.backlog {
            tokio::task::yield_now().await;
            Ok(())
        } else {
            self.events.ready().await
        }
    }

    /// Writes a batch of events to the sink.
    pub fn pump(&mut self) {
        self.backlog = self.events.drain(&mut self.sinks);
    }

    /// Hands the pending events to the sinks when stopping, for at most `STOP_WRITING`: a flood
    /// that goes on cannot hold the agent up. What is left unread is reported.
    pub fn pump_all(&mut self) {
        let deadline = Instant::now() + STOP_WRITING;
        while self.events.drain(&mut self.sinks) {
            if Instant::now() >= deadline {
                warn!(
                    queued = self.events.queued(),
                    "stopping with audit events unread (those queued, and the ring buffer's): \
                     a flood outlasted the time given to write them"
                );
                break;
            }
        }
        self.backlog = false;
    }

    /// What became of the events read from the ring buffer.
    pub fn event_counts(&self) -> AgentEventCounts {
        AgentEventCounts {
            written: self.events.written,
            overflowed: self.events.overflowed,
            undecodable: self.events.undecodable,
            queued: self.events.queued() as u64,
        }
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
        let now = Losses {
            kernel,
            undecodable: self.events.undecodable,
            overflowed: self.events.overflowed,
            sinks: self.sinks.iter().map(|sink| sink.lost()).collect(),
        };
        let before = std::mem::replace(&mut self.reported, now.clone());
        for (index, sink) in self.sinks.iter().enumerate() {
            let (total, reported) = (
                now.sinks[index],
                before.sinks.get(index).copied().unwrap_or(0),
            );
            if total > reported {
                warn!(
                    new = total - reported,
                    total,
                    sink = sink.name(),
                    "audit events lost by a sink"
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

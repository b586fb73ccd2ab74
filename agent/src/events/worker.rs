//! The event worker: a thread of its own that takes batches from the queue, names them, has rule
//! modules decide them and hands those kept to the sinks. A module that burns its whole budget
//! holds up only this thread: the control runtime goes on serving `/metrics`, reconciling
//! policies and reading the ring buffer (into the queue, whose overflow is counted).

use std::{sync::Arc, thread::JoinHandle};

use super::{Deciding, Decoder, EventQueue, Sink};

/// Events decided and written per batch: one call per rule module.
const BATCH: usize = 1024;

pub struct EventWorker {
    queue: Arc<EventQueue>,
    thread: Option<JoinHandle<()>>,
}

impl EventWorker {
    pub fn start(
        queue: Arc<EventQueue>,
        decoder: Decoder,
        mut deciding: Deciding,
        mut sinks: Vec<Box<dyn Sink>>,
    ) -> std::io::Result<Self> {
        let taking = queue.clone();
        let thread = std::thread::Builder::new()
            .name("events".to_owned())
            .spawn(move || {
                // Both kept from batch to batch, with their capacity.
                let mut batch = Vec::with_capacity(BATCH);
                let mut decoded = Vec::with_capacity(BATCH);
                while taking.take(&mut batch, BATCH) {
                    decoder.decode(&batch, &mut decoded);
                    let failures = deciding.apply(&mut decoded);
                    let mut written = 0;
                    for kept in decoded.iter().filter(|decoded| decoded.keep) {
                        for sink in sinks.iter_mut() {
                            sink.send(&kept.event);
                        }
                        written += 1;
                    }
                    for failure in &failures {
                        for sink in sinks.iter_mut() {
                            sink.report(failure);
                        }
                    }
                    for sink in sinks.iter_mut() {
                        sink.flush();
                    }
                    let losses = sinks.iter().map(|sink| sink.lost()).collect();
                    taking.done(written, losses);
                    decoded.clear();
                }
            })?;
        Ok(Self {
            queue,
            thread: Some(thread),
        })
    }

    /// False once the worker has stopped: asked to, or it panicked.
    pub fn is_running(&self) -> bool {
        self.thread
            .as_ref()
            .is_some_and(|thread| !thread.is_finished())
    }

    /// Stops the worker after its batch in flight; what is still queued stays unwritten.
    pub fn stop(&mut self) {
        self.queue.close();
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::error!("the event worker panicked");
        }
    }
}

impl Drop for EventWorker {
    fn drop(&mut self) {
        self.stop();
    }
}

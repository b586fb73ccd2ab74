//! The bounded queue between the ring buffer's reader (on the control runtime) and the event
//! worker (its own thread), and the accounting of every event that passes through it.

use std::{
    collections::VecDeque,
    sync::{Condvar, Mutex, MutexGuard},
    time::Duration,
};

use palisade_common::Event;

use crate::metrics::AgentEventCounts;

/// Events copied out of the ring buffer and not handled yet, at most. The reader empties the
/// ring buffer into this queue whatever the worker is doing, so that the kernel keeps room for
/// what happens next; beyond it the oldest are dropped, counted.
pub const QUEUE: usize = 8 * 1024;

#[derive(Default)]
pub struct EventQueue {
    state: Mutex<State>,
    /// Signalled when events arrive, when a batch is done and when the queue closes.
    changed: Condvar,
}

#[derive(Default)]
struct State {
    events: VecDeque<Event>,
    /// Taken by the worker and not yet handed to the sinks.
    in_flight: usize,
    counts: AgentEventCounts,
    /// Events each sink has lost so far, in the order of the sinks.
    sink_losses: Vec<u64>,
    /// The worker stops after the batch in flight.
    closed: bool,
}

impl EventQueue {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A worker that panicked leaves consistent counts: use them.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Adds `events` (each `None` a record that is not an event of this version), dropping the
    /// oldest when full, and wakes the worker.
    pub fn push(&self, events: impl IntoIterator<Item = Option<Event>>) {
        let mut state = self.lock();
        for event in events {
            let Some(event) = event else {
                state.counts.undecodable += 1;
                continue;
            };
            if state.events.len() == QUEUE {
                state.events.pop_front();
                state.counts.overflowed += 1;
            }
            state.events.push_back(event);
        }
        drop(state);
        self.changed.notify_all();
    }

    /// Waits for events and moves up to `limit` of them into `batch` (emptied first); false
    /// once the queue is closed.
    pub fn take(&self, batch: &mut Vec<Event>, limit: usize) -> bool {
        batch.clear();
        let mut state = self
            .changed
            .wait_while(self.lock(), |state| {
                state.events.is_empty() && !state.closed
            })
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if state.closed {
            return false;
        }
        let count = state.events.len().min(limit);
        batch.extend(state.events.drain(..count));
        state.in_flight = count;
        true
    }

    /// The batch taken last is handled: `written` of its events went to the sinks (the others
    /// were dropped by rule modules), which have lost `sink_losses` so far.
    pub fn done(&self, written: usize, sink_losses: Vec<u64>) {
        let mut state = self.lock();
        state.in_flight = 0;
        state.counts.written += written as u64;
        state.sink_losses = sink_losses;
        drop(state);
        self.changed.notify_all();
    }

    /// Waits up to `timeout` for every event pushed to be handled; returns whether they are.
    pub fn wait_until_handled(&self, timeout: Duration) -> bool {
        let (state, _) = self
            .changed
            .wait_timeout_while(self.lock(), timeout, |state| {
                !state.events.is_empty() || state.in_flight > 0
            })
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        state.events.is_empty() && state.in_flight == 0
    }

    /// Tells the worker to stop after its batch in flight.
    pub fn close(&self) {
        self.lock().closed = true;
        self.changed.notify_all();
    }

    /// What became of the events pushed.
    pub fn counts(&self) -> AgentEventCounts {
        let state = self.lock();
        AgentEventCounts {
            queued: (state.events.len() + state.in_flight) as u64,
            ..state.counts.clone()
        }
    }

    pub fn sink_losses(&self) -> Vec<u64> {
        self.lock().sink_losses.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::Decoder;

    fn event(pid: u32) -> Option<Event> {
        let mut event = Decoder::read(&[0; size_of::<Event>()])?;
        event.pid = pid;
        Some(event)
    }

    #[test]
    fn a_full_queue_drops_the_oldest_and_counts_every_event() {
        let queue = EventQueue::default();
        queue.push((0..QUEUE as u32 + 3).map(event));
        queue.push([None]);
        let counts = queue.counts();
        assert_eq!(
            (counts.overflowed, counts.undecodable, counts.queued),
            (3, 1, QUEUE as u64)
        );
        let mut batch = Vec::new();
        assert!(queue.take(&mut batch, 10));
        assert_eq!(
            batch.first().map(|event| event.pid),
            Some(3),
            "the oldest went"
        );
        // Taken and not yet written: still queued.
        assert_eq!(queue.counts().queued, QUEUE as u64);
        assert!(!queue.wait_until_handled(Duration::ZERO));
        queue.done(7, vec![2]);
        let counts = queue.counts();
        assert_eq!((counts.written, counts.queued), (7, QUEUE as u64 - 10));
        assert_eq!(queue.sink_losses(), [2]);
    }

    #[test]
    fn a_closed_queue_stops_the_worker_with_the_rest_still_counted() {
        let queue = EventQueue::default();
        queue.push((0..5).map(event));
        let mut batch = Vec::new();
        assert!(queue.take(&mut batch, 2));
        queue.done(2, Vec::new());
        queue.close();
        assert!(!queue.take(&mut batch, 2));
        assert!(batch.is_empty());
        assert_eq!(queue.counts().queued, 3);
    }

    #[test]
    fn the_worker_wakes_for_events_and_is_seen_done() {
        let queue = std::sync::Arc::new(EventQueue::default());
        let worker = {
            let queue = queue.clone();
            std::thread::spawn(move || {
                let mut batch = Vec::new();
                let mut taken = 0;
                while queue.take(&mut batch, 4) {
                    taken += batch.len();
                    queue.done(batch.len(), Vec::new());
                }
                taken
            })
        };
        queue.push((0..10).map(event));
        assert!(queue.wait_until_handled(Duration::from_secs(10)));
        queue.close();
        assert_eq!(worker.join().unwrap(), 10);
        assert_eq!(queue.counts().written, 10);
    }
}

//! Reads the ring buffer as records arrive, has rule modules decide the events, and hands the
//! events kept to the sinks.

use std::collections::VecDeque;

use aya::maps::{MapData, RingBuf};
use palisade_common::Event;
use tokio::io::{Interest, unix::AsyncFd};

use super::{Deciding, Decoder, Sink};

/// Events handled per `drain`, so that a flood of events cannot starve the caller's other work.
const BATCH: usize = 1024;

/// Events copied out of the ring buffer and not handled yet, at most. The ring buffer is emptied
/// into this queue as events are written, so that it keeps room for what happens next: after a
/// flood the sinks could not keep up with, the next event is still written. Beyond it the oldest
/// are dropped, counted.
const QUEUE: usize = 8 * BATCH;

pub struct EventReader {
    ring: AsyncFd<RingBuf<MapData>>,
    decoder: Decoder,
    deciding: Deciding,
    /// Copied out of the ring buffer, oldest first.
    queue: VecDeque<Event>,
    /// Records that were not events of this version (the kernel counts its own drops).
    pub undecodable: u64,
    /// Events dropped from a full queue.
    pub overflowed: u64,
    /// Events handed to the sinks (rule modules kept them).
    pub written: u64,
}

impl EventReader {
    pub fn new(
        ring: RingBuf<MapData>,
        decoder: Decoder,
        deciding: Deciding,
    ) -> std::io::Result<Self> {
        // SAFETY: the ring buffer owns its map fd, which stays open and unchanged while the
        // AsyncFd owns the ring buffer.
        let ring = unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) }
            .map_err(std::io::Error::from)?;
        Ok(Self {
            ring,
            decoder,
            deciding,
            queue: VecDeque::with_capacity(QUEUE),
            undecodable: 0,
            overflowed: 0,
            written: 0,
        })
    }

    /// Events read from the ring buffer and not yet handed to the sinks.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Waits until the kernel has submitted records; `drain` them next.
    pub async fn ready(&mut self) -> std::io::Result<()> {
        self.ring.readable_mut().await?.clear_ready();
        Ok(())
    }

    /// Hands up to a batch of pending events to every sink. Returns whether events may remain.
    pub fn drain(&mut self, sinks: &mut [Box<dyn Sink>]) -> bool {
        self.refill();
        let handled = self.queue.len().min(BATCH);
        let batch = self
            .queue
            .drain(..handled)
            .map(|event| self.decoder.decode(&event))
            .collect();
        let decided = self.deciding.apply(batch);
        self.written += decided.events.len() as u64;
        for event in &decided.events {
            for sink in sinks.iter_mut() {
                sink.send(event);
            }
            // Writing is the slow part: the kernel gets its room back as it goes.
            self.refill();
        }
        for failure in &decided.failures {
            for sink in sinks.iter_mut() {
                sink.report(failure);
            }
        }
        !self.refill() || !self.queue.is_empty()
    }

    /// Copies the ring buffer's records into the queue (at most a queue's worth: a producer as
    /// fast as this loop cannot keep it here), so that the kernel has room for what happens
    /// next. Returns whether the ring buffer was emptied.
    fn refill(&mut self) -> bool {
        let ring = self.ring.get_mut();
        for _ in 0..QUEUE {
            let Some(record) = ring.next() else {
                return true;
            };
            let Some(event) = Decoder::read(&record) else {
                self.undecodable += 1;
                continue;
            };
            if self.queue.len() == QUEUE {
                self.queue.pop_front();
                self.overflowed += 1;
            }
            self.queue.push_back(event);
        }
        false
    }
}

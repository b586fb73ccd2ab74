//! Reads the ring buffer as records arrive, has rule modules decide the events, and hands the
//! events kept to the sinks.

use aya::maps::{MapData, RingBuf};
use tokio::io::{Interest, unix::AsyncFd};

use super::{Deciding, Decoder, Sink};

/// Records handled per `drain`, so that a flood of events cannot starve the caller's other work.
const BATCH: usize = 1024;

pub struct EventReader {
    ring: AsyncFd<RingBuf<MapData>>,
    decoder: Decoder,
    deciding: Deciding,
    /// Records that were not events of this version (the kernel counts its own drops).
    pub undecodable: u64,
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
            undecodable: 0,
        })
    }

    /// Waits until the kernel has submitted records; `drain` them next.
    pub async fn ready(&mut self) -> std::io::Result<()> {
        self.ring.readable_mut().await?.clear_ready();
        Ok(())
    }

    /// Hands up to a batch of pending events to every sink. Returns whether records may remain.
    pub fn drain(&mut self, sinks: &mut [Box<dyn Sink>]) -> bool {
        let ring = self.ring.get_mut();
        let mut batch = Vec::new();
        let mut more = true;
        while batch.len() < BATCH {
            let Some(record) = ring.next() else {
                more = false;
                break;
            };
            match self.decoder.decode(&record) {
                Some(decoded) => batch.push(decoded),
                None => self.undecodable += 1,
            }
        }
        let decided = self.deciding.apply(batch);
        for sink in sinks.iter_mut() {
            for event in &decided.events {
                sink.send(event);
            }
            for failure in &decided.failures {
                sink.report(failure);
            }
        }
        more
    }
}

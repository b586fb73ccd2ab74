//! Reads the ring buffer as records arrive and hands the events to the sinks.

use aya::maps::{MapData, RingBuf};
use tokio::io::{Interest, unix::AsyncFd};

use super::{Decoder, Sink};

/// Records handled per `drain`, so that a flood of events cannot starve the caller's other work.
const BATCH: usize = 1024;

pub struct EventReader {
    ring: AsyncFd<RingBuf<MapData>>,
    decoder: Decoder,
    /// Records that were not events of this version (the kernel counts its own drops).
    pub undecodable: u64,
}

impl EventReader {
    pub fn new(ring: RingBuf<MapData>, decoder: Decoder) -> std::io::Result<Self> {
        // SAFETY: the ring buffer owns its map fd, which stays open and unchanged while the
        // AsyncFd owns the ring buffer.
        let ring = unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) }
            .map_err(std::io::Error::from)?;
        Ok(Self {
            ring,
            decoder,
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
        for _ in 0..BATCH {
            let Some(record) = ring.next() else {
                return false;
            };
            let Some(event) = self.decoder.decode(&record) else {
                self.undecodable += 1;
                continue;
            };
            for sink in sinks.iter_mut() {
                sink.send(&event);
            }
        }
        true
    }
}

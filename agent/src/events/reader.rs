//! Reads the ring buffer as records arrive and writes JSON lines to a sink.

use std::io::Write;

use aya::maps::{MapData, RingBuf};
use tokio::io::{Interest, unix::AsyncFd};

use super::Decoder;

/// Records handled per `drain`, so that a flood of events cannot starve the caller's other work.
const BATCH: usize = 1024;

pub struct EventReader {
    ring: AsyncFd<RingBuf<MapData>>,
    decoder: Decoder,
    /// Records that were not events of this version (the kernel counts its own drops).
    pub undecodable: u64,
    /// Events lost because the sink failed.
    pub write_errors: u64,
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
            write_errors: 0,
        })
    }

    /// Waits until the kernel has submitted records; `drain` them next.
    pub async fn ready(&mut self) -> std::io::Result<()> {
        self.ring.readable_mut().await?.clear_ready();
        Ok(())
    }

    /// Writes up to a batch of pending events to `sink`, one JSON object per line. Returns
    /// whether records may remain.
    pub fn drain(&mut self, sink: &mut impl Write) -> bool {
        let ring = self.ring.get_mut();
        for _ in 0..BATCH {
            let Some(record) = ring.next() else {
                return false;
            };
            let Some(event) = self.decoder.decode(&record) else {
                self.undecodable += 1;
                continue;
            };
            let mut line = serde_json::to_string(&event).expect("events serialize");
            // One write per line: a rotating sink never splits one.
            line.push('\n');
            if sink
                .write_all(line.as_bytes())
                .and_then(|()| sink.flush())
                .is_err()
            {
                self.write_errors += 1;
            }
        }
        true
    }
}

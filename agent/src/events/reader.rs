//! Reads the ring buffer as records arrive and writes JSON lines to a sink.

use std::{
    io::Write,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
};

use aya::maps::{MapData, RingBuf};
use tokio::io::{Interest, unix::AsyncFd};

use super::Decoder;

/// What user space did with events; the kernel counts its own drops (see `bpf::Stats`).
#[derive(Debug, Default)]
pub struct SinkStats {
    pub written: AtomicU64,
    pub undecodable: AtomicU64,
    pub write_errors: AtomicU64,
}

pub struct EventReader {
    ring: AsyncFd<RingBuf<MapData>>,
    decoder: Decoder,
    stats: Arc<SinkStats>,
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
            stats: Arc::default(),
        })
    }

    pub fn stats(&self) -> Arc<SinkStats> {
        self.stats.clone()
    }

    /// Writes every pending event to `sink`, one JSON object per line.
    pub fn drain(&mut self, sink: &mut impl Write) {
        let ring = self.ring.get_mut();
        while let Some(record) = ring.next() {
            let Some(event) = self.decoder.decode(&record) else {
                self.stats.undecodable.fetch_add(1, Ordering::Relaxed);
                continue;
            };
            let line = serde_json::to_string(&event).expect("events serialize");
            match writeln!(sink, "{line}").and_then(|()| sink.flush()) {
                Ok(()) => self.stats.written.fetch_add(1, Ordering::Relaxed),
                Err(_) => self.stats.write_errors.fetch_add(1, Ordering::Relaxed),
            };
        }
    }

    /// Waits until the kernel has submitted records; `drain` them next.
    pub async fn ready(&mut self) -> std::io::Result<()> {
        self.ring.readable_mut().await?.clear_ready();
        Ok(())
    }
}

//! Reads the ring buffer as records arrive, into the event worker's queue. This runs on the
//! control runtime and only copies: the worker decides and writes.

use std::{sync::Arc, time::Duration};

use aya::maps::{MapData, RingBuf};
use tokio::{
    io::{Interest, unix::AsyncFd},
    time::Instant,
};

use super::{Decoder, EventQueue, queue::QUEUE};

/// Reads are at least this far apart. The kernel wakes the reader only for a record submitted
/// to an empty ring buffer, so under a flood the reader wakes this often and copies what came
/// meanwhile in one go, instead of waking (and waking the worker) for every event; the ring
/// buffer (2 MiB, ~4,800 events) holds twice this long of the fastest flood (~55,000 events a
/// second in the benchmark VM). A read wakes this thread and the worker's: at 10 ms under a
/// steady 5,000 events a second, the wake-ups cost a tenth of what the events themselves did.
const READ_INTERVAL: Duration = Duration::from_millis(40);

pub struct EventReader {
    ring: AsyncFd<RingBuf<MapData>>,
    queue: Arc<EventQueue>,
    last_read: Instant,
}

/// What one `read` did.
pub struct Read {
    pub records: usize,
    pub emptied: bool,
}

impl EventReader {
    pub fn new(ring: RingBuf<MapData>, queue: Arc<EventQueue>) -> std::io::Result<Self> {
        // SAFETY: the ring buffer owns its map fd, which stays open and unchanged while the
        // AsyncFd owns the ring buffer.
        let ring = unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) }
            .map_err(std::io::Error::from)?;
        Ok(Self {
            ring,
            queue,
            last_read: Instant::now(),
        })
    }

    /// Waits until the kernel has submitted records, and `READ_INTERVAL` has passed since the
    /// last read; `read` them next.
    pub async fn ready(&mut self) -> std::io::Result<()> {
        tokio::time::sleep_until(self.last_read + READ_INTERVAL).await;
        self.ring.readable_mut().await?.clear_ready();
        Ok(())
    }

    /// Copies the ring buffer's records into the queue, at most a queue's worth (a producer as
    /// fast as this loop cannot keep it here), so that the kernel has room for what happens next.
    pub fn read(&mut self) -> Read {
        self.last_read = Instant::now();
        let ring = self.ring.get_mut();
        let mut records = 0;
        let mut emptied = false;
        self.queue.push(std::iter::from_fn(|| {
            if records == QUEUE {
                return None;
            }
            let Some(record) = ring.next() else {
                emptied = true;
                return None;
            };
            records += 1;
            Some(Decoder::read(&record))
        }));
        Read { records, emptied }
    }
}

//! Reads the ring buffer as records arrive, into the event worker's queue. This runs on the
//! control runtime and only copies: the worker decides and writes.

use std::{sync::Arc, time::Duration};

use aya::maps::{MapData, RingBuf};
use tokio::{
    io::{Interest, unix::AsyncFd},
    time::Instant,
};

use super::{Decoder, EventQueue, queue::QUEUE};

/// How long records wait, at most, to be read with those that follow. The kernel wakes the
/// reader for a record submitted to an empty ring buffer; the reader then waits this long, or
/// until the kernel wakes it again because a quarter of the ring buffer (2 MiB, ~4,800 events)
/// is waiting, and copies what came meanwhile in one go. A read wakes this thread and the
/// worker's, and has the worker call each rule module and write each sink once: ~130,000
/// instructions in the benchmark VM. At 500 events a second an event still costs ~10,400-11,000
/// instructions in all, at 200 ms as at 500 ms: most of that rate's fixed cost is elsewhere.
const READ_INTERVAL: Duration = Duration::from_millis(500);

pub struct EventReader {
    ring: AsyncFd<RingBuf<MapData>>,
    queue: Arc<EventQueue>,
    last_read: Instant,
    /// The kernel has woken the reader for records not read yet. Kept here, not in `ready`, so
    /// that `ready` can be cancelled (the control loop serves other work meanwhile): the kernel
    /// does not wake the reader again for records that join unread ones.
    woken: bool,
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
            woken: false,
        })
    }

    /// Waits until the kernel has submitted records, then until `READ_INTERVAL` has passed
    /// since the last read or the kernel asks for a read; `read` them next.
    pub async fn ready(&mut self) -> std::io::Result<()> {
        if !self.woken {
            self.ring.readable_mut().await?.clear_ready();
            self.woken = true;
        }
        tokio::select! {
            () = tokio::time::sleep_until(self.last_read + READ_INTERVAL) => {}
            filling = self.ring.readable_mut() => filling?.clear_ready(),
        }
        Ok(())
    }

    /// Copies the ring buffer's records into the queue, at most a queue's worth (a producer as
    /// fast as this loop cannot keep it here), so that the kernel has room for what happens next.
    pub fn read(&mut self) -> Read {
        self.last_read = Instant::now();
        self.woken = false;
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

//! What confines an instance of a rule module: its store's memory limit, and a budget of CPU
//! time for each call (epoch interruption, the epoch advanced by a kernel timer while calls run).

use std::{
    fs::File,
    io::Read,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    sync::{Arc, Mutex, Weak},
    time::Duration,
};

use wasmtime::{Engine, Store, StoreLimits, StoreLimitsBuilder, UpdateDeadline};

/// Memory one instance may grow to.
pub(super) const MEMORY_LIMIT: usize = 64 << 20;
/// How often the engine's epoch advances while a call runs (see `Epoch`), and with it how often
/// a call's CPU time is checked against its budget: a call is stopped within a tick of its
/// budget, 10% of `DECIDE_BUDGET` (see `Budget::check`).
const EPOCH_TICK: Duration = Duration::from_millis(20);
/// CPU time one `compile` call may use.
pub(super) const COMPILE_BUDGET: Duration = Duration::from_secs(2);
/// CPU time one `decide` call (a batch of events) may use.
pub const DECIDE_BUDGET: Duration = Duration::from_millis(200);

/// What the store of a module's instance holds: its limits, the epoch its budgets are checked
/// at, and the budget of the call running.
pub(super) struct State {
    limits: StoreLimits,
    epoch: Arc<Epoch>,
    budget: Budget,
}

/// How much CPU time the running call may use, and the calling thread's CPU time at its first
/// check. CPU time rather than time passed: a module is stopped for what it runs, not for waiting
/// while other processes of a busy node run.
struct Budget {
    allowed: Duration,
    /// Read at the call's first check (see `check`).
    first_check: Option<Duration>,
}

impl Budget {
    fn new(allowed: Duration) -> Self {
        Self {
            allowed,
            first_check: None,
        }
    }

    /// At a check, on the thread of the call: epoch ticks to the next check, or None when the
    /// budget is used up. The first check comes a tick or less after the call started, and
    /// takes it to have used a whole tick by then: the thread's clock is read only by calls
    /// that last that long, where a decision lasts microseconds. So a call is stopped at most a
    /// tick early and, since it cannot use more CPU time than passes, less than a tick late.
    fn check(&mut self) -> Option<u64> {
        let now = thread_cpu_time();
        let used = now - *self.first_check.get_or_insert(now) + EPOCH_TICK;
        let left = self.allowed.saturating_sub(used);
        (!left.is_zero()).then(|| ticks(left))
    }
}

/// Epoch ticks in `time`, rounded up.
fn ticks(time: Duration) -> u64 {
    time.div_duration_f64(EPOCH_TICK).ceil() as u64
}

/// CPU time the calling thread has used.
fn thread_cpu_time() -> Duration {
    crate::clock(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// The engine's epoch advances every `EPOCH_TICK` while a call into a module runs, and stands
/// still between calls. A kernel timer (timerfd) keeps the time: the first call to start sets it
/// going and the last to end stops it, a system call each, and its thread wakes only for the
/// ticks of calls that last that long: calls a few milliseconds long, as deciding a batch of
/// events is, wake no thread at all, and an idle agent none either.
pub(super) struct Epoch {
    running: Mutex<usize>,
    timer: OwnedFd,
}

/// A call running: counted until it is dropped.
pub(super) struct Ticking(Arc<Epoch>);

impl Epoch {
    /// An epoch, and the thread that advances `engine`'s while a call runs, until `engine` or
    /// the epoch is dropped.
    pub(super) fn start_ticking(engine: wasmtime::EngineWeak) -> std::io::Result<Arc<Self>> {
        // SAFETY: plain system call; the descriptor it returns is checked, then owned.
        let fd = unsafe { libc::timerfd_create(libc::CLOCK_MONOTONIC, libc::TFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a new descriptor nothing else owns.
        let timer = unsafe { OwnedFd::from_raw_fd(fd) };
        let ticks = File::from(timer.try_clone()?);
        let epoch = Arc::new(Self {
            running: Mutex::new(0),
            timer,
        });
        let weak = Arc::downgrade(&epoch);
        std::thread::Builder::new()
            .name("wasm-epoch".to_owned())
            .spawn(move || Self::tick(&ticks, &weak, &engine))?;
        Ok(epoch)
    }

    /// Advances `engine`'s epoch once for each expiry of the timer read from `ticks`.
    fn tick(mut ticks: &File, epoch: &Weak<Self>, engine: &wasmtime::EngineWeak) {
        let mut expiries = [0; 8];
        while ticks.read_exact(&mut expiries).is_ok() {
            let (Some(_), Some(engine)) = (epoch.upgrade(), engine.upgrade()) else {
                return;
            };
            for _ in 0..u64::from_ne_bytes(expiries) {
                engine.increment_epoch();
            }
        }
    }

    fn running(&self) -> std::sync::MutexGuard<'_, usize> {
        self.running
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    fn start(self: &Arc<Self>) -> Ticking {
        let mut running = self.running();
        if *running == 0 {
            self.set_timer(EPOCH_TICK, EPOCH_TICK);
        }
        *running += 1;
        Ticking(self.clone())
    }

    /// Expires first after `first`, then every `interval` (zero: stopped).
    fn set_timer(&self, first: Duration, interval: Duration) {
        let timespec = |duration: Duration| libc::timespec {
            tv_sec: duration.as_secs() as libc::time_t,
            tv_nsec: duration.subsec_nanos().into(),
        };
        let setting = libc::itimerspec {
            it_interval: timespec(interval),
            it_value: timespec(first),
        };
        // SAFETY: `timer` is a timerfd this epoch owns; `setting` outlives the call.
        let set = unsafe {
            libc::timerfd_settime(self.timer.as_raw_fd(), 0, &setting, std::ptr::null_mut())
        };
        // Only an invalid descriptor or setting fails, and neither can be.
        assert_eq!(
            set,
            0,
            "timerfd_settime: {}",
            std::io::Error::last_os_error()
        );
    }
}

impl Drop for Ticking {
    fn drop(&mut self) {
        let mut running = self.0.running();
        *running -= 1;
        if *running == 0 {
            self.0.set_timer(Duration::ZERO, Duration::ZERO);
        }
    }
}

impl Drop for Epoch {
    /// Ends the ticking thread: it wakes at once and finds the epoch gone.
    fn drop(&mut self) {
        self.set_timer(Duration::from_nanos(1), Duration::ZERO);
    }
}

/// A store for one instance, with its memory limit; a call into it is interrupted once it has
/// used its budget (`set_budget`).
pub(super) fn store(engine: &Engine, epoch: &Arc<Epoch>) -> Store<State> {
    let mut store = Store::new(
        engine,
        State {
            limits: StoreLimitsBuilder::new()
                .memory_size(MEMORY_LIMIT)
                .trap_on_grow_failure(true)
                .build(),
            epoch: epoch.clone(),
            budget: Budget::new(Duration::ZERO),
        },
    );
    store.limiter(|state| &mut state.limits);
    // Runs on the thread of the call, at the deadline `set_budget` sets.
    store.epoch_deadline_callback(|mut store| {
        Ok(match store.data_mut().budget.check() {
            Some(ticks) => UpdateDeadline::Continue(ticks),
            None => UpdateDeadline::Interrupt,
        })
    });
    store
}

/// Gives the next call `budget` of CPU time, checked while the returned guard lives.
#[must_use]
pub(super) fn set_budget(store: &mut Store<State>, budget: Duration) -> Ticking {
    store.data_mut().budget = Budget::new(budget);
    store.set_epoch_deadline(1);
    store.data().epoch.start()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_counts_the_cpu_time_the_thread_uses_not_the_time_it_waits() {
        let mut budget = Budget::new(Duration::from_millis(50));
        std::thread::sleep(Duration::from_millis(100));
        // The first tick counted as used: 30 ms left, two ticks to the next check.
        assert_eq!(budget.check(), Some(2), "waiting used the budget");
        let first_check = budget.first_check.expect("read at the first check");
        while thread_cpu_time() - first_check < Duration::from_millis(30) {
            std::hint::black_box(0);
        }
        assert_eq!(budget.check(), None);
    }
}

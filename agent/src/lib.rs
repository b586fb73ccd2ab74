//! Palisade: a runtime-security agent that enforces policy in the kernel with BPF LSM.

pub mod behavior;
pub mod bounded;
pub mod bpf;
pub mod cmd;
pub mod events;
pub mod files;
#[doc(hidden)]
pub mod fuzzing;
pub mod http;
pub mod k8s;
pub mod metrics;
pub mod policy;
pub mod rules;
pub mod targets;

/// The time of clock `id` (CLOCK_BOOTTIME, CLOCK_THREAD_CPUTIME_ID, ...).
pub(crate) fn clock(id: libc::clockid_t) -> std::time::Duration {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid clock id and out pointer.
    unsafe { libc::clock_gettime(id, &mut now) };
    std::time::Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
}

/// The agent's allocator, in every binary built on this crate (the agent, and the benchmarks and
/// tests that measure it): every audit event allocates its strings, and glibc's allocator cost
/// more than a quarter of the event pipeline's instructions under a flood. Not under libFuzzer,
/// whose sanitizers and memory limits watch the system allocator.
#[cfg(not(fuzzing))]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

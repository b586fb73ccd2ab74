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

/// The agent's allocator, in every binary built on this crate (the agent, and the benchmarks and
/// tests that measure it): every audit event allocates its strings, and glibc's allocator cost
/// more than a quarter of the event pipeline's instructions under a flood. Not under libFuzzer,
/// whose sanitizers and memory limits watch the system allocator.
#[cfg(not(fuzzing))]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

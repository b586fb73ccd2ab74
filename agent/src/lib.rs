//! Palisade: a runtime-security agent that enforces policy in the kernel with BPF LSM.

pub mod bpf;
pub mod cmd;
pub mod events;
pub mod http;
pub mod k8s;
pub mod metrics;
pub mod policy;
pub mod rules;
pub mod targets;

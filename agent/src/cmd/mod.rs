//! The subcommands of the `palisade` binary.

pub mod daemon;
pub mod doctor;
pub mod model;
pub mod policy;
pub mod rules;
pub mod run;
mod session;
pub mod top;

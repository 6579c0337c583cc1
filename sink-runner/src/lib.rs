//! The sink runner: consumes change topics, applies them to a destination
//! with exactly-once effect, dead-letters what can never be applied, and
//! replays dead-lettered records once an operator fixed the cause.
//!
//! The binary (`src/main.rs`) is a thin command line over this library, so
//! that integration tests can run the loop in-process.
#![deny(missing_docs)]

pub mod check;
pub mod config;
pub mod dlq;
pub mod replay;
pub mod runner;

pub use config::SinkRunnerConfig;
pub use runner::{run, run_with_sink, RunError};

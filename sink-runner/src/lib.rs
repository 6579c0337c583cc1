//! The sink runner: consumes change topics, applies them to a destination
//! with exactly-once effect, dead-letters what can never be applied, and
//! replays dead-lettered records once an operator fixed the cause.
//!
//! * [`pipeline`]: poll -> buffer -> decode -> apply -> commit, the loop;
//! * [`consumer`]: the consumer's settings, its context (errors,
//!   statistics, group health) and the rebalances it hands over;
//! * [`rebalance`]: partitions assigned at the destination's offsets,
//!   revoked after the write that covers them;
//! * [`partitions`]: what the runner knows of each assigned partition;
//! * [`out_of_range`]: partitions whose stored offset the topic no longer
//!   holds, stopped until an operator fixes it;
//! * [`buffer`]: per-table batches, their bounds and their retries;
//! * [`transactions`]: records waiting to make whole source transactions
//!   (`consistency = "transactional"`);
//! * [`decode`]: records into what the sink applies;
//! * [`apply`]: one batch at a time in its own task, retries, dead letters
//!   of what the destination refuses;
//! * [`pauses`]: an operator's pauses;
//! * [`dead_letters`]: the dead-letter topics, written once and read back;
//! * [`repairs`]: asking the source runner to repair rows a verification
//!   found different;
//! * [`commands`]: `check`, `replay`, `delete`.
//!
//! The binary (`src/main.rs`) is a thin command line over this library, so
//! that integration tests can run the pipeline in-process.

pub mod apply;
pub mod buffer;
pub mod commands;
pub mod config;
pub mod consumer;
pub mod dead_letters;
pub mod decode;
pub mod out_of_range;
pub mod partitions;
pub mod pauses;
pub mod pipeline;
pub mod rebalance;
pub(crate) mod repairs;
pub mod transactions;

pub use config::SinkRunnerConfig;
pub use pipeline::{run, run_with_sink};
pub use tributary_connectors::Labeler;

/// Why the runner stopped.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The configuration cannot work.
    #[error(transparent)]
    Config(#[from] tributary_operations::config::ConfigError),
    /// Kafka refused something the runner cannot do without.
    #[error("kafka: {0}")]
    Kafka(String),
    /// Anything else, with context.
    #[error("{0}")]
    Other(String),
}

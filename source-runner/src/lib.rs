//! The source runner: one process per source database. Consistent snapshot,
//! then streaming, into per-table Kafka topics, exactly once.
//!
//! * [`pipeline`]: read -> encode -> produce -> commit -> acknowledge, and
//!   the retry loop around it;
//! * [`transaction`]: how batches are grouped into Kafka transactions, and
//!   what is reported once one is committed;
//! * [`writer`]: what goes into a transaction (events, control records,
//!   the checkpoint and the other offsets-topic records);
//! * [`held_tables`]: the tables held back while paused or copied again, a
//!   state machine;
//! * [`offsets_topic`]: the runner's records read back at start;
//! * [`requests`]: what the copy's sink runners ask (repairs);
//! * [`kafka`]: the transactional producer and the topics;
//! * [`commands`]: `check`, `reset`, `delete`.

pub mod commands;
pub mod config;
pub mod held_tables;
pub mod kafka;
pub mod offsets_topic;
pub mod pipeline;
pub mod requests;
pub mod transaction;
pub mod writer;

pub use pipeline::run;

use config::SourceRunnerConfig;
use tributary_connectors::Error;
use tributary_operations::pauses::PauseStore;

/// Builds the configured source and runs it until Ctrl-C or SIGTERM.
pub async fn run_from_config(config: SourceRunnerConfig) -> Result<(), Error> {
    let source = build_source(&config)?;
    let queue = u64::from(config.producer_queue_kbytes) * 1024;
    if let Some((held, settings)) = config.source_config().ok().and_then(|c| c.memory_budget()) {
        // The producer queue, plus what the source holds while it is produced.
        tributary_operations::memory::report_budget(queue + held, &format!("producer_queue_kbytes, {settings}"));
    }
    let telemetry = tributary_operations::telemetry::Telemetry::new(&config.name, "source");
    let control = tributary_operations::admin::Control::new();
    tributary_operations::admin::serve(&config.admin, telemetry.clone(), control.clone())
        .await
        .map_err(|e| Error::needs_operator(format!("cannot start the admin server on {}: {e}", config.admin.listen)))?;
    let kafka = config.kafka.client_config().map_err(|e| Error::needs_operator(e.to_string()))?;
    let store = PauseStore::of_source(kafka, &config.name);
    tributary_operations::pauses::attach_at_start(store, &control, &telemetry).await;
    pipeline::run(config, source, telemetry, control, tributary_operations::process::shutdown_signal()).await
}

/// The source named by the config.
pub fn build_source(config: &SourceRunnerConfig) -> Result<Box<dyn tributary_connectors::Source>, Error> {
    let source = config.source_config().map_err(|e| Error::needs_operator(e.to_string()))?;
    source.build(&config.name)
}

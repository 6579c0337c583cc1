//! The configured destination: one [`Sink`] type over every destination the
//! runner can write to, so that the run loop, `check`, `replay` and
//! `delete` are written once.

use std::sync::Arc;

use async_trait::async_trait;
use tributary_connectors::bigquery::BigQuerySink;
use tributary_connectors::postgres::sink::PostgresSink;
use tributary_connectors::{ApplyError, CheckProblem, Result, Sink, SinkBatch};
use tributary_operations::config::ConfigError;
use tributary_schemas::TableId;

use crate::config::SinkRunnerConfig;
use crate::runner::Labeler;

/// The destination of a sink runner.
#[derive(Debug)]
pub enum Destination {
    /// `[postgres]`.
    Postgres(PostgresSink),
    /// `[bigquery]`.
    BigQuery(BigQuerySink),
}

impl Destination {
    /// The sink of the config's destination section.
    pub fn from_config(config: &SinkRunnerConfig) -> Result<Self, ConfigError> {
        if let Some(pg) = config.postgres_config() {
            return Ok(Destination::Postgres(PostgresSink::new(pg)?));
        }
        if let Some(bq) = config.bigquery_config() {
            return Ok(Destination::BigQuery(BigQuerySink::new(bq)?));
        }
        Err(ConfigError::invalid("postgres", "a destination section is required: [postgres] or [bigquery]"))
    }

    /// Names a source table's status entry after its destination table.
    pub fn labeler(&self) -> Labeler {
        match self {
            Destination::Postgres(s) => {
                let c = s.config().clone();
                Arc::new(move |t: &TableId| c.destination(t).to_string())
            }
            Destination::BigQuery(s) => {
                let c = s.config().clone();
                Arc::new(move |t: &TableId| c.destination(t).to_string())
            }
        }
    }

    /// The destination's setup problems, each with its fix.
    pub async fn check(&mut self) -> Vec<CheckProblem> {
        match self {
            Destination::Postgres(s) => s.check().await,
            Destination::BigQuery(s) => s.check().await,
        }
    }

    /// Removes this copy's stored offsets and, listed in `drop`, its tables.
    pub async fn delete_copy(&mut self, drop: &[TableId]) -> Result<Vec<String>> {
        match self {
            Destination::Postgres(s) => s.delete_copy(drop).await,
            Destination::BigQuery(s) => s.delete_copy(drop).await,
        }
    }

    /// Applies a batch and undoes it: whether (and where) it would fail.
    pub async fn trial_apply(&mut self, batch: &SinkBatch) -> Result<(), ApplyError> {
        match self {
            Destination::Postgres(s) => s.trial_apply(batch).await,
            Destination::BigQuery(s) => s.trial_apply(batch).await,
        }
    }
}

#[async_trait]
impl Sink for Destination {
    async fn committed_offsets(&mut self, partitions: &[(String, i32)]) -> Result<Vec<Option<i64>>> {
        match self {
            Destination::Postgres(s) => s.committed_offsets(partitions).await,
            Destination::BigQuery(s) => s.committed_offsets(partitions).await,
        }
    }

    async fn apply(&mut self, batch: &SinkBatch) -> Result<(), ApplyError> {
        match self {
            Destination::Postgres(s) => s.apply(batch).await,
            Destination::BigQuery(s) => s.apply(batch).await,
        }
    }
}

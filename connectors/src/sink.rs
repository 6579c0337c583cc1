//! The `Sink` trait: what every destination gives the sink runner.

use async_trait::async_trait;
use tributary_schemas::{ChangeEvent, TableId};

use crate::error::{Error, Result};

/// Where a record came from in Kafka.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KafkaPosition {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Offset of the record.
    pub offset: i64,
}

/// One record for a sink.
#[derive(Debug, Clone, PartialEq)]
pub enum SinkRecord {
    /// A row change or truncate.
    Change(ChangeEvent),
    /// The source table was dropped.
    TableDropped(TableId),
}

/// A batch of records of one destination table, with the Kafka offsets it
/// covers.
#[derive(Debug, Clone, PartialEq)]
pub struct SinkBatch {
    /// The source table the records belong to.
    pub table: TableId,
    /// Records in Kafka order, each with its position.
    pub records: Vec<(KafkaPosition, SinkRecord)>,
    /// The next offset to consume for each partition the batch covers
    /// (Kafka's convention: last applied offset + 1). Tombstones and records
    /// sent to a dead-letter topic are covered too.
    pub next_offsets: Vec<(String, i32, i64)>,
}

/// Why a batch was not applied.
#[derive(Debug)]
pub struct ApplyError {
    /// The error.
    pub error: Error,
    /// Index into [`SinkBatch::records`] of the record that caused a
    /// permanent error, so the runner can dead-letter it and apply the rest.
    pub record: Option<usize>,
}

impl From<Error> for ApplyError {
    fn from(error: Error) -> Self {
        Self {
            error,
            record: None,
        }
    }
}

/// A destination that applies change events.
///
/// # Delivery contract
///
/// * [`Sink::apply`] applies the whole batch and stores
///   [`SinkBatch::next_offsets`] in **one durable step** (for PostgreSQL one
///   database transaction holding the rows and the offsets). Either all of it
///   is visible afterwards or none of it is.
/// * The runner consumes from [`Sink::committed_offsets`] after every
///   (re)assignment, so after a crash nothing is applied twice and nothing is
///   skipped.
/// * Applying is idempotent and ordered by source position: an event older
///   than what a row already holds never moves that row backwards.
/// * A failed apply leaves no trace. On a permanent error caused by one
///   record, [`ApplyError::record`] names it; the runner dead-letters it and
///   applies the rest of the batch again.
#[async_trait]
pub trait Sink: Send {
    /// The next offset to consume for each partition, as last stored by
    /// [`Sink::apply`] (`None` when the destination has none yet).
    async fn committed_offsets(&mut self, partitions: &[(String, i32)]) -> Result<Vec<Option<i64>>>;

    /// Applies a batch and its offsets in one durable step.
    async fn apply(&mut self, batch: &SinkBatch) -> Result<(), ApplyError>;
}

//! The `Sink` trait (what every destination gives the sink runner) and the
//! warehouse-sink core every destination that keeps tables is built on:
//!
//! * [`batch`]: a batch split at table drops and grouped by destination
//!   table; destination name templates;
//! * [`reduce`]: the last change per key;
//! * [`keyless`]: tables without a key, kept as rows (a multiset);
//! * [`schema`]: what a destination table must become for a source schema,
//!   over a [`schema::Dialect`];
//! * [`bookkeeping`]: the position columns, the staging columns, the offsets
//!   table and the position guard;
//! * [`bisect`]: finding the record a destination refuses;
//! * [`warehouse`]: the order in which a batch is applied, over a
//!   [`warehouse::Warehouse`];
//! * [`script`]: the unit of a warehouse that collects its statements and
//!   runs them at the end, as one transaction (BigQuery, Snowflake);
//! * [`text`]: values as SQL text;
//! * [`verify`]: comparing a source's key range with the destination's;
//! * `memory`: the reference sink, in memory (with the `test-utils`
//!   feature).
//!
//! `docs/CONNECTORS.md` says how a new sink uses them.

pub mod batch;
pub mod bisect;
pub mod bookkeeping;
pub mod keyless;
// A test double: in the crate's own tests and in crates that turn on
// `test-utils`, never in the runners' builds.
#[cfg(any(test, feature = "test-utils"))]
pub mod memory;
pub mod reduce;
pub mod schema;
pub mod script;
pub mod text;
pub mod verify;
pub mod warehouse;

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use tributary_operations::config::ConfigError;
use tributary_schemas::records::VerifyRange;
use tributary_schemas::{ChangeEvent, TableId, TableSchema};

pub use self::batch::{
    check_table_template, expand_table_template, group_by_destination, segments, split_by_weight, Segment,
};
pub use self::bisect::{locate_failed_record, PrefixProbe};
use crate::error::{Error, Result};
use crate::problem::Problem;

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
    /// The source table was copied again (its changes had been held back):
    /// every row older than the position is gone, the rows that exist were
    /// rewritten by the copy at or after it.
    Copied(TableId, tributary_schemas::Position),
    /// The source table is about to be copied again in another position
    /// domain (a source epoch change, or `source-runner reset`): every
    /// existing row's position is forgotten, once per reset id (the same
    /// reset arrives on every partition of the table's topic).
    Reset(TableId, u64),
    /// A sequence one of the table's columns takes values from, as the
    /// source had it: a destination that keeps sequences moves its own to
    /// at least that (never back).
    Sequence(TableId, tributary_schemas::SequenceState),
    /// The table's indexes, constraints and defaults as the source has
    /// them (the whole set): a destination of the same kind makes its own
    /// match, each at its time (docs/migration.md); others ignore them.
    Objects(TableId, tributary_schemas::TableObjects),
    /// A key range of the table as the source had it at this point of the
    /// topic, with the table's shape the digests follow: compared by
    /// [`Sink::verify_range`] before the batch it leads is applied (the sink
    /// runner starts a batch at each), skipped by [`Sink::apply`].
    Verify(Arc<tributary_schemas::TableSchema>, tributary_schemas::records::VerifyRange),
}

impl SinkRecord {
    /// The source table the record is about.
    pub fn table(&self) -> &TableId {
        match self {
            SinkRecord::Change(ev) => &ev.schema.id,
            SinkRecord::TableDropped(t)
            | SinkRecord::Copied(t, _)
            | SinkRecord::Reset(t, _)
            | SinkRecord::Sequence(t, _)
            | SinkRecord::Objects(t, _) => t,
            SinkRecord::Verify(schema, _) => &schema.id,
        }
    }
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
    /// The offset each partition of `next_offsets` must have stored for the
    /// batch to commit (`None`: none stored yet), as this runner last read
    /// or wrote it; a partition not listed is not checked. See
    /// [`bookkeeping::Fence`].
    pub expected_offsets: Vec<(String, i32, Option<i64>)>,
    /// Where the batch stands in a destination unit that spans batches (a
    /// unit of its own unless the runner says otherwise).
    pub unit: UnitPart,
}

/// Where a batch stands in a destination unit that spans several batches:
/// a source transaction larger than the sink runner's memory bound,
/// applied whole by a sink whose [`Sink::spans_batches`] is true
/// (docs/consistency.md). The default is a unit of the batch's own.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UnitPart {
    /// An earlier batch (applied with `more`) opened the unit: this one
    /// continues it, in the same destination transaction.
    pub continues: bool,
    /// More batches of the unit follow: it stays open and stores no
    /// offsets; the batch that ends it stores every partition's.
    pub more: bool,
}

impl UnitPart {
    /// Whether the batch is part of a unit that spans batches.
    pub fn spans(&self) -> bool {
        self.continues || self.more
    }
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
        Self { error, record: None }
    }
}

/// Names the status and metrics entry of a source table: its destination
/// table, as the operator knows it.
pub type Labeler = Arc<dyn Fn(&TableId) -> String + Send + Sync>;

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
/// * The offsets move only from [`SinkBatch::expected_offsets`]: when
///   another runner (or an operator) stored something else meanwhile the
///   batch fails, writing nothing, with a retryable error of class
///   [`bookkeeping::FENCED_CLASS`]; the runner then reads the stored
///   offsets again. A member that lost its partitions cannot write.
/// * Applying is idempotent and ordered by source position: an event older
///   than what a row already holds never moves that row backwards, and an
///   event older than a row's delete (or the table's truncate) never brings
///   the row back (the deleted-rows table, [`bookkeeping::DELETED_TABLE`]).
/// * A failed apply leaves no trace. On a permanent error caused by one
///   record, [`ApplyError::record`] names it; the runner dead-letters it and
///   applies the rest of the batch again.
/// * [`Sink::trial_apply`], [`Sink::check`] and [`Sink::delete_copy`] are
///   what `sink-runner replay --dry-run`, `check` and `delete` need; none of
///   them moves offsets.
///
/// Destinations that keep tables implement [`warehouse::Warehouse`] and
/// [`warehouse::WarehouseSink`], which makes them a `Sink` (over
/// [`warehouse::apply`]).
#[async_trait]
pub trait Sink: Send {
    /// The next offset to consume for each partition, as last stored by
    /// [`Sink::apply`] (`None` when the destination has none yet).
    async fn committed_offsets(&mut self, partitions: &[(String, i32)]) -> Result<Vec<Option<i64>>>;

    /// Applies a batch and its offsets in one durable step; with
    /// [`SinkBatch::unit`] `more`, applies it into a unit left open for the
    /// next batch (nothing durable yet), and with `continues`, into the
    /// unit the batch before left open. A failure undoes the whole unit.
    async fn apply(&mut self, batch: &SinkBatch) -> Result<(), ApplyError>;

    /// Whether one destination unit can take several batches
    /// ([`SinkBatch::unit`]): one transaction of one session.
    fn spans_batches(&self) -> bool {
        false
    }

    /// Undoes a unit a batch left open ([`UnitPart::more`]): the runner
    /// gives up the transaction it was applying (a rebalance). Never fails.
    async fn abandon_unit(&mut self) {}

    /// Applies a batch and undoes it: whether (and at which record) it would
    /// fail, changing nothing.
    async fn trial_apply(&mut self, batch: &SinkBatch) -> Result<(), ApplyError>;

    /// The destination's setup problems, each with its fix; empty means
    /// ready. Changes nothing.
    async fn check(&mut self) -> Vec<Problem>;

    /// Removes this copy from the destination: its stored offsets and, when
    /// `drop` lists them, the destination tables of those source tables.
    /// Returns what it removed, for the operator.
    async fn delete_copy(&mut self, drop: &[TableId]) -> Result<Vec<String>>;

    /// Names each source table's status entry after its destination table.
    fn labeler(&self) -> Labeler {
        Arc::new(|t: &TableId| t.to_string())
    }

    /// Compares the source's rows of `range` (of the table `schema` names)
    /// with the destination's rows of that key range as committed now:
    /// the sink runner calls it before it applies the batch the verify
    /// record leads, so the destination holds every change before the
    /// record and none after it. Reads only. A destination that cannot
    /// read rows back says so in the outcome (the default).
    /// With `repair`, the rows only the destination has are removed as
    /// the source's delete at the range's position would
    /// ([`verify::Outcome::removed`]); the others are for the source to
    /// send again ([`verify::Outcome::to_resend`]).
    async fn verify_range(
        &mut self,
        schema: &Arc<TableSchema>,
        range: &VerifyRange,
        _repair: bool,
    ) -> Result<verify::Outcome> {
        Ok(verify::Outcome::unsupported(schema, range, "this destination cannot read its rows back yet"))
    }

    /// [`Sink::verify_range`] for consecutive ranges of one table's
    /// verification (each one's lower bound the one before's upper bound),
    /// an outcome per range in their order: a destination reads them back
    /// together, in one query instead of one per range.
    async fn verify_ranges(
        &mut self,
        schema: &Arc<TableSchema>,
        ranges: &[&VerifyRange],
        repair: bool,
    ) -> Result<Vec<verify::Outcome>> {
        let mut out = Vec::with_capacity(ranges.len());
        for range in ranges {
            out.push(self.verify_range(schema, range, repair).await?);
        }
        Ok(out)
    }
}

// For `Box<dyn Sink>` only, not every `Box<S>`: the blanket implementation
// over `warehouse::WarehouseSink` would overlap with one for every box.
#[async_trait]
impl<'a> Sink for Box<dyn Sink + 'a> {
    async fn committed_offsets(&mut self, partitions: &[(String, i32)]) -> Result<Vec<Option<i64>>> {
        (**self).committed_offsets(partitions).await
    }
    async fn apply(&mut self, batch: &SinkBatch) -> Result<(), ApplyError> {
        (**self).apply(batch).await
    }
    async fn trial_apply(&mut self, batch: &SinkBatch) -> Result<(), ApplyError> {
        (**self).trial_apply(batch).await
    }
    fn spans_batches(&self) -> bool {
        (**self).spans_batches()
    }
    async fn abandon_unit(&mut self) {
        (**self).abandon_unit().await
    }
    async fn check(&mut self) -> Vec<Problem> {
        (**self).check().await
    }
    async fn delete_copy(&mut self, drop: &[TableId]) -> Result<Vec<String>> {
        (**self).delete_copy(drop).await
    }
    fn labeler(&self) -> Labeler {
        (**self).labeler()
    }
    async fn verify_range(
        &mut self,
        schema: &Arc<TableSchema>,
        range: &VerifyRange,
        repair: bool,
    ) -> Result<verify::Outcome> {
        (**self).verify_range(schema, range, repair).await
    }
    async fn verify_ranges(
        &mut self,
        schema: &Arc<TableSchema>,
        ranges: &[&VerifyRange],
        repair: bool,
    ) -> Result<Vec<verify::Outcome>> {
        (**self).verify_ranges(schema, ranges, repair).await
    }
}

/// A destination section of a sink runner's config file (`[postgres]`,
/// `[bigquery]`, ...): what the runner needs to validate it and build the
/// sink. Registered in `sinks/mod.rs`.
pub trait SinkConfig: fmt::Debug + Send + Sync {
    /// Checks every rule; errors name the field under `section`.
    fn validate_at(&self, section: &str) -> Result<(), ConfigError>;

    /// The consumer group the section itself names, if any (it may only
    /// repeat the runner's `consumer_group`).
    fn consumer_group(&self) -> Option<&str>;

    /// The sink, storing its offsets under `consumer_group`. Connects
    /// nothing: a destination that is down pauses the runner, it does not
    /// fail its start.
    fn build(&self, consumer_group: &str) -> Result<Box<dyn Sink>, ConfigError>;

    /// Whether the runner applies a batch as soon as the consumer gives
    /// nothing more (the default of its `batch_idle_ms`), rather than after
    /// the whole `batch_linger_ms`, and keeps its batches small in memory
    /// (the default of its `batch_max_bytes`). False where each write costs
    /// money, a quota or a commit the warehouse serializes, so that the
    /// linger and large batches keep setting how often it writes.
    fn writes_when_idle(&self) -> bool {
        true
    }
}

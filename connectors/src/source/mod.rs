//! The `Source` trait: what every source connector gives the source runner;
//! [`SourceConfig`]: what the runner needs of a source's config section;
//! and `memory`, the reference source (with the `test-utils` feature).

// A test double: in the crate's own tests and in crates that turn on
// `test-utils` (tests/, connectors' own integration tests), never in the
// runners' builds.
pub mod keyless;
#[cfg(any(test, feature = "test-utils"))]
pub mod memory;
pub mod objects;

use std::collections::BTreeMap;
use std::fmt;

use async_trait::async_trait;
use tributary_operations::config::ConfigError;
use tributary_schemas::{ChangeEvent, Position, SnapshotMarker, TableId, TableSchema};

use crate::error::{Error, Result};
use crate::problem::Problem;

/// Whether a source starts by copying existing rows (`snapshot_mode`, the
/// same setting in every source's section).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum SnapshotMode {
    /// Copy every selected table, consistently with the position the
    /// stream starts from, then stream.
    #[default]
    Initial,
    /// Only stream changes made after the source first started.
    Never,
}

/// A source's resumable state, serialized by the source itself (JSON) and
/// stored by the runner in the offsets topic, in the same Kafka transaction as
/// the events it covers.
///
/// It holds everything needed to resume without loss or duplication: for
/// PostgreSQL the slot name, the last committed LSN and, during a snapshot,
/// the last key of the last committed chunk of each table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint(pub String);

impl Checkpoint {
    /// A source's state as a checkpoint.
    pub fn encode<T: serde::Serialize>(state: &T) -> Self {
        // A plain struct of strings, numbers and maps always serializes.
        Checkpoint(serde_json::to_string(state).unwrap_or_default())
    }

    /// Parses a checkpoint written by the source `source` (for the error),
    /// accepting only the state version `expected` (`version` reads it).
    pub fn decode<T: serde::de::DeserializeOwned>(
        &self,
        source: &str,
        version: impl FnOnce(&T) -> u32,
        expected: u32,
    ) -> Result<T> {
        let state: T = serde_json::from_str(&self.0).map_err(|e| {
            Error::needs_operator(format!("the checkpoint is not a {source} source checkpoint: {e}"))
                .with_hint("reset the runner's checkpoint only if a full re-snapshot is intended")
        })?;
        let found = version(&state);
        if found != expected {
            return Err(Error::needs_operator(format!(
                "checkpoint version {found} is not supported (expected {expected})"
            )));
        }
        Ok(state)
    }
}

/// One message from a source, in source order.
#[derive(Debug, Clone, PartialEq)]
pub enum SourceMessage {
    /// A row change (or a truncate).
    Change(ChangeEvent),
    /// A table's schema changed (or a table appeared): every following event
    /// of the table uses this schema. Runners register the new version before
    /// producing anything that needs it.
    SchemaChanged(std::sync::Arc<TableSchema>),
    /// A table was dropped in the source. Runners produce a table-dropped
    /// control record on the table's topic, after every earlier change.
    TableDropped(TableId),
    /// A change of the table cannot be read (a value the source cannot
    /// decode; the reason names the column and type): the source goes on
    /// with the other tables, and the runner pauses this one alone (its
    /// changes held back) until it is copied again, at the next start
    /// ([`Source::resync`]). Never a reason to stop every table.
    TableFailed(TableId, String),
    /// The table's rows changed without row changes in the log (a rewrite
    /// by `ALTER TABLE ... TYPE ... USING`, a volatile default, a generated
    /// column added; the reason says which): the runner copies it again
    /// while the other tables stream, as `POST /resync` does, once the
    /// batch holding this message is committed. Its changes are held back
    /// from here until the copy's rows come.
    TableRewritten(TableId, String),
    /// A sequence one of the table's columns takes values from, as the
    /// source has it now (read at intervals, sent when it moved): the
    /// runner writes it as a control record on the table's topic, for sinks
    /// that keep sequences.
    Sequence(TableId, tributary_schemas::SequenceState),
    /// The table's indexes, constraints and defaults as the source has
    /// them now (read at intervals once the table is copied, sent when
    /// they changed): the runner writes them as a control record on the
    /// table's topic, for sinks of the same kind (docs/migration.md).
    Objects(TableId, tributary_schemas::TableObjects),
    /// A key range of the table as the source has it at this point of its
    /// stream (every earlier change before this message, no later one),
    /// read for a verification ([`Source::verify`]): the runner writes it
    /// as a verify control record on the table's topic, with the registry
    /// ids of the table's schemas, for sinks to compare.
    Verify(TableId, tributary_schemas::records::VerifyRange),
    /// A source transaction ended: after its last change, in the batch
    /// that holds that change (see [`TransactionEnd`]). Sent for a
    /// transaction with at least one captured change; the runner writes
    /// Debezium's END record on the copy's transaction topic.
    TransactionEnd(TransactionEnd),
}

/// The end of a source transaction (its changes carry the same
/// `transaction.id`): what Debezium's END record says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransactionEnd {
    /// The transaction's id, as its changes' `transaction.id`.
    pub id: String,
    /// Its commit time at the source, in milliseconds.
    pub ts_ms: i64,
    /// Its captured changes per table (every part of it, also those handed
    /// out before a restart), in table order.
    pub tables: Vec<(TableId, i64)>,
}

impl TransactionEnd {
    /// The end of transaction `id` from its per-table counts (tables with
    /// none left out); `None` when it changed no captured table.
    pub fn of<'a>(id: String, ts_ms: i64, counts: impl IntoIterator<Item = (&'a TableId, &'a i64)>) -> Option<Self> {
        let mut tables: Vec<(TableId, i64)> = counts
            .into_iter()
            .filter(|(_, n)| **n > 0)
            .map(|(t, n)| (t.clone(), *n))
            .collect();
        tables.sort();
        (!tables.is_empty()).then_some(Self { id, ts_ms, tables })
    }
}

/// What a source keeps of a table without a key to tell when it must be
/// copied again (see [`copy_for_key_change`]): its columns' types, in
/// order; `None` for a table with a key.
pub fn keyless_shape(schema: &TableSchema) -> Option<Vec<String>> {
    schema
        .key
        .is_empty()
        .then(|| schema.columns.iter().map(|c| c.data_type.to_string()).collect())
}

/// Why a table whose shape was `old` ([`keyless_shape`]: `None` with a key)
/// must be copied again now that it is `new`, if it must: it gained or lost
/// its key, or, without a key, a change of its columns changed the
/// content of rows already copied (a column dropped or retyped, one added
/// with a default), by which the sinks tell its rows (see
/// `sink::keyless`). The source then sends
/// [`SourceMessage::TableRewritten`]. A column added at the end without a
/// default, or renamed, changes no row.
pub fn copy_for_key_change(old: Option<&[String]>, new: &TableSchema) -> Option<String> {
    let now = keyless_shape(new);
    match (old, now.as_deref()) {
        (None, None) => None,
        (Some(_), None) => {
            Some(format!("it gained a key ({}): its rows are matched by it from now on", new.key.join(", ")))
        }
        (None, Some(_)) => Some("it lost its key: its rows are kept as a multiset from now on".to_string()),
        (Some(old), Some(now)) => {
            if now.len() < old.len() {
                return Some("a column of the table without a key was dropped".to_string());
            }
            if let Some(c) = old.iter().zip(now).position(|(a, b)| a != b) {
                return Some(format!("column {} of the table without a key changed type", new.columns[c].name));
            }
            new.columns[old.len()..]
                .iter()
                .find(|c| c.default.is_some())
                .map(|c| format!("column {} was added with a default to the table without a key", c.name))
        }
    }
}

/// A table the source runner holds back while the source copies it again
/// ([`Source::resync`]): the runner's rule for its changes, in one place
/// for the runner and the test mirrors that play it. The runner keeps it
/// with the checkpoint (its held-tables record).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CopyHold {
    /// The position of the copy's first row, once it came: the copy read
    /// the table there.
    pub from: Option<Position>,
    /// Whether the copy is complete and the destination rows older than it
    /// (deleted at the source while the table was held) were removed.
    pub swept: bool,
}

impl CopyHold {
    /// Whether `event` of the table is held back (returns `(held, ends)`):
    /// streamed changes before the copy's first row, or older than it (the
    /// copy's rows hold them), are; the copy's rows and later changes pass.
    /// The first change after the sweep ends the hold (`ends`); not one
    /// before it: a copy resumed after a restart reads at a later position,
    /// and the stream catches up to that, past `from`, before the copy ends.
    pub fn admit(&mut self, event: &ChangeEvent) -> (bool, bool) {
        let at = event.source.position;
        match self.from {
            _ if event.source.snapshot != SnapshotMarker::False => {
                self.from.get_or_insert(at);
                (false, false)
            }
            None => (true, false),
            Some(from) if at < from => (true, false),
            Some(_) => (false, self.swept),
        }
    }

    /// Whether a destination row written at `position` outlives the sweep.
    pub fn keeps(&self, position: Position) -> bool {
        self.from.is_some_and(|from| position >= from)
    }
}

/// The tables held back while copied again, each with its [`CopyHold`]:
/// the runner's rule over all of them, for the mirrors in tests that play
/// the runner (the conformance suite's, the SQL Server source's).
#[derive(Debug, Clone, Default)]
pub struct CopyHolds(BTreeMap<TableId, CopyHold>);

impl std::ops::Deref for CopyHolds {
    type Target = BTreeMap<TableId, CopyHold>;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl CopyHolds {
    /// Holds `table` back until its copy's rows come (a resync asked).
    pub fn hold(&mut self, table: TableId) {
        self.0.insert(table, CopyHold::default());
    }

    /// Whether `event` is held back ([`CopyHold::admit`]); the change that
    /// ends its table's hold removes it.
    pub fn admit(&mut self, event: &ChangeEvent) -> bool {
        let Some(hold) = self.0.get_mut(&event.schema.id) else {
            return false;
        };
        let (held, ends) = hold.admit(event);
        if ends {
            self.0.remove(&event.schema.id);
        }
        held
    }

    /// The holds whose copy `progress` says is complete and not swept yet,
    /// marked swept: the rows older than each copy ([`CopyHold::keeps`])
    /// are to be removed now (the runner's table-copied record). An empty
    /// copy's hold ends with its sweep: nothing streamed is older.
    pub fn sweep(&mut self, progress: &[SnapshotTableProgress]) -> Vec<(TableId, CopyHold)> {
        let mut due = Vec::new();
        for (table, hold) in self.0.iter_mut() {
            if hold.swept || !progress.iter().any(|p| &p.table == table && p.done) {
                continue;
            }
            hold.swept = true;
            due.push((table.clone(), *hold));
        }
        self.0.retain(|_, hold| !(hold.swept && hold.from.is_none()));
        due
    }
}

/// A group of messages that the runner commits atomically, with the
/// checkpoint that holds once they are all durable.
#[derive(Debug, Clone, PartialEq)]
pub struct SourceBatch {
    /// Messages in source order. May be empty (a heartbeat that only moves the
    /// checkpoint, so the source can release old log).
    pub messages: Vec<SourceMessage>,
    /// The state to resume from once every message above is durable.
    pub checkpoint: Checkpoint,
}

/// Snapshot progress of one table, for status and metrics.
#[derive(Debug, Clone, PartialEq)]
pub struct SnapshotTableProgress {
    /// The table.
    pub table: TableId,
    /// Rows read so far by this run.
    pub rows: u64,
    /// The database's estimate of the table's rows, when it has one.
    pub estimated_rows: Option<u64>,
    /// Whether the table's snapshot is complete: every row of its copy is
    /// in a batch already given out (the runner then sends the
    /// table-copied record after them), not merely read.
    pub done: bool,
}

/// A database that changes.
///
/// # Delivery contract
///
/// * [`Source::next_batch`] returns messages in source order. A batch's
///   checkpoint is a point where every message before it is in this or an
///   earlier batch, and none after it is. (It may lie inside a large source
///   transaction; then it records which part of it was emitted.)
/// * The runner makes batches durable (one Kafka transaction holding the
///   events of one or more consecutive batches and the last one's
///   checkpoint) and only then calls [`Source::acknowledge`] with that
///   checkpoint, which covers every batch up to it. So `next_batch` may be
///   called again before the previous batch is acknowledged. A source
///   releases source-side history (the replication slot's confirmed flush
///   LSN, binlog retention) only up to an acknowledged checkpoint, so a
///   crash at any moment loses nothing.
/// * After a crash the runner calls [`Source::start`] with the last durable
///   checkpoint; the source resumes exactly after it, so nothing is emitted
///   twice into committed Kafka transactions.
/// * Errors carry a kind (see [`crate::error`]); the runner, not the source,
///   decides to retry or pause. A source must be able to be started again
///   after any error.
#[async_trait]
pub trait Source: Send {
    /// Connects and positions the source after `checkpoint` (or at the start
    /// of a new snapshot when there is none).
    async fn start(&mut self, checkpoint: Option<Checkpoint>) -> Result<()>;

    /// The next batch, waiting at most until a heartbeat is due.
    async fn next_batch(&mut self) -> Result<SourceBatch>;

    /// Called once the batch carrying `checkpoint` is durable in Kafka.
    async fn acknowledge(&mut self, checkpoint: &Checkpoint) -> Result<()>;

    /// A handle the runner notifies when it has work to do between batches
    /// (an operator's verification or re-copy): a source waiting in
    /// [`Source::next_batch`] for changes ends the batch then, as it would
    /// at the heartbeat, instead of making the request wait up to a
    /// heartbeat interval. Sources that do not wait ignore it.
    fn set_wake(&mut self, _wake: std::sync::Arc<tokio::sync::Notify>) {}

    /// Snapshot progress per table (empty when there is no snapshot).
    fn snapshot_progress(&self) -> Vec<SnapshotTableProgress> {
        Vec::new()
    }

    /// Copies `tables` again, called right after [`Source::start`] or
    /// between two batches (the state after a committed batch is the one a
    /// start from its checkpoint makes; `POST /resync`): their
    /// rows are read anew (a snapshot of those tables at a point after the
    /// checkpoint, recorded in the next checkpoint so that a crash resumes
    /// it), then they stream on. The runner asks for it after it held back
    /// a table's changes (an incompatible schema change paused that table
    /// only). Returns the tables that will be copied; a source that cannot
    /// copy a table mid-stream returns none of them (the default).
    async fn resync(&mut self, _tables: &[TableId]) -> Result<Vec<TableId>> {
        Ok(Vec::new())
    }

    /// Verifies `tables` (verification `id`, reading at most
    /// `rows_per_second`), called like
    /// [`Source::resync`]: their rows are read anew, as a copy again reads
    /// them (at a point of the stream after the checkpoint, the stream
    /// caught up to it first), but sent as [`SourceMessage::Verify`] ranges
    /// of row digests instead of rows. Returns the tables that will be
    /// verified; a table already being copied or verified is not, and a
    /// source that cannot verify returns none (the default).
    async fn verify(&mut self, _tables: &[TableId], _id: u64, _rows_per_second: u64) -> Result<Vec<TableId>> {
        Ok(Vec::new())
    }

    /// [`Source::verify`] by summaries: each range of keys counted and its
    /// rows' hashes summed by the database itself (a
    /// [`tributary_schemas::records::RangeSummary`]), where the source can
    /// (PostgreSQL; see `crate::pgwire::summary`), and by rows' digests
    /// elsewhere (the default: [`Source::verify`]); `range_rows` keys per
    /// range.
    async fn verify_by_summaries(
        &mut self,
        tables: &[TableId],
        id: u64,
        rows_per_second: u64,
        _range_rows: u64,
    ) -> Result<Vec<TableId>> {
        self.verify(tables, id, rows_per_second).await
    }

    /// Verifies the key ranges `ranges` of `table` with their rows'
    /// digests (verification `id`, at most `rows_per_second`), called like
    /// [`Source::resync`]: what a destination asks when a range's summary
    /// differs from its rows, or cannot be computed there. Returns whether
    /// it will; a source that cannot returns false (the default).
    async fn verify_ranges(
        &mut self,
        _table: &TableId,
        _id: u64,
        _ranges: &[tributary_schemas::records::requests::KeyBounds],
        _rows_per_second: u64,
    ) -> Result<bool> {
        Ok(false)
    }

    /// Sends the current rows of `keys` of `table` again (canonical key
    /// texts, see `tributary_schemas::canonical`), as a copy sends rows
    /// (read at a point of the stream after the checkpoint, the stream
    /// caught up to it first); a key the table no longer has sends nothing
    /// (its delete is in the stream). Then verifies the table again
    /// (verification `verify_after`, at most `rows_per_second`). Called
    /// like [`Source::resync`]. Returns whether it will; a source that
    /// cannot repair returns false (the default).
    async fn repair(
        &mut self,
        _table: &TableId,
        _keys: &[String],
        _verify_after: u64,
        _rows_per_second: u64,
    ) -> Result<bool> {
        Ok(false)
    }

    /// The tables the source captures, after [`Source::start`]: what
    /// `source-runner reset` without `--table` copies again. A source that
    /// cannot say returns none (the default).
    fn tables(&self) -> Vec<TableId> {
        Vec::new()
    }

    /// After [`Source::start`]: why the checkpoint's positions belong to
    /// another domain than the source's next ones (another server or
    /// cluster, binlog numbering restarted), or `None`. Positions of two
    /// domains do not compare: the source's next ones may be lower than
    /// those every destination row holds, and the position guard would
    /// skip them. So on a change the source does not resume: it copies
    /// every table of [`Source::tables`] again from a new start in its
    /// current domain (recorded in its next checkpoint with the new
    /// epoch), and the runner resets those tables downstream (a
    /// table-reset record before the copy's rows, a table-copied one after
    /// them). The default: a source without epochs never changes domain.
    fn domain_change(&self) -> Option<String> {
        None
    }

    /// Asks the next [`Source::start`] to start over as after a change of
    /// domain (see [`Source::domain_change`], which then says so), whatever
    /// the checkpoint holds: `source-runner reset` without `--table`, the
    /// way back from a lost checkpoint, slot or binlog. Returns whether the
    /// source can (the default: it cannot).
    fn start_over(&mut self) -> bool {
        false
    }

    /// Called before [`Source::start`] with the side records durable
    /// beside the checkpoint (see [`Source::take_side_records`]), by key.
    fn restore_side_records(&mut self, _records: BTreeMap<String, String>) {}

    /// After each batch [`Source::next_batch`] returns: the side records it
    /// changed (a value, or `None` to delete one). The runner writes them
    /// in the Kafka transaction that holds the batch's checkpoint, each
    /// under a key of its own in the offsets topic, and hands back the
    /// latest of each at the next start. For state too large to repeat in
    /// every checkpoint (the MySQL source's schema history: a record per
    /// table, written when the table's definition changes). The default:
    /// none.
    fn take_side_records(&mut self) -> Vec<(String, Option<String>)> {
        Vec::new()
    }

    /// How many bytes of its change history (WAL, binlog) the source
    /// database holds beyond this copy's position, asked between batches
    /// for status and metrics; `None` when unknown (the default), or when
    /// asking failed (never an error: it is only shown).
    async fn retained_bytes(&mut self) -> Option<u64> {
        None
    }
}

#[async_trait]
impl<S: Source + ?Sized> Source for Box<S> {
    async fn resync(&mut self, tables: &[TableId]) -> Result<Vec<TableId>> {
        (**self).resync(tables).await
    }
    async fn verify(&mut self, tables: &[TableId], id: u64, rows_per_second: u64) -> Result<Vec<TableId>> {
        (**self).verify(tables, id, rows_per_second).await
    }
    async fn verify_by_summaries(
        &mut self,
        tables: &[TableId],
        id: u64,
        rows_per_second: u64,
        range_rows: u64,
    ) -> Result<Vec<TableId>> {
        (**self).verify_by_summaries(tables, id, rows_per_second, range_rows).await
    }
    async fn verify_ranges(
        &mut self,
        table: &TableId,
        id: u64,
        ranges: &[tributary_schemas::records::requests::KeyBounds],
        rows_per_second: u64,
    ) -> Result<bool> {
        (**self).verify_ranges(table, id, ranges, rows_per_second).await
    }
    async fn repair(
        &mut self,
        table: &TableId,
        keys: &[String],
        verify_after: u64,
        rows_per_second: u64,
    ) -> Result<bool> {
        (**self).repair(table, keys, verify_after, rows_per_second).await
    }
    async fn start(&mut self, checkpoint: Option<Checkpoint>) -> Result<()> {
        (**self).start(checkpoint).await
    }
    async fn next_batch(&mut self) -> Result<SourceBatch> {
        (**self).next_batch().await
    }
    async fn acknowledge(&mut self, checkpoint: &Checkpoint) -> Result<()> {
        (**self).acknowledge(checkpoint).await
    }
    fn set_wake(&mut self, wake: std::sync::Arc<tokio::sync::Notify>) {
        (**self).set_wake(wake)
    }
    fn snapshot_progress(&self) -> Vec<SnapshotTableProgress> {
        (**self).snapshot_progress()
    }
    fn tables(&self) -> Vec<TableId> {
        (**self).tables()
    }
    fn domain_change(&self) -> Option<String> {
        (**self).domain_change()
    }
    fn start_over(&mut self) -> bool {
        (**self).start_over()
    }
    fn restore_side_records(&mut self, records: BTreeMap<String, String>) {
        (**self).restore_side_records(records)
    }
    fn take_side_records(&mut self) -> Vec<(String, Option<String>)> {
        (**self).take_side_records()
    }
    async fn retained_bytes(&mut self) -> Option<u64> {
        (**self).retained_bytes().await
    }
}

/// A source section of a source runner's config file (`[postgres]`,
/// `[mysql]`, ...): what the runner needs to validate it, build the source
/// and administer the source database. Registered in `sources/mod.rs`.
#[async_trait]
pub trait SourceConfig: fmt::Debug + Send + Sync {
    /// The connector's name in every event (Debezium's `source.connector`:
    /// `postgresql`, `mysql`, `sqlserver`, `oracle`).
    fn connector(&self) -> &'static str;

    /// Checks every rule; errors name the field under `section`.
    fn validate_at(&self, section: &str) -> Result<(), ConfigError>;

    /// The source, for the runner named `runner_name` (`source.name`).
    /// Connects nothing before [`Source::start`].
    fn build(&self, runner_name: &str) -> Result<Box<dyn Source>>;

    /// The source database's setup problems, each with the exact statement
    /// that fixes it (`source-runner check`). Changes nothing.
    async fn check(&self) -> Vec<Problem>;

    /// Applies the fixes `check` marks [`Problem::auto_fix`] that the
    /// source's role may apply (a publication, replica identity, a DDL
    /// trigger) and returns what is still wrong (`source-runner check
    /// --fix`). Default: a source with nothing to fix by itself only checks.
    async fn fix(&self) -> Result<Vec<Problem>> {
        Ok(self.check().await)
    }

    /// Removes what this copy created in the source database (a replication
    /// slot, a publication) for `source-runner delete`; what it removed, for
    /// the operator.
    async fn teardown(&self) -> Result<Vec<String>>;

    /// The bytes the source holds at most beyond the producer's queue
    /// (batches and snapshot chunks in flight), and the settings that bound
    /// them, for the memory report at start.
    fn memory_budget(&self) -> Option<(u64, &'static str)> {
        None
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_key_change_or_a_changed_content_copies_a_keyless_table_again() {
        use tributary_schemas::{Column, DataType, Value};
        let table = |key: Vec<&str>, columns: Vec<Column>| TableSchema {
            id: TableId::new("s", "t"),
            columns,
            key: key.into_iter().map(str::to_string).collect(),
            dropped: Vec::new(),
        };
        let a = Column::new("a", DataType::Int32, true);
        let b = Column::new("b", DataType::Text, true);
        let keyless = table(vec![], vec![a.clone(), b.clone()]);
        let shape = super::keyless_shape(&keyless);
        assert_eq!(super::copy_for_key_change(shape.as_deref(), &keyless), None);
        let keyed = table(vec!["a"], vec![a.clone(), b.clone()]);
        assert!(super::copy_for_key_change(shape.as_deref(), &keyed).is_some());
        assert!(super::copy_for_key_change(None, &keyless).is_some());
        assert_eq!(super::copy_for_key_change(None, &keyed), None);
        let appended = table(vec![], vec![a.clone(), b.clone(), Column::new("c", DataType::Int32, true)]);
        assert_eq!(super::copy_for_key_change(shape.as_deref(), &appended), None);
        let with_default = table(
            vec![],
            vec![
                a.clone(),
                b.clone(),
                Column::new("c", DataType::Int32, true).with_default(&Value::Int32(7)),
            ],
        );
        assert!(super::copy_for_key_change(shape.as_deref(), &with_default).is_some());
        assert!(super::copy_for_key_change(shape.as_deref(), &table(vec![], vec![a.clone()])).is_some());
        let retyped = table(vec![], vec![Column::new("a", DataType::Int64, true), b]);
        assert!(super::copy_for_key_change(shape.as_deref(), &retyped).is_some());
    }

    use super::*;
    use crate::error::ErrorKind;

    #[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
    struct State {
        version: u32,
        at: u64,
    }

    fn event(snapshot: SnapshotMarker, commit: u64) -> ChangeEvent {
        let schema = TableSchema {
            id: TableId::new("s", "t"),
            columns: Vec::new(),
            key: Vec::new(),
            dropped: Vec::new(),
        };
        ChangeEvent {
            schema: std::sync::Arc::new(schema),
            op: tributary_schemas::Op::Update,
            before: None,
            after: None,
            source: tributary_schemas::SourceInfo {
                connector: "test".into(),
                name: "test".into(),
                db: "test".into(),
                ts_ms: 0,
                snapshot,
                tx_id: None,
                position: Position { commit, index: 0 },
                native_position: "".into(),
            },
            ts_ms: 0,
            transaction: None,
        }
    }

    #[test]
    fn a_copied_table_is_held_until_its_copy_and_released_after_its_sweep() {
        use SnapshotMarker::{False as Streamed, True as Copied};
        let mut hold = CopyHold::default();
        assert_eq!(hold.admit(&event(Streamed, 5)), (true, false), "before the copy's rows");
        assert_eq!(hold.admit(&event(Copied, 10)), (false, false));
        assert_eq!(hold.from, Some(Position { commit: 10, index: 0 }));
        assert_eq!(hold.admit(&event(Streamed, 9)), (true, false), "older than the copy");
        // A copy resumed at a later position: the stream catches up past
        // the first one before the copy ends, and the hold stays for the
        // sweep.
        assert_eq!(hold.admit(&event(Streamed, 11)), (false, false));
        assert_eq!(hold.admit(&event(Copied, 12)), (false, false));
        assert!(hold.keeps(Position { commit: 10, index: 0 }) && !hold.keeps(Position { commit: 9, index: 7 }));
        hold.swept = true;
        assert_eq!(hold.admit(&event(Streamed, 13)), (false, true));
        assert!(!CopyHold::default().keeps(Position { commit: u64::MAX, index: 0 }), "an empty copy keeps nothing");
    }

    #[test]
    fn checkpoints_round_trip_and_refuse_garbage_and_other_versions() {
        let c = Checkpoint::encode(&State { version: 1, at: 7 });
        let back: State = c.decode("test", |s: &State| s.version, 1).expect("round trip");
        assert_eq!(back, State { version: 1, at: 7 });
        let e = c.decode("test", |s: &State| s.version, 2).expect_err("other version");
        assert_eq!(e.kind(), ErrorKind::NeedsOperator);
        assert!(e.to_string().contains("version 1 is not supported (expected 2)"), "{e}");
        let e = Checkpoint("{".into())
            .decode("test", |s: &State| s.version, 1)
            .expect_err("garbage");
        assert_eq!(e.kind(), ErrorKind::NeedsOperator);
        assert!(e.to_string().contains("not a test source checkpoint"), "{e}");
    }
}

//! The warehouse-sink core: how a batch is applied, written once for every
//! destination that keeps tables (PostgreSQL, BigQuery, and the warehouses
//! to come). A destination implements [`Warehouse`], the few operations
//! that differ between systems; [`apply`] does the rest, in this order:
//!
//! 1. [`Warehouse::begin`] opens the batch's atomic unit.
//! 2. The records are split at table drops ([`segments`]); each run of
//!    changes is grouped by destination table ([`group_by_destination`]).
//! 3. Per table: [`Warehouse::reconcile`] makes it fit every schema version
//!    in the batch (a failure names the record that needed the change); the
//!    newest truncate removes the older rows ([`Warehouse::truncate`]); a
//!    run of new rows may be loaded straight in ([`Warehouse::load_new`]);
//!    else the batch is reduced to the last change per key ([`Reduction`])
//!    and written ([`Warehouse::write`]), every row guarded by its stored
//!    position so that an older change never moves it backwards.
//! 4. [`Warehouse::finish`] stores the batch's offsets and commits, in the
//!    same unit as the rows.
//!
//! A permanent error that names no record is located by bisection
//! ([`locate_failed_record`]): prefixes of the batch are applied between
//! [`Warehouse::savepoint`] and [`Warehouse::rollback_to_savepoint`] until
//! the first record that fails is found. Nothing of a probe stays.
//!
//! A destination that also implements [`WarehouseSink`] (what it does
//! besides applying) is a [`Sink`]: that implementation is written once,
//! here.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use tracing::{debug, info_span, Instrument, Span};
use tributary_schemas::records::VerifyRange;
use tributary_schemas::{ChangeEvent, Position, TableId, TableSchema};

use super::batch::{group_by_destination, segments, Segment};
use super::bisect::{locate_failed_record, PrefixProbe};
use super::bookkeeping::{offset_moves, OffsetMove};
use super::keyless::record_id;
use super::reduce::{newest_truncate, Group, Reduction};
use super::schema::Evolution;
use super::verify::{self, KeyRange};
use super::{ApplyError, KafkaPosition, Labeler, Sink, SinkBatch, SinkRecord, UnitPart};
use crate::error::{Error, ErrorKind, Result};
use crate::problem::Problem;

/// What the batch's unit ends with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Rows and offsets are committed.
    Commit,
    /// Everything is done and then undone: whether (and where) the batch
    /// would fail, changing nothing (`sink-runner replay --dry-run`), and
    /// the bisection's probes. Schema changes a destination cannot undo
    /// (BigQuery's DDL) may stay: they are additive and the real apply
    /// would make them anyway; table drops are not made.
    Trial,
}

/// A destination the core drives. Each method's contract is what [`apply`]
/// relies on; the reference implementation is `sink::memory::MemorySink`
/// (built with the `test-utils` feature).
///
/// Errors carry their kind; a method never retries, pauses or dead-letters
/// on its own.
#[async_trait]
pub trait Warehouse: Send {
    /// A destination table's name.
    type Table: Clone + PartialEq + std::fmt::Display + Send + Sync;

    /// The destination table of a source table.
    fn destination(&self, source: &TableId) -> Self::Table;

    /// Whether a table dropped in the source is dropped in the destination.
    fn drops_tables(&self) -> bool;

    /// What [`Warehouse::reconcile`] passes to [`super::schema::plan`]: the
    /// sink's `drop_columns`.
    fn evolution(&self) -> Evolution {
        Evolution::default()
    }

    /// Connects if not connected (and makes sure the bookkeeping tables
    /// exist). Called before every batch; cheap when connected.
    async fn connect(&mut self) -> Result<()>;

    /// Opens the unit that makes one batch durable, in `mode`.
    async fn begin(&mut self, mode: Mode) -> Result<()>;

    /// Stores `offsets` in the open unit and ends it: committed in
    /// [`Mode::Commit`], rolled back in [`Mode::Trial`]. Rows and offsets
    /// become visible together or not at all. A move whose fence does not
    /// hold (the stored offset is not the expected one) fails the unit with
    /// [`super::bookkeeping::fenced`]: checked in the unit, under the
    /// destination's own concurrency control, so that of two runners that
    /// both believe they own a partition only one commits.
    async fn finish(&mut self, offsets: &[OffsetMove<'_>]) -> Result<()>;

    /// Undoes the open unit after an error. Never fails: a session that
    /// cannot roll back is dropped (the next [`Warehouse::connect`] opens
    /// a new one).
    async fn abort(&mut self);

    /// Whether the unit can stay open after a batch
    /// ([`Warehouse::keep_open`]) and take the next ones
    /// ([`crate::UnitPart`]): one transaction of one session.
    fn spans_batches(&self) -> bool {
        false
    }

    /// Ends a batch's work leaving the unit open, no offsets stored: the
    /// next batch continues it (only where [`Warehouse::spans_batches`]).
    fn keep_open(&mut self) {}

    /// Whether a unit [`Warehouse::keep_open`] left open is still open:
    /// false once it ended or its session did.
    fn unit_open(&self) -> bool {
        false
    }

    /// Called with an error that is not about the data (retryable, needs an
    /// operator): forget what may no longer hold (cached table shapes, the
    /// session), so that the retry starts from the destination's own view.
    fn failed(&mut self, error: Error) -> Error;

    /// Makes `table` take the rows of `schema` from a source of kind
    /// `origin` (creates or evolves it, see [`super::schema::plan`]).
    /// Called once per schema version and batch; cache what is reconciled.
    async fn reconcile(&mut self, table: &Self::Table, schema: &TableSchema, origin: &str) -> Result<()>;

    /// Drops `table` (only called when [`Warehouse::drops_tables`]). In
    /// [`Mode::Trial`] a destination whose DDL cannot be undone does nothing.
    async fn drop_table(&mut self, table: &Self::Table) -> Result<()>;

    /// Makes `sequence` (named as a table, by [`Warehouse::destination`])
    /// exist with `state`'s definition and hand out no value before
    /// `state`'s next one: moved forward, never back. A destination without
    /// sequences keeps none (the default).
    async fn advance_sequence(
        &mut self,
        sequence: &Self::Table,
        state: &tributary_schemas::SequenceState,
    ) -> Result<()> {
        let _ = (sequence, state);
        Ok(())
    }

    /// Makes `table`'s indexes, constraints and defaults match `objects`
    /// (the source's whole set; `named`: the destination of each other
    /// table and sequence they name), each at its time: what a change
    /// applied in batches could break (unique and foreign keys) waits for
    /// a cutover. An object the destination refuses is said, and does not
    /// fail the batch. A destination without such objects keeps none (the
    /// default).
    async fn match_objects(
        &mut self,
        table: &Self::Table,
        objects: &tributary_schemas::TableObjects,
        named: &HashMap<TableId, Self::Table>,
    ) -> Result<()> {
        let _ = (table, objects, named);
        Ok(())
    }

    /// Removes every row of `table` older than `at` (a truncate; rows newer
    /// than it are a replay's and stay), and keeps `at` as the table-wide
    /// entry of the deleted-rows table ([`super::bookkeeping::TABLE_ROW_KEY`],
    /// unless a newer one is there), so that no older change arriving later
    /// writes a row again; the table's older key entries go.
    async fn truncate(&mut self, table: &Self::Table, at: Position) -> Result<()>;

    /// Forgets the position of every row of `table` (each becomes `(-1,
    /// -1)`, older than any change), in the open unit, unless reset `reset`
    /// (or a later one) of the table was already applied here: the table is
    /// copied again from a source whose positions do not compare with the
    /// stored ones, and the same reset arrives once per partition, the later
    /// ones after rows the copy already wrote. Remembers `reset` in the same
    /// unit. The rows stay (readers keep seeing the table) until the copy
    /// rewrites them or its table-copied record removes them.
    async fn forget_positions(&mut self, table: &Self::Table, reset: u64) -> Result<()>;

    /// Whether [`Warehouse::load_new`] is worth trying.
    fn loads_new_rows(&self) -> bool {
        false
    }

    /// Loads a group of reads and inserts straight into `table`, without
    /// reduction or staging, if none of its keys is there yet: `Some(true)`
    /// loaded, `Some(false)` refused and undone (a key exists), `None` not
    /// tried. Either of the last two lets [`Warehouse::write`] decide.
    async fn load_new(&mut self, _table: &Self::Table, _rows: &Group<'_>) -> Result<Option<bool>, ApplyError> {
        Ok(None)
    }

    /// Writes the reduced changes into `table`: each upsert and delete only
    /// where the stored row is older than the change (a delete also at the
    /// same position). Each delete keeps its position in the deleted-rows
    /// table (the newer of the two where its key has one); an upsert is
    /// written only where its position is newer than its key's deleted-row
    /// entry and the table-wide one, and removes its key's older entry.
    /// [`Warehouse::load_new`] must refuse (or not try) a group when the
    /// table has deleted-row entries. `after_load` is set
    /// when [`Warehouse::load_new`] was tried for this batch (or in a
    /// probe), so nothing cached about the session is to be trusted. A value
    /// the destination refuses is a permanent error naming its record.
    ///
    /// The changes of a table without a key ([`Reduction::is_keyless`])
    /// are not reduced and not guarded by the stored position: they are
    /// applied as [`super::keyless`] says (every insert a row named after
    /// its record, every delete removing one older row of its content or
    /// waiting for one), so that each counts once however often and in
    /// whatever order it arrives.
    async fn write(&mut self, table: &Self::Table, changes: &Reduction<'_>, after_load: bool)
        -> Result<(), ApplyError>;

    /// Marks the start of a probe inside the open (trial) unit.
    async fn savepoint(&mut self) -> Result<()>;

    /// Makes the destination check what the probe wrote (a destination that
    /// defers its statements runs them now); a refusal is the probe's error.
    async fn verify(&mut self) -> Result<(), ApplyError> {
        Ok(())
    }

    /// Undoes everything since [`Warehouse::savepoint`].
    async fn rollback_to_savepoint(&mut self) -> Result<()>;

    /// What `table` lacks to take the rows of `schema` from a source of
    /// kind `origin`, as committed: the changes [`Warehouse::reconcile`]
    /// would make, in the destination's words (empty: none); `None` when
    /// the destination cannot say (the default). For verification: the
    /// destination's columns and types against the source's.
    async fn schema_differences(
        &mut self,
        _table: &Self::Table,
        _schema: &TableSchema,
        _origin: &str,
    ) -> Result<Option<Vec<String>>> {
        Ok(None)
    }

    /// The rows of `table` whose key is in `range`, as committed (outside
    /// any unit), each as the values of `schema`'s columns in order, read
    /// back into the model's types as the sink's type mapping says (an
    /// absent table has none); `None` when the destination cannot read
    /// rows back (the default). For verification (see [`super::verify`]).
    async fn read_range(
        &mut self,
        _table: &Self::Table,
        _schema: &TableSchema,
        _range: &KeyRange,
    ) -> Result<Option<Vec<tributary_schemas::Row>>> {
        Ok(None)
    }

    /// The count and hash sum of the rows of `table` whose key is in
    /// `range`, computed as `summary` says the source computed its own
    /// (its method, over columns of its types), as committed: `Err` says
    /// why this destination cannot (the default: its rows are then asked
    /// of the source). For verification by summaries (see
    /// [`super::verify::Outcome::of_summary`]).
    async fn summarize(
        &mut self,
        _table: &Self::Table,
        _schema: &TableSchema,
        _range: &KeyRange,
        _summary: &tributary_schemas::records::RangeSummary,
    ) -> Result<std::result::Result<(u64, String), String>> {
        Ok(Err("this destination compares rows, not summaries".into()))
    }
}

/// What a [`Warehouse`] destination does besides applying batches, each
/// the part of a [`Sink`] method that differs between destinations; the
/// [`Sink`] implementation over it is this module's, the same for all.
/// Its methods are named apart from [`Sink`]'s, so that a call with both
/// traits in scope is never ambiguous.
#[async_trait]
pub trait WarehouseSink: Warehouse + Sized {
    /// The span [`Sink::apply`] runs in: the destination's name with the
    /// batch's table and record count (`info_span!("postgres_apply", table
    /// = %batch.table, records = batch.records.len())`), or
    /// `Span::none()` for none. Each sink writes its own, as a span's name
    /// is fixed where it is declared.
    fn apply_span(&self, batch: &SinkBatch) -> Span;

    /// What [`Sink::apply`] runs in that span: [`apply`] in
    /// [`Mode::Commit`]. A destination that must commit a batch in parts
    /// (Spanner, under its mutation limit) does so here; a trial
    /// ([`Sink::trial_apply`]) is always [`apply`] in [`Mode::Trial`], one
    /// unit.
    async fn commit(&mut self, batch: &SinkBatch) -> Result<(), ApplyError> {
        apply(self, batch, Mode::Commit).await
    }

    /// [`Sink::committed_offsets`]: the next offset stored for each of
    /// `partitions`, connecting first.
    async fn read_offsets(&mut self, partitions: &[(String, i32)]) -> Result<Vec<Option<i64>>>;

    /// [`Sink::check`]: the destination's setup problems.
    async fn problems(&mut self) -> Vec<Problem>;

    /// [`Sink::delete_copy`]: removes the stored offsets and the
    /// destination tables of `drop`; what it removed.
    async fn remove_copy(&mut self, drop: &[TableId]) -> Result<Vec<String>>;

    /// [`Warehouse::destination`] without the sink, for [`Sink::labeler`],
    /// which outlives it: a source table's destination table.
    fn destinations(&self) -> impl Fn(&TableId) -> Self::Table + Send + Sync + 'static;
}

/// The one [`Sink`] over a [`Warehouse`]: `apply` and `trial_apply` are
/// the core's [`apply`] (a trial on a destination whose DDL cannot be
/// undone keeps the schema changes it made: they are additive and the real
/// apply would make them anyway, see [`Mode::Trial`]); the labeler names a
/// table after its destination table.
#[async_trait]
impl<W: WarehouseSink> Sink for W {
    async fn committed_offsets(&mut self, partitions: &[(String, i32)]) -> Result<Vec<Option<i64>>> {
        self.read_offsets(partitions).await
    }

    async fn apply(&mut self, batch: &SinkBatch) -> Result<(), ApplyError> {
        let span = self.apply_span(batch);
        if batch.unit.spans() {
            // One unit over several batches: never split into parts.
            return apply(self, batch, Mode::Commit).instrument(span).await;
        }
        self.commit(batch).instrument(span).await
    }

    fn spans_batches(&self) -> bool {
        Warehouse::spans_batches(self)
    }

    async fn abandon_unit(&mut self) {
        if self.unit_open() {
            self.abort().await;
        }
    }

    async fn trial_apply(&mut self, batch: &SinkBatch) -> Result<(), ApplyError> {
        apply(self, batch, Mode::Trial).await
    }

    async fn check(&mut self) -> Vec<Problem> {
        self.problems().await
    }

    async fn delete_copy(&mut self, drop: &[TableId]) -> Result<Vec<String>> {
        self.remove_copy(drop).await
    }

    fn labeler(&self) -> Labeler {
        let destination = self.destinations();
        Arc::new(move |t: &TableId| destination(t).to_string())
    }

    async fn verify_range(
        &mut self,
        schema: &Arc<TableSchema>,
        range: &VerifyRange,
        repair: bool,
    ) -> Result<verify::Outcome> {
        let mut out = self.verify_ranges(schema, &[range], repair).await?;
        out.pop()
            .ok_or_else(|| Error::permanent("a verification compared no range").with_table(schema.id.clone()))
    }

    async fn verify_ranges(
        &mut self,
        schema: &Arc<TableSchema>,
        ranges: &[&VerifyRange],
        repair: bool,
    ) -> Result<Vec<verify::Outcome>> {
        let (Some(first), Some(last)) = (ranges.first(), ranges.last()) else {
            return Ok(Vec::new());
        };
        if self.unit_open() {
            // Its reads would end the unit a large transaction holds open.
            return Err(Error::retryable("a verification cannot read inside a transaction held open")
                .with_class(UNIT_LOST_CLASS)
                .with_table(schema.id.clone()));
        }
        let unsupported = |why: &str| -> Vec<verify::Outcome> {
            ranges.iter().map(|r| verify::Outcome::unsupported(schema, r, why)).collect()
        };
        // The columns the source digested (its current ones); a table
        // without a key with its content key as the key.
        let columns = &match verify::digested_shape(schema, first) {
            Ok(s) => s,
            Err(why) => return Ok(unsupported(&why)),
        };
        let schema = &if columns.key.is_empty() {
            Arc::new(crate::source::keyless::verification_shape(columns))
        } else {
            columns.clone()
        };
        // One read for the ranges together: from the first's lower bound
        // to the last's upper one (they follow each other).
        let whole = KeyRange::of(schema, first).and_then(|a| {
            let b = KeyRange::of(schema, last)?;
            Ok(KeyRange { after: a.after, until: b.until })
        });
        let each: std::result::Result<Vec<KeyRange>, String> = ranges.iter().map(|r| KeyRange::of(schema, r)).collect();
        let (whole, each) = match (whole, each) {
            (Ok(w), Ok(e)) => (w, e),
            (Err(why), _) | (_, Err(why)) => return Ok(unsupported(&why)),
        };
        if let Err(e) = self.connect().await {
            return Err(self.failed(e));
        }
        let table = self.destination(&schema.id);
        // Never a reason to hold the copy back: a range that cannot be
        // compared is reported as such, and the batch it leads applied.
        match verify_in(self, &table, columns, schema, ranges, &whole, &each, repair).await {
            Ok(outcomes) => Ok(outcomes),
            Err(e) => {
                let e = self.failed(e.or_table(&schema.id));
                Ok(unsupported(&format!("the range could not be compared: {e}")))
            }
        }
    }
}

/// [`Sink::verify_ranges`] on a connected destination: `ranges` (each
/// bounded by `each`) read back together (bounded by `whole`) as `schema`
/// (`columns`, the source's, with a content key for a table without a
/// key).
#[allow(clippy::too_many_arguments)]
async fn verify_in<W: Warehouse>(
    w: &mut W,
    table: &W::Table,
    columns: &Arc<TableSchema>,
    schema: &Arc<TableSchema>,
    ranges: &[&VerifyRange],
    whole: &KeyRange,
    each: &[KeyRange],
    repair: bool,
) -> Result<Vec<verify::Outcome>> {
    let Some(first) = ranges.first() else {
        return Ok(Vec::new());
    };
    // The columns first, at the first range of the table (one look per
    // verification): the rows can only be read back as the source's once
    // the table has them.
    let schema_differences = if first.after.is_none() {
        w.schema_differences(table, columns, &first.connector)
            .await?
            .unwrap_or_default()
    } else {
        Vec::new()
    };
    let mut out = Vec::with_capacity(ranges.len());
    if !schema_differences.is_empty() && !repair {
        // The first range reports the columns; the others compare rows.
        out.push(verify::Outcome::schema_differs(schema, first, schema_differences.clone()));
    } else if !schema_differences.is_empty() {
        // What the sink would do at the table's next change, now.
        w.begin(Mode::Commit).await?;
        match w.reconcile(table, columns, &first.connector).await {
            Ok(()) => w.finish(&[]).await?,
            Err(e) => {
                w.abort().await;
                return Err(e);
            }
        }
    }
    if first.summary.is_some() {
        // Summaries: the destination sums the same rows (no row is read
        // back here); a range that differs, or that it cannot sum, has its
        // rows asked of the source.
        for (i, (range, bounds)) in ranges.iter().zip(each).enumerate().skip(out.len()) {
            let computed = match &range.summary {
                // The changes of the other partitions' keys may not be
                // applied yet: a sum over every key cannot be compared.
                Some(_) if range.partition.is_some() => {
                    Err("the table's topic has several partitions, a summary covers them all".to_string())
                }
                Some(summary) => w.summarize(table, schema, bounds, summary).await?,
                None => Err("a range of a summarized verification has no summary".to_string()),
            };
            let mut outcome = verify::Outcome::of_summary(schema, range, computed);
            if i == 0 {
                outcome.schema = schema_differences.clone();
            }
            out.push(outcome);
        }
        return Ok(out);
    }
    let rows = match w.read_range(table, schema, whole).await {
        Ok(Some(rows)) => rows,
        Ok(None) => {
            let why = "this destination cannot read its rows back yet";
            out.extend(ranges[out.len()..].iter().map(|r| verify::Outcome::unsupported(schema, r, why)));
            return Ok(out);
        }
        // Columns the destination lacks cannot be read back: the first
        // range says which, the others that they were not compared.
        Err(e) if !out.is_empty() => {
            let why = format!("the range could not be compared: {e}");
            out.extend(
                ranges[out.len()..]
                    .iter()
                    .map(|r| verify::Outcome::unsupported(schema, r, &why)),
            );
            return Ok(out);
        }
        Err(e) => return Err(e),
    };
    let skip = out.len();
    for (i, (range, part)) in ranges.iter().zip(verify::split_rows(schema, each, rows)).enumerate().skip(skip) {
        let part = match verify::on_partition(schema, range, part) {
            Ok(part) => part,
            Err(why) => {
                out.push(verify::Outcome::unsupported(schema, range, why));
                continue;
            }
        };
        let mut outcome = verify::compare(schema, range, &part)?;
        if i == 0 {
            outcome.schema = schema_differences.clone();
        }
        // A table without a key is copied again instead (its rows have no
        // key a removal could name).
        if repair && !outcome.keyless {
            outcome.removed = verify::remove_extra(w, schema, range, &part, &outcome).await?;
        }
        out.push(outcome);
    }
    Ok(out)
}

/// Applies `batch` in `mode`: the whole batch and its offsets in one
/// durable step (see the module docs), or, on a permanent error, the index
/// of the record that caused it.
pub async fn apply<W: Warehouse>(w: &mut W, batch: &SinkBatch, mode: Mode) -> Result<(), ApplyError> {
    // A unit over several batches: only in Commit mode, where the
    // destination can hold one open, and on the session that opened it.
    let part = if mode == Mode::Commit {
        batch.unit
    } else {
        UnitPart::default()
    };
    if part.spans() && !w.spans_batches() {
        return Err(Error::permanent("this destination cannot keep one transaction open across batches")
            .with_class(UNIT_LOST_CLASS)
            .into());
    }
    if part.continues {
        if !w.unit_open() {
            return Err(Error::retryable(
                "the destination transaction holding the first parts of a large source transaction ended \
                 (its session was lost): the transaction is applied again",
            )
            .with_class(UNIT_LOST_CLASS)
            .into());
        }
    } else if let Err(e) = w.connect().await {
        return Err(w.failed(e).into());
    }
    let renamed = read_as_newest(&batch.records);
    let records = renamed.as_deref().unwrap_or(&batch.records);
    let offsets = offset_moves(&batch.next_offsets, &batch.expected_offsets);
    match unit(w, records, &offsets, mode, part).await {
        Ok(()) => Ok(()),
        // Probing the records one by one would end the open unit: the
        // runner applies the transaction again in parts, where it can.
        Err(f)
            if f.error.kind() == ErrorKind::Permanent && f.record.is_none() && !records.is_empty() && !part.spans() =>
        {
            locate(w, records, f.error).await
        }
        Err(f) => Err(f),
    }
}

/// The class of the error of a batch whose unit over several batches was
/// lost or cannot be had ([`crate::UnitPart`]).
pub const UNIT_LOST_CLASS: &str = "tributary.unit_lost";

/// The records with every older shape of a table read with the column
/// names of the table's newest shape in the batch, where that one renamed
/// columns (see `TableSchema::renamed_as`); `None` when nothing is renamed.
/// The decoder does the same across batches; this covers the events
/// decoded before the renaming version was first seen.
fn read_as_newest(records: &[(KafkaPosition, SinkRecord)]) -> Option<Vec<(KafkaPosition, SinkRecord)>> {
    use std::sync::Arc;
    // Nearly every batch has no renaming shape: found by looking at each
    // schema once (consecutive events share one Arc), before any per-record
    // work.
    let mut previous: Option<&Arc<TableSchema>> = None;
    let mut renames = false;
    for (_, r) in records {
        if let SinkRecord::Change(ev) = r {
            if previous.is_some_and(|p| Arc::ptr_eq(p, &ev.schema)) {
                continue;
            }
            previous = Some(&ev.schema);
            if ev.schema.columns.iter().any(|c| !c.aliases.is_empty()) {
                renames = true;
                break;
            }
        }
    }
    if !renames {
        return None;
    }
    // The newest shape of each table: that of its change at the highest
    // source position (records of several partitions interleave).
    let mut newest: Vec<(&Arc<TableSchema>, Position)> = Vec::new();
    for (_, r) in records {
        if let SinkRecord::Change(ev) = r {
            match newest.iter_mut().find(|(n, _)| n.id == ev.schema.id) {
                Some(n) if n.1 < ev.source.position => *n = (&ev.schema, ev.source.position),
                Some(_) => {}
                None => newest.push((&ev.schema, ev.source.position)),
            }
        }
    }
    let newest: Vec<&Arc<TableSchema>> = newest.into_iter().map(|(n, _)| n).collect();
    if newest.iter().all(|n| n.columns.iter().all(|c| c.aliases.is_empty())) {
        return None;
    }
    let mut seen: Vec<(*const TableSchema, Option<Arc<TableSchema>>)> = Vec::new();
    let mut any = false;
    let mut out = records.to_vec();
    for (_, r) in &mut out {
        let SinkRecord::Change(ev) = r else { continue };
        let address = Arc::as_ptr(&ev.schema);
        let to = match seen.iter().find(|(a, _)| *a == address) {
            Some((_, to)) => to.clone(),
            None => {
                let to = newest
                    .iter()
                    .find(|n| n.id == ev.schema.id && !Arc::ptr_eq(n, &ev.schema))
                    .and_then(|n| ev.schema.renamed_as(n))
                    .map(Arc::new);
                seen.push((address, to.clone()));
                to
            }
        };
        if let Some(to) = to {
            ev.schema = to;
            any = true;
        }
    }
    any.then_some(out)
}

/// One unit over `records` and `offsets`.
async fn unit<W: Warehouse>(
    w: &mut W,
    records: &[(KafkaPosition, SinkRecord)],
    offsets: &[OffsetMove<'_>],
    mode: Mode,
    part: UnitPart,
) -> Result<(), ApplyError> {
    if !part.continues {
        w.begin(mode).await?;
    }
    let result = async {
        apply_records(w, records, false).await?;
        if part.more {
            w.keep_open();
        } else {
            w.finish(offsets).await?;
        }
        Ok::<(), ApplyError>(())
    }
    .await;
    if let Err(mut failure) = result {
        w.abort().await;
        if failure.error.kind() != ErrorKind::Permanent {
            failure.error = w.failed(failure.error);
        }
        return Err(failure);
    }
    Ok(())
}

/// Applies `records` inside the open unit. `probe`: inside a bisection
/// probe (nothing is loaded straight in; cached session state is not
/// trusted).
async fn apply_records<W: Warehouse>(
    w: &mut W,
    records: &[(KafkaPosition, SinkRecord)],
    probe: bool,
) -> Result<(), ApplyError> {
    for segment in segments(records) {
        match segment {
            Segment::Dropped(id) => table_dropped(w, id).await?,
            Segment::Copied(id, at) => table_copied(w, id, at).await?,
            Segment::Reset(id, reset) => table_reset(w, id, reset).await?,
            Segment::Sequence(id, state) => {
                let sequence = w.destination(&state.id());
                w.advance_sequence(&sequence, state).await.map_err(|e| e.or_table(id))?
            }
            Segment::Objects(id, objects) => {
                let table = w.destination(id);
                // Another table or sequence an object names, as this
                // destination names it.
                let named: HashMap<TableId, W::Table> = objects
                    .constraints
                    .iter()
                    .filter_map(|c| c.references.as_ref().map(|r| &r.table))
                    .chain(objects.defaults.iter().filter_map(|d| d.sequence.as_ref()))
                    .map(|t| (t.clone(), w.destination(t)))
                    .collect();
                w.match_objects(&table, objects, &named).await.map_err(|e| e.or_table(id))?
            }
            Segment::Changes { start, records: run } => {
                for (table, events) in group_by_destination(run, start, |t| w.destination(t)) {
                    let span = info_span!("table", table = %table, events = events.len());
                    let source = events.first().map(|(_, ev)| ev.schema.id.clone());
                    apply_table(w, &table, &events, records, probe)
                        .instrument(span)
                        .await
                        .map_err(|mut f| {
                            // Errors name the source table (dead-letter headers,
                            // status): the destination's own messages do not.
                            if let Some(id) = &source {
                                f.error = f.error.or_table(id);
                            }
                            f
                        })?;
                }
            }
        }
    }
    Ok(())
}

/// A table copied again: its rows older than the copy are gone at the
/// source (deleted while its changes were held back).
async fn table_copied<W: Warehouse>(w: &mut W, id: &TableId, at: Position) -> Result<()> {
    let table = w.destination(id);
    debug!(table = %table, "table copied again; removing the rows the copy did not rewrite");
    w.truncate(&table, at).await.map_err(|e| e.or_table(id))
}

/// A table about to be copied again in another position domain: its
/// rows' positions are forgotten, so that the copy's rows pass the guard.
async fn table_reset<W: Warehouse>(w: &mut W, id: &TableId, reset: u64) -> Result<()> {
    let table = w.destination(id);
    debug!(table = %table, reset, "table reset; forgetting the positions of its rows");
    w.forget_positions(&table, reset).await.map_err(|e| e.or_table(id))
}

async fn table_dropped<W: Warehouse>(w: &mut W, id: &TableId) -> Result<()> {
    let table = w.destination(id);
    if w.drops_tables() {
        w.drop_table(&table).await.map_err(|e| e.or_table(id))
    } else {
        debug!(table = %table, "source table dropped; kept (drop_tables = false)");
        Ok(())
    }
}

/// The change events of one destination table, each with its index in
/// `records` (the batch). A table that gained or lost its key meanwhile
/// has events of both kinds: each run of one kind is applied in turn.
async fn apply_table<W: Warehouse>(
    w: &mut W,
    table: &W::Table,
    events: &[(usize, &ChangeEvent)],
    records: &[(KafkaPosition, SinkRecord)],
    probe: bool,
) -> Result<(), ApplyError> {
    let keyless = |e: &(usize, &ChangeEvent)| e.1.schema.key.is_empty();
    let mut rest = events;
    while let Some(first) = rest.first() {
        let kind = keyless(first);
        let end = rest.iter().position(|e| keyless(e) != kind).unwrap_or(rest.len());
        apply_run(w, table, &rest[..end], records, probe).await?;
        rest = &rest[end..];
    }
    Ok(())
}

/// [`apply_table`] for events of one kind: all of a keyed table, or all of
/// a table without a key (see [`super::keyless`]).
async fn apply_run<W: Warehouse>(
    w: &mut W,
    table: &W::Table,
    events: &[(usize, &ChangeEvent)],
    records: &[(KafkaPosition, SinkRecord)],
    probe: bool,
) -> Result<(), ApplyError> {
    let keyless = events.first().is_some_and(|(_, ev)| ev.schema.key.is_empty());
    // 1. The table fits every schema version (the decoder shares one Arc
    // per version, so a version is recognised by its address).
    let mut seen: Vec<usize> = Vec::new();
    for &(i, ev) in events {
        let address = std::sync::Arc::as_ptr(&ev.schema) as usize;
        if seen.contains(&address) {
            continue;
        }
        seen.push(address);
        w.reconcile(table, &ev.schema, &ev.source.connector)
            .await
            .map_err(|error| ApplyError { error, record: Some(i) })?;
    }
    // 2. The newest truncate removes every older row.
    let truncate = newest_truncate(events);
    if let Some(at) = truncate {
        w.truncate(table, at).await?;
    }
    // 3. A run of reads and inserts of one schema version (a snapshot
    // chunk) may go straight in: reducing it first (rendering and hashing
    // every key) kept the destination idle an eighth of a snapshot batch.
    let mut load_tried = false;
    if truncate.is_none() && !probe && w.loads_new_rows() {
        if let Some(group) = Group::inserts_only(events) {
            match w.load_new(table, &group).await? {
                Some(true) => return Ok(()),
                // Refused, or skipped after an earlier refusal: the reduced
                // rows go the ordinary way.
                Some(false) | None => load_tried = true,
            }
        }
    }
    // 4. The last change per key, written under the position guard; a
    // table without a key: every change, each row named after its record.
    let reduced = if keyless {
        Reduction::keyless(events, truncate, |i| records.get(i).map(|(at, _)| record_id(at)).unwrap_or_default())?
    } else {
        Reduction::of(events, truncate)?
    };
    if reduced.is_empty() {
        return Ok(());
    }
    w.write(table, &reduced, probe || load_tried).await
}

/// Finds the first record of `records` that fails with a permanent error:
/// every schema change first (its failure names the record at once), then
/// bisection on prefixes, each probe undone, all in one trial unit.
async fn locate<W: Warehouse>(
    w: &mut W,
    records: &[(KafkaPosition, SinkRecord)],
    original: Error,
) -> Result<(), ApplyError> {
    let span = info_span!("locate_failed_record", records = records.len());
    async {
        w.begin(Mode::Trial).await?;
        let result = async {
            reconcile_all(w, records).await?;
            locate_failed_record(&mut Prefixes { w: &mut *w, records }, records.len(), original).await
        }
        .await;
        w.abort().await;
        result
    }
    .instrument(span)
    .await
}

async fn reconcile_all<W: Warehouse>(w: &mut W, records: &[(KafkaPosition, SinkRecord)]) -> Result<(), ApplyError> {
    for (i, (_, record)) in records.iter().enumerate() {
        match record {
            SinkRecord::Change(ev) => {
                let table = w.destination(&ev.schema.id);
                w.reconcile(&table, &ev.schema, &ev.source.connector)
                    .await
                    .map_err(|error| ApplyError { error, record: Some(i) })?;
            }
            SinkRecord::TableDropped(id) => table_dropped(w, id).await?,
            SinkRecord::Copied(id, at) => table_copied(w, id, *at).await?,
            SinkRecord::Reset(id, reset) => table_reset(w, id, *reset).await?,
            // Nothing to reconcile; applied with the prefix that holds it
            // (a verify record: compared before the batch).
            SinkRecord::Sequence(..) | SinkRecord::Objects(..) | SinkRecord::Verify(..) => {}
        }
    }
    Ok(())
}

/// Prefixes of a batch, each applied and undone.
struct Prefixes<'a, W> {
    w: &'a mut W,
    records: &'a [(KafkaPosition, SinkRecord)],
}

#[async_trait]
impl<W: Warehouse> PrefixProbe for Prefixes<'_, W> {
    async fn probe(&mut self, n: usize) -> Result<(), ApplyError> {
        self.w.savepoint().await?;
        let result = match apply_records(self.w, &self.records[..n], true).await {
            Ok(()) => self.w.verify().await,
            Err(e) => Err(e),
        };
        self.w.rollback_to_savepoint().await?;
        result
    }
}

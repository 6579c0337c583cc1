//! The `Sink` trait: what every destination gives the sink runner.

use async_trait::async_trait;
use tributary_schemas::{ChangeEvent, TableId};

use crate::error::{Error, ErrorKind, Result};

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

/// One problem found by a sink's setup check, with what to do about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckProblem {
    /// What is wrong.
    pub problem: String,
    /// How to fix it.
    pub fix: String,
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

/// Expands a destination table name template: `{schema}` and `{table}`
/// stand for the source table's schema and name. One pass, so a
/// placeholder-looking text inside a name is kept as it is.
pub fn expand_table_template(template: &str, source: &TableId) -> String {
    let mut table = String::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        table.push_str(&rest[..open]);
        let after = &rest[open..];
        if let Some(r) = after.strip_prefix("{table}") {
            table.push_str(&source.table);
            rest = r;
        } else if let Some(r) = after.strip_prefix("{schema}") {
            table.push_str(&source.schema);
            rest = r;
        } else {
            table.push('{');
            rest = &after[1..];
        }
    }
    table.push_str(rest);
    table
}

/// Checks a destination table name template (see [`expand_table_template`]):
/// the rule it breaks, if any.
pub fn check_table_template(template: &str) -> Result<(), &'static str> {
    if !template.contains("{table}") {
        return Err("must contain {table}, or every source table would land in the same destination table");
    }
    let stripped = template.replace("{table}", "").replace("{schema}", "");
    if stripped.contains('{') || stripped.contains('}') {
        return Err("may only use the placeholders {schema} and {table}");
    }
    Ok(())
}

/// A run of a batch's records, as sinks apply them: a table drop, or the
/// change records between two drops.
#[derive(Debug)]
pub enum Segment<'a> {
    /// The source table was dropped.
    Dropped(&'a TableId),
    /// Change records with no drop in between; `start` is the index of the
    /// first one in the batch.
    Changes {
        /// Index of `records[0]` in the batch.
        start: usize,
        /// The records.
        records: &'a [(KafkaPosition, SinkRecord)],
    },
}

/// Splits records at table drops (a drop must happen between the changes
/// before it and those after it).
pub fn segments(records: &[(KafkaPosition, SinkRecord)]) -> Vec<Segment<'_>> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < records.len() {
        match &records[i].1 {
            SinkRecord::TableDropped(id) => {
                out.push(Segment::Dropped(id));
                i += 1;
            }
            SinkRecord::Change(_) => {
                let end = records[i..]
                    .iter()
                    .position(|(_, r)| matches!(r, SinkRecord::TableDropped(_)))
                    .map_or(records.len(), |p| i + p);
                out.push(Segment::Changes { start: i, records: &records[i..end] });
                i = end;
            }
        }
    }
    out
}

/// The change events of `records` grouped by destination table, in order
/// of first appearance, each with its index in the batch (`base` + its
/// index in `records`).
pub fn group_by_destination<'a, D: PartialEq>(
    records: &'a [(KafkaPosition, SinkRecord)],
    base: usize,
    destination: impl Fn(&TableId) -> D,
) -> Vec<(D, Vec<(usize, &'a ChangeEvent)>)> {
    let mut groups: Vec<(D, Vec<(usize, &'a ChangeEvent)>)> = Vec::new();
    // A batch is mostly one table: its events go to the last group without
    // rendering their destination name (a template, so allocations) each.
    let mut last: Option<(&'a TableId, usize)> = None;
    for (i, (_, record)) in records.iter().enumerate() {
        if let SinkRecord::Change(ev) = record {
            let g = match last {
                Some((id, g)) if *id == ev.schema.id => g,
                _ => {
                    let dest = destination(&ev.schema.id);
                    let g = match groups.iter().position(|(d, _)| *d == dest) {
                        Some(g) => g,
                        None => {
                            groups.push((dest, Vec::new()));
                            groups.len() - 1
                        }
                    };
                    last = Some((&ev.schema.id, g));
                    g
                }
            };
            groups[g].1.push((base + i, ev));
        }
    }
    groups
}

/// Applies a prefix of a batch and undoes it, for [`locate_failed_record`].
#[async_trait]
pub trait PrefixProbe: Send {
    /// Applies the first `n` records of the batch, then undoes them.
    async fn probe(&mut self, n: usize) -> Result<(), ApplyError>;
}

/// Finds the first record of a batch of `len` records that fails with a
/// permanent error, by bisecting on prefixes; `original` is the error the
/// whole batch failed with. A record a probe names directly (a value that
/// cannot be rendered, a schema change) ends the search at once.
pub async fn locate_failed_record<P: PrefixProbe>(
    probe: &mut P,
    len: usize,
    original: Error,
) -> Result<(), ApplyError> {
    let (mut lo, mut hi) = (0usize, len);
    let mut error_at_hi = original;
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        match probe.probe(mid).await {
            Ok(()) => lo = mid,
            Err(f) if f.error.kind() == ErrorKind::Permanent => {
                if let Some(i) = f.record {
                    return Err(ApplyError { error: f.error, record: Some(i) });
                }
                hi = mid;
                error_at_hi = f.error;
            }
            Err(f) => return Err(f),
        }
    }
    if hi == len {
        // Confirm with the whole batch: this also refreshes the error (its
        // column) for the record found.
        match probe.probe(len).await {
            Ok(()) => {
                tracing::warn!("a permanent error did not repeat when the batch was applied again");
                return Err(ApplyError::from(
                    Error::retryable("the batch failed once with a data error that did not repeat")
                        .with_class("tributary.flaky"),
                ));
            }
            Err(f) if f.error.kind() == ErrorKind::Permanent => error_at_hi = f.error,
            Err(f) => return Err(f),
        }
    }
    Err(ApplyError { error: error_at_hi, record: Some(hi - 1) })
}

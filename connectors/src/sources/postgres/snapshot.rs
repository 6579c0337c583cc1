//! The snapshot: every selected table read once, consistently with the
//! replication slot, in parallel, in chunks that are each one resumable
//! [`SourceBatch`](crate::SourceBatch).
//!
//! # Consistency
//!
//! On a first start the slot is created with `EXPORT_SNAPSHOT`; every worker
//! connection runs `BEGIN ISOLATION LEVEL REPEATABLE READ` and
//! `SET TRANSACTION SNAPSHOT '<id>'`, so all of them see exactly the data as
//! of the slot's consistent point. Rows carry that LSN as their position
//! (index 0); streaming starts at the same LSN.
//!
//! # Resuming, and tables added later
//!
//! The checkpoint records, per table, each key range ("segment"), the last
//! key emitted in it and whether it is done. After a crash the exported
//! snapshot is gone, so the unfinished ranges are read in a new snapshot,
//! exported by a *temporary* replication slot. Its consistent point `P`
//! divides transactions exactly: those committing before `P` are in the
//! snapshot, those committing at or after it are not. The source first
//! streams the main slot from its checkpoint up to `P` (everything the
//! snapshot already reflects, emitted as ordinary changes), then emits the
//! snapshot's rows with position `P`, then streams on from `P`. So every
//! change is emitted exactly once, and per key in position order: a consumer
//! never sees a row older than one it already saw. Tables that appear while
//! streaming are read the same way.
//!
//! # Reading
//!
//! Each segment is one `COPY (SELECT ... ORDER BY key) TO STDOUT`, decoded
//! row by row and cut into chunks of `snapshot_chunk_rows`: in binary when
//! every column has a binary reader (`types::binary_columns`, each giving
//! the value the text decoder gives), else as text with the same text
//! decoders as pgoutput. Chunks go through a channel of
//! one slot per worker, so memory stays bounded by a few chunks.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tracing::Instrument;
use tributary_schemas::{
    ChangeEvent, DataType, Op, Position, Row, SnapshotMarker, SourceInfo, TableId, TableSchema, Value,
};

use super::client::{classify_pg, connect};
use super::config::ConnectionParams;
use super::types::{
    binary_columns, binary_key_ok, copy_fields, decode_binary, decode_text, key_literal_text, unescape_copy_field,
    BinaryType, ColumnRef, BINARY_COPY_SIGNATURE,
};
use super::{format_lsn, EventContext};
use crate::error::{Error, Result};
use crate::pgwire::{quote_ident, quote_literal, quote_table};
use crate::SourceMessage;
use tributary_schemas::records::requests::KeyBounds;

/// How often snapshot progress is logged.
pub const PROGRESS_LOG_INTERVAL: Duration = Duration::from_secs(5);

/// Snapshot work recorded in a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct SnapshotState {
    /// Whether this is the initial snapshot (its last row is marked `last`)
    /// rather than the snapshot of tables created later.
    #[serde(default)]
    pub initial: bool,
    /// Tables to copy, in order.
    pub tables: Vec<TablePlan>,
}

impl SnapshotState {
    /// Whether every segment of every table is done.
    pub fn is_done(&self) -> bool {
        self.tables
            .iter()
            .all(|t| !t.segments.is_empty() && t.segments.iter().all(|s| s.done))
    }
}

/// One table's snapshot progress.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TablePlan {
    /// Schema.
    pub schema: String,
    /// Table.
    pub table: String,
    /// Key ranges; empty until planned.
    #[serde(default)]
    pub segments: Vec<Segment>,
    /// Set when the table is read to verify it, not copied: the
    /// verification's id. Its rows go out as ranges of digests
    /// ([`SourceMessage::Verify`]), read in one segment in the key's
    /// binary order, from the start again after a restart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verify: Option<u64>,
    /// The rows per second a verification reads at most (0: no bound).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub verify_rate: u64,
    /// Set when the table's rows of these keys (canonical key texts) are
    /// sent again to repair them, not the whole table copied; the
    /// verification `verify` is made once they are out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repair: Option<Vec<String>>,
    /// With `verify`, when not 0: the verification sends summaries the
    /// database computes ([`crate::pgwire::summary`]) of this many keys
    /// each, instead of row digests.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub verify_summary: u64,
    /// With `verify`: only these key ranges are verified, with their row
    /// digests (the ranges whose summaries a destination found different).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verify_within: Option<Vec<KeyBounds>>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl TablePlan {
    /// A table not planned yet.
    pub fn new(id: &TableId) -> Self {
        Self {
            schema: id.schema.clone(),
            table: id.table.clone(),
            segments: Vec::new(),
            verify: None,
            verify_rate: 0,
            repair: None,
            verify_summary: 0,
            verify_within: None,
        }
    }

    /// The rows of `keys` of a table to send again, then verify it
    /// (verification `verify_after`, at most `rows_per_second`).
    pub fn repair(id: &TableId, keys: Vec<String>, verify_after: u64, rows_per_second: u64) -> Self {
        Self {
            repair: Some(keys),
            ..Self::verify(id, verify_after, rows_per_second)
        }
    }

    /// A table to verify (verification `id`, at most `rows_per_second`),
    /// not copy.
    pub fn verify(id: &TableId, verification: u64, rows_per_second: u64) -> Self {
        Self {
            verify: Some(verification),
            verify_rate: rows_per_second,
            ..Self::new(id)
        }
    }

    /// A table to verify by summaries of `range_rows` keys
    /// ([`TablePlan::verify_summary`]).
    pub fn verify_by_summaries(id: &TableId, verification: u64, rows_per_second: u64, range_rows: u64) -> Self {
        Self {
            verify_summary: range_rows,
            ..Self::verify(id, verification, rows_per_second)
        }
    }

    /// The key ranges `within` of a table to verify with their rows'
    /// digests ([`TablePlan::verify_within`]).
    pub fn verify_ranges(id: &TableId, verification: u64, within: Vec<KeyBounds>, rows_per_second: u64) -> Self {
        Self {
            verify_within: Some(within),
            ..Self::verify(id, verification, rows_per_second)
        }
    }

    /// The table id.
    pub fn id(&self) -> TableId {
        TableId::new(&self.schema, &self.table)
    }
}

/// A key range of a table: `(lo, hi]` on a single integer key column, or
/// the whole table (`lo` and `hi` unset).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Segment {
    /// Exclusive lower bound (integer keys only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lo: Option<i64>,
    /// Inclusive upper bound (integer keys only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hi: Option<i64>,
    /// Text of the key columns of the last row emitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last: Option<Vec<Option<String>>>,
    /// Whether every row of the range was emitted.
    #[serde(default)]
    pub done: bool,
    /// Whether a row of the range was emitted: a table without a key
    /// (read without an order, so without a resume point) whose copy
    /// stopped part-way is copied again whole, with a sweep of what the
    /// first part wrote (see `PostgresSource::start_snapshot_run`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub started: bool,
}

/// Progress of a running snapshot, readable by the runner at any time.
#[derive(Debug, Default)]
pub struct SnapshotProgress {
    tables: Mutex<BTreeMap<TableId, Arc<TableProgress>>>,
}

/// One table's progress.
#[derive(Debug)]
pub struct TableProgress {
    /// Rows read so far (this run).
    pub rows: AtomicU64,
    /// `pg_class.reltuples` when the table was planned (-1 unknown).
    pub estimated_rows: AtomicU64,
    /// Whether the table is done.
    pub done: AtomicBool,
    started: Instant,
}

/// A point-in-time copy of one table's progress.
#[derive(Debug, Clone, PartialEq)]
pub struct TableProgressView {
    /// The table.
    pub table: TableId,
    /// Rows read so far.
    pub rows: u64,
    /// Estimated total rows.
    pub estimated_rows: u64,
    /// Rows per second since the table started.
    pub rows_per_sec: f64,
    /// Estimated time left, when it can be estimated.
    pub eta: Option<Duration>,
    /// Whether the table is done.
    pub done: bool,
}

impl SnapshotProgress {
    /// The progress of `table`, created on first use.
    pub fn table(&self, table: &TableId, estimated_rows: u64) -> Arc<TableProgress> {
        let mut tables = self.tables.lock().unwrap_or_else(|e| e.into_inner());
        tables
            .entry(table.clone())
            .or_insert_with(|| {
                Arc::new(TableProgress {
                    rows: AtomicU64::new(0),
                    estimated_rows: AtomicU64::new(estimated_rows),
                    done: AtomicBool::new(false),
                    started: Instant::now(),
                })
            })
            .clone()
    }

    /// Drops `table`'s progress: its next copy starts from nothing, and is
    /// not done before it ran (the runner takes a done table for a
    /// complete copy of it).
    pub fn forget(&self, table: &TableId) {
        self.tables.lock().unwrap_or_else(|e| e.into_inner()).remove(table);
    }

    /// Every table's progress.
    pub fn view(&self) -> Vec<TableProgressView> {
        let tables = self.tables.lock().unwrap_or_else(|e| e.into_inner());
        tables
            .iter()
            .map(|(id, p)| {
                let rows = p.rows.load(Ordering::Relaxed);
                let estimated = p.estimated_rows.load(Ordering::Relaxed);
                let secs = p.started.elapsed().as_secs_f64().max(0.001);
                let rate = rows as f64 / secs;
                let done = p.done.load(Ordering::Relaxed);
                let eta = if done {
                    Some(Duration::ZERO)
                } else if rate > 0.0 && estimated > rows {
                    Some(Duration::from_secs_f64((estimated - rows) as f64 / rate))
                } else {
                    None
                };
                TableProgressView {
                    table: id.clone(),
                    rows,
                    estimated_rows: estimated,
                    rows_per_sec: rate,
                    eta,
                    done,
                }
            })
            .collect()
    }

    fn log(&self) {
        for t in self.view().into_iter().filter(|t| !t.done && t.rows > 0) {
            tracing::info!(
                table = %t.table,
                rows = t.rows,
                estimated_rows = t.estimated_rows,
                rows_per_sec = t.rows_per_sec as u64,
                eta_secs = t.eta.map(|d| d.as_secs()),
                "snapshot progress"
            );
        }
    }
}

/// A snapshot exported by a replication slot for the workers to import.
#[derive(Debug, Clone)]
pub struct ExportedSnapshot {
    /// Snapshot name (`SET TRANSACTION SNAPSHOT`).
    pub name: String,
    /// The slot's consistent point: the position of every row read.
    pub lsn: u64,
}

/// A table to copy: its schema and plan.
#[derive(Debug, Clone)]
pub struct SnapshotTable {
    /// Schema (columns read, key).
    pub schema: Arc<TableSchema>,
    /// Whether the key is unique (primary or configured key), so the table
    /// can be read in key order and resumed by key.
    pub keyed: bool,
    /// Whether the table is partitioned: read with its partitions (any
    /// other table is read `ONLY`, without inheritance children).
    pub partitioned: bool,
    /// Progress so far.
    pub plan: TablePlan,
}

/// One chunk read by a worker.
#[derive(Debug)]
pub struct Chunk {
    /// Index into the run's tables.
    pub table: usize,
    /// Index into the table's segments.
    pub segment: usize,
    /// The `Read` events.
    pub messages: Vec<SourceMessage>,
    /// Key text of the last row of the chunk.
    pub last: Option<Vec<Option<String>>>,
    /// Whether the segment is finished with this chunk.
    pub done: bool,
}

/// A running snapshot. Dropping it stops the workers.
pub struct SnapshotRun {
    rx: mpsc::Receiver<Result<Chunk>>,
    tasks: JoinSet<()>,
    /// Position of every row of this run.
    pub lsn: u64,
    /// Tables with their (planned) segments.
    pub tables: Vec<SnapshotTable>,
}

impl std::fmt::Debug for SnapshotRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnapshotRun").field("lsn", &self.lsn).finish_non_exhaustive()
    }
}

/// What a worker needs besides its connection.
struct WorkerShared {
    tables: Vec<SnapshotTable>,
    queue: Mutex<VecDeque<(usize, usize)>>,
    chunk_rows: usize,
    ctx: EventContext,
    lsn: u64,
    progress: Arc<SnapshotProgress>,
}

impl SnapshotRun {
    /// Opens the worker connections, imports the snapshot, plans unplanned
    /// tables and starts reading. Returns once every worker holds the
    /// snapshot, so the exporting session may then be released.
    pub async fn start(
        params: &ConnectionParams,
        mut tables: Vec<SnapshotTable>,
        snapshot: ExportedSnapshot,
        parallelism: usize,
        chunk_rows: u64,
        ctx: EventContext,
        progress: Arc<SnapshotProgress>,
    ) -> Result<SnapshotRun> {
        let ExportedSnapshot { name: snapshot_name, lsn } = snapshot;
        let workers = parallelism.max(1);
        let mut clients = Vec::with_capacity(workers);
        for _ in 0..workers {
            let client = connect(params).await?;
            client
                .batch_execute(&format!(
                    "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SET TRANSACTION SNAPSHOT {}",
                    quote_literal(&snapshot_name)
                ))
                .await
                .map_err(|e| classify_pg(e, "importing the snapshot"))?;
            clients.push(client);
        }

        // Plan tables that have no segments yet, inside the snapshot.
        for t in tables.iter_mut() {
            if t.plan.verify.is_some() {
                // A verification or repair has no resume point (its ranges are each
                // compared at their own position): read whole, from the
                // start, and not shown as a copy.
                t.plan.segments = vec![Segment::default()];
                continue;
            }
            let estimate = estimate_rows(&clients[0], &t.schema.id).await?;
            progress.table(&t.schema.id, estimate);
            if t.plan.segments.is_empty() {
                t.plan.segments = plan_segments(&clients[0], t, estimate, workers, chunk_rows).await?;
            } else if t.plan.segments.iter().all(|s| s.done) {
                // Copied whole, and given out, before a restart: no chunk of
                // it comes, and its status must not say it is copied still.
                mark_table_done(&progress, &t.schema.id);
            }
        }
        let mut queue = VecDeque::new();
        for (ti, t) in tables.iter().enumerate() {
            for (si, s) in t.plan.segments.iter().enumerate() {
                if !s.done {
                    queue.push_back((ti, si));
                }
            }
        }
        let shared = Arc::new(WorkerShared {
            tables: tables.clone(),
            queue: Mutex::new(queue),
            chunk_rows: chunk_rows as usize,
            ctx,
            lsn,
            progress: progress.clone(),
        });
        // One finished chunk waits while the runner produces another: the
        // workers (each filling a chunk) keep the runner busy, and memory
        // stays at a few chunks (each snapshot_chunk_rows decoded rows).
        let (tx, rx) = mpsc::channel(1);
        let mut tasks = JoinSet::new();
        for client in clients {
            let shared = shared.clone();
            let tx = tx.clone();
            tasks.spawn(async move {
                if let Err(e) = run_worker(&client, &shared, &tx).await {
                    let _ = tx.send(Err(e)).await;
                }
            });
        }
        let logger_progress = progress.clone();
        tasks.spawn(async move {
            let mut tick = tokio::time::interval(PROGRESS_LOG_INTERVAL);
            tick.tick().await;
            loop {
                tick.tick().await;
                logger_progress.log();
            }
        });
        drop(tx);
        Ok(SnapshotRun { rx, tasks, lsn, tables })
    }

    /// The next chunk, `None` once every worker finished.
    pub async fn next_chunk(&mut self) -> Result<Option<Chunk>> {
        match self.rx.recv().await {
            Some(Ok(chunk)) => Ok(Some(chunk)),
            Some(Err(e)) => Err(e),
            None => {
                self.tasks.abort_all();
                Ok(None)
            }
        }
    }
}

async fn estimate_rows(client: &tokio_postgres::Client, table: &TableId) -> Result<u64> {
    let row = client
        .query_one(
            "SELECT c.reltuples::float8 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = $1 AND c.relname = $2",
            &[&table.schema, &table.table],
        )
        .await
        .map_err(|e| classify_pg(e, "estimating the table size").with_table(table.clone()))?;
    let n: f64 = row.get(0);
    Ok(if n > 0.0 { n as u64 } else { 0 })
}

/// Splits a table with a single integer key into ranges so that several
/// workers can read it at once; any other table is one segment.
async fn plan_segments(
    client: &tokio_postgres::Client,
    t: &SnapshotTable,
    estimate: u64,
    workers: usize,
    chunk_rows: u64,
) -> Result<Vec<Segment>> {
    let whole = vec![Segment::default()];
    let keys = t.schema.key_indexes();
    if !t.keyed || keys.len() != 1 || workers < 2 || estimate < chunk_rows * 2 {
        return Ok(whole);
    }
    let key = &t.schema.columns[keys[0]];
    if !matches!(key.data_type, DataType::Int16 | DataType::Int32 | DataType::Int64) {
        return Ok(whole);
    }
    let sql = format!(
        "SELECT min({k})::int8, max({k})::int8 FROM {t}",
        k = quote_ident(&key.name),
        t = quote_table(&t.schema.id)
    );
    let row = client
        .query_one(&sql, &[])
        .await
        .map_err(|e| classify_pg(e, "reading the key range").with_table(t.schema.id.clone()))?;
    let (Some(min), Some(max)) = (row.get::<_, Option<i64>>(0), row.get::<_, Option<i64>>(1)) else {
        return Ok(whole);
    };
    let parts = (estimate / chunk_rows).clamp(1, workers as u64 * 4) as i128;
    let span = max as i128 - min as i128 + 1;
    if parts < 2 || span < parts {
        return Ok(whole);
    }
    let mut segments = Vec::with_capacity(parts as usize);
    let mut lo: Option<i64> = None;
    for i in 1..parts {
        let bound = (min as i128 + span * i / parts - 1) as i64;
        segments.push(Segment { lo, hi: Some(bound), ..Segment::default() });
        lo = Some(bound);
    }
    segments.push(Segment { lo, hi: None, ..Segment::default() });
    Ok(segments)
}

/// The `COPY` statement reading the rest of one segment in key order.
fn segment_query(t: &SnapshotTable, seg: &Segment, binary: bool) -> String {
    let mut sql = segment_select(t, seg);
    if binary {
        sql.push_str(" (FORMAT binary)");
    }
    sql
}

/// [`segment_query`] in text format.
fn segment_select(t: &SnapshotTable, seg: &Segment) -> String {
    let schema = &t.schema;
    let cols = schema
        .columns
        .iter()
        .map(|c| quote_ident(&c.name))
        .collect::<Vec<_>>()
        .join(", ");
    let only = if t.partitioned { "" } else { "ONLY " };
    let mut sql = format!("COPY (SELECT {cols} FROM {only}{}", quote_table(&schema.id));
    if !t.keyed {
        sql.push_str(") TO STDOUT");
        return sql;
    }
    let keys = schema.key_indexes();
    let key_list = keys
        .iter()
        .map(|&i| quote_ident(&schema.columns[i].name))
        .collect::<Vec<_>>()
        .join(", ");
    let mut conds = Vec::new();
    if let Some(last) = &seg.last {
        let values = keys
            .iter()
            .zip(last)
            .map(|(&i, v)| match v {
                Some(v) => format!("{}::{}", quote_literal(v), schema.columns[i].source_type),
                None => "NULL".to_string(),
            })
            .collect::<Vec<_>>()
            .join(", ");
        conds.push(format!("({key_list}) > ({values})"));
    } else if let Some(lo) = seg.lo {
        conds.push(format!("{key_list} > {lo}"));
    }
    if let Some(hi) = seg.hi {
        conds.push(format!("{key_list} <= {hi}"));
    }
    if !conds.is_empty() {
        sql.push_str(" WHERE ");
        sql.push_str(&conds.join(" AND "));
    }
    sql.push_str(&format!(" ORDER BY {key_list}) TO STDOUT"));
    sql
}

async fn run_worker(
    client: &tokio_postgres::Client,
    shared: &WorkerShared,
    tx: &mpsc::Sender<Result<Chunk>>,
) -> Result<()> {
    loop {
        let next = shared.queue.lock().unwrap_or_else(|e| e.into_inner()).pop_front();
        let Some((ti, si)) = next else { return Ok(()) };
        let t = &shared.tables[ti];
        if let Some(keys) = &t.plan.repair {
            let span = tracing::info_span!("repair", table = %t.schema.id, keys = keys.len());
            read_for_repair(client, shared, ti, si, keys, tx).instrument(span).await?;
            continue;
        }
        if let Some(id) = t.plan.verify {
            let span = tracing::info_span!("verify", table = %t.schema.id, id);
            if t.plan.verify_summary > 0 {
                read_summaries(client, shared, ti, si, id, tx).instrument(span).await?;
            } else {
                read_for_verification(client, shared, ti, si, id, tx).instrument(span).await?;
            }
            continue;
        }
        let span = tracing::info_span!("snapshot", table = %t.schema.id, segment = si);
        read_segment(client, shared, ti, si, tx).instrument(span).await?;
    }
}

async fn read_segment(
    client: &tokio_postgres::Client,
    shared: &WorkerShared,
    ti: usize,
    si: usize,
    tx: &mpsc::Sender<Result<Chunk>>,
) -> Result<()> {
    let t = &shared.tables[ti];
    let schema = &t.schema;
    let table_progress = shared.progress.table(&schema.id, 0);
    // Binary when every column has a binary reader and the key's values
    // can be written back as the resume point's literals.
    let binary = binary_columns(schema.columns.iter().map(|c| (&c.data_type, c.source_type.as_str())))
        .filter(|cols| !t.keyed || schema.key_indexes().iter().all(|&k| binary_key_ok(cols[k])));
    let sql = segment_query(t, &t.plan.segments[si], binary.is_some());
    let stream = client
        .copy_out(sql.as_str())
        .await
        .map_err(|e| classify_pg(e, "reading a snapshot chunk").with_table(schema.id.clone()))?;
    futures::pin_mut!(stream);
    let native: Arc<str> = format_lsn(shared.lsn).into();
    let position = Position { commit: shared.lsn, index: 0 };
    let mut messages = Vec::with_capacity(shared.chunk_rows.min(65_536));
    // The key text of the last row is only needed where a chunk ends: keep
    // that row's line (a cheap `Bytes` slice) and split it then.
    let mut last: Option<Vec<Option<String>>> = t.plan.segments[si].last.clone();
    let mut last_line: Option<Bytes> = None;
    let mut now = crate::now_ms();
    let mut rows = CopyRows::new(stream, binary.as_deref(), schema, "reading a snapshot chunk");
    while let Some((row, line)) = rows.next().await? {
        // A full chunk goes out once a row after it exists, so the
        // segment's final chunk is never empty: the source marks the
        // snapshot's very last row in it.
        if messages.len() >= shared.chunk_rows {
            let full = std::mem::replace(&mut messages, Vec::with_capacity(shared.chunk_rows.min(65_536)));
            let key = rows.format.last_key(t, last_line.as_deref(), &full)?;
            let chunk = cut_chunk(ti, si, t, full, key, &mut last, false, &table_progress);
            if tx.send(Ok(chunk)).await.is_err() {
                return Ok(());
            }
            now = crate::now_ms();
        }
        messages.push(read_event(schema, row, &shared.ctx, position, &native, now));
        last_line = line;
    }
    let key = rows.format.last_key(t, last_line.as_deref(), &messages)?;
    let chunk = cut_chunk(ti, si, t, messages, key, &mut last, true, &table_progress);
    let _ = tx.send(Ok(chunk)).await;
    Ok(())
}

/// Rows of a verify range at most: fewer ranges, fewer of the sink's reads.
pub const VERIFY_RANGE_ROWS: usize = 5_000;
/// Bytes of a verify range's entries at most (a wide key makes a range of
/// fewer rows), so that its record stays far below Kafka's default 1 MiB.
pub const VERIFY_RANGE_BYTES: usize = 256 * 1024;

/// The key's columns as a verification orders and bounds them: text by
/// its bytes (as every destination orders it: see
/// `canonical::orders_everywhere`), the others by value.
fn verification_order(schema: &TableSchema) -> Vec<String> {
    schema
        .key_indexes()
        .iter()
        .map(|&i| {
            let c = &schema.columns[i];
            match c.data_type {
                DataType::Text | DataType::Enum { .. } => format!("{}::text COLLATE \"C\"", quote_ident(&c.name)),
                _ => quote_ident(&c.name),
            }
        })
        .collect()
}

/// The condition keeping the rows after `after` up to `until` (canonical
/// key texts; none: unbounded), over the key as [`verification_order`]
/// orders it; `None` when both are unbounded.
fn bounds_condition(
    schema: &TableSchema,
    after: &Option<Vec<Option<String>>>,
    until: &Option<Vec<Option<String>>>,
) -> Result<Option<String>> {
    use crate::sink::bookkeeping::PositionSyntax;
    use crate::sink::verify::KeyRange;
    let range = KeyRange::between(schema, after, until)
        .map_err(|e| Error::permanent(format!("a range to verify: {e}")).with_table(schema.id.clone()))?;
    let keys = schema.key_indexes();
    let literal = |i: usize, v: &Value| -> std::result::Result<String, String> {
        let c = keys.get(i).map(|&k| &schema.columns[k]).ok_or("a bound longer than the key")?;
        let mut text = String::new();
        crate::sink::text::render_text(&mut text, v)?;
        Ok(match c.data_type {
            DataType::Text | DataType::Enum { .. } => format!("{}::text", quote_literal(&text)),
            _ => format!("{}::{}", quote_literal(&text), c.source_type),
        })
    };
    range
        .condition(PositionSyntax::RowValue, &verification_order(schema), literal)
        .map_err(|e| Error::permanent(format!("a range to verify: {e}")).with_table(schema.id.clone()))
}

/// The `COPY` of a table read to verify it: every row (of `condition`,
/// when set) in the key's binary order (see [`verification_order`]).
fn verification_query(t: &SnapshotTable, binary: bool, condition: Option<&str>) -> String {
    let schema = &t.schema;
    let cols = schema
        .columns
        .iter()
        .map(|c| quote_ident(&c.name))
        .collect::<Vec<_>>()
        .join(", ");
    let only = if t.partitioned { "" } else { "ONLY " };
    let order = verification_order(schema).join(", ");
    let format = if binary { " (FORMAT binary)" } else { "" };
    let filter = condition.map(|c| format!(" WHERE {c}")).unwrap_or_default();
    format!(
        "COPY (SELECT {cols} FROM {only}{}{filter} ORDER BY {order}) TO STDOUT{format}",
        quote_table(&schema.id)
    )
}

/// One verify range of table `ti` as the chunk that carries it: the
/// bounds after `after` up to `until`, and its rows' digests or its
/// summary.
#[allow(clippy::too_many_arguments)]
fn verify_chunk(
    shared: &WorkerShared,
    ti: usize,
    si: usize,
    id: u64,
    bounds: KeyBounds,
    last: bool,
    rows: Vec<(String, String, String)>,
    summary: Option<tributary_schemas::records::RangeSummary>,
) -> Chunk {
    let schema = &shared.tables[ti].schema;
    let at = Position { commit: shared.lsn, index: 0 };
    let range = tributary_schemas::records::VerifyRange {
        summary,
        ..tributary_schemas::records::VerifyRange::read(id, at, &shared.ctx.connector, schema, bounds, last, rows)
    };
    Chunk {
        table: ti,
        segment: si,
        messages: vec![SourceMessage::Verify(schema.id.clone(), range)],
        last: None,
        done: last,
    }
}

/// Reads table `ti` for verification `id`: its rows' digests in ranges of
/// [`VERIFY_RANGE_ROWS`], each bounded by the key of the last row of the
/// range before it and its own last row's (the last range: to the end).
/// With the plan's `verify_within`, only those key ranges, each split so:
/// its first part from its lower bound, its last part up to its upper one.
async fn read_for_verification(
    client: &tokio_postgres::Client,
    shared: &WorkerShared,
    ti: usize,
    si: usize,
    id: u64,
    tx: &mpsc::Sender<Result<Chunk>>,
) -> Result<()> {
    use tributary_schemas::canonical::{digest_row, parse_key_text};
    use tributary_schemas::records::VerifyRange;

    let t = &shared.tables[ti];
    let schema = &t.schema;
    if schema.key.is_empty() {
        return read_keyless_for_verification(client, shared, ti, si, id, tx).await;
    }
    let binary = binary_columns(schema.columns.iter().map(|c| (&c.data_type, c.source_type.as_str())));
    let whole: [KeyBounds; 1] = [(None, None)];
    let within = t.plan.verify_within.as_deref().unwrap_or(&whole);
    let started = tokio::time::Instant::now();
    let mut read_rows: u64 = 0;
    for (i, (lower, upper)) in within.iter().enumerate() {
        let final_bounds = i + 1 == within.len();
        let condition = bounds_condition(schema, lower, upper)?;
        let sql = verification_query(t, binary.is_some(), condition.as_deref());
        let stream = client
            .copy_out(sql.as_str())
            .await
            .map_err(|e| classify_pg(e, "reading a table to verify it").with_table(schema.id.clone()))?;
        futures::pin_mut!(stream);
        let mut after = lower.clone();
        let mut rows: Vec<(String, String, String)> = Vec::with_capacity(VERIFY_RANGE_ROWS);
        let mut read = CopyRows::new(stream, binary.as_deref(), schema, "reading a table to verify it");
        let mut bytes = 0usize;
        while let Some((row, _)) = read.next().await? {
            if rows.len() >= VERIFY_RANGE_ROWS || bytes >= VERIFY_RANGE_BYTES {
                bytes = 0;
                // A bounded share of the source: the rows read so far are due
                // no sooner than the rate allows.
                if t.plan.verify_rate > 0 {
                    let due = Duration::from_secs_f64(read_rows as f64 / t.plan.verify_rate as f64);
                    tokio::time::sleep_until(started + due).await;
                }
                let full = std::mem::replace(&mut rows, Vec::with_capacity(VERIFY_RANGE_ROWS));
                let until = full.last().and_then(|(key, _, _)| parse_key_text(key));
                let chunk = verify_chunk(shared, ti, si, id, (after, until.clone()), false, full, None);
                after = until;
                if tx.send(Ok(chunk)).await.is_err() {
                    return Ok(());
                }
            }
            let entry = VerifyRange::entry(&digest_row(schema, &row));
            // Its JSON: the three strings, their quotes and commas.
            bytes += entry.0.len() + entry.1.len() + entry.2.len() + 16;
            rows.push(entry);
            read_rows += 1;
        }
        // The bounds' last part: up to their upper bound (the whole
        // table's: to the end).
        let chunk = verify_chunk(shared, ti, si, id, (after, upper.clone()), final_bounds, rows, None);
        if tx.send(Ok(chunk)).await.is_err() {
            return Ok(());
        }
    }
    Ok(())
}

/// Reads table `ti`, which has no key, for verification `id`: its rows'
/// digests in ranges of their content keys (see
/// [`crate::source::keyless`]), in as many passes over the table as its
/// row count needs, all in the verification's snapshot.
async fn read_keyless_for_verification(
    client: &tokio_postgres::Client,
    shared: &WorkerShared,
    ti: usize,
    si: usize,
    id: u64,
    tx: &mpsc::Sender<Result<Chunk>>,
) -> Result<()> {
    use crate::source::keyless::{passes, Pass};

    let t = &shared.tables[ti];
    let schema = &t.schema;
    let what = "reading a table without a key to verify it";
    let only = if t.partitioned { "" } else { "ONLY " };
    let count: i64 = client
        .query_one(format!("SELECT count(*) FROM {only}{}", quote_table(&schema.id)).as_str(), &[])
        .await
        .map_err(|e| classify_pg(e, what).with_table(schema.id.clone()))?
        .get(0);
    let of = passes(u64::try_from(count).unwrap_or(0));
    let binary = binary_columns(schema.columns.iter().map(|c| (&c.data_type, c.source_type.as_str())));
    let cols = schema
        .columns
        .iter()
        .map(|c| quote_ident(&c.name))
        .collect::<Vec<_>>()
        .join(", ");
    let format = if binary.is_some() { " (FORMAT binary)" } else { "" };
    let sql = format!("COPY (SELECT {cols} FROM {only}{}) TO STDOUT{format}", quote_table(&schema.id));
    let started = tokio::time::Instant::now();
    let mut read_rows: u64 = 0;
    for pass in 0..of {
        let stream = client
            .copy_out(sql.as_str())
            .await
            .map_err(|e| classify_pg(e, what).with_table(schema.id.clone()))?;
        futures::pin_mut!(stream);
        let mut read = CopyRows::new(stream, binary.as_deref(), schema, what);
        let mut taken = Pass::new(schema, pass, of);
        while let Some((row, _)) = read.next().await? {
            taken.push(schema, &row)?;
            read_rows += 1;
            if t.plan.verify_rate > 0 && read_rows.is_multiple_of(1_000) {
                let due = Duration::from_secs_f64(read_rows as f64 / t.plan.verify_rate as f64);
                tokio::time::sleep_until(started + due).await;
            }
        }
        if of > 1 {
            tracing::debug!(table = %schema.id, pass, of, rows = taken.len(), "a pass over a table without a key");
        }
        for (bounds, rows, last) in taken.ranges(VERIFY_RANGE_ROWS, VERIFY_RANGE_BYTES) {
            let chunk = verify_chunk(shared, ti, si, id, bounds, last, rows, None);
            if tx.send(Ok(chunk)).await.is_err() {
                return Ok(());
            }
        }
    }
    Ok(())
}

/// Whether a table can be verified by summaries: a key ordered alike in
/// its index and in every destination (text keys are ordered by their
/// bytes, which their index may not be: those tables send rows).
pub fn summarizable(schema: &TableSchema) -> bool {
    !schema.key_indexes().is_empty()
        && schema
            .key_indexes()
            .iter()
            .all(|&k| !matches!(schema.columns[k].data_type, DataType::Text | DataType::Enum { .. }))
}

/// Reads table `ti` for verification `id` by summaries: ranges of the
/// plan's `verify_summary` keys (each bounded by its last key, found by a
/// scan of the key), each counted and summed by the database
/// ([`crate::pgwire::summary`]); no row leaves it. A range that differs
/// is verified again by its rows' digests, in ranges of
/// [`VERIFY_RANGE_ROWS`].
async fn read_summaries(
    client: &tokio_postgres::Client,
    shared: &WorkerShared,
    ti: usize,
    si: usize,
    id: u64,
    tx: &mpsc::Sender<Result<Chunk>>,
) -> Result<()> {
    use crate::pgwire::summary;
    use tributary_schemas::canonical::canonical_text;
    use tributary_schemas::records::RangeSummary;

    let t = &shared.tables[ti];
    let schema = &t.schema;
    let what = "summing a table's rows to verify it";
    let version: i32 = client
        .query_one("SELECT current_setting('server_version_num')::int", &[])
        .await
        .and_then(|r| r.try_get(0))
        .map_err(|e| classify_pg(e, what).with_table(schema.id.clone()))?;
    let at_least = |method: &str| summary::min_server_version(method).is_some_and(|v| version >= v);
    if !at_least(summary::ROW_TEXT) {
        // No method covers its rows: their digests go instead.
        return read_for_verification(client, shared, ti, si, id, tx).await;
    }
    client
        .batch_execute(summary::SETTINGS)
        .await
        .map_err(|e| classify_pg(e, what).with_table(schema.id.clone()))?;
    let only = if t.partitioned { "" } else { "ONLY " };
    let table = format!("{only}{}", quote_table(&schema.id));
    let exprs = |method: &str| -> Vec<String> {
        schema
            .columns
            .iter()
            .map(|c| summary::column_expr(method, &quote_ident(&c.name), &c.source_type))
            .collect()
    };
    // The record hash where every column's type has an extended hash
    // (tried on a row, in a savepoint: a type without one is an error that
    // would end the snapshot's transaction), the row text otherwise.
    let mut method = if at_least(summary::RECORD_HASH) {
        let probe = format!(
            "SAVEPOINT tributary_summary; SELECT hash_record_extended(ROW({}), 0) FROM {table} LIMIT 1; \
             RELEASE SAVEPOINT tributary_summary",
            exprs(summary::RECORD_HASH).join(", ")
        );
        match client.batch_execute(&probe).await {
            Ok(()) => summary::RECORD_HASH,
            Err(e) => {
                tracing::info!(table = %schema.id, error = %e,
                    "summed by the rows' texts: a column's type has no extended hash");
                client
                    .batch_execute("ROLLBACK TO SAVEPOINT tributary_summary; RELEASE SAVEPOINT tributary_summary")
                    .await
                    .map_err(|e| classify_pg(e, what).with_table(schema.id.clone()))?;
                summary::ROW_TEXT
            }
        }
    } else {
        summary::ROW_TEXT
    };
    let types: Vec<String> = schema.columns.iter().map(|c| c.source_type.clone()).collect();
    let keys = schema.key_indexes();
    // Aliased: `ORDER BY "id"` would order by an output column `"id"`,
    // the key's text.
    let key_texts = keys
        .iter()
        .enumerate()
        .map(|(i, &k)| format!("{}::text AS __tributary_k{i}", quote_ident(&schema.columns[k].name)))
        .collect::<Vec<_>>()
        .join(", ");
    let order = verification_order(schema).join(", ");
    let started = tokio::time::Instant::now();
    let mut read_rows: u64 = 0;
    let mut after: Option<Vec<Option<String>>> = None;
    loop {
        // The range's last key: the `verify_summary`-th after `after`.
        let filter = bounds_condition(schema, &after, &None)?
            .map(|c| format!(" WHERE {c}"))
            .unwrap_or_default();
        let bound = client
            .query_opt(
                &format!(
                    "SELECT {key_texts} FROM {table}{filter} ORDER BY {order} OFFSET {} LIMIT 1",
                    t.plan.verify_summary.saturating_sub(1)
                ),
                &[],
            )
            .await
            .map_err(|e| classify_pg(e, what).with_table(schema.id.clone()))?;
        let until = match bound {
            Some(row) => {
                let mut texts = Vec::with_capacity(keys.len());
                for (i, &k) in keys.iter().enumerate() {
                    let c = &schema.columns[k];
                    let value = crate::pgwire::values::text_cell(&row, i, &schema.id, c)?;
                    texts.push(canonical_text(&c.data_type, &value));
                }
                Some(texts)
            }
            None => None,
        };
        let condition = bounds_condition(schema, &after, &until)?;
        // In a savepoint: a value the record hash cannot take (a `json`
        // document `jsonb` refuses) is summed by the rows' texts instead,
        // from this range on.
        let (rows, sum) = loop {
            let sql = summary::range_sql(method, &table, &exprs(method), condition.as_deref());
            let summed = async {
                client.batch_execute("SAVEPOINT tributary_summary").await?;
                let row = client.query_one(&sql, &[]).await?;
                let n: i64 = row.try_get(0)?;
                let sum: String = row.try_get(1)?;
                client.batch_execute("RELEASE SAVEPOINT tributary_summary").await?;
                Ok::<_, tokio_postgres::Error>((n, sum))
            }
            .await;
            match summed {
                Ok(summed) => break summed,
                Err(e) if method == summary::RECORD_HASH && e.as_db_error().is_some() => {
                    tracing::info!(table = %schema.id, error = %e,
                        "summed by the rows' texts from here on: the record hash cannot take a value");
                    client
                        .batch_execute("ROLLBACK TO SAVEPOINT tributary_summary; RELEASE SAVEPOINT tributary_summary")
                        .await
                        .map_err(|e| classify_pg(e, what).with_table(schema.id.clone()))?;
                    method = summary::ROW_TEXT;
                }
                Err(e) => return Err(classify_pg(e, what).with_table(schema.id.clone())),
            }
        };
        let rows = u64::try_from(rows).unwrap_or(0);
        read_rows += rows;
        let last = until.is_none();
        let summary = RangeSummary {
            method: method.to_string(),
            rows,
            sum,
            types: types.clone(),
        };
        let chunk = verify_chunk(shared, ti, si, id, (after.clone(), until.clone()), last, Vec::new(), Some(summary));
        if tx.send(Ok(chunk)).await.is_err() || last {
            return Ok(());
        }
        after = until;
        if t.plan.verify_rate > 0 {
            let due = Duration::from_secs_f64(read_rows as f64 / t.plan.verify_rate as f64);
            tokio::time::sleep_until(started + due).await;
        }
    }
}

/// Keys a repair reads per statement.
const REPAIR_KEYS_PER_READ: usize = 500;

/// Reads the rows of `keys` (canonical key texts) of table `ti` and sends
/// them as the copy's rows are sent (at the run's position), in chunks of
/// one statement's keys; a key the table no longer has sends nothing.
async fn read_for_repair(
    client: &tokio_postgres::Client,
    shared: &WorkerShared,
    ti: usize,
    si: usize,
    keys: &[String],
    tx: &mpsc::Sender<Result<Chunk>>,
) -> Result<()> {
    let t = &shared.tables[ti];
    let schema = &t.schema;
    let native: Arc<str> = format_lsn(shared.lsn).into();
    let position = Position { commit: shared.lsn, index: 0 };
    let binary = binary_columns(schema.columns.iter().map(|c| (&c.data_type, c.source_type.as_str())));
    let parts: Vec<&[String]> = if keys.is_empty() {
        vec![&[]]
    } else {
        keys.chunks(REPAIR_KEYS_PER_READ).collect()
    };
    let count = parts.len();
    for (i, part) in parts.into_iter().enumerate() {
        let mut messages = Vec::with_capacity(part.len());
        if !part.is_empty() {
            let sql = repair_query(t, part, binary.is_some())?;
            let stream = client
                .copy_out(sql.as_str())
                .await
                .map_err(|e| classify_pg(e, "reading rows to repair").with_table(schema.id.clone()))?;
            futures::pin_mut!(stream);
            let now = crate::now_ms();
            let mut rows = CopyRows::new(stream, binary.as_deref(), schema, "reading rows to repair");
            while let Some((row, _)) = rows.next().await? {
                messages.push(read_event(schema, row, &shared.ctx, position, &native, now));
            }
        }
        let chunk = Chunk {
            table: ti,
            segment: si,
            messages,
            last: None,
            done: i + 1 == count,
        };
        if tx.send(Ok(chunk)).await.is_err() {
            return Ok(());
        }
    }
    Ok(())
}

/// The `COPY` of the rows of `keys` (canonical key texts) of a table.
fn repair_query(t: &SnapshotTable, keys: &[String], binary: bool) -> Result<String> {
    use tributary_schemas::canonical::{key_value, parse_key_text};
    let schema = &t.schema;
    let key_columns: Vec<&tributary_schemas::Column> =
        schema.key_indexes().into_iter().map(|k| &schema.columns[k]).collect();
    let mut tuples = Vec::with_capacity(keys.len());
    for key in keys {
        let texts = parse_key_text(key).filter(|t| t.len() == key_columns.len()).ok_or_else(|| {
            Error::permanent(format!("a key to repair is not a key of the table: {key}")).with_table(schema.id.clone())
        })?;
        let mut literals = Vec::with_capacity(texts.len());
        for (c, text) in key_columns.iter().zip(&texts) {
            let value = key_value(&c.data_type, text.as_deref()).ok_or_else(|| {
                Error::permanent(format!("a key to repair does not read as key column {} ({})", c.name, c.data_type))
                    .with_table(schema.id.clone())
            })?;
            let mut literal = String::new();
            crate::sink::text::render_text(&mut literal, &value).map_err(|e| {
                Error::permanent(format!("key column {} ({}): {e}", c.name, c.data_type)).with_table(schema.id.clone())
            })?;
            literals.push(format!("{}::{}", quote_literal(&literal), c.source_type));
        }
        tuples.push(format!("({})", literals.join(", ")));
    }
    let cols = schema
        .columns
        .iter()
        .map(|c| quote_ident(&c.name))
        .collect::<Vec<_>>()
        .join(", ");
    let key_list = key_columns.iter().map(|c| quote_ident(&c.name)).collect::<Vec<_>>().join(", ");
    let only = if t.partitioned { "" } else { "ONLY " };
    let format = if binary { " (FORMAT binary)" } else { "" };
    Ok(format!(
        "COPY (SELECT {cols} FROM {only}{} WHERE ({key_list}) IN ({})) TO STDOUT{format}",
        quote_table(&schema.id),
        tuples.join(", ")
    ))
}

/// The rows of one `COPY ... TO STDOUT`, decoded one by one as its data
/// messages arrive (the server sends one row per message; others are
/// tolerated).
struct CopyRows<'a, S> {
    stream: S,
    format: RowFormat<'a>,
    schema: &'a TableSchema,
    /// What the `COPY` does, for errors.
    what: &'static str,
    buf: Bytes,
    at: usize,
    pending: Vec<u8>,
}

impl<'a, S> CopyRows<'a, S>
where
    S: futures::Stream<Item = std::result::Result<Bytes, tokio_postgres::Error>> + Unpin,
{
    /// Rows of `stream`, in binary when `binary` gives each column's type.
    fn new(stream: S, binary: Option<&'a [BinaryType]>, schema: &'a TableSchema, what: &'static str) -> Self {
        let format = match binary {
            Some(cols) => RowFormat::Binary { cols, header: false },
            None => RowFormat::Text,
        };
        Self {
            stream,
            format,
            schema,
            what,
            buf: Bytes::new(),
            at: 0,
            pending: Vec::new(),
        }
    }

    /// The next row (and its text line, in text), `None` at the end.
    async fn next(&mut self) -> Result<Option<(Row, Option<Bytes>)>> {
        loop {
            if let Some(row) = self.format.next_row(&self.buf, &mut self.at, self.schema)? {
                return Ok(Some(row));
            }
            self.pending.extend_from_slice(&self.buf[self.at..]);
            self.at = 0;
            self.buf = match self.stream.next().await {
                Some(Ok(data)) if self.pending.is_empty() => data,
                Some(Ok(data)) => {
                    self.pending.extend_from_slice(&data);
                    Bytes::from(std::mem::take(&mut self.pending))
                }
                Some(Err(e)) => return Err(classify_pg(e, self.what).with_table(self.schema.id.clone())),
                None => {
                    self.buf = Bytes::new();
                    if !self.pending.is_empty() && matches!(self.format, RowFormat::Binary { .. }) {
                        return Err(Error::permanent("COPY ended inside a row of its binary output")
                            .with_table(self.schema.id.clone()));
                    }
                    return Ok(None);
                }
            };
        }
    }
}

/// How a segment's `COPY` output is framed and decoded.
enum RowFormat<'a> {
    /// Text lines, decoded as pgoutput's text is.
    Text,
    /// Binary tuples, once the stream's `header` was read.
    Binary { cols: &'a [BinaryType], header: bool },
}

impl RowFormat<'_> {
    /// The row starting at `*at` in `buf`, and `*at` moved past it; `None`
    /// when more bytes are needed (or the binary trailer ended the stream).
    /// With the row comes its text line (`None` in binary), for the resume
    /// key.
    fn next_row(&mut self, buf: &Bytes, at: &mut usize, schema: &TableSchema) -> Result<Option<(Row, Option<Bytes>)>> {
        match self {
            RowFormat::Text => {
                let Some(len) = buf[*at..].iter().position(|b| *b == b'\n') else {
                    return Ok(None);
                };
                let line = buf.slice(*at..*at + len + 1);
                *at += len + 1;
                Ok(Some((decode_copy_row(&line, schema)?, Some(line))))
            }
            RowFormat::Binary { cols, header } => {
                if !*header {
                    match binary_header_len(&buf[*at..]) {
                        Ok(Some(n)) => {
                            *at += n;
                            *header = true;
                        }
                        Ok(None) => return Ok(None),
                        Err(()) => return Err(not_binary(schema)),
                    }
                }
                match decode_binary_row(&buf[*at..], schema, cols)? {
                    None => Ok(None),
                    Some((Some(row), used)) => {
                        *at += used;
                        Ok(Some((row, None)))
                    }
                    Some((None, _)) => {
                        *at = buf.len(); // the trailer: nothing follows
                        Ok(None)
                    }
                }
            }
        }
    }

    /// The resume key of the last of `messages`, whose text line (in text)
    /// is `line`.
    fn last_key(
        &self,
        t: &SnapshotTable,
        line: Option<&[u8]>,
        messages: &[SourceMessage],
    ) -> Result<Option<Vec<Option<String>>>> {
        match self {
            RowFormat::Text => text_last_key(t, line),
            RowFormat::Binary { .. } => Ok(binary_last_key(t, messages)),
        }
    }
}

/// A chunk of `messages`, the rows of segment `si` of table `ti`: counts
/// them and records the key of their last row (`last_key`, the resume
/// point; `None` for key-less tables) in `last`.
#[allow(clippy::too_many_arguments)]
fn cut_chunk(
    ti: usize,
    si: usize,
    t: &SnapshotTable,
    messages: Vec<SourceMessage>,
    last_key: Option<Vec<Option<String>>>,
    last: &mut Option<Vec<Option<String>>>,
    done: bool,
    progress: &TableProgress,
) -> Chunk {
    progress.rows.fetch_add(messages.len() as u64, Ordering::Relaxed);
    if t.keyed && last_key.is_some() {
        *last = last_key;
    }
    Chunk {
        table: ti,
        segment: si,
        messages,
        last: last.clone(),
        done,
    }
}

/// The key texts of the row whose COPY text line is `line`.
fn text_last_key(t: &SnapshotTable, line: Option<&[u8]>) -> Result<Option<Vec<Option<String>>>> {
    match line {
        Some(line) if t.keyed => key_texts(line, &t.schema.key_indexes(), &t.schema).map(Some),
        _ => Ok(None),
    }
}

/// The key texts of the last of `messages`, read in binary (their key
/// types all have a [`key_literal_text`]).
fn binary_last_key(t: &SnapshotTable, messages: &[SourceMessage]) -> Option<Vec<Option<String>>> {
    if !t.keyed {
        return None;
    }
    let Some(SourceMessage::Change(ev)) = messages.last() else {
        return None;
    };
    let row = ev.after.as_ref()?;
    Some(
        t.schema
            .key_indexes()
            .iter()
            .map(|&k| row.get(k).and_then(key_literal_text))
            .collect(),
    )
}

/// Length of a binary `COPY` header at the start of `buf`: `Ok(None)` when
/// more bytes are needed, `Err` when it is not one.
fn binary_header_len(buf: &[u8]) -> std::result::Result<Option<usize>, ()> {
    const SIGNATURE: &[u8] = BINARY_COPY_SIGNATURE;
    if buf.len() < SIGNATURE.len() + 8 {
        return if SIGNATURE.starts_with(&buf[..buf.len().min(SIGNATURE.len())]) {
            Ok(None)
        } else {
            Err(())
        };
    }
    if !buf.starts_with(SIGNATURE) {
        return Err(());
    }
    let ext = u32::from_be_bytes([buf[15], buf[16], buf[17], buf[18]]) as usize;
    let len = SIGNATURE.len() + 8 + ext;
    Ok((buf.len() >= len).then_some(len))
}

/// One binary `COPY` tuple at the start of `buf`: `None` when more bytes
/// are needed, else the row (`None` for the trailer) and the bytes used.
#[allow(clippy::type_complexity)]
fn decode_binary_row(buf: &[u8], schema: &TableSchema, cols: &[BinaryType]) -> Result<Option<(Option<Row>, usize)>> {
    let Some(count) = buf.get(..2) else { return Ok(None) };
    let count = i16::from_be_bytes([count[0], count[1]]);
    if count == -1 {
        return Ok(Some((None, 2)));
    }
    if usize::try_from(count).ok() != Some(cols.len()) {
        return Err(Error::permanent(format!("COPY returned {count} fields for {} columns", cols.len()))
            .with_table(schema.id.clone()));
    }
    // Fields are decoded as they are framed, in one pass: a tuple is
    // almost always whole (the server sends one per CopyData message), and
    // a partial one only costs its decoded start.
    let mut at = 2;
    let mut row = Vec::with_capacity(cols.len());
    for (kind, col) in cols.iter().zip(&schema.columns) {
        let Some(len) = buf.get(at..at + 4) else {
            return Ok(None);
        };
        let len = i32::from_be_bytes([len[0], len[1], len[2], len[3]]);
        at += 4;
        if len < 0 {
            row.push(Value::Null);
            continue;
        }
        let len = len as usize;
        let Some(data) = buf.get(at..at + len) else {
            return Ok(None);
        };
        at += len;
        row.push(decode_binary(
            *kind,
            data,
            ColumnRef {
                table: &schema.id,
                column: &col.name,
                source_type: &col.source_type,
                nullable: col.nullable,
            },
        )?);
    }
    Ok(Some((Some(row), at)))
}

fn not_binary(schema: &TableSchema) -> Error {
    Error::permanent("COPY did not start with the binary format's signature").with_table(schema.id.clone())
}

fn not_text(schema: &TableSchema) -> Error {
    Error::permanent("COPY returned a row that is not valid UTF-8 text").with_table(schema.id.clone())
}

/// The text of the key columns of one COPY line.
fn key_texts(line: &[u8], keys: &[usize], schema: &TableSchema) -> Result<Vec<Option<String>>> {
    let fields: Vec<Option<&[u8]>> = copy_fields(line).collect();
    keys.iter()
        .map(|&k| match fields.get(k) {
            Some(Some(raw)) => unescape_copy_field(raw)
                .map(|c| Some(c.into_owned()))
                .map_err(|_| not_text(schema)),
            _ => Ok(None),
        })
        .collect()
}

fn decode_copy_row(line: &[u8], schema: &TableSchema) -> Result<Row> {
    let mut row = Vec::with_capacity(schema.columns.len());
    for (i, field) in copy_fields(line).enumerate() {
        let Some(col) = schema.columns.get(i) else {
            return Err(Error::permanent("COPY returned more fields than columns").with_table(schema.id.clone()));
        };
        row.push(match field {
            None => Value::Null,
            Some(raw) => {
                let text = unescape_copy_field(raw).map_err(|_| not_text(schema))?;
                decode_text(
                    &col.data_type,
                    &text,
                    ColumnRef {
                        table: &schema.id,
                        column: &col.name,
                        source_type: &col.source_type,
                        nullable: col.nullable,
                    },
                )?
            }
        });
    }
    if row.len() != schema.columns.len() {
        return Err(Error::permanent(format!(
            "COPY returned {} fields for {} columns",
            row.len(),
            schema.columns.len()
        ))
        .with_table(schema.id.clone()));
    }
    Ok(row)
}

fn read_event(
    schema: &Arc<TableSchema>,
    row: Row,
    ctx: &EventContext,
    position: Position,
    native: &Arc<str>,
    now: i64,
) -> SourceMessage {
    SourceMessage::Change(ChangeEvent {
        schema: schema.clone(),
        op: Op::Read,
        before: None,
        after: Some(row),
        source: SourceInfo {
            connector: ctx.connector.clone(),
            name: ctx.name.clone(),
            db: ctx.db.clone(),
            ts_ms: now,
            snapshot: SnapshotMarker::True,
            tx_id: None,
            position,
            native_position: native.clone(),
        },
        ts_ms: now,
        transaction: None,
    })
}

/// Marks a table done in the progress view.
pub fn mark_table_done(progress: &SnapshotProgress, table: &TableId) {
    progress.table(table, 0).done.store(true, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;
    use tributary_schemas::Column;

    fn table(keyed: bool) -> SnapshotTable {
        SnapshotTable {
            schema: Arc::new(TableSchema {
                id: TableId::new("s", "t"),
                columns: vec![
                    Column {
                        name: "id".into(),
                        data_type: DataType::Int64,
                        nullable: false,
                        source_type: "bigint".into(),
                        default: None,
                        aliases: Vec::new(),
                        column_id: None,
                    },
                    Column {
                        name: "name".into(),
                        data_type: DataType::Text,
                        nullable: true,
                        source_type: "text".into(),
                        default: None,
                        aliases: Vec::new(),
                        column_id: None,
                    },
                ],
                key: vec!["id".into()],
                dropped: Vec::new(),
            }),
            keyed,
            partitioned: false,
            plan: TablePlan::new(&TableId::new("s", "t")),
        }
    }

    #[test]
    fn segment_queries_resume_after_the_last_key() {
        let t = table(true);
        let q = segment_query(
            &t,
            &Segment {
                lo: Some(10),
                hi: Some(20),
                last: Some(vec![Some("15".into())]),
                done: false,
                started: true,
            },
            false,
        );
        assert_eq!(
            q,
            "COPY (SELECT \"id\", \"name\" FROM ONLY \"s\".\"t\" WHERE (\"id\") > ('15'::bigint) AND \"id\" <= 20 ORDER BY \"id\") TO STDOUT"
        );
        let q = segment_query(&table(false), &Segment::default(), false);
        assert_eq!(q, "COPY (SELECT \"id\", \"name\" FROM ONLY \"s\".\"t\") TO STDOUT");
        let q = segment_query(&table(false), &Segment::default(), true);
        assert_eq!(q, "COPY (SELECT \"id\", \"name\" FROM ONLY \"s\".\"t\") TO STDOUT (FORMAT binary)");
    }

    #[test]
    fn binary_headers_and_tuples_are_framed() {
        let mut header = b"PGCOPY\n\xff\r\n\0".to_vec();
        header.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 2, 7, 7]);
        assert_eq!(binary_header_len(&header[..10]), Ok(None));
        assert_eq!(binary_header_len(&header[..20]), Ok(None));
        assert_eq!(binary_header_len(&header), Ok(Some(21)));
        assert_eq!(binary_header_len(b"id\tname\n"), Err(()));
        let t = table(true);
        let cols = [BinaryType::Int8, BinaryType::Text];
        let mut tuple = vec![0, 2, 0, 0, 0, 8];
        tuple.extend_from_slice(&42i64.to_be_bytes());
        tuple.extend_from_slice(&[0xff, 0xff, 0xff, 0xff]);
        assert!(decode_binary_row(&tuple[..9], &t.schema, &cols).unwrap().is_none());
        let (row, used) = decode_binary_row(&tuple, &t.schema, &cols).unwrap().unwrap();
        assert_eq!(used, tuple.len());
        assert_eq!(row, Some(vec![Value::Int64(42), Value::Null]));
        assert_eq!(decode_binary_row(&[0xff, 0xff], &t.schema, &cols).unwrap(), Some((None, 2)));
        assert!(decode_binary_row(&[0, 3], &t.schema, &cols).is_err());
    }

    #[test]
    fn snapshot_state_round_trips() {
        let s = SnapshotState {
            initial: true,
            tables: vec![TablePlan {
                schema: "s".into(),
                table: "t".into(),
                segments: vec![Segment {
                    lo: None,
                    hi: Some(5),
                    last: Some(vec![Some("3".into())]),
                    done: false,
                    started: true,
                }],
                verify: Some(7),
                verify_rate: 100,
                repair: None,
                verify_summary: 4000,
                verify_within: Some(vec![(None, Some(vec![Some("5".into())]))]),
            }],
        };
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(serde_json::from_str::<SnapshotState>(&json).unwrap(), s);
        assert!(!s.is_done());
    }
}

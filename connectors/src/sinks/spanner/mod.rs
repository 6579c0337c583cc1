//! The Spanner sink: keeps a copy of each source table in a Cloud Spanner
//! database, with exactly-once effect. A [`Warehouse`] of the core
//! (`crate::sink::warehouse`), which decides the order of everything; this
//! module says how Spanner does each step.
//!
//! # How a batch is applied
//!
//! 1. The destination table is created or evolved for every schema version
//!    in the batch (`UpdateDatabaseDdl`, waited for; every statement is
//!    idempotent: `IF NOT EXISTS`, restating a column's type).
//! 2. The batch is reduced to the last change per key and encoded (a value
//!    Spanner would refuse fails here, naming its record).
//! 3. At the end of the batch, **one read-write transaction**: it reads the
//!    stored position of every key the batch touches, its deleted-rows
//!    entry and the table-wide one, and buffers an `insert_or_update` or
//!    `delete` mutation only where the change is newer (the position guard);
//!    deletes keep their position in the deleted-rows table; a truncate or a
//!    reset is a DML statement of the same transaction; then it reads the
//!    stored offsets, checks the fence and buffers the new ones. Commit
//!    makes rows and offsets visible together. Mutations buffered earlier in
//!    the transaction are invisible to its later reads and DML, so the
//!    transaction keeps what it buffered (the overlay) and applies each
//!    table-wide step to it as well.
//! 4. Spanner aborts read-write transactions under contention (ABORTED):
//!    the transaction is run again from its first read, up to
//!    `abort_retries` times. Nothing is read before the transaction, so a
//!    retry decides again on fresh data.
//!
//! A batch whose mutations (estimated per record, an upper bound) exceed
//! `mutation_limit` is split into several commits, each carrying the
//! offsets of its prefix ([`split_by_weight`]).

pub mod check;
pub mod client;
pub mod config;
pub mod dialect;
pub mod types;

use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};

use async_trait::async_trait;
use gcloud_gax::grpc::Status;
use gcloud_gax::retry::TryAs;
use gcloud_googleapis::spanner::v1::mutation::{Delete, Operation, Write};
use gcloud_googleapis::spanner::v1::{KeySet as PbKeySet, Mutation};
use gcloud_spanner::key::{Key, KeyRange as SpKeyRange, KeySet, RangeKind};
use gcloud_spanner::statement::{Statement, ToKind};
use gcloud_spanner::transaction_rw::ReadWriteTransaction;
use prost_types::value::Kind;
use prost_types::ListValue;
use tracing::{debug, info, info_span, warn, Span};
use tributary_operations::config::{ConfigError, Validate};
use tributary_schemas::{Position, TableId, TableSchema, Value};

use self::client::{all_rows, cell_text, classify, classify_client, is_aborted, Raw, SpClient, ROLES_HINT};
pub use self::config::{DestinationTable, SpannerSinkConfig};
use self::dialect::{
    change_ddl, columns_sql, deleted_ddl, deleted_keys_older_sql, forget_deleted_sql, forget_positions_sql, key_sql,
    keyless_rows_sql, offsets_ddl, pending_deletes_sql, prune_deleted_sql, quote_ident, quote_string, rename_steps,
    resets_ddl, truncate_older_sql, unfinished_rename, SpannerDialect, QUOTING,
};
use self::types::{encode, from_spanner_type, key_form, read_row, SpType};
use crate::error::{Error, ErrorKind, Result};
use crate::problem::Problem;
use crate::sink::bookkeeping::{
    fenced, keeps_removal, key_text, position_i64, reset_i64, Fence, OffsetMove, COMMIT_COLUMN,
    DELETED_ROWS_PRUNE_INTERVAL, DELETED_TABLE, FORGOTTEN_POSITION, INDEX_COLUMN, KEYLESS_COLUMNS, OFFSETS_TABLE,
    RESETS_TABLE, TABLE_ROW_KEY,
};
use crate::sink::keyless::{self, delete_done, pair, pending_key, pending_table, row_gone, split_pending, PairItem};
use crate::sink::reduce::{key_bytes, Group, Line, Reduction};
use crate::sink::schema::{plan, Evolution, ShapeColumn, TableChange, TableShape, KEY_CHANGED_CLASS};
use crate::sink::verify::KeyRange;
use crate::sink::warehouse::{self, Mode, Warehouse, WarehouseSink};
use crate::sink::{split_by_weight, ApplyError, SinkBatch, SinkRecord};

/// Mutations of a deleted-rows entry (its five columns).
const DELETED_ENTRY_MUTATIONS: usize = 5;
/// Mutations of one partition's offsets row (its four columns).
const OFFSETS_ROW_MUTATIONS: usize = 4;
/// What Spanner stores for a column written with the commit timestamp.
const COMMIT_TIMESTAMP: &str = "spanner.commit_timestamp()";

type Pos = (i64, i64);

/// What the sink knows about one destination table.
#[derive(Debug, Clone, Default)]
struct TableState {
    shape: TableShape<SpType>,
    /// Fingerprints of the source schemas already reconciled with it.
    reconciled: HashSet<u64>,
}

/// One reduced change, encoded.
#[derive(Debug, Clone)]
struct Change {
    /// Key values in key order.
    key: Vec<Kind>,
    /// The key as matched against rows read back ([`key_form`]).
    form: String,
    /// The key as the deleted-rows table keeps it ([`key_text`]).
    text: String,
    position: Pos,
    delete: bool,
    /// An upsert's columns (the position columns last) and values.
    columns: Vec<String>,
    values: Vec<Kind>,
}

/// One step of a batch, run in its transaction at the end.
#[derive(Debug, Clone)]
enum Op {
    Write {
        table: String,
        key_columns: Vec<String>,
        key_types: Vec<SpType>,
        changes: Vec<Change>,
    },
    Truncate {
        table: String,
        at: Pos,
        exists: bool,
        keep: bool,
    },
    Forget {
        table: String,
        reset: i64,
        exists: bool,
    },
    /// The changes of a table without a key (see `crate::sink::keyless`).
    Keyless {
        table: String,
        changes: Vec<KeylessChange>,
    },
}

/// One change of a table without a key, encoded: an insert of a row named
/// `row`, or a delete (`row` names the record) of a row of `content`.
#[derive(Debug, Clone)]
struct KeylessChange {
    content: String,
    row: String,
    position: Pos,
    delete: bool,
    /// An insert's columns (the bookkeeping ones last) and values.
    columns: Vec<String>,
    values: Vec<Kind>,
}

/// A row the open transaction buffered a mutation for.
#[derive(Debug, Clone)]
struct Buffered {
    key: Vec<Kind>,
    key_columns: Vec<String>,
    /// Its position after the mutation; `None`: deleted.
    position: Option<Pos>,
}

/// What one attempt of a batch's transaction buffered, and the state its
/// mutations will leave (reads and DML of the same transaction do not see
/// mutations).
#[derive(Default)]
struct Attempt {
    mutations: Vec<Mutation>,
    count: usize,
    rows: HashMap<(String, String), Buffered>,
    deleted: HashMap<(String, String), Option<Pos>>,
    resets: HashMap<String, i64>,
}

impl Attempt {
    fn push(&mut self, m: Mutation, count: usize) {
        self.mutations.push(m);
        self.count += count;
    }
}

/// The error of a transaction attempt: Spanner's own (ABORTED is retried),
/// or the sink's.
#[derive(Debug)]
enum TxError {
    Spanner(Status),
    Sink(Error),
}

impl From<Status> for TxError {
    fn from(s: Status) -> Self {
        TxError::Spanner(s)
    }
}

impl From<Error> for TxError {
    fn from(e: Error) -> Self {
        TxError::Sink(e)
    }
}

impl TryAs<Status> for TxError {
    fn try_as(&self) -> Option<&Status> {
        match self {
            TxError::Spanner(s) => Some(s),
            TxError::Sink(_) => None,
        }
    }
}

impl TxError {
    fn into_error(self) -> Error {
        match self {
            TxError::Spanner(s) => classify(s),
            TxError::Sink(e) => e,
        }
    }
}

/// The Spanner [`Sink`](crate::Sink).
pub struct SpannerSink {
    config: SpannerSinkConfig,
    consumer_group: String,
    client: SpClient,
    bookkeeping_ready: bool,
    tables: HashMap<DestinationTable, TableState>,
    /// When expired deleted-rows entries are removed next.
    prune_at: std::time::Instant,
    mode: Mode,
    /// The open batch's steps.
    ops: Vec<Op>,
    commits: u64,
    aborts: u64,
}

impl std::fmt::Debug for SpannerSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpannerSink")
            .field("config", &self.config)
            .field("connected", &self.client.is_built())
            .finish()
    }
}

fn list(kinds: Vec<Kind>) -> ListValue {
    ListValue {
        values: kinds.into_iter().map(|k| prost_types::Value { kind: Some(k) }).collect(),
    }
}

fn upsert_mutation(table: &str, columns: Vec<String>, values: Vec<Kind>) -> Mutation {
    Mutation {
        operation: Some(Operation::InsertOrUpdate(Write {
            table: table.to_string(),
            columns,
            values: vec![list(values)],
        })),
    }
}

fn delete_mutation(table: &str, key: Vec<Kind>) -> Mutation {
    Mutation {
        operation: Some(Operation::Delete(Delete {
            table: table.to_string(),
            key_set: Some(PbKeySet {
                keys: vec![list(key)],
                ranges: Vec::new(),
                all: false,
            }),
        })),
    }
}

fn int(v: i64) -> Kind {
    Kind::StringValue(v.to_string())
}

fn text(s: &str) -> Kind {
    Kind::StringValue(s.to_string())
}

fn key_of(kinds: &[Kind]) -> Key {
    let raws: Vec<Raw> = kinds.iter().cloned().map(Raw).collect();
    let refs: Vec<&dyn ToKind> = raws.iter().map(|r| r as &dyn ToKind).collect();
    Key::composite(&refs)
}

fn cell_i64(raw: &Raw) -> Option<i64> {
    cell_text(raw).and_then(|s| s.parse().ok())
}

/// Reads `columns` of the rows of `table` under `keys`; each row's cells.
async fn read_rows(
    tx: &mut ReadWriteTransaction,
    table: &str,
    columns: &[&str],
    keys: Vec<Key>,
) -> std::result::Result<Vec<Vec<Raw>>, TxError> {
    if keys.is_empty() {
        return Ok(Vec::new());
    }
    let mut rows = tx.read(table, columns, KeySet::from(keys)).await?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().await? {
        let cells = (0..columns.len())
            .map(|i| row.column::<Raw>(i))
            .collect::<std::result::Result<Vec<_>, _>>();
        out.push(cells.map_err(|e| Error::retryable(format!("unreadable row of {table}: {e}")))?);
    }
    Ok(out)
}

/// The rows of a query run in `tx` (what the transaction's mutations
/// buffered is not in them).
async fn query_rows(tx: &mut ReadWriteTransaction, sql: &str) -> std::result::Result<Vec<Vec<Raw>>, TxError> {
    let rows = tx.query(Statement::new(sql)).await?;
    all_rows(rows).await.map_err(|e| e.either(TxError::Spanner))
}

/// The names of the sink's own tables.
#[derive(Debug, Clone)]
struct Names {
    offsets: String,
    deleted: String,
    resets: String,
    group: String,
}

impl Names {
    /// The deleted-rows entries of `table` under `keys` (row keys), as
    /// stored.
    async fn deleted_entries(
        &self,
        tx: &mut ReadWriteTransaction,
        table: &str,
        keys: impl Iterator<Item = String>,
    ) -> std::result::Result<HashMap<String, Pos>, TxError> {
        let keys: Vec<Key> = keys.map(|k| key_of(&[text(table), Kind::StringValue(k)])).collect();
        let rows = read_rows(tx, &self.deleted, &["row_key", COMMIT_COLUMN, INDEX_COLUMN], keys).await?;
        Ok(rows
            .iter()
            .filter_map(|r| {
                Some((
                    r.first().and_then(cell_text)?.to_string(),
                    (r.get(1).and_then(cell_i64)?, r.get(2).and_then(cell_i64)?),
                ))
            })
            .collect())
    }

    /// A deleted-rows entry as the attempt will leave it.
    async fn entry(
        &self,
        tx: &mut ReadWriteTransaction,
        a: &Attempt,
        table: &str,
        row_key: &str,
    ) -> std::result::Result<Option<Pos>, TxError> {
        if let Some(p) = a.deleted.get(&(table.to_string(), row_key.to_string())) {
            return Ok(*p);
        }
        Ok(self
            .deleted_entries(tx, table, std::iter::once(row_key.to_string()))
            .await?
            .remove(row_key))
    }

    fn set_entry(&self, a: &mut Attempt, table: &str, row_key: &str, at: Option<Pos>) {
        let key = vec![text(table), text(row_key)];
        match at {
            Some((c, i)) => a.push(
                upsert_mutation(
                    &self.deleted,
                    vec![
                        "dest_table".into(),
                        "row_key".into(),
                        COMMIT_COLUMN.into(),
                        INDEX_COLUMN.into(),
                        "deleted_at".into(),
                    ],
                    vec![text(table), text(row_key), int(c), int(i), text(COMMIT_TIMESTAMP)],
                ),
                DELETED_ENTRY_MUTATIONS,
            ),
            None => a.push(delete_mutation(&self.deleted, key), 1),
        }
        a.deleted.insert((table.to_string(), row_key.to_string()), at);
    }

    /// Runs the batch's steps and offsets in `tx`.
    async fn run(
        &self,
        tx: &mut ReadWriteTransaction,
        ops: &[Op],
        offsets: &[OffsetMove<'_>],
    ) -> std::result::Result<Attempt, TxError> {
        let mut a = Attempt::default();
        for op in ops {
            match op {
                Op::Write { table, key_columns, key_types, changes } => {
                    self.write(tx, &mut a, table, key_columns, key_types, changes).await?
                }
                Op::Truncate { table, at, exists, keep } => {
                    self.truncate(tx, &mut a, table, *at, *exists, *keep).await?
                }
                Op::Forget { table, reset, exists } => self.forget(tx, &mut a, table, *reset, *exists).await?,
                Op::Keyless { table, changes } => self.keyless(tx, &mut a, table, changes).await?,
            }
        }
        self.offsets(tx, &mut a, offsets).await?;
        Ok(a)
    }

    async fn write(
        &self,
        tx: &mut ReadWriteTransaction,
        a: &mut Attempt,
        table: &str,
        key_columns: &[String],
        key_types: &[SpType],
        changes: &[Change],
    ) -> std::result::Result<(), TxError> {
        // The stored positions of the keys the attempt has not written yet.
        let unread: Vec<&Change> = changes
            .iter()
            .filter(|c| !a.rows.contains_key(&(table.to_string(), c.form.clone())))
            .collect();
        let mut columns: Vec<&str> = key_columns.iter().map(String::as_str).collect();
        columns.extend([COMMIT_COLUMN, INDEX_COLUMN]);
        let keys = unread.iter().map(|c| key_of(&c.key)).collect();
        let n = key_columns.len();
        let stored: HashMap<String, Pos> = read_rows(tx, table, &columns, keys)
            .await?
            .iter()
            .filter_map(|r| {
                let form = r
                    .get(..n)?
                    .iter()
                    .zip(key_types)
                    .map(|(v, t)| key_form(&v.0, t))
                    .collect::<Vec<_>>()
                    .join("\u{1}");
                Some((form, (r.get(n).and_then(cell_i64)?, r.get(n + 1).and_then(cell_i64)?)))
            })
            .collect();
        let wanted = changes
            .iter()
            .map(|c| c.text.clone())
            .chain(std::iter::once(TABLE_ROW_KEY.to_string()))
            .filter(|k| !a.deleted.contains_key(&(table.to_string(), k.clone())));
        let entries = self.deleted_entries(tx, table, wanted).await?;
        let entry = |a: &Attempt, k: &str| match a.deleted.get(&(table.to_string(), k.to_string())) {
            Some(p) => *p,
            None => entries.get(k).copied(),
        };
        for c in changes {
            let slot = (table.to_string(), c.form.clone());
            let row = match a.rows.get(&slot) {
                Some(b) => b.position,
                None => stored.get(&c.form).copied(),
            };
            let deleted = entry(a, &c.text);
            let wide = entry(a, TABLE_ROW_KEY);
            if c.delete {
                if row.is_some_and(|r| r <= c.position) {
                    a.push(delete_mutation(table, c.key.clone()), 1);
                    a.rows.insert(
                        slot,
                        Buffered {
                            key: c.key.clone(),
                            key_columns: key_columns.to_vec(),
                            position: None,
                        },
                    );
                }
                if deleted.is_none_or(|d| d < c.position) {
                    self.set_entry(a, table, &c.text, Some(c.position));
                }
            } else if row.is_none_or(|r| r < c.position)
                && deleted.is_none_or(|d| d < c.position)
                // A change at the table-wide entry's own position is a row
                // of that copy (every row of a snapshot has its position).
                && wide.is_none_or(|w| w <= c.position)
            {
                a.push(upsert_mutation(table, c.columns.clone(), c.values.clone()), c.columns.len());
                a.rows.insert(
                    slot,
                    Buffered {
                        key: c.key.clone(),
                        key_columns: key_columns.to_vec(),
                        position: Some(c.position),
                    },
                );
                if deleted.is_some() {
                    self.set_entry(a, table, &c.text, None);
                }
            }
        }
        Ok(())
    }

    /// A keyless table's changes, as `crate::sink::keyless::statements`
    /// applies them in SQL: inserts (some taken by pending deletes of their
    /// content), then deletes paired with the rows of their content, every
    /// step over what the attempt buffered too.
    async fn keyless(
        &self,
        tx: &mut ReadWriteTransaction,
        a: &mut Attempt,
        table: &str,
        changes: &[KeylessChange],
    ) -> std::result::Result<(), TxError> {
        let pending = pending_table(table);
        let slot = |content: &str, row: &str| (table.to_string(), format!("{content}\u{1}{row}"));
        // The rows of every content the changes name, as the attempt
        // leaves them.
        let mut contents: Vec<&str> = changes.iter().map(|c| c.content.as_str()).collect();
        contents.sort_unstable();
        contents.dedup();
        let mut rows: HashMap<(String, String), Option<Pos>> = HashMap::new();
        for r in query_rows(tx, &keyless_rows_sql(table, &contents)).await? {
            if let (Some(content), Some(row), Some(c), Some(i)) = (
                r.first().and_then(cell_text),
                r.get(1).and_then(cell_text),
                r.get(2).and_then(cell_i64),
                r.get(3).and_then(cell_i64),
            ) {
                rows.insert((content.to_string(), row.to_string()), Some((c, i)));
            }
        }
        for ((t, form), b) in &a.rows {
            if let (true, Some((content, row))) = (t == table, form.split_once('\u{1}')) {
                rows.insert((content.to_string(), row.to_string()), b.position);
            }
        }
        let mut waiting: HashMap<(String, String), Pos> = HashMap::new();
        for r in query_rows(tx, &pending_deletes_sql(&self.deleted, table)).await? {
            let entry = r.first().and_then(cell_text).and_then(split_pending);
            if let (Some((content, row)), Some(c), Some(i)) =
                (entry, r.get(1).and_then(cell_i64), r.get(2).and_then(cell_i64))
            {
                waiting.insert((content.to_string(), row.to_string()), (c, i));
            }
        }
        for ((t, k), p) in &a.deleted {
            if let (true, Some((content, row))) = (*t == pending, split_pending(k)) {
                match p {
                    Some(p) => waiting.insert((content.to_string(), row.to_string()), *p),
                    None => waiting.remove(&(content.to_string(), row.to_string())),
                };
            }
        }
        let markers: Vec<String> = changes
            .iter()
            .map(|c| {
                if c.delete {
                    delete_done(&c.row)
                } else {
                    row_gone(&c.row)
                }
            })
            .chain(std::iter::once(TABLE_ROW_KEY.to_string()))
            .filter(|k| !a.deleted.contains_key(&(table.to_string(), k.clone())))
            .collect();
        let stored = self.deleted_entries(tx, table, markers.into_iter()).await?;
        let entry = |a: &Attempt, k: &str| match a.deleted.get(&(table.to_string(), k.to_string())) {
            Some(p) => *p,
            None => stored.get(k).copied(),
        };
        let wide = entry(a, TABLE_ROW_KEY);
        let older_than_table = |p: Pos| wide.is_some_and(|w| w > p);
        // 1-3: inserts.
        let inserts: Vec<&KeylessChange> = changes
            .iter()
            .filter(|c| !c.delete)
            .filter(|c| !matches!(rows.get(&(c.content.clone(), c.row.clone())), Some(Some(_))))
            .filter(|c| entry(a, &row_gone(&c.row)).is_none() && !older_than_table(c.position))
            .collect();
        let taken: Vec<((String, String), Pos)> = waiting
            .iter()
            .filter(|((content, _), _)| inserts.iter().any(|c| &c.content == content))
            .map(|(k, p)| (k.clone(), *p))
            .collect();
        let items: Vec<PairItem> = inserts
            .iter()
            .map(|c| PairItem {
                content: c.content.clone(),
                position: c.position,
                newer: false,
                id: c.row.clone(),
            })
            .chain(taken.iter().map(|((content, row), p)| PairItem {
                content: content.clone(),
                position: *p,
                newer: true,
                id: row.clone(),
            }))
            .collect();
        let matched = pair(&items);
        for (n, ((content, row), p)) in taken.iter().enumerate() {
            if matched[inserts.len() + n] {
                self.set_entry(a, &pending, &pending_key(content, row), None);
                self.set_entry(a, table, &delete_done(row), Some(*p));
            }
        }
        for (n, c) in inserts.iter().enumerate() {
            if matched[n] {
                self.set_entry(a, table, &row_gone(&c.row), Some(c.position));
                continue;
            }
            a.push(upsert_mutation(table, c.columns.clone(), c.values.clone()), c.columns.len());
            a.rows.insert(
                slot(&c.content, &c.row),
                Buffered {
                    key: vec![text(&c.content), text(&c.row)],
                    key_columns: KEYLESS_COLUMNS.iter().map(|k| k.to_string()).collect(),
                    position: Some(c.position),
                },
            );
            rows.insert((c.content.clone(), c.row.clone()), Some(c.position));
        }
        // 4-5: deletes, each taking a row of its content older than it.
        let deletes: Vec<&KeylessChange> = changes
            .iter()
            .filter(|c| c.delete)
            .filter(|c| entry(a, &delete_done(&c.row)).is_none())
            .filter(|c| !waiting.contains_key(&(c.content.clone(), c.row.clone())) && !older_than_table(c.position))
            .collect();
        let alive: Vec<(&(String, String), Pos)> = rows
            .iter()
            .filter_map(|(k, p)| p.map(|p| (k, p)))
            .filter(|((content, _), _)| deletes.iter().any(|d| &d.content == content))
            .collect();
        let items: Vec<PairItem> = deletes
            .iter()
            .map(|c| PairItem {
                content: c.content.clone(),
                position: c.position,
                newer: true,
                id: c.row.clone(),
            })
            .chain(alive.iter().map(|((content, row), p)| PairItem {
                content: content.clone(),
                position: *p,
                newer: false,
                id: row.clone(),
            }))
            .collect();
        let matched = pair(&items);
        for (n, c) in deletes.iter().enumerate() {
            if matched[n] {
                self.set_entry(a, table, &delete_done(&c.row), Some(c.position));
            } else {
                self.set_entry(a, &pending, &pending_key(&c.content, &c.row), Some(c.position));
            }
        }
        for (n, ((content, row), p)) in alive.iter().enumerate() {
            if matched[deletes.len() + n] {
                a.push(delete_mutation(table, vec![text(content), text(row)]), 1);
                a.rows.insert(
                    slot(content, row),
                    Buffered {
                        key: vec![text(content), text(row)],
                        key_columns: KEYLESS_COLUMNS.iter().map(|k| k.to_string()).collect(),
                        position: None,
                    },
                );
                self.set_entry(a, table, &row_gone(row), Some(*p));
            }
        }
        Ok(())
    }

    async fn truncate(
        &self,
        tx: &mut ReadWriteTransaction,
        a: &mut Attempt,
        table: &str,
        at: Pos,
        exists: bool,
        keep: bool,
    ) -> std::result::Result<(), TxError> {
        if exists {
            tx.update(Statement::new(truncate_older_sql(table, at.0, at.1))).await?;
        }
        // Rows the attempt buffered are the DML's to remove too.
        let older: Vec<(String, String)> = a
            .rows
            .iter()
            .filter(|((t, _), b)| t == table && b.position.is_some_and(|p| p < at))
            .map(|(k, _)| k.clone())
            .collect();
        for slot in older {
            if let Some(b) = a.rows.get_mut(&slot) {
                b.position = None;
                let key = b.key.clone();
                a.push(delete_mutation(table, key), 1);
            }
        }
        if !keep {
            return Ok(());
        }
        if self.entry(tx, a, table, TABLE_ROW_KEY).await?.is_none_or(|w| w < at) {
            self.set_entry(a, table, TABLE_ROW_KEY, Some(at));
        }
        tx.update(Statement::new(deleted_keys_older_sql(&self.deleted, table, at.0, at.1)))
            .await?;
        let pending = pending_table(table);
        let older: Vec<(String, String)> = a
            .deleted
            .iter()
            .filter(|((t, k), p)| (t == table && k != TABLE_ROW_KEY || *t == pending) && p.is_some_and(|p| p < at))
            .map(|(k, _)| k.clone())
            .collect();
        for (t, k) in older {
            self.set_entry(a, &t, &k, None);
        }
        Ok(())
    }

    async fn forget(
        &self,
        tx: &mut ReadWriteTransaction,
        a: &mut Attempt,
        table: &str,
        reset: i64,
        exists: bool,
    ) -> std::result::Result<(), TxError> {
        let applied = match a.resets.get(table) {
            Some(r) => Some(*r),
            None => read_rows(tx, &self.resets, &["reset"], vec![key_of(&[text(table)])])
                .await?
                .first()
                .and_then(|r| r.first().and_then(cell_i64)),
        };
        if applied.is_some_and(|r| r >= reset) {
            return Ok(());
        }
        if exists {
            tx.update(Statement::new(forget_positions_sql(table))).await?;
        }
        let (c, i) = FORGOTTEN_POSITION;
        for ((t, _), b) in a.rows.iter_mut() {
            if t == table && b.position.is_some() {
                b.position = Some(FORGOTTEN_POSITION);
                let mut columns = b.key_columns.clone();
                columns.extend([COMMIT_COLUMN.to_string(), INDEX_COLUMN.to_string()]);
                let mut values = b.key.clone();
                values.extend([int(c), int(i)]);
                let n = columns.len();
                a.mutations.push(upsert_mutation(table, columns, values));
                a.count += n;
            }
        }
        tx.update(Statement::new(forget_deleted_sql(&self.deleted, table))).await?;
        let pending = pending_table(table);
        let buffered: Vec<(String, String)> = a
            .deleted
            .iter()
            .filter(|((t, _), p)| (t == table || *t == pending) && p.is_some())
            .map(|(k, _)| k.clone())
            .collect();
        for (t, k) in buffered {
            self.set_entry(a, &t, &k, None);
        }
        a.push(
            upsert_mutation(&self.resets, vec!["destination".into(), "reset".into()], vec![text(table), int(reset)]),
            2,
        );
        a.resets.insert(table.to_string(), reset);
        Ok(())
    }

    /// Checks every fence against the stored offsets and buffers the new
    /// ones.
    async fn offsets(
        &self,
        tx: &mut ReadWriteTransaction,
        a: &mut Attempt,
        offsets: &[OffsetMove<'_>],
    ) -> std::result::Result<(), TxError> {
        let key = |m: &OffsetMove<'_>| vec![text(&self.group), text(m.topic), int(i64::from(m.partition))];
        let checked: Vec<&OffsetMove<'_>> = offsets.iter().filter(|m| m.fence != Fence::Unchecked).collect();
        let keys = checked.iter().map(|m| key_of(&key(m))).collect();
        let stored: HashMap<(String, i64), i64> =
            read_rows(tx, &self.offsets, &["topic", "partition", "next_offset"], keys)
                .await?
                .iter()
                .filter_map(|r| {
                    Some((
                        (r.first().and_then(cell_text)?.to_string(), r.get(1).and_then(cell_i64)?),
                        r.get(2).and_then(cell_i64)?,
                    ))
                })
                .collect();
        for m in checked {
            let now = stored.get(&(m.topic.to_string(), i64::from(m.partition))).copied();
            let holds = match m.fence {
                Fence::Unchecked => true,
                Fence::Absent => now.is_none(),
                Fence::At(o) => now == Some(o),
            };
            if !holds {
                return Err(
                    fenced(&format!("{}[{}]: expected {:?}, stored {:?}", m.topic, m.partition, m.fence, now)).into()
                );
            }
        }
        for m in offsets {
            let mut values = key(m);
            values.push(int(m.next));
            a.push(
                upsert_mutation(
                    &self.offsets,
                    vec![
                        "consumer_group".into(),
                        "topic".into(),
                        "partition".into(),
                        "next_offset".into(),
                    ],
                    values,
                ),
                OFFSETS_ROW_MUTATIONS,
            );
        }
        Ok(())
    }
}

impl SpannerSink {
    /// A sink for `config`; it connects on first use, so that a destination
    /// that cannot be reached pauses the runner instead of failing its start.
    pub fn new(config: SpannerSinkConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        let consumer_group = config
            .consumer_group
            .clone()
            .ok_or_else(|| ConfigError::invalid("spanner.consumer_group", "is required"))?;
        Ok(Self {
            client: SpClient::new(&config),
            config,
            consumer_group,
            bookkeeping_ready: false,
            tables: HashMap::new(),
            prune_at: std::time::Instant::now(),
            mode: Mode::Commit,
            ops: Vec::new(),
            commits: 0,
            aborts: 0,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &SpannerSinkConfig {
        &self.config
    }

    /// Read-write transactions committed so far (rows and offsets).
    pub fn commits(&self) -> u64 {
        self.commits
    }

    /// Transactions Spanner aborted that were run again.
    pub fn aborts_retried(&self) -> u64 {
        self.aborts
    }

    fn names(&self) -> Names {
        Names {
            offsets: self.config.bookkeeping(OFFSETS_TABLE),
            deleted: self.config.bookkeeping(DELETED_TABLE),
            resets: self.config.bookkeeping(RESETS_TABLE),
            group: self.consumer_group.clone(),
        }
    }

    /// Builds the clients (if not built) and makes sure the bookkeeping
    /// tables exist; removes expired deleted-rows entries when due.
    pub async fn connect(&mut self) -> Result<()> {
        if !self.bookkeeping_ready {
            let names = self.names();
            self.client
                .ddl(vec![
                    offsets_ddl(&names.offsets),
                    deleted_ddl(&names.deleted),
                    resets_ddl(&names.resets),
                ])
                .await
                .map_err(|e| {
                    if e.kind() == ErrorKind::NeedsOperator {
                        e.with_hint(ROLES_HINT)
                    } else {
                        e
                    }
                })?;
            self.bookkeeping_ready = true;
        }
        if std::time::Instant::now() >= self.prune_at {
            self.prune_at = std::time::Instant::now() + DELETED_ROWS_PRUNE_INTERVAL;
            let sql = prune_deleted_sql(&self.names().deleted, self.config.deleted_rows_retention_hours);
            let removed = self.client.partitioned_update(&sql).await?;
            debug!(removed, "expired deleted-rows entries removed");
        }
        Ok(())
    }

    /// Runs `ops` and `offsets` in one read-write transaction, committed or
    /// (a trial) rolled back; an aborted attempt is run again.
    async fn run_transaction(&mut self, ops: &[Op], offsets: &[OffsetMove<'_>], commit: bool) -> Result<()> {
        if ops.is_empty() && offsets.is_empty() {
            return Ok(());
        }
        let names = self.names();
        let retries = self.config.abort_retries;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let client = self.client.data().await?;
            let mut tx = client.begin_read_write_transaction().await.map_err(classify_client)?;
            let result = names.run(&mut tx, ops, offsets).await;
            let outcome = if commit {
                let mutations = result.map(|a| {
                    debug!(mutations = a.count, "committing");
                    a.mutations
                });
                match mutations {
                    Ok(ms) => {
                        tx.buffer_write(ms);
                        tx.end(Ok::<(), TxError>(()), None).await.map(|_| ())
                    }
                    Err(e) => tx.end(Err::<(), TxError>(e), None).await.map(|_| ()),
                }
            } else {
                // A trial: everything read and checked, nothing committed.
                let checked = result.map(|_| ());
                let _ = tx.end(Err::<(), TxError>(TxError::Sink(Error::retryable("trial"))), None).await;
                checked
            };
            match outcome.map_err(TxError::into_error) {
                Ok(()) => {
                    if commit {
                        self.commits += 1;
                    }
                    return Ok(());
                }
                Err(e) if is_aborted(&e) && attempt < retries => {
                    self.aborts += 1;
                    warn!(attempt, "Spanner aborted the transaction; running it again");
                    // Spanner's advice: back off before retrying an abort.
                    tokio::time::sleep(std::time::Duration::from_millis(10 << attempt.min(6))).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Reads a table's columns and key from `INFORMATION_SCHEMA`.
    async fn load_table(&mut self, dest: &DestinationTable) -> Result<()> {
        let mut state = TableState::default();
        for row in self.client.query(&columns_sql(&dest.0)).await? {
            let name = row.first().and_then(cell_text).unwrap_or_default().to_string();
            let type_text = row.get(1).and_then(cell_text).unwrap_or_default();
            let ty = from_spanner_type(type_text).ok_or_else(|| {
                Error::needs_operator(format!(
                    "column {name} of {dest} has type {type_text}, which the sink does not write"
                ))
                .with_column(name.clone())
            })?;
            let nullable = row.get(2).and_then(cell_text) == Some("YES");
            state.shape.exists = true;
            state.shape.columns.push(ShapeColumn { name, ty, not_null: !nullable });
        }
        if state.shape.exists {
            for row in self.client.query(&key_sql(&dest.0)).await? {
                if let Some(name) = row.first().and_then(cell_text) {
                    state.shape.primary_key.push(name.to_string());
                }
            }
        }
        self.tables.insert(dest.clone(), state);
        Ok(())
    }

    async fn table_exists(&mut self, dest: &DestinationTable) -> Result<bool> {
        if !self.tables.contains_key(dest) {
            self.load_table(dest).await?;
        }
        Ok(self.tables.get(dest).is_some_and(|s| s.shape.exists))
    }

    /// Runs `statements` (DDL, waited for) on `dest`'s table.
    async fn change_table(&mut self, dest: &DestinationTable, statements: Vec<String>) -> Result<()> {
        if !statements.is_empty() {
            info!(table = %dest, ddl = ?statements, "changing destination table");
            self.client.ddl(statements).await?;
        }
        Ok(())
    }

    /// Renames `from` to `to` the way Spanner can ([`rename_steps`]): the
    /// values go with the column, never split between two columns.
    async fn rename_column(
        &mut self,
        dest: &DestinationTable,
        shape: &TableShape<SpType>,
        from: &str,
        to: &str,
    ) -> Result<()> {
        let Some(column) = shape.column(from) else {
            return Ok(());
        };
        let steps = rename_steps(&dest.0, column, to, &shape.primary_key)?;
        info!(table = %dest, from, to, "renaming a column: new column, values copied, old column dropped");
        self.client.ddl(vec![steps.add]).await?;
        self.client.partitioned_update(&steps.copy).await?;
        self.client.ddl(steps.not_null.into_iter().chain([steps.drop]).collect()).await
    }

    /// Removes this copy from Spanner: its stored offsets and, when `drop`
    /// lists them, the destination tables of those source tables.
    pub async fn delete_copy(&mut self, drop: &[TableId]) -> Result<Vec<String>> {
        self.connect().await?;
        let names = self.names();
        let sql = format!(
            "DELETE FROM {} WHERE consumer_group = {}",
            quote_ident(&names.offsets),
            quote_string(&self.consumer_group)
        );
        self.client.partitioned_update(&sql).await?;
        let mut done = vec![format!("stored offsets of consumer group {}", self.consumer_group)];
        for source in drop {
            let dest = self.config.destination(source);
            self.client.ddl(vec![format!("DROP TABLE IF EXISTS {}", dest.quoted())]).await?;
            self.client
                .partitioned_update(&forget_deleted_sql(&names.deleted, &dest.0))
                .await?;
            done.push(format!("destination table {dest}"));
        }
        self.tables.clear();
        Ok(done)
    }

    /// The type each column of `schema` has in `dest` (the catalog read
    /// again if a column is not in the cached shape); `None` when the table
    /// does not exist.
    async fn read_types(&mut self, dest: &DestinationTable, schema: &TableSchema) -> Result<Option<Vec<SpType>>> {
        let cached = self
            .tables
            .get(dest)
            .is_some_and(|s| s.shape.exists && schema.columns.iter().all(|c| s.shape.column(&c.name).is_some()));
        if !cached {
            self.load_table(dest).await?;
        }
        let Some(state) = self.tables.get(dest).filter(|s| s.shape.exists) else {
            return Ok(None);
        };
        schema
            .columns
            .iter()
            .map(|c| {
                state.shape.column(&c.name).map(|s| s.ty.clone()).ok_or_else(|| {
                    Error::permanent(format!("column {} ({}) is not in destination table {dest}", c.name, c.data_type))
                        .with_table(schema.id.clone())
                        .with_column(c.name.clone())
                })
            })
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }

    /// Runs a read-only query for the setup check.
    pub(super) async fn probe_query(&mut self, sql: &str) -> Result<usize> {
        self.client.query(sql).await.map(|rows| rows.len())
    }

    /// The mutations a record may cost at most (before reduction).
    fn weight(record: &SinkRecord) -> usize {
        match record {
            SinkRecord::Change(ev) if ev.schema.key.is_empty() => {
                // A keyless table's update: its new row (with its content
                // key and name) or its taken insert's entry; the old row's
                // removal and two entries, or a pending delete.
                ev.schema.columns.len() + 4 + DELETED_ENTRY_MUTATIONS + 1 + 2 * DELETED_ENTRY_MUTATIONS
            }
            SinkRecord::Change(ev) => {
                // An upsert: its columns and positions, and the removal of
                // its key's deleted-rows entry; a delete: the row and the
                // entry.
                let upsert = ev.schema.columns.len() + 2 + 1;
                upsert.max(1 + DELETED_ENTRY_MUTATIONS)
            }
            // Table-wide steps: their bookkeeping rows (their DML's row
            // effects cannot be known before it runs).
            _ => DELETED_ENTRY_MUTATIONS + 2,
        }
    }

    /// The core's apply over `batch`, split into commits under the
    /// mutation limit.
    async fn apply_split(&mut self, batch: &SinkBatch) -> Result<(), ApplyError> {
        let limit = self
            .config
            .mutation_limit
            .saturating_sub(OFFSETS_ROW_MUTATIONS * batch.next_offsets.len())
            .max(1);
        let Some(parts) = split_by_weight(batch, limit, Self::weight) else {
            return warehouse::apply(self, batch, Mode::Commit).await;
        };
        info!(parts = parts.len(), records = batch.records.len(), "batch split under the mutation limit");
        let mut start = 0;
        for part in &parts {
            warehouse::apply(self, part, Mode::Commit).await.map_err(|mut f| {
                // The record's index in the whole batch.
                f.record = f.record.map(|i| i + start);
                f
            })?;
            start += part.records.len();
        }
        Ok(())
    }
}

/// The encoded changes of `changes` for a table of shape `shape`.
fn encode_changes(changes: &Reduction<'_>, shape: &TableShape<SpType>) -> Result<Vec<Change>, ApplyError> {
    let mut out = Vec::new();
    for (group, line) in changes.live() {
        let schema = &group.schema;
        let fail = |error: Error| ApplyError {
            error: error.with_table(schema.id.clone()),
            record: Some(line.record),
        };
        let mut key = Vec::with_capacity(group.key.len());
        let mut forms = Vec::with_capacity(group.key.len());
        for &k in &group.key {
            let (col, value) = (&schema.columns[k], &line.row[k]);
            let ty = column_type(shape, &col.name).map_err(fail)?;
            let kind = encode(value, &ty).map_err(|r| value_error(&col.name, r, value)).map_err(fail)?;
            forms.push(key_form(&kind, &ty));
            key.push(kind);
        }
        let bytes = key_bytes(schema, line.row, &group.key).map_err(fail)?;
        let (columns, values) = if line.delete {
            (Vec::new(), Vec::new())
        } else {
            encode_upsert(group, line, shape)?
        };
        out.push(Change {
            key,
            form: forms.join("\u{1}"),
            text: key_text(&bytes),
            position: (line.commit, line.index),
            delete: line.delete,
            columns,
            values,
        });
    }
    Ok(out)
}

/// The encoded changes of a table without a key (`changes`): each insert's
/// columns with its content key and name.
fn encode_keyless(changes: &Reduction<'_>, shape: &TableShape<SpType>) -> Result<Vec<KeylessChange>, ApplyError> {
    let mut out = Vec::new();
    for (group, line) in changes.live() {
        let instance = line
            .instance
            .as_deref()
            .ok_or_else(|| Error::retryable("a keyless line without its row's name"))?;
        let (mut columns, mut values) = if line.delete {
            (Vec::new(), Vec::new())
        } else {
            encode_upsert(group, line, shape)?
        };
        if !line.delete {
            columns.extend(KEYLESS_COLUMNS.iter().map(|c| c.to_string()));
            values.extend([text(&instance.content), text(&instance.row)]);
        }
        out.push(KeylessChange {
            content: instance.content.clone(),
            row: instance.row.clone(),
            position: (line.commit, line.index),
            delete: line.delete,
            columns,
            values,
        });
    }
    Ok(out)
}

/// The type of destination column `name` in `shape`.
fn column_type(shape: &TableShape<SpType>, name: &str) -> Result<SpType> {
    shape
        .column(name)
        .map(|c| c.ty.clone())
        .ok_or_else(|| Error::retryable(format!("column {name} is not in the destination table's cached shape")))
}

/// The error of a value Spanner cannot take in `column`.
fn value_error(column: &str, reason: String, value: &Value) -> Error {
    Error::permanent(format!("column {column}: {reason} (value type {})", value.kind()))
        .with_column(column.to_string())
        .with_class("tributary.value")
}

/// An upsert's columns (the position columns last) and values.
fn encode_upsert(
    group: &Group<'_>,
    line: &Line<'_>,
    shape: &TableShape<SpType>,
) -> Result<(Vec<String>, Vec<Kind>), ApplyError> {
    let schema = &group.schema;
    let fail = |error: Error| ApplyError {
        error: error.with_table(schema.id.clone()),
        record: Some(line.record),
    };
    let (mut columns, mut values) = (Vec::new(), Vec::new());
    for (col, value) in schema.columns.iter().zip(line.row) {
        // Not sent (an unchanged TOAST value): insert_or_update keeps
        // what the row has.
        if matches!(value, Value::Unchanged) {
            continue;
        }
        let ty = column_type(shape, &col.name).map_err(fail)?;
        if matches!(value, Value::Null) && shape.column(&col.name).is_some_and(|c| c.not_null) {
            return Err(fail(
                Error::permanent(format!("column {} is NOT NULL in Spanner and the change has NULL", col.name))
                    .with_column(col.name.clone())
                    .with_class("tributary.value"),
            ));
        }
        values.push(encode(value, &ty).map_err(|r| fail(value_error(&col.name, r, value)))?);
        columns.push(col.name.clone());
    }
    columns.extend([COMMIT_COLUMN.to_string(), INDEX_COLUMN.to_string()]);
    values.extend([int(line.commit), int(line.index)]);
    Ok((columns, values))
}

#[async_trait]
impl Warehouse for SpannerSink {
    type Table = DestinationTable;

    fn destination(&self, source: &TableId) -> DestinationTable {
        self.config.destination(source)
    }

    fn drops_tables(&self) -> bool {
        self.config.drop_tables
    }

    fn evolution(&self) -> Evolution {
        Evolution { drop_columns: self.config.drop_columns }
    }

    async fn connect(&mut self) -> Result<()> {
        SpannerSink::connect(self).await
    }

    async fn begin(&mut self, mode: Mode) -> Result<()> {
        self.mode = mode;
        self.ops.clear();
        Ok(())
    }

    async fn finish(&mut self, offsets: &[OffsetMove<'_>]) -> Result<()> {
        let ops = std::mem::take(&mut self.ops);
        self.run_transaction(&ops, offsets, self.mode == Mode::Commit).await
    }

    async fn abort(&mut self) {
        self.ops.clear();
    }

    /// Forgets cached shapes after an error that is not about the data; the
    /// clients too when an operator must act (credentials may change).
    fn failed(&mut self, error: Error) -> Error {
        if error.kind() != ErrorKind::Permanent {
            self.tables.clear();
            if error.kind() == ErrorKind::NeedsOperator {
                self.bookkeeping_ready = false;
                self.client.reset();
            }
        }
        error
    }

    async fn schema_differences(
        &mut self,
        dest: &DestinationTable,
        schema: &TableSchema,
        origin: &str,
    ) -> Result<Option<Vec<String>>> {
        self.load_table(dest).await?;
        let shape = self.tables.get(dest).map(|s| s.shape.clone()).unwrap_or_default();
        crate::sink::schema::differences(
            &SpannerDialect,
            &dest.0,
            schema,
            origin,
            &shape,
            self.evolution(),
            |c| match c {
                TableChange::RenameColumn { from, to } => {
                    vec![format!("ALTER TABLE {} RENAME COLUMN {from} TO {to}", dest.quoted())]
                }
                other => change_ddl(&dest.0, other, &shape.columns).unwrap_or_else(|e| vec![e.to_string()]),
            },
        )
        .map(Some)
    }

    async fn reconcile(&mut self, dest: &DestinationTable, schema: &TableSchema, origin: &str) -> Result<()> {
        let fingerprint = {
            let mut h = DefaultHasher::new();
            schema.hash(&mut h);
            h.finish()
        };
        if !self.tables.contains_key(dest) {
            self.load_table(dest).await?;
        }
        if self.tables.get(dest).is_some_and(|s| s.reconciled.contains(&fingerprint)) {
            return Ok(());
        }
        let mut state = self.tables.get(dest).cloned().unwrap_or_default();
        while let Some((from, to)) = unfinished_rename(schema, &state.shape) {
            info!(table = %dest, from, to, "finishing a rename a crash interrupted");
            let (from, to) = (from.to_string(), to.to_string());
            self.rename_column(dest, &state.shape, &from, &to).await?;
            state.shape.columns.retain(|c| c.name != from);
        }
        let changes = match plan(&SpannerDialect, &dest.0, schema, origin, &state.shape, self.evolution()) {
            Err(e) if e.class() == KEY_CHANGED_CLASS => {
                // Made anew (the source copies the table again after its
                // key changed), when no row of it is current.
                if self.mode != Mode::Commit {
                    return Err(e);
                }
                // The batch's steps so far first (without offsets, as
                // before a drop): its reset forgets the rows' positions.
                let ops = std::mem::take(&mut self.ops);
                self.run_transaction(&ops, &[], true).await?;
                let count = keyless::current_rows_sql(QUOTING, &quote_ident(&dest.0));
                let current = self
                    .client
                    .query(&count)
                    .await?
                    .first()
                    .and_then(|r| r.first().and_then(cell_i64));
                if current.is_none_or(|n| n > 0) {
                    return Err(e);
                }
                info!(table = %dest, reason = %e, "making the destination table anew: its source table gained or lost its key");
                self.drop_table(dest).await?;
                state = TableState::default();
                plan(&SpannerDialect, &dest.0, schema, origin, &state.shape, self.evolution())?
            }
            other => other?,
        };
        // Each statement restates a column as the one before left it.
        let mut statements = Vec::new();
        for change in &changes {
            if let TableChange::RenameColumn { from, to } = change {
                // Not one statement in Spanner: what comes before it first.
                self.change_table(dest, std::mem::take(&mut statements)).await?;
                self.rename_column(dest, &state.shape, from, to).await?;
            } else {
                statements.extend(change_ddl(&dest.0, change, &state.shape.columns)?);
            }
            state.shape.apply(std::slice::from_ref(change));
        }
        self.change_table(dest, statements).await?;
        state.reconciled.insert(fingerprint);
        self.tables.insert(dest.clone(), state);
        Ok(())
    }

    async fn drop_table(&mut self, dest: &DestinationTable) -> Result<()> {
        if self.mode == Mode::Commit {
            // DDL is not transactional: what came before the drop is
            // committed first (without offsets: a replay of it is harmless,
            // guarded by position).
            let ops = std::mem::take(&mut self.ops);
            self.run_transaction(&ops, &[], true).await?;
            self.client.ddl(vec![format!("DROP TABLE IF EXISTS {}", dest.quoted())]).await?;
            let deleted = self.names().deleted;
            self.client.partitioned_update(&forget_deleted_sql(&deleted, &dest.0)).await?;
            self.tables.remove(dest);
            info!(table = %dest, "dropped destination table (the source table was dropped)");
        } else {
            // A trial cannot undo a drop: it makes none (nor what came
            // before it).
            self.ops.clear();
        }
        Ok(())
    }

    async fn truncate(&mut self, dest: &DestinationTable, at: Position) -> Result<()> {
        let at_i64 = position_i64(at)?;
        let exists = self.table_exists(dest).await?;
        self.ops.push(Op::Truncate {
            table: dest.0.clone(),
            at: at_i64,
            exists,
            keep: keeps_removal(at),
        });
        Ok(())
    }

    async fn forget_positions(&mut self, dest: &DestinationTable, reset: u64) -> Result<()> {
        let reset = reset_i64(reset)?;
        let exists = self.table_exists(dest).await?;
        self.ops.push(Op::Forget { table: dest.0.clone(), reset, exists });
        Ok(())
    }

    async fn write(
        &mut self,
        dest: &DestinationTable,
        changes: &Reduction<'_>,
        _after_load: bool,
    ) -> Result<(), ApplyError> {
        let state = self
            .tables
            .get(dest)
            .ok_or_else(|| Error::retryable(format!("table {dest} vanished from the cache")))?;
        if changes.is_keyless() {
            let changes = encode_keyless(changes, &state.shape)?;
            if !changes.is_empty() {
                self.ops.push(Op::Keyless { table: dest.0.clone(), changes });
            }
            return Ok(());
        }
        let encoded = encode_changes(changes, &state.shape)?;
        if encoded.is_empty() {
            return Ok(());
        }
        let Some(group) = changes.groups.first() else {
            return Ok(());
        };
        let key_columns = group.schema.key.clone();
        let key_types = key_columns
            .iter()
            .map(|k| state.shape.column(k).map(|c| c.ty.clone()).unwrap_or(SpType::String(None)))
            .collect();
        self.ops.push(Op::Write {
            table: dest.0.clone(),
            key_columns,
            key_types,
            changes: encoded,
        });
        Ok(())
    }

    async fn savepoint(&mut self) -> Result<()> {
        self.ops.clear();
        Ok(())
    }

    async fn rollback_to_savepoint(&mut self) -> Result<()> {
        self.ops.clear();
        Ok(())
    }

    /// One read of the key range (a single-use read-only transaction: a
    /// strong read of what is committed), each cell read back as
    /// [`types::decode`] says.
    async fn read_range(
        &mut self,
        table: &DestinationTable,
        schema: &TableSchema,
        range: &KeyRange,
    ) -> Result<Option<Vec<tributary_schemas::Row>>> {
        let Some(types) = self.read_types(table, schema).await? else {
            return Ok(Some(Vec::new()));
        };
        // A range of the source's key is a range of Spanner's keys only
        // when they are the same columns in the same order, or their start
        // (a table without a key: its content key, then the row's name),
        // Spanner bounding by a key's prefix.
        let primary_key = self
            .tables
            .get(table)
            .map(|s| s.shape.primary_key.as_slice())
            .unwrap_or_default();
        if schema.key.is_empty() || !primary_key.starts_with(schema.key.as_slice()) {
            return Err(Error::permanent(format!(
                "destination table {table} has the primary key ({}), not the source's ({}): its key ranges are not \
                 the source's",
                primary_key.join(", "),
                schema.key.join(", ")
            ))
            .with_table(schema.id.clone()));
        }
        let keys = key_range(schema, &types, range)?;
        let columns: Vec<&str> = schema.columns.iter().map(|c| c.name.as_str()).collect();
        let rows = self.client.read(&table.0, &columns, keys).await?;
        rows.iter()
            .map(|cells| read_row(cells, schema, &types))
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }
}

/// The Spanner key range of `range` over `schema`'s key (its columns kept
/// as `types`, one per column of `schema`), each bound encoded as the
/// sink writes keys: Spanner orders its keys as the source does (checked
/// per column, [`types::orders_as_source`]), so the range is one read.
fn key_range(schema: &TableSchema, types: &[SpType], range: &KeyRange) -> Result<KeySet> {
    let keys = schema.key_indexes();
    let refused = |column: &tributary_schemas::Column, why: String| {
        Error::permanent(format!("key column {} ({}) cannot bound a range: {why}", column.name, column.data_type))
            .with_table(schema.id.clone())
            .with_column(column.name.clone())
    };
    for &k in &keys {
        let (column, ty) = (&schema.columns[k], &types[k]);
        if !types::orders_as_source(&column.data_type, ty) {
            return Err(refused(column, format!("Spanner keeps it as {ty}, which orders otherwise")));
        }
    }
    // A bound of no values: Spanner's key prefix of every key.
    let bound = |values: &Option<Vec<Value>>| -> Result<Key> {
        let values = values.as_deref().unwrap_or_default();
        if !values.is_empty() && values.len() != keys.len() {
            return Err(Error::permanent(format!("a bound of {} values for a key of {}", values.len(), keys.len()))
                .with_table(schema.id.clone()));
        }
        let kinds = keys
            .iter()
            .zip(values)
            .map(|(&k, v)| encode(v, &types[k]).map_err(|why| refused(&schema.columns[k], why)))
            .collect::<Result<Vec<_>>>()?;
        Ok(key_of(&kinds))
    };
    let kind = if range.after.is_some() {
        RangeKind::OpenClosed
    } else {
        RangeKind::ClosedClosed
    };
    Ok(KeySet::from(SpKeyRange::new(bound(&range.after)?, bound(&range.until)?, kind)))
}

#[async_trait]
impl WarehouseSink for SpannerSink {
    fn apply_span(&self, batch: &SinkBatch) -> Span {
        info_span!("spanner_apply", table = %batch.table, records = batch.records.len())
    }

    async fn read_offsets(&mut self, partitions: &[(String, i32)]) -> Result<Vec<Option<i64>>> {
        if let Err(e) = self.connect().await {
            return Err(self.failed(e));
        }
        let sql = format!(
            "SELECT topic, `partition`, next_offset FROM {} WHERE consumer_group = {}",
            quote_ident(&self.names().offsets),
            quote_string(&self.consumer_group)
        );
        let rows = match self.client.query(&sql).await {
            Ok(r) => r,
            Err(e) => return Err(self.failed(e)),
        };
        let stored: HashMap<(String, i64), i64> = rows
            .iter()
            .filter_map(|r| {
                Some((
                    (r.first().and_then(cell_text)?.to_string(), r.get(1).and_then(cell_i64)?),
                    r.get(2).and_then(cell_i64)?,
                ))
            })
            .collect();
        Ok(partitions
            .iter()
            .map(|(t, p)| stored.get(&(t.clone(), i64::from(*p))).copied())
            .collect())
    }

    /// Committed in parts under the mutation limit (`apply_split`).
    async fn commit(&mut self, batch: &SinkBatch) -> Result<(), ApplyError> {
        self.apply_split(batch).await
    }

    async fn problems(&mut self) -> Vec<Problem> {
        check::run(self).await
    }

    async fn remove_copy(&mut self, drop: &[TableId]) -> Result<Vec<String>> {
        SpannerSink::delete_copy(self, drop).await
    }

    fn destinations(&self) -> impl Fn(&TableId) -> DestinationTable + Send + Sync + 'static {
        let config = self.config.clone();
        move |t: &TableId| config.destination(t)
    }
}

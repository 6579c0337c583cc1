//! The snapshot: every selected table read in key order, in chunks, inside
//! one `START TRANSACTION WITH CONSISTENT SNAPSHOT` whose binlog position is
//! known, so that streaming from that position continues without a gap.
//!
//! MariaDB reports the snapshot's binlog position itself
//! (`binlog_snapshot_file` / `binlog_snapshot_position` status), so no lock
//! is taken at all. MySQL has no such status: a global read lock is held for
//! the instant between starting the transaction and `SHOW MASTER STATUS`.
//!
//! A chunk is `SELECT ... WHERE (key) > (last key) ORDER BY key LIMIT n+1`:
//! the extra row says whether the table has more, so the last row of the
//! whole snapshot is marked without holding a chunk back. Tables without a
//! primary key are read with `LIMIT n OFFSET rows_done` (stable inside the
//! transaction; after a crash such a table is read again from its start).
//! After a crash the snapshot resumes after the last key
//! committed to Kafka, in a new transaction, once the stream has caught up
//! to that transaction's position (see `MySqlSource`'s `catch_up`).

use std::collections::BTreeMap;

use mysql_async::prelude::Queryable;
use serde::{Deserialize, Serialize};
use tributary_schemas::{ChangeEvent, DataType, Op, Position, SnapshotMarker, SourceInfo, TableId, Value};

use super::config::{ConnectionParams, MySqlSourceConfig, TableFilter};
use super::gtid::MySqlGtidSet;
use super::history::TableDef;
use super::types::{quote_ident, quote_literal, quote_table};
use super::{classify_my, connect, table_def, BinlogPosition, BuiltSchema, EventContext, ServerKind};
use crate::error::{Error, Result};
use crate::SourceMessage;

/// One table's snapshot progress, as stored in the checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TablePlan {
    /// Database.
    pub schema: String,
    /// Table.
    pub table: String,
    /// The primary key of the last row emitted, each part as hex of its
    /// text-protocol bytes (keyed tables).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_key: Option<Vec<String>>,
    /// Rows emitted (the offset of the next chunk of a table without key).
    #[serde(default)]
    pub rows_done: u64,
    /// Whether every row was emitted.
    #[serde(default)]
    pub done: bool,
    /// Set when the table is read to verify it, not copied: the
    /// verification's id. Its rows go out as ranges of digests
    /// ([`SourceMessage::Verify`]), read in the key's binary order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verify: Option<u64>,
    /// The rows per second a verification reads at most (0: no bound).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub verify_rate: u64,
    /// A verification's last range's upper bound (canonical key texts): the
    /// next range's lower one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verify_until: Option<Vec<Option<String>>>,
    /// Keys (canonical key texts) whose current rows are sent again before
    /// the table is verified (a sink's repair request); emptied as they
    /// are read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repair: Option<Vec<String>>,
    /// A verification of a table without a key: how many passes read it
    /// (see [`crate::source::keyless`]; 0: not counted yet); `rows_done`
    /// is the next pass.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub verify_passes: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl TablePlan {
    /// A table not started yet.
    pub fn new(id: &TableId) -> Self {
        Self {
            schema: id.schema.clone(),
            table: id.table.clone(),
            last_key: None,
            rows_done: 0,
            done: false,
            verify: None,
            verify_rate: 0,
            verify_until: None,
            repair: None,
            verify_passes: 0,
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

    /// A table to verify (verification `id`, at most `rows_per_second`).
    pub fn verify(id: &TableId, verification: u64, rows_per_second: u64) -> Self {
        Self {
            verify: Some(verification),
            verify_rate: rows_per_second,
            ..Self::new(id)
        }
    }

    /// The table.
    pub fn id(&self) -> TableId {
        TableId::new(self.schema.clone(), self.table.clone())
    }
}

/// Snapshot work not done yet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct SnapshotState {
    /// Whether this is the first snapshot (its last row is marked `last`).
    pub initial: bool,
    /// The binlog position of the first snapshot transaction (streaming
    /// starts there); `None` until it is opened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub position: Option<BinlogPosition>,
    /// Per table.
    pub tables: Vec<TablePlan>,
}

/// Rows of one chunk, as messages.
#[derive(Debug)]
pub struct Chunk {
    /// The table.
    pub table: TableId,
    /// Read events.
    pub messages: Vec<SourceMessage>,
    /// Whether the table is complete with this chunk.
    pub table_done: bool,
}

/// The binlog position (and GTID position) the server is at now.
pub async fn current_position(
    conn: &mut mysql_async::Conn,
    kind: ServerKind,
) -> Result<(BinlogPosition, Option<String>)> {
    let row: Option<mysql_async::Row> = conn
        .query_first("SHOW MASTER STATUS")
        .await
        .map_err(|e| classify_my(e, "reading the binlog position (SHOW MASTER STATUS)"))?;
    let row = row.ok_or_else(|| {
        Error::needs_operator("SHOW MASTER STATUS returned nothing: the binary log is off")
            .with_hint("log_bin = mysql-bin in my.cnf, then restart (see `source-runner check`)")
    })?;
    let file: String = row.get(0).ok_or_else(|| Error::retryable("SHOW MASTER STATUS has no file"))?;
    let pos: u64 = row
        .get(1)
        .ok_or_else(|| Error::retryable("SHOW MASTER STATUS has no position"))?;
    let position = BinlogPosition { file, pos }.checked()?;
    let gtid = match kind {
        ServerKind::MariaDb => mariadb_gtid_at(conn, &position).await?,
        ServerKind::MySql => row.get::<Option<String>, _>(4).flatten().filter(|s| !s.is_empty()),
    };
    Ok((position, gtid))
}

async fn mariadb_gtid_at(conn: &mut impl Queryable, position: &BinlogPosition) -> Result<Option<String>> {
    let gtid: Option<Option<String>> = conn
        .exec_first("SELECT BINLOG_GTID_POS(?, ?)", (position.file.as_str(), position.pos))
        .await
        .map_err(|e| classify_my(e, "reading the GTID position of the snapshot"))?;
    Ok(gtid.flatten().filter(|g| !g.is_empty()))
}

/// An open snapshot transaction and the work left.
pub struct SnapshotRun {
    tx: mysql_async::Conn,
    /// The plan, updated as chunks are read.
    pub plan: SnapshotState,
    /// This transaction's binlog position (rows carry it).
    pub position: BinlogPosition,
    /// Its GTID position.
    pub gtid: Option<String>,
    /// Definitions of the tables to read, as of this transaction.
    pub defs: BTreeMap<TableId, TableDef>,
    /// Row estimates from the catalog.
    pub estimates: BTreeMap<TableId, u64>,
    built: BTreeMap<TableId, BuiltSchema>,
    chunk_rows: u64,
}

impl std::fmt::Debug for SnapshotRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnapshotRun")
            .field("position", &self.position)
            .finish_non_exhaustive()
    }
}

impl SnapshotRun {
    /// Opens the consistent snapshot and reads the definitions of the
    /// tables still to copy. The first run of a plan fixes its position.
    pub async fn open(params: &ConnectionParams, mut plan: SnapshotState, chunk_rows: u64) -> Result<Self> {
        // A table without a primary key is read by `LIMIT ... OFFSET`, which
        // is stable inside one transaction only: resumed in a new one, rows
        // changed meanwhile shift the offset and rows are skipped or read
        // twice. Such a table is read again from its start, as PostgreSQL's
        // source does (its rows are emitted again as reads).
        for table in plan
            .tables
            .iter_mut()
            .filter(|t| !t.done && t.last_key.is_none() && t.rows_done > 0)
        {
            tracing::info!(
                table = %table.id(),
                rows_done = table.rows_done,
                "a table without a primary key cannot resume its copy by key: copying it again from its start"
            );
            table.rows_done = 0;
        }
        let mut conn = connect(params).await?;
        let version: Option<String> = conn
            .query_first("SELECT @@version")
            .await
            .map_err(|e| classify_my(e, "reading the server version"))?;
        let kind = ServerKind::from_version(version.as_deref().unwrap_or(""));
        conn.query_drop("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            .await
            .map_err(|e| classify_my(e, "setting the snapshot isolation level"))?;
        let (position, gtid) = match kind {
            ServerKind::MariaDb => {
                conn.query_drop("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
                    .await
                    .map_err(|e| classify_my(e, "starting the snapshot transaction"))?;
                let status: Vec<(String, String)> = conn
                    .query("SHOW STATUS LIKE 'binlog_snapshot_%'")
                    .await
                    .map_err(|e| classify_my(e, "reading the snapshot's binlog position"))?;
                let get = |name: &str| {
                    status
                        .iter()
                        .find(|(k, _)| k.eq_ignore_ascii_case(name))
                        .map(|(_, v)| v.clone())
                };
                let file = get("binlog_snapshot_file").filter(|f| !f.is_empty()).ok_or_else(|| {
                    Error::needs_operator("the server reports no binlog_snapshot_file: the binary log is off")
                        .with_hint("log_bin = mysql-bin in my.cnf, then restart (see `source-runner check`)")
                })?;
                let pos = get("binlog_snapshot_position")
                    .and_then(|p| p.parse().ok())
                    .ok_or_else(|| Error::retryable("the server reports no binlog_snapshot_position"))?;
                let position = BinlogPosition { file, pos }.checked()?;
                let gtid = mariadb_gtid_at(&mut conn, &position).await?;
                (position, gtid)
            }
            ServerKind::MySql => {
                // The read lock pins the binlog between the snapshot's start
                // and SHOW MASTER STATUS; it is held for milliseconds.
                conn.query_drop("FLUSH TABLES WITH READ LOCK")
                    .await
                    .map_err(|e| classify_my(e, "taking the global read lock (needs RELOAD)"))?;
                let started = conn
                    .query_drop("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
                    .await
                    .map_err(|e| classify_my(e, "starting the snapshot transaction"));
                let position = match started {
                    Ok(()) => current_position(&mut conn, kind).await,
                    Err(e) => Err(e),
                };
                conn.query_drop("UNLOCK TABLES")
                    .await
                    .map_err(|e| classify_my(e, "releasing the global read lock"))?;
                let (position, gtid) = position?;
                if let Some(g) = &gtid {
                    // Validated here so a resume by GTID can rely on it.
                    MySqlGtidSet::parse(g)
                        .ok_or_else(|| Error::retryable("the server's gtid_executed is not a GTID set"))?;
                }
                (position, gtid)
            }
        };
        if plan.position.is_none() {
            plan.position = Some(position.clone());
        }
        let mut defs = BTreeMap::new();
        let mut estimates = BTreeMap::new();
        for t in plan.tables.iter().filter(|t| !t.done) {
            let id = t.id();
            match table_def(&mut conn, &id).await? {
                Some(def) => {
                    defs.insert(id.clone(), def);
                }
                None => tracing::warn!(table = %id, "table to snapshot no longer exists; skipping it"),
            }
            let rows: Option<Option<u64>> = conn
                .exec_first(
                    "SELECT TABLE_ROWS FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?",
                    (id.schema.as_str(), id.table.as_str()),
                )
                .await
                .map_err(|e| classify_my(e, "reading row estimates").with_table(id.clone()))?;
            if let Some(Some(n)) = rows {
                estimates.insert(id, n);
            }
        }
        Ok(Self {
            tx: conn,
            plan,
            position,
            gtid,
            defs,
            estimates,
            built: BTreeMap::new(),
            chunk_rows,
        })
    }

    /// The next chunk, or `None` when every table is done (the transaction
    /// is then finished).
    pub async fn next_chunk(
        &mut self,
        config: &MySqlSourceConfig,
        filter: &TableFilter,
        ctx: &EventContext,
    ) -> Result<Option<Chunk>> {
        loop {
            let Some(index) = self.plan.tables.iter().position(|t| !t.done) else {
                // The transaction ended with the last chunk.
                return Ok(None);
            };
            let id = self.plan.tables[index].id();
            let Some(def) = self.defs.get(&id) else {
                self.plan.tables[index].done = true;
                continue;
            };
            if !self.built.contains_key(&id) {
                let built = BuiltSchema::build(config, filter, &id, def)?;
                self.built.insert(id.clone(), built);
            }
            let span = tracing::info_span!("snapshot_chunk", table = %id);
            let _guard = span.enter();
            return self.read_chunk(index, &id, ctx).await.map(Some);
        }
    }

    async fn read_chunk(&mut self, index: usize, id: &TableId, ctx: &EventContext) -> Result<Chunk> {
        if self.plan.tables[index].repair.is_some() {
            return self.read_repair_rows(index, id, ctx).await;
        }
        if let Some(verification) = self.plan.tables[index].verify {
            return self.read_verify_range(index, id, verification, ctx).await;
        }
        let built = self.built.get(id).ok_or_else(|| Error::retryable("snapshot schema missing"))?;
        let def = self
            .defs
            .get(id)
            .ok_or_else(|| Error::retryable("snapshot definition missing"))?;
        let plan = &self.plan.tables[index];
        let schema = built.schema.clone();
        let cols: Vec<String> = schema.columns.iter().map(|c| quote_ident(&c.name)).collect();
        let pk: Vec<usize> = def.primary_key.iter().filter_map(|k| schema.column_index(k)).collect();
        let keyed = !def.primary_key.is_empty() && pk.len() == def.primary_key.len();
        // Without a primary key: the configured key's columns, or every
        // column (a stable order inside the transaction for the offsets).
        let order: Vec<String> = if keyed {
            pk.iter().map(|&i| quote_ident(&schema.columns[i].name)).collect()
        } else if schema.key.is_empty() {
            schema.columns.iter().map(|c| quote_ident(&c.name)).collect()
        } else {
            schema
                .key_indexes()
                .iter()
                .map(|&i| quote_ident(&schema.columns[i].name))
                .collect()
        };
        let mut sql = format!("SELECT {} FROM {}", cols.join(", "), quote_table(id));
        if keyed {
            if let Some(last) = &plan.last_key {
                let mut values = Vec::with_capacity(pk.len());
                for (n, &i) in pk.iter().enumerate() {
                    let hex = last
                        .get(n)
                        .ok_or_else(|| Error::needs_operator("the checkpoint's snapshot key is short"))?;
                    values.push(key_literal(&schema.columns[i].data_type, hex).ok_or_else(|| {
                        Error::needs_operator("the checkpoint's snapshot key cannot be read back")
                            .with_table(id.clone())
                            .with_column(schema.columns[i].name.clone())
                    })?);
                }
                sql.push_str(&format!(" WHERE ({}) > ({})", order.join(", "), values.join(", ")));
            }
        }
        if !order.is_empty() {
            sql.push_str(&format!(" ORDER BY {}", order.join(", ")));
        }
        sql.push_str(&format!(" LIMIT {}", self.chunk_rows + 1));
        if !keyed {
            sql.push_str(&format!(" OFFSET {}", plan.rows_done));
        }
        let rows: Vec<mysql_async::Row> = self
            .tx
            .query(sql)
            .await
            .map_err(|e| classify_my(e, "reading a snapshot chunk").with_table(id.clone()))?;
        let more = rows.len() as u64 > self.chunk_rows;
        let take = rows.len().min(self.chunk_rows as usize);
        let last_table = self.plan.tables.iter().enumerate().all(|(i, t)| i == index || t.done);
        let now = super::stream::now_ms();
        let mut messages = Vec::with_capacity(take);
        let mut last_key = None;
        for (n, row) in rows.into_iter().take(take).enumerate() {
            let raw = row.unwrap();
            if n + 1 == take && keyed {
                last_key = Some(key_hex(&raw, &pk));
            }
            let mut values = Vec::with_capacity(raw.len());
            for ((v, col), codec) in raw.into_iter().zip(&schema.columns).zip(&built.codecs) {
                values.push(codec.from_text(v, id, &col.name)?);
            }
            let marker = if self.plan.initial && last_table && !more && n + 1 == take {
                SnapshotMarker::Last
            } else {
                SnapshotMarker::True
            };
            messages.push(SourceMessage::Change(read_event(schema.clone(), values, &self.position, marker, ctx, now)));
        }
        let plan = &mut self.plan.tables[index];
        plan.rows_done += take as u64;
        if last_key.is_some() {
            plan.last_key = last_key;
        }
        plan.done = !more;
        let table_done = plan.done;
        tracing::debug!(rows = take, done = table_done, "snapshot chunk read");
        if self.plan.tables.iter().all(|t| t.done) {
            // End the transaction with the last chunk: it holds metadata
            // locks on every table it read, and DDL on them waits until then.
            self.tx
                .query_drop("COMMIT")
                .await
                .map_err(|e| classify_my(e, "ending the snapshot transaction"))?;
        }
        Ok(Chunk { table: id.clone(), messages, table_done })
    }
}

impl SnapshotRun {
    /// The next range of a table read to verify it: up to
    /// `VERIFY_RANGE_ROWS` rows after the last range's, in the key's binary
    /// order (text by its bytes, as every destination orders it), as one
    /// verify message of their digests.
    async fn read_verify_range(
        &mut self,
        index: usize,
        id: &TableId,
        verification: u64,
        ctx: &EventContext,
    ) -> Result<Chunk> {
        use tributary_schemas::canonical::{digest_row, parse_key_text};
        use tributary_schemas::records::VerifyRange;

        let built = self.built.get(id).ok_or_else(|| Error::retryable("snapshot schema missing"))?;
        let def = self
            .defs
            .get(id)
            .ok_or_else(|| Error::retryable("snapshot definition missing"))?;
        let plan = &self.plan.tables[index];
        let schema = built.schema.clone();
        if def.primary_key.is_empty() {
            return self.read_keyless_verify_pass(index, id, verification, ctx).await;
        }
        let pk: Vec<usize> = def.primary_key.iter().filter_map(|k| schema.column_index(k)).collect();
        if pk.len() != def.primary_key.len() {
            return Err(Error::permanent("the table's primary key is not among its columns").with_table(id.clone()));
        }
        let binary = |i: usize, expr: String| match schema.columns[i].data_type {
            DataType::Text | DataType::Enum { .. } => format!("CAST({expr} AS BINARY)"),
            _ => expr,
        };
        let order: Vec<String> = pk.iter().map(|&i| binary(i, quote_ident(&schema.columns[i].name))).collect();
        let cols: Vec<String> = schema.columns.iter().map(|c| quote_ident(&c.name)).collect();
        let mut sql = format!("SELECT {} FROM {}", cols.join(", "), quote_table(id));
        if let Some(last) = &plan.last_key {
            let mut values = Vec::with_capacity(pk.len());
            for (n, &i) in pk.iter().enumerate() {
                let hex = last
                    .get(n)
                    .ok_or_else(|| Error::needs_operator("the checkpoint's verification key is short"))?;
                let literal = key_literal(&schema.columns[i].data_type, hex).ok_or_else(|| {
                    Error::needs_operator("the checkpoint's verification key cannot be read back")
                        .with_table(id.clone())
                        .with_column(schema.columns[i].name.clone())
                })?;
                values.push(binary(i, literal));
            }
            sql.push_str(&format!(" WHERE ({}) > ({})", order.join(", "), values.join(", ")));
        }
        let limit = VERIFY_RANGE_ROWS.min(self.chunk_rows as usize).max(1);
        sql.push_str(&format!(" ORDER BY {} LIMIT {}", order.join(", "), limit + 1));
        if plan.verify_rate > 0 {
            // A bounded share of the source: one range's rows per their
            // share of a second.
            tokio::time::sleep(std::time::Duration::from_secs_f64(limit as f64 / plan.verify_rate as f64)).await;
        }
        let rows: Vec<mysql_async::Row> = self
            .tx
            .query(sql)
            .await
            .map_err(|e| classify_my(e, "reading a table to verify it").with_table(id.clone()))?;
        let more = rows.len() > limit;
        let mut entries = Vec::with_capacity(limit);
        let mut last_key = None;
        for (n, row) in rows.into_iter().take(limit).enumerate() {
            let raw = row.unwrap();
            if n + 1 == limit {
                last_key = Some(key_hex(&raw, &pk));
            }
            let mut values = Vec::with_capacity(raw.len());
            for ((v, col), codec) in raw.into_iter().zip(&schema.columns).zip(&built.codecs) {
                values.push(codec.from_text(v, id, &col.name)?);
            }
            entries.push(VerifyRange::entry(&digest_row(&schema, &values)));
        }
        let until = if more {
            entries.last().and_then(|(key, _, _)| parse_key_text(key))
        } else {
            None
        };
        let read = Position { commit: self.position.ordered() + 1, index: 0 };
        let bounds = (plan.verify_until.clone(), until.clone());
        let range = VerifyRange::read(verification, read, &ctx.connector, &schema, bounds, !more, entries);
        let plan = &mut self.plan.tables[index];
        plan.verify_until = until;
        if last_key.is_some() {
            plan.last_key = last_key;
        }
        plan.done = !more;
        if self.plan.tables.iter().all(|t| t.done) {
            self.tx
                .query_drop("COMMIT")
                .await
                .map_err(|e| classify_my(e, "ending the snapshot transaction"))?;
        }
        Ok(Chunk {
            table: id.clone(),
            messages: vec![SourceMessage::Verify(id.clone(), range)],
            table_done: !more,
        })
    }
}

impl SnapshotRun {
    /// The next pass over a table without a key read to verify it (see
    /// [`crate::source::keyless`]): the whole table read, its rows whose
    /// content keys are in the pass's slice sent as ranges of digests, in
    /// one chunk.
    async fn read_keyless_verify_pass(
        &mut self,
        index: usize,
        id: &TableId,
        verification: u64,
        ctx: &EventContext,
    ) -> Result<Chunk> {
        use crate::source::keyless::{passes, Pass};
        use tributary_schemas::records::VerifyRange;

        let what = "reading a table without a key to verify it";
        let built = self.built.get(id).ok_or_else(|| Error::retryable("snapshot schema missing"))?;
        let schema = built.schema.clone();
        if self.plan.tables[index].verify_passes == 0 {
            let count: Option<u64> = self
                .tx
                .query_first(format!("SELECT COUNT(*) FROM {}", quote_table(id)))
                .await
                .map_err(|e| classify_my(e, what).with_table(id.clone()))?;
            self.plan.tables[index].verify_passes = passes(count.unwrap_or(0));
        }
        let plan = &self.plan.tables[index];
        let (pass, of, rate) = (plan.rows_done, plan.verify_passes, plan.verify_rate);
        let cols: Vec<String> = schema.columns.iter().map(|c| quote_ident(&c.name)).collect();
        let sql = format!("SELECT {} FROM {}", cols.join(", "), quote_table(id));
        let rows: Vec<mysql_async::Row> = self
            .tx
            .query(sql)
            .await
            .map_err(|e| classify_my(e, what).with_table(id.clone()))?;
        if rate > 0 {
            // A bounded share of the source: the pass's rows per their
            // share of a second.
            tokio::time::sleep(std::time::Duration::from_secs_f64(rows.len() as f64 / rate as f64)).await;
        }
        let mut taken = Pass::new(&schema, pass, of);
        for row in rows {
            let raw = row.unwrap();
            let mut values = Vec::with_capacity(raw.len());
            for ((v, col), codec) in raw.into_iter().zip(&schema.columns).zip(&built.codecs) {
                values.push(codec.from_text(v, id, &col.name)?);
            }
            taken.push(&schema, &values)?;
        }
        let read = Position { commit: self.position.ordered() + 1, index: 0 };
        let messages = taken
            .ranges(VERIFY_RANGE_ROWS, crate::source::keyless::RANGE_BYTES)
            .into_iter()
            .map(|(bounds, rows, last)| {
                let range = VerifyRange::read(verification, read, &ctx.connector, &schema, bounds, last, rows);
                SourceMessage::Verify(id.clone(), range)
            })
            .collect();
        let done = pass + 1 >= of;
        let plan = &mut self.plan.tables[index];
        plan.rows_done = pass + 1;
        plan.done = done;
        if self.plan.tables.iter().all(|t| t.done) {
            self.tx
                .query_drop("COMMIT")
                .await
                .map_err(|e| classify_my(e, "ending the snapshot transaction"))?;
        }
        Ok(Chunk { table: id.clone(), messages, table_done: done })
    }

    /// The current rows of the next keys a repair asked for (at most
    /// `REPAIR_KEYS_PER_QUERY`), sent as a copy sends rows; a key the table
    /// no longer has sends nothing (its delete is in the binlog). A key
    /// that does not read as the table's key is skipped, said loudly: the
    /// next verification reports it again.
    async fn read_repair_rows(&mut self, index: usize, id: &TableId, ctx: &EventContext) -> Result<Chunk> {
        use tributary_schemas::canonical::parse_key_text;

        let built = self.built.get(id).ok_or_else(|| Error::retryable("snapshot schema missing"))?;
        let def = self
            .defs
            .get(id)
            .ok_or_else(|| Error::retryable("snapshot definition missing"))?;
        let schema = built.schema.clone();
        let pk: Vec<usize> = def.primary_key.iter().filter_map(|k| schema.column_index(k)).collect();
        let plan = &mut self.plan.tables[index];
        // The rows go out just after the snapshot's position as a copy's
        // do, but later than the rows of any copy or repair read at the same
        // binlog position (none written in between: the destination row
        // that differs may carry exactly that position): the index is the
        // verification that follows, a clock.
        let index_at = plan.verify.unwrap_or(1).max(1);
        let keys = plan.repair.take().unwrap_or_default();
        let (now_keys, later) = keys.split_at(keys.len().min(REPAIR_KEYS_PER_QUERY));
        plan.repair = (!later.is_empty()).then(|| later.to_vec());
        if pk.is_empty() || pk.len() != def.primary_key.len() {
            tracing::warn!(table = %id, "a table without a primary key is not repaired by key");
            return Ok(Chunk {
                table: id.clone(),
                messages: Vec::new(),
                table_done: false,
            });
        }
        let mut tuples = Vec::with_capacity(now_keys.len());
        for key in now_keys {
            let literals: Option<Vec<String>> =
                parse_key_text(key).filter(|texts| texts.len() == pk.len()).and_then(|texts| {
                    pk.iter()
                        .zip(&texts)
                        .map(|(&i, text)| repair_literal(&schema.columns[i].data_type, text.as_deref()))
                        .collect()
                });
            match literals {
                Some(l) => tuples.push(format!("({})", l.join(", "))),
                None => tracing::warn!(table = %id, key = %key, "a key to repair does not read as a key of the \
                    table: not repaired"),
            }
        }
        let mut messages = Vec::new();
        if !tuples.is_empty() {
            let cols: Vec<String> = schema.columns.iter().map(|c| quote_ident(&c.name)).collect();
            let key_list: Vec<String> = pk.iter().map(|&i| quote_ident(&schema.columns[i].name)).collect();
            let sql = format!(
                "SELECT {} FROM {} WHERE ({}) IN ({})",
                cols.join(", "),
                quote_table(id),
                key_list.join(", "),
                tuples.join(", ")
            );
            let rows: Vec<mysql_async::Row> = self
                .tx
                .query(sql)
                .await
                .map_err(|e| classify_my(e, "reading the rows a repair asked for").with_table(id.clone()))?;
            let now = super::stream::now_ms();
            for row in rows {
                let raw = row.unwrap();
                let mut values = Vec::with_capacity(raw.len());
                for ((v, col), codec) in raw.into_iter().zip(&schema.columns).zip(&built.codecs) {
                    values.push(codec.from_text(v, id, &col.name)?);
                }
                let mut event = read_event(schema.clone(), values, &self.position, SnapshotMarker::True, ctx, now);
                event.source.position.index = index_at;
                messages.push(SourceMessage::Change(event));
            }
        }
        tracing::info!(table = %id, keys = now_keys.len(), rows = messages.len(), "rows sent again for a repair");
        Ok(Chunk { table: id.clone(), messages, table_done: false })
    }
}

/// A MySQL literal of a key column's canonical text (one that
/// `orders_everywhere`), or `None` for one that does not read as its type:
/// the value's text as the text protocol gives it, made a literal by
/// [`key_literal`] as a snapshot's resume key is.
fn repair_literal(data_type: &DataType, text: Option<&str>) -> Option<String> {
    let render = |v: &Value| {
        let mut out = String::new();
        crate::sink::text::render_text(&mut out, v).ok().map(|()| out.into_bytes())
    };
    let bytes = match tributary_schemas::canonical::key_value(data_type, text)? {
        Value::Null => return Some("NULL".to_string()),
        Value::Boolean(b) => if b { b"1" } else { b"0" }.to_vec(),
        Value::Bytes(b) => b,
        // The session's zone is UTC: the clock's text, without its offset.
        Value::TimestampTz(micros) => render(&Value::Timestamp(micros))?,
        other => render(&other)?,
    };
    key_literal(data_type, &hex(&bytes))
}

/// Rows of a verify range (as the PostgreSQL source's).
const VERIFY_RANGE_ROWS: usize = 2_000;

/// Keys a repair reads in one query.
const REPAIR_KEYS_PER_QUERY: usize = 1_000;

fn read_event(
    schema: std::sync::Arc<tributary_schemas::TableSchema>,
    row: Vec<Value>,
    position: &BinlogPosition,
    marker: SnapshotMarker,
    ctx: &EventContext,
    now: i64,
) -> ChangeEvent {
    let db = schema.id.schema.as_str().into();
    ChangeEvent {
        schema,
        op: Op::Read,
        before: None,
        after: Some(row),
        source: SourceInfo {
            connector: ctx.connector.clone(),
            name: ctx.name.clone(),
            db,
            ts_ms: now,
            snapshot: marker,
            tx_id: None,
            // Just after the snapshot's position: after the transaction
            // that ends exactly there (which the rows reflect, and whose
            // changes carry that position with indexes from 1), before any
            // transaction after it (which ends further on).
            position: Position { commit: position.ordered() + 1, index: 0 },
            native_position: position.to_string().into(),
        },
        ts_ms: now,
        transaction: None,
    }
}

/// The resume key of a row: each key column's text-protocol bytes as hex.
fn key_hex(raw: &[mysql_async::Value], pk: &[usize]) -> Vec<String> {
    pk.iter()
        .map(|&i| match raw.get(i) {
            Some(mysql_async::Value::Bytes(b)) => hex(b),
            Some(other) => hex(other.as_sql(true).as_bytes()),
            None => String::new(),
        })
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

/// A key value for the chunk's `WHERE`, typed so that the comparison is the
/// same as the `ORDER BY`: numbers as numbers (no float rounding of big
/// integers), binary strings as bytes, everything else as a string literal
/// that takes the column's collation.
fn key_literal(data_type: &DataType, hex_text: &str) -> Option<String> {
    let bytes = unhex(hex_text)?;
    match data_type {
        DataType::Int16 | DataType::Int32 | DataType::Int64 | DataType::Decimal { .. } | DataType::Boolean => {
            let text = String::from_utf8(bytes).ok()?;
            let numeric = !text.is_empty() && text.chars().all(|c| c.is_ascii_digit() || c == '-' || c == '.');
            numeric.then_some(text)
        }
        DataType::Bytes => Some(if bytes.is_empty() {
            "''".to_string()
        } else {
            format!("X'{hex_text}'")
        }),
        _ => {
            let text = String::from_utf8(bytes).ok()?;
            // NUL as MySQL's escape, after the quoting doubled the
            // backslashes (before, its escape came out as a backslash and
            // a zero).
            Some(quote_literal(&text).replace('\0', "\\0"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_literals_keep_numbers_exact_and_strings_quoted() {
        assert_eq!(
            key_literal(&DataType::Int64, &hex(b"18446744073709551615")).as_deref(),
            Some("18446744073709551615")
        );
        assert_eq!(key_literal(&DataType::Int64, &hex(b"1 OR 1=1")), None);
        assert_eq!(key_literal(&DataType::Text, &hex(b"o'k\\")).as_deref(), Some("'o''k\\\\'"));
        assert_eq!(key_literal(&DataType::Text, &hex(b"a\0b")).as_deref(), Some("'a\\0b'"));
        assert_eq!(key_literal(&DataType::Bytes, &hex(&[0, 255])).as_deref(), Some("X'00ff'"));
        assert_eq!(unhex("0g"), None);
        assert_eq!(unhex(&hex(&[1, 2, 254])), Some(vec![1, 2, 254]));
    }

    #[test]
    fn repair_literals_read_canonical_key_texts() {
        assert_eq!(repair_literal(&DataType::Int64, Some("-42")).as_deref(), Some("-42"));
        assert_eq!(repair_literal(&DataType::Int64, Some("1 OR 1=1")), None);
        assert_eq!(repair_literal(&DataType::Text, Some("o'k\\")).as_deref(), Some("'o''k\\\\'"));
        assert_eq!(repair_literal(&DataType::Bytes, Some("00ff")).as_deref(), Some("X'00ff'"));
        assert_eq!(repair_literal(&DataType::Boolean, Some("t")).as_deref(), Some("1"));
        assert_eq!(
            repair_literal(&DataType::Decimal { precision: 8, scale: 2 }, Some("1.50")).as_deref(),
            Some("1.50")
        );
        assert_eq!(repair_literal(&DataType::Decimal { precision: 8, scale: 2 }, Some("1;--")), None);
        assert_eq!(repair_literal(&DataType::Int32, None).as_deref(), Some("NULL"));
        // As a resume key is: a NUL kept as MySQL's escape.
        assert_eq!(repair_literal(&DataType::Text, Some("a\0b")).as_deref(), Some("'a\\0b'"));
    }

    #[test]
    fn plan_round_trips() {
        let mut p = TablePlan::new(&TableId::new("db", "t"));
        p.last_key = Some(vec![hex(b"42")]);
        let json = serde_json::to_string(&p).expect("json");
        assert_eq!(serde_json::from_str::<TablePlan>(&json).expect("parse"), p);
        let r = TablePlan::repair(&TableId::new("db", "t"), vec!["[\"5\"]".into()], 7, 0);
        let json = serde_json::to_string(&r).expect("json");
        assert_eq!(serde_json::from_str::<TablePlan>(&json).expect("parse"), r);
        assert_eq!((r.verify, r.repair.as_deref().map(<[String]>::len)), (Some(7), Some(1)));
        assert_eq!(p.id(), TableId::new("db", "t"));
    }
}

//! Streaming: pgoutput (protocol version 1, text tuples) decoded into
//! change events, grouped into batches that end on transaction boundaries.
//!
//! * `Begin`/`Commit` delimit transactions: every event of a transaction gets
//!   the position `(commit LSN, 1-based ordinal)`, the xid as transaction id,
//!   and the commit time. A transaction is never split across batches; a
//!   batch's checkpoint is the end LSN of its last commit.
//! * `Relation` messages (re)build the table's schema; when it differs from
//!   the one last announced, a `SchemaChanged` precedes the first row that
//!   uses it.
//! * Unchanged TOAST values (`u`) are filled from the old tuple when the
//!   table's replica identity is FULL, otherwise read by key from the table.
//! * Logical messages with the prefix `tributary` come from the DDL event
//!   trigger: `DROP TABLE` of a captured table becomes `TableDropped`;
//!   `CREATE TABLE` of a table the filter selects is reported so the source
//!   can add it to the publication and snapshot it. `ALTER TABLE` carries
//!   the table's oid and columns by attnum: a column whose attnum kept but
//!   name changed was renamed (its earlier names become the column's
//!   aliases), and a table known under another name was renamed or moved
//!   (the old name is dropped, the new one captured like a new table). A
//!   Relation message under a new name tells the latter without the trigger.
//! * Keepalives move the checkpoint between transactions (heartbeats), so an
//!   idle slot still advances.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes};
use pgwire_replication::{ReplicationClient, ReplicationEvent};
use serde::{Deserialize, Serialize};
use tributary_schemas::{
    ChangeEvent, DataType, Op, Position, Row, SnapshotMarker, SourceInfo, TableId, TableSchema, TransactionInfo, Value,
};

use super::client::{classify_wire, BuiltSchema, Catalog, PartitionRoot};
use super::config::{NewTables, PostgresSourceConfig, TableFilter};
use super::types::{decode_text, value_size, ColumnRef};
use super::{format_lsn, EventContext};
use crate::error::{Error, Result};
use crate::pgwire::{quote_ident, quote_literal, quote_table};
use crate::SourceMessage;

/// Prefix of the logical messages written by the DDL event trigger.
pub const DDL_MESSAGE_PREFIX: &str = "tributary";

/// Prefix of the non-transactional message written just after a later
/// snapshot's temporary slot is created: past that slot's consistent point,
/// so the stream catching up to it recognises it has arrived even when no
/// transaction follows.
pub const FENCE_MESSAGE_PREFIX: &str = "tributary-fence";

/// Microseconds between the Unix epoch and PostgreSQL's (2000-01-01).
const PG_EPOCH_OFFSET_MICROS: i64 = 946_684_800_000_000;

/// How long a streamed batch waits for the next transaction once it has
/// changes (`batch_linger_ms` bounds the whole wait). Waiting the whole
/// linger made every change wait for it, also when nothing else was coming.
/// Under load batches still grow: the transactions that arrive while the
/// previous batch is produced and committed are waiting already, and the
/// next batch takes them at once.
pub const STREAM_IDLE: Duration = Duration::from_millis(1);

/// One value of a pgoutput tuple.
#[derive(Debug, Clone, PartialEq)]
pub enum TupleValue {
    /// NULL.
    Null,
    /// An unchanged TOAST value the server did not send.
    Unchanged,
    /// Text format.
    Text(Bytes),
    /// Binary format (never requested).
    Binary(Bytes),
}

/// A column of a `Relation` message.
#[derive(Debug, Clone, PartialEq)]
pub struct RelationColumn {
    /// Part of the replica identity key.
    pub key: bool,
    /// Name.
    pub name: String,
    /// Type oid.
    pub type_oid: u32,
    /// Type modifier.
    pub typmod: i32,
}

/// A decoded pgoutput message (other than Begin, Commit and Message, which
/// the replication client reports itself).
#[derive(Debug, Clone, PartialEq)]
pub enum PgOutput {
    /// A table's description.
    Relation {
        /// Table oid.
        relid: u32,
        /// Schema.
        namespace: String,
        /// Table.
        name: String,
        /// `d` default, `n` nothing, `f` full, `i` index.
        replica_identity: u8,
        /// Columns.
        columns: Vec<RelationColumn>,
    },
    /// A type's description.
    Type {
        /// Oid.
        oid: u32,
        /// Schema.
        namespace: String,
        /// Name.
        name: String,
    },
    /// Origin of a replicated transaction.
    Origin {
        /// Origin LSN.
        lsn: u64,
        /// Origin name.
        name: String,
    },
    /// Insert.
    Insert {
        /// Table oid.
        relid: u32,
        /// New row.
        new: Vec<TupleValue>,
    },
    /// Update.
    Update {
        /// Table oid.
        relid: u32,
        /// Old key (`K`) or old row (`O`), when sent.
        old: Option<(u8, Vec<TupleValue>)>,
        /// New row.
        new: Vec<TupleValue>,
    },
    /// Delete.
    Delete {
        /// Table oid.
        relid: u32,
        /// Old key (`K`) or old row (`O`).
        old: (u8, Vec<TupleValue>),
    },
    /// Truncate of one or more tables.
    Truncate {
        /// Table oids.
        relids: Vec<u32>,
    },
    /// A message type this decoder does not need.
    Other(u8),
}

fn protocol(what: &str) -> Error {
    Error::permanent(format!("malformed pgoutput message: {what}")).with_class("tributary.postgres.protocol")
}

struct Reader(Bytes);

impl Reader {
    /// A message shorter than its fields is a protocol error, never a panic
    /// in `Buf::get_*`.
    fn need(&self, n: usize) -> Result<()> {
        if self.0.remaining() < n {
            return Err(protocol("truncated"));
        }
        Ok(())
    }
    fn u8(&mut self) -> Result<u8> {
        self.need(1)?;
        Ok(self.0.get_u8())
    }
    fn i16(&mut self) -> Result<i16> {
        self.need(2)?;
        Ok(self.0.get_i16())
    }
    fn u32(&mut self) -> Result<u32> {
        self.need(4)?;
        Ok(self.0.get_u32())
    }
    fn i32(&mut self) -> Result<i32> {
        self.need(4)?;
        Ok(self.0.get_i32())
    }
    fn u64(&mut self) -> Result<u64> {
        self.need(8)?;
        Ok(self.0.get_u64())
    }
    fn cstr(&mut self) -> Result<String> {
        let end = self
            .0
            .iter()
            .position(|b| *b == 0)
            .ok_or_else(|| protocol("unterminated string"))?;
        let s = String::from_utf8(self.0.split_to(end).to_vec()).map_err(|_| protocol("string is not UTF-8"))?;
        self.0.advance(1);
        Ok(s)
    }
    /// A capacity for `n` items of at least `min_size` bytes each: never
    /// more than the rest of the message can hold, so a forged count
    /// cannot make the decoder allocate without bound.
    fn capacity(&self, n: i64, min_size: usize) -> usize {
        usize::try_from(n.max(0)).unwrap_or(0).min(self.0.remaining() / min_size.max(1))
    }
    fn bytes(&mut self, n: usize) -> Result<Bytes> {
        self.need(n)?;
        Ok(self.0.split_to(n))
    }
    fn tuple(&mut self) -> Result<Vec<TupleValue>> {
        let n = self.i16()?;
        // Each value takes at least its kind byte.
        let mut out = Vec::with_capacity(self.capacity(n.into(), 1));
        for _ in 0..n {
            out.push(match self.u8()? {
                b'n' => TupleValue::Null,
                b'u' => TupleValue::Unchanged,
                b't' => {
                    let len = self.i32()?;
                    TupleValue::Text(self.bytes(len.max(0) as usize)?)
                }
                b'b' => {
                    let len = self.i32()?;
                    TupleValue::Binary(self.bytes(len.max(0) as usize)?)
                }
                other => return Err(protocol(&format!("unknown tuple value kind {other}"))),
            });
        }
        Ok(out)
    }
}

/// Decodes one pgoutput message.
pub fn parse_pgoutput(data: Bytes) -> Result<PgOutput> {
    let mut r = Reader(data);
    let tag = r.u8()?;
    Ok(match tag {
        b'R' => {
            let relid = r.u32()?;
            let namespace = r.cstr()?;
            let name = r.cstr()?;
            let replica_identity = r.u8()?;
            let n = r.i16()?;
            // flags, an empty name's terminator, type oid, typmod.
            let mut columns = Vec::with_capacity(r.capacity(n.into(), 10));
            for _ in 0..n {
                let flags = r.u8()?;
                let name = r.cstr()?;
                let type_oid = r.u32()?;
                let typmod = r.i32()?;
                columns.push(RelationColumn { key: flags & 1 == 1, name, type_oid, typmod });
            }
            PgOutput::Relation {
                relid,
                // pgoutput sends an empty namespace for pg_catalog.
                namespace: if namespace.is_empty() {
                    "pg_catalog".into()
                } else {
                    namespace
                },
                name,
                replica_identity,
                columns,
            }
        }
        b'Y' => PgOutput::Type {
            oid: r.u32()?,
            namespace: r.cstr()?,
            name: r.cstr()?,
        },
        b'O' => PgOutput::Origin { lsn: r.u64()?, name: r.cstr()? },
        b'I' => {
            let relid = r.u32()?;
            if r.u8()? != b'N' {
                return Err(protocol("insert without a new tuple"));
            }
            PgOutput::Insert { relid, new: r.tuple()? }
        }
        b'U' => {
            let relid = r.u32()?;
            let mut kind = r.u8()?;
            let mut old = None;
            if kind == b'K' || kind == b'O' {
                old = Some((kind, r.tuple()?));
                kind = r.u8()?;
            }
            if kind != b'N' {
                return Err(protocol("update without a new tuple"));
            }
            PgOutput::Update { relid, old, new: r.tuple()? }
        }
        b'D' => {
            let relid = r.u32()?;
            let kind = r.u8()?;
            if kind != b'K' && kind != b'O' {
                return Err(protocol("delete without an old tuple"));
            }
            PgOutput::Delete { relid, old: (kind, r.tuple()?) }
        }
        b'T' => {
            let n = r.u32()?;
            let _options = r.u8()?;
            let mut relids = Vec::with_capacity(r.capacity(n.into(), 4));
            for _ in 0..n {
                relids.push(r.u32()?);
            }
            PgOutput::Truncate { relids }
        }
        other => PgOutput::Other(other),
    })
}

/// What the streamer knows about a relation.
struct Relation {
    id: TableId,
    replica_identity: u8,
    /// `None` when the table is not captured.
    built: Option<BuiltSchema>,
    /// Whether `built` was announced with `SchemaChanged` (or equals the
    /// schema announced last).
    announced: bool,
    /// The partitioned table's oid when this is a partition published
    /// under its own name (its changes are the root's).
    root: Option<u32>,
    /// How `built` was made: the Relation message's columns and the
    /// partition root they map onto, to build it again when a type changed
    /// without a Relation message (an enum's new label).
    columns: Vec<(String, u32, i32)>,
    partition_root: Option<PartitionRoot>,
}

/// The transaction being decoded.
struct Txn {
    xid: u32,
    commit_lsn: u64,
    commit_ts_ms: i64,
    messages: Vec<SourceMessage>,
    ordinal: u64,
    /// Changes of this transaction already in Kafka (an earlier part of it,
    /// before a restart): decoded again but not emitted.
    skip: u64,
    /// Changes of this transaction handed out so far (in earlier batches,
    /// or before a restart): what the checkpoint's [`PartialTxn`] says for
    /// as long as the transaction is open.
    emitted: u64,
    per_table: HashMap<TableId, i64>,
    bytes: usize,
    created: Vec<TableId>,
}

/// The part of a transaction already emitted, when a batch ends inside it.
///
/// A transaction larger than a batch is emitted in parts, so that memory
/// stays bounded by the batch limits whatever the transaction's size. Kafka
/// commits each part with this marker: after a crash, streaming restarts
/// before the transaction (the slot replays it whole) and the first
/// `changes` changes of the transaction committing at `commit_lsn` are
/// decoded but not emitted again. pgoutput replays a transaction's changes in
/// the same order every time, so the count identifies them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartialTxn {
    /// The transaction's commit LSN (`final_lsn` of its Begin message).
    pub commit_lsn: u64,
    /// Changes of it emitted so far.
    pub changes: u64,
}

/// What one call of [`Streamer::next_batch`] produced.
#[derive(Debug, Default)]
pub struct StreamBatch {
    /// Messages of whole transactions, or the next part of a transaction
    /// larger than a batch (see `partial`).
    pub messages: Vec<SourceMessage>,
    /// Where to resume after these messages: the end of the last whole
    /// transaction.
    pub lsn: u64,
    /// Set while a transaction is partly emitted: the batch ended inside
    /// it (whatever ended the batch: a limit, the linger or the heartbeat),
    /// or its first part went out before a restart and the stream has not
    /// reached it again yet.
    pub partial: Option<PartialTxn>,
    /// Tables created in the batch's last transaction that should be
    /// captured (the batch ends after that transaction).
    pub created: Vec<TableId>,
    /// The stream reached the `stop_at` LSN given to `next_batch`: every
    /// transaction committing before it was returned, none after it.
    pub reached_stop: bool,
}

/// What the streamer needs from the source.
pub struct StreamContext<'a> {
    /// Catalog connection (schemas, TOAST look-ups).
    pub catalog: &'a mut Catalog,
    /// Configuration.
    pub config: &'a PostgresSourceConfig,
    /// Table filter.
    pub filter: &'a TableFilter,
    /// Event context.
    pub ctx: &'a EventContext,
    /// Schemas announced so far, per table.
    pub announced: &'a mut HashMap<TableId, Arc<TableSchema>>,
    /// Notified when the runner has work between batches: the batch ends
    /// as at the heartbeat ([`crate::source::Source::set_wake`]).
    pub wake: Option<&'a tokio::sync::Notify>,
}

/// Decodes a replication stream into batches.
pub struct Streamer {
    client: ReplicationClient,
    relations: HashMap<u32, Relation>,
    txn: Option<Txn>,
    safe_lsn: u64,
    /// The part of the first transaction that is already in Kafka.
    resume_txn: Option<PartialTxn>,
}

impl std::fmt::Debug for Streamer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Streamer")
            .field("safe_lsn", &self.safe_lsn)
            .finish_non_exhaustive()
    }
}

impl Streamer {
    /// Wraps a started replication client reading from `lsn`; `partial` is
    /// the part of the first transaction already emitted, if any.
    pub fn new(client: ReplicationClient, lsn: u64, partial: Option<PartialTxn>) -> Self {
        Self {
            client,
            relations: HashMap::new(),
            txn: None,
            safe_lsn: lsn,
            resume_txn: partial,
        }
    }

    /// Reports `lsn` as flushed (durable) to the server.
    pub fn acknowledge(&self, lsn: u64) {
        self.client.update_applied_lsn(pgwire_replication::Lsn::from_u64(lsn));
    }

    /// Collects transactions until a batch limit, the linger after the
    /// first transaction, a pause of [`STREAM_IDLE`] between transactions,
    /// or the heartbeat interval. A transaction that
    /// alone exceeds a limit is returned in parts ([`PartialTxn`]).
    ///
    /// With `stop_at`, the batch also ends where the stream reaches that LSN
    /// (a transaction committing at or after it, or a message or keepalive
    /// past it, outside a transaction), and says so in `reached_stop`. The
    /// stream must then be dropped: it has read past the stop.
    pub async fn next_batch(&mut self, sc: &mut StreamContext<'_>, stop_at: Option<u64>) -> Result<StreamBatch> {
        let heartbeat_at = Instant::now() + sc.config.heartbeat_interval();
        let mut out = StreamBatch { lsn: self.safe_lsn, ..StreamBatch::default() };
        let mut linger_at: Option<Instant> = None;
        // Set between transactions once the batch has changes: the batch
        // ends when the stream gives nothing more for STREAM_IDLE.
        let mut idle_at: Option<Instant> = None;
        let mut bytes = 0usize;
        loop {
            let deadline = [linger_at, idle_at].into_iter().flatten().fold(heartbeat_at, Instant::min);
            let woken = async {
                match sc.wake {
                    Some(w) => w.notified().await,
                    None => std::future::pending().await,
                }
            };
            // `recv` is cancel-safe: a message not taken stays in the stream.
            let event = tokio::select! {
                r = tokio::time::timeout_at(deadline.into(), self.client.recv()) => match r {
                    Err(_) => break,
                    Ok(r) => r.map_err(|e| classify_wire(e, "reading the replication stream"))?,
                },
                () = woken => break,
            };
            let Some(event) = event else {
                return Err(Error::retryable("the replication stream ended"));
            };
            match event {
                ReplicationEvent::Begin { final_lsn, xid, commit_time_micros } => {
                    idle_at = None;
                    if stop_at.is_some_and(|stop| final_lsn.as_u64() >= stop) {
                        out.reached_stop = true;
                        break;
                    }
                    // Only the first transaction after a restart can have
                    // been emitted in part (the checkpoint's LSN is just
                    // before it).
                    let skip = match self.resume_txn.take() {
                        Some(p) if p.commit_lsn == final_lsn.as_u64() => p.changes,
                        Some(p) => {
                            tracing::warn!(
                                expected = %format_lsn(p.commit_lsn),
                                found = %format_lsn(final_lsn.as_u64()),
                                "the transaction emitted in part before the restart is not the first one replayed"
                            );
                            0
                        }
                        None => 0,
                    };
                    self.txn = Some(Txn {
                        xid,
                        commit_lsn: final_lsn.as_u64(),
                        commit_ts_ms: (commit_time_micros + PG_EPOCH_OFFSET_MICROS) / 1000,
                        messages: Vec::new(),
                        ordinal: 0,
                        skip,
                        emitted: skip,
                        per_table: HashMap::new(),
                        bytes: 0,
                        created: Vec::new(),
                    });
                }
                ReplicationEvent::XLogData { data, .. } => {
                    let msg = parse_pgoutput(data)?;
                    self.handle(msg, sc).await?;
                    // A transaction too large for one batch goes out in
                    // parts instead of being held in memory whole.
                    if let Some(txn) = self.txn.as_mut() {
                        if out.messages.len() + txn.messages.len() >= sc.config.max_batch_events
                            || bytes + txn.bytes >= sc.config.max_batch_bytes
                        {
                            out.messages.append(&mut txn.messages);
                            txn.bytes = 0;
                            txn.emitted = txn.emitted.max(txn.ordinal);
                            break;
                        }
                    }
                }
                ReplicationEvent::Message { prefix, content, lsn, .. } => {
                    if prefix == DDL_MESSAGE_PREFIX {
                        self.handle_ddl(&content, lsn.as_u64(), sc);
                    } else if self.txn.is_none() && stop_at.is_some_and(|stop| lsn.as_u64() >= stop) {
                        // The fence the source wrote after taking a snapshot.
                        out.reached_stop = true;
                        break;
                    }
                }
                ReplicationEvent::Commit { end_lsn, .. } => {
                    let txn = self.txn.take().ok_or_else(|| protocol("commit without begin"))?;
                    self.safe_lsn = end_lsn.as_u64();
                    out.lsn = self.safe_lsn;
                    bytes += txn.bytes;
                    out.messages.extend(txn.messages);
                    if let Some(end) = crate::TransactionEnd::of(txn.xid.to_string(), txn.commit_ts_ms, &txn.per_table)
                    {
                        out.messages.push(SourceMessage::TransactionEnd(end));
                    }
                    if !txn.created.is_empty() {
                        // The new tables' snapshot lists them from the
                        // catalog: the commit decoded here can still be
                        // invisible to a new snapshot for a moment (a
                        // renamed table was once found "gone" and never
                        // copied).
                        sc.catalog.see_transaction(txn.xid).await?;
                        out.created = txn.created;
                        break;
                    }
                    if out.messages.len() >= sc.config.max_batch_events || bytes >= sc.config.max_batch_bytes {
                        break;
                    }
                    if !out.messages.is_empty() {
                        let now = Instant::now();
                        linger_at.get_or_insert(now + sc.config.batch_linger());
                        idle_at = Some(now + STREAM_IDLE);
                    }
                }
                ReplicationEvent::KeepAlive { wal_end, .. } => {
                    // Between transactions, everything before wal_end was
                    // decoded and delivered: a safe resume point.
                    if self.txn.is_none() && wal_end.as_u64() > self.safe_lsn {
                        self.safe_lsn = wal_end.as_u64();
                        out.lsn = self.safe_lsn;
                    }
                    if self.txn.is_none() && stop_at.is_some_and(|stop| wal_end.as_u64() >= stop) {
                        out.reached_stop = true;
                        break;
                    }
                }
                ReplicationEvent::StoppedAt { .. } => {
                    return Err(Error::retryable("the replication stream stopped"));
                }
            }
        }
        // Every way out of the loop, not only a full part, must keep the
        // marker: a batch that ends on the heartbeat inside a transaction
        // emitted in part (the rest of it not arrived yet, or a restart's
        // replay not reached it yet) is committed with its checkpoint too,
        // and without the marker a restart would emit the first part again.
        out.partial = self.emitted_part();
        Ok(out)
    }

    /// The part of a transaction already handed out while it is open (or,
    /// after a restart, not reached again yet).
    fn emitted_part(&self) -> Option<PartialTxn> {
        match &self.txn {
            Some(t) if t.emitted > 0 => Some(PartialTxn { commit_lsn: t.commit_lsn, changes: t.emitted }),
            Some(_) => None,
            None => self.resume_txn,
        }
    }

    fn handle_ddl(&mut self, content: &[u8], lsn: u64, sc: &mut StreamContext<'_>) {
        let Ok(doc) = serde_json::from_slice::<serde_json::Value>(content) else {
            tracing::warn!("ignoring a malformed DDL message");
            return;
        };
        let tag = doc.get("tag").and_then(|v| v.as_str()).unwrap_or("");
        let (Some(schema), Some(table)) =
            (doc.get("schema").and_then(|v| v.as_str()), doc.get("table").and_then(|v| v.as_str()))
        else {
            return;
        };
        let id = TableId::new(schema, table);
        // Partitions are captured through their partitioned table.
        let partition = doc.get("partition").and_then(|v| v.as_bool()).unwrap_or(false);
        let Some(txn) = self.txn.as_mut() else { return };
        let commit_lsn = txn.commit_lsn;
        if tag == "TABLE REWRITE" {
            // Bits of `pg_event_trigger_table_rewrite_reason()`: a
            // default's value (a volatile default or a generated column
            // added) or a column's type rewrote the rows, which the log does
            // not carry; a persistence (1) or access method (8) change
            // keeps every value.
            const VALUES_CHANGED: u64 = 2 | 4;
            let reason = doc.get("reason").and_then(|v| v.as_u64()).unwrap_or(VALUES_CHANGED);
            if reason & VALUES_CHANGED != 0 && sc.filter.captures(&id) {
                let command = doc.get("command").and_then(|v| v.as_str()).unwrap_or("ALTER TABLE");
                let what = if reason & 4 != 0 {
                    "a column's type changed"
                } else {
                    "a volatile default or a generated column was added"
                };
                let why =
                    format!("{command} rewrote the table ({what}): its rows changed without row changes in the log");
                tracing::info!(table = %id, reason = %why, "captured table rewritten: it is copied again");
                txn.messages.push(SourceMessage::TableRewritten(id, why));
            }
        } else if tag == "DROP TABLE" {
            if sc.announced.remove(&id).is_some() {
                tracing::info!(table = %id, "captured table dropped");
                txn.messages.push(SourceMessage::TableDropped(id.clone()));
                self.relations.retain(|_, r| r.id != id);
                sc.catalog.forget_table(&id);
            }
        } else if let Some(oid) = doc
            .get("oid")
            .and_then(|v| v.as_u64().or_else(|| v.as_str()?.parse().ok()))
            .filter(|_| tag == "ALTER TABLE")
        {
            let columns: Option<Vec<(i16, String)>> = doc.get("columns").and_then(|v| v.as_array()).map(|cols| {
                cols.iter()
                    .filter_map(|c| Some((c.get(0)?.as_i64()? as i16, c.get(1)?.as_str()?.to_string())))
                    .collect()
            });
            let relid = oid as u32;
            if let Some(old) = sc.catalog.note_ddl(relid, (commit_lsn, lsn), &id, columns.as_deref()) {
                self.table_renamed(old, id, partition, sc);
            }
            // A Relation built before this message (a trigger older than
            // v3 wrote it after the rows) gets the aliases too.
            if let Some(rel) = self.relations.get_mut(&relid) {
                if let Some(b) = rel.built.as_mut() {
                    if let Some(s) = sc.catalog.apply_aliases(relid, &b.schema) {
                        b.schema = Arc::new(s);
                        rel.announced = false;
                    }
                }
            }
        } else if (tag == "CREATE TABLE" || tag == "CREATE TABLE AS" || tag == "SELECT INTO")
            && !partition
            && sc.config.new_tables == NewTables::Capture
            && sc.filter.captures(&id)
            && !sc.announced.contains_key(&id)
            && !txn.created.contains(&id)
        {
            tracing::info!(table = %id, "new table to capture");
            txn.created.push(id);
        }
    }

    /// A captured table renamed (or moved to another schema): the old name
    /// is dropped, and the new one captured like a table created now (its
    /// snapshot brings the rows) when the filter selects it.
    fn table_renamed(&mut self, old: TableId, new: TableId, partition: bool, sc: &mut StreamContext<'_>) {
        let Some(txn) = self.txn.as_mut() else { return };
        let dropped = sc.announced.remove(&old).is_some();
        if dropped {
            txn.messages.push(SourceMessage::TableDropped(old.clone()));
        }
        // Rows until the next Relation message are not the old name's.
        for r in self.relations.values_mut().filter(|r| r.id == old) {
            r.built = None;
            r.announced = false;
        }
        if !partition
            && sc.config.new_tables == NewTables::Capture
            && sc.filter.captures(&new)
            && !sc.announced.contains_key(&new)
            && !txn.created.contains(&new)
        {
            tracing::info!(table = %old, new = %new, "captured table renamed: the old name is dropped, the new one captured");
            txn.created.push(new);
        } else if dropped {
            tracing::info!(table = %old, new = %new, "captured table renamed to a name not captured: treated as dropped");
        }
    }

    async fn handle(&mut self, msg: PgOutput, sc: &mut StreamContext<'_>) -> Result<()> {
        match msg {
            PgOutput::Relation { relid, namespace, name, replica_identity, columns } => {
                let id = TableId::new(namespace, name);
                // Without the DDL trigger a rename shows first here. Ordered
                // before the messages of its transaction (which, when there,
                // told the same already).
                if let Some(commit_lsn) = self.txn.as_ref().map(|t| t.commit_lsn) {
                    if let Some(old) = sc.catalog.note_ddl(relid, (commit_lsn, 0), &id, None) {
                        self.table_renamed(old, id.clone(), false, sc);
                    }
                }
                let cols: Vec<(String, u32, i32)> =
                    columns.iter().map(|c| (c.name.clone(), c.type_oid, c.typmod)).collect();
                // The catalog is read for this relation: it must already
                // show what this transaction changed.
                if let Some(xid) = self.txn.as_ref().map(|t| t.xid) {
                    sc.catalog.see_transaction(xid).await?;
                }
                let mut id = id;
                let mut root = None;
                let mut partition_root = None;
                let built = if sc.announced.contains_key(&id) {
                    Some(sc.catalog.build_schema(sc.config, sc.filter, &id, relid, Some(&cols)).await?)
                } else if let Some(r) = sc.catalog.partition_root(relid).await? {
                    // A publication without publish_via_partition_root
                    // (made by hand) sends a partition's changes under the
                    // partition: they belong to the captured root table,
                    // whose snapshot read them.
                    if sc.announced.contains_key(&r.id) {
                        let built = partition_schema(sc, &r, &cols).await?;
                        id = r.id.clone();
                        root = Some(r.relid);
                        partition_root = Some(r);
                        Some(built)
                    } else {
                        None
                    }
                } else {
                    None
                };
                let announced = match (&built, sc.announced.get(&id)) {
                    (Some(b), Some(prev)) => *b.schema == **prev,
                    _ => false,
                };
                self.relations.insert(
                    relid,
                    Relation {
                        id,
                        replica_identity,
                        built,
                        announced,
                        root,
                        columns: cols,
                        partition_root,
                    },
                );
            }
            PgOutput::Insert { relid, new } => {
                let Some((rel, _)) = self.target(relid)? else {
                    return Ok(());
                };
                let after = rel_row(rel, &new, None, sc).await?;
                let (rel, txn) = self.labels_known(relid, [Some(&after)], sc).await?;
                push_change(rel, txn, sc, Op::Create, None, Some(after));
            }
            PgOutput::Update { relid, old, new } => {
                let Some((rel, _)) = self.target(relid)? else {
                    return Ok(());
                };
                let before = match &old {
                    Some((_, tuple)) => Some(rel_row(rel, tuple, None, sc).await?),
                    None => None,
                };
                let full_old = match &old {
                    Some((b'O', tuple)) => Some(tuple.as_slice()),
                    _ => None,
                };
                let after = rel_row(rel, &new, Some(RowFill { old: full_old, new: &new }), sc).await?;
                let (rel, txn) = self.labels_known(relid, [before.as_ref(), Some(&after)], sc).await?;
                push_change(rel, txn, sc, Op::Update, before, Some(after));
            }
            PgOutput::Delete { relid, old } => {
                let Some((rel, _)) = self.target(relid)? else {
                    return Ok(());
                };
                let before = rel_row(rel, &old.1, None, sc).await?;
                let (rel, txn) = self.labels_known(relid, [Some(&before)], sc).await?;
                push_change(rel, txn, sc, Op::Delete, Some(before), None);
            }
            PgOutput::Truncate { relids } => {
                let mut roots_done: Vec<u32> = Vec::new();
                for &relid in &relids {
                    if let Some(root) = self.relations.get(&relid).and_then(|r| r.root) {
                        // A TRUNCATE of the root reaches a publication without
                        // publish_via_partition_root as one of every leaf
                        // partition: one truncate of the root. A partition
                        // truncated alone cannot be told in the root's topic
                        // (PostgreSQL itself does not publish it with the
                        // option set either).
                        if roots_done.contains(&root) {
                            continue;
                        }
                        roots_done.push(root);
                        let leaves = sc.catalog.partition_leaves(root).await?;
                        if !leaves.iter().all(|l| relids.contains(l)) {
                            let table = self.relations.get(&relid).map(|r| r.id.to_string()).unwrap_or_default();
                            tracing::warn!(
                                table = %table,
                                "a TRUNCATE of some partitions only is not carried: the copy keeps their rows \
                                 until the table is copied again"
                            );
                            continue;
                        }
                    }
                    let Some((rel, txn)) = self.target(relid)? else {
                        continue;
                    };
                    push_change(rel, txn, sc, Op::Truncate, None, None);
                }
            }
            PgOutput::Type { .. } | PgOutput::Origin { .. } | PgOutput::Other(_) => {}
        }
        Ok(())
    }

    /// The relation and open transaction of `relid`, with its schema built
    /// again first when `rows` hold an enum label its schema does not know:
    /// `ALTER TYPE ... ADD VALUE` sends no Relation message, and a label the
    /// schema does not list cannot be encoded. The new schema (its enum's
    /// labels read again) is announced before the change.
    async fn labels_known<const N: usize>(
        &mut self,
        relid: u32,
        rows: [Option<&Row>; N],
        sc: &mut StreamContext<'_>,
    ) -> Result<(&mut Relation, &mut Txn)> {
        let stale = self
            .relations
            .get(&relid)
            .and_then(|r| r.built.as_ref())
            .is_some_and(|b| rows.iter().flatten().any(|row| unknown_enum_label(&b.schema, row)));
        if stale {
            let rel = self
                .relations
                .get_mut(&relid)
                .ok_or_else(|| protocol(&format!("row for relation {relid} before its Relation message")))?;
            if let Some(xid) = self.txn.as_ref().map(|t| t.xid) {
                sc.catalog.see_transaction(xid).await?;
            }
            sc.catalog.forget_enum_types();
            let built = match &rel.partition_root {
                Some(root) => partition_schema(sc, root, &rel.columns).await?,
                None => {
                    sc.catalog
                        .build_schema(sc.config, sc.filter, &rel.id, relid, Some(&rel.columns))
                        .await?
                }
            };
            tracing::info!(table = %rel.id, "an enum type of the table has a new label: its schema is read again");
            rel.announced = sc.announced.get(&rel.id).is_some_and(|prev| **prev == *built.schema);
            rel.built = Some(built);
        }
        self.target(relid)?
            .ok_or_else(|| protocol(&format!("relation {relid} is no longer captured")))
    }

    /// The relation and open transaction a row message belongs to, or `None`
    /// when the table is not captured.
    fn target(&mut self, relid: u32) -> Result<Option<(&mut Relation, &mut Txn)>> {
        let rel = self
            .relations
            .get_mut(&relid)
            .ok_or_else(|| protocol(&format!("row for relation {relid} before its Relation message")))?;
        if rel.built.is_none() {
            return Ok(None);
        }
        let txn = self.txn.as_mut().ok_or_else(|| protocol("row change outside a transaction"))?;
        Ok(Some((rel, txn)))
    }
}

/// The root table's schema for a partition's Relation message: the
/// partition's columns (with their types from the message) in the root's
/// column order, so that it equals the schema the root announced, and the
/// partition's column positions (its own attnum order, which a table
/// attached as a partition need not share) mapped onto it.
async fn partition_schema(
    sc: &mut StreamContext<'_>,
    root: &PartitionRoot,
    cols: &[(String, u32, i32)],
) -> Result<BuiltSchema> {
    let ordered: Vec<(String, u32, i32)> = root
        .columns
        .iter()
        .filter_map(|name| cols.iter().find(|c| c.0 == *name).cloned())
        .collect();
    let mut built = sc
        .catalog
        .build_schema(sc.config, sc.filter, &root.id, root.relid, Some(&ordered))
        .await?;
    built.source_columns = cols
        .iter()
        .map(|c| {
            let at = ordered.iter().position(|o| o.0 == c.0)?;
            built.source_columns.get(at).copied().flatten()
        })
        .collect();
    Ok(built)
}

/// Where unchanged TOAST values of a new tuple come from.
struct RowFill<'a> {
    old: Option<&'a [TupleValue]>,
    new: &'a [TupleValue],
}

/// Decodes a tuple into a row of the table's captured columns, filling
/// unchanged TOAST values when `fill` is given.
async fn rel_row(
    rel: &Relation,
    tuple: &[TupleValue],
    fill: Option<RowFill<'_>>,
    sc: &mut StreamContext<'_>,
) -> Result<Row> {
    let built = rel.built.as_ref().ok_or_else(|| protocol("row of an uncaptured table"))?;
    let schema = &built.schema;
    let mut row = vec![Value::Null; schema.columns.len()];
    let mut missing = Vec::new();
    for (src, value) in tuple.iter().enumerate() {
        let Some(Some(idx)) = built.source_columns.get(src) else {
            continue;
        };
        let col = &schema.columns[*idx];
        row[*idx] = match value {
            TupleValue::Null => Value::Null,
            TupleValue::Text(b) => {
                let text = std::str::from_utf8(b).map_err(|_| {
                    Error::permanent("value is not valid UTF-8")
                        .with_table(schema.id.clone())
                        .with_column(col.name.clone())
                })?;
                decode_text(
                    &col.data_type,
                    text,
                    ColumnRef {
                        table: &schema.id,
                        column: &col.name,
                        source_type: &col.source_type,
                        nullable: col.nullable,
                    },
                )?
            }
            TupleValue::Binary(_) => {
                return Err(protocol("binary tuple values were not requested").with_table(schema.id.clone()))
            }
            TupleValue::Unchanged => {
                // Fill from the full old row when the server sent one.
                let from_old = fill
                    .as_ref()
                    .and_then(|f| f.old)
                    .and_then(|old| old.get(src))
                    .and_then(|v| match v {
                        TupleValue::Text(b) => Some(b.clone()),
                        _ => None,
                    });
                match from_old {
                    Some(b) => {
                        let text = std::str::from_utf8(&b).map_err(|_| {
                            Error::permanent("value is not valid UTF-8")
                                .with_table(schema.id.clone())
                                .with_column(col.name.clone())
                        })?;
                        decode_text(
                            &col.data_type,
                            text,
                            ColumnRef {
                                table: &schema.id,
                                column: &col.name,
                                source_type: &col.source_type,
                                nullable: col.nullable,
                            },
                        )?
                    }
                    None => {
                        missing.push(*idx);
                        Value::Unchanged
                    }
                }
            }
        };
    }
    if !missing.is_empty() {
        match fill {
            Some(f) => fetch_unchanged(rel, f.new, &missing, &mut row, sc).await?,
            None => {
                // Old-key tuples never hold TOAST placeholders for columns
                // we read; anything left unknown is reported as NULL.
                for i in missing {
                    row[i] = Value::Null;
                }
            }
        }
    }
    Ok(row)
}

/// Reads the current value of unchanged TOAST columns by key. The row may
/// already be newer than this change; a later change of the same row
/// follows in the stream, so the topic converges to the right value.
async fn fetch_unchanged(
    rel: &Relation,
    new: &[TupleValue],
    missing: &[usize],
    row: &mut Row,
    sc: &mut StreamContext<'_>,
) -> Result<()> {
    let built = rel.built.as_ref().ok_or_else(|| protocol("row of an uncaptured table"))?;
    let schema = &built.schema;
    if schema.key.is_empty() {
        // A table without a key is read with REPLICA IDENTITY FULL: its
        // old row fills every column.
        return Err(Error::needs_operator(
            "an update of a table without a key left a large (TOAST) value out and came without its old row",
        )
        .with_table(schema.id.clone())
        .with_column(schema.columns[missing[0]].name.clone())
        .with_hint(format!("ALTER TABLE {} REPLICA IDENTITY FULL;", quote_table(&schema.id))));
    }
    let mut conds = Vec::new();
    for &k in &schema.key_indexes() {
        let col = &schema.columns[k];
        let src = built.source_columns.iter().position(|c| *c == Some(k));
        let text = src.and_then(|s| match new.get(s) {
            Some(TupleValue::Text(b)) => std::str::from_utf8(b).ok(),
            _ => None,
        });
        match text {
            Some(t) => conds.push(format!("{} = {}::{}", quote_ident(&col.name), quote_literal(t), col.source_type)),
            None => {
                return Err(Error::needs_operator(
                    "an update left a large (TOAST) value out and the row's key is not available to read it",
                )
                .with_table(schema.id.clone())
                .with_column(schema.columns[missing[0]].name.clone())
                .with_hint(format!("ALTER TABLE {} REPLICA IDENTITY FULL;", quote_table(&schema.id))))
            }
        }
    }
    let cols = missing
        .iter()
        .map(|&i| format!("{}::text", quote_ident(&schema.columns[i].name)))
        .collect::<Vec<_>>()
        .join(", ");
    let sql = format!("SELECT {cols} FROM {} WHERE {}", quote_table(&schema.id), conds.join(" AND "));
    let texts = sc
        .catalog
        .query_texts(&sql)
        .await
        .map_err(|e| e.with_table(schema.id.clone()))?;
    match texts {
        Some(values) => {
            for (&i, text) in missing.iter().zip(values) {
                let col = &schema.columns[i];
                row[i] = match text {
                    None => Value::Null,
                    Some(t) => decode_text(
                        &col.data_type,
                        &t,
                        ColumnRef {
                            table: &schema.id,
                            column: &col.name,
                            source_type: &col.source_type,
                            nullable: col.nullable,
                        },
                    )?,
                };
            }
        }
        None => {
            // The row is gone already: its delete follows in the stream.
            tracing::warn!(table = %schema.id, "row of an update with unchanged TOAST values no longer exists; sending NULL for those columns until its delete");
            for &i in missing {
                row[i] = Value::Null;
            }
        }
    }
    Ok(())
}

/// Whether `row` holds an enum label (alone or in an array) that its
/// column's type did not have when `schema` was built.
fn unknown_enum_label(schema: &TableSchema, row: &Row) -> bool {
    let unknown = |symbols: &[String], v: &Value| matches!(v, Value::Enum(l) if !symbols.contains(l));
    schema.columns.iter().zip(row).any(|(c, v)| match (&c.data_type, v) {
        (DataType::Enum { symbols }, v) => unknown(symbols, v),
        (DataType::Array(inner), Value::Array(items)) => match inner.as_ref() {
            DataType::Enum { symbols } => items.iter().any(|i| unknown(symbols, i)),
            _ => false,
        },
        _ => false,
    })
}

fn push_change(
    rel: &mut Relation,
    txn: &mut Txn,
    sc: &mut StreamContext<'_>,
    op: Op,
    before: Option<Row>,
    after: Option<Row>,
) {
    let Some(built) = rel.built.as_ref() else { return };
    let schema = built.schema.clone();
    if !rel.announced {
        txn.messages.push(SourceMessage::SchemaChanged(schema.clone()));
        sc.announced.insert(rel.id.clone(), schema.clone());
        rel.announced = true;
    }
    txn.ordinal += 1;
    let per_table = txn.per_table.entry(rel.id.clone()).or_insert(0);
    *per_table += 1;
    if txn.ordinal <= txn.skip {
        return; // emitted before a restart (see PartialTxn)
    }
    txn.bytes += before.iter().chain(after.iter()).flatten().map(value_size).sum::<usize>() + 64;
    let xid = txn.xid.to_string();
    txn.messages.push(SourceMessage::Change(ChangeEvent {
        schema,
        op,
        before,
        after,
        source: SourceInfo {
            connector: sc.ctx.connector.clone(),
            name: sc.ctx.name.clone(),
            db: sc.ctx.db.clone(),
            ts_ms: txn.commit_ts_ms,
            snapshot: SnapshotMarker::False,
            tx_id: Some(xid.clone()),
            position: Position { commit: txn.commit_lsn, index: txn.ordinal },
            native_position: format_lsn(txn.commit_lsn).into(),
        },
        ts_ms: crate::now_ms(),
        transaction: Some(TransactionInfo {
            id: xid,
            total_order: txn.ordinal as i64,
            data_collection_order: *per_table,
        }),
    }));
    let _ = rel.replica_identity;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tuple(values: &[Option<&str>]) -> Vec<u8> {
        let mut out = (values.len() as i16).to_be_bytes().to_vec();
        for v in values {
            match v {
                None => out.push(b'n'),
                Some("\u{0}u") => out.push(b'u'),
                Some(t) => {
                    out.push(b't');
                    out.extend((t.len() as i32).to_be_bytes());
                    out.extend(t.as_bytes());
                }
            }
        }
        out
    }

    #[test]
    fn parses_relation() {
        let mut m = vec![b'R'];
        m.extend(16384u32.to_be_bytes());
        m.extend(b"public\0items\0");
        m.push(b'f');
        m.extend(2i16.to_be_bytes());
        m.push(1);
        m.extend(b"id\0");
        m.extend(20u32.to_be_bytes());
        m.extend((-1i32).to_be_bytes());
        m.push(0);
        m.extend(b"name\0");
        m.extend(25u32.to_be_bytes());
        m.extend((-1i32).to_be_bytes());
        let msg = parse_pgoutput(Bytes::from(m)).unwrap();
        let PgOutput::Relation { relid, namespace, name, replica_identity, columns } = msg else {
            panic!("not a relation")
        };
        assert_eq!((relid, namespace.as_str(), name.as_str(), replica_identity), (16384, "public", "items", b'f'));
        assert!(columns[0].key && !columns[1].key);
        assert_eq!(columns[1].type_oid, 25);
    }

    #[test]
    fn parses_update_with_old_row_and_toast_placeholder() {
        let mut m = vec![b'U'];
        m.extend(7u32.to_be_bytes());
        m.push(b'O');
        m.extend(tuple(&[Some("1"), Some("big")]));
        m.push(b'N');
        m.extend(tuple(&[Some("1"), Some("\u{0}u")]));
        let msg = parse_pgoutput(Bytes::from(m)).unwrap();
        assert_eq!(
            msg,
            PgOutput::Update {
                relid: 7,
                old: Some((b'O', vec![TupleValue::Text("1".into()), TupleValue::Text("big".into())])),
                new: vec![TupleValue::Text("1".into()), TupleValue::Unchanged],
            }
        );
    }

    #[test]
    fn parses_truncate_and_delete() {
        let mut m = vec![b'T'];
        m.extend(2u32.to_be_bytes());
        m.push(0);
        m.extend(1u32.to_be_bytes());
        m.extend(2u32.to_be_bytes());
        assert_eq!(parse_pgoutput(Bytes::from(m)).unwrap(), PgOutput::Truncate { relids: vec![1, 2] });
        let mut m = vec![b'D'];
        m.extend(3u32.to_be_bytes());
        m.push(b'K');
        m.extend(tuple(&[Some("9"), None]));
        assert_eq!(
            parse_pgoutput(Bytes::from(m)).unwrap(),
            PgOutput::Delete {
                relid: 3,
                old: (b'K', vec![TupleValue::Text("9".into()), TupleValue::Null])
            }
        );
    }

    #[test]
    fn truncated_messages_are_errors_not_panics() {
        for m in [&b"R\0\0"[..], b"I\0\0\0\x01N\0\x01t\0\0\0\x09ab", b"U\0\0\0\x01X"] {
            assert!(parse_pgoutput(Bytes::copy_from_slice(m)).is_err());
        }
    }
}

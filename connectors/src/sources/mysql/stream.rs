//! Streaming: the binlog from the checkpoint's position, through
//! `mysql_async`'s binlog stream, into batches of whole transactions.
//!
//! Events of a transaction are held until its XID (or `COMMIT` query, or the
//! single statement of a DDL group) and only then join the batch, with
//! positions `(end of the transaction, 1..n)`; the checkpoint moves to the
//! end of the transaction at the same moment, and a restart from it neither
//! repeats nor skips a change.
//!
//! A transaction with `max_batch_events` changes or more is not held whole
//! (a 10M-row UPDATE would not fit in memory, nor in one Kafka
//! transaction): it goes out in parts, with positions `(start of the
//! transaction + 1, 1..n)`, known before its end and still between the
//! transactions before and after it. Its checkpoint stays at its start,
//! with a [`PartialTxn`] marker counting the changes emitted; a restart
//! reads the transaction again and skips that many (the binlog holds a
//! transaction's rows in one order). Which transactions go in parts depends
//! only on their size, so a replay gives every change the same position.
//!
//! MariaDB specifics: `@mariadb_slave_capability = 4` makes the server send
//! its GTID events (decoded in [`super::gtid`], `mysql_common` does not know
//! them), and the first, artificial ROTATE of a dump carries its 4 checksum
//! bytes on the file name (the FORMAT_DESCRIPTION that announces the
//! checksum comes after it), so that ROTATE's name loses its last 4 bytes
//! when the server's `binlog_checksum` is not NONE.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use mysql_async::binlog::events::{Event, EventData, QueryEvent, RowsEventData, TableMapEvent};
use mysql_async::binlog::row::BinlogRow;
use mysql_async::binlog::EventType;
use mysql_async::consts::ColumnType;
use mysql_async::prelude::Queryable;
use mysql_async::{BinlogStream, BinlogStreamRequest};
use serde::{Deserialize, Serialize};
use tributary_schemas::{
    ChangeEvent, Op, Position, SnapshotMarker, SourceInfo, TableId, TableSchema, TransactionInfo, Value,
};

use super::config::{ConnectionParams, MySqlSourceConfig, NewTables, ResumeBy, SnapshotMode, TableFilter};
use super::gtid::{self, MariaGtidEvent, MariaGtidPos, MySqlGtidSet};
use super::history::DdlEffect;
use super::rewrites::Session;
use super::snapshot::{SnapshotState, TablePlan};
use super::types::quote_literal;
use super::{classify_my, connect, BinlogPosition, BuiltSchema, EventContext, ServerKind, SourceState};
use crate::error::{Error, ErrorKind, Result};
use crate::SourceMessage;

/// `LOG_EVENT_ARTIFICIAL_F`: an event the dump thread made up (the first
/// ROTATE); its `log_pos` is not a position in the file.
const ARTIFICIAL: u16 = 0x0020;
/// `MARIA_SLAVE_CAPABILITY_GTID`: send GTID events.
const MARIADB_SLAVE_CAPABILITY_GTID: u32 = 4;

/// Milliseconds since the epoch, now.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// What streaming reads and updates of the source.
pub struct StreamContext<'a> {
    /// The configuration.
    pub config: &'a MySqlSourceConfig,
    /// Table selection.
    pub filter: &'a TableFilter,
    /// Event context.
    pub ctx: &'a EventContext,
    /// Schemas announced to the runner.
    pub announced: &'a mut BTreeMap<TableId, Arc<TableSchema>>,
    /// The state: position, GTIDs and history move at each commit.
    pub state: &'a mut SourceState,
    /// Notified when the runner has work between batches: the batch ends
    /// as at its deadline ([`crate::source::Source::set_wake`]).
    pub wake: Option<&'a tokio::sync::Notify>,
}

/// The part of a transaction already emitted, when a batch ends inside a
/// transaction that goes out in parts (see the module's doc).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartialTxn {
    /// Where the transaction's first event starts.
    pub start: BinlogPosition,
    /// Its GTID, when the server writes them (after a `resume_by = "gtid"`
    /// restart, the surer way to know it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gtid: Option<String>,
    /// Changes of it emitted so far.
    pub changes: u64,
}

/// A transaction being read.
#[derive(Default)]
struct OpenTxn {
    /// Held: not handed out yet.
    messages: Vec<SourceMessage>,
    /// Where its first event starts (unknown for an artificial one).
    start: Option<BinlogPosition>,
    /// Changes read so far (skipped ones included).
    ordinal: u64,
    /// Changes read so far per table (skipped ones included): each
    /// change's `data_collection_order`.
    per_table: BTreeMap<TableId, i64>,
    /// Changes already in Kafka before a restart: read, not emitted.
    skip: u64,
    /// Changes handed out (in earlier batches or before a restart).
    emitted: u64,
    /// It goes out in parts (see the module's doc).
    in_parts: bool,
    /// The GTID as text (the events' `tx_id`).
    gtid: Option<String>,
    maria: Option<gtid::MariaGtid>,
    mysql: Option<(String, u64)>,
    /// Opened by BEGIN (or a MariaDB GTID event of a non-standalone
    /// group): it ends at XID or COMMIT. Otherwise its one statement ends it.
    begun: bool,
}

/// The binlog reader.
pub struct Streamer {
    stream: BinlogStream,
    kind: ServerKind,
    /// The file the events being read are in.
    file: String,
    txn: Option<OpenTxn>,
    built: BTreeMap<TableId, BuiltSchema>,
    maria_gtid: MariaGtidPos,
    mysql_gtid: Option<MySqlGtidSet>,
    /// A DDL statement read while a batch had events already: it starts the
    /// next batch, because the runner registers one schema per table and
    /// batch, so rows before and after a schema change cannot share one.
    stashed: Option<Event>,
    /// Checksum bytes on the name of a ROTATE read before this stream's
    /// FORMAT_DESCRIPTION (the server's `binlog_checksum`: 4 for CRC32);
    /// 0 once the FORMAT_DESCRIPTION is read and the parser strips them.
    rotate_checksum_len: usize,
    /// A committed transaction put a table in `state.snapshot` (a rename):
    /// the batch ends there so that the copy starts before more is read.
    copy_requested: bool,
    /// The transaction emitted in part before the restart: the first one
    /// read (the checkpoint is its start).
    resume: Option<PartialTxn>,
}

/// What one call of [`Streamer::next_batch`] produced.
#[derive(Debug, Default)]
pub struct StreamBatch {
    /// Messages of whole transactions.
    pub messages: Vec<SourceMessage>,
    /// The stream reached the `stop` position given to `next_batch`: every
    /// transaction ending at or before it was returned, none after it, and
    /// the state's position is `stop`. The stream must then be dropped: it
    /// has read past the stop.
    pub reached_stop: bool,
}

/// Where `event` starts, when it is a real event of the file being read.
fn event_start(event: &Event, file: &str) -> Option<BinlogPosition> {
    let header = event.header();
    let artificial = header.flags_raw() & ARTIFICIAL != 0 || header.log_pos() == 0;
    let start = u64::from(header.log_pos()).checked_sub(u64::from(header.event_size()))?;
    (!artificial).then(|| BinlogPosition { file: file.to_string(), pos: start })
}

/// Whether `event` is a QUERY event that may change a table (not a
/// transaction boundary).
fn is_ddl(event: &Event) -> bool {
    if event.header().event_type_raw() != EventType::QUERY_EVENT as u8 {
        return false;
    }
    match event.read_event::<QueryEvent<'_>>() {
        Ok(q) => {
            let sql = q.query();
            let word = sql.split_whitespace().next().unwrap_or("").to_ascii_uppercase();
            !matches!(word.as_str(), "BEGIN" | "COMMIT" | "ROLLBACK" | "XA" | "SAVEPOINT")
        }
        Err(_) => false,
    }
}

impl Streamer {
    /// Connects and asks for the binlog from the state's position.
    pub async fn open(params: &ConnectionParams, config: &MySqlSourceConfig, state: &SourceState) -> Result<Self> {
        let mut conn = connect(params).await?;
        // Idle servers send a heartbeat event this often, so a dead
        // connection is noticed within a heartbeat interval.
        let heartbeat_ns = config.heartbeat_interval().as_nanos() / 2;
        conn.query_drop(format!("SET @master_heartbeat_period = {heartbeat_ns}"))
            .await
            .map_err(|e| classify_my(e, "setting the binlog heartbeat"))?;
        if state.server == ServerKind::MariaDb {
            conn.query_drop(format!("SET @mariadb_slave_capability = {MARIADB_SLAVE_CAPABILITY_GTID}"))
                .await
                .map_err(|e| classify_my(e, "announcing MariaDB GTID capability"))?;
        }
        let file = state.binlog.file.clone();
        let by_gtid = match (config.resume_by, state.server, &state.gtid) {
            (ResumeBy::Gtid, ServerKind::MariaDb, Some(g)) => Some(g.clone()),
            _ => None,
        };
        let request = match &by_gtid {
            Some(g) => {
                // MariaDB rejects COM_BINLOG_DUMP_GTID; it takes the GTID
                // position from this variable and ignores the dump's file
                // and offset. The first (artificial) ROTATE names the file.
                conn.query_drop(format!("SET @slave_connect_state = {}", quote_literal(g)))
                    .await
                    .map_err(|e| classify_my(e, "setting the GTID position to resume from"))?;
                BinlogStreamRequest::new(config.server_id).with_pos(4)
            }
            None => BinlogStreamRequest::new(config.server_id)
                .with_filename(file.as_bytes())
                .with_pos(state.binlog.pos.max(4)),
        };
        let checksum: Option<String> = conn
            .query_first("SELECT @@global.binlog_checksum")
            .await
            .map_err(|e| classify_my(e, "reading binlog_checksum"))?;
        let rotate_checksum_len = match checksum.as_deref() {
            Some(c) if !c.eq_ignore_ascii_case("NONE") => 4,
            _ => 0,
        };
        let stream = conn
            .get_binlog_stream(request)
            .await
            .map_err(|e| classify_my(e, "requesting the binlog"))?;
        tracing::info!(
            position = %state.binlog,
            gtid = state.gtid.as_deref().unwrap_or(""),
            by_gtid = by_gtid.is_some(),
            "streaming started"
        );
        let (maria_gtid, mysql_gtid) = match (state.server, &state.gtid) {
            (ServerKind::MariaDb, Some(g)) => (MariaGtidPos::parse(g).unwrap_or_default(), None),
            (ServerKind::MySql, Some(g)) => (MariaGtidPos::default(), MySqlGtidSet::parse(g)),
            _ => (MariaGtidPos::default(), None),
        };
        Ok(Self {
            stream,
            kind: state.server,
            file,
            txn: None,
            built: BTreeMap::new(),
            maria_gtid,
            mysql_gtid,
            stashed: None,
            rotate_checksum_len,
            copy_requested: false,
            resume: state.partial.clone(),
        })
    }

    /// Opens a transaction whose first event starts at `start`: in parts
    /// from the outset if it is the one emitted in part before a restart.
    fn open_txn(&mut self, mut txn: OpenTxn, start: Option<BinlogPosition>) -> OpenTxn {
        txn.start = start;
        if let Some(resume) = self.resume.take() {
            let same = match (&resume.gtid, &txn.gtid) {
                (Some(theirs), Some(ours)) => theirs == ours,
                _ => txn.start.as_ref() == Some(&resume.start),
            };
            if same {
                txn.skip = resume.changes;
                txn.emitted = resume.changes;
                txn.in_parts = true;
            } else {
                tracing::warn!(
                    expected = %resume.start,
                    found = %txn.start.as_ref().map(ToString::to_string).unwrap_or_default(),
                    "the transaction emitted in part before the restart is not the first one read"
                );
            }
        }
        txn
    }

    /// The part of a transaction already handed out while it is open (or,
    /// after a restart, not reached again yet): the checkpoint's marker.
    fn emitted_part(&self) -> Option<PartialTxn> {
        match &self.txn {
            Some(t) if t.in_parts && t.emitted > 0 => Some(PartialTxn {
                start: t.start.clone()?,
                gtid: t.gtid.clone(),
                changes: t.emitted,
            }),
            Some(_) => None,
            None => self.resume.clone(),
        }
    }

    /// The next batch of whole transactions: returned once it holds
    /// `max_batch_events` events, `batch_linger` after its first
    /// transaction, or at the heartbeat (possibly empty).
    ///
    /// With `stop` (a transaction boundary: a snapshot's position), the
    /// batch also ends where the stream reaches it, and says so in
    /// `reached_stop`.
    ///
    /// A transaction that goes out in parts ends the batch with its next
    /// part once the batch is full, and the state's `partial` says how much
    /// of it is out, whichever way the batch ends.
    pub async fn next_batch(
        &mut self,
        sc: &mut StreamContext<'_>,
        stop: Option<&BinlogPosition>,
    ) -> Result<StreamBatch> {
        let out = self.collect(sc, stop).await;
        sc.state.partial = self.emitted_part();
        out
    }

    async fn collect(&mut self, sc: &mut StreamContext<'_>, stop: Option<&BinlogPosition>) -> Result<StreamBatch> {
        let heartbeat = Instant::now() + sc.config.heartbeat_interval();
        let mut deadline = heartbeat;
        let mut out = StreamBatch::default();
        let mut events = 0usize;
        let reached = |state: &SourceState, stop: Option<&BinlogPosition>| {
            stop.is_some_and(|stop| state.binlog.ordered() >= stop.ordered())
        };
        if self.txn.is_none() && reached(sc.state, stop) {
            out.reached_stop = true;
            return Ok(out);
        }
        loop {
            if let Some(txn) = self.txn.as_mut() {
                // Before the next event (its rows, or the commit that
                // hands out what is held): a full batch goes.
                let max = sc.config.max_batch_events;
                txn.in_parts |= txn.start.is_some() && txn.ordinal >= max as u64;
                if txn.in_parts && events + txn.messages.len() >= max {
                    out.messages.extend(txn.take_part(max - events));
                    return Ok(out);
                }
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(out);
            }
            let next = match self.stashed.take() {
                Some(event) => event,
                None => {
                    let woken = async {
                        match sc.wake {
                            Some(w) => w.notified().await,
                            None => std::future::pending().await,
                        }
                    };
                    // The binlog stream's `next` is cancel-safe, as the
                    // deadline already relies on.
                    let next = tokio::select! {
                        r = tokio::time::timeout(deadline - now, self.stream.next()) => r,
                        () = woken => return Ok(out),
                    };
                    match next {
                        Err(_) => return Ok(out),
                        Ok(None) => return Err(Error::retryable("the server ended the binlog stream")),
                        Ok(Some(Err(e))) => return Err(classify_my(e, "reading the binlog")),
                        Ok(Some(Ok(event))) => event,
                    }
                }
            };
            if let Some(stop) = stop {
                // The first event of a transaction at or after the stop: the
                // snapshot holds none of it (the stop is where the next
                // transaction begins).
                let at_or_after = event_start(&next, &self.file).is_some_and(|s| s.ordered() >= stop.ordered());
                if self.txn.is_none() && at_or_after {
                    sc.state.binlog = stop.clone();
                    out.reached_stop = true;
                    return Ok(out);
                }
            }
            if !out.messages.is_empty() && is_ddl(&next) {
                self.stashed = Some(next);
                return Ok(out);
            }
            let committed = self.handle(next, sc)?;
            if let Some(messages) = committed {
                if out.messages.is_empty() && !messages.is_empty() {
                    deadline = deadline.min(Instant::now() + sc.config.batch_linger());
                }
                events += messages.len();
                out.messages.extend(messages);
                if std::mem::take(&mut self.copy_requested) || events >= sc.config.max_batch_events {
                    out.reached_stop = self.txn.is_none() && reached(sc.state, stop);
                    return Ok(out);
                }
            }
            if self.txn.is_none() && reached(sc.state, stop) {
                out.reached_stop = true;
                return Ok(out);
            }
        }
    }

    /// Handles one event; returns the messages of a transaction it commits.
    fn handle(&mut self, event: Event, sc: &mut StreamContext<'_>) -> Result<Option<Vec<SourceMessage>>> {
        let header = event.header();
        let raw_type = header.event_type_raw();
        let artificial = header.flags_raw() & ARTIFICIAL != 0 || header.log_pos() == 0;
        let end = BinlogPosition {
            file: self.file.clone(),
            pos: u64::from(header.log_pos()),
        };
        if self.kind == ServerKind::MariaDb {
            match raw_type {
                gtid::MARIADB_GTID_EVENT => {
                    let e = MariaGtidEvent::parse(event.data(), header.server_id())
                        .ok_or_else(|| Error::retryable(format!("a MariaDB GTID event at {end} cannot be decoded")))?;
                    let txn = OpenTxn {
                        gtid: Some(e.gtid.to_string()),
                        maria: Some(e.gtid),
                        begun: !e.standalone,
                        ..OpenTxn::default()
                    };
                    self.txn = Some(self.open_txn(txn, event_start(&event, &self.file)));
                    return Ok(None);
                }
                gtid::MARIADB_GTID_LIST_EVENT
                | gtid::MARIADB_ANNOTATE_ROWS_EVENT
                | gtid::MARIADB_BINLOG_CHECKPOINT_EVENT => {
                    self.idle_advance(&end, artificial, sc);
                    return Ok(None);
                }
                _ => {}
            }
        }
        if !parsed_event(raw_type) {
            self.idle_advance(&end, artificial, sc);
            return Ok(None);
        }
        let start = event_start(&event, &self.file);
        let data = event
            .read_data()
            .map_err(|e| Error::retryable(format!("a binlog event at {end} cannot be decoded: {e}")))?;
        match data {
            Some(EventData::RotateEvent(r)) => {
                self.file = binlog_file_name(r.name_raw(), self.rotate_checksum_len);
                if self.txn.is_none() {
                    sc.state.binlog = BinlogPosition { file: self.file.clone(), pos: r.position() };
                }
                Ok(None)
            }
            Some(EventData::GtidEvent(g)) => {
                let uuid = gtid::uuid_text(g.sid());
                let txn = OpenTxn {
                    gtid: Some(format!("{uuid}:{}", g.gno())),
                    mysql: Some((uuid, g.gno())),
                    ..OpenTxn::default()
                };
                self.txn = Some(self.open_txn(txn, start));
                Ok(None)
            }
            Some(EventData::QueryEvent(q)) => {
                let sql = q.query();
                let trimmed = sql.trim();
                if trimmed.eq_ignore_ascii_case("BEGIN") || trimmed.eq_ignore_ascii_case("START TRANSACTION") {
                    // Without GTIDs, BEGIN is the transaction's first event.
                    let txn = match self.txn.take() {
                        Some(txn) => txn,
                        None => self.open_txn(OpenTxn::default(), start),
                    };
                    self.txn = Some(OpenTxn { begun: true, ..txn });
                    return Ok(None);
                }
                if trimmed.eq_ignore_ascii_case("COMMIT") {
                    return self.commit(&end, sc).map(Some);
                }
                if trimmed.eq_ignore_ascii_case("ROLLBACK") {
                    self.txn = None;
                    self.idle_advance(&end, artificial, sc);
                    return Ok(None);
                }
                let schema = q.schema().to_string();
                let session = session_of(&q);
                let mut txn = self.txn.take().unwrap_or_default();
                self.apply_ddl(trimmed, &schema, session, &mut txn, sc)?;
                // A statement outside BEGIN/COMMIT (DDL) commits on its own.
                let ends = !txn.begun;
                self.txn = Some(txn);
                if ends {
                    return self.commit(&end, sc).map(Some);
                }
                Ok(None)
            }
            Some(EventData::XidEvent(_)) => self.commit(&end, sc).map(Some),
            Some(EventData::RowsEvent(rows)) => {
                self.rows(&rows, &end, sc)?;
                Ok(None)
            }
            Some(EventData::FormatDescriptionEvent(_)) => {
                self.rotate_checksum_len = 0;
                if self.txn.is_none() {
                    self.idle_advance(&end, artificial, sc);
                }
                Ok(None)
            }
            Some(EventData::TableMapEvent(_)) => {
                if self.txn.is_none() {
                    self.idle_advance(&end, artificial, sc);
                }
                Ok(None)
            }
            _ => {
                self.idle_advance(&end, artificial, sc);
                Ok(None)
            }
        }
    }

    /// Outside a transaction the checkpoint may follow every real event, so
    /// an idle source still moves its stored position.
    fn idle_advance(&mut self, end: &BinlogPosition, artificial: bool, sc: &mut StreamContext<'_>) {
        if self.txn.is_none() && !artificial && end.pos > 0 {
            sc.state.binlog = end.clone();
        }
    }

    fn commit(&mut self, end: &BinlogPosition, sc: &mut StreamContext<'_>) -> Result<Vec<SourceMessage>> {
        let Some(mut txn) = self.txn.take() else {
            sc.state.binlog = end.clone();
            return Ok(Vec::new());
        };
        let mut messages = if txn.in_parts {
            txn.take_part(usize::MAX)
        } else {
            txn.hand_out(usize::MAX, end, end.ordered())
        };
        if let Some(e) = crate::TransactionEnd::of(txn.tx_id(end), now_ms(), &txn.per_table) {
            messages.push(SourceMessage::TransactionEnd(e));
        }
        sc.state.binlog = end.clone();
        if let Some(g) = txn.maria {
            self.maria_gtid.advance(g);
            sc.state.gtid = Some(self.maria_gtid.to_string());
        }
        if let Some((uuid, gno)) = &txn.mysql {
            let set = self.mysql_gtid.get_or_insert_with(MySqlGtidSet::default);
            set.add(uuid, *gno);
            sc.state.gtid = Some(set.to_string());
        }
        Ok(messages)
    }

    fn apply_ddl(
        &mut self,
        sql: &str,
        schema: &str,
        session: Session,
        txn: &mut OpenTxn,
        sc: &mut StreamContext<'_>,
    ) -> Result<()> {
        let filter = sc.filter;
        let capture_new = sc.config.new_tables == NewTables::Capture;
        let known: Vec<TableId> = sc.state.history.tables().collect();
        let tracked = |t: &TableId| filter.captures(t) && (capture_new || known.contains(t));
        // The definitions before the statement: a table that gains or loses
        // its key, or without a key changes its rows' content, is copied
        // again (see `crate::copy_for_key_change`).
        let before = sc.state.history.clone();
        // The columns each table had: an added column whose default the
        // topic cannot carry is a value the binlog does not say either.
        let columns_before: BTreeMap<TableId, Vec<String>> = known
            .iter()
            .filter_map(|t| {
                Some((t.clone(), sc.state.history.get(t)?.columns.iter().map(|c| c.name.clone()).collect()))
            })
            .collect();
        let effects = match sc.state.history.apply_in(sql, schema, &tracked, session) {
            Ok(e) => e,
            Err(e) => {
                return match e.table {
                    // A statement about a captured table that cannot be
                    // followed: the rows after it could not be decoded.
                    Some(t) => Err(Error::permanent(e.message).with_table(t)),
                    None => {
                        // Not a statement sqlparser knows (procedures,
                        // server-specific admin statements): no table
                        // definition changes through those.
                        tracing::debug!(statement = first_word(sql), "statement not parsed; ignored");
                        Ok(())
                    }
                };
            }
        };
        let mut rewritten: Vec<(TableId, String)> = Vec::new();
        for effect in effects {
            match effect {
                DdlEffect::Created(t) => self.announce(&t, txn, sc)?,
                DdlEffect::Altered(t) => {
                    let old = match before.get(&t) {
                        Some(def) if filter.captures(&t) => {
                            Some(BuiltSchema::build(sc.config, sc.filter, &t, def)?.schema)
                        }
                        _ => None,
                    };
                    self.announce(&t, txn, sc)?;
                    let new = self.built(&t, sc)?.map(|b| b.schema.clone());
                    if let (Some(old), Some(new)) = (old, new) {
                        if let Some(why) = crate::copy_for_key_change(crate::keyless_shape(&old).as_deref(), &new) {
                            tracing::info!(table = %t, reason = %why, "captured table changed its key: it is copied again");
                            txn.messages
                                .push(SourceMessage::TableRewritten(t.clone(), format!("copied again: {why}")));
                        }
                    }
                    if let Some(reason) = self.defaults_not_carried(&t, columns_before.get(&t), sc)? {
                        rewritten.push((t, reason));
                    }
                }
                DdlEffect::Rewritten { table, reason } => rewritten.push((table, reason)),
                DdlEffect::Dropped(t) => {
                    self.built.remove(&t);
                    sc.announced.remove(&t);
                    txn.messages.push(SourceMessage::TableDropped(t));
                }
                DdlEffect::Renamed { from, to } => {
                    self.built.remove(&from);
                    if sc.announced.remove(&from).is_some() {
                        txn.messages.push(SourceMessage::TableDropped(from.clone()));
                    }
                    if filter.captures(&to) {
                        self.announce(&to, txn, sc)?;
                        // The rows `to` holds were written under `from`: no
                        // event has them under the new name, so it is copied
                        // again (see `docs/schema-changes.md`).
                        if sc.config.snapshot_mode != SnapshotMode::Never {
                            let position = sc.state.binlog.clone();
                            let plan = sc.state.snapshot.get_or_insert_with(|| SnapshotState {
                                initial: false,
                                position: Some(position),
                                tables: Vec::new(),
                            });
                            plan.tables.retain(|t| t.id() != to);
                            plan.tables.push(TablePlan::new(&to));
                            self.copy_requested = true;
                            tracing::info!(from = %from, to = %to, "renamed table to be copied under its new name");
                        }
                    } else {
                        sc.state.history.remove(&to);
                    }
                }
                DdlEffect::Truncated(t) => {
                    if let Some(b) = self.built(&t, sc)? {
                        let mut e = change(b.schema.clone(), Op::Truncate, None, None, sc.ctx);
                        e.source.snapshot = SnapshotMarker::False;
                        let order = txn.count(&t);
                        e.transaction = Some(TransactionInfo {
                            id: String::new(),
                            total_order: 0,
                            data_collection_order: order,
                        });
                        txn.messages.push(SourceMessage::Change(e));
                    }
                }
            }
        }
        // One message per table, after its new shape: the runner holds the
        // table from here and copies it again while the others stream.
        let mut said: Vec<TableId> = Vec::new();
        for (table, _) in &rewritten {
            if said.contains(table) || !filter.captures(table) || sc.state.history.get(table).is_none() {
                continue;
            }
            let reasons: Vec<&str> = rewritten.iter().filter(|(t, _)| t == table).map(|(_, r)| r.as_str()).collect();
            let why = format!(
                "{} changed the rows' values without row events in the binlog: {}",
                first_word(sql).to_ascii_uppercase(),
                reasons.join("; ")
            );
            said.push(table.clone());
            if sc.config.snapshot_mode == SnapshotMode::Never {
                tracing::error!(table = %table, reason = %why, "captured table's rows changed without row events, \
                    and snapshot_mode = \"never\" cannot copy it again: the destination differs from the source \
                    until the table is copied (source-runner reset --table)");
                continue;
            }
            tracing::info!(table = %table, reason = %why, "captured table rewritten: it is copied again");
            txn.messages.push(SourceMessage::TableRewritten(table.clone(), why));
        }
        Ok(())
    }

    /// Why the columns `table` has now and had not (`before`) gave its rows
    /// a value the topic does not carry: a column the history says the rows
    /// got a default for, whose default did not decode as a value of its
    /// type (see `added_default`).
    fn defaults_not_carried(
        &mut self,
        table: &TableId,
        before: Option<&Vec<String>>,
        sc: &StreamContext<'_>,
    ) -> Result<Option<String>> {
        let (Some(before), Some(def)) = (before, sc.state.history.get(table)) else {
            return Ok(None);
        };
        let added: Vec<String> = def
            .columns
            .iter()
            .filter(|c| c.added_default.is_some() && !before.contains(&c.name))
            .map(|c| c.name.clone())
            .collect();
        let Some(b) = self.built(table, sc)? else {
            return Ok(None);
        };
        let lost: Vec<&str> = added
            .iter()
            .filter(|name| b.schema.columns.iter().any(|c| &c.name == *name && c.default.is_none()))
            .map(String::as_str)
            .collect();
        Ok((!lost.is_empty()).then(|| {
            format!("the value the rows got in added column {} is not carried as its default", lost.join(", "))
        }))
    }

    fn announce(&mut self, table: &TableId, txn: &mut OpenTxn, sc: &mut StreamContext<'_>) -> Result<()> {
        self.built.remove(table);
        if let Some(b) = self.built(table, sc)? {
            let schema = b.schema.clone();
            if sc.announced.get(table).is_none_or(|a| **a != *schema) {
                sc.announced.insert(table.clone(), schema.clone());
                txn.messages.push(SourceMessage::SchemaChanged(schema));
            }
        }
        Ok(())
    }

    /// The built schema of a captured table, from the history.
    fn built(&mut self, table: &TableId, sc: &StreamContext<'_>) -> Result<Option<&BuiltSchema>> {
        if !self.built.contains_key(table) {
            let Some(def) = sc.state.history.get(table) else {
                return Ok(None);
            };
            if !sc.filter.captures(table) {
                return Ok(None);
            }
            let b = BuiltSchema::build(sc.config, sc.filter, table, def)?;
            self.built.insert(table.clone(), b);
        }
        Ok(self.built.get(table))
    }

    fn rows(&mut self, rows: &RowsEventData<'_>, end: &BinlogPosition, sc: &mut StreamContext<'_>) -> Result<()> {
        let table_id = rows.table_id();
        let (table, tme_columns) = match self.stream.get_tme(table_id) {
            Some(tme) => {
                (TableId::new(tme.database_name().to_string(), tme.table_name().to_string()), tme.columns_count())
            }
            None => return Err(Error::retryable(format!("a rows event at {end} has no table map"))),
        };
        if !sc.filter.captures(&table) {
            return Ok(());
        }
        let op = match rows {
            RowsEventData::WriteRowsEvent(_) | RowsEventData::WriteRowsEventV1(_) => Op::Create,
            RowsEventData::UpdateRowsEvent(_) | RowsEventData::UpdateRowsEventV1(_) => Op::Update,
            RowsEventData::PartialUpdateRowsEvent(_) => {
                return Err(Error::needs_operator("a partial JSON update has no full row image")
                    .with_table(table)
                    .with_hint("SET GLOBAL binlog_row_value_options = '' (MySQL 8)"))
            }
            RowsEventData::DeleteRowsEvent(_) | RowsEventData::DeleteRowsEventV1(_) => Op::Delete,
        };
        let ctx = sc.ctx;
        let Some(built) = self.built(&table, sc)?.cloned() else {
            // Created before the history knew it, with new_tables = ignore.
            return Ok(());
        };
        let span = tracing::debug_span!("binlog_rows", table = %table);
        let _guard = span.enter();
        if tme_columns as usize != built.source_columns.len() {
            return Err(Error::permanent(format!(
                "the binlog row has {tme_columns} columns, the schema history has {} at {end}",
                built.source_columns.len()
            ))
            .with_table(table)
            .with_hint(
                "a DDL statement was missed; copy everything again: source-runner --config <source.toml> reset, \
                 then start the runner (see docs/operations.md, Reset)",
            ));
        }
        let tme = self
            .stream
            .get_tme(table_id)
            .ok_or_else(|| Error::retryable(format!("a rows event at {end} has no table map")))?;
        let decode = |row: Option<mysql_async::binlog::row::BinlogRow>| -> Result<Option<Vec<Value>>> {
            let Some(mut row) = row else { return Ok(None) };
            let mut values = vec![Value::Null; built.codecs.len()];
            for (src, dst) in built.source_columns.iter().enumerate() {
                if let Some(dst) = dst {
                    let name = &built.schema.columns[*dst].name;
                    let collation = row.columns_ref().get(src).map_or(0, |c| c.character_set());
                    values[*dst] = built.codecs[*dst].from_binlog(row.take(src), collation, &table, name)?;
                }
            }
            Ok(Some(values))
        };
        // A table about to be copied again: what this event did, its copy
        // holds (the stream reads up to the copy's point first).
        let copying = sc
            .state
            .snapshot
            .as_ref()
            .is_some_and(|p| p.tables.iter().any(|t| t.id() == table));
        let txn = self.txn.get_or_insert_with(OpenTxn::default);
        let decoded = match decode_rows(rows, tme) {
            Ok(d) => d,
            Err(e) => {
                let e = Error::permanent(format!("a binlog row at {end} cannot be decoded: {e}"));
                txn.fail(&table, &e.with_table(table.clone()), copying);
                return Ok(());
            }
        };
        let mut failed = false;
        for (before, after) in decoded {
            txn.ordinal += 1;
            let order = txn.count(&table);
            if txn.ordinal <= txn.skip || failed {
                // In Kafka already (an earlier part, before a restart), or
                // the table is paused from here.
                continue;
            }
            match decode(before).and_then(|b| Ok((b, decode(after)?))) {
                Ok((before, after)) => {
                    let mut e = change(built.schema.clone(), op, before, after, ctx);
                    e.transaction = Some(TransactionInfo {
                        id: String::new(),
                        total_order: 0,
                        data_collection_order: order,
                    });
                    txn.messages.push(SourceMessage::Change(e))
                }
                Err(e) if e.kind() == ErrorKind::Permanent => {
                    txn.fail(&table, &e, copying);
                    failed = true;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

impl OpenTxn {
    /// A change of `table` that cannot be read: the table pauses, the
    /// others go on (see [`SourceMessage::TableFailed`]); nothing when it
    /// is about to be copied again.
    fn fail(&mut self, table: &TableId, error: &Error, copying: bool) {
        if copying {
            tracing::debug!(table = %table, error = %error, "a change its coming copy holds cannot be read: skipped");
            return;
        }
        tracing::warn!(table = %table, error = %error, "a change cannot be read: the table pauses");
        self.messages.push(SourceMessage::TableFailed(table.clone(), error.to_string()));
    }
}

impl OpenTxn {
    /// The first `most` held messages of a transaction that goes out in
    /// parts, with their positions: `(start + 1, n)` for its n-th change.
    fn take_part(&mut self, most: usize) -> Vec<SourceMessage> {
        match self.start.clone() {
            Some(start) => self.hand_out(most, &start, start.ordered() + 1),
            None => self.messages.drain(..most.min(self.messages.len())).collect(),
        }
    }

    /// The first `most` held messages, each change positioned `(commit, n)`
    /// for the transaction's n-th change, with `at` as its native position:
    /// the end of a transaction handed out whole, the start of one that
    /// goes out in parts.
    fn hand_out(&mut self, most: usize, at: &BinlogPosition, commit: u64) -> Vec<SourceMessage> {
        let mut messages: Vec<SourceMessage> = self.messages.drain(..most.min(self.messages.len())).collect();
        let native: Arc<str> = at.to_string().into();
        let id = self.tx_id(at);
        for m in &mut messages {
            if let SourceMessage::Change(e) = m {
                self.emitted += 1;
                e.source.position = Position { commit, index: self.emitted };
                e.source.native_position = native.clone();
                e.source.tx_id = self.gtid.clone();
                let data_collection_order = e.transaction.as_ref().map_or(0, |t| t.data_collection_order);
                e.transaction = Some(TransactionInfo {
                    id: id.clone(),
                    total_order: i64::try_from(self.emitted).unwrap_or(i64::MAX),
                    data_collection_order,
                });
            }
        }
        messages
    }

    /// Debezium's transaction id: the GTID, else where the transaction
    /// starts in the binlog (the same for each of its parts), else `at`.
    fn tx_id(&self, at: &BinlogPosition) -> String {
        self.gtid
            .clone()
            .or_else(|| self.start.as_ref().map(ToString::to_string))
            .unwrap_or_else(|| at.to_string())
    }

    /// Counts a change of `table` read in the transaction: its
    /// `data_collection_order`.
    fn count(&mut self, table: &TableId) -> i64 {
        let n = self.per_table.entry(table.clone()).or_insert(0);
        *n += 1;
        *n
    }
}

/// A rows event's (before, after) row images, decoded by mysql_common.
///
/// mysql_common 0.37 can panic on bytes a server does not send (its DECIMAL
/// decoder multiplies and subtracts unchecked: decimal/mod.rs:261 and :424
/// under debug assertions): such an event becomes an error the caller
/// names the table in, never an unwinding runner. Its row iterator never
/// ends on an event whose rows take no bytes (no columns): every real row
/// image takes at least its NULL bitmap's byte, so more rows than the
/// event has bytes is an error, not a loop that fills memory.
///
/// A DECIMAL column whose table map gives a scale above its precision (or
/// a precision above MySQL's 65) is refused first: mysql_common sizes a
/// buffer from `precision - scale`, which wraps to exabytes in a release
/// build, and an allocation failure aborts the process (found by the
/// `binlog_rows` fuzz target).
pub fn decode_rows(rows: &RowsEventData<'_>, tme: &TableMapEvent<'_>) -> std::result::Result<Vec<RowImages>, String> {
    for i in 0..usize::try_from(tme.columns_count()).unwrap_or(usize::MAX) {
        if let Ok(Some(ColumnType::MYSQL_TYPE_NEWDECIMAL)) = tme.get_column_type(i) {
            let (precision, scale) = match tme.get_column_metadata(i) {
                Some([p, s, ..]) => (*p, *s),
                _ => (0, 1),
            };
            if scale > precision || precision > MAX_DECIMAL_PRECISION {
                return Err(format!(
                    "the table map gives column {} DECIMAL({precision},{scale}), which MySQL never writes",
                    i + 1
                ));
            }
        }
    }
    let most = rows.rows_data().len();
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut out = Vec::new();
        for row in rows.rows(tme) {
            if out.len() >= most {
                return Err(format!("the rows event holds more rows than its {most} bytes can"));
            }
            out.push(row.map_err(|e| e.to_string())?);
        }
        Ok(out)
    }))
    .map_err(|panic| {
        let text = panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        format!("the row decoder failed: {text}")
    })?
}

/// Whether the reader parses events of this type (the others only move the
/// position). mysql_common sizes some buffers of events this reader has no
/// use for from counts inside them (PREVIOUS_GTIDS: found by the
/// `binlog_rows` fuzz target), and an allocation failure aborts the process:
/// they are never parsed.
pub fn parsed_event(raw_type: u8) -> bool {
    [
        EventType::ROTATE_EVENT,
        EventType::FORMAT_DESCRIPTION_EVENT,
        EventType::QUERY_EVENT,
        EventType::XID_EVENT,
        EventType::TABLE_MAP_EVENT,
        EventType::GTID_EVENT,
        EventType::WRITE_ROWS_EVENT_V1,
        EventType::UPDATE_ROWS_EVENT_V1,
        EventType::DELETE_ROWS_EVENT_V1,
        EventType::WRITE_ROWS_EVENT,
        EventType::UPDATE_ROWS_EVENT,
        EventType::DELETE_ROWS_EVENT,
        EventType::PARTIAL_UPDATE_ROWS_EVENT,
    ]
    .iter()
    .any(|t| *t as u8 == raw_type)
}

/// MySQL's and MariaDB's largest DECIMAL precision.
const MAX_DECIMAL_PRECISION: u8 = 65;

/// A binlog row's before and after images.
pub type RowImages = (Option<BinlogRow>, Option<BinlogRow>);

fn change(
    schema: Arc<TableSchema>,
    op: Op,
    before: Option<Vec<Value>>,
    after: Option<Vec<Value>>,
    ctx: &EventContext,
) -> ChangeEvent {
    let now = now_ms();
    let db = schema.id.schema.as_str().into();
    ChangeEvent {
        schema,
        op,
        before,
        after,
        source: SourceInfo {
            connector: ctx.connector.clone(),
            name: ctx.name.clone(),
            db,
            ts_ms: now,
            snapshot: SnapshotMarker::False,
            tx_id: None,
            // Filled in when the transaction commits.
            position: Position::default(),
            native_position: Arc::from(""),
        },
        ts_ms: now,
        transaction: None,
    }
}

/// What a QUERY event says of its session: strict `sql_mode` (absent:
/// not strict, the conservative reading).
fn session_of(q: &QueryEvent<'_>) -> Session {
    use mysql_common::binlog::consts::StatusVarKey;
    use mysql_common::binlog::events::StatusVarVal;
    use mysql_common::constants::SqlMode;
    let strict = q
        .status_vars()
        .get_status_var(StatusVarKey::SqlMode)
        .and_then(|v| match v.get_value() {
            Ok(StatusVarVal::SqlMode(mode)) => Some(
                mode.get()
                    .intersects(SqlMode::MODE_STRICT_TRANS_TABLES | SqlMode::MODE_STRICT_ALL_TABLES),
            ),
            _ => None,
        })
        .unwrap_or(false);
    Session { strict }
}

fn first_word(sql: &str) -> String {
    sql.split_whitespace().next().unwrap_or("").chars().take(32).collect()
}

/// The file name of a ROTATE event without its checksum: the first,
/// artificial ROTATE of a dump comes before the FORMAT_DESCRIPTION that
/// announces the checksum algorithm, so the parser leaves the 4 checksum
/// bytes on the name. They are cut by count, never by what they look like:
/// checksum bytes can be digits or a dot (a guess by "digits after the last
/// dot" once read file 5 as 57, which made positions jump).
pub fn binlog_file_name(raw: &[u8], checksum_len: usize) -> String {
    let name = &raw[..raw.len().saturating_sub(checksum_len)];
    String::from_utf8_lossy(name).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotate_file_names_lose_trailing_checksum_bytes() {
        assert_eq!(binlog_file_name(b"mysql-bin.000004\x01\x02\x03\x04", 4), "mysql-bin.000004");
        assert_eq!(binlog_file_name(b"mysql-bin.000004", 0), "mysql-bin.000004");
        // Checksum bytes that happen to be digits or a dot (seen: file 5
        // read as 57, and as 0).
        assert_eq!(binlog_file_name(b"mysql-bin.0000057\x12\xa0\x01", 4), "mysql-bin.000005");
        assert_eq!(binlog_file_name(b"mysql-bin.000005.9\x01\x02", 4), "mysql-bin.000005");
    }
}

//! The PostgreSQL source: snapshot, then pgoutput.
//!
//! The source ([`PostgresSource`]) reads a consistent snapshot of the
//! selected tables, then streams their changes from a logical replication
//! slot through the `pgoutput` plugin. See `docs/sources/postgresql.md` for
//! the operator's view and [`snapshot`] / [`stream`] for the mechanics.
//!
//! # Checkpoint
//!
//! A [`SourceState`] as JSON: the slot, the LSN streaming resumes from (the
//! end of the last transaction emitted, or a keepalive position between
//! transactions), the captured tables and, while a snapshot is unfinished,
//! per table the key ranges with the last key emitted in each.

pub mod check;
pub mod client;
pub mod config;
pub mod objects;
pub mod snapshot;
pub mod stream;
pub mod types;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use async_trait::async_trait;
use pgwire_replication::{Lsn, ReplicationClient, ReplicationConfig, TlsConfig};
use secrecy::ExposeSecret;
use serde::{Deserialize, Serialize};
use tributary_schemas::{SnapshotMarker, TableId, TableSchema};

use self::client::classify_pg;
pub use self::client::{classify_wire, BuiltSchema, Catalog, Renames};
pub use self::config::PostgresSourceConfig;
use self::config::{ConnectionParams, NewTables, SnapshotMode, TableFilter};
use self::snapshot::{Chunk, ExportedSnapshot, SnapshotProgress, SnapshotRun, SnapshotState, SnapshotTable, TablePlan};
use self::stream::{PartialTxn, StreamContext, Streamer};
use crate::error::{Error, Result};
use crate::pgwire::quote_ident;
use crate::pgwire::tls::TlsMode;
use crate::{Checkpoint, Source, SourceBatch, SourceMessage};

pub use self::config::PostgresSourceConfig as Config;

/// The connector's name in every event (Debezium's `source.connector`).
pub const CONNECTOR: &str = "postgresql";

/// Version of the checkpoint JSON.
pub const CHECKPOINT_VERSION: u32 = 1;

/// How long a replication slot may wait for the transactions open at the
/// source before the log says who it waits for.
const SLOT_WAIT_SAID_AFTER: std::time::Duration = std::time::Duration::from_secs(10);

/// What every event of a source carries besides its row.
#[derive(Debug, Clone)]
pub struct EventContext {
    /// The connector kind (`source.connector`).
    pub connector: Arc<str>,
    /// The runner's logical name (`source.name`).
    pub name: Arc<str>,
    /// Database name (`source.db`).
    pub db: Arc<str>,
}

/// The source's resumable state, serialized as the [`Checkpoint`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceState {
    /// Format version.
    pub version: u32,
    /// Replication slot.
    pub slot: String,
    /// LSN streaming resumes from.
    pub lsn: u64,
    /// Tables captured (`schema.table`).
    #[serde(default)]
    pub tables: BTreeSet<String>,
    /// Snapshot work not done yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<SnapshotState>,
    /// The part of the transaction at `lsn` already emitted, when the last
    /// batch ended inside a transaction larger than a batch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub txn: Option<PartialTxn>,
    /// The epoch of the positions: the cluster's system identifier
    /// (`pg_control_system()`). Another one at start means another
    /// cluster (restored from a dump, a new server): its LSNs do not
    /// compare with the checkpoint's. A slot dropped and made again on the
    /// same cluster is no change (LSNs only grow there). Absent in
    /// checkpoints written before epochs: the first start adopts the
    /// cluster's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<String>,
    /// The captured tables without a key (`schema.table`), each with the
    /// types of its columns as its rows were last copied or streamed
    /// ([`crate::keyless_shape`]): a table that gains or loses its key, or
    /// whose rows' content a column change alters, is copied again
    /// ([`crate::copy_for_key_change`]), also when the change happened
    /// while the source was away. A table captured without a key by a
    /// checkpoint written before this field is copied again once.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub keyless: BTreeMap<String, Vec<String>>,
}

impl SourceState {
    /// Records the shape `schema` gives the table's rows ([`Self::keyless`]).
    fn note_shape(&mut self, schema: &TableSchema) {
        let table = schema.id.to_string();
        match crate::keyless_shape(schema) {
            Some(shape) => {
                self.keyless.insert(table, shape);
            }
            None => {
                self.keyless.remove(&table);
            }
        }
    }

    /// After each announced shape of a table not being copied, a
    /// [`SourceMessage::TableRewritten`] when its key changed or, without
    /// a key, its rows' content ([`crate::copy_for_key_change`]): its rows
    /// are copied again in the new shape.
    fn copy_for_key_changes(&mut self, messages: Vec<SourceMessage>) -> Vec<SourceMessage> {
        if !messages.iter().any(|m| matches!(m, SourceMessage::SchemaChanged(_))) {
            return messages;
        }
        let copying: Vec<TableId> = self.snapshot.iter().flat_map(|s| s.tables.iter().map(TablePlan::id)).collect();
        let mut out = Vec::with_capacity(messages.len() + 1);
        for m in messages {
            let SourceMessage::SchemaChanged(schema) = &m else {
                out.push(m);
                continue;
            };
            let table = schema.id.to_string();
            if !self.tables.contains(&table) || copying.contains(&schema.id) {
                self.note_shape(schema);
                out.push(m);
                continue;
            }
            let why = crate::copy_for_key_change(self.keyless.get(&table).map(Vec::as_slice), schema);
            self.note_shape(schema);
            let id = schema.id.clone();
            out.push(m);
            if let Some(why) = why {
                tracing::info!(table = %id, reason = %why, "captured table changed its key: it is copied again");
                out.push(SourceMessage::TableRewritten(id, format!("copied again: {why}")));
            }
        }
        out
    }

    /// Serializes the state.
    pub fn to_checkpoint(&self) -> Checkpoint {
        Checkpoint::encode(self)
    }

    /// Parses a checkpoint written by this source.
    pub fn from_checkpoint(checkpoint: &Checkpoint) -> Result<Self> {
        checkpoint.decode("PostgreSQL", |s: &SourceState| s.version, CHECKPOINT_VERSION)
    }
}

/// `0/16B3748`.
pub fn format_lsn(lsn: u64) -> String {
    format!("{:X}/{:X}", lsn >> 32, lsn & 0xffff_ffff)
}

/// Parses `0/16B3748`.
pub fn parse_lsn(text: &str) -> Option<u64> {
    let (hi, lo) = text.split_once('/')?;
    Some(u64::from_str_radix(hi, 16).ok()? << 32 | u64::from_str_radix(lo, 16).ok()?)
}

/// A running snapshot. A chunk that ends a key range may hold the very
/// last row of the snapshot (which is marked as such), so it is held back
/// until the next chunk or the end of the run says whether it does. Other
/// chunks go out at once: holding every chunk back would keep one more
/// chunk (several MiB) in memory for the whole snapshot.
struct ActiveSnapshot {
    run: SnapshotRun,
    pending: Option<(Chunk, Checkpoint)>,
    /// A chunk that arrived while one was held back: it goes next.
    ready: Option<(Chunk, Checkpoint)>,
}

impl ActiveSnapshot {
    /// Marks table `table` of the run done if every segment of it is read
    /// (`complete`) and none of its rows waits as the pending chunk: a
    /// table is done for the runner (which then sends its table-copied
    /// record) once its last rows are given out, not when they are read.
    fn mark_done_if_given_out(&self, progress: &SnapshotProgress, complete: &[bool], table: usize) {
        let held = self.pending.as_ref().is_some_and(|(p, _)| p.table == table);
        // A verification is not a copy: no progress of it shows.
        let verifying = self.run.tables[table].plan.verify.is_some();
        if complete[table] && !held && !verifying {
            snapshot::mark_table_done(progress, &self.run.tables[table].schema.id);
        }
    }
}

/// What the runner has seen: state, announced schemas and renames as of
/// the last batch returned.
#[derive(Clone)]
struct Emitted {
    state: SourceState,
    announced: HashMap<TableId, Arc<TableSchema>>,
    renames: Arc<Renames>,
}

/// The PostgreSQL source.
pub struct PostgresSource {
    config: PostgresSourceConfig,
    params: ConnectionParams,
    filter: TableFilter,
    ctx: EventContext,
    progress: Arc<SnapshotProgress>,
    state: Option<SourceState>,
    catalog: Option<Catalog>,
    announced: HashMap<TableId, Arc<TableSchema>>,
    prelude: Vec<SourceMessage>,
    snapshot: Option<ActiveSnapshot>,
    streamer: Option<Streamer>,
    /// The consistent point of a snapshot started while the stream was
    /// behind it: the stream is read up to this LSN before the snapshot's
    /// first row goes out (see the `snapshot` module).
    catch_up: Option<u64>,
    acked_lsn: u64,
    /// This process created the slot and no checkpoint of it was made
    /// durable yet: a start without a checkpoint (the first batch failed
    /// and is retried) may drop it and begin again.
    slot_created_here: bool,
    /// State, announced schemas and renames as of the last batch returned: what
    /// `next_batch` rolls back to after an error, so that a retried call
    /// continues exactly after what the runner has seen.
    emitted: Option<Emitted>,
    /// Why the last start found the checkpoint in another position domain
    /// (see [`Source::domain_change`]).
    domain_change: Option<String>,
    /// The next start starts over (see [`Source::start_over`]).
    start_over: bool,
    /// The captured tables' sequences as last sent, and when they are read
    /// next (see [`PostgresSource::sequences_moved`]).
    sequences: SequencesSent,
    /// The copied tables' objects as last sent, and when they are read
    /// next (see [`PostgresSource::objects_moved`]).
    objects: crate::source::objects::ObjectsSent,
    /// The runner's wake-up between batches (see [`Source::set_wake`]).
    wake: Option<Arc<tokio::sync::Notify>>,
}

/// The sequences a source sent, and when it reads them again.
#[derive(Debug, Default)]
struct SequencesSent {
    /// When they are read next (`None`: at the next batch).
    next_read: Option<std::time::Instant>,
    /// Each sequence's state as last sent.
    sent: HashMap<TableId, tributary_schemas::SequenceState>,
    /// Sequences this role may not read, warned about once.
    unreadable: std::collections::HashSet<TableId>,
}

impl std::fmt::Debug for PostgresSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresSource")
            .field("slot", &self.config.slot_name)
            .field("params", &self.params)
            .finish_non_exhaustive()
    }
}

impl PostgresSource {
    /// A source for `config`; `runner_name` is the runner's logical name
    /// (`source.name` of every event). Nothing connects before
    /// [`Source::start`].
    pub fn new(config: PostgresSourceConfig, runner_name: impl Into<String>) -> Result<Self> {
        config
            .validate_as("postgres")
            .map_err(|e| Error::needs_operator(e.to_string()))?;
        let params = config.connection()?;
        let filter = config.filter();
        let ctx = EventContext {
            connector: Arc::from(CONNECTOR),
            name: Arc::from(runner_name.into()),
            db: params.database.as_str().into(),
        };
        Ok(Self {
            config,
            params,
            filter,
            ctx,
            progress: Arc::new(SnapshotProgress::default()),
            state: None,
            catalog: None,
            announced: HashMap::new(),
            prelude: Vec::new(),
            snapshot: None,
            streamer: None,
            catch_up: None,
            acked_lsn: 0,
            slot_created_here: false,
            emitted: None,
            domain_change: None,
            start_over: false,
            sequences: SequencesSent::default(),
            objects: crate::source::objects::ObjectsSent::default(),
            wake: None,
        })
    }

    /// Snapshot progress, readable at any time (the runner's status API).
    pub fn progress(&self) -> Arc<SnapshotProgress> {
        self.progress.clone()
    }

    /// The configuration.
    pub fn config(&self) -> &PostgresSourceConfig {
        &self.config
    }

    fn replication_config(&self, start: u64, ack: u64) -> ReplicationConfig {
        let p = &self.params;
        let mut cfg = ReplicationConfig::new(
            p.host.clone(),
            p.user.clone(),
            p.password.expose_secret().to_string(),
            p.database.clone(),
            self.config.slot_name.clone(),
            self.config.publication_name.clone(),
        )
        .with_port(p.port)
        .with_start_lsn(Lsn::from_u64(start))
        .with_ack_lsn(Lsn::from_u64(ack))
        .with_options(config::SESSION_OPTIONS)
        .with_application_name(format!("tributary-{}", self.config.slot_name))
        .with_status_interval(std::time::Duration::from_secs(1))
        .with_buffer_size(1024);
        cfg = cfg.with_tls(match p.tls {
            TlsMode::Disable => TlsConfig::disabled(),
            TlsMode::Require => TlsConfig::require(),
            TlsMode::VerifyCa => TlsConfig::verify_ca(p.tls_ca_file.clone().map(Into::into)),
            TlsMode::VerifyFull => TlsConfig::verify_full(p.tls_ca_file.clone().map(Into::into)),
        });
        cfg
    }

    fn state_mut(&mut self) -> Result<&mut SourceState> {
        self.state.as_mut().ok_or_else(|| Error::retryable("the source is not started"))
    }

    fn reset(&mut self) {
        self.snapshot = None;
        self.streamer = None;
        self.catch_up = None;
        self.catalog = None;
        self.state = None;
        self.announced.clear();
        self.prelude.clear();
        self.emitted = None;
        self.domain_change = None;
    }

    /// Announces the schema of `table` (a `SchemaChanged` before its first
    /// row) and returns it.
    async fn announce(&mut self, table: &TableId) -> Result<Option<BuiltSchema>> {
        let catalog = self
            .catalog
            .as_mut()
            .ok_or_else(|| Error::retryable("the source is not started"))?;
        let Some(relid) = catalog.relid(table).await? else {
            return Ok(None);
        };
        let built = catalog.build_schema(&self.config, &self.filter, table, relid, None).await?;
        self.announced.insert(table.clone(), built.schema.clone());
        self.prelude.push(SourceMessage::SchemaChanged(built.schema.clone()));
        Ok(Some(built))
    }

    /// Creates a slot on a gated replication session; returns the session
    /// (holding the exported snapshot, if any, and a temporary slot), the
    /// consistent point and the snapshot name.
    /// The oldest transactions open at the source with a transaction id
    /// (what a new slot waits for): pid, role, state and age, never their
    /// statements (which may hold values).
    async fn open_transactions(&self) -> String {
        let Some(catalog) = self.catalog.as_ref() else {
            return "unknown (not connected)".to_string();
        };
        let sql = "SELECT coalesce(string_agg(format('pid %s (%s, %s, open %s s)', pid, coalesce(usename, '?'), \
                   coalesce(state, '?'), extract(epoch FROM now() - xact_start)::bigint), '; '), 'none seen') \
                   FROM (SELECT * FROM pg_stat_activity WHERE backend_xid IS NOT NULL AND pid <> pg_backend_pid() \
                   ORDER BY xact_start LIMIT 5) a";
        match catalog.client().query_one(sql, &[]).await {
            Ok(row) => row.try_get::<_, String>(0).unwrap_or_else(|e| e.to_string()),
            Err(e) => format!("unknown ({e})"),
        }
    }

    async fn create_slot(
        &self,
        name: &str,
        temporary: bool,
        export: bool,
    ) -> Result<(ReplicationClient, u64, Option<String>)> {
        let mut gated = ReplicationClient::connect_gated(self.replication_config(0, 0))
            .await
            .map_err(|e| classify_wire(e, "opening a replication connection"))?;
        let sql = format!(
            "CREATE_REPLICATION_SLOT {} {}LOGICAL pgoutput {}",
            quote_ident(name),
            if temporary { "TEMPORARY " } else { "" },
            if export { "EXPORT_SNAPSHOT" } else { "NOEXPORT_SNAPSHOT" }
        );
        // PostgreSQL makes a slot only at a point no running transaction
        // straddles: one left open elsewhere (idle in transaction) holds the
        // copy back for as long as it stays open. Said, with who holds it.
        let mut said = false;
        let done = {
            let query = gated.simple_query(&sql);
            tokio::pin!(query);
            loop {
                tokio::select! {
                    r = &mut query => break r,
                    _ = tokio::time::sleep(SLOT_WAIT_SAID_AFTER), if !said => {
                        said = true;
                        let open = self.open_transactions().await;
                        tracing::warn!(
                            slot = name,
                            waiting_for = %open,
                            "the replication slot waits for the transactions open at the source to end; the copy \
                             starts once they do"
                        );
                    }
                }
            }
        };
        if said {
            tracing::info!(slot = name, "the replication slot is made");
        }
        let rows = done.map_err(|e| {
            let e = classify_wire(e, "creating a replication slot");
            if temporary {
                e.with_hint(format!(
                    "a snapshot after the first one (a resume, or a new table) needs one free replication \
                     slot for a moment (temporary slot {name}); raise max_replication_slots if all are in use"
                ))
            } else {
                e
            }
        })?;
        let row = rows
            .first()
            .ok_or_else(|| Error::retryable("CREATE_REPLICATION_SLOT returned no row"))?;
        let text = |i: usize| {
            row.get(i)
                .and_then(|v| v.as_ref())
                .map(|b| String::from_utf8_lossy(b).into_owned())
        };
        let lsn = text(1)
            .as_deref()
            .and_then(parse_lsn)
            .ok_or_else(|| Error::retryable("CREATE_REPLICATION_SLOT returned no consistent point"))?;
        Ok((gated, lsn, text(2)))
    }

    async fn drop_slot(&self) -> Result<()> {
        let catalog = self
            .catalog
            .as_ref()
            .ok_or_else(|| Error::retryable("the source is not started"))?;
        let what = "dropping a replication slot without checkpoint";
        catalog
            .bounded(what, async {
                catalog
                    .client()
                    .execute("SELECT pg_drop_replication_slot($1)", &[&self.config.slot_name])
                    .await
                    .map_err(|e| classify_pg(e, what))
            })
            .await?;
        Ok(())
    }

    async fn slot_exists(&self) -> Result<bool> {
        let catalog = self
            .catalog
            .as_ref()
            .ok_or_else(|| Error::retryable("the source is not started"))?;
        let what = "reading replication slots";
        let row = catalog
            .bounded(what, async {
                catalog
                    .client()
                    .query_opt(
                        // wal_status (PostgreSQL 13+) through to_jsonb, so
                        // older servers answer NULL instead of failing.
                        "SELECT plugin::text, database::text, to_jsonb(s) ->> 'wal_status' \
                         FROM pg_replication_slots s WHERE slot_name = $1",
                        &[&self.config.slot_name],
                    )
                    .await
                    .map_err(|e| classify_pg(e, what))
            })
            .await?;
        match row {
            None => Ok(false),
            Some(r) => {
                let plugin: Option<String> = r.get(0);
                let db: Option<String> = r.get(1);
                if plugin.as_deref() != Some("pgoutput") || db.as_deref() != Some(self.params.database.as_str()) {
                    return Err(Error::needs_operator(format!(
                        "replication slot {} exists but is not a pgoutput slot of database {}",
                        self.config.slot_name, self.params.database
                    ))
                    .with_hint(format!(
                        "choose another postgres.slot_name, or SELECT pg_drop_replication_slot('{}');",
                        self.config.slot_name
                    )));
                }
                let wal_status: Option<String> = r.get(2);
                if wal_status.as_deref() == Some("lost") {
                    return Err(client::lost_slot_error(&self.config.slot_name));
                }
                Ok(true)
            }
        }
    }

    /// Starts (or resumes) the snapshot recorded in the state, in `exported`
    /// (the main slot's, on a first start) or else in a snapshot exported by
    /// a temporary slot. In the latter case the stream must first catch up
    /// to that slot's consistent point ([`PostgresSource::catch_up`]).
    async fn start_snapshot_run(&mut self, exported: Option<ExportedSnapshot>) -> Result<()> {
        let plan = self
            .state
            .as_ref()
            .and_then(|s| s.snapshot.clone())
            .ok_or_else(|| Error::retryable("no snapshot to run"))?;
        // New tables join the publication before their snapshot, so every
        // change after it is streamed.
        let catalog = self
            .catalog
            .as_ref()
            .ok_or_else(|| Error::retryable("the source is not started"))?;
        // Only tables that still exist and are selectable (not partitions).
        let selectable: BTreeSet<TableId> =
            catalog.list_tables(&self.filter).await?.into_iter().map(|(_, id)| id).collect();
        let plan = SnapshotState {
            tables: plan
                .tables
                .into_iter()
                .filter(|t| {
                    let keep = selectable.contains(&t.id());
                    if !keep {
                        tracing::warn!(table = %t.id(), "not snapshotting a table that is gone or is a partition");
                    }
                    keep
                })
                .collect(),
            ..plan
        };
        let ids: Vec<TableId> = plan.tables.iter().map(TablePlan::id).collect();
        catalog
            .bounded("preparing the tables to copy", async {
                if exported.is_none() {
                    // Tables created (or renamed) since the start get what
                    // the tables present then got, before they are published.
                    check::ensure_full_before_images(catalog.client(), &ids).await?;
                }
                check::ensure_publication(catalog.client(), &self.config, &ids).await
            })
            .await?;
        let mut tables = Vec::with_capacity(plan.tables.len());
        for t in plan.tables {
            let id = t.id();
            let catalog = self
                .catalog
                .as_mut()
                .ok_or_else(|| Error::retryable("the source is not started"))?;
            let Some(relid) = catalog.relid(&id).await? else {
                tracing::warn!(table = %id, "table to snapshot no longer exists; skipping it");
                continue;
            };
            let built = catalog.build_schema(&self.config, &self.filter, &id, relid, None).await?;
            if t.verify.is_some() {
                if let Some(why) = unverifiable(&built.schema) {
                    tracing::warn!(table = %id, "the table is not verified: {why}");
                    continue;
                }
            } else if !built.keyed && t.segments.iter().any(|s| s.started && !s.done) {
                // A table without a key has no resume point, and its rows
                // no name the copy's rows could overwrite: it is copied
                // again whole, with a reset first and a sweep after, as a
                // rewritten table is (its changes held back meanwhile).
                tracing::info!(table = %id, "the copy of a table without a key stopped part-way: copying it again");
                self.announced.insert(id.clone(), built.schema.clone());
                self.prelude.push(SourceMessage::SchemaChanged(built.schema.clone()));
                self.prelude.push(SourceMessage::TableRewritten(
                    id.clone(),
                    "its copy stopped part-way, and a table without a key cannot resume one".to_string(),
                ));
                continue;
            }
            // The copy's rows are of the shape it reads them in.
            self.state_mut()?.note_shape(&built.schema);
            // Rows carry the schema they were read with; announce it unless
            // it is the one announced last.
            if self.announced.get(&id).is_none_or(|a| **a != *built.schema) {
                self.announced.insert(id.clone(), built.schema.clone());
                self.prelude.push(SourceMessage::SchemaChanged(built.schema.clone()));
            }
            tables.push(SnapshotTable {
                schema: built.schema,
                keyed: built.keyed,
                partitioned: built.partitioned,
                plan: t,
            });
        }
        let initial = exported.is_some();
        let (exporter, snapshot) = match exported {
            Some(e) => (None, e),
            None => {
                let (gated, lsn, name) = self.create_slot(&self.temporary_slot_name(), true, true).await?;
                let name = name.ok_or_else(|| Error::retryable("the temporary slot exported no snapshot"))?;
                // A message after the consistent point: the catching-up
                // stream sees it and knows it is there, even when no
                // transaction follows.
                let catalog = self.catalog.as_ref().ok_or_else(|| Error::retryable("not connected"))?;
                let what = "writing the snapshot fence message";
                catalog
                    .bounded(what, async {
                        catalog
                            .client()
                            .execute("SELECT pg_logical_emit_message(false, $1, '')", &[&stream::FENCE_MESSAGE_PREFIX])
                            .await
                            .map_err(|e| classify_pg(e, what))
                    })
                    .await?;
                (Some(gated), ExportedSnapshot { name, lsn })
            }
        };
        let lsn = snapshot.lsn;
        let run = SnapshotRun::start(
            &self.params,
            tables,
            snapshot,
            self.config.snapshot_parallelism,
            self.config.snapshot_chunk_rows,
            self.ctx.clone(),
            self.progress.clone(),
        )
        .await;
        // Every worker imported the snapshot (or failed): the exporting
        // session, and with it the temporary slot, may end.
        drop(exporter);
        let run = run?;
        let state = self.state_mut()?;
        let behind = state.lsn < lsn;
        if let Some(snap) = state.snapshot.as_mut() {
            snap.tables = run.tables.iter().map(|t| t.plan.clone()).collect();
        }
        tracing::info!(
            tables = run.tables.len(),
            lsn = %format_lsn(run.lsn),
            initial,
            "snapshot started"
        );
        self.snapshot = Some(ActiveSnapshot { run, pending: None, ready: None });
        self.catch_up = behind.then_some(lsn);
        Ok(())
    }

    /// The temporary slot of later snapshots: the main slot's name with a
    /// suffix, within PostgreSQL's 63 bytes.
    fn temporary_slot_name(&self) -> String {
        const SUFFIX: &str = "_snapshot";
        let base: String = self.config.slot_name.chars().take(63 - SUFFIX.len()).collect();
        format!("{base}{SUFFIX}")
    }

    async fn open_stream(&mut self) -> Result<()> {
        // The stream closed just before (a copy or verification caught up
        // to its point) may hold the slot a moment longer: its walsender
        // ends after the connection does. Waited for here rather than by a
        // restart from the checkpoint, which would drop what was asked
        // since (a verification, not yet in a checkpoint).
        let deadline = std::time::Instant::now() + SLOT_RELEASE_WAIT;
        loop {
            match self.open_stream_once().await {
                Err(e) if e.to_string().contains("SQLSTATE 55006") && std::time::Instant::now() < deadline => {
                    tracing::debug!(error = %e, "the slot is still held by the stream closed before; waiting");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
                other => return other,
            }
        }
    }

    async fn open_stream_once(&mut self) -> Result<()> {
        let state = self
            .state
            .as_ref()
            .ok_or_else(|| Error::retryable("the source is not started"))?;
        // Only what the runner acknowledged may be reported as flushed.
        let ack = self.acked_lsn.min(state.lsn);
        let mut client = ReplicationClient::connect(self.replication_config(state.lsn, ack))
            .await
            .map_err(|e| classify_wire(e, "opening the replication stream"))?;
        client
            .wait_started()
            .await
            .map_err(|e| classify_wire(e, "starting replication"))?;
        tracing::info!(slot = %self.config.slot_name, lsn = %format_lsn(state.lsn), "streaming started");
        self.streamer = Some(Streamer::new(client, state.lsn, state.txn));
        Ok(())
    }

    /// A snapshot chunk as a batch, after any schema announcements waiting.
    fn chunk_batch(&mut self, chunk: Chunk, checkpoint: Checkpoint) -> SourceBatch {
        let mut messages = std::mem::take(&mut self.prelude);
        messages.extend(chunk.messages);
        SourceBatch { messages, checkpoint }
    }

    async fn next_snapshot_batch(&mut self) -> Result<Option<SourceBatch>> {
        loop {
            let Some(active) = self.snapshot.as_mut() else {
                return Ok(None);
            };
            if let Some((chunk, checkpoint)) = active.ready.take() {
                return Ok(Some(self.chunk_batch(chunk, checkpoint)));
            }
            match active.run.next_chunk().await? {
                Some(chunk) => {
                    let state = self
                        .state
                        .as_mut()
                        .ok_or_else(|| Error::retryable("the source is not started"))?;
                    let snap = state
                        .snapshot
                        .as_mut()
                        .ok_or_else(|| Error::retryable("snapshot state missing"))?;
                    let seg = &mut snap.tables[chunk.table].segments[chunk.segment];
                    if chunk.last.is_some() {
                        seg.last = chunk.last.clone();
                    }
                    seg.done |= chunk.done;
                    seg.started |= !chunk.messages.is_empty();
                    // The chunk that ends a table waits below as the
                    // pending one: the table is done once it is given out.
                    let complete: Vec<bool> = snap.tables.iter().map(|t| t.segments.iter().all(|s| s.done)).collect();
                    if chunk.messages.is_empty() {
                        active.mark_done_if_given_out(&self.progress, &complete, chunk.table);
                        continue;
                    }
                    // Only a chunk that ends its key range can be the last:
                    // it waits; a held one goes out first.
                    let may_be_last = chunk.done;
                    let current = (chunk, state.to_checkpoint());
                    let (chunk, checkpoint) = match active.pending.take() {
                        Some(prev) => {
                            if may_be_last {
                                active.pending = Some(current);
                            } else {
                                active.ready = Some(current);
                            }
                            prev
                        }
                        None if may_be_last => {
                            active.pending = Some(current);
                            continue;
                        }
                        None => current,
                    };
                    active.mark_done_if_given_out(&self.progress, &complete, chunk.table);
                    return Ok(Some(self.chunk_batch(chunk, checkpoint)));
                }
                None => {
                    let pending = active.pending.take();
                    // The held chunk ends its table: done once given out.
                    if let Some((chunk, _)) = &pending {
                        let t = &active.run.tables[chunk.table];
                        if t.plan.verify.is_none() {
                            snapshot::mark_table_done(&self.progress, &t.schema.id);
                        }
                    }
                    let initial = self.state.as_ref().and_then(|s| s.snapshot.as_ref()).is_some_and(|s| s.initial);
                    // What was asked while the run read (a copy again, a
                    // verification, a repair: plans not planned yet) and
                    // each repaired table's verification run next.
                    let verify_repaired: Vec<TablePlan> = active
                        .run
                        .tables
                        .iter()
                        .filter(|t| t.plan.repair.is_some())
                        .filter_map(|t| t.plan.verify.map(|v| TablePlan::verify(&t.schema.id, v, t.plan.verify_rate)))
                        .collect();
                    self.snapshot = None;
                    let state = self.state_mut()?;
                    let mut next: Vec<TablePlan> = state
                        .snapshot
                        .take()
                        .map(|s| s.tables.into_iter().filter(|p| p.segments.is_empty()).collect())
                        .unwrap_or_default();
                    for v in verify_repaired {
                        if !next.iter().any(|p| p.id() == v.id()) {
                            next.push(v);
                        }
                    }
                    state.snapshot = (!next.is_empty()).then_some(SnapshotState { initial: false, tables: next });
                    let checkpoint = state.to_checkpoint();
                    let mut messages = std::mem::take(&mut self.prelude);
                    if let Some((mut chunk, _)) = pending {
                        if initial {
                            if let Some(SourceMessage::Change(e)) = chunk.messages.last_mut() {
                                e.source.snapshot = SnapshotMarker::Last;
                            }
                        }
                        messages.extend(chunk.messages);
                    }
                    tracing::info!("snapshot finished");
                    return Ok(Some(SourceBatch { messages, checkpoint }));
                }
            }
        }
    }
}

/// Why a table cannot be verified by key ranges, if it cannot: a key
/// column whose type orders differently between databases. (A table
/// without a key is verified by its rows' content keys.)
fn unverifiable(schema: &TableSchema) -> Option<String> {
    schema
        .key_indexes()
        .into_iter()
        .map(|k| &schema.columns[k])
        .find(|c| !tributary_schemas::canonical::orders_everywhere(&c.data_type))
        .map(|c| format!("its key column {} is of type {}, whose order differs between databases", c.name, c.data_type))
}

/// How long opening the stream waits for the slot to be released by the
/// stream closed before it.
const SLOT_RELEASE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// The cluster's system identifier: the epoch of its LSNs.
async fn system_identifier(client: &tokio_postgres::Client) -> Result<String> {
    let row = client
        .query_one("SELECT system_identifier::text FROM pg_control_system()", &[])
        .await
        .map_err(|e| classify_pg(e, "reading the cluster's system identifier"))?;
    row.try_get::<_, Option<String>>(0)
        .ok()
        .flatten()
        .ok_or_else(|| Error::retryable("pg_control_system() returned no system identifier"))
}

/// The needs-operator error of a start without a checkpoint while the slot
/// exists: the runner's checkpoint is lost.
pub fn checkpoint_lost_error(slot: &str) -> Error {
    Error::needs_operator(format!(
        "replication slot {slot} exists but the source runner has no checkpoint (its offsets topic is gone or \
         empty): the position the copy reached is lost, and snapshotting again would leave rows deleted at the \
         source meanwhile in the destination for ever"
    ))
    .with_class("tributary.checkpoint_lost")
    .with_hint(format!(
        "either (1) restore the runner's offsets topic (<prefix>.tributary.offsets, compacted) with its last \
         checkpoint and start again: the copy resumes from it; or (2) copy everything again: source-runner \
         --config <source.toml> reset, then start the runner: every table is copied again from slot {slot} and \
         the destination rows the new copy does not see are removed (see docs/operations.md, Reset)"
    ))
}

#[async_trait]
impl Source for PostgresSource {
    async fn start(&mut self, checkpoint: Option<Checkpoint>) -> Result<()> {
        // Column renames are kept for the life of the process.
        let renames = self.catalog.as_ref().map(Catalog::renames);
        self.reset();
        let resumed = checkpoint.as_ref().map(SourceState::from_checkpoint).transpose()?;
        if let Some(s) = &resumed {
            if s.slot != self.config.slot_name {
                return Err(Error::needs_operator(format!(
                    "the checkpoint belongs to slot {}, the config names slot {}",
                    s.slot, self.config.slot_name
                ))
                .with_hint("restore postgres.slot_name, or reset the runner's checkpoint to start a new copy"));
            }
        }
        let mut catalog = Catalog::connect(&self.params).await?;
        if let Some(r) = renames {
            catalog.set_renames(r);
        }
        let epoch = catalog
            .bounded("reading the cluster's system identifier", system_identifier(catalog.client()))
            .await?;
        self.catalog = Some(catalog);
        if std::mem::take(&mut self.start_over) {
            self.domain_change = Some("every table is copied again, as asked (source-runner reset)".to_string());
        } else if let Some(theirs) = resumed.as_ref().and_then(|s| s.epoch.as_ref()).filter(|e| **e != epoch) {
            self.domain_change = Some(format!(
                "the source database's system identifier is {epoch}, the checkpoint's {theirs}: another cluster \
                 (restored from a dump, or a new server), whose LSNs do not compare with those the copy holds"
            ));
        }
        let slot_exists = match self.slot_exists().await {
            // Starting over: a slot PostgreSQL invalidated is of no use.
            Err(e) if self.domain_change.is_some() && e.class() == "tributary.slot_lost" => {
                tracing::warn!(slot = %self.config.slot_name, "dropping the invalidated slot to start over");
                self.drop_slot().await?;
                false
            }
            other => other?,
        };
        if resumed.is_some() && !slot_exists && self.domain_change.is_none() {
            return Err(Error::needs_operator(format!(
                "replication slot {} does not exist, so the changes since the checkpoint are lost",
                self.config.slot_name
            ))
            .with_hint(
                "copy everything again: source-runner --config <source.toml> reset, then start the runner: the slot \
                 is made again, every table copied again, and the destination rows the new copy does not see are \
                 removed (see docs/operations.md, Reset)",
            ));
        }
        let catalog = self.catalog.as_ref().ok_or_else(|| Error::retryable("not connected"))?;
        let selected: Vec<TableId> = catalog.list_tables(&self.filter).await?.into_iter().map(|(_, id)| id).collect();
        catalog
            .bounded("checking the role, the publication and the tables", async {
                check::require_select(catalog.client(), &self.params.user, &selected).await?;
                check::ensure_publication(catalog.client(), &self.config, &selected).await?;
                check::ensure_full_before_images(catalog.client(), &selected).await?;
                if self.config.install_ddl_trigger {
                    check::install_ddl_trigger(catalog.client()).await?;
                }
                Ok(())
            })
            .await?;

        match resumed {
            _ if self.domain_change.is_some() => {
                self.start_in_new_domain(slot_exists, &selected, epoch).await?;
            }
            None => {
                if slot_exists && self.slot_created_here {
                    // Made by this process, nothing of it durable yet (the
                    // first batch failed and is retried): begin again.
                    tracing::info!(slot = %self.config.slot_name, "dropping the slot this runner made before its first checkpoint");
                    self.drop_slot().await?;
                    self.slot_created_here = false;
                } else if slot_exists {
                    // The slot has been streamed from, but the checkpoint
                    // that says how far is gone (the offsets topic was
                    // deleted or emptied). Starting over would snapshot
                    // again and leave the rows deleted meanwhile in every
                    // destination for ever: an operator decides.
                    return Err(checkpoint_lost_error(&self.config.slot_name));
                }
                let mut tables = BTreeSet::new();
                for id in &selected {
                    if self.announce(id).await?.is_some() {
                        tables.insert(id.to_string());
                    }
                }
                match self.config.snapshot_mode {
                    SnapshotMode::Initial => {
                        let (gated, lsn, name) = self.create_slot(&self.config.slot_name, false, true).await?;
                        self.slot_created_here = true;
                        let name = name.ok_or_else(|| Error::retryable("the slot exported no snapshot"))?;
                        self.state = Some(SourceState {
                            version: CHECKPOINT_VERSION,
                            slot: self.config.slot_name.clone(),
                            lsn,
                            tables,
                            snapshot: Some(SnapshotState {
                                initial: true,
                                tables: selected.iter().map(TablePlan::new).collect(),
                            }),
                            txn: None,
                            epoch: Some(epoch),
                            keyless: BTreeMap::new(),
                        });
                        self.acked_lsn = lsn;
                        let started = self.start_snapshot_run(Some(ExportedSnapshot { name, lsn })).await;
                        // Every worker imported the snapshot (or failed):
                        // the exporting session may end.
                        drop(gated);
                        started?;
                    }
                    SnapshotMode::Never => {
                        let (gated, lsn, _) = self.create_slot(&self.config.slot_name, false, false).await?;
                        self.slot_created_here = true;
                        drop(gated);
                        self.state = Some(SourceState {
                            version: CHECKPOINT_VERSION,
                            slot: self.config.slot_name.clone(),
                            lsn,
                            tables,
                            snapshot: None,
                            txn: None,
                            epoch: Some(epoch),
                            keyless: BTreeMap::new(),
                        });
                        self.acked_lsn = lsn;
                    }
                }
            }
            Some(mut state) => {
                let pending: BTreeSet<TableId> =
                    state.snapshot.iter().flat_map(|s| s.tables.iter().map(TablePlan::id)).collect();
                for id in &selected {
                    if state.tables.contains(&id.to_string()) && !pending.contains(id) {
                        self.announce(id).await?;
                    }
                }
                // Listed again after the captured tables were announced (each
                // rename tracked from then on): a table renamed or dropped
                // while the source was away, or in between, is gone under
                // its old name and, when selected, appears under its new one.
                let catalog = self.catalog.as_ref().ok_or_else(|| Error::retryable("not connected"))?;
                let selected: Vec<TableId> =
                    catalog.list_tables(&self.filter).await?.into_iter().map(|(_, id)| id).collect();
                let vanished: Vec<String> = state
                    .tables
                    .iter()
                    .filter(|t| !selected.iter().any(|id| id.to_string() == **t))
                    .filter(|t| !pending.iter().any(|id| id.to_string() == **t))
                    .cloned()
                    .collect();
                for t in vanished {
                    let id = match self.announced.keys().find(|id| id.to_string() == t).cloned() {
                        Some(id) => Some(id),
                        None => t.split_once('.').map(|(s, n)| TableId::new(s, n)),
                    };
                    if let Some(id) = id {
                        tracing::info!(table = %id, "captured table gone (dropped or renamed) while the source was away");
                        self.announced.remove(&id);
                        self.prelude.push(SourceMessage::TableDropped(id));
                    }
                    state.tables.remove(&t);
                }
                for id in &selected {
                    let known = state.tables.contains(&id.to_string());
                    if !known && !pending.contains(id) && self.config.new_tables == NewTables::Capture {
                        // Created while the source was away: snapshot it.
                        tracing::info!(table = %id, "table appeared while the source was stopped");
                        state.tables.insert(id.to_string());
                        state
                            .snapshot
                            .get_or_insert_with(SnapshotState::default)
                            .tables
                            .push(TablePlan::new(id));
                    }
                }
                self.acked_lsn = state.lsn;
                state.epoch = Some(epoch);
                self.state = Some(state);
            }
        }
        let renames = self.catalog.as_ref().map(Catalog::renames).unwrap_or_default();
        self.emitted = self
            .state
            .clone()
            .map(|state| Emitted { state, announced: self.announced.clone(), renames });
        Ok(())
    }

    async fn next_batch(&mut self) -> Result<SourceBatch> {
        match self.next_batch_inner().await {
            Ok(mut batch) => {
                // A shape announced in this batch whose key changed: the
                // table is copied again (and the checkpoint knows it).
                if batch.messages.iter().any(|m| matches!(m, SourceMessage::SchemaChanged(_))) {
                    let mut state = SourceState::from_checkpoint(&batch.checkpoint)?;
                    let before = state.keyless.clone();
                    batch.messages = state.copy_for_key_changes(std::mem::take(&mut batch.messages));
                    if state.keyless != before {
                        batch.checkpoint = state.to_checkpoint();
                    }
                    if let Some(s) = self.state.as_mut() {
                        for m in &batch.messages {
                            if let SourceMessage::SchemaChanged(schema) = m {
                                s.note_shape(schema);
                            }
                        }
                    }
                }
                self.sequences_moved(&mut batch).await;
                self.objects_moved(&mut batch).await;
                // The batch's own checkpoint, not `self.state`: a snapshot
                // chunk held back for the last-row marker is already
                // counted in `self.state` but not returned yet.
                let state = SourceState::from_checkpoint(&batch.checkpoint)?;
                let renames = self.catalog.as_ref().map(Catalog::renames).unwrap_or_default();
                self.emitted = Some(Emitted { state, announced: self.announced.clone(), renames });
                Ok(batch)
            }
            Err(e) => {
                // Drop the half-done work; the next call resumes after the
                // last batch returned (the runner may also start() again
                // from its durable checkpoint).
                self.snapshot = None;
                self.streamer = None;
                self.catch_up = None;
                if let Some(Emitted { state, announced, renames }) = self.emitted.clone() {
                    self.state = Some(state);
                    self.announced = announced;
                    if let Some(c) = self.catalog.as_mut() {
                        c.set_renames(renames);
                    }
                }
                Err(e)
            }
        }
    }

    async fn acknowledge(&mut self, checkpoint: &Checkpoint) -> Result<()> {
        let state = SourceState::from_checkpoint(checkpoint)?;
        self.slot_created_here = false;
        if state.lsn > self.acked_lsn {
            self.acked_lsn = state.lsn;
        }
        if let Some(streamer) = &self.streamer {
            streamer.acknowledge(self.acked_lsn);
        }
        Ok(())
    }

    fn set_wake(&mut self, wake: Arc<tokio::sync::Notify>) {
        self.wake = Some(wake);
    }

    fn snapshot_progress(&self) -> Vec<crate::source::SnapshotTableProgress> {
        self.progress
            .view()
            .into_iter()
            .map(|v| crate::source::SnapshotTableProgress {
                table: v.table,
                rows: v.rows,
                // 0 means unknown: reltuples is -1 before the first ANALYZE.
                estimated_rows: (v.estimated_rows > 0).then_some(v.estimated_rows),
                done: v.done,
            })
            .collect()
    }

    /// Copies `tables` again the way a table created while streaming is:
    /// a snapshot of them (in the checkpoint) the stream first catches up
    /// to.
    async fn resync(&mut self, tables: &[TableId]) -> Result<Vec<TableId>> {
        if self.config.snapshot_mode == SnapshotMode::Never {
            return Ok(Vec::new());
        }
        let filter = &self.filter;
        let state = self
            .state
            .as_mut()
            .ok_or_else(|| Error::retryable("the source is not started"))?;
        let mut out = Vec::new();
        for id in tables {
            if !filter.captures(id) || !state.tables.contains(&id.to_string()) {
                continue;
            }
            let snap = state.snapshot.get_or_insert_with(SnapshotState::default);
            match snap.tables.iter_mut().find(|t| t.id() == *id) {
                // A verification of it gives way to the copy.
                Some(t) if t.verify.is_some() => *t = TablePlan::new(id),
                Some(_) => {}
                None => snap.tables.push(TablePlan::new(id)),
            }
            // The last copy's progress said done: not this one's.
            self.progress.forget(id);
            out.push(id.clone());
        }
        Ok(out)
    }

    async fn verify(&mut self, tables: &[TableId], id: u64, rows_per_second: u64) -> Result<Vec<TableId>> {
        self.plan_verification(tables, |t, _| TablePlan::verify(t, id, rows_per_second))
    }

    async fn verify_by_summaries(
        &mut self,
        tables: &[TableId],
        id: u64,
        rows_per_second: u64,
        range_rows: u64,
    ) -> Result<Vec<TableId>> {
        self.plan_verification(tables, |t, shape| match shape {
            Some(s) if snapshot::summarizable(s) => {
                TablePlan::verify_by_summaries(t, id, rows_per_second, range_rows.max(1))
            }
            _ => TablePlan::verify(t, id, rows_per_second),
        })
    }

    async fn verify_ranges(
        &mut self,
        table: &TableId,
        id: u64,
        ranges: &[tributary_schemas::records::requests::KeyBounds],
        rows_per_second: u64,
    ) -> Result<bool> {
        if ranges.is_empty() {
            return Ok(false);
        }
        let planned = self.plan_verification(std::slice::from_ref(table), |t, _| {
            TablePlan::verify_ranges(t, id, ranges.to_vec(), rows_per_second)
        })?;
        Ok(!planned.is_empty())
    }

    async fn repair(
        &mut self,
        table: &TableId,
        keys: &[String],
        verify_after: u64,
        rows_per_second: u64,
    ) -> Result<bool> {
        if self.config.snapshot_mode == SnapshotMode::Never {
            return Ok(false);
        }
        let filter = &self.filter;
        let state = self
            .state
            .as_mut()
            .ok_or_else(|| Error::retryable("the source is not started"))?;
        if !filter.captures(table) || !state.tables.contains(&table.to_string()) {
            return Ok(false);
        }
        let snap = state.snapshot.get_or_insert_with(SnapshotState::default);
        // Only a plan not read yet (no segments) can take the keys: one
        // being read runs on, and this one after it.
        match snap.tables.iter_mut().find(|t| t.id() == *table && t.segments.is_empty()) {
            // Asked already: the keys join it.
            Some(t) if t.repair.is_some() => {
                if let Some(k) = t.repair.as_mut() {
                    k.extend(keys.iter().cloned());
                }
            }
            // To be copied whole: the copy rewrites every row.
            Some(t) if t.verify.is_none() => return Ok(false),
            // To be verified: the repair goes first, and verifies after.
            Some(t) => *t = TablePlan::repair(table, keys.to_vec(), verify_after, rows_per_second),
            None => snap
                .tables
                .push(TablePlan::repair(table, keys.to_vec(), verify_after, rows_per_second)),
        }
        Ok(true)
    }

    fn tables(&self) -> Vec<TableId> {
        let Some(state) = &self.state else {
            return Vec::new();
        };
        state
            .tables
            .iter()
            .filter_map(|t| match self.announced.keys().find(|id| id.to_string() == *t) {
                Some(id) => Some(id.clone()),
                None => t.split_once('.').map(|(s, n)| TableId::new(s, n)),
            })
            .collect()
    }

    fn domain_change(&self) -> Option<String> {
        self.domain_change.clone()
    }

    fn start_over(&mut self) -> bool {
        self.start_over = true;
        true
    }

    async fn retained_bytes(&mut self) -> Option<u64> {
        let catalog = self.catalog.as_ref()?;
        match catalog.slot_retained_bytes(&self.config.slot_name).await {
            Ok(b) => b,
            Err(e) => {
                tracing::debug!(error = %e, "cannot read the slot's retained WAL");
                None
            }
        }
    }
}

impl PostgresSource {
    /// Plans a verification of each of `tables` that can be verified now
    /// (see [`Source::verify`]): the plan `plan` makes of it (given the
    /// table's announced shape, if any); the tables planned.
    fn plan_verification(
        &mut self,
        tables: &[TableId],
        plan: impl Fn(&TableId, Option<&TableSchema>) -> TablePlan,
    ) -> Result<Vec<TableId>> {
        let filter = &self.filter;
        let state = self
            .state
            .as_mut()
            .ok_or_else(|| Error::retryable("the source is not started"))?;
        let mut out = Vec::new();
        for table in tables {
            if !filter.captures(table) || !state.tables.contains(&table.to_string()) {
                continue;
            }
            // Known not to be verifiable (a key type that does not order
            // alike everywhere): left out here, so that the answer says so.
            if self.announced.get(table).is_some_and(|s| unverifiable(s).is_some()) {
                tracing::warn!(table = %table, "the table is not verified: it has a key of a type whose order \
                    differs between databases");
                continue;
            }
            let snap = state.snapshot.get_or_insert_with(SnapshotState::default);
            // Being copied (or verified) already: its copy is checked by
            // the next verification.
            if snap.tables.iter().any(|t| t.id() == *table) {
                continue;
            }
            snap.tables.push(plan(table, self.announced.get(table).map(|s| s.as_ref())));
            out.push(table.clone());
        }
        Ok(out)
    }
}

impl PostgresSource {
    /// Every `sequence_interval_ms`: reads the sequences the announced
    /// tables' columns take values from, and adds to `batch` those that
    /// moved since they were last sent (every one, the first time in this
    /// process). Sequences are not in the WAL's changes; a failed read is
    /// said and tried again at the next interval (it never fails a batch).
    async fn sequences_moved(&mut self, batch: &mut SourceBatch) {
        let every = self.config.sequence_interval_ms;
        let now = std::time::Instant::now();
        if every == 0 || self.sequences.next_read.is_some_and(|at| now < at) {
            return;
        }
        self.sequences.next_read = Some(now + std::time::Duration::from_millis(every));
        let (Some(catalog), false) = (self.catalog.as_ref(), self.announced.is_empty()) else {
            return;
        };
        let tables: Vec<TableId> = self.announced.keys().cloned().collect();
        let found = match catalog.sequences(&tables).await {
            Ok(found) => found,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the captured tables' sequences; trying again later");
                return;
            }
        };
        for (table, state, readable) in found {
            let id = state.id();
            if !readable {
                if self.sequences.unreadable.insert(id.clone()) {
                    tracing::warn!(
                        table = %table,
                        sequence = %id,
                        "this role may not read the sequence: it is not kept in the destinations \
                         (GRANT SELECT ON SEQUENCE {} TO <role>)",
                        crate::pgwire::quote_table(&id)
                    );
                }
                continue;
            }
            if self.sequences.sent.get(&id) != Some(&state) {
                self.sequences.sent.insert(id, state.clone());
                batch.messages.push(SourceMessage::Sequence(table, state));
            }
        }
    }

    /// Every `sequence_interval_ms` (when `schema_objects` is on): reads
    /// the indexes, constraints and defaults of the announced tables whose
    /// copy is done, and adds to `batch` those of tables where they changed
    /// since they were last sent. Objects are not in the WAL's changes; a
    /// failed read is said and tried again at the next interval.
    async fn objects_moved(&mut self, batch: &mut SourceBatch) {
        if !self.config.schema_objects || !self.objects.due(self.config.sequence_interval_ms) {
            return;
        }
        let Some(catalog) = self.catalog.as_ref() else {
            return;
        };
        // A table being copied gets its objects once its rows are in (an
        // index built before a copy slows it; pgcopydb's order): after its
        // last rows, by the batch's own checkpoint (a chunk held back for
        // the last-row marker is done in `self.state` already).
        let Ok(emitted) = SourceState::from_checkpoint(&batch.checkpoint) else {
            return;
        };
        let copying: BTreeSet<TableId> = emitted
            .snapshot
            .as_ref()
            .map(|s| {
                s.tables
                    .iter()
                    .filter(|t| t.verify.is_none() && (t.segments.is_empty() || t.segments.iter().any(|g| !g.done)))
                    .map(|t| TableId::new(t.schema.clone(), t.table.clone()))
                    .collect::<BTreeSet<TableId>>()
            })
            .unwrap_or_default();
        let tables: Vec<TableId> = self.announced.keys().filter(|t| !copying.contains(t)).cloned().collect();
        if tables.is_empty() {
            return;
        }
        let found = match objects::read(catalog, &tables).await {
            Ok(found) => found,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the captured tables' indexes, constraints and defaults; trying again later");
                return;
            }
        };
        for (table, objects) in self.objects.changed(found) {
            batch.messages.push(SourceMessage::Objects(table, objects));
        }
    }

    /// Starts over in the cluster's own position domain after
    /// [`Source::start`] found the checkpoint's to be another's: streaming
    /// from the slot (made now when this cluster has none; else from where
    /// it stands), every selected table copied again in a snapshot the
    /// stream first catches up to. Nothing of the checkpoint is kept but
    /// its slot name.
    async fn start_in_new_domain(&mut self, slot_exists: bool, selected: &[TableId], epoch: String) -> Result<()> {
        if self.config.snapshot_mode == SnapshotMode::Never {
            return Err(Error::needs_operator(format!(
                "{}; with postgres.snapshot_mode = \"never\" the tables cannot be copied again",
                self.domain_change.as_deref().unwrap_or("the source changed domain")
            ))
            .with_class("tributary.epoch_changed")
            .with_hint(
                "set postgres.snapshot_mode = \"initial\" and start again: every table is copied again and the \
                 rows the copy does not see are removed downstream (see docs/operations.md, Reset)",
            ));
        }
        let lsn = if slot_exists {
            let catalog = self.catalog.as_ref().ok_or_else(|| Error::retryable("not connected"))?;
            let what = "reading the slot's position";
            let row = catalog
                .bounded(what, async {
                    catalog
                        .client()
                        .query_one(
                            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1",
                            &[&self.config.slot_name],
                        )
                        .await
                        .map_err(|e| classify_pg(e, what))
                })
                .await?;
            let text: Option<String> = row.get(0);
            text.as_deref()
                .and_then(parse_lsn)
                .ok_or_else(|| Error::retryable("the slot has no confirmed position yet"))?
        } else {
            let (gated, lsn, _) = self.create_slot(&self.config.slot_name, false, false).await?;
            self.slot_created_here = true;
            drop(gated);
            lsn
        };
        tracing::warn!(
            reason = self.domain_change.as_deref().unwrap_or(""),
            slot = %self.config.slot_name,
            lsn = %format_lsn(lsn),
            "the source changed position domain: every table is copied again"
        );
        let mut tables = BTreeSet::new();
        for id in selected {
            if self.announce(id).await?.is_some() {
                tables.insert(id.to_string());
            }
        }
        let plan: Vec<TablePlan> = selected
            .iter()
            .filter(|id| tables.contains(&id.to_string()))
            .map(TablePlan::new)
            .collect();
        self.state = Some(SourceState {
            version: CHECKPOINT_VERSION,
            slot: self.config.slot_name.clone(),
            lsn,
            tables,
            snapshot: Some(SnapshotState { initial: false, tables: plan }),
            txn: None,
            epoch: Some(epoch),
            keyless: BTreeMap::new(),
        });
        self.acked_lsn = lsn;
        Ok(())
    }

    async fn next_batch_inner(&mut self) -> Result<SourceBatch> {
        if self.state.is_none() {
            return Err(Error::retryable("the source is not started"));
        }
        // A snapshot recorded in the state but not running (a resume, or
        // tables created while streaming) starts in a new snapshot, which
        // the stream first catches up to.
        if self.snapshot.is_none() && self.state.as_ref().is_some_and(|s| s.snapshot.is_some()) {
            self.streamer = None;
            self.start_snapshot_run(None).await?;
        }
        if self.snapshot.is_some() && self.catch_up.is_none() {
            if let Some(batch) = self.next_snapshot_batch().await? {
                return Ok(batch);
            }
        }
        if self.streamer.is_none() {
            self.open_stream().await?;
        }
        let (Some(streamer), Some(catalog)) = (self.streamer.as_mut(), self.catalog.as_mut()) else {
            return Err(Error::retryable("the source is not started"));
        };
        let mut sc = StreamContext {
            catalog,
            config: &self.config,
            filter: &self.filter,
            ctx: &self.ctx,
            announced: &mut self.announced,
            wake: self.wake.as_deref(),
        };
        let out = streamer.next_batch(&mut sc, self.catch_up).await?;
        let mut messages = std::mem::take(&mut self.prelude);
        messages.extend(out.messages);
        let caught_up = if out.reached_stop { self.catch_up.take() } else { None };
        let snapshot_running = self.snapshot.is_some();
        let state = self
            .state
            .as_mut()
            .ok_or_else(|| Error::retryable("the source is not started"))?;
        state.lsn = out.lsn;
        state.txn = out.partial;
        if let Some(point) = caught_up {
            // Every transaction committed before the snapshot's point is
            // out, none after it: the snapshot's rows come next, and the
            // stream resumes at that point after them. The stream read
            // past the point, so it is opened again then.
            state.lsn = state.lsn.max(point);
            self.streamer = None;
            tracing::info!(lsn = %format_lsn(point), "stream caught up with the snapshot");
        }
        for m in &messages {
            if let SourceMessage::TableDropped(id) = m {
                state.tables.remove(&id.to_string());
            }
        }
        if !out.created.is_empty() {
            let snap = state.snapshot.get_or_insert_with(SnapshotState::default);
            for id in &out.created {
                state.tables.insert(id.to_string());
                snap.tables.push(TablePlan::new(id));
            }
            if snapshot_running {
                // Created before the running snapshot's point but not in
                // its plan: nothing of that snapshot went out yet (the
                // stream is still catching up), so it starts again with
                // the new table.
                self.snapshot = None;
                self.catch_up = None;
                self.streamer = None;
            }
        }
        Ok(SourceBatch { messages, checkpoint: state.to_checkpoint() })
    }
}

/// `"schema"."table"` for SQL text (re-exported for `check`).
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lsn_text_round_trips() {
        assert_eq!(parse_lsn("0/16B3748"), Some(0x16B3748));
        assert_eq!(format_lsn(0x1_0000_0010), "1/10");
        assert_eq!(parse_lsn(&format_lsn(u64::MAX)), Some(u64::MAX));
    }

    #[test]
    fn checkpoint_round_trips() {
        let s = SourceState {
            version: CHECKPOINT_VERSION,
            slot: "s".into(),
            lsn: 42,
            tables: ["public.a".to_string()].into_iter().collect(),
            snapshot: None,
            txn: Some(PartialTxn { commit_lsn: 50, changes: 10_000 }),
            epoch: Some("7714691749413639436".into()),
            keyless: [("public.b".to_string(), vec!["int32".to_string()])].into_iter().collect(),
        };
        assert_eq!(SourceState::from_checkpoint(&s.to_checkpoint()).unwrap(), s);
        // Checkpoints written before transactions could be split still read.
        let old = r#"{"version":1,"slot":"s","lsn":42,"tables":[]}"#;
        assert_eq!(SourceState::from_checkpoint(&Checkpoint(old.into())).unwrap().txn, None);
        assert!(SourceState::from_checkpoint(&Checkpoint("{}".into())).is_err());
    }

    #[test]
    fn a_key_gained_or_lost_copies_the_table_again_once() {
        use tributary_schemas::{Column, DataType};
        let mut s = SourceState::from_checkpoint(&Checkpoint(
            r#"{"version":1,"slot":"s","lsn":42,"tables":["public.t"]}"#.into(),
        ))
        .unwrap();
        let shape = |key: Vec<String>| {
            Arc::new(TableSchema {
                id: TableId::new("public", "t"),
                columns: vec![Column::new("id", DataType::Int32, true)],
                key,
                dropped: Vec::new(),
            })
        };
        let rewritten =
            |m: &[SourceMessage]| m.iter().filter(|m| matches!(m, SourceMessage::TableRewritten(..))).count();
        // Captured keyless by a checkpoint older than `keyless`: copied
        // again once.
        let out = s.copy_for_key_changes(vec![SourceMessage::SchemaChanged(shape(vec![]))]);
        assert_eq!(rewritten(&out), 1);
        assert_eq!(rewritten(&s.copy_for_key_changes(vec![SourceMessage::SchemaChanged(shape(vec![]))])), 0);
        let out = s.copy_for_key_changes(vec![SourceMessage::SchemaChanged(shape(vec!["id".into()]))]);
        assert!(matches!(&out[..], [SourceMessage::SchemaChanged(_), SourceMessage::TableRewritten(..)]));
        assert!(s.keyless.is_empty());
        // A table being copied only records its shape.
        s.snapshot = Some(SnapshotState {
            initial: false,
            tables: vec![TablePlan::new(&TableId::new("public", "t"))],
        });
        assert_eq!(rewritten(&s.copy_for_key_changes(vec![SourceMessage::SchemaChanged(shape(vec![]))])), 0);
        assert!(s.keyless.contains_key("public.t"));
    }
}

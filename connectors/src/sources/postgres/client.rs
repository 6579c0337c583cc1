//! The PostgreSQL source's sessions: ordinary connections (catalog and
//! snapshot) and how their errors and the replication client's are
//! classified; the catalog queries that build a table's schema.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use pgwire_replication::PgWireError;
use tributary_schemas::{Column, SequenceState, TableId, TableSchema};

use super::config::{ConnectionParams, PostgresSourceConfig, TableFilter};
use super::types::{decode_text, map_type, parse_array, ArrayItem, ColumnRef, PgType};
use crate::error::{Error, ErrorKind, Result};
use crate::pgwire::redact::redact_server_text;
use crate::pgwire::sqlstate;
pub(crate) use crate::pgwire::sqlstate::classify as classify_pg;

/// Opens an ordinary connection (catalog, snapshot).
pub async fn connect(params: &ConnectionParams) -> Result<tokio_postgres::Client> {
    fn closed(e: &tokio_postgres::Error) {
        tracing::debug!(error = %crate::pgwire::redact::redacted(e), "PostgreSQL connection ended");
    }
    crate::pgwire::connect(&params.pg, params.tls, params.tls_ca_file.as_deref(), closed)
        .await?
        .map_err(|e| classify_pg(e, "connecting to PostgreSQL"))
}

/// Whether a server's 55000 message is about an invalidated slot, not
/// about `wal_level`: PostgreSQL 16+ says "can no longer get changes from
/// replication slot"; 13 to 15 say "cannot read from logical replication
/// slot" (the detail, "This slot has been invalidated because it exceeded
/// the maximum reserved size", may not reach the client).
pub fn is_lost_slot_message(msg: &str) -> bool {
    msg.contains("replication slot")
        && (msg.contains("no longer")
            || msg.contains("invalidated")
            || msg.contains("cannot read from logical replication slot"))
}

/// The needs-operator error of a slot PostgreSQL invalidated
/// (`pg_replication_slots.wal_status = 'lost'`): it needed WAL beyond
/// `max_slot_wal_keep_size`, which was removed.
pub fn lost_slot_error(slot: &str) -> Error {
    Error::needs_operator(format!(
        "replication slot {slot} was invalidated by PostgreSQL (wal_status = lost): it fell more than \
         max_slot_wal_keep_size behind and the WAL it needed was removed, so the changes since the checkpoint are \
         lost"
    ))
    .with_class("tributary.slot_lost")
    .with_hint(format!(
        "copy everything again: source-runner --config <source.toml> reset, then start the runner: the slot {slot} \
         is dropped and made again, every table copied again, and the destination rows the new copy does not see \
         are removed (see docs/operations.md, Reset; by hand, SELECT pg_drop_replication_slot('{slot}'); before the \
         reset does the same); raise max_slot_wal_keep_size (or set it to -1) so a stopped \
         or slow runner keeps its WAL"
    ))
}

/// Classifies a replication client error.
pub fn classify_wire(err: PgWireError, context: &str) -> Error {
    let (kind, class) = match &err {
        PgWireError::Server(msg) => {
            let code = msg
                .rsplit_once("SQLSTATE ")
                .map(|(_, c)| c.trim_end_matches(')').to_string())
                .unwrap_or_default();
            let kind = if code.is_empty() {
                ErrorKind::Retryable
            } else {
                sqlstate::kind(&code)
            };
            let text = redact_server_text(msg);
            let mut e = Error::new(kind, format!("{context}: {text}")).with_class(format!("sqlstate.{code}"));
            if code == "55000" && is_lost_slot_message(msg) {
                let name = msg.split('"').nth(1).unwrap_or("?");
                return lost_slot_error(name).in_context(&format!("{context}: {text}"));
            }
            if code == "42704" && msg.contains("replication slot") {
                e = e.with_hint(
                    "the replication slot is gone, so changes since the checkpoint are lost: copy everything \
                     again with source-runner --config <source.toml> reset, then start the runner (see \
                     docs/operations.md, Reset)",
                );
            } else if let Some(h) = sqlstate::hint(&code) {
                e = e.with_hint(h);
            }
            return e;
        }
        PgWireError::Auth(_) => (ErrorKind::NeedsOperator, "pgwire.auth"),
        PgWireError::Tls(_) => (ErrorKind::NeedsOperator, "pgwire.tls"),
        PgWireError::MessageTooLarge { .. } => (ErrorKind::NeedsOperator, "pgwire.message_too_large"),
        PgWireError::Io(_) => (ErrorKind::Retryable, "pgwire.io"),
        _ => (ErrorKind::Retryable, "pgwire"),
    };
    Error::new(kind, format!("{context}: {err}")).with_class(class)
}

/// A table's schema as captured, with how pgoutput's columns map onto it.
#[derive(Debug, Clone)]
pub struct BuiltSchema {
    /// The schema (captured columns only).
    pub schema: Arc<TableSchema>,
    /// Whether the key is unique (primary key or configured key).
    pub keyed: bool,
    /// Whether the table is partitioned (read with its partitions).
    pub partitioned: bool,
    /// For each source column (pgoutput / catalog order), its index in
    /// `schema.columns`, or `None` when excluded.
    pub source_columns: Vec<Option<usize>>,
}

/// The partitioned table a partition's changes belong to.
#[derive(Debug, Clone)]
pub struct PartitionRoot {
    /// Its oid.
    pub relid: u32,
    /// Its name.
    pub id: TableId,
    /// Its live columns in attnum order.
    pub columns: Vec<String>,
}

/// Where in the WAL something was learned: `(commit LSN, LSN)` of a
/// message, or `(LSN, MAX)` of a catalog read (which sees every transaction
/// committed before that LSN). Later knowledge wins; earlier is a replay.
pub type WalOrder = (u64, u64);

/// What the source knows of one captured table (by oid) in WAL order.
#[derive(Debug, Clone)]
struct Tracked {
    name: TableId,
    /// attnum -> name of the live columns.
    columns: BTreeMap<i16, String>,
    as_of: WalOrder,
}

/// Table and column renames seen in the stream, so that a renamed column
/// carries its earlier names (`Column::aliases`) and a renamed table is
/// noticed. Kept for the life of the source process only: after a restart
/// the schemas are built from the catalog without aliases (the sinks have
/// renamed by then).
#[derive(Debug, Clone, Default)]
pub struct Renames {
    tables: HashMap<u32, Tracked>,
    /// Per table oid: column name -> its earlier names, oldest first.
    aliases: HashMap<u32, HashMap<String, Vec<String>>>,
}

impl Renames {
    /// Applies news (see [`Renames::is_news`]); see [`Catalog::note_ddl`].
    fn note(&mut self, relid: u32, at: WalOrder, name: &TableId, columns: Option<&[(i16, String)]>) -> Option<TableId> {
        let t = self.tables.get_mut(&relid)?;
        t.as_of = at;
        if let Some(columns) = columns {
            let aliases = self.aliases.entry(relid).or_default();
            for (attnum, new) in columns {
                match t.columns.get(attnum) {
                    Some(old) if old != new => {
                        let mut earlier = aliases.remove(old).unwrap_or_default();
                        earlier.push(old.clone());
                        earlier.retain(|a| a != new);
                        tracing::info!(table = %name, column = %new, was = %old, "column renamed");
                        aliases.insert(new.clone(), earlier);
                    }
                    _ => {}
                }
            }
            t.columns = columns.iter().cloned().collect();
        }
        (t.name != *name).then(|| std::mem::replace(&mut t.name, name.clone()))
    }

    /// Whether a message at `at` says something new of `relid`: not a
    /// replay of one already applied, nor what is known already.
    fn is_news(&self, relid: u32, at: WalOrder, name: &TableId, columns: Option<&[(i16, String)]>) -> bool {
        let Some(t) = self.tables.get(&relid) else { return false };
        at > t.as_of
            && (t.name != *name
                || columns.is_some_and(|c| {
                    c.len() != t.columns.len() || c.iter().any(|(n, name)| t.columns.get(n) != Some(name))
                }))
    }

    fn forget(&mut self, table: &TableId) {
        let gone: Vec<u32> = self.tables.iter().filter(|(_, t)| t.name == *table).map(|(r, _)| *r).collect();
        for relid in gone {
            self.tables.remove(&relid);
            self.aliases.remove(&relid);
        }
    }

    fn aliases(&self, relid: u32, column: &str) -> Vec<String> {
        self.aliases
            .get(&relid)
            .and_then(|a| a.get(column))
            .cloned()
            .unwrap_or_default()
    }
}

/// A catalog connection: table lists, schemas, type descriptions.
pub struct Catalog {
    client: tokio_postgres::Client,
    /// The longest wait for one answer (`catalog_timeout_ms`).
    timeout: std::time::Duration,
    types: HashMap<(u32, i32), PgType>,
    /// Tables whose generated columns were said to be left out (once each).
    generated_noted: std::collections::HashSet<u32>,
    /// Renames seen while streaming (see [`Renames`]); shared with the
    /// copy the source rolls back to after an error, cloned on change.
    renames: Arc<Renames>,
    /// The last transaction [`Catalog::see_transaction`] found visible.
    seen_xid: Option<u32>,
}

impl std::fmt::Debug for Catalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Catalog").finish_non_exhaustive()
    }
}

impl Catalog {
    /// The WAL the server keeps for `slot`: from the slot's `restart_lsn`
    /// to the current WAL position (on a standby, the last one received).
    pub async fn slot_retained_bytes(&self, slot: &str) -> Result<Option<u64>> {
        let row = self
            .ask(
                "reading the slot's retained WAL",
                self.client.query_opt(
                    "SELECT pg_wal_lsn_diff(CASE WHEN pg_is_in_recovery() THEN pg_last_wal_receive_lsn() \
                 ELSE pg_current_wal_lsn() END, restart_lsn)::bigint FROM pg_replication_slots WHERE slot_name = $1",
                    &[&slot],
                ),
            )
            .await?;
        Ok(row.and_then(|r| r.get::<_, Option<i64>>(0)).map(|b| b.max(0) as u64))
    }

    /// Connects.
    pub async fn connect(params: &ConnectionParams) -> Result<Self> {
        Ok(Self {
            client: connect(params).await?,
            timeout: params.catalog_timeout,
            types: HashMap::new(),
            generated_noted: std::collections::HashSet::new(),
            renames: Arc::default(),
            seen_xid: None,
        })
    }

    /// Waits until this session's snapshots see transaction `xid` (a
    /// 32-bit id, as pgoutput's Begin gives it), so that what the catalog
    /// says next is at least as new as that transaction. The walsender
    /// decodes a commit once its WAL record is flushed, a moment before
    /// the committing backend leaves the list of running transactions: a
    /// catalog read in that moment missed the column the transaction
    /// added, and with it the value older rows have (seen under load: the
    /// destination kept NULL). Once visible, every later snapshot sees it.
    pub async fn see_transaction(&mut self, xid: u32) -> Result<()> {
        const WAIT_FIRST: std::time::Duration = std::time::Duration::from_millis(1);
        const WAIT_MOST: std::time::Duration = std::time::Duration::from_millis(50);
        if self.seen_xid == Some(xid) {
            return Ok(());
        }
        // The snapshot's xmax carries the epoch: the 64-bit id of `xid` is
        // the newest one below xmax with the same low 32 bits.
        const SQL: &str = "SELECT txid_visible_in_snapshot(x - ((x % 4294967296 - $1 + 4294967296) % 4294967296), s) \
                           FROM (SELECT s, txid_snapshot_xmax(s) - 1 AS x FROM txid_current_snapshot() s) q";
        let started = std::time::Instant::now();
        let mut wait = WAIT_FIRST;
        loop {
            let row = self
                .ask("waiting for a decoded transaction to be visible", self.client.query_one(SQL, &[&i64::from(xid)]))
                .await?;
            if row.get::<_, bool>(0) {
                self.seen_xid = Some(xid);
                return Ok(());
            }
            if started.elapsed() >= self.timeout {
                return Err(Error::retryable(format!(
                    "transaction {xid} was decoded but is still not visible to a new snapshot after {} ms \
                     (postgres.catalog_timeout_ms): its schema is not read from an older catalog",
                    self.timeout.as_millis()
                )));
            }
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(WAIT_MOST);
        }
    }

    /// `work` (queries on this session), bounded by the catalog timeout. A
    /// session that gives no answer in time is stalled, not closed: the
    /// error is retryable, and the source's next start opens a new one.
    pub async fn bounded<T>(&self, what: &str, work: impl std::future::Future<Output = Result<T>>) -> Result<T> {
        match tokio::time::timeout(self.timeout, work).await {
            Ok(r) => r,
            Err(_) => Err(Error::retryable(format!(
                "{what}: PostgreSQL gave no answer in {} ms (postgres.catalog_timeout_ms); the source starts over on \
                 a new session",
                self.timeout.as_millis()
            ))
            .with_class("tributary.catalog_timeout")),
        }
    }

    /// One query's future, bounded ([`Catalog::bounded`]) and its error
    /// classified.
    async fn ask<T>(
        &self,
        what: &str,
        query: impl std::future::Future<Output = std::result::Result<T, tokio_postgres::Error>>,
    ) -> Result<T> {
        self.bounded(what, async { query.await.map_err(|e| classify_pg(e, what)) })
            .await
    }

    /// Records what a DDL message (or a Relation message, without
    /// `columns`) says of table `relid` at `at`: its name and live columns.
    /// Returns the table's previous name when it was renamed. Tables never
    /// built, and what is older than what is known (a replay), are ignored.
    pub fn note_ddl(
        &mut self,
        relid: u32,
        at: WalOrder,
        name: &TableId,
        columns: Option<&[(i16, String)]>,
    ) -> Option<TableId> {
        if !self.renames.is_news(relid, at, name, columns) {
            return None;
        }
        Arc::make_mut(&mut self.renames).note(relid, at, name, columns)
    }

    /// `schema` (of table `relid`) with the aliases known now, when they
    /// differ from its own.
    pub fn apply_aliases(&self, relid: u32, schema: &TableSchema) -> Option<TableSchema> {
        let mut out = schema.clone();
        for c in &mut out.columns {
            c.aliases = self.renames.aliases(relid, &c.name);
        }
        (out != *schema).then_some(out)
    }

    /// Forgets a dropped table's renames.
    pub fn forget_table(&mut self, table: &TableId) {
        if self.renames.tables.values().any(|t| t.name == *table) {
            Arc::make_mut(&mut self.renames).forget(table);
        }
    }

    /// The renames known (to keep across a restart of the source, or to
    /// roll back to).
    pub fn renames(&self) -> Arc<Renames> {
        self.renames.clone()
    }

    /// Replaces the renames known (see [`Catalog::renames`]).
    pub fn set_renames(&mut self, renames: Arc<Renames>) {
        self.renames = renames;
    }

    /// The underlying client.
    pub fn client(&self) -> &tokio_postgres::Client {
        &self.client
    }

    /// The root of the partition tree `relid` is a partition of, or `None`
    /// when it is no partition. A publication without
    /// `publish_via_partition_root` sends partitions' changes under the
    /// partitions' own relations; the source captures the root.
    pub async fn partition_root(&self, relid: u32) -> Result<Option<PartitionRoot>> {
        let row = self
            .ask(
                "reading the root of a partition",
                self.client.query_opt(
                    "SELECT r.oid, n.nspname::text, r.relname::text, \
                        ARRAY(SELECT a.attname::text FROM pg_attribute a \
                              WHERE a.attrelid = r.oid AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum) \
                 FROM pg_class c \
                 JOIN pg_class r ON r.oid = pg_partition_root(c.oid) \
                 JOIN pg_namespace n ON n.oid = r.relnamespace \
                 WHERE c.oid = $1 AND c.relispartition",
                    &[&relid],
                ),
            )
            .await?;
        Ok(row.map(|r| PartitionRoot {
            relid: r.get(0),
            id: TableId::new(r.get::<_, String>(1), r.get::<_, String>(2)),
            columns: r.get(3),
        }))
    }

    /// The leaf partitions of the partitioned table `root` now.
    pub async fn partition_leaves(&self, root: u32) -> Result<Vec<u32>> {
        let rows = self
            .ask(
                "reading the partitions of a table",
                self.client
                    .query("SELECT relid::oid FROM pg_partition_tree($1::oid::regclass) WHERE isleaf", &[&root]),
            )
            .await?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    /// Every ordinary or partitioned table outside the system schemas that
    /// `filter` selects, with its oid.
    pub async fn list_tables(&self, filter: &TableFilter) -> Result<Vec<(u32, TableId)>> {
        let rows = self
            .ask(
                "listing tables",
                self.client.query(
                    "SELECT c.oid, n.nspname::text, c.relname::text FROM pg_class c \
                 JOIN pg_namespace n ON n.oid = c.relnamespace \
                 WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition \
                   AND n.nspname NOT IN ('pg_catalog', 'information_schema') \
                   AND n.nspname NOT LIKE 'pg\\_toast%' AND n.nspname NOT LIKE 'pg\\_temp%' \
                 ORDER BY 2, 3",
                    &[],
                ),
            )
            .await?;
        Ok(rows
            .into_iter()
            .map(|r| (r.get::<_, u32>(0), TableId::new(r.get::<_, String>(1), r.get::<_, String>(2))))
            .filter(|(_, id)| filter.captures(id))
            .collect())
    }

    /// The oid of `table`, if it exists.
    pub async fn relid(&self, table: &TableId) -> Result<Option<u32>> {
        let row = self
            .ask(
                "looking up a table",
                self.client.query_opt(
                    "SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
                 WHERE n.nspname = $1 AND c.relname = $2",
                    &[&table.schema, &table.table],
                ),
            )
            .await
            .map_err(|e| e.with_table(table.clone()))?;
        Ok(row.map(|r| r.get(0)))
    }

    /// Forgets the enum types read so far (and arrays and domains of
    /// them), so that their labels are read again: `ALTER TYPE ... ADD
    /// VALUE` changes them without a Relation message.
    pub fn forget_enum_types(&mut self) {
        fn is_enum(t: &PgType) -> bool {
            t.typtype == 'e' || t.element.as_deref().is_some_and(is_enum)
        }
        self.types.retain(|_, t| !is_enum(t));
    }

    async fn pg_type(&mut self, oid: u32, typmod: i32) -> Result<PgType> {
        if let Some(t) = self.types.get(&(oid, typmod)) {
            return Ok(t.clone());
        }
        let row = self
            .ask(
                "describing a type",
                self.client.query_one(
                    "SELECT t.typname::text, t.typtype::text, t.typelem, t.typbasetype, t.typcategory::text, \
                        format_type(t.oid, $2), t.typtypmod \
                 FROM pg_type t WHERE t.oid = $1",
                    &[&oid, &typmod],
                ),
            )
            .await?;
        let typname: String = row.get(0);
        let typtype: String = row.get(1);
        let elem: u32 = row.get(2);
        let base: u32 = row.get(3);
        let category: String = row.get(4);
        let formatted: String = row.get(5);
        let domain_typmod: i32 = row.get(6);
        let mut t = if typtype == "d" && base != 0 {
            // A domain maps as its base type and is spelled as it, with the
            // domain's modifier (`CREATE DOMAIN price AS numeric(12,2)`:
            // `numeric(12,2)`): a destination can recreate the base type,
            // the domain may not exist there. A bit string's length is the
            // domain's (the column's typmod is -1, and `bit` alone is
            // `bit(1)`); other bases map without it, as before (a numeric
            // domain stays variable-scale, as its topics have it).
            let own = typmod < 0 && domain_typmod >= 0;
            let mut b = Box::pin(self.pg_type(base, typmod)).await?;
            if own && matches!(b.typname.as_str(), "bit" | "varbit") {
                b = Box::pin(self.pg_type(base, domain_typmod)).await?;
            } else if own {
                b.formatted = Box::pin(self.pg_type(base, domain_typmod)).await?.formatted;
            }
            b.oid = oid;
            b
        } else {
            let element = if category == "A" && elem != 0 {
                Some(Box::new(Box::pin(self.pg_type(elem, typmod)).await?))
            } else {
                None
            };
            // An array of a domain is spelled as an array of its base type.
            let formatted = match &element {
                Some(e) => format!("{}[]", e.formatted),
                None => formatted,
            };
            PgType {
                oid,
                typname,
                typtype: typtype.chars().next().unwrap_or('b'),
                typmod,
                mapping_text: formatted.clone(),
                formatted,
                element,
                enum_labels: Vec::new(),
            }
        };
        if t.typtype == 'e' && t.enum_labels.is_empty() {
            let rows = self
                .ask(
                    "reading enum labels",
                    self.client.query(
                        "SELECT enumlabel::text FROM pg_enum WHERE enumtypid = $1 ORDER BY enumsortorder",
                        &[&oid],
                    ),
                )
                .await?;
            t.enum_labels = rows.iter().map(|r| r.get(0)).collect();
        }
        self.types.insert((oid, typmod), t.clone());
        Ok(t)
    }

    /// Builds the captured schema of `table`. `columns` are pgoutput's
    /// `(name, type oid, typmod)` when building from a Relation message; the
    /// catalog's current columns otherwise. Nullability and the primary key
    /// always come from the catalog.
    pub async fn build_schema(
        &mut self,
        config: &PostgresSourceConfig,
        filter: &TableFilter,
        table: &TableId,
        relid: u32,
        columns: Option<&[(String, u32, i32)]>,
    ) -> Result<BuiltSchema> {
        let rows = self
            .ask(
                "reading columns",
                self.client.query(
                    // `attmissingval`: the value that rows older than an
                    // `ADD COLUMN ... DEFAULT` have (PostgreSQL 11+ stores it
                    // instead of rewriting the table), as a one-element array.
                    "SELECT a.attname::text, a.atttypid, a.atttypmod, a.attnotnull, \
                        CASE WHEN a.atthasmissing THEN a.attmissingval::text END, a.attnum, \
                        a.attgenerated <> '' \
                 FROM pg_attribute a \
                 WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
                    &[&relid],
                ),
            )
            .await
            .map_err(|e| e.with_table(table.clone()))?;
        let catalog_cols: Vec<(String, u32, i32, bool)> =
            rows.iter().map(|r| (r.get(0), r.get(1), r.get(2), r.get(3))).collect();
        let missing: Vec<(String, Option<String>)> = rows.iter().map(|r| (r.get(0), r.get(4))).collect();
        // A column's identity survives its rename: the encoder finds renames
        // by it (`Column::column_id`). The oid keeps a table dropped and
        // created again under the same name from looking renamed.
        let ids: Vec<(String, u64)> = rows
            .iter()
            .map(|r| (r.get(0), (u64::from(relid) << 16) | u64::from(r.get::<_, i16>(5).unsigned_abs())))
            .collect();
        if !self.renames.tables.contains_key(&relid) {
            // Renames are told apart from replays by WAL order: this read
            // sees every DDL committed before the current WAL position.
            let lsn: i64 = self
                .ask(
                    "reading the WAL position",
                    self.client.query_one(
                        "SELECT (CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() \
                                  ELSE pg_current_wal_lsn() END - '0/0')::bigint",
                        &[],
                    ),
                )
                .await?
                .get(0);
            Arc::make_mut(&mut self.renames).tables.insert(
                relid,
                Tracked {
                    name: table.clone(),
                    columns: rows.iter().map(|r| (r.get::<_, i16>(5), r.get::<_, String>(0))).collect(),
                    as_of: (lsn as u64, u64::MAX),
                },
            );
        }
        let pk_rows = self
            .ask(
                "reading the primary key",
                self.client.query(
                    "SELECT a.attname::text FROM pg_index i \
                 CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, ord) \
                 JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum \
                 WHERE i.indrelid = $1 AND i.indisprimary ORDER BY k.ord",
                    &[&relid],
                ),
            )
            .await
            .map_err(|e| e.with_table(table.clone()))?;
        let pk: Vec<String> = pk_rows.iter().map(|r| r.get(0)).collect();
        // Generated columns: pgoutput (PostgreSQL 12 to 17) publishes none,
        // so a value the snapshot read would never change again in the
        // destination. They are left out of the catalog's columns too, so
        // the snapshot does not read them (a Relation message that carries
        // one, from a server that publishes them, keeps it).
        let generated: Vec<String> = rows.iter().filter(|r| r.get::<_, bool>(6)).map(|r| r.get(0)).collect();
        let source: Vec<(String, u32, i32)> = match columns {
            Some(c) => c.to_vec(),
            None => catalog_cols
                .iter()
                .filter(|(n, ..)| !generated.contains(n) || pk.contains(n))
                .map(|(n, o, m, _)| (n.clone(), *o, *m))
                .collect(),
        };
        if columns.is_none() && !generated.is_empty() && self.generated_noted.insert(relid) {
            tracing::info!(
                table = %table,
                columns = %generated.join(", "),
                "generated columns are not carried: PostgreSQL's logical replication does not publish them, so \
                 their copy would go stale (docs/sources/postgresql.md)"
            );
        }
        let key = match config.configured_key(table) {
            Some(k) => Some(k.clone()),
            None if !pk.is_empty() => Some(pk),
            None => None,
        };
        let mut cols = Vec::with_capacity(source.len());
        let mut source_columns = Vec::with_capacity(source.len());
        for (name, oid, typmod) in &source {
            let is_key = key.as_ref().is_some_and(|k| k.contains(name));
            if !is_key && filter.excludes_column(table, name) {
                source_columns.push(None);
                continue;
            }
            let t = self.pg_type(*oid, *typmod).await.map_err(|e| e.with_table(table.clone()))?;
            let notnull = catalog_cols.iter().any(|(n, _, _, nn)| n == name && *nn);
            source_columns.push(Some(cols.len()));
            let column = Column {
                name: name.clone(),
                data_type: map_type(&t, table, name),
                nullable: !notnull,
                source_type: t.formatted.clone(),
                default: None,
                column_id: ids.iter().find(|(n, _)| n == name).map(|(_, id)| *id),
                aliases: self.renames.aliases(relid, name),
            };
            let missing = missing.iter().find(|(n, _)| n == name).and_then(|(_, m)| m.as_deref());
            cols.push(match missing.and_then(|m| missing_value(&column, table, m)) {
                Some(v) => column.with_default(&v),
                None => column,
            });
        }
        if let Some(k) = &key {
            for name in k {
                if !cols.iter().any(|c| &c.name == name) {
                    return Err(Error::needs_operator(format!(
                        "key column {name} configured in postgres.keys does not exist"
                    ))
                    .with_table(table.clone())
                    .with_column(name.clone()));
                }
            }
        }
        // A table without a key (primary or configured) has no key
        // columns: its rows are a multiset (see `sink::keyless`), its
        // events carry a null Kafka key, as Debezium's do.
        let keyed = key.is_some();
        let key = key.unwrap_or_default();
        let partitioned: bool = self
            .ask(
                "reading the table kind",
                self.client
                    .query_one("SELECT relkind = 'p' FROM pg_class WHERE oid = $1", &[&relid]),
            )
            .await
            .map_err(|e| e.with_table(table.clone()))?
            .get(0);
        Ok(BuiltSchema {
            schema: Arc::new(TableSchema {
                id: table.clone(),
                columns: cols,
                key,
                dropped: Vec::new(),
            }),
            keyed,
            partitioned,
            source_columns,
        })
    }

    /// The sequences `tables`' columns take values from: owned by one of
    /// them (identity, `serial`: `pg_depend` kinds `a` and `i`) or called
    /// by a column's default (`nextval('s')`), each with the first of those
    /// tables, its definition, its state now, and whether this role may
    /// read it (`None` state when it may not).
    pub async fn sequences(&self, tables: &[TableId]) -> Result<Vec<(TableId, SequenceState, bool)>> {
        if tables.is_empty() {
            return Ok(Vec::new());
        }
        let schemas: Vec<&str> = tables.iter().map(|t| t.schema.as_str()).collect();
        let names: Vec<&str> = tables.iter().map(|t| t.table.as_str()).collect();
        let rows = self
            .ask(
                "reading the captured tables' sequences",
                self.client.query(
                    "WITH t AS (SELECT c.oid, n.nspname, c.relname FROM unnest($1::text[], $2::text[]) AS w(s, r) \
                         JOIN pg_namespace n ON n.nspname = w.s JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = w.r), \
                     deps AS ( \
                         SELECT t.nspname, t.relname, d.objid AS seq FROM t JOIN pg_depend d \
                           ON d.refobjid = t.oid AND d.refclassid = 'pg_class'::regclass \
                          AND d.classid = 'pg_class'::regclass AND d.deptype IN ('a', 'i') \
                         UNION \
                         SELECT t.nspname, t.relname, d.refobjid FROM t JOIN pg_attrdef ad ON ad.adrelid = t.oid \
                         JOIN pg_depend d ON d.classid = 'pg_attrdef'::regclass AND d.objid = ad.oid \
                          AND d.refclassid = 'pg_class'::regclass) \
                     SELECT DISTINCT ON (s.oid) deps.nspname::text, deps.relname::text, sn.nspname::text, s.relname::text, \
                         format_type(q.seqtypid, NULL), q.seqincrement, q.seqmin, q.seqmax, q.seqcycle, q.seqstart, \
                         has_sequence_privilege(s.oid, 'SELECT'), \
                         CASE WHEN has_sequence_privilege(s.oid, 'SELECT') THEN pg_sequence_last_value(s.oid) END \
                     FROM deps JOIN pg_class s ON s.oid = deps.seq AND s.relkind = 'S' \
                     JOIN pg_namespace sn ON sn.oid = s.relnamespace JOIN pg_sequence q ON q.seqrelid = s.oid \
                     ORDER BY s.oid, deps.nspname, deps.relname",
                    &[&schemas, &names],
                ),
            )
            .await?;
        Ok(rows
            .iter()
            .map(|r| {
                let last: Option<i64> = r.get(11);
                let state = SequenceState {
                    schema: r.get(2),
                    name: r.get(3),
                    data_type: r.get(4),
                    increment: r.get(5),
                    min: r.get(6),
                    max: r.get(7),
                    cycle: r.get(8),
                    // Never called (or not readable): its start is next.
                    last_value: last.unwrap_or_else(|| r.get(9)),
                    is_called: last.is_some(),
                };
                (TableId::new(r.get::<_, String>(0), r.get::<_, String>(1)), state, r.get(10))
            })
            .collect())
    }

    /// Runs `sql` (simple protocol) and returns the first row's values as
    /// text, or `None` when there is no row.
    pub async fn query_texts(&self, sql: &str) -> Result<Option<Vec<Option<String>>>> {
        let messages = self.ask("reading a row by key", self.client.simple_query(sql)).await?;
        for m in messages {
            if let tokio_postgres::SimpleQueryMessage::Row(row) = m {
                return Ok(Some((0..row.len()).map(|i| row.get(i).map(str::to_string)).collect()));
            }
        }
        Ok(None)
    }

    /// Whether the connected role is a superuser.
    pub async fn is_superuser(&self) -> Result<bool> {
        let row = self
            .ask(
                "reading the role",
                self.client
                    .query_one("SELECT rolsuper FROM pg_roles WHERE rolname = current_user", &[]),
            )
            .await?;
        Ok(row.get(0))
    }
}

/// The value of `attmissingval`'s text (`{7}`, `{"x y"}`) for `column`, or
/// `None` when it does not decode (the column then carries no default).
fn missing_value(column: &Column, table: &TableId, text: &str) -> Option<tributary_schemas::Value> {
    let items = parse_array(text)?;
    let [ArrayItem::Text(item)] = items.as_slice() else {
        return None;
    };
    let col = ColumnRef {
        table,
        column: &column.name,
        source_type: &column.source_type,
        nullable: column.nullable,
    };
    decode_text(&column.data_type, item, col).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue #23: PostgreSQL 13+'s error for a slot invalidated by
    /// max_slot_wal_keep_size is SQLSTATE 55000, like a wrong wal_level; it
    /// must say what happened, not "set wal_level = logical".
    #[test]
    fn an_invalidated_slot_is_named_not_blamed_on_wal_level() {
        let msg = "can no longer get changes from replication slot \"s_eo\" (SQLSTATE 55000)".to_string();
        let e = classify_wire(PgWireError::Server(msg), "starting replication");
        assert_eq!(e.kind(), crate::error::ErrorKind::NeedsOperator);
        assert_eq!(e.class(), "tributary.slot_lost");
        assert!(e.message().contains("replication slot s_eo was invalidated"), "{e}");
        assert!(e.message().contains("max_slot_wal_keep_size"), "{e}");
        let hint = e.hint().expect("a hint");
        assert!(!hint.contains("wal_level"), "{hint}");
        assert!(hint.contains("pg_drop_replication_slot('s_eo')"), "{hint}");
        // PostgreSQL 15's words, as START_REPLICATION gave them to the
        // stack's server (tests/tests/postgres_slot_lost.rs saw them with
        // the start's own check taken out).
        let msg = "cannot read from logical replication slot \"s_eo\" (SQLSTATE 55000)".to_string();
        let e = classify_wire(PgWireError::Server(msg), "starting replication");
        assert_eq!(e.class(), "tributary.slot_lost", "{e}");
        assert!(!e.hint().unwrap_or_default().contains("wal_level"), "{e}");
        // A real wal_level problem keeps its hint.
        let msg = "logical decoding requires wal_level >= logical (SQLSTATE 55000)".to_string();
        let e = classify_wire(PgWireError::Server(msg), "creating a replication slot");
        assert!(e.hint().is_some_and(|h| h.contains("wal_level = logical")), "{e}");
    }

    fn cols(names: &[&str]) -> Vec<(i16, String)> {
        names.iter().enumerate().map(|(i, n)| (i as i16 + 1, n.to_string())).collect()
    }

    #[test]
    fn renames_chain_and_replays_are_ignored() {
        let t = TableId::new("s", "t");
        let mut r = Renames::default();
        r.tables.insert(
            7,
            Tracked {
                name: t.clone(),
                columns: cols(&["id", "a"]).into_iter().collect(),
                as_of: (100, u64::MAX),
            },
        );
        // Committed before the catalog read: already in the catalog.
        assert!(!r.is_news(7, (90, 5), &t, Some(&cols(&["id", "x"]))));
        assert!(!r.is_news(8, (200, 5), &t, Some(&cols(&["id", "x"]))), "unknown table");
        for (at, names) in [((200, 5), ["id", "b"]), ((300, 5), ["id", "c"])] {
            assert!(r.is_news(7, at, &t, Some(&cols(&names))));
            assert_eq!(r.note(7, at, &t, Some(&cols(&names))), None);
        }
        assert_eq!(r.aliases(7, "c"), ["a", "b"]);
        assert!(r.aliases(7, "b").is_empty());
        // A replay of the first rename says nothing new.
        assert!(!r.is_news(7, (200, 5), &t, Some(&cols(&["id", "b"]))));
        // A table rename returns the old name.
        let u = TableId::new("s2", "u");
        assert!(r.is_news(7, (400, 0), &u, None));
        assert_eq!(r.note(7, (400, 0), &u, None), Some(t.clone()));
        assert!(!r.is_news(7, (400, 0), &t, None), "replayed Relation under the old name");
    }

    #[test]
    fn wire_errors_are_classified_by_sqlstate() {
        let e = classify_wire(
            PgWireError::Server("replication slot \"x\" does not exist (SQLSTATE 42704)".into()),
            "starting",
        );
        assert_eq!(e.kind(), ErrorKind::NeedsOperator);
        assert!(e.hint().unwrap_or("").contains("checkpoint"));
        let e = classify_wire(
            PgWireError::Server("replication slot \"x\" is active for PID 1 (SQLSTATE 55006)".into()),
            "starting",
        );
        assert_eq!(e.kind(), ErrorKind::Retryable);
    }
}

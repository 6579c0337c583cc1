//! What the source asks of SQL Server, behind [`CdcClient`]: the catalog
//! of capture instances, the LSN bounds, the change rows of a capture
//! instance, and the snapshot transaction. [`TiberiusClient`] asks a real
//! server over TDS; `fake::FakeServer` answers from memory with the same
//! documented semantics, and drives every test that needs no server.
//!
//! The queries are Debezium's (`SqlServerConnection`):
//! `cdc.fn_cdc_get_all_changes_<capture_instance>(from, to, N'all update old')`
//! (<https://learn.microsoft.com/sql/relational-databases/system-functions/cdc-fn-cdc-get-all-changes-capture-instance-transact-sql>),
//! `sys.fn_cdc_get_max_lsn()` and `sys.fn_cdc_get_min_lsn(capture_instance)`,
//! and `cdc.change_tables` / `cdc.captured_columns` / `cdc.index_columns`
//! for the catalog
//! (<https://learn.microsoft.com/sql/relational-databases/system-tables/cdc-change-tables-transact-sql>).

use std::sync::Arc;

use async_trait::async_trait;
use secrecy::ExposeSecret;
use tokio::net::TcpStream;
use tokio_util::compat::{Compat, TokioAsyncWriteCompatExt};
use tributary_schemas::{Row, TableId, Value};

use super::config::ConnectionParams;
use super::lsn::Lsn;
use super::types::{decode, map_type, quote_ident, quote_literal, select_expr, ColumnDef};
use crate::error::{Error, ErrorKind, Result};
use crate::tls::TlsMode;

/// `__$operation` of a change row
/// (<https://learn.microsoft.com/sql/relational-databases/system-tables/cdc-capture-instance-ct-transact-sql>).
pub mod operation {
    /// A deleted row (its values before the delete).
    pub const DELETE: u8 = 1;
    /// An inserted row.
    pub const INSERT: u8 = 2;
    /// An updated row's values before the update (`all update old` only).
    pub const UPDATE_BEFORE: u8 = 3;
    /// An updated row's values after the update.
    pub const UPDATE_AFTER: u8 = 4;
}

/// A capture instance: one change table of one source table, with the
/// columns it captured when it was created (a later `ALTER TABLE` does not
/// change them: a second instance is needed, see `stream.rs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaptureInstance {
    /// Its name (`dbo_orders`, `dbo_orders_v2`).
    pub name: String,
    /// The source table.
    pub table: TableId,
    /// `cdc.change_tables.start_lsn`: the low end of its validity interval;
    /// at creation the LSN from which it captures.
    pub start_lsn: Lsn,
    /// Captured columns, in ordinal order.
    pub columns: Vec<ColumnDef>,
    /// The unique index it identifies rows by (`cdc.index_columns`): the
    /// primary key, or `@index_name`; empty when there is none.
    pub key: Vec<String>,
}

/// One row of `cdc.fn_cdc_get_all_changes_<instance>`.
#[derive(Debug, Clone, PartialEq)]
pub struct ChangeRow {
    /// `__$start_lsn`: the commit LSN of its transaction.
    pub start_lsn: Lsn,
    /// `__$seqval`: orders the changes of one transaction.
    pub seqval: Lsn,
    /// `__$operation` (see [`operation`]).
    pub operation: u8,
    /// Commit time (`sys.fn_cdc_map_lsn_to_time(__$start_lsn)`), ms since
    /// the epoch, as the server's clock wrote it.
    pub ts_ms: i64,
    /// The captured columns' values, in the order of the instance's columns.
    pub row: Row,
}

impl ChangeRow {
    /// The order of change rows: (commit LSN, `__$seqval`, `__$operation`),
    /// which puts a key update's delete (1) before its insert (2) and an
    /// update's before image (3) before its after image (4).
    pub fn order_key(&self) -> (Lsn, Lsn, u8) {
        (self.start_lsn, self.seqval, self.operation)
    }
}

/// A table as `check` sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableFacts {
    /// The table.
    pub table: TableId,
    /// Its current columns' names.
    pub columns: Vec<String>,
    /// Whether it has a primary key.
    pub has_primary_key: bool,
    /// Whether the login may SELECT it (the snapshot reads it).
    pub select: bool,
}

/// Everything `check` reads in one go.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DatabaseFacts {
    /// `DB_NAME()`.
    pub database: String,
    /// The login's database user (`USER_NAME()`).
    pub user: String,
    /// `sys.databases.is_cdc_enabled`.
    pub cdc_enabled: bool,
    /// `sys.databases.snapshot_isolation_state = 1` (ALLOW_SNAPSHOT_ISOLATION ON).
    pub snapshot_isolation: bool,
    /// Whether SQL Server Agent runs; `None` when the login may not see it
    /// (`sys.dm_server_services` needs VIEW SERVER STATE).
    pub agent_running: Option<bool>,
    /// Whether the CDC capture job exists (`msdb.dbo.cdc_jobs`); `None`
    /// when unreadable.
    pub capture_job: Option<bool>,
    /// Whether the CDC cleanup job exists; `None` when unreadable.
    pub cleanup_job: Option<bool>,
    /// `HAS_PERMS_BY_NAME('cdc', 'SCHEMA', 'SELECT')`.
    pub select_on_cdc: bool,
    /// `HAS_PERMS_BY_NAME(DB_NAME(), 'DATABASE', 'VIEW DATABASE STATE')`.
    pub view_database_state: bool,
    /// User tables.
    pub tables: Vec<TableFacts>,
}

/// The queries the source makes. Every LSN bound is inclusive, as in the
/// CDC functions.
#[async_trait]
pub trait CdcClient: Send {
    /// What `check` needs.
    async fn facts(&mut self) -> Result<DatabaseFacts>;
    /// The user tables that exist now.
    async fn tables(&mut self) -> Result<Vec<TableId>>;
    /// Every capture instance of the database.
    async fn capture_instances(&mut self) -> Result<Vec<CaptureInstance>>;
    /// `sys.fn_cdc_get_max_lsn()`: the commit LSN of the last transaction
    /// the capture job has harvested ([`Lsn::ZERO`] when none).
    async fn max_lsn(&mut self) -> Result<Lsn>;
    /// `sys.fn_cdc_get_min_lsn(instance)`: the low end of its validity
    /// interval, moved up by the cleanup job; [`Lsn::ZERO`] when the
    /// instance does not exist.
    async fn min_lsn(&mut self, instance: &str) -> Result<Lsn>;
    /// The change rows of `instance` with `from <= __$start_lsn <= to`,
    /// ordered by (`__$start_lsn`, `__$seqval`, `__$operation`), reading
    /// `instance.columns` only. `from` must not be below the instance's
    /// minimum LSN (the server fails with error 313).
    async fn changes(&mut self, instance: &CaptureInstance, from: Lsn, to: Lsn) -> Result<Vec<ChangeRow>>;
    /// Opens a SNAPSHOT-isolation transaction and returns
    /// `sys.fn_cdc_get_max_lsn()` read inside it: the rows it reads are
    /// the state after that LSN.
    async fn begin_snapshot(&mut self) -> Result<Lsn>;
    /// Up to `limit` rows of `instance.table` (its `columns`) in key order,
    /// after the key `after` (`None`: from the first), in the snapshot
    /// transaction.
    async fn snapshot_rows(
        &mut self,
        instance: &CaptureInstance,
        after: Option<&[Value]>,
        limit: usize,
    ) -> Result<Vec<Row>>;
    /// Ends the snapshot transaction.
    async fn end_snapshot(&mut self) -> Result<()>;
}

/// Opens clients: the real server's, or the fake's.
#[async_trait]
pub trait Connector: Send + Sync + std::fmt::Debug {
    /// A new connection.
    async fn connect(&self) -> Result<Box<dyn CdcClient>>;
}

// ------------------------------------------------------------------ tiberius

/// Connects to a real SQL Server with tiberius.
#[derive(Debug, Clone)]
pub struct TiberiusConnector {
    params: Arc<ConnectionParams>,
}

impl TiberiusConnector {
    /// A connector for `params`.
    pub fn new(params: ConnectionParams) -> Self {
        Self { params: Arc::new(params) }
    }
}

#[async_trait]
impl Connector for TiberiusConnector {
    async fn connect(&self) -> Result<Box<dyn CdcClient>> {
        Ok(Box::new(TiberiusClient::connect(&self.params).await?))
    }
}

/// A TDS session.
pub struct TiberiusClient {
    client: tiberius::Client<Compat<TcpStream>>,
    database: String,
}

/// Classifies a tiberius error; `context` says what was being done.
/// Server errors by number
/// (<https://learn.microsoft.com/sql/relational-databases/errors-events/database-engine-events-and-errors>).
pub fn classify(err: tiberius::error::Error, context: &str) -> Error {
    use tiberius::error::Error as E;
    let (kind, class, hint): (ErrorKind, String, Option<&str>) = match &err {
        E::Server(s) => {
            let code = s.code();
            let (kind, hint) = match code {
                // Login failed.
                18456 => (ErrorKind::NeedsOperator, Some("check the user and password in sqlserver.url / sqlserver.password")),
                // Permission denied on an object, schema or database.
                229 | 230 | 262 | 297 | 300 => {
                    (ErrorKind::NeedsOperator, Some("grant the rights `source-runner check` lists"))
                }
                // Cannot open the database.
                4060 => (ErrorKind::NeedsOperator, Some("check the database name in sqlserver.url")),
                // "An insufficient number of arguments were supplied for
                // cdc.fn_cdc_get_all_changes_...": the LSN range is outside
                // the instance's validity interval (cleanup, or it is gone).
                313 => (
                    ErrorKind::NeedsOperator,
                    Some("the changes since the checkpoint were cleaned up: copy the table again (see docs/sources/sqlserver.md, Cleanup)"),
                ),
                // Snapshot isolation not allowed in the database.
                3952 => (
                    ErrorKind::NeedsOperator,
                    Some("ALTER DATABASE [<db>] SET ALLOW_SNAPSHOT_ISOLATION ON; (see source-runner check)"),
                ),
                // Invalid object (a change function or table gone).
                208 => (ErrorKind::NeedsOperator, Some("a capture instance or table is gone: run source-runner check")),
                // Deadlock victim, lock timeout, server shutting down,
                // database failing over: try again.
                1205 | 1222 | 6005 | 40613 | 40197 | 40501 => (ErrorKind::Retryable, None),
                _ => (ErrorKind::Retryable, None),
            };
            (kind, format!("sqlserver.{code}"), hint)
        }
        E::Io { .. } => (ErrorKind::Retryable, "sqlserver.io".into(), None),
        E::Tls(_) => (
            ErrorKind::NeedsOperator,
            "sqlserver.tls".into(),
            Some("the TLS handshake failed: check sqlserver.tls_ca_file and that sqlserver.url names a host the certificate names"),
        ),
        _ => (ErrorKind::Retryable, "sqlserver".into(), None),
    };
    let mut e = Error::new(kind, format!("{context}: {err}")).with_class(class);
    if let Some(h) = hint {
        e = e.with_hint(h);
    }
    e
}

fn lsn_of(data: Option<&tiberius::ColumnData<'static>>, what: &str) -> Result<Lsn> {
    match data {
        Some(tiberius::ColumnData::Binary(Some(b))) => Lsn::from_slice(b),
        Some(tiberius::ColumnData::Binary(None)) | None => Ok(Lsn::ZERO),
        Some(_) => Err(Error::permanent(format!("{what} is not binary(10)"))),
    }
}

fn text(row: &tiberius::Row, i: usize) -> String {
    row.get::<&str, _>(i).unwrap_or_default().to_string()
}

impl TiberiusClient {
    /// Connects and logs in (SQL Server authentication).
    pub async fn connect(p: &ConnectionParams) -> Result<Self> {
        let mut config = tiberius::Config::new();
        config.host(&p.host);
        config.port(p.port);
        config.database(&p.database);
        config.application_name("tributary");
        config.authentication(tiberius::AuthMethod::sql_server(&p.user, p.password.expose_secret()));
        match p.tls {
            TlsMode::Disable => config.encryption(tiberius::EncryptionLevel::NotSupported),
            TlsMode::Require => {
                config.encryption(tiberius::EncryptionLevel::Required);
                config.trust_cert();
            }
            TlsMode::VerifyCa | TlsMode::VerifyFull => {
                config.encryption(tiberius::EncryptionLevel::Required);
                let ca = p
                    .tls_ca_file
                    .as_deref()
                    .ok_or_else(|| Error::needs_operator("sqlserver.tls_ca_file is required to verify the server"))?;
                config.trust_cert_ca(ca);
            }
        }
        let addr = format!("{}:{}", p.host, p.port);
        let tcp = tokio::time::timeout(p.connect_timeout, TcpStream::connect(&addr))
            .await
            .map_err(|_| Error::retryable(format!("connecting to {addr}: timed out after {:?}", p.connect_timeout)))?
            .map_err(|e| Error::retryable(format!("connecting to {addr}: {e}")))?;
        let _ = tcp.set_nodelay(true);
        // tiberius's rustls uses the process-wide provider: name ring, the
        // provider of every other TLS connection here.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = tiberius::Client::connect(config, tcp.compat_write())
            .await
            .map_err(|e| classify(e, &format!("logging in to {addr}")))?;
        Ok(Self { client, database: p.database.clone() })
    }

    /// Runs a batch of statements, discarding any rows (tests and tools:
    /// the env-gated suite sets its database up with it).
    pub async fn execute(&mut self, sql: &str) -> Result<()> {
        let stream = self
            .client
            .simple_query(sql)
            .await
            .map_err(|e| classify(e, "running a batch"))?;
        stream.into_results().await.map_err(|e| classify(e, "running a batch"))?;
        Ok(())
    }

    async fn rows(&mut self, sql: &str, context: &str) -> Result<Vec<tiberius::Row>> {
        let stream = self.client.simple_query(sql).await.map_err(|e| classify(e, context))?;
        stream.into_first_result().await.map_err(|e| classify(e, context))
    }

    fn decode_row(instance: &CaptureInstance, cells: Vec<tiberius::ColumnData<'static>>) -> Result<Row> {
        if cells.len() != instance.columns.len() {
            return Err(Error::permanent(format!(
                "capture instance {} returned {} columns, expected {}",
                instance.name,
                cells.len(),
                instance.columns.len()
            )));
        }
        cells
            .into_iter()
            .zip(&instance.columns)
            .map(|(cell, col)| decode(cell, &map_type(&instance.table, col)?, &instance.table, col))
            .collect()
    }
}

/// The select list of `instance`'s columns.
pub fn select_list(instance: &CaptureInstance) -> String {
    instance.columns.iter().map(select_expr).collect::<Vec<_>>().join(", ")
}

/// A key value as a T-SQL literal for keyset paging (the server converts it
/// to the column's type for the comparison).
pub fn key_literal(v: &Value) -> Result<String> {
    Ok(match v {
        Value::Int16(i) => i.to_string(),
        Value::Int32(i) => i.to_string(),
        Value::Int64(i) => i.to_string(),
        Value::Boolean(b) => u8::from(*b).to_string(),
        Value::Bytes(b) => {
            let mut s = String::from("0x");
            for byte in b {
                s.push_str(&format!("{byte:02X}"));
            }
            s
        }
        Value::Null => "NULL".into(),
        other => {
            let mut s = String::new();
            crate::sink::text::render_text(&mut s, other).map_err(Error::permanent)?;
            quote_literal(&s)
        }
    })
}

/// A key value as a literal of its column's type: a `char` / `varchar`
/// column compares under its own collation only against non-Unicode text
/// (against `N'...'` the column is converted to nvarchar, whose order can
/// differ from the `ORDER BY` of the column under a SQL collation).
fn key_operand(column: Option<&ColumnDef>, v: &Value) -> Result<String> {
    let literal = key_literal(v)?;
    Ok(match column.map(ColumnDef::base).as_deref() {
        Some("char" | "varchar") if matches!(v, Value::Text(_)) => format!("CAST({literal} AS varchar(max))"),
        _ => literal,
    })
}

/// `(k1 > v1) OR (k1 = v1 AND k2 > v2) ...`: the rows after `after` in key
/// order; `columns` give the key columns' types.
pub fn keyset_after(columns: &[ColumnDef], key: &[String], after: &[Value]) -> Result<String> {
    let col = |name: &str| columns.iter().find(|c| c.name == name);
    let mut ors = Vec::new();
    for i in 0..key.len().min(after.len()) {
        let mut ands = Vec::new();
        for j in 0..i {
            ands.push(format!("{} = {}", quote_ident(&key[j]), key_operand(col(&key[j]), &after[j])?));
        }
        ands.push(format!("{} > {}", quote_ident(&key[i]), key_operand(col(&key[i]), &after[i])?));
        ors.push(format!("({})", ands.join(" AND ")));
    }
    Ok(ors.join(" OR "))
}

#[async_trait]
impl CdcClient for TiberiusClient {
    async fn facts(&mut self) -> Result<DatabaseFacts> {
        let rows = self
            .rows(
                "SELECT DB_NAME(), USER_NAME(), CAST(d.is_cdc_enabled AS int), CAST(d.snapshot_isolation_state AS int), \
                 HAS_PERMS_BY_NAME('cdc', 'SCHEMA', 'SELECT'), \
                 HAS_PERMS_BY_NAME(DB_NAME(), 'DATABASE', 'VIEW DATABASE STATE') \
                 FROM sys.databases d WHERE d.name = DB_NAME()",
                "reading the database's CDC settings",
            )
            .await?;
        let r = rows
            .first()
            .ok_or_else(|| Error::retryable("sys.databases has no row for this database"))?;
        let mut facts = DatabaseFacts {
            database: text(r, 0),
            user: text(r, 1),
            cdc_enabled: r.get::<i32, _>(2) == Some(1),
            snapshot_isolation: r.get::<i32, _>(3) == Some(1),
            select_on_cdc: r.get::<i32, _>(4) == Some(1),
            view_database_state: r.get::<i32, _>(5) == Some(1),
            ..Default::default()
        };
        // Debezium's check: needs VIEW SERVER STATE, else unknown.
        facts.agent_running = self
            .rows(
                "SELECT CASE WHEN status = 4 THEN 1 ELSE 0 END FROM sys.dm_server_services \
                 WHERE servicename LIKE N'SQL Server Agent%'",
                "reading SQL Server Agent's state",
            )
            .await
            .ok()
            .and_then(|r| r.first().and_then(|r| r.get::<i32, _>(0)))
            .map(|s| s == 1);
        let jobs = self
            .rows("SELECT job_type FROM msdb.dbo.cdc_jobs WHERE database_id = DB_ID()", "reading the CDC jobs")
            .await
            .ok();
        if let Some(jobs) = jobs {
            let has = |t: &str| {
                jobs.iter()
                    .any(|r| r.get::<&str, _>(0).is_some_and(|j| j.eq_ignore_ascii_case(t)))
            };
            facts.capture_job = Some(has("capture"));
            facts.cleanup_job = Some(has("cleanup"));
        }
        let rows = self
            .rows(
                "SELECT s.name, t.name, c.name, \
                 CASE WHEN EXISTS (SELECT 1 FROM sys.indexes i WHERE i.object_id = t.object_id AND i.is_primary_key = 1) \
                 THEN 1 ELSE 0 END, \
                 HAS_PERMS_BY_NAME(QUOTENAME(s.name) + '.' + QUOTENAME(t.name), 'OBJECT', 'SELECT') \
                 FROM sys.tables t JOIN sys.schemas s ON s.schema_id = t.schema_id \
                 JOIN sys.columns c ON c.object_id = t.object_id \
                 WHERE t.is_ms_shipped = 0 AND s.name <> 'cdc' ORDER BY s.name, t.name, c.column_id",
                "listing the tables",
            )
            .await?;
        for r in &rows {
            let id = TableId::new(text(r, 0), text(r, 1));
            if facts.tables.last().is_none_or(|t| t.table != id) {
                facts.tables.push(TableFacts {
                    table: id,
                    columns: Vec::new(),
                    has_primary_key: r.get::<i32, _>(3) == Some(1),
                    select: r.get::<i32, _>(4) == Some(1),
                });
            }
            if let Some(t) = facts.tables.last_mut() {
                t.columns.push(text(r, 2));
            }
        }
        Ok(facts)
    }

    async fn tables(&mut self) -> Result<Vec<TableId>> {
        let rows = self
            .rows(
                "SELECT s.name, t.name FROM sys.tables t JOIN sys.schemas s ON s.schema_id = t.schema_id \
                 WHERE t.is_ms_shipped = 0 AND s.name <> 'cdc'",
                "listing the tables",
            )
            .await?;
        Ok(rows.iter().map(|r| TableId::new(text(r, 0), text(r, 1))).collect())
    }

    async fn capture_instances(&mut self) -> Result<Vec<CaptureInstance>> {
        let rows = self
            .rows(
                "SELECT ct.capture_instance, OBJECT_SCHEMA_NAME(ct.source_object_id), OBJECT_NAME(ct.source_object_id), \
                 ct.start_lsn FROM cdc.change_tables ct ORDER BY ct.create_date, ct.capture_instance",
                "listing the capture instances (cdc.change_tables)",
            )
            .await?;
        let mut out = Vec::new();
        for r in &rows {
            let start = lsn_of(r.cells().nth(3).map(|(_, d)| d), "cdc.change_tables.start_lsn")?;
            out.push(CaptureInstance {
                name: text(r, 0),
                table: TableId::new(text(r, 1), text(r, 2)),
                start_lsn: start,
                columns: Vec::new(),
                key: Vec::new(),
            });
        }
        // The change table's own columns carry the captured types with
        // their precision, scale and nullability.
        let cols = self
            .rows(
                "SELECT ct.capture_instance, cc.column_name, TYPE_NAME(c.user_type_id), c.precision, c.scale, \
                 c.max_length, CAST(c.is_nullable AS int) \
                 FROM cdc.captured_columns cc JOIN cdc.change_tables ct ON ct.object_id = cc.object_id \
                 JOIN sys.columns c ON c.object_id = ct.object_id AND c.name = cc.column_name \
                 ORDER BY ct.capture_instance, cc.column_ordinal",
                "reading the captured columns (cdc.captured_columns)",
            )
            .await?;
        for r in &cols {
            let name = text(r, 0);
            let base = text(r, 2);
            let (precision, scale, len) =
                (r.get::<u8, _>(3).unwrap_or(0), r.get::<u8, _>(4).unwrap_or(0), r.get::<i16, _>(5).unwrap_or(0));
            let type_text = match base.as_str() {
                "decimal" | "numeric" => format!("{base}({precision},{scale})"),
                "datetime2" | "time" | "datetimeoffset" => format!("{base}({scale})"),
                "float" => format!("float({})", if len == 4 { 24 } else { 53 }),
                _ => base,
            };
            if let Some(ci) = out.iter_mut().find(|c| c.name == name) {
                ci.columns.push(ColumnDef {
                    name: text(r, 1),
                    type_text,
                    nullable: r.get::<i32, _>(6) == Some(1),
                });
            }
        }
        let keys = self
            .rows(
                "SELECT ct.capture_instance, ic.column_name FROM cdc.index_columns ic \
                 JOIN cdc.change_tables ct ON ct.object_id = ic.object_id ORDER BY ct.capture_instance, ic.index_ordinal",
                "reading the capture instances' keys (cdc.index_columns)",
            )
            .await?;
        for r in &keys {
            let name = text(r, 0);
            if let Some(ci) = out.iter_mut().find(|c| c.name == name) {
                ci.key.push(text(r, 1));
            }
        }
        Ok(out)
    }

    async fn max_lsn(&mut self) -> Result<Lsn> {
        let rows = self
            .rows("SELECT sys.fn_cdc_get_max_lsn()", "reading sys.fn_cdc_get_max_lsn()")
            .await?;
        lsn_of(rows.first().and_then(|r| r.cells().next().map(|(_, d)| d)), "the max LSN")
    }

    async fn min_lsn(&mut self, instance: &str) -> Result<Lsn> {
        let sql = format!("SELECT sys.fn_cdc_get_min_lsn({})", quote_literal(instance));
        let rows = self.rows(&sql, "reading sys.fn_cdc_get_min_lsn").await?;
        lsn_of(rows.first().and_then(|r| r.cells().next().map(|(_, d)| d)), "the min LSN")
    }

    async fn changes(&mut self, instance: &CaptureInstance, from: Lsn, to: Lsn) -> Result<Vec<ChangeRow>> {
        // The instance name is from cdc.change_tables; quoted all the same.
        let sql = format!(
            "SELECT __$start_lsn, __$seqval, __$operation, \
             DATEDIFF_BIG(millisecond, '1970-01-01', sys.fn_cdc_map_lsn_to_time(__$start_lsn)), {cols} \
             FROM cdc.{func}({from}, {to}, N'all update old') \
             ORDER BY __$start_lsn, __$seqval, __$operation",
            cols = select_list(instance),
            func = quote_ident(&format!("fn_cdc_get_all_changes_{}", instance.name)),
            from = from.sql_literal(),
            to = to.sql_literal(),
        );
        let context = format!("reading the changes of capture instance {}", instance.name);
        let rows = self.rows(&sql, &context).await?;
        let mut out = Vec::with_capacity(rows.len());
        for r in rows {
            let mut cells: Vec<tiberius::ColumnData<'static>> = r.into_iter().collect();
            if cells.len() < 4 {
                return Err(Error::permanent(format!("{context}: a change row without its CDC columns")));
            }
            let rest = cells.split_off(4);
            let start_lsn = lsn_of(cells.first(), "__$start_lsn")?;
            let seqval = lsn_of(cells.get(1), "__$seqval")?;
            let operation = match cells.get(2) {
                Some(tiberius::ColumnData::I32(Some(op))) => u8::try_from(*op).unwrap_or(0),
                _ => 0,
            };
            let ts_ms = match cells.get(3) {
                Some(tiberius::ColumnData::I64(Some(ms))) => *ms,
                _ => 0,
            };
            out.push(ChangeRow {
                start_lsn,
                seqval,
                operation,
                ts_ms,
                row: Self::decode_row(instance, rest)?,
            });
        }
        Ok(out)
    }

    async fn begin_snapshot(&mut self) -> Result<Lsn> {
        // The snapshot is fixed at the first read inside the transaction:
        // reading the max LSN there makes the two agree.
        self.client
            .simple_query("SET TRANSACTION ISOLATION LEVEL SNAPSHOT; BEGIN TRANSACTION")
            .await
            .map_err(|e| classify(e, "opening the snapshot transaction"))?
            .into_results()
            .await
            .map_err(|e| classify(e, "opening the snapshot transaction"))?;
        self.max_lsn().await
    }

    async fn snapshot_rows(
        &mut self,
        instance: &CaptureInstance,
        after: Option<&[Value]>,
        limit: usize,
    ) -> Result<Vec<Row>> {
        let key: Vec<String> = if instance.key.is_empty() {
            instance.columns.iter().map(|c| c.name.clone()).collect()
        } else {
            instance.key.clone()
        };
        let filter = match after {
            Some(after) => format!("WHERE {}", keyset_after(&instance.columns, &key, after)?),
            None => String::new(),
        };
        let sql = format!(
            "SELECT TOP ({limit}) {cols} FROM {schema}.{table} {filter} ORDER BY {order}",
            cols = select_list(instance),
            schema = quote_ident(&instance.table.schema),
            table = quote_ident(&instance.table.table),
            order = key.iter().map(|k| quote_ident(k)).collect::<Vec<_>>().join(", "),
        );
        let rows = self.rows(&sql, &format!("reading {} for the snapshot", instance.table)).await?;
        rows.into_iter()
            .map(|r| Self::decode_row(instance, r.into_iter().collect()))
            .collect()
    }

    async fn end_snapshot(&mut self) -> Result<()> {
        self.client
            .simple_query("IF @@TRANCOUNT > 0 COMMIT TRANSACTION")
            .await
            .map_err(|e| classify(e, "ending the snapshot transaction"))?
            .into_results()
            .await
            .map_err(|e| classify(e, "ending the snapshot transaction"))?;
        tracing::debug!(database = %self.database, "snapshot transaction ended");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyset_paging_after_a_composite_key() {
        let key = vec!["a".to_string(), "b".to_string(), "c".to_string()];
        let cols = [
            ColumnDef::new("a", "int", false),
            ColumnDef::new("b", "nvarchar", false),
            ColumnDef::new("c", "varchar", false),
        ];
        let after = [Value::Int32(3), Value::Text("o'k".into()), Value::Text("x".into())];
        let sql = keyset_after(&cols, &key, &after).expect("renders");
        assert_eq!(
            sql,
            "([a] > 3) OR ([a] = 3 AND [b] > N'o''k') OR \
             ([a] = 3 AND [b] = N'o''k' AND [c] > CAST(N'x' AS varchar(max)))"
        );
        assert_eq!(key_literal(&Value::Bytes(vec![0, 0xab])).expect("bytes"), "0x00AB");
    }
}

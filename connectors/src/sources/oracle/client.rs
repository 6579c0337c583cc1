//! What the source asks of an Oracle database, as one trait
//! ([`LogMinerClient`]), its real implementation over the `oracle` crate
//! ([`OracleClient`]), and the classification of Oracle's errors.
//!
//! The source and `check` see only the trait: the in-memory fake
//! (`super::fake`) drives them in tests; [`OracleClient`] runs only
//! against a real database (the env-gated suite, `TRIBUTARY_ORACLE_URL`).
//! ODPI-C is blocking: every call runs on tokio's blocking pool.

use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use secrecy::{ExposeSecret, SecretString};
use tributary_schemas::TableId;

use super::config::ConnectionParams;
use super::logs::{LogFile, RedoThread};
use super::redo_sql::{quote_ident, quote_literal, quote_table};
use super::types::{snapshot_expr, DATE_MASK, TIMESTAMP_MASK, TIMESTAMP_TZ_MASK};
use crate::error::{Error, Result};

/// A column of the catalog (`ALL_TAB_COLUMNS`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ColumnDef {
    /// `COLUMN_NAME`.
    pub name: String,
    /// `DATA_TYPE` (`NUMBER`, `TIMESTAMP(6) WITH TIME ZONE`).
    pub type_text: String,
    /// `DATA_PRECISION`.
    pub precision: Option<u32>,
    /// `DATA_SCALE`.
    pub scale: Option<u32>,
    /// `NULLABLE = 'Y'`.
    pub nullable: bool,
    /// Names the column had before (`RENAME COLUMN`), oldest first: the
    /// schema's `Column::aliases`, so that sinks rename the column rather
    /// than split its values. Kept by the source (the catalog knows none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub aliases: Vec<String>,
}

/// A table's definition.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TableDef {
    /// Columns in `COLUMN_ID` order.
    pub columns: Vec<ColumnDef>,
    /// Primary key columns, in key order (empty: none).
    pub primary_key: Vec<String>,
}

/// One row of `V$LOGMNR_CONTENTS` (Oracle Database Reference,
/// "V$LOGMNR_CONTENTS").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogMinerRow {
    /// `SCN`.
    pub scn: u64,
    /// `OPERATION_CODE`: 1 INSERT, 2 DELETE, 3 UPDATE, 5 DDL, 6 START,
    /// 7 COMMIT, 9 SEL_LOB_LOCATOR, 10 LOB_WRITE, 11 LOB_TRIM,
    /// 28 LOB_ERASE, 36 ROLLBACK, 255 UNSUPPORTED.
    pub operation_code: u8,
    /// `XID` as hex text.
    pub xid: String,
    /// `THREAD#`.
    pub thread: u16,
    /// `RS_ID`: the redo record, which a CSF continuation row shares.
    pub rs_id: String,
    /// `SSN`: the SQL sequence number within the redo record.
    pub ssn: u64,
    /// `CSF`: the SQL_REDO goes on in the next row.
    pub csf: bool,
    /// `ROLLBACK`: the row undoes an earlier change (savepoint or full rollback).
    pub rollback: bool,
    /// `SEG_OWNER`.
    pub seg_owner: Option<String>,
    /// `TABLE_NAME`.
    pub table_name: Option<String>,
    /// `ROW_ID`.
    pub row_id: Option<String>,
    /// `SQL_REDO` (at most 4000 bytes a row: longer statements continue
    /// with `CSF`).
    pub sql_redo: Option<String>,
    /// `TIMESTAMP`, milliseconds since the epoch.
    pub ts_ms: i64,
}

/// The database-wide settings `check` and the source read.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DatabaseInfo {
    /// `V$DATABASE.LOG_MODE` (`ARCHIVELOG`).
    pub log_mode: String,
    /// `V$DATABASE.SUPPLEMENTAL_LOG_DATA_MIN` (`YES` / `IMPLICIT` / `NO`).
    pub supplemental_min: String,
    /// `V$DATABASE.SUPPLEMENTAL_LOG_DATA_ALL`.
    pub supplemental_all: bool,
    /// `V$DATABASE.DBID`: the epoch of SCNs.
    pub dbid: u64,
    /// `SYS_CONTEXT('USERENV', 'CON_NAME')` (`CDB$ROOT`, a PDB, or the
    /// database name of a non-CDB).
    pub con_name: String,
    /// `V$DATABASE.CDB = 'YES'`.
    pub cdb: bool,
    /// The session's user.
    pub user: String,
    /// The smallest online redo log group (`V$LOG.BYTES`), bytes.
    pub smallest_redo_log_bytes: u64,
}

/// A row of the snapshot: the `ROWID` and each column as canonical text.
pub type SnapshotRow = (String, Vec<Option<String>>);

/// Where a snapshot chunk resumes: after this key (tables with a primary
/// key) or this ROWID (the others; stable at one SCN).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum ChunkAfter {
    /// The last key's column texts.
    Key(Vec<Option<String>>),
    /// The last ROWID.
    RowId(String),
}

/// One row of a table as of an SCN, by primary key.
#[derive(Debug, Clone, Copy)]
pub struct RowAt<'a> {
    /// The table.
    pub table: &'a TableId,
    /// Its definition (captured columns, primary key).
    pub def: &'a TableDef,
    /// The SCN (flashback).
    pub scn: u64,
    /// The primary key's canonical texts, in key order.
    pub key: &'a [Option<String>],
}

/// What the source needs of an Oracle database.
#[async_trait]
pub trait LogMinerClient: Send + Sync {
    /// Database settings (`V$DATABASE`, session context).
    async fn database_info(&self) -> Result<DatabaseInfo>;
    /// `V$DATABASE.CURRENT_SCN`.
    async fn current_scn(&self) -> Result<u64>;
    /// The smallest `START_SCN` of `V$TRANSACTION` (the oldest open
    /// transaction), if any.
    async fn oldest_open_transaction(&self) -> Result<Option<u64>>;
    /// Tables of `owners` (`ALL_TABLES`), without the recycle bin.
    async fn list_tables(&self, owners: &[String]) -> Result<Vec<TableId>>;
    /// A table's columns and primary key; `None` when it does not exist.
    async fn table_def(&self, table: &TableId) -> Result<Option<TableDef>>;
    /// Up to `limit` rows of `table` as of `scn`, in key (or ROWID) order,
    /// after `after`. `def` is the definition the columns are read by.
    async fn snapshot_chunk(
        &self,
        table: &TableId,
        def: &TableDef,
        scn: u64,
        after: Option<&ChunkAfter>,
        limit: usize,
    ) -> Result<Vec<SnapshotRow>>;
    /// The row `at` names, its columns as [`LogMinerClient::snapshot_chunk`]
    /// reads them; `None` when there is none.
    async fn row_at(&self, at: RowAt<'_>) -> Result<Option<Vec<Option<String>>>>;
    /// Archived and online redo logs (`V$ARCHIVED_LOG`, `V$LOG` + `V$LOGFILE`).
    async fn logs(&self) -> Result<Vec<LogFile>>;
    /// Redo threads (`V$THREAD`).
    async fn threads(&self) -> Result<Vec<RedoThread>>;
    /// One LogMiner session over `files`, rows with SCN in `(start, end]`
    /// of `owners`' tables plus every transaction-control row, in SCN order.
    async fn mine(&self, files: &[LogFile], start: u64, end: u64, owners: &[String]) -> Result<Vec<LogMinerRow>>;
    /// System privileges and roles of the session (`SESSION_PRIVS`, `SESSION_ROLES`).
    async fn privileges(&self) -> Result<Vec<String>>;
    /// Whether the session can `SELECT` (and `FLASHBACK`) `table`.
    async fn can_read(&self, table: &TableId) -> Result<bool>;
    /// Whether `table` has supplemental logging of all columns (or
    /// primary-key columns: `Some(false)`), from `ALL_LOG_GROUPS`; `None`
    /// when it has none.
    async fn table_supplemental_logging(&self, table: &TableId) -> Result<Option<bool>>;
}

/// Maps an Oracle error code (`ORA-nnnnn`) to an error kind.
pub fn classify_code(code: i32, what: &str, message: &str) -> Error {
    let text = format!("{what}: ORA-{code:05}: {}", first_line(message));
    let e = match code {
        // Connection lost / not connected / TNS: retry.
        3113 | 3114 | 3135 | 12170 | 12514 | 12528 | 12537 | 12541 | 12543 | 12571 | 1033 | 1034 | 1089 | 1092 => {
            Error::retryable(text)
        }
        // Invalid username/password, account locked.
        1017 | 28000 | 28001 => Error::needs_operator(text).with_hint("check oracle.url's user and oracle.password"),
        // Insufficient privileges, table or view does not exist.
        1031 | 942 | 1039 => {
            Error::needs_operator(text).with_hint("grant what `source-runner check` lists (docs/sources/oracle.md)")
        }
        // Missing log file (ORA-01291), log file not found / cannot open (ORA-00308).
        1291 | 308 => Error::needs_operator(text)
            .with_hint("a redo log the window needs is gone: restore it, or copy again (docs/sources/oracle.md)"),
        // Snapshot too old; flashback too old (undo retention).
        1555 | 8180 => Error::needs_operator(text).with_hint(
            "the snapshot SCN fell out of undo: raise UNDO_RETENTION (ALTER SYSTEM SET UNDO_RETENTION = 86400) or \
             lower oracle.snapshot_chunk_rows, then start again",
        ),
        // ORA-01281 SCN range invalid, ORA-01284 file cannot be opened, ORA-00600 internal: retry once more.
        _ => Error::retryable(text),
    };
    e.with_class(format!("ORA-{code:05}"))
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or("")
}

fn classify(e: oracle::Error, what: &str) -> Error {
    // ODPI-C could not load Oracle Instant Client (DPI-1047, reported as
    // ORA-00000): nothing connects until an operator installs it.
    if e.to_string().contains("DPI-1047") {
        return Error::needs_operator(format!("{what}: {e}")).with_class("DPI-1047").with_hint(
            "install Oracle Instant Client (Basic or Basic Light) and put its directory in LD_LIBRARY_PATH, see \
             docs/sources/oracle.md",
        );
    }
    match e.db_error() {
        Some(db) => classify_code(db.code(), what, db.message()),
        None => Error::retryable(format!("{what}: {e}")).with_class("oracle.client"),
    }
}

/// The SQL that opens a session for the source: every date and timestamp
/// rendered in the masks [`super::types`] parses, in UTC.
pub const SESSION_SETUP: [&str; 4] = [
    "ALTER SESSION SET NLS_DATE_FORMAT = 'YYYY-MM-DD HH24:MI:SS'",
    "ALTER SESSION SET NLS_TIMESTAMP_FORMAT = 'YYYY-MM-DD HH24:MI:SS.FF9'",
    "ALTER SESSION SET NLS_TIMESTAMP_TZ_FORMAT = 'YYYY-MM-DD HH24:MI:SS.FF9 TZH:TZM'",
    "ALTER SESSION SET TIME_ZONE = '+00:00'",
];

/// The flashback select of one snapshot chunk: canonical text per column,
/// `AS OF SCN`, after the last key (an expanded row comparison: Oracle has
/// no `(a, b) > (x, y)`), in key order.
pub fn snapshot_sql(
    table: &TableId,
    columns: &[tributary_schemas::Column],
    key: &[String],
    after: Option<&ChunkAfter>,
    limit: usize,
) -> (String, usize) {
    let exprs: Vec<String> = columns.iter().map(snapshot_expr).collect();
    let mut sql = format!("SELECT ROWIDTOCHAR(ROWID), {} FROM {} AS OF SCN :1", exprs.join(", "), quote_table(table));
    let mut binds = 1;
    let order: Vec<String> = if key.is_empty() {
        vec!["ROWID".into()]
    } else {
        key.iter().map(|k| quote_ident(k)).collect()
    };
    match after {
        Some(ChunkAfter::RowId(_)) => {
            sql.push_str(" WHERE ROWID > CHARTOROWID(:2)");
            binds = 2;
        }
        Some(ChunkAfter::Key(_)) => {
            // (k1 > :2) OR (k1 = :2 AND k2 > :3) ...
            let mut ors = Vec::new();
            for i in 0..key.len() {
                let mut ands: Vec<String> = (0..i)
                    .map(|j| format!("{} = {}", order[j], bind_expr(columns, &key[j], j + 2)))
                    .collect();
                ands.push(format!("{} > {}", order[i], bind_expr(columns, &key[i], i + 2)));
                ors.push(format!("({})", ands.join(" AND ")));
            }
            sql.push_str(&format!(" WHERE {}", ors.join(" OR ")));
            binds = 1 + key.len();
        }
        None => {}
    }
    sql.push_str(&format!(" ORDER BY {} FETCH FIRST {limit} ROWS ONLY", order.join(", ")));
    (sql, binds)
}

/// A bind of a key column's canonical text, converted back to its type.
fn bind_expr(columns: &[tributary_schemas::Column], name: &str, n: usize) -> String {
    let st = columns
        .iter()
        .find(|c| c.name == name)
        .map(|c| c.source_type.to_ascii_uppercase())
        .unwrap_or_default();
    if st == "DATE" {
        format!("TO_DATE(:{n}, '{DATE_MASK}')")
    } else if st.starts_with("TIMESTAMP") && st.contains("TIME ZONE") {
        format!("TO_TIMESTAMP_TZ(:{n} || ' +00:00', '{TIMESTAMP_TZ_MASK}')")
    } else if st.starts_with("TIMESTAMP") {
        format!("TO_TIMESTAMP(:{n}, '{TIMESTAMP_MASK}')")
    } else if st.starts_with("RAW") {
        format!("HEXTORAW(:{n})")
    } else if st.starts_with("NUMBER") || st.starts_with("FLOAT") {
        format!("TO_NUMBER(:{n})")
    } else {
        format!(":{n}")
    }
}

/// The `V$LOGMNR_CONTENTS` query of one window: the captured owners' row
/// changes and every transaction-control row (a commit or rollback has no
/// owner), in SCN order; mining from the root for `pdb`, that PDB's rows
/// alone (a transaction never spans two containers, so its control rows
/// are the PDB's too: Debezium filters the same way).
pub fn contents_sql(owners: &[String], pdb: Option<&str>) -> String {
    let owners: Vec<String> = owners.iter().map(|o| quote_literal(o)).collect();
    let container = pdb
        .map(|p| format!(" AND SRC_CON_NAME = {}", quote_literal(p)))
        .unwrap_or_default();
    format!(
        "SELECT SCN, OPERATION_CODE, RAWTOHEX(XID), THREAD#, RS_ID, SSN, CSF, ROLLBACK, SEG_OWNER, TABLE_NAME, \
         ROW_ID, SQL_REDO, (CAST(TIMESTAMP AS DATE) - DATE '1970-01-01') * 86400000 \
         FROM V$LOGMNR_CONTENTS WHERE SCN > :1 AND SCN <= :2{container} AND (OPERATION_CODE IN (6, 7, 36) \
         OR (SEG_OWNER IN ({}) AND OPERATION_CODE IN (1, 2, 3, 5, 9, 10, 11, 28, 68, 70, 71, 255)))",
        owners.join(", ")
    )
}

/// The real database, over ODPI-C (Oracle Instant Client loaded at run
/// time). Not exercised here: no Oracle runs on the development machines
/// (docs/sources/oracle.md, "What was verified").
pub struct OracleClient {
    /// The session in the URL's container (or, mining from the root, the
    /// one switched to the PDB): catalog, snapshot, flashback reads.
    conn: Arc<Mutex<oracle::Connection>>,
    /// Mining from the root for a PDB: the session in `CDB$ROOT` (LogMiner,
    /// logs, SCNs, privileges).
    root: Option<Arc<Mutex<oracle::Connection>>>,
    /// That PDB.
    pdb: Option<String>,
}

impl std::fmt::Debug for OracleClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OracleClient").finish_non_exhaustive()
    }
}

impl OracleClient {
    /// Connects (`user`, `password`, EZConnect `host:port/service`).
    pub async fn connect(user: &str, password: &SecretString, connect: &str) -> Result<Self> {
        let (user, password, connect) = (user.to_string(), password.expose_secret().to_string(), connect.to_string());
        let conn = tokio::task::spawn_blocking(move || -> Result<oracle::Connection> {
            let conn =
                oracle::Connection::connect(&user, &password, &connect).map_err(|e| classify(e, "connecting"))?;
            for sql in SESSION_SETUP {
                conn.execute(sql, &[]).map_err(|e| classify(e, "setting up the session"))?;
            }
            Ok(conn)
        })
        .await
        .map_err(|e| Error::retryable(format!("connecting: {e}")))??;
        Ok(Self {
            conn: Arc::new(Mutex::new(conn)),
            root: None,
            pdb: None,
        })
    }

    /// Connects as `p` says: one session in the URL's container, or, with
    /// `p.pdb` (`oracle.pdb_name`), one in the CDB root for LogMiner and
    /// one switched to the PDB for the catalog and the snapshot.
    pub async fn open(p: &ConnectionParams) -> Result<Self> {
        let first = Self::connect(&p.user, &p.password, &p.connect).await?;
        let Some(pdb) = p.pdb.clone() else { return Ok(first) };
        let data = Self::connect(&p.user, &p.password, &p.connect).await?;
        let switch = format!("ALTER SESSION SET CONTAINER = {}", quote_ident(&pdb));
        data.with(move |c| {
            c.execute(&switch, &[])
                .map_err(|e| classify(e, "switching to the PDB (ALTER SESSION SET CONTAINER; oracle.pdb_name)"))?;
            // Set again in the PDB: the settings above were the root's.
            for sql in SESSION_SETUP {
                c.execute(sql, &[]).map_err(|e| classify(e, "setting up the session"))?;
            }
            Ok(())
        })
        .await?;
        Ok(Self {
            conn: data.conn,
            root: Some(first.conn),
            pdb: Some(pdb),
        })
    }

    /// Runs `f` with the connection on the blocking pool.
    pub async fn with<T: Send + 'static>(
        &self,
        f: impl FnOnce(&oracle::Connection) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        run(self.conn.clone(), f).await
    }

    /// Runs `f` with the session LogMiner runs in: the root's when mining
    /// for a PDB from it, else the only one.
    async fn with_root<T: Send + 'static>(
        &self,
        f: impl FnOnce(&oracle::Connection) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        run(self.root.clone().unwrap_or_else(|| self.conn.clone()), f).await
    }
}

async fn run<T: Send + 'static>(
    conn: Arc<Mutex<oracle::Connection>>,
    f: impl FnOnce(&oracle::Connection) -> Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(move || {
        let conn = conn.lock().unwrap_or_else(PoisonError::into_inner);
        f(&conn)
    })
    .await
    .map_err(|e| Error::retryable(format!("the Oracle call did not finish: {e}")))?
}

impl OracleClient {
    /// Executes a statement and commits (tests and the env-gated suite).
    pub async fn execute(&self, sql: &str) -> Result<()> {
        let sql = sql.to_string();
        self.with(move |c| {
            c.execute(&sql, &[]).map_err(|e| classify(e, "executing"))?;
            c.commit().map_err(|e| classify(e, "committing"))
        })
        .await
    }
}

fn strings(
    c: &oracle::Connection,
    sql: &str,
    binds: &[&dyn oracle::sql_type::ToSql],
    what: &str,
) -> Result<Vec<Vec<Option<String>>>> {
    let rows = c.query(sql, binds).map_err(|e| classify(e, what))?;
    let mut out = Vec::new();
    for row in rows {
        let row = row.map_err(|e| classify(e, what))?;
        let n = row.sql_values().len();
        let mut vals = Vec::with_capacity(n);
        for i in 0..n {
            vals.push(row.get::<usize, Option<String>>(i).map_err(|e| classify(e, what))?);
        }
        out.push(vals);
    }
    Ok(out)
}

/// Rows of a snapshot select (`ROWID`, then the columns): RAW and BLOB
/// columns (`bytes`) fetched as bytes and written as hex, like the redo's
/// `HEXTORAW`; the others as text.
fn fetch_rows(
    c: &oracle::Connection,
    sql: &str,
    binds: &[&dyn oracle::sql_type::ToSql],
    bytes: &[bool],
    what: &str,
) -> Result<Vec<SnapshotRow>> {
    let mut out = Vec::new();
    for row in c.query(sql, binds).map_err(|e| classify(e, what))? {
        let row = row.map_err(|e| classify(e, what))?;
        let rowid: Option<String> = row.get(0).map_err(|e| classify(e, what))?;
        let mut vals = Vec::with_capacity(bytes.len());
        for (i, is_bytes) in bytes.iter().enumerate() {
            vals.push(if *is_bytes {
                let b: Option<Vec<u8>> = row.get(i + 1).map_err(|e| classify(e, what))?;
                b.map(|b| b.iter().map(|x| format!("{x:02x}")).collect())
            } else {
                row.get::<usize, Option<String>>(i + 1).map_err(|e| classify(e, what))?
            });
        }
        out.push((rowid.unwrap_or_default(), vals));
    }
    Ok(out)
}

/// Which columns come as bytes (RAW, BLOB), written as hex like the
/// redo's `HEXTORAW`.
fn bytes_columns(columns: &[tributary_schemas::Column]) -> Vec<bool> {
    columns
        .iter()
        .map(|c| c.data_type == tributary_schemas::DataType::Bytes)
        .collect()
}

/// The flashback select of one row by its primary key.
pub fn row_sql(table: &TableId, columns: &[tributary_schemas::Column], key: &[String]) -> String {
    let exprs: Vec<String> = columns.iter().map(snapshot_expr).collect();
    let conds: Vec<String> = key
        .iter()
        .enumerate()
        .map(|(i, k)| format!("{} = {}", quote_ident(k), bind_expr(columns, k, i + 2)))
        .collect();
    format!(
        "SELECT ROWIDTOCHAR(ROWID), {} FROM {} AS OF SCN :1 WHERE {}",
        exprs.join(", "),
        quote_table(table),
        conds.join(" AND ")
    )
}

fn num(v: &Option<String>) -> u64 {
    v.as_deref().and_then(|s| s.trim().parse().ok()).unwrap_or(0)
}

#[async_trait]
impl LogMinerClient for OracleClient {
    async fn database_info(&self) -> Result<DatabaseInfo> {
        self.with_root(|c| {
            let r = strings(
                c,
                "SELECT LOG_MODE, SUPPLEMENTAL_LOG_DATA_MIN, SUPPLEMENTAL_LOG_DATA_ALL, TO_CHAR(DBID), CDB, \
                 SYS_CONTEXT('USERENV', 'CON_NAME'), USER, (SELECT TO_CHAR(MIN(BYTES)) FROM V$LOG) FROM V$DATABASE",
                &[],
                "reading V$DATABASE",
            )?;
            let r = r.into_iter().next().unwrap_or_default();
            let s = |i: usize| r.get(i).cloned().flatten().unwrap_or_default();
            Ok(DatabaseInfo {
                log_mode: s(0),
                supplemental_min: s(1),
                supplemental_all: s(2) == "YES",
                dbid: s(3).parse().unwrap_or(0),
                cdb: s(4) == "YES",
                con_name: s(5),
                user: s(6),
                smallest_redo_log_bytes: s(7).parse().unwrap_or(0),
            })
        })
        .await
    }

    async fn current_scn(&self) -> Result<u64> {
        self.with_root(|c| {
            let r = strings(c, "SELECT TO_CHAR(CURRENT_SCN) FROM V$DATABASE", &[], "reading the current SCN")?;
            Ok(num(&r.into_iter().next().and_then(|r| r.into_iter().next()).flatten()))
        })
        .await
    }

    async fn oldest_open_transaction(&self) -> Result<Option<u64>> {
        self.with(|c| {
            let r = strings(c, "SELECT TO_CHAR(MIN(START_SCN)) FROM V$TRANSACTION", &[], "reading V$TRANSACTION")?;
            Ok(r.into_iter()
                .next()
                .and_then(|r| r.into_iter().next())
                .flatten()
                .and_then(|s| s.parse().ok()))
        })
        .await
    }

    async fn list_tables(&self, owners: &[String]) -> Result<Vec<TableId>> {
        let owners: Vec<String> = owners.iter().map(|o| quote_literal(o)).collect();
        let sql = format!(
            "SELECT OWNER, TABLE_NAME FROM ALL_TABLES WHERE OWNER IN ({}) AND DROPPED = 'NO' AND NESTED = 'NO' \
             AND TEMPORARY = 'N' ORDER BY OWNER, TABLE_NAME",
            owners.join(", ")
        );
        self.with(move |c| {
            Ok(strings(c, &sql, &[], "listing tables")?
                .into_iter()
                .filter_map(|r| Some(TableId::new(r.first()?.clone()?, r.get(1)?.clone()?)))
                .collect())
        })
        .await
    }

    async fn table_def(&self, table: &TableId) -> Result<Option<TableDef>> {
        let t = table.clone();
        self.with(move |c| {
            let cols = strings(
                c,
                "SELECT COLUMN_NAME, DATA_TYPE, TO_CHAR(DATA_PRECISION), TO_CHAR(DATA_SCALE), NULLABLE \
                 FROM ALL_TAB_COLUMNS WHERE OWNER = :1 AND TABLE_NAME = :2 ORDER BY COLUMN_ID",
                &[&t.schema, &t.table],
                "reading the table's columns",
            )?;
            if cols.is_empty() {
                return Ok(None);
            }
            let key = strings(
                c,
                "SELECT cc.COLUMN_NAME FROM ALL_CONSTRAINTS k JOIN ALL_CONS_COLUMNS cc ON cc.OWNER = k.OWNER \
                 AND cc.CONSTRAINT_NAME = k.CONSTRAINT_NAME WHERE k.OWNER = :1 AND k.TABLE_NAME = :2 \
                 AND k.CONSTRAINT_TYPE = 'P' ORDER BY cc.POSITION",
                &[&t.schema, &t.table],
                "reading the table's primary key",
            )?;
            Ok(Some(TableDef {
                columns: cols
                    .into_iter()
                    .map(|r| {
                        let s = |i: usize| r.get(i).cloned().flatten();
                        ColumnDef {
                            name: s(0).unwrap_or_default(),
                            type_text: s(1).unwrap_or_default(),
                            precision: s(2).and_then(|p| p.parse().ok()),
                            scale: s(3).and_then(|p| p.parse().ok()),
                            nullable: s(4).as_deref() == Some("Y"),
                            aliases: Vec::new(),
                        }
                    })
                    .collect(),
                primary_key: key.into_iter().filter_map(|r| r.into_iter().next().flatten()).collect(),
            }))
        })
        .await
    }

    async fn snapshot_chunk(
        &self,
        table: &TableId,
        def: &TableDef,
        scn: u64,
        after: Option<&ChunkAfter>,
        limit: usize,
    ) -> Result<Vec<SnapshotRow>> {
        let columns = super::columns_of(table, def)?;
        let (sql, _) = snapshot_sql(table, &columns, &def.primary_key, after, limit);
        let bytes = bytes_columns(&columns);
        let after = after.cloned();
        self.with(move |c| {
            let scn = scn.to_string();
            let mut binds: Vec<Option<String>> = vec![Some(scn)];
            match &after {
                Some(ChunkAfter::RowId(r)) => binds.push(Some(r.clone())),
                Some(ChunkAfter::Key(k)) => binds.extend(k.iter().cloned()),
                None => {}
            }
            let refs: Vec<&dyn oracle::sql_type::ToSql> =
                binds.iter().map(|b| b as &dyn oracle::sql_type::ToSql).collect();
            fetch_rows(c, &sql, &refs, &bytes, "reading a snapshot chunk")
        })
        .await
    }

    async fn row_at(&self, at: RowAt<'_>) -> Result<Option<Vec<Option<String>>>> {
        let columns = super::columns_of(at.table, at.def)?;
        let sql = row_sql(at.table, &columns, &at.def.primary_key);
        let bytes = bytes_columns(&columns);
        let mut binds: Vec<Option<String>> = vec![Some(at.scn.to_string())];
        binds.extend(at.key.iter().cloned());
        self.with(move |c| {
            let refs: Vec<&dyn oracle::sql_type::ToSql> =
                binds.iter().map(|b| b as &dyn oracle::sql_type::ToSql).collect();
            Ok(fetch_rows(c, &sql, &refs, &bytes, "reading a row's LOB columns")?
                .into_iter()
                .next()
                .map(|(_, v)| v))
        })
        .await
    }

    async fn logs(&self) -> Result<Vec<LogFile>> {
        self.with_root(|c| {
            let mut out = Vec::new();
            for r in strings(
                c,
                "SELECT NAME, THREAD#, SEQUENCE#, TO_CHAR(FIRST_CHANGE#), TO_CHAR(NEXT_CHANGE#) FROM V$ARCHIVED_LOG \
                 WHERE NAME IS NOT NULL AND STATUS = 'A' AND ARCHIVED = 'YES' AND DEST_ID IN \
                 (SELECT DEST_ID FROM V$ARCHIVE_DEST_STATUS WHERE STATUS = 'VALID' AND TYPE = 'LOCAL' AND ROWNUM = 1)",
                &[],
                "reading V$ARCHIVED_LOG",
            )? {
                out.push(LogFile {
                    name: r[0].clone().unwrap_or_default(),
                    thread: num(&r[1]) as u16,
                    sequence: num(&r[2]),
                    first_scn: num(&r[3]),
                    next_scn: num(&r[4]),
                    online: false,
                    current: false,
                });
            }
            for r in strings(
                c,
                "SELECT MIN(f.MEMBER), l.THREAD#, l.SEQUENCE#, TO_CHAR(l.FIRST_CHANGE#), TO_CHAR(l.NEXT_CHANGE#), l.STATUS \
                 FROM V$LOG l JOIN V$LOGFILE f ON f.GROUP# = l.GROUP# WHERE l.STATUS IN ('CURRENT', 'ACTIVE', 'INACTIVE') \
                 GROUP BY l.THREAD#, l.SEQUENCE#, l.FIRST_CHANGE#, l.NEXT_CHANGE#, l.STATUS",
                &[],
                "reading V$LOG",
            )? {
                let current = r[5].as_deref() == Some("CURRENT");
                out.push(LogFile {
                    name: r[0].clone().unwrap_or_default(),
                    thread: num(&r[1]) as u16,
                    sequence: num(&r[2]),
                    first_scn: num(&r[3]),
                    next_scn: if current { u64::MAX } else { num(&r[4]) },
                    online: true,
                    current,
                });
            }
            Ok(out)
        })
        .await
    }

    async fn threads(&self) -> Result<Vec<RedoThread>> {
        self.with_root(|c| {
            Ok(strings(
                c,
                "SELECT THREAD#, STATUS, TO_CHAR(LAST_REDO_CHANGE#) FROM V$THREAD WHERE ENABLED != 'DISABLED'",
                &[],
                "reading V$THREAD",
            )?
            .into_iter()
            .map(|r| RedoThread {
                thread: num(&r[0]) as u16,
                open: r[1].as_deref() == Some("OPEN"),
                last_redo_scn: num(&r[2]),
            })
            .collect())
        })
        .await
    }

    async fn mine(&self, files: &[LogFile], start: u64, end: u64, owners: &[String]) -> Result<Vec<LogMinerRow>> {
        let files: Vec<String> = files.iter().map(|f| f.name.clone()).collect();
        let sql = contents_sql(owners, self.pdb.as_deref());
        self.with_root(move |c| {
            for (i, f) in files.iter().enumerate() {
                let option = if i == 0 {
                    "DBMS_LOGMNR.NEW"
                } else {
                    "DBMS_LOGMNR.ADDFILE"
                };
                c.execute(
                    &format!("BEGIN DBMS_LOGMNR.ADD_LOGFILE(LOGFILENAME => :1, OPTIONS => {option}); END;"),
                    &[f],
                )
                .map_err(|e| classify(e, "adding a log file (DBMS_LOGMNR.ADD_LOGFILE)"))?;
            }
            c.execute(
                "BEGIN DBMS_LOGMNR.START_LOGMNR(STARTSCN => :1, ENDSCN => :2, OPTIONS => \
                 DBMS_LOGMNR.DICT_FROM_ONLINE_CATALOG); END;",
                &[&start.to_string(), &end.to_string()],
            )
            .map_err(|e| classify(e, "starting LogMiner (DBMS_LOGMNR.START_LOGMNR)"))?;
            let rows = strings(c, &sql, &[&start.to_string(), &end.to_string()], "reading V$LOGMNR_CONTENTS");
            // Always end the session: it holds PGA memory on the server.
            let ended = c.execute("BEGIN DBMS_LOGMNR.END_LOGMNR; END;", &[]);
            let rows = rows?;
            ended.map_err(|e| classify(e, "ending LogMiner"))?;
            Ok(rows
                .into_iter()
                .map(|r| {
                    let s = |i: usize| r.get(i).cloned().flatten();
                    LogMinerRow {
                        scn: num(&s(0)),
                        operation_code: num(&s(1)) as u8,
                        xid: s(2).unwrap_or_default(),
                        thread: num(&s(3)) as u16,
                        rs_id: s(4).unwrap_or_default(),
                        ssn: num(&s(5)),
                        csf: s(6).as_deref() == Some("1"),
                        rollback: s(7).as_deref() == Some("1"),
                        seg_owner: s(8),
                        table_name: s(9),
                        row_id: s(10),
                        sql_redo: s(11),
                        ts_ms: s(12).and_then(|t| t.parse::<f64>().ok()).map_or(0, |t| t as i64),
                    }
                })
                .collect())
        })
        .await
    }

    async fn privileges(&self) -> Result<Vec<String>> {
        self.with_root(|c| {
            Ok(strings(
                c,
                "SELECT PRIVILEGE FROM SESSION_PRIVS UNION SELECT ROLE FROM SESSION_ROLES",
                &[],
                "reading the session's privileges",
            )?
            .into_iter()
            .filter_map(|r| r.into_iter().next().flatten())
            .collect())
        })
        .await
    }

    async fn can_read(&self, table: &TableId) -> Result<bool> {
        let sql =
            format!("SELECT 1 FROM {} AS OF SCN (SELECT CURRENT_SCN FROM V$DATABASE) WHERE 1 = 0", quote_table(table));
        self.with(move |c| match c.query(&sql, &[]) {
            Ok(_) => Ok(true),
            Err(e) => match e.db_error().map(|d| d.code()) {
                Some(942 | 1031 | 1039) => Ok(false),
                _ => Err(classify(e, "reading a captured table")),
            },
        })
        .await
    }

    async fn table_supplemental_logging(&self, table: &TableId) -> Result<Option<bool>> {
        let t = table.clone();
        self.with(move |c| {
            let r = strings(
                c,
                "SELECT LOG_GROUP_TYPE FROM ALL_LOG_GROUPS WHERE OWNER = :1 AND TABLE_NAME = :2",
                &[&t.schema, &t.table],
                "reading ALL_LOG_GROUPS",
            )?;
            let types: Vec<String> = r.into_iter().filter_map(|r| r.into_iter().next().flatten()).collect();
            Ok(if types.iter().any(|t| t == "ALL COLUMN LOGGING") {
                Some(true)
            } else if types.iter().any(|t| t == "PRIMARY KEY LOGGING") {
                Some(false)
            } else {
                None
            })
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tributary_schemas::{Column, DataType};

    #[test]
    fn error_codes_classify() {
        use crate::error::ErrorKind::*;
        assert_eq!(classify_code(3113, "x", "end-of-file on communication channel").kind(), Retryable);
        assert_eq!(classify_code(1031, "x", "insufficient privileges").kind(), NeedsOperator);
        assert_eq!(classify_code(1291, "x", "missing logfile").kind(), NeedsOperator);
        let e = classify_code(1555, "reading", "snapshot too old\nmore");
        assert_eq!(e.kind(), NeedsOperator);
        assert_eq!(e.class(), "ORA-01555");
        assert!(e.to_string().contains("ORA-01555: snapshot too old"), "{e}");
        assert!(!e.to_string().contains("more"));
    }

    /// The real driver runs here without a server: without Instant Client
    /// (the development machines) connecting needs an operator; with it, a
    /// closed port is a retryable network error.
    #[tokio::test]
    async fn connecting_without_instant_client_or_server_is_classified() {
        let e = OracleClient::connect("u", &SecretString::from("p".to_string()), "127.0.0.1:9/NOSUCH")
            .await
            .expect_err("nothing listens on port 9");
        match e.kind() {
            crate::error::ErrorKind::NeedsOperator => {
                assert_eq!(e.class(), "DPI-1047", "{e}");
                assert!(e.hint().is_some_and(|h| h.contains("Instant Client")), "{e}");
            }
            kind => assert_eq!(kind, crate::error::ErrorKind::Retryable, "{e}"),
        }
    }

    #[test]
    fn snapshot_chunks_resume_after_a_compound_key() {
        let t = TableId::new("APP", "T");
        let mut d = Column::new("D", DataType::Timestamp, false);
        d.source_type = "DATE".into();
        let mut id = Column::new("ID", DataType::Int64, false);
        id.source_type = "NUMBER".into();
        let cols = vec![id, d];
        let (sql, binds) = snapshot_sql(&t, &cols, &["ID".into(), "D".into()], Some(&ChunkAfter::Key(vec![])), 10);
        assert_eq!(binds, 3);
        assert!(sql.contains("AS OF SCN :1"), "{sql}");
        assert!(
            sql.contains("WHERE (\"ID\" > TO_NUMBER(:2)) OR (\"ID\" = TO_NUMBER(:2) AND \"D\" > TO_DATE(:3, 'YYYY-MM-DD HH24:MI:SS'))"),
            "{sql}"
        );
        assert!(sql.ends_with("ORDER BY \"ID\", \"D\" FETCH FIRST 10 ROWS ONLY"), "{sql}");
        let sql = row_sql(&t, &cols, &["ID".into(), "D".into()]);
        assert!(
            sql.ends_with("AS OF SCN :1 WHERE \"ID\" = TO_NUMBER(:2) AND \"D\" = TO_DATE(:3, 'YYYY-MM-DD HH24:MI:SS')"),
            "{sql}"
        );
        let (sql, _) = snapshot_sql(&t, &cols, &[], Some(&ChunkAfter::RowId("x".into())), 5);
        assert!(sql.contains("WHERE ROWID > CHARTOROWID(:2) ORDER BY ROWID"), "{sql}");
        let sql = contents_sql(&["APP".into()], None);
        assert!(sql.contains("SEG_OWNER IN ('APP')") && !sql.contains("SRC_CON_NAME"), "{sql}");
        let sql = contents_sql(&["APP".into()], Some("FREEPDB1"));
        assert!(sql.contains("SCN <= :2 AND SRC_CON_NAME = 'FREEPDB1' AND (OPERATION_CODE IN (6, 7, 36)"), "{sql}");
    }
}

//! The MySQL source's sessions: connections, how driver errors are
//! classified, and the catalog queries (`information_schema`).

use mysql_async::prelude::Queryable;
use tributary_schemas::TableId;

use super::config::{ConnectionParams, TableFilter};
use super::history::{ColumnDef, TableDef};
use crate::error::{Error, ErrorKind, Result};

/// Classifies a driver error; `context` says what was being done.
pub fn classify_my(err: mysql_async::Error, context: &str) -> Error {
    use mysql_async::Error as E;
    let (kind, class, hint) = match &err {
        E::Server(s) => {
            let kind = match s.code {
                // Access denied, no such grant, wrong password.
                1044 | 1045 | 1142 | 1143 | 1227 | 1370 => ErrorKind::NeedsOperator,
                // Unknown database / table / column.
                1049 | 1146 | 1054 => ErrorKind::NeedsOperator,
                // Binlog purged past the position or unknown binlog file:
                // the changes since the checkpoint are gone.
                1236 => ErrorKind::NeedsOperator,
                // Lock wait timeout, deadlock, too many connections,
                // server shutting down.
                1205 | 1213 | 1040 | 1053 | 2013 => ErrorKind::Retryable,
                _ => ErrorKind::Retryable,
            };
            let hint = match s.code {
                1045 => Some("check the user and password in mysql.url / mysql.password"),
                1044 | 1142 | 1227 | 1370 => Some("grant the privileges `source-runner check` lists"),
                1049 => Some("check the database name in mysql.url"),
                1236 => Some(
                    "the binlog at the checkpoint is gone (purged, or server_id clash): copy everything again with \
                     source-runner --config <source.toml> reset, then start the runner (every table is copied again \
                     and the destination rows the new copy does not see are removed; see docs/operations.md, \
                     Reset), and keep binlogs longer (binlog_expire_logs_seconds)",
                ),
                _ => None,
            };
            (kind, format!("mysql.{}", s.code), hint)
        }
        E::Io(io) if tls_refused(io) => (
            ErrorKind::NeedsOperator,
            "mysql.tls".to_string(),
            Some(
                "the TLS handshake failed: check that mysql.tls_ca_file holds the CA that signed the server's \
                 certificate and, with tls = \"verify-full\", that mysql.url names a host the certificate names",
            ),
        ),
        E::Io(_) => (ErrorKind::Retryable, "mysql.io".to_string(), None),
        E::Driver(mysql_async::DriverError::NoClientSslFlagFromServer) => (
            ErrorKind::NeedsOperator,
            "mysql.tls".to_string(),
            Some("the server does not offer TLS: configure its certificate (ssl_cert, ssl_key) or set mysql.tls"),
        ),
        E::Driver(_) => (ErrorKind::Retryable, "mysql.driver".to_string(), None),
        E::Url(_) => (ErrorKind::NeedsOperator, "mysql.url".to_string(), Some("fix mysql.url")),
        _ => (ErrorKind::Retryable, "mysql".to_string(), None),
    };
    let mut e = Error::new(kind, format!("{context}: {err}")).with_class(class);
    if let Some(h) = hint {
        e = e.with_hint(h);
    }
    e
}

/// Whether an I/O error is a TLS handshake that failed on something only an
/// operator can change (a certificate refused, an unreadable CA file);
/// rustls reaches us either as mysql_async's own TLS error or inside the
/// stream's `io::Error`.
fn tls_refused(err: &mysql_async::IoError) -> bool {
    match err {
        mysql_async::IoError::Tls(_) => true,
        mysql_async::IoError::Io(e) => e.get_ref().is_some_and(|inner| inner.downcast_ref::<rustls::Error>().is_some()),
    }
}

/// Opens a connection (catalog, snapshot or binlog), bounded by the
/// connect timeout.
pub async fn connect(params: &ConnectionParams) -> Result<mysql_async::Conn> {
    match tokio::time::timeout(params.connect_timeout, mysql_async::Conn::new(params.opts.clone())).await {
        Ok(Ok(c)) => Ok(c),
        Ok(Err(e)) => Err(classify_my(e, "connecting to MySQL")),
        Err(_) => Err(Error::retryable(format!("connecting to MySQL at {}:{} timed out", params.host, params.port))),
    }
}

/// Reads table lists and definitions from `information_schema`.
pub async fn list_tables(conn: &mut mysql_async::Conn, filter: &TableFilter) -> Result<Vec<TableId>> {
    let rows: Vec<(String, String)> = conn
        .query(
            "SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES \
             WHERE TABLE_TYPE = 'BASE TABLE' \
               AND TABLE_SCHEMA NOT IN ('mysql', 'information_schema', 'performance_schema', 'sys') \
             ORDER BY TABLE_SCHEMA, TABLE_NAME",
        )
        .await
        .map_err(|e| classify_my(e, "listing tables"))?;
    Ok(rows
        .into_iter()
        .map(|(s, t)| TableId::new(s, t))
        .filter(|t| filter.captures(t))
        .collect())
}

/// A table's definition from the catalog (inside the snapshot transaction,
/// so it is the definition at the snapshot's binlog position).
pub async fn table_def(conn: &mut impl Queryable, table: &TableId) -> Result<Option<TableDef>> {
    let rows: Vec<(String, String, String, Option<String>)> = conn
        .exec(
            "SELECT COLUMN_NAME, COLUMN_TYPE, IS_NULLABLE, EXTRA FROM information_schema.COLUMNS \
             WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? ORDER BY ORDINAL_POSITION",
            (table.schema.as_str(), table.table.as_str()),
        )
        .await
        .map_err(|e| classify_my(e, "reading columns").with_table(table.clone()))?;
    if rows.is_empty() {
        return Ok(None);
    }
    let key: Vec<String> = conn
        .exec(
            "SELECT COLUMN_NAME FROM information_schema.KEY_COLUMN_USAGE \
             WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? AND CONSTRAINT_NAME = 'PRIMARY' \
             ORDER BY ORDINAL_POSITION",
            (table.schema.as_str(), table.table.as_str()),
        )
        .await
        .map_err(|e| classify_my(e, "reading the primary key").with_table(table.clone()))?;
    Ok(Some(TableDef {
        columns: rows
            .into_iter()
            .map(|(name, type_text, nullable, extra)| ColumnDef {
                name,
                type_text,
                nullable: nullable == "YES",
                added_default: None,
                aliases: Vec::new(),
                auto_increment: extra.is_some_and(|e| e.to_ascii_lowercase().contains("auto_increment")),
            })
            .collect(),
        primary_key: key,
    }))
}

/// What makes the server read-only for a migration's cutover
/// (docs/migration.md): `read_only` stops every account without `SUPER` /
/// `READ_ONLY ADMIN` (MariaDB has no per-database switch); the sessions
/// then open on `database` are ended, but this user's (the copy's) and
/// replication's.
pub fn read_only_sql(database: &str) -> String {
    format!(
        "SET GLOBAL read_only = ON; then KILL CONNECTION for each session of information_schema.PROCESSLIST \
         with DB = '{}' but this one, the copy's user's and binlog readers'",
        database.replace('\'', "''")
    )
}

/// What makes the server writable again.
pub const UNDO_READ_ONLY_SQL: &str = "SET GLOBAL read_only = OFF";

/// Makes the server read-only and ends the sessions on `database` (see
/// [`read_only_sql`]); returns how many were ended.
pub async fn make_read_only(conn: &mut mysql_async::Conn, database: &str) -> Result<usize> {
    conn.query_drop("SET GLOBAL read_only = ON")
        .await
        .map_err(|e| classify_my(e, "making the server read-only (SET GLOBAL read_only = ON)"))?;
    let sessions: Vec<u64> = conn
        .exec(
            "SELECT ID FROM information_schema.PROCESSLIST WHERE ID <> CONNECTION_ID() AND DB = ? \
               AND USER <> SUBSTRING_INDEX(CURRENT_USER(), '@', 1) AND COMMAND NOT LIKE 'Binlog Dump%'",
            (database,),
        )
        .await
        .map_err(|e| classify_my(e, "listing the sessions to end"))?;
    let mut ended = 0;
    for id in sessions {
        // One that ended meanwhile is no error.
        if conn.query_drop(format!("KILL CONNECTION {id}")).await.is_ok() {
            ended += 1;
        }
    }
    Ok(ended)
}

/// Each `AUTO_INCREMENT` column of `tables` as the sequence its identity
/// takes values from in a destination ([`super::objects::identity_sequence`]),
/// at the server's counter: a cutover moves the destination's past it.
pub async fn auto_increment_sequences(
    conn: &mut mysql_async::Conn,
    tables: &[TableId],
) -> Result<Vec<tributary_schemas::SequenceState>> {
    // MySQL 8 caches the counters in information_schema for a day unless told.
    let _ = conn.query_drop("SET SESSION information_schema_stats_expiry = 0").await;
    let mut out = Vec::new();
    let databases: std::collections::BTreeSet<&str> = tables.iter().map(|t| t.schema.as_str()).collect();
    for db in databases {
        let rows: Vec<(String, String, Option<u64>)> = conn
            .exec(
                "SELECT c.TABLE_NAME, c.COLUMN_NAME, t.AUTO_INCREMENT FROM information_schema.COLUMNS c \
                 JOIN information_schema.TABLES t ON t.TABLE_SCHEMA = c.TABLE_SCHEMA AND t.TABLE_NAME = c.TABLE_NAME \
                 WHERE c.TABLE_SCHEMA = ? AND c.EXTRA LIKE '%auto_increment%' ORDER BY 1",
                (db,),
            )
            .await
            .map_err(|e| classify_my(e, "reading the AUTO_INCREMENT counters"))?;
        for (table, column, next) in rows {
            if !tables.iter().any(|t| t.schema == db && t.table == table) {
                continue;
            }
            let next = i64::try_from(next.unwrap_or(1)).unwrap_or(i64::MAX).max(1);
            out.push(tributary_schemas::SequenceState {
                schema: db.to_string(),
                name: super::objects::identity_sequence(&table, &column),
                data_type: "bigint".into(),
                increment: 1,
                min: 1,
                max: i64::MAX,
                cycle: false,
                last_value: if next > 1 { next - 1 } else { 1 },
                is_called: next > 1,
            });
        }
    }
    Ok(out)
}

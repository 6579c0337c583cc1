//! `source-runner check` for a MySQL / MariaDB source: the binlog settings
//! and the grants the source needs, each problem with the statement that
//! fixes it.

use mysql_async::prelude::Queryable;

use super::config::MySqlSourceConfig;
use super::types::quote_literal;
use super::{classify_my, connect, ServerKind};
pub use crate::problem::{Problem, Severity};

/// Global privileges the source needs: SELECT for the snapshot, RELOAD for
/// the brief global read lock MySQL 8 needs to pin a snapshot's binlog
/// position, SHOW DATABASES to list tables, REPLICATION SLAVE to read the
/// binlog, REPLICATION CLIENT for `SHOW MASTER STATUS`.
pub const REQUIRED_PRIVILEGES: [&str; 5] = [
    "SELECT",
    "RELOAD",
    "SHOW DATABASES",
    "REPLICATION SLAVE",
    "REPLICATION CLIENT",
];

/// The server settings `check` reads in one query.
type Settings = (Option<String>, Option<String>, Option<String>, Option<u64>, String);

/// Every problem found (empty: ready).
pub async fn check(config: &MySqlSourceConfig) -> Vec<Problem> {
    match check_inner(config).await {
        Ok(p) => p,
        Err(e) => vec![Problem::error(
            format!("cannot check the source: {e}"),
            e.hint().map(str::to_string),
        )],
    }
}

async fn check_inner(config: &MySqlSourceConfig) -> crate::Result<Vec<Problem>> {
    let params = config.connection()?;
    let mut conn = connect(&params).await?;
    let mut problems = Vec::new();
    let row: Option<Settings> = conn
        .query_first("SELECT @@log_bin, @@binlog_format, @@binlog_row_image, @@server_id, @@version")
        .await
        .map_err(|e| classify_my(e, "reading server settings"))?;
    let Some((log_bin, format, image, server_id, version)) = row else {
        return Ok(vec![Problem::error("the server returned no settings", None)]);
    };
    let kind = ServerKind::from_version(&version);
    let cnf = "in the [mysqld] section of my.cnf, then restart the server";
    if log_bin.as_deref() != Some("1") {
        problems.push(Problem::error(
            "the binary log is off: changes cannot be streamed",
            Some(format!("log_bin = mysql-bin {cnf}")),
        ));
    }
    if !format.as_deref().is_some_and(|f| f.eq_ignore_ascii_case("ROW")) {
        problems.push(Problem::error(
            format!(
                "binlog_format is {}, not ROW: row changes are not in the binlog",
                format.as_deref().unwrap_or("unset")
            ),
            Some(format!("SET GLOBAL binlog_format = 'ROW'; and binlog_format = ROW {cnf}")),
        ));
    }
    if !image.as_deref().is_some_and(|f| f.eq_ignore_ascii_case("FULL")) {
        problems.push(Problem::error(
            format!(
                "binlog_row_image is {}, not FULL: updates and deletes would lack their before-images",
                image.as_deref().unwrap_or("unset")
            ),
            Some(format!("SET GLOBAL binlog_row_image = 'FULL'; and binlog_row_image = FULL {cnf}")),
        ));
    }
    match server_id {
        Some(0) | None => problems.push(Problem::error(
            "the server's server_id is 0: it refuses binlog readers",
            Some(format!("server_id = 1 {cnf}")),
        )),
        Some(id) if id == u64::from(config.server_id) => problems.push(Problem::error(
            format!("mysql.server_id {id} is the server's own server_id"),
            Some("choose another mysql.server_id in the runner's config".to_string()),
        )),
        Some(_) => {}
    }

    // The grants, as the server resolves them for this session's account.
    let privileges: Vec<String> = conn
        .query(
            "SELECT PRIVILEGE_TYPE FROM information_schema.USER_PRIVILEGES \
             WHERE GRANTEE = CONCAT('''', SUBSTRING_INDEX(CURRENT_USER(), '@', 1), '''@''', \
                                    SUBSTRING_INDEX(CURRENT_USER(), '@', -1), '''')",
        )
        .await
        .map_err(|e| classify_my(e, "reading the account's privileges"))?;
    let db_select: Option<String> = conn
        .exec_first(
            "SELECT PRIVILEGE_TYPE FROM information_schema.SCHEMA_PRIVILEGES \
             WHERE GRANTEE = CONCAT('''', SUBSTRING_INDEX(CURRENT_USER(), '@', 1), '''@''', \
                                    SUBSTRING_INDEX(CURRENT_USER(), '@', -1), '''') \
               AND TABLE_SCHEMA = ? AND PRIVILEGE_TYPE = 'SELECT'",
            (params.database.as_str(),),
        )
        .await
        .map_err(|e| classify_my(e, "reading the account's privileges"))?;
    let account: Option<String> = conn
        .query_first("SELECT CURRENT_USER()")
        .await
        .map_err(|e| classify_my(e, "reading the account"))?;
    let account = account.unwrap_or_else(|| format!("{}@%", params.user));
    let (user, host) = account.split_once('@').unwrap_or((account.as_str(), "%"));
    let mut needed: Vec<&str> = REQUIRED_PRIVILEGES.to_vec();
    if kind == ServerKind::MariaDb {
        // MariaDB 10.5 renamed REPLICATION CLIENT to BINLOG MONITOR (the old
        // name is an alias that grants the new one).
        needed.retain(|p| *p != "REPLICATION CLIENT");
        needed.push("BINLOG MONITOR");
    }
    let has = |p: &str| {
        privileges.iter().any(|g| {
            g.eq_ignore_ascii_case(p)
                || (p == "REPLICATION SLAVE" && g.eq_ignore_ascii_case("REPLICATION REPLICA"))
                || (p == "SELECT" && db_select.is_some())
        })
    };
    let missing: Vec<&str> = needed.iter().copied().filter(|p| !has(p)).collect();
    if !missing.is_empty() {
        problems.push(Problem::error(
            format!("account {account} lacks {}", missing.join(", ")),
            Some(format!("GRANT {} ON *.* TO {}@{};", missing.join(", "), quote_literal(user), quote_literal(host))),
        ));
    }
    if let Err(e) = conn.disconnect().await {
        tracing::debug!(error = %e, "closing the check connection");
    }
    Ok(problems)
}

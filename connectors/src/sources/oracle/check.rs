//! `source-runner check` for an Oracle source: ARCHIVELOG mode,
//! supplemental logging (database minimal, and all columns per captured
//! table), the grants LogMiner and the flashback snapshot need, each
//! problem with the exact SQL that fixes it (Oracle Database Utilities,
//! "Supplemental Logging"; Database Administrator's Guide, "Changing the
//! Database Archiving Mode").

use super::client::LogMinerClient;
use super::config::OracleSourceConfig;
use super::redo_sql::{quote_ident, quote_table};
pub use crate::problem::{Problem, Severity};

/// System privileges (or roles) the source's user needs: `CREATE SESSION`
/// to connect, `LOGMINING` (12c+) for `DBMS_LOGMNR`, `SELECT ANY
/// TRANSACTION` for `V$LOGMNR_CONTENTS`, `SELECT_CATALOG_ROLE` for the V$
/// views and the dictionary, `EXECUTE_CATALOG_ROLE` for `DBMS_LOGMNR`,
/// `FLASHBACK ANY TABLE` for the snapshot's `AS OF SCN` reads.
pub const REQUIRED_PRIVILEGES: [&str; 6] = [
    "CREATE SESSION",
    "LOGMINING",
    "SELECT ANY TRANSACTION",
    "SELECT_CATALOG_ROLE",
    "EXECUTE_CATALOG_ROLE",
    "FLASHBACK ANY TABLE",
];

/// The system privilege a common user needs to switch its session from
/// the root to a PDB (`oracle.pdb_name`).
pub const SET_CONTAINER: &str = "SET CONTAINER";

/// Online redo log groups smaller than this switch often under load: each
/// switch archives a log and the source then mines more, smaller files
/// (Oracle's sizing advice is a switch every 15-20 minutes at peak; 500 MiB
/// is where Debezium's documentation starts too).
pub const MIN_REDO_LOG_BYTES: u64 = 500 * 1024 * 1024;

/// Every problem found (empty: ready).
pub async fn check(config: &OracleSourceConfig, client: &dyn LogMinerClient) -> Vec<Problem> {
    match check_inner(config, client).await {
        Ok(p) => p,
        Err(e) => vec![Problem::error(
            format!("cannot check the source: {e}"),
            e.hint().map(str::to_string),
        )],
    }
}

async fn check_inner(config: &OracleSourceConfig, client: &dyn LogMinerClient) -> crate::Result<Vec<Problem>> {
    let info = client.database_info().await?;
    let mut problems = Vec::new();
    if info.log_mode != "ARCHIVELOG" {
        problems.push(Problem::error(
            format!("the database is in {} mode: redo is overwritten before it can be mined", info.log_mode),
            Some(
                "as SYSDBA: SHUTDOWN IMMEDIATE; STARTUP MOUNT; ALTER DATABASE ARCHIVELOG; ALTER DATABASE OPEN; \
                 (in the CDB root for a multitenant database)"
                    .into(),
            ),
        ));
    }
    if info.supplemental_min == "NO" {
        problems.push(Problem::error(
            "minimal supplemental logging is off: LogMiner cannot reassemble row changes",
            Some("ALTER DATABASE ADD SUPPLEMENTAL LOG DATA; (in the CDB root for a multitenant database)".into()),
        ));
    }
    if info.smallest_redo_log_bytes > 0 && info.smallest_redo_log_bytes < MIN_REDO_LOG_BYTES {
        problems.push(Problem::warning(
            format!(
                "the smallest online redo log group is {} MiB: logs switch often under load, and the source mines \
                 many small archived files when it is behind",
                info.smallest_redo_log_bytes / (1024 * 1024)
            ),
            Some(
                "ALTER DATABASE ADD LOGFILE SIZE 1G; (once per group, with Oracle-managed files), then ALTER \
                 DATABASE DROP LOGFILE GROUP <n>; for each small group once V$LOG shows it INACTIVE"
                    .into(),
            ),
        ));
    }
    let in_root = info.cdb && info.con_name == "CDB$ROOT";
    match &config.pdb_name {
        Some(pdb) if !in_root => problems.push(Problem::error(
            format!(
                "oracle.pdb_name is {pdb}, but the session is in container {} (mining for a PDB runs in CDB$ROOT)",
                info.con_name
            ),
            Some("name the CDB's service (its root) in oracle.url, with a common user (C##...)".into()),
        )),
        None if in_root => problems.push(Problem::warning(
            "the session is in CDB$ROOT: LogMiner there sees every PDB's redo and the root holds no application \
             tables",
            Some(
                "set oracle.pdb_name to the PDB that holds the tables (or name the PDB's service in oracle.url)".into(),
            ),
        )),
        _ => {}
    }
    let privileges = client.privileges().await?;
    let user = quote_ident(&info.user);
    // Mining for a PDB from the root: the second session switches to it.
    let set_container = config.pdb_name.is_some().then_some(SET_CONTAINER);
    let missing: Vec<&str> = REQUIRED_PRIVILEGES
        .iter()
        .copied()
        .chain(set_container)
        .filter(|p| !privileges.iter().any(|g| g.eq_ignore_ascii_case(p)))
        .collect();
    if !missing.is_empty() {
        // A common user of the root takes its grants in every container;
        // a PDB's local user (per-PDB LogMiner) in its own.
        let container = if in_root { " CONTAINER=ALL" } else { "" };
        problems.push(Problem::error(
            format!("user {} lacks {}", info.user, missing.join(", ")),
            Some(format!("GRANT {} TO {user}{container};", missing.join(", "))),
        ));
    }
    let filter = config.filter();
    let tables: Vec<_> = client
        .list_tables(&config.owners())
        .await?
        .into_iter()
        .filter(|t| filter.captures(t))
        .collect();
    if tables.is_empty() {
        problems.push(Problem::warning(
            format!("no table of {} matches oracle.include (and not oracle.exclude)", config.owners().join(", ")),
            Some(
                "check oracle.include: OWNER.TABLE patterns as Oracle stores the names (upper case unless quoted)"
                    .into(),
            ),
        ));
    }
    for table in tables {
        if !client.can_read(&table).await? {
            problems.push(
                Problem::error(
                    "the user cannot read the table (SELECT and FLASHBACK, for the snapshot)",
                    Some(format!("GRANT SELECT, FLASHBACK ON {} TO {user};", quote_table(&table))),
                )
                .on(&table),
            );
        }
        if !info.supplemental_all && client.table_supplemental_logging(&table).await? != Some(true) {
            problems.push(
                Problem::error(
                    "no supplemental logging of all columns: updates and deletes would lack their before-images and \
                     the columns they did not change",
                    Some(format!("ALTER TABLE {} ADD SUPPLEMENTAL LOG DATA (ALL) COLUMNS;", quote_table(&table))),
                )
                .on(&table),
            );
        }
    }
    Ok(problems)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sources::oracle::fake::FakeOracle;
    use tributary_schemas::TableId;

    fn config() -> OracleSourceConfig {
        OracleSourceConfig::with_url("oracle://c##tributary@h/FREEPDB1", &["APP.*"])
    }

    #[tokio::test]
    async fn a_ready_database_has_no_problems_and_each_problem_has_its_fix() {
        let db = FakeOracle::new();
        let t = TableId::new("APP", "ORDERS");
        db.create_table(&t, &[("ID", "NUMBER")], &["ID"]);
        assert_eq!(check(&config(), &db).await, vec![]);

        db.set_info(|i| {
            i.log_mode = "NOARCHIVELOG".into();
            i.supplemental_min = "NO".into();
            i.supplemental_all = false;
        });
        db.set_privileges(&["CREATE SESSION", "SELECT_CATALOG_ROLE", "EXECUTE_CATALOG_ROLE"]);
        db.set_table_logging(&t, Some(false));
        db.revoke_select(&t);
        let p = check(&config(), &db).await;
        let fixes: Vec<&str> = p.iter().filter_map(|p| p.fix.as_deref()).collect();
        assert_eq!(p.len(), 5, "{p:#?}");
        assert!(fixes[0].contains("ALTER DATABASE ARCHIVELOG"));
        assert_eq!(fixes[1], "ALTER DATABASE ADD SUPPLEMENTAL LOG DATA; (in the CDB root for a multitenant database)");
        assert_eq!(fixes[2], "GRANT LOGMINING, SELECT ANY TRANSACTION, FLASHBACK ANY TABLE TO \"C##TRIBUTARY\";");
        assert_eq!(fixes[3], "GRANT SELECT, FLASHBACK ON \"APP\".\"ORDERS\" TO \"C##TRIBUTARY\";");
        assert_eq!(fixes[4], "ALTER TABLE \"APP\".\"ORDERS\" ADD SUPPLEMENTAL LOG DATA (ALL) COLUMNS;");
        assert!(p.iter().all(|p| p.severity == Severity::Error));
        db.set_info(|i| {
            i.con_name = "CDB$ROOT".into();
            i.log_mode = "ARCHIVELOG".into();
            i.smallest_redo_log_bytes = 200 * 1024 * 1024;
        });
        let p = check(&config(), &db).await;
        assert!(
            p.iter()
                .any(|p| p.severity == Severity::Warning && p.message.contains("200 MiB")),
            "{p:#?}"
        );
        let p = check(&OracleSourceConfig::with_url("oracle://u@h/FREEPDB1", &["NOBODY.*"]), &db).await;
        assert!(p.iter().any(|p| p.message.contains("no table of NOBODY matches")), "{p:#?}");
        let p = check(&config(), &db).await;
        assert!(p
            .iter()
            .any(|p| p.fix.as_deref().is_some_and(|f| f.ends_with("\"C##TRIBUTARY\" CONTAINER=ALL;"))));
        assert_eq!(p[4].table.as_ref(), Some(&t));
    }

    #[tokio::test]
    async fn mining_for_a_pdb_needs_the_root_and_set_container() {
        let db = FakeOracle::new();
        db.create_table(&TableId::new("APP", "ORDERS"), &[("ID", "NUMBER")], &["ID"]);
        let mut c = config();
        c.pdb_name = Some("FREEPDB1".into());
        // The fake's session is in FREEPDB1.
        let p = check(&c, &db).await;
        assert_eq!(p.len(), 2, "{p:#?}");
        assert!(p[0].message.contains("session is in container FREEPDB1"), "{p:#?}");
        assert_eq!(p[1].fix.as_deref(), Some("GRANT SET CONTAINER TO \"C##TRIBUTARY\";"));
        db.set_info(|i| i.con_name = "CDB$ROOT".into());
        let p = check(&c, &db).await;
        assert_eq!(p.len(), 1, "{p:#?}");
        assert_eq!(p[0].fix.as_deref(), Some("GRANT SET CONTAINER TO \"C##TRIBUTARY\" CONTAINER=ALL;"));
        let mut granted: Vec<&str> = REQUIRED_PRIVILEGES.to_vec();
        granted.push(SET_CONTAINER);
        db.set_privileges(&granted);
        assert_eq!(check(&c, &db).await, vec![]);
        // In the root without pdb_name: said.
        let p = check(&config(), &db).await;
        assert!(
            p.iter()
                .any(|p| p.severity == Severity::Warning && p.message.contains("CDB$ROOT")),
            "{p:#?}"
        );
    }
}

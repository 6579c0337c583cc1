//! `source-runner check` for a SQL Server source: CDC on the database and
//! on each selected table, SQL Server Agent and the CDC jobs, snapshot
//! isolation, and the login's rights, each problem with the T-SQL that
//! fixes it (Microsoft's "Enable and disable change data capture":
//! <https://learn.microsoft.com/sql/relational-databases/track-changes/enable-and-disable-change-data-capture-sql-server>).

use super::client::{Connector, DatabaseFacts};
use super::config::SqlServerSourceConfig;
use super::types::{quote_ident, quote_literal};
pub use crate::problem::{Problem, Severity};

/// Every problem found (empty: ready).
pub async fn check(config: &SqlServerSourceConfig, connector: &dyn Connector) -> Vec<Problem> {
    let facts = async {
        let mut client = connector.connect().await?;
        let facts = client.facts().await?;
        let instances = if facts.cdc_enabled {
            client.capture_instances().await?
        } else {
            Vec::new()
        };
        Ok::<_, crate::Error>((facts, instances))
    };
    match facts.await {
        Ok((facts, instances)) => problems(config, &facts, &instances),
        Err(e) => vec![Problem::error(
            format!("cannot check the source: {e}"),
            e.hint().map(str::to_string),
        )],
    }
}

/// The problems of a database described by `facts` and its capture instances.
pub fn problems(
    config: &SqlServerSourceConfig,
    facts: &DatabaseFacts,
    instances: &[super::client::CaptureInstance],
) -> Vec<Problem> {
    let mut out = Vec::new();
    let db = quote_ident(&facts.database);
    let user = quote_ident(&facts.user);
    if !facts.cdc_enabled {
        out.push(Problem::error(
            format!("change data capture is not enabled on database {}", facts.database),
            Some(format!("USE {db}; EXEC sys.sp_cdc_enable_db; (as a member of sysadmin)")),
        ));
    }
    if !facts.snapshot_isolation {
        out.push(Problem::error(
            "snapshot isolation is not allowed: the snapshot cannot be consistent with the change tables",
            Some(format!("ALTER DATABASE {db} SET ALLOW_SNAPSHOT_ISOLATION ON;")),
        ));
    }
    match facts.agent_running {
        Some(false) => out.push(Problem::error(
            "SQL Server Agent is not running: the capture job does not harvest the log, no change arrives",
            Some(
                "start SQL Server Agent (Linux: sudo /opt/mssql/bin/mssql-conf set sqlagent.enabled true and restart \
                 mssql-server; Docker: -e MSSQL_AGENT_ENABLED=true)"
                    .into(),
            ),
        )),
        None => out.push(Problem::warning(
            "cannot tell whether SQL Server Agent runs (sys.dm_server_services needs VIEW SERVER STATE)",
            Some(format!("GRANT VIEW SERVER STATE TO {user}; (optional: only this check needs it)")),
        )),
        Some(true) => {}
    }
    if facts.cdc_enabled {
        for (job, present) in [("capture", facts.capture_job), ("cleanup", facts.cleanup_job)] {
            if present == Some(false) {
                out.push(Problem::error(
                    format!("the CDC {job} job does not exist"),
                    Some(format!("USE {db}; EXEC sys.sp_cdc_add_job @job_type = N'{job}';")),
                ));
            }
        }
    }
    if !facts.select_on_cdc {
        out.push(Problem::error(
            format!("{} may not read the change tables (SELECT on schema cdc)", facts.user),
            Some(format!("GRANT SELECT ON SCHEMA::cdc TO {user};")),
        ));
    }
    if !facts.view_database_state {
        out.push(Problem::error(
            format!("{} lacks VIEW DATABASE STATE (the CDC functions need it)", facts.user),
            Some(format!("GRANT VIEW DATABASE STATE TO {user};")),
        ));
    }
    let filter = config.filter();
    for t in facts.tables.iter().filter(|t| filter.captures(&t.table)) {
        let enable = format!(
            "EXEC sys.sp_cdc_enable_table @source_schema = {}, @source_name = {}, @role_name = NULL, \
             @supports_net_changes = 0;",
            quote_literal(&t.table.schema),
            quote_literal(&t.table.table)
        );
        let of: Vec<_> = instances.iter().filter(|i| i.table == t.table).collect();
        if facts.cdc_enabled && of.is_empty() {
            out.push(
                Problem::error("CDC is not enabled on the table: its changes are not captured", Some(enable))
                    .on(&t.table),
            );
            continue;
        }
        if !t.select {
            out.push(
                Problem::error(
                    format!("{} may not SELECT the table (the snapshot reads it)", facts.user),
                    Some(format!(
                        "GRANT SELECT ON {}.{} TO {user};",
                        quote_ident(&t.table.schema),
                        quote_ident(&t.table.table)
                    )),
                )
                .on(&t.table),
            );
        }
        if !t.has_primary_key {
            out.push(
                Problem::warning(
                    "the table has no primary key: rows are keyed by every column and the snapshot orders by them all",
                    Some(format!(
                        "ALTER TABLE {}.{} ADD PRIMARY KEY (...); then a new capture instance (docs/sources/sqlserver.md)",
                        quote_ident(&t.table.schema),
                        quote_ident(&t.table.table)
                    )),
                )
                .on(&t.table),
            );
        }
        if let Some(newest) = of.iter().max_by_key(|i| i.start_lsn) {
            let captured: Vec<&String> = newest.columns.iter().map(|c| &c.name).collect();
            let current: Vec<&String> = t.columns.iter().collect();
            if captured != current {
                out.push(
                    Problem::warning(
                        format!(
                            "the table's columns changed since capture instance {} was created: it still captures \
                             the old ones",
                            newest.name
                        ),
                        Some(format!(
                            "EXEC sys.sp_cdc_enable_table @source_schema = {}, @source_name = {}, @role_name = NULL, \
                             @capture_instance = {}; then, once the source has switched to it, \
                             EXEC sys.sp_cdc_disable_table @source_schema = {}, @source_name = {}, @capture_instance = {};",
                            quote_literal(&t.table.schema),
                            quote_literal(&t.table.table),
                            quote_literal(&format!("{}_{}_v{}", t.table.schema, t.table.table, of.len() + 1)),
                            quote_literal(&t.table.schema),
                            quote_literal(&t.table.table),
                            quote_literal(&newest.name),
                        )),
                    )
                    .on(&t.table),
                );
            }
        }
    }
    out
}

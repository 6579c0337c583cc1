//! `tributary check` for a PostgreSQL source: every prerequisite verified up
//! front, each problem with the exact SQL that fixes it; and the fixes the
//! source applies itself when its role may (publication, DDL trigger).

use tributary_schemas::TableId;

use super::client::{classify_pg, Catalog};
use super::config::PostgresSourceConfig;
use crate::error::{Error, ErrorKind, Result};
use crate::pgwire::{quote_ident, quote_literal, quote_table};

pub use crate::problem::{Problem, Severity};

/// The statements installing the DDL event trigger: every `CREATE`/`ALTER`
/// of a table and every dropped table becomes a transactional logical
/// message with the prefix `tributary`, so the stream sees DDL in order.
/// `ALTER TABLE` messages (`RENAME COLUMN` is a `table column` command) also
/// carry the table's oid and live `(attnum, name)` columns, from which the
/// stream tells column and table renames.
/// The function is `SECURITY DEFINER` and swallows its own failures: it must
/// never make an application's DDL fail. The messages are written in the
/// DDL's own (sub)transaction, not the exception block's, so that they are
/// decoded before the rows the transaction writes after the DDL.
pub const DDL_TRIGGER_SQL: &str = r#"CREATE SCHEMA IF NOT EXISTS tributary;
CREATE OR REPLACE FUNCTION tributary.emit_ddl() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $fn$
DECLARE r record; msgs text[] := '{}'; m text;
BEGIN
  BEGIN
    IF TG_EVENT = 'sql_drop' THEN
      FOR r IN SELECT * FROM pg_event_trigger_dropped_objects() WHERE object_type = 'table' LOOP
        msgs := msgs || json_build_object(
          'event', TG_EVENT, 'tag', 'DROP TABLE', 'identity', r.object_identity,
          'schema', r.schema_name, 'table', r.object_name)::text;
      END LOOP;
    ELSIF TG_EVENT = 'table_rewrite' THEN
      -- A partition's rewrite is its partitioned table's (captured through
      -- its root).
      FOR r IN SELECT n.nspname AS schema_name, c.relname AS table_name FROM pg_class c
               JOIN pg_namespace n ON n.oid = c.relnamespace
               WHERE c.oid = COALESCE(pg_partition_root(pg_event_trigger_table_rewrite_oid())::oid,
                                      pg_event_trigger_table_rewrite_oid()) LOOP
        msgs := msgs || json_build_object(
          'event', TG_EVENT, 'tag', 'TABLE REWRITE', 'command', TG_TAG,
          'schema', r.schema_name, 'table', r.table_name,
          'reason', pg_event_trigger_table_rewrite_reason())::text;
      END LOOP;
    ELSE
      FOR r IN SELECT * FROM pg_event_trigger_ddl_commands() WHERE object_type IN ('table', 'table column') LOOP
        msgs := msgs || json_build_object(
          'event', TG_EVENT, 'tag', r.command_tag, 'identity', r.object_identity,
          'schema', r.schema_name,
          'table', (SELECT c.relname FROM pg_class c WHERE c.oid = r.objid),
          'partition', (SELECT c.relispartition FROM pg_class c WHERE c.oid = r.objid),
          'oid', r.objid::bigint,
          'columns', CASE WHEN r.command_tag = 'ALTER TABLE' THEN
            (SELECT json_agg(json_build_array(a.attnum, a.attname) ORDER BY a.attnum) FROM pg_attribute a
             WHERE a.attrelid = r.objid AND a.attnum > 0 AND NOT a.attisdropped) END)::text;
      END LOOP;
    END IF;
  EXCEPTION WHEN OTHERS THEN
    RAISE WARNING 'tributary: DDL message not written: %', SQLERRM;
    RETURN;
  END;
  -- Written outside the exception block: a message written in its
  -- subtransaction may be decoded after the DDL's transaction's rows.
  IF current_setting('wal_level') = 'logical' THEN
    FOREACH m IN ARRAY msgs LOOP
      PERFORM pg_logical_emit_message(true, 'tributary', m);
    END LOOP;
  END IF;
END
$fn$;
COMMENT ON FUNCTION tributary.emit_ddl() IS 'tributary DDL messages v4';
CREATE EVENT TRIGGER tributary_ddl_end ON ddl_command_end EXECUTE FUNCTION tributary.emit_ddl();
CREATE EVENT TRIGGER tributary_sql_drop ON sql_drop EXECUTE FUNCTION tributary.emit_ddl();
CREATE EVENT TRIGGER tributary_table_rewrite ON table_rewrite EXECUTE FUNCTION tributary.emit_ddl();"#;

/// The comment marking the current version of the DDL trigger function, so
/// that an older installation is replaced.
const DDL_TRIGGER_VERSION: &str = "tributary DDL messages v4";
/// The event triggers [`DDL_TRIGGER_SQL`] makes.
const DDL_TRIGGERS: [&str; 3] = ["tributary_ddl_end", "tributary_sql_drop", "tributary_table_rewrite"];

async fn ddl_trigger_installed(client: &tokio_postgres::Client) -> Result<bool> {
    let row = client
        .query_one(
            "SELECT (SELECT count(*) FROM pg_event_trigger \
                     WHERE evtname = ANY($1) AND evtenabled <> 'D'), \
                    (SELECT obj_description(p.oid, 'pg_proc') FROM pg_proc p \
                     JOIN pg_namespace n ON n.oid = p.pronamespace \
                     WHERE n.nspname = 'tributary' AND p.proname = 'emit_ddl')",
            &[&DDL_TRIGGERS.as_slice()],
        )
        .await
        .map_err(|e| classify_pg(e, "reading event triggers"))?;
    Ok(row.get::<_, i64>(0) == DDL_TRIGGERS.len() as i64
        && row.get::<_, Option<String>>(1).as_deref() == Some(DDL_TRIGGER_VERSION))
}

/// Installs the DDL event trigger when it is missing and the role is a
/// superuser; otherwise logs the SQL an operator should run.
pub async fn install_ddl_trigger(client: &tokio_postgres::Client) -> Result<()> {
    if ddl_trigger_installed(client).await? {
        return Ok(());
    }
    let superuser: bool = client
        .query_one("SELECT rolsuper FROM pg_roles WHERE rolname = current_user", &[])
        .await
        .map_err(|e| classify_pg(e, "reading the role"))?
        .get(0);
    if !superuser {
        tracing::warn!(
            sql = DDL_TRIGGER_SQL,
            "the DDL event trigger is not installed and this role may not install it: dropped tables \
             and new tables are only noticed on restart; run the SQL as a superuser"
        );
        return Ok(());
    }
    // Two sources may install at once: a lost race is fine as long as the
    // trigger ends up installed.
    let sql = DDL_TRIGGERS.iter().fold(DDL_TRIGGER_SQL.to_string(), |sql, t| {
        sql.replace(
            &format!("CREATE EVENT TRIGGER {t} "),
            &format!("DROP EVENT TRIGGER IF EXISTS {t}; CREATE EVENT TRIGGER {t} "),
        )
    });
    let sql = format!("BEGIN; {sql} COMMIT;");
    if let Err(e) = client.batch_execute(&sql).await {
        let _ = client.batch_execute("ROLLBACK").await;
        if !ddl_trigger_installed(client).await? {
            return Err(classify_pg(e, "installing the DDL event trigger"));
        }
    }
    tracing::info!("DDL event trigger installed");
    Ok(())
}

/// Fails with the exact `GRANT` statements when `user` may not read some of
/// `tables` (or use their schemas), before anything is created.
pub async fn require_select(client: &tokio_postgres::Client, user: &str, tables: &[TableId]) -> Result<()> {
    let mut grants = Vec::new();
    let mut first = None;
    for t in tables {
        let row = client
            .query_one(
                "SELECT has_schema_privilege(current_user, n.oid, 'USAGE'), \
                        has_table_privilege(current_user, c.oid, 'SELECT') \
                 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
                 WHERE n.nspname = $1 AND c.relname = $2",
                &[&t.schema, &t.table],
            )
            .await
            .map_err(|e| classify_pg(e, "reading table privileges").with_table(t.clone()))?;
        let (usage, select): (bool, bool) = (row.get(0), row.get(1));
        let usage_sql = format!("GRANT USAGE ON SCHEMA {} TO {};", quote_ident(&t.schema), quote_ident(user));
        if !usage && !grants.contains(&usage_sql) {
            grants.push(usage_sql);
        }
        if !select {
            grants.push(format!("GRANT SELECT ON {} TO {};", quote_table(t), quote_ident(user)));
        }
        if (!usage || !select) && first.is_none() {
            first = Some(t.clone());
        }
    }
    match first {
        None => Ok(()),
        Some(t) => Err(Error::needs_operator(format!(
            "role {user} may not read {} of the selected tables",
            grants.iter().filter(|g| g.starts_with("GRANT SELECT")).count().max(1)
        ))
        .with_table(t)
        .with_class("sqlstate.42501")
        .with_hint(grants.join(" "))),
    }
}

/// `CREATE PUBLICATION` for `tables`. Changes of partitions are published
/// as changes of their partitioned table (the table the source captures).
pub fn create_publication_sql(publication: &str, tables: &[TableId]) -> String {
    if tables.is_empty() {
        format!("CREATE PUBLICATION {} WITH (publish_via_partition_root = true);", quote_ident(publication))
    } else {
        format!(
            "CREATE PUBLICATION {} FOR TABLE {} WITH (publish_via_partition_root = true);",
            quote_ident(publication),
            tables.iter().map(quote_table).collect::<Vec<_>>().join(", ")
        )
    }
}

/// `ALTER PUBLICATION ... ADD TABLE` for `table`.
pub fn add_table_sql(publication: &str, table: &TableId) -> String {
    format!("ALTER PUBLICATION {} ADD TABLE {};", quote_ident(publication), quote_table(table))
}

/// A publication as the source sees it.
struct PublicationTables {
    /// `FOR ALL TABLES`.
    all: bool,
    /// `publish_via_partition_root`.
    via_root: bool,
    /// The tables it publishes; a partition published under its own name
    /// counts as its root table (the stream maps it there).
    tables: Vec<TableId>,
}

async fn publication_tables(client: &tokio_postgres::Client, publication: &str) -> Result<Option<PublicationTables>> {
    let row = client
        .query_opt("SELECT puballtables, pubviaroot FROM pg_publication WHERE pubname = $1", &[&publication])
        .await
        .map_err(|e| classify_pg(e, "reading publications"))?;
    let Some(row) = row else { return Ok(None) };
    let rows = client
        .query(
            "SELECT DISTINCT n.nspname::text, r.relname::text \
             FROM pg_publication_tables t \
             JOIN pg_namespace tn ON tn.nspname = t.schemaname \
             JOIN pg_class tc ON tc.relnamespace = tn.oid AND tc.relname = t.tablename \
             JOIN pg_class r ON r.oid = COALESCE(pg_partition_root(tc.oid), tc.oid) \
             JOIN pg_namespace n ON n.oid = r.relnamespace \
             WHERE t.pubname = $1",
            &[&publication],
        )
        .await
        .map_err(|e| classify_pg(e, "reading publication tables"))?;
    Ok(Some(PublicationTables {
        all: row.get(0),
        via_root: row.get(1),
        tables: rows
            .iter()
            .map(|r| TableId::new(r.get::<_, String>(0), r.get::<_, String>(1)))
            .collect(),
    }))
}

/// `ALTER PUBLICATION ... SET (publish_via_partition_root = true)`.
pub fn via_root_sql(publication: &str) -> String {
    format!("ALTER PUBLICATION {} SET (publish_via_partition_root = true);", quote_ident(publication))
}

/// The partitioned tables among `tables`.
async fn partitioned_tables(client: &tokio_postgres::Client, tables: &[TableId]) -> Result<Vec<TableId>> {
    let mut out = Vec::new();
    for id in tables {
        let partitioned = client
            .query_opt(
                "SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
                 WHERE n.nspname = $1 AND c.relname = $2 AND c.relkind = 'p'",
                &[&id.schema, &id.table],
            )
            .await
            .map_err(|e| classify_pg(e, "reading the table kind").with_table(id.clone()))?
            .is_some();
        if partitioned {
            out.push(id.clone());
        }
    }
    Ok(out)
}

/// What a publication without `publish_via_partition_root` costs a
/// partitioned table.
const VIA_ROOT_MISSING: &str = "the publication lacks publish_via_partition_root: its partitions' changes arrive \
     under the partitions' names (the source maps them to the table), and a TRUNCATE of some partitions only \
     cannot be carried";

/// Gives full before-images to the tables that need them: with replica
/// identity DEFAULT (or USING INDEX) a DELETE's old row holds only the key,
/// and a NOT NULL column outside the key then has no value the change event
/// can carry; a table without a primary key needs its whole old row (its
/// rows are told apart by their content, see `sink::keyless`; without a
/// replica identity its UPDATEs and DELETEs fail once published). Such
/// tables are switched to REPLICA IDENTITY FULL when the role may (it must
/// own the table); otherwise this is a needs-operator error with the exact
/// SQL. Done before the slot exists, so no such delete is captured; for a
/// table added while streaming, or copied again, before it joins the
/// publication or is read.
pub async fn ensure_full_before_images(client: &tokio_postgres::Client, tables: &[TableId]) -> Result<()> {
    for id in tables {
        let row = client
            .query_one(
                "SELECT c.relreplident::text <> 'f' AND (NOT EXISTS ( \
                     SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary) \
                   OR c.relreplident::text IN ('d', 'i') AND EXISTS ( \
                     SELECT 1 FROM pg_attribute a \
                     WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped AND a.attnotnull \
                       AND NOT EXISTS (SELECT 1 FROM pg_index i \
                                       WHERE i.indrelid = c.oid AND i.indisprimary AND a.attnum = ANY (i.indkey)))) \
                 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
                 WHERE n.nspname = $1 AND c.relname = $2",
                &[&id.schema, &id.table],
            )
            .await
            .map_err(|e| classify_pg(e, "reading the replica identity").with_table(id.clone()))?;
        if !row.get::<_, bool>(0) {
            continue;
        }
        let sql = format!("ALTER TABLE {} REPLICA IDENTITY FULL;", quote_table(id));
        if let Err(e) = client.batch_execute(&sql).await {
            let err = classify_pg(e, "setting REPLICA IDENTITY FULL");
            return Err(Error::needs_operator(format!(
                "deletes would not carry the whole old row (the table has no primary key, or NOT NULL columns \
                 outside it): {err}"
            ))
            .with_table(id.clone())
            .with_class(err.class())
            .with_hint(sql));
        }
        tracing::info!(table = %id, "replica identity set to FULL so that deletes carry the whole old row");
    }
    Ok(())
}

/// Makes sure the publication exists and covers `tables`, creating or
/// altering it when the role may; otherwise a needs-operator error with the
/// exact SQL.
pub async fn ensure_publication(
    client: &tokio_postgres::Client,
    config: &PostgresSourceConfig,
    tables: &[TableId],
) -> Result<()> {
    let publication = &config.publication_name;
    match publication_tables(client, publication).await? {
        None => {
            let sql = create_publication_sql(publication, tables);
            if let Err(e) = client.batch_execute(&sql).await {
                let err = classify_pg(e, "creating the publication");
                if err.class() == "sqlstate.42710" {
                    // Created concurrently: check it again.
                    return Box::pin(ensure_publication(client, config, tables)).await;
                }
                return Err(publication_failed(&err, sql));
            }
            tracing::info!(publication = %publication, tables = tables.len(), "publication created");
        }
        Some(p) => {
            if !p.via_root {
                for t in partitioned_tables(client, tables).await? {
                    tracing::warn!(table = %t, fix = %via_root_sql(publication), "{VIA_ROOT_MISSING}");
                }
            }
            if p.all {
                return Ok(());
            }
            for t in tables.iter().filter(|t| !p.tables.contains(t)) {
                let sql = add_table_sql(publication, t);
                if let Err(e) = client.batch_execute(&sql).await {
                    let err = classify_pg(e, "adding a table to the publication");
                    if err.class() == "sqlstate.42710" {
                        continue;
                    }
                    if err.class() == "sqlstate.42P01" {
                        tracing::warn!(table = %t, "table disappeared before it could join the publication");
                        continue;
                    }
                    return Err(publication_failed(&err, sql).with_table(t.clone()));
                }
                tracing::info!(publication = %publication, table = %t, "table added to the publication");
            }
        }
    }
    Ok(())
}

/// A publication statement that failed for a reason other than a race: a
/// retry may cure an outage, anything else (privileges, a bad name) needs
/// the operator, who gets the statement to run.
fn publication_failed(err: &Error, sql: String) -> Error {
    let kind = if err.kind() == ErrorKind::Retryable {
        ErrorKind::Retryable
    } else {
        ErrorKind::NeedsOperator
    };
    Error::new(kind, err.to_string()).with_class(err.class()).with_hint(sql)
}

/// Checks everything the source needs; an empty list means ready.
pub async fn check(config: &PostgresSourceConfig) -> Vec<Problem> {
    match check_inner(config).await {
        Ok(problems) => problems,
        Err(e) => vec![Problem::error(
            format!("cannot check the source: {e}"),
            e.hint().map(str::to_string),
        )],
    }
}

/// Applies the fixes marked `auto_fix` (publication, DDL trigger, replica
/// identity FULL) and returns what is still wrong.
pub async fn fix(config: &PostgresSourceConfig) -> Result<Vec<Problem>> {
    let params = config.connection()?;
    let catalog = Catalog::connect(&params).await?;
    for p in check(config).await {
        if let (true, Some(sql)) = (p.auto_fix, &p.fix) {
            tracing::info!(sql = %sql, "applying a fix");
            catalog
                .client()
                .batch_execute(sql)
                .await
                .map_err(|e| classify_pg(e, "applying a fix").with_hint(sql.clone()))?;
        }
    }
    Ok(check(config).await)
}

async fn show(client: &tokio_postgres::Client, name: &str) -> Result<String> {
    let row = client
        .query_one("SELECT current_setting($1)", &[&name])
        .await
        .map_err(|e| classify_pg(e, "reading settings"))?;
    Ok(row.get(0))
}

async fn check_inner(config: &PostgresSourceConfig) -> Result<Vec<Problem>> {
    let mut problems = Vec::new();
    if let Err(e) = config.validate_as("postgres") {
        problems.push(Problem::error(e.to_string(), None));
        return Ok(problems);
    }
    let params = config.connection()?;
    let catalog = Catalog::connect(&params).await?;
    let client = catalog.client();
    let user = params.user.clone();

    let wal_level = show(client, "wal_level").await?;
    if wal_level != "logical" {
        problems.push(Problem::error(
            format!("wal_level is {wal_level}; logical decoding needs logical"),
            Some("ALTER SYSTEM SET wal_level = logical; -- then restart PostgreSQL".into()),
        ));
    }
    let slots_row = client
        .query_one(
            "SELECT current_setting('max_replication_slots')::int, \
                    (SELECT count(*)::int FROM pg_replication_slots), \
                    (SELECT count(*)::int FROM pg_replication_slots WHERE slot_name = $1), \
                    current_setting('max_wal_senders')::int, \
                    (SELECT count(*)::int FROM pg_stat_replication)",
            &[&config.slot_name],
        )
        .await
        .map_err(|e| classify_pg(e, "reading replication settings"))?;
    let (max_slots, used_slots, ours, max_senders, senders): (i32, i32, i32, i32, i32) =
        (slots_row.get(0), slots_row.get(1), slots_row.get(2), slots_row.get(3), slots_row.get(4));
    if ours == 0 && used_slots >= max_slots {
        problems.push(Problem::error(
            format!("all {max_slots} replication slots are in use; the source needs one more"),
            Some(format!("ALTER SYSTEM SET max_replication_slots = {}; -- then restart PostgreSQL", max_slots + 4)),
        ));
    }
    if senders >= max_senders {
        problems.push(Problem::error(
            format!("all {max_senders} WAL senders are in use; the source needs one more"),
            Some(format!("ALTER SYSTEM SET max_wal_senders = {}; -- then restart PostgreSQL", max_senders + 4)),
        ));
    }

    let role = client
        .query_one("SELECT rolsuper, rolreplication FROM pg_roles WHERE rolname = current_user", &[])
        .await
        .map_err(|e| classify_pg(e, "reading the role"))?;
    let (superuser, replication): (bool, bool) = (role.get(0), role.get(1));
    if !superuser && !replication {
        problems.push(Problem::error(
            format!("role {user} may not use replication"),
            Some(format!("ALTER ROLE {} REPLICATION;", quote_ident(&user))),
        ));
    }

    let tables = catalog.list_tables(&config.filter()).await?;
    if tables.is_empty() {
        problems.push(Problem::warning("no table matches postgres.include (minus postgres.exclude)", None));
    }
    for (relid, id) in &tables {
        let row = client
            .query_one(
                "SELECT has_schema_privilege(current_user, $2, 'USAGE'), \
                        has_table_privilege(current_user, $1::oid, 'SELECT'), \
                        c.relreplident::text, \
                        EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary) \
                 FROM pg_class c WHERE c.oid = $1::oid",
                &[relid, &id.schema],
            )
            .await
            .map_err(|e| classify_pg(e, "reading table privileges").with_table(id.clone()))?;
        let (usage, select, ident, has_pk): (bool, bool, String, bool) =
            (row.get(0), row.get(1), row.get(2), row.get(3));
        if !usage {
            problems.push(
                Problem::error(
                    format!("role {user} may not use schema {}", id.schema),
                    Some(format!("GRANT USAGE ON SCHEMA {} TO {};", quote_ident(&id.schema), quote_ident(&user))),
                )
                .on(id),
            );
        }
        if !select {
            problems.push(
                Problem::error(
                    format!("role {user} may not read the table"),
                    Some(format!("GRANT SELECT ON {} TO {};", quote_table(id), quote_ident(&user))),
                )
                .on(id),
            );
        }
        let full = format!("ALTER TABLE {} REPLICA IDENTITY FULL;", quote_table(id));
        match ident.as_str() {
            "f" => {}
            "d" if has_pk => problems.push(
                Problem::warning(
                    "replica identity is DEFAULT: updates carry no before-image and unchanged large (TOAST) \
                     values must be read back from the table; FULL is recommended",
                    Some(full),
                )
                .on(id),
            ),
            "i" => problems.push(
                Problem::warning(
                    "replica identity is USING INDEX: no full before-images; FULL is recommended",
                    Some(full),
                )
                .on(id),
            ),
            _ => problems.push(
                Problem::error(
                    "the table has no primary key and replica identity DEFAULT or NOTHING: once published, \
                     its UPDATEs and DELETEs fail in the application",
                    Some(full),
                )
                .on(id)
                .auto(),
            ),
        }
    }

    let ids: Vec<TableId> = tables.iter().map(|(_, id)| id.clone()).collect();
    if config.sequence_interval_ms > 0 {
        // The sequences kept in the destinations must be readable.
        for (table, state, readable) in catalog.sequences(&ids).await? {
            if !readable {
                let sequence = state.id();
                problems.push(
                    Problem::warning(
                        format!(
                            "role {user} may not read sequence {sequence}: it is not kept in the destinations \
                             (a destination promoted to primary could hand out its values again)"
                        ),
                        Some(format!("GRANT SELECT ON SEQUENCE {} TO {};", quote_table(&sequence), quote_ident(&user))),
                    )
                    .on(&table),
                );
            }
        }
    }
    let may_create: bool = client
        .query_one("SELECT has_database_privilege(current_user, current_database(), 'CREATE')", &[])
        .await
        .map_err(|e| classify_pg(e, "reading database privileges"))?
        .get(0);
    match publication_tables(client, &config.publication_name).await? {
        None => {
            let sql = create_publication_sql(&config.publication_name, &ids);
            let p = Problem::warning(format!("publication {} does not exist", config.publication_name), Some(sql));
            problems.push(if may_create || superuser {
                Problem {
                    message: format!("{} (the source creates it on start)", p.message),
                    ..p
                }
                .auto()
            } else {
                Problem { severity: Severity::Error, ..p }
            });
        }
        Some(p) => {
            let owner: bool = client
                .query_one(
                    "SELECT pg_has_role(current_user, p.pubowner, 'USAGE') FROM pg_publication p WHERE p.pubname = $1",
                    &[&config.publication_name],
                )
                .await
                .map_err(|e| classify_pg(e, "reading the publication owner"))?
                .get(0);
            if !p.via_root {
                for id in partitioned_tables(client, &ids).await? {
                    let fix = Problem::warning(VIA_ROOT_MISSING, Some(via_root_sql(&config.publication_name))).on(&id);
                    problems.push(if owner || superuser { fix.auto() } else { fix });
                }
            }
            let present = if p.all { ids.clone() } else { p.tables };
            for id in ids.iter().filter(|t| !present.contains(t)) {
                let p = Problem::warning(
                    format!("the table is not in publication {}", config.publication_name),
                    Some(add_table_sql(&config.publication_name, id)),
                )
                .on(id);
                problems.push(if owner || superuser {
                    Problem {
                        message: format!("{} (the source adds it on start)", p.message),
                        ..p
                    }
                    .auto()
                } else {
                    Problem { severity: Severity::Error, ..p }
                });
            }
        }
    }

    if !ddl_trigger_installed(client).await? {
        let p = Problem::warning(
            "the DDL event trigger is not installed: new and dropped tables are only noticed on restart",
            Some(DDL_TRIGGER_SQL.to_string()),
        );
        problems.push(if superuser {
            Problem {
                message: format!("{} (the source installs it on start)", p.message),
                ..p
            }
            .auto()
        } else {
            p
        });
    }

    let slot = client
        .query_opt(
            "SELECT plugin::text, database::text, active FROM pg_replication_slots WHERE slot_name = $1",
            &[&config.slot_name],
        )
        .await
        .map_err(|e| classify_pg(e, "reading replication slots"))?;
    if let Some(s) = slot {
        let plugin: Option<String> = s.get(0);
        let db: Option<String> = s.get(1);
        if plugin.as_deref() != Some("pgoutput") || db.as_deref() != Some(params.database.as_str()) {
            problems.push(Problem::error(
                format!("replication slot {} belongs to another plugin or database", config.slot_name),
                Some(format!("SELECT pg_drop_replication_slot({});", quote_literal(&config.slot_name))),
            ));
        }
    }
    problems.sort_by_key(|p| std::cmp::Reverse(p.severity));
    Ok(problems)
}

/// Removes what the source created for this copy on the database: its
/// replication slot (releasing the WAL it holds) and its publication. The
/// DDL trigger is shared by every copy of the database and stays. Returns a
/// line per object dropped.
pub async fn teardown(config: &PostgresSourceConfig) -> Result<Vec<String>> {
    let params = config.connection()?;
    let catalog = Catalog::connect(&params).await?;
    let client = catalog.client();
    let mut done = Vec::new();
    let slot = client
        .query_opt("SELECT active FROM pg_replication_slots WHERE slot_name = $1", &[&config.slot_name])
        .await
        .map_err(|e| classify_pg(e, "reading replication slots"))?;
    if let Some(row) = slot {
        if row.get::<_, bool>(0) {
            return Err(Error::retryable(format!(
                "replication slot {} is in use: stop the runner first",
                config.slot_name
            )));
        }
        client
            .execute("SELECT pg_drop_replication_slot($1)", &[&config.slot_name])
            .await
            .map_err(|e| {
                classify_pg(e, "dropping the replication slot")
                    .with_hint(format!("SELECT pg_drop_replication_slot({});", quote_literal(&config.slot_name)))
            })?;
        done.push(format!("replication slot {}", config.slot_name));
    }
    if publication_tables(client, &config.publication_name).await?.is_some() {
        let sql = format!("DROP PUBLICATION {};", quote_ident(&config.publication_name));
        client
            .batch_execute(&sql)
            .await
            .map_err(|e| classify_pg(e, "dropping the publication").with_hint(sql.clone()))?;
        done.push(format!("publication {}", config.publication_name));
    }
    Ok(done)
}

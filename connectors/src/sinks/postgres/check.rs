//! `sink-runner check` for PostgreSQL: reachable, not a standby, new
//! enough, and the sink user's rights on the bookkeeping table and the
//! destination schema, each problem with its fix. Changes nothing.

use super::client::{classify, connect_hint};
use super::PostgresSink;
use crate::pgwire::quote_ident;
use crate::problem::Problem;

/// Checks that the destination is reachable and usable, without changing
/// it. Returns the problems found, each with a fix; empty means ready.
pub(super) async fn check(sink: &mut PostgresSink) -> Vec<Problem> {
    let mut problems = Vec::new();
    let ctx = sink.session.ctx();
    if !sink.session.is_open() {
        sink.reset();
        match sink.session.open().await {
            Ok(client) => sink.session.adopt(client),
            Err(err) => {
                problems.push(Problem::error(
                    format!("cannot connect to the destination: {}", err.message()),
                    Some(err.hint().map(str::to_string).unwrap_or_else(connect_hint)),
                ));
                return problems;
            }
        }
    }
    let Ok(client) = sink.session.client().await else {
        return problems;
    };
    let user = quote_ident(&ctx.user);
    let db = quote_ident(&ctx.database);
    let q = client
        .query_one(
            "SELECT current_setting('server_version_num')::int, \
             has_database_privilege(current_database(), 'CREATE'), \
             to_regclass('tributary.offsets') IS NOT NULL, \
             pg_is_in_recovery()",
            &[],
        )
        .await;
    let row = match q {
        Ok(row) => row,
        Err(e) => {
            let err = classify(&e, &ctx);
            problems.push(Problem::error(
                format!("cannot query the destination: {}", err.message()),
                Some(err.hint().unwrap_or("check the server log").to_string()),
            ));
            return problems;
        }
    };
    let version: i32 = row.get(0);
    let can_create: bool = row.get(1);
    let has_offsets: bool = row.get(2);
    let in_recovery: bool = row.get(3);
    if version < 110_000 {
        problems.push(Problem::error(
            format!("PostgreSQL {} is too old", version / 10_000),
            Some("use PostgreSQL 11 or newer".into()),
        ));
    }
    if in_recovery {
        problems.push(Problem::error(
            "the destination is a read-only standby",
            Some("point postgres.url at the primary".into()),
        ));
    }
    if has_offsets {
        let ok = client
            .query_one("SELECT has_table_privilege('tributary.offsets', 'SELECT, INSERT, UPDATE')", &[])
            .await
            .map(|r| r.get::<_, bool>(0))
            .unwrap_or(false);
        if !ok {
            problems.push(Problem::error("the sink user cannot write tributary.offsets", Some(format!(
                    "GRANT USAGE ON SCHEMA tributary TO {user}; GRANT SELECT, INSERT, UPDATE ON tributary.offsets TO {user}"
                ))));
        }
    } else if !can_create {
        problems.push(Problem::error(
            "the bookkeeping table tributary.offsets does not exist and the sink user cannot create it",
            Some(format!("GRANT CREATE ON DATABASE {db} TO {user}")),
        ));
    }
    // The deleted rows' positions (made with the offsets table; a sink
    // upgraded from before it makes it at its first connect).
    let deleted = client
        .query_one(
            "SELECT to_regclass('tributary.deleted_rows') IS NOT NULL, \
             CASE WHEN to_regclass('tributary.deleted_rows') IS NOT NULL \
             THEN has_table_privilege('tributary.deleted_rows', 'SELECT, INSERT, UPDATE, DELETE') \
             ELSE has_schema_privilege('tributary', 'CREATE') OR (to_regnamespace('tributary') IS NULL AND $1) END",
            &[&can_create],
        )
        .await
        .map(|r| (r.get::<_, bool>(0), r.get::<_, bool>(1)));
    if let Ok((exists, ok)) = deleted {
        if !ok {
            let fix = if exists {
                format!("GRANT SELECT, INSERT, UPDATE, DELETE ON tributary.deleted_rows TO {user}")
            } else {
                format!(
                    "{}; GRANT SELECT, INSERT, UPDATE, DELETE ON tributary.deleted_rows TO {user}",
                    super::dialect::deleted_table_ddl()
                )
            };
            problems.push(Problem::error(
                "the sink user cannot write tributary.deleted_rows (the positions of deleted rows)",
                Some(fix),
            ));
        }
    }
    if let Some(schema) = &sink.config.schema {
        let r = client
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1), \
                 CASE WHEN EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1) \
                 THEN has_schema_privilege($1, 'USAGE, CREATE') ELSE false END",
                &[schema],
            )
            .await;
        if let Ok(r) = r {
            let (exists, usable): (bool, bool) = (r.get(0), r.get(1));
            if exists && !usable {
                problems.push(Problem::error(
                    format!("the sink user cannot create tables in schema {schema}"),
                    Some(format!("GRANT USAGE, CREATE ON SCHEMA {} TO {user}", quote_ident(schema))),
                ));
            } else if !exists && !can_create {
                problems.push(Problem::error(
                    format!("schema {schema} does not exist and the sink user cannot create it"),
                    Some(format!("CREATE SCHEMA {} AUTHORIZATION {user}", quote_ident(schema))),
                ));
            }
        }
    }
    problems
}

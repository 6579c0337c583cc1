//! A destination table's indexes, constraints and defaults made to match
//! the source's ([`TableObjects`], docs/migration.md), each at its time:
//!
//! - **now** (once the table is copied): secondary indexes that are not
//!   unique, and column defaults. They cannot refuse a change the source
//!   made.
//! - **at cutover** ([`make_waiting`]): unique indexes and constraints,
//!   check, exclusion and foreign-key constraints, identities. Each could
//!   refuse a change on its way: the sink applies a batch's changes per
//!   table and key, not in the source's statement order (a unique value
//!   moved from one row to another, a child row written before its
//!   parent's table caught up), and objects are read at intervals, not in
//!   the change stream (a row the source accepted after it dropped or
//!   relaxed a check would arrive before the check's removal). Once the
//!   source is read-only and everything is applied, the destination holds
//!   a state the source was in, which satisfies them.
//!
//! Every object is a row of the bookkeeping table `tributary.objects`:
//! its statement and its state (`made`, `at_cutover`, `refused` with the
//! destination's error), written in the transaction that made it. An
//! object the destination refuses (a function or type it lacks) is said in
//! the log and kept as `refused`; it never fails the batch, and the next
//! set or the cutover tries it again. An object gone from the source's set
//! is dropped when this sink made it.

use std::collections::{BTreeMap, HashMap};

use tracing::{info, warn};
use tributary_schemas::{ConstraintKind, TableId, TableObjects};

use super::client::{classify, Ctx, Session};
use super::config::DestinationTable;
use crate::error::Result;
use crate::pgwire::{quote_ident, quote_literal};
use crate::sink::bookkeeping::BOOKKEEPING_SCHEMA;

/// The bookkeeping table of objects.
pub const OBJECTS_TABLE: &str = "objects";

/// When an object is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum When {
    /// Once the table is copied.
    Now,
    /// At a cutover.
    AtCutover,
}

/// One object as this destination makes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Planned {
    /// `index`, `check`, `unique`, `exclusion`, `foreign_key`, `default`,
    /// `identity`.
    pub kind: &'static str,
    /// Its name (a default's and an identity's: the column's).
    pub name: String,
    /// The statements that make it.
    pub create: String,
    /// The statements that remove it.
    pub drop: String,
    /// When it is made.
    pub when: When,
}

/// The quoted name of the bookkeeping table of objects.
pub fn objects_table() -> String {
    format!("{}.{}", quote_ident(BOOKKEEPING_SCHEMA), quote_ident(OBJECTS_TABLE))
}

/// Creates the objects table (under the lock every bookkeeping table is
/// created under, so two sinks do not race).
fn create_objects_sql() -> String {
    format!(
        "SELECT pg_advisory_xact_lock(hashtext({})); CREATE TABLE IF NOT EXISTS {} \
         (consumer_group text NOT NULL, destination text NOT NULL, kind text NOT NULL, name text NOT NULL, \
          statement text NOT NULL, drop_statement text NOT NULL, state text NOT NULL, error text, \
          changed_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (consumer_group, destination, kind, name)); ",
        quote_literal("tributary bookkeeping"),
        objects_table()
    )
}

/// `dest`'s objects for the source's `objects`; `named` gives the
/// destination of each other table and sequence they name.
pub fn plan(
    dest: &DestinationTable,
    objects: &TableObjects,
    named: &HashMap<TableId, DestinationTable>,
) -> Vec<Planned> {
    let t = dest.quoted();
    let in_schema = |name: &str| format!("{}.{}", quote_ident(&dest.schema), quote_ident(name));
    let mut out = Vec::new();
    for index in &objects.indexes {
        let unique = if index.unique { "UNIQUE " } else { "" };
        out.push(Planned {
            kind: "index",
            name: index.name.clone(),
            create: format!(
                "CREATE {unique}INDEX IF NOT EXISTS {} ON {t} {}",
                quote_ident(&index.name),
                index.definition
            ),
            drop: format!("DROP INDEX IF EXISTS {}", in_schema(&index.name)),
            when: if index.unique { When::AtCutover } else { When::Now },
        });
    }
    for c in &objects.constraints {
        let (kind, when) = match c.kind {
            ConstraintKind::Check => ("check", When::AtCutover),
            ConstraintKind::Unique => ("unique", When::AtCutover),
            ConstraintKind::Exclusion => ("exclusion", When::AtCutover),
            ConstraintKind::ForeignKey => ("foreign_key", When::AtCutover),
        };
        let definition = match &c.references {
            Some(r) => {
                let target = named.get(&r.table).map_or_else(
                    || format!("{}.{}", quote_ident(&r.table.schema), quote_ident(&r.table.table)),
                    DestinationTable::quoted,
                );
                let columns: Vec<String> = r.columns.iter().map(|c| quote_ident(c)).collect();
                let options = if r.options.is_empty() {
                    String::new()
                } else {
                    format!(" {}", r.options)
                };
                format!("{} REFERENCES {target} ({}){options}", c.definition, columns.join(", "))
            }
            None => c.definition.clone(),
        };
        out.push(Planned {
            kind,
            name: c.name.clone(),
            create: format!("ALTER TABLE {t} ADD CONSTRAINT {} {definition}", quote_ident(&c.name)),
            drop: format!("ALTER TABLE {t} DROP CONSTRAINT IF EXISTS {}", quote_ident(&c.name)),
            when,
        });
    }
    for d in &objects.defaults {
        let column = quote_ident(&d.column);
        let sequence = d.sequence.as_ref().map(|s| {
            named.get(s).map_or_else(
                || format!("{}.{}", quote_ident(&s.schema), quote_ident(&s.table)),
                DestinationTable::quoted,
            )
        });
        match (d.identity_always, &sequence) {
            (Some(always), Some(seq)) => {
                out.push(Planned {
                    kind: "identity",
                    name: d.column.clone(),
                    create: identity_sql(&t, &d.column, seq, always),
                    drop: format!("ALTER TABLE {t} ALTER COLUMN {column} DROP IDENTITY IF EXISTS"),
                    when: When::AtCutover,
                });
            }
            (Some(_), None) => {}
            (None, _) => {
                let expression = match &sequence {
                    Some(seq) => format!("nextval({}::regclass)", quote_literal(seq)),
                    None => d.expression.clone(),
                };
                out.push(Planned {
                    kind: "default",
                    name: d.column.clone(),
                    create: format!("ALTER TABLE {t} ALTER COLUMN {column} SET DEFAULT {expression}"),
                    drop: format!("ALTER TABLE {t} ALTER COLUMN {column} DROP DEFAULT"),
                    when: When::Now,
                });
            }
        }
    }
    out
}

/// Makes `column` of table `t` an identity taking values from sequence
/// `seq` (both quoted). The sink keeps the source's sequence as a plain
/// one (from its sequence records), and PostgreSQL cannot make an existing
/// sequence an identity's: it is replaced by the identity's own, with the
/// same name, definition and position (its type is the column's).
fn identity_sql(t: &str, column: &str, seq: &str, always: bool) -> String {
    let generated = if always { "ALWAYS" } else { "BY DEFAULT" };
    let column = quote_ident(column);
    let alter = format!("ALTER TABLE {t} ALTER COLUMN {column}");
    format!(
        "DO $tributary$ DECLARE s record; BEGIN \
         SELECT q.seqincrement, q.seqmin, q.seqmax, q.seqstart, q.seqcycle, \
                pg_sequence_last_value(q.seqrelid) AS last INTO s FROM pg_sequence q WHERE q.seqrelid = to_regclass({lit}); \
         EXECUTE {drop_default}; EXECUTE {drop_seq}; \
         IF s.seqincrement IS NULL THEN EXECUTE {plain}; ELSE \
           EXECUTE format({options}, s.seqincrement, s.seqmin, s.seqmax, s.seqstart, \
                          CASE WHEN s.seqcycle THEN 'CYCLE' ELSE 'NO CYCLE' END); \
           IF s.last IS NOT NULL THEN PERFORM setval({lit}, s.last, true); END IF; \
         END IF; END $tributary$",
        lit = quote_literal(seq),
        drop_default = quote_literal(&format!("{alter} DROP DEFAULT")),
        drop_seq = quote_literal(&format!("DROP SEQUENCE IF EXISTS {seq}")),
        plain = quote_literal(&format!("{alter} ADD GENERATED {generated} AS IDENTITY (SEQUENCE NAME {seq})")),
        // format()'s own `%` in a name doubled.
        options = quote_literal(&format!(
            "{} ADD GENERATED {generated} AS IDENTITY (SEQUENCE NAME {} INCREMENT BY %s MINVALUE %s \
             MAXVALUE %s START WITH %s %s)",
            alter.replace('%', "%%"),
            seq.replace('%', "%%")
        )),
    )
}

/// An object's row in the bookkeeping table.
#[derive(Debug, Clone)]
struct Stored {
    statement: String,
    drop: String,
    state: String,
}

/// Makes `dest`'s objects match `planned`, inside the open unit: drops the
/// ones this sink made that are gone or changed, makes the `Now` ones,
/// records the `AtCutover` ones.
pub(crate) async fn apply(
    session: &Session,
    group: &str,
    dest: &DestinationTable,
    planned: &[Planned],
    ctx: &Ctx,
) -> Result<()> {
    let table = objects_table();
    let client = session.client().await?;
    match bookkeeping(client, ctx).await? {
        Bookkeeping::Usable => {}
        Bookkeeping::Absent { may_create: true } => session.execute(&create_objects_sql(), ctx).await?,
        Bookkeeping::Absent { may_create: false } | Bookkeeping::Forbidden => {
            warn!(table = %dest, user = %ctx.user,
                "this role may not keep {table}: the source's indexes, constraints and defaults are not made in \
                 the destination (GRANT USAGE, CREATE ON SCHEMA {}, or SELECT, INSERT, UPDATE, DELETE ON {table})",
                quote_ident(BOOKKEEPING_SCHEMA));
            return Ok(());
        }
    }
    let has_table: bool = client
        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&dest.quoted()])
        .await
        .map_err(|e| classify(&e, ctx))?
        .get(0);
    let destination = dest.to_string();
    let rows = client
        .query(
            &format!(
                "SELECT kind, name, statement, drop_statement, state FROM {table} \
                 WHERE consumer_group = $1 AND destination = $2"
            ),
            &[&group, &destination],
        )
        .await
        .map_err(|e| classify(&e, ctx))?;
    let stored: BTreeMap<(String, String), Stored> = rows
        .iter()
        .map(|r| {
            (
                (r.get(0), r.get(1)),
                Stored {
                    statement: r.get(2),
                    drop: r.get(3),
                    state: r.get(4),
                },
            )
        })
        .collect();
    // Gone from the source's set, or changed: the old one goes first.
    let (stored, gone): (BTreeMap<_, _>, BTreeMap<_, _>) = stored.into_iter().partition(|((kind, name), old)| {
        planned
            .iter()
            .any(|p| p.kind == kind && &p.name == name && p.create == old.statement)
    });
    for ((kind, name), old) in &gone {
        if old.state == "made" {
            info!(table = %dest, kind = %kind, name = %name, "dropping an object the source no longer has as it was");
            if let Some(e) = attempt(session, &old.drop, ctx).await? {
                warn!(table = %dest, kind = %kind, name = %name, error = %e, "the destination refused to drop the object");
            }
        }
        session
            .execute(
                &format!(
                    "DELETE FROM {table} WHERE consumer_group = {} AND destination = {} AND kind = {} AND name = {}",
                    quote_literal(group),
                    quote_literal(&destination),
                    quote_literal(kind),
                    quote_literal(name)
                ),
                ctx,
            )
            .await?;
    }
    for p in planned {
        let key = (p.kind.to_string(), p.name.clone());
        let state = stored.get(&key).map(|s| s.state.as_str());
        let (state, error) = match (p.when, state) {
            (_, Some("made")) => continue,
            (When::AtCutover, Some("at_cutover")) => continue,
            (When::AtCutover, _) => ("at_cutover", None),
            // The table's rows on another partition, not applied yet: made
            // with the next set, or at the cutover.
            (When::Now, _) if !has_table => ("refused", Some("the destination table does not exist yet".to_string())),
            (When::Now, _) => match attempt(session, &p.create, ctx).await? {
                None => {
                    info!(table = %dest, kind = p.kind, name = %p.name, "made the source's object");
                    ("made", None)
                }
                Some(e) => {
                    warn!(table = %dest, kind = p.kind, name = %p.name, error = %e, statement = %p.create,
                        "the destination refused the source's object: the copy lacks it (tried again with the next \
                         change of the table's objects and at a cutover)");
                    ("refused", Some(e))
                }
            },
        };
        record(session, group, &destination, p, state, error.as_deref(), ctx).await?;
    }
    Ok(())
}

/// Makes the objects of `dest` that were refused and are made before a
/// cutover (indexes that are not unique, defaults), inside the open unit:
/// called when the table is created, for those that came before it.
pub(crate) async fn make_refused_now(session: &Session, group: &str, dest: &DestinationTable, ctx: &Ctx) -> Result<()> {
    let table = objects_table();
    let client = session.client().await?;
    // Looked for first: a failed query would end the open unit.
    if bookkeeping(client, ctx).await? != Bookkeeping::Usable {
        return Ok(());
    }
    let rows = client
        .query(
            &format!(
                "SELECT kind, name, statement, drop_statement FROM {table} \
                 WHERE consumer_group = $1 AND destination = $2 AND state = 'refused' \
                 AND kind IN ('index', 'default') AND statement NOT LIKE 'CREATE UNIQUE%'"
            ),
            &[&group, &dest.to_string()],
        )
        .await
        .map_err(|e| classify(&e, ctx))?;
    let destination = dest.to_string();
    for r in rows {
        let kind: String = r.get(0);
        let kind = if kind == "index" { "index" } else { "default" };
        let p = Planned {
            kind,
            name: r.get(1),
            create: r.get(2),
            drop: r.get(3),
            when: When::Now,
        };
        let refused = attempt(session, &p.create, ctx).await?;
        let state = if refused.is_none() { "made" } else { "refused" };
        record(session, group, &destination, &p, state, refused.as_deref(), ctx).await?;
    }
    Ok(())
}

/// The objects table as this role finds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bookkeeping {
    /// Not made yet (no object was recorded), and whether this role may.
    Absent { may_create: bool },
    /// There, and this role may read and write it.
    Usable,
    /// There, made by another role that did not grant it to this one.
    Forbidden,
}

/// Looks the objects table up without touching it: a refused query would
/// end the open unit.
async fn bookkeeping(client: &tokio_postgres::Client, ctx: &Ctx) -> Result<Bookkeeping> {
    let row = client
        .query_one(
            "SELECT to_regclass($1) IS NOT NULL, \
                    CASE WHEN to_regclass($1) IS NULL THEN false ELSE \
                      has_table_privilege(to_regclass($1), 'SELECT') AND has_table_privilege(to_regclass($1), 'INSERT') \
                      AND has_table_privilege(to_regclass($1), 'UPDATE') AND has_table_privilege(to_regclass($1), 'DELETE') END, \
                    CASE WHEN to_regnamespace($2) IS NULL THEN false ELSE has_schema_privilege($2, 'CREATE') END",
            &[&objects_table(), &BOOKKEEPING_SCHEMA],
        )
        .await
        .map_err(|e| classify(&e, ctx))?;
    Ok(match (row.get(0), row.get(1)) {
        (false, _) => Bookkeeping::Absent { may_create: row.get(2) },
        (true, true) => Bookkeeping::Usable,
        (true, false) => Bookkeeping::Forbidden,
    })
}

/// Whether objects were recorded and this role may use them (the
/// commands' view: a table made by a role that did not grant it is an
/// operator's to fix).
async fn recorded(client: &tokio_postgres::Client, ctx: &Ctx) -> Result<bool> {
    match bookkeeping(client, ctx).await? {
        Bookkeeping::Usable => Ok(true),
        Bookkeeping::Absent { .. } => Ok(false),
        Bookkeeping::Forbidden => Err(crate::error::Error::needs_operator(format!(
            "this role may not read and write {t}: GRANT SELECT, INSERT, UPDATE, DELETE ON {t} TO {}",
            quote_ident(&ctx.user),
            t = objects_table()
        ))),
    }
}

/// Writes `p`'s row with `state`.
async fn record(
    session: &Session,
    group: &str,
    destination: &str,
    p: &Planned,
    state: &str,
    error: Option<&str>,
    ctx: &Ctx,
) -> Result<()> {
    session
        .execute(
            &format!(
                "INSERT INTO {} AS o (consumer_group, destination, kind, name, statement, drop_statement, state, error) \
                 VALUES ({}, {}, {}, {}, {}, {}, {}, {}) ON CONFLICT (consumer_group, destination, kind, name) DO UPDATE SET \
                 statement = EXCLUDED.statement, drop_statement = EXCLUDED.drop_statement, state = EXCLUDED.state, \
                 error = EXCLUDED.error, changed_at = now()",
                objects_table(),
                quote_literal(group),
                quote_literal(destination),
                quote_literal(p.kind),
                quote_literal(&p.name),
                quote_literal(&p.create),
                quote_literal(&p.drop),
                quote_literal(state),
                error.map_or_else(|| "NULL".to_string(), quote_literal),
            ),
            ctx,
        )
        .await
}

/// Runs `sql` under a savepoint: `Some(message)` when the destination
/// refused it (the savepoint undoes it and the unit goes on), an error
/// when the session failed (the unit fails, as any other statement's).
async fn attempt(session: &Session, sql: &str, ctx: &Ctx) -> Result<Option<String>> {
    session.execute("SAVEPOINT tributary_object", ctx).await?;
    match session.execute(sql, ctx).await {
        Ok(()) => {
            session.execute("RELEASE SAVEPOINT tributary_object", ctx).await?;
            Ok(None)
        }
        // The destination said no if the session still answers (a lock
        // wait too: said, and tried again later); else the unit fails.
        Err(e) => match session.execute("ROLLBACK TO SAVEPOINT tributary_object", ctx).await {
            Ok(()) => Ok(Some(e.message().to_string())),
            Err(_) => Err(e),
        },
    }
}

/// An object's outcome at a cutover.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Outcome {
    /// The destination table.
    pub destination: String,
    /// What it is (see [`Planned::kind`]).
    pub kind: String,
    /// Its name.
    pub name: String,
    /// `made` or `refused`.
    pub state: String,
    /// The destination's error, when refused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Makes every object that waits for a cutover, or was refused before, in
/// its own transaction, in an order that lets each find what it needs
/// (unique indexes and constraints before the foreign keys that reference
/// them); check and foreign-key constraints are added `NOT VALID` (no
/// scan under a lock that blocks writes) and validated after (a scan that
/// does not block them): the same end state, a shorter stop. Returns every object's outcome
/// (made before, made now, refused now). Run once the source is read-only
/// and every change is applied (docs/migration.md): earlier, a unique or
/// foreign key can refuse a change on its way.
pub(crate) async fn make_waiting(session: &Session, group: &str, ctx: &Ctx) -> Result<Vec<Outcome>> {
    let table = objects_table();
    let client = session.client().await?;
    if !recorded(client, ctx).await? {
        return Ok(Vec::new());
    }
    let rows = client
        .query(
            &format!(
                "SELECT destination, kind, name, statement, state, error FROM {table} WHERE consumer_group = $1 \
                 ORDER BY CASE kind WHEN 'index' THEN 0 WHEN 'unique' THEN 1 WHEN 'exclusion' THEN 1 \
                 WHEN 'check' THEN 2 WHEN 'default' THEN 3 WHEN 'identity' THEN 4 ELSE 5 END, destination, name"
            ),
            &[&group],
        )
        .await
        .map_err(|e| classify(&e, ctx))?;
    let mut out = Vec::new();
    let mut to_validate = Vec::new();
    for r in rows {
        let (destination, kind, name, statement, state, error): (
            String,
            String,
            String,
            String,
            String,
            Option<String>,
        ) = (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4), r.get(5));
        if state == "made" {
            out.push(Outcome { destination, kind, name, state, error });
            continue;
        }
        let later = matches!(kind.as_str(), "check" | "foreign_key") && !statement.ends_with(" NOT VALID");
        let sql = if later {
            format!("{statement} NOT VALID")
        } else {
            statement
        };
        session.execute("BEGIN", ctx).await?;
        let refused = attempt(session, &sql, ctx).await?;
        let state = if refused.is_none() { "made" } else { "refused" };
        session
            .execute(
                &format!(
                    "UPDATE {table} SET state = {}, error = {}, changed_at = now() \
                     WHERE consumer_group = {} AND destination = {} AND kind = {} AND name = {}; COMMIT",
                    quote_literal(state),
                    refused.as_deref().map_or_else(|| "NULL".to_string(), quote_literal),
                    quote_literal(group),
                    quote_literal(&destination),
                    quote_literal(&kind),
                    quote_literal(&name)
                ),
                ctx,
            )
            .await?;
        if later && refused.is_none() {
            to_validate.push(out.len());
        }
        out.push(Outcome {
            destination,
            kind,
            name,
            state: state.into(),
            error: refused,
        });
    }
    for i in to_validate {
        let o = &out[i];
        let Some(dest) = split_destination(&o.destination) else {
            continue;
        };
        let sql = format!("ALTER TABLE {} VALIDATE CONSTRAINT {}", dest.quoted(), quote_ident(&o.name));
        if let Some(e) = attempt_alone(session, &sql, ctx).await? {
            let sql = format!(
                "ALTER TABLE {} DROP CONSTRAINT IF EXISTS {}; UPDATE {table} SET state = 'refused', error = {}, \
                 changed_at = now() WHERE consumer_group = {} AND destination = {} AND kind = {} AND name = {}",
                dest.quoted(),
                quote_ident(&o.name),
                quote_literal(&e),
                quote_literal(group),
                quote_literal(&o.destination),
                quote_literal(&o.kind),
                quote_literal(&o.name)
            );
            session.execute(&sql, ctx).await?;
            out[i].state = "refused".into();
            out[i].error = Some(e);
        }
    }
    Ok(out)
}

/// Every object's row in the bookkeeping table, as it stands.
pub(crate) async fn list(session: &Session, group: &str, ctx: &Ctx) -> Result<Vec<Outcome>> {
    let table = objects_table();
    let client = session.client().await?;
    if !recorded(client, ctx).await? {
        return Ok(Vec::new());
    }
    let rows = client
        .query(
            &format!(
                "SELECT destination, kind, name, state, error FROM {table} WHERE consumer_group = $1 \
                 ORDER BY destination, kind, name"
            ),
            &[&group],
        )
        .await
        .map_err(|e| classify(&e, ctx))?;
    Ok(rows
        .iter()
        .map(|r| Outcome {
            destination: r.get(0),
            kind: r.get(1),
            name: r.get(2),
            state: r.get(3),
            error: r.get(4),
        })
        .collect())
}

/// Forgets every object of copy `group` (the copy is deleted).
pub fn forget_group_sql(group: &str) -> String {
    format!(
        "DO $$ BEGIN IF to_regclass({t}) IS NOT NULL THEN DELETE FROM {o} WHERE consumer_group = {g}; END IF; END $$",
        t = quote_literal(&objects_table()),
        o = objects_table(),
        g = quote_literal(group)
    )
}

/// Forgets copy `group`'s objects of `dest` (its table was dropped).
pub fn forget_sql(group: &str, dest: &DestinationTable) -> String {
    format!(
        "DO $$ BEGIN IF to_regclass({t}) IS NOT NULL THEN \
         DELETE FROM {o} WHERE consumer_group = {g} AND destination = {d}; END IF; END $$",
        t = quote_literal(&objects_table()),
        o = objects_table(),
        g = quote_literal(group),
        d = quote_literal(&dest.to_string())
    )
}

/// Runs `sql` on its own: `Some(message)` when the destination refused it.
async fn attempt_alone(session: &Session, sql: &str, ctx: &Ctx) -> Result<Option<String>> {
    match session.execute(sql, ctx).await {
        Ok(()) => Ok(None),
        Err(e) => match session.execute("SELECT 1", ctx).await {
            Ok(()) => Ok(Some(e.message().to_string())),
            Err(_) => Err(e),
        },
    }
}

/// A destination table from its `schema.table` text (as the bookkeeping
/// stores it).
fn split_destination(text: &str) -> Option<DestinationTable> {
    let (schema, table) = text.split_once('.')?;
    Some(DestinationTable {
        schema: schema.to_string(),
        table: table.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tributary_schemas::{ColumnDefault, ConstraintObject, ForeignKeyTarget, IndexObject};

    fn dest(t: &str) -> DestinationTable {
        DestinationTable { schema: "copy".into(), table: t.into() }
    }

    #[test]
    fn each_object_is_made_at_its_time_naming_the_destinations_tables() {
        let objects = TableObjects {
            indexes: vec![
                IndexObject {
                    name: "items_name".into(),
                    unique: false,
                    definition: "USING btree (name)".into(),
                },
                IndexObject {
                    name: "items_sku".into(),
                    unique: true,
                    definition: "USING btree (lower(sku))".into(),
                },
            ],
            constraints: vec![
                ConstraintObject {
                    name: "qty_positive".into(),
                    kind: ConstraintKind::Check,
                    definition: "CHECK ((qty > 0))".into(),
                    references: None,
                },
                ConstraintObject {
                    name: "items_order".into(),
                    kind: ConstraintKind::ForeignKey,
                    definition: "FOREIGN KEY (order_id)".into(),
                    references: Some(ForeignKeyTarget {
                        table: TableId::new("shop", "orders"),
                        columns: vec!["id".into()],
                        options: "ON DELETE CASCADE".into(),
                    }),
                },
            ],
            defaults: vec![
                ColumnDefault {
                    column: "qty".into(),
                    expression: "1".into(),
                    sequence: None,
                    identity_always: None,
                },
                ColumnDefault {
                    column: "n".into(),
                    expression: "nextval('shop.n_seq'::regclass)".into(),
                    sequence: Some(TableId::new("shop", "n_seq")),
                    identity_always: None,
                },
                ColumnDefault {
                    column: "id".into(),
                    expression: String::new(),
                    sequence: Some(TableId::new("shop", "items_id_seq")),
                    identity_always: Some(true),
                },
            ],
        };
        let named: HashMap<TableId, DestinationTable> = [
            (TableId::new("shop", "orders"), dest("orders")),
            (TableId::new("shop", "n_seq"), dest("n_seq")),
            (TableId::new("shop", "items_id_seq"), dest("items_id_seq")),
        ]
        .into();
        let planned = plan(&dest("items"), &objects, &named);
        // Every name is quoted; the comparison reads better without.
        let got: Vec<(&str, String, When)> = planned[..6]
            .iter()
            .map(|p| (p.kind, p.create.replace('"', ""), p.when))
            .collect();
        let got: Vec<(&str, &str, When)> = got.iter().map(|(k, c, w)| (*k, c.as_str(), *w)).collect();
        assert_eq!(
            got,
            vec![
                ("index", "CREATE INDEX IF NOT EXISTS items_name ON copy.items USING btree (name)", When::Now),
                (
                    "index",
                    "CREATE UNIQUE INDEX IF NOT EXISTS items_sku ON copy.items USING btree (lower(sku))",
                    When::AtCutover
                ),
                ("check", "ALTER TABLE copy.items ADD CONSTRAINT qty_positive CHECK ((qty > 0))", When::AtCutover),
                (
                    "foreign_key",
                    "ALTER TABLE copy.items ADD CONSTRAINT items_order FOREIGN KEY (order_id) REFERENCES copy.orders (id) \
                     ON DELETE CASCADE",
                    When::AtCutover
                ),
                ("default", "ALTER TABLE copy.items ALTER COLUMN qty SET DEFAULT 1", When::Now),
                ("default", "ALTER TABLE copy.items ALTER COLUMN n SET DEFAULT nextval('copy.n_seq'::regclass)", When::Now),
            ]
        );
        let identity = &planned[6];
        assert_eq!((identity.kind, identity.when), ("identity", When::AtCutover));
        assert!(identity.create.contains("ADD GENERATED ALWAYS AS IDENTITY"), "{}", identity.create);
        assert_eq!(planned[0].drop, r#"DROP INDEX IF EXISTS "copy"."items_name""#);
    }
}

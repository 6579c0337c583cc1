//! PostgreSQL's spelling of what the sink does: its types (parsed enough to
//! compare and widen), the destination type of each source column, the
//! [`Dialect`] the core plans schema changes over, and the statements the
//! sink sends (DDL, staging, the position-guarded merge, the offsets).

use std::fmt::Write as _;

use tributary_schemas::{Column, DataType, Value};

use super::config::DestinationTable;
use super::types::{render_pg_text, TextForm};
use crate::error::Error;
use crate::pgwire::{quote_ident, quote_literal};
use crate::sink::bookkeeping::{
    position_before, Fence, OffsetMove, PositionSyntax, Quoting, BOOKKEEPING_SCHEMA, COMMIT_COLUMN, DELETED_TABLE,
    DELETE_COLUMN, FENCED_CLASS, FORGOTTEN_POSITION, INDEX_COLUMN, KEY_COLUMN, OFFSETS_TABLE, RESETS_TABLE, ROW_COLUMN,
    TABLE_ROW_KEY,
};
use crate::sink::keyless::{self, pending_table};
use crate::sink::schema::{Dialect, Fit, ShapeColumn, TableChange};

/// The origin (`source.connector`) whose type spellings are PostgreSQL's.
const POSTGRES_ORIGIN: &str = "postgresql";

/// PostgreSQL as the core's [`Dialect`].
#[derive(Debug, Clone, Copy)]
pub struct PostgresDialect;

impl Dialect for PostgresDialect {
    type Type = PgType;

    fn column_type(&self, column: &Column, origin: &str) -> PgType {
        destination_type(column, origin == POSTGRES_ORIGIN)
    }

    fn position_type(&self) -> PgType {
        PgType::new("bigint")
    }

    fn fit(&self, have: &PgType, want: &PgType) -> Fit<PgType> {
        fit(have, want)
    }

    fn key_refuses_null(&self) -> bool {
        true
    }

    fn adds_position_columns(&self) -> bool {
        true
    }

    fn incompatible(&self, table: &str, column: &Column, have: &PgType, want: &PgType) -> Error {
        let quoted = quote_ident(&column.name);
        Error::permanent(format!(
            "cannot change column {} of destination table {table} from {} to {}: \
             PostgreSQL cannot widen one into the other",
            column.name,
            have.render(),
            want.render()
        ))
        .with_hint(format!(
            "change the column by hand (ALTER TABLE {table} ALTER COLUMN {quoted} TYPE {} USING ...), \
             then replay the dead-letter topic",
            want.render()
        ))
    }
}

/// The statement of one table change (see [`crate::sink::schema::plan`]).
pub fn change_sql(table: &DestinationTable, change: &TableChange<PgType>) -> String {
    let t = table.quoted();
    let column = |c: &ShapeColumn<PgType>| {
        format!("{} {}{}", quote_ident(&c.name), c.ty.render(), if c.not_null { " NOT NULL" } else { "" })
    };
    match change {
        TableChange::CreateTable { columns, key } => {
            let mut defs: Vec<String> = columns.iter().map(column).collect();
            let keys = key.iter().map(|k| quote_ident(k)).collect::<Vec<_>>().join(", ");
            defs.push(format!("PRIMARY KEY ({keys})"));
            format!("CREATE TABLE IF NOT EXISTS {t} ({})", defs.join(", "))
        }
        // The default fills the rows already there without rewriting the
        // table, and stays: a row of an event written before the column
        // existed, inserted later, gets it too (what a reader of the new
        // Avro schema reads for it).
        TableChange::AddColumn { column: c, backfill: Some(v) } => match literal(v, &c.ty) {
            Some(lit) => format!("ALTER TABLE {t} ADD COLUMN {} DEFAULT {lit}", column(c)),
            None => format!("ALTER TABLE {t} ADD COLUMN {}", column(c)),
        },
        TableChange::AddColumn { column: c, backfill: None } => format!("ALTER TABLE {t} ADD COLUMN {}", column(c)),
        TableChange::Widen { column, to, .. } => {
            format!("ALTER TABLE {t} ALTER COLUMN {} TYPE {}", quote_ident(column), to.render())
        }
        TableChange::DropNotNull { column } => {
            format!("ALTER TABLE {t} ALTER COLUMN {} DROP NOT NULL", quote_ident(column))
        }
        // -1 sorts before every real position.
        TableChange::AddBookkeeping(c) => format!("ALTER TABLE {t} ADD COLUMN {} DEFAULT -1", column(c)),
        TableChange::RenameColumn { from, to } => {
            format!("ALTER TABLE {t} RENAME COLUMN {} TO {}", quote_ident(from), quote_ident(to))
        }
        TableChange::DropColumn { column } => format!("ALTER TABLE {t} DROP COLUMN IF EXISTS {}", quote_ident(column)),
    }
}

/// A value as a typed SQL literal (`'7'::integer`), in the text the
/// column's type reads ([`TextForm`]), or `None` for one that has no text
/// form.
fn literal(value: &Value, ty: &PgType) -> Option<String> {
    let mut text = String::new();
    render_pg_text(&mut text, value, &TextForm::of_type(ty)).ok()?;
    Some(format!("{}::{}", quote_literal(&text), ty.render()))
}

/// `(t.commit, t.index)` and the like.
fn positions(alias: &str) -> (String, String) {
    (format!("{alias}{}", quote_ident(COMMIT_COLUMN)), format!("{alias}{}", quote_ident(INDEX_COLUMN)))
}

/// Removes the rows of `table` written before `(commit, index)`.
pub fn truncate_older_sql(table: &DestinationTable, commit: i64, index: i64) -> String {
    let (c, i) = positions("");
    let at = (commit.to_string(), index.to_string());
    format!(
        "DELETE FROM {} WHERE {}",
        table.quoted(),
        position_before(PositionSyntax::RowValue, (&c, &i), (&at.0, &at.1), false)
    )
}

/// Whether `table` has a row written at or after `(commit, index)`.
pub fn has_newer_sql(table: &DestinationTable, commit: i64, index: i64) -> String {
    let (c, i) = positions("");
    format!("SELECT EXISTS (SELECT 1 FROM {} WHERE ({c}, {i}) >= ({commit}, {index}))", table.quoted())
}

/// The session-local staging table of a column set (`(name, type)` with
/// the destination's type spelling), emptied at each commit.
pub fn staging_table_sql(stage: &str, columns: &[(&str, &str)]) -> String {
    let defs = columns
        .iter()
        .map(|(n, t)| format!("{} {t}", quote_ident(n)))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "CREATE TEMP TABLE IF NOT EXISTS {s} ({defs}{comma} {d} boolean, {k} text, {c} bigint, {i} bigint, {r} text) \
         ON COMMIT DELETE ROWS",
        s = quote_ident(stage),
        comma = if defs.is_empty() { "" } else { "," },
        d = quote_ident(DELETE_COLUMN),
        k = quote_ident(KEY_COLUMN),
        r = quote_ident(ROW_COLUMN),
        c = quote_ident(COMMIT_COLUMN),
        i = quote_ident(INDEX_COLUMN),
    )
}

/// `COPY` of quoted column `names` and the positions into `target` (a
/// table's quoted name); with the staging table's delete flag and key text
/// first; with the row's name last for a table without a key (`row`).
pub fn copy_sql(target: &str, names: &[String], delete_flag: bool, row: bool) -> String {
    format!(
        "COPY {target} ({}{}{}{}, {}{}) FROM STDIN",
        if delete_flag {
            format!("{}, {}, ", quote_ident(DELETE_COLUMN), quote_ident(KEY_COLUMN))
        } else {
            String::new()
        },
        names.join(", "),
        if names.is_empty() { "" } else { ", " },
        quote_ident(COMMIT_COLUMN),
        quote_ident(INDEX_COLUMN),
        if row {
            format!(", {}", quote_ident(ROW_COLUMN))
        } else {
            String::new()
        },
    )
}

/// The statements that apply a filled staging table to a table without a
/// key (see [`crate::sink::keyless::statements`]); `names` are the quoted
/// columns, `parts` whether the batch has inserts and deletes.
pub fn keyless_sql(table: &DestinationTable, stage: &str, names: &[String], parts: (bool, bool)) -> String {
    let names: Vec<(String, String)> = names.iter().map(|n| (n.clone(), format!("s.{n}"))).collect();
    let source = quote_ident(stage);
    keyless::statements_for(QUOTING, table, &table.quoted(), &deleted_table(), &source, &names, "now()", parts)
        .join("; ")
}

/// PostgreSQL's quoting, for the statements the core writes once.
pub const QUOTING: Quoting = Quoting { ident: quote_ident, string: quote_literal };

/// The merge of a filled staging table into `table`: deletes and upserts,
/// each only where the stored row is older (a delete also at the same
/// position). Deletes keep their position in the deleted-rows table; an
/// upsert not newer than its key's entry (or older than the table-wide
/// one) is left out, a newer one removes its key's entry. `names` are the quoted
/// columns, `keys` the quoted key.
pub fn merge_sql(
    table: &DestinationTable,
    stage: &str,
    names: &[String],
    keys: &[String],
    deletes: bool,
    upserts: bool,
) -> String {
    let (tc, ti) = positions("t.");
    let (sc, si) = positions("s.");
    let (dc, di) = positions("d.");
    let (c, i) = positions("");
    let d = quote_ident(DELETE_COLUMN);
    let k = quote_ident(KEY_COLUMN);
    let s = quote_ident(stage);
    let deleted = deleted_table();
    let name = quote_literal(&table.to_string());
    let mut merge = String::new();
    if deletes {
        let (ec, ei) = positions("EXCLUDED.");
        let _ = write!(
            merge,
            "INSERT INTO {deleted} AS d (dest_table, row_key, {c}, {i}) \
             SELECT {name}, s.{k}, s.{c}, s.{i} FROM {s} AS s WHERE s.{d} \
             ON CONFLICT (dest_table, row_key) DO UPDATE SET {c} = EXCLUDED.{c}, {i} = EXCLUDED.{i}, \
             deleted_at = now() WHERE {guard}; ",
            guard = position_before(PositionSyntax::RowValue, (&dc, &di), (&ec, &ei), false),
        );
    }
    if deletes {
        let on = keys.iter().map(|k| format!("t.{k} = s.{k}")).collect::<Vec<_>>().join(" AND ");
        let _ = write!(
            merge,
            "DELETE FROM {t} AS t USING {s} AS s WHERE s.{d} AND {on} AND {guard}; ",
            t = table.quoted(),
            guard = position_before(PositionSyntax::RowValue, (&tc, &ti), (&sc, &si), true),
        );
    }
    if upserts {
        let all: Vec<String> = names.iter().cloned().chain([c.clone(), i.clone()]).collect();
        let set = names
            .iter()
            .filter(|n| !keys.contains(n))
            .chain([&c, &i])
            .map(|n| format!("{n} = EXCLUDED.{n}"))
            .collect::<Vec<_>>()
            .join(", ");
        let (ec, ei) = positions("EXCLUDED.");
        // A table the application made (a migration's way back into the old
        // database) may have a `GENERATED ALWAYS` identity: the copy writes
        // the source's values into it.
        let _ = write!(
            merge,
            "INSERT INTO {t} AS t ({cols}) OVERRIDING SYSTEM VALUE SELECT DISTINCT ON ({keys}) {cols} FROM {s} AS s WHERE NOT {d} \
             AND NOT EXISTS (SELECT 1 FROM {deleted} AS d WHERE d.dest_table = {name} AND d.row_key = s.{k} \
             AND {removed}) \
             AND NOT EXISTS (SELECT 1 FROM {deleted} AS d WHERE d.dest_table = {name} AND d.row_key = {whole} \
             AND {removed_table}) \
             ORDER BY {keys}, {c} DESC, {i} DESC \
             ON CONFLICT ({keys}) DO UPDATE SET {set} WHERE {guard}; \
             DELETE FROM {deleted} AS d USING {s} AS s WHERE d.dest_table = {name} AND d.row_key = s.{k} \
             AND NOT s.{d} AND {older}",
            t = table.quoted(),
            cols = all.join(", "),
            keys = keys.join(", "),
            whole = quote_literal(TABLE_ROW_KEY),
            // Two anti-joins, not one with `OR`: with the key's equality
            // under an OR, PostgreSQL joined every staged row with every
            // entry of the table (a nested loop, 86 million comparisons for
            // a 10,000-row batch beside 8,500 entries: 10 s), and the
            // sink fell minutes behind a delete-heavy workload.
            removed = position_before(PositionSyntax::RowValue, (&sc, &si), (&dc, &di), true),
            // A row at the table-wide entry's own position is the copy's
            // (see `sink::memory`): only older ones stay out.
            removed_table = position_before(PositionSyntax::RowValue, (&sc, &si), (&dc, &di), false),
            older = position_before(PositionSyntax::RowValue, (&dc, &di), (&sc, &si), false),
            guard = position_before(PositionSyntax::RowValue, (&tc, &ti), (&ec, &ei), false),
        );
    }
    merge
}

/// The deleted-rows table's quoted name.
pub fn deleted_table() -> String {
    format!("{}.{}", quote_ident(BOOKKEEPING_SCHEMA), quote_ident(DELETED_TABLE))
}

/// The deleted-rows table, made with the offsets table.
pub fn deleted_table_ddl() -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {} (dest_table text NOT NULL, row_key text NOT NULL, \
         {c} bigint NOT NULL, {i} bigint NOT NULL, deleted_at timestamptz NOT NULL DEFAULT now(), \
         PRIMARY KEY (dest_table, row_key))",
        deleted_table(),
        c = quote_ident(COMMIT_COLUMN),
        i = quote_ident(INDEX_COLUMN),
    )
}

/// Keeps `(commit, index)` as `table`'s table-wide deleted-rows entry and
/// drops its older key entries (after a truncate or a copy at it).
pub fn removed_before_sql(table: &DestinationTable, commit: i64, index: i64) -> String {
    let (c, i) = positions("");
    let (dc, di) = positions("d.");
    let (ec, ei) = positions("EXCLUDED.");
    let name = quote_literal(&table.to_string());
    let at = (commit.to_string(), index.to_string());
    format!(
        "INSERT INTO {deleted} AS d (dest_table, row_key, {c}, {i}) VALUES ({name}, {whole}, {commit}, {index}) \
         ON CONFLICT (dest_table, row_key) DO UPDATE SET {c} = EXCLUDED.{c}, {i} = EXCLUDED.{i}, deleted_at = now() \
         WHERE {newer}; \
         DELETE FROM {deleted} AS d WHERE d.dest_table = {name} AND d.row_key <> {whole} AND {older}; \
         DELETE FROM {deleted} AS d WHERE d.dest_table = {pending} AND {older}",
        deleted = deleted_table(),
        pending = quote_literal(&pending_table(&table.to_string())),
        whole = quote_literal(TABLE_ROW_KEY),
        newer = position_before(PositionSyntax::RowValue, (&dc, &di), (&ec, &ei), false),
        older = position_before(PositionSyntax::RowValue, (&dc, &di), (&at.0, &at.1), false),
    )
}

/// Removes every deleted-rows entry of `table` (dropped, or its copy
/// deleted), its pending deletes too.
pub fn forget_deleted_sql(table: &DestinationTable) -> String {
    QUOTING.forget_deleted_sql(&deleted_table(), table)
}

/// Removes the deleted-rows entries older than `hours`.
pub fn prune_deleted_sql(hours: u64) -> String {
    format!("DELETE FROM {} WHERE deleted_at < now() - interval '{hours} hours'", deleted_table())
}

/// Whether `table` has deleted-rows entries (then nothing is loaded
/// straight in: an entry may be newer than a loaded row).
pub fn has_deleted_sql(table: &DestinationTable) -> String {
    format!(
        "SELECT EXISTS (SELECT 1 FROM {} WHERE dest_table = {})",
        deleted_table(),
        quote_literal(&table.to_string())
    )
}

/// The upsert of a batch's offsets into the offsets table. Fenced moves
/// (see [`crate::sink::bookkeeping::Fence`]) are made only from their
/// expected offset; when one is not, the statement fails with an error
/// whose text names [`FENCED_CLASS`] (the transaction is then rolled back:
/// nothing of the batch stays). One statement, sent with the `COMMIT`.
pub fn offsets_sql(group: &str, offsets: &[OffsetMove<'_>]) -> String {
    let table = offsets_table();
    let g = quote_literal(group);
    let values =
        |pick: &dyn Fn(&OffsetMove<'_>) -> Option<String>| -> Vec<String> { offsets.iter().filter_map(pick).collect() };
    let unchecked = values(&|m| {
        (m.fence == Fence::Unchecked).then(|| format!("({g}, {}, {}, {})", quote_literal(m.topic), m.partition, m.next))
    });
    let absent = values(&|m| {
        (m.fence == Fence::Absent).then(|| format!("({g}, {}, {}, {})", quote_literal(m.topic), m.partition, m.next))
    });
    let at = values(&|m| match m.fence {
        Fence::At(at) => {
            Some(format!("({}, {}, {}::bigint, {at}::bigint)", quote_literal(m.topic), m.partition, m.next))
        }
        _ => None,
    });
    if absent.is_empty() && at.is_empty() {
        return format!(
            "INSERT INTO {table} (consumer_group, topic, partition, next_offset) VALUES {} \
             ON CONFLICT (consumer_group, topic, partition) DO UPDATE SET next_offset = EXCLUDED.next_offset",
            unchecked.join(", ")
        );
    }
    let mut ctes = Vec::new();
    if !unchecked.is_empty() {
        ctes.push(format!(
            "u AS (INSERT INTO {table} (consumer_group, topic, partition, next_offset) VALUES {} \
             ON CONFLICT (consumer_group, topic, partition) DO UPDATE SET next_offset = EXCLUDED.next_offset RETURNING 1)",
            unchecked.join(", ")
        ));
    }
    if !absent.is_empty() {
        ctes.push(format!(
            "a AS (INSERT INTO {table} (consumer_group, topic, partition, next_offset) VALUES {} \
             ON CONFLICT (consumer_group, topic, partition) DO NOTHING RETURNING 1)",
            absent.join(", ")
        ));
    }
    if !at.is_empty() {
        ctes.push(format!(
            "m AS (UPDATE {table} AS o SET next_offset = v.next FROM (VALUES {}) AS v(topic, partition, next, expected) \
             WHERE o.consumer_group = {g} AND o.topic = v.topic AND o.partition = v.partition \
             AND o.next_offset = v.expected RETURNING 1)",
            at.join(", ")
        ));
    }
    let moved = [("a", !absent.is_empty()), ("m", !at.is_empty())]
        .iter()
        .filter(|(_, on)| *on)
        .map(|(name, _)| format!("(SELECT count(*) FROM {name})"))
        .collect::<Vec<_>>()
        .join(" + ");
    let want = absent.len() + at.len();
    // The cast fails only in the branch taken: its text is not a constant
    // (PostgreSQL folds constant expressions while planning).
    format!(
        "WITH {} SELECT CASE WHEN n = {want} THEN 0 ELSE ({} || ': ' || n || ' of {want} partitions at their expected offset')::int END \
         FROM (SELECT {moved} AS n) AS fence",
        ctes.join(", "),
        quote_literal(FENCED_CLASS),
    )
}

/// The resets table's quoted name.
pub fn resets_table() -> String {
    format!("{}.{}", quote_ident(BOOKKEEPING_SCHEMA), quote_ident(RESETS_TABLE))
}

/// Creates the resets table (under the lock the offsets table is created
/// under, so two sinks do not race).
pub fn create_resets_sql() -> String {
    format!(
        "SELECT pg_advisory_xact_lock(hashtext({})); CREATE TABLE IF NOT EXISTS {} \
         (destination text PRIMARY KEY, reset bigint NOT NULL); ",
        quote_literal("tributary bookkeeping"),
        resets_table()
    )
}

/// Makes `sequence` exist (with the source's definition, when it is new)
/// and moves it to at least `state`'s next value, never back: one
/// statement after the `CREATE`, comparing in the sequence's direction.
pub fn advance_sequence_sql(sequence: &DestinationTable, state: &tributary_schemas::SequenceState) -> String {
    // Only the three types a sequence may have.
    let data_type = match state.data_type.as_str() {
        "smallint" | "integer" | "bigint" => state.data_type.as_str(),
        _ => "bigint",
    };
    let cycle = if state.cycle { "CYCLE" } else { "NO CYCLE" };
    let name = sequence.quoted();
    let ahead = if state.increment >= 0 { "<" } else { ">" };
    format!(
        "CREATE SEQUENCE IF NOT EXISTS {name} AS {data_type} INCREMENT BY {inc} MINVALUE {min} MAXVALUE {max} {cycle}; \
         SELECT setval({literal}, {last}, {called}) FROM {name} \
         WHERE (CASE WHEN is_called THEN last_value::numeric + {inc} ELSE last_value::numeric END) {ahead} {source_next}",
        inc = state.increment,
        min = state.min,
        max = state.max,
        literal = quote_literal(&name),
        last = state.last_value,
        called = state.is_called,
        source_next = state.next_value(),
    )
}

/// Records reset `reset` of `table` and, when `table` exists and took no
/// reset as late yet, forgets every row's position (one statement, so the
/// check and the update see the same resets row).
pub fn forget_positions_sql(table: &DestinationTable, exists: bool, reset: i64) -> String {
    let record = format!(
        "INSERT INTO {r} AS r (destination, reset) VALUES ({d}, {reset}) ON CONFLICT (destination) \
         DO UPDATE SET reset = EXCLUDED.reset WHERE r.reset < EXCLUDED.reset RETURNING 1",
        r = resets_table(),
        d = quote_literal(&table.to_string()),
    );
    // Deleted rows' entries hold positions of the old domain: they would
    // keep the copy's rows out.
    let name = table.to_string();
    let gone = format!(
        "gone AS (DELETE FROM {} WHERE dest_table IN ({}, {}) AND EXISTS (SELECT 1 FROM taken) RETURNING 1)",
        deleted_table(),
        quote_literal(&name),
        quote_literal(&pending_table(&name))
    );
    if !exists {
        return format!("WITH taken AS ({record}), {gone} SELECT count(*) FROM gone");
    }
    let (commit, index) = FORGOTTEN_POSITION;
    format!(
        "WITH taken AS ({record}), {gone} UPDATE {t} SET {c} = {commit}, {i} = {index} WHERE EXISTS (SELECT 1 FROM taken)",
        t = table.quoted(),
        c = quote_ident(COMMIT_COLUMN),
        i = quote_ident(INDEX_COLUMN),
    )
}

/// The offsets table's quoted name.
pub fn offsets_table() -> String {
    format!("{}.{}", quote_ident(BOOKKEEPING_SCHEMA), quote_ident(OFFSETS_TABLE))
}

/// A PostgreSQL type, parsed enough to compare and widen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgType {
    /// Canonical base name (`format_type` spelling without modifiers).
    pub base: String,
    /// Type modifiers: `(40)`, `(12,2)`.
    pub mods: Vec<i64>,
    /// Array dimensions.
    pub dims: usize,
}

impl std::fmt::Display for PgType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.render())
    }
}

impl PgType {
    fn new(base: &str) -> Self {
        Self { base: base.to_string(), mods: Vec::new(), dims: 0 }
    }

    fn with_mods(mut self, mods: Vec<i64>) -> Self {
        self.mods = mods;
        self
    }

    /// Parses a type name as `format_type` or a user writes it.
    pub fn parse(text: &str) -> Self {
        let mut s = text.trim().to_ascii_lowercase();
        let mut dims = 0;
        loop {
            let t = s.trim_end();
            if t.ends_with(']') {
                if let Some(open) = t.rfind('[') {
                    s = t[..open].to_string();
                    dims += 1;
                    continue;
                }
            }
            break;
        }
        if let Some(rest) = s.strip_suffix(" array") {
            s = rest.to_string();
            dims += 1;
        }
        let mut mods = Vec::new();
        if let (Some(open), Some(close)) = (s.find('('), s.find(')')) {
            if open < close {
                mods = s[open + 1..close]
                    .split(',')
                    .filter_map(|m| m.trim().parse::<i64>().ok())
                    .collect();
                s = format!("{}{}", &s[..open], &s[close + 1..]);
            }
        }
        let base = s.split_whitespace().collect::<Vec<_>>().join(" ");
        let base = match base.as_str() {
            "int2" | "smallint" | "smallserial" | "serial2" => "smallint",
            "int" | "int4" | "integer" | "serial" | "serial4" => "integer",
            "int8" | "bigint" | "bigserial" | "serial8" => "bigint",
            "float4" | "real" => "real",
            "float8" | "double precision" | "float" => "double precision",
            "decimal" | "numeric" => "numeric",
            "varchar" | "character varying" => "character varying",
            "char" | "character" | "bpchar" => "character",
            "bool" | "boolean" => "boolean",
            "timestamp" | "timestamp without time zone" => "timestamp without time zone",
            "timestamptz" | "timestamp with time zone" => "timestamp with time zone",
            "time" | "time without time zone" => "time without time zone",
            "timetz" | "time with time zone" => "time with time zone",
            "varbit" | "bit varying" => "bit varying",
            other => other,
        }
        .to_string();
        Self { base, mods, dims }
    }

    /// The type as SQL.
    pub fn render(&self) -> String {
        let mods = if self.mods.is_empty() {
            String::new()
        } else {
            format!("({})", self.mods.iter().map(|m| m.to_string()).collect::<Vec<_>>().join(","))
        };
        let mut out = match self.base.split_once(' ') {
            // `timestamp(3) with time zone`: the modifier goes after the
            // first word.
            Some((first, rest)) if matches!(first, "timestamp" | "time") && !mods.is_empty() => {
                format!("{first}{mods} {rest}")
            }
            _ => format!("{}{mods}", self.base),
        };
        for _ in 0..self.dims {
            out.push_str("[]");
        }
        out
    }

    fn is_verbatim_safe(&self) -> bool {
        // Built-in types whose text input accepts what the sink renders for
        // the value model (`types::render_pg_text`); user types (enums,
        // domains, composites, PostGIS) may not exist in the destination
        // and fall back to the logical mapping, the `reg*` types name
        // objects of the source's database, so they stay text.
        self.base.starts_with("interval")
            || carried_as_text(&self.base)
            || matches!(
                self.base.as_str(),
                "smallint"
                    | "integer"
                    | "bigint"
                    | "real"
                    | "double precision"
                    | "numeric"
                    | "money"
                    | "character varying"
                    | "character"
                    | "text"
                    | "name"
                    | "boolean"
                    | "bytea"
                    | "date"
                    | "time without time zone"
                    | "time with time zone"
                    | "timestamp without time zone"
                    | "timestamp with time zone"
                    | "interval"
                    | "json"
                    | "jsonb"
                    | "uuid"
                    | "xml"
                    | "inet"
                    | "cidr"
                    | "macaddr"
                    | "macaddr8"
                    | "oid"
                    | "xid8"
                    | "bit"
            )
    }
}

/// PostgreSQL's built-in types whose values the change topic carries as
/// their text (`DataType::Text`) and whose input reads that text back
/// exactly: the destination column gets the type itself, and a `text`
/// column an older sink made for one keeps taking its values.
fn carried_as_text(base: &str) -> bool {
    matches!(
        base,
        "bit varying"
            | "tsvector"
            | "tsquery"
            | "point"
            | "line"
            | "lseg"
            | "box"
            | "path"
            | "polygon"
            | "circle"
            | "pg_lsn"
            | "xid"
            | "cid"
            | "tid"
            | "jsonpath"
            | "pg_snapshot"
            | "txid_snapshot"
            | "int2vector"
            | "oidvector"
            | "int4range"
            | "int8range"
            | "numrange"
            | "tsrange"
            | "tstzrange"
            | "daterange"
            | "int4multirange"
            | "int8multirange"
            | "nummultirange"
            | "tsmultirange"
            | "tstzmultirange"
            | "datemultirange"
            | "\"char\""
    )
}

/// PostgreSQL's longest bit string (`MaxAttrSize * BITS_PER_BYTE`).
pub(crate) const MAX_BIT_LENGTH: u32 = 83_886_080;

/// The destination type of a source column: the source's own spelling when
/// it came from PostgreSQL (a migration recreates the exact type), else the
/// logical mapping.
pub fn destination_type(column: &Column, from_pg: bool) -> PgType {
    if from_pg && !column.source_type.trim().is_empty() {
        let t = PgType::parse(&column.source_type);
        let logical = logical_type(&column.data_type);
        if t.is_verbatim_safe() && t.dims == logical.dims {
            return t;
        }
    }
    logical_type(&column.data_type)
}

/// The PostgreSQL type of a logical type.
pub fn logical_type(data_type: &DataType) -> PgType {
    match data_type {
        DataType::Boolean => PgType::new("boolean"),
        DataType::Int16 => PgType::new("smallint"),
        DataType::Int32 => PgType::new("integer"),
        DataType::Int64 => PgType::new("bigint"),
        DataType::Float32 => PgType::new("real"),
        DataType::Float64 => PgType::new("double precision"),
        DataType::Decimal { precision, scale } if *precision >= 1 && *precision <= 1000 && scale <= precision => {
            PgType::new("numeric").with_mods(vec![i64::from(*precision), i64::from(*scale)])
        }
        DataType::Decimal { .. } | DataType::VariableDecimal => PgType::new("numeric"),
        DataType::Text | DataType::Enum { .. } => PgType::new("text"),
        DataType::Json => PgType::new("jsonb"),
        DataType::Uuid => PgType::new("uuid"),
        DataType::Bytes | DataType::Geometry => PgType::new("bytea"),
        // bit(n) up to PostgreSQL's longest; Debezium's unbounded `bit
        // varying` (length 2147483647) as that.
        DataType::Bits { length } if *length <= MAX_BIT_LENGTH => {
            PgType::new("bit").with_mods(vec![i64::from(*length)])
        }
        DataType::Bits { .. } => PgType::new("bit varying"),
        DataType::Date => PgType::new("date"),
        DataType::Time => PgType::new("time without time zone"),
        // MySQL's TIME, -838:59:59 to 838:59:59: `time` holds one day.
        DataType::TimeSpan => PgType::new("interval"),
        DataType::Timestamp => PgType::new("timestamp without time zone"),
        DataType::TimestampTz => PgType::new("timestamp with time zone"),
        DataType::Interval => PgType::new("interval"),
        DataType::Array(inner) => {
            let mut t = logical_type(inner);
            t.dims += 1;
            t
        }
    }
}

/// Decides how a destination column of type `have` follows a source column
/// now of type `want`.
pub fn fit(have: &PgType, want: &PgType) -> Fit<PgType> {
    if have == want {
        return Fit::Keep;
    }
    if have.dims != want.dims {
        return Fit::Incompatible;
    }
    let int_digits = |b: &str| match b {
        "smallint" => Some(5i64),
        "integer" => Some(10),
        "bigint" => Some(19),
        _ => None,
    };
    let widen = |base: &str, mods: Vec<i64>| Fit::Widen(PgType { base: base.to_string(), mods, dims: have.dims });
    let (h, w) = (have.base.as_str(), want.base.as_str());
    match (h, w) {
        _ if int_digits(h).is_some() && int_digits(w).is_some() => {
            if int_digits(h) >= int_digits(w) {
                Fit::Keep
            } else {
                widen(w, vec![])
            }
        }
        ("numeric", _) if int_digits(w).is_some() => {
            let digits = int_digits(w).unwrap_or(19);
            match have.mods.as_slice() {
                [] => Fit::Keep,
                [p] if *p >= digits => Fit::Keep,
                [p, s] if p - s >= digits => Fit::Keep,
                [p] => widen("numeric", vec![digits.max(*p)]),
                [p, s] => widen("numeric", vec![digits.max(p - s) + s, *s]),
                _ => Fit::Incompatible,
            }
        }
        (_, "numeric") if int_digits(h).is_some() => {
            let digits = int_digits(h).unwrap_or(19);
            match want.mods.as_slice() {
                [] => widen("numeric", vec![]),
                [p] if *p >= digits => widen("numeric", vec![*p]),
                [p, s] if p - s >= digits => widen("numeric", vec![*p, *s]),
                _ => Fit::Incompatible,
            }
        }
        ("numeric", "numeric") => {
            let parts = |m: &[i64]| match m {
                [p] => Some((*p, 0)),
                [p, s] => Some((*p - *s, *s)),
                _ => None,
            };
            match (parts(&have.mods), parts(&want.mods)) {
                (None, _) => Fit::Keep,
                (_, None) => widen("numeric", vec![]),
                (Some((hi, hs)), Some((wi, ws))) => {
                    if hi >= wi && hs >= ws {
                        Fit::Keep
                    } else {
                        let (i, s) = (hi.max(wi), hs.max(ws));
                        if i + s > 1000 {
                            widen("numeric", vec![])
                        } else {
                            widen("numeric", vec![i + s, s])
                        }
                    }
                }
            }
        }
        ("double precision", "real") => Fit::Keep,
        ("real", "double precision") => widen(w, vec![]),
        ("text", "character varying" | "character" | "text" | "name") => Fit::Keep,
        // Columns an older sink made for types it did not recreate: a
        // `text` column takes their text, a `bytea` column bit strings
        // (packed, as that sink wrote them), a `boolean` column bit(1)
        // (see `types::TextForm`).
        ("text", w) if carried_as_text(w) || matches!(w, "inet" | "cidr" | "macaddr" | "macaddr8" | "xml") => Fit::Keep,
        ("text", "time with time zone") => Fit::Keep,
        ("bytea", "bit" | "bit varying") => Fit::Keep,
        ("boolean", "bit") if want.mods == [1] => Fit::Keep,
        // A domain over money, once made numeric(19,2).
        ("numeric", "money") => Fit::Keep,
        ("bit varying", "bit varying" | "bit") => match (have.mods.first(), want.mods.first()) {
            (None, _) => Fit::Keep,
            (Some(n), Some(m)) if m <= n => Fit::Keep,
            (Some(_), Some(m)) => widen("bit varying", vec![*m]),
            (Some(_), None) => widen("bit varying", vec![]),
        },
        ("character varying", "character varying" | "character" | "text") => {
            match (have.mods.first(), want.mods.first()) {
                (None, _) => Fit::Keep,
                (Some(n), Some(m)) if w != "text" && m <= n => Fit::Keep,
                (Some(_), Some(m)) if w == "character" => widen("character varying", vec![*m]),
                (Some(_), Some(m)) if w == "character varying" => widen(w, vec![*m]),
                _ => widen(w, want.mods.clone()),
            }
        }
        ("character", "character") => match (have.mods.first(), want.mods.first()) {
            (Some(n), Some(m)) if m > n => widen(w, vec![*m]),
            _ => Fit::Keep,
        },
        ("character", "character varying" | "text") => widen(w, want.mods.clone()),
        ("json", "jsonb") | ("jsonb", "json") => Fit::Keep,
        // A MySQL TIME column made `time` before spans had their own type:
        // PostgreSQL casts every time of day to the same interval.
        ("time without time zone", "interval") => widen(w, vec![]),
        (
            "timestamp without time zone"
            | "timestamp with time zone"
            | "time without time zone"
            | "time with time zone"
            | "interval",
            _,
        ) if h == w => match (have.mods.first(), want.mods.first()) {
            (None, _) => Fit::Keep,
            (Some(_), None) => widen(w, vec![]),
            (Some(a), Some(b)) if a >= b => Fit::Keep,
            (Some(_), Some(b)) => widen(w, vec![*b]),
        },
        _ if h == w && have.mods.len() == want.mods.len() && have.mods.iter().zip(&want.mods).all(|(a, b)| a >= b) => {
            Fit::Keep
        }
        _ => Fit::Incompatible,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_move_only_from_their_fence() {
        use crate::sink::bookkeeping::offset_moves;
        let next = vec![("t".to_string(), 0, 10), ("t".to_string(), 1, 5)];
        // Unfenced (replay, tests of one sink): one plain upsert.
        let plain = offsets_sql("g", &offset_moves(&next, &[]));
        assert!(plain.starts_with("INSERT INTO") && plain.contains("DO UPDATE SET next_offset"), "{plain}");
        assert!(!plain.contains(FENCED_CLASS));
        let fenced = offsets_sql("g", &offset_moves(&next, &[("t".into(), 0, Some(7)), ("t".into(), 1, None)]));
        assert!(fenced.contains("o.next_offset = v.expected"), "{fenced}");
        assert!(fenced.contains("('t', 0, 10::bigint, 7::bigint)"), "{fenced}");
        assert!(fenced.contains("ON CONFLICT (consumer_group, topic, partition) DO NOTHING"), "{fenced}");
        assert!(fenced.contains("WHEN n = 2 THEN 0"), "{fenced}");
        assert!(fenced.contains(FENCED_CLASS), "{fenced}");
    }

    #[test]
    fn parses_and_renders_types() {
        let t = PgType::parse("character varying(40)");
        assert_eq!(t.base, "character varying");
        assert_eq!(t.mods, vec![40]);
        assert_eq!(PgType::parse("varchar(40)"), t);
        assert_eq!(PgType::parse("timestamp(3) with time zone").render(), "timestamp(3) with time zone");
        assert_eq!(PgType::parse("int4[]").render(), "integer[]");
        assert_eq!(PgType::parse("numeric(12, 2)").render(), "numeric(12,2)");
    }

    #[test]
    fn widens_only_where_postgres_can() {
        let p = PgType::parse;
        assert_eq!(fit(&p("integer"), &p("bigint")), Fit::Widen(p("bigint")));
        assert_eq!(fit(&p("bigint"), &p("integer")), Fit::Keep);
        assert_eq!(fit(&p("varchar(10)"), &p("varchar(20)")), Fit::Widen(p("varchar(20)")));
        assert_eq!(fit(&p("varchar(20)"), &p("varchar(10)")), Fit::Keep);
        assert_eq!(fit(&p("varchar(20)"), &p("text")), Fit::Widen(p("text")));
        assert_eq!(fit(&p("numeric(10,2)"), &p("numeric(12,2)")), Fit::Widen(p("numeric(12,2)")));
        assert_eq!(fit(&p("numeric(10,2)"), &p("numeric(10,3)")), Fit::Widen(p("numeric(11,3)")));
        assert_eq!(fit(&p("numeric"), &p("numeric(10,3)")), Fit::Keep);
        assert_eq!(fit(&p("integer"), &p("numeric(12,2)")), Fit::Widen(p("numeric(12,2)")));
        assert_eq!(fit(&p("integer"), &p("text")), Fit::Incompatible);
        assert_eq!(fit(&p("text"), &p("integer")), Fit::Incompatible);
        assert_eq!(fit(&p("integer[]"), &p("integer")), Fit::Incompatible);
        assert_eq!(fit(&p("real"), &p("double precision")), Fit::Widen(p("double precision")));
        assert_eq!(fit(&p("time"), &p("interval")), Fit::Widen(p("interval")));
        assert_eq!(fit(&p("interval"), &p("time")), Fit::Incompatible);
        assert_eq!(logical_type(&DataType::TimeSpan), p("interval"));
        assert_eq!(logical_type(&DataType::Time), p("time"));
        assert_eq!(fit(&p("timestamp(3)"), &p("timestamp")), Fit::Widen(p("timestamp")));
    }

    #[test]
    fn verbatim_types_only_for_builtin_postgres_types() {
        let col = |ty: &str, dt: DataType| Column {
            name: "c".into(),
            data_type: dt,
            nullable: true,
            source_type: ty.into(),
            default: None,
            aliases: Vec::new(),
            column_id: None,
        };
        assert_eq!(destination_type(&col("varchar(40)", DataType::Text), true).render(), "character varying(40)");
        assert_eq!(destination_type(&col("varchar(40)", DataType::Text), false).render(), "text");
        assert_eq!(destination_type(&col("mood", DataType::Enum { symbols: vec![] }), true).render(), "text");
        assert_eq!(
            destination_type(&col("integer[]", DataType::Array(Box::new(DataType::Int32))), true).render(),
            "integer[]"
        );
        // Every built-in type recreates itself; a bit string too.
        let text = |ty: &str| destination_type(&col(ty, DataType::Text), true).render();
        for ty in [
            "bit varying(20)",
            "tsvector",
            "tsquery",
            "point",
            "line",
            "lseg",
            "box",
            "path",
            "polygon",
            "circle",
            "pg_lsn",
            "jsonpath",
            "pg_snapshot",
            "int4range",
            "tstzmultirange",
            "\"char\"",
            "inet",
            "time with time zone",
        ] {
            assert_eq!(text(ty), ty);
        }
        assert_eq!(destination_type(&col("bit(1)", DataType::Boolean), true).render(), "bit(1)");
        assert_eq!(destination_type(&col("bit(12)", DataType::Bits { length: 12 }), true).render(), "bit(12)");
        assert_eq!(
            destination_type(&col("interval year to month", DataType::Interval), true).render(),
            "interval year to month"
        );
        assert_eq!(destination_type(&col("box[]", DataType::Array(Box::new(DataType::Text))), true).render(), "box[]");
        // Types naming the source database's objects, or the user's: text.
        assert_eq!(text("regtype"), "text");
        assert_eq!(text("s.pair"), "text");
        // Without the source's spelling (another source, an older topic).
        assert_eq!(logical_type(&DataType::Bits { length: 12 }).render(), "bit(12)");
        assert_eq!(logical_type(&DataType::Bits { length: 2_147_483_647 }).render(), "bit varying");
    }

    #[test]
    fn columns_an_older_sink_made_keep_taking_their_values() {
        let p = PgType::parse;
        for want in [
            "point",
            "tsvector",
            "inet",
            "bit varying(4)",
            "int4range",
            "xml",
            "time with time zone",
        ] {
            assert_eq!(fit(&p("text"), &p(want)), Fit::Keep, "{want}");
        }
        assert_eq!(fit(&p("bytea"), &p("bit(8)")), Fit::Keep);
        assert_eq!(fit(&p("bytea"), &p("bit varying")), Fit::Keep);
        assert_eq!(fit(&p("boolean"), &p("bit(1)")), Fit::Keep);
        assert_eq!(fit(&p("boolean"), &p("bit(2)")), Fit::Incompatible);
        assert_eq!(fit(&p("numeric(19,2)"), &p("money")), Fit::Keep);
        assert_eq!(fit(&p("bit varying(4)"), &p("bit varying(8)")), Fit::Widen(p("bit varying(8)")));
        assert_eq!(fit(&p("bit varying(8)"), &p("bit(4)")), Fit::Keep);
        assert_eq!(fit(&p("bit(8)"), &p("bit(16)")), Fit::Incompatible);
        assert_eq!(fit(&p("point"), &p("text")), Fit::Incompatible);
    }
}

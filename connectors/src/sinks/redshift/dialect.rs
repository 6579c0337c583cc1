//! Redshift's spelling of what the sink does: the destination type of each
//! source column, the [`Dialect`] the core plans schema changes over (what
//! Redshift can change in place: lengthen a VARCHAR, add, rename and drop
//! columns; nothing else), and every statement the sink sends.
//!
//! Only SQL that Redshift accepts is generated here, and the dialect check
//! (`tests/tests/redshift_sink.rs`) holds every statement to it: no
//! `ON CONFLICT`, no row-value comparison, no `WITH` on DML, no
//! `TRUNCATE` (it commits), no savepoints, no `RETURNING`, no
//! PostgreSQL-only functions (`now()` is leader-node-only in Redshift:
//! times are sent as literals). The same statements run against
//! PostgreSQL 15 in the tests.

use tributary_schemas::{Column, DataType, TableSchema, Value};

use super::config::DestinationTable;
use super::types::ReadBack;
use crate::error::Error;
use crate::pgwire::quote_ident;
use crate::sink::bookkeeping::{
    position_before, OffsetMove, PositionSyntax, Quoting, BOOKKEEPING_SCHEMA, COMMIT_COLUMN, DELETED_TABLE,
    DELETE_COLUMN, FORGOTTEN_POSITION, INDEX_COLUMN, KEY_COLUMN, OFFSETS_TABLE, RESETS_TABLE, ROW_COLUMN,
    TABLE_ROW_KEY,
};
use crate::sink::keyless::{self, pending_table};
use crate::sink::schema::{Dialect, Fit, ShapeColumn, TableChange};
use crate::sink::text::{parse_text, render_text};
use crate::sink::verify::KeyRange;
pub use crate::sinks::postgres::PgType;

/// Redshift has no row-value comparison: positions compare column by column.
const GUARD: PositionSyntax = PositionSyntax::Expanded;
/// The longest VARCHAR (bytes).
pub const MAX_VARCHAR: i64 = 65_535;
/// Bytes per character of a source VARCHAR(n): Redshift counts bytes, and a
/// UTF-8 character takes up to four.
const BYTES_PER_CHAR: i64 = 4;
/// Precision of Redshift's widest DECIMAL.
pub const MAX_NUMERIC_PRECISION: u32 = 38;
/// Scale of a decimal without a declared one (PostgreSQL's bare `numeric`,
/// an unbounded decimal): Redshift has no unbounded NUMERIC, and 38 digits
/// with 10 after the point hold money and most measurements; a value with
/// more digits is refused (dead-lettered) rather than silently rounded.
pub const DEFAULT_NUMERIC_SCALE: i64 = 10;
/// Length of an interval's text (`-178000000 mons -2147483648 days ...`).
const INTERVAL_CHARS: i64 = 80;
/// A MySQL TIME's text, `-838:59:59.000000` (17 characters; room for the
/// hours of any 64-bit span).
const TIME_SPAN_CHARS: i64 = 32;

/// Redshift as the core's [`Dialect`].
#[derive(Debug, Clone, Copy)]
pub struct RedshiftDialect;

fn ty(base: &str, mods: Vec<i64>) -> PgType {
    PgType { base: base.to_string(), mods, dims: 0 }
}

/// `character varying(n)`, `n` capped at Redshift's longest.
pub fn varchar(bytes: i64) -> PgType {
    ty("character varying", vec![bytes.clamp(1, MAX_VARCHAR)])
}

/// The Redshift type of a source column.
pub fn destination_type(column: &Column) -> PgType {
    logical_type(&column.data_type, &column.source_type)
}

fn logical_type(data_type: &DataType, source_type: &str) -> PgType {
    match data_type {
        DataType::Boolean => ty("boolean", vec![]),
        // Every integer is a BIGINT and every float a DOUBLE PRECISION:
        // Redshift cannot widen a column in place, and the source's most
        // common widenings (int to bigint, real to double) then need no
        // change. Its AZ64 encoding stores small values in few bytes anyway.
        DataType::Int16 | DataType::Int32 | DataType::Int64 => ty("bigint", vec![]),
        DataType::Float32 | DataType::Float64 => ty("double precision", vec![]),
        // Every decimal gets the widest precision, its scale kept: a source
        // that widens `numeric(8,2)` to `numeric(12,2)` then needs no change
        // (Redshift changes no type in place); the values are the same.
        DataType::Decimal { scale, .. } => {
            let scale = i64::from(*scale).min(i64::from(MAX_NUMERIC_PRECISION) - 1);
            ty("numeric", vec![i64::from(MAX_NUMERIC_PRECISION), scale])
        }
        DataType::VariableDecimal => ty("numeric", vec![i64::from(MAX_NUMERIC_PRECISION), DEFAULT_NUMERIC_SCALE]),
        // A bounded source string keeps its bound (in bytes), so that a
        // source that lengthens it lengthens the destination's: the one
        // type change Redshift makes in place.
        DataType::Text | DataType::Enum { .. } => {
            let source = PgType::parse(source_type);
            match (source.base.as_str(), source.mods.as_slice(), source.dims) {
                ("character varying" | "character", [n], 0) => varchar(n.saturating_mul(BYTES_PER_CHAR)),
                _ => varchar(MAX_VARCHAR),
            }
        }
        DataType::Uuid => varchar(36),
        DataType::Json | DataType::Array(_) => ty("super", vec![]),
        DataType::Bytes | DataType::Bits { .. } | DataType::Geometry => ty("varbyte", vec![]),
        DataType::Date => ty("date", vec![]),
        DataType::Time => ty("time without time zone", vec![]),
        // MySQL's TIME, -838:59:59 to 838:59:59: Redshift's TIME holds one
        // day, so the exact text (as intervals).
        DataType::TimeSpan => varchar(TIME_SPAN_CHARS),
        DataType::Timestamp => ty("timestamp without time zone", vec![]),
        DataType::TimestampTz => ty("timestamp with time zone", vec![]),
        DataType::Interval => varchar(INTERVAL_CHARS),
    }
}

impl Dialect for RedshiftDialect {
    type Type = PgType;

    fn column_type(&self, column: &Column, _origin: &str) -> PgType {
        destination_type(column)
    }

    fn position_type(&self) -> PgType {
        ty("bigint", vec![])
    }

    fn fit(&self, have: &PgType, want: &PgType) -> Fit<PgType> {
        fit(have, want)
    }

    /// Redshift cannot drop a NOT NULL in place: no column but the key and
    /// the positions is ever made NOT NULL, so none has to be dropped.
    fn can_refuse_null(&self, _ty: &PgType) -> bool {
        false
    }

    fn key_refuses_null(&self) -> bool {
        true
    }

    fn adds_position_columns(&self) -> bool {
        true
    }

    fn incompatible(&self, table: &str, column: &Column, have: &PgType, want: &PgType) -> Error {
        let c = quote_ident(&column.name);
        let tmp = quote_ident(&format!("{}__new", column.name));
        Error::permanent(format!(
            "cannot change column {} of destination table {table} from {} to {}: \
             Redshift changes no column type in place but a VARCHAR's length",
            column.name,
            have.render(),
            want.render()
        ))
        .with_hint(format!(
            "ALTER TABLE {table} ADD COLUMN {tmp} {w}; UPDATE {table} SET {tmp} = CAST({c} AS {w}); \
             ALTER TABLE {table} DROP COLUMN {c}; ALTER TABLE {table} RENAME COLUMN {tmp} TO {c}; \
             then replay the dead-letter topic",
            w = want.render()
        ))
    }
}

/// How a column of type `have` takes the values of type `want`: only a
/// VARCHAR grows; everything else fits as it is or not at all.
pub fn fit(have: &PgType, want: &PgType) -> Fit<PgType> {
    if have == want {
        return Fit::Keep;
    }
    let int_bits = |b: &str| match b {
        "smallint" => Some(16),
        "integer" => Some(32),
        "bigint" => Some(64),
        _ => None,
    };
    let (h, w) = (have.base.as_str(), want.base.as_str());
    match (h, w) {
        _ if int_bits(h).is_some() && int_bits(w).is_some() => {
            if int_bits(h) >= int_bits(w) {
                Fit::Keep
            } else {
                Fit::Incompatible
            }
        }
        ("character varying", "character varying" | "character") => match (have.mods.first(), want.mods.first()) {
            (None, _) => Fit::Keep,
            (Some(n), Some(m)) if m <= n => Fit::Keep,
            (Some(_), Some(m)) => Fit::Widen(varchar(*m)),
            (Some(_), None) => Fit::Widen(varchar(MAX_VARCHAR)),
        },
        ("numeric", "numeric") => match (have.mods.as_slice(), want.mods.as_slice()) {
            ([hp, hs], [wp, ws]) if hp - hs >= wp - ws && hs >= ws => Fit::Keep,
            _ => Fit::Incompatible,
        },
        ("numeric", _) if int_bits(w).is_some() => match have.mods.as_slice() {
            [p, s] if p - s >= if w == "bigint" { 19 } else { 10 } => Fit::Keep,
            _ => Fit::Incompatible,
        },
        ("double precision", "real") => Fit::Keep,
        // A MySQL TIME column made TIME before spans had their own type
        // (Redshift changes no type in place): it keeps its type, and a
        // value outside a day is refused by the load, never wrapped.
        ("time without time zone", "character varying") => Fit::Keep,
        // The catalog may spell a type with a length the source mapping
        // leaves out (`varbyte(64000)`); the kind is what matters.
        ("super", "super") | ("varbyte", "varbyte") => Fit::Keep,
        ("timestamp without time zone" | "timestamp with time zone" | "time without time zone" | "date", _)
            if h == w =>
        {
            Fit::Keep
        }
        _ => Fit::Incompatible,
    }
}

/// A string literal as Redshift reads it: a backslash escapes, so it is
/// doubled (the PostgreSQL test mode sets `standard_conforming_strings =
/// off` to read literals the same way).
pub fn literal(value: &str) -> String {
    format!("'{}'", value.replace('\\', "\\\\").replace('\'', "''"))
}

/// The statement of one table change; `Err` for a change Redshift cannot
/// make (a NOT NULL to drop, on a table made by hand).
pub fn change_sql(table: &DestinationTable, change: &TableChange<PgType>) -> Result<String, Error> {
    let t = table.quoted();
    let column = |c: &ShapeColumn<PgType>, not_null: bool| {
        format!("{} {}{}", quote_ident(&c.name), c.ty.render(), if not_null { " NOT NULL" } else { "" })
    };
    Ok(match change {
        TableChange::CreateTable { columns, key } => {
            // Key and position columns refuse NULL; Redshift does not
            // enforce the primary key (the apply's DELETE-then-INSERT keeps
            // keys unique) but its planner uses it.
            let mut defs: Vec<String> =
                columns.iter().map(|c| column(c, c.not_null || key.contains(&c.name))).collect();
            let keys = key.iter().map(|k| quote_ident(k)).collect::<Vec<_>>().join(", ");
            defs.push(format!("PRIMARY KEY ({keys})"));
            format!("CREATE TABLE IF NOT EXISTS {t} ({})", defs.join(", "))
        }
        TableChange::AddColumn { column: c, backfill } => {
            let default = backfill.as_ref().and_then(|v| default_literal(v, &c.ty));
            match default {
                Some(lit) => format!("ALTER TABLE {t} ADD COLUMN {} DEFAULT {lit}", column(c, false)),
                None => format!("ALTER TABLE {t} ADD COLUMN {}", column(c, false)),
            }
        }
        TableChange::Widen { column, to, .. } if to.base == "character varying" => {
            format!("ALTER TABLE {t} ALTER COLUMN {} TYPE {}", quote_ident(column), to.render())
        }
        TableChange::Widen { column, from, to } => {
            // `fit` never asks for it; a guard against a core change.
            return Err(Error::permanent(format!(
                "Redshift cannot change column {column} of {table} from {from} to {to} in place"
            )));
        }
        TableChange::DropNotNull { column } => {
            let c = quote_ident(column);
            return Err(Error::permanent(format!(
                "column {column} of destination table {table} is NOT NULL and the source now sends NULL for it \
                 (or no longer sends it): Redshift cannot drop a NOT NULL in place"
            ))
            .with_column(column.clone())
            .with_class("tributary.incompatible_type")
            .with_hint(format!(
                "recreate the column nullable (ALTER TABLE {t} ADD COLUMN c_tmp <type>; UPDATE {t} SET c_tmp = {c}; \
                 ALTER TABLE {t} DROP COLUMN {c}; ALTER TABLE {t} RENAME COLUMN c_tmp TO {c}), then replay the \
                 dead-letter topic"
            )));
        }
        // -1 sorts before every real position.
        TableChange::AddBookkeeping(c) => {
            format!("ALTER TABLE {t} ADD COLUMN {} {} DEFAULT -1 NOT NULL", quote_ident(&c.name), c.ty.render())
        }
        TableChange::RenameColumn { from, to } => {
            format!("ALTER TABLE {t} RENAME COLUMN {} TO {}", quote_ident(from), quote_ident(to))
        }
        TableChange::DropColumn { column } => format!("ALTER TABLE {t} DROP COLUMN {}", quote_ident(column)),
    })
}

/// A backfill value as a column default: a typed literal for the scalar
/// types, none for `super` and `varbyte` (their text is not their value).
fn default_literal(value: &Value, ty: &PgType) -> Option<String> {
    if matches!(ty.base.as_str(), "super" | "varbyte") {
        return None;
    }
    let mut text = String::new();
    crate::sink::text::render_text(&mut text, value).ok()?;
    Some(format!("CAST({} AS {})", literal(&text), ty.render()))
}

/// `"t"."__tributary_commit"` and the like (`alias` with its dot, or the
/// quoted table name and a dot).
fn positions(alias: &str) -> (String, String) {
    (format!("{alias}{}", quote_ident(COMMIT_COLUMN)), format!("{alias}{}", quote_ident(INDEX_COLUMN)))
}

/// A bookkeeping table's quoted name.
fn bookkeeping(table: &str) -> String {
    format!("{}.{}", quote_ident(BOOKKEEPING_SCHEMA), quote_ident(table))
}

/// The offsets table's quoted name.
pub fn offsets_table() -> String {
    bookkeeping(OFFSETS_TABLE)
}

/// The deleted-rows table's quoted name.
pub fn deleted_table() -> String {
    bookkeeping(DELETED_TABLE)
}

/// The resets table's quoted name.
pub fn resets_table() -> String {
    bookkeeping(RESETS_TABLE)
}

/// The bookkeeping schema and tables, one statement each (run outside the
/// batch transactions). Redshift does not enforce the primary keys; every
/// write here deletes before it inserts, under the table's lock.
pub fn bookkeeping_ddl() -> Vec<String> {
    let (c, i) = positions("");
    vec![
        format!("CREATE SCHEMA IF NOT EXISTS {}", quote_ident(BOOKKEEPING_SCHEMA)),
        format!(
            "CREATE TABLE IF NOT EXISTS {} (consumer_group VARCHAR(1024) NOT NULL, topic VARCHAR(1024) NOT NULL, \
             \"partition\" INTEGER NOT NULL, next_offset BIGINT NOT NULL, PRIMARY KEY (consumer_group, topic, \"partition\"))",
            offsets_table()
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {} (dest_table VARCHAR(1024) NOT NULL, row_key VARCHAR(65535) NOT NULL, \
             {c} BIGINT NOT NULL, {i} BIGINT NOT NULL, deleted_at TIMESTAMP NOT NULL, PRIMARY KEY (dest_table, row_key))",
            deleted_table()
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {} (destination VARCHAR(1024) NOT NULL, reset BIGINT NOT NULL, \
             PRIMARY KEY (destination))",
            resets_table()
        ),
    ]
}

/// Opens a batch's transaction (Redshift runs every transaction
/// serializable; the locks of [`lock_sql`] serialize what must be).
pub const BEGIN: &str = "BEGIN";

/// Locks a table until the transaction ends (Redshift's `LOCK` has no
/// modes: it is exclusive; so is PostgreSQL's default).
pub fn lock_sql(quoted: &str) -> String {
    format!("LOCK {quoted}")
}

/// The session-local staging table of a column set (`(name, type)` with the
/// destination's type spelling). Redshift has no `ON COMMIT DELETE ROWS`
/// and its `TRUNCATE` commits: it is emptied with `DELETE` before each load.
pub fn staging_table_sql(stage: &str, columns: &[(&str, &str)]) -> String {
    let defs: Vec<String> = columns.iter().map(|(n, t)| format!("{} {t}", quote_ident(n))).collect();
    format!(
        "CREATE TEMP TABLE {s} ({defs}{comma}{d} BOOLEAN, {k} VARCHAR(65535), {c} BIGINT, {i} BIGINT, {r} VARCHAR(65535))",
        s = quote_ident(stage),
        defs = defs.join(", "),
        comma = if defs.is_empty() { "" } else { ", " },
        d = quote_ident(DELETE_COLUMN),
        k = quote_ident(KEY_COLUMN),
        c = quote_ident(COMMIT_COLUMN),
        i = quote_ident(INDEX_COLUMN),
        r = quote_ident(ROW_COLUMN),
    )
}

/// The staging table's columns in the staged files' order: the delete flag
/// and key text first, then the columns, then the position and the row's
/// name (a table without a key).
pub fn staged_columns(names: &[String]) -> String {
    let mut all = vec![quote_ident(DELETE_COLUMN), quote_ident(KEY_COLUMN)];
    all.extend(names.iter().cloned());
    all.push(quote_ident(COMMIT_COLUMN));
    all.push(quote_ident(INDEX_COLUMN));
    all.push(quote_ident(ROW_COLUMN));
    all.join(", ")
}

/// Redshift's quoting, for the statements the core writes once.
pub const QUOTING: Quoting = Quoting { ident: quote_ident, string: literal };

/// The statements that apply a loaded staging table to a table without a
/// key (see [`crate::sink::keyless::statements`]); `names` are the quoted
/// columns, `parts` whether the batch has inserts and deletes, `now` the
/// unit's timestamp literal.
pub fn keyless_sql(
    table: &DestinationTable,
    stage: &str,
    names: &[String],
    parts: (bool, bool),
    now: &str,
) -> Vec<String> {
    let names: Vec<(String, String)> = names.iter().map(|n| (n.clone(), format!("s.{n}"))).collect();
    let source = quote_ident(stage);
    keyless::statements_for(QUOTING, table, &table.quoted(), &deleted_table(), &source, &names, now, parts)
}

/// The null marker of the staged CSV files (unquoted; a quoted `"\N"` is
/// the text).
pub const CSV_NULL: &str = "\\N";

/// Redshift's load of a manifest's files into the staging table.
pub fn copy_s3_sql(stage: &str, names: &[String], manifest_url: &str, iam_role: &str) -> String {
    format!(
        "COPY {} ({}) FROM {} IAM_ROLE {} MANIFEST CSV NULL AS {} TIMEFORMAT 'auto' DATEFORMAT 'auto' \
         ACCEPTINVCHARS COMPUPDATE OFF STATUPDATE OFF",
        quote_ident(stage),
        staged_columns(names),
        literal(manifest_url),
        literal(iam_role),
        literal(CSV_NULL),
    )
}

/// TEST MODE ONLY: PostgreSQL's load of the same files (sent one by one
/// from S3 by the sink); never sent to Redshift.
pub fn copy_stdin_test_sql(stage: &str, names: &[String]) -> String {
    format!(
        "COPY {} ({}) FROM STDIN WITH (FORMAT csv, NULL {})",
        quote_ident(stage),
        staged_columns(names),
        literal(CSV_NULL)
    )
}

/// Which `COPY` a load-error lookup is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyQuery {
    /// The query id Redshift's error named (its `DETAIL` carries
    /// `query: <id>`).
    Id(i64),
    /// `pg_last_copy_id()`: the session's last `COPY` that began loading
    /// (a `COPY` refused by invalid data counts; one that failed before
    /// loading, e.g. on S3 access, does not, so the id may be an older
    /// load's: the file filter below then finds nothing).
    LastInSession,
}

/// The first `stl_load_errors` row of a `COPY` whose files lie under
/// `staged_dir` (`s3://bucket/.../<uuid>/`): Redshift's reason, the column,
/// its type, the length of the refused value (never the value: row values
/// stay out of errors), the line, the error code, the query id. Columns of
/// type `CHAR(n)` are trimmed. The file filter pins the row to this batch's
/// staging directory even when the id is the session's older `COPY`.
pub fn load_error_sql(copy: CopyQuery, staged_dir: &str) -> String {
    let query = match copy {
        CopyQuery::Id(id) => id.to_string(),
        CopyQuery::LastInSession => "pg_last_copy_id()".to_string(),
    };
    // LIKE's wildcards in the directory (`_` in a consumer group) also
    // match themselves: at worst a sibling directory of the same prefix
    // would match, and the query id already narrows it to one COPY.
    format!(
        "SELECT trim(err_reason)::varchar, trim(colname)::varchar, trim(\"type\")::varchar, \
         octet_length(trim(raw_field_value))::bigint, line_number::bigint, err_code::integer, query::bigint \
         FROM stl_load_errors WHERE query = {query} AND trim(filename) LIKE {} ORDER BY line_number LIMIT 1",
        literal(&format!("{staged_dir}%"))
    )
}

/// Empties the staging table.
pub fn clear_stage_sql(stage: &str) -> String {
    format!("DELETE FROM {}", quote_ident(stage))
}

/// The apply of a loaded staging table to `table`, one statement each, in
/// order: what Redshift's `MERGE` (one unconditional `WHEN MATCHED`) cannot
/// express with the position guard, as DELETE and INSERT.
///
/// Deletes first keep their position in the deleted-rows table (the newer
/// of the two), then remove the rows not newer than themselves. Upserts
/// are then pruned from the staging table where their key's deleted-row
/// entry (or the table-wide one) or the stored row is not older, remove
/// their key's older entry, and replace the stored rows. `keys` and `names`
/// are quoted; `now` is the batch's time as a literal (Redshift's `now()`
/// runs on the leader node only).
pub fn apply_sql(
    table: &DestinationTable,
    stage: &str,
    names: &[String],
    keys: &[String],
    deletes: bool,
    upserts: bool,
    now: &str,
) -> Vec<String> {
    let t = table.quoted();
    let s = quote_ident(stage);
    let deleted = deleted_table();
    let name = literal(&table.to_string());
    let d = quote_ident(DELETE_COLUMN);
    let k = quote_ident(KEY_COLUMN);
    let (c, i) = positions("");
    let (sc, si) = positions("s.");
    let (tc, ti) = positions("t.");
    let (xc, xi) = positions("x.");
    let (dc, di) = positions(&format!("{deleted}."));
    let (stc, sti) = positions(&format!("{s}."));
    let on = |l: &str, r: &str| {
        keys.iter()
            .map(|k| format!("{l}.{k} = {r}.{k}"))
            .collect::<Vec<_>>()
            .join(" AND ")
    };
    let mut out = Vec::new();
    if deletes {
        out.push(format!(
            "DELETE FROM {deleted} USING {s} AS s WHERE {deleted}.dest_table = {name} AND {deleted}.row_key = s.{k} \
             AND s.{d} AND {older}",
            older = position_before(GUARD, (&dc, &di), (&sc, &si), false),
        ));
        out.push(format!(
            "INSERT INTO {deleted} (dest_table, row_key, {c}, {i}, deleted_at) \
             SELECT {name}, s.{k}, s.{c}, s.{i}, {now} FROM {s} AS s WHERE s.{d} \
             AND NOT EXISTS (SELECT 1 FROM {deleted} AS x WHERE x.dest_table = {name} AND x.row_key = s.{k})"
        ));
        out.push(format!(
            "DELETE FROM {t} USING {s} AS s WHERE s.{d} AND {on} AND {guard}",
            on = on(&t, "s"),
            guard = position_before(
                GUARD,
                (&format!("{t}.{}", quote_ident(COMMIT_COLUMN)), &format!("{t}.{}", quote_ident(INDEX_COLUMN))),
                (&sc, &si),
                true
            ),
        ));
    }
    if upserts {
        // The position guard, on the staging rows first. Two statements,
        // each joining on an equality, not one with `OR` (which leaves
        // nothing to hash-join on but every pair: see the PostgreSQL sink's
        // `merge_sql`).
        out.push(format!(
            "DELETE FROM {s} USING {deleted} AS x WHERE NOT {s}.{d} AND x.dest_table = {name} \
             AND x.row_key = {s}.{k} AND {removed}",
            removed = position_before(GUARD, (&stc, &sti), (&xc, &xi), true),
        ));
        out.push(format!(
            "DELETE FROM {s} USING {deleted} AS x WHERE NOT {s}.{d} AND x.dest_table = {name} \
             AND x.row_key = {whole} AND {removed_table}",
            whole = literal(TABLE_ROW_KEY),
            // A row at the table-wide entry's own position is the copy's.
            removed_table = position_before(GUARD, (&stc, &sti), (&xc, &xi), false),
        ));
        out.push(format!(
            "DELETE FROM {s} USING {t} AS t WHERE NOT {s}.{d} AND {on} AND NOT {newer}",
            on = on("t", &s),
            newer = position_before(GUARD, (&tc, &ti), (&stc, &sti), false),
        ));
        out.push(format!(
            "DELETE FROM {deleted} USING {s} AS s WHERE {deleted}.dest_table = {name} AND {deleted}.row_key = s.{k} \
             AND NOT s.{d} AND {older}",
            older = position_before(GUARD, (&dc, &di), (&sc, &si), false),
        ));
        out.push(format!("DELETE FROM {t} USING {s} AS s WHERE NOT s.{d} AND {}", on(&t, "s")));
        let cols: Vec<String> = names.iter().cloned().chain([c.clone(), i.clone()]).collect();
        out.push(format!("INSERT INTO {t} ({cols}) SELECT {cols} FROM {s} WHERE NOT {d}", cols = cols.join(", ")));
    }
    out
}

/// Removes the rows of `table` written before `(commit, index)` (a
/// truncate: rows a replay wrote after it stay). `DELETE`, not `TRUNCATE`,
/// which commits in Redshift.
pub fn truncate_older_sql(table: &DestinationTable, commit: i64, index: i64) -> String {
    let (c, i) = positions("");
    let at = (commit.to_string(), index.to_string());
    format!("DELETE FROM {} WHERE {}", table.quoted(), position_before(GUARD, (&c, &i), (&at.0, &at.1), false))
}

/// The table-wide deleted-rows entry of `table`.
pub fn table_entry_sql(table: &DestinationTable) -> String {
    let (c, i) = positions("");
    format!(
        "SELECT {c}, {i} FROM {} WHERE dest_table = {} AND row_key = {}",
        deleted_table(),
        literal(&table.to_string()),
        literal(TABLE_ROW_KEY)
    )
}

/// Keeps `(commit, index)` as `table`'s table-wide entry (`replace`: an
/// older one is there) and drops its older key entries.
pub fn removed_before_sql(table: &DestinationTable, commit: i64, index: i64, replace: bool, now: &str) -> Vec<String> {
    let (c, i) = positions("");
    let name = literal(&table.to_string());
    let whole = literal(TABLE_ROW_KEY);
    let deleted = deleted_table();
    let at = (commit.to_string(), index.to_string());
    let mut out = Vec::new();
    if replace {
        out.push(format!("DELETE FROM {deleted} WHERE dest_table = {name} AND row_key = {whole}"));
    }
    out.push(format!(
        "INSERT INTO {deleted} (dest_table, row_key, {c}, {i}, deleted_at) VALUES ({name}, {whole}, {commit}, {index}, {now})"
    ));
    out.push(format!(
        "DELETE FROM {deleted} WHERE dest_table = {name} AND row_key <> {whole} AND {}",
        position_before(GUARD, (&c, &i), (&at.0, &at.1), false)
    ));
    out.push(format!(
        "DELETE FROM {deleted} WHERE dest_table = {} AND {}",
        literal(&pending_table(&table.to_string())),
        position_before(GUARD, (&c, &i), (&at.0, &at.1), false)
    ));
    out
}

/// Removes every deleted-rows entry of `table`, its pending deletes too.
pub fn forget_deleted_sql(table: &DestinationTable) -> String {
    QUOTING.forget_deleted_sql(&deleted_table(), table)
}

/// Removes the deleted-rows entries written before `before` (a literal).
pub fn prune_deleted_sql(before: &str) -> String {
    format!("DELETE FROM {} WHERE deleted_at < {before}", deleted_table())
}

/// The last reset applied to `table`.
pub fn reset_of_sql(table: &DestinationTable) -> String {
    format!("SELECT reset FROM {} WHERE destination = {}", resets_table(), literal(&table.to_string()))
}

/// Records reset `reset` of `table`, forgets its deleted-rows entries (of
/// the old position domain) and, when it exists, every row's position.
pub fn forget_positions_sql(table: &DestinationTable, exists: bool, reset: i64) -> Vec<String> {
    let name = literal(&table.to_string());
    let mut out = vec![
        format!("DELETE FROM {} WHERE destination = {name}", resets_table()),
        format!("INSERT INTO {} (destination, reset) VALUES ({name}, {reset})", resets_table()),
        forget_deleted_sql(table),
    ];
    if exists {
        let (commit, index) = FORGOTTEN_POSITION;
        out.push(format!(
            "UPDATE {} SET {} = {commit}, {} = {index}",
            table.quoted(),
            quote_ident(COMMIT_COLUMN),
            quote_ident(INDEX_COLUMN)
        ));
    }
    out
}

/// The stored offsets of `group`.
pub fn stored_offsets_sql(group: &str) -> String {
    format!(
        "SELECT topic, \"partition\", next_offset FROM {} WHERE consumer_group = {}",
        offsets_table(),
        literal(group)
    )
}

/// Replaces the stored offsets of `offsets`' partitions (after the fence
/// was checked in the same transaction; see `RedshiftSink::finish`).
pub fn offsets_sql(group: &str, offsets: &[OffsetMove<'_>]) -> Vec<String> {
    if offsets.is_empty() {
        return Vec::new();
    }
    let g = literal(group);
    let which = offsets
        .iter()
        .map(|m| format!("(topic = {} AND \"partition\" = {})", literal(m.topic), m.partition))
        .collect::<Vec<_>>()
        .join(" OR ");
    let values = offsets
        .iter()
        .map(|m| format!("({g}, {}, {}, {})", literal(m.topic), m.partition, m.next))
        .collect::<Vec<_>>()
        .join(", ");
    vec![
        format!("DELETE FROM {} WHERE consumer_group = {g} AND ({which})", offsets_table()),
        format!(
            "INSERT INTO {} (consumer_group, topic, \"partition\", next_offset) VALUES {values}",
            offsets_table()
        ),
    ]
}

/// Removes the stored offsets of `group`.
pub fn delete_offsets_sql(group: &str) -> String {
    format!("DELETE FROM {} WHERE consumer_group = {}", offsets_table(), literal(group))
}

/// A timestamp literal (UTC) for `deleted_at`.
pub fn timestamp_literal(at: chrono::DateTime<chrono::Utc>) -> String {
    format!("CAST({} AS TIMESTAMP)", literal(&at.format("%Y-%m-%d %H:%M:%S%.6f").to_string()))
}

/// The columns of a table, `format_type` spelled (Redshift has the same
/// catalog tables and function), in table order.
pub const COLUMNS_SQL: &str = "SELECT a.attname::varchar, format_type(a.atttypid, a.atttypmod)::varchar, a.attnotnull \
     FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace \
     WHERE n.nspname = $1::varchar AND c.relname = $2::varchar AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum";

/// The primary key columns of a table, in key order.
pub const PRIMARY_KEY_SQL: &str = "SELECT k.column_name::varchar FROM information_schema.table_constraints c \
     JOIN information_schema.key_column_usage k ON k.constraint_name = c.constraint_name \
     AND k.table_schema = c.table_schema AND k.table_name = c.table_name \
     WHERE c.constraint_type = 'PRIMARY KEY' AND c.table_schema = $1::varchar AND c.table_name = $2::varchar ORDER BY k.ordinal_position";

/// Whether a schema exists.
pub const SCHEMA_EXISTS_SQL: &str = "SELECT count(*) FROM pg_namespace WHERE nspname = $1::varchar";

/// Creates a destination schema.
pub fn create_schema_sql(schema: &str) -> String {
    format!("CREATE SCHEMA IF NOT EXISTS {}", quote_ident(schema))
}

/// Drops a destination table.
pub fn drop_table_sql(table: &DestinationTable) -> String {
    format!("DROP TABLE IF EXISTS {}", table.quoted())
}

/// The query reading back the rows of `table` whose key is in `range`, for
/// verification: each column of `schema` as `kinds` says (one per column,
/// with the destination column's type, `format_type` spelled), the key
/// bounded column by column (no row comparison). Text keys compare by
/// their bytes: Redshift orders VARCHAR by its UTF-8 bytes (the test
/// mode's database has the C collation, which does the same).
pub fn read_range_sql(
    table: &DestinationTable,
    schema: &TableSchema,
    kinds: &[(ReadBack, String)],
    range: &KeyRange,
) -> Result<String, String> {
    let columns: Vec<String> = schema
        .columns
        .iter()
        .zip(kinds)
        .map(|(c, (kind, _))| read_expr(&c.name, *kind))
        .collect();
    let keys = schema.key_indexes();
    let key_columns: Vec<String> = keys.iter().map(|&k| quote_ident(&schema.columns[k].name)).collect();
    let literal = |i: usize, value: &Value| {
        let (kind, raw) = keys.get(i).and_then(|&k| kinds.get(k)).ok_or("a bound longer than the key")?;
        key_literal(*kind, raw, value)
    };
    let mut sql = format!("SELECT {} FROM {}", columns.join(", "), table.quoted());
    if let Some(condition) = range.condition(GUARD, &key_columns, literal)? {
        sql.push_str(" WHERE ");
        sql.push_str(&condition);
    }
    Ok(sql)
}

/// What the read-back query gives for a SUPER or VARBYTE value whose JSON or
/// hex is longer than a VARCHAR (`JSON_SERIALIZE` and `FROM_VARBYTE` would
/// fail the whole query, and Redshift's error for it reads as retryable):
/// neither JSON nor hex, so the read-back names it.
pub const TOO_LONG: &str = "(too long)";

/// A column as [`ReadBack`] reads it.
fn read_expr(name: &str, kind: ReadBack) -> String {
    let c = quote_ident(name);
    let too_long = literal(TOO_LONG);
    match kind {
        ReadBack::Bool | ReadBack::Float | ReadBack::Written => c,
        // JSON_SERIALIZE(NULL) is the text `null`, not NULL.
        ReadBack::Json => format!(
            "CASE WHEN {c} IS NULL THEN NULL WHEN JSON_SIZE({c}) > {MAX_VARCHAR} THEN {too_long} \
             ELSE JSON_SERIALIZE({c}) END"
        ),
        ReadBack::Hex => format!(
            "CASE WHEN OCTET_LENGTH({c}) > {} THEN {too_long} ELSE FROM_VARBYTE({c}, 'hex') END",
            MAX_VARCHAR / 2
        ),
        ReadBack::Printed => format!("CAST({c} AS VARCHAR(256))"),
    }
}

/// A key value as a literal of its column (kept as `kind`, of type `raw`).
fn key_literal(kind: ReadBack, raw: &str, value: &Value) -> Result<String, String> {
    let mut text = String::new();
    render_text(&mut text, value)?;
    Ok(match (kind, value) {
        (ReadBack::Bool, Value::Boolean(b)) => if *b { "TRUE" } else { "FALSE" }.to_string(),
        (ReadBack::Hex, Value::Bytes(_)) => {
            format!("TO_VARBYTE({}, 'hex')", literal(text.strip_prefix("\\x").unwrap_or(&text)))
        }
        (ReadBack::Written, _) => literal(&text),
        // A bare number: a cast to the column's NUMERIC(p, s) would round
        // a bound with more digits.
        (ReadBack::Printed, Value::Int16(_) | Value::Int32(_) | Value::Int64(_) | Value::Decimal(_))
            if parse_text(&DataType::VariableDecimal, &text).is_ok() =>
        {
            text
        }
        (ReadBack::Printed, Value::Date(_) | Value::Time(_) | Value::Timestamp(_) | Value::TimestampTz(_)) => {
            format!("CAST({} AS {raw})", literal(&text))
        }
        _ => return Err(format!("a key of type {raw} (a {} value) cannot bound a range here", value.kind())),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn col(ty: &str, dt: DataType) -> Column {
        Column {
            name: "c".into(),
            data_type: dt,
            nullable: true,
            source_type: ty.into(),
            default: None,
            aliases: Vec::new(),
            column_id: None,
        }
    }

    #[test]
    fn types_are_redshifts() {
        let r = |c: &Column| destination_type(c).render();
        assert_eq!(r(&col("varchar(40)", DataType::Text)), "character varying(160)");
        assert_eq!(r(&col("text", DataType::Text)), "character varying(65535)");
        assert_eq!(r(&col("varchar(40000)", DataType::Text)), "character varying(65535)");
        assert_eq!(r(&col("jsonb", DataType::Json)), "super");
        assert_eq!(r(&col("int[]", DataType::Array(Box::new(DataType::Int32)))), "super");
        assert_eq!(r(&col("bytea", DataType::Bytes)), "varbyte");
        assert_eq!(r(&col("", DataType::TimestampTz)), "timestamp with time zone");
        assert_eq!(r(&col("", DataType::VariableDecimal)), "numeric(38,10)");
        assert_eq!(r(&col("", DataType::Decimal { precision: 50, scale: 4 })), "numeric(38,4)");
        assert_eq!(r(&col("", DataType::Decimal { precision: 12, scale: 2 })), "numeric(38,2)");
        assert_eq!(r(&col("smallint", DataType::Int16)), "bigint", "integers never need widening");
        assert_eq!(r(&col("real", DataType::Float32)), "double precision");
        // MySQL's TIME spans -838:59:59..838:59:59: its exact text.
        assert_eq!(r(&col("time(6)", DataType::TimeSpan)), "character varying(32)");
        assert_eq!(r(&col("time", DataType::Time)), "time without time zone");
        let p = PgType::parse;
        assert_eq!(fit(&p("time"), &p("varchar(32)")), Fit::Keep, "a TIME column made before keeps its type");
    }

    #[test]
    fn only_varchar_grows() {
        let p = PgType::parse;
        assert_eq!(fit(&p("varchar(10)"), &p("varchar(20)")), Fit::Widen(varchar(20)));
        assert_eq!(fit(&p("varchar(20)"), &p("varchar(10)")), Fit::Keep);
        assert_eq!(fit(&p("bigint"), &p("integer")), Fit::Keep);
        assert_eq!(fit(&p("integer"), &p("bigint")), Fit::Incompatible);
        assert_eq!(fit(&p("numeric(12,2)"), &p("numeric(14,2)")), Fit::Incompatible);
        assert_eq!(fit(&p("numeric(14,2)"), &p("numeric(12,2)")), Fit::Keep);
        assert_eq!(fit(&p("varbyte(64000)"), &p("varbyte")), Fit::Keep);
        assert_eq!(fit(&p("integer"), &p("character varying(10)")), Fit::Incompatible);
        let t = DestinationTable { schema: "s".into(), table: "t".into() };
        assert!(change_sql(&t, &TableChange::DropNotNull { column: "c".into() }).is_err());
        let widen = TableChange::Widen {
            column: "c".into(),
            from: p("integer"),
            to: p("bigint"),
        };
        assert!(change_sql(&t, &widen).is_err());
    }

    #[test]
    fn load_errors_are_looked_up_by_copy_and_staging_directory() {
        let dir = "s3://b/tributary-staging/g_1/0f6c/";
        let last = load_error_sql(CopyQuery::LastInSession, dir);
        assert!(last.contains("FROM stl_load_errors WHERE query = pg_last_copy_id() AND"), "{last}");
        assert!(last.contains("trim(filename) LIKE 's3://b/tributary-staging/g_1/0f6c/%'"), "{last}");
        for column in [
            "trim(err_reason)",
            "trim(colname)",
            "trim(\"type\")",
            "line_number",
            "err_code",
        ] {
            assert!(last.contains(column), "{column}: {last}");
        }
        // The refused value itself is never read, only its length.
        assert!(last.contains("octet_length(trim(raw_field_value))"), "{last}");
        let by_id = load_error_sql(CopyQuery::Id(5437), "s3://b/p/it's/");
        assert!(by_id.contains("WHERE query = 5437 AND trim(filename) LIKE 's3://b/p/it''s/%'"), "{by_id}");
        assert!(by_id.ends_with("ORDER BY line_number LIMIT 1"), "{by_id}");
    }

    #[test]
    fn rows_are_read_back_by_their_destination_type_in_key_ranges() {
        use tributary_schemas::TableId;
        let column = |name: &str, data_type: DataType| Column::new(name, data_type, true);
        let schema = TableSchema {
            id: TableId::new("public", "t"),
            columns: vec![
                column("k", DataType::Int32),
                column("s", DataType::Text),
                column("j", DataType::Json),
                column("b", DataType::Bytes),
                column("f", DataType::Float64),
                column("ts", DataType::TimestampTz),
            ],
            key: vec!["k".into(), "s".into()],
            dropped: Vec::new(),
        };
        let kinds: Vec<(ReadBack, String)> = schema
            .columns
            .iter()
            .map(|c| {
                let raw = destination_type(c).render();
                (ReadBack::of(&raw), raw)
            })
            .collect();
        let t = DestinationTable { schema: "x".into(), table: "t".into() };
        let range = KeyRange {
            after: Some(vec![Value::Int32(1), Value::Text("a'b".into())]),
            until: Some(vec![Value::Int32(9), Value::Text("z".into())]),
        };
        let sql = read_range_sql(&t, &schema, &kinds, &range).unwrap();
        assert_eq!(
            sql,
            "SELECT CAST(\"k\" AS VARCHAR(256)), \"s\", CASE WHEN \"j\" IS NULL THEN NULL \
             WHEN JSON_SIZE(\"j\") > 65535 THEN '(too long)' ELSE JSON_SERIALIZE(\"j\") END, \
             CASE WHEN OCTET_LENGTH(\"b\") > 32767 THEN '(too long)' ELSE FROM_VARBYTE(\"b\", 'hex') END, \"f\", \
             CAST(\"ts\" AS VARCHAR(256)) FROM \"x\".\"t\" \
             WHERE ((\"k\" > 1 OR (\"k\" = 1 AND \"s\" > 'a''b'))) AND ((\"k\" < 9 OR (\"k\" = 9 AND \"s\" <= 'z')))"
        );
        let all = KeyRange { after: None, until: None };
        assert!(!read_range_sql(&t, &schema, &kinds, &all).unwrap().contains("WHERE"));
        let at = |v: Value, raw: &str| key_literal(ReadBack::of(raw), raw, &v);
        assert_eq!(
            at(Value::TimestampTz(0), "timestamp with time zone").unwrap(),
            "CAST('1970-01-01 00:00:00.000000+00' AS timestamp with time zone)"
        );
        assert_eq!(at(Value::Decimal("-1.50".into()), "numeric(38,2)").unwrap(), "-1.50");
        assert!(at(Value::Decimal("1; DROP TABLE t".into()), "numeric(38,2)").is_err(), "never SQL");
        assert_eq!(at(Value::Bytes(vec![0xab]), "varbyte").unwrap(), "TO_VARBYTE('ab', 'hex')");
        assert!(at(Value::Float64(1.0), "double precision").is_err());
    }

    #[test]
    fn literals_escape_backslashes_and_quotes() {
        assert_eq!(literal("a'b\\c"), "'a''b\\\\c'");
    }
}

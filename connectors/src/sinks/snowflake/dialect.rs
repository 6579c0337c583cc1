//! Snowflake's spelling of what the sink does: the [`Dialect`] the core
//! plans schema changes over, and the statements the sink runs (DDL, the
//! staging tables, the position-guarded DELETE + INSERT, the deleted-rows
//! bookkeeping, the offsets, the read of a key range for verification).
//!
//! No `MERGE`: Snowflake runs MERGE inside a transaction, but the emulator
//! the tests run on (fakesnow) answers a MERGE in an explicit transaction
//! with HTTP 500. A DELETE of every stored row the batch replaces, then an
//! INSERT of every upsert whose key is then free, in the same transaction,
//! is valid on both and has the same effect as the guarded MERGE (see
//! `docs/destinations/snowflake.md`).

use tributary_schemas::{Column, DataType, TableSchema, Value};

use super::config::DestinationTable;
use super::types::{fit, from_staged, read_expression, snowflake_type, staged_text, SfType};
use crate::error::Error;
use crate::sink::bookkeeping::{
    position_before, OffsetMove, PositionSyntax, Quoting, ResetSyntax, COMMIT_COLUMN, DELETE_COLUMN, INDEX_COLUMN,
    KEY_COLUMN, ROW_COLUMN, TABLE_ROW_KEY,
};
use crate::sink::keyless::{self, pending_table};
use crate::sink::schema::{Dialect, Fit, ShapeColumn, TableChange};
use crate::sink::verify::KeyRange;

/// Staging column naming the write that staged a row: the statements read
/// only their own write's rows.
pub const BATCH_COLUMN: &str = "__tributary_batch";

/// Snowflake as the core's [`Dialect`].
#[derive(Debug, Clone, Copy)]
pub struct SnowflakeDialect;

impl Dialect for SnowflakeDialect {
    type Type = SfType;

    fn column_type(&self, column: &Column, _origin: &str) -> SfType {
        snowflake_type(&column.data_type)
    }

    fn position_type(&self) -> SfType {
        SfType::Number(19, 0)
    }

    fn fit(&self, have: &SfType, want: &SfType) -> Fit<SfType> {
        fit(have, want)
    }

    /// Snowflake's primary key is not enforced: nothing demands NOT NULL.
    fn key_refuses_null(&self) -> bool {
        false
    }

    fn adds_position_columns(&self) -> bool {
        true
    }

    fn incompatible(&self, table: &str, column: &Column, have: &SfType, want: &SfType) -> Error {
        Error::permanent(format!(
            "the source column is now {} ({want}); Snowflake cannot change the destination column of type {have} \
             into it (it only lengthens VARCHARs and adds NUMBER precision at the same scale)",
            column.data_type
        ))
        .with_hint(format!(
            "recreate {table} with the new type, e.g. CREATE TABLE ... AS SELECT with a cast, or drop it and let \
             the sink create it again, then replay the dead-letter topic"
        ))
    }
}

/// A double-quoted identifier: names keep their case.
pub fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// A single-quoted string literal (Snowflake reads a backslash as an
/// escape in string literals).
pub fn quote_string(text: &str) -> String {
    format!("'{}'", text.replace('\\', "\\\\").replace('\'', "''"))
}

/// The query reading back the rows of `range` of `table`: each column of
/// `schema`, kept as `types` (the destination's, in the schema's order), in
/// the form [`super::types::from_cell`] reads; the key bounded
/// lexicographically (no row-value comparison here; VARCHAR and BINARY
/// compare by their bytes without a collation, as the source reads them).
pub fn read_range_sql(
    table: &DestinationTable,
    schema: &TableSchema,
    types: &[SfType],
    range: &KeyRange,
) -> Result<String, String> {
    let columns: Vec<String> = schema
        .columns
        .iter()
        .zip(types)
        .map(|(c, ty)| read_expression(&quote_ident(&c.name), ty))
        .collect();
    let keys = schema.key_indexes();
    let key_columns: Vec<String> = keys.iter().map(|&k| quote_ident(&schema.columns[k].name)).collect();
    let key_literal = |i: usize, v: &Value| -> Result<String, String> {
        let c = &schema.columns[keys[i]];
        let ty = snowflake_type(&c.data_type);
        if matches!(ty, SfType::Varchar(_))
            && matches!(c.data_type, DataType::Decimal { .. } | DataType::VariableDecimal)
        {
            return Err(format!("key column {} is a decimal kept as VARCHAR, which orders as text", c.name));
        }
        let text = staged_text(v)?.ok_or_else(|| format!("a bound of key column {} is NULL", c.name))?;
        Ok(from_staged(&quote_string(&text), &ty))
    };
    let mut sql = format!("SELECT {} FROM {}", columns.join(", "), table.quoted());
    if let Some(condition) = range.condition(PositionSyntax::Expanded, &key_columns, key_literal)? {
        sql.push_str(" WHERE ");
        sql.push_str(&condition);
    }
    Ok(sql)
}

/// The statements of one table change; `declare_key` adds the (unenforced)
/// `PRIMARY KEY` to a new table.
pub fn change_sql(table: &DestinationTable, change: &TableChange<SfType>, declare_key: bool) -> Vec<String> {
    let t = table.quoted();
    let column = |c: &ShapeColumn<SfType>| {
        format!("{} {}{}", quote_ident(&c.name), c.ty, if c.not_null { " NOT NULL" } else { "" })
    };
    match change {
        TableChange::CreateTable { columns, key } => {
            let mut defs: Vec<String> = columns.iter().map(column).collect();
            if declare_key && !key.is_empty() {
                defs.push(format!(
                    "PRIMARY KEY ({})",
                    key.iter().map(|k| quote_ident(k)).collect::<Vec<_>>().join(", ")
                ));
            }
            vec![format!("CREATE TABLE IF NOT EXISTS {t} ({})", defs.join(", "))]
        }
        // The rows already there get the source's default: Snowflake fills
        // them from a constant DEFAULT; the types without a plain literal
        // get it by an UPDATE of the rows still NULL (a rerun after a crash
        // between the two leaves written values alone).
        TableChange::AddColumn { column: c, backfill: Some(v) } => match literal(v, &c.ty) {
            Some(Literal::Plain(lit)) => vec![format!("ALTER TABLE {t} ADD COLUMN {} DEFAULT {lit}", column(c))],
            Some(Literal::Converted(expr)) => {
                let q = quote_ident(&c.name);
                vec![
                    format!("ALTER TABLE {t} ADD COLUMN {}", column(c)),
                    format!("UPDATE {t} SET {q} = {expr} WHERE {q} IS NULL"),
                ]
            }
            None => vec![format!("ALTER TABLE {t} ADD COLUMN {}", column(c))],
        },
        TableChange::AddColumn { column: c, backfill: None } => {
            vec![format!("ALTER TABLE {t} ADD COLUMN {}", column(c))]
        }
        // -1 sorts before every real position.
        TableChange::AddBookkeeping(c) => vec![format!("ALTER TABLE {t} ADD COLUMN {} DEFAULT -1", column(c))],
        TableChange::Widen { column, to, .. } => {
            vec![format!(
                "ALTER TABLE {t} ALTER COLUMN {} SET DATA TYPE {to}",
                quote_ident(column)
            )]
        }
        TableChange::DropNotNull { column } => {
            vec![format!(
                "ALTER TABLE {t} ALTER COLUMN {} DROP NOT NULL",
                quote_ident(column)
            )]
        }
        TableChange::RenameColumn { from, to } => {
            vec![format!(
                "ALTER TABLE {t} RENAME COLUMN {} TO {}",
                quote_ident(from),
                quote_ident(to)
            )]
        }
        // The plan drops only a column the table has (its shape is read
        // from information_schema).
        TableChange::DropColumn { column } => vec![format!("ALTER TABLE {t} DROP COLUMN {}", quote_ident(column))],
    }
}

/// A default as SQL.
enum Literal {
    /// A constant Snowflake takes as a column DEFAULT.
    Plain(String),
    /// An expression (PARSE_JSON, TO_BINARY) for an UPDATE.
    Converted(String),
}

fn literal(value: &Value, ty: &SfType) -> Option<Literal> {
    let text = staged_text(value).ok()??;
    Some(match ty {
        SfType::Boolean => Literal::Plain(if text == "true" { "TRUE" } else { "FALSE" }.into()),
        SfType::Number(..) if text.parse::<f64>().is_ok() => Literal::Plain(text),
        SfType::Variant | SfType::Array | SfType::Binary => Literal::Converted(from_staged(&quote_string(&text), ty)),
        _ => Literal::Plain(quote_string(&text)),
    })
}

/// This dialect's quoting, for the statements the core writes once.
pub const QUOTING: Quoting = Quoting { ident: quote_ident, string: quote_string };

/// The session's temporary staging table of a column set: every data
/// column as VARCHAR (the values are bound as text and converted by the
/// statements that read them, so a value the column refuses fails there,
/// with Snowflake's reason), then the delete flag, key, position and write.
pub fn staging_table_sql(stage: &str, names: &[&str]) -> String {
    let mut defs: Vec<String> = names.iter().map(|n| format!("{} VARCHAR", quote_ident(n))).collect();
    defs.push(format!("{} BOOLEAN", quote_ident(DELETE_COLUMN)));
    defs.push(format!("{} VARCHAR", quote_ident(KEY_COLUMN)));
    defs.push(format!("{} NUMBER(19, 0)", quote_ident(COMMIT_COLUMN)));
    defs.push(format!("{} NUMBER(19, 0)", quote_ident(INDEX_COLUMN)));
    defs.push(format!("{} VARCHAR", quote_ident(ROW_COLUMN)));
    defs.push(format!("{} VARCHAR", quote_ident(BATCH_COLUMN)));
    format!("CREATE TEMPORARY TABLE IF NOT EXISTS {} ({})", quote_ident(stage), defs.join(", "))
}

/// The array-bound INSERT into a staging table: one `?` per column of
/// [`staging_table_sql`].
pub fn staging_insert_sql(stage: &str, names: &[&str]) -> String {
    let all: Vec<String> = names
        .iter()
        .copied()
        .chain([
            DELETE_COLUMN,
            KEY_COLUMN,
            COMMIT_COLUMN,
            INDEX_COLUMN,
            ROW_COLUMN,
            BATCH_COLUMN,
        ])
        .map(quote_ident)
        .collect();
    let marks = vec!["?"; all.len()].join(", ");
    format!("INSERT INTO {} ({}) VALUES ({marks})", quote_ident(stage), all.join(", "))
}

/// The session's temporary internal stage that large writes are uploaded
/// to (gone with the session). Server-side encryption only: the client
/// uploads the file as it is (with Snowflake's default, client-side
/// encryption, the client would have to encrypt it with a key of the PUT's
/// answer).
pub fn internal_stage_sql(stage: &str) -> String {
    format!("CREATE TEMPORARY STAGE IF NOT EXISTS {stage} ENCRYPTION = (TYPE = 'SNOWFLAKE_SSE')")
}

/// The `PUT` of a staged file `file` (gzipped already) into `stage`: its
/// answer says where the client uploads the file. The local path names
/// only the file (Snowflake takes the name from it, and so do its drivers
/// when they ask for a file's presigned URL).
pub fn put_sql(stage: &str, file: &str) -> String {
    format!("PUT 'file://{file}' @{stage} AUTO_COMPRESS = FALSE SOURCE_COMPRESSION = GZIP OVERWRITE = TRUE")
}

/// Loads the staged file `file` of `stage` into the staging table `table`
/// (its columns in the file's order, [`staging_table_sql`]) and removes
/// the file. The CSV format of [`staged_csv`]: every value enclosed in
/// double quotes, NULL an empty field.
pub fn copy_sql(table: &str, stage: &str, file: &str) -> String {
    format!(
        "COPY INTO {} FROM @{stage}/{file} FILE_FORMAT = (TYPE = CSV FIELD_OPTIONALLY_ENCLOSED_BY = '\"' \
         NULL_IF = () EMPTY_FIELD_AS_NULL = TRUE COMPRESSION = GZIP) ON_ERROR = ABORT_STATEMENT PURGE = TRUE",
        quote_ident(table)
    )
}

/// Staged rows (text cells, NULL as `None`) as the CSV [`copy_sql`] reads:
/// a value enclosed in double quotes (a quote doubled), so that an empty
/// string stays one; NULL as an empty field.
pub fn staged_csv(rows: &[Vec<Option<String>>]) -> Vec<u8> {
    let mut out = Vec::new();
    for row in rows {
        for (n, cell) in row.iter().enumerate() {
            if n > 0 {
                out.push(b',');
            }
            if let Some(text) = cell {
                out.push(b'"');
                out.extend_from_slice(text.replace('"', "\"\"").as_bytes());
                out.push(b'"');
            }
        }
        out.push(b'\n');
    }
    out
}

/// One write's staged rows.
pub fn staged_source(stage: &str, batch: &str) -> String {
    format!(
        "(SELECT * FROM {} WHERE {} = {})",
        quote_ident(stage),
        quote_ident(BATCH_COLUMN),
        quote_string(batch)
    )
}

/// `t.k = <staged s.k as its type>` for every key column.
fn key_match(key: &[ShapeColumn<SfType>]) -> String {
    key.iter()
        .map(|c| {
            let q = quote_ident(&c.name);
            format!("t.{q} = {}", from_staged(&format!("s.{q}"), &c.ty))
        })
        .collect::<Vec<_>>()
        .join(" AND ")
}

/// Removes every stored row a staged change (`source`, already without the
/// upserts the deleted rows keep out) replaces: a delete's row if it is not
/// newer than the delete, an upsert's row if it is older than the upsert.
pub fn replaced_rows_sql(table: &DestinationTable, source: &str, key: &[ShapeColumn<SfType>]) -> String {
    let (tc, ti) = QUOTING.positions("t.");
    let (sc, si) = QUOTING.positions("s.");
    format!(
        "DELETE FROM {t} AS t WHERE EXISTS (SELECT 1 FROM {source} AS s WHERE {on} AND \
         (s.{d} AND {deleted} OR NOT s.{d} AND {updated}))",
        t = table.quoted(),
        on = key_match(key),
        d = quote_ident(DELETE_COLUMN),
        deleted = position_before(PositionSyntax::Expanded, (&tc, &ti), (&sc, &si), true),
        updated = position_before(PositionSyntax::Expanded, (&tc, &ti), (&sc, &si), false),
    )
}

/// Inserts every staged upsert whose key has no row (after
/// [`replaced_rows_sql`]: a row still there is at least as new).
pub fn insert_rows_sql(
    table: &DestinationTable,
    source: &str,
    columns: &[ShapeColumn<SfType>],
    key: &[ShapeColumn<SfType>],
) -> String {
    let (c, i) = QUOTING.positions("");
    let names: Vec<String> = columns
        .iter()
        .map(|col| quote_ident(&col.name))
        .chain([c.clone(), i.clone()])
        .collect();
    let values: Vec<String> = columns
        .iter()
        .map(|col| from_staged(&format!("s.{}", quote_ident(&col.name)), &col.ty))
        .chain([format!("s.{c}"), format!("s.{i}")])
        .collect();
    format!(
        "INSERT INTO {t} ({names}) SELECT {values} FROM {source} AS s WHERE NOT s.{d} AND \
         NOT EXISTS (SELECT 1 FROM {t} AS t WHERE {on})",
        t = table.quoted(),
        names = names.join(", "),
        values = values.join(", "),
        d = quote_ident(DELETE_COLUMN),
        on = key_match(key),
    )
}

/// The deleted-rows table.
pub fn deleted_table_ddl(table: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {table} (dest_table VARCHAR NOT NULL, row_key VARCHAR NOT NULL, \
         {} NUMBER(19, 0) NOT NULL, {} NUMBER(19, 0) NOT NULL, deleted_at TIMESTAMP_TZ NOT NULL)",
        quote_ident(COMMIT_COLUMN),
        quote_ident(INDEX_COLUMN)
    )
}

/// Keeps the deletes of a staged batch (`source`) in the deleted-rows
/// table: each key's newest position (an older entry goes, then an entry is
/// added where the key has none).
pub fn deleted_keep_sql(deleted: &str, dest: &DestinationTable, source: &str) -> [String; 2] {
    let (c, i) = QUOTING.positions("");
    let (dc, di) = QUOTING.positions("d.");
    let (sc, si) = QUOTING.positions("s.");
    let k = quote_ident(KEY_COLUMN);
    let del = quote_ident(DELETE_COLUMN);
    let name = quote_string(&dest.to_string());
    [
        format!(
            "DELETE FROM {deleted} AS d WHERE d.dest_table = {name} AND EXISTS (SELECT 1 FROM {source} AS s \
             WHERE s.{del} AND s.{k} = d.row_key AND {older})",
            older = position_before(PositionSyntax::Expanded, (&dc, &di), (&sc, &si), false),
        ),
        format!(
            "INSERT INTO {deleted} (dest_table, row_key, {c}, {i}, deleted_at) \
             SELECT {name}, s.{k}, s.{c}, s.{i}, CURRENT_TIMESTAMP() FROM {source} AS s WHERE s.{del} AND \
             NOT EXISTS (SELECT 1 FROM {deleted} AS d WHERE d.dest_table = {name} AND d.row_key = s.{k})"
        ),
    ]
}

/// Removes the rows written before `(commit, index)`.
pub fn truncate_older_sql(table: &DestinationTable, commit: i64, index: i64) -> String {
    let (c, i) = QUOTING.positions("");
    let (ac, ai) = (commit.to_string(), index.to_string());
    format!(
        "DELETE FROM {} WHERE {}",
        table.quoted(),
        position_before(PositionSyntax::Expanded, (&c, &i), (&ac, &ai), false)
    )
}

/// Keeps `(commit, index)` as the table-wide deleted-rows entry of `dest`
/// (unless a newer one is there) and drops its older key entries.
pub fn removed_before_sql(deleted: &str, dest: &DestinationTable, commit: i64, index: i64) -> [String; 4] {
    let (c, i) = QUOTING.positions("");
    let name = quote_string(&dest.to_string());
    let whole = quote_string(TABLE_ROW_KEY);
    let at = (commit.to_string(), index.to_string());
    let older = position_before(PositionSyntax::Expanded, (&c, &i), (&at.0, &at.1), false);
    [
        format!("DELETE FROM {deleted} WHERE dest_table = {name} AND row_key = {whole} AND {older}"),
        format!(
            "INSERT INTO {deleted} (dest_table, row_key, {c}, {i}, deleted_at) \
             SELECT {name}, {whole}, {commit}, {index}, CURRENT_TIMESTAMP() WHERE NOT EXISTS \
             (SELECT 1 FROM {deleted} WHERE dest_table = {name} AND row_key = {whole})"
        ),
        format!("DELETE FROM {deleted} WHERE dest_table = {name} AND row_key <> {whole} AND {older}"),
        format!(
            "DELETE FROM {deleted} WHERE dest_table = {} AND {older}",
            quote_string(&pending_table(&dest.to_string()))
        ),
    ]
}

/// Removes every deleted-rows entry of `dest`, its pending deletes too.
pub fn forget_deleted_sql(deleted: &str, dest: &DestinationTable) -> String {
    QUOTING.forget_deleted_sql(deleted, dest)
}

/// The statements that apply a staged write (`source`) to a table without
/// a key (see [`crate::sink::keyless::statements`]): `(inserts, deletes)`
/// says which of its parts the write has.
pub fn keyless_sql(
    deleted: &str,
    dest: &DestinationTable,
    source: &str,
    columns: &[ShapeColumn<SfType>],
    parts: (bool, bool),
) -> Vec<String> {
    let columns: Vec<(String, String)> = columns
        .iter()
        .map(|c| (quote_ident(&c.name), from_staged(&format!("s.{}", quote_ident(&c.name)), &c.ty)))
        .collect();
    keyless::statements_for(QUOTING, dest, &dest.quoted(), deleted, source, &columns, "CURRENT_TIMESTAMP()", parts)
}

/// Removes the deleted-rows entries older than `hours`.
pub fn prune_deleted_sql(deleted: &str, hours: u64) -> String {
    format!("DELETE FROM {deleted} WHERE deleted_at < DATEADD(hour, -{hours}, CURRENT_TIMESTAMP())")
}

/// The resets table.
pub fn resets_table_ddl(resets: &str) -> String {
    format!("CREATE TABLE IF NOT EXISTS {resets} (destination VARCHAR NOT NULL, reset NUMBER(19, 0) NOT NULL)")
}

/// Forgets every row's position of `table` unless the resets table
/// `resets` already holds reset `reset` (or a later one) of it, then
/// records `reset` ([`Quoting::forget_positions_sql`]). The resets table
/// is written first, so it waits for another member's transaction that is
/// recording the same reset; the statements after it begin after that
/// commit and see it. Looking first (a statement sees what was committed
/// when it began) let two members both forget, the second after the first
/// had written copy rows, which the copy's end then removed (found on the
/// Redshift sink, which reads the same way).
pub fn forget_positions_sql(
    table: &DestinationTable,
    exists: bool,
    resets: &str,
    deleted: &str,
    reset: i64,
) -> Vec<String> {
    let syntax = ResetSyntax { resets_first: true, constants_from: "" };
    let quoted = table.quoted();
    QUOTING.forget_positions_sql(syntax, table, exists.then_some(quoted.as_str()), resets, deleted, reset)
}

/// The offsets table.
pub fn offsets_table_ddl(offsets: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {offsets} (consumer_group VARCHAR NOT NULL, topic VARCHAR NOT NULL, \
         {} NUMBER(10, 0) NOT NULL, next_offset NUMBER(19, 0) NOT NULL)",
        quote_ident("partition")
    )
}

/// The stored offsets of `group`: `topic, partition, next_offset` rows.
pub fn read_offsets_sql(offsets: &str, group: &str) -> String {
    format!(
        "SELECT topic, {}, next_offset FROM {offsets} WHERE consumer_group = {}",
        quote_ident("partition"),
        quote_string(group)
    )
}

/// The table of the consumer groups' writer locks (one row per group).
pub fn locks_table_ddl(locks: &str) -> String {
    format!("CREATE TABLE IF NOT EXISTS {locks} (consumer_group VARCHAR NOT NULL, taken NUMBER(38, 0) NOT NULL)")
}

/// The group's lock row, made once (outside any transaction; two made at
/// once are both taken by [`lock_sql`], which is as good as one).
pub fn lock_row_sql(locks: &str, group: &str) -> String {
    let g = quote_string(group);
    format!(
        "INSERT INTO {locks} (consumer_group, taken) SELECT {g}, 0 \
         WHERE NOT EXISTS (SELECT 1 FROM {locks} WHERE consumer_group = {g})"
    )
}

/// Takes the group's writer lock for the open transaction, its first
/// statement: Snowflake's DML locks make a second transaction of the group
/// wait until the first one ends (and then read what it wrote), so that two
/// members never write at once: the guarded DELETE of one (an old key's
/// delete) and the INSERT of the other (that key's older row) would each
/// miss the other's uncommitted rows, and the row would stay; and of two
/// runners that both believe they own a partition, the second's fence reads
/// what the first committed. The counter changes at every transaction:
/// fakesnow (DuckDB) finds two transactions in conflict only when they
/// change a value, and skipped the earlier no-op `UPDATE offsets SET
/// next_offset = next_offset` as no write at all (the fault suite's
/// postgres-snowflake pipeline then kept rows whose keys had been deleted).
pub fn lock_sql(locks: &str, group: &str) -> String {
    format!("UPDATE {locks} SET taken = taken + 1 WHERE consumer_group = {}", quote_string(group))
}

/// Replaces the stored offsets of the moved partitions: a DELETE of their
/// rows, then one INSERT of every move.
pub fn write_offsets_sql(offsets: &str, group: &str, moves: &[OffsetMove<'_>]) -> [String; 2] {
    let p = quote_ident("partition");
    let g = quote_string(group);
    let which = moves
        .iter()
        .map(|m| format!("topic = {} AND {p} = {}", quote_string(m.topic), m.partition))
        .collect::<Vec<_>>()
        .join(" OR ");
    let rows = moves
        .iter()
        .map(|m| format!("({g}, {}, {}, {})", quote_string(m.topic), m.partition, m.next))
        .collect::<Vec<_>>()
        .join(", ");
    [
        format!("DELETE FROM {offsets} WHERE consumer_group = {g} AND ({which})"),
        format!("INSERT INTO {offsets} (consumer_group, topic, {p}, next_offset) VALUES {rows}"),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sink::bookkeeping::Fence;

    /// A table keyed by (`k`, `s`), a number and a text.
    fn keyed_schema() -> TableSchema {
        let col = |name: &str, data_type: DataType| Column {
            name: name.into(),
            data_type,
            nullable: false,
            source_type: String::new(),
            default: None,
            aliases: Vec::new(),
            column_id: None,
        };
        TableSchema {
            id: tributary_schemas::TableId::new("public", "items"),
            columns: vec![
                col("k", DataType::Int32),
                col("s", DataType::Text),
                col("ts", DataType::TimestampTz),
            ],
            key: vec!["k".into(), "s".into()],
            dropped: Vec::new(),
        }
    }

    fn range() -> KeyRange {
        KeyRange {
            after: Some(vec![Value::Int32(1), Value::Text("it's".into())]),
            until: Some(vec![Value::Int32(2), Value::Text("z".into())]),
        }
    }

    #[test]
    fn a_range_is_read_back_by_its_key() {
        let schema = keyed_schema();
        let types = [SfType::Number(10, 0), SfType::Varchar(None), SfType::TimestampTz];
        assert_eq!(
            read_range_sql(&dest(), &schema, &types, &range()).unwrap(),
            "SELECT \"k\", \"s\", DATE_PART(EPOCH_MICROSECOND, \"ts\") FROM \"DB\".\"public\".\"items\" WHERE \
             ((\"k\" > CAST('1' AS NUMBER(10, 0)) OR (\"k\" = CAST('1' AS NUMBER(10, 0)) AND \"s\" > 'it''s'))) AND \
             ((\"k\" < CAST('2' AS NUMBER(10, 0)) OR (\"k\" = CAST('2' AS NUMBER(10, 0)) AND \"s\" <= 'z')))"
        );
    }

    fn dest() -> DestinationTable {
        DestinationTable {
            database: "DB".into(),
            schema: "public".into(),
            table: "items".into(),
        }
    }

    /// The statements as Snowflake's own copy wrote them, before the core
    /// wrote them once: the resets row first.
    #[test]
    fn reset_statements_keep_their_text_and_order() {
        let (resets, deleted) = (r#""DB"."bk"."resets""#, r#""DB"."bk"."deleted_rows""#);
        let taken = format!("EXISTS (SELECT 1 FROM {resets} WHERE destination = 'public.items' AND reset >= 7)");
        let want = [
            format!("DELETE FROM {resets} WHERE destination = 'public.items' AND reset < 7"),
            format!(
                r#"UPDATE "DB"."public"."items" SET "__tributary_commit" = -1, "__tributary_index" = -1 WHERE NOT {taken}"#
            ),
            // (And the pending deletes of a table without a key.)
            format!(
                "DELETE FROM {deleted} WHERE dest_table IN ('public.items', 'public.items (pending deletes)') \
                 AND NOT {taken}"
            ),
            format!(
                "INSERT INTO {resets} (destination, reset) SELECT 'public.items', 7 WHERE NOT EXISTS \
                 (SELECT 1 FROM {resets} WHERE destination = 'public.items')"
            ),
        ];
        assert_eq!(forget_positions_sql(&dest(), true, resets, deleted, 7), want);
        let without_rows = [&want[..1], &want[2..]].concat();
        assert_eq!(forget_positions_sql(&dest(), false, resets, deleted, 7), without_rows);
    }

    #[test]
    fn staged_files_keep_empty_strings_apart_from_null() {
        let rows = vec![
            vec![Some("007".to_string()), Some(String::new()), None],
            vec![
                Some("a \"quoted\",\nline".to_string()),
                Some("\\N".to_string()),
                Some("true".to_string()),
            ],
        ];
        assert_eq!(
            String::from_utf8(staged_csv(&rows)).expect("utf-8"),
            "\"007\",\"\",\n\"a \"\"quoted\"\",\nline\",\"\\N\",\"true\"\n"
        );
        let copy = copy_sql("tributary_stage_x", "\"DB\".\"bk\".\"up\"", "f.csv.gz");
        assert!(copy.starts_with("COPY INTO \"tributary_stage_x\" FROM @\"DB\".\"bk\".\"up\"/f.csv.gz "), "{copy}");
        assert!(copy.contains("NULL_IF = ()") && copy.contains("PURGE = TRUE"), "{copy}");
    }

    #[test]
    fn literals_and_identifiers_are_escaped() {
        assert_eq!(quote_string("it's\\"), "'it''s\\\\'");
        assert_eq!(quote_ident("a\"b"), "\"a\"\"b\"");
    }

    #[test]
    fn rows_are_replaced_under_the_position_guard() {
        let key = vec![ShapeColumn {
            name: "id".into(),
            ty: SfType::Number(10, 0),
            not_null: true,
        }];
        let sql = replaced_rows_sql(&dest(), "(S)", &key);
        assert!(sql.starts_with("DELETE FROM \"DB\".\"public\".\"items\" AS t WHERE EXISTS"), "{sql}");
        assert!(sql.contains("t.\"id\" = CAST(s.\"id\" AS NUMBER(10, 0))"), "{sql}");
        assert!(
            sql.contains("t.\"__tributary_index\" <= s.\"__tributary_index\""),
            "deletes at the same position: {sql}"
        );
        let sql = insert_rows_sql(&dest(), "(S)", &key, &key);
        assert!(sql.contains("NOT EXISTS (SELECT 1 FROM \"DB\".\"public\".\"items\" AS t WHERE"), "{sql}");
        assert!(!sql.contains("MERGE"));
    }

    #[test]
    fn offsets_are_replaced_per_partition() {
        let moves = [
            OffsetMove {
                topic: "t",
                partition: 0,
                fence: Fence::At(3),
                next: 7,
            },
            OffsetMove {
                topic: "t",
                partition: 1,
                fence: Fence::Absent,
                next: 2,
            },
        ];
        let [delete, insert] = write_offsets_sql("O", "g", &moves);
        assert_eq!(
            delete,
            "DELETE FROM O WHERE consumer_group = 'g' AND (topic = 't' AND \"partition\" = 0 OR topic = 't' AND \"partition\" = 1)"
        );
        assert!(insert.ends_with("VALUES ('g', 't', 0, 7), ('g', 't', 1, 2)"), "{insert}");
    }
}

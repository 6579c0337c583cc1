//! BigQuery's spelling of what the sink does: the [`Dialect`] the core plans
//! schema changes over, and the statements it runs (DDL, the staging
//! tables, the position-guarded `MERGE`, the offsets `MERGE`, the read of a
//! key range for verification).

use tributary_schemas::{Column, DataType, TableSchema, Value};

use super::config::DestinationTable;
use super::types::{bigquery_type, fit, read_expression, to_json, BqType};
use crate::error::Error;
use crate::sink::bookkeeping::{
    position_before, Fence, OffsetMove, PositionSyntax, Quoting, ResetSyntax, COMMIT_COLUMN, DELETE_COLUMN,
    FENCED_CLASS, INDEX_COLUMN, KEY_COLUMN, ROW_COLUMN, TABLE_ROW_KEY,
};
use crate::sink::keyless::{self, pending_table};
use crate::sink::schema::{Dialect, Fit, ShapeColumn, TableChange};
use crate::sink::verify::KeyRange;

/// Staging column naming the write that staged a row: its MERGE reads
/// only that write's rows.
pub const BATCH_COLUMN: &str = "__tributary_batch";
/// BigQuery clusters on at most four columns.
const MAX_CLUSTER_COLUMNS: usize = 4;

/// BigQuery as the core's [`Dialect`].
#[derive(Debug, Clone, Copy)]
pub struct BigQueryDialect;

impl Dialect for BigQueryDialect {
    type Type = BqType;

    fn column_type(&self, column: &Column, _origin: &str) -> BqType {
        bigquery_type(&column.data_type)
    }

    fn position_type(&self) -> BqType {
        BqType::Int64
    }

    fn fit(&self, have: &BqType, want: &BqType) -> Fit<BqType> {
        fit(have, want)
    }

    /// A REPEATED column cannot be REQUIRED.
    fn can_refuse_null(&self, ty: &BqType) -> bool {
        !matches!(ty, BqType::Array(_))
    }

    /// BigQuery's key is declared `NOT ENFORCED`: nothing demands NOT NULL.
    fn key_refuses_null(&self) -> bool {
        false
    }

    fn adds_position_columns(&self) -> bool {
        false
    }

    fn incompatible(&self, table: &str, column: &Column, have: &BqType, want: &BqType) -> Error {
        Error::permanent(format!(
            "the source column is now {} ({want}), which BigQuery cannot convert the destination column of type {have} to",
            column.data_type
        ))
        .with_hint(format!(
            "recreate {table} with the new type (the sink creates it again when it is dropped), then replay the dead-letter topic"
        ))
    }
}

/// The statements of one table change; `declare_key` adds `PRIMARY KEY
/// (...) NOT ENFORCED` to a new table.
pub fn change_sql(table: &DestinationTable, change: &TableChange<BqType>, declare_key: bool) -> Vec<String> {
    let t = table.quoted();
    match change {
        // BigQuery adds columns as NULLABLE only, and a column's DEFAULT
        // applies to later inserts only: the rows already there get the
        // value by an UPDATE (of the rows still NULL, so that a rerun after
        // a crash between the two leaves written values alone).
        TableChange::AddColumn { column, backfill: Some(v) } => {
            let mut out = vec![one_change_sql(table, change, declare_key)];
            if let Some(lit) = literal(v, &column.ty) {
                let c = quote_ident(&column.name);
                out.push(format!("UPDATE {t} SET {c} = {lit} WHERE {c} IS NULL"));
            }
            out
        }
        _ => vec![one_change_sql(table, change, declare_key)],
    }
}

/// A value as a BigQuery literal of type `ty`, or `None` for one without a
/// form here.
fn literal(value: &Value, ty: &BqType) -> Option<String> {
    let base = match ty {
        BqType::Numeric(_) => "NUMERIC".to_string(),
        BqType::BigNumeric(_) => "BIGNUMERIC".to_string(),
        BqType::Array(_) | BqType::Geography => return None,
        t => t.to_string(),
    };
    Some(match to_json(value, ty).ok()? {
        serde_json::Value::Bool(b) => if b { "TRUE" } else { "FALSE" }.to_string(),
        serde_json::Value::Number(n) => format!("CAST({n} AS {base})"),
        serde_json::Value::String(s) => match ty {
            BqType::Json => format!("PARSE_JSON({})", quote_string(&s)),
            BqType::Bytes => format!("FROM_BASE64({})", quote_string(&s)),
            _ => format!("CAST({} AS {base})", quote_string(&s)),
        },
        _ => return None,
    })
}

fn one_change_sql(table: &DestinationTable, change: &TableChange<BqType>, declare_key: bool) -> String {
    let t = table.quoted();
    let column = |c: &ShapeColumn<BqType>| {
        format!("{} {}{}", quote_ident(&c.name), c.ty, if c.not_null { " NOT NULL" } else { "" })
    };
    match change {
        TableChange::CreateTable { columns, key } => {
            let mut defs: Vec<String> = columns.iter().map(column).collect();
            let keys: Vec<String> = key.iter().map(|k| quote_ident(k)).collect();
            if declare_key && !keys.is_empty() {
                defs.push(format!("PRIMARY KEY ({}) NOT ENFORCED", keys.join(", ")));
            }
            let cluster: Vec<String> = key
                .iter()
                .filter(|k| columns.iter().find(|c| &c.name == *k).is_some_and(|c| clusterable(&c.ty)))
                .take(MAX_CLUSTER_COLUMNS)
                .map(|k| quote_ident(k))
                .collect();
            let cluster = if cluster.is_empty() {
                String::new()
            } else {
                format!(" CLUSTER BY {}", cluster.join(", "))
            };
            format!("CREATE TABLE IF NOT EXISTS {t} ({}){cluster}", defs.join(", "))
        }
        // BigQuery adds columns as NULLABLE only.
        TableChange::AddColumn { column: c, .. } | TableChange::AddBookkeeping(c) => {
            format!("ALTER TABLE {t} ADD COLUMN IF NOT EXISTS {} {}", quote_ident(&c.name), c.ty)
        }
        TableChange::Widen { column, to, .. } => {
            format!("ALTER TABLE {t} ALTER COLUMN {} SET DATA TYPE {to}", quote_ident(column))
        }
        TableChange::DropNotNull { column } => {
            format!("ALTER TABLE {t} ALTER COLUMN {} DROP NOT NULL", quote_ident(column))
        }
        // Without IF EXISTS, which the emulator cannot parse: the shape the
        // plan started from is BigQuery's own (`tables.get`), so the column
        // is there.
        TableChange::RenameColumn { from, to } => {
            format!("ALTER TABLE {t} RENAME COLUMN {} TO {}", quote_ident(from), quote_ident(to))
        }
        TableChange::DropColumn { column } => format!("ALTER TABLE {t} DROP COLUMN IF EXISTS {}", quote_ident(column)),
    }
}

/// The query reading back the rows of `range` of `table`: every column of
/// `schema` in the form [`super::types::from_cell`] reads, the key bounded
/// lexicographically (BigQuery has no row-value comparison; STRING and
/// BYTES compare by their bytes, as the source reads them). A range of a
/// clustered table reads the blocks of its keys.
pub fn read_range_sql(table: &DestinationTable, schema: &TableSchema, range: &KeyRange) -> Result<String, String> {
    let columns: Vec<String> = schema
        .columns
        .iter()
        .map(|c| read_expression(&quote_ident(&c.name), &c.data_type))
        .collect();
    let keys = schema.key_indexes();
    let key_columns: Vec<String> = keys.iter().map(|&k| quote_ident(&schema.columns[k].name)).collect();
    let key_literal = |i: usize, v: &Value| -> Result<String, String> {
        let c = &schema.columns[keys[i]];
        let ty = bigquery_type(&c.data_type);
        if ty == BqType::String && matches!(c.data_type, DataType::Decimal { .. }) {
            return Err(format!("key column {} is a decimal kept as STRING, which orders as text", c.name));
        }
        literal(v, &ty).ok_or_else(|| format!("a bound of key column {} has no {ty} literal", c.name))
    };
    let mut sql = format!("SELECT {} FROM {}", columns.join(", "), table.quoted());
    if let Some(condition) = range.condition(PositionSyntax::Expanded, &key_columns, key_literal)? {
        sql.push_str(" WHERE ");
        sql.push_str(&condition);
    }
    Ok(sql)
}

/// The columns of a staging table: the destination's columns, then the
/// delete flag, the position and the attempt.
pub fn staging_table_sql(stage: &str, columns: &[ShapeColumn<BqType>], partitioned: bool) -> String {
    let mut defs: Vec<String> = columns.iter().map(|c| format!("{} {}", quote_ident(&c.name), c.ty)).collect();
    defs.push(format!("{} BOOL", quote_ident(DELETE_COLUMN)));
    defs.push(format!("{} STRING", quote_ident(KEY_COLUMN)));
    defs.push(format!("{} STRING", quote_ident(ROW_COLUMN)));
    defs.push(format!("{} INT64", quote_ident(COMMIT_COLUMN)));
    defs.push(format!("{} INT64", quote_ident(INDEX_COLUMN)));
    defs.push(format!("{} STRING", quote_ident(BATCH_COLUMN)));
    // Partitioned by ingestion day, expiring after a day: staged rows still
    // in the streaming buffer cannot be deleted.
    let partitioning = if partitioned {
        " PARTITION BY _PARTITIONDATE OPTIONS (partition_expiration_days = 1)"
    } else {
        ""
    };
    format!("CREATE TABLE IF NOT EXISTS {stage} ({}){partitioning}", defs.join(", "))
}

/// This dialect's quoting, for the statements the core writes once.
pub const QUOTING: Quoting = Quoting { ident: quote_ident, string: quote_string };

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

/// Forgets every row's position of `table` unless the resets table
/// `resets` already holds reset `reset` (or a later one) of it, then
/// records `reset` ([`Quoting::forget_positions_sql`]): the rows first
/// (they read the resets row as it was); a `SELECT` of constants with a
/// `WHERE` needs a `FROM` in BigQuery.
pub fn forget_positions_sql(
    table: &DestinationTable,
    exists: bool,
    resets: &str,
    deleted: &str,
    reset: i64,
) -> Vec<String> {
    let syntax = ResetSyntax {
        resets_first: false,
        constants_from: "FROM (SELECT 1) ",
    };
    let quoted = table.quoted();
    QUOTING.forget_positions_sql(syntax, table, exists.then_some(quoted.as_str()), resets, deleted, reset)
}

/// The one `MERGE` of a staged batch: deletes, updates and inserts, each
/// guarded by the stored position.
pub fn merge_sql(table: &DestinationTable, stage: &str, columns: &[ShapeColumn<BqType>], key: &[String]) -> String {
    let (c, i) = QUOTING.positions("");
    let (tc, ti) = QUOTING.positions("t.");
    let (sc, si) = QUOTING.positions("s.");
    let d = quote_ident(DELETE_COLUMN);
    let on = key
        .iter()
        .map(|k| format!("t.{q} = s.{q}", q = quote_ident(k)))
        .collect::<Vec<_>>()
        .join(" AND ");
    let names: Vec<String> = columns.iter().map(|col| quote_ident(&col.name)).collect();
    let set = columns
        .iter()
        .filter(|col| !key.contains(&col.name))
        .map(|col| format!("{q} = s.{q}", q = quote_ident(&col.name)))
        .chain([format!("{c} = s.{c}"), format!("{i} = s.{i}")])
        .collect::<Vec<_>>()
        .join(", ");
    let all: Vec<String> = names.iter().cloned().chain([c.clone(), i.clone()]).collect();
    let values: Vec<String> = all.iter().map(|n| format!("s.{n}")).collect();
    format!(
        "MERGE {t} AS t USING {stage} AS s ON {on} \
         WHEN MATCHED AND s.{d} AND {deleted} THEN DELETE \
         WHEN MATCHED AND NOT s.{d} AND {updated} THEN UPDATE SET {set} \
         WHEN NOT MATCHED AND NOT s.{d} THEN INSERT ({cols}) VALUES ({vals})",
        t = table.quoted(),
        deleted = position_before(PositionSyntax::Expanded, (&tc, &ti), (&sc, &si), true),
        updated = position_before(PositionSyntax::Expanded, (&tc, &ti), (&sc, &si), false),
        cols = all.join(", "),
        vals = values.join(", "),
    )
}

/// The statement that fails the script (and so its transaction) when a
/// fenced move's stored offset is not the expected one (see
/// [`crate::sink::bookkeeping::Fence`]); `None` when no move is fenced.
pub fn fence_sql(table: &str, group: &str, offsets: &[OffsetMove<'_>]) -> Option<String> {
    let row = |m: &OffsetMove<'_>, extra: &str| {
        format!(
            "SELECT 1 FROM {table} AS o WHERE o.consumer_group = {} AND o.topic = {} AND o.`partition` = {}{extra}",
            quote_string(group),
            quote_string(m.topic),
            m.partition
        )
    };
    let conditions: Vec<String> = offsets
        .iter()
        .filter_map(|m| match m.fence {
            Fence::Unchecked => None,
            Fence::Absent => Some(format!("EXISTS ({})", row(m, ""))),
            Fence::At(at) => Some(format!("NOT EXISTS ({})", row(m, &format!(" AND o.next_offset = {at}")))),
        })
        .collect();
    if conditions.is_empty() {
        return None;
    }
    Some(format!(
        "SELECT ERROR({}) FROM (SELECT 1) WHERE {}",
        quote_string(&format!("{FENCED_CLASS}: a partition's stored offset is not the expected one")),
        conditions.join(" OR ")
    ))
}

/// The deleted-rows table, made with the offsets table.
pub fn deleted_table_ddl(table: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {table} (dest_table STRING NOT NULL, row_key STRING NOT NULL, \
         {} INT64 NOT NULL, {} INT64 NOT NULL, deleted_at TIMESTAMP NOT NULL)",
        quote_ident(COMMIT_COLUMN),
        quote_ident(INDEX_COLUMN)
    )
}

/// Keeps the deletes of a staged batch (`source`) in the deleted-rows table
/// `deleted`: each key's newest position.
pub fn deleted_merge_sql(deleted: &str, dest: &DestinationTable, source: &str) -> String {
    let (c, i) = QUOTING.positions("");
    let (dc, di) = QUOTING.positions("d.");
    let (sc, si) = QUOTING.positions("s.");
    let k = quote_ident(KEY_COLUMN);
    format!(
        "MERGE {deleted} AS d USING (SELECT * FROM {source} WHERE {del}) AS s \
         ON d.dest_table = {name} AND d.row_key = s.{k} \
         WHEN MATCHED AND {newer} THEN UPDATE SET {c} = s.{c}, {i} = s.{i}, deleted_at = CURRENT_TIMESTAMP() \
         WHEN NOT MATCHED THEN INSERT (dest_table, row_key, {c}, {i}, deleted_at) \
         VALUES ({name}, s.{k}, s.{c}, s.{i}, CURRENT_TIMESTAMP())",
        del = quote_ident(DELETE_COLUMN),
        name = quote_string(&dest.to_string()),
        newer = position_before(PositionSyntax::Expanded, (&dc, &di), (&sc, &si), false),
    )
}

/// Keeps `(commit, index)` as the table-wide deleted-rows entry of `dest`
/// and drops its older key entries (after a truncate or a copy at it).
pub fn removed_before_sql(deleted: &str, dest: &DestinationTable, commit: i64, index: i64) -> Vec<String> {
    let (c, i) = QUOTING.positions("");
    let (dc, di) = QUOTING.positions("d.");
    let name = quote_string(&dest.to_string());
    let whole = quote_string(TABLE_ROW_KEY);
    let at = (commit.to_string(), index.to_string());
    vec![
        format!(
            "MERGE {deleted} AS d USING (SELECT {commit} AS c, {index} AS i) AS s \
             ON d.dest_table = {name} AND d.row_key = {whole} \
             WHEN MATCHED AND {newer} THEN UPDATE SET {c} = s.c, {i} = s.i, deleted_at = CURRENT_TIMESTAMP() \
             WHEN NOT MATCHED THEN INSERT (dest_table, row_key, {c}, {i}, deleted_at) \
             VALUES ({name}, {whole}, s.c, s.i, CURRENT_TIMESTAMP())",
            newer = position_before(PositionSyntax::Expanded, (&dc, &di), ("s.c", "s.i"), false),
        ),
        format!(
            "DELETE FROM {deleted} AS d WHERE d.dest_table = {name} AND d.row_key <> {whole} AND {older}",
            older = position_before(PositionSyntax::Expanded, (&dc, &di), (&at.0, &at.1), false),
        ),
        format!(
            "DELETE FROM {deleted} AS d WHERE d.dest_table = {pending} AND {older}",
            pending = quote_string(&pending_table(&dest.to_string())),
            older = position_before(PositionSyntax::Expanded, (&dc, &di), (&at.0, &at.1), false),
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
    columns: &[ShapeColumn<BqType>],
    parts: (bool, bool),
) -> Vec<String> {
    let columns: Vec<(String, String)> = columns
        .iter()
        .map(|c| (quote_ident(&c.name), format!("s.{}", quote_ident(&c.name))))
        .collect();
    keyless::statements_for(QUOTING, dest, &dest.quoted(), deleted, source, &columns, "CURRENT_TIMESTAMP()", parts)
}

/// Removes the deleted-rows entries older than `hours`.
pub fn prune_deleted_sql(deleted: &str, hours: u64) -> String {
    format!("DELETE FROM {deleted} WHERE deleted_at < TIMESTAMP_SUB(CURRENT_TIMESTAMP(), INTERVAL {hours} HOUR)")
}

/// The `MERGE` of a batch's offsets into the offsets table `table`.
pub fn offsets_merge_sql(table: &str, group: &str, offsets: &[OffsetMove<'_>]) -> String {
    let rows = offsets
        .iter()
        .map(|OffsetMove { topic, partition, next, .. }| {
            format!(
                "SELECT {} AS consumer_group, {} AS topic, {partition} AS `partition`, {next} AS next_offset",
                quote_string(group),
                quote_string(topic)
            )
        })
        .collect::<Vec<_>>()
        .join(" UNION ALL ");
    format!(
        "MERGE {table} AS o USING ({rows}) AS s \
         ON o.consumer_group = s.consumer_group AND o.topic = s.topic AND o.`partition` = s.`partition` \
         WHEN MATCHED THEN UPDATE SET next_offset = s.next_offset \
         WHEN NOT MATCHED THEN INSERT (consumer_group, topic, `partition`, next_offset) \
         VALUES (s.consumer_group, s.topic, s.`partition`, s.next_offset)"
    )
}

/// Types BigQuery can cluster on.
fn clusterable(ty: &BqType) -> bool {
    matches!(
        ty,
        BqType::Bool
            | BqType::Int64
            | BqType::Numeric(_)
            | BqType::BigNumeric(_)
            | BqType::String
            | BqType::Date
            | BqType::Datetime
            | BqType::Timestamp
            | BqType::Geography
    )
}

/// A backtick-quoted identifier.
pub fn quote_ident(name: &str) -> String {
    format!("`{}`", name.replace('\\', "\\\\").replace('`', "\\`"))
}

/// A single-quoted string literal.
pub fn quote_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('\'');
    for ch in text.chars() {
        match ch {
            '\\' => out.push_str("\\\\"),
            '\'' => out.push_str("\\'"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c => out.push(c),
        }
    }
    out.push('\'');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let t = DestinationTable {
            project: "p".into(),
            dataset: "d".into(),
            table: "items".into(),
        };
        let schema = keyed_schema();
        assert_eq!(
            read_range_sql(&t, &schema, &range()).unwrap(),
            "SELECT `k`, `s`, UNIX_MICROS(`ts`) FROM `p.d.items` WHERE ((`k` > CAST(1 AS INT64) OR \
             (`k` = CAST(1 AS INT64) AND `s` > CAST('it\\'s' AS STRING)))) AND ((`k` < CAST(2 AS INT64) OR \
             (`k` = CAST(2 AS INT64) AND `s` <= CAST('z' AS STRING))))"
        );
        let whole = KeyRange { after: None, until: None };
        assert_eq!(read_range_sql(&t, &schema, &whole).unwrap(), "SELECT `k`, `s`, UNIX_MICROS(`ts`) FROM `p.d.items`");
    }

    /// The statements as BigQuery's own copy wrote them, before the core
    /// wrote them once: the rows first, the resets row last.
    #[test]
    fn reset_statements_keep_their_text_and_order() {
        let t = DestinationTable {
            project: "p".into(),
            dataset: "d".into(),
            table: "t".into(),
        };
        let taken = "EXISTS (SELECT 1 FROM `p.b.resets` WHERE destination = 'd.t' AND reset >= 7)";
        let want = [
            format!("UPDATE `p.d.t` SET `__tributary_commit` = -1, `__tributary_index` = -1 WHERE NOT {taken}"),
            // (And the pending deletes of a table without a key.)
            format!(
                "DELETE FROM `p.b.deleted_rows` WHERE dest_table IN ('d.t', 'd.t (pending deletes)') AND NOT {taken}"
            ),
            "DELETE FROM `p.b.resets` WHERE destination = 'd.t' AND reset < 7".to_string(),
            "INSERT INTO `p.b.resets` (destination, reset) SELECT 'd.t', 7 FROM (SELECT 1) WHERE NOT EXISTS \
             (SELECT 1 FROM `p.b.resets` WHERE destination = 'd.t')"
                .to_string(),
        ];
        assert_eq!(forget_positions_sql(&t, true, "`p.b.resets`", "`p.b.deleted_rows`", 7), want);
        assert_eq!(forget_positions_sql(&t, false, "`p.b.resets`", "`p.b.deleted_rows`", 7), want[1..]);
    }

    #[test]
    fn literals_and_identifiers_are_escaped() {
        assert_eq!(quote_string("it's\\"), "'it\\'s\\\\'");
        assert_eq!(quote_ident("a`b"), "`a\\`b`");
    }
}

//! Spanner's [`Dialect`] (its types and what `ALTER TABLE` can change) and
//! the statements the sink runs: DDL for destination and bookkeeping
//! tables, and the few DML statements of table-wide steps (a truncate, a
//! reset). Row writes are mutations, not SQL (see `mod.rs`).

use tributary_schemas::{Column, Value};

use super::types::{spanner_type, SpType};
use crate::error::{Error, Result};
use crate::sink::bookkeeping::{
    position_before, PositionSyntax, Quoting, COMMIT_COLUMN, FORGOTTEN_POSITION, INDEX_COLUMN, KEY_COLUMN, ROW_COLUMN,
};
use crate::sink::keyless::pending_table;
use crate::sink::schema::{Dialect, Fit, ShapeColumn, TableChange};

/// Spanner's types and rules.
#[derive(Debug, Clone, Copy, Default)]
pub struct SpannerDialect;

impl Dialect for SpannerDialect {
    type Type = SpType;

    fn column_type(&self, column: &Column, _origin: &str) -> SpType {
        spanner_type(&column.data_type)
    }

    fn position_type(&self) -> SpType {
        SpType::Int64
    }

    fn fit(&self, have: &SpType, want: &SpType) -> Fit<SpType> {
        match (have, want) {
            (h, w) if h == w => Fit::Keep,
            // STRING(n) -> STRING(MAX) (and BYTES) is an in-place change.
            (SpType::String(Some(_)), SpType::String(None)) | (SpType::Bytes(Some(_)), SpType::Bytes(None)) => {
                Fit::Widen(want.clone())
            }
            // STRING(MAX) holds every scalar value as its text.
            (SpType::String(None), w) if !matches!(w, SpType::Array(_)) => Fit::Keep,
            // Integers fit NUMERIC (29 digits before the point).
            (SpType::Numeric, SpType::Int64) => Fit::Keep,
            _ => Fit::Incompatible,
        }
    }

    fn key_refuses_null(&self) -> bool {
        true
    }

    fn adds_position_columns(&self) -> bool {
        true
    }

    fn incompatible(&self, table: &str, column: &Column, have: &SpType, want: &SpType) -> Error {
        Error::permanent(format!(
            "column {} of {table} is {have}; the source now sends {want}, which Spanner cannot change it to in place",
            column.name
        ))
        .with_hint(format!(
            "add a column of type {want} by hand and copy the values, or drop the table to let the sink create it \
             again (ALTER TABLE {t} DROP COLUMN {c}; then replay)",
            t = quote_ident(table),
            c = quote_ident(&column.name)
        ))
    }
}

/// `name` quoted as a Spanner identifier.
pub fn quote_ident(name: &str) -> String {
    format!("`{}`", name.replace('`', ""))
}

/// `s` as a GoogleSQL string literal.
pub fn quote_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('\'');
    for c in s.chars() {
        match c {
            '\'' => out.push_str("\\'"),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.push('\'');
    out
}

fn column_ddl(c: &ShapeColumn<SpType>) -> String {
    format!("{} {}{}", quote_ident(&c.name), c.ty, if c.not_null { " NOT NULL" } else { "" })
}

/// A source default as a DDL expression (`ADD COLUMN ... DEFAULT (7)`
/// fills the rows already there); `None` for a value without one here
/// (arrays), which leaves them NULL, said in the log by the caller.
fn default_literal(v: &Value, ty: &SpType) -> Option<String> {
    // The SQL text form (ISO dates and timestamps with their offset, as
    // Spanner's CAST reads them).
    let text = |v: &Value| {
        let mut out = String::new();
        crate::sink::text::render_text(&mut out, v).ok().map(|()| quote_string(&out))
    };
    match (v, ty) {
        (Value::Boolean(b), SpType::Bool) => Some(if *b { "TRUE" } else { "FALSE" }.into()),
        (Value::Int16(i), SpType::Int64) => Some(i.to_string()),
        (Value::Int32(i), SpType::Int64) => Some(i.to_string()),
        (Value::Int64(i), SpType::Int64) => Some(i.to_string()),
        (Value::Text(s) | Value::Enum(s), SpType::String(_)) => Some(quote_string(s)),
        (Value::Decimal(s), SpType::Numeric) if s.chars().all(|c| c.is_ascii_digit() || c == '.' || c == '-') => {
            Some(format!("NUMERIC {}", quote_string(s)))
        }
        (Value::Float32(_) | Value::Float64(_), SpType::Float64) => Some(format!("CAST({} AS FLOAT64)", text(v)?)),
        (Value::Date(_), SpType::Date) => Some(format!("CAST({} AS DATE)", text(v)?)),
        (Value::Timestamp(_) | Value::TimestampTz(_), SpType::Timestamp) => {
            // A timestamp without a zone is UTC wall-clock time here, as
            // the sink writes its values.
            let t = match v {
                Value::Timestamp(m) => text(&Value::TimestampTz(*m))?,
                _ => text(v)?,
            };
            Some(format!("CAST({t} AS TIMESTAMP)"))
        }
        (Value::Json(s), SpType::Json) => Some(format!("PARSE_JSON({})", quote_string(s))),
        (Value::Bytes(b), SpType::Bytes(_)) => {
            use base64::Engine as _;
            Some(format!("FROM_BASE64({})", quote_string(&base64::engine::general_purpose::STANDARD.encode(b))))
        }
        (Value::Uuid(_) | Value::Date(_) | Value::Timestamp(_) | Value::TimestampTz(_), SpType::String(_)) => text(v),
        _ => None,
    }
}

/// The DDL statements of one change to `table`, whose columns are
/// `shape_columns` before it (ALTER COLUMN restates the whole type).
pub fn change_ddl(table: &str, change: &TableChange<SpType>, shape: &[ShapeColumn<SpType>]) -> Result<Vec<String>> {
    let t = quote_ident(table);
    let typed = |name: &str| shape.iter().find(|c| c.name == name);
    Ok(match change {
        TableChange::CreateTable { columns, key } => {
            let cols = columns.iter().map(column_ddl).collect::<Vec<_>>().join(", ");
            let key = key.iter().map(|k| quote_ident(k)).collect::<Vec<_>>().join(", ");
            vec![format!("CREATE TABLE IF NOT EXISTS {t} ({cols}) PRIMARY KEY ({key})")]
        }
        TableChange::AddColumn { column, backfill } => {
            let literal = backfill.as_ref().and_then(|v| default_literal(v, &column.ty));
            if backfill.is_some() && literal.is_none() {
                tracing::warn!(
                    table,
                    column = %column.name,
                    r#type = %column.ty,
                    "the source's value for the rows already there has no Spanner literal here: they keep NULL in \
                     this column until they change (copy the table again to fill it)"
                );
            }
            let default = literal.map(|l| format!(" DEFAULT ({l})")).unwrap_or_default();
            vec![format!(
                "ALTER TABLE {t} ADD COLUMN IF NOT EXISTS {}{default}",
                column_ddl(column)
            )]
        }
        TableChange::AddBookkeeping(column) => vec![format!(
            "ALTER TABLE {t} ADD COLUMN IF NOT EXISTS {} INT64 NOT NULL DEFAULT (-1)",
            quote_ident(&column.name)
        )],
        TableChange::Widen { column, to, .. } => {
            let not_null = typed(column).is_some_and(|c| c.not_null);
            let c = ShapeColumn { name: column.clone(), ty: to.clone(), not_null };
            vec![format!("ALTER TABLE {t} ALTER COLUMN {}", column_ddl(&c))]
        }
        TableChange::DropNotNull { column } => match typed(column) {
            Some(c) => {
                let c = ShapeColumn {
                    name: c.name.clone(),
                    ty: c.ty.clone(),
                    not_null: false,
                };
                vec![format!("ALTER TABLE {t} ALTER COLUMN {}", column_ddl(&c))]
            }
            None => Vec::new(),
        },
        // GoogleSQL has no RENAME COLUMN: the sink runs `rename_steps`
        // (DDL and DML mixed) instead of a statement list.
        TableChange::RenameColumn { from, to } => {
            return Err(Error::permanent(format!(
                "renaming column {from} of {table} to {to} is not one DDL statement in Spanner"
            ))
            .with_column(to.clone()))
        }
        TableChange::DropColumn { column } => vec![format!("ALTER TABLE {t} DROP COLUMN {}", quote_ident(column))],
    })
}

/// What renaming `from` to `to` takes in Spanner, which has no `RENAME
/// COLUMN`: a new column of the same type, the values copied in one
/// partitioned UPDATE, NOT NULL restated, the old column dropped. Each step
/// may run again (a crash between steps leaves both columns, and
/// [`unfinished_rename`] finds them before anything is written with the
/// new name). A key column cannot be renamed this way (Spanner cannot add
/// a key column).
pub struct RenameSteps {
    /// `ADD COLUMN IF NOT EXISTS to ...` (nullable).
    pub add: String,
    /// `UPDATE ... SET to = from WHERE TRUE` (partitioned DML).
    pub copy: String,
    /// `ALTER COLUMN to ... NOT NULL`, when `from` was NOT NULL.
    pub not_null: Option<String>,
    /// `DROP COLUMN from`.
    pub drop: String,
}

/// The steps of renaming `from` (as the table has it) to `to` in `table`.
pub fn rename_steps(table: &str, from: &ShapeColumn<SpType>, to: &str, key: &[String]) -> Result<RenameSteps> {
    let t = quote_ident(table);
    if key.contains(&from.name) {
        return Err(Error::permanent(format!(
            "the source renamed key column {} of {table} to {to}; Spanner cannot add or rename a key column",
            from.name
        ))
        .with_column(to.to_string())
        .with_class("spanner.rename_key_column")
        .with_hint(format!(
            "copy the table again under the new key: drop {t} in Spanner and run `source-runner reset --table` \
             for its source table"
        )));
    }
    let added = ShapeColumn {
        name: to.to_string(),
        ty: from.ty.clone(),
        not_null: false,
    };
    Ok(RenameSteps {
        add: format!("ALTER TABLE {t} ADD COLUMN IF NOT EXISTS {}", column_ddl(&added)),
        copy: format!("UPDATE {t} SET {} = {} WHERE TRUE", quote_ident(to), quote_ident(&from.name)),
        not_null: from.not_null.then(|| {
            let c = ShapeColumn { not_null: true, ..added.clone() };
            format!("ALTER TABLE {t} ALTER COLUMN {}", column_ddl(&c))
        }),
        drop: format!("ALTER TABLE {t} DROP COLUMN {}", quote_ident(&from.name)),
    })
}

/// A rename a crash left half done: a column of `schema` that the table has
/// beside one of its earlier names (not a column of `schema` any more, nor
/// a key or bookkeeping column). Returns (earlier name, column).
pub fn unfinished_rename<'a>(
    schema: &'a tributary_schemas::TableSchema,
    shape: &crate::sink::schema::TableShape<SpType>,
) -> Option<(&'a str, &'a str)> {
    schema.columns.iter().find_map(|c| {
        shape.column(&c.name)?;
        c.aliases
            .iter()
            .find(|a| {
                schema.column_index(a).is_none()
                    && shape.column(a).is_some()
                    && !shape.primary_key.contains(a)
                    && !crate::sink::bookkeeping::is_bookkeeping(a)
            })
            .map(|a| (a.as_str(), c.name.as_str()))
    })
}

/// The offsets table.
pub fn offsets_ddl(table: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {} (consumer_group STRING(MAX) NOT NULL, topic STRING(MAX) NOT NULL, \
         `partition` INT64 NOT NULL, next_offset INT64 NOT NULL) PRIMARY KEY (consumer_group, topic, `partition`)",
        quote_ident(table)
    )
}

/// The deleted-rows table: `(dest_table, row_key) -> position`, with the
/// commit time for the retention.
pub fn deleted_ddl(table: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {} (dest_table STRING(MAX) NOT NULL, row_key STRING(MAX) NOT NULL, \
         {COMMIT_COLUMN} INT64 NOT NULL, {INDEX_COLUMN} INT64 NOT NULL, \
         deleted_at TIMESTAMP NOT NULL OPTIONS (allow_commit_timestamp = true)) PRIMARY KEY (dest_table, row_key)",
        quote_ident(table)
    )
}

/// The resets table: `destination -> the last reset applied`.
pub fn resets_ddl(table: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {} (destination STRING(MAX) NOT NULL, reset INT64 NOT NULL) PRIMARY KEY (destination)",
        quote_ident(table)
    )
}

fn older_than(commit: i64, index: i64) -> String {
    let (ac, ai) = (commit.to_string(), index.to_string());
    position_before(PositionSyntax::Expanded, (COMMIT_COLUMN, INDEX_COLUMN), (&ac, &ai), false)
}

/// Removes the rows of `table` older than a truncate at `(commit, index)`.
pub fn truncate_older_sql(table: &str, commit: i64, index: i64) -> String {
    format!("DELETE FROM {} WHERE {}", quote_ident(table), older_than(commit, index))
}

/// Removes `dest`'s key entries of the deleted-rows table older than a
/// truncate at `(commit, index)` (the table-wide entry replaces them), and
/// its pending deletes (a table without a key) older than it.
pub fn deleted_keys_older_sql(deleted: &str, dest: &str, commit: i64, index: i64) -> String {
    format!(
        "DELETE FROM {} WHERE (dest_table = {} AND row_key <> '' OR dest_table = {}) AND {}",
        quote_ident(deleted),
        quote_string(dest),
        quote_string(&pending_table(dest)),
        older_than(commit, index)
    )
}

/// The rows of a table without a key (`table`) whose content keys are
/// `contents` (hex digests, safe as literals): content key, name, position.
pub fn keyless_rows_sql(table: &str, contents: &[&str]) -> String {
    let list: Vec<String> = contents.iter().map(|c| quote_string(c)).collect();
    format!(
        "SELECT {KEY_COLUMN}, {ROW_COLUMN}, {COMMIT_COLUMN}, {INDEX_COLUMN} FROM {} WHERE {KEY_COLUMN} IN ({})",
        quote_ident(table),
        list.join(", ")
    )
}

/// The pending deletes of a table without a key (`dest`): row key and
/// position.
pub fn pending_deletes_sql(deleted: &str, dest: &str) -> String {
    format!(
        "SELECT row_key, {COMMIT_COLUMN}, {INDEX_COLUMN} FROM {} WHERE dest_table = {}",
        quote_ident(deleted),
        quote_string(&pending_table(dest))
    )
}

/// Forgets the position of every row of `table`.
pub fn forget_positions_sql(table: &str) -> String {
    let (c, i) = FORGOTTEN_POSITION;
    format!("UPDATE {} SET {COMMIT_COLUMN} = {c}, {INDEX_COLUMN} = {i} WHERE TRUE", quote_ident(table))
}

/// Removes every deleted-rows entry of `dest`, its pending deletes too.
pub fn forget_deleted_sql(deleted: &str, dest: &str) -> String {
    QUOTING.forget_deleted_sql(&quote_ident(deleted), &dest)
}

/// Spanner's quoting, for the statements the core writes once.
pub const QUOTING: Quoting = Quoting { ident: quote_ident, string: quote_string };

/// Removes deleted-rows entries older than the retention (a partitioned
/// DML statement, outside the batches' transactions).
pub fn prune_deleted_sql(deleted: &str, hours: u64) -> String {
    format!(
        "DELETE FROM {} WHERE deleted_at < TIMESTAMP_SUB(CURRENT_TIMESTAMP(), INTERVAL {hours} HOUR)",
        quote_ident(deleted)
    )
}

/// The columns of `table`, in table order (`COLUMN_NAME`, `SPANNER_TYPE`,
/// `IS_NULLABLE`).
pub fn columns_sql(table: &str) -> String {
    format!(
        "SELECT COLUMN_NAME, SPANNER_TYPE, IS_NULLABLE FROM INFORMATION_SCHEMA.COLUMNS \
         WHERE TABLE_SCHEMA = '' AND TABLE_NAME = {} ORDER BY ORDINAL_POSITION",
        quote_string(table)
    )
}

/// The primary key columns of `table`, in key order.
pub fn key_sql(table: &str) -> String {
    format!(
        "SELECT COLUMN_NAME FROM INFORMATION_SCHEMA.INDEX_COLUMNS WHERE TABLE_SCHEMA = '' AND TABLE_NAME = {} \
         AND INDEX_NAME = 'PRIMARY_KEY' ORDER BY ORDINAL_POSITION",
        quote_string(table)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rename_is_add_copy_drop_and_a_half_done_one_is_found() {
        use crate::sink::schema::TableShape;
        use tributary_schemas::{Column, DataType, TableId, TableSchema};
        let col = |n: &str, not_null| ShapeColumn { name: n.into(), ty: SpType::Int64, not_null };
        let steps = rename_steps("t", &col("d", true), "d2", &["id".into()]).unwrap();
        assert_eq!(steps.add, "ALTER TABLE `t` ADD COLUMN IF NOT EXISTS `d2` INT64");
        assert_eq!(steps.copy, "UPDATE `t` SET `d2` = `d` WHERE TRUE");
        assert_eq!(steps.not_null.as_deref(), Some("ALTER TABLE `t` ALTER COLUMN `d2` INT64 NOT NULL"));
        assert_eq!(steps.drop, "ALTER TABLE `t` DROP COLUMN `d`");
        let key = rename_steps("t", &col("id", true), "id2", &["id".into()]).err().unwrap();
        assert_eq!(key.class(), "spanner.rename_key_column");

        let mut d2 = Column::new("d2", DataType::Int64, true);
        d2.aliases = vec!["d".into()];
        let schema = TableSchema {
            id: TableId::new("s", "t"),
            columns: vec![Column::new("id", DataType::Int64, false), d2],
            key: vec!["id".into()],
            dropped: Vec::new(),
        };
        let shape = |names: &[&str]| TableShape {
            exists: true,
            columns: names.iter().map(|n| col(n, false)).collect(),
            primary_key: vec!["id".into()],
        };
        // Both columns: a crash between adding d2 and dropping d.
        assert_eq!(unfinished_rename(&schema, &shape(&["id", "d", "d2"])), Some(("d", "d2")));
        // Not started (the plan renames) or done.
        assert_eq!(unfinished_rename(&schema, &shape(&["id", "d"])), None);
        assert_eq!(unfinished_rename(&schema, &shape(&["id", "d2"])), None);
        // d is a column of the source again (added after the rename).
        let mut again = schema.clone();
        again.columns.push(Column::new("d", DataType::Int64, true));
        assert_eq!(unfinished_rename(&again, &shape(&["id", "d", "d2"])), None);
    }

    #[test]
    fn ddl_restates_types() {
        let shape = vec![ShapeColumn {
            name: "n".into(),
            ty: SpType::String(Some(10)),
            not_null: true,
        }];
        let widen = TableChange::Widen {
            column: "n".into(),
            from: SpType::String(Some(10)),
            to: SpType::String(None),
        };
        assert_eq!(
            change_ddl("t", &widen, &shape).unwrap(),
            vec!["ALTER TABLE `t` ALTER COLUMN `n` STRING(MAX) NOT NULL"]
        );
        let relax = TableChange::DropNotNull { column: "n".into() };
        assert_eq!(change_ddl("t", &relax, &shape).unwrap(), vec!["ALTER TABLE `t` ALTER COLUMN `n` STRING(10)"]);
        assert_eq!(
            truncate_older_sql("t", 5, 2),
            "DELETE FROM `t` WHERE (__tributary_commit < 5 OR (__tributary_commit = 5 AND __tributary_index < 2))"
        );
        assert_eq!(quote_string("a'b"), "'a\\'b'");
    }

    #[test]
    fn fits() {
        let d = SpannerDialect;
        assert_eq!(d.fit(&SpType::String(None), &SpType::Int64), Fit::Keep);
        assert_eq!(d.fit(&SpType::String(Some(3)), &SpType::String(None)), Fit::Widen(SpType::String(None)));
        assert_eq!(d.fit(&SpType::Int64, &SpType::Numeric), Fit::Incompatible);
    }
}

//! A captured table's objects besides its columns and key, read from
//! `information_schema` and stated as a PostgreSQL destination makes them
//! ([`TableObjects`], docs/migration.md): the part of MySQL's that maps.
//!
//! | MySQL / MariaDB | carried as |
//! |---|---|
//! | secondary index on whole columns (`BTREE`, `HASH`) | an index, named `<table>_<index>` (PostgreSQL's index names are per schema, MySQL's per table) |
//! | `UNIQUE` key | a unique index, same name |
//! | foreign key | a foreign key with its `ON UPDATE` / `ON DELETE` actions |
//! | `CHECK` | a check, when its expression is made of columns, literals, comparisons, `AND` / `OR` / `NOT`, `IN`, `BETWEEN`, `IS NULL`, arithmetic and the functions both systems read alike |
//! | literal default, `CURRENT_TIMESTAMP`, `CURRENT_DATE` | a default |
//! | `AUTO_INCREMENT` | an identity `BY DEFAULT` taking values from `<table>_<column>_seq` (moved past the source's counter at a cutover) |
//!
//! Not carried, each said in the log with its reason: prefix indexes
//! (`col(10)`), `FULLTEXT` and `SPATIAL` indexes, functional indexes,
//! expression defaults other than the two above, `ON UPDATE
//! CURRENT_TIMESTAMP` (a trigger in PostgreSQL), checks with other
//! functions or MySQL-only operators, and MariaDB's own `json_valid` check
//! of a `JSON` column (the destination's `jsonb` validates). Objects on a
//! column left out of the copy (`exclude_columns`) are not carried either.

use std::collections::BTreeMap;
use std::sync::Arc;

use mysql_async::prelude::Queryable;
use tributary_schemas::{
    ColumnDefault, ConstraintKind, ConstraintObject, DataType, ForeignKeyTarget, IndexObject, TableId, TableObjects,
    TableSchema,
};

use super::client::classify_my;
use super::ServerKind;
use crate::error::Result;

/// The longest identifier PostgreSQL keeps (bytes).
const MAX_NAME_BYTES: usize = 63;

/// What a read found.
#[derive(Debug, Default)]
pub struct Found {
    /// Each table's objects (every table asked, empty when it has none).
    pub objects: BTreeMap<TableId, TableObjects>,
    /// What a table has and a destination does not get, with why.
    pub not_carried: BTreeMap<TableId, Vec<String>>,
}

impl Found {
    fn skip(&mut self, table: &TableId, what: String) {
        self.not_carried.entry(table.clone()).or_default().push(what);
    }
}

/// One database's read: the session, the server, the tables asked and
/// what was found so far.
struct Reader<'a> {
    conn: &'a mut mysql_async::Conn,
    kind: ServerKind,
    db: &'a str,
    tables: &'a BTreeMap<TableId, Arc<TableSchema>>,
    found: &'a mut Found,
}

impl Reader<'_> {
    /// The rows of `sql`, asked with this database.
    async fn rows(&mut self, sql: &str, what: &str) -> Result<Vec<mysql_async::Row>> {
        self.conn
            .exec(sql, (self.db,))
            .await
            .map_err(|e| classify_my(e, &format!("reading the captured tables' {what}")))
    }
}

/// The objects of each of `tables` (announced shapes: objects on a column
/// they lack are not carried).
pub async fn read(
    conn: &mut mysql_async::Conn,
    kind: ServerKind,
    tables: &BTreeMap<TableId, Arc<TableSchema>>,
) -> Result<Found> {
    let mut found = Found {
        objects: tables.keys().map(|t| (t.clone(), TableObjects::default())).collect(),
        ..Found::default()
    };
    let databases: std::collections::BTreeSet<&str> = tables.keys().map(|t| t.schema.as_str()).collect();
    for db in databases {
        let mut r = Reader { conn, kind, db, tables, found: &mut found };
        indexes(&mut r).await?;
        foreign_keys(&mut r).await?;
        checks(&mut r).await?;
        defaults(&mut r).await?;
    }
    Ok(found)
}

/// Whether `schema` has every one of `columns`.
fn has_columns<'a>(schema: &TableSchema, mut columns: impl Iterator<Item = &'a str>) -> bool {
    columns.all(|c| schema.columns.iter().any(|col| col.name == c))
}

async fn indexes(q: &mut Reader<'_>) -> Result<()> {
    let (db, tables) = (q.db, q.tables);
    let rows = q
        .rows(
            "SELECT TABLE_NAME, INDEX_NAME, NON_UNIQUE, COLUMN_NAME, SUB_PART, COLLATION, INDEX_TYPE \
             FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = ? AND INDEX_NAME <> 'PRIMARY' \
             ORDER BY TABLE_NAME, INDEX_NAME, SEQ_IN_INDEX",
            "indexes",
        )
        .await?;
    // (table, index) -> unique, (column, descending) parts, why not carried
    type Index = (bool, Vec<(String, bool)>, Option<String>);
    let mut by_index: BTreeMap<(String, String), Index> = BTreeMap::new();
    for r in rows {
        let table: String = text(&r, 0);
        let index: String = text(&r, 1);
        let non_unique: i64 = r.get::<Option<i64>, _>(2).flatten().unwrap_or(1);
        let column: Option<String> = r.get::<Option<String>, _>(3).flatten();
        let sub_part: Option<i64> = r.get::<Option<i64>, _>(4).flatten();
        let descending = r.get::<Option<String>, _>(5).flatten().as_deref() == Some("D");
        let index_type: String = text(&r, 6);
        let entry = by_index.entry((table, index)).or_insert((non_unique == 0, Vec::new(), None));
        let why = match (&column, sub_part, index_type.as_str()) {
            (_, _, "FULLTEXT") => Some("a FULLTEXT index".to_string()),
            (_, _, "SPATIAL") => Some("a SPATIAL index".to_string()),
            (None, _, _) => Some("a functional index".to_string()),
            (Some(c), Some(n), _) => Some(format!("a prefix index ({c}({n}))")),
            _ => None,
        };
        match (why, column) {
            (Some(why), _) => entry.2 = entry.2.take().or(Some(why)),
            (None, Some(c)) => entry.1.push((c, descending)),
            (None, None) => {}
        }
    }
    for ((table, index), (unique, parts, why)) in by_index {
        let id = TableId::new(db, table);
        let Some(schema) = tables.get(&id) else { continue };
        if let Some(why) = why {
            q.found.skip(&id, format!("index {index}: {why}"));
            continue;
        }
        if !has_columns(schema, parts.iter().map(|(c, _)| c.as_str())) {
            q.found.skip(&id, format!("index {index}: on a column left out of the copy"));
            continue;
        }
        let name = truncated(&format!("{}_{index}", id.table));
        if let Some(objects) = q.found.objects.get_mut(&id) {
            objects.indexes.push(IndexObject {
                name,
                unique,
                definition: format!("({})", parts.iter().map(part).collect::<Vec<_>>().join(", ")),
            });
        }
    }
    Ok(())
}

async fn foreign_keys(q: &mut Reader<'_>) -> Result<()> {
    let (db, tables) = (q.db, q.tables);
    let rows = q
        .rows(
            "SELECT k.TABLE_NAME, k.CONSTRAINT_NAME, k.COLUMN_NAME, k.REFERENCED_TABLE_SCHEMA, \
                    k.REFERENCED_TABLE_NAME, k.REFERENCED_COLUMN_NAME, r.UPDATE_RULE, r.DELETE_RULE \
             FROM information_schema.KEY_COLUMN_USAGE k \
             JOIN information_schema.REFERENTIAL_CONSTRAINTS r ON r.CONSTRAINT_SCHEMA = k.CONSTRAINT_SCHEMA \
               AND r.CONSTRAINT_NAME = k.CONSTRAINT_NAME AND r.TABLE_NAME = k.TABLE_NAME \
             WHERE k.TABLE_SCHEMA = ? AND k.REFERENCED_TABLE_NAME IS NOT NULL \
             ORDER BY k.TABLE_NAME, k.CONSTRAINT_NAME, k.ORDINAL_POSITION",
            "foreign keys",
        )
        .await?;
    // (table, name) -> columns, target, referenced columns, update, delete
    type Key = (Vec<String>, TableId, Vec<String>, String, String);
    let mut keys: BTreeMap<(String, String), Key> = BTreeMap::new();
    for r in rows {
        let entry = keys.entry((text(&r, 0), text(&r, 1))).or_insert_with(|| {
            (Vec::new(), TableId::new(text(&r, 3), text(&r, 4)), Vec::new(), text(&r, 6), text(&r, 7))
        });
        entry.0.push(text(&r, 2));
        entry.2.push(text(&r, 5));
    }
    for ((table, name), (columns, target, referenced, on_update, on_delete)) in keys {
        let id = TableId::new(db, table);
        let Some(schema) = tables.get(&id) else { continue };
        if !has_columns(schema, columns.iter().map(String::as_str)) {
            q.found
                .skip(&id, format!("foreign key {name}: on a column left out of the copy"));
            continue;
        }
        let mut options = Vec::new();
        for (on, rule) in [("UPDATE", &on_update), ("DELETE", &on_delete)] {
            match rule.to_ascii_uppercase().as_str() {
                // InnoDB checks NO ACTION at once, as RESTRICT; PostgreSQL's
                // own NO ACTION (at the statement's end) is its default.
                "NO ACTION" | "" => {}
                r @ ("RESTRICT" | "CASCADE" | "SET NULL" | "SET DEFAULT") => options.push(format!("ON {on} {r}")),
                other => q
                    .found
                    .skip(&id, format!("foreign key {name}: ON {on} {other} (carried without it)")),
            }
        }
        let quoted: Vec<String> = columns.iter().map(|c| quote(c)).collect();
        if let Some(objects) = q.found.objects.get_mut(&id) {
            objects.constraints.push(ConstraintObject {
                name: truncated(&name),
                kind: ConstraintKind::ForeignKey,
                definition: format!("FOREIGN KEY ({})", quoted.join(", ")),
                references: Some(ForeignKeyTarget {
                    table: target,
                    columns: referenced,
                    options: options.join(" "),
                }),
            });
        }
    }
    Ok(())
}

async fn checks(q: &mut Reader<'_>) -> Result<()> {
    let (db, tables) = (q.db, q.tables);
    // MariaDB's check names are per table and its view says the table;
    // MySQL's are per database, found through TABLE_CONSTRAINTS.
    let sql = match q.kind {
        ServerKind::MariaDb => {
            "SELECT TABLE_NAME, CONSTRAINT_NAME, CHECK_CLAUSE, LEVEL FROM information_schema.CHECK_CONSTRAINTS \
             WHERE CONSTRAINT_SCHEMA = ? ORDER BY TABLE_NAME, CONSTRAINT_NAME"
        }
        ServerKind::MySql => {
            "SELECT t.TABLE_NAME, c.CONSTRAINT_NAME, c.CHECK_CLAUSE, 'Table' FROM information_schema.TABLE_CONSTRAINTS t \
             JOIN information_schema.CHECK_CONSTRAINTS c ON c.CONSTRAINT_SCHEMA = t.CONSTRAINT_SCHEMA \
               AND c.CONSTRAINT_NAME = t.CONSTRAINT_NAME \
             WHERE t.CONSTRAINT_TYPE = 'CHECK' AND t.TABLE_SCHEMA = ? ORDER BY 1, 2"
        }
    };
    let rows = q.rows(sql, "checks").await?;
    for r in rows {
        let id = TableId::new(db, text(&r, 0));
        let Some(schema) = tables.get(&id) else { continue };
        let (name, clause, level) = (text(&r, 1), text(&r, 2), text(&r, 3));
        if level == "Column" && clause.replace(' ', "") == format!("json_valid(`{name}`)") {
            continue;
        }
        let Some((expression, columns)) = expression(&clause) else {
            q.found
                .skip(&id, format!("check {name} ({clause}): an expression PostgreSQL does not read alike"));
            continue;
        };
        if !has_columns(schema, columns.iter().map(String::as_str)) {
            q.found.skip(&id, format!("check {name}: on a column left out of the copy"));
            continue;
        }
        if let Some(objects) = q.found.objects.get_mut(&id) {
            objects.constraints.push(ConstraintObject {
                name: truncated(&name),
                kind: ConstraintKind::Check,
                definition: format!("CHECK ({expression})"),
                references: None,
            });
        }
    }
    Ok(())
}

async fn defaults(q: &mut Reader<'_>) -> Result<()> {
    let (db, tables) = (q.db, q.tables);
    let rows = q
        .rows(
            "SELECT TABLE_NAME, COLUMN_NAME, COLUMN_DEFAULT, EXTRA FROM information_schema.COLUMNS \
             WHERE TABLE_SCHEMA = ? ORDER BY TABLE_NAME, ORDINAL_POSITION",
            "defaults",
        )
        .await?;
    for r in rows {
        let id = TableId::new(db, text(&r, 0));
        let Some(schema) = tables.get(&id) else { continue };
        let column = text(&r, 1);
        let Some(col) = schema.columns.iter().find(|c| c.name == column) else {
            continue;
        };
        let raw: Option<String> = r.get::<Option<String>, _>(2).flatten();
        let extra = text(&r, 3).to_ascii_lowercase();
        if extra.contains("generated") && !extra.contains("default_generated") || extra.contains("persistent") {
            // Computed: its values are copied.
            continue;
        }
        if extra.contains("on update") {
            q.found
                .skip(&id, format!("column {column}: ON UPDATE CURRENT_TIMESTAMP (a trigger in PostgreSQL)"));
        }
        if extra.contains("auto_increment") {
            match col.data_type {
                DataType::Int16 | DataType::Int32 | DataType::Int64 => {
                    if let Some(objects) = q.found.objects.get_mut(&id) {
                        objects.defaults.push(ColumnDefault {
                            column: column.clone(),
                            expression: String::new(),
                            sequence: Some(TableId::new(db, identity_sequence(&id.table, &column))),
                            identity_always: Some(false),
                        });
                    }
                }
                _ => q.found.skip(
                    &id,
                    format!(
                        "column {column}: AUTO_INCREMENT on {} (an identity is smallint, integer or bigint)",
                        col.source_type
                    ),
                ),
            }
            continue;
        }
        match default_expression(raw.as_deref(), &extra, q.kind, &col.data_type) {
            Ok(None) => {}
            Ok(Some(expression)) => {
                if let Some(objects) = q.found.objects.get_mut(&id) {
                    objects.defaults.push(ColumnDefault {
                        column,
                        expression,
                        sequence: None,
                        identity_always: None,
                    });
                }
            }
            Err(why) => q.found.skip(&id, format!("column {column}: default {why}")),
        }
    }
    Ok(())
}

/// The sequence an `AUTO_INCREMENT` column's identity takes values from in
/// a destination (PostgreSQL's own name for an identity's sequence).
pub fn identity_sequence(table: &str, column: &str) -> String {
    truncated(&format!("{table}_{column}_seq"))
}

/// Column `i` of `r` as text (empty when NULL).
fn text(r: &mysql_async::Row, i: usize) -> String {
    r.get::<Option<String>, _>(i).flatten().unwrap_or_default()
}

/// `name` in standard SQL quotes.
fn quote(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// An index's part: its column, quoted, and its order.
fn part((column, descending): &(String, bool)) -> String {
    if *descending {
        format!("{} DESC", quote(column))
    } else {
        quote(column)
    }
}

/// `name` cut to what PostgreSQL keeps, at a character's boundary.
fn truncated(name: &str) -> String {
    let mut end = name.len().min(MAX_NAME_BYTES);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    name[..end].to_string()
}

/// A column default as PostgreSQL reads it (`Ok(None)`: none); `Err` says
/// what it is when it does not map. MariaDB quotes a literal and prints
/// `NULL` for none; MySQL gives a literal's bare value and marks an
/// expression `DEFAULT_GENERATED`.
fn default_expression(
    raw: Option<&str>,
    extra: &str,
    kind: ServerKind,
    ty: &DataType,
) -> Result<Option<String>, String> {
    let Some(raw) = raw else { return Ok(None) };
    let literal = |value: &str| -> Result<Option<String>, String> {
        if value.starts_with("0000-00-00") {
            return Err(format!("'{value}' (a zero date, which PostgreSQL has not)"));
        }
        Ok(Some(match ty {
            DataType::Boolean => (if value == "0" { "false" } else { "true" }).to_string(),
            _ => format!("'{}'", value.replace('\'', "''")),
        }))
    };
    let expression = |e: &str| -> Result<Option<String>, String> {
        let lower = e.trim().trim_start_matches('(').trim_end_matches(')').to_ascii_lowercase();
        let name = lower.split('(').next().unwrap_or_default().trim();
        match name {
            "current_timestamp" | "now" | "localtimestamp" | "localtime" => Ok(Some("CURRENT_TIMESTAMP".into())),
            "curdate" | "current_date" => Ok(Some("CURRENT_DATE".into())),
            _ => match expression(e) {
                Some((sql, columns)) if columns.is_empty() => Ok(Some(sql)),
                _ => Err(format!("{e} (an expression PostgreSQL does not read alike)")),
            },
        }
    };
    match kind {
        ServerKind::MariaDb => {
            if raw.eq_ignore_ascii_case("NULL") {
                Ok(None)
            } else if let Some(quoted) = raw.strip_prefix('\'') {
                match string_literal(quoted) {
                    Some((value, "")) => literal(&value),
                    _ => Err(format!("{raw} (unreadable)")),
                }
            } else if is_number(raw) {
                literal(raw).map(|l| {
                    l.map(|l| {
                        if matches!(ty, DataType::Boolean) {
                            l
                        } else {
                            raw.to_string()
                        }
                    })
                })
            } else {
                expression(raw)
            }
        }
        ServerKind::MySql => {
            if extra.contains("default_generated") {
                expression(raw)
            } else {
                literal(raw)
            }
        }
    }
}

fn is_number(s: &str) -> bool {
    let s = s.strip_prefix('-').unwrap_or(s);
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_digit() || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-')
        && s.starts_with(|c: char| c.is_ascii_digit() || c == '.')
}

/// A MySQL string literal's value after its opening quote, and the text
/// after its closing one (`''` and backslash escapes read).
fn string_literal(after_quote: &str) -> Option<(String, &str)> {
    let mut value = String::new();
    let mut chars = after_quote.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        match c {
            '\'' if chars.peek().map(|(_, n)| *n) == Some('\'') => {
                chars.next();
                value.push('\'');
            }
            '\'' => return Some((value, &after_quote[i + 1..])),
            '\\' => match chars.next()?.1 {
                'n' => value.push('\n'),
                't' => value.push('\t'),
                'r' => value.push('\r'),
                '0' => return None,
                other => value.push(other),
            },
            c => value.push(c),
        }
    }
    None
}

/// Functions that mean the same in MySQL and PostgreSQL, as PostgreSQL
/// names them (MySQL's `length` counts bytes).
const FUNCTIONS: &[(&str, &str)] = &[
    ("char_length", "char_length"),
    ("character_length", "char_length"),
    ("octet_length", "octet_length"),
    ("length", "octet_length"),
    ("lower", "lower"),
    ("lcase", "lower"),
    ("upper", "upper"),
    ("ucase", "upper"),
    ("abs", "abs"),
    ("coalesce", "coalesce"),
    ("floor", "floor"),
    ("ceil", "ceil"),
    ("ceiling", "ceil"),
];

/// Words that read alike.
const KEYWORDS: &[&str] = &["and", "or", "not", "in", "is", "null", "between", "true", "false"];

/// A MySQL expression (a check's clause, a default) in PostgreSQL's
/// spelling, with the columns it names; `None` when any part of it may read
/// differently there (a function or operator not known to mean the same,
/// `LIKE`, whose case rules differ, a variable).
pub fn expression(mysql: &str) -> Option<(String, Vec<String>)> {
    let mut out = String::new();
    let mut columns = Vec::new();
    let s = mysql.trim();
    let mut i = 0;
    while i < s.len() {
        let rest = &s[i..];
        let c = rest.chars().next()?;
        if c.is_whitespace() {
            out.push(' ');
            i += c.len_utf8();
        } else if c == '`' {
            let mut name = String::new();
            let mut j = i + 1;
            loop {
                let ch = s[j..].chars().next()?;
                if ch == '`' {
                    if s[j + 1..].starts_with('`') {
                        name.push('`');
                        j += 2;
                        continue;
                    }
                    break;
                }
                name.push(ch);
                j += ch.len_utf8();
            }
            out.push_str(&quote(&name));
            columns.push(name);
            i = j + 1;
        } else if c == '\'' {
            let (value, after) = string_literal(&rest[1..])?;
            out.push_str(&format!("'{}'", value.replace('\'', "''")));
            i = s.len() - after.len();
        } else if c.is_ascii_digit() || (c == '.' && rest[1..].starts_with(|d: char| d.is_ascii_digit())) {
            let len = rest.find(|d: char| !(d.is_ascii_digit() || d == '.')).unwrap_or(rest.len());
            out.push_str(&rest[..len]);
            i += len;
        } else if c.is_ascii_alphabetic() || c == '_' {
            let len = rest
                .find(|d: char| !(d.is_ascii_alphanumeric() || d == '_' || d == '$'))
                .unwrap_or(rest.len());
            let word = rest[..len].to_ascii_lowercase();
            let after = rest[len..].trim_start();
            i += len;
            if word.starts_with('_') && after.starts_with('\'') && rest[len..].starts_with('\'') {
                // A character set introducer (`_utf8mb4'x'`).
                continue;
            }
            if KEYWORDS.contains(&word.as_str()) {
                out.push_str(&word.to_ascii_uppercase());
            } else if after.starts_with('(') {
                let (_, pg) = FUNCTIONS.iter().find(|(my, _)| *my == word)?;
                out.push_str(pg);
            } else {
                return None;
            }
        } else {
            let op = [
                "<=>", "<>", "!=", "<=", ">=", "=", "<", ">", "+", "-", "*", "/", "%", "(", ")", ",",
            ]
            .into_iter()
            .find(|op| rest.starts_with(op))?;
            if op == "<=>" {
                return None;
            }
            out.push_str(op);
            i += op.len();
        }
    }
    Some((out, columns))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expressions_that_read_alike_are_carried_and_the_others_not() {
        assert_eq!(
            expression("`qty` > 0 and `qty` <= 1000").map(|(s, _)| s),
            Some("\"qty\" > 0 AND \"qty\" <= 1000".into())
        );
        assert_eq!(
            expression("(`status` in (_utf8mb4'new',_utf8mb4'paid'))"),
            Some(("(\"status\" IN ('new','paid'))".into(), vec!["status".to_string()]))
        );
        assert_eq!(
            expression("char_length(`code`) = 3 or `code` is null").map(|(s, _)| s),
            Some("char_length(\"code\") = 3 OR \"code\" IS NULL".into())
        );
        assert_eq!(expression("length(`a`) < 10").map(|(s, _)| s), Some("octet_length(\"a\") < 10".into()));
        assert_eq!(expression("'it\\'s' <> `a`").map(|(s, _)| s), Some("'it''s' <> \"a\"".into()));
        assert_eq!(expression("`a` like 'x%'"), None);
        assert_eq!(expression("`a` regexp '^x'"), None);
        assert_eq!(expression("`a` <=> `b`"), None);
        assert_eq!(expression("json_valid(`doc`)"), None);
        assert_eq!(expression("`a` || `b`"), None);
        assert_eq!(expression("@x > 1"), None);
    }

    #[test]
    fn defaults_map_literals_and_the_current_time_and_say_the_rest() {
        let maria = |raw: &str, ty: DataType| default_expression(Some(raw), "", ServerKind::MariaDb, &ty);
        assert_eq!(maria("NULL", DataType::Text), Ok(None));
        assert_eq!(maria("'it''s'", DataType::Text), Ok(Some("'it''s'".into())));
        assert_eq!(maria("7", DataType::Int32), Ok(Some("7".into())));
        assert_eq!(maria("-1.5", DataType::Float64), Ok(Some("-1.5".into())));
        assert_eq!(maria("1", DataType::Boolean), Ok(Some("true".into())));
        assert_eq!(maria("current_timestamp()", DataType::Text), Ok(Some("CURRENT_TIMESTAMP".into())));
        assert_eq!(maria("current_timestamp(3)", DataType::Text), Ok(Some("CURRENT_TIMESTAMP".into())));
        assert_eq!(maria("curdate()", DataType::Text), Ok(Some("CURRENT_DATE".into())));
        assert!(maria("'0000-00-00'", DataType::Text).is_err());
        assert!(maria("uuid()", DataType::Text).is_err());
        assert_eq!(maria("(1 + 2)", DataType::Int32), Ok(Some("(1 + 2)".into())));
        let mysql = |raw: &str, extra: &str| default_expression(Some(raw), extra, ServerKind::MySql, &DataType::Text);
        assert_eq!(mysql("new", ""), Ok(Some("'new'".into())));
        assert_eq!(mysql("CURRENT_TIMESTAMP", "default_generated"), Ok(Some("CURRENT_TIMESTAMP".into())));
        assert!(mysql("(rand())", "default_generated").is_err());
        assert_eq!(default_expression(None, "", ServerKind::MySql, &DataType::Text), Ok(None));
    }

    #[test]
    fn names_are_cut_to_what_postgresql_keeps() {
        assert_eq!(truncated("short"), "short");
        let long = "é".repeat(40);
        assert!(truncated(&long).len() <= MAX_NAME_BYTES);
        assert!(truncated(&long).chars().all(|c| c == 'é'));
        assert_eq!(identity_sequence("orders", "id"), "orders_id_seq");
    }
}

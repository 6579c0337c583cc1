//! Local schema-evolution rules: whether a table's new shape can be read by
//! consumers of the old one (Avro BACKWARD compatibility) *and* means the
//! same thing.
//!
//! The registry's Avro check alone is not enough: it ignores logical types,
//! so it would accept a decimal whose scale changed (old bytes would then be
//! read ten or a hundred times too big) or a date column turned into a
//! timestamp. We refuse those before anything is produced.

use crate::model::{Column, DataType, TableSchema};

/// A column the new schema cannot take over from the old one, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The column.
    pub column: String,
    /// Why (names types, never values).
    pub reason: String,
}

/// Checks that `new` columns can replace `old` ones under BACKWARD rules:
/// new columns must be nullable or carry a default (the value a reader
/// gives events written before them), existing columns may only widen
/// their type or become nullable. Dropped columns are fine.
pub fn check(old: &[Column], new: &[Column]) -> Vec<Violation> {
    let mut out = Vec::new();
    for c in new {
        match old.iter().find(|o| o.name == c.name) {
            None if !c.nullable && c.default.is_none() => out.push(Violation {
                column: c.name.clone(),
                reason: format!("new NOT NULL column of type {} has no default", c.data_type),
            }),
            None => {}
            Some(o) => {
                if !widens(&o.data_type, &c.data_type) {
                    out.push(Violation {
                        column: c.name.clone(),
                        reason: format!("type changed from {} to {}", o.data_type, c.data_type),
                    });
                }
                if o.nullable && !c.nullable {
                    out.push(Violation {
                        column: c.name.clone(),
                        reason: "column became NOT NULL".into(),
                    });
                }
            }
        }
    }
    out
}

/// The shape to register for a table whose previous registered shape had
/// `old` columns and whose source now has `new`: what stays readable by
/// consumers of `old` without refusing the change.
///
/// - a new NOT NULL column without a carried default is written as optional
///   (events before it have no value for it);
/// - a column that became NOT NULL stays optional (its values are simply
///   never null);
/// - a column whose type narrowed (`bigint` to `int`, `numeric(12,2)` to
///   `numeric(8,2)`, `text` to an enum) keeps the wider type, and its
///   values are written in it;
/// - the columns `old` has and `new` has not, under their name or an alias,
///   are recorded as dropped (`TableSchema::dropped`);
/// - a column of a new name with the `column_id` of an old column that is
///   gone is that column renamed: it gets the old name as an alias, and
///   every column keeps the aliases it had in `old`.
///
/// The columns left are the ones no shape can carry over (`int` to `text`,
/// a decimal's scale): the returned violations.
pub fn relax(old: &[Column], new: &TableSchema) -> (TableSchema, Vec<Violation>) {
    let mut written = new.clone();
    let mut violations = Vec::new();
    for c in &mut written.columns {
        let same_name = old.iter().find(|o| o.name == c.name);
        // A column of a new name with the identity of one that is gone was
        // renamed (found here, not only by the source, so that a restart
        // between the rename and its first event still finds it).
        let renamed_from = match (same_name, c.column_id) {
            (None, Some(id)) => old
                .iter()
                .find(|o| o.column_id == Some(id) && new.column_index(&o.name).is_none()),
            _ => None,
        };
        // Aliases stay on the column from version to version: a source that
        // restarted no longer knows them, and the shape stays the one
        // registered.
        let mut aliases: Vec<String> = Vec::new();
        if let Some(o) = same_name.or(renamed_from) {
            aliases.extend(o.aliases.iter().cloned());
        }
        if let Some(o) = renamed_from {
            aliases.push(o.name.clone());
        }
        for a in std::mem::take(&mut c.aliases) {
            aliases.push(a);
        }
        let mut unique: Vec<String> = Vec::with_capacity(aliases.len());
        for a in aliases {
            if a != c.name && !unique.contains(&a) {
                unique.push(a);
            }
        }
        c.aliases = unique;
        match same_name {
            None => {
                if !c.nullable && c.default.is_none() {
                    c.nullable = true;
                }
            }
            Some(o) => {
                if !widens(&o.data_type, &c.data_type) {
                    if widens(&c.data_type, &o.data_type) {
                        let keeps = c
                            .default
                            .as_deref()
                            .and_then(|d| serde_json::from_str(d).ok())
                            .is_some_and(|d| crate::defaults::carries_over(&c.data_type, &o.data_type, &d));
                        if !keeps {
                            c.default = None;
                        }
                        c.data_type = o.data_type.clone();
                        c.source_type = o.source_type.clone();
                    } else {
                        violations.push(Violation {
                            column: c.name.clone(),
                            reason: format!("type changed from {} to {}", o.data_type, c.data_type),
                        });
                    }
                }
                if o.nullable {
                    c.nullable = true;
                }
            }
        }
    }
    // The columns this version no longer has (a renamed one lives on
    // under its new name): a sink told to drop dropped columns drops these.
    written.dropped = old
        .iter()
        .filter(|o| {
            written.column_index(&o.name).is_none() && !written.columns.iter().any(|c| c.aliases.contains(&o.name))
        })
        .map(|o| o.name.clone())
        .collect();
    (written, violations)
}

/// Names of the columns that differ between two shapes (added, dropped or
/// changed), for an error when the registry refuses without saying why.
pub fn changed_columns(old: &[Column], new: &[Column]) -> Vec<String> {
    let mut out: Vec<String> = new
        .iter()
        .filter(|c| old.iter().find(|o| o.name == c.name) != Some(*c))
        .map(|c| c.name.clone())
        .collect();
    out.extend(
        old.iter()
            .filter(|o| !new.iter().any(|c| c.name == o.name))
            .map(|o| o.name.clone()),
    );
    out
}

/// Whether every value of `old` is a value of `new` with the same meaning,
/// and Avro's schema resolution reads old data with the new schema.
pub fn widens(old: &DataType, new: &DataType) -> bool {
    use DataType as D;
    if old == new {
        return true;
    }
    match (old, new) {
        (D::Int16, D::Int32 | D::Int64 | D::Float32 | D::Float64) => true,
        (D::Int32, D::Int64 | D::Float64) => true,
        (D::Float32, D::Float64) => true,
        // A time of day is a span of the same microseconds (a MySQL TIME
        // topic registered before spans had their own type).
        (D::Time, D::TimeSpan) => true,
        (D::Decimal { precision: p1, scale: s1 }, D::Decimal { precision: p2, scale: s2 }) => s1 == s2 && p2 >= p1,
        (D::Enum { symbols: a }, D::Enum { symbols: b }) => a.iter().all(|s| b.contains(s)),
        (D::Enum { .. } | D::Json | D::Uuid, D::Text) => true,
        (D::Array(a), D::Array(b)) => widens(a, b),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{TableId, Value};

    #[test]
    fn relaxing_keeps_what_old_readers_can_read() {
        let old = vec![
            col("id", DataType::Int64, false),
            col("n", DataType::Text, true),
            col("amount", DataType::Decimal { precision: 12, scale: 2 }, true),
            col("code", DataType::Int32, false),
        ];
        let new = TableSchema {
            id: TableId::new("s", "t"),
            columns: vec![
                col("id", DataType::Int32, false),
                col("n", DataType::Text, false),
                col("amount", DataType::Decimal { precision: 8, scale: 2 }, true),
                col("code", DataType::Text, false),
                col("must", DataType::Boolean, false),
                col("flag", DataType::Boolean, false).with_default(&Value::Boolean(true)),
            ],
            key: vec!["id".into()],
            dropped: Vec::new(),
        };
        let (written, violations) = relax(&old, &new);
        let shape: Vec<(String, String, bool)> = written
            .columns
            .iter()
            .map(|c| (c.name.clone(), c.data_type.to_string(), c.nullable))
            .collect();
        let expect = [
            ("id", "int64", false),
            ("n", "text", true),
            ("amount", "decimal(12,2)", true),
            ("code", "text", false),
            ("must", "boolean", true),
            ("flag", "boolean", false),
        ];
        assert_eq!(shape, expect.map(|(a, b, c)| (a.to_string(), b.to_string(), c)).to_vec());
        assert_eq!(violations.iter().map(|v| v.column.as_str()).collect::<Vec<_>>(), ["code"]);
        // What is left after relaxing passes the check, but for the type change.
        let left = check(&old, &written.columns);
        assert_eq!(left.iter().map(|v| v.column.as_str()).collect::<Vec<_>>(), ["code"]);
    }

    fn col(name: &str, data_type: DataType, nullable: bool) -> Column {
        Column::new(name, data_type, nullable)
    }

    #[test]
    fn adding_nullable_and_widening_pass() {
        let old = vec![col("id", DataType::Int32, false), col("gone", DataType::Text, false)];
        let new = vec![col("id", DataType::Int64, false), col("note", DataType::Text, true)];
        assert!(check(&old, &new).is_empty());
    }

    #[test]
    fn narrowing_and_not_null_additions_fail() {
        let old = vec![
            col("id", DataType::Int64, false),
            col("amount", DataType::Decimal { precision: 10, scale: 2 }, true),
            col("n", DataType::Text, true),
        ];
        let new = vec![
            col("id", DataType::Int32, false),
            col("amount", DataType::Decimal { precision: 12, scale: 3 }, true),
            col("n", DataType::Text, false),
            col("must", DataType::Boolean, false),
        ];
        let v = check(&old, &new);
        let names: Vec<&str> = v.iter().map(|v| v.column.as_str()).collect();
        assert_eq!(names, ["id", "amount", "n", "must"]);
    }

    #[test]
    fn renames_are_found_by_identity_and_aliases_stay() {
        let with_id = |name: &str, id: u64| {
            let mut c = col(name, DataType::Int32, true);
            c.column_id = Some(id);
            c
        };
        let old = vec![with_id("id", 1), with_id("d", 4), with_id("b", 2)];
        let table = |columns: Vec<Column>| TableSchema {
            id: TableId::new("s", "t"),
            columns,
            key: vec!["id".into()],
            dropped: Vec::new(),
        };
        // RENAME COLUMN d TO d2 (same attnum), DROP COLUMN b.
        let (written, violations) = relax(&old, &table(vec![with_id("id", 1), with_id("d2", 4)]));
        assert!(violations.is_empty());
        assert_eq!(written.columns[1].aliases, vec!["d".to_string()]);
        assert_eq!(written.dropped, vec!["b".to_string()], "d was renamed, not dropped");
        // The next version, from a source that no longer knows the alias,
        // keeps it; a column added again under the old name gets none.
        let (next, _) = relax(&written.columns, &table(vec![with_id("id", 1), with_id("d2", 4), with_id("d", 5)]));
        assert_eq!(next.columns[1].aliases, vec!["d".to_string()]);
        assert!(next.columns[2].aliases.is_empty());
        assert!(next.dropped.is_empty());
        // Without identities, a new name is a new column.
        let (plain, _) = relax(
            &[col("id", DataType::Int32, false), col("d", DataType::Int32, true)],
            &table(vec![col("id", DataType::Int32, false), col("d2", DataType::Int32, true)]),
        );
        assert!(plain.columns[1].aliases.is_empty());
        assert_eq!(plain.dropped, vec!["d".to_string()]);
    }
}

//! Local schema-evolution rules: whether a table's new shape can be read by
//! consumers of the old one (Avro BACKWARD compatibility) *and* means the
//! same thing.
//!
//! The registry's Avro check alone is not enough: it ignores logical types,
//! so it would accept a decimal whose scale changed (old bytes would then be
//! read ten or a hundred times too big) or a date column turned into a
//! timestamp. We refuse those before anything is produced.

use crate::model::{Column, DataType};

/// A column the new schema cannot take over from the old one, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The column.
    pub column: String,
    /// Why (names types, never values).
    pub reason: String,
}

/// Checks that `new` columns can replace `old` ones under BACKWARD rules:
/// new columns must be nullable (their default is null), existing columns
/// may only widen their type or become nullable. Dropped columns are fine.
pub fn check(old: &[Column], new: &[Column]) -> Vec<Violation> {
    let mut out = Vec::new();
    for c in new {
        match old.iter().find(|o| o.name == c.name) {
            None if !c.nullable => out.push(Violation {
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
}

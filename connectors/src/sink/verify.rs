//! Verification on the sink's side: a key range the source read at one
//! point of the stream ([`VerifyRange`]: its rows' digests) against the
//! destination's rows of the same range, read back at the same point (the
//! sink runner starts a batch at each verify record, and compares before
//! applying it). The comparison is the same for every destination; each
//! one only reads its rows back as the model's values
//! ([`super::warehouse::Warehouse::read_range`]). See docs/verification.md.

use std::cmp::Ordering;
use std::collections::HashMap;

use tributary_schemas::canonical::{self, RowDigest};
use tributary_schemas::records::VerifyRange;
use tributary_schemas::{Position, Row, TableId, TableSchema, Value};

use crate::error::{Error, Result};

/// How many differing keys an outcome names; the counts cover them all.
pub const MAX_NAMED_DIFFERENCES: usize = 100;

/// A key range as a destination's query bounds it: the key's values,
/// in key order.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyRange {
    /// Rows whose key is greater (none: from the first).
    pub after: Option<Vec<Value>>,
    /// Rows whose key is at most this (none: to the last).
    pub until: Option<Vec<Value>>,
}

impl KeyRange {
    /// The bounds of `range` as values of `schema`'s key columns, or why
    /// they cannot bound a query (a key type that does not order the same
    /// way everywhere).
    pub fn of(schema: &TableSchema, range: &VerifyRange) -> std::result::Result<Self, String> {
        let keys = schema.key_indexes();
        if keys.is_empty() || keys.len() != schema.key.len() {
            return Err("the table has no key".into());
        }
        for &k in &keys {
            let c = &schema.columns[k];
            if !canonical::orders_everywhere(&c.data_type) {
                return Err(format!(
                    "its key column {} is of type {}, whose order differs between databases",
                    c.name, c.data_type
                ));
            }
        }
        let values = |bound: &Option<Vec<Option<String>>>| -> std::result::Result<Option<Vec<Value>>, String> {
            let Some(texts) = bound else { return Ok(None) };
            if texts.len() != keys.len() {
                return Err(format!("a bound has {} values for {} key columns", texts.len(), keys.len()));
            }
            keys.iter()
                .zip(texts)
                .map(|(&k, t)| {
                    let c = &schema.columns[k];
                    canonical::key_value(&c.data_type, t.as_deref())
                        .ok_or_else(|| format!("a bound of key column {} is not a {}", c.name, c.data_type))
                })
                .collect::<std::result::Result<Vec<Value>, String>>()
                .map(Some)
        };
        Ok(Self {
            after: values(&range.after)?,
            until: values(&range.until)?,
        })
    }
}

impl KeyRange {
    /// The range as an SQL condition for a destination without row-value
    /// comparison: the key compared lexicographically, `a1 < k1 OR (k1 =
    /// a1 AND a2 < k2)`, so that a range of a composite key is read as the
    /// source reads it. `columns` are the key columns' SQL expressions in
    /// key order; `literal` renders a bound's value for the key column at
    /// that position (the caller's literal syntax and text ordering).
    /// `None` for the whole table. A NULL bound is an error: verified keys
    /// are the source's primary keys.
    pub fn condition(
        &self,
        columns: &[String],
        literal: &mut dyn FnMut(usize, &Value) -> std::result::Result<String, String>,
    ) -> std::result::Result<Option<String>, String> {
        let mut bounds = Vec::with_capacity(2);
        if let Some(after) = &self.after {
            bounds.push(lexicographic(columns, after, ">", ">", literal)?);
        }
        if let Some(until) = &self.until {
            bounds.push(lexicographic(columns, until, "<", "<=", literal)?);
        }
        Ok((!bounds.is_empty()).then(|| bounds.join(" AND ")))
    }
}

/// `key <op> bound` over the key's columns one by one: each disjunct equal
/// on a prefix and `op` on the next column, `last_op` on the last one.
fn lexicographic(
    columns: &[String],
    bound: &[Value],
    op: &str,
    last_op: &str,
    literal: &mut dyn FnMut(usize, &Value) -> std::result::Result<String, String>,
) -> std::result::Result<String, String> {
    if columns.len() != bound.len() || columns.is_empty() {
        return Err(format!("a bound has {} values for {} key columns", bound.len(), columns.len()));
    }
    let mut literals = Vec::with_capacity(bound.len());
    for (i, v) in bound.iter().enumerate() {
        if matches!(v, Value::Null) {
            return Err(format!("a bound of key column {} is NULL", columns[i]));
        }
        literals.push(literal(i, v)?);
    }
    let disjuncts: Vec<String> = (0..columns.len())
        .map(|i| {
            let op = if i + 1 == columns.len() { last_op } else { op };
            let mut terms: Vec<String> = (0..i).map(|j| format!("{} = {}", columns[j], literals[j])).collect();
            terms.push(format!("{} {op} {}", columns[i], literals[i]));
            terms.join(" AND ")
        })
        .collect();
    Ok(if disjuncts.len() == 1 {
        disjuncts.concat()
    } else {
        format!("(({}))", disjuncts.join(") OR ("))
    })
}

impl KeyRange {
    /// Whether a key (its values in key order) is in the range, ordered as
    /// every destination orders the key's types (see
    /// [`canonical::orders_everywhere`]). For destinations that filter in
    /// memory.
    pub fn contains(&self, key: &[Value]) -> bool {
        self.after.as_ref().is_none_or(|a| compare_keys(key, a) == Ordering::Greater)
            && self.until.as_ref().is_none_or(|u| compare_keys(key, u) != Ordering::Greater)
    }
}

/// Two keys in the order every destination gives them: numbers by value,
/// text and bytes by their bytes, NULL first.
pub fn compare_keys(a: &[Value], b: &[Value]) -> Ordering {
    for (x, y) in a.iter().zip(b) {
        let o = compare_values(x, y);
        if o != Ordering::Equal {
            return o;
        }
    }
    a.len().cmp(&b.len())
}

fn compare_values(a: &Value, b: &Value) -> Ordering {
    fn int(v: &Value) -> Option<i128> {
        Some(match v {
            Value::Int16(i) => i128::from(*i),
            Value::Int32(i) => i128::from(*i),
            Value::Int64(i) => i128::from(*i),
            Value::Date(i) => i128::from(*i),
            Value::Time(i) | Value::Timestamp(i) | Value::TimestampTz(i) => i128::from(*i),
            _ => return None,
        })
    }
    match (a, b) {
        (Value::Null, Value::Null) => Ordering::Equal,
        (Value::Null, _) => Ordering::Less,
        (_, Value::Null) => Ordering::Greater,
        (Value::Decimal(x), Value::Decimal(y)) => compare_decimals(x, y),
        (Value::Boolean(x), Value::Boolean(y)) => x.cmp(y),
        (Value::Uuid(x), Value::Uuid(y)) => x.as_bytes().cmp(y.as_bytes()),
        (Value::Bytes(x), Value::Bytes(y)) => x.cmp(y),
        (Value::Text(x) | Value::Enum(x), Value::Text(y) | Value::Enum(y)) => x.as_bytes().cmp(y.as_bytes()),
        _ => match (int(a), int(b)) {
            (Some(x), Some(y)) => x.cmp(&y),
            _ => Ordering::Equal,
        },
    }
}

/// Two decimals' texts by value.
fn compare_decimals(a: &str, b: &str) -> Ordering {
    let parts = |t: &str| {
        let t = canonical::canonical_text(&tributary_schemas::DataType::VariableDecimal, &Value::Decimal(t.into()))
            .unwrap_or_default();
        let (negative, digits) = t.strip_prefix('-').map_or((false, t.clone()), |d| (true, d.to_string()));
        let (int, frac) = digits
            .split_once('.')
            .map_or((digits.clone(), String::new()), |(i, f)| (i.into(), f.into()));
        (negative, int, frac)
    };
    let (an, ai, af) = parts(a);
    let (bn, bi, bf) = parts(b);
    let magnitude = ai.len().cmp(&bi.len()).then_with(|| ai.cmp(&bi)).then_with(|| af.cmp(&bf));
    match (an, bn) {
        (false, false) => magnitude,
        (true, true) => magnitude.reverse(),
        (true, false) => Ordering::Less,
        (false, true) => Ordering::Greater,
    }
}

/// How one key differs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DifferenceKind {
    /// The source has the row, the destination does not.
    Missing,
    /// The destination has a row the source does not.
    Extra,
    /// Both have it, with other values in these columns (empty: the
    /// columns' fingerprints agree, the row's hash does not).
    Changed(Vec<String>),
}

/// One key that differs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Difference {
    /// The key's canonical texts as a JSON array.
    pub key: String,
    /// How.
    pub kind: DifferenceKind,
}

impl std::fmt::Display for Difference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            DifferenceKind::Missing => write!(f, "key {}: missing in the destination", self.key),
            DifferenceKind::Extra => write!(f, "key {}: in the destination only", self.key),
            DifferenceKind::Changed(columns) if columns.is_empty() => {
                write!(f, "key {}: differs", self.key)
            }
            DifferenceKind::Changed(columns) => write!(f, "key {}: differs in {}", self.key, columns.join(", ")),
        }
    }
}

/// What comparing one range found.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// The table.
    pub table: TableId,
    /// The verification's id.
    pub id: u64,
    /// The source position of the range.
    pub at: Position,
    /// Whether it is the verification's last range of the table.
    pub last: bool,
    /// Rows of the range at the source.
    pub rows: u64,
    /// Keys that differ, in all.
    pub differing: u64,
    /// The first [`MAX_NAMED_DIFFERENCES`] of them.
    pub differences: Vec<Difference>,
    /// Why the range could not be compared, when it could not.
    pub unsupported: Option<String>,
}

impl Outcome {
    fn of(schema: &TableSchema, range: &VerifyRange) -> Self {
        Self {
            table: schema.id.clone(),
            id: range.id,
            at: range.at,
            last: range.last,
            rows: range.rows.len() as u64,
            differing: 0,
            differences: Vec::new(),
            unsupported: None,
        }
    }

    /// A range the destination could not compare, and why.
    pub fn unsupported(schema: &TableSchema, range: &VerifyRange, why: impl Into<String>) -> Self {
        Self {
            unsupported: Some(why.into()),
            ..Self::of(schema, range)
        }
    }

    /// Whether the range is equal in the destination.
    pub fn equal(&self) -> bool {
        self.unsupported.is_none() && self.differing == 0
    }
}

/// Compares the source's digests of `range` with the destination's `rows`
/// of the range (the values of `schema`'s columns, in order).
pub fn compare(schema: &TableSchema, range: &VerifyRange, rows: &[Row]) -> Result<Outcome> {
    let source = range
        .digests()
        .map_err(|e| Error::permanent(format!("the verify record is unreadable: {e}")).with_table(schema.id.clone()))?;
    let mut outcome = Outcome::of(schema, range);
    let mut destination: HashMap<String, RowDigest> = HashMap::with_capacity(rows.len());
    for row in rows {
        let d = canonical::digest_row(schema, row);
        destination.insert(d.key.clone(), d);
    }
    let note = |outcome: &mut Outcome, key: &str, kind: DifferenceKind| {
        outcome.differing += 1;
        if outcome.differences.len() < MAX_NAMED_DIFFERENCES {
            outcome.differences.push(Difference { key: key.to_string(), kind });
        }
    };
    for s in &source {
        match destination.remove(&s.key) {
            None => note(&mut outcome, &s.key, DifferenceKind::Missing),
            Some(d) if d.hash == s.hash => {}
            Some(d) => {
                let columns = schema
                    .columns
                    .iter()
                    .zip(s.columns.iter().zip(&d.columns))
                    .filter(|(_, (a, b))| a != b)
                    .map(|(c, _)| c.name.clone())
                    .collect();
                note(&mut outcome, &s.key, DifferenceKind::Changed(columns));
            }
        }
    }
    let mut extra: Vec<String> = destination.into_keys().collect();
    extra.sort();
    for key in extra {
        note(&mut outcome, &key, DifferenceKind::Extra);
    }
    Ok(outcome)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tributary_schemas::records::VerifyRange;
    use tributary_schemas::{Column, DataType};

    fn schema() -> TableSchema {
        let col = |name: &str, data_type: DataType| Column {
            name: name.into(),
            data_type,
            nullable: true,
            source_type: String::new(),
            default: None,
            aliases: Vec::new(),
            column_id: None,
        };
        TableSchema {
            id: TableId::new("public", "t"),
            columns: vec![
                col("id", DataType::Int32),
                col("name", DataType::Text),
                col("qty", DataType::Int64),
            ],
            key: vec!["id".into()],
            dropped: Vec::new(),
        }
    }

    fn row(id: i32, name: &str, qty: i64) -> Row {
        vec![Value::Int32(id), Value::Text(name.into()), Value::Int64(qty)]
    }

    #[test]
    fn every_kind_of_difference_is_named_and_nothing_else() {
        let s = schema();
        let source = [row(1, "a", 1), row(2, "b", 2), row(3, "c", 3)];
        let range = VerifyRange {
            id: 1,
            at: Position { commit: 5, index: 0 },
            schema_id: 1,
            key_schema_id: None,
            after: None,
            until: Some(vec![Some("9".into())]),
            last: true,
            rows: source
                .iter()
                .map(|r| VerifyRange::entry(&canonical::digest_row(&s, r)))
                .collect(),
        };
        // Read back as other widths (an int64 key, a decimal count): equal.
        let same: Vec<Row> = source
            .iter()
            .map(|r| {
                let mut r = r.clone();
                if let Value::Int32(k) = r[0] {
                    r[0] = Value::Int64(i64::from(k));
                }
                r
            })
            .collect();
        assert!(compare(&s, &range, &same).expect("compared").equal());
        let dest = vec![row(1, "a", 1), row(2, "b", 20), row(4, "d", 4)];
        let outcome = compare(&s, &range, &dest).expect("compared");
        assert_eq!(outcome.differing, 3);
        assert_eq!(
            outcome.differences,
            vec![
                Difference {
                    key: r#"["2"]"#.into(),
                    kind: DifferenceKind::Changed(vec!["qty".into()])
                },
                Difference {
                    key: r#"["3"]"#.into(),
                    kind: DifferenceKind::Missing
                },
                Difference {
                    key: r#"["4"]"#.into(),
                    kind: DifferenceKind::Extra
                },
            ]
        );
        let bounds = KeyRange::of(&s, &range).expect("bounds");
        assert_eq!(bounds.until, Some(vec![Value::Int32(9)]));
    }

    #[test]
    fn a_range_is_a_lexicographic_condition() {
        let mut literal = |_: usize, v: &Value| -> std::result::Result<String, String> {
            Ok(match v {
                Value::Int32(i) => i.to_string(),
                Value::Text(t) => format!("'{t}'"),
                _ => return Err("no literal".into()),
            })
        };
        let one = ["id".to_string()];
        let range = KeyRange {
            after: Some(vec![Value::Int32(3)]),
            until: Some(vec![Value::Int32(9)]),
        };
        assert_eq!(range.condition(&one, &mut literal).unwrap().as_deref(), Some("id > 3 AND id <= 9"));
        let whole = KeyRange { after: None, until: None };
        assert_eq!(whole.condition(&one, &mut literal).unwrap(), None);
        let two = ["a".to_string(), "b".to_string()];
        let range = KeyRange {
            after: Some(vec![Value::Int32(1), Value::Text("x".into())]),
            until: Some(vec![Value::Int32(2), Value::Text("y".into())]),
        };
        assert_eq!(
            range.condition(&two, &mut literal).unwrap().as_deref(),
            Some("((a > 1) OR (a = 1 AND b > 'x')) AND ((a < 2) OR (a = 2 AND b <= 'y'))")
        );
        let null = KeyRange { after: Some(vec![Value::Null]), until: None };
        assert!(null.condition(&one, &mut literal).is_err());
    }
}

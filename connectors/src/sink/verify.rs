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
use tributary_schemas::records::requests::KeyBounds;
use tributary_schemas::records::{RangePartition, VerifyRange};
use tributary_schemas::{Position, Row, TableId, TableSchema, Value};

use crate::error::{Error, Result};
use crate::sink::bookkeeping::PositionSyntax;

/// How many differing keys of a range are logged; the counts cover them
/// all.
pub const MAX_LOGGED_DIFFERENCES: usize = 100;

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
        Self::between(schema, &range.after, &range.until)
    }

    /// The range after `after` up to `until` (canonical key texts, as a
    /// [`VerifyRange`]'s bounds), as [`KeyRange::of`].
    pub fn between(
        schema: &TableSchema,
        after: &Option<Vec<Option<String>>>,
        until: &Option<Vec<Option<String>>>,
    ) -> std::result::Result<Self, String> {
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
        Ok(Self { after: values(after)?, until: values(until)? })
    }
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

impl KeyRange {
    /// The SQL condition bounding the range over a key whose columns are
    /// `keys` (SQL expressions, in key order), each bound's values given as
    /// SQL literals by `literal` (`Err`: a value the dialect cannot write);
    /// `None` for a range without bounds. Composite keys compare
    /// lexicographically, as a row comparison or, for dialects without one,
    /// expanded column by column.
    pub fn condition(
        &self,
        syntax: PositionSyntax,
        keys: &[String],
        literal: impl Fn(usize, &Value) -> std::result::Result<String, String>,
    ) -> std::result::Result<Option<String>, String> {
        let literals = |values: &[Value]| -> std::result::Result<Vec<String>, String> {
            values.iter().enumerate().map(|(i, v)| literal(i, v)).collect()
        };
        let mut conditions = Vec::new();
        if let Some(after) = &self.after {
            conditions.push(lexicographic(syntax, keys, &literals(after)?, ">", ">"));
        }
        if let Some(until) = &self.until {
            conditions.push(lexicographic(syntax, keys, &literals(until)?, "<", "<="));
        }
        Ok((!conditions.is_empty()).then(|| conditions.join(" AND ")))
    }
}

/// `keys` compared with `values` in key order: `strict` on every column but
/// the last, which compares with `last` (`>`/`>` for an exclusive lower
/// bound, `<`/`<=` for an inclusive upper one).
fn lexicographic(syntax: PositionSyntax, keys: &[String], values: &[String], strict: &str, last: &str) -> String {
    match syntax {
        PositionSyntax::RowValue => format!("({}) {last} ({})", keys.join(", "), values.join(", ")),
        PositionSyntax::Expanded => {
            let n = keys.len().min(values.len());
            let mut out = String::new();
            for i in (0..n).rev() {
                out = if i + 1 == n {
                    format!("{} {last} {}", keys[i], values[i])
                } else {
                    format!("({k} {strict} {v} OR ({k} = {v} AND {out}))", k = keys[i], v = values[i])
                };
            }
            format!("({out})")
        }
    }
}

/// `schema` (the shape of the range's value schema) narrowed to the
/// columns the range's digests cover, in their order: a column dropped at
/// the source stays in the registry's shape and in the destination, and is
/// not compared. Why not, when the shape lacks one of them or its key.
pub fn digested_shape(
    schema: &std::sync::Arc<TableSchema>,
    range: &VerifyRange,
) -> std::result::Result<std::sync::Arc<TableSchema>, String> {
    let Some(names) = &range.columns else {
        return Ok(schema.clone());
    };
    if names.len() == schema.columns.len() && names.iter().zip(&schema.columns).all(|(n, c)| *n == c.name) {
        return Ok(schema.clone());
    }
    let columns = names
        .iter()
        .map(|n| {
            schema
                .columns
                .iter()
                .find(|c| c.name == *n)
                .cloned()
                .ok_or_else(|| format!("the source's column {n} is not in the range's schema"))
        })
        .collect::<std::result::Result<Vec<_>, String>>()?;
    if let Some(k) = schema.key.iter().find(|k| !names.contains(k)) {
        return Err(format!("the key column {k} is not among the source's columns"));
    }
    Ok(std::sync::Arc::new(TableSchema { columns, ..(**schema).clone() }))
}

/// The key of `row` (a row of `schema`'s columns), its values in key order.
pub fn key_of(schema: &TableSchema, row: &[Value]) -> Vec<Value> {
    schema
        .key_indexes()
        .iter()
        .map(|&k| row.get(k).cloned().unwrap_or(Value::Null))
        .collect()
}

/// `rows` (read back over the ranges `each` together) split into each
/// range's rows. The ranges follow each other in key order (each one's
/// lower bound is the one before's upper bound); a row past the last
/// upper bound, which the read's own bounds exclude, goes with the last
/// range, where it shows as a difference rather than vanish.
pub fn split_rows(schema: &TableSchema, each: &[KeyRange], rows: Vec<Row>) -> Vec<Vec<Row>> {
    let mut out: Vec<Vec<Row>> = each.iter().map(|_| Vec::new()).collect();
    if each.len() <= 1 {
        if let Some(only) = out.first_mut() {
            *only = rows;
        }
        return out;
    }
    for row in rows {
        let key = key_of(schema, &row);
        let i = each.partition_point(|r| r.until.as_ref().is_some_and(|u| compare_keys(&key, u) == Ordering::Greater));
        out[i.min(each.len() - 1)].push(row);
    }
    out
}

/// Of `rows` (of `range`'s bounds), those whose key the producer puts on
/// the range's partition: a range of a topic of several partitions holds
/// those keys only, and the changes of the others are not all applied yet.
/// All of them for a range of a one-partition topic. An error says why a
/// row's key cannot be written as the source writes keys.
pub fn on_partition(
    schema: &TableSchema,
    range: &VerifyRange,
    rows: Vec<Row>,
) -> std::result::Result<Vec<Row>, String> {
    use tributary_schemas::encoder::{key_bytes, partition_of};
    let Some(p) = range.partition else { return Ok(rows) };
    let key_id = range
        .key_schema_id
        .ok_or("the range of a topic of several partitions names no key schema")?;
    let mut out = Vec::with_capacity(rows.len() / usize::try_from(p.of.max(1)).unwrap_or(1) + 1);
    for row in rows {
        let bytes = key_bytes(schema, key_id, &key_of(schema, &row)).map_err(|e| e.to_string())?;
        if partition_of(&bytes, p.of) == p.partition {
            out.push(row);
        }
    }
    Ok(out)
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
    /// Each of them (keys only, never values).
    pub differences: Vec<Difference>,
    /// Rows the destination had and the source did not, removed (a
    /// repair).
    pub removed: u64,
    /// Why the range could not be compared, when it could not.
    pub unsupported: Option<String>,
    /// How the destination table's columns differ from the source's (the
    /// changes the sink would make; made, with repair).
    pub schema: Vec<String>,
    /// The partition whose keys the range held, on a topic of several.
    pub partition: Option<RangePartition>,
    /// A summarized range (see [`tributary_schemas::records::RangeSummary`]) whose summary differs
    /// from the destination's rows: the source's rows and the
    /// destination's.
    pub summary_differs: Option<(u64, u64)>,
    /// A summarized range whose rows' digests the destination asks of the
    /// source (its summary differed, or could not be computed here): its
    /// bounds, for a [`tributary_schemas::records::requests::Request::Verify`].
    pub ask_rows: Option<KeyBounds>,
    /// A range of a table without a key: its keys are content keys
    /// (`sink::keyless`), several rows may share one, and a repair copies
    /// the table again (no key names the rows to send).
    pub keyless: bool,
}

impl Outcome {
    fn of(schema: &TableSchema, range: &VerifyRange) -> Self {
        Self {
            table: schema.id.clone(),
            id: range.id,
            at: range.at,
            last: range.last,
            rows: range.summary.as_ref().map_or(range.rows.len() as u64, |s| s.rows),
            differing: 0,
            differences: Vec::new(),
            removed: 0,
            unsupported: None,
            schema: Vec::new(),
            partition: range.partition,
            summary_differs: None,
            ask_rows: None,
            keyless: schema.key.len() == 1 && schema.key[0] == crate::sink::bookkeeping::KEY_COLUMN,
        }
    }

    /// A summarized range (`range.summary`) against the destination's
    /// summary of the same rows, `computed` (`None`: this destination
    /// cannot compute it, and says `why`): equal, or its rows asked of the
    /// source.
    pub fn of_summary(
        schema: &TableSchema,
        range: &VerifyRange,
        computed: std::result::Result<(u64, String), String>,
    ) -> Self {
        let asked = Some((range.after.clone(), range.until.clone()));
        let Some(summary) = &range.summary else {
            return Self::unsupported(schema, range, "the range has no summary");
        };
        match computed {
            Ok((rows, sum)) if rows == summary.rows && sum == summary.sum => Self::of(schema, range),
            Ok((rows, _)) => Self {
                summary_differs: Some((summary.rows, rows)),
                ask_rows: asked,
                ..Self::of(schema, range)
            },
            Err(why) => Self {
                unsupported: Some(format!("{why}: its rows are asked of the source (a verification by rows follows)")),
                ask_rows: asked,
                ..Self::of(schema, range)
            },
        }
    }

    /// The keys whose rows the source must send again (missing or changed
    /// in the destination; of a table without a key, every content key
    /// that differs, once: the source copies the table again).
    pub fn to_resend(&self) -> Vec<String> {
        let mut keys: Vec<String> = self
            .differences
            .iter()
            .filter(|d| self.keyless || d.kind != DifferenceKind::Extra)
            .map(|d| d.key.clone())
            .collect();
        if self.keyless {
            keys.sort();
            keys.dedup();
        }
        keys
    }

    /// A range whose destination table's columns differ from the source's
    /// (`differences`, the changes the sink would make): its rows are not
    /// compared.
    pub fn schema_differs(schema: &TableSchema, range: &VerifyRange, differences: Vec<String>) -> Self {
        Self {
            rows: 0,
            schema: differences,
            ..Self::of(schema, range)
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
        self.unsupported.is_none() && self.differing == 0 && self.schema.is_empty() && self.summary_differs.is_none()
    }

    /// What a summarized range that differs says, for the status and the
    /// log (keys and counts, never values).
    pub fn summary_difference(&self) -> Option<String> {
        let (source, destination) = self.summary_differs?;
        let (after, until) = self.ask_rows.as_ref()?;
        let bound = |b: &Option<Vec<Option<String>>>, none: &str| {
            b.as_ref()
                .map_or_else(|| none.to_string(), |k| canonical::key_text(k.iter().cloned()))
        };
        Some(format!(
            "rows after {} up to {}: {source} at the source, {destination} here{}; their rows are compared again",
            bound(after, "the first"),
            bound(until, "the last"),
            if source == destination {
                ", their values differ"
            } else {
                ""
            }
        ))
    }
}

/// Compares the source's digests of `range` with the destination's `rows`
/// of the range (the values of `schema`'s columns, in order), as multisets
/// of rows by key: a key names one row of a keyed table, and the rows of
/// one content of a table without a key (see `source::keyless`), each of
/// which differs on its own.
pub fn compare(schema: &TableSchema, range: &VerifyRange, rows: &[Row]) -> Result<Outcome> {
    let source = range
        .digests()
        .map_err(|e| Error::permanent(format!("the verify record is unreadable: {e}")).with_table(schema.id.clone()))?;
    let mut outcome = Outcome::of(schema, range);
    let mut destination: HashMap<String, Vec<RowDigest>> = HashMap::with_capacity(rows.len());
    for row in rows {
        let d = canonical::digest_row(schema, row);
        destination.entry(d.key.clone()).or_default().push(d);
    }
    let note = |outcome: &mut Outcome, key: &str, kind: DifferenceKind| {
        outcome.differing += 1;
        outcome.differences.push(Difference { key: key.to_string(), kind });
    };
    // Equal rows first, so that a key's other rows pair with the rows
    // that differ.
    let unmatched: Vec<&RowDigest> = source
        .iter()
        .filter(|s| {
            let same = destination
                .get_mut(&s.key)
                .and_then(|list| list.iter().position(|d| d.hash == s.hash).map(|i| list.swap_remove(i)));
            same.is_none()
        })
        .collect();
    for s in unmatched {
        match destination.get_mut(&s.key).and_then(Vec::pop) {
            None => note(&mut outcome, &s.key, DifferenceKind::Missing),
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
    let mut extra: Vec<(String, usize)> = destination
        .into_iter()
        .filter(|(_, list)| !list.is_empty())
        .map(|(key, list)| (key, list.len()))
        .collect();
    extra.sort();
    for (key, n) in extra {
        for _ in 0..n {
            note(&mut outcome, &key, DifferenceKind::Extra);
        }
    }
    Ok(outcome)
}

/// Removes from `table` the rows of `rows` (the destination's rows of
/// `range`, as [`super::warehouse::Warehouse::read_range`] read them) that
/// `outcome` found only in the destination: each deleted as a delete of the
/// source at the range's position would (the source did not have it
/// there; a later insert of the key, at a later position, still comes
/// through). In a unit of its own, moving no offsets. Returns how many.
pub async fn remove_extra<W: super::warehouse::Warehouse>(
    w: &mut W,
    schema: &std::sync::Arc<TableSchema>,
    range: &VerifyRange,
    rows: &[Row],
    outcome: &Outcome,
) -> Result<u64> {
    use tributary_schemas::{ChangeEvent, Op, SnapshotMarker, SourceInfo};

    let extra: std::collections::HashSet<&str> = outcome
        .differences
        .iter()
        .filter(|d| d.kind == DifferenceKind::Extra)
        .map(|d| d.key.as_str())
        .collect();
    if extra.is_empty() {
        return Ok(0);
    }
    let connector: std::sync::Arc<str> = range.connector.as_str().into();
    let native: std::sync::Arc<str> = format!("{}:{}", range.at.commit, range.at.index).into();
    let now = crate::now_ms();
    let records: Vec<(super::KafkaPosition, super::SinkRecord)> = rows
        .iter()
        .filter(|row| extra.contains(canonical::digest_row(schema, row).key.as_str()))
        .enumerate()
        .map(|(i, row)| {
            let event = ChangeEvent {
                schema: schema.clone(),
                op: Op::Delete,
                before: Some(row.clone()),
                after: None,
                source: SourceInfo {
                    connector: connector.clone(),
                    name: "tributary-verify".into(),
                    db: "".into(),
                    ts_ms: now,
                    snapshot: SnapshotMarker::False,
                    tx_id: None,
                    position: range.at,
                    native_position: native.clone(),
                },
                ts_ms: now,
                transaction: None,
            };
            let at = super::KafkaPosition {
                topic: "tributary.verify".into(),
                partition: 0,
                offset: i as i64,
            };
            (at, super::SinkRecord::Change(event))
        })
        .collect();
    let removed = records.len() as u64;
    let batch = super::SinkBatch {
        table: schema.id.clone(),
        records,
        next_offsets: Vec::new(),
        expected_offsets: Vec::new(),
        unit: crate::UnitPart::default(),
    };
    super::warehouse::apply(w, &batch, super::warehouse::Mode::Commit)
        .await
        .map_err(|f| f.error)?;
    Ok(removed)
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
    fn a_summary_is_equal_or_its_range_is_asked_by_rows() {
        use tributary_schemas::records::RangeSummary;
        let shape = schema();
        let range = VerifyRange {
            id: 3,
            at: Position { commit: 9, index: 0 },
            connector: "postgresql".into(),
            schema_id: 1,
            key_schema_id: None,
            after: Some(vec![Some("10".into())]),
            until: None,
            last: true,
            rows: Vec::new(),
            partition: None,
            columns: None,
            summary: Some(RangeSummary {
                method: "m".into(),
                rows: 4,
                sum: "-12".into(),
                types: Vec::new(),
            }),
        };
        let equal = Outcome::of_summary(&shape, &range, Ok((4, "-12".into())));
        assert!(equal.equal() && equal.ask_rows.is_none(), "{equal:?}");
        assert_eq!(equal.rows, 4);
        let differs = Outcome::of_summary(&shape, &range, Ok((4, "7".into())));
        assert!(!differs.equal());
        assert_eq!(differs.ask_rows, Some((range.after.clone(), None)));
        assert_eq!(
            differs.summary_difference().as_deref(),
            Some("rows after [\"10\"] up to the last: 4 at the source, 4 here, their values differ; their rows are compared again")
        );
        let fewer = Outcome::of_summary(&shape, &range, Ok((3, "7".into())));
        assert!(fewer
            .summary_difference()
            .is_some_and(|d| d.contains("4 at the source, 3 here;")));
        let cannot = Outcome::of_summary(&shape, &range, Err("no".into()));
        assert!(cannot.unsupported.is_some() && cannot.ask_rows.is_some() && cannot.summary_difference().is_none());
    }

    #[test]
    fn a_column_dropped_at_the_source_is_not_compared() {
        let shape = std::sync::Arc::new(schema());
        let mut range = VerifyRange {
            id: 1,
            at: Position { commit: 1, index: 0 },
            connector: "postgresql".into(),
            schema_id: 1,
            key_schema_id: None,
            partition: None,
            columns: Some(vec!["id".into(), "qty".into()]),
            summary: None,
            after: None,
            until: None,
            last: true,
            rows: Vec::new(),
        };
        let narrowed = digested_shape(&shape, &range).expect("narrowed");
        let names: Vec<&str> = narrowed.columns.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["id", "qty"]);
        range.columns = Some(vec!["id".into(), "name".into(), "qty".into()]);
        assert!(std::sync::Arc::ptr_eq(&digested_shape(&shape, &range).expect("same"), &shape));
        range.columns = Some(vec!["id".into(), "gone".into()]);
        assert!(digested_shape(&shape, &range).unwrap_err().contains("gone"));
        range.columns = Some(vec!["qty".into()]);
        assert!(digested_shape(&shape, &range).unwrap_err().contains("key column id"));
    }

    #[test]
    fn rows_read_over_consecutive_ranges_go_to_their_range() {
        let bound = |id: i32| Some(vec![Value::Int32(id)]);
        let each = [
            KeyRange { after: None, until: bound(10) },
            KeyRange { after: bound(10), until: bound(20) },
            KeyRange { after: bound(20), until: None },
        ];
        let rows = vec![
            row(25, "e", 0),
            row(10, "b", 0),
            row(1, "a", 0),
            row(11, "c", 0),
            row(20, "d", 0),
        ];
        let parts = split_rows(&schema(), &each, rows);
        let ids = |p: &Vec<Row>| p.iter().map(|r| r[0].clone()).collect::<Vec<_>>();
        assert_eq!(ids(&parts[0]), vec![Value::Int32(10), Value::Int32(1)]);
        assert_eq!(ids(&parts[1]), vec![Value::Int32(11), Value::Int32(20)]);
        assert_eq!(ids(&parts[2]), vec![Value::Int32(25)]);
        for (part, bounds) in parts.iter().zip(&each) {
            assert!(part.iter().all(|r| bounds.contains(&key_of(&schema(), r))));
        }
        // Past the last upper bound (the read excludes it): kept, with the
        // last range, where it is a difference.
        let closed = [
            KeyRange { after: None, until: bound(5) },
            KeyRange { after: bound(5), until: bound(9) },
        ];
        let parts = split_rows(&schema(), &closed, vec![row(12, "x", 0)]);
        assert_eq!(parts[1].len(), 1);
    }

    #[test]
    fn keys_order_as_every_destination_orders_them() {
        use std::cmp::Ordering::*;
        let d = |t: &str| vec![Value::Decimal(t.into())];
        assert_eq!(compare_keys(&d("-10.5"), &d("-9")), Less);
        assert_eq!(compare_keys(&d("2.50"), &d("2.5")), Equal);
        assert_eq!(compare_keys(&d("10"), &d("9.99")), Greater);
        let t = |s: &str| vec![Value::Text(s.into())];
        // By bytes: upper case before lower case, "é" after "z".
        assert_eq!(compare_keys(&t("Z"), &t("a")), Less);
        assert_eq!(compare_keys(&t("é"), &t("z")), Greater);
        assert_eq!(
            compare_keys(&[Value::Int32(5), Value::Text("b".into())], &[Value::Int64(5), Value::Text("a".into())]),
            Greater
        );
        let range = KeyRange {
            after: Some(vec![Value::Int32(10)]),
            until: Some(vec![Value::Int32(20)]),
        };
        assert!(
            !range.contains(&[Value::Int64(10)])
                && range.contains(&[Value::Int16(11)])
                && range.contains(&[Value::Int32(20)])
        );
        assert!(!range.contains(&[Value::Int32(21)]));
    }

    #[test]
    fn every_kind_of_difference_is_named_and_nothing_else() {
        let s = schema();
        let source = [row(1, "a", 1), row(2, "b", 2), row(3, "c", 3)];
        let range = VerifyRange {
            id: 1,
            at: Position { commit: 5, index: 0 },
            connector: "postgresql".into(),
            schema_id: 1,
            key_schema_id: None,
            partition: None,
            columns: None,
            summary: None,
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

    /// A table without a key: rows are compared as multisets by content
    /// key, each copy on its own, and the repair asks each content key
    /// once, extra ones too (the table is copied again).
    #[test]
    fn rows_without_a_key_compare_as_multisets() {
        use crate::source::keyless::verification_shape;
        let mut keyless = schema();
        keyless.key.clear();
        let shape = verification_shape(&keyless);
        let with_key = |r: Row| {
            let key = crate::sink::keyless::content_key(&keyless, &r).expect("content key");
            let mut r = r;
            r.push(Value::Text(key));
            r
        };
        let source: Vec<Row> = [
            row(1, "a", 1),
            row(1, "a", 1),
            row(1, "a", 1),
            row(2, "b", 2),
            row(3, "c", 3),
        ]
        .into_iter()
        .map(with_key)
        .collect();
        let mut entries: Vec<_> = source
            .iter()
            .map(|r| VerifyRange::entry(&canonical::digest_row(&shape, r)))
            .collect();
        entries.sort();
        let range = VerifyRange {
            id: 1,
            at: Position { commit: 5, index: 0 },
            connector: "postgresql".into(),
            schema_id: 1,
            key_schema_id: None,
            partition: None,
            columns: None,
            summary: None,
            after: None,
            until: None,
            last: true,
            rows: entries,
        };
        let outcome = compare(&shape, &range, &source).expect("compared");
        assert!(outcome.equal() && outcome.keyless);
        // One copy of (1, a, 1) gone, another changed in qty (its content
        // key kept), (2, b, 2) twice, (3, c, 3) as it was.
        let mut changed = source[1].clone();
        changed[2] = Value::Int64(10);
        let dest = vec![
            changed,
            source[2].clone(),
            source[3].clone(),
            source[3].clone(),
            source[4].clone(),
        ];
        let outcome = compare(&shape, &range, &dest).expect("compared");
        assert_eq!(outcome.differing, 3, "{:?}", outcome.differences);
        let kinds: Vec<(&str, &DifferenceKind)> = outcome
            .differences
            .iter()
            .map(|d| (if d.key.contains(&*text(&source[0])) { "a" } else { "b" }, &d.kind))
            .collect();
        assert!(kinds.contains(&("a", &DifferenceKind::Changed(vec!["qty".into()]))), "{kinds:?}");
        assert!(kinds.contains(&("a", &DifferenceKind::Missing)), "{kinds:?}");
        assert!(kinds.contains(&("b", &DifferenceKind::Extra)), "{kinds:?}");
        assert_eq!(outcome.to_resend().len(), 2, "each content key once");
    }

    /// A row's content key (its last value).
    fn text(row: &Row) -> String {
        match row.last() {
            Some(Value::Text(t)) => t.clone(),
            _ => String::new(),
        }
    }

    #[test]
    fn a_range_bounds_a_query_with_or_without_row_comparison() {
        let range = KeyRange {
            after: Some(vec![Value::Int32(1), Value::Text("a".into())]),
            until: Some(vec![Value::Int32(5), Value::Text("b".into())]),
        };
        let keys = ["k".to_string(), "t".to_string()];
        let literal = |_: usize, v: &Value| match v {
            Value::Int32(i) => Ok(i.to_string()),
            Value::Text(t) => Ok(format!("'{t}'")),
            _ => Err("no literal".to_string()),
        };
        assert_eq!(
            range.condition(PositionSyntax::RowValue, &keys, literal).unwrap().as_deref(),
            Some("(k, t) > (1, 'a') AND (k, t) <= (5, 'b')")
        );
        assert_eq!(
            range.condition(PositionSyntax::Expanded, &keys, literal).unwrap().as_deref(),
            Some("((k > 1 OR (k = 1 AND t > 'a'))) AND ((k < 5 OR (k = 5 AND t <= 'b')))")
        );
        let one = KeyRange { after: None, until: Some(vec![Value::Int32(9)]) };
        assert_eq!(one.condition(PositionSyntax::Expanded, &keys[..1], literal).unwrap().as_deref(), Some("(k <= 9)"));
        let all = KeyRange { after: None, until: None };
        assert_eq!(all.condition(PositionSyntax::Expanded, &keys, literal).unwrap(), None);
        let bad = KeyRange { after: Some(vec![Value::Null]), until: None };
        assert!(bad.condition(PositionSyntax::RowValue, &keys[..1], literal).is_err());
    }
}

//! Verifying a table without a key, the same for every source.
//!
//! Its rows are a multiset: no key orders or bounds them. Every sink keeps
//! each such row with its **content key** (`sink::keyless::content_key`,
//! a digest of its values) in a column, so the content key is the key a
//! verification ranges by: the source computes each row's content key as
//! the sinks do, and sends the rows' digests in ranges of content keys
//! (their hex text orders alike everywhere); the sink reads back its rows
//! of the range by that column and compares the two multisets
//! (`sink::verify::compare`). The digests are those of the rows with their
//! content key as one more column ([`verification_shape`]), so a row whose
//! values were changed behind the sink's back, its content key kept, shows
//! as a row that differs, in the column that differs.
//!
//! The database cannot order rows by a digest it does not compute, so the
//! source reads the table and sorts in memory: in passes over slices of
//! the content keys, of at most [`PASS_ROWS`] rows each (a table of `n`
//! rows is read `ceil(n / PASS_ROWS)` times, all in the verification's one
//! snapshot).

use tributary_schemas::canonical::digest_row;
use tributary_schemas::records::requests::KeyBounds;
use tributary_schemas::records::VerifyRange;
use tributary_schemas::{Column, DataType, TableSchema, Value};

use crate::error::Result;
use crate::sink::bookkeeping::KEY_COLUMN;
use crate::sink::keyless::{content_key, CONTENT_KEY_LEN};

/// Rows one pass keeps in memory at most (about 100 bytes each).
pub const PASS_ROWS: u64 = 1_000_000;

/// Bytes of a range's entries at most, for sources without a bound of
/// their own (far below Kafka's default 1 MiB record).
pub const RANGE_BYTES: usize = 256 * 1024;

/// The shape a verification of a table without a key digests and reads
/// back: its columns, then the content key as a text column that is the
/// key.
pub fn verification_shape(schema: &TableSchema) -> TableSchema {
    let mut shape = schema.clone();
    let mut key = Column::new(KEY_COLUMN, DataType::Text, false);
    key.source_type = "text".into();
    shape.columns.push(key);
    shape.key = vec![KEY_COLUMN.to_string()];
    shape
}

/// A row's entry in a [`VerifyRange`].
pub type Entry = (String, String, String);

/// A range of a pass: its bounds, its rows' entries, and whether it is the
/// verification's last.
pub type Range = (KeyBounds, Vec<Entry>, bool);

/// How many passes read a table of about `rows` rows.
pub fn passes(rows: u64) -> u64 {
    rows.div_ceil(PASS_ROWS).max(1)
}

/// One pass of a verification of a table without a key: the rows whose
/// content key falls in its slice, then its ranges.
pub struct Pass {
    shape: TableSchema,
    /// The slice: content keys whose first 64 bits are in `lo..hi`.
    lo: u128,
    hi: u128,
    last: bool,
    rows: Vec<(String, Entry)>,
    bytes: usize,
}

impl Pass {
    /// Pass `pass` (from 0) of `of` over a table of shape `schema`.
    pub fn new(schema: &TableSchema, pass: u64, of: u64) -> Self {
        let of = of.max(1);
        let edge = |i: u64| (u128::from(i) << 64) / u128::from(of);
        Self {
            shape: verification_shape(schema),
            lo: edge(pass),
            hi: edge(pass + 1),
            last: pass + 1 >= of,
            rows: Vec::new(),
            bytes: 0,
        }
    }

    /// Takes `row` (the values of the table's columns) if its content key
    /// is in the pass's slice.
    pub fn push(&mut self, schema: &TableSchema, row: &[Value]) -> Result<()> {
        let key = content_key(schema, row).map_err(|e| e.or_table(&schema.id))?;
        let prefix = key.get(..16).and_then(|p| u64::from_str_radix(p, 16).ok()).unwrap_or(0);
        if !(self.lo..self.hi).contains(&u128::from(prefix)) {
            return Ok(());
        }
        let mut values = Vec::with_capacity(row.len() + 1);
        values.extend_from_slice(row);
        values.push(Value::Text(key.clone()));
        let entry = VerifyRange::entry(&digest_row(&self.shape, &values));
        self.bytes += entry.0.len() + entry.1.len() + entry.2.len() + 16;
        self.rows.push((key, entry));
        Ok(())
    }

    /// Rows taken so far.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether no row was taken.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The pass's ranges in content-key order, each with its bounds, its
    /// entries and whether it is the verification's last: at most
    /// `max_rows` rows and about `max_bytes` of entries each, never
    /// splitting equal content keys; the first from the slice's start (the
    /// first pass's: from the first key), the last to the slice's end (the
    /// last pass's: to the last key), so that the ranges of all passes
    /// follow each other.
    pub fn ranges(mut self, max_rows: usize, max_bytes: usize) -> Vec<Range> {
        self.rows.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let bound = |key: &str| Some(vec![Some(key.to_string())]);
        let slice_start = (self.lo > 0).then(|| bound(&upper_text(self.lo - 1))).flatten();
        let slice_end = (!self.last).then(|| bound(&upper_text(self.hi - 1))).flatten();
        let mut out = Vec::new();
        let mut after = slice_start;
        let mut range: Vec<Entry> = Vec::new();
        let mut bytes = 0usize;
        let mut rows = self.rows.into_iter().peekable();
        while let Some((key, entry)) = rows.next() {
            bytes += entry.0.len() + entry.1.len() + entry.2.len() + 16;
            range.push(entry);
            let next_differs = rows.peek().is_some_and(|(next, _)| *next != key);
            if next_differs && (range.len() >= max_rows || bytes >= max_bytes) {
                let until = bound(&key);
                out.push(((after, until.clone()), std::mem::take(&mut range), false));
                after = until;
                bytes = 0;
            }
        }
        out.push(((after, slice_end), range, self.last));
        out
    }
}

/// The greatest content key whose first 64 bits are `prefix` (the top
/// of a slice, inclusive).
fn upper_text(prefix: u128) -> String {
    let mut text = format!("{:016x}", prefix as u64);
    text.extend(std::iter::repeat_n('f', CONTENT_KEY_LEN - 16));
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use tributary_schemas::TableId;

    fn schema() -> TableSchema {
        TableSchema {
            id: TableId::new("public", "log"),
            columns: vec![
                Column::new("a", DataType::Int32, true),
                Column::new("b", DataType::Text, true),
            ],
            key: Vec::new(),
            dropped: Vec::new(),
        }
    }

    fn rows(n: i32) -> Vec<Vec<Value>> {
        (0..n)
            .map(|i| vec![Value::Int32(i % 7), Value::Text(format!("r{}", i % 5))])
            .collect()
    }

    /// Every row is in exactly one range of one pass, equal rows in the
    /// same range, and the ranges of all passes follow each other from the
    /// first key to the last.
    #[test]
    fn passes_cover_every_row_once_in_ranges_that_follow_each_other() {
        let s = schema();
        let all = rows(200);
        for of in [1u64, 2, 3, 7] {
            let mut ranges = Vec::new();
            for pass in 0..of {
                let mut p = Pass::new(&s, pass, of);
                for r in &all {
                    p.push(&s, r).unwrap();
                }
                ranges.extend(p.ranges(4, usize::MAX));
            }
            let total: usize = ranges.iter().map(|(_, e, _)| e.len()).sum();
            assert_eq!(total, all.len(), "{of} passes");
            assert_eq!(ranges.first().unwrap().0 .0, None);
            assert_eq!(ranges.last().unwrap().0 .1, None);
            assert!(ranges.last().unwrap().2 && ranges.iter().filter(|r| r.2).count() == 1);
            for w in ranges.windows(2) {
                assert_eq!(w[0].0 .1, w[1].0 .0, "consecutive");
            }
            for ((after, until), entries, _) in &ranges {
                let key = |e: &(String, String, String)| tributary_schemas::canonical::parse_key_text(&e.0).unwrap();
                for e in entries {
                    let k = key(e);
                    assert!(after.as_ref().is_none_or(|a| k > *a) && until.as_ref().is_none_or(|u| k <= *u));
                }
            }
            // 35 distinct rows, each repeated: never split.
            let mut seen = std::collections::BTreeMap::new();
            for (i, (_, entries, _)) in ranges.iter().enumerate() {
                for e in entries {
                    assert_eq!(*seen.entry(e.0.clone()).or_insert(i), i, "equal rows in one range");
                }
            }
        }
    }

    #[test]
    fn the_pass_count_bounds_the_rows_kept() {
        assert_eq!(passes(0), 1);
        assert_eq!(passes(PASS_ROWS), 1);
        assert_eq!(passes(PASS_ROWS + 1), 2);
    }
}

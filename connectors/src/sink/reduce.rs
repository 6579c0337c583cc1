//! The one reduction of a batch: the last change per key, which is all a
//! destination needs to apply (a delete then an insert of a key is the
//! insert; five updates are the last one).
//!
//! Rows are not copied: each surviving [`Line`] points into its event, and a
//! sink renders it only while it writes it (PostgreSQL renders `COPY` text
//! one chunk ahead of the server parsing it, BigQuery JSON rows), so a batch
//! is never held rendered whole.

use std::sync::Arc;

use tributary_schemas::hashing::FxHashMap;
use tributary_schemas::{ChangeEvent, Op, Position, TableSchema, Value};

use super::bookkeeping::position_i64;
use super::text::render_text;
use super::ApplyError;
use crate::error::{Error, Result};

/// The surviving changes of one destination table, grouped by schema
/// version in the order the versions first appear.
///
/// A table without a key (see [`super::keyless`]) is not reduced: every
/// insert and every delete of it counts. Its lines are all live, an
/// update is a delete of its old row and an insert of its new one, and
/// each line names its row ([`Line::instance`]).
#[derive(Default)]
pub struct Reduction<'a> {
    /// One group per schema version.
    pub groups: Vec<Group<'a>>,
    /// Key bytes -> the line of the newest change of that key so far.
    winners: FxHashMap<Vec<u8>, Winner>,
    /// Whether the changes are a keyless table's ([`Reduction::keyless`]).
    keyless: bool,
}

struct Winner {
    position: Position,
    group: usize,
    line: usize,
}

/// The changes of one schema version.
pub struct Group<'a> {
    /// The schema the rows follow.
    pub schema: Arc<TableSchema>,
    /// Indexes of the key columns in `schema.columns`.
    pub key: Vec<usize>,
    /// In batch order; lines superseded by a later change of the same key
    /// are not `live`.
    pub lines: Vec<Line<'a>>,
    /// Live upserts.
    pub upserts: usize,
    /// Live deletes.
    pub deletes: usize,
    /// Whether every upsert is a read or an insert (no update): such a group
    /// may be loaded straight into the table when its keys are new.
    pub only_inserts: bool,
    /// The earliest position of its changes: which schema versions of the
    /// batch are newer than which ([`Reduction::absent_value`]).
    pub first: Position,
}

/// One row to write: an upsert's new values or a delete's key (the other
/// columns of a delete are not to be written).
pub struct Line<'a> {
    /// The values, one per column of the group's schema.
    pub row: &'a [Value],
    /// Index of its record in the batch, named when it cannot be written.
    pub record: usize,
    /// The change's position.
    pub position: Position,
    /// `position.commit` as stored.
    pub commit: i64,
    /// `position.index` as stored.
    pub index: i64,
    /// A delete (else an upsert).
    pub delete: bool,
    /// Not superseded by a later change of its key.
    pub live: bool,
    /// In a table without a key: the row's content key and name.
    pub instance: Option<Box<Instance>>,
}

/// A row of a table without a key, as [`super::keyless`] names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    /// Its content key ([`super::keyless::content_key`]).
    pub content: String,
    /// The record that wrote it (an insert) or that removes a row of its
    /// content (a delete): [`super::keyless::record_id`].
    pub row: String,
}

/// The position of the newest truncate among `events`: every older row of
/// the table is removed, and every change at or before it is skipped.
pub fn newest_truncate(events: &[(usize, &ChangeEvent)]) -> Option<Position> {
    events
        .iter()
        .filter(|(_, ev)| ev.op == Op::Truncate)
        .map(|(_, ev)| ev.source.position)
        .max()
}

impl<'a> Reduction<'a> {
    /// The last change per key of `events` (each with its index in the
    /// batch), leaving out truncates and whatever a truncate at `truncated`
    /// removes. An event that cannot be reduced (no key, no row) is a
    /// permanent error of its record.
    pub fn of(events: &[(usize, &'a ChangeEvent)], truncated: Option<Position>) -> Result<Self, ApplyError> {
        let mut reduced = Reduction {
            groups: Vec::new(),
            winners: FxHashMap::with_capacity_and_hasher(events.len(), Default::default()),
            keyless: false,
        };
        for &(i, ev) in events {
            if ev.op == Op::Truncate || truncated.is_some_and(|t| ev.source.position <= t) {
                continue;
            }
            reduced.add(i, ev).map_err(|error| ApplyError {
                error: error.with_table(ev.schema.id.clone()),
                record: Some(i),
            })?;
        }
        Ok(reduced)
    }

    /// The changes of a table without a key among `events` (each with its
    /// index in the batch, `record(index)` naming its Kafka record), none
    /// reduced away: every read, insert and delete, an update as the
    /// delete of its old row then the insert of its new one; truncates and
    /// what a truncate at `truncated` removes are left out. An event that
    /// cannot be written (no row, an update without its old row) is a
    /// permanent error of its record.
    pub fn keyless(
        events: &[(usize, &'a ChangeEvent)],
        truncated: Option<Position>,
        record: impl Fn(usize) -> String,
    ) -> Result<Self, ApplyError> {
        let mut reduced = Reduction { keyless: true, ..Reduction::default() };
        for &(i, ev) in events {
            if ev.op == Op::Truncate || truncated.is_some_and(|t| ev.source.position <= t) {
                continue;
            }
            reduced.add_keyless(i, ev, &record).map_err(|error| ApplyError {
                error: error.with_table(ev.schema.id.clone()),
                record: Some(i),
            })?;
        }
        Ok(reduced)
    }

    /// Whether these are the changes of a table without a key.
    pub fn is_keyless(&self) -> bool {
        self.keyless
    }

    /// Whether some live line is an upsert, and whether some is a delete.
    pub fn parts(&self) -> (bool, bool) {
        (self.groups.iter().any(|g| g.upserts > 0), self.groups.iter().any(|g| g.deletes > 0))
    }

    fn add_keyless(&mut self, record: usize, ev: &'a ChangeEvent, name: &impl Fn(usize) -> String) -> Result<()> {
        let row = |r: Option<&'a Vec<Value>>, what: &str| {
            r.ok_or_else(|| Error::permanent(format!("a {:?} event without its {what} row", ev.op)))
        };
        match ev.op {
            Op::Read | Op::Create => self.put_keyless(record, ev, row(ev.after.as_ref(), "new")?, false, name),
            Op::Update => {
                let before = ev.before.as_ref().ok_or_else(|| {
                    Error::permanent(
                        "an update of a table without a key came without its old row: which row it changed is unknown",
                    )
                    .with_class("tributary.no_before_image")
                    .with_hint(format!(
                        "give the source table full before-images (PostgreSQL: ALTER TABLE {} REPLICA IDENTITY FULL; \
                         MySQL: binlog_row_image = FULL), then copy it again (source-runner reset --table {})",
                        ev.schema.id, ev.schema.id
                    ))
                })?;
                self.put_keyless(record, ev, before, true, name)?;
                self.put_keyless(record, ev, row(ev.after.as_ref(), "new")?, false, name)
            }
            Op::Delete => self.put_keyless(record, ev, row(ev.before.as_ref(), "old")?, true, name),
            Op::Truncate => Ok(()),
        }
    }

    fn put_keyless(
        &mut self,
        record: usize,
        ev: &ChangeEvent,
        row: &'a [Value],
        delete: bool,
        name: &impl Fn(usize) -> String,
    ) -> Result<()> {
        whole_row(&ev.schema, row)?;
        let content = super::keyless::content_key(&ev.schema, row)?;
        let instance = Instance { content, row: name(record) };
        self.push_line(record, ev, row, delete, Some(Box::new(instance))).map(|_| ())
    }

    /// Adds a live line of `row` to its schema's group: the group's index
    /// and the line's.
    fn push_line(
        &mut self,
        record: usize,
        ev: &ChangeEvent,
        row: &'a [Value],
        delete: bool,
        instance: Option<Box<Instance>>,
    ) -> Result<(usize, usize)> {
        let position = ev.source.position;
        let (commit, index) = position_i64(position)?;
        let g = self.group_of(&ev.schema);
        let group = &mut self.groups[g];
        if group.lines.is_empty() || position < group.first {
            group.first = position;
        }
        if ev.op == Op::Update {
            group.only_inserts = false;
        }
        if delete {
            group.deletes += 1;
        } else {
            group.upserts += 1;
        }
        group.lines.push(Line {
            row,
            record,
            position,
            commit,
            index,
            delete,
            live: true,
            instance,
        });
        Ok((g, group.lines.len() - 1))
    }

    /// Whether nothing is left to write.
    pub fn is_empty(&self) -> bool {
        self.groups.iter().all(|g| g.upserts == 0 && g.deletes == 0)
    }

    /// The live lines of every group, group by group.
    pub fn live(&self) -> impl Iterator<Item = (&Group<'a>, &Line<'a>)> {
        self.groups
            .iter()
            .flat_map(|g| g.lines.iter().filter(|l| l.live).map(move |l| (g, l)))
    }

    /// Column names of every schema version, in first-seen order (the
    /// union a staging table of several versions needs).
    pub fn column_names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = Vec::new();
        for g in &self.groups {
            for c in &g.schema.columns {
                if !names.contains(&c.name.as_str()) {
                    names.push(&c.name);
                }
            }
        }
        names
    }

    /// The value a row of `group` has in column `name`, which its schema
    /// lacks but another version of the batch has (a sink that writes the
    /// versions' columns together writes this for it). Where a newer
    /// version has the column, the source added it after the row was read
    /// and gave the rows already there its default: that default (`None`
    /// when it has none, NULL). Where only older versions have it, this one
    /// dropped it: `None`. Never NULL for a column whose rows the source
    /// filled: the table's destination column then holds what the source's
    /// does, also for rows of the older version written after the column
    /// was added.
    pub fn absent_value(&self, group: &Group<'a>, name: &str) -> Option<Value> {
        self.groups
            .iter()
            .filter(|h| h.first > group.first)
            .filter_map(|h| Some((h.first, h.schema.columns.iter().find(|c| c.name == name)?)))
            .min_by_key(|(first, _)| *first)
            .and_then(|(_, column)| column.default_value())
    }

    fn group_of(&mut self, schema: &Arc<TableSchema>) -> usize {
        if let Some(g) = self
            .groups
            .iter()
            .position(|g| Arc::ptr_eq(&g.schema, schema) || *g.schema == **schema)
        {
            return g;
        }
        self.groups.push(Group {
            schema: schema.clone(),
            key: schema.key_indexes(),
            lines: Vec::new(),
            upserts: 0,
            deletes: 0,
            only_inserts: true,
            first: Position::default(),
        });
        self.groups.len() - 1
    }

    /// Adds the event of record `record`.
    fn add(&mut self, record: usize, ev: &'a ChangeEvent) -> Result<()> {
        let schema = &ev.schema;
        let key_idx = schema.key_indexes();
        if key_idx.is_empty() {
            return Err(Error::permanent("the table has no key columns").with_class("tributary.no_key"));
        }
        match ev.op {
            Op::Read | Op::Create | Op::Update => {
                let after = ev
                    .after
                    .as_ref()
                    .ok_or_else(|| Error::permanent(format!("a {:?} event without an after row", ev.op)))?;
                if let (Op::Update, Some(before)) = (ev.op, &ev.before) {
                    // A key change: the old key is deleted at the same position.
                    if before.len() == schema.columns.len() && !key_is_missing(before, &key_idx) {
                        let old = key_bytes(schema, before, &key_idx)?;
                        let new = key_bytes(schema, after, &key_idx)?;
                        if old != new {
                            self.put(record, ev, before, true, &key_idx)?;
                        }
                    }
                }
                self.put(record, ev, after, false, &key_idx)
            }
            Op::Delete => {
                let before = ev
                    .before
                    .as_ref()
                    .ok_or_else(|| Error::permanent("a delete event without a before row"))?;
                self.put(record, ev, before, true, &key_idx)
            }
            Op::Truncate => Ok(()),
        }
    }

    /// Adds `row` of the event of record `record`.
    fn put(
        &mut self,
        record: usize,
        ev: &ChangeEvent,
        row: &'a [Value],
        delete: bool,
        key_idx: &[usize],
    ) -> Result<()> {
        whole_row(&ev.schema, row)?;
        let key = key_bytes(&ev.schema, row, key_idx)?;
        let position = ev.source.position;
        if let Some(w) = self.winners.get(&key) {
            if w.position > position {
                return Ok(()); // an older event: the newer one stays
            }
        }
        let (g, line) = self.push_line(record, ev, row, delete, None)?;
        if let Some(old) = self.winners.insert(key, Winner { position, group: g, line }) {
            let og = &mut self.groups[old.group];
            let superseded = &mut og.lines[old.line];
            superseded.live = false;
            if superseded.delete {
                og.deletes -= 1;
            } else {
                og.upserts -= 1;
            }
        }
        Ok(())
    }
}

impl<'a> Group<'a> {
    /// All of `events` as one group, unreduced, when they are reads and
    /// inserts of one schema version with a whole row and a key each (a
    /// snapshot chunk); `None` otherwise, and then the reduction decides
    /// (and names what is wrong with a row).
    pub fn inserts_only(events: &[(usize, &'a ChangeEvent)]) -> Option<Group<'a>> {
        let (_, first) = events.first()?;
        let schema = &first.schema;
        let key = schema.key_indexes();
        if key.is_empty() {
            return None;
        }
        let mut lines = Vec::with_capacity(events.len());
        for &(record, ev) in events {
            if !matches!(ev.op, Op::Read | Op::Create) || !Arc::ptr_eq(&ev.schema, schema) {
                return None;
            }
            let row = ev.after.as_deref()?;
            if row.len() != schema.columns.len() || key_is_missing(row, &key) {
                return None;
            }
            let position = ev.source.position;
            let (commit, index) = position_i64(position).ok()?;
            lines.push(Line {
                row,
                record,
                position,
                commit,
                index,
                delete: false,
                live: true,
                instance: None,
            });
        }
        Some(Group {
            schema: schema.clone(),
            key,
            upserts: lines.len(),
            deletes: 0,
            only_inserts: true,
            first: lines.iter().map(|l| l.position).min().unwrap_or_default(),
            lines,
        })
    }

    /// The live lines.
    pub fn live(&self) -> impl Iterator<Item = &Line<'a>> {
        self.lines.iter().filter(|l| l.live)
    }

    /// Whether column `i` of `line` is written: all columns of an upsert,
    /// the key columns of a delete.
    pub fn writes(&self, line: &Line<'_>, i: usize) -> bool {
        !line.delete || self.key.contains(&i)
    }
}

/// Whether `row` has a value for every column of `schema`.
fn whole_row(schema: &TableSchema, row: &[Value]) -> Result<()> {
    if row.len() != schema.columns.len() {
        return Err(Error::permanent(format!("a row of {} values for {} columns", row.len(), schema.columns.len())));
    }
    Ok(())
}

/// A value's text as keys compare it (its SQL text; integers of any width
/// alike), `scratch` holding it where the value does not; `None` for NULL.
pub fn key_value_text<'v>(value: &'v Value, scratch: &'v mut String) -> Result<Option<&'v str>, String> {
    let mut digits = itoa::Buffer::new();
    let int = |scratch: &'v mut String, text: &str| {
        scratch.clear();
        scratch.push_str(text);
        Some(&scratch[..])
    };
    Ok(match value {
        Value::Null => None,
        Value::Int16(v) => int(scratch, digits.format(*v)),
        Value::Int32(v) => int(scratch, digits.format(*v)),
        Value::Int64(v) => int(scratch, digits.format(*v)),
        Value::Decimal(s) | Value::Text(s) | Value::Json(s) | Value::Enum(s) => Some(s),
        // The source's text: a NaN key is not the key 0 its column
        // carries.
        Value::SourceText { text, .. } => Some(text),
        // PostgreSQL's infinities by name (`render_text` has no text for an
        // infinite timestamp).
        Value::Date(d) if crate::sink::text::infinite_date(*d) => Some(infinity_text(*d > 0)),
        Value::Timestamp(t) | Value::TimestampTz(t) if crate::sink::text::infinite_timestamp(*t) => {
            Some(infinity_text(*t > 0))
        }
        other => {
            scratch.clear();
            render_text(scratch, other)?;
            Some(&scratch[..])
        }
    })
}

/// Whether a key column of `row` has no value (NULL, or not sent).
pub fn key_is_missing(row: &[Value], key: &[usize]) -> bool {
    key.iter()
        .any(|&i| matches!(row.get(i), Some(Value::Null) | Some(Value::Unchanged) | None))
}

/// The key of `row` as bytes that are equal exactly when the keys are: each
/// key value's SQL text, length-prefixed. Integers of any width give the
/// same text, so a key column widened by a schema change (int -> bigint)
/// still matches its older rows.
pub fn key_bytes(schema: &TableSchema, row: &[Value], key: &[usize]) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(key.len() * 12);
    let mut scratch = String::new();
    for &i in key {
        let name = &schema.columns[i].name;
        let value = row.get(i).ok_or_else(|| Error::permanent("a row shorter than its schema"))?;
        let text = key_value_text(value, &mut scratch)
            .map_err(|reason| Error::permanent(format!("key column {name}: {reason}")).with_column(name.clone()))?
            .ok_or_else(|| Error::permanent(format!("key column {name} is null")).with_column(name.clone()))?;
        out.extend_from_slice(&(text.len() as u64).to_le_bytes());
        out.extend_from_slice(text.as_bytes());
    }
    Ok(out)
}

fn infinity_text(positive: bool) -> &'static str {
    if positive {
        "infinity"
    } else {
        "-infinity"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tributary_schemas::{Column, DataType, SnapshotMarker, SourceInfo, TableId};

    fn schema() -> Arc<TableSchema> {
        Arc::new(TableSchema {
            id: TableId::new("s", "t"),
            columns: vec![
                Column::new("id", DataType::Int64, false),
                Column::new("v", DataType::Text, true),
            ],
            key: vec!["id".into()],
            dropped: Vec::new(),
        })
    }

    fn ev(schema: &Arc<TableSchema>, op: Op, id: i64, at: u64) -> ChangeEvent {
        let row = vec![Value::Int64(id), Value::Text(format!("v{at}"))];
        ChangeEvent {
            schema: schema.clone(),
            op,
            before: matches!(op, Op::Delete | Op::Update).then(|| row.clone()),
            after: (op != Op::Delete).then_some(row),
            source: SourceInfo {
                connector: "test".into(),
                name: "n".into(),
                db: "d".into(),
                ts_ms: 0,
                snapshot: SnapshotMarker::False,
                tx_id: None,
                position: Position { commit: at, index: 0 },
                native_position: "".into(),
            },
            ts_ms: 0,
            transaction: None,
        }
    }

    #[test]
    fn the_newest_change_per_key_wins_in_any_order() {
        let s = schema();
        let events = [
            ev(&s, Op::Create, 1, 1),
            ev(&s, Op::Update, 1, 3),
            ev(&s, Op::Delete, 1, 2),
            ev(&s, Op::Create, 2, 1),
        ];
        let refs: Vec<(usize, &ChangeEvent)> = events.iter().enumerate().collect();
        let r = Reduction::of(&refs, None).unwrap();
        let live: Vec<(usize, bool)> = r.live().map(|(_, l)| (l.record, l.delete)).collect();
        assert_eq!(live, vec![(1, false), (3, false)]);
        assert_eq!((r.groups[0].upserts, r.groups[0].deletes), (2, 0));
    }

    #[test]
    fn a_truncate_removes_what_came_before_it() {
        let s = schema();
        let mut truncate = ev(&s, Op::Truncate, 0, 5);
        truncate.before = None;
        truncate.after = None;
        let events = [ev(&s, Op::Create, 1, 4), truncate, ev(&s, Op::Create, 2, 6)];
        let refs: Vec<(usize, &ChangeEvent)> = events.iter().enumerate().collect();
        let at = newest_truncate(&refs);
        assert_eq!(at, Some(Position { commit: 5, index: 0 }));
        let r = Reduction::of(&refs, at).unwrap();
        assert_eq!(r.live().map(|(_, l)| l.record).collect::<Vec<_>>(), vec![2]);
    }

    #[test]
    fn integer_widths_give_the_same_key() {
        let s = schema();
        let a = key_bytes(&s, &[Value::Int32(7), Value::Null], &[0]).unwrap();
        let b = key_bytes(&s, &[Value::Int64(7), Value::Null], &[0]).unwrap();
        assert_eq!(a, b);
        let e = key_bytes(&s, &[Value::Null, Value::Null], &[0]).unwrap_err();
        assert!(e.to_string().contains("key column id is null"), "{e}");
    }

    #[test]
    fn an_insert_only_run_is_one_unreduced_group() {
        let s = schema();
        let events = [ev(&s, Op::Read, 1, 1), ev(&s, Op::Read, 1, 1)];
        let refs: Vec<(usize, &ChangeEvent)> = events.iter().enumerate().collect();
        assert_eq!(Group::inserts_only(&refs).map(|g| g.upserts), Some(2));
        let events = [ev(&s, Op::Read, 1, 1), ev(&s, Op::Update, 1, 2)];
        let refs: Vec<(usize, &ChangeEvent)> = events.iter().enumerate().collect();
        assert!(Group::inserts_only(&refs).is_none());
    }
}

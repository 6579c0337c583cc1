//! Control records on change topics: a null key, a null value, and the
//! meaning in headers (docs/CONTRACTS.md, "Control records on change
//! topics"). The source runner writes them in order with the changes of
//! their table; a sink applies them in that order (`SinkRecord`'s control
//! variants). A record that goes "on every partition" is written once per
//! partition the topic has when it is sent.
//!
//! A new kind is one variant here, its header value, and its arm in
//! [`ControlRecord::headers`] and [`ControlRecord::decode`].

use serde::{Deserialize, Serialize};

use super::{header, RecordError};
use crate::{Position, SequenceState, TableId, TableObjects};

/// Header that marks a control record, its value the kind
/// ([`ControlRecord::kind`]).
pub const CONTROL_HEADER: &str = "tributary.control";
/// Kind: the source table was dropped.
pub const TABLE_DROPPED: &str = "table-dropped";
/// Kind: the table was copied again (after its changes were held back).
pub const TABLE_COPIED: &str = "table-copied";
/// Kind: the table's rows are about to be copied again from a source whose
/// positions may not compare with those the destination holds.
pub const TABLE_RESET: &str = "table-reset";
/// Kind: the state of a sequence one of the table's columns takes values
/// from.
pub const SEQUENCE: &str = "sequence";
/// Header of a sequence record: the [`SequenceState`] as JSON.
pub const SEQUENCE_HEADER: &str = "tributary.sequence";
/// Kind: the table's indexes, constraints and defaults as the source has
/// them now.
pub const OBJECTS: &str = "objects";
/// Header of an objects record: the [`TableObjects`] as JSON.
pub const OBJECTS_HEADER: &str = "tributary.objects";
/// Header of a table-copied record: the copy's position as `commit:index`.
pub const POSITION_HEADER: &str = "tributary.position";
/// Header of a table-reset record: the reset's id, a decimal number.
pub const RESET_HEADER: &str = "tributary.reset";
/// Kind: a range of the table's rows as the source has them at this point
/// of the change stream, for sinks to compare with the destination's.
pub const VERIFY: &str = "verify";
/// Header of a verify record: the [`VerifyRange`] as JSON.
pub const VERIFY_HEADER: &str = "tributary.verify";
/// Header of every control record: the source table's schema (a topic's
/// name may not say it: see [`crate::topic::legal_topic_name`]).
pub const SCHEMA_HEADER: &str = "tributary.source.schema";
/// Header of every control record: the source table's name.
pub const TABLE_NAME_HEADER: &str = "tributary.source.table";

/// One control record of a change topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ControlRecord {
    /// The source table was dropped: after every earlier change of it.
    /// Sinks drop the destination table when `drop_tables = true`.
    TableDropped {
        /// The dropped table.
        table: TableId,
    },
    /// The table was copied again after its changes were held back: every
    /// destination row older than `at` is gone at the source (the copy
    /// rewrote the rows that exist, at or after `at`). On every partition,
    /// after the copy's last row.
    TableCopied {
        /// The table.
        table: TableId,
        /// The copy's position (an empty copy: the greatest position a
        /// destination stores, so every row is older).
        at: Position,
    },
    /// The table is about to be copied again in another position domain
    /// (a source epoch change, `source-runner reset`, `POST /resync`):
    /// sinks forget the position of every row of the table, once per
    /// reset id, whichever partition's record comes first. On every
    /// partition, before any row of the copy.
    TableReset {
        /// The table.
        table: TableId,
        /// The reset's id: greater than every earlier reset's of the table
        /// (the source runner's clock in milliseconds when it was decided).
        reset: u64,
    },
    /// A sequence one of the table's columns takes values from (identity,
    /// `serial`, a default's `nextval`), as the source has it now: sinks
    /// that have sequences keep theirs at or above it. On one partition
    /// (whichever member applies it, it only moves forward), read at
    /// intervals: values handed out since are not in it.
    Sequence {
        /// The table.
        table: TableId,
        /// The sequence.
        state: SequenceState,
    },
    /// The table's indexes, constraints and defaults as the source has
    /// them now (the whole set: one missing from it was dropped), once the
    /// table is copied and whenever they change: sinks of the same kind
    /// make theirs match (docs/migration.md). On partition 0, read at
    /// intervals.
    Objects {
        /// The table.
        table: TableId,
        /// Its objects.
        objects: TableObjects,
    },
    /// A key range of the table as the source has it at this point of the
    /// stream (every earlier change of the table is before it, no later
    /// one): sinks compare it with the destination's rows of the range
    /// once they applied everything before it (docs/verification.md). On
    /// partition 0.
    Verify {
        /// The table.
        table: TableId,
        /// The range and its rows' digests.
        range: VerifyRange,
    },
}

/// A key range of a table and the digests of its rows at the source
/// ([`crate::canonical`]), one part of a verification.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerifyRange {
    /// The verification's id: the source runner's clock in milliseconds
    /// when it was asked.
    pub id: u64,
    /// The source position the rows were read at.
    pub at: Position,
    /// The source's kind, as its change events name it
    /// (`source.connector`).
    #[serde(default)]
    pub connector: String,
    /// The registry's id of the table's value schema the digests follow
    /// (its columns, in order).
    pub schema_id: u32,
    /// The registry's id of the table's key schema, if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_schema_id: Option<u32>,
    /// Exclusive lower bound: the key's canonical texts (none: from the
    /// first row).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<Vec<Option<String>>>,
    /// Inclusive upper bound (none: to the last row).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<Vec<Option<String>>>,
    /// Whether this is the verification's last range of the table.
    #[serde(default)]
    pub last: bool,
    /// The rows of the range in key order: key text, hash (hex), column
    /// fingerprints (hex).
    pub rows: Vec<(String, String, String)>,
    /// On a topic of several partitions, the partition this copy of the
    /// range is written to: its rows are the range's keys the producer
    /// puts there (see [`crate::encoder::partition_of`]), and each partition
    /// has a copy (none: the topic has one partition, all the rows).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<RangePartition>,
    /// The columns the digests cover, in order (none: those of the value
    /// schema `schema_id`). A column dropped at the source stays in the
    /// registry's schema (relaxed, for compatibility) and in the
    /// destination; the digests cover the source's current columns only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub columns: Option<Vec<String>>,
    /// Set when the source summed the range's rows in SQL instead of
    /// sending their digests (`rows` is empty then): a destination that
    /// computes the same summary compares it; one that cannot, or finds it
    /// different, asks the source for the range's row digests
    /// ([`crate::records::requests::Request::Verify`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<RangeSummary>,
}

/// A range's rows summed by the source database itself: how many, and the
/// sum of a 64-bit hash of each row's text, computed by [`RangeSummary::method`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RangeSummary {
    /// How the hashes were computed (the SQL and session settings; see
    /// `connectors::pgwire::summary`): a destination compares only a
    /// summary whose method it computes.
    pub method: String,
    /// The range's rows.
    pub rows: u64,
    /// The sum of the rows' hashes, in decimal.
    pub sum: String,
    /// Each digested column's type at the source (`format_type`'s
    /// spelling): the row texts are equal only where the destination's
    /// columns have the same types.
    pub types: Vec<String>,
}

/// Which partition a copy of a verify range is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RangePartition {
    /// The partition.
    pub partition: i32,
    /// The topic's partitions when the range was written.
    pub of: i32,
}

impl VerifyRange {
    /// The range's rows as digests; an entry that does not read is an
    /// error naming it.
    pub fn digests(&self) -> Result<Vec<crate::canonical::RowDigest>, String> {
        self.rows
            .iter()
            .map(|(key, hash, columns)| {
                let hash = u64::from_str_radix(hash, 16).map_err(|_| format!("hash {hash:?} of key {key}"))?;
                let columns = (0..columns.len())
                    .step_by(2)
                    .map(|i| columns.get(i..i + 2).and_then(|b| u8::from_str_radix(b, 16).ok()))
                    .collect::<Option<Vec<u8>>>()
                    .ok_or_else(|| format!("column fingerprints of key {key}"))?;
                Ok(crate::canonical::RowDigest { key: key.clone(), hash, columns })
            })
            .collect()
    }

    /// A range of `schema`'s rows read by a source at `at` for
    /// verification `id`: after `bounds.0` up to `bounds.1`, with its rows'
    /// entries ([`VerifyRange::entry`]) over every column of `schema`. The
    /// registry ids are the source runner's to fill.
    pub fn read(
        id: u64,
        at: crate::Position,
        connector: &str,
        schema: &crate::TableSchema,
        bounds: crate::records::requests::KeyBounds,
        last: bool,
        rows: Vec<(String, String, String)>,
    ) -> Self {
        let (after, until) = bounds;
        Self {
            id,
            at,
            connector: connector.to_string(),
            schema_id: 0,
            key_schema_id: None,
            partition: None,
            columns: Some(schema.columns.iter().map(|c| c.name.clone()).collect()),
            summary: None,
            after,
            until,
            last,
            rows,
        }
    }

    /// A row's entry in [`VerifyRange::rows`].
    pub fn entry(digest: &crate::canonical::RowDigest) -> (String, String, String) {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut columns = String::with_capacity(digest.columns.len() * 2);
        for b in &digest.columns {
            columns.push(DIGITS[usize::from(b >> 4)] as char);
            columns.push(DIGITS[usize::from(b & 15)] as char);
        }
        (digest.key.clone(), format!("{:016x}", digest.hash), columns)
    }
}

impl ControlRecord {
    /// The table the record is about.
    pub fn table(&self) -> &TableId {
        match self {
            ControlRecord::TableDropped { table }
            | ControlRecord::TableCopied { table, .. }
            | ControlRecord::TableReset { table, .. }
            | ControlRecord::Sequence { table, .. }
            | ControlRecord::Objects { table, .. }
            | ControlRecord::Verify { table, .. } => table,
        }
    }

    /// Its kind: the value of [`CONTROL_HEADER`].
    pub fn kind(&self) -> &'static str {
        match self {
            ControlRecord::TableDropped { .. } => TABLE_DROPPED,
            ControlRecord::TableCopied { .. } => TABLE_COPIED,
            ControlRecord::TableReset { .. } => TABLE_RESET,
            ControlRecord::Sequence { .. } => SEQUENCE,
            ControlRecord::Objects { .. } => OBJECTS,
            ControlRecord::Verify { .. } => VERIFY,
        }
    }

    /// The record's headers, in the order they are written: the kind, what
    /// the kind carries, then the table's names.
    pub fn headers(&self) -> Vec<(&'static str, String)> {
        let mut out = vec![(CONTROL_HEADER, self.kind().to_string())];
        match self {
            ControlRecord::TableDropped { .. } => {}
            ControlRecord::TableCopied { at, .. } => {
                out.push((POSITION_HEADER, format!("{}:{}", at.commit, at.index)));
            }
            ControlRecord::TableReset { reset, .. } => out.push((RESET_HEADER, reset.to_string())),
            // Plain data: serializing it cannot fail.
            ControlRecord::Sequence { state, .. } => {
                out.push((SEQUENCE_HEADER, serde_json::to_string(state).unwrap_or_default()))
            }
            ControlRecord::Objects { objects, .. } => {
                out.push((OBJECTS_HEADER, serde_json::to_string(objects).unwrap_or_default()))
            }
            ControlRecord::Verify { range, .. } => {
                out.push((VERIFY_HEADER, serde_json::to_string(range).unwrap_or_default()))
            }
        }
        let table = self.table();
        out.push((SCHEMA_HEADER, table.schema.clone()));
        out.push((TABLE_NAME_HEADER, table.table.clone()));
        out
    }

    /// The control record a null-valued record's headers hold: `Ok(None)`
    /// when they hold none (a tombstone). `topic_table` names the table
    /// when the headers do not (records of runners older than the name
    /// headers). A kind this build does not know (a newer source runner's)
    /// is an error naming it; the caller decides what to do with it.
    pub fn decode(
        headers: &[(String, Option<Vec<u8>>)],
        topic_table: &TableId,
    ) -> Result<Option<ControlRecord>, RecordError> {
        let Some(kind) = header(headers, CONTROL_HEADER) else {
            return Ok(None);
        };
        let table = match (header(headers, SCHEMA_HEADER), header(headers, TABLE_NAME_HEADER)) {
            (Some(schema), Some(table)) => TableId::new(schema, table),
            _ => topic_table.clone(),
        };
        let record = match kind {
            TABLE_DROPPED => ControlRecord::TableDropped { table },
            TABLE_COPIED => {
                let at = header(headers, POSITION_HEADER)
                    .and_then(|p| {
                        let (commit, index) = p.split_once(':')?;
                        Some(Position {
                            commit: commit.parse().ok()?,
                            index: index.parse().ok()?,
                        })
                    })
                    .ok_or_else(|| {
                        RecordError::unreadable(
                            format!("a {TABLE_COPIED} control record of {table}"),
                            format!("no readable {POSITION_HEADER} header (commit:index)"),
                        )
                    })?;
                ControlRecord::TableCopied { table, at }
            }
            TABLE_RESET => {
                let reset = header(headers, RESET_HEADER).and_then(|r| r.parse().ok()).ok_or_else(|| {
                    RecordError::unreadable(
                        format!("a {TABLE_RESET} control record of {table}"),
                        format!("no readable {RESET_HEADER} header (a decimal reset id)"),
                    )
                })?;
                ControlRecord::TableReset { table, reset }
            }
            SEQUENCE => {
                let state = header(headers, SEQUENCE_HEADER)
                    .and_then(|s| serde_json::from_str::<SequenceState>(s).ok())
                    .ok_or_else(|| {
                        RecordError::unreadable(
                            format!("a {SEQUENCE} control record of {table}"),
                            format!("no readable {SEQUENCE_HEADER} header (the sequence's state as JSON)"),
                        )
                    })?;
                ControlRecord::Sequence { table, state }
            }
            OBJECTS => {
                let objects = header(headers, OBJECTS_HEADER)
                    .and_then(|s| serde_json::from_str::<TableObjects>(s).ok())
                    .ok_or_else(|| {
                        RecordError::unreadable(
                            format!("a {OBJECTS} control record of {table}"),
                            format!("no readable {OBJECTS_HEADER} header (the table's objects as JSON)"),
                        )
                    })?;
                ControlRecord::Objects { table, objects }
            }
            VERIFY => {
                let range = header(headers, VERIFY_HEADER)
                    .and_then(|s| serde_json::from_str::<VerifyRange>(s).ok())
                    .ok_or_else(|| {
                        RecordError::unreadable(
                            format!("a {VERIFY} control record of {table}"),
                            format!("no readable {VERIFY_HEADER} header (the range as JSON)"),
                        )
                    })?;
                ControlRecord::Verify { table, range }
            }
            other => return Err(RecordError::UnknownKind { table, kind: other.to_string() }),
        };
        Ok(Some(record))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owned(headers: &[(&str, String)]) -> Vec<(String, Option<Vec<u8>>)> {
        headers
            .iter()
            .map(|(k, v)| (k.to_string(), Some(v.as_bytes().to_vec())))
            .collect()
    }

    fn table() -> TableId {
        TableId::new("public", "order items$2")
    }

    fn sequence() -> SequenceState {
        SequenceState {
            schema: "public".into(),
            name: "order items$2_id_seq".into(),
            data_type: "bigint".into(),
            increment: 1,
            min: 1,
            max: i64::MAX,
            cycle: false,
            last_value: 42,
            is_called: true,
        }
    }

    pub(crate) fn objects() -> TableObjects {
        use crate::{ColumnDefault, ConstraintKind, ConstraintObject, ForeignKeyTarget, IndexObject};
        TableObjects {
            indexes: vec![IndexObject {
                name: "items_lower_idx".into(),
                unique: false,
                definition: "USING btree (lower(name)) WHERE (qty > 0)".into(),
            }],
            constraints: vec![
                ConstraintObject {
                    name: "qty_positive".into(),
                    kind: ConstraintKind::Check,
                    definition: "CHECK ((qty > 0))".into(),
                    references: None,
                },
                ConstraintObject {
                    name: "items_order_fk".into(),
                    kind: ConstraintKind::ForeignKey,
                    definition: "FOREIGN KEY (order_id)".into(),
                    references: Some(ForeignKeyTarget {
                        table: TableId::new("public", "orders"),
                        columns: vec!["id".into()],
                        options: "ON DELETE CASCADE".into(),
                    }),
                },
            ],
            defaults: vec![ColumnDefault {
                column: "id".into(),
                expression: String::new(),
                sequence: Some(TableId::new("public", "order items$2_id_seq")),
                identity_always: Some(true),
            }],
        }
    }

    pub(crate) fn verify_range() -> VerifyRange {
        VerifyRange {
            id: 1_733_500_000_123,
            at: Position { commit: 42, index: 0 },
            connector: "postgresql".into(),
            schema_id: 7,
            key_schema_id: Some(8),
            partition: None,
            columns: None,
            summary: None,
            after: Some(vec![Some("10".into())]),
            until: None,
            last: true,
            rows: vec![("[\"11\"]".into(), "00ff00ff00ff00ff".into(), "01a2".into())],
        }
    }

    #[test]
    fn every_kind_decodes_to_what_was_encoded() {
        let topic_table = TableId::new("public", "order_items_2_0c2b1c53");
        for record in [
            ControlRecord::TableDropped { table: table() },
            ControlRecord::TableCopied {
                table: table(),
                at: Position { commit: 9_223_372_036_854_775_807, index: 3 },
            },
            ControlRecord::TableReset { table: table(), reset: 1_733_500_000_123 },
            ControlRecord::Sequence { table: table(), state: sequence() },
            ControlRecord::Objects { table: table(), objects: objects() },
            ControlRecord::Objects { table: table(), objects: TableObjects::default() },
            ControlRecord::Verify { table: table(), range: verify_range() },
            ControlRecord::Verify {
                table: table(),
                range: VerifyRange {
                    partition: Some(RangePartition { partition: 2, of: 3 }),
                    ..verify_range()
                },
            },
        ] {
            let decoded = ControlRecord::decode(&owned(&record.headers()), &topic_table).expect("decodes");
            assert_eq!(decoded, Some(record));
        }
    }

    #[test]
    fn records_without_names_are_the_topics_table_and_tombstones_are_none() {
        let topic_table = TableId::new("public", "orders");
        let old = owned(&[(CONTROL_HEADER, TABLE_DROPPED.into())]);
        assert_eq!(
            ControlRecord::decode(&old, &topic_table),
            Ok(Some(ControlRecord::TableDropped { table: topic_table.clone() }))
        );
        let old = owned(&[(CONTROL_HEADER, TABLE_COPIED.into()), (POSITION_HEADER, "12:0".into())]);
        assert_eq!(
            ControlRecord::decode(&old, &topic_table),
            Ok(Some(ControlRecord::TableCopied {
                table: topic_table.clone(),
                at: Position { commit: 12, index: 0 }
            }))
        );
        assert_eq!(ControlRecord::decode(&[], &topic_table), Ok(None));
        assert_eq!(ControlRecord::decode(&owned(&[("trace", "x".into())]), &topic_table), Ok(None));
    }

    #[test]
    fn unreadable_records_name_kind_table_and_header() {
        let t = TableId::new("public", "orders");
        let e = ControlRecord::decode(&owned(&[(CONTROL_HEADER, TABLE_COPIED.into())]), &t).unwrap_err();
        assert!(e.to_string().contains("table-copied control record of public.orders"), "{e}");
        assert!(e.to_string().contains(POSITION_HEADER), "{e}");
        let bad = owned(&[(CONTROL_HEADER, TABLE_RESET.into()), (RESET_HEADER, "soon".into())]);
        assert!(ControlRecord::decode(&bad, &t).unwrap_err().to_string().contains(RESET_HEADER));
        let newer = owned(&[(CONTROL_HEADER, "table-verified".into())]);
        assert_eq!(
            ControlRecord::decode(&newer, &t),
            Err(RecordError::UnknownKind { table: t.clone(), kind: "table-verified".into() })
        );
    }

    #[test]
    fn a_later_header_of_the_same_name_wins() {
        let t = TableId::new("s", "t");
        let h = owned(&[
            (CONTROL_HEADER, TABLE_RESET.into()),
            (RESET_HEADER, "1".into()),
            (RESET_HEADER, "2".into()),
        ]);
        assert_eq!(ControlRecord::decode(&h, &t), Ok(Some(ControlRecord::TableReset { table: t, reset: 2 })));
    }
}

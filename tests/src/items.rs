//! The `items` test table of the sink tests and change events on it:
//! `items(id int4 key, name varchar(40), qty int4, price numeric(10,2))`.

use std::sync::Arc;

use tributary_connectors::{KafkaPosition, SinkBatch, SinkRecord};
use tributary_schemas::{
    ChangeEvent, Column, DataType, Op, Position, SnapshotMarker, SourceInfo, TableId, TableSchema, Value,
};

/// A column with the source's own type text.
pub fn column(name: &str, data_type: DataType, nullable: bool, source_type: &str) -> Column {
    Column {
        name: name.into(),
        data_type,
        nullable,
        source_type: source_type.into(),
        default: None,
        aliases: Vec::new(),
        column_id: None,
    }
}

/// `items(id int4 key, name varchar(40), qty int4, price numeric(10,2))`.
pub fn items() -> Arc<TableSchema> {
    Arc::new(TableSchema {
        id: TableId::new("public", "items"),
        columns: vec![
            column("id", DataType::Int32, false, "integer"),
            column("name", DataType::Text, true, "character varying(40)"),
            column("qty", DataType::Int32, true, "integer"),
            column("price", DataType::Decimal { precision: 10, scale: 2 }, true, "numeric(10,2)"),
        ],
        key: vec!["id".into()],
        dropped: Vec::new(),
    })
}

/// A full row of `items`.
pub fn row(id: i32, name: &str, qty: i32, price: &str) -> Vec<Value> {
    vec![
        Value::Int32(id),
        Value::Text(name.into()),
        Value::Int32(qty),
        Value::Decimal(price.into()),
    ]
}

/// A before-image with only the key.
pub fn key_row(id: i32) -> Vec<Value> {
    vec![Value::Int32(id), Value::Null, Value::Null, Value::Null]
}

/// A change event at source position (`commit`, `index`).
pub fn event(
    schema: &Arc<TableSchema>,
    op: Op,
    before: Option<Vec<Value>>,
    after: Option<Vec<Value>>,
    commit: u64,
    index: u64,
) -> ChangeEvent {
    ChangeEvent {
        schema: schema.clone(),
        op,
        before,
        after,
        source: SourceInfo {
            connector: "postgresql".into(),
            name: "test".into(),
            db: "source".into(),
            ts_ms: 1_700_000_000_000 + commit as i64,
            snapshot: if op == Op::Read {
                SnapshotMarker::True
            } else {
                SnapshotMarker::False
            },
            tx_id: None,
            position: Position { commit, index },
            native_position: "".into(),
        },
        ts_ms: 0,
        transaction: None,
    }
}

/// Records on partition 0 of `topic` from `first_offset`, with the offsets
/// they cover.
pub fn batch(topic: &str, first_offset: i64, events: Vec<ChangeEvent>) -> SinkBatch {
    let n = events.len() as i64;
    let table = events
        .first()
        .map(|e| e.schema.id.clone())
        .unwrap_or_else(|| TableId::new("public", "items"));
    SinkBatch {
        table,
        records: events
            .into_iter()
            .enumerate()
            .map(|(i, e)| {
                (
                    KafkaPosition {
                        topic: topic.into(),
                        partition: 0,
                        offset: first_offset + i as i64,
                    },
                    SinkRecord::Change(e),
                )
            })
            .collect(),
        next_offsets: vec![(topic.into(), 0, first_offset + n)],
        expected_offsets: Vec::new(),
        unit: tributary_connectors::UnitPart::default(),
    }
}

/// Changes on top of a snapshot of ids 1..=100 (`item {i}`, qty `i`,
/// price 1.50) at commit 10: an update, a delete, an insert then update, a
/// delete then insert of the same key (the insert wins), an insert then
/// delete (gone), and a key change (the old key disappears).
pub fn mixed_changes(s: &Arc<TableSchema>) -> Vec<ChangeEvent> {
    vec![
        event(s, Op::Update, Some(row(1, "item 1", 1, "1.50")), Some(row(1, "renamed", 7, "2.25")), 11, 0),
        event(s, Op::Delete, Some(key_row(2)), None, 11, 1),
        event(s, Op::Create, None, Some(row(101, "new", 1, "9.99")), 12, 0),
        event(s, Op::Update, None, Some(row(101, "newer", 2, "9.99")), 12, 1),
        event(s, Op::Delete, Some(key_row(3)), None, 13, 0),
        event(s, Op::Create, None, Some(row(3, "again", 3, "3.00")), 14, 0),
        event(s, Op::Create, None, Some(row(102, "brief", 1, "1.00")), 15, 0),
        event(s, Op::Delete, Some(key_row(102)), None, 15, 1),
        event(s, Op::Update, Some(row(4, "item 4", 4, "1.50")), Some(row(104, "moved", 4, "1.50")), 16, 0),
    ]
}

/// Checks the rows (`id|name|qty|price`) after the snapshot and
/// [`mixed_changes`].
pub fn assert_after_mixed_changes(rows: &[String]) {
    assert_eq!(rows.len(), 100, "100 - 2 (deleted) - 4 (moved away) + 101 + 104");
    for expected in [
        "1|renamed|7|2.25",
        "101|newer|2|9.99",
        "3|again|3|3.00",
        "104|moved|4|1.50",
    ] {
        assert!(rows.iter().any(|r| r == expected), "{expected} missing from {rows:?}");
    }
    assert!(!rows
        .iter()
        .any(|r| r.starts_with("2|") || r.starts_with("4|") || r.starts_with("102|")));
}

/// A truncate at commit 20, an insert after it and an insert older than
/// it: afterwards only `500|after|1|1.00` is left.
pub fn truncate_changes(s: &Arc<TableSchema>) -> Vec<ChangeEvent> {
    vec![
        event(s, Op::Truncate, None, None, 20, 0),
        event(s, Op::Create, None, Some(row(500, "after", 1, "1.00")), 21, 0),
        event(s, Op::Create, None, Some(row(501, "stale", 1, "1.00")), 19, 0),
    ]
}

//! Property test: random table schemas (every `DataType`, nullable or not,
//! random keys) and random rows survive encode + decode unchanged, and
//! apache-avro reads every datum we write with the schema we generated.
//!
//! A failure prints the minimal case and its seed, and proptest saves it to
//! `tests/roundtrip.proptest-regressions` so that the next run tries it
//! first. To replay or vary a run, set `PROPTEST_RNG_SEED=<u64>` (a fixed
//! random seed) and/or `PROPTEST_CASES=<n>`, e.g.
//! `PROPTEST_RNG_SEED=42 PROPTEST_CASES=2000 cargo test -p tributary-schemas --test roundtrip`.

mod fixtures;

use std::collections::BTreeSet;
use std::sync::Arc;

use proptest::prelude::*;
use tributary_schemas::avro::may_need_source_text;
use tributary_schemas::decoder::Decoded;
use tributary_schemas::{
    ChangeEvent, Column, DataType, EnvelopeOptions, EventDecoder, EventEncoder, Op, Position, Registry, SnapshotMarker,
    SourceInfo, TableId, TableSchema, TransactionInfo, Value,
};

fn leaf_type() -> impl Strategy<Value = DataType> {
    prop_oneof![
        Just(DataType::Boolean),
        Just(DataType::Int16),
        Just(DataType::Int32),
        Just(DataType::Int64),
        Just(DataType::Float32),
        Just(DataType::Float64),
        (1u32..=60)
            .prop_flat_map(|p| (Just(p), 0..=p))
            .prop_map(|(precision, scale)| DataType::Decimal { precision, scale }),
        Just(DataType::VariableDecimal),
        Just(DataType::Text),
        Just(DataType::Json),
        Just(DataType::Uuid),
        Just(DataType::Bytes),
        (2u32..=40).prop_map(|length| DataType::Bits { length }),
        Just(DataType::Date),
        Just(DataType::Time),
        Just(DataType::TimeSpan),
        Just(DataType::Timestamp),
        Just(DataType::TimestampTz),
        Just(DataType::Interval),
        prop::collection::btree_set("[a-z,' ]{1,6}", 1..5)
            .prop_map(|s: BTreeSet<String>| DataType::Enum { symbols: s.into_iter().collect() }),
        Just(DataType::Geometry),
    ]
}

fn data_type() -> impl Strategy<Value = DataType> {
    leaf_type().prop_recursive(2, 8, 1, |inner| inner.prop_map(|t| DataType::Array(Box::new(t))))
}

fn digits(n: usize) -> impl Strategy<Value = String> {
    prop::collection::vec(0u8..10, n).prop_map(|d| d.into_iter().map(|x| char::from(b'0' + x)).collect())
}

/// Decimal text in the decoder's canonical form: no leading zeros, the
/// given number of fraction digits, no negative zero.
fn canonical_decimal(max_int_digits: usize, scale: usize) -> impl Strategy<Value = String> {
    (0..=max_int_digits, any::<bool>())
        .prop_flat_map(move |(n, neg)| (digits(n), digits(scale), Just(neg)))
        .prop_map(|(int, frac, neg)| {
            let int = int.trim_start_matches('0');
            let int = if int.is_empty() { "0" } else { int };
            let mut s = String::new();
            let zero = int == "0" && frac.bytes().all(|b| b == b'0');
            if neg && !zero {
                s.push('-');
            }
            s.push_str(int);
            if !frac.is_empty() {
                s.push('.');
                s.push_str(&frac);
            }
            s
        })
}

fn value_of(t: &DataType) -> BoxedStrategy<Value> {
    match t {
        DataType::Boolean => any::<bool>().prop_map(Value::Boolean).boxed(),
        DataType::Int16 => any::<i16>().prop_map(Value::Int16).boxed(),
        DataType::Int32 => any::<i32>().prop_map(Value::Int32).boxed(),
        DataType::Int64 => any::<i64>().prop_map(Value::Int64).boxed(),
        // NaN is a valid float value but never equal to itself.
        DataType::Float32 => any::<f32>()
            .prop_filter("not NaN", |f| !f.is_nan())
            .prop_map(Value::Float32)
            .boxed(),
        DataType::Float64 => any::<f64>()
            .prop_filter("not NaN", |f| !f.is_nan())
            .prop_map(Value::Float64)
            .boxed(),
        DataType::Decimal { precision, scale } => canonical_decimal((precision - scale) as usize, *scale as usize)
            .prop_map(Value::Decimal)
            .boxed(),
        DataType::VariableDecimal => (0usize..25)
            .prop_flat_map(|scale| canonical_decimal(45, scale))
            .prop_map(Value::Decimal)
            .boxed(),
        DataType::Text => "\\PC{0,20}".prop_map(Value::Text).boxed(),
        DataType::Json => "\\PC{0,20}".prop_map(Value::Json).boxed(),
        DataType::Uuid => any::<u128>().prop_map(|u| Value::Uuid(uuid::Uuid::from_u128(u))).boxed(),
        DataType::Bytes => prop::collection::vec(any::<u8>(), 0..20).prop_map(Value::Bytes).boxed(),
        DataType::Bits { length } => prop::collection::vec(any::<u8>(), length.div_ceil(8) as usize)
            .prop_map(Value::Bytes)
            .boxed(),
        DataType::Date => any::<i32>().prop_map(Value::Date).boxed(),
        DataType::Time | DataType::TimeSpan => any::<i64>().prop_map(Value::Time).boxed(),
        DataType::Timestamp => any::<i64>().prop_map(Value::Timestamp).boxed(),
        DataType::TimestampTz => any::<i64>().prop_map(Value::TimestampTz).boxed(),
        DataType::Interval => (any::<i32>(), any::<i32>(), any::<i64>())
            .prop_map(|(months, days, micros)| Value::Interval { months, days, micros })
            .boxed(),
        DataType::Enum { symbols } => prop::sample::select(symbols.clone()).prop_map(Value::Enum).boxed(),
        DataType::Array(inner) => prop::collection::vec(prop::option::of(value_of(inner)), 0..4)
            .prop_map(|items| Value::Array(items.into_iter().map(|v| v.unwrap_or(Value::Null)).collect()))
            .boxed(),
        DataType::Geometry => prop::collection::vec(any::<u8>(), 0..30).prop_map(Value::Geometry).boxed(),
    }
}

fn table() -> impl Strategy<Value = Arc<TableSchema>> {
    let column = (
        data_type(),
        any::<bool>(),
        prop::sample::select(vec!["c", "col-", "Prix €", "9x"]),
        "[a-z()0-9, ]{0,12}",
    );
    prop::collection::vec(column, 1..12)
        .prop_flat_map(|cols| {
            let n = cols.len();
            (Just(cols), prop::sample::subsequence((0..n).collect::<Vec<_>>(), 0..=n.min(3)))
        })
        .prop_map(|(cols, key)| {
            let columns: Vec<Column> = cols
                .into_iter()
                .enumerate()
                .map(|(i, (data_type, nullable, prefix, source_type))| Column {
                    name: format!("{prefix}{i}"),
                    data_type,
                    nullable,
                    source_type,
                    default: None,
                    aliases: Vec::new(),
                    column_id: None,
                })
                .collect();
            let key = key.iter().map(|&i| columns[i].name.clone()).collect();
            Arc::new(TableSchema {
                id: TableId::new("app-schema", "orders"),
                columns,
                key,
                dropped: Vec::new(),
            })
        })
}

fn row_of(t: &TableSchema) -> BoxedStrategy<Vec<Value>> {
    t.columns
        .iter()
        .map(|c| {
            let value = if c.nullable {
                prop_oneof![1 => Just(Value::Null), 3 => value_of(&c.data_type)].boxed()
            } else {
                value_of(&c.data_type)
            };
            if may_need_source_text(&c.data_type) {
                // The source's text beside the nearest value the column
                // holds (kept only in PostgreSQL events, see `event`).
                let source_text = (value.clone(), "\\PC{0,12}")
                    .prop_map(|(nearest, text)| Value::SourceText { text, nearest: Box::new(nearest) });
                prop_oneof![3 => value, 1 => source_text].boxed()
            } else {
                value
            }
        })
        .collect::<Vec<_>>()
        .boxed()
}

/// `row` without source texts (the nearest values), for a connector whose
/// tables have no source-text field.
fn nearest(row: Vec<Value>) -> Vec<Value> {
    row.into_iter()
        .map(|v| match v {
            Value::SourceText { nearest, .. } => *nearest,
            v => v,
        })
        .collect()
}

fn event() -> impl Strategy<Value = (ChangeEvent, bool)> {
    table().prop_flat_map(|t| {
        let op = prop::sample::select(vec![Op::Read, Op::Create, Op::Update, Op::Delete, Op::Truncate]);
        let source = (
            any::<bool>(),
            any::<u64>(),
            any::<u64>(),
            prop::option::of("[0-9]{1,6}"),
            prop::sample::select(vec![SnapshotMarker::False, SnapshotMarker::True, SnapshotMarker::Last]),
            any::<i64>(),
        );
        let tx = prop::option::of(("[a-z0-9:]{1,10}", any::<i64>(), any::<i64>()));
        (Just(t.clone()), op, row_of(&t), row_of(&t), any::<bool>(), source, tx, any::<i64>()).prop_map(
            |(t, op, r1, r2, with_before, (pg, commit, index, tx_id, snapshot, ts), tx, ts_ms)| {
                let (r1, r2) = if pg { (r1, r2) } else { (nearest(r1), nearest(r2)) };
                let (before, after) = match op {
                    Op::Read | Op::Create => (None, Some(r2)),
                    Op::Update => (with_before.then_some(r1), Some(r2)),
                    Op::Delete => (Some(r1), None),
                    Op::Truncate => (None, None),
                };
                let native_position = if pg {
                    format!("{:X}/{:X}", commit >> 32, commit & 0xffff_ffff)
                } else {
                    format!("mysql-bin.000003:{commit}")
                };
                let event = ChangeEvent {
                    schema: t,
                    op,
                    before,
                    after,
                    source: SourceInfo {
                        connector: if pg { "postgresql" } else { "mysql" }.into(),
                        name: "app".into(),
                        db: "appdb".into(),
                        ts_ms: ts,
                        snapshot,
                        tx_id,
                        position: Position { commit, index },
                        native_position: native_position.into(),
                    },
                    ts_ms,
                    transaction: tx.map(|(id, total_order, data_collection_order)| TransactionInfo {
                        id,
                        total_order,
                        data_collection_order,
                    }),
                };
                (event, pg)
            },
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn random_events_round_trip((event, pg) in event()) {
        let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        rt.block_on(async {
            let registry = Registry::in_memory();
            let options = EnvelopeOptions::for_connector(if pg { "postgresql" } else { "mysql" });
            let mut encoder = EventEncoder::new(registry.clone(), options);
            let topic = "app.app-schema.orders";
            encoder.prepare(&event.schema, topic).await.expect("prepare");
            let rec = encoder.encode(&event, topic).expect("encode");

            let (schemas, _, _) = encoder.prepared(topic).expect("prepared");
            let value_schema = apache_avro::Schema::parse_str(&schemas.value).expect("value schema parses");
            let value = rec.value.as_deref().expect("value");
            let (_, left) = fixtures::apache_read(&value_schema, &value[5..]);
            assert_eq!(left, 0, "apache-avro left bytes unread");
            if let (Some(key), Some(key_schema)) = (rec.key.as_deref(), schemas.key.as_deref()) {
                let key_schema = apache_avro::Schema::parse_str(key_schema).expect("key schema parses");
                let (_, left) = fixtures::apache_read(&key_schema, &key[5..]);
                assert_eq!(left, 0);
            }

            let mut decoder = EventDecoder::new(registry);
            let decoded = decoder.decode(topic, rec.key.as_deref(), rec.value.as_deref()).await.expect("decode");
            assert_eq!(decoded, Decoded::Change(event.clone()));
        });
    }
}

/// A PostgreSQL table with a column that may hold a value without an exact
/// form has the source-text field, a Debezium-minded reader sees the
/// nearest values in the columns, and the decoder puts each text back
/// beside its value; a table without such a column, or of another
/// connector, has no such field.
#[tokio::test]
async fn source_texts_travel_beside_the_row() {
    let table = Arc::new(TableSchema {
        id: TableId::new("public", "t"),
        columns: vec![
            Column::new("id", DataType::Int32, false),
            Column::new("n", DataType::VariableDecimal, true),
            Column::new("nn", DataType::Decimal { precision: 10, scale: 2 }, false),
            Column::new("a", DataType::Array(Box::new(DataType::Int32)), true),
            Column::new("__tributary_source_text", DataType::Text, true),
            Column::new("b", DataType::Bits { length: 12 }, true),
        ],
        key: vec!["id".into()],
        dropped: Vec::new(),
    });
    let text = |t: &str, nearest: Value| Value::SourceText { text: t.into(), nearest: Box::new(nearest) };
    let row = vec![
        Value::Int32(1),
        text("NaN", Value::Null),
        text("-Infinity", Value::Decimal("0.00".into())),
        text("[0:1]={7,8}", Value::Array(vec![Value::Int32(7), Value::Int32(8)])),
        Value::Text("a column of the field's name".into()),
        Value::Bytes(vec![0x05, 0x00]),
    ];
    let event = ChangeEvent {
        schema: table.clone(),
        op: Op::Create,
        before: None,
        after: Some(row.clone()),
        source: SourceInfo {
            connector: "postgresql".into(),
            name: "app".into(),
            db: "db".into(),
            ts_ms: 0,
            snapshot: SnapshotMarker::False,
            tx_id: None,
            position: Position { commit: 1, index: 0 },
            native_position: "0/1".into(),
        },
        ts_ms: 0,
        transaction: None,
    };
    let registry = Registry::in_memory();
    let mut encoder = EventEncoder::new(registry.clone(), EnvelopeOptions::default());
    encoder.prepare(&table, "app.public.t").await.expect("prepare");
    let (schemas, _, _) = encoder.prepared("app.public.t").expect("prepared");
    let value: serde_json::Value = serde_json::from_str(&schemas.value).expect("json");
    let record = &value["fields"][0]["type"][1];
    // The field's name is taken by a column: one `_` more.
    assert_eq!(record["tributary.source_text"], "__tributary_source_text_");
    let fields = record["fields"].as_array().expect("fields");
    assert_eq!(fields.last().map(|f| f["name"].clone()), Some("__tributary_source_text_".into()));
    let bits = &fields[5]["type"][1];
    assert_eq!(bits["connect.name"], "io.debezium.data.Bits");
    assert_eq!(bits["connect.parameters"]["length"], "12");

    let rec = encoder.encode(&event, "app.public.t").expect("encode");
    // apache-avro (a stock reader) reads the nearest values and the JSON.
    let value_schema = apache_avro::Schema::parse_str(&schemas.value).expect("value schema parses");
    let (datum, left) = fixtures::apache_read(&value_schema, &rec.value.as_deref().expect("value")[5..]);
    assert_eq!(left, 0);
    let shown = format!("{datum:?}");
    assert!(shown.contains(r#"{\"a\":\"[0:1]={7,8}\",\"n\":\"NaN\",\"nn\":\"-Infinity\"}"#), "{shown}");

    let mut decoder = EventDecoder::new(registry);
    let decoded = decoder
        .decode("app.public.t", rec.key.as_deref(), rec.value.as_deref())
        .await
        .expect("decode");
    let Decoded::Change(back) = decoded else {
        panic!("a change")
    };
    assert_eq!(back.after, Some(row));
    assert_eq!(back.schema.columns.len(), 6, "the field is no column");
    assert_eq!(back.schema.columns[5].data_type, DataType::Bits { length: 12 });

    // No column that can need it, or another connector: no field.
    for (columns, connector) in [
        (
            vec![
                Column::new("id", DataType::Int32, false),
                Column::new("s", DataType::Text, true),
            ],
            "postgresql",
        ),
        (table.columns.clone(), "mysql"),
    ] {
        let t = TableSchema { columns, ..(*table).clone() };
        let s = tributary_schemas::avro::envelope(&t, "app.public.t", &EnvelopeOptions::for_connector(connector))
            .expect("schemas");
        assert!(!s.value.contains("tributary.source_text"), "{connector}");
    }
}

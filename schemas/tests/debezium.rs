//! Debezium's own envelopes (PostgreSQL and MySQL connectors, Avro
//! converter) decode into the model: column types from `connect.name`
//! hints, keys from the key schema, positions from `lsn`/`sequence` and
//! binlog file/pos. The datums are written by apache-avro, not by us.

mod fixtures;

use std::sync::Arc;

use apache_avro::types::Value as A;
use tributary_schemas::decoder::Decoded;
use tributary_schemas::{
    ChangeEvent, Column, DataType, EventDecoder, Op, Position, Registry, SnapshotMarker, SourceInfo, TableId,
    TableSchema, TransactionInfo, Value,
};

const PG_VALUE: &str = include_str!("debezium/postgres.value.avsc");
const PG_KEY: &str = include_str!("debezium/postgres.key.avsc");
const MYSQL_VALUE: &str = include_str!("debezium/mysql.value.avsc");
const MYSQL_KEY: &str = include_str!("debezium/mysql.key.avsc");

fn some(v: A) -> A {
    A::Union(1, Box::new(v))
}
fn none() -> A {
    A::Union(0, Box::new(A::Null))
}
fn rec(fields: Vec<(&str, A)>) -> A {
    A::Record(fields.into_iter().map(|(n, v)| (n.to_string(), v)).collect())
}
fn s(v: &str) -> A {
    A::String(v.into())
}

#[allow(deprecated)] // to_avro_datum: the plain one-datum writer.
fn frame(id: u32, schema_text: &str, value: A) -> Vec<u8> {
    let schema = apache_avro::Schema::parse_str(schema_text).expect("schema parses");
    let datum = apache_avro::to_avro_datum(&schema, value).expect("apache-avro writes the datum");
    let mut out = vec![0];
    out.extend_from_slice(&id.to_be_bytes());
    out.extend(datum);
    out
}

fn pg_row(id: i32, email: Option<&str>) -> A {
    rec(vec![
        ("id", A::Int(id)),
        ("first_name", s("Sally")),
        ("email", email.map_or_else(none, |e| some(s(e)))),
        ("small", some(A::Int(-3))),
        ("amount", some(A::Decimal(apache_avro::Decimal::from(vec![0x30u8, 0x39])))),
        ("price", some(rec(vec![("scale", A::Int(3)), ("value", A::Bytes(vec![0xcf, 0xc7]))]))),
        ("created_at", some(s("2024-06-10T08:13:20.123456+02:00"))),
        ("updated_at", some(A::Long(1_718_000_000_000_000))),
        ("birthday", some(A::Int(19_876))),
        ("alarm", some(A::Long(45_296_000_001))),
        ("data", some(s(r#"{"a":1}"#))),
        ("uid", some(s("01234567-89ab-cdef-0123-456789abcdef"))),
        ("tags", some(A::Array(vec![some(s("a")), none()]))),
        ("status", some(s("vip"))),
        ("active", A::Boolean(true)),
        ("wait", some(s("P1Y2M3DT4H5M6.5S"))),
    ])
}

fn col(name: &str, data_type: DataType, nullable: bool) -> Column {
    Column::new(name, data_type, nullable)
}

#[tokio::test]
async fn debezium_postgres_update_decodes() {
    let registry = Registry::in_memory();
    let key_id = registry
        .register("dbserver1.inventory.customers-key", PG_KEY)
        .await
        .expect("key");
    let value_id = registry
        .register("dbserver1.inventory.customers-value", PG_VALUE)
        .await
        .expect("value");
    let source = rec(vec![
        ("version", s("2.7.3.Final")),
        ("connector", s("postgresql")),
        ("name", s("dbserver1")),
        ("ts_ms", A::Long(1_718_000_000_999)),
        ("snapshot", A::Union(0, Box::new(s("false")))),
        ("db", s("inventory")),
        ("sequence", some(s(r#"["24023128","24023184"]"#))),
        ("ts_us", none()),
        ("ts_ns", none()),
        ("schema", s("inventory")),
        ("table", s("customers")),
        ("txId", some(A::Long(555))),
        ("lsn", some(A::Long(24_023_184))),
        ("xmin", none()),
    ]);
    let envelope = rec(vec![
        ("before", some(pg_row(1001, Some("old@example.com")))),
        ("after", some(pg_row(1001, None))),
        ("source", source),
        (
            "transaction",
            some(rec(vec![
                ("id", s("555:24023184")),
                ("total_order", A::Long(1)),
                ("data_collection_order", A::Long(1)),
            ])),
        ),
        ("op", s("u")),
        ("ts_ms", some(A::Long(1_718_000_001_000))),
        ("ts_us", none()),
        ("ts_ns", none()),
    ]);
    let value = frame(value_id, PG_VALUE, envelope);
    let key = frame(key_id, PG_KEY, rec(vec![("id", A::Int(1001))]));

    let mut decoder = EventDecoder::new(registry);
    let decoded = decoder
        .decode("dbserver1.inventory.customers", Some(&key), Some(&value))
        .await
        .expect("decode");
    let schema = Arc::new(TableSchema {
        id: TableId::new("inventory", "customers"),
        columns: vec![
            col("id", DataType::Int32, false),
            col("first_name", DataType::Text, false),
            col("email", DataType::Text, true),
            col("small", DataType::Int16, true),
            col("amount", DataType::Decimal { precision: 10, scale: 2 }, true),
            col("price", DataType::VariableDecimal, true),
            col("created_at", DataType::TimestampTz, true),
            col("updated_at", DataType::Timestamp, true),
            col("birthday", DataType::Date, true),
            col("alarm", DataType::Time, true),
            col("data", DataType::Json, true),
            col("uid", DataType::Uuid, true),
            col("tags", DataType::Array(Box::new(DataType::Text)), true),
            col("status", DataType::Enum { symbols: vec!["new".into(), "vip".into()] }, true),
            col("active", DataType::Boolean, false),
            col("wait", DataType::Interval, true),
        ],
        key: vec!["id".into()],
        dropped: Vec::new(),
    });
    let expected = ChangeEvent {
        schema,
        op: Op::Update,
        before: Some(fixtures::pg_expected_row(1001, Some("old@example.com"))),
        after: Some(fixtures::pg_expected_row(1001, None)),
        source: SourceInfo {
            connector: "postgresql".into(),
            name: "dbserver1".into(),
            db: "inventory".into(),
            ts_ms: 1_718_000_000_999,
            snapshot: SnapshotMarker::False,
            tx_id: Some("555".into()),
            position: Position { commit: 24_023_128, index: 24_023_184 },
            native_position: "0/16E9090".into(),
        },
        ts_ms: 1_718_000_001_000,
        transaction: Some(TransactionInfo {
            id: "555:24023184".into(),
            total_order: 1,
            data_collection_order: 1,
        }),
    };
    assert_eq!(decoded, Decoded::Change(expected));

    // Debezium's tombstone after a delete.
    assert_eq!(
        decoder
            .decode("dbserver1.inventory.customers", Some(&key), None)
            .await
            .expect("tombstone"),
        Decoded::Tombstone
    );
}

#[tokio::test]
async fn debezium_mysql_snapshot_read_decodes() {
    let registry = Registry::in_memory();
    let key_id = registry
        .register("mysqlserver.inventory.products-key", MYSQL_KEY)
        .await
        .expect("key");
    let value_id = registry
        .register("mysqlserver.inventory.products-value", MYSQL_VALUE)
        .await
        .expect("value");
    let row = rec(vec![
        ("id", A::Int(7)),
        ("name", s("hammer")),
        ("price", A::Decimal(apache_avro::Decimal::from(vec![0x05u8, 0xdb]))),
        ("made", some(A::Long(1_718_000_000_123))),
        ("seen", some(s("2024-06-10T06:13:20Z"))),
        ("day", some(A::Int(19_876))),
        ("flag", some(A::Int(1))),
        ("yr", some(A::Int(2024))),
        ("size", some(s("M"))),
        ("weight", some(A::Double(1.5))),
        ("photo", none()),
    ]);
    let source = rec(vec![
        ("version", s("2.7.3.Final")),
        ("connector", s("mysql")),
        ("name", s("mysqlserver")),
        ("ts_ms", A::Long(1_718_000_000_999)),
        ("snapshot", A::Union(0, Box::new(s("true")))),
        ("db", s("inventory")),
        ("sequence", none()),
        ("table", some(s("products"))),
        ("server_id", A::Long(223_344)),
        ("gtid", some(s("3E11FA47-71CA-11E1-9E33-C80AA9429562:23"))),
        ("file", s("mysql-bin.000003")),
        ("pos", A::Long(154)),
        ("row", A::Int(2)),
        ("thread", some(A::Long(7))),
        ("query", none()),
    ]);
    let envelope = rec(vec![
        ("before", none()),
        ("after", some(row)),
        ("source", source),
        ("transaction", none()),
        ("op", s("r")),
        ("ts_ms", some(A::Long(1_718_000_001_000))),
    ]);
    let value = frame(value_id, MYSQL_VALUE, envelope);
    let key = frame(key_id, MYSQL_KEY, rec(vec![("id", A::Int(7))]));
    let mut decoder = EventDecoder::new(registry);
    let Decoded::Change(ev) = decoder
        .decode("mysqlserver.inventory.products", Some(&key), Some(&value))
        .await
        .expect("decode")
    else {
        panic!("expected a change");
    };
    assert_eq!(ev.schema.id, TableId::new("inventory", "products"));
    assert_eq!(ev.schema.key, ["id"]);
    assert_eq!(ev.op, Op::Read);
    assert_eq!(ev.source.snapshot, SnapshotMarker::True);
    assert_eq!(ev.source.position, Position { commit: (3 << 32) | 154, index: 2 });
    assert_eq!(&*ev.source.native_position, "mysql-bin.000003:154");
    assert_eq!(ev.source.tx_id.as_deref(), Some("3E11FA47-71CA-11E1-9E33-C80AA9429562:23"));
    let types: Vec<&DataType> = ev.schema.columns.iter().map(|c| &c.data_type).collect();
    assert_eq!(
        types,
        [
            &DataType::Int32,
            &DataType::Text,
            &DataType::Decimal { precision: 10, scale: 2 },
            &DataType::Timestamp,
            &DataType::TimestampTz,
            &DataType::Date,
            &DataType::Int16,
            &DataType::Int32,
            &DataType::Enum { symbols: vec!["S".into(), "M".into(), "L".into()] },
            &DataType::Float64,
            &DataType::Bytes,
        ]
    );
    assert_eq!(
        ev.after,
        Some(vec![
            Value::Int32(7),
            Value::Text("hammer".into()),
            Value::Decimal("14.99".into()),
            Value::Timestamp(1_718_000_000_123_000),
            Value::TimestampTz(1_718_000_000_000_000),
            Value::Date(19_876),
            Value::Int16(1),
            Value::Int32(2024),
            Value::Enum("M".into()),
            Value::Float64(1.5),
            Value::Null,
        ])
    );
}

#[tokio::test]
async fn not_an_envelope_is_a_decode_error() {
    let registry = Registry::in_memory();
    let id = registry
        .register("x-value", r#"{"type":"record","name":"R","fields":[{"name":"a","type":"int"}]}"#)
        .await
        .expect("register");
    let mut decoder = EventDecoder::new(registry);
    let mut bytes = vec![0];
    bytes.extend_from_slice(&id.to_be_bytes());
    bytes.push(2);
    let err = decoder.decode("x", None, Some(&bytes)).await.expect_err("not an envelope");
    assert!(matches!(err, tributary_schemas::SchemaError::Decode { .. }), "{err}");
    let err = decoder.decode("x", None, Some(&[1, 2])).await.expect_err("not framed");
    assert!(matches!(err, tributary_schemas::SchemaError::Decode { .. }), "{err}");
}

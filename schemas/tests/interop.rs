//! Interop with a client nobody here wrote: Confluent's Python client
//! (`confluent-kafka` with fastavro), through a real Kafka and registry.
//!
//! 1. We produce the fixed events; `tests/python/interop.py consume` reads
//!    them with its AvroDeserializer and checks the values.
//! 2. `interop.py produce` writes Debezium PostgreSQL envelopes with its
//!    AvroSerializer; we decode them with our decoder.
//!
//! Needs `pip install 'confluent-kafka[avro,schemaregistry]'` and the stack
//! (`scripts/stack up`). Skipped with a message when the Python package is
//! missing, unless `CI` is set: then it must run.

mod fixtures;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Message};
use serde_json::json;
use tributary_schemas::decoder::Decoded;
use tributary_schemas::{DataType, EnvelopeOptions, EventDecoder, EventEncoder, Op, Position, Registry, TableId};

fn bootstrap() -> String {
    std::env::var("KAFKA_BOOTSTRAP").unwrap_or_else(|_| "127.0.0.1:9092".into())
}

fn repo_root() -> PathBuf {
    fixtures::manifest_dir().join("..")
}

fn script() -> PathBuf {
    repo_root().join("tests/python/interop.py")
}

/// Whether the test can run; panics in CI when it cannot.
async fn ready() -> bool {
    let python_ok = Command::new("python3")
        .args([
            "-c",
            "import confluent_kafka, fastavro, confluent_kafka.schema_registry.avro",
        ])
        .status()
        .is_ok_and(|s| s.success());
    if !python_ok {
        if std::env::var_os("CI").is_some() {
            panic!(
                "python3 cannot import confluent_kafka; install it: pip install 'confluent-kafka[avro,schemaregistry]'"
            );
        }
        eprintln!(
            "SKIPPED: python3 cannot import confluent_kafka (pip install 'confluent-kafka[avro,schemaregistry]')"
        );
        return false;
    }
    fixtures::service_available("schema registry", fixtures::registry_up()).await
        && fixtures::service_available("kafka", async { tokio::net::TcpStream::connect(bootstrap()).await.is_ok() })
            .await
}

async fn create_topic(name: &str) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .create()
        .expect("admin client");
    let topic = NewTopic::new(name, 1, TopicReplication::Fixed(1));
    let results = admin
        .create_topics([&topic], &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30))))
        .await
        .expect("create topics");
    for r in results {
        r.expect("topic created");
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Row `row(1)` of the fixtures as fastavro decodes it, normalized by
/// interop.py (decimals as text, instants as microseconds, bytes as hex).
fn expected_row(updated: bool) -> serde_json::Value {
    let geometry = match &fixtures::row(1)[19] {
        tributary_schemas::Value::Geometry(wkb) => hex(wkb),
        _ => unreachable!("fixture column 19 is a geometry"),
    };
    json!({
        "id": 1, "region": 7,
        "customer": if updated { serde_json::Value::Null } else { json!("customer 1 ✓") },
        "amount": if updated { "99.99" } else { "-1234.50" },
        "ratio": {"scale": 5, "value": "04cb2f"},
        "placed_at": 1_718_000_000_123_456i64, "local_at": 1_718_000_000_000_000i64,
        "due": 19_876, "at_time": 45_296_000_001i64, "paid": false,
        "ref": "01234567-89ab-cdef-0123-456789abcdef", "meta": "{\"gift\":true}",
        "status": "paid", "tags": ["a", null, "c"], "wait": "P1Y2M3DT1H2M3.000001S",
        "weight": 2.5, "score": -0.25, "qty": 3, "blob": "000102ff",
        "where": {"wkb": geometry, "srid": null}, "order_note": null,
    })
}

#[tokio::test]
async fn python_reads_what_we_produce() {
    if !ready().await {
        return;
    }
    let topic = format!("interop.public.orders-{}", uuid::Uuid::new_v4().simple());
    create_topic(&topic).await;
    let registry = Registry::new(fixtures::registry_url()).expect("registry");
    let mut encoder = EventEncoder::new(registry, EnvelopeOptions::default());
    encoder.prepare(&fixtures::table(), &topic).await.expect("prepare");
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("enable.idempotence", "true")
        .create()
        .expect("producer");
    let mut expected = Vec::new();
    for (op, event) in fixtures::events() {
        let mut records = vec![encoder.encode(&event, &topic).expect("encode")];
        records.extend(encoder.tombstone(&event, &topic).expect("tombstone"));
        for rec in records {
            let mut fr: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(&topic);
            if let Some(k) = rec.key.as_deref() {
                fr = fr.key(k);
            }
            if let Some(v) = rec.value.as_deref() {
                fr = fr.payload(v);
            }
            producer
                .send(fr, Duration::from_secs(30))
                .await
                .map_err(|(e, _)| e)
                .expect("delivered");
            let key = rec.key.as_ref().map(|_| json!({"id": 1, "region": 7}));
            let value = rec.value.as_ref().map(|_| {
                let (before, after) = match op {
                    "r" | "c" => (serde_json::Value::Null, expected_row(false)),
                    "u" => (expected_row(false), expected_row(true)),
                    "d" => (expected_row(false), serde_json::Value::Null),
                    _ => (serde_json::Value::Null, serde_json::Value::Null),
                };
                json!({
                    "op": op, "before": before, "after": after,
                    "source": {
                        "connector": "postgresql", "db": "shopdb", "schema": "public", "table": "orders",
                        "snapshot": if op == "r" { "true" } else { "false" },
                        "pos_commit": event.source.position.commit, "pos_index": event.source.position.index,
                        "native_position": &*event.source.native_position, "lsn": 0x16_B374_D848u64,
                    },
                    "ts_ms": event.ts_ms,
                })
            });
            expected.push(json!({"key": key, "value": value}));
        }
    }
    let expect_file = std::env::temp_dir().join(format!("{topic}.expect.json"));
    std::fs::write(&expect_file, serde_json::to_vec_pretty(&expected).expect("json")).expect("write expectations");
    let out = Command::new("python3")
        .arg(script())
        .args([
            "consume",
            "--bootstrap",
            &bootstrap(),
            "--registry",
            &fixtures::registry_url(),
            "--topic",
            &topic,
        ])
        .arg("--expect")
        .arg(&expect_file)
        .output()
        .expect("run interop.py");
    let _ = std::fs::remove_file(&expect_file);
    assert!(
        out.status.success(),
        "interop.py consume failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn we_decode_what_python_produces() {
    if !ready().await {
        return;
    }
    let topic = format!("dbserver1.inventory.customers-{}", uuid::Uuid::new_v4().simple());
    create_topic(&topic).await;
    let out = Command::new("python3")
        .arg(script())
        .args([
            "produce",
            "--bootstrap",
            &bootstrap(),
            "--registry",
            &fixtures::registry_url(),
            "--topic",
            &topic,
        ])
        .arg("--schema-dir")
        .arg(fixtures::manifest_dir().join("tests/debezium"))
        .output()
        .expect("run interop.py");
    assert!(
        out.status.success(),
        "interop.py produce failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("group.id", format!("interop-{}", uuid::Uuid::new_v4().simple()))
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    consumer.subscribe(&[&topic]).expect("subscribe");
    let mut decoder = EventDecoder::new(Registry::new(fixtures::registry_url()).expect("registry"));
    let mut decoded = Vec::new();
    while decoded.len() < 4 {
        let msg = tokio::time::timeout(Duration::from_secs(60), consumer.recv())
            .await
            .expect("records arrive within a minute")
            .expect("kafka message");
        decoded.push(decoder.decode(&topic, msg.key(), msg.payload()).await.expect("decode"));
    }
    let changes: Vec<_> = decoded
        .iter()
        .filter_map(|d| match d {
            Decoded::Change(e) => Some(e),
            Decoded::Tombstone => None,
        })
        .collect();
    assert_eq!(decoded[3], Decoded::Tombstone);
    assert_eq!(changes.iter().map(|e| e.op).collect::<Vec<_>>(), [Op::Create, Op::Update, Op::Delete]);
    let first = changes[0];
    assert_eq!(first.schema.id, TableId::new("inventory", "customers"));
    assert_eq!(first.schema.key, ["id"]);
    assert_eq!(first.schema.columns[4].data_type, DataType::Decimal { precision: 10, scale: 2 });
    assert_eq!(first.source.position, Position { commit: 24_023_128, index: 24_023_184 });
    assert_eq!(first.after.as_deref(), Some(&fixtures::pg_expected_row(1001, Some("sally@example.com"))[..]));
    assert_eq!(changes[1].after.as_deref(), Some(&fixtures::pg_expected_row(1001, None)[..]));
    assert_eq!(changes[2].before.as_deref(), Some(&fixtures::pg_expected_row(1001, None)[..]));
    assert_eq!(changes[2].after, None);
}

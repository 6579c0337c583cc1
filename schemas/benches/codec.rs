//! Encode and decode of a 10-column row (int64 id, text, int32, float64,
//! decimal(12,2), timestamptz, boolean, date, uuid, json) on one core, by
//! the hand-written codec and by apache-avro (the crate's arm: the same
//! datum through `to_avro_datum` / `from_avro_datum` and its `Value` tree).
//! Prints rows per second besides criterion's times:
//! `cargo bench -p tributary-schemas --bench codec`.
//!
//! The crate's arm is a lower bound on its cost: it encodes a tree built
//! once and cloned (a real encoder would build it from the row), and its
//! decode stops at the tree (a real decoder would then make the row).

use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use apache_avro::reader::datum::GenericDatumReader;
use apache_avro::writer::datum::GenericDatumWriter;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use tributary_schemas::{
    ChangeEvent, Column, DataType, EnvelopeOptions, EventDecoder, EventEncoder, Op, Position, Registry, SnapshotMarker,
    SourceInfo, TableId, TableSchema, Value,
};

const TOPIC: &str = "bench.public.orders";

fn event() -> ChangeEvent {
    let col = |name: &str, data_type: DataType, nullable: bool| Column {
        name: name.into(),
        data_type,
        nullable,
        source_type: String::new(),
        default: None,
        aliases: Vec::new(),
        column_id: None,
    };
    let table = Arc::new(TableSchema {
        id: TableId::new("public", "orders"),
        columns: vec![
            col("id", DataType::Int64, false),
            col("customer", DataType::Text, true),
            col("qty", DataType::Int32, true),
            col("weight", DataType::Float64, true),
            col("amount", DataType::Decimal { precision: 12, scale: 2 }, false),
            col("placed_at", DataType::TimestampTz, false),
            col("paid", DataType::Boolean, false),
            col("due", DataType::Date, true),
            col("ref", DataType::Uuid, true),
            col("meta", DataType::Json, true),
        ],
        key: vec!["id".into()],
        dropped: Vec::new(),
    });
    ChangeEvent {
        schema: table,
        op: Op::Create,
        before: None,
        after: Some(vec![
            Value::Int64(1_234_567),
            Value::Text("Ada Lovelace".into()),
            Value::Int32(3),
            Value::Float64(12.5),
            Value::Decimal("1234.56".into()),
            Value::TimestampTz(1_718_000_000_123_456),
            Value::Boolean(true),
            Value::Date(19_876),
            Value::Uuid(uuid::Uuid::from_u128(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef)),
            Value::Json(r#"{"gift":true,"channel":"web"}"#.into()),
        ]),
        source: SourceInfo {
            connector: "postgresql".into(),
            name: "bench".into(),
            db: "shop".into(),
            ts_ms: 1_718_000_000_999,
            snapshot: SnapshotMarker::False,
            tx_id: Some("771".into()),
            position: Position { commit: 0x16_B374_D848, index: 3 },
            native_position: "16/B374D848".into(),
        },
        ts_ms: 1_718_000_001_000,
        transaction: None,
    }
}

/// The value's schema as apache-avro parsed it, and the datum (the
/// value's bytes after the Confluent header) read into its tree.
fn crate_arm(registry: &Registry, value: &[u8]) -> (Arc<apache_avro::Schema>, apache_avro::types::Value) {
    let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
    let (id, datum) = tributary_schemas::binary::split_header(value).expect("a Confluent frame");
    let schema = rt.block_on(registry.schema(id)).expect("the value's schema");
    let reader = GenericDatumReader::builder(&schema).build().expect("a reader");
    let tree = reader.read_value(&mut &datum[..]).expect("apache-avro reads the datum");
    // Both arms do the same work: the crate writes the very bytes.
    let writer = GenericDatumWriter::builder(&schema).build().expect("a writer");
    assert_eq!(writer.write_value_to_vec(tree.clone()).expect("apache-avro writes it"), datum);
    (schema.clone(), tree)
}

type Setup = (EventEncoder, EventDecoder, ChangeEvent, Vec<u8>, Vec<u8>, Registry);

fn setup() -> Setup {
    let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
    let registry = Registry::in_memory();
    let mut encoder = EventEncoder::new(registry.clone(), EnvelopeOptions::default());
    let ev = event();
    rt.block_on(encoder.prepare(&ev.schema, TOPIC)).expect("prepare");
    let rec = encoder.encode(&ev, TOPIC).expect("encode");
    let (key, value) = (rec.key.expect("key"), rec.value.expect("value"));
    let mut decoder = EventDecoder::new(registry.clone());
    rt.block_on(decoder.decode(TOPIC, Some(&key), Some(&value))).expect("decode");
    (encoder, decoder, ev, key, value, registry)
}

/// Nanoseconds this thread has run on a CPU (Linux schedstat), so that the
/// rate does not depend on other processes competing for the cores.
fn thread_cpu_ns() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    text.split_whitespace().next()?.parse().ok()
}

/// A plain timed loop, to print rows per second in one line: by wall clock
/// and by this thread's CPU time.
fn rows_per_second(mut f: impl FnMut()) -> (f64, Option<f64>) {
    for _ in 0..50_000 {
        f();
    }
    let n = 2_000_000;
    let cpu = thread_cpu_ns();
    let start = Instant::now();
    for _ in 0..n {
        f();
    }
    let wall = n as f64 / start.elapsed().as_secs_f64();
    let cpu = match (cpu, thread_cpu_ns()) {
        (Some(a), Some(b)) if b > a => Some(n as f64 / ((b - a) as f64 / 1e9)),
        _ => None,
    };
    (wall, cpu)
}

fn codec(c: &mut Criterion) {
    let (encoder, mut decoder, ev, key, value, registry) = setup();
    println!("value datum: {} bytes, key: {} bytes", value.len(), key.len());
    let (schema, tree) = crate_arm(&registry, &value);
    let datum = &value[tributary_schemas::binary::HEADER_LEN..];
    let reader = GenericDatumReader::builder(&schema).build().expect("a reader");
    let writer = GenericDatumWriter::builder(&schema).build().expect("a writer");

    let encode_rate = rows_per_second(|| {
        black_box(encoder.encode(black_box(&ev), TOPIC).expect("encode"));
    });
    let decode_rate = rows_per_second(|| {
        black_box(
            decoder
                .decode_cached(TOPIC, Some(black_box(&key)), Some(black_box(&value)))
                .expect("decode"),
        );
    });
    let show = |(wall, cpu): (f64, Option<f64>)| match cpu {
        Some(cpu) => format!("{cpu:.0} rows/s per CPU-second ({wall:.0} by wall clock)"),
        None => format!("{wall:.0} rows/s by wall clock"),
    };
    let crate_encode_rate = rows_per_second(|| {
        black_box(writer.write_value_to_vec(black_box(tree.clone())).expect("encode"));
    });
    let crate_decode_rate = rows_per_second(|| {
        black_box(reader.read_value(&mut black_box(datum)).expect("decode"));
    });
    println!("encode: {}", show(encode_rate));
    println!("decode: {}", show(decode_rate));
    println!("apache-avro encode: {}", show(crate_encode_rate));
    println!("apache-avro decode: {}", show(crate_decode_rate));
    let ratio =
        |ours: (f64, Option<f64>), theirs: (f64, Option<f64>)| ours.1.unwrap_or(ours.0) / theirs.1.unwrap_or(theirs.0);
    println!(
        "hand-written / apache-avro: encode {:.1}x, decode {:.1}x",
        ratio(encode_rate, crate_encode_rate),
        ratio(decode_rate, crate_decode_rate)
    );

    let mut group = c.benchmark_group("codec");
    group.throughput(Throughput::Elements(1));
    group.bench_function("encode_10_columns", |b| b.iter(|| encoder.encode(black_box(&ev), TOPIC).expect("encode")));
    group.bench_function("decode_10_columns", |b| {
        b.iter(|| {
            decoder
                .decode_cached(TOPIC, Some(black_box(&key)), Some(black_box(&value)))
                .expect("decode")
        })
    });
    group.bench_function("apache_avro_encode_10_columns", |b| {
        b.iter(|| writer.write_value_to_vec(black_box(tree.clone())).expect("encode"))
    });
    group.bench_function("apache_avro_decode_10_columns", |b| {
        b.iter(|| reader.read_value(&mut black_box(datum)).expect("decode"))
    });
    group.finish();
}

criterion_group!(benches, codec);
criterion_main!(benches);

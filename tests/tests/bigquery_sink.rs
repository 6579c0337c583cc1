//! The BigQuery sink against the BigQuery emulator of the local stack
//! (bqemulator: `scripts/stack start bigquery`), and end to end: real
//! PostgreSQL -> `source-runner` -> real Kafka -> `sink-runner` -> emulator.
//!
//! Endpoints: `BIGQUERY_EMULATOR_URL` (default `http://127.0.0.1:9050`),
//! `BIGQUERY_PROJECT` (default `tributary-local`), and those of the other
//! stack services. Every test works in datasets of its own.
//!
//! bqemulator cannot parse `PRIMARY KEY ... NOT ENFORCED`, so these tests
//! turn `declare_primary_key` off; nothing here ran against real BigQuery.

use std::sync::Arc;

use tributary_connectors::sinks::bigquery::BigQuerySink;
use tributary_connectors::{ErrorKind, Sink};
use tributary_schemas::{ChangeEvent, Column, DataType, Op, Value};
use tributary_tests::bench;
use tributary_tests::e2e::kill_9_across_the_pipeline;
use tributary_tests::items::{
    assert_after_mixed_changes, batch, event, items, key_row, mixed_changes, row, truncate_changes,
};
use tributary_tests::{header, unique};

use tributary_tests::bigquery::{query, Datasets as Fixture};

fn column(name: &str, data_type: DataType, nullable: bool) -> Column {
    Column::new(name, data_type, nullable)
}

#[tokio::test]
async fn snapshot_updates_deletes_and_truncate_give_the_expected_rows() {
    let fx = Fixture::new("flow");
    let s = items();
    let mut sink = fx.sink();
    let snapshot: Vec<ChangeEvent> = (1..=100)
        .map(|i| event(&s, Op::Read, None, Some(row(i, &format!("item {i}"), i, "1.50")), 10, 0))
        .collect();
    sink.apply(&batch("t", 0, snapshot)).await.expect("snapshot");
    assert_eq!(fx.rows().await.len(), 100);
    assert_eq!(fx.offsets().await.get(&("t".into(), 0)), Some(&100));
    assert_eq!(
        sink.committed_offsets(&[("t".into(), 0), ("t".into(), 1)])
            .await
            .expect("offsets"),
        vec![Some(100), None]
    );

    let changes = mixed_changes(&s);
    let merges = sink.merges();
    sink.apply(&batch("t", 100, changes)).await.expect("changes");
    assert_eq!(sink.merges() - merges, 1, "one MERGE per table and batch");
    assert_after_mixed_changes(&fx.rows().await);
    assert_eq!(fx.offsets().await.get(&("t".into(), 0)), Some(&109));
    let t = truncate_changes(&s);
    sink.apply(&batch("t", 109, t)).await.expect("truncate");
    assert_eq!(fx.rows().await, vec!["500|after|1|1.00".to_string()]);
    fx.cleanup().await;
}

#[tokio::test]
async fn replays_and_older_events_never_move_rows_backwards() {
    let fx = Fixture::new("replay");
    let s = items();
    let mut sink = fx.sink();
    let first = batch(
        "t",
        0,
        vec![
            event(&s, Op::Create, None, Some(row(1, "a", 1, "1.00")), 10, 0),
            event(&s, Op::Create, None, Some(row(2, "b", 2, "2.00")), 10, 1),
        ],
    );
    sink.apply(&first).await.expect("first");
    // A replay of the same batch (a crash after the commit whose answer was
    // lost) changes nothing, on the same sink and on a fresh one.
    sink.apply(&first).await.expect("replay");
    assert_eq!(fx.rows().await, vec!["1|a|1|1.00".to_string(), "2|b|2|2.00".to_string()]);
    let second = batch(
        "t",
        2,
        vec![
            event(&s, Op::Update, None, Some(row(1, "a2", 1, "1.00")), 11, 0),
            event(&s, Op::Delete, Some(key_row(2)), None, 11, 1),
        ],
    );
    sink.apply(&second).await.expect("second");
    let mut fresh = fx.sink();
    fresh.apply(&second).await.expect("replay on a fresh sink");
    assert_eq!(fx.rows().await, vec!["1|a2|1|1.00".to_string()]);
    // An event older than what the row holds never moves it backwards.
    fresh
        .apply(&batch("t", 4, vec![event(&s, Op::Update, None, Some(row(1, "old", 9, "9.00")), 10, 5)]))
        .await
        .expect("older update");
    assert_eq!(fx.rows().await, vec!["1|a2|1|1.00".to_string()]);
    assert_eq!(fx.offsets().await.get(&("t".into(), 0)), Some(&5));
    fx.cleanup().await;
}

#[tokio::test]
async fn schema_changes_evolve_the_table_before_the_first_row_that_needs_them() {
    let fx = Fixture::new("ddl");
    let s = items();
    let mut sink = fx.sink();
    sink.apply(&batch("t", 0, vec![event(&s, Op::Create, None, Some(row(1, "a", 1, "1.00")), 10, 0)]))
        .await
        .expect("v1");
    // v2: a new column, `qty` widened to numeric(20,2), `id` still the key.
    let mut v2 = (*s).clone();
    v2.columns[2] = column("qty", DataType::Decimal { precision: 20, scale: 2 }, true);
    v2.columns.push(column("note", DataType::Text, true));
    let v2 = Arc::new(v2);
    let mut r = row(2, "b", 0, "2.00");
    r[2] = Value::Decimal("123456789012.50".into());
    r.push(Value::Text("hello".into()));
    // v1 and v2 events in one batch: the table changes before the v2 row.
    sink.apply(&batch(
        "t",
        1,
        vec![
            event(&s, Op::Create, None, Some(row(3, "c", 3, "3.00")), 11, 0),
            event(&v2, Op::Create, None, Some(r), 12, 0),
        ],
    ))
    .await
    .expect("v2");
    let rows = query(&format!(
        "SELECT CAST(id AS STRING), note, CAST(qty AS STRING) FROM {} ORDER BY id",
        fx.table("items")
    ))
    .await
    .expect("query");
    assert_eq!(rows.len(), 3);
    assert_eq!(rows[1][1].as_deref(), Some("hello"), "{rows:?}");
    assert_eq!(rows[0][1], None);
    assert!(rows[1][2].as_deref().is_some_and(|q| q.starts_with("123456789012.5")), "{rows:?}");
    // A restarted sink (cold cache) takes the same schema again.
    let mut fresh = fx.sink();
    let mut r4 = row(4, "d", 0, "4.00");
    r4[2] = Value::Decimal("1.00".into());
    r4.push(Value::Null);
    fresh
        .apply(&batch("t", 3, vec![event(&v2, Op::Create, None, Some(r4), 13, 0)]))
        .await
        .expect("after restart");
    assert_eq!(fx.rows().await.len(), 4);
    fx.cleanup().await;
}

#[tokio::test]
async fn a_row_bigquery_refuses_is_named_with_its_reason_and_nothing_moves() {
    let fx = Fixture::new("refused");
    // `name` is declared NOT NULL by the source, so the table is created
    // with a REQUIRED column; then the source sends a NULL anyway.
    let mut strict = (*items()).clone();
    strict.columns[1].nullable = false;
    let s = Arc::new(strict);
    let mut sink = fx.sink();
    sink.apply(&batch("t", 0, vec![event(&s, Op::Create, None, Some(row(1, "a", 1, "1.00")), 10, 0)]))
        .await
        .expect("first");
    let mut bad = row(3, "x", 3, "3.00");
    bad[1] = Value::Null;
    let events = vec![
        event(&s, Op::Create, None, Some(row(2, "b", 2, "2.00")), 11, 0),
        event(&s, Op::Create, None, Some(bad), 11, 1),
        event(&s, Op::Create, None, Some(row(4, "d", 4, "4.00")), 11, 2),
    ];
    // BigQuery refuses it in the MERGE: the record is found by bisection
    // and BigQuery's reason is kept.
    match sink.apply(&batch("t", 1, events)).await {
        Err(e) => {
            assert_eq!(e.error.kind(), ErrorKind::Permanent, "{}", e.error);
            assert_eq!(e.record, Some(1), "{}", e.error);
            assert!(e.error.class().starts_with("bigquery."), "{}", e.error.class());
            assert!(e.error.to_string().contains("BigQuery"), "{}", e.error);
        }
        Ok(()) => panic!("a NULL into a NOT NULL column was accepted"),
    }
    assert_eq!(fx.rows().await, vec!["1|a|1|1.00".to_string()], "a failed batch leaves no trace");
    assert_eq!(fx.offsets().await.get(&("t".into(), 0)), Some(&1));

    // A value BigQuery's types cannot hold is refused before BigQuery sees
    // it, naming the record, the column and the value type (never the value).
    let mut dated = (*s).clone();
    dated.columns.push(column("due", DataType::Date, true));
    let dated = Arc::new(dated);
    let mut far = row(5, "e", 5, "5.00");
    far.push(Value::Date(i32::MAX));
    let e = sink
        .apply(&batch(
            "t",
            1,
            vec![
                event(&s, Op::Create, None, Some(row(6, "f", 6, "6.00")), 11, 3),
                event(&dated, Op::Create, None, Some(far), 11, 4),
            ],
        ))
        .await
        .expect_err("out of range date");
    assert_eq!(e.error.kind(), ErrorKind::Permanent);
    assert_eq!(e.record, Some(1));
    assert_eq!(e.error.column(), Some("due"));
    assert!(e.error.to_string().contains("date outside BigQuery's range"), "{}", e.error);
    assert!(!e.error.to_string().contains(&i32::MAX.to_string()), "value leaked: {}", e.error);
    fx.cleanup().await;
}

#[tokio::test]
async fn an_unreachable_emulator_is_retryable() {
    let fx = Fixture::new("down");
    let mut config = fx.config();
    config.emulator_url = Some("http://127.0.0.1:1".into());
    let mut sink = BigQuerySink::new(config).expect("config");
    let e = sink
        .committed_offsets(&[("t".into(), 0)])
        .await
        .expect_err("nothing listens on port 1");
    assert_eq!(e.kind(), ErrorKind::Retryable, "{e}");
}

// ---------------------------------------------------------------- end to end

/// PostgreSQL -> source-runner -> Kafka -> sink-runner -> emulator
/// ([`tributary_tests::e2e`]): the copy equals the source after the
/// snapshot, streaming, a kill -9 of the sink runner and an added column;
/// PostgreSQL's infinity date is dead-lettered with BigQuery's reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_to_kafka_to_bigquery_equals_the_source_across_kill_9() {
    let fx = Fixture::new("e2e");
    let dead = kill_9_across_the_pipeline(&unique("bqe2e"), &fx).await.expect("a dead letter");
    let message = header(&dead, sink_runner::dead_letters::HEADER_MESSAGE).unwrap_or_default();
    assert!(message.contains("date outside BigQuery's range") && message.contains("due"), "{message}");
}

/// Rows/s applied into the emulator per batch size, and MERGE statements
/// per million changes (the cost proxy: each MERGE is one BigQuery job that
/// scans the touched clustered blocks). Half the changes are snapshot
/// reads, half updates and deletes of them. Run by `bench/run --sink
/// bigquery`, or: `BENCH_ROWS=20000 BENCH_BATCHES=100,1000,5000 cargo test
/// -p tributary-tests --test bigquery_sink bench -- --ignored --nocapture`.
#[tokio::test]
#[ignore = "benchmark; run explicitly"]
async fn bench_apply_rates_per_batch_size() {
    bench::apply_rates_per_batch_size::<Fixture>().await;
}

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

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::ClientConfig;
use tributary_connectors::sinks::bigquery::BigQuerySink;
use tributary_connectors::{ErrorKind, Sink};
use tributary_schemas::{ChangeEvent, Column, DataType, Op, Value};
use tributary_tests::items::{
    apply_in_batches, assert_after_mixed_changes, batch, bench_batch_sizes, bench_changes, event, items, key_row,
    mixed_changes, row, truncate_changes,
};
use tributary_tests::{
    bigquery_emulator_url, bigquery_project, header, kafka_bootstrap, pg_source_runner_config, pg_source_url,
    runner_binary, sink_runner_config, unique, wait_for, Runner,
};

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

/// PostgreSQL -> source-runner -> Kafka -> sink-runner -> emulator: the
/// snapshot, streamed inserts, updates and deletes, an added column, a row
/// BigQuery cannot hold (to the dead-letter topic with its reason), and a
/// kill -9 of the sink runner; the copy must equal the source, no row lost
/// or doubled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_to_kafka_to_bigquery_equals_the_source_across_kill_9() {
    let name = unique("bqe2e");
    let (pg, conn) = tokio_postgres::connect(&pg_source_url(), tokio_postgres::NoTls)
        .await
        .expect("connect to source");
    tokio::spawn(conn);
    pg.batch_execute(&format!(
        "CREATE SCHEMA {name};
         CREATE TABLE {name}.items (id bigint PRIMARY KEY, v bigint NOT NULL, due date);
         INSERT INTO {name}.items SELECT i, i, DATE '2024-01-01' + (i % 365) FROM generate_series(1, 2000) i;"
    ))
    .await
    .expect("source table");

    let dir = std::env::temp_dir().join(&name);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let source_config = dir.join("source.toml");
    std::fs::write(&source_config, pg_source_runner_config(&name)).expect("source config");
    let dataset = format!("{name}_dst");
    let bookkeeping = format!("{name}_bk");
    let group = format!("{name}-bq");
    let sink_config = dir.join("sink.toml");
    let section = format!(
        "[bigquery]\nproject = \"{project}\"\nemulator_url = \"{emulator}\"\ndataset = \"{dataset}\"\n\
         bookkeeping_dataset = \"{bookkeeping}\"\ndeclare_primary_key = false\n",
        project = bigquery_project(),
        emulator = bigquery_emulator_url(),
    );
    std::fs::write(&sink_config, sink_runner_config(&name, &group, &section)).expect("sink config");
    let source_log = dir.join("source.log");
    let sink_log = dir.join("sink.log");
    eprintln!("logs: {}", dir.display());

    let source_rows = || async {
        let rows = pg
            .query(&format!("SELECT id, v, due::text FROM {name}.items ORDER BY id"), &[])
            .await
            .expect("source rows");
        rows.iter()
            .map(|r| {
                let due: Option<String> = r.get(2);
                format!("{}|{}|{}", r.get::<_, i64>(0), r.get::<_, i64>(1), due.unwrap_or_else(|| "NULL".into()))
            })
            .collect::<Vec<_>>()
    };
    let table = format!("`{}.{dataset}.items`", bigquery_project());
    let copy_rows = |extra: bool| {
        let table = table.clone();
        async move {
            let note = if extra { ", IFNULL(note, 'NULL')" } else { "" };
            let sql = format!("SELECT CAST(id AS STRING), CAST(v AS STRING), IFNULL(CAST(due AS STRING), 'NULL'){note} FROM {table} ORDER BY id");
            query(&sql)
                .await
                .map(|rows| {
                    rows.into_iter()
                        .map(|r| r.into_iter().map(|c| c.unwrap_or_default()).collect::<Vec<_>>().join("|"))
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default()
        }
    };

    let source = Runner::start("source-runner", &source_config, &source_log);
    let sink = Runner::start("sink-runner", &sink_config, &sink_log);
    let want = source_rows().await;
    wait_for("the snapshot in BigQuery", Duration::from_secs(180), || async {
        (copy_rows(false).await == want).then_some(())
    })
    .await;

    // Streaming while the sink runner is killed and restarted.
    pg.batch_execute(&format!(
        "INSERT INTO {name}.items SELECT i, i, NULL FROM generate_series(2001, 2300) i;
         UPDATE {name}.items SET v = v + 1000 WHERE id % 7 = 0;
         DELETE FROM {name}.items WHERE id % 11 = 0;"
    ))
    .await
    .expect("changes");
    let bk_offsets = format!("`{}.{bookkeeping}.offsets`", bigquery_project());
    let stored = || async {
        query(&format!("SELECT SUM(next_offset) FROM {bk_offsets}"))
            .await
            .ok()
            .and_then(|r| r.first().and_then(|c| c.first().cloned().flatten()))
            .and_then(|v| v.parse::<i64>().ok())
            .unwrap_or(0)
    };
    let before = stored().await;
    wait_for("progress after the changes", Duration::from_secs(60), || async {
        (stored().await > before).then_some(())
    })
    .await;
    sink.kill9();
    pg.batch_execute(&format!(
        "UPDATE {name}.items SET v = v + 1 WHERE id % 5 = 0;
         DELETE FROM {name}.items WHERE id BETWEEN 100 AND 150;"
    ))
    .await
    .expect("changes while the sink is down");
    let sink = Runner::start("sink-runner", &sink_config, &sink_log);
    let want = source_rows().await;
    wait_for("the copy to equal the source after kill -9", Duration::from_secs(180), || async {
        (copy_rows(false).await == want).then_some(())
    })
    .await;

    // DDL: a new column, then rows that use it, and a date BigQuery cannot
    // hold (PostgreSQL's infinity) that goes to the dead-letter topic.
    pg.batch_execute(&format!(
        "ALTER TABLE {name}.items ADD COLUMN note text;
         INSERT INTO {name}.items VALUES (5000, 1, NULL, 'hello');
         UPDATE {name}.items SET note = 'updated' WHERE id = 1;
         INSERT INTO {name}.items VALUES (5001, 1, 'infinity', 'bad');
         INSERT INTO {name}.items VALUES (5002, 2, NULL, 'after');"
    ))
    .await
    .expect("ddl");
    let expect_extra = || async {
        let rows = pg
            .query(&format!("SELECT id, v, due::text, note FROM {name}.items WHERE id <> 5001 ORDER BY id"), &[])
            .await
            .expect("source rows");
        rows.iter()
            .map(|r| {
                let due: Option<String> = r.get(2);
                let note: Option<String> = r.get(3);
                format!(
                    "{}|{}|{}|{}",
                    r.get::<_, i64>(0),
                    r.get::<_, i64>(1),
                    due.unwrap_or_else(|| "NULL".into()),
                    note.unwrap_or_else(|| "NULL".into())
                )
            })
            .collect::<Vec<_>>()
    };
    let want = expect_extra().await;
    wait_for("the new column and its rows", Duration::from_secs(120), || async {
        (copy_rows(true).await == want).then_some(())
    })
    .await;
    drop(sink);

    let dlq = format!("{name}.{name}.items.dlq");
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", kafka_bootstrap())
        .set("group.id", unique("dlq-reader"))
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", "read_committed")
        .create()
        .expect("consumer");
    consumer.subscribe(&[&dlq]).expect("subscribe");
    let dead = wait_for("the dead letter", Duration::from_secs(30), || async {
        consumer
            .poll(Duration::from_millis(200))
            .and_then(|m| m.ok())
            .map(|m| m.detach())
    })
    .await;
    let message = header(&dead, sink_runner::dlq::HEADER_MESSAGE).unwrap_or_default();
    assert!(message.contains("date outside BigQuery's range"), "{message}");
    assert!(message.contains("due"), "{message}");
    assert_eq!(header(&dead, sink_runner::dlq::HEADER_TABLE).as_deref(), Some(format!("{name}.items").as_str()));

    drop(source);
    // The killed sink runner stays a member of its consumer group until its
    // session times out (6 s); `delete` refuses a group with members.
    let sink_bin = runner_binary("sink-runner");
    wait_for("sink-runner delete --drop-destination to succeed", Duration::from_secs(60), || async {
        let out = Command::new(&sink_bin)
            .arg("--config")
            .arg(&sink_config)
            .args(["delete", "--yes", "--drop-destination"])
            .output()
            .expect("sink-runner delete");
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success() || err.contains("NonEmptyGroup"), "{err}");
        out.status.success().then_some(())
    })
    .await;
    assert!(query(&format!("SELECT 1 FROM {table}")).await.is_err(), "the destination table was dropped");
    // After the sink's delete: it finds the tables to drop by their topics.
    let _ = Command::new(runner_binary("source-runner"))
        .arg("--config")
        .arg(&source_config)
        .args(["delete", "--yes"])
        .status();
    pg.batch_execute(&format!("DROP SCHEMA {name} CASCADE"))
        .await
        .expect("drop schema");
    for d in [&dataset, &bookkeeping] {
        let _ = query(&format!("DROP SCHEMA IF EXISTS `{}.{d}` CASCADE", bigquery_project())).await;
    }
    let _ = std::fs::remove_dir_all(&dir);
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
    println!("| batch size | changes | seconds | changes/s | MERGE statements | MERGEs per 1M changes |");
    println!("|---:|---:|---:|---:|---:|---:|");
    for size in bench_batch_sizes() {
        let fx = Fixture::new("bench");
        let mut sink = fx.sink();
        let (events, expected) = bench_changes();
        let total = events.len();
        let took = apply_in_batches(&mut sink, events, size).await;
        assert_eq!(fx.rows().await.len(), expected, "the copy holds what the changes leave");
        println!(
            "| {size} | {total} | {took:.1} | {:.0} | {} | {:.0} |",
            total as f64 / took,
            sink.merges(),
            sink.merges() as f64 * 1_000_000.0 / total as f64
        );
        fx.cleanup().await;
    }
}

//! The Redshift sink in its test mode (PostgreSQL 15 standing in for the
//! cluster, the staged files in the stack's S3 emulator, moto), and the
//! dialect check: every statement the sink sent during a workload that
//! exercises each of its statement builders parses as Redshift SQL and
//! uses nothing Redshift refuses; the same check refuses the PostgreSQL
//! sink's statements, so it can fail.
//!
//! Needs `scripts/stack start postgres s3`. What this cannot show (COPY's
//! own parsing and load errors, IAM, Redshift's locking and catalog
//! spellings) is listed in docs/destinations/redshift.md.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use tributary_connectors::sink::bookkeeping::offset_moves;
use tributary_connectors::sinks::postgres::dialect as pg;
use tributary_connectors::sinks::postgres::DestinationTable;
use tributary_connectors::sinks::redshift::RedshiftSink;
use tributary_connectors::{ErrorKind, Sink, SinkRecord};
use tributary_schemas::records::VerifyRange;
use tributary_schemas::{Column, DataType, Op, Position, TableSchema, Value};
use tributary_tests::bench;
use tributary_tests::items::{batch, event, items, key_row, row};
use tributary_tests::redshift::{dialect_violations, s3_endpoint, BenchWarehouse, Warehouse, BUCKET};
use tributary_tests::unique;

/// `items` with `name` a longer VARCHAR and a new `note` column.
fn evolved(s: &TableSchema) -> Arc<TableSchema> {
    let mut t = s.clone();
    t.columns[1].source_type = "character varying(80)".into();
    t.columns.push(Column::new("note", DataType::Text, true));
    Arc::new(t)
}

/// The keys of the staged objects under the bucket's prefix for `group`.
async fn staged_objects(group: &str) -> Vec<String> {
    let body = reqwest::Client::new()
        .get(format!("{}/{BUCKET}?list-type=2&prefix=tributary-staging/{group}/", s3_endpoint()))
        .send()
        .await
        .expect("list the bucket")
        .text()
        .await
        .expect("listing");
    body.split("<Key>")
        .skip(1)
        .filter_map(|k| k.split("</Key>").next())
        .map(str::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_statement_sent_is_redshift_sql() {
    let wh = Warehouse::new("dialect").await;
    let group = unique("dialect");
    let recorded = Arc::new(Mutex::new(Vec::new()));
    let mut config = wh.config(&group);
    config.drop_columns = true;
    config.drop_tables = true;
    let mut sink = RedshiftSink::new(config).expect("config");
    sink.record_statements(recorded.clone());
    let s = items();
    let t = "redshift.dialect";

    // Snapshot, updates, deletes, a key change, a truncate.
    let snapshot = (1..=20).map(|i| event(&s, Op::Read, None, Some(row(i, &format!("n{i}"), i, "1.00")), 10, 0));
    sink.apply(&batch(t, 0, snapshot.collect())).await.expect("snapshot");
    let changes = vec![
        event(&s, Op::Update, None, Some(row(1, "one", 1, "2.00")), 20, 0),
        event(&s, Op::Delete, Some(key_row(2)), None, 20, 1),
        event(&s, Op::Update, Some(row(3, "n3", 3, "1.00")), Some(row(33, "moved", 3, "1.00")), 20, 2),
    ];
    sink.apply(&batch(t, 20, changes)).await.expect("changes");
    sink.apply(&batch(t, 23, vec![event(&s, Op::Truncate, None, None, 30, 0)]))
        .await
        .expect("truncate");
    // A copy again (table-wide entry) and a reset.
    let mut copied = batch(t, 24, vec![event(&s, Op::Read, None, Some(row(5, "again", 5, "1.00")), 40, 0)]);
    copied
        .records
        .insert(0, (copied.records[0].0.clone(), SinkRecord::Reset(s.id.clone(), 7)));
    copied
        .records
        .push((copied.records[0].0.clone(), SinkRecord::Copied(s.id.clone(), Position { commit: 40, index: 1 })));
    copied.next_offsets = vec![(t.into(), 0, 27)];
    sink.apply(&copied).await.expect("reset and copy");
    // Schema changes: a longer VARCHAR and a new column, then a dropped one.
    let v2 = evolved(&s);
    let mut with_note = row(6, "a name longer than forty characters .........", 6, "1.00");
    with_note.push(Value::Text("hello".into()));
    sink.apply(&batch(t, 27, vec![event(&v2, Op::Create, None, Some(with_note), 50, 0)]))
        .await
        .expect("evolved");
    let mut v3 = (*v2).clone();
    v3.columns.retain(|c| c.name != "qty");
    v3.dropped = vec!["qty".into()];
    let v3 = Arc::new(v3);
    let mut no_qty = row(7, "seven", 0, "1.00");
    no_qty.remove(2);
    no_qty.push(Value::Null);
    sink.apply(&batch(t, 28, vec![event(&v3, Op::Create, None, Some(no_qty), 60, 0)]))
        .await
        .expect("dropped");
    // A fenced move, a trial with bisection (a value the column refuses).
    let mut fenced = batch(
        t,
        29,
        vec![event(
            &v3,
            Op::Delete,
            Some(vec![Value::Int32(7), Value::Null, Value::Null, Value::Null]),
            None,
            70,
            0,
        )],
    );
    fenced.expected_offsets = vec![(t.into(), 0, Some(29))];
    sink.apply(&fenced).await.expect("fenced move");
    let mut big = row(8, "eight", 0, "1000000000000000000000000000000000000000.00");
    big.remove(2);
    big.push(Value::Null);
    let trial = batch(
        t,
        30,
        vec![
            event(
                &v3,
                Op::Create,
                None,
                Some({
                    let mut r = row(9, "nine", 0, "1.00");
                    r.remove(2);
                    r.push(Value::Null);
                    r
                }),
                80,
                0,
            ),
            event(&v3, Op::Create, None, Some(big), 80, 1),
        ],
    );
    let e = sink
        .trial_apply(&trial)
        .await
        .expect_err("numeric(38,2) refuses a 40-digit value");
    assert_eq!(e.error.kind(), ErrorKind::Permanent, "{}", e.error);
    assert_eq!(e.record, Some(1), "bisection names the record: {}", e.error);
    // Refused by the sink before staging (a decimal NUMERIC(38,2) cannot
    // hold: Redshift would round or refuse it); a refusal by COPY itself,
    // with stl_load_errors' reason, is checked in
    // `postgres_to_kafka_to_redshift_equals_the_source_across_kill_9`.
    assert_eq!(e.error.column(), Some("price"), "{}", e.error);
    let m = e.error.message();
    assert!(m.contains("NUMERIC(38, 2) cannot hold"), "{m}");
    // A verification's read back of one key range (the source's side
    // empty here: every row of the range is the destination's only).
    let range = VerifyRange {
        id: 1,
        at: Position { commit: 90, index: 0 },
        connector: "postgresql".into(),
        schema_id: 1,
        key_schema_id: None,
        partition: None,
        columns: None,
        summary: None,
        after: Some(vec![Some("4".into())]),
        until: Some(vec![Some("8".into())]),
        last: true,
        rows: Vec::new(),
    };
    let outcome = sink.verify_range(&v3, &range, false).await.expect("read back");
    assert!(outcome.unsupported.is_none(), "{outcome:?}");
    assert!(outcome.differing > 0, "rows 5 and 6 are in the range: {outcome:?}");
    assert!(sink.check().await.is_empty(), "check");
    sink.delete_copy(std::slice::from_ref(&s.id)).await.expect("delete copy");
    assert!(staged_objects(&group).await.is_empty(), "the staged files are removed after each load");

    let statements: BTreeSet<String> = recorded.lock().unwrap().iter().cloned().collect();
    let has = |needle: &str| statements.iter().any(|s| s.contains(needle));
    for needle in [
        "IAM_ROLE",
        "MANIFEST",
        "CREATE TABLE IF NOT EXISTS",
        "CREATE TEMP TABLE",
        "ADD COLUMN",
        "TYPE character varying(320)",
        "DROP COLUMN",
        "DELETE FROM \"tributary\".\"deleted_rows\" USING",
        "INSERT INTO \"tributary\".\"offsets\"",
        "UPDATE ",
        "DROP TABLE",
        "LOCK ",
        "AS VARCHAR(256))",
        // (No refused COPY here since the sink refuses a decimal it would
        // round before staging: the stl_load_errors query runs in
        // `postgres_to_kafka_to_redshift_equals_the_source_across_kill_9`.)
    ] {
        assert!(has(needle), "the workload sent no statement with {needle}: {statements:#?}");
    }
    let mut bad = Vec::new();
    for sql in &statements {
        let v = dialect_violations(sql);
        if !v.is_empty() {
            bad.push(format!("{sql}\n  -> {v:?}"));
        }
    }
    assert!(bad.is_empty(), "statements Redshift would refuse:\n{}", bad.join("\n"));
    eprintln!("{} distinct statements checked", statements.len());
    wh.cleanup(&[group]).await;
}

#[test]
fn the_check_refuses_postgres_only_sql() {
    let t = DestinationTable { schema: "s".into(), table: "t".into() };
    let names = vec!["\"id\"".to_string(), "\"v\"".to_string()];
    let keys = vec!["\"id\"".to_string()];
    let merge = pg::merge_sql(&t, "stage", &names, &keys, true, true);
    let next = vec![("t".to_string(), 0, 10)];
    let fenced = pg::offsets_sql("g", &offset_moves(&next, &[("t".into(), 0, Some(7))]));
    let widen = pg::change_sql(
        &t,
        &tributary_connectors::sink::schema::TableChange::Widen {
            column: "n".into(),
            from: pg::PgType::parse("integer"),
            to: pg::PgType::parse("bigint"),
        },
    );
    let cases = [
        (merge.as_str(), "ON CONFLICT"),
        (merge.as_str(), "row-value comparison"),
        (fenced.as_str(), "writable CTE"),
        (widen.as_str(), "ALTER COLUMN ... TYPE"),
        ("TRUNCATE s.t", "TRUNCATE"),
        ("SAVEPOINT p", "savepoints"),
        ("CREATE TEMP TABLE x (a text) ON COMMIT DELETE ROWS", "ON COMMIT"),
        ("CREATE TABLE x (a jsonb)", "column type"),
        ("ALTER TABLE s.t ALTER COLUMN c DROP NOT NULL", "NOT NULL"),
        ("ALTER TABLE s.t DROP COLUMN IF EXISTS c", "DROP COLUMN IF EXISTS"),
        (
            "MERGE INTO t USING s ON t.id = s.id WHEN MATCHED AND s.c > t.c THEN UPDATE SET v = s.v \
             WHEN NOT MATCHED THEN INSERT (id, v) VALUES (s.id, s.v)",
            "WHEN MATCHED AND",
        ),
        ("INSERT INTO t (a) SELECT 1 RETURNING a", "RETURNING"),
        ("SELECT pg_advisory_xact_lock(hashtext('x'))", "function"),
        ("COPY t (a) FROM STDIN", "COPY FROM STDIN"),
        ("LOCK TABLE t IN SHARE ROW EXCLUSIVE MODE", "LOCK ... IN"),
    ];
    for (sql, want) in cases {
        let v = dialect_violations(sql);
        assert!(v.iter().any(|m| m.contains(want)), "{sql}: wanted {want}, got {v:?}");
    }
    // What the Redshift sink sends passes (a sample; the test above checks
    // everything a workload sent).
    let ok = "MERGE INTO t USING s ON t.id = s.id WHEN MATCHED THEN UPDATE SET v = s.v \
              WHEN NOT MATCHED THEN INSERT (id, v) VALUES (s.id, s.v)";
    assert!(dialect_violations(ok).is_empty(), "{:?}", dialect_violations(ok));
}

/// PostgreSQL -> source-runner -> Kafka -> sink-runner -> PostgreSQL as
/// Redshift, staging in moto ([`tributary_tests::e2e`]): the copy equals the
/// source after the snapshot, streaming, a kill -9 of the sink runner and an
/// added column; PostgreSQL's infinity date is dead-lettered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_to_kafka_to_redshift_equals_the_source_across_kill_9() {
    let copy = tributary_tests::redshift::Copy {
        warehouse: Warehouse::new("e2e").await,
        group: tributary_tests::unique("rse2e"),
    };
    let dead = tributary_tests::e2e::kill_9_across_the_pipeline(&tributary_tests::unique("rse2e"), &copy)
        .await
        .expect("a dead letter");
    // Redshift's reason, from the (stand-in) stl_load_errors row the
    // refused COPY left: PostgreSQL's message there, never the value.
    let message = tributary_tests::header(&dead, sink_runner::dead_letters::HEADER_MESSAGE).unwrap_or_default();
    assert!(
        message.contains("date out of range") && message.contains("stl_load_errors: column due"),
        "{message}"
    );
    // (The staged value: the date PostgreSQL's infinity is staged as.)
    assert!(!message.contains("5881580"), "no value in the message: {message}");
    let column = tributary_tests::header(&dead, sink_runner::dead_letters::HEADER_COLUMN);
    assert_eq!(column.as_deref(), Some("due"), "{message}");
}

/// Two members of a consumer group each meet a reset on their own
/// partition at the same time. Only the first forgets the table's
/// positions: a second forgetting, after the first member had written its
/// copy rows, made those rows look older than the copy, and the copy's
/// end removed them (the fault suite's postgres-redshift, seed
/// 9948827786508112435, lost 163 copy rows of one partition that way).
/// A third session holds the table's lock so that both members are at the
/// reset at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_members_meeting_one_reset_at_once_keep_each_others_copy_rows() {
    let wh = Warehouse::new("resetrace").await;
    let group = unique("resetrace");
    let s = items();
    let t = "redshift.resetrace";
    let mut first = RedshiftSink::new(wh.config(&group)).expect("config");
    let mut second = RedshiftSink::new(wh.config(&group)).expect("config");
    let before = (1..=4).map(|i| event(&s, Op::Read, None, Some(row(i, &format!("old{i}"), i, "1.00")), 10, 0));
    first.apply(&batch(t, 0, before.collect())).await.expect("the first copy");

    // The reset, then copy rows at the copy's position, on partition 0
    // (rows 1 and 2) and on partition 1 (rows 3 and 4).
    let reset_batch = |partition: i32, first_offset: i64, ids: [i32; 2]| {
        let copy = ids.map(|i| event(&s, Op::Read, None, Some(row(i, &format!("new{i}"), i, "2.00")), 40, 0));
        let mut b = batch(t, first_offset, copy.into());
        let at = b.records[0].0.clone();
        b.records.insert(0, (at, SinkRecord::Reset(s.id.clone(), 7)));
        for (i, (p, _)) in b.records.iter_mut().enumerate() {
            p.partition = partition;
            p.offset = first_offset + i as i64;
        }
        b.next_offsets = vec![(t.into(), partition, first_offset + 3)];
        b
    };
    let (on_0, on_1) = (reset_batch(0, 4, [1, 2]), reset_batch(1, 0, [3, 4]));
    wh.admin
        .batch_execute(&format!("BEGIN; LOCK {}", wh.table()))
        .await
        .expect("hold the table");
    let a = tokio::spawn(async move { first.apply(&on_0).await.map(|_| first) });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let b = tokio::spawn(async move { second.apply(&on_1).await.map(|_| second) });
    tokio::time::sleep(std::time::Duration::from_millis(700)).await;
    wh.admin.batch_execute("COMMIT").await.expect("let go of the table");
    let mut first = a.await.expect("first member").expect("the first member's reset");
    b.await.expect("second member").expect("the second member's reset");

    // The copy's end: rows older than the copy are gone at the source.
    let mut end = batch(t, 7, Vec::new());
    end.table = s.id.clone();
    end.records = vec![(
        tributary_connectors::KafkaPosition { topic: t.into(), partition: 0, offset: 7 },
        SinkRecord::Copied(s.id.clone(), Position { commit: 40, index: 0 }),
    )];
    end.next_offsets = vec![(t.into(), 0, 8)];
    first.apply(&end).await.expect("the copy's end");
    assert_eq!(
        wh.rows().await,
        vec!["1|new1|1|2.00", "2|new2|2|2.00", "3|new3|3|2.00", "4|new4|4|2.00"],
        "every copy row of both partitions stays"
    );
    wh.cleanup(&[group]).await;
}

/// Changes/s applied into the test mode per batch size, and statements per
/// million changes (each a query in Redshift's queue; the staged file's
/// upload is not one). PostgreSQL stands in for the cluster and moto for
/// S3, so the rates say how the sink behaves, nothing of Redshift's speed.
/// Run by `bench/run --sink redshift`, or: `BENCH_ROWS=20000
/// BENCH_BATCHES=100,1000,5000 cargo test -p tributary-tests --test
/// redshift_sink bench -- --ignored --nocapture`.
#[tokio::test]
#[ignore = "benchmark; run explicitly"]
async fn bench_apply_rates_per_batch_size() {
    bench::apply_rates_per_batch_size::<BenchWarehouse>().await;
}

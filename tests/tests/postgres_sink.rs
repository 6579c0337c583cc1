//! The PostgreSQL sink against the real PostgreSQL of the local stack, and
//! the sink runner end to end through real Kafka and the schema registry.
//!
//! Needs `scripts/stack up`. Endpoints: `PG_DESTINATION_URL` (default
//! `postgres://tributary:tributary@127.0.0.1:5432/destination`),
//! `KAFKA_BOOTSTRAP` (default `127.0.0.1:9092`), `SCHEMA_REGISTRY_URL`
//! (default `http://127.0.0.1:8081/apis/ccompat/v7`).
//!
//! Every test works in its own schema (and topics, and consumer group), so
//! tests run in parallel and leave nothing that another run would trip on.
//!
//! The kill -9 test runs the `sink-runner` binary as a child process. Cargo
//! builds a dependency's binaries only for its own tests, so the test looks
//! for `target/<profile>/sink-runner` next to its own executable
//! (`target/<profile>/deps/postgres_sink-*`) and builds it with
//! `cargo build -p sink-runner` when it is missing or older than this test.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tributary_connectors::sinks::postgres::{PostgresSink, PostgresSinkConfig};
use tributary_connectors::{ErrorKind, KafkaPosition, Sink, SinkBatch, SinkRecord};
use tributary_schemas::{ChangeEvent, DataType, Op, TableId, TableSchema, Value};

use tributary_tests::postgres::{connect, Destination as Fixture};
use tributary_tests::unique;

fn url() -> String {
    tributary_tests::pg_destination_url()
}

use tributary_tests::bench;
use tributary_tests::items::{
    assert_after_mixed_changes, batch, column, event, items, key_row, mixed_changes, row, truncate_changes,
};

#[tokio::test]
async fn snapshot_updates_deletes_and_truncate_give_the_expected_rows() {
    let fx = Fixture::new("flow").await;
    let s = items();
    let mut sink = fx.sink();
    let snapshot: Vec<ChangeEvent> = (1..=100)
        .map(|i| event(&s, Op::Read, None, Some(row(i, &format!("item {i}"), i, "1.50")), 10, 0))
        .collect();
    sink.apply(&batch("t", 0, snapshot)).await.expect("snapshot");
    assert_eq!(fx.rows().await.len(), 100);
    assert_eq!(fx.offsets().await.get(&("t".into(), 0)), Some(&100));

    let changes = mixed_changes(&s);
    sink.apply(&batch("t", 100, changes)).await.expect("changes");
    assert_after_mixed_changes(&fx.rows().await);
    assert_eq!(fx.offsets().await.get(&("t".into(), 0)), Some(&109));
    let t = truncate_changes(&s);
    sink.apply(&batch("t", 109, t)).await.expect("truncate");
    assert_eq!(fx.rows().await, vec!["500|after|1|1.00".to_string()]);
    fx.cleanup().await;
}

/// One destination transaction over several batches (`UnitPart`, a
/// source transaction larger than the sink runner's memory bound): the
/// batches applied with `more` are invisible to other sessions and move no
/// offset; the batch that continues and ends the unit commits all of them
/// with the offsets; a unit whose session ended meanwhile is refused
/// (retryable, the runner reads it again) and none of it stays.
#[tokio::test]
async fn a_transaction_held_open_across_batches_commits_once_and_a_lost_one_is_refused() {
    let fx = Fixture::new("unit").await;
    let s = items();
    let mut sink = fx.sink();
    assert!(sink.spans_batches());
    let events = |ids: std::ops::RangeInclusive<i32>| -> Vec<ChangeEvent> {
        ids.map(|i| event(&s, Op::Create, None, Some(row(i, &format!("item {i}"), i, "1.50")), 10, i as u64))
            .collect()
    };
    let mut first = batch("t", 0, events(1..=50));
    first.unit.more = true;
    sink.apply(&first).await.expect("first part");
    assert!(fx.rows().await.is_empty(), "nothing is visible while the unit is open");
    assert_eq!(fx.offsets().await.get(&("t".into(), 0)), None);
    let mut middle = batch("t", 50, events(51..=60));
    middle.unit = tributary_connectors::UnitPart { continues: true, more: true };
    sink.apply(&middle).await.expect("middle part");
    assert!(fx.rows().await.is_empty());
    let mut last = batch("t", 60, events(61..=80));
    last.unit.continues = true;
    sink.apply(&last).await.expect("last part");
    assert_eq!(fx.rows().await.len(), 80, "all of it at once");
    assert_eq!(fx.offsets().await.get(&("t".into(), 0)), Some(&80));

    // The session ends while a unit is open: the next part is refused.
    let mut open = batch("t", 80, events(81..=90));
    open.unit.more = true;
    sink.apply(&open).await.expect("opened");
    let admin = connect(&url()).await;
    let killed = admin
        .query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE state = 'idle in transaction' AND query LIKE '%' || $1 || '%'",
            &[&fx.schema],
        )
        .await
        .expect("terminate");
    assert_eq!(killed.len(), 1, "the sink's session, idle in its open transaction");
    let mut next = batch("t", 90, events(91..=95));
    next.unit.continues = true;
    // Seen as ended, or failing at its first statement: refused either way.
    let error = sink.apply(&next).await.expect_err("a part of a lost unit is refused").error;
    assert_eq!(error.kind(), ErrorKind::Retryable, "{error}");
    assert_eq!(fx.rows().await.len(), 80, "nothing of the lost unit stays");
    assert_eq!(fx.offsets().await.get(&("t".into(), 0)), Some(&80));
    fx.cleanup().await;
}

/// A sequence record makes the sequence (named as the sink names tables)
/// and moves it to at least the source's next value: never back, in the
/// sequence's own direction, in the batch's transaction.
#[tokio::test]
async fn sequences_are_made_and_only_moved_forward() {
    use tributary_schemas::SequenceState;
    let fx = Fixture::new("seq").await;
    let mut sink = fx.sink();
    let state = |name: &str, increment: i64, last_value: i64, is_called: bool| SequenceState {
        schema: "public".into(),
        name: name.into(),
        data_type: "bigint".into(),
        increment,
        min: -1_000_000,
        max: 1_000_000,
        cycle: false,
        last_value,
        is_called,
    };
    let table = TableId::new("public", "items");
    let mut offset = 0;
    let mut apply = |states: Vec<SequenceState>| {
        let records: Vec<(KafkaPosition, SinkRecord)> = states
            .into_iter()
            .map(|st| {
                offset += 1;
                (
                    KafkaPosition {
                        topic: "t".into(),
                        partition: 0,
                        offset: offset - 1,
                    },
                    SinkRecord::Sequence(table.clone(), st),
                )
            })
            .collect();
        SinkBatch {
            table: table.clone(),
            next_offsets: vec![("t".into(), 0, offset)],
            records,
            expected_offsets: vec![],
            unit: tributary_connectors::UnitPart::default(),
        }
    };
    let next = |name: &'static str| {
        let fx = &fx;
        async move {
            let q = format!(
                "SELECT CASE WHEN is_called THEN last_value + 1 ELSE last_value END FROM \"{}\".\"{name}\"",
                fx.schema
            );
            let admin = connect(&url()).await;
            admin.query_one(q.as_str(), &[]).await.expect("sequence").get::<_, i64>(0)
        }
    };
    sink.apply(&apply(vec![state("up", 1, 41, true), state("fresh", 1, 7, false)]))
        .await
        .expect("made");
    assert_eq!(next("up").await, 42);
    assert_eq!(next("fresh").await, 7, "not called yet: 7 comes next");
    // An older read (a zombie's, a replay's) never moves it back.
    sink.apply(&apply(vec![state("up", 1, 10, true), state("up", 1, 99, true)]))
        .await
        .expect("moved");
    assert_eq!(next("up").await, 100);
    sink.apply(&apply(vec![state("up", 1, 50, true)])).await.expect("older");
    assert_eq!(next("up").await, 100, "never back");
    // Ahead at the destination (a value handed out there): kept.
    connect(&url())
        .await
        .batch_execute(&format!("SELECT nextval('\"{}\".\"up\"')", fx.schema))
        .await
        .expect("nextval");
    sink.apply(&apply(vec![state("up", 1, 99, true)])).await.expect("behind");
    assert_eq!(next("up").await, 101);
    // A descending sequence moves down.
    sink.apply(&apply(vec![state("down", -1, -5, true)])).await.expect("down");
    let q = format!("SELECT last_value FROM \"{}\".\"down\"", fx.schema);
    let admin = connect(&url()).await;
    assert_eq!(admin.query_one(q.as_str(), &[]).await.expect("down").get::<_, i64>(0), -5);
    sink.apply(&apply(vec![state("down", -1, -2, true)])).await.expect("down again");
    assert_eq!(admin.query_one(q.as_str(), &[]).await.expect("down").get::<_, i64>(0), -5, "never back up");
    fx.cleanup().await;
}

#[tokio::test]
async fn replaying_a_batch_changes_nothing() {
    let fx = Fixture::new("replay").await;
    let s = items();
    let mut sink = fx.sink();
    let events = vec![
        event(&s, Op::Create, None, Some(row(1, "a", 1, "1.00")), 5, 0),
        event(&s, Op::Create, None, Some(row(2, "b", 2, "2.00")), 5, 1),
        event(&s, Op::Update, None, Some(row(1, "a2", 3, "1.00")), 6, 0),
        event(&s, Op::Create, None, Some(row(3, "c", 3, "3.00")), 7, 0),
        event(&s, Op::Delete, Some(key_row(3)), None, 8, 0),
    ];
    let b = batch("t", 0, events);
    sink.apply(&b).await.expect("first apply");
    let rows = fx.rows().await;
    let versions = fx.versions().await;
    // Later changes, then the same batch again (a replay after a crash).
    sink.apply(&batch("t", 5, vec![event(&s, Op::Update, None, Some(row(2, "b2", 9, "2.00")), 9, 0)]))
        .await
        .expect("later change");
    let later_rows = fx.rows().await;
    let later_versions = fx.versions().await;
    sink.apply(&b).await.expect("replay");
    assert_eq!(fx.rows().await, later_rows, "a replay moved rows");
    assert_eq!(fx.versions().await, later_versions, "a replay wrote row versions");
    assert_ne!(rows, later_rows);
    // A second sink (a restarted runner) replaying: the same.
    let mut again = fx.sink();
    again.apply(&b).await.expect("replay from a new session");
    assert_eq!(fx.versions().await, later_versions);
    let _ = versions;
    fx.cleanup().await;
}

#[tokio::test]
async fn inserts_of_existing_keys_fall_back_from_the_copy_fast_path() {
    let fx = Fixture::new("fast").await;
    let s = items();
    let mut sink = fx.sink();
    let inserts: Vec<ChangeEvent> = (0..100)
        .map(|i| event(&s, Op::Read, None, Some(row(i, "snap", i, "1.00")), 10, 0))
        .collect();
    let b = batch("t", 0, inserts.clone());
    sink.apply(&b).await.expect("fast path");
    sink.apply(&batch("t", 100, vec![event(&s, Op::Update, None, Some(row(7, "newer", 7, "7.00")), 20, 0)]))
        .await
        .unwrap();
    let versions = fx.versions().await;
    // A replay of the insert-only batch, from a fresh session: the direct
    // COPY meets existing keys, falls back, and the positions keep the
    // newer row.
    let mut fresh = fx.sink();
    fresh.apply(&b).await.expect("replay");
    assert_eq!(fx.versions().await, versions);
    // New and existing keys mixed, in one insert-only batch.
    let mut mixed = inserts[..10].to_vec();
    mixed.push(event(&s, Op::Create, None, Some(row(1000, "new", 1, "1.00")), 30, 0));
    fresh.apply(&batch("t", 101, mixed)).await.expect("mixed");
    let rows = fx.rows().await;
    assert_eq!(rows.len(), 101);
    assert!(rows.contains(&"7|newer|7|7.00".to_string()));
    assert!(rows.contains(&"1000|new|1|1.00".to_string()));
    fx.cleanup().await;
}

#[tokio::test]
async fn a_key_twice_in_one_insert_only_batch_keeps_the_newer_row() {
    // The direct COPY of such a batch meets its own duplicate; the batch is
    // then reduced, whatever order the two events come in.
    let fx = Fixture::new("twice").await;
    let s = items();
    let mut sink = fx.sink();
    let mut first: Vec<ChangeEvent> = (0..50)
        .map(|i| event(&s, Op::Read, None, Some(row(i, "snap", i, "1.00")), 10, i as u64))
        .collect();
    first.push(event(&s, Op::Create, None, Some(row(7, "newer", 7, "7.00")), 20, 0));
    sink.apply(&batch("t", 0, first)).await.expect("newer last");
    let mut second = vec![event(&s, Op::Create, None, Some(row(100, "newer", 100, "2.00")), 40, 0)];
    second.extend((100..150).map(|i| event(&s, Op::Read, None, Some(row(i, "snap", i, "1.00")), 30, i as u64)));
    sink.apply(&batch("t", 51, second)).await.expect("newer first");
    let rows = fx.rows().await;
    assert_eq!(rows.len(), 100);
    assert!(rows.contains(&"7|newer|7|7.00".to_string()), "{rows:?}");
    assert!(rows.contains(&"100|newer|100|2.00".to_string()), "{rows:?}");
    assert!(rows.contains(&"8|snap|8|1.00".to_string()));
    fx.cleanup().await;
}

#[tokio::test]
async fn an_older_event_never_moves_a_row_backwards() {
    let fx = Fixture::new("order").await;
    let s = items();
    let mut sink = fx.sink();
    sink.apply(&batch("t", 0, vec![event(&s, Op::Create, None, Some(row(1, "new", 2, "2.00")), 20, 0)]))
        .await
        .unwrap();
    // Older update, older delete, in separate batches: nothing changes.
    sink.apply(&batch("t", 1, vec![event(&s, Op::Update, None, Some(row(1, "old", 1, "1.00")), 15, 0)]))
        .await
        .unwrap();
    sink.apply(&batch("t", 2, vec![event(&s, Op::Delete, Some(key_row(1)), None, 19, 9)]))
        .await
        .unwrap();
    assert_eq!(fx.rows().await, vec!["1|new|2|2.00".to_string()]);
    // Out of order inside one batch: the newest position wins.
    sink.apply(&batch(
        "t",
        3,
        vec![
            event(&s, Op::Update, None, Some(row(1, "newest", 3, "3.00")), 30, 0),
            event(&s, Op::Update, None, Some(row(1, "older", 9, "9.00")), 25, 0),
        ],
    ))
    .await
    .unwrap();
    assert_eq!(fx.rows().await, vec!["1|newest|3|3.00".to_string()]);
    // An older truncate does not remove newer rows.
    sink.apply(&batch("t", 5, vec![event(&s, Op::Truncate, None, None, 29, 0)]))
        .await
        .unwrap();
    assert_eq!(fx.rows().await, vec!["1|newest|3|3.00".to_string()]);
    fx.cleanup().await;
}

#[tokio::test]
async fn a_failed_apply_moves_neither_rows_nor_offsets_and_names_the_record() {
    let fx = Fixture::new("atomic").await;
    let s = items();
    let mut sink = fx.sink();
    sink.apply(&batch("t", 0, vec![event(&s, Op::Create, None, Some(row(1, "a", 1, "1.00")), 1, 0)]))
        .await
        .unwrap();
    assert_eq!(sink.committed_offsets(&[("t".into(), 0), ("t".into(), 1)]).await.unwrap(), vec![Some(1), None]);
    // A rule the destination has and the source has not.
    fx.exec(&format!("ALTER TABLE {} ADD CONSTRAINT qty_small CHECK (qty < 1000)", fx.table()))
        .await;
    let events: Vec<ChangeEvent> = (0..40)
        .map(|i| {
            let qty = if i == 23 { 5000 } else { i };
            event(&s, Op::Create, None, Some(row(100 + i, "x", qty, "1.00")), 2, i as u64)
        })
        .collect();
    let before = fx.rows().await;
    let err = sink
        .apply(&batch("t", 1, events.clone()))
        .await
        .expect_err("the check constraint must refuse");
    assert_eq!(err.error.kind(), ErrorKind::Permanent, "{}", err.error);
    assert_eq!(err.record, Some(23), "{}", err.error);
    assert!(err.error.to_string().contains("qty_small"), "{}", err.error);
    assert!(!err.error.to_string().contains("5000"), "a row value leaked: {}", err.error);
    assert_eq!(fx.rows().await, before, "rows moved after a failed apply");
    assert_eq!(fx.offsets().await.get(&("t".into(), 0)), Some(&1), "offsets moved after a failed apply");
    // Without the bad record (what the runner does after dead-lettering it).
    let mut b = batch("t", 1, events);
    b.records.remove(23);
    sink.apply(&b).await.expect("the rest applies");
    assert_eq!(fx.rows().await.len(), 40);
    assert_eq!(fx.offsets().await.get(&("t".into(), 0)), Some(&41));
    fx.cleanup().await;
}

#[tokio::test]
async fn a_value_the_column_cannot_take_is_permanent_for_that_record_only() {
    let fx = Fixture::new("value").await;
    let s = items();
    let mut sink = fx.sink();
    // A text value where the column is an integer (what a decoder bug or a
    // hand-changed column would give), at record 2 of 5.
    let mut events: Vec<ChangeEvent> = (0..5)
        .map(|i| event(&s, Op::Create, None, Some(row(i, "ok", i, "1.00")), 1, i as u64))
        .collect();
    if let Some(after) = events[2].after.as_mut() {
        after[2] = Value::Text("secret-value".into());
    }
    let err = sink.apply(&batch("t", 0, events)).await.expect_err("must fail");
    assert_eq!(err.error.kind(), ErrorKind::Permanent);
    assert_eq!(err.record, Some(2));
    assert_eq!(err.error.column(), Some("qty"), "{}", err.error);
    assert!(!err.error.to_string().contains("secret-value"), "a row value leaked: {}", err.error);

    // A column changed by hand to a type the source type cannot widen
    // into: every record of that schema is refused, naming table and column.
    sink.apply(&batch("t", 0, vec![event(&s, Op::Create, None, Some(row(1, "a", 1, "1.00")), 1, 0)]))
        .await
        .unwrap();
    fx.exec(&format!("ALTER TABLE {} ALTER COLUMN name TYPE integer USING NULL", fx.table()))
        .await;
    let mut fresh = fx.sink();
    let err = fresh
        .apply(&batch("t", 1, vec![event(&s, Op::Create, None, Some(row(2, "b", 1, "1.00")), 2, 0)]))
        .await
        .expect_err("incompatible column");
    assert_eq!(err.error.kind(), ErrorKind::Permanent);
    assert_eq!(err.record, Some(0));
    assert_eq!(err.error.column(), Some("name"));
    assert!(err.error.to_string().contains("items"), "{}", err.error);
    fx.cleanup().await;
}

#[tokio::test]
async fn schema_changes_add_columns_and_widen_types() {
    let fx = Fixture::new("evolve").await;
    let s1 = items();
    let mut sink = fx.sink();
    sink.apply(&batch("t", 0, vec![event(&s1, Op::Create, None, Some(row(1, "a", 1, "1.00")), 1, 0)]))
        .await
        .unwrap();
    // v2: qty becomes bigint, name varchar(80), price numeric(12,2), a new column.
    let mut v2 = (*s1).clone();
    v2.columns[1] = column("name", DataType::Text, true, "character varying(80)");
    v2.columns[2] = column("qty", DataType::Int64, true, "bigint");
    v2.columns[3] = column("price", DataType::Decimal { precision: 12, scale: 2 }, true, "numeric(12,2)");
    v2.columns.push(column("note", DataType::Text, true, "text"));
    let s2 = Arc::new(v2);
    let big = vec![
        Value::Int32(2),
        Value::Text("x".repeat(70)),
        Value::Int64(10_000_000_000),
        Value::Decimal("1234567890.12".into()),
        Value::Text("hello".into()),
    ];
    // v1 and v2 events in one batch.
    sink.apply(&batch(
        "t",
        1,
        vec![
            event(&s1, Op::Create, None, Some(row(3, "c", 3, "3.00")), 2, 0),
            event(&s2, Op::Create, None, Some(big), 3, 0),
        ],
    ))
    .await
    .expect("evolved");
    let types: Vec<String> = fx
        .admin
        .query(
            "SELECT attname || ' ' || format_type(atttypid, atttypmod) FROM pg_attribute \
             WHERE attrelid = to_regclass($1) AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
            &[&fx.table()],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        types,
        vec![
            "id integer",
            "name character varying(80)",
            "qty bigint",
            "price numeric(12,2)",
            "__tributary_commit bigint",
            "__tributary_index bigint",
            "note text"
        ]
    );
    assert_eq!(fx.rows().await.len(), 3);
    fx.cleanup().await;
}

#[tokio::test]
async fn a_dropped_source_table_is_dropped_only_when_configured() {
    let fx = Fixture::new("drop").await;
    let s = items();
    let mut keep = fx.sink();
    keep.apply(&batch("t", 0, vec![event(&s, Op::Create, None, Some(row(1, "a", 1, "1.00")), 1, 0)]))
        .await
        .unwrap();
    let dropped = |offset| SinkBatch {
        table: s.id.clone(),
        records: vec![(
            KafkaPosition { topic: "t".into(), partition: 0, offset },
            SinkRecord::TableDropped(s.id.clone()),
        )],
        next_offsets: vec![("t".into(), 0, offset + 1)],
        expected_offsets: Vec::new(),
        unit: tributary_connectors::UnitPart::default(),
    };
    keep.apply(&dropped(1)).await.unwrap();
    assert_eq!(fx.rows().await.len(), 1, "drop_tables = false must keep the table");
    let mut config = fx.config();
    config.drop_tables = true;
    let mut drop = PostgresSink::new(config).unwrap();
    drop.apply(&dropped(2)).await.unwrap();
    let exists: bool = fx
        .admin
        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&fx.table()])
        .await
        .unwrap()
        .get(0);
    assert!(!exists);
    assert_eq!(fx.offsets().await.get(&("t".into(), 0)), Some(&3));
    fx.cleanup().await;
}

#[tokio::test]
async fn an_unreachable_destination_is_retryable() {
    let mut config = PostgresSinkConfig::new("postgres://tributary:tributary@127.0.0.1:1/destination", "g");
    config.connect_timeout_ms = 2_000;
    let mut sink = PostgresSink::new(config).unwrap();
    let s = items();
    let err = sink
        .apply(&batch("t", 0, vec![event(&s, Op::Create, None, Some(row(1, "a", 1, "1.00")), 1, 0)]))
        .await
        .expect_err("nothing listens on port 1");
    assert_eq!(err.error.kind(), ErrorKind::Retryable, "{}", err.error);
    assert_eq!(err.record, None);
    let err = sink.committed_offsets(&[("t".into(), 0)]).await.expect_err("offsets too");
    assert_eq!(err.kind(), ErrorKind::Retryable);
}

/// A login role of its own that owns the fixture's schema and may write the
/// offsets, with its URL: to tell its sessions from other tests' and to
/// take rights away from it.
async fn own_role(fx: &Fixture) -> (String, String) {
    let role = unique("sink_role");
    let db: String = fx.admin.query_one("SELECT current_database()", &[]).await.unwrap().get(0);
    // The bookkeeping tables exist once any sink connected; on a fresh
    // database this is the first.
    fx.sink().connect().await.expect("bookkeeping tables");
    fx.exec(&format!(
        "CREATE ROLE {role} LOGIN PASSWORD 'pw'; CREATE SCHEMA \"{s}\" AUTHORIZATION {role}; \
         GRANT USAGE ON SCHEMA tributary TO {role}; GRANT SELECT, INSERT, UPDATE ON tributary.offsets TO {role}; \
         GRANT SELECT, INSERT, UPDATE, DELETE ON tributary.deleted_rows TO {role}",
        s = fx.schema
    ))
    .await;
    let parsed: tokio_postgres::Config = url().parse().unwrap();
    let host = parsed
        .get_hosts()
        .first()
        .map(|h| match h {
            tokio_postgres::config::Host::Tcp(h) => h.clone(),
            #[cfg(unix)]
            tokio_postgres::config::Host::Unix(p) => p.display().to_string(),
        })
        .unwrap_or_else(|| "127.0.0.1".into());
    let port = parsed.get_ports().first().copied().unwrap_or(5432);
    (role.clone(), format!("postgres://{role}:pw@{host}:{port}/{db}"))
}

async fn drop_role(fx: &Fixture, role: &str) {
    fx.exec(&format!("DROP SCHEMA \"{}\" CASCADE", fx.schema)).await;
    let _ = fx.admin.batch_execute(&format!("DROP OWNED BY {role}; DROP ROLE {role}")).await;
}

/// TLS to the destination in each mode, against the stack's server (its
/// certificate names `localhost`, not `127.0.0.1`): verify-full refuses the
/// address and accepts the name, and the session is encrypted.
#[tokio::test]
async fn tls_to_the_destination_is_verified_and_used() {
    use tributary_connectors::pgwire::tls::TlsMode;
    let fx = Fixture::new("tls").await;
    let (role, role_url) = own_role(&fx).await;
    let ca = tributary_tests::pg_tls_ca();
    let s = items();
    let with = |mode: TlsMode, host: &str| {
        let mut c = fx.config();
        c.url = role_url.replace("127.0.0.1", host);
        c.tls = mode;
        c.tls_ca_file = matches!(mode, TlsMode::VerifyCa | TlsMode::VerifyFull).then(|| ca.clone());
        c.validate_at("postgres").expect("valid TLS config");
        PostgresSink::new(c).expect("sink config")
    };
    let mut wrong_name = with(TlsMode::VerifyFull, "127.0.0.1");
    let err = wrong_name
        .apply(&batch("t", 0, vec![event(&s, Op::Create, None, Some(row(1, "a", 1, "1.00")), 1, 0)]))
        .await
        .expect_err("the certificate does not name 127.0.0.1");
    assert_eq!(err.error.kind(), ErrorKind::NeedsOperator, "{}", err.error);
    for (offset, (mode, host)) in [
        (TlsMode::Require, "127.0.0.1"),
        (TlsMode::VerifyCa, "127.0.0.1"),
        (TlsMode::VerifyFull, "localhost"),
    ]
    .into_iter()
    .enumerate()
    {
        let offset = offset as i64;
        let mut sink = with(mode, host);
        let id = offset as i32 + 1;
        sink.apply(&batch("t", offset, vec![event(&s, Op::Create, None, Some(row(id, "a", 1, "1.00")), id as u64, 0)]))
            .await
            .unwrap_or_else(|e| panic!("{mode:?} to {host}: {}", e.error));
        let encrypted: bool = fx
            .admin
            .query_one(
                "SELECT coalesce(bool_and(s.ssl), false) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
                 WHERE a.application_name = 'tributary-sink' AND a.usename = $1",
                &[&role],
            )
            .await
            .expect("pg_stat_ssl")
            .get(0);
        assert!(encrypted, "{mode:?}: the destination session is encrypted");
        drop(sink);
        // The next mode's check must not see this session.
        wait_for_no_sessions(&fx, &role).await;
    }
    let mut config = fx.config();
    config.tls_ca_file = Some(ca);
    let e = config.validate_at("postgres").expect_err("a CA with tls = disable is refused");
    assert!(e.to_string().contains("postgres.tls_ca_file"), "{e}");
    assert_eq!(fx.rows().await.len(), 3);
    drop_role(&fx, &role).await;
    fx.cleanup().await;
}

async fn wait_for_no_sessions(fx: &Fixture, role: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let n: i64 = fx
            .admin
            .query_one("SELECT count(*) FROM pg_stat_activity WHERE usename = $1", &[&role])
            .await
            .expect("pg_stat_activity")
            .get(0);
        if n == 0 {
            return;
        }
        assert!(Instant::now() < deadline, "the dropped sink's session stayed open");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A sink connected as [`own_role`], which has written row 1 at offset 0
/// (so its table exists, owned by the role).
async fn sink_of_own_role(fx: &Fixture) -> (String, PostgresSink) {
    let (role, role_url) = own_role(fx).await;
    let mut config = fx.config();
    config.url = role_url;
    let mut sink = PostgresSink::new(config).unwrap();
    sink.apply(&batch("t", 0, vec![event(&items(), Op::Create, None, Some(row(1, "a", 1, "1.00")), 1, 0)]))
        .await
        .expect("the role can write");
    (role, sink)
}

#[tokio::test]
async fn revoked_privileges_need_an_operator_and_the_sink_resumes_after_the_grant() {
    let fx = Fixture::new("grant").await;
    let (role, mut sink) = sink_of_own_role(&fx).await;
    let s = items();
    // The table belongs to the role; an operator takes its rights away.
    fx.exec(&format!("ALTER TABLE {} OWNER TO tributary; REVOKE ALL ON {} FROM {role}", fx.table(), fx.table()))
        .await;
    let b = batch("t", 1, vec![event(&s, Op::Create, None, Some(row(2, "b", 1, "1.00")), 2, 0)]);
    let err = sink.apply(&b).await.expect_err("no privilege");
    assert_eq!(err.error.kind(), ErrorKind::NeedsOperator, "{}", err.error);
    assert!(err.error.hint().unwrap_or("").contains("GRANT"), "{:?}", err.error.hint());
    assert_eq!(fx.offsets().await.get(&("t".into(), 0)), Some(&1));
    fx.exec(&format!("GRANT SELECT, INSERT, UPDATE, DELETE, TRUNCATE ON {} TO {role}", fx.table()))
        .await;
    sink.apply(&b).await.expect("resumes after the GRANT");
    assert_eq!(fx.rows().await.len(), 2);
    assert_eq!(fx.offsets().await.get(&("t".into(), 0)), Some(&2));
    drop(sink);
    drop_role(&fx, &role).await;
    fx.cleanup().await;
}

/// The offsets go in one message with the `COMMIT`: when the offsets
/// cannot be written, the rows of that transaction must not stay either.
#[tokio::test]
async fn a_refused_offsets_write_keeps_the_rows_out_and_resumes_after_the_grant() {
    let fx = Fixture::new("offsets_grant").await;
    let (role, mut sink) = sink_of_own_role(&fx).await;
    let s = items();
    fx.exec(&format!("REVOKE INSERT, UPDATE ON tributary.offsets FROM {role}"))
        .await;
    // A snapshot-like batch (the direct COPY) and an upsert (staging and
    // merge): neither may leave rows behind.
    let copied = batch("t", 1, vec![event(&s, Op::Read, None, Some(row(2, "b", 1, "1.00")), 2, 0)]);
    let merged = batch("t", 1, vec![event(&s, Op::Update, None, Some(row(1, "z", 9, "9.00")), 2, 1)]);
    for b in [&copied, &merged] {
        let err = sink.apply(b).await.expect_err("the offsets cannot be written");
        assert_eq!(err.error.kind(), ErrorKind::NeedsOperator, "{}", err.error);
        assert_eq!(fx.rows().await, vec!["1|a|1|1.00".to_string()]);
        assert_eq!(fx.offsets().await.get(&("t".into(), 0)), Some(&1));
    }
    fx.exec(&format!("GRANT INSERT, UPDATE ON tributary.offsets TO {role}")).await;
    sink.apply(&copied).await.expect("resumes after the GRANT");
    sink.apply(&batch("t", 2, vec![event(&s, Op::Update, None, Some(row(1, "z", 9, "9.00")), 2, 1)]))
        .await
        .expect("and goes on");
    assert_eq!(fx.rows().await, vec!["1|z|9|9.00".to_string(), "2|b|1|1.00".to_string()]);
    assert_eq!(fx.offsets().await.get(&("t".into(), 0)), Some(&3));
    drop(sink);
    drop_role(&fx, &role).await;
    fx.cleanup().await;
}

#[tokio::test]
async fn every_common_type_round_trips() {
    let fx = Fixture::new("types").await;
    let s = Arc::new(TableSchema {
        id: TableId::new("public", "items"),
        columns: vec![
            column("id", DataType::Int64, false, "bigint"),
            column("b", DataType::Boolean, true, "boolean"),
            column("s", DataType::Int16, true, "smallint"),
            column("f4", DataType::Float32, true, "real"),
            column("f8", DataType::Float64, true, "double precision"),
            column("d", DataType::VariableDecimal, true, "numeric"),
            column("t", DataType::Text, true, "text"),
            column("j", DataType::Json, true, "jsonb"),
            column("u", DataType::Uuid, true, "uuid"),
            column("by", DataType::Bytes, true, "bytea"),
            column("dt", DataType::Date, true, "date"),
            column("tm", DataType::Time, true, "time without time zone"),
            column("ts", DataType::Timestamp, true, "timestamp without time zone"),
            column("tz", DataType::TimestampTz, true, "timestamp with time zone"),
            column("iv", DataType::Interval, true, "interval"),
            column("e", DataType::Enum { symbols: vec!["a".into()] }, true, "mood"),
            column("arr", DataType::Array(Box::new(DataType::Text)), true, "text[]"),
        ],
        key: vec!["id".into()],
        dropped: Vec::new(),
    });
    let values = vec![
        Value::Int64(1),
        Value::Boolean(true),
        Value::Int16(-7),
        Value::Float32(1.5),
        Value::Float64(f64::NAN),
        Value::Decimal("-12.3400".into()),
        Value::Text("tab\there\nnewline \\ back".into()),
        Value::Json("{\"a\": [1, 2]}".into()),
        Value::Uuid(uuid::Uuid::nil()),
        Value::Bytes(vec![0, 1, 254, 255]),
        Value::Date(19_723),
        Value::Time(45_296_000_001),
        Value::Timestamp(1_700_000_000_123_456),
        Value::TimestampTz(-1),
        Value::Interval { months: 13, days: 2, micros: 3_723_000_004 },
        Value::Enum("a".into()),
        Value::Array(vec![Value::Text("x,y".into()), Value::Null, Value::Text("\"q\"".into())]),
    ];
    let mut sink = fx.sink();
    sink.apply(&batch("t", 0, vec![event(&s, Op::Create, None, Some(values), 1, 0)]))
        .await
        .expect("apply");
    let q = format!(
        "SELECT concat_ws(' ; ', b, s, f4, f8, d, t, j, u, encode(by, 'hex'), dt, tm, ts, tz, iv, e, arr::text, \
         pg_typeof(e)) FROM {}",
        fx.table()
    );
    let text: String = fx.admin.query_one(q.as_str(), &[]).await.unwrap().get(0);
    assert_eq!(
        text,
        "t ; -7 ; 1.5 ; NaN ; -12.3400 ; tab\there\nnewline \\ back ; {\"a\": [1, 2]} ; \
         00000000-0000-0000-0000-000000000000 ; 0001feff ; 2024-01-01 ; 12:34:56.000001 ; \
         2023-11-14 22:13:20.123456 ; 1969-12-31 23:59:59.999999+00 ; 1 year 1 mon 2 days 01:02:03.000004 ; \
         a ; {\"x,y\",NULL,\"\\\"q\\\"\"} ; text"
    );
    fx.cleanup().await;
}

/// The types the sink writes in binary `COPY`, at their edges: each value
/// must read back as PostgreSQL reads the same value's text (the literal
/// beside it), through the direct path (inserts) and the staging path
/// (updates and deletes).
#[tokio::test]
async fn binary_copy_writes_each_type_as_its_text_would() {
    let fx = Fixture::new("binary").await;
    let s = Arc::new(TableSchema {
        id: TableId::new("public", "items"),
        columns: vec![
            column("id", DataType::Int64, false, "bigint"),
            column("b", DataType::Boolean, true, "boolean"),
            column("s", DataType::Int16, true, "smallint"),
            column("f4", DataType::Float32, true, "real"),
            column("f8", DataType::Float64, true, "double precision"),
            column("d", DataType::VariableDecimal, true, "numeric"),
            column("d2", DataType::Decimal { precision: 12, scale: 2 }, true, "numeric(12,2)"),
            column("t", DataType::Text, true, "text"),
            column("v", DataType::Text, true, "character varying(12)"),
            column("j", DataType::Json, true, "jsonb"),
            column("js", DataType::Json, true, "json"),
            column("u", DataType::Uuid, true, "uuid"),
            column("by", DataType::Bytes, true, "bytea"),
            column("dt", DataType::Date, true, "date"),
            column("tm", DataType::Time, true, "time without time zone"),
            column("ts", DataType::Timestamp, true, "timestamp without time zone"),
            column("tz", DataType::TimestampTz, true, "timestamp with time zone"),
        ],
        key: vec!["id".into()],
        dropped: Vec::new(),
    });
    let cases: Vec<Case> = vec![
        (
            1,
            vec![
                Value::Boolean(true),
                Value::Int16(-7),
                Value::Float32(0.1),
                Value::Float64(-2.5e-300),
                Value::Decimal("-12345678901234567890.123456789".into()),
                Value::Decimal("1.005".into()),
                Value::Text("tab\there\nnewline \\ back ü".into()),
                Value::Text("twelve chars".into()),
                Value::Json("{\"a\": [1, 2], \"é\": null}".into()),
                Value::Json("{\"keep\":  \"spacing\"}".into()),
                Value::Uuid(uuid::Uuid::from_u128(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef)),
                Value::Bytes(vec![0, 1, 254, 255]),
                Value::Date(19_723),
                Value::Time(86_400_000_000),
                Value::Timestamp(1_700_000_000_123_456),
                Value::TimestampTz(-1),
            ],
            [
                "t",
                "-7",
                "0.1",
                "-2.5e-300",
                "-12345678901234567890.123456789",
                "1.005",
                "tab\there\nnewline \\ back ü",
                "twelve chars",
                "{\"a\": [1, 2], \"é\": null}",
                "{\"keep\":  \"spacing\"}",
                "01234567-89ab-cdef-0123-456789abcdef",
                "\\x0001feff",
                "2024-01-01",
                "24:00:00",
                "2023-11-14 22:13:20.123456",
                "1969-12-31 23:59:59.999999+00",
            ],
        ),
        (
            2,
            vec![
                Value::Boolean(false),
                Value::Int16(i16::MIN),
                Value::Float32(f32::INFINITY),
                Value::Float64(f64::NAN),
                Value::Decimal("-0.00".into()),
                Value::Decimal("99999999.99".into()),
                Value::Text(String::new()),
                Value::Text("".into()),
                Value::Json("[]".into()),
                Value::Json("\"s\"".into()),
                Value::Uuid(uuid::Uuid::nil()),
                Value::Bytes(Vec::new()),
                Value::Date(-800_000),
                Value::Time(0),
                Value::Timestamp(-62_135_596_800_000_001),
                Value::TimestampTz(253_402_300_799_999_999),
            ],
            [
                "f",
                "-32768",
                "Infinity",
                "NaN",
                "-0.00",
                "99999999.99",
                "",
                "",
                "[]",
                "\"s\"",
                "00000000-0000-0000-0000-000000000000",
                "\\x",
                "0222-09-04 BC",
                "00:00:00",
                "0001-12-31 23:59:59.999999 BC",
                "9999-12-31 23:59:59.999999+00",
            ],
        ),
        (
            3,
            vec![
                Value::Null,
                Value::Null,
                Value::Float32(-0.0),
                Value::Float64(1e308),
                Value::Decimal("0.0001".into()),
                Value::Decimal(".5".into()),
                Value::Null,
                Value::Null,
                Value::Null,
                Value::Null,
                Value::Null,
                Value::Null,
                Value::Null,
                Value::Null,
                Value::Null,
                Value::Null,
            ],
            [
                "NULL", "NULL", "-0", "1e308", "0.0001", ".5", "NULL", "NULL", "NULL", "NULL", "NULL", "NULL", "NULL",
                "NULL", "NULL", "NULL",
            ],
        ),
        (
            4,
            vec![
                Value::Null,
                Value::Int16(0),
                Value::Null,
                Value::Null,
                Value::Decimal("100000000".into()),
                Value::Decimal("-0.005".into()),
                Value::Null,
                Value::Null,
                Value::Null,
                Value::Null,
                Value::Null,
                Value::Null,
                Value::Null,
                Value::Null,
                Value::Null,
                Value::Null,
            ],
            [
                "NULL",
                "0",
                "NULL",
                "NULL",
                "100000000",
                "-0.005",
                "NULL",
                "NULL",
                "NULL",
                "NULL",
                "NULL",
                "NULL",
                "NULL",
                "NULL",
                "NULL",
                "NULL",
            ],
        ),
    ];
    let types = [
        "boolean",
        "smallint",
        "real",
        "double precision",
        "numeric",
        "numeric(12,2)",
        "text",
        "varchar(12)",
        "jsonb",
        "json",
        "uuid",
        "bytea",
        "date",
        "time",
        "timestamp",
        "timestamptz",
    ];
    let events: Vec<ChangeEvent> = cases
        .iter()
        .map(|(id, rest, _)| {
            let mut values = vec![Value::Int64(*id)];
            values.extend(rest.iter().cloned());
            event(&s, Op::Read, None, Some(values), 1, *id as u64)
        })
        .collect();
    let mut sink = fx.sink();
    sink.apply(&batch("t", 0, events.clone())).await.expect("inserts (direct COPY)");
    check_cases(&fx, &s, &cases, &types, "direct").await;
    // The same rows as updates at later positions, and a delete: the staging path.
    let mut updates: Vec<ChangeEvent> = events
        .iter()
        .map(|e| {
            let mut u = e.clone();
            u.op = Op::Update;
            u.source.position.commit = 2;
            u
        })
        .collect();
    let mut gone = events[0].clone();
    gone.op = Op::Delete;
    gone.before = gone.after.take();
    gone.source.position.commit = 3;
    updates.push(gone);
    fx.exec(&format!("UPDATE {} SET t = 'changed', d2 = 0", fx.table())).await;
    sink.apply(&batch("t", 4, updates))
        .await
        .expect("updates and a delete (staging)");
    let ids: Vec<i64> = fx
        .admin
        .query(format!("SELECT id FROM {} ORDER BY id", fx.table()).as_str(), &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(ids, vec![2, 3, 4]);
    let left: Vec<Case> = cases.into_iter().filter(|c| c.0 != 1).collect();
    check_cases(&fx, &s, &left, &types, "staging").await;
    fx.cleanup().await;
}

/// (id, values after the id, the same values as PostgreSQL text literals)
type Case = (i64, Vec<Value>, [&'static str; 16]);

/// Each value of `cases` reads back as its literal does, cast to its type.
async fn check_cases(fx: &Fixture, s: &TableSchema, cases: &[Case], types: &[&str], stage: &str) {
    for (id, _, literals) in cases {
        for (n, (literal, ty)) in literals.iter().zip(types).enumerate() {
            let col = &s.columns[n + 1].name;
            let expected = if *literal == "NULL" {
                "NULL".to_string()
            } else {
                format!("{}::{ty}", quote_lit(literal))
            };
            let q = format!(
                "SELECT ({col})::text IS NOT DISTINCT FROM ({expected})::text, ({col})::text, ({expected})::text \
                 FROM {} WHERE id = {id}",
                fx.table()
            );
            let r = fx.admin.query_one(q.as_str(), &[]).await.expect(&q);
            let (same, got, want): (bool, Option<String>, Option<String>) = (r.get(0), r.get(1), r.get(2));
            assert!(same, "{stage}: row {id} column {col}: got {got:?}, want {want:?}");
        }
    }
}

fn quote_lit(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// Rows are rendered while the `COPY` runs: a value that cannot be
/// rendered after several chunks went out must abort the `COPY`, leave no
/// row behind, name its record and keep the session usable.
#[tokio::test]
async fn a_value_that_cannot_be_rendered_mid_copy_aborts_it_and_names_the_record() {
    let fx = Fixture::new("midcopy").await;
    let s = items();
    let mut sink = fx.sink();
    let bad = 15_000;
    let mut events: Vec<ChangeEvent> = (0..20_000)
        .map(|i| event(&s, Op::Read, None, Some(row(i, "a product name of some length", i, "19.99")), 7, 0))
        .collect();
    if let Some(after) = events[bad].after.as_mut() {
        after[1] = Value::Unchanged;
    }
    let err = sink.apply(&batch("t", 0, events.clone())).await.expect_err("must fail");
    assert_eq!(err.error.kind(), ErrorKind::Permanent, "{}", err.error);
    assert_eq!(err.record, Some(bad), "{}", err.error);
    assert_eq!(err.error.column(), Some("name"), "{}", err.error);
    assert!(fx.rows().await.is_empty(), "rows of an aborted COPY stayed");
    assert!(fx.offsets().await.is_empty(), "offsets moved after a failed apply");
    let mut b = batch("t", 0, events);
    b.records.remove(bad);
    sink.apply(&b).await.expect("the rest applies on the same sink");
    assert_eq!(fx.rows().await.len(), 19_999);
    assert_eq!(fx.offsets().await.get(&("t".into(), 0)), Some(&20_000));
    fx.cleanup().await;
}

#[tokio::test]
async fn a_snapshot_sized_batch_goes_through_copy_quickly() {
    let fx = Fixture::new("bulk").await;
    let s = items();
    let mut sink = fx.sink();
    let rows: i32 = 50_000;
    let events: Vec<ChangeEvent> = (0..rows)
        .map(|i| event(&s, Op::Read, None, Some(row(i, "some product name", i, "19.99")), 100, 0))
        .collect();
    let b = batch("t", 0, events);
    let started = Instant::now();
    sink.apply(&b).await.expect("bulk apply");
    let took = started.elapsed();
    let count: i64 = fx
        .admin
        .query_one(format!("SELECT count(*) FROM {}", fx.table()).as_str(), &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(count, i64::from(rows));
    eprintln!("{rows} rows in {took:?} ({:.0} rows/s)", f64::from(rows) / took.as_secs_f64());
    // Generous bound for a debug build on a small machine: the point is
    // that this is COPY, not row-at-a-time (which takes minutes).
    assert!(took < Duration::from_secs(30), "{took:?}");
    fx.cleanup().await;
}

// ---------------------------------------------------------------- end to end

mod e2e {
    use super::*;
    use std::process::{Child, Command, Stdio};

    use rdkafka::message::Message;

    use sink_runner::config::SinkRunnerConfig;
    use sink_runner::dead_letters as dlq;
    use tokio::sync::watch;
    use tributary_operations::admin::Control;
    use tributary_operations::telemetry::{TableState, Telemetry};

    use tributary_tests::header;
    use tributary_tests::kafka::EventTopic;

    /// A source side (topic, encoder, transactional producer) and a
    /// destination fixture for one test.
    pub struct Pipeline {
        pub fx: Fixture,
        events: EventTopic,
    }

    impl std::ops::Deref for Pipeline {
        type Target = EventTopic;
        fn deref(&self) -> &EventTopic {
            &self.events
        }
    }

    impl std::ops::DerefMut for Pipeline {
        fn deref_mut(&mut self) -> &mut EventTopic {
            &mut self.events
        }
    }

    impl Pipeline {
        pub async fn new(name: &str, partitions: i32) -> Self {
            let fx = Fixture::new(name).await;
            let events = EventTopic::new(name, partitions).await;
            Self { fx, events }
        }

        pub fn config_text(&self) -> String {
            let section = format!("[postgres]\nurl = \"{}\"\nschema = \"{}\"\n", url(), self.fx.schema);
            self.events.sink_runner_config(&self.fx.group, &section)
        }

        pub fn config(&self) -> SinkRunnerConfig {
            tributary_operations::config::parse(&self.config_text(), "test").expect("runner config")
        }
    }

    /// Polls `check` until it holds or the deadline passes.
    pub async fn wait_for<F, Fut>(what: &str, deadline: Duration, mut check: F)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let until = Instant::now() + deadline;
        loop {
            if check().await {
                return;
            }
            assert!(Instant::now() < until, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// A table-reset record the destination refuses (it rewrites every
    /// row's position, and a row breaks a CHECK added later, NOT VALID) is
    /// not dead-lettered: the table waits for an operator, says why, and
    /// goes on by itself once the cause is gone (the reset applied, then the
    /// changes after it). Dead-lettered, it was lost, and `replay` applied it
    /// later, forgetting the positions of newer rows (the fault suite's
    /// replay-dead-letter brought deleted rows back that way).
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_refused_table_reset_waits_for_an_operator() {
        let mut p = Pipeline::new("resetrefused", 1).await;
        let s = items();
        let snapshot: Vec<ChangeEvent> = (1..=3)
            .map(|i| event(&s, Op::Read, None, Some(row(i, &format!("n{i}"), i, "1.00")), 10, 0))
            .collect();
        p.produce(&snapshot).await;
        let config = p.config();
        let status = Telemetry::new("test", "sink");
        let (stop_tx, stop_rx) = watch::channel(false);
        let runner = tokio::spawn(sink_runner::run(config.clone(), status.clone(), Control::new(), stop_rx));
        let fx = &p.fx;
        wait_for("the rows", Duration::from_secs(90), || async { fx.rows().await.len() == 3 }).await;
        // Rows 2 and 3 break a rule added later.
        p.fx.exec(&format!("ALTER TABLE \"{}\".items ADD CONSTRAINT no_big CHECK (qty < 2) NOT VALID", p.fx.schema))
            .await;
        p.produce_control(
            0,
            &[
                ("tributary.control", "table-reset"),
                ("tributary.reset", "7"),
                ("tributary.source.schema", &s.id.schema),
                ("tributary.source.table", &s.id.table),
            ],
        );
        p.produce(&[event(&s, Op::Update, None, Some(row(1, "after", 1, "1.00")), 11, 0)])
            .await;
        let label = format!("{}.items", p.fx.schema);
        let reason = |status: &Telemetry| {
            let json = serde_json::to_value(status.status()).expect("status");
            json["tables"][&label]["reason"].as_str().map(str::to_string)
        };
        wait_for("the table paused for an operator", Duration::from_secs(60), || async {
            reason(&status).is_some_and(|r| r.contains("control record") && r.contains("no_big"))
        })
        .await;
        assert_eq!(status.failed_records(&label), 0, "nothing dead-lettered");
        p.fx.exec(&format!("ALTER TABLE \"{}\".items DROP CONSTRAINT no_big", p.fx.schema))
            .await;
        let fx = &p.fx;
        wait_for("the reset and the update after it", Duration::from_secs(60), || async {
            fx.rows().await.contains(&"1|after|1|1.00".to_string())
        })
        .await;
        assert_eq!(status.failed_records(&label), 0, "nothing dead-lettered");
        stop_tx.send(true).expect("stop");
        runner.await.expect("runner task").expect("runner");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn runner_copies_dead_letters_and_replays() {
        tributary_operations::logging::init(tributary_operations::logging::LogFormat::Text);
        let mut p = Pipeline::new("dlq", 2).await;
        let s = items();
        // The destination has a rule the source does not: qty < 1000.
        p.fx.exec(&format!(
            "CREATE SCHEMA \"{s}\"; CREATE TABLE \"{s}\".items (id integer PRIMARY KEY, name varchar(40), \
             qty integer CHECK (qty < 1000), price numeric(10,2), __tributary_commit bigint NOT NULL, \
             __tributary_index bigint NOT NULL)",
            s = p.fx.schema
        ))
        .await;
        let snapshot: Vec<ChangeEvent> = (1..=200)
            .map(|i| event(&s, Op::Read, None, Some(row(i, &format!("n{i}"), i, "1.00")), 10, 0))
            .collect();
        p.produce(&snapshot).await;
        let mut changes = vec![
            event(&s, Op::Update, None, Some(row(1, "one", 1, "1.00")), 11, 0),
            event(&s, Op::Delete, Some(key_row(2)), None, 11, 1),
            event(&s, Op::Update, None, Some(row(3, "bad", 5000, "1.00")), 12, 0),
        ];
        changes.push(event(&s, Op::Create, None, Some(row(300, "new", 3, "3.00")), 13, 0));
        p.produce(&changes).await;
        // Bytes no decoder can read.
        p.produce_raw(Some(b"not avro"), Some(b"definitely not avro"));

        let config = p.config();
        let status = Telemetry::new("test", "sink");
        let (stop_tx, stop_rx) = watch::channel(false);
        let runner = tokio::spawn(sink_runner::run(config.clone(), status.clone(), Control::new(), stop_rx));

        let label = format!("{}.items", p.fx.schema);
        let fx = &p.fx;
        wait_for("rows and two dead letters", Duration::from_secs(90), || async {
            let rows = fx.rows().await;
            rows.len() == 200 && status.failed_records(&label) == 2
        })
        .await;
        let rows = p.fx.rows().await;
        assert!(rows.contains(&"1|one|1|1.00".to_string()));
        assert!(rows.contains(&"3|n3|3|1.00".to_string()), "the refused update left the row as it was");
        assert!(rows.contains(&"300|new|3|3.00".to_string()));
        assert!(!rows.iter().any(|r| r.starts_with("2|")));
        // Offsets cover everything, dead letters included.
        let end = p.end_offsets();
        let fx = &p.fx;
        wait_for("offsets at the end", Duration::from_secs(30), || async {
            let stored = fx.offsets().await;
            end.iter().all(|(k, v)| {
                // Transaction markers take an offset after the last record.
                stored.get(k).is_some_and(|s| *s >= v - 1)
            })
        })
        .await;

        let dead = p.read_topic(&format!("{}.dlq", p.topic), 2, Duration::from_secs(30));
        assert_eq!(dead.len(), 2, "two dead letters");
        let apply = dead
            .iter()
            .find(|m| header(m, dlq::HEADER_STAGE).as_deref() == Some("TASK_PUT"))
            .expect("apply failure");
        let decode = dead
            .iter()
            .find(|m| header(m, dlq::HEADER_STAGE).as_deref() == Some("VALUE_CONVERTER"))
            .expect("decode failure");
        assert_eq!(header(apply, dlq::HEADER_TOPIC).as_deref(), Some(p.topic.as_str()));
        assert!(header(apply, dlq::HEADER_PARTITION).is_some());
        assert!(header(apply, dlq::HEADER_OFFSET).is_some());
        assert_eq!(header(apply, dlq::HEADER_CLASS).as_deref(), Some("postgres.sqlstate.23514"));
        assert_eq!(header(apply, dlq::HEADER_TABLE).as_deref(), Some("public.items"));
        assert!(header(apply, dlq::HEADER_MESSAGE).is_some_and(|m| !m.contains("5000")), "row value leaked");
        assert!(header(apply, dlq::HEADER_REASON).is_some_and(|r| r.starts_with("permanent")));
        assert_eq!(decode.payload(), Some(&b"definitely not avro"[..]));
        assert_eq!(decode.key(), Some(&b"not avro"[..]));
        let encoded = p.encode(&changes[2]);
        assert_eq!(apply.payload(), encoded.value.as_deref(), "the original value bytes");
        assert_eq!(apply.key(), encoded.key.as_deref(), "the original key bytes");

        // Other changes keep flowing while the runner runs.
        p.produce(&[event(&s, Op::Create, None, Some(row(301, "more", 1, "1.00")), 14, 0)])
            .await;
        let fx = &p.fx;
        wait_for("a later row", Duration::from_secs(30), || async { fx.rows().await.len() == 201 }).await;

        stop_tx.send(true).expect("stop");
        runner.await.expect("join").expect("runner result");

        // The operator fixes the cause; replay lands the record, and what
        // still fails (the garbage) stays reported.
        let dlq_topic = format!("{}.dlq", p.topic);
        let dry = sink_runner::commands::replay::replay(&config, &dlq_topic, true)
            .await
            .expect("dry run");
        assert_eq!((dry.applied, dry.failing.len()), (0, 2), "still refused before the fix");
        p.fx.exec(&format!("ALTER TABLE {} DROP CONSTRAINT items_qty_check", p.fx.table()))
            .await;
        let report = sink_runner::commands::replay::replay(&config, &dlq_topic, false)
            .await
            .expect("replay");
        assert_eq!(report.read, 2);
        assert_eq!(report.applied, 1);
        assert_eq!(report.failing.len(), 1, "the undecodable record still fails");
        assert!(p.fx.rows().await.contains(&"3|bad|5000|1.00".to_string()));
        // Replaying again changes nothing.
        let versions = p.fx.versions().await;
        sink_runner::commands::replay::replay(&config, &dlq_topic, false)
            .await
            .expect("replay again");
        assert_eq!(p.fx.versions().await, versions);
        // A control record an older runner dead-lettered (a copy's sweep,
        // which would remove every row older than it): never replayed.
        let topic = p.topic.clone();
        p.produce_control_to(
            &dlq_topic,
            0,
            &[
                ("tributary.control", "table-copied"),
                ("tributary.position", "9223372036854775806:0"),
                ("tributary.source.schema", &s.id.schema),
                ("tributary.source.table", &s.id.table),
                (dlq::HEADER_TOPIC, &topic),
                (dlq::HEADER_PARTITION, "0"),
                (dlq::HEADER_OFFSET, "999999"),
            ],
        );
        let report = sink_runner::commands::replay::replay(&config, &dlq_topic, false)
            .await
            .expect("replay");
        assert_eq!((report.read, report.control, report.applied), (3, 1, 1), "the control record is not applied");
        assert_eq!(p.fx.versions().await, versions, "no row removed");
        p.fx.cleanup().await;
    }

    /// A pipeline whose destination table refuses `qty >= 1000`, and on its
    /// topic a good row (offset 0) and a row the table refuses (offset 1).
    async fn a_good_and_a_bad_row(name: &str) -> (Pipeline, Arc<TableSchema>) {
        let mut p = Pipeline::new(name, 1).await;
        let s = items();
        p.fx.exec(&format!(
            "CREATE SCHEMA \"{s}\"; CREATE TABLE \"{s}\".items (id integer PRIMARY KEY, name varchar(40), \
             qty integer CHECK (qty < 1000), price numeric(10,2), __tributary_commit bigint NOT NULL, \
             __tributary_index bigint NOT NULL)",
            s = p.fx.schema
        ))
        .await;
        p.produce(&[
            event(&s, Op::Create, None, Some(row(1, "ok", 1, "1.00")), 10, 0),
            event(&s, Op::Create, None, Some(row(2, "bad", 5000, "1.00")), 10, 1),
        ])
        .await;
        (p, s)
    }

    /// A sink that crashed after sending a dead letter and before storing
    /// its offsets does not send it again after its restart (simulated: the
    /// second run starts from the offsets the first run had before that
    /// batch). A copy of the dead letter made by other means (a runner
    /// before the fence below, a tool) is applied once by the replay.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_record_dead_lettered_twice_is_replayed_once() {
        let (p, _) = a_good_and_a_bad_row("dlqtwice").await;
        let config = p.config();
        let label = format!("{}.items", p.fx.schema);
        let end = p.end_offsets();
        for run in 1..=2 {
            if run == 2 {
                // The crash: the dead letter was sent, the offsets not stored.
                p.fx.exec(&format!("DELETE FROM tributary.offsets WHERE consumer_group = '{}'", p.fx.group))
                    .await;
            }
            let status = Telemetry::new("test", "sink");
            let (stop_tx, stop_rx) = watch::channel(false);
            let runner = tokio::spawn(sink_runner::run(config.clone(), status.clone(), Control::new(), stop_rx));
            let fx = &p.fx;
            wait_for("the good row, the dead letter and the offsets", Duration::from_secs(90), || async {
                let stored = fx.offsets().await;
                fx.rows().await.len() == 1
                    && status.failed_records(&label) == if run == 1 { 1 } else { 0 }
                    && end.iter().all(|(k, v)| stored.get(k).is_some_and(|s| *s >= v - 1))
            })
            .await;
            stop_tx.send(true).expect("stop");
            runner.await.expect("join").expect("runner result");
        }
        let dlq_topic = format!("{}.dlq", p.topic);
        let dead = p.read_topic(&dlq_topic, 2, Duration::from_secs(10));
        assert_eq!(dead.len(), 1, "the restarted sink did not send the dead letter again");
        // A copy made outside the fence.
        {
            use rdkafka::message::Headers;
            let producer: rdkafka::producer::FutureProducer = rdkafka::ClientConfig::new()
                .set("bootstrap.servers", tributary_tests::kafka_bootstrap())
                .create()
                .expect("producer");
            let mut headers = rdkafka::message::OwnedHeaders::new();
            for h in dead[0].headers().expect("headers").iter() {
                headers = headers.insert(h);
            }
            let mut record = rdkafka::producer::FutureRecord::<[u8], [u8]>::to(&dlq_topic).headers(headers);
            if let Some(k) = dead[0].key() {
                record = record.key(k);
            }
            if let Some(v) = dead[0].payload() {
                record = record.payload(v);
            }
            producer
                .send(record, Duration::from_secs(30))
                .await
                .expect("repeat the dead letter");
        }

        p.fx.exec(&format!("ALTER TABLE {} DROP CONSTRAINT items_qty_check", p.fx.table()))
            .await;
        let versions = p.fx.versions().await;
        let report = sink_runner::commands::replay::replay(&config, &dlq_topic, false)
            .await
            .expect("replay");
        assert_eq!(
            (report.read, report.applied, report.duplicates, report.failing.len()),
            (2, 1, 1, 0),
            "the origin applied once, the second dead letter a duplicate"
        );
        assert!(p.fx.rows().await.contains(&"2|bad|5000|1.00".to_string()));
        assert_eq!(p.fx.versions().await.len(), versions.len() + 1, "one row more, written once");
        p.fx.cleanup().await;
    }

    /// Issue #23, case 8: a member frozen past its session wakes up and
    /// dead-letters a record the partition's new owner has dead-lettered
    /// already: its send is fenced, and the record is in the dead-letter
    /// topic once. A zombie that claims the partition again fences the
    /// owner in turn; the owner's next dead letter still lands, once.
    /// (Before the fence, the frozen member's send went through: the
    /// replay test above had to de-duplicate it.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_frozen_member_cannot_dead_letter_what_the_new_owner_sent() {
        use sink_runner::buffer::RawRecord;
        use sink_runner::dead_letters::{DeadLetters, Failure, Stage};
        let (mut p, s) = a_good_and_a_bad_row("dlqfence").await;
        let config = p.config();
        let dlq_topic = format!("{}.dlq", p.topic);
        // The member that owned the partition before it froze.
        let base = config.kafka.client_config().expect("kafka config");
        let mut zombie = DeadLetters::new(&base, &config.consumer_group);
        zombie.claim(&p.topic, 0).await.expect("the earlier owner's claim");

        let label = format!("{}.items", p.fx.schema);
        let status = Telemetry::new("test", "sink");
        let (stop_tx, stop_rx) = watch::channel(false);
        let runner = tokio::spawn(sink_runner::run(config.clone(), status.clone(), Control::new(), stop_rx));
        let fx = &p.fx;
        wait_for("the good row and the dead letter", Duration::from_secs(90), || async {
            fx.rows().await.len() == 1 && status.failed_records(&label) == 1
        })
        .await;

        // The frozen member wakes up and sends the same dead letter.
        let source = p.read_topic(&p.topic, 2, Duration::from_secs(10));
        let bad = source.iter().find(|m| m.offset() == 1).expect("the bad record");
        let raw = RawRecord::from_message(bad);
        let failure = Failure::from_error(
            Stage::Apply,
            &tributary_connectors::Error::permanent("check constraint"),
            Some(label.clone()),
        );
        let fenced = zombie.send(&dlq_topic, &raw, &failure).await;
        assert!(fenced.is_err(), "the frozen member's dead letter went through");
        let dead = p.read_topic(&dlq_topic, 2, Duration::from_secs(10));
        assert_eq!(dead.len(), 1, "the record is in the dead-letter topic once");

        // The zombie claims again (fencing the owner) and, as a runner
        // would, finds the record there and sends nothing. The owner's
        // next dead letter fails once, then is claimed, read and sent.
        zombie.claim(&p.topic, 0).await.expect("the zombie's second claim");
        p.produce(&[event(&s, Op::Create, None, Some(row(3, "bad", 6000, "1.00")), 11, 0)])
            .await;
        wait_for("the second dead letter", Duration::from_secs(90), || async { status.failed_records(&label) == 2 })
            .await;
        let dead = p.read_topic(&dlq_topic, 3, Duration::from_secs(10));
        let origins: Vec<i64> = dead
            .iter()
            .map(|m| {
                sink_runner::dead_letters::origin(&RawRecord::from_message(m))
                    .expect("origin headers")
                    .offset
            })
            .collect();
        let third = p.read_topic(&p.topic, 3, Duration::from_secs(10));
        assert_eq!(third.len(), 3);
        assert_eq!(origins, vec![1, third[2].offset()], "each bad record dead-lettered once");
        // The zombie's claim is gone too: the owner's retry fenced it.
        assert!(zombie.send(&dlq_topic, &raw, &failure).await.is_err());
        assert_eq!(p.read_topic(&dlq_topic, 3, Duration::from_secs(5)).len(), 2);
        stop_tx.send(true).expect("stop");
        runner.await.expect("join").expect("runner result");
        p.fx.cleanup().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn an_operator_pause_holds_a_table_and_resume_catches_up() {
        let mut p = Pipeline::new("oppause", 1).await;
        let s = items();
        p.produce(&[event(&s, Op::Create, None, Some(row(1, "a", 1, "1.00")), 1, 0)])
            .await;
        let config = p.config();
        let status = Telemetry::new("test", "sink");
        let control = Control::new();
        let (stop_tx, stop_rx) = watch::channel(false);
        assert!(!control.is_ready(), "not ready before it starts");
        let runner = tokio::spawn(sink_runner::run(config, status.clone(), control.clone(), stop_rx));
        let fx = &p.fx;
        wait_for("the first row", Duration::from_secs(60), || async { fx.rows().await.len() == 1 }).await;
        // Ready once a settled member of its group (librdkafka's statistics
        // come every 5 s).
        wait_for("ready", Duration::from_secs(30), || async { control.is_ready() }).await;

        let label = format!("{}.items", p.fx.schema);
        control.pause(Some(&label));
        wait_for("paused by the operator", Duration::from_secs(30), || async {
            matches!(status.table(&label).map(|t| t.state), Some(TableState::Paused(r)) if r.contains("operator"))
        })
        .await;
        let offsets = p.fx.offsets().await;
        p.produce(&[event(&s, Op::Create, None, Some(row(2, "b", 2, "2.00")), 2, 0)])
            .await;
        // A bounded observation, not a sleep for synchronisation: for three
        // batch lingers nothing may be applied and no offset may move.
        let until = std::time::Instant::now() + Duration::from_secs(3);
        while std::time::Instant::now() < until {
            assert_eq!(p.fx.rows().await.len(), 1, "a paused table applied a record");
            assert_eq!(p.fx.offsets().await, offsets, "a paused table moved its offsets");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }

        control.resume(Some(&label));
        let fx = &p.fx;
        wait_for("resumed with the held record", Duration::from_secs(60), || async {
            fx.rows().await.len() == 2 && matches!(status.table(&label).map(|t| t.state), Some(TableState::Streaming))
        })
        .await;
        assert!(p.fx.offsets().await.values().sum::<i64>() > offsets.values().sum::<i64>());
        stop_tx.send(true).expect("stop");
        runner.await.expect("join").expect("runner");
        p.fx.cleanup().await;
    }

    /// `e`, committed at the source now (the lag counts from it).
    fn fresh(mut e: ChangeEvent) -> ChangeEvent {
        e.source.ts_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        e
    }

    /// Issue #30: the lag tells the truth while the destination is stuck.
    /// A lock held on the destination table for 30 s stalls the apply; the
    /// lag in `/status` and `/metrics` grows past 25 s although nothing is
    /// applied, and falls back once the lock goes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn the_lag_grows_while_the_destination_is_stalled_and_recovers() {
        let mut p = Pipeline::new("lagstall", 1).await;
        let s = items();
        p.produce(&[fresh(event(&s, Op::Create, None, Some(row(1, "a", 1, "1.00")), 1, 0))])
            .await;
        let status = Telemetry::new("lagstall", "sink");
        let (stop_tx, stop_rx) = watch::channel(false);
        let runner = tokio::spawn(sink_runner::run(p.config(), status.clone(), Control::new(), stop_rx));
        wait_for("the first row", Duration::from_secs(60), || async { p.fx.rows().await.len() == 1 }).await;
        let label = format!("{}.items", p.fx.schema);
        let lag = || status.table(&label).and_then(|t| t.lag_seconds).unwrap_or(-1.0);
        let gauge = || {
            let text = status.metrics_text();
            let line = text
                .lines()
                .find(|l| l.starts_with("tributary_lag_seconds{") && l.contains(&format!("table=\"{label}\"")))
                .map(str::to_string);
            line.and_then(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
                .unwrap_or(-1.0)
        };
        wait_for("the first row in the status, caught up", Duration::from_secs(10), || async {
            (0.0..5.0).contains(&lag()) && (0.0..5.0).contains(&gauge())
        })
        .await;

        // The stall: another session holds the table; the sink's write waits.
        let locker = connect(&url()).await;
        locker
            .batch_execute(&format!("BEGIN; LOCK TABLE {} IN ACCESS EXCLUSIVE MODE", p.fx.table()))
            .await
            .expect("lock");
        p.produce(&[fresh(event(&s, Op::Create, None, Some(row(2, "b", 2, "2.00")), 2, 0))])
            .await;
        let stalled = Instant::now();
        wait_for("a lag past 25 s, in /status and /metrics", Duration::from_secs(60), || async {
            lag() > 25.0 && gauge() > 25.0
        })
        .await;
        assert!(stalled.elapsed() >= Duration::from_secs(24), "the lag ran ahead of the clock");
        // Kafka's view agrees: the record is not committed (statistics
        // come every 5 s).
        wait_for("a consumer lag of the held record", Duration::from_secs(15), || async {
            status
                .table(&label)
                .and_then(|t| t.consumer_lag_records)
                .is_some_and(|l| l >= 1)
                && status.metrics_text().contains("tributary_consumer_lag_records{")
        })
        .await;
        locker.batch_execute("ROLLBACK").await.expect("unlock");
        let fx = &p.fx;
        wait_for("the held row, and the lag back under 5 s", Duration::from_secs(60), || async {
            fx.rows().await.len() == 2 && lag() < 5.0 && gauge() < 5.0
        })
        .await;
        // Caught up: nothing but, at most, the last transaction's commit
        // marker after the committed offset.
        wait_for("the consumer lag back to at most 1", Duration::from_secs(15), || async {
            status
                .table(&label)
                .and_then(|t| t.consumer_lag_records)
                .is_some_and(|l| l <= 1)
        })
        .await;
        stop_tx.send(true).expect("stop");
        runner.await.expect("join").expect("runner");
        p.fx.cleanup().await;
    }

    /// Issue #30: the console page, in headless Chromium, over a live copy:
    /// its numbers are `/status`'s, a peer runner's tables show beside this
    /// runner's, and its pause and resume buttons (clicked with the mouse)
    /// hold and release the table. The screenshot is kept in
    /// `target/test-artifacts/console.png`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn the_console_page_shows_the_status_and_its_buttons_pause_and_resume() {
        use tributary_operations::admin::{serve, AdminConfig};
        use tributary_tests::browser::Browser;
        let mut p = Pipeline::new("console", 1).await;
        let s = items();
        for i in 1..=3 {
            p.produce(&[fresh(event(
                &s,
                Op::Create,
                None,
                Some(row(i, "a", i, "1.00")),
                i as u64,
                0,
            ))])
            .await;
        }
        let status = Telemetry::new("console", "sink");
        let control = Control::new();
        // A peer: another runner's admin server, shown read-only.
        let peer = Telemetry::new("peer-source", "source");
        peer.record_snapshot("shop.orders", 400, Some(1000));
        peer.set_state("shop.orders", TableState::Snapshotting);
        let local = |peers: Vec<String>| AdminConfig {
            listen: "127.0.0.1:0".into(),
            peers,
            ..AdminConfig::default()
        };
        let peer_addr = serve(&local(vec![]), peer.clone(), Control::new())
            .await
            .expect("peer")
            .expect("on");
        let peer_url = format!("http://{peer_addr}");
        let addr = serve(&local(vec![peer_url.clone()]), status.clone(), control.clone())
            .await
            .expect("admin")
            .expect("on");
        let (stop_tx, stop_rx) = watch::channel(false);
        let runner = tokio::spawn(sink_runner::run(p.config(), status.clone(), control.clone(), stop_rx));
        let label = format!("{}.items", p.fx.schema);
        wait_for("three rows applied", Duration::from_secs(60), || async {
            p.fx.rows().await.len() == 3 && status.table(&label).is_some_and(|t| t.events == 3)
        })
        .await;

        let mut page = Browser::start(1280, 720).await;
        page.navigate(&format!("http://{addr}/")).await;
        let tr = format!("document.querySelector('tr[data-table=\"{label}\"]')");
        page.wait_for("the table's row, streaming, 3 events", Duration::from_secs(30), &format!(
            "{tr}.querySelector('.badge').textContent === 'streaming' && {tr}.querySelector('.events').dataset.value === '3'"
        ))
        .await;
        // The page's numbers are /status's.
        let shown = page
            .eval(&format!(
                "[{tr}.querySelector('.events').dataset.value, {tr}.querySelector('.lag').dataset.value, \
                 {tr}.querySelector('.failed').dataset.value, document.querySelector('#title').textContent]"
            ))
            .await;
        let t = status.table(&label).expect("status");
        assert_eq!(shown[0], t.events.to_string());
        assert_eq!(shown[2], t.failed_records.to_string());
        assert_eq!(shown[3], "sink runner console");
        let lag: f64 = shown[1].as_str().and_then(|v| v.parse().ok()).expect("a lag on the page");
        assert!((lag - t.lag_seconds.unwrap_or(-10.0)).abs() < 3.0, "page {lag} vs status {:?}", t.lag_seconds);
        // The peer's table, with its copy's progress.
        page.wait_for(
            "the peer's table",
            Duration::from_secs(10),
            "document.querySelector('table.peer tr[data-table=\"shop.orders\"] .progress').textContent.includes('400 / ~1,000')",
        )
        .await;
        let artifact = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/test-artifacts/console.png");
        page.screenshot(&artifact).await;
        eprintln!("console screenshot: {}", artifact.display());

        // Pause with the mouse: the runner holds the table.
        page.click(&format!("tr[data-table=\"{label}\"] button.pause")).await;
        wait_for("paused by the button", Duration::from_secs(30), || async {
            matches!(status.table(&label).map(|t| t.state), Some(TableState::Paused(r)) if r.contains("operator"))
        })
        .await;
        p.produce(&[fresh(event(&s, Op::Create, None, Some(row(4, "d", 4, "4.00")), 4, 0))])
            .await;
        page.wait_for(
            "the page showing the pause",
            Duration::from_secs(10),
            &format!("{tr}.querySelector('.badge').textContent === 'paused' && !!{tr}.querySelector('button.resume')"),
        )
        .await;
        assert_eq!(p.fx.rows().await.len(), 3, "a paused table applied a row");
        page.click(&format!("tr[data-table=\"{label}\"] button.resume")).await;
        let fx = &p.fx;
        wait_for("resumed by the button, the held row applied", Duration::from_secs(60), || async {
            fx.rows().await.len() == 4 && matches!(status.table(&label).map(|t| t.state), Some(TableState::Streaming))
        })
        .await;
        page.wait_for(
            "the page showing it streaming",
            Duration::from_secs(10),
            &format!("{tr}.querySelector('.badge').textContent === 'streaming'"),
        )
        .await;
        drop(page);
        stop_tx.send(true).expect("stop");
        runner.await.expect("join").expect("runner");
        p.fx.cleanup().await;
    }

    /// Issue #30: a table paused at a sink runner stays paused across
    /// `kill -9` (the pause is stored in Kafka), and resumes when asked.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_table_paused_at_the_sink_stays_paused_across_kill_9() {
        let mut p = Pipeline::new("durpause", 1).await;
        let s = items();
        p.produce(&[event(&s, Op::Create, None, Some(row(1, "a", 1, "1.00")), 1, 0)])
            .await;
        let port = tributary_tests::free_port();
        let dir = std::env::temp_dir().join(unique("durpause"));
        std::fs::create_dir_all(&dir).expect("dir");
        let config = dir.join("sink.toml");
        let listen = format!("listen = \"127.0.0.1:{port}\"");
        std::fs::write(&config, p.config_text().replace("listen = \"off\"", &listen)).expect("config");
        let log = dir.join("sink.log");
        let runner = tributary_tests::Runner::start("sink-runner", &config, &log);
        let fx = &p.fx;
        wait_for("the first row", Duration::from_secs(60), || async { fx.rows().await.len() == 1 }).await;
        let label = format!("{}.items", p.fx.schema);
        let base = format!("http://127.0.0.1:{port}");
        let state = || async {
            let body = reqwest::get(format!("{base}/status")).await.ok()?.text().await.ok()?;
            let v: serde_json::Value = serde_json::from_str(&body).ok()?;
            v["tables"][&label]["state"].as_str().map(str::to_string)
        };
        let client = reqwest::Client::new();
        let paused = client.post(format!("{base}/pause?table={label}")).send().await.expect("pause");
        assert!(paused.status().is_success(), "{:?}", paused.text().await);
        runner.kill9();
        p.produce(&[event(&s, Op::Create, None, Some(row(2, "b", 2, "2.00")), 2, 0)])
            .await;
        let runner = tributary_tests::Runner::start("sink-runner", &config, &log);
        wait_for("paused again after kill -9", Duration::from_secs(60), || async {
            state().await.as_deref() == Some("paused")
        })
        .await;
        let until = Instant::now() + Duration::from_secs(3);
        while Instant::now() < until {
            assert_eq!(p.fx.rows().await.len(), 1, "a table paused before the restart applied a row");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let resumed = client
            .post(format!("{base}/resume?table={label}"))
            .send()
            .await
            .expect("resume");
        assert!(resumed.status().is_success());
        let fx = &p.fx;
        wait_for("the held row after resume", Duration::from_secs(60), || async { fx.rows().await.len() == 2 }).await;
        // Paused when the copy is deleted: the stored pause goes with it,
        // so a copy made again under this consumer group starts unpaused.
        let paused = client.post(format!("{base}/pause?table={label}")).send().await.expect("pause");
        assert!(paused.status().is_success(), "{:?}", paused.text().await);
        let mut runner = runner;
        std::process::Command::new("kill")
            .args(["-TERM", &runner.pid().to_string()])
            .status()
            .expect("kill -TERM");
        let until = Instant::now() + Duration::from_secs(60);
        while runner.exited().is_none() {
            assert!(Instant::now() < until, "the runner did not stop on SIGTERM");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let out = std::process::Command::new(tributary_tests::runner_binary("sink-runner"))
            .arg("--config")
            .arg(&config)
            .args(["delete", "--yes"])
            .output()
            .expect("delete");
        assert!(out.status.success(), "delete failed: {}", String::from_utf8_lossy(&out.stderr));
        let mut kafka = rdkafka::ClientConfig::new();
        kafka.set("bootstrap.servers", tributary_tests::kafka_bootstrap());
        let stored = tributary_operations::pauses::PauseStore::of_sink(kafka, &p.config().consumer_group)
            .load()
            .await
            .expect("the stored pauses");
        assert_eq!(
            stored,
            tributary_operations::admin::PauseSet::default(),
            "the deleted copy's pause is still stored"
        );
        p.fx.cleanup().await;
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Issue #23: a stored offset the topic no longer holds (its records
    /// were deleted, as retention does) stops the partition with a
    /// needs-operator error naming topic, partition, offset and range;
    /// nothing is skipped. After the operator's fix (the hint's first
    /// choice) the partition goes on by itself.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_stored_offset_out_of_range_stops_the_partition_for_an_operator() {
        use rdkafka::admin::{AdminClient, AdminOptions};
        use rdkafka::client::DefaultClientContext;
        use rdkafka::{ClientConfig, Offset, TopicPartitionList};

        tributary_operations::logging::init(tributary_operations::logging::LogFormat::Text);
        let mut p = Pipeline::new("oorange", 1).await;
        let s = items();
        p.produce(&[event(&s, Op::Create, None, Some(row(1, "a", 1, "1.00")), 1, 0)])
            .await;
        let config = p.config();
        let label = format!("{}.items", p.fx.schema);
        let status = Telemetry::new("test", "sink");
        let (stop_tx, stop_rx) = watch::channel(false);
        let runner = tokio::spawn(sink_runner::run(config.clone(), status.clone(), Control::new(), stop_rx));
        let fx = &p.fx;
        wait_for("the first row", Duration::from_secs(60), || async { fx.rows().await.len() == 1 }).await;
        stop_tx.send(true).expect("stop");
        runner.await.expect("join").expect("runner");
        let stored = p.fx.offsets().await[&(p.topic.clone(), 0)];

        // While the sink is down, two more changes are written and then
        // removed from the topic before the sink read them.
        p.produce(&[event(&s, Op::Create, None, Some(row(2, "b", 2, "2.00")), 2, 0)])
            .await;
        p.produce(&[event(&s, Op::Create, None, Some(row(3, "c", 3, "3.00")), 3, 0)])
            .await;
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", tributary_tests::kafka_bootstrap())
            .create()
            .expect("admin");
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&p.topic, 0, Offset::End).expect("tpl");
        admin.delete_records(&tpl, &AdminOptions::new()).await.expect("delete records");
        let low = p.end_offsets()[&(p.topic.clone(), 0)];
        assert!(low > stored, "records after the stored offset were deleted");

        let status = Telemetry::new("test", "sink");
        let (stop_tx, stop_rx) = watch::channel(false);
        let runner = tokio::spawn(sink_runner::run(config.clone(), status.clone(), Control::new(), stop_rx));
        wait_for("the partition stopped out of range", Duration::from_secs(60), || async {
            matches!(status.table(&label).map(|t| t.state), Some(TableState::Paused(r)) if r.contains("out of the topic's current range"))
        })
        .await;
        let last = status.table(&label).and_then(|t| t.last_error).expect("an error is recorded");
        assert_eq!(last.kind, "needs-operator");
        for part in [
            format!("topic {} partition 0", p.topic),
            format!("stored offset {stored} "),
            format!("range {low}..{low}"),
            format!("UPDATE tributary.offsets SET next_offset = {low} WHERE"),
            "DELETE FROM tributary.offsets WHERE".to_string(),
        ] {
            assert!(last.message.contains(&part), "{part:?} not in {}", last.message);
        }
        // A change written now is not applied either: the partition stays
        // stopped, nothing skipped, the stored offset unchanged.
        p.produce(&[event(&s, Op::Create, None, Some(row(4, "d", 4, "4.00")), 4, 0)])
            .await;
        let until = Instant::now() + Duration::from_secs(3);
        while Instant::now() < until {
            assert_eq!(p.fx.rows().await.len(), 1, "a stopped partition applied a record");
            assert_eq!(p.fx.offsets().await[&(p.topic.clone(), 0)], stored, "the stored offset moved");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }

        // The operator accepts the loss (the hint's first choice).
        p.fx.exec(&format!(
            "UPDATE tributary.offsets SET next_offset = {low} WHERE consumer_group = '{}' AND topic = '{}' AND partition = 0",
            p.fx.group, p.topic
        ))
        .await;
        let fx = &p.fx;
        wait_for("resumed after the fix", Duration::from_secs(60), || async {
            fx.rows().await.len() == 2 && matches!(status.table(&label).map(|t| t.state), Some(TableState::Streaming))
        })
        .await;
        assert!(p.fx.rows().await.iter().any(|r| r.starts_with("4|")));
        stop_tx.send(true).expect("stop");
        runner.await.expect("join").expect("runner");
        let _ = admin
            .delete_topics(&[p.topic.as_str(), format!("{}.dlq", p.topic).as_str()], &AdminOptions::new())
            .await;
        p.fx.cleanup().await;
    }

    /// Issue #23, while the sink runs: records removed from the topic
    /// before the sink fetched them (here while an operator paused the
    /// table) stop the partition when it fetches again; after the fix it
    /// goes on (librdkafka stopped fetching it: it is assigned again).
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn records_removed_while_running_stop_the_partition_for_an_operator() {
        use rdkafka::admin::{AdminClient, AdminOptions};
        use rdkafka::client::DefaultClientContext;
        use rdkafka::{ClientConfig, Offset, TopicPartitionList};

        let mut p = Pipeline::new("oorun", 1).await;
        let s = items();
        p.produce(&[event(&s, Op::Create, None, Some(row(1, "a", 1, "1.00")), 1, 0)])
            .await;
        let label = format!("{}.items", p.fx.schema);
        let status = Telemetry::new("test", "sink");
        let control = Control::new();
        let (stop_tx, stop_rx) = watch::channel(false);
        let runner = tokio::spawn(sink_runner::run(p.config(), status.clone(), control.clone(), stop_rx));
        let fx = &p.fx;
        wait_for("the first row", Duration::from_secs(60), || async { fx.rows().await.len() == 1 }).await;
        control.pause(Some(&label));
        wait_for("paused by the operator", Duration::from_secs(30), || async {
            matches!(status.table(&label).map(|t| t.state), Some(TableState::Paused(r)) if r.contains("operator"))
        })
        .await;
        let stored = p.fx.offsets().await[&(p.topic.clone(), 0)];
        p.produce(&[event(&s, Op::Create, None, Some(row(2, "b", 2, "2.00")), 2, 0)])
            .await;
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", tributary_tests::kafka_bootstrap())
            .create()
            .expect("admin");
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&p.topic, 0, Offset::End).expect("tpl");
        admin.delete_records(&tpl, &AdminOptions::new()).await.expect("delete records");
        let low = p.end_offsets()[&(p.topic.clone(), 0)];
        control.resume(Some(&label));
        wait_for("the partition stopped out of range", Duration::from_secs(60), || async {
            matches!(status.table(&label).map(|t| t.state), Some(TableState::Paused(r)) if r.contains("out of the topic's current range"))
        })
        .await;
        let last = status.table(&label).and_then(|t| t.last_error).expect("an error is recorded");
        assert_eq!(last.kind, "needs-operator");
        assert!(last.message.contains(&format!("stored offset {stored} ")), "{}", last.message);
        assert_eq!(p.fx.rows().await.len(), 1);

        p.fx.exec(&format!(
            "UPDATE tributary.offsets SET next_offset = {low} WHERE consumer_group = '{}' AND topic = '{}' AND partition = 0",
            p.fx.group, p.topic
        ))
        .await;
        p.produce(&[event(&s, Op::Create, None, Some(row(3, "c", 3, "3.00")), 3, 0)])
            .await;
        let fx = &p.fx;
        wait_for("resumed after the fix", Duration::from_secs(60), || async {
            fx.rows().await.len() == 2 && matches!(status.table(&label).map(|t| t.state), Some(TableState::Streaming))
        })
        .await;
        assert!(p.fx.rows().await.iter().any(|r| r.starts_with("3|")));
        stop_tx.send(true).expect("stop");
        runner.await.expect("join").expect("runner");
        let _ = admin
            .delete_topics(&[p.topic.as_str(), format!("{}.dlq", p.topic).as_str()], &AdminOptions::new())
            .await;
        p.fx.cleanup().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_blocked_destination_pauses_the_table_and_it_resumes_by_itself() {
        let mut p = Pipeline::new("pause", 1).await;
        let s = items();
        p.produce(&[event(&s, Op::Create, None, Some(row(1, "a", 1, "1.00")), 1, 0)])
            .await;
        let mut config = p.config();
        if let Some(pg) = config.destination.postgres.as_mut() {
            pg.lock_timeout_ms = 500;
        }
        let status = Telemetry::new("test", "sink");
        let (stop_tx, stop_rx) = watch::channel(false);
        let runner = tokio::spawn(sink_runner::run(config, status.clone(), Control::new(), stop_rx));
        let fx = &p.fx;
        wait_for("the first row", Duration::from_secs(60), || async { fx.rows().await.len() == 1 }).await;

        // An operator's transaction holds the table: writes time out.
        let blocker = connect(&url()).await;
        blocker
            .batch_execute(&format!("BEGIN; LOCK TABLE {} IN ACCESS EXCLUSIVE MODE", p.fx.table()))
            .await
            .expect("lock");
        p.produce(&[event(&s, Op::Create, None, Some(row(2, "b", 2, "2.00")), 2, 0)])
            .await;
        let label = format!("{}.items", p.fx.schema);
        wait_for("paused", Duration::from_secs(60), || async {
            matches!(status.table(&label).map(|t| t.state), Some(TableState::Paused(_)))
        })
        .await;
        let last = status.table(&label).and_then(|t| t.last_error).expect("an error is recorded");
        assert_eq!(last.kind, "retryable");
        assert!(last.message.contains("55P03"), "{}", last.message);
        let offsets = p.fx.offsets().await;

        blocker.batch_execute("ROLLBACK").await.expect("unlock");
        let fx = &p.fx;
        wait_for("resumed", Duration::from_secs(60), || async {
            fx.rows().await.len() == 2 && matches!(status.table(&label).map(|t| t.state), Some(TableState::Streaming))
        })
        .await;
        assert!(p.fx.offsets().await.values().sum::<i64>() > offsets.values().sum::<i64>());
        assert_eq!(status.failed_records(&label), 0, "nothing dead-lettered");
        stop_tx.send(true).expect("stop");
        runner.await.expect("join").expect("runner");
        p.fx.cleanup().await;
    }

    #[test]
    fn a_bad_config_file_is_refused_naming_the_field() {
        let bin = tributary_tests::runner_binary("sink-runner");
        let out = Command::new(&bin)
            .args(["--config", "/nonexistent/sink.toml"])
            .output()
            .expect("run");
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("cannot read config file /nonexistent/sink.toml"), "{err}");

        let dir = std::env::temp_dir().join(unique("tributary-cfg"));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("bad.toml");
        std::fs::write(
            &path,
            "prefix = \"p\"\nconsumer_group = \"g\"\nschema_registry_url = \"http://x\"\nbatch_linger_ms = 0\n\
             [kafka]\nbootstrap_servers = \"127.0.0.1:9092\"\n[postgres]\nurl = \"postgres://u@h/db\"\n",
        )
        .expect("write");
        let out = Command::new(&bin)
            .arg("check")
            .arg("--config")
            .arg(&path)
            .output()
            .expect("run");
        assert_eq!(out.status.code(), Some(2));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("field `batch_linger_ms`: must be between 1 and 60000"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn peak_rss_kib(pid: u32) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        status
            .lines()
            .find(|l| l.starts_with("VmHWM:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
    }

    /// Throughput of a snapshot through Kafka into PostgreSQL, against
    /// `pg_dump | psql` of the same rows. Run in release:
    /// `BENCH_ROWS=1000000 cargo test --release -p tributary-tests --test postgres_sink bench -- --ignored --nocapture`
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    #[ignore = "benchmark; run explicitly in release"]
    async fn bench_snapshot_through_kafka_vs_pg_dump() {
        let rows: i32 = std::env::var("BENCH_ROWS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1_000_000);
        let bin = tributary_tests::runner_binary("sink-runner");
        let mut p = Pipeline::new("bench", 1).await;
        let s = items();
        let started = Instant::now();
        let mut chunk = Vec::with_capacity(10_000);
        for i in 0..rows {
            chunk.push(event(&s, Op::Read, None, Some(row(i, &format!("product number {i}"), i, "19.99")), 1000, 0));
            if chunk.len() == 10_000 {
                p.produce(&chunk).await;
                chunk.clear();
            }
        }
        p.produce(&chunk).await;
        eprintln!("produced {rows} events in {:?}", started.elapsed());

        let dir = std::env::temp_dir().join(unique("tributary-bench"));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let config_path = dir.join("sink.toml");
        std::fs::write(&config_path, p.config_text().replace("batch_max_records = 300\n", "")).expect("config");
        let started = Instant::now();
        let mut child = spawn_runner(&bin, &config_path, &dir.join("sink.log"));
        let pid = child.id();
        let mut peak = 0;
        let fx = &p.fx;
        let table = fx.table();
        let count = || async {
            let exists: bool = fx
                .admin
                .query_one("SELECT to_regclass($1) IS NOT NULL", &[&table])
                .await
                .unwrap()
                .get(0);
            if !exists {
                return 0;
            }
            let n: i64 = fx
                .admin
                .query_one(format!("SELECT count(*) FROM {table}").as_str(), &[])
                .await
                .unwrap()
                .get(0);
            n
        };
        let until = Instant::now() + Duration::from_secs(1800);
        while count().await < i64::from(rows) {
            peak = peak.max(peak_rss_kib(pid).unwrap_or(0));
            assert!(Instant::now() < until, "timed out");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let took = started.elapsed();
        peak = peak.max(peak_rss_kib(pid).unwrap_or(0));
        let _ = child.kill();
        let _ = child.wait();
        eprintln!(
            "sink-runner: {rows} rows in {took:?} ({:.0} rows/s), peak RSS {} MiB (includes the consumer-group join)",
            f64::from(rows) / took.as_secs_f64(),
            peak / 1024
        );

        // Baseline: the same rows as a table, `pg_dump | psql` into another schema.
        let src = unique("bench_src");
        let dst_db = unique("bench_dst");
        p.fx.exec(&format!(
            "CREATE SCHEMA {src}; CREATE TABLE {src}.items (id integer PRIMARY KEY, name varchar(40), qty integer, \
             price numeric(10,2), __tributary_commit bigint, __tributary_index bigint); \
             INSERT INTO {src}.items SELECT i, 'product number ' || i, i, 19.99, 1000, 0 FROM generate_series(0, {}) i",
            rows - 1
        ))
        .await;
        p.fx.exec(&format!("CREATE DATABASE {dst_db}")).await;
        let base: tokio_postgres::Config = url().parse().unwrap();
        let db = base.get_dbname().unwrap_or("destination").to_string();
        let dst_url = url().replacen(&format!("/{db}"), &format!("/{dst_db}"), 1);
        let started = Instant::now();
        let pipeline = format!("pg_dump -t '{src}.items' '{}' | psql -q -v ON_ERROR_STOP=1 '{dst_url}'", url());
        let status = Command::new("bash")
            .args([
                "-c",
                &format!("psql -q '{dst_url}' -c 'CREATE SCHEMA {src}' && {pipeline}"),
            ])
            .status()
            .expect("pg_dump | psql");
        let base_took = started.elapsed();
        assert!(status.success());
        eprintln!(
            "pg_dump | psql: {rows} rows in {base_took:?} ({:.0} rows/s); sink-runner reaches {:.0}% of it",
            f64::from(rows) / base_took.as_secs_f64(),
            100.0 * base_took.as_secs_f64() / took.as_secs_f64()
        );
        p.fx.exec(&format!("DROP SCHEMA {src} CASCADE")).await;
        let _ = p.fx.admin.batch_execute(&format!("DROP DATABASE {dst_db}")).await;
        if std::env::var_os("BENCH_KEEP").is_some() {
            eprintln!("runner log kept: {}", dir.join("sink.log").display());
        } else {
            let _ = std::fs::remove_dir_all(&dir);
        }
        p.fx.cleanup().await;
    }

    /// A small xorshift generator: the seed is printed, and `TEST_SEED`
    /// replays a run.
    fn spawn_runner(bin: &PathBuf, config: &PathBuf, log: &PathBuf) -> Child {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .expect("log file");
        Command::new(bin)
            .arg("--config")
            .arg(config)
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("spawn sink-runner")
    }
}

/// The same benchmark as the emulator sinks' (`bench/run --sink spanner`
/// and the others print this table first, from the same run): changes/s
/// into PostgreSQL per batch size, and transactions per million changes
/// (each batch is one transaction).
#[tokio::test]
#[ignore = "benchmark; run explicitly"]
async fn bench_apply_rates_per_batch_size() {
    bench::apply_rates_per_batch_size::<Fixture>().await;
}

//! The Snowflake sink against the Snowflake emulator of the local stack
//! (fakesnow: `scripts/stack start snowflake`), and end to end: real
//! PostgreSQL -> `source-runner` -> real Kafka -> `sink-runner` -> emulator.
//!
//! Endpoints: `SNOWFLAKE_EMULATOR_URL` (default `http://127.0.0.1:9070`)
//! and those of the other stack services. Every test works in schemas of
//! its own. fakesnow enforces a declared primary key (and then cannot widen
//! a key column), so these tests turn `declare_primary_key` off; nothing
//! here ran against real Snowflake.

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::ClientConfig;
use tributary_connectors::sinks::snowflake::SnowflakeSink;
use tributary_connectors::{ErrorKind, Sink};
use tributary_schemas::{Column, DataType, Op, Value};
use tributary_tests::items::{batch, event, items, row};
use tributary_tests::snowflake::{Schemas, DATABASE};
use tributary_tests::{
    header, kafka_bootstrap, pg_source_url, runner_binary, schema_registry_url, snowflake_emulator_url, unique,
    wait_for, Runner,
};

/// Values Snowflake refuses are found by bisection and dead-lettered with
/// Snowflake's reason, never the value; the types the conformance suite
/// does not use (JSON as VARIANT, bytes, timestamps, arrays) round-trip.
#[tokio::test]
async fn refused_values_carry_snowflakes_reason_and_other_types_round_trip() {
    let fx = Schemas::new("types");
    let mut s = (*items()).clone();
    s.columns.push(Column::new("doc", DataType::Json, true));
    s.columns.push(Column::new("raw", DataType::Bytes, true));
    s.columns.push(Column::new("at", DataType::TimestampTz, true));
    s.columns
        .push(Column::new("tags", DataType::Array(Box::new(DataType::Int32)), true));
    let s = Arc::new(s);
    let mut sink = SnowflakeSink::new(fx.config()).expect("config");
    let mut good = row(1, "a", 1, "1.00");
    good.extend([
        Value::Json("{\"k\": [1, 2]}".into()),
        Value::Bytes(vec![0, 0xff]),
        Value::TimestampTz(1_700_000_000_123_456),
        Value::Array(vec![Value::Int32(1), Value::Int32(2)]),
    ]);
    let mut bad = row(2, "b", 2, "2.00");
    bad.extend([Value::Json("{not json".into()), Value::Null, Value::Null, Value::Null]);
    let mut after = row(3, "c", 3, "3.00");
    after.extend([Value::Null, Value::Null, Value::Null, Value::Null]);
    let events = vec![
        event(&s, Op::Create, None, Some(good), 10, 0),
        event(&s, Op::Create, None, Some(bad), 10, 1),
        event(&s, Op::Create, None, Some(after), 10, 2),
    ];
    let failing = batch("t", 0, events);
    let e = sink.apply(&failing).await.expect_err("malformed JSON is refused");
    assert_eq!(e.error.kind(), ErrorKind::Permanent, "{}", e.error);
    assert_eq!(e.record, Some(1), "{}", e.error);
    assert!(e.error.class().starts_with("snowflake.100"), "{}", e.error.class());
    assert!(!e.error.to_string().contains("not json"), "value leaked: {}", e.error);
    assert!(fx.rows().await.is_empty(), "a failed batch leaves no trace");
    let mut rest = failing.clone();
    rest.records.remove(1);
    sink.apply(&rest).await.expect("the rest applies");
    let got = fx
        .query(&format!(
            "SELECT CAST(\"doc\":k[1] AS VARCHAR), HEX_ENCODE(\"raw\"), CAST(\"at\" AS VARCHAR), \
             CAST(\"tags\" AS VARCHAR) FROM {} WHERE \"id\" = 1",
            fx.table("items")
        ))
        .await
        .expect("read back");
    let cells: Vec<String> = got.concat().into_iter().map(Option::unwrap_or_default).collect();
    assert_eq!(cells.len(), 4, "{cells:?}");
    assert_eq!((cells[0].as_str(), cells[1].as_str(), cells[3].as_str()), ("2", "00FF", "[1,2]"), "{cells:?}");
    // The offset's spelling is the engine's (fakesnow: `+00`).
    assert!(cells[2].starts_with("2023-11-14 22:13:20.123456"), "{cells:?}");
    assert_eq!(fx.rows().await, vec!["1|a|1|1.00".to_string(), "3|c|3|3.00".to_string()]);
    fx.cleanup().await;
}

/// A wrong base URL (nothing listening) is retryable; a login the server
/// refuses is not the data's fault either.
/// A key-pair login (`private_key` instead of `password`) opens a session
/// and applies a batch. fakesnow does not check the JWT (the login's shape
/// and the JWT itself are checked by the client's unit tests against a key
/// made with openssl); real Snowflake verifies it with the user's
/// `RSA_PUBLIC_KEY`, which this test cannot show.
#[tokio::test]
async fn a_key_pair_login_applies_batches() {
    let fx = Schemas::new("keypair");
    let key =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../connectors/src/sinks/snowflake/testdata/rsa_key.p8");
    let mut config = fx.config();
    config.password = None;
    config.private_key = Some(format!("file:{}", key.display()));
    let mut sink = SnowflakeSink::new(config).expect("config");
    let s = items();
    sink.apply(&batch("t", 0, vec![event(&s, Op::Create, None, Some(row(1, "a", 1, "1.00")), 10, 0)]))
        .await
        .expect("applied after a key-pair login");
    assert_eq!(fx.rows().await, vec!["1|a|1|1.00".to_string()]);
    fx.cleanup().await;
}

#[tokio::test]
async fn an_unreachable_emulator_is_retryable() {
    let fx = Schemas::new("down");
    let mut config = fx.config();
    config.url = "http://127.0.0.1:1".into();
    let mut sink = SnowflakeSink::new(config).expect("config");
    let e = sink
        .committed_offsets(&[("t".into(), 0)])
        .await
        .expect_err("nothing listens on port 1");
    assert_eq!(e.kind(), ErrorKind::Retryable, "{e}");
}

// ---------------------------------------------------------------- end to end

/// PostgreSQL -> source-runner -> Kafka -> sink-runner -> fakesnow: the
/// snapshot, streamed inserts, updates and deletes, a kill -9 of the sink
/// runner, an added column, and a value Snowflake refuses (to the
/// dead-letter topic with its reason); the copy must equal the source, no
/// row lost or doubled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_to_kafka_to_snowflake_equals_the_source_across_kill_9() {
    let name = unique("sfe2e");
    let (pg, conn) = tokio_postgres::connect(&pg_source_url(), tokio_postgres::NoTls)
        .await
        .expect("connect to source");
    tokio::spawn(conn);
    pg.batch_execute(&format!(
        "CREATE SCHEMA {name};
         CREATE TABLE {name}.items (id bigint PRIMARY KEY, v bigint NOT NULL, due date);
         INSERT INTO {name}.items SELECT i, i, DATE '2024-01-01' + (i % 365) FROM generate_series(1, 1000) i;"
    ))
    .await
    .expect("source table");

    let dir = std::env::temp_dir().join(&name);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let source_config = dir.join("source.toml");
    std::fs::write(
        &source_config,
        format!(
            "name = \"{name}\"\nschema_registry_url = \"{registry}\"\n[kafka]\nbootstrap_servers = \"{kafka}\"\n\
             [admin]\nlisten = \"off\"\n[postgres]\nurl = \"{url}\"\nslot_name = \"{name}\"\npublication_name = \"{name}\"\n\
             include = [\"{name}.*\"]\nheartbeat_interval_ms = 1000\n",
            registry = schema_registry_url(),
            kafka = kafka_bootstrap(),
            url = pg_source_url(),
        ),
    )
    .expect("source config");
    let schema = format!("{name}_dst");
    let bookkeeping = format!("{name}_bk");
    let group = format!("{name}-sf");
    let sink_config = dir.join("sink.toml");
    std::fs::write(
        &sink_config,
        format!(
            "prefix = \"{name}\"\nconsumer_group = \"{group}\"\nschema_registry_url = \"{registry}\"\n\
             batch_max_records = 500\nbatch_linger_ms = 200\n\
             [kafka]\nbootstrap_servers = \"{kafka}\"\n[kafka.properties]\n\"session.timeout.ms\" = \"6000\"\n\
             \"heartbeat.interval.ms\" = \"1000\"\n[admin]\nlisten = \"off\"\n\
             [snowflake]\nurl = \"{url}\"\naccount = \"emulator\"\nuser = \"tributary\"\npassword = \"emulator\"\n\
             database = \"{DATABASE}\"\nschema = \"{schema}\"\nbookkeeping_schema = \"{bookkeeping}\"\n\
             declare_primary_key = false\n",
            registry = schema_registry_url(),
            kafka = kafka_bootstrap(),
            url = snowflake_emulator_url(),
        ),
    )
    .expect("sink config");
    let source_log = dir.join("source.log");
    let sink_log = dir.join("sink.log");
    eprintln!("logs: {}", dir.display());
    // Reads the emulator through a sink's own session.
    let mut reader_config = tributary_tests::snowflake::config("reader");
    reader_config.bookkeeping_schema = bookkeeping.clone();
    let reader = tokio::sync::Mutex::new(SnowflakeSink::new(reader_config).expect("reader"));
    let query = |sql: String| {
        let reader = &reader;
        async move { reader.lock().await.query(&sql).await }
    };

    let source_rows = |extra: bool| {
        let pg = &pg;
        let name = name.clone();
        async move {
            let note = if extra { ", coalesce(note, 'NULL') AS n" } else { "" };
            let rows = pg
                .query(
                    // (Aliases: `ORDER BY id` would sort the text column.)
                    &format!(
                        "SELECT id::text AS i, v::text AS w, coalesce(due::text, 'NULL') AS d{note} FROM {name}.items \
                         WHERE id <> 5001 ORDER BY id"
                    ),
                    &[],
                )
                .await
                .expect("source rows");
            rows.iter()
                .map(|r| (0..r.len()).map(|i| r.get::<_, String>(i)).collect::<Vec<_>>().join("|"))
                .collect::<Vec<_>>()
        }
    };
    let table = format!("\"{DATABASE}\".\"{schema}\".\"items\"");
    let copy_rows = |extra: bool| {
        let sql = format!(
            "SELECT CAST(\"id\" AS VARCHAR), CAST(\"v\" AS VARCHAR), COALESCE(CAST(\"due\" AS VARCHAR), 'NULL'){} \
             FROM {table} ORDER BY \"id\"",
            if extra { ", COALESCE(\"note\", 'NULL')" } else { "" }
        );
        let query = &query;
        async move {
            query(sql)
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
    let want = source_rows(false).await;
    wait_for("the snapshot in Snowflake", Duration::from_secs(120), || async {
        (copy_rows(false).await == want).then_some(())
    })
    .await;

    let stored = || async {
        query(format!(
            "SELECT CAST(SUM(next_offset) AS VARCHAR) FROM \"{DATABASE}\".\"{bookkeeping}\".\"offsets\""
        ))
        .await
        .ok()
        .and_then(|r| r.first().and_then(|c| c.first().cloned().flatten()))
        // SUM's text may carry a fraction (fakesnow: `1722.0`).
        .and_then(|v| v.parse::<f64>().ok())
        .map(|v| v as i64)
        .unwrap_or(0)
    };
    let before = stored().await;
    // Streaming, and a kill -9 of the sink runner while it applies.
    pg.batch_execute(&format!(
        "INSERT INTO {name}.items SELECT i, i, NULL FROM generate_series(1001, 1300) i;
         UPDATE {name}.items SET v = v + 1000 WHERE id % 7 = 0;
         DELETE FROM {name}.items WHERE id % 11 = 0;"
    ))
    .await
    .expect("changes");
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
    let want = source_rows(false).await;
    wait_for("the copy to equal the source after kill -9", Duration::from_secs(120), || async {
        (copy_rows(false).await == want).then_some(())
    })
    .await;

    // DDL: a new column, rows that use it, and a date Snowflake cannot hold
    // (PostgreSQL's infinity) that goes to the dead-letter topic.
    pg.batch_execute(&format!(
        "ALTER TABLE {name}.items ADD COLUMN note text;
         INSERT INTO {name}.items VALUES (5000, 1, NULL, 'hello');
         UPDATE {name}.items SET note = 'updated' WHERE id = 1;
         INSERT INTO {name}.items VALUES (5001, 1, 'infinity', 'bad');
         INSERT INTO {name}.items VALUES (5002, 2, NULL, 'after');"
    ))
    .await
    .expect("ddl");
    let want = source_rows(true).await;
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
    assert!(message.contains("Snowflake refused"), "{message}");
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
    assert!(query(format!("SELECT 1 FROM {table}")).await.is_err(), "the destination table was dropped");
    let _ = Command::new(runner_binary("source-runner"))
        .arg("--config")
        .arg(&source_config)
        .args(["delete", "--yes"])
        .status();
    pg.batch_execute(&format!("DROP SCHEMA {name} CASCADE"))
        .await
        .expect("drop schema");
    for s in [&schema, &bookkeeping] {
        let _ = query(format!("DROP SCHEMA IF EXISTS \"{DATABASE}\".\"{s}\" CASCADE")).await;
    }
    let _ = std::fs::remove_dir_all(&dir);
}

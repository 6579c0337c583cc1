//! The Snowflake sink against the Snowflake emulator of the local stack
//! (fakesnow: `scripts/stack start snowflake`), and end to end: real
//! PostgreSQL -> `source-runner` -> real Kafka -> `sink-runner` -> emulator.
//!
//! Endpoints: `SNOWFLAKE_EMULATOR_URL` (default `http://127.0.0.1:9070`)
//! and those of the other stack services. Every test works in schemas of
//! its own. fakesnow enforces a declared primary key (and then cannot widen
//! a key column), so these tests turn `declare_primary_key` off; nothing
//! here ran against real Snowflake.

use std::sync::Arc;

use tributary_connectors::sinks::snowflake::SnowflakeSink;
use tributary_connectors::{ErrorKind, Sink};
use tributary_schemas::{Column, DataType, Op, Value};
use tributary_tests::bench;
use tributary_tests::e2e::kill_9_across_the_pipeline;
use tributary_tests::items::{batch, event, items, row};
use tributary_tests::snowflake::Schemas;
use tributary_tests::{header, unique};

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

/// Writes above `stage_threshold_rows` go through the session's internal
/// stage (PUT, the upload to the URL Snowflake's answer names, COPY INTO
/// ... PURGE) and apply as writes staged by INSERTs do: the values a CSV
/// file could blur (an empty string beside NULL, quotes, a line break,
/// leading zeros, `\N`) arrive as they were. A write that fails after its
/// COPY, before its commit (fenced: the state a kill there leaves), leaves
/// neither rows nor a file; its replay, and a replay of that in a new
/// session, write each row once. `staged_files` counts the COPYs, so the
/// test fails if the stage is not taken.
#[tokio::test]
async fn large_writes_go_through_the_internal_stage_exactly_once() {
    let fx = Schemas::new("stage");
    let mut config = fx.config();
    config.stage_threshold_rows = 50;
    let s = items();
    let name = |i: i32| match i % 7 {
        0 => None,
        1 => Some(String::new()),
        2 => Some("007".to_string()),
        3 => Some("a \"quoted\",\nline".to_string()),
        4 => Some("\\N".to_string()),
        _ => Some(format!("item {i}")),
    };
    let events: Vec<_> = (1..=120)
        .map(|i| {
            let mut r = row(i, "", i, "1.50");
            r[1] = name(i).map_or(Value::Null, Value::Text);
            event(&s, Op::Create, None, Some(r), 10, i as u64)
        })
        .collect();
    let expected: Vec<String> = (1..=120)
        .map(|i| format!("{i}|{}|{i}|1.50", name(i).unwrap_or_else(|| "NULL".into())))
        .collect();
    let mut sink = SnowflakeSink::new(config.clone()).expect("config");
    let mut fenced = batch("t", 0, events.clone());
    fenced.expected_offsets = vec![("t".into(), 0, Some(999))];
    sink.apply(&fenced).await.expect_err("fenced after its COPY");
    assert_eq!(sink.staged_files(), 1, "the write went through the stage");
    assert!(fx.rows().await.is_empty(), "a write that did not commit leaves no rows");
    assert!(files(&mut sink).await.is_empty(), "COPY ... PURGE removed the file");

    sink.apply(&batch("t", 0, events.clone()))
        .await
        .expect("applied through the stage");
    assert_eq!(sink.staged_files(), 2);
    assert_eq!(fx.rows().await, expected);
    assert!(files(&mut sink).await.is_empty());

    // The replay after a crash that lost the runner's progress: a new
    // session, the same write.
    let mut again = SnowflakeSink::new(config).expect("config");
    again.apply(&batch("t", 0, events)).await.expect("the replay applies");
    assert_eq!(again.staged_files(), 1);
    assert_eq!(fx.rows().await, expected, "each row once");
    assert!(files(&mut again).await.is_empty());
    // A write at or below the threshold is staged by INSERTs.
    let small = vec![event(&s, Op::Update, None, Some(row(1, "small", 1, "1.50")), 11, 0)];
    again.apply(&batch("t", 120, small)).await.expect("a small write");
    assert_eq!(again.staged_files(), 1, "no stage for a small write");
    assert_eq!(fx.rows().await.first().map(String::as_str), Some("1|small|1|1.50"));
    fx.cleanup().await;
}

/// The files in a sink's internal stage.
async fn files(sink: &mut SnowflakeSink) -> Vec<Vec<Option<String>>> {
    let list = format!("LIST @{}", sink.internal_stage());
    sink.query(&list).await.expect("LIST the internal stage")
}

/// A wrong base URL (nothing listening) is retryable; a login the server
/// refuses is not the data's fault either.
/// A key-pair login (`private_key` instead of `password`) opens a session
/// and applies a batch, also with an encrypted key and its passphrase. fakesnow does not check the JWT (the login's shape
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
    // The same key encrypted (testdata/README.md), with its passphrase.
    let mut config = fx.config();
    config.password = None;
    config.private_key = Some(format!("file:{}", key.with_file_name("rsa_key_aes.p8").display()));
    config.private_key_passphrase = Some("tributary-test".into());
    let mut sink = SnowflakeSink::new(config).expect("an encrypted key and its passphrase");
    sink.apply(&batch("t", 1, vec![event(&s, Op::Create, None, Some(row(2, "b", 2, "2.00")), 11, 0)]))
        .await
        .expect("applied after a login with the decrypted key");
    assert_eq!(fx.rows().await, vec!["1|a|1|1.00".to_string(), "2|b|2|2.00".to_string()]);
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

/// PostgreSQL -> source-runner -> Kafka -> sink-runner -> fakesnow
/// ([`tributary_tests::e2e`]): the copy equals the source after the
/// snapshot, streaming, a kill -9 of the sink runner and an added column;
/// PostgreSQL's infinity date is dead-lettered with Snowflake's reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_to_kafka_to_snowflake_equals_the_source_across_kill_9() {
    let fx = Schemas::new("e2e");
    let dead = kill_9_across_the_pipeline(&unique("sfe2e"), &fx).await.expect("a dead letter");
    let message = header(&dead, sink_runner::dead_letters::HEADER_MESSAGE).unwrap_or_default();
    assert!(message.contains("Snowflake refused"), "{message}");
}

/// Changes/s applied into fakesnow per batch size, and statements per
/// million changes (Snowflake bills warehouse time, which grows with
/// statements). fakesnow runs an array-bound INSERT row by row on DuckDB:
/// its rates say nothing of Snowflake's. Run by `bench/run --sink
/// snowflake` (beside the PostgreSQL sink), or: `BENCH_ROWS=5000
/// BENCH_BATCHES=100,1000,5000 cargo test -p tributary-tests --test
/// snowflake_sink bench -- --ignored --nocapture`.
#[tokio::test]
#[ignore = "benchmark; run explicitly"]
async fn bench_apply_rates_per_batch_size() {
    bench::apply_rates_per_batch_size::<Schemas>().await;
}

//! The Spanner sink against the Cloud Spanner emulator of the local stack
//! (`scripts/stack start spanner`), and end to end: real PostgreSQL ->
//! `source-runner` -> real Kafka -> `sink-runner` -> emulator.
//!
//! Endpoints: `SPANNER_EMULATOR_HOST` (default `127.0.0.1:9010`; its REST
//! gateway on the port + 10), `SPANNER_PROJECT` (default `tributary-local`),
//! `TRIBUTARY_SPANNER_EMULATOR_BIN` for the fault-injecting emulator of the
//! abort test, and those of the other stack services. Every test works in
//! a database of its own. Nothing here ran against real Spanner.

use std::process::Command;

use tributary_connectors::sinks::spanner::SpannerSink;
use tributary_connectors::{ErrorKind, Sink};
use tributary_schemas::{ChangeEvent, Op, Value};
use tributary_tests::bench;
use tributary_tests::e2e::kill_9_across_the_pipeline;
use tributary_tests::items::{batch, event, items, row};
use tributary_tests::spanner::Database;
use tributary_tests::{header, unique};

const TOPIC: &str = "spanner.items";
const ITEMS: &str = "public_items";

fn snapshot(n: i32) -> Vec<ChangeEvent> {
    let s = items();
    (1..=n)
        .map(|i| event(&s, Op::Read, None, Some(row(i, &format!("n{i}"), i, "1.00")), 10, i as u64))
        .collect()
}

async fn stored(sink: &mut SpannerSink) -> Option<i64> {
    sink.committed_offsets(&[(TOPIC.to_string(), 0)]).await.expect("offsets")[0]
}

/// A batch above the mutation limit is split into several commits, each
/// with the offsets of its prefix; when a later part fails, the parts
/// before it stay committed with their offsets (what a crash between two
/// commits leaves), and applying from there neither loses nor repeats.
#[tokio::test]
async fn a_batch_above_the_mutation_limit_commits_in_parts_each_with_its_prefix_offsets() {
    let db = Database::new("split").await;
    let mut c = db.config();
    // items: 4 columns + 2 positions + 1 = 7 mutations a record; 100 - 4
    // for the offsets row leaves 13 records a commit.
    c.mutation_limit = 100;
    let mut sink = SpannerSink::new(c).expect("config");
    sink.apply(&batch(TOPIC, 0, snapshot(100))).await.expect("split snapshot");
    assert_eq!(sink.commits(), 8, "100 records at 13 a commit");
    assert_eq!(db.rows(ITEMS).await.len(), 100);
    assert_eq!(stored(&mut sink).await, Some(100));

    // Record 40 of the next batch is refused: a price NUMERIC cannot hold
    // without rounding (10 digits after the point).
    let s = items();
    let mut events: Vec<ChangeEvent> = (1..=60)
        .map(|i| event(&s, Op::Update, None, Some(row(i, &format!("u{i}"), i, "2.00")), 20, i as u64))
        .collect();
    if let Some(after) = events[40].after.as_mut() {
        after[3] = Value::Decimal("2.0000000001".into());
    }
    let failing = batch(TOPIC, 100, events);
    let err = sink.apply(&failing).await.expect_err("record 40 is refused");
    assert_eq!(err.error.kind(), ErrorKind::Permanent, "{}", err.error);
    assert_eq!(err.record, Some(40), "named by its index in the whole batch: {}", err.error);
    // Parts of 13: records 0..39 committed in three parts, with the offset
    // after record 38 (the third part ends at index 38).
    assert_eq!(stored(&mut sink).await, Some(139));
    let rows = db.rows(ITEMS).await;
    assert!(rows.contains(&"39|u39|39|2.00".to_string()), "the committed prefix stays");
    assert!(rows.contains(&"40|n40|40|1.00".to_string()), "nothing after it");
    // The runner resumes from the stored offset without the dead letter.
    let mut rest = failing.clone();
    rest.records.retain(|(at, _)| at.offset >= 139 && at.offset != 140);
    rest.expected_offsets = vec![(TOPIC.to_string(), 0, Some(139))];
    sink.apply(&rest).await.expect("the rest");
    assert_eq!(stored(&mut sink).await, Some(160));
    let rows = db.rows(ITEMS).await;
    assert!(rows.contains(&"60|u60|60|2.00".to_string()));
    assert!(rows.contains(&"41|n41|41|1.00".to_string()), "the refused record left its row as it was");
    db.cleanup().await;
}

/// A second emulator of this test's own, started with fault injection (it
/// aborts commits at random): every abort is retried, and the copy ends
/// exact. Ended by its process group id at the end of the test.
#[tokio::test]
async fn aborted_transactions_are_retried() {
    let bin = std::env::var("TRIBUTARY_SPANNER_EMULATOR_BIN")
        .unwrap_or_else(|_| "/usr/lib/google-cloud-sdk/bin/cloud_spanner_emulator".into());
    let grpc = tributary_tests::free_port();
    let rest = tributary_tests::free_port();
    let mut child = {
        use std::os::unix::process::CommandExt;
        Command::new(format!("{bin}/gateway_main"))
            .args(["--hostname", "127.0.0.1", "--enable_fault_injection", "--grpc_binary"])
            .arg(format!("{bin}/emulator_main"))
            .args(["--grpc_port", &grpc.to_string(), "--http_port", &rest.to_string()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("start {bin}/gateway_main (TRIBUTARY_SPANNER_EMULATOR_BIN): {e}"))
    };
    let group = child.id();
    let stop = || {
        // The gateway leaves emulator_main behind when signalled alone.
        let _ = Command::new("kill").args(["-TERM", "--", &format!("-{group}")]).status();
    };
    let result = tokio::spawn(async move {
        let db = Database::at(&format!("127.0.0.1:{grpc}"), &format!("http://127.0.0.1:{rest}"), "abort").await;
        let mut sink = db.sink();
        let s = items();
        let mut offset = 0;
        sink.apply(&batch(TOPIC, 0, snapshot(50))).await.expect("snapshot");
        offset += 50;
        // The emulator aborts about one commit in 40 (measured): until
        // three aborts were retried, or 400 batches (P(no abort) < 1e-4).
        for round in 0..400u64 {
            let events: Vec<ChangeEvent> = (1..=2)
                .map(|i| {
                    let id = ((round * 2 + i) % 50 + 1) as i32;
                    event(&s, Op::Update, None, Some(row(id, &format!("r{round}"), id, "3.00")), 100 + round, i)
                })
                .collect();
            sink.apply(&batch(TOPIC, offset, events)).await.expect("applied despite aborts");
            offset += 2;
            if sink.aborts_retried() >= 3 {
                break;
            }
        }
        assert!(sink.aborts_retried() > 0, "the emulator injected no abort in {} batches", (offset - 50) / 2);
        assert_eq!(stored(&mut sink).await, Some(offset));
        assert_eq!(db.rows(ITEMS).await.len(), 50);
        sink.aborts_retried()
    })
    .await;
    stop();
    let _ = child.wait();
    match result {
        Ok(aborts) => eprintln!("aborts retried: {aborts}"),
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}

/// PostgreSQL -> source-runner -> Kafka -> sink-runner -> emulator
/// ([`tributary_tests::e2e`]): the copy equals the source after the
/// snapshot, streaming, a kill -9 of the sink runner and an added column;
/// PostgreSQL's infinity date is dead-lettered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_to_kafka_to_spanner_equals_the_source_across_kill_9() {
    let db = Database::new("e2e").await;
    let dead = kill_9_across_the_pipeline(&unique("spe2e"), &db).await.expect("a dead letter");
    let message = header(&dead, sink_runner::dead_letters::HEADER_MESSAGE).unwrap_or_default();
    assert!(message.contains("due"), "{message}");
}

/// Changes/s applied into the emulator per batch size, and commits per
/// million changes (each commit one read-write transaction; a batch above
/// the mutation limit is several). The emulator runs one read-write
/// transaction at a time and keeps everything in memory: its rates say
/// nothing of Spanner's. Run by `bench/run --sink spanner`, or:
/// `BENCH_ROWS=20000 BENCH_BATCHES=100,1000,5000 cargo test -p
/// tributary-tests --test spanner_sink bench -- --ignored --nocapture`.
#[tokio::test]
#[ignore = "benchmark; run explicitly"]
async fn bench_apply_rates_per_batch_size() {
    bench::apply_rates_per_batch_size::<Database>().await;
}

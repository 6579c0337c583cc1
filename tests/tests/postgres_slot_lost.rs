//! A replication slot PostgreSQL invalidated (`max_slot_wal_keep_size`),
//! against the stack's PostgreSQL 15.
//!
//! The setting is the server's, so while it is low every slot that lags
//! behind is invalidated: `scripts/test` runs this binary alone, after the
//! fault suite, and the test puts the setting back whatever happens.

use std::time::{Duration, Instant};

use tributary_connectors::sources::postgres::PostgresSource;
use tributary_connectors::{ErrorKind, Source};
use tributary_tests::postgres::{source_url, SourceSchema};

/// Puts `max_slot_wal_keep_size` back to its default (-1, no limit) when
/// dropped, also when the test fails.
struct KeepSizeReset;

async fn reset_keep_size() {
    let (client, connection) = tokio_postgres::connect(&source_url(), tokio_postgres::NoTls)
        .await
        .expect("connect to reset max_slot_wal_keep_size");
    let connection = tokio::spawn(connection);
    // One statement each: ALTER SYSTEM refuses a transaction block.
    for sql in ["ALTER SYSTEM RESET max_slot_wal_keep_size", "SELECT pg_reload_conf()"] {
        client.batch_execute(sql).await.expect("reset max_slot_wal_keep_size");
    }
    drop(client);
    let _ = connection.await;
}

impl Drop for KeepSizeReset {
    fn drop(&mut self) {
        // Drop cannot wait on the test's runtime: a runtime of its own.
        let _ =
            std::thread::spawn(|| tokio::runtime::Runtime::new().expect("runtime").block_on(reset_keep_size())).join();
    }
}

/// The source stops with a needs-operator error that says the slot was
/// invalidated and how to copy again; before, the error blamed
/// `wal_level` (a unit test covered only the message's mapping).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalidated_slot_stops_the_source_saying_so() {
    let fx = SourceSchema::new("slotlost").await;
    let s = &fx.schema;
    fx.exec(&format!(
        "CREATE TABLE {s}.items (id int PRIMARY KEY, v text);
         INSERT INTO {s}.items SELECT g, 'v' || g FROM generate_series(1, 10) g;"
    ))
    .await;
    let mut source = PostgresSource::new(fx.config(), "test").expect("config");
    source.start(None).await.expect("start");
    let mut checkpoint = None;
    let deadline = Instant::now() + Duration::from_secs(60);
    // The snapshot, acknowledged: the slot's position is the checkpoint's.
    while checkpoint.is_none() || source.snapshot_progress().iter().any(|p| !p.done) {
        assert!(Instant::now() < deadline, "the snapshot did not end");
        let b = source.next_batch().await.expect("batch");
        source.acknowledge(&b.checkpoint).await.expect("ack");
        checkpoint = Some(b.checkpoint);
    }
    drop(source);

    let _reset = KeepSizeReset;
    // Two 16 MB segments of WAL past the stopped slot, then a checkpoint:
    // PostgreSQL invalidates it.
    fx.exec("ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'").await;
    fx.exec("SELECT pg_reload_conf()").await;
    fx.exec(&format!(
        "CREATE TABLE {s}.filler (id int, pad text);
         INSERT INTO {s}.filler SELECT g, repeat('x', 1000) FROM generate_series(1, 60000) g;"
    ))
    .await;
    let lost = tributary_tests::wait_for("the slot invalidated", Duration::from_secs(60), || async {
        fx.exec("SELECT pg_switch_wal()").await;
        fx.exec("CHECKPOINT").await;
        let rows = fx
            .admin
            .query("SELECT wal_status FROM pg_replication_slots WHERE slot_name = $1", &[&fx.slot])
            .await
            .expect("slots");
        rows.first()
            .and_then(|r| r.get::<_, Option<String>>(0))
            .filter(|status| status == "lost")
    })
    .await;
    assert_eq!(lost, "lost");

    let mut source = PostgresSource::new(fx.config(), "test").expect("config");
    let error = match source.start(checkpoint).await {
        Err(e) => e,
        Ok(()) => {
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                match source.next_batch().await {
                    Err(e) if e.kind() != ErrorKind::Retryable || Instant::now() >= deadline => break e,
                    Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
                    Ok(_) => assert!(Instant::now() < deadline, "the source went on from an invalidated slot"),
                }
            }
        }
    };
    assert_eq!(error.kind(), ErrorKind::NeedsOperator, "{error}");
    let text = format!("{error} {}", error.hint().unwrap_or_default());
    assert!(text.contains("was invalidated by PostgreSQL (wal_status = lost)"), "{text}");
    assert!(text.contains("source-runner --config <source.toml> reset"), "{text}");
    assert!(!text.contains("wal_level"), "{text}");
    drop(source);
    fx.cleanup().await;
}

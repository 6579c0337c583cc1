//! The source runner end to end: real PostgreSQL -> the `source-runner`
//! binary -> real Kafka and schema registry, read back with `read_committed`
//! and our decoder.
//!
//! The runner is killed with SIGKILL during the snapshot and twice during a
//! streaming workload; after each kill it is restarted. The topic must then
//! hold every snapshot row exactly once and every change exactly once, in
//! order per key: each update increments a counter, so a lost change shows
//! as a gap and a duplicate as a repeat. The seed is printed; `TEST_SEED`
//! replays a run.
//!
//! The table keeps PostgreSQL's default replica identity and has a NOT NULL
//! column outside its key: the runner must give it full before-images
//! itself, or its deletes could not be encoded.

use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

use tributary_tests::{
    counters, kafka_bootstrap, pg_source_url, runner_binary, schema_registry_url, unique, wait_for, Rng, Runner,
};

/// Rows in the table before the runner starts: enough snapshot chunks that a
/// kill lands mid-snapshot.
const SNAPSHOT_ROWS: i64 = 20_000;
/// Rows per snapshot chunk (one Kafka transaction each).
const CHUNK_ROWS: u64 = 500;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_change_reaches_kafka_exactly_once_across_kill_9() {
    let seed: u64 = std::env::var("TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| u64::from(std::process::id()) * 7919 + 1);
    println!("TEST_SEED={seed}");
    let mut rng = Rng(seed | 1);

    let name = unique("eo");
    let (pg, conn) = tokio_postgres::connect(&pg_source_url(), tokio_postgres::NoTls)
        .await
        .expect("connect to source");
    tokio::spawn(conn);
    pg.batch_execute(&format!(
        "CREATE SCHEMA {name};
         CREATE TABLE {name}.counters (id bigint PRIMARY KEY, v bigint NOT NULL);
         INSERT INTO {name}.counters SELECT i, 0 FROM generate_series(1, {SNAPSHOT_ROWS}) i;"
    ))
    .await
    .expect("create source table");

    let dir = std::env::temp_dir().join(&name);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let config = dir.join("source.toml");
    let log = dir.join("source.log");
    std::fs::write(
        &config,
        format!(
            r#"name = "{name}"
schema_registry_url = "{registry}"

[kafka]
bootstrap_servers = "{kafka}"

[admin]
listen = "off"

[postgres]
url = "{url}"
slot_name = "{name}"
publication_name = "{name}"
include = ["{name}.*"]
snapshot_chunk_rows = {CHUNK_ROWS}
heartbeat_interval_ms = 1000
"#,
            registry = schema_registry_url(),
            kafka = kafka_bootstrap(),
            url = pg_source_url(),
        ),
    )
    .expect("write config");
    let topic = format!("{name}.{name}.counters");
    let seen = counters::collect(topic.clone(), "v");

    // Kill during the snapshot, as soon as its first chunk is committed.
    let mut runner = counters::snapshot_through_a_kill9(&config, &log, &seen, SNAPSHOT_ROWS as usize).await;

    // Streaming: updates increment v (so a lost or repeated change shows),
    // inserts add ids, deletes remove some; two kills at random moments.
    let mut next_id = SNAPSHOT_ROWS + 1;
    let mut expected_changes = 0usize;
    let kills: BTreeSet<u64> = [20 + rng.below(40), 80 + rng.below(60)].into_iter().collect();
    let mut deleted = BTreeSet::new();
    for step in 0..160u64 {
        let mut sql = String::from("BEGIN;");
        for _ in 0..1 + rng.below(4) {
            match rng.below(10) {
                0 => {
                    sql.push_str(&format!("INSERT INTO {name}.counters VALUES ({next_id}, 0);"));
                    next_id += 1;
                }
                1 => {
                    let id = 1 + rng.below(SNAPSHOT_ROWS as u64) as i64;
                    if deleted.insert(id) {
                        sql.push_str(&format!("DELETE FROM {name}.counters WHERE id = {id};"));
                    } else {
                        continue;
                    }
                }
                _ => {
                    let id = 1 + rng.below(200) as i64;
                    if deleted.contains(&id) {
                        continue;
                    }
                    sql.push_str(&format!("UPDATE {name}.counters SET v = v + 1 WHERE id = {id};"));
                }
            }
            expected_changes += 1;
        }
        sql.push_str("COMMIT;");
        pg.batch_execute(&sql).await.expect("workload transaction");
        if kills.contains(&step) {
            runner.kill9();
            runner = Runner::start("source-runner", &config, &log);
        }
    }

    wait_for("every change in Kafka", Duration::from_secs(180), || async {
        (counters::changes(&seen.lock().unwrap()) >= expected_changes).then_some(())
    })
    .await;
    drop(runner);

    counters::assert_exactly_once(&seen.lock().unwrap(), SNAPSHOT_ROWS as usize, expected_changes);

    let identity: String = pg
        .query_one(
            "SELECT relreplident::text FROM pg_class WHERE oid = $1::text::regclass",
            &[&format!("{name}.counters")],
        )
        .await
        .expect("replica identity")
        .get(0);
    assert_eq!(identity, "f", "the runner sets REPLICA IDENTITY FULL where deletes need it");

    // Tidy up: the slot would otherwise hold WAL for ever.
    let _ = Command::new(runner_binary("source-runner"))
        .arg("--config")
        .arg(&config)
        .args(["delete", "--yes"])
        .status();
    pg.batch_execute(&format!("DROP SCHEMA {name} CASCADE"))
        .await
        .expect("drop schema");
    let _ = std::fs::remove_dir_all(&dir);
}

//! The end-to-end flow every sink is held to, with the runners as built:
//! PostgreSQL -> `source-runner` -> Kafka -> `sink-runner` -> the
//! destination. The snapshot, streamed inserts, updates and deletes, a
//! `kill -9` of the sink runner after it made progress and changes while it
//! is down, an added column with rows that use it, and a date the
//! destination may not hold (PostgreSQL's `infinity`, dead-lettered with
//! the destination's reason where it cannot); after each step the copy must
//! equal the source, no row lost or doubled. Then `sink-runner delete
//! --drop-destination` removes the copy. The dead letter is handed back for
//! the caller to read its headers.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::OwnedMessage;

use crate::{
    committed_reader, pg_source_runner_config, pg_source_url, runner_binary, sink_runner_config, wait_for, Runner,
};

/// A destination as the flow sees it. `name` is the test's unique name: the
/// source schema, the runners' prefix, and the stem of whatever the
/// destination names after it.
#[async_trait::async_trait]
pub trait Destination: Sync {
    /// The destination section of the sink runner's config; the source
    /// table `<name>.items` must land in a table the other methods read.
    fn section(&self) -> String;
    /// The sink runner's consumer group (its offsets' key).
    fn group(&self) -> String;
    /// The copy of the source table `items` over `columns` (`id`, `v`,
    /// `due`, then `note` once it exists), each row `a|b|...` with `NULL`
    /// for NULL and dates as `YYYY-MM-DD`, by id; empty while it cannot be
    /// read.
    async fn rows(&self, columns: &[&str]) -> Vec<String>;
    /// The sum of the copy's stored offsets (0 while there are none).
    async fn stored(&self) -> i64;
    /// Whether the copy of `items` exists.
    async fn exists(&self) -> bool;
    /// Whether the destination cannot hold PostgreSQL's `infinity` date
    /// (its row is then dead-lettered, not copied).
    fn refuses_infinity(&self) -> bool;
    /// Removes what the test made in the destination.
    async fn cleanup(&self);
}

/// How long one step may take to reach the destination.
const STEP: Duration = Duration::from_secs(180);

/// Runs the flow for `name` into `destination`; returns the dead letter of the `infinity` row where the
/// destination refuses it.
pub async fn kill_9_across_the_pipeline(name: &str, destination: &dyn Destination) -> Option<OwnedMessage> {
    let pg = crate::postgres::connect(&pg_source_url()).await;
    pg.batch_execute(&format!(
        "CREATE SCHEMA {name};
         CREATE TABLE {name}.items (id bigint PRIMARY KEY, v bigint NOT NULL, due date);
         INSERT INTO {name}.items SELECT i, i, DATE '2024-01-01' + (i % 365) FROM generate_series(1, 2000) i;"
    ))
    .await
    .expect("source table");
    let dir = std::env::temp_dir().join(name);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let source_config = dir.join("source.toml");
    std::fs::write(&source_config, pg_source_runner_config(name)).expect("source config");
    let sink_config = dir.join("sink.toml");
    std::fs::write(&sink_config, sink_runner_config(name, &destination.group(), &destination.section()))
        .expect("sink config");
    let (source_log, sink_log) = (dir.join("source.log"), dir.join("sink.log"));
    eprintln!("logs: {}", dir.display());

    let refused = destination.refuses_infinity();
    let source_rows = |columns: &'static [&'static str]| {
        let pg = &pg;
        async move {
            let cells: Vec<String> = columns.iter().map(|c| format!("coalesce({c}::text, 'NULL')")).collect();
            // A refused row is not in the copy.
            let skip = if refused { "WHERE id <> 5001" } else { "" };
            pg.query(&format!("SELECT {} FROM {name}.items {skip} ORDER BY items.id", cells.join(", ")), &[])
                .await
                .expect("source rows")
                .iter()
                .map(|r| (0..columns.len()).map(|i| r.get::<_, String>(i)).collect::<Vec<_>>().join("|"))
                .collect::<Vec<_>>()
        }
    };
    const BASE: &[&str] = &["id", "v", "due"];
    const WITH_NOTE: &[&str] = &["id", "v", "due", "note"];
    let converge = |what: &'static str, columns: &'static [&'static str]| async move {
        let want = source_rows(columns).await;
        wait_for(what, STEP, || async { (destination.rows(columns).await == want).then_some(()) }).await;
    };

    let source = Runner::start("source-runner", &source_config, &source_log);
    let sink = Runner::start("sink-runner", &sink_config, &sink_log);
    converge("the snapshot", BASE).await;

    // Streaming, and the sink runner killed once it made progress.
    pg.batch_execute(&format!(
        "INSERT INTO {name}.items SELECT i, i, NULL FROM generate_series(2001, 2300) i;
         UPDATE {name}.items SET v = v + 1000 WHERE id % 7 = 0;
         DELETE FROM {name}.items WHERE id % 11 = 0;"
    ))
    .await
    .expect("changes");
    let before = destination.stored().await;
    wait_for("progress after the changes", Duration::from_secs(60), || async {
        (destination.stored().await > before).then_some(())
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
    converge("the copy to equal the source after kill -9", BASE).await;

    // DDL: a new column, rows that use it, and PostgreSQL's infinity date.
    pg.batch_execute(&format!(
        "ALTER TABLE {name}.items ADD COLUMN note text;
         INSERT INTO {name}.items VALUES (5000, 1, NULL, 'hello');
         UPDATE {name}.items SET note = 'updated' WHERE id = 1;
         INSERT INTO {name}.items VALUES (5001, 1, 'infinity', 'bad');
         INSERT INTO {name}.items VALUES (5002, 2, NULL, 'after');"
    ))
    .await
    .expect("ddl");
    converge("the new column and its rows", WITH_NOTE).await;
    drop(sink);
    let dead = if refused {
        let consumer: BaseConsumer = committed_reader("dlq-reader").create().expect("consumer");
        consumer.subscribe(&[&format!("{name}.{name}.items.dlq")]).expect("subscribe");
        Some(
            wait_for("the dead letter", Duration::from_secs(30), || async {
                consumer
                    .poll(Duration::from_millis(200))
                    .and_then(|m| m.ok())
                    .map(|m| m.detach())
            })
            .await,
        )
    } else {
        None
    };
    drop(source);
    delete_copy(&sink_config).await;
    assert!(!destination.exists().await, "the destination table was dropped");
    // After the sink's delete: it finds the tables to drop by their topics.
    delete_source_copy(&pg, &source_config, name).await;
    destination.cleanup().await;
    let _ = std::fs::remove_dir_all(&dir);
    dead
}

/// `sink-runner delete --yes --drop-destination`. A killed sink runner
/// stays a member of its consumer group until its session times out (6 s);
/// `delete` refuses a group with members, so it is tried until then.
async fn delete_copy(sink_config: &Path) {
    let sink_bin = runner_binary("sink-runner");
    wait_for("sink-runner delete --drop-destination to succeed", Duration::from_secs(60), || async {
        let out = Command::new(&sink_bin)
            .arg("--config")
            .arg(sink_config)
            .args(["delete", "--yes", "--drop-destination"])
            .output()
            .expect("sink-runner delete");
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success() || err.contains("NonEmptyGroup"), "{err}");
        out.status.success().then_some(())
    })
    .await;
}

/// Result rows of text cells as `a|b|...` (a NULL cell, which the
/// destinations' queries avoid, as empty).
pub fn joined(rows: Vec<Vec<Option<String>>>) -> Vec<String> {
    rows.into_iter()
        .map(|r| r.into_iter().map(Option::unwrap_or_default).collect::<Vec<_>>().join("|"))
        .collect()
}

/// `source-runner delete --yes` (the slot would otherwise hold WAL for
/// ever) and the source schema `name` dropped.
pub async fn delete_source_copy(pg: &tokio_postgres::Client, source_config: &Path, name: &str) {
    let _ = Command::new(runner_binary("source-runner"))
        .arg("--config")
        .arg(source_config)
        .args(["delete", "--yes"])
        .status();
    pg.batch_execute(&format!("DROP SCHEMA {name} CASCADE"))
        .await
        .expect("drop schema");
}

//! Verified copies (docs/verification.md), against the real runners: a
//! copy under a steady write load is verified equal while the writes go
//! on; then rows changed, deleted and inserted in the destination behind
//! the sink's back, and a value changed that only one column shows, are
//! reported exactly, and nothing else is.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tributary_tests::matrix::{converge_holding, Holds, Runners, Sink, SinkKind, Source, SourceKind};

/// Rows of the table: more than one verify range (2,000 rows each).
const ROWS: i64 = 4_500;

#[tokio::test]
async fn postgres_to_postgres() {
    verified_copy(SinkKind::Postgres).await;
}

#[tokio::test]
async fn postgres_to_bigquery() {
    verified_copy(SinkKind::BigQuery).await;
}

#[tokio::test]
async fn postgres_to_snowflake() {
    verified_copy(SinkKind::Snowflake).await;
}

/// Writes to `items` until `stop`: updates of ids 1000..=4499, inserts of
/// ids from 100000 on, deletes of some of those; counted in `done`.
fn write_load(url: String, table: String, stop: Arc<AtomicBool>, done: Arc<AtomicU64>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let client = tributary_tests::postgres::connect(&url).await;
        let mut i: i64 = 0;
        while !stop.load(Ordering::Relaxed) {
            i += 1;
            let id = 1_000 + (i * 7_919) % (ROWS - 1_000);
            let sql = format!(
                "BEGIN; UPDATE {table} SET a = a + 1, j = jsonb_build_object('round', {i}, 'k', 'v'), ts = now() \
                 WHERE id = {id}; INSERT INTO {table} (id, a, b, n, j, ts, u, tags) VALUES ({new}, {i}, 'new', 2.50, \
                 '{{\"b\": [1, 2], \"a\": null}}', now(), gen_random_uuid(), ARRAY['x', 'y']); {delete} COMMIT",
                new = 100_000 + i,
                delete = if i % 3 == 0 {
                    format!("DELETE FROM {table} WHERE id = {};", 100_000 + i - 1)
                } else {
                    String::new()
                },
            );
            if client.batch_execute(&sql).await.is_err() {
                let _ = client.batch_execute("ROLLBACK").await;
            }
            done.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
}

/// Behind the sink's back, in the destination's `items`: column b of id
/// 5 changed (only that column shows it), row 6 deleted, a row 50000 the
/// source never had inserted.
async fn tamper(sink: &Sink) {
    match sink {
        Sink::Postgres(d) => {
            d.exec(&format!(
                "UPDATE \"{s}\".\"items\" SET b = 'tampered' WHERE id = 5; DELETE FROM \"{s}\".\"items\" WHERE id = 6; \
                 INSERT INTO \"{s}\".\"items\" (id, a, b, __tributary_commit, __tributary_index) \
                 VALUES (50000, 1, 'ghost', 1, 0)",
                s = d.schema
            ))
            .await
        }
        Sink::BigQuery(d) => {
            let t = d.table("items");
            // One statement per query: the emulator runs no scripts. The
            // ghost row's tags are not NULL: BigQuery keeps a NULL array as
            // an empty one, which reads back as neither (the range would be
            // "not verified", not "differs").
            for sql in [
                format!("UPDATE {t} SET b = 'tampered' WHERE id = 5"),
                format!("DELETE FROM {t} WHERE id = 6"),
                format!(
                    "INSERT INTO {t} (id, a, b, tags, __tributary_commit, __tributary_index) \
                     VALUES (50000, 1, 'ghost', ['x'], 1, 0)"
                ),
            ] {
                tributary_tests::bigquery::query(&sql)
                    .await
                    .unwrap_or_else(|e| panic!("{sql}: {e}"));
            }
        }
        Sink::Snowflake(d) => {
            let t = d.table("items");
            for sql in [
                format!("UPDATE {t} SET \"b\" = 'tampered' WHERE \"id\" = 5"),
                format!("DELETE FROM {t} WHERE \"id\" = 6"),
                format!(
                    "INSERT INTO {t} (\"id\", \"a\", \"b\", \"__tributary_commit\", \"__tributary_index\") \
                     VALUES (50000, 1, 'ghost', 1, 0)"
                ),
            ] {
                d.query(&sql).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
            }
        }
        other => unreachable!("no verification test for {} yet", other.group()),
    }
}

async fn verified_copy(kind: SinkKind) {
    let mut source = Source::new(SourceKind::Postgres, "verify").await;
    let sink = Sink::new(kind, "verify").await;
    let t = source.qualified("items");
    source
        .sql(&format!(
            "CREATE TABLE {t} (id int PRIMARY KEY, a int NOT NULL, b text, n numeric(8,2), j jsonb, \
             ts timestamptz, u uuid, tags text[]); \
             INSERT INTO {t} SELECT g, g, 'b' || g, g / 7.0, jsonb_build_object('g', g, 'a', 'x'), \
             timestamptz '2026-01-01 00:00:00+00' + g * interval '1 second', gen_random_uuid(), ARRAY['a', g::text] \
             FROM generate_series(1, {ROWS}) g"
        ))
        .await;
    let mut runners = Runners::new(&source, &sink);
    runners.source.start();
    runners.sink.start();
    // Every column is compared as text but those a warehouse prints
    // otherwise than PostgreSQL (the verification compares them all).
    let skipped: &[(&[&str], &str)] = match &sink {
        Sink::BigQuery(_) => &[(&["tags"], "an ARRAY prints as [a, 1]")],
        Sink::Snowflake(_) => &[(&["j", "tags"], "a VARIANT and an ARRAY print as compact JSON")],
        _ => &[],
    };
    let holds = Holds { skipped, ..Holds::default() };
    converge_holding(&mut source, &sink, &mut runners, "items", "snapshot", &holds).await;

    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let load = write_load(tributary_tests::pg_source_url(), t.clone(), stop.clone(), done.clone());

    // Under load, twice: equal, never a false alarm.
    for round in 0..2 {
        let before = done.load(Ordering::Relaxed);
        let id = runners.verify(&t).await;
        let v = runners.verified("items", id).await;
        assert_eq!(v["state"], "equal", "round {round}: a copy under load verified equal: {v}");
        assert!(v["rows_verified"].as_u64().unwrap_or(0) >= ROWS as u64, "{v}");
        assert!(v["ranges_verified"].as_u64().unwrap_or(0) >= 3, "{v}");
        assert!(done.load(Ordering::Relaxed) > before, "the writes went on meanwhile");
    }

    tamper(&sink).await;
    let id = runners.verify(&t).await;
    let v = runners.verified("items", id).await;
    assert_eq!(v["state"], "differs", "{v}");
    assert_eq!(v["rows_differing"], 3, "exactly the three keys: {v}");
    let differences: Vec<String> = v["differences"]
        .as_array()
        .expect("differences")
        .iter()
        .map(|d| d.as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(
        differences,
        vec![
            r#"key ["5"]: differs in b"#.to_string(),
            r#"key ["6"]: missing in the destination"#.to_string(),
            r#"key ["50000"]: in the destination only"#.to_string(),
        ],
        "{v}"
    );
    let metrics = reqwest::get(format!("{}/metrics", runners.sink_admin))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics text");
    let differing = metrics
        .lines()
        .find(|l| l.starts_with("tributary_verify_rows_differing{") && l.contains("items"))
        .unwrap_or_default()
        .to_string();
    assert!(differing.ends_with(" 3"), "{differing}\n{metrics}");

    stop.store(true, Ordering::Relaxed);
    load.await.expect("write load");
    runners.assert_alive("after verifying");
    runners.delete();
    sink.cleanup().await;
    source.cleanup().await;
}

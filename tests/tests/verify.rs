//! Verified copies (docs/verification.md), against the real runners: a
//! copy under a steady write load is verified equal while the writes go
//! on; then rows changed, deleted and inserted in the destination behind
//! the sink's back, and a value changed that only one column shows, are
//! reported exactly, and nothing else is; then repaired, and the next
//! verification is equal.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tributary_tests::matrix::{
    converge, converge_as, converge_holding, Compare, Holds, Runners, Sink, SinkKind, Source, SourceKind,
};

/// Rows of the table: three verify ranges (up to 5,000 rows each), so that
/// ranges meet at bounds.
const ROWS: i64 = 10_500;

#[tokio::test]
async fn postgres_to_postgres() {
    verified_copy(SinkKind::Postgres).await;
}

/// The table's topic has three partitions: each gets a copy of each range
/// holding the keys the producer puts there, and the sink compares those
/// (the changes of the other partitions may not be applied yet).
#[tokio::test]
async fn postgres_to_postgres_over_three_partitions() {
    verified_copy_on(SinkKind::Postgres, 3).await;
}

/// Every column type of the table has a Redshift type (arrays and jsonb in
/// SUPER, uuid as VARCHAR(36)), read back for the comparison.
#[tokio::test]
async fn postgres_to_redshift() {
    verified_copy(SinkKind::Redshift).await;
}

/// Every column type of the table has a Spanner type (text[] as
/// ARRAY<STRING(MAX)>, uuid as STRING).
#[tokio::test]
async fn postgres_to_spanner() {
    verified_copy(SinkKind::Spanner).await;
}

/// A column dropped from the destination behind the sink's back: the
/// verification says the columns differ (the change the sink would make);
/// with repair, the sink makes it, the rows' values of the column are sent
/// again, and the next verification is equal.
#[tokio::test]
async fn the_destinations_columns_are_verified_and_repaired() {
    columns_verified_and_repaired(SinkKind::Postgres).await;
}

/// [`the_destinations_columns_are_verified_and_repaired`] on Snowflake.
#[tokio::test]
async fn snowflake_columns_are_verified_and_repaired() {
    columns_verified_and_repaired(SinkKind::Snowflake).await;
}

/// [`the_destinations_columns_are_verified_and_repaired`] on Redshift.
#[tokio::test]
async fn redshift_columns_are_verified_and_repaired() {
    columns_verified_and_repaired(SinkKind::Redshift).await;
}

async fn columns_verified_and_repaired(kind: SinkKind) {
    let mut source = Source::new(SourceKind::Postgres, "verify").await;
    let sink = Sink::new(kind, "verify").await;
    let t = source.qualified("items");
    create_items(&mut source, &t).await;
    let mut runners = Runners::new(&source, &sink);
    runners.source.start();
    runners.sink.start();
    let skipped: &[(&[&str], &str)] = match &sink {
        Sink::Postgres(_) => &[],
        _ => &[(&["j", "tags"], "JSON and arrays: each destination prints them its own way")],
    };
    let holds = Holds { skipped, ..Holds::default() };
    converge_holding(&mut source, &sink, &mut runners, "items", "snapshot", &holds).await;
    match &sink {
        Sink::Postgres(d) => d.exec(&format!("ALTER TABLE \"{}\".\"items\" DROP COLUMN b", d.schema)).await,
        Sink::Snowflake(d) => {
            let sql = format!("ALTER TABLE {} DROP COLUMN \"b\"", d.table("items"));
            d.query(&sql).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
        }
        Sink::Redshift(w, _) => w
            .admin
            .batch_execute(&format!("ALTER TABLE {} DROP COLUMN b", w.table()))
            .await
            .expect("drop a column in Redshift"),
        _ => unreachable!("a destination that verifies its columns"),
    }
    let id = runners.verify(&t).await;
    let v = runners.verified("items", id).await;
    assert_eq!(v["state"], "differs", "{v}");
    let first = v["differences"][0].as_str().unwrap_or_default().to_string();
    assert!(first.starts_with("columns: ") && first.contains("ADD COLUMN") && first.contains("b"), "{v}");

    runners.sink.kill9();
    runners.append_config(false, "[verify]\nrepair = true\n");
    runners.sink.start();
    let id = runners.verify(&t).await;
    let v = runners.verified("items", id).await;
    assert_eq!(v["state"], "differs", "{v}");
    assert_eq!(v["rows_differing"], ROWS, "every row lacks b until the source sends it again: {v}");
    let again = runners.verified_where("items", |later| later > id).await;
    assert_eq!(again["state"], "equal", "after the repair: {again}");
    converge_holding(&mut source, &sink, &mut runners, "items", "after the repair", &holds).await;
    runners.assert_alive("after the repair");
    runners.delete();
    sink.cleanup().await;
    source.cleanup().await;
}

/// `[verify] every_secs`: the source runner verifies every table by itself,
/// again and again, while writes go on; every verification is equal.
#[tokio::test]
async fn a_schedule_verifies_again_and_again_under_load() {
    let mut source = Source::new(SourceKind::Postgres, "verify").await;
    let sink = Sink::new(SinkKind::Postgres, "verify").await;
    let t = source.qualified("items");
    create_items(&mut source, &t).await;
    let mut runners = Runners::new(&source, &sink);
    runners.append_config(true, "[verify]\nevery_secs = 2\nrows_per_second = 20000\n");
    runners.source.start();
    runners.sink.start();
    converge(&mut source, &sink, &mut runners, "items", "snapshot").await;
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let load = write_load(tributary_tests::pg_source_url(), t.clone(), stop.clone(), done.clone());
    // TRIBUTARY_VERIFY_SOAK_SECS: go on that long (the 30-minute soak of
    // docs/verification.md); by default three verifications.
    let soak = std::env::var("TRIBUTARY_VERIFY_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .map(Duration::from_secs);
    let started = std::time::Instant::now();
    let (mut last_id, mut verified, mut rows) = (0u64, 0u64, 0u64);
    loop {
        let next = runners.verified_where("items", |id| id > last_id).await;
        assert_eq!(next["state"], "equal", "verification {} under load: {next}", verified + 1);
        last_id = next["id"].as_u64().unwrap_or(u64::MAX);
        verified += 1;
        rows += next["rows_verified"].as_u64().unwrap_or(0);
        let more = match soak {
            Some(d) => started.elapsed() < d,
            None => verified < 3,
        };
        if !more {
            break;
        }
    }
    eprintln!(
        "{verified} verifications under load, all equal: {rows} rows compared, {} writes, in {:.0} s",
        done.load(Ordering::Relaxed),
        started.elapsed().as_secs_f64()
    );
    stop.store(true, Ordering::Relaxed);
    load.await.expect("write load");
    runners.assert_alive("after the scheduled verifications");
    runners.delete();
    sink.cleanup().await;
    source.cleanup().await;
}

/// `[verify] method = "summary"`: the source and the PostgreSQL
/// destination each count and sum their rows' hashes per range in SQL
/// (no row leaves either); under load every verification is equal; after
/// the destination is changed behind the sink's back, the ranges whose
/// summaries differ are verified again by their rows, which name exactly
/// the three keys, and are repaired.
#[tokio::test]
async fn postgres_to_postgres_by_summaries() {
    let mut source = Source::new(SourceKind::Postgres, "verify").await;
    let sink = Sink::new(SinkKind::Postgres, "verify").await;
    let t = source.qualified("items");
    create_items(&mut source, &t).await;
    let mut runners = Runners::new(&source, &sink);
    // Ranges of 4,000 keys: three of the table's 10,500 rows.
    runners.append_config(true, "[verify]\nmethod = \"summary\"\nsummary_range_rows = 4000\n");
    runners.append_config(false, "[verify]\nrepair = true\n");
    runners.source.start();
    runners.sink.start();
    converge(&mut source, &sink, &mut runners, "items", "snapshot").await;

    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let load = write_load(tributary_tests::pg_source_url(), t.clone(), stop.clone(), done.clone());
    for round in 0..2 {
        let before = done.load(Ordering::Relaxed);
        let id = runners.verify(&t).await;
        let v = runners.verified("items", id).await;
        assert_eq!(v["state"], "equal", "round {round}: summaries of a copy under load: {v}");
        assert!(v["rows_verified"].as_u64().unwrap_or(0) >= ROWS as u64, "{v}");
        assert_eq!(v["ranges_verified"], 3, "{v}");
        assert!(done.load(Ordering::Relaxed) > before, "the writes went on meanwhile");
    }

    // Ids 5 and 6 are in the first range, 50000 in the last (after 8000,
    // to the end): those two ranges differ, the middle one does not.
    tamper(&sink).await;
    let id = runners.verify(&t).await;
    let v = runners.verified("items", id).await;
    assert_eq!(v["state"], "differs", "{v}");
    assert_eq!(v["ranges_differing"], 2, "{v}");
    let summaries: Vec<&str> = v["differences"]
        .as_array()
        .expect("differences")
        .iter()
        .filter_map(|d| d.as_str())
        .collect();
    assert_eq!(summaries.len(), 2, "{v}");
    assert!(summaries[0].starts_with("rows after the first up to [\"4000\"]: "), "{v}");
    assert!(summaries[1].starts_with("rows after [\"8000\"] up to the last: "), "{v}");
    // The ranges verified by their rows: exactly the three keys, repaired.
    let rows = runners.verified_where("items", |later| later > id).await;
    assert_eq!(rows["state"], "differs", "{rows}");
    assert_eq!(rows["rows_differing"], 3, "{rows}");
    assert_eq!(rows["rows_repaired"], 3, "one removed, two sent again: {rows}");
    assert_the_tampered_keys(&rows);
    let row_id = rows["id"].as_u64().unwrap_or(u64::MAX);
    let again = runners.verified_where("items", |later| later > row_id).await;
    assert_eq!(again["state"], "equal", "the verification after the repair: {again}");
    // And by summaries again.
    let id = runners.verify(&t).await;
    let v = runners.verified("items", id).await;
    assert_eq!(v["state"], "equal", "summaries after the repair: {v}");

    stop.store(true, Ordering::Relaxed);
    load.await.expect("write load");
    converge(&mut source, &sink, &mut runners, "items", "after the repair").await;

    // A `json` document `jsonb` refuses (the record hash takes `json` as
    // `jsonb`): from its range on, the table is summed by its rows' texts,
    // and is equal still.
    source
        .sql(&format!(
            "ALTER TABLE {t} ADD COLUMN doc json; UPDATE {t} SET doc = '{{\"k\": \"\\u0000\"}}' WHERE id = 9000"
        ))
        .await;
    converge(&mut source, &sink, &mut runners, "items", "a json column").await;
    let id = runners.verify(&t).await;
    let v = runners.verified("items", id).await;
    assert_eq!(v["state"], "equal", "summed by the rows' texts from the third range on: {v}");
    assert!(
        runners.source.log_tail(400).contains("summed by the rows' texts from here on"),
        "{}",
        runners.source.log_tail(40)
    );

    // A `point` column has no extended hash: the table is summed by its
    // rows' texts, and is equal still; then a value only that column shows
    // is found.
    source
        .sql(&format!("ALTER TABLE {t} ADD COLUMN note point DEFAULT '(1,2)'; UPDATE {t} SET a = a WHERE id = 1"))
        .await;
    converge(&mut source, &sink, &mut runners, "items", "a point column").await;
    let id = runners.verify(&t).await;
    let v = runners.verified("items", id).await;
    assert_eq!(v["state"], "equal", "summed by the rows' texts: {v}");
    assert!(
        runners.source.log_tail(400).contains("summed by the rows' texts"),
        "{}",
        runners.source.log_tail(40)
    );
    let Sink::Postgres(d) = &sink else {
        unreachable!("a PostgreSQL destination")
    };
    d.exec(&format!("UPDATE \"{}\".\"items\" SET note = '(3,4)' WHERE id = 9000", d.schema))
        .await;
    let id = runners.verify(&t).await;
    let v = runners.verified("items", id).await;
    assert_eq!(v["ranges_differing"], 1, "{v}");
    let rows = runners.verified_where("items", |later| later > id).await;
    assert_eq!(rows["differences"][0], r#"key ["9000"]: differs in note"#, "{rows}");
    runners.assert_alive("after verifying by summaries");
    runners.delete();
    sink.cleanup().await;
    source.cleanup().await;
}

/// Makes `topic` with `partitions` partitions.
async fn create_topic(topic: &str, partitions: i32) {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    let admin: AdminClient<rdkafka::client::DefaultClientContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", tributary_tests::kafka_bootstrap())
        .create()
        .expect("admin client");
    let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
    for r in admin.create_topics(&[new], &AdminOptions::new()).await.expect("create topic") {
        r.expect("topic created");
    }
}

/// `items` with `ROWS` rows of every type the test compares.
async fn create_items(source: &mut Source, t: &str) {
    source
        .sql(&format!(
            "CREATE TABLE {t} (id int PRIMARY KEY, a int NOT NULL, b text, n numeric(8,2), j jsonb, \
             ts timestamptz, u uuid, tags text[]); \
             INSERT INTO {t} SELECT g, g, 'b' || g, g / 7.0, jsonb_build_object('g', g, 'a', 'x'), \
             timestamptz '2026-01-01 00:00:00+00' + g * interval '1 second', gen_random_uuid(), ARRAY['a', g::text] \
             FROM generate_series(1, {ROWS}) g"
        ))
        .await;
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
    // The same statements everywhere (in Spanner as DML, one by one); the
    // ghost row has the sink's position columns, which refuse NULL.
    let sql = |table: &str| {
        format!(
            "UPDATE {table} SET b = 'tampered' WHERE id = 5; DELETE FROM {table} WHERE id = 6; \
             INSERT INTO {table} (id, a, b, __tributary_commit, __tributary_index) VALUES (50000, 1, 'ghost', 1, 0)"
        )
    };
    match sink {
        Sink::Postgres(d) => d.exec(&sql(&format!("\"{}\".\"items\"", d.schema))).await,
        Sink::Redshift(w, _) => w.admin.batch_execute(&sql(&w.table())).await.expect("tamper in Redshift"),
        Sink::Spanner(d) => {
            let statements = sql("items");
            let statements: Vec<&str> = statements.split("; ").collect();
            d.execute(&statements).await.expect("tamper in Spanner")
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
    }
}

/// A verification's differences are exactly the keys [`tamper`] changed,
/// in any order.
fn assert_the_tampered_keys(v: &serde_json::Value) {
    let mut differences: Vec<String> = v["differences"]
        .as_array()
        .expect("differences")
        .iter()
        .map(|d| d.as_str().unwrap_or_default().to_string())
        .collect();
    differences.sort();
    assert_eq!(
        differences,
        vec![
            r#"key ["5"]: differs in b"#.to_string(),
            r#"key ["50000"]: in the destination only"#.to_string(),
            r#"key ["6"]: missing in the destination"#.to_string(),
        ],
        "{v}"
    );
}

async fn verified_copy(kind: SinkKind) {
    verified_copy_on(kind, 1).await;
}

/// [`verified_copy`] with the table's topic made beforehand with
/// `partitions` partitions.
async fn verified_copy_on(kind: SinkKind, partitions: i32) {
    let mut source = Source::new(SourceKind::Postgres, "verify").await;
    let sink = Sink::new(kind, "verify").await;
    let t = source.qualified("items");
    create_items(&mut source, &t).await;
    if partitions > 1 {
        create_topic(&format!("{}.{t}", source.name()), partitions).await;
    }
    let mut runners = Runners::new(&source, &sink);
    // Repair on from the start: a verification that finds nothing changes
    // nothing. (No restart of the sink to turn it on: bqemulator reports a
    // JSON column as STRING after its creation, which a sink started again
    // takes for an incompatible type; BigQuery itself reports JSON.)
    runners.append_config(false, "[verify]\nrepair = true\n");
    runners.source.start();
    runners.sink.start();
    // The wait for the copy compares text; JSON and arrays print their own
    // way in each destination (the verification compares every column).
    let skipped: &[(&[&str], &str)] = match &sink {
        Sink::Postgres(_) => &[],
        Sink::BigQuery(_) => &[(&["tags"], "an ARRAY prints as [a, 1]")],
        _ => &[(&["j", "tags"], "JSON and arrays: each destination prints them its own way")],
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

    // Behind the sink's back: found, exactly, and repaired, still under
    // load: the sink removes the row only it has and asks the source for
    // the other two again; the source's verification after the repair is
    // equal.
    tamper(&sink).await;
    let id = runners.verify(&t).await;
    let v = runners.verified("items", id).await;
    assert_eq!(v["state"], "differs", "{v}");
    assert_eq!(v["rows_differing"], 3, "exactly the three keys: {v}");
    assert_eq!(v["rows_repaired"], 3, "one removed, two sent again: {v}");
    // Each partition's ranges report their own keys.
    assert_the_tampered_keys(&v);
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

    let again = runners.verified_where("items", |later| later > id).await;
    assert_eq!(again["state"], "equal", "the verification after the repair: {again}");

    stop.store(true, Ordering::Relaxed);
    load.await.expect("write load");
    converge_holding(&mut source, &sink, &mut runners, "items", "after the repair", &holds).await;
    runners.assert_alive("after verifying");
    runners.delete();
    sink.cleanup().await;
    source.cleanup().await;
}

/// The MariaDB source verifies too: equal after the copy, then exactly the
/// keys changed, deleted and inserted behind the sink's back, repaired.
#[tokio::test]
async fn mariadb_to_postgres() {
    let mut source = Source::new(SourceKind::MariaDb, "verify").await;
    let sink = Sink::new(SinkKind::Postgres, "verify").await;
    let t = source.qualified("items");
    let rows: Vec<String> = (1..=ROWS)
        .map(|g| format!("({g}, {g}, 'b{g}', {g} / 7, '2026-01-01 00:00:00.{:06}', 'text {g}')", g % 1_000_000))
        .collect();
    source
        .sql(&format!(
            "CREATE TABLE {t} (id int PRIMARY KEY, a int NOT NULL, b varchar(40), n decimal(8,2), \
             ts datetime(6), t text); INSERT INTO {t} VALUES {}",
            rows.join(", ")
        ))
        .await;
    let mut runners = Runners::new(&source, &sink);
    runners.source.start();
    runners.sink.start();
    converge(&mut source, &sink, &mut runners, "items", "snapshot").await;
    let id = runners.verify(&t).await;
    let v = runners.verified("items", id).await;
    assert_eq!(v["state"], "equal", "{v}");
    assert_eq!(v["rows_verified"], ROWS, "{v}");
    tamper(&sink).await;
    let id = runners.verify(&t).await;
    let v = runners.verified("items", id).await;
    assert_eq!(v["state"], "differs", "{v}");
    assert_eq!(v["rows_differing"], 3, "{v}");
    // Repaired as on PostgreSQL: the MariaDB source sends the missing and
    // changed rows again from its snapshot transaction, then verifies.
    runners.sink.kill9();
    runners.append_config(false, "[verify]\nrepair = true\n");
    runners.sink.start();
    let id = runners.verify(&t).await;
    let v = runners.verified("items", id).await;
    assert_eq!(v["rows_differing"], 3, "{v}");
    assert_eq!(v["rows_repaired"], 3, "one removed, two sent again: {v}");
    let again = runners.verified_where("items", |later| later > id).await;
    assert_eq!(again["state"], "equal", "the verification after the repair: {again}");
    converge(&mut source, &sink, &mut runners, "items", "after the repair").await;
    runners.assert_alive("after verifying");
    runners.delete();
    sink.cleanup().await;
    source.cleanup().await;
}

/// Rows of the table without a key: 2,000 distinct rows four times each,
/// so that its 8,000 rows make two ranges of content keys.
const KEYLESS_ROWS: i64 = 8_000;

/// Tables without a key are verified by their rows' content keys, as
/// multisets: equal under a write load of duplicates inserted and deleted;
/// then one copy of a row deleted, one copy changed in one column and one
/// copy added behind the sink's back are each found, with the column; the
/// repair copies the table again, and the next verification is equal.
#[tokio::test]
async fn a_table_without_a_key_postgres_to_postgres() {
    keyless_verified(SourceKind::Postgres, SinkKind::Postgres).await;
}

/// [`a_table_without_a_key_postgres_to_postgres`] from MariaDB.
#[tokio::test]
async fn a_table_without_a_key_mariadb_to_postgres() {
    keyless_verified(SourceKind::MariaDb, SinkKind::Postgres).await;
}

/// [`a_table_without_a_key_postgres_to_postgres`] into BigQuery.
#[tokio::test]
async fn a_table_without_a_key_postgres_to_bigquery() {
    keyless_verified(SourceKind::Postgres, SinkKind::BigQuery).await;
}

/// [`a_table_without_a_key_postgres_to_postgres`] into Snowflake.
#[tokio::test]
async fn a_table_without_a_key_postgres_to_snowflake() {
    keyless_verified(SourceKind::Postgres, SinkKind::Snowflake).await;
}

/// [`a_table_without_a_key_postgres_to_postgres`] into Redshift.
#[tokio::test]
async fn a_table_without_a_key_postgres_to_redshift() {
    keyless_verified(SourceKind::Postgres, SinkKind::Redshift).await;
}

/// [`a_table_without_a_key_postgres_to_postgres`] into Spanner.
#[tokio::test]
async fn a_table_without_a_key_postgres_to_spanner() {
    keyless_verified(SourceKind::Postgres, SinkKind::Spanner).await;
}

/// The destination's table `events` (of the sink `sink`), as its SQL names it.
fn events_table(sink: &Sink) -> String {
    match sink {
        Sink::Postgres(d) => format!("\"{}\".\"events\"", d.schema),
        Sink::Redshift(w, _) => format!("\"{}\".\"events\"", w.schema),
        Sink::Spanner(_) => "events".to_string(),
        Sink::BigQuery(d) => d.table("events"),
        Sink::Snowflake(d) => d.table("events"),
    }
}

/// Behind the sink's back, in the destination's `events`: one of the four
/// copies of the row `id = 7` deleted, one of `id = 8` changed in `b`, one
/// more copy of `id = 9` added (with a row name of its own).
async fn tamper_keyless(sink: &Sink) {
    let t = events_table(sink);
    let one = |a: i32| format!("(SELECT MIN(__tributary_row) FROM {t} WHERE id = {a})");
    let statements = vec![
        format!("DELETE FROM {t} WHERE __tributary_row = {}", one(7)),
        format!("UPDATE {t} SET b = 'tampered' WHERE __tributary_row = {}", one(8)),
        format!(
            "INSERT INTO {t} (id, b, c, __tributary_key, __tributary_row, __tributary_commit, __tributary_index) \
             SELECT id, b, c, __tributary_key, 'ghost', __tributary_commit, __tributary_index FROM {t} \
             WHERE __tributary_row = {}",
            one(9)
        ),
    ];
    match sink {
        Sink::Postgres(d) => d.exec(&statements.join("; ")).await,
        Sink::Redshift(w, _) => w.admin.batch_execute(&statements.join("; ")).await.expect("tamper in Redshift"),
        Sink::Spanner(d) => {
            // The emulator runs a subquery once per row: the names first.
            let mut statements = statements;
            for (a, statement) in [7, 8, 9].into_iter().zip(statements.iter_mut()) {
                let sql = format!("SELECT MIN(__tributary_row) FROM {t} WHERE id = {a}");
                let rows = d.query(&sql).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
                let name = rows.first().and_then(|r| r.first().cloned().flatten()).expect("a row name");
                *statement = statement.replace(&one(a), &format!("'{name}'"));
            }
            let statements: Vec<&str> = statements.iter().map(String::as_str).collect();
            d.execute(&statements).await.expect("tamper in Spanner")
        }
        Sink::BigQuery(_) => {
            for sql in &statements {
                tributary_tests::bigquery::query(sql)
                    .await
                    .unwrap_or_else(|e| panic!("{sql}: {e}"));
            }
        }
        Sink::Snowflake(d) => {
            for sql in &statements {
                d.query(sql).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
            }
        }
    }
}

async fn keyless_verified(source_kind: SourceKind, kind: SinkKind) {
    let mut source = Source::new(source_kind, "verifykl").await;
    let sink = Sink::new(kind, "verifykl").await;
    let t = source.qualified("events");
    let distinct = KEYLESS_ROWS / 4;
    match source_kind {
        SourceKind::Postgres => {
            source
                .sql(&format!(
                    "CREATE TABLE {t} (id int, b text, c numeric(8,2)); ALTER TABLE {t} REPLICA IDENTITY FULL; \
                     INSERT INTO {t} SELECT g % {distinct}, CASE WHEN g % 5 = 0 THEN NULL ELSE 'b' || (g % {distinct}) \
                     END, (g % {distinct}) / 7.0 FROM generate_series(1, {KEYLESS_ROWS}) g"
                ))
                .await
        }
        _ => {
            let rows: Vec<String> = (1..=KEYLESS_ROWS)
                .map(|g| {
                    let k = g % distinct;
                    let b = if g % 5 == 0 {
                        "NULL".to_string()
                    } else {
                        format!("'b{k}'")
                    };
                    format!("({k}, {b}, {k} / 7)")
                })
                .collect();
            source
                .sql(&format!(
                    "CREATE TABLE {t} (id int, b varchar(40), c decimal(8,2)); INSERT INTO {t} VALUES {}",
                    rows.join(", ")
                ))
                .await
        }
    }
    let mut runners = Runners::new(&source, &sink);
    // Repair on from the start: a verification that finds nothing changes
    // nothing.
    runners.append_config(false, "[verify]\nrepair = true\n");
    runners.source.start();
    runners.sink.start();
    converge_as(&mut source, &sink, &mut runners, "events", "snapshot", Compare::Multiset).await;

    // Under writes: copies of rows inserted and deleted, never a false
    // alarm.
    let stop = Arc::new(AtomicBool::new(false));
    let load = {
        let (stop, t, mariadb) = (stop.clone(), t.clone(), source_kind == SourceKind::MariaDb);
        tokio::spawn(async move {
            use mysql_async::prelude::Queryable;
            let mut my = if mariadb {
                Some(tributary_tests::mysql::admin().await)
            } else {
                None
            };
            let pg = if mariadb {
                None
            } else {
                Some(tributary_tests::postgres::connect(&tributary_tests::pg_source_url()).await)
            };
            let mut i: i64 = 0;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let (a, gone) = (100 + i % 50, 200 + i % 50);
                let insert = format!("INSERT INTO {t} VALUES ({a}, 'w', 1.50)");
                if let Some(my) = my.as_mut() {
                    my.query_drop(&insert).await.expect("insert");
                    my.query_drop(format!("DELETE FROM {t} WHERE id = {gone} LIMIT 1"))
                        .await
                        .expect("delete");
                } else if let Some(pg) = &pg {
                    let delete =
                        format!("DELETE FROM {t} WHERE ctid = (SELECT ctid FROM {t} WHERE id = {gone} LIMIT 1)");
                    pg.batch_execute(&format!("{insert}; {delete}")).await.expect("writes");
                }
                tokio::time::sleep(Duration::from_millis(30)).await;
            }
        })
    };
    let id = runners.verify(&t).await;
    let v = runners.verified("events", id).await;
    assert_eq!(v["state"], "equal", "a copy under writes: {v}");
    assert!(v["rows_verified"].as_u64().unwrap_or(0) >= (KEYLESS_ROWS as u64) - 100, "{v}");
    assert!(v["ranges_verified"].as_u64().unwrap_or(0) >= 2, "{v}");
    stop.store(true, Ordering::Relaxed);
    load.await.expect("write load");

    tamper_keyless(&sink).await;
    let id = runners.verify(&t).await;
    let v = runners.verified("events", id).await;
    assert_eq!(v["state"], "differs", "{v}");
    assert_eq!(v["rows_differing"], 3, "one copy missing, one changed, one added: {v}");
    let mut kinds: Vec<String> = v["differences"]
        .as_array()
        .expect("differences")
        .iter()
        .map(|d| {
            let d = d.as_str().unwrap_or_default();
            d.rsplit_once(": ").map_or(d, |(_, kind)| kind).to_string()
        })
        .collect();
    kinds.sort();
    assert_eq!(kinds, ["differs in b", "in the destination only", "missing in the destination"], "{v}");

    // The repair copied the table again.
    converge_as(&mut source, &sink, &mut runners, "events", "copied again by the repair", Compare::Multiset).await;
    let id = runners.verify(&t).await;
    let v = runners.verified("events", id).await;
    assert_eq!(v["state"], "equal", "after the repair: {v}");
    runners.assert_alive("after verifying");
    runners.delete();
    sink.cleanup().await;
    source.cleanup().await;
}

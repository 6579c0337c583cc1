//! The schema-change matrix (`docs/schema-changes.md`): for each source x
//! each sink, the runners as built (`source-runner`, `sink-runner`, through
//! the stack's Kafka and registry) copy a table while ordinary migrations
//! run on it one at a time, each followed by writes; after each, the
//! destination must equal the source over every column the source has
//! (rows compared as text), and neither runner may exit. A second table
//! takes the same migrations with the source killed (SIGKILL) right after
//! each one and started again, so that it replays the changes written
//! before the DDL under their older shape.

use std::time::Duration;

use tributary_tests::matrix::{converge, Runners, Sink, SinkKind, Source, SourceKind};
use tributary_tests::{kafka_bootstrap, schema_registry_url};

/// One migration, in each source's SQL (`{t}` is the table); `None` where
/// the source has no such statement.
struct Step {
    name: &'static str,
    postgres: Option<&'static str>,
    mariadb: Option<&'static str>,
    /// A column the destination must no longer have after the step (the
    /// sink runs with `drop_columns = true`).
    gone: Option<&'static str>,
}

/// The matrix's rows, in order (each builds on the ones before).
const STEPS: &[Step] = &[
    Step {
        name: "ADD COLUMN d int",
        postgres: Some("ALTER TABLE {t} ADD COLUMN d int"),
        mariadb: Some("ALTER TABLE {t} ADD COLUMN d int"),
        gone: None,
    },
    Step {
        name: "ADD COLUMN e int DEFAULT 7",
        postgres: Some("ALTER TABLE {t} ADD COLUMN e int DEFAULT 7"),
        mariadb: Some("ALTER TABLE {t} ADD COLUMN e int DEFAULT 7"),
        gone: None,
    },
    Step {
        name: "ADD COLUMN f text NOT NULL DEFAULT 'x'",
        postgres: Some("ALTER TABLE {t} ADD COLUMN f text NOT NULL DEFAULT 'x'"),
        mariadb: Some("ALTER TABLE {t} ADD COLUMN f varchar(20) NOT NULL DEFAULT 'x'"),
        gone: None,
    },
    Step {
        name: "ADD COLUMN g int NOT NULL (implicit default)",
        postgres: None,
        // (The default afterwards only lets the later inserts leave g out.)
        mariadb: Some("ALTER TABLE {t} ADD COLUMN g int NOT NULL; ALTER TABLE {t} ALTER COLUMN g SET DEFAULT 0"),
        gone: None,
    },
    Step {
        name: "widen: int -> bigint, numeric(8,2) -> numeric(12,2), varchar(10) -> varchar(40)",
        postgres: Some(
            "ALTER TABLE {t} ALTER COLUMN a TYPE bigint, ALTER COLUMN n TYPE numeric(12,2), ALTER COLUMN v TYPE varchar(40)",
        ),
        mariadb: Some("ALTER TABLE {t} MODIFY a bigint NOT NULL, MODIFY n decimal(12,2), MODIFY v varchar(40)"),
        gone: None,
    },
    Step {
        name: "DROP NOT NULL",
        postgres: Some("ALTER TABLE {t} ALTER COLUMN a DROP NOT NULL"),
        mariadb: Some("ALTER TABLE {t} MODIFY a bigint NULL"),
        gone: None,
    },
    Step {
        name: "SET NOT NULL",
        postgres: Some(
            "UPDATE {t} SET d = 0 WHERE d IS NULL; ALTER TABLE {t} ALTER COLUMN d SET DEFAULT 0, ALTER COLUMN d SET NOT NULL",
        ),
        mariadb: Some("UPDATE {t} SET d = 0 WHERE d IS NULL; ALTER TABLE {t} MODIFY d int NOT NULL DEFAULT 0"),
        gone: None,
    },
    Step {
        name: "SET DEFAULT",
        postgres: Some("ALTER TABLE {t} ALTER COLUMN e SET DEFAULT 9"),
        mariadb: Some("ALTER TABLE {t} ALTER COLUMN e SET DEFAULT 9"),
        gone: None,
    },
    Step {
        name: "RENAME COLUMN d TO d2",
        postgres: Some("ALTER TABLE {t} RENAME COLUMN d TO d2"),
        mariadb: Some("ALTER TABLE {t} RENAME COLUMN d TO d2"),
        // Renamed with its values, not split into an old and a new column.
        gone: Some("d"),
    },
    Step {
        name: "narrow: bigint -> int",
        postgres: Some("ALTER TABLE {t} ALTER COLUMN a TYPE int"),
        mariadb: Some("ALTER TABLE {t} MODIFY a int NULL"),
        gone: None,
    },
    Step {
        name: "DROP COLUMN b",
        postgres: Some("ALTER TABLE {t} DROP COLUMN b"),
        mariadb: Some("ALTER TABLE {t} DROP COLUMN b"),
        gone: Some("b"),
    },
];

#[tokio::test]
async fn postgres_to_postgres() {
    matrix(SourceKind::Postgres, SinkKind::Postgres).await;
}

#[tokio::test]
async fn postgres_to_bigquery() {
    matrix(SourceKind::Postgres, SinkKind::BigQuery).await;
}

#[tokio::test]
async fn postgres_to_redshift() {
    matrix(SourceKind::Postgres, SinkKind::Redshift).await;
}

#[tokio::test]
async fn postgres_to_spanner() {
    matrix(SourceKind::Postgres, SinkKind::Spanner).await;
}

#[tokio::test]
async fn postgres_to_snowflake() {
    matrix(SourceKind::Postgres, SinkKind::Snowflake).await;
}

#[tokio::test]
async fn mariadb_to_postgres() {
    matrix(SourceKind::MariaDb, SinkKind::Postgres).await;
}

#[tokio::test]
async fn mariadb_to_bigquery() {
    matrix(SourceKind::MariaDb, SinkKind::BigQuery).await;
}

/// A change no topic shape carries (`int` to `text`) pauses its table
/// only (`incompatible_schema_changes = "pause_table"`, the default): its
/// changes are held back and named in the status with both types, the
/// other tables flow, no runner exits. Reverting the column and restarting
/// copies the table again: nothing held back is lost. With `register`, the
/// change is registered (the subject's BACKWARD level restored after) and
/// the table flows again.
#[tokio::test]
async fn an_incompatible_change_pauses_its_table_until_it_can_be_carried() {
    incompatible_change(SourceKind::Postgres).await;
}

#[tokio::test]
async fn an_incompatible_change_pauses_its_mariadb_table_until_it_can_be_carried() {
    incompatible_change(SourceKind::MariaDb).await;
}

/// Tables `items` and `other` of 40 rows each (columns id, a, b, n, v and
/// `extra_columns`, whose values `extra_values` gives), copied to a
/// PostgreSQL sink by running runners.
async fn two_tables_copied(kind: SourceKind, extra_columns: &str, extra_values: &str) -> (Source, Sink, Runners) {
    let mut source = Source::new(kind, "ddl").await;
    let sink = Sink::new(SinkKind::Postgres, "ddl").await;
    for table in ["items", "other"] {
        let t = source.qualified(table);
        source
            .sql(&format!(
                "CREATE TABLE {t} (id int PRIMARY KEY, a int NOT NULL, b text, n numeric(8,2), v varchar(10){extra_columns}); \
                 INSERT INTO {t} VALUES {}",
                (1..=40)
                    .map(|g| format!("({g}, {g}, 'b', 1.5, 'v'{extra_values})"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
            .await;
    }
    let mut runners = Runners::new(&source, &sink);
    runners.source.start();
    runners.sink.start();
    converge(&mut source, &sink, &mut runners, "items", "snapshot").await;
    converge(&mut source, &sink, &mut runners, "other", "snapshot").await;
    (source, sink, runners)
}

/// `items`' entry in the source runner's `/status` at `url` (and the whole
/// status) once it is paused (`true`) or not (`false`).
async fn items_status(url: &str, key: &str, want_paused: bool) -> Option<(serde_json::Value, String)> {
    let status: serde_json::Value = reqwest::get(url).await.ok()?.json().await.ok()?;
    let table = status.get("tables")?.get(key)?.to_string();
    (table.contains("\"paused\"") == want_paused).then_some((status, table))
}

async fn incompatible_change(kind: SourceKind) {
    let pg = kind == SourceKind::Postgres;
    let (mut source, sink, mut runners) = two_tables_copied(kind, "", "").await;
    let t = source.qualified("items");

    let to_text = if pg {
        "ALTER COLUMN a TYPE text"
    } else {
        "MODIFY a text NOT NULL"
    };
    let prefixed = |p: &str| {
        if pg {
            format!("'{p}' || a")
        } else {
            format!("CONCAT('{p}', a)")
        }
    };
    source
        .sql(&format!(
            "ALTER TABLE {t} {to_text}; UPDATE {t} SET a = {} WHERE id <= 5; \
             INSERT INTO {t} VALUES (100, 'held', 'b', 1, 'v'); DELETE FROM {t} WHERE id = 40",
            prefixed("x")
        ))
        .await;
    let (status_url, key) = (format!("{}/status", runners.source_admin), source.qualified("items"));
    let table_status = |want_paused: bool| items_status(&status_url, &key, want_paused);
    let (status, table) =
        tributary_tests::wait_for("the table to pause", Duration::from_secs(60), || table_status(true)).await;
    assert!(table.contains("a: type changed from int32 to text"), "{table}");
    assert!(status.get("paused").is_some_and(serde_json::Value::is_null), "the runner goes on: {status}");
    // The other table flows meanwhile.
    writes(&mut source, "other", 1).await;
    converge(&mut source, &sink, &mut runners, "other", "while items is paused").await;
    runners.assert_alive("while a table is paused");

    // Reverted and restarted: the table is copied again, with every change
    // that was held back.
    let revert = if pg {
        format!("ALTER TABLE {t} ALTER COLUMN a TYPE int USING length(a)")
    } else {
        format!("UPDATE {t} SET a = LENGTH(a); ALTER TABLE {t} MODIFY a int NOT NULL")
    };
    source.sql(&format!("{revert}; UPDATE {t} SET v = 'after' WHERE id = 7")).await;
    runners.source.kill9();
    runners.source.start();
    converge(&mut source, &sink, &mut runners, "items", "copied again after the revert").await;
    tributary_tests::wait_for("the table to flow", Duration::from_secs(60), || table_status(false)).await;
    writes(&mut source, "items", 2).await;
    converge(&mut source, &sink, &mut runners, "items", "streaming after the copy").await;

    // `register`: the change is registered and the table flows again.
    source
        .sql(&format!("ALTER TABLE {t} {to_text}; UPDATE {t} SET a = {}", prefixed("y")))
        .await;
    tributary_tests::wait_for("the table to pause again", Duration::from_secs(60), || table_status(true)).await;
    runners.source.kill9();
    let config = std::fs::read_to_string(&runners.source.config).expect("source config");
    std::fs::write(&runners.source.config, format!("incompatible_schema_changes = \"register\"\n{config}"))
        .expect("source config");
    runners.source.start();
    let subject = format!("{}/subjects/{}.{t}-value/versions/latest", schema_registry_url(), source.name());
    tributary_tests::wait_for("the new version", Duration::from_secs(60), || {
        let url = subject.clone();
        async move {
            let latest: serde_json::Value = reqwest::get(&url).await.ok()?.json().await.ok()?;
            latest.get("schema")?.as_str()?.contains("\"string\"").then_some(())
        }
    })
    .await;
    let config_url = format!("{}/config/{}.{t}-value", schema_registry_url(), source.name());
    let level: serde_json::Value = reqwest::get(&config_url).await.expect("config").json().await.expect("json");
    assert_eq!(level["compatibilityLevel"], "BACKWARD", "the subject's level is restored");
    tributary_tests::wait_for("the table to go on", Duration::from_secs(60), || table_status(false)).await;
    writes(&mut source, "other", 3).await;
    converge(&mut source, &sink, &mut runners, "other", "after registering").await;
    runners.assert_alive("after registering");
    runners.delete();
    sink.cleanup().await;
    source.cleanup().await;
}

/// Issue #24: a streamed MariaDB value the source cannot decode (a
/// character set without a decoder) pauses its table alone, with the
/// column and character set in `/status`; the other table flows. Once the
/// column is converted and the runner restarted, the table is copied again
/// with the value. Before, the source runner stopped for good ("a source
/// cannot skip a change") and no table was copied further.
#[tokio::test]
async fn an_undecodable_mariadb_value_pauses_its_table_until_it_is_copied_again() {
    let (mut source, sink, mut runners) =
        two_tables_copied(SourceKind::MariaDb, ", c varchar(20) CHARACTER SET dec8", ", 'plain'").await;
    let t = source.qualified("items");

    source
        .sql(&format!("UPDATE {t} SET c = 'café' WHERE id = 3; UPDATE {t} SET v = 'held' WHERE id = 4"))
        .await;
    let (status_url, key) = (format!("{}/status", runners.source_admin), source.qualified("items"));
    let table_status = |want_paused: bool| items_status(&status_url, &key, want_paused);
    let (status, table) =
        tributary_tests::wait_for("the table to pause", Duration::from_secs(60), || table_status(true)).await;
    assert!(table.contains("dec8") && table.contains("column c"), "{table}");
    assert!(status.get("paused").is_some_and(serde_json::Value::is_null), "the runner goes on: {status}");
    writes(&mut source, "other", 1).await;
    converge(&mut source, &sink, &mut runners, "other", "while items is paused").await;
    runners.assert_alive("while a table is paused");

    // The operator converts the column and restarts the runner: the table
    // is copied again, the value in it.
    source
        .sql(&format!("ALTER TABLE {t} MODIFY c varchar(20) CHARACTER SET utf8mb4"))
        .await;
    runners.source.kill9();
    runners.source.start();
    converge(&mut source, &sink, &mut runners, "items", "copied again after the fix").await;
    tributary_tests::wait_for("the table to flow", Duration::from_secs(60), || table_status(false)).await;
    writes(&mut source, "items", 2).await;
    converge(&mut source, &sink, &mut runners, "items", "streaming after the copy").await;
    runners.assert_alive("after the copy");
    runners.delete();
    sink.cleanup().await;
    source.cleanup().await;
}

// ---------------------------------------------------------------- re-copies

/// A source in another position domain (PostgreSQL restored from a dump
/// into a new cluster, a MySQL failover with `resume_by = "gtid"`, `RESET
/// MASTER`) writes positions lower than those the destination holds: the
/// position guard would skip every update and delete until the numbers
/// caught up. Faked honestly without a second server: the destination's
/// rows get positions far above the source's (the old domain's), and the
/// runner's checkpoint an epoch of another server. At start the runner sees
/// the change, resets every table (a table-reset record on each of the
/// topic's three partitions) and copies it again: the changes made while
/// it was stopped and after it started are right in the destination, and
/// rows the copy did not see are gone.
#[tokio::test]
async fn a_changed_source_epoch_copies_every_table_again() {
    epoch_change(SourceKind::Postgres, "7000000000000000001").await;
}

#[tokio::test]
async fn a_changed_mariadb_epoch_copies_every_table_again() {
    epoch_change(SourceKind::MariaDb, "server_id:4242").await;
}

async fn epoch_change(kind: SourceKind, other_epoch: &str) {
    let mut source = Source::new(kind, "ddl").await;
    let sink = Sink::new(SinkKind::Postgres, "ddl").await;
    for table in ["items", "other"] {
        let t = source.qualified(table);
        source
            .sql(&format!(
                "CREATE TABLE {t} (id int PRIMARY KEY, a int NOT NULL, b text, n numeric(8,2), v varchar(10)); \
                 INSERT INTO {t} (id, a, b, n, v) VALUES {}",
                (1..=40)
                    .map(|g| format!("({g}, {g}, 'b', 1.5, 'v')"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
            .await;
    }
    // Three partitions: every one of them must see the reset before the
    // copy's rows.
    create_topic(&format!("{}.{}", source.name(), source.qualified("items")), 3).await;
    let mut runners = Runners::new(&source, &sink);
    runners.source.start();
    runners.sink.start();
    converge(&mut source, &sink, &mut runners, "items", "snapshot").await;
    converge(&mut source, &sink, &mut runners, "other", "snapshot").await;
    runners.source.kill9();

    // The old domain: positions above anything the source writes next, and
    // a row the source no longer has (its delete was never read).
    let Sink::Postgres(d) = &sink else {
        unreachable!("a PostgreSQL destination")
    };
    for table in ["items", "other"] {
        d.exec(&format!(
            "UPDATE \"{s}\".\"{table}\" SET __tributary_commit = __tributary_commit + {OLD_DOMAIN}; \
             INSERT INTO \"{s}\".\"{table}\" (id, a, b, n, v, __tributary_commit, __tributary_index) \
             VALUES (900, 9, 'gone', 1, 'v', {OLD_DOMAIN}, 0)",
            s = d.schema
        ))
        .await;
    }
    rewrite_checkpoint(source.name(), |cp| cp["epoch"] = serde_json::Value::from(other_epoch)).await;

    let t = source.qualified("items");
    source
        .sql(&format!("UPDATE {t} SET a = 1000 WHERE id = 3; DELETE FROM {t} WHERE id = 4"))
        .await;
    runners.source.start();
    source
        .sql(&format!(
            "UPDATE {t} SET a = 2000 WHERE id = 5; DELETE FROM {t} WHERE id = 6; \
             INSERT INTO {t} (id, a) VALUES (500, 5)"
        ))
        .await;
    converge(&mut source, &sink, &mut runners, "items", "changes after the epoch change").await;
    converge(&mut source, &sink, &mut runners, "other", "after the epoch change").await;
    // The stream goes on in the new domain.
    writes(&mut source, "items", 1).await;
    converge(&mut source, &sink, &mut runners, "items", "streaming after the re-copy").await;
    runners.assert_alive("after the epoch change");
    runners.delete();
    sink.cleanup().await;
    source.cleanup().await;
}

/// `source-runner reset --table` with the runner stopped: rows the
/// destination holds that the source no longer has (their deletes never
/// reached the topics: made here by writing them into the destination) are
/// removed, the others kept, the changes made meanwhile applied, and the
/// other table is untouched. Then, with the runner running, a reset of the
/// other table: the runner is fenced, starts again by itself and carries
/// it out.
#[tokio::test]
async fn source_runner_reset_copies_a_table_again_and_removes_rows_it_did_not_see() {
    let mut source = Source::new(SourceKind::Postgres, "ddl").await;
    let sink = Sink::new(SinkKind::Postgres, "ddl").await;
    for table in ["items", "other"] {
        let t = source.qualified(table);
        source
            .sql(&format!(
                "CREATE TABLE {t} (id int PRIMARY KEY, a int NOT NULL, b text, n numeric(8,2), v varchar(10)); \
                 INSERT INTO {t} (id, a, b, n, v) VALUES {}",
                (1..=40)
                    .map(|g| format!("({g}, {g}, 'b', 1.5, 'v')"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
            .await;
    }
    let mut runners = Runners::new(&source, &sink);
    runners.source.start();
    runners.sink.start();
    converge(&mut source, &sink, &mut runners, "items", "snapshot").await;
    converge(&mut source, &sink, &mut runners, "other", "snapshot").await;
    runners.source.kill9();
    let Sink::Postgres(d) = &sink else {
        unreachable!("a PostgreSQL destination")
    };
    for table in ["items", "other"] {
        d.exec(&format!(
            "INSERT INTO \"{s}\".\"{table}\" (id, a, b, n, v, __tributary_commit, __tributary_index) \
             VALUES (900, 9, 'gone', 1, 'v', 1, 0), (901, 9, 'gone', 1, 'v', 1, 0)",
            s = d.schema
        ))
        .await;
    }
    let t = source.qualified("items");
    source
        .sql(&format!("UPDATE {t} SET a = 1000 WHERE id = 3; DELETE FROM {t} WHERE id = 4"))
        .await;
    runners.reset(&[&t]);
    runners.source.start();
    converge(&mut source, &sink, &mut runners, "items", "after reset --table").await;
    let ghosts = |table: &'static str| {
        let sql = format!("SELECT count(*)::text FROM \"{}\".\"{table}\" WHERE id >= 900", d.schema);
        async move { d.texts(&sql).await.first().cloned().flatten() }
    };
    assert_eq!(ghosts("other").await.as_deref(), Some("2"), "the other table is untouched");
    writes(&mut source, "items", 1).await;
    converge(&mut source, &sink, &mut runners, "items", "streaming after the reset").await;

    // While the runner runs.
    runners.reset(&[&source.qualified("other")]);
    converge(&mut source, &sink, &mut runners, "other", "after reset --table while running").await;
    runners.assert_alive("after the resets");
    runners.delete();
    sink.cleanup().await;
    source.cleanup().await;
}

/// Positions of a domain the source has left: far above what the stack's
/// servers write (the sink stores them as signed 64-bit integers).
const OLD_DOMAIN: i64 = 1 << 60;

/// Creates `topic` with `partitions` partitions before the runner does.
async fn create_topic(topic: &str, partitions: i32) {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    let admin: AdminClient<rdkafka::client::DefaultClientContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", kafka_bootstrap())
        .create()
        .expect("admin client");
    let results = admin
        .create_topics(&[NewTopic::new(topic, partitions, TopicReplication::Fixed(1))], &AdminOptions::new())
        .await
        .expect("create topic");
    for r in results {
        r.expect("topic created");
    }
}

/// Rewrites the last checkpoint of the source runner `name` in its offsets
/// topic (the runner stopped) with `edit`.
async fn rewrite_checkpoint(name: &str, edit: impl FnOnce(&mut serde_json::Value)) {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    use rdkafka::Message;
    let topic = format!("{name}.tributary.offsets");
    let consumer: BaseConsumer = tributary_tests::committed_reader("checkpoint").create().expect("consumer");
    let (_, high) = consumer
        .fetch_watermarks(&topic, 0, Duration::from_secs(10))
        .expect("watermarks");
    let mut tpl = rdkafka::TopicPartitionList::new();
    tpl.add_partition_offset(&topic, 0, rdkafka::Offset::Beginning)
        .expect("partition");
    consumer.assign(&tpl).expect("assign");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut last = None;
    loop {
        let at = consumer
            .position()
            .ok()
            .and_then(|p| p.find_partition(&topic, 0)?.offset().to_raw())
            .unwrap_or(-1);
        if at >= high {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "could not read the offsets topic {topic}");
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) {
            if m.key() == Some(name.as_bytes()) {
                last = m.payload().map(<[u8]>::to_vec);
            }
        }
    }
    let mut checkpoint: serde_json::Value =
        serde_json::from_slice(&last.expect("a checkpoint in the offsets topic")).expect("checkpoint JSON");
    edit(&mut checkpoint);
    let value = serde_json::to_vec(&checkpoint).expect("JSON");
    let producer: BaseProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", kafka_bootstrap())
        .create()
        .expect("producer");
    producer
        .send(BaseRecord::to(&topic).partition(0).key(name).payload(&value))
        .map_err(|(e, _)| e)
        .expect("produce");
    producer.flush(Duration::from_secs(10)).expect("flush");
}

/// A few writes: two new rows naming only the columns every step keeps
/// (the rest of their columns take the table's defaults), an update of an
/// old row, a delete, and values written into every column the steps
/// added (or renamed) in one old and one new row.
async fn writes(source: &mut Source, table: &str, round: i64) {
    let t = source.qualified(table);
    let base = 1000 + round * 10;
    let mut sql = format!(
        "INSERT INTO {t} (id, a, n, v) VALUES ({base}, {round}, {round}.25, 'r{round}'), ({}, {}, NULL, NULL); \
         UPDATE {t} SET a = a + 100 WHERE id = {}; DELETE FROM {t} WHERE id = {}",
        base + 1,
        round + 1,
        1 + round,
        40 - round
    );
    let added: Vec<String> = source
        .columns(table)
        .await
        .into_iter()
        .filter(|c| !["id", "a", "b", "n", "v"].contains(&c.as_str()))
        .map(|c| {
            if c == "f" {
                format!("f = 'w{round}'")
            } else {
                format!("{c} = {}", 50 + round)
            }
        })
        .collect();
    if !added.is_empty() {
        sql.push_str(&format!("; UPDATE {t} SET {} WHERE id IN ({base}, {})", added.join(", "), 20 + round));
    }
    source.sql(&sql).await;
}

async fn assert_gone(sink: &Sink, table: &str, step: &Step) {
    if let Some(column) = step.gone {
        assert!(
            !sink.has_column(table, column).await,
            "{table}: the destination still has column {column} after step {:?}",
            step.name
        );
    }
}

async fn matrix(source_kind: SourceKind, sink_kind: SinkKind) {
    let mut source = Source::new(source_kind, "ddl").await;
    let sink = Sink::new(sink_kind, "ddl").await;
    let tables = ["items", "items_killed"];
    for table in tables {
        let t = source.qualified(table);
        let mut rows = Vec::new();
        for id in 1..=40 {
            rows.push(format!("({id}, {id}, 'b{id}', {id}.50, 'v{id}')"));
        }
        source
            .sql(&format!(
                "CREATE TABLE {t} (id int PRIMARY KEY, a int NOT NULL, b text, n numeric(8,2), v varchar(10)); \
                 INSERT INTO {t} (id, a, b, n, v) VALUES {}",
                rows.join(", ")
            ))
            .await;
    }
    let mut runners = Runners::new(&source, &sink);
    runners.source.start();
    runners.sink.start();
    for table in tables {
        converge(&mut source, &sink, &mut runners, table, "snapshot").await;
    }

    let mut round = 0;
    for step in STEPS {
        let ddl = match source.kind() {
            SourceKind::Postgres => step.postgres,
            SourceKind::MariaDb => step.mariadb,
        };
        let Some(ddl) = ddl else { continue };
        round += 1;
        eprintln!("{source_kind:?} -> {sink_kind:?}: {}", step.name);
        // The first table: the change while everything runs.
        source.sql(&ddl.replace("{t}", &source.qualified("items"))).await;
        writes(&mut source, "items", round).await;
        converge(&mut source, &sink, &mut runners, "items", step.name).await;
        assert_gone(&sink, "items", step).await;
        // The second: the source is killed right after the change and the
        // writes, and replays them from its last checkpoint.
        source.sql(&ddl.replace("{t}", &source.qualified("items_killed"))).await;
        writes(&mut source, "items_killed", round).await;
        tokio::time::sleep(Duration::from_millis(150)).await;
        runners.source.kill9();
        runners.source.start();
        converge(&mut source, &sink, &mut runners, "items_killed", step.name).await;
        assert_gone(&sink, "items_killed", step).await;
    }
    // RENAME TABLE: the new name is copied again (its rows were written
    // under the old one) and streams; live, then with a kill right after.
    round += 1;
    for (table, kill) in [("items", false), ("items_killed", true)] {
        let renamed = format!("{table}_r");
        let ddl = match source.kind() {
            SourceKind::Postgres => format!("ALTER TABLE {} RENAME TO {renamed}", source.qualified(table)),
            SourceKind::MariaDb => {
                format!("RENAME TABLE {} TO {}", source.qualified(table), source.qualified(&renamed))
            }
        };
        eprintln!("{source_kind:?} -> {sink_kind:?}: RENAME TABLE {table} TO {renamed}");
        source.sql(&ddl).await;
        writes(&mut source, &renamed, round).await;
        if kill {
            tokio::time::sleep(Duration::from_millis(150)).await;
            runners.source.kill9();
            runners.source.start();
        }
        converge(&mut source, &sink, &mut runners, &renamed, "RENAME TABLE").await;
    }
    runners.assert_alive("at the end");
    runners.delete();
    sink.cleanup().await;
    source.cleanup().await;
}

/// A table created while a transaction stays open elsewhere on the source
/// (idle in transaction): PostgreSQL makes the slot its copy needs only
/// once that transaction ends. The source says so, with who it waits for
/// (pid, role, state, age; never a statement), and copies the table after
/// the commit.
#[tokio::test]
async fn a_copy_held_back_by_an_open_transaction_says_who_holds_it() {
    let mut source = Source::new(SourceKind::Postgres, "slotwait").await;
    let sink = Sink::new(SinkKind::Postgres, "slotwait").await;
    source
        .sql(&format!(
            "CREATE TABLE {} (id int PRIMARY KEY, a int); INSERT INTO {0} VALUES (1, 1)",
            source.qualified("first")
        ))
        .await;
    let mut runners = Runners::new(&source, &sink);
    runners.source.start();
    runners.sink.start();
    converge(&mut source, &sink, &mut runners, "first", "snapshot").await;
    // A transaction with an id, left open in a session of its own.
    let holder = tributary_tests::postgres::connect(&tributary_tests::pg_source_url()).await;
    holder
        .batch_execute(&format!("BEGIN; INSERT INTO {} VALUES (2, 2)", source.qualified("first")))
        .await
        .expect("open a transaction");
    source
        .sql(&format!(
            "CREATE TABLE {} (id int PRIMARY KEY, a int); INSERT INTO {0} VALUES (1, 10)",
            source.qualified("later")
        ))
        .await;
    let said = tributary_tests::wait_for(
        "the source says its copy waits for an open transaction",
        Duration::from_secs(90),
        || {
            let log = std::fs::read_to_string(&runners.source.log).unwrap_or_default();
            async move {
                log.lines()
                    .find(|l| {
                        l.contains("waits for the transactions open at the source") && l.contains("idle in transaction")
                    })
                    .map(str::to_string)
            }
        },
    )
    .await;
    assert!(!said.contains("INSERT"), "the waiting transaction's statement is never logged: {said}");
    holder.batch_execute("COMMIT").await.expect("commit");
    converge(&mut source, &sink, &mut runners, "later", "after the commit").await;
    converge(&mut source, &sink, &mut runners, "first", "after the commit").await;
    runners.assert_alive("at the end");
    runners.delete();
    sink.cleanup().await;
    source.cleanup().await;
}

//! Names and sizes Kafka refuses, through the real stack: a table whose
//! name is no legal topic name is copied under a legal topic into a
//! destination table of its real name, and a record larger than its topic
//! accepts pauses the source with an error that names the record's size,
//! its table and the settings to raise, instead of retrying for ever or
//! exiting.
//!
//! Real PostgreSQL, Kafka and registry; the `source-runner` and
//! `sink-runner` binaries.

use std::process::Command;
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, AlterConfig, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::ClientConfig;
use tributary_schemas::{TableId, TopicNaming};
use tributary_tests::{
    free_port, kafka_bootstrap, pg_destination_url, pg_source_url, runner_binary, schema_registry_url, unique,
    wait_for, Runner,
};

async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.expect("connect");
    tokio::spawn(conn);
    client
}

fn source_config(name: &str, admin: &str) -> String {
    format!(
        "name = \"{name}\"\nschema_registry_url = \"{registry}\"\n[kafka]\nbootstrap_servers = \"{kafka}\"\n\
         [admin]\nlisten = \"{admin}\"\n[postgres]\nurl = \"{url}\"\nslot_name = \"{name}\"\n\
         publication_name = \"{name}\"\ninclude = [\"{name}.*\"]\nheartbeat_interval_ms = 500\n",
        registry = schema_registry_url(),
        kafka = kafka_bootstrap(),
        url = pg_source_url(),
    )
}

fn topics() -> Vec<String> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", kafka_bootstrap())
        .create()
        .expect("metadata client");
    consumer
        .fetch_metadata(None, Duration::from_secs(10))
        .map(|m| m.topics().iter().map(|t| t.name().to_string()).collect())
        .unwrap_or_default()
}

fn delete_source_copy(config: &std::path::Path) {
    let _ = Command::new(runner_binary("source-runner"))
        .arg("--config")
        .arg(config)
        .args(["delete", "--yes"])
        .status();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tables_kafka_cannot_name_are_copied_to_tables_of_their_own_names() {
    let name = unique("names");
    let odd = "order items$2";
    let src = connect(&pg_source_url()).await;
    src.batch_execute(&format!(
        "CREATE SCHEMA {name};
         CREATE TABLE {name}.ok (id int PRIMARY KEY, v text);
         CREATE TABLE {name}.\"{odd}\" (id int PRIMARY KEY, v text);
         INSERT INTO {name}.ok SELECT i, 'ok ' || i FROM generate_series(1, 5) i;
         INSERT INTO {name}.\"{odd}\" SELECT i, 'odd ' || i FROM generate_series(1, 7) i;"
    ))
    .await
    .expect("source tables");

    let dir = std::env::temp_dir().join(&name);
    std::fs::create_dir_all(&dir).expect("dir");
    let source_cfg = dir.join("source.toml");
    std::fs::write(&source_cfg, source_config(&name, "off")).expect("source config");
    let sink_cfg = dir.join("sink.toml");
    std::fs::write(
        &sink_cfg,
        format!(
            "prefix = \"{name}\"\nconsumer_group = \"{name}_sink\"\nschema_registry_url = \"{registry}\"\n\
             batch_linger_ms = 100\n[kafka]\nbootstrap_servers = \"{kafka}\"\n\
             [kafka.properties]\n\"topic.metadata.refresh.interval.ms\" = \"1000\"\n\
             \"session.timeout.ms\" = \"6000\"\n\"heartbeat.interval.ms\" = \"1000\"\n\
             [admin]\nlisten = \"off\"\n[postgres]\nurl = \"{pg}\"\ndrop_tables = true\n",
            registry = schema_registry_url(),
            kafka = kafka_bootstrap(),
            pg = pg_destination_url(),
        ),
    )
    .expect("sink config");
    let log = dir.join("runners.log");
    let source = Runner::start("source-runner", &source_cfg, &log);
    let sink = Runner::start("sink-runner", &sink_cfg, &log);

    let dst = connect(&pg_destination_url()).await;
    let count = |table: String| {
        let dst = &dst;
        let name = name.clone();
        async move {
            dst.query_one(&format!("SELECT count(*) FROM \"{name}\".\"{table}\""), &[])
                .await
                .ok()
                .map(|r| r.get::<_, i64>(0))
        }
    };
    // Both tables, each into the destination table of its own name.
    wait_for("both tables' snapshots in the destination", Duration::from_secs(120), || async {
        (count("ok".into()).await == Some(5) && count(odd.into()).await == Some(7)).then_some(())
    })
    .await;
    src.batch_execute(&format!("INSERT INTO {name}.\"{odd}\" VALUES (8, 'streamed')"))
        .await
        .expect("insert");
    wait_for("the streamed row in the destination", Duration::from_secs(60), || async {
        (count(odd.into()).await == Some(8)).then_some(())
    })
    .await;
    let v: String = dst
        .query_one(&format!("SELECT v FROM \"{name}\".\"{odd}\" WHERE id = 8"), &[])
        .await
        .expect("row")
        .get(0);
    assert_eq!(v, "streamed");

    // The topics: the legal name as it was, the other made legal.
    let naming = TopicNaming::default();
    let ok_topic = naming.topic(&name, &TableId::new(&name, "ok"));
    let odd_topic = naming.topic(&name, &TableId::new(&name, odd));
    assert_eq!(ok_topic, format!("{name}.{name}.ok"));
    assert!(odd_topic.starts_with(&format!("{name}.{name}.order_items_2_")), "{odd_topic}");
    let present = topics();
    assert!(present.contains(&ok_topic) && present.contains(&odd_topic), "{present:?}");

    // A drop of the oddly named table reaches the table of that name (the
    // control record names it; the topic's name does not).
    src.batch_execute(&format!("DROP TABLE {name}.\"{odd}\"")).await.expect("drop");
    wait_for("the dropped table gone from the destination", Duration::from_secs(60), || async {
        count(odd.into()).await.is_none().then_some(())
    })
    .await;
    assert_eq!(count("ok".into()).await, Some(5), "the other table stays");

    drop(source);
    drop(sink);
    // The killed sink's group member lingers until its session times out.
    let sink_bin = runner_binary("sink-runner");
    wait_for("sink-runner delete to succeed", Duration::from_secs(60), || async {
        let out = Command::new(&sink_bin)
            .arg("--config")
            .arg(&sink_cfg)
            .args(["delete", "--yes"])
            .output()
            .ok()?;
        out.status.success().then_some(())
    })
    .await;
    delete_source_copy(&source_cfg);
    let _ = dst.batch_execute(&format!("DROP SCHEMA IF EXISTS \"{name}\" CASCADE")).await;
    let _ = src.batch_execute(&format!("DROP SCHEMA IF EXISTS {name} CASCADE")).await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_larger_than_its_topic_takes_pauses_the_source_naming_it() {
    let name = unique("big");
    let src = connect(&pg_source_url()).await;
    // About 320 kB of hex that lz4 cannot shrink below the topic's limit.
    src.batch_execute(&format!(
        "CREATE SCHEMA {name};
         CREATE TABLE {name}.big (id int PRIMARY KEY, v text);
         INSERT INTO {name}.big SELECT 1, string_agg(md5(random()::text), '') FROM generate_series(1, 10000);"
    ))
    .await
    .expect("source table");
    // The table's topic exists already, with a small max.message.bytes.
    let topic = format!("{name}.{name}.big");
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", kafka_bootstrap())
        .create()
        .expect("admin client");
    let created = admin
        .create_topics(
            &[NewTopic::new(&topic, 1, TopicReplication::Fixed(1)).set("max.message.bytes", "100000")],
            &AdminOptions::new(),
        )
        .await
        .expect("create topic");
    assert!(created.iter().all(|r| r.is_ok()), "{created:?}");

    let dir = std::env::temp_dir().join(&name);
    std::fs::create_dir_all(&dir).expect("dir");
    let config = dir.join("source.toml");
    let port = free_port();
    std::fs::write(&config, source_config(&name, &format!("127.0.0.1:{port}"))).expect("config");
    let log = dir.join("source.log");
    let mut source = Runner::start("source-runner", &config, &log);
    let base = format!("http://127.0.0.1:{port}");
    let status = || async {
        let text = reqwest::get(format!("{base}/status")).await.ok()?.text().await.ok()?;
        serde_json::from_str::<serde_json::Value>(&text).ok()
    };

    let table = format!("{name}.big");
    let reason = wait_for("the source paused on the large record", Duration::from_secs(120), || async {
        let s = status().await?;
        let reason = s["paused"].as_str()?.to_string();
        reason.contains("max.message.bytes").then_some(reason)
    })
    .await;
    println!("paused: {reason}");
    assert!(!reason.starts_with("retrying"), "an operator's problem, not a retry: {reason}");
    for part in [
        "table ".to_string() + &table,
        "bytes".into(),
        topic.clone(),
        "message.max.bytes".into(),
    ] {
        assert!(reason.contains(&part), "{part:?} missing from the reason: {reason}");
    }
    // It stays paused (probing), neither exiting nor moving on.
    tokio::time::sleep(Duration::from_secs(7)).await;
    assert!(
        source.exited().is_none(),
        "the source exited:\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    let s = status().await.expect("status");
    assert!(s["paused"].as_str().is_some_and(|r| r.contains("max.message.bytes")), "{s}");
    assert!(
        s["tables"][&table]["last_error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("bytes")),
        "the table's status names the error: {s}"
    );
    assert_eq!(s["tables"][&table]["events"].as_u64().unwrap_or(0), 0);

    // Raising the topic's limit is the fix: the source resumes by itself.
    let alter = AlterConfig::new(ResourceSpecifier::Topic(&topic)).set("max.message.bytes", "2000000");
    let altered = admin.alter_configs(&[alter], &AdminOptions::new()).await.expect("alter topic");
    assert!(altered.iter().all(|r| r.is_ok()), "{altered:?}");
    wait_for("the large record produced after the fix", Duration::from_secs(60), || async {
        let s = status().await?;
        (s["paused"].is_null() && s["tables"][&table]["events"].as_u64()? >= 1).then_some(())
    })
    .await;

    drop(source);
    delete_source_copy(&config);
    let _ = src.batch_execute(&format!("DROP SCHEMA IF EXISTS {name} CASCADE")).await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// The topics Kafka holds that start with `start`.
fn topics_starting(start: &str) -> Vec<String> {
    let mut t: Vec<String> = topics().into_iter().filter(|t| t.starts_with(start)).collect();
    t.sort();
    t
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_touches_only_its_own_topics_beside_a_copy_whose_prefix_extends_its_own() {
    // Copy `p` (schema `p`) and copy `p.x` (schema `p_b`, topics `p.x.p_b.*`):
    // every topic of `p.x` starts with `p.`.
    let name = unique("nest");
    let other = format!("{name}_x");
    let other_schema = format!("{name}_b");
    let odd = "odd name";
    let src = connect(&pg_source_url()).await;
    src.batch_execute(&format!(
        "CREATE SCHEMA {name}; CREATE SCHEMA {other_schema};
         CREATE TABLE {name}.t (id int PRIMARY KEY, v text);
         CREATE TABLE {name}.dlq (id int PRIMARY KEY, v text);
         CREATE TABLE {name}.\"{odd}\" (id int PRIMARY KEY, v text);
         CREATE TABLE {other_schema}.t (id int PRIMARY KEY, v text);
         INSERT INTO {name}.t SELECT i, 't ' || i FROM generate_series(1, 3) i;
         INSERT INTO {name}.dlq SELECT i, 'dlq ' || i FROM generate_series(1, 4) i;
         INSERT INTO {name}.\"{odd}\" SELECT i, 'odd ' || i FROM generate_series(1, 2) i;
         INSERT INTO {other_schema}.t SELECT i, 'other ' || i FROM generate_series(1, 5) i;"
    ))
    .await
    .expect("source tables");

    let dir = std::env::temp_dir().join(&name);
    std::fs::create_dir_all(&dir).expect("dir");
    let source_cfg = dir.join("source.toml");
    std::fs::write(&source_cfg, source_config(&name, "off")).expect("source config");
    let other_cfg = dir.join("other.toml");
    let other_text = source_config(&other, "off")
        .replacen('\n', &format!("\ntopic_prefix = \"{name}.x\"\n"), 1)
        .replace(&format!("include = [\"{other}.*\"]"), &format!("include = [\"{other_schema}.*\"]"));
    std::fs::write(&other_cfg, other_text).expect("other source config");
    let log = dir.join("runners.log");
    let other_source = Runner::start("source-runner", &other_cfg, &log);
    let source = Runner::start("source-runner", &source_cfg, &log);
    let other_topic = format!("{name}.x.{other_schema}.t");
    let other_offsets = format!("{name}.x.tributary.offsets");
    wait_for("both copies' topics", Duration::from_secs(120), || async {
        let present = topics();
        (present.contains(&other_topic)
            && present.contains(&format!("{name}.{name}.t"))
            && present.contains(&format!("{name}.{name}.dlq")))
        .then_some(())
    })
    .await;

    // The sink of copy `p`, started once copy `p.x`'s topic exists.
    let sink_cfg = dir.join("sink.toml");
    std::fs::write(
        &sink_cfg,
        format!(
            "prefix = \"{name}\"\nconsumer_group = \"{name}_sink\"\nschema_registry_url = \"{registry}\"\n\
             batch_linger_ms = 100\n[kafka]\nbootstrap_servers = \"{kafka}\"\n\
             [kafka.properties]\n\"topic.metadata.refresh.interval.ms\" = \"1000\"\n\
             \"session.timeout.ms\" = \"6000\"\n\"heartbeat.interval.ms\" = \"1000\"\n\
             [admin]\nlisten = \"off\"\n[postgres]\nurl = \"{pg}\"\n",
            registry = schema_registry_url(),
            kafka = kafka_bootstrap(),
            pg = pg_destination_url(),
        ),
    )
    .expect("sink config");
    let sink = Runner::start("sink-runner", &sink_cfg, &log);
    let dst = connect(&pg_destination_url()).await;
    let count = |schema: String, table: String| {
        let dst = &dst;
        async move {
            dst.query_one(&format!("SELECT count(*) FROM \"{schema}\".\"{table}\""), &[])
                .await
                .ok()
                .map(|r| r.get::<_, i64>(0))
        }
    };
    // A source table named `dlq` is copied like any other, snapshot and stream.
    wait_for("copy p's tables in the destination", Duration::from_secs(120), || async {
        (count(name.clone(), "t".into()).await == Some(3)
            && count(name.clone(), "dlq".into()).await == Some(4)
            && count(name.clone(), odd.into()).await == Some(2))
        .then_some(())
    })
    .await;
    src.batch_execute(&format!("INSERT INTO {name}.dlq VALUES (5, 'streamed')"))
        .await
        .expect("insert");
    wait_for("the streamed row of table dlq", Duration::from_secs(60), || async {
        (count(name.clone(), "dlq".into()).await == Some(5)).then_some(())
    })
    .await;
    // Copy p's sink never consumed copy p.x's topic: no table, no offsets.
    assert_eq!(count(other_schema.clone(), "t".into()).await, None, "copy p.x's table was copied by p's sink");
    let stored: Vec<String> = dst
        .query(
            "SELECT DISTINCT topic FROM tributary.offsets WHERE consumer_group = $1 ORDER BY topic",
            &[&format!("{name}_sink")],
        )
        .await
        .expect("offsets")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(
        stored.iter().all(|t| !t.starts_with(&format!("{name}.x."))),
        "p's sink consumed p.x's topics: {stored:?}"
    );

    // `delete` of copy p: its topics and destination tables, nothing of p.x.
    drop(sink);
    drop(source);
    let sink_bin = runner_binary("sink-runner");
    wait_for("sink-runner delete --drop-destination to succeed", Duration::from_secs(60), || async {
        let out = Command::new(&sink_bin)
            .arg("--config")
            .arg(&sink_cfg)
            .args(["delete", "--yes", "--drop-destination"])
            .output()
            .ok()?;
        out.status.success().then_some(())
    })
    .await;
    for table in ["t", "dlq", odd] {
        assert_eq!(count(name.clone(), table.into()).await, None, "destination table {table} left");
    }
    delete_source_copy(&source_cfg);
    let left = topics_starting(&format!("{name}."));
    assert!(left.contains(&other_topic) && left.contains(&other_offsets), "copy p.x's topics deleted: {left:?}");
    assert!(
        left.iter().all(|t| t.starts_with(&format!("{name}.x."))),
        "copy p's topics left after its delete: {left:?}"
    );

    drop(other_source);
    delete_source_copy(&other_cfg);
    let _ = dst
        .batch_execute(&format!(
            "DROP SCHEMA IF EXISTS \"{name}\" CASCADE; DROP SCHEMA IF EXISTS \"{other_schema}\" CASCADE"
        ))
        .await;
    let _ = src
        .batch_execute(&format!("DROP SCHEMA IF EXISTS {name} CASCADE; DROP SCHEMA IF EXISTS {other_schema} CASCADE"))
        .await;
    let _ = std::fs::remove_dir_all(&dir);
}

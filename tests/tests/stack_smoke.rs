//! Proves the local stack is real, with the crates the runners use: Kafka
//! transactions (commit and abort) seen through `read_committed`, the schema
//! registry through `schema_registry_converter`, PostgreSQL and MariaDB with
//! their replication settings, and the docker-compose file through a compose
//! validator.
//!
//! Needs `scripts/stack up`; endpoints come from `scripts/stack env`.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{ClientConfig, Message};
use schema_registry_converter::async_impl::schema_registry::{get_schema_by_id, post_schema, SrSettings};
use schema_registry_converter::schema_registry_common::{SchemaType, SuppliedSchema};

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

fn bootstrap() -> String {
    env_or("KAFKA_BOOTSTRAP", "127.0.0.1:9092")
}

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

#[test]
fn kafka_read_committed_sees_only_committed_transactions() {
    let topic = unique("smoke-txn");
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("transactional.id", unique("smoke-txn-producer"))
        .create()
        .expect("create transactional producer");
    producer.init_transactions(Duration::from_secs(30)).expect("init_transactions");

    producer.begin_transaction().expect("begin committed txn");
    for i in 0..3 {
        let payload = format!("committed-{i}");
        producer
            .send(BaseRecord::<str, str>::to(&topic).key("k").payload(&payload))
            .map_err(|(e, _)| e)
            .expect("send committed");
    }
    producer.commit_transaction(Duration::from_secs(30)).expect("commit");

    producer.begin_transaction().expect("begin aborted txn");
    for i in 0..3 {
        let payload = format!("aborted-{i}");
        producer
            .send(BaseRecord::<str, str>::to(&topic).key("k").payload(&payload))
            .map_err(|(e, _)| e)
            .expect("send aborted");
    }
    producer.flush(Duration::from_secs(30)).expect("flush aborted records");
    producer.abort_transaction(Duration::from_secs(30)).expect("abort");

    // A third, committed transaction after the aborted one proves the
    // consumer read past the aborted records rather than stopping early.
    producer.begin_transaction().expect("begin final txn");
    producer
        .send(BaseRecord::<str, str>::to(&topic).key("k").payload("committed-last"))
        .map_err(|(e, _)| e)
        .expect("send final");
    producer.commit_transaction(Duration::from_secs(30)).expect("commit final");

    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("group.id", unique("smoke-reader"))
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", "read_committed")
        .create()
        .expect("create consumer");
    consumer.subscribe(&[&topic]).expect("subscribe");
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !seen.iter().any(|s: &String| s == "committed-last") {
        assert!(Instant::now() < deadline, "timed out; saw {seen:?}");
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(500)) {
            seen.push(String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned());
        }
    }
    assert_eq!(
        seen,
        vec!["committed-0", "committed-1", "committed-2", "committed-last"],
        "read_committed must see exactly the committed records, in order"
    );
}

#[tokio::test]
async fn schema_registry_registers_and_reads_back_by_id() {
    let url = env_or("SCHEMA_REGISTRY_URL", "http://127.0.0.1:8081/apis/ccompat/v7");
    let settings = SrSettings::new(url);
    let subject = unique("smoke-value");
    let schema = r#"{"type":"record","name":"Smoke","namespace":"tributary.smoke","fields":[{"name":"id","type":"long"},{"name":"note","type":["null","string"],"default":null}]}"#;
    let supplied = SuppliedSchema::new(Some("tributary.smoke.Smoke".into()), SchemaType::Avro, schema.to_string());
    let registered = post_schema(&settings, subject.clone(), supplied.clone())
        .await
        .expect("register schema");
    let again = post_schema(&settings, subject, supplied)
        .await
        .expect("register the same schema again");
    assert_eq!(registered.id, again.id, "the same schema must keep its id");

    let fetched = get_schema_by_id(registered.id, &settings).await.expect("read schema by id");
    let parsed = apache_avro::Schema::parse_str(&fetched.schema).expect("registry returns valid Avro");
    let expected = apache_avro::Schema::parse_str(schema).expect("our schema is valid");
    assert_eq!(parsed.canonical_form(), expected.canonical_form());
}

#[tokio::test]
async fn postgres_is_ready_for_logical_replication() {
    let url = env_or("PG_SOURCE_URL", "postgres://tributary:tributary@127.0.0.1:5432/source");
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .expect("connect to the source database");
    tokio::spawn(connection);
    let row = client.query_one("SHOW wal_level", &[]).await.expect("SHOW wal_level");
    assert_eq!(row.get::<_, String>(0), "logical");
    let row = client
        .query_one("SELECT rolreplication FROM pg_roles WHERE rolname = current_user", &[])
        .await
        .expect("role attributes");
    assert!(row.get::<_, bool>(0), "the stack's role must have REPLICATION");
    let dest = env_or("PG_DESTINATION_URL", "postgres://tributary:tributary@127.0.0.1:5432/destination");
    let (dest_client, dest_conn) = tokio_postgres::connect(&dest, tokio_postgres::NoTls)
        .await
        .expect("connect to the destination database");
    tokio::spawn(dest_conn);
    let row = dest_client.query_one("SELECT current_database()", &[]).await.expect("query");
    assert_eq!(row.get::<_, String>(0), "destination");
}

#[tokio::test]
async fn mariadb_writes_a_full_row_binlog() {
    use mysql_async::prelude::Queryable;
    let url = env_or("MYSQL_URL", "mysql://tributary:tributary@127.0.0.1:3306/source");
    let pool = mysql_async::Pool::new(url.as_str());
    let mut conn = pool.get_conn().await.expect("connect to MariaDB");
    let vars: Vec<(String, String)> = conn
        .query("SHOW VARIABLES WHERE Variable_name IN ('log_bin','binlog_format','binlog_row_image','binlog_row_metadata')")
        .await
        .expect("SHOW VARIABLES");
    let vars: BTreeSet<(String, String)> = vars.into_iter().collect();
    for expected in [
        ("log_bin", "ON"),
        ("binlog_format", "ROW"),
        ("binlog_row_image", "FULL"),
        ("binlog_row_metadata", "FULL"),
    ] {
        assert!(
            vars.contains(&(expected.0.to_string(), expected.1.to_string())),
            "expected {expected:?} in {vars:?}"
        );
    }
    drop(conn);
    pool.disconnect().await.expect("disconnect");
}

#[test]
fn docker_compose_file_is_valid() {
    let root = tributary_tests::workspace_dir();
    let status = std::process::Command::new("docker-compose")
        .args(["-f", "docker-compose.yml", "config", "-q"])
        .current_dir(root)
        .status();
    match status {
        Ok(s) => assert!(s.success(), "docker-compose config rejected docker-compose.yml"),
        // scripts/install (run by scripts/test) installs Debian's
        // docker-compose; without it, say how to get it.
        Err(e) => panic!("docker-compose is not installed ({e}): scripts/install, or apt-get install docker-compose"),
    }
}

/// What docker-compose.yml names exists, and agrees with the rest: every
/// file it mounts and builds from is in the repository; its runners' config
/// files are the demo's with this network's host names; its published ports
/// are the stack's.
#[test]
fn docker_compose_names_what_the_repository_has() {
    let root = tributary_tests::workspace_dir();
    let text = std::fs::read_to_string(root.join("docker-compose.yml")).expect("docker-compose.yml");
    for line in text.lines().map(str::trim) {
        // `- ./host/path:/container/path[:ro]` and `build: .`
        if let Some(path) = line.strip_prefix("- ./").and_then(|v| v.split(':').next()) {
            assert!(root.join(path).exists(), "docker-compose.yml mounts ./{path}, which is not in the repository");
        }
    }
    assert!(root.join("Dockerfile").exists());
    // The runners' files: the demo's, but for endpoints (and the admin
    // server listening in the container with a token).
    let endpoints = ["bootstrap_servers", "schema_registry_url", "url", "listen", "token"];
    let strip = |v: &mut toml::Value| {
        fn walk(v: &mut toml::Value, keys: &[&str]) {
            if let toml::Value::Table(t) = v {
                t.retain(|k, _| !keys.contains(&k));
                for (_, v) in t.iter_mut() {
                    walk(v, keys);
                }
            }
        }
        walk(v, &endpoints);
    };
    for name in ["source-postgres.toml", "sink-postgres.toml"] {
        let read = |p: std::path::PathBuf| -> toml::Value {
            let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            toml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        };
        let (mut demo, mut docker) =
            (read(root.join("examples").join(name)), read(root.join("examples/docker").join(name)));
        strip(&mut demo);
        strip(&mut docker);
        assert_eq!(demo, docker, "examples/docker/{name} differs from examples/{name} in more than endpoints");
        assert!(
            text.contains(&format!("./examples/docker/{name}")),
            "docker-compose.yml uses examples/docker/{name}"
        );
    }
    // Published ports: the stack's defaults, and the runners' admin ports.
    for port in [
        "127.0.0.1:9092:9092",
        "127.0.0.1:8081:8080",
        "127.0.0.1:5432:5432",
        "127.0.0.1:3306:3306",
        "127.0.0.1:8090:8090",
        "127.0.0.1:8091:8091",
    ] {
        assert!(text.contains(port), "docker-compose.yml publishes {port}");
    }
    let stack = std::fs::read_to_string(root.join("scripts/stack")).expect("scripts/stack");
    for default in [
        "TRIBUTARY_KAFKA_PORT:-9092",
        "TRIBUTARY_REGISTRY_PORT:-8081",
        "TRIBUTARY_PG_PORT:-5432",
        "TRIBUTARY_MYSQL_PORT:-3306",
    ] {
        assert!(stack.contains(default), "scripts/stack's default {default}");
    }
}

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
use std::time::Duration;

use tributary_tests::{counters, kafka_bootstrap, pg_source_url, schema_registry_url, unique, wait_for, Rng, Runner};

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
transaction_metadata = true

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
    // The changes of each streamed transaction that changed anything.
    let mut transactions: Vec<usize> = Vec::new();
    for step in 0..160u64 {
        let mut sql = String::from("BEGIN;");
        let before = expected_changes;
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
        if expected_changes > before {
            transactions.push(expected_changes - before);
        }
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
    assert_transaction_topic(&format!("{name}.transaction"), &transactions);

    let identity: String = pg
        .query_one(
            "SELECT relreplident::text FROM pg_class WHERE oid = $1::text::regclass",
            &[&format!("{name}.counters")],
        )
        .await
        .expect("replica identity")
        .get(0);
    assert_eq!(identity, "f", "the runner sets REPLICA IDENTITY FULL where deletes need it");

    tributary_tests::e2e::delete_source_copy(&pg, &config, &name).await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// `transaction_metadata = true`: the transaction topic holds, exactly
/// once across the kills, a BEGIN and then an END of each streamed
/// transaction, whose counts are its changes (`expected`, in order).
fn assert_transaction_topic(topic: &str, expected: &[usize]) {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::Message;
    use tributary_schemas::records::transaction::TransactionRecord;

    let c: BaseConsumer = tributary_tests::committed_reader("transactions").create().expect("consumer");
    c.subscribe(&[topic]).expect("subscribe");
    let until = std::time::Instant::now() + Duration::from_secs(60);
    let mut records = Vec::new();
    while records.len() < 2 * expected.len() && std::time::Instant::now() < until {
        if let Some(Ok(m)) = c.poll(Duration::from_millis(200)) {
            let value = m.payload().expect("a value");
            records.push(TransactionRecord::decode_value(value).expect("a transaction record"));
        }
    }
    assert_eq!(records.len(), 2 * expected.len(), "a BEGIN and an END per transaction: {records:?}");
    // Per transaction (keyed by its id: one partition, in order).
    let mut by_id: std::collections::BTreeMap<&str, Vec<&TransactionRecord>> = Default::default();
    for r in &records {
        by_id.entry(r.id()).or_default().push(r);
    }
    let mut counts: Vec<usize> = by_id
        .values()
        .map(|pair| match pair.as_slice() {
            [TransactionRecord::Begin { .. }, TransactionRecord::End { data_collections, .. }] => {
                data_collections.iter().map(|(_, n)| *n as usize).sum()
            }
            _ => panic!("not one BEGIN then its END: {pair:?}"),
        })
        .collect();
    counts.sort_unstable();
    let mut want = expected.to_vec();
    want.sort_unstable();
    assert_eq!(counts, want, "each END counts its transaction's changes");
}

/// Issue #23: the source runner's checkpoint and the PostgreSQL slot, in
/// process against the real PostgreSQL and Kafka.
mod checkpoint {
    use std::time::Duration;

    use rdkafka::admin::{AdminClient, AdminOptions, AlterConfig, NewTopic, ResourceSpecifier, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    use rdkafka::ClientConfig;
    use source_runner::config::SourceRunnerConfig;
    use tributary_connectors::sources::postgres::PostgresSource;
    use tributary_operations::admin::Control;
    use tributary_operations::telemetry::Telemetry;
    use tributary_tests::postgres::SourceSchema;
    use tributary_tests::{kafka_bootstrap, schema_registry_url, unique, wait_for};

    fn admin() -> AdminClient<DefaultClientContext> {
        ClientConfig::new()
            .set("bootstrap.servers", kafka_bootstrap())
            .create()
            .expect("admin")
    }

    struct Setup {
        fx: SourceSchema,
        name: String,
        config: SourceRunnerConfig,
    }

    async fn setup(test: &str) -> Setup {
        let fx = SourceSchema::new(test).await;
        fx.exec(&format!(
            "CREATE TABLE {s}.items (id int PRIMARY KEY, note text); \
             INSERT INTO {s}.items SELECT i, 'n' || i FROM generate_series(1, 3) i;",
            s = fx.schema
        ))
        .await;
        let name = unique(test);
        let config: SourceRunnerConfig = tributary_operations::config::parse(
            &format!(
                "name = \"{name}\"\nschema_registry_url = \"{}\"\n[admin]\nlisten = \"off\"\n[kafka]\n\
                 bootstrap_servers = \"{}\"\n[postgres]\nurl = \"postgres://unused@127.0.0.1:1/unused\"\n",
                schema_registry_url(),
                kafka_bootstrap()
            ),
            "test",
        )
        .expect("config");
        Setup { fx, name, config }
    }

    type Running = (tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<Result<(), tributary_connectors::Error>>);

    fn run(s: &Setup, telemetry: &Telemetry) -> Running {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let source = Box::new(PostgresSource::new(s.fx.config(), &s.name).expect("source"));
        let config = s.config.clone();
        let telemetry = telemetry.clone();
        let task = tokio::spawn(async move {
            source_runner::run(config, source, telemetry, Control::new(), async {
                let _ = stopped.await;
            })
            .await
        });
        (stop, task)
    }

    async fn stop((stop, task): Running) {
        let _ = stop.send(());
        let _ = task.await.expect("join");
    }

    fn paused(t: &Telemetry) -> Option<String> {
        t.status().paused
    }

    async fn cleanup(s: &Setup) {
        let admin = admin();
        let offsets = s.config.offsets_topic();
        let topic = format!("{}.{}.items", s.name, s.fx.schema);
        let _ = admin
            .delete_topics(&[offsets.as_str(), topic.as_str()], &AdminOptions::new())
            .await;
        s.fx.cleanup().await;
    }

    /// The offsets topic is deleted while the slot stays: the next start is
    /// a needs-operator error with both choices, and the slot is kept (no
    /// silent new snapshot). The second choice, `source-runner reset`, then
    /// copies the table again from the slot.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_lost_checkpoint_with_the_slot_still_there_needs_an_operator() {
        let s = setup("lostckpt").await;
        let label = format!("{}.items", s.fx.schema);
        let telemetry = Telemetry::new(&s.name, "source");
        let running = run(&s, &telemetry);
        wait_for("the snapshot committed", Duration::from_secs(120), || async {
            (telemetry.table(&label).is_some_and(|t| t.events >= 3)).then_some(())
        })
        .await;
        stop(running).await;

        let offsets = s.config.offsets_topic();
        for r in admin()
            .delete_topics(&[offsets.as_str()], &AdminOptions::new())
            .await
            .expect("delete")
        {
            r.expect("offsets topic deleted");
        }
        let telemetry = Telemetry::new(&s.name, "source");
        let running = run(&s, &telemetry);
        let reason = wait_for("the needs-operator pause", Duration::from_secs(60), || async {
            paused(&telemetry).filter(|p| p.contains("has no checkpoint"))
        })
        .await;
        assert!(reason.contains(&format!("replication slot {} exists", s.fx.slot)), "{reason}");
        assert!(reason.contains("restore the runner's offsets topic"), "{reason}");
        assert!(reason.contains("source-runner --config <source.toml> reset"), "{reason}");
        // The slot is still there, and no second snapshot was written.
        let slots =
            s.fx.admin
                .query("SELECT 1 FROM pg_replication_slots WHERE slot_name = $1", &[&s.fx.slot])
                .await
                .expect("slots");
        assert_eq!(slots.len(), 1, "the slot was dropped");
        assert_eq!(telemetry.table(&label).map_or(0, |t| t.events), 0, "a snapshot was taken again");
        stop(running).await;

        // source-runner reset (of every table), then a start: copied again.
        source_runner::commands::reset::record_reset(&s.config, &[])
            .await
            .expect("reset recorded");
        let telemetry = Telemetry::new(&s.name, "source");
        let running = run(&s, &telemetry);
        wait_for("the table copied again after the reset", Duration::from_secs(120), || async {
            (telemetry.table(&label).is_some_and(|t| t.events >= 3)).then_some(())
        })
        .await;
        assert_eq!(paused(&telemetry), None, "not paused after the reset");
        stop(running).await;
        cleanup(&s).await;
    }

    /// An existing offsets topic without cleanup.policy=compact is refused
    /// at start, naming the topic and the kafka-configs command; once it is
    /// compacted the runner goes on by itself.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn an_offsets_topic_that_is_not_compacted_needs_an_operator() {
        let s = setup("ckptpolicy").await;
        let label = format!("{}.items", s.fx.schema);
        let offsets = s.config.offsets_topic();
        let admin = admin();
        let new = NewTopic::new(&offsets, 1, TopicReplication::Fixed(1)).set("cleanup.policy", "delete");
        for r in admin.create_topics(&[new], &AdminOptions::new()).await.expect("create") {
            r.expect("offsets topic created");
        }
        let telemetry = Telemetry::new(&s.name, "source");
        let running = run(&s, &telemetry);
        let reason = wait_for("the needs-operator pause", Duration::from_secs(60), || async {
            paused(&telemetry).filter(|p| p.contains("not compact"))
        })
        .await;
        assert!(reason.contains(&format!("offsets topic {offsets} has cleanup.policy=delete")), "{reason}");
        assert!(
            reason.contains(&format!(
                "--alter --entity-type topics --entity-name {offsets} --add-config cleanup.policy=compact"
            )),
            "{reason}"
        );
        assert_eq!(telemetry.table(&label).map_or(0, |t| t.events), 0, "nothing copied meanwhile");

        let fix = AlterConfig::new(ResourceSpecifier::Topic(&offsets)).set("cleanup.policy", "compact");
        for r in admin.alter_configs(&[fix], &AdminOptions::new()).await.expect("alter") {
            r.expect("altered");
        }
        wait_for("the snapshot after the fix", Duration::from_secs(120), || async {
            (telemetry.table(&label).is_some_and(|t| t.events >= 3)).then_some(())
        })
        .await;
        stop(running).await;
        cleanup(&s).await;
    }

    /// Truncates on every partition of `topic` (0..`total`), as a
    /// `read_committed` consumer sees them.
    async fn truncates_per_partition(topic: &str, total: i32) -> Vec<usize> {
        use rdkafka::consumer::{Consumer, StreamConsumer};
        use rdkafka::{Message, Offset, TopicPartitionList};
        use tributary_schemas::{Decoded, EventDecoder, Op, Registry};
        let consumer: StreamConsumer = tributary_tests::committed_reader("truncparts").create().expect("consumer");
        let mut tpl = TopicPartitionList::new();
        for p in 0..total {
            tpl.add_partition_offset(topic, p, Offset::Beginning).expect("partition");
        }
        consumer.assign(&tpl).expect("assign");
        let mut decoder = EventDecoder::new(Registry::new(schema_registry_url()).expect("registry"));
        let mut counts = vec![0usize; usize::try_from(total).expect("count")];
        // Until the topic has been quiet for 3 s.
        while let Ok(m) = tokio::time::timeout(Duration::from_secs(3), consumer.recv()).await {
            let m = m.expect("record");
            if let Decoded::Change(e) = decoder.decode(topic, m.key(), m.payload()).await.expect("decodes") {
                if e.op == Op::Truncate {
                    counts[usize::try_from(m.partition()).expect("partition")] += 1;
                }
            }
        }
        counts
    }

    /// A truncate goes to every partition of the table's topic, also to
    /// the partitions added while the runner runs. Before 2026-12-03 the
    /// runner asked a topic's partition count once and kept it: a sink
    /// member reading only a new partition never saw the truncate (nor a
    /// table reset, table-copied or table-dropped record, which go the
    /// same way).
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_truncate_reaches_partitions_added_while_the_runner_runs() {
        use rdkafka::admin::NewPartitions;
        let s = setup("truncparts").await;
        let label = format!("{}.items", s.fx.schema);
        let topic = format!("{}.{}.items", s.name, s.fx.schema);
        let telemetry = Telemetry::new(&s.name, "source");
        let running = run(&s, &telemetry);
        wait_for("the snapshot committed", Duration::from_secs(120), || async {
            (telemetry.table(&label).is_some_and(|t| t.events >= 3)).then_some(())
        })
        .await;
        let metadata = admin()
            .inner()
            .fetch_metadata(Some(&topic), Duration::from_secs(10))
            .expect("metadata");
        let before = i32::try_from(metadata.topics()[0].partitions().len()).expect("count");
        let total = before + 2;
        for r in admin()
            .create_partitions(&[NewPartitions::new(&topic, total as usize)], &AdminOptions::new())
            .await
            .expect("create partitions")
        {
            r.expect("partitions added");
        }
        s.fx.exec(&format!("TRUNCATE {}.items", s.fx.schema)).await;
        wait_for("the truncate committed", Duration::from_secs(60), || async {
            (telemetry.table(&label).is_some_and(|t| t.events >= 4)).then_some(())
        })
        .await;
        let counts = truncates_per_partition(&topic, total).await;
        assert_eq!(counts, vec![1; counts.len()], "one truncate on each of the {total} partitions ({before} at first)");
        stop(running).await;
        cleanup(&s).await;
    }
}

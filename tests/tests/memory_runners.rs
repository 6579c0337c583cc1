//! The runners' loops with the reference connectors in memory, against the
//! stack's real Kafka and schema registry: what the runners themselves
//! guarantee, whatever the database. The source runner copies a memory
//! database into a change topic exactly once across a stop and a restart
//! from its checkpoint; the sink runner applies a change topic into a
//! memory destination, dead-letters the record the destination refuses
//! (found by the core's bisection), and resumes from the stored offsets.

use std::time::Duration;

use sink_runner::config::SinkRunnerConfig;
use tokio::sync::watch;
use tributary_connectors::sink::memory::MemoryStore;
use tributary_connectors::source::memory::{MemoryDatabase, MemorySource};
use tributary_connectors::Sink;
use tributary_operations::admin::Control;
use tributary_operations::telemetry::Telemetry;
use tributary_schemas::{Column, DataType, Op, TableId, TableSchema, Value};
use tributary_tests::items::{event, items, key_row, row};
use tributary_tests::kafka::EventTopic;
use tributary_tests::{counters, header, kafka_bootstrap, schema_registry_url, unique, wait_for};

/// A section the config file needs (a runner reads exactly one source or
/// writes to one destination); these tests hand the runner their own
/// connector instead, so nothing ever connects to it.
const UNUSED_POSTGRES: &str = "[postgres]\nurl = \"postgres://unused@127.0.0.1:1/unused\"\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_source_runner_copies_a_memory_database_exactly_once_across_a_restart() {
    let db = MemoryDatabase::new();
    let t = TableId::new("memory", "items");
    db.create_table(TableSchema {
        id: t.clone(),
        columns: vec![
            Column::new("id", DataType::Int32, false),
            Column::new("name", DataType::Text, true),
            Column::new("qty", DataType::Int32, true),
        ],
        key: vec!["id".into()],
        dropped: Vec::new(),
    });
    let r = |id: i32, qty: i32| vec![Value::Int32(id), Value::Text(format!("n{id}")), Value::Int32(qty)];
    db.insert(&t, (1..=500).map(|i| r(i, 0)).collect());
    let name = unique("memsrc");
    let config: source_runner::config::SourceRunnerConfig = tributary_operations::config::parse(
        &format!(
            "name = \"{name}\"\nschema_registry_url = \"{}\"\n[admin]\nlisten = \"off\"\n[kafka]\nbootstrap_servers = \"{}\"\n\
             {UNUSED_POSTGRES}",
            schema_registry_url(),
            kafka_bootstrap()
        ),
        "test",
    )
    .expect("config");
    let seen = counters::collect(format!("{name}.memory.items"), "qty");
    let run = |db: MemoryDatabase, stop: tokio::sync::oneshot::Receiver<()>| {
        let config = config.clone();
        let name = name.clone();
        tokio::spawn(async move {
            let source = Box::new(MemorySource::new(db, &name).with_chunk_rows(100));
            source_runner::runner::run(config, source, Telemetry::new(&name, "source"), Control::new(), async {
                let _ = stop.await;
            })
            .await
        })
    };
    let (stop, stopped) = tokio::sync::oneshot::channel();
    let first = run(db.clone(), stopped);
    wait_for("the snapshot in Kafka", Duration::from_secs(60), || async {
        (seen.lock().unwrap().iter().filter(|s| s.op == Op::Read).count() == 500).then_some(())
    })
    .await;
    for v in 1..=3 {
        for id in 1..=10 {
            db.update(&t, r(id, v)).expect("update");
        }
    }
    wait_for("the first changes", Duration::from_secs(60), || async {
        (counters::changes(&seen.lock().unwrap()) == 30).then_some(())
    })
    .await;
    let _ = stop.send(());
    first.await.expect("join").expect("first run");
    // While it is stopped, the database goes on; the restart resumes from
    // the checkpoint in the offsets topic.
    db.delete(&t, &r(11, 0)).expect("delete");
    db.insert(&t, vec![r(501, 0)]);
    let (stop, stopped) = tokio::sync::oneshot::channel();
    let second = run(db.clone(), stopped);
    for id in 1..=10 {
        db.update(&t, r(id, 4)).expect("update");
    }
    wait_for("every change", Duration::from_secs(60), || async {
        (counters::changes(&seen.lock().unwrap()) >= 42).then_some(())
    })
    .await;
    let _ = stop.send(());
    second.await.expect("join").expect("second run");
    counters::assert_exactly_once(&seen.lock().unwrap(), 500, 42);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_sink_runner_dead_letters_what_a_memory_destination_refuses_and_resumes() {
    let store = MemoryStore::new();
    store.state().refused = Some(Value::Text("REFUSED".into()));
    let mut topic = EventTopic::new("memsink", 2).await;
    let group = unique("memsink");
    let config: SinkRunnerConfig =
        tributary_operations::config::parse(&topic.sink_runner_config(&group, UNUSED_POSTGRES), "test")
            .expect("config");
    let s = items();
    topic
        .produce(
            &(1..=100)
                .map(|i| event(&s, Op::Read, None, Some(row(i, &format!("n{i}"), i, "1.00")), 10, 0))
                .collect::<Vec<_>>(),
        )
        .await;
    topic
        .produce(&[
            event(&s, Op::Update, None, Some(row(1, "one", 1, "1.00")), 11, 0),
            event(&s, Op::Delete, Some(key_row(2)), None, 11, 1),
            event(&s, Op::Update, None, Some(row(3, "REFUSED", 3, "1.00")), 12, 0),
            event(&s, Op::Create, None, Some(row(300, "new", 3, "3.00")), 13, 0),
        ])
        .await;
    let telemetry = Telemetry::new("test", "sink");
    let run = |stop: watch::Receiver<bool>| {
        let sink: Box<dyn Sink> = Box::new(store.sink(&group));
        let labeler = sink.labeler();
        tokio::spawn(sink_runner::run_with_sink(config.clone(), sink, labeler, telemetry.clone(), Control::new(), stop))
    };
    let (stop, stopped) = watch::channel(false);
    let runner = run(stopped);
    let names = || {
        store
            .rows("public.items")
            .iter()
            .map(|r| r.get("name").cloned())
            .collect::<Vec<_>>()
    };
    wait_for("the rows and the dead letter", Duration::from_secs(90), || async {
        (store.rows("public.items").len() == 100 && telemetry.failed_records("public.items") == 1).then_some(())
    })
    .await;
    let rows = store.rows("public.items");
    assert_eq!(rows[0].get("name"), Some(&Value::Text("one".into())));
    assert!(!names().contains(&Some(Value::Text("REFUSED".into()))), "the refused change is not applied");
    assert!(rows.iter().all(|r| r.get("id") != Some(&Value::Int32(2))), "the delete is");
    let dead = topic.read_topic(&format!("{}.dlq", topic.topic), 1, Duration::from_secs(30));
    assert_eq!(dead.len(), 1);
    assert_eq!(header(&dead[0], sink_runner::dlq::HEADER_TABLE).as_deref(), Some("public.items"));
    assert!(header(&dead[0], sink_runner::dlq::HEADER_REASON).is_some_and(|r| r.starts_with("permanent")));
    stop.send(true).expect("stop");
    runner.await.expect("join").expect("runner");

    // A restarted runner starts from the stored offsets: nothing is applied
    // twice (no commit without new records), and new records flow.
    let commits = store.state().commits;
    let (stop, stopped) = watch::channel(false);
    let runner = run(stopped);
    topic
        .produce(&[event(&s, Op::Update, None, Some(row(4, "four", 4, "1.00")), 14, 0)])
        .await;
    wait_for("the new change", Duration::from_secs(60), || async {
        names().contains(&Some(Value::Text("four".into()))).then_some(())
    })
    .await;
    assert_eq!(store.state().commits, commits + 1, "only the new record was applied");
    stop.send(true).expect("stop");
    runner.await.expect("join").expect("runner");
}

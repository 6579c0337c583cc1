//! The source conformance suite: what every source must do, written once.
//!
//! A source joins it with a [`SourceFixture`] (a namespace of its own in the
//! real database, and the few statements the cases make) and one line in
//! `tests/tests/source_conformance.rs` listing the cases it runs. Every case
//! drives the [`Source`] directly, as the source runner does (start, batches,
//! acknowledgements after each "commit"), and rebuilds the tables from what
//! it emits the way a sink does: per key, the change with the highest
//! position wins. The process-level case ([`kill_9_exactly_once`]) runs the
//! `source-runner` binary into real Kafka.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tributary_connectors::{Checkpoint, CopyHolds, ErrorKind, Source, SourceBatch, SourceMessage};
use tributary_schemas::{Op, Position, SnapshotMarker, TableId, TableSchema, Value};

use crate::{counters, kafka_bootstrap, schema_registry_url, unique, wait_for, Runner};

/// How long any wait on a condition may take before the case fails.
pub const DEADLINE: Duration = Duration::from_secs(90);

/// A source database under test, in a namespace of its own that
/// [`SourceFixture::cleanup`] removes. Tables have the shape `(id integer
/// primary key, name text, qty integer)`.
#[async_trait]
pub trait SourceFixture: Send + Sync {
    /// The source table `name` of the namespace.
    fn table(&self, name: &str) -> TableId;
    /// Creates table `name`.
    async fn create(&self, name: &str);
    /// Inserts rows `(id, name, qty)` in one transaction.
    async fn insert(&self, name: &str, rows: &[(i32, &str, i32)]);
    /// Sets `name` and `qty` of row `id`.
    async fn update(&self, name: &str, id: i32, new_name: &str, qty: i32);
    /// Deletes row `id`.
    async fn delete(&self, name: &str, id: i32);
    /// `ALTER TABLE ... ADD COLUMN note text`, then a row `id` with `note`.
    async fn add_note(&self, name: &str, id: i32, note: &str);
    /// Drops table `name`.
    async fn drop_table(&self, name: &str);
    /// A source over the namespace, for the runner named `runner`.
    fn source(&self, runner: &str) -> Box<dyn Source>;
    /// The source section of a source runner's config file, for the
    /// process-level case; `None` for a source in the test process.
    fn runner_section(&self) -> Option<String>;
    /// Removes the namespace (and what the source left on the server).
    async fn cleanup(&self);
}

/// A table rebuilt from events: key text -> (position, row), and the
/// schemas announced. A table copied again ([`Mirror::resync`]) is held
/// back as the source runner holds it (`HeldTables::hold` and
/// `due_sweeps` in `source-runner/src/held_tables.rs`).
#[derive(Default)]
pub struct Mirror {
    /// Rows per table: `id` -> (position of the change, `name|qty[|note]`).
    pub tables: BTreeMap<TableId, BTreeMap<i64, (Position, Option<String>)>>,
    /// The last schema announced per table.
    pub schemas: HashMap<TableId, Arc<TableSchema>>,
    /// Tables announced as dropped.
    pub dropped: Vec<TableId>,
    /// Every change's (table, id, position), in emission order.
    pub seen: Vec<(TableId, i64, Position)>,
    /// Whether the last snapshot row went by.
    pub snapshot_done: bool,
    /// Tables being copied again: the position of the copy's first row
    /// once it came, and whether the rows older than it were swept.
    pub held: CopyHolds,
    /// How many times each row came in a copy (snapshot rows), per table.
    pub copied: BTreeMap<TableId, BTreeMap<i64, usize>>,
    /// The sweeps made when a copy was complete, with the copy's position
    /// (`None`: no row of the copy had come, so every row went).
    pub swept: Vec<(TableId, Option<Position>)>,
}

fn text(v: &Value) -> String {
    match v {
        Value::Null => "∅".into(),
        Value::Int16(i) => i.to_string(),
        Value::Int32(i) => i.to_string(),
        Value::Int64(i) => i.to_string(),
        Value::Text(s) => s.clone(),
        other => format!("{other:?}"),
    }
}

impl Mirror {
    /// Asks `source` to copy `table` again, as `POST /resync` does, and
    /// holds the table back; the tables the source copies.
    pub async fn resync(&mut self, source: &mut dyn Source, table: &TableId) -> Vec<TableId> {
        let copying = source.resync(std::slice::from_ref(table)).await.expect("resync");
        if copying.contains(table) {
            self.held.hold(table.clone());
            self.copied.remove(table);
        }
        copying
    }

    /// After a batch: each held table whose copy `progress` says is
    /// complete loses the rows older than the copy (the runner's
    /// table-copied record), once.
    pub fn sweep(&mut self, progress: &[tributary_connectors::SnapshotTableProgress]) {
        for (table, hold) in self.held.sweep(progress) {
            if let Some(rows) = self.tables.get_mut(&table) {
                rows.retain(|_, (p, _)| hold.keeps(*p));
            }
            self.swept.push((table, hold.from));
        }
    }

    /// Applies a batch: schemas, changes (highest position wins), drops.
    pub fn apply(&mut self, batch: &SourceBatch) {
        for m in &batch.messages {
            match m {
                SourceMessage::SchemaChanged(s) => {
                    self.schemas.insert(s.id.clone(), s.clone());
                }
                SourceMessage::TableDropped(id) => {
                    self.dropped.push(id.clone());
                    self.tables.remove(id);
                }
                SourceMessage::TableFailed(id, reason) => panic!("{id} failed: {reason}"),
                SourceMessage::TableRewritten(id, reason) => panic!("{id} rewritten: {reason}"),
                SourceMessage::Sequence(..)
                | SourceMessage::Objects(..)
                | SourceMessage::Verify(..)
                | SourceMessage::TransactionEnd(_) => {}
                SourceMessage::Change(ev) => {
                    if self.held.admit(ev) {
                        continue;
                    }
                    assert!(
                        self.schemas.get(&ev.schema.id).is_some_and(|s| **s == *ev.schema),
                        "the schema of {} was announced before its first change",
                        ev.schema.id
                    );
                    if ev.source.snapshot == SnapshotMarker::Last {
                        self.snapshot_done = true;
                    }
                    let rows = self.tables.entry(ev.schema.id.clone()).or_default();
                    if ev.op == Op::Truncate {
                        rows.clear();
                        continue;
                    }
                    let Some(row) = ev.key_row() else { continue };
                    let id = ev.schema.column_index("id").and_then(|i| match &row[i] {
                        Value::Int16(v) => Some(i64::from(*v)),
                        Value::Int32(v) => Some(i64::from(*v)),
                        Value::Int64(v) => Some(*v),
                        _ => None,
                    });
                    let Some(id) = id else { panic!("no id in {ev:?}") };
                    self.seen.push((ev.schema.id.clone(), id, ev.source.position));
                    if ev.source.snapshot != SnapshotMarker::False {
                        *self.copied.entry(ev.schema.id.clone()).or_default().entry(id).or_default() += 1;
                    }
                    let value = ev.after.as_ref().map(|after| {
                        ev.schema
                            .columns
                            .iter()
                            .zip(after)
                            .filter(|(c, _)| c.name != "id")
                            .map(|(_, v)| text(v))
                            .collect::<Vec<_>>()
                            .join("|")
                    });
                    let newer = rows.get(&id).is_none_or(|(p, _)| *p <= ev.source.position);
                    if newer {
                        rows.insert(id, (ev.source.position, if ev.op == Op::Delete { None } else { value }));
                    }
                }
            }
        }
    }

    /// The live rows of `table` as `id|name|qty[|note]`.
    pub fn rows(&self, table: &TableId) -> Vec<String> {
        self.tables
            .get(table)
            .map(|rows| {
                rows.iter()
                    .filter_map(|(id, (_, v))| v.as_ref().map(|v| format!("{id}|{v}")))
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// Starts `source`, retrying while the error is retryable (a previous
/// session releasing a slot).
pub async fn start(source: &mut dyn Source, checkpoint: Option<Checkpoint>) {
    let deadline = Instant::now() + DEADLINE;
    loop {
        crate::side::restore(source, checkpoint.as_ref());
        match source.start(checkpoint.clone()).await {
            Ok(()) => return,
            Err(e) if e.kind() == ErrorKind::Retryable && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => panic!("start: {e}"),
        }
    }
}

/// Reads and acknowledges batches into `mirror` until `done` holds.
pub async fn sync(source: &mut dyn Source, mirror: &mut Mirror, what: &str, done: impl Fn(&Mirror) -> bool) {
    let deadline = Instant::now() + DEADLINE;
    while !done(mirror) {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        // A retryable error is retried, as the runner does (the contract:
        // the next call continues after the last batch returned); e.g. the
        // slot still held by the walsender of a stream the source just
        // reopened.
        let batch = match crate::side::next_batch(source).await {
            Ok(b) => b,
            Err(e) if e.kind() == tributary_connectors::ErrorKind::Retryable && Instant::now() < deadline => {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
            Err(e) => panic!("next_batch ({what}): {e}"),
        };
        mirror.apply(&batch);
        mirror.sweep(&source.snapshot_progress());
        source.acknowledge(&batch.checkpoint).await.expect("acknowledge");
    }
}

fn expect_rows(rows: &[(i32, &str, i32)]) -> Vec<String> {
    rows.iter().map(|(id, n, q)| format!("{id}|{n}|{q}")).collect()
}

/// The rows there before the start arrive as a snapshot; the changes after
/// it follow; the mirror equals the source.
pub async fn snapshot_then_streaming(fx: &dyn SourceFixture) {
    fx.create("items").await;
    let initial: Vec<(i32, String, i32)> = (1..=250).map(|i| (i, format!("item {i}"), i)).collect();
    let refs: Vec<(i32, &str, i32)> = initial.iter().map(|(i, n, q)| (*i, n.as_str(), *q)).collect();
    fx.insert("items", &refs).await;
    let mut source = fx.source(&unique("conf"));
    start(source.as_mut(), None).await;
    let mut mirror = Mirror::default();
    let t = fx.table("items");
    sync(source.as_mut(), &mut mirror, "the snapshot", |m| m.rows(&t).len() == 250).await;
    fx.update("items", 1, "renamed", 100).await;
    fx.delete("items", 2).await;
    fx.insert("items", &[(300, "new", 3)]).await;
    sync(source.as_mut(), &mut mirror, "the changes", |m| m.rows(&t).iter().any(|r| r.starts_with("300|"))).await;
    let rows = mirror.rows(&t);
    assert_eq!(rows.len(), 250);
    assert!(rows.contains(&"1|renamed|100".to_string()));
    assert!(!rows.iter().any(|r| r.starts_with("2|")));
    assert!(rows.contains(&"250|item 250|250".to_string()));
}

/// After a crash at any point, the source started from the last
/// acknowledged checkpoint emits exactly what came after it: no change is
/// lost, and none that was acknowledged comes again.
pub async fn restart_resumes_after_the_checkpoint(fx: &dyn SourceFixture) {
    fx.create("items").await;
    let rows: Vec<(i32, String, i32)> = (1..=300).map(|i| (i, format!("n{i}"), 0)).collect();
    let refs: Vec<(i32, &str, i32)> = rows.iter().map(|(i, n, q)| (*i, n.as_str(), *q)).collect();
    fx.insert("items", &refs).await;
    let runner = unique("conf");
    let t = fx.table("items");
    let mut source = fx.source(&runner);
    start(source.as_mut(), None).await;
    // Mid-snapshot: two batches acknowledged, a third read and lost.
    let mut acked = Mirror::default();
    let mut checkpoint = None;
    for _ in 0..2 {
        let b = crate::side::next_batch(source.as_mut()).await.expect("batch");
        acked.apply(&b);
        source.acknowledge(&b.checkpoint).await.expect("ack");
        checkpoint = Some(b.checkpoint);
    }
    let _lost = crate::side::next_batch(source.as_mut()).await.expect("batch");
    drop(source);
    let mut source = fx.source(&runner);
    start(source.as_mut(), checkpoint.clone()).await;
    let mut mirror = acked;
    let before = mirror.seen.len();
    sync(source.as_mut(), &mut mirror, "the snapshot after the restart", |m| m.rows(&t).len() == 300).await;
    assert_no_repeats(&mirror.seen[..before], &mirror.seen[before..], "mid-snapshot");
    // Mid-stream: changes acknowledged, then more read and lost.
    for i in 1..=20 {
        fx.update("items", i, "u", i).await;
    }
    sync(source.as_mut(), &mut mirror, "the first changes", |m| m.rows(&t).contains(&"20|u|20".to_string())).await;
    let mut last = None;
    // One more batch acknowledged to have its checkpoint (a heartbeat
    // carries the position after the changes).
    let b = crate::side::next_batch(source.as_mut()).await.expect("batch");
    mirror.apply(&b);
    source.acknowledge(&b.checkpoint).await.expect("ack");
    last.get_or_insert(b.checkpoint);
    for i in 21..=40 {
        fx.update("items", i, "v", i).await;
    }
    let mut lost = Mirror {
        schemas: mirror.schemas.clone(),
        ..Default::default()
    };
    sync(source.as_mut(), &mut lost, "changes that are then lost", |m| {
        m.seen.iter().any(|(_, id, _)| *id == 40)
    })
    .await;
    drop(source);
    let mut source = fx.source(&runner);
    start(source.as_mut(), last).await;
    let before = mirror.seen.len();
    sync(source.as_mut(), &mut mirror, "the changes after the restart", |m| {
        m.rows(&t).contains(&"40|v|40".to_string())
    })
    .await;
    assert_no_repeats(&mirror.seen[..before], &mirror.seen[before..], "mid-stream");
    let rows = mirror.rows(&t);
    assert_eq!(rows.len(), 300);
    assert!(rows.contains(&"21|v|21".to_string()), "the lost changes came again");
}

/// Nothing emitted after a restart was acknowledged before it.
fn assert_no_repeats(before: &[(TableId, i64, Position)], after: &[(TableId, i64, Position)], what: &str) {
    let done: std::collections::HashSet<_> = before.iter().collect();
    let repeated: Vec<_> = after.iter().filter(|e| done.contains(e)).take(5).collect();
    assert!(repeated.is_empty(), "{what}: changes emitted again after the restart: {repeated:?}");
}

/// A column added mid-stream: its schema is announced before the first row
/// that has it, and older rows keep their schema.
pub async fn ddl_add_column(fx: &dyn SourceFixture) {
    fx.create("items").await;
    fx.insert("items", &[(1, "a", 1)]).await;
    let mut source = fx.source(&unique("conf"));
    start(source.as_mut(), None).await;
    let mut mirror = Mirror::default();
    let t = fx.table("items");
    sync(source.as_mut(), &mut mirror, "the snapshot", |m| m.rows(&t).len() == 1).await;
    fx.add_note("items", 2, "hello").await;
    sync(source.as_mut(), &mut mirror, "the row with a note", |m| m.rows(&t).len() == 2).await;
    let schema = mirror.schemas.get(&t).expect("schema");
    assert!(schema.column_index("note").is_some(), "the new column is announced: {schema:?}");
    assert!(mirror.rows(&t).contains(&"2|b|2|hello".to_string()), "{:?}", mirror.rows(&t));
}

/// A table created after the start is captured (schema, then rows); a table
/// dropped is announced as dropped.
pub async fn new_and_dropped_tables(fx: &dyn SourceFixture) {
    fx.create("items").await;
    let mut source = fx.source(&unique("conf"));
    start(source.as_mut(), None).await;
    let mut mirror = Mirror::default();
    let t = fx.table("items");
    sync(source.as_mut(), &mut mirror, "the snapshot", |m| m.schemas.contains_key(&t) || m.snapshot_done).await;
    fx.create("later").await;
    fx.insert("later", &[(1, "x", 1), (2, "y", 2)]).await;
    let later = fx.table("later");
    sync(source.as_mut(), &mut mirror, "the new table's rows", |m| m.rows(&later).len() == 2).await;
    assert_eq!(mirror.rows(&later), expect_rows(&[(1, "x", 1), (2, "y", 2)]));
    fx.drop_table("later").await;
    sync(source.as_mut(), &mut mirror, "the drop", |m| m.dropped.contains(&later)).await;
}

/// A table copied again while streaming ([`Source::resync`]: `POST
/// /resync`, `source-runner reset --table`), held back as the runner
/// holds it: each of its rows comes once in the copy, the changes made
/// meanwhile are in the copy or stream after it, a row deleted meanwhile
/// goes with the sweep after the copy, the other tables stream on, and the
/// mirror equals the source.
pub async fn resync_copies_a_table_again(fx: &dyn SourceFixture) {
    const ROWS: i32 = 120;
    fx.create("items").await;
    fx.create("other").await;
    let initial: Vec<(i32, String, i32)> = (1..=ROWS).map(|i| (i, format!("n{i}"), 0)).collect();
    let refs: Vec<(i32, &str, i32)> = initial.iter().map(|(i, n, q)| (*i, n.as_str(), *q)).collect();
    fx.insert("items", &refs).await;
    let mut source = fx.source(&unique("conf"));
    start(source.as_mut(), None).await;
    let mut mirror = Mirror::default();
    let (t, other) = (fx.table("items"), fx.table("other"));
    sync(source.as_mut(), &mut mirror, "the snapshot", |m| m.rows(&t).len() == ROWS as usize).await;
    fx.update("items", 1, "before", 1).await;
    sync(source.as_mut(), &mut mirror, "a change before the copy", |m| {
        m.rows(&t).contains(&"1|before|1".to_string())
    })
    .await;
    assert_eq!(mirror.resync(source.as_mut(), &t).await, vec![t.clone()]);
    // Made while the copy is asked for: in it, or streamed after it.
    fx.update("items", 2, "during", 2).await;
    fx.delete("items", 3).await;
    fx.insert("items", &[(500, "new", 5)]).await;
    fx.insert("other", &[(1, "o", 1)]).await;
    sync(source.as_mut(), &mut mirror, "the copy", |m| m.swept.iter().any(|(s, _)| *s == t)).await;
    fx.update("items", 4, "after", 4).await;
    sync(source.as_mut(), &mut mirror, "a change after the copy", |m| {
        m.rows(&t).contains(&"4|after|4".to_string())
    })
    .await;
    sync(source.as_mut(), &mut mirror, "the other table", |m| !m.rows(&other).is_empty()).await;
    assert!(
        matches!(mirror.swept.as_slice(), [(s, Some(_))] if *s == t),
        "the copy was complete only after its rows: {:?}",
        mirror.swept
    );
    let copied = mirror.copied.get(&t).cloned().unwrap_or_default();
    let twice: Vec<_> = copied.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "rows copied more than once: {twice:?}");
    let missing: Vec<i32> = (5..=ROWS).filter(|i| !copied.contains_key(&i64::from(*i))).collect();
    assert!(missing.is_empty(), "rows not in the copy: {missing:?}");
    let mut want: Vec<String> = vec!["1|before|1".into(), "2|during|2".into(), "4|after|4".into()];
    want.extend((5..=ROWS).map(|i| format!("{i}|n{i}|0")));
    want.push("500|new|5".into());
    assert_eq!(mirror.rows(&t), want);
    assert_eq!(mirror.rows(&other), vec!["1|o|1".to_string()]);
}

/// The `source-runner` binary is killed (SIGKILL) once mid-snapshot and
/// twice mid-stream; the change topic, read with `read_committed`, holds
/// every snapshot row once and every change once, in order per key (`qty`
/// counts each row's updates, so a lost change is a gap and a repeated one a
/// repeat: [`crate::counters`]).
pub async fn kill_9_exactly_once(fx: &dyn SourceFixture) {
    const ROWS: i32 = 2000;
    let section = fx.runner_section().expect("a source the source-runner binary can reach");
    fx.create("items").await;
    let initial: Vec<(i32, String, i32)> = (1..=ROWS).map(|i| (i, format!("n{i}"), 0)).collect();
    let refs: Vec<(i32, &str, i32)> = initial.iter().map(|(i, n, q)| (*i, n.as_str(), *q)).collect();
    fx.insert("items", &refs).await;
    let name = unique("kill");
    let dir = std::env::temp_dir().join(unique("tributary-source-kill"));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let config = dir.join("source.toml");
    std::fs::write(
        &config,
        format!(
            "name = \"{name}\"\nschema_registry_url = \"{registry}\"\n\
             [admin]\nlisten = \"off\"\n[kafka]\nbootstrap_servers = \"{bootstrap}\"\n{section}",
            registry = schema_registry_url(),
            bootstrap = kafka_bootstrap(),
        ),
    )
    .expect("config");
    let log = dir.join("source.log");
    eprintln!("runner log: {}", log.display());
    let t = fx.table("items");
    let seen = counters::collect(format!("{name}.{}.{}", t.schema, t.table), "qty");
    let mut runner = counters::snapshot_through_a_kill9(&config, &log, &seen, ROWS as usize).await;
    let mut rng = crate::Rng(uuid::Uuid::new_v4().as_u128() as u64 | 1);
    let kills = [10 + rng.below(30), 50 + rng.below(40)];
    let mut versions: BTreeMap<i32, i32> = (1..=ROWS).map(|i| (i, 0)).collect();
    let mut next_id = ROWS + 1;
    let mut expected = 0usize;
    for step in 0..100u64 {
        match rng.below(10) {
            0 => {
                fx.insert("items", &[(next_id, "new", 0)]).await;
                versions.insert(next_id, 0);
                next_id += 1;
            }
            1 => {
                let id = 1 + rng.below(ROWS as u64) as i32;
                if versions.remove(&id).is_none() {
                    continue;
                }
                fx.delete("items", id).await;
            }
            _ => {
                // A few hot keys: many updates of the same row.
                let id = 1 + rng.below(100) as i32;
                let Some(v) = versions.get_mut(&id) else { continue };
                *v += 1;
                fx.update("items", id, "u", *v).await;
            }
        }
        expected += 1;
        // Paced, so that the run lasts seconds and the kills land while the
        // restarted runner streams (its start takes a fraction of one).
        tokio::time::sleep(Duration::from_millis(10 + rng.below(40))).await;
        if kills.contains(&step) {
            runner.kill9();
            runner = Runner::start("source-runner", &config, &log);
        }
    }
    wait_for("every change in Kafka", Duration::from_secs(180), || async {
        (counters::changes(&seen.lock().unwrap()) >= expected).then_some(())
    })
    .await;
    runner.kill9();
    counters::assert_exactly_once(&seen.lock().unwrap(), ROWS as usize, expected);
    let _ = std::process::Command::new(crate::runner_binary("source-runner"))
        .arg("--config")
        .arg(&config)
        .args(["delete", "--yes"])
        .status();
    let _ = std::fs::remove_dir_all(&dir);
}

/// The fixture trait of this suite, by a name the `conformance!` macro knows.
pub use SourceFixture as Fixture;

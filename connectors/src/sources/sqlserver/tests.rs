//! The whole source against the in-memory CDC fake.

use std::collections::BTreeMap;
use std::sync::Arc;

use proptest::prelude::*;
use tributary_schemas::{Op, Position, TableId, Value};

use super::fake::{FakeOp, FakeServer};
use super::lsn::Lsn;
use super::types::ColumnDef;
use super::*;
use crate::error::ErrorKind;
use crate::problem::Severity;

fn t(name: &str) -> TableId {
    TableId::new("dbo", name)
}

fn row(id: i32, qty: i32) -> Vec<Value> {
    vec![Value::Int32(id), Value::Int32(qty)]
}

fn server() -> FakeServer {
    let db = FakeServer::new(Lsn::new(7, u32::MAX - 20, 0));
    for name in ["a", "b"] {
        db.create_table(
            &t(name),
            vec![ColumnDef::new("id", "int", false), ColumnDef::new("qty", "int", true)],
            &["id"],
        );
        db.enable_table(&t(name), &format!("dbo_{name}")).expect("enable");
    }
    db
}

/// [`server`] with rows 1..=n in table a, one transaction each.
fn server_with_rows(n: i32) -> FakeServer {
    let db = server();
    for id in 1..=n {
        db.commit(vec![FakeOp::Insert(t("a"), row(id, 0))]).expect("insert");
    }
    db
}

fn source(db: &FakeServer, chunk: u64, max_events: usize) -> SqlServerSource {
    let mut config = SqlServerSourceConfig::with_url("sqlserver://u@fake/fake");
    config.snapshot_chunk_rows = chunk;
    config.poll_interval_ms = 1;
    config.heartbeat_interval_ms = 5;
    config.max_batch_events = max_events;
    SqlServerSource::new(config, Arc::new(db.clone()), "test").expect("source")
}

/// Per table, id -> (position, qty or deleted), highest position wins; and
/// every (table, id, position) seen, to find repeats.
#[derive(Default)]
struct Mirror {
    rows: BTreeMap<TableId, BTreeMap<i32, (Position, Option<i32>)>>,
    seen: Vec<(TableId, i32, Position, Op)>,
    /// Events that came after a newer one of their key (a row older than
    /// a change already emitted): must stay empty.
    backwards: Vec<(TableId, i32, Position)>,
    /// Tables copied again, held back as the source runner holds them:
    /// the position of the copy's first row once seen, and whether the
    /// rows older than it were swept.
    held: crate::CopyHolds,
}

impl Mirror {
    /// Asks `source` to copy `table` again and holds it back, as `POST
    /// /resync` does.
    async fn resync(&mut self, source: &mut SqlServerSource, table: &TableId) -> bool {
        let copying = source.resync(std::slice::from_ref(table)).await.expect("resync");
        if copying.contains(table) {
            self.held.hold(table.clone());
        }
        copying.contains(table)
    }

    /// After a batch: a held table whose copy is complete loses the rows
    /// older than the copy (the runner's table-copied record).
    fn sweep(&mut self, progress: &[SnapshotTableProgress]) {
        for (table, hold) in self.held.sweep(progress) {
            self.rows.entry(table).or_default().retain(|_, (p, _)| hold.keeps(*p));
        }
    }

    fn apply(&mut self, batch: &SourceBatch) {
        for m in &batch.messages {
            let SourceMessage::Change(ev) = m else { continue };
            if self.held.admit(ev) {
                continue;
            }
            let r = ev.key_row().expect("key row");
            let Value::Int32(id) = r[0] else { panic!("id") };
            let qty = ev.after.as_ref().map(|a| match a[1] {
                Value::Int32(q) => q,
                _ => -1,
            });
            self.seen.push((ev.schema.id.clone(), id, ev.source.position, ev.op));
            let e = self.rows.entry(ev.schema.id.clone()).or_default();
            if e.get(&id).is_some_and(|(p, _)| *p > ev.source.position) {
                self.backwards.push((ev.schema.id.clone(), id, ev.source.position));
            }
            if e.get(&id).is_none_or(|(p, _)| *p <= ev.source.position) {
                e.insert(id, (ev.source.position, if ev.op == Op::Delete { None } else { qty }));
            }
        }
    }

    fn live(&self, table: &TableId) -> Vec<Vec<Value>> {
        self.rows
            .get(table)
            .map(|r| r.iter().filter_map(|(id, (_, q))| q.map(|q| row(*id, q))).collect())
            .unwrap_or_default()
    }
}

/// Whether `checkpoint` is caught up with `db`: the snapshot done, every
/// commit emitted, and every captured table read.
fn caught_up(db: &FakeServer, checkpoint: &Checkpoint) -> bool {
    let state = SourceState::from_checkpoint(checkpoint).expect("state");
    state.snapshot.is_none()
        && state.lsn >= db.max_lsn()
        && db
            .captured_tables()
            .iter()
            .all(|t| state.instances.contains_key(&t.to_string()))
}

/// A source over `db` started from scratch and caught up, reading
/// `chunk` rows per snapshot chunk.
async fn caught_up_source(db: &FakeServer, chunk: u64) -> (SqlServerSource, Mirror, Checkpoint) {
    let mut s = source(db, chunk, 100);
    s.start(None).await.expect("start");
    let mut m = Mirror::default();
    let c = drain(db, &mut s, &mut m).await;
    (s, m, c)
}

async fn drain(db: &FakeServer, s: &mut SqlServerSource, m: &mut Mirror) -> Checkpoint {
    loop {
        let b = s.next_batch().await.expect("batch");
        m.apply(&b);
        m.sweep(&s.snapshot_progress());
        if caught_up(db, &b.checkpoint) {
            return b.checkpoint;
        }
    }
}

#[tokio::test]
async fn key_updates_are_a_delete_then_an_insert_with_serial_numbers() {
    let db = server();
    db.commit(vec![FakeOp::Insert(t("a"), row(1, 1))]).expect("insert");
    let (mut s, mut m, _) = caught_up_source(&db, 10).await;
    db.commit(vec![
        FakeOp::Update(t("a"), row(1, 1), row(2, 1)),
        FakeOp::Update(t("a"), row(2, 1), row(2, 5)),
    ])
    .expect("key update");
    let b = s.next_batch().await.expect("batch");
    let changes: Vec<&ChangeEvent> = b
        .messages
        .iter()
        .filter_map(|m| match m {
            SourceMessage::Change(ev) => Some(ev),
            _ => None,
        })
        .collect();
    let ops: Vec<Op> = changes.iter().map(|e| e.op).collect();
    assert_eq!(ops, vec![Op::Delete, Op::Create, Op::Update]);
    assert!(changes[1].source.native_position.ends_with(":2"), "{}", changes[1].source.native_position);
    assert!(changes.windows(2).all(|w| w[0].source.position < w[1].source.position));
    assert_eq!(changes[2].before, Some(row(2, 1)));
    m.apply(&b);
    assert_eq!(m.live(&t("a")), vec![row(2, 5)]);
}

/// Debezium's transaction block and end: a transaction over two tables
/// orders its changes in all and per table, and its end, after them,
/// counts them per table.
#[tokio::test]
async fn a_transaction_over_two_tables_has_its_orders_and_its_end() {
    let db = server();
    let (mut s, _, _) = caught_up_source(&db, 10).await;
    db.commit(vec![
        FakeOp::Insert(t("a"), row(1, 1)),
        FakeOp::Insert(t("b"), row(1, 1)),
        FakeOp::Insert(t("a"), row(2, 2)),
    ])
    .expect("a transaction");
    let b = s.next_batch().await.expect("batch");
    let blocks: Vec<(i64, i64)> = b
        .messages
        .iter()
        .filter_map(|m| match m {
            SourceMessage::Change(ev) => ev.transaction.as_ref().map(|t| (t.total_order, t.data_collection_order)),
            _ => None,
        })
        .collect();
    assert_eq!(blocks, vec![(1, 1), (2, 1), (3, 2)]);
    let Some(SourceMessage::TransactionEnd(end)) = b.messages.last() else {
        panic!("the batch ends with the transaction's end: {:?}", b.messages);
    };
    assert_eq!(end.tables, vec![(t("a"), 2), (t("b"), 1)]);
}

#[tokio::test]
async fn the_new_capture_instance_takes_over_at_its_start_lsn_with_its_schema() {
    let db = server();
    let (mut s, _, _) = caught_up_source(&db, 10).await;
    db.commit(vec![FakeOp::Insert(t("a"), row(1, 1))]).expect("insert");
    // ALTER TABLE: the old instance still captures two columns.
    db.add_column(&t("a"), ColumnDef::new("note", "nvarchar(10)", true), Value::Null);
    db.commit(vec![FakeOp::Insert(
        t("a"),
        vec![Value::Int32(3), Value::Int32(3), Value::Text("lost".into())],
    )])
    .expect("insert");
    db.enable_table(&t("a"), "dbo_a_v2").expect("second instance");
    db.commit(vec![FakeOp::Insert(
        t("a"),
        vec![Value::Int32(2), Value::Int32(2), Value::Text("n".into())],
    )])
    .expect("insert");
    let mut out = Vec::new();
    let mut checkpoint = None;
    while checkpoint.as_ref().is_none_or(|c| !caught_up(&db, c)) {
        let b = s.next_batch().await.expect("batch");
        for m in &b.messages {
            out.push(match m {
                SourceMessage::SchemaChanged(sc) => format!("schema {}", sc.columns.len()),
                SourceMessage::Change(ev) => format!("{:?} {:?}", ev.schema.columns.len(), ev.after),
                SourceMessage::TableDropped(_) => "dropped".into(),
                SourceMessage::TableFailed(t, reason) => format!("failed {t}: {reason}"),
                SourceMessage::TableRewritten(t, reason) => format!("rewritten {t}: {reason}"),
                SourceMessage::Sequence(t, state) => format!("sequence {t}: {}", state.name),
                SourceMessage::Objects(t, _) => format!("objects {t}"),
                SourceMessage::Verify(t, range) => format!("verify {t}: {} rows", range.rows.len()),
                SourceMessage::TransactionEnd(_) => continue,
            });
        }
        checkpoint = Some(b.checkpoint);
    }
    assert_eq!(
        out,
        vec![
            "2 Some([Int32(1), Int32(1)])".to_string(),
            // Before the new instance's start: read from the old one, without the note.
            "2 Some([Int32(3), Int32(3)])".to_string(),
            "schema 3".to_string(),
            "3 Some([Int32(2), Int32(2), Text(\"n\")])".to_string(),
        ]
    );
    let state = SourceState::from_checkpoint(&checkpoint.expect("checkpoint")).expect("state");
    assert_eq!(state.instances.get("dbo.a").map(|i| i.name.as_str()), Some("dbo_a_v2"));
    // The operator disables the old instance: the stream goes on.
    db.disable_instance("dbo_a");
    db.commit(vec![FakeOp::Delete(
        t("a"),
        vec![Value::Int32(1), Value::Int32(1), Value::Null],
    )])
    .expect("delete");
    let mut m = Mirror::default();
    drain(&db, &mut s, &mut m).await;
    assert_eq!(m.seen.last().map(|e| e.3), Some(Op::Delete));
}

#[tokio::test]
async fn commits_to_uncaptured_tables_move_the_checkpoint() {
    let db = server();
    db.create_table(&t("plain"), vec![ColumnDef::new("id", "int", false)], &["id"]);
    let (mut s, _, _) = caught_up_source(&db, 10).await;
    let at = db
        .commit(vec![FakeOp::Insert(t("plain"), vec![Value::Int32(1)])])
        .expect("insert");
    let b = tokio::time::timeout(std::time::Duration::from_secs(10), s.next_batch())
        .await
        .expect("a batch, not a busy loop")
        .expect("batch");
    assert!(b.messages.is_empty());
    assert_eq!(SourceState::from_checkpoint(&b.checkpoint).expect("state").lsn, at);
}

#[tokio::test]
async fn a_cleanup_past_the_checkpoint_stops_the_table_with_the_resnapshot_choice() {
    let db = server();
    let (s, _, checkpoint) = caught_up_source(&db, 10).await;
    drop(s);
    db.commit(vec![FakeOp::Insert(t("b"), row(1, 1))]).expect("insert");
    let last = db.commit(vec![FakeOp::Insert(t("b"), row(2, 1))]).expect("insert");
    // The cleanup job removes the first of the two while the source is down.
    db.cleanup(last);
    let mut s = source(&db, 10, 100);
    s.start(Some(checkpoint.clone())).await.expect("start");
    let e = s.next_batch().await.expect_err("a gap");
    assert_eq!(e.kind(), ErrorKind::NeedsOperator);
    assert!(e.table().is_some(), "{e}");
    let table = e.table().cloned().expect("the table");
    assert!(e.hint().is_some_and(|h| h.contains(&format!("reset --table {table}"))), "{e:?}");
    // Nothing was skipped silently: it fails again, and emitted nothing.
    assert!(s.next_batch().await.is_err());
    // The hint's way out: the tables copied again (the runner asks at its
    // next start). The cleanup moved every instance's low end, a's too
    // (nothing says none of its changes went): both are named in turn.
    let mut s = source(&db, 10, 100);
    s.start(Some(checkpoint)).await.expect("start");
    let mut m = Mirror::default();
    assert!(m.resync(&mut s, &table).await);
    let e = s.next_batch().await.expect_err("the other table's gap");
    let other = e.table().cloned().expect("the table");
    assert_ne!(other, table);
    assert!(m.resync(&mut s, &other).await);
    db.commit(vec![FakeOp::Insert(t("a"), row(1, 1))]).expect("insert");
    drain(&db, &mut s, &mut m).await;
    assert_eq!(m.live(&t("b")), vec![row(1, 1), row(2, 1)]);
    assert_eq!(m.live(&t("a")), vec![row(1, 1)]);
    db.commit(vec![FakeOp::Delete(t("b"), row(1, 1))]).expect("delete");
    drain(&db, &mut s, &mut m).await;
    assert_eq!(m.live(&t("b")), vec![row(2, 1)]);
}

#[tokio::test]
async fn a_cleanup_below_the_checkpoint_is_no_gap() {
    let db = server();
    db.commit(vec![FakeOp::Insert(t("a"), row(1, 1))]).expect("insert");
    let (mut s, mut m, _) = caught_up_source(&db, 10).await;
    let l = db.commit(vec![FakeOp::Insert(t("a"), row(2, 1))]).expect("insert");
    drain(&db, &mut s, &mut m).await;
    db.cleanup(l);
    db.commit(vec![FakeOp::Insert(t("a"), row(3, 1))]).expect("insert");
    drain(&db, &mut s, &mut m).await;
    assert_eq!(m.live(&t("a")), vec![row(1, 1), row(2, 1), row(3, 1)]);
}

#[tokio::test]
async fn check_names_every_problem_with_its_fix() {
    let db = server();
    let config = SqlServerSourceConfig::with_url("sqlserver://u@fake/fake");
    assert!(check::check(&config, &db).await.is_empty(), "a ready database has no problems");
    db.create_table(&t("plain"), vec![ColumnDef::new("v", "int", true)], &[]);
    db.add_column(&t("a"), ColumnDef::new("note", "nvarchar(10)", true), Value::Null);
    db.settings(|s| {
        s.facts.snapshot_isolation = false;
        s.facts.agent_running = Some(false);
        s.facts.select_on_cdc = false;
        s.facts.view_database_state = false;
        s.facts.cleanup_job = Some(false);
        s.no_select = vec![t("b")];
    });
    let problems = check::check(&config, &db).await;
    let fix = |needle: &str| {
        problems
            .iter()
            .find(|p| p.fix.as_deref().is_some_and(|f| f.contains(needle)))
            .unwrap_or_else(|| panic!("no fix with {needle}: {problems:#?}"))
    };
    assert_eq!(fix("ALLOW_SNAPSHOT_ISOLATION ON").severity, Severity::Error);
    // What `source-runner check` prints for it.
    assert_eq!(
        fix("ALLOW_SNAPSHOT_ISOLATION ON").to_string(),
        "error: snapshot isolation is not allowed: the snapshot cannot be consistent with the change tables\n  \
         fix: ALTER DATABASE [fake] SET ALLOW_SNAPSHOT_ISOLATION ON;"
    );
    assert!(problems.iter().any(|p| p.message.contains("SQL Server Agent is not running")));
    fix("GRANT SELECT ON SCHEMA::cdc TO [tributary];");
    fix("GRANT VIEW DATABASE STATE TO [tributary];");
    fix("sys.sp_cdc_add_job @job_type = N'cleanup'");
    assert_eq!(fix("GRANT SELECT ON [dbo].[b]").table, Some(t("b")));
    assert_eq!(fix("@source_name = N'plain'").table, Some(t("plain")));
    assert_eq!(fix("@capture_instance = N'dbo_a_v2'").severity, Severity::Warning);
    db.settings(|s| s.facts.cdc_enabled = false);
    let problems = check::check(&config, &db).await;
    assert!(problems
        .iter()
        .any(|p| p.fix.as_deref().is_some_and(|f| f.contains("EXEC sys.sp_cdc_enable_db"))));
}

#[tokio::test]
async fn a_disabled_capture_instance_without_a_successor_needs_the_operator() {
    let db = server();
    let (mut s, _, _) = caught_up_source(&db, 10).await;
    db.disable_instance("dbo_a");
    db.commit(vec![FakeOp::Insert(t("b"), row(1, 1))]).expect("insert");
    let e = s.next_batch().await.expect_err("disabled");
    assert_eq!(e.kind(), ErrorKind::NeedsOperator);
    assert_eq!(e.table(), Some(&t("a")));
    assert!(e.hint().is_some_and(|h| h.contains("sp_cdc_enable_table")), "{e:?}");
}

/// The changes events of `table` in `b`, as (op, id, snapshot marker, position).
fn events_of(b: &SourceBatch, table: &TableId) -> Vec<(Op, i32, SnapshotMarker, Position)> {
    b.messages
        .iter()
        .filter_map(|m| match m {
            SourceMessage::Change(ev) if ev.schema.id == *table => {
                let Value::Int32(id) = ev.key_row().expect("key")[0] else {
                    panic!("id")
                };
                Some((ev.op, id, ev.source.snapshot, ev.source.position))
            }
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn a_resync_copies_the_table_at_an_lsn_the_stream_hands_off_at() {
    let db = server_with_rows(5);
    // One row per chunk: the test commits mid-copy.
    let (mut s, mut m, _) = caught_up_source(&db, 1).await;
    assert!(s.snapshot_progress().iter().all(|p| p.done));
    assert!(m.resync(&mut s, &t("a")).await);
    assert_eq!(s.resync(&[t("nope")]).await.expect("resync"), Vec::<TableId>::new(), "not captured");
    assert!(
        s.snapshot_progress().iter().any(|p| p.table == t("a") && !p.done),
        "the runner must not take the old snapshot's end for the new copy's"
    );
    // Before the copy's transaction begins: its rows show these.
    db.commit(vec![
        FakeOp::Update(t("a"), row(1, 0), row(1, 1)),
        FakeOp::Insert(t("b"), row(1, 1)),
    ])
    .expect("txn");
    db.commit(vec![FakeOp::Delete(t("a"), row(2, 0))]).expect("delete");
    let mut copied = Vec::new();
    let mut handoff = None;
    let mut after_copy = Vec::new();
    let mut checkpoint = None;
    let mut mid_copy = true;
    while checkpoint.as_ref().is_none_or(|c| !caught_up(&db, c)) {
        let b = s.next_batch().await.expect("batch");
        for (op, id, marker, p) in events_of(&b, &t("a")) {
            if op == Op::Read {
                assert_eq!(marker, SnapshotMarker::True, "a copy mid-stream is not the initial snapshot's end");
                assert!(after_copy.is_empty(), "a copy row after a change that follows it");
                copied.push(id);
                handoff = Some(p);
            } else {
                // The stream left every change up to the handoff to the copy.
                assert!(handoff.is_some_and(|h| p > h), "change {op:?} {id} at {p:?} not after the copy");
                after_copy.push((op, id));
            }
        }
        m.apply(&b);
        m.sweep(&s.snapshot_progress());
        if copied.len() == 2 && std::mem::take(&mut mid_copy) {
            // Mid-copy (one row per batch): these commit after the handoff.
            db.commit(vec![FakeOp::Update(t("a"), row(5, 0), row(5, 9))]).expect("update");
            db.commit(vec![FakeOp::Insert(t("a"), row(6, 6))]).expect("insert");
        }
        checkpoint = Some(b.checkpoint);
    }
    assert_eq!(copied, vec![1, 3, 4, 5], "each row of the table at the handoff, once, in key order");
    assert_eq!(after_copy, vec![(Op::Update, 5), (Op::Create, 6)]);
    assert!(s.snapshot_progress().iter().all(|p| p.done));
    for name in ["a", "b"] {
        assert_eq!(m.live(&t(name)), db.rows(&t(name)), "{name}");
    }
    assert!(m.backwards.is_empty(), "{:?}", m.backwards);
}

#[tokio::test]
async fn a_resync_resumes_after_a_restart_from_its_last_key() {
    let db = server_with_rows(6);
    let (mut s, mut m, _) = caught_up_source(&db, 2).await;
    assert!(m.resync(&mut s, &t("a")).await);
    let first = s.next_batch().await.expect("first chunk");
    assert_eq!(events_of(&first, &t("a")).iter().map(|e| e.1).collect::<Vec<_>>(), vec![1, 2]);
    m.apply(&first);
    m.sweep(&s.snapshot_progress());
    // The source stops; meanwhile a copied and a not yet copied row change.
    drop(s);
    db.commit(vec![
        FakeOp::Update(t("a"), row(1, 0), row(1, 7)),
        FakeOp::Delete(t("a"), row(4, 0)),
    ])
    .expect("txn");
    let mut s = source(&db, 2, 100);
    s.start(Some(first.checkpoint)).await.expect("start");
    let before = m.seen.len();
    drain(&db, &mut s, &mut m).await;
    let rest: Vec<(i32, Op)> = m.seen[before..].iter().map(|e| (e.1, e.3)).collect();
    // The changes up to the new transaction stream (the copy has begun:
    // row 1 is copied), then the rest of the copy, from key 3 on.
    assert_eq!(
        rest,
        vec![
            (1, Op::Update),
            (4, Op::Delete),
            (3, Op::Read),
            (5, Op::Read),
            (6, Op::Read)
        ]
    );
    assert_eq!(m.live(&t("a")), db.rows(&t("a")));
}

#[tokio::test]
async fn a_table_whose_capture_is_enabled_while_streaming_is_copied_then_streams() {
    let db = server();
    let (mut s, mut m, _) = caught_up_source(&db, 10).await;
    // Rows from before CDC was enabled on the table: in no change table.
    db.create_table(&t("c"), vec![ColumnDef::new("id", "int", false), ColumnDef::new("qty", "int", true)], &["id"]);
    db.commit(vec![FakeOp::Insert(t("c"), row(1, 1)), FakeOp::Insert(t("c"), row(2, 2))])
        .expect("insert");
    db.enable_table(&t("c"), "dbo_c").expect("enable");
    // Captured, and before the copy's transaction: in the copy, not streamed.
    db.commit(vec![
        FakeOp::Update(t("c"), row(2, 2), row(2, 3)),
        FakeOp::Insert(t("a"), row(1, 1)),
    ])
    .expect("txn");
    let mut out = Vec::new();
    let mut checkpoint = None;
    let mut once = true;
    while checkpoint.as_ref().is_none_or(|c| !caught_up(&db, c)) {
        let b = s.next_batch().await.expect("batch");
        for msg in &b.messages {
            match msg {
                SourceMessage::SchemaChanged(sc) if sc.id == t("c") => out.push("schema c".to_string()),
                SourceMessage::Change(ev) if ev.schema.id == t("c") => {
                    out.push(format!("{:?} {:?} {:?}", ev.op, ev.source.snapshot, ev.after))
                }
                _ => {}
            }
        }
        m.apply(&b);
        if once && s.state.as_ref().is_some_and(|st| st.snapshot.is_none()) {
            once = false;
            db.commit(vec![FakeOp::Delete(t("c"), row(1, 1))]).expect("delete");
        }
        checkpoint = Some(b.checkpoint);
    }
    assert_eq!(
        out,
        vec![
            "schema c".to_string(),
            "Read True Some([Int32(1), Int32(1)])".to_string(),
            "Read True Some([Int32(2), Int32(3)])".to_string(),
            "Delete False None".to_string(),
        ]
    );
    assert_eq!(m.live(&t("c")), db.rows(&t("c")));
    assert_eq!(m.live(&t("a")), db.rows(&t("a")));
    assert!(m.backwards.is_empty(), "{:?}", m.backwards);
}

#[tokio::test]
async fn with_snapshots_off_a_new_table_streams_its_changes_only() {
    let db = server();
    let mut config = SqlServerSourceConfig::with_url("sqlserver://u@fake/fake");
    config.snapshot_mode = SnapshotMode::Never;
    config.poll_interval_ms = 1;
    config.heartbeat_interval_ms = 5;
    let mut s = SqlServerSource::new(config, Arc::new(db.clone()), "test").expect("source");
    s.start(None).await.expect("start");
    assert!(s.resync(&[t("a")]).await.expect("resync").is_empty(), "no copies without snapshots");
    db.create_table(&t("c"), vec![ColumnDef::new("id", "int", false), ColumnDef::new("qty", "int", true)], &["id"]);
    db.commit(vec![FakeOp::Insert(t("c"), row(1, 1))]).expect("insert");
    db.enable_table(&t("c"), "dbo_c").expect("enable");
    db.commit(vec![FakeOp::Insert(t("c"), row(2, 2))]).expect("insert");
    let mut m = Mirror::default();
    drain(&db, &mut s, &mut m).await;
    assert_eq!(m.live(&t("c")), vec![row(2, 2)]);
}

/// One step of a random history.
#[derive(Debug, Clone)]
enum Step {
    /// A transaction of (table a, b or c, id, qty or delete).
    Txn(Vec<(u8, i32, Option<i32>)>),
    /// Read one batch; acknowledge it or not.
    Read(bool),
    /// Crash and start from the last acknowledged checkpoint.
    Restart,
    /// ALTER TABLE a ADD note, and a second capture instance.
    Ddl,
    /// The next read of the server fails; the source goes on after it.
    Fault,
    /// Copy table a (or b) again, as `POST /resync` asks.
    Resync(bool),
    /// Table c, with rows, gets CDC enabled (its rows must be copied).
    Capture,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => prop::collection::vec((0..3u8, 0..12i32, prop::option::of(0..100i32)), 1..4).prop_map(Step::Txn),
        4 => any::<bool>().prop_map(Step::Read),
        1 => Just(Step::Restart),
        1 => Just(Step::Ddl),
        1 => Just(Step::Fault),
        1 => any::<bool>().prop_map(Step::Resync),
        1 => Just(Step::Capture),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Random transactions over two tables interleaved with reads,
    /// restarts from the last acknowledged checkpoint (dropping whatever
    /// was read after it, as Kafka aborts it) and a capture-instance
    /// switch: the acknowledged events rebuild the tables exactly, and no
    /// acknowledged event comes twice.
    #[test]
    fn random_interleavings_lose_and_repeat_nothing(
        initial in prop::collection::vec(0..12i32, 0..10),
        steps in prop::collection::vec(step(), 1..30),
        chunk in 1..5u64,
        max_events in 1..4usize,
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async move {
            let db = server();
            for id in initial {
                if !db.rows(&t("a")).iter().any(|r| r[0] == Value::Int32(id)) {
                    db.commit(vec![FakeOp::Insert(t("a"), row(id, 0))]).unwrap();
                }
            }
            let mut s = source(&db, chunk, max_events);
            s.start(None).await.unwrap();
            let mut acked = Mirror::default();
            let mut checkpoint: Option<Checkpoint> = None;
            let mut ddl = false;
            let mut captured = false;
            // A restart, as the runner makes it: the source from the last
            // durable checkpoint, asked again for the copies it holds
            // tables back for.
            async fn restart(db: &FakeServer, chunk: u64, max_events: usize, checkpoint: &Option<Checkpoint>, acked: &Mirror) -> SqlServerSource {
                let mut s = source(db, chunk, max_events);
                s.start(checkpoint.clone()).await.unwrap();
                let asked: Vec<TableId> = acked.held.iter().filter(|(_, h)| h.from.is_none()).map(|(t, _)| t.clone()).collect();
                s.resync(&asked).await.unwrap();
                s
            }
            for st in steps {
                match st {
                    Step::Txn(changes) => {
                        let mut ops = Vec::new();
                        for (which, id, qty) in changes {
                            let name = match which {
                                0 => "a",
                                2 if captured => "c",
                                _ => "b",
                            };
                            let table = t(name);
                            let width = if name == "a" && ddl { 3 } else { 2 };
                            let cur = db.rows(&table).into_iter().find(|r| r[0] == Value::Int32(id));
                            // One change per key per transaction keeps the op list valid.
                            if ops.iter().any(|o: &FakeOp| matches!(o, FakeOp::Insert(tt, r) | FakeOp::Update(tt, r, _) | FakeOp::Delete(tt, r) if *tt == table && r[0] == Value::Int32(id))) {
                                continue;
                            }
                            let mut new = row(id, qty.unwrap_or(0));
                            new.resize(width, Value::Null);
                            ops.push(match (cur, qty) {
                                (None, _) => FakeOp::Insert(table, new),
                                (Some(old), Some(_)) => FakeOp::Update(table, old, new),
                                (Some(old), None) => FakeOp::Delete(table, old),
                            });
                        }
                        db.commit(ops).unwrap();
                    }
                    Step::Fault => db.settings(|s| s.failing_reads = 1),
                    Step::Read(ack) => {
                        let b = match s.next_batch().await {
                            Ok(b) => b,
                            Err(e) => {
                                // The runner retries the same source.
                                prop_assert_eq!(e.kind(), ErrorKind::Retryable);
                                continue;
                            }
                        };
                        if ack {
                            acked.apply(&b);
                            acked.sweep(&s.snapshot_progress());
                            checkpoint = Some(b.checkpoint);
                        } else {
                            // Read but never durable: the next restart drops it.
                            s = restart(&db, chunk, max_events, &checkpoint, &acked).await;
                        }
                    }
                    Step::Restart => s = restart(&db, chunk, max_events, &checkpoint, &acked).await,
                    Step::Resync(in_a) => {
                        let table = t(if in_a { "a" } else { "b" });
                        if !acked.held.contains_key(&table) {
                            prop_assert!(acked.resync(&mut s, &table).await, "{} is captured", table);
                        }
                    }
                    Step::Capture if !captured => {
                        captured = true;
                        db.create_table(&t("c"), vec![ColumnDef::new("id", "int", false), ColumnDef::new("qty", "int", true)], &["id"]);
                        db.commit((0..3).map(|id| FakeOp::Insert(t("c"), row(id, 0))).collect()).unwrap();
                        db.enable_table(&t("c"), "dbo_c").unwrap();
                    }
                    Step::Capture => {}
                    Step::Ddl if !ddl => {
                        ddl = true;
                        db.add_column(&t("a"), ColumnDef::new("note", "nvarchar(10)", true), Value::Null);
                        db.enable_table(&t("a"), "dbo_a_v2").unwrap();
                    }
                    Step::Ddl => {}
                }
            }
            // Catch up, acknowledging everything.
            db.settings(|s| s.failing_reads = 0);
            loop {
                let b = s.next_batch().await.unwrap();
                acked.apply(&b);
                acked.sweep(&s.snapshot_progress());
                if caught_up(&db, &b.checkpoint) {
                    break;
                }
            }
            for name in ["a", "b", "c"] {
                let want: Vec<Vec<Value>> = db.rows(&t(name)).into_iter().map(|r| r[..2].to_vec()).collect();
                prop_assert_eq!(acked.live(&t(name)), want, "table {}", name);
            }
            prop_assert!(acked.backwards.is_empty(), "events older than their key's last: {:?}", acked.backwards);
            let mut seen = std::collections::HashSet::new();
            for (table, id, p, op) in &acked.seen {
                // A snapshot row shares its position with the table's other
                // rows; a change is unique by (table, key, position).
                if *op != Op::Read {
                    prop_assert!(seen.insert((table.clone(), *id, *p)), "repeated {:?}", (table, id, p));
                }
            }
            Ok(())
        })?;
    }
}

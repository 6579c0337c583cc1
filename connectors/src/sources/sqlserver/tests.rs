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
        db.create_table(&t(name), vec![ColumnDef::new("id", "int", false), ColumnDef::new("qty", "int", true)], &["id"]);
        db.enable_table(&t(name), &format!("dbo_{name}")).expect("enable");
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
}

impl Mirror {
    fn apply(&mut self, batch: &SourceBatch) {
        for m in &batch.messages {
            let SourceMessage::Change(ev) = m else { continue };
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

/// Whether `checkpoint` is caught up with `db`: the snapshot done and
/// every commit emitted.
fn caught_up(db: &FakeServer, checkpoint: &Checkpoint) -> bool {
    let state = SourceState::from_checkpoint(checkpoint).expect("state");
    state.snapshot.is_none() && state.lsn >= db.max_lsn()
}

/// A source over `db` started from scratch and caught up.
async fn caught_up_source(db: &FakeServer) -> (SqlServerSource, Mirror, Checkpoint) {
    let mut s = source(db, 10, 100);
    s.start(None).await.expect("start");
    let mut m = Mirror::default();
    let c = drain(db, &mut s, &mut m).await;
    (s, m, c)
}

async fn drain(db: &FakeServer, s: &mut SqlServerSource, m: &mut Mirror) -> Checkpoint {
    loop {
        let b = s.next_batch().await.expect("batch");
        m.apply(&b);
        if caught_up(db, &b.checkpoint) {
            return b.checkpoint;
        }
    }
}

#[tokio::test]
async fn key_updates_are_a_delete_then_an_insert_with_serial_numbers() {
    let db = server();
    db.commit(vec![FakeOp::Insert(t("a"), row(1, 1))]).expect("insert");
    let (mut s, mut m, _) = caught_up_source(&db).await;
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

#[tokio::test]
async fn the_new_capture_instance_takes_over_at_its_start_lsn_with_its_schema() {
    let db = server();
    let (mut s, _, _) = caught_up_source(&db).await;
    db.commit(vec![FakeOp::Insert(t("a"), row(1, 1))]).expect("insert");
    // ALTER TABLE: the old instance still captures two columns.
    db.add_column(&t("a"), ColumnDef::new("note", "nvarchar(10)", true), Value::Null);
    db.commit(vec![FakeOp::Insert(t("a"), vec![Value::Int32(3), Value::Int32(3), Value::Text("lost".into())])])
        .expect("insert");
    db.enable_table(&t("a"), "dbo_a_v2").expect("second instance");
    db.commit(vec![FakeOp::Insert(t("a"), vec![Value::Int32(2), Value::Int32(2), Value::Text("n".into())])])
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
    db.commit(vec![FakeOp::Delete(t("a"), vec![Value::Int32(1), Value::Int32(1), Value::Null])]).expect("delete");
    let mut m = Mirror::default();
    drain(&db, &mut s, &mut m).await;
    assert_eq!(m.seen.last().map(|e| e.3), Some(Op::Delete));
}

#[tokio::test]
async fn commits_to_uncaptured_tables_move_the_checkpoint() {
    let db = server();
    db.create_table(&t("plain"), vec![ColumnDef::new("id", "int", false)], &["id"]);
    let (mut s, _, _) = caught_up_source(&db).await;
    let at = db.commit(vec![FakeOp::Insert(t("plain"), vec![Value::Int32(1)])]).expect("insert");
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
    let (s, _, checkpoint) = caught_up_source(&db).await;
    drop(s);
    db.commit(vec![FakeOp::Insert(t("b"), row(1, 1))]).expect("insert");
    let last = db.commit(vec![FakeOp::Insert(t("b"), row(2, 1))]).expect("insert");
    // The cleanup job removes the first of the two while the source is down.
    db.cleanup(last);
    let mut s = source(&db, 10, 100);
    s.start(Some(checkpoint)).await.expect("start");
    let e = s.next_batch().await.expect_err("a gap");
    assert_eq!(e.kind(), ErrorKind::NeedsOperator);
    assert!(e.table().is_some(), "{e}");
    assert!(e.hint().is_some_and(|h| h.contains("reset")), "{e:?}");
    // Nothing was skipped silently: it fails again, and emitted nothing.
    assert!(s.next_batch().await.is_err());
}

#[tokio::test]
async fn a_cleanup_below_the_checkpoint_is_no_gap() {
    let db = server();
    db.commit(vec![FakeOp::Insert(t("a"), row(1, 1))]).expect("insert");
    let (mut s, mut m, _) = caught_up_source(&db).await;
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
    assert!(problems.iter().any(|p| p.fix.as_deref().is_some_and(|f| f.contains("EXEC sys.sp_cdc_enable_db"))));
}

#[tokio::test]
async fn a_disabled_capture_instance_without_a_successor_needs_the_operator() {
    let db = server();
    let (mut s, _, _) = caught_up_source(&db).await;
    db.disable_instance("dbo_a");
    db.commit(vec![FakeOp::Insert(t("b"), row(1, 1))]).expect("insert");
    let e = s.next_batch().await.expect_err("disabled");
    assert_eq!(e.kind(), ErrorKind::NeedsOperator);
    assert_eq!(e.table(), Some(&t("a")));
    assert!(e.hint().is_some_and(|h| h.contains("sp_cdc_enable_table")), "{e:?}");
}

/// One step of a random history.
#[derive(Debug, Clone)]
enum Step {
    /// A transaction of (table, id, qty or delete).
    Txn(Vec<(bool, i32, Option<i32>)>),
    /// Read one batch; acknowledge it or not.
    Read(bool),
    /// Crash and start from the last acknowledged checkpoint.
    Restart,
    /// ALTER TABLE a ADD note, and a second capture instance.
    Ddl,
    /// The next read of the server fails; the source goes on after it.
    Fault,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => prop::collection::vec((any::<bool>(), 0..12i32, prop::option::of(0..100i32)), 1..4).prop_map(Step::Txn),
        4 => any::<bool>().prop_map(Step::Read),
        1 => Just(Step::Restart),
        1 => Just(Step::Ddl),
        1 => Just(Step::Fault),
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
            for st in steps {
                match st {
                    Step::Txn(changes) => {
                        let mut ops = Vec::new();
                        for (in_a, id, qty) in changes {
                            let table = t(if in_a { "a" } else { "b" });
                            let width = if in_a && ddl { 3 } else { 2 };
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
                            checkpoint = Some(b.checkpoint);
                        } else {
                            // Read but never durable: the next restart drops it.
                            let mut again = source(&db, chunk, max_events);
                            again.start(checkpoint.clone()).await.unwrap();
                            s = again;
                        }
                    }
                    Step::Restart => {
                        s = source(&db, chunk, max_events);
                        s.start(checkpoint.clone()).await.unwrap();
                    }
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
                if caught_up(&db, &b.checkpoint) {
                    break;
                }
            }
            for name in ["a", "b"] {
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

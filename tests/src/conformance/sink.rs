//! The sink conformance suite: what every sink must do, written once.
//!
//! A sink joins it with a [`SinkFixture`] (a namespace of its own in the
//! real destination, and a way to read the `items` table back) and one
//! line in `tests/tests/sink_conformance.rs` listing the cases it runs.
//! Every case works on the `items` table of [`crate::items`]; rows are
//! compared as `id|name|qty|price` text, which every destination renders
//! alike.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tributary_connectors::{ErrorKind, Sink, SinkBatch, SinkRecord};
use tributary_schemas::{ChangeEvent, Column, DataType, Op, TableSchema, Value};

use crate::items::{assert_after_mixed_changes, batch, event, items, key_row, mixed_changes, row, truncate_changes};
use crate::kafka::EventTopic;
use crate::{runner_binary, unique, wait_for, Rng, Runner};

/// A destination under test, in a namespace of its own (a schema, a
/// dataset, a memory store) that [`SinkFixture::cleanup`] removes.
#[async_trait]
pub trait SinkFixture: Send + Sync {
    /// A sink writing `items` into the namespace, its offsets under `group`;
    /// with `drop_tables` and `drop_columns` when `drops`.
    fn sink(&self, group: &str, drops: bool) -> Box<dyn Sink>;

    /// A sink whose destination cannot be reached (a closed port).
    fn unreachable_sink(&self, group: &str) -> Box<dyn Sink>;

    /// `id|name|qty|price` of every row of `items`, by id (`∅` for NULL;
    /// empty while the table does not exist).
    async fn rows(&self) -> Vec<String>;

    /// The text of `column` of every row of `items`, by id (`None` for NULL).
    async fn column(&self, column: &str) -> Vec<Option<String>>;

    /// Whether the `items` table exists.
    async fn exists(&self) -> bool;

    /// Whether the `items` table has `column`.
    async fn has_column(&self, column: &str) -> bool;

    /// The destination section of a sink runner's config file, for the
    /// cases that run the `sink-runner` binary; `None` for a destination
    /// that lives in the test process.
    fn runner_section(&self) -> Option<String>;

    /// Removes the namespace.
    async fn cleanup(&self);
}

const TOPIC: &str = "conformance.items";

fn offsets(n: i64) -> Vec<Option<i64>> {
    vec![Some(n)]
}

async fn stored(sink: &mut Box<dyn Sink>) -> Vec<Option<i64>> {
    sink.committed_offsets(&[(TOPIC.to_string(), 0)])
        .await
        .expect("committed offsets")
}

/// A batch of `records` of `table`, each at its (partition, offset), with
/// the next offset of every partition it covers.
fn on_partitions(table: &tributary_schemas::TableId, records: Vec<(i32, i64, SinkRecord)>) -> SinkBatch {
    let mut next: BTreeMap<i32, i64> = BTreeMap::new();
    let records = records
        .into_iter()
        .map(|(partition, offset, r)| {
            next.insert(partition, offset + 1);
            (tributary_connectors::KafkaPosition { topic: TOPIC.into(), partition, offset }, r)
        })
        .collect();
    SinkBatch {
        table: table.clone(),
        records,
        next_offsets: next.into_iter().map(|(p, o)| (TOPIC.to_string(), p, o)).collect(),
        expected_offsets: Vec::new(),
        unit: tributary_connectors::UnitPart::default(),
    }
}

/// A change event alone on partition 1 at `offset`.
fn on_partition_1(ev: ChangeEvent, offset: i64) -> SinkBatch {
    on_partitions(&ev.schema.id.clone(), vec![(1, offset, SinkRecord::Change(ev))])
}

fn snapshot_events(s: &std::sync::Arc<TableSchema>, n: i32) -> Vec<ChangeEvent> {
    (1..=n)
        .map(|i| event(s, Op::Read, None, Some(row(i, &format!("item {i}"), i, "1.50")), 10, 0))
        .collect()
}

/// A snapshot (reads of 100 rows) lands whole, with its offsets.
pub async fn snapshot(fx: &dyn SinkFixture) {
    let mut sink = fx.sink(&unique("g"), false);
    let s = items();
    assert_eq!(stored(&mut sink).await, vec![None], "no offsets before the first batch");
    sink.apply(&batch(TOPIC, 0, snapshot_events(&s, 100))).await.expect("snapshot");
    let rows = fx.rows().await;
    assert_eq!(rows.len(), 100);
    assert_eq!(rows[0], "1|item 1|1|1.50");
    assert_eq!(stored(&mut sink).await, offsets(100));
}

/// Updates, deletes, inserts, a delete then insert, an insert then delete
/// and a key change, in one batch on top of a snapshot.
pub async fn upserts_and_deletes(fx: &dyn SinkFixture) {
    let mut sink = fx.sink(&unique("g"), false);
    let s = items();
    sink.apply(&batch(TOPIC, 0, snapshot_events(&s, 100))).await.expect("snapshot");
    sink.apply(&batch(TOPIC, 100, mixed_changes(&s))).await.expect("changes");
    assert_after_mixed_changes(&fx.rows().await);
    assert_eq!(stored(&mut sink).await, offsets(109));
}

/// A truncate removes the older rows; a change after it stays, one older
/// than it does not.
pub async fn truncate(fx: &dyn SinkFixture) {
    let mut sink = fx.sink(&unique("g"), false);
    let s = items();
    sink.apply(&batch(TOPIC, 0, snapshot_events(&s, 10))).await.expect("snapshot");
    sink.apply(&batch(TOPIC, 10, truncate_changes(&s))).await.expect("truncate");
    assert_eq!(fx.rows().await, vec!["500|after|1|1.00"]);
}

/// Applying the last batch again changes nothing (a crash after the commit
/// whose answer was lost), on the same sink and on a fresh one (a restarted
/// runner). (Replaying an older batch after a later delete is the
/// exactly-once issue's case.)
pub async fn replayed_batch(fx: &dyn SinkFixture) {
    let group = unique("g");
    let mut sink = fx.sink(&group, false);
    let s = items();
    sink.apply(&batch(TOPIC, 0, snapshot_events(&s, 100))).await.expect("snapshot");
    let changes = batch(TOPIC, 100, mixed_changes(&s));
    sink.apply(&changes).await.expect("changes");
    let once = fx.rows().await;
    sink.apply(&changes).await.expect("replay");
    assert_eq!(fx.rows().await, once, "a replay moves no row");
    let mut fresh = fx.sink(&group, false);
    fresh.apply(&changes).await.expect("replay on a fresh sink");
    assert_eq!(fx.rows().await, once, "a replay moves no row");
    assert_eq!(stored(&mut fresh).await, offsets(109));
}

/// An older change of a key never moves its row backwards, in a later batch
/// or in the same one.
pub async fn older_event(fx: &dyn SinkFixture) {
    let mut sink = fx.sink(&unique("g"), false);
    let s = items();
    sink.apply(&batch(TOPIC, 0, vec![event(&s, Op::Create, None, Some(row(1, "new", 2, "2.00")), 20, 0)]))
        .await
        .expect("newer");
    sink.apply(&batch(TOPIC, 1, vec![event(&s, Op::Update, None, Some(row(1, "old", 1, "1.00")), 19, 5)]))
        .await
        .expect("older");
    sink.apply(&batch(
        TOPIC,
        2,
        vec![
            event(&s, Op::Update, None, Some(row(2, "second", 2, "2.00")), 30, 1),
            event(&s, Op::Update, None, Some(row(2, "first", 1, "1.00")), 30, 0),
        ],
    ))
    .await
    .expect("both orders in one batch");
    assert_eq!(fx.rows().await, vec!["1|new|2|2.00", "2|second|2|2.00"]);
}

/// A delete with the older changes of its key, in any order in one batch,
/// leaves the key deleted, and so does that batch again. (An older change
/// in a later batch than the delete is the exactly-once issue's case.)
pub async fn deleted_row_stays_deleted(fx: &dyn SinkFixture) {
    let mut sink = fx.sink(&unique("g"), false);
    let s = items();
    sink.apply(&batch(TOPIC, 0, snapshot_events(&s, 3))).await.expect("snapshot");
    let changes = batch(
        TOPIC,
        3,
        vec![
            event(&s, Op::Delete, Some(key_row(1)), None, 40, 0),
            event(&s, Op::Update, None, Some(row(1, "older", 9, "9.00")), 39, 0),
            event(&s, Op::Create, None, Some(row(7, "brief", 1, "1.00")), 41, 0),
            event(&s, Op::Update, None, Some(row(7, "briefer", 2, "1.00")), 41, 1),
            event(&s, Op::Delete, Some(key_row(7)), None, 41, 2),
        ],
    );
    sink.apply(&changes).await.expect("deletes");
    sink.apply(&changes).await.expect("deletes again");
    let rows = fx.rows().await;
    assert!(!rows.iter().any(|r| r.starts_with("1|") || r.starts_with("7|")), "{rows:?}");
    assert_eq!(rows.len(), 2);
}

/// A change older than a row's delete, arriving in a later batch (a
/// member that lost its partition, the old key's events on another
/// partition, a replayed dead letter), never brings the row back; a newer
/// one does, and then an older one cannot move it backwards.
pub async fn older_change_after_delete_stays_deleted(fx: &dyn SinkFixture) {
    let mut sink = fx.sink(&unique("g"), false);
    let s = items();
    sink.apply(&batch(TOPIC, 0, snapshot_events(&s, 3))).await.expect("snapshot");
    sink.apply(&batch(TOPIC, 3, vec![event(&s, Op::Delete, Some(key_row(1)), None, 40, 0)]))
        .await
        .expect("delete");
    // Older than the delete, each in a batch of its own, on another
    // partition: an update, an insert, and a read (a snapshot's).
    for (n, ev) in [
        event(&s, Op::Update, None, Some(row(1, "stale update", 9, "9.00")), 39, 0),
        event(&s, Op::Create, None, Some(row(1, "stale insert", 9, "9.00")), 30, 2),
        event(&s, Op::Read, None, Some(row(1, "stale read", 9, "9.00")), 40, 0),
    ]
    .into_iter()
    .enumerate()
    {
        sink.apply(&on_partition_1(ev, n as i64)).await.expect("older change");
        let rows = fx.rows().await;
        assert!(!rows.iter().any(|r| r.starts_with("1|")), "an older change brought row 1 back: {rows:?}");
    }
    // A newer insert of the key writes it again; older ones then lose to it.
    sink.apply(&batch(TOPIC, 4, vec![event(&s, Op::Create, None, Some(row(1, "again", 5, "5.00")), 50, 0)]))
        .await
        .expect("newer insert");
    sink.apply(&on_partition_1(event(&s, Op::Update, None, Some(row(1, "stale", 9, "9.00")), 45, 0), 3))
        .await
        .expect("older update");
    let rows = fx.rows().await;
    assert!(rows.contains(&"1|again|5|5.00".to_string()), "{rows:?}");
    // Deleted again; an older change after it still cannot bring it back.
    sink.apply(&batch(TOPIC, 5, vec![event(&s, Op::Delete, Some(key_row(1)), None, 60, 0)]))
        .await
        .expect("second delete");
    sink.apply(&on_partition_1(event(&s, Op::Update, None, Some(row(1, "stale", 9, "9.00")), 55, 0), 4))
        .await
        .expect("older update again");
    let rows = fx.rows().await;
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert!(!rows.iter().any(|r| r.starts_with("1|")), "{rows:?}");
}

/// An update that changes a row's key deletes the old key at its position
/// (on the new key's partition): older events of the old key, applied
/// later from their own partition, do not bring it back.
pub async fn key_change_across_partitions(fx: &dyn SinkFixture) {
    let mut sink = fx.sink(&unique("g"), false);
    let s = items();
    sink.apply(&batch(TOPIC, 0, snapshot_events(&s, 3))).await.expect("snapshot");
    // Partition 0 carries the key change 2 -> 20 at 30.
    sink.apply(&batch(
        TOPIC,
        3,
        vec![event(
            &s,
            Op::Update,
            Some(row(2, "item 2", 2, "1.50")),
            Some(row(20, "moved", 2, "1.50")),
            30,
            0,
        )],
    ))
    .await
    .expect("key change");
    // Partition 1 still held an older update of key 2.
    sink.apply(&on_partition_1(event(&s, Op::Update, None, Some(row(2, "older", 7, "1.50")), 25, 0), 0))
        .await
        .expect("older update of the old key");
    let rows = fx.rows().await;
    assert!(!rows.iter().any(|r| r.starts_with("2|")), "the old key came back: {rows:?}");
    assert!(rows.contains(&"20|moved|2|1.50".to_string()), "{rows:?}");
}

/// An older change after a truncate (applied in an earlier batch) does not
/// bring a row back; a newer one writes it.
pub async fn older_change_after_truncate_stays_removed(fx: &dyn SinkFixture) {
    let mut sink = fx.sink(&unique("g"), false);
    let s = items();
    sink.apply(&batch(TOPIC, 0, snapshot_events(&s, 3))).await.expect("snapshot");
    sink.apply(&batch(TOPIC, 3, vec![event(&s, Op::Truncate, None, None, 40, 0)]))
        .await
        .expect("truncate");
    sink.apply(&on_partition_1(event(&s, Op::Update, None, Some(row(2, "older", 7, "1.50")), 35, 0), 0))
        .await
        .expect("older update");
    assert_eq!(fx.rows().await, Vec::<String>::new(), "an older change came back after the truncate");
    sink.apply(&batch(TOPIC, 4, vec![event(&s, Op::Create, None, Some(row(2, "newer", 7, "1.50")), 41, 0)]))
        .await
        .expect("newer insert");
    assert_eq!(fx.rows().await, vec!["2|newer|7|1.50".to_string()]);
}

/// Two members that both believe they own a partition: only the one whose
/// expected offset is what is stored commits; the other writes nothing, its
/// error is retryable and says it was fenced.
pub async fn fenced_member_writes_nothing(fx: &dyn SinkFixture) {
    let group = unique("g");
    let mut owner = fx.sink(&group, false);
    let mut zombie = fx.sink(&group, false);
    let s = items();
    let mut first = batch(TOPIC, 0, snapshot_events(&s, 3));
    first.expected_offsets = vec![(TOPIC.into(), 0, None)];
    owner.apply(&first).await.expect("first batch");
    // Both read offset 3 at their assignment; the owner commits first.
    let mut by_owner = batch(TOPIC, 3, vec![event(&s, Op::Update, None, Some(row(1, "owner", 1, "1.50")), 20, 0)]);
    by_owner.expected_offsets = vec![(TOPIC.into(), 0, Some(3))];
    owner.apply(&by_owner).await.expect("owner's batch");
    let mut by_zombie = batch(
        TOPIC,
        3,
        vec![
            event(&s, Op::Update, None, Some(row(1, "zombie", 1, "1.50")), 30, 0),
            event(&s, Op::Delete, Some(key_row(2)), None, 30, 1),
        ],
    );
    by_zombie.expected_offsets = vec![(TOPIC.into(), 0, Some(3))];
    let e = zombie.apply(&by_zombie).await.expect_err("the zombie's batch must be refused");
    assert_eq!(e.error.kind(), ErrorKind::Retryable, "{}", e.error);
    assert_eq!(e.error.class(), "tributary.fenced", "{}", e.error);
    assert_eq!(e.record, None);
    let rows = fx.rows().await;
    assert!(rows.contains(&"1|owner|1|1.50".to_string()) && rows.iter().any(|r| r.starts_with("2|")), "{rows:?}");
    assert_eq!(stored(&mut owner).await, offsets(4), "the zombie moved the offset");
    // Nothing may be stored where the batch expects none.
    let mut fresh = batch(TOPIC, 0, snapshot_events(&s, 1));
    fresh.expected_offsets = vec![(TOPIC.into(), 0, None)];
    let e = zombie.apply(&fresh).await.expect_err("an offset is stored already");
    assert_eq!(e.error.class(), "tributary.fenced", "{}", e.error);
    assert_eq!(stored(&mut owner).await, offsets(4));
    // From what is stored, the same member goes on.
    by_zombie.records.iter_mut().for_each(|(p, _)| p.offset += 1);
    by_zombie.next_offsets = vec![(TOPIC.into(), 0, 6)];
    by_zombie.expected_offsets = vec![(TOPIC.into(), 0, Some(4))];
    zombie.apply(&by_zombie).await.expect("from the stored offset");
    assert_eq!(stored(&mut owner).await, offsets(6));
}

/// A batch that fails moves neither rows nor offsets; the next one that
/// applies moves both.
pub async fn atomic_offsets(fx: &dyn SinkFixture) {
    let mut sink = fx.sink(&unique("g"), false);
    let s = items();
    sink.apply(&batch(TOPIC, 0, snapshot_events(&s, 10))).await.expect("snapshot");
    let before = fx.rows().await;
    // A change whose schema the destination cannot follow (qty becomes
    // text) after changes that would apply.
    let text_qty = schema_with(&s, |c| {
        if c.name == "qty" {
            c.data_type = DataType::Text;
            c.source_type = "text".into();
        }
    });
    let mut bad_row = row(3, "three", 3, "3.00");
    bad_row[2] = Value::Text("three".into());
    let failing = batch(
        TOPIC,
        10,
        vec![
            event(&s, Op::Update, None, Some(row(1, "changed", 1, "1.00")), 50, 0),
            event(&text_qty, Op::Update, None, Some(bad_row), 51, 0),
        ],
    );
    let err = sink.apply(&failing).await.expect_err("an incompatible change fails");
    assert_eq!(err.error.kind(), ErrorKind::Permanent, "{}", err.error);
    assert_eq!(fx.rows().await, before, "no row moved");
    assert_eq!(stored(&mut sink).await, offsets(10), "no offset moved");
    let mut rest = failing.clone();
    rest.records.truncate(1);
    sink.apply(&rest).await.expect("the rest applies");
    assert!(fx.rows().await.contains(&"1|changed|1|1.00".to_string()));
    assert_eq!(stored(&mut sink).await, offsets(12), "the offsets cover the dead-lettered record too");
}

/// A permanent error caused by one record names it (here: a schema change
/// the destination cannot follow), so the runner can dead-letter exactly it.
pub async fn permanent_error_names_the_record(fx: &dyn SinkFixture) {
    let mut sink = fx.sink(&unique("g"), false);
    let s = items();
    sink.apply(&batch(TOPIC, 0, snapshot_events(&s, 5))).await.expect("snapshot");
    let text_qty = schema_with(&s, |c| {
        if c.name == "qty" {
            c.data_type = DataType::Text;
            c.source_type = "text".into();
        }
    });
    let mut bad_row = row(4, "four", 4, "4.00");
    bad_row[2] = Value::Text("four".into());
    let mut events: Vec<ChangeEvent> = (0..6)
        .map(|i| event(&s, Op::Update, None, Some(row(i + 1, "x", i, "1.00")), 60, i as u64))
        .collect();
    events.insert(4, event(&text_qty, Op::Update, None, Some(bad_row), 60, 99));
    let err = sink.apply(&batch(TOPIC, 5, events)).await.expect_err("fails");
    assert_eq!(err.error.kind(), ErrorKind::Permanent, "{}", err.error);
    assert_eq!(err.record, Some(4), "names the record: {}", err.error);
    assert_eq!(err.error.column(), Some("qty"), "names the column: {}", err.error);
    assert!(err.error.table().is_some(), "names the table: {}", err.error);
}

/// A row the destination refuses (NULL in a column the source declared NOT
/// NULL, and later sent NULL anyway) when the batch is written: the sink
/// names the record (finding it by bisection where the destination does not
/// say which row), nothing of the batch stays, and without the record the
/// batch applies.
pub async fn refused_row_is_named(fx: &dyn SinkFixture) {
    let mut sink = fx.sink(&unique("g"), false);
    let mut strict = (*items()).clone();
    strict.columns[1].nullable = false;
    let s = std::sync::Arc::new(strict);
    sink.apply(&batch(TOPIC, 0, snapshot_events(&s, 20))).await.expect("snapshot");
    let before = fx.rows().await;
    let events: Vec<ChangeEvent> = (1..=12)
        .map(|i| {
            let mut r = row(i, &format!("u{i}"), i, "1.00");
            if i == 8 {
                r[1] = Value::Null;
            }
            event(&s, Op::Update, None, Some(r), 70, i as u64)
        })
        .collect();
    let failing = batch(TOPIC, 20, events);
    let err = sink.apply(&failing).await.expect_err("refused");
    assert_eq!(err.error.kind(), ErrorKind::Permanent, "{}", err.error);
    assert_eq!(err.record, Some(7), "the refused record: {}", err.error);
    assert_eq!(fx.rows().await, before, "nothing of the batch stays");
    assert_eq!(stored(&mut sink).await, offsets(20));
    let mut rest = failing.clone();
    rest.records.remove(7);
    sink.apply(&rest).await.expect("the rest applies");
    assert!(fx.rows().await.contains(&"12|u12|12|1.00".to_string()));
    assert_eq!(stored(&mut sink).await, offsets(32));
}

/// A destination that cannot be reached is a retryable error, for apply
/// and for the offsets lookup alike; `check` reports it.
pub async fn unreachable_is_retryable(fx: &dyn SinkFixture) {
    let mut sink = fx.unreachable_sink(&unique("g"));
    let s = items();
    let err = sink
        .apply(&batch(TOPIC, 0, snapshot_events(&s, 1)))
        .await
        .expect_err("unreachable");
    assert_eq!(err.error.kind(), ErrorKind::Retryable, "{}", err.error);
    let err = sink.committed_offsets(&[(TOPIC.into(), 0)]).await.expect_err("unreachable");
    assert_eq!(err.kind(), ErrorKind::Retryable, "{err}");
    assert!(!sink.check().await.is_empty(), "check reports the unreachable destination");
}

/// A trial apply says whether a batch would apply and changes nothing.
pub async fn trial_apply_changes_nothing(fx: &dyn SinkFixture) {
    let mut sink = fx.sink(&unique("g"), false);
    let s = items();
    sink.apply(&batch(TOPIC, 0, snapshot_events(&s, 10))).await.expect("snapshot");
    let before = fx.rows().await;
    sink.trial_apply(&batch(TOPIC, 10, mixed_changes(&s)))
        .await
        .expect("would apply");
    assert_eq!(fx.rows().await, before);
    assert_eq!(stored(&mut sink).await, offsets(10));
}

/// `check` passes on a usable destination; `delete_copy` removes the
/// copy's offsets (and the tables it is given).
pub async fn check_and_delete_copy(fx: &dyn SinkFixture) {
    let mut sink = fx.sink(&unique("g"), false);
    let problems = sink.check().await;
    assert!(problems.iter().all(|p| p.severity != tributary_connectors::Severity::Error), "{problems:?}");
    let s = items();
    sink.apply(&batch(TOPIC, 0, snapshot_events(&s, 3))).await.expect("snapshot");
    let done = sink.delete_copy(std::slice::from_ref(&s.id)).await.expect("delete copy");
    assert!(!done.is_empty());
    assert_eq!(stored(&mut sink).await, vec![None], "offsets gone");
    assert!(!fx.exists().await, "table dropped");
}

/// A table dropped in the source is dropped only when configured, after
/// the changes before it.
pub async fn table_drop_when_configured(fx: &dyn SinkFixture) {
    let s = items();
    let dropped = |offset: i64| SinkBatch {
        table: s.id.clone(),
        records: vec![(
            tributary_connectors::KafkaPosition { topic: TOPIC.into(), partition: 0, offset },
            SinkRecord::TableDropped(s.id.clone()),
        )],
        next_offsets: vec![(TOPIC.into(), 0, offset + 1)],
        expected_offsets: Vec::new(),
        unit: tributary_connectors::UnitPart::default(),
    };
    let mut keeping = fx.sink(&unique("g"), false);
    keeping.apply(&batch(TOPIC, 0, snapshot_events(&s, 3))).await.expect("snapshot");
    keeping.apply(&dropped(3)).await.expect("drop kept");
    assert_eq!(fx.rows().await.len(), 3, "kept (drop_tables = false)");
    let mut dropping = fx.sink(&unique("g"), true);
    dropping.apply(&dropped(0)).await.expect("drop");
    assert!(!fx.exists().await, "dropped (drop_tables = true)");
}

/// A copy from another position domain (a source epoch change, or
/// `source-runner reset`): the table-reset record, on every partition,
/// forgets the stored positions once per reset id, so the copy's rows,
/// older by number than the stored ones, are written; the later
/// partition's copy of the same reset (after rows of the copy, and applied
/// again) forgets nothing more; the table-copied record then removes the
/// rows the copy did not read; the stream goes on. A reset of a table that
/// does not exist yet is only recorded.
pub async fn reset_then_copy(fx: &dyn SinkFixture) {
    let mut sink = fx.sink(&unique("g"), false);
    let s = items();
    let records = |records: Vec<(i32, i64, SinkRecord)>| on_partitions(&s.id, records);
    let reset = |id: u64| SinkRecord::Reset(s.id.clone(), id);
    let read =
        |id: i32, name: &str| SinkRecord::Change(event(&s, Op::Read, None, Some(row(id, name, id, "1.00")), 10, 0));
    sink.apply(&records(vec![(0, 0, reset(1))]))
        .await
        .expect("a reset before the table exists");
    // The old domain's rows, at positions above the new domain's.
    let mut old: Vec<ChangeEvent> = (1..=5)
        .map(|i| event(&s, Op::Read, None, Some(row(i, &format!("old {i}"), i, "9.00")), 1_000_000, 0))
        .collect();
    // A delete's entry of the old domain must not keep the copy's row out.
    old.push(event(&s, Op::Delete, Some(key_row(4)), None, 1_000_001, 0));
    let mut first = batch(TOPIC, 1, old);
    first.next_offsets = vec![(TOPIC.into(), 0, 6)];
    sink.apply(&first).await.expect("the old domain's rows");
    // Partition 0's reset and copy rows, then partition 1's (the same reset).
    sink.apply(&records(vec![(0, 6, reset(7)), (0, 7, read(1, "copy 1")), (0, 8, read(2, "copy 2"))]))
        .await
        .expect("reset and copy on partition 0");
    let second = records(vec![(1, 0, reset(7)), (1, 1, read(3, "copy 3")), (1, 2, read(4, "copy 4"))]);
    sink.apply(&second).await.expect("the same reset and copy on partition 1");
    sink.apply(&second).await.expect("partition 1's batch again");
    assert_eq!(
        fx.rows().await,
        vec![
            "1|copy 1|1|1.00",
            "2|copy 2|2|1.00",
            "3|copy 3|3|1.00",
            "4|copy 4|4|1.00",
            "5|old 5|5|9.00"
        ],
        "the copy's rows are written, the later reset records forget nothing"
    );
    let at = tributary_schemas::Position { commit: 10, index: 0 };
    sink.apply(&records(vec![
        (0, 9, SinkRecord::Change(event(&s, Op::Update, None, Some(row(2, "streamed", 2, "2.00")), 20, 0))),
        (1, 3, SinkRecord::Change(event(&s, Op::Delete, Some(key_row(3)), None, 21, 0))),
        (0, 10, SinkRecord::Copied(s.id.clone(), at)),
        (1, 4, SinkRecord::Copied(s.id.clone(), at)),
    ]))
    .await
    .expect("the stream and the table-copied records");
    assert_eq!(
        fx.rows().await,
        vec!["1|copy 1|1|1.00", "2|streamed|2|2.00", "4|copy 4|4|1.00"],
        "the row the copy did not read is gone, the stream's changes are applied"
    );
}

/// One unit (one Kafka batch) holding a table's changes on both sides of
/// its reset and table-copied records: each run of changes is written once,
/// in its place. Before 2026-12-03 the BigQuery sink tagged every staged
/// row of a unit alike, so each later `MERGE` read the earlier runs' rows
/// again: the old domain's rows went back over the copy's, and a row the
/// copy removed came back (the fault suite's offsets-topic-loss left rows
/// twice in BigQuery).
pub async fn changes_around_a_reset_in_one_unit(fx: &dyn SinkFixture) {
    let mut sink = fx.sink(&unique("g"), false);
    let s = items();
    let records = |records: Vec<(i32, i64, SinkRecord)>| on_partitions(&s.id, records);
    let change = |op: Op, id: i32, name: &str, commit: u64| {
        SinkRecord::Change(event(&s, op, None, Some(row(id, name, id, "1.00")), commit, 0))
    };
    let old: Vec<ChangeEvent> = (1..=3)
        .map(|i| event(&s, Op::Read, None, Some(row(i, &format!("old {i}"), i, "9.00")), 1_000_000, 0))
        .collect();
    sink.apply(&batch(TOPIC, 0, old)).await.expect("the rows before the reset");
    let at = tributary_schemas::Position { commit: 10, index: 0 };
    sink.apply(&records(vec![
        // The old domain's last changes: a row updated, one inserted (then
        // deleted at the source before the copy read the table).
        (0, 3, change(Op::Update, 1, "old 1 updated", 1_000_001)),
        (0, 4, change(Op::Create, 9, "gone before the copy", 1_000_002)),
        (0, 5, SinkRecord::Reset(s.id.clone(), 7)),
        (0, 6, change(Op::Read, 1, "copy 1", 10)),
        (0, 7, change(Op::Read, 2, "copy 2", 10)),
        (0, 8, SinkRecord::Copied(s.id.clone(), at)),
        (0, 9, change(Op::Update, 2, "streamed", 20)),
    ]))
    .await
    .expect("old changes, reset, copy, table-copied and the stream in one unit");
    assert_eq!(
        fx.rows().await,
        vec!["1|copy 1|1|1.00", "2|streamed|2|1.00"],
        "every run of changes is written once, in its place: the copy's rows over the old ones, \
         the rows the copy did not read gone, the stream after it"
    );
}

/// A copy over two partitions whose partitions are applied at different
/// speeds (two sink members, or one partition behind): partition 0's
/// table-copied record (at the copy's position) is applied before partition
/// 1's reads, which carry that same position (every row of a snapshot does).
/// They are the copy's rows, not older than it: they are written. Until
/// 2026-12-02 the table-wide entry refused a change at its own position,
/// and the fault suite's offsets-topic-loss lost about half of each table.
pub async fn copy_rows_after_another_partitions_sweep(fx: &dyn SinkFixture) {
    let mut sink = fx.sink(&unique("g"), false);
    let s = items();
    let records = |records: Vec<(i32, i64, SinkRecord)>| on_partitions(&s.id, records);
    let reset = |id: u64| SinkRecord::Reset(s.id.clone(), id);
    let read =
        |id: i32, name: &str| SinkRecord::Change(event(&s, Op::Read, None, Some(row(id, name, id, "1.00")), 10, 0));
    let old: Vec<ChangeEvent> = (1..=4)
        .map(|i| event(&s, Op::Read, None, Some(row(i, &format!("old {i}"), i, "9.00")), 5, 0))
        .collect();
    sink.apply(&batch(TOPIC, 0, old)).await.expect("the rows before the reset");
    let at = tributary_schemas::Position { commit: 10, index: 0 };
    sink.apply(&records(vec![
        (0, 4, reset(7)),
        (0, 5, read(1, "copy 1")),
        (0, 6, read(2, "copy 2")),
        (0, 7, SinkRecord::Copied(s.id.clone(), at)),
    ]))
    .await
    .expect("partition 0: reset, copy, table-copied");
    sink.apply(&records(vec![
        (1, 0, reset(7)),
        (1, 1, read(3, "copy 3")),
        (1, 2, SinkRecord::Copied(s.id.clone(), at)),
    ]))
    .await
    .expect("partition 1: the same reset, its copy rows, table-copied");
    assert_eq!(
        fx.rows().await,
        vec!["1|copy 1|1|1.00", "2|copy 2|2|1.00", "3|copy 3|3|1.00"],
        "the copy's rows of the later partition are written; the row it did not read is gone"
    );
}

/// Schema changes reach the destination before the first row that needs
/// them: a column added, a type widened (int -> bigint), NOT NULL relaxed.
pub async fn schema_changes_evolve_the_table(fx: &dyn SinkFixture) {
    let mut sink = fx.sink(&unique("g"), false);
    let s = items();
    sink.apply(&batch(TOPIC, 0, snapshot_events(&s, 2))).await.expect("snapshot");
    let wider = schema_with(&s, |c| {
        if c.name == "qty" {
            c.data_type = DataType::Int64;
            c.source_type = "bigint".into();
        }
    });
    let mut noted = (*wider).clone();
    noted.columns.push(Column {
        name: "note".into(),
        data_type: DataType::Text,
        nullable: true,
        source_type: "text".into(),
        default: None,
        aliases: Vec::new(),
        column_id: None,
    });
    let noted = std::sync::Arc::new(noted);
    let mut big = row(3, "big", 0, "3.00");
    big[2] = Value::Int64(5_000_000_000);
    let mut with_note = row(4, "noted", 0, "4.00");
    with_note[2] = Value::Int64(4);
    with_note.push(Value::Text("hello".into()));
    sink.apply(&batch(
        TOPIC,
        2,
        vec![
            event(&wider, Op::Create, None, Some(big), 80, 0),
            event(&noted, Op::Create, None, Some(with_note), 81, 0),
        ],
    ))
    .await
    .expect("evolved");
    let rows = fx.rows().await;
    assert!(rows.contains(&"3|big|5000000000|3.00".to_string()), "{rows:?}");
    assert!(rows.contains(&"4|noted|4|4.00".to_string()), "{rows:?}");
    assert_eq!(fx.column("note").await, vec![None, None, None, Some("hello".to_string())]);
}

/// A column added with a default reaches every row the source gave it to:
/// the rows already in the destination, and rows of the older schema
/// version that the batch writes after the column was added (read before
/// the ALTER, applied after it: a lagging snapshot, another partition).
/// Until 2026-12-06 a warehouse that writes the versions' columns together
/// wrote NULL for them (found by the fault suite's ddl fault on Snowflake).
pub async fn older_rows_get_an_added_columns_default(fx: &dyn SinkFixture) {
    let mut sink = fx.sink(&unique("g"), false);
    let s = items();
    sink.apply(&batch(TOPIC, 0, snapshot_events(&s, 2))).await.expect("snapshot");
    let mut flagged = (*s).clone();
    flagged.columns.push(Column {
        name: "flag".into(),
        data_type: DataType::Int32,
        nullable: true,
        source_type: "integer".into(),
        default: Some("7".into()),
        aliases: Vec::new(),
        column_id: None,
    });
    let flagged = std::sync::Arc::new(flagged);
    let mut three = row(3, "new", 3, "3.00");
    three.push(Value::Int32(9));
    sink.apply(&batch(
        TOPIC,
        2,
        vec![
            event(&flagged, Op::Create, None, Some(three), 80, 0),
            // Older than the ALTER, applied after it.
            event(&s, Op::Create, None, Some(row(4, "older", 4, "4.00")), 70, 0),
            event(&s, Op::Update, None, Some(row(1, "older update", 1, "1.00")), 71, 0),
        ],
    ))
    .await
    .expect("applied");
    assert_eq!(
        fx.column("flag").await,
        vec![
            Some("7".to_string()),
            Some("7".to_string()),
            Some("9".to_string()),
            Some("7".to_string())
        ],
        "every row the source gave the default to holds it (ids 1, 2, 3, 4)"
    );
}

/// `items` with `qty` renamed to `quantity` (the source's `RENAME COLUMN`:
/// the new name carries the old one as an alias).
fn renamed_qty(s: &TableSchema) -> std::sync::Arc<TableSchema> {
    schema_with(s, |c| {
        if c.name == "qty" {
            c.name = "quantity".into();
            c.aliases = vec!["qty".into()];
        }
    })
}

/// A renamed column is renamed in the destination with its values, never
/// split into an old full column and a new empty one: in the batch that
/// renames it (with older-shape events after the renaming one, as from a
/// second partition), and for an older-shape event in a later batch (a
/// replay) on a fresh sink.
pub async fn renamed_column_keeps_its_values(fx: &dyn SinkFixture) {
    let group = unique("g");
    let mut sink = fx.sink(&group, false);
    let s = items();
    sink.apply(&batch(TOPIC, 0, snapshot_events(&s, 3))).await.expect("snapshot");
    let renamed = renamed_qty(&s);
    sink.apply(&batch(
        TOPIC,
        3,
        vec![
            event(&renamed, Op::Update, None, Some(row(1, "item 1", 10, "1.50")), 80, 0),
            // Written before the rename, read after it.
            event(&s, Op::Update, None, Some(row(2, "item 2", 20, "1.50")), 70, 0),
        ],
    ))
    .await
    .expect("renamed");
    assert_eq!(
        fx.column("quantity").await,
        vec![Some("10".to_string()), Some("20".to_string()), Some("3".to_string())],
        "the values follow the column's new name"
    );
    let mut fresh = fx.sink(&group, false);
    // The decoder reads a late older-shape event with the newest names; a
    // sink given the older shape alone must not bring the old column back
    // with the value. (It may only do what the older shape says; the
    // position guard keeps the newer row.)
    fresh
        .apply(&batch(
            TOPIC,
            5,
            vec![event(
                &renamed,
                Op::Create,
                None,
                Some(row(4, "item 4", 40, "4.00")),
                90,
                0,
            )],
        ))
        .await
        .expect("after the rename");
    assert_eq!(
        fx.column("quantity").await,
        vec![
            Some("10".to_string()),
            Some("20".to_string()),
            Some("3".to_string()),
            Some("40".to_string())
        ]
    );
}

/// A column the source dropped stays by default (NULL in new rows) and is
/// dropped with `drop_columns`, but only for a version that records the
/// drop: an older shape without a column never drops it.
pub async fn dropped_column_when_configured(fx: &dyn SinkFixture) {
    let s = items();
    let mut keeping = fx.sink(&unique("g"), false);
    keeping.apply(&batch(TOPIC, 0, snapshot_events(&s, 2))).await.expect("snapshot");
    let mut without = (*s).clone();
    without.columns.retain(|c| c.name != "price");
    let older = std::sync::Arc::new(without.clone());
    without.dropped = vec!["price".into()];
    let without = std::sync::Arc::new(without);
    let short = |id: i32, name: &str| vec![Value::Int32(id), Value::Text(name.into()), Value::Int32(id)];
    keeping
        .apply(&batch(TOPIC, 2, vec![event(&without, Op::Create, None, Some(short(3, "three")), 80, 0)]))
        .await
        .expect("kept");
    assert_eq!(fx.column("price").await, vec![Some("1.50".to_string()), Some("1.50".to_string()), None]);
    let mut dropping = fx.sink(&unique("g"), true);
    dropping
        .apply(&batch(TOPIC, 0, vec![event(&older, Op::Create, None, Some(short(4, "four")), 81, 0)]))
        .await
        .expect("older shape");
    assert!(fx.has_column("price").await, "an older shape without the column does not drop it");
    assert_eq!(fx.column("price").await.len(), 4);
    dropping
        .apply(&batch(TOPIC, 1, vec![event(&without, Op::Create, None, Some(short(5, "five")), 82, 0)]))
        .await
        .expect("dropped");
    assert!(!fx.has_column("price").await, "dropped with drop_columns");
    assert_eq!(fx.column("name").await.len(), 5, "every row stays");
}

/// The sink runner is killed (SIGKILL) again and again while it applies a
/// snapshot and a stream of changes on 3 partitions; in the end the
/// destination equals the source: nothing lost, nothing twice.
pub async fn kill_9_mid_apply(fx: &dyn SinkFixture) {
    let section = fx.runner_section().expect("a destination the sink-runner binary can reach");
    let seed = std::env::var("TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| uuid::Uuid::new_v4().as_u128() as u64 | 1);
    eprintln!("TEST_SEED={seed}");
    let mut rng = Rng(seed | 1);
    let bin = runner_binary("sink-runner");
    let mut topic = EventTopic::new("kill", 3).await;
    let group = unique("kill");
    let dir = std::env::temp_dir().join(unique("tributary-kill"));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let config_path = dir.join("sink.toml");
    std::fs::write(&config_path, topic.sink_runner_config(&group, &section)).expect("write config");
    let log = dir.join("sink.log");
    eprintln!("runner log: {}", log.display());
    let offsets_sink = tokio::sync::Mutex::new(fx.sink(&group, false));
    let partitions: Vec<(String, i32)> = (0..3).map(|p| (topic.topic.clone(), p)).collect();
    let progress = || applied(&offsets_sink, &partitions);

    let s = items();
    let mut expected: BTreeMap<i32, String> = BTreeMap::new();
    let mut commit = 100u64;
    let rows = 3_000;
    let snapshot: Vec<ChangeEvent> = (0..rows)
        .map(|i| {
            expected.insert(i, format!("{i}|n{i}|{i}|1.00"));
            event(&s, Op::Read, None, Some(row(i, &format!("n{i}"), i, "1.00")), commit, 0)
        })
        .collect();
    for chunk in snapshot.chunks(1000) {
        topic.produce(chunk).await;
    }
    let mut child: Option<Runner> = None;
    for round in 0..5 {
        // Changes keep coming while the runner lives and dies.
        for _ in 0..4 {
            commit += 1;
            let mut txn = Vec::new();
            for index in 0..50u64 {
                let id = rng.below(rows as u64 + 300) as i32;
                let ev = if rng.below(5) == 0 {
                    expected.remove(&id);
                    event(&s, Op::Delete, Some(key_row(id)), None, commit, index)
                } else {
                    let qty = rng.below(1000) as i32;
                    expected.insert(id, format!("{id}|r{round}|{qty}|2.00"));
                    event(&s, Op::Update, None, Some(row(id, &format!("r{round}"), qty, "2.00")), commit, index)
                };
                txn.push(ev);
            }
            topic.produce(&txn).await;
        }
        if child.is_none() {
            child = Some(Runner::start("sink-runner", &config_path, &log));
        }
        // Kill while it works: once it made progress, after a random
        // moment (often in the middle of a batch).
        let before = progress().await;
        let started = Instant::now();
        while progress().await == before && started.elapsed() < Duration::from_secs(60) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        eprintln!("round {round}: progress after {:?}", started.elapsed());
        tokio::time::sleep(Duration::from_millis(rng.below(400))).await;
        if let Some(c) = child.take() {
            c.kill9();
            eprintln!("round {round}: killed");
        }
    }
    let last = Runner::start("sink-runner", &config_path, &log);
    let want: Vec<String> = expected.values().cloned().collect();
    let end: i64 = topic.end_offsets().values().sum();
    wait_for("the copy to equal the source", Duration::from_secs(240), || async {
        // Transaction markers take an offset after each partition's last record.
        (progress().await >= end - 3 && fx.rows().await == want).then_some(())
    })
    .await;
    last.kill9();
    let got = fx.rows().await;
    assert_eq!(got.len(), expected.len(), "no duplicates, nothing lost");
    assert_eq!(got, want);
    drop(bin);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The offsets stored for `partitions`, summed (0 while there are none or
/// the destination does not answer).
async fn applied(sink: &tokio::sync::Mutex<Box<dyn Sink>>, partitions: &[(String, i32)]) -> i64 {
    let mut sink = sink.lock().await;
    sink.committed_offsets(partitions)
        .await
        .map(|o| o.into_iter().flatten().sum::<i64>())
        .unwrap_or(0)
}

/// `s` with a change to its columns.
fn schema_with(s: &TableSchema, change: impl Fn(&mut Column)) -> std::sync::Arc<TableSchema> {
    let mut t = s.clone();
    t.columns.iter_mut().for_each(change);
    std::sync::Arc::new(t)
}

/// The fixture trait of this suite, by a name the `conformance!` macro knows.
pub use SinkFixture as Fixture;

// ------------------------------------------------------------ keyless tables

/// `items` without a key (a PostgreSQL table without a primary key and
/// REPLICA IDENTITY FULL, a MySQL table without a key): every column
/// nullable, the rows a multiset. Its events carry a null Kafka key.
fn keyless_items() -> std::sync::Arc<TableSchema> {
    let mut s = (*items()).clone();
    s.key = Vec::new();
    s.columns.iter_mut().for_each(|c| c.nullable = true);
    std::sync::Arc::new(s)
}

/// A row of [`keyless_items`]; `None` is NULL.
fn krow(id: Option<i32>, name: Option<&str>, qty: Option<i32>, price: Option<&str>) -> Vec<Value> {
    vec![
        id.map_or(Value::Null, Value::Int32),
        name.map_or(Value::Null, |n| Value::Text(n.into())),
        qty.map_or(Value::Null, Value::Int32),
        price.map_or(Value::Null, |p| Value::Decimal(p.into())),
    ]
}

/// `id|name|qty|price` of a [`krow`], as [`keyless_rows`] gives it.
fn ktext(row: &[Value]) -> String {
    row.iter()
        .map(|v| match v {
            Value::Null => "∅".to_string(),
            Value::Int32(i) => i.to_string(),
            Value::Text(s) | Value::Decimal(s) => s.clone(),
            other => format!("{other:?}"),
        })
        .collect::<Vec<_>>()
        .join("|")
}

/// The rows of `items` as a sorted multiset of `id|name|qty|price` (`∅`
/// for NULL, whichever way the destination's fixture spells it).
async fn keyless_rows(fx: &dyn SinkFixture) -> Vec<String> {
    let mut rows: Vec<String> = fx
        .rows()
        .await
        .into_iter()
        .map(|r| {
            r.split('|')
                .map(|c| if c == "NULL" { "∅" } else { c })
                .collect::<Vec<_>>()
                .join("|")
        })
        .collect();
    rows.sort();
    rows
}

/// The expected multiset of `rows`, sorted as [`keyless_rows`] sorts.
fn kexpect(rows: &[&Vec<Value>]) -> Vec<String> {
    let mut out: Vec<String> = rows.iter().map(|r| ktext(r)).collect();
    out.sort();
    out
}

/// A keyless table keeps equal rows as rows and NULLs in any column (also
/// a row of NULLs only); an update or a delete changes exactly one of two
/// equal rows.
pub async fn keyless_duplicates_and_nulls(fx: &dyn SinkFixture) {
    let mut sink = fx.sink(&unique("g"), false);
    let s = keyless_items();
    let a = krow(Some(1), Some("x"), Some(1), Some("1.00"));
    let b = krow(Some(2), Some("y"), Some(2), Some("2.00"));
    let c = krow(Some(3), None, None, None);
    let n = krow(None, None, None, None);
    let snapshot: Vec<ChangeEvent> = [&a, &a, &b, &c, &n, &n]
        .into_iter()
        .map(|r| event(&s, Op::Read, None, Some(r.clone()), 10, 0))
        .collect();
    sink.apply(&batch(TOPIC, 0, snapshot)).await.expect("snapshot");
    assert_eq!(keyless_rows(fx).await, kexpect(&[&a, &a, &b, &c, &n, &n]), "every row, equal ones and NULLs too");
    let z = krow(Some(1), Some("z"), Some(1), Some("1.00"));
    let w = krow(Some(3), Some("w"), None, None);
    sink.apply(&batch(
        TOPIC,
        6,
        vec![
            event(&s, Op::Update, Some(a.clone()), Some(z.clone()), 20, 0),
            event(&s, Op::Delete, Some(n.clone()), None, 21, 0),
            event(&s, Op::Update, Some(c.clone()), Some(w.clone()), 22, 0),
        ],
    ))
    .await
    .expect("an update and a delete of one of two equal rows");
    assert_eq!(keyless_rows(fx).await, kexpect(&[&a, &z, &b, &w, &n]), "exactly one of each pair changed");
    sink.apply(&batch(
        TOPIC,
        9,
        vec![
            event(&s, Op::Delete, Some(a.clone()), None, 30, 0),
            event(&s, Op::Delete, Some(z.clone()), None, 30, 1),
        ],
    ))
    .await
    .expect("deletes");
    assert_eq!(keyless_rows(fx).await, kexpect(&[&b, &w, &n]));
    assert_eq!(stored(&mut sink).await, offsets(11));
}

/// Every insert and delete of a keyless table counts, also inside one
/// batch: an insert then a delete of the same row, two equal inserts and
/// one delete, an update of a row inserted in the same batch, a truncate
/// in the middle.
pub async fn keyless_changes_in_one_batch(fx: &dyn SinkFixture) {
    let mut sink = fx.sink(&unique("g"), false);
    let s = keyless_items();
    let d = krow(Some(7), Some("a"), None, Some("1.00"));
    let e = krow(Some(8), Some("b"), None, None);
    let f = krow(Some(8), Some("c"), None, None);
    let n = krow(None, None, None, None);
    let old = krow(Some(1), Some("old"), Some(1), Some("1.00"));
    sink.apply(&batch(TOPIC, 0, vec![event(&s, Op::Create, None, Some(old.clone()), 5, 0)]))
        .await
        .expect("a row before the truncate");
    sink.apply(&batch(
        TOPIC,
        1,
        vec![
            event(&s, Op::Create, None, Some(old.clone()), 9, 0),
            event(&s, Op::Truncate, None, None, 10, 0),
            event(&s, Op::Create, None, Some(d.clone()), 11, 0),
            event(&s, Op::Create, None, Some(d.clone()), 11, 1),
            event(&s, Op::Create, None, Some(e.clone()), 12, 0),
            event(&s, Op::Delete, Some(d.clone()), None, 13, 0),
            event(&s, Op::Update, Some(e.clone()), Some(f.clone()), 14, 0),
            event(&s, Op::Create, None, Some(n.clone()), 15, 0),
            event(&s, Op::Delete, Some(n.clone()), None, 15, 1),
            event(&s, Op::Create, None, Some(n.clone()), 16, 0),
            event(&s, Op::Create, None, Some(e.clone()), 17, 0),
            event(&s, Op::Delete, Some(e.clone()), None, 17, 1),
        ],
    ))
    .await
    .expect("one batch");
    assert_eq!(keyless_rows(fx).await, kexpect(&[&d, &f, &n]));
    assert_eq!(stored(&mut sink).await, offsets(13));
}

/// Applying a keyless table's batches again, without the offsets' fence
/// (`sink-runner replay`, a unit committed before DDL and applied again),
/// changes nothing: each row is named after the Kafka record that wrote it
/// and each delete is remembered, so no count moves twice.
pub async fn keyless_replayed_batch(fx: &dyn SinkFixture) {
    let group = unique("g");
    let mut sink = fx.sink(&group, false);
    let s = keyless_items();
    let a = krow(Some(1), Some("x"), Some(1), Some("1.00"));
    let b = krow(Some(2), Some("y"), None, None);
    let c = krow(Some(3), None, Some(3), None);
    let snapshot: Vec<ChangeEvent> = [&a, &a, &b]
        .into_iter()
        .map(|r| event(&s, Op::Read, None, Some(r.clone()), 10, 0))
        .collect();
    let snapshot = batch(TOPIC, 0, snapshot);
    sink.apply(&snapshot).await.expect("snapshot");
    let changes = batch(
        TOPIC,
        3,
        vec![
            event(&s, Op::Delete, Some(a.clone()), None, 20, 0),
            event(&s, Op::Create, None, Some(c.clone()), 21, 0),
            event(&s, Op::Update, Some(b.clone()), Some(c.clone()), 22, 0),
        ],
    );
    sink.apply(&changes).await.expect("changes");
    let once = keyless_rows(fx).await;
    assert_eq!(once, kexpect(&[&a, &c, &c]));
    sink.apply(&changes).await.expect("the changes again");
    sink.apply(&snapshot).await.expect("the snapshot again");
    assert_eq!(keyless_rows(fx).await, once, "a replay moves no count");
    let mut fresh = fx.sink(&group, false);
    fresh.apply(&changes).await.expect("again on a fresh sink");
    assert_eq!(keyless_rows(fx).await, once, "a replay moves no count");
    assert_eq!(stored(&mut fresh).await, offsets(6));
}

/// A keyless table's changes applied out of source order (another
/// partition, a replayed dead letter): a delete applied before the insert
/// of its row is kept, and takes that older insert when it comes; an
/// insert newer than such a delete stays; each also when applied again.
pub async fn keyless_across_partitions(fx: &dyn SinkFixture) {
    let mut sink = fx.sink(&unique("g"), false);
    let s = keyless_items();
    let a = krow(Some(1), Some("a"), None, None);
    let b = krow(Some(2), Some("b"), None, None);
    let c = krow(None, Some("c"), None, None);
    sink.apply(&batch(TOPIC, 0, vec![event(&s, Op::Read, None, Some(a.clone()), 10, 0)]))
        .await
        .expect("snapshot");
    // Partition 1: deletes of b at 30 and of c at 40, before their inserts.
    let deletes = on_partitions(
        &s.id,
        vec![
            (1, 0, SinkRecord::Change(event(&s, Op::Delete, Some(b.clone()), None, 30, 0))),
            (1, 1, SinkRecord::Change(event(&s, Op::Delete, Some(c.clone()), None, 40, 0))),
        ],
    );
    sink.apply(&deletes).await.expect("deletes first");
    sink.apply(&deletes).await.expect("the deletes again");
    assert_eq!(keyless_rows(fx).await, kexpect(&[&a]));
    // Partition 0: b inserted at 25 (before its delete), c at 45 (after
    // its delete), then c at 38 (before it).
    let inserts = on_partitions(
        &s.id,
        vec![
            (0, 1, SinkRecord::Change(event(&s, Op::Create, None, Some(b.clone()), 25, 0))),
            (0, 2, SinkRecord::Change(event(&s, Op::Create, None, Some(c.clone()), 45, 0))),
        ],
    );
    sink.apply(&inserts).await.expect("the inserts");
    sink.apply(&inserts).await.expect("the inserts again");
    assert_eq!(keyless_rows(fx).await, kexpect(&[&a, &c]), "b's delete took its insert; c is newer than its delete");
    sink.apply(&on_partitions(
        &s.id,
        vec![(0, 3, SinkRecord::Change(event(&s, Op::Create, None, Some(c.clone()), 38, 0)))],
    ))
    .await
    .expect("the older insert of c");
    assert_eq!(keyless_rows(fx).await, kexpect(&[&a, &c]), "c's delete took its older insert");
    // A newer b: stays.
    sink.apply(&on_partitions(
        &s.id,
        vec![(0, 4, SinkRecord::Change(event(&s, Op::Create, None, Some(b.clone()), 50, 0)))],
    ))
    .await
    .expect("a newer b");
    assert_eq!(keyless_rows(fx).await, kexpect(&[&a, &b, &c]));
}

/// A keyless table copied again in another position domain: the reset
/// (on both partitions), the copy's rows (equal ones among them), a
/// change after the copy, and the table-copied records leave exactly the
/// copy and the change; a truncate then removes the older rows.
pub async fn keyless_reset_then_copy(fx: &dyn SinkFixture) {
    let mut sink = fx.sink(&unique("g"), false);
    let s = keyless_items();
    let a = krow(Some(1), Some("a"), None, None);
    let b = krow(Some(2), Some("b"), None, None);
    let c = krow(None, None, None, None);
    let old: Vec<ChangeEvent> = [&a, &a, &b, &c]
        .into_iter()
        .map(|r| event(&s, Op::Read, None, Some(r.clone()), 1_000_000, 0))
        .collect();
    sink.apply(&batch(TOPIC, 0, old)).await.expect("the old domain's rows");
    let reset = |id: u64| SinkRecord::Reset(s.id.clone(), id);
    let read = |r: &Vec<Value>| SinkRecord::Change(event(&s, Op::Read, None, Some(r.clone()), 10, 0));
    sink.apply(&on_partitions(&s.id, vec![(0, 4, reset(7)), (0, 5, read(&a)), (0, 6, read(&b)), (0, 7, read(&b))]))
        .await
        .expect("reset and copy on partition 0");
    let second = on_partitions(&s.id, vec![(1, 0, reset(7)), (1, 1, read(&c))]);
    sink.apply(&second).await.expect("the same reset and copy on partition 1");
    sink.apply(&second).await.expect("partition 1's batch again");
    let at = tributary_schemas::Position { commit: 10, index: 0 };
    sink.apply(&on_partitions(
        &s.id,
        vec![
            (0, 8, SinkRecord::Change(event(&s, Op::Delete, Some(b.clone()), None, 20, 0))),
            (0, 9, SinkRecord::Copied(s.id.clone(), at)),
            (1, 2, SinkRecord::Copied(s.id.clone(), at)),
        ],
    ))
    .await
    .expect("a change after the copy and the table-copied records");
    assert_eq!(keyless_rows(fx).await, kexpect(&[&a, &b, &c]), "the copy's rows and the change, nothing older");
    sink.apply(&on_partitions(
        &s.id,
        vec![
            (0, 10, SinkRecord::Change(event(&s, Op::Truncate, None, None, 30, 0))),
            (0, 11, SinkRecord::Change(event(&s, Op::Create, None, Some(a.clone()), 31, 0))),
        ],
    ))
    .await
    .expect("a truncate and an insert");
    sink.apply(&on_partitions(
        &s.id,
        vec![(1, 3, SinkRecord::Change(event(&s, Op::Create, None, Some(b.clone()), 25, 0)))],
    ))
    .await
    .expect("an insert older than the truncate");
    assert_eq!(keyless_rows(fx).await, kexpect(&[&a]), "the truncate removed the older rows and keeps them out");
}

/// A table copied again after its source table lost its key, then again
/// after it gained one (the source sends a reset, the copy's rows and
/// table-copied, see `docs/schema-changes.md`): once the reset forgot
/// every row, the destination table is made anew in the other shape, in
/// the same unit as the reset or a later one. Without a reset, a change of
/// the other shape is refused for the operator (the rows are current),
/// naming the fix.
pub async fn keyless_key_gained_and_lost(fx: &dyn SinkFixture) {
    let mut sink = fx.sink(&unique("g"), false);
    let keyed = items();
    let keyless = keyless_items();
    sink.apply(&batch(TOPIC, 0, snapshot_events(&keyed, 3)))
        .await
        .expect("the keyed copy");
    let a = krow(Some(1), Some("a"), None, None);
    let b = krow(None, Some("b"), None, None);
    let stray = batch(TOPIC, 3, vec![event(&keyless, Op::Create, None, Some(a.clone()), 8, 0)]);
    let e = sink
        .apply(&stray)
        .await
        .expect_err("a keyless change into the keyed table's current rows");
    assert_eq!(e.error.kind(), ErrorKind::NeedsOperator, "{}", e.error);
    assert_eq!(e.error.class(), "tributary.key_changed", "{}", e.error);
    assert!(e.error.hint().is_some_and(|h| h.contains("source-runner reset --table")), "{}", e.error);
    let at = tributary_schemas::Position { commit: 10, index: 0 };
    let read = |r: &Vec<Value>| SinkRecord::Change(event(&keyless, Op::Read, None, Some(r.clone()), 10, 0));
    sink.apply(&on_partitions(
        &keyless.id,
        vec![
            (0, 3, SinkRecord::Reset(keyless.id.clone(), 7)),
            (0, 4, read(&a)),
            (0, 5, read(&a)),
            (0, 6, read(&b)),
            (0, 7, SinkRecord::Copied(keyless.id.clone(), at)),
        ],
    ))
    .await
    .expect("the reset and the keyless copy in one unit");
    assert_eq!(keyless_rows(fx).await, kexpect(&[&a, &a, &b]), "the table made anew without a key");
    sink.apply(&on_partitions(&keyed.id, vec![(0, 8, SinkRecord::Reset(keyed.id.clone(), 9))]))
        .await
        .expect("the next reset");
    let at = tributary_schemas::Position { commit: 20, index: 0 };
    sink.apply(&on_partitions(
        &keyed.id,
        vec![
            (0, 9, SinkRecord::Change(event(&keyed, Op::Read, None, Some(row(7, "keyed", 7, "7.00")), 20, 0))),
            (0, 10, SinkRecord::Copied(keyed.id.clone(), at)),
            (0, 11, SinkRecord::Change(event(&keyed, Op::Update, None, Some(row(7, "again", 7, "7.00")), 21, 0))),
        ],
    ))
    .await
    .expect("the keyed copy after it");
    assert_eq!(fx.rows().await, vec!["7|again|7|7.00"], "the table made anew with its key");
}

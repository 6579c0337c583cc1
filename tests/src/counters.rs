//! The `counters` check of the sources' kill -9 tests: a table with a key
//! `id` and a counter column that every update increments, so that in the
//! change topic a lost change shows as a gap and a repeated one as a
//! repeat.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::Message;
use tributary_schemas::decoder::{Decoded, EventDecoder};
use tributary_schemas::registry::Registry;
use tributary_schemas::{Op, Position, Value};

use std::path::Path;
use std::time::Duration;

use crate::{committed_reader, schema_registry_url, wait_for, Runner};

/// One change event of a counters table.
#[derive(Debug, Clone)]
pub struct Seen {
    /// The operation.
    pub op: Op,
    /// The row's key (`id`).
    pub id: i64,
    /// The counter, when the image has it.
    pub v: Option<i64>,
    /// The event's `source.position`.
    pub position: Position,
}

/// An integer column's value (MySQL's BIGINT UNSIGNED arrives as decimal).
fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int16(x) => Some(i64::from(*x)),
        Value::Int32(x) => Some(i64::from(*x)),
        Value::Int64(x) => Some(*x),
        Value::Decimal(x) => x.parse().ok(),
        _ => None,
    }
}

/// Collects every decoded event of `topic` with `read_committed`, in the
/// background; `counter` names the counter column.
pub fn collect(topic: String, counter: &'static str) -> Arc<Mutex<Vec<Seen>>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let out = seen.clone();
    tokio::spawn(async move {
        let consumer: StreamConsumer = committed_reader("eo-reader").create().expect("consumer");
        consumer.subscribe(&[&topic]).expect("subscribe");
        let mut decoder = EventDecoder::new(Registry::new(schema_registry_url()).expect("registry"));
        loop {
            let m = match consumer.recv().await {
                Ok(m) => m,
                // The topic appears only when the runner creates it.
                Err(_) => continue,
            };
            let decoded = decoder
                .decode(&topic, m.key(), m.payload())
                .await
                .expect("every record on a change topic decodes");
            if let Decoded::Change(e) = decoded {
                let row = e.after.as_ref().or(e.before.as_ref()).expect("row image");
                let column = |name: &str| e.schema.column_index(name).and_then(|i| row.get(i)).and_then(int);
                out.lock().unwrap().push(Seen {
                    op: e.op,
                    id: column("id").expect("id is an integer"),
                    v: column(counter),
                    position: e.source.position,
                });
            }
        }
    });
    seen
}

/// Starts the source runner of `config`, kills it (SIGKILL) as soon as its
/// first snapshot chunk is committed, starts it again and waits until all
/// `snapshot_rows` reads are in `seen`. Returns the running runner.
pub async fn snapshot_through_a_kill9(
    config: &Path,
    log: &Path,
    seen: &Arc<Mutex<Vec<Seen>>>,
    snapshot_rows: usize,
) -> Runner {
    let reads = || seen.lock().unwrap().iter().filter(|s| s.op == Op::Read).count();
    let runner = Runner::start("source-runner", config, log);
    wait_for("the first snapshot chunk", Duration::from_secs(120), || async { (reads() > 0).then_some(()) }).await;
    runner.kill9();
    let runner = Runner::start("source-runner", config, log);
    wait_for("the whole snapshot", Duration::from_secs(180), || async {
        (reads() >= snapshot_rows).then_some(())
    })
    .await;
    runner
}

/// Per key, what a consumer without a position guard needs: every event
/// newer than the one before it (`source.position` strictly growing), and
/// the counter never going back (an update after a read that already held
/// it is a replay). Returns the keys that break it.
pub fn backwards(seen: &[Seen]) -> Vec<String> {
    let mut last: BTreeMap<i64, (Position, Option<i64>, Op)> = BTreeMap::new();
    let mut out = Vec::new();
    for s in seen {
        if let Some((position, v, op)) = last.insert(s.id, (s.position, s.v, s.op)) {
            let counter_back = matches!((v, s.v), (Some(a), Some(b)) if b < a || (b == a && s.op == Op::Update));
            if position >= s.position || counter_back {
                out.push(format!(
                    "id {}: {:?} v={:?} at {:?} after {op:?} v={v:?} at {position:?}",
                    s.id, s.op, s.v, s.position
                ));
            }
        }
    }
    out
}

/// Changes (not snapshot reads) among `seen`.
pub fn changes(seen: &[Seen]) -> usize {
    seen.iter().filter(|e| e.op != Op::Read).count()
}

/// Every snapshot row exactly once; exactly `expected_changes` changes, per
/// key in order without gaps (updates count 1, 2, 3... after an insert or
/// the snapshot's 0).
pub fn assert_exactly_once(seen: &[Seen], snapshot_rows: usize, expected_changes: usize) {
    let mut snapshot_ids: BTreeMap<i64, usize> = BTreeMap::new();
    for s in seen.iter().filter(|s| s.op == Op::Read) {
        *snapshot_ids.entry(s.id).or_default() += 1;
    }
    assert_eq!(snapshot_ids.len(), snapshot_rows, "every snapshot row present");
    let repeated: Vec<_> = snapshot_ids.iter().filter(|(_, n)| **n > 1).collect();
    assert!(repeated.is_empty(), "snapshot rows repeated: {:?}", &repeated[..repeated.len().min(10)]);
    assert_eq!(changes(seen), expected_changes, "every change exactly once");
    let mut last_v: BTreeMap<i64, i64> = BTreeMap::new();
    for s in seen.iter().filter(|s| s.op != Op::Read) {
        match s.op {
            Op::Update => {
                let v = s.v.expect("update carries v");
                let prev = last_v.get(&s.id).copied().unwrap_or(0);
                assert_eq!(v, prev + 1, "id {}: update to {v} after {prev} (lost or repeated change)", s.id);
                last_v.insert(s.id, v);
            }
            Op::Create => assert!(last_v.insert(s.id, 0).is_none(), "id {} inserted twice", s.id),
            Op::Delete => {}
            other => panic!("unexpected op {other:?}"),
        }
    }
}

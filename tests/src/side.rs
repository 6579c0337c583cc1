//! What a source runner keeps beside each checkpoint in its offsets topic
//! (`Source::take_side_records`), kept here for tests that drive a source
//! directly and start it again from a checkpoint it gave out.

use std::collections::{BTreeMap, HashMap};
use std::sync::{LazyLock, Mutex};

use tributary_connectors::{Checkpoint, Result, Source, SourceBatch};

/// The side records of each checkpoint given out (by its text), and the
/// latest of each live source (by its address).
#[derive(Default)]
struct Side {
    durable: HashMap<String, BTreeMap<String, String>>,
    current: HashMap<usize, BTreeMap<String, String>>,
}

static SIDE: LazyLock<Mutex<Side>> = LazyLock::new(Default::default);

fn addr(source: &dyn Source) -> usize {
    std::ptr::from_ref(source).cast::<()>() as usize
}

/// The source's next batch; its side records are kept with its checkpoint,
/// as the runner writes them in the batch's Kafka transaction.
pub async fn next_batch(source: &mut dyn Source) -> Result<SourceBatch> {
    let batch = source.next_batch().await?;
    let records = source.take_side_records();
    let mut side = SIDE.lock().unwrap_or_else(|e| e.into_inner());
    let mut current = side.current.remove(&addr(source)).unwrap_or_default();
    for (k, v) in records {
        match v {
            Some(v) => current.insert(k, v),
            None => current.remove(&k),
        };
    }
    side.durable.insert(batch.checkpoint.0.clone(), current.clone());
    side.current.insert(addr(source), current);
    Ok(batch)
}

/// Before `source.start(checkpoint)`: hands it the side records durable
/// with `checkpoint` (a checkpoint [`next_batch`] gave out), as the runner
/// does.
pub fn restore(source: &mut dyn Source, checkpoint: Option<&Checkpoint>) {
    let mut side = SIDE.lock().unwrap_or_else(|e| e.into_inner());
    let records = checkpoint.and_then(|c| side.durable.get(&c.0).cloned()).unwrap_or_default();
    side.current.insert(addr(source), records.clone());
    source.restore_side_records(records);
}

/// The side records durable with `checkpoint`.
pub fn of(checkpoint: &Checkpoint) -> Option<BTreeMap<String, String>> {
    SIDE.lock()
        .unwrap_or_else(|e| e.into_inner())
        .durable
        .get(&checkpoint.0)
        .cloned()
}

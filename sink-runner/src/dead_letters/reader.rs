//! Reading dead-letter topics: the whole of one (`sink-runner replay`),
//! or, backwards, what one origin partition already sent there.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use tracing::warn;
use tributary_connectors::Error;

use super::record::origin;
use crate::buffer::RawRecord;

/// Kafka metadata and watermark timeout when reading a dead-letter topic.
const METADATA_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest wait for the next record of a partition known to have more.
const RECEIVE_TIMEOUT: Duration = Duration::from_secs(30);
/// Records read per step when a dead-letter partition is read backwards.
const SCAN_WINDOW: i64 = 10_000;

/// A partition of a topic, its first offset and the offset after its last.
pub type PartitionRange = (i32, i64, i64);

/// Reads dead-letter topics: the whole of one (`sink-runner replay`), or,
/// backwards, what one origin partition already sent there (see
/// [`DlqReader::dead_lettered_since`]).
pub struct DlqReader {
    consumer: Arc<StreamConsumer>,
}

impl DlqReader {
    /// A consumer that only ever assigns partitions (`group_id` is never
    /// joined, and nothing is committed under it).
    pub fn new(base: &ClientConfig, group_id: &str) -> Result<Self, Error> {
        let mut c = base.clone();
        c.set("group.id", group_id);
        c.set("enable.auto.commit", "false");
        c.set("isolation.level", "read_committed");
        let consumer: StreamConsumer = c
            .create()
            .map_err(|e| Error::needs_operator(format!("cannot create a dead-letter topic reader: {e}")))?;
        Ok(Self { consumer: Arc::new(consumer) })
    }

    /// Each partition of `topic` with its first and next offset; `None` if
    /// the topic does not exist. Asked of Kafka off the async path.
    pub async fn ranges(&self, topic: &str) -> Result<Option<Vec<PartitionRange>>, Error> {
        let consumer = self.consumer.clone();
        let topic = topic.to_string();
        tokio::task::spawn_blocking(move || ranges(&consumer, &topic))
            .await
            .map_err(|e| Error::retryable(format!("reading a dead-letter topic's offsets did not finish: {e}")))?
    }

    /// The records of `topic` from `start` to before `end`, per partition
    /// `(partition, start, end)`, in order within each partition.
    pub async fn read(&self, topic: &str, ranges: &[PartitionRange]) -> Result<Vec<RawRecord>, Error> {
        let mut remaining: BTreeMap<i32, i64> = BTreeMap::new();
        let mut tpl = TopicPartitionList::new();
        for &(p, start, end) in ranges.iter().filter(|(_, start, end)| end > start) {
            remaining.insert(p, end);
            tpl.add_partition_offset(topic, p, Offset::Offset(start))
                .map_err(|e| Error::retryable(e.to_string()))?;
        }
        let mut out = Vec::new();
        if remaining.is_empty() {
            return Ok(out);
        }
        self.consumer
            .assign(&tpl)
            .map_err(|e| Error::retryable(format!("cannot assign {topic}: {e}")))?;
        let mut last_progress = Instant::now();
        while !remaining.is_empty() {
            // With read_committed, transaction markers take offsets too: a
            // partition is done once its position reaches the end.
            if let Ok(position) = self.consumer.position() {
                for e in position.elements() {
                    if let Offset::Offset(o) = e.offset() {
                        if remaining.get(&e.partition()).is_some_and(|end| o >= *end) {
                            remaining.remove(&e.partition());
                        }
                    }
                }
            }
            if remaining.is_empty() {
                break;
            }
            match tokio::time::timeout(Duration::from_millis(500), self.consumer.recv()).await {
                Ok(Ok(m)) => {
                    let raw = RawRecord::from_message(&m);
                    last_progress = Instant::now();
                    let Some(end) = remaining.get(&raw.partition).copied() else {
                        continue;
                    };
                    if raw.offset + 1 >= end {
                        remaining.remove(&raw.partition);
                    }
                    if raw.offset < end {
                        out.push(raw);
                    }
                }
                Ok(Err(e)) => warn!(error = %e, topic, "consumer error while reading a dead-letter topic"),
                Err(_) => {}
            }
            if last_progress.elapsed() > RECEIVE_TIMEOUT {
                return Err(Error::retryable(format!(
                    "no progress reading {topic} for {} s; partitions left: {:?}",
                    RECEIVE_TIMEOUT.as_secs(),
                    remaining.keys().collect::<Vec<_>>()
                )));
            }
        }
        let _ = self.consumer.unassign();
        Ok(out)
    }

    /// The offsets, at `from` or later, of the records of `topic` /
    /// `partition` that `dlq` already holds: what a sink that crashed (or
    /// lost the partition) between sending a dead letter and storing the
    /// offsets past it sent before. The sink that now owns the partition
    /// consumes them again from `from` (its stored offset) and sends none of
    /// them twice.
    ///
    /// Reads each partition of `dlq` backwards, [`SCAN_WINDOW`] records at
    /// a time, and stops at the first window holding a dead letter of the
    /// partition older than `from`: dead letters at or after `from` were
    /// sent after the offsets reached `from` were stored, and one sender
    /// appends to a partition in order.
    pub async fn dead_lettered_since(
        &self,
        dlq: &str,
        topic: &str,
        partition: i32,
        from: i64,
    ) -> Result<BTreeSet<i64>, Error> {
        let mut found = BTreeSet::new();
        let Some(ranges) = self.ranges(dlq).await? else {
            return Ok(found);
        };
        for (p, low, high) in ranges {
            let mut end = high;
            while end > low {
                let start = (end - SCAN_WINDOW).max(low);
                let mut older = false;
                for raw in self.read(dlq, &[(p, start, end)]).await? {
                    match origin(&raw) {
                        Some(o) if o.topic == topic && o.partition == partition => {
                            if o.offset >= from {
                                found.insert(o.offset);
                            } else {
                                older = true;
                            }
                        }
                        _ => {}
                    }
                }
                if older {
                    break;
                }
                end = start;
            }
        }
        Ok(found)
    }
}

/// [`DlqReader::ranges`], blocking.
fn ranges(consumer: &StreamConsumer, topic: &str) -> Result<Option<Vec<PartitionRange>>, Error> {
    let metadata = consumer
        .fetch_metadata(Some(topic), METADATA_TIMEOUT)
        .map_err(|e| Error::retryable(format!("cannot read metadata of {topic}: {e}")))?;
    let partitions: Vec<i32> = metadata
        .topics()
        .iter()
        .filter(|t| t.name() == topic && t.error().is_none())
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect();
    if partitions.is_empty() {
        return Ok(None);
    }
    let mut out = Vec::with_capacity(partitions.len());
    for p in partitions {
        let (low, high) = consumer
            .fetch_watermarks(topic, p, METADATA_TIMEOUT)
            .map_err(|e| Error::retryable(format!("cannot read the offsets of {topic}/{p}: {e}")))?;
        out.push((p, low, high));
    }
    Ok(Some(out))
}

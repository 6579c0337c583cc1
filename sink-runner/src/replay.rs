//! `sink-runner replay`: applies the records of a dead-letter topic again,
//! after an operator fixed what made them fail.
//!
//! Each record is decoded from its original key and value (kept verbatim in
//! the dead-letter record) and applied on its own, without touching the
//! stored offsets of the copy. Applying is idempotent by source position:
//! a record older than what its row already holds changes nothing, so
//! replaying twice, or replaying a record a later change already
//! superseded, changes nothing. Kafka cannot delete single records: what
//! still fails stays in the topic, is reported, and can be replayed again.
//!
//! Writes to a dead-letter topic are at least once: a sink that crashed
//! between sending a dead letter and storing its offsets sends it again
//! after its restart. Each dead letter names its origin (headers
//! `__connect.errors.topic`, `.partition`, `.offset`), so a replay applies
//! each origin once, the first of its dead letters, and counts the others
//! as duplicates.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::{Offset, TopicPartitionList};
use tracing::{info, warn};
use tributary_connectors::{policy, Decision, Error, KafkaPosition, Sink, SinkBatch};
use tributary_schemas::EventDecoder;

use crate::config::SinkRunnerConfig;
use crate::dlq::{RawRecord, HEADER_OFFSET, HEADER_PARTITION, HEADER_TOPIC};
use crate::runner::{decode_record, table_from_topic, RunError};

/// Kafka metadata and watermark timeout.
const METADATA_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest wait for the next record of a partition known to have more.
const RECEIVE_TIMEOUT: Duration = Duration::from_secs(30);
/// Attempts per record on errors that may clear by themselves.
const RETRYABLE_ATTEMPTS: u32 = 5;

/// One record that still fails.
#[derive(Debug, Clone)]
pub struct StillFailing {
    /// Position in the dead-letter topic.
    pub dlq: KafkaPosition,
    /// Where it came from originally.
    pub original: Option<KafkaPosition>,
    /// Why it still fails.
    pub error: String,
}

/// What a replay did.
#[derive(Debug, Clone, Default)]
pub struct ReplayReport {
    /// Records read from the dead-letter topic.
    pub read: usize,
    /// Records applied (or, in a dry run, that would apply).
    pub applied: usize,
    /// Tombstones and records without anything to apply.
    pub skipped: usize,
    /// Dead letters of an origin already read in this replay (the same
    /// record dead-lettered twice): not applied again.
    pub duplicates: usize,
    /// Control records (a table dropped, copied again or reset) an older
    /// runner dead-lettered: never replayed, since applied out of their
    /// place in the stream they could drop or empty a table that has been
    /// written since. Runners now pause the table instead.
    pub control: usize,
    /// Records that still fail (left in the topic).
    pub failing: Vec<StillFailing>,
}

/// Replays `dlq_topic` into the configured destination.
pub async fn replay(config: &SinkRunnerConfig, dlq_topic: &str, dry_run: bool) -> Result<ReplayReport, RunError> {
    let mut sink = config.sink()?;
    let registry = config.schema_registry.registry(&config.schema_registry_url)?;
    let mut decoder = EventDecoder::new(registry);
    let records = read_all(config, dlq_topic).await?;
    let mut report = ReplayReport { read: records.len(), ..Default::default() };
    let mut origins: HashSet<(String, i32, i64)> = HashSet::new();
    for (dlq_pos, mut raw) in records {
        let original = original_position(&raw);
        if let Some(o) = &original {
            if !origins.insert((o.topic.clone(), o.partition, o.offset)) {
                report.duplicates += 1;
                continue;
            }
            // Decode as a record of its original topic (errors name it).
            raw.topic = o.topic.clone();
            raw.partition = o.partition;
            raw.offset = o.offset;
        }
        let table = table_from_topic(&raw.topic, config.prefix.as_deref());
        let fail = |report: &mut ReplayReport, e: &Error| {
            warn!(dlq_partition = dlq_pos.partition, dlq_offset = dlq_pos.offset, error = %e, "still fails");
            report.failing.push(StillFailing {
                dlq: dlq_pos.clone(),
                original: original.clone(),
                error: e.to_string(),
            });
        };
        let record = match decode_record(&mut decoder, &raw, &table).await {
            Ok(Some(r)) => r,
            Ok(None) => {
                report.skipped += 1;
                continue;
            }
            Err(e) => {
                fail(&mut report, &e);
                continue;
            }
        };
        let table = match &record {
            tributary_connectors::SinkRecord::Change(ev) => ev.schema.id.clone(),
            tributary_connectors::SinkRecord::TableDropped(t)
            | tributary_connectors::SinkRecord::Copied(t, _)
            | tributary_connectors::SinkRecord::Reset(t, _) => {
                warn!(
                    table = %t,
                    dlq_partition = dlq_pos.partition,
                    dlq_offset = dlq_pos.offset,
                    "a control record in the dead-letter topic is not replayed (out of its place in the stream it \
                     could drop or empty a table written since); copy the table again if it is wanted \
                     (source-runner reset --table)"
                );
                report.control += 1;
                continue;
            }
        };
        let position = original.clone().unwrap_or_else(|| dlq_pos.clone());
        // No offsets: a replay never moves the copy's stored offsets.
        let batch = SinkBatch {
            table,
            records: vec![(position, record)],
            next_offsets: Vec::new(),
            expected_offsets: Vec::new(),
        };
        let mut attempt = 0;
        loop {
            attempt += 1;
            let result = if dry_run {
                sink.trial_apply(&batch).await
            } else {
                sink.apply(&batch).await
            };
            match result {
                Ok(()) => {
                    report.applied += 1;
                    break;
                }
                Err(f) => match policy(f.error.kind(), attempt) {
                    Decision::RetryAfter(d) if attempt < RETRYABLE_ATTEMPTS => tokio::time::sleep(d).await,
                    _ => {
                        fail(&mut report, &f.error);
                        break;
                    }
                },
            }
        }
    }
    info!(
        read = report.read,
        applied = report.applied,
        skipped = report.skipped,
        duplicates = report.duplicates,
        control = report.control,
        failing = report.failing.len(),
        dry_run,
        "replay finished"
    );
    Ok(report)
}

fn original_position(raw: &RawRecord) -> Option<KafkaPosition> {
    Some(KafkaPosition {
        topic: raw.header(HEADER_TOPIC)?,
        partition: raw.header(HEADER_PARTITION)?.parse().ok()?,
        offset: raw.header(HEADER_OFFSET)?.parse().ok()?,
    })
}

/// Every record of `topic` up to its end at the time of the call.
async fn read_all(config: &SinkRunnerConfig, topic: &str) -> Result<Vec<(KafkaPosition, RawRecord)>, RunError> {
    let mut c = config.kafka.client_config()?;
    c.set("group.id", format!("{}.replay", config.consumer_group));
    c.set("enable.auto.commit", "false");
    c.set("isolation.level", "read_committed");
    let consumer: StreamConsumer = c
        .create()
        .map_err(|e| RunError::Kafka(format!("cannot create the consumer: {e}")))?;
    let metadata = consumer
        .fetch_metadata(Some(topic), METADATA_TIMEOUT)
        .map_err(|e| RunError::Kafka(format!("cannot read metadata of {topic}: {e}")))?;
    let partitions: Vec<i32> = metadata
        .topics()
        .iter()
        .filter(|t| t.name() == topic && t.error().is_none())
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect();
    if partitions.is_empty() {
        return Err(RunError::Kafka(format!("topic {topic} does not exist")));
    }
    let mut remaining: HashMap<i32, i64> = HashMap::new();
    let mut tpl = TopicPartitionList::new();
    for p in partitions {
        let (low, high) = consumer
            .fetch_watermarks(topic, p, METADATA_TIMEOUT)
            .map_err(|e| RunError::Kafka(format!("cannot read the offsets of {topic}/{p}: {e}")))?;
        if high > low {
            remaining.insert(p, high);
            tpl.add_partition_offset(topic, p, Offset::Offset(low))
                .map_err(|e| RunError::Kafka(e.to_string()))?;
        }
    }
    let mut out = Vec::new();
    if remaining.is_empty() {
        return Ok(out);
    }
    consumer
        .assign(&tpl)
        .map_err(|e| RunError::Kafka(format!("cannot assign {topic}: {e}")))?;
    let mut last_progress = Instant::now();
    while !remaining.is_empty() {
        // With read_committed, transaction markers take offsets too: a
        // partition is done once its position reaches the end seen above.
        if let Ok(position) = consumer.position() {
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
        match tokio::time::timeout(Duration::from_millis(500), consumer.recv()).await {
            Ok(Ok(m)) => {
                let raw = RawRecord::from_message(&m);
                last_progress = Instant::now();
                if let Some(end) = remaining.get(&raw.partition) {
                    if raw.offset + 1 >= *end {
                        remaining.remove(&raw.partition);
                    }
                }
                out.push((
                    KafkaPosition {
                        topic: raw.topic.clone(),
                        partition: raw.partition,
                        offset: raw.offset,
                    },
                    raw,
                ));
            }
            Ok(Err(e)) => warn!(error = %e, "consumer error while reading the dead-letter topic"),
            Err(_) => {}
        }
        if last_progress.elapsed() > RECEIVE_TIMEOUT {
            return Err(RunError::Kafka(format!(
                "no progress reading {topic} for {} s; partitions left: {:?}",
                RECEIVE_TIMEOUT.as_secs(),
                remaining.keys().collect::<Vec<_>>()
            )));
        }
    }
    Ok(out)
}

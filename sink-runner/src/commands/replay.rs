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
//! A sink that crashed between sending a dead letter and storing its
//! offsets does not send it again (it reads what it sent, see
//! `DlqReader::dead_lettered_since`), but a member frozen past its session
//! can still repeat one. Each dead letter names its origin (headers
//! `__connect.errors.topic`, `.partition`, `.offset`), so a replay applies
//! each origin once, the first of its dead letters, and counts the others
//! as duplicates.

use std::collections::HashSet;

use tracing::{info, warn};
use tributary_connectors::{policy, Decision, Error, KafkaPosition, Sink, SinkBatch};
use tributary_schemas::EventDecoder;

use crate::buffer::RawRecord;
use crate::config::SinkRunnerConfig;
use crate::dead_letters::{origin, DlqReader};
use crate::decode::{decode_record, table_from_topic};
use crate::RunError;

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
    for mut raw in records {
        let dlq_pos = KafkaPosition {
            topic: raw.topic.clone(),
            partition: raw.partition,
            offset: raw.offset,
        };
        let original = origin(&raw);
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
            other => {
                let t = other.table();
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
            unit: tributary_connectors::UnitPart::default(),
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

/// Every record of `topic` up to its end at the time of the call.
async fn read_all(config: &SinkRunnerConfig, topic: &str) -> Result<Vec<RawRecord>, RunError> {
    let reader = DlqReader::new(&config.kafka.client_config()?, &format!("{}.replay", config.consumer_group))
        .map_err(|e| RunError::Kafka(e.to_string()))?;
    let ranges = reader
        .ranges(topic)
        .await
        .map_err(|e| RunError::Kafka(e.to_string()))?
        .ok_or_else(|| RunError::Kafka(format!("topic {topic} does not exist")))?;
    reader.read(topic, &ranges).await.map_err(|e| RunError::Kafka(e.to_string()))
}

//! `sink-runner delete`: the consumer group, the offsets stored in the
//! destination and, when asked, the destination tables of the copy's
//! topics.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer, StreamConsumer};
use rdkafka::{Offset, TopicPartitionList};
use tracing::{debug, warn};
use tributary_schemas::{EventDecoder, TableId};

use crate::buffer::RawRecord;
use crate::config::SinkRunnerConfig;
use crate::decode::{decode_record, record_table, table_from_topic};
use crate::RunError;

/// Deletes a copy: the consumer group, the offsets stored in the
/// destination and, with `drop_destination`, the destination tables of every
/// topic the copy subscribes to. Returns what was removed.
pub async fn delete(config: &SinkRunnerConfig, drop_destination: bool) -> Result<Vec<String>, RunError> {
    let client = config.kafka.client_config()?;
    let mut done = Vec::new();
    let mut tables = Vec::new();
    if drop_destination {
        let meta: BaseConsumer = client
            .create()
            .map_err(|e| RunError::Kafka(format!("cannot create a metadata client: {e}")))?;
        let pattern =
            regex::Regex::new(&config.topic_pattern()).map_err(|e| RunError::Other(format!("topic pattern: {e}")))?;
        let topics = tokio::task::spawn_blocking(move || {
            meta.fetch_metadata(None, Duration::from_secs(10))
                .map(|m| m.topics().iter().map(|t| t.name().to_string()).collect::<Vec<_>>())
        })
        .await
        .map_err(|e| RunError::Other(e.to_string()))?
        .map_err(|e| RunError::Kafka(format!("cannot list topics: {e}")))?;
        let ours: Vec<String> = topics
            .into_iter()
            .filter(|t| pattern.is_match(t) && !config.is_excluded(t))
            .collect();
        let (found, unknown) = tables_of_topics(config, &ours).await?;
        tables.extend(found);
        for t in unknown {
            warn!(
                topic = %t,
                "cannot tell the source table of this topic (no readable record left in it, and its name was made \
                 legal): its destination table is kept; drop it by hand"
            );
        }
    }
    let mut sink = config.sink()?;
    done.extend(
        sink.delete_copy(&tables)
            .await
            .map_err(|e| RunError::Other(format!("destination: {e}")))?,
    );
    let admin: AdminClient<DefaultClientContext> = client
        .create()
        .map_err(|e| RunError::Kafka(format!("cannot create the admin client: {e}")))?;
    let results = admin
        .delete_groups(&[config.consumer_group.as_str()], &AdminOptions::new())
        .await
        .map_err(|e| RunError::Kafka(format!("cannot delete the consumer group: {e}")))?;
    for r in results {
        match r {
            Ok(g) => done.push(format!("consumer group {g}")),
            Err((_, rdkafka::types::RDKafkaErrorCode::GroupIdNotFound)) => {}
            Err((g, code)) => return Err(RunError::Kafka(format!("cannot delete consumer group {g}: {code}"))),
        }
    }
    let pauses = tributary_operations::pauses::PauseStore::of_sink(client, &config.consumer_group);
    if pauses
        .forget()
        .await
        .map_err(|e| RunError::Kafka(format!("the stored operator pauses: {e}")))?
    {
        done.push(format!("the stored operator pauses of {}", pauses.key()));
    }
    Ok(done)
}

/// The source table of each topic, as its records name it (a change event's
/// `source` block, a control record's headers): a topic's name does not
/// always say it (a name Kafka refuses is made legal with a hash). A topic
/// without a readable record left falls back to its name when the name is
/// what the default naming makes of that table; the others are returned
/// as unknown.
async fn tables_of_topics(
    config: &SinkRunnerConfig,
    topics: &[String],
) -> Result<(Vec<TableId>, Vec<String>), RunError> {
    const WAIT: Duration = Duration::from_secs(10);
    /// Longest wait for a record of a partition known to hold more.
    const STALL: Duration = Duration::from_secs(30);
    let mut found: BTreeMap<String, TableId> = BTreeMap::new();
    if topics.is_empty() {
        return Ok((Vec::new(), Vec::new()));
    }
    let mut c = config.kafka.client_config()?;
    c.set("group.id", format!("{}.delete", config.consumer_group));
    c.set("enable.auto.commit", "false");
    c.set("isolation.level", "read_committed");
    let consumer: StreamConsumer = c
        .create()
        .map_err(|e| RunError::Kafka(format!("cannot create the consumer: {e}")))?;
    let mut remaining: BTreeMap<(String, i32), i64> = BTreeMap::new();
    let mut tpl = TopicPartitionList::new();
    let consumer = std::sync::Arc::new(consumer);
    let ranges = {
        let (consumer, topics) = (consumer.clone(), topics.to_vec());
        tokio::task::spawn_blocking(move || ranges(&consumer, &topics, WAIT))
            .await
            .map_err(|e| RunError::Other(e.to_string()))??
    };
    for (topic, partition, low, high) in ranges {
        if high > low {
            tpl.add_partition_offset(&topic, partition, Offset::Offset(low))
                .map_err(|e| RunError::Kafka(e.to_string()))?;
            remaining.insert((topic, partition), high);
        }
    }
    if tpl.count() > 0 {
        consumer
            .assign(&tpl)
            .map_err(|e| RunError::Kafka(format!("cannot assign the copy's topics: {e}")))?;
        let registry = config.schema_registry.registry(&config.schema_registry_url)?;
        let mut decoder = EventDecoder::new(registry);
        let mut last_progress = Instant::now();
        while !remaining.is_empty() && last_progress.elapsed() < STALL {
            let m = match tokio::time::timeout(Duration::from_millis(500), consumer.recv()).await {
                Ok(Ok(m)) => RawRecord::from_message(&m),
                Ok(Err(e)) => {
                    debug!(error = %e, "consumer error while looking for the copy's tables");
                    continue;
                }
                Err(_) => continue,
            };
            last_progress = Instant::now();
            let key = (m.topic.clone(), m.partition);
            if remaining.get(&key).is_some_and(|end| m.offset + 1 >= *end) {
                remaining.remove(&key);
            }
            if found.contains_key(&m.topic) {
                continue;
            }
            let fallback = table_from_topic(&m.topic, config.prefix.as_deref());
            if let Ok(Some(record)) = decode_record(&mut decoder, &m, &fallback).await {
                let table = record_table(&record).clone();
                remaining.retain(|(t, _), _| *t != m.topic);
                found.insert(m.topic.clone(), table);
            }
        }
    }
    let mut unknown = Vec::new();
    for topic in topics {
        if found.contains_key(topic) {
            continue;
        }
        let guess = table_from_topic(topic, config.prefix.as_deref());
        let named = config
            .prefix
            .as_deref()
            .is_some_and(|p| tributary_schemas::TopicNaming::default().topic(p, &guess) == *topic);
        if named {
            found.insert(topic.clone(), guess);
        } else {
            unknown.push(topic.clone());
        }
    }
    let mut tables: Vec<TableId> = found.into_values().collect();
    tables.sort_by_key(|t| t.to_string());
    tables.dedup();
    Ok((tables, unknown))
}

/// Each partition of `topics` with its first and next offset (blocking).
fn ranges(
    consumer: &StreamConsumer,
    topics: &[String],
    wait: Duration,
) -> Result<Vec<(String, i32, i64, i64)>, RunError> {
    let mut out = Vec::new();
    for topic in topics {
        let meta = consumer
            .fetch_metadata(Some(topic), wait)
            .map_err(|e| RunError::Kafka(format!("cannot read metadata of {topic}: {e}")))?;
        for p in meta.topics().iter().filter(|t| t.name() == topic).flat_map(|t| t.partitions()) {
            let (low, high) = consumer
                .fetch_watermarks(topic, p.id(), wait)
                .map_err(|e| RunError::Kafka(format!("cannot read the offsets of {topic}/{}: {e}", p.id())))?;
            out.push((topic.clone(), p.id(), low, high));
        }
    }
    Ok(out)
}

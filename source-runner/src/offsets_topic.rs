//! Reading a runner's records back from its offsets topic at start: the
//! latest of each of its keys ([`tributary_schemas::records::offsets`]).
//! They are written by the transactions they cover (see `writer`).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::{Message, Offset, TopicPartitionList};
use tributary_connectors::kafka::kafka_error;
use tributary_connectors::{Checkpoint, Error};
use tributary_schemas::records::{HeldTable, OffsetsKey, OffsetsRecord};

use crate::config::SourceRunnerConfig;
use crate::kafka::blocking;

/// How long reading the offsets topic at start may make no progress before
/// it is given up (and retried): a bound on a stall, not on the topic's size.
const CHECKPOINT_READ_STALL: Duration = Duration::from_secs(60);
/// Kafka's answer to a watermarks request.
const WATERMARKS_TIMEOUT: Duration = Duration::from_secs(10);
/// Records taken after a quiet poll before the position is asked again.
const POSITION_EVERY: u32 = 10_000;

/// What a runner's offsets topic holds for it.
#[derive(Debug, Default)]
pub struct Stored {
    /// The last committed checkpoint.
    pub checkpoint: Option<Checkpoint>,
    /// The tables whose changes are held back.
    pub held: Vec<HeldTable>,
    /// A reset of every table asked and not carried out yet.
    pub reset_all: Option<u64>,
    /// The source's side records.
    pub side: BTreeMap<String, String>,
}

/// Reads the latest of the runner's records from its offsets topic.
///
/// Must run after the runner's producer fenced its predecessors
/// (`init_transactions` aborted whatever a crashed one left open), so that
/// `read_committed` sees the final state.
pub async fn read(config: &SourceRunnerConfig) -> Result<Stored, Error> {
    let mut c = config.kafka.client_config().map_err(|e| Error::needs_operator(e.to_string()))?;
    c.set("group.id", format!("tributary-source-{}-checkpoint", config.name))
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed");
    let consumer: BaseConsumer = c.create().map_err(|e| kafka_error("checkpoint consumer", e))?;
    let topic = config.offsets_topic();
    let runner = config.name.clone();
    // The latest value of each key; decoded at the end, so that an
    // unreadable record a later one replaced does not matter.
    let latest = blocking(move || -> Result<BTreeMap<OffsetsKey, Option<Vec<u8>>>, Error> {
        let mut latest = BTreeMap::new();
        let mut keep = |m: &rdkafka::message::BorrowedMessage<'_>| {
            if let Some(key) = m.key().and_then(|k| OffsetsKey::decode(&runner, k)) {
                latest.insert(key, m.payload().map(<[u8]>::to_vec));
            }
        };
        let (low, high) = consumer
            .fetch_watermarks(&topic, 0, WATERMARKS_TIMEOUT)
            .map_err(|e| kafka_error("offsets topic watermarks", e))?;
        if high <= low {
            return Ok(BTreeMap::new());
        }
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&topic, 0, Offset::Beginning)
            .map_err(|e| kafka_error("assign offsets topic", e))?;
        consumer.assign(&tpl).map_err(|e| kafka_error("assign offsets topic", e))?;
        let mut deadline = Instant::now() + CHECKPOINT_READ_STALL;
        let mut read_to = -1;
        // Asked of librdkafka after a quiet poll or every so many records,
        // not after each: the call took most of the read's time (a million
        // checkpoints: 14.8 s to start).
        let mut unchecked = 0u32;
        loop {
            if unchecked > 0 && unchecked < POSITION_EVERY {
                if let Some(Ok(m)) = consumer.poll(Duration::ZERO) {
                    unchecked += 1;
                    keep(&m);
                    continue;
                }
            }
            unchecked = 0;
            let position = consumer
                .position()
                .ok()
                .and_then(|p| p.find_partition(&topic, 0).and_then(|e| e.offset().to_raw()))
                .unwrap_or(-1);
            if position >= high {
                return Ok(latest);
            }
            if position > read_to {
                read_to = position;
                deadline = Instant::now() + CHECKPOINT_READ_STALL;
            }
            if Instant::now() > deadline {
                return Err(Error::retryable(format!(
                    "could not read the offsets topic {topic} to its end: no progress for {}s at {position} of \
                     {high}",
                    CHECKPOINT_READ_STALL.as_secs()
                )));
            }
            match consumer.poll(Duration::from_millis(200)) {
                Some(Ok(m)) => {
                    unchecked = 1;
                    keep(&m);
                }
                Some(Err(KafkaError::PartitionEOF(_))) | None => {}
                Some(Err(e)) => return Err(kafka_error("read offsets topic", e)),
            }
        }
    })
    .await??;
    let mut stored = Stored::default();
    for (key, value) in latest {
        match OffsetsRecord::decode(key, value.as_deref()).map_err(|e| Error::needs_operator(e.to_string()))? {
            OffsetsRecord::Checkpoint(c) => stored.checkpoint = c.map(Checkpoint),
            OffsetsRecord::HeldTables(held) => stored.held = held,
            OffsetsRecord::ResetAll(reset) => stored.reset_all = reset,
            OffsetsRecord::Side { key, value: Some(v) } => {
                stored.side.insert(key, v);
            }
            OffsetsRecord::Side { value: None, .. } => {}
        }
    }
    Ok(stored)
}

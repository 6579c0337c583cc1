//! Operator pauses that survive a restart: each change of a runner's pause
//! set is written to a compacted Kafka topic under the runner's key, and a
//! starting runner reads its last value before it moves anything.
//!
//! Kafka, because it is the one store every runner already has and that
//! outlives any of its machines (a pod's disk does not); compacted, so the
//! topic holds one record per runner however often it is paused.

use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use crate::admin::{Control, PauseSet};

/// The compacted topic that holds every runner's pause set. Named like
/// Kafka's internal topics, which no sink copies (`__*`).
pub const PAUSES_TOPIC: &str = "__tributary_pauses";

/// How long one Kafka call of the store may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// The store of one runner's pauses: `key` is `source/<name>` or
/// `sink/<consumer group>`.
pub struct PauseStore {
    kafka: ClientConfig,
    topic: String,
    key: String,
}

impl PauseStore {
    /// A store for runner `key` on the cluster `kafka` points at.
    pub fn new(kafka: ClientConfig, key: String) -> Self {
        Self { kafka, topic: PAUSES_TOPIC.to_string(), key }
    }

    /// The store of the source runner named `name`.
    pub fn of_source(kafka: ClientConfig, name: &str) -> Self {
        Self::new(kafka, format!("source/{name}"))
    }

    /// The store of the sink runners of consumer group `group`.
    pub fn of_sink(kafka: ClientConfig, group: &str) -> Self {
        Self::new(kafka, format!("sink/{group}"))
    }

    /// The runner's key in the topic.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Creates the topic if it is missing (compacted, one partition, the
    /// broker's replication factor).
    async fn ensure_topic(&self) -> Result<(), String> {
        let admin: AdminClient<DefaultClientContext> = self
            .kafka
            .create()
            .map_err(|e| format!("cannot make a Kafka admin client: {e}"))?;
        let topic = NewTopic::new(&self.topic, 1, TopicReplication::Fixed(-1)).set("cleanup.policy", "compact");
        let results = admin
            .create_topics([&topic], &AdminOptions::new().operation_timeout(Some(CALL_TIMEOUT)))
            .await
            .map_err(|e| format!("cannot create topic {}: {e}", self.topic))?;
        for r in results {
            match r {
                Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((t, code)) => return Err(format!("cannot create topic {t}: {code}")),
            }
        }
        Ok(())
    }

    /// The last pause set stored for this runner (none paused if none).
    pub async fn load(&self) -> Result<PauseSet, String> {
        self.ensure_topic().await?;
        let mut config = self.kafka.clone();
        config
            .set("group.id", format!("{}.reader", self.topic))
            .set("enable.auto.commit", "false")
            .set("isolation.level", "read_committed");
        let (topic, key) = (self.topic.clone(), self.key.clone());
        // librdkafka's calls block: off the async threads.
        tokio::task::spawn_blocking(move || read_last(&config, &topic, &key))
            .await
            .map_err(|e| format!("the pause store's reader did not finish: {e}"))?
    }

    fn producer(&self) -> Result<FutureProducer, String> {
        self.kafka
            .clone()
            .set("enable.idempotence", "true")
            .create()
            .map_err(|e| format!("cannot make a Kafka producer for the pause store: {e}"))
    }

    /// Forgets this runner's pauses, for `delete`: a tombstone under its
    /// key (compaction then removes its records), so a copy made again
    /// under the same name does not start paused. Nothing when the topic
    /// does not exist. Returns whether there was a store to write to.
    pub async fn forget(&self) -> Result<bool, String> {
        let meta: BaseConsumer = self
            .kafka
            .create()
            .map_err(|e| format!("cannot make a Kafka metadata client: {e}"))?;
        let topic = self.topic.clone();
        // Every topic's metadata, not this one's: asking for a missing
        // topic by name may create it.
        let exists = tokio::task::spawn_blocking(move || {
            meta.fetch_metadata(None, CALL_TIMEOUT)
                .map(|m| m.topics().iter().any(|t| t.name() == topic))
        })
        .await
        .map_err(|e| format!("the metadata request did not finish: {e}"))?
        .map_err(|e| format!("cannot list topics: {e}"))?;
        if !exists {
            return Ok(false);
        }
        let producer = self.producer()?;
        producer
            .send(FutureRecord::<str, [u8]>::to(&self.topic).key(&self.key), CALL_TIMEOUT)
            .await
            .map_err(|(e, _)| format!("cannot write to topic {}: {e}", self.topic))?;
        Ok(true)
    }

    /// Loads the stored pauses into `control`, then stores every change an
    /// operator makes, in the background, and tells `control` once each is
    /// stored (the admin API answers a pause after that).
    pub async fn attach(&self, control: &Control) -> Result<(), String> {
        let stored = self.load().await?;
        if stored != PauseSet::default() {
            tracing::info!(all = stored.all, tables = ?stored.tables, "paused before the restart: still paused");
        }
        control.restore(stored.clone());
        let producer = self.producer()?;
        let mut changes = control.subscribe();
        let control = control.clone();
        let (topic, key) = (self.topic.clone(), self.key.clone());
        tokio::spawn(async move {
            let mut last = stored;
            loop {
                let now = changes.borrow_and_update().clone();
                if now != last {
                    let value = serde_json::to_string(&now).unwrap_or_default();
                    let mut delay = Duration::from_millis(200);
                    // Retried until stored: a pause is never dropped.
                    while let Err((e, _)) = producer
                        .send(FutureRecord::to(&topic).key(&key).payload(&value), CALL_TIMEOUT)
                        .await
                    {
                        tracing::warn!(error = %e, topic = %topic, "cannot store the pause set yet; retrying");
                        tokio::time::sleep(delay).await;
                        delay = (delay * 2).min(Duration::from_secs(10));
                    }
                    control.mark_stored(now.clone());
                    last = now;
                }
                if changes.changed().await.is_err() {
                    return;
                }
            }
        });
        Ok(())
    }
}

/// At a runner's start: attaches `store` to `control` (see
/// [`PauseStore::attach`]), retried until Kafka answers, the wait shown in
/// the status. Nothing moves before the stored pauses are known.
pub async fn attach_at_start(store: PauseStore, control: &Control, telemetry: &crate::telemetry::Telemetry) {
    let mut delay = Duration::from_millis(500);
    loop {
        match store.attach(control).await {
            Ok(()) => {
                telemetry.set_paused(None);
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the stored pauses yet; retrying");
                telemetry.set_paused(Some(format!("reading the stored operator pauses: {e}")));
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(30));
            }
        }
    }
}

/// Reads `topic` from its start to its end; the last value of `key`.
fn read_last(config: &ClientConfig, topic: &str, key: &str) -> Result<PauseSet, String> {
    let consumer: BaseConsumer = config.create().map_err(|e| format!("cannot make a Kafka consumer: {e}"))?;
    let (low, high) = consumer
        .fetch_watermarks(topic, 0, CALL_TIMEOUT)
        .map_err(|e| format!("cannot read the end of topic {topic}: {e}"))?;
    let mut last = PauseSet::default();
    if high <= low {
        return Ok(last);
    }
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Beginning)
        .map_err(|e| format!("cannot read topic {topic}: {e}"))?;
    consumer.assign(&tpl).map_err(|e| format!("cannot read topic {topic}: {e}"))?;
    let deadline = std::time::Instant::now() + CALL_TIMEOUT * 3;
    loop {
        let position = consumer
            .position()
            .ok()
            .and_then(|p| p.find_partition(topic, 0).and_then(|e| e.offset().to_raw()))
            .unwrap_or(low);
        if position >= high {
            return Ok(last);
        }
        if std::time::Instant::now() > deadline {
            return Err(format!("reading topic {topic} to its end ({high}) took too long, at {position}"));
        }
        match consumer.poll(Duration::from_millis(500)) {
            Some(Ok(m)) if m.key() == Some(key.as_bytes()) => {
                last = match m.payload() {
                    None => PauseSet::default(),
                    Some(v) => serde_json::from_slice(v)
                        .map_err(|e| format!("topic {topic} offset {}: not a pause set: {e}", m.offset()))?,
                }
            }
            Some(Ok(_)) | None => {}
            Some(Err(e)) => return Err(format!("cannot read topic {topic}: {e}")),
        }
    }
}

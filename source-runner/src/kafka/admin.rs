//! The source runner's topics: created when first needed (the offsets
//! topic compacted), their partition counts, and the table each one
//! carries (for errors about a topic).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::RDKafkaErrorCode;
use tracing::warn;
use tributary_connectors::kafka::kafka_error;
use tributary_connectors::Error;
use tributary_schemas::TableId;

use super::blocking;
use super::producer::SourceProducer;

/// The offsets topic's `segment.ms`. Compaction never touches a topic's
/// active segment, which rolls after 7 days by default: every checkpoint of
/// that week (one per transaction: millions) would be read at each start.
/// An hour bounds the uncompacted tail to an hour of checkpoints.
pub const OFFSETS_SEGMENT_MS: u64 = 3_600_000;
/// How long a topic just created may show no partitions in the metadata
/// before the runner gives up and starts again. The controller's metadata
/// reaches the broker a moment after `CreateTopics` answers; on a busy
/// machine the first look found none, and the whole start (an initial
/// snapshot included) was done again for it.
const NEW_TOPIC_METADATA_WAIT: Duration = Duration::from_secs(10);
/// Pause between two looks at a new topic's metadata.
const NEW_TOPIC_METADATA_POLL: Duration = Duration::from_millis(50);
/// Kafka's answer to a metadata request.
const METADATA_TIMEOUT: Duration = Duration::from_secs(10);

/// The topics a runner writes to.
pub struct Topics {
    admin: AdminClient<DefaultClientContext>,
    /// The producer's client, which asks for partition counts.
    metadata: Arc<SourceProducer>,
    /// Topics known to exist, with their partition count.
    partitions: HashMap<String, i32>,
    /// The table of each topic named so far (for errors about a topic).
    tables: HashMap<String, TableId>,
}

impl Topics {
    /// Topics administered through `admin`, their metadata read through
    /// `metadata`.
    pub(crate) fn new(admin: AdminClient<DefaultClientContext>, metadata: Arc<SourceProducer>) -> Self {
        Self {
            admin,
            metadata,
            partitions: HashMap::new(),
            tables: HashMap::new(),
        }
    }

    /// Creates `topic` if it does not exist (compacted for the offsets
    /// topic) and remembers its partition count.
    pub async fn ensure(&mut self, topic: &str, compacted: bool) -> Result<i32, Error> {
        if let Some(p) = self.partitions.get(topic) {
            return Ok(*p);
        }
        let new = NewTopic::new(topic, if compacted { 1 } else { -1 }, TopicReplication::Fixed(-1));
        let segment_ms = OFFSETS_SEGMENT_MS.to_string();
        let new = if compacted {
            new.set("cleanup.policy", "compact").set("segment.ms", &segment_ms)
        } else {
            new
        };
        let results = self
            .admin
            .create_topics(&[new], &AdminOptions::new())
            .await
            .map_err(|e| kafka_error("create topic", e))?;
        for r in results {
            match r {
                Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((t, code)) if topic_creation_needs_operator(code) => {
                    return Err(Error::needs_operator(format!("cannot create topic {t}: {code}"))
                        .with_class(format!("kafka.{code:?}"))
                        .with_hint(
                            "a retry cannot fix this: check the topic's name (topic_template), the broker's topic \
                             policy and settings, and the runner's rights to create topics",
                        ))
                }
                Err((t, code)) => {
                    return Err(Error::retryable(format!("cannot create topic {t}: {code}"))
                        .with_class(format!("kafka.{code:?}")))
                }
            }
        }
        let partitions = self.partition_count(topic).await?;
        self.partitions.insert(topic.to_string(), partitions);
        Ok(partitions)
    }

    /// The partition count of `topic` as the broker has it now (the topic
    /// is created first if need be), for a record that goes to every
    /// partition: a count remembered from earlier would miss partitions
    /// added since (`kafka-topics --alter --partitions`), and the sinks
    /// reading those would never see the record.
    pub async fn every_partition(&mut self, topic: &str) -> Result<i32, Error> {
        if !self.partitions.contains_key(topic) {
            // Made (or found) just now: its count was asked with it.
            return self.ensure(topic, false).await;
        }
        let partitions = self.partition_count(topic).await?;
        self.partitions.insert(topic.to_string(), partitions);
        Ok(partitions)
    }

    /// Remembers that `topic` carries `table`.
    pub fn name_table(&mut self, topic: String, table: TableId) {
        self.tables.insert(topic, table);
    }

    /// The table `topic` carries, once named.
    pub fn table_of(&self, topic: &str) -> Option<TableId> {
        self.tables.get(topic).cloned()
    }

    /// The partition count of `topic` in the broker's metadata, asked until
    /// it shows partitions or [`NEW_TOPIC_METADATA_WAIT`] has passed.
    async fn partition_count(&self, topic: &str) -> Result<i32, Error> {
        let deadline = Instant::now() + NEW_TOPIC_METADATA_WAIT;
        loop {
            let producer = self.metadata.clone();
            let name = topic.to_string();
            let partitions = blocking(move || {
                use rdkafka::producer::Producer;
                producer
                    .client()
                    .fetch_metadata(Some(&name), METADATA_TIMEOUT)
                    .map(|m| m.topics().first().map(|t| t.partitions().len() as i32).unwrap_or(0))
            })
            .await?
            .map_err(|e| kafka_error("topic metadata", e))?;
            if partitions > 0 {
                return Ok(partitions);
            }
            if Instant::now() >= deadline {
                return Err(Error::retryable(format!("topic {topic} has no partitions yet")));
            }
            tokio::time::sleep(NEW_TOPIC_METADATA_POLL).await;
        }
    }

    /// Refuses an offsets topic that is not compacted: with `delete` alone
    /// its retention would one day remove the last checkpoint, and the next
    /// start would have none (see `Source::start`'s handling of a missing
    /// one).
    pub async fn check_offsets_topic(&self, topic: &str, bootstrap_servers: &str) -> Result<(), Error> {
        let results = self
            .admin
            .describe_configs(&[ResourceSpecifier::Topic(topic)], &AdminOptions::new())
            .await
            .map_err(|e| kafka_error("describe the offsets topic's config", e))?;
        let (policy, segment_ms) = match results.into_iter().next() {
            Some(Ok(resource)) => (
                resource.get("cleanup.policy").and_then(|e| e.value.clone()),
                resource
                    .get("segment.ms")
                    .and_then(|e| e.value.as_deref())
                    .and_then(|v| v.parse::<u64>().ok()),
            ),
            Some(Err(code)) => {
                return Err(Error::retryable(format!("cannot describe the config of topic {topic}: {code}")));
            }
            None => (None, None),
        };
        if segment_ms.is_some_and(|ms| ms > OFFSETS_SEGMENT_MS) {
            // Made by an older runner or by hand: it works, but each start
            // reads every checkpoint since the segment last rolled.
            warn!(
                topic,
                segment_ms,
                "the offsets topic keeps its newest records uncompacted until its segment rolls, and each start \
                 reads them all: kafka-configs.sh --bootstrap-server {bootstrap_servers} --alter --entity-type \
                 topics --entity-name {topic} --add-config segment.ms={OFFSETS_SEGMENT_MS}"
            );
        }
        offsets_topic_policy_error(topic, policy.as_deref(), bootstrap_servers).map_or(Ok(()), Err)
    }
}

/// Whether a topic-creation error is one a retry cannot fix: a name,
/// setting or right the cluster refuses. Classified by code.
fn topic_creation_needs_operator(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::InvalidTopic
            | RDKafkaErrorCode::InvalidPartitions
            | RDKafkaErrorCode::InvalidReplicationFactor
            | RDKafkaErrorCode::InvalidReplicaAssignment
            | RDKafkaErrorCode::InvalidConfig
            | RDKafkaErrorCode::InvalidRequest
            | RDKafkaErrorCode::PolicyViolation
            | RDKafkaErrorCode::UnsupportedVersion
            | RDKafkaErrorCode::TopicAuthorizationFailed
            | RDKafkaErrorCode::ClusterAuthorizationFailed
    )
}

/// The needs-operator error for an offsets topic whose `cleanup.policy`
/// (`None`: unknown) lacks `compact`.
pub fn offsets_topic_policy_error(topic: &str, policy: Option<&str>, bootstrap_servers: &str) -> Option<Error> {
    let policy = policy?;
    if policy.split(',').any(|p| p.trim() == "compact") {
        return None;
    }
    Some(
        Error::needs_operator(format!(
            "the offsets topic {topic} has cleanup.policy={policy}, not compact: its retention would delete the \
             source's checkpoint, and the next start would find none"
        ))
        .with_class("tributary.kafka.offsets_topic_not_compacted")
        .with_hint(format!(
            "kafka-configs.sh --bootstrap-server {bootstrap_servers} --alter --entity-type topics --entity-name \
             {topic} --add-config cleanup.policy=compact (the runner goes on by itself once it is compacted)"
        )),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_creation_errors_a_retry_cannot_fix_need_an_operator() {
        for code in [
            RDKafkaErrorCode::InvalidTopic,
            RDKafkaErrorCode::InvalidConfig,
            RDKafkaErrorCode::PolicyViolation,
            RDKafkaErrorCode::InvalidReplicationFactor,
            RDKafkaErrorCode::TopicAuthorizationFailed,
        ] {
            assert!(topic_creation_needs_operator(code), "{code:?}");
        }
        for code in [RDKafkaErrorCode::RequestTimedOut, RDKafkaErrorCode::NotController] {
            assert!(!topic_creation_needs_operator(code), "{code:?}");
        }
    }

    #[test]
    fn only_a_compacted_offsets_topic_is_accepted() {
        assert!(offsets_topic_policy_error("p.tributary.offsets", Some("compact"), "k:9092").is_none());
        assert!(offsets_topic_policy_error("p.tributary.offsets", Some("compact, delete"), "k:9092").is_none());
        assert!(offsets_topic_policy_error("p.tributary.offsets", None, "k:9092").is_none(), "unknown: let it be");
        let e = offsets_topic_policy_error("p.tributary.offsets", Some("delete"), "k:9092").expect("refused");
        assert!(e.to_string().contains("cleanup.policy=compact"), "{e}");
    }
}

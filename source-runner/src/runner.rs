//! The source runner's loop: source batches -> Avro -> one Kafka transaction
//! (events + checkpoint) -> acknowledge to the source.
//!
//! A streamed batch is committed at once (latency). Snapshot batches share
//! a transaction, up to [`TXN_MAX_EVENTS`] events or [`TXN_MAX_AGE`]: a
//! commit waits until Kafka has every record of the transaction, and the
//! runner produces nothing meanwhile, so one commit per snapshot chunk made
//! commits most of a snapshot's time (a bigger chunk would instead hold
//! more decoded rows in memory). Measured on a 1M-row snapshot: 59k rows/s
//! with a commit per 8192-row chunk, 150k with up to 65,536 events per
//! transaction, 206-216k with up to 262,144, 237k with one transaction.
//! The first snapshot transaction holds one batch and each next one up to
//! four times as many events as the one before, so sinks get the first rows at
//! once. Events are encoded and handed to librdkafka batch by batch, so an
//! open transaction holds only encoded bytes (bounded by
//! `producer_queue_kbytes`).
//!
//! Exactly once rests on three facts:
//! 1. the events of the batches and the checkpoint that covers them are
//!    written in one Kafka transaction, so `read_committed` consumers see
//!    both or neither;
//! 2. the transactional id is stable per runner, so a restarted runner fences
//!    its crashed predecessor and the broker aborts whatever it left open
//!    before we read the last checkpoint;
//! 3. the source releases history (slot flush LSN) only after the commit.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::{ClientContext, DefaultClientContext};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::{Message, Offset, TopicPartitionList};
use tracing::{debug, info, info_span, warn, Instrument};
use tributary_connectors::{
    policy, Checkpoint, CopyHold, Decision, Error, ErrorKind, Source, SourceBatch, SourceMessage,
};
use tributary_operations::admin::Control;
use tributary_operations::process::sleep_until;
use tributary_operations::telemetry::{TableState, Telemetry};
use tributary_schemas::avro::EnvelopeOptions;
use tributary_schemas::encoder::EventEncoder;
use tributary_schemas::topic::TopicNaming;
use tributary_schemas::{Op, Position, SchemaError, SnapshotMarker, TableId, TableSchema};

use crate::config::{IncompatibleSchemaChanges, SourceRunnerConfig};

use tributary_schemas::topic::{
    CONTROL_HEADER, CONTROL_POSITION_HEADER, CONTROL_RESET_HEADER, CONTROL_SCHEMA_HEADER, CONTROL_TABLE_COPIED,
    CONTROL_TABLE_DROPPED, CONTROL_TABLE_NAME_HEADER, CONTROL_TABLE_RESET,
};

/// How long to wait for Kafka's answer to a transaction step.
const KAFKA_TXN_STEP_TIMEOUT: Duration = Duration::from_secs(30);
/// How long reading the offsets topic at start may make no progress before
/// it is given up (and retried): a bound on a stall, not on the topic's size.
const CHECKPOINT_READ_STALL: Duration = Duration::from_secs(60);
/// The offsets topic's `segment.ms`. Compaction never touches a topic's
/// active segment, which rolls after 7 days by default: every checkpoint of
/// that week (one per transaction: millions) would be read at each start.
/// An hour bounds the uncompacted tail to an hour of checkpoints.
pub const OFFSETS_SEGMENT_MS: u64 = 3_600_000;
/// How long to wait before offering a record again while librdkafka's
/// queue is full.
const DELIVERY_CHECK: Duration = Duration::from_millis(1);
/// How often the source is asked how much history its database keeps
/// for the copy (`tributary_source_retained_bytes`).
const RETAINED_EVERY: Duration = Duration::from_secs(30);

/// A run of the source that lasted this long resets the retry backoff.
const RUN_RESETS_BACKOFF: Duration = Duration::from_secs(60);
/// Snapshot batches share a Kafka transaction up to this many events...
pub const TXN_MAX_EVENTS: usize = 262_144;
/// ...or for this long (checked when a batch arrives); well inside the
/// transaction timeout (at least 1 s, 60 s by default).
pub const TXN_MAX_AGE: Duration = Duration::from_secs(2);

/// Maps a Kafka error onto our error kinds. Kafka codes are classified, never
/// string-matched.
fn kafka_error(context: &str, err: KafkaError) -> Error {
    let kind = match &err {
        // A setting librdkafka refuses (its message repeats the value,
        // which may be a secret, so it is not kept) or a client it cannot
        // make from the settings: a retry makes the same client again.
        KafkaError::ClientConfig(_, _, key, _) => {
            return Error::needs_operator(format!("kafka: {context}: librdkafka refuses the setting `{key}`"))
                .with_class("kafka.ClientConfig")
                .with_hint(format!("correct or remove `{key}` under [kafka] properties"));
        }
        KafkaError::ClientCreation(_) => ErrorKind::NeedsOperator,
        KafkaError::Transaction(e) if e.is_fatal() => ErrorKind::NeedsOperator,
        // A record too large fails its transaction (an abortable error):
        // the same record fails again however often it is retried.
        KafkaError::Transaction(e) if too_large(e.code()) => ErrorKind::NeedsOperator,
        KafkaError::Transaction(_) => ErrorKind::Retryable,
        e => match e.rdkafka_error_code() {
            Some(
                RDKafkaErrorCode::TopicAuthorizationFailed
                | RDKafkaErrorCode::ClusterAuthorizationFailed
                | RDKafkaErrorCode::TransactionalIdAuthorizationFailed
                | RDKafkaErrorCode::SaslAuthenticationFailed
                | RDKafkaErrorCode::Authentication,
            ) => ErrorKind::NeedsOperator,
            Some(code) if too_large(code) => ErrorKind::NeedsOperator,
            _ => ErrorKind::Retryable,
        },
    };
    Error::new(kind, format!("kafka: {context}"))
        .with_class(format!("kafka.{:?}", err.rdkafka_error_code()))
        .with_source(err)
}

/// Whether `code` says a record (or its batch) is larger than the producer
/// (`message.max.bytes`) or the broker and topic (`max.message.bytes`)
/// accept.
fn too_large(code: RDKafkaErrorCode) -> bool {
    matches!(code, RDKafkaErrorCode::MessageSizeTooLarge | RDKafkaErrorCode::MessageBatchTooLarge)
}

/// What an operator does about a record too large for Kafka.
fn too_large_hint(topic: &str, bytes: usize) -> String {
    format!(
        "raise the producer's message.max.bytes ([kafka] properties = {{ \"message.max.bytes\" = \"...\" }}, \
         librdkafka's default 1000000) and the topic's max.message.bytes (kafka-configs.sh --alter \
         --entity-type topics --entity-name {topic} --add-config max.message.bytes=...) above {bytes} bytes; \
         the runner resumes by itself once both fit"
    )
}

/// The error of a record of `bytes` bytes that Kafka refuses as too large.
fn too_large_error(topic: &str, bytes: usize, code: RDKafkaErrorCode) -> Error {
    Error::needs_operator(format!(
        "kafka: a record of {bytes} bytes (key and value, uncompressed) is larger than Kafka accepts on topic {topic}: \
         {code}"
    ))
    .with_class(format!("kafka.{code:?}"))
    .with_hint(too_large_hint(topic, bytes))
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

/// The producer's context: keeps the largest record Kafka refused as too
/// large since the last look, so that the failed commit can say which
/// record, how large and on which topic (librdkafka reports a refused
/// record only in its delivery report; the commit says no more than that
/// the transaction failed).
#[derive(Clone, Default)]
pub struct SourceProducerContext {
    refused: Arc<std::sync::Mutex<Option<(String, usize, RDKafkaErrorCode)>>>,
    /// librdkafka's last authentication failure (a refused SASL login, an
    /// OAuth token it could not get): it retries those by itself, so the
    /// calls waiting on the broker would only time out, saying nothing of
    /// the cause.
    auth_failure: Arc<std::sync::Mutex<Option<String>>>,
}

impl ClientContext for SourceProducerContext {
    fn error(&self, error: KafkaError, reason: &str) {
        if tributary_operations::kafka::is_authentication_failure(&error) {
            *self.auth_failure.lock().unwrap_or_else(|e| e.into_inner()) = Some(reason.to_string());
        }
        warn!(error = %error, reason, "librdkafka reports an error");
    }
}

impl ProducerContext for SourceProducerContext {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        let Err((err, message)) = result else {
            return;
        };
        let Some(code) = err.rdkafka_error_code().filter(|c| too_large(*c)) else {
            return;
        };
        let bytes = message.key_len() + message.payload_len();
        let mut refused = self.refused.lock().unwrap_or_else(|e| e.into_inner());
        if refused.as_ref().is_none_or(|(_, b, _)| bytes > *b) {
            *refused = Some((message.topic().to_string(), bytes, code));
        }
    }
}

impl SourceProducerContext {
    /// Resolves with the needs-operator error of the first authentication
    /// failure librdkafka reports.
    async fn authentication_failed(&self) -> Error {
        loop {
            if let Some(reason) = self.auth_failure.lock().unwrap_or_else(|e| e.into_inner()).take() {
                use tributary_operations::kafka::{AUTHENTICATION_FAILED, AUTHENTICATION_HINT};
                return Error::needs_operator(format!("{AUTHENTICATION_FAILED}: {reason}"))
                    .with_class("kafka.Authentication")
                    .with_hint(AUTHENTICATION_HINT);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The largest record refused as too large since the last call.
    fn take_refused(&self) -> Option<(String, usize, RDKafkaErrorCode)> {
        self.refused.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

/// The source runner's producer.
type SourceProducer = ThreadedProducer<SourceProducerContext>;

/// Runs `f`, a blocking librdkafka call, without stalling the async runtime.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, Error> {
    tokio::task::spawn_blocking(f).await.map_err(unfinished)
}

/// A blocking Kafka call's task that panicked or was cancelled.
fn unfinished(e: tokio::task::JoinError) -> Error {
    Error::retryable(format!("blocking Kafka call did not finish: {e}"))
}

/// [`KafkaSide::ensure_topic`], on the parts of the Kafka side it needs (so
/// that it can run beside the encoder's registry requests).
async fn ensure_topic(
    admin: &AdminClient<DefaultClientContext>,
    producer: &Arc<SourceProducer>,
    topics: &mut HashMap<String, i32>,
    topic: &str,
    compacted: bool,
) -> Result<i32, Error> {
    if let Some(p) = topics.get(topic) {
        return Ok(*p);
    }
    let new = NewTopic::new(topic, if compacted { 1 } else { -1 }, TopicReplication::Fixed(-1));
    let segment_ms = OFFSETS_SEGMENT_MS.to_string();
    let new = if compacted {
        new.set("cleanup.policy", "compact").set("segment.ms", &segment_ms)
    } else {
        new
    };
    let results = admin
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
                return Err(
                    Error::retryable(format!("cannot create topic {t}: {code}")).with_class(format!("kafka.{code:?}"))
                )
            }
        }
    }
    let partitions = partition_count(producer, topic).await?;
    topics.insert(topic.to_string(), partitions);
    Ok(partitions)
}

/// How long a topic just created may show no partitions in the metadata
/// before the runner gives up and starts again. The controller's metadata
/// reaches the broker a moment after `CreateTopics` answers; on a busy
/// machine the first look found none, and the whole start (an initial
/// snapshot included) was done again for it.
const NEW_TOPIC_METADATA_WAIT: Duration = Duration::from_secs(10);
/// Pause between two looks at a new topic's metadata.
const NEW_TOPIC_METADATA_POLL: Duration = Duration::from_millis(50);

/// The partition count of `topic` in the broker's metadata, asked until it
/// shows partitions or [`NEW_TOPIC_METADATA_WAIT`] has passed.
async fn partition_count(producer: &Arc<SourceProducer>, topic: &str) -> Result<i32, Error> {
    let deadline = Instant::now() + NEW_TOPIC_METADATA_WAIT;
    loop {
        let producer = producer.clone();
        let name = topic.to_string();
        let partitions = blocking(move || {
            producer
                .client()
                .fetch_metadata(Some(&name), Duration::from_secs(10))
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

/// Refuses an offsets topic that is not compacted: with `delete` alone its
/// retention would one day remove the last checkpoint, and the next start
/// would have none (see [`Source::start`]'s handling of a missing one).
async fn check_offsets_topic(
    admin: &AdminClient<DefaultClientContext>,
    topic: &str,
    bootstrap_servers: &str,
) -> Result<(), Error> {
    use rdkafka::admin::ResourceSpecifier;
    let results = admin
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
            "the offsets topic keeps its newest records uncompacted until its segment rolls, and each start reads \
             them all: kafka-configs.sh --bootstrap-server {bootstrap_servers} --alter --entity-type topics \
             --entity-name {topic} --add-config segment.ms={OFFSETS_SEGMENT_MS}"
        );
    }
    offsets_topic_policy_error(topic, policy.as_deref(), bootstrap_servers).map_or(Ok(()), Err)
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

/// The Kafka side of a source runner.
pub struct KafkaSide {
    config: SourceRunnerConfig,
    producer: Arc<SourceProducer>,
    admin: AdminClient<DefaultClientContext>,
    encoder: EventEncoder,
    naming: TopicNaming,
    /// Topics known to exist, with their partition count.
    topics: HashMap<String, i32>,
    /// The table of each topic named so far (for errors about a topic).
    topic_tables: HashMap<String, TableId>,
    /// The schema each table's last produced event used.
    schemas: HashMap<TableId, Arc<TableSchema>>,
    /// Whether a Kafka transaction is open.
    open: bool,
    /// Tables whose changes are held back: paused alone by a schema change
    /// their topic cannot carry (`incompatible_schema_changes =
    /// "pause_table"`), then copied again. Kept in the offsets topic beside
    /// the checkpoint, in the same transaction.
    pub held: BTreeMap<TableId, Held>,
    /// Whether `held` changed since it was last committed.
    held_changed: bool,
    /// A reset of every table asked by `source-runner reset` (its id), not
    /// carried out yet: kept in the offsets topic until the commit that
    /// holds the tables' resets in `held`.
    pub reset_all: Option<u64>,
    /// Whether the next commit clears the `reset_all` request.
    reset_all_done: bool,
    /// The source's side records as the offsets topic held them at start
    /// (handed to the source before it starts).
    pub side_records: BTreeMap<String, String>,
    /// Side records of batches in the open transaction, written with its
    /// checkpoint (`None`: deleted).
    side_pending: BTreeMap<String, Option<String>>,
}

/// The offsets-topic record of a runner's held tables: its key is the
/// runner's name and this suffix.
const HELD_KEY_SUFFIX: &str = "/held-tables";
/// The offsets-topic record of a reset of every table asked by
/// `source-runner reset` (`{"reset": <id>}`; a null value once carried
/// out): its key is the runner's name and this suffix.
const RESET_ALL_KEY_SUFFIX: &str = "/reset-all";
/// The keys of one runner's records in the offsets topic.
struct RunnerKeys {
    checkpoint: String,
    held: String,
    reset_all: String,
    side_prefix: String,
}

/// The latest of one runner's records in the offsets topic, as read.
#[derive(Default)]
struct RunnerRecords {
    checkpoint: Option<Checkpoint>,
    paused: Option<Vec<u8>>,
    reset_all: Option<Vec<u8>>,
    side: BTreeMap<String, String>,
}

impl RunnerRecords {
    /// Keeps `m` if it is one of the runner's records (the latest wins).
    fn take<M: Message>(&mut self, keys: &RunnerKeys, m: &M) {
        let Some(key) = m.key() else { return };
        if key == keys.checkpoint.as_bytes() {
            self.checkpoint = m.payload().map(|p| Checkpoint(String::from_utf8_lossy(p).into_owned()));
        } else if key == keys.held.as_bytes() {
            self.paused = m.payload().map(<[u8]>::to_vec);
        } else if key == keys.reset_all.as_bytes() {
            self.reset_all = m.payload().map(<[u8]>::to_vec);
        } else if let Some(k) = key.strip_prefix(keys.side_prefix.as_bytes()) {
            let k = String::from_utf8_lossy(k).into_owned();
            match m.payload() {
                Some(v) => self.side.insert(k, String::from_utf8_lossy(v).into_owned()),
                None => self.side.remove(&k),
            };
        }
    }
}

/// The offsets-topic records of the source's side records (see
/// `Source::take_side_records`): their keys are the runner's name, this
/// infix and the source's key.
const SIDE_KEY_INFIX: &str = "/source/";

/// The reset-all record's value.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct ResetAll {
    reset: u64,
}

/// A new reset's id: the clock in milliseconds, so that a later reset of a
/// table has a greater id than an earlier one (see
/// [`tributary_schemas::topic::CONTROL_RESET_HEADER`]).
pub fn new_reset_id() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A table whose changes are held back, and how far its new copy is.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Held {
    /// Why it was paused (the schema change, with the fix).
    pub reason: String,
    /// Where its new copy is.
    pub copy: Copy,
    /// A reset (its id) due before the copy's rows: a table-reset record
    /// on every partition of the table's topic makes sinks forget the
    /// positions their rows hold, so that the copy's rows, from another
    /// position domain or not, pass the position guard. Sent once the
    /// source has taken the copy on (not while `Paused`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reset: Option<u64>,
}

/// How far the new copy of a held table is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Copy {
    /// Paused: every change is held back until the next start asks the
    /// source to copy it again.
    Paused,
    /// The source was asked to copy it: changes are held back until the
    /// copy's rows come.
    Asked,
    /// The copy's rows read the table at this position: streamed changes
    /// before it (which the copy's rows already hold) are held back, those
    /// after it flow; the first one after the sweep ends the hold. (Not
    /// before: a copy resumed after a restart reads at a later position,
    /// and the stream catches up to it, past this one, before the copy
    /// ends; the sweep is still due then.)
    From {
        /// `Position::commit` of the copy's rows.
        commit: u64,
        /// `Position::index` of the copy's rows.
        index: u64,
        /// Whether the copy is complete and the rows it did not rewrite
        /// (deleted while the table was held back) were declared gone.
        #[serde(default)]
        swept: bool,
    },
}

/// One held table in the offsets-topic record.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct HeldRecord {
    schema: String,
    table: String,
    #[serde(flatten)]
    held: Held,
}

impl KafkaSide {
    /// Connects to Kafka and the registry and fences any earlier instance of
    /// this runner (`init_transactions`).
    pub async fn connect(config: &SourceRunnerConfig) -> Result<Self, Error> {
        let client = config.kafka.client_config().map_err(|e| Error::needs_operator(e.to_string()))?;
        let mut producer_config = client.clone();
        // Correctness and the memory bound: never overridable.
        producer_config
            .set("transactional.id", config.transactional_id())
            .set("enable.idempotence", "true")
            .set("transaction.timeout.ms", config.transaction_timeout_ms.to_string())
            .set("queue.buffering.max.kbytes", config.producer_queue_kbytes.to_string());
        // Tuning: only where `kafka.properties` does not say otherwise. lz4,
        // not zstd: zstd took a sixth of the runner's CPU in a 1M-row
        // snapshot on 2 cores shared with the database and the broker, and
        // lz4 made that snapshot about 20% faster (141-150k vs 120k rows/s).
        // A 20 ms linger fills a snapshot's produce requests; a commit does
        // not wait for it (see `wait_delivered`). Delivery reports only for
        // failures: nothing reads the others (a failed record fails the
        // transaction's commit, and the runner retries from the last
        // checkpoint), and serving a million of them took a quarter second
        // of CPU per 1M-row snapshot.
        for (key, value) in [
            ("linger.ms", "20"),
            ("compression.type", "lz4"),
            ("delivery.report.only.error", "true"),
        ] {
            if producer_config.get(key).is_none() {
                producer_config.set(key, value);
            }
        }
        let context = SourceProducerContext::default();
        let producer: SourceProducer = producer_config
            .create_with_context(context.clone())
            .map_err(|e| kafka_error("cannot create the producer", e))?;
        let producer = Arc::new(producer);
        let p = producer.clone();
        // Started now, awaited below: the admin and registry clients and the
        // offsets topic are made meanwhile (the start-up is a snapshot's
        // first second, with the machine mostly idle).
        let fencing = tokio::task::spawn_blocking(move || p.init_transactions(KAFKA_TXN_STEP_TIMEOUT));
        let admin: AdminClient<DefaultClientContext> =
            client.create().map_err(|e| kafka_error("cannot create the admin client", e))?;
        let registry = config
            .schema_registry
            .registry(&config.schema_registry_url)
            .map_err(|e| Error::needs_operator(e.to_string()))?;
        let encoder = EventEncoder::new(
            registry,
            EnvelopeOptions {
                connector: config.connector().to_string(),
                tombstones: config.tombstones,
            },
        )
        .register_incompatible(config.incompatible_schema_changes == IncompatibleSchemaChanges::Register);
        let naming = TopicNaming::new(config.topic_template.clone());
        let mut side = KafkaSide {
            config: config.clone(),
            producer,
            admin,
            encoder,
            naming,
            topics: HashMap::new(),
            topic_tables: HashMap::new(),
            schemas: HashMap::new(),
            open: false,
            held: BTreeMap::new(),
            held_changed: false,
            reset_all: None,
            reset_all_done: false,
            side_records: BTreeMap::new(),
            side_pending: BTreeMap::new(),
        };
        let offsets_topic = config.offsets_topic();
        // A refused login fails the start at once, with its reason.
        let (fenced, offsets) = tokio::select! {
            both = async { tokio::join!(fencing, side.ensure_topic(&offsets_topic, true)) } => both,
            refused = context.authentication_failed() => return Err(refused),
        };
        fenced
            .map_err(unfinished)?
            .map_err(|e| kafka_error("init_transactions (fencing the previous instance)", e))?;
        offsets?;
        check_offsets_topic(&side.admin, &offsets_topic, &side.config.kafka.bootstrap_servers).await?;
        Ok(side)
    }

    /// Creates a topic if it does not exist (compacted for the offsets topic)
    /// and remembers its partition count.
    async fn ensure_topic(&mut self, topic: &str, compacted: bool) -> Result<i32, Error> {
        ensure_topic(&self.admin, &self.producer, &mut self.topics, topic, compacted).await
    }

    /// The partition count of `topic` as the broker has it now (the topic
    /// is created first if need be), for a record that goes to every
    /// partition: a count remembered from earlier would miss partitions
    /// added since (`kafka-topics --alter --partitions`), and the sinks
    /// reading those would never see the record.
    async fn every_partition(&mut self, topic: &str) -> Result<i32, Error> {
        if !self.topics.contains_key(topic) {
            // Made (or found) just now: its count was asked with it.
            return self.ensure_topic(topic, false).await;
        }
        let partitions = partition_count(&self.producer, topic).await?;
        self.topics.insert(topic.to_string(), partitions);
        Ok(partitions)
    }

    /// Reads this runner's last committed checkpoint from the offsets topic.
    ///
    /// Must run after [`KafkaSide::connect`]: `init_transactions` has aborted
    /// whatever a crashed predecessor left open, so `read_committed` sees the
    /// final state.
    pub async fn last_checkpoint(&mut self) -> Result<Option<Checkpoint>, Error> {
        let mut c = self
            .config
            .kafka
            .client_config()
            .map_err(|e| Error::needs_operator(e.to_string()))?;
        c.set("group.id", format!("tributary-source-{}-checkpoint", self.config.name))
            .set("enable.auto.commit", "false")
            .set("isolation.level", "read_committed");
        let consumer: BaseConsumer = c.create().map_err(|e| kafka_error("checkpoint consumer", e))?;
        let topic = self.config.offsets_topic();
        let name = self.config.name.clone();
        let keys = RunnerKeys {
            held: format!("{name}{HELD_KEY_SUFFIX}"),
            reset_all: format!("{name}{RESET_ALL_KEY_SUFFIX}"),
            side_prefix: format!("{name}{SIDE_KEY_INFIX}"),
            checkpoint: name,
        };
        let found = blocking(move || -> Result<RunnerRecords, Error> {
            let mut found = RunnerRecords::default();
            let (low, high) = consumer
                .fetch_watermarks(&topic, 0, Duration::from_secs(10))
                .map_err(|e| kafka_error("offsets topic watermarks", e))?;
            if high <= low {
                return Ok(found);
            }
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition_offset(&topic, 0, Offset::Beginning)
                .map_err(|e| kafka_error("assign offsets topic", e))?;
            consumer.assign(&tpl).map_err(|e| kafka_error("assign offsets topic", e))?;
            let mut deadline = Instant::now() + CHECKPOINT_READ_STALL;
            let mut read_to = -1;
            // Asked of librdkafka after a quiet poll or every so many
            // records, not after each: the call took most of the read's
            // time (a million checkpoints: 14.8 s to start).
            let mut unchecked = 0u32;
            loop {
                if unchecked > 0 && unchecked < 10_000 {
                    if let Some(Ok(m)) = consumer.poll(Duration::ZERO) {
                        unchecked += 1;
                        found.take(&keys, &m);
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
                    return Ok(found);
                }
                if position > read_to {
                    read_to = position;
                    deadline = Instant::now() + CHECKPOINT_READ_STALL;
                }
                if Instant::now() > deadline {
                    return Err(Error::retryable(format!(
                        "could not read the offsets topic {topic} to its end: no progress for {}s at {position} \
                         of {high}",
                        CHECKPOINT_READ_STALL.as_secs()
                    )));
                }
                match consumer.poll(Duration::from_millis(200)) {
                    Some(Ok(m)) => {
                        unchecked = 1;
                        found.take(&keys, &m);
                    }
                    Some(Err(KafkaError::PartitionEOF(_))) | None => {}
                    Some(Err(e)) => return Err(kafka_error("read offsets topic", e)),
                }
            }
        })
        .await??;
        let RunnerRecords { checkpoint, paused, reset_all, side } = found;
        self.held = match paused {
            None => BTreeMap::new(),
            Some(bytes) => serde_json::from_slice::<Vec<HeldRecord>>(&bytes)
                .map_err(|e| Error::needs_operator(format!("the record of held tables is unreadable: {e}")))?
                .into_iter()
                .map(|r| (TableId::new(r.schema, r.table), r.held))
                .collect(),
        };
        self.held_changed = false;
        self.reset_all = match reset_all {
            None => None,
            Some(bytes) => Some(
                serde_json::from_slice::<ResetAll>(&bytes)
                    .map_err(|e| {
                        Error::needs_operator(format!("the record of a reset of every table is unreadable: {e}"))
                    })?
                    .reset,
            ),
        };
        self.reset_all_done = false;
        self.side_records = side;
        self.side_pending.clear();
        Ok(checkpoint)
    }

    /// Side records of a batch just added: written with the open
    /// transaction's checkpoint.
    pub fn stage_side_records(&mut self, records: Vec<(String, Option<String>)>) {
        self.side_pending.extend(records);
    }

    /// Takes on the resets the source starts with: after a change of its
    /// position domain (or a reset of every table, which the source
    /// reports as one) every table it captures is copied again, with a
    /// reset first. Tables it no longer captures are no longer held.
    pub fn reset_all_tables(&mut self, why: &str, tables: Vec<TableId>) {
        let reset = self.reset_all.unwrap_or_else(new_reset_id);
        warn!(
            reason = why,
            tables = tables.len(),
            reset,
            "copying every table again; destination rows the new copy does not see are removed"
        );
        self.held.retain(|t, _| tables.contains(t));
        for table in tables {
            self.held.insert(
                table,
                Held {
                    reason: why.to_string(),
                    copy: Copy::Asked,
                    reset: Some(reset),
                },
            );
        }
        self.held_changed = true;
        self.reset_all_done = self.reset_all.is_some();
    }

    /// Records a reset asked by `source-runner reset`, to be carried out at
    /// the runner's next start: of `tables`, or of every table when there
    /// is none. Commits it alone (no checkpoint) in the runner's own
    /// transactional id: [`KafkaSide::connect`] fenced a running runner,
    /// which fails its next commit and starts again, finding the request.
    pub async fn record_reset(&mut self, tables: &[TableId]) -> Result<u64, Error> {
        let reset = new_reset_id();
        if tables.is_empty() {
            self.reset_all = Some(reset);
        }
        for table in tables {
            self.held.insert(
                table.clone(),
                Held {
                    reason: "copied again, as asked (source-runner reset)".to_string(),
                    copy: Copy::Paused,
                    reset: Some(reset),
                },
            );
            self.held_changed = true;
        }
        self.begin().await?;
        let topic = self.config.offsets_topic();
        let name = self.config.name.clone();
        let sent = async {
            if self.held_changed {
                let value = self.held_record();
                self.send(&topic, Some(0), Some(format!("{name}{HELD_KEY_SUFFIX}").as_bytes()), Some(&value), None)
                    .await?;
            }
            if tables.is_empty() {
                let value = serde_json::to_vec(&ResetAll { reset }).unwrap_or_default();
                let key = format!("{name}{RESET_ALL_KEY_SUFFIX}");
                self.send(&topic, Some(0), Some(key.as_bytes()), Some(&value), None).await?;
            }
            Ok::<(), Error>(())
        }
        .await;
        if let Err(e) = sent {
            self.abort().await;
            return Err(e);
        }
        self.wait_delivered().await;
        let p = self.producer.clone();
        match blocking(move || p.commit_transaction(KAFKA_TXN_STEP_TIMEOUT)).await? {
            Ok(()) => {
                self.open = false;
                self.held_changed = false;
                Ok(reset)
            }
            Err(e) => {
                self.abort().await;
                Err(kafka_error("commit_transaction", e))
            }
        }
    }

    /// Copies `table` (`schema.table`) again while the stream goes on, as
    /// `POST /resync` asks: what a reset does at a start (see
    /// [`KafkaSide::record_reset`] and `run_once`), done between two
    /// batches instead, without a restart. The state after a committed
    /// batch is the state a start from its checkpoint makes, so the source
    /// copies as it would right after [`Source::start`]. The held table and
    /// the source's plan reach the offsets topic with the next checkpoint;
    /// a crash before that loses the request, never a change. The outer
    /// result is the runner's (an error restarts it from its checkpoint),
    /// the inner one the operator's answer.
    pub async fn resync_live(&mut self, source: &mut dyn Source, table: &str) -> Result<Result<String, String>, Error> {
        let Some(id) = table
            .split_once('.')
            .filter(|(s, t)| !s.is_empty() && !t.is_empty())
            .map(|(s, t)| TableId::new(s, t))
        else {
            return Ok(Err(format!("table {table}: expected schema.table")));
        };
        if self.held.get(&id).is_some_and(|h| h.copy != Copy::Paused) {
            return Ok(Err(format!("{table} is being copied again already")));
        }
        let reset = new_reset_id();
        let before = self.held.insert(
            id.clone(),
            Held {
                reason: "copied again, as asked (POST /resync)".to_string(),
                copy: Copy::Paused,
                reset: Some(reset),
            },
        );
        let copying = match source.resync(std::slice::from_ref(&id)).await {
            Ok(c) => c,
            Err(e) => {
                self.restore_held(&id, before);
                return Err(e);
            }
        };
        if !copying.contains(&id) {
            self.restore_held(&id, before);
            return Ok(Err(format!(
                "{table} is not copied again: the source does not capture it, or cannot copy tables again \
                 (snapshot_mode = \"never\")"
            )));
        }
        if let Some(h) = self.held.get_mut(&id) {
            h.copy = Copy::Asked;
        }
        self.held_changed = true;
        info!(table = %id, reset, "copying a table again while the others stream, as asked");
        Ok(Ok(format!(
            "copying {table} again (reset {reset}) while the other tables stream; the destination rows the new copy \
             does not see are removed at its end"
        )))
    }

    fn restore_held(&mut self, id: &TableId, before: Option<Held>) {
        match before {
            Some(h) => self.held.insert(id.clone(), h),
            None => self.held.remove(id),
        };
    }

    /// The held-tables record's value.
    fn held_record(&self) -> Vec<u8> {
        let held: Vec<HeldRecord> = self
            .held
            .iter()
            .map(|(id, held)| HeldRecord {
                schema: id.schema.clone(),
                table: id.table.clone(),
                held: held.clone(),
            })
            .collect();
        serde_json::to_vec(&held).unwrap_or_default()
    }

    /// Produces the table-reset record of each held table whose reset is
    /// due (see [`Held::reset`]) on every partition of its topic, into the
    /// open transaction (before any row of its copy).
    async fn send_resets(&mut self) -> Result<(), Error> {
        let due: Vec<(TableId, u64)> = self
            .held
            .iter()
            .filter(|(_, h)| h.copy != Copy::Paused)
            .filter_map(|(t, h)| h.reset.map(|r| (t.clone(), r)))
            .collect();
        if due.is_empty() {
            return Ok(());
        }
        self.begin().await?;
        for (table, reset) in due {
            let topic = self.naming.topic(self.config.prefix(), &table);
            let partitions = self.every_partition(&topic).await.map_err(|e| e.or_table(&table))?;
            let id = reset.to_string();
            for p in 0..partitions {
                let headers = OwnedHeaders::new()
                    .insert(Header {
                        key: CONTROL_HEADER,
                        value: Some(CONTROL_TABLE_RESET),
                    })
                    .insert(Header {
                        key: CONTROL_RESET_HEADER,
                        value: Some(id.as_str()),
                    })
                    .insert(Header {
                        key: CONTROL_SCHEMA_HEADER,
                        value: Some(table.schema.as_str()),
                    })
                    .insert(Header {
                        key: CONTROL_TABLE_NAME_HEADER,
                        value: Some(table.table.as_str()),
                    });
                self.send(&topic, Some(p), None, None, Some(headers))
                    .await
                    .map_err(|e| e.or_table(&table))?;
            }
            info!(table = %table, reset, "reset sent: sinks forget the positions of its rows before its copy");
            if let Some(h) = self.held.get_mut(&table) {
                h.reset = None;
            }
            self.held_changed = true;
        }
        Ok(())
    }

    /// Which of `batch`'s messages are held back (see [`Held`]), moving
    /// each held table's copy along.
    fn hold(&mut self, batch: &SourceBatch) -> Vec<bool> {
        let failed = |m: &SourceMessage| matches!(m, SourceMessage::TableFailed(..));
        if self.held.is_empty() && !batch.messages.iter().any(failed) {
            return Vec::new();
        }
        let mut out = vec![false; batch.messages.len()];
        for (i, msg) in batch.messages.iter().enumerate() {
            match msg {
                SourceMessage::TableFailed(t, reason) => {
                    warn!(table = %t, error = %reason, "the table is paused; the others go on");
                    self.held.insert(
                        t.clone(),
                        Held {
                            reason: reason.clone(),
                            copy: Copy::Paused,
                            reset: None,
                        },
                    );
                    self.held_changed = true;
                }
                SourceMessage::TableDropped(t) => {
                    if self.held.remove(t).is_some() {
                        self.held_changed = true;
                    }
                }
                SourceMessage::SchemaChanged(s) => out[i] = self.held.contains_key(&s.id),
                SourceMessage::Change(e) => {
                    let Some(h) = self.held.get_mut(&e.schema.id) else {
                        continue;
                    };
                    let mut hold = match h.copy {
                        Copy::Paused => {
                            out[i] = true;
                            continue;
                        }
                        Copy::Asked => CopyHold::default(),
                        Copy::From { commit, index, swept } => {
                            CopyHold { from: Some(Position { commit, index }), swept }
                        }
                    };
                    let (held, ends) = hold.admit(e);
                    if let (Copy::Asked, Some(at)) = (h.copy, hold.from) {
                        h.copy = Copy::From { commit: at.commit, index: at.index, swept: false };
                        self.held_changed = true;
                    }
                    if ends {
                        self.held.remove(&e.schema.id);
                        self.held_changed = true;
                    }
                    out[i] = held;
                }
            }
        }
        out
    }

    /// Whether the message at `i` is held back: by [`KafkaSide::hold`], or
    /// because its table was paused since.
    fn is_held(&self, skip: &[bool], i: usize, table: &TableId) -> bool {
        skip.get(i).copied().unwrap_or(false) || self.held.get(table).is_some_and(|h| h.copy == Copy::Paused)
    }

    /// Adds a batch's events to the open Kafka transaction, beginning one
    /// when none is open. [`KafkaSide::commit`] makes them durable.
    ///
    /// On error the transaction is aborted (or the producer must be rebuilt
    /// when the error is fatal); nothing of it is visible to
    /// `read_committed` consumers.
    ///
    /// Returns what was produced per table.
    pub async fn add_batch(&mut self, batch: &SourceBatch) -> Result<HashMap<TableId, TableCounts>, Error> {
        // Register new schema versions before producing anything that
        // needs them: an incompatible change stops us (and aborts the
        // transaction) before any event of it is produced.
        // The schema of the message before: a batch is mostly one table's
        // rows sharing one Arc, so most messages need no lookup at all.
        if let Err(e) = self.send_resets().await {
            self.abort().await;
            return Err(e);
        }
        let skip = self.hold(batch);
        let mut previous: Option<&Arc<TableSchema>> = None;
        for (i, msg) in batch.messages.iter().enumerate() {
            let schema = match msg {
                SourceMessage::SchemaChanged(s) => s,
                SourceMessage::Change(e) => &e.schema,
                SourceMessage::TableDropped(_) | SourceMessage::TableFailed(..) => continue,
            };
            if self.is_held(&skip, i, &schema.id) {
                continue;
            }
            if previous.is_some_and(|p| Arc::ptr_eq(p, schema)) {
                continue;
            }
            previous = Some(schema);
            // Same Arc as last time: nothing to compare (the common case).
            if self.schemas.get(&schema.id).is_some_and(|s| Arc::ptr_eq(s, schema)) {
                continue;
            }
            // An equal schema in another Arc is prepared again too (which
            // costs nothing but remembering this Arc), so that later
            // events of it are recognised by pointer, not compared column
            // by column.
            let schema = schema.clone();
            let topic = self.naming.topic(self.config.prefix(), &schema.id);
            // The topic's creation and the schemas' registration at once:
            // each is a few round trips, and neither needs the other.
            let (created, registered) = tokio::join!(
                ensure_topic(&self.admin, &self.producer, &mut self.topics, &topic, false),
                self.encoder.prepare(&schema, &topic),
            );
            self.topic_tables.insert(topic, schema.id.clone());
            if let Err(e) = created.map_err(|e| e.or_table(&schema.id)) {
                self.abort().await;
                return Err(e);
            }
            match registered {
                Ok(()) => {}
                Err(e @ SchemaError::Incompatible { .. })
                    if self.config.incompatible_schema_changes == IncompatibleSchemaChanges::PauseTable =>
                {
                    // That table alone waits; its changes are held back
                    // until it is copied again (see `run_once`).
                    let e = Error::from(e).with_hint(
                        "set incompatible_schema_changes = \"register\" in the source runner's config (readers of \
                         the topic must then read the new type) or revert the column, and restart the runner: the \
                         table is copied again (see docs/schema-changes.md)",
                    );
                    warn!(table = %schema.id, error = %e, hint = e.hint().unwrap_or(""),
                        "table paused: its changes are held back, the other tables go on");
                    self.held.insert(
                        schema.id.clone(),
                        Held {
                            reason: e.to_string(),
                            copy: Copy::Paused,
                            reset: None,
                        },
                    );
                    self.held_changed = true;
                    continue;
                }
                Err(e) => {
                    self.abort().await;
                    return Err(Error::from(e).or_table(&schema.id));
                }
            }
            self.schemas.insert(schema.id.clone(), schema);
        }
        self.begin().await?;
        match self.produce_all(batch, &skip).await {
            Ok(bytes) => Ok(bytes),
            Err(e) => {
                // A record refused earlier puts the transaction in an
                // error state that fails later sends: name that record.
                let e = if e.kind() == ErrorKind::Retryable {
                    self.refused_or(e)
                } else {
                    e
                };
                self.abort().await;
                Err(e)
            }
        }
    }

    /// For each held table whose new copy is complete (per `progress`):
    /// a control record after the copy's rows says that every row older
    /// than the copy is gone, so that a row deleted while the table was
    /// held back does not stay in the destination. An empty copy (no row
    /// to take the position from) removes every row. Produced into the
    /// open transaction.
    async fn sweep_copied(&mut self, progress: &[tributary_connectors::SnapshotTableProgress]) -> Result<(), Error> {
        let mut done: Vec<(TableId, Position)> = Vec::new();
        for (table, held) in &self.held {
            if !progress.iter().any(|p| &p.table == table && p.done) {
                continue;
            }
            match held.copy {
                Copy::From { commit, index, swept: false } => done.push((table.clone(), Position { commit, index })),
                // The greatest position destinations can store (as signed
                // 64-bit integers): every row is older.
                Copy::Asked => {
                    let newest = i64::MAX.unsigned_abs();
                    done.push((table.clone(), Position { commit: newest, index: newest }))
                }
                _ => {}
            }
        }
        if done.is_empty() {
            return Ok(());
        }
        self.begin().await?;
        for (table, at) in done {
            let topic = self.naming.topic(self.config.prefix(), &table);
            let partitions = self.every_partition(&topic).await?;
            let position = format!("{}:{}", at.commit, at.index);
            for p in 0..partitions {
                let headers = OwnedHeaders::new()
                    .insert(Header {
                        key: CONTROL_HEADER,
                        value: Some(CONTROL_TABLE_COPIED),
                    })
                    .insert(Header {
                        key: CONTROL_POSITION_HEADER,
                        value: Some(position.as_str()),
                    });
                self.send(&topic, Some(p), None, None, Some(headers)).await?;
            }
            info!(table = %table, "copied again; rows deleted while it was held back are removed downstream");
            match self.held.get_mut(&table) {
                Some(Held { copy: Copy::From { swept, .. }, .. }) => *swept = true,
                // Nothing streamed of it is older than an empty copy.
                _ => {
                    self.held.remove(&table);
                }
            }
            self.held_changed = true;
        }
        Ok(())
    }

    /// Shows the paused tables in status and metrics.
    fn show_paused(&self, telemetry: &Telemetry) {
        for (table, held) in &self.held {
            if held.copy == Copy::Paused {
                let table = table.to_string();
                telemetry.record_error(&table, &held.reason, &ErrorKind::NeedsOperator.to_string());
                telemetry.set_state(&table, TableState::Paused(held.reason.clone()));
            }
        }
    }

    /// Begins a Kafka transaction unless one is open.
    async fn begin(&mut self) -> Result<(), Error> {
        if !self.open {
            let p = self.producer.clone();
            blocking(move || p.begin_transaction())
                .await?
                .map_err(|e| kafka_error("begin_transaction", e))?;
            self.open = true;
        }
        Ok(())
    }

    /// Writes `checkpoint` into the open transaction (beginning one for a
    /// checkpoint alone) and commits it.
    pub async fn commit(&mut self, checkpoint: &Checkpoint) -> Result<(), Error> {
        self.begin().await?;
        let topic = self.config.offsets_topic();
        let key = self.config.name.clone();
        if self.held_changed {
            let value = self.held_record();
            let paused_key = format!("{key}{HELD_KEY_SUFFIX}");
            if let Err(e) = self
                .send(&topic, Some(0), Some(paused_key.as_bytes()), Some(&value), None)
                .await
            {
                self.abort().await;
                return Err(e);
            }
        }
        if self.reset_all_done {
            let reset_key = format!("{key}{RESET_ALL_KEY_SUFFIX}");
            if let Err(e) = self.send(&topic, Some(0), Some(reset_key.as_bytes()), None, None).await {
                self.abort().await;
                return Err(e);
            }
        }
        for (k, v) in std::mem::take(&mut self.side_pending) {
            let side_key = format!("{key}{SIDE_KEY_INFIX}{k}");
            let sent = self
                .send(&topic, Some(0), Some(side_key.as_bytes()), v.as_deref().map(str::as_bytes), None)
                .await;
            if let Err(e) = sent {
                // This life ends: the next reads what is durable.
                let e = self.refused_or(e);
                self.abort().await;
                return Err(e);
            }
        }
        if let Err(e) = self
            .send(&topic, Some(0), Some(key.as_bytes()), Some(checkpoint.0.as_bytes()), None)
            .await
        {
            let e = self.refused_or(e);
            self.abort().await;
            return Err(e);
        }
        self.wait_delivered().await;
        let p = self.producer.clone();
        match blocking(move || p.commit_transaction(KAFKA_TXN_STEP_TIMEOUT)).await? {
            Ok(()) => {
                self.open = false;
                self.held_changed = false;
                if self.reset_all_done {
                    self.reset_all = None;
                    self.reset_all_done = false;
                }
                Ok(())
            }
            Err(e) => {
                self.abort().await;
                Err(self.refused_or(kafka_error("commit_transaction", e)))
            }
        }
    }

    /// Waits until librdkafka has delivered every queued record (or for
    /// [`KAFKA_TXN_STEP_TIMEOUT`]; `commit_transaction` then reports what is
    /// left).
    ///
    /// rust-rdkafka's `commit_transaction` and `flush` wait for deliveries
    /// by polling the producer's event queue, 100 ms at a time, while the
    /// `ThreadedProducer`'s own thread serves that queue: with anything in
    /// flight, each call slept about 100 ms after the last delivery
    /// (measured: 100-108 ms per commit, whatever its size). librdkafka's
    /// own `rd_kafka_flush`, with delivery reports as events (as
    /// rust-rdkafka sets them), serves no queue: it sends what lingers at
    /// once and waits for the in-flight count to reach zero, so the
    /// commit's own flush then finds nothing left and returns at once. That
    /// also lets `linger.ms` fill a snapshot's requests without delaying a
    /// streamed transaction's commit.
    async fn wait_delivered(&self) {
        let p = self.producer.clone();
        let timeout_ms = i32::try_from(KAFKA_TXN_STEP_TIMEOUT.as_millis()).unwrap_or(i32::MAX);
        // SAFETY: the pointer is that of the producer `p` keeps alive for
        // the call; rd_kafka_flush may be called from any thread.
        let flushed =
            blocking(move || unsafe { rdkafka::bindings::rd_kafka_flush(p.client().native_ptr(), timeout_ms) }).await;
        if let Err(e) = flushed {
            warn!(error = %e, "cannot wait for deliveries; the commit reports what is left");
        }
    }

    /// `err`, or, when Kafka refused a record as too large meanwhile, an
    /// error naming that record's size, its table and what to raise.
    fn refused_or(&self, err: Error) -> Error {
        match self.producer.context().take_refused() {
            Some((topic, bytes, code)) => {
                let e = too_large_error(&topic, bytes, code);
                match self.topic_tables.get(&topic) {
                    Some(table) => e.with_table(table.clone()),
                    None => e,
                }
            }
            None => err,
        }
    }

    async fn abort(&mut self) {
        if !std::mem::replace(&mut self.open, false) {
            return; // nothing begun (a schema refused before the first batch)
        }
        let p = self.producer.clone();
        match blocking(move || p.abort_transaction(KAFKA_TXN_STEP_TIMEOUT)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                warn!(error = %e, "abort_transaction failed; the broker aborts the transaction at its timeout")
            }
            Err(e) => warn!(error = %e, "abort_transaction did not run"),
        }
    }

    async fn produce_all(
        &mut self,
        batch: &SourceBatch,
        skip: &[bool],
    ) -> Result<HashMap<TableId, TableCounts>, Error> {
        // Keyed by reference while producing: no clone per event.
        let mut counts: HashMap<&TableId, TableCounts> = HashMap::new();
        // The run of consecutive events of one table (a snapshot chunk,
        // most transactions), by its schema's Arc: its topic is named once
        // and its counts are added up before they go into `counts`.
        let mut run: Option<(&Arc<TableSchema>, String, TableCounts)> = None;
        for (i, msg) in batch.messages.iter().enumerate() {
            match msg {
                // Nothing to produce: `add_batch` registered the schemas, a
                // failed table is held (see `hold`).
                SourceMessage::SchemaChanged(_) | SourceMessage::TableFailed(..) => {}
                SourceMessage::Change(event) if self.is_held(skip, i, &event.schema.id) => {}
                SourceMessage::Change(event) => {
                    if !run.as_ref().is_some_and(|(schema, _, _)| Arc::ptr_eq(schema, &event.schema)) {
                        if let Some((schema, _, c)) = run.take() {
                            counts.entry(&schema.id).or_default().add(c);
                        }
                        let topic = self.naming.topic(self.config.prefix(), &event.schema.id);
                        run = Some((&event.schema, topic, TableCounts::default()));
                    }
                    let Some((_, topic, run_counts)) = run.as_mut() else {
                        continue;
                    };
                    let topic = topic.as_str();
                    let encoded = self.encoder.encode(event, topic)?;
                    let table = &event.schema.id;
                    run_counts.events += 1;
                    run_counts.latest_ts = run_counts.latest_ts.max(event.source.ts_ms);
                    run_counts.oldest_ts = run_counts.oldest_ts.min(event.source.ts_ms);
                    run_counts.snapshot |= event.source.snapshot != SnapshotMarker::False;
                    run_counts.bytes += (encoded.key.as_ref().map_or(0, |k| k.len())
                        + encoded.value.as_ref().map_or(0, |v| v.len())) as u64;
                    if event.op == Op::Truncate {
                        // A truncate concerns every key, so every partition
                        // gets it, in order with that partition's rows.
                        let partitions = self.every_partition(topic).await.map_err(|e| e.or_table(table))?;
                        for p in 0..partitions {
                            self.send(topic, Some(p), encoded.key.as_deref(), encoded.value.as_deref(), None)
                                .await
                                .map_err(|e| e.or_table(table))?;
                        }
                    } else {
                        self.send(topic, None, encoded.key.as_deref(), encoded.value.as_deref(), None)
                            .await
                            .map_err(|e| e.or_table(table))?;
                        if let Some(tombstone) = self.encoder.tombstone(event, topic)? {
                            self.send(topic, None, tombstone.key.as_deref(), None, None)
                                .await
                                .map_err(|e| e.or_table(table))?;
                        }
                    }
                }
                SourceMessage::TableDropped(table) => {
                    let topic = self.naming.topic(self.config.prefix(), table);
                    let partitions = self.every_partition(&topic).await?;
                    for p in 0..partitions {
                        let headers = OwnedHeaders::new()
                            .insert(Header {
                                key: CONTROL_HEADER,
                                value: Some(CONTROL_TABLE_DROPPED),
                            })
                            .insert(Header {
                                key: CONTROL_SCHEMA_HEADER,
                                value: Some(table.schema.as_str()),
                            })
                            .insert(Header {
                                key: CONTROL_TABLE_NAME_HEADER,
                                value: Some(table.table.as_str()),
                            });
                        self.send(&topic, Some(p), None, None, Some(headers)).await?;
                    }
                    self.schemas.remove(table);
                }
            }
        }
        if let Some((schema, _, c)) = run {
            counts.entry(&schema.id).or_default().add(c);
        }
        Ok(counts.into_iter().map(|(id, c)| (id.clone(), c)).collect())
    }

    /// Enqueues one record; a full queue is backpressure: wait a moment
    /// for deliveries to free some of it, then try again (not `flush`,
    /// which waits for all of them, 100 ms at least: see
    /// [`KafkaSide::wait_delivered`]).
    async fn send(
        &self,
        topic: &str,
        partition: Option<i32>,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        headers: Option<OwnedHeaders>,
    ) -> Result<(), Error> {
        let mut record: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(topic);
        if let Some(p) = partition {
            record = record.partition(p);
        }
        if let Some(k) = key {
            record = record.key(k);
        }
        if let Some(v) = value {
            record = record.payload(v);
        }
        let bytes = key.map_or(0, <[u8]>::len) + value.map_or(0, <[u8]>::len);
        if let Some(h) = headers {
            record = record.headers(h);
        }
        loop {
            match self.producer.send(record) {
                Ok(()) => return Ok(()),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                    record = r;
                    tokio::time::sleep(DELIVERY_CHECK).await;
                }
                Err((KafkaError::MessageProduction(code), _)) if too_large(code) => {
                    return Err(too_large_error(topic, bytes, code))
                }
                Err((e, _)) => return Err(kafka_error("produce", e)),
            }
        }
    }
}

/// Runs a source until it fails for good or `shutdown` resolves.
///
/// Retryable and operator errors are retried per [`policy`], restarting the
/// source from the last durable checkpoint; nothing is ever skipped.
pub async fn run(
    config: SourceRunnerConfig,
    mut source: Box<dyn Source>,
    telemetry: Telemetry,
    control: Control,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), Error> {
    tokio::pin!(shutdown);
    let span = info_span!("source_runner", runner = %config.name);
    control.serve_resyncs();
    async move {
        let mut attempt = 0u32;
        loop {
            let started = std::time::Instant::now();
            let result = tokio::select! {
                r = run_once(&config, source.as_mut(), &telemetry, &control) => r,
                _ = &mut shutdown => { info!("shutting down"); return Ok(()); }
            };
            let err = match result {
                Ok(()) => return Ok(()),
                Err(e) => e,
            };
            // A run that lasted was a recovery: the next failure starts the
            // backoff over instead of waiting the maximum after a day of
            // occasional, unrelated outages.
            if started.elapsed() >= RUN_RESETS_BACKOFF {
                attempt = 0;
            }
            attempt += 1;
            control.set_ready(false);
            let table = err.table().map(|t| t.to_string());
            if let Some(t) = &table {
                telemetry.record_error(t, &err.to_string(), &err.kind().to_string());
            }
            let delay = match policy(err.kind(), attempt) {
                Decision::RetryAfter(d) => {
                    warn!(error = %err, attempt, delay_ms = d.as_millis() as u64, "retrying from the last checkpoint");
                    telemetry.set_paused(Some(format!("retrying: {err}")));
                    d
                }
                Decision::PauseAndProbe(d) => {
                    warn!(error = %err, hint = err.hint().unwrap_or(""), "paused until an operator fixes this; probing again");
                    telemetry.set_paused(Some(err.to_string()));
                    d
                }
                Decision::DeadLetter => {
                    tracing::error!(error = %err, "stopping: a source cannot skip a change");
                    if let Some(t) = &table {
                        telemetry.set_state(t, TableState::Failed(err.to_string()));
                    }
                    return Err(err);
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = &mut shutdown => { info!("shutting down"); return Ok(()); }
            }
        }
    }
    .instrument(span)
    .await
}

/// One life of the pipeline: connect, resume from the last checkpoint, then
/// loop until an error.
async fn run_once(
    config: &SourceRunnerConfig,
    source: &mut dyn Source,
    telemetry: &Telemetry,
    control: &Control,
) -> Result<(), Error> {
    let mut kafka = KafkaSide::connect(config).await?;
    let checkpoint = kafka.last_checkpoint().await?;
    info!(resuming = checkpoint.is_some(), "connected to Kafka");
    if kafka.reset_all.is_some() && !source.start_over() {
        return Err(Error::needs_operator(format!(
            "a reset of every table was asked, and the {} source cannot copy every table again",
            config.connector()
        ))
        .with_class("tributary.reset")
        .with_hint("name the tables instead: source-runner --config <source.toml> reset --table <schema.table> ..."));
    }
    source.restore_side_records(std::mem::take(&mut kafka.side_records));
    source.start(checkpoint).await?;
    if let Some(why) = source.domain_change() {
        kafka.reset_all_tables(&why, source.tables());
    }
    if !kafka.held.is_empty() {
        // Their changes were held back: each is copied again, and flows if
        // its schema can now be carried (else it is paused again). Asked
        // again after a crash before its copy's rows: the source's
        // checkpoint of the same transaction may not have the request.
        let paused: Vec<TableId> = kafka
            .held
            .iter()
            .filter(|(_, h)| matches!(h.copy, Copy::Paused | Copy::Asked))
            .map(|(t, _)| t.clone())
            .collect();
        let copying = source.resync(&paused).await?;
        for table in &copying {
            info!(table = %table, "copying a paused table again");
            if let Some(h) = kafka.held.get_mut(table) {
                h.copy = Copy::Asked;
                kafka.held_changed = true;
            }
        }
        // A reset the source cannot carry out (a table it does not
        // capture, or no snapshots): said once, and dropped.
        let refused: Vec<TableId> = kafka
            .held
            .iter()
            .filter(|(t, h)| h.reset.is_some() && h.copy == Copy::Paused && !copying.contains(t))
            .map(|(t, _)| t.clone())
            .collect();
        for table in refused {
            warn!(table = %table, "reset not carried out: the source does not capture this table, or cannot copy \
                tables again (snapshot_mode = \"never\")");
            kafka.held.remove(&table);
            kafka.held_changed = true;
        }
        kafka.show_paused(telemetry);
    }
    control.set_ready(true);
    telemetry.set_paused(None);
    let mut pause = control.subscribe();
    let mut next_retained = Instant::now();
    let mut batch_no: u64 = 0;
    // The open Kafka transaction's batches, not yet durable.
    let mut open: Option<OpenTxn> = None;
    // Events the open snapshot transaction may reach before it is
    // committed: one batch first, then four times the last one.
    let mut txn_limit = 0usize;
    // A third: the commit itself must reach the broker in time, on a
    // loaded machine too.
    let keep_alive_after = Duration::from_millis(u64::from(config.transaction_timeout_ms) / 3);
    loop {
        // A paused source stops reading: its slot keeps the position, and
        // nothing after the last commit is lost.
        if pause.borrow().all {
            if let Some(txn) = open.take() {
                txn.commit(&mut kafka, source, telemetry).await?;
            }
        }
        while pause.borrow_and_update().all {
            telemetry.set_paused(Some("paused by an operator".to_string()));
            if pause.changed().await.is_err() {
                return Ok(());
            }
        }
        telemetry.set_paused(None);
        while let Some(req) = control.next_resync() {
            // Between two committed batches: the state a start makes.
            if let Some(txn) = open.take() {
                txn.commit(&mut kafka, source, telemetry).await?;
            }
            let answer = kafka.resync_live(source, &req.table).await;
            kafka.show_paused(telemetry);
            match answer {
                Ok(a) => {
                    let _ = req.reply.send(a);
                }
                Err(e) => {
                    let _ = req.reply.send(Err(e.to_string()));
                    return Err(e);
                }
            }
        }
        if Instant::now() >= next_retained {
            next_retained = Instant::now() + RETAINED_EVERY;
            if let Some(bytes) = source.retained_bytes().await {
                telemetry.set_retained_bytes(bytes);
            }
        }
        let asked = Instant::now();
        let batch = {
            // A snapshot's transaction stays open while the source reads
            // its next chunk. A chunk slower than the transaction timeout
            // would make Kafka abort it, and the runner start over only to
            // fail the same way: it is committed at a third of the timeout
            // instead, while the read goes on (its checkpoint, the last
            // batch's, is a place to resume from).
            let mut keep_alive = open
                .as_ref()
                .filter(|t| !t.kafka_committed)
                .map(|t| t.started + keep_alive_after);
            let next = source.next_batch();
            tokio::pin!(next);
            loop {
                tokio::select! {
                    batch = &mut next => break batch?,
                    _ = sleep_until(keep_alive) => {
                        keep_alive = None;
                        if let Some(txn) = open.as_mut() {
                            info!(
                                open_ms = txn.started.elapsed().as_millis() as u64,
                                "the source is slow to give its next batch: committing what is open"
                            );
                            txn.commit_kafka(&mut kafka).await?;
                        }
                    }
                }
            }
        };
        if open.as_ref().is_some_and(|t| t.kafka_committed) {
            if let Some(txn) = open.take() {
                txn.commit(&mut kafka, source, telemetry).await?;
            }
        }
        kafka.stage_side_records(source.take_side_records());
        batch_no += 1;
        let events = batch.messages.len();
        let span = info_span!("batch", batch = batch_no, events);
        let producing = Instant::now();
        let counts = kafka.add_batch(&batch).instrument(span.clone()).await?;
        if !kafka.held.is_empty() {
            kafka.sweep_copied(&source.snapshot_progress()).await?;
        }
        // The broker times a transaction from its first produce, so its
        // age counts from before this batch's, however long that took.
        let txn = open.get_or_insert_with(|| OpenTxn::new(producing));
        for (id, c) in counts.iter().filter(|(_, c)| c.events > 0) {
            telemetry.record_pending(&id.to_string(), c.oldest_ts);
        }
        txn.add(&batch, counts);
        txn.waited_for_source += producing - asked;
        txn.producing += producing.elapsed();
        // Snapshot rows keep the transaction open while more of the
        // snapshot follows at once; anything else is committed now.
        let snapshot_rows = batch
            .messages
            .iter()
            .any(|m| matches!(m, SourceMessage::Change(e) if e.source.snapshot == SnapshotMarker::True));
        let snapshot_ends = batch
            .messages
            .iter()
            .any(|m| matches!(m, SourceMessage::Change(e) if e.source.snapshot == SnapshotMarker::Last))
            || source.snapshot_progress().iter().all(|p| p.done);
        txn.checkpoint = batch.checkpoint;
        if snapshot_rows && !snapshot_ends && txn.events < txn_limit && txn.started.elapsed() < TXN_MAX_AGE {
            continue;
        }
        if let Some(txn) = open.take() {
            txn_limit = if snapshot_rows {
                (txn.events * 4).min(TXN_MAX_EVENTS)
            } else {
                0
            };
            txn.commit(&mut kafka, source, telemetry).instrument(span).await?;
        }
        for p in source.snapshot_progress() {
            let table = p.table.to_string();
            telemetry.record_snapshot(&table, p.rows, p.estimated_rows);
            if !p.done {
                telemetry.set_state(&table, TableState::Snapshotting);
            }
        }
    }
}

/// What a transaction's events of one table add up to, for its metrics and
/// status once it is committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableCounts {
    /// Change events.
    pub events: u64,
    /// The latest source time among them (ms since the epoch).
    pub latest_ts: i64,
    /// The earliest source time among them (ms since the epoch): the lag
    /// counts from it until they are committed.
    pub oldest_ts: i64,
    /// Whether any was a snapshot row.
    pub snapshot: bool,
    /// Encoded key and value bytes.
    pub bytes: u64,
}

impl Default for TableCounts {
    fn default() -> Self {
        Self {
            events: 0,
            latest_ts: i64::MIN,
            oldest_ts: i64::MAX,
            snapshot: false,
            bytes: 0,
        }
    }
}

impl TableCounts {
    fn add(&mut self, other: TableCounts) {
        self.events += other.events;
        self.latest_ts = self.latest_ts.max(other.latest_ts);
        self.oldest_ts = self.oldest_ts.min(other.oldest_ts);
        self.snapshot |= other.snapshot;
        self.bytes += other.bytes;
    }
}

/// The batches in the open Kafka transaction: what to report once it is
/// committed.
struct OpenTxn {
    started: Instant,
    /// The last batch's checkpoint: it covers them all.
    checkpoint: Checkpoint,
    events: usize,
    per_table: HashMap<TableId, TableCounts>,
    /// Time spent waiting for the source's batches, and encoding and
    /// handing them to librdkafka (logged at debug with the commit's).
    waited_for_source: Duration,
    producing: Duration,
    /// Committed to Kafka already (kept alive while the source was slow);
    /// the source's acknowledgement and the status follow.
    kafka_committed: bool,
}

impl OpenTxn {
    fn new(started: Instant) -> Self {
        Self {
            kafka_committed: false,
            waited_for_source: Duration::ZERO,
            producing: Duration::ZERO,
            started,
            checkpoint: Checkpoint(String::new()),
            events: 0,
            per_table: HashMap::new(),
        }
    }

    fn add(&mut self, batch: &SourceBatch, counts: HashMap<TableId, TableCounts>) {
        self.events += batch.messages.len();
        for (id, c) in counts {
            self.per_table.entry(id).or_default().add(c);
        }
    }

    /// Commits the Kafka side with the last checkpoint (once).
    async fn commit_kafka(&mut self, kafka: &mut KafkaSide) -> Result<(), Error> {
        if !self.kafka_committed {
            kafka.commit(&self.checkpoint).await?;
            self.kafka_committed = true;
        }
        Ok(())
    }

    /// Commits the transaction with the last checkpoint, acknowledges it to
    /// the source, and feeds status and metrics.
    async fn commit(
        mut self,
        kafka: &mut KafkaSide,
        source: &mut dyn Source,
        telemetry: &Telemetry,
    ) -> Result<(), Error> {
        let committing = Instant::now();
        self.commit_kafka(kafka).await?;
        debug!(
            events = self.events,
            waited_for_source_ms = self.waited_for_source.as_millis() as u64,
            producing_ms = self.producing.as_millis() as u64,
            commit_ms = committing.elapsed().as_millis() as u64,
            "transaction committed"
        );
        source.acknowledge(&self.checkpoint).await?;
        telemetry.record_batch_seconds(self.started.elapsed().as_secs_f64());
        for (id, TableCounts { events, latest_ts: ts, snapshot, bytes: b, .. }) in self.per_table {
            let table = id.to_string();
            telemetry.record_events(&table, events, b, Some(ts));
            telemetry.record_applied(&table, Some(ts));
            telemetry.set_state(
                &table,
                if snapshot {
                    TableState::Snapshotting
                } else {
                    TableState::Streaming
                },
            );
        }
        kafka.show_paused(telemetry);
        Ok(())
    }
}

/// Deletes every topic of this copy and its schema subjects: its table
/// topics (by the shape of their names, see `tributary_schemas::topic`),
/// their dead-letter topics (default suffix) and its offsets topic; never a
/// topic of another copy whose prefix starts like this one's. Returns the
/// deleted topic names.
pub async fn delete_topics(config: &SourceRunnerConfig) -> Result<Vec<String>, Error> {
    let client = config.kafka.client_config().map_err(|e| Error::needs_operator(e.to_string()))?;
    let admin: AdminClient<DefaultClientContext> =
        client.create().map_err(|e| kafka_error("cannot create the admin client", e))?;
    let consumer: BaseConsumer = client.create().map_err(|e| kafka_error("metadata client", e))?;
    let prefix = config.prefix().to_string();
    let naming = TopicNaming::new(config.topic_template.clone());
    let offsets = config.offsets_topic();
    let ours = move |t: &str| {
        t == offsets
            || naming.is_table_topic(&prefix, t)
            || tributary_schemas::topic::is_dead_letter_topic(t, tributary_schemas::topic::DLQ_SUFFIX, |x| {
                naming.is_table_topic(&prefix, x)
            })
    };
    let topics: Vec<String> = blocking(move || {
        consumer
            .fetch_metadata(None, Duration::from_secs(10))
            .map(|m| m.topics().iter().map(|t| t.name().to_string()).collect::<Vec<_>>())
    })
    .await?
    .map_err(|e| kafka_error("list topics", e))?
    .into_iter()
    .filter(|t| ours(t))
    .collect();
    if topics.is_empty() {
        return Ok(topics);
    }
    let names: Vec<&str> = topics.iter().map(String::as_str).collect();
    for r in admin
        .delete_topics(&names, &AdminOptions::new())
        .await
        .map_err(|e| kafka_error("delete topics", e))?
    {
        match r {
            Ok(_) | Err((_, RDKafkaErrorCode::UnknownTopicOrPartition)) => {}
            Err((t, code)) => return Err(Error::retryable(format!("cannot delete topic {t}: {code}"))),
        }
    }
    let registry = config
        .schema_registry
        .registry(&config.schema_registry_url)
        .map_err(|e| Error::needs_operator(e.to_string()))?;
    for t in &topics {
        for suffix in ["key", "value"] {
            registry.delete_subject(&format!("{t}-{suffix}")).await?;
        }
    }
    Ok(topics)
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
    fn records_too_large_and_bad_client_settings_need_an_operator() {
        for code in [
            RDKafkaErrorCode::MessageSizeTooLarge,
            RDKafkaErrorCode::MessageBatchTooLarge,
        ] {
            let e = kafka_error("produce", KafkaError::MessageProduction(code));
            assert_eq!(e.kind(), ErrorKind::NeedsOperator, "{code:?}");
        }
        let e = too_large_error("p.s.t", 123_456, RDKafkaErrorCode::MessageSizeTooLarge);
        assert_eq!(e.kind(), ErrorKind::NeedsOperator);
        let text = e.to_string();
        for part in ["123456 bytes", "p.s.t", "message.max.bytes", "max.message.bytes"] {
            assert!(text.contains(part), "{part} missing: {text}");
        }
        let e = kafka_error("cannot create the producer", KafkaError::ClientCreation("bad".into()));
        assert_eq!(e.kind(), ErrorKind::NeedsOperator);
        let e = kafka_error(
            "cannot create the producer",
            KafkaError::ClientConfig(
                rdkafka::types::RDKafkaConfRes::RD_KAFKA_CONF_INVALID,
                "Invalid value \"hunter2\" for sasl.password".into(),
                "sasl.password".into(),
                "hunter2".into(),
            ),
        );
        assert_eq!(e.kind(), ErrorKind::NeedsOperator);
        assert!(!e.to_string().contains("hunter2"), "{e}");
        // Outages stay retryable.
        let e = kafka_error("produce", KafkaError::MessageProduction(RDKafkaErrorCode::BrokerTransportFailure));
        assert_eq!(e.kind(), ErrorKind::Retryable);
    }
}

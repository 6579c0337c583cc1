//! The run loop: Kafka (read_committed, topic pattern) -> decode -> batch per
//! table -> [`Sink::apply`] (rows and offsets in one durable step); records
//! that can never be applied go to `<topic>.dlq`; anything that may clear
//! pauses the table and retries the same batch.
//!
//! # Pipelining
//!
//! A batch is applied in its own task while the loop goes on consuming and
//! decoding: at most one batch is being applied, one more waits decoded,
//! and one more buffers (up to `batch_max_bytes`; then consuming waits).
//! One apply at a time keeps each table's batches in Kafka order; when an
//! apply fails, its records go back in front of what arrived since and the
//! table pauses as before, so nothing moves past unapplied data. The
//! benchmark's 1M-row snapshot: the sink had been busy 80-90% of each
//! second decoding and applying, and fell ~5 s behind the source; with the
//! overlap it keeps up with it.
//!
//! # Offsets and consumer groups
//!
//! The destination holds the authoritative offsets (written in the same
//! transaction as the rows). Kafka's group protocol only decides which
//! runner owns which partition; the rebalance callback ([`RebalanceCtx`])
//! looks the owned partitions' offsets up in the destination and assigns
//! them *at* those offsets, so no record is consumed from anywhere else.
//! The lookup blocks the callback (on the runtime, via `block_in_place`),
//! which is fine: it waits for the batch being applied (the sink is one
//! session), nothing else can be applied meanwhile anyway, and Kafka's
//! session heartbeats continue on librdkafka's own thread.
//!
//! The protocol is whatever `partition.assignment.strategy` says: with the
//! default eager strategies every rebalance revokes everything first, so a
//! partition is never owned by two runners at once (the revoke callback
//! waits for the batch being applied to commit or fail, so the next owner
//! reads offsets that include it). With
//! `cooperative-sticky` only moved partitions are revoked and assigned
//! (incrementally), with the same lookup. Records of a revoked partition
//! still buffered are dropped; its new owner consumes them again from the
//! destination's offsets. The offsets committed to Kafka are a mirror for
//! monitoring tools (`kafka-consumer-groups --describe` shows the lag);
//! they are never read.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::FutureExt;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, RebalanceProtocol, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use tokio::sync::{oneshot, watch, Mutex};
use tracing::{debug, error, info, info_span, warn, Instrument};
use tributary_connectors::sink::bookkeeping::FENCED_CLASS;
use tributary_connectors::{
    policy, ApplyError, Decision, Error, ErrorKind, KafkaPosition, Sink, SinkBatch, SinkRecord,
};
use tributary_schemas::hashing::FxHashMap;
use tributary_schemas::{Decoded, EventDecoder, TableId};

use crate::config::{
    SinkRunnerConfig, DEFAULT_FETCH_QUEUE_BACKOFF_MS, DEFAULT_QUEUED_MAX_KBYTES, DEFAULT_STATISTICS_INTERVAL_MS,
    DEFAULT_TOPIC_REFRESH_MS,
};
use crate::dlq::{DeadLetters, DlqReader, Failure, RawRecord, Stage};
use tributary_operations::admin::Control;
use tributary_operations::process::sleep_until;
use tributary_operations::telemetry::{ConsumerGroupStatus, TableState, Telemetry};

/// How often topics are looked for while no partition is assigned yet. The
/// pattern subscription only sees a new topic at librdkafka's periodic
/// metadata refresh (`topic.metadata.refresh.interval.ms`, 5 s by default
/// here): at start-up, before the source created its topics, that wait was
/// most of the benchmark's ~5 s to the first row. A metadata request of all
/// topics makes librdkafka match the pattern again at once.
const STARTUP_METADATA_PROBE: Duration = Duration::from_millis(200);
/// How long after start the probe above runs at most: a runner left without
/// partitions (more runners than partitions) must not ask for the metadata
/// of every topic five times a second for ever.
const STARTUP_METADATA_PROBE_FOR: Duration = Duration::from_secs(60);
/// How often the loop looks at the consumer group's state.
const GROUP_CHECK: Duration = Duration::from_secs(5);

/// Records taken from librdkafka's queue in one go once one arrived. Bounds
/// how far a batch can overshoot `batch_max_records` before it is flushed.
const DRAIN_MAX_RECORDS: usize = 1000;

pub use tributary_schemas::topic::{
    CONTROL_HEADER, CONTROL_POSITION_HEADER, CONTROL_RESET_HEADER, CONTROL_SCHEMA_HEADER, CONTROL_TABLE_COPIED,
    CONTROL_TABLE_DROPPED, CONTROL_TABLE_NAME_HEADER, CONTROL_TABLE_RESET,
};

/// Why the runner stopped.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The configuration cannot work.
    #[error(transparent)]
    Config(#[from] tributary_operations::config::ConfigError),
    /// Kafka refused something the runner cannot do without.
    #[error("kafka: {0}")]
    Kafka(String),
    /// Anything else, with context.
    #[error("{0}")]
    Other(String),
}

pub use tributary_connectors::Labeler;

/// Runs a sink runner for the configured destination until `stop` turns true.
pub async fn run(
    config: SinkRunnerConfig,
    telemetry: Telemetry,
    control: Control,
    stop: watch::Receiver<bool>,
) -> Result<(), RunError> {
    let sink = config.sink()?;
    let labeler = sink.labeler();
    run_with_sink(config, sink, labeler, telemetry, control, stop).await
}

/// Runs the loop over any [`Sink`] (tests use fakes).
pub async fn run_with_sink<S: Sink + 'static>(
    config: SinkRunnerConfig,
    sink: S,
    labeler: Labeler,
    telemetry: Telemetry,
    control: Control,
    stop: watch::Receiver<bool>,
) -> Result<(), RunError> {
    let handle = tokio::runtime::Handle::current();
    if handle.runtime_flavor() != tokio::runtime::RuntimeFlavor::MultiThread {
        return Err(RunError::Other(
            "the sink runner needs a multi-threaded tokio runtime (its rebalance callback blocks on the destination)"
                .into(),
        ));
    }
    let span = info_span!("sink_runner", group = %config.consumer_group);
    async move {
        let sink = Arc::new(Mutex::new(sink));
        let events = Arc::new(std::sync::Mutex::new(Vec::new()));
        let excluded_config = config.clone();
        let group = Arc::new(std::sync::Mutex::new(GroupHealth::default()));
        let ctx = RebalanceCtx {
            sink: sink.clone(),
            handle,
            events: events.clone(),
            excluded: Arc::new(move |t: &str| excluded_config.is_excluded(t)),
            stop: stop.clone(),
            telemetry: telemetry.clone(),
            control: control.clone(),
            group: group.clone(),
            retrying: std::sync::atomic::AtomicBool::new(false),
            topic_label: {
                let (labeler, prefix) = (labeler.clone(), config.prefix.clone());
                Arc::new(move |topic: &str| labeler(&table_from_topic(topic, prefix.as_deref())))
            },
        };
        let consumer: StreamConsumer<RebalanceCtx<S>> = consumer_config(&config)?
            .create_with_context(ctx)
            .map_err(|e| RunError::Kafka(format!("cannot create the consumer: {e}")))?;
        let pattern = config.topic_pattern();
        consumer
            .subscribe(&[pattern.as_str()])
            .map_err(|e| RunError::Kafka(format!("cannot subscribe to {pattern}: {e}")))?;
        info!(pattern = %pattern, "subscribed");
        let dead_letters = DeadLetters::new(&config.kafka.client_config()?, &config.consumer_group);
        let registry = config.schema_registry.registry(&config.schema_registry_url)?;
        let idle = config.idle();
        let batch_max_bytes = config.batch_max_bytes();
        let mut state = Loop {
            config,
            sink,
            labeler,
            telemetry,
            pause_rx: control.subscribe(),
            control,
            operator_paused: BTreeSet::new(),
            runner_paused: false,
            decoder: EventDecoder::new(registry),
            dead_letters,
            dead_lettered: BTreeSet::new(),
            dlq_unscanned: BTreeSet::new(),
            dlq_reader: None,
            consumer,
            events,
            buffers: BTreeMap::new(),
            assigned: BTreeSet::new(),
            expected: FxHashMap::default(),
            stored: FxHashMap::default(),
            rereading: BTreeSet::new(),
            tables: HashMap::new(),
            in_flight: None,
            ready: None,
            last_received: None,
            idle,
            batch_max_bytes,
            stopped: BTreeMap::new(),
            stopped_probe: None,
            group,
            next_group_check: Instant::now() + GROUP_CHECK,
        };
        state.run(stop).await
    }
    .instrument(span)
    .await
}

/// The librdkafka consumer settings of a runner.
pub fn consumer_config(config: &SinkRunnerConfig) -> Result<ClientConfig, RunError> {
    let mut c = config.kafka.client_config()?;
    // Correctness: never overridable.
    c.set("group.id", &config.consumer_group);
    c.set("enable.auto.commit", "false");
    c.set("enable.auto.offset.store", "false");
    c.set("isolation.level", "read_committed");
    // A stored offset the topic no longer holds (retention ran out, the
    // topic was deleted and re-created) must stop its partition with an
    // error, never jump silently to either end: a partition without a stored
    // offset is assigned at `Offset::Beginning` explicitly (see the
    // rebalance callback), so no reset is ever wanted.
    c.set("auto.offset.reset", "error");
    // Tuning: only when the operator did not set it in kafka.properties.
    let defaults = [
        ("topic.metadata.refresh.interval.ms", DEFAULT_TOPIC_REFRESH_MS.to_string()),
        ("queued.max.messages.kbytes", DEFAULT_QUEUED_MAX_KBYTES.to_string()),
        ("fetch.queue.backoff.ms", DEFAULT_FETCH_QUEUE_BACKOFF_MS.to_string()),
        ("client.id", format!("tributary-sink-{}", config.consumer_group)),
        ("statistics.interval.ms", DEFAULT_STATISTICS_INTERVAL_MS.to_string()),
    ];
    for (k, v) in defaults {
        if c.get(k).is_none() {
            c.set(k, v);
        }
    }
    Ok(c)
}

enum RebalanceEvent {
    Assigned(Vec<(String, i32, Option<i64>)>),
    Revoked(Vec<(String, i32)>),
    /// Assigned partitions whose stored offset the topic no longer holds:
    /// assigned paused, they wait for an operator.
    OutOfRange(Vec<OutOfRange>),
}

/// A partition whose stored offset is outside the topic's current range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutOfRange {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// The next offset the destination stored for it.
    pub stored: i64,
    /// The topic's earliest offset still held (low watermark).
    pub low: i64,
    /// The offset after its last record (high watermark).
    pub high: i64,
}

impl OutOfRange {
    /// `Some` when `stored` is outside `[low, high]`.
    pub fn check(topic: &str, partition: i32, stored: i64, (low, high): (i64, i64)) -> Option<Self> {
        (stored < low || stored > high).then(|| Self {
            topic: topic.to_string(),
            partition,
            stored,
            low,
            high,
        })
    }

    /// The needs-operator error that stops the partition, with the
    /// operator's two choices.
    pub fn error(&self, consumer_group: &str, table: &TableId) -> Error {
        let Self { topic, partition, stored, low, high } = self;
        let why = if stored < low {
            format!(
                "records {stored}..{} were removed from the topic before this sink applied them (its retention ran \
                 out, or records were deleted)",
                low - 1
            )
        } else {
            "the topic holds fewer records than the stored offset says were applied (it was deleted and re-created?)"
                .to_string()
        };
        let key = format!(
            "consumer_group = '{}' AND topic = '{}' AND partition = {partition}",
            consumer_group.replace('\'', "''"),
            topic.replace('\'', "''")
        );
        Error::needs_operator(format!(
            "topic {topic} partition {partition}: the stored offset {stored} is out of the topic's current range \
             {low}..{high} (earliest held, next to be written): {why}; the partition is stopped, neither skipping \
             nor re-reading anything"
        ))
        .with_table(table.clone())
        .with_class("tributary.kafka.offset_out_of_range")
        .with_hint(format!(
            "either (1) accept that the changes in between are lost to this copy and go on from the earliest record \
             the topic holds: in the destination run UPDATE tributary.offsets SET next_offset = {low} WHERE {key}; \
             or (2) copy the table again: stop the sink runner, drop the destination table, run DELETE FROM \
             tributary.offsets WHERE {key}; have the source copy the table again into the topic if the topic does \
             not start with a full copy of it (a source snapshot), and start the sink runner; the partition is \
             then read from its beginning. The runner checks the stored offset every few seconds and resumes by \
             itself once it is in range (see docs/operations.md)"
        ))
    }
}

/// The consumer context: assigns partitions at the destination's offsets.
pub struct RebalanceCtx<S: Sink + 'static> {
    sink: Arc<Mutex<S>>,
    handle: tokio::runtime::Handle,
    events: Arc<std::sync::Mutex<Vec<RebalanceEvent>>>,
    excluded: Arc<dyn Fn(&str) -> bool + Send + Sync>,
    stop: watch::Receiver<bool>,
    /// While the lookup waits for the destination, the status says so.
    telemetry: Telemetry,
    control: Control,
    group: Arc<std::sync::Mutex<GroupHealth>>,
    /// While the destination's offsets lookup is retried: not ready.
    retrying: std::sync::atomic::AtomicBool,
    /// The status label of a topic's table (for the consumer lag).
    topic_label: Arc<dyn Fn(&str) -> String + Send + Sync>,
}

/// The consumer's group membership, from librdkafka's statistics.
#[derive(Debug, Default)]
struct GroupHealth {
    state: String,
    join_state: String,
    assignment_size: i32,
    /// When the membership stopped being settled (`None` while it is, and
    /// before the first report).
    unsettled_since: Option<Instant>,
    /// When it started waiting on the group rather than on this runner
    /// (`None` while settled, or while librdkafka waits for the loop to
    /// serve an assignment: leaving the group would not help then).
    stuck_since: Option<Instant>,
}

impl GroupHealth {
    fn update(&mut self, state: String, join_state: String, assignment_size: i32, now: Instant) {
        if ConsumerGroupStatus::settled(&state, &join_state) {
            self.unsettled_since = None;
            self.stuck_since = None;
        } else {
            self.unsettled_since.get_or_insert(now);
            // librdkafka's join states that wait for the application (an
            // assignment or unassignment to serve or complete): the loop is
            // busy (a long apply), not the group stuck.
            let ours = matches!(
                join_state.as_str(),
                "wait-assign-call"
                    | "wait-unassign-call"
                    | "wait-unassign-to-complete"
                    | "wait-incr-unassign-to-complete"
            );
            if ours {
                self.stuck_since = None;
            } else {
                self.stuck_since.get_or_insert(now);
            }
        }
        self.state = state;
        self.join_state = join_state;
        self.assignment_size = assignment_size;
    }

    fn status(&self, now: Instant) -> ConsumerGroupStatus {
        ConsumerGroupStatus {
            state: self.state.clone(),
            join_state: self.join_state.clone(),
            assigned_partitions: self.assignment_size,
            unsettled_seconds: self.unsettled_since.map(|t| now.saturating_duration_since(t).as_secs()),
        }
    }
}

impl<S: Sink + 'static> ClientContext for RebalanceCtx<S> {
    /// A failed login pauses the runner in its status, with the reason,
    /// until the group is joined: librdkafka retries it by itself.
    fn error(&self, error: KafkaError, reason: &str) {
        use tributary_operations::kafka::{is_authentication_failure, AUTHENTICATION_FAILED, AUTHENTICATION_HINT};
        if is_authentication_failure(&error) {
            self.telemetry
                .set_paused(Some(format!("{AUTHENTICATION_FAILED}: {reason} (to fix: {AUTHENTICATION_HINT})")));
        }
        warn!(error = %error, reason, "librdkafka reports an error");
    }

    /// Reads the consumer group's part of the statistics and each
    /// partition's consumer lag (the per-broker rest is not kept).
    fn stats_raw(&self, statistics: &[u8]) {
        #[derive(serde::Deserialize)]
        struct Stats {
            cgrp: Option<Cgrp>,
            #[serde(default)]
            topics: HashMap<String, StatsTopic>,
        }
        #[derive(serde::Deserialize)]
        struct StatsTopic {
            #[serde(default)]
            partitions: HashMap<String, StatsPartition>,
        }
        #[derive(serde::Deserialize)]
        struct StatsPartition {
            /// Records after the committed offset (committed after each
            /// applied batch); -1 when unknown.
            consumer_lag: i64,
        }
        #[derive(serde::Deserialize)]
        struct Cgrp {
            state: String,
            join_state: String,
            assignment_size: i32,
        }
        let stats = match serde_json::from_slice::<Stats>(statistics) {
            Ok(s) => s,
            Err(e) => {
                debug!(error = %e, "cannot read librdkafka's statistics");
                return;
            }
        };
        for (topic, t) in &stats.topics {
            if (self.excluded)(topic) {
                continue;
            }
            // Partition -1 is librdkafka's own; unknown lags are left out.
            let known: Vec<i64> = t
                .partitions
                .iter()
                .filter(|(p, l)| p.as_str() != "-1" && l.consumer_lag >= 0)
                .map(|(_, l)| l.consumer_lag)
                .collect();
            if !known.is_empty() {
                self.telemetry
                    .set_consumer_lag(&(self.topic_label)(topic), known.iter().sum::<i64>() as u64);
            }
        }
        if let (Some(c), Ok(mut g)) = (stats.cgrp, self.group.lock()) {
            let now = Instant::now();
            g.update(c.state, c.join_state, c.assignment_size, now);
            let status = g.status(now);
            // Ready: a settled member whose destination answered.
            let settled = ConsumerGroupStatus::settled(&status.state, &status.join_state);
            self.control
                .set_ready(settled && !self.retrying.load(std::sync::atomic::Ordering::Relaxed));
            let failed_login = self
                .telemetry
                .paused_reason()
                .is_some_and(|r| r.starts_with(tributary_operations::kafka::AUTHENTICATION_FAILED));
            if settled && failed_login {
                // Logged in since: back to what the operator asked for.
                let all = self.control.paused().all;
                self.telemetry.set_paused(all.then(|| "paused by an operator".to_string()));
            }
            self.telemetry.set_consumer_group(status);
        }
    }
}

impl<S: Sink + 'static> RebalanceCtx<S> {
    /// The destination's offsets of `parts`, retrying per [`policy`] until
    /// they come or the runner stops (`None`).
    fn lookup(&self, parts: &[(String, i32)]) -> Option<Vec<Option<i64>>> {
        if parts.is_empty() {
            return Some(Vec::new());
        }
        let mut attempt = 0u32;
        loop {
            let result = tokio::task::block_in_place(|| {
                self.handle
                    .block_on(async { self.sink.lock().await.committed_offsets(parts).await })
            });
            match result {
                Ok(offsets) => {
                    self.retrying.store(false, std::sync::atomic::Ordering::Relaxed);
                    if attempt > 0 {
                        // Back to what the operator asked for.
                        let all = self.control.paused().all;
                        self.telemetry.set_paused(all.then(|| "paused by an operator".to_string()));
                    }
                    return Some(offsets);
                }
                Err(e) => {
                    attempt += 1;
                    self.retrying.store(true, std::sync::atomic::Ordering::Relaxed);
                    self.control.set_ready(false);
                    // The consumer loop is blocked in this callback: no table
                    // moves until the destination answers.
                    self.telemetry
                        .set_paused(Some(format!("cannot read the stored offsets of newly assigned partitions: {e}")));
                    let delay = match policy(e.kind(), attempt) {
                        Decision::RetryAfter(d) | Decision::PauseAndProbe(d) => d,
                        Decision::DeadLetter => tributary_connectors::error::OPERATOR_PROBE_DELAY,
                    };
                    warn!(
                        error = %e,
                        hint = e.hint().unwrap_or(""),
                        retry_in_ms = delay.as_millis() as u64,
                        "paused: cannot read the stored offsets of newly assigned partitions"
                    );
                    let deadline = Instant::now() + delay;
                    while Instant::now() < deadline {
                        if *self.stop.borrow() {
                            return None;
                        }
                        tokio::task::block_in_place(|| std::thread::sleep(Duration::from_millis(100)));
                    }
                }
            }
        }
    }

    /// Waits until no batch is being applied (the apply task holds the
    /// sink), so that a partition goes to its next owner only after the
    /// write that covers it committed or failed: the next owner then reads
    /// offsets that include it, and never applies beside it.
    fn wait_for_apply(&self) {
        tokio::task::block_in_place(|| {
            self.handle.block_on(async {
                drop(self.sink.lock().await);
            })
        });
    }

    fn push(&self, event: RebalanceEvent) {
        if let Ok(mut e) = self.events.lock() {
            e.push(event);
        }
    }
}

impl<S: Sink + 'static> ConsumerContext for RebalanceCtx<S> {
    fn rebalance(&self, base: &BaseConsumer<Self>, err: RDKafkaRespErr, tpl: &mut TopicPartitionList) {
        let cooperative = matches!(base.rebalance_protocol(), RebalanceProtocol::Cooperative);
        let parts: Vec<(String, i32)> = tpl.elements().iter().map(|e| (e.topic().to_string(), e.partition())).collect();
        match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                let (skip, wanted): (Vec<_>, Vec<_>) = parts.iter().cloned().partition(|(t, _)| (self.excluded)(t));
                let offsets = self.lookup(&wanted);
                let mut assigned = Vec::new();
                let mut out_of_range = Vec::new();
                if let Some(offsets) = &offsets {
                    for ((topic, partition), offset) in wanted.iter().zip(offsets) {
                        // No stored offset: a new topic (or partition), read
                        // from its beginning. A stored one: exactly there,
                        // if the topic still holds it.
                        let at = offset.map_or(Offset::Beginning, Offset::Offset);
                        if let Err(e) = tpl.set_partition_offset(topic, *partition, at) {
                            error!(topic = %topic, partition, error = %e, "cannot set the start offset");
                        }
                        if let Some(stored) = offset {
                            // If this lookup fails, a fetch out of range is
                            // still reported (auto.offset.reset=error) and
                            // the loop checks again.
                            match base.fetch_watermarks(topic, *partition, Duration::from_secs(10)) {
                                Ok(range) => {
                                    if let Some(o) = OutOfRange::check(topic, *partition, *stored, range) {
                                        // Assigned paused at a valid offset (so
                                        // librdkafka keeps it fetchable for a
                                        // seek later); the loop drops anything
                                        // fetched before the pause.
                                        let _ = tpl.set_partition_offset(topic, *partition, Offset::End);
                                        out_of_range.push(o);
                                    }
                                }
                                Err(e) => warn!(topic = %topic, partition, error = %e, "cannot read the topic's range"),
                            }
                        }
                        assigned.push((topic.clone(), *partition, *offset));
                    }
                }
                // Partitions not copied never fetch, but need a valid start offset: without
                // one librdkafka would report "no offset to reset to"
                // (auto.offset.reset=error).
                for (t, p) in &skip {
                    let _ = tpl.set_partition_offset(t, *p, Offset::End);
                }
                if offsets.is_none() {
                    for (t, p) in &wanted {
                        let _ = tpl.set_partition_offset(t, *p, Offset::End);
                    }
                }
                let r = if cooperative {
                    base.incremental_assign(tpl)
                } else {
                    base.assign(tpl)
                };
                if let Err(e) = r {
                    error!(error = %e, "cannot assign partitions");
                }
                // Partitions we do not copy (dead-letter and offsets topics
                // the pattern also matched; everything when stopping) stay
                // assigned but never fetch.
                let mut idle = TopicPartitionList::new();
                for (t, p) in skip.iter().chain(if offsets.is_none() { wanted.iter() } else { [].iter() }) {
                    idle.add_partition(t, *p);
                }
                for o in &out_of_range {
                    idle.add_partition(&o.topic, o.partition);
                }
                if idle.count() > 0 {
                    if let Err(e) = base.pause(&idle) {
                        warn!(error = %e, "cannot pause excluded partitions");
                    }
                }
                // librdkafka keeps a partition's pause flag across a revoke
                // and a new assignment: a partition paused for a retry before
                // the rebalance would never fetch again (found by the fault
                // suite). The loop pauses again what still waits for a retry
                // or an operator.
                if offsets.is_some() && !wanted.is_empty() {
                    let mut run = TopicPartitionList::new();
                    for (t, p) in &wanted {
                        if !out_of_range.iter().any(|o| o.topic == *t && o.partition == *p) {
                            run.add_partition(t, *p);
                        }
                    }
                    if let Err(e) = base.resume(&run) {
                        warn!(error = %e, "cannot resume newly assigned partitions");
                    }
                }
                info!(partitions = assigned.len(), excluded = skip.len(), "partitions assigned");
                self.push(RebalanceEvent::Assigned(assigned));
                if !out_of_range.is_empty() {
                    self.push(RebalanceEvent::OutOfRange(out_of_range));
                }
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                self.wait_for_apply();
                info!(partitions = parts.len(), "partitions revoked");
                self.push(RebalanceEvent::Revoked(parts));
                let r = if cooperative {
                    base.incremental_unassign(tpl)
                } else {
                    base.unassign()
                };
                if let Err(e) = r {
                    error!(error = %e, "cannot unassign partitions");
                }
            }
            other => {
                self.wait_for_apply();
                error!(error = ?other, "rebalance failed");
                self.push(RebalanceEvent::Revoked(parts));
                if !cooperative {
                    let _ = base.unassign();
                }
            }
        }
    }
}

/// A pending batch of one topic.
struct Buffer {
    records: Vec<RawRecord>,
    bytes: usize,
    first_at: Option<Instant>,
    /// Next offset per partition covered by everything received (applied,
    /// buffered or dead-lettered) and not yet stored.
    next_offsets: BTreeMap<i32, i64>,
    retry: Option<Retry>,
}

struct Retry {
    attempt: u32,
    at: Instant,
}

impl Buffer {
    fn new() -> Self {
        Self {
            records: Vec::new(),
            bytes: 0,
            first_at: None,
            next_offsets: BTreeMap::new(),
            retry: None,
        }
    }
}

struct Loop<S: Sink + 'static> {
    config: SinkRunnerConfig,
    sink: Arc<Mutex<S>>,
    labeler: Labeler,
    telemetry: Telemetry,
    /// Operator pause/resume from the admin server.
    control: Control,
    /// Wakes the loop when the pause set changes.
    pause_rx: watch::Receiver<tributary_operations::admin::PauseSet>,
    /// Topics whose partitions are paused because an operator paused their
    /// table (or the whole runner).
    operator_paused: BTreeSet<String>,
    /// Whether the status says the whole runner is paused.
    runner_paused: bool,
    decoder: EventDecoder,
    dead_letters: DeadLetters,
    /// Records dead-lettered whose offsets are not stored yet (topic,
    /// partition, offset): consumed again, such a record is not sent or
    /// counted again. This process's own, and those a predecessor sent
    /// before it crashed or lost the partition (read from the dead-letter
    /// topic before the partition's first dead letter, see
    /// `dlq_unscanned`).
    dead_lettered: BTreeSet<(String, i32, i64)>,
    /// Partitions assigned whose dead-letter topic has not been read for
    /// what a predecessor sent: read once, before the partition's first
    /// dead letter (a rare path, so never at assignment).
    dlq_unscanned: BTreeSet<(String, i32)>,
    /// Reads dead-letter topics for `dlq_unscanned`, once needed.
    dlq_reader: Option<DlqReader>,
    consumer: StreamConsumer<RebalanceCtx<S>>,
    events: Arc<std::sync::Mutex<Vec<RebalanceEvent>>>,
    buffers: BTreeMap<String, Buffer>,
    assigned: BTreeSet<(String, i32)>,
    /// Next offset expected per partition: anything below is a stale
    /// prefetched record from before an assignment.
    expected: FxHashMap<(String, i32), i64>,
    /// The offset each assigned partition has stored in the destination, as
    /// this runner last read or wrote it (`None`: none): what a batch's
    /// commit must find there (the fence, see `SinkBatch::expected_offsets`).
    stored: FxHashMap<(String, i32), Option<i64>>,
    /// Fenced partitions whose stored offsets could not be read yet: held
    /// paused and looked at again with the stopped ones.
    rereading: BTreeSet<(String, i32)>,
    /// Source table of each topic, once seen.
    tables: HashMap<String, TableId>,
    /// The batch being applied, while the loop consumes and decodes.
    in_flight: Option<InFlight>,
    /// The next batch, decoded while `in_flight` is applied. Only ever set
    /// while `in_flight` is: it bounds how far the loop reads ahead.
    ready: Option<Prepared>,
    /// When the consumer last gave a record (see [`Loop::idle_at`]).
    last_received: Option<Instant>,
    /// `batch_idle_ms`, resolved.
    idle: Option<Duration>,
    /// `batch_max_bytes`, resolved (its default depends on the destination).
    batch_max_bytes: usize,
    /// Partitions stopped because their stored offset is out of the topic's
    /// range, until an operator fixes the stored offset.
    stopped: BTreeMap<(String, i32), OutOfRange>,
    /// When the stored offsets of `stopped` are looked at again.
    stopped_probe: Option<Instant>,
    /// The consumer's group membership, as the statistics report it.
    group: Arc<std::sync::Mutex<GroupHealth>>,
    /// When [`Loop::check_group`] runs next.
    next_group_check: Instant,
}

/// A batch taken out of its topic's buffer and decoded: what the loop
/// keeps of it while it waits ([`Prepared`]) and while it is applied
/// ([`InFlight`]).
struct Taken {
    topic: String,
    table: TableId,
    /// The raw records (for the dead-letter topic, and to retry).
    buf: Buffer,
    /// Index into `buf.records` of each of the batch's records.
    raw_index: Vec<usize>,
    started: Instant,
    decoded: Duration,
    /// The oldest source time among its changes: the table's lag counts
    /// from it until the batch is applied.
    oldest: Option<i64>,
}

/// A batch decoded and waiting for the one being applied to end.
struct Prepared {
    taken: Taken,
    batch: SinkBatch,
}

/// What an apply task hands back. A batch that was applied comes back
/// without its records: the task frees them after handing this back, while
/// the next batch is applied. Freed on the loop's thread, a snapshot
/// batch's rows took 5-8 ms with the destination idle until the next batch
/// started; freed in the task before it ended, they still delayed the next
/// batch (the destination sat 11 ms idle between one batch's `COMMIT` and
/// the next one's first statement).
struct Applied {
    batch: SinkBatch,
    result: Result<(), ApplyError>,
    /// Events in the batch, and the newest source time among them.
    events: usize,
    newest: Option<i64>,
}

impl Applied {
    /// The outcome of `batch`, and its records when they are no longer
    /// needed (applied) for the caller to free.
    fn new(mut batch: SinkBatch, result: Result<(), ApplyError>) -> (Self, Vec<(KafkaPosition, SinkRecord)>) {
        let events = batch.records.len();
        let newest = newest_source_ts(&batch.records);
        let done = if result.is_ok() {
            std::mem::take(&mut batch.records)
        } else {
            Vec::new()
        };
        (Self { batch, result, events, newest }, done)
    }
}

fn source_ts(records: &[(KafkaPosition, SinkRecord)]) -> impl Iterator<Item = i64> + '_ {
    records.iter().filter_map(|(_, r)| match r {
        SinkRecord::Change(ev) => Some(ev.source.ts_ms),
        SinkRecord::TableDropped(_) | SinkRecord::Copied(..) | SinkRecord::Reset(..) => None,
    })
}

fn newest_source_ts(records: &[(KafkaPosition, SinkRecord)]) -> Option<i64> {
    source_ts(records).max()
}

/// The batch being applied in its own task.
struct InFlight {
    taken: Taken,
    /// Partitions revoked while it was applied: if it fails, none of their
    /// records go back into a buffer (they may be assigned again, and are
    /// then consumed again from the destination's offsets).
    revoked: BTreeSet<i32>,
    /// The task's outcome; closed without one if the task panicked.
    done: oneshot::Receiver<Applied>,
}

impl<S: Sink + 'static> Loop<S> {
    async fn run(&mut self, mut stop: watch::Receiver<bool>) -> Result<(), RunError> {
        let mut consumer_errors = 0u32;
        let mut next_probe = Instant::now() + STARTUP_METADATA_PROBE;
        let probe_until = Instant::now() + STARTUP_METADATA_PROBE_FOR;
        loop {
            if *stop.borrow() {
                break;
            }
            let deadline = self.next_deadline();
            // With a batch applying and the next one decoded, the buffers
            // may take one more batch's bytes; then consuming waits for the
            // apply. Three batches in memory (applying, decoded, buffered)
            // instead of one costs RSS: the 128 MiB budget leaves no room
            // for `max_buffered_bytes` on top.
            let full =
                self.ready.is_some() && self.buffers.values().map(|b| b.bytes).sum::<usize>() >= self.batch_max_bytes;
            let mut applied = None;
            let probe = (self.assigned.is_empty() && next_probe < probe_until).then_some(next_probe);
            let received = tokio::select! {
                _ = stop.changed() => None,
                // An operator's pause or resume takes effect at once, also
                // while nothing is arriving.
                _ = self.pause_rx.changed() => None,
                m = self.consumer.recv(), if !full => Some(m.map(|m| RawRecord::from_message(&m))),
                r = wait_applied(&mut self.in_flight) => {
                    applied = Some(r);
                    None
                }
                _ = sleep_until(deadline) => None,
                _ = sleep_until(self.stopped_probe) => {
                    self.probe_stopped().await;
                    None
                }
                _ = sleep_until(Some(self.next_group_check)) => {
                    self.next_group_check = Instant::now() + GROUP_CHECK;
                    self.check_group();
                    None
                }
                _ = sleep_until(probe) => {
                    next_probe = Instant::now() + STARTUP_METADATA_PROBE;
                    // Blocks the loop for one request (about a millisecond
                    // here), only while there is nothing to copy anyway.
                    if let Err(e) = self.consumer.fetch_metadata(None, Duration::from_secs(1)) {
                        debug!(error = %e, "cannot look for topics");
                    }
                    None
                }
            };
            self.drain_rebalance();
            if let Some(r) = applied {
                self.finish(r).await;
            }
            match received {
                Some(Ok(raw)) => {
                    consumer_errors = 0;
                    self.accept(raw);
                    // Take what is already fetched without a trip through
                    // select! and timers per record (a few µs each, a
                    // large share of a snapshot's time otherwise).
                    for _ in 0..DRAIN_MAX_RECORDS {
                        match self.consumer.recv().now_or_never() {
                            Some(Ok(m)) => {
                                let raw = RawRecord::from_message(&m);
                                drop(m);
                                self.drain_rebalance();
                                self.accept(raw);
                            }
                            Some(Err(KafkaError::PartitionEOF(_))) => {}
                            Some(Err(e)) => {
                                if is_out_of_range(&e) {
                                    self.find_out_of_range();
                                } else {
                                    warn!(error = %e, "consumer error");
                                }
                                break;
                            }
                            None => break,
                        }
                    }
                    self.last_received = Some(Instant::now());
                }
                Some(Err(e)) => {
                    consumer_errors = consumer_errors.saturating_add(1);
                    match e {
                        KafkaError::PartitionEOF(_) => {}
                        KafkaError::MessageConsumptionFatal(code) => {
                            return Err(RunError::Kafka(format!("fatal consumer error: {code}")));
                        }
                        e if is_out_of_range(&e) => self.find_out_of_range(),
                        other => {
                            // librdkafka reconnects by itself; these are
                            // reports, queued like messages. Sleeping per
                            // report (as this loop once did) drained a broker
                            // outage's backlog of reports at one per few
                            // seconds while the records behind them waited:
                            // the fault suite saw a sink stall for minutes
                            // after a Kafka restart. So: no wait, and the log
                            // says it once per run of errors, then every 50th.
                            if consumer_errors == 1 || consumer_errors.is_multiple_of(50) {
                                warn!(error = %other, repeated = consumer_errors, "consumer error (librdkafka retries)");
                            }
                        }
                    }
                }
                None => {}
            }
            self.apply_operator_pause();
            self.flush_due().await;
        }
        info!("stopping: applying what is buffered");
        self.finish_applying().await;
        let topics: Vec<String> = self
            .buffers
            .iter()
            .filter(|(_, b)| b.retry.is_none())
            .map(|(t, _)| t.clone())
            .collect();
        for topic in topics {
            self.flush(&topic).await;
            self.finish_applying().await;
        }
        info!("stopped");
        Ok(())
    }

    /// Waits for the batch being applied and the one decoded meanwhile.
    async fn finish_applying(&mut self) {
        while self.in_flight.is_some() {
            let r = wait_applied(&mut self.in_flight).await;
            self.finish(r).await;
        }
    }

    fn next_deadline(&self) -> Option<Instant> {
        if self.ready.is_some() {
            // Nothing more can be flushed before the apply ends (which
            // wakes the loop).
            return None;
        }
        let linger = self.config.linger();
        let idle = self.idle_at();
        // A table an operator paused is not flushed (see `flush_due`): its
        // buffer's linger, long past, would wake the loop at once, for ever.
        self.buffers
            .iter()
            .filter(|(topic, _)| !self.operator_paused.contains(*topic))
            .filter_map(|(_, b)| match &b.retry {
                Some(r) => Some(r.at),
                None => b.first_at.map(|t| idle.map_or(t + linger, |i| i.min(t + linger))),
            })
            .min()
    }

    /// When buffered records are applied for want of more: no batch being
    /// applied, and nothing received for `batch_idle_ms`. Waiting the whole
    /// linger made every change wait for it, also when nothing else was
    /// coming. Under load batches still grow: what arrives while a batch
    /// is applied waits for that apply, and goes in the next.
    fn idle_at(&self) -> Option<Instant> {
        match (&self.in_flight, self.last_received, self.idle) {
            (None, Some(t), Some(idle)) => Some(t + idle),
            _ => None,
        }
    }

    /// Subscribes again when the consumer has been out of a settled group
    /// membership for `group_rejoin_after_secs`: leaving the group
    /// (revoking whatever is still assigned, after the batch being applied)
    /// and joining it afresh, which is what a member that lost its
    /// partitions and never joined again needs.
    fn check_group(&mut self) {
        let unsettled = match self.group.lock() {
            Ok(g) => g.stuck_since.map(|t| (t, g.state.clone(), g.join_state.clone())),
            Err(_) => return,
        };
        let Some((since, state, join_state)) = unsettled else {
            return;
        };
        let waited = since.elapsed();
        if waited < Duration::from_secs(self.config.group_rejoin_after_secs) {
            return;
        }
        let pattern = self.config.topic_pattern();
        warn!(
            state = %state,
            join_state = %join_state,
            unsettled_s = waited.as_secs(),
            "the consumer has not been a settled member of its group for too long: subscribing again"
        );
        self.consumer.unsubscribe();
        if let Err(e) = self.consumer.subscribe(&[pattern.as_str()]) {
            error!(pattern = %pattern, error = %e, "cannot subscribe again");
        }
        // Another full wait before the next attempt.
        if let Ok(mut g) = self.group.lock() {
            g.stuck_since = Some(Instant::now());
        }
    }

    fn drain_rebalance(&mut self) {
        let events: Vec<RebalanceEvent> = match self.events.lock() {
            Ok(mut e) => std::mem::take(&mut *e),
            Err(_) => return,
        };
        let mut assigned_topics = BTreeSet::new();
        for event in events {
            match event {
                RebalanceEvent::Assigned(parts) => {
                    for (topic, partition, offset) in parts {
                        assigned_topics.insert(topic.clone());
                        self.stored.insert((topic.clone(), partition), offset);
                        match offset {
                            Some(o) => {
                                self.expected.insert((topic.clone(), partition), o);
                            }
                            None => {
                                self.expected.remove(&(topic.clone(), partition));
                            }
                        }
                        self.dlq_unscanned.insert((topic.clone(), partition));
                        self.assigned.insert((topic, partition));
                    }
                }
                RebalanceEvent::OutOfRange(parts) => {
                    for o in parts {
                        self.stop_partition(o);
                    }
                }
                RebalanceEvent::Revoked(parts) => {
                    for (topic, partition) in parts {
                        self.stopped.remove(&(topic.clone(), partition));
                        // Decoded but not applied: back into its buffer, to
                        // be dropped below with the rest of the partition.
                        if self.ready.as_ref().is_some_and(|r| r.taken.topic == topic) {
                            if let Some(r) = self.ready.take() {
                                self.restore(r.taken.topic, r.taken.buf, &BTreeSet::new());
                            }
                        }
                        if let Some(f) = self.in_flight.as_mut().filter(|f| f.taken.topic == topic) {
                            f.revoked.insert(partition);
                        }
                        self.assigned.remove(&(topic.clone(), partition));
                        self.expected.remove(&(topic.clone(), partition));
                        self.stored.remove(&(topic.clone(), partition));
                        self.rereading.remove(&(topic.clone(), partition));
                        self.dlq_unscanned.remove(&(topic.clone(), partition));
                        self.dead_letters.release(&topic, partition);
                        if !self.assigned.iter().any(|(t, _)| *t == topic) {
                            // Paused again (if still wanted) once reassigned.
                            self.operator_paused.remove(&topic);
                        }
                        if let Some(buf) = self.buffers.get_mut(&topic) {
                            buf.records.retain(|r| r.partition != partition);
                            buf.bytes = buf.records.iter().map(RawRecord::size).sum();
                            buf.next_offsets.remove(&partition);
                            if buf.next_offsets.is_empty() {
                                self.buffers.remove(&topic);
                            }
                        }
                    }
                }
            }
        }
        // New assignments fetch (see the rebalance callback); a table still
        // waiting for its retry stays paused until the retry succeeds.
        for topic in assigned_topics {
            if self.buffers.get(&topic).is_some_and(|b| b.retry.is_some()) {
                self.pause(&topic, true);
            }
        }
    }

    fn accept(&mut self, raw: RawRecord) {
        let key = (raw.topic.clone(), raw.partition);
        if !self.assigned.contains(&key) {
            return; // prefetched before a revoke
        }
        if self.stopped.contains_key(&key) {
            return; // fetched before the partition was stopped
        }
        if let Some(expected) = self.expected.get(&key) {
            if raw.offset < *expected {
                return; // prefetched before the assignment's offset
            }
        }
        self.expected.insert(key, raw.offset + 1);
        // Looked up by reference first: the topic is copied only for a new buffer.
        let buf = match self.buffers.get_mut(&raw.topic) {
            Some(buf) => buf,
            None => self.buffers.entry(raw.topic.clone()).or_insert_with(Buffer::new),
        };
        buf.next_offsets.insert(raw.partition, raw.offset + 1);
        buf.bytes += raw.size();
        buf.first_at.get_or_insert_with(Instant::now);
        buf.records.push(raw);
    }

    /// Follows the operator's pause set: pauses the partitions of paused
    /// tables (nothing more is fetched, nothing buffered is applied, no
    /// offset moves) and resumes them when the operator resumes.
    fn apply_operator_pause(&mut self) {
        let paused = self.control.paused();
        // This runs once per trip through the loop: without any pause, past
        // or present, there is nothing to do and nothing is allocated.
        if !paused.all && paused.tables.is_empty() && self.operator_paused.is_empty() {
            if self.runner_paused {
                self.telemetry.set_paused(None);
                self.runner_paused = false;
            }
            return;
        }
        let topics: BTreeSet<String> = self.assigned.iter().map(|(t, _)| t.clone()).collect();
        for topic in topics {
            let label = (self.labeler)(&self.table_of(&topic));
            let want = paused.is_paused(&label);
            let is = self.operator_paused.contains(&topic);
            if want && !is {
                self.pause(&topic, true);
                self.operator_paused.insert(topic);
                self.telemetry
                    .set_state(&label, TableState::Paused("paused by an operator".to_string()));
                info!(table = %label, "paused by an operator");
            } else if !want && is {
                // A table also waiting for a retry stays paused until it succeeds.
                if self.buffers.get(&topic).is_none_or(|b| b.retry.is_none()) {
                    self.pause(&topic, false);
                }
                self.operator_paused.remove(&topic);
                self.set_streaming(&topic, &label);
                info!(table = %label, "resumed by an operator");
            }
        }
        if paused.all != self.runner_paused {
            self.telemetry
                .set_paused(paused.all.then(|| "paused by an operator".to_string()));
            self.runner_paused = paused.all;
        }
    }

    async fn flush_due(&mut self) {
        let now = Instant::now();
        let linger = self.config.linger();
        let idle = self.idle_at().is_some_and(|t| t <= now);
        let total: usize = self.buffers.values().map(|b| b.bytes).sum();
        let largest = if total > self.config.max_buffered_bytes {
            self.buffers
                .iter()
                .filter(|(_, b)| b.retry.is_none())
                .max_by_key(|(_, b)| b.bytes)
                .map(|(t, _)| t.clone())
        } else {
            None
        };
        let due: Vec<String> = self
            .buffers
            .iter()
            .filter(|(topic, _)| !self.operator_paused.contains(*topic))
            .filter(|(topic, b)| match &b.retry {
                Some(r) => r.at <= now,
                None => {
                    b.records.len() >= self.config.batch_max_records
                        || b.bytes >= self.batch_max_bytes
                        || b.first_at.is_some_and(|t| idle || t + linger <= now)
                        || largest.as_deref() == Some(topic.as_str())
                }
            })
            .map(|(t, _)| t.clone())
            .collect();
        for topic in due {
            if self.ready.is_some() {
                break; // the rest waits for the apply to end
            }
            self.flush(&topic).await;
        }
    }

    /// Marks `topic`'s table streaming, unless one of its partitions is
    /// stopped out of range: its error stays in the status.
    fn set_streaming(&self, topic: &str, label: &str) {
        let stopped = self.stopped.values().find(|o| o.topic == topic);
        let state = match stopped {
            Some(o) => TableState::Paused(o.error(&self.config.consumer_group, &self.table_of(topic)).to_string()),
            None => TableState::Streaming,
        };
        self.telemetry.set_state(label, state);
    }

    /// Stops a partition whose stored offset is out of the topic's range:
    /// paused (nothing fetched, no offset moves), the error in the status
    /// and the log, probed until an operator fixes the stored offset. The
    /// table's other partitions and the other tables go on.
    fn stop_partition(&mut self, o: OutOfRange) {
        let key = (o.topic.clone(), o.partition);
        if !self.assigned.contains(&key) {
            return;
        }
        let table = self.table_of(&o.topic);
        let label = (self.labeler)(&table);
        let error = o.error(&self.config.consumer_group, &table);
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(&o.topic, o.partition);
        if let Err(e) = self.consumer.pause(&tpl) {
            warn!(topic = %o.topic, partition = o.partition, error = %e, "cannot pause the partition");
        }
        if self.stopped.get(&key) != Some(&o) {
            error!(
                table = %label,
                topic = %o.topic,
                partition = o.partition,
                stored_offset = o.stored,
                low = o.low,
                high = o.high,
                kind = %error.kind(),
                error = %error,
                hint = error.hint().unwrap_or(""),
                "partition stopped: its stored offset is out of range"
            );
            self.telemetry
                .record_error(&label, &error.to_string(), &error.kind().to_string());
        }
        self.telemetry.set_state(&label, TableState::Paused(error.to_string()));
        self.stopped.insert(key, o);
        self.stopped_probe
            .get_or_insert_with(|| Instant::now() + tributary_connectors::error::OPERATOR_PROBE_DELAY);
    }

    /// After librdkafka reported a fetch out of range (it names no
    /// partition to us): compares each assigned partition's next offset
    /// with its topic's range and stops those outside it.
    fn find_out_of_range(&mut self) {
        let candidates: Vec<(String, i32, i64)> = self
            .assigned
            .iter()
            .filter(|k| !self.stopped.contains_key(*k))
            .filter_map(|k| self.expected.get(k).map(|o| (k.0.clone(), k.1, *o)))
            .collect();
        let mut found = Vec::new();
        for (topic, partition, next) in candidates {
            let range = tokio::task::block_in_place(|| {
                self.consumer.fetch_watermarks(&topic, partition, Duration::from_secs(10))
            });
            match range {
                Ok(range) => found.extend(OutOfRange::check(&topic, partition, next, range)),
                Err(e) => warn!(topic = %topic, partition, error = %e, "cannot read the topic's range"),
            }
        }
        if found.is_empty() {
            warn!("Kafka reported an offset out of range, but every assigned partition's offset is in range now");
        }
        for o in found {
            self.stop_partition(o);
        }
    }

    /// Looks at the stopped partitions again: once the stored offset (read
    /// from the destination) is in the topic's range, or gone (then the
    /// partition is read from its beginning), the partition goes on from
    /// there.
    async fn probe_stopped(&mut self) {
        self.stopped_probe = None;
        if self.stopped.is_empty() && self.rereading.is_empty() {
            return;
        }
        let parts: Vec<(String, i32)> = self.stopped.keys().chain(&self.rereading).cloned().collect();
        self.restart_from_stored(parts).await;
    }

    /// Makes `parts` go on from the offsets stored in the destination now:
    /// stopped partitions once their offset is in range again, fenced ones
    /// at once. When the destination cannot tell, they wait paused and are
    /// looked at again with the stopped ones.
    async fn restart_from_stored(&mut self, parts: Vec<(String, i32)>) {
        if parts.is_empty() {
            return;
        }
        let stored = match self.sink.lock().await.committed_offsets(&parts).await {
            Ok(s) => s,
            Err(e) => {
                warn!(error = %e, "cannot read the stored offsets of stopped or fenced partitions");
                for key in parts {
                    if !self.stopped.contains_key(&key) && self.rereading.insert(key.clone()) {
                        let mut tpl = TopicPartitionList::new();
                        tpl.add_partition(&key.0, key.1);
                        if let Err(e) = self.consumer.pause(&tpl) {
                            warn!(topic = %key.0, partition = key.1, error = %e, "cannot pause the partition");
                        }
                    }
                }
                self.stopped_probe = Some(Instant::now() + tributary_connectors::error::OPERATOR_PROBE_DELAY);
                return;
            }
        };
        for ((topic, partition), stored) in parts.into_iter().zip(stored) {
            let at = match stored {
                None => Offset::Beginning,
                Some(o) => {
                    let range = tokio::task::block_in_place(|| {
                        self.consumer.fetch_watermarks(&topic, partition, Duration::from_secs(10))
                    });
                    match range {
                        Ok(range) => {
                            if let Some(still) = OutOfRange::check(&topic, partition, o, range) {
                                self.stop_partition(still);
                                continue;
                            }
                        }
                        Err(e) => {
                            warn!(topic = %topic, partition, error = %e, "cannot read the topic's range");
                            continue;
                        }
                    }
                    Offset::Offset(o)
                }
            };
            let key = (topic.clone(), partition);
            if let Err(e) = self.restart_partition(&topic, partition, at) {
                warn!(topic = %topic, partition, error = %e, "cannot restart the stopped partition");
                continue;
            }
            self.stopped.remove(&key);
            self.rereading.remove(&key);
            self.stored.insert(key.clone(), stored);
            match stored {
                Some(o) => self.expected.insert(key.clone(), o),
                None => self.expected.remove(&key),
            };
            // Records of the partition still buffered came before the
            // stop and are older than the fixed offset: dropped.
            if let Some(buf) = self.buffers.get_mut(&topic) {
                if buf.retry.is_none() && self.in_flight.as_ref().is_none_or(|f| f.taken.topic != topic) {
                    buf.records.retain(|r| r.partition != partition);
                    buf.bytes = buf.records.iter().map(RawRecord::size).sum();
                    buf.next_offsets.remove(&partition);
                    if buf.next_offsets.is_empty() {
                        self.buffers.remove(&topic);
                    }
                }
            }
            let held =
                self.operator_paused.contains(&topic) || self.buffers.get(&topic).is_some_and(|b| b.retry.is_some());
            if !held {
                let mut tpl = TopicPartitionList::new();
                tpl.add_partition(&topic, partition);
                if let Err(e) = self.consumer.resume(&tpl) {
                    warn!(topic = %topic, partition, error = %e, "cannot resume the partition");
                }
            }
            let label = (self.labeler)(&self.table_of(&topic));
            info!(table = %label, topic = %topic, partition, offset = ?at, "partition goes on from its stored offset");
            if !held {
                self.set_streaming(&topic, &label);
            }
        }
        if !self.stopped.is_empty() || !self.rereading.is_empty() {
            self.stopped_probe = Some(Instant::now() + tributary_connectors::error::OPERATOR_PROBE_DELAY);
        }
    }

    /// Makes a stopped partition fetch from `at` (it stays paused). A seek
    /// does it while librdkafka still fetches the partition; after a fetch
    /// out of range librdkafka stopped fetching it and refuses a seek, so
    /// it is assigned again: alone with the cooperative protocol, else the
    /// whole assignment, every other partition at the next offset this
    /// loop expects (what was fetched beyond it is fetched again and
    /// accepted once).
    fn restart_partition(&self, topic: &str, partition: i32, at: Offset) -> Result<(), KafkaError> {
        let sought = tokio::task::block_in_place(|| self.consumer.seek(topic, partition, at, Duration::from_secs(10)));
        if sought.is_ok() {
            return Ok(());
        }
        let mut tpl = TopicPartitionList::new();
        if matches!(self.consumer.rebalance_protocol(), RebalanceProtocol::Cooperative) {
            tpl.add_partition_offset(topic, partition, at)?;
            self.consumer.incremental_unassign(&tpl)?;
            self.consumer.incremental_assign(&tpl)?;
        } else {
            let current = self.consumer.assignment()?;
            for e in current.elements() {
                let key = (e.topic().to_string(), e.partition());
                let offset = if e.topic() == topic && e.partition() == partition {
                    at
                } else if let Some(next) = self.expected.get(&key) {
                    Offset::Offset(*next)
                } else if self.assigned.contains(&key) {
                    // Copied, but nothing stored or received yet.
                    Offset::Beginning
                } else {
                    // Not copied (paused for ever): anywhere in range.
                    Offset::End
                };
                tpl.add_partition_offset(e.topic(), e.partition(), offset)?;
            }
            self.consumer.assign(&tpl)?;
        }
        // The pause flags survive the new assignment; this one stays paused
        // until the caller resumes it.
        let mut one = TopicPartitionList::new();
        one.add_partition(topic, partition);
        self.consumer.pause(&one)?;
        Ok(())
    }

    fn table_of(&self, topic: &str) -> TableId {
        if let Some(t) = self.tables.get(topic) {
            return t.clone();
        }
        table_from_topic(topic, self.config.prefix.as_deref())
    }

    fn pause(&self, topic: &str, paused: bool) {
        let mut tpl = TopicPartitionList::new();
        for (t, p) in &self.assigned {
            // A partition stopped out of range stays paused until its
            // stored offset is fixed (see `probe_stopped`).
            if t == topic && (paused || !self.stopped.contains_key(&(t.clone(), *p))) {
                tpl.add_partition(t, *p);
            }
        }
        if tpl.count() == 0 {
            return;
        }
        let r = if paused {
            self.consumer.pause(&tpl)
        } else {
            self.consumer.resume(&tpl)
        };
        if let Err(e) = r {
            warn!(topic, error = %e, "cannot pause or resume partitions");
        }
    }

    /// Schedules a retry of `topic`'s batch after `error`, per [`policy`].
    fn schedule_retry(&mut self, topic: &str, table: &TableId, error: &Error) {
        let label = (self.labeler)(table);
        let attempt = self.buffers.get(topic).and_then(|b| b.retry.as_ref()).map_or(0, |r| r.attempt) + 1;
        let delay = match policy(error.kind(), attempt) {
            Decision::RetryAfter(d) | Decision::PauseAndProbe(d) => d,
            // A permanent error without a record to blame: probe slowly.
            Decision::DeadLetter => tributary_connectors::error::OPERATOR_PROBE_DELAY,
        };
        let first = attempt == 1;
        if let Some(buf) = self.buffers.get_mut(topic) {
            buf.retry = Some(Retry { attempt, at: Instant::now() + delay });
        }
        if first {
            self.pause(topic, true);
        }
        self.telemetry.set_state(&label, TableState::Paused(error.to_string()));
        self.telemetry
            .record_error(&label, &error.to_string(), &error.kind().to_string());
        warn!(
            table = %label,
            kind = %error.kind(),
            error = %error,
            hint = error.hint().unwrap_or(""),
            attempt,
            retry_in_ms = delay.as_millis() as u64,
            "paused"
        );
    }

    /// Decodes `topic`'s buffer and starts applying it, or, while another
    /// batch is being applied, keeps it decoded to start right after (so
    /// decoding overlaps the destination's work). A retryable failure to
    /// decode pauses the table, as a failed apply does.
    async fn flush(&mut self, topic: &str) {
        let table = self.table_of(topic);
        let label = (self.labeler)(&table);
        let records = self.buffers.get(topic).map_or(0, |b| b.records.len());
        let span = info_span!("batch", table = %label, topic, records);
        let prepared = self.prepare(topic).instrument(span).await;
        match prepared {
            Ok(Some(p)) => {
                if self.in_flight.is_none() {
                    self.start(p);
                } else {
                    self.ready = Some(p);
                }
            }
            Ok(None) => {}
            Err((table, error)) => self.schedule_retry(topic, &table, &error),
        }
    }

    /// Decodes a topic's buffer into a batch (what cannot be decoded is
    /// dead-lettered now) and takes the buffer out of `buffers`: records
    /// that arrive meanwhile start a new one.
    async fn prepare(&mut self, topic: &str) -> Result<Option<Prepared>, (TableId, Error)> {
        if !self.buffers.contains_key(topic) {
            return Ok(None);
        }
        let fallback = self.table_of(topic);
        let started = Instant::now();
        let mut batch_records = Vec::with_capacity(self.buffers[topic].records.len());
        let mut raw_index: Vec<usize> = Vec::with_capacity(self.buffers[topic].records.len());
        let mut table: Option<TableId> = None;
        let mut i = 0;
        while i < self.buffers.get(topic).map_or(0, |b| b.records.len()) {
            let raw = &self.buffers[topic].records[i];
            match decode_record(&mut self.decoder, raw, &fallback).await {
                Ok(Some(record)) => {
                    if table.is_none() {
                        match &record {
                            SinkRecord::Change(ev) => table = Some(ev.schema.id.clone()),
                            SinkRecord::TableDropped(id) | SinkRecord::Copied(id, _) | SinkRecord::Reset(id, _) => {
                                table = Some(id.clone())
                            }
                        }
                    }
                    let pos = KafkaPosition {
                        topic: raw.topic.clone(),
                        partition: raw.partition,
                        offset: raw.offset,
                    };
                    batch_records.push((pos, record));
                    raw_index.push(i);
                    i += 1;
                }
                Ok(None) => i += 1,
                Err(e) if e.kind() == ErrorKind::Permanent => {
                    let raw = raw.clone();
                    let t = table.clone().unwrap_or_else(|| fallback.clone());
                    self.dead_letter(&raw, Stage::Decode, &e, &t)
                        .await
                        .map_err(|e| (t.clone(), e))?;
                    if let Some(b) = self.buffers.get_mut(topic) {
                        let gone = b.records.remove(i);
                        b.bytes = b.bytes.saturating_sub(gone.size());
                    }
                }
                Err(e) => return Err((table.unwrap_or(fallback), e)),
            }
        }
        let table = table.unwrap_or(fallback);
        self.tables.insert(topic.to_string(), table.clone());
        let Some(buf) = self.buffers.remove(topic) else {
            return Ok(None);
        };
        let next_offsets: Vec<(String, i32, i64)> =
            buf.next_offsets.iter().map(|(p, o)| (topic.to_string(), *p, *o)).collect();
        let oldest = source_ts(&batch_records).min();
        if let Some(ts) = oldest {
            self.telemetry.record_pending(&(self.labeler)(&table), ts);
        }
        let batch = SinkBatch {
            table: table.clone(),
            records: batch_records,
            next_offsets,
            expected_offsets: Vec::new(),
        };
        Ok(Some(Prepared {
            taken: Taken {
                topic: topic.to_string(),
                table,
                buf,
                raw_index,
                started,
                decoded: started.elapsed(),
                oldest,
            },
            batch,
        }))
    }

    /// Applies a prepared batch in its own task: the loop goes on consuming
    /// and decoding. One batch at a time, so a table's batches are applied
    /// in order and a failed one is retried before anything after it.
    fn start(&mut self, p: Prepared) {
        if self.operator_paused.contains(&p.taken.topic) {
            // Paused while it waited: nothing buffered is applied.
            self.restore(p.taken.topic, p.taken.buf, &BTreeSet::new());
            return;
        }
        let sink = self.sink.clone();
        let mut batch = p.batch;
        // Set now, not when decoded: the batch before it may have moved them.
        batch.expected_offsets = batch
            .next_offsets
            .iter()
            .filter_map(|(t, p, _)| self.stored.get(&(t.clone(), *p)).map(|at| (t.clone(), *p, *at)))
            .collect();
        let (tx, done) = oneshot::channel();
        tokio::spawn(async move {
            let result = sink.lock().await.apply(&batch).await;
            let (applied, records) = Applied::new(batch, result);
            // The loop may have stopped waiting (shutting down): then there
            // is nobody to tell.
            let _ = tx.send(applied);
            drop(records);
        });
        self.in_flight = Some(InFlight { taken: p.taken, revoked: BTreeSet::new(), done });
    }

    /// Puts the records of a batch that was not applied back in front of
    /// what arrived for its topic since, without the partitions revoked
    /// meanwhile (their next owner consumes them again from the
    /// destination's offsets).
    fn restore(&mut self, topic: String, mut older: Buffer, revoked: &BTreeSet<i32>) {
        older
            .records
            .retain(|r| !revoked.contains(&r.partition) && self.assigned.contains(&(topic.clone(), r.partition)));
        older
            .next_offsets
            .retain(|p, _| !revoked.contains(p) && self.assigned.contains(&(topic.clone(), *p)));
        if let Some(newer) = self.buffers.remove(&topic) {
            older.records.extend(newer.records);
            older.next_offsets.extend(newer.next_offsets);
            older.first_at = older.first_at.or(newer.first_at);
            older.retry = older.retry.or(newer.retry);
        }
        older.bytes = older.records.iter().map(RawRecord::size).sum();
        if !older.next_offsets.is_empty() {
            self.buffers.insert(topic, older);
        }
    }

    /// Handles the end of the batch applied in its task, then starts the
    /// one decoded meanwhile.
    async fn finish(&mut self, joined: Result<Applied, oneshot::error::RecvError>) {
        let Some(f) = self.in_flight.take() else {
            return;
        };
        let label = (self.labeler)(&f.taken.table);
        let span = info_span!("batch", table = %label, topic = %f.taken.topic, records = f.taken.raw_index.len());
        let topic = f.taken.topic.clone();
        let table = f.taken.table.clone();
        // The raw records of an applied batch are freed once the next batch
        // is on its way.
        let applied = match self.finish_inner(f, joined).instrument(span).await {
            Ok(buf) => Some(buf),
            Err((_, revoked, error)) if error.class() == FENCED_CLASS => {
                // Another runner (or an operator) stored offsets for these
                // partitions: nothing of the batch was written. Everything
                // buffered for the topic is dropped and its partitions go
                // on from what is stored now.
                let label = (self.labeler)(&table);
                warn!(table = %label, topic = %topic, error = %error, "batch fenced: reading the stored offsets again");
                self.telemetry
                    .record_error(&label, &error.to_string(), &error.kind().to_string());
                if self.ready.as_ref().is_some_and(|r| r.taken.topic == topic) {
                    self.ready = None;
                }
                self.buffers.remove(&topic);
                let parts: Vec<(String, i32)> = self
                    .assigned
                    .iter()
                    .filter(|(t, p)| *t == topic && !revoked.contains(p))
                    .cloned()
                    .collect();
                self.restart_from_stored(parts).await;
                None
            }
            Err((buf, revoked, error)) => {
                // Newer records of the table go back behind the failed ones.
                if self.ready.as_ref().is_some_and(|r| r.taken.topic == topic) {
                    if let Some(r) = self.ready.take() {
                        self.restore(r.taken.topic, r.taken.buf, &revoked);
                    }
                }
                self.restore(topic.clone(), buf, &revoked);
                self.schedule_retry(&topic, &table, &error);
                None
            }
        };
        if self.in_flight.is_none() {
            if let Some(p) = self.ready.take() {
                self.start(p);
            }
        }
        drop(applied);
    }

    async fn finish_inner(
        &mut self,
        f: InFlight,
        joined: Result<Applied, oneshot::error::RecvError>,
    ) -> Result<Buffer, (Buffer, BTreeSet<i32>, Error)> {
        let InFlight {
            taken:
                Taken {
                    topic,
                    table,
                    mut buf,
                    mut raw_index,
                    started,
                    decoded,
                    ..
                },
            revoked,
            ..
        } = f;
        let Applied { mut batch, mut result, mut events, mut newest } = match joined {
            Ok(r) => r,
            Err(_) => {
                // The task panicked or was cancelled: nothing is known to
                // be applied, so the batch is retried.
                let error = Error::retryable("the apply task ended without an outcome (it panicked or was cancelled)");
                return Err((buf, revoked, error));
            }
        };
        // A record the destination refuses is dead-lettered and the rest
        // applied again (here, in the loop: a rare path).
        loop {
            match result {
                Ok(()) => break,
                Err(ApplyError { error, record }) => match policy(error.kind(), 1) {
                    Decision::DeadLetter => {
                        let blamed: Vec<usize> = match record {
                            Some(r) if r < batch.records.len() => vec![r],
                            _ => {
                                error!(error = %error, "a permanent error without a record to blame: dead-lettering the whole batch");
                                (0..batch.records.len()).collect()
                            }
                        };
                        if blamed.is_empty() {
                            return Err((buf, revoked, error));
                        }
                        // A control record (table-reset, table-copied,
                        // table-dropped) is never dead-lettered: skipping
                        // it loses what it does to every row of the table,
                        // and a replay would apply it out of order (a reset
                        // replayed later forgets the positions of newer
                        // rows). The table waits for an operator instead.
                        if let Some(&b) = blamed.iter().find(|&&b| !matches!(batch.records[b].1, SinkRecord::Change(_)))
                        {
                            let at = &batch.records[b].0;
                            let error = Error::needs_operator(format!(
                                "a control record ({} partition {} offset {}) cannot be applied: {error}",
                                at.topic, at.partition, at.offset
                            ))
                            .with_class("tributary.control_refused")
                            .with_hint(
                                "control records are never dead-lettered: fix what the destination refuses (the \
                                 error above; a table-reset rewrites every row's position, so a row that breaks a \
                                 constraint added later refuses it); the table goes on by itself",
                            );
                            return Err((buf, revoked, error));
                        }
                        for &b in blamed.iter().rev() {
                            let ri = raw_index[b];
                            let raw = buf.records[ri].clone();
                            if let Err(e) = self.dead_letter(&raw, Stage::Apply, &error, &table).await {
                                return Err((buf, revoked, e));
                            }
                            batch.records.remove(b);
                            raw_index.remove(b);
                            let gone = buf.records.remove(ri);
                            buf.bytes = buf.bytes.saturating_sub(gone.size());
                            for r in raw_index.iter_mut().filter(|r| **r > ri) {
                                *r -= 1;
                            }
                        }
                        result = {
                            let mut sink = self.sink.lock().await;
                            sink.apply(&batch).await
                        };
                        events = batch.records.len();
                        newest = newest_source_ts(&batch.records);
                    }
                    _ => return Err((buf, revoked, error)),
                },
            }
        }
        // Done: tell Kafka (for monitoring) and the status.
        let label = (self.labeler)(&table);
        self.telemetry.record_events(&label, events as u64, buf.bytes as u64, newest);
        self.telemetry.record_applied(&label, newest);
        // The batch decoded meanwhile is seen and not applied.
        if let Some(ts) = self
            .ready
            .as_ref()
            .filter(|r| r.taken.topic == topic)
            .and_then(|r| r.taken.oldest)
        {
            self.telemetry.record_pending(&label, ts);
        }
        self.telemetry.record_batch_seconds(started.elapsed().as_secs_f64());
        if buf.retry.is_some() {
            self.pause(&topic, false);
            info!(table = %label, "resumed");
        }
        self.set_streaming(&topic, &label);
        // Stored now: what was dead-lettered below these offsets is never
        // consumed again.
        if !self.dead_lettered.is_empty() {
            for (t, p, o) in &batch.next_offsets {
                self.dead_lettered.retain(|(dt, dp, doff)| !(dt == t && dp == p && doff < o));
            }
        }
        let mut tpl = TopicPartitionList::new();
        for (t, p, o) in &batch.next_offsets {
            if !revoked.contains(p) && self.assigned.contains(&(t.clone(), *p)) {
                self.stored.insert((t.clone(), *p), Some(*o));
                let _ = tpl.add_partition_offset(t, *p, Offset::Offset(*o));
            }
        }
        if tpl.count() > 0 {
            if let Err(e) = self.consumer.commit(&tpl, CommitMode::Async) {
                debug!(error = %e, "cannot mirror offsets to Kafka");
            }
        }
        debug!(
            table = %label,
            events,
            decode_ms = decoded.as_millis() as u64,
            apply_ms = (started.elapsed() - decoded).as_millis() as u64,
            "applied"
        );
        Ok(buf)
    }

    async fn dead_letter(
        &mut self,
        raw: &RawRecord,
        stage: Stage,
        error: &Error,
        table: &TableId,
    ) -> Result<(), Error> {
        let label = (self.labeler)(table);
        let dlq = self.config.dlq_topic(&raw.topic);
        let origin = (raw.topic.clone(), raw.partition, raw.offset);
        self.read_predecessors_dead_letters(&dlq, &raw.topic, raw.partition).await?;
        if self.dead_lettered.contains(&origin) {
            debug!(table = %label, topic = %raw.topic, partition = raw.partition, offset = raw.offset,
                "already dead-lettered by this runner: not sent or counted again");
            return Ok(());
        }
        let failure = Failure::from_error(stage, error, Some(table.to_string()));
        if let Err(e) = self.dead_letters.send(&dlq, raw, &failure).await {
            // Perhaps fenced by a member that claimed the partition since
            // and sent this record: claim and read again before a retry.
            let part = (raw.topic.clone(), raw.partition);
            if self.assigned.contains(&part) {
                self.dlq_unscanned.insert(part);
            }
            return Err(e);
        }
        self.dead_lettered.insert(origin);
        self.telemetry
            .record_failed(&label, &error.to_string(), &error.kind().to_string());
        self.telemetry.set_dead_letter_topic(&label, &dlq);
        warn!(
            table = %label,
            topic = %raw.topic,
            partition = raw.partition,
            offset = raw.offset,
            dlq = %dlq,
            stage = stage.as_str(),
            error = %error,
            "record dead-lettered"
        );
        Ok(())
    }
}

impl<S: Sink + 'static> Loop<S> {
    /// Once per assignment of `topic` / `partition`, before its first dead
    /// letter (and again after a failed send): fences earlier senders of
    /// its dead letters ([`DeadLetters::claim`]), then reads what a
    /// predecessor (this runner before a crash, another member before a
    /// rebalance, a frozen member since) dead-lettered from the stored
    /// offset on and could not store offsets past, so that it is not sent
    /// twice.
    async fn read_predecessors_dead_letters(&mut self, dlq: &str, topic: &str, partition: i32) -> Result<(), Error> {
        let part = (topic.to_string(), partition);
        if !self.dlq_unscanned.contains(&part) {
            return Ok(());
        }
        let from = self.stored.get(&part).copied().flatten().unwrap_or(0);
        if self.dlq_reader.is_none() {
            let base = self
                .config
                .kafka
                .client_config()
                .map_err(|e| Error::needs_operator(e.to_string()))?;
            self.dlq_reader = Some(DlqReader::new(&base, &format!("{}.dlq-check", self.config.consumer_group))?);
        }
        let Some(reader) = &self.dlq_reader else {
            return Ok(());
        };
        self.dead_letters.claim(topic, partition).await?;
        let found = reader.dead_lettered_since(dlq, topic, partition, from).await?;
        if !found.is_empty() {
            info!(
                topic,
                partition,
                from,
                records = found.len(),
                dlq,
                "dead letters a predecessor sent and could not store offsets past: not sent again"
            );
        }
        for offset in found {
            self.dead_lettered.insert((topic.to_string(), partition, offset));
        }
        self.dlq_unscanned.remove(&part);
        Ok(())
    }
}

/// Whether a consumer error is librdkafka's report of a fetch out of range
/// (with `auto.offset.reset=error`).
fn is_out_of_range(e: &KafkaError) -> bool {
    use rdkafka::error::RDKafkaErrorCode;
    matches!(
        e,
        KafkaError::MessageConsumption(RDKafkaErrorCode::AutoOffsetReset | RDKafkaErrorCode::OffsetOutOfRange)
    )
}

/// The end of the batch being applied; never, when there is none.
async fn wait_applied(in_flight: &mut Option<InFlight>) -> Result<Applied, oneshot::error::RecvError> {
    match in_flight {
        Some(f) => (&mut f.done).await,
        None => futures::future::pending().await,
    }
}

/// Turns a raw record into what the sink applies: `None` for a tombstone
/// (nothing to do, its offset is still covered).
pub async fn decode_record(
    decoder: &mut EventDecoder,
    raw: &RawRecord,
    table: &TableId,
) -> Result<Option<SinkRecord>, Error> {
    if raw.value.is_none() {
        let control = raw.header(CONTROL_HEADER);
        // The source names the table (the topic's name may not: see
        // `legal_topic_name`); records of older runners do not.
        let named = raw.header(CONTROL_SCHEMA_HEADER).zip(raw.header(CONTROL_TABLE_NAME_HEADER));
        let table = &named.map_or_else(|| table.clone(), |(s, t)| TableId::new(s, t));
        if control.as_deref() == Some(CONTROL_TABLE_DROPPED) {
            return Ok(Some(SinkRecord::TableDropped(table.clone())));
        }
        if control.as_deref() == Some(CONTROL_TABLE_COPIED) {
            let at = raw
                .header(CONTROL_POSITION_HEADER)
                .and_then(|p| {
                    let (commit, index) = p.split_once(':')?;
                    Some(tributary_schemas::Position {
                        commit: commit.parse().ok()?,
                        index: index.parse().ok()?,
                    })
                })
                .ok_or_else(|| {
                    Error::permanent(format!("a {CONTROL_TABLE_COPIED} control record without a readable position"))
                        .with_table(table.clone())
                })?;
            return Ok(Some(SinkRecord::Copied(table.clone(), at)));
        }
        if control.as_deref() == Some(CONTROL_TABLE_RESET) {
            let reset = raw.header(CONTROL_RESET_HEADER).and_then(|r| r.parse().ok()).ok_or_else(|| {
                Error::permanent(format!("a {CONTROL_TABLE_RESET} control record without a readable reset id"))
                    .with_table(table.clone())
            })?;
            return Ok(Some(SinkRecord::Reset(table.clone(), reset)));
        }
        return Ok(None);
    }
    match decoder.decode(&raw.topic, raw.key.as_deref(), raw.value.as_deref()).await {
        Ok(Decoded::Change(ev)) => Ok(Some(SinkRecord::Change(ev))),
        Ok(Decoded::Tombstone) => Ok(None),
        // (Registry down: retried; refused: operator; bad bytes: permanent.)
        Err(e) => Err(Error::from(e)),
    }
}

/// Deletes a copy: the consumer group, the offsets stored in the
/// destination and, with `drop_destination`, the destination tables of every
/// topic the copy subscribes to. Returns what was removed.
pub async fn delete(config: &SinkRunnerConfig, drop_destination: bool) -> Result<Vec<String>, RunError> {
    use rdkafka::admin::{AdminClient, AdminOptions};
    use rdkafka::client::DefaultClientContext;
    use rdkafka::consumer::BaseConsumer;
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
    for topic in topics {
        let meta = tokio::task::block_in_place(|| consumer.fetch_metadata(Some(topic), WAIT))
            .map_err(|e| RunError::Kafka(format!("cannot read metadata of {topic}: {e}")))?;
        for p in meta.topics().iter().filter(|t| t.name() == topic).flat_map(|t| t.partitions()) {
            let (low, high) = tokio::task::block_in_place(|| consumer.fetch_watermarks(topic, p.id(), WAIT))
                .map_err(|e| RunError::Kafka(format!("cannot read the offsets of {topic}/{}: {e}", p.id())))?;
            if high > low {
                remaining.insert((topic.clone(), p.id()), high);
                tpl.add_partition_offset(topic, p.id(), Offset::Offset(low))
                    .map_err(|e| RunError::Kafka(e.to_string()))?;
            }
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
                let table = match record {
                    SinkRecord::Change(ev) => ev.schema.id.clone(),
                    SinkRecord::TableDropped(t) | SinkRecord::Copied(t, _) | SinkRecord::Reset(t, _) => t,
                };
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

/// The source table of a topic named `<prefix>.<schema>.<table>` (or, without
/// a known prefix, its last two dot-separated parts).
pub fn table_from_topic(topic: &str, prefix: Option<&str>) -> TableId {
    let rest = prefix.and_then(|p| topic.strip_prefix(p)).and_then(|r| r.strip_prefix('.'));
    if let Some(rest) = rest {
        if let Some((s, t)) = rest.split_once('.') {
            return TableId::new(s, t);
        }
    }
    let mut parts = topic.rsplitn(3, '.');
    let table = parts.next().unwrap_or(topic);
    let schema = parts.next().unwrap_or("");
    TableId::new(schema, table)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_health_counts_from_the_first_unsettled_report_until_settled_again() {
        let t0 = Instant::now();
        let mut g = GroupHealth::default();
        g.update("up".into(), "steady".into(), 4, t0);
        assert_eq!(g.unsettled_since, None);
        assert_eq!(g.status(t0).unsettled_seconds, None);
        // A broker restart: the coordinator is lost, then the member waits
        // to join; the clock runs from the first report.
        g.update("query-coord".into(), "init".into(), 0, t0 + Duration::from_secs(5));
        g.update("up".into(), "wait-join".into(), 0, t0 + Duration::from_secs(10));
        assert_eq!(g.unsettled_since, Some(t0 + Duration::from_secs(5)));
        let s = g.status(t0 + Duration::from_secs(35));
        assert_eq!((s.state.as_str(), s.join_state.as_str(), s.assigned_partitions), ("up", "wait-join", 0));
        assert_eq!(s.unsettled_seconds, Some(30));
        assert_eq!(g.stuck_since, Some(t0 + Duration::from_secs(5)));
        // Waiting for the loop to serve the assignment: not stuck (the
        // status still counts it as unsettled).
        g.update("up".into(), "wait-assign-call".into(), 0, t0 + Duration::from_secs(36));
        assert_eq!((g.stuck_since, g.unsettled_since), (None, Some(t0 + Duration::from_secs(5))));
        g.update("up".into(), "steady".into(), 4, t0 + Duration::from_secs(40));
        assert_eq!(g.unsettled_since, None);
        assert_eq!(g.status(t0 + Duration::from_secs(40)).assigned_partitions, 4);
    }

    #[test]
    fn an_offset_out_of_range_names_partition_offset_range_and_both_fixes() {
        assert_eq!(OutOfRange::check("t", 0, 5, (0, 10)), None);
        assert_eq!(OutOfRange::check("t", 0, 10, (0, 10)), None, "the next offset to be written is in range");
        assert!(OutOfRange::check("t", 0, 11, (0, 10)).is_some(), "beyond the end: re-created topic");
        let o = OutOfRange::check("shop.public.orders", 2, 1200, (5000, 5600)).expect("out of range");
        let e = o.error("g'1", &TableId::new("public", "orders"));
        assert_eq!(e.kind(), ErrorKind::NeedsOperator);
        let text = e.to_string();
        for part in [
            "topic shop.public.orders partition 2",
            "stored offset 1200 ",
            "range 5000..5600",
            "records 1200..4999 were removed",
            "UPDATE tributary.offsets SET next_offset = 5000 WHERE consumer_group = 'g''1' AND topic = 'shop.public.orders' AND partition = 2",
            "DELETE FROM tributary.offsets WHERE consumer_group = 'g''1'",
        ] {
            assert!(text.contains(part), "{part:?} not in {text}");
        }
    }

    #[test]
    fn topics_name_their_table() {
        assert_eq!(table_from_topic("shop.public.orders", Some("shop")), TableId::new("public", "orders"));
        assert_eq!(table_from_topic("a.b.shop.public.orders", None), TableId::new("public", "orders"));
        assert_eq!(
            table_from_topic("my.shop.public.order.items", Some("my.shop")),
            TableId::new("public", "order.items")
        );
    }

    #[tokio::test]
    async fn a_dropped_table_is_the_one_its_control_record_names() {
        let registry = tributary_schemas::Registry::new("http://127.0.0.1:1").expect("registry client");
        let mut decoder = EventDecoder::new(registry);
        let control = |named: bool| {
            let mut headers = vec![(CONTROL_HEADER.to_string(), Some(CONTROL_TABLE_DROPPED.as_bytes().to_vec()))];
            if named {
                headers.push((CONTROL_SCHEMA_HEADER.to_string(), Some(b"public".to_vec())));
                headers.push((CONTROL_TABLE_NAME_HEADER.to_string(), Some(b"order items$2".to_vec())));
            }
            RawRecord {
                topic: "shop.public.order_items_2_0c2b1c53".into(),
                partition: 0,
                offset: 7,
                key: None,
                value: None,
                headers,
            }
        };
        let from_topic = table_from_topic("shop.public.order_items_2_0c2b1c53", Some("shop"));
        let decoded = decode_record(&mut decoder, &control(true), &from_topic).await.expect("decoded");
        assert_eq!(decoded, Some(SinkRecord::TableDropped(TableId::new("public", "order items$2"))));
        // An older source runner's record, without the names: the topic's.
        let decoded = decode_record(&mut decoder, &control(false), &from_topic)
            .await
            .expect("decoded");
        assert_eq!(decoded, Some(SinkRecord::TableDropped(from_topic)));
    }

    #[test]
    fn consumer_tuning_defaults_yield_to_kafka_properties() {
        let base = r#"
prefix = "shop"
consumer_group = "g"
schema_registry_url = "http://127.0.0.1:8081/apis/ccompat/v7"
[postgres]
url = "postgres://u@127.0.0.1/db"
[kafka]
bootstrap_servers = "127.0.0.1:9092"
"#;
        let parse = |text: &str| -> SinkRunnerConfig { tributary_operations::config::parse(text, "test").unwrap() };
        let c = consumer_config(&parse(base)).unwrap();
        assert_eq!(c.get("fetch.queue.backoff.ms"), Some(DEFAULT_FETCH_QUEUE_BACKOFF_MS.to_string().as_str()));
        assert_eq!(c.get("isolation.level"), Some("read_committed"));
        let tuned = format!(
            "{base}properties = {{ \"fetch.queue.backoff.ms\" = \"500\", \"isolation.level\" = \"read_uncommitted\" }}\n"
        );
        let c = consumer_config(&parse(&tuned)).unwrap();
        assert_eq!(c.get("fetch.queue.backoff.ms"), Some("500"), "an operator's setting wins");
        assert_eq!(c.get("isolation.level"), Some("read_committed"), "correctness settings are never overridden");
        let reset = format!("{base}properties = {{ \"auto.offset.reset\" = \"earliest\" }}\n");
        let c = consumer_config(&parse(&reset)).unwrap();
        assert_eq!(c.get("auto.offset.reset"), Some("error"), "an offset out of range is never reset silently");
    }
}

//! What a runner knows about itself, per table: state, progress, lag,
//! failures. One `Telemetry` feeds both `GET /status` (JSON) and
//! `GET /metrics` (Prometheus text), so the two can never disagree.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use serde::Serialize;

/// Metric names: `tributary_<name>_<unit>`; the registry adds `_total` to
/// counters.
pub mod names {
    /// Change events moved (counter).
    pub const EVENTS: &str = "tributary_events";
    /// Encoded bytes moved (counter).
    pub const BYTES: &str = "tributary_bytes";
    /// Records sent to a dead-letter topic (counter).
    pub const FAILED_RECORDS: &str = "tributary_failed_records";
    /// Seconds since the source commit of the oldest change not yet visible
    /// in the destination (sink) or committed to Kafka (source); 0 when
    /// nothing is waiting (gauge, computed when read).
    pub const LAG_SECONDS: &str = "tributary_lag_seconds";
    /// Rows copied by the snapshot (gauge).
    pub const SNAPSHOT_ROWS: &str = "tributary_snapshot_rows";
    /// Estimated rows of the table to snapshot (gauge).
    pub const SNAPSHOT_ROWS_ESTIMATED: &str = "tributary_snapshot_rows_estimated";
    /// Batch latency (histogram).
    pub const BATCH_SECONDS: &str = "tributary_batch_duration_seconds";
    /// 1 while paused (gauge).
    pub const PAUSED: &str = "tributary_paused";
    /// 1 while a sink runner's consumer is a settled member of its group
    /// (gauge; sinks only).
    pub const CONSUMER_GROUP_JOINED: &str = "tributary_consumer_group_joined";
    /// Records in a sink's topics after its committed offsets (gauge; sinks
    /// only; a caught-up topic written in transactions shows 1, its last
    /// commit marker).
    pub const CONSUMER_LAG_RECORDS: &str = "tributary_consumer_lag_records";
    /// Bytes of change history (PostgreSQL: WAL the slot keeps; MySQL:
    /// binlog after the read position) the source database holds beyond
    /// the copy's position (gauge; sources only).
    pub const SOURCE_RETAINED_BYTES: &str = "tributary_source_retained_bytes";
    /// 1, labelled with the version, the runner and its kind (gauge).
    pub const BUILD_INFO: &str = "tributary_build_info";
    /// Rows compared with the source by verifications (counter; sinks).
    pub const VERIFY_ROWS: &str = "tributary_verify_rows";
    /// Verified key ranges that differed from the source (counter; sinks).
    pub const VERIFY_RANGES_DIFFERING: &str = "tributary_verify_ranges_differing";
    /// Rows that differed from the source in the table's last complete
    /// verification (gauge; sinks).
    pub const VERIFY_ROWS_DIFFERING: &str = "tributary_verify_rows_differing";
    /// When the table's last verification ended, seconds since the epoch
    /// (gauge; sinks).
    pub const VERIFY_LAST_SECONDS: &str = "tributary_verify_last_timestamp_seconds";
    /// The source position (its commit part: PostgreSQL's LSN) the table's
    /// last verification read at (gauge; sinks).
    pub const VERIFY_LAST_POSITION: &str = "tributary_verify_last_position";
    /// The source commit time of the last whole transaction applied: the
    /// destination reflects the source as of then, seconds since the epoch
    /// (gauge; sinks with `consistency = "transactional"`).
    pub const CONSISTENT_AS_OF_SECONDS: &str = "tributary_consistent_as_of_timestamp_seconds";
    /// Whole source transactions applied (counter; transactional sinks).
    pub const TRANSACTIONS: &str = "tributary_transactions";
    /// Source transactions applied in parts, a reader may have seen part
    /// of them (counter; transactional sinks).
    pub const TRANSACTIONS_SPLIT: &str = "tributary_transactions_split";
    /// Source transactions larger than the sink's memory bound applied
    /// whole, in one destination transaction held open across batches.
    pub const TRANSACTIONS_SPANNED: &str = "tributary_transactions_spanned";
}

/// The labels of a table's metrics: which runner (a copy's source and sink
/// runners have different names), which side, which table.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TableLabel {
    /// The runner's name.
    pub runner: String,
    /// `source` or `sink`: the same metric means "committed to Kafka" in a
    /// source runner and "visible in the destination" in a sink runner.
    pub kind: String,
    /// `schema.table`.
    pub table: String,
}

/// The labels of `tributary_build_info`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabel {
    version: String,
    runner: String,
    kind: String,
}

/// A table's state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "state", content = "reason")]
pub enum TableState {
    /// Copying existing rows.
    Snapshotting,
    /// Following changes.
    Streaming,
    /// Paused, by an operator or until a problem is fixed; says why.
    Paused(String),
    /// Stopped on an error that needs an operator.
    Failed(String),
}

/// The last error of a table.
#[derive(Debug, Clone, Serialize)]
pub struct LastError {
    /// The message (never row values).
    pub message: String,
    /// `retryable`, `needs-operator` or `permanent`.
    pub kind: String,
    /// When, milliseconds since the epoch.
    pub at_ms: i64,
}

/// One table's status, as served by `GET /status`.
#[derive(Debug, Clone, Serialize)]
pub struct TableStatus {
    /// State and reason.
    #[serde(flatten)]
    pub state: TableState,
    /// Rows copied by the snapshot.
    pub rows_snapshotted: u64,
    /// Estimated rows of the table, for snapshot progress.
    pub rows_estimated: Option<u64>,
    /// Events moved since start.
    pub events: u64,
    /// Events per second over the last measurement window.
    pub events_per_second: f64,
    /// Source commit time of the newest event seen, ms since the epoch.
    pub last_source_commit_seen_ms: Option<i64>,
    /// Source commit time of the newest event applied (sink) or committed to
    /// Kafka (source), ms since the epoch.
    pub last_source_commit_applied_ms: Option<i64>,
    /// Seconds since the source commit of the oldest change seen and not yet
    /// applied, or since the table (or runner) stopped: 0 when nothing
    /// waits. Computed when read, so it grows while a copy is stuck.
    pub lag_seconds: Option<f64>,
    /// Source commit time of the oldest change seen and not yet applied.
    #[serde(skip)]
    pending_since_ms: Option<i64>,
    /// When the table was paused or failed, while it is.
    #[serde(skip)]
    stopped_since_ms: Option<i64>,
    /// Records sent to the dead-letter topic.
    pub failed_records: u64,
    /// Records of its topic not consumed and applied yet (sinks, from
    /// librdkafka's statistics every 5 s).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub consumer_lag_records: Option<u64>,
    /// The dead-letter topic those went to (sinks, once one went).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dead_letter_topic: Option<String>,
    /// Last error.
    pub last_error: Option<LastError>,
    /// Why the table was last copied again while the others streamed (a
    /// rewrite the log does not carry, `POST /resync`), and when.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_copy_again: Option<CopyAgain>,
    /// The table's last verification (sinks; see docs/verification.md).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verification: Option<Verification>,
    /// The verification before it, kept when the next one starts: a
    /// repair's verification follows the one that found the differences
    /// within moments, and an operator (or a test) asking for the first
    /// one must still find it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub previous_verification: Option<Box<Verification>>,
    #[serde(skip)]
    window: (Option<Instant>, u64),
}

/// A table's last verification, as the sink found it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Verification {
    /// The verification's id (the source runner's clock when asked).
    pub id: u64,
    /// `running`, `equal`, `differs` or `not_verified`.
    pub state: String,
    /// Why it is `not_verified`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Source rows compared so far.
    pub rows_verified: u64,
    /// Key ranges compared so far.
    pub ranges_verified: u64,
    /// Key ranges that differed.
    pub ranges_differing: u64,
    /// Rows that differed (missing, extra or changed).
    pub rows_differing: u64,
    /// Whether the destination table's columns differed from the source's.
    pub schema_differs: bool,
    /// Of them, rows repaired (`[verify] repair`): removed from the
    /// destination, or asked of the source again (a verification of the
    /// table follows the repair).
    pub rows_repaired: u64,
    /// The first differing keys, each with how it differs (never values).
    pub differences: Vec<String>,
    /// The source position of its last range, `commit:index`.
    pub position: String,
    /// When its first range was compared, ms since the epoch.
    pub started_ms: i64,
    /// When its last range was, once it ended.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished_ms: Option<i64>,
    /// Last ranges compared so far (one per partition of a topic of
    /// several).
    #[serde(skip)]
    pub lasts: u64,
}

/// How many differing keys a table's status names.
pub const STATUS_DIFFERENCES: usize = 20;

/// One verified range, as the sink reports it to [`Telemetry::record_verified`].
#[derive(Debug, Clone)]
pub struct VerifiedRange<'a> {
    /// The verification's id.
    pub id: u64,
    /// The range's source position: commit and index.
    pub position: (u64, u64),
    /// Its source rows.
    pub rows: u64,
    /// Its rows that differ.
    pub differing: u64,
    /// Whether it differs: rows that differ, or a summary that does (its
    /// rows' keys come with the verification by rows that follows).
    pub differs: bool,
    /// The differing keys it names.
    pub differences: &'a [String],
    /// Why it could not be compared, if it could not.
    pub unsupported: Option<&'a str>,
    /// Whether it is the verification's last range (of its partition, on
    /// a topic of several).
    pub last: bool,
    /// How many last ranges end the verification here: 1, or on a topic of
    /// several partitions the partitions this runner compares.
    pub parts: u64,
    /// Its differing rows repaired: removed, or asked of the source again.
    pub repaired: u64,
    /// Whether the destination table's columns differed from the source's
    /// (named in `differences`).
    pub schema_differs: bool,
}

/// Why and when a table was copied again.
#[derive(Debug, Clone, Serialize)]
pub struct CopyAgain {
    /// Why (never row values).
    pub reason: String,
    /// When it was asked, ms since the epoch.
    pub at_ms: i64,
}

impl Default for TableStatus {
    fn default() -> Self {
        Self {
            state: TableState::Streaming,
            rows_snapshotted: 0,
            rows_estimated: None,
            events: 0,
            events_per_second: 0.0,
            last_source_commit_seen_ms: None,
            last_source_commit_applied_ms: None,
            lag_seconds: None,
            pending_since_ms: None,
            stopped_since_ms: None,
            failed_records: 0,
            dead_letter_topic: None,
            consumer_lag_records: None,
            last_error: None,
            last_copy_again: None,
            verification: None,
            previous_verification: None,
            window: (None, 0),
        }
    }
}

/// The runner's status, as served by `GET /status`.
#[derive(Debug, Clone, Serialize)]
pub struct RunnerStatus {
    /// Runner name.
    pub runner: String,
    /// `source` or `sink`.
    pub kind: &'static str,
    /// Whether the whole runner is paused, and why.
    pub paused: Option<String>,
    /// When the whole runner paused (an operator, or retrying an error).
    #[serde(skip)]
    paused_since_ms: Option<i64>,
    /// Per table, by `schema.table`.
    pub tables: BTreeMap<String, TableStatus>,
    /// A sink runner's membership of its consumer group (sinks only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub consumer_group: Option<ConsumerGroupStatus>,
    /// Bytes of change history the source database holds beyond the copy's
    /// position (sources whose connector can say; every 30 s).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_retained_bytes: Option<u64>,
    /// A sink applying whole source transactions: the source moment the
    /// destination reflects (`consistency = "transactional"` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub consistency: Option<ConsistencyStatus>,
}

/// What a sink applying whole source transactions reflects.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct ConsistencyStatus {
    /// The last whole source transaction applied: every table reflects the
    /// source as it was when it committed.
    pub consistent_as_of: Option<ConsistentPoint>,
    /// Whole source transactions applied since the runner started.
    pub transactions_applied: u64,
    /// Transactions applied in parts (larger than `max_buffered_bytes`, or
    /// whose END waited too long for its changes): a reader may have seen
    /// part of them.
    pub transactions_split: u64,
    /// Transactions larger than `max_buffered_bytes` applied whole, in one
    /// destination transaction held open across batches (PostgreSQL).
    pub transactions_spanned: u64,
    /// The transaction whose changes the copy waits for, and since how many
    /// seconds (a long wait: a member without all the copy's partitions, or
    /// a source runner without `transaction_metadata`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waiting_for: Option<String>,
    /// How long it has waited, in seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waiting_seconds: Option<u64>,
}

/// A source moment: a transaction and its commit time.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ConsistentPoint {
    /// The source transaction's id.
    pub transaction_id: String,
    /// Its commit time at the source, ms since the epoch.
    pub committed_at_ms: i64,
}

/// A sink runner's consumer group membership, as librdkafka's statistics
/// last reported it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ConsumerGroupStatus {
    /// librdkafka's group state (`up` once a coordinator is known).
    pub state: String,
    /// librdkafka's join state (`steady` between rebalances).
    pub join_state: String,
    /// Partitions assigned to this member.
    pub assigned_partitions: i32,
    /// Seconds since the membership last was `up`/`steady`; `null` while it is.
    pub unsettled_seconds: Option<u64>,
}

impl ConsumerGroupStatus {
    /// A settled member: a coordinator and no rebalance under way.
    pub fn settled(state: &str, join_state: &str) -> bool {
        state == "up" && join_state == "steady"
    }
}

/// How often [`Telemetry::sample_lag`] is meant to run (the admin server
/// runs it).
pub const HISTORY_EVERY: std::time::Duration = std::time::Duration::from_secs(15);
/// How far back the lag history goes.
pub const HISTORY_SPAN: std::time::Duration = std::time::Duration::from_secs(3600);

/// How often the events/s figure is recomputed.
const RATE_WINDOW_SECS: f64 = 5.0;

/// The lag of a table at `now`: from the oldest of what is waiting (a change
/// seen and not applied, the table's stop, the runner's pause), or 0.
fn lag_at(t: &TableStatus, runner_paused_since: Option<i64>, now: i64) -> f64 {
    [t.pending_since_ms, t.stopped_since_ms, runner_paused_since]
        .into_iter()
        .flatten()
        .min()
        .map_or(0.0, |since| ((now - since) as f64 / 1000.0).max(0.0))
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

struct Metrics {
    events: Family<TableLabel, Counter>,
    bytes: Family<TableLabel, Counter>,
    failed: Family<TableLabel, Counter>,
    lag: Family<TableLabel, Gauge<f64, AtomicU64>>,
    snapshot_rows: Family<TableLabel, Gauge>,
    snapshot_estimated: Family<TableLabel, Gauge>,
    batch: Histogram,
    paused: Gauge,
    group_joined: Gauge,
    consumer_lag: Family<TableLabel, Gauge>,
    retained: Gauge,
    verify_rows: Family<TableLabel, Counter>,
    verify_ranges_differing: Family<TableLabel, Counter>,
    verify_rows_differing: Family<TableLabel, Gauge>,
    verify_last: Family<TableLabel, Gauge>,
    verify_position: Family<TableLabel, Gauge>,
    consistent_as_of: Gauge,
    transactions: Counter,
    transactions_split: Gauge,
    transactions_spanned: Gauge,
}

/// Status and metrics of one runner. Cheap to clone and share.
#[derive(Clone)]
pub struct Telemetry {
    inner: Arc<Inner>,
}

struct Inner {
    status: Mutex<RunnerStatus>,
    /// Per table, the lag sampled every [`HISTORY_EVERY`] over the last
    /// [`HISTORY_SPAN`]: `(ms since the epoch, seconds)`.
    history: Mutex<BTreeMap<String, std::collections::VecDeque<(i64, f64)>>>,
    registry: Registry,
    metrics: Metrics,
    runner: String,
    kind: &'static str,
}

impl Telemetry {
    /// New telemetry for runner `runner` of `kind` (`source` or `sink`).
    pub fn new(runner: &str, kind: &'static str) -> Self {
        let mut registry = Registry::default();
        let metrics = Metrics {
            events: Family::default(),
            bytes: Family::default(),
            failed: Family::default(),
            lag: Family::default(),
            snapshot_rows: Family::default(),
            snapshot_estimated: Family::default(),
            // 1 ms .. ~65 s: a batch spans a small streaming commit to a
            // large snapshot chunk.
            batch: Histogram::new(exponential_buckets(0.001, 2.0, 17)),
            paused: Gauge::default(),
            group_joined: Gauge::default(),
            consumer_lag: Family::default(),
            retained: Gauge::default(),
            verify_rows: Family::default(),
            verify_ranges_differing: Family::default(),
            verify_rows_differing: Family::default(),
            verify_last: Family::default(),
            verify_position: Family::default(),
            consistent_as_of: Gauge::default(),
            transactions: Counter::default(),
            transactions_split: Gauge::default(),
            transactions_spanned: Gauge::default(),
        };
        registry.register(names::EVENTS, "Change events moved", metrics.events.clone());
        registry.register(names::BYTES, "Encoded bytes moved", metrics.bytes.clone());
        registry.register(names::FAILED_RECORDS, "Records sent to a dead-letter topic", metrics.failed.clone());
        registry.register(names::LAG_SECONDS, "Seconds from source commit to applied", metrics.lag.clone());
        registry.register(names::SNAPSHOT_ROWS, "Rows copied by the snapshot", metrics.snapshot_rows.clone());
        registry.register(
            names::SNAPSHOT_ROWS_ESTIMATED,
            "Estimated rows of the table being snapshotted",
            metrics.snapshot_estimated.clone(),
        );
        registry.register(names::BATCH_SECONDS, "Batch latency", metrics.batch.clone());
        registry.register(names::PAUSED, "1 while the runner is paused", metrics.paused.clone());
        let build: Family<BuildLabel, Gauge> = Family::default();
        build
            .get_or_create(&BuildLabel {
                version: env!("CARGO_PKG_VERSION").to_string(),
                runner: runner.to_string(),
                kind: kind.to_string(),
            })
            .set(1);
        registry.register(names::BUILD_INFO, "The version, name and kind of this runner", build);
        if kind == "source" {
            registry.register(
                names::SOURCE_RETAINED_BYTES,
                "Bytes of change history the source database holds beyond the copy's position",
                metrics.retained.clone(),
            );
        }
        if kind == "sink" {
            registry.register(
                names::CONSUMER_GROUP_JOINED,
                "1 while the consumer is a settled member of its group",
                metrics.group_joined.clone(),
            );
            registry.register(
                names::CONSUMER_LAG_RECORDS,
                "Records of the table's topic after the committed offsets",
                metrics.consumer_lag.clone(),
            );
            registry.register(names::VERIFY_ROWS, "Rows compared with the source", metrics.verify_rows.clone());
            registry.register(
                names::VERIFY_RANGES_DIFFERING,
                "Verified key ranges that differed from the source",
                metrics.verify_ranges_differing.clone(),
            );
            registry.register(
                names::VERIFY_ROWS_DIFFERING,
                "Rows that differed from the source in the last complete verification",
                metrics.verify_rows_differing.clone(),
            );
            registry.register(
                names::VERIFY_LAST_SECONDS,
                "When the last verification of the table ended",
                metrics.verify_last.clone(),
            );
            registry.register(
                names::CONSISTENT_AS_OF_SECONDS,
                "The source commit time of the last whole transaction applied",
                metrics.consistent_as_of.clone(),
            );
            registry.register(names::TRANSACTIONS, "Whole source transactions applied", metrics.transactions.clone());
            registry.register(
                names::TRANSACTIONS_SPLIT,
                "Source transactions applied in parts",
                metrics.transactions_split.clone(),
            );
            registry.register(
                names::TRANSACTIONS_SPANNED,
                "Source transactions over the memory bound applied whole across batches",
                metrics.transactions_spanned.clone(),
            );
            registry.register(
                names::VERIFY_LAST_POSITION,
                "The source position the last verification of the table read at",
                metrics.verify_position.clone(),
            );
        }
        Self {
            inner: Arc::new(Inner {
                history: Mutex::new(BTreeMap::new()),
                status: Mutex::new(RunnerStatus {
                    runner: runner.to_string(),
                    kind,
                    paused: None,
                    paused_since_ms: None,
                    source_retained_bytes: None,
                    tables: BTreeMap::new(),
                    consumer_group: None,
                    consistency: None,
                }),
                registry,
                metrics,
                runner: runner.to_string(),
                kind,
            }),
        }
    }

    fn with_table<R>(&self, table: &str, f: impl FnOnce(&mut TableStatus) -> R) -> R {
        // A poisoned lock only means another thread panicked mid-update of
        // counters; the data is still usable for reporting.
        let mut status = self.inner.status.lock().unwrap_or_else(|p| p.into_inner());
        f(status.tables.entry(table.to_string()).or_default())
    }

    fn with_consistency(&self, f: impl FnOnce(&mut ConsistencyStatus)) {
        let mut status = self.inner.status.lock().unwrap_or_else(|p| p.into_inner());
        f(status.consistency.get_or_insert_with(ConsistencyStatus::default));
    }

    fn label(&self, table: &str) -> TableLabel {
        TableLabel {
            runner: self.inner.runner.clone(),
            kind: self.inner.kind.to_string(),
            table: table.to_string(),
        }
    }

    /// `source` or `sink`.
    pub fn kind(&self) -> &'static str {
        self.inner.kind
    }

    /// Sets a table's state. A pause or failure starts the table's lag
    /// clock: nothing proves the copy current while it lasts.
    pub fn set_state(&self, table: &str, state: TableState) {
        self.with_table(table, |t| {
            match state {
                TableState::Paused(_) | TableState::Failed(_) => {
                    t.stopped_since_ms.get_or_insert_with(now_ms);
                }
                TableState::Snapshotting | TableState::Streaming => t.stopped_since_ms = None,
            }
            t.state = state
        });
    }

    /// Records events moved for a table, and the newest source commit time
    /// among them.
    pub fn record_events(&self, table: &str, events: u64, bytes: u64, source_commit_ms: Option<i64>) {
        let label = self.label(table);
        self.inner.metrics.events.get_or_create(&label).inc_by(events);
        self.inner.metrics.bytes.get_or_create(&label).inc_by(bytes);
        self.with_table(table, |t| {
            t.events += events;
            if let Some(ms) = source_commit_ms {
                t.last_source_commit_seen_ms = Some(t.last_source_commit_seen_ms.map_or(ms, |m| m.max(ms)));
            }
            let now = Instant::now();
            match t.window.0 {
                None => t.window = (Some(now), t.events),
                Some(start) => {
                    let secs = now.duration_since(start).as_secs_f64();
                    if secs >= RATE_WINDOW_SECS {
                        t.events_per_second = (t.events - t.window.1) as f64 / secs;
                        t.window = (Some(now), t.events);
                    }
                }
            }
        });
    }

    /// Records that a change committed at `source_commit_ms` was seen (read
    /// from the source, or consumed from Kafka) and is not applied yet: the
    /// table's lag counts from the oldest such change until
    /// [`Telemetry::record_applied`].
    pub fn record_pending(&self, table: &str, source_commit_ms: i64) {
        self.with_table(table, |t| {
            t.pending_since_ms = Some(t.pending_since_ms.map_or(source_commit_ms, |m| m.min(source_commit_ms)));
        });
    }

    /// Records that everything seen of `table` is applied (visible in the
    /// destination, or committed to Kafka for a source), the newest change
    /// committed at `source_commit_ms` if the batch held changes.
    pub fn record_applied(&self, table: &str, source_commit_ms: Option<i64>) {
        self.with_table(table, |t| {
            if let Some(ms) = source_commit_ms {
                t.last_source_commit_applied_ms = Some(ms);
            }
            t.pending_since_ms = None;
        });
    }

    /// Records a record sent to the dead-letter topic.
    pub fn record_failed(&self, table: &str, error: &str, kind: &str) {
        self.inner.metrics.failed.get_or_create(&self.label(table)).inc();
        self.with_table(table, |t| t.failed_records += 1);
        self.record_error(table, error, kind);
    }

    /// Records how much change history the source database keeps for the
    /// copy.
    pub fn set_retained_bytes(&self, bytes: u64) {
        self.inner.metrics.retained.set(bytes as i64);
        let mut status = self.inner.status.lock().unwrap_or_else(|p| p.into_inner());
        status.source_retained_bytes = Some(bytes);
    }

    /// Records a sink table's consumer lag (summed over its partitions).
    pub fn set_consumer_lag(&self, table: &str, records: u64) {
        self.inner
            .metrics
            .consumer_lag
            .get_or_create(&self.label(table))
            .set(records as i64);
        self.with_table(table, |t| t.consumer_lag_records = Some(records));
    }

    /// Names the dead-letter topic a table's failed records go to.
    pub fn set_dead_letter_topic(&self, table: &str, topic: &str) {
        self.with_table(table, |t| {
            if t.dead_letter_topic.as_deref() != Some(topic) {
                t.dead_letter_topic = Some(topic.to_string());
            }
        });
    }

    /// Records each table's lag now in its history, and forgets samples
    /// older than [`HISTORY_SPAN`].
    pub fn sample_lag(&self) {
        let now = now_ms();
        let status = self.status_at(now);
        let mut history = self.inner.history.lock().unwrap_or_else(|p| p.into_inner());
        let oldest = now - HISTORY_SPAN.as_millis() as i64;
        for (table, t) in status.tables {
            let h = history.entry(table).or_default();
            h.push_back((now, t.lag_seconds.unwrap_or(0.0)));
            while h.front().is_some_and(|(at, _)| *at < oldest) {
                h.pop_front();
            }
        }
    }

    /// The lag history per table, oldest sample first.
    pub fn lag_history(&self) -> BTreeMap<String, Vec<(i64, f64)>> {
        let history = self.inner.history.lock().unwrap_or_else(|p| p.into_inner());
        history.iter().map(|(t, h)| (t.clone(), h.iter().copied().collect())).collect()
    }

    /// Records that a table is copied again, and why.
    pub fn record_copy_again(&self, table: &str, reason: &str) {
        self.with_table(table, |t| t.last_copy_again = Some(CopyAgain { reason: reason.to_string(), at_ms: now_ms() }));
    }

    /// Records one verified key range of a table: a range of a new
    /// verification starts its entry anew; the last one ends it (`equal`
    /// or `differs`, or `not_verified` if a range could not be compared).
    pub fn record_verified(&self, table: &str, range: &VerifiedRange<'_>) {
        let label = self.label(table);
        let m = &self.inner.metrics;
        m.verify_rows.get_or_create(&label).inc_by(range.rows);
        if range.differs {
            m.verify_ranges_differing.get_or_create(&label).inc();
        }
        let now = now_ms();
        let ended = self.with_table(table, |t| {
            if t.verification.as_ref().is_some_and(|v| v.id != range.id) {
                t.previous_verification = t.verification.take().map(Box::new);
            }
            let v = match &mut t.verification {
                Some(v) if v.id == range.id => v,
                slot => slot.insert(Verification {
                    id: range.id,
                    state: "running".into(),
                    reason: None,
                    rows_verified: 0,
                    ranges_verified: 0,
                    ranges_differing: 0,
                    rows_differing: 0,
                    schema_differs: false,
                    rows_repaired: 0,
                    differences: Vec::new(),
                    position: String::new(),
                    started_ms: now,
                    finished_ms: None,
                    lasts: 0,
                }),
            };
            v.rows_verified += range.rows;
            v.ranges_verified += 1;
            v.rows_differing += range.differing;
            v.rows_repaired += range.repaired;
            v.ranges_differing += u64::from(range.differs);
            let room = STATUS_DIFFERENCES.saturating_sub(v.differences.len());
            v.differences.extend(range.differences.iter().take(room).cloned());
            v.position = format!("{}:{}", range.position.0, range.position.1);
            v.schema_differs |= range.schema_differs;
            if let Some(why) = range.unsupported {
                v.state = "not_verified".into();
                v.reason.get_or_insert_with(|| why.to_string());
            }
            v.lasts += u64::from(range.last);
            // A range after the end (a partition assigned to this runner
            // late) still counts: an `equal` it contradicts becomes
            // `differs`.
            if (range.last && v.lasts >= range.parts) || v.finished_ms.is_some() {
                // Columns that differ explain ranges that could not be
                // read back: the table differs.
                if v.schema_differs {
                    v.state = "differs".into();
                } else if v.state == "running" || v.state == "equal" {
                    v.state = if v.rows_differing > 0 || v.ranges_differing > 0 {
                        "differs"
                    } else {
                        "equal"
                    }
                    .into();
                }
                v.finished_ms = Some(now);
                Some(v.rows_differing)
            } else {
                None
            }
        });
        if let Some(differing) = ended {
            m.verify_rows_differing.get_or_create(&label).set(differing as i64);
            m.verify_last.get_or_create(&label).set(now / 1000);
            m.verify_position.get_or_create(&label).set(range.position.0 as i64);
        }
    }

    /// Records an error of a table without a failed record (e.g. a retry).
    pub fn record_error(&self, table: &str, error: &str, kind: &str) {
        self.with_table(table, |t| {
            t.last_error = Some(LastError {
                message: error.to_string(),
                kind: kind.to_string(),
                at_ms: now_ms(),
            })
        });
    }

    /// One table's status, if the table was seen.
    pub fn table(&self, table: &str) -> Option<TableStatus> {
        let status = self.inner.status.lock().unwrap_or_else(|p| p.into_inner());
        let mut t = status.tables.get(table).cloned()?;
        t.lag_seconds = Some(lag_at(&t, status.paused_since_ms, now_ms()));
        Some(t)
    }

    /// Failed records of `table` so far.
    pub fn failed_records(&self, table: &str) -> u64 {
        self.table(table).map_or(0, |t| t.failed_records)
    }

    /// Records snapshot progress of a table.
    pub fn record_snapshot(&self, table: &str, rows: u64, estimated: Option<u64>) {
        let label = self.label(table);
        self.inner.metrics.snapshot_rows.get_or_create(&label).set(rows as i64);
        if let Some(e) = estimated {
            self.inner.metrics.snapshot_estimated.get_or_create(&label).set(e as i64);
        }
        self.with_table(table, |t| {
            t.rows_snapshotted = rows;
            t.rows_estimated = estimated;
        });
    }

    /// Records one batch's latency.
    pub fn record_batch_seconds(&self, seconds: f64) {
        self.inner.metrics.batch.observe(seconds);
    }

    /// Sets or clears the runner-wide pause and its reason. A pause starts
    /// every table's lag clock.
    pub fn set_paused(&self, reason: Option<String>) {
        self.inner.metrics.paused.set(i64::from(reason.is_some()));
        let mut status = self.inner.status.lock().unwrap_or_else(|p| p.into_inner());
        if reason.is_some() {
            status.paused_since_ms.get_or_insert_with(now_ms);
        } else {
            status.paused_since_ms = None;
        }
        status.paused = reason;
    }

    /// The runner-wide pause's reason, if paused.
    pub fn paused_reason(&self) -> Option<String> {
        self.inner.status.lock().unwrap_or_else(|p| p.into_inner()).paused.clone()
    }

    /// Records whole source transactions applied, the last of them `last`
    /// (transactional sinks).
    pub fn record_transactions(&self, applied: u64, last: Option<ConsistentPoint>) {
        self.inner.metrics.transactions.inc_by(applied);
        self.with_consistency(|c| {
            c.transactions_applied += applied;
            // Never back, as the destination's row: a transaction the
            // source sent again after a restart is older than what the
            // destination already reflects.
            if let Some(last) = last {
                let older = c
                    .consistent_as_of
                    .as_ref()
                    .is_some_and(|now| now.committed_at_ms > last.committed_at_ms);
                if !older {
                    self.inner.metrics.consistent_as_of.set(last.committed_at_ms / 1000);
                    c.consistent_as_of = Some(last);
                }
            }
        });
    }

    /// Records what whole transactions wait for, how many went in parts
    /// and how many over the memory bound went whole across batches
    /// (transactional sinks).
    pub fn set_transactions_waiting(&self, waiting: Option<(String, u64)>, split: u64, spanned: u64) {
        self.inner.metrics.transactions_split.set(split as i64);
        self.inner.metrics.transactions_spanned.set(spanned as i64);
        self.with_consistency(|c| {
            c.transactions_split = split;
            c.transactions_spanned = spanned;
            c.waiting_seconds = waiting.as_ref().map(|(_, s)| *s);
            c.waiting_for = waiting.map(|(id, _)| id);
        });
    }

    /// Records the consumer group membership (sink runners).
    pub fn set_consumer_group(&self, group: ConsumerGroupStatus) {
        let settled = ConsumerGroupStatus::settled(&group.state, &group.join_state);
        self.inner.metrics.group_joined.set(i64::from(settled));
        let mut status = self.inner.status.lock().unwrap_or_else(|p| p.into_inner());
        status.consumer_group = Some(group);
    }

    /// A snapshot of the status, with each table's lag as of now.
    pub fn status(&self) -> RunnerStatus {
        self.status_at(now_ms())
    }

    fn status_at(&self, now: i64) -> RunnerStatus {
        let mut status = self.inner.status.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let paused_since = status.paused_since_ms;
        for t in status.tables.values_mut() {
            t.lag_seconds = Some(lag_at(t, paused_since, now));
        }
        status
    }

    /// The metrics in the Prometheus text format, the lag as of now.
    pub fn metrics_text(&self) -> String {
        // The lag gauges are set here, from the same numbers as `/status`:
        // a gauge set only when something is applied would freeze while a
        // copy is stuck.
        for (table, t) in self.status().tables {
            self.inner
                .metrics
                .lag
                .get_or_create(&self.label(&table))
                .set(t.lag_seconds.unwrap_or(0.0));
        }
        let mut out = String::new();
        // Encoding into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.inner.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_and_metrics_agree() {
        let t = Telemetry::new("r1", "sink");
        t.record_events("public.orders", 10, 1000, Some(now_ms()));
        t.record_failed("public.orders", "value too long for column note", "permanent");
        t.record_pending("public.orders", now_ms() - 2000);
        let s = t.status();
        let orders = &s.tables["public.orders"];
        assert_eq!(orders.events, 10);
        assert_eq!(orders.failed_records, 1);
        assert!(orders.lag_seconds.unwrap_or(0.0) >= 2.0);
        let text = t.metrics_text();
        let labels = r#"{runner="r1",kind="sink",table="public.orders"}"#;
        assert!(text.contains(&format!("tributary_events_total{labels} 10")), "{text}");
        assert!(text.contains(&format!("tributary_failed_records_total{labels} 1")), "{text}");
        assert!(text.contains(&format!("tributary_lag_seconds{labels} 2.")), "{text}");
        assert!(text.contains(r#"tributary_build_info{version=""#), "{text}");
    }

    #[test]
    fn a_verification_ends_with_its_partitions_and_a_late_difference_still_counts() {
        let t = Telemetry::new("r1", "sink");
        let range = |differing: u64, last: bool| VerifiedRange {
            id: 7,
            position: (10, 0),
            rows: 100,
            differing,
            differs: differing > 0,
            differences: &[],
            unsupported: None,
            last,
            parts: 2,
            repaired: 0,
            schema_differs: false,
        };
        let state = |t: &Telemetry| t.table("s.t").and_then(|t| t.verification).map(|v| (v.state, v.rows_verified));
        t.record_verified("s.t", &range(0, true));
        assert_eq!(state(&t), Some(("running".into(), 100)), "one of two partitions");
        t.record_verified("s.t", &range(0, true));
        assert_eq!(state(&t), Some(("equal".into(), 200)));
        // A partition this runner took over after the end.
        t.record_verified("s.t", &range(3, true));
        assert_eq!(state(&t), Some(("differs".into(), 300)));
    }

    #[test]
    fn the_lag_grows_while_nothing_is_applied_and_is_zero_when_caught_up() {
        let t = Telemetry::new("r1", "sink");
        let lag = |t: &Telemetry, now: i64| t.status_at(now).tables["s.t"].lag_seconds.unwrap_or(-1.0);
        t.record_events("s.t", 1, 10, Some(1_000));
        assert_eq!(lag(&t, 50_000), 0.0, "nothing seen and unapplied: caught up");
        // Seen at 1 s, stuck: the lag keeps growing with the clock.
        t.record_pending("s.t", 1_000);
        t.record_pending("s.t", 3_000);
        assert_eq!(lag(&t, 11_000), 10.0);
        assert_eq!(lag(&t, 41_000), 40.0);
        t.record_applied("s.t", Some(3_000));
        assert_eq!(lag(&t, 42_000), 0.0);
        assert_eq!(t.status_at(42_000).tables["s.t"].last_source_commit_applied_ms, Some(3_000));
    }

    #[test]
    fn a_paused_table_or_runner_lags_from_its_pause() {
        let t = Telemetry::new("r1", "source");
        t.set_state("s.a", TableState::Streaming);
        t.set_state("s.b", TableState::Streaming);
        let before = now_ms();
        t.set_state("s.a", TableState::Paused("by an operator".into()));
        let s = t.status_at(before + 30_000);
        assert!(s.tables["s.a"].lag_seconds.unwrap_or(0.0) >= 29.0, "{s:?}");
        assert_eq!(s.tables["s.b"].lag_seconds, Some(0.0));
        // A second pause report does not move the clock; streaming stops it.
        t.set_state("s.a", TableState::Paused("still".into()));
        assert!(t.status_at(before + 60_000).tables["s.a"].lag_seconds.unwrap_or(0.0) >= 59.0);
        t.set_state("s.a", TableState::Streaming);
        assert_eq!(t.status_at(before + 60_000).tables["s.a"].lag_seconds, Some(0.0));
        // The whole runner retrying: every table.
        t.set_paused(Some("retrying: broker down".into()));
        let s = t.status_at(before + 20_000);
        assert!(s.tables.values().all(|x| x.lag_seconds.unwrap_or(0.0) >= 19.0), "{s:?}");
        t.set_paused(None);
        assert!(t.status_at(before + 20_000).tables.values().all(|x| x.lag_seconds == Some(0.0)));
    }

    #[test]
    fn the_lag_history_keeps_the_last_hour() {
        let t = Telemetry::new("r1", "sink");
        t.record_pending("s.t", now_ms() - 5_000);
        t.sample_lag();
        t.sample_lag();
        let h = t.lag_history();
        assert_eq!(h["s.t"].len(), 2);
        assert!(h["s.t"][0].1 >= 5.0);
        // An old sample goes at the next one.
        if let Some(h) = t.inner.history.lock().unwrap_or_else(|p| p.into_inner()).get_mut("s.t") {
            h[0].0 -= 3_700_000;
        }
        t.sample_lag();
        assert_eq!(t.lag_history()["s.t"].len(), 2);
    }
}

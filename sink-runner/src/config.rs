//! The sink runner's config file.
//!
//! ```toml
//! prefix = "shop"                       # the source runner's topic prefix
//! consumer_group = "shop-to-warehouse"
//! schema_registry_url = "http://127.0.0.1:8081/apis/ccompat/v7"
//!
//! [kafka]
//! bootstrap_servers = "127.0.0.1:9092"
//!
//! [postgres]                           # or [bigquery]: exactly one destination
//! url = "env:DESTINATION_URL"
//! ```

use std::time::Duration;

use serde::Deserialize;
use tributary_connectors::sinks::Sinks;
use tributary_connectors::Sink;
use tributary_operations::admin::AdminConfig;
use tributary_operations::config::{ConfigError, Validate};
use tributary_operations::kafka::KafkaConfig;
use tributary_operations::registry::SchemaRegistryConfig;

/// Change events per batch. Big enough to amortise a destination
/// transaction over thousands of rows during a snapshot; a batch is flushed
/// earlier by bytes or time.
pub const DEFAULT_BATCH_MAX_RECORDS: usize = 20_000;
/// Bytes of raw (Avro) record data per batch, on destinations where a write
/// costs only time (`SinkConfig::writes_when_idle`). Three batches are in
/// memory at once (applied, decoded, buffering), and a decoded row takes
/// several times its Avro bytes: in the benchmark's 1M-row snapshot each
/// MiB here cost about 11 MiB of the sink's peak RSS. At 1 MiB (about 4,000
/// of its rows per `COPY`) the peak was 56 MiB against 94 MiB at 4 MiB
/// (both with a 2 MiB prefetch queue), for 147-160k against 193-200k rows/s
/// applied by the sink alone; end to end the snapshot stayed at 104-114k
/// rows/s, where the source bounds it.
pub const DEFAULT_BATCH_MAX_BYTES: usize = 1024 * 1024;
/// `batch_max_bytes` on destinations that bill or queue each write
/// (BigQuery, Snowflake, Redshift): four times fewer statements per
/// snapshot, for the memory.
pub const DEFAULT_BATCH_MAX_BYTES_BILLED: usize = 4 * 1024 * 1024;
/// How long the first record of a batch waits for more. Short: it only
/// groups bursts. At 500 ms the benchmark measured a p99 of 922 ms from
/// source commit to destination at 1,000 events/s, against a 500 ms target;
/// 100 ms still gathers ~100 events per transaction at that rate.
pub const DEFAULT_BATCH_LINGER_MS: u64 = 100;
/// How long the consumer must have given nothing before a batch is applied
/// without waiting for the rest of its linger, on destinations where a
/// write costs only time (see `SinkConfig::writes_when_idle`).
pub const DEFAULT_BATCH_IDLE_MS: u64 = 2;
/// How long the bytes of all tables' pending batches may add up to before
/// the largest is flushed early (4 batches' worth).
pub const DEFAULT_MAX_BUFFERED_BYTES: usize = 16 * 1024 * 1024;
/// librdkafka's prefetch queue per runner, in KiB. Its default (64 MiB)
/// alone would take half the memory budget. 16 MiB cost 25 MiB of peak RSS
/// over 4 MiB in the 1M-row snapshot, and the sink alone applied no faster
/// with it (172-230k against 193-200k rows/s); 2 MiB is a few batches of
/// the broker's fetches (`max.partition.fetch.bytes`, 1 MiB), refilled
/// within `fetch.queue.backoff.ms`.
pub const DEFAULT_QUEUED_MAX_KBYTES: u32 = 2 * 1024;
/// How long librdkafka waits before fetching again once its prefetch queue
/// was full, in ms. Its default (1000 ms) stalled a snapshot for up to a
/// second each time the runner caught up with the queue: a 1M-row snapshot
/// applied at 67k rows/s with it, 103k rows/s with 10 ms.
pub const DEFAULT_FETCH_QUEUE_BACKOFF_MS: u32 = 10;
/// How often new topics matching the pattern are looked for. 5 s: a new
/// source table reaches the destination within seconds of its first event.
pub const DEFAULT_TOPIC_REFRESH_MS: u64 = 5_000;
/// How long the consumer may stay out of a settled group membership before
/// the runner leaves the group and joins again, in seconds. A rebalance
/// legitimately waits for every member (a stopped one until its session
/// times out, 45 s by default) and a broker outage keeps it out for as long
/// as it lasts; past this, a member that lost its partitions and never
/// joined again (seen once by the fault suite after a broker restart,
/// docs/faults.md) copies nothing and says nothing.
pub const DEFAULT_GROUP_REJOIN_AFTER_SECS: u64 = 120;
/// How often librdkafka reports its statistics, of which the runner reads
/// the consumer group's state (see the runner's group watchdog).
pub const DEFAULT_STATISTICS_INTERVAL_MS: u64 = 5_000;

/// The whole config file of a sink runner. Unknown keys are refused: the
/// destination sections (`[postgres]`, `[bigquery]`, ... as registered in
/// `connectors/src/sinks/mod.rs`) take every key that is not a field here,
/// and refuse any that is not a section they know.
#[derive(Debug, Clone, Deserialize)]
pub struct SinkRunnerConfig {
    /// How to reach Kafka.
    pub kafka: KafkaConfig,
    /// Confluent-compatible schema registry, e.g.
    /// `http://127.0.0.1:8081/apis/ccompat/v7`.
    pub schema_registry_url: String,
    /// Credentials and CA of the registry (`[schema_registry]`).
    #[serde(default)]
    pub schema_registry: SchemaRegistryConfig,
    /// The source runner's topic prefix; the default `topics` pattern is
    /// `^<prefix>\..*`. Required unless `topics` is set.
    #[serde(default)]
    pub prefix: Option<String>,
    /// Topics to copy, as a regular expression starting with `^` (matched
    /// by librdkafka against every topic name). Dead-letter topics and the
    /// source's offsets topic are always left out.
    #[serde(default)]
    pub topics: Option<String>,
    /// Kafka consumer group, and the key of this copy's stored offsets in
    /// the destination. Runners sharing it share the work.
    pub consumer_group: String,
    /// Change events per batch.
    #[serde(default = "default_batch_max_records")]
    pub batch_max_records: usize,
    /// Raw record bytes per batch. Default: DEFAULT_BATCH_MAX_BYTES, or
    /// DEFAULT_BATCH_MAX_BYTES_BILLED on destinations that bill or queue
    /// each write; see [`SinkRunnerConfig::batch_max_bytes`].
    #[serde(default)]
    pub batch_max_bytes: Option<usize>,
    /// How long a batch waits for more records, in milliseconds.
    #[serde(default = "default_batch_linger_ms")]
    pub batch_linger_ms: u64,
    /// A batch is applied once the consumer has given nothing more for this
    /// long (and no batch is being applied), in milliseconds; 0: it waits
    /// the whole linger. Default: DEFAULT_BATCH_IDLE_MS, or 0 on
    /// destinations that bill or queue each write.
    #[serde(default)]
    pub batch_idle_ms: Option<u64>,
    /// Bytes of all pending batches together before the largest is flushed.
    #[serde(default = "default_max_buffered_bytes")]
    pub max_buffered_bytes: usize,
    /// Seconds out of a settled consumer group membership before the
    /// runner leaves the group and joins it again.
    #[serde(default = "default_group_rejoin_after_secs")]
    pub group_rejoin_after_secs: u64,
    /// Suffix of a topic's dead-letter topic.
    #[serde(default = "default_dlq_suffix")]
    pub dlq_topic_suffix: String,
    /// The admin server (status, metrics, pause/resume). Its default port,
    /// 8091, leaves 8090 to a source runner on the same machine.
    #[serde(default = "default_admin")]
    pub admin: AdminConfig,
    /// What a verification that finds rows different does (`[verify]`,
    /// see docs/verification.md).
    #[serde(default)]
    pub verify: SinkVerifyConfig,
    /// What a reader of the destination sees (docs/consistency.md):
    /// `per_table` (each table applied on its own, the fastest) or
    /// `transactional` (only whole source transactions, every table a
    /// transaction changed in one destination transaction, and the source
    /// moment the destination reflects kept in `tributary.consistent_as_of`;
    /// needs `prefix` and the source runner's `transaction_metadata`).
    #[serde(default)]
    pub consistency: Consistency,
    /// A migration's cutover from the console (`[cutover]`,
    /// docs/migration.md): off without the section.
    #[serde(default)]
    pub cutover: Option<CutoverConfig>,
    /// The destination: exactly one section, e.g. `[postgres]` or
    /// `[bigquery]`.
    #[serde(flatten)]
    pub destination: Sinks,
}

/// How long a cutover's catch-up may lag, by default (seconds).
pub const DEFAULT_CUTOVER_MAX_LAG_SECONDS: u64 = 5;
/// How long each of a cutover's waits may take, by default (seconds).
pub const DEFAULT_CUTOVER_TIMEOUT_SECONDS: u64 = 600;

/// `[cutover]`: what a cutover asked from the console (`POST /cutover`)
/// does, as `sink-runner cutover`'s flags say it; its `source_config` is
/// also that command's when it is given none.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CutoverConfig {
    /// The source runner's config file (its database and admin server).
    pub source_config: std::path::PathBuf,
    /// How the source stops taking writes: `sql` (the documented SQL) or
    /// `none` (it takes none already). A console cannot wait for an
    /// operator's Enter.
    #[serde(default)]
    pub read_only: CutoverReadOnly,
    /// The lag every table must be within before the source is made
    /// read-only.
    #[serde(default = "default_cutover_max_lag")]
    pub max_lag_seconds: u64,
    /// How long each wait may take.
    #[serde(default = "default_cutover_timeout")]
    pub timeout_seconds: u64,
    /// Keep the sink's position columns (the copy is to go on).
    #[serde(default)]
    pub keep_position_columns: bool,
}

/// `read_only` of `[cutover]`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CutoverReadOnly {
    /// The cutover runs the documented SQL.
    #[default]
    Sql,
    /// The source takes no writes already.
    None,
}

fn default_cutover_max_lag() -> u64 {
    DEFAULT_CUTOVER_MAX_LAG_SECONDS
}
fn default_cutover_timeout() -> u64 {
    DEFAULT_CUTOVER_TIMEOUT_SECONDS
}

/// librdkafka's setting of how a group's partitions are shared out.
pub const ASSIGNMENT_STRATEGY: &str = "partition.assignment.strategy";
/// The assignment of a transactional copy: Kafka's range assignor gives a
/// topic's only partition to the first member, the same member for every
/// topic, so one member takes the whole copy and the others stand by.
pub const TRANSACTIONAL_ASSIGNMENT: &str = "range";

/// `consistency` of a sink runner.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Consistency {
    /// Each table is applied on its own: a source transaction that changed
    /// two tables may be visible in one before the other.
    #[default]
    PerTable,
    /// Only whole source transactions are applied, each with every table
    /// it changed in one destination transaction (`transaction` module).
    Transactional,
}

/// `[verify]` of a sink runner.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SinkVerifyConfig {
    /// Repair what a verification finds different: rows only the
    /// destination has are removed, and the source runner is asked (on the
    /// copy's requests topic, which needs `prefix`) to send the rows
    /// missing or changed again, then to verify the table again. Off: the
    /// table is reported as differing (status, metrics, alerts) and left
    /// as it is.
    #[serde(default)]
    pub repair: bool,
}

fn default_batch_max_records() -> usize {
    DEFAULT_BATCH_MAX_RECORDS
}
fn default_batch_linger_ms() -> u64 {
    DEFAULT_BATCH_LINGER_MS
}
fn default_group_rejoin_after_secs() -> u64 {
    DEFAULT_GROUP_REJOIN_AFTER_SECS
}
fn default_max_buffered_bytes() -> usize {
    DEFAULT_MAX_BUFFERED_BYTES
}
fn default_dlq_suffix() -> String {
    tributary_schemas::topic::DLQ_SUFFIX.to_string()
}

impl Validate for SinkRunnerConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        self.kafka.validate("kafka")?;
        self.admin.validate()?;
        if let Some(c) = &self.cutover {
            if c.source_config.as_os_str().is_empty() {
                return Err(ConfigError::invalid("cutover.source_config", "must name the source runner's config file"));
            }
            if c.timeout_seconds == 0 {
                return Err(ConfigError::invalid("cutover.timeout_seconds", "must be at least 1"));
            }
            if self.admin.listen == "off" {
                return Err(ConfigError::invalid("cutover", "needs the admin server ([admin] listen)"));
            }
        }
        if self.schema_registry_url.trim().is_empty() {
            return Err(ConfigError::invalid("schema_registry_url", "must not be empty"));
        }
        if !self.schema_registry_url.starts_with("http://") && !self.schema_registry_url.starts_with("https://") {
            return Err(ConfigError::invalid("schema_registry_url", "must be an http:// or https:// URL"));
        }
        match (&self.prefix, &self.topics) {
            (None, None) => {
                return Err(ConfigError::invalid(
                    "prefix",
                    "is required unless `topics` is set (it names the source runner's topics)",
                ))
            }
            (Some(p), _) if p.trim().is_empty() => {
                return Err(ConfigError::invalid("prefix", "must not be empty"));
            }
            _ => {}
        }
        if let Some(t) = &self.topics {
            if !t.starts_with('^') {
                return Err(ConfigError::invalid(
                    "topics",
                    "must be a regular expression starting with ^ (librdkafka treats anything else as one topic name)",
                ));
            }
            regex::Regex::new(t)
                .map_err(|e| ConfigError::invalid("topics", format!("is not a valid regular expression: {e}")))?;
        }
        self.schema_registry.validate()?;
        if self.consistency == Consistency::Transactional && (self.prefix.is_none() || self.topics.is_some()) {
            return Err(ConfigError::invalid(
                "consistency",
                "\"transactional\" needs `prefix` and no `topics`: the copy's transaction topic, \
                 <prefix>.transaction, says which changes make each source transaction",
            ));
        }
        if self.consistency == Consistency::Transactional
            && self
                .kafka
                .properties
                .get(ASSIGNMENT_STRATEGY)
                .is_some_and(|v| v.trim() != TRANSACTIONAL_ASSIGNMENT)
        {
            return Err(ConfigError::invalid(
                format!("kafka.properties.\"{ASSIGNMENT_STRATEGY}\""),
                "must be \"range\" (or left out) with consistency = \"transactional\": one member takes every \
                 partition of the copy, the others stand by",
            ));
        }
        if self.verify.repair && self.prefix.is_none() {
            return Err(ConfigError::invalid(
                "verify.repair",
                "needs `prefix`: repairs are asked on the copy's requests topic, named after it",
            ));
        }
        if self.consumer_group.trim().is_empty() {
            return Err(ConfigError::invalid("consumer_group", "must not be empty"));
        }
        if self.batch_max_records == 0 {
            return Err(ConfigError::invalid("batch_max_records", "must be greater than 0"));
        }
        if self.batch_max_bytes.is_some_and(|b| b < 1024) {
            return Err(ConfigError::invalid("batch_max_bytes", "must be at least 1024"));
        }
        if self.max_buffered_bytes < self.batch_max_bytes() {
            return Err(ConfigError::invalid("max_buffered_bytes", "must be at least batch_max_bytes"));
        }
        if self.batch_linger_ms == 0 || self.batch_linger_ms > 60_000 {
            return Err(ConfigError::invalid("batch_linger_ms", "must be between 1 and 60000"));
        }
        if self.batch_idle_ms.is_some_and(|ms| ms >= self.batch_linger_ms) {
            return Err(ConfigError::invalid("batch_idle_ms", "must be shorter than batch_linger_ms (0 turns it off)"));
        }
        if !(10..=86_400).contains(&self.group_rejoin_after_secs) {
            return Err(ConfigError::invalid("group_rejoin_after_secs", "must be between 10 and 86400"));
        }
        if self.dlq_topic_suffix.is_empty() {
            return Err(ConfigError::invalid("dlq_topic_suffix", "must not be empty"));
        }
        if !tributary_schemas::topic::is_legal_topic_name(&self.dlq_topic_suffix) || self.dlq_topic_suffix.len() > 64 {
            return Err(ConfigError::invalid(
                "dlq_topic_suffix",
                "must be at most 64 of the characters Kafka allows in topic names: a-z, A-Z, 0-9, '.', '_', '-'",
            ));
        }
        let (section, destination) = self.destination.one()?;
        destination.validate_at(section)?;
        let group = destination.consumer_group();
        if let Some(g) = group {
            if g != self.consumer_group {
                return Err(ConfigError::invalid(
                    format!("{section}.consumer_group"),
                    "conflicts with consumer_group: leave it out (it is taken from consumer_group)",
                ));
            }
        }
        Ok(())
    }
}

impl SinkRunnerConfig {
    /// The subscription pattern. With `prefix`: exactly the copy's table
    /// topics, `<prefix>.<schema>.<table>` with two dot-free parts (a
    /// schema or table name never brings a dot into a topic name), so a
    /// copy whose prefix is this one's plus a dot (`shop.eu` beside `shop`)
    /// is never consumed, and dead-letter topics (`.dlq` adds a part) are
    /// not matched at all. See `tributary_schemas::topic`.
    pub fn topic_pattern(&self) -> String {
        match (&self.topics, &self.prefix) {
            (Some(t), _) => t.clone(),
            (None, Some(p)) if self.consistency == Consistency::Transactional => {
                format!("^{}\\.([^.]+\\.[^.]+|transaction)$", regex::escape(p))
            }
            (None, Some(p)) => format!("^{}\\.[^.]+\\.[^.]+$", regex::escape(p)),
            // validate() refuses this; a pattern that matches nothing.
            (None, None) => "^$".to_string(),
        }
    }

    /// Whether a topic the pattern matched is still left out: anything that
    /// is not a table topic of this copy, the copy's offsets topic,
    /// dead-letter topics (a topic whose name is a copied topic's plus
    /// `dlq_topic_suffix`) and Kafka's internal topics (`__*`). A table
    /// named `dlq` (`<prefix>.<schema>.dlq`) is a table topic and copied.
    pub fn is_excluded(&self, topic: &str) -> bool {
        use tributary_schemas::topic::{is_dead_letter_topic, is_table_topic, OFFSETS_TOPIC_SUFFIX};
        if topic.starts_with("__") {
            return true;
        }
        if self.transaction_topic().as_deref() == Some(topic) {
            return false;
        }
        match (&self.topics, &self.prefix) {
            (None, Some(p)) => {
                !is_table_topic(p, topic)
                    || is_dead_letter_topic(topic, &self.dlq_topic_suffix, |t| is_table_topic(p, t))
            }
            _ => {
                if topic.ends_with(OFFSETS_TOPIC_SUFFIX) {
                    return true;
                }
                // validate() compiled it; a pattern that does not compile
                // copies nothing.
                let Ok(pattern) = regex::Regex::new(&self.topic_pattern()) else {
                    return true;
                };
                !pattern.is_match(topic) || is_dead_letter_topic(topic, &self.dlq_topic_suffix, |t| pattern.is_match(t))
            }
        }
    }

    /// The copy's transaction topic, read in `transactional` consistency
    /// only.
    pub fn transaction_topic(&self) -> Option<String> {
        match (self.consistency, &self.prefix) {
            (Consistency::Transactional, Some(p)) => Some(tributary_schemas::records::transaction::topic(p)),
            _ => None,
        }
    }

    /// The dead-letter topic of a topic.
    pub fn dlq_topic(&self, topic: &str) -> String {
        tributary_schemas::topic::with_suffix(topic, &self.dlq_topic_suffix)
    }

    /// The configured destination's sink, storing its offsets under the
    /// runner's consumer group (it connects on first use).
    pub fn sink(&self) -> Result<Box<dyn Sink>, ConfigError> {
        let (_, destination) = self.destination.one()?;
        destination.build(&self.consumer_group)
    }

    /// Linger as a duration.
    pub fn linger(&self) -> Duration {
        Duration::from_millis(self.batch_linger_ms)
    }

    /// `batch_max_bytes`, its default taken from the destination: small
    /// batches where a write costs only time, large ones where each write
    /// is billed or queued.
    pub fn batch_max_bytes(&self) -> usize {
        self.batch_max_bytes.unwrap_or(match self.destination.one() {
            Ok((_, d)) if !d.writes_when_idle() => DEFAULT_BATCH_MAX_BYTES_BILLED,
            _ => DEFAULT_BATCH_MAX_BYTES,
        })
    }

    /// `batch_idle_ms` as a duration, its default taken from the
    /// destination; `None`: batches wait the whole linger.
    pub fn idle(&self) -> Option<Duration> {
        let ms = match self.batch_idle_ms {
            Some(ms) => ms,
            None => match self.destination.one() {
                Ok((_, d)) if d.writes_when_idle() => DEFAULT_BATCH_IDLE_MS,
                _ => 0,
            },
        };
        (ms > 0).then(|| Duration::from_millis(ms))
    }
}

/// The sink's admin address: next to a source runner's default.
pub const DEFAULT_SINK_ADMIN_LISTEN: &str = "127.0.0.1:8091";

fn default_admin() -> AdminConfig {
    AdminConfig {
        listen: DEFAULT_SINK_ADMIN_LISTEN.to_string(),
        ..AdminConfig::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tributary_operations::config::parse;

    const MINIMAL: &str = r#"
prefix = "shop"
consumer_group = "g"
schema_registry_url = "http://127.0.0.1:8081/apis/ccompat/v7"
[kafka]
bootstrap_servers = "127.0.0.1:9092"
[postgres]
url = "postgres://u@127.0.0.1/db"
"#;

    #[test]
    fn minimal_config_gets_defaults() {
        let c: SinkRunnerConfig = parse(MINIMAL, "test").unwrap();
        assert_eq!(c.topic_pattern(), "^shop\\.[^.]+\\.[^.]+$");
        assert_eq!(c.batch_linger_ms, DEFAULT_BATCH_LINGER_MS);
        assert_eq!(c.idle(), Some(Duration::from_millis(DEFAULT_BATCH_IDLE_MS)));
        assert!(c.is_excluded("shop.public.orders.dlq"));
        assert!(c.is_excluded("shop.tributary.offsets"));
        assert!(!c.is_excluded("shop.public.orders"));
        assert!(c.destination.postgres.is_some());
        assert!(c.sink().is_ok());
    }

    #[test]
    fn batch_defaults_follow_what_a_write_costs() {
        let pg: SinkRunnerConfig = parse(MINIMAL, "test").unwrap();
        assert_eq!(pg.batch_max_bytes(), DEFAULT_BATCH_MAX_BYTES);
        let bq_text = MINIMAL.replace(
            "[postgres]\nurl = \"postgres://u@127.0.0.1/db\"",
            "[bigquery]\nproject = \"p\"\nemulator_url = \"http://127.0.0.1:9050\"",
        );
        let bq: SinkRunnerConfig = parse(&bq_text, "test").unwrap();
        assert_eq!(bq.batch_max_bytes(), DEFAULT_BATCH_MAX_BYTES_BILLED);
        assert_eq!(bq.idle(), None);
        let set: SinkRunnerConfig =
            parse(&bq_text.replace("consumer_group", "batch_max_bytes = 2048\nconsumer_group"), "t").unwrap();
        assert_eq!(set.batch_max_bytes(), 2048, "an operator's setting wins");
        let e = parse::<SinkRunnerConfig>(
            &MINIMAL.replace("consumer_group", "max_buffered_bytes = 2000000\nconsumer_group"),
            "t",
        )
        .expect("above the 1 MiB default");
        assert_eq!(e.max_buffered_bytes, 2_000_000);
        let e = parse::<SinkRunnerConfig>(
            &bq_text.replace("consumer_group", "max_buffered_bytes = 2000000\nconsumer_group"),
            "t",
        )
        .unwrap_err();
        assert!(e.to_string().contains("max_buffered_bytes"), "{e}");
    }

    #[test]
    fn a_prefix_copies_its_own_topics_only() {
        let c: SinkRunnerConfig = parse(MINIMAL, "test").unwrap();
        let pattern = regex::Regex::new(&c.topic_pattern()).unwrap();
        let copied = |t: &str| pattern.is_match(t) && !c.is_excluded(t);
        assert!(copied("shop.public.orders"));
        assert!(copied("shop.public.dlq"), "a source table named dlq");
        assert!(copied("shop.public.order_items_2_0c2b1c53"));
        for not_ours in [
            "shop.eu.public.orders",
            "shop.eu.public.orders.dlq",
            "shop.eu.tributary.offsets",
            "shop.public.orders.dlq",
            "shop.public.dlq.dlq",
            "shop.tributary.offsets",
            "shopping.public.orders",
            "shop.public",
        ] {
            assert!(!copied(not_ours), "{not_ours}");
        }
        // A suffix that adds no part: still told apart from table topics.
        let dashed: SinkRunnerConfig =
            parse(&MINIMAL.replace("consumer_group", "dlq_topic_suffix = \"-dlq\"\nconsumer_group"), "t").unwrap();
        assert!(dashed.is_excluded("shop.public.orders-dlq"));
        assert!(!dashed.is_excluded("shop.public.orders"));
        // `topics`: a dead-letter topic is a matched topic plus the suffix.
        let re: SinkRunnerConfig =
            parse(&MINIMAL.replace("prefix = \"shop\"", "topics = \"^shop\\\\.public\\\\.[^.]+$\""), "t").unwrap();
        assert!(!re.is_excluded("shop.public.dlq"));
        assert!(re.is_excluded("shop.public.orders.dlq"));
        assert!(re.is_excluded("x.tributary.offsets"));
        assert!(c.destination.postgres.is_some());
        assert!(c.sink().is_ok());
    }

    #[test]
    fn errors_name_the_field() {
        let e = parse::<SinkRunnerConfig>(&MINIMAL.replace("prefix = \"shop\"", ""), "t").unwrap_err();
        assert!(e.to_string().contains("`prefix`"), "{e}");
        let e = parse::<SinkRunnerConfig>(&format!("{MINIMAL}\nbogus = 1"), "t").unwrap_err();
        assert!(e.to_string().contains("bogus"), "{e}");
        // A key at the top that is neither a setting nor a section.
        let e = parse::<SinkRunnerConfig>(&format!("bogus = 1\n{MINIMAL}"), "t").unwrap_err();
        assert!(e.to_string().contains("unknown field `bogus`"), "{e}");
        let text = MINIMAL.replace("consumer_group = \"g\"", "consumer_group = \"g\"\ntopics = \"shop.*\"");
        let e = parse::<SinkRunnerConfig>(&text, "t").unwrap_err();
        assert!(e.to_string().contains("`topics`"), "{e}");
        let text = MINIMAL.replace("url = \"postgres:", "table = \"x\"\nurl = \"postgres:");
        let e = parse::<SinkRunnerConfig>(&text, "t").unwrap_err();
        assert!(e.to_string().contains("`postgres.table`"), "{e}");
    }

    #[test]
    fn debug_output_holds_no_secret() {
        const MARKER: &str = "M4rker-Secret";
        let common = format!(
            "prefix = \"shop\"\nconsumer_group = \"g\"\nschema_registry_url = \"http://127.0.0.1:8081/apis/ccompat/v7\"\n\
             [kafka]\nbootstrap_servers = \"127.0.0.1:9092\"\nsecurity_protocol = \"SASL_SSL\"\n\
             sasl_mechanism = \"PLAIN\"\nsasl_username = \"u\"\nsasl_password = \"{MARKER}\"\n\
             properties = {{ \"ssl.key.password\" = \"{MARKER}\" }}\n\
             [admin]\nlisten = \"0.0.0.0:8091\"\ntoken = \"{MARKER}\"\n\
             [schema_registry]\ntoken = \"{MARKER}\"\n"
        );
        for destination in [
            format!("[postgres]\nurl = \"postgres://u:{MARKER}@127.0.0.1/db?password={MARKER}\"\n"),
            "[bigquery]\nproject = \"p\"\nemulator_url = \"http://127.0.0.1:9050\"\n".to_string(),
        ] {
            let c: SinkRunnerConfig = parse(&format!("{common}{destination}"), "t").expect("valid");
            assert_eq!(c.admin.token.as_deref(), Some(MARKER), "the secrets are set");
            for shown in [
                format!("{c:?}"),
                format!("{c:#?}"),
                format!("{:?}", c.kafka),
                format!("{:?}", c.admin),
                format!("{:?}", c.destination),
                format!("{:?}", c.schema_registry.access().expect("access")),
            ] {
                assert!(!shown.contains(MARKER), "a secret in Debug output: {shown}");
            }
        }
    }

    #[test]
    fn a_mistyped_kafka_property_is_refused_at_start_naming_it() {
        let kafka = "bootstrap_servers = \"127.0.0.1:9092\"\n";
        let typo = MINIMAL.replace(kafka, &format!("{kafka}properties = {{ \"fetch.max.byte\" = \"1\" }}\n"));
        let e = parse::<SinkRunnerConfig>(&typo, "t").unwrap_err();
        assert!(e.to_string().contains("kafka.properties.\"fetch.max.byte\""), "{e}");
        let right = MINIMAL.replace(kafka, &format!("{kafka}properties = {{ \"fetch.max.bytes\" = \"1048576\" }}\n"));
        parse::<SinkRunnerConfig>(&right, "t").expect("a real property");
    }

    #[test]
    fn exactly_one_destination() {
        let bq = "[bigquery]\nproject = \"p\"\nemulator_url = \"http://127.0.0.1:9050\"\n";
        let both = format!("{MINIMAL}{bq}");
        let e = parse::<SinkRunnerConfig>(&both, "t").unwrap_err();
        assert!(e.to_string().contains("`bigquery`"), "{e}");
        let only_bq = MINIMAL.replace("[postgres]\nurl = \"postgres://u@127.0.0.1/db\"\n", bq);
        let c: SinkRunnerConfig = parse(&only_bq, "t").unwrap();
        assert!(c.destination.bigquery.is_some() && c.destination.postgres.is_none());
        let none = MINIMAL.replace("[postgres]\nurl = \"postgres://u@127.0.0.1/db\"\n", "");
        let e = parse::<SinkRunnerConfig>(&none, "t").unwrap_err();
        assert!(e.to_string().contains("destination section is required"), "{e}");
        let bad = only_bq.replace("project = \"p\"", "project = \"p\"\nbogus = 1");
        assert!(parse::<SinkRunnerConfig>(&bad, "t").unwrap_err().to_string().contains("bogus"));
    }
}

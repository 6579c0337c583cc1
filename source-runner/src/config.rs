//! The source runner's config file.

use serde::Deserialize;
use tributary_connectors::sources::Sources;
use tributary_connectors::SourceConfig;
use tributary_operations::config::{ConfigError, Validate};
use tributary_operations::kafka::KafkaConfig;
use tributary_operations::registry::SchemaRegistryConfig;

/// Default schema registry: the local stack's Apicurio, Confluent API.
pub const DEFAULT_SCHEMA_REGISTRY_URL: &str = "http://127.0.0.1:8081/apis/ccompat/v7";
/// Default topic template, Debezium's naming so its consumers feel at home.
pub const DEFAULT_TOPIC_TEMPLATE: &str = "{prefix}.{schema}.{table}";
/// Kafka transaction timeout. Long enough for a large snapshot chunk on a
/// slow broker, short enough that a crashed runner's open transaction is
/// aborted by the broker quickly if the runner does not come back.
pub const DEFAULT_TRANSACTION_TIMEOUT_MS: u32 = 60_000;
/// Producer queue limit. Bounds the runner's memory (the RSS target is
/// 64 MiB); a full queue applies backpressure to the source. 4 MiB instead of
/// 16 MiB took peak RSS from 80.8 to 75.9 MiB in `bench/run --rows 200000`
/// with the same snapshot and streaming rates.
pub const DEFAULT_PRODUCER_QUEUE_KBYTES: u32 = 4 * 1024;

/// A source runner: one source database into per-table Kafka topics.
/// Unknown keys are refused: the source sections (`[postgres]`, `[mysql]`,
/// ... as registered in `connectors/src/sources/mod.rs`) take every key
/// that is not a field here, and refuse any that is not a section they know.
#[derive(Debug, Clone, Deserialize)]
pub struct SourceRunnerConfig {
    /// The runner's logical name: the default topic prefix, the Kafka
    /// `transactional.id` (`tributary-source-<name>`) and the key of its
    /// checkpoint in the offsets topic. Changing it starts a new copy.
    pub name: String,
    /// Topic prefix; defaults to `name`.
    #[serde(default)]
    pub topic_prefix: Option<String>,
    /// Topic name template with `{prefix}`, `{schema}` and `{table}`.
    #[serde(default = "default_topic_template")]
    pub topic_template: String,
    /// Whether a tombstone (key, null value) follows each delete, so that
    /// compacted topics forget deleted keys.
    #[serde(default = "default_true")]
    pub tombstones: bool,
    /// Confluent-compatible schema registry URL.
    #[serde(default = "default_registry")]
    pub schema_registry_url: String,
    /// Credentials and CA of the registry (`[schema_registry]`).
    #[serde(default)]
    pub schema_registry: SchemaRegistryConfig,
    /// Kafka connection.
    pub kafka: KafkaConfig,
    /// Kafka transaction timeout in milliseconds.
    #[serde(default = "default_txn_timeout")]
    pub transaction_timeout_ms: u32,
    /// Producer queue limit in KiB (memory bound and backpressure).
    #[serde(default = "default_queue_kbytes")]
    pub producer_queue_kbytes: u32,
    /// The admin server (status, metrics, pause/resume).
    #[serde(default)]
    pub admin: tributary_operations::admin::AdminConfig,
    /// What a schema change the topic cannot carry BACKWARD-compatibly
    /// (`int` to `text`) does: `pause_table` holds back that table's
    /// changes alone (the others flow) and copies it again after the
    /// operator's fix and a restart; `pause` stops the whole source until
    /// an operator acts (nothing is held back); `register` registers it as
    /// a new version anyway (see `docs/schema-changes.md`).
    #[serde(default)]
    pub incompatible_schema_changes: IncompatibleSchemaChanges,
    /// Verification of the copy (`[verify]`, see docs/verification.md).
    #[serde(default)]
    pub verify: VerifyConfig,
    /// Whether the copy's transaction topic, `<prefix>.transaction`, gets
    /// Debezium's BEGIN and END record of each source transaction
    /// (`provide.transaction.metadata`; off by default, as Debezium's: two
    /// more records per transaction).
    #[serde(default)]
    pub transaction_metadata: bool,
    /// The source: exactly one section, e.g. `[postgres]` or `[mysql]`.
    #[serde(flatten)]
    pub source: Sources,
}

/// See [`SourceRunnerConfig::incompatible_schema_changes`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IncompatibleSchemaChanges {
    /// Pause that table only: its changes are held back (not produced)
    /// while the other tables flow; at each start the source copies it
    /// again, which lets it flow once the change can be carried (after
    /// `register`, or a reverted column). A source that cannot copy one
    /// table again keeps it paused until its checkpoint is reset.
    #[default]
    PauseTable,
    /// Pause the whole source (nothing is produced past the change) and say
    /// what to do; the change is tried again on every probe.
    Pause,
    /// Register the change under compatibility NONE for that one version.
    Register,
}

/// Rows a verification reads per second at most, by default: a bounded
/// share of the source's reads (a 1M-row table in under a minute).
pub const DEFAULT_VERIFY_ROWS_PER_SECOND: u64 = 50_000;
/// The source runner's lag above which a scheduled verification waits.
pub const DEFAULT_VERIFY_MAX_LAG_SECONDS: f64 = 30.0;
/// Keys a summarized range covers, by default (`[verify] method =
/// "summary"`): a range that differs is verified again by its rows.
pub const DEFAULT_VERIFY_SUMMARY_RANGE_ROWS: u64 = 50_000;
/// How long a scheduled verification that waited for the lag waits again.
pub const VERIFY_LAG_RECHECK: std::time::Duration = std::time::Duration::from_secs(10);

/// `[verify]`: how the copy is verified (docs/verification.md).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VerifyConfig {
    /// Verify every table this often (seconds), continuously; none: only
    /// on demand (`source-runner verify`, `POST /verify`).
    #[serde(default)]
    pub every_secs: Option<u64>,
    /// Rows a verification reads per second at most.
    #[serde(default = "default_verify_rate")]
    pub rows_per_second: u64,
    /// A scheduled verification waits while the runner's lag (its
    /// largest table's, in seconds) is above this.
    #[serde(default = "default_verify_max_lag")]
    pub max_lag_seconds: f64,
    /// How a table's ranges are sent: their rows' digests, or summaries
    /// the source database computes (PostgreSQL; docs/verification.md).
    #[serde(default)]
    pub method: VerifyMethod,
    /// Keys each summarized range covers (`method = "summary"`).
    #[serde(default = "default_summary_range_rows")]
    pub summary_range_rows: u64,
}

/// `[verify] method`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VerifyMethod {
    /// Each row's digest: every destination compares them, and names the
    /// differing keys at once.
    #[default]
    Rows,
    /// A count and a hash sum per range of keys (`summary_range_rows`), computed by the
    /// source database and by a PostgreSQL destination in SQL (no row
    /// leaves either); a range that differs, or a destination that cannot
    /// compute it, is verified again by rows. On a topic of one partition,
    /// from a PostgreSQL source; rows elsewhere.
    Summary,
}

impl Default for VerifyConfig {
    fn default() -> Self {
        Self {
            every_secs: None,
            rows_per_second: DEFAULT_VERIFY_ROWS_PER_SECOND,
            max_lag_seconds: DEFAULT_VERIFY_MAX_LAG_SECONDS,
            method: VerifyMethod::default(),
            summary_range_rows: DEFAULT_VERIFY_SUMMARY_RANGE_ROWS,
        }
    }
}

impl VerifyConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        if self.every_secs == Some(0) {
            return Err(ConfigError::invalid("verify.every_secs", "must be at least 1 (leave it out for none)"));
        }
        if self.rows_per_second == 0 {
            return Err(ConfigError::invalid("verify.rows_per_second", "must be at least 1"));
        }
        if self.max_lag_seconds.is_nan() || self.max_lag_seconds < 0.0 {
            return Err(ConfigError::invalid("verify.max_lag_seconds", "must be 0 or more"));
        }
        if self.summary_range_rows == 0 {
            return Err(ConfigError::invalid("verify.summary_range_rows", "must be at least 1"));
        }
        Ok(())
    }
}

fn default_verify_rate() -> u64 {
    DEFAULT_VERIFY_ROWS_PER_SECOND
}

fn default_summary_range_rows() -> u64 {
    DEFAULT_VERIFY_SUMMARY_RANGE_ROWS
}

fn default_verify_max_lag() -> f64 {
    DEFAULT_VERIFY_MAX_LAG_SECONDS
}

fn default_topic_template() -> String {
    DEFAULT_TOPIC_TEMPLATE.to_string()
}
fn default_true() -> bool {
    true
}
fn default_registry() -> String {
    DEFAULT_SCHEMA_REGISTRY_URL.to_string()
}
fn default_txn_timeout() -> u32 {
    DEFAULT_TRANSACTION_TIMEOUT_MS
}
fn default_queue_kbytes() -> u32 {
    DEFAULT_PRODUCER_QUEUE_KBYTES
}

impl SourceRunnerConfig {
    /// The topic prefix in use.
    pub fn prefix(&self) -> &str {
        self.topic_prefix.as_deref().unwrap_or(&self.name)
    }

    /// The configured source section (validated: there is exactly one).
    pub fn source_config(&self) -> Result<&dyn SourceConfig, ConfigError> {
        self.source.one().map(|(_, c)| c)
    }

    /// The source connector kind, as Debezium names it (`source.connector`).
    pub fn connector(&self) -> &'static str {
        self.source_config().map_or("unknown", |c| c.connector())
    }

    /// The offsets topic holding this runner's checkpoints.
    pub fn offsets_topic(&self) -> String {
        tributary_schemas::topic::offsets_topic(self.prefix())
    }

    /// The Kafka transactional id: stable per runner, so a restarted runner
    /// fences its crashed predecessor and aborts its open transaction.
    pub fn transactional_id(&self) -> String {
        format!("tributary-source-{}", self.name)
    }
}

impl Validate for SourceRunnerConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        let name_ok = !self.name.is_empty()
            && self
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.');
        if !name_ok {
            return Err(ConfigError::invalid(
                "name",
                "must be non-empty and use only letters, digits, '.', '_' and '-' (it becomes part of topic names)",
            ));
        }
        for part in ["{schema}", "{table}"] {
            if !self.topic_template.contains(part) {
                return Err(ConfigError::invalid(
                    "topic_template",
                    format!("must contain {part} so that each table gets its own topic"),
                ));
            }
        }
        let literal = ["{prefix}", "{schema}", "{table}"]
            .iter()
            .fold(self.topic_template.clone(), |t, p| t.replace(p, ""));
        if !literal
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        {
            return Err(ConfigError::invalid(
                "topic_template",
                "may hold, besides {prefix}, {schema} and {table}, only the characters Kafka allows in topic names: \
                 a-z, A-Z, 0-9, '.', '_', '-'",
            ));
        }
        if !(self.schema_registry_url.starts_with("http://") || self.schema_registry_url.starts_with("https://")) {
            return Err(ConfigError::invalid("schema_registry_url", "must be an http:// or https:// URL"));
        }
        self.schema_registry.validate()?;
        if self.transaction_timeout_ms < 1_000 {
            return Err(ConfigError::invalid("transaction_timeout_ms", "must be at least 1000"));
        }
        self.kafka.validate("kafka")?;
        self.admin.validate()?;
        self.verify.validate()?;
        let (section, source) = self.source.one()?;
        source.validate_at(section)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = "name = \"n\"\n[kafka]\nbootstrap_servers = \"127.0.0.1:9092\"\n";

    fn parse(text: &str) -> Result<SourceRunnerConfig, ConfigError> {
        tributary_operations::config::parse(text, "test.toml")
    }

    #[test]
    fn exactly_one_source_section() {
        let my = "[mysql]\nurl = \"mysql://u@h/db\"\n";
        let pg = "[postgres]\nurl = \"postgres://u@h/db\"\n";
        let c = parse(&format!("{BASE}{my}")).expect("mysql alone");
        assert_eq!(c.connector(), "mysql");
        assert_eq!(parse(&format!("{BASE}{pg}")).expect("postgres alone").connector(), "postgresql");
        let ms = "[sqlserver]\nurl = \"sqlserver://u@h/db\"\n";
        assert_eq!(parse(&format!("{BASE}{ms}")).expect("sqlserver alone").connector(), "sqlserver");
        let both = parse(&format!("{BASE}{pg}{my}")).expect_err("both");
        assert!(both.to_string().contains("mysql"), "{both}");
        let none = parse(BASE).expect_err("none");
        assert!(none.to_string().contains("[mysql]"), "{none}");
        let unknown = parse(&format!("bogus = 1\n{BASE}{pg}")).expect_err("unknown");
        assert!(unknown.to_string().contains("unknown field `bogus`"), "{unknown}");
        let bad = parse(&format!("{BASE}[mysql]\nurl = \"mysql://u@h/db\"\nserver_id = 0\n")).expect_err("bad");
        assert!(bad.to_string().contains("mysql.server_id"), "{bad}");
    }

    #[test]
    fn debug_output_holds_no_secret() {
        const MARKER: &str = "M4rker-Secret";
        let kafka = format!(
            "name = \"n\"\n[kafka]\nbootstrap_servers = \"127.0.0.1:9092\"\nsecurity_protocol = \"SASL_SSL\"\n\
             sasl_mechanism = \"SCRAM-SHA-512\"\nsasl_username = \"u\"\nsasl_password = \"{MARKER}\"\n\
             properties = {{ \"ssl.key.password\" = \"{MARKER}\", \"ssl.keystore.password\" = \"{MARKER}\" }}\n\
             [admin]\nlisten = \"0.0.0.0:8090\"\ntoken = \"{MARKER}\"\n\
             [schema_registry]\nusername = \"u\"\npassword = \"{MARKER}\"\n"
        );
        for source in [
            format!("[postgres]\nurl = \"postgres://u:{MARKER}@h/db?password={MARKER}\"\npassword = \"{MARKER}\"\n"),
            format!("[mysql]\nurl = \"mysql://u:{MARKER}@h/db\"\npassword = \"{MARKER}\"\n"),
        ] {
            let c = parse(&format!("{kafka}{source}")).expect("valid");
            assert_eq!(c.kafka.sasl_password.as_deref(), Some(MARKER), "the secrets are set");
            for shown in [
                format!("{c:?}"),
                format!("{c:#?}"),
                format!("{:?}", c.kafka),
                format!("{:?}", c.admin),
                format!("{:?}", c.source),
                format!("{:?}", c.schema_registry.access().expect("access")),
            ] {
                assert!(!shown.contains(MARKER), "a secret in Debug output: {shown}");
            }
            assert!(format!("{c:?}").contains("ssl.key.password"), "the property's name is shown");
        }
    }

    #[test]
    fn a_mistyped_kafka_property_is_refused_at_start_naming_it() {
        let pg = "[postgres]\nurl = \"postgres://u@h/db\"\n";
        let ok = format!("{BASE}properties = {{ \"linger.ms\" = \"5\" }}\n{pg}");
        parse(&ok).expect("a real property");
        let typo = format!("{BASE}properties = {{ \"linger.msec\" = \"5\" }}\n{pg}");
        let e = parse(&typo).expect_err("a mistyped property");
        assert!(e.to_string().contains("kafka.properties.\"linger.msec\""), "{e}");
    }
}

//! Configuration of the Redshift sink (`[redshift]` in a sink runner's
//! config file): the cluster (PostgreSQL wire protocol), the S3 staging
//! area, and the destination table of each source table.

use std::fmt;
use std::str::FromStr;

use serde::Deserialize;
use tributary_operations::config::{ConfigError, Validate};
use tributary_schemas::TableId;

use crate::pgwire::tls::{validate_tls, TlsMode};
use crate::sink::{check_table_template, expand_table_template, Sink, SinkConfig};
pub use crate::sinks::postgres::DestinationTable;
use crate::sinks::postgres::PostgresSinkConfig;

/// Default destination table name: the source table's own name.
pub const DEFAULT_TABLE_TEMPLATE: &str = "{table}";
/// Connect timeout. A paused cluster takes minutes to resume; the connect
/// fails (retryably) within this and the runner's backoff waits.
pub const DEFAULT_CONNECT_TIMEOUT_MS: u64 = 10_000;
/// Key prefix of the staged files in the bucket. Each batch writes under
/// `<prefix>/<consumer group>/<unique id>/` and removes it after the load;
/// a lifecycle rule on the prefix removes what a crash left.
pub const DEFAULT_S3_PREFIX: &str = "tributary-staging";
/// Region of the staging bucket unless configured (the S3 API needs one
/// to sign; the bucket should be in the cluster's region).
pub const DEFAULT_S3_REGION: &str = "us-east-1";
/// Rows per staged CSV file: Redshift loads the files of a manifest in
/// parallel, one per slice, so a large batch is split; 100 000 rows of a
/// typical table are 10-50 MB, the size AWS recommends per file.
pub const DEFAULT_ROWS_PER_FILE: usize = 100_000;

/// How staged files get into the staging table.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Loader {
    /// `COPY ... FROM 's3://.../manifest' IAM_ROLE ... MANIFEST`: Redshift
    /// reads the files itself. The only loader for a real cluster.
    #[default]
    S3Copy,
    /// TEST MODE ONLY: the sink reads the staged files back from S3 and
    /// sends them with `COPY ... FROM STDIN`, so that the whole apply path
    /// (same files, same statements around the load) runs against
    /// PostgreSQL, which cannot read S3. Also creates the `super` and
    /// `varbyte` stand-in types PostgreSQL lacks. Never use it against
    /// Redshift (which has no `COPY FROM STDIN`).
    TestStdinFromS3,
}

/// The S3 staging area (`[redshift.s3]`).
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct S3Config {
    /// Bucket of the staged files (in the cluster's region).
    pub bucket: String,
    /// Key prefix of the staged files.
    #[serde(default = "default_prefix")]
    pub prefix: String,
    /// Region of the bucket.
    #[serde(default = "default_region")]
    pub region: String,
    /// Another S3 endpoint (MinIO, moto); unset for AWS.
    #[serde(default)]
    pub endpoint: Option<String>,
    /// Access key id of the sink's own S3 writes: inline, `env:NAME` or
    /// `file:/path`. Unset: the usual AWS sources (environment, instance
    /// profile) are used.
    #[serde(default)]
    pub access_key_id: Option<String>,
    /// Secret access key (same forms); never logged.
    #[serde(default)]
    pub secret_access_key: Option<String>,
    /// Allow plain HTTP to `endpoint` (a local emulator only).
    #[serde(default)]
    pub allow_http: bool,
}

fn default_prefix() -> String {
    DEFAULT_S3_PREFIX.to_string()
}
fn default_region() -> String {
    DEFAULT_S3_REGION.to_string()
}

impl fmt::Debug for S3Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("S3Config")
            .field("bucket", &self.bucket)
            .field("prefix", &self.prefix)
            .field("region", &self.region)
            .field("endpoint", &self.endpoint)
            .field("access_key_id", &self.access_key_id.as_ref().map(|_| "<redacted>"))
            .field("secret_access_key", &self.secret_access_key.as_ref().map(|_| "<redacted>"))
            .field("allow_http", &self.allow_http)
            .finish()
    }
}

/// Configuration of the Redshift sink (`[redshift]`).
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedshiftSinkConfig {
    /// Connection URL of the cluster or workgroup endpoint, e.g.
    /// `postgres://user@cluster.abc.eu-west-1.redshift.amazonaws.com:5439/dev`:
    /// inline, `env:NAME` or `file:/path`. Never logged.
    pub url: String,
    /// The IAM role the cluster assumes to read the staged files
    /// (`arn:aws:iam::<account>:role/<name>`), attached to the cluster.
    pub iam_role: String,
    /// The S3 staging area.
    pub s3: S3Config,
    /// How staged files are loaded; leave it unset (`s3_copy`).
    #[serde(default)]
    pub loader: Loader,
    /// Destination schema of every table. Default: the source table's schema.
    #[serde(default)]
    pub schema: Option<String>,
    /// Destination table name; `{schema}` and `{table}` stand for the
    /// source table's schema and name. Must contain `{table}`.
    #[serde(default = "default_table_template")]
    pub table: String,
    /// Whether a table dropped in the source is dropped in the destination.
    #[serde(default)]
    pub drop_tables: bool,
    /// Whether a column dropped in the source is dropped in the destination.
    #[serde(default)]
    pub drop_columns: bool,
    /// The key of this copy's rows in `tributary.offsets`; filled from the
    /// sink runner's `consumer_group`.
    #[serde(default)]
    pub consumer_group: Option<String>,
    /// Connect timeout in milliseconds.
    #[serde(default = "default_connect_timeout_ms")]
    pub connect_timeout_ms: u64,
    /// `disable`, `require`, `verify-ca` or `verify-full` (Redshift
    /// endpoints take `require` or stronger).
    #[serde(default)]
    pub tls: TlsMode,
    /// CA bundle (PEM) for `verify-ca` / `verify-full`.
    #[serde(default)]
    pub tls_ca_file: Option<String>,
    /// How long the position of a deleted row is kept.
    #[serde(default = "default_deleted_rows_retention_hours")]
    pub deleted_rows_retention_hours: u64,
    /// Rows per staged file.
    #[serde(default = "default_rows_per_file")]
    pub rows_per_file: usize,
}

fn default_table_template() -> String {
    DEFAULT_TABLE_TEMPLATE.to_string()
}
fn default_connect_timeout_ms() -> u64 {
    DEFAULT_CONNECT_TIMEOUT_MS
}
fn default_deleted_rows_retention_hours() -> u64 {
    crate::sink::bookkeeping::DEFAULT_DELETED_ROWS_RETENTION_HOURS
}
fn default_rows_per_file() -> usize {
    DEFAULT_ROWS_PER_FILE
}

impl fmt::Debug for RedshiftSinkConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedshiftSinkConfig")
            .field("url", &"<redacted>")
            .field("iam_role", &self.iam_role)
            .field("s3", &self.s3)
            .field("loader", &self.loader)
            .field("schema", &self.schema)
            .field("table", &self.table)
            .field("drop_tables", &self.drop_tables)
            .field("drop_columns", &self.drop_columns)
            .field("consumer_group", &self.consumer_group)
            .field("connect_timeout_ms", &self.connect_timeout_ms)
            .field("tls", &self.tls)
            .field("tls_ca_file", &self.tls_ca_file)
            .field("deleted_rows_retention_hours", &self.deleted_rows_retention_hours)
            .field("rows_per_file", &self.rows_per_file)
            .finish()
    }
}

impl RedshiftSinkConfig {
    /// A config with defaults for everything but the URL, role, bucket and
    /// consumer group.
    pub fn new(
        url: impl Into<String>,
        iam_role: impl Into<String>,
        bucket: impl Into<String>,
        consumer_group: impl Into<String>,
    ) -> Self {
        Self {
            url: url.into(),
            iam_role: iam_role.into(),
            s3: S3Config {
                bucket: bucket.into(),
                prefix: default_prefix(),
                region: default_region(),
                endpoint: None,
                access_key_id: None,
                secret_access_key: None,
                allow_http: false,
            },
            loader: Loader::default(),
            schema: None,
            table: default_table_template(),
            drop_tables: false,
            drop_columns: false,
            consumer_group: Some(consumer_group.into()),
            connect_timeout_ms: DEFAULT_CONNECT_TIMEOUT_MS,
            tls: TlsMode::default(),
            tls_ca_file: None,
            deleted_rows_retention_hours: default_deleted_rows_retention_hours(),
            rows_per_file: DEFAULT_ROWS_PER_FILE,
        }
    }

    /// Checks every rule; errors name the field under `prefix`.
    pub fn validate_at(&self, prefix: &str) -> Result<(), ConfigError> {
        let field = |name: &str| format!("{prefix}.{name}");
        if self.url.trim().is_empty() {
            return Err(ConfigError::invalid(field("url"), "must not be empty"));
        }
        if !self.url.starts_with("env:") && !self.url.starts_with("file:") {
            tokio_postgres::Config::from_str(&self.url)
                .map_err(|e| ConfigError::invalid(field("url"), format!("is not a PostgreSQL-protocol URL ({e})")))?;
        }
        if !self.iam_role.starts_with("arn:") {
            return Err(ConfigError::invalid(
                field("iam_role"),
                "must be an IAM role ARN (arn:aws:iam::<account>:role/<name>) the cluster may assume",
            ));
        }
        if self.iam_role.contains('\'') || self.iam_role.contains('\\') {
            return Err(ConfigError::invalid(field("iam_role"), "must not contain quotes or backslashes"));
        }
        let bucket = &self.s3.bucket;
        if bucket.len() < 3
            || bucket.len() > 63
            || !bucket
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        {
            return Err(ConfigError::invalid(
                field("s3.bucket"),
                "must be an S3 bucket name (3-63 lowercase letters, digits, '-' or '.')",
            ));
        }
        if self.s3.prefix.contains('\'') || self.s3.prefix.contains('\\') || self.s3.prefix.starts_with('/') {
            return Err(ConfigError::invalid(
                field("s3.prefix"),
                "must not start with '/' nor contain quotes or backslashes",
            ));
        }
        if self.s3.access_key_id.is_some() != self.s3.secret_access_key.is_some() {
            return Err(ConfigError::invalid(
                field("s3.secret_access_key"),
                "access_key_id and secret_access_key are set together or not at all",
            ));
        }
        if self.s3.allow_http && self.s3.endpoint.is_none() {
            return Err(ConfigError::invalid(field("s3.allow_http"), "only applies to a configured s3.endpoint"));
        }
        if self.deleted_rows_retention_hours == 0 {
            return Err(ConfigError::invalid(field("deleted_rows_retention_hours"), "must be at least 1"));
        }
        if self.rows_per_file == 0 {
            return Err(ConfigError::invalid(field("rows_per_file"), "must be greater than 0"));
        }
        if self.connect_timeout_ms == 0 {
            return Err(ConfigError::invalid(field("connect_timeout_ms"), "must be greater than 0"));
        }
        if let Some(schema) = &self.schema {
            if schema.trim().is_empty() {
                return Err(ConfigError::invalid(field("schema"), "must not be empty when set"));
            }
        }
        check_table_template(&self.table).map_err(|rule| ConfigError::invalid(field("table"), rule))?;
        if let Some(group) = &self.consumer_group {
            if group.trim().is_empty() || group.contains('/') {
                return Err(ConfigError::invalid(field("consumer_group"), "must not be empty nor contain '/'"));
            }
        }
        validate_tls(self.tls, self.tls_ca_file.as_deref(), |name| format!("{prefix}.{name}"))
    }

    /// The destination table of a source table.
    pub fn destination(&self, source: &TableId) -> DestinationTable {
        let schema = self.schema.clone().unwrap_or_else(|| source.schema.clone());
        DestinationTable {
            schema,
            table: expand_table_template(&self.table, source),
        }
    }

    /// The connection settings the PostgreSQL wire session takes (the
    /// session is the PostgreSQL sink's, see `postgres::client::Session`).
    pub(super) fn connection(&self) -> PostgresSinkConfig {
        let mut c = PostgresSinkConfig::new(self.url.clone(), self.consumer_group.clone().unwrap_or_default());
        c.connect_timeout_ms = self.connect_timeout_ms;
        c.tls = self.tls;
        c.tls_ca_file = self.tls_ca_file.clone();
        c
    }
}

impl Validate for RedshiftSinkConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        self.validate_at("redshift")
    }
}

impl SinkConfig for RedshiftSinkConfig {
    /// Batches wait for the whole linger: Redshift serializes commits in one queue; small frequent ones slow the cluster.
    fn writes_when_idle(&self) -> bool {
        false
    }

    fn validate_at(&self, section: &str) -> Result<(), ConfigError> {
        RedshiftSinkConfig::validate_at(self, section)
    }

    fn consumer_group(&self) -> Option<&str> {
        self.consumer_group.as_deref()
    }

    fn build(&self, consumer_group: &str) -> Result<Box<dyn Sink>, ConfigError> {
        let mut config = self.clone();
        config.consumer_group = Some(consumer_group.to_string());
        Ok(Box::new(super::RedshiftSink::new(config)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_rules_name_the_field_and_hide_secrets() {
        let mut c =
            RedshiftSinkConfig::new("postgres://u:secret@h:5439/dev", "arn:aws:iam::1:role/r", "my-bucket", "g");
        assert!(c.validate().is_ok());
        assert_eq!(c.loader, Loader::S3Copy, "the default loader is Redshift's own COPY");
        c.s3.secret_access_key = Some("s3cret".into());
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("redshift.s3.secret_access_key"), "{e}");
        c.s3.access_key_id = Some("AKIA".into());
        assert!(c.validate().is_ok());
        let shown = format!("{c:?}");
        assert!(!shown.contains("u:secret") && !shown.contains("s3cret") && !shown.contains("AKIA"), "{shown}");
        c.iam_role = "role".into();
        assert!(c.validate().unwrap_err().to_string().contains("redshift.iam_role"));
        c.iam_role = "arn:aws:iam::1:role/r".into();
        c.s3.bucket = "Bad_Bucket".into();
        assert!(c.validate().unwrap_err().to_string().contains("redshift.s3.bucket"));
        let toml = "url = \"postgres://h/db\"\niam_role = \"arn:x\"\n[s3]\nbucket = \"b-1\"\nnope = 1\n";
        assert!(toml::from_str::<RedshiftSinkConfig>(toml).is_err(), "unknown fields are refused");
    }
}

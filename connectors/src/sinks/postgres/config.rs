//! Configuration of the PostgreSQL sink (`[postgres]` in a sink runner's
//! config file) and the destination table of each source table.

use std::fmt;
use std::str::FromStr;

use serde::Deserialize;
use tributary_operations::config::{ConfigError, Validate};
use tributary_schemas::TableId;

use crate::pgwire::quote_ident;
use crate::pgwire::tls::{validate_tls, TlsMode};
use crate::sink::{check_table_template, expand_table_template, Sink, SinkConfig};

/// Default destination table name: the source table's own name, so that a
/// migration from one PostgreSQL to another keeps every name.
pub const DEFAULT_TABLE_TEMPLATE: &str = "{table}";
/// Connect timeout. Long enough for a TLS handshake across regions, short
/// enough that a down server is reported (as retryable) within seconds.
pub const DEFAULT_CONNECT_TIMEOUT_MS: u64 = 10_000;
/// How long a statement waits for a lock before failing (retryably). Without
/// it a long `ALTER TABLE` or an operator's open transaction would hang the
/// sink silently; with it the wait shows up as `paused` in the status.
pub const DEFAULT_LOCK_TIMEOUT_MS: u64 = 60_000;
/// Configuration of the PostgreSQL sink (`[postgres]` in a sink runner's
/// config file).
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PostgresSinkConfig {
    /// Connection URL, e.g. `postgres://user@host:5432/db`: inline,
    /// `env:NAME` or `file:/path`. It holds the password, so it is never
    /// logged.
    pub url: String,
    /// Destination schema of every table. Default: the source table's schema
    /// (MySQL: its database name).
    #[serde(default)]
    pub schema: Option<String>,
    /// Destination table name; `{schema}` and `{table}` stand for the source
    /// table's schema and name. Must contain `{table}`.
    #[serde(default = "default_table_template")]
    pub table: String,
    /// Whether a table dropped in the source is dropped in the destination.
    /// Off by default: dropping data is not something to do by surprise.
    #[serde(default)]
    pub drop_tables: bool,
    /// Whether a column dropped in the source is dropped in the destination
    /// (`false`: it stays, NULL in new rows). Off by default, like
    /// `drop_tables`; see docs/schema-changes.md.
    #[serde(default)]
    pub drop_columns: bool,
    /// The key of this copy's rows in `tributary.offsets`. Filled from the
    /// sink runner's `consumer_group`; set it here only to the same value.
    #[serde(default)]
    pub consumer_group: Option<String>,
    /// Connect timeout in milliseconds.
    #[serde(default = "default_connect_timeout_ms")]
    pub connect_timeout_ms: u64,
    /// Lock wait limit per statement in milliseconds (0: wait forever).
    #[serde(default = "default_lock_timeout_ms")]
    pub lock_timeout_ms: u64,
    /// `disable`, `require`, `verify-ca` or `verify-full`, as for the source.
    #[serde(default)]
    pub tls: TlsMode,
    /// CA bundle (PEM) for `verify-ca` / `verify-full`.
    #[serde(default)]
    pub tls_ca_file: Option<String>,
    /// How long the position of a deleted row is kept (`tributary.deleted_rows`):
    /// a change older than the delete that arrives later than this may
    /// bring the row back.
    #[serde(default = "default_deleted_rows_retention_hours")]
    pub deleted_rows_retention_hours: u64,
}

fn default_table_template() -> String {
    DEFAULT_TABLE_TEMPLATE.to_string()
}
fn default_connect_timeout_ms() -> u64 {
    DEFAULT_CONNECT_TIMEOUT_MS
}
fn default_lock_timeout_ms() -> u64 {
    DEFAULT_LOCK_TIMEOUT_MS
}
fn default_deleted_rows_retention_hours() -> u64 {
    crate::sink::bookkeeping::DEFAULT_DELETED_ROWS_RETENTION_HOURS
}

impl fmt::Debug for PostgresSinkConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The URL may hold a password: never print it.
        f.debug_struct("PostgresSinkConfig")
            .field("url", &"<redacted>")
            .field("schema", &self.schema)
            .field("table", &self.table)
            .field("drop_tables", &self.drop_tables)
            .field("drop_columns", &self.drop_columns)
            .field("consumer_group", &self.consumer_group)
            .field("connect_timeout_ms", &self.connect_timeout_ms)
            .field("lock_timeout_ms", &self.lock_timeout_ms)
            .field("tls", &self.tls)
            .field("tls_ca_file", &self.tls_ca_file)
            .field("deleted_rows_retention_hours", &self.deleted_rows_retention_hours)
            .finish()
    }
}

impl PostgresSinkConfig {
    /// A config with defaults for everything but the URL and consumer group.
    pub fn new(url: impl Into<String>, consumer_group: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            schema: None,
            table: default_table_template(),
            drop_tables: false,
            drop_columns: false,
            consumer_group: Some(consumer_group.into()),
            connect_timeout_ms: DEFAULT_CONNECT_TIMEOUT_MS,
            lock_timeout_ms: DEFAULT_LOCK_TIMEOUT_MS,
            tls: TlsMode::default(),
            tls_ca_file: None,
            deleted_rows_retention_hours: default_deleted_rows_retention_hours(),
        }
    }

    /// Checks every rule; errors name the field under `prefix` (`postgres`
    /// in a sink runner's file).
    pub fn validate_at(&self, prefix: &str) -> Result<(), ConfigError> {
        if self.url.trim().is_empty() {
            return Err(ConfigError::invalid(format!("{prefix}.url"), "must not be empty"));
        }
        if self.deleted_rows_retention_hours == 0 {
            return Err(ConfigError::invalid(
                format!("{prefix}.deleted_rows_retention_hours"),
                "must be at least 1: a delete's position must outlive the changes that may still arrive after it",
            ));
        }
        if !self.url.starts_with("env:") && !self.url.starts_with("file:") {
            // Parsing errors of tokio-postgres do not echo the URL.
            tokio_postgres::Config::from_str(&self.url).map_err(|e| {
                ConfigError::invalid(
                    format!("{prefix}.url"),
                    format!("is not a PostgreSQL URL or key=value string ({e})"),
                )
            })?;
        }
        if let Some(schema) = &self.schema {
            if schema.trim().is_empty() {
                return Err(ConfigError::invalid(
                    format!("{prefix}.schema"),
                    "must not be empty when set (leave it out to keep the source schema)",
                ));
            }
        }
        check_table_template(&self.table).map_err(|rule| ConfigError::invalid(format!("{prefix}.table"), rule))?;
        if let Some(group) = &self.consumer_group {
            if group.trim().is_empty() {
                return Err(ConfigError::invalid(format!("{prefix}.consumer_group"), "must not be empty"));
            }
        }
        if self.connect_timeout_ms == 0 {
            return Err(ConfigError::invalid(format!("{prefix}.connect_timeout_ms"), "must be greater than 0"));
        }
        validate_tls(self.tls, self.tls_ca_file.as_deref(), |name| format!("{prefix}.{name}"))
    }

    /// The destination table of a source table.
    pub fn destination(&self, source: &TableId) -> DestinationTable {
        let schema = self.schema.clone().unwrap_or_else(|| source.schema.clone());
        let table = expand_table_template(&self.table, source);
        DestinationTable { schema, table }
    }
}

impl Validate for PostgresSinkConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        self.validate_at("postgres")
    }
}

/// A table in the destination database.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DestinationTable {
    /// Schema.
    pub schema: String,
    /// Table.
    pub table: String,
}

impl DestinationTable {
    /// The quoted, schema-qualified name for SQL.
    pub fn quoted(&self) -> String {
        format!("{}.{}", quote_ident(&self.schema), quote_ident(&self.table))
    }
}

impl fmt::Display for DestinationTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.schema, self.table)
    }
}

impl SinkConfig for PostgresSinkConfig {
    fn validate_at(&self, section: &str) -> Result<(), ConfigError> {
        PostgresSinkConfig::validate_at(self, section)
    }

    fn consumer_group(&self) -> Option<&str> {
        self.consumer_group.as_deref()
    }

    fn build(&self, consumer_group: &str) -> Result<Box<dyn Sink>, ConfigError> {
        let mut config = self.clone();
        config.consumer_group = Some(consumer_group.to_string());
        Ok(Box::new(super::PostgresSink::new(config)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_rules_name_the_field() {
        let mut c = PostgresSinkConfig::new("postgres://u:secret@h/db", "g");
        assert!(c.validate().is_ok());
        c.table = "fixed".into();
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("postgres.table"), "{e}");
        c.table = "{schema}_{table}".into();
        assert_eq!(
            c.destination(&TableId::new("public", "orders")),
            DestinationTable {
                schema: "public".into(),
                table: "public_orders".into()
            }
        );
        assert!(!format!("{c:?}").contains("secret"));
    }
}

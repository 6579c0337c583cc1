//! Configuration of the Spanner sink (`[spanner]` in a sink runner's config
//! file).

use std::fmt;

use serde::Deserialize;
use tributary_operations::config::{ConfigError, Validate};
use tributary_schemas::TableId;

use crate::sink::{check_table_template, expand_table_template, Sink, SinkConfig};

/// Default destination table name. Spanner has no schemas (a database is
/// one namespace), so the source schema is part of the name.
pub const DEFAULT_TABLE_TEMPLATE: &str = "{schema}_{table}";
/// Prefix of the sink's own tables (`tributary_offsets`,
/// `tributary_deleted_rows`, `tributary_resets`).
pub const DEFAULT_BOOKKEEPING_PREFIX: &str = "tributary_";
/// Mutations per commit. Spanner refuses a commit of more than 80,000
/// mutations (each column of an insert-or-update counts, plus index
/// entries); a batch above it is split into several commits, each with the
/// offsets of its prefix.
pub const DEFAULT_MUTATION_LIMIT: usize = 80_000;
/// Attempts of a read-write transaction that Spanner aborted (it aborts
/// under lock contention, e.g. two runners of a group for a moment): each
/// attempt reads again, so a retry is always correct; ten covers bursts of
/// contention without hiding a livelock.
pub const DEFAULT_ABORT_RETRIES: u32 = 10;
/// Per-request timeout. A commit of 80,000 mutations takes about a second
/// on a regional instance; a minute leaves room without hiding an outage.
pub const DEFAULT_REQUEST_TIMEOUT_MS: u64 = 60_000;
/// Spanner's longest table and column name.
const MAX_NAME_LEN: usize = 128;

/// Configuration of the Spanner sink.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpannerSinkConfig {
    /// Google Cloud project of the instance.
    pub project: String,
    /// Spanner instance id.
    pub instance: String,
    /// Database id (it must exist: creating a database is an operator's
    /// decision, with its dialect and backups).
    pub database: String,
    /// Destination table name; `{schema}` and `{table}` stand for the source
    /// table's schema and name. Must contain `{table}`. Characters Spanner
    /// does not allow in a name become `_`.
    #[serde(default = "default_table_template")]
    pub table: String,
    /// Prefix of the sink's own tables.
    #[serde(default = "default_bookkeeping_prefix")]
    pub bookkeeping_prefix: String,
    /// Path of a service-account key file (JSON). Without it, and without
    /// `emulator_host`, application default credentials are used. The path
    /// is logged; the file's contents never are.
    #[serde(default)]
    pub key_file: Option<String>,
    /// `host:port` of a Spanner emulator's gRPC endpoint (what
    /// `SPANNER_EMULATOR_HOST` holds). No credentials are sent to it.
    #[serde(default)]
    pub emulator_host: Option<String>,
    /// Whether a table dropped in the source is dropped in the destination.
    #[serde(default)]
    pub drop_tables: bool,
    /// Whether a column dropped in the source is dropped in the destination.
    #[serde(default)]
    pub drop_columns: bool,
    /// Mutations per commit; a batch above it is split into several
    /// commits, each carrying the offsets of its prefix.
    #[serde(default = "default_mutation_limit")]
    pub mutation_limit: usize,
    /// Attempts of a transaction Spanner aborted.
    #[serde(default = "default_abort_retries")]
    pub abort_retries: u32,
    /// Timeout of one request, in milliseconds.
    #[serde(default = "default_request_timeout_ms")]
    pub request_timeout_ms: u64,
    /// The key of this copy's rows in the offsets table. Filled from the
    /// sink runner's `consumer_group`; set it here only to the same value.
    #[serde(default)]
    pub consumer_group: Option<String>,
    /// How long the position of a deleted row is kept.
    #[serde(default = "default_deleted_rows_retention_hours")]
    pub deleted_rows_retention_hours: u64,
}

fn default_deleted_rows_retention_hours() -> u64 {
    crate::sink::bookkeeping::DEFAULT_DELETED_ROWS_RETENTION_HOURS
}
fn default_table_template() -> String {
    DEFAULT_TABLE_TEMPLATE.to_string()
}
fn default_bookkeeping_prefix() -> String {
    DEFAULT_BOOKKEEPING_PREFIX.to_string()
}
fn default_mutation_limit() -> usize {
    DEFAULT_MUTATION_LIMIT
}
fn default_abort_retries() -> u32 {
    DEFAULT_ABORT_RETRIES
}
fn default_request_timeout_ms() -> u64 {
    DEFAULT_REQUEST_TIMEOUT_MS
}

impl fmt::Debug for SpannerSinkConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Nothing here is secret (the key file is a path); the list stays
        // explicit so that a secret field added later is not printed.
        f.debug_struct("SpannerSinkConfig")
            .field("project", &self.project)
            .field("instance", &self.instance)
            .field("database", &self.database)
            .field("table", &self.table)
            .field("bookkeeping_prefix", &self.bookkeeping_prefix)
            .field("key_file", &self.key_file)
            .field("emulator_host", &self.emulator_host)
            .field("drop_tables", &self.drop_tables)
            .field("drop_columns", &self.drop_columns)
            .field("mutation_limit", &self.mutation_limit)
            .field("abort_retries", &self.abort_retries)
            .field("request_timeout_ms", &self.request_timeout_ms)
            .field("consumer_group", &self.consumer_group)
            .field("deleted_rows_retention_hours", &self.deleted_rows_retention_hours)
            .finish()
    }
}

/// A Spanner instance or database id: lowercase letters, digits, `-`, `_`,
/// starting with a letter.
fn valid_id(id: &str) -> bool {
    id.len() >= 2
        && id.len() <= 64
        && id.starts_with(|c: char| c.is_ascii_lowercase())
        && id
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
}

/// `name` as a Spanner table name: letters, digits and `_`, starting with
/// a letter, at most 128 characters.
pub fn table_name(name: &str) -> String {
    let mut out: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' })
        .take(MAX_NAME_LEN)
        .collect();
    if !out.starts_with(|c: char| c.is_ascii_alphabetic()) {
        out.insert(0, 't');
        out.truncate(MAX_NAME_LEN);
    }
    out
}

impl SpannerSinkConfig {
    /// A config with defaults for everything but the database, consumer
    /// group and emulator.
    pub fn new(
        project: impl Into<String>,
        instance: impl Into<String>,
        database: impl Into<String>,
        consumer_group: impl Into<String>,
    ) -> Self {
        Self {
            project: project.into(),
            instance: instance.into(),
            database: database.into(),
            table: default_table_template(),
            bookkeeping_prefix: default_bookkeeping_prefix(),
            key_file: None,
            emulator_host: None,
            drop_tables: false,
            drop_columns: false,
            mutation_limit: DEFAULT_MUTATION_LIMIT,
            abort_retries: DEFAULT_ABORT_RETRIES,
            request_timeout_ms: DEFAULT_REQUEST_TIMEOUT_MS,
            consumer_group: Some(consumer_group.into()),
            deleted_rows_retention_hours: default_deleted_rows_retention_hours(),
        }
    }

    /// The database's resource name.
    pub fn database_path(&self) -> String {
        format!("projects/{}/instances/{}/databases/{}", self.project, self.instance, self.database)
    }

    /// Checks every rule; errors name the field under `prefix`.
    pub fn validate_at(&self, prefix: &str) -> Result<(), ConfigError> {
        let invalid = |field: &str, rule: &str| ConfigError::invalid(format!("{prefix}.{field}"), rule);
        let project_ok = !self.project.is_empty()
            && self
                .project
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':'));
        if !project_ok {
            return Err(invalid("project", "must be a Google Cloud project id"));
        }
        if !valid_id(&self.instance) {
            return Err(invalid("instance", "must be a Spanner instance id (lowercase letters, digits, '-')"));
        }
        if !valid_id(&self.database) {
            return Err(invalid("database", "must be a Spanner database id (lowercase letters, digits, '-', '_')"));
        }
        check_table_template(&self.table).map_err(|rule| invalid("table", rule))?;
        if self.bookkeeping_prefix.is_empty() || table_name(&self.bookkeeping_prefix) != self.bookkeeping_prefix {
            return Err(invalid("bookkeeping_prefix", "must be letters, digits and '_', starting with a letter"));
        }
        if self.deleted_rows_retention_hours == 0 {
            return Err(invalid(
                "deleted_rows_retention_hours",
                "must be at least 1: a delete's position must outlive the changes that may still arrive after it",
            ));
        }
        if self.mutation_limit < 100 || self.mutation_limit > DEFAULT_MUTATION_LIMIT {
            return Err(invalid("mutation_limit", "must be between 100 and 80000 (Spanner's limit per commit)"));
        }
        if self.abort_retries == 0 {
            return Err(invalid("abort_retries", "must be at least 1"));
        }
        if self.request_timeout_ms < 1000 {
            return Err(invalid("request_timeout_ms", "must be at least 1000"));
        }
        if let Some(host) = &self.emulator_host {
            if host.contains("://") || !host.contains(':') {
                return Err(invalid("emulator_host", "must be host:port (no scheme), e.g. 127.0.0.1:9010"));
            }
            if self.key_file.is_some() {
                return Err(invalid("key_file", "conflicts with emulator_host: an emulator takes no credentials"));
            }
        }
        if self.key_file.as_deref().is_some_and(|k| k.trim().is_empty()) {
            return Err(invalid("key_file", "must not be empty when set"));
        }
        if self.consumer_group.as_deref().is_some_and(|g| g.trim().is_empty()) {
            return Err(invalid("consumer_group", "must not be empty"));
        }
        Ok(())
    }

    /// The destination table of a source table.
    pub fn destination(&self, source: &TableId) -> DestinationTable {
        DestinationTable(table_name(&expand_table_template(&self.table, source)))
    }

    /// A bookkeeping table's name.
    pub fn bookkeeping(&self, name: &str) -> String {
        format!("{}{name}", self.bookkeeping_prefix)
    }
}

impl Validate for SpannerSinkConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        self.validate_at("spanner")
    }
}

/// A table in the Spanner database.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DestinationTable(pub String);

impl DestinationTable {
    /// The name quoted for DDL and SQL.
    pub fn quoted(&self) -> String {
        super::dialect::quote_ident(&self.0)
    }
}

impl fmt::Display for DestinationTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl SinkConfig for SpannerSinkConfig {
    fn validate_at(&self, section: &str) -> Result<(), ConfigError> {
        SpannerSinkConfig::validate_at(self, section)
    }

    fn consumer_group(&self) -> Option<&str> {
        self.consumer_group.as_deref()
    }

    fn build(&self, consumer_group: &str) -> Result<Box<dyn Sink>, ConfigError> {
        let mut config = self.clone();
        config.consumer_group = Some(consumer_group.to_string());
        Ok(Box::new(super::SpannerSink::new(config)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_field() {
        let mut c = SpannerSinkConfig::new("p", "inst", "db", "g");
        assert!(c.validate().is_ok());
        c.instance = "Bad".into();
        assert!(c.validate().unwrap_err().to_string().contains("`spanner.instance`"));
        c.instance = "inst".into();
        c.mutation_limit = 100_000;
        assert!(c.validate().unwrap_err().to_string().contains("`spanner.mutation_limit`"));
        c.mutation_limit = 1000;
        c.emulator_host = Some("127.0.0.1:9010".into());
        c.key_file = Some("/k.json".into());
        assert!(c.validate().unwrap_err().to_string().contains("`spanner.key_file`"));
    }

    #[test]
    fn destinations_are_spanner_names() {
        let c = SpannerSinkConfig::new("p", "inst", "db", "g");
        assert_eq!(c.destination(&TableId::new("public", "orders")).0, "public_orders");
        assert_eq!(c.destination(&TableId::new("my-db", "1x")).0, "my_db_1x");
        assert_eq!(table_name("1x"), "t1x");
    }
}

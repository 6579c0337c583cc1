//! Configuration of the BigQuery sink (`[bigquery]` in a sink runner's
//! config file).

use std::fmt;

use serde::Deserialize;
use tributary_operations::config::{ConfigError, Validate};
use tributary_schemas::TableId;

use crate::sink::{check_table_template, expand_table_template, Sink, SinkConfig};

/// Default destination table name: the source table's own name (the dataset
/// already tells source schemas apart).
pub const DEFAULT_TABLE_TEMPLATE: &str = "{table}";
/// Dataset of the sink's own tables: the committed offsets and the per-batch
/// staging tables.
pub const DEFAULT_BOOKKEEPING_DATASET: &str = "tributary";
/// Rows per `tabledata.insertAll` request. BigQuery recommends at most 500
/// rows per request for streaming inserts; larger requests are accepted but
/// are more likely to hit the 10 MB request limit.
pub const DEFAULT_INSERT_CHUNK_ROWS: usize = 500;
/// Per-request timeout. A MERGE of a large batch takes seconds on BigQuery;
/// one minute leaves room for a slow slot without hiding an outage.
pub const DEFAULT_REQUEST_TIMEOUT_MS: u64 = 60_000;
/// Whether the primary key is declared (`PRIMARY KEY (...) NOT ENFORCED`).
/// On by default: BigQuery uses it to optimise joins, including the MERGE.
pub const DEFAULT_DECLARE_PRIMARY_KEY: bool = true;

/// Configuration of the BigQuery sink.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BigQuerySinkConfig {
    /// Google Cloud project that holds the datasets and runs the jobs.
    pub project: String,
    /// Destination dataset of every table. Default: the source table's
    /// schema (MySQL: its database name).
    #[serde(default)]
    pub dataset: Option<String>,
    /// Destination table name; `{schema}` and `{table}` stand for the source
    /// table's schema and name. Must contain `{table}`.
    #[serde(default = "default_table_template")]
    pub table: String,
    /// Location of the datasets the sink creates (`US`, `EU`,
    /// `europe-west1`, ...). Default: BigQuery's default (`US`).
    #[serde(default)]
    pub location: Option<String>,
    /// Path of a service-account key file (JSON). Without it, and without
    /// `emulator_url`, application default credentials are used
    /// (`GOOGLE_APPLICATION_CREDENTIALS`, gcloud's user credentials, or the
    /// metadata server). The path is logged; the file's contents never are.
    #[serde(default)]
    pub key_file: Option<String>,
    /// Base URL of a BigQuery emulator, e.g. `http://127.0.0.1:9050`. No
    /// credentials are sent to it.
    #[serde(default)]
    pub emulator_url: Option<String>,
    /// Dataset of the sink's offsets table and staging tables.
    #[serde(default = "default_bookkeeping_dataset")]
    pub bookkeeping_dataset: String,
    /// Whether a table dropped in the source is dropped in the destination.
    /// Off by default: dropping data is not something to do by surprise.
    #[serde(default)]
    pub drop_tables: bool,
    /// Whether a column dropped in the source is dropped in the destination
    /// (`false`: it stays, NULL in new rows). Off by default, like
    /// `drop_tables`; see docs/schema-changes.md.
    #[serde(default)]
    pub drop_columns: bool,
    /// Declare the primary key (`NOT ENFORCED`) on the tables the sink
    /// creates. Turn it off only for an emulator that cannot parse it.
    #[serde(default = "default_declare_primary_key")]
    pub declare_primary_key: bool,
    /// Rows per `insertAll` request into a staging table.
    #[serde(default = "default_insert_chunk_rows")]
    pub insert_chunk_rows: usize,
    /// Timeout of one request, in milliseconds.
    #[serde(default = "default_request_timeout_ms")]
    pub request_timeout_ms: u64,
    /// The key of this copy's rows in the offsets table. Filled from the
    /// sink runner's `consumer_group`; set it here only to the same value.
    #[serde(default)]
    pub consumer_group: Option<String>,
    /// How long the position of a deleted row is kept (the bookkeeping
    /// dataset's `deleted_rows`): a change older than the delete that
    /// arrives later than this may bring the row back.
    #[serde(default = "default_deleted_rows_retention_hours")]
    pub deleted_rows_retention_hours: u64,
}

fn default_deleted_rows_retention_hours() -> u64 {
    crate::sink::bookkeeping::DEFAULT_DELETED_ROWS_RETENTION_HOURS
}
fn default_table_template() -> String {
    DEFAULT_TABLE_TEMPLATE.to_string()
}
fn default_bookkeeping_dataset() -> String {
    DEFAULT_BOOKKEEPING_DATASET.to_string()
}
fn default_declare_primary_key() -> bool {
    DEFAULT_DECLARE_PRIMARY_KEY
}
fn default_insert_chunk_rows() -> usize {
    DEFAULT_INSERT_CHUNK_ROWS
}
fn default_request_timeout_ms() -> u64 {
    DEFAULT_REQUEST_TIMEOUT_MS
}

impl fmt::Debug for BigQuerySinkConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Nothing here is secret (the key file is a path), but keep the
        // list explicit so that a secret field added later is not printed
        // by accident.
        f.debug_struct("BigQuerySinkConfig")
            .field("project", &self.project)
            .field("dataset", &self.dataset)
            .field("table", &self.table)
            .field("location", &self.location)
            .field("key_file", &self.key_file)
            .field("emulator_url", &self.emulator_url)
            .field("bookkeeping_dataset", &self.bookkeeping_dataset)
            .field("drop_tables", &self.drop_tables)
            .field("drop_columns", &self.drop_columns)
            .field("declare_primary_key", &self.declare_primary_key)
            .field("insert_chunk_rows", &self.insert_chunk_rows)
            .field("request_timeout_ms", &self.request_timeout_ms)
            .field("consumer_group", &self.consumer_group)
            .field("deleted_rows_retention_hours", &self.deleted_rows_retention_hours)
            .finish()
    }
}

/// A BigQuery dataset name: letters, digits and underscores, at most 1024.
fn valid_dataset(name: &str) -> bool {
    !name.is_empty() && name.len() <= 1024 && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

impl BigQuerySinkConfig {
    /// A config with defaults for everything but the project, consumer group
    /// and emulator.
    pub fn new(project: impl Into<String>, consumer_group: impl Into<String>) -> Self {
        Self {
            project: project.into(),
            dataset: None,
            table: default_table_template(),
            location: None,
            key_file: None,
            emulator_url: None,
            bookkeeping_dataset: default_bookkeeping_dataset(),
            drop_tables: false,
            drop_columns: false,
            declare_primary_key: DEFAULT_DECLARE_PRIMARY_KEY,
            insert_chunk_rows: DEFAULT_INSERT_CHUNK_ROWS,
            request_timeout_ms: DEFAULT_REQUEST_TIMEOUT_MS,
            consumer_group: Some(consumer_group.into()),
            deleted_rows_retention_hours: default_deleted_rows_retention_hours(),
        }
    }

    /// Checks every rule; errors name the field under `prefix` (`bigquery`
    /// in a sink runner's file).
    pub fn validate_at(&self, prefix: &str) -> Result<(), ConfigError> {
        if self.deleted_rows_retention_hours == 0 {
            return Err(ConfigError::invalid(
                format!("{prefix}.deleted_rows_retention_hours"),
                "must be at least 1: a delete's position must outlive the changes that may still arrive after it",
            ));
        }
        let project_ok = !self.project.is_empty()
            && self
                .project
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':'));
        if !project_ok {
            return Err(ConfigError::invalid(
                format!("{prefix}.project"),
                "must be a Google Cloud project id (letters, digits, '-', and for domain-scoped projects '.' and ':')",
            ));
        }
        if let Some(d) = &self.dataset {
            if !valid_dataset(d) {
                return Err(ConfigError::invalid(
                    format!("{prefix}.dataset"),
                    "must be a BigQuery dataset name (letters, digits and underscores)",
                ));
            }
        }
        if !valid_dataset(&self.bookkeeping_dataset) {
            return Err(ConfigError::invalid(
                format!("{prefix}.bookkeeping_dataset"),
                "must be a BigQuery dataset name (letters, digits and underscores)",
            ));
        }
        check_table_template(&self.table).map_err(|rule| ConfigError::invalid(format!("{prefix}.table"), rule))?;
        if self.table.contains('`') {
            return Err(ConfigError::invalid(format!("{prefix}.table"), "must not contain a backtick"));
        }
        if let Some(url) = &self.emulator_url {
            if !url.starts_with("http://") && !url.starts_with("https://") {
                return Err(ConfigError::invalid(
                    format!("{prefix}.emulator_url"),
                    "must be an http:// or https:// URL",
                ));
            }
            if self.key_file.is_some() {
                return Err(ConfigError::invalid(
                    format!("{prefix}.key_file"),
                    "conflicts with emulator_url: an emulator takes no credentials",
                ));
            }
        }
        if let Some(k) = &self.key_file {
            if k.trim().is_empty() {
                return Err(ConfigError::invalid(format!("{prefix}.key_file"), "must not be empty when set"));
            }
        }
        if self.insert_chunk_rows == 0 || self.insert_chunk_rows > 50_000 {
            return Err(ConfigError::invalid(
                format!("{prefix}.insert_chunk_rows"),
                "must be between 1 and 50000 (BigQuery's limit per insertAll request)",
            ));
        }
        if self.request_timeout_ms < 1000 {
            return Err(ConfigError::invalid(format!("{prefix}.request_timeout_ms"), "must be at least 1000"));
        }
        if let Some(group) = &self.consumer_group {
            if group.trim().is_empty() {
                return Err(ConfigError::invalid(format!("{prefix}.consumer_group"), "must not be empty"));
            }
        }
        Ok(())
    }

    /// The destination table of a source table.
    pub fn destination(&self, source: &TableId) -> DestinationTable {
        DestinationTable {
            project: self.project.clone(),
            dataset: self.dataset.clone().unwrap_or_else(|| source.schema.clone()),
            table: expand_table_template(&self.table, source),
        }
    }
}

impl Validate for BigQuerySinkConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        self.validate_at("bigquery")
    }
}

/// A table in BigQuery.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DestinationTable {
    /// Project.
    pub project: String,
    /// Dataset.
    pub dataset: String,
    /// Table.
    pub table: String,
}

impl DestinationTable {
    /// The quoted, fully qualified name for SQL: `` `project.dataset.table` ``.
    pub fn quoted(&self) -> String {
        format!("`{}.{}.{}`", self.project, self.dataset, self.table.replace('`', ""))
    }
}

impl fmt::Display for DestinationTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.dataset, self.table)
    }
}

impl SinkConfig for BigQuerySinkConfig {
    /// Batches wait for the whole linger: every MERGE is a billed job under a per-table DML quota.
    fn writes_when_idle(&self) -> bool {
        false
    }

    fn validate_at(&self, section: &str) -> Result<(), ConfigError> {
        BigQuerySinkConfig::validate_at(self, section)
    }

    fn consumer_group(&self) -> Option<&str> {
        self.consumer_group.as_deref()
    }

    fn build(&self, consumer_group: &str) -> Result<Box<dyn Sink>, ConfigError> {
        let mut config = self.clone();
        config.consumer_group = Some(consumer_group.to_string());
        Ok(Box::new(super::BigQuerySink::new(config)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_field() {
        let mut c = BigQuerySinkConfig::new("my-project", "g");
        assert!(c.validate().is_ok());
        c.dataset = Some("bad-name".into());
        assert!(c.validate().unwrap_err().to_string().contains("`bigquery.dataset`"));
        c.dataset = None;
        c.emulator_url = Some("http://127.0.0.1:9050".into());
        c.key_file = Some("/k.json".into());
        assert!(c.validate().unwrap_err().to_string().contains("`bigquery.key_file`"));
        c.key_file = None;
        c.table = "x".into();
        assert!(c.validate().unwrap_err().to_string().contains("`bigquery.table`"));
    }

    #[test]
    fn destinations_follow_the_templates() {
        let mut c = BigQuerySinkConfig::new("p", "g");
        let t = TableId::new("public", "orders");
        assert_eq!(c.destination(&t).quoted(), "`p.public.orders`");
        c.dataset = Some("warehouse".into());
        c.table = "{schema}_{table}".into();
        assert_eq!(c.destination(&t).quoted(), "`p.warehouse.public_orders`");
    }
}

//! Configuration of the Snowflake sink (`[snowflake]` in a sink runner's
//! config file) and the destination table of each source table.

use std::fmt;

use serde::Deserialize;
use tributary_operations::config::{ConfigError, Validate};
use tributary_schemas::TableId;

use super::dialect::quote_ident;
use crate::sink::{check_table_template, expand_table_template, Sink, SinkConfig};

/// Default destination table name: the source table's own name.
pub const DEFAULT_TABLE_TEMPLATE: &str = "{table}";
/// Schema of the sink's own tables (offsets, deleted rows, resets) and of
/// its session, where its temporary staging tables live.
pub const DEFAULT_BOOKKEEPING_SCHEMA: &str = crate::sink::bookkeeping::BOOKKEEPING_SCHEMA;
/// Timeout of one HTTP request. Snowflake answers a query request within
/// about 45 s even when the query runs on (it then says "in progress" and
/// the client polls), so one minute only cuts off a dead connection.
pub const DEFAULT_REQUEST_TIMEOUT_MS: u64 = 60_000;
/// How long the sink waits for one statement, polling included, before it
/// gives up (retryably: the batch is one transaction). A resuming
/// warehouse takes seconds; a MERGE-sized DELETE + INSERT of a large batch
/// on an XS warehouse can take minutes.
pub const DEFAULT_QUERY_TIMEOUT_MS: u64 = 600_000;
/// Rows per array-bound INSERT into a staging table. Snowflake's limit is
/// the request size (16 MB of bind data); 5,000 rows of a few hundred bytes
/// stay far below it.
pub const DEFAULT_INSERT_CHUNK_ROWS: usize = 5_000;
/// Rows of one table's write above which they are staged through the
/// session's internal stage (one gzipped CSV file: `PUT`, upload, `COPY
/// INTO`) instead of array-bound INSERTs. Three requests whatever the size,
/// where INSERTs take one per `insert_chunk_rows` and carry the rows as
/// JSON; Snowflake's own drivers switch an array binding to a stage at
/// 65,280 bound values (CLIENT_STAGE_ARRAY_BINDING_THRESHOLD), about
/// 10,000 rows of six columns.
pub const DEFAULT_STAGE_THRESHOLD_ROWS: usize = 10_000;
/// Below this many rows a stage's three requests cost more than the one
/// INSERT they replace.
pub const MIN_STAGE_THRESHOLD_ROWS: usize = 10;
/// Whether the primary key is declared on the tables the sink creates.
/// Snowflake does not enforce it; it documents the key for readers and BI
/// tools. (fakesnow, a DuckDB, enforces it and then refuses to widen a key
/// column: its tests turn it off.)
pub const DEFAULT_DECLARE_PRIMARY_KEY: bool = true;

/// Configuration of the Snowflake sink.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnowflakeSinkConfig {
    /// Base URL of the account, e.g.
    /// `https://myorg-myaccount.snowflakecomputing.com` (or an emulator's).
    pub url: String,
    /// Account identifier (`myorg-myaccount`), sent at login.
    pub account: String,
    /// Login name.
    pub user: String,
    /// Password: inline, `env:NAME` or `file:/path`. Never logged. One of
    /// `password` and `private_key`.
    #[serde(default)]
    pub password: Option<String>,
    /// Key-pair (JWT) login: the user's RSA private key in PEM (PKCS#8
    /// `BEGIN PRIVATE KEY`, PKCS#1 `BEGIN RSA PRIVATE KEY`, or encrypted
    /// PKCS#8 `BEGIN ENCRYPTED PRIVATE KEY` with `private_key_passphrase`):
    /// inline, `env:NAME` or, usually, `file:/path`. Never logged. The
    /// public key is the user's `RSA_PUBLIC_KEY`.
    #[serde(default)]
    pub private_key: Option<String>,
    /// Passphrase of an encrypted `private_key`: inline, `env:NAME` or
    /// `file:/path`. Never logged. Only with an encrypted key.
    #[serde(default)]
    pub private_key_passphrase: Option<String>,
    /// Role of the session. Default: the user's default role.
    #[serde(default)]
    pub role: Option<String>,
    /// Warehouse that runs the statements. Default: the user's default.
    #[serde(default)]
    pub warehouse: Option<String>,
    /// Database of every destination table and of the bookkeeping schema.
    pub database: String,
    /// Destination schema of every table. Default: the source table's
    /// schema (MySQL: its database name).
    #[serde(default)]
    pub schema: Option<String>,
    /// Destination table name; `{schema}` and `{table}` stand for the source
    /// table's schema and name. Must contain `{table}`.
    #[serde(default = "default_table_template")]
    pub table: String,
    /// Schema of the sink's own tables and of its session.
    #[serde(default = "default_bookkeeping_schema")]
    pub bookkeeping_schema: String,
    /// Whether a table dropped in the source is dropped in the destination.
    /// Off by default: dropping data is not something to do by surprise.
    #[serde(default)]
    pub drop_tables: bool,
    /// Whether a column dropped in the source is dropped in the destination
    /// (`false`: it stays, NULL in new rows). See docs/schema-changes.md.
    #[serde(default)]
    pub drop_columns: bool,
    /// Declare the (unenforced) primary key on the tables the sink creates.
    #[serde(default = "default_declare_primary_key")]
    pub declare_primary_key: bool,
    /// Rows per array-bound INSERT into a staging table.
    #[serde(default = "default_insert_chunk_rows")]
    pub insert_chunk_rows: usize,
    /// Rows of one table's write above which they go through an internal
    /// stage (PUT + COPY INTO) instead of array-bound INSERTs; 0: never.
    #[serde(default = "default_stage_threshold_rows")]
    pub stage_threshold_rows: usize,
    /// Timeout of one HTTP request, in milliseconds.
    #[serde(default = "default_request_timeout_ms")]
    pub request_timeout_ms: u64,
    /// How long one statement may take, polling included, in milliseconds.
    #[serde(default = "default_query_timeout_ms")]
    pub query_timeout_ms: u64,
    /// The key of this copy's rows in the offsets table. Filled from the
    /// sink runner's `consumer_group`; set it here only to the same value.
    #[serde(default)]
    pub consumer_group: Option<String>,
    /// How long the position of a deleted row is kept (the bookkeeping
    /// schema's `deleted_rows`).
    #[serde(default = "default_deleted_rows_retention_hours")]
    pub deleted_rows_retention_hours: u64,
}

fn default_table_template() -> String {
    DEFAULT_TABLE_TEMPLATE.to_string()
}
fn default_bookkeeping_schema() -> String {
    DEFAULT_BOOKKEEPING_SCHEMA.to_string()
}
fn default_declare_primary_key() -> bool {
    DEFAULT_DECLARE_PRIMARY_KEY
}
fn default_insert_chunk_rows() -> usize {
    DEFAULT_INSERT_CHUNK_ROWS
}
fn default_stage_threshold_rows() -> usize {
    DEFAULT_STAGE_THRESHOLD_ROWS
}
fn default_request_timeout_ms() -> u64 {
    DEFAULT_REQUEST_TIMEOUT_MS
}
fn default_query_timeout_ms() -> u64 {
    DEFAULT_QUERY_TIMEOUT_MS
}
fn default_deleted_rows_retention_hours() -> u64 {
    crate::sink::bookkeeping::DEFAULT_DELETED_ROWS_RETENTION_HOURS
}

impl fmt::Debug for SnowflakeSinkConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SnowflakeSinkConfig")
            .field("url", &self.url)
            .field("account", &self.account)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("private_key", &self.private_key.as_ref().map(|_| "***"))
            .field("private_key_passphrase", &self.private_key_passphrase.as_ref().map(|_| "***"))
            .field("role", &self.role)
            .field("warehouse", &self.warehouse)
            .field("database", &self.database)
            .field("schema", &self.schema)
            .field("table", &self.table)
            .field("bookkeeping_schema", &self.bookkeeping_schema)
            .field("drop_tables", &self.drop_tables)
            .field("drop_columns", &self.drop_columns)
            .field("declare_primary_key", &self.declare_primary_key)
            .field("insert_chunk_rows", &self.insert_chunk_rows)
            .field("stage_threshold_rows", &self.stage_threshold_rows)
            .field("request_timeout_ms", &self.request_timeout_ms)
            .field("query_timeout_ms", &self.query_timeout_ms)
            .field("consumer_group", &self.consumer_group)
            .field("deleted_rows_retention_hours", &self.deleted_rows_retention_hours)
            .finish()
    }
}

impl SnowflakeSinkConfig {
    /// A config with defaults for everything but where to log in.
    pub fn new(
        url: impl Into<String>,
        account: impl Into<String>,
        user: impl Into<String>,
        password: impl Into<String>,
        database: impl Into<String>,
        consumer_group: impl Into<String>,
    ) -> Self {
        Self {
            url: url.into(),
            account: account.into(),
            user: user.into(),
            password: Some(password.into()),
            private_key: None,
            private_key_passphrase: None,
            role: None,
            warehouse: None,
            database: database.into(),
            schema: None,
            table: default_table_template(),
            bookkeeping_schema: default_bookkeeping_schema(),
            drop_tables: false,
            drop_columns: false,
            declare_primary_key: DEFAULT_DECLARE_PRIMARY_KEY,
            insert_chunk_rows: DEFAULT_INSERT_CHUNK_ROWS,
            stage_threshold_rows: DEFAULT_STAGE_THRESHOLD_ROWS,
            request_timeout_ms: DEFAULT_REQUEST_TIMEOUT_MS,
            query_timeout_ms: DEFAULT_QUERY_TIMEOUT_MS,
            consumer_group: Some(consumer_group.into()),
            deleted_rows_retention_hours: default_deleted_rows_retention_hours(),
        }
    }

    /// Checks every rule; errors name the field under `prefix`.
    pub fn validate_at(&self, prefix: &str) -> Result<(), ConfigError> {
        let field = |f: &str| format!("{prefix}.{f}");
        if !self.url.starts_with("http://") && !self.url.starts_with("https://") {
            return Err(ConfigError::invalid(field("url"), "must be an http:// or https:// URL"));
        }
        for (name, value) in [
            ("account", &self.account),
            ("user", &self.user),
            ("database", &self.database),
        ] {
            if value.trim().is_empty() {
                return Err(ConfigError::invalid(field(name), "must not be empty"));
            }
        }
        match (&self.password, &self.private_key) {
            (Some(_), Some(_)) => {
                return Err(ConfigError::invalid(
                    field("private_key"),
                    "give either password or private_key (key-pair login), not both",
                ))
            }
            (None, None) => {
                return Err(ConfigError::invalid(
                    field("password"),
                    "is required, or private_key for a key-pair login (inline, env:NAME or file:/path)",
                ))
            }
            (Some(p), None) if p.is_empty() => {
                return Err(ConfigError::invalid(
                    field("password"),
                    "must not be empty (inline, env:NAME or file:/path)",
                ))
            }
            (None, Some(k)) if k.is_empty() => {
                return Err(ConfigError::invalid(
                    field("private_key"),
                    "must not be empty (inline, env:NAME or file:/path)",
                ))
            }
            _ => {}
        }
        match (&self.private_key, &self.private_key_passphrase) {
            (None, Some(_)) => {
                return Err(ConfigError::invalid(
                    field("private_key_passphrase"),
                    "is only used with private_key (an encrypted key): remove it or give the key",
                ))
            }
            (Some(_), Some(p)) if p.is_empty() => {
                return Err(ConfigError::invalid(
                    field("private_key_passphrase"),
                    "must not be empty (inline, env:NAME or file:/path)",
                ))
            }
            _ => {}
        }
        if self.bookkeeping_schema.trim().is_empty() {
            return Err(ConfigError::invalid(field("bookkeeping_schema"), "must not be empty"));
        }
        check_table_template(&self.table).map_err(|rule| ConfigError::invalid(field("table"), rule))?;
        if self.insert_chunk_rows == 0 || self.insert_chunk_rows > 100_000 {
            return Err(ConfigError::invalid(field("insert_chunk_rows"), "must be between 1 and 100000"));
        }
        if self.stage_threshold_rows != 0 && self.stage_threshold_rows < MIN_STAGE_THRESHOLD_ROWS {
            return Err(ConfigError::invalid(
                field("stage_threshold_rows"),
                format!(
                    "must be 0 (never through a stage) or at least {MIN_STAGE_THRESHOLD_ROWS}: below that, PUT, \
                     upload and COPY INTO cost more requests than the INSERT they replace"
                ),
            ));
        }
        if self.request_timeout_ms < 1000 {
            return Err(ConfigError::invalid(field("request_timeout_ms"), "must be at least 1000"));
        }
        if self.query_timeout_ms < self.request_timeout_ms {
            return Err(ConfigError::invalid(field("query_timeout_ms"), "must be at least request_timeout_ms"));
        }
        if self.deleted_rows_retention_hours == 0 {
            return Err(ConfigError::invalid(
                field("deleted_rows_retention_hours"),
                "must be at least 1: a delete's position must outlive the changes that may still arrive after it",
            ));
        }
        if let Some(group) = &self.consumer_group {
            if group.trim().is_empty() {
                return Err(ConfigError::invalid(field("consumer_group"), "must not be empty"));
            }
        }
        Ok(())
    }

    /// The destination table of a source table.
    pub fn destination(&self, source: &TableId) -> DestinationTable {
        DestinationTable {
            database: self.database.clone(),
            schema: self.schema.clone().unwrap_or_else(|| source.schema.clone()),
            table: expand_table_template(&self.table, source),
        }
    }
}

impl Validate for SnowflakeSinkConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        self.validate_at("snowflake")
    }
}

/// A table in Snowflake. Names are kept exactly as the source spells them
/// (quoted), so `public.orders` is `"public"."orders"`, not `PUBLIC.ORDERS`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DestinationTable {
    /// Database.
    pub database: String,
    /// Schema.
    pub schema: String,
    /// Table.
    pub table: String,
}

impl DestinationTable {
    /// The quoted, fully qualified name for SQL.
    pub fn quoted(&self) -> String {
        format!("{}.{}.{}", quote_ident(&self.database), quote_ident(&self.schema), quote_ident(&self.table))
    }
}

impl fmt::Display for DestinationTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.schema, self.table)
    }
}

impl SinkConfig for SnowflakeSinkConfig {
    /// Batches wait for the whole linger: every write runs the warehouse, which bills by the second it runs.
    fn writes_when_idle(&self) -> bool {
        false
    }

    fn validate_at(&self, section: &str) -> Result<(), ConfigError> {
        SnowflakeSinkConfig::validate_at(self, section)
    }

    fn consumer_group(&self) -> Option<&str> {
        self.consumer_group.as_deref()
    }

    fn build(&self, consumer_group: &str) -> Result<Box<dyn Sink>, ConfigError> {
        let mut config = self.clone();
        config.consumer_group = Some(consumer_group.to_string());
        Ok(Box::new(super::SnowflakeSink::new(config)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> SnowflakeSinkConfig {
        SnowflakeSinkConfig::new("https://a.snowflakecomputing.com", "a", "u", "p", "DB", "g")
    }

    #[test]
    fn errors_name_the_field() {
        let mut c = config();
        assert!(c.validate().is_ok());
        c.url = "a.snowflakecomputing.com".into();
        assert!(c.validate().unwrap_err().to_string().contains("`snowflake.url`"));
        c = config();
        c.table = "x".into();
        assert!(c.validate().unwrap_err().to_string().contains("`snowflake.table`"));
        c = config();
        c.stage_threshold_rows = 3;
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("`snowflake.stage_threshold_rows`"));
        c.stage_threshold_rows = 0;
        c.validate().expect("0: never through a stage");
        c = config();
        c.query_timeout_ms = 10;
        assert!(c.validate().unwrap_err().to_string().contains("`snowflake.query_timeout_ms`"));
    }

    #[test]
    fn the_password_is_never_printed() {
        let mut c = config();
        c.password = Some("hunter2".into());
        assert!(!format!("{c:?}").contains("hunter2"));
        c.password = None;
        c.private_key = Some("-----BEGIN PRIVATE KEY-----secret".into());
        c.private_key_passphrase = Some("opensesame".into());
        let printed = format!("{c:?}");
        assert!(!printed.contains("secret") && !printed.contains("opensesame"), "{printed}");
    }

    #[test]
    fn a_password_or_a_private_key() {
        let mut c = config();
        c.validate_at("snowflake").expect("a password");
        c.private_key = Some("file:/etc/key.p8".into());
        let e = c.validate_at("snowflake").expect_err("both").to_string();
        assert!(e.contains("snowflake.private_key") && e.contains("not both"), "{e}");
        c.password = None;
        c.validate_at("snowflake").expect("a key");
        c.private_key_passphrase = Some("env:KEY_PASSPHRASE".into());
        c.validate_at("snowflake").expect("an encrypted key and its passphrase");
        c.private_key = None;
        c.password = Some("p".into());
        let e = c.validate_at("snowflake").expect_err("a passphrase without a key").to_string();
        assert!(e.contains("snowflake.private_key_passphrase") && e.contains("only used with private_key"), "{e}");
        c.password = None;
        c.private_key_passphrase = None;
        let e = c.validate_at("snowflake").expect_err("neither").to_string();
        assert!(e.contains("snowflake.password") && e.contains("private_key"), "{e}");
    }

    #[test]
    fn destinations_follow_the_templates() {
        let mut c = config();
        let t = TableId::new("public", "orders");
        assert_eq!(c.destination(&t).quoted(), "\"DB\".\"public\".\"orders\"");
        c.schema = Some("RAW".into());
        c.table = "{schema}_{table}".into();
        assert_eq!(c.destination(&t).quoted(), "\"DB\".\"RAW\".\"public_orders\"");
    }
}

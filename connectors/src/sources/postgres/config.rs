//! The PostgreSQL source's configuration (`[postgres]` in a source runner's
//! config file): what to read, from where, and how fast.
//!
//! Configuration types are separate from running types: [`PostgresSourceConfig`]
//! is what an operator writes; [`ConnectionParams`] is what the source connects
//! with once secrets are resolved.

use std::collections::BTreeMap;
use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
pub use tributary_operations::config::redact_url;
use tributary_operations::config::{resolve_secret, ConfigError, Validate};
use tributary_schemas::TableId;

use crate::error::{Error, Result};
pub use crate::pgwire::tls::{validate_tls, TlsMode};
pub use crate::selection::{TableFilter, TablePattern};

/// Default replication slot name. One slot per runner: two runners on one
/// slot would steal each other's changes, so runners usually override it.
pub const DEFAULT_SLOT_NAME: &str = "tributary";
/// Default publication name.
pub const DEFAULT_PUBLICATION_NAME: &str = "tributary";
/// Rows per snapshot chunk: the unit of decoded rows in memory and of
/// resumption. About 1 KiB per decoded row of 10 columns, and a few chunks
/// are in flight (one per worker, one waiting, one being produced), so this
/// sets most of the runner's memory. Consecutive chunks share a Kafka
/// transaction (the runner's `TXN_MAX_EVENTS`), so small chunks cost no
/// extra commits.
pub const DEFAULT_SNAPSHOT_CHUNK_ROWS: u64 = 4096;
/// Snapshot connections. Two keeps one chunk being read while the previous
/// one is encoded and produced, without loading a busy primary much.
pub const DEFAULT_SNAPSHOT_PARALLELISM: usize = 2;
/// Heartbeat interval: how often an idle source still returns a batch (and
/// moves the slot's flush position). 10 s keeps WAL retention on a quiet
/// database small without writing many offsets records.
pub const DEFAULT_HEARTBEAT_INTERVAL_MS: u64 = 10_000;
/// How often the sequences of captured tables are read and, when they
/// moved, sent to the sinks. Sequences are not in the WAL's changes: a
/// destination is behind its source by at most this much (plus the copy's
/// lag); 5 s is one cheap catalog query.
pub const DEFAULT_SEQUENCE_INTERVAL_MS: u64 = 5_000;
/// Events per streamed batch. Batches end at transaction boundaries, so one
/// large transaction can exceed this; it only stops collecting more.
pub const DEFAULT_MAX_BATCH_EVENTS: usize = 10_000;
/// Approximate bytes of row data per streamed batch (same rule as events).
pub const DEFAULT_MAX_BATCH_BYTES: usize = 8 * 1024 * 1024;
/// How long a batch waits for more transactions once it has one. Short: it
/// only exists to group bursts of small transactions into one Kafka
/// transaction; latency stays in the tens of milliseconds.
pub const DEFAULT_BATCH_LINGER_MS: u64 = 50;
/// Connect timeout. Long enough for a cross-region TLS handshake, short
/// enough that a down server is reported (as retryable) quickly.
pub const DEFAULT_CONNECT_TIMEOUT_MS: u64 = 10_000;
/// How long the source waits for the answer to one catalog query (table
/// lists, schemas, checks) before it gives up on that session and starts
/// over. They take milliseconds; a minute covers a server busy enough to
/// queue them. Without it, a session that stalls without closing (a
/// silent network path, a frozen proxy) held the source until TCP gave up.
pub const DEFAULT_CATALOG_TIMEOUT_MS: u64 = 60_000;

/// What to do with a table created after the source started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum NewTables {
    /// A new table that matches the include patterns is added to the
    /// publication, snapshotted, then streamed.
    #[default]
    Capture,
    /// New tables are ignored until the runner restarts.
    Ignore,
}

pub use crate::source::SnapshotMode;

/// The `[postgres]` section of a source runner.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PostgresSourceConfig {
    /// Connection URL, `postgres://user[:password]@host[:port]/database`.
    /// The password part may be `env:NAME` or `file:/path`; prefer the
    /// `password` field. Never logged.
    pub url: SecretString,
    /// Password, inline or as `env:NAME` / `file:/path`; overrides the URL's.
    #[serde(default)]
    pub password: Option<SecretString>,
    /// Logical replication slot (created on first start).
    #[serde(default = "default_slot")]
    pub slot_name: String,
    /// Publication (created on first start when the role may).
    #[serde(default = "default_publication")]
    pub publication_name: String,
    /// Tables to capture: `schema.table` globs (`*`, `?`) or, prefixed with
    /// `re:`, regular expressions matched against the whole `schema.table`.
    #[serde(default = "default_include")]
    pub include: Vec<String>,
    /// Tables to leave out (same syntax); wins over `include`.
    #[serde(default)]
    pub exclude: Vec<String>,
    /// Columns never read: `schema.table.column` globs (or `re:` regexes).
    #[serde(default)]
    pub exclude_columns: Vec<String>,
    /// Keys of tables without a primary key: `"schema.table" = ["col", ...]`.
    #[serde(default)]
    pub keys: BTreeMap<String, Vec<String>>,
    /// Tables created later: `capture` or `ignore`.
    #[serde(default)]
    pub new_tables: NewTables,
    /// `initial` or `never`.
    #[serde(default)]
    pub snapshot_mode: SnapshotMode,
    /// Rows per snapshot chunk (one Kafka transaction each).
    #[serde(default = "default_chunk_rows")]
    pub snapshot_chunk_rows: u64,
    /// Snapshot connections working in parallel (across tables and key ranges).
    #[serde(default = "default_parallelism")]
    pub snapshot_parallelism: usize,
    /// Heartbeat interval in milliseconds.
    #[serde(default = "default_heartbeat")]
    pub heartbeat_interval_ms: u64,
    /// How often the captured tables' sequences are read, in milliseconds
    /// (0: never).
    #[serde(default = "default_sequence_interval")]
    pub sequence_interval_ms: u64,
    /// Whether the copied tables' indexes, constraints and defaults are
    /// read (every `sequence_interval_ms`) and sent, for PostgreSQL
    /// destinations that recreate them (docs/migration.md).
    #[serde(default = "default_true")]
    pub schema_objects: bool,
    /// Most events per streamed batch.
    #[serde(default = "default_max_events")]
    pub max_batch_events: usize,
    /// Most bytes of row data per streamed batch.
    #[serde(default = "default_max_bytes")]
    pub max_batch_bytes: usize,
    /// How long a non-empty batch waits for more transactions, milliseconds.
    #[serde(default = "default_linger")]
    pub batch_linger_ms: u64,
    /// Connect timeout, milliseconds.
    #[serde(default = "default_connect_timeout")]
    pub connect_timeout_ms: u64,
    /// The longest wait for one catalog query's answer, milliseconds.
    #[serde(default = "default_catalog_timeout")]
    pub catalog_timeout_ms: u64,
    /// `disable`, `require`, `verify-ca` or `verify-full`.
    #[serde(default)]
    pub tls: TlsMode,
    /// CA bundle for `verify-ca` / `verify-full`.
    #[serde(default)]
    pub tls_ca_file: Option<String>,
    /// Install the DDL event trigger on start when the role may (superuser).
    #[serde(default = "default_true")]
    pub install_ddl_trigger: bool,
}

impl std::fmt::Debug for PostgresSourceConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresSourceConfig")
            .field("url", &redact_url(self.url.expose_secret()))
            .field("password", &self.password.as_ref().map(|_| "[redacted]"))
            .field("slot_name", &self.slot_name)
            .field("publication_name", &self.publication_name)
            .field("include", &self.include)
            .field("exclude", &self.exclude)
            .field("exclude_columns", &self.exclude_columns)
            .field("keys", &self.keys)
            .field("new_tables", &self.new_tables)
            .field("snapshot_mode", &self.snapshot_mode)
            .field("snapshot_chunk_rows", &self.snapshot_chunk_rows)
            .field("snapshot_parallelism", &self.snapshot_parallelism)
            .field("heartbeat_interval_ms", &self.heartbeat_interval_ms)
            .field("sequence_interval_ms", &self.sequence_interval_ms)
            .field("schema_objects", &self.schema_objects)
            .field("max_batch_events", &self.max_batch_events)
            .field("max_batch_bytes", &self.max_batch_bytes)
            .field("batch_linger_ms", &self.batch_linger_ms)
            .field("tls", &self.tls)
            .finish_non_exhaustive()
    }
}

fn default_slot() -> String {
    DEFAULT_SLOT_NAME.to_string()
}
fn default_publication() -> String {
    DEFAULT_PUBLICATION_NAME.to_string()
}
fn default_include() -> Vec<String> {
    vec!["public.*".to_string()]
}
fn default_chunk_rows() -> u64 {
    DEFAULT_SNAPSHOT_CHUNK_ROWS
}
fn default_parallelism() -> usize {
    DEFAULT_SNAPSHOT_PARALLELISM
}
fn default_heartbeat() -> u64 {
    DEFAULT_HEARTBEAT_INTERVAL_MS
}
fn default_sequence_interval() -> u64 {
    DEFAULT_SEQUENCE_INTERVAL_MS
}
fn default_max_events() -> usize {
    DEFAULT_MAX_BATCH_EVENTS
}
fn default_max_bytes() -> usize {
    DEFAULT_MAX_BATCH_BYTES
}
fn default_linger() -> u64 {
    DEFAULT_BATCH_LINGER_MS
}
fn default_connect_timeout() -> u64 {
    DEFAULT_CONNECT_TIMEOUT_MS
}
fn default_catalog_timeout() -> u64 {
    DEFAULT_CATALOG_TIMEOUT_MS
}
fn default_true() -> bool {
    true
}

fn valid_identifier(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

impl PostgresSourceConfig {
    /// A config with every default and the given URL (tests and tools).
    pub fn with_url(url: impl Into<String>) -> Self {
        Self {
            url: SecretString::from(url.into()),
            password: None,
            slot_name: default_slot(),
            publication_name: default_publication(),
            include: default_include(),
            exclude: Vec::new(),
            exclude_columns: Vec::new(),
            keys: BTreeMap::new(),
            new_tables: NewTables::default(),
            snapshot_mode: SnapshotMode::default(),
            snapshot_chunk_rows: DEFAULT_SNAPSHOT_CHUNK_ROWS,
            snapshot_parallelism: DEFAULT_SNAPSHOT_PARALLELISM,
            heartbeat_interval_ms: DEFAULT_HEARTBEAT_INTERVAL_MS,
            sequence_interval_ms: DEFAULT_SEQUENCE_INTERVAL_MS,
            schema_objects: true,
            max_batch_events: DEFAULT_MAX_BATCH_EVENTS,
            max_batch_bytes: DEFAULT_MAX_BATCH_BYTES,
            batch_linger_ms: DEFAULT_BATCH_LINGER_MS,
            connect_timeout_ms: DEFAULT_CONNECT_TIMEOUT_MS,
            catalog_timeout_ms: DEFAULT_CATALOG_TIMEOUT_MS,
            tls: TlsMode::default(),
            tls_ca_file: None,
            install_ddl_trigger: true,
        }
    }

    /// Checks every rule; errors name the field under `prefix`
    /// (e.g. `postgres.slot_name`).
    pub fn validate_as(&self, prefix: &str) -> Result<(), ConfigError> {
        let field = |name: &str| {
            if prefix.is_empty() {
                name.to_string()
            } else {
                format!("{prefix}.{name}")
            }
        };
        let url = self.url.expose_secret();
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            return Err(ConfigError::invalid(field("url"), "must be a postgres:// or postgresql:// URL"));
        }
        if url.parse::<tokio_postgres::Config>().is_err() {
            return Err(ConfigError::invalid(field("url"), "is not a valid PostgreSQL URL"));
        }
        if !valid_identifier(&self.slot_name) {
            return Err(ConfigError::invalid(
                field("slot_name"),
                "must be 1-63 characters of lower-case letters, digits and '_' (PostgreSQL's rule for slot names)",
            ));
        }
        if !valid_identifier(&self.publication_name) {
            return Err(ConfigError::invalid(
                field("publication_name"),
                "must be 1-63 characters of lower-case letters, digits and '_'",
            ));
        }
        if self.include.is_empty() {
            return Err(ConfigError::invalid(field("include"), "must name at least one pattern"));
        }
        for (name, list) in [("include", &self.include), ("exclude", &self.exclude)] {
            for p in list {
                TablePattern::parse(p, 2).map_err(|rule| ConfigError::invalid(field(name), rule))?;
            }
        }
        for p in &self.exclude_columns {
            TablePattern::parse(p, 3).map_err(|rule| ConfigError::invalid(field("exclude_columns"), rule))?;
        }
        for (table, cols) in &self.keys {
            if table.split('.').count() != 2 {
                return Err(ConfigError::invalid(field("keys"), format!("key `{table}` must be `schema.table`")));
            }
            if cols.is_empty() {
                return Err(ConfigError::invalid(field("keys"), format!("`{table}` must list at least one column")));
            }
        }
        if self.snapshot_chunk_rows < 1 || self.snapshot_chunk_rows > 1_000_000 {
            return Err(ConfigError::invalid(
                field("snapshot_chunk_rows"),
                "must be between 1 and 1000000 (a chunk is held in memory once)",
            ));
        }
        if self.snapshot_parallelism < 1 || self.snapshot_parallelism > 64 {
            return Err(ConfigError::invalid(field("snapshot_parallelism"), "must be between 1 and 64"));
        }
        if self.heartbeat_interval_ms < 100 {
            return Err(ConfigError::invalid(field("heartbeat_interval_ms"), "must be at least 100"));
        }
        if self.sequence_interval_ms != 0 && self.sequence_interval_ms < 100 {
            return Err(ConfigError::invalid(field("sequence_interval_ms"), "must be 0 (never) or at least 100"));
        }
        if self.max_batch_events < 1 {
            return Err(ConfigError::invalid(field("max_batch_events"), "must be at least 1"));
        }
        if self.max_batch_bytes < 1024 {
            return Err(ConfigError::invalid(field("max_batch_bytes"), "must be at least 1024"));
        }
        if self.batch_linger_ms >= self.heartbeat_interval_ms {
            return Err(ConfigError::invalid(field("batch_linger_ms"), "must be shorter than heartbeat_interval_ms"));
        }
        if self.catalog_timeout_ms < 1000 {
            return Err(ConfigError::invalid(field("catalog_timeout_ms"), "must be at least 1000"));
        }
        validate_tls(self.tls, self.tls_ca_file.as_deref(), field)?;
        Ok(())
    }

    /// Resolves secrets and parses the URL into what the source connects with.
    pub fn connection(&self) -> Result<ConnectionParams> {
        let mut pg: tokio_postgres::Config = self
            .url
            .expose_secret()
            .parse()
            .map_err(|_| Error::needs_operator("field `postgres.url` is not a valid PostgreSQL URL"))?;
        let host = match pg.get_hosts().first() {
            Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
            #[cfg(unix)]
            Some(tokio_postgres::config::Host::Unix(p)) => p.display().to_string(),
            None => "localhost".to_string(),
        };
        let port = pg.get_ports().first().copied().unwrap_or(5432);
        let user = pg
            .get_user()
            .map(str::to_string)
            .ok_or_else(|| Error::needs_operator("field `postgres.url` must name a user"))?;
        let database = pg.get_dbname().unwrap_or(&user).to_string();
        let raw_password = match &self.password {
            Some(p) => Some(p.expose_secret().to_string()),
            None => pg.get_password().map(|p| String::from_utf8_lossy(p).into_owned()),
        };
        let password = match raw_password {
            Some(raw) => resolve_secret("postgres.password", &raw).map_err(|e| Error::needs_operator(e.to_string()))?,
            None => SecretString::from(String::new()),
        };
        pg.password(password.expose_secret().as_bytes());
        pg.dbname(&database);
        pg.options(SESSION_OPTIONS);
        pg.application_name("tributary");
        pg.connect_timeout(Duration::from_millis(self.connect_timeout_ms));
        pg.keepalives(true);
        Ok(ConnectionParams {
            pg,
            host,
            port,
            user,
            database,
            password,
            tls: self.tls,
            tls_ca_file: self.tls_ca_file.clone(),
            connect_timeout: Duration::from_millis(self.connect_timeout_ms),
            catalog_timeout: Duration::from_millis(self.catalog_timeout_ms),
        })
    }

    /// The table filter built from `include`, `exclude`, `exclude_columns`.
    pub fn filter(&self) -> TableFilter {
        TableFilter::from_patterns(&self.include, &self.exclude, &self.exclude_columns)
    }

    /// The configured key of `table`, if any.
    pub fn configured_key(&self, table: &TableId) -> Option<&Vec<String>> {
        self.keys.get(&table.to_string())
    }

    /// The heartbeat interval.
    pub fn heartbeat_interval(&self) -> Duration {
        Duration::from_millis(self.heartbeat_interval_ms)
    }

    /// The batch linger.
    pub fn batch_linger(&self) -> Duration {
        Duration::from_millis(self.batch_linger_ms)
    }
}

impl Validate for PostgresSourceConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        self.validate_as("postgres")
    }
}

/// Session settings pinned on every connection (snapshot, catalog and
/// replication alike) so that values are rendered the same way in COPY
/// output and in pgoutput text tuples, whatever the server's defaults.
pub const SESSION_OPTIONS: &str = "-c datestyle=ISO,YMD -c intervalstyle=iso_8601 -c timezone=UTC \
     -c bytea_output=hex -c extra_float_digits=3 -c standard_conforming_strings=on \
     -c client_encoding=UTF8 -c lc_monetary=C";

/// Resolved connection settings. The password is a secret: `Debug` hides it.
#[derive(Clone)]
pub struct ConnectionParams {
    /// For ordinary (catalog, snapshot) connections.
    pub pg: tokio_postgres::Config,
    /// Host (or socket directory).
    pub host: String,
    /// Port.
    pub port: u16,
    /// Role.
    pub user: String,
    /// Database.
    pub database: String,
    /// Password (may be empty for trust or peer authentication).
    pub password: SecretString,
    /// TLS mode.
    pub tls: TlsMode,
    /// CA bundle.
    pub tls_ca_file: Option<String>,
    /// Connect timeout.
    pub connect_timeout: Duration,
    /// The longest wait for one catalog query's answer.
    pub catalog_timeout: Duration,
}

impl std::fmt::Debug for ConnectionParams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectionParams")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("user", &self.user)
            .field("database", &self.database)
            .field("tls", &self.tls)
            .finish_non_exhaustive()
    }
}

#[async_trait::async_trait]
impl crate::SourceConfig for PostgresSourceConfig {
    fn connector(&self) -> &'static str {
        super::CONNECTOR
    }

    fn validate_at(&self, section: &str) -> Result<(), ConfigError> {
        self.validate_as(section)
    }

    fn build(&self, runner_name: &str) -> Result<Box<dyn crate::Source>> {
        Ok(Box::new(super::PostgresSource::new(self.clone(), runner_name)?))
    }

    async fn check(&self) -> Vec<crate::Problem> {
        super::check::check(self).await
    }

    async fn fix(&self) -> Result<Vec<crate::Problem>> {
        super::check::fix(self).await
    }

    async fn teardown(&self) -> Result<Vec<String>> {
        super::check::teardown(self).await
    }

    /// One streamed batch and one snapshot chunk per worker, held while
    /// they are produced.
    fn memory_budget(&self) -> Option<(u64, &'static str)> {
        Some((
            self.max_batch_bytes as u64 * (1 + self.snapshot_parallelism as u64),
            "postgres.max_batch_bytes or postgres.snapshot_parallelism",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(toml_text: &str) -> Result<PostgresSourceConfig, ConfigError> {
        tributary_operations::config::parse(toml_text, "test.toml")
    }

    #[test]
    fn defaults_apply_and_validate() {
        let c = parse("url = \"postgres://u@localhost/db\"").expect("valid");
        assert_eq!(c.slot_name, DEFAULT_SLOT_NAME);
        assert_eq!(c.snapshot_parallelism, 2);
        assert_eq!(c.new_tables, NewTables::Capture);
        assert_eq!(c.snapshot_mode, SnapshotMode::Initial);
    }

    #[test]
    fn unknown_fields_are_rejected() {
        let e = parse("url = \"postgres://u@h/db\"\nslot = \"x\"").unwrap_err();
        assert!(e.to_string().contains("slot"), "{e}");
    }

    #[test]
    fn validation_names_the_field() {
        let e = parse("url = \"postgres://u@h/db\"\nslot_name = \"Bad-Name\"").unwrap_err();
        assert!(e.to_string().contains("postgres.slot_name"), "{e}");
        let e = parse("url = \"mysql://u@h/db\"").unwrap_err();
        assert!(e.to_string().contains("postgres.url"), "{e}");
        let e = parse("url = \"postgres://u@h/db\"\ninclude = [\"nodot\"]").unwrap_err();
        assert!(e.to_string().contains("postgres.include"), "{e}");
    }

    #[test]
    fn debug_never_shows_the_password() {
        let c = parse("url = \"postgres://u:hunter2@h/db\"\npassword = \"s3cret\"").expect("valid");
        let text = format!("{c:?}");
        assert!(!text.contains("hunter2") && !text.contains("s3cret"), "{text}");
    }

    #[test]
    fn password_resolves_from_env() {
        std::env::set_var("TRIBUTARY_TEST_PG_PASSWORD", "pw1");
        let c =
            parse("url = \"postgres://u@h:5433/db\"\npassword = \"env:TRIBUTARY_TEST_PG_PASSWORD\"").expect("valid");
        let p = c.connection().expect("resolves");
        assert_eq!(p.password.expose_secret(), "pw1");
        assert_eq!(p.port, 5433);
        assert_eq!(p.database, "db");
    }

    #[test]
    fn patterns_glob_and_regex() {
        let mut c = PostgresSourceConfig::with_url("postgres://u@h/db");
        c.include = vec!["app.*".into(), "re:sales\\.(orders|items)".into()];
        c.exclude = vec!["app.tmp_*".into()];
        c.exclude_columns = vec!["app.users.password*".into()];
        let f = c.filter();
        assert!(f.captures(&TableId::new("app", "users")));
        assert!(!f.captures(&TableId::new("app", "tmp_1")));
        assert!(f.captures(&TableId::new("sales", "orders")));
        assert!(!f.captures(&TableId::new("sales", "other")));
        assert!(f.excludes_column(&TableId::new("app", "users"), "password_hash"));
        assert!(!f.excludes_column(&TableId::new("app", "users"), "email"));
    }
}

//! The MySQL / MariaDB source's configuration (`[mysql]` in a source
//! runner's config file): what to read, from where, and how fast.
//!
//! [`MySqlSourceConfig`] is what an operator writes; [`ConnectionParams`] is
//! what the source connects with once secrets are resolved.

use std::collections::BTreeMap;
use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use tributary_operations::config::{redact_url, resolve_secret, ConfigError, Validate};
use tributary_schemas::TableId;

use crate::error::{Error, Result};
pub use crate::selection::{TableFilter, TablePattern};
use crate::tls::{validate_tls, TlsMode};

/// Server id the runner registers with when it reads the binlog. It must
/// differ from every server and every other replica of the primary (two
/// readers with one id disconnect each other); runners usually override it.
pub const DEFAULT_SERVER_ID: u32 = 5400;
/// Rows per snapshot chunk: one Kafka transaction each, held in memory once
/// (the same reasoning and value as the PostgreSQL source).
pub const DEFAULT_SNAPSHOT_CHUNK_ROWS: u64 = 8192;
/// Heartbeat interval: how often an idle source still returns a batch, so
/// the stored binlog position follows the server's even when nothing is
/// captured (binlogs can then be purged safely up to it).
pub const DEFAULT_HEARTBEAT_INTERVAL_MS: u64 = 10_000;
/// Events per streamed batch; batches end at transaction boundaries, so one
/// large transaction can exceed it.
pub const DEFAULT_MAX_BATCH_EVENTS: usize = 10_000;
/// How long a non-empty batch waits for more transactions: groups bursts of
/// small transactions into one Kafka transaction at tens of ms of latency.
pub const DEFAULT_BATCH_LINGER_MS: u64 = 50;
/// Connect timeout: a down server is reported (as retryable) quickly.
pub const DEFAULT_CONNECT_TIMEOUT_MS: u64 = 10_000;
/// How often the copied tables' indexes, constraints and defaults are read.
pub const DEFAULT_OBJECTS_INTERVAL_MS: u64 = 5_000;

pub use crate::source::SnapshotMode;

/// Whether tables created after the start are captured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum NewTables {
    /// A new table matching `include` is announced and streamed from its
    /// CREATE TABLE on (it was empty then, so it needs no snapshot).
    #[default]
    Capture,
    /// Tables unknown at the first start are ignored.
    Ignore,
}

/// How streaming finds its place in the binlog after a restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum ResumeBy {
    /// The checkpoint's binlog file and offset (both servers).
    #[default]
    Position,
    /// The checkpoint's GTID position (MariaDB, `@slave_connect_state`):
    /// survives a failover to a replica whose files are named differently.
    /// Falls back to the file position while no GTID is known.
    Gtid,
}

/// The `[mysql]` section of a source runner.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MySqlSourceConfig {
    /// Connection URL, `mysql://user[:password]@host[:port]/database`. The
    /// database is `source.db` of events. Never logged.
    pub url: SecretString,
    /// Password, inline or as `env:NAME` / `file:/path`; overrides the URL's.
    #[serde(default)]
    pub password: Option<SecretString>,
    /// Server id used to read the binlog (unique among the primary's replicas).
    #[serde(default = "default_server_id")]
    pub server_id: u32,
    /// Tables to capture: `database.table` globs (`*`, `?`) or `re:` regexes.
    /// Defaults to every table of the URL's database.
    #[serde(default)]
    pub include: Vec<String>,
    /// Tables to leave out (same syntax); wins over `include`.
    #[serde(default)]
    pub exclude: Vec<String>,
    /// Columns never read: `database.table.column` globs (or `re:` regexes).
    #[serde(default)]
    pub exclude_columns: Vec<String>,
    /// Keys of tables without a primary key: `"database.table" = ["col", ...]`.
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
    /// Heartbeat interval in milliseconds.
    #[serde(default = "default_heartbeat")]
    pub heartbeat_interval_ms: u64,
    /// Most events per streamed batch.
    #[serde(default = "default_max_events")]
    pub max_batch_events: usize,
    /// How long a non-empty batch waits for more transactions, milliseconds.
    #[serde(default = "default_linger")]
    pub batch_linger_ms: u64,
    /// Connect timeout, milliseconds.
    #[serde(default = "default_connect_timeout")]
    pub connect_timeout_ms: u64,
    /// Whether the copied tables' indexes, constraints and defaults (the
    /// part that maps) are read every `objects_interval_ms` and sent, for
    /// PostgreSQL destinations that recreate them (docs/migration.md).
    #[serde(default = "default_true")]
    pub schema_objects: bool,
    /// How often they are read, in milliseconds (0: never).
    #[serde(default = "default_objects_interval")]
    pub objects_interval_ms: u64,
    /// `position` or `gtid` (MariaDB).
    #[serde(default)]
    pub resume_by: ResumeBy,
    /// TLS on every connection (snapshot, catalog, binlog): `disable`,
    /// `require` (encrypted, the certificate not checked), `verify-ca` (it
    /// must chain to `tls_ca_file`), `verify-full` (and name the URL's host).
    #[serde(default)]
    pub tls: TlsMode,
    /// PEM file of the CA the server certificate must chain to.
    #[serde(default)]
    pub tls_ca_file: Option<String>,
}

impl std::fmt::Debug for MySqlSourceConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MySqlSourceConfig")
            .field("url", &redact_url(self.url.expose_secret()))
            .field("password", &self.password.as_ref().map(|_| "[redacted]"))
            .field("server_id", &self.server_id)
            .field("include", &self.include)
            .field("exclude", &self.exclude)
            .field("exclude_columns", &self.exclude_columns)
            .field("keys", &self.keys)
            .field("new_tables", &self.new_tables)
            .field("snapshot_mode", &self.snapshot_mode)
            .field("snapshot_chunk_rows", &self.snapshot_chunk_rows)
            .field("heartbeat_interval_ms", &self.heartbeat_interval_ms)
            .field("max_batch_events", &self.max_batch_events)
            .field("batch_linger_ms", &self.batch_linger_ms)
            .field("schema_objects", &self.schema_objects)
            .field("objects_interval_ms", &self.objects_interval_ms)
            .field("resume_by", &self.resume_by)
            .field("tls", &self.tls)
            .field("tls_ca_file", &self.tls_ca_file)
            .finish_non_exhaustive()
    }
}

fn default_server_id() -> u32 {
    DEFAULT_SERVER_ID
}
fn default_chunk_rows() -> u64 {
    DEFAULT_SNAPSHOT_CHUNK_ROWS
}
fn default_heartbeat() -> u64 {
    DEFAULT_HEARTBEAT_INTERVAL_MS
}
fn default_max_events() -> usize {
    DEFAULT_MAX_BATCH_EVENTS
}
fn default_linger() -> u64 {
    DEFAULT_BATCH_LINGER_MS
}
fn default_connect_timeout() -> u64 {
    DEFAULT_CONNECT_TIMEOUT_MS
}
fn default_true() -> bool {
    true
}
fn default_objects_interval() -> u64 {
    DEFAULT_OBJECTS_INTERVAL_MS
}

impl MySqlSourceConfig {
    /// A config with every default and the given URL (tests and tools).
    pub fn with_url(url: impl Into<String>) -> Self {
        Self {
            url: SecretString::from(url.into()),
            password: None,
            server_id: DEFAULT_SERVER_ID,
            include: Vec::new(),
            exclude: Vec::new(),
            exclude_columns: Vec::new(),
            keys: BTreeMap::new(),
            new_tables: NewTables::default(),
            snapshot_mode: SnapshotMode::default(),
            snapshot_chunk_rows: DEFAULT_SNAPSHOT_CHUNK_ROWS,
            heartbeat_interval_ms: DEFAULT_HEARTBEAT_INTERVAL_MS,
            max_batch_events: DEFAULT_MAX_BATCH_EVENTS,
            batch_linger_ms: DEFAULT_BATCH_LINGER_MS,
            connect_timeout_ms: DEFAULT_CONNECT_TIMEOUT_MS,
            schema_objects: true,
            objects_interval_ms: DEFAULT_OBJECTS_INTERVAL_MS,
            resume_by: ResumeBy::default(),
            tls: TlsMode::default(),
            tls_ca_file: None,
        }
    }

    /// Checks every rule; errors name the field under `prefix` (`mysql.server_id`).
    pub fn validate_as(&self, prefix: &str) -> Result<(), ConfigError> {
        let field = |name: &str| format!("{prefix}.{name}");
        let url = self.url.expose_secret();
        if !(url.starts_with("mysql://") || url.starts_with("mariadb://")) {
            return Err(ConfigError::invalid(field("url"), "must be a mysql:// URL"));
        }
        if mysql_async::Opts::from_url(&url.replacen("mariadb://", "mysql://", 1)).is_err() {
            return Err(ConfigError::invalid(field("url"), "is not a valid MySQL URL"));
        }
        if self.server_id == 0 {
            return Err(ConfigError::invalid(
                field("server_id"),
                "must be between 1 and 4294967295 (0 is refused by the server for replicas)",
            ));
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
                return Err(ConfigError::invalid(field("keys"), format!("key `{table}` must be `database.table`")));
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
        if self.heartbeat_interval_ms < 100 {
            return Err(ConfigError::invalid(field("heartbeat_interval_ms"), "must be at least 100"));
        }
        if self.max_batch_events < 1 {
            return Err(ConfigError::invalid(field("max_batch_events"), "must be at least 1"));
        }
        if self.objects_interval_ms != 0 && self.objects_interval_ms < 100 {
            return Err(ConfigError::invalid(field("objects_interval_ms"), "must be 0 (never) or at least 100"));
        }
        if self.batch_linger_ms >= self.heartbeat_interval_ms {
            return Err(ConfigError::invalid(field("batch_linger_ms"), "must be shorter than heartbeat_interval_ms"));
        }
        validate_tls(self.tls, self.tls_ca_file.as_deref(), field)
    }

    /// Resolves the password and builds the connection parameters.
    pub fn connection(&self) -> Result<ConnectionParams> {
        let url = self.url.expose_secret().replacen("mariadb://", "mysql://", 1);
        let opts = mysql_async::Opts::from_url(&url)
            .map_err(|_| Error::needs_operator("field `mysql.url` is not a valid MySQL URL"))?;
        let user = opts
            .user()
            .map(str::to_string)
            .ok_or_else(|| Error::needs_operator("field `mysql.url` must name a user"))?;
        let database = opts
            .db_name()
            .map(str::to_string)
            .ok_or_else(|| Error::needs_operator("field `mysql.url` must name a database (mysql://user@host/db)"))?;
        let raw_password = match &self.password {
            Some(p) => Some(p.expose_secret().to_string()),
            None => opts.pass().map(str::to_string),
        };
        let password = match raw_password {
            Some(raw) => resolve_secret("mysql.password", &raw).map_err(|e| Error::needs_operator(e.to_string()))?,
            None => SecretString::from(String::new()),
        };
        let host = opts.ip_or_hostname().to_string();
        let port = opts.tcp_port();
        let builder = mysql_async::OptsBuilder::from_opts(opts)
            .pass(Some(password.expose_secret().to_string()))
            // Every session reads and writes UTC: TIMESTAMP text in the
            // snapshot then means the same instant as the binlog's seconds.
            .init(vec!["SET time_zone = '+00:00'", "SET NAMES utf8mb4"])
            .wait_timeout(Some(28_800))
            .prefer_socket(false)
            .ssl_opts(self.ssl_opts()?);
        Ok(ConnectionParams {
            opts: builder.into(),
            host,
            port,
            user,
            database,
            connect_timeout: Duration::from_millis(self.connect_timeout_ms),
        })
    }

    /// mysql_async's TLS settings for `tls` (`None`: plain TCP).
    fn ssl_opts(&self) -> Result<Option<mysql_async::SslOpts>> {
        if self.tls == TlsMode::Disable {
            return Ok(None);
        }
        // mysql_async builds its rustls configuration with the process-wide
        // crypto provider, which rustls refuses to pick when more than one
        // is compiled in: name ring, the provider of every other TLS
        // connection here. (Already installed: fine.)
        let _ = rustls::crypto::ring::default_provider().install_default();
        let opts = mysql_async::SslOpts::default();
        Ok(Some(match self.tls {
            TlsMode::Disable | TlsMode::Require => opts
                .with_danger_accept_invalid_certs(true)
                .with_danger_skip_domain_validation(true),
            TlsMode::VerifyCa | TlsMode::VerifyFull => {
                let path = self.tls_ca_file.as_deref().ok_or_else(|| {
                    Error::needs_operator("mysql.tls_ca_file is required to verify the server certificate")
                })?;
                // Read now, so that a missing file is named at start rather
                // than as a handshake failure.
                let pem = std::fs::read(path)
                    .map_err(|e| Error::needs_operator(format!("cannot read mysql.tls_ca_file {path}: {e}")))?;
                opts.with_root_certs(vec![pem.into()])
                    .with_disable_built_in_roots(true)
                    .with_danger_skip_domain_validation(self.tls == TlsMode::VerifyCa)
            }
        }))
    }

    /// The table filter; without `include`, every table of the URL's database.
    pub fn filter(&self, database: &str) -> TableFilter {
        let include = if self.include.is_empty() {
            vec![format!("{database}.*")]
        } else {
            self.include.clone()
        };
        TableFilter::from_patterns(&include, &self.exclude, &self.exclude_columns)
    }

    /// The configured key of `table`, if any.
    pub fn configured_key(&self, table: &TableId) -> Option<&Vec<String>> {
        self.keys.get(&table.to_string())
    }

    /// Heartbeat interval.
    pub fn heartbeat_interval(&self) -> Duration {
        Duration::from_millis(self.heartbeat_interval_ms)
    }

    /// Batch linger.
    pub fn batch_linger(&self) -> Duration {
        Duration::from_millis(self.batch_linger_ms)
    }
}

impl Validate for MySqlSourceConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        self.validate_as("mysql")
    }
}

/// What the source connects with: options with the resolved password.
#[derive(Clone)]
pub struct ConnectionParams {
    /// Driver options (password resolved, session set-up statements).
    pub opts: mysql_async::Opts,
    /// Host, for messages.
    pub host: String,
    /// Port, for messages.
    pub port: u16,
    /// User (grants are checked for it).
    pub user: String,
    /// Database of the URL.
    pub database: String,
    /// Connect timeout.
    pub connect_timeout: Duration,
}

impl std::fmt::Debug for ConnectionParams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectionParams")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("user", &self.user)
            .field("database", &self.database)
            .finish_non_exhaustive()
    }
}

#[async_trait::async_trait]
impl crate::SourceConfig for MySqlSourceConfig {
    fn connector(&self) -> &'static str {
        super::CONNECTOR
    }

    fn validate_at(&self, section: &str) -> Result<(), ConfigError> {
        self.validate_as(section)
    }

    fn build(&self, runner_name: &str) -> Result<Box<dyn crate::Source>> {
        Ok(Box::new(super::MySqlSource::new(self.clone(), runner_name)?))
    }

    async fn check(&self) -> Vec<crate::Problem> {
        super::check::check(self).await
    }

    /// Nothing to remove: a MySQL source leaves no slot behind (binlog
    /// retention is the server's).
    async fn teardown(&self) -> Result<Vec<String>> {
        Ok(Vec::new())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(toml_text: &str) -> Result<MySqlSourceConfig, ConfigError> {
        tributary_operations::config::parse(toml_text, "test.toml")
    }

    #[test]
    fn defaults_apply_and_validate() {
        let c = parse(r#"url = "mysql://u:p@127.0.0.1:3306/shop""#).expect("valid");
        assert_eq!(c.server_id, DEFAULT_SERVER_ID);
        assert_eq!(c.snapshot_chunk_rows, DEFAULT_SNAPSHOT_CHUNK_ROWS);
        let p = c.connection().expect("connection");
        assert_eq!(p.database, "shop");
        assert!(c.filter("shop").captures(&TableId::new("shop", "orders")));
        assert!(!c.filter("shop").captures(&TableId::new("other", "orders")));
    }

    #[test]
    fn unknown_fields_are_rejected_and_rules_name_the_field() {
        assert!(parse("url = \"mysql://u@h/db\"\nslot_name = \"x\"").is_err());
        let e = parse("url = \"mysql://u@h/db\"\nserver_id = 0").expect_err("server_id 0");
        assert!(e.to_string().contains("mysql.server_id"), "{e}");
        let e = parse("url = \"postgres://u@h/db\"").expect_err("scheme");
        assert!(e.to_string().contains("mysql.url"), "{e}");
    }

    #[test]
    fn debug_never_shows_the_password() {
        let c = parse(r#"url = "mysql://u:hunter2@h/db""#).expect("valid");
        assert!(!format!("{c:?}").contains("hunter2"));
    }

    #[test]
    fn password_resolves_from_env() {
        std::env::set_var("TRIBUTARY_TEST_MYSQL_PW", "s3cret");
        let c = parse("url = \"mysql://u@h/db\"\npassword = \"env:TRIBUTARY_TEST_MYSQL_PW\"").expect("valid");
        let p = c.connection().expect("connection");
        assert_eq!(p.opts.pass(), Some("s3cret"));
    }
}

//! The SQL Server source's configuration (`[sqlserver]` in a source
//! runner's config file).

use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use tributary_operations::config::{redact_url, resolve_secret, ConfigError, Validate};

use crate::error::{Error, Result};
pub use crate::selection::{TableFilter, TablePattern};
use crate::tls::{validate_tls, TlsMode};

/// The port SQL Server listens on unless told otherwise.
pub const DEFAULT_PORT: u16 = 1433;
/// Rows per snapshot chunk: one Kafka transaction each, held in memory once
/// (the same value as the PostgreSQL and MySQL sources).
pub const DEFAULT_SNAPSHOT_CHUNK_ROWS: u64 = 8192;
/// How often the change tables are polled when the last poll found nothing
/// (Debezium's `poll.interval.ms` default: the capture job itself harvests
/// the log every 5 s by default, so polling faster mostly finds nothing).
pub const DEFAULT_POLL_INTERVAL_MS: u64 = 500;
/// Heartbeat interval: an idle source still returns a batch this often, so
/// the stored LSN follows the server's and a restart does not look behind
/// the cleanup job's retention.
pub const DEFAULT_HEARTBEAT_INTERVAL_MS: u64 = 10_000;
/// Events per streamed batch; batches end at transaction boundaries, so one
/// large transaction can exceed it.
pub const DEFAULT_MAX_BATCH_EVENTS: usize = 10_000;
/// Connect timeout: a down server is reported (as retryable) quickly.
pub const DEFAULT_CONNECT_TIMEOUT_MS: u64 = 10_000;

pub use crate::source::SnapshotMode;

/// The `[sqlserver]` section of a source runner.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SqlServerSourceConfig {
    /// `sqlserver://user[:password]@host[:port]/database` (SQL Server
    /// authentication). The database is `source.db` of events. Never logged.
    pub url: SecretString,
    /// Password, inline or as `env:NAME` / `file:/path`; overrides the URL's.
    #[serde(default)]
    pub password: Option<SecretString>,
    /// Tables to capture: `schema.table` globs or `re:` regexes; default
    /// every table with a capture instance.
    #[serde(default)]
    pub include: Vec<String>,
    /// Tables to leave out (same syntax); wins over `include`.
    #[serde(default)]
    pub exclude: Vec<String>,
    /// Columns never read: `schema.table.column` globs (or `re:` regexes).
    #[serde(default)]
    pub exclude_columns: Vec<String>,
    /// `initial` or `never`.
    #[serde(default)]
    pub snapshot_mode: SnapshotMode,
    /// Rows per snapshot chunk (one Kafka transaction each).
    #[serde(default = "default_chunk_rows")]
    pub snapshot_chunk_rows: u64,
    /// Poll interval of the change tables, milliseconds.
    #[serde(default = "default_poll")]
    pub poll_interval_ms: u64,
    /// Heartbeat interval, milliseconds.
    #[serde(default = "default_heartbeat")]
    pub heartbeat_interval_ms: u64,
    /// Most events per streamed batch.
    #[serde(default = "default_max_events")]
    pub max_batch_events: usize,
    /// Connect timeout, milliseconds.
    #[serde(default = "default_connect_timeout")]
    pub connect_timeout_ms: u64,
    /// TLS: `disable`, `require` (encrypted, the certificate not checked) or
    /// `verify-full` (it must chain to `tls_ca_file` and name the host).
    /// `verify-ca` is refused: tiberius always checks the host name.
    #[serde(default)]
    pub tls: TlsMode,
    /// PEM file of the CA the server certificate must chain to.
    #[serde(default)]
    pub tls_ca_file: Option<String>,
}

impl std::fmt::Debug for SqlServerSourceConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqlServerSourceConfig")
            .field("url", &redact_url(self.url.expose_secret()))
            .field("password", &self.password.as_ref().map(|_| "[redacted]"))
            .field("include", &self.include)
            .field("exclude", &self.exclude)
            .field("exclude_columns", &self.exclude_columns)
            .field("snapshot_mode", &self.snapshot_mode)
            .field("snapshot_chunk_rows", &self.snapshot_chunk_rows)
            .field("poll_interval_ms", &self.poll_interval_ms)
            .field("heartbeat_interval_ms", &self.heartbeat_interval_ms)
            .field("max_batch_events", &self.max_batch_events)
            .field("tls", &self.tls)
            .field("tls_ca_file", &self.tls_ca_file)
            .finish_non_exhaustive()
    }
}

fn default_chunk_rows() -> u64 {
    DEFAULT_SNAPSHOT_CHUNK_ROWS
}
fn default_poll() -> u64 {
    DEFAULT_POLL_INTERVAL_MS
}
fn default_heartbeat() -> u64 {
    DEFAULT_HEARTBEAT_INTERVAL_MS
}
fn default_max_events() -> usize {
    DEFAULT_MAX_BATCH_EVENTS
}
fn default_connect_timeout() -> u64 {
    DEFAULT_CONNECT_TIMEOUT_MS
}

/// What the client connects with, secrets resolved.
#[derive(Clone)]
pub struct ConnectionParams {
    /// Host.
    pub host: String,
    /// Port.
    pub port: u16,
    /// SQL login.
    pub user: String,
    /// Its password.
    pub password: SecretString,
    /// Database of the URL.
    pub database: String,
    /// TLS mode.
    pub tls: TlsMode,
    /// CA file for `verify-full`.
    pub tls_ca_file: Option<String>,
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

/// The parts of a `sqlserver://` URL: user, password, host, port, database.
type UrlParts = (String, Option<String>, String, u16, String);

/// Splits a `sqlserver://user[:password]@host[:port]/database` URL; the
/// error says which part is wrong (never the password).
pub fn parse_url(url: &str) -> std::result::Result<UrlParts, &'static str> {
    let rest = url.strip_prefix("sqlserver://").ok_or("must be a sqlserver:// URL")?;
    let (auth, rest) = rest
        .rsplit_once('@')
        .ok_or("must name a user (sqlserver://user@host/database)")?;
    let (user, password) = match auth.split_once(':') {
        Some((u, p)) => (u, Some(p.to_string())),
        None => (auth, None),
    };
    if user.is_empty() {
        return Err("must name a user (sqlserver://user@host/database)");
    }
    let (hostport, database) = rest
        .split_once('/')
        .ok_or("must name a database (sqlserver://user@host/database)")?;
    if database.is_empty() || database.contains(['/', '?']) {
        return Err("must name one database after the host (no query parameters)");
    }
    let (host, port) = match hostport.rsplit_once(':') {
        Some((h, p)) => (h, p.parse().map_err(|_| "has a port that is not a number")?),
        None => (hostport, DEFAULT_PORT),
    };
    if host.is_empty() {
        return Err("must name a host");
    }
    Ok((user.to_string(), password, host.to_string(), port, database.to_string()))
}

impl SqlServerSourceConfig {
    /// A config with every default and the given URL (tests and tools).
    pub fn with_url(url: impl Into<String>) -> Self {
        Self {
            url: SecretString::from(url.into()),
            password: None,
            include: Vec::new(),
            exclude: Vec::new(),
            exclude_columns: Vec::new(),
            snapshot_mode: SnapshotMode::default(),
            snapshot_chunk_rows: DEFAULT_SNAPSHOT_CHUNK_ROWS,
            poll_interval_ms: DEFAULT_POLL_INTERVAL_MS,
            heartbeat_interval_ms: DEFAULT_HEARTBEAT_INTERVAL_MS,
            max_batch_events: DEFAULT_MAX_BATCH_EVENTS,
            connect_timeout_ms: DEFAULT_CONNECT_TIMEOUT_MS,
            tls: TlsMode::default(),
            tls_ca_file: None,
        }
    }

    /// Checks every rule; errors name the field under `prefix`.
    pub fn validate_as(&self, prefix: &str) -> Result<(), ConfigError> {
        let field = |name: &str| format!("{prefix}.{name}");
        parse_url(self.url.expose_secret()).map_err(|rule| ConfigError::invalid(field("url"), rule))?;
        for (name, list) in [("include", &self.include), ("exclude", &self.exclude)] {
            for p in list {
                TablePattern::parse(p, 2).map_err(|rule| ConfigError::invalid(field(name), rule))?;
            }
        }
        for p in &self.exclude_columns {
            TablePattern::parse(p, 3).map_err(|rule| ConfigError::invalid(field("exclude_columns"), rule))?;
        }
        if self.snapshot_chunk_rows < 1 || self.snapshot_chunk_rows > 1_000_000 {
            return Err(ConfigError::invalid(
                field("snapshot_chunk_rows"),
                "must be between 1 and 1000000 (a chunk is held in memory once)",
            ));
        }
        if self.poll_interval_ms < 1 {
            return Err(ConfigError::invalid(field("poll_interval_ms"), "must be at least 1"));
        }
        if self.heartbeat_interval_ms < self.poll_interval_ms {
            return Err(ConfigError::invalid(field("heartbeat_interval_ms"), "must be at least poll_interval_ms"));
        }
        if self.max_batch_events < 1 {
            return Err(ConfigError::invalid(field("max_batch_events"), "must be at least 1"));
        }
        if self.tls == TlsMode::VerifyCa {
            return Err(ConfigError::invalid(
                field("tls"),
                "verify-ca is not supported by the SQL Server driver (it always checks the host name): use verify-full",
            ));
        }
        validate_tls(self.tls, self.tls_ca_file.as_deref(), field)
    }

    /// Resolves the password and builds the connection parameters.
    pub fn connection(&self) -> Result<ConnectionParams> {
        let (user, url_password, host, port, database) = parse_url(self.url.expose_secret())
            .map_err(|rule| Error::needs_operator(format!("field `sqlserver.url` {rule}")))?;
        let raw = match &self.password {
            Some(p) => Some(p.expose_secret().to_string()),
            None => url_password,
        };
        let password = match raw {
            Some(raw) => {
                resolve_secret("sqlserver.password", &raw).map_err(|e| Error::needs_operator(e.to_string()))?
            }
            None => SecretString::from(String::new()),
        };
        Ok(ConnectionParams {
            host,
            port,
            user,
            password,
            database,
            tls: self.tls,
            tls_ca_file: self.tls_ca_file.clone(),
            connect_timeout: Duration::from_millis(self.connect_timeout_ms),
        })
    }

    /// The table filter; without `include`, every table.
    pub fn filter(&self) -> TableFilter {
        let include = if self.include.is_empty() {
            vec!["*.*".to_string()]
        } else {
            self.include.clone()
        };
        TableFilter::from_patterns(&include, &self.exclude, &self.exclude_columns)
    }
}

impl Validate for SqlServerSourceConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        self.validate_as("sqlserver")
    }
}

#[async_trait::async_trait]
impl crate::SourceConfig for SqlServerSourceConfig {
    fn connector(&self) -> &'static str {
        super::CONNECTOR
    }

    fn validate_at(&self, section: &str) -> Result<(), ConfigError> {
        self.validate_as(section)
    }

    fn build(&self, runner_name: &str) -> Result<Box<dyn crate::Source>> {
        self.validate_as("sqlserver")
            .map_err(|e| Error::needs_operator(e.to_string()))?;
        let connector = super::client::TiberiusConnector::new(self.connection()?);
        Ok(Box::new(super::SqlServerSource::new(self.clone(), std::sync::Arc::new(connector), runner_name)?))
    }

    async fn check(&self) -> Vec<crate::Problem> {
        match self.connection() {
            Ok(params) => super::check::check(self, &super::client::TiberiusConnector::new(params)).await,
            Err(e) => vec![crate::Problem::error(format!("cannot check the source: {e}"), None)],
        }
    }

    /// Nothing to remove: the capture instances are the operator's (they
    /// were enabled by hand, and other readers may use them); the
    /// checkpoint is the only state of the source.
    async fn teardown(&self) -> Result<Vec<String>> {
        Ok(Vec::new())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(toml_text: &str) -> Result<SqlServerSourceConfig, ConfigError> {
        tributary_operations::config::parse(toml_text, "test.toml")
    }

    #[test]
    fn defaults_apply_and_urls_parse() {
        let c = parse(r#"url = "sqlserver://sa:p@127.0.0.1/shop""#).expect("valid");
        assert_eq!(c.snapshot_chunk_rows, DEFAULT_SNAPSHOT_CHUNK_ROWS);
        let p = c.connection().expect("connection");
        assert_eq!((p.host.as_str(), p.port, p.user.as_str(), p.database.as_str()), ("127.0.0.1", 1433, "sa", "shop"));
        assert_eq!(p.password.expose_secret(), "p");
        assert_eq!(parse_url("sqlserver://u@h:14330/db").expect("port").3, 14330);
        assert!(parse_url("sqlserver://h/db").is_err());
        assert!(parse_url("sqlserver://u@h").is_err());
        assert!(parse_url("sqlserver://u@h:x/db").is_err());
    }

    #[test]
    fn unknown_fields_are_rejected_and_rules_name_the_field() {
        assert!(parse("url = \"sqlserver://u@h/db\"\nslot_name = \"x\"").is_err());
        let e = parse("url = \"mysql://u@h/db\"").expect_err("scheme");
        assert!(e.to_string().contains("sqlserver.url"), "{e}");
        let e = parse("url = \"sqlserver://u@h/db\"\ntls = \"verify-ca\"\ntls_ca_file = \"/ca.pem\"").expect_err("ca");
        assert!(e.to_string().contains("sqlserver.tls"), "{e}");
        let e = parse("url = \"sqlserver://u@h/db\"\npoll_interval_ms = 900\nheartbeat_interval_ms = 800")
            .expect_err("heartbeat");
        assert!(e.to_string().contains("sqlserver.heartbeat_interval_ms"), "{e}");
    }

    #[test]
    fn debug_never_shows_the_password() {
        let c = parse(r#"url = "sqlserver://u:hunter2@h/db""#).expect("valid");
        assert!(!format!("{c:?}").contains("hunter2"));
    }
}

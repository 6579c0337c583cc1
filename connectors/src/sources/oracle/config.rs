//! The Oracle source's configuration (`[oracle]` in a source runner's
//! config file).

use std::path::PathBuf;

use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use tributary_operations::config::{redact_url, resolve_secret, ConfigError, Validate};

use crate::error::{Error, Result};
pub use crate::selection::{TableFilter, TablePattern};

/// Rows per snapshot chunk: one Kafka transaction each (the other sources' value).
pub const DEFAULT_SNAPSHOT_CHUNK_ROWS: u64 = 8192;
/// SCNs per mining window. A LogMiner session costs a few hundred ms to
/// start; 100,000 SCNs keeps sessions few on a busy database while a
/// window's rows stay a bounded amount (Debezium's default batch size).
pub const DEFAULT_MAX_WINDOW_SCNS: u64 = 100_000;
/// Statement bytes the transaction buffer keeps in memory before spilling
/// the largest open transaction to disk.
pub const DEFAULT_BUFFER_MEMORY_BYTES: u64 = 256 * 1024 * 1024;
/// Events per streamed batch (one Kafka transaction); batches end at
/// transaction boundaries, so one large transaction can exceed it.
pub const DEFAULT_MAX_BATCH_EVENTS: usize = 10_000;
/// How long an idle source waits between mining windows (and returns a
/// heartbeat): LogMiner has no push; each poll starts a session.
pub const DEFAULT_POLL_INTERVAL_MS: u64 = 1000;

pub use crate::source::SnapshotMode;

/// The `[oracle]` section of a source runner.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OracleSourceConfig {
    /// `oracle://user[:password]@host:port/service_name` (EZConnect; the
    /// service of a PDB for a multitenant database). Never logged.
    pub url: SecretString,
    /// Password, inline or `env:NAME` / `file:/path`; overrides the URL's.
    #[serde(default)]
    pub password: Option<SecretString>,
    /// Tables to capture: `OWNER.TABLE` globs or `re:` regexes (names as
    /// Oracle stores them: upper case unless created quoted). Required.
    pub include: Vec<String>,
    /// Tables to leave out; wins over `include`.
    #[serde(default)]
    pub exclude: Vec<String>,
    /// Columns never read: `OWNER.TABLE.COLUMN` patterns.
    #[serde(default)]
    pub exclude_columns: Vec<String>,
    /// `initial` or `never`.
    #[serde(default)]
    pub snapshot_mode: SnapshotMode,
    /// Rows per snapshot chunk.
    #[serde(default = "default_chunk_rows")]
    pub snapshot_chunk_rows: u64,
    /// Most SCNs one LogMiner session mines.
    #[serde(default = "default_window")]
    pub max_window_scns: u64,
    /// Bytes of open transactions kept in memory before spilling.
    #[serde(default = "default_buffer")]
    pub buffer_memory_bytes: u64,
    /// Where the transaction buffer spills (the system's temporary
    /// directory when unset).
    #[serde(default)]
    pub spill_dir: Option<PathBuf>,
    /// Milliseconds between mining windows when the source is caught up.
    #[serde(default = "default_poll")]
    pub poll_interval_ms: u64,
    /// Most events per streamed batch (whole transactions).
    #[serde(default = "default_max_events")]
    pub max_batch_events: usize,
    /// Mine from the CDB root for this pluggable database (Debezium's
    /// `database.pdb.name`; what Oracle 19c needs: no per-PDB LogMiner
    /// there). The URL then names the CDB's service and a common user
    /// (`C##...`); LogMiner runs in `CDB$ROOT` with the rows of this PDB
    /// alone (`SRC_CON_NAME`), the catalog and the snapshot are read on a
    /// second session switched to the PDB (`ALTER SESSION SET CONTAINER`).
    /// Unset: everything runs in the URL's container.
    #[serde(default)]
    pub pdb_name: Option<String>,
}

impl std::fmt::Debug for OracleSourceConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OracleSourceConfig")
            .field("url", &redact_url(self.url.expose_secret()))
            .field("password", &self.password.as_ref().map(|_| "[redacted]"))
            .field("include", &self.include)
            .field("exclude", &self.exclude)
            .field("snapshot_mode", &self.snapshot_mode)
            .field("max_window_scns", &self.max_window_scns)
            .field("pdb_name", &self.pdb_name)
            .finish_non_exhaustive()
    }
}

fn default_chunk_rows() -> u64 {
    DEFAULT_SNAPSHOT_CHUNK_ROWS
}
fn default_window() -> u64 {
    DEFAULT_MAX_WINDOW_SCNS
}
fn default_buffer() -> u64 {
    DEFAULT_BUFFER_MEMORY_BYTES
}
fn default_poll() -> u64 {
    DEFAULT_POLL_INTERVAL_MS
}
fn default_max_events() -> usize {
    DEFAULT_MAX_BATCH_EVENTS
}

/// What the source connects with.
#[derive(Clone)]
pub struct ConnectionParams {
    /// User.
    pub user: String,
    /// Password, resolved.
    pub password: SecretString,
    /// EZConnect string `host:port/service`.
    pub connect: String,
    /// The PDB to mine from the root for (`oracle.pdb_name`, upper case).
    pub pdb: Option<String>,
}

impl std::fmt::Debug for ConnectionParams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectionParams")
            .field("user", &self.user)
            .field("connect", &self.connect)
            .field("pdb", &self.pdb)
            .finish_non_exhaustive()
    }
}

impl OracleSourceConfig {
    /// A config with every default (tests and tools).
    pub fn with_url(url: impl Into<String>, include: &[&str]) -> Self {
        Self {
            url: SecretString::from(url.into()),
            password: None,
            include: include.iter().map(|s| s.to_string()).collect(),
            exclude: Vec::new(),
            exclude_columns: Vec::new(),
            snapshot_mode: SnapshotMode::default(),
            snapshot_chunk_rows: DEFAULT_SNAPSHOT_CHUNK_ROWS,
            max_window_scns: DEFAULT_MAX_WINDOW_SCNS,
            buffer_memory_bytes: DEFAULT_BUFFER_MEMORY_BYTES,
            spill_dir: None,
            poll_interval_ms: DEFAULT_POLL_INTERVAL_MS,
            max_batch_events: DEFAULT_MAX_BATCH_EVENTS,
            pdb_name: None,
        }
    }

    /// Checks every rule; errors name the field under `prefix`.
    pub fn validate_as(&self, prefix: &str) -> Result<(), ConfigError> {
        let field = |name: &str| format!("{prefix}.{name}");
        parse_url(self.url.expose_secret()).map_err(|rule| ConfigError::invalid(field("url"), rule))?;
        if self.include.is_empty() {
            return Err(ConfigError::invalid(field("include"), "must list at least one OWNER.TABLE pattern"));
        }
        for (name, list) in [("include", &self.include), ("exclude", &self.exclude)] {
            for p in list {
                TablePattern::parse(p, 2).map_err(|rule| ConfigError::invalid(field(name), rule))?;
            }
        }
        for p in &self.include {
            if owner_of(p).is_none() {
                return Err(ConfigError::invalid(
                    field("include"),
                    format!("`{p}`: the owner must be a plain name (LogMiner is filtered by owner)"),
                ));
            }
        }
        for p in &self.exclude_columns {
            TablePattern::parse(p, 3).map_err(|rule| ConfigError::invalid(field("exclude_columns"), rule))?;
        }
        if !(1..=1_000_000).contains(&self.snapshot_chunk_rows) {
            return Err(ConfigError::invalid(field("snapshot_chunk_rows"), "must be between 1 and 1000000"));
        }
        if self.max_window_scns < 1_000 {
            return Err(ConfigError::invalid(field("max_window_scns"), "must be at least 1000"));
        }
        if self.buffer_memory_bytes < 1024 * 1024 {
            return Err(ConfigError::invalid(field("buffer_memory_bytes"), "must be at least 1048576 (1 MiB)"));
        }
        if self.max_batch_events < 1 {
            return Err(ConfigError::invalid(field("max_batch_events"), "must be at least 1"));
        }
        if self.poll_interval_ms < 100 {
            return Err(ConfigError::invalid(field("poll_interval_ms"), "must be at least 100"));
        }
        if let Some(pdb) = &self.pdb_name {
            // It goes into ALTER SESSION SET CONTAINER and the mining query.
            let plain = pdb.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
                && pdb.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '$' | '#'));
            if !plain || pdb.len() > 128 {
                return Err(ConfigError::invalid(
                    field("pdb_name"),
                    "must be a plain PDB name (a letter, then letters, digits, _, $ or #), as V$PDBS.NAME shows it",
                ));
            }
        }
        Ok(())
    }

    /// The owners whose tables are captured (LogMiner's `SEG_OWNER` filter).
    pub fn owners(&self) -> Vec<String> {
        let mut o: Vec<String> = self.include.iter().filter_map(|p| owner_of(p)).collect();
        o.sort();
        o.dedup();
        o
    }

    /// The table filter.
    pub fn filter(&self) -> TableFilter {
        TableFilter::from_patterns(&self.include, &self.exclude, &self.exclude_columns)
    }

    /// Resolves the password and the connect string.
    pub fn connection(&self) -> Result<ConnectionParams> {
        let (user, url_password, connect) =
            parse_url(self.url.expose_secret()).map_err(|rule| Error::needs_operator(format!("oracle.url {rule}")))?;
        let raw = match &self.password {
            Some(p) => Some(p.expose_secret().to_string()),
            None => url_password,
        };
        let password = match raw {
            Some(raw) => resolve_secret("oracle.password", &raw).map_err(|e| Error::needs_operator(e.to_string()))?,
            None => SecretString::from(String::new()),
        };
        Ok(ConnectionParams {
            user,
            password,
            connect,
            pdb: self.pdb_name.as_ref().map(|p| p.to_ascii_uppercase()),
        })
    }
}

/// The owner of an include pattern (`APP.*` -> `APP`), when it is a plain name.
fn owner_of(pattern: &str) -> Option<String> {
    let (owner, _) = pattern.split_once('.')?;
    (!owner.is_empty() && owner.chars().all(|c| c.is_alphanumeric() || matches!(c, '_' | '$' | '#')))
        .then(|| owner.to_string())
}

/// `oracle://user[:password]@host[:port]/service` -> (user, password, `host:port/service`).
fn parse_url(url: &str) -> Result<(String, Option<String>, String), String> {
    let rest = url.strip_prefix("oracle://").ok_or("must be an oracle:// URL")?;
    let (auth, target) = rest
        .rsplit_once('@')
        .ok_or("must name a user (oracle://user@host:1521/service)")?;
    let (user, password) = match auth.split_once(':') {
        Some((u, p)) => (u, Some(p.to_string())),
        None => (auth, None),
    };
    if user.is_empty() {
        return Err("must name a user".into());
    }
    let (host, service) = target
        .split_once('/')
        .ok_or("must name a service (oracle://user@host:1521/FREEPDB1)")?;
    if host.is_empty() || service.is_empty() {
        return Err("must name a host and a service".into());
    }
    let host = if host.contains(':') {
        host.to_string()
    } else {
        format!("{host}:1521")
    };
    Ok((user.to_string(), password, format!("{host}/{service}")))
}

impl Validate for OracleSourceConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        self.validate_as("oracle")
    }
}

#[async_trait::async_trait]
impl crate::SourceConfig for OracleSourceConfig {
    fn connector(&self) -> &'static str {
        super::CONNECTOR
    }

    fn validate_at(&self, section: &str) -> Result<(), ConfigError> {
        self.validate_as(section)
    }

    fn build(&self, runner_name: &str) -> Result<Box<dyn crate::Source>> {
        Ok(Box::new(super::OracleSource::new(self.clone(), runner_name, None)?))
    }

    async fn check(&self) -> Vec<crate::Problem> {
        let client = match self.connection() {
            Ok(p) => super::client::OracleClient::open(&p).await,
            Err(e) => Err(e),
        };
        match client {
            Ok(c) => super::check::check(self, &c).await,
            Err(e) => vec![crate::Problem::error(
                format!("cannot check the source: {e}"),
                e.hint().map(str::to_string),
            )],
        }
    }

    /// Nothing to remove: LogMiner sessions end with each window, and the
    /// source creates nothing in the database.
    async fn teardown(&self) -> Result<Vec<String>> {
        Ok(Vec::new())
    }

    fn memory_budget(&self) -> Option<(u64, &'static str)> {
        Some((self.buffer_memory_bytes, "oracle.buffer_memory_bytes"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<OracleSourceConfig, ConfigError> {
        tributary_operations::config::parse(text, "test.toml")
    }

    #[test]
    fn the_example_config_is_valid() {
        let text = include_str!("../../../../examples/source-oracle.toml");
        let file: toml::Value = toml::from_str(text).expect("toml");
        let section = toml::to_string(&file["oracle"]).expect("section");
        let c = parse(&section).expect("the example's [oracle] section is valid");
        assert_eq!(c.owners(), vec!["APP".to_string()]);
    }

    #[test]
    fn urls_owners_and_rules() {
        let c = parse("url = \"oracle://c##dbz:pw@db.example:1522/ORCLPDB1\"\ninclude = [\"APP.*\", \"HR.EMP\"]")
            .expect("valid");
        let p = c.connection().expect("connection");
        assert_eq!((p.user.as_str(), p.connect.as_str()), ("c##dbz", "db.example:1522/ORCLPDB1"));
        assert_eq!(c.owners(), vec!["APP".to_string(), "HR".to_string()]);
        assert!(!format!("{c:?}").contains("pw@"));
        let c = parse("url = \"oracle://u@h/FREEPDB1\"\ninclude = [\"APP.T\"]").expect("valid");
        assert_eq!(c.connection().unwrap().connect, "h:1521/FREEPDB1");
        assert!(parse("url = \"oracle://u@h/S\"\ninclude = [\"APP.T\"]\nslot = 1").is_err());
        let e = parse("url = \"postgres://u@h/S\"\ninclude = [\"APP.T\"]").expect_err("scheme");
        assert!(e.to_string().contains("oracle.url"), "{e}");
        let e = parse("url = \"oracle://u@h/S\"\ninclude = [\"*.T\"]").expect_err("owner glob");
        assert!(e.to_string().contains("oracle.include"), "{e}");
        let e = parse("url = \"oracle://u@h/S\"\ninclude = [\"A.T\"]\nmax_window_scns = 5").expect_err("window");
        assert!(e.to_string().contains("oracle.max_window_scns"), "{e}");
        let c =
            parse("url = \"oracle://c##u@h/ORCLCDB\"\ninclude = [\"A.T\"]\npdb_name = \"orclpdb1\"").expect("valid");
        assert_eq!(c.connection().expect("connection").pdb.as_deref(), Some("ORCLPDB1"));
        for bad in ["", "1PDB", "PDB'; DROP", "\\\"P\\\""] {
            let e =
                parse(&format!("url = \"oracle://u@h/S\"\ninclude = [\"A.T\"]\npdb_name = \"{bad}\"")).expect_err(bad);
            assert!(e.to_string().contains("oracle.pdb_name"), "{e}");
        }
    }
}

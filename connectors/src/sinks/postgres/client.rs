//! The PostgreSQL sink's session: one connection, its settings, the
//! statements deferred to go with the next one (each round trip left the
//! destination idle while the sink's tasks were scheduled on the shared
//! cores: 3-10 ms, several times per batch), the prepared `COPY`
//! statements, and how its errors are classified (without the row values
//! PostgreSQL quotes in data errors).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::str::FromStr;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};
use tokio_postgres::{Client, Statement};
use tracing::warn;
use tributary_operations::config::{resolve_secret, ConfigError};

use super::config::PostgresSinkConfig;
use crate::error::{Error, Result};
use crate::pgwire::redact::{is_data_error, redact_message, redacted};
use crate::pgwire::{quote_ident, quote_literal, sqlstate};

/// Prepared `COPY` statements kept per session (one per table, schema
/// version and target: the table itself or its staging table).
const MAX_COPY_STATEMENTS: usize = 1024;
/// `application_name` of the sink's sessions, so a DBA sees who holds a lock.
const APPLICATION_NAME: &str = "tributary-sink";

/// Why a `COPY` failed.
pub(crate) enum CopyFailure {
    /// A row could not be rendered (the `COPY` was aborted).
    Render(crate::sink::ApplyError),
    /// PostgreSQL refused the `COPY` or the connection broke.
    Db(tokio_postgres::Error),
    /// There was no session, or what was deferred failed before the `COPY`.
    Session(Error),
}

/// The sink's connection to the destination.
pub(crate) struct Session {
    pg: tokio_postgres::Config,
    config: PostgresSinkConfig,
    client: Option<Client>,
    /// Statements that need no answer of their own (`BEGIN`, `RELEASE
    /// SAVEPOINT`, the offsets before `COMMIT`), sent in one message with
    /// the next statement.
    deferred: Mutex<String>,
    /// `COPY` statements prepared in this session, by text: `copy_in` with
    /// a text prepares it first, a round trip of its own before each `COPY`.
    copy_statements: Mutex<HashMap<String, Statement>>,
}

impl Session {
    /// A session for `config` (not connected).
    pub(crate) fn new(config: &PostgresSinkConfig) -> Result<Self, ConfigError> {
        Self::new_in(config, "postgres")
    }

    /// A session for `config`, whose URL is `<section>.url` in errors (the
    /// Redshift sink shares this session).
    pub(crate) fn new_in(config: &PostgresSinkConfig, section: &str) -> Result<Self, ConfigError> {
        let field = format!("{section}.url");
        let secret: SecretString = resolve_secret(&field, &config.url)?;
        let mut pg = tokio_postgres::Config::from_str(secret.expose_secret())
            .map_err(|e| ConfigError::invalid(field.clone(), format!("is not a PostgreSQL URL ({e})")))?;
        pg.connect_timeout(Duration::from_millis(config.connect_timeout_ms));
        pg.application_name(APPLICATION_NAME);
        Ok(Self {
            pg,
            config: config.clone(),
            client: None,
            deferred: Mutex::new(String::new()),
            copy_statements: Mutex::new(HashMap::new()),
        })
    }

    pub(crate) fn user(&self) -> String {
        self.pg.get_user().unwrap_or("<sink user>").to_string()
    }

    pub(crate) fn database(&self) -> String {
        self.pg.get_dbname().map(str::to_string).unwrap_or_else(|| self.user())
    }

    pub(crate) fn ctx(&self) -> Ctx {
        Ctx {
            user: self.user(),
            database: self.database(),
            table: None,
        }
    }

    /// Whether a live connection is open.
    pub(crate) fn is_open(&self) -> bool {
        self.client.as_ref().is_some_and(|c| !c.is_closed())
    }

    /// Opens a connection with the configured TLS mode; its task runs in
    /// the background and only records why it ended.
    pub(crate) async fn open(&self) -> Result<Client> {
        fn closed(e: &tokio_postgres::Error) {
            // A broken connection is reported by the next statement; this
            // only records why, without any statement text.
            warn!(error = %redacted(e), "destination connection closed");
        }
        let ctx = self.ctx();
        crate::pgwire::connect(&self.pg, self.config.tls, self.config.tls_ca_file.as_deref(), closed)
            .await?
            .map_err(|e| classify(&e, &ctx))
    }

    /// Opens a connection and sets the session up (time zone, date and
    /// interval styles, float digits: the text forms the sink renders; the
    /// lock wait limit).
    pub(crate) async fn connect(&mut self) -> Result<()> {
        let lock_timeout = format!("{}ms", self.config.lock_timeout_ms);
        let setup = format!(
            "SET TimeZone = 'UTC'; SET DateStyle = 'ISO, YMD'; SET IntervalStyle = 'postgres'; \
             SET standard_conforming_strings = on; SET extra_float_digits = 3; \
             SET lock_timeout = {}",
            quote_literal(&lock_timeout)
        );
        self.connect_with(&setup).await
    }

    /// Opens a connection and runs `setup` in it (the Redshift sink's
    /// settings differ: Redshift has no `IntervalStyle` nor `lock_timeout`).
    pub(crate) async fn connect_with(&mut self, setup: &str) -> Result<()> {
        self.reset();
        let ctx = self.ctx();
        let client = self.open().await.map_err(|e| e.with_hint_if_none(connect_hint()))?;
        client.batch_execute(setup).await.map_err(|e| classify(&e, &ctx))?;
        self.client = Some(client);
        Ok(())
    }

    /// Uses `client` (opened by [`Session::open`]) as it is, without the
    /// setup: for the read-only setup check.
    pub(crate) fn adopt(&mut self, client: Client) {
        self.reset();
        self.client = Some(client);
    }

    /// Forgets the connection and what was prepared or deferred in it.
    pub(crate) fn reset(&mut self) {
        self.client = None;
        self.take_deferred();
        lock(&self.copy_statements).clear();
    }

    pub(crate) fn connected(&self) -> Result<&Client> {
        self.client
            .as_ref()
            .ok_or_else(|| Error::retryable("not connected to the destination"))
    }

    /// The session, once what was deferred has been sent: every statement
    /// goes through here or [`Session::execute`], so none can run ahead of a
    /// deferred `BEGIN`.
    pub(crate) async fn client(&self) -> Result<&Client> {
        let client = self.connected()?;
        let deferred = self.take_deferred();
        if !deferred.is_empty() {
            client.batch_execute(&deferred).await.map_err(|e| classify(&e, &self.ctx()))?;
        }
        Ok(client)
    }

    /// Runs `sql` (simple protocol) with what was deferred ahead of it, in
    /// one round trip. A deferred statement that fails reports through this
    /// one: they are `BEGIN`, `RELEASE SAVEPOINT` and the offsets, which
    /// fail only with the session or the offsets table.
    pub(crate) async fn execute(&self, sql: &str, ctx: &Ctx) -> Result<()> {
        let client = self.connected()?;
        let mut text = self.take_deferred();
        text.push_str(sql);
        client.batch_execute(&text).await.map_err(|e| classify(&e, ctx))
    }

    /// Sends `sql` with the next statement; see [`Session::execute`].
    pub(crate) fn defer(&self, sql: &str) {
        let mut deferred = lock(&self.deferred);
        deferred.push_str(sql);
        deferred.push_str("; ");
    }

    pub(crate) fn take_deferred(&self) -> String {
        std::mem::take(&mut *lock(&self.deferred))
    }

    /// The session and the `COPY ... FROM STDIN` statement `sql`, prepared
    /// on first use in this session (a utility statement is analysed again
    /// at each execution, so a table changed since is no problem).
    pub(crate) async fn copy_statement(&self, sql: &str) -> std::result::Result<(&Client, Statement), CopyFailure> {
        let client = self.client().await.map_err(CopyFailure::Session)?;
        if let Some(statement) = lock(&self.copy_statements).get(sql) {
            return Ok((client, statement.clone()));
        }
        let statement = client.prepare(sql).await.map_err(CopyFailure::Db)?;
        let mut cache = lock(&self.copy_statements);
        if cache.len() >= MAX_COPY_STATEMENTS {
            // Tables come and go over a long run: start over rather than
            // grow without end.
            cache.clear();
        }
        cache.insert(sql.to_string(), statement.clone());
        Ok((client, statement))
    }
}

// ---------------------------------------------------------------- errors

/// Context for classifying an error: who we are and what we touched.
#[derive(Debug, Clone)]
pub(crate) struct Ctx {
    pub(crate) user: String,
    pub(crate) database: String,
    pub(crate) table: Option<String>,
}

impl Ctx {
    pub(crate) fn in_table(mut self, table: String) -> Self {
        self.table = Some(table);
        self
    }
}

pub(crate) trait HintIfNone {
    fn with_hint_if_none(self, hint: String) -> Self;
}

impl HintIfNone for Error {
    fn with_hint_if_none(self, hint: String) -> Self {
        if self.hint().is_some() {
            self
        } else {
            self.with_hint(hint)
        }
    }
}

pub(crate) fn connect_hint() -> String {
    "check that the destination is running and that postgres.url points at it".to_string()
}

/// Maps a PostgreSQL failure of the sink's session to an error: the kind
/// from the one SQLSTATE table ([`sqlstate::kind`]: a failure without a
/// SQLSTATE is the connection's), the column from the server's report, row
/// values cut from data errors' messages, and the sink's own hints.
pub(crate) fn classify(err: &tokio_postgres::Error, ctx: &Ctx) -> Error {
    let Some(db) = err.as_db_error() else {
        return Error::new(
            sqlstate::client_error_kind(err),
            format!("connection to the destination failed: {}", redacted(err)),
        )
        .with_class("postgres.connection");
    };
    if crate::sink::bookkeeping::is_fenced_message(db.message()) {
        return crate::sink::bookkeeping::fenced(db.message());
    }
    let code = db.code().code();
    let class = format!("postgres.sqlstate.{code}");
    let data_error = is_data_error(code);
    let mut message = format!("{} (SQLSTATE {code})", redact_message(db.message(), data_error));
    if let Some(c) = db.constraint() {
        let _ = write!(message, ", constraint {c}");
    }
    let column = db.column().map(str::to_string).or_else(|| db.where_().and_then(copy_column));
    let kind = sqlstate::kind(code);
    let mut e = Error::new(kind, message).with_class(class);
    if let Some(c) = column {
        e = e.with_column(c);
    }

    let table = ctx.table.clone().unwrap_or_else(|| "<schema>.<table>".to_string());
    let user = quote_ident(&ctx.user);
    match code {
        "42501" => {
            let schema = table.split('.').next().unwrap_or("public").to_string();
            e = e.with_hint(format!(
                "GRANT USAGE, CREATE ON SCHEMA {} TO {user}; GRANT SELECT, INSERT, UPDATE, DELETE, TRUNCATE ON {table} TO {user}",
                quote_ident(&schema)
            ));
        }
        c if c.starts_with("28") => {
            e = e.with_hint("check the user and password in postgres.url (and pg_hba.conf on the server)".to_string());
        }
        "53100" => e = e.with_hint("free disk space on the destination server".to_string()),
        "3D000" => {
            e = e.with_hint(format!("CREATE DATABASE {} OWNER {user}", quote_ident(&ctx.database)));
        }
        _ => {}
    }
    e
}

/// `COPY stage, line 3, column qty: "abc"` -> `qty`.
pub(crate) fn copy_column(where_: &str) -> Option<String> {
    let start = where_.find(", column ")? + ", column ".len();
    let rest = &where_[start..];
    let end = rest.find(':').unwrap_or(rest.len());
    let c = rest[..end].trim();
    (!c.is_empty()).then(|| c.to_string())
}

/// The value behind `mutex`; a panic elsewhere while it was held leaves
/// it usable (it holds only text and prepared statements).
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_column_names_the_column() {
        assert_eq!(copy_column("COPY s, line 1, column qty: \"x\""), Some("qty".into()));
    }
}

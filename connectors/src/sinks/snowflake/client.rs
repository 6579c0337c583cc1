//! The Snowflake sink's client: Snowflake's HTTP protocol (the one its
//! drivers speak: `login-request` for a session token, `query-request` for
//! each statement, polling `getResultUrl` while a statement runs on), over
//! reqwest, with a configurable base URL, every request and every statement
//! bounded by a timeout; and how Snowflake's errors are classified (its
//! messages can quote the value they refused, so data errors are cut
//! before the value).
//!
//! A thin client of our own: `snowflake-connector-rs` reads only JSON
//! results too and would add a second HTTP stack, and `snowflake-api` hard
//! codes the account host (no emulator, no private link URL). What the
//! sink needs is four requests; see `docs/destinations/snowflake.md`.

use std::time::{Duration, Instant};

use secrecy::{ExposeSecret, SecretString};
use serde_json::{json, Value as Json};

use super::config::SnowflakeSinkConfig;
use crate::error::{Error, ErrorKind, Result};

/// Codes Snowflake answers while a statement still runs.
const IN_PROGRESS: [&str; 2] = ["333333", "333334"];
/// Codes of a session that is gone (expired token, logged out): log in
/// again and retry.
const SESSION_GONE: [&str; 4] = ["390104", "390112", "390114", "390111"];
/// Class of the errors that drop the session.
pub(super) const SESSION_CLASS: &str = "snowflake.session";
/// First and longest wait between two polls of a running statement
/// (Snowflake's own drivers start at 0.5 s; a warehouse resuming takes
/// seconds, a small statement milliseconds).
const FIRST_POLL: Duration = Duration::from_millis(50);
const LONGEST_POLL: Duration = Duration::from_secs(2);
/// What the sink calls itself at login (Snowflake's query history shows it).
const CLIENT_APP_ID: &str = "tributary";

/// Rows of a result: text cells (Snowflake's JSON result format), NULL as
/// `None`.
pub type Rows = Vec<Vec<Option<String>>>;

/// One session.
pub(super) struct SfClient {
    config: SnowflakeSinkConfig,
    password: SecretString,
    http: reqwest::Client,
    token: Option<SecretString>,
    sequence: u64,
}

impl SfClient {
    /// A client; it logs in on first use.
    pub(super) fn new(config: &SnowflakeSinkConfig, password: SecretString) -> Result<Self> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_millis(config.request_timeout_ms))
            .connect_timeout(Duration::from_millis(config.request_timeout_ms.min(10_000)))
            .build()
            .map_err(|e| Error::needs_operator(format!("cannot build the HTTP client: {e}")))?;
        Ok(Self { config: config.clone(), password, http, token: None, sequence: 0 })
    }

    /// Whether a session is open.
    pub(super) fn is_open(&self) -> bool {
        self.token.is_some()
    }

    /// Forgets the session (the next statement logs in again).
    pub(super) fn reset(&mut self) {
        self.token = None;
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.config.url.trim_end_matches('/'))
    }

    /// Logs in with the password and keeps the session token.
    pub(super) async fn login(&mut self) -> Result<()> {
        let mut url = reqwest::Url::parse(&self.url("/session/v1/login-request"))
            .map_err(|e| Error::needs_operator(format!("snowflake.url is not a URL: {e}")))?;
        {
            let mut q = url.query_pairs_mut();
            q.append_pair("databaseName", &self.config.database);
            if let Some(w) = &self.config.warehouse {
                q.append_pair("warehouse", w);
            }
            if let Some(r) = &self.config.role {
                q.append_pair("roleName", r);
            }
        }
        let body = json!({"data": {
            "CLIENT_APP_ID": CLIENT_APP_ID,
            "CLIENT_APP_VERSION": env!("CARGO_PKG_VERSION"),
            "ACCOUNT_NAME": self.config.account,
            "LOGIN_NAME": self.config.user,
            "PASSWORD": self.password.expose_secret(),
            "SESSION_PARAMETERS": {
                // Results as rows of text (the sink reads no Arrow).
                "JDBC_QUERY_RESULT_FORMAT": "JSON",
                "AUTOCOMMIT": true,
                "QUERY_TAG": "tributary-sink",
            },
        }});
        let answer = self.send(self.http.post(url).json(&body)).await.map_err(|e| {
            if e.kind() == ErrorKind::NeedsOperator {
                e.with_hint(
                    "check snowflake.user and snowflake.password, that the user is not locked or disabled, \
                     and that snowflake.account matches snowflake.url",
                )
            } else {
                e
            }
        })?;
        let token = answer
            .pointer("/data/token")
            .and_then(Json::as_str)
            .ok_or_else(|| Error::retryable("Snowflake answered the login without a session token"))?;
        self.token = Some(SecretString::from(token.to_string()));
        Ok(())
    }

    /// Runs one statement and returns its rows.
    pub(super) async fn query(&mut self, sql: &str) -> Result<Rows> {
        self.run(sql, None).await
    }

    /// Runs one statement with bindings (`{"1": {"type": ..., "value":
    /// [...]}, ...}`: an array binding runs the INSERT once per row).
    pub(super) async fn query_bound(&mut self, sql: &str, bindings: Json) -> Result<Rows> {
        self.run(sql, Some(bindings)).await
    }

    async fn run(&mut self, sql: &str, bindings: Option<Json>) -> Result<Rows> {
        if self.token.is_none() {
            // The sink logs in (and sets the session's schema) in its
            // `connect`, before any statement.
            return Err(Error::retryable("no Snowflake session").with_class(SESSION_CLASS));
        }
        let deadline = Duration::from_millis(self.config.query_timeout_ms);
        let result = tokio::time::timeout(deadline, self.run_once(sql, bindings)).await.unwrap_or_else(|_| {
            Err(Error::retryable(format!(
                "a statement took longer than snowflake.query_timeout_ms ({} ms)",
                self.config.query_timeout_ms
            ))
            .with_class("snowflake.timeout"))
        });
        if let Err(e) = &result {
            if e.class() == SESSION_CLASS {
                self.token = None;
            }
        }
        result
    }

    async fn run_once(&mut self, sql: &str, bindings: Option<Json>) -> Result<Rows> {
        self.sequence += 1;
        let request_id = uuid::Uuid::new_v4().to_string();
        let mut body = json!({
            "sqlText": sql,
            "asyncExec": false,
            "sequenceId": self.sequence,
            "querySubmissionTime": chrono::Utc::now().timestamp_millis(),
        });
        if let Some(b) = bindings {
            body["bindings"] = b;
        }
        let url = reqwest::Url::parse_with_params(&self.url("/queries/v1/query-request"), [("requestId", &request_id)])
            .map_err(|e| Error::needs_operator(format!("snowflake.url is not a URL: {e}")))?;
        let mut answer = self.send(self.authorized(self.http.post(url)).json(&body)).await?;
        // A statement still running: poll its result until it is done.
        let mut wait = FIRST_POLL;
        let started = Instant::now();
        while IN_PROGRESS.contains(&answer.get("code").and_then(Json::as_str).unwrap_or("")) {
            let path = answer
                .pointer("/data/getResultUrl")
                .and_then(Json::as_str)
                .ok_or_else(|| Error::retryable("Snowflake said a statement runs on but gave no result URL"))?
                .to_string();
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(LONGEST_POLL);
            tracing::debug!(elapsed_ms = started.elapsed().as_millis() as u64, "statement still running");
            answer = self.send(self.authorized(self.http.get(self.url(&path)))).await?;
        }
        rows(&answer)
    }

    fn authorized(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        let token = self.token.as_ref().map(|t| t.expose_secret().to_string()).unwrap_or_default();
        request
            .header("Authorization", format!("Snowflake Token=\"{token}\""))
            .header("Accept", "application/snowflake")
    }

    /// Sends a request and returns its JSON answer, or the classified error
    /// (of the HTTP status, or of Snowflake's `success: false`).
    async fn send(&self, request: reqwest::RequestBuilder) -> Result<Json> {
        let response = request.send().await.map_err(transport)?;
        let status = response.status();
        let text = response.text().await.map_err(transport)?;
        let answer: Json = serde_json::from_str(&text).unwrap_or(Json::Null);
        let code = answer.get("code").and_then(Json::as_str).unwrap_or("").to_string();
        let message = answer.get("message").and_then(Json::as_str).unwrap_or("").to_string();
        if !status.is_success() {
            return Err(classify_http(status.as_u16(), &code, &message));
        }
        if answer.is_null() {
            return Err(Error::retryable(format!("Snowflake answered HTTP {status} without JSON")));
        }
        if answer.get("success").and_then(Json::as_bool) == Some(true) || IN_PROGRESS.contains(&code.as_str()) {
            return Ok(answer);
        }
        let sql_state = answer.pointer("/data/sqlState").and_then(Json::as_str);
        Err(classify(&code, sql_state, &message))
    }
}

/// The rows of a finished statement's answer.
fn rows(answer: &Json) -> Result<Rows> {
    let data = answer.get("data").cloned().unwrap_or(Json::Null);
    if data.get("chunks").and_then(Json::as_array).is_some_and(|c| !c.is_empty()) {
        // The sink's own queries read a few rows (offsets, a table's
        // columns); a result Snowflake splits into chunks is not one.
        return Err(Error::needs_operator("a Snowflake result came in chunks, which the sink does not read"));
    }
    if data.get("queryResultFormat").and_then(Json::as_str) == Some("arrow")
        && data.get("rowsetBase64").and_then(Json::as_str).is_some_and(|r| !r.is_empty())
    {
        return Err(Error::needs_operator(
            "Snowflake answered in Arrow although the session asked for JSON (JDBC_QUERY_RESULT_FORMAT)",
        ));
    }
    let Some(rowset) = data.get("rowset").and_then(Json::as_array) else {
        return Ok(Vec::new());
    };
    Ok(rowset
        .iter()
        .map(|row| {
            row.as_array()
                .map(|cells| cells.iter().map(|c| c.as_str().map(str::to_string)).collect())
                .unwrap_or_default()
        })
        .collect())
}

/// A request that got no answer: retryable (the statement may or may not
/// have run; every batch is one transaction, so a retry is harmless).
fn transport(e: reqwest::Error) -> Error {
    let what = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "could not connect"
    } else {
        "failed"
    };
    Error::retryable(format!("a request to Snowflake {what}")).with_class("snowflake.network").with_source(e)
}

/// An HTTP error status (Snowflake answers statement errors with 200 and
/// `success: false`; these are the gateway's and the session's).
pub(super) fn classify_http(status: u16, code: &str, message: &str) -> Error {
    if SESSION_GONE.contains(&code) || (status == 401 && (code.is_empty() || code.starts_with("3901"))) {
        return Error::retryable(format!("the Snowflake session is gone (HTTP {status}): {message}")).with_class(SESSION_CLASS);
    }
    let error = match status {
        // Throttled, overloaded, or failing inside: later may work (the
        // emulator answers what it cannot run with 500 too; the retries end
        // at the runner's policy, not here).
        408 | 429 | 500..=599 => Error::retryable(format!("Snowflake answered HTTP {status}: {}", redact(message))),
        401 | 403 => Error::needs_operator(format!("Snowflake refused the credentials (HTTP {status}): {message}")),
        _ => Error::needs_operator(format!("Snowflake answered HTTP {status}: {}", redact(message)))
            .with_hint("check snowflake.url (the account's base URL)"),
    };
    error.with_class(format!("snowflake.http.{status}"))
}

/// A statement's or login's error code (and SQLSTATE) to a kind.
pub(super) fn classify(code: &str, sql_state: Option<&str>, message: &str) -> Error {
    let class = format!("snowflake.{}", if code.is_empty() { "unknown" } else { code });
    let lower = message.to_ascii_lowercase();
    let state = sql_state.unwrap_or("");
    if SESSION_GONE.contains(&code) {
        return Error::retryable(format!("the Snowflake session is gone: {message}")).with_class(SESSION_CLASS);
    }
    let error = if lower.contains("suspended") || lower.contains("resuming") || lower.contains("being resumed") {
        Error::retryable(format!("the warehouse is not running yet: {message}"))
    } else if code.starts_with("390") {
        // Login: wrong password, locked user, MFA, network policy.
        Error::needs_operator(format!("Snowflake refused the login: {message}"))
    } else if code == "000606" {
        Error::needs_operator(format!("no warehouse: {message}")).with_hint(
            "set snowflake.warehouse, or a default warehouse for the user, and GRANT USAGE ON WAREHOUSE ... TO ROLE ...",
        )
    } else if code == "003001" || code == "003003" || state == "42501" || lower.contains("insufficient privileges") {
        Error::needs_operator(format!("the role lacks a privilege: {message}"))
            .with_hint("grant the sink's role the privileges listed in docs/destinations/snowflake.md")
    } else if code == "002003" {
        // Does not exist *or not authorized*: Snowflake does not say which.
        Error::needs_operator(format!("an object is missing or not visible to the role: {message}"))
            .with_hint("create the database (the sink creates schemas and tables) and grant the sink's role USAGE on it")
    } else if state.starts_with("40") || lower.contains("lock") || lower.contains("conflict") || code == "000604" || code == "000630" {
        // Transaction rolled back, a lock wait ended, cancelled, timed out.
        Error::retryable(format!("Snowflake could not finish the statement: {message}"))
    } else if code.starts_with("100") || state.starts_with("22") || state.starts_with("23") {
        // A value the column refuses: the record's, with Snowflake's
        // reason (cut before the value).
        Error::permanent(format!("Snowflake refused a value: {}", redact(message)))
    } else {
        Error::permanent(format!("Snowflake refused the statement: {}", redact(message)))
    };
    error.with_class(class)
}

/// A message cut before the first quoted part (Snowflake's and DuckDB's
/// data errors quote the refused value).
pub(super) fn redact(message: &str) -> String {
    match message.find(['\'', '"']) {
        Some(at) => format!("{}…", message[..at].trim_end()),
        None => message.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_by_code_and_state() {
        let kind = |code: &str, state: Option<&str>, msg: &str| classify(code, state, msg).kind();
        assert_eq!(kind("390100", None, "Incorrect username or password was specified."), ErrorKind::NeedsOperator);
        assert_eq!(kind("000606", Some("57P03"), "No active warehouse selected"), ErrorKind::NeedsOperator);
        assert_eq!(kind("003001", Some("42501"), "Insufficient privileges"), ErrorKind::NeedsOperator);
        assert_eq!(kind("100038", Some("22018"), "Numeric value 'abc' is not recognized"), ErrorKind::Permanent);
        assert_eq!(kind("100072", Some("22000"), "NULL result in a non-nullable column"), ErrorKind::Permanent);
        assert_eq!(kind("000625", Some("57014"), "Warehouse 'W' is suspended"), ErrorKind::Retryable);
        assert_eq!(kind("390112", None, "Your session has expired."), ErrorKind::Retryable);
        assert_eq!(classify("390112", None, "").class(), SESSION_CLASS);
        assert_eq!(classify_http(503, "", "").kind(), ErrorKind::Retryable);
        assert_eq!(classify_http(429, "", "").kind(), ErrorKind::Retryable);
        assert_eq!(classify_http(500, "261000", "Unhandled exception").kind(), ErrorKind::Retryable);
        assert_eq!(classify_http(403, "", "").kind(), ErrorKind::NeedsOperator);
        assert_eq!(classify_http(401, "390104", "").class(), SESSION_CLASS);
    }

    #[test]
    fn data_errors_never_carry_the_value() {
        let e = classify("100038", Some("22018"), "Numeric value 'secret' is not recognized");
        assert!(!e.to_string().contains("secret"), "{e}");
        let e = classify("100035", Some("22007"), "Conversion Error: Could not convert string \"secret\" to INT");
        assert!(!e.to_string().contains("secret"), "{e}");
    }
}

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

/// How long a key-pair login's JWT is valid (Snowflake accepts at most an
/// hour; it is made for each login and used once).
pub const JWT_LIFETIME_SECS: u64 = 59 * 60;

/// How the sink logs in.
pub(super) enum Credentials {
    /// User and password.
    Password(SecretString),
    /// Key-pair authentication: a JWT signed with the user's private key,
    /// made at each login.
    KeyPair(KeyPair),
}

/// The user's RSA private key and its public key's fingerprint, for
/// Snowflake's key-pair login
/// (<https://docs.snowflake.com/en/developer-guide/sql-api/authenticating>).
pub(super) struct KeyPair {
    key: jsonwebtoken::EncodingKey,
    /// `SHA256:` and the base64 SHA-256 of the public key's DER
    /// (SubjectPublicKeyInfo): what `DESC USER` shows as
    /// `RSA_PUBLIC_KEY_FP`.
    fingerprint: String,
}

impl KeyPair {
    /// From a PEM private key: PKCS#8 (`BEGIN PRIVATE KEY`), PKCS#1
    /// (`BEGIN RSA PRIVATE KEY`), or encrypted PKCS#8 (`BEGIN ENCRYPTED
    /// PRIVATE KEY`: PBES2 with PBKDF2 or scrypt and AES, or 3DES as
    /// Snowflake's documentation makes it) with its `passphrase`. The error
    /// names the field at fault (never the key or the passphrase).
    pub(super) fn from_pem(pem: &str, passphrase: Option<&str>) -> std::result::Result<Self, KeyError> {
        use base64::Engine as _;
        use rsa::pkcs1::{DecodeRsaPrivateKey, EncodeRsaPrivateKey};
        use rsa::pkcs8::{DecodePrivateKey, EncodePublicKey};
        use sha2::Digest as _;
        let key = if pem.contains("BEGIN ENCRYPTED PRIVATE KEY") {
            let passphrase = passphrase.ok_or(KeyError::Passphrase(
                "is required: private_key is an encrypted key (BEGIN ENCRYPTED PRIVATE KEY)",
            ))?;
            rsa::RsaPrivateKey::from_pkcs8_encrypted_pem(pem, passphrase.as_bytes()).map_err(|e| match e {
                // Decryption with the wrong passphrase ends in bad padding
                // (which pkcs5 0.7 reports as EncryptFailed) or in bytes
                // that are no key.
                rsa::pkcs8::Error::EncryptedPrivateKey(
                    rsa::pkcs8::pkcs5::Error::DecryptFailed | rsa::pkcs8::pkcs5::Error::EncryptFailed,
                )
                | rsa::pkcs8::Error::Asn1(_)
                | rsa::pkcs8::Error::KeyMalformed => KeyError::Passphrase(
                    "does not decrypt private_key (a wrong passphrase, or a key damaged in copying)",
                ),
                other => KeyError::Key(format!(
                    "is an encrypted key the sink cannot decrypt ({other}): it reads PBES2 with PBKDF2 or scrypt \
                     and AES or 3DES (`openssl pkcs8 -topk8 -v2 aes-256-cbc`)"
                )),
            })?
        } else if pem.contains("Proc-Type: 4,ENCRYPTED") {
            return Err(KeyError::Key(
                "is a traditional OpenSSL-encrypted RSA key, which the sink does not read: convert it to \
                 encrypted PKCS#8 (`openssl pkcs8 -topk8 -v2 aes-256-cbc -in old.pem -out rsa_key.p8`)"
                    .into(),
            ));
        } else {
            if passphrase.is_some() {
                return Err(KeyError::Passphrase("is given, but private_key is not encrypted: remove it"));
            }
            rsa::RsaPrivateKey::from_pkcs8_pem(pem)
                .or_else(|_| rsa::RsaPrivateKey::from_pkcs1_pem(pem))
                .map_err(|e| {
                    KeyError::Key(format!(
                        "is not an RSA private key in PEM (BEGIN PRIVATE KEY, BEGIN ENCRYPTED PRIVATE KEY or BEGIN \
                     RSA PRIVATE KEY): {e}"
                    ))
                })?
        };
        let public = key
            .to_public_key()
            .to_public_key_der()
            .map_err(|e| KeyError::Key(format!("its public key cannot be encoded: {e}")))?;
        let fingerprint = format!(
            "SHA256:{}",
            base64::engine::general_purpose::STANDARD.encode(sha2::Sha256::digest(public.as_bytes()))
        );
        let der = key
            .to_pkcs1_der()
            .map_err(|e| KeyError::Key(format!("cannot be encoded for signing: {e}")))?;
        Ok(Self {
            key: jsonwebtoken::EncodingKey::from_rsa_der(der.as_bytes()),
            fingerprint,
        })
    }

    /// The public key's fingerprint (`SHA256:...`).
    pub(super) fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// The login JWT of `user` in `account`, issued at `now` (seconds since
    /// the epoch): `iss` = `ACCOUNT.USER.SHA256:<fingerprint>`, `sub` =
    /// `ACCOUNT.USER`, RS256.
    pub(super) fn token(&self, account: &str, user: &str, now: u64) -> Result<String> {
        let subject = format!("{}.{}", jwt_account(account), user.to_ascii_uppercase());
        let claims = json!({
            "iss": format!("{subject}.{}", self.fingerprint),
            "sub": subject,
            "iat": now,
            "exp": now + JWT_LIFETIME_SECS,
        });
        jsonwebtoken::encode(&jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256), &claims, &self.key)
            .map_err(|e| Error::needs_operator(format!("cannot sign the key-pair login's JWT: {e}")))
    }
}

/// The account as the JWT's claims name it: upper case, and for an account
/// locator with a region or cloud (`xy12345.us-east-2.aws`) only the
/// locator (Snowflake's documentation).
fn jwt_account(account: &str) -> String {
    account.split('.').next().unwrap_or(account).to_ascii_uppercase()
}

/// Why a private key cannot be used, by the field at fault.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum KeyError {
    /// `private_key` itself.
    Key(String),
    /// `private_key_passphrase` (missing, wrong, or not wanted).
    Passphrase(&'static str),
}

/// One session.
pub(super) struct SfClient {
    config: SnowflakeSinkConfig,
    credentials: Credentials,
    http: reqwest::Client,
    token: Option<SecretString>,
    sequence: u64,
}

impl SfClient {
    /// A client; it logs in on first use.
    pub(super) fn new(config: &SnowflakeSinkConfig, credentials: Credentials) -> Result<Self> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_millis(config.request_timeout_ms))
            .connect_timeout(Duration::from_millis(config.request_timeout_ms.min(10_000)))
            .build()
            .map_err(|e| Error::needs_operator(format!("cannot build the HTTP client: {e}")))?;
        Ok(Self {
            config: config.clone(),
            credentials,
            http,
            token: None,
            sequence: 0,
        })
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
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or_default();
        let body = login_body(&self.config, &self.credentials, now)?;
        let answer = self.send(self.http.post(url).json(&body)).await.map_err(|e| {
            if e.kind() == ErrorKind::NeedsOperator {
                e.with_hint(match &self.credentials {
                    Credentials::Password(_) => {
                        "check snowflake.user and snowflake.password, that the user is not locked or disabled, \
                         and that snowflake.account matches snowflake.url"
                            .to_string()
                    }
                    Credentials::KeyPair(k) => format!(
                        "check that the user's RSA_PUBLIC_KEY (or RSA_PUBLIC_KEY_2) is the public key of \
                         snowflake.private_key (DESC USER shows RSA_PUBLIC_KEY_FP = {}), that the user is not \
                         locked or disabled, and that snowflake.account matches snowflake.url",
                        k.fingerprint()
                    ),
                })
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
        rows(&self.run(sql, None).await?)
    }

    /// Runs a query whose result may be large and returns every row: the
    /// first part in the answer, the rest in the chunks Snowflake leaves in
    /// its storage, fetched as its drivers fetch them (`url` of each chunk,
    /// with the answer's chunk headers).
    pub(super) async fn query_all(&mut self, sql: &str) -> Result<Rows> {
        let answer = self.run(sql, None).await?;
        let data = answer.get("data").cloned().unwrap_or(Json::Null);
        let mut out = inline_rows(&data)?;
        let headers = chunk_headers(&data);
        for chunk in data.get("chunks").and_then(Json::as_array).into_iter().flatten() {
            let url = chunk
                .get("url")
                .and_then(Json::as_str)
                .ok_or_else(|| Error::retryable("Snowflake answered a result chunk without its URL"))?;
            let mut request = self.http.get(url);
            for (name, value) in &headers {
                request = request.header(name, value);
            }
            let response = request.send().await.map_err(transport)?;
            let status = response.status();
            if !status.is_success() {
                // An expired URL too: the retry runs the query again.
                return Err(Error::retryable(format!("fetching a Snowflake result chunk failed: HTTP {status}"))
                    .with_class("snowflake.chunk"));
            }
            out.extend(chunk_rows(&response.bytes().await.map_err(transport)?)?);
        }
        if let Some(total) = data.get("total").and_then(Json::as_u64).filter(|&t| t != out.len() as u64) {
            return Err(Error::retryable(format!("Snowflake answered {} of the {total} rows of a query", out.len()))
                .with_class("snowflake.chunk"));
        }
        Ok(out)
    }

    /// Runs one statement with bindings (`{"1": {"type": ..., "value":
    /// [...]}, ...}`: an array binding runs the INSERT once per row).
    pub(super) async fn query_bound(&mut self, sql: &str, bindings: Json) -> Result<Rows> {
        rows(&self.run(sql, Some(bindings)).await?)
    }

    /// Runs a `PUT` and returns where its file goes: Snowflake answers a
    /// PUT with the stage's location and credentials (`data.stageInfo`),
    /// and the client uploads the file there itself.
    pub(super) async fn put(&mut self, sql: &str) -> Result<Json> {
        let answer = self.run(sql, None).await?;
        Ok(answer.get("data").cloned().unwrap_or(Json::Null))
    }

    /// Uploads a gzipped file to a presigned URL of the stage's storage,
    /// as Snowflake's drivers do for a stage on Google Cloud Storage: one
    /// HTTP PUT, no `Content-Encoding` (GCS would otherwise serve the file
    /// decompressed) and the file's SHA-256 in `sfc-digest`, the metadata
    /// Snowflake's own clients write.
    pub(super) async fn upload(&self, url: &str, body: Vec<u8>) -> Result<()> {
        use base64::Engine as _;
        use sha2::Digest as _;
        let digest = base64::engine::general_purpose::STANDARD.encode(sha2::Sha256::digest(&body));
        let response = self
            .http
            .put(url)
            .header("Content-Encoding", "")
            .header("x-goog-meta-sfc-digest", digest)
            .body(body)
            .send()
            .await
            .map_err(transport)?;
        let status = response.status();
        if status.is_success() {
            return Ok(());
        }
        // An expired presigned URL (403) or a storage hiccup: the retry
        // PUTs the file again with a new URL.
        Err(
            Error::retryable(format!("uploading a staged file to Snowflake's stage storage failed: HTTP {status}"))
                .with_class(format!("snowflake.upload.{}", status.as_u16())),
        )
    }

    async fn run(&mut self, sql: &str, bindings: Option<Json>) -> Result<Json> {
        if self.token.is_none() {
            // The sink logs in (and sets the session's schema) in its
            // `connect`, before any statement.
            return Err(Error::retryable("no Snowflake session").with_class(SESSION_CLASS));
        }
        let deadline = Duration::from_millis(self.config.query_timeout_ms);
        let result = tokio::time::timeout(deadline, self.run_once(sql, bindings))
            .await
            .unwrap_or_else(|_| {
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

    async fn run_once(&mut self, sql: &str, bindings: Option<Json>) -> Result<Json> {
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
        Ok(answer)
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

/// Where a `PUT`'s file is to be uploaded, from Snowflake's answer to the
/// PUT (`data`): a presigned URL of a stage on Google Cloud Storage (what
/// Snowflake gives on GCP accounts and fakesnow gives too) with no
/// client-side encryption (the sink's stage is created with
/// `ENCRYPTION = (TYPE = 'SNOWFLAKE_SSE')`). Anything else (S3 or Azure
/// credentials, a GCS access token, encryption material) is a place the
/// sink does not upload to: the reason, for the log.
pub(super) fn upload_url(data: &Json) -> std::result::Result<String, String> {
    let command = data.get("command").and_then(Json::as_str).unwrap_or("");
    if command != "UPLOAD" {
        return Err(format!("Snowflake answered the PUT with command {command:?}, not UPLOAD"));
    }
    if data.get("encryptionMaterial").is_some_and(|m| !m.is_null()) {
        return Err("the stage wants client-side encryption, which the sink does not do".into());
    }
    let info = data.get("stageInfo").cloned().unwrap_or(Json::Null);
    let location = info.get("locationType").and_then(Json::as_str).unwrap_or("");
    match info.get("presignedUrl").and_then(Json::as_str) {
        Some(url) if location == "GCS" && !url.is_empty() => Ok(url.to_string()),
        _ => Err(format!(
            "the stage is on {location:?} storage, where the sink does not upload (it uploads to the presigned \
             URLs of stages on Google Cloud Storage)"
        )),
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
    inline_rows(&data)
}

/// The rows an answer's `data` carries itself (a large result's first
/// part).
fn inline_rows(data: &Json) -> Result<Rows> {
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

/// The headers a result chunk is fetched with: the answer's
/// `chunkHeaders`, or the key of the chunks' server-side encryption
/// (`qrmk`), as Snowflake's drivers send them.
fn chunk_headers(data: &Json) -> Vec<(String, String)> {
    if let Some(headers) = data.get("chunkHeaders").and_then(Json::as_object) {
        return headers
            .iter()
            .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
            .collect();
    }
    match data.get("qrmk").and_then(Json::as_str) {
        Some(key) => vec![
            ("x-amz-server-side-encryption-customer-algorithm".into(), "AES256".into()),
            ("x-amz-server-side-encryption-customer-key".into(), key.to_string()),
        ],
        None => Vec::new(),
    }
}

/// The rows of one result chunk: JSON rows separated by commas, without
/// the enclosing brackets, gzipped or not.
fn chunk_rows(body: &[u8]) -> Result<Rows> {
    let unreadable = || Error::retryable("a Snowflake result chunk is not JSON rows").with_class("snowflake.chunk");
    let text = if body.starts_with(&[0x1f, 0x8b]) {
        use std::io::Read as _;
        let mut text = String::new();
        flate2::read::GzDecoder::new(body)
            .read_to_string(&mut text)
            .map_err(|_| unreadable())?;
        text
    } else {
        String::from_utf8(body.to_vec()).map_err(|_| unreadable())?
    };
    serde_json::from_str(&format!("[{text}]")).map_err(|_| unreadable())
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
    Error::retryable(format!("a request to Snowflake {what}"))
        .with_class("snowflake.network")
        .with_source(e)
}

/// An HTTP error status (Snowflake answers statement errors with 200 and
/// `success: false`; these are the gateway's and the session's).
pub(super) fn classify_http(status: u16, code: &str, message: &str) -> Error {
    if SESSION_GONE.contains(&code) || (status == 401 && (code.is_empty() || code.starts_with("3901"))) {
        return Error::retryable(format!("the Snowflake session is gone (HTTP {status}): {message}"))
            .with_class(SESSION_CLASS);
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

/// The login request's body: the password, or for a key-pair login
/// `AUTHENTICATOR = SNOWFLAKE_JWT` and a JWT issued at `now`.
fn login_body(config: &SnowflakeSinkConfig, credentials: &Credentials, now: u64) -> Result<Json> {
    let mut data = json!({
        "CLIENT_APP_ID": CLIENT_APP_ID,
        "CLIENT_APP_VERSION": env!("CARGO_PKG_VERSION"),
        "ACCOUNT_NAME": config.account,
        "LOGIN_NAME": config.user,
        "SESSION_PARAMETERS": {
            // Results as rows of text (the sink reads no Arrow).
            "JDBC_QUERY_RESULT_FORMAT": "JSON",
            "AUTOCOMMIT": true,
            "QUERY_TAG": "tributary-sink",
        },
    });
    match credentials {
        Credentials::Password(p) => data["PASSWORD"] = json!(p.expose_secret()),
        Credentials::KeyPair(k) => {
            data["AUTHENTICATOR"] = json!("SNOWFLAKE_JWT");
            data["TOKEN"] = json!(k.token(&config.account, &config.user, now)?);
        }
    }
    Ok(json!({ "data": data }))
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
        Error::needs_operator(format!("an object is missing or not visible to the role: {message}")).with_hint(
            "create the database (the sink creates schemas and tables) and grant the sink's role USAGE on it",
        )
    } else if state.starts_with("40")
        || lower.contains("lock")
        || lower.contains("conflict")
        || code == "000604"
        || code == "000630"
    {
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

    const KEY_PKCS8: &str = include_str!("testdata/rsa_key.p8");
    const KEY_PKCS1: &str = include_str!("testdata/rsa_key_pkcs1.pem");
    /// The same key encrypted (testdata/README.md has the commands).
    const KEY_AES: &str = include_str!("testdata/rsa_key_aes.p8");
    const KEY_DES3: &str = include_str!("testdata/rsa_key_des3.p8");
    const PASSPHRASE: &str = "tributary-test";
    const PUBLIC_KEY: &str = include_str!("testdata/rsa_key.pub");
    /// What Snowflake's documented `openssl ... | openssl dgst -sha256
    /// -binary | openssl enc -base64` printed for the key.
    const FINGERPRINT: &str = include_str!("testdata/rsa_key.fingerprint");

    #[test]
    fn a_key_pair_login_sends_a_jwt_snowflake_can_verify() {
        let pair = KeyPair::from_pem(KEY_PKCS8, None).expect("PKCS#8");
        assert_eq!(pair.fingerprint(), format!("SHA256:{}", FINGERPRINT.trim()));
        assert_eq!(KeyPair::from_pem(KEY_PKCS1, None).expect("PKCS#1").fingerprint(), pair.fingerprint());

        let now = 1_767_225_600;
        let token = pair.token("myorg-myaccount", "tributary_svc", now).expect("token");
        // Verified with the public key alone, as Snowflake does.
        let public = {
            use rsa::pkcs1::EncodeRsaPublicKey;
            use rsa::pkcs8::DecodePublicKey;
            rsa::RsaPublicKey::from_public_key_pem(PUBLIC_KEY)
                .expect("public key")
                .to_pkcs1_der()
                .expect("der")
        };
        let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::RS256);
        validation.validate_exp = false;
        let verified = |token: &str| {
            jsonwebtoken::decode::<Json>(
                token,
                &jsonwebtoken::DecodingKey::from_rsa_der(public.as_bytes()),
                &validation,
            )
            .expect("a valid RS256 signature")
            .claims
        };
        let claims = verified(&token);
        assert_eq!(claims["sub"], "MYORG-MYACCOUNT.TRIBUTARY_SVC");
        assert_eq!(claims["iss"], format!("MYORG-MYACCOUNT.TRIBUTARY_SVC.SHA256:{}", FINGERPRINT.trim()));
        assert_eq!(claims["iat"], now);
        assert_eq!(claims["exp"], now + JWT_LIFETIME_SECS);
        // An account locator with its region: the locator alone.
        let token = pair.token("xy12345.us-east-2.aws", "u", now).expect("token");
        assert_eq!(verified(&token)["sub"], "XY12345.U");

        let mut config =
            SnowflakeSinkConfig::new("https://x.snowflakecomputing.com", "myorg-myaccount", "u", "p", "DB", "g");
        let body = login_body(&config, &Credentials::KeyPair(pair), now).expect("body");
        assert_eq!(body["data"]["AUTHENTICATOR"], "SNOWFLAKE_JWT");
        assert!(body["data"]["TOKEN"].as_str().is_some_and(|t| t.split('.').count() == 3));
        assert!(body["data"].get("PASSWORD").is_none());
        config.password = Some("secret".into());
        let body = login_body(&config, &Credentials::Password(SecretString::from("secret")), now).expect("body");
        assert_eq!(body["data"]["PASSWORD"], "secret");
        assert!(body["data"].get("AUTHENTICATOR").is_none());
    }

    #[test]
    fn an_encrypted_key_decrypts_to_the_same_key() {
        for (name, pem) in [("AES-256-CBC", KEY_AES), ("3DES", KEY_DES3)] {
            let pair = KeyPair::from_pem(pem, Some(PASSPHRASE)).unwrap_or_else(|e| panic!("{name}: {e:?}"));
            assert_eq!(pair.fingerprint(), format!("SHA256:{}", FINGERPRINT.trim()), "{name}");
        }
    }

    #[test]
    fn a_key_that_cannot_be_used_is_named_without_its_content() {
        let passphrase_error = |pem: &str, passphrase: Option<&str>| match KeyPair::from_pem(pem, passphrase) {
            Err(KeyError::Passphrase(rule)) => rule,
            Err(other) => panic!("not the passphrase's fault: {other:?}"),
            Ok(_) => panic!("accepted"),
        };
        assert!(passphrase_error(KEY_AES, None).contains("is required"));
        assert!(passphrase_error(KEY_AES, Some("wrong")).contains("wrong passphrase"));
        assert!(passphrase_error(KEY_DES3, Some("wrong")).contains("wrong passphrase"));
        assert!(passphrase_error(KEY_PKCS8, Some(PASSPHRASE)).contains("not encrypted"));
        let traditional = "-----BEGIN RSA PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\nDEK-Info: AES-256-CBC,00\n\nAAAA\n-----END RSA PRIVATE KEY-----\n";
        let Err(KeyError::Key(e)) = KeyPair::from_pem(traditional, Some(PASSPHRASE)) else {
            panic!("accepted")
        };
        assert!(e.contains("openssl pkcs8 -topk8"), "{e}");
        let Err(KeyError::Key(e)) = KeyPair::from_pem("not a key", None) else {
            panic!("accepted")
        };
        assert!(e.contains("not an RSA private key"), "{e}");
        assert!(!e.contains("not a key"), "the message never repeats the value: {e}");
    }

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
    fn uploads_go_only_to_presigned_gcs_urls_without_client_side_encryption() {
        // What fakesnow 0.12.1 answers (and Snowflake on GCP, whose
        // answer also names the stage's bucket and region).
        let gcs = json!({
            "command": "UPLOAD",
            "autoCompress": false,
            "stageInfo": {"locationType": "GCS", "location": "DB.bk.stage/", "creds": {},
                          "presignedUrl": "http://127.0.0.1:9070/fs_bucket/DB/bk/stage/f.csv.gz"},
        });
        assert_eq!(upload_url(&gcs).as_deref(), Ok("http://127.0.0.1:9070/fs_bucket/DB/bk/stage/f.csv.gz"));
        let mut encrypted = gcs.clone();
        encrypted["encryptionMaterial"] = json!({"queryStageMasterKey": "a2V5", "queryId": "q", "smkId": 1});
        assert!(upload_url(&encrypted).unwrap_err().contains("client-side encryption"));
        let s3 = json!({"command": "UPLOAD", "stageInfo": {"locationType": "S3", "location": "bucket/path/",
                        "creds": {"AWS_KEY_ID": "k", "AWS_SECRET_KEY": "s", "AWS_TOKEN": "t"}}});
        assert!(upload_url(&s3).unwrap_err().contains("\"S3\""));
        let token = json!({"command": "UPLOAD", "stageInfo": {"locationType": "GCS", "location": "b/p/",
                           "creds": {"GCS_ACCESS_TOKEN": "t"}}});
        assert!(upload_url(&token).is_err());
        assert!(upload_url(&json!({"command": "DOWNLOAD"})).is_err());
    }

    #[test]
    fn result_chunks_read_as_rows_plain_or_gzipped() {
        use std::io::Write as _;
        let body = br#"["1","a"],[null,"b\"c"]"#;
        let want = vec![
            vec![Some("1".to_string()), Some("a".to_string())],
            vec![None, Some("b\"c".to_string())],
        ];
        assert_eq!(chunk_rows(body).expect("plain"), want);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(body).expect("gzip");
        assert_eq!(chunk_rows(&gz.finish().expect("gzip")).expect("gzipped"), want);
        assert!(chunk_rows(b"not rows").is_err());
        let headers = chunk_headers(&json!({"qrmk": "k"}));
        assert_eq!(headers[1], ("x-amz-server-side-encryption-customer-key".to_string(), "k".to_string()));
        let headers = chunk_headers(&json!({"qrmk": "k", "chunkHeaders": {"x-goog-a": "b"}}));
        assert_eq!(headers, vec![("x-goog-a".to_string(), "b".to_string())]);
    }

    #[test]
    fn data_errors_never_carry_the_value() {
        let e = classify("100038", Some("22018"), "Numeric value 'secret' is not recognized");
        assert!(!e.to_string().contains("secret"), "{e}");
        let e = classify("100035", Some("22007"), "Conversion Error: Could not convert string \"secret\" to INT");
        assert!(!e.to_string().contains("secret"), "{e}");
    }
}

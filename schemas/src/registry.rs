//! A Confluent-compatible schema registry client with in-process caches.
//!
//! Registration and look-ups go through `schema_registry_converter` (its
//! `SrSettings`); the two calls it does not offer in the form we need
//! (compatibility against `versions/latest`, per-subject configuration) go
//! through a `reqwest` client of the same version, so there is one HTTP
//! stack. [`Registry::in_memory`] gives a registry without a server, for
//! tests, benchmarks and tools that work on fixed schemas.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use schema_registry_converter::async_impl::schema_registry::{
    get_schema_by_id, perform_sr_call, post_schema, SrSettings,
};
use schema_registry_converter::error::SRCError;
use schema_registry_converter::schema_registry_common::{RawError, SchemaType, SrCall, SuppliedSchema};

use crate::error::SchemaError;

/// How long one registry call may take. Long enough for a registry under
/// load, short enough that a dead one is noticed and retried by the caller.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);

/// Content type of the Confluent API.
const CONTENT_TYPE: &str = "application/vnd.schemaregistry.v1+json";

/// Confluent error code of "subject not found" and "version not found".
const SUBJECT_NOT_FOUND: u32 = 40401;
const VERSION_NOT_FOUND: u32 = 40402;

type Result<T> = std::result::Result<T, SchemaError>;

/// What a registry that wants credentials or a private CA is reached with.
/// Secrets never reach `Debug`, logs or errors.
#[derive(Clone, Default)]
pub struct RegistryAccess {
    /// Basic authentication: user and password (Confluent Cloud: the API key
    /// and secret).
    pub basic: Option<(String, secrecy::SecretString)>,
    /// A bearer token (`Authorization: Bearer ...`).
    pub token: Option<secrecy::SecretString>,
    /// PEM certificates the registry's certificate may chain to, besides
    /// the usual roots.
    pub ca_pem: Option<Vec<u8>>,
}

impl std::fmt::Debug for RegistryAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryAccess")
            .field("basic", &self.basic.as_ref().map(|(user, _)| (user, "[redacted]")))
            .field("token", &self.token.as_ref().map(|_| "[redacted]"))
            .field("ca_pem", &self.ca_pem.as_ref().map(Vec::len))
            .finish()
    }
}

impl RegistryAccess {
    /// The `Authorization` header value, marked sensitive (kept out of
    /// reqwest's own Debug output).
    fn authorization(&self) -> Result<Option<reqwest::header::HeaderValue>> {
        use base64::Engine as _;
        use secrecy::ExposeSecret;
        let text = match (&self.basic, &self.token) {
            (Some((user, password)), _) => format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(format!("{user}:{}", password.expose_secret()))
            ),
            (None, Some(token)) => format!("Bearer {}", token.expose_secret()),
            (None, None) => return Ok(None),
        };
        let mut value = reqwest::header::HeaderValue::from_str(&text).map_err(|_| SchemaError::Registry {
            reason: "the registry credentials hold characters an HTTP header cannot carry".into(),
            retryable: false,
        })?;
        value.set_sensitive(true);
        Ok(Some(value))
    }

    /// A client builder with the timeout and the extra CA.
    fn client_builder(&self) -> Result<reqwest::ClientBuilder> {
        let mut builder = reqwest::Client::builder().timeout(REQUEST_TIMEOUT);
        if let Some(pem) = &self.ca_pem {
            let certs = reqwest::Certificate::from_pem_bundle(pem).map_err(|e| SchemaError::Registry {
                reason: format!("the registry CA file is not a PEM certificate file: {e}"),
                retryable: false,
            })?;
            if certs.is_empty() {
                return Err(SchemaError::Registry {
                    reason: "the registry CA file holds no certificate".into(),
                    retryable: false,
                });
            }
            for cert in certs {
                builder = builder.add_root_certificate(cert);
            }
        }
        Ok(builder)
    }
}

/// A registered schema: its text as the registry returns it, and parsed.
#[derive(Debug)]
struct Stored {
    text: Arc<str>,
    parsed: Mutex<Option<Arc<apache_avro::Schema>>>,
}

/// A schema registry, cheap to clone (clones share caches).
#[derive(Clone)]
pub struct Registry {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.inner.backend {
            Backend::Http { base, .. } => f.debug_struct("Registry").field("url", base).finish(),
            Backend::Memory(_) => f.debug_struct("Registry").field("url", &"memory").finish(),
        }
    }
}

struct Inner {
    backend: Backend,
    by_id: Mutex<HashMap<u32, Arc<Stored>>>,
    by_subject: Mutex<HashMap<(String, String), u32>>,
}

enum Backend {
    Http {
        settings: SrSettings,
        client: reqwest::Client,
        base: String,
    },
    Memory(Mutex<Memory>),
}

#[derive(Default)]
struct Memory {
    next_id: u32,
    ids_by_text: HashMap<String, u32>,
    versions: HashMap<String, Vec<u32>>,
    texts: HashMap<u32, String>,
}

/// A lock that survives a panic elsewhere: the maps stay usable because
/// every update is a single insert.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Maps the converter's error to ours: network failures and 5xx are worth
/// retrying, 4xx (a bad or incompatible schema) are not.
fn from_src(what: &str, e: SRCError) -> SchemaError {
    let code = std::error::Error::source(&e)
        .and_then(|s| s.downcast_ref::<RawError>())
        .map(|r| r.error_code);
    // No HTTP status at all: the call itself failed (registry down or
    // restarting, found by the fault suite), which a retry fixes; but not a
    // certificate the runner does not trust, which only a setting fixes.
    let transport = code.is_none() && e.error.starts_with("http call");
    let causes = causes(&e);
    let untrusted = transport && causes.contains("certificate");
    let retryable = !untrusted
        && (e.retriable
            || transport
            || matches!(code, Some(c) if (500..600).contains(&c) || (50000..60000).contains(&c)));
    let hint = if untrusted {
        " (the registry's certificate is not trusted: set [schema_registry] ca_file to its CA's PEM file)"
    } else {
        ""
    };
    let reason = if transport {
        format!("{what}: {}{causes}{hint}", e.error)
    } else {
        format!("{what}: {}", e.error)
    };
    SchemaError::Registry { reason, retryable }
}

/// The messages of an HTTP call's failure below the converter's own (the
/// connection, TLS or timeout that failed), `: `-separated; their text has
/// the URL at most, never a credential.
fn causes(e: &SRCError) -> String {
    let mut out = String::new();
    let mut next = std::error::Error::source(e);
    while let Some(cause) = next {
        let text = cause.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        next = cause.source();
    }
    out
}

fn not_found(e: &SRCError) -> bool {
    std::error::Error::source(e)
        .and_then(|s| s.downcast_ref::<RawError>())
        .is_some_and(|r| matches!(r.error_code, SUBJECT_NOT_FOUND | VERSION_NOT_FOUND | 404))
}

fn from_reqwest(what: &str, e: reqwest::Error) -> SchemaError {
    SchemaError::Registry { reason: format!("{what}: {e}"), retryable: true }
}

fn from_status(what: &str, status: reqwest::StatusCode, body: &str) -> SchemaError {
    // The registry's message names the schema's problem; it never contains
    // row data, so it is safe to keep.
    let message = serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("message").and_then(|m| m.as_str()).map(str::to_string))
        .unwrap_or_default();
    SchemaError::Registry {
        reason: format!("{what}: HTTP {status} {message}"),
        retryable: status.is_server_error(),
    }
}

/// The registry's compatibility answer.
#[derive(serde::Deserialize)]
struct CompatibilityResponse {
    is_compatible: bool,
    #[serde(default)]
    messages: Vec<serde_json::Value>,
}

impl Registry {
    /// A client of the registry at `url` (e.g.
    /// `http://127.0.0.1:8081/apis/ccompat/v7`). Does not connect yet.
    pub fn new(url: impl Into<String>) -> Result<Self> {
        Self::with_access(url, &RegistryAccess::default())
    }

    /// A client of the registry at `url` that authenticates and trusts an
    /// extra CA as `access` says. Does not connect yet.
    pub fn with_access(url: impl Into<String>, access: &RegistryAccess) -> Result<Self> {
        use secrecy::ExposeSecret;
        let base = url.into().trim_end_matches('/').to_string();
        let mut settings = SrSettings::new_builder(base.clone());
        settings.set_timeout(REQUEST_TIMEOUT);
        match (&access.basic, &access.token) {
            (Some((user, password)), _) => {
                settings.set_basic_authorization(user, Some(password.expose_secret()));
            }
            (None, Some(token)) => {
                settings.set_token_authorization(token.expose_secret());
            }
            (None, None) => {}
        }
        let settings = settings
            .build_with(access.client_builder()?)
            .map_err(|e| from_src("cannot build registry client", e))?;
        let mut headers = reqwest::header::HeaderMap::new();
        if let Some(value) = access.authorization()? {
            headers.insert(reqwest::header::AUTHORIZATION, value);
        }
        let client = access
            .client_builder()?
            .default_headers(headers)
            .build()
            .map_err(|e| SchemaError::Registry {
                reason: format!("cannot build HTTP client: {e}"),
                retryable: false,
            })?;
        Ok(Self::with_backend(Backend::Http { settings, client, base }))
    }

    /// A registry kept in this process: ids count from 1 in registration
    /// order, every schema is compatible. For tests, benchmarks and tools.
    pub fn in_memory() -> Self {
        Self::with_backend(Backend::Memory(Mutex::new(Memory { next_id: 1, ..Memory::default() })))
    }

    fn with_backend(backend: Backend) -> Self {
        Self {
            inner: Arc::new(Inner {
                backend,
                by_id: Mutex::new(HashMap::new()),
                by_subject: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// Registers an Avro schema under `subject` and returns its id. The
    /// registry returns the existing id for a schema it already has.
    pub async fn register(&self, subject: &str, avro_json: &str) -> Result<u32> {
        let cache_key = (subject.to_string(), avro_json.to_string());
        if let Some(id) = lock(&self.inner.by_subject).get(&cache_key) {
            return Ok(*id);
        }
        let id = match &self.inner.backend {
            Backend::Http { settings, .. } => {
                let supplied = SuppliedSchema::new(None, SchemaType::Avro, avro_json.to_string());
                post_schema(settings, subject.to_string(), supplied)
                    .await
                    .map_err(|e| from_src(&format!("registering subject {subject}"), e))?
                    .id
            }
            Backend::Memory(m) => {
                let mut m = lock(m);
                let id = match m.ids_by_text.get(avro_json) {
                    Some(id) => *id,
                    None => {
                        let id = m.next_id;
                        m.next_id += 1;
                        m.ids_by_text.insert(avro_json.to_string(), id);
                        m.texts.insert(id, avro_json.to_string());
                        id
                    }
                };
                let versions = m.versions.entry(subject.to_string()).or_default();
                if !versions.contains(&id) {
                    versions.push(id);
                }
                id
            }
        };
        lock(&self.inner.by_subject).insert(cache_key, id);
        Ok(id)
    }

    /// Whether `avro_json` may be registered as the next version of
    /// `subject` under the subject's compatibility rule (BACKWARD for the
    /// subjects we create). A subject without versions accepts anything.
    pub async fn check_compatible(&self, subject: &str, avro_json: &str) -> Result<bool> {
        Ok(self.compatibility(subject, avro_json).await?.0)
    }

    /// Like [`Registry::check_compatible`], with the registry's messages
    /// explaining a refusal.
    pub async fn compatibility(&self, subject: &str, avro_json: &str) -> Result<(bool, Vec<String>)> {
        let (client, base) = match &self.inner.backend {
            Backend::Http { client, base, .. } => (client, base),
            Backend::Memory(_) => return Ok((true, Vec::new())),
        };
        let what = format!("compatibility check of subject {subject}");
        let url = format!("{base}/compatibility/subjects/{subject}/versions/latest");
        let body = serde_json::json!({"schema": avro_json, "schemaType": "AVRO"});
        let resp = client
            .post(url)
            .header(reqwest::header::CONTENT_TYPE, CONTENT_TYPE)
            .header(reqwest::header::ACCEPT, CONTENT_TYPE)
            .body(body.to_string())
            .send()
            .await
            .map_err(|e| from_reqwest(&what, e))?;
        let status = resp.status();
        let text = resp.text().await.map_err(|e| from_reqwest(&what, e))?;
        if status == reqwest::StatusCode::NOT_FOUND {
            return Ok((true, Vec::new()));
        }
        if !status.is_success() {
            return Err(from_status(&what, status, &text));
        }
        let parsed: CompatibilityResponse = serde_json::from_str(&text).map_err(|e| SchemaError::Registry {
            reason: format!("{what}: unexpected answer: {e}"),
            retryable: false,
        })?;
        let messages = parsed
            .messages
            .iter()
            .map(|m| m.as_str().map_or_else(|| m.to_string(), str::to_string))
            .collect();
        Ok((parsed.is_compatible, messages))
    }

    /// The id of `avro_json` when it is already registered under `subject`
    /// (any version), or `None`: a schema a subject has accepted once needs
    /// no new compatibility check (a source replaying events written under
    /// an older table shape after a restart encodes them with that shape's
    /// version).
    pub async fn lookup(&self, subject: &str, avro_json: &str) -> Result<Option<u32>> {
        let cache_key = (subject.to_string(), avro_json.to_string());
        if let Some(id) = lock(&self.inner.by_subject).get(&cache_key) {
            return Ok(Some(*id));
        }
        let (client, base) = match &self.inner.backend {
            Backend::Http { client, base, .. } => (client, base),
            Backend::Memory(m) => {
                let m = lock(m);
                return Ok(m
                    .ids_by_text
                    .get(avro_json)
                    .filter(|id| m.versions.get(subject).is_some_and(|v| v.contains(id)))
                    .copied());
            }
        };
        let what = format!("looking up a schema of subject {subject}");
        let body = serde_json::json!({"schema": avro_json, "schemaType": "AVRO"});
        let resp = client
            .post(format!("{base}/subjects/{subject}"))
            .header(reqwest::header::CONTENT_TYPE, CONTENT_TYPE)
            .header(reqwest::header::ACCEPT, CONTENT_TYPE)
            .body(body.to_string())
            .send()
            .await
            .map_err(|e| from_reqwest(&what, e))?;
        let status = resp.status();
        let text = resp.text().await.map_err(|e| from_reqwest(&what, e))?;
        if status == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if !status.is_success() {
            return Err(from_status(&what, status, &text));
        }
        let id = serde_json::from_str::<serde_json::Value>(&text)
            .ok()
            .and_then(|v| v.get("id").and_then(serde_json::Value::as_u64))
            .and_then(|id| u32::try_from(id).ok())
            .ok_or_else(|| SchemaError::Registry {
                reason: format!("{what}: answer without an id"),
                retryable: false,
            })?;
        self.store(id, avro_json.to_string());
        lock(&self.inner.by_subject).insert(cache_key, id);
        Ok(Some(id))
    }

    /// Sets a subject's compatibility level (`BACKWARD`, `FULL`, ...).
    pub async fn set_compatibility(&self, subject: &str, level: &str) -> Result<()> {
        let (client, base) = match &self.inner.backend {
            Backend::Http { client, base, .. } => (client, base),
            Backend::Memory(_) => return Ok(()),
        };
        let what = format!("setting compatibility of subject {subject}");
        let resp = client
            .put(format!("{base}/config/{subject}"))
            .header(reqwest::header::CONTENT_TYPE, CONTENT_TYPE)
            .header(reqwest::header::ACCEPT, CONTENT_TYPE)
            .body(serde_json::json!({ "compatibility": level }).to_string())
            .send()
            .await
            .map_err(|e| from_reqwest(&what, e))?;
        let status = resp.status();
        if !status.is_success() {
            let text = resp.text().await.unwrap_or_default();
            return Err(from_status(&what, status, &text));
        }
        Ok(())
    }

    /// Deletes a subject and all its versions, soft then permanently (the
    /// Confluent API needs both). A subject that does not exist is not an
    /// error: deleting a copy twice must succeed.
    pub async fn delete_subject(&self, subject: &str) -> Result<()> {
        let (client, base) = match &self.inner.backend {
            Backend::Http { client, base, .. } => (client, base),
            Backend::Memory(m) => {
                lock(m).versions.remove(subject);
                return Ok(());
            }
        };
        let what = format!("deleting subject {subject}");
        for url in [
            format!("{base}/subjects/{subject}"),
            format!("{base}/subjects/{subject}?permanent=true"),
        ] {
            let resp = client
                .delete(&url)
                .header(reqwest::header::ACCEPT, CONTENT_TYPE)
                .send()
                .await
                .map_err(|e| from_reqwest(&what, e))?;
            let status = resp.status();
            if !status.is_success() && status != reqwest::StatusCode::NOT_FOUND {
                let text = resp.text().await.unwrap_or_default();
                return Err(from_status(&what, status, &text));
            }
        }
        lock(&self.inner.by_subject).retain(|(s, _), _| s != subject);
        Ok(())
    }

    /// The latest version of a subject: its id and text, or `None` when the
    /// subject has no version.
    pub async fn latest(&self, subject: &str) -> Result<Option<(u32, Arc<str>)>> {
        let (id, text) = match &self.inner.backend {
            Backend::Http { settings, .. } => match perform_sr_call(settings, SrCall::GetLatest(subject)).await {
                Ok(raw) => match (raw.id, raw.schema) {
                    (Some(id), Some(text)) => (id, text),
                    _ => {
                        return Err(SchemaError::Registry {
                            reason: format!("latest version of subject {subject}: answer without id or schema"),
                            retryable: false,
                        })
                    }
                },
                Err(e) if not_found(&e) => return Ok(None),
                Err(e) => return Err(from_src(&format!("latest version of subject {subject}"), e)),
            },
            Backend::Memory(m) => {
                let m = lock(m);
                let Some(id) = m.versions.get(subject).and_then(|v| v.last()).copied() else {
                    return Ok(None);
                };
                match m.texts.get(&id) {
                    Some(t) => (id, t.clone()),
                    None => return Ok(None),
                }
            }
        };
        let stored = self.store(id, text);
        Ok(Some((id, stored.text.clone())))
    }

    fn store(&self, id: u32, text: String) -> Arc<Stored> {
        lock(&self.inner.by_id)
            .entry(id)
            .or_insert_with(|| Arc::new(Stored { text: text.into(), parsed: Mutex::new(None) }))
            .clone()
    }

    async fn stored(&self, id: u32) -> Result<Arc<Stored>> {
        if let Some(s) = lock(&self.inner.by_id).get(&id) {
            return Ok(s.clone());
        }
        let text = match &self.inner.backend {
            Backend::Http { settings, .. } => {
                let registered = get_schema_by_id(id, settings)
                    .await
                    .map_err(|e| from_src(&format!("schema id {id}"), e))?;
                if registered.schema_type != SchemaType::Avro {
                    return Err(SchemaError::Registry {
                        reason: format!("schema id {id} is not an Avro schema"),
                        retryable: false,
                    });
                }
                registered.schema
            }
            Backend::Memory(m) => lock(m).texts.get(&id).cloned().ok_or_else(|| SchemaError::Registry {
                reason: format!("schema id {id} is not registered"),
                retryable: false,
            })?,
        };
        Ok(self.store(id, text))
    }

    /// The text of schema `id` as the registry holds it (cached).
    pub async fn schema_text(&self, id: u32) -> Result<Arc<str>> {
        Ok(self.stored(id).await?.text.clone())
    }

    /// Schema `id`, parsed by apache-avro (cached).
    pub async fn schema(&self, id: u32) -> Result<Arc<apache_avro::Schema>> {
        let stored = self.stored(id).await?;
        let mut parsed = lock(&stored.parsed);
        if let Some(s) = parsed.as_ref() {
            return Ok(s.clone());
        }
        let schema = apache_avro::Schema::parse_str(&stored.text).map_err(|e| SchemaError::Registry {
            reason: format!("schema id {id} does not parse: {e}"),
            retryable: false,
        })?;
        let schema = Arc::new(schema);
        *parsed = Some(schema.clone());
        Ok(schema)
    }

    /// Whether this registry lives in memory (no server).
    pub fn is_in_memory(&self) -> bool {
        matches!(self.inner.backend, Backend::Memory(_))
    }
}

//! The Redshift sink's sessions and staging area: the PostgreSQL wire
//! session is the PostgreSQL sink's ([`Session`]: connect, TLS, deferred
//! statements); the S3 staging area ([`Stager`]) writes each batch's CSV
//! files and their manifest and removes them after the load. Errors are
//! classified here: Redshift's own conditions first (serializable
//! isolation violation 1023, load errors, S3 access), then the one
//! SQLSTATE table.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use object_store::aws::AmazonS3Builder;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload, RetryConfig};
use secrecy::ExposeSecret;
use tributary_operations::config::{resolve_secret, ConfigError};

use super::config::S3Config;
use crate::error::{Error, ErrorKind, Result};
use crate::pgwire::quote_ident;
pub(crate) use crate::sinks::postgres::client::{CopyFailure, Ctx, HintIfNone, Session};

/// Retries of one S3 request inside the client (on top of the runner's own
/// backoff): enough to ride out a throttled or reset request, short enough
/// that a bucket that is down shows up as paused within seconds.
const S3_MAX_RETRIES: usize = 2;
/// Time limit of one S3 request with its retries.
const S3_RETRY_TIMEOUT: Duration = Duration::from_secs(20);
/// Redshift's message for error 1023 (another transaction committed a
/// conflicting change): retried, the batch is applied again from scratch.
const SERIALIZABLE_VIOLATION: &str = "Serializable isolation violation";
/// Redshift's message of a `COPY` that refused a row.
const LOAD_ERROR: &str = "stl_load_errors";

/// Maps a failure of a Redshift session to an error: Redshift's own
/// conditions (its SQLSTATE for them is the catch-all `XX000`), then the
/// PostgreSQL sink's classification (the one SQLSTATE table, row values
/// cut from data errors).
pub(crate) fn classify(err: &tokio_postgres::Error, ctx: &Ctx) -> Error {
    let e = crate::sinks::postgres::client::classify(err, ctx);
    let Some(db) = err.as_db_error() else {
        return e.with_hint_if_none("check that the cluster is available and that redshift.url points at it".into());
    };
    let message = db.message();
    let user = quote_ident(&ctx.user);
    if message.contains(SERIALIZABLE_VIOLATION) || db.code().code() == "40001" {
        return Error::retryable(format!(
            "another transaction committed a conflicting change (Redshift error 1023, serializable isolation); \
             the batch is applied again: {}",
            e.message()
        ))
        .with_class("redshift.serializable_1023");
    }
    if message.contains(LOAD_ERROR) {
        // The row is found by bisection; Redshift's reason is in the table.
        return Error::permanent(format!("Redshift refused a staged row: {}", e.message()))
            .with_class("redshift.load_error")
            .with_hint(
                "SELECT query, line_number, colname, err_reason FROM stl_load_errors ORDER BY starttime DESC LIMIT 10",
            );
    }
    if message.contains("S3ServiceException") || message.contains("not authorized to assume IAM Role") {
        return Error::needs_operator(format!("Redshift could not read the staged files: {}", e.message()))
            .with_class("redshift.s3_access")
            .with_hint(
                "attach redshift.iam_role to the cluster and allow it s3:GetObject and s3:ListBucket on the staging \
                 bucket and prefix (docs/destinations/redshift.md)",
            );
    }
    match db.code().code() {
        "42501" => {
            let table = ctx.table.clone().unwrap_or_else(|| "<schema>.<table>".into());
            let schema = table.split('.').next().unwrap_or("public").to_string();
            Error::new(ErrorKind::NeedsOperator, e.message().to_string()).with_class(e.class()).with_hint(format!(
                "GRANT USAGE, CREATE ON SCHEMA {} TO {user}; GRANT SELECT, INSERT, UPDATE, DELETE ON {table} TO {user}",
                quote_ident(&schema)
            ))
        }
        c if c.starts_with("28") => {
            Error::new(ErrorKind::NeedsOperator, e.message().to_string()).with_class(e.class()).with_hint(
                "check the user and password in redshift.url (and that the cluster's security group admits this host)",
            )
        }
        _ => e,
    }
}

/// A batch's staged files.
#[derive(Debug, Clone)]
pub(crate) struct Staged {
    /// The files and the manifest, to remove after the load.
    pub(crate) objects: Vec<Path>,
    /// `s3://bucket/.../manifest`.
    pub(crate) manifest_url: String,
}

/// The S3 staging area.
pub(crate) struct Stager {
    store: Arc<dyn ObjectStore>,
    bucket: String,
    prefix: String,
}

impl Stager {
    /// A client of the staging bucket (no request is made).
    pub(crate) fn new(config: &S3Config, section: &str) -> Result<Self, ConfigError> {
        let retry = RetryConfig { max_retries: S3_MAX_RETRIES, retry_timeout: S3_RETRY_TIMEOUT, ..Default::default() };
        let mut b = AmazonS3Builder::from_env()
            .with_bucket_name(&config.bucket)
            .with_region(&config.region)
            .with_retry(retry);
        if let Some(endpoint) = &config.endpoint {
            b = b.with_endpoint(endpoint).with_allow_http(config.allow_http);
        }
        if let (Some(id), Some(secret)) = (&config.access_key_id, &config.secret_access_key) {
            let id = resolve_secret(&format!("{section}.s3.access_key_id"), id)?;
            let secret = resolve_secret(&format!("{section}.s3.secret_access_key"), secret)?;
            b = b.with_access_key_id(id.expose_secret()).with_secret_access_key(secret.expose_secret());
        }
        let store = b
            .build()
            .map_err(|e| ConfigError::invalid(format!("{section}.s3"), format!("cannot set up the S3 client ({e})")))?;
        Ok(Self {
            store: Arc::new(store),
            bucket: config.bucket.clone(),
            prefix: config.prefix.trim_end_matches('/').to_string(),
        })
    }

    fn url(&self, path: &Path) -> String {
        format!("s3://{}/{}", self.bucket, path)
    }

    /// Writes `files` and their manifest under a fresh directory of
    /// `group`'s.
    pub(crate) async fn put(&self, group: &str, files: Vec<Vec<u8>>) -> Result<Staged> {
        let dir = format!("{}/{}/{}", self.prefix, group, uuid::Uuid::new_v4());
        let dir = dir.trim_start_matches('/');
        let mut objects = Vec::with_capacity(files.len() + 1);
        let mut entries = Vec::with_capacity(files.len());
        for (n, file) in files.into_iter().enumerate() {
            let path = Path::from(format!("{dir}/part-{n:05}.csv"));
            let len = file.len();
            self.store.put(&path, PutPayload::from(file)).await.map_err(|e| s3_error(&e, "write a staged file"))?;
            entries.push(serde_json::json!({
                "url": self.url(&path),
                "mandatory": true,
                "meta": { "content_length": len },
            }));
            objects.push(path);
        }
        let manifest = serde_json::json!({ "entries": entries }).to_string();
        let path = Path::from(format!("{dir}/manifest"));
        self.store
            .put(&path, PutPayload::from(Bytes::from(manifest)))
            .await
            .map_err(|e| s3_error(&e, "write the manifest"))?;
        let manifest_url = self.url(&path);
        objects.push(path);
        Ok(Staged { objects, manifest_url })
    }

    /// TEST MODE ONLY: the files a manifest lists, read back from S3 (what
    /// Redshift's `COPY ... MANIFEST` reads).
    pub(crate) async fn read(&self, manifest_url: &str) -> Result<Vec<Bytes>> {
        let manifest = self.get(manifest_url).await?;
        let manifest: serde_json::Value = serde_json::from_slice(&manifest)
            .map_err(|e| Error::retryable(format!("the staged manifest is not JSON: {e}")))?;
        let mut files = Vec::new();
        for entry in manifest["entries"].as_array().map(Vec::as_slice).unwrap_or_default() {
            let url = entry["url"].as_str().ok_or_else(|| Error::retryable("a manifest entry without a url"))?;
            files.push(self.get(url).await?);
        }
        Ok(files)
    }

    async fn get(&self, url: &str) -> Result<Bytes> {
        let key = url
            .strip_prefix(&format!("s3://{}/", self.bucket))
            .ok_or_else(|| Error::retryable(format!("{url} is not in the staging bucket")))?;
        let path = Path::from(key);
        let got = self.store.get(&path).await.map_err(|e| s3_error(&e, "read a staged file"))?;
        got.bytes().await.map_err(|e| s3_error(&e, "read a staged file"))
    }

    /// Removes staged objects; a failure is only logged (a lifecycle rule
    /// on the prefix removes what stays).
    pub(crate) async fn remove(&self, staged: &Staged) {
        for path in &staged.objects {
            if let Err(e) = self.store.delete(path).await {
                tracing::warn!(object = %path, error = %e, "could not remove a staged file");
            }
        }
    }

    /// Writes, reads back and removes one small object (the `check`).
    pub(crate) async fn probe(&self, group: &str) -> Result<()> {
        let staged = self.put(group, vec![b"probe\n".to_vec()]).await?;
        let read = self.read(&staged.manifest_url).await;
        self.remove(&staged).await;
        read.map(|_| ())
    }
}

/// An S3 failure: access problems need the operator, the rest is retried.
fn s3_error(e: &object_store::Error, doing: &str) -> Error {
    let kind = match e {
        object_store::Error::PermissionDenied { .. } | object_store::Error::Unauthenticated { .. } => {
            ErrorKind::NeedsOperator
        }
        _ => ErrorKind::Retryable,
    };
    Error::new(kind, format!("could not {doing} in the S3 staging bucket: {e}"))
        .with_class("redshift.s3")
        .with_hint("check redshift.s3 (bucket, region, endpoint, credentials) and the sink's s3:PutObject, s3:GetObject and s3:DeleteObject rights on the prefix")
}

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
/// What Redshift's message of a `COPY` that refused a row names (`Load
/// into table 'x' failed.  Check 'stl_load_errors' system table for
/// details.`): the row's reason is only in that table.
const LOAD_ERROR: &str = "stl_load_errors";
/// The class of a refused row (its reason looked up in `stl_load_errors`).
pub(crate) const LOAD_ERROR_CLASS: &str = "redshift.load_error";
/// Redshift's SQLSTATE for its own conditions.
const REDSHIFT_INTERNAL: &str = "XX000";
/// What a `COPY`'s S3 failure says when the cluster may not read the
/// staged files (its role, the bucket policy, the key): the operator acts.
/// Any other `S3ServiceException` (a file gone, throttling) is retried,
/// and the retry stages the files again.
const S3_REFUSALS: [&str; 6] = [
    "Access Denied",
    "AccessDenied",
    "Status 403",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "not authorized to assume IAM Role",
];

/// Maps a failure of a Redshift session to an error: Redshift's own
/// conditions (its SQLSTATE for them is the catch-all `XX000`), then the
/// PostgreSQL sink's classification (the one SQLSTATE table, row values
/// cut from data errors).
pub(crate) fn classify(err: &tokio_postgres::Error, ctx: &Ctx) -> Error {
    let e = crate::sinks::postgres::client::classify(err, ctx);
    let Some(db) = err.as_db_error() else {
        return e.with_hint_if_none("check that the cluster is available and that redshift.url points at it".into());
    };
    classify_message(db.message(), db.code().code(), e, ctx)
}

/// Redshift's error for a `COPY` that refused a row of `table`, as the
/// cluster words it; the test mode's loader raises it, classified as
/// [`classify`] classifies the cluster's.
pub(crate) fn load_refused(table: &str, ctx: &Ctx) -> Error {
    let message = format!("Load into table '{table}' failed.  Check '{LOAD_ERROR}' system table for details.");
    let e = Error::new(crate::pgwire::sqlstate::kind(REDSHIFT_INTERNAL), message.clone());
    classify_message(&message, REDSHIFT_INTERNAL, e, ctx)
}

/// [`classify`] of a server message and SQLSTATE, `e` being the PostgreSQL
/// sink's classification of it.
fn classify_message(message: &str, code: &str, e: Error, ctx: &Ctx) -> Error {
    let user = quote_ident(&ctx.user);
    if message.contains(SERIALIZABLE_VIOLATION) || code == "40001" {
        return Error::retryable(format!(
            "another transaction committed a conflicting change (Redshift error 1023, serializable isolation); \
             the batch is applied again: {}",
            e.message()
        ))
        .with_class("redshift.serializable_1023");
    }
    // Before the load error: a message naming both is about access.
    if message.contains("S3ServiceException") || message.contains("not authorized to assume IAM Role") {
        if S3_REFUSALS.iter().any(|r| message.contains(r)) {
            return Error::needs_operator(format!("Redshift could not read the staged files: {}", e.message()))
                .with_class("redshift.s3_access")
                .with_hint(
                    "attach redshift.iam_role to the cluster and allow it s3:GetObject and s3:ListBucket on the \
                     staging bucket and prefix (docs/destinations/redshift.md)",
                );
        }
        return Error::retryable(format!(
            "Redshift could not read the staged files; they are staged again: {}",
            e.message()
        ))
        .with_class("redshift.s3_read");
    }
    if message.contains(LOAD_ERROR) {
        // The row is found by bisection; its reason is looked up in the
        // table by the sink (`LoadError`), this is what is left without it.
        return Error::permanent(format!("Redshift refused a staged row: {}", e.message()))
            .with_class(LOAD_ERROR_CLASS)
            .with_hint(
                "SELECT query, line_number, colname, err_reason FROM stl_load_errors ORDER BY starttime DESC LIMIT 10",
            );
    }
    match code {
        "42501" => {
            let table = ctx.table.clone().unwrap_or_else(|| "<schema>.<table>".into());
            let schema = table.split('.').next().unwrap_or("public").to_string();
            Error::new(ErrorKind::NeedsOperator, e.message().to_string())
                .with_class(e.class())
                .with_hint(format!(
                "GRANT USAGE, CREATE ON SCHEMA {} TO {user}; GRANT SELECT, INSERT, UPDATE, DELETE ON {table} TO {user}",
                quote_ident(&schema)
            ))
        }
        c if c.starts_with("28") => Error::new(ErrorKind::NeedsOperator, e.message().to_string())
            .with_class(e.class())
            .with_hint(
                "check the user and password in redshift.url (and that the cluster's security group admits this host)",
            ),
        _ => e,
    }
}

/// The query id a load error's `DETAIL` names (Redshift's block of
/// `error:`, `code:`, `context:`, `query:` ... lines), if any.
pub(crate) fn copy_query_id(err: &tokio_postgres::Error) -> Option<i64> {
    let detail = err.as_db_error()?.detail()?;
    detail_query_id(detail)
}

fn detail_query_id(detail: &str) -> Option<i64> {
    detail
        .lines()
        .find_map(|l| l.trim().strip_prefix("query:"))
        .and_then(|id| id.trim().parse().ok())
}

/// A row of `stl_load_errors` (see [`super::dialect::load_error_sql`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LoadError {
    /// `err_reason`, with quoted values cut.
    pub(crate) reason: String,
    pub(crate) column: String,
    pub(crate) column_type: String,
    /// `octet_length(raw_field_value)`: the value itself is never read.
    pub(crate) value_bytes: i64,
    pub(crate) line: i64,
    pub(crate) code: i32,
    pub(crate) query: i64,
}

impl LoadError {
    /// The row as [`super::dialect::load_error_sql`] selects it.
    pub(crate) fn from_row(row: &tokio_postgres::Row) -> std::result::Result<Self, tokio_postgres::Error> {
        Ok(Self {
            reason: redact_reason(&row.try_get::<_, Option<String>>(0)?.unwrap_or_default()),
            column: row.try_get::<_, Option<String>>(1)?.unwrap_or_default(),
            column_type: row.try_get::<_, Option<String>>(2)?.unwrap_or_default(),
            value_bytes: row.try_get::<_, Option<i64>>(3)?.unwrap_or(0),
            line: row.try_get::<_, Option<i64>>(4)?.unwrap_or(-1),
            code: row.try_get::<_, Option<i32>>(5)?.unwrap_or(0),
            query: row.try_get::<_, Option<i64>>(6)?.unwrap_or(-1),
        })
    }

    /// The permanent error the record is dead-lettered with: Redshift's
    /// reason first, the column as the error's column.
    pub(crate) fn into_error(self) -> Error {
        let mut e = Error::permanent(format!(
            "Redshift refused a staged row: {} (stl_load_errors: column {}, type {}, err_code {}, line {} of the \
             staged file, a value of {} bytes; query {})",
            self.reason, self.column, self.column_type, self.code, self.line, self.value_bytes, self.query
        ))
        .with_class(LOAD_ERROR_CLASS)
        .with_hint(format!(
            "SELECT * FROM stl_load_errors WHERE query = {} (the record is in the dead-letter topic; fix the column \
             or the value, then replay it)",
            self.query
        ));
        if !self.column.is_empty() {
            e = e.with_column(self.column);
        }
        e
    }
}

/// `err_reason` without the values it quotes (`Invalid digit, Value 'a',
/// Pos 0, Type: Integer`): row values stay out of errors.
pub(crate) fn redact_reason(reason: &str) -> String {
    let mut out = String::with_capacity(reason.len());
    let mut quote: Option<char> = None;
    for ch in reason.chars() {
        match quote {
            Some(q) if ch == q => {
                out.push('…');
                out.push(ch);
                quote = None;
            }
            Some(_) => {}
            None => {
                out.push(ch);
                if ch == '\'' || ch == '"' {
                    quote = Some(ch);
                }
            }
        }
    }
    if quote.is_some() {
        out.push('…');
    }
    out
}

/// A batch's staged files.
#[derive(Debug, Clone)]
pub(crate) struct Staged {
    /// The files and the manifest, to remove after the load.
    pub(crate) objects: Vec<Path>,
    /// `s3://bucket/.../manifest`.
    pub(crate) manifest_url: String,
}

impl Staged {
    /// `s3://bucket/.../<uuid>/`: the directory of this batch's files (what
    /// `stl_load_errors.filename` starts with).
    pub(crate) fn dir_url(&self) -> &str {
        self.manifest_url.strip_suffix(MANIFEST).unwrap_or(&self.manifest_url)
    }
}

/// The manifest's name in a batch's directory.
const MANIFEST: &str = "manifest";

/// The S3 staging area.
pub(crate) struct Stager {
    store: Arc<dyn ObjectStore>,
    bucket: String,
    prefix: String,
}

impl Stager {
    /// A client of the staging bucket (no request is made).
    pub(crate) fn new(config: &S3Config, section: &str) -> Result<Self, ConfigError> {
        let retry = RetryConfig {
            max_retries: S3_MAX_RETRIES,
            retry_timeout: S3_RETRY_TIMEOUT,
            ..Default::default()
        };
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
            b = b
                .with_access_key_id(id.expose_secret())
                .with_secret_access_key(secret.expose_secret());
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
            self.store
                .put(&path, PutPayload::from(file))
                .await
                .map_err(|e| s3_error(&e, "write a staged file"))?;
            entries.push(serde_json::json!({
                "url": self.url(&path),
                "mandatory": true,
                "meta": { "content_length": len },
            }));
            objects.push(path);
        }
        let manifest = serde_json::json!({ "entries": entries }).to_string();
        let path = Path::from(format!("{dir}/{MANIFEST}"));
        self.store
            .put(&path, PutPayload::from(Bytes::from(manifest)))
            .await
            .map_err(|e| s3_error(&e, "write the manifest"))?;
        let manifest_url = self.url(&path);
        objects.push(path);
        Ok(Staged { objects, manifest_url })
    }

    /// TEST MODE ONLY: the files a manifest lists, each with its URL, read
    /// back from S3 (what Redshift's `COPY ... MANIFEST` reads).
    pub(crate) async fn read(&self, manifest_url: &str) -> Result<Vec<(String, Bytes)>> {
        let manifest = self.get(manifest_url).await?;
        let manifest: serde_json::Value = serde_json::from_slice(&manifest)
            .map_err(|e| Error::retryable(format!("the staged manifest is not JSON: {e}")))?;
        let mut files = Vec::new();
        for entry in manifest["entries"].as_array().map(Vec::as_slice).unwrap_or_default() {
            let url = entry["url"]
                .as_str()
                .ok_or_else(|| Error::retryable("a manifest entry without a url"))?;
            files.push((url.to_string(), self.get(url).await?));
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

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx() -> Ctx {
        Ctx {
            user: "sink".into(),
            database: "dev".into(),
            table: Some("s.t".into()),
        }
    }

    fn classified(message: &str) -> Error {
        classify_message(message, REDSHIFT_INTERNAL, Error::new(ErrorKind::Retryable, message), &ctx())
    }

    #[test]
    fn a_refused_row_is_permanent_and_s3_access_pauses() {
        let refused = load_refused("__tributary_stage_1", &ctx());
        assert_eq!(refused.kind(), ErrorKind::Permanent);
        assert_eq!(refused.class(), LOAD_ERROR_CLASS);
        assert!(refused.message().contains("Load into table '__tributary_stage_1' failed."), "{refused}");
        for denied in [
            "S3ServiceException:Access Denied,Status 403,Error AccessDenied,Rid 1,ExtRid 2,CanRetry 1",
            "Problem reading manifest file - S3ServiceException:Access Denied,Status 403,Error AccessDenied",
            "User arn:aws:redshift:us-east-1:1:dbuser:c/u is not authorized to assume IAM Role arn:aws:iam::1:role/r",
        ] {
            let e = classified(denied);
            assert_eq!(e.kind(), ErrorKind::NeedsOperator, "{denied}");
            assert_eq!(e.class(), "redshift.s3_access");
        }
        // A staged file gone (the bucket lost it, a lifecycle rule): staged again.
        let gone = classified("S3ServiceException:The specified key does not exist.,Status 404,Error NoSuchKey");
        assert_eq!(gone.kind(), ErrorKind::Retryable);
        let conflict =
            classified("1023 Serializable isolation violation on table - 1, transactions forming the cycle are: 2, 3");
        assert_eq!(conflict.kind(), ErrorKind::Retryable);
    }

    #[test]
    fn the_load_error_names_reason_and_column_but_no_value() {
        let row = LoadError {
            reason: redact_reason("Invalid digit, Value 'x7', Pos 0, Type: Integer"),
            column: "qty".into(),
            column_type: "int8".into(),
            value_bytes: 2,
            line: 3,
            code: 1207,
            query: 5437,
        };
        let e = row.into_error();
        assert_eq!(e.kind(), ErrorKind::Permanent);
        assert_eq!(e.column(), Some("qty"));
        assert!(e.message().contains("Invalid digit, Value '…', Pos 0, Type: Integer"), "{e}");
        assert!(e.message().contains("err_code 1207") && e.message().contains("query 5437"), "{e}");
        assert!(!e.to_string().contains("x7"), "{e}");
        assert_eq!(redact_reason("date out of range: \"infinity\""), "date out of range: \"…\"");
        assert_eq!(redact_reason("cut 'open"), "cut '…");
    }

    #[test]
    fn the_query_id_comes_from_the_detail() {
        let detail = "\n  -----------------------------------------------\n  error:  Invalid digit, Value 'x', Pos 0, \
                      Type: Integer\n  code:      1207\n  context:   x\n  query:     5437\n  location:  \
                      cvt.cpp:1\n";
        assert_eq!(detail_query_id(detail), Some(5437));
        assert_eq!(detail_query_id("nothing here"), None);
    }
}

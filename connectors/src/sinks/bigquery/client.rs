//! The BigQuery sink's client: the REST API through `gcp-bigquery-client`
//! (`jobs.query` for DDL, DML and scripts; `tabledata.insertAll` for
//! staging; `tables.get` for metadata), with credentials or against an
//! emulator, every call bounded by the request timeout; and how BigQuery's
//! errors are classified (its messages can quote the value they refused, so
//! they are cut before the value).

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use gcp_bigquery_client::client_builder::ClientBuilder;
use gcp_bigquery_client::error::BQError;
use gcp_bigquery_client::model::error_proto::ErrorProto;
use gcp_bigquery_client::model::get_query_results_parameters::GetQueryResultsParameters;
use gcp_bigquery_client::model::query_request::QueryRequest;
use gcp_bigquery_client::model::query_response::QueryResponse;
use gcp_bigquery_client::model::table::Table;
use gcp_bigquery_client::model::table_data_insert_all_request::TableDataInsertAllRequest;
use gcp_bigquery_client::model::table_data_insert_all_response::TableDataInsertAllResponse;
use gcp_bigquery_client::model::table_row::TableRow;
use gcp_bigquery_client::Client;

use super::config::{BigQuerySinkConfig, DestinationTable};
use crate::error::{Error, ErrorKind, Result};

/// How long a job may run before the sink stops waiting for it and retries
/// (the retry is harmless: the script is one transaction).
const JOB_DEADLINE: Duration = Duration::from_secs(600);

/// Sends no credentials: for an emulator.
#[derive(Clone)]
struct EmulatorAuth;

#[async_trait]
impl gcp_bigquery_client::auth::Authenticator for EmulatorAuth {
    async fn access_token(&self) -> std::result::Result<String, BQError> {
        Ok("emulator".to_string())
    }
}

/// A query's result, every page of it: each column's type as BigQuery
/// names it (`INTEGER`, `TIMESTAMP`, ...) and whether it repeats, and the
/// rows' cells (text, or for a repeated column an array of `{"v": ...}`).
pub(super) struct QueryRows {
    pub(super) columns: Vec<(String, bool)>,
    pub(super) rows: Vec<Vec<serde_json::Value>>,
    /// What BigQuery says the query read (what on-demand pricing bills).
    pub(super) bytes_processed: Option<i64>,
}

/// Context of an error: the destination table it is about.
#[derive(Debug, Clone, Default)]
pub(super) struct Ctx {
    table: Option<String>,
}

impl Ctx {
    pub(super) fn table(t: impl ToString) -> Self {
        Self { table: Some(t.to_string()) }
    }
}

/// The API client, built on first use (credentials are read then).
pub(super) struct BqClient {
    config: BigQuerySinkConfig,
    client: Option<Client>,
}

impl BqClient {
    pub(super) fn new(config: &BigQuerySinkConfig) -> Self {
        Self { config: config.clone(), client: None }
    }

    fn timeout(&self) -> Duration {
        Duration::from_millis(self.config.request_timeout_ms)
    }

    pub(super) fn is_built(&self) -> bool {
        self.client.is_some()
    }

    pub(super) fn reset(&mut self) {
        self.client = None;
    }

    /// Builds the client if it is not built.
    pub(super) async fn build(&mut self) -> Result<()> {
        if self.client.is_some() {
            return Ok(());
        }
        let mut builder = ClientBuilder::new();
        let built = if let Some(url) = &self.config.emulator_url {
            builder.with_v2_base_url(format!("{}/bigquery/v2", url.trim_end_matches('/')));
            builder.build_from_authenticator(Arc::new(EmulatorAuth)).await
        } else if let Some(key) = &self.config.key_file {
            builder.build_from_service_account_key_file(key).await
        } else {
            builder.build_from_application_default_credentials().await
        };
        let client = built.map_err(|e| {
            let err = classify(&e, &Ctx::default());
            if self.config.emulator_url.is_none() {
                err.with_hint(match &self.config.key_file {
                    Some(k) => format!("check that {k} is a readable service-account key file (JSON)"),
                    None => "set bigquery.key_file, or GOOGLE_APPLICATION_CREDENTIALS, or run `gcloud auth application-default login`".into(),
                })
            } else {
                err
            }
        })?;
        self.client = Some(client);
        Ok(())
    }

    fn api(&self) -> Result<&Client> {
        self.client
            .as_ref()
            .ok_or_else(|| Error::retryable("not connected to BigQuery"))
    }

    /// Runs one query (or script) and waits for it; a body carrying
    /// `errors` is an error whatever the HTTP status (bqemulator answers
    /// failed queries with 200).
    pub(super) async fn query(&self, sql: &str, ctx: &Ctx) -> Result<QueryResponse> {
        let api = self.api()?;
        let mut request = QueryRequest::new(sql);
        request.timeout_ms = i32::try_from(self.config.request_timeout_ms).ok();
        request.location = self.config.location.clone();
        let response = tokio::time::timeout(self.timeout(), api.job().query(&self.config.project, request))
            .await
            .map_err(|_| timed_out(ctx))?
            .map_err(|e| classify(&e, ctx))?;
        if let Some(errors) = response.errors.as_deref().filter(|e| !e.is_empty()) {
            return Err(classify_proto(errors, ctx));
        }
        if response.job_complete == Some(false) {
            self.wait_for_job(&response, ctx).await?;
        }
        Ok(response)
    }

    /// Runs a query and reads every row of its result: the first page
    /// from `jobs.query`, the others (BigQuery answers about 10 MB at a
    /// time) from `jobs.getQueryResults` with the page token.
    pub(super) async fn query_rows(&self, sql: &str, ctx: &Ctx) -> Result<QueryRows> {
        let api = self.api()?;
        let first = self.query(sql, ctx).await?;
        let job = first.job_reference.as_ref().and_then(|r| r.job_id.clone());
        let location = first.job_reference.as_ref().and_then(|r| r.location.clone());
        let total = first.total_rows.as_deref().and_then(|t| t.parse::<usize>().ok());
        let bytes_processed = first.total_bytes_processed.as_deref().and_then(|b| b.parse().ok());
        let mut schema = first.schema;
        let mut rows: Vec<TableRow> = Vec::new();
        // An answer before the job finished carries no rows: read them all
        // from the first page on.
        let mut next = if first.job_complete == Some(false) {
            Some(None)
        } else {
            rows.extend(first.rows.unwrap_or_default());
            first.page_token.filter(|t| !t.is_empty()).map(Some)
        };
        while let Some(token) = next {
            let job = job
                .clone()
                .ok_or_else(|| Error::retryable("BigQuery answered a paged query without a job id"))?;
            let params = GetQueryResultsParameters {
                format_options: None,
                location: location.clone(),
                max_results: None,
                page_token: token,
                start_index: None,
                timeout_ms: i32::try_from(self.config.request_timeout_ms).ok(),
            };
            let page =
                tokio::time::timeout(self.timeout(), api.job().get_query_results(&self.config.project, &job, params))
                    .await
                    .map_err(|_| timed_out(ctx))?
                    .map_err(|e| classify(&e, ctx))?;
            if let Some(errors) = page.errors.as_deref().filter(|e| !e.is_empty()) {
                return Err(classify_proto(errors, ctx));
            }
            if schema.is_none() {
                schema = page.schema;
            }
            rows.extend(page.rows.unwrap_or_default());
            next = page.page_token.filter(|t| !t.is_empty()).map(Some);
        }
        if let Some(total) = total.filter(|&t| t != rows.len()) {
            return Err(with_ctx(
                Error::retryable(format!("BigQuery answered {} of the {total} rows of a query", rows.len())),
                ctx,
            ));
        }
        let columns = schema
            .and_then(|s| s.fields)
            .unwrap_or_default()
            .into_iter()
            .map(|f| {
                let name = serde_json::to_value(&f.r#type)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default();
                (name, f.mode.as_deref() == Some("REPEATED"))
            })
            .collect();
        let rows = rows
            .into_iter()
            .map(|r| {
                r.columns
                    .unwrap_or_default()
                    .into_iter()
                    .map(|c| c.value.unwrap_or(serde_json::Value::Null))
                    .collect()
            })
            .collect();
        Ok(QueryRows { columns, rows, bytes_processed })
    }

    /// Polls a job that `jobs.query` returned before it finished.
    async fn wait_for_job(&self, response: &QueryResponse, ctx: &Ctx) -> Result<()> {
        let api = self.api()?;
        let job = response
            .job_reference
            .as_ref()
            .and_then(|r| r.job_id.clone())
            .ok_or_else(|| Error::retryable("BigQuery answered an unfinished query without a job id"))?;
        let location = response.job_reference.as_ref().and_then(|r| r.location.clone());
        let deadline = Instant::now() + JOB_DEADLINE;
        loop {
            let params = GetQueryResultsParameters {
                format_options: None,
                location: location.clone(),
                max_results: Some(0),
                page_token: None,
                start_index: None,
                timeout_ms: i32::try_from(self.config.request_timeout_ms).ok(),
            };
            let r =
                tokio::time::timeout(self.timeout(), api.job().get_query_results(&self.config.project, &job, params))
                    .await
                    .map_err(|_| timed_out(ctx))?
                    .map_err(|e| classify(&e, ctx))?;
            if let Some(errors) = r.errors.as_deref().filter(|e| !e.is_empty()) {
                return Err(classify_proto(errors, ctx));
            }
            if r.job_complete != Some(false) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(Error::retryable(format!("job {job} still running after {JOB_DEADLINE:?}")));
            }
        }
    }

    /// `tabledata.insertAll` into `table` of `dataset`.
    pub(super) async fn insert_all(
        &self,
        dataset: &str,
        table: &str,
        request: TableDataInsertAllRequest,
        ctx: &Ctx,
    ) -> Result<TableDataInsertAllResponse> {
        let api = self.api()?;
        tokio::time::timeout(self.timeout(), api.tabledata().insert_all(&self.config.project, dataset, table, request))
            .await
            .map_err(|_| timed_out(ctx))?
            .map_err(|e| classify(&e, ctx))
    }

    /// `tables.get` (free, unlike INFORMATION_SCHEMA): `None` for a table
    /// that does not exist.
    pub(super) async fn get_table(&self, dest: &DestinationTable) -> Result<Option<Table>> {
        let ctx = Ctx::table(dest);
        let api = self.api()?;
        let got =
            tokio::time::timeout(self.timeout(), api.table().get(&dest.project, &dest.dataset, &dest.table, None))
                .await
                .map_err(|_| timed_out(&ctx))?;
        match got {
            Ok(table) => Ok(Some(table)),
            Err(BQError::ResponseError { error }) if error.error.code == 404 => Ok(None),
            Err(e) => Err(classify(&e, &ctx)),
        }
    }
}

// ---------------------------------------------------------------- errors

pub(super) fn timed_out(ctx: &Ctx) -> Error {
    let e = Error::retryable("BigQuery did not answer in time").with_class("bigquery.timeout");
    with_ctx(e, ctx)
}

/// Says which BigQuery table the error is about (the error's own table is
/// the source table, set by the core).
fn with_ctx(e: Error, ctx: &Ctx) -> Error {
    match &ctx.table {
        Some(t) => e.in_context(&format!("destination {t}")),
        None => e,
    }
}

/// The kind of a BigQuery error reason
/// (<https://cloud.google.com/bigquery/docs/error-messages>).
pub fn reason_kind(reason: &str, message: &str) -> ErrorKind {
    match reason {
        "rateLimitExceeded" | "quotaExceeded" | "backendError" | "internalError" | "jobBackendError"
        | "jobInternalError" | "timeout" | "tableUnavailable" | "notFound" | "stopped" => ErrorKind::Retryable,
        "accessDenied"
        | "billingNotEnabled"
        | "billingTierLimitExceeded"
        | "forbidden"
        | "authError"
        | "unauthorized"
        | "resourceInUse" => ErrorKind::NeedsOperator,
        "invalid" | "invalidQuery" | "duplicate" => {
            // A transaction that lost to a concurrent one is worth retrying.
            if message.contains("concurrent update") || message.contains("aborted due to concurrent") {
                ErrorKind::Retryable
            } else {
                ErrorKind::Permanent
            }
        }
        // Unknown: never skip data on a guess.
        _ => ErrorKind::Retryable,
    }
}

/// Classifies the `errors` of a response body.
pub(super) fn classify_proto(errors: &[ErrorProto], ctx: &Ctx) -> Error {
    let first = errors.first();
    let reason = first.and_then(|e| e.reason.clone()).unwrap_or_else(|| "unknown".into());
    let message = first.and_then(|e| e.message.clone()).unwrap_or_default();
    if crate::sink::bookkeeping::is_fenced_message(&message) {
        return with_ctx(crate::sink::bookkeeping::fenced(&message), ctx);
    }
    let kind = reason_kind(&reason, &message);
    with_ctx(
        Error::new(kind, format!("BigQuery: {reason}: {}", redact(&message))).with_class(format!("bigquery.{reason}")),
        ctx,
    )
}

/// Classifies an error of the client crate.
pub(super) fn classify(err: &BQError, ctx: &Ctx) -> Error {
    let e = match err {
        BQError::ResponseError { error } => {
            let code = error.error.code;
            let reason = error
                .error
                .errors
                .first()
                .and_then(|e| e.get("reason").cloned())
                .unwrap_or_else(|| error.error.status.clone());
            if crate::sink::bookkeeping::is_fenced_message(&error.error.message) {
                return with_ctx(crate::sink::bookkeeping::fenced(&error.error.message), ctx);
            }
            let message = redact(&error.error.message);
            let kind = match code {
                401 => ErrorKind::NeedsOperator,
                403 if reason == "rateLimitExceeded" || reason == "quotaExceeded" => ErrorKind::Retryable,
                403 => ErrorKind::NeedsOperator,
                408 | 429 | 500..=599 => ErrorKind::Retryable,
                _ => reason_kind(&reason, &message),
            };
            let e = Error::new(kind, format!("BigQuery HTTP {code}: {reason}: {message}"))
                .with_class(format!("bigquery.{reason}"));
            if kind == ErrorKind::NeedsOperator {
                e.with_hint("grant the sink's principal roles/bigquery.dataEditor on the datasets and roles/bigquery.jobUser on the project, or fix its credentials")
            } else {
                e
            }
        }
        BQError::RequestError(r) => Error::retryable(format!("cannot reach BigQuery: {}", redact(&r.to_string())))
            .with_class("bigquery.request"),
        BQError::InvalidServiceAccountKey(_)
        | BQError::InvalidServiceAccountAuthenticator(_)
        | BQError::InvalidApplicationDefaultCredentialsAuthenticator(_)
        | BQError::InvalidAuthorizedUserAuthenticator(_)
        | BQError::InvalidInstalledFlowAuthenticator(_)
        | BQError::AuthError(_)
        | BQError::YupAuthError(_)
        | BQError::NoToken => Error::needs_operator(format!("BigQuery credentials: {err}")).with_class("bigquery.auth"),
        BQError::SerializationError(e) => {
            Error::retryable(format!("unreadable BigQuery response: {e}")).with_class("bigquery.response")
        }
        other => Error::retryable(format!("BigQuery: {other}")).with_class("bigquery.client"),
    };
    with_ctx(e, ctx)
}

/// Cuts a BigQuery message before a quoted value: messages such as
/// "Cannot convert value to integer (bad value): abc" or "Invalid NUMERIC
/// value: 1e40" end with the value.
pub(super) fn redact(message: &str) -> String {
    let first_line = message.lines().next().unwrap_or("");
    let lower = first_line.to_ascii_lowercase();
    if lower.contains("value") {
        if let Some(at) = first_line.find(": ") {
            return format!("{} (value not shown)", &first_line[..at]);
        }
    }
    first_line.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn reasons_map_to_kinds() {
        assert_eq!(reason_kind("rateLimitExceeded", ""), ErrorKind::Retryable);
        assert_eq!(reason_kind("quotaExceeded", ""), ErrorKind::Retryable);
        assert_eq!(reason_kind("backendError", ""), ErrorKind::Retryable);
        assert_eq!(reason_kind("accessDenied", ""), ErrorKind::NeedsOperator);
        assert_eq!(reason_kind("invalid", "bad"), ErrorKind::Permanent);
        assert_eq!(
            reason_kind("invalidQuery", "Transaction is aborted due to concurrent update"),
            ErrorKind::Retryable
        );
        assert_eq!(reason_kind("somethingNew", ""), ErrorKind::Retryable);
    }

    #[test]
    fn errors_in_a_200_body_are_errors_and_values_are_cut() {
        let errors = vec![ErrorProto {
            debug_info: None,
            location: Some("id".into()),
            message: Some("Cannot convert value to integer (bad value): abc".into()),
            reason: Some("invalid".into()),
        }];
        let e = classify_proto(&errors, &Ctx::table("d.t"));
        assert_eq!(e.kind(), ErrorKind::Permanent);
        assert!(!e.to_string().contains("abc"), "{e}");
        assert_eq!(e.class(), "bigquery.invalid");
    }

    fn http_error(code: i64, reason: &str) -> BQError {
        use gcp_bigquery_client::error::{NestedResponseError, ResponseError};
        let mut detail = HashMap::new();
        detail.insert("reason".to_string(), reason.to_string());
        BQError::ResponseError {
            error: ResponseError {
                error: NestedResponseError {
                    code,
                    errors: vec![detail],
                    message: format!("{reason} happened"),
                    status: String::new(),
                },
            },
        }
    }

    #[test]
    fn http_statuses_map_to_kinds() {
        let kind = |code, reason| classify(&http_error(code, reason), &Ctx::default()).kind();
        assert_eq!(kind(429, "rateLimitExceeded"), ErrorKind::Retryable);
        assert_eq!(kind(403, "rateLimitExceeded"), ErrorKind::Retryable);
        assert_eq!(kind(403, "quotaExceeded"), ErrorKind::Retryable);
        assert_eq!(kind(500, "backendError"), ErrorKind::Retryable);
        assert_eq!(kind(503, "backendError"), ErrorKind::Retryable);
        assert_eq!(kind(401, "authError"), ErrorKind::NeedsOperator);
        assert_eq!(kind(403, "accessDenied"), ErrorKind::NeedsOperator);
        assert_eq!(kind(400, "invalid"), ErrorKind::Permanent);
        assert_eq!(kind(404, "notFound"), ErrorKind::Retryable);
        let e = classify(&http_error(403, "accessDenied"), &Ctx::default());
        assert!(e.hint().is_some_and(|h| h.contains("roles/bigquery")), "{e}");
    }
}

//! The Spanner sink's clients (`gcloud-spanner`: sessions and read-write
//! transactions over gRPC; the database admin API for DDL), with
//! credentials or against the emulator, and how Spanner's errors are
//! classified (by gRPC code, never by message; messages are cut before any
//! value they may quote).

use std::time::Duration;

use gcloud_gax::conn::Environment;
use gcloud_gax::grpc::{Code, Status};
use gcloud_googleapis::spanner::admin::database::v1::UpdateDatabaseDdlRequest;
use gcloud_googleapis::spanner::v1::struct_type::Field;
use gcloud_googleapis::spanner::v1::{Type, TypeCode};
use gcloud_spanner::admin::client::Client as AdminClient;
use gcloud_spanner::admin::AdminClientConfig;
use gcloud_spanner::client::{Client, ClientConfig};
use gcloud_spanner::key::KeySet;
use gcloud_spanner::row::TryFromValue;
use gcloud_spanner::statement::{Statement, ToKind};
use prost_types::value::Kind;
use tracing::info;

use super::config::SpannerSinkConfig;
use crate::error::{Error, ErrorKind, Result};

/// What the sink's principal needs, for the hints.
pub const ROLES_HINT: &str = "grant the sink's principal roles/spanner.databaseUser on the database (reads, \
     writes, DDL of the tables it creates), or roles/spanner.databaseAdmin to let it change tables made by hand";

/// A protobuf value as it is: written into keys and mutations, and read
/// back from rows without knowing the column's type.
#[derive(Debug, Clone, PartialEq)]
pub struct Raw(pub Kind);

impl ToKind for Raw {
    fn to_kind(&self) -> Kind {
        self.0.clone()
    }
    // Used only for query parameters, which the sink never binds raw.
    fn get_type() -> Type {
        Type {
            code: TypeCode::String as i32,
            ..Default::default()
        }
    }
}

impl TryFromValue for Raw {
    fn try_from(value: &prost_types::Value, _field: &Field) -> std::result::Result<Self, gcloud_spanner::row::Error> {
        Ok(Raw(value.kind.clone().unwrap_or(Kind::NullValue(0))))
    }
}

/// The data and admin clients of one database, made on first use.
pub(super) struct SpClient {
    config: SpannerSinkConfig,
    clients: Option<(Client, AdminClient)>,
}

impl SpClient {
    pub(super) fn new(config: &SpannerSinkConfig) -> Self {
        Self { config: config.clone(), clients: None }
    }

    pub(super) fn is_built(&self) -> bool {
        self.clients.is_some()
    }

    /// Drops the clients (their sessions expire on the server).
    pub(super) fn reset(&mut self) {
        self.clients = None;
    }

    /// The data client, built if it is not.
    pub(super) async fn data(&mut self) -> Result<&Client> {
        self.build().await?;
        self.clients
            .as_ref()
            .map(|(c, _)| c)
            .ok_or_else(|| Error::retryable("the Spanner client is not built"))
    }

    async fn build(&mut self) -> Result<()> {
        if self.clients.is_some() {
            return Ok(());
        }
        let timeout = Duration::from_millis(self.config.request_timeout_ms);
        let mut data = ClientConfig::default();
        data.channel_config.timeout = timeout;
        data.channel_config.connect_timeout = timeout;
        // One runner applies one batch at a time: a few sessions suffice.
        data.channel_config.num_channels = 1;
        data.session_config.min_opened = 1;
        data.session_config.max_opened = 10;
        let mut admin = AdminClientConfig {
            timeout,
            connect_timeout: timeout,
            ..AdminClientConfig::default()
        };
        let auth = |e: gcloud_spanner::admin::google_cloud_auth::error::Error| {
            Error::needs_operator(format!("cannot load Google credentials: {e}")).with_hint(
                "set spanner.key_file to a service-account key file, or provide application default credentials \
                 (GOOGLE_APPLICATION_CREDENTIALS, gcloud auth application-default login, or the metadata server)",
            )
        };
        if let Some(host) = &self.config.emulator_host {
            data.environment = Environment::Emulator(host.clone());
            admin.environment = Environment::Emulator(host.clone());
        } else if let Some(path) = &self.config.key_file {
            let file = || async {
                gcloud_spanner::admin::google_cloud_auth::credentials::CredentialsFile::new_from_file(path.clone())
                    .await
                    .map_err(auth)
            };
            data = data.with_credentials(file().await?).await.map_err(auth)?;
            admin = admin.with_credentials(file().await?).await.map_err(auth)?;
        } else {
            data = data.with_auth().await.map_err(auth)?;
            admin = admin.with_auth().await.map_err(auth)?;
        }
        let database = self.config.database_path();
        let client = tokio::time::timeout(timeout, Client::new(database.clone(), data))
            .await
            .map_err(|_| Error::retryable(format!("connecting to Spanner database {database} timed out")))?
            .map_err(classify_client)?;
        let admin = AdminClient::new(admin)
            .await
            .map_err(|e| Error::retryable(format!("Spanner admin client: {e}")))?;
        info!(database = %database, emulator = self.config.emulator_host.is_some(), "Spanner client ready");
        self.clients = Some((client, admin));
        Ok(())
    }

    /// Runs `statements` as one schema change and waits for it (DDL is a
    /// long-running operation; every statement the sink makes is
    /// idempotent, so one interrupted by a crash is simply made again).
    pub(super) async fn ddl(&mut self, statements: Vec<String>) -> Result<()> {
        if statements.is_empty() {
            return Ok(());
        }
        self.build().await?;
        let database = self.config.database_path();
        let (_, admin) = self
            .clients
            .as_ref()
            .ok_or_else(|| Error::retryable("the Spanner client is not built"))?;
        let request = UpdateDatabaseDdlRequest { database, statements, ..Default::default() };
        let mut operation = admin.database().update_database_ddl(request, None).await.map_err(classify)?;
        operation.wait(None).await.map_err(classify)?;
        Ok(())
    }

    /// Runs a read-only query in a single-use transaction and returns every
    /// row's cells.
    pub(super) async fn query(&mut self, sql: &str) -> Result<Vec<Vec<Raw>>> {
        let client = self.data().await?;
        let mut tx = client.single().await.map_err(classify_client)?;
        let rows = tx.query(Statement::new(sql)).await.map_err(classify)?;
        all_rows(rows).await.map_err(|e| e.either(classify))
    }

    /// Reads `columns` of the rows of `table` under `keys` in a single-use
    /// read-only transaction (a strong read: every committed row) and
    /// returns every row's cells.
    pub(super) async fn read(&mut self, table: &str, columns: &[&str], keys: KeySet) -> Result<Vec<Vec<Raw>>> {
        let client = self.data().await?;
        let mut tx = client.single().await.map_err(classify_client)?;
        let rows = tx.read(table, columns, keys).await.map_err(classify)?;
        all_rows(rows).await.map_err(|e| e.either(classify))
    }

    /// Runs a partitioned DML statement (outside any batch).
    pub(super) async fn partitioned_update(&mut self, sql: &str) -> Result<i64> {
        let client = self.data().await?;
        client.partitioned_update(Statement::new(sql)).await.map_err(classify_client)
    }
}

/// Text of a cell (`None` for NULL or a non-text value).
pub fn cell_text(raw: &Raw) -> Option<&str> {
    match &raw.0 {
        Kind::StringValue(s) => Some(s),
        _ => None,
    }
}

/// A gRPC status as an error of its kind.
pub fn classify(status: Status) -> Error {
    let code = status.code();
    let kind = match code {
        Code::Aborted
        | Code::ResourceExhausted
        | Code::Unavailable
        | Code::DeadlineExceeded
        | Code::Internal
        | Code::Unknown
        | Code::Cancelled => ErrorKind::Retryable,
        Code::PermissionDenied | Code::Unauthenticated | Code::NotFound => ErrorKind::NeedsOperator,
        _ => ErrorKind::Permanent,
    };
    let mut error = Error::new(kind, format!("Spanner: {:?}: {}", code, redact(status.message())))
        .with_class(format!("spanner.{code:?}"));
    if matches!(code, Code::PermissionDenied | Code::Unauthenticated) {
        error = error.with_hint(ROLES_HINT);
    } else if code == Code::NotFound {
        error = error.with_hint("create the Spanner instance and database named in [spanner], or fix their ids");
    }
    error
}

/// An error of the client library as an error of its kind.
pub fn classify_client(e: gcloud_spanner::client::Error) -> Error {
    use gcloud_spanner::client::Error as E;
    match e {
        E::GRPC(status) => classify(status),
        E::InvalidConfig(m) => Error::needs_operator(format!("Spanner client configuration: {m}")),
        other => Error::retryable(format!("Spanner: {other}")),
    }
}

/// Whether an error is Spanner's ABORTED (retry the whole transaction).
pub fn is_aborted(e: &Error) -> bool {
    e.class() == "spanner.Aborted"
}

/// A Spanner message without what may quote a row (keys appear in
/// brackets: `Row [7] in table t already exists`; values in quotes).
pub fn redact(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut depth = 0usize;
    let mut quoted = false;
    for c in message.chars() {
        match c {
            '[' if !quoted => {
                depth += 1;
                if depth == 1 {
                    out.push_str("[…]");
                }
            }
            ']' if !quoted && depth > 0 => depth -= 1,
            '"' if depth == 0 => {
                quoted = !quoted;
                if quoted {
                    out.push_str("\"…\"");
                }
            }
            c if depth == 0 && !quoted => out.push(c),
            _ => {}
        }
    }
    out.chars().take(500).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_map_to_kinds() {
        assert_eq!(classify(Status::new(Code::Aborted, "x")).kind(), ErrorKind::Retryable);
        assert!(is_aborted(&classify(Status::new(Code::Aborted, "x"))));
        assert_eq!(classify(Status::new(Code::ResourceExhausted, "x")).kind(), ErrorKind::Retryable);
        assert_eq!(classify(Status::new(Code::PermissionDenied, "x")).kind(), ErrorKind::NeedsOperator);
        assert_eq!(classify(Status::new(Code::Unauthenticated, "x")).kind(), ErrorKind::NeedsOperator);
        assert_eq!(classify(Status::new(Code::InvalidArgument, "x")).kind(), ErrorKind::Permanent);
        assert_eq!(classify(Status::new(Code::FailedPrecondition, "x")).kind(), ErrorKind::Permanent);
    }

    #[test]
    fn messages_lose_values() {
        assert_eq!(redact("Row [7, \"a\"] in table t already exists"), "Row […] in table t already exists");
        assert_eq!(redact("bad value \"secret\" here"), "bad value \"…\" here");
    }
}

/// Why [`all_rows`] stopped: Spanner's error, or a cell it cannot read.
#[derive(Debug)]
pub(super) enum RowsError {
    /// Spanner's.
    Spanner(Status),
    /// A cell that cannot be read.
    Cell(Error),
}

impl RowsError {
    /// The error, Spanner's classified by `classify`.
    pub(super) fn either<E: From<Error>>(self, classify: impl FnOnce(Status) -> E) -> E {
        match self {
            RowsError::Spanner(s) => classify(s),
            RowsError::Cell(e) => E::from(e),
        }
    }
}

/// Every row of a query's answer, each as its cells.
pub(super) async fn all_rows<T: gcloud_spanner::reader::Reader>(
    mut rows: gcloud_spanner::reader::RowIterator<'_, T>,
) -> std::result::Result<Vec<Vec<Raw>>, RowsError> {
    let mut out = Vec::new();
    while let Some(row) = rows.next().await.map_err(RowsError::Spanner)? {
        // Known once the first rows arrived.
        let width = rows.columns_metadata().len();
        let cells = (0..width)
            .map(|i| row.column::<Raw>(i))
            .collect::<std::result::Result<Vec<_>, _>>();
        out.push(cells.map_err(|e| RowsError::Cell(Error::retryable(format!("unreadable row: {e}"))))?);
    }
    Ok(out)
}

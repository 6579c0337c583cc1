//! The BigQuery sink: keeps a copy of each source table in BigQuery, with
//! exactly-once effect.
//!
//! # How a batch is applied
//!
//! 1. The destination table is created or evolved for every schema version in
//!    the batch (`CREATE TABLE` with the key declared `NOT ENFORCED` and
//!    clustered on it; `ADD COLUMN`, `DROP NOT NULL`, `SET DATA TYPE` to
//!    widen). DDL cannot run inside a BigQuery transaction, so it runs first;
//!    every statement is idempotent (`IF NOT EXISTS`, relaxing twice is a
//!    no-op), so a crash after it and a replay are harmless.
//! 2. The batch is reduced to the last event per key.
//! 3. The survivors are streamed (`tabledata.insertAll`) into the staging
//!    table of the destination table's column set (in the bookkeeping
//!    dataset, reused across batches), tagged with the attempt's batch id.
//! 4. One script: `BEGIN TRANSACTION`; a truncate's guarded `DELETE`; **one
//!    `MERGE`** per destination table that inserts, updates and deletes,
//!    guarded by the row's stored source position so that a replay never
//!    moves a row backwards; a `MERGE` of the batch's Kafka offsets into the
//!    offsets table; `COMMIT TRANSACTION`. Rows and offsets become visible
//!    together or not at all.
//! 5. The attempt's staged rows are deleted where BigQuery allows it (not
//!    while they are in the streaming buffer: partition expiry takes them).
//!
//! # Errors
//!
//! [`classify`] and [`classify_proto`] map BigQuery's HTTP status and error
//! reasons to an [`ErrorKind`]; nothing else decides. A response body that
//! carries `errors` is an error whatever its HTTP status (bqemulator answers
//! failed queries with 200). A row that `insertAll` refuses is a permanent
//! error of that record, with BigQuery's reason. BigQuery's messages can
//! quote the value they refused, so they are cut before the value.

use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use gcp_bigquery_client::client_builder::ClientBuilder;
use gcp_bigquery_client::error::BQError;
use gcp_bigquery_client::model::error_proto::ErrorProto;
use gcp_bigquery_client::model::get_query_results_parameters::GetQueryResultsParameters;
use gcp_bigquery_client::model::query_request::QueryRequest;
use gcp_bigquery_client::model::query_response::{QueryResponse, ResultSet};
use gcp_bigquery_client::model::table_data_insert_all_request::TableDataInsertAllRequest;
use gcp_bigquery_client::Client;
use serde_json::{Map, Value as Json};
use tracing::{debug, info, info_span, Instrument};
use tributary_operations::config::{ConfigError, Validate};
use tributary_schemas::{ChangeEvent, Op, Position, TableId, TableSchema, Value};

use super::config::{BigQuerySinkConfig, DestinationTable};
use super::types::{bigquery_type, fit, from_metadata, to_json, BqType, Fit};
use crate::error::{Error, ErrorKind, Result};
use crate::sink::{
    group_by_destination, locate_failed_record, segments, ApplyError, KafkaPosition, PrefixProbe, Segment, Sink,
    SinkBatch, SinkRecord,
};

/// The offsets table in the bookkeeping dataset (see `docs/CONTRACTS.md`).
pub const OFFSETS_TABLE: &str = "offsets";
/// Column holding `Position::commit` of the event that last wrote a row.
pub const COMMIT_COLUMN: &str = "__tributary_commit";
/// Column holding `Position::index` of the event that last wrote a row.
pub const INDEX_COLUMN: &str = "__tributary_index";
/// Staging column telling a delete from an upsert.
const DELETE_COLUMN: &str = "__tributary_delete";
/// Staging column naming the attempt that staged a row: the MERGE reads
/// only its own attempt's rows.
const BATCH_COLUMN: &str = "__tributary_batch";
/// Prefix of staging table names.
const STAGING_PREFIX: &str = "stage_";
/// How long a job may run before the sink stops waiting for it and retries
/// (the retry is harmless: the script is one transaction).
const JOB_DEADLINE: Duration = Duration::from_secs(600);
/// BigQuery clusters on at most four columns.
const MAX_CLUSTER_COLUMNS: usize = 4;

/// Sends no credentials: for an emulator.
#[derive(Clone)]
struct EmulatorAuth;

#[async_trait]
impl gcp_bigquery_client::auth::Authenticator for EmulatorAuth {
    async fn access_token(&self) -> std::result::Result<String, BQError> {
        Ok("emulator".to_string())
    }
}

/// What the sink knows about one destination table.
#[derive(Debug, Clone, Default)]
struct TableState {
    exists: bool,
    columns: Vec<DestColumn>,
    /// Fingerprints of the source schemas already reconciled with it.
    reconciled: HashSet<u64>,
}

#[derive(Debug, Clone)]
struct DestColumn {
    name: String,
    ty: BqType,
    nullable: bool,
}

/// The BigQuery [`Sink`].
pub struct BigQuerySink {
    config: BigQuerySinkConfig,
    consumer_group: String,
    client: Option<Client>,
    bookkeeping_ready: bool,
    tables: HashMap<DestinationTable, TableState>,
    /// Staging tables known to exist.
    stages: HashSet<String>,
    merges: u64,
}

impl std::fmt::Debug for BigQuerySink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BigQuerySink")
            .field("config", &self.config)
            .field("connected", &self.client.is_some())
            .finish()
    }
}

/// Context of an error: the destination table it is about.
#[derive(Debug, Clone, Default)]
struct Ctx {
    table: Option<String>,
}

impl Ctx {
    fn table(t: impl ToString) -> Self {
        Self { table: Some(t.to_string()) }
    }
}

impl BigQuerySink {
    /// A sink for `config`; it connects on first use, so that a destination
    /// that cannot be reached pauses the runner instead of failing its start.
    pub fn new(config: BigQuerySinkConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        let consumer_group = config
            .consumer_group
            .clone()
            .ok_or_else(|| ConfigError::invalid("bigquery.consumer_group", "is required"))?;
        Ok(Self {
            config,
            consumer_group,
            client: None,
            bookkeeping_ready: false,
            tables: HashMap::new(),
            stages: HashSet::new(),
            merges: 0,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &BigQuerySinkConfig {
        &self.config
    }

    /// The destination table of a source table.
    pub fn destination(&self, source: &TableId) -> DestinationTable {
        self.config.destination(source)
    }

    /// `MERGE` statements run so far (a cost proxy: each one scans the
    /// destination table's clustered blocks that the keys touch).
    pub fn merges(&self) -> u64 {
        self.merges
    }

    fn timeout(&self) -> Duration {
        Duration::from_millis(self.config.request_timeout_ms)
    }

    fn offsets_table(&self) -> String {
        format!("`{}.{}.{OFFSETS_TABLE}`", self.config.project, self.config.bookkeeping_dataset)
    }

    /// Builds the API client (credentials are read here).
    async fn build_client(&self) -> Result<Client> {
        let mut builder = ClientBuilder::new();
        let built = if let Some(url) = &self.config.emulator_url {
            builder.with_v2_base_url(format!("{}/bigquery/v2", url.trim_end_matches('/')));
            builder.build_from_authenticator(Arc::new(EmulatorAuth)).await
        } else if let Some(key) = &self.config.key_file {
            builder.build_from_service_account_key_file(key).await
        } else {
            builder.build_from_application_default_credentials().await
        };
        built.map_err(|e| {
            let err = classify(&e, &Ctx::default());
            if self.config.emulator_url.is_none() {
                err.with_hint(match &self.config.key_file {
                    Some(k) => format!("check that {k} is a readable service-account key file (JSON)"),
                    None => "set bigquery.key_file, or GOOGLE_APPLICATION_CREDENTIALS, or run `gcloud auth application-default login`".into(),
                })
            } else {
                err
            }
        })
    }

    fn api(&self) -> Result<&Client> {
        self.client
            .as_ref()
            .ok_or_else(|| Error::retryable("not connected to BigQuery"))
    }

    /// Builds the client (if not built) and makes sure the bookkeeping
    /// dataset and offsets table exist.
    pub async fn connect(&mut self) -> Result<()> {
        if self.client.is_none() {
            let client = self.build_client().await?;
            self.client = Some(client);
            info!(project = %self.config.project, emulator = self.config.emulator_url.is_some(), "BigQuery client ready");
        }
        if !self.bookkeeping_ready {
            let ctx = Ctx::table(format!("{}.{OFFSETS_TABLE}", self.config.bookkeeping_dataset));
            self.ensure_dataset(&self.config.bookkeeping_dataset.clone()).await?;
            let sql = format!(
                "CREATE TABLE IF NOT EXISTS {} (consumer_group STRING NOT NULL, topic STRING NOT NULL, \
                 `partition` INT64 NOT NULL, next_offset INT64 NOT NULL)",
                self.offsets_table()
            );
            self.query(&sql, &ctx).await.map_err(|e| {
                if e.kind() == ErrorKind::NeedsOperator {
                    e.with_hint("grant the sink's principal roles/bigquery.dataEditor on the bookkeeping dataset and roles/bigquery.jobUser on the project")
                } else {
                    e
                }
            })?;
            self.bookkeeping_ready = true;
        }
        Ok(())
    }

    async fn ensure_dataset(&self, dataset: &str) -> Result<()> {
        let location = self
            .config
            .location
            .as_deref()
            .map(|l| format!(" OPTIONS (location = {})", quote_string(l)))
            .unwrap_or_default();
        let sql = format!("CREATE SCHEMA IF NOT EXISTS `{}.{dataset}`{location}", self.config.project);
        self.query(&sql, &Ctx::table(dataset)).await.map(|_| ())
    }

    /// Forgets the client and everything cached.
    fn reset(&mut self) {
        self.client = None;
        self.bookkeeping_ready = false;
        self.tables.clear();
        self.stages.clear();
    }

    /// Runs one query (or script) and waits for it; a body carrying
    /// `errors` is an error whatever the HTTP status.
    async fn query(&self, sql: &str, ctx: &Ctx) -> Result<QueryResponse> {
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

    /// Removes this copy from BigQuery: its stored offsets and, when `drop`
    /// lists them, the destination tables of those source tables.
    pub async fn delete_copy(&mut self, drop: &[TableId]) -> Result<Vec<String>> {
        self.connect().await?;
        let ctx = Ctx::table(format!("{}.{OFFSETS_TABLE}", self.config.bookkeeping_dataset));
        let sql = format!(
            "DELETE FROM {} WHERE consumer_group = {}",
            self.offsets_table(),
            quote_string(&self.consumer_group)
        );
        self.query(&sql, &ctx).await?;
        let mut done = vec![format!("stored offsets of consumer group {}", self.consumer_group)];
        for source in drop {
            let dest = self.destination(source);
            self.query(&format!("DROP TABLE IF EXISTS {}", dest.quoted()), &Ctx::table(&dest))
                .await?;
            done.push(format!("destination table {dest}"));
        }
        self.tables.clear();
        Ok(done)
    }

    /// Applies `batch` and rolls the transaction back: tells whether (and at
    /// which record) it would fail. Schema changes it needs are made (they
    /// are additive and would be made by the real apply anyway).
    pub async fn trial_apply(&mut self, batch: &SinkBatch) -> Result<(), ApplyError> {
        self.apply_inner(batch, false).await
    }

    async fn apply_inner(&mut self, batch: &SinkBatch, commit: bool) -> Result<(), ApplyError> {
        self.connect().await.map_err(|e| self.failed(e))?;
        match self.attempt(&batch.records, &batch.next_offsets, commit).await {
            Ok(()) => Ok(()),
            Err(f) if f.error.kind() == ErrorKind::Permanent && f.record.is_none() && !batch.records.is_empty() => {
                self.locate(&batch.records, f.error).await
            }
            Err(mut f) => {
                if f.error.kind() != ErrorKind::Permanent {
                    f.error = self.failed(f.error);
                }
                Err(f)
            }
        }
    }

    /// Forgets cached state after an error that is not about the data: the
    /// retry starts from BigQuery's own view (a table may have been dropped
    /// or changed by someone else).
    fn failed(&mut self, err: Error) -> Error {
        if err.kind() != ErrorKind::Permanent {
            self.tables.clear();
            self.stages.clear();
            if err.kind() == ErrorKind::NeedsOperator {
                self.reset();
            }
        }
        err
    }

    /// One attempt: stage, then one transaction (committed or rolled back),
    /// then drop the staging tables whatever happened.
    async fn attempt(
        &mut self,
        records: &[(KafkaPosition, SinkRecord)],
        offsets: &[(String, i32, i64)],
        commit: bool,
    ) -> Result<(), ApplyError> {
        let batch_id = uuid::Uuid::new_v4().simple().to_string();
        let mut staged: Vec<String> = Vec::new();
        let result = self.attempt_inner(records, offsets, commit, &batch_id, &mut staged).await;
        for stage in staged {
            let sql = format!(
                "DELETE FROM {} WHERE {} = {}",
                self.staging_table(&stage),
                quote_ident(BATCH_COLUMN),
                quote_string(&batch_id)
            );
            if let Err(e) = self.query(&sql, &Ctx::table(&stage)).await {
                // BigQuery refuses DML on rows still in the streaming
                // buffer; they are never read again (the MERGE filters on
                // its own batch id) and go with the partition expiry.
                debug!(staging = %stage, error = %e, "staged rows left in place");
            }
        }
        result
    }

    async fn attempt_inner(
        &mut self,
        records: &[(KafkaPosition, SinkRecord)],
        offsets: &[(String, i32, i64)],
        commit: bool,
        batch_id: &str,
        staged: &mut Vec<String>,
    ) -> Result<(), ApplyError> {
        let mut script: Vec<String> = Vec::new();
        for segment in segments(records) {
            match segment {
                Segment::Dropped(id) => {
                    // DDL cannot run inside a transaction: what came before
                    // the drop is committed first (without offsets: a replay
                    // of it is harmless, guarded by position).
                    if commit {
                        self.transaction(&script, &[], true).await?;
                    }
                    script.clear();
                    let dest = self.destination(id);
                    if self.config.drop_tables && commit {
                        self.query(&format!("DROP TABLE IF EXISTS {}", dest.quoted()), &Ctx::table(&dest))
                            .await?;
                        self.tables.remove(&dest);
                        info!(table = %dest, "dropped destination table (the source table was dropped)");
                    } else if !self.config.drop_tables {
                        debug!(table = %dest, "source table dropped; kept (drop_tables = false)");
                    }
                }
                Segment::Changes { start, records: run } => {
                    self.prepare_segment(run, start, &mut script, batch_id, staged).await?;
                }
            }
        }
        self.transaction(&script, offsets, commit).await
    }

    /// Runs `statements` and the offsets `MERGE` as one transaction.
    async fn transaction(
        &mut self,
        statements: &[String],
        offsets: &[(String, i32, i64)],
        commit: bool,
    ) -> Result<(), ApplyError> {
        if statements.is_empty() && offsets.is_empty() {
            return Ok(());
        }
        let mut sql = String::from("BEGIN TRANSACTION;\n");
        for s in statements {
            sql.push_str(s);
            sql.push_str(";\n");
        }
        if !offsets.is_empty() {
            sql.push_str(&self.offsets_merge(offsets));
            sql.push_str(";\n");
        }
        sql.push_str(if commit {
            "COMMIT TRANSACTION;"
        } else {
            "ROLLBACK TRANSACTION;"
        });
        let merges = statements.iter().filter(|s| s.starts_with("MERGE")).count() as u64;
        self.query(&sql, &Ctx::default()).await?;
        if commit {
            self.merges += merges;
        }
        Ok(())
    }

    fn offsets_merge(&self, offsets: &[(String, i32, i64)]) -> String {
        let rows = offsets
            .iter()
            .map(|(topic, partition, next)| {
                format!(
                    "SELECT {} AS consumer_group, {} AS topic, {partition} AS `partition`, {next} AS next_offset",
                    quote_string(&self.consumer_group),
                    quote_string(topic)
                )
            })
            .collect::<Vec<_>>()
            .join(" UNION ALL ");
        format!(
            "MERGE {t} AS o USING ({rows}) AS s \
             ON o.consumer_group = s.consumer_group AND o.topic = s.topic AND o.`partition` = s.`partition` \
             WHEN MATCHED THEN UPDATE SET next_offset = s.next_offset \
             WHEN NOT MATCHED THEN INSERT (consumer_group, topic, `partition`, next_offset) \
             VALUES (s.consumer_group, s.topic, s.`partition`, s.next_offset)",
            t = self.offsets_table()
        )
    }

    /// A run of change records with no table drop in between: per
    /// destination table, reconcile, stage and add its `MERGE` to `script`.
    async fn prepare_segment(
        &mut self,
        records: &[(KafkaPosition, SinkRecord)],
        base: usize,
        script: &mut Vec<String>,
        batch_id: &str,
        staged: &mut Vec<String>,
    ) -> Result<(), ApplyError> {
        let groups = group_by_destination(records, base, |t| self.config.destination(t));
        for (dest, events) in groups {
            let span = info_span!("bigquery_table", table = %dest, events = events.len());
            self.prepare_table(&dest, &events, script, batch_id, staged)
                .instrument(span)
                .await?;
        }
        Ok(())
    }

    async fn prepare_table(
        &mut self,
        dest: &DestinationTable,
        events: &[(usize, &ChangeEvent)],
        script: &mut Vec<String>,
        batch_id: &str,
        staged: &mut Vec<String>,
    ) -> Result<(), ApplyError> {
        // 1. Create or evolve the table for every schema version.
        let mut seen: Vec<usize> = Vec::new();
        for &(i, ev) in events {
            let ptr = Arc::as_ptr(&ev.schema) as usize;
            if seen.contains(&ptr) {
                continue;
            }
            seen.push(ptr);
            self.reconcile(dest, &ev.schema)
                .await
                .map_err(|error| ApplyError { error, record: Some(i) })?;
        }
        // 2. The newest truncate removes every older row.
        let truncate = events
            .iter()
            .filter(|(_, ev)| ev.op == Op::Truncate)
            .map(|(_, ev)| ev.source.position)
            .max();
        if let Some(at) = truncate {
            let (c, i) = position_sql(at).map_err(ApplyError::from)?;
            script.push(format!("DELETE FROM {t} WHERE {older}", t = dest.quoted(), older = older_than("", c, i)));
        }
        // 3. Last event per key.
        let state = self
            .tables
            .get(dest)
            .ok_or_else(|| Error::retryable(format!("table {dest} vanished from the cache")))?;
        let mut reduced = Reduced::default();
        for &(i, ev) in events {
            if ev.op == Op::Truncate || truncate.is_some_and(|t| ev.source.position <= t) {
                continue;
            }
            reduced.add(i, ev, state).map_err(|error| ApplyError {
                error: error.with_table(ev.schema.id.clone()),
                record: Some(i),
            })?;
        }
        if reduced.rows.is_empty() {
            return Ok(());
        }
        // 4. Stage and merge.
        let columns = reduced.columns(state);
        let key = events.first().map(|(_, ev)| ev.schema.key.clone()).unwrap_or_default();
        let stage = staging_name(dest, &columns);
        if !self.stages.contains(&stage) {
            self.create_staging(&stage, &columns).await?;
            self.stages.insert(stage.clone());
        }
        staged.push(stage.clone());
        self.insert_staging(dest, &stage, &reduced, batch_id).await?;
        let source = format!(
            "(SELECT * FROM {} WHERE {} = {})",
            self.staging_table(&stage),
            quote_ident(BATCH_COLUMN),
            quote_string(batch_id)
        );
        script.push(merge_sql(dest, &source, &columns, &key));
        debug!(table = %dest, rows = reduced.rows.len(), "staged");
        Ok(())
    }

    fn staging_table(&self, stage: &str) -> String {
        format!("`{}.{}.{stage}`", self.config.project, self.config.bookkeeping_dataset)
    }

    /// Creates a long-lived staging table (if missing). Long-lived because
    /// BigQuery may refuse or delay streaming into a table created moments
    /// before; partitioned by ingestion day and expiring partitions after a
    /// day, because staged rows still in the streaming buffer cannot be
    /// deleted.
    async fn create_staging(&self, stage: &str, columns: &[DestColumn]) -> Result<()> {
        let mut defs: Vec<String> = columns.iter().map(|c| format!("{} {}", quote_ident(&c.name), c.ty)).collect();
        defs.push(format!("{} BOOL", quote_ident(DELETE_COLUMN)));
        defs.push(format!("{} INT64", quote_ident(COMMIT_COLUMN)));
        defs.push(format!("{} INT64", quote_ident(INDEX_COLUMN)));
        defs.push(format!("{} STRING", quote_ident(BATCH_COLUMN)));
        let partitioning = if self.config.emulator_url.is_some() {
            // bqemulator has no ingestion-time partitions; it can delete
            // staged rows right away instead.
            String::new()
        } else {
            " PARTITION BY _PARTITIONDATE OPTIONS (partition_expiration_days = 1)".to_string()
        };
        let sql =
            format!("CREATE TABLE IF NOT EXISTS {} ({}){partitioning}", self.staging_table(stage), defs.join(", "));
        self.query(&sql, &Ctx::table(stage)).await.map(|_| ())
    }

    /// Streams the reduced rows into the staging table. A refused row is a
    /// permanent error of its record, with BigQuery's reason.
    async fn insert_staging(
        &self,
        dest: &DestinationTable,
        stage: &str,
        reduced: &Reduced,
        batch_id: &str,
    ) -> Result<(), ApplyError> {
        let api = self.api()?;
        let ctx = Ctx::table(dest);
        for (chunk_no, chunk) in reduced.rows.chunks(self.config.insert_chunk_rows).enumerate() {
            let mut request = TableDataInsertAllRequest::new();
            // Insert the valid rows and report the others one by one
            // (without it bqemulator fails the whole request with a 500).
            request.skip_invalid_rows();
            for row in chunk {
                let mut json = row.json.clone();
                json.insert(BATCH_COLUMN.into(), Json::String(batch_id.to_string()));
                request
                    .add_row(None, &json)
                    .map_err(|e| Error::permanent(format!("cannot serialise a staging row: {e}")))?;
            }
            let response = tokio::time::timeout(
                self.timeout(),
                api.tabledata()
                    .insert_all(&self.config.project, &self.config.bookkeeping_dataset, stage, request),
            )
            .await
            .map_err(|_| timed_out(&ctx))?
            .map_err(|e| classify(&e, &ctx))?;
            let refused = response.insert_errors.unwrap_or_default();
            // BigQuery marks the rows it did not insert only because another
            // row failed as `stopped`; the culprit has another reason.
            let culprit = refused.iter().find_map(|e| {
                let errors = e.errors.as_deref().unwrap_or_default();
                let real = errors.iter().find(|p| p.reason.as_deref() != Some("stopped"))?;
                Some((e.index.unwrap_or(0), real.clone()))
            });
            if let Some((index, proto)) = culprit {
                let at = chunk_no * self.config.insert_chunk_rows + usize::try_from(index).unwrap_or(0);
                let row = reduced.rows.get(at).ok_or_else(|| {
                    Error::retryable(format!("BigQuery refused row {at} of a staging request of {} rows", chunk.len()))
                })?;
                let reason = proto.reason.clone().unwrap_or_else(|| "invalid".into());
                let mut error = Error::permanent(format!(
                    "BigQuery refused the row: {reason}: {}",
                    redact(proto.message.as_deref().unwrap_or(""))
                ))
                .with_class(format!("bigquery.{reason}"))
                .with_table(row.table.clone());
                if let Some(column) = proto.location.as_deref().filter(|l| !l.is_empty()) {
                    error = error.with_column(column.to_string());
                }
                return Err(ApplyError { error, record: Some(row.record) });
            }
        }
        Ok(())
    }

    /// Finds the first record that fails with a permanent error by
    /// bisecting on prefixes, each tried in a transaction that is rolled
    /// back.
    async fn locate(&mut self, records: &[(KafkaPosition, SinkRecord)], original: Error) -> Result<(), ApplyError> {
        let span = info_span!("locate_failed_record", records = records.len());
        locate_failed_record(&mut Prefixes { sink: self, records }, records.len(), original)
            .instrument(span)
            .await
    }

    /// Reads a table's columns from `tables.get` (free, unlike
    /// INFORMATION_SCHEMA).
    async fn load_table(&mut self, dest: &DestinationTable) -> Result<()> {
        let ctx = Ctx::table(dest);
        let api = self.api()?;
        let got =
            tokio::time::timeout(self.timeout(), api.table().get(&dest.project, &dest.dataset, &dest.table, None))
                .await
                .map_err(|_| timed_out(&ctx))?;
        let mut state = TableState::default();
        match got {
            Ok(table) => {
                state.exists = true;
                for f in table.schema.fields.unwrap_or_default() {
                    let type_name = serde_json::to_value(&f.r#type)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_string))
                        .unwrap_or_default();
                    let mode = f.mode.as_deref().unwrap_or("NULLABLE");
                    let ty = from_metadata(&type_name, None, None, mode == "REPEATED").ok_or_else(|| {
                        Error::needs_operator(format!(
                            "column {} has type {type_name}, which the sink does not write",
                            f.name
                        ))
                        .with_column(f.name.clone())
                    })?;
                    state
                        .columns
                        .push(DestColumn { name: f.name, ty, nullable: mode != "REQUIRED" });
                }
            }
            Err(BQError::ResponseError { error }) if error.error.code == 404 => {}
            Err(e) => return Err(classify(&e, &ctx)),
        }
        self.tables.insert(dest.clone(), state);
        Ok(())
    }

    /// Makes the destination table fit `schema`: creates it, adds columns,
    /// widens types, relaxes REQUIRED columns.
    async fn reconcile(&mut self, dest: &DestinationTable, schema: &TableSchema) -> Result<()> {
        let fingerprint = {
            let mut h = DefaultHasher::new();
            schema.hash(&mut h);
            h.finish()
        };
        if !self.tables.contains_key(dest) {
            self.load_table(dest).await?;
        }
        if self.tables.get(dest).is_some_and(|s| s.reconciled.contains(&fingerprint)) {
            return Ok(());
        }
        let ctx = Ctx::table(dest);
        let state = self.tables.get(dest).cloned().unwrap_or_default();
        let mut next = state.clone();
        let mut ddl: Vec<String> = Vec::new();
        if !state.exists {
            self.ensure_dataset(&dest.dataset).await?;
            let mut defs = Vec::new();
            for c in &schema.columns {
                let ty = bigquery_type(&c.data_type);
                // A REPEATED column cannot be REQUIRED.
                let required = !c.nullable && !matches!(ty, BqType::Array(_));
                defs.push(format!("{} {ty}{}", quote_ident(&c.name), if required { " NOT NULL" } else { "" }));
                next.columns.push(DestColumn { name: c.name.clone(), ty, nullable: !required });
            }
            defs.push(format!("{} INT64 NOT NULL", quote_ident(COMMIT_COLUMN)));
            defs.push(format!("{} INT64 NOT NULL", quote_ident(INDEX_COLUMN)));
            let keys: Vec<String> = schema.key.iter().map(|k| quote_ident(k)).collect();
            if self.config.declare_primary_key && !keys.is_empty() {
                defs.push(format!("PRIMARY KEY ({}) NOT ENFORCED", keys.join(", ")));
            }
            let cluster: Vec<String> = schema
                .key
                .iter()
                .filter(|k| {
                    schema
                        .columns
                        .iter()
                        .find(|c| &c.name == *k)
                        .is_some_and(|c| clusterable(&bigquery_type(&c.data_type)))
                })
                .take(MAX_CLUSTER_COLUMNS)
                .map(|k| quote_ident(k))
                .collect();
            let cluster = if cluster.is_empty() {
                String::new()
            } else {
                format!(" CLUSTER BY {}", cluster.join(", "))
            };
            ddl.push(format!("CREATE TABLE IF NOT EXISTS {} ({}){cluster}", dest.quoted(), defs.join(", ")));
            next.exists = true;
        } else {
            for c in &schema.columns {
                let want = bigquery_type(&c.data_type);
                match state.columns.iter().find(|d| d.name == c.name) {
                    None => {
                        // BigQuery adds columns as NULLABLE only.
                        ddl.push(format!(
                            "ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} {want}",
                            dest.quoted(),
                            quote_ident(&c.name)
                        ));
                        next.columns.push(DestColumn { name: c.name.clone(), ty: want, nullable: true });
                    }
                    Some(d) => {
                        match fit(&d.ty, &want) {
                            Fit::Fits => {}
                            Fit::Widen(to) => {
                                ddl.push(format!(
                                    "ALTER TABLE {} ALTER COLUMN {} SET DATA TYPE {to}",
                                    dest.quoted(),
                                    quote_ident(&c.name)
                                ));
                                if let Some(n) = next.columns.iter_mut().find(|n| n.name == c.name) {
                                    n.ty = to;
                                }
                            }
                            Fit::Incompatible => {
                                return Err(Error::permanent(format!(
                                    "the source column is now {} ({}), which BigQuery cannot convert the destination column of type {} to",
                                    c.data_type, want, d.ty
                                ))
                                .with_table(schema.id.clone())
                                .with_column(c.name.clone())
                                .with_class("tributary.incompatible_type")
                                .with_hint(format!(
                                    "recreate {dest} with the new type (the sink creates it again when it is dropped), then replay the dead-letter topic"
                                )));
                            }
                        }
                        if !d.nullable && c.nullable {
                            ddl.push(format!(
                                "ALTER TABLE {} ALTER COLUMN {} DROP NOT NULL",
                                dest.quoted(),
                                quote_ident(&c.name)
                            ));
                        }
                    }
                }
            }
            // Columns the source no longer sends must accept NULL.
            for d in &state.columns {
                let bookkeeping = d.name == COMMIT_COLUMN || d.name == INDEX_COLUMN;
                if !d.nullable && !bookkeeping && !schema.columns.iter().any(|c| c.name == d.name) {
                    ddl.push(format!(
                        "ALTER TABLE {} ALTER COLUMN {} DROP NOT NULL",
                        dest.quoted(),
                        quote_ident(&d.name)
                    ));
                }
            }
            for n in next.columns.iter_mut() {
                if schema.columns.iter().any(|c| c.name == n.name && c.nullable)
                    || !schema.columns.iter().any(|c| c.name == n.name)
                {
                    if n.name != COMMIT_COLUMN && n.name != INDEX_COLUMN {
                        n.nullable = true;
                    }
                }
            }
        }
        for statement in &ddl {
            info!(table = %dest, ddl = %statement, "changing destination table");
            self.query(statement, &ctx).await?;
        }
        // The cache is updated from what was done, not read back: bqemulator's
        // tables.get does not see ALTER TABLE (and re-running the idempotent
        // DDL after a restart is harmless).
        next.reconciled.insert(fingerprint);
        self.tables.insert(dest.clone(), next);
        Ok(())
    }

    /// Checks that BigQuery is reachable and usable, without changing it.
    /// Returns the problems found, each with a fix; empty means ready.
    pub async fn check(&mut self) -> Vec<crate::sink::CheckProblem> {
        super::check::run(self).await
    }

    /// Runs a read-only query for the setup check.
    pub(super) async fn probe_query(&mut self, sql: &str) -> Result<QueryResponse> {
        if self.client.is_none() {
            self.client = Some(self.build_client().await?);
        }
        self.query(sql, &Ctx::default()).await
    }
}

#[async_trait]
impl Sink for BigQuerySink {
    async fn committed_offsets(&mut self, partitions: &[(String, i32)]) -> Result<Vec<Option<i64>>> {
        self.connect().await.map_err(|e| self.failed(e))?;
        let ctx = Ctx::table(format!("{}.{OFFSETS_TABLE}", self.config.bookkeeping_dataset));
        let sql = format!(
            "SELECT topic, `partition`, next_offset FROM {} WHERE consumer_group = {}",
            self.offsets_table(),
            quote_string(&self.consumer_group)
        );
        let response = match self.query(&sql, &ctx).await {
            Ok(r) => r,
            Err(e) => return Err(self.failed(e)),
        };
        let mut rs = ResultSet::new_from_query_response(response);
        let mut stored: HashMap<(String, i32), i64> = HashMap::new();
        while rs.next_row() {
            let bad = |e: BQError| Error::retryable(format!("unreadable offsets row: {e}"));
            let topic = rs.get_string(0).map_err(bad)?;
            let partition = rs.get_i64(1).map_err(bad)?;
            let next = rs.get_i64(2).map_err(bad)?;
            if let (Some(t), Some(p), Some(n)) = (topic, partition, next) {
                stored.insert((t, i32::try_from(p).unwrap_or(-1)), n);
            }
        }
        Ok(partitions.iter().map(|(t, p)| stored.get(&(t.clone(), *p)).copied()).collect())
    }

    async fn apply(&mut self, batch: &SinkBatch) -> Result<(), ApplyError> {
        let span = info_span!("bigquery_apply", table = %batch.table, records = batch.records.len());
        self.apply_inner(batch, true).instrument(span).await
    }
}

/// Prefixes of a batch, each staged and merged in a transaction that is
/// rolled back.
struct Prefixes<'a> {
    sink: &'a mut BigQuerySink,
    records: &'a [(KafkaPosition, SinkRecord)],
}

#[async_trait]
impl PrefixProbe for Prefixes<'_> {
    async fn probe(&mut self, n: usize) -> Result<(), ApplyError> {
        self.sink.attempt(&self.records[..n], &[], false).await
    }
}

// ---------------------------------------------------------------- reduction

/// The surviving event per key, as staging rows.
#[derive(Default)]
struct Reduced {
    rows: Vec<StagedRow>,
    /// Key JSON -> index in `rows`.
    winners: HashMap<String, usize>,
    /// Source column names in first-seen order (the union over schema versions).
    names: Vec<String>,
}

struct StagedRow {
    record: usize,
    table: TableId,
    position: Position,
    json: Map<String, Json>,
    live: bool,
}

impl Reduced {
    fn add(&mut self, record: usize, ev: &ChangeEvent, state: &TableState) -> Result<()> {
        let schema = &ev.schema;
        let key_idx = schema.key_indexes();
        if key_idx.is_empty() {
            return Err(Error::permanent("the table has no key columns").with_class("tributary.no_key"));
        }
        for c in &schema.columns {
            if !self.names.contains(&c.name) {
                self.names.push(c.name.clone());
            }
        }
        match ev.op {
            Op::Read | Op::Create | Op::Update => {
                let after = ev
                    .after
                    .as_ref()
                    .ok_or_else(|| Error::permanent(format!("a {:?} event without an after row", ev.op)))?;
                if let (Op::Update, Some(before)) = (ev.op, &ev.before) {
                    // A key change: the old key is deleted at the same position.
                    let complete = before.len() == schema.columns.len()
                        && !key_idx
                            .iter()
                            .any(|&i| matches!(before.get(i), Some(Value::Null | Value::Unchanged) | None));
                    if complete
                        && key_json(schema, before, &key_idx, state)? != key_json(schema, after, &key_idx, state)?
                    {
                        self.put(record, ev, before, true, state)?;
                    }
                }
                self.put(record, ev, after, false, state)
            }
            Op::Delete => {
                let before = ev
                    .before
                    .as_ref()
                    .ok_or_else(|| Error::permanent("a delete event without a before row"))?;
                self.put(record, ev, before, true, state)
            }
            Op::Truncate => Ok(()),
        }
    }

    fn put(&mut self, record: usize, ev: &ChangeEvent, row: &[Value], delete: bool, state: &TableState) -> Result<()> {
        let schema = &ev.schema;
        if row.len() != schema.columns.len() {
            return Err(Error::permanent(format!(
                "a row of {} values for {} columns",
                row.len(),
                schema.columns.len()
            )));
        }
        let key_idx = schema.key_indexes();
        let key = key_json(schema, row, &key_idx, state)?;
        let position = ev.source.position;
        if let Some(&w) = self.winners.get(&key) {
            if self.rows[w].position > position {
                return Ok(()); // an older event: the newer one stays
            }
        }
        let (commit, index) = position_sql(position)?;
        let mut json = Map::new();
        for (i, (col, value)) in schema.columns.iter().zip(row).enumerate() {
            if delete && !key_idx.contains(&i) {
                continue;
            }
            let ty = column_type_in(state, &col.name).unwrap_or_else(|| bigquery_type(&col.data_type));
            let v = to_json(value, &ty).map_err(|reason| {
                Error::permanent(format!("column {}: {reason} (value type {})", col.name, value.kind()))
                    .with_column(col.name.clone())
                    .with_class("tributary.value")
            })?;
            json.insert(col.name.clone(), v);
        }
        json.insert(DELETE_COLUMN.into(), Json::Bool(delete));
        json.insert(COMMIT_COLUMN.into(), Json::from(commit));
        json.insert(INDEX_COLUMN.into(), Json::from(index));
        self.rows.push(StagedRow {
            record,
            table: schema.id.clone(),
            position,
            json,
            live: true,
        });
        if let Some(old) = self.winners.insert(key, self.rows.len() - 1) {
            self.rows[old].live = false;
        }
        Ok(())
    }

    /// The staging columns: the destination's columns that some schema of
    /// the batch has, with the destination's types.
    fn columns(&mut self, state: &TableState) -> Vec<DestColumn> {
        self.rows.retain(|r| r.live);
        self.names
            .iter()
            .filter_map(|n| state.columns.iter().find(|c| &c.name == n).cloned())
            .collect()
    }
}

fn column_type_in(state: &TableState, name: &str) -> Option<BqType> {
    state.columns.iter().find(|c| c.name == name).map(|c| c.ty.clone())
}

fn key_json(schema: &TableSchema, row: &[Value], key: &[usize], state: &TableState) -> Result<String> {
    let mut parts = Vec::with_capacity(key.len());
    for &i in key {
        let value = row.get(i).ok_or_else(|| Error::permanent("a row shorter than its schema"))?;
        let col = &schema.columns[i];
        if matches!(value, Value::Null) {
            return Err(Error::permanent(format!("key column {} is NULL", col.name)).with_column(col.name.clone()));
        }
        let ty = column_type_in(state, &col.name).unwrap_or_else(|| bigquery_type(&col.data_type));
        parts.push(to_json(value, &ty).map_err(|reason| {
            Error::permanent(format!("key column {}: {reason}", col.name)).with_column(col.name.clone())
        })?);
    }
    Ok(Json::Array(parts).to_string())
}

// ---------------------------------------------------------------- SQL

/// The one `MERGE` of a staged batch: deletes, updates and inserts, each
/// guarded by the stored position.
fn merge_sql(dest: &DestinationTable, stage: &str, columns: &[DestColumn], key: &[String]) -> String {
    let c = quote_ident(COMMIT_COLUMN);
    let i = quote_ident(INDEX_COLUMN);
    let d = quote_ident(DELETE_COLUMN);
    let on = key
        .iter()
        .map(|k| format!("t.{q} = s.{q}", q = quote_ident(k)))
        .collect::<Vec<_>>()
        .join(" AND ");
    let names: Vec<String> = columns.iter().map(|col| quote_ident(&col.name)).collect();
    let set = columns
        .iter()
        .filter(|col| !key.contains(&col.name))
        .map(|col| format!("{q} = s.{q}", q = quote_ident(&col.name)))
        .chain([format!("{c} = s.{c}"), format!("{i} = s.{i}")])
        .collect::<Vec<_>>()
        .join(", ");
    let all: Vec<String> = names.iter().cloned().chain([c.clone(), i.clone()]).collect();
    let values: Vec<String> = all.iter().map(|n| format!("s.{n}")).collect();
    format!(
        "MERGE {t} AS t USING {stage} AS s ON {on} \
         WHEN MATCHED AND s.{d} AND (t.{c} < s.{c} OR (t.{c} = s.{c} AND t.{i} <= s.{i})) THEN DELETE \
         WHEN MATCHED AND NOT s.{d} AND (t.{c} < s.{c} OR (t.{c} = s.{c} AND t.{i} < s.{i})) THEN UPDATE SET {set} \
         WHEN NOT MATCHED AND NOT s.{d} THEN INSERT ({cols}) VALUES ({vals})",
        t = dest.quoted(),
        cols = all.join(", "),
        vals = values.join(", "),
    )
}

/// The staging table of a destination table and column set: one per
/// shape, so that a schema change gets a fresh one and never an ALTER.
fn staging_name(dest: &DestinationTable, columns: &[DestColumn]) -> String {
    let mut h = DefaultHasher::new();
    for c in columns {
        c.name.hash(&mut h);
        c.ty.to_string().hash(&mut h);
    }
    let base: String = format!("{}_{}", dest.dataset, dest.table)
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .take(200)
        .collect();
    format!("{STAGING_PREFIX}{base}_{:016x}", h.finish())
}

/// `(commit, index) < (c, i)` on a table alias (`""` for none).
fn older_than(alias: &str, commit: i64, index: i64) -> String {
    let c = format!("{alias}{}", quote_ident(COMMIT_COLUMN));
    let i = format!("{alias}{}", quote_ident(INDEX_COLUMN));
    format!("({c} < {commit} OR ({c} = {commit} AND {i} < {index}))")
}

/// Positions as INT64 (BigQuery has no unsigned integers).
fn position_sql(p: Position) -> Result<(i64, i64)> {
    let commit = i64::try_from(p.commit).map_err(|_| Error::permanent("a source position beyond INT64"))?;
    let index = i64::try_from(p.index).map_err(|_| Error::permanent("a source position index beyond INT64"))?;
    Ok((commit, index))
}

/// Types BigQuery can cluster on.
fn clusterable(ty: &BqType) -> bool {
    matches!(
        ty,
        BqType::Bool
            | BqType::Int64
            | BqType::Numeric(_)
            | BqType::BigNumeric(_)
            | BqType::String
            | BqType::Date
            | BqType::Datetime
            | BqType::Timestamp
            | BqType::Geography
    )
}

/// A backtick-quoted identifier.
pub fn quote_ident(name: &str) -> String {
    format!("`{}`", name.replace('\\', "\\\\").replace('`', "\\`"))
}

/// A single-quoted string literal.
pub fn quote_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('\'');
    for ch in text.chars() {
        match ch {
            '\\' => out.push_str("\\\\"),
            '\'' => out.push_str("\\'"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c => out.push(c),
        }
    }
    out.push('\'');
    out
}

// ---------------------------------------------------------------- errors

fn timed_out(ctx: &Ctx) -> Error {
    let e = Error::retryable("BigQuery did not answer in time").with_class("bigquery.timeout");
    with_ctx(e, ctx)
}

fn with_ctx(e: Error, ctx: &Ctx) -> Error {
    match &ctx.table {
        Some(t) => {
            let (schema, table) = t.split_once('.').unwrap_or(("", t));
            e.with_table(TableId::new(schema, table))
        }
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
fn classify_proto(errors: &[ErrorProto], ctx: &Ctx) -> Error {
    let first = errors.first();
    let reason = first.and_then(|e| e.reason.clone()).unwrap_or_else(|| "unknown".into());
    let message = first.and_then(|e| e.message.clone()).unwrap_or_default();
    let kind = reason_kind(&reason, &message);
    with_ctx(
        Error::new(kind, format!("BigQuery: {reason}: {}", redact(&message))).with_class(format!("bigquery.{reason}")),
        ctx,
    )
}

/// Classifies an error of the client crate.
fn classify(err: &BQError, ctx: &Ctx) -> Error {
    let e = match err {
        BQError::ResponseError { error } => {
            let code = error.error.code;
            let reason = error
                .error
                .errors
                .first()
                .and_then(|e| e.get("reason").cloned())
                .unwrap_or_else(|| error.error.status.clone());
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
fn redact(message: &str) -> String {
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

    #[test]
    fn literals_and_identifiers_are_escaped() {
        assert_eq!(quote_string("it's\\"), "'it\\'s\\\\'");
        assert_eq!(quote_ident("a`b"), "`a\\`b`");
    }
}

//! The stack's BigQuery emulator as a destination, for the sink tests:
//! queries over its REST API, and datasets of their own read back as
//! `id|name|qty|price` rows.

use std::collections::BTreeMap;

use serde_json::{json, Value as Json};
use tributary_connectors::sinks::bigquery::{BigQuerySink, BigQuerySinkConfig};

use crate::bench::BenchDestination;
use crate::{bigquery_emulator_url, bigquery_project, unique};

/// Runs a query on the emulator and returns its rows as text cells, every
/// page of them (the emulator, like BigQuery, answers at most 10,000 rows
/// at a time and a page token for the rest).
pub async fn query(sql: &str) -> Result<Vec<Vec<Option<String>>>, String> {
    let base = format!("{}/bigquery/v2/projects/{}/queries", bigquery_emulator_url(), bigquery_project());
    let client = reqwest::Client::new();
    let mut page = answer(client.post(&base).json(&json!({"query": sql, "useLegacySql": false}))).await?;
    let mut out = rows(&page);
    while let Some(token) = page.get("pageToken").and_then(Json::as_str).filter(|t| !t.is_empty()) {
        let job = page
            .pointer("/jobReference/jobId")
            .and_then(Json::as_str)
            .ok_or("a page token without a job id")?;
        let url = reqwest::Url::parse_with_params(&format!("{base}/{job}"), [("pageToken", token)])
            .map_err(|e| e.to_string())?;
        page = answer(client.get(url)).await?;
        out.extend(rows(&page));
    }
    Ok(out)
}

/// The JSON answer of one request, or its errors.
async fn answer(request: reqwest::RequestBuilder) -> Result<Json, String> {
    let body: Json = request
        .send()
        .await
        .map_err(|e| e.to_string())?
        .json()
        .await
        .map_err(|e| e.to_string())?;
    if let Some(errors) = body.get("errors").and_then(Json::as_array).filter(|e| !e.is_empty()) {
        return Err(format!("{errors:?}"));
    }
    if let Some(error) = body.get("error") {
        return Err(error.to_string());
    }
    Ok(body)
}

/// The rows of one page as text cells.
fn rows(page: &Json) -> Vec<Vec<Option<String>>> {
    let rows = page.get("rows").and_then(Json::as_array).cloned().unwrap_or_default();
    rows.iter()
        .map(|r| {
            r.get("f")
                .and_then(Json::as_array)
                .map(|cells| {
                    cells
                        .iter()
                        .map(|c| c.get("v").and_then(Json::as_str).map(str::to_string))
                        .collect()
                })
                .unwrap_or_default()
        })
        .collect()
}

/// Datasets of their own for one test, dropped at the end: the
/// destination dataset and the bookkeeping one.
pub struct Datasets {
    /// The destination dataset.
    pub dataset: String,
    /// The bookkeeping dataset (offsets, staging).
    pub bookkeeping: String,
    /// The consumer group of its sink.
    pub group: String,
}

impl Datasets {
    /// Fresh datasets for the test `name`.
    pub fn new(name: &str) -> Self {
        let dataset = unique(&format!("bq_{name}"));
        Self {
            bookkeeping: format!("{dataset}_bk"),
            group: unique("g"),
            dataset,
        }
    }

    /// The sink's config (no primary key: bqemulator cannot parse
    /// `NOT ENFORCED`).
    pub fn config(&self) -> BigQuerySinkConfig {
        let mut c = BigQuerySinkConfig::new(bigquery_project(), self.group.clone());
        c.emulator_url = Some(bigquery_emulator_url());
        c.dataset = Some(self.dataset.clone());
        c.bookkeeping_dataset = self.bookkeeping.clone();
        c.declare_primary_key = false;
        c
    }

    /// The `[bigquery]` section of a sink runner's config writing into the
    /// datasets (the emulator's, no primary key).
    pub fn runner_section(&self) -> String {
        format!(
            "[bigquery]\nproject = \"{}\"\nemulator_url = \"{}\"\ndataset = \"{}\"\nbookkeeping_dataset = \"{}\"\n\
             declare_primary_key = false\n",
            bigquery_project(),
            bigquery_emulator_url(),
            self.dataset,
            self.bookkeeping
        )
    }

    /// A sink writing into the datasets.
    pub fn sink(&self) -> BigQuerySink {
        BigQuerySink::new(self.config()).expect("sink config")
    }

    /// `` `project.dataset.name` ``.
    pub fn table(&self, name: &str) -> String {
        format!("`{}.{}.{name}`", bigquery_project(), self.dataset)
    }

    /// `id|name|qty|price` of every row of `items`, by id.
    pub async fn rows(&self) -> Vec<String> {
        let sql = format!(
            "SELECT CAST(id AS STRING), name, CAST(qty AS STRING), CAST(price AS STRING) FROM {} ORDER BY id",
            self.table("items")
        );
        let Ok(rows) = query(&sql).await else { return Vec::new() };
        rows.into_iter()
            .map(|r| {
                r.into_iter()
                    .enumerate()
                    .map(|(i, c)| match (i, c) {
                        // NUMERIC text differs in trailing zeros between
                        // engines: compare two decimals.
                        (3, Some(v)) => v.parse::<f64>().map(|f| format!("{f:.2}")).unwrap_or(v),
                        (_, c) => c.unwrap_or_else(|| "NULL".into()),
                    })
                    .collect::<Vec<_>>()
                    .join("|")
            })
            .collect()
    }

    /// The offsets stored for the group.
    pub async fn offsets(&self) -> BTreeMap<(String, i32), i64> {
        let sql = format!(
            "SELECT topic, CAST(`partition` AS STRING), CAST(next_offset AS STRING) FROM `{}.{}.offsets` WHERE consumer_group = '{}'",
            bigquery_project(),
            self.bookkeeping,
            self.group
        );
        query(&sql)
            .await
            .unwrap_or_default()
            .into_iter()
            .filter_map(|r| {
                let t = r.first()?.clone()?;
                let p = r.get(1)?.as_ref()?.parse().ok()?;
                let n = r.get(2)?.as_ref()?.parse().ok()?;
                Some(((t, p), n))
            })
            .collect()
    }

    /// Drops both datasets.
    pub async fn cleanup(&self) {
        for d in [&self.dataset, &self.bookkeeping] {
            let _ = query(&format!("DROP SCHEMA IF EXISTS `{}.{d}` CASCADE", bigquery_project())).await;
        }
    }
}

/// Each MERGE is one BigQuery job (the cost proxy).
#[async_trait::async_trait]
impl BenchDestination for Datasets {
    const UNIT: &'static str = "MERGE statements";
    type Sink = BigQuerySink;

    async fn create(name: &str) -> (Self, BigQuerySink) {
        let datasets = Self::new(name);
        let sink = datasets.sink();
        (datasets, sink)
    }

    async fn rows(&self) -> usize {
        self.rows().await.len()
    }

    fn units(&self, sink: &BigQuerySink, _batches: u64) -> u64 {
        sink.merges()
    }

    async fn cleanup(self) {
        Datasets::cleanup(&self).await;
    }
}

#[async_trait::async_trait]
impl crate::e2e::Destination for Datasets {
    fn section(&self) -> String {
        self.runner_section()
    }

    fn group(&self) -> String {
        self.group.clone()
    }

    async fn rows(&self, columns: &[&str]) -> Vec<String> {
        let cells: Vec<String> = columns.iter().map(|c| format!("IFNULL(CAST({c} AS STRING), 'NULL')")).collect();
        let sql = format!("SELECT {} FROM {} ORDER BY id", cells.join(", "), self.table("items"));
        query(&sql).await.map(crate::e2e::joined).unwrap_or_default()
    }

    async fn stored(&self) -> i64 {
        self.offsets().await.values().sum()
    }

    async fn exists(&self) -> bool {
        query(&format!("SELECT 1 FROM {}", self.table("items"))).await.is_ok()
    }

    fn refuses_infinity(&self) -> bool {
        true
    }

    async fn cleanup(&self) {
        Datasets::cleanup(self).await
    }
}

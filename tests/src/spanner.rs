//! The stack's Cloud Spanner emulator as a destination, for the sink tests:
//! a database of its own per test (the emulator runs one read-write
//! transaction at a time per database), made and read over the emulator's
//! REST gateway.

use std::time::{Duration, Instant};

use serde_json::{json, Value as Json};
use tributary_connectors::sinks::spanner::{SpannerSink, SpannerSinkConfig};

use crate::bench::BenchDestination;
use crate::{env_or, unique};

/// The emulator's gRPC endpoint (`SPANNER_EMULATOR_HOST`).
pub fn spanner_emulator_host() -> String {
    env_or("SPANNER_EMULATOR_HOST", "127.0.0.1:9010")
}

/// The emulator's REST gateway: the gRPC port + 10, as `scripts/stack`
/// starts it (or `SPANNER_EMULATOR_REST`).
pub fn spanner_rest_url() -> String {
    std::env::var("SPANNER_EMULATOR_REST").unwrap_or_else(|_| {
        let host = spanner_emulator_host();
        let (h, p) = host.rsplit_once(':').unwrap_or(("127.0.0.1", "9010"));
        format!("http://{h}:{}", p.parse::<u16>().unwrap_or(9010) + 10)
    })
}

/// The emulator's project.
pub fn spanner_project() -> String {
    env_or("SPANNER_PROJECT", "tributary-local")
}

/// The instance every test's database lives in.
pub const INSTANCE: &str = "tributary-tests";

async fn call(request: reqwest::RequestBuilder) -> Result<Json, String> {
    let response = request.send().await.map_err(|e| e.to_string())?;
    let status = response.status();
    let body: Json = response.json().await.unwrap_or(Json::Null);
    if !status.is_success() {
        return Err(format!("{status}: {body}"));
    }
    Ok(body)
}

/// A database of its own for one test, dropped at the end.
pub struct Database {
    /// The database id.
    pub database: String,
    /// The consumer group of its sink.
    pub group: String,
    /// The emulator's gRPC endpoint.
    pub host: String,
    /// The emulator's REST gateway.
    pub rest: String,
    client: reqwest::Client,
}

impl Database {
    /// A fresh database (and the instance, if it is not there) in the
    /// stack's emulator.
    pub async fn new(name: &str) -> Self {
        Self::at(&spanner_emulator_host(), &spanner_rest_url(), name).await
    }

    /// A fresh database in the emulator at `host` (gRPC) and `rest`.
    pub async fn at(host: &str, rest: &str, name: &str) -> Self {
        let client = reqwest::Client::new();
        let base = format!("{rest}/v1/projects/{}", spanner_project());
        // A fresh emulator takes a moment to answer.
        let deadline = Instant::now() + Duration::from_secs(30);
        while client.get(format!("{base}/instanceConfigs")).send().await.is_err() {
            assert!(Instant::now() < deadline, "no Spanner emulator at {rest}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let instance = json!({"instanceId": INSTANCE, "instance": {
            "config": format!("projects/{}/instanceConfigs/emulator-config", spanner_project()),
            "displayName": INSTANCE,
            "nodeCount": 1,
        }});
        if let Err(e) = call(client.post(format!("{base}/instances")).json(&instance)).await {
            assert!(e.contains("409") || e.contains("ALREADY_EXISTS"), "create instance: {e}");
        }
        // Database ids: lowercase, at most 30 characters.
        let database =
            unique(&format!("d{}", name.chars().filter(char::is_ascii_alphanumeric).take(8).collect::<String>()))
                .to_ascii_lowercase();
        let create = json!({"createStatement": format!("CREATE DATABASE `{database}`")});
        call(client.post(format!("{base}/instances/{INSTANCE}/databases")).json(&create))
            .await
            .expect("create database");
        let url = format!("{base}/instances/{INSTANCE}/databases/{database}");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let state = call(client.get(&url))
                .await
                .ok()
                .and_then(|d| d.get("state").and_then(Json::as_str).map(str::to_string));
            if state.as_deref() == Some("READY") {
                break;
            }
            assert!(Instant::now() < deadline, "database {database} not ready: {state:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Self {
            database,
            group: unique("g"),
            host: host.to_string(),
            rest: rest.to_string(),
            client,
        }
    }

    fn url(&self) -> String {
        format!("{}/v1/projects/{}/instances/{INSTANCE}/databases/{}", self.rest, spanner_project(), self.database)
    }

    /// The sink's config.
    pub fn config(&self) -> SpannerSinkConfig {
        let mut c = SpannerSinkConfig::new(spanner_project(), INSTANCE, self.database.clone(), self.group.clone());
        c.emulator_host = Some(self.host.clone());
        c
    }

    /// A sink writing into the database.
    pub fn sink(&self) -> SpannerSink {
        SpannerSink::new(self.config()).expect("sink config")
    }

    /// The `[spanner]` section of a sink runner's config.
    pub fn runner_section(&self) -> String {
        format!(
            "[spanner]\nproject = \"{}\"\ninstance = \"{INSTANCE}\"\ndatabase = \"{}\"\nemulator_host = \"{}\"\n",
            spanner_project(),
            self.database,
            self.host
        )
    }

    /// Runs a query (in a session of its own) and returns its rows' cells
    /// as text (`None` for NULL).
    pub async fn query(&self, sql: &str) -> Result<Vec<Vec<Option<String>>>, String> {
        let session = call(self.client.post(format!("{}/sessions", self.url())).json(&json!({}))).await?;
        let name = session.get("name").and_then(Json::as_str).ok_or("no session name")?.to_string();
        let result = call(
            self.client
                .post(format!("{}/v1/{name}:executeSql", self.rest))
                .json(&json!({"sql": sql})),
        )
        .await;
        let _ = self.client.delete(format!("{}/v1/{name}", self.rest)).send().await;
        let rows = result?.get("rows").and_then(Json::as_array).cloned().unwrap_or_default();
        Ok(rows
            .iter()
            .map(|r| {
                r.as_array()
                    .map(|cells| {
                        cells
                            .iter()
                            .map(|c| match c {
                                Json::Null => None,
                                Json::String(s) => Some(s.clone()),
                                other => Some(other.to_string()),
                            })
                            .collect()
                    })
                    .unwrap_or_default()
            })
            .collect())
    }

    /// Runs `statements` (DML) in one read-write transaction, begun again
    /// when the emulator aborts it (it runs one read-write transaction at a
    /// time per database, and a sink may be writing).
    pub async fn execute(&self, statements: &[&str]) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match self.execute_once(statements).await {
                Err(e) if e.to_ascii_lowercase().contains("aborted") && Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                other => return other,
            }
        }
    }

    async fn execute_once(&self, statements: &[&str]) -> Result<(), String> {
        let session = call(self.client.post(format!("{}/sessions", self.url())).json(&json!({}))).await?;
        let name = session.get("name").and_then(Json::as_str).ok_or("no session name")?.to_string();
        let run = async {
            let begin = call(
                self.client
                    .post(format!("{}/v1/{name}:beginTransaction", self.rest))
                    .json(&json!({"options": {"readWrite": {}}})),
            )
            .await?;
            let id = begin.get("id").and_then(Json::as_str).ok_or("no transaction id")?.to_string();
            let dml: Vec<Json> = statements.iter().map(|sql| json!({"sql": sql})).collect();
            let done = call(
                self.client
                    .post(format!("{}/v1/{name}:executeBatchDml", self.rest))
                    .json(&json!({"transaction": {"id": id}, "statements": dml, "seqno": "1"})),
            )
            .await?;
            // A statement that fails ends the batch with a status, not an
            // HTTP error.
            match done.get("status").and_then(|s| s.get("code")).and_then(Json::as_i64) {
                None | Some(0) => {}
                Some(10) => return Err(format!("ABORTED: {done}")),
                Some(_) => return Err(format!("DML failed: {done}")),
            }
            call(
                self.client
                    .post(format!("{}/v1/{name}:commit", self.rest))
                    .json(&json!({"transactionId": id})),
            )
            .await
            .map(|_| ())
        };
        let result = run.await;
        let _ = self.client.delete(format!("{}/v1/{name}", self.rest)).send().await;
        result
    }

    /// `id|name|qty|price` of every row of `table`, by id (`∅` for NULL;
    /// NUMERIC with two decimals: Spanner drops trailing zeros).
    pub async fn rows(&self, table: &str) -> Vec<String> {
        let sql = format!(
            "SELECT CAST(id AS STRING), name, CAST(qty AS STRING), CAST(price AS STRING) FROM `{table}` ORDER BY id"
        );
        let Ok(rows) = self.query(&sql).await else {
            return Vec::new();
        };
        rows.into_iter()
            .map(|r| {
                r.into_iter()
                    .enumerate()
                    .map(|(i, c)| match (i, c) {
                        (3, Some(v)) => v.parse::<f64>().map(|f| format!("{f:.2}")).unwrap_or(v),
                        (_, c) => c.unwrap_or_else(|| "∅".into()),
                    })
                    .collect::<Vec<_>>()
                    .join("|")
            })
            .collect()
    }

    /// Drops the database.
    pub async fn cleanup(&self) {
        let _ = self.client.delete(self.url()).send().await;
    }
}

/// Each commit is one read-write transaction (a batch above the mutation
/// limit is several).
#[async_trait::async_trait]
impl BenchDestination for Database {
    const UNIT: &'static str = "commits";
    type Sink = SpannerSink;

    async fn create(name: &str) -> (Self, SpannerSink) {
        let database = Self::new(name).await;
        let sink = database.sink();
        (database, sink)
    }

    async fn rows(&self) -> usize {
        // The destination table of `public.items`.
        self.rows("public_items").await.len()
    }

    fn units(&self, sink: &SpannerSink, _batches: u64) -> u64 {
        sink.commits()
    }

    async fn cleanup(self) {
        Database::cleanup(&self).await;
    }
}

#[async_trait::async_trait]
impl crate::e2e::Destination for Database {
    /// Tables named as in the source (`items`).
    fn section(&self) -> String {
        format!("{}table = \"{{table}}\"\n", self.runner_section())
    }

    fn group(&self) -> String {
        self.group.clone()
    }

    async fn rows(&self, columns: &[&str]) -> Vec<String> {
        let cells: Vec<String> = columns.iter().map(|c| format!("IFNULL(CAST({c} AS STRING), 'NULL')")).collect();
        let sql = format!("SELECT {} FROM items ORDER BY id", cells.join(", "));
        self.query(&sql).await.map(crate::e2e::joined).unwrap_or_default()
    }

    async fn stored(&self) -> i64 {
        let sql = format!(
            "SELECT IFNULL(SUM(next_offset), 0) FROM tributary_offsets WHERE consumer_group = '{}'",
            self.group
        );
        self.query(&sql)
            .await
            .ok()
            .and_then(|r| r.first().and_then(|c| c.first().cloned().flatten()))
            .and_then(|v| v.parse::<i64>().ok())
            .unwrap_or(0)
    }

    async fn exists(&self) -> bool {
        self.query("SELECT 1 FROM items").await.is_ok()
    }

    fn refuses_infinity(&self) -> bool {
        true
    }

    async fn cleanup(&self) {
        Database::cleanup(self).await
    }
}

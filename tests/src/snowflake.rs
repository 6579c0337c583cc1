//! The stack's Snowflake emulator (fakesnow) as a destination, for the sink
//! tests: schemas of their own read back as `id|name|qty|price` rows,
//! through a sink's own session ([`SnowflakeSink::query`]).

use tributary_connectors::sinks::snowflake::{Rows, SnowflakeSink, SnowflakeSinkConfig};

use crate::bench::BenchDestination;
use crate::{snowflake_emulator_url, unique};

/// The database every test writes into (fakesnow creates it at login; in
/// Snowflake an operator creates it).
pub const DATABASE: &str = "TRIBUTARY";

/// A config of the emulator (any account, user and password).
pub fn config(group: &str) -> SnowflakeSinkConfig {
    let mut c =
        SnowflakeSinkConfig::new(snowflake_emulator_url(), "emulator", "tributary", "emulator", DATABASE, group);
    // fakesnow (DuckDB) enforces a declared key and then refuses to widen
    // a key column; Snowflake enforces none.
    c.declare_primary_key = false;
    c.request_timeout_ms = 30_000;
    c.query_timeout_ms = 60_000;
    c
}

/// Schemas of their own for one test, dropped at the end: the destination
/// schema and the bookkeeping one.
pub struct Schemas {
    /// The destination schema.
    pub schema: String,
    /// The bookkeeping schema (offsets, deleted rows, the session's staging).
    pub bookkeeping: String,
    /// The consumer group of its sink.
    pub group: String,
    admin: tokio::sync::Mutex<SnowflakeSink>,
}

impl Schemas {
    /// Fresh schemas for the test `name`.
    pub fn new(name: &str) -> Self {
        let schema = unique(&format!("sf_{name}"));
        let bookkeeping = format!("{schema}_bk");
        let mut admin = config("admin");
        admin.bookkeeping_schema = bookkeeping.clone();
        Self {
            admin: tokio::sync::Mutex::new(SnowflakeSink::new(admin).expect("admin config")),
            group: unique("g"),
            bookkeeping,
            schema,
        }
    }

    /// The sink's config writing into the schemas.
    pub fn config(&self) -> SnowflakeSinkConfig {
        let mut c = config(&self.group);
        c.schema = Some(self.schema.clone());
        c.bookkeeping_schema = self.bookkeeping.clone();
        c
    }

    /// The `[snowflake]` section of a sink runner's config writing into the
    /// schemas.
    pub fn runner_section(&self) -> String {
        format!(
            "[snowflake]\nurl = \"{}\"\naccount = \"emulator\"\nuser = \"tributary\"\npassword = \"emulator\"\n\
             database = \"{DATABASE}\"\nschema = \"{}\"\nbookkeeping_schema = \"{}\"\ndeclare_primary_key = false\n",
            snowflake_emulator_url(),
            self.schema,
            self.bookkeeping
        )
    }

    /// `"DATABASE"."schema"."name"`.
    pub fn table(&self, name: &str) -> String {
        format!("\"{DATABASE}\".\"{}\".\"{name}\"", self.schema)
    }

    /// Runs a statement and returns its rows as text.
    pub async fn query(&self, sql: &str) -> Result<Rows, String> {
        self.admin.lock().await.query(sql).await.map_err(|e| e.to_string())
    }

    /// `id|name|qty|price` of every row of `items`, by id (empty while the
    /// table does not exist).
    pub async fn rows(&self) -> Vec<String> {
        let sql = format!(
            "SELECT CAST(\"id\" AS VARCHAR), \"name\", CAST(\"qty\" AS VARCHAR), CAST(\"price\" AS VARCHAR) FROM {} ORDER BY \"id\"",
            self.table("items")
        );
        let Ok(rows) = self.query(&sql).await else {
            return Vec::new();
        };
        rows.into_iter()
            .map(|r| {
                r.into_iter()
                    .enumerate()
                    .map(|(i, c)| match (i, c) {
                        // Decimal text differs in trailing zeros between
                        // engines: compare two decimals.
                        (3, Some(v)) => v.parse::<f64>().map(|f| format!("{f:.2}")).unwrap_or(v),
                        (_, c) => c.unwrap_or_else(|| "NULL".into()),
                    })
                    .collect::<Vec<_>>()
                    .join("|")
            })
            .collect()
    }

    /// Drops both schemas.
    pub async fn cleanup(&self) {
        for s in [&self.schema, &self.bookkeeping] {
            let _ = self
                .query(&format!("DROP SCHEMA IF EXISTS \"{DATABASE}\".\"{s}\" CASCADE"))
                .await;
        }
    }
}

/// Snowflake bills warehouse time, which grows with statements.
#[async_trait::async_trait]
impl BenchDestination for Schemas {
    const UNIT: &'static str = "statements";
    type Sink = SnowflakeSink;

    async fn create(name: &str) -> (Self, SnowflakeSink) {
        let schemas = Self::new(name);
        let sink = SnowflakeSink::new(schemas.config()).expect("config");
        (schemas, sink)
    }

    async fn rows(&self) -> usize {
        self.rows().await.len()
    }

    fn units(&self, sink: &SnowflakeSink, _batches: u64) -> u64 {
        sink.statements()
    }

    async fn cleanup(self) {
        Schemas::cleanup(&self).await;
    }
}

#[async_trait::async_trait]
impl crate::e2e::Destination for Schemas {
    fn section(&self) -> String {
        self.runner_section()
    }

    fn group(&self) -> String {
        self.group.clone()
    }

    async fn rows(&self, columns: &[&str]) -> Vec<String> {
        let cells: Vec<String> = columns
            .iter()
            .map(|c| format!("COALESCE(CAST(\"{c}\" AS VARCHAR), 'NULL')"))
            .collect();
        let sql = format!("SELECT {} FROM {} ORDER BY \"id\"", cells.join(", "), self.table("items"));
        self.query(&sql).await.map(crate::e2e::joined).unwrap_or_default()
    }

    async fn stored(&self) -> i64 {
        let sql = format!(
            "SELECT CAST(SUM(next_offset) AS VARCHAR) FROM \"{DATABASE}\".\"{}\".\"offsets\" WHERE consumer_group = '{}'",
            self.bookkeeping, self.group
        );
        self.query(&sql)
            .await
            .ok()
            .and_then(|r| r.first().and_then(|c| c.first().cloned().flatten()))
            // SUM's text may carry a fraction (fakesnow: `1722.0`).
            .and_then(|v| v.parse::<f64>().ok())
            .map_or(0, |v| v as i64)
    }

    async fn exists(&self) -> bool {
        self.query(&format!("SELECT 1 FROM {}", self.table("items"))).await.is_ok()
    }

    fn refuses_infinity(&self) -> bool {
        true
    }

    async fn cleanup(&self) {
        Schemas::cleanup(self).await
    }
}

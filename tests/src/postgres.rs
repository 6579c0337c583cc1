//! The stack's PostgreSQL for the tests: as a destination (a schema of its
//! own, read back as `id|name|qty|price` rows) and as a source (a schema,
//! a slot and a publication of its own).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use tokio_postgres::{Client, NoTls};
use tributary_connectors::sinks::postgres::{PostgresSink, PostgresSinkConfig};
use tributary_connectors::sources::postgres::config::{PostgresSourceConfig, SESSION_OPTIONS};
use tributary_schemas::TableId;

use crate::bench::BenchDestination;
use crate::{pg_destination_url, unique};

/// A session of the destination database (`PG_DESTINATION_URL`).
pub async fn connect(url: &str) -> Client {
    let (client, conn) = tokio_postgres::connect(url, NoTls).await.expect("connect to the destination");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client
}

/// A session of `url` with the source's pinned session settings
/// (`SESSION_OPTIONS`: ISO dates, ISO 8601 intervals, UTC, shortest exact
/// floats, `lc_monetary = C`), so that values read as text compare with
/// the source's, read the same way.
pub async fn connect_pinned(url: &str) -> Client {
    let mut cfg: tokio_postgres::Config = url.parse().expect("a PostgreSQL URL");
    cfg.options(SESSION_OPTIONS);
    let (client, conn) = cfg.connect(NoTls).await.expect("connect to the destination");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client
}

/// `id|name|qty|price` per row of the `items` table `table` (quoted),
/// ordered by id.
pub async fn items_rows(client: &Client, table: &str) -> Vec<String> {
    let q = format!(
        "SELECT concat_ws('|', coalesce(id::text, '∅'), coalesce(name, '∅'), coalesce(qty::text, '∅'), coalesce(price::text, '∅')) \
         FROM {table} ORDER BY id"
    );
    client
        .query(q.as_str(), &[])
        .await
        .unwrap_or_else(|e| panic!("{q}: {e}"))
        .iter()
        .filter_map(|r| r.get::<_, Option<String>>(0))
        .collect()
}

/// One column of `table` (quoted) as text, ordered by id.
pub async fn column_texts(client: &Client, table: &str, column: &str) -> Vec<Option<String>> {
    let sql = format!("SELECT \"{column}\"::text FROM {table} ORDER BY id");
    client
        .query(sql.as_str(), &[])
        .await
        .expect("read column")
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// Whether `schema`'s table `items` has `column`.
pub async fn items_has_column(client: &Client, schema: &str, column: &str) -> bool {
    has_column(client, schema, "items", column).await
}

/// Whether `schema`'s table `table` has `column`.
pub async fn has_column(client: &Client, schema: &str, table: &str, column: &str) -> bool {
    client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM information_schema.columns \
             WHERE table_schema = $1 AND table_name = $2 AND column_name = $3)",
            &[&schema, &table, &column],
        )
        .await
        .expect("look up the column")
        .get(0)
}

/// Whether the table `table` (quoted) exists.
pub async fn table_exists(client: &Client, table: &str) -> bool {
    client
        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&table])
        .await
        .expect("look up the table")
        .get(0)
}

/// A schema of its own for one test, dropped at the end.
pub struct Destination {
    /// The schema.
    pub schema: String,
    /// The consumer group of its sink.
    pub group: String,
    /// An admin session.
    pub admin: Client,
}

impl Destination {
    /// A fresh schema for the test `name`.
    pub async fn new(name: &str) -> Self {
        let schema = unique(&format!("sink_{name}"));
        let admin = connect(&pg_destination_url()).await;
        Self { group: format!("{schema}_group"), schema, admin }
    }

    /// The sink's config: the schema, the group.
    pub fn config(&self) -> PostgresSinkConfig {
        let mut c = PostgresSinkConfig::new(pg_destination_url(), self.group.clone());
        c.schema = Some(self.schema.clone());
        c
    }

    /// A sink writing into the schema.
    pub fn sink(&self) -> PostgresSink {
        PostgresSink::new(self.config()).expect("sink config")
    }

    /// `"schema"."items"`.
    pub fn table(&self) -> String {
        format!("\"{}\".\"items\"", self.schema)
    }

    /// Runs `sql` as the admin.
    pub async fn exec(&self, sql: &str) {
        self.admin.batch_execute(sql).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// Whether the `items` table exists.
    pub async fn exists(&self) -> bool {
        table_exists(&self.admin, &self.table()).await
    }

    /// The first column of `sql`'s rows, as text.
    pub async fn texts(&self, sql: &str) -> Vec<Option<String>> {
        self.admin
            .query(sql, &[])
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
            .iter()
            .map(|r| r.get(0))
            .collect()
    }

    /// `id|name|qty|price` per row, ordered by id (none while the table
    /// does not exist yet).
    pub async fn rows(&self) -> Vec<String> {
        if !self.exists().await {
            return Vec::new();
        }
        items_rows(&self.admin, &self.table()).await
    }

    /// Row versions (`xmin`) and positions, to prove a replay wrote nothing.
    pub async fn versions(&self) -> Vec<String> {
        let q = format!(
            "SELECT concat_ws('|', id, xmin::text, __tributary_commit, __tributary_index) FROM {} ORDER BY id",
            self.table()
        );
        self.texts(&q).await.into_iter().flatten().collect()
    }

    /// The offsets stored for the group.
    pub async fn offsets(&self) -> BTreeMap<(String, i32), i64> {
        self.admin
            .query(
                "SELECT topic, partition, next_offset FROM tributary.offsets WHERE consumer_group = $1",
                &[&self.group],
            )
            .await
            .expect("read offsets")
            .iter()
            .map(|r| ((r.get(0), r.get(1)), r.get(2)))
            .collect()
    }

    /// Drops the schema and the group's offsets.
    pub async fn cleanup(self) {
        let _ = self
            .admin
            .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{}\" CASCADE", self.schema))
            .await;
        let _ = self
            .admin
            .execute("DELETE FROM tributary.offsets WHERE consumer_group = $1", &[&self.group])
            .await;
    }
}

/// Each batch is one transaction.
#[async_trait::async_trait]
impl BenchDestination for Destination {
    const UNIT: &'static str = "transactions";
    type Sink = PostgresSink;

    async fn create(name: &str) -> (Self, PostgresSink) {
        let destination = Self::new(name).await;
        let sink = destination.sink();
        (destination, sink)
    }

    async fn rows(&self) -> usize {
        self.rows().await.len()
    }

    fn units(&self, _sink: &PostgresSink, batches: u64) -> u64 {
        batches
    }

    async fn cleanup(self) {
        Destination::cleanup(self).await;
    }
}

// ---------------------------------------------------------------- source

/// How long the source fixture waits for a walsender to let go of a slot.
const SLOT_RELEASE: Duration = Duration::from_secs(60);

/// The source database (`PG_SOURCE_URL`).
pub fn source_url() -> String {
    crate::pg_source_url()
}

static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// A name carrying this process's id, so that [`sweep_stale`] can tell
/// what a dead test process left behind.
pub fn unique_with_pid(prefix: &str) -> String {
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let pid = std::process::id();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{prefix}_{pid}_{n}_{}", nanos % 100_000)
}

/// An admin session of the source database, with the source's session
/// settings.
pub async fn source_admin() -> tokio_postgres::Client {
    let mut cfg: tokio_postgres::Config = source_url().parse().expect("PG_SOURCE_URL");
    cfg.options(SESSION_OPTIONS);
    let (client, conn) = cfg.connect(NoTls).await.expect("connect to PG_SOURCE_URL (is the stack up?)");
    tokio::spawn(conn);
    client
}

/// Drops the slots, publications and schemas left behind by test processes
/// that died (a panicking test skips its cleanup): their names carry the
/// pid of the process that made them.
pub async fn sweep_stale(admin: &tokio_postgres::Client) {
    let alive = |name: &str| -> bool {
        name.split('_')
            .nth(2)
            .and_then(|pid| pid.parse::<u32>().ok())
            .is_none_or(|pid| std::path::Path::new(&format!("/proc/{pid}")).exists())
    };
    let names = |sql: &'static str| async move {
        admin
            .query(sql, &[])
            .await
            .map(|rows| rows.iter().map(|r| r.get::<_, String>(0)).collect::<Vec<_>>())
            .unwrap_or_default()
    };
    for slot in
        names("SELECT slot_name::text FROM pg_replication_slots WHERE NOT active AND slot_name ~ '^s_[a-z]+_[0-9]+_'")
            .await
    {
        if !alive(&slot) {
            let _ = admin.execute("SELECT pg_drop_replication_slot($1)", &[&slot]).await;
        }
    }
    for publication in names("SELECT pubname::text FROM pg_publication WHERE pubname ~ '^p_[a-z]+_[0-9]+_'").await {
        if !alive(&publication) {
            let _ = admin.batch_execute(&format!("DROP PUBLICATION IF EXISTS {publication}")).await;
        }
    }
    for schema in names("SELECT nspname::text FROM pg_namespace WHERE nspname ~ '^t_[a-z]+_[0-9]+_'").await {
        if !alive(&schema) {
            let _ = admin.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE")).await;
        }
    }
}

/// One test's schema, slot and publication.
pub struct SourceSchema {
    /// An admin session.
    pub admin: tokio_postgres::Client,
    /// The schema.
    pub schema: String,
    /// The replication slot of its source.
    pub slot: String,
    /// The publication of its source.
    pub publication: String,
}

impl SourceSchema {
    /// A fresh schema (and slot and publication names) for the test `name`.
    pub async fn new(name: &str) -> Self {
        let admin = source_admin().await;
        sweep_stale(&admin).await;
        let schema = unique_with_pid(&format!("t_{name}"));
        let slot = unique_with_pid(&format!("s_{name}"));
        let publication = unique_with_pid(&format!("p_{name}"));
        admin
            .batch_execute(&format!("CREATE SCHEMA {schema}"))
            .await
            .expect("create schema");
        SourceSchema { admin, schema, slot, publication }
    }

    /// A source config over the schema (small chunks, short heartbeats).
    pub fn config(&self) -> PostgresSourceConfig {
        let mut c = PostgresSourceConfig::with_url(source_url());
        c.slot_name = self.slot.clone();
        c.publication_name = self.publication.clone();
        c.include = vec![format!("{}.*", self.schema)];
        c.snapshot_chunk_rows = 100;
        c.snapshot_parallelism = 2;
        c.heartbeat_interval_ms = 300;
        c.batch_linger_ms = 20;
        c
    }

    /// The table `name` of the schema.
    pub fn table(&self, name: &str) -> TableId {
        TableId::new(&self.schema, name)
    }

    /// Runs `sql` as the admin.
    pub async fn exec(&self, sql: &str) {
        self.admin.batch_execute(sql).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// Drops the slot (once its walsender let go), the publication and the
    /// schema.
    pub async fn cleanup(&self) {
        // The walsender of a dropped source may still hold the slot for a
        // moment: wait for it to go, then drop the slot.
        let deadline = Instant::now() + SLOT_RELEASE;
        loop {
            let r = self
                .admin
                .execute(
                    "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1",
                    &[&self.slot],
                )
                .await;
            match r {
                Ok(_) => break,
                Err(_) if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(100)).await,
                Err(e) => panic!("dropping slot {}: {e}", self.slot),
            }
        }
        let _ = self
            .admin
            .batch_execute(&format!(
                "DROP PUBLICATION IF EXISTS {}; DROP SCHEMA IF EXISTS {} CASCADE",
                self.publication, self.schema
            ))
            .await;
    }
}

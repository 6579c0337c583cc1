//! The SQL Server source against a real SQL Server: the source conformance
//! suite's cases, each in a database of its own with CDC enabled.
//!
//! No SQL Server can run on the machines this project is built on, so
//! every test here is `#[ignore]`d: cargo reports them as ignored, never
//! as passed. With a server (the `docker run` line is in
//! `docs/sources/sqlserver.md`):
//!
//! ```text
//! TRIBUTARY_SQLSERVER_URL='sqlserver://sa:Tributary-2026@127.0.0.1:1433/master' \
//!   cargo test -p tributary-tests --test sqlserver_source -- --ignored
//! ```
//!
//! The login must be sysadmin (it creates databases and enables CDC).
//! Run with `--ignored` but without the variable, each test fails saying
//! so rather than passing. `kill_9_exactly_once` also needs the stack's
//! Kafka and registry.

use async_trait::async_trait;
use tokio::sync::Mutex;
use tributary_connectors::sources::sqlserver::client::{TiberiusClient, TiberiusConnector};
use tributary_connectors::sources::sqlserver::config::parse_url;
use tributary_connectors::sources::sqlserver::{SqlServerSource, SqlServerSourceConfig};
use tributary_connectors::Source;
use tributary_schemas::TableId;
use tributary_tests::conformance::source::SourceFixture;
use tributary_tests::unique;

/// The variable naming the server.
const URL_VAR: &str = "TRIBUTARY_SQLSERVER_URL";

/// A database of its own on the server, with CDC and snapshot isolation on.
struct SqlServer {
    /// URL of the test's database.
    url: String,
    database: String,
    admin: Mutex<TiberiusClient>,
}

async fn connect(url: &str) -> TiberiusClient {
    let params = SqlServerSourceConfig::with_url(url)
        .connection()
        .expect("connection parameters");
    TiberiusClient::connect(&params).await.expect("connect to SQL Server")
}

impl SqlServer {
    async fn new(case: &str) -> Self {
        let Ok(server) = std::env::var(URL_VAR) else {
            panic!("{URL_VAR} is not set: these tests need a SQL Server (docs/sources/sqlserver.md)");
        };
        let (user, password, host, port, _) = parse_url(&server).expect("a sqlserver:// URL");
        let database = unique(&format!("trib_{case}")).replace('-', "_");
        let mut admin = connect(&server).await;
        admin
            .execute(&format!(
                "CREATE DATABASE [{database}]; ALTER DATABASE [{database}] SET ALLOW_SNAPSHOT_ISOLATION ON;"
            ))
            .await
            .expect("create database");
        let auth = match password {
            Some(p) => format!("{user}:{p}"),
            None => user,
        };
        let url = format!("sqlserver://{auth}@{host}:{port}/{database}");
        let mut db = connect(&url).await;
        db.execute("EXEC sys.sp_cdc_enable_db;").await.expect("sp_cdc_enable_db");
        Self { url, database, admin: Mutex::new(db) }
    }

    async fn sql(&self, sql: &str) {
        self.admin
            .lock()
            .await
            .execute(sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
}

#[async_trait]
impl SourceFixture for SqlServer {
    fn table(&self, name: &str) -> TableId {
        TableId::new("dbo", name)
    }

    async fn create(&self, name: &str) {
        self.sql(&format!(
            "CREATE TABLE dbo.[{name}] (id int PRIMARY KEY, name nvarchar(100), qty int); \
             EXEC sys.sp_cdc_enable_table @source_schema = N'dbo', @source_name = N'{name}', @role_name = NULL, \
             @supports_net_changes = 0;"
        ))
        .await;
    }

    async fn insert(&self, name: &str, rows: &[(i32, &str, i32)]) {
        let values: Vec<String> = rows.iter().map(|(i, n, q)| format!("({i}, N'{n}', {q})")).collect();
        let mut sql = String::from("BEGIN TRANSACTION;");
        // INSERT ... VALUES takes at most 1000 rows.
        for chunk in values.chunks(1000) {
            sql.push_str(&format!("INSERT INTO dbo.[{name}] (id, name, qty) VALUES {};", chunk.join(", ")));
        }
        sql.push_str("COMMIT;");
        self.sql(&sql).await;
    }

    async fn update(&self, name: &str, id: i32, new_name: &str, qty: i32) {
        self.sql(&format!("UPDATE dbo.[{name}] SET name = N'{new_name}', qty = {qty} WHERE id = {id}"))
            .await;
    }

    async fn delete(&self, name: &str, id: i32) {
        self.sql(&format!("DELETE FROM dbo.[{name}] WHERE id = {id}")).await;
    }

    /// The operator's steps after DDL: a second capture instance.
    async fn add_note(&self, name: &str, id: i32, note: &str) {
        self.sql(&format!(
            "ALTER TABLE dbo.[{name}] ADD note nvarchar(100); \
             EXEC sys.sp_cdc_enable_table @source_schema = N'dbo', @source_name = N'{name}', @role_name = NULL, \
             @capture_instance = N'dbo_{name}_v2', @supports_net_changes = 0; \
             INSERT INTO dbo.[{name}] (id, name, qty, note) VALUES ({id}, N'b', {id}, N'{note}');"
        ))
        .await;
    }

    async fn drop_table(&self, name: &str) {
        self.sql(&format!("DROP TABLE dbo.[{name}]")).await;
    }

    fn source(&self, runner: &str) -> Box<dyn Source> {
        let mut config = SqlServerSourceConfig::with_url(self.url.clone());
        config.snapshot_chunk_rows = 100;
        config.poll_interval_ms = 200;
        config.heartbeat_interval_ms = 1000;
        let connector = TiberiusConnector::new(config.connection().expect("connection"));
        Box::new(SqlServerSource::new(config, std::sync::Arc::new(connector), runner).expect("source"))
    }

    fn runner_section(&self) -> Option<String> {
        Some(format!(
            "[sqlserver]\nurl = \"{}\"\npoll_interval_ms = 200\nheartbeat_interval_ms = 1000\n",
            self.url
        ))
    }

    async fn cleanup(&self) {
        let Ok(server) = std::env::var(URL_VAR) else { return };
        let db = &self.database;
        let _ = self.admin.lock().await.execute("EXEC sys.sp_cdc_disable_db;").await;
        let mut admin = connect(&server).await;
        let _ = admin
            .execute(&format!("ALTER DATABASE [{db}] SET SINGLE_USER WITH ROLLBACK IMMEDIATE; DROP DATABASE [{db}];"))
            .await;
    }
}

/// The conformance cases, ignored unless asked for (`-- --ignored`).
macro_rules! sqlserver_cases {
    ($($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            #[ignore = "needs TRIBUTARY_SQLSERVER_URL: a SQL Server with SQL Server Agent (docs/sources/sqlserver.md)"]
            async fn $case() {
                let fx = SqlServer::new(stringify!($case)).await;
                tributary_tests::conformance::source::$case(&fx).await;
                fx.cleanup().await;
            }
        )*
    };
}

sqlserver_cases!(
    snapshot_then_streaming,
    restart_resumes_after_the_checkpoint,
    ddl_add_column,
    new_and_dropped_tables,
    resync_copies_a_table_again,
    kill_9_exactly_once,
);

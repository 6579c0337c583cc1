//! The source conformance suite (`tributary_tests::conformance::source`)
//! run against every source: PostgreSQL and MariaDB (the stack's), and the
//! reference source in memory. One line per source lists its cases; a case
//! a source cannot run is left out of its list with the reason, never
//! reported as passed.

use async_trait::async_trait;
use mysql_async::prelude::Queryable;
use tributary_connectors::source::memory::{MemoryDatabase, MemorySource};
use tributary_connectors::sources::mysql::MySqlSource;
use tributary_connectors::sources::postgres::PostgresSource;
use tributary_connectors::sources::sqlserver::fake::{FakeOp, FakeServer};
use tributary_connectors::sources::sqlserver::lsn::Lsn;
use tributary_connectors::sources::sqlserver::types::ColumnDef;
use tributary_connectors::sources::sqlserver::{SqlServerSource, SqlServerSourceConfig};
use tributary_connectors::Source;
use tributary_schemas::{Column, DataType, TableId, TableSchema, Value};
use tributary_tests::conformance::source::SourceFixture;
use tributary_tests::mysql::Database;
use tributary_tests::postgres::SourceSchema;

use tributary_tests::conformance;

conformance!(source, postgres: Postgres {
    snapshot_then_streaming,
    restart_resumes_after_the_checkpoint,
    ddl_add_column,
    new_and_dropped_tables,
    resync_copies_a_table_again,
    kill_9_exactly_once,
});

conformance!(source, mysql: MySql {
    snapshot_then_streaming,
    restart_resumes_after_the_checkpoint,
    ddl_add_column,
    new_and_dropped_tables,
    resync_copies_a_table_again,
    kill_9_exactly_once,
});

// SQL Server's source over the in-memory CDC fake (no SQL Server runs
// here; `tests/tests/sqlserver_source.rs` runs these cases against a real
// one when TRIBUTARY_SQLSERVER_URL is set). The fake lives in the test
// process, so `kill_9_exactly_once` is not in its list.
conformance!(source, sqlserver_fake: SqlServerFake {
    snapshot_then_streaming,
    restart_resumes_after_the_checkpoint,
    ddl_add_column,
    new_and_dropped_tables,
    resync_copies_a_table_again,
});

// The memory source lives in the test process: the runner binary cannot
// read it, so `kill_9_exactly_once` is not in its list. It copies no table
// again mid-stream (`Source::resync`'s default): no
// `resync_copies_a_table_again`.
conformance!(source, memory: Memory {
    snapshot_then_streaming,
    restart_resumes_after_the_checkpoint,
    ddl_add_column,
    new_and_dropped_tables,
});

// ---------------------------------------------------------------- PostgreSQL

/// A schema, slot and publication of their own in the stack's source
/// database.
struct Postgres {
    fx: SourceSchema,
}

impl Postgres {
    async fn new(case: &str) -> Self {
        // Slot names are limited to 63 characters, lower case.
        let short: String = case.chars().filter(|c| c.is_ascii_lowercase()).take(12).collect();
        Self { fx: SourceSchema::new(&short).await }
    }
}

#[async_trait]
impl SourceFixture for Postgres {
    fn table(&self, name: &str) -> TableId {
        self.fx.table(name)
    }

    async fn create(&self, name: &str) {
        self.fx
            .exec(&format!("CREATE TABLE {}.{name} (id integer PRIMARY KEY, name text, qty integer)", self.fx.schema))
            .await;
    }

    async fn insert(&self, name: &str, rows: &[(i32, &str, i32)]) {
        let values: Vec<String> = rows.iter().map(|(i, n, q)| format!("({i}, '{n}', {q})")).collect();
        self.fx
            .exec(&format!("INSERT INTO {}.{name} VALUES {}", self.fx.schema, values.join(", ")))
            .await;
    }

    async fn update(&self, name: &str, id: i32, new_name: &str, qty: i32) {
        self.fx
            .exec(&format!("UPDATE {}.{name} SET name = '{new_name}', qty = {qty} WHERE id = {id}", self.fx.schema))
            .await;
    }

    async fn delete(&self, name: &str, id: i32) {
        self.fx
            .exec(&format!("DELETE FROM {}.{name} WHERE id = {id}", self.fx.schema))
            .await;
    }

    async fn add_note(&self, name: &str, id: i32, note: &str) {
        let s = &self.fx.schema;
        self.fx
            .exec(&format!(
                "ALTER TABLE {s}.{name} ADD COLUMN note text; INSERT INTO {s}.{name} VALUES ({id}, 'b', {id}, '{note}')"
            ))
            .await;
    }

    async fn drop_table(&self, name: &str) {
        self.fx.exec(&format!("DROP TABLE {}.{name}", self.fx.schema)).await;
    }

    fn source(&self, runner: &str) -> Box<dyn Source> {
        Box::new(PostgresSource::new(self.fx.config(), runner).expect("source config"))
    }

    fn runner_section(&self) -> Option<String> {
        let c = self.fx.config();
        Some(format!(
            "[postgres]\nurl = \"{}\"\nslot_name = \"{}\"\npublication_name = \"{}\"\ninclude = [\"{}.*\"]\n\
             snapshot_chunk_rows = 200\n",
            tributary_tests::pg_source_url(),
            c.slot_name,
            c.publication_name,
            self.fx.schema
        ))
    }

    async fn cleanup(&self) {
        self.fx.cleanup().await;
    }
}

// ---------------------------------------------------------------- MariaDB

/// A database of its own in the stack's MariaDB.
struct MySql {
    db: tokio::sync::Mutex<Database>,
    name: String,
    config: tributary_connectors::sources::mysql::MySqlSourceConfig,
}

impl MySql {
    async fn new(case: &str) -> Self {
        let short: String = case.chars().filter(|c| c.is_ascii_lowercase()).take(12).collect();
        let db = Database::new(&format!("c_{short}")).await;
        let (name, config) = (db.db.clone(), db.config());
        Self { db: tokio::sync::Mutex::new(db), name, config }
    }

    async fn sql(&self, sql: &str) {
        self.db.lock().await.sql(sql).await;
    }
}

#[async_trait]
impl SourceFixture for MySql {
    fn table(&self, name: &str) -> TableId {
        TableId::new(self.name.clone(), name)
    }

    async fn create(&self, name: &str) {
        self.sql(&format!("CREATE TABLE {name} (id INT PRIMARY KEY, name TEXT, qty INT)"))
            .await;
    }

    async fn insert(&self, name: &str, rows: &[(i32, &str, i32)]) {
        let values: Vec<String> = rows.iter().map(|(i, n, q)| format!("({i}, '{n}', {q})")).collect();
        self.sql(&format!("INSERT INTO {name} VALUES {}", values.join(", "))).await;
    }

    async fn update(&self, name: &str, id: i32, new_name: &str, qty: i32) {
        self.sql(&format!("UPDATE {name} SET name = '{new_name}', qty = {qty} WHERE id = {id}"))
            .await;
    }

    async fn delete(&self, name: &str, id: i32) {
        self.sql(&format!("DELETE FROM {name} WHERE id = {id}")).await;
    }

    async fn add_note(&self, name: &str, id: i32, note: &str) {
        self.sql(&format!("ALTER TABLE {name} ADD COLUMN note TEXT")).await;
        self.sql(&format!("INSERT INTO {name} VALUES ({id}, 'b', {id}, '{note}')"))
            .await;
    }

    async fn drop_table(&self, name: &str) {
        self.sql(&format!("DROP TABLE {name}")).await;
    }

    fn source(&self, runner: &str) -> Box<dyn Source> {
        Box::new(MySqlSource::new(self.config.clone(), runner).expect("source config"))
    }

    fn runner_section(&self) -> Option<String> {
        Some(format!(
            "[mysql]\nurl = \"{}\"\nserver_id = {}\nsnapshot_chunk_rows = 200\nheartbeat_interval_ms = 1000\n",
            secrecy::ExposeSecret::expose_secret(&self.config.url),
            self.config.server_id,
        ))
    }

    async fn cleanup(&self) {
        let mut db = self.db.lock().await;
        let _ = db.conn.query_drop(format!("DROP DATABASE IF EXISTS `{}`", self.name)).await;
    }
}

// ---------------------------------------------------------------- memory

/// The reference source over a database in the test process.
struct Memory {
    db: MemoryDatabase,
}

impl Memory {
    async fn new(_case: &str) -> Self {
        Self { db: MemoryDatabase::new() }
    }

    fn row(id: i32, name: &str, qty: i32) -> Vec<Value> {
        vec![Value::Int32(id), Value::Text(name.into()), Value::Int32(qty)]
    }

    fn current(&self, name: &str, id: i32) -> Vec<Value> {
        let schema = self.db.schema(&self.table(name)).expect("table");
        let mut row = vec![Value::Null; schema.columns.len()];
        row[0] = Value::Int32(id);
        row
    }
}

#[async_trait]
impl SourceFixture for Memory {
    fn table(&self, name: &str) -> TableId {
        TableId::new("memory", name)
    }

    async fn create(&self, name: &str) {
        self.db.create_table(TableSchema {
            id: self.table(name),
            columns: vec![
                Column::new("id", DataType::Int32, false),
                Column::new("name", DataType::Text, true),
                Column::new("qty", DataType::Int32, true),
            ],
            key: vec!["id".into()],
            dropped: Vec::new(),
        });
    }

    async fn insert(&self, name: &str, rows: &[(i32, &str, i32)]) {
        self.db
            .insert(&self.table(name), rows.iter().map(|(i, n, q)| Self::row(*i, n, *q)).collect());
    }

    async fn update(&self, name: &str, id: i32, new_name: &str, qty: i32) {
        let mut row = Self::row(id, new_name, qty);
        let width = self.current(name, id).len();
        row.resize(width, Value::Null);
        self.db.update(&self.table(name), row).expect("update");
    }

    async fn delete(&self, name: &str, id: i32) {
        self.db.delete(&self.table(name), &self.current(name, id)).expect("delete");
    }

    async fn add_note(&self, name: &str, id: i32, note: &str) {
        let t = self.table(name);
        self.db
            .add_column(&t, Column::new("note", DataType::Text, true), Value::Null)
            .expect("add column");
        let mut row = Self::row(id, "b", id);
        row.push(Value::Text(note.into()));
        self.db.insert(&t, vec![row]);
    }

    async fn drop_table(&self, name: &str) {
        self.db.drop_table(&self.table(name));
    }

    fn source(&self, runner: &str) -> Box<dyn Source> {
        Box::new(MemorySource::new(self.db.clone(), runner).with_chunk_rows(100))
    }

    fn runner_section(&self) -> Option<String> {
        None
    }

    async fn cleanup(&self) {}
}

// ---------------------------------------------------------------- SQL Server (fake)

/// SQL Server's source over the in-memory CDC fake; the operator's steps
/// (enabling CDC on a new table, a second capture instance after `ALTER
/// TABLE`) are the fixture's, as `docs/sources/sqlserver.md` tells them.
struct SqlServerFake {
    db: FakeServer,
}

impl SqlServerFake {
    async fn new(_case: &str) -> Self {
        // LSNs start just below a VLF boundary: the cases cross it.
        Self {
            db: FakeServer::new(Lsn::new(0x2d, u32::MAX - 40, 0)),
        }
    }

    fn current(&self, name: &str, id: i32) -> Vec<Value> {
        self.db
            .rows(&self.table(name))
            .into_iter()
            .find(|r| r.first() == Some(&Value::Int32(id)))
            .expect("row")
    }
}

#[async_trait]
impl SourceFixture for SqlServerFake {
    fn table(&self, name: &str) -> TableId {
        TableId::new("dbo", name)
    }

    async fn create(&self, name: &str) {
        let t = self.table(name);
        let columns = vec![
            ColumnDef::new("id", "int", false),
            ColumnDef::new("name", "nvarchar(100)", true),
            ColumnDef::new("qty", "int", true),
        ];
        self.db.create_table(&t, columns, &["id"]);
        self.db.enable_table(&t, &format!("dbo_{name}")).expect("sp_cdc_enable_table");
    }

    async fn insert(&self, name: &str, rows: &[(i32, &str, i32)]) {
        let t = self.table(name);
        let ops = rows
            .iter()
            .map(|(i, n, q)| {
                FakeOp::Insert(t.clone(), vec![Value::Int32(*i), Value::Text(n.to_string()), Value::Int32(*q)])
            })
            .collect();
        self.db.commit(ops).expect("insert");
    }

    async fn update(&self, name: &str, id: i32, new_name: &str, qty: i32) {
        let old = self.current(name, id);
        let mut new = old.clone();
        new[1] = Value::Text(new_name.into());
        new[2] = Value::Int32(qty);
        self.db
            .commit(vec![FakeOp::Update(self.table(name), old, new)])
            .expect("update");
    }

    async fn delete(&self, name: &str, id: i32) {
        let old = self.current(name, id);
        self.db.commit(vec![FakeOp::Delete(self.table(name), old)]).expect("delete");
    }

    async fn add_note(&self, name: &str, id: i32, note: &str) {
        let t = self.table(name);
        self.db
            .add_column(&t, ColumnDef::new("note", "nvarchar(100)", true), Value::Null);
        self.db
            .enable_table(&t, &format!("dbo_{name}_v2"))
            .expect("second capture instance");
        let row = vec![
            Value::Int32(id),
            Value::Text("b".into()),
            Value::Int32(id),
            Value::Text(note.into()),
        ];
        self.db.commit(vec![FakeOp::Insert(t, row)]).expect("insert");
    }

    async fn drop_table(&self, name: &str) {
        self.db.drop_table(&self.table(name));
    }

    fn source(&self, runner: &str) -> Box<dyn Source> {
        let mut config = SqlServerSourceConfig::with_url("sqlserver://tributary@fake/fake");
        config.snapshot_chunk_rows = 100;
        config.poll_interval_ms = 5;
        config.heartbeat_interval_ms = 100;
        Box::new(SqlServerSource::new(config, std::sync::Arc::new(self.db.clone()), runner).expect("source"))
    }

    fn runner_section(&self) -> Option<String> {
        None
    }

    async fn cleanup(&self) {}
}
